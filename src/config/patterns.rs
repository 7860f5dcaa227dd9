//! `value_regex` (issue 52): one key's patterns at one level of a domain, and which of them,
//! first in YAML order, matches all of a request's value.
//!
//! The patterns are compiled together into one multi-pattern regex (the `regex` crate's engines,
//! linear in the value's length). A value is not run against all of them at once: a set of 10^4
//! patterns made the lazy DFA's states as large as the set and its cache thrash (1.4 ms a lookup,
//! `bench/programs/src/bin/scale_config.rs`). Instead each pattern is filed under the literal text
//! every match of it starts with (`t7_` for `t7_[0-9]+`; `gold-t3-` and `silver-t3-` for
//! `(?:gold|silver)-t3-.+`) or, when it has none, ends with; a value then tries only the patterns
//! filed under its own first or last bytes, one map probe per distinct literal length, each with an
//! anchored search for that pattern alone. The few patterns with neither (`[a-z]+`) are searched
//! together in one pass.

use regex_automata::meta::{self, Regex};
use regex_automata::nfa::thompson::WhichCaptures;
use regex_automata::{Anchored, Input, MatchKind, PatternID, PatternSet};
use regex_syntax::hir::literal::{ExtractKind, Extractor};
use regex_syntax::hir::{Hir, Look};

/// A map with a fast hash, as the lookup's own (a type of its own here, so that this module
/// and the lookup do not import each other).
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The longest `value_regex`, in bytes of YAML text.
pub(crate) const MAX_PATTERN_BYTES: usize = 4_096;
/// How large one pattern may grow compiled (the regex engine's NFA size limit): a larger one,
/// such as `(\w{100}){100}`, is refused at load before it costs seconds to compile.
pub(crate) const MAX_PATTERN_COMPILED_BYTES: usize = 1 << 20;
/// How large one key's patterns may grow compiled together (10^5 patterns of the scale
/// benchmark's shape pass 64 MiB).
pub(crate) const MAX_PATTERNS_COMPILED_BYTES: usize = 256 << 20;
/// A pattern is filed under its literals only when it has at most this many (a
/// case-insensitive `(?i)ab` has 4); one with more goes with the unfiled.
const MAX_LITERALS: usize = 64;
/// Classes of at most this many characters are spelled out into literals (a case-insensitive
/// letter is 2 or 3); a larger one (`[0-9]`) ends the literal before it, so that `t1_[0-9]+` is
/// filed once under `t1_`, not ten times.
const SPELL_CLASS_AT_MOST: usize = 4;
/// Unfiled patterns up to this many are tried one by one; more are searched as one set.
const TRY_AT_MOST: usize = 8;

/// One key's `value_regex` nodes at a level, in YAML order.
#[derive(Debug, Default)]
pub(super) struct Patterns {
    /// The level's node of each pattern.
    pub(super) nodes: Vec<usize>,
    /// The patterns as the YAML gives them.
    pub(super) sources: Vec<String>,
    /// The same, to refuse a pattern given twice.
    seen: FastMap<Box<str>, ()>,
    compiled: Option<Compiled>,
}

/// What [`Patterns::compile`] builds.
#[derive(Debug)]
struct Compiled {
    /// Every pattern, anchored at both ends; pattern id `i` is `sources[i]`.
    all: Regex,
    prefixes: Literals,
    suffixes: Literals,
    /// The patterns filed under neither, ascending.
    unfiled: Vec<u32>,
    /// The unfiled patterns as one set, when there are more than [`TRY_AT_MOST`]; its
    /// pattern `j` is `unfiled[j]`.
    unfiled_set: Option<Regex>,
}

/// Patterns filed under the literal text their matches start (or end) with.
#[derive(Debug, Default)]
struct Literals {
    by_literal: FastMap<Box<[u8]>, Vec<u32>>,
    /// The literals' distinct lengths, ascending.
    lens: Vec<usize>,
}

impl Literals {
    fn file(&mut self, literal: &[u8], id: u32) {
        if let Err(at) = self.lens.binary_search(&literal.len()) {
            self.lens.insert(at, literal.len());
        }
        let ids = self.by_literal.entry(literal.into()).or_default();
        // A pattern with `ab|abc` would be filed under `ab` once only.
        if ids.last() != Some(&id) {
            ids.push(id);
        }
    }

    /// The first pattern, by id, filed under the start (or end) of `value` that `matches`.
    fn first(&self, value: &[u8], suffix: bool, matches: impl Fn(u32) -> bool) -> Option<u32> {
        let part = |l: usize| match suffix {
            false => value.get(..l),
            true => value.get(value.len() - l..),
        };
        self.lens
            .iter()
            .take_while(|&&l| l <= value.len())
            .filter_map(|&l| part(l).and_then(|p| self.by_literal.get(p)))
            .filter_map(|ids| ids.iter().copied().find(|&id| matches(id)))
            .min()
    }
}

