//! The digest of a node's runtime limits that peers compare in the anti-entropy pass
//! (`cluster::runtime_peers`): how many limits and remembered removals the node holds, and the
//! sum of one hash per entry over its domain, path and stamp (and whether it is a removal).
//!
//! A sum is the same whatever order the changes came in, so two nodes holding the same entries
//! have the same digest; and it is kept up to date as entries come and go (one hash per
//! change), so a node answers a peer's comparison without walking its limits. Two nodes that
//! hold different entries have equal digests only by a chance of about 2^-64 per comparison.
//! The body is left out: a stamp names one change of one node, so two entries with the same
//! stamp at the same path hold the same body.

use super::{PathLevel, Stamp};

/// The entries a node holds, counted and summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digest {
    /// Runtime limits plus remembered removals.
    pub entries: u64,
    /// The wrapping sum of [`entry_hash`] over them.
    pub sum: u64,
}

impl Digest {
    pub(crate) fn add(&mut self, hash: u64) {
        self.entries += 1;
        self.sum = self.sum.wrapping_add(hash);
    }

    pub(crate) fn remove(&mut self, hash: u64) {
        self.entries = self.entries.saturating_sub(1);
        self.sum = self.sum.wrapping_sub(hash);
    }
}

/// The hash of one entry: FNV-1a over its fields, each preceded by its length (so no two
/// entries' bytes line up the same way), then SplitMix64's finaliser. No per-process seed: every
/// node and every build computes the same hash.
pub(crate) fn entry_hash<'a>(
    domain: &str,
    levels: impl IntoIterator<Item = PathLevel<'a>>,
    stamp: &Stamp,
    removal: bool,
) -> u64 {
    let mut h = Fnv::default();
    h.text(domain);
    for (key, value) in levels {
        h.text(key);
        match value {
            Some(v) => h.text(v),
            // No text is this long, so a key-only level never reads as a value.
            None => h.word(u64::MAX),
        }
    }
    h.word(u64::MAX - 1);
    h.word(stamp.at_us);
    h.text(&stamp.origin);
    h.word(u64::from(removal));
    mix(h.0)
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn word(&mut self, w: u64) {
        self.bytes(&w.to_le_bytes());
    }

    fn text(&mut self, s: &str) {
        self.word(s.len() as u64);
        self.bytes(s.as_bytes());
    }
}

/// SplitMix64's finaliser: spreads FNV's weak low bits over the whole word before they are summed.
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(at_us: u64, origin: &str) -> Stamp {
        Stamp {
            at_us,
            origin: origin.into(),
        }
    }

    #[test]
    fn the_hash_is_fixed_and_tells_every_field_apart() {
        let h = |domain, levels: &[PathLevel<'_>], s: &Stamp, removal| {
            entry_hash(domain, levels.iter().copied(), s, removal)
        };
        let s = stamp(7, "10.0.0.1:8090");
        let base = h("d", &[("k", Some("v"))], &s, false);
        // The same on every build: a peer of another release compares the same number.
        assert_eq!(base, h("d", &[("k", Some("v"))], &s, false));
        assert_eq!(base, 0x247d_238d_ca05_2013_u64, "{base:#x}");
        let others = [
            h("d", &[("k", Some("v"))], &s, true),
            h("d", &[("k", None)], &s, false),
            h("d", &[("k", Some(""))], &s, false),
            h("d", &[("kv", None)], &s, false),
            h("dk", &[("", Some("v"))], &s, false),
            h("d", &[("k", Some("v"))], &stamp(8, "10.0.0.1:8090"), false),
            h("d", &[("k", Some("v"))], &stamp(7, "10.0.0.2:8090"), false),
            h("d", &[("k", Some("v")), ("k", Some("v"))], &s, false),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(*o, base, "variant {i}");
        }
    }

    #[test]
    fn a_digest_is_the_same_in_any_order_and_back_where_it_was_after_a_removal() {
        let (a, b, c) = (11, 22, 33);
        let mut one = Digest::default();
        for h in [a, b, c] {
            one.add(h);
        }
        let mut two = Digest::default();
        for h in [c, a, b] {
            two.add(h);
        }
        assert_eq!(one, two);
        two.remove(b);
        assert_ne!(one, two);
        two.add(b);
        assert_eq!(one, two);
        assert_eq!(one.entries, 3);
    }
}
