//! Maps the core's one `Error` enum onto the Python exception tree of `trn2core.errors`, and
//! turns a Rust panic into a Python exception instead of an abort or a `PanicException`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use trn2core::Error;

/// Builds the Python exception for a core error (classes live in `trn2core/errors.py`).
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let (class, msg) = match &err {
        Error::Shape { .. } => ("ShapeError", err.to_string()),
        Error::Format { .. } => ("FormatError", err.to_string()),
        Error::Value { .. } => ("Trn2ValueError", err.to_string()),
        Error::Sparsity { .. } => ("SparsityError", err.to_string()),
        Error::CorruptData { .. } => ("CorruptDataError", err.to_string()),
        Error::Capacity { .. } => ("CapacityError", err.to_string()),
    };
    match py.import("trn2core.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => PyErr::from_value(match cls.call1((msg.clone(),)) {
            Ok(obj) => obj,
            Err(e) => return e,
        }),
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

/// Runs `f`, converting a core error into its Python exception and a panic into
/// `trn2core.errors.InternalError` (a `Trn2Error`) carrying the panic message.
pub fn guard<T>(py: Python<'_>, f: impl FnOnce() -> Result<T, Error>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_py(py, e)),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            let msg = format!("internal error in trn2core (please report it): {what}");
            Err(
                match py
                    .import("trn2core.errors")
                    .and_then(|m| m.getattr("InternalError"))
                {
                    Ok(cls) => match cls.call1((msg.clone(),)) {
                        Ok(obj) => PyErr::from_value(obj),
                        Err(e) => e,
                    },
                    Err(_) => PyRuntimeError::new_err(msg),
                },
            )
        }
    }
}

/// [`guard`] with the GIL released around `f`, for every long call.
pub fn guard_detached<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    let res = py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    guard(py, move || match res {
        Ok(r) => r,
        Err(payload) => std::panic::resume_unwind(payload),
    })
}

/// Panics inside the guard, so the test suite can check that a Rust panic reaches Python as
/// `trn2core.errors.InternalError` (not an abort, not `PanicException`). Not part of the API.
#[pyfunction]
pub fn _panic_for_test(py: Python<'_>, message: String) -> PyResult<()> {
    guard_detached(py, move || -> Result<(), Error> { panic!("{message}") })
}
