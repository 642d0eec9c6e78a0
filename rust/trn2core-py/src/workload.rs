//! Binding of whole-model estimates (`trn2core::workload`): converts the config and the layout,
//! calls one core function, maps errors. No logic.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList};
use trn2core::numerics::Format;
use trn2core::workload::{
    self, ConfigValue, Layout, Machine, MemoryPlan, Model, Objective, OpTime, Recompute,
    SearchSpace, Serving, TrainLayout,
};

use crate::errors::{guard_detached, PyTrn2Result};
use crate::perf::uncertainty_dict;

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

/// The model's description: its fields and parameter count.
#[pyfunction]
#[pyo3(signature = (name, config = None))]
pub fn workload_model<'py>(
    py: Python<'py>,
    name: &str,
    config: Option<Bound<'py, PyDict>>,
) -> PyTrn2Result<Bound<'py, PyDict>> {
    let m = model_of(name, config.as_ref())?;
    let d = PyDict::new(py);
    d.set_item("name", &m.name)?;
    d.set_item("hidden_size", m.hidden)?;
    d.set_item("num_hidden_layers", m.layers)?;
    d.set_item("num_attention_heads", m.heads)?;
    d.set_item("num_key_value_heads", m.kv_heads)?;
    d.set_item("head_dim", m.head_dim)?;
    d.set_item("intermediate_size", m.intermediate)?;
    d.set_item("vocab_size", m.vocab)?;
    d.set_item("tie_word_embeddings", m.tied_embeddings)?;
    d.set_item("sliding_window", m.sliding_window)?;
    d.set_item("parameters", m.parameters()?)?;
    d.set_item("moe_layers", m.moe_layers())?;
    if let Some(e) = &m.moe {
        d.set_item("num_experts", e.experts)?;
        d.set_item("num_experts_per_tok", e.experts_per_token)?;
        d.set_item("shared_experts", e.shared_experts)?;
        d.set_item("moe_intermediate_size", e.intermediate)?;
    }
    d.set_item(
        "attention",
        match m.attention {
            workload::AttentionKind::Gqa => "gqa",
            workload::AttentionKind::Mla { .. } => "mla",
        },
    )?;
    Ok(d)
}

/// The layout of a call, converted.
#[allow(clippy::too_many_arguments)]
fn layout_of(
    machine: &str,
    tp: usize,
    ep: usize,
    lnc: usize,
    batch: u64,
    dtype: &str,
    sequence_parallel: bool,
    seq_len: u64,
    prefill_buckets: Vec<u64>,
    decode_buckets: Vec<u64>,
    serving: &str,
    naive: bool,
) -> PyTrn2Result<Layout> {
    Ok(Layout {
        machine: Machine::named(machine)?,
        tp,
        ep,
        lnc,
        batch,
        weights: Format::parse("dtype", dtype)?,
        sequence_parallel,
        seq_len,
        prefill_buckets,
        decode_buckets,
        serving: Serving::named(serving)?,
        naive,
    })
}

fn memory_dict<'py>(py: Python<'py>, m: &MemoryPlan) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let items = PyDict::new(py);
    for i in &m.items {
        items.set_item(i.name, i.bytes)?;
    }
    d.set_item("items", items)?;
    d.set_item("total_bytes", m.total_bytes)?;
    d.set_item("capacity_bytes", m.capacity_bytes)?;
    d.set_item("ranks_per_chip", m.ranks_per_chip)?;
    Ok(d)
}

fn ops_list<'py>(py: Python<'py>, ops: &[OpTime]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for o in ops {
        let od = PyDict::new(py);
        od.set_item("name", &o.name)?;
        od.set_item("scope", o.scope)?;
        od.set_item("kind", o.kind)?;
        od.set_item("count", o.count)?;
        od.set_item("seconds", o.seconds)?;
        od.set_item("fixed_s", o.fixed_s)?;
        od.set_item("total_s", o.total_s())?;
        od.set_item("hbm_bytes", o.hbm_bytes)?;
        od.set_item("flops", o.flops)?;
        od.set_item("bound", &o.bound)?;
        out.append(od)?;
    }
    Ok(out)
}

