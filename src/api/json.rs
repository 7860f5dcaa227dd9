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

use std::fmt;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::quota::ExpirationSpecifier;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, Quota, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration, Struct, Timestamp, UInt64Value, Value};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

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

/// Decodes a `/json` request body (proto3 JSON) into a `RateLimitRequest`.
pub fn decode_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    // serde_json bounds nesting (128 levels), so hostile input cannot exhaust the stack here or
    // when the tree is dropped.
    let json: Json = serde_json::from_slice(body).map_err(JsonError::Syntax)?;
    request(json, &Path::Root)
}

/// Encodes a `RateLimitResponse` as proto3 JSON, as `protojson.Marshal` would (compact form).
/// A `/json` request body read whole, at most `max_bytes` (SLUICE_MAX_REQUEST_BYTES), as the
/// service's request ([`request_from_json`]): `/json` and `POST /debug/explain`.
pub async fn read_request(
    body: axum::body::Body,
    max_bytes: usize,
) -> Result<crate::descriptor::Request, String> {
    let bytes = axum::body::to_bytes(body, max_bytes).await.map_err(|_| {
        format!(
            "request body is larger than {max_bytes} bytes (SLUICE_MAX_REQUEST_BYTES) or could not be read"
        )
    })?;
    request_from_json(&bytes)
}

/// A `/json` body as the service's request: decoded, then checked as a gRPC request is. The
/// error says what is wrong and where.
pub fn request_from_json(body: &[u8]) -> Result<crate::descriptor::Request, String> {
    let proto = decode_request(body).map_err(|e| e.to_string())?;
    super::convert::request_from_proto(proto).map_err(|e| e.to_string())
}

pub fn encode_response(resp: &RateLimitResponse) -> String {
    // Serializing into memory can only fail on non-string map keys or a custom error, and the
    // impls below produce neither. Should that ever change, answer with an UNKNOWN overall code
    // (which `/json` maps to 500) rather than panic in a request handler.
    serde_json::to_string(&J(resp)).unwrap_or_else(|_| String::from(r#"{"overallCode":"UNKNOWN"}"#))
}

// ---------------------------------------------------------------------------------------------
// Decoding: body -> Json tree -> prost structs.
// ---------------------------------------------------------------------------------------------

/// A parsed JSON value. Unlike `serde_json::Value`, objects keep every member in order, duplicates
/// included, because proto3 JSON must reject a field given twice.
#[derive(Debug)]
enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// A JSON number as serde_json reports it: integers exactly when they fit 64 bits, else a double.
#[derive(Clone, Copy, Debug)]
enum Number {
    U(u64),
    I(i64),
    F(f64),
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::U(n) => write!(f, "{n}"),
            Number::I(n) => write!(f, "{n}"),
            // Debug switches to exponent notation for huge or tiny values, keeping messages short.
            Number::F(n) => write!(f, "{n:?}"),
        }
    }
}

impl Json {
    /// How an error message names the kind of value that was found.
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(Number::U(n)))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(Number::I(n)))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
        Ok(Json::Number(Number::F(n)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_owned()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, Json>()? {
            members.push(member);
        }
        Ok(Json::Object(members))
    }
}

