//! Loading config from disk (file names, directory layouts, ConfigMap mounts), its size caps,
//! and hot reload: only settled changes are loaded, and unchanged files are not read again.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
use sluice::config::{
    ConfigErrors, ConfigHandle, ConfigSource, FileLimits, LoadOptions, Poller, RateLimitConfig,
    WatchGuard, load, parse_files, spawn_watcher,
};
use sluice::descriptor::Entry;
use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn domain_yaml(domain: &str, rpu: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: {rpu}\n"
    )
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir");
    }
    fs::write(path, text).expect("write");
}

/// Writes via a dot-named temp file and a rename, so a poll never sees a half-written file
/// (dot entries are skipped by the loader).
fn write_atomic(path: &Path, text: &str) {
    let name = path.file_name().and_then(|n| n.to_str()).expect("name");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    write(&tmp, text);
    fs::rename(&tmp, path).expect("rename");
}

fn load_path(path: &Path) -> Result<RateLimitConfig, ConfigErrors> {
    load(
        &ConfigSource::Path(path.to_path_buf()),
        &LoadOptions::default(),
        &FileLimits::default(),
    )
}

fn names(err: &ConfigErrors) -> Vec<String> {
    err.iter().map(|e| e.name.clone()).collect()
}

fn rpu(cfg: &RateLimitConfig, domain: &str) -> Option<u32> {
    let m = cfg.domain(domain)?.lookup(&[Entry::new("k", "v")])?;
    match &m.limit.rule {
        sluice::config::Rule::Limited(blocks) => Some(blocks[0].quota.requests_per_unit),
        sluice::config::Rule::Unlimited => None,
    }
}

#[test]
fn runtime_layout_names_files_by_goruntime_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("current");
    write(
        &root.join("ratelimit/config/basic.yaml"),
        &domain_yaml("basic", 1),
    );
    write(&root.join("ratelimit/config/team/bad.yaml"), "domain: ''\n");
    // Outside the app directory: not loaded.
    write(
        &root.join("ratelimit/other/x.yaml"),
        &domain_yaml("other", 1),
    );
    let source = ConfigSource::Runtime {
        root: root.clone(),
        subdirectory: "ratelimit".into(),
        app_directory: "config".into(),
    };
    let err = load(&source, &LoadOptions::default(), &FileLimits::default()).expect_err("bad file");
    assert_eq!(
        err.to_string(),
        "config.team.bad.yaml: config file cannot have empty domain"
    );

    fs::remove_file(root.join("ratelimit/config/team/bad.yaml")).expect("rm");
    let cfg = load(&source, &LoadOptions::default(), &FileLimits::default()).expect("loads");
    assert_eq!(cfg.domain_count(), 1);
    assert_eq!(rpu(&cfg, "basic"), Some(1));
}

#[test]
fn config_file_is_named_by_its_bare_name_and_a_dir_by_relative_path() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("single/limits.yaml");
    write(&file, "domain: ''\n");
    let err = load_path(&file).expect_err("bad");
    assert_eq!(names(&err), vec!["limits.yaml"]);

    let dir = tmp.path().join("dir");
    write(&dir.join("a.yaml"), "domain: ''\n");
    write(&dir.join("nested/b.yml"), "domain: ''\n");
    write(&dir.join("nested/readme.txt"), "not yaml");
    let err = load_path(&dir).expect_err("bad");
    assert_eq!(names(&err), vec!["a.yaml", "nested/b.yml"]);
}

#[test]
fn files_load_in_sorted_name_order() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Both declare domain "d": the one sorting second is the duplicate.
    write(&tmp.path().join("b.yaml"), &domain_yaml("d", 1));
    write(&tmp.path().join("a.yaml"), &domain_yaml("d", 2));
    let err = load_path(tmp.path()).expect_err("dup");
    assert_eq!(
        err.to_string(),
        "b.yaml: duplicate domain 'd' in config file"
    );
}

