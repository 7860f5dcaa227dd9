//! JSON numbers as `/json` reads them: integers that fit 64 bits as serde_json gives them, and
//! every other number (a fraction, an exponent, or more than 64 bits) as written in the body,
//! because a double holds integers exactly only up to 2^53 and protojson reads an integral
//! value in any form exactly (`1.8446744073709551615e19` is `u64::MAX`).
//!
//! serde_json's visitor hands over a double, not the text, so [`NumberTexts`] finds the text in
//! the body: serde_json visits numbers in the order they are written, one visit per number, so
//! the n-th visit is the n-th number token outside strings. It scans only when a number is not
//! a 64-bit integer, and never twice over the same bytes.

use std::fmt;

/// A JSON number as written.
#[derive(Clone, Debug)]
pub(super) enum Number {
    U(u64),
    I(i64),
    /// A number serde_json read as a double, kept as written.
    Written(Box<str>),
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::U(n) => write!(f, "{n}"),
            Number::I(n) => write!(f, "{n}"),
            Number::Written(text) => f.write_str(text),
        }
    }
}

/// What an integer field makes of a number.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Integral {
    Exactly(i128),
    /// Integral, but beyond any integer field's range (more than 38 digits).
    Beyond,
    /// Not an integer: it has a fraction.
    Fraction,
}

impl Number {
    /// The exact integer this number is, as protojson reads one: an integral value in any
    /// form (`1e2`, `100.0`, `0.5e1`), and nothing with a fraction (`1.5`, `1e-1`).
    pub(super) fn integral(&self) -> Integral {
        match self {
            Number::U(n) => Integral::Exactly(i128::from(*n)),
            Number::I(n) => Integral::Exactly(i128::from(*n)),
            Number::Written(text) => integral(text),
        }
    }
}

/// The integer the JSON number `text` denotes (`-? int (. frac)? ([eE] [+-]? exp)?`, already
/// checked by serde_json): its digits times ten to the exponent less the fraction's length,
/// computed exactly.
fn integral(text: &str) -> Integral {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((text, "0"));
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    if significant.is_empty() {
        return Integral::Exactly(0);
    }
    let zeros = digits.len() - digits.trim_end_matches('0').len();
    // Beyond i64 only for a value far past every range (or below 1e-9e18: a fraction).
    let Ok(exponent) = exponent
        .strip_prefix('+')
        .unwrap_or(exponent)
        .parse::<i64>()
    else {
        return if exponent.starts_with('-') {
            Integral::Fraction
        } else {
            Integral::Beyond
        };
    };
    // The power of ten the significant digits are multiplied by; the casts cannot wrap, as the
    // text is shorter than the body cap.
    let scale = exponent.saturating_add(zeros as i64 - fraction.len() as i64);
    if scale < 0 {
        return Integral::Fraction;
    }
    if significant.len() as i64 + scale > 38 {
        return Integral::Beyond;
    }
    // At most 38 digits: below 10^38 < i128::MAX, so nothing here overflows.
    let mut n: i128 = significant
        .bytes()
        .fold(0, |n, d| n * 10 + i128::from(d - b'0'));
    for _ in 0..scale {
        n *= 10;
    }
    Integral::Exactly(if negative { -n } else { n })
}

/// The texts of a body's numbers, found on demand in the order serde_json visits them.
pub(super) struct NumberTexts<'a> {
    body: &'a [u8],
    /// Where the scan stopped: just past the last number token it returned.
    at: usize,
    /// Numbers visited since then whose text nobody asked for: tokens to pass over first.
    skipped: usize,
}

impl<'a> NumberTexts<'a> {
    pub(super) fn new(body: &'a [u8]) -> Self {
        NumberTexts {
            body,
            at: 0,
            skipped: 0,
        }
    }

    /// A number visited without its text (a 64-bit integer).
    pub(super) fn pass(&mut self) {
        self.skipped += 1;
    }

    /// The text of the number visited now: the next number token after those passed.
    pub(super) fn next(&mut self) -> Option<&'a str> {
        for _ in 0..std::mem::take(&mut self.skipped) {
            self.token()?;
        }
        self.token()
    }

    /// The next number token outside strings; true, false and null hold no digit or `-`.
    fn token(&mut self) -> Option<&'a str> {
        let body = self.body;
        let mut i = self.at;
        while i < body.len() {
            match body[i] {
                b'"' => i = string_end(body, i + 1),
                b'-' | b'0'..=b'9' => {
                    let len = body[i..]
                        .iter()
                        .take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                        .count();
                    self.at = i + len;
                    return std::str::from_utf8(&body[i..i + len]).ok();
                }
                _ => i += 1,
            }
        }
        self.at = i;
        None
    }
}

/// Just past the closing quote of the string whose contents start at `i`.
fn string_end(body: &[u8], mut i: usize) -> usize {
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integral_values_in_any_form_are_exact() {
        let cases = [
            ("0", Integral::Exactly(0)),
            ("-0.0e5", Integral::Exactly(0)),
            ("0e-99999999999999999999", Integral::Exactly(0)),
            ("100.0", Integral::Exactly(100)),
            ("1e2", Integral::Exactly(100)),
            ("1E+2", Integral::Exactly(100)),
            ("0.5e1", Integral::Exactly(5)),
            ("0.05e2", Integral::Exactly(5)),
            ("1000e-3", Integral::Exactly(1)),
            ("-12.50e1", Integral::Exactly(-125)),
            (
                "9007199254740993.0",
                Integral::Exactly(9_007_199_254_740_993),
            ),
            (
                "9007199254740993e0",
                Integral::Exactly(9_007_199_254_740_993),
            ),
            (
                "1.8446744073709551615e19",
                Integral::Exactly(i128::from(u64::MAX)),
            ),
            (
                "18446744073709551616.000",
                Integral::Exactly(i128::from(u64::MAX) + 1),
            ),
            ("1e38", Integral::Beyond),
            ("1e99999999999999999999", Integral::Beyond),
            ("1.5", Integral::Fraction),
            ("1e-1", Integral::Fraction),
            ("15e-1", Integral::Fraction),
            (
                "1.00000000000000000000000000000000000000001",
                Integral::Fraction,
            ),
            ("1e-99999999999999999999", Integral::Fraction),
        ];
        for (text, want) in cases {
            assert_eq!(integral(text), want, "{text}");
        }
        assert_eq!(integral("1e37"), Integral::Exactly(10_i128.pow(37)));
    }

    #[test]
    fn number_texts_come_in_order_past_strings_and_integers() {
        let body = br#"{"a\"1":[1, -2.5e3, "3.0\\", true, 4, 5.0], "6": 7E1}"#;
        let mut texts = NumberTexts::new(body);
        texts.pass();
        assert_eq!(texts.next(), Some("-2.5e3"));
        texts.pass();
        assert_eq!(texts.next(), Some("5.0"));
        assert_eq!(texts.next(), Some("7E1"));
        assert_eq!(texts.next(), None);
    }
}
