//! Binding of whole-model estimates (`trn2core::workload`): converts the config and the layout,
//! calls one core function, maps errors, and returns the core's report as frozen classes with
//! one getter a field (`trn2core.workload` wraps them). No logic.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};
use pyo3::PyClassInitializer;
use trn2core::numerics::Format;
use trn2core::workload::{
    self, Candidate, ConfigValue, Layout, Machine, MemoryPlan, Model, Objective, OpTime, Parts,
    Recompute, SearchResult, SearchSpace, Serving, StepReport, TrainLayout, TrainReport,
};

use crate::errors::{guard_detached, PyTrn2Result};
use crate::perf::PyUncertainty;

/// A `config.json` dict as the core's fields (a bool before an int: Python's bool is an int).
fn fields(config: &Bound<'_, PyDict>) -> PyResult<Vec<(String, ConfigValue)>> {
    let mut out = Vec::with_capacity(config.len());
    for (k, v) in config.iter() {
        let key: String = k.extract()?;
        let value = if v.is_none() {
            ConfigValue::Null
        } else if let Ok(b) = v.cast::<PyBool>() {
            ConfigValue::Bool(b.is_true())
        } else if let Ok(i) = v.extract::<i64>() {
            ConfigValue::Int(i)
        } else if let Ok(f) = v.extract::<f64>() {
            ConfigValue::Float(f)
        } else if let Ok(s) = v.extract::<String>() {
            ConfigValue::Str(s)
        } else {
            ConfigValue::Null
        };
        out.push((key, value));
    }
    Ok(out)
}

fn model_of(name: &str, config: Option<&Bound<'_, PyDict>>) -> PyTrn2Result<Model> {
    let f = config.map(fields).transpose()?;
    Ok(workload::resolve_model(name, f.as_deref())?)
}

/// A model's fields under their `config.json` names and its parameter count (`trn2core.workload`
/// builds `Model.to_dict()` from these; the four MoE fields are `None` for a dense model).
#[pyclass(name = "ModelInfo", module = "trn2core._core", frozen, get_all)]
pub struct PyModelInfo {
    name: String,
    hidden_size: u64,
    num_hidden_layers: u64,
    num_attention_heads: u64,
    num_key_value_heads: u64,
    head_dim: u64,
    intermediate_size: u64,
    vocab_size: u64,
    tie_word_embeddings: bool,
    sliding_window: Option<u64>,
    parameters: u64,
    moe_layers: u64,
    num_experts: Option<u64>,
    num_experts_per_tok: Option<u64>,
    shared_experts: Option<u64>,
    moe_intermediate_size: Option<u64>,
    attention: &'static str,
}

impl PyModelInfo {
    fn of(m: &Model) -> PyTrn2Result<Self> {
        let moe = m.moe.as_ref();
        Ok(PyModelInfo {
            name: m.name.clone(),
            hidden_size: m.hidden,
            num_hidden_layers: m.layers,
            num_attention_heads: m.heads,
            num_key_value_heads: m.kv_heads,
            head_dim: m.head_dim,
            intermediate_size: m.intermediate,
            vocab_size: m.vocab,
            tie_word_embeddings: m.tied_embeddings,
            sliding_window: m.sliding_window,
            parameters: m.parameters()?,
            moe_layers: m.moe_layers(),
            num_experts: moe.map(|e| e.experts),
            num_experts_per_tok: moe.map(|e| e.experts_per_token),
            shared_experts: moe.map(|e| e.shared_experts),
            moe_intermediate_size: moe.map(|e| e.intermediate),
            attention: match m.attention {
                workload::AttentionKind::Gqa => "gqa",
                workload::AttentionKind::Mla { .. } => "mla",
            },
        })
    }
}

/// One op of a step ([`OpTime`]): `seconds` is one run, `total_s` all `count` runs with their
/// fixed costs.
#[pyclass(name = "OpTime", module = "trn2core._core", frozen, get_all)]
pub struct PyOpTime {
    name: String,
    scope: &'static str,
    kind: &'static str,
    count: u64,
    seconds: f64,
    fixed_s: f64,
    total_s: f64,
    hbm_bytes: f64,
    flops: f64,
    bound: String,
}

