//! SLUICE_RUNTIME_LIMITS_PATH: the runtime limits of a node that keeps its counters in memory,
//! saved as one JSON object a line ([`Replicated`]:
//! `{"domain":..,"levels":[["k","v"],["k2",null]],"limit":{..},"at_us":..,"origin":..}`, a
//! `null` limit for a removal) and loaded at start, before the first request is answered.
//!
//! Two files: the file itself holds every limit and remembered removal as of its last
//! rewrite, and its journal ([`journal_path`], the same name with `.journal` after it) the
//! changes since, appended. [`Saver`] appends each batch of changes (as many as came during
//! the last write) and fsyncs it, then tells each change's caller it is on disk. When the
//! journal outgrows an eighth of the file (or [`JOURNAL_MIN_BYTES`], whichever is more), or a
//! write failed, or too many changes came at once ([`super::state::UNSAVED_MAX`]), it rewrites
//! the file instead: a temporary file beside it, fsync, rename over it, fsync of the directory, then the
//! journal emptied. Loading reads the file and then the journal and applies each path's latest
//! change (by its stamp, as replicas do), so a journal that a crash left behind a rewrite
//! changes nothing it should not; a last journal line cut short by a crash (never answered as
//! saved) is dropped with a warning.

use std::collections::hash_map::Entry;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::state::Applied;
use super::{Replicated, RuntimeLimit, RuntimeState};
use crate::config::ConfigHandle;
use crate::config::lookup::FastMap;

/// The largest file (and journal) read at start: far more than 1,000,000 limits take (about
/// 150 bytes each).
pub(crate) const MAX_FILE_BYTES: u64 = 1 << 30;

/// The journal is folded into the file once it is larger than an eighth of the file or this,
/// whichever is more: a load at 100,000 limits reads at most about 1.125 times the file (a
/// journal of 12,500 changes adds about 0.1 s to the start), and a change costs at most nine
/// lines' writes (its own, and a rewrite's share).
pub(crate) const JOURNAL_MIN_BYTES: u64 = 1 << 20;

/// The journal of the file at `path`: `path` with `.journal` after its name.
pub(crate) fn journal_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".journal");
    path.with_file_name(name)
}

/// What a load found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The runtime limits held after it.
    pub limits: usize,
    /// The changes read from the journal.
    pub journaled: usize,
    /// A last journal line cut short (a crash while it was written), dropped.
    pub torn: Option<String>,
}

/// Reads the file at `path` and its journal (none yet: no limits) and applies their changes
/// to `state`. A line that does not parse stops the load before any change applies (but a
/// journal's last line cut short, which is dropped); one the YAML's checks refuse stops it
/// there. Start-up stops on either, naming the file and line.
pub fn load(path: &Path, state: &mut RuntimeState) -> Result<Loaded, String> {
    let journal = journal_path(path);
    let files = [path, journal.as_path()];
    // Where a line is, named only for an error: which file, which line.
    let at = |(file, i): (usize, usize)| format!("{}:{}", files[file].display(), i + 1);
    let mut loaded = Loaded::default();
    let mut staged = Vec::new();
    for (file, name) in files.iter().enumerate() {
        let Some(text) = read(name)? else { continue };
        let is_journal = file == 1;
        let lines: Vec<_> = text.lines().enumerate().collect();
        for &(i, line) in &lines {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Replicated>(line) {
                Ok(change) => {
                    loaded.journaled += usize::from(is_journal);
                    staged.push(((file, i), change));
                }
                // Cut short by a crash: the last line, with no newline after it.
                Err(_) if is_journal && i + 1 == lines.len() && !text.ends_with('\n') => {
                    loaded.torn = Some(at((file, i)));
                }
                Err(e) => return Err(format!("{}: {e}", at((file, i)))),
            }
        }
    }
    for i in latest_of_each_path(&staged, loaded.journaled > 0) {
        let (line, change) = &staged[i];
        if let Applied::Refused(e) = state.apply(change) {
            return Err(format!("{}: {e}", at(*line)));
        }
    }
    loaded.limits = state.len();
    Ok(loaded)
}

/// A change's domain and levels, borrowed: what names its path.
type PathOf<'a> = (&'a str, &'a [(String, Option<String>)]);

