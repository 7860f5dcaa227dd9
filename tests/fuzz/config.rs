//! The YAML config loader: file text -> raw types -> validated, compiled config
//! (`config::parse_files`, and `config::load` for bytes on disk).
//!
//! A model of a valid config (a descriptor tree with limits of every algorithm) is rendered as
//! YAML; the loaded config must hold exactly the model's limits at the model's paths. The same
//! text with mutations, and raw bytes, must load or fail with one error per bad file that names
//! it; whatever loads must answer lookups and dump without panicking.

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
use proptest::prelude::*;
use proptest::sample::select;
use sluice::config::{ConfigErrors, LoadOptions, RateLimitConfig, Rule, envoy_extensions_in};
use sluice::config::{ConfigSource, load, parse_files};
use sluice::descriptor::Entry;
use sluice::limiter::concurrency::MAX_SLOTS;
use sluice::limiter::{Algorithm, Unit};

use crate::mutate::{apply, mutations, raw_bytes};
use crate::support::{fuzz_input, fuzz_parts, load_options, proptest_config, timed};

/// Syntax a mutation may insert: YAML indicators, anchors and aliases, tags, odd scalars, and
/// the config's own keys.
const TOKENS: &[&[u8]] = &[
    b": ",
    b"\n",
    b"\n  - ",
    b"- ",
    b"&a ",
    b"*a",
    b"<<: *a\n",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"'",
    b"\"",
    b"#",
    b"!!str ",
    b"!!binary ",
    b"!t ",
    b"%YAML 1.1\n",
    b"---\n",
    b"...\n",
    b"? ",
    b"|\n",
    b">-\n",
    b"\t",
    b"~",
    b"null",
    b"-1",
    b"4294967296",
    b"1e999",
    b".nan",
    b"0x10",
    b"yes",
    b"requests_per_unit: ",
    b"unit: ",
    b"key: ",
    b"value: ",
    b"descriptors:\n",
    b"rate_limit: ",
    b"rate_limits: ",
    b"algorithm: ",
    b"burst: ",
    b"metadata: ",
    b"replaces: ",
    b"unlimited: true",
    b"share_threshold: true",
    b"*",
    b"\xef\xbb\xbf",
    b"\\x00",
];

/// One block of a modelled limit.
#[derive(Clone, Debug)]
struct Block {
    unit: Unit,
    /// 0: lower case, 1: upper case, 2: capitalised (units are case-insensitive).
    spelling: u8,
    requests_per_unit: u32,
    name: String,
    algorithm: Option<Algorithm>,
    burst: Option<u32>,
}

/// One modelled descriptor. Its key is `stem` plus its index among its siblings, so sibling
/// keys (and so composite keys) never collide.
#[derive(Clone, Debug)]
struct Desc {
    stem: String,
    value: String,
    blocks: Vec<Block>,
    /// Write a single block as `rate_limits: [..]` rather than `rate_limit:`.
    as_list: bool,
    share_threshold: bool,
    shadow_mode: bool,
    /// Metadata, the first time as an anchor and then as aliases of it.
    metadata: bool,
    children: Vec<Desc>,
}

/// A modelled file: a domain and its descriptors.
#[derive(Clone, Debug)]
struct Model {
    domain: String,
    descriptors: Vec<Desc>,
}

fn block() -> impl Strategy<Value = Block> {
    (
        select(Unit::ALL.to_vec()),
        0u8..3,
        prop_oneof![0u32..100, any::<u32>(), Just(u32::MAX)],
        "[a-z]{0,3}",
        proptest::option::of(select(Algorithm::ALL.to_vec())),
        proptest::option::of(1u32..50),
    )
        .prop_map(
            |(unit, spelling, requests_per_unit, name, algorithm, burst)| Block {
                unit,
                spelling,
                // A concurrency limit holds at most MAX_SLOTS slots (a larger one is refused).
                requests_per_unit: match algorithm {
                    Some(Algorithm::Concurrency) => requests_per_unit.min(MAX_SLOTS),
                    _ => requests_per_unit,
                },
                name,
                burst: burst.filter(|_| algorithm.is_some_and(Algorithm::takes_burst)),
                algorithm,
            },
        )
}

fn desc_with(children: impl Strategy<Value = Vec<Desc>>) -> impl Strategy<Value = Desc> {
    (
        "[a-z]{1,3}",
        prop_oneof![
            Just(String::new()),
            "[a-z0-9]{1,4}",
            "[a-z0-9]{0,3}\\*[a-z]{0,2}",
            "[a-zA-Z0-9 .:#@/&%-]{1,6}",
        ],
        proptest::collection::vec(block(), 0..3),
        any::<(bool, bool, bool, bool)>(),
        children,
    )
        .prop_map(
            |(stem, value, blocks, (as_list, share, shadow_mode, metadata), children)| Desc {
                share_threshold: share && value.contains('*'),
                stem,
                value,
                blocks,
                as_list,
                shadow_mode,
                metadata,
                children,
            },
        )
}

