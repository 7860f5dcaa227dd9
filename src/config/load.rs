//! Finding and reading config files, and turning a set of files into one [`RateLimitConfig`].
//!
//! Two layouts are supported: `--config PATH` (one file or a directory tree) and the Go
//! service's runtime layout (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, each
//! file named by its goruntime key). Either way files are loaded in sorted name order so a
//! given set of files always loads the same way, and entries whose name starts with '.' are
//! skipped: a Kubernetes ConfigMap mount holds `..data` and `..<timestamp>` entries next to
//! the user-visible symlinks, and walking them would load every file two or three times.
//!
//! Every read is bounded by [`FileLimits`]: a file's size is checked on its metadata before it
//! is opened (a 1 GiB sparse file is refused without reading a byte), and again while reading,
//! since a file can grow between the two.

use super::build::Builder;
use super::lookup::RateLimitConfig;
use super::{ConfigError, ConfigErrors, raw};
use serde_yaml_ng::{Mapping, Value as Yaml};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::limiter::Algorithm;

/// Where the config comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--config PATH`: a single file (named by its bare file name) or a directory (every
    /// `*.yaml`/`*.yml` below it, recursively, named by the path relative to the directory).
    Path(PathBuf),
    /// envoyproxy/ratelimit's runtime layout: every YAML file below
    /// `root/subdirectory/app_directory`, named by its goruntime key: the path relative to
    /// `root/subdirectory` with '/' replaced by '.', e.g. `config.basic.yaml`.
    Runtime {
        root: PathBuf,
        subdirectory: String,
        app_directory: String,
    },
}

/// Options that change how files combine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// MERGE_DOMAIN_CONFIG: a later file with an existing domain adds its descriptors to it
    /// instead of being rejected as a duplicate domain.
    pub merge_domain_config: bool,
    /// Set when the counter store cannot keep a concurrency limit's slots (BACKEND_TYPE=memcache):
    /// the store's name, and every `algorithm: concurrency` is refused naming it.
    pub without_slots: Option<&'static str>,
    /// USE_CALENDAR_MONTH_RATE_LIMIT: a `unit: month` limit without its own `time_zone` counts
    /// UTC calendar months, as the Go service does with the flag.
    pub calendar_month: bool,
}

/// How much of a config source is read, and how still it must be before it is loaded.
///
/// Parsing peaks at about 35 times a file's size in memory (a 4 MB file: 146 MB; 50 MB: 1.7 GB)
/// and the loaded config keeps about 20 times, so the sizes bound what one bad (or hostile)
/// file can cost a replica. The defaults leave room: a Kubernetes ConfigMap holds at most
/// 1 MiB, and real configs are tens of kilobytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLimits {
    /// SLUICE_CONFIG_MAX_FILE_BYTES: the largest config file read.
    pub max_file_bytes: u64,
    /// SLUICE_CONFIG_MAX_TOTAL_BYTES: all the files of a source together.
    pub max_total_bytes: u64,
    /// SLUICE_CONFIG_SETTLE_MS: how long changed files must stay unchanged before they are
    /// loaded, so a file being written in place is not loaded half-written. Zero loads a change
    /// as soon as it is seen.
    pub settle: Duration,
}

impl FileLimits {
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 4 << 20;
    pub(crate) const DEFAULT_MAX_TOTAL_BYTES: u64 = 8 << 20;
    pub(crate) const DEFAULT_SETTLE: Duration = Duration::from_millis(1000);
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_file_bytes: Self::DEFAULT_MAX_FILE_BYTES,
            max_total_bytes: Self::DEFAULT_MAX_TOTAL_BYTES,
            settle: Self::DEFAULT_SETTLE,
        }
    }
}

/// The files of a source, sorted by name, with their raw bytes.
pub(crate) type Snapshot = Vec<(String, Vec<u8>)>;

