//! The JSON tree a `/json` body is parsed into before [`super::decode`] walks it, and the path
//! of a value inside it that error messages name.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

pub(super) use super::number::Number;
use super::number::NumberTexts;

/// A parsed JSON value. Unlike `serde_json::Value`, objects keep every member in order, duplicates
/// included, because proto3 JSON must reject a field given twice.
#[derive(Debug)]
pub(super) enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// How an error message names the kind of value that was found.
    pub(super) fn kind(&self) -> &'static str {
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

/// Parses `bytes` as one JSON value. serde_json bounds nesting (128 levels), so hostile input
/// cannot exhaust the stack here or when the tree is dropped.
pub(super) fn parse(bytes: &[u8]) -> Result<Json, serde_json::Error> {
    let texts = RefCell::new(NumberTexts::new(bytes));
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let json = Tree(&texts).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(json)
}

/// Builds the tree, finding in the body the text of each number that is not a 64-bit integer.
#[derive(Clone, Copy)]
struct Tree<'t, 'b>(&'t RefCell<NumberTexts<'b>>);

impl<'de> DeserializeSeed<'de> for Tree<'_, '_> {
    type Value = Json;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tree<'_, '_> {
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
        self.0.borrow_mut().pass();
        Ok(Json::Number(Number::U(n)))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json, E> {
        self.0.borrow_mut().pass();
        Ok(Json::Number(Number::I(n)))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
        // The fallback is never taken for a body serde_json reads (see `number`); were it, the
        // double's shortest text is still a JSON number, exact up to 2^53.
        let text = match self.0.borrow_mut().next() {
            Some(text) => Box::from(text),
            None => format!("{n:?}").into_boxed_str(),
        };
        Ok(Json::Number(Number::Written(text)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_owned()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            members.push((name, map.next_value_seed(self)?));
        }
        Ok(Json::Object(members))
    }
}

/// Where a value sits in the request, rendered only when an error needs it (so the happy path
/// allocates nothing for paths).
pub(super) enum Path<'a> {
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
