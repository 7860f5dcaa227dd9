//! Unknown `SLUICE_*` variables: a misspelt Sluice setting (`SLUICE_CLUSTR_MODE=lease`) would
//! otherwise be ignored without a word and start a node that is not what its operator asked
//! for. Every `SLUICE_*` variable must be a setting (a flag's `env`) or one of the few names
//! Sluice's own tools read; anything else stops start-up naming the closest setting.
//!
//! The Go service's own variables (`PORT`, `REDIS_URL`, ...) keep its leniency: it ignores
//! variables it does not know, and deployments that swap the binary carry such variables.

use std::ffi::OsString;

/// `SLUICE_*` names that are not settings of the binary but of Sluice's own tools, so a shell
/// or CI job that sets them can still start `sluice`: the test suite's switches and the paths
/// of the programs it runs (`scripts/test.sh`, `integration/`), the advisory database of
/// `cargo deny`, and the example gRPC client's address (`examples/should_rate_limit.rs`).
pub const TOOL_VARIABLES: &[&str] = &[
    "SLUICE_REQUIRE_TOOLS",
    "SLUICE_SKIPPED_FILE",
    "SLUICE_BIN",
    "SLUICE_ENVOY",
    "SLUICE_NGINX",
    "SLUICE_HAPROXY",
    "SLUICE_TRAEFIK",
    "SLUICE_CADDY",
    "SLUICE_HELM",
    "SLUICE_ADVISORY_DB",
    "SLUICE_ADVISORY_DB_ROOT",
    "SLUICE_GRPC",
];

/// One line per `SLUICE_*` name in `present` that is neither in `settings` nor a tool's,
/// naming the closest setting when one is close; empty when all are known.
pub(super) fn unknown_sluice_variables(
    present: impl IntoIterator<Item = OsString>,
    settings: &[&str],
) -> Vec<String> {
    let mut unknown: Vec<String> = present
        .into_iter()
        .filter_map(|name| name.into_string().ok())
        .filter(|name| name.starts_with("SLUICE_"))
        .filter(|name| !settings.contains(&name.as_str()) && !TOOL_VARIABLES.contains(&&**name))
        .collect();
    unknown.sort();
    unknown
        .into_iter()
        .map(|name| match closest(&name, settings) {
            Some(near) => format!("{name} is not a Sluice setting; did you mean {near}?"),
            None => format!(
                "{name} is not a Sluice setting (`sluice --help` lists them all; docs/settings.md)"
            ),
        })
        .collect()
}

/// The setting nearest to `name` by edit distance, if it is near enough to be a misspelling:
/// at most a third of the name's length in edits (`SLUICE_CLUSTR_MODE` is one edit from
/// `SLUICE_CLUSTER_MODE`; `SLUICE_FOO` is near nothing).
fn closest<'a>(name: &str, settings: &[&'a str]) -> Option<&'a str> {
    let allowed = name.len() / 3;
    settings
        .iter()
        .filter(|s| s.starts_with("SLUICE_"))
        .map(|s| (edit_distance(name, s), *s))
        .filter(|(d, _)| *d <= allowed)
        .min()
        .map(|(_, s)| s)
}

/// Levenshtein distance over bytes (the names are ASCII): insertions, deletions and
/// substitutions each cost one.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: &[&str] = &[
        "SLUICE_CLUSTER_MODE",
        "SLUICE_MAX_CONNECTIONS",
        "SLUICE_MAX_COUNTERS",
        "PORT",
    ];

    fn check(present: &[&str]) -> Vec<String> {
        unknown_sluice_variables(present.iter().map(OsString::from), SETTINGS)
    }

    #[test]
    fn misspelt_settings_name_the_closest_one() {
        assert_eq!(
            check(&["SLUICE_MAX_CONECTIONS", "SLUICE_CLUSTR_MODE"]),
            [
                "SLUICE_CLUSTR_MODE is not a Sluice setting; did you mean SLUICE_CLUSTER_MODE?",
                "SLUICE_MAX_CONECTIONS is not a Sluice setting; did you mean SLUICE_MAX_CONNECTIONS?",
            ]
        );
    }

    #[test]
    fn a_name_near_nothing_points_at_the_list() {
        assert_eq!(
            check(&["SLUICE_FOO"]),
            [
                "SLUICE_FOO is not a Sluice setting (`sluice --help` lists them all; docs/settings.md)"
            ]
        );
    }

    #[test]
    fn settings_tools_and_other_variables_pass() {
        assert!(
            check(&[
                "SLUICE_CLUSTER_MODE",
                "SLUICE_REQUIRE_TOOLS",
                "SLUICE_SKIPPED_FILE",
                "SLUICE_ENVOY",
                "PORTT",
                "REDIS_URLL",
                "HOME",
                "sluice_lower",
            ])
            .is_empty()
        );
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("abc", "abd"), 1);
        assert_eq!(edit_distance("abc", "ab"), 1);
        assert_eq!(edit_distance("ab", "abc"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