/// Builds a config from named file texts, in the given order.
///
/// Like Go, each file is fully parsed before any is loaded, and each file reports only its
/// first error; unlike Go, loading carries on past a bad file so every bad file is reported.
pub fn parse_files(
    files: &[(String, String)],
    opts: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    build(
        files.iter().map(|(n, t)| (n.as_str(), Ok(t.as_str()))),
        opts,
    )
}

/// Reads and builds the config of a source once, within `limits`' sizes (`check-config`; the
/// service loads through a [`Poller`](super::Poller), which also waits for files to settle).
pub fn load(
    source: &ConfigSource,
    opts: &LoadOptions,
    limits: &FileLimits,
) -> Result<RateLimitConfig, ConfigErrors> {
    let snapshot = read_source(source, limits)?;
    parse_snapshot(
        snapshot
            .iter()
            .map(|(name, bytes)| (name.as_str(), bytes.as_slice())),
        opts,
    )
}

/// Builds a config from named file bytes, in the given order.
pub(crate) fn parse_snapshot<'a>(
    snapshot: impl Iterator<Item = (&'a str, &'a [u8])>,
    opts: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    build(
        snapshot.map(|(name, bytes)| {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| format!("error loading config file: invalid UTF-8: {e}"));
            (name, text)
        }),
        opts,
    )
}

fn build<'a>(
    files: impl Iterator<Item = (&'a str, Result<&'a str, String>)>,
    opts: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let mut parsed = Vec::new();
    for (name, text) in files {
        match text.and_then(raw::parse) {
            Ok(root) => parsed.push((name.to_owned(), root)),
            Err(message) => errors.push(ConfigError::new(name, message)),
        }
    }
    compile_roots(parsed, errors, opts)
}

/// Builds a config from already parsed configs, each named for its errors, in the given
/// order: the same validation, compilation and messages as files get. The xDS client feeds
/// its RateLimitConfig resources (converted to raw types, named by resource name) through here.
pub fn build_raw(
    roots: Vec<(String, raw::RawRoot)>,
    opts: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    compile_roots(roots, Vec::new(), opts)
}

