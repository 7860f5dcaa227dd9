//! Parsing helpers every settings file shares: Go's booleans and durations, "unset or empty",
//! non-zero counts, a value parsed or bounded with an error naming its variable ([`parsed`],
//! [`in_range`]), a value beside the variable it came from ([`Named`]), and the `key=value`
//! lists whose values are percent-decoded by the one strict decoder ([`crate::percent`]).

use std::fmt;
use std::num::NonZeroUsize;
use std::ops::RangeInclusive;
use std::time::Duration;

use super::{SettingsError, invalid};

/// An unset or empty variable is `None`: the Go service's defaults are "".
pub(super) fn non_empty(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

/// `key=value,key2=value2`, the W3C-baggage-like list OTEL_RESOURCE_ATTRIBUTES and
/// OTEL_EXPORTER_OTLP_HEADERS use: items trimmed, empty items skipped, values percent-decoded.
pub(super) fn key_values(
    var: &'static str,
    list: &str,
) -> Result<Vec<(String, String)>, SettingsError> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| invalid(var, item, "expected key=value"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(invalid(var, item, "empty key"));
        }
        let v = crate::percent::decode(v.trim().as_bytes()).ok_or_else(|| {
            invalid(
                var,
                item,
                "the value is not valid percent-encoded UTF-8 (a % takes two hex digits)",
            )
        })?;
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

/// Parses a Go `time.Duration` string: a sequence of decimal numbers with units ns, us (µs),
/// ms, s, m, h, such as `300ms`, `1.5s` or `1m30s`; a bare `0` is zero.
pub(crate) fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let value: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// A value and the variable (or flag) it came from, which an error about it names.
#[derive(Clone, Copy, Debug)]
pub(super) struct Named<T> {
    pub(super) var: &'static str,
    pub(super) value: T,
}

impl<T> Named<T> {
    pub(super) const fn new(var: &'static str, value: T) -> Self {
        Self { var, value }
    }
}

/// `value` when `range` holds it; else an error naming `var` and `value`: "must be between
/// {start} and {end}".
pub(super) fn in_range<T>(
    var: &'static str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<T, SettingsError>
where
    T: PartialOrd + fmt::Display,
{
    let (start, end) = (range.start(), range.end());
    in_range_or(
        var,
        value,
        &range,
        format_args!("must be between {start} and {end}"),
    )
}

/// [`in_range`] with the error's own `reason` ("expected 10 to 60000", a unit named).
pub(super) fn in_range_or<T>(
    var: &'static str,
    value: T,
    range: &RangeInclusive<T>,
    reason: impl fmt::Display,
) -> Result<T, SettingsError>
where
    T: PartialOrd + fmt::Display,
{
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(invalid(var, value, reason.to_string()))
    }
}

/// `value` as `parse` reads it; else an error naming `var` and `value`, with `reason`.
pub(super) fn parsed<T>(
    var: &'static str,
    value: &str,
    parse: impl FnOnce(&str) -> Option<T>,
    reason: impl fmt::Display,
) -> Result<T, SettingsError> {
    parse(value).ok_or_else(|| invalid(var, value, reason.to_string()))
}

/// A Go duration; else "expected a Go duration such as {example}".
pub(super) fn go_duration(
    var: &'static str,
    value: &str,
    example: &str,
) -> Result<Duration, SettingsError> {
    let reason = format_args!("expected a Go duration such as {example}");
    parsed(var, value, parse_go_duration, reason)
}

/// A Go duration above zero; else "expected a positive Go duration such as {example}".
pub(super) fn positive_go_duration(
    var: &'static str,
    value: &str,
    example: &str,
) -> Result<Duration, SettingsError> {
    let positive = |v: &str| parse_go_duration(v).filter(|d| !d.is_zero());
    let reason = format_args!("expected a positive Go duration such as {example}");
    parsed(var, value, positive, reason)
}

pub(super) fn non_zero(var: &'static str, value: usize) -> Result<NonZeroUsize, SettingsError> {
    NonZeroUsize::new(value).ok_or_else(|| invalid(var, value, "must be greater than 0"))
}

/// A table's least memory bound, and how its error message names it ("1 MiB").
#[derive(Clone, Copy, Debug)]
pub(super) struct MinBytes {
    pub(super) bytes: usize,
    pub(super) name: &'static str,
}

/// The least bound of most tables: 1 MiB.
pub(super) const MIB: MinBytes = MinBytes {
    bytes: 1 << 20,
    name: "1 MiB",
};

/// A table's memory bound (`*_MAX_BYTES`): at least `min`, at most 64 GiB.
pub(super) fn table_bytes(
    var: &'static str,
    value: usize,
    min: MinBytes,
) -> Result<usize, SettingsError> {
    let MinBytes { bytes, name } = min;
    in_range_or(
        var,
        value,
        &(bytes..=(64 << 30)),
        format_args!("must be between {bytes} ({name}) and 68719476736 (64 GiB)"),
    )
}

/// A boolean value that Go's `strconv.ParseBool` would reject.
#[derive(Debug, thiserror::Error)]
#[error("expected one of 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False")]
pub(crate) struct InvalidBool;

/// Parse a boolean exactly as Go's `strconv.ParseBool`, so values that worked for the Go
/// service mean the same here and values it rejected are rejected.
pub(crate) fn parse_go_bool(value: &str) -> Result<bool, InvalidBool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(InvalidBool),
    }
}

/// Comma-separated pairs split at the first of `separators`; empty items are skipped. The
/// error is the offending item. (Go skips an item without a separator; a typo is an error here.)
pub(super) fn pairs(value: &str, separators: &[char]) -> Result<Vec<(String, String)>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once(separators) {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => Err(item.to_owned()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("150us"), Some(Duration::from_micros(150)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("10"), None);
        assert_eq!(parse_go_duration(""), None);
    }
}
