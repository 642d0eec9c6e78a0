//! Bindings of the tensor engine: `NeuronCore` (one instruction at a time, with PSUM) and the
//! whole-GEMM kernel. Operands arrive as flat float32 arrays of exact values plus their format.

use numpy::PyArrayMethods;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Mutex, MutexGuard};
use trn2core::engine::{self, Operand, PeTile, PerfMode};
use trn2core::numerics::Format;
use trn2core::topology::NeuronCore;
use trn2core::Error;

use crate::arrays::{borrow, new_uninit, slice, to_numpy};
use crate::errors::{guard, guard_work};
use crate::perf::report_dict;

/// One physical NeuronCore-v3 (the facade's `trn2core.NeuronCore` wraps it).
///
/// Shareable between Python threads: the core's state (PSUM, the engine's clock) sits behind a
/// mutex taken only with the GIL released, so concurrent instructions on one core run one at a
/// time, each whole, as two queues feeding one engine would (docs/limitations.md).
#[pyclass(name = "NeuronCore", module = "trn2core._core", frozen)]
pub struct PyNeuronCore {
    index: usize,
    inner: Mutex<NeuronCore>,
}

impl PyNeuronCore {
    /// The core's state. A panic while it was held (a bug, reported as `InternalError`) may
    /// have left one PSUM region half written; the core stays usable.
    fn lock(&self) -> MutexGuard<'_, NeuronCore> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[pymethods]
impl PyNeuronCore {
    #[new]
    #[pyo3(signature = (index = 0))]
    fn new(index: usize) -> Self {
        PyNeuronCore {
            index,
            inner: Mutex::new(NeuronCore::new(index)),
        }
    }

    #[getter]
    fn index(&self) -> usize {
        self.index
    }

    /// One `nc_matmul`; returns the PSUM region's new contents, flat `[M * N]`.
    #[pyo3(signature = (stationary, stationary_shape, stationary_format, moving, moving_shape, moving_format, bank, accumulate, perf_mode, tile_position, tile_size))]
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        py: Python<'_>,
        stationary: &Bound<'_, PyAny>,
        stationary_shape: Vec<usize>,
        stationary_format: &str,
        moving: &Bound<'_, PyAny>,
        moving_shape: Vec<usize>,
        moving_format: &str,
        bank: usize,
        accumulate: bool,
        perf_mode: &str,
        tile_position: Option<(usize, usize)>,
        tile_size: Option<(usize, usize)>,
    ) -> PyResult<Py<PyAny>> {
        let sf = guard(py, || Format::parse("stationary", stationary_format))?;
        let mf = guard(py, || Format::parse("moving", moving_format))?;
        let mode = guard(py, || PerfMode::parse("perf_mode", perf_mode))?;
        let tile = guard(py, || PeTile::from_options(tile_position, tile_size))?;
        let sa = guard(py, || borrow::<f32>(stationary, "stationary", "float32"))?;
        let ma = guard(py, || borrow::<f32>(moving, "moving", "float32"))?;
        let sv = guard(py, || slice(&sa, "stationary"))?;
        let mv = guard(py, || slice(&ma, "moving"))?;
        let st = Operand {
            values: sv,
            shape: &stationary_shape,
            format: sf,
        };
        let mo = Operand {
            values: mv,
            shape: &moving_shape,
            format: mf,
        };
        // One instruction is bounded (at most 256 x 128 x 512 multiply-adds): run it inline.
        let out = guard_work(py, 0, || {
            self.lock().matmul(&st, &mo, bank, accumulate, mode, tile)
        })?;
        Ok(to_numpy(py, out))
    }

    /// Transpose mode: writes `stationary.T` to PSUM `bank` and costs it.
    fn transpose(
        &self,
        py: Python<'_>,
        stationary: &Bound<'_, PyAny>,
        k: usize,
        m: usize,
        format: &str,
        bank: usize,
    ) -> PyResult<()> {
        let f = guard(py, || Format::parse("stationary", format))?;
        let sa = guard(py, || borrow::<f32>(stationary, "stationary", "float32"))?;
        let sv = guard(py, || slice(&sa, "stationary"))?;
        guard_work(py, 0, || self.lock().transpose(sv, k, m, f, bank))
    }

    /// PSUM `bank`, partitions `0..rows`, elements `0..cols`, flat.
    fn read_psum(
        &self,
        py: Python<'_>,
        bank: usize,
        rows: usize,
        cols: usize,
    ) -> PyResult<Py<PyAny>> {
        let out = guard_work(py, 0, || self.lock().read_psum(bank, rows, cols))?;
        Ok(to_numpy(py, out))
    }

    /// Timing of the instructions issued so far.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let rep = guard_work(py, 0, || Ok(self.lock().report()))?;
        report_dict(py, &rep)
    }
}

