//! Loading config from disk (file names, directory layouts, ConfigMap mounts) and hot reload.

use sluice::config::{
    ConfigErrors, ConfigHandle, ConfigSource, LoadOptions, RateLimitConfig, load, spawn_watcher,
};
use sluice::descriptor::Entry;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

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
    let err = load(&source, &LoadOptions::default()).expect_err("bad file");
    assert_eq!(
        err.to_string(),
        "config.team.bad.yaml: config file cannot have empty domain"
    );

    fs::remove_file(root.join("ratelimit/config/team/bad.yaml")).expect("rm");
    let cfg = load(&source, &LoadOptions::default()).expect("loads");
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
    )
    .expect_err("missing");
    assert!(err.to_string().contains("sub"), "{err}");

    let cfg = load_path(tmp.path()).expect("empty dir");
    assert_eq!(cfg.domain_count(), 0);
}

/// Polls `check` until it holds, for at most 5 s.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const POLL: Duration = Duration::from_millis(50);

fn start(dir: &Path) -> (ConfigHandle, sluice::config::WatchGuard) {
    let source = ConfigSource::Path(dir.to_path_buf());
    let opts = LoadOptions::default();
    let handle = ConfigHandle::new(Some(load(&source, &opts).expect("initial load")));
    let guard = spawn_watcher(source, opts, handle.clone(), POLL);
    (handle, guard)
}

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
async fn starting_without_a_config_loads_once_the_files_are_fixed() {
    let tmp = tempfile::tempdir().expect("tmp");
    write(&tmp.path().join("a.yaml"), "domain: ''\n");
    let source = ConfigSource::Path(tmp.path().to_path_buf());
    let handle = ConfigHandle::new(None);
    let _guard = spawn_watcher(source, LoadOptions::default(), handle.clone(), POLL);
    assert!(handle.current().is_none());
    write_atomic(&tmp.path().join("a.yaml"), &domain_yaml("a", 4));
    eventually("loaded", || {
        handle.current().is_some_and(|c| rpu(&c, "a") == Some(4))
    })
    .await;
}
