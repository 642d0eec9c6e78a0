//! Bindings of the chip, the torus and the collectives (`trn2core::topology`), and of the GEMM
//! split over several cores (`trn2core::engine::cost::split`). Conversion and error mapping only.

use numpy::{Element, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn2core::collective::distributed::{Message, MessageMut};
use trn2core::collective::{
    self, Algorithm, Buf, BufMut, Collective, CollectiveReport, Group, PhaseTiming, Placement,
    ReduceOp, Traffic, Transport,
};
use trn2core::engine::PerfMode;
use trn2core::numerics::Format;
use trn2core::spec::LNC_DEFAULT;
use trn2core::topology::{self as topo, Torus};

use crate::arrays::{borrow, fill_new_arrays, memoryview, memoryview_mut, release, slice};
use crate::errors::{guard_detached, poll_signals, PyTrn2Result};
use crate::perf::PyUncertainty;

/// A NeuronLink torus of chips, possibly several UltraServers joined by EFA (wrapped by
/// `trn2core.Torus`).
#[pyclass(name = "Torus", module = "trn2core._core", frozen)]
pub struct PyTorus {
    pub inner: Torus,
    /// Physical cores per Logical NeuronCore of the machine the torus belongs to: its chips
    /// stand for `8 / lnc` runtime ranks each.
    pub lnc: usize,
}

#[pymethods]
impl PyTorus {
    #[new]
    #[pyo3(signature = (shape, ultraservers = 1, lnc = LNC_DEFAULT))]
    fn new(shape: Vec<usize>, ultraservers: usize, lnc: usize) -> PyTrn2Result<Self> {
        topo::check_lnc(lnc)?;
        Ok(PyTorus { inner: Torus::new(&shape, ultraservers)?, lnc })
    }

    #[getter]
    fn lnc(&self) -> usize {
        self.lnc
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
    fn coords(&self, i: usize) -> PyTrn2Result<Vec<usize>> {
        Ok(self.inner.coords(i)?)
    }
    fn index(&self, coords: Vec<usize>) -> PyTrn2Result<usize> {
        Ok(self.inner.index(&coords)?)
    }
    fn neighbors(&self, i: usize) -> PyTrn2Result<Vec<usize>> {
        Ok(self.inner.neighbors(i)?)
    }
    fn hops(&self, i: usize, j: usize) -> PyTrn2Result<usize> {
        Ok(self.inner.hops(i, j)?)
    }
    fn link_bandwidth(&self, i: usize, j: usize) -> PyTrn2Result<f64> {
        Ok(self.inner.link_bandwidth(i, j)?)
    }
    /// The links a transfer from `i` to `j` takes, by name.
    fn route(&self, i: usize, j: usize) -> PyTrn2Result<Vec<String>> {
        Ok(self.inner.route_names(i, j)?)
    }
}

fn group(t: &PyTorus, chips: Option<Vec<usize>>) -> PyTrn2Result<Group<'_>> {
    let g = match chips {
        None => Group::all(&t.inner),
        Some(c) => Group::new(&t.inner, c)?,
    };
    Ok(g.with_ranks_per_chip(topo::logical_cores_per_chip(t.lnc)))
}

/// One phase of a collective's timing ([`PhaseTiming`]): `steps` of `step_s` each, `seconds`
/// the whole phase, its `bound`, and its busiest link by name.
#[pyclass(name = "PhaseTiming", module = "trn2core._core", frozen, get_all)]
pub struct PyPhaseTiming {
    name: &'static str,
    steps: u32,
    seconds: f64,
    step_s: f64,
    latency_s: f64,
    link_s: f64,
    hbm_s: f64,
    reduce_s: f64,
    reduce_steps: u32,
    sync_s: f64,
    start_s: f64,
    efa: bool,
    max_hops: usize,
    bound: &'static str,
    busiest_link: Option<String>,
    busiest_link_step_bytes: f64,
}

impl PyPhaseTiming {
    /// The phases of a collective on `t` (whose links name the busiest).
    fn all(py: Python<'_>, t: &Torus, phases: &[PhaseTiming]) -> PyResult<Vec<Py<Self>>> {
        let of = |p: &PhaseTiming| PyPhaseTiming {
            name: p.name,
            steps: p.repeat,
            seconds: p.seconds(),
            step_s: p.step_s,
            latency_s: p.latency_s,
            link_s: p.link_s,
            hbm_s: p.hbm_s,
            reduce_s: p.reduce_s,
            reduce_steps: p.reduce_steps,
            sync_s: p.sync_s,
            start_s: p.start_s,
            efa: p.efa,
            max_hops: p.max_hops,
            bound: p.bound(),
            busiest_link: p.busiest_link.map(|l| t.link_name(l)),
            busiest_link_step_bytes: p.busiest_link_bytes,
        };
        phases.iter().map(|p| Py::new(py, of(p))).collect()
    }
}

/// A collective's report ([`CollectiveReport`]; `trn2core.CollectiveReport` wraps it): `ranks`
/// are its chips, `link_bytes` and `link_bandwidth` every used link by name, `uncertainty` the
/// dict every report of the package gives.
#[pyclass(name = "CollectiveReport", module = "trn2core._core", frozen, get_all)]
pub struct PyCollectiveReport {
    collective: &'static str,
    algorithm: String,
    op: Option<&'static str>,
    ranks: usize,
    logical_ranks: usize,
    elements: u64,
    elem_bytes: u64,
    size_bytes: f64,
    seconds: f64,
    algbw: f64,
    busbw: f64,
    bus_factor: f64,
    chip_link_capacity: f64,
    max_link_utilization: f64,
    network_bytes: f64,
    channels: usize,
    bound: &'static str,
    description: String,
    op_fixed_s: f64,
    phases: Vec<Py<PyPhaseTiming>>,
    uncertainty: Py<PyUncertainty>,
    link_bytes: Py<PyDict>,
    link_bandwidth: Py<PyDict>,
}

impl PyCollectiveReport {
    /// The report of a collective on `t` (whose links name those of the report).
    fn of(py: Python<'_>, t: &Torus, r: CollectiveReport) -> PyResult<Py<Self>> {
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
        let report = PyCollectiveReport {
            collective: r.collective.name(),
            op: r.op.map(|o| o.name()),
            ranks: r.ranks,
            logical_ranks: r.logical_ranks,
            elements: r.elements,
            elem_bytes: r.elem_bytes,
            size_bytes: r.size_bytes,
            seconds: r.seconds,
            algbw: r.algbw,
            busbw: r.busbw,
            bus_factor: r.bus_factor,
            chip_link_capacity: r.chip_link_capacity,
            max_link_utilization: r.timing.max_link_utilization,
            network_bytes: r.timing.network_bytes,
            channels: r.channels,
            bound: r.bound(),
            description: r.description(),
            op_fixed_s: r.timing.op_fixed_s,
            phases: PyPhaseTiming::all(py, t, &r.timing.phases)?,
            uncertainty: PyUncertainty::of(py, &r.uncertainty)?,
            link_bytes: links.unbind(),
            link_bandwidth: bws.unbind(),
            algorithm: r.algorithm,
        };
        Py::new(py, report)
    }
}

/// Costs a collective without data; returns the report and, with `trace`, its trace JSON.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, algorithm, elements, elem_bytes, peers, trace))]
#[allow(clippy::too_many_arguments)]
pub fn collective_estimate<'py>(
    py: Python<'py>, torus: &PyTorus, chips: Option<Vec<usize>>, collective: &str, algorithm: &str,
    elements: u64, elem_bytes: u64, peers: Option<Vec<usize>>, trace: bool,
) -> PyTrn2Result<(Py<PyCollectiveReport>, Option<String>)> {
    let c = Collective::parse("collective", collective)?;
    let a = Algorithm::parse("algorithm", algorithm)?;
    let g = group(torus, chips)?;
    let (_, rep) = guard_detached(py, || {
        collective::estimate(&g, c, a, elements, elem_bytes, peers.as_deref(), trace)
    })?;
    let json = rep.timing.trace.clone();
    Ok((PyCollectiveReport::of(py, &torus.inner, rep)?, json))
}

