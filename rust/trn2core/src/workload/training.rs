//! One training step of a [`Model`] with tensor, pipeline, data (and expert) parallelism,
//! composed from the same per-op models as inference (docs/workload.md, "Training").
//!
//! # What one step is (per rank of the slowest pipeline stage)
//!
//! ```text
//! micro-batch  = forward of the stage's layers (inference's ops, a context-encoding pass of
//!                micro_batch x seq tokens) + backward (2 x every op's compute, the TP
//!                collectives once more) [+ the forward again under full recomputation]
//!                + the pipeline's send/recv of the activations (forward and backward)
//! pipeline     = (micro_batches + pp - 1) x micro-batch          (1F1B: the bubble is
//!                (pp - 1) / (micro_batches + pp - 1) of it)
//! step         = pipeline + the DP gradient reduction the last backward does not hide
//!                + the optimizer step (Adam on the rank's shard) [+ ZeRO-1's all-gather]
//! ```
//!
//! Mixed precision: bf16 (or fp8) GEMMs, bf16 weights, gradients and activations, fp32 master
//! weights and Adam moments (12 bytes a parameter), sharded over the DP ranks with ZeRO-1.
//! Every op's time comes from the functions inference uses ([`Step::layer`], `estimate_gemm`,
//! the DMA model, the in-graph collective model): no formula is derived twice.

use super::inference::{width_name, Layout, Machine, MemoryPlan, OpTime, Plan, Step};
use super::model::{add, mul, Model};
use crate::collective::{ranks_estimate, Algorithm, Collective, Launch};
use crate::numerics::Format;
use crate::perf::Uncertainty;
use crate::spec::{CORES_PER_CHIP, CORE_PEAK_BF16_FLOPS_PER_S, WORKLOAD_OP_FIXED_S};
use crate::{Error, Result};

/// Activation recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recompute {
    /// Every layer's activations are kept for the backward pass (the attention scores are
    /// never stored: the flash kernel recomputes them).
    None,
    /// Only each layer's input is kept; the forward runs again in the backward pass.
    Full,
}

impl Recompute {
    /// `"none"` or `"full"`; `ValueError` on `recompute` otherwise.
    pub fn named(name: &str) -> Result<Recompute> {
        match name {
            "none" => Ok(Recompute::None),
            "full" => Ok(Recompute::Full),
            _ => Err(Error::value("recompute", format!("{name:?}: expected \"none\" or \"full\""))),
        }
    }
}

/// A training layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainLayout {
    /// The machine.
    pub machine: Machine,
    /// Tensor-parallel degree (ranks of one layer).
    pub tp: usize,
    /// Pipeline-parallel degree (stages).
    pub pp: usize,
    /// Data-parallel degree (replicas).
    pub dp: usize,
    /// Expert-parallel degree of the MoE layers, inside the TP group.
    pub ep: usize,
    /// Physical cores per logical core (1 or 2).
    pub lnc: usize,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Sequences per optimizer step, over all replicas.
    pub global_batch: u64,
    /// Tokens per sequence.
    pub seq: u64,
    /// The GEMMs' format: bf16 or fp8 (weights stored in bf16).
    pub dtype: Format,
    /// ZeRO-1: optimizer states sharded over the DP ranks (reduce-scatter of the gradients,
    /// all-gather of the updated weights) instead of replicated (an all-reduce).
    pub zero1: bool,
    /// Activation recomputation.
    pub recompute: Recompute,
    /// Sequence parallelism in the TP group (norms and activations split over the ranks).
    pub sequence_parallel: bool,
}

