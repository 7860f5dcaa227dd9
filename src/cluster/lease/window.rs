//! A lease's arithmetic over its quota, shared by the lease's server, client, free shares and
//! parent: which counter a quota counts in, whether it is leased by windows (an allowance) or
//! as a bucket (a share), its window at an instant, and its rate.

use std::time::Duration;

use crate::limiter::{Algorithm, CounterKind, Quota};

/// Whether two quotas count in one counter ([`CounterKind`]: the same algorithm, a bucket being
/// token or leaky alike, and the same window length), so that only their limit (rate, burst)
/// differs: the owner keeps one record for both, as forward mode's owner keeps one counter.
pub(crate) fn same_counter(a: &Quota, b: &Quota) -> bool {
    CounterKind::of_quota(a) == CounterKind::of_quota(b)
}

/// Whether `quota` counts in windows (its lease is an allowance) rather than a bucket (a share).
pub(crate) fn is_window(quota: &Quota) -> bool {
    matches!(
        quota.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    )
}

/// The lease epoch at `now_us`: the window index for windows, 0 for buckets.
pub(crate) fn epoch_of(quota: &Quota, now_us: u64) -> u64 {
    if is_window(quota) {
        window_index(quota, now_us)
    } else {
        0
    }
}

/// `quota`'s rate in hits per second, in thousandths (at least 1).
pub(crate) fn rate_milli(quota: &Quota) -> u64 {
    (u64::from(quota.requests_per_unit) * 1000 / quota.window().secs()).max(1)
}

/// The index of the window containing `now_us`.
pub(crate) fn window_index(quota: &Quota, now_us: u64) -> u64 {
    quota.window().index_us(now_us)
}

/// Microseconds from `now_us` to the end of its window.
pub(crate) fn window_left_us(quota: &Quota, now_us: u64) -> u64 {
    let window = quota.window();
    window
        .end_us(window.index_us(now_us))
        .saturating_sub(now_us)
        .max(1)
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