fn model() -> impl Strategy<Value = Model> {
    let desc = desc_with(Just(Vec::new())).prop_recursive(3, 24, 4, |inner| {
        desc_with(proptest::collection::vec(inner, 0..4))
    });
    (
        "[a-z][a-z0-9_-]{0,6}",
        proptest::collection::vec(desc, 0..5),
    )
        .prop_map(|(domain, descriptors)| Model {
            domain,
            descriptors,
        })
}

/// A YAML single-quoted scalar.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn flow_block(b: &Block) -> String {
    let unit = match b.spelling {
        0 => b.unit.name().to_ascii_lowercase(),
        1 => b.unit.name().to_owned(),
        _ => {
            let lower = b.unit.name().to_ascii_lowercase();
            lower[..1].to_ascii_uppercase() + &lower[1..]
        }
    };
    let mut out = format!("{{unit: {unit}, requests_per_unit: {}", b.requests_per_unit);
    if !b.name.is_empty() {
        out += &format!(", name: {}", quoted(&b.name));
    }
    if let Some(a) = b.algorithm {
        out += &format!(", algorithm: {}", a.name());
    }
    if let Some(n) = b.burst {
        out += &format!(", burst: {n}");
    }
    out + "}"
}

/// Appends one descriptor; `anchored` says whether the metadata anchor `&m` is written yet.
fn render_desc(out: &mut String, d: &Desc, index: usize, indent: usize, anchored: &mut bool) {
    let pad = " ".repeat(indent);
    out.push_str(&format!("{pad}- key: {}{index}\n", d.stem));
    if !d.value.is_empty() {
        out.push_str(&format!("{pad}  value: {}\n", quoted(&d.value)));
    }
    if d.shadow_mode {
        out.push_str(&format!("{pad}  shadow_mode: true\n"));
    }
    if d.share_threshold {
        out.push_str(&format!("{pad}  share_threshold: yes\n"));
    }
    if d.metadata && *anchored {
        out.push_str(&format!("{pad}  metadata: *m\n"));
    } else if d.metadata {
        out.push_str(&format!(
            "{pad}  metadata: &m {{tier: gold, n: [1, 2.5, null]}}\n"
        ));
        *anchored = true;
    }
    match d.blocks.as_slice() {
        [] => {}
        [one] if !d.as_list => out.push_str(&format!("{pad}  rate_limit: {}\n", flow_block(one))),
        blocks => {
            out.push_str(&format!("{pad}  rate_limits:\n"));
            for b in blocks {
                out.push_str(&format!("{pad}    - {}\n", flow_block(b)));
            }
        }
    }
    if !d.children.is_empty() {
        out.push_str(&format!("{pad}  descriptors:\n"));
        for (i, c) in d.children.iter().enumerate() {
            render_desc(out, c, i, indent + 4, anchored);
        }
    }
}

fn render(m: &Model) -> String {
    let mut out = format!("# generated\ndomain: {}\ndescriptors:\n", quoted(&m.domain));
    let mut anchored = false;
    for (i, d) in m.descriptors.iter().enumerate() {
        render_desc(&mut out, d, i, 2, &mut anchored);
    }
    out
}

/// What the model says one descriptor node is: its request path, full key and blocks.
struct Expected {
    path: Vec<Entry>,
    full_key: String,
    blocks: Vec<(u32, Unit, Algorithm, Option<u32>, String)>,
    shadow_mode: bool,
}

fn expected(m: &Model) -> Vec<Expected> {
    fn walk(ds: &[Desc], parent: &[Entry], key: &str, out: &mut Vec<Expected>) {
        for (i, d) in ds.iter().enumerate() {
            let name = format!("{}{i}", d.stem);
            let composite = if d.value.is_empty() {
                name.clone()
            } else {
                format!("{name}_{}", d.value)
            };
            let mut path = parent.to_vec();
            path.push(Entry::new(name, d.value.clone()));
            let full_key = format!("{key}.{composite}");
            walk(&d.children, &path, &full_key, out);
            out.push(Expected {
                path,
                full_key,
                blocks: d
                    .blocks
                    .iter()
                    .map(|b| {
                        let algorithm = b.algorithm.unwrap_or_default();
                        (
                            b.requests_per_unit,
                            b.unit,
                            algorithm,
                            b.burst,
                            b.name.clone(),
                        )
                    })
                    .collect(),
                shadow_mode: d.shadow_mode,
            });
        }
    }
    let mut out = Vec::new();
    walk(&m.descriptors, &[], &m.domain, &mut out);
    out
}

