//! Bindings of the chip, the torus and the collectives (`trn2core::topology`), and of the GEMM
//! split over several cores (`trn2core::engine::cost::split`). Conversion and error mapping only.

use numpy::{Element, PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use trn2core::collective::{
    self, output_lengths, Algorithm, Buf, BufMut, Collective, CollectiveReport, Group, PhaseTiming,
    ReduceOp,
};
use trn2core::engine::cost::estimate_gemm_cores as core_gemm_cores;
use trn2core::numerics::Format;
use trn2core::topology::{self as topo, Torus};
use trn2core::Error;

use crate::arrays::borrow;
use crate::errors::{guard, guard_detached};
use crate::perf::{report_dict, uncertainty_dict};

/// A NeuronLink torus of chips, possibly several UltraServers joined by EFA (wrapped by
/// `trn2core.Torus`).
#[pyclass(name = "Torus", module = "trn2core._core", frozen)]
pub struct PyTorus {
    pub inner: Torus,
}

#[pymethods]
impl PyTorus {
    #[new]
    #[pyo3(signature = (shape, ultraservers = 1))]
    fn new(py: Python<'_>, shape: Vec<usize>, ultraservers: usize) -> PyResult<Self> {
        let inner = guard(py, || Torus::new(&shape, ultraservers))?;
        Ok(PyTorus { inner })
    }

    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape()
    }
    #[getter]
    fn torus_shape(&self) -> Vec<usize> {
        self.inner.torus_shape().to_vec()
    }
    #[getter]
    fn ultraservers(&self) -> usize {
        self.inner.ultraservers()
    }
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }
    #[getter]
    fn chip_egress_bytes_per_s(&self) -> f64 {
        self.inner.chip_egress_bytes_per_s()
    }
    fn coords(&self, py: Python<'_>, i: usize) -> PyResult<Vec<usize>> {
        guard(py, || self.inner.coords(i))
    }
    fn index(&self, py: Python<'_>, coords: Vec<usize>) -> PyResult<usize> {
        guard(py, || self.inner.index(&coords))
    }
    fn neighbors(&self, py: Python<'_>, i: usize) -> PyResult<Vec<usize>> {
        guard(py, || self.inner.neighbors(i))
    }
    fn hops(&self, py: Python<'_>, i: usize, j: usize) -> PyResult<usize> {
        guard(py, || self.inner.hops(i, j))
    }
    fn link_bandwidth(&self, py: Python<'_>, i: usize, j: usize) -> PyResult<f64> {
        guard(py, || self.inner.link_bandwidth(i, j))
    }
    /// The links a transfer from `i` to `j` takes, by name.
    fn route(&self, py: Python<'_>, i: usize, j: usize) -> PyResult<Vec<String>> {
        guard(py, || {
            // Checks both chips, naming `i` or `j` in the error.
            self.inner.hops(i, j)?;
            let mut names = Vec::new();
            self.inner
                .route(i, j, |l| names.push(self.inner.link_name(l)));
            Ok(names)
        })
    }
}

fn group<'a>(py: Python<'_>, t: &'a Torus, chips: Option<Vec<usize>>) -> PyResult<Group<'a>> {
    match chips {
        None => Ok(Group::all(t)),
        Some(c) => guard(py, || Group::new(t, c)),
    }
}

/// The phases of a collective's timing as a list of dicts.
fn phase_list<'py>(
    py: Python<'py>,
    t: &Torus,
    phases: &[PhaseTiming],
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for p in phases {
        let pd = PyDict::new(py);
        pd.set_item("name", p.name)?;
        pd.set_item("steps", p.repeat)?;
        pd.set_item("seconds", p.seconds())?;
        pd.set_item("step_s", p.step_s)?;
        pd.set_item("latency_s", p.latency_s)?;
        pd.set_item("link_s", p.link_s)?;
        pd.set_item("hbm_s", p.hbm_s)?;
        pd.set_item("reduce_s", p.reduce_s)?;
        pd.set_item("reduce_steps", p.reduce_steps)?;
        pd.set_item("sync_s", p.sync_s)?;
        pd.set_item("start_s", p.start_s)?;
        pd.set_item("efa", p.efa)?;
        pd.set_item("max_hops", p.max_hops)?;
        pd.set_item("bound", p.bound())?;
        pd.set_item("busiest_link", p.busiest_link.map(|l| t.link_name(l)))?;
        pd.set_item("busiest_link_step_bytes", p.busiest_link_bytes)?;
        out.append(pd)?;
    }
    Ok(out)
}