impl From<OpTime> for PyOpTime {
    fn from(o: OpTime) -> Self {
        let total_s = o.total_s();
        PyOpTime {
            name: o.name,
            scope: o.scope,
            kind: o.kind,
            count: o.count,
            seconds: o.seconds,
            fixed_s: o.fixed_s,
            total_s,
            hbm_bytes: o.hbm_bytes,
            flops: o.flops,
            bound: o.bound,
        }
    }
}

/// Bytes per logical core ([`MemoryPlan`]): `items` as `(name, bytes)` pairs in the plan's order.
#[pyclass(name = "MemoryPlan", module = "trn2core._core", frozen, get_all)]
pub struct PyMemoryPlan {
    items: Vec<(&'static str, u64)>,
    total_bytes: u64,
    capacity_bytes: u64,
    ranks_per_chip: usize,
}

impl From<MemoryPlan> for PyMemoryPlan {
    fn from(m: MemoryPlan) -> Self {
        PyMemoryPlan {
            items: m.items.iter().map(|i| (i.name, i.bytes)).collect(),
            total_bytes: m.total_bytes,
            capacity_bytes: m.capacity_bytes,
            ranks_per_chip: m.ranks_per_chip,
        }
    }
}

/// What the calibrated terms of a step multiply ([`Parts`]).
#[pyclass(name = "StepParts", module = "trn2core._core", frozen, get_all)]
pub struct PyStepParts {
    other_s: f64,
    reduce_ops: f64,
    reduce_steps: f64,
    fixed_ops: f64,
    layer_collectives_s: f64,
}

impl From<Parts> for PyStepParts {
    fn from(p: Parts) -> Self {
        PyStepParts {
            other_s: p.other_s,
            reduce_ops: p.reduce_ops,
            reduce_steps: p.reduce_steps,
            fixed_ops: p.fixed_ops,
            layer_collectives_s: p.layer_collectives_s,
        }
    }
}

/// What every step report carries: the base class of `StepReport` and `TrainReport` (the per-op
/// rows, the memory plan, the uncertainty).
#[pyclass(name = "Step", module = "trn2core._core", subclass, frozen, get_all)]
pub struct PyStep {
    phase: &'static str,
    model: String,
    seconds: f64,
    description: String,
    ops: Vec<Py<PyOpTime>>,
    memory: Py<PyMemoryPlan>,
    uncertainty: Py<PyUncertainty>,
}

/// The [`PyStep`] of a core report `$r` (a [`StepReport`] or a [`TrainReport`]: the fields they
/// share), inside a function returning `PyResult`.
macro_rules! step_of {
    ($py:expr, $phase:expr, $r:ident) => {
        PyStep {
            phase: $phase,
            model: $r.model,
            seconds: $r.seconds,
            description: $r.description,
            ops: $r
                .ops
                .into_iter()
                .map(|o| Py::new($py, PyOpTime::from(o)))
                .collect::<PyResult<_>>()?,
            memory: Py::new($py, PyMemoryPlan::from($r.memory))?,
            uncertainty: PyUncertainty::of($py, &$r.uncertainty)?,
        }
    };
}

/// One inference step ([`StepReport`]).
#[pyclass(name = "StepReport", module = "trn2core._core", extends = PyStep, frozen, get_all)]
pub struct PyStepReport {
    tokens: u64,
    bucket: u64,
    parts: Py<PyStepParts>,
}

impl PyStepReport {
    fn of(py: Python<'_>, r: StepReport) -> PyResult<Py<Self>> {
        let step = step_of!(py, r.phase, r);
        let report = PyStepReport {
            tokens: r.tokens,
            bucket: r.bucket,
            parts: Py::new(py, PyStepParts::from(r.parts))?,
        };
        Py::new(py, PyClassInitializer::from(step).add_subclass(report))
    }
}

/// One slice of a training step's schedule: `(stage or None, name, micro-batch or None,
/// start_s, seconds)` ([`trn2core::workload::ScheduleSlice`]).
type ScheduleRow = (Option<usize>, &'static str, Option<u64>, f64, f64);

/// One training step ([`TrainReport`]); its `phase` is `"train"`.
#[pyclass(name = "TrainReport", module = "trn2core._core", extends = PyStep, frozen, get_all)]
pub struct PyTrainReport {
    tokens_per_s: f64,
    mfu: f64,
    model_flops: f64,
    peak_flops_per_s: f64,
    micro_batches: u64,
    bubble_fraction: f64,
    stage_layers: u64,
    forward_s: f64,
    backward_s: f64,
    dp_reduce_s: f64,
    dp_exposed_s: f64,
    /// The step's schedule: `(stage or None, name, micro-batch or None, start_s, seconds)`.
    schedule: Vec<ScheduleRow>,
}

impl PyTrainReport {
    fn of(py: Python<'_>, r: TrainReport) -> PyResult<Py<Self>> {
        let step = step_of!(py, "train", r);
        let report = PyTrainReport {
            tokens_per_s: r.tokens_per_s,
            mfu: r.mfu,
            model_flops: r.model_flops,
            peak_flops_per_s: r.peak_flops_per_s,
            micro_batches: r.micro_batches,
            bubble_fraction: r.bubble_fraction,
            stage_layers: r.stage_layers,
            forward_s: r.forward_s,
            backward_s: r.backward_s,
            dp_reduce_s: r.dp_reduce_s,
            dp_exposed_s: r.dp_exposed_s,
            schedule: r
                .schedule
                .iter()
                .map(|x| (x.stage, x.name, x.micro_batch, x.start_s, x.seconds))
                .collect(),
        };
        Py::new(py, PyClassInitializer::from(step).add_subclass(report))
    }
}

/// One ranked layout of a search ([`Candidate`]; `cost_per_mtok` `None` without a price).
#[pyclass(name = "Candidate", module = "trn2core._core", frozen, get_all)]
pub struct PyCandidate {
    tp: usize,
    pp: usize,
    dp: usize,
    ep: usize,
    lnc: usize,
    batch: u64,
    ttft_s: f64,
    itl_s: f64,
    tokens_per_s: f64,
    cost_per_mtok: Option<f64>,
    mfu: f64,
}

impl From<&Candidate> for PyCandidate {
    fn from(c: &Candidate) -> Self {
        PyCandidate {
            tp: c.tp,
            pp: c.pp,
            dp: c.dp,
            ep: c.ep,
            lnc: c.lnc,
            batch: c.batch,
            ttft_s: c.ttft_s,
            itl_s: c.itl_s,
            tokens_per_s: c.tokens_per_s,
            cost_per_mtok: c.cost_per_mtok,
            mfu: c.mfu,
        }
    }
}

/// The ranked layouts of a search, best first, and the counts of those left out
/// ([`SearchResult`]).
#[pyclass(name = "SearchResult", module = "trn2core._core", frozen, get_all)]
pub struct PySearchResult {
    layouts: Vec<Py<PyCandidate>>,
    tried: usize,
    skipped_capacity: usize,
    skipped_invalid: usize,
    skipped_constraints: usize,
}

impl PySearchResult {
    fn of(py: Python<'_>, r: &SearchResult) -> PyResult<Self> {
        Ok(PySearchResult {
            layouts: r
                .layouts
                .iter()
                .map(|c| Py::new(py, PyCandidate::from(c)))
                .collect::<PyResult<_>>()?,
            tried: r.tried,
            skipped_capacity: r.skipped_capacity,
            skipped_invalid: r.skipped_invalid,
            skipped_constraints: r.skipped_constraints,
        })
    }
}

/// The model's description: its fields and parameter count.
#[pyfunction]
#[pyo3(signature = (name, config = None))]
pub fn workload_model(name: &str, config: Option<Bound<'_, PyDict>>) -> PyTrn2Result<PyModelInfo> {
    PyModelInfo::of(&model_of(name, config.as_ref())?)
}

/// An inference layout as `trn2core.workload.Inference` holds it (a dict of these keys, its
/// values checked there).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct LayoutArgs {
    machine: String,
    tp: usize,
    ep: usize,
    lnc: usize,
    batch: u64,
    dtype: String,
    sequence_parallel: bool,
    seq_len: u64,
    prefill_buckets: Vec<u64>,
    decode_buckets: Vec<u64>,
    serving: String,
    naive: bool,
}

impl LayoutArgs {
    /// The core's layout: names parsed, values moved.
    fn layout(self) -> PyTrn2Result<Layout> {
        Ok(Layout {
            machine: Machine::named(&self.machine)?,
            tp: self.tp,
            ep: self.ep,
            lnc: self.lnc,
            batch: self.batch,
            weights: Format::parse("dtype", &self.dtype)?,
            sequence_parallel: self.sequence_parallel,
            seq_len: self.seq_len,
            prefill_buckets: self.prefill_buckets,
            decode_buckets: self.decode_buckets,
            serving: Serving::named(&self.serving)?,
            naive: self.naive,
        })
    }
}

/// One step (`phase` "prefill" with `tokens` prompt tokens, or "decode" with `tokens` of
/// context) of the model named by `name`/`config` in the layout.
#[pyfunction]
pub fn workload_step<'py>(
    py: Python<'py>, name: &str, config: Option<Bound<'py, PyDict>>, phase: &str, tokens: u64,
    layout: LayoutArgs,
) -> PyTrn2Result<Py<PyStepReport>> {
    let m = model_of(name, config.as_ref())?;
    let l = layout.layout()?;
    let prefill = match phase {
        "prefill" => true,
        "decode" => false,
        _ => {
            return Err(trn2core::Error::value("phase", "expected prefill or decode").into());
        }
    };
    let r = guard_detached(py, || {
        if prefill {
            workload::prefill(&m, &l, tokens)
        } else {
            workload::decode(&m, &l, tokens)
        }
    })?;
    Ok(PyStepReport::of(py, r)?)
}

