//! The config poller: which files changed, told by their metadata alone, and when a change is
//! still enough to load.
//!
//! Each poll lists the source and `stat`s every file (through symlinks). Only a file whose
//! [`Fingerprint`] changed is read again, so an unchanged directory costs a few `stat`s and no
//! reads. A change is loaded once nothing has changed for the settle period
//! ([`FileLimits::settle`]) and a second read of every changed file gives the bytes of the
//! first: a file written in place is loaded after its writer finishes, never half-written,
//! unless the writer pauses for longer than the settle period. Sizes are checked on metadata
//! before any read and again while reading.
//!
//! Why polling and not inotify (the `notify` crate): polling is needed anyway, for a
//! ConfigMap's `..data` symlink swap and for volumes that deliver no events (NFS, some
//! overlays); a notification would still need the settle period before loading; and polling
//! the metadata of a few files every 500 ms costs microseconds.
//!
//! The poller is synchronous and takes `now` as an argument, so tests drive it with made-up
//! instants. [`spawn_watcher`](super::spawn_watcher) runs it on a blocking thread every poll
//! interval, and `main` runs it at start-up ([`Poller::load_settled`]) until the files settle.

use super::load::{self, ConfigSource, FileLimits, Listed, LoadOptions};
use super::lookup::RateLimitConfig;
use super::{ConfigError, ConfigErrors};
use crate::clock;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How long [`Poller::load_settled`] waits for files that keep changing before giving up.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What tells a file's content apart without reading it: any write changes the size or the
/// modification time, a ConfigMap's `..data` swap or an editor's rename-over changes the inode,
/// and the change time catches a write whose modification time was set back (`touch -d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    dev: u64,
}

impl Fingerprint {
    pub(crate) fn of(meta: &fs::Metadata) -> Self {
        Fingerprint {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }

    /// The later of the modification and change times.
    fn last_change(&self) -> SystemTime {
        let at = |(secs, nanos): (i64, i64)| {
            let secs = u64::try_from(secs).unwrap_or(0);
            let nanos = u64::try_from(nanos).unwrap_or(0);
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos)
        };
        at(self.mtime).max(at(self.ctime))
    }
}

/// A file's content as last seen.
#[derive(Clone, Debug)]
enum Content {
    Bytes(Arc<[u8]>),
    /// Cannot be loaded while the fingerprint stays the same: too big, or unreadable.
    Refused(ConfigError),
    /// To be read at the next poll: the source was over its total size, or a confirming read
    /// found other bytes.
    Unread,
}

#[derive(Clone, Debug)]
struct Seen {
    path: PathBuf,
    fingerprint: Fingerprint,
    content: Content,
    /// Read since the last confirmation: read again, unchanged, before it is loaded.
    fresh: bool,
}

/// What a config is built from: every file's bytes, by name in load order, or every problem.
type Loadable = Result<Vec<(String, Arc<[u8]>)>, ConfigErrors>;

/// Watches one config source; see the module documentation.
#[derive(Clone, Debug)]
pub struct Poller {
    source: ConfigSource,
    opts: LoadOptions,
    limits: FileLimits,
    /// What the last poll saw, by config name.
    seen: BTreeMap<String, Seen>,
    /// Problems of the source as a whole at the last poll: listing, total size.
    source_errors: Vec<ConfigError>,
    /// When what the polls see last changed; `None` before the first poll.
    changed_at: Option<Instant>,
    /// Something changed that has not been compared with `applied` yet. Idle polls stop here:
    /// comparing the files' bytes every poll would cost a `memcmp` of the whole config.
    pending: bool,
    /// What the current config was last built from, or failed to build from: a change is
    /// loaded, or reported, once and not every poll.
    applied: Option<Loadable>,
    files_read: u64,
}

impl Poller {
    /// A poller that has seen nothing yet: its first settled poll loads the source.
    pub fn new(source: ConfigSource, opts: LoadOptions, limits: FileLimits) -> Self {
        Poller {
            source,
            opts,
            limits,
            seen: BTreeMap::new(),
            source_errors: Vec::new(),
            changed_at: None,
            pending: false,
            applied: None,
            files_read: 0,
        }
    }

    /// How many times a file was opened and read, confirming reads included.
    pub fn files_read(&self) -> u64 {
        self.files_read
    }

