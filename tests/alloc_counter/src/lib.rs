//! A counting global allocator for tests: it hands every request to [`std::alloc::System`] and
//! counts, per thread, how many times memory was asked for (`alloc`, `alloc_zeroed` and
//! `realloc`: each is a call into malloc) and given back.
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
}

fn bump(counter: &'static std::thread::LocalKey<Cell<u64>>) {
    // `try_with`: a thread being torn down may still free memory after its locals are gone.
    let _ = counter.try_with(|c| c.set(c.get() + 1));
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
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(&ALLOCS);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        bump(&FREES);
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