#[test]
fn configmap_layout_loads_each_file_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let stamp = dir.join("..2024_01_01_00_00_00.000000001");
    write(&stamp.join("basic.yaml"), &domain_yaml("basic", 7));
    write(&stamp.join("other.yaml"), &domain_yaml("other", 8));
    symlink("..2024_01_01_00_00_00.000000001", dir.join("..data")).expect("symlink");
    symlink("..data/basic.yaml", dir.join("basic.yaml")).expect("symlink");
    symlink("..data/other.yaml", dir.join("other.yaml")).expect("symlink");
    write(&dir.join(".hidden.yaml"), "domain: ''\n");

    let cfg = load_path(dir).expect("loads without duplicate domains");
    assert_eq!(cfg.domain_count(), 2);
    assert_eq!(rpu(&cfg, "basic"), Some(7));
    assert_eq!(rpu(&cfg, "other"), Some(8));
}

#[test]
fn symlinked_directories_are_followed_and_cycles_end() {
    let tmp = tempfile::tempdir().expect("tmp");
    let real = tmp.path().join("real");
    write(&real.join("x.yaml"), &domain_yaml("x", 1));
    let dir = tmp.path().join("conf");
    fs::create_dir_all(&dir).expect("mkdir");
    symlink(&real, dir.join("linked")).expect("symlink");
    symlink(&dir, dir.join("loop")).expect("symlink");
    let cfg = load_path(&dir).expect("loads");
    assert_eq!(cfg.domain_count(), 1);
}

#[test]
fn missing_path_is_an_error_naming_it_and_an_empty_dir_is_empty() {
    let tmp = tempfile::tempdir().expect("tmp");
    let missing = tmp.path().join("nope");
    let err = load_path(&missing).expect_err("missing");
    assert_eq!(names(&err), vec![missing.display().to_string()]);

    let err = load(
        &ConfigSource::Runtime {
            root: tmp.path().to_path_buf(),
            subdirectory: "sub".into(),
            app_directory: "config".into(),
        },
        &LoadOptions::default(),
        &FileLimits::default(),
    )
    .expect_err("missing");
    assert!(err.to_string().contains("sub"), "{err}");

    let cfg = load_path(tmp.path()).expect("empty dir");
    assert_eq!(cfg.domain_count(), 0);
}

/// Polls `check` until it holds, for at most 5 s of Tokio time. The watcher tests run on the
/// paused clock: the watcher's ticks and settle period are Tokio time, and its polls run on
/// blocking threads, during which the paused clock does not jump, so no test waits in real time
/// for a tick.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const POLL: Duration = Duration::from_millis(50);

/// A short settle period, for the first load (`Poller::load_settled`, which waits in real
/// time, as `main` does at start-up).
fn quick() -> FileLimits {
    FileLimits {
        settle: Duration::from_millis(100),
        ..FileLimits::default()
    }
}

fn poller(dir: &Path, limits: FileLimits) -> Poller {
    Poller::new(
        ConfigSource::Path(dir.to_path_buf()),
        LoadOptions::default(),
        limits,
    )
}

/// Loads `dir` as `main` does, then watches it with the same poller.
fn start(dir: &Path) -> (ConfigHandle, WatchGuard) {
    let mut poller = poller(dir, quick());
    let initial = poller.load_settled(POLL).expect("initial load");
    let handle = ConfigHandle::new(Some(initial));
    let guard = spawn_watcher(poller, handle.clone(), POLL, Default::default());
    (handle, guard)
}

