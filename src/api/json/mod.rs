//! The proto3-JSON codec behind the HTTP `/json` endpoint: `RateLimitRequest` in, `RateLimitResponse` out.
//!
//! envoyproxy/ratelimit decodes and encodes `/json` with Go's `protojson`, so clients send and
//! expect the canonical proto3 JSON mapping. This module reproduces that mapping for the two
//! messages involved, without a descriptor-driven reflection library:
//!
//! - **Decode** ([`decode_request`]) parses the body into a small JSON tree that keeps every object
//!   member in order (so a field given twice, even once as `hitsAddend` and once as `hits_addend`,
//!   is caught, as `protojson` does), then walks the tree into the prost structs. Field names are
//!   accepted in lowerCamelCase or as written in the `.proto`; unknown fields are an error; `null`
//!   means the field's default; integers may be JSON numbers or decimal strings; enums may be names
//!   or integers. Every error names the path of the offending value.
//! - **Encode** ([`encode_response`]) serializes through `serde_json` (for correct escaping) with
//!   hand-written `Serialize` impls that emit fields in `.proto` declaration order, omit zero values,
//!   and write enums as names, durations as `"1.500s"`, timestamps as RFC 3339, bytes as base64 and
//!   `google.protobuf.Struct` as a plain JSON object.
//!
//! The parts: `tree` (the JSON value that keeps duplicate members, and the path errors name),
//! `number` (numbers as written, and the exact integer one denotes),
//! `decode` (tree -> prost), `encode` (prost -> JSON text) and `wkt` (Duration, Timestamp and
//! base64 as protojson writes them). Reading the body is [`super::body`]'s.

mod decode;
mod encode;
mod number;
mod tree;
mod wkt;

pub use encode::encode_response;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::bad_request::BadRequest;
use crate::descriptor::Request;

/// Why a `/json` request body could not be decoded. Every variant but [`JsonError::Syntax`] carries
/// the path of the offending value, e.g. `descriptors[1].entries[0].key`.
///
/// All of them are permanent and the client's doing: retrying the same body cannot succeed, and
/// `/json` answers them with 400 `Bad Request`.
#[derive(thiserror::Error, Debug)]
pub enum JsonError {
    #[error("request body is not valid JSON: {0}")]
    Syntax(serde_json::Error),
    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{path}: unknown field {field:?}")]
    UnknownField { path: String, field: String },
    #[error("{path}: duplicate field {field:?} (already given as {first:?})")]
    DuplicateField {
        path: String,
        field: String,
        first: &'static str,
    },
    #[error("{path}: {value} is out of range for {ty}")]
    OutOfRange {
        path: String,
        value: String,
        ty: &'static str,
    },
    #[error("{path}: {value} is not an integer")]
    NotAnInteger { path: String, value: String },
    #[error("{path}: {value:?} is not a number")]
    NotANumber { path: String, value: String },
    #[error("{path}: {value:?} is not a {ty} value")]
    UnknownEnumValue {
        path: String,
        value: String,
        ty: &'static str,
    },
}

impl From<JsonError> for BadRequest {
    fn from(e: JsonError) -> Self {
        BadRequest::invalid(e)
    }
}

/// Decodes a `/json` request body (proto3 JSON) into a `RateLimitRequest`.
pub fn decode_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let json = tree::parse(body).map_err(JsonError::Syntax)?;
    decode::request(json, &tree::Path::Root)
}

/// A `/json` body as the service's request: decoded, then checked as a gRPC request is
/// ([`super::convert::request_from_proto`]). The error says what is wrong and where.
pub fn request(body: &[u8]) -> Result<Request, BadRequest> {
    let proto = decode_request(body)?;
    Ok(super::convert::request_from_proto(proto)?)
}

#[cfg(test)]
mod tests;