/// Where a value sits in the request, rendered only when an error needs it (so the happy path
/// allocates nothing for paths).
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("request"),
            Path::Field(Path::Root, name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

fn wrong_type(path: &Path<'_>, expected: &'static str, found: &Json) -> JsonError {
    JsonError::WrongType {
        path: path.to_string(),
        expected,
        found: found.kind(),
    }
}

/// One field of a message: its JSON (lowerCamelCase) name, its `.proto` name, and a tag to match on.
type Field<T> = (&'static str, &'static str, T);

/// Walks an object's members, resolving each name to one of `fields` and handing the value to `set`.
/// Unknown and repeated fields are errors; `null` members are skipped, since in proto3 JSON a
/// `null` means "the default" for every field of these messages (none is a `google.protobuf.Value`).
fn for_each_field<T: Copy, const N: usize>(
    json: Json,
    path: &Path<'_>,
    fields: &[Field<T>; N],
    mut set: impl FnMut(T, Json, &Path<'_>) -> Result<(), JsonError>,
) -> Result<(), JsonError> {
    let Json::Object(members) = json else {
        return Err(wrong_type(path, "an object", &json));
    };
    let mut seen: [Option<&'static str>; N] = [None; N];
    for (name, value) in members {
        let Some(i) = fields
            .iter()
            .position(|&(json_name, proto_name, _)| name == json_name || name == proto_name)
        else {
            return Err(JsonError::UnknownField {
                path: path.to_string(),
                field: name,
            });
        };
        if let Some(first) = seen[i] {
            return Err(JsonError::DuplicateField {
                path: path.to_string(),
                field: name,
                first,
            });
        }
        let (json_name, proto_name, tag) = fields[i];
        seen[i] = Some(if name == json_name {
            json_name
        } else {
            proto_name
        });
        if matches!(value, Json::Null) {
            continue;
        }
        set(tag, value, &Path::Field(path, &name))?;
    }
    Ok(())
}

fn list<T>(
    json: Json,
    path: &Path<'_>,
    item: impl Fn(Json, &Path<'_>) -> Result<T, JsonError>,
) -> Result<Vec<T>, JsonError> {
    let Json::Array(items) = json else {
        return Err(wrong_type(path, "an array", &json));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, json)| item(json, &Path::Index(path, i)))
        .collect()
}

fn string(json: Json, path: &Path<'_>) -> Result<String, JsonError> {
    match json {
        Json::String(s) => Ok(s),
        other => Err(wrong_type(path, "a string", &other)),
    }
}

fn boolean(json: Json, path: &Path<'_>) -> Result<bool, JsonError> {
    match json {
        Json::Bool(b) => Ok(b),
        other => Err(wrong_type(path, "a boolean", &other)),
    }
}

/// An integer field of type `ty` whose values lie in `min..=max`. As in `protojson`, the value may
/// be a JSON number or a string holding one, and an exponent or fraction is fine if the value is
/// integral (`1e2`, `"100.0"`).
fn integer(
    json: Json,
    path: &Path<'_>,
    ty: &'static str,
    min: i128,
    max: i128,
) -> Result<i128, JsonError> {
    let number = match json {
        Json::Number(n) => n,
        Json::String(s) => match number_in_string(&s) {
            Some(n) => n,
            None => {
                return Err(JsonError::NotANumber {
                    path: path.to_string(),
                    value: s,
                });
            }
        },
        other => return Err(wrong_type(path, "an integer (number or string)", &other)),
    };
    let value = match number {
        Number::U(n) => i128::from(n),
        Number::I(n) => i128::from(n),
        Number::F(f) if f.fract() != 0.0 => {
            return Err(JsonError::NotAnInteger {
                path: path.to_string(),
                value: number.to_string(),
            });
        }
        // `as` saturates, and a saturated value fails the range check below.
        Number::F(f) => f as i128,
    };
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(JsonError::OutOfRange {
            path: path.to_string(),
            value: number.to_string(),
            ty,
        })
    }
}

/// The number written in a string, with the JSON number grammar (so no `+1`, `0x1`, ` 1`).
fn number_in_string(s: &str) -> Option<Number> {
    if !s.starts_with(|c: char| c == '-' || c.is_ascii_digit())
        || !s.ends_with(|c: char| c.is_ascii_digit())
    {
        // Also rules out surrounding whitespace, which serde_json would otherwise skip.
        return None;
    }
    match serde_json::from_str::<Json>(s) {
        Ok(Json::Number(n)) => Some(n),
        _ => None,
    }
}

fn uint32(json: Json, path: &Path<'_>) -> Result<u32, JsonError> {
    let n = integer(json, path, "uint32", 0, i128::from(u32::MAX))?;
    // In range by construction; the fallback is never taken.
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

fn uint64(json: Json, path: &Path<'_>) -> Result<u64, JsonError> {
    let n = integer(json, path, "uint64", 0, i128::from(u64::MAX))?;
    Ok(u64::try_from(n).unwrap_or(u64::MAX))
}

/// An enum field: its value name, or any int32 (proto3 enums are open, so unnamed numbers are kept).
fn enumeration(
    json: Json,
    path: &Path<'_>,
    ty: &'static str,
    from_name: fn(&str) -> Option<i32>,
) -> Result<i32, JsonError> {
    match json {
        Json::String(name) => from_name(&name).ok_or_else(|| JsonError::UnknownEnumValue {
            path: path.to_string(),
            value: name,
            ty,
        }),
        Json::Number(_) => {
            let n = integer(json, path, ty, i128::from(i32::MIN), i128::from(i32::MAX))?;
            Ok(i32::try_from(n).unwrap_or_default())
        }
        other => Err(wrong_type(path, "an enum name or integer", &other)),
    }
}

#[derive(Clone, Copy)]
enum RequestField {
    Domain,
    Descriptors,
    HitsAddend,
}

const REQUEST_FIELDS: [Field<RequestField>; 3] = [
    ("domain", "domain", RequestField::Domain),
    ("descriptors", "descriptors", RequestField::Descriptors),
    ("hitsAddend", "hits_addend", RequestField::HitsAddend),
];

fn request(json: Json, path: &Path<'_>) -> Result<RateLimitRequest, JsonError> {
    let mut req = RateLimitRequest::default();
    for_each_field(json, path, &REQUEST_FIELDS, |field, value, path| {
        match field {
            RequestField::Domain => req.domain = string(value, path)?,
            RequestField::Descriptors => req.descriptors = list(value, path, descriptor)?,
            RequestField::HitsAddend => req.hits_addend = uint32(value, path)?,
        }
        Ok(())
    })?;
    Ok(req)
}

#[derive(Clone, Copy)]
enum DescriptorField {
    Entries,
    Limit,
    HitsAddend,
    IsNegativeHits,
}

const DESCRIPTOR_FIELDS: [Field<DescriptorField>; 4] = [
    ("entries", "entries", DescriptorField::Entries),
    ("limit", "limit", DescriptorField::Limit),
    ("hitsAddend", "hits_addend", DescriptorField::HitsAddend),
    (
        "isNegativeHits",
        "is_negative_hits",
        DescriptorField::IsNegativeHits,
    ),
];

fn descriptor(json: Json, path: &Path<'_>) -> Result<RateLimitDescriptor, JsonError> {
    let mut desc = RateLimitDescriptor::default();
    for_each_field(json, path, &DESCRIPTOR_FIELDS, |field, value, path| {
        match field {
            DescriptorField::Entries => desc.entries = list(value, path, entry)?,
            DescriptorField::Limit => desc.limit = Some(limit_override(value, path)?),
            // A wrapper type: the bare uint64 stands for the message, and presence matters (an
            // explicit 0 is a peek), so only `null` leaves it unset.
            DescriptorField::HitsAddend => {
                desc.hits_addend = Some(UInt64Value {
                    value: uint64(value, path)?,
                })
            }
            DescriptorField::IsNegativeHits => desc.is_negative_hits = boolean(value, path)?,
        }
        Ok(())
    })?;
    Ok(desc)
}

#[derive(Clone, Copy)]
enum EntryField {
    Key,
    Value,
}

const ENTRY_FIELDS: [Field<EntryField>; 2] = [
    ("key", "key", EntryField::Key),
    ("value", "value", EntryField::Value),
];

fn entry(json: Json, path: &Path<'_>) -> Result<Entry, JsonError> {
    let mut entry = Entry::default();
    for_each_field(json, path, &ENTRY_FIELDS, |field, value, path| {
        match field {
            EntryField::Key => entry.key = string(value, path)?,
            EntryField::Value => entry.value = string(value, path)?,
        }
        Ok(())
    })?;
    Ok(entry)
}

#[derive(Clone, Copy)]
enum OverrideField {
    RequestsPerUnit,
    Unit,
}

const OVERRIDE_FIELDS: [Field<OverrideField>; 2] = [
    (
        "requestsPerUnit",
        "requests_per_unit",
        OverrideField::RequestsPerUnit,
    ),
    ("unit", "unit", OverrideField::Unit),
];

fn limit_override(json: Json, path: &Path<'_>) -> Result<RateLimitOverride, JsonError> {
    let mut limit = RateLimitOverride::default();
    for_each_field(json, path, &OVERRIDE_FIELDS, |field, value, path| {
        match field {
            OverrideField::RequestsPerUnit => limit.requests_per_unit = uint32(value, path)?,
            // The override uses `envoy.type.v3.RateLimitUnit`, which has no WEEK (unlike the
            // response's unit), so "WEEK" is rejected here exactly as protojson would.
            OverrideField::Unit => {
                limit.unit = enumeration(value, path, "envoy.type.v3.RateLimitUnit", |name| {
                    RateLimitUnit::from_str_name(name).map(|u| u as i32)
                })?
            }
        }
        Ok(())
    })?;
    Ok(limit)
}

// ---------------------------------------------------------------------------------------------
// Encoding: prost structs -> serde_json, through borrowed views.
// ---------------------------------------------------------------------------------------------

/// A borrowed view of a prost message that serializes as its proto3 JSON form.
struct J<'a, T>(&'a T);

/// A repeated field.
impl<T> Serialize for J<'_, Vec<T>>
where
    for<'a> J<'a, T>: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&J(item))?;
        }
        seq.end()
    }
}