fn compile_roots(
    roots: Vec<(String, raw::RawRoot)>,
    mut errors: Vec<ConfigError>,
    opts: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    let mut builder = Builder::new(opts);
    for (name, root) in roots {
        let refused = opts
            .without_slots
            .and_then(|store| refuse_concurrency(&root.descriptors, store));
        if let Some(message) = refused {
            errors.push(ConfigError::new(name, message));
            continue;
        }
        if let Err(message) = builder.add_file(root) {
            errors.push(ConfigError::new(name, message));
        }
    }
    if errors.is_empty() {
        Ok(builder.finish())
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The error for the first `algorithm: concurrency` below `descriptors`, for a store that
/// keeps no slots.
fn refuse_concurrency(descriptors: &[raw::RawDescriptor], store: &str) -> Option<String> {
    descriptors.iter().find_map(|d| {
        let blocks = d.rate_limit.iter().chain(d.rate_limits.iter().flatten());
        let uses = blocks
            .filter_map(|rl| rl.algorithm.as_deref())
            .any(|a| a == Algorithm::Concurrency.name());
        if uses {
            Some(format!(
                "descriptor '{}' uses 'algorithm: concurrency', which {store} cannot count (its \
                 slots need the memory, Redis or peer-cluster backend)",
                d.key
            ))
        } else {
            refuse_concurrency(&d.descriptors, store)
        }
    })
}

/// Every use of a Sluice extension key (`algorithm`, `burst`, `rate_limits`) in a source, as
/// `<file>: descriptor '<path>' uses '<what>', which envoyproxy/ratelimit does not understand`
/// lines, in file and document order (`check-config --strict-envoy`).
///
/// The scan reads the YAML generically, as Go's key walk does, so a key is reported wherever it
/// appears (outside `metadata`), even in a place Sluice ignores it. Files that are not valid
/// YAML contribute nothing: loading the config reports them. The error is for unreadable files.
pub(crate) fn envoy_extensions(
    source: &ConfigSource,
    limits: &FileLimits,
) -> Result<Vec<String>, ConfigErrors> {
    let snapshot = read_source(source, limits)?;
    let mut out = Vec::new();
    for (name, bytes) in &snapshot {
        if let Ok(text) = std::str::from_utf8(bytes) {
            out.extend(envoy_extensions_in(name, text));
        }
    }
    Ok(out)
}

/// [`envoy_extensions`] for one file's text.
pub fn envoy_extensions_in(name: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(value) = super::yaml::parse(text) else {
        return out;
    };
    if let Yaml::Mapping(root) = &value {
        let domain = root.get("domain").map(scalar).unwrap_or_default();
        scan_extensions(root, &domain, &mut |path, what| {
            out.push(format!(
                "{name}: descriptor '{path}' uses '{what}', which envoyproxy/ratelimit does not understand"
            ));
        });
    }
    out
}

/// Reports the extension keys of `map` and of everything below it; `path` is the full key of
/// the descriptor `map` belongs to (the domain at the top level).
fn scan_extensions(map: &Mapping, path: &str, report: &mut dyn FnMut(&str, String)) {
    for (k, v) in map {
        let Yaml::String(key) = k else { continue };
        if raw::EXTENSION_KEYS.contains(&key.as_str()) {
            let what = match v {
                // A list is shown by its key alone; `rate_limits: [...]` would be unreadable.
                Yaml::Sequence(_) | Yaml::Mapping(_) => key.clone(),
                other => format!("{key}: {}", raw::go_format(other)),
            };
            report(path, what);
        }
        match (key.as_str(), v) {
            ("metadata", _) => {}
            ("descriptors", Yaml::Sequence(items)) => {
                for item in items {
                    if let Yaml::Mapping(d) = item {
                        let child = descriptor_path(path, d);
                        scan_extensions(d, &child, report);
                    }
                }
            }
            (_, Yaml::Mapping(m)) => scan_extensions(m, path, report),
            (_, Yaml::Sequence(items)) => {
                for item in items {
                    if let Yaml::Mapping(m) = item {
                        scan_extensions(m, path, report);
                    }
                }
            }
            _ => {}
        }
    }
}

/// A descriptor's full key, built as the loader builds it: `parent.key` or `parent.key_value`.
fn descriptor_path(parent: &str, d: &Mapping) -> String {
    let key = d.get("key").map(scalar).unwrap_or_default();
    let value = d.get("value").map(scalar).unwrap_or_default();
    if value.is_empty() {
        format!("{parent}.{key}")
    } else {
        format!("{parent}.{key}_{value}")
    }
}

/// A scalar as the typed pass reads it into a string field (null is "").
fn scalar(v: &Yaml) -> String {
    match v {
        Yaml::Null => String::new(),
        other => raw::go_format(other),
    }
}

/// One config file of a source, as listed: its config name, path and metadata (through
/// symlinks, so a ConfigMap's `..data` swap shows as a new inode).
pub(crate) struct Listed {
    pub name: String,
    pub path: PathBuf,
    pub meta: fs::Metadata,
}

/// The config files of a source, sorted by name, and the problems met listing them. When the
/// source itself cannot be read (a missing directory), `files` is empty and `errors` says why.
pub(crate) struct Listing {
    pub files: Vec<Listed>,
    pub errors: Vec<ConfigError>,
}

impl Listing {
    /// The sizes of the listed files together, from their metadata.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.meta.len()).sum()
    }
}

/// Lists the files of a source without reading any: one `read_dir` per directory and one
/// `stat` per entry.
pub(crate) fn list_source(source: &ConfigSource) -> Listing {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    let mut add = |name: String, path: PathBuf, meta: fs::Metadata| {
        files.push(Listed { name, path, meta });
    };
    match source {
        ConfigSource::Path(path) => match fs::metadata(path) {
            Err(e) => errors.push(io_error(path, &e)),
            Ok(meta) if meta.is_dir() => walk(
                path,
                &mut Vec::new(),
                &mut Vec::new(),
                &mut |parts, p, m| add(parts.join("/"), p, m),
                &mut errors,
            ),
            Ok(meta) => {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| path.display().to_string());
                add(name, path.clone(), meta);
            }
        },
        ConfigSource::Runtime {
            root,
            subdirectory,
            app_directory,
        } => {
            let mut prefix: Vec<String> = app_directory
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .map(str::to_owned)
                .collect();
            let dir = prefix
                .iter()
                .fold(root.join(subdirectory), |acc, p| acc.join(p));
            match fs::metadata(&dir) {
                Err(e) => errors.push(io_error(&dir, &e)),
                Ok(meta) if !meta.is_dir() => {
                    errors.push(ConfigError::new(
                        dir.display().to_string(),
                        "not a directory",
                    ));
                }
                Ok(_) => walk(
                    &dir,
                    &mut prefix,
                    &mut Vec::new(),
                    &mut |parts, p, m| add(parts.join("."), p, m),
                    &mut errors,
                ),
            }
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Listing { files, errors }
}

/// How a source is named in errors about it as a whole: its file or directory.
pub(crate) fn source_name(source: &ConfigSource) -> String {
    match source {
        ConfigSource::Path(path) => path.display().to_string(),
        ConfigSource::Runtime {
            root,
            subdirectory,
            app_directory,
        } => root
            .join(subdirectory)
            .join(app_directory)
            .display()
            .to_string(),
    }
}

/// A file over SLUICE_CONFIG_MAX_FILE_BYTES, named as its other errors are: by its metadata's
/// `size`, or `None` when it grew past the cap while being read.
pub(crate) fn file_too_big(name: &str, size: Option<u64>, limits: &FileLimits) -> ConfigError {
    let max = limits.max_file_bytes;
    let message = match size {
        Some(size) => format!(
            "error loading config file: {size} bytes is more than SLUICE_CONFIG_MAX_FILE_BYTES={max}"
        ),
        None => format!(
            "error loading config file: it grew past SLUICE_CONFIG_MAX_FILE_BYTES={max} while being read"
        ),
    };
    ConfigError::new(name, message)
}

/// A source over SLUICE_CONFIG_MAX_TOTAL_BYTES, named by its file or directory: by its files'
/// metadata's total `size`, or `None` when they grew past it while being read.
pub(crate) fn source_too_big(
    source: &ConfigSource,
    size: Option<u64>,
    limits: &FileLimits,
) -> ConfigError {
    let max = limits.max_total_bytes;
    let message = match size {
        Some(size) => format!(
            "error loading config: the config files total {size} bytes, more than \
             SLUICE_CONFIG_MAX_TOTAL_BYTES={max}"
        ),
        None => format!(
            "error loading config: the config files grew past \
             SLUICE_CONFIG_MAX_TOTAL_BYTES={max} while being read"
        ),
    };
    ConfigError::new(source_name(source), message)
}

/// The error for a file that grew past `cap` while being read: the file's own cap, or what was
/// left of the source's total.
pub(crate) fn grew(
    source: &ConfigSource,
    name: &str,
    limits: &FileLimits,
    cap: u64,
) -> ConfigError {
    if cap < limits.max_file_bytes {
        source_too_big(source, None, limits)
    } else {
        file_too_big(name, None, limits)
    }
}

/// Reads at most `cap + 1` bytes of a file: one byte more than allowed tells a file that grew
/// past the cap after its size was checked, without reading the rest of it.
pub(crate) fn read_at_most(path: &Path, cap: u64) -> Result<Vec<u8>, ConfigError> {
    let file = fs::File::open(path).map_err(|e| io_error(path, &e))?;
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, &e))?;
    Ok(bytes)
}

