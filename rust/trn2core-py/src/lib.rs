//! `trn2core._core`: the PyO3 binding of the pure-Rust `trn2core` crate. Each function converts
//! its arguments (names to the core's enums, arrays to slices), calls the core, releases the GIL
//! around long work, and maps errors (and panics) onto the `trn2core.Trn2Error` tree. Decisions
//! belong in the core.

/// The `#[pymethods]` of a frozen Python view of a core struct held in `self.inner`: a getter
/// per listed field (`name: Type` returns `inner.name`, `name: Type = field` returns
/// `inner.field`), then the methods written out.
macro_rules! view_pymethods {
    (impl $Class:ident {
        get { $($(#[$doc:meta])* $name:ident: $ty:ty $(= $field:ident)?),+ $(,)? }
        $($methods:tt)*
    }) => {
        #[pymethods]
        impl $Class {
            $(
                $(#[$doc])*
                #[getter]
                fn $name(&self) -> $ty {
                    view_pymethods!(@field self.inner, $name $(, $field)?)
                }
            )+
            $($methods)*
        }
    };
    (@field $view:expr, $name:ident) => {
        $view.$name
    };
    (@field $view:expr, $name:ident, $field:ident) => {
        $view.$field
    };
}

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

/// Adds one binding module's functions and classes to the extension module `m`:
/// `export!(m, module { fn f, g; class C; })` (either list may be left out).
macro_rules! export {
    ($m:ident, $module:ident { $(fn $($f:ident),+;)? $(class $($c:ident),+;)? }) => {
        $($($m.add_function(wrap_pyfunction!($module::$f, $m)?)?;)+)?
        $($($m.add_class::<$module::$c>()?;)+)?
    };
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    export!(m, numerics { fn encode, decode, stochastic_bits, format_info; class PyFormatInfo; });
    export!(m, names { fn names, format_aliases, element_types, instruction_table; });
    export!(m, spec { fn spec_entries, spec_sources, spec_statuses; });
    export!(m, errors { fn _panic_for_test, _busy_for_test; });
    export!(m, host { fn host_memory, check_alloc; });
    export!(m, machine { class PyMachine, PyTile, PyKernelReport; });
    export!(m, engine { fn gemm; });
    export!(m, perf { fn estimate_gemm, _estimate_gemm_walk; class PyReport, PyUncertainty; });
    export!(m, dma {
        fn dma_compress, dma_inspect, dma_describe, dma_decompress, dma_decompress_into,
            dma_copy_time;
        class PyStreamInfo;
    });
    export!(m, sparsity {
        fn sparsity_prune, sparsity_compress, sparsity_decompress, sparsity_positions,
            sparsity_to_cutlass, sparsity_from_cutlass;
    });
    export!(m, memory {
        fn memory_footprint;
        class PyHbmStack, PyCoreMemory, PyAllocation, PyMemoryUsage, PyStackPlacement;
    });
    export!(m, collectives {
        fn collective_estimate, collective_reduce, collective_move, collective_reduce_local,
            collective_move_local, placement, nccom_estimate, nccom_chips, nccom_machine,
            logical_core_members, instance_types;
        class PyTorus, PyPhaseTiming, PyCollectiveReport, PyNccomRow, PyTraffic,
            PyLogicalCoreInfo;
    });
    export!(m, workload {
        fn workload_model, workload_step, workload_memory, workload_train, workload_search;
        class PyModelInfo, PyOpTime, PyMemoryPlan, PyStepParts, PyStep, PyStepReport, PyTrainReport,
            PyCandidate, PySearchResult;
    });
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