/// The model's check: the rendered file loads, and every node's path finds exactly its limit
/// (or none when the node has none).
fn check_model(m: &Model) {
    let text = render(m);
    let cfg = parse_files(&[("f.yaml".into(), text.clone())], &LoadOptions::default())
        .unwrap_or_else(|e| panic!("a valid file was refused: {e}\n{text}"));
    let domain = cfg.domain(&m.domain).expect("the model's domain");
    let nodes = expected(m);
    for node in &nodes {
        let found = domain.lookup(&node.path);
        if node.blocks.is_empty() {
            assert!(found.is_none(), "{}: no limit expected", node.full_key);
            continue;
        }
        let found = found.unwrap_or_else(|| panic!("{}: limit not found\n{text}", node.full_key));
        let limit = found.limit;
        assert_eq!(limit.full_key, node.full_key);
        assert_eq!(limit.shadow_mode, node.shadow_mode);
        let Rule::Limited(blocks) = &limit.rule else {
            panic!("{}: unlimited", node.full_key);
        };
        let got: Vec<_> = blocks
            .iter()
            .map(|b| {
                let q = b.quota;
                let burst = q.burst.map(|n| n.get());
                (
                    q.requests_per_unit,
                    q.unit,
                    q.algorithm,
                    burst,
                    b.name.clone(),
                )
            })
            .collect();
        assert_eq!(got, node.blocks, "{}", node.full_key);
    }
    let lines: usize = nodes.iter().map(|n| n.blocks.len()).sum();
    assert_eq!(cfg.dump().lines().count(), lines);
}

/// The `--strict-envoy` scan: every line names the file and a descriptor.
fn check_extensions(name: &str, text: &str) {
    let prefix = format!("{name}: descriptor '");
    for line in envoy_extensions_in(name, text) {
        assert!(line.starts_with(&prefix), "{line}");
    }
}

/// At most one error per file, each naming one of the files and saying something.
fn check_errors(errors: &ConfigErrors, names: &[&str]) {
    assert!(!errors.is_empty());
    let mut seen = Vec::new();
    for e in errors.iter() {
        assert!(names.contains(&e.name.as_str()), "unnamed error: {e}");
        assert!(
            !seen.contains(&e.name),
            "two errors for {}: {errors}",
            e.name
        );
        seen.push(e.name.clone());
        assert!(!e.message.trim().is_empty(), "empty message for {}", e.name);
        assert_eq!(e.to_string(), format!("{}: {}", e.name, e.message));
    }
}

/// A loaded config answers lookups of any entries, and its dump and limits are well formed.
fn check_config(cfg: &RateLimitConfig, probes: &[Vec<Entry>]) {
    let domains: Vec<&str> = cfg.domains().map(|d| d.name()).collect();
    let in_a_domain = |key: &str| domains.iter().any(|d| key.starts_with(&format!("{d}.")));
    for line in cfg.dump().lines() {
        assert!(in_a_domain(line), "dump line outside every domain: {line}");
    }
    for limit in cfg.limits() {
        if let Rule::Limited(blocks) = &limit.rule {
            assert!(!blocks.is_empty(), "{}: no blocks", limit.full_key);
            for b in blocks.iter() {
                assert!(b.quota.burst.is_none() || b.quota.algorithm.takes_burst());
            }
        }
    }
    for domain in cfg.domains() {
        for probe in probes {
            let found = domain.lookup(probe);
            assert_eq!(found.is_some(), domain.stats_key(probe).is_some());
            if let Some(m) = found {
                assert!(m.limit.full_key.starts_with(&format!("{}.", domain.name())));
                assert!(m.shared_values.iter().all(|(i, _)| *i < probe.len()));
            }
        }
    }
}

/// The check for any set of file texts: what loads is well formed, what fails is named.
pub fn check_files(files: &[(String, String)], merge: bool, probes: &[Vec<Entry>]) {
    for (name, text) in files {
        check_extensions(name, text);
    }
    let opts = load_options(merge);
    match parse_files(files, &opts) {
        Ok(cfg) => check_config(&cfg, probes),
        Err(errors) => {
            let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
            check_errors(&errors, &names);
        }
    }
}

/// The check for bytes on disk: `load` of a directory agrees with `parse_files` of the same
/// texts, and a file that is not UTF-8 is refused by name.
pub fn check_load(files: &[(String, Vec<u8>)]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).expect("write a config file");
    }
    let loaded = load(
        &ConfigSource::Path(dir.path().to_owned()),
        &LoadOptions::default(),
        &Default::default(),
    );
    let texts: Vec<(String, String)> = files
        .iter()
        .filter_map(|(n, b)| Some((n.clone(), String::from_utf8(b.clone()).ok()?)))
        .collect();
    if texts.len() == files.len() {
        let parsed = parse_files(&texts, &LoadOptions::default());
        assert_eq!(
            loaded.as_ref().map(RateLimitConfig::dump),
            parsed.as_ref().map(RateLimitConfig::dump)
        );
        return;
    }
    let errors = loaded.expect_err("a file that is not UTF-8 loads");
    for (name, bytes) in files {
        if std::str::from_utf8(bytes).is_err() {
            let e = errors.iter().find(|e| &e.name == name).expect("named");
            assert!(e.message.contains("invalid UTF-8"), "{e}");
        }
    }
}

