//! A key's attempted demand, measured where hits are decided locally from a batch granted by a
//! remote authority: the lease client (its owner grants), the lease parent link (its parent
//! cluster grants) and Redis allowances (Redis grants). Each counts the hits asked for, admitted
//! or refused (Ably's lesson: admitted traffic hides the demand a limit refuses), closes a sample
//! now and then, and keeps a rate that halves the weight of the past at each sample. What it
//! needs until the next grant can arrive is that rate times the lead ([`hits_within`]).

/// The shortest span a sample is taken over (µs): a burst's rate is still seen within a few
/// samples, and two hits close together (an acquire to this node's own lease server takes no
/// hop) are no rate of a million a second.
pub(crate) const MIN_SAMPLE_US: u64 = 10_000;

/// Hits asked for since the last sample, when it closed, and the smoothed rate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    attempted: u64,
    since_us: u64,
    /// Hits per second, in thousandths.
    milli: u64,
}

impl Demand {
    /// A demand first estimated at `milli` (hits per second, thousandths), sampled from `now_us`.
    pub(crate) fn new(now_us: u64, milli: u64) -> Self {
        Demand {
            attempted: 0,
            since_us: now_us,
            milli,
        }
    }

    /// Counts `hits` asked for.
    pub(crate) fn attempt(&mut self, hits: u64) {
        self.attempted = self.attempted.saturating_add(hits);
    }

    /// The smoothed rate: hits per second, in thousandths.
    pub(crate) fn milli(&self) -> u64 {
        self.milli
    }

    /// Hits asked for since the last sample closed.
    pub(crate) fn attempted(&self) -> u64 {
        self.attempted
    }

    /// When the last sample closed (µs).
    pub(crate) fn since_us(&self) -> u64 {
        self.since_us
    }

    /// Closes the sample at `now_us`, as a report to a granting authority does: any span with
    /// hits, or one of a millisecond or more without, counts as at least [`MIN_SAMPLE_US`] long.
    /// Returns the rate.
    pub(crate) fn report(&mut self, now_us: u64) -> u64 {
        let elapsed = now_us.saturating_sub(self.since_us);
        if elapsed > 0 && (self.attempted > 0 || elapsed >= 1_000) {
            self.fold(elapsed.max(MIN_SAMPLE_US));
        }
        self.attempted = 0;
        self.since_us = now_us;
        self.milli
    }

    /// Counts `hits` asked for at `now_us`, and closes the sample once it spans `min_span_us`
    /// (the caller's choice: [`MIN_SAMPLE_US`] for a call, longer for a look that brings none).
    pub(crate) fn sample(&mut self, now_us: u64, hits: u64, min_span_us: u64) {
        self.attempt(hits);
        let span = now_us.saturating_sub(self.since_us);
        if span >= min_span_us && span > 0 {
            self.fold(span);
            self.attempted = 0;
            self.since_us = now_us;
        }
    }

    /// The hits this demand asks for within `us` microseconds, rounded up: what to hold.
    pub(crate) fn within(&self, us: u64) -> u64 {
        hits_within(self.milli, us)
    }

    /// The whole hits this demand asks for within `us` microseconds (rounded down): whether a
    /// key is hot (Redis allowances: at least `hot_hits` of them over the horizon) or idle (none).
    pub(crate) fn whole_within(&self, us: u64) -> u64 {
        let hits = u128::from(self.milli) * u128::from(us) / 1_000_000_000;
        u64::try_from(hits).unwrap_or(u64::MAX)
    }

    /// Averages the rate of the hits attempted over `span_us` with the previous estimate.
    fn fold(&mut self, span_us: u64) {
        let rate = u128::from(self.attempted) * 1_000_000_000 / u128::from(span_us);
        let rate = u64::try_from(rate).unwrap_or(u64::MAX);
        self.milli = self.milli / 2 + rate / 2;
    }
}

/// The hits a demand of `milli` (hits per second, thousandths) asks for within `us`
/// microseconds, rounded up: what to hold until the next grant can arrive.
pub(crate) fn hits_within(milli: u64, us: u64) -> u64 {
    let hits = (u128::from(milli) * u128::from(us)).div_ceil(1_000_000_000);
    u64::try_from(hits).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_averages_the_sample_with_the_past_over_at_least_the_minimum_span() {
        let mut d = Demand::new(0, 0);
        d.attempt(100);
        // 100 hits over 1 s: 100/s, averaged with 0.
        assert_eq!(d.report(1_000_000), 50_000);
        d.attempt(100);
        assert_eq!(d.report(2_000_000), 75_000);
        // Two hits 1 µs apart span MIN_SAMPLE_US: 200/s, not two million.
        d.attempt(2);
        assert_eq!(d.report(2_000_001), 75_000 / 2 + 100_000);
        assert_eq!((d.attempted(), d.since_us()), (0, 2_000_001));
    }

    #[test]
    fn a_report_within_a_millisecond_and_without_hits_keeps_the_rate() {
        let mut d = Demand::new(0, 8_000);
        assert_eq!(d.report(999), 8_000);
        assert_eq!(d.since_us(), 999);
        // A millisecond or more without hits halves it.
        assert_eq!(d.report(1_999), 4_000);
    }

    #[test]
    fn a_sample_closes_only_once_it_spans_the_minimum() {
        let mut d = Demand::new(0, 0);
        d.sample(5_000, 10, MIN_SAMPLE_US);
        assert_eq!((d.milli(), d.attempted()), (0, 10));
        d.sample(10_000, 10, MIN_SAMPLE_US);
        // 20 hits over 10 ms: 2,000/s, averaged with 0.
        assert_eq!(
            (d.milli(), d.attempted(), d.since_us()),
            (1_000_000, 0, 10_000)
        );
    }

    #[test]
    fn hits_within_rounds_up_and_saturates() {
        assert_eq!(hits_within(1_000, 1_000_000), 1);
        assert_eq!(hits_within(1_000, 1), 1);
        assert_eq!(hits_within(0, 1_000_000), 0);
        assert_eq!(hits_within(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(Demand::new(0, 2_500).within(2_000_000), 5);
        assert_eq!(Demand::new(0, 999).within(1_000_000), 1);
        assert_eq!(Demand::new(0, 999).whole_within(1_000_000), 0);
        assert_eq!(Demand::new(0, u64::MAX).whole_within(u64::MAX), u64::MAX);
    }
}
