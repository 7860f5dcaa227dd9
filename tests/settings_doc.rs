//! docs/settings.md is the settings reference: this test fails, naming each one, when a flag or
//! environment variable that `sluice --help` knows is missing from it, or one of the tools'
//! `SLUICE_*` names that start-up lets through.
//!
//! It reads the command line through the public clap entry point only (`sluice::settings::Cli`
//! and `clap::CommandFactory`), so it holds whatever the settings module looks like inside.

use std::collections::BTreeSet;

use clap::CommandFactory;
use sluice::settings::Cli;

/// Variables Sluice reads outside clap: NO_COLOR (`main`, for the logs). Add one here if some
/// code calls `std::env::var` for a setting, so the page must document it too.
const READ_OUTSIDE_CLAP: &[&str] = &["NO_COLOR"];

/// Every `--flag` and environment variable of the command and its subcommands, as `--help`
/// lists them (`--help` and `--version` themselves left out).
fn known_settings(cmd: &clap::Command, out: &mut BTreeSet<String>) {
    for arg in cmd.get_arguments() {
        if let Some(long) = arg.get_long()
            && long != "help"
            && long != "version"
        {
            out.insert(format!("--{long}"));
        }
        if let Some(env) = arg.get_env() {
            out.insert(env.to_string_lossy().into_owned());
        }
    }
    for sub in cmd.get_subcommands() {
        known_settings(sub, out);
    }
}

/// Whether `name` occurs in `text` as a whole word: not inside a longer variable name
/// (`REDIS_TLS` inside `REDIS_TLS_CACERT`) or a longer flag (`--redis-tls` inside
/// `--redis-tls-cacert`).
fn mentions(text: &str, name: &str) -> bool {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        // A flag may follow anything; a variable must not continue a longer word.
        let clean_before = name.starts_with("--") || !before.is_some_and(part_of_name);
        clean_before && !after.is_some_and(part_of_name)
    })
}

#[test]
fn every_setting_help_knows_is_in_docs_settings_md() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md"))
        .expect("docs/settings.md is readable");
    let mut known = BTreeSet::new();
    known_settings(&Cli::command(), &mut known);
    known.extend(READ_OUTSIDE_CLAP.iter().map(|s| s.to_string()));
    // The tools' SLUICE_* names start-up lets through must be documented as such.
    known.extend(
        sluice::settings::TOOL_VARIABLES
            .iter()
            .map(|s| s.to_string()),
    );
    assert!(
        known.len() > 100,
        "the command line should know every setting, found only {}",
        known.len()
    );
    let missing: Vec<&String> = known.iter().filter(|n| !mentions(&page, n)).collect();
    assert!(
        missing.is_empty(),
        "docs/settings.md does not mention {} setting(s) `sluice --help` knows: {}",
        missing.len(),
        missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[test]
fn mentions_needs_a_whole_name() {
    let text = "REDIS_TLS_CACERT and `--redis-tls-cacert`, and --port.";
    assert!(mentions(text, "REDIS_TLS_CACERT"));
    assert!(!mentions(text, "REDIS_TLS"));
    assert!(!mentions(text, "TLS_CACERT"));
    assert!(mentions(text, "--redis-tls-cacert"));
    assert!(!mentions(text, "--redis-tls"));
    assert!(mentions(text, "--port"));
}