#[tokio::test(start_paused = true)]
async fn reload_picks_up_a_new_file() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    let (handle, _guard) = start(tmp.path());
    assert_eq!(handle.current().expect("cfg").domain_count(), 1);

    write_atomic(&tmp.path().join("b.yaml"), &domain_yaml("b", 2));
    eventually("b loaded", || {
        handle.current().is_some_and(|c| rpu(&c, "b") == Some(2))
    })
    .await;
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 1);
    assert_eq!(handle.stats().load_error.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_broken_file_keeps_the_old_config() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    let (handle, _guard) = start(tmp.path());
    let before = handle.current().expect("cfg");

    write_atomic(
        &tmp.path().join("b.yaml"),
        "domain: b\ndescriptors:\n  - key: ''\n",
    );
    eventually("error counted", || {
        handle.stats().load_error.load(Ordering::Relaxed) == 1
    })
    .await;
    let after = handle.current().expect("cfg");
    assert!(Arc::ptr_eq(&before, &after));
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 0);

    // Fixing it reloads.
    write_atomic(&tmp.path().join("b.yaml"), &domain_yaml("b", 3));
    eventually("fixed", || {
        handle.current().is_some_and(|c| rpu(&c, "b") == Some(3))
    })
    .await;
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 1);
    assert_eq!(handle.stats().load_error.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_removed_file_removes_its_domain() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    write_atomic(&tmp.path().join("b.yaml"), &domain_yaml("b", 2));
    let (handle, _guard) = start(tmp.path());
    assert!(handle.current().expect("cfg").domain("b").is_some());

    fs::remove_file(tmp.path().join("b.yaml")).expect("rm");
    eventually("b gone", || {
        handle
            .current()
            .is_some_and(|c| c.domain("b").is_none() && c.domain("a").is_some())
    })
    .await;
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn configmap_symlink_swap_is_picked_up() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    write(&dir.join("..v1/limits.yaml"), &domain_yaml("cm", 1));
    symlink("..v1", dir.join("..data")).expect("symlink");
    symlink("..data/limits.yaml", dir.join("limits.yaml")).expect("symlink");
    let (handle, _guard) = start(dir);
    assert_eq!(rpu(&handle.current().expect("cfg"), "cm"), Some(1));

    // What the kubelet does: write a new timestamped dir, then atomically repoint `..data`.
    write(&dir.join("..v2/limits.yaml"), &domain_yaml("cm", 2));
    symlink("..v2", dir.join("..data_tmp")).expect("symlink");
    fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap");
    fs::remove_dir_all(dir.join("..v1")).expect("rm old");

    eventually("swap seen", || {
        handle.current().is_some_and(|c| rpu(&c, "cm") == Some(2))
    })
    .await;
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_guard_stops_the_watcher() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    let (handle, guard) = start(tmp.path());
    drop(guard);
    write_atomic(&tmp.path().join("b.yaml"), &domain_yaml("b", 2));
    // Several poll intervals pass; nothing is reloaded.
    tokio::time::sleep(POLL * 6).await;
    assert!(handle.current().expect("cfg").domain("b").is_none());
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn starting_without_a_config_loads_once_the_files_are_fixed() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), "domain: ''\n");
    let handle = ConfigHandle::new(None);
    let _guard = spawn_watcher(
        poller(tmp.path(), quick()),
        handle.clone(),
        POLL,
        Default::default(),
    );
    assert!(handle.current().is_none());
    write_atomic(&tmp.path().join("a.yaml"), &domain_yaml("a", 4));
    eventually("loaded", || {
        handle.current().is_some_and(|c| rpu(&c, "a") == Some(4))
    })
    .await;
}

// --- Size caps ---

/// Polls a new poller until its first load settles, on made-up instants: returns the outcome
/// and the instant it settled at.
fn first_load(
    poller: &mut Poller,
    settle: Duration,
) -> (Instant, Result<RateLimitConfig, ConfigErrors>) {
    let t0 = Instant::now();
    if let Some(outcome) = poller.poll(t0) {
        return (t0, outcome);
    }
    let t1 = t0 + settle;
    (t1, poller.poll(t1).expect("settled"))
}

fn caps(max_file_bytes: u64, max_total_bytes: u64) -> FileLimits {
    FileLimits {
        max_file_bytes,
        max_total_bytes,
        ..quick()
    }
}

fn load_capped(dir: &Path, limits: FileLimits) -> Result<RateLimitConfig, ConfigErrors> {
    load(
        &ConfigSource::Path(dir.to_path_buf()),
        &LoadOptions::default(),
        &limits,
    )
}