/// Checks that the engine takes these operand formats (the same rules as one instruction).
#[pyfunction]
pub fn check_gemm_formats(
    py: Python<'_>,
    a_format: &str,
    b_format: &str,
    perf_mode: &str,
) -> PyResult<()> {
    let af = guard(py, || Format::parse("a", a_format))?;
    let bf = guard(py, || Format::parse("b", b_format))?;
    let mode = guard(py, || PerfMode::parse("perf_mode", perf_mode))?;
    let (sa, sb): (&[usize], &[usize]) = match mode {
        PerfMode::DoubleRow => (&[128, 2, 1], &[128, 2, 1]),
        PerfMode::None => (&[1, 1], &[1, 1]),
    };
    guard(py, || {
        engine::validate_matmul(sa, af, sb, bf, mode, PeTile::FULL).map(|_| ())
    })
    .map_err(|e| rename_args(py, e))
}

/// Error messages of the instruction check name `stationary`/`moving`; for a GEMM those are
/// `a`/`b`.
fn rename_args(py: Python<'_>, e: PyErr) -> PyErr {
    let msg = e.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    let msg = msg
        .replacen("stationary", "a", 1)
        .replacen("moving", "b", 1);
    match e.get_type(py).call1((msg,)) {
        Ok(obj) => PyErr::from_value(obj),
        Err(other) => other,
    }
}

/// The whole GEMM `a @ b` (`a` `[M, K]`, `b` `[K, N]`, flat float32 of exact values), bit-exact,
/// with the GIL released; returns flat `[M * N]` float32.
#[pyfunction]
#[pyo3(signature = (a, b, m, k, n, perf_mode))]
pub fn gemm(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    m: usize,
    k: usize,
    n: usize,
    perf_mode: &str,
) -> PyResult<Py<PyAny>> {
    let mode = guard(py, || PerfMode::parse("perf_mode", perf_mode))?;
    let (arr, ()) = gemm_to_numpy(py, a, b, [m, k, n], |av, bv, out| {
        engine::gemm_f32_into(av, bv, m, k, n, mode, out)
    })?;
    Ok(arr)
}

/// Runs `kernel(a, b, out)` on the float32 operands `a` `[m, k]` and `b` `[k, n]` with an
/// `[m, n]` float32 result in numpy's memory (refused before allocating when the host cannot
/// hold it); returns the result and what the kernel returned.
fn gemm_to_numpy<T>(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    [m, k, n]: [usize; 3],
    kernel: impl FnOnce(&[f32], &[f32], &mut [f32]) -> Result<T, Error> + Send,
) -> PyResult<(Py<PyAny>, T)>
where
    T: Send,
{
    let aa = guard(py, || borrow::<f32>(a, "a", "float32"))?;
    let ba = guard(py, || borrow::<f32>(b, "b", "float32"))?;
    let av = guard(py, || slice(&aa, "a"))?;
    let bv = guard(py, || slice(&ba, "b"))?;
    let len = guard(py, || out_len(m, n))?;
    let what = format!("the {m} x {n} float32 result");
    // SAFETY: every kernel passed here writes all `m * n` elements (each checks the length)
    // before Python can read the array.
    let arr = guard(py, || unsafe { new_uninit::<f32>(py, len, "out", &what) })?;
    let done = {
        let mut rw = arr.readwrite();
        let out = guard(py, || {
            rw.as_slice_mut()
                .map_err(|_| Error::shape("out", "not contiguous"))
        })?;
        let work = (m as u64).saturating_mul(k as u64).saturating_mul(n as u64);
        guard_work(py, work, || kernel(av, bv, out))?
    };
    Ok((arr.into_any().unbind(), done))
}

/// `a @ b` for an `a` pruned to a sparse pattern (normal perf_mode): the dense GEMM's bits,
/// skipping `a`'s zeros where that is faster. Returns the result and whether zeros were skipped.
#[pyfunction]
pub fn gemm_skip_zeros(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    m: usize,
    k: usize,
    n: usize,
) -> PyResult<(Py<PyAny>, bool)> {
    let (arr, kernel) = gemm_to_numpy(py, a, b, [m, k, n], |av, bv, out| {
        engine::gemm_skip_zeros_into(av, bv, m, k, n, out)
    })?;
    Ok((arr, kernel == engine::SparseKernel::SkipZeros))
}

/// Elements of an `m x n` float32 result, after checking that the host can hold it
/// (`CapacityError` before numpy allocates anything).
pub fn out_len(m: usize, n: usize) -> Result<usize, Error> {
    let len = m.checked_mul(n).ok_or_else(|| {
        Error::capacity(
            "out",
            format!("the {m} x {n} result has more elements than this host can address"),
        )
    })?;
    trn2core::host::check_alloc(
        "out",
        &format!("the {m} x {n} float32 result"),
        len as u128 * 4,
    )?;
    Ok(len)
}