/// One training step's estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// The model's name.
    pub model: String,
    /// Seconds of one optimizer step.
    pub seconds: f64,
    /// Tokens trained per second (global batch x seq / step).
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation: the model's forward and backward FLOPs (no recomputation)
    /// over the step time and the bf16 peak of the physical cores the layout occupies.
    pub mfu: f64,
    /// The model's FLOPs in one step.
    pub model_flops: f64,
    /// Peak FLOP/s of the cores the layout occupies.
    pub peak_flops_per_s: f64,
    /// Micro-batches per replica and step.
    pub micro_batches: u64,
    /// The 1F1B bubble: `(pp - 1) / (micro_batches + pp - 1)` of the pipeline's time.
    pub bubble_fraction: f64,
    /// Layers of the slowest stage.
    pub stage_layers: u64,
    /// Seconds of one micro-batch's forward on a stage.
    pub forward_s: f64,
    /// Seconds of its backward (with recomputation if asked).
    pub backward_s: f64,
    /// Seconds of the DP gradient collective.
    pub dp_reduce_s: f64,
    /// The part of it the last micro-batch's backward does not hide.
    pub dp_exposed_s: f64,
    /// The breakdown (counts are over the whole step; `total_s` sums to `seconds`).
    pub ops: Vec<OpTime>,
    /// The step as a schedule ([`schedule_1f1b`]): every stage's forward and backward
    /// micro-batches in 1F1B order, its idle time, the DP gradient collective and the
    /// optimizer; the last slice ends at `seconds`.
    pub schedule: Vec<ScheduleSlice>,
    /// Per logical core: weights, gradients, optimizer states, activations.
    pub memory: MemoryPlan,
    /// No published Trainium2 training throughput is known: no range.
    pub uncertainty: Uncertainty,
    /// One line: model, machine, layout.
    pub description: String,
}

/// One slice of a training step's schedule (a row of its trace).
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleSlice {
    /// The pipeline stage (`None`: once per step, after or beside the pipeline).
    pub stage: Option<usize>,
    /// `"forward"`, `"backward"`, `"bubble"` (a stage idle inside the pipeline),
    /// `"dp_grad_reduce"`, `"optimizer"`, `"dp_param_all_gather"`.
    pub name: &'static str,
    /// The micro-batch of a forward or backward.
    pub micro_batch: Option<u64>,
    /// Start, seconds from the step's start.
    pub start_s: f64,
    /// Duration, seconds.
    pub seconds: f64,
}

/// The 1F1B schedule of `micro_batches` micro-batches over `pp` stages, each stage's
/// forward taking `forward_s` and backward `backward_s` (stage boundaries' transfers
/// included): stage `s` runs `min(pp - s - 1, micro_batches)` forwards, then one forward and
/// one backward in turn, then the remaining backwards; a forward waits for the previous
/// stage's forward of its micro-batch, a backward for the next stage's backward. Returns each
/// stage's forwards, backwards and idle gaps (`"bubble"`) up to the pipeline's end, in start
/// order per stage, and that end: `(micro_batches + pp - 1) x (forward_s + backward_s)`.
pub fn schedule_1f1b(
    pp: usize, micro_batches: u64, forward_s: f64, backward_s: f64,
) -> (Vec<ScheduleSlice>, f64) {
    let m = micro_batches;
    // Each stage's order: (is backward, micro-batch).
    let order: Vec<Vec<(bool, u64)>> = (0..pp)
        .map(|s| {
            let warm = ((pp - s - 1) as u64).min(m);
            let mut o: Vec<(bool, u64)> = (0..warm).map(|i| (false, i)).collect();
            for i in 0..m - warm {
                o.push((false, warm + i));
                o.push((true, i));
            }
            o.extend((m - warm..m).map(|i| (true, i)));
            o
        })
        .collect();
    // End times of each stage's forwards and backwards, by micro-batch.
    let n = m as usize;
    let mut f_end = vec![vec![f64::NAN; n]; pp];
    let mut b_end = vec![vec![f64::NAN; n]; pp];
    let mut next = vec![0usize; pp];
    let mut free = vec![0f64; pp];
    let mut runs: Vec<Vec<ScheduleSlice>> = vec![Vec::new(); pp];
    let total = 2 * n * pp;
    let mut done = 0;
    while done < total {
        let before = done;
        for s in 0..pp {
            while let Some(&(bwd, i)) = order[s].get(next[s]) {
                let iu = i as usize;
                let dep = match (bwd, s) {
                    (false, 0) => 0.0,
                    (false, _) => f_end[s - 1][iu],
                    (true, _) if s + 1 == pp => f_end[s][iu],
                    (true, _) => b_end[s + 1][iu],
                };
                if dep.is_nan() {
                    break;
                }
                let start = free[s].max(dep);
                let dur = if bwd { backward_s } else { forward_s };
                if start > free[s] {
                    runs[s].push(ScheduleSlice {
                        stage: Some(s),
                        name: "bubble",
                        micro_batch: None,
                        start_s: free[s],
                        seconds: start - free[s],
                    });
                }
                free[s] = start + dur;
                if bwd {
                    b_end[s][iu] = free[s];
                } else {
                    f_end[s][iu] = free[s];
                }
                runs[s].push(ScheduleSlice {
                    stage: Some(s),
                    name: if bwd { "backward" } else { "forward" },
                    micro_batch: Some(i),
                    start_s: start,
                    seconds: dur,
                });
                next[s] += 1;
                done += 1;
            }
        }
        if done == before {
            break; // not reached: 1F1B never waits on itself
        }
    }
    let end = free.iter().copied().fold(0.0, f64::max);
    for (s, run) in runs.iter_mut().enumerate() {
        if end > free[s] {
            run.push(ScheduleSlice {
                stage: Some(s),
                name: "bubble",
                micro_batch: None,
                start_s: free[s],
                seconds: end - free[s],
            });
        }
    }
    (runs.into_iter().flatten().collect(), end)
}

