//! Why a call to a peer failed, as [`PeerError`]: the caller marks the peer down whatever the
//! reason, but a log line, a test or a [`crate::store::StoreError`]'s source can tell a peer
//! that did not answer from one that refused or answered wrong.
//!
//! Each message is the one this node logged before the errors were typed (`peer failed;
//! marking it down`'s `error` field), so log searches keep working.

use std::sync::Arc;
use std::time::Duration;

/// The calls of the peer protocol, as a failed call's message names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Apply,
    Lease,
    Quota,
    Limits,
}

impl Call {
    /// An Apply call is just "call": it was the only one when these messages were first written.
    fn named(self) -> &'static str {
        match self {
            Call::Apply => "call",
            Call::Lease => "lease call",
            Call::Quota => "quota call",
            Call::Limits => "limits call",
        }
    }
}

/// What the peer answered that does not fit what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("{got} decisions for {hits} hits")]
    Decisions { got: usize, hits: usize },
    #[error("{got} grants for {asks} asks")]
    Grants { got: usize, asks: usize },
    /// The number of parts per bucket answered, against the holders listed per bucket.
    #[error("parts for {answered:?} holders, asked for {asked:?}")]
    Parts {
        answered: Vec<usize>,
        asked: Vec<usize>,
    },
}

/// Why a call to a peer (or, for [`PeerError::Address`] and [`PeerError::Tls`], a client for
/// one) failed. `Clone`, since one failed Apply call fails every forward batched into it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerError {
    /// No answer within the deadline (SLUICE_PEER_TIMEOUT_MS).
    #[error("peer did not answer within {after:?}")]
    Timeout { after: Duration },
    /// The call did not reach the peer, or its connection broke under it: tonic's status for a
    /// connect, TLS or HTTP/2 failure, whose source is that transport error.
    #[error("peer {} failed: {}", .call.named(), .status.message())]
    Unreachable {
        call: Call,
        #[source]
        status: tonic::Status,
    },
    /// The peer answered the call with an error status: another protocol version
    /// (FAILED_PRECONDITION), a number it does not know (INVALID_ARGUMENT), a full or failing
    /// store (UNAVAILABLE), a call it does not serve. An answer tonic cannot decode is reported
    /// by tonic itself as INTERNAL, and lands here too.
    #[error("peer {} failed: {message}", .call.named())]
    Refused {
        call: Call,
        code: tonic::Code,
        message: String,
    },
    /// The peer answered, but not one answer per item asked.
    #[error("peer answered {0}")]
    Malformed(Malformed),
    /// This node has no working client for the peer: its batching task stopped, or dropped
    /// the call (the runtime is shutting down), or the peer has none (it is this node).
    #[error("{0}")]
    NoClient(&'static str),
    /// The peer's address is not one this node can dial.
    #[error("peer {addr}: {source}")]
    Address {
        addr: String,
        source: Arc<tonic::transport::Error>,
    },
    /// SLUICE_PEER_TLS: the peer's certificate cannot be checked (no name to check it against).
    #[error(transparent)]
    Tls(Arc<crate::tls::TlsError>),
}

impl PeerError {
    /// A failed `call`'s status: one with a source was made by this node's transport (the
    /// source is the connect or HTTP/2 error), so the peer was not reached; one without is the
    /// peer's own answer, read from its trailers.
    pub(super) fn from_status(call: Call, status: tonic::Status) -> Self {
        if std::error::Error::source(&status).is_some() {
            PeerError::Unreachable { call, status }
        } else {
            PeerError::Refused {
                call,
                code: status.code(),
                message: status.message().to_owned(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_ones_logged_before() {
        let refused = |call| {
            PeerError::from_status(call, tonic::Status::failed_precondition("no")).to_string()
        };
        assert_eq!(refused(Call::Apply), "peer call failed: no");
        assert_eq!(refused(Call::Lease), "peer lease call failed: no");
        assert_eq!(refused(Call::Quota), "peer quota call failed: no");
        let timeout = PeerError::Timeout {
            after: Duration::from_millis(200),
        };
        assert_eq!(timeout.to_string(), "peer did not answer within 200ms");
        let wrong = [
            (
                Malformed::Decisions { got: 1, hits: 2 },
                "peer answered 1 decisions for 2 hits",
            ),
            (
                Malformed::Grants { got: 0, asks: 3 },
                "peer answered 0 grants for 3 asks",
            ),
            (
                Malformed::Parts {
                    answered: vec![1],
                    asked: vec![2],
                },
                "peer answered parts for [1] holders, asked for [2]",
            ),
        ];
        for (m, message) in wrong {
            assert_eq!(PeerError::Malformed(m).to_string(), message);
        }
    }

    #[test]
    fn a_status_the_transport_made_is_unreachable_and_keeps_its_source() {
        let transport: Box<dyn std::error::Error + Send + Sync> =
            Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let status = tonic::Status::from_error(transport);
        let e = PeerError::from_status(Call::Apply, status);
        assert!(matches!(e, PeerError::Unreachable { .. }), "{e:?}");
        let status = std::error::Error::source(&e).expect("the status");
        let io = status.source().expect("the transport error");
        assert!(io.downcast_ref::<std::io::Error>().is_some());

        let answered = PeerError::from_status(Call::Apply, tonic::Status::unavailable("full"));
        assert!(matches!(
            answered,
            PeerError::Refused { code: tonic::Code::Unavailable, ref message, .. } if message == "full"
        ));
    }
}