/// One step (`phase` "prefill" with `tokens` prompt tokens, or "decode" with `tokens` of
/// context) of the model named by `name`/`config` in the layout: the report as a dict.
#[pyfunction]
#[pyo3(signature = (name, config, phase, tokens, machine, tp, ep, lnc, batch, dtype,
                    sequence_parallel, seq_len, prefill_buckets, decode_buckets, serving, naive))]
#[allow(clippy::too_many_arguments)]
pub fn workload_step<'py>(
    py: Python<'py>,
    name: &str,
    config: Option<Bound<'py, PyDict>>,
    phase: &str,
    tokens: u64,
    machine: &str,
    tp: usize,
    ep: usize,
    lnc: usize,
    batch: u64,
    dtype: &str,
    sequence_parallel: bool,
    seq_len: u64,
    prefill_buckets: Vec<u64>,
    decode_buckets: Vec<u64>,
    serving: &str,
    naive: bool,
) -> PyTrn2Result<Bound<'py, PyDict>> {
    let m = model_of(name, config.as_ref())?;
    let l = layout_of(
        machine,
        tp,
        ep,
        lnc,
        batch,
        dtype,
        sequence_parallel,
        seq_len,
        prefill_buckets,
        decode_buckets,
        serving,
        naive,
    )?;
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
    let d = PyDict::new(py);
    d.set_item("phase", r.phase)?;
    d.set_item("model", &r.model)?;
    d.set_item("tokens", r.tokens)?;
    d.set_item("bucket", r.bucket)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("description", &r.description)?;
    d.set_item("ops", ops_list(py, &r.ops)?)?;
    d.set_item("memory", memory_dict(py, &r.memory)?)?;
    let p = PyDict::new(py);
    p.set_item("other_s", r.parts.other_s)?;
    p.set_item("reduce_ops", r.parts.reduce_ops)?;
    p.set_item("reduce_steps", r.parts.reduce_steps)?;
    p.set_item("fixed_ops", r.parts.fixed_ops)?;
    p.set_item("layer_collectives_s", r.parts.layer_collectives_s)?;
    d.set_item("parts", p)?;
    d.set_item("uncertainty", uncertainty_dict(py, &r.uncertainty)?)?;
    Ok(d)
}

/// The memory plan of the layout (`CapacityError` if it does not fit).
#[pyfunction]
#[pyo3(signature = (name, config, machine, tp, ep, lnc, batch, dtype, seq_len, prefill_buckets))]
#[allow(clippy::too_many_arguments)]
pub fn workload_memory<'py>(
    py: Python<'py>,
    name: &str,
    config: Option<Bound<'py, PyDict>>,
    machine: &str,
    tp: usize,
    ep: usize,
    lnc: usize,
    batch: u64,
    dtype: &str,
    seq_len: u64,
    prefill_buckets: Vec<u64>,
) -> PyTrn2Result<Bound<'py, PyDict>> {
    let m = model_of(name, config.as_ref())?;
    let l = layout_of(
        machine,
        tp,
        ep,
        lnc,
        batch,
        dtype,
        false,
        seq_len,
        prefill_buckets,
        Vec::new(),
        "native",
        false,
    )?;
    Ok(memory_dict(py, &workload::memory(&m, &l)?)?)
}

/// One training step of the model named by `name`/`config`: the report as a dict.
#[pyfunction]
#[pyo3(signature = (name, config, machine, tp, pp, dp, ep, lnc, micro_batch, global_batch, seq,
                    dtype, zero1, recompute, sequence_parallel))]