/// Borrows every rank's buffer as a contiguous slice of `T`.
fn borrow_all<'py, T: Element>(
    inputs: &[Bound<'py, PyAny>], what: &str,
) -> PyTrn2Result<Vec<PyReadonlyArray1<'py, T>>> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, x)| {
            poll_signals(x.py(), i)?;
            Ok(borrow::<T>(x, &format!("buffers[{i}]"), what)?)
        })
        .collect()
}

/// Every chip's buffer (any numpy array: strided or byte-swapped too) as flat C-contiguous
/// native-order words of numpy dtype `code` (`word` bytes each) and their word counts. The
/// buffers that are not C-contiguous in native order are copied, after one host check of those
/// copies plus `out_bytes(word counts)` (the outputs the call makes next): `CapacityError` on
/// `buffers` before anything is allocated. The facade passes the buffers as it holds them.
fn held<'py>(
    py: Python<'py>, collective: Collective, inputs: &[Bound<'py, PyAny>], code: &str, word: usize,
    out_bytes: impl FnOnce(&[usize]) -> trn2core::Result<u128>,
) -> PyTrn2Result<(Vec<Bound<'py, PyAny>>, Vec<usize>)> {
    let (mut lens, mut copy, mut copies) = (Vec::new(), Vec::new(), 0u128);
    for (i, b) in inputs.iter().enumerate() {
        poll_signals(py, i)?;
        let nbytes: usize = b.getattr("nbytes")?.extract()?;
        let contiguous: bool = b.getattr("flags")?.getattr("c_contiguous")?.extract()?;
        let native: bool = b.getattr("dtype")?.getattr("isnative")?.extract()?;
        lens.push(nbytes / word);
        copy.push(!(contiguous && native));
        if !(contiguous && native) {
            copies = copies.saturating_add(nbytes as u128);
        }
    }
    let outs = out_bytes(&lens)?;
    trn2core::host::check_alloc(
        "buffers",
        &format!(
            "the {} of {} buffers of {} bytes ({outs} bytes of outputs, {copies} of input \
             copies)",
            collective.name(),
            inputs.len(),
            lens.first().map_or(0, |n| n * word)
        ),
        copies.saturating_add(outs),
    )?;
    let np = py.import("numpy")?;
    let words = inputs
        .iter()
        .zip(copy)
        .enumerate()
        .map(|(i, (b, copy))| {
            poll_signals(py, i)?;
            let b = if copy {
                let dt = b.getattr("dtype")?.call_method1("newbyteorder", ("=",))?;
                np.call_method1("ascontiguousarray", (b.call_method1("astype", (dt,))?,))?
            } else {
                b.clone()
            };
            b.call_method1("reshape", (-1,))?.call_method1("view", (code,))
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok((words, lens))
}

/// Bytes of the arrays of `lens` elements of `size` bytes.
fn bytes_of(lens: &[usize], size: usize) -> u128 {
    lens.iter().fold(0u128, |a, &n| a.saturating_add(n as u128)).saturating_mul(size as u128)
}

/// All-reduce or reduce-scatter of `inputs` (every chip's buffer as the caller holds it: any
/// layout or byte order of a `format` dtype) in `format`; returns `(outputs as flat arrays of
/// the format's words, report)`.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, op, algorithm, format, inputs))]
#[allow(clippy::too_many_arguments)]
pub fn collective_reduce<'py>(
    py: Python<'py>, torus: &PyTorus, chips: Option<Vec<usize>>, collective: &str, op: &str,
    algorithm: &str, format: &str, inputs: Vec<Bound<'py, PyAny>>,
) -> PyTrn2Result<(Vec<Py<PyAny>>, Py<PyCollectiveReport>)> {
    let c = Collective::parse("collective", collective)?;
    let o = ReduceOp::parse("op", op)?;
    let a = Algorithm::parse("algorithm", algorithm)?;
    let f = Format::parse("dtype", format)?;
    let g = group(torus, chips)?;
    macro_rules! run {
        ($t:ty, $code:expr, $what:expr, $buf:ident) => {{
            let size = std::mem::size_of::<$t>();
            let plan = |lens: &[usize]| collective::output_plan(&g, c, Some(f), 1, lens);
            let (words, lens) =
                held(py, c, &inputs, $code, size, |l| Ok(bytes_of(&plan(l)?, size)))?;
            let ro = borrow_all::<$t>(&words, $what)?;
            let ins = ro.iter().map(|a| slice(a, "buffers")).collect::<Result<Vec<&[$t]>, _>>()?;
            let out_lens = plan(&lens)?;
            let (outs, rep) = fill_new_arrays::<$t, _>(
                py,
                &out_lens,
                "buffers",
                "the collective's outputs",
                u64::MAX,
                |outs| {
                    let bufs: Vec<Buf> = ins.iter().map(|s| Buf::$buf(s)).collect();
                    let mut outs: Vec<BufMut> = outs.iter_mut().map(|o| BufMut::$buf(o)).collect();
                    collective::run_reduce(&g, c, o, a, f, &bufs, &mut outs)
                },
            )?;
            (unbind_all(outs), rep)
        }};
    }
    let (list, rep) = match f.code_bits() {
        32 => run!(f32, "float32", "float32", F32),
        16 => run!(u16, "uint16", "uint16 (bf16/fp16 bit patterns)", U16),
        _ => run!(u8, "uint8", "uint8 (fp8 codes)", U8),
    };
    Ok((list, PyCollectiveReport::of(py, &torus.inner, rep)?))
}

/// All-gather, all-to-all or send/recv on raw bytes (flat uint8 views, `elem_size` bytes per
/// element); returns `(outputs as flat uint8 arrays, report)`.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, algorithm, elem_size, inputs, peers))]
#[allow(clippy::too_many_arguments)]
pub fn collective_move<'py>(
    py: Python<'py>, torus: &PyTorus, chips: Option<Vec<usize>>, collective: &str, algorithm: &str,
    elem_size: usize, inputs: Vec<Bound<'py, PyAny>>, peers: Option<Vec<usize>>,
) -> PyTrn2Result<(Vec<Py<PyAny>>, Py<PyCollectiveReport>)> {
    let c = Collective::parse("collective", collective)?;
    let a = Algorithm::parse("algorithm", algorithm)?;
    let g = group(torus, chips)?;
    let plan = |lens: &[usize]| collective::output_plan(&g, c, None, elem_size, lens);
    let (words, lens) = held(py, c, &inputs, "uint8", 1, |l| Ok(bytes_of(&plan(l)?, 1)))?;
    let ro = borrow_all::<u8>(&words, "uint8 (raw bytes)")?;
    let ins = ro.iter().map(|a| slice(a, "buffers")).collect::<Result<Vec<&[u8]>, _>>()?;
    let out_lens = plan(&lens)?;
    let (outs, rep) = fill_new_arrays::<u8, _>(
        py,
        &out_lens,
        "buffers",
        "the collective's outputs",
        u64::MAX,
        |outs| collective::run_move(&g, c, a, elem_size, &ins, outs, peers.as_deref()),
    )?;
    let list = unbind_all(outs);
    Ok((list, PyCollectiveReport::of(py, &torus.inner, rep)?))
}

