//! Maps the core's one `Error` enum onto the Python exception tree of `trn2core.errors`, turns a
//! Rust panic into a Python exception instead of an abort or a `PanicException`, and runs long
//! calls with the GIL released and Ctrl-C honoured.
//!
//! # Long calls and Ctrl-C
//!
//! Python runs signal handlers only on its main thread, between bytecodes; a thread busy in
//! Rust never gets there. So [`guard_detached`], called on the main thread, runs the work on a
//! helper thread (kept from one call to the next; the work may borrow numpy buffers, since the
//! call returns only once the helper is done with it) with a fresh [`Cancel`] token installed,
//! and the main thread waits for it with the GIL released, waking every [`POLL`] to take the GIL
//! and run `PyErr_CheckSignals`. When a handler raises (`KeyboardInterrupt` for Ctrl-C), the
//! token is cancelled, the core's next check returns `Error::Interrupted` (core drivers check
//! between K tiles, output blocks, chunks and codec tasks: a few milliseconds apart), the work
//! ends, and the call raises the handler's exception. Objects stay usable: the core's work
//! unwinds through `?`, never through a panic, and no Python object is touched meanwhile.
//!
//! Handing the work over costs a wake-up of the helper (tens of microseconds); calls on other
//! threads (which cannot receive signals) and calls known to be short ([`guard_work`] under
//! [`INLINE_WORK`]) run inline on the calling thread instead, with the GIL released.

use std::ffi::c_ulong;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use trn2core::cancel::Cancel;
use trn2core::Error;

/// How often a waiting main thread checks for signals.
pub const POLL: Duration = Duration::from_millis(50);

/// Work (elementary operations: elements, bytes, multiply-adds) below which [`guard_work`] runs
/// inline: about a millisecond or less, not worth a helper thread nor able to delay Ctrl-C.
pub const INLINE_WORK: u64 = 1 << 22;

/// The error of every binding function: a core error (mapped onto the `trn2core.Trn2Error`
/// tree when it reaches Python) or a Python error raised on the way. `?` converts both, so a
/// binding function reads as "convert, call, return".
#[derive(Debug)]
pub enum PyTrn2Err {
    /// An error of the core.
    Core(Error),
    /// An exception already raised by Python (a conversion, numpy).
    Python(PyErr),
}

/// What every binding function returns.
pub type PyTrn2Result<T> = Result<T, PyTrn2Err>;

impl From<Error> for PyTrn2Err {
    fn from(e: Error) -> Self {
        PyTrn2Err::Core(e)
    }
}

impl From<PyErr> for PyTrn2Err {
    fn from(e: PyErr) -> Self {
        PyTrn2Err::Python(e)
    }
}

impl From<PyTrn2Err> for PyErr {
    fn from(e: PyTrn2Err) -> PyErr {
        match e {
            PyTrn2Err::Core(e) => Python::attach(|py| to_py(py, e)),
            PyTrn2Err::Python(e) => e,
        }
    }
}

/// Builds the Python exception for a core error (classes live in `trn2core/errors.py`), with
/// the argument it names and the rule it reports as the attributes `arg` and `rule`.
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let e = new_error(py, &err);
    if err.arg().is_some() {
        // Attributes of an exception object just made: setting them cannot fail in practice,
        // and the exception is still right without them.
        let v = e.value(py);
        let _ = v.setattr("arg", err.arg());
        let _ = v.setattr("rule", err.rule());
    }
    e
}

fn new_error(py: Python<'_>, err: &Error) -> PyErr {
    let (class, msg) = match err {
        Error::Shape { .. } => ("ShapeError", err.to_string()),
        Error::Format { .. } => ("FormatError", err.to_string()),
        Error::Value { .. } => ("Trn2ValueError", err.to_string()),
        Error::Sparsity { .. } => ("SparsityError", err.to_string()),
        Error::CorruptData { .. } => ("CorruptDataError", err.to_string()),
        Error::Capacity { .. } => ("CapacityError", err.to_string()),
        Error::Interrupted => return PyKeyboardInterrupt::new_err(err.to_string()),
    };
    raise(py, class, msg)
}

