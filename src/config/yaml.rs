//! YAML text -> a generic [`Value`], with the work that aliases can cause bounded.
//!
//! serde_yaml_ng expands every alias in place, so nested anchors (`b: &b [*a, *a, ...]`,
//! `c: &c [*b, *b, ...]`, the "billion laughs") make a few kilobytes of text into millions of
//! values: a 2.6 KB file took 3.8 s and 1 GB to load, a 9 KB one 40 s and 8 GB. Its own guard
//! (100 alias uses per event of the file) counts uses, not the values they copy, so it lets
//! those through. Here the values are counted, in a first pass that builds nothing: a document
//! may expand to at most as many values as a file of its size could hold without any alias
//! (one per byte, as in `{a,b,c}`), or [`MIN_VALUES`] for a small file. Whatever is within
//! that bound costs no more than a plain file of the same size, which the file size cap bounds.

use std::cell::Cell;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess};
use serde::de::{VariantAccess, Visitor};
use serde_yaml_ng::Value;

/// The values any document may expand to, however short: far more than a hand-written config
/// uses (a 100,000-value file is megabytes of YAML), and about 10 MB and well under a second to
/// build.
pub(crate) const MIN_VALUES: usize = 100_000;

/// Why a text is not a YAML value Sluice will load.
#[derive(Debug, thiserror::Error)]
pub(crate) enum YamlError {
    #[error(transparent)]
    Syntax(#[from] serde_yaml_ng::Error),
    #[error(
        "aliases expand the document to more than {max} values, the most a file of {bytes} bytes may hold"
    )]
    TooManyValues { max: usize, bytes: usize },
}

/// The most values `text` may expand to.
pub(crate) fn max_values(text: &str) -> usize {
    text.len().max(MIN_VALUES)
}

/// Parses one YAML document into a generic value, refusing it before it is built when its
/// aliases expand it past [`max_values`]. Errors other than that are serde_yaml_ng's own, as
/// `serde_yaml_ng::from_str` reports them.
pub(crate) fn parse(text: &str) -> Result<Value, YamlError> {
    let max = max_values(text);
    let budget = Budget {
        left: Cell::new(max),
        exceeded: Cell::new(false),
    };
    let counted = Count(&budget).deserialize(serde_yaml_ng::Deserializer::from_str(text));
    if counted.is_err() && budget.exceeded.get() {
        return Err(YamlError::TooManyValues {
            max,
            bytes: text.len(),
        });
    }
    // Other errors (syntax, several documents) come from the real parse, with its messages.
    Ok(serde_yaml_ng::from_str(text)?)
}

/// The values a document may still expand to.
struct Budget {
    left: Cell<usize>,
    exceeded: Cell<bool>,
}

/// A visitor that walks a document as `Value` would, counting each value against the budget;
/// it fails (marking the budget exceeded) at the first value past it.
#[derive(Clone, Copy)]
struct Count<'a>(&'a Budget);

impl Count<'_> {
    fn one<E: de::Error>(self) -> Result<(), E> {
        match self.0.left.get().checked_sub(1) {
            Some(left) => {
                self.0.left.set(left);
                Ok(())
            }
            None => {
                self.0.exceeded.set(true);
                Err(E::custom("too many values"))
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.one()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.one()
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.one()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.one()
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.one()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.one()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.one()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.one()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.one()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.one()?;
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.one()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
    /// A tagged value (`!tag value`): the tag, then the value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let ((), contents) = data.variant_seed(self)?;
        contents.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `base` scalars, then `levels` of anchors, each a list of `width` aliases of
    /// the one before: about `base * width^levels` values.
    fn laughs(base: usize, width: usize, levels: usize) -> String {
        let mut text = format!("a0: &a0 [{}]\n", vec!["x"; base].join(","));
        for i in 1..=levels {
            let aliases = vec![format!("*a{}", i - 1); width].join(",");
            text.push_str(&format!("a{i}: &a{i} [{aliases}]\n"));
        }
        text
    }

    #[test]
    fn nested_aliases_are_refused_before_they_are_expanded() {
        // 2.6 KB that serde_yaml_ng alone expands to 10 million values (3.8 s, 1 GB).
        let text = laughs(1000, 100, 2);
        assert!(text.len() < 3000);
        let started = crate::clock::instant();
        let err = parse(&text).expect_err("a billion laughs");
        assert!(
            matches!(
                err,
                YamlError::TooManyValues {
                    max: MIN_VALUES,
                    ..
                }
            ),
            "{err}"
        );
        // Counting stops at the bound: milliseconds, where expanding took seconds.
        assert!(started.elapsed() < std::time::Duration::from_millis(1500));
        assert!(err.to_string().starts_with("aliases expand the document"));
    }

    #[test]
    fn aliases_within_the_bound_load_as_before() {
        let text = laughs(10, 10, 3);
        let value = parse(&text).expect("about 12,000 values");
        assert_eq!(value, serde_yaml_ng::from_str::<Value>(&text).unwrap());
        // About 111,000 values: too many for a short file, fine for one of 200 KB.
        let text = laughs(1000, 10, 2);
        assert!(matches!(parse(&text), Err(YamlError::TooManyValues { .. })));
        let padded = format!("{text}#{}\n", " ".repeat(2 * MIN_VALUES));
        assert!(parse(&padded).is_ok());
    }

    #[test]
    fn other_errors_are_serde_yaml_ng_s() {
        for text in ["a: [", "a: 1\n---\nb: 2\n", "a: *missing", "{a: 1, a: 2}"] {
            let ours = parse(text).expect_err(text).to_string();
            let theirs = serde_yaml_ng::from_str::<Value>(text)
                .unwrap_err()
                .to_string();
            assert_eq!(ours, theirs);
        }
        assert_eq!(parse("").unwrap(), Value::Null);
        assert!(matches!(parse("!t [1]").unwrap(), Value::Tagged(_)));
    }
}