/// The process of every chip of a machine of `chips` chips shared by `procs` processes:
/// `placement` checked, or the contiguous default.
#[pyfunction]
#[pyo3(signature = (chips, procs, placement = None))]
pub fn placement(
    chips: usize, procs: usize, placement: Option<Vec<usize>>,
) -> PyTrn2Result<Vec<usize>> {
    Ok(Placement::new(placement.as_deref(), procs, chips)?.of_chips())
}

/// A [`Transport`] that calls the Python function `exchange(round, sends, recvs)` with lists
/// of `(peer, memoryview)` (read-only views of the messages to send, writable views of where
/// the received ones land); the views are released when it returns. A Python exception is
/// kept and raised when the call ends.
struct PyTransport<'a> {
    exchange: &'a Py<PyAny>,
    error: Option<PyErr>,
}

impl Transport for PyTransport<'_> {
    fn exchange(
        &mut self, round: usize, sends: &[Message<'_>], recvs: &mut [MessageMut<'_>],
    ) -> trn2core::Result<()> {
        let outcome = Python::attach(|py| -> PyResult<()> {
            let s = sends
                .iter()
                .map(|m| Ok((m.peer, memoryview(py, m.bytes)?)))
                .collect::<PyResult<Vec<_>>>()?;
            let r = recvs
                .iter_mut()
                .map(|m| Ok((m.peer, memoryview_mut(py, m.bytes)?)))
                .collect::<PyResult<Vec<_>>>()?;
            let called = self.exchange.call1(py, (round, s.clone(), r.clone())).map(|_| ());
            for (_, v) in s.iter().chain(&r) {
                release(v)?;
            }
            called
        });
        outcome.map_err(|e| {
            let msg = e.to_string();
            self.error = Some(e);
            trn2core::Error::value("exchange", msg)
        })
    }
}