/// An enum value: its name when known, else the bare number (proto3 enums are open).
struct EnumJson(i32, Option<&'static str>);

impl Serialize for EnumJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.1 {
            Some(name) => s.serialize_str(name),
            None => s.serialize_i32(self.0),
        }
    }
}

fn code(n: i32) -> EnumJson {
    EnumJson(n, Code::try_from(n).ok().map(|c| c.as_str_name()))
}

fn unit(n: i32) -> EnumJson {
    EnumJson(n, Unit::try_from(n).ok().map(|u| u.as_str_name()))
}

/// A `bytes` field: standard base64 with padding, as `protojson` writes it.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64(self.0))
    }
}

fn base64(bytes: &[u8]) -> String {
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

impl Serialize for J<'_, RateLimitResponse> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        if r.overall_code != 0 {
            m.serialize_entry("overallCode", &code(r.overall_code))?;
        }
        if !r.statuses.is_empty() {
            m.serialize_entry("statuses", &J(&r.statuses))?;
        }
        if !r.response_headers_to_add.is_empty() {
            m.serialize_entry("responseHeadersToAdd", &J(&r.response_headers_to_add))?;
        }
        if !r.request_headers_to_add.is_empty() {
            m.serialize_entry("requestHeadersToAdd", &J(&r.request_headers_to_add))?;
        }
        if !r.raw_body.is_empty() {
            m.serialize_entry("rawBody", &Base64(&r.raw_body))?;
        }
        if let Some(metadata) = &r.dynamic_metadata {
            m.serialize_entry("dynamicMetadata", &J(metadata))?;
        }
        if let Some(quota) = &r.quota {
            m.serialize_entry("quota", &J(quota))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, DescriptorStatus> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        let mut m = s.serialize_map(None)?;
        if d.code != 0 {
            m.serialize_entry("code", &code(d.code))?;
        }
        if let Some(limit) = &d.current_limit {
            m.serialize_entry("currentLimit", &J(limit))?;
        }
        if d.limit_remaining != 0 {
            m.serialize_entry("limitRemaining", &d.limit_remaining)?;
        }
        if let Some(duration) = &d.duration_until_reset {
            m.serialize_entry("durationUntilReset", &J(duration))?;
        }
        if let Some(quota) = &d.quota {
            m.serialize_entry("quota", &J(quota))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, RateLimit> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let l = self.0;
        let mut m = s.serialize_map(None)?;
        // `name` is field 3 but declared first in the .proto, and protojson writes fields in
        // declaration order.
        if !l.name.is_empty() {
            m.serialize_entry("name", &l.name)?;
        }
        if l.requests_per_unit != 0 {
            m.serialize_entry("requestsPerUnit", &l.requests_per_unit)?;
        }
        if l.unit != 0 {
            m.serialize_entry("unit", &unit(l.unit))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, Quota> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let q = self.0;
        let mut m = s.serialize_map(None)?;
        if q.requests != 0 {
            m.serialize_entry("requests", &q.requests)?;
        }
        // A oneof member is written whenever it is set, even to its zero value.
        if let Some(ExpirationSpecifier::ValidUntil(ts)) = &q.expiration_specifier {
            m.serialize_entry("validUntil", &J(ts))?;
        }
        if !q.id.is_empty() {
            m.serialize_entry("id", &q.id)?;
        }
        m.end()
    }
}

impl Serialize for J<'_, HeaderValue> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let h = self.0;
        let mut m = s.serialize_map(None)?;
        if !h.key.is_empty() {
            m.serialize_entry("key", &h.key)?;
        }
        if !h.value.is_empty() {
            m.serialize_entry("value", &h.value)?;
        }
        if !h.raw_value.is_empty() {
            m.serialize_entry("rawValue", &Base64(&h.raw_value))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, Struct> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The fields live in a HashMap; sort them, as protojson does, so output is deterministic.
        let mut fields: Vec<_> = self.0.fields.iter().collect();
        fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut m = s.serialize_map(Some(fields.len()))?;
        for (key, value) in fields {
            m.serialize_entry(key, &J(value))?;
        }
        m.end()
    }
}

