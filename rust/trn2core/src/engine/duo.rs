//! A second thread for GEMMs too small for the pool ([`super::gemm`]'s `SEQUENTIAL_MACS`): one
//! `nc_matmul` of 128 x 128 x 512 is about 150 us of adds on one core, and a fork-join of
//! rayon's pool from a thread outside it costs a sizeable share of that (the caller hands both
//! halves to the pool's workers, asleep, and sleeps until they are done). The helper here
//! spins for a while after each job, so the next one, a few hundred microseconds later in a
//! kernel that settles a matmul at every `dma_copy`, is taken in about a microsecond; idle
//! longer, it sleeps until woken. [`join`] runs one closure on the calling thread and one on
//! the helper, and returns when both have. Host scheduling only: which thread computes an
//! output block never changes its bits.
//!
//! One caller at a time: a [`join`] while another thread's is running, or in a process forked
//! from the one that started the helper (whose copy has no thread), runs both closures on the
//! calling thread, one after the other.
//!
//! [`post`] hands the helper a job the caller does not wait for (a copy into SBUF that the
//! machine fences: `machine/memory.rs`, `copy_rows_detached`); a [`join`] while such a job runs
//! waits for it to finish instead of running both closures on its own thread.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long the helper spins for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(500);

const IDLE: u8 = 0;
const POSTED: u8 = 1;
const DONE: u8 = 2;

const FREE: u8 = 0;
const JOINED: u8 = 1;
const POSTED_JOB: u8 = 2;

/// A job of the slot: a closure borrowed from the thread in [`join`], which does not return (nor
/// unwind) until the helper has set [`DONE`]; or one [`post`] handed over, which the helper
/// drops when it has run it.
enum Job {
    Borrowed(*mut (dyn FnMut() + Send)),
    Owned(Box<dyn FnOnce() + Send>),
}

/// The job slot (see [`Job`]).
struct Duo {
    state: AtomicU8,
    /// Who owns the slot: [`FREE`], a [`join`] ([`JOINED`]) or a posted job ([`POSTED_JOB`],
    /// set free by the helper when it has run it): one word, so that a caller never sees the
    /// slot taken by a posted job that is already done.
    owner: AtomicU8,
    /// Whether the posted job panicked.
    panicked: AtomicBool,
    job: UnsafeCell<Option<Job>>,
    /// The helper's sleep: `true` while it waits on `wake`.
    sleeping: Mutex<bool>,
    wake: Condvar,
    /// The process that started the helper.
    pid: AtomicU32,
    /// Set by [`quiet`]: the helper sleeps now instead of spinning on.
    hush: AtomicBool,
}

// SAFETY: `job` is written only by the `join` or `post` that owns the slot (`owner`), before
// it publishes the job
// with `state = POSTED` (release), and read only by the helper after it has seen POSTED
// (acquire); the closure it points to is `Send` and outlives the job (`join` waits for DONE).
unsafe impl Sync for Duo {}

static DUO: OnceLock<Option<&'static Duo>> = OnceLock::new();

/// The helper, started on first use (`None` when no thread could be started).
fn duo() -> Option<&'static Duo> {
    *DUO.get_or_init(|| {
        let d: &'static Duo = Box::leak(Box::new(Duo {
            state: AtomicU8::new(IDLE),
            owner: AtomicU8::new(FREE),
            panicked: AtomicBool::new(false),
            job: UnsafeCell::new(None),
            sleeping: Mutex::new(false),
            wake: Condvar::new(),
            pid: AtomicU32::new(std::process::id()),
            hush: AtomicBool::new(false),
        }));
        std::thread::Builder::new().name("trn2core-duo".into()).spawn(move || helper(d)).ok()?;
        Some(d)
    })
}

