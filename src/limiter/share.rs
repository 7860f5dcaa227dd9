//! Max-min fair share (Doorman's algorithm, design note 004): split a capacity among claimants
//! by their demands so that nobody gets more than they ask, a claimant asking less than an
//! equal share gets what it asks, and the others divide what is left equally.
//!
//! Pure arithmetic on whole units, no allocation beyond the answer (none for up to eight
//! claimants with [`max_min_fair_into`]). Used by the lease server
//! (`crate::cluster::lease::server`) for window counts and bucket rate shares alike, and by the
//! quota service (`crate::rlqs::bucket`) for Envoys' parts of a bucket's rate.

use smallvec::SmallVec;

/// The max-min fair split of `capacity` over `demands`: `out[i] <= demands[i]`, the sum is at
/// most `capacity`, and when the demands exceed the capacity the capacity is given out in full
/// (up to the rounding of one unit per claimant, which goes to the first ones).
pub(crate) fn max_min_fair(capacity: u64, demands: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; demands.len()];
    max_min_fair_into(capacity, demands, &mut out);
    out
}

/// [`max_min_fair`] into `out` (as long as `demands`), with no allocation for up to eight
/// claimants: the lease server splits each key's window this way on every ask, so a renewal
/// round of 10^5 keys allocates nothing here.
pub(crate) fn max_min_fair_into(capacity: u64, demands: &[u64], out: &mut [u64]) {
    out.fill(0);
    let mut order: SmallVec<[usize; 8]> = (0..demands.len()).collect();
    // Smallest demand first: each is filled in full while it fits an equal share of the rest.
    order.sort_by_key(|&i| demands[i]);
    let mut left = capacity;
    let mut claimants = order.len() as u64;
    for (k, &i) in order.iter().enumerate() {
        if claimants == 0 {
            break;
        }
        let equal = left / claimants;
        if demands[i] <= equal {
            out[i] = demands[i];
            left -= demands[i];
            claimants -= 1;
            continue;
        }
        // Every claimant from here on asks more than an equal share: split the rest equally,
        // the remainder's units to the first of them.
        let rest = &order[k..];
        let n = rest.len() as u64;
        let (each, extra) = (left / n, left % n);
        for (j, &r) in rest.iter().enumerate() {
            out[r] = each + u64::from((j as u64) < extra);
        }
        break;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_demands_are_met_and_the_rest_split_equally() {
        // Doorman's example: 100 over demands 10, 40, 80: 10, then 45 each is more than 40, so
        // 40, and the last gets the remaining 50.
        assert_eq!(max_min_fair(100, &[10, 40, 80]), vec![10, 40, 50]);
        assert_eq!(max_min_fair(100, &[80, 80, 80]), vec![34, 33, 33]);
        assert_eq!(max_min_fair(100, &[1, 2, 3]), vec![1, 2, 3]);
        assert_eq!(max_min_fair(0, &[5, 5]), vec![0, 0]);
        assert_eq!(max_min_fair(7, &[]), Vec::<u64>::new());
    }

    /// The reference: water-filling one unit at a time, each to the claimant with the least so
    /// far among those still short of their demand (the definition of max-min fairness).
    fn brute_force(capacity: u64, demands: &[u64]) -> Vec<u64> {
        let mut out = vec![0u64; demands.len()];
        for _ in 0..capacity {
            let short = (0..demands.len())
                .filter(|&i| out[i] < demands[i])
                .min_by_key(|&i| out[i]);
            match short {
                Some(i) => out[i] += 1,
                None => break,
            }
        }
        out
    }

    proptest! {
        /// The same split as water-filling, up to which claimants get the remainder's units:
        /// every claimant within one unit of the reference, and the same parts in all.
        #[test]
        fn matches_the_brute_force_reference(
            capacity in 0u64..600,
            demands in proptest::collection::vec(0u64..300, 0..12),
        ) {
            let fast = max_min_fair(capacity, &demands);
            let slow = brute_force(capacity, &demands);
            prop_assert_eq!(fast.iter().sum::<u64>(), slow.iter().sum::<u64>());
            for i in 0..demands.len() {
                prop_assert!(fast[i].abs_diff(slow[i]) <= 1, "{i}: {fast:?} vs {slow:?}");
            }
            let (mut f, mut s) = (fast.clone(), slow.clone());
            f.sort_unstable();
            s.sort_unstable();
            prop_assert_eq!(f, s, "the same parts, whoever gets the remainder's units");
        }

        #[test]
        fn never_more_than_asked_or_than_the_capacity_and_nothing_wasted(
            capacity in 0u64..10_000,
            demands in proptest::collection::vec(0u64..5_000, 0..20),
        ) {
            let out = max_min_fair(capacity, &demands);
            let total: u64 = out.iter().sum();
            prop_assert!(total <= capacity);
            for (o, d) in out.iter().zip(&demands) {
                prop_assert!(o <= d);
            }
            let asked: u64 = demands.iter().sum();
            prop_assert_eq!(total, asked.min(capacity), "the capacity is given out when asked for");
            // Fairness: a claimant that got less than it asked got at least as much as anyone,
            // less one unit of rounding.
            for (i, (&o, &d)) in out.iter().zip(&demands).enumerate() {
                if o < d {
                    for (j, &other) in out.iter().enumerate() {
                        prop_assert!(other <= o + 1, "{i} short with {o} while {j} has {other}");
                    }
                }
            }
        }
    }
}
