//! The `RateLimit-*` headers a gRPC (and `/json`) answer carries: LIMIT_RESPONSE_HEADERS_ENABLED
//! and its names for the client's answer (`response_headers_to_add`),
//! LIMIT_REQUEST_HEADERS_ENABLED and its names for the request Envoy lets through to the
//! upstream (`request_headers_to_add`, envoyproxy/ratelimit's PR #1168), and
//! LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED (its open PR #1190), validated into the service's
//! [`HeaderNames`].
//!
//! The Go service reads these again at every config reload (its `SetConfig`); from a process's
//! unchanging environment that gives the values read at start, which is what Sluice keeps: a
//! reload never changes them. (#1168 also fixed Go's reload so that a flag once on could be
//! turned off; only a test that changes the process's environment could see the difference.)

use clap::ArgAction;

use super::parse::parse_go_bool;
use super::{SettingsError, header_name};
use crate::service::HeaderNames;

/// Raw header settings, as typed by the operator.
#[derive(Clone, Debug, clap::Args)]
pub struct HeaderArgs {
    /// Add RateLimit-Limit/-Remaining/-Reset headers to responses.
    #[arg(
        long,
        env = "LIMIT_RESPONSE_HEADERS_ENABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Response headers"
    )]
    pub limit_response_headers_enabled: bool,
    /// Name of the header carrying the limit.
    #[arg(
        long,
        env = "LIMIT_LIMIT_HEADER",
        default_value = "RateLimit-Limit",
        help_heading = "Response headers"
    )]
    pub limit_limit_header: String,
    /// Name of the header carrying the remaining hits.
    #[arg(
        long,
        env = "LIMIT_REMAINING_HEADER",
        default_value = "RateLimit-Remaining",
        help_heading = "Response headers"
    )]
    pub limit_remaining_header: String,
    /// Name of the header carrying the seconds until the window resets.
    #[arg(
        long,
        env = "LIMIT_RESET_HEADER",
        default_value = "RateLimit-Reset",
        help_heading = "Response headers"
    )]
    pub limit_reset_header: String,
    /// Response headers for every descriptor with a limit, ratelimit-limit-<unit>s and
    /// ratelimit-remaining-<unit>s, instead of the three above (envoyproxy/ratelimit's open
    /// PR #1190).
    #[arg(
        long,
        env = "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Response headers"
    )]
    pub limit_all_descriptors_headers_enabled: bool,

    /// Add RateLimit-Limit/-Remaining/-Reset to the request Envoy sends on to the upstream
    /// (request_headers_to_add).
    #[arg(
        long,
        env = "LIMIT_REQUEST_HEADERS_ENABLED",
        value_name = "BOOL",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = parse_go_bool,
        help_heading = "Request headers"
    )]
    pub limit_request_headers_enabled: bool,
    /// Name of the upstream request's header carrying the limit.
    #[arg(
        long,
        env = "LIMIT_REQUEST_LIMIT_HEADER",
        default_value = "RateLimit-Limit",
        help_heading = "Request headers"
    )]
    pub limit_request_limit_header: String,
    /// Name of the upstream request's header carrying the remaining hits.
    #[arg(
        long,
        env = "LIMIT_REQUEST_REMAINING_HEADER",
        default_value = "RateLimit-Remaining",
        help_heading = "Request headers"
    )]
    pub limit_request_remaining_header: String,
    /// Name of the upstream request's header carrying the seconds until the window resets.
    #[arg(
        long,
        env = "LIMIT_REQUEST_RESET_HEADER",
        default_value = "RateLimit-Reset",
        help_heading = "Request headers"
    )]
    pub limit_request_reset_header: String,
}

/// The validated header settings, as [`crate::service::ServiceOptions`] takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Headers {
    /// LIMIT_RESPONSE_HEADERS_ENABLED's names; `None` when it is off.
    pub response: Option<HeaderNames>,
    /// LIMIT_REQUEST_HEADERS_ENABLED's names; `None` when it is off.
    pub request: Option<HeaderNames>,
    /// LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED.
    pub all_descriptors: bool,
}

