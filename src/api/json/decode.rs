//! Decoding: the [`Json`] tree of a `/json` body -> prost's `RateLimitRequest`, field by field,
//! every error naming the path of the offending value.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;

use super::JsonError;
use super::number::Integral;
use super::tree::{Json, Number, Path, parse};

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
/// integral (`1e2`, `"100.0"`), read exactly whatever its size (`1.8446744073709551615e19`).
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
    match number.integral() {
        Integral::Exactly(n) if (min..=max).contains(&n) => Ok(n),
        Integral::Fraction => Err(JsonError::NotAnInteger {
            path: path.to_string(),
            value: number.to_string(),
        }),
        Integral::Exactly(_) | Integral::Beyond => Err(JsonError::OutOfRange {
            path: path.to_string(),
            value: number.to_string(),
            ty,
        }),
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
    match parse(s.as_bytes()) {
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

/// The request in `json`, the whole body.
pub(super) fn request(json: Json, path: &Path<'_>) -> Result<RateLimitRequest, JsonError> {
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

#[cfg(test)]
mod tests;