#[test]
fn size_caps_refuse_a_file_and_a_source_naming_the_setting() {
    let tmp = tempfile::tempdir().expect("tmp");
    let small = domain_yaml("a", 1);
    let size = small.len() as u64;
    write(&tmp.path().join("a.yaml"), &small);
    write(&tmp.path().join("b.yaml"), &domain_yaml("b", 1));
    assert!(load_capped(tmp.path(), caps(size, 2 * size)).is_ok());

    let err = load_capped(tmp.path(), caps(size - 1, 2 * size)).expect_err("too big");
    assert_eq!(
        err.to_string(),
        format!(
            "a.yaml: error loading config file: {size} bytes is more than SLUICE_CONFIG_MAX_FILE_BYTES={}\n\
             b.yaml: error loading config file: {size} bytes is more than SLUICE_CONFIG_MAX_FILE_BYTES={}",
            size - 1,
            size - 1
        )
    );
    let err = load_capped(tmp.path(), caps(size, 2 * size - 1)).expect_err("too big");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: error loading config: the config files total {} bytes, more than \
             SLUICE_CONFIG_MAX_TOTAL_BYTES={}",
            tmp.path().display(),
            2 * size,
            2 * size - 1
        )
    );
}

#[test]
fn a_sparse_gibibyte_file_is_refused_by_its_size_unread() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    let big = fs::File::create(tmp.path().join("big.yaml")).expect("create");
    big.set_len(1 << 30).expect("sparse");
    let limits = FileLimits::default();
    let mut poller = poller(tmp.path(), limits);
    let started = Instant::now();
    let err = first_load(&mut poller, limits.settle)
        .1
        .expect_err("refused");
    // Reading it would take seconds and a gibibyte; refusing it takes a few stats.
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        poller.files_read(),
        0,
        "nothing is read while the source is over its total"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "{}: error loading config: the config files total {} bytes, more than \
             SLUICE_CONFIG_MAX_TOTAL_BYTES=8388608\n\
             big.yaml: error loading config file: 1073741824 bytes is more than \
             SLUICE_CONFIG_MAX_FILE_BYTES=4194304",
            tmp.path().display(),
            (1u64 << 30) + domain_yaml("a", 1).len() as u64
        )
    );
    // check-config's path refuses it the same way.
    let err = load_capped(tmp.path(), FileLimits::default()).expect_err("refused");
    assert!(
        err.to_string().contains("SLUICE_CONFIG_MAX_TOTAL_BYTES"),
        "{err}"
    );
}

#[test]
fn reading_stops_one_byte_past_the_cap() {
    // A FIFO's metadata says 0 bytes and it reads as much as its writer writes: the reader
    // must stop at the cap and close it, which the writer sees as a broken pipe.
    let tmp = tempfile::tempdir().expect("tmp");
    let fifo = tmp.path().join("endless.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut f = fs::File::options().write(true).open(&fifo).expect("open");
            f.write_all(&vec![b'#'; 8 << 20])
        })
    };
    let err = load_capped(&fifo, caps(64, 1 << 20)).expect_err("cut off");
    assert_eq!(
        err.to_string(),
        "endless.yaml: error loading config file: it grew past SLUICE_CONFIG_MAX_FILE_BYTES=64 \
         while being read"
    );
    let written = writer.join().expect("writer");
    assert_eq!(
        written.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::BrokenPipe),
        "the reader stopped early"
    );
}

#[test]
fn a_file_bigger_than_its_metadata_says_is_cut_off_while_reading() {
    // /proc files report a size of 0 and read as kilobytes: a file that grew after its size
    // was checked, without a race.
    let tmp = tempfile::tempdir().expect("tmp");
    symlink("/proc/self/maps", tmp.path().join("grows.yaml")).expect("symlink");
    let err = load_capped(tmp.path(), caps(64, 1 << 20)).expect_err("cut off");
    assert_eq!(
        err.to_string(),
        "grows.yaml: error loading config file: it grew past SLUICE_CONFIG_MAX_FILE_BYTES=64 \
         while being read"
    );
    let mut watch = poller(tmp.path(), caps(64, 1 << 20));
    let err = first_load(&mut watch, quick().settle)
        .1
        .expect_err("cut off");
    assert!(
        err.to_string()
            .contains("it grew past SLUICE_CONFIG_MAX_FILE_BYTES=64"),
        "{err}"
    );

    // The source's total is enforced while reading too.
    let small = domain_yaml("a", 1);
    write(&tmp.path().join("a.yaml"), &small);
    let limits = caps(1 << 20, small.len() as u64 + 64);
    let err = load_capped(tmp.path(), limits).expect_err("cut off");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: error loading config: the config files grew past \
             SLUICE_CONFIG_MAX_TOTAL_BYTES={} while being read",
            tmp.path().display(),
            small.len() + 64
        )
    );
    let mut poller = poller(tmp.path(), limits);
    let err = first_load(&mut poller, limits.settle)
        .1
        .expect_err("cut off");
    assert!(
        err.to_string()
            .contains("grew past SLUICE_CONFIG_MAX_TOTAL_BYTES"),
        "{err}"
    );
}

