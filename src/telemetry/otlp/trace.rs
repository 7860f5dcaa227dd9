//! The tracer: decides whether a call is sampled, and turns finished spans into records on a
//! bounded queue that the exporter drains.
//!
//! Cost on the request path, by case:
//!
//! - tracing off, or the caller's parent is not sampled: one branch, no clock read, no
//!   allocation;
//! - a root span not sampled (TRACING_SAMPLING_RATE below 1): two calls to a thread-local
//!   random generator;
//! - sampled: three or four wall-clock reads, one allocation for the attributes, a copy of the
//!   domain, and a `try_send` on the queue. A full queue drops the span and counts it; nothing
//!   on the request path ever waits for the exporter.

use crate::clock::unix_nanos;
use std::cell::Cell;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::propagation::RequestTrace;
pub(crate) use super::proto::SpanKind;

/// The tracer's counters, exported as `sluice_tracing_*` metrics.
#[derive(Debug, Default)]
pub struct SpanCounters {
    /// Spans queued for export.
    pub queued: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Export calls that failed (their spans are lost).
    pub export_failures: AtomicU64,
}

impl SpanCounters {
    /// (name, help, value) of each counter, for the exporters (`/metrics` adds `_total`).
    pub fn snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            (
                "sluice_tracing_spans_queued",
                "Spans queued for export.",
                load(&self.queued),
            ),
            (
                "sluice_tracing_spans_dropped",
                "Spans dropped because the export queue was full.",
                load(&self.dropped),
            ),
            (
                "sluice_tracing_spans_exported",
                "Spans the collector accepted.",
                load(&self.exported),
            ),
            (
                "sluice_tracing_export_failures",
                "Span exports that failed (their spans are lost).",
                load(&self.export_failures),
            ),
        ]
    }
}

/// An attribute value. Keys are `&'static str`: Sluice's attribute names are fixed.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Static(&'static str),
    Int(i64),
    Bool(bool),
}

/// A finished span, as queued for export.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// All zero for a root span.
    pub parent_span_id: [u8; 8],
    /// The parent came from the caller's headers.
    pub remote_parent: bool,
    pub trace_state: String,
    pub name: &'static str,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// `Some(message)`: the span's status is ERROR.
    pub error: Option<String>,
}

/// A sampled span in progress.
#[derive(Debug)]
pub struct ActiveSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent_span_id: [u8; 8],
    remote_parent: bool,
    trace_state: String,
    start_unix_nanos: u64,
}

impl ActiveSpan {
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// Starts a child of this span now.
    pub fn child(&self) -> ActiveSpan {
        ActiveSpan {
            trace_id: self.trace_id,
            span_id: span_id(),
            parent_span_id: self.span_id,
            remote_parent: false,
            trace_state: self.trace_state.clone(),
            start_unix_nanos: unix_nanos(),
        }
    }

    /// Ends the span now.
    pub fn end(
        self,
        name: &'static str,
        kind: SpanKind,
        attributes: Vec<(&'static str, Value)>,
        error: Option<String>,
    ) -> SpanRecord {
        SpanRecord {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            remote_parent: self.remote_parent,
            trace_state: self.trace_state,
            name,
            kind,
            start_unix_nanos: self.start_unix_nanos,
            end_unix_nanos: unix_nanos(),
            attributes,
            error,
        }
    }
}

/// Starts spans and queues finished ones. [`Tracer::disabled`] does nothing at all.
#[derive(Debug)]
pub struct Tracer {
    /// `None`: tracing is off.
    queue: Option<mpsc::Sender<SpanRecord>>,
    /// A root span is sampled when the top 63 bits of its trace id's low half are below this
    /// (OpenTelemetry's TraceIdRatioBased); `u64::MAX` samples everything.
    threshold: u64,
    counters: Arc<SpanCounters>,
}

impl Default for Tracer {
    fn default() -> Self {
        Tracer::disabled()
    }
}

impl Tracer {
    pub fn disabled() -> Self {
        Tracer {
            queue: None,
            threshold: 0,
            counters: Arc::default(),
        }
    }

    /// A tracer sampling `sampling_rate` of root spans, whose finished spans wait in a queue
    /// of `max_queue` for whoever holds the receiver.
    pub fn new(sampling_rate: f64, max_queue: usize) -> (Self, mpsc::Receiver<SpanRecord>) {
        let (tx, rx) = mpsc::channel(max_queue.max(1));
        let threshold = if sampling_rate >= 1.0 {
            u64::MAX
        } else if sampling_rate > 0.0 {
            (sampling_rate * (1u64 << 63) as f64) as u64
        } else {
            0
        };
        let tracer = Tracer {
            queue: Some(tx),
            threshold,
            counters: Arc::default(),
        };
        (tracer, rx)
    }