/// Parses one pattern as the regex engine would.
fn parse(pattern: &str) -> Result<Hir, String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "value_regex '{}...' is {} bytes; the most is {MAX_PATTERN_BYTES}",
            pattern.chars().take(40).collect::<String>(),
            pattern.len()
        ));
    }
    regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|e| format!("invalid value_regex '{pattern}': {e}"))
}

/// The patterns, each anchored at both ends, as one regex within the size limit. Without the
/// bounded backtracker (it clears a bitmap as large as all the patterns on every search: 5 µs
/// a lookup at 10^4 patterns, where the lazy DFA takes well under one) and without a full DFA
/// (built ahead for a small pattern, it was most of the load time).
fn build(hirs: &[&Hir], kind: MatchKind, limit: usize) -> Result<Regex, String> {
    let anchored: Vec<Hir> = hirs
        .iter()
        .map(|&h| {
            Hir::concat(vec![
                Hir::look(Look::Start),
                h.clone(),
                Hir::look(Look::End),
            ])
        })
        .collect();
    Regex::builder()
        .configure(
            Regex::config()
                .nfa_size_limit(Some(limit))
                .which_captures(WhichCaptures::None)
                .backtrack(false)
                .dfa(false)
                .match_kind(kind),
        )
        .build_many_from_hir(&anchored)
        .map_err(|e| build_error(&e))
}

/// A build error in words: the syntax error, or the size limit passed.
fn build_error(e: &meta::BuildError) -> String {
    match (e.syntax_error(), e.size_limit()) {
        (Some(syntax), _) => syntax.to_string(),
        (None, Some(limit)) => format!("compiled, it is larger than the limit of {limit} bytes"),
        (None, None) => e.to_string(),
    }
}

/// Checks one `value_regex` as the YAML gives it: its length, its syntax and its compiled size.
pub(super) fn check_pattern(pattern: &str) -> Result<(), String> {
    let hir = parse(pattern)?;
    build(
        &[&hir],
        MatchKind::LeftmostFirst,
        MAX_PATTERN_COMPILED_BYTES,
    )
    .map(drop)
    .map_err(|e| format!("invalid value_regex '{pattern}': {e}"))
}

/// The literals every match of `hir` starts (or ends) with, when they are few and none is
/// empty.
fn literals(hir: &Hir, kind: ExtractKind) -> Option<Vec<Vec<u8>>> {
    let seq = Extractor::new()
        .kind(kind)
        .limit_class(SPELL_CLASS_AT_MOST)
        .extract(hir);
    let lits = seq.literals()?;
    let usable = !lits.is_empty() && lits.len() <= MAX_LITERALS && seq.min_literal_len()? > 0;
    usable.then(|| lits.iter().map(|l| l.as_bytes().to_vec()).collect())
}

impl Patterns {
    /// Pattern `pattern` of node `i`; `Err` for one the key already has.
    pub(super) fn push(&mut self, i: usize, key: &str, pattern: &str) -> Result<(), String> {
        if self.seen.insert(pattern.into(), ()).is_some() {
            return Err(format!("duplicate value_regex '{pattern}' for key '{key}'"));
        }
        self.nodes.push(i);
        self.sources.push(pattern.to_owned());
        self.compiled = None;
        Ok(())
    }

    /// Keeps the first `keep` patterns (a failed file's additions undone) and compiles them
    /// again; they compiled before that file, and should they not, the key matches nothing.
    pub(super) fn truncate(&mut self, keep: usize) {
        for gone in self.sources.drain(keep..) {
            self.seen.remove(gone.as_str());
        }
        self.nodes.truncate(keep);
        if self.compile().is_err() {
            self.compiled = None;
        }
    }

    pub(super) fn is_compiled(&self) -> bool {
        self.compiled.is_some()
    }

