//! [`Secret`]: a value that must never show in logs, error messages or debug output (a
//! password, a token). Settings read REDIS_AUTH and its siblings into it; the stores hand it to
//! their clients at the last moment, through [`Secret::expose`].
//!
//! It sits low in the house, beside `percent`, because settings, stores and telemetry all hold
//! secrets and none of them may import another's types for that.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

/// A string that prints as `<redacted>` whatever formats it; [`Secret::expose`] gives the
/// value to the one call that needs it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the client that sends it. Never format the result.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Lets clap parse a flag or variable straight into a `Secret`, so the raw settings
/// (`ServeArgs`, which derives `Debug`) never hold the value as a plain string.
impl FromStr for Secret {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(Secret::new(s))
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn a_secret_never_formats_its_value() {
        let s: Secret = "hunter2".parse().unwrap();
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&s)), "Some(<redacted>)");
        assert!(!format!("{s:#?}").contains("hunter2"));
        assert!(Secret::default().is_empty());
    }
}