    pub fn enabled(&self) -> bool {
        self.queue.is_some()
    }

    pub fn counters(&self) -> &Arc<SpanCounters> {
        &self.counters
    }

    /// Starts a call's span, or `None` when it is not to be recorded: tracing is off, the
    /// caller's parent is not sampled, or a root span lost the sampling draw.
    #[inline]
    pub fn start(&self, trace: &RequestTrace) -> Option<ActiveSpan> {
        self.queue.as_ref()?;
        match &trace.parent {
            Some(parent) => parent.sampled.then(|| ActiveSpan {
                trace_id: parent.trace_id,
                span_id: span_id(),
                parent_span_id: parent.span_id,
                remote_parent: true,
                trace_state: parent.trace_state.clone(),
                start_unix_nanos: unix_nanos(),
            }),
            None => {
                if self.threshold == 0 {
                    return None;
                }
                let hi = random_u64();
                let lo = random_u64();
                if self.threshold != u64::MAX && (lo >> 1) >= self.threshold {
                    return None;
                }
                let mut trace_id = [0u8; 16];
                trace_id[..8].copy_from_slice(&hi.to_be_bytes());
                trace_id[8..].copy_from_slice(&lo.to_be_bytes());
                Some(ActiveSpan {
                    trace_id,
                    span_id: span_id(),
                    parent_span_id: [0; 8],
                    remote_parent: false,
                    trace_state: String::new(),
                    start_unix_nanos: unix_nanos(),
                })
            }
        }
    }

    /// Queues a finished span; never waits. A full queue (the collector is slow or down)
    /// drops it and counts the drop.
    pub fn record(&self, span: SpanRecord) {
        let Some(queue) = &self.queue else { return };
        match queue.try_send(span) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

/// A per-thread seed from the standard library's randomly keyed hasher.
fn seed() -> u64 {
    let s = std::collections::hash_map::RandomState::new().hash_one(unix_nanos());
    s | 1
}

/// xorshift64* per thread: ids need to be unique and unpredictable enough for sampling, not
/// cryptographic, and this costs a few nanoseconds without a lock or a dependency.
pub(crate) fn random_u64() -> u64 {
    RNG.with(|c| {
        let mut x = c.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

fn span_id() -> [u8; 8] {
    loop {
        let id = random_u64();
        if id != 0 {
            return id.to_be_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::propagation::{SpanContext, Transport};
    use super::*;

    fn parent(sampled: bool) -> RequestTrace {
        RequestTrace {
            transport: Transport::Grpc,
            parent: Some(SpanContext {
                trace_id: [7; 16],
                span_id: [9; 8],
                sampled,
                trace_state: "a=b".into(),
            }),
        }
    }

    #[test]
    fn parent_based_sampling() {
        let (t, _rx) = Tracer::new(0.0, 8);
        assert!(t.start(&parent(false)).is_none());
        assert!(
            t.start(&RequestTrace::default()).is_none(),
            "rate 0: no roots"
        );
        let s = t
            .start(&parent(true))
            .expect("a sampled parent is followed");
        assert_eq!(s.trace_id(), [7; 16]);
        assert_eq!(s.parent_span_id, [9; 8]);
        assert_eq!(s.trace_state, "a=b");
        assert!(Tracer::disabled().start(&parent(true)).is_none());

        let (t, _rx) = Tracer::new(1.0, 8);
        assert!(t.start(&RequestTrace::default()).is_some());
        assert!(t.start(&parent(false)).is_none());

        let (t, _rx) = Tracer::new(0.25, 8);
        let n = (0..20_000)
            .filter(|_| t.start(&RequestTrace::default()).is_some())
            .count();
        assert!((4_000..6_000).contains(&n), "{n} of 20000 at 0.25");
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (t, mut rx) = Tracer::new(1.0, 2);
        for _ in 0..5 {
            let s = t.start(&RequestTrace::default()).unwrap();
            t.record(s.end("x", SpanKind::Server, Vec::new(), None));
        }
        assert_eq!(t.counters().queued.load(Ordering::Relaxed), 2);
        assert_eq!(t.counters().dropped.load(Ordering::Relaxed), 3);
        let first = rx.try_recv().unwrap();
        assert_eq!(first.parent_span_id, [0; 8]);
        assert!(first.end_unix_nanos >= first.start_unix_nanos);
    }
}