fn report_to_dict<'py>(
    py: Python<'py>,
    t: &Torus,
    r: &CollectiveReport,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", "collective")?;
    d.set_item("collective", r.collective.name())?;
    d.set_item("algorithm", &r.algorithm)?;
    d.set_item("op", r.op.map(|o| o.name()))?;
    d.set_item("ranks", r.ranks)?;
    d.set_item("elements", r.elements)?;
    d.set_item("elem_bytes", r.elem_bytes)?;
    d.set_item("size_bytes", r.size_bytes)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("algbw", r.algbw)?;
    d.set_item("busbw", r.busbw)?;
    d.set_item("bus_factor", r.bus_factor)?;
    d.set_item("chip_link_capacity", r.chip_link_capacity)?;
    d.set_item("max_link_utilization", r.timing.max_link_utilization)?;
    d.set_item("network_bytes", r.timing.network_bytes)?;
    d.set_item("channels", r.channels)?;
    d.set_item("bound", r.bound())?;
    d.set_item(
        "description",
        format!(
            "{} of {} x {} B over {} ranks, {}",
            r.collective.name(),
            r.elements,
            r.elem_bytes,
            r.ranks,
            r.algorithm
        ),
    )?;
    d.set_item("op_fixed_s", r.timing.op_fixed_s)?;
    d.set_item("phases", phase_list(py, t, &r.timing.phases)?)?;
    d.set_item("uncertainty", uncertainty_dict(py, &r.uncertainty)?)?;
    let links = PyDict::new(py);
    let bws = PyDict::new(py);
    for (i, &(l, b)) in r.timing.link_bytes.iter().enumerate() {
        // An UltraCluster's report names millions of links (seconds of work with the GIL
        // held): let Ctrl-C in every 65536 of them.
        if i % 65536 == 65535 {
            py.check_signals()?;
        }
        let name = t.link_name(l);
        bws.set_item(&name, t.link_id_bandwidth(l))?;
        links.set_item(name, b)?;
    }
    d.set_item("link_bytes", links)?;
    d.set_item("link_bandwidth", bws)?;
    d.set_item("details", PyDict::new(py))?;
    Ok(d)
}

/// Costs a collective without data; returns the report dict and, with `trace`, its trace JSON.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, algorithm, elements, elem_bytes, peers, trace))]
#[allow(clippy::too_many_arguments)]
pub fn collective_estimate<'py>(
    py: Python<'py>,
    torus: &PyTorus,
    chips: Option<Vec<usize>>,
    collective: &str,
    algorithm: &str,
    elements: u64,
    elem_bytes: u64,
    peers: Option<Vec<usize>>,
    trace: bool,
) -> PyResult<(Bound<'py, PyDict>, Option<String>)> {
    let k = guard(py, || Collective::parse("collective", collective))?;
    let a = guard(py, || Algorithm::parse("algorithm", algorithm))?;
    let g = group(py, &torus.inner, chips)?;
    let (_, rep) = guard_detached(py, || {
        collective::estimate(&g, k, a, elements, elem_bytes, peers.as_deref(), trace)
    })?;
    let json = rep.timing.trace.clone();
    Ok((report_to_dict(py, &torus.inner, &rep)?, json))
}