/// The bytes one process of a collective spread over processes moved ([`Traffic`]).
#[pyclass(name = "Traffic", module = "trn2core._core", frozen, get_all)]
pub struct PyTraffic {
    rounds: usize,
    sent_bytes: u64,
    received_bytes: u64,
    messages: u64,
    exchanged_bytes: u64,
    schedule_bytes: u64,
}

impl From<Traffic> for PyTraffic {
    fn from(t: Traffic) -> Self {
        PyTraffic {
            rounds: t.rounds,
            sent_bytes: t.sent,
            received_bytes: t.received,
            messages: t.messages,
            exchanged_bytes: t.total,
            schedule_bytes: t.schedule,
        }
    }
}

/// A Python error the transport kept wins over the core error it caused.
fn transport_error(t: &mut PyTransport, e: crate::errors::PyTrn2Err) -> crate::errors::PyTrn2Err {
    match t.error.take() {
        Some(py_err) => py_err.into(),
        None => e,
    }
}

/// What a process's part of a collective returns: its outputs, the report and the traffic.
type LocalResult = (Vec<Py<PyAny>>, Py<PyCollectiveReport>, PyTraffic);

/// Runs one process's part of a collective (`body`, over a [`PyTransport`] calling `exchange`)
/// and converts what it returns; a Python error the transport kept wins over the core error it
/// caused.
fn run_local(
    py: Python<'_>, torus: &Torus, exchange: &Py<PyAny>,
    body: impl FnOnce(&mut PyTransport<'_>) -> PyTrn2Result<LocalOutcome>,
) -> PyTrn2Result<LocalResult> {
    let mut tr = PyTransport { exchange, error: None };
    let (list, (rep, traffic)) = body(&mut tr).map_err(|e| transport_error(&mut tr, e))?;
    Ok((list, PyCollectiveReport::of(py, torus, rep)?, traffic.into()))
}

/// A process's outputs (as Python objects), its report and the bytes it moved.
type LocalOutcome = (Vec<Py<PyAny>>, (CollectiveReport, Traffic));

/// The arrays as Python objects.
fn unbind_all<T: Element>(arrays: Vec<Bound<'_, PyArray1<T>>>) -> Vec<Py<PyAny>> {
    arrays.into_iter().map(|a| a.into_any().unbind()).collect()
}

/// One process's part of an all-reduce or reduce-scatter spread over `procs` processes
/// (`collective::run_reduce_local`): `inputs` are the buffers of the ranks this process holds
/// (ascending), each of `elements` elements; `exchange` moves each round's messages. Returns
/// `(outputs, report, traffic)`.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, op, algorithm, format, procs, process, placement, elements, inputs, exchange))]
#[allow(clippy::too_many_arguments)]
pub fn collective_reduce_local<'py>(
    py: Python<'py>, torus: &PyTorus, chips: Option<Vec<usize>>, collective: &str, op: &str,
    algorithm: &str, format: &str, procs: usize, process: usize, placement: Option<Vec<usize>>,
    elements: usize, inputs: Vec<Bound<'py, PyAny>>, exchange: Py<PyAny>,
) -> PyTrn2Result<LocalResult> {
    let c = Collective::parse("collective", collective)?;
    let o = ReduceOp::parse("op", op)?;
    let a = Algorithm::parse("algorithm", algorithm)?;
    let f = Format::parse("dtype", format)?;
    let g = group(torus, chips)?;
    let pl = Placement::new(placement.as_deref(), procs, torus.inner.size())?;
    macro_rules! run {
        ($tr:ident, $t:ty, $what:expr, $buf:ident) => {{
            let ro = borrow_all::<$t>(&inputs, $what)?;
            let ins = ro.iter().map(|a| slice(a, "buffers")).collect::<Result<Vec<&[$t]>, _>>()?;
            let lens: Vec<usize> = ins.iter().map(|s| s.len()).collect();
            let out_lens =
                collective::local_output_plan(&g, &pl, process, c, Some(f), 1, elements, &lens)?;
            let tr = $tr;
            let (outs, rep) = fill_new_arrays::<$t, _>(
                py,
                &out_lens,
                "buffers",
                "the collective's outputs",
                0,
                |outs| {
                    let bufs: Vec<Buf> = ins.iter().map(|s| Buf::$buf(s)).collect();
                    let mut outs: Vec<BufMut> = outs.iter_mut().map(|o| BufMut::$buf(o)).collect();
                    collective::run_reduce_local(
                        &g, &pl, process, c, o, a, f, elements, &bufs, &mut outs, tr,
                    )
                },
            )?;
            (unbind_all(outs), rep)
        }};
    }
    run_local(py, &torus.inner, &exchange, |tr| {
        Ok(match f.code_bits() {
            32 => run!(tr, f32, "float32", F32),
            16 => run!(tr, u16, "uint16 (bf16/fp16 bit patterns)", U16),
            _ => run!(tr, u8, "uint8 (fp8 codes)", U8),
        })
    })
}

