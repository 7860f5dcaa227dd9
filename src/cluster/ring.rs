//! Which peer owns a counter key: rendezvous (highest-random-weight) hashing.
//!
//! Every peer gets a score for a key, `mix(hash(key) ^ seed(peer))`, and the highest-scoring
//! live peer owns it. Chosen over a ring of virtual nodes because it needs no tuning to be even
//! (each peer owns 1/N of the keys in expectation, with the variance of a fair coin, not of
//! vnode placement), moves exactly the keys of a peer that leaves (to the others, evenly) and
//! only 1/(N+1) of the keys to a peer that joins, and lets a key fall back to its next-best
//! peer when its owner is down without rebuilding anything. The cost, one hash mix per peer per
//! key, is a few nanoseconds each for the tens of peers this service runs with.
//!
//! Hashes are FNV-1a plus a SplitMix64 finaliser, fixed across processes and platforms, so
//! every node computes the same owner.
//!
//! [`PeerRing`] (`peers.rs`) is a ring with a client and a down mark per peer: the membership
//! core the cluster's `Members` and the parent link share.

mod peers;

pub(in crate::cluster) use peers::{PeerRing, UNTIL_CLEARED, UP};

/// A stable 64-bit hash of a key (FNV-1a, then a finaliser for avalanche).
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// SplitMix64's finaliser.
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The peers, in a fixed order, each with its hashing seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ring {
    peers: Vec<(String, u64)>,
}

impl Ring {
    /// A ring of the given peer addresses (duplicates removed; order does not matter).
    pub fn new<I: IntoIterator<Item = String>>(addrs: I) -> Self {
        let mut peers: Vec<String> = addrs.into_iter().collect();
        peers.sort();
        peers.dedup();
        Ring {
            peers: peers
                .into_iter()
                .map(|a| {
                    let seed = key_hash(&a);
                    (a, seed)
                })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    pub fn addr(&self, index: usize) -> &str {
        &self.peers[index].0
    }

    pub(crate) fn index_of(&self, addr: &str) -> Option<usize> {
        self.peers.iter().position(|(a, _)| a == addr)
    }

    pub fn addrs(&self) -> impl Iterator<Item = &str> {
        self.peers.iter().map(|(a, _)| a.as_str())
    }

    /// The owner of a key among the peers for which `up` is true (`None` if none is).
    pub fn owner(&self, key_hash: u64, up: impl Fn(usize) -> bool) -> Option<usize> {
        self.peers
            .iter()
            .enumerate()
            .filter(|(i, _)| up(*i))
            .max_by_key(|(_, (_, seed))| mix(key_hash ^ seed))
            .map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: usize) -> Ring {
        Ring::new((0..n).map(|i| format!("10.0.0.{i}:8082")))
    }

    fn owners(r: &Ring, keys: usize) -> Vec<String> {
        (0..keys)
            .map(|k| {
                let i = r
                    .owner(key_hash(&format!("domain_key_{k}_")), |_| true)
                    .unwrap();
                r.addr(i).to_string()
            })
            .collect()
    }

    #[test]
    fn load_is_even() {
        for n in [2, 3, 5, 10, 50] {
            let r = ring(n);
            let keys = 200_000;
            let o = owners(&r, keys);
            for addr in r.addrs() {
                let share = o.iter().filter(|a| *a == addr).count() as f64 / keys as f64;
                let expected = 1.0 / n as f64;
                assert!(
                    (share - expected).abs() < expected * 0.1,
                    "{n} peers: {addr} owns {share:.4}, expected {expected:.4}"
                );
            }
        }
    }

    #[test]
    fn a_joining_peer_takes_about_one_in_n_plus_one_keys_and_nothing_else_moves() {
        let before = ring(4);
        let after = ring(5);
        let (a, b) = (owners(&before, 100_000), owners(&after, 100_000));
        let moved: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).collect();
        let share = moved.len() as f64 / a.len() as f64;
        assert!((share - 0.2).abs() < 0.02, "moved {share:.4}");
        // Every key that moved went to the new peer.
        assert!(moved.iter().all(|(_, to)| *to == "10.0.0.4:8082"));
    }

    #[test]
    fn a_down_peer_gives_its_keys_to_the_others_evenly_and_only_its_keys() {
        let r = ring(4);
        let down = r.index_of("10.0.0.2:8082").unwrap();
        let mut moved_to = std::collections::HashMap::new();
        for k in 0..100_000 {
            let h = key_hash(&format!("k{k}"));
            let all = r.owner(h, |_| true).unwrap();
            let live = r.owner(h, |i| i != down).unwrap();
            if all != down {
                assert_eq!(all, live, "a key not owned by the down peer moved");
            } else {
                *moved_to.entry(live).or_insert(0) += 1;
            }
        }
        assert_eq!(moved_to.len(), 3);
        let counts: Vec<i32> = moved_to.values().copied().collect();
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(f64::from(*max) / f64::from(*min) < 1.15, "{counts:?}");
        assert_eq!(r.owner(1, |_| false), None);
    }

    #[test]
    fn owners_do_not_depend_on_the_order_peers_are_listed_in() {
        let a = Ring::new(["b:1".to_string(), "a:1".into(), "c:1".into()]);
        let b = Ring::new(["c:1".to_string(), "a:1".into(), "b:1".into(), "a:1".into()]);
        assert_eq!(a, b);
        assert_eq!(key_hash("x"), key_hash("x"));
    }
}
