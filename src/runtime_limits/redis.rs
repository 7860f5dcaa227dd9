//! Runtime limits shared by replicas through Redis (BACKEND_TYPE=redis; docs/runtime-limits.md).
//!
//! Redis holds every runtime limit in one hash, field [`Replicated::key`], value the change as
//! JSON (a removal too, its `limit` null, for a day), and a log of changes in a stream. A change
//! made through a replica's API is written with [`WRITE`], which keeps the hash's entry only if
//! the change's stamp is later than the one there and appends it to the log, in one step. Each
//! replica loads the hash at start and then reads the log every
//! SLUICE_RUNTIME_LIMITS_POLL_MS, applying each change (the later stamp wins, as between peers);
//! a replica whose place in the log was trimmed away (it was cut off for 100,000 changes)
//! loads the hash again. So every replica holds a change within one poll of Redis taking it.
//! Its first load of the hash is its readiness ([`RedisLimits::loaded`]); a read that fails is
//! logged at warn (at most one line per [`READ_FAILURE_LOG`]) and tried again at the next poll.
//!
//! Keys: `CACHE_KEY_PREFIX + "sluice:{runtime}:limits"` and `... + "sluice:{runtime}:log"`
//! (one hash slot, for Redis Cluster).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::config::ConfigHandle;
use crate::config::runtime::{Applied, Replicated, TOMBSTONE_LIFE_US};
use crate::store::redis::RedisConfig;
use crate::store::{RedisLink, StoreError};

use super::{Settling, Sink};

/// Keeps a change unless the hash holds a later one for its path, then logs it. KEYS: the hash,
/// the log; ARGV: the field, the change as JSON, its time, its origin, the log's length.
/// Answers 1 when kept, 0 when the hash held a later change.
pub(crate) const WRITE: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local c = cjson.decode(cur)
  local at, origin = tonumber(c.at_us) or 0, c.origin or ''
  local mine = tonumber(ARGV[3])
  if at > mine or (at == mine and origin >= ARGV[4]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'c', ARGV[2])
return 1
"#;

/// The log's length: a replica cut off for more changes than this loads the hash again.
const LOG_LENGTH: usize = 100_000;

/// Changes read from the log per call, and fields per HSCAN.
const READ_COUNT: usize = 1000;

/// At most one warning per this while the shared limits cannot be read (a poll every 250 ms
/// while Redis is down would otherwise log four lines a second).
const READ_FAILURE_LOG: Duration = Duration::from_secs(10);

/// Redis has the change before the API answers (the other replicas read it within their poll).
impl Sink for RedisLimits {
    fn settled<'a>(&'a self, _: u64, change: &'a Replicated) -> Settling<'a> {
        Box::pin(async move {
            self.write(change).await?;
            Ok(Vec::new())
        })
    }
}

/// Runtime limits shared through Redis.
pub(crate) struct RedisLimits {
    redis: RedisLink,
    hash: String,
    log: String,
    write_sha: String,
    config: ConfigHandle,
    /// Whether the hash has been loaded once (readiness).
    loaded: tokio::sync::watch::Sender<bool>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for RedisLimits {
    fn drop(&mut self) {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = task {
            t.abort();
        }
    }
}

impl RedisLimits {
    /// Connects (in the background) and starts reading the shared limits every `poll`. Inside
    /// a tokio runtime.
    pub(crate) fn start(
        settings: &RedisConfig,
        prefix: &str,
        config: ConfigHandle,
        poll: Duration,
    ) -> Result<Arc<Self>, StoreError> {
        let (hash, log) = crate::key::runtime_limit_keys(prefix);
        let limits = Arc::new(RedisLimits {
            redis: RedisLink::start("runtime_limits", settings, &[WRITE])?,
            hash,
            log,
            write_sha: redis::Script::new(WRITE).get_hash().to_owned(),
            config,
            loaded: tokio::sync::watch::Sender::new(false),
            task: std::sync::Mutex::new(None),
        });
        let weak = Arc::downgrade(&limits);
        let task = tokio::spawn(async move {
            // The last log entry applied; `None` until the hash is loaded.
            let mut last: Option<String> = None;
            let mut tick = tokio::time::interval(poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let failures = crate::telemetry::LogLimiter::new(READ_FAILURE_LOG);
            loop {
                tick.tick().await;
                let Some(limits) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = limits.follow(&mut last).await
                    && let Some(suppressed) = failures.check()
                {
                    tracing::warn!(error = %e, suppressed, "cannot read the shared runtime limits from Redis; trying again at the next poll");
                }
            }
        });
        *limits.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(limits)
    }

    /// Whether the shared limits have been loaded once, now and at every change.
    pub(crate) fn loaded(&self) -> tokio::sync::watch::Receiver<bool> {
        self.loaded.subscribe()
    }

    /// Writes a change made here; `Err` when Redis did not take it.
    pub(crate) async fn write(&self, change: &Replicated) -> Result<(), StoreError> {
        let json = serde_json::to_string(change).map_err(|e| StoreError::Backend {
            message: format!("the change as JSON: {e}"),
        })?;
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(&self.write_sha)
            .arg(2)
            .arg(&self.hash)
            .arg(&self.log)
            .arg(change.key())
            .arg(&json)
            .arg(change.at_us)
            .arg(&change.origin)
            .arg(LOG_LENGTH);
        self.redis.run(&pipe).await?;
        Ok(())
    }

    /// One poll: the hash first if needed, then the log after `last`.
    async fn follow(&self, last: &mut Option<String>) -> Result<(), StoreError> {
        let Some(after) = last.clone() else {
            // Where the log ends before the hash is read: changes after it are read next.
            let end = self.log_end().await?;
            let n = self.load_hash().await?;
            tracing::info!(limits = n, "runtime limits loaded from Redis");
            *last = Some(end);
            self.loaded
                .send_if_modified(|l| !std::mem::replace(l, true));
            return Ok(());
        };
        let mut pipe = redis::pipe();
        pipe.cmd("XRANGE")
            .arg(&self.log)
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(READ_COUNT);
        pipe.cmd("XRANGE")
            .arg(&self.log)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1);
        let answer = self.redis.run(&pipe).await?;
        let entries = stream_entries(answer.first());
        let first = stream_entries(answer.get(1)).into_iter().next();
        if after != "0-0" && first.is_some_and(|(id, _)| id_after(&id, &after)) {
            // The log was trimmed past this replica's place: load everything again.
            *last = None;
            return Ok(());
        }
        let changes = parsed(entries.iter().map(|(_, json)| json.as_str()));
        if let Some((id, _)) = entries.last() {
            *last = Some(id.clone());
        }
        self.apply(&changes);
        Ok(())
    }