/// The changes to apply, in their order: the later stamp wins in any order (`apply`), so only
/// each path's latest change, and a path in the file and the journal is checked and compiled
/// once. Without a journal, all of them: the file holds each path once.
fn latest_of_each_path<W>(staged: &[(W, Replicated)], journaled: bool) -> Vec<usize> {
    if !journaled {
        return (0..staged.len()).collect();
    }
    let mut latest: FastMap<PathOf<'_>, usize> = FastMap::default();
    for (i, (_, change)) in staged.iter().enumerate() {
        match latest.entry((change.domain.as_str(), change.levels.as_slice())) {
            Entry::Vacant(e) => {
                e.insert(i);
            }
            Entry::Occupied(mut e) => {
                if change.stamp() >= staged[*e.get()].1.stamp() {
                    e.insert(i);
                }
            }
        }
    }
    let mut winners: Vec<usize> = latest.into_values().collect();
    winners.sort_unstable();
    winners
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

/// Changes as the file's lines.
fn lines<'a>(
    changes: impl Iterator<Item = std::borrow::Cow<'a, Replicated>>,
) -> std::io::Result<String> {
    let mut text = String::new();
    for change in changes {
        text.push_str(&serde_json::to_string(&*change).map_err(std::io::Error::other)?);
        text.push('\n');
    }
    Ok(text)
}

/// Writes `limits` and `removals` to `path` atomically: a temporary file, fsync, rename, fsync
/// of the directory; the bytes written.
pub fn save(
    path: &Path,
    limits: &[(String, Arc<RuntimeLimit>)],
    removals: &[Replicated],
) -> std::io::Result<u64> {
    let set = limits
        .iter()
        .map(|(domain, r)| std::borrow::Cow::Owned(Replicated::of(domain, r)));
    let text = lines(set.chain(removals.iter().map(std::borrow::Cow::Borrowed)))?;
    let dir = directory(path);
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(text.len() as u64)
}

fn directory(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The file and its journal as the saver writes them.
#[derive(Debug)]
struct Files {
    path: PathBuf,
    journal: PathBuf,
    /// The file's size at its last rewrite.
    file_bytes: u64,
    /// The journal's size: what was appended since.
    journal_bytes: u64,
    /// The journal, open for appending.
    open: Option<std::fs::File>,
    /// [`JOURNAL_MIN_BYTES`], but in tests.
    min_journal: u64,
}

impl Files {
    fn new(path: &Path) -> Files {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let journal = journal_path(path);
        Files {
            path: path.to_owned(),
            file_bytes: size(path),
            journal_bytes: size(&journal),
            journal,
            open: None,
            min_journal: JOURNAL_MIN_BYTES,
        }
    }

    /// Whether `more` bytes appended would make the journal outgrow the file.
    fn outgrown(&self, more: u64) -> bool {
        self.journal_bytes + more > (self.file_bytes / 8).max(self.min_journal)
    }

    /// Appends `text` to the journal and fsyncs it (and, when it made the journal, the
    /// directory).
    fn append(&mut self, text: &str) -> std::io::Result<()> {
        let file = match &mut self.open {
            Some(file) => file,
            None => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.journal)?;
                std::fs::File::open(directory(&self.path))?.sync_all()?;
                self.open.insert(file)
            }
        };
        file.write_all(text.as_bytes())?;
        file.sync_data()?;
        self.journal_bytes += text.len() as u64;
        Ok(())
    }

    /// Rewrites the file with `limits` and `removals`, then empties the journal.
    fn rewrite(
        &mut self,
        limits: &[(String, Arc<RuntimeLimit>)],
        removals: &[Replicated],
    ) -> std::io::Result<()> {
        self.open = None;
        self.file_bytes = save(&self.path, limits, removals)?;
        std::fs::File::create(&self.journal)?.sync_all()?;
        self.journal_bytes = 0;
        Ok(())
    }

    /// Saves what changed in `config` since the last save: `taken`, the changes taken then,
    /// appended, unless a rewrite is due (`rewrite`, no changes kept, or the journal outgrown).
    /// The last change saved.
    fn save(
        &mut self,
        config: &ConfigHandle,
        (sequence, taken): (u64, Option<Vec<Replicated>>),
        rewrite: bool,
    ) -> std::io::Result<u64> {
        if let Some(taken) = taken.filter(|_| !rewrite) {
            let text = lines(taken.iter().map(std::borrow::Cow::Borrowed))?;
            if !self.outgrown(text.len() as u64) {
                self.append(&text)?;
                return Ok(sequence);
            }
        }
        // Everything as it is now, so the changes kept meanwhile are in it too.
        let (sequence, limits, removals) = config.runtime(|s| {
            let _ = s.take_changes();
            (s.sequence(), s.all(), s.removals())
        });
        self.rewrite(&limits, &removals)?;
        Ok(sequence)
    }
}