/// Reads every file of a source once, within `limits`' sizes: a file or a source too big by its
/// metadata is refused before anything is read. Every problem is reported, each naming its file.
pub(crate) fn read_source(
    source: &ConfigSource,
    limits: &FileLimits,
) -> Result<Snapshot, ConfigErrors> {
    let listing = list_source(source);
    let total = listing.total_bytes();
    let over_total = total > limits.max_total_bytes;
    let mut errors = listing.errors;
    if over_total {
        errors.push(source_too_big(source, Some(total), limits));
    }
    let mut snapshot = Vec::with_capacity(listing.files.len());
    let mut read = 0u64;
    for file in listing.files {
        if file.meta.len() > limits.max_file_bytes {
            errors.push(file_too_big(&file.name, Some(file.meta.len()), limits));
            continue;
        }
        if over_total {
            continue;
        }
        let cap = limits.max_file_bytes.min(limits.max_total_bytes - read);
        match read_at_most(&file.path, cap) {
            Ok(bytes) if bytes.len() as u64 > cap => {
                errors.push(grew(source, &file.name, limits, cap));
            }
            Ok(bytes) => {
                read += bytes.len() as u64;
                snapshot.push((file.name, bytes));
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(snapshot)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn io_error(path: &Path, e: &std::io::Error) -> ConfigError {
    ConfigError::new(path.display().to_string(), format!("cannot read: {e}"))
}

fn is_yaml(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

/// Walks `dir` recursively, following symlinks, skipping dot entries, calling `found` with the
/// path components (below the walk root, after `parts`' initial prefix), path and metadata of
/// each YAML file. `ancestors` holds the canonical directories being walked, so a symlink cycle
/// ends the walk instead of recursing forever.
fn walk(
    dir: &Path,
    parts: &mut Vec<String>,
    ancestors: &mut Vec<PathBuf>,
    found: &mut dyn FnMut(&[String], PathBuf, fs::Metadata),
    errors: &mut Vec<ConfigError>,
) {
    let canonical = match fs::canonicalize(dir) {
        Ok(c) => c,
        Err(e) => return errors.push(io_error(dir, &e)),
    };
    if ancestors.contains(&canonical) {
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return errors.push(io_error(dir, &e)),
    };
    ancestors.push(canonical);
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(io_error(dir, &e));
                continue;
            }
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `fs::metadata` follows symlinks: a ConfigMap's `basic.yaml -> ..data/basic.yaml`
        // is a file, and a symlinked directory is walked.
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                errors.push(io_error(&path, &e));
                continue;
            }
        };
        parts.push(name);
        if meta.is_dir() {
            walk(&path, parts, ancestors, found, errors);
        } else if meta.is_file() && parts.last().is_some_and(|n| is_yaml(n)) {
            found(parts, path, meta);
        }
        parts.pop();
    }
    ancestors.pop();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn every_bad_file_is_reported_with_its_first_error() {
        let err = parse_files(
            &files(&[
                ("a.yaml", "domain: a\ndescriptors:\n  - key: x\n    ratelimit: {}\n"),
                ("b.yaml", "domain: b\ndescriptors:\n  - key: ''\n  - key: y\n    rate_limit: {unit: foo}\n"),
                ("c.yaml", "domain: c\n"),
                ("d.yaml", "domain: c\n"),
            ]),
            &LoadOptions::default(),
        )
        .expect_err("bad");
        assert_eq!(
            err.to_string(),
            "a.yaml: config error, unknown key 'ratelimit'\n\
             b.yaml: descriptor has empty key\n\
             d.yaml: duplicate domain 'c' in config file"
        );
    }

    #[test]
    fn a_failed_file_does_not_register_its_domain() {
        let err = parse_files(
            &files(&[
                ("a.yaml", "domain: x\ndescriptors:\n  - key: ''\n"),
                ("b.yaml", "domain: x\n"),
            ]),
            &LoadOptions::default(),
        )
        .expect_err("bad");
        assert_eq!(err.len(), 1);
    }

    #[test]
    fn empty_input_is_an_empty_config() {
        let cfg = parse_files(&[], &LoadOptions::default()).expect("ok");
        assert_eq!(cfg.domain_count(), 0);
    }

    #[test]
    fn extension_scan_reports_every_use_in_document_order() {
        let text = r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}
  - key: b
    value: 1
    descriptors:
      - key: c
        rate_limits:
          - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
          - {unit: day, requests_per_unit: 10000}
  - key: meta
    metadata: {algorithm: not_a_key_here}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: misplaced
    burst: 3
"#;
        let tail = "which envoyproxy/ratelimit does not understand";
        assert_eq!(
            envoy_extensions_in("x.yaml", text),
            vec![
                format!("x.yaml: descriptor 'd.a' uses 'algorithm: fixed_window', {tail}"),
                format!("x.yaml: descriptor 'd.b_1.c' uses 'rate_limits', {tail}"),
                format!("x.yaml: descriptor 'd.b_1.c' uses 'algorithm: token_bucket', {tail}"),
                format!("x.yaml: descriptor 'd.b_1.c' uses 'burst: 20', {tail}"),
                format!("x.yaml: descriptor 'd.misplaced' uses 'burst: 3', {tail}"),
            ]
        );
    }

    #[test]
    fn extension_scan_is_quiet_on_go_files_and_bad_yaml() {
        let go = "domain: d\ndescriptors:\n  - key: k\n    value: 200\n    rate_limit: {unit: second, requests_per_unit: 1, name: n}\n";
        assert!(envoy_extensions_in("go.yaml", go).is_empty());
        assert!(envoy_extensions_in("bad.yaml", "domain: [\n").is_empty());
        assert!(envoy_extensions_in("list.yaml", "- a\n").is_empty());
        // Merge keys are resolved first, so a use inherited through `<<` is reported too.
        let merged = "domain: d\ndescriptors:\n  - &base\n    key: a\n    rate_limit: {unit: second, algorithm: sliding_window}\n  - <<: *base\n    key: b\n";
        assert_eq!(envoy_extensions_in("m.yaml", merged).len(), 2);
    }

    #[test]
    fn extension_scan_reads_a_source_in_file_order() {
        let dir = tempfile::tempdir().expect("tmp");
        fs::write(dir.path().join("b.yaml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, burst: 2, algorithm: token_bucket}\n").unwrap();
        fs::write(
            dir.path().join("a.yaml"),
            "domain: a\ndescriptors:\n  - key: k\n    rate_limits: [{unit: second}]\n",
        )
        .unwrap();
        fs::write(dir.path().join("c.yaml"), "domain: c\n").unwrap();
        let limits = FileLimits::default();
        let lines =
            envoy_extensions(&ConfigSource::Path(dir.path().to_owned()), &limits).expect("reads");
        let heads: Vec<&str> = lines
            .iter()
            .map(|l| l.split(", which").next().unwrap_or(""))
            .collect();
        assert_eq!(
            heads,
            [
                "a.yaml: descriptor 'a.k' uses 'rate_limits'",
                "b.yaml: descriptor 'b.k' uses 'burst: 2'",
                "b.yaml: descriptor 'b.k' uses 'algorithm: token_bucket'",
            ]
        );
        let missing = envoy_extensions(&ConfigSource::Path(dir.path().join("nope")), &limits);
        assert!(missing.is_err());
    }

    #[test]
    fn non_utf8_is_a_load_error() {
        let snap = [("x.yaml", [0xff, 0xfe].as_slice())];
        let err = parse_snapshot(snap.into_iter(), &LoadOptions::default()).expect_err("bad");
        assert!(
            err.0[0]
                .to_string()
                .starts_with("x.yaml: error loading config file: invalid UTF-8")
        );
    }
}
