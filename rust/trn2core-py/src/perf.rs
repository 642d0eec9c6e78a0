//! Bindings of `trn2core::perf`: the core's [`Report`] and [`Uncertainty`] as frozen classes
//! with one getter a field (the facade's `trn2core.Report` reads them), and the GEMM cost model.

use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict};
use trn2core::engine::cost::{estimate_gemm_walk, GemmPlan};
use trn2core::engine::{self, PerfMode};
use trn2core::numerics::Format;
use trn2core::perf::{Report, Uncertainty};
use trn2core::sparsity::Pattern;

use crate::errors::{guard_work, PyTrn2Result};

/// A cost model's [`Report`]: `details` as `(name, value)` pairs in the report's order,
/// `uncertainty` `None` for kinds without published cases.
#[pyclass(name = "Report", module = "trn2core._core", frozen, get_all)]
pub struct PyReport {
    operation: &'static str,
    description: String,
    instructions: u64,
    pe_cycles: u64,
    cycles: f64,
    seconds: f64,
    flops: f64,
    tflops: f64,
    pe_tflops: f64,
    peak_tflops: f64,
    utilization: f64,
    bound: &'static str,
    details: Vec<(&'static str, f64)>,
    uncertainty: Option<Py<PyUncertainty>>,
}

#[pymethods]
impl PyReport {
    /// Its getters, in the order of the facade's dicts (`report.core_fields`).
    #[classattr]
    #[pyo3(name = "FIELDS")]
    fn fields() -> [&'static str; 14] {
        REPORT_FIELDS
    }
}

impl PyReport {
    /// The class of `r` (its trace events stay in the core: the trace is its own JSON).
    pub fn of(py: Python<'_>, r: &Report) -> PyResult<Self> {
        Ok(PyReport {
            operation: r.operation,
            description: r.description.clone(),
            instructions: r.instructions,
            pe_cycles: r.pe_cycles,
            cycles: r.cycles,
            seconds: r.seconds,
            flops: r.flops,
            tflops: r.tflops,
            pe_tflops: r.pe_tflops,
            peak_tflops: r.peak_tflops,
            utilization: r.utilization,
            bound: r.bound,
            details: r.details.clone(),
            uncertainty: r.uncertainty.map(|u| PyUncertainty::of(py, &u)).transpose()?,
        })
    }
}

/// An [`Uncertainty`]: `low`, `high` (published / predicted; None without published cases of
/// this kind), `cases`, `basis`, and the printed `text`. It equals another with the same fields
/// and the dict of its fields the facade makes (`{"low", "high", "cases", "basis", "text"}`).
#[pyclass(name = "Uncertainty", module = "trn2core._core", frozen, get_all)]
#[derive(PartialEq)]
pub struct PyUncertainty {
    low: Option<f64>,
    high: Option<f64>,
    cases: usize,
    basis: &'static str,
    text: String,
}

impl PyUncertainty {
    /// The class of `u`.
    pub fn of(py: Python<'_>, u: &Uncertainty) -> PyResult<Py<Self>> {
        Py::new(
            py,
            PyUncertainty {
                low: u.low,
                high: u.high,
                cases: u.cases,
                basis: u.basis,
                text: u.text(),
            },
        )
    }
}

/// The getters of [`PyUncertainty`], in the order of the facade's dicts.
const UNCERTAINTY_FIELDS: [&str; 5] = ["low", "high", "cases", "basis", "text"];

#[pymethods]
impl PyUncertainty {
    /// Its getters, in the order of the facade's dicts (`report.core_fields`).
    #[classattr]
    #[pyo3(name = "FIELDS")]
    fn fields() -> [&'static str; 5] {
        UNCERTAINTY_FIELDS
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        if let Ok(o) = other.cast::<PyUncertainty>() {
            return Ok(self == o.get());
        }
        let Ok(d) = other.cast::<PyDict>() else {
            return Ok(false);
        };
        let py = other.py();
        let fields = [
            ("low", self.low.into_pyobject(py)?),
            ("high", self.high.into_pyobject(py)?),
            ("cases", self.cases.into_pyobject(py)?.into_any()),
            ("basis", self.basis.into_pyobject(py)?.into_any()),
            ("text", self.text.as_str().into_pyobject(py)?.into_any()),
        ];
        if d.len() != fields.len() {
            return Ok(false);
        }
        for (k, v) in fields {
            match d.get_item(k)? {
                Some(x) if x.eq(v)? => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Costs a GEMM `[M, K] @ [K, N]` of `dtype` operands on one NeuronCore, or split over the
/// physical cores `cores` of a LogicalCore or Chip; returns the report and, with `trace`, its
/// Chrome trace JSON.
#[pyfunction]
#[pyo3(signature = (m, k, n, dtype, perf_mode, throttle, trace, sparsity = None, cores = None))]
#[allow(clippy::too_many_arguments)]
pub fn estimate_gemm(
    py: Python<'_>, m: u64, k: u64, n: u64, dtype: &str, perf_mode: &str, throttle: bool,
    trace: bool, sparsity: Option<&str>, cores: Option<Vec<usize>>,
) -> PyTrn2Result<(PyReport, Option<String>)> {
    let req = engine::EstimateRequest {
        m,
        k,
        n,
        format: Format::parse("dtype", dtype)?,
        perf_mode: PerfMode::parse("perf_mode", perf_mode)?,
        sparsity: sparsity.map(Pattern::parse).transpose()?,
        throttle,
        trace,
        cores,
    };
    let rep = guard_work(py, req.work(), || engine::estimate(&req))?;
    let json = trace.then(|| rep.chrome_trace_json());
    Ok((PyReport::of(py, &rep)?, json))
}

/// The getters of [`PyReport`] (its `FIELDS`), for [`_estimate_gemm_walk`]'s dict.
const REPORT_FIELDS: [&str; 14] = [
    "operation",
    "description",
    "instructions",
    "pe_cycles",
    "cycles",
    "seconds",
    "flops",
    "tflops",
    "pe_tflops",
    "peak_tflops",
    "utilization",
    "bound",
    "details",
    "uncertainty",
];

/// [`estimate_gemm`]'s numbers from the reference walk of every instruction (linear in the
/// instruction count; interruptible), to test the fast evaluation against: the report's getters
/// as a dict, `details` as a dict (what `Report.to_dict()` holds). Not part of the API.
#[pyfunction]
#[pyo3(signature = (m, k, n, dtype, perf_mode, throttle, sparsity = None))]
#[allow(clippy::too_many_arguments)]
pub fn _estimate_gemm_walk<'py>(
    py: Python<'py>, m: u64, k: u64, n: u64, dtype: &str, perf_mode: &str, throttle: bool,
    sparsity: Option<&str>,
) -> PyTrn2Result<Bound<'py, PyDict>> {
    let mut plan = GemmPlan::new(
        m,
        k,
        n,
        Format::parse("dtype", dtype)?,
        PerfMode::parse("perf_mode", perf_mode)?,
    )?;
    if let Some(name) = sparsity {
        plan = plan.with_sparsity(Pattern::parse(name)?)?;
    }
    plan.throttle = throttle;
    let rep = guard_work(py, plan.instructions().saturating_mul(16), || estimate_gemm_walk(&plan))?;
    let obj = Bound::new(py, PyReport::of(py, &rep)?)?;
    let d = PyDict::new(py);
    for name in REPORT_FIELDS {
        d.set_item(name, obj.getattr(name)?)?;
    }
    d.set_item("details", rep.details.iter().copied().into_py_dict(py)?)?;
    Ok(d)
}