/// The memory plan of the layout (`CapacityError` if it does not fit).
#[pyfunction]
pub fn workload_memory<'py>(
    name: &str, config: Option<Bound<'py, PyDict>>, layout: LayoutArgs,
) -> PyTrn2Result<PyMemoryPlan> {
    let m = model_of(name, config.as_ref())?;
    Ok(workload::memory(&m, &layout.layout()?)?.into())
}

/// A training layout as `trn2core.workload.Training` holds it (a dict of these keys, its values
/// checked there).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct TrainArgs {
    machine: String,
    tp: usize,
    pp: usize,
    dp: usize,
    ep: usize,
    lnc: usize,
    micro_batch: u64,
    global_batch: u64,
    seq: u64,
    dtype: String,
    zero1: bool,
    recompute: String,
    sequence_parallel: bool,
}

/// One training step of the model named by `name`/`config`.
#[pyfunction]
pub fn workload_train<'py>(
    py: Python<'py>, name: &str, config: Option<Bound<'py, PyDict>>, layout: TrainArgs,
) -> PyTrn2Result<Py<PyTrainReport>> {
    let m = model_of(name, config.as_ref())?;
    let a = layout;
    let t = TrainLayout {
        machine: Machine::named(&a.machine)?,
        tp: a.tp,
        pp: a.pp,
        dp: a.dp,
        ep: a.ep,
        lnc: a.lnc,
        micro_batch: a.micro_batch,
        global_batch: a.global_batch,
        seq: a.seq,
        dtype: Format::parse("dtype", &a.dtype)?,
        zero1: a.zero1,
        recompute: Recompute::named(&a.recompute)?,
        sequence_parallel: a.sequence_parallel,
    };
    let r = guard_detached(py, || workload::train_step(&m, &t))?;
    Ok(PyTrainReport::of(py, r)?)
}

