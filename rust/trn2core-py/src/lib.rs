//! `trn2core._core`: the PyO3 binding of the pure-Rust `trn2core` crate. Each function converts
//! its arguments (names to the core's enums, arrays to slices), calls the core, releases the GIL
//! around long work, and maps errors (and panics) onto the `trn2core.Trn2Error` tree. Decisions
//! belong in the core.

mod arrays;
mod collectives;
mod dma;
mod engine;
mod errors;
mod host;
mod machine;
mod memory;
mod names;
mod numerics;
mod perf;
mod sparsity;
mod spec;
mod workload;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(numerics::encode, m)?)?;
    m.add_function(wrap_pyfunction!(numerics::decode, m)?)?;
    m.add_function(wrap_pyfunction!(numerics::stochastic_bits, m)?)?;
    m.add_function(wrap_pyfunction!(numerics::format_info, m)?)?;
    m.add_class::<numerics::PyFormatInfo>()?;
    m.add_function(wrap_pyfunction!(names::names, m)?)?;
    m.add_function(wrap_pyfunction!(names::format_aliases, m)?)?;
    m.add_function(wrap_pyfunction!(names::element_types, m)?)?;
    m.add_function(wrap_pyfunction!(names::instruction_table, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_entries, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_sources, m)?)?;
    m.add_function(wrap_pyfunction!(spec::spec_statuses, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_busy_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(host::host_memory, m)?)?;
    m.add_function(wrap_pyfunction!(host::check_alloc, m)?)?;
    m.add_class::<machine::PyMachine>()?;
    m.add_class::<machine::PyTile>()?;
    m.add_class::<machine::PyKernelReport>()?;
    m.add_function(wrap_pyfunction!(engine::gemm, m)?)?;
    m.add_function(wrap_pyfunction!(perf::estimate_gemm, m)?)?;
    m.add_function(wrap_pyfunction!(perf::_estimate_gemm_walk, m)?)?;
    m.add_class::<dma::PyStreamInfo>()?;
    m.add_function(wrap_pyfunction!(dma::dma_compress, m)?)?;
    m.add_function(wrap_pyfunction!(dma::dma_inspect, m)?)?;
    m.add_function(wrap_pyfunction!(dma::dma_describe, m)?)?;
    m.add_function(wrap_pyfunction!(dma::dma_decompress, m)?)?;
    m.add_function(wrap_pyfunction!(dma::dma_decompress_into, m)?)?;
    m.add_function(wrap_pyfunction!(dma::dma_copy_time, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity::sparsity_prune, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity::sparsity_compress, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity::sparsity_decompress, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity::sparsity_positions, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity::sparsity_to_cutlass, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity::sparsity_from_cutlass, m)?)?;
    m.add_class::<memory::PyHbmStack>()?;
    m.add_class::<memory::PyCoreMemory>()?;
    m.add_class::<memory::PyAllocation>()?;
    m.add_class::<memory::PyMemoryUsage>()?;
    m.add_class::<memory::PyStackPlacement>()?;
    m.add_function(wrap_pyfunction!(memory::memory_footprint, m)?)?;
    m.add_class::<collectives::PyTorus>()?;
    m.add_class::<collectives::PyPhaseTiming>()?;
    m.add_class::<collectives::PyCollectiveReport>()?;
    m.add_class::<collectives::PyTraffic>()?;
    m.add_function(wrap_pyfunction!(collectives::collective_estimate, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::collective_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::collective_move, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::collective_reduce_local, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::collective_move_local, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::placement, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::nccom_estimate, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::nccom_chips, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::nccom_machine, m)?)?;
    m.add_class::<collectives::PyLogicalCoreInfo>()?;
    m.add_function(wrap_pyfunction!(collectives::logical_core_members, m)?)?;
    m.add_function(wrap_pyfunction!(collectives::instance_types, m)?)?;
    m.add_function(wrap_pyfunction!(workload::workload_model, m)?)?;
    m.add_function(wrap_pyfunction!(workload::workload_step, m)?)?;
    m.add_function(wrap_pyfunction!(workload::workload_memory, m)?)?;
    m.add_function(wrap_pyfunction!(workload::workload_train, m)?)?;
    m.add_function(wrap_pyfunction!(workload::workload_search, m)?)?;
    m.add_class::<workload::PyModelInfo>()?;
    m.add_class::<workload::PyOpTime>()?;
    m.add_class::<workload::PyMemoryPlan>()?;
    m.add_class::<workload::PyStepParts>()?;
    m.add_class::<workload::PyStep>()?;
    m.add_class::<workload::PyStepReport>()?;
    m.add_class::<workload::PyTrainReport>()?;
    m.add_class::<workload::PyCandidate>()?;
    m.add_class::<workload::PySearchResult>()?;
    warm_up(m.py())
}

/// Builds, at import, everything otherwise built on first use: numpy's C API table and its
/// borrow-checking capsule, the core's tables, the main thread's id. A process forked while
/// another thread is inside its first call would otherwise wait forever for a build that no
/// thread of it will finish (`trn2core::pool::warm_up`).
fn warm_up(py: Python<'_>) -> PyResult<()> {
    use numpy::PyArrayMethods;
    let probe = numpy::PyArray1::<f32>::zeros(py, 1, false);
    drop(probe.readonly());
    errors::warm_up(py)?;
    trn2core::pool::warm_up();
    Ok(())
}