/// One process's part of an all-gather, all-to-all or send/recv spread over `procs` processes
/// (`collective::run_move_local`), on raw bytes (flat uint8 views, `elem_size` bytes per
/// element); see `collective_reduce_local`.
#[pyfunction]
#[pyo3(signature = (torus, chips, collective, algorithm, elem_size, procs, process, placement, elements, inputs, peers, exchange))]
#[allow(clippy::too_many_arguments)]
pub fn collective_move_local<'py>(
    py: Python<'py>, torus: &PyTorus, chips: Option<Vec<usize>>, collective: &str, algorithm: &str,
    elem_size: usize, procs: usize, process: usize, placement: Option<Vec<usize>>, elements: usize,
    inputs: Vec<Bound<'py, PyAny>>, peers: Option<Vec<usize>>, exchange: Py<PyAny>,
) -> PyTrn2Result<LocalResult> {
    let c = Collective::parse("collective", collective)?;
    let a = Algorithm::parse("algorithm", algorithm)?;
    let g = group(torus, chips)?;
    let pl = Placement::new(placement.as_deref(), procs, torus.inner.size())?;
    run_local(py, &torus.inner, &exchange, |tr| {
        let ro = borrow_all::<u8>(&inputs, "uint8 (raw bytes)")?;
        let ins = ro.iter().map(|a| slice(a, "buffers")).collect::<Result<Vec<&[u8]>, _>>()?;
        let lens: Vec<usize> = ins.iter().map(|s| s.len()).collect();
        let out_lens =
            collective::local_output_plan(&g, &pl, process, c, None, elem_size, elements, &lens)?;
        let (outs, rep) = fill_new_arrays::<u8, _>(
            py,
            &out_lens,
            "buffers",
            "the collective's outputs",
            0,
            |outs| {
                collective::run_move_local(
                    &g,
                    &pl,
                    process,
                    c,
                    a,
                    elem_size,
                    elements,
                    &ins,
                    outs,
                    peers.as_deref(),
                    tr,
                )
            },
        )?;
        Ok((unbind_all(outs), rep))
    })
}