    /// Looks at the source once. `Some` when a change has settled and differs from what was
    /// last loaded (or failed to load): the config it builds, or every problem with it.
    pub fn poll(&mut self, now: Instant) -> Option<Result<RateLimitConfig, ConfigErrors>> {
        let first = self.changed_at.is_none();
        if self.observe() || first {
            self.changed_at = Some(if first { self.first_seen(now) } else { now });
            self.pending = true;
        }
        if !self.pending || self.settles_at().is_some_and(|at| now < at) {
            return None;
        }
        let loadable = self.loadable();
        if self.applied.as_ref() == Some(&loadable) {
            // A touch, or a change undone: what is loaded already has these bytes.
            self.seen.values_mut().for_each(|s| s.fresh = false);
            self.pending = false;
            return None;
        }
        if !self.confirm() {
            self.changed_at = Some(now);
            return None;
        }
        self.pending = false;
        self.applied = Some(loadable.clone());
        Some(loadable.and_then(|files| {
            load::parse_snapshot(
                files.iter().map(|(name, bytes)| (name.as_str(), &**bytes)),
                &self.opts,
            )
        }))
    }

    /// [`Poller::poll`] without the settle period: for SIGHUP, when the operator says the files
    /// are complete. Changed files are still read twice, and loaded only if both reads agree.
    pub(crate) fn poll_now(
        &mut self,
        now: Instant,
    ) -> Option<Result<RateLimitConfig, ConfigErrors>> {
        let settle = std::mem::take(&mut self.limits.settle);
        let polled = self.poll(now);
        self.limits.settle = settle;
        polled
    }

    /// Polls every `interval` (sooner when the settle period ends first) until the files
    /// settle, and returns what they load to: at start-up, so a file being written as Sluice
    /// starts is not loaded half-written. Files whose own timestamps are older than the
    /// settle period load at once. Gives up after [`START_TIMEOUT`] of continuous change.
    pub fn load_settled(&mut self, interval: Duration) -> Result<RateLimitConfig, ConfigErrors> {
        let start = clock::instant();
        loop {
            let now = clock::instant();
            if let Some(loaded) = self.poll(now) {
                return loaded;
            }
            if now.duration_since(start) >= START_TIMEOUT {
                return Err(ConfigError::new(
                    load::source_name(&self.source),
                    format!(
                        "error loading config: the files kept changing for {} s; not loading \
                         them half-written (SLUICE_CONFIG_SETTLE_MS={})",
                        START_TIMEOUT.as_secs(),
                        self.limits.settle.as_millis()
                    ),
                )
                .into());
            }
            let until_settled = self
                .settles_at()
                .map_or(interval, |at| at.saturating_duration_since(now));
            std::thread::sleep(until_settled.clamp(Duration::from_millis(1), interval));
        }
    }

    fn settles_at(&self) -> Option<Instant> {
        self.changed_at.map(|at| at + self.limits.settle)
    }

    /// The first poll's "last change": the files' own timestamps, so that files older than
    /// the settle period load at once and younger ones wait out the rest of it.
    fn first_seen(&self, now: Instant) -> Instant {
        let youngest = self
            .seen
            .values()
            .map(|s| s.fingerprint.last_change())
            .max();
        let age = match youngest {
            // A timestamp in the future (a clock set back, a network volume's skew) is young.
            Some(at) => clock::system_time()
                .duration_since(at)
                .unwrap_or(Duration::ZERO),
            None => self.limits.settle,
        };
        now.checked_sub(age.min(self.limits.settle)).unwrap_or(now)
    }

    /// Lists and `stat`s the source, reads the files whose fingerprint changed, and says
    /// whether anything differs from the last poll.
    fn observe(&mut self) -> bool {
        let listing = load::list_source(&self.source);
        let total = listing.total_bytes();
        let mut source_errors = listing.errors;
        let over_total = total > self.limits.max_total_bytes;
        if over_total {
            source_errors.push(load::source_too_big(
                &self.source,
                Some(total),
                &self.limits,
            ));
        }
        let mut changed = false;
        let mut seen = BTreeMap::new();
        // The bytes held for the files before this one, which the next read may not exceed.
        let mut held = 0u64;
        for file in listing.files {
            let fingerprint = Fingerprint::of(&file.meta);
            let prev = self.seen.remove(&file.name);
            changed |= prev.as_ref().is_none_or(|p| p.fingerprint != fingerprint);
            let entry = match prev {
                Some(p)
                    if p.fingerprint == fingerprint && !matches!(p.content, Content::Unread) =>
                {
                    p
                }
                _ => self.look(&file, fingerprint, over_total, held, &mut source_errors),
            };
            if let Content::Bytes(bytes) = &entry.content {
                held += bytes.len() as u64;
            }
            seen.insert(file.name, entry);
        }
        // Files read earlier that grew since are caught here, not only by the next listing.
        if held > self.limits.max_total_bytes && !over_total {
            source_errors.push(load::source_too_big(&self.source, None, &self.limits));
        }
        changed |= !self.seen.is_empty() || source_errors != self.source_errors;
        self.seen = seen;
        self.source_errors = source_errors;
        changed
    }