/// The helper's loop: spin for a posted job, sleep when none came for [`SPIN`].
fn helper(d: &'static Duo) {
    loop {
        let since = Instant::now();
        let mut spins = 0u32;
        while d.state.load(Ordering::Acquire) != POSTED {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(16) {
                // Gives the core to a runnable thread that shares it (the caller, a pool
                // worker): spinning must never delay the work it waits for.
                std::thread::yield_now();
            }
            let hushed = d.hush.swap(false, Ordering::Relaxed);
            if hushed || (spins.is_multiple_of(64) && since.elapsed() > SPIN) {
                let mut sleeping = d.sleeping.lock().unwrap_or_else(|p| p.into_inner());
                *sleeping = true;
                while d.state.load(Ordering::Acquire) != POSTED {
                    sleeping = d.wake.wait(sleeping).unwrap_or_else(|p| p.into_inner());
                }
                *sleeping = false;
                break;
            }
            std::hint::spin_loop();
        }
        // SAFETY: see `Duo`: the job was published before POSTED, and its owner waits (a
        // borrowed job) or handed it over (an owned one).
        let job = unsafe { (*d.job.get()).take() };
        match job {
            Some(Job::Borrowed(job)) => {
                // SAFETY: the pointer is to a live closure that `join` keeps borrowed until
                // DONE.
                let f = unsafe { &mut *job };
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
                d.panicked.store(!ok, Ordering::Relaxed);
            }
            Some(Job::Owned(job)) => {
                // No one waits for it: a panic (its own guards have run) ends here.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                d.state.store(IDLE, Ordering::Relaxed);
                d.owner.store(FREE, Ordering::Release);
                continue;
            }
            None => {}
        }
        d.state.store(DONE, Ordering::Release);
    }
}

/// Tells the helper, if it is spinning, to sleep now: parallel work on the pool is about to
/// start, and a spinning thread would take a core from it.
pub(crate) fn quiet() {
    if let Some(Some(d)) = DUO.get() {
        d.hush.store(true, Ordering::Relaxed);
    }
}