/// An instance of `trn2core.errors.<class>` with `msg` (a `RuntimeError` if the module is gone).
fn raise(py: Python<'_>, class: &str, msg: String) -> PyErr {
    match py.import("trn2core.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.call1((msg,)) {
            Ok(obj) => PyErr::from_value(obj),
            Err(e) => e,
        },
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

/// The `InternalError` for a caught panic.
fn panic_error(py: Python<'_>, payload: Box<dyn std::any::Any + Send>) -> PyErr {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    raise(py, "InternalError", format!("internal error in trn2core (please report it): {what}"))
}

type Caught<T> = std::thread::Result<Result<T, Error>>;

fn convert<T>(py: Python<'_>, r: Caught<T>) -> PyResult<T> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_py(py, e)),
        Err(payload) => Err(panic_error(py, payload)),
    }
}

/// Runs `f`, converting a core error into its Python exception and a panic into
/// `trn2core.errors.InternalError` (a `Trn2Error`) carrying the panic message. The GIL stays
/// held and `f` runs on the calling thread: for validation and other short work with no
/// parallel section (those go through [`guard_work`] or [`guard_detached`], which run on the
/// fork-safe pool of `trn2core::pool`).
pub fn guard<T>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error>) -> PyResult<T> {
    convert(py, std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
}

/// [`guard`] for every long call: the GIL is released around `f`, and on the main thread
/// Ctrl-C interrupts it (module doc). `f` must check the core's cancellation token
/// (`trn2core::cancel`) at least every few milliseconds of work to stop promptly.
pub fn guard_detached<T: Send>(
    py: Python<'_>, f: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    if !on_main_thread(py)? {
        return inline(py, f);
    }
    let (mut f, mut out) = (Some(f), None);
    let ran = detached(py, &mut || out = f.take().map(|f| f()))?;
    finish(py, ran, out)
}

/// A call's work with its type erased: [`detached`] and [`inline`]'s machinery (a helper
/// thread, the signal loop, the pool, `catch_unwind`) is compiled once, not once per binding
/// function (it was a sixth of the binding's code). It stores its result where the caller
/// reads it ([`finish`]).
type Job<'a> = dyn FnMut() + Send + 'a;

/// What became of a [`Job`]: it ran (or the pool could not be had), or it panicked.
type Ran = std::thread::Result<Result<(), Error>>;

/// The caller's result of a job that ran as `ran` and left `out`.
fn finish<T>(py: Python<'_>, ran: Ran, out: Option<Result<T, Error>>) -> PyResult<T> {
    match (ran, out) {
        (Ok(Ok(())), Some(r)) => convert(py, Ok(r)),
        (Ok(Err(e)), _) => Err(to_py(py, e)),
        (Err(payload), _) => Err(panic_error(py, payload)),
        (Ok(Ok(())), None) => {
            Err(PyRuntimeError::new_err("internal error in trn2core: the work of a call was lost"))
        }
    }
}

/// A [`Job`] for the helper thread, its borrows erased (see [`detached`]).
type Task = Box<dyn FnOnce() + Send + 'static>;

/// The thread that runs the main thread's long calls ([`detached`]), kept from one call to the
/// next. A thread started for each call waited up to a millisecond for a core (a new thread
/// queues behind the running ones, the pool's workers looking for work included), which
/// doubled the time of an NKI matmul whose 128 settles take about a millisecond each; a
/// waiting thread that is woken runs at once.
struct Helper {
    /// The process that started the thread (a forked child does not have it).
    pid: u32,
    /// Where the thread takes its tasks from.
    tasks: mpsc::Sender<Task>,
}

/// The idle helper (none before the first long call, or while a call has it).
static HELPER: Mutex<Option<Helper>> = Mutex::new(None);