impl Serialize for J<'_, Value> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0.kind {
            // protojson refuses to marshal a Value with no kind; null is the closest valid JSON.
            None | Some(Kind::NullValue(_)) => s.serialize_unit(),
            Some(Kind::NumberValue(n)) => serialize_number(*n, s),
            Some(Kind::StringValue(v)) => s.serialize_str(v),
            Some(Kind::BoolValue(b)) => s.serialize_bool(*b),
            Some(Kind::StructValue(v)) => J(v).serialize(s),
            Some(Kind::ListValue(list)) => J(&list.values).serialize(s),
        }
    }
}

/// A `google.protobuf.Value` number. Go writes integral doubles below 1e21 without a fraction
/// (`5`, not serde_json's `5.0`), and counters in dynamic metadata are exactly such numbers, so
/// write those as integers. NaN and infinities (which protojson refuses) come out as null.
fn serialize_number<S: Serializer>(n: f64, s: S) -> Result<S::Ok, S::Error> {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e21 {
        // Exact: an integral double below 1e21 < 2^70 fits an i128.
        s.serialize_i128(n as i128)
    } else {
        s.serialize_f64(n)
    }
}

/// The limits of `google.protobuf.Duration`: ±10,000 years.
const MAX_DURATION_SECONDS: i128 = 315_576_000_000;
/// The limits of `google.protobuf.Timestamp`: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
const MIN_TIMESTAMP_SECONDS: i128 = -62_135_596_800;
const MAX_TIMESTAMP_SECONDS: i128 = 253_402_300_799;
const NANOS_PER_SECOND: i128 = 1_000_000_000;

impl Serialize for J<'_, Duration> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

/// `"58s"`, `"1.500s"`, `"-0.000001s"`: 0, 3, 6 or 9 fractional digits, as protojson writes them.
///
/// protojson errors on a duration outside ±10,000 years or with `seconds` and `nanos` of opposite
/// signs; encoding cannot fail here, so the total is normalized and clamped to that range instead.
fn format_duration(d: &Duration) -> String {
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

impl Serialize for J<'_, Timestamp> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_timestamp(self.0))
    }
}