/// Spins, yielding the core now and then, until the helper has set [`DONE`].
fn wait_done(d: &Duo) {
    let mut spins = 0u32;
    while d.state.load(Ordering::Acquire) != DONE {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(16) {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

/// Waits for the helper to finish the posted job (also when the calling side panics, so the
/// borrowed closure outlives its use), then frees the slot.
struct Wait(&'static Duo);

impl Drop for Wait {
    fn drop(&mut self) {
        wait_done(self.0);
        self.0.state.store(IDLE, Ordering::Relaxed);
        self.0.owner.store(FREE, Ordering::Release);
    }
}

/// The helper, its slot taken for this thread: `None` when there is no helper (or it is
/// another process's), or another thread's [`join`] holds the slot. A job [`post`] gave it is
/// waited for.
fn take_slot(by: u8) -> Option<&'static Duo> {
    let d = duo()?;
    if d.pid.load(Ordering::Relaxed) != std::process::id() {
        return None;
    }
    let mut spins = 0u32;
    loop {
        match d.owner.compare_exchange(FREE, by, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => return Some(d),
            Err(POSTED_JOB) => {}
            Err(_) => return None,
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(16) {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

/// Hands `job` to the helper and returns at once; the helper runs it, then drops it. The job
/// back, not run, when there is no helper or another thread's [`join`] holds the slot.
pub(crate) fn post(job: Box<dyn FnOnce() + Send>) -> Result<(), Box<dyn FnOnce() + Send>> {
    let Some(d) = take_slot(POSTED_JOB) else { return Err(job) };
    // SAFETY: this thread owns the slot (`owner`); the helper reads it only after POSTED.
    unsafe { *d.job.get() = Some(Job::Owned(job)) };
    d.state.store(POSTED, Ordering::Release);
    if *d.sleeping.lock().unwrap_or_else(|p| p.into_inner()) {
        d.wake.notify_one();
    }
    Ok(())
}

/// Runs `a` on this thread and `b` on the helper at once, returning when both have run
/// (sequentially on this thread when the helper is in use or unavailable). A panic in `b`
/// on the helper becomes a panic here, after `a` has run.
pub(crate) fn join<A: FnOnce(), B: FnOnce() + Send>(a: A, b: B) {
    let Some(d) = take_slot(JOINED) else {
        a();
        b();
        return;
    };
    let mut b = Some(b);
    let mut run_b = move || {
        if let Some(b) = b.take() {
            b()
        }
    };
    let f: &mut (dyn FnMut() + Send) = &mut run_b;
    // SAFETY: the lifetime is erased for the slot only; `Wait` does not let this frame end
    // (return or unwind) before the helper is done with it.
    let f: *mut (dyn FnMut() + Send + 'static) = unsafe { std::mem::transmute(f) };
    // SAFETY: this `join` owns the slot (`owner`); the helper reads it only after POSTED.
    unsafe { *d.job.get() = Some(Job::Borrowed(f)) };
    d.state.store(POSTED, Ordering::Release);
    let wait = Wait(d);
    if *d.sleeping.lock().unwrap_or_else(|p| p.into_inner()) {
        d.wake.notify_one();
    }
    a();
    wait_done(d);
    let panicked = d.panicked.load(Ordering::Relaxed);
    drop(wait);
    if panicked {
        panic!("a GEMM task on trn2core's second thread panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both closures run, each once, whatever the helper's state (spinning, asleep, or in use
    /// by another thread), and what they write is seen after `join`.
    #[test]
    fn join_runs_both_sides_once() {
        let mut total = 0u64;
        for i in 0..200u64 {
            let (mut x, mut y) = (0u64, 0u64);
            join(|| x = i, || y = 2 * i);
            assert_eq!((x, y), (i, 2 * i));
            total += x + y;
            if i % 50 == 0 {
                std::thread::sleep(SPIN * 3); // the helper goes to sleep
            }
        }
        assert_eq!(total, 3 * (0..200u64).sum::<u64>());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                std::thread::spawn(move || {
                    (0..500u64)
                        .map(|i| {
                            let (mut x, mut y) = (0u64, 0u64);
                            join(|| x = i + t, || y = i * t);
                            x + y
                        })
                        .sum::<u64>()
                })
            })
            .collect();
        for (t, h) in threads.into_iter().enumerate() {
            let t = t as u64;
            assert_eq!(h.join().expect("thread"), (0..500u64).map(|i| i + t + i * t).sum());
        }
    }

    /// Hushed (it sleeps at once), the helper still takes the next job.
    #[test]
    fn a_hushed_helper_still_takes_jobs() {
        for i in 0..50u64 {
            let mut y = 0;
            join(quiet, || y = i + 1);
            assert_eq!(y, i + 1);
            quiet();
        }
    }

    /// Posted jobs run, each once, in the order posted, and a `join` after one (or a post)
    /// waits for it rather than running both of its sides on the caller.
    #[test]
    fn posted_jobs_run_and_joins_wait_for_them() {
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        let log = Arc::new(Mutex::new(Vec::new()));
        let ran = Arc::new(AtomicU64::new(0));
        for i in 0..100u64 {
            let (l, r) = (log.clone(), ran.clone());
            let job: Box<dyn FnOnce() + Send> = Box::new(move || {
                if i % 10 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                l.lock().expect("log").push(i);
                r.fetch_add(1, Ordering::Release);
            });
            if let Err(job) = post(job) {
                job(); // no helper: run here (the order still holds)
            }
            if i % 3 == 0 {
                // A join takes the slot only once the posted job has run: its sides see
                // every job so far.
                let (mut seen, mut seen_b) = (0, 0);
                join(
                    || seen = ran.load(Ordering::Acquire),
                    || seen_b = ran.load(Ordering::Acquire),
                );
                assert_eq!((seen, seen_b), (i + 1, i + 1), "job {i} ran before the join");
            }
        }
        // A last join: every job has run.
        join(|| {}, || {});
        assert_eq!(*log.lock().expect("log"), (0..100).collect::<Vec<u64>>());
    }

    /// A panic on the helper's side reaches the caller, and the helper takes the next job.
    #[test]
    fn a_panic_on_the_helper_reaches_the_caller() {
        let r = std::panic::catch_unwind(|| join(|| {}, || panic!("boom")));
        assert!(r.is_err());
        let mut y = 0;
        join(|| {}, || y = 7);
        assert_eq!(y, 7);
    }
}