impl HeaderArgs {
    /// The names are checked even when their headers are off: a bad name is a typo worth
    /// reporting before someone turns the headers on.
    pub(super) fn validate(&self) -> Result<Headers, SettingsError> {
        let response = names(
            [
                "LIMIT_LIMIT_HEADER",
                "LIMIT_REMAINING_HEADER",
                "LIMIT_RESET_HEADER",
            ],
            [
                &self.limit_limit_header,
                &self.limit_remaining_header,
                &self.limit_reset_header,
            ],
        )?;
        let request = names(
            [
                "LIMIT_REQUEST_LIMIT_HEADER",
                "LIMIT_REQUEST_REMAINING_HEADER",
                "LIMIT_REQUEST_RESET_HEADER",
            ],
            [
                &self.limit_request_limit_header,
                &self.limit_request_remaining_header,
                &self.limit_request_reset_header,
            ],
        )?;
        Ok(Headers {
            response: self.limit_response_headers_enabled.then_some(response),
            request: self.limit_request_headers_enabled.then_some(request),
            all_descriptors: self.limit_all_descriptors_headers_enabled,
        })
    }
}

/// The limit, remaining and reset names, each checked under its variable.
fn names(vars: [&'static str; 3], values: [&String; 3]) -> Result<HeaderNames, SettingsError> {
    let [limit, remaining, reset] = vars;
    let [l, m, r] = values;
    Ok(HeaderNames {
        limit: header_name(limit, l.clone())?,
        remaining: header_name(remaining, m.clone())?,
        reset: header_name(reset, r.clone())?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{error, parse, settings};
    use super::*;

    #[test]
    fn request_headers_are_off_by_default_and_named_like_the_response_headers() {
        let s = settings(&[]).unwrap().app.service;
        assert_eq!(s.request_headers, None);
        assert!(!s.all_descriptors_headers);
        let s = settings(&["--limit-request-headers-enabled"])
            .unwrap()
            .app
            .service;
        assert_eq!(s.request_headers, Some(HeaderNames::default()));
        // Independent of the response headers, as in Go.
        assert_eq!(s.response_headers, None);
    }

    #[test]
    fn request_header_names_are_their_own_and_checked() {
        let s = settings(&[
            "--limit-request-headers-enabled=true",
            "--limit-request-limit-header",
            "X-Quota-Limit",
            "--limit-request-remaining-header",
            "X-Quota-Remaining",
            "--limit-request-reset-header",
            "X-Quota-Reset",
            "--limit-response-headers-enabled=true",
        ])
        .unwrap()
        .app
        .service;
        assert_eq!(
            s.request_headers,
            Some(HeaderNames {
                limit: "X-Quota-Limit".into(),
                remaining: "X-Quota-Remaining".into(),
                reset: "X-Quota-Reset".into(),
            })
        );
        assert_eq!(s.response_headers, Some(HeaderNames::default()));
        // A bad name stops start-up even while the headers are off.
        assert_eq!(
            error(&["--limit-request-remaining-header", "X Quota"]),
            "LIMIT_REQUEST_REMAINING_HEADER=X Quota: not a valid HTTP header name"
        );
        assert!(
            error(&["--limit-request-reset-header", ""])
                .starts_with("LIMIT_REQUEST_RESET_HEADER=:")
        );
        let bad = parse(&["--limit-request-headers-enabled=yes"]).unwrap_err();
        assert!(
            bad.to_string()
                .contains("'yes' for LIMIT_REQUEST_HEADERS_ENABLED"),
            "{bad}"
        );
    }

    #[test]
    fn all_descriptors_headers_are_a_go_boolean() {
        let s = settings(&["--limit-all-descriptors-headers-enabled=T"])
            .unwrap()
            .app
            .service;
        assert!(s.all_descriptors_headers);
        let bad = parse(&["--limit-all-descriptors-headers-enabled=on"]).unwrap_err();
        assert!(
            bad.to_string()
                .contains("'on' for LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED"),
            "{bad}"
        );
    }
}
