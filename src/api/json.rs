//! TEMPORARY STUB (replaced by the json branch).
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
#[derive(Debug, thiserror::Error)]
#[error("stub")]
pub struct JsonError;
pub fn decode_request(_body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    Err(JsonError)
}
pub fn encode_response(_resp: &RateLimitResponse) -> String {
    String::new()
}