/// Fresh numpy arrays of `lens` elements, left uninitialised (numpy's allocator, with its huge
/// page hints for big arrays: faster to fill than zeroed memory). `CapacityError` on `buffers`
/// when the host cannot hold them: all of them together (checked first), or one that numpy then
/// fails to allocate (`arrays::new_uninit`; rust-numpy's `PyArray1::new` would panic).
///
/// SAFETY (callers): every element is written by the collective before the arrays are returned
/// (an all-reduce writes every chunk of every output, a reduce-scatter every element of its
/// owner's part, the data-movement collectives every position); on an error the arrays are
/// dropped without Python ever seeing them.
fn uninit<'py, T: Element>(
    py: Python<'py>,
    lens: &[usize],
) -> PyResult<Vec<Bound<'py, PyArray1<T>>>> {
    let total: u128 = lens.iter().map(|&m| m as u128).sum::<u128>() * size_of::<T>() as u128;
    guard(py, || {
        trn2core::host::check_alloc("buffers", "the collective's outputs", total)
    })?;
    lens.iter()
        .map(|&m| {
            guard(py, || unsafe {
                crate::arrays::new_uninit::<T>(py, m, "buffers", "a rank's output")
            })
        })
        .collect()
}

fn borrow_all<'py, T: Element>(
    py: Python<'py>,
    inputs: &[Bound<'py, PyAny>],
    what: &str,
) -> PyResult<Vec<PyReadonlyArray1<'py, T>>> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, x)| guard(py, || borrow::<T>(x, &format!("buffers[{i}]"), what)))
        .collect()
}

fn check_count(py: Python<'_>, got: usize, ranks: usize) -> PyResult<()> {
    guard(py, || {
        if got != ranks {
            return Err(Error::shape(
                "buffers",
                format!("got {got} buffers for {ranks} ranks; pass one buffer per chip"),
            ));
        }
        Ok(())
    })
}

fn check_lengths(py: Python<'_>, lens: &[usize]) -> PyResult<()> {
    guard(py, || {
        if let Some(i) = lens.iter().position(|&l| l != lens[0]) {
            return Err(Error::shape(
                "buffers",
                format!(
                    "buffer {i} has {} elements, buffer 0 has {}; every rank's buffer must have \
                     the same shape",
                    lens[i], lens[0]
                ),
            ));
        }
        Ok(())
    })
}

/// All-reduce or reduce-scatter of `inputs` (flat contiguous arrays: float32 for fp32, uint16
/// for bf16/fp16, uint8 for fp8) in `format`; returns `(outputs, report dict)`.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, op, algorithm, format, inputs))]
#[allow(clippy::too_many_arguments)]
pub fn collective_reduce<'py>(
    py: Python<'py>,
    torus: &PyTorus,
    chips: Option<Vec<usize>>,
    collective: &str,
    op: &str,
    algorithm: &str,
    format: &str,
    inputs: Vec<Bound<'py, PyAny>>,
) -> PyResult<(Vec<Py<PyAny>>, Bound<'py, PyDict>)> {
    let k = guard(py, || Collective::parse("collective", collective))?;
    let o = guard(py, || ReduceOp::parse("op", op))?;
    let a = guard(py, || Algorithm::parse("algorithm", algorithm))?;
    let f = guard(py, || Format::parse("dtype", format))?;
    guard(py, || collective::exec::check_reduce_format(f))?;
    let g = group(py, &torus.inner, chips)?;
    check_count(py, inputs.len(), g.n())?;
    macro_rules! run {
        ($t:ty, $what:expr, $buf:ident) => {{
            let ro = borrow_all::<$t>(py, &inputs, $what)?;
            let slices: Vec<&[$t]> = ro
                .iter()
                .map(|a| guard(py, || crate::arrays::slice(a, "buffers")))
                .collect::<PyResult<_>>()?;
            check_lengths(py, &slices.iter().map(|s| s.len()).collect::<Vec<_>>())?;
            let lens = output_lengths(k, g.n(), slices.first().map_or(0, |s| s.len()));
            let outs = uninit::<$t>(py, &lens)?;
            let mut rws: Vec<_> = outs.iter().map(|a| a.readwrite()).collect();
            let mut outs_mut: Vec<BufMut> = Vec::with_capacity(rws.len());
            for rw in rws.iter_mut() {
                let s = guard(py, || {
                    rw.as_slice_mut()
                        .map_err(|_| Error::shape("out", "not contiguous"))
                })?;
                outs_mut.push(BufMut::$buf(s));
            }
            let bufs: Vec<Buf> = slices.iter().map(|s| Buf::$buf(s)).collect();
            let rep = guard_detached(py, || {
                collective::run_reduce(&g, k, o, a, f, &bufs, &mut outs_mut)
            })?;
            drop(outs_mut);
            drop(rws);
            let list = outs.into_iter().map(|a| a.into_any().unbind()).collect();
            (list, rep)
        }};
    }
    let (list, rep) = match f.code_bits() {
        32 => run!(f32, "float32", F32),
        16 => run!(u16, "uint16 (bf16/fp16 bit patterns)", U16),
        _ => run!(u8, "uint8 (fp8 codes)", U8),
    };
    Ok((list, report_to_dict(py, &torus.inner, &rep)?))
}

