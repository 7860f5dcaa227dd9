//! A counting global allocator for tests: it hands every request to [`std::alloc::System`] and
//! counts, per thread, how many times memory was asked for (`alloc`, `alloc_zeroed` and
//! `realloc`: each is a call into malloc) and given back, and how many bytes are held
//! ([`live_bytes`]).
//!
//! Per thread, so a test measures its own code and not the test harness's or another test's
//! threads. A test binary installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: alloc_counter::Counting = alloc_counter::Counting;
//! ```
//!
//! and reads [`count`] around the code it measures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // Const-initialised and without a destructor: reading them never allocates, so the
    // allocator can use them.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static FREES: Cell<u64> = const { Cell::new(0) };
    // Bytes asked for less bytes given back; signed, as a thread may free what another asked for.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn bump(counter: &'static std::thread::LocalKey<Cell<u64>>) {
    // `try_with`: a thread being torn down may still free memory after its locals are gone.
    let _ = counter.try_with(|c| c.set(c.get() + 1));
}

/// Adds `by` bytes to this thread's [`live_bytes`].
fn add_live(by: i64) {
    let _ = LIVE.try_with(|c| c.set(c.get() + by));
}

fn size(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The counting allocator: [`System`] with per-thread counters.
pub struct Counting;

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; the counters are plain thread-local cells that never allocate.
#[allow(
    unsafe_code,
    reason = "GlobalAlloc is an unsafe trait; this impl only delegates"
)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add_live(size(layout.size()));
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add_live(size(layout.size()));
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add_live(size(new_size) - size(layout.size()));
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        bump(&FREES);
        add_live(-size(layout.size()));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// What this thread asked of the allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `alloc`, `alloc_zeroed` and `realloc` calls.
    pub allocs: u64,
    /// `dealloc` calls.
    pub frees: u64,
}

fn now() -> Counts {
    Counts {
        allocs: ALLOCS.with(Cell::get),
        frees: FREES.with(Cell::get),
    }
}

/// Runs `f` and returns its result with the allocations and frees it made on this thread.
pub fn count<R>(f: impl FnOnce() -> R) -> (R, Counts) {
    let before = now();
    let out = f();
    let after = now();
    let counts = Counts {
        allocs: after.allocs - before.allocs,
        frees: after.frees - before.frees,
    };
    (out, counts)
}

/// The bytes this thread has asked for and not given back (the sizes asked, without the
/// allocator's own overhead): the difference of two readings is what the code between them
/// keeps, when it runs on this thread alone.
pub fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}