/// Ranks the parallel layouts of the model on the machine: the ranked layouts and the counts of
/// those left out.
#[pyfunction]
#[pyo3(signature = (name, config, machine, objective, price_per_hour, train, prompt, output, tp,
                    pp, ep, lnc, batch, dtype, global_batch, seq, max_ttft_s, max_itl_s))]
#[allow(clippy::too_many_arguments)]
pub fn workload_search<'py>(
    py: Python<'py>, name: &str, config: Option<Bound<'py, PyDict>>, machine: &str,
    objective: &str, price_per_hour: Option<f64>, train: bool, prompt: u64, output: u64,
    tp: Vec<usize>, pp: Vec<usize>, ep: Vec<usize>, lnc: Vec<usize>, batch: Vec<u64>, dtype: &str,
    global_batch: u64, seq: u64, max_ttft_s: Option<f64>, max_itl_s: Option<f64>,
) -> PyTrn2Result<PySearchResult> {
    let m = model_of(name, config.as_ref())?;
    let space = SearchSpace {
        machine: Machine::named(machine)?,
        objective: Objective::named(objective)?,
        price_per_hour,
        train,
        prompt,
        output,
        tp,
        pp,
        ep,
        lnc,
        batch,
        dtype: Format::parse("dtype", dtype)?,
        global_batch,
        seq,
        max_ttft_s,
        max_itl_s,
    };
    let r = guard_detached(py, || workload::search(&m, &space))?;
    Ok(PySearchResult::of(py, &r)?)
}
