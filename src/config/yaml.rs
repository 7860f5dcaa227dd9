//! YAML text -> a generic [`Value`], with the work that aliases can cause bounded and merge
//! keys resolved as go-yaml resolves them.
//!
//! serde_yaml_ng expands every alias in place, so nested anchors (`b: &b [*a, *a, ...]`,
//! `c: &c [*b, *b, ...]`, the "billion laughs") make a few kilobytes of text into millions of
//! values: a 2.6 KB file took 3.8 s and 1 GB to load, a 9 KB one 40 s and 8 GB. Its own guard
//! (100 alias uses per event of the file) counts uses, not the values they copy, so it lets
//! those through. Here the values are counted, in a first pass that builds nothing: a document
//! may expand to at most as many values as a file of its size could hold without any alias
//! (one per byte, as in `{a,b,c}`), or [`MIN_VALUES`] for a small file. Whatever is within
//! that bound costs no more than a plain file of the same size, which the file size cap bounds.
//!
//! Merge keys: go-yaml (envoyproxy/ratelimit) merges a mapping's `<<` key only when it is
//! written plain; a quoted `"<<"` or `'<<'` is a key like any other (in `metadata`, say).
//! serde_yaml_ng's `Value` cannot tell them apart, and its `apply_merge` merges both. The first
//! pass notes how each `<<` key was written, so the quoted ones are set aside while
//! `apply_merge` runs and put back after.

use std::cell::{Cell, RefCell};

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess};
use serde::de::{VariantAccess, Visitor};
use serde_yaml_ng::value::{Tag, TaggedValue};
use serde_yaml_ng::{Mapping, Value};

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

/// Parses one YAML document into a generic value with its merge keys resolved, refusing it
/// before it is built when its aliases expand it past [`max_values`]. Errors other than that
/// are serde_yaml_ng's own, as `serde_yaml_ng::from_str` and `Value::apply_merge` report them.
pub(crate) fn parse(text: &str) -> Result<Value, YamlError> {
    let max = max_values(text);
    let pass = Pass {
        text,
        left: Cell::new(max),
        exceeded: Cell::new(false),
        merge_keys: RefCell::new(Vec::new()),
    };
    let counted = Count::value(&pass).deserialize(serde_yaml_ng::Deserializer::from_str(text));
    if counted.is_err() && pass.exceeded.get() {
        return Err(YamlError::TooManyValues {
            max,
            bytes: text.len(),
        });
    }
    // Other errors (syntax, several documents) come from the real parse, with its messages.
    let mut value: Value = serde_yaml_ng::from_str(text)?;
    let quoted = pass.merge_keys.into_inner();
    if quoted.contains(&true) {
        set_aside(&mut value, &mut quoted.into_iter());
        value.apply_merge()?;
        put_back(&mut value);
    } else {
        value.apply_merge()?;
    }
    Ok(value)
}

/// The tag a quoted `<<` key wears while `apply_merge` runs, so that it is not merged.
const QUOTED_MERGE_KEY: &str = "!sluice/quoted-merge-key";

/// A mapping's key `<<`, as `apply_merge` finds it (a string, untagged).
fn is_merge_key(key: &Value) -> bool {
    matches!(key, Value::String(s) if s == "<<")
}

/// Tags the quoted `<<` keys of `value`'s mappings. `quoted` says, for each `<<` key in the
/// order the first pass met them (the text's), whether it was quoted; this walk meets them in
/// the same order, and looks into no key, as neither the first pass nor `apply_merge` does.
fn set_aside(value: &mut Value, quoted: &mut impl Iterator<Item = bool>) {
    match value {
        Value::Mapping(map) => {
            let mut any = false;
            for (key, value) in map.iter_mut() {
                if is_merge_key(key) && quoted.next() == Some(true) {
                    any = true;
                }
                set_aside(value, quoted);
            }
            if any {
                rename(map, is_merge_key, |key| {
                    Value::Tagged(Box::new(TaggedValue {
                        tag: Tag::new(QUOTED_MERGE_KEY),
                        value: key,
                    }))
                });
            }
        }
        Value::Sequence(items) => items.iter_mut().for_each(|v| set_aside(v, quoted)),
        Value::Tagged(tagged) => set_aside(&mut tagged.value, quoted),
        _ => {}
    }
}

/// Gives every key [`set_aside`] tagged its text back: a key named `<<`.
fn put_back(value: &mut Value) {
    let aside = |key: &Value| matches!(key, Value::Tagged(t) if t.tag == QUOTED_MERGE_KEY);
    match value {
        Value::Mapping(map) => {
            if map.keys().any(aside) {
                rename(map, aside, |key| match key {
                    Value::Tagged(t) => t.value,
                    other => other,
                });
            }
            map.values_mut().for_each(put_back);
        }
        Value::Sequence(items) => items.iter_mut().for_each(put_back),
        Value::Tagged(tagged) => put_back(&mut tagged.value),
        _ => {}
    }
}

/// Replaces the keys of `map` that `which` picks with `to` of them, in place.
fn rename(map: &mut Mapping, which: impl Fn(&Value) -> bool, to: impl Fn(Value) -> Value) {
    *map = std::mem::take(map)
        .into_iter()
        .map(|(k, v)| if which(&k) { (to(k), v) } else { (k, v) })
        .collect();
}

