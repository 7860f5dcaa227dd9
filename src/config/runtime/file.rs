//! SLUICE_RUNTIME_LIMITS_PATH: the runtime limits of a node that keeps its counters in memory,
//! saved as one JSON object a line ([`Replicated`]:
//! `{"domain":..,"levels":[["k","v"],["k2",null]],"limit":{..},"at_us":..,"origin":..}`) and
//! loaded at start, before the first request is answered.
//!
//! Every save writes the whole set to a temporary file beside the target, fsyncs it, renames it
//! over the target and fsyncs the directory: a crash leaves the old file or the new one, never a
//! mix. [`Saver`] saves after changes, as many changes in one write as came meanwhile, and tells
//! each change's caller when it is on disk.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::state::Rules;
use super::{Replicated, RuntimeLimit, RuntimeState};
use crate::config::ConfigHandle;

/// The largest file read at start: far more than 1,000,000 limits take (about 150 bytes each).
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Reads `path` (none yet: no limits) and sets its limits in `state`; the number loaded. A
/// line that does not parse stops the load before any limit is set; one the YAML's checks
/// refuse stops it there. Start-up stops on either, naming the file and line.
pub fn load(path: &Path, state: &mut RuntimeState) -> Result<usize, String> {
    let text = match read(path)? {
        Some(text) => text,
        None => return Ok(0),
    };
    let at = |i: usize| format!("{}:{}", path.display(), i + 1);
    let mut staged = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let line: Replicated = serde_json::from_str(line).map_err(|e| format!("{}: {e}", at(i)))?;
        staged.push((i, line));
    }
    let mut loaded = 0;
    for (i, line) in staged {
        let Some(body) = line.body.clone() else {
            return Err(format!("{}: a saved limit has no limit", at(i)));
        };
        state
            .put_as(&line.domain, &line.path(), body, Rules::Load, line.stamp())
            .map_err(|e| format!("{}: {e}", at(i)))?;
        loaded += 1;
    }
    Ok(loaded)
}

fn read(path: &Path) -> Result<Option<String>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut text = String::new();
    let read = std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
        &mut text,
    );
    read.map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{}: larger than {MAX_FILE_BYTES} bytes",
            path.display()
        ));
    }
    Ok(Some(text))
}

