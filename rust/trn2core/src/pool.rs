//! The thread pool every parallel section of a call runs on, safe across `fork()`.
//!
//! Rayon's global pool is started once per process and never again. A process that forks after
//! using it (Python's `multiprocessing` with the `fork` start method, the default on Linux; a
//! PyTorch data loader) leaves the child with the pool's bookkeeping but none of its threads
//! (`fork` copies only the calling thread), so the child's first parallel section waits forever
//! for workers that do not exist. So the binding runs every call through [`install`]: the first
//! process to call it keeps rayon's global pool (the call runs on the calling thread, as
//! before); a call from another process (a forked child) runs on a fresh pool of that process,
//! which remembers the process id it was started in. The parent's pool is left alone in the
//! child (its memory is leaked on purpose: it has no threads to stop there). Limitation: in a
//! forked child the call runs on a pool worker, and a worker waiting for its own parallel
//! section may pick up another thread's call; so several threads of one forked child calling
//! into the *same* `NeuronCore` at once can deadlock on its lock. One thread per child (data
//! loaders, `multiprocessing` workers) is unaffected, as is the parent.
//!
//! A child's pool has as many threads as rayon's global pool would (`RAYON_NUM_THREADS`, else one per
//! CPU), at most [`MAX_THREADS_PER_CPU`] per CPU or 64, whichever is more: more threads than
//! that only cost memory (each has its own stack), and `RAYON_NUM_THREADS=100000` would otherwise
//! exhaust an address-space limit. When the threads cannot all be started (a tight `ulimit -u`
//! or `ulimit -v`), it tries half as many, down to one, and only when not even one can be started
//! does [`install`] return an error. Results never depend on the thread count.
//!
//! The first process's global pool is started the same way (capped, halved on failure) by the
//! first call through [`install`], unless a Rust caller started it before.
//!
//! Code that runs outside [`install`] (the core's own tests, a Rust caller) uses rayon's global
//! pool as before.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::{Error, Result};

/// A pool and the process it was started in.
struct Owned {
    pid: u32,
    pool: ThreadPool,
}

/// The current pool: null until first use; replaced (the old one leaked) in a forked child.
static POOL: AtomicPtr<Owned> = AtomicPtr::new(std::ptr::null_mut());

/// The pool of this process, started on first use (and again in a forked child).
fn pool() -> Result<&'static ThreadPool> {
    let pid = std::process::id();
    loop {
        let cur = POOL.load(Ordering::Acquire);
        // SAFETY: a non-null POOL always points to a leaked, never freed `Owned`.
        if let Some(owned) = unsafe { cur.as_ref() } {
            if owned.pid == pid {
                return Ok(&owned.pool);
            }
        }
        let fresh = Box::into_raw(Box::new(Owned { pid, pool: build()? }));
        match POOL.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // The previous pool (a parent's, in a forked child) is leaked on purpose.
            // SAFETY: `fresh` was just leaked and is never freed.
            Ok(_) => return Ok(&unsafe { &*fresh }.pool),
            // Another thread installed its pool first: drop ours (its threads stop) and use
            // the winner's.
            // SAFETY: `fresh` was never shared.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

/// Most threads per CPU a pool takes (see the module doc).
pub const MAX_THREADS_PER_CPU: usize = 4;

/// Threads of a new pool: what rayon's global pool would take (`RAYON_NUM_THREADS`, else one
/// per CPU), capped (module doc).
fn wanted_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0);
    env.unwrap_or(cpus).min(cpus.saturating_mul(MAX_THREADS_PER_CPU).max(64))
}

/// A pool of [`wanted_threads`] threads, or half as many when they cannot all be started.
fn build() -> Result<ThreadPool> {
    let mut threads = wanted_threads();
    loop {
        let built = ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("trn2core-{i}"))
            .build();
        match built {
            Ok(pool) => return Ok(pool),
            Err(e) if threads <= 1 => {
                return Err(Error::capacity(
                    "threads",
                    format!("no worker thread could be started on this host ({e})"),
                ))
            }
            Err(_) => {
                threads /= 2;
                // The threads of the failed attempt are told to stop; give them a moment to go.
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// The process that first ran a call through [`install`] (0: none yet). That process keeps
/// rayon's global pool; only a process forked from it gets a pool of its own.
static FIRST_PID: AtomicU32 = AtomicU32::new(0);

/// Runs `f` where its parallel sections have live threads: in the process that first called
/// `install`, directly on the calling thread (every `par_iter` inside uses rayon's global pool,
/// as before; `f` must not run *on* a pool worker there, because binding calls take a core's
/// lock inside `f`, and a worker blocked on that lock starves the pool); in a forked child,
/// whose copy of the global pool has no threads, on a fresh pool of the child's own (with the
/// calling thread's cancellation token installed there, `crate::cancel`). A `CapacityError` on
/// `threads` when no thread at all can be started.
pub fn install<R: Send>(f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    let pid = std::process::id();
    let first = match FIRST_PID.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => pid,
        Err(first) => first,
    };
    if first == pid {
        init_global();
        return f();
    }
    let cancel = crate::cancel::current();
    let pool = pool()?;
    pool.install(|| cancel.install(f))
}

/// Starts rayon's global pool with [`wanted_threads`] threads (half as many, down to one, when
/// they cannot all be started), once. Left to itself rayon would start exactly
/// `RAYON_NUM_THREADS` threads: `RAYON_NUM_THREADS=100000` spent minutes starting threads
/// before the first call returned (and an address-space limit made it panic). When a Rust
/// caller started the global pool first, its pool is kept.
fn init_global() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut threads = wanted_threads();
        while ThreadPoolBuilder::new().num_threads(threads).build_global().is_err() && threads > 1 {
            // Already started by someone else (then every retry fails the same way, quickly),
            // or its threads could not all be started: try fewer.
            threads /= 2;
        }
    });
}

/// Builds now everything the core and its thread pool would build lazily on first use: the fp8
/// decoding tables, the DMA track names, and crossbeam-epoch's global collector (which rayon's
/// workers start on their first steal).
///
/// Each is behind a once-cell; a process forked while another thread is building one inherits
/// the cell as "being built" by a thread it does not have, and its first use waits forever
/// (a forked child's pool workers hung so). The binding calls this when the module is
/// imported, before any thread of the user's can be inside a call.
pub fn warm_up() {
    let _ = crossbeam_epoch::default_collector();
    crate::machine::dtype::warm_up();
    let _ = crate::dma::cost::queue_track(0, 0);
}

/// Threads of this process's pool (0 if none can be started).
pub fn threads() -> usize {
    pool().map_or(0, |p| p.current_num_threads())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn runs_parallel_work_with_the_callers_token() {
        let token = crate::cancel::Cancel::new();
        let sum = token.install(|| {
            install(|| {
                assert!(!crate::cancel::current().is_cancelled());
                Ok((0..1000u64).into_par_iter().sum::<u64>())
            })
        });
        assert_eq!(sum, Ok(499_500));
        token.cancel();
        let r = token.install(|| install(crate::cancel::check));
        assert_eq!(r, Err(Error::Interrupted), "the token reaches the pool");
        assert!(threads() >= 1);
    }
}