/// The layout's sizes checked against the machine and the model: `ValueError` naming both
/// numbers of any mismatch.
fn check(model: &Model, t: &TrainLayout) -> Result<u64> {
    for (arg, v) in [
        ("tp", t.tp as u64),
        ("pp", t.pp as u64),
        ("dp", t.dp as u64),
        ("ep", t.ep as u64),
        ("micro_batch", t.micro_batch),
        ("global_batch", t.global_batch),
        ("seq", t.seq),
    ] {
        if v == 0 {
            return Err(Error::value(arg, "must be at least 1"));
        }
    }
    if t.lnc == 0 || t.lnc > 2 {
        return Err(Error::value("lnc", format!("lnc={}: whole models run at LNC 1 or 2", t.lnc)));
    }
    let per_chip = CORES_PER_CHIP / t.lnc;
    let available = t.machine.chips.saturating_mul(per_chip);
    let ranks = t.tp.checked_mul(t.pp).and_then(|x| x.checked_mul(t.dp)).unwrap_or(usize::MAX);
    if ranks > available {
        return Err(Error::value(
            "tp*pp*dp",
            format!(
                "tp*pp*dp = {}*{}*{} = {ranks} logical cores; a {} has {available} at LNC={}",
                t.tp, t.pp, t.dp, t.machine.name, t.lnc
            ),
        ));
    }
    if t.pp as u64 > model.layers {
        return Err(Error::value(
            "pp",
            format!(
                "pp={} stages for {} layers (num_hidden_layers): at most one stage a layer",
                t.pp, model.layers
            ),
        ));
    }
    let per_step = mul(&[t.micro_batch, t.dp as u64])?;
    if !t.global_batch.is_multiple_of(per_step) {
        return Err(Error::value(
            "global_batch",
            format!(
                "global_batch={} is not a multiple of micro_batch*dp = {}*{} = {per_step}",
                t.global_batch, t.micro_batch, t.dp
            ),
        ));
    }
    if !matches!(t.dtype, Format::Bf16 | Format::Fp8E4m3) {
        return Err(Error::value("dtype", "training runs bf16 or fp8 GEMMs"));
    }
    Ok(t.global_batch / per_step)
}

/// A collective of `bytes` per rank over `ranks` ranks inside the compiled graph.
fn collective(c: Collective, ranks: usize, lnc: usize, bytes: u64) -> Result<(f64, String)> {
    let bytes = bytes.max(2).next_multiple_of(2 * ranks as u64);
    let row = ranks_estimate(c, ranks, lnc, bytes, 2, Algorithm::Auto, Launch::InGraph)?;
    Ok((row.seconds, row.algorithm))
}

/// The ranks a group of `n` ranks spanning chips is costed over, and how many groups share a
/// chip's links at once (`local`): the collective model places ranks consecutively, so a
/// DP group (ranks `tp*pp` apart) is costed as `local` groups of the chip reducing together,
/// `local` times the bytes over `n * local` ranks. Inter-chip bytes per chip match; the extra
/// on-chip phase is small. A guess at placement (docs/workload.md).
fn spread(n: usize, stride: usize, per_chip: usize) -> (usize, u64) {
    let local = stride.min(per_chip).max(1);
    let ranks = n.saturating_mul(local);
    if ranks <= per_chip || ranks.is_multiple_of(per_chip) {
        (ranks, local as u64)
    } else {
        (n.saturating_mul(per_chip), per_chip as u64)
    }
}