    /// Compiles the patterns and files them; `Err` when they together pass
    /// [`MAX_PATTERNS_COMPILED_BYTES`] (each alone was checked by [`check_pattern`]).
    pub(super) fn compile(&mut self) -> Result<(), String> {
        let hirs = self
            .sources
            .iter()
            .map(|p| parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Hir> = hirs.iter().collect();
        let all = build(&refs, MatchKind::LeftmostFirst, MAX_PATTERNS_COMPILED_BYTES)?;
        let (mut prefixes, mut suffixes) = (Literals::default(), Literals::default());
        let mut unfiled = Vec::new();
        for (id, hir) in (0u32..).zip(&hirs) {
            let pre = literals(hir, ExtractKind::Prefix);
            let suf = literals(hir, ExtractKind::Suffix);
            // The side whose shortest literal is longer picks fewer patterns per probe.
            let shortest =
                |l: &Option<Vec<Vec<u8>>>| l.as_ref().and_then(|l| l.iter().map(Vec::len).min());
            let (side, lits) = match shortest(&pre) >= shortest(&suf) {
                true => (&mut prefixes, pre),
                false => (&mut suffixes, suf),
            };
            match lits {
                Some(lits) => lits.iter().for_each(|l| side.file(l, id)),
                None => unfiled.push(id),
            }
        }
        let unfiled_set = match unfiled.len() > TRY_AT_MOST {
            true => {
                let some: Vec<&Hir> = unfiled.iter().map(|&id| &hirs[id as usize]).collect();
                Some(build(&some, MatchKind::All, MAX_PATTERNS_COMPILED_BYTES)?)
            }
            false => None,
        };
        self.compiled = Some(Compiled {
            all,
            prefixes,
            suffixes,
            unfiled,
            unfiled_set,
        });
        Ok(())
    }

    /// The first node, in YAML order, whose pattern matches all of `value`.
    pub(super) fn first_match(&self, value: &str) -> Option<usize> {
        let c = self.compiled.as_ref()?;
        let matches = |id: u32| {
            let input = Input::new(value).anchored(Anchored::Pattern(PatternID::must(id as usize)));
            c.all.is_match(input)
        };
        let bytes = value.as_bytes();
        let filed = [
            c.prefixes.first(bytes, false, matches),
            c.suffixes.first(bytes, true, matches),
        ];
        let unfiled = match &c.unfiled_set {
            None => c.unfiled.iter().copied().find(|&id| matches(id)),
            Some(set) => {
                let mut found = PatternSet::new(set.pattern_len());
                set.which_overlapping_matches(
                    &Input::new(value).anchored(Anchored::Yes),
                    &mut found,
                );
                found.iter().next().map(|j| c.unfiled[j.as_usize()])
            }
        };
        let first = filed.into_iter().chain([unfiled]).flatten().min()?;
        self.nodes.get(first as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The patterns pushed in order and compiled.
    fn patterns(sources: &[String]) -> Patterns {
        let mut p = Patterns::default();
        for (i, s) in sources.iter().enumerate() {
            p.push(i, "k", s).expect("distinct patterns");
        }
        p.compile().expect("they compile");
        p
    }

    /// The oracle: each pattern alone, anchored at both ends, tried in YAML order.
    fn first_by_trying_each(each: &[Regex], value: &str) -> Option<usize> {
        each.iter().position(|r| r.is_match(value))
    }

    /// Patterns of every filing: a literal start (`ab[0-9]*`), a literal end (`[0-9]*ab`), an
    /// alternation of starts, case-insensitive literals, and none at all (`[a-c]+`).
    fn pattern() -> impl Strategy<Value = String> {
        let lit = "[abc]{0,3}";
        let class = prop_oneof![Just("[0-9]*"), Just("[a-c]+"), Just(".?"), Just("")];
        (lit, class, lit, 0..4u8).prop_map(|(head, class, tail, form)| match form {
            0 => format!("{head}{class}{tail}"),
            1 => format!("(?:{head}|x{tail}){class}"),
            2 => format!("(?i){head}{class}"),
            _ => format!("{class}{tail}"),
        })
    }

    proptest! {
        /// Whatever the filing, the first pattern in YAML order that matches all of the value
        /// is the one found, as if each were tried in turn; over 8 unfiled the set is used.
        #[test]
        fn the_first_pattern_in_order_is_found_however_they_are_filed(
            sources in proptest::collection::hash_set(pattern(), 1..40),
            values in proptest::collection::vec("[abcxAB0-9]{0,6}", 1..30),
        ) {
            let sources: Vec<String> = sources.into_iter().collect();
            let p = patterns(&sources);
            let each: Vec<Regex> = sources
                .iter()
                .map(|s| Regex::new(&format!(r"\A(?:{s})\z")).expect("a valid pattern"))
                .collect();
            for v in &values {
                prop_assert_eq!(p.first_match(v), first_by_trying_each(&each, v), "{}", v);
            }
        }
    }

    #[test]
    fn patterns_are_filed_by_their_start_their_end_or_neither() {
        let sources: Vec<String> = ["t1_[0-9]+", "(?:gold|silver)-x", "[0-9]+-end", "[a-z]+"]
            .map(String::from)
            .into();
        let p = patterns(&sources);
        let c = p.compiled.as_ref().expect("compiled");
        fn filed(l: &Literals) -> Vec<&[u8]> {
            let mut k: Vec<&[u8]> = l.by_literal.keys().map(|k| &**k).collect();
            k.sort_unstable();
            k
        }
        assert_eq!(filed(&c.prefixes), [&b"gold-x"[..], b"silver-x", b"t1_"]);
        assert_eq!(filed(&c.suffixes), [&b"-end"[..]]);
        assert_eq!(c.unfiled, [3]);
        assert_eq!(p.first_match("silver-x"), Some(1));
        assert_eq!(p.first_match("12-end"), Some(2));
        assert_eq!(p.first_match("abc"), Some(3));
        assert_eq!(p.first_match("t1_"), None);
    }
}
