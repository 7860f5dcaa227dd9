//! SplitMix64: a small, seedable random stream, the same on every platform, for the measuring
//! programs' workloads (the simulator's arrivals and network, the load clients' keys, the scale
//! curves' limit indices) without a random-number crate.

/// A SplitMix64 stream from its seed.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next word of the stream.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// SplitMix64's one step from `x`: the first word of the stream seeded with it (spreads
/// consecutive numbers over the whole word).
pub fn mix(x: u64) -> u64 {
    SplitMix64(x).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_splitmix64s() {
        // The reference values of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        let mut r = SplitMix64(7);
        for _ in 0..1000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            assert!((3..=5).contains(&r.range(3, 5)));
            assert!(r.below(4) < 4);
        }
    }
}