/// What the first pass keeps: the text, the values it may still expand to, and how each `<<`
/// key was written.
struct Pass<'t> {
    text: &'t str,
    left: Cell<usize>,
    exceeded: Cell<bool>,
    /// For each `<<` key of a mapping, in the order of the text: whether it was quoted.
    merge_keys: RefCell<Vec<bool>>,
}

/// Where the value a [`Count`] visits sits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Value,
    /// A mapping's key.
    Key,
    /// Inside a key that is a mapping, a list or tagged, or a tag: never a merge key.
    InKey,
}

/// A visitor that walks a document as `Value` would, counting each value against the budget;
/// it fails (marking the budget exceeded) at the first value past it. It notes how each `<<`
/// key was written.
#[derive(Clone, Copy)]
struct Count<'p, 't> {
    pass: &'p Pass<'t>,
    role: Role,
}

impl<'p, 't> Count<'p, 't> {
    fn value(pass: &'p Pass<'t>) -> Self {
        Count {
            pass,
            role: Role::Value,
        }
    }

    /// The visitor for a value inside this one, in `role` there: anything inside a key is in
    /// a key.
    fn inside(self, role: Role) -> Self {
        let role = if self.role == Role::Value {
            role
        } else {
            Role::InKey
        };
        Count { role, ..self }
    }

    fn one<E: de::Error>(self) -> Result<(), E> {
        match self.pass.left.get().checked_sub(1) {
            Some(left) => {
                self.pass.left.set(left);
                Ok(())
            }
            None => {
                self.pass.exceeded.set(true);
                Err(E::custom("too many values"))
            }
        }
    }

    /// Notes a key `<<`, quoted unless serde_yaml_ng `lent` its text from the file with no
    /// quote just before it: it lends a plain scalar's text from the file, a quoted one's
    /// from just inside its quotes, and one with escapes (only a quoted one has any) not at
    /// all.
    fn merge_key(self, text: &str, lent: bool) {
        if self.role != Role::Key || text != "<<" {
            return;
        }
        let file = self.pass.text;
        let at = (text.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
        let plain = lent
            && file
                .get(..at)
                .is_some_and(|before| !before.ends_with(['"', '\'']));
        self.pass.merge_keys.borrow_mut().push(!plain);
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_, '_> {
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
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.merge_key(s, false);
        self.one()
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<(), E> {
        self.merge_key(s, true);
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
        while seq.next_element_seed(self.inside(Role::Value))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.one()?;
        while map.next_key_seed(self.inside(Role::Key))?.is_some() {
            map.next_value_seed(self.inside(Role::Value))?;
        }
        Ok(())
    }
    /// A tagged value (`!tag value`): the tag, then the value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // Neither the tag nor a tagged key's value is a plain key `apply_merge` would merge.
        let ((), contents) = data.variant_seed(self.inside(Role::InKey))?;
        contents.newtype_variant_seed(self.inside(Role::Value))
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
        // apply_merge's own errors, as it reports them.
        let theirs = |text: &str| {
            let mut value: Value = serde_yaml_ng::from_str(text).unwrap();
            value.apply_merge().unwrap_err().to_string()
        };
        for text in ["<<: 1", "<<: [[a]]", "a: {\"b\": 1, <<: x}"] {
            assert_eq!(parse(text).unwrap_err().to_string(), theirs(text), "{text}");
        }
    }

    fn yaml(text: &str) -> Value {
        serde_yaml_ng::from_str(text).unwrap()
    }

    #[test]
    fn a_plain_merge_key_merges_and_a_quoted_one_is_a_key() {
        let text = "base: &b {x: 1}\nplain: {<<: *b, y: 2}\ndouble: {\"<<\": *b, y: 2}\nsingle: {'<<': 3}\n";
        let want = yaml(
            "base: {x: 1}\nplain: {y: 2, x: 1}\ndouble: {\"<<\": {x: 1}, y: 2}\nsingle: {'<<': 3}\n",
        );
        assert_eq!(parse(text).unwrap(), want);
        // Block style, an escaped quoted key, and a merge after a quoted key.
        let text = "a: &a {x: 1}\nb:\n  \"\\x3c<\": 1\n  c:\n    y: {'<<': 2}\n    <<: *a\n";
        let value = parse(text).unwrap();
        assert_eq!(value["b"], yaml("{\"<<\": 1, c: {y: {\"<<\": 2}, x: 1}}"));
        // Both kinds in one mapping are one key twice to serde_yaml_ng, which refuses it (go-yaml
        // merges one and keeps the other): refused, never misread.
        let err = parse("a: &a {x: 1}\nb: {<<: *a, '<<': 2}\n").unwrap_err();
        assert!(
            err.to_string().contains("duplicate entry with key \"<<\""),
            "{err}"
        );
    }

    #[test]
    fn quoted_merge_keys_are_found_where_aliases_copy_them() {
        // The alias copies the quoted key: both copies stay keys, and the merge beside them
        // still merges.
        let text = "m: &m {'<<': q}\nn: *m\no: {<<: {z: 0}, k: *m}\n";
        let want = yaml("m: {'<<': q}\nn: {'<<': q}\no: {k: {'<<': q}, z: 0}\n");
        assert_eq!(parse(text).unwrap(), want);
        // A key that is itself a mapping is not looked into (nor merged), and does not put
        // the later keys out of step.
        let text = "? {'<<': 1}\n: v\nw: {<<: {z: 0}}\nq: {'<<': 2}\n";
        let value = parse(text).unwrap();
        assert_eq!(value["w"], yaml("{z: 0}"));
        assert_eq!(value["q"], yaml("{'<<': 2}"));
    }
}
