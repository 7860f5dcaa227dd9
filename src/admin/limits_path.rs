//! The runtime-limits API's paths (issue 38): `/limits/<domain>/<k1>=<v1>[/<k2>=<v2>...]` names
//! one descriptor path, `/limits/<domain>` a domain's runtime limits, `/limits/_history` the
//! audit log. Domains, keys and values are percent-encoded ([`crate::percent`]: strict, `+` is a
//! plus); the first `=` of a segment ends its key, and a segment without `=` is a value-less
//! (key-only) node.
//!
//! Bounds, so a hostile path costs little: at most [`MAX_DEPTH`] levels and
//! [`MAX_PATH_BYTES`] bytes, checked before anything is decoded.

use crate::percent;

/// The most levels a runtime limit's descriptor path may have.
pub(crate) const MAX_DEPTH: usize = 8;

/// The longest path taken, in bytes, percent-encoding included.
pub(crate) const MAX_PATH_BYTES: usize = 4096;

/// The audit log's name: never a domain here, so a domain of that name (decoded, `%5Fhistory`
/// too) can get no runtime limits.
pub(crate) const HISTORY: &str = "_history";

/// One level of a descriptor path: a key, and its value unless the node is key-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Level {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
}

/// What a `/limits/...` path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LimitsPath {
    /// `/limits/_history`: the last changes.
    History,
    /// `/limits/<domain>`: the domain's runtime limits.
    Domain(String),
    /// `/limits/<domain>/<levels>`: one descriptor path's limit.
    Limit { domain: String, levels: Vec<Level> },
}

/// A path that names nothing, with what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    #[error("the path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("a runtime limit's path has at most {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the path does not start with /limits/")]
    NotLimits,
    #[error("the path names no domain: /limits/<domain>[/<key>=<value>...]")]
    NoDomain,
    #[error("segment {index}: {what}")]
    Segment { index: usize, what: &'static str },
}

fn decode(text: &str, index: usize) -> Result<String, PathError> {
    percent::decode(text.as_bytes()).ok_or(PathError::Segment {
        index,
        what: "a `%` not followed by two hex digits, or not UTF-8",
    })
}

impl LimitsPath {
    /// Parses the path of a request (no query string).
    pub(crate) fn parse(path: &str) -> Result<LimitsPath, PathError> {
        if path.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong);
        }
        let rest = path.strip_prefix("/limits/").ok_or(PathError::NotLimits)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let mut segments = rest.split('/');
        let domain = segments.next().filter(|d| !d.is_empty());
        let domain = decode(domain.ok_or(PathError::NoDomain)?, 1)?;
        let segments: Vec<&str> = segments.collect();
        if segments.len() > MAX_DEPTH {
            return Err(PathError::TooDeep);
        }
        if segments.is_empty() {
            return Ok(if domain == HISTORY {
                LimitsPath::History
            } else {
                LimitsPath::Domain(domain)
            });
        }
        if domain == HISTORY {
            return Err(PathError::Segment {
                index: 1,
                what: "_history is the audit log, not a domain",
            });
        }
        let levels = segments
            .iter()
            .enumerate()
            .map(|(i, s)| level(s, i + 2))
            .collect::<Result<_, _>>()?;
        Ok(LimitsPath::Limit { domain, levels })
    }
}

fn level(segment: &str, index: usize) -> Result<Level, PathError> {
    let (key, value) = match segment.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (segment, None),
    };
    if key.is_empty() {
        return Err(PathError::Segment {
            index,
            what: "an empty key (a descriptor key cannot be empty)",
        });
    }
    Ok(Level {
        key: decode(key, index)?,
        value: value.map(|v| decode(v, index)).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(key: &str, value: Option<&str>) -> Level {
        Level {
            key: key.to_owned(),
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn a_path_names_a_domain_a_descriptor_path_or_the_history() {
        assert_eq!(
            LimitsPath::parse("/limits/_history"),
            Ok(LimitsPath::History)
        );
        assert_eq!(
            LimitsPath::parse("/limits/edge/"),
            Ok(LimitsPath::Domain("edge".to_owned()))
        );
        assert_eq!(
            LimitsPath::parse("/limits/edge/tenant=acme/path=%2Fapi%2Fv1/method"),
            Ok(LimitsPath::Limit {
                domain: "edge".to_owned(),
                levels: vec![
                    level("tenant", Some("acme")),
                    level("path", Some("/api/v1")),
                    level("method", None),
                ],
            })
        );
    }

    #[test]
    fn the_first_equals_sign_ends_the_key_and_plus_is_a_plus() {
        assert_eq!(
            LimitsPath::parse("/limits/d/a%3Db=c=d/e=").unwrap(),
            LimitsPath::Limit {
                domain: "d".to_owned(),
                levels: vec![level("a=b", Some("c=d")), level("e", Some(""))],
            }
        );
        let LimitsPath::Limit { levels, .. } = LimitsPath::parse("/limits/d/k=a+b").unwrap() else {
            panic!("a limit");
        };
        assert_eq!(levels, [level("k", Some("a+b"))]);
    }

    #[test]
    fn a_bad_path_says_what_is_wrong() {
        let err = |p: &str| LimitsPath::parse(p).unwrap_err().to_string();
        assert_eq!(err("/limit/d"), "the path does not start with /limits/");
        assert_eq!(
            err("/limits/"),
            "the path names no domain: /limits/<domain>[/<key>=<value>...]"
        );
        assert_eq!(
            err("/limits/d/=v"),
            "segment 2: an empty key (a descriptor key cannot be empty)"
        );
        assert_eq!(
            err("/limits/d/k=%zz"),
            "segment 2: a `%` not followed by two hex digits, or not UTF-8"
        );
        assert_eq!(
            err("/limits/_history/k=v"),
            "segment 1: _history is the audit log, not a domain"
        );
        let deep = format!("/limits/d{}", "/k=v".repeat(MAX_DEPTH + 1));
        assert_eq!(err(&deep), "a runtime limit's path has at most 8 levels");
        let long = format!("/limits/d/k={}", "v".repeat(MAX_PATH_BYTES));
        assert_eq!(err(&long), "the path is longer than 4096 bytes");
    }
}
