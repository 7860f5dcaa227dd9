//! Polls a future that never waits (the memory store's, and the service's over it) once, for
//! the measuring programs that time or count them without a runtime.

use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// `fut`'s output; panics if it would wait.
pub fn ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory path never waits"),
    }
}