/// RFC 3339 in UTC, e.g. `"2017-01-15T01:30:15.010Z"`, clamped (rather than failing, as protojson
/// would) to the years 0001..=9999 that the format can express.
fn format_timestamp(t: &Timestamp) -> String {
    let total = (i128::from(t.seconds) * NANOS_PER_SECOND + i128::from(t.nanos)).clamp(
        MIN_TIMESTAMP_SECONDS * NANOS_PER_SECOND,
        (MAX_TIMESTAMP_SECONDS + 1) * NANOS_PER_SECOND - 1,
    );
    let (seconds, nanos) = (
        total.div_euclid(NANOS_PER_SECOND),
        total.rem_euclid(NANOS_PER_SECOND),
    );
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}{}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        fraction(nanos),
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i128) -> (i128, i128, i128) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i128::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::google::protobuf::ListValue;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    fn error(body: &str) -> String {
        match decode_request(body.as_bytes()) {
            Ok(req) => panic!("{body} decoded to {req:?}, expected an error"),
            Err(e) => e.to_string(),
        }
    }

    // ---- encode ----

    #[test]
    fn encodes_the_documented_example_byte_for_byte() {
        let resp = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 50,
                    unit: Unit::Second as i32,
                }),
                limit_remaining: 49,
                duration_until_reset: Some(Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                quota: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            encode_response(&resp),
            r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":50,"unit":"SECOND"},"limitRemaining":49,"durationUntilReset":"1s"}]}"#
        );
    }

    #[test]
    fn encodes_an_empty_response_as_an_empty_object() {
        assert_eq!(encode_response(&RateLimitResponse::default()), "{}");
        // A status with every field at its zero value still occupies its slot in the list.
        let resp = RateLimitResponse {
            statuses: vec![DescriptorStatus::default()],
            ..Default::default()
        };
        assert_eq!(encode_response(&resp), r#"{"statuses":[{}]}"#);
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one end-to-end scenario, step by step; to split next"
    )]
    fn encodes_every_response_field() {
        let metadata = Struct {
            fields: HashMap::from([
                (
                    "domain".to_string(),
                    Value {
                        kind: Some(Kind::StringValue("rl".into())),
                    },
                ),
                (
                    "hitsAddend".to_string(),
                    Value {
                        kind: Some(Kind::NumberValue(3.0)),
                    },
                ),
                (
                    "ratio".to_string(),
                    Value {
                        kind: Some(Kind::NumberValue(0.25)),
                    },
                ),
                (
                    "nan".to_string(),
                    Value {
                        kind: Some(Kind::NumberValue(f64::NAN)),
                    },
                ),
                ("none".to_string(), Value { kind: None }),
                (
                    "null".to_string(),
                    Value {
                        kind: Some(Kind::NullValue(0)),
                    },
                ),
                (
                    "on".to_string(),
                    Value {
                        kind: Some(Kind::BoolValue(true)),
                    },
                ),
                (
                    "descriptors".to_string(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: vec![Value {
                                kind: Some(Kind::StructValue(Struct {
                                    fields: HashMap::from([(
                                        "entries".to_string(),
                                        Value {
                                            kind: Some(Kind::ListValue(ListValue {
                                                values: vec![Value {
                                                    kind: Some(Kind::StringValue("k=v".into())),
                                                }],
                                            })),
                                        },
                                    )]),
                                })),
                            }],
                        })),
                    },
                ),
            ]),
        };
        let quota = Quota {
            requests: 10,
            id: "q1".into(),
            expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
                seconds: 1_484_443_815,
                nanos: 10_000_000,
            })),
        };
        let resp = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(RateLimit {
                        name: "per \"user\"\n".into(),
                        requests_per_unit: 10,
                        unit: Unit::Week as i32,
                    }),
                    limit_remaining: 0,
                    duration_until_reset: Some(Duration {
                        seconds: 58,
                        nanos: 500_000_000,
                    }),
                    quota: Some(quota.clone()),
                },
                DescriptorStatus {
                    code: 9,
                    current_limit: Some(RateLimit {
                        unit: 42,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            response_headers_to_add: vec![HeaderValue {
                key: "RateLimit-Limit".into(),
                value: "10".into(),
                raw_value: vec![],
            }],
            request_headers_to_add: vec![HeaderValue {
                key: "x-raw".into(),
                value: String::new(),
                raw_value: b"\xff\x00ab".to_vec(),
            }],
            raw_body: b"over".to_vec(),
            dynamic_metadata: Some(metadata),
            quota: Some(quota),
        };
        assert_eq!(
            encode_response(&resp),
            concat!(
                r#"{"overallCode":"OVER_LIMIT","statuses":["#,
                r#"{"code":"OVER_LIMIT","currentLimit":{"name":"per \"user\"\n","requestsPerUnit":10,"unit":"WEEK"},"#,
                r#""durationUntilReset":"58.500s","quota":{"requests":10,"validUntil":"2017-01-15T01:30:15.010Z","id":"q1"}},"#,
                r#"{"code":9,"currentLimit":{"unit":42}}],"#,
                r#""responseHeadersToAdd":[{"key":"RateLimit-Limit","value":"10"}],"#,
                r#""requestHeadersToAdd":[{"key":"x-raw","rawValue":"/wBhYg=="}],"#,
                r#""rawBody":"b3Zlcg==","#,
                r#""dynamicMetadata":{"descriptors":[{"entries":["k=v"]}],"domain":"rl","hitsAddend":3,"nan":null,"none":null,"null":null,"on":true,"ratio":0.25},"#,
                r#""quota":{"requests":10,"validUntil":"2017-01-15T01:30:15.010Z","id":"q1"}}"#,
            )
        );
    }

    #[test]
    fn escapes_control_characters_and_non_ascii() {
        let resp = RateLimitResponse {
            response_headers_to_add: vec![HeaderValue {
                key: "k\u{1}\t\\".into(),
                value: "é\u{2028}😀".into(),
                raw_value: vec![],
            }],
            ..Default::default()
        };
        let out = encode_response(&resp);
        assert_eq!(
            out,
            "{\"responseHeadersToAdd\":[{\"key\":\"k\\u0001\\t\\\\\",\"value\":\"é\u{2028}😀\"}]}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(parsed["responseHeadersToAdd"][0]["key"], "k\u{1}\t\\");
    }

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

    #[test]
    fn writes_integral_metadata_numbers_without_a_fraction() {
        let number = |n: f64| {
            serde_json::to_string(&J(&Value {
                kind: Some(Kind::NumberValue(n)),
            }))
            .unwrap()
        };
        assert_eq!(number(5.0), "5");
        assert_eq!(number(-5.0), "-5");
        assert_eq!(number(1e20), "100000000000000000000");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(f64::INFINITY), "null");
        assert_eq!(serde_json::from_str::<f64>(&number(1e21)).unwrap(), 1e21);
    }

    // ---- decode ----

    fn sample_request() -> RateLimitRequest {
        RateLimitRequest {
            domain: "envoy".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![entry("remote_address", "10.0.0.1"), entry("path", "/")],
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 42,
                        unit: RateLimitUnit::Hour as i32,
                    }),
                    hits_addend: Some(UInt64Value { value: 0 }),
                    is_negative_hits: true,
                },
                RateLimitDescriptor {
                    entries: vec![entry("k", "")],
                    ..Default::default()
                },
            ],
            hits_addend: 3,
        }
    }

    #[test]
    fn decodes_lower_camel_case_names() {
        let body = r#"{
            "domain": "envoy",
            "descriptors": [
                {
                    "entries": [{"key": "remote_address", "value": "10.0.0.1"}, {"key": "path", "value": "/"}],
                    "limit": {"requestsPerUnit": 42, "unit": "HOUR"},
                    "hitsAddend": 0,
                    "isNegativeHits": true
                },
                {"entries": [{"key": "k"}]}
            ],
            "hitsAddend": 3
        }"#;
        assert_eq!(decode_request(body.as_bytes()).unwrap(), sample_request());
    }

    #[test]
    fn decodes_proto_names_strings_for_integers_and_numbers_for_enums() {
        let body = r#"{
            "domain": "envoy",
            "descriptors": [
                {
                    "entries": [{"key": "remote_address", "value": "10.0.0.1"}, {"key": "path", "value": "/"}],
                    "limit": {"requests_per_unit": "42", "unit": 3},
                    "hits_addend": "0",
                    "is_negative_hits": true
                },
                {"entries": [{"key": "k", "value": ""}], "limit": null, "hits_addend": null}
            ],
            "hits_addend": "3"
        }"#;
        assert_eq!(decode_request(body.as_bytes()).unwrap(), sample_request());
    }

    #[test]
    fn null_means_default_everywhere() {
        let body = r#"{"domain":null,"descriptors":null,"hitsAddend":null}"#;
        assert_eq!(
            decode_request(body.as_bytes()).unwrap(),
            RateLimitRequest::default()
        );
        let body = r#"{"descriptors":[{"entries":[{"key":null,"value":null}],"isNegativeHits":null,"limit":{"unit":null}}]}"#;
        let want = RateLimitRequest {
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry::default()],
                limit: Some(RateLimitOverride::default()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(decode_request(body.as_bytes()).unwrap(), want);
        assert_eq!(decode_request(b"{}").unwrap(), RateLimitRequest::default());
    }

    #[test]
    fn accepts_integral_numbers_in_any_json_form() {
        let hits = |v: &str| {
            decode_request(format!(r#"{{"hitsAddend":{v}}}"#).as_bytes())
                .map(|r| r.hits_addend)
                .map_err(|e| e.to_string())
        };
        assert_eq!(hits("4294967295"), Ok(u32::MAX));
        assert_eq!(hits("1e2"), Ok(100));
        assert_eq!(hits("100.0"), Ok(100));
        assert_eq!(hits("\"1e2\""), Ok(100));
        assert_eq!(hits("-0"), Ok(0));
        let addend = |v: &str| {
            decode_request(format!(r#"{{"descriptors":[{{"hitsAddend":{v}}}]}}"#).as_bytes())
                .map(|r| r.descriptors[0].hits_addend.map(|w| w.value))
                .map_err(|e| e.to_string())
        };
        assert_eq!(addend("18446744073709551615"), Ok(Some(u64::MAX)));
        assert_eq!(addend("\"18446744073709551615\""), Ok(Some(u64::MAX)));
        assert_eq!(addend("7"), Ok(Some(7)));
        assert_eq!(addend("null"), Ok(None));
        // Exactly, up to 2^53: serde_json's default float parsing rounds twice and made these
        // 9007199254740990 (found by tests/fuzz), hence its float_roundtrip feature.
        assert_eq!(addend("9007199254740991.0"), Ok(Some((1 << 53) - 1)));
        assert_eq!(addend("\"9007199254740991.0\""), Ok(Some((1 << 53) - 1)));
        assert_eq!(addend("90071992547409.91e2"), Ok(Some((1 << 53) - 1)));
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one end-to-end scenario, step by step; to split next"
    )]
    fn every_error_names_its_path() {
        let cases = [
            // Not JSON, or not an object.
            (
                "",
                "request body is not valid JSON: EOF while parsing a value at line 1 column 0",
            ),
            (
                "{",
                "request body is not valid JSON: EOF while parsing an object at line 1 column 1",
            ),
            (
                "{} {}",
                "request body is not valid JSON: trailing characters at line 1 column 4",
            ),
            (
                r#"{"domain":"\ud800x"}"#,
                "request body is not valid JSON: unexpected end of hex escape at line 1 column 18",
            ),
            ("null", "request: expected an object, found null"),
            ("[]", "request: expected an object, found an array"),
            // Unknown and duplicate fields.
            (r#"{"foo":1}"#, r#"request: unknown field "foo""#),
            (r#"{"Domain":"x"}"#, r#"request: unknown field "Domain""#),
            (
                r#"{"descriptors":[{"entries":[{"key":"k","val":"v"}]}]}"#,
                r#"descriptors[0].entries[0]: unknown field "val""#,
            ),
            (
                r#"{"domain":"a","domain":"b"}"#,
                r#"request: duplicate field "domain" (already given as "domain")"#,
            ),
            (
                r#"{"hitsAddend":1,"hits_addend":null}"#,
                r#"request: duplicate field "hits_addend" (already given as "hitsAddend")"#,
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":"SECOND","unit":"MINUTE"}}]}"#,
                r#"descriptors[0].limit: duplicate field "unit" (already given as "unit")"#,
            ),
            // Wrong types.
            (
                r#"{"domain":1}"#,
                "domain: expected a string, found a number",
            ),
            (
                r#"{"descriptors":{}}"#,
                "descriptors: expected an array, found an object",
            ),
            (
                r#"{"descriptors":[null]}"#,
                "descriptors[0]: expected an object, found null",
            ),
            (
                r#"{"descriptors":[{},{"entries":"k=v"}]}"#,
                "descriptors[1].entries: expected an array, found a string",
            ),
            (
                r#"{"descriptors":[{},{"entries":[{"key":false}]}]}"#,
                "descriptors[1].entries[0].key: expected a string, found a boolean",
            ),
            (
                r#"{"descriptors":[{"entries":[{"key":"k","value":["v"]}]}]}"#,
                "descriptors[0].entries[0].value: expected a string, found an array",
            ),
            (
                r#"{"descriptors":[{"isNegativeHits":"true"}]}"#,
                "descriptors[0].isNegativeHits: expected a boolean, found a string",
            ),
            (
                r#"{"descriptors":[{"limit":5}]}"#,
                "descriptors[0].limit: expected an object, found a number",
            ),
            (
                r#"{"hitsAddend":true}"#,
                "hitsAddend: expected an integer (number or string), found a boolean",
            ),
            (
                r#"{"descriptors":[{"hitsAddend":{"value":1}}]}"#,
                "descriptors[0].hitsAddend: expected an integer (number or string), found an object",
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":true}}]}"#,
                "descriptors[0].limit.unit: expected an enum name or integer, found a boolean",
            ),
            // Bad numbers.
            (
                r#"{"hitsAddend":-1}"#,
                "hitsAddend: -1 is out of range for uint32",
            ),
            (
                r#"{"hitsAddend":4294967296}"#,
                "hitsAddend: 4294967296 is out of range for uint32",
            ),
            (r#"{"hitsAddend":1.5}"#, "hitsAddend: 1.5 is not an integer"),
            (
                r#"{"hitsAddend":1e300}"#,
                "hitsAddend: 1e300 is out of range for uint32",
            ),
            (
                r#"{"hitsAddend":"-3"}"#,
                "hitsAddend: -3 is out of range for uint32",
            ),
            (
                r#"{"hitsAddend":"0.5"}"#,
                "hitsAddend: 0.5 is not an integer",
            ),
            (
                r#"{"hitsAddend":"abc"}"#,
                r#"hitsAddend: "abc" is not a number"#,
            ),
            (
                r#"{"hitsAddend":" 1"}"#,
                r#"hitsAddend: " 1" is not a number"#,
            ),
            (
                r#"{"hitsAddend":"+1"}"#,
                r#"hitsAddend: "+1" is not a number"#,
            ),
            (
                r#"{"hitsAddend":"0x10"}"#,
                r#"hitsAddend: "0x10" is not a number"#,
            ),
            (r#"{"hitsAddend":""}"#, r#"hitsAddend: "" is not a number"#),
            (
                r#"{"descriptors":[{"hits_addend":18446744073709551616}]}"#,
                "descriptors[0].hits_addend: 1.8446744073709552e19 is out of range for uint64",
            ),
            (
                r#"{"descriptors":[{"hitsAddend":"18446744073709551616"}]}"#,
                "descriptors[0].hitsAddend: 1.8446744073709552e19 is out of range for uint64",
            ),
            (
                r#"{"descriptors":[{"hitsAddend":-1}]}"#,
                "descriptors[0].hitsAddend: -1 is out of range for uint64",
            ),
            (
                r#"{"descriptors":[{"limit":{"requestsPerUnit":-5}}]}"#,
                "descriptors[0].limit.requestsPerUnit: -5 is out of range for uint32",
            ),
            // Enums.
            (
                r#"{"descriptors":[{"limit":{"unit":"second"}}]}"#,
                r#"descriptors[0].limit.unit: "second" is not a envoy.type.v3.RateLimitUnit value"#,
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":"WEEK"}}]}"#,
                r#"descriptors[0].limit.unit: "WEEK" is not a envoy.type.v3.RateLimitUnit value"#,
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":"1"}}]}"#,
                r#"descriptors[0].limit.unit: "1" is not a envoy.type.v3.RateLimitUnit value"#,
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":2147483648}}]}"#,
                "descriptors[0].limit.unit: 2147483648 is out of range for envoy.type.v3.RateLimitUnit",
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":1.5}}]}"#,
                "descriptors[0].limit.unit: 1.5 is not an integer",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(error(body), want, "body: {body}");
        }
    }

    #[test]
    fn keeps_unnamed_enum_numbers() {
        let req = decode_request(br#"{"descriptors":[{"limit":{"unit":-7}}]}"#).unwrap();
        assert_eq!(req.descriptors[0].limit.unwrap().unit, -7);
    }

    #[test]
    fn rejects_deep_nesting_without_overflowing_the_stack() {
        let body = format!(
            r#"{{"foo":{}{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(matches!(
            decode_request(body.as_bytes()),
            Err(JsonError::Syntax(_))
        ));
    }

    #[test]
    fn rejects_invalid_utf8() {
        assert!(matches!(
            decode_request(b"{\"domain\":\"\xff\"}"),
            Err(JsonError::Syntax(_))
        ));
    }

    // ---- properties ----

    /// A request's proto3 JSON, written the way a client might: with either spelling of field
    /// names, integers as numbers or strings, enums as names or numbers, and zero fields present
    /// or absent. (Sluice never encodes requests; this stands in for protojson.Marshal.)
    fn request_json(req: &RateLimitRequest, style: &Style) -> serde_json::Value {
        let name =
            |camel: &'static str, snake: &'static str| if style.snake { snake } else { camel };
        let int = |n: u64| {
            if style.strings {
                json!(n.to_string())
            } else {
                json!(n)
            }
        };
        let mut obj = serde_json::Map::new();
        if !req.domain.is_empty() || style.zeros {
            obj.insert("domain".into(), json!(req.domain));
        }
        if !req.descriptors.is_empty() || style.zeros {
            let descriptors = req.descriptors.iter().map(|d| {
                let mut o = serde_json::Map::new();
                let entries: Vec<_> = d.entries.iter().map(|e| json!({"key": e.key, "value": e.value})).collect();
                o.insert("entries".into(), json!(entries));
                if let Some(limit) = d.limit {
                    let unit = match RateLimitUnit::try_from(limit.unit) {
                        Ok(u) if !style.enum_numbers => json!(u.as_str_name()),
                        _ => json!(limit.unit),
                    };
                    o.insert(
                        "limit".into(),
                        json!({name("requestsPerUnit", "requests_per_unit"): int(limit.requests_per_unit.into()), "unit": unit}),
                    );
                }
                match d.hits_addend {
                    Some(w) => drop(o.insert(name("hitsAddend", "hits_addend").into(), int(w.value))),
                    None if style.zeros => drop(o.insert(name("hitsAddend", "hits_addend").into(), json!(null))),
                    None => {}
                }
                if d.is_negative_hits || style.zeros {
                    o.insert(name("isNegativeHits", "is_negative_hits").into(), json!(d.is_negative_hits));
                }
                serde_json::Value::Object(o)
            });
            obj.insert("descriptors".into(), descriptors.collect());
        }
        if req.hits_addend != 0 || style.zeros {
            obj.insert(
                name("hitsAddend", "hits_addend").into(),
                int(req.hits_addend.into()),
            );
        }
        serde_json::Value::Object(obj)
    }

    #[derive(Debug)]
    struct Style {
        snake: bool,
        strings: bool,
        enum_numbers: bool,
        zeros: bool,
    }

    fn arb_style() -> impl Strategy<Value = Style> {
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(snake, strings, enum_numbers, zeros)| Style {
                snake,
                strings,
                enum_numbers,
                zeros,
            },
        )
    }

    fn arb_request() -> impl Strategy<Value = RateLimitRequest> {
        let entry =
            (any::<String>(), any::<String>()).prop_map(|(key, value)| Entry { key, value });
        let limit = (any::<u32>(), prop_oneof![0..=6i32, any::<i32>()]).prop_map(
            |(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            },
        );
        let descriptor = (
            prop::collection::vec(entry, 0..4),
            prop::option::of(limit),
            prop::option::of(any::<u64>()),
            any::<bool>(),
        )
            .prop_map(
                |(entries, limit, hits, is_negative_hits)| RateLimitDescriptor {
                    entries,
                    limit,
                    hits_addend: hits.map(|value| UInt64Value { value }),
                    is_negative_hits,
                },
            );
        (
            any::<String>(),
            prop::collection::vec(descriptor, 0..4),
            any::<u32>(),
        )
            .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
                domain,
                descriptors,
                hits_addend,
            })
    }

    /// Arbitrary JSON, biased towards the request's own field names so that the decoder gets
    /// past the top level and exercises the nested paths.
    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let key = prop_oneof![
            prop::sample::select(vec![
                "domain",
                "descriptors",
                "hitsAddend",
                "hits_addend",
                "entries",
                "key",
                "value",
                "limit",
                "requestsPerUnit",
                "requests_per_unit",
                "unit",
                "isNegativeHits",
                "is_negative_hits",
            ])
            .prop_map(String::from),
            any::<String>(),
        ];
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            prop::sample::select(vec!["SECOND", "WEEK", "12", "-1", "1e3", "x"])
                .prop_map(serde_json::Value::from),
            any::<String>().prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn arb_response() -> impl Strategy<Value = RateLimitResponse> {
        let status = (
            any::<i32>(),
            prop::option::of((any::<String>(), any::<u32>(), any::<i32>())),
            any::<u32>(),
            prop::option::of((any::<i64>(), any::<i32>())),
        )
            .prop_map(
                |(code, limit, limit_remaining, duration)| DescriptorStatus {
                    code,
                    current_limit: limit.map(|(name, requests_per_unit, unit)| RateLimit {
                        name,
                        requests_per_unit,
                        unit,
                    }),
                    limit_remaining,
                    duration_until_reset: duration
                        .map(|(seconds, nanos)| Duration { seconds, nanos }),
                    quota: None,
                },
            );
        let header = (any::<String>(), any::<String>(), any::<Vec<u8>>()).prop_map(
            |(key, value, raw_value)| HeaderValue {
                key,
                value,
                raw_value,
            },
        );
        let value = any::<String>().prop_map(|s| Value {
            kind: Some(Kind::StringValue(s)),
        });
        (
            any::<i32>(),
            prop::collection::vec(status, 0..4),
            prop::collection::vec(header, 0..3),
            any::<Vec<u8>>(),
            prop::option::of(prop::collection::hash_map(any::<String>(), value, 0..4)),
            prop::option::of((any::<i64>(), any::<i32>())),
        )
            .prop_map(
                |(overall_code, statuses, headers, raw_body, metadata, valid_until)| {
                    RateLimitResponse {
                        overall_code,
                        statuses,
                        response_headers_to_add: headers.clone(),
                        request_headers_to_add: headers,
                        raw_body,
                        dynamic_metadata: metadata.map(|fields| Struct { fields }),
                        quota: valid_until.map(|(seconds, nanos)| Quota {
                            requests: 1,
                            id: String::new(),
                            expiration_specifier: Some(ExpirationSpecifier::ValidUntil(
                                Timestamp { seconds, nanos },
                            )),
                        }),
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn decodes_what_a_client_would_encode(req in arb_request(), style in arb_style()) {
            let body = serde_json::to_vec(&request_json(&req, &style)).unwrap();
            prop_assert_eq!(decode_request(&body).unwrap(), req);
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in any::<Vec<u8>>()) {
            let _ = decode_request(&body);
        }

        #[test]
        fn arbitrary_json_never_panics(json in arb_json()) {
            let body = serde_json::to_vec(&json).unwrap();
            if let Err(e) = decode_request(&body) {
                // Every error renders, and a rejected well-formed body says where.
                prop_assert!(!matches!(e, JsonError::Syntax(_)), "{e}");
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn encoded_responses_are_valid_json(resp in arb_response()) {
            let out = encode_response(&resp);
            let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
            prop_assert!(parsed.is_object());
            if !resp.statuses.is_empty() {
                prop_assert_eq!(parsed["statuses"].as_array().map(Vec::len), Some(resp.statuses.len()));
            }
        }
    }
}
