//! Bindings of `trn2core::host`: the host-memory figure and check the facade uses before it
//! allocates a user-sized array itself.

use pyo3::prelude::*;

use crate::errors::guard;

/// How many bytes the host can still give trn2core, and where that figure comes from
/// (`trn2core::host`); `None` when unknown; `Trn2ValueError` for a bad `TRN2CORE_HOST_MEMORY`.
#[pyfunction]
pub fn host_memory(py: Python<'_>) -> PyResult<Option<(u64, &'static str)>> {
    guard(py, trn2core::host::available_memory)
}

/// `CapacityError` on `arg` unless `nbytes` more can be allocated on this host: what the facade
/// calls before it allocates a user-sized array itself.
#[pyfunction]
pub fn check_alloc(py: Python<'_>, arg: &str, what: &str, nbytes: u128) -> PyResult<()> {
    guard(py, || trn2core::host::check_alloc(arg, what, nbytes))
}
