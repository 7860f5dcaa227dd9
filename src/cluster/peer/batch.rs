//! Apply calls batched per peer, with no timer: one task per peer sends the forwards queued for
//! it as one call at once when no call to that peer is in flight. While one is, the forwards
//! that arrive wait for a call to come back and then leave together: calls in flight make the
//! batches, as in Nagle-free RPC batchers, so a lone forward never waits and a busy peer gets
//! fewer, fuller calls. SLUICE_PEER_BATCH_WINDOW_US is how long a call in flight gathers the
//! forwards behind it: once the newest call has been out that long, the next forward leaves at
//! once with those waiting, beside it, so a slow call does not hold the rest. A call carries up
//! to [`MAX_BATCH_HITS`] hits and one kind of [`Op`].
//!
//! Why no timer: tokio's timer fires on millisecond ticks, so the 200 µs window the batcher
//! once waited on cost about 1.1 ms per forward (docs/benchmarks.md). The window is checked
//! when a forward arrives or a call comes back, never by sleeping.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Malformed, Op, PeerDecision, PeerError, PeerHit};
use crate::cluster::ClusterStats;

/// One queued forward: its hits, and where to send its decisions.
pub(super) struct Job {
    pub(super) hits: Vec<PeerHit>,
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Result<Vec<PeerDecision>, PeerError>>,
}

/// At most this many hits go in one call; the jobs waiting beyond it start the next.
const MAX_BATCH_HITS: usize = 256;

/// The answer of one call carrying a batch's hits.
type Answer = Result<Vec<PeerDecision>, PeerError>;

/// Starts the batching task for one peer; `call` sends one batch's hits as one call (bounded in
/// time). The task ends once every sender of the returned queue is gone and its calls are back.
pub(super) fn start<C, F>(call: C, window: Duration, stats: Arc<ClusterStats>) -> mpsc::Sender<Job>
where
    C: Fn(Vec<PeerHit>, Op) -> F + Send + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(1024);
    let batcher = Batcher {
        rx,
        calls: JoinSet::new(),
        newest: Instant::now(),
        window,
        call,
        stats,
    };
    tokio::spawn(batcher.run());
    tx
}

/// One peer's batching task: its queue, its calls in flight, and how it makes a call.
struct Batcher<C> {
    rx: mpsc::Receiver<Job>,
    /// Each call in flight with the delivery of its answer; one that came back and was not
    /// joined yet still counts, and joining it ends the wait of the forwards behind it.
    calls: JoinSet<()>,
    /// When the newest call left.
    newest: Instant,
    window: Duration,
    call: C,
    stats: Arc<ClusterStats>,
}

impl<C, F> Batcher<C>
where
    C: Fn(Vec<PeerHit>, Op) -> F + Send + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    async fn run(mut self) {
        let mut next: Option<Job> = None;
        loop {
            let first = match next.take() {
                Some(job) => job,
                None => match self.idle().await {
                    Some(job) => job,
                    None => break,
                },
            };
            let (batch, other) = self.gather(first).await;
            next = other;
            self.send(batch);
        }
        while self.calls.join_next().await.is_some() {}
    }

    /// The next job, joining the calls that come back meanwhile; none once every sender is
    /// gone.
    async fn idle(&mut self) -> Option<Job> {
        loop {
            tokio::select! {
                job = self.rx.recv() => return job,
                Some(_) = self.calls.join_next() => {}
            }
        }
    }

    /// `first` and the jobs of its kind to send with it, up to [`MAX_BATCH_HITS`] hits; and the
    /// job of the other kind that ended the batch, if one did. The batch is due at once when no
    /// call is in flight; else when a call comes back, or the newest has been out `window`.
    async fn gather(&mut self, first: Job) -> (Batch, Option<Job>) {
        let mut batch = Batch::of(first);
        // What is queued already, then what the callers running now add: forwards made at
        // the same moment share a call even with none in flight.
        for yielded in [false, true] {
            if yielded {
                tokio::task::yield_now().await;
            }
            while !batch.full() {
                let Ok(job) = self.rx.try_recv() else { break };
                if let Err(other) = batch.add(job) {
                    return (batch, Some(other));
                }
            }
        }
        while !batch.full() && !self.calls.is_empty() && self.newest.elapsed() < self.window {
            tokio::select! {
                biased;
                Some(_) = self.calls.join_next() => break,
                job = self.rx.recv() => {
                    let Some(job) = job else { break };
                    if let Err(other) = batch.add(job) {
                        return (batch, Some(other));
                    }
                }
            }
        }
        (batch, None)
    }

    /// Makes `batch`'s call; its answer is split among its jobs when it comes back.
    fn send(&mut self, batch: Batch) {
        if batch.size > 0 {
            self.stats.peer_calls.fetch_add(1, Ordering::Relaxed);
        }
        let hits = batch
            .jobs
            .iter()
            .flat_map(|j| j.hits.iter().cloned())
            .collect();
        let answer = (self.call)(hits, batch.op);
        self.newest = Instant::now();
        // Each call is its own HTTP/2 stream on the peer's connection, bounded by its own
        // deadline, so a slow one does not stop the calls made beside it.
        self.calls
            .spawn(async move { deliver(batch, answer.await) });
    }
}