/// One cargo-fuzz input (`fuzz/fuzz_targets/config.rs`): a flags byte (bit 0:
/// MERGE_DOMAIN_CONFIG; bit 1: also load the bytes from disk), then up to three files' bytes
/// separated by NUL ([`fuzz_parts`]).
pub fn check_fuzz_input(data: &[u8]) {
    let Some((flags, rest)) = data.split_first() else {
        return;
    };
    let files: Vec<(String, Vec<u8>)> = fuzz_parts(rest, 3)
        .enumerate()
        .map(|(i, bytes)| (format!("{i}.yaml"), bytes.to_vec()))
        .collect();
    let texts: Vec<(String, String)> = files
        .iter()
        .map(|(name, bytes)| (name.clone(), String::from_utf8_lossy(bytes).into_owned()))
        .collect();
    check_files(&texts, flags & 1 == 1, &[]);
    if flags & 2 == 2 {
        check_load(&files);
    }
}

/// Request entries to look up: the model's own paths (which the mutations may have broken)
/// and a few made-up ones.
fn probes(models: &[Model], extra: Vec<Vec<(String, String)>>) -> Vec<Vec<Entry>> {
    let mut out: Vec<Vec<Entry>> = models
        .iter()
        .flat_map(|m| expected(m).into_iter().map(|e| e.path))
        .collect();
    out.extend(
        extra
            .into_iter()
            .map(|es| es.into_iter().map(|(k, v)| Entry::new(k, v)).collect()),
    );
    out
}

fn extra_probes() -> impl Strategy<Value = Vec<Vec<(String, String)>>> {
    proptest::collection::vec(
        proptest::collection::vec(("[a-z]{1,2}[0-3]", "[a-z0-9*]{0,3}"), 0..4),
        0..4,
    )
}

proptest! {
    #![proptest_config(proptest_config(256, "proptest-regressions/fuzz/config.txt"))]

    #[test]
    fn a_modelled_file_loads_as_modelled(m in model()) {
        timed("config model", || check_model(&m));
    }

    #[test]
    fn mutated_files_load_or_fail_by_name(
        files in proptest::collection::vec((model(), mutations(6)), 1..4),
        merge in any::<bool>(),
        extra in extra_probes(),
    ) {
        let models: Vec<Model> = files.iter().map(|(m, _)| m.clone()).collect();
        let texts: Vec<(String, String)> = files
            .iter()
            .enumerate()
            .map(|(i, (m, edits))| {
                let mut bytes = render(m).into_bytes();
                apply(&mut bytes, edits, TOKENS);
                (format!("{i}.yaml"), String::from_utf8_lossy(&bytes).into_owned())
            })
            .collect();
        let probes = probes(&models, extra);
        timed("config mutated", || check_files(&texts, merge, &probes));
    }

    /// Raw files as the cargo-fuzz target reads them, loaded from text and from disk.
    #[test]
    fn raw_bytes_on_disk_load_or_fail_by_name(
        files in proptest::collection::vec(raw_bytes(512), 1..3),
        merge in any::<bool>(),
    ) {
        let input = fuzz_input(2 | u8::from(merge), &files);
        timed("config raw", || check_fuzz_input(&input));
    }
}

/// Found while fuzzing: nested aliases ("billion laughs") made 2.6 KB of YAML into 10 million
/// values, 3.8 s and 1 GB in a release build; now the file is refused at once, by name.
#[test]
fn nested_aliases_are_refused_quickly() {
    let mut text = format!("a: &a [{}]\n", vec!["x"; 1000].join(","));
    text.push_str(&format!("b: &b [{}]\n", vec!["*a"; 100].join(",")));
    text.push_str(&format!("c: &c [{}]\n", vec!["*b"; 100].join(",")));
    let started = std::time::Instant::now();
    let errors = parse_files(
        &[("bomb.yaml".into(), text.clone())],
        &LoadOptions::default(),
    )
    .expect_err("refused");
    assert!(envoy_extensions_in("bomb.yaml", &text).is_empty());
    // Not a speed claim: the expansion this guards against takes tens of seconds in a debug
    // build, so a bound far above a loaded machine's worst (2.2 s seen at load 11) still fails
    // on it.
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors.0[0].name, "bomb.yaml");
    assert!(
        errors.0[0]
            .message
            .starts_with("error loading config file: aliases expand the document"),
        "{errors}"
    );
}