    /// Reads a new or changed file, unless its metadata or the source's total is over a cap.
    fn look(
        &mut self,
        file: &Listed,
        fingerprint: Fingerprint,
        over_total: bool,
        held: u64,
        source_errors: &mut Vec<ConfigError>,
    ) -> Seen {
        let limits = &self.limits;
        let content = if file.meta.len() > limits.max_file_bytes {
            Content::Refused(load::file_too_big(
                &file.name,
                Some(file.meta.len()),
                limits,
            ))
        } else if over_total {
            Content::Unread
        } else {
            let cap = limits
                .max_file_bytes
                .min(limits.max_total_bytes.saturating_sub(held));
            self.files_read += 1;
            match load::read_at_most(&file.path, cap) {
                Ok(bytes) if bytes.len() as u64 <= cap => Content::Bytes(bytes.into()),
                // It grew while being read: past the source's total, or past its own cap.
                Ok(_) if cap < limits.max_file_bytes => {
                    source_errors.push(load::source_too_big(&self.source, None, limits));
                    Content::Unread
                }
                Ok(_) => Content::Refused(load::file_too_big(&file.name, None, limits)),
                Err(e) => Content::Refused(e),
            }
        };
        Seen {
            path: file.path.clone(),
            fingerprint,
            content,
            fresh: true,
        }
    }

    /// What the seen files load to, or every problem with them (the source's first).
    fn loadable(&self) -> Loadable {
        let mut errors = self.source_errors.clone();
        let mut files = Vec::with_capacity(self.seen.len());
        for (name, seen) in &self.seen {
            match &seen.content {
                Content::Bytes(bytes) => files.push((name.clone(), Arc::clone(bytes))),
                Content::Refused(e) => errors.push(e.clone()),
                // Only while the source is over its total, which `source_errors` reports.
                Content::Unread => {}
            }
        }
        if errors.is_empty() {
            Ok(files)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Reads every freshly read file again: the change is still only if each has the same
    /// fingerprint and the same bytes. This catches a write that left no trace in the metadata:
    /// the same size, within one tick of the file system's timestamp clock.
    fn confirm(&mut self) -> bool {
        let mut still = true;
        for seen in self.seen.values_mut().filter(|s| s.fresh) {
            let Content::Bytes(first) = &seen.content else {
                seen.fresh = false;
                continue;
            };
            let same_meta =
                fs::metadata(&seen.path).is_ok_and(|m| Fingerprint::of(&m) == seen.fingerprint);
            if !same_meta {
                // The next poll sees the new fingerprint and reads the file again.
                still = false;
                continue;
            }
            self.files_read += 1;
            // One byte more than the first read is enough to tell a longer file.
            match load::read_at_most(&seen.path, first.len() as u64) {
                Ok(again) if *again == **first => seen.fresh = false,
                _ => {
                    seen.content = Content::Unread;
                    still = false;
                }
            }
        }
        still
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Rule;
    use crate::descriptor::Entry;

    fn yaml(rpu: u32) -> String {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
        )
    }

    fn rpu(cfg: &RateLimitConfig) -> u32 {
        let m = cfg
            .domain("d")
            .and_then(|d| d.lookup(&[Entry::new("k", "v")]));
        match m.map(|m| &m.limit.rule) {
            Some(Rule::Limited(blocks)) => blocks[0].quota.requests_per_unit,
            _ => panic!("no limit"),
        }
    }

    #[test]
    fn a_rewrite_invisible_in_the_metadata_is_caught_by_the_confirming_read() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("limits.yaml");
        fs::write(&path, yaml(1)).expect("write");
        let limits = FileLimits::default();
        let mut poller = Poller::new(
            ConfigSource::Path(tmp.path().to_owned()),
            LoadOptions::default(),
            limits,
        );
        let t0 = crate::clock::instant();
        assert!(poller.poll(t0).is_none(), "just written");

        // The same size, in place, within one tick of a coarse timestamp clock: the metadata
        // looks as it did when the first bytes were read.
        fs::write(&path, yaml(2)).expect("rewrite");
        let now = Fingerprint::of(&fs::metadata(&path).expect("stat"));
        poller
            .seen
            .get_mut("limits.yaml")
            .expect("seen")
            .fingerprint = now;

        assert!(
            poller.poll(t0 + limits.settle).is_none(),
            "the second read differs: not still yet"
        );
        let cfg = poller
            .poll(t0 + limits.settle * 2)
            .expect("settled")
            .expect("loads");
        assert_eq!(rpu(&cfg), 2);
    }
}