/// The memory of one rank, and `CapacityError` naming the largest item if it does not fit.
fn memory(
    model: &Model, t: &TrainLayout, params: u64, stage_layers: u64, micro_batches: u64,
) -> Result<MemoryPlan> {
    let weights = mul(&[params, 2])?;
    let grads = mul(&[params, 2])?;
    // fp32 master weights and Adam's two moments.
    let states = mul(&[params, 12])? / if t.zero1 { t.dp as u64 } else { 1 };
    // Activations kept per layer and micro-batch, bytes (Korthikanti et al. 2022, "Reducing
    // Activation Recomputation in Large Transformer Models", eq. 1-4 with the attention scores
    // never stored: s*b*h*(10 + 24/t), or 34/t with sequence parallelism; full recomputation
    // keeps the layer's 2-byte input). A model fact, not hardware; a guess for Llama-style MLPs.
    let sbh = mul(&[t.seq, t.micro_batch, model.hidden])?;
    let tpu = t.tp as u64;
    let sp = t.sequence_parallel && t.tp > 1;
    let per_layer = match (t.recompute, sp) {
        (Recompute::Full, true) => mul(&[sbh, 2])?.div_ceil(tpu),
        (Recompute::Full, false) => mul(&[sbh, 2])?,
        (Recompute::None, true) => mul(&[sbh, 34])?.div_ceil(tpu),
        (Recompute::None, false) => add(&[mul(&[sbh, 10])?, mul(&[sbh, 24])?.div_ceil(tpu)])?,
    };
    // 1F1B: the first stage holds up to pp micro-batches' activations at once.
    let in_flight = micro_batches.min(t.pp as u64);
    let acts = mul(&[per_layer, stage_layers, in_flight])?;
    let items = [
        ("weights", weights),
        ("gradients", grads),
        ("optimizer_states", states),
        ("activations", acts),
    ];
    let ranks_per_chip = (CORES_PER_CHIP / t.lnc).min(t.tp * t.pp * t.dp);
    MemoryPlan::fit(&items, t.lnc, ranks_per_chip, || {
        format!(
            "{} training at tp={} pp={} dp={} micro_batch={} seq={}",
            model.name, t.tp, t.pp, t.dp, t.micro_batch, t.seq
        )
    })
}

