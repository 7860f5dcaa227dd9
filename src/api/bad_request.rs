//! Why a request could not be decoded, whichever adapter read it: one error for `/json`,
//! `/nginx`, `/forward-auth`, the debug port's requests, SPOE messages and gRPC's conversion,
//! with the HTTP status and the gRPC code it answers. The adapter's own typed error (a
//! `JsonError`, `ConvertError`, `HeaderError`, ...) stays its [`source`](Error::source).
//!
//! The cause is boxed rather than one enum variant per adapter's error: every adapter returns a
//! [`BadRequest`], so an enum naming their errors would make this module and each adapter import
//! each other. The [`Kind`] says what callers branch on; each adapter's error converts itself
//! (`From`) with its kind.

use std::error::Error;
use std::fmt;

use axum::http::StatusCode;

/// What was wrong with a request, as far as the answer's status goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A body over SLUICE_MAX_REQUEST_BYTES.
    BodyTooLarge,
    /// A body that could not be read to its end (the client went away mid-body, a broken
    /// chunked encoding).
    BodyUnreadable,
    /// What was read does not make a valid request: not JSON, a field of the wrong type, an
    /// unknown or repeated field, a header, query parameter or SPOE argument that does not
    /// parse, fields over the byte cap, a limit override's unknown unit.
    Invalid,
}

/// A request refused as the client's mistake; permanent, since the same request cannot
/// succeed. Its text is the cause's, unchanged.
#[derive(Debug)]
pub struct BadRequest {
    kind: Kind,
    cause: Box<dyn Error + Send + Sync>,
}

impl BadRequest {
    /// A refusal of `kind` because of `cause`.
    pub fn new(kind: Kind, cause: impl Error + Send + Sync + 'static) -> Self {
        BadRequest {
            kind,
            cause: Box::new(cause),
        }
    }

    /// A request whose fields do not make a valid one ([`Kind::Invalid`]).
    pub fn invalid(cause: impl Error + Send + Sync + 'static) -> Self {
        BadRequest::new(Kind::Invalid, cause)
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The status an HTTP adapter answers: 413 Payload Too Large for a body over the cap, 400
    /// Bad Request otherwise. (`/json` answers 400 to everything, as the Go service does.)
    pub(crate) fn http_status(&self) -> StatusCode {
        match self.kind {
            Kind::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::BodyUnreadable | Kind::Invalid => StatusCode::BAD_REQUEST,
        }
    }

    /// The code a gRPC adapter answers: INVALID_ARGUMENT, for a size too (as the gRPC listener
    /// refuses a message over SLUICE_MAX_REQUEST_BYTES, `crate::net`).
    pub fn grpc_code(&self) -> tonic::Code {
        match self.kind {
            Kind::BodyTooLarge | Kind::BodyUnreadable | Kind::Invalid => {
                tonic::Code::InvalidArgument
            }
        }
    }
}

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The cause's text alone: it already says what is wrong and where, and clients and
        // tests read it as it is.
        self.cause.fmt(f)
    }
}

impl Error for BadRequest {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.cause)
    }
}

impl From<BadRequest> for tonic::Status {
    fn from(e: BadRequest) -> Self {
        tonic::Status::new(e.grpc_code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("descriptors[0]: wrong")]
    struct Cause;

    #[test]
    fn keeps_the_cause_its_text_and_its_status() {
        let e = BadRequest::invalid(Cause);
        assert_eq!(e.to_string(), "descriptors[0]: wrong");
        assert!(e.source().unwrap().downcast_ref::<Cause>().is_some());
        assert_eq!(e.http_status(), StatusCode::BAD_REQUEST);
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "descriptors[0]: wrong");
    }

    #[test]
    fn a_body_over_the_cap_is_413_and_invalid_argument() {
        let e = BadRequest::new(Kind::BodyTooLarge, Cause);
        assert_eq!(e.http_status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
        let e = BadRequest::new(Kind::BodyUnreadable, Cause);
        assert_eq!(e.http_status(), StatusCode::BAD_REQUEST);
    }
}
