//! Finding and reading config files, and turning a set of files into one [`RateLimitConfig`].
//!
//! Two layouts are supported: `--config PATH` (one file or a directory tree) and the Go
//! service's runtime layout (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`, each
//! file named by its goruntime key). Either way files are loaded in sorted name order so a
//! given set of files always loads the same way, and entries whose name starts with '.' are
//! skipped: a Kubernetes ConfigMap mount holds `..data` and `..<timestamp>` entries next to
//! the user-visible symlinks, and walking them would load every file two or three times.

use super::compile::{Builder, RateLimitConfig};
use super::{ConfigError, ConfigErrors, raw};
use serde_yaml_ng::{Mapping, Value as Yaml};
use std::fs;
use std::path::{Path, PathBuf};

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
}

/// The files of a source, sorted by name, with their raw bytes. Two equal snapshots load to the
/// same config, so the watcher compares snapshots to decide whether to reload.
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

/// Reads and builds the config of a source.
pub fn load(source: &ConfigSource, opts: &LoadOptions) -> Result<RateLimitConfig, ConfigErrors> {
    let snapshot = read_source(source)?;
    parse_snapshot(&snapshot, opts)
}

pub(crate) fn parse_snapshot(
    snapshot: &Snapshot,
    opts: &LoadOptions,
) -> Result<RateLimitConfig, ConfigErrors> {
    build(
        snapshot.iter().map(|(name, bytes)| {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| format!("error loading config file: invalid UTF-8: {e}"));
            (name.as_str(), text)
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
    let mut builder = Builder::new(opts.merge_domain_config);
    for (name, root) in roots {
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

/// Every use of a Sluice extension key (`algorithm`, `burst`, `rate_limits`) in a source, as
/// `<file>: descriptor '<path>' uses '<what>', which envoyproxy/ratelimit does not understand`
/// lines, in file and document order (`check-config --strict-envoy`).
///
/// The scan reads the YAML generically, as Go's key walk does, so a key is reported wherever it
/// appears (outside `metadata`), even in a place Sluice ignores it. Files that are not valid
/// YAML contribute nothing: loading the config reports them. The error is for unreadable files.
pub fn envoy_extensions(source: &ConfigSource) -> Result<Vec<String>, ConfigErrors> {
    let snapshot = read_source(source)?;
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
    let Ok(mut value) = super::yaml::parse(text) else {
        return out;
    };
    if value.apply_merge().is_err() {
        return out;
    }
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

/// Reads every file of a source. Any unreadable file or directory is an error naming its path.
pub(crate) fn read_source(source: &ConfigSource) -> Result<Snapshot, ConfigErrors> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let mut errors = Vec::new();
    match source {
        ConfigSource::Path(path) => {
            let meta = fs::metadata(path).map_err(|e| io_error(path, &e))?;
            if meta.is_dir() {
                walk(
                    path,
                    &mut Vec::new(),
                    &mut Vec::new(),
                    &mut |parts, p| found.push((parts.join("/"), p)),
                    &mut errors,
                );
            } else {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| path.display().to_string());
                found.push((name, path.clone()));
            }
        }
        ConfigSource::Runtime {
            root,
            subdirectory,
            app_directory,
        } => {
            let base = root.join(subdirectory);
            let mut prefix: Vec<String> = app_directory
                .split('/')
                .filter(|p| !p.is_empty() && *p != ".")
                .map(str::to_owned)
                .collect();
            let dir = prefix.iter().fold(base, |acc, p| acc.join(p));
            let meta = fs::metadata(&dir).map_err(|e| io_error(&dir, &e))?;
            if !meta.is_dir() {
                return Err(ConfigError::new(dir.display().to_string(), "not a directory").into());
            }
            walk(
                &dir,
                &mut prefix,
                &mut Vec::new(),
                &mut |parts, p| found.push((parts.join("."), p)),
                &mut errors,
            );
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut snapshot = Vec::with_capacity(found.len());
    for (name, path) in found {
        match fs::read(&path) {
            Ok(bytes) => snapshot.push((name, bytes)),
            Err(e) => errors.push(io_error(&path, &e)),
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
/// path components (below the walk root, after `parts`' initial prefix) of each YAML file.
/// `ancestors` holds the canonical directories being walked, so a symlink cycle ends the walk
/// instead of recursing forever.
fn walk(
    dir: &Path,
    parts: &mut Vec<String>,
    ancestors: &mut Vec<PathBuf>,
    found: &mut dyn FnMut(&[String], PathBuf),
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
            found(parts, path);
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
        let lines = envoy_extensions(&ConfigSource::Path(dir.path().to_owned())).expect("reads");
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
        let missing = envoy_extensions(&ConfigSource::Path(dir.path().join("nope")));
        assert!(missing.is_err());
    }

    #[test]
    fn non_utf8_is_a_load_error() {
        let snap = vec![("x.yaml".to_owned(), vec![0xff, 0xfe])];
        let err = parse_snapshot(&snap, &LoadOptions::default()).expect_err("bad");
        assert!(
            err.0[0]
                .to_string()
                .starts_with("x.yaml: error loading config file: invalid UTF-8")
        );
    }
}