// --- Metadata first: unchanged files are not read ---

#[test]
fn an_unchanged_directory_is_not_read_again_and_a_touch_does_not_reload() {
    let tmp = tempfile::tempdir().expect("tmp");
    for name in ["a", "b", "c"] {
        write(
            &tmp.path().join(format!("{name}.yaml")),
            &domain_yaml(name, 1),
        );
    }
    let settle = quick().settle;
    let mut poller = poller(tmp.path(), quick());
    let (t0, loaded) = first_load(&mut poller, settle);
    assert_eq!(loaded.expect("loads").domain_count(), 3);
    assert_eq!(poller.files_read(), 6, "each file read, then confirmed");

    for i in 2..50 {
        assert!(poller.poll(t0 + settle * i).is_none());
    }
    assert_eq!(
        poller.files_read(),
        6,
        "50 polls of an unchanged directory read nothing"
    );

    // A touch changes the fingerprint: the file is read once, and its bytes are what is loaded.
    let file = fs::File::options()
        .write(true)
        .open(tmp.path().join("b.yaml"))
        .expect("open");
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(60))
        .expect("touch");
    for i in 50..60 {
        assert!(
            poller.poll(t0 + settle * i).is_none(),
            "a touch does not reload"
        );
    }
    assert_eq!(poller.files_read(), 7);
}

#[test]
fn an_idle_poll_does_no_work_per_byte() {
    // 32 MiB that fail fast (invalid UTF-8), so the test does not wait for a parse.
    let tmp = tempfile::tempdir().expect("tmp");
    let mut bytes = vec![b'#'; 32 << 20];
    bytes[0] = 0xff;
    fs::write(tmp.path().join("big.yaml"), &bytes).expect("write");
    drop(bytes);
    let limits = caps(64 << 20, 64 << 20);
    let mut poller = poller(tmp.path(), limits);
    let (t0, loaded) = first_load(&mut poller, limits.settle);
    loaded.expect_err("invalid UTF-8");
    let reads = poller.files_read();

    // Comparing the 32 MiB with what was loaded at every poll takes about a millisecond each:
    // 800 polls, most of a second. A few `stat`s each take a few milliseconds in all.
    let started = Instant::now();
    for i in 1..=800 {
        assert!(poller.poll(t0 + limits.settle * i).is_none());
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(150),
        "800 idle polls took {took:?}"
    );
    assert_eq!(poller.files_read(), reads);
}

#[test]
fn an_error_is_reported_once_per_change_not_every_poll() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    let settle = quick().settle;
    let mut poller = poller(tmp.path(), quick());
    let (t0, loaded) = first_load(&mut poller, settle);
    loaded.expect("loads");
    write(&tmp.path().join("b.yaml"), "domain: ''\n");
    let mut reports = 0;
    for i in 2..40 {
        if let Some(outcome) = poller.poll(t0 + settle * i / 2) {
            outcome.expect_err("bad file");
            reports += 1;
        }
    }
    assert_eq!(reports, 1);
}

// --- Settling: a file written in place is never loaded half-written ---

/// The same file cut off just after `requests_per_unit:`, which envoyproxy/ratelimit (and so
/// Sluice, for a complete file) loads as a limit of 0: every request over the limit.
fn halves(rpu: u32) -> (String, String) {
    let full = domain_yaml("d", rpu);
    let cut = full.find("requests_per_unit:").expect("key") + "requests_per_unit:".len();
    (full[..cut].to_owned(), full[cut..].to_owned())
}

