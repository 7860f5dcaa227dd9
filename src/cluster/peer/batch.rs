//! Apply calls batched per peer: one task per peer collects the forwards that arrive within
//! SLUICE_PEER_BATCH_WINDOW_US (up to [`MAX_BATCH_HITS`] hits, one kind of [`Op`] per call),
//! sends them as one call on the peer's HTTP/2 connection, and splits the answer among them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{ApplyRequest, Call, Malformed, Op, PeerDecision, PeerError, PeerHit, wire};
use crate::cluster::ClusterStats;

/// One queued forward: its hits, and where to send its decisions.
pub(super) struct Job {
    pub(super) hits: Vec<PeerHit>,
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Result<Vec<PeerDecision>, PeerError>>,
}

/// At most this many hits go in one call; the jobs waiting beyond it start the next.
const MAX_BATCH_HITS: usize = 256;

/// Collects jobs for up to `window` (or [`MAX_BATCH_HITS`] hits), sends them as one call,
/// splits the answer. Refunds and charges travel in separate calls.
pub(super) async fn batcher(
    channel: tonic::transport::Channel,
    mut rx: mpsc::Receiver<Job>,
    timeout: Duration,
    window: Duration,
    stats: Arc<ClusterStats>,
) {
    let client = wire::peer_client::PeerClient::new(channel);
    let mut pending: Option<Job> = None;
    loop {
        let first = match pending.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let (batch, next) = collect_batch(first, &mut rx, window).await;
        pending = next;
        if batch.size > 0 {
            stats.peer_calls.fetch_add(1, Ordering::Relaxed);
        }
        // Each batch is its own call on the shared HTTP/2 connection, so a slow or dead peer's
        // deadline does not hold the batches queued behind it.
        tokio::spawn(send_batch(client.clone(), batch, timeout));
    }
}

/// Jobs of one kind (charges, refunds or resets) to send in one call, and their hits in all.
struct Batch {
    jobs: Vec<Job>,
    op: Op,
    size: usize,
}

/// `first` and the jobs of its kind that arrive within `window`, up to [`MAX_BATCH_HITS`] hits;
/// and the job of the other kind that ended the batch early, if one did.
async fn collect_batch(
    first: Job,
    rx: &mut mpsc::Receiver<Job>,
    window: Duration,
) -> (Batch, Option<Job>) {
    let mut batch = Batch {
        op: first.op,
        size: first.hits.len(),
        jobs: vec![first],
    };
    let deadline = tokio::time::Instant::now() + window;
    while batch.size < MAX_BATCH_HITS {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(job)) if job.op == batch.op => {
                batch.size += job.hits.len();
                batch.jobs.push(job);
            }
            // A different kind starts the next call.
            Ok(Some(other)) => return (batch, Some(other)),
            Ok(None) | Err(_) => break,
        }
    }
    (batch, None)
}

/// One Apply call for `batch`, bounded by `timeout`; each job gets its share of the answer, or
/// the error. A refusal (another protocol version, an unknown number) comes back as the
/// owner's message, and the caller treats the peer as failed.
async fn send_batch(
    mut client: wire::peer_client::PeerClient<tonic::transport::Channel>,
    batch: Batch,
    timeout: Duration,
) {
    let request = ApplyRequest::new(
        batch
            .jobs
            .iter()
            .flat_map(|j| j.hits.iter().cloned())
            .collect(),
        batch.op,
    );
    let call = async {
        client
            .apply(request)
            .await
            .map(|r| r.into_inner().decisions)
            .map_err(|s| PeerError::from_status(Call::Apply, s))
    };
    let result = match tokio::time::timeout(timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(PeerError::Timeout { after: timeout }),
    };
    deliver(batch, result);
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
