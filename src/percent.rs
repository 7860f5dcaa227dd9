//! The one percent-decoder: `%` followed by exactly two hex digits is a byte, everything else
//! is itself, and the result must be UTF-8. Used by `/nginx`'s descriptor headers and by the
//! settings' `key=value` lists (OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_*HEADERS) and
//! REDIS_URL's `redis://` credentials. And the one encoder, [`encode`] (`sluice explain`'s
//! query).
//!
//! Strict on purpose: a `%` not followed by two hex digits is an error rather than kept, so a
//! value that was meant to be encoded and was not is caught, not used. `+` is a plus, not a
//! space (this is not form encoding).

/// Percent-encodes every byte of `text` but ASCII letters, digits, `-._~` (RFC 3986's
/// unreserved characters) and the bytes of `keep`.
pub fn encode(text: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decodes `text` into UTF-8; `None` for a `%` without two hex digits after it (`%+f`
/// included, which `u8::from_str_radix` alone would take) or for bytes that are not UTF-8.
pub fn decode(text: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%' {
            let high = hex_digit(*text.get(i + 1)?)?;
            let low = hex_digit(*text.get(i + 2)?)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_digit(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::decode;

    fn d(s: &str) -> Option<String> {
        decode(s.as_bytes())
    }

    /// The cases of the two decoders this one replaces (`/nginx`'s and the settings'), through
    /// the one rule: they agreed on everything but `%+f`, which both now refuse.
    #[test]
    fn both_old_decoders_cases() {
        // Plain text, and the escapes `/nginx` documents: `%2C` `,`, `%26` `&`, `%25` `%`.
        assert_eq!(d("plain").as_deref(), Some("plain"));
        assert_eq!(d("").as_deref(), Some(""));
        assert_eq!(d("a%2Cb%26c%25d").as_deref(), Some("a,b&c%d"));
        assert_eq!(d("%2Fa%3Fb%3D1%26c%2C2").as_deref(), Some("/a?b=1&c,2"));
        assert_eq!(d("%40at+plus%25").as_deref(), Some("@at+plus%"));
        // Either case of hex digit; `+` stays a plus.
        assert_eq!(d("%2c%2C").as_deref(), Some(",,"));
        assert_eq!(d("a+b").as_deref(), Some("a+b"));
        // Multi-byte UTF-8, encoded or not.
        assert_eq!(d("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(d("café").as_deref(), Some("café"));
        // The settings' cases: OTLP header values and resource attributes.
        assert_eq!(d("Bearer%20abc").as_deref(), Some("Bearer abc"));
        assert_eq!(d("a%3Db").as_deref(), Some("a=b"));
        // A `%` without two hex digits after it.
        for bad in ["%", "%4", "abc%", "%zz", "%g0", "%0g", "% 1", "%+1"] {
            assert_eq!(d(bad), None, "{bad}");
        }
        // Not UTF-8 once decoded.
        assert_eq!(d("%FF"), None);
        assert_eq!(d("%ff"), None);
        assert_eq!(d("%C3"), None);
        assert_eq!(decode(b"\xff"), None);
    }

    /// The difference between the two old decoders: the settings' took `%+f` as 0x0f, since
    /// `u8::from_str_radix` accepts a sign; `/nginx`'s refused it. Only two hex digits count.
    #[test]
    fn a_sign_is_not_a_hex_digit() {
        assert_eq!(d("%+f"), None);
        assert_eq!(d("%-1"), None);
        assert_eq!(d("x%+fy"), None);
        assert_eq!(d("%0f").as_deref(), Some("\u{f}"));
    }
}