fn append(path: &Path, text: &str) {
    let mut f = fs::File::options().append(true).open(path).expect("open");
    f.write_all(text.as_bytes()).expect("append");
}

/// Watches `dir` from nothing, on tokio's paused clock, until its first config is loaded.
async fn watch_paused(dir: &Path, limits: FileLimits) -> (ConfigHandle, WatchGuard) {
    let handle = ConfigHandle::new(None);
    let guard = spawn_watcher(
        poller(dir, limits),
        handle.clone(),
        POLL,
        Default::default(),
    );
    tokio::time::sleep(limits.settle + POLL * 3).await;
    assert!(handle.current().is_some(), "first load");
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 1);
    (handle, guard)
}

/// Advances the paused clock by `total` in 10 ms steps, checking `never` at each.
async fn for_a_while(total: Duration, mut never: impl FnMut() -> bool, what: &str) {
    let step = Duration::from_millis(10);
    let mut waited = Duration::ZERO;
    while waited < total {
        tokio::time::sleep(step).await;
        waited += step;
        assert!(!never(), "{what} after {waited:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_file_rewritten_in_place_in_two_halves_is_never_loaded_half_written() {
    let (first, second) = halves(7);
    let half = parse_files(&[("f.yaml".into(), first.clone())], &LoadOptions::default());
    assert_eq!(
        rpu(&half.expect("loads"), "d"),
        Some(0),
        "the danger: half loads as 0"
    );

    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("limits.yaml");
    write(&path, &domain_yaml("d", 100));
    let limits = FileLimits::default();
    let (handle, _guard) = watch_paused(tmp.path(), limits).await;
    let is_half = || handle.current().is_some_and(|c| rpu(&c, "d") == Some(0));

    // In place: the same inode, truncated, then written in two halves with a pause shorter
    // than the settle period between them.
    fs::write(&path, &first).expect("first half");
    for_a_while(limits.settle * 6 / 10, is_half, "half loaded").await;
    append(&path, &second);
    for_a_while(limits.settle + POLL * 3, is_half, "half loaded").await;

    assert_eq!(rpu(&handle.current().expect("cfg"), "d"), Some(7));
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 2);
    assert_eq!(handle.stats().load_error.load(Ordering::Relaxed), 0);
}

#[test]
fn a_file_being_written_at_start_up_is_loaded_once_complete() {
    let (first, second) = halves(7);
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("limits.yaml");
    write(&path, &first);
    // Real time here, as at start-up: a pause ten times shorter than the settle period.
    let limits = FileLimits {
        settle: Duration::from_secs(2),
        ..FileLimits::default()
    };
    let writer = {
        let path = path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            append(&path, &second);
        })
    };
    let started = Instant::now();
    let cfg = poller(tmp.path(), limits)
        .load_settled(POLL)
        .expect("loads");
    writer.join().expect("writer");
    assert_eq!(rpu(&cfg, "d"), Some(7));
    assert!(
        started.elapsed() >= limits.settle,
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn an_oversize_file_keeps_the_old_config_and_is_reported_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), &domain_yaml("a", 1));
    let limits = FileLimits::default();
    let (handle, _guard) = watch_paused(tmp.path(), limits).await;
    let before = handle.current().expect("cfg");

    let big = fs::File::create(tmp.path().join("big.yaml")).expect("create");
    big.set_len(1 << 30).expect("sparse");
    tokio::time::sleep(limits.settle * 5).await;
    assert!(Arc::ptr_eq(&before, &handle.current().expect("cfg")));
    assert_eq!(handle.stats().load_error.load(Ordering::Relaxed), 1);
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 1);

    // Removing it loads the files again.
    fs::remove_file(tmp.path().join("big.yaml")).expect("rm");
    tokio::time::sleep(limits.settle + POLL * 3).await;
    assert_eq!(handle.stats().load_success.load(Ordering::Relaxed), 2);
    assert_eq!(handle.stats().load_error.load(Ordering::Relaxed), 1);
}