/// What is on disk: the last change saved, and the last save's error, with the change it
/// tried to save.
#[derive(Clone, Debug, Default)]
struct Saved {
    sequence: u64,
    error: Option<(u64, Arc<std::io::Error>)>,
}

/// Why a change is not saved when its caller is answered.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The save that should have held it failed.
    #[error("{}: {cause}", path.display())]
    Failed {
        path: PathBuf,
        cause: Arc<std::io::Error>,
    },
    /// No save held it within [`SAVE_WAIT`].
    #[error("{}: not saved within {waited:?}", path.display())]
    Late { path: PathBuf, waited: Duration },
}

/// Saves the runtime limits after every change, in the background.
#[derive(Debug)]
pub(crate) struct Saver {
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
    pub(crate) fn spawn(
        config: ConfigHandle,
        path: PathBuf,
    ) -> (Arc<Saver>, tokio::task::JoinHandle<()>) {
        let sequence = config.runtime(|s| {
            s.keep_changes();
            s.sequence()
        });
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
        let mut files = Files::new(&self.path);
        // A journal left from before is already loaded: fold it into the file first (which
        // also drops a last line cut short, that an append would otherwise run on from).
        let mut rewrite = files.journal_bytes > 0;
        loop {
            let taken = config.runtime(|s| (s.sequence(), s.take_changes()));
            let unsaved = taken.0;
            if unsaved > self.saved.borrow().sequence || rewrite {
                let write = {
                    let config = config.clone();
                    tokio::task::spawn_blocking(move || {
                        let saved = files.save(&config, taken, rewrite);
                        (files, saved)
                    })
                };
                let failure = match write.await {
                    Ok((back, saved)) => {
                        files = back;
                        saved.map_err(Arc::new)
                    }
                    Err(e) => {
                        files = Files::new(&self.path);
                        Err(Arc::new(std::io::Error::other(e)))
                    }
                };
                match failure {
                    Ok(sequence) => {
                        rewrite = false;
                        self.saved.send_replace(Saved {
                            sequence,
                            error: None,
                        });
                    }
                    Err(e) => {
                        tracing::error!(path = %self.path.display(), error = %e, "cannot save the runtime limits; trying again in a second");
                        // What was taken is not saved (and a line may be half written):
                        // the next save rewrites everything.
                        rewrite = true;
                        self.saved
                            .send_modify(|s| s.error = Some((unsaved, e.clone())));
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
    pub(crate) async fn settled(&self, sequence: u64) -> Result<(), SaveError> {
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
        let path = self.path.clone();
        Err(match now.error {
            Some((_, cause)) => SaveError::Failed { path, cause },
            None => SaveError::Late {
                path,
                waited: SAVE_WAIT,
            },
        })
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
        let limits = |l: Result<Loaded, String>| l.map(|l| l.limits);
        assert_eq!(limits(load(&path, &mut state)), Ok(0), "no file yet");
        let body = json!({"unit": "minute", "requests_per_unit": 2});
        let me: Arc<str> = "n1".into();
        let path_d = [("tenant", Some("a b/c")), ("path", None)];
        state.put("d", &path_d, body.clone(), (7, &me)).unwrap();
        let unlimited = json!({"unlimited": true});
        state
            .put("e", &[("k", Some("v"))], unlimited, (8, &me))
            .unwrap();
        save(&path, &state.all(), &state.removals()).unwrap();
        let mut back = RuntimeState::default();
        assert_eq!(limits(load(&path, &mut back)), Ok(2));
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
            limits(load(&path, &mut bad)),
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

    fn put(config: &ConfigHandle, value: &str, n: u64, at_us: u64) {
        let me: Arc<str> = "n1".into();
        let body = json!({"unit": "minute", "requests_per_unit": n});
        config
            .change(|s| s.put("d", &[("k", Some(value))], body, (at_us, &me)))
            .unwrap();
    }

    fn taken(config: &ConfigHandle) -> (u64, Option<Vec<Replicated>>) {
        config.runtime(|s| (s.sequence(), s.take_changes()))
    }

    /// The limits a fresh node loads from `path`: value and requests per unit, sorted.
    fn loaded(path: &Path) -> Result<(Vec<(String, u64)>, Loaded), String> {
        let mut state = RuntimeState::default();
        let loaded = load(path, &mut state)?;
        let mut held: Vec<_> = state
            .all()
            .iter()
            .map(|(_, r)| {
                let value = r.levels[0].1.as_deref().unwrap_or_default().to_owned();
                (value, r.body["requests_per_unit"].as_u64().unwrap())
            })
            .collect();
        held.sort();
        Ok((held, loaded))
    }

    fn held(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
        pairs.iter().map(|(v, n)| ((*v).to_owned(), *n)).collect()
    }

    /// Changes are appended to the journal, the file untouched, and load back after the file,
    /// removals included; once the journal outgrows the file, the file is rewritten and the
    /// journal emptied. A journal that a crash left behind a rewrite changes nothing (its
    /// changes are older than the file's); a last line cut short is dropped; a bad line
    /// elsewhere stops the load, naming the journal and line.
    #[test]
    fn changes_go_to_the_journal_until_it_outgrows_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        let journal = journal_path(&path);
        assert_eq!(journal, dir.path().join("limits.json.journal"));
        let config = ConfigHandle::new(None);
        config.runtime(RuntimeState::keep_changes);
        let mut files = Files::new(&path);

        put(&config, "a", 1, 10);
        put(&config, "b", 2, 11);
        assert_eq!(files.save(&config, taken(&config), false).unwrap(), 2);
        assert!(!path.exists(), "the file is not rewritten for a change");
        let first = std::fs::read_to_string(&journal).unwrap();
        assert_eq!(first.lines().count(), 2);
        let (limits, l) = loaded(&path).unwrap();
        assert_eq!(limits, held(&[("a", 1), ("b", 2)]));
        assert_eq!((l.journaled, l.torn), (2, None));

        let me: Arc<str> = "n1".into();
        config
            .change(|s| s.remove("d", &[("k", Some("a"))], (12, &me)))
            .unwrap();
        assert_eq!(files.save(&config, taken(&config), false).unwrap(), 3);
        assert_eq!(loaded(&path).unwrap().0, held(&[("b", 2)]));

        // Outgrown: the file rewritten with the limits and the removal, the journal emptied.
        files.min_journal = 0;
        put(&config, "c", 3, 13);
        assert_eq!(files.save(&config, taken(&config), false).unwrap(), 4);
        assert_eq!(std::fs::read_to_string(&journal).unwrap(), "");
        let file = std::fs::read_to_string(&path).unwrap();
        assert_eq!(file.lines().count(), 3, "{file}");
        assert!(
            file.contains(r#""levels":[["k","a"]],"limit":null,"at_us":12"#),
            "{file}"
        );
        let (limits, l) = loaded(&path).unwrap();
        assert_eq!(limits, held(&[("b", 2), ("c", 3)]));
        assert_eq!(l.journaled, 0);

        // A crash between the rename and emptying the journal: `a`'s set (at 10) is older
        // than its removal in the file (at 12), so `a` stays removed.
        std::fs::write(&journal, &first).unwrap();
        let (limits, l) = loaded(&path).unwrap();
        assert_eq!(limits, held(&[("b", 2), ("c", 3)]));
        assert_eq!(l.journaled, 2);

        // A crash while a line was written: dropped, named.
        let cut = &first[..first.find('\n').unwrap() / 2];
        std::fs::write(&journal, format!("{first}{cut}")).unwrap();
        let (limits, l) = loaded(&path).unwrap();
        assert_eq!(limits, held(&[("b", 2), ("c", 3)]));
        assert_eq!(l.torn, Some(format!("{}:3", journal.display())));

        std::fs::write(&journal, format!("{cut}\n{first}")).unwrap();
        let err = loaded(&path).unwrap_err();
        assert!(
            err.starts_with(&format!("{}:1: ", journal.display())),
            "{err}"
        );
    }

    /// More changes between two saves than are kept: the next save rewrites the file, with
    /// every change in it.
    #[test]
    fn too_many_changes_at_once_rewrite_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits.json");
        let config = ConfigHandle::new(None);
        config.runtime(RuntimeState::keep_changes);
        let mut files = Files::new(&path);
        let n = crate::config::runtime::state::UNSAVED_MAX as u64 + 1;
        for i in 0..n {
            put(&config, &format!("t{i}"), 1, i);
        }
        let (sequence, changes) = taken(&config);
        assert!(changes.is_none(), "the changes overflowed");
        assert_eq!(files.save(&config, (sequence, changes), false).unwrap(), n);
        assert!(!journal_path(&path).exists() || files.journal_bytes == 0);
        assert_eq!(loaded(&path).unwrap().0.len() as u64, n);
        assert_eq!(
            taken(&config).1,
            Some(Vec::new()),
            "kept again after the take"
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