/// Estimates one training step (`ValueError` on a bad layout, `CapacityError` if the memory
/// plan does not fit; nothing is estimated on either).
pub fn train_step(model: &Model, t: &TrainLayout) -> Result<TrainReport> {
    let micro_batches = check(model, t)?;
    let layout = Layout {
        sequence_parallel: t.sequence_parallel,
        ..Layout::native(t.machine.clone(), t.tp, t.ep, t.lnc, t.micro_batch, t.dtype, t.seq)
    };
    let plan = Plan::new(model, &layout)?;
    let pp = t.pp as u64;
    let stage_layers = model.layers.div_ceil(pp);
    let moe_all = model.moe_layers();
    let dense_all = model.layers - moe_all;
    let moe_s = moe_all.div_ceil(pp).min(stage_layers);
    let dense_s = (stage_layers - moe_s).min(dense_all);
    // Parameters of one rank: the TP shard of the whole model, split over the stages.
    let params = (plan.rank_weight_bytes()? / plan.weight_bytes).div_ceil(pp);
    let memory = memory(model, t, params, dense_s + moe_s, micro_batches)?;

    // The forward of one micro-batch on the slowest stage: inference's context-encoding ops.
    let mut fwd = Step {
        plan: &plan,
        ops: Vec::new(),
        parts: Default::default(),
        fixed: WORKLOAD_OP_FIXED_S,
    };
    fwd.layer("dense", dense_s, t.seq, t.seq, true)?;
    fwd.layer("moe", moe_s, t.seq, t.seq, true)?;
    // The last stage's lm_head over every position, with the loss.
    let rows = mul(&[t.micro_batch, t.seq])?;
    let vocab_shard = model.vocab.div_ceil(t.tp as u64);
    let (s, hbm, fl, b) = plan.gemm(rows, model.hidden, vocab_shard, t.dtype)?;
    fwd.push("lm_head", "step", "gemm", 1, s, hbm, fl, b);
    // The model's FLOPs of one micro-batch (all layers, one replica's tp ranks).
    let per_layer =
        |scope: &str| -> f64 { fwd.ops.iter().filter(|o| o.scope == scope).map(|o| o.flops).sum() };
    let replica_fwd_flops =
        (per_layer("dense") * dense_all as f64 + per_layer("moe") * moe_all as f64 + fl)
            * t.tp as f64;
    let forward_s: f64 = fwd.ops.iter().map(OpTime::total_s).sum();

    let mut ops: Vec<OpTime> = Vec::new();
    let mb = micro_batches;
    let mut backward_s = 0.0;
    for o in &fwd.ops {
        let mut f = o.clone();
        f.count = o.count * mb;
        ops.push(f);
        // Backward: the data and weight gradients, twice the forward's compute; a TP
        // collective's conjugate runs once more.
        let factor = if o.kind == "collective" { 1.0 } else { 2.0 };
        let mut bw = o.clone();
        bw.name = format!("{}.backward", o.name);
        bw.seconds *= factor;
        bw.fixed_s *= factor;
        bw.flops *= factor;
        bw.hbm_bytes *= factor;
        bw.count = o.count * mb;
        backward_s += o.total_s() * factor;
        ops.push(bw);
        if t.recompute == Recompute::Full && o.scope != "step" {
            let mut rc = o.clone();
            rc.name = format!("{}.recompute", o.name);
            rc.count = o.count * mb;
            backward_s += o.total_s();
            ops.push(rc);
        }
    }
    let per_chip = CORES_PER_CHIP / t.lnc;
    let mut p2p_s = 0.0;
    if t.pp > 1 {
        // The stage boundary's activations, forward and backward (split over the TP ranks
        // with sequence parallelism).
        let act = mul(&[rows, model.hidden, 2])?;
        let bytes = if t.sequence_parallel { act.div_ceil(t.tp as u64) } else { act };
        let (ranks, _) = spread(2, t.tp, per_chip);
        let (s, alg) = collective(Collective::SendRecv, ranks, t.lnc, bytes)?;
        p2p_s = 2.0 * s;
        ops.push(OpTime {
            name: "pp_send_recv".into(),
            scope: "step",
            kind: "collective",
            count: 2 * mb,
            seconds: s,
            fixed_s: 0.0,
            hbm_bytes: 0.0,
            flops: 0.0,
            bound: alg,
        });
    }
    let mb_s = forward_s + backward_s + p2p_s;
    let bubble_s = (pp - 1) as f64 * mb_s;
    if t.pp > 1 {
        ops.push(OpTime {
            name: "pipeline_bubble".into(),
            scope: "step",
            kind: "bubble",
            count: 1,
            seconds: bubble_s,
            fixed_s: 0.0,
            hbm_bytes: 0.0,
            flops: 0.0,
            bound: "schedule".into(),
        });
    }
    let bubble_fraction = (pp - 1) as f64 / (mb + pp - 1) as f64;

    // DP: the gradients reduced while the last micro-batch's backward runs.
    let grad_bytes = mul(&[params, 2])?;
    let (mut dp_reduce_s, mut dp_exposed_s, mut gather_s) = (0.0, 0.0, 0.0);
    let mut dp_alg = String::new();
    if t.dp > 1 {
        let (ranks, local) = spread(t.dp, t.tp * t.pp, per_chip);
        let c = if t.zero1 { Collective::ReduceScatter } else { Collective::AllReduce };
        let (s, alg) = collective(c, ranks, t.lnc, mul(&[grad_bytes, local])?)?;
        dp_reduce_s = s;
        dp_exposed_s = (s - backward_s).max(0.0);
        dp_alg = alg;
        if t.zero1 {
            let (s, _) =
                collective(Collective::AllGather, ranks, t.lnc, mul(&[grad_bytes, local])?)?;
            gather_s = s;
        }
    }
    if t.dp > 1 {
        ops.push(OpTime {
            name: if t.zero1 {
                "dp_grad_reduce_scatter (exposed)".into()
            } else {
                "dp_grad_all_reduce (exposed)".into()
            },
            scope: "step",
            kind: "collective",
            count: 1,
            seconds: dp_exposed_s,
            fixed_s: 0.0,
            hbm_bytes: 0.0,
            flops: 0.0,
            bound: dp_alg,
        });
    }
    // Adam on the rank's shard: reads master weights, moments and the gradient, writes them
    // and the bf16 weights back (28 bytes a parameter) through the DMA model.
    let shard = params.div_ceil(if t.zero1 { t.dp as u64 } else { 1 });
    let opt_bytes = mul(&[shard, 28])?;
    let opt_s = plan.hbm_stream(opt_bytes)?;
    ops.push(OpTime {
        name: "optimizer_step".into(),
        scope: "step",
        kind: "optimizer",
        count: 1,
        seconds: opt_s,
        fixed_s: WORKLOAD_OP_FIXED_S,
        hbm_bytes: opt_bytes as f64,
        flops: 0.0,
        bound: "memory".into(),
    });
    if gather_s > 0.0 {
        ops.push(OpTime {
            name: "dp_param_all_gather".into(),
            scope: "step",
            kind: "collective",
            count: 1,
            seconds: gather_s,
            fixed_s: 0.0,
            hbm_bytes: 0.0,
            flops: 0.0,
            bound: "link".into(),
        });
    }
    let seconds: f64 = ops.iter().map(OpTime::total_s).sum();
    // The schedule: each direction's stage-boundary transfer with its pass; the DP collective
    // starts with the compute of the last backward (stage 0's, the pipeline's last slice);
    // the optimizer after both, ZeRO-1's all-gather last.
    let (mut schedule, pipe_end) =
        schedule_1f1b(t.pp, mb, forward_s + p2p_s / 2.0, backward_s + p2p_s / 2.0);
    let step_slice = |name, start_s, seconds| ScheduleSlice {
        stage: None,
        name,
        micro_batch: None,
        start_s,
        seconds,
    };
    if t.dp > 1 {
        schedule.push(step_slice("dp_grad_reduce", pipe_end - backward_s, dp_reduce_s));
    }
    let opt_start = pipe_end + dp_exposed_s;
    let opt_total = opt_s + WORKLOAD_OP_FIXED_S;
    schedule.push(step_slice("optimizer", opt_start, opt_total));
    if gather_s > 0.0 {
        schedule.push(step_slice("dp_param_all_gather", opt_start + opt_total, gather_s));
    }
    let ranks = (t.tp * t.pp * t.dp) as f64;
    let peak = ranks * t.lnc as f64 * CORE_PEAK_BF16_FLOPS_PER_S;
    let model_flops = 3.0 * replica_fwd_flops * mb as f64 * t.dp as f64;
    let tokens = (t.global_batch as f64) * t.seq as f64;
    let description = format!(
        "{} training on {} tp={} pp={} dp={} ep={} lnc={} micro_batch={} global_batch={} \
         seq={} {}{}{}",
        model.name,
        t.machine.name,
        t.tp,
        t.pp,
        t.dp,
        t.ep,
        t.lnc,
        t.micro_batch,
        t.global_batch,
        t.seq,
        width_name(t.dtype),
        if t.zero1 { ", ZeRO-1" } else { "" },
        if t.recompute == Recompute::Full { ", full recomputation" } else { "" }
    );
    Ok(TrainReport {
        model: model.name.clone(),
        seconds,
        tokens_per_s: tokens / seconds,
        mfu: model_flops / (seconds * peak),
        model_flops,
        peak_flops_per_s: peak,
        micro_batches: mb,
        bubble_fraction,
        stage_layers: dense_s + moe_s,
        forward_s,
        backward_s,
        dp_reduce_s,
        dp_exposed_s,
        ops,
        schedule,
        memory,
        uncertainty: Uncertainty::WORKLOAD_TRAINING,
        description,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::arg_of;

    #[test]
    fn the_schedule_is_1f1b_and_ends_at_the_step() {
        // UltraServer, tp=16 pp=4 dp=4, micro_batch 2: 64 / (2 x 4) = 8 micro-batches.
        let m = Model::preset("llama-3.3-70b").expect("preset");
        let mut t = layout("ultraserver", 16, 4, 4, 64);
        t.micro_batch = 2;
        let r = train_step(&m, &t).expect("step");
        assert_eq!(r.micro_batches, 8);
        let stage = |s: usize, name: &str| -> Vec<&ScheduleSlice> {
            r.schedule.iter().filter(|x| x.stage == Some(s) && x.name == name).collect()
        };
        for s in 0..4 {
            assert_eq!(stage(s, "forward").len(), 8, "stage {s}");
            assert_eq!(stage(s, "backward").len(), 8, "stage {s}");
            // 1F1B order: 3 - s forwards first, then one of each in turn, then the backwards.
            let order: Vec<String> = r
                .schedule
                .iter()
                .filter(|x| x.stage == Some(s) && x.name != "bubble")
                .map(|x| format!("{}{}", &x.name[..1], x.micro_batch.expect("mb")))
                .collect();
            let warm = 3 - s as u64;
            let mut want: Vec<String> = (0..warm).map(|i| format!("f{i}")).collect();
            for i in 0..8 - warm {
                want.push(format!("f{}", warm + i));
                want.push(format!("b{i}"));
            }
            want.extend((8 - warm..8).map(|i| format!("b{i}")));
            assert_eq!(order, want, "stage {s}");
            // Slices never overlap on a stage, bubbles included, and fill it to the end.
            let mut rows: Vec<&ScheduleSlice> =
                r.schedule.iter().filter(|x| x.stage == Some(s)).collect();
            rows.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
            let mut at = 0.0;
            for x in &rows {
                assert!((x.start_s - at).abs() < 1e-9, "stage {s} gap at {at}");
                at = x.start_s + x.seconds;
            }
        }
        // Each stage idles (pp - 1) micro-batches' forward and backward: the 1F1B bubble.
        let mb_s = stage(0, "forward")[0].seconds + stage(0, "backward")[0].seconds;
        for s in 0..4 {
            let idle: f64 = stage(s, "bubble").iter().map(|x| x.seconds).sum();
            assert!((idle / (3.0 * mb_s) - 1.0).abs() < 1e-9, "stage {s}: {idle}");
        }
        // The pipeline is 11 micro-batch times; the DP reduction starts with the last
        // backward's compute, the optimizer (and ZeRO-1's all-gather) end the step.
        let pipe = 11.0 * mb_s;
        let end = r.schedule.iter().map(|x| x.start_s + x.seconds).fold(0.0, f64::max);
        assert!((end / r.seconds - 1.0).abs() < 1e-9, "{end} {}", r.seconds);
        let dp = r.schedule.iter().find(|x| x.name == "dp_grad_reduce").expect("dp");
        assert!((dp.start_s - (pipe - r.backward_s)).abs() < 1e-9 * pipe);
        assert!((dp.seconds - r.dp_reduce_s).abs() < 1e-15);
        let opt = r.schedule.iter().find(|x| x.name == "optimizer").expect("opt");
        assert!((opt.start_s - (pipe + r.dp_exposed_s)).abs() < 1e-9 * pipe);
        // One stage: no bubble, forward and backward in turn.
        let (one, end) = schedule_1f1b(1, 3, 1.0, 2.0);
        assert_eq!(one.len(), 6);
        assert!(one.iter().all(|x| x.name != "bubble"));
        assert_eq!(end, 9.0);
    }

    fn layout(machine: &str, tp: usize, pp: usize, dp: usize, global_batch: u64) -> TrainLayout {
        TrainLayout {
            machine: Machine::named(machine).expect("machine"),
            tp,
            pp,
            dp,
            ep: 1,
            lnc: 2,
            micro_batch: 1,
            global_batch,
            seq: 4096,
            dtype: Format::Bf16,
            zero1: true,
            recompute: Recompute::Full,
            sequence_parallel: true,
        }
    }

    #[test]
    fn the_step_is_its_ops_and_the_bubble_is_1f1b() {
        let m = Model::preset("llama-3.3-70b").expect("preset");
        let t = layout("ultraserver", 16, 4, 4, 64);
        let r = train_step(&m, &t).expect("step");
        let sum: f64 = r.ops.iter().map(OpTime::total_s).sum();
        assert!((r.seconds - sum).abs() < 1e-9 * r.seconds);
        // 64 sequences / (1 x 4 replicas) = 16 micro-batches: bubble 3/19.
        assert_eq!(r.micro_batches, 16);
        assert!((r.bubble_fraction - 3.0 / 19.0).abs() < 1e-12);
        let bubble = r.ops.iter().find(|o| o.name == "pipeline_bubble").expect("bubble");
        // The bubble is pp - 1 micro-batches of the stage.
        let per_mb = bubble.seconds / 3.0;
        assert!(per_mb > r.forward_s + r.backward_s && per_mb < 1.1 * (r.forward_s + r.backward_s));
        // Backward = 2 x forward, plus the forward again under full recomputation (the
        // lm_head is not recomputed), less the TP collectives that run once more, not twice.
        let ratio = r.backward_s / r.forward_s;
        assert!(ratio > 2.5 && ratio < 3.0, "{ratio}");
        assert_eq!(r.stage_layers, 20);
        assert!(r.mfu > 0.05 && r.mfu <= 1.0, "{}", r.mfu);
        assert!(r.uncertainty.text().contains("no published case"));
        let tokens = 64.0 * 4096.0;
        assert!((r.tokens_per_s * r.seconds / tokens - 1.0).abs() < 1e-12);
    }

    #[test]
    fn recomputation_trades_memory_for_time() {
        let m = Model::preset("llama-3.1-8b").expect("preset");
        let mut t = layout("trn2.48xlarge", 8, 2, 4, 32);
        let full = train_step(&m, &t).expect("full");
        t.recompute = Recompute::None;
        let none = train_step(&m, &t).expect("none");
        let acts = |r: &TrainReport| r.memory.items[3].bytes;
        // 2/t against 34/t bytes per s*b*h.
        assert_eq!(acts(&none), acts(&full) * 17);
        assert!(none.seconds < full.seconds);
        assert!(none.mfu > full.mfu);
        // ZeRO-1 shards the 12 bytes of optimizer state a parameter over the 4 DP ranks.
        let states = |r: &TrainReport| r.memory.items[2].bytes;
        t.zero1 = false;
        let replicated = train_step(&m, &t).expect("replicated");
        assert_eq!(states(&replicated), 4 * states(&none));
    }

    #[test]
    fn dp_overlap_hides_the_reduce_when_the_backward_is_longer() {
        let m = Model::preset("llama-3.1-8b").expect("preset");
        // Long sequences: the backward of one micro-batch outlasts the gradient reduce.
        let mut t = layout("ultraserver", 8, 1, 4, 16);
        t.seq = 8192;
        let r = train_step(&m, &t).expect("step");
        assert!(r.dp_reduce_s > 0.0 && r.dp_reduce_s < r.backward_s);
        assert_eq!(r.dp_exposed_s, 0.0);
        // Short ones: the reduce sticks out by exactly what the backward does not cover.
        t.seq = 128;
        t.recompute = Recompute::None;
        let s = train_step(&m, &t).expect("step");
        assert!(s.dp_reduce_s > s.backward_s, "{} {}", s.dp_reduce_s, s.backward_s);
        assert!((s.dp_exposed_s - (s.dp_reduce_s - s.backward_s)).abs() < 1e-15);
    }

    #[test]
    fn doubling_dp_halves_the_work_of_a_replica() {
        let m = Model::preset("llama-3.1-8b").expect("preset");
        let a = train_step(&m, &layout("ultraserver", 8, 2, 4, 256)).expect("dp4");
        let b = train_step(&m, &layout("ultraserver", 8, 2, 8, 256)).expect("dp8");
        assert_eq!(a.micro_batches, 2 * b.micro_batches);
        let compute = |r: &TrainReport| -> f64 {
            r.ops.iter().filter(|o| o.kind == "gemm").map(OpTime::total_s).sum()
        };
        assert!((compute(&a) / compute(&b) - 2.0).abs() < 1e-9);
        assert!((a.model_flops - b.model_flops).abs() < 1e-6 * a.model_flops);
        assert!(b.seconds < a.seconds);
    }

    #[test]
    fn bad_layouts_name_both_numbers() {
        let m = Model::preset("llama-3.3-70b").expect("preset");
        // (layout, the argument named, the numbers the message gives)
        for (t, arg, numbers) in [
            (layout("trn2.48xlarge", 16, 4, 4, 64), "tp*pp*dp", ["256", "64"]),
            (layout("ultracluster:2", 1, 81, 1, 1), "pp", ["81", "80"]),
            (layout("ultraserver", 16, 4, 4, 30), "global_batch", ["30", "= 4"]),
        ] {
            let e = train_step(&m, &t).expect_err(arg);
            assert_eq!(arg_of(&e), Some(arg));
            for n in numbers {
                assert!(e.to_string().contains(n), "{e}");
            }
        }
        // A 70B model's optimizer states at tp=1 do not fit a logical core.
        let e = train_step(&m, &layout("trn2.48xlarge", 1, 1, 1, 1)).expect_err("capacity");
        assert!(matches!(e, Error::Capacity { .. }));
        assert_eq!(arg_of(&e), Some("optimizer_states"));
    }
}
