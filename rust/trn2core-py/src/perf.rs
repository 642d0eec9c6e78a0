//! Bindings of `trn2core::perf`: reports as dicts, and the GEMM cost model.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn2core::engine::cost::{estimate_gemm_walk, GemmPlan};
use trn2core::engine::{self, PerfMode};
use trn2core::numerics::Format;
use trn2core::perf::{Report, Uncertainty};
use trn2core::sparsity::Pattern;

use crate::errors::{guard_work, PyTrn2Result};

/// A report's fields as a dict (the facade wraps it in `trn2core.Report`).
pub fn report_dict<'py>(py: Python<'py>, r: &Report) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("operation", r.operation)?;
    d.set_item("description", &r.description)?;
    d.set_item("instructions", r.instructions)?;
    d.set_item("pe_cycles", r.pe_cycles)?;
    d.set_item("cycles", r.cycles)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("flops", r.flops)?;
    d.set_item("tflops", r.tflops)?;
    d.set_item("pe_tflops", r.pe_tflops)?;
    d.set_item("peak_tflops", r.peak_tflops)?;
    d.set_item("utilization", r.utilization)?;
    d.set_item("bound", r.bound)?;
    let details = PyDict::new(py);
    for (k, v) in &r.details {
        details.set_item(*k, *v)?;
    }
    d.set_item("details", details)?;
    d.set_item(
        "uncertainty",
        r.uncertainty
            .map(|u| uncertainty_dict(py, &u))
            .transpose()?,
    )?;
    Ok(d)
}

/// An [`Uncertainty`] as a dict: `low`, `high` (published / predicted; None without published
/// cases of this kind), `cases`, `basis`, and the printed `text`.
pub fn uncertainty_dict<'py>(py: Python<'py>, u: &Uncertainty) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("low", u.low)?;
    d.set_item("high", u.high)?;
    d.set_item("cases", u.cases)?;
    d.set_item("basis", u.basis)?;
    d.set_item("text", u.text())?;
    Ok(d)
}

/// Costs a GEMM `[M, K] @ [K, N]` of `dtype` operands on one NeuronCore, or split over the
/// physical cores `cores` of a LogicalCore or Chip; returns the report's dict and, with `trace`,
/// its Chrome trace JSON.
#[pyfunction]
#[pyo3(signature = (m, k, n, dtype, perf_mode, throttle, trace, sparsity = None, cores = None))]
#[allow(clippy::too_many_arguments)]
pub fn estimate_gemm<'py>(
    py: Python<'py>,
    m: u64,
    k: u64,
    n: u64,
    dtype: &str,
    perf_mode: &str,
    throttle: bool,
    trace: bool,
    sparsity: Option<&str>,
    cores: Option<Vec<usize>>,
) -> PyTrn2Result<(Bound<'py, PyDict>, Option<String>)> {
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
    Ok((report_dict(py, &rep)?, json))
}

/// [`estimate_gemm`]'s numbers from the reference walk of every instruction (linear in the
/// instruction count; interruptible), to test the fast evaluation against. Not part of the API.
#[pyfunction]
#[pyo3(signature = (m, k, n, dtype, perf_mode, throttle, sparsity = None))]
#[allow(clippy::too_many_arguments)]
pub fn _estimate_gemm_walk<'py>(
    py: Python<'py>,
    m: u64,
    k: u64,
    n: u64,
    dtype: &str,
    perf_mode: &str,
    throttle: bool,
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
    let rep = guard_work(py, plan.instructions().saturating_mul(16), || {
        estimate_gemm_walk(&plan)
    })?;
    Ok(report_dict(py, &rep)?)
}