/// Writes `limits` to `path` atomically: a temporary file, fsync, rename, fsync of the directory.
pub fn save(path: &Path, limits: &[(String, Arc<RuntimeLimit>)]) -> std::io::Result<()> {
    let mut text = String::with_capacity(limits.len() * 128);
    for (domain, r) in limits {
        let line = Replicated::of(domain, r);
        text.push_str(&serde_json::to_string(&line).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// What is on disk: the last change saved, and the last save's error, with the change it
/// tried to save.
#[derive(Clone, Debug, Default)]
struct Saved {
    sequence: u64,
    error: Option<(u64, String)>,
}

/// Saves the runtime limits after every change, in the background.
#[derive(Debug)]
pub struct Saver {
    path: PathBuf,
    saved: tokio::sync::watch::Sender<Saved>,
}

/// How long a change's caller waits for its save before it is answered that it is not saved.
pub const SAVE_WAIT: Duration = Duration::from_secs(10);

/// How long a failed save waits before it tries again.
const RETRY: Duration = Duration::from_secs(1);

impl Saver {
    /// Saves `config`'s runtime limits to `path` whenever they change (its state as loaded
    /// counts as saved). Must be called within a tokio runtime; the task stops when the
    /// returned handle is aborted.
    pub fn spawn(config: ConfigHandle, path: PathBuf) -> (Arc<Saver>, tokio::task::JoinHandle<()>) {
        let sequence = config.runtime(RuntimeState::sequence);
        let saver = Arc::new(Saver {
            path,
            saved: tokio::sync::watch::Sender::new(Saved {
                sequence,
                error: None,
            }),
        });
        let task = tokio::spawn(Arc::clone(&saver).run(config));
        (saver, task)
    }

    async fn run(self: Arc<Self>, config: ConfigHandle) {
        let mut changes = config.changes();
        loop {
            let (sequence, limits) = config.runtime(|s| (s.sequence(), s.all()));
            if sequence > self.saved.borrow().sequence {
                let path = self.path.clone();
                let saved = tokio::task::spawn_blocking(move || save(&path, &limits)).await;
                let failure = match saved {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(e) => Some(e.to_string()),
                };
                match failure {
                    None => self.saved.send_replace(Saved {
                        sequence,
                        error: None,
                    }),
                    Some(e) => {
                        tracing::error!(path = %self.path.display(), error = %e, "cannot save the runtime limits; trying again in a second");
                        self.saved
                            .send_modify(|s| s.error = Some((sequence, e.clone())));
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                };
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until change `sequence` is saved: `Err` with the reason when a save that should
    /// have held it failed, or none came within [`SAVE_WAIT`].
    pub async fn settled(&self, sequence: u64) -> Result<(), String> {
        let mut rx = self.saved.subscribe();
        let done = |s: &Saved| {
            s.sequence >= sequence || s.error.as_ref().is_some_and(|(at, _)| *at >= sequence)
        };
        // Dropped at once: what `wait_for` answers holds the channel's read lock, and reading
        // the channel again under it waits behind a save waiting to publish, which waits for
        // that lock (every worker thread stuck, the node answering nothing).
        let _ = tokio::time::timeout(SAVE_WAIT, rx.wait_for(done)).await;
        let now = self.saved.borrow().clone();
        if now.sequence >= sequence {
            return Ok(());
        }
        match now.error {
            Some((_, e)) => Err(format!("{}: {e}", self.path.display())),
            None => Err(format!(
                "{}: not saved within {SAVE_WAIT:?}",
                self.path.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn saved_limits_load_back_and_a_bad_line_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        let mut state = RuntimeState::default();
        assert_eq!(load(&path, &mut state), Ok(0), "no file yet: no limits");
        let body = json!({"unit": "minute", "requests_per_unit": 2});
        let me: Arc<str> = "n1".into();
        let path_d = [("tenant", Some("a b/c")), ("path", None)];
        state.put("d", &path_d, body.clone(), (7, &me)).unwrap();
        let unlimited = json!({"unlimited": true});
        state
            .put("e", &[("k", Some("v"))], unlimited, (8, &me))
            .unwrap();
        save(&path, &state.all()).unwrap();
        let mut back = RuntimeState::default();
        assert_eq!(load(&path, &mut back), Ok(2));
        let cfg = back.compose().unwrap();
        let got = cfg
            .domain("d")
            .unwrap()
            .runtime_limit(&[("tenant", Some("a b/c")), ("path", None)])
            .unwrap();
        assert_eq!(got.body, body);
        assert_eq!(
            got.stamp,
            crate::config::runtime::Stamp {
                at_us: 7,
                origin: me
            }
        );
        assert!(!dir.path().join(".limits.json.tmp").exists());

        std::fs::write(
            &path,
            "{\"domain\":\"d\",\"levels\":[[\"k\",null]],\"limit\":{\"unit\":\"minute\"}}\n\n{\"domain\":\"d\",\"levels\":[[\"k\",\"v\"]],\"limit\":{\"unit\":\"fortnight\"}}\n",
        )
        .unwrap();
        let mut bad = RuntimeState::default();
        assert_eq!(
            load(&path, &mut bad),
            Err(format!(
                "{}:3: invalid rate limit unit 'fortnight'",
                path.display()
            ))
        );
        std::fs::write(&path, "{not json\n").unwrap();
        let err = load(&path, &mut RuntimeState::default()).unwrap_err();
        assert!(
            err.starts_with(&format!("{}:1: key must be a string", path.display())),
            "{err}"
        );
    }

    /// Many callers waiting for saves while the saver publishes them, on two worker threads as
    /// on a 2-core node: every wait ends. (`settled` once kept the channel's read lock from
    /// `wait_for` while it read the channel again; with the saver waiting to write in between,
    /// each waited for the other, and with both workers stuck the node answered nothing.)
    #[test]
    fn waiting_for_saves_never_blocks_the_saver() {
        const SAVES: u64 = 20_000;
        let saver = Arc::new(Saver {
            path: PathBuf::from("limits.json"),
            saved: tokio::sync::watch::Sender::new(Saved::default()),
        });
        let (finished, outcome) = std::sync::mpsc::channel();
        let waiting = Arc::clone(&saver);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let waiters: Vec<_> = (0..64)
                .map(|i| {
                    let saver = Arc::clone(&waiting);
                    rt.spawn(async move {
                        for sequence in (1 + i..=SAVES).step_by(64) {
                            saver.settled(sequence).await.unwrap();
                        }
                    })
                })
                .collect();
            for sequence in 1..=SAVES {
                waiting.saved.send_replace(Saved {
                    sequence,
                    error: None,
                });
            }
            rt.block_on(futures_util::future::join_all(waiters));
            let _ = finished.send(());
        });
        outcome
            .recv_timeout(Duration::from_secs(60))
            .expect("every wait for a save ended");
    }
}