/// All-gather, all-to-all or send/recv on raw bytes (flat uint8 views, `elem_size` bytes per
/// element); returns `(outputs as flat uint8 arrays, report dict)`.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, algorithm, elem_size, inputs, peers))]
#[allow(clippy::too_many_arguments)]
pub fn collective_move<'py>(
    py: Python<'py>,
    torus: &PyTorus,
    chips: Option<Vec<usize>>,
    collective: &str,
    algorithm: &str,
    elem_size: usize,
    inputs: Vec<Bound<'py, PyAny>>,
    peers: Option<Vec<usize>>,
) -> PyResult<(Vec<Py<PyAny>>, Bound<'py, PyDict>)> {
    let k = guard(py, || Collective::parse("collective", collective))?;
    let a = guard(py, || Algorithm::parse("algorithm", algorithm))?;
    let g = group(py, &torus.inner, chips)?;
    check_count(py, inputs.len(), g.n())?;
    guard(py, || {
        if elem_size == 0 {
            return Err(Error::value("buffers", "elements of zero bytes"));
        }
        Ok(())
    })?;
    let ro = borrow_all::<u8>(py, &inputs, "uint8 (raw bytes)")?;
    let slices: Vec<&[u8]> = ro
        .iter()
        .map(|a| guard(py, || crate::arrays::slice(a, "buffers")))
        .collect::<PyResult<_>>()?;
    check_lengths(py, &slices.iter().map(|s| s.len()).collect::<Vec<_>>())?;
    let l = slices.first().map_or(0, |s| s.len()) / elem_size;
    let lens: Vec<usize> = output_lengths(k, g.n(), l)
        .into_iter()
        .map(|m| m * elem_size)
        .collect();
    let outs = uninit::<u8>(py, &lens)?;
    let mut rws: Vec<_> = outs.iter().map(|a| a.readwrite()).collect();
    let mut outs_mut: Vec<&mut [u8]> = Vec::with_capacity(rws.len());
    for rw in rws.iter_mut() {
        outs_mut.push(guard(py, || {
            rw.as_slice_mut()
                .map_err(|_| Error::shape("out", "not contiguous"))
        })?);
    }
    let rep = guard_detached(py, || {
        collective::run_move(
            &g,
            k,
            a,
            elem_size,
            &slices,
            &mut outs_mut,
            peers.as_deref(),
        )
    })?;
    drop(outs_mut);
    drop(rws);
    let list = outs.into_iter().map(|a| a.into_any().unbind()).collect();
    Ok((list, report_to_dict(py, &torus.inner, &rep)?))
}

