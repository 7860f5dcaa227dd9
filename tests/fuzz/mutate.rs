//! Byte-level mutations of an encoded input, as a coverage-guided fuzzer makes them: a valid
//! input with a few edits gets past the first parser and into the code behind it, which random
//! bytes rarely reach.

use proptest::prelude::*;
use proptest::sample::Index;

/// One edit. Positions are [`Index`]es, so they scale to whatever length the input has by then.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Flips one bit of one byte.
    Flip(Index, u8),
    /// Overwrites one byte.
    Set(Index, u8),
    /// Inserts one byte.
    Insert(Index, u8),
    /// Inserts one token of the target's syntax (`: `, `%`, a varint, ...).
    Token(Index, Index),
    /// Deletes up to `len` bytes.
    Delete(Index, u8),
    /// Repeats a range of up to `len` bytes `times` times in place (deep nesting, long runs).
    Repeat(Index, u8, u8),
    /// Cuts the input short.
    Truncate(Index),
}

/// Up to `max` mutations.
pub fn mutations(max: usize) -> impl Strategy<Value = Vec<Mutation>> {
    let one = prop_oneof![
        1 => (any::<Index>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip(at, bit)),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(at, b)| Mutation::Set(at, b)),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(at, b)| Mutation::Insert(at, b)),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(at, t)| Mutation::Token(at, t)),
        2 => (any::<Index>(), 1u8..16).prop_map(|(at, len)| Mutation::Delete(at, len)),
        1 => (any::<Index>(), 1u8..32, 1u8..64)
            .prop_map(|(at, len, times)| Mutation::Repeat(at, len, times)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
    ];
    proptest::collection::vec(one, 1..=max)
}

/// Applies `edits` in order; `tokens` is the target's dictionary for [`Mutation::Token`].
pub fn apply(bytes: &mut Vec<u8>, edits: &[Mutation], tokens: &[&[u8]]) {
    for edit in edits {
        // Positions index 0..=len (an insert may go at the end); edits on an empty input that
        // need a byte do nothing.
        let at = |i: &Index, len: usize| i.index(len + 1);
        match edit {
            Mutation::Flip(i, bit) if !bytes.is_empty() => {
                let p = i.index(bytes.len());
                bytes[p] ^= 1 << bit;
            }
            Mutation::Set(i, b) if !bytes.is_empty() => {
                let p = i.index(bytes.len());
                bytes[p] = *b;
            }
            Mutation::Insert(i, b) => bytes.insert(at(i, bytes.len()), *b),
            Mutation::Token(i, t) if !tokens.is_empty() => {
                let p = at(i, bytes.len());
                let token = tokens[t.index(tokens.len())];
                bytes.splice(p..p, token.iter().copied());
            }
            Mutation::Delete(i, len) if !bytes.is_empty() => {
                let p = i.index(bytes.len());
                let end = (p + usize::from(*len)).min(bytes.len());
                bytes.drain(p..end);
            }
            Mutation::Repeat(i, len, times) if !bytes.is_empty() => {
                let p = i.index(bytes.len());
                let end = (p + usize::from(*len)).min(bytes.len());
                let range = bytes[p..end].to_vec();
                let copies = range.repeat(usize::from(*times));
                bytes.splice(end..end, copies);
            }
            Mutation::Truncate(i) => {
                let p = at(i, bytes.len());
                bytes.truncate(p);
            }
            _ => {}
        }
    }
}

/// Raw bytes up to `max` long, biased towards printable ASCII so that text parsers see more
/// than their first byte.
pub fn raw_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..max),
        proptest::collection::vec(0x20u8..0x7f, 0..max),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest! {
        #[test]
        fn edits_never_panic_and_stay_bounded(
            mut bytes in proptest::collection::vec(any::<u8>(), 0..64),
            edits in mutations(8),
        ) {
            let before = bytes.len();
            apply(&mut bytes, &edits, &[b"ab", b""]);
            // Each edit adds at most 31 * 63 bytes (a repeat) or two (a token).
            prop_assert!(bytes.len() <= before + edits.len() * 31 * 63);
        }
    }
}