/// The machine and chips `nccom-test` runs `chips` chips on (`collective::machine_for_chips`):
/// `(torus shape, ultraservers, chip indices in rank order)`, for its functional check.
#[pyfunction]
pub fn nccom_machine(chips: usize) -> PyTrn2Result<(Vec<usize>, usize, Vec<usize>)> {
    let (torus, chosen) = collective::machine_for_chips(chips)?;
    Ok((torus.torus_shape().to_vec(), torus.ultraservers(), chosen))
}

/// The chips `nccom-test -r ranks -N nnodes` spans at `lnc` (`collective::nccom_chips`).
#[pyfunction]
pub fn nccom_chips(ranks: usize, nnodes: usize, lnc: usize) -> PyTrn2Result<usize> {
    Ok(collective::nccom_chips(ranks, nnodes, lnc)?)
}

/// One `nccom-test` row ([`NccomRow`]); `trn2core.nccom` makes a dict of its getters.
#[pyclass(name = "NccomRow", module = "trn2core._core", frozen, get_all)]
pub struct PyNccomRow {
    size_bytes: u64,
    count: u64,
    seconds: f64,
    algbw: f64,
    busbw: f64,
    algorithm: String,
    intra_chip_s: f64,
    intra_chip_bytes: f64,
    chips: usize,
    op_fixed_s: f64,
    phases: Vec<Py<PyPhaseTiming>>,
    uncertainty: Py<PyUncertainty>,
}