/// One `nccom-test` row.
#[pyfunction]
pub fn nccom_estimate<'py>(
    py: Python<'py>,
    collective: &str,
    ranks: usize,
    lnc: usize,
    size_bytes: u64,
    elem_bytes: u64,
    algorithm: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let k = guard(py, || Collective::parse("operation", collective))?;
    let a = guard(py, || Algorithm::parse("algorithm", algorithm))?;
    let row = guard_detached(py, || {
        collective::nccom_estimate(k, ranks, lnc, size_bytes, elem_bytes, a)
    })?;
    let d = PyDict::new(py);
    d.set_item("size_bytes", row.size_bytes)?;
    d.set_item("count", row.count)?;
    d.set_item("seconds", row.seconds)?;
    d.set_item("algbw", row.algbw)?;
    d.set_item("busbw", row.busbw)?;
    d.set_item("algorithm", row.algorithm)?;
    d.set_item("intra_chip_s", row.intra_chip_s)?;
    d.set_item("intra_chip_bytes", row.intra_chip_bytes)?;
    d.set_item("chips", row.chips)?;
    d.set_item("op_fixed_s", row.op_fixed_s)?;
    d.set_item("phases", phase_list(py, &row.torus, &row.phases)?)?;
    d.set_item("uncertainty", uncertainty_dict(py, &row.uncertainty)?)?;
    Ok(d)
}

/// The resources of a logical core of `lnc` physical cores.
#[pyfunction]
pub fn logical_core_info<'py>(py: Python<'py>, lnc: usize) -> PyResult<Bound<'py, PyDict>> {
    let i = guard(py, || topo::LogicalCoreInfo::new(lnc))?;
    let d = PyDict::new(py);
    d.set_item("lnc", i.lnc)?;
    d.set_item("sbuf_bytes", i.sbuf_bytes)?;
    d.set_item("hbm_bytes", i.hbm_bytes)?;
    d.set_item("hbm_bandwidth", i.hbm_bytes_per_s)?;
    let peaks = PyDict::new(py);
    for (name, f, dr) in [
        ("fp32", Format::Fp32, false),
        ("tf32", Format::Tf32, false),
        ("bf16", Format::Bf16, false),
        ("fp16", Format::Fp16, false),
        ("fp8_e4m3", Format::Fp8E4m3, true),
        ("fp8_e5m2", Format::Fp8E5m2, true),
        ("fp8_e3m4", Format::Fp8E3m4, false),
    ] {
        peaks.set_item(name, i.peak_flops(f, dr, false))?;
    }
    peaks.set_item("sparse", i.peak_flops(Format::Bf16, false, true))?;
    d.set_item("peak_flops", peaks)?;
    Ok(d)
}

/// The physical cores of logical core `index` at `lnc`.
#[pyfunction]
pub fn logical_core_members(py: Python<'_>, lnc: usize, index: usize) -> PyResult<Vec<usize>> {
    guard(py, || {
        topo::logical_core_members(lnc, index).map(|r| r.collect())
    })
}

/// `(name, chips, torus shape, ultraserver_capable)` of every instance type.
#[pyfunction]
pub fn instance_types() -> Vec<(&'static str, usize, Vec<usize>, bool)> {
    topo::INSTANCE_TYPES
        .iter()
        .map(|t| (t.name, t.chips, t.torus.to_vec(), t.ultraserver_capable))
        .collect()
}

/// Costs a GEMM split over physical cores `cores` of one chip; returns the report dict and,
/// with `trace`, its trace JSON.
#[pyfunction]
#[pyo3(signature = (m, k, n, dtype, perf_mode, throttle, trace, cores, sparsity = None))]
#[allow(clippy::too_many_arguments)]
pub fn estimate_gemm_cores<'py>(
    py: Python<'py>,
    m: u64,
    k: u64,
    n: u64,
    dtype: &str,
    perf_mode: &str,
    throttle: bool,
    trace: bool,
    cores: Vec<usize>,
    sparsity: Option<&str>,
) -> PyResult<(Bound<'py, PyDict>, Option<String>)> {
    let plan = crate::perf::gemm_plan(py, [m, k, n], dtype, perf_mode, throttle, trace, sparsity)?;
    let rep = guard_detached(py, || core_gemm_cores(&plan, &cores))?;
    let json = trace.then(|| rep.chrome_trace_json());
    Ok((report_dict(py, &rep)?, json))
}
