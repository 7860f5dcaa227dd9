//! The well-known types as protojson writes them: `google.protobuf.Duration` (`"1.500s"`),
//! `google.protobuf.Timestamp` (RFC 3339 in UTC, through [`crate::limiter::calendar::civil_from_days`]) and `bytes`
//! (base64). Pure functions of their input; nothing here knows serde.

use envoy_types::pb::google::protobuf::{Duration, Timestamp};

/// The limits of `google.protobuf.Duration`: ±10,000 years.
const MAX_DURATION_SECONDS: i128 = 315_576_000_000;
/// The limits of `google.protobuf.Timestamp`: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
const MIN_TIMESTAMP_SECONDS: i128 = -62_135_596_800;
const MAX_TIMESTAMP_SECONDS: i128 = 253_402_300_799;
const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// `"58s"`, `"1.500s"`, `"-0.000001s"`: 0, 3, 6 or 9 fractional digits, as protojson writes them.
///
/// protojson errors on a duration outside ±10,000 years or with `seconds` and `nanos` of opposite
/// signs; encoding cannot fail here, so the total is normalized and clamped to that range instead.
pub(super) fn format_duration(d: &Duration) -> String {
    let max = (MAX_DURATION_SECONDS + 1) * NANOS_PER_SECOND - 1;
    let total = (i128::from(d.seconds) * NANOS_PER_SECOND + i128::from(d.nanos)).clamp(-max, max);
    let sign = if total < 0 { "-" } else { "" };
    let (seconds, nanos) = (
        total.abs() / NANOS_PER_SECOND,
        total.abs() % NANOS_PER_SECOND,
    );
    format!("{sign}{seconds}{}s", fraction(nanos))
}

/// The fractional part of a second, trimmed to 0, 3, 6 or 9 digits.
fn fraction(nanos: i128) -> String {
    if nanos == 0 {
        String::new()
    } else if nanos % 1_000_000 == 0 {
        format!(".{:03}", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!(".{:06}", nanos / 1_000)
    } else {
        format!(".{nanos:09}")
    }
}

/// RFC 3339 in UTC, e.g. `"2017-01-15T01:30:15.010Z"`, clamped (rather than failing, as protojson
/// would) to the years 0001..=9999 that the format can express.
pub(super) fn format_timestamp(t: &Timestamp) -> String {
    let total = (i128::from(t.seconds) * NANOS_PER_SECOND + i128::from(t.nanos)).clamp(
        MIN_TIMESTAMP_SECONDS * NANOS_PER_SECOND,
        (MAX_TIMESTAMP_SECONDS + 1) * NANOS_PER_SECOND - 1,
    );
    let (seconds, nanos) = (
        total.div_euclid(NANOS_PER_SECOND),
        total.rem_euclid(NANOS_PER_SECOND),
    );
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = crate::limiter::calendar::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}{}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        fraction(nanos),
    )
}

/// Standard base64 with padding, as `protojson` writes a `bytes` field.
pub(super) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_durations_like_protojson() {
        let cases = [
            ((0, 0), "0s"),
            ((58, 0), "58s"),
            ((1, 500_000_000), "1.500s"),
            ((1, 10_000), "1.000010s"),
            ((0, 1), "0.000000001s"),
            ((-1, -500_000_000), "-1.500s"),
            ((0, -1_000), "-0.000001s"),
            // Mixed signs are invalid; the total is what counts.
            ((2, -500_000_000), "1.500s"),
            // Beyond ±10,000 years: clamped.
            ((i64::MAX, 999_999_999), "315576000000.999999999s"),
            ((i64::MIN, -999_999_999), "-315576000000.999999999s"),
        ];
        for ((seconds, nanos), want) in cases {
            assert_eq!(
                format_duration(&Duration { seconds, nanos }),
                want,
                "{seconds}s {nanos}ns"
            );
        }
    }

    #[test]
    fn formats_timestamps_like_protojson() {
        let cases = [
            ((0, 0), "1970-01-01T00:00:00Z"),
            ((1_484_443_815, 10_000_000), "2017-01-15T01:30:15.010Z"),
            ((951_782_400, 0), "2000-02-29T00:00:00Z"),
            ((-1, 999_999_999), "1969-12-31T23:59:59.999999999Z"),
            ((MIN_TIMESTAMP_SECONDS as i64, 0), "0001-01-01T00:00:00Z"),
            ((MAX_TIMESTAMP_SECONDS as i64, 0), "9999-12-31T23:59:59Z"),
            ((i64::MIN, 0), "0001-01-01T00:00:00Z"),
            ((i64::MAX, i32::MAX), "9999-12-31T23:59:59.999999999Z"),
        ];
        for ((seconds, nanos), want) in cases {
            assert_eq!(
                format_timestamp(&Timestamp { seconds, nanos }),
                want,
                "{seconds}s {nanos}ns"
            );
        }
    }

    #[test]
    fn encodes_base64_with_padding() {
        for (raw, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), want);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }
}
