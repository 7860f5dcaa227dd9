//! The answers a comparison server sent, counted by gRPC status, for `bench/run.sh` to check
//! each load run against h2load's count (`bench/answers.py`), in `noop_ratelimit` and `careful_ratelimit`.
//!
//! h2load counts an HTTP 200 as a success whatever `grpc-status` the call ended with, so the
//! servers count what their handler answered: OK (grpc-status 0) or an error status. Counting is
//! one relaxed add on a cache line of the calling thread's own (Sluice's own sharded counter,
//! the one that counts `total_requests`), so two cores answering at once never write the same
//! line. The counts are
//! read over plain HTTP from a port of their own, served by a thread outside the runtime that
//! sleeps in `accept` between reads: `GET /` answers `ok N\nerrors M\n`.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use sluice::telemetry::stats::ShardedCounter;

/// The answers sent so far: OK, and with an error status.
#[derive(Default)]
pub struct Answers {
    ok: ShardedCounter,
    errors: ShardedCounter,
}

impl Answers {
    /// Counts one answer: OK or not.
    #[inline]
    pub fn record(&self, ok: bool) {
        let counter = if ok { &self.ok } else { &self.errors };
        counter.add(1);
    }

    /// (OK, errors), summed over the shards.
    pub fn totals(&self) -> (u64, u64) {
        (self.ok.get(), self.errors.get())
    }

    /// Serves the counts on `addr` from a thread of its own, for the life of the process.
    pub fn serve(self: &Arc<Self>, addr: SocketAddr) -> std::io::Result<()> {
        let listener = TcpListener::bind(addr)?;
        let answers = Arc::clone(self);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                // The request is read to its blank line first: closing a socket with unread
                // bytes resets it, and the client could lose the answer.
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let (ok, errors) = answers.totals();
                let body = format!("ok {ok}\nerrors {errors}\n");
                let _ = write!(
                    &stream,
                    "HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Ok(())
    }
}
