//! HTTP request bodies, read whole up to SLUICE_MAX_REQUEST_BYTES: the one place an HTTP adapter
//! reads a body (`/json`, `POST /debug/explain`).

use axum::body::{Body, Bytes};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::bad_request::{BadRequest, Kind};

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("request body is larger than {max_bytes} bytes (SLUICE_MAX_REQUEST_BYTES)")]
    TooLarge { max_bytes: usize },
    #[error("request body could not be read: {0}")]
    Unreadable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<BodyError> for BadRequest {
    fn from(e: BodyError) -> Self {
        let kind = match e {
            BodyError::TooLarge { .. } => Kind::BodyTooLarge,
            BodyError::Unreadable(_) => Kind::BodyUnreadable,
        };
        BadRequest::new(kind, e)
    }
}

/// The whole of `body`, refused once it passes `max_bytes` (SLUICE_MAX_REQUEST_BYTES): at most
/// that much and one more chunk is ever held.
pub(crate) async fn read(body: Body, max_bytes: usize) -> Result<Bytes, BadRequest> {
    match Limited::new(body, max_bytes).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge { max_bytes }.into()),
        Err(e) => Err(BodyError::Unreadable(e).into()),
    }
}

/// A test's look at an answer: its status and its body as text.
#[cfg(test)]
pub(crate) async fn answer(response: axum::response::Response) -> (axum::http::StatusCode, String) {
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("an in-memory body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    fn failing_body() -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"{\"dom")),
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "peer reset",
            )),
        ];
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn reads_a_body_up_to_the_cap() {
        let bytes = read(Body::from("0123456789"), 10).await.unwrap();
        assert_eq!(&bytes[..], b"0123456789");
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_too_large() {
        let e = read(Body::from("0123456789a"), 10).await.unwrap_err();
        assert_eq!(e.kind(), Kind::BodyTooLarge);
        assert_eq!(
            e.to_string(),
            "request body is larger than 10 bytes (SLUICE_MAX_REQUEST_BYTES)"
        );
        let cause = e.source().unwrap().downcast_ref::<BodyError>();
        assert!(matches!(cause, Some(BodyError::TooLarge { max_bytes: 10 })));
    }

    #[tokio::test]
    async fn a_body_that_breaks_off_is_unreadable_not_too_large() {
        let e = read(failing_body(), 1024).await.unwrap_err();
        assert_eq!(e.kind(), Kind::BodyUnreadable);
        assert!(
            e.to_string()
                .starts_with("request body could not be read: "),
            "{e}"
        );
        assert!(e.to_string().contains("peer reset"), "{e}");
    }
}