/// The helper for one call: the idle one, or a new one when there is none (the first call, a
/// forked child, a call made while another has it: a signal handler's); `None` if no thread
/// can be started.
fn take_helper() -> Option<Helper> {
    let pid = std::process::id();
    if let Some(h) = HELPER.lock().ok().and_then(|mut g| g.take()) {
        if h.pid == pid {
            return Some(h);
        }
        // A parent's: its thread is not in this process, and its channel may have been
        // copied mid-operation. Left alone (a few bytes).
        std::mem::forget(h);
    }
    let (tasks, rx) = mpsc::channel::<Task>();
    std::thread::Builder::new()
        .name("trn2core-call".into())
        .spawn(move || {
            while let Ok(task) = rx.recv() {
                task();
            }
        })
        .ok()?;
    Some(Helper { pid, tasks })
}

/// Gives a call's helper back for the next call (stopped instead if another is already idle).
fn put_helper(h: Helper) {
    if let Ok(mut idle) = HELPER.lock() {
        if idle.is_none() {
            *idle = Some(h);
        }
    }
}

/// Blocks until every sender of its channel is gone: [`detached`]'s task has finished or been
/// dropped, so nothing borrows the caller's frame any more (also when the caller unwinds).
struct AwaitTask(mpsc::Receiver<()>);

impl Drop for AwaitTask {
    fn drop(&mut self) {
        while self.0.recv().is_ok() {}
    }
}

/// Runs `job` on the helper thread ([`Helper`]) with a fresh [`Cancel`] token while this
/// (main) thread waits with the GIL released and runs the signal handlers every [`POLL`]. A
/// handler's exception (`KeyboardInterrupt` for Ctrl-C) is the `Err`: it wins over whatever
/// the work returned.
fn detached(py: Python<'_>, job: &mut Job<'_>) -> PyResult<Ran> {
    let token = Cancel::new();
    let slot = Mutex::new(Some(job));
    let outcome: Mutex<Option<Ran>> = Mutex::new(None);
    let signal = py.detach(|| {
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let worker_token = token.clone();
        let (slot, outcome) = (&slot, &outcome);
        let task = move || {
            // Dropped last, when the work has ended (also by a panic): wakes the waiting thread.
            let _done = done_tx;
            let job = slot.lock().ok().and_then(|mut g| g.take());
            let ran = job.map(|job| worker_token.install(|| run(job)));
            if let Ok(mut o) = outcome.lock() {
                *o = ran;
            }
        };
        let task: Box<dyn FnOnce() + Send + '_> = Box::new(task);
        // SAFETY: only the lifetime changes. The task borrows `slot` and `outcome`, which
        // outlive `wait`; `wait`'s drop (below, also when unwinding) returns only once the
        // task's `done_tx` is gone, i.e. the task has run to its end or been dropped unrun.
        let task: Task =
            unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Task>(task) };
        let wait = AwaitTask(done_rx);
        let helper = take_helper();
        let sent = match &helper {
            Some(h) => h.tasks.send(task).map_err(|e| e.0),
            None => Err(task),
        };
        let mut signal: Option<PyErr> = None;
        match sent {
            // No thread to be had: the work runs here, uninterruptibly.
            Err(task) => task(),
            Ok(()) => {
                while let Err(mpsc::RecvTimeoutError::Timeout) = wait.0.recv_timeout(POLL) {
                    if signal.is_none() {
                        if let Err(e) = Python::attach(|py| py.check_signals()) {
                            token.cancel();
                            signal = Some(e);
                        }
                    }
                }
                if let Some(h) = helper {
                    put_helper(h);
                }
            }
        }
        drop(wait);
        signal
    });
    let outcome = outcome.into_inner().ok().flatten();
    match (signal, outcome) {
        (Some(e), _) => Err(e),
        (None, Some(ran)) => Ok(ran),
        (None, None) => Ok(Ok(Ok(()))),
    }
}

