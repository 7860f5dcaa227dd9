//! This process's resident memory, for the programs that measure what counters cost
//! (`counter_memory`, `key_flood`, the `scale_*` sweeps).

/// VmRSS in bytes (0 where /proc is not available).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