/// One `nccom-test` row of `ranks` ranks at `lnc` and `size_bytes`.
#[pyfunction]
pub fn nccom_estimate(
    py: Python<'_>, collective: &str, ranks: usize, lnc: usize, size_bytes: u64, elem_bytes: u64,
    algorithm: &str,
) -> PyTrn2Result<PyNccomRow> {
    let c = Collective::parse("operation", collective)?;
    let a = Algorithm::parse("algorithm", algorithm)?;
    let row = guard_detached(py, || {
        collective::nccom_estimate(c, ranks, lnc, size_bytes, elem_bytes, a)
    })?;
    Ok(PyNccomRow {
        phases: PyPhaseTiming::all(py, &row.torus, &row.phases)?,
        uncertainty: PyUncertainty::of(py, &row.uncertainty)?,
        size_bytes: row.size_bytes,
        count: row.count,
        seconds: row.seconds,
        algbw: row.algbw,
        busbw: row.busbw,
        algorithm: row.algorithm,
        intra_chip_s: row.intra_chip_s,
        intra_chip_bytes: row.intra_chip_bytes,
        chips: row.chips,
        op_fixed_s: row.op_fixed_s,
    })
}

/// The resources of a logical core of `lnc` physical cores.
#[pyclass(name = "LogicalCoreInfo", module = "trn2core._core", frozen)]
pub struct PyLogicalCoreInfo {
    inner: topo::LogicalCoreInfo,
}

view_pymethods! {
    impl PyLogicalCoreInfo {
        get { lnc: usize, sbuf_bytes: u64, hbm_bytes: u64, hbm_bandwidth: f64 = hbm_bytes_per_s }
        #[new]
        fn new(lnc: usize) -> PyTrn2Result<Self> {
            Ok(PyLogicalCoreInfo {
                inner: topo::LogicalCoreInfo::new(lnc)?,
            })
        }
        /// Dense peak FLOP/s for `dtype` operands (or `"sparse"`) in `perf_mode`.
        fn peak_flops(&self, dtype: &str, perf_mode: &str) -> PyTrn2Result<f64> {
            let mode = PerfMode::parse("perf_mode", perf_mode)?;
            Ok(self.inner.peak_flops_named(dtype, mode)?)
        }
    }
}

/// The physical cores of logical core `index` at `lnc`.
#[pyfunction]
pub fn logical_core_members(lnc: usize, index: usize) -> PyTrn2Result<Vec<usize>> {
    Ok(topo::logical_core_members(lnc, index)?.collect())
}

/// `(name, chips, torus shape, ultraserver_capable)` of every instance type.
#[pyfunction]
pub fn instance_types() -> Vec<(&'static str, usize, Vec<usize>, bool)> {
    topo::INSTANCE_TYPES
        .iter()
        .map(|t| (t.name, t.chips, t.torus.to_vec(), t.ultraserver_capable))
        .collect()
}