#[allow(clippy::too_many_arguments)]
pub fn workload_train<'py>(
    py: Python<'py>,
    name: &str,
    config: Option<Bound<'py, PyDict>>,
    machine: &str,
    tp: usize,
    pp: usize,
    dp: usize,
    ep: usize,
    lnc: usize,
    micro_batch: u64,
    global_batch: u64,
    seq: u64,
    dtype: &str,
    zero1: bool,
    recompute: &str,
    sequence_parallel: bool,
) -> PyTrn2Result<Bound<'py, PyDict>> {
    let m = model_of(name, config.as_ref())?;
    let t = TrainLayout {
        machine: Machine::named(machine)?,
        tp,
        pp,
        dp,
        ep,
        lnc,
        micro_batch,
        global_batch,
        seq,
        dtype: Format::parse("dtype", dtype)?,
        zero1,
        recompute: Recompute::named(recompute)?,
        sequence_parallel,
    };
    let r = guard_detached(py, || workload::train_step(&m, &t))?;
    let d = PyDict::new(py);
    d.set_item("phase", "train")?;
    d.set_item("model", &r.model)?;
    d.set_item("seconds", r.seconds)?;
    d.set_item("tokens_per_s", r.tokens_per_s)?;
    d.set_item("mfu", r.mfu)?;
    d.set_item("model_flops", r.model_flops)?;
    d.set_item("peak_flops_per_s", r.peak_flops_per_s)?;
    d.set_item("micro_batches", r.micro_batches)?;
    d.set_item("bubble_fraction", r.bubble_fraction)?;
    d.set_item("stage_layers", r.stage_layers)?;
    d.set_item("forward_s", r.forward_s)?;
    d.set_item("backward_s", r.backward_s)?;
    d.set_item("dp_reduce_s", r.dp_reduce_s)?;
    d.set_item("dp_exposed_s", r.dp_exposed_s)?;
    d.set_item("description", &r.description)?;
    d.set_item("ops", ops_list(py, &r.ops)?)?;
    d.set_item("memory", memory_dict(py, &r.memory)?)?;
    d.set_item("uncertainty", uncertainty_dict(py, &r.uncertainty)?)?;
    Ok(d)
}

/// Ranks the parallel layouts of the model on the machine: the ranked layouts as dicts and the
/// counts of those left out.
#[pyfunction]
#[pyo3(signature = (name, config, machine, objective, price_per_hour, train, prompt, output, tp,
                    pp, ep, lnc, batch, dtype, global_batch, seq, max_ttft_s, max_itl_s))]
#[allow(clippy::too_many_arguments)]
pub fn workload_search<'py>(
    py: Python<'py>,
    name: &str,
    config: Option<Bound<'py, PyDict>>,
    machine: &str,
    objective: &str,
    price_per_hour: Option<f64>,
    train: bool,
    prompt: u64,
    output: u64,
    tp: Vec<usize>,
    pp: Vec<usize>,
    ep: Vec<usize>,
    lnc: Vec<usize>,
    batch: Vec<u64>,
    dtype: &str,
    global_batch: u64,
    seq: u64,
    max_ttft_s: Option<f64>,
    max_itl_s: Option<f64>,
) -> PyTrn2Result<Bound<'py, PyDict>> {
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
    let d = PyDict::new(py);
    let rows = PyList::empty(py);
    for c in &r.layouts {
        let cd = PyDict::new(py);
        cd.set_item("tp", c.tp)?;
        cd.set_item("pp", c.pp)?;
        cd.set_item("dp", c.dp)?;
        cd.set_item("ep", c.ep)?;
        cd.set_item("lnc", c.lnc)?;
        cd.set_item("batch", c.batch)?;
        cd.set_item("ttft_s", c.ttft_s)?;
        cd.set_item("itl_s", c.itl_s)?;
        cd.set_item("tokens_per_s", c.tokens_per_s)?;
        cd.set_item("cost_per_mtok", c.cost_per_mtok)?;
        cd.set_item("mfu", c.mfu)?;
        rows.append(cd)?;
    }
    d.set_item("layouts", rows)?;
    d.set_item("tried", r.tried)?;
    d.set_item("skipped_capacity", r.skipped_capacity)?;
    d.set_item("skipped_invalid", r.skipped_invalid)?;
    d.set_item("skipped_constraints", r.skipped_constraints)?;
    Ok(d)
}
