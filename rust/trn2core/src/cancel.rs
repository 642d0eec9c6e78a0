//! Cooperative cancellation of long calls (Ctrl-C in Python).
//!
//! A [`Cancel`] token is a shared flag. Whoever runs a long call on behalf of someone who may
//! give up on it (the Python binding, for Ctrl-C) creates a token, *installs* it on the thread
//! that runs the call ([`Cancel::install`]), and later [`Cancel::cancel`]s it from another
//! thread. Long computations pick the installed token up once, at their start, with
//! [`current()`], and check it at natural boundaries (between K tiles and output blocks of a
//! GEMM, between chunks of an element-wise kernel, between codec tasks); a cancelled check
//! returns [`Error::Interrupted`], which unwinds the call through the ordinary `?` path, so no
//! object is left half-updated by a panic and every lock is released.
//!
//! The token lives in a thread-local only on the thread that starts the call: rayon's worker
//! threads do not inherit it. So a driver takes `let cancel = cancel::current();` *before* its
//! parallel section and moves (or borrows) that handle into its closures:
//!
//! ```
//! use rayon::prelude::*;
//! use trn2core::{cancel, Result};
//!
//! fn double_all(x: &mut [f32]) -> Result<()> {
//!     let cancel = cancel::current();
//!     x.par_chunks_mut(1 << 16).try_for_each(|c| {
//!         cancel.check()?; // one relaxed atomic load per chunk
//!         c.iter_mut().for_each(|v| *v *= 2.0);
//!         Ok(())
//!     })
//! }
//! # double_all(&mut [1.0, 2.0]).unwrap();
//! ```
//!
//! A driver that itself runs inside a rayon task (say, one physical core's GEMM of a chip-wide
//! split) re-installs the handle it was given: `cancel.install(|| engine::gemm_f32(...))`.
//! Without an installed token [`current()`] returns an inert handle whose checks cost one branch,
//! so code that never runs under a token (tests, the Rust API) pays nothing.
//!
//! Checks should be at least every few milliseconds of work on one thread: the binding promises
//! `KeyboardInterrupt` within a second of Ctrl-C.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::{Error, Result};

/// A cancellation flag, cheap to clone and to check; see the [module doc](self).
#[derive(Debug, Clone, Default)]
pub struct Cancel(Option<Arc<AtomicBool>>);

thread_local! {
    static CURRENT: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

impl Cancel {
    /// A new, armed token (not cancelled).
    pub fn new() -> Cancel {
        Cancel(Some(Arc::new(AtomicBool::new(false))))
    }

    /// A token that can never be cancelled (what [`current()`] returns without an installed
    /// token).
    pub const fn none() -> Cancel {
        Cancel(None)
    }

    /// Requests cancellation: every later [`Cancel::check`] of this token (or of its clones)
    /// fails. Callable from any thread.
    pub fn cancel(&self) {
        if let Some(f) = &self.0 {
            f.store(true, Ordering::Relaxed);
        }
    }

    /// Whether cancellation was requested.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(Error::Interrupted)` once cancellation was requested, else `Ok(())`.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Interrupted)
        } else {
            Ok(())
        }
    }

    /// Runs `f` with this token installed as the current thread's token (what [`current()`]
    /// returns inside `f`); the previous one is restored afterwards, also if `f` panics.
    pub fn install<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<Arc<AtomicBool>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let prev = self.0.take();
                CURRENT.with(|c| *c.borrow_mut() = prev);
            }
        }
        let prev = CURRENT.with(|c| c.replace(self.0.clone()));
        let _restore = Restore(prev);
        f()
    }
}

/// The token installed on this thread (an inert one if none is): take it once, before a
/// parallel section, and check it inside.
pub fn current() -> Cancel {
    Cancel(CURRENT.with(|c| c.borrow().clone()))
}

/// Checks this thread's installed token: for sequential loops that run on the calling thread.
pub fn check() -> Result<()> {
    CURRENT.with(|c| match &*c.borrow() {
        Some(f) if f.load(Ordering::Relaxed) => Err(Error::Interrupted),
        _ => Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_scopes_and_restores() {
        assert!(!current().is_cancelled());
        let outer = Cancel::new();
        let inner = Cancel::new();
        outer.install(|| {
            inner.install(|| {
                inner.cancel();
                assert_eq!(check(), Err(Error::Interrupted));
                assert!(current().is_cancelled());
            });
            assert_eq!(check(), Ok(()), "the outer token is back");
            outer.cancel();
            assert_eq!(current().check(), Err(Error::Interrupted));
        });
        assert_eq!(check(), Ok(()), "nothing installed after the call");
    }

    #[test]
    fn restored_after_a_panic() {
        let t = Cancel::new();
        t.cancel();
        let r = std::panic::catch_unwind(|| t.install(|| panic!("boom")));
        assert!(r.is_err());
        assert_eq!(check(), Ok(()));
    }

    #[test]
    fn inert_token_never_fires() {
        let t = Cancel::none();
        t.cancel();
        assert_eq!(t.check(), Ok(()));
    }

    #[test]
    fn clones_share_the_flag_across_threads() {
        let t = Cancel::new();
        let c = t.clone();
        std::thread::spawn(move || c.cancel()).join().expect("thread");
        assert!(t.is_cancelled());
    }
}