/// `job` on this process's thread pool (`trn2core::pool`: fork-safe), a panic caught.
fn run(job: &mut Job<'_>) -> Ran {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        trn2core::pool::install(|| {
            job();
            Ok(())
        })
    }))
}

/// [`guard_detached`] for a call of about `work` elementary operations: inline (GIL released,
/// no helper thread) below [`INLINE_WORK`].
pub fn guard_work<T: Send>(
    py: Python<'_>, work: u64, f: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    if work < INLINE_WORK {
        inline(py, f)
    } else {
        guard_detached(py, f)
    }
}

/// `f` with the GIL released (no signal checks), on this process's thread pool
/// (`trn2core::pool`: fork-safe).
fn inline<T: Send>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error> + Send) -> PyResult<T> {
    let (mut f, mut out) = (Some(f), None);
    let mut job = || out = f.take().map(|f| f());
    let ran = py.detach(|| run(&mut job));
    finish(py, ran, out)
}

/// Items between two signal checks of [`poll_signals`].
const POLL_ITEMS: usize = 1024;

/// For item `i` of a loop over a call's buffers that holds the GIL (checking, borrowing or
/// making hundreds of thousands of numpy arrays takes a second or more, and Python runs no
/// signal handler meanwhile): every [`POLL_ITEMS`] items, runs the handlers, so Ctrl-C stops
/// the loop there with their exception.
pub fn poll_signals(py: Python<'_>, i: usize) -> PyResult<()> {
    if i.is_multiple_of(POLL_ITEMS) {
        py.check_signals()
    } else {
        Ok(())
    }
}

/// Asks for the main thread's id once, at import ([`on_main_thread`]; the crate's `warm_up`).
pub fn warm_up(py: Python<'_>) -> PyResult<()> {
    on_main_thread(py).map(drop)
}

/// Whether this is Python's main thread, the only one that runs signal handlers.
///
/// The first call asks `threading.main_thread()`: Python code, so a signal that arrived while
/// the binding held the GIL without running bytecode (borrowing 262144 buffers, say) has its
/// handler run right there. Its exception (`KeyboardInterrupt`) is passed on, never dropped:
/// `.ok()` here used to swallow a Ctrl-C that landed in the first long call of a process.
fn on_main_thread(py: Python<'_>) -> PyResult<bool> {
    static MAIN: OnceLock<c_ulong> = OnceLock::new();
    let main = match MAIN.get() {
        Some(&m) => m,
        None => {
            let m = py
                .import("threading")?
                .call_method0("main_thread")?
                .getattr("ident")?
                .extract::<c_ulong>()?;
            *MAIN.get_or_init(|| m)
        }
    };
    // SAFETY: PyThread_get_thread_ident has no preconditions (it reads the calling thread's id).
    let me = unsafe { pyo3::ffi::PyThread_get_thread_ident() };
    Ok(main == me)
}

/// Panics inside the guard, so the test suite can check that a Rust panic reaches Python as
/// `trn2core.errors.InternalError` (not an abort, not `PanicException`). Not part of the API.
#[pyfunction]
pub fn _panic_for_test(py: Python<'_>, message: String) -> PyResult<()> {
    guard_detached(py, move || -> Result<(), Error> { panic!("{message}") })
}

/// Spins for `seconds` in Rust, checking the cancellation token every millisecond: lets the
/// test suite time Ctrl-C and GIL release without depending on a kernel's speed. Not part of
/// the API.
#[pyfunction]
pub fn _busy_for_test(py: Python<'_>, seconds: f64) -> PyResult<u64> {
    let seconds = seconds.clamp(0.0, 600.0);
    guard_detached(py, move || {
        let cancel = trn2core::cancel::current();
        let start = std::time::Instant::now();
        let mut checks = 0u64;
        while start.elapsed().as_secs_f64() < seconds {
            cancel.check()?;
            checks += 1;
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_millis(1) {
                std::hint::spin_loop();
            }
        }
        Ok(checks)
    })
}