    /// The id of the log's last entry, `0-0` when it is empty.
    async fn log_end(&self) -> Result<String, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("XREVRANGE")
            .arg(&self.log)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
        let answer = self.redis.run(&pipe).await?;
        Ok(stream_entries(answer.first())
            .into_iter()
            .next()
            .map_or_else(|| "0-0".to_owned(), |(id, _)| id))
    }

    /// Applies every change the hash holds, and forgets removals older than a day.
    async fn load_hash(&self) -> Result<usize, StoreError> {
        let mut cursor = "0".to_owned();
        let mut changes = Vec::new();
        loop {
            let mut pipe = redis::pipe();
            pipe.cmd("HSCAN")
                .arg(&self.hash)
                .arg(&cursor)
                .arg("COUNT")
                .arg(READ_COUNT);
            let answer = self.redis.run(&pipe).await?;
            let (next, fields) = scan_page(answer.first());
            changes.extend(parsed(fields.iter().map(String::as_str)));
            if next == "0" {
                break;
            }
            cursor = next;
        }
        let n = changes.len();
        self.apply(&changes);
        self.forget_old_removals(&changes).await;
        Ok(n)
    }

    /// Removals older than a day leave the hash (a replica that missed them longer may bring
    /// the limit back: docs/runtime-limits.md).
    async fn forget_old_removals(&self, changes: &[Replicated]) {
        let newest = changes.iter().map(|c| c.at_us).max().unwrap_or(0);
        let horizon = newest.saturating_sub(TOMBSTONE_LIFE_US);
        let old: Vec<String> = changes
            .iter()
            .filter(|c| c.body.is_none() && c.at_us < horizon)
            .map(Replicated::key)
            .collect();
        if old.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("HDEL").arg(&self.hash).arg(&old);
        let _ = self.redis.run(&pipe).await;
    }

    fn apply(&self, changes: &[Replicated]) {
        if changes.is_empty() {
            return;
        }
        self.config.change(|s| {
            for c in changes {
                if let Applied::Refused(e) = s.apply(c) {
                    tracing::warn!(domain = %c.domain, error = %e, "a shared runtime limit is refused here");
                }
            }
        });
    }
}

/// The changes that parse; each that does not (written by something else than Sluice) is
/// logged at warn and skipped.
fn parsed<'a>(jsons: impl Iterator<Item = &'a str>) -> Vec<Replicated> {
    jsons
        .filter_map(|json| {
            serde_json::from_str(json)
                .map_err(|e| {
                    tracing::warn!(error = %e, "a shared runtime limit in Redis does not parse: skipped");
                })
                .ok()
        })
        .collect()
}

/// Whether stream id `a` comes after `b` (`ms-seq`).
fn id_after(a: &str, b: &str) -> bool {
    let parse = |id: &str| {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (
            ms.parse::<u64>().unwrap_or(0),
            seq.parse::<u64>().unwrap_or(0),
        )
    };
    parse(a) > parse(b)
}

/// The entries of an XRANGE answer: (id, the change's JSON).
fn stream_entries(v: Option<&Value>) -> Vec<(String, String)> {
    let Some(Value::Array(items)) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let id = text(pair.first()?)?;
            let Value::Array(fields) = pair.get(1)? else {
                return None;
            };
            Some((id, text(fields.get(1)?)?))
        })
        .collect()
}

/// An HSCAN answer: the next cursor and the values.
fn scan_page(v: Option<&Value>) -> (String, Vec<String>) {
    let Some(Value::Array(parts)) = v else {
        return ("0".to_owned(), Vec::new());
    };
    let cursor = parts
        .first()
        .and_then(text)
        .unwrap_or_else(|| "0".to_owned());
    let values = match parts.get(1) {
        Some(Value::Array(kv)) => kv.iter().skip(1).step_by(2).filter_map(text).collect(),
        _ => Vec::new(),
    };
    (cursor, values)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::id_after;

    #[test]
    fn stream_ids_order_by_time_then_sequence() {
        assert!(id_after("2-0", "1-9"));
        assert!(id_after("1-10", "1-9"));
        assert!(!id_after("1-9", "1-9"));
        assert!(!id_after("0-0", "1-0"));
    }
}