/// Jobs of one kind (charges, refunds or resets) to send in one call, and their hits in all.
struct Batch {
    jobs: Vec<Job>,
    op: Op,
    size: usize,
}

impl Batch {
    fn of(first: Job) -> Self {
        Batch {
            op: first.op,
            size: first.hits.len(),
            jobs: vec![first],
        }
    }

    fn full(&self) -> bool {
        self.size >= MAX_BATCH_HITS
    }

    /// Adds `job` if it is of the batch's kind; gives it back if not.
    fn add(&mut self, job: Job) -> Result<(), Job> {
        if job.op != self.op {
            return Err(job);
        }
        self.size += job.hits.len();
        self.jobs.push(job);
        Ok(())
    }
}

/// Splits a call's decisions among the jobs of its batch, in order (resets get none, and so
/// do refunds an older owner answered with none); a wrong count of decisions fails every job.
fn deliver(batch: Batch, result: Result<Vec<PeerDecision>, PeerError>) {
    let Batch { jobs, op, size } = batch;
    let result = result.and_then(|decisions| {
        let none = decisions.is_empty() && op.may_answer_nothing();
        if none || decisions.len() == size {
            Ok(decisions)
        } else {
            Err(PeerError::Malformed(Malformed::Decisions {
                got: decisions.len(),
                hits: size,
            }))
        }
    });
    match result {
        Ok(decisions) => {
            let mut rest = decisions.into_iter();
            for job in jobs {
                let mine = if op.answers() {
                    // Empty for every job when the owner answered none.
                    rest.by_ref().take(job.hits.len()).collect()
                } else {
                    Vec::new()
                };
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The batcher against a stand-in peer: each call it makes shows up in the test, which
    //! answers it when it chooses. Time is paused, so a wait on tokio's timer would move the
    //! clock (tokio advances a paused clock to the next timer whenever the runtime is idle).

    use super::*;

    /// One call the batcher made: its hits' keys, its kind, and the switch that answers it.
    struct Made {
        keys: Vec<String>,
        op: Op,
        answer: oneshot::Sender<()>,
    }

    /// A batcher with `window` whose calls come to the returned receiver; each is answered
    /// (one decision per hit) once its `answer` is sent, or fails if it is dropped.
    fn batcher_with(window: Duration) -> (mpsc::Sender<Job>, mpsc::UnboundedReceiver<Made>) {
        let (made, calls) = mpsc::unbounded_channel();
        let call = move |hits: Vec<PeerHit>, op| {
            let (answer, answered) = oneshot::channel();
            let n = hits.len();
            let keys = hits.into_iter().map(|h| h.key).collect();
            let _ = made.send(Made { keys, op, answer });
            async move {
                answered
                    .await
                    .map(|()| vec![PeerDecision::default(); if op.answers() { n } else { 0 }])
                    .map_err(|_| PeerError::NoClient("the test dropped the call"))
            }
        };
        let stats = Arc::new(ClusterStats::default());
        (start(call, window, stats), calls)
    }

    /// Queues a job of `n` hits on `key`; its decisions come to the returned receiver.
    async fn forward(
        jobs: &mpsc::Sender<Job>,
        key: &str,
        n: usize,
        op: Op,
    ) -> oneshot::Receiver<Answer> {
        let hit = PeerHit {
            key: key.to_owned(),
            hits: 1,
            ..PeerHit::default()
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            hits: vec![hit; n],
            op,
            reply,
        };
        jobs.send(job).await.expect("the batcher runs");
        answer
    }

    /// Lets the batcher run as far as it can without time passing.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_forward_is_sent_at_once_without_a_timer() {
        let start = Instant::now();
        let (jobs, mut calls) = batcher_with(Duration::from_micros(200));
        let answer = forward(&jobs, "a", 1, Op::Apply).await;
        let made = calls.recv().await.expect("a call");
        assert_eq!(made.keys, ["a"]);
        assert_eq!(Instant::now(), start, "the forward waited for a timer");
        made.answer.send(()).unwrap();
        assert_eq!(answer.await.unwrap().unwrap().len(), 1);
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn forwards_behind_a_call_in_flight_share_the_next_call_when_it_comes_back() {
        let start = Instant::now();
        let (jobs, mut calls) = batcher_with(Duration::from_secs(1));
        let a = forward(&jobs, "a", 1, Op::Apply).await;
        let first = calls.recv().await.expect("a's call");
        let b = forward(&jobs, "b", 1, Op::Apply).await;
        let c = forward(&jobs, "c", 2, Op::Apply).await;
        settle().await;
        assert!(calls.try_recv().is_err(), "b and c wait for a's call");
        first.answer.send(()).unwrap();
        let second = calls.recv().await.expect("b and c's call");
        assert_eq!(second.keys, ["b", "c", "c"]);
        second.answer.send(()).unwrap();
        assert_eq!(a.await.unwrap().unwrap().len(), 1);
        assert_eq!(b.await.unwrap().unwrap().len(), 1);
        assert_eq!(c.await.unwrap().unwrap().len(), 2);
        assert_eq!(Instant::now(), start, "no forward waited for a timer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_out_longer_than_the_window_does_not_hold_the_next_forward() {
        let window = Duration::from_micros(200);
        let (jobs, mut calls) = batcher_with(window);
        let _a = forward(&jobs, "a", 1, Op::Apply).await;
        let slow = calls.recv().await.expect("a's call");
        // Within the window, b waits for a's call...
        let b = forward(&jobs, "b", 1, Op::Apply).await;
        settle().await;
        assert!(calls.try_recv().is_err(), "b waits for a's call");
        // ...and c, arriving after it, goes at once with b beside the slow call.
        tokio::time::advance(window).await;
        let start = Instant::now();
        let _c = forward(&jobs, "c", 1, Op::Apply).await;
        let beside = calls.recv().await.expect("b and c's call");
        assert_eq!(beside.keys, ["b", "c"]);
        assert_eq!(Instant::now(), start);
        beside.answer.send(()).unwrap();
        assert_eq!(b.await.unwrap().unwrap().len(), 1);
        drop(slow);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_of_zero_never_waits_for_a_call_in_flight() {
        let (jobs, mut calls) = batcher_with(Duration::ZERO);
        let _a = forward(&jobs, "a", 1, Op::Apply).await;
        let _first = calls.recv().await.expect("a's call");
        let _b = forward(&jobs, "b", 1, Op::Apply).await;
        let start = Instant::now();
        let second = calls.recv().await.expect("b's call, beside a's");
        assert_eq!(second.keys, ["b"]);
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_carries_at_most_256_hits_and_one_kind() {
        let start = Instant::now();
        let (jobs, mut calls) = batcher_with(Duration::from_secs(1));
        let _a = forward(&jobs, "a", 1, Op::Apply).await;
        let first = calls.recv().await.expect("a's call");
        // Behind it: 300 charges in hits of 100, then a refund.
        let mut answers = Vec::new();
        for key in ["b", "c", "d"] {
            answers.push(forward(&jobs, key, 100, Op::Apply).await);
        }
        answers.push(forward(&jobs, "e", 1, Op::Refund).await);
        settle().await;
        // 256 hits is full: b, c and d go at once, without waiting for a's call.
        let full = calls.recv().await.expect("a full call");
        assert_eq!(
            full.keys.len(),
            300,
            "the job that crosses 256 hits still goes"
        );
        assert_eq!(full.op, Op::Apply);
        assert!(
            calls.try_recv().is_err(),
            "the refund waits for a call to come back"
        );
        first.answer.send(()).unwrap();
        let refund = calls.recv().await.expect("the refund's call");
        assert_eq!(
            (refund.keys.as_slice(), refund.op),
            (&["e".to_owned()][..], Op::Refund)
        );
        full.answer.send(()).unwrap();
        refund.answer.send(()).unwrap();
        for answer in answers {
            answer.await.unwrap().expect("answered");
        }
        assert_eq!(Instant::now(), start);
    }
}
