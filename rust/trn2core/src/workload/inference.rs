//! Inference of a [`Model`] with tensor parallelism, as NxD Inference compiles it: one step of
//! context encoding (prefill: the time to first token) or of token generation (decode: the time
//! per output token), composed from the project's per-op models.
//!
//! # What one step is (per rank: one logical core of `lnc` physical cores)
//!
//! ```text
//! step = sum over layers of sum over the layer's ops of (op's modelled time + op fixed)
//!      + lm_head + sampling gather (+ vLLM's serving overhead)
//! ```
//!
//! - projections and MLP/expert GEMMs: `engine::estimate` (`estimate_gemm`) of the rank's
//!   shard `[tokens, K] @ [K, N / tp]` on the logical core's physical cores (weights read from
//!   HBM, so decode GEMMs are HBM-bound); fp8 weights are costed as fp8 GEMMs;
//! - attention: the machine's flash-attention kernel ([`kernels::attention_run`]) timed per
//!   shape: `fixed + (query tiles x per query tile + blocks x per block) / lnc` in prefill
//!   (128-row query tiles of every head against the 512-key tiles the causal mask or the
//!   sliding window leaves); in decode the token-generation kernel
//!   ([`kernels::attention_tkg_run`]: keys on the partitions) with one query tile per sequence
//!   and KV head (the query heads sharing it; MLA: every head against the latent cache), the
//!   tiles dealt to the physical cores or, with fewer tiles than cores, each tile's cache
//!   split between them; its DMAs read the KV cache;
//! - norms: the machine's rmsnorm kernel ([`kernels::rmsnorm_run`]) timed per shape: its
//!   fixed part plus each 128-row tile's steady-state time, tiles dealt to the physical cores;
//! - collectives: `collective::ranks_estimate` over the `tp` ranks launched in a compiled graph
//!   ([`Launch::InGraph`]): two all-reduces per layer, or with sequence parallelism a
//!   reduce-scatter and an all-gather in their place;
//! - every op besides the collectives pays `spec::WORKLOAD_OP_FIXED_S` (a compiled step's
//!   per-op fixed cost, calibrated);
//! - MoE: the router GEMM; in decode the experts the step's tokens touch (the expected number
//!   of distinct experts for uniform routing), each a GEMM of its share of the tokens; in
//!   prefill NxD's blockwise matmul: the worst-case number of 512-token blocks whatever the
//!   routing, each block's token gather, gate/up and down GEMMs and float32 add-back an op of
//!   the step (`spec::WORKLOAD_MOE_BLOCK_TOKENS`); shared experts as a dense MLP.
//!
//! The ops of a layer run one after another (no overlap of collectives with compute). Layers of
//! one kind (dense or MoE) cost the same, so each kind is costed once and multiplied: memory and
//! time do not grow with the number of layers.

use super::kernels::{self, AttentionShape, KV_TILE, Q_TILE};
use super::model::{add, mul, AttentionKind, Model};
use crate::collective::{ranks_estimate, Algorithm, Collective, Launch};
use crate::dma::cost::{dma_time, DmaPlan, Place};
use crate::engine::PerfMode;
use crate::engine::{estimate as estimate_gemm, EstimateRequest};
use crate::numerics::Format;
use crate::perf::Uncertainty;
use crate::spec::{
    CORES_PER_CHIP, RUNTIME_MICROCODE_BYTES_PER_CORE, RUNTIME_SCRATCHPAD_PAGE_BYTES,
    SBUF_PARTITIONS, SERVING_VLLM_REQUEST_OVERHEAD_S, SERVING_VLLM_TOKEN_OVERHEAD_S,
    WORKLOAD_MOE_BLOCK_TOKENS, WORKLOAD_OP_FIXED_S,
};
use crate::topology::{check_lnc, instance_type, LogicalCoreInfo};
use crate::{Error, Result};

/// Where the model is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// NxD Inference's own loop (its `benchmark_sampling`).
    Native,
    /// Through vLLM (the tutorials' LLMPerf runs): spec `SERVING_VLLM_*` added.
    Vllm,
}

impl Serving {
    /// `"native"` or `"vllm"`; `ValueError` on `serving` otherwise.
    pub fn named(name: &str) -> Result<Serving> {
        match name {
            "native" => Ok(Serving::Native),
            "vllm" => Ok(Serving::Vllm),
            _ => Err(Error::value("serving", format!("{name:?}: expected \"native\" or \"vllm\""))),
        }
    }
}

/// A machine: its name and chips.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// `"trn2.48xlarge"`, `"ultraserver"`, `"ultracluster(N)"`, ...
    pub name: String,
    /// Trainium2 chips.
    pub chips: usize,
}

impl Machine {
    /// An EC2 instance type (`"trn2.48xlarge"`), `"ultraserver"` (4 trn2u.48xlarge) or
    /// `"ultracluster:N"` (N UltraServers). `ValueError` on `machine` otherwise.
    pub fn named(name: &str) -> Result<Machine> {
        let lower = name.to_ascii_lowercase();
        let per_us = crate::spec::CHIPS_PER_ULTRASERVER;
        if lower == "ultraserver" {
            return Ok(Machine { name: "ultraserver".into(), chips: per_us });
        }
        if let Some(n) = lower.strip_prefix("ultracluster:") {
            let n: usize = n.parse().map_err(|_| {
                Error::value("machine", format!("{name:?}: expected ultracluster:N"))
            })?;
            let chips = n
                .checked_mul(per_us)
                .filter(|_| n >= 1)
                .ok_or_else(|| Error::value("machine", format!("{name:?}: bad size")))?;
            return Ok(Machine { name: format!("ultracluster({n})"), chips });
        }
        let t = instance_type(&lower).map_err(|_| {
            Error::value(
                "machine",
                format!(
                    "unknown machine {name:?}; expected trn2.3xlarge, trn2.48xlarge, \
                     trn2u.48xlarge, ultraserver or ultracluster:N"
                ),
            )
        })?;
        Ok(Machine { name: t.name.into(), chips: t.chips })
    }
}

/// How the model is compiled and run.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The machine.
    pub machine: Machine,
    /// Tensor-parallel degree: ranks (logical cores) one copy of the model spans.
    pub tp: usize,
    /// Expert-parallel degree of the MoE layers (1: every rank holds a slice of every expert).
    pub ep: usize,
    /// Physical cores per logical core (1 or 2).
    pub lnc: usize,
    /// Sequences per step.
    pub batch: u64,
    /// Weights' format: bf16 or fp8 (e4m3, per-channel scales).
    pub weights: Format,
    /// Sequence parallelism in context encoding (reduce-scatter + all-gather in place of each
    /// all-reduce).
    pub sequence_parallel: bool,
    /// Longest sequence (`seq_len`): the KV cache is allocated for it.
    pub seq_len: u64,
    /// Context-encoding buckets (empty: NxD Inference's default, powers of two from 128 up
    /// to `seq_len`).
    pub prefill_buckets: Vec<u64>,
    /// Token-generation buckets (empty: the same default).
    pub decode_buckets: Vec<u64>,
    /// Where it is served from.
    pub serving: Serving,
    /// The per-op sum the project gave before whole models were composed: collectives as
    /// standalone launches, no per-op fixed cost and no serving overhead (the "before" column
    /// of docs/workload.md).
    pub naive: bool,
}

impl Layout {
    /// A layout served natively with NxD Inference's default buckets, without sequence
    /// parallelism, the model composed (not [`Layout::naive`]).
    pub fn native(
        machine: Machine, tp: usize, ep: usize, lnc: usize, batch: u64, weights: Format,
        seq_len: u64,
    ) -> Layout {
        Layout {
            machine,
            tp,
            ep,
            lnc,
            batch,
            weights,
            sequence_parallel: false,
            seq_len,
            prefill_buckets: Vec::new(),
            decode_buckets: Vec::new(),
            serving: Serving::Native,
            naive: false,
        }
    }
}

/// One row of a step's breakdown: an op of a layer kind (or of the whole step).
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    /// What runs: `"qkv_proj"`, `"attention"`, `"all_reduce"`, ...
    pub name: String,
    /// `"dense"` or `"moe"` layers, or `"step"` for once-per-step ops.
    pub scope: &'static str,
    /// `"gemm"`, `"attention"` (in decode also reading the KV cache), `"dma"` (an MoE
    /// block's token rows), `"norm"`, `"collective"`, `"serving"`.
    pub kind: &'static str,
    /// How often it runs per step (the layers of its kind, or 1).
    pub count: u64,
    /// Modelled seconds of one run (without the op fixed cost).
    pub seconds: f64,
    /// The compiled step's fixed cost of one run (spec `WORKLOAD_OP_FIXED_S`; 0 for
    /// collectives, whose in-graph fixed cost is inside `seconds`).
    pub fixed_s: f64,
    /// HBM bytes one run reads or writes (weights, KV, activations; 0 for collectives).
    pub hbm_bytes: f64,
    /// FLOPs of one run.
    pub flops: f64,
    /// What bounds it (`"compute"`, `"memory"`, `"latency"`, `"link"`, ...).
    pub bound: String,
}

impl OpTime {
    /// Seconds over the step: `count x (seconds + fixed_s)`.
    pub fn total_s(&self) -> f64 {
        self.count as f64 * (self.seconds + self.fixed_s)
    }
}

/// One item of the memory plan, bytes per rank (logical core).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryItem {
    /// `"weights"`, `"kv_cache"`, `"activations"`, `"runtime_reserve"` (inference; training's
    /// items are its own, with the same reserve).
    pub name: &'static str,
    /// Bytes per logical core.
    pub bytes: u64,
}

/// The memory plan of a layout: what one rank holds, against its HBM.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// Items, per rank.
    pub items: Vec<MemoryItem>,
    /// Their sum.
    pub total_bytes: u64,
    /// HBM a logical core owns.
    pub capacity_bytes: u64,
    /// Ranks per chip (`8 / lnc`, or `tp` when fewer).
    pub ranks_per_chip: usize,
}

impl MemoryPlan {
    /// The plan of `items` (name, bytes per rank) on a logical core of `lnc` physical cores,
    /// `ranks_per_chip` ranks to a chip, with the runtime's own HBM added as one more item
    /// ([`runtime_reserve`]). `CapacityError` on the largest item when they do not fit, its
    /// message starting with `what()` (the workload and its layout).
    pub(super) fn fit(
        items: &[(&'static str, u64)], lnc: usize, ranks_per_chip: usize,
        what: impl FnOnce() -> String,
    ) -> Result<MemoryPlan> {
        let acts = items.iter().find(|i| i.0 == "activations").map_or(0, |i| i.1);
        let reserve = ("runtime_reserve", runtime_reserve(lnc, acts)?);
        let items: Vec<MemoryItem> = items
            .iter()
            .chain(std::iter::once(&reserve))
            .map(|&(name, bytes)| MemoryItem { name, bytes })
            .collect();
        let total = add(&items.iter().map(|i| i.bytes).collect::<Vec<_>>())?;
        let capacity = LogicalCoreInfo::new(lnc)?.hbm_bytes;
        if total > capacity {
            let big = items.iter().max_by_key(|i| i.bytes).map_or("weights", |i| i.name);
            let big_bytes = items.iter().map(|i| i.bytes).max().unwrap_or(0);
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(Error::capacity(
                big,
                format!(
                    "{} needs {:.2} GiB per logical core ({big} {:.2} GiB) of the {:.0} GiB an \
                     LNC={lnc} core has",
                    what(),
                    gib(total),
                    gib(big_bytes),
                    gib(capacity)
                ),
            ));
        }
        Ok(MemoryPlan { items, total_bytes: total, capacity_bytes: capacity, ranks_per_chip })
    }
}

/// HBM of a logical core of `lnc` physical cores that the Neuron runtime takes besides the
/// model's tensors, when the step's `activations` (bytes a logical core) live in its
/// scratchpad: the micro-code of each physical core (spec `RUNTIME_MICROCODE_BYTES_PER_CORE`)
/// and what the scratchpad's whole pages (spec `RUNTIME_SCRATCHPAD_PAGE_BYTES`, at least one a
/// physical core, each holding its share of the activations) add to the activations. Not
/// counted (a guess that they are small beside these): DMA rings, collectives' buffers, the
/// NEFFs' code and I/O tensors.
pub fn runtime_reserve(lnc: usize, activations: u64) -> Result<u64> {
    let cores = lnc.max(1) as u64;
    let page = RUNTIME_SCRATCHPAD_PAGE_BYTES;
    let pages_per_core = activations.div_ceil(cores).div_ceil(page).max(1);
    let scratchpad = mul(&[cores, pages_per_core, page])?;
    add(&[mul(&[cores, RUNTIME_MICROCODE_BYTES_PER_CORE])?, scratchpad.saturating_sub(activations)])
}

/// The counts the calibrated terms multiply (what `benches/fidelity_table.py` refits with).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Parts {
    /// Seconds that no calibrated workload term multiplies.
    pub other_s: f64,
    /// In-graph reducing collectives (each pays `COLLECTIVE_IN_GRAPH_REDUCE_OP_FIXED_S`).
    pub reduce_ops: f64,
    /// Their synchronised reducing steps (each pays `COLLECTIVE_IN_GRAPH_REDUCE_STEP_S`).
    pub reduce_steps: f64,
    /// Ops paying `WORKLOAD_OP_FIXED_S`.
    pub fixed_ops: f64,
    /// Seconds of the layers' all-reduces (the DeepSeek-V3 profile's "collectives").
    pub layer_collectives_s: f64,
}

/// One step's estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// `"prefill"` or `"decode"`.
    pub phase: &'static str,
    /// The model's name.
    pub model: String,
    /// Tokens asked for (prefill) or the context length (decode).
    pub tokens: u64,
    /// The compiled bucket the step runs in.
    pub bucket: u64,
    /// Seconds of the step.
    pub seconds: f64,
    /// The breakdown.
    pub ops: Vec<OpTime>,
    /// The memory plan (checked before anything was estimated).
    pub memory: MemoryPlan,
    /// What the calibrated terms multiply.
    pub parts: Parts,
    /// How far the published whole-model cases of this phase were from the model.
    pub uncertainty: Uncertainty,
    /// One line: model, machine, layout.
    pub description: String,
}

/// NxD Inference's default buckets: powers of two from 128, and `max` itself.
fn default_buckets(max: u64) -> Vec<u64> {
    let mut b: Vec<u64> = doublings(128).take_while(|&x| x < max).collect();
    b.push(max);
    b
}

/// `x`, `2x`, `4x`, ... (saturating).
pub(super) fn doublings(x: u64) -> impl Iterator<Item = u64> {
    std::iter::successors(Some(x), |&x| Some(x.saturating_mul(2)))
}

/// The smallest bucket holding `n` tokens; `ValueError` on `arg` when none does.
fn bucket_for(n: u64, buckets: &[u64], seq_len: u64, arg: &str) -> Result<u64> {
    let owned;
    let list = if buckets.is_empty() {
        owned = default_buckets(seq_len);
        &owned
    } else {
        buckets
    };
    list.iter().copied().filter(|&b| b >= n).min().ok_or_else(|| {
        let largest = list.iter().copied().max().unwrap_or(0);
        Error::value(arg, format!("{n} tokens exceed the largest compiled bucket ({largest})"))
    })
}

/// The per-rank shapes of one layer kind.
pub(super) struct Shard {
    /// Attention heads per rank, padded up when tp does not divide them.
    heads: u64,
    kv_heads: u64,
}

/// The layout checked against the model and machine, with the shard sizes.
pub(super) struct Plan<'a> {
    pub(super) model: &'a Model,
    pub(super) layout: &'a Layout,
    shard: Shard,
    cores: Vec<usize>,
    pub(super) act_bytes: u64,
    pub(super) weight_bytes: u64,
}

fn divides(what: &str, degree: usize, field: &str, value: u64) -> Result<()> {
    if value.is_multiple_of(degree as u64) {
        Ok(())
    } else {
        Err(Error::value(what, format!("{what}={degree} does not divide {field}={value}")))
    }
}

impl<'a> Plan<'a> {
    pub(super) fn new(model: &'a Model, layout: &'a Layout) -> Result<Plan<'a>> {
        check_lnc(layout.lnc)?;
        if layout.lnc > 2 {
            return Err(Error::value(
                "lnc",
                format!("lnc={} : whole models run at LNC 1 or 2", layout.lnc),
            ));
        }
        let (tp, ep) = (layout.tp, layout.ep);
        if tp == 0 || ep == 0 || layout.batch == 0 || layout.seq_len == 0 {
            return Err(Error::value(
                if tp == 0 {
                    "tp"
                } else if ep == 0 {
                    "ep"
                } else if layout.batch == 0 {
                    "batch"
                } else {
                    "seq_len"
                },
                "must be at least 1",
            ));
        }
        let per_chip = CORES_PER_CHIP / layout.lnc;
        let available = layout.machine.chips.saturating_mul(per_chip);
        if tp > available {
            return Err(Error::value(
                "tp",
                format!(
                    "tp={tp} needs {tp} logical cores; a {} has {available} at LNC={}",
                    layout.machine.name, layout.lnc
                ),
            ));
        }
        if tp > per_chip && !tp.is_multiple_of(per_chip) {
            return Err(Error::value(
                "tp",
                format!(
                    "tp={tp} with {per_chip} logical cores per chip at LNC={}: use at most \
                     {per_chip} or a multiple of {per_chip}",
                    layout.lnc
                ),
            ));
        }
        // Attention heads need not divide: NxD Inference pads them to ceil(heads / tp) per rank
        // (Trinity-Large's 48 heads run at TP=64, contrib modeling code [S38]); the padded
        // heads are computed and cost their share (`Shard::heads`).
        if !(model.kv_heads.is_multiple_of(tp as u64) || (tp as u64).is_multiple_of(model.kv_heads))
        {
            return Err(Error::value(
                "tp",
                format!(
                    "tp={tp} and num_key_value_heads={}: one must divide the other",
                    model.kv_heads
                ),
            ));
        }
        divides("tp", tp, "intermediate_size", model.intermediate)?;
        divides("tp", tp, "vocab_size", model.vocab.next_multiple_of(tp as u64))?;
        if let Some(m) = &model.moe {
            divides("ep", ep, "num_experts", m.experts)?;
            if !tp.is_multiple_of(ep) {
                return Err(Error::value("ep", format!("ep={ep} does not divide tp={tp}")));
            }
            divides("tp", tp / ep, "moe_intermediate_size", m.intermediate)?;
        } else if ep != 1 {
            return Err(Error::value(
                "ep",
                format!("ep={ep} needs an MoE model; {} is dense", model.name),
            ));
        }
        if !matches!(layout.weights, Format::Bf16 | Format::Fp8E4m3) {
            return Err(Error::value(
                "dtype",
                "weights are bf16 or fp8 (e4m3 with per-channel scales)",
            ));
        }
        for (arg, list) in [
            ("prefill_buckets", &layout.prefill_buckets),
            ("decode_buckets", &layout.decode_buckets),
        ] {
            if list.iter().any(|&b| b == 0 || b > layout.seq_len) {
                return Err(Error::value(
                    arg,
                    format!("buckets must be in 1..={} (seq_len)", layout.seq_len),
                ));
            }
        }
        let tpu = tp as u64;
        let shard =
            Shard { heads: model.heads.div_ceil(tpu), kv_heads: (model.kv_heads / tpu).max(1) };
        let first = 0usize;
        let cores: Vec<usize> = (first..first + layout.lnc).collect();
        let weight_bytes = if layout.weights == Format::Fp8E4m3 { 1 } else { 2 };
        Ok(Plan { model, layout, shard, cores, act_bytes: 2, weight_bytes })
    }

    /// The GEMMs of a layer kind, per rank: (name, K, N) with the weights `[K, N]`.
    fn attention_gemms(&self) -> Vec<(&'static str, u64, u64)> {
        let m = self.model;
        let (h, heads) = (m.hidden, self.shard.heads);
        let tpu = self.layout.tp as u64;
        match m.attention {
            AttentionKind::Gqa => vec![
                ("qkv_proj", h, (heads + 2 * self.shard.kv_heads) * m.head_dim),
                ("o_proj", heads * m.head_dim, h),
            ],
            AttentionKind::Mla {
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
            } => {
                let qk = qk_nope_head_dim + qk_rope_head_dim;
                let mut v = Vec::new();
                if q_lora_rank > 0 {
                    v.push(("q_a_proj", h, q_lora_rank.div_ceil(tpu)));
                    v.push(("q_b_proj", q_lora_rank, heads * qk));
                } else {
                    v.push(("q_proj", h, heads * qk));
                }
                v.push(("kv_a_proj", h, (kv_lora_rank + qk_rope_head_dim).div_ceil(tpu)));
                v.push(("kv_b_proj", kv_lora_rank, heads * (qk_nope_head_dim + v_head_dim)));
                v.push(("o_proj", heads * v_head_dim, h));
                v
            }
        }
    }

    /// Weights of one rank, bytes.
    pub(super) fn rank_weight_bytes(&self) -> Result<u64> {
        let m = self.model;
        let tpu = self.layout.tp as u64;
        let attn: u64 = add(&self
            .attention_gemms()
            .iter()
            .map(|&(_, k, n)| mul(&[k, n]))
            .collect::<Result<Vec<_>>>()?)?;
        let dense_mlp = mul(&[3, m.hidden, m.intermediate / tpu])?;
        let moe_mlp = match &m.moe {
            None => 0,
            Some(e) => {
                let per = mul(&[3, m.hidden, e.intermediate / (tpu / self.layout.ep as u64)])?;
                add(&[
                    mul(&[per, e.experts / self.layout.ep as u64])?,
                    mul(&[3, m.hidden, e.intermediate, e.shared_experts])? / tpu,
                    mul(&[m.hidden, e.experts])?,
                ])?
            }
        };
        let moe_layers = m.moe_layers();
        let layers = add(&[
            mul(&[m.layers, attn])?,
            mul(&[m.layers - moe_layers, dense_mlp])?,
            mul(&[moe_layers, moe_mlp])?,
        ])?;
        let vocab_shard = m.vocab.div_ceil(tpu);
        let embed = mul(&[vocab_shard, m.hidden, if m.tied_embeddings { 1 } else { 2 }])?;
        mul(&[add(&[layers, embed])?, self.weight_bytes])
    }

    /// The memory plan, and `CapacityError` naming the largest item if it does not fit.
    fn memory(&self, max_tokens: u64) -> Result<MemoryPlan> {
        let m = self.model;
        let l = self.layout;
        let weights = self.rank_weight_bytes()?;
        let kv_per_token = match m.attention {
            AttentionKind::Gqa => 2 * self.shard.kv_heads * m.head_dim,
            AttentionKind::Mla { .. } => m.kv_elements_per_token(),
        };
        let kv = mul(&[l.batch, l.seq_len, m.layers, kv_per_token, self.act_bytes])?;
        // Activations of the largest step: the hidden state, the rank's MLP intermediate and
        // the residual, for every token of the largest context-encoding bucket of one
        // sequence (context encoding runs one sequence at a time, NxD Inference's default
        // ctx_batch_size): what a layer keeps live at once. A guess at the compiler's buffers.
        let inter = (m.intermediate / l.tp as u64).max(1);
        let acts =
            mul(&[max_tokens, add(&[mul(&[2, m.hidden])?, mul(&[2, inter])?])?, self.act_bytes])?;
        let items = [("weights", weights), ("kv_cache", kv), ("activations", acts)];
        MemoryPlan::fit(&items, l.lnc, (CORES_PER_CHIP / l.lnc).min(l.tp), || {
            format!("{} at tp={}, batch={}, seq_len={}", m.name, l.tp, l.batch, l.seq_len)
        })
    }

    pub(super) fn gemm(
        &self, m: u64, k: u64, n: u64, format: Format,
    ) -> Result<(f64, f64, f64, String)> {
        let r = self.estimate(m, k, n, format)?;
        let hbm = r.details.iter().find(|d| d.0 == "hbm_bytes").map_or(0.0, |d| d.1);
        Ok((r.seconds, hbm, r.flops, r.bound.to_string()))
    }

    /// The project's GEMM estimate of `[m, k] x [k, n]` in `format` on this rank's physical
    /// cores (split over them when the rank is a logical core).
    fn estimate(&self, m: u64, k: u64, n: u64, format: Format) -> Result<crate::perf::Report> {
        let req = EstimateRequest {
            m,
            k,
            n,
            format,
            perf_mode: PerfMode::None,
            sparsity: None,
            throttle: true,
            trace: false,
            cores: (self.cores.len() > 1).then(|| self.cores.clone()),
        };
        estimate_gemm(&req)
    }

    /// The rmsnorm kernel ([`kernels::rmsnorm_run`]) over `rows` rows of the model's hidden
    /// size on this rank: 128-row tiles (the last one shorter) dealt round-robin to the logical
    /// core's physical cores, each tile its steady-state time, plus the kernel's fixed part
    /// once.
    pub(super) fn norm_seconds(&self, rows: u64) -> Result<f64> {
        let hidden = to_usize("hidden_size", self.model.hidden)?;
        let tile = Q_TILE as u64;
        let (full, rem) = (rows / tile, rows % tile);
        let big = if full > 0 { Some(kernels::rmsnorm_times(Q_TILE, hidden)?) } else { None };
        let small =
            if rem > 0 { Some(kernels::rmsnorm_times(rem as usize, hidden)?) } else { None };
        let lnc = self.layout.lnc as u64;
        let mut slowest = 0f64;
        for core in 0..lnc.min(full + u64::from(rem > 0)) {
            // Full tiles core, core + lnc, ...; the short tile is tile `full`.
            let mine = (full + lnc - 1 - core) / lnc;
            let mut s = big.map_or(0.0, |t| mine as f64 * t.per_tile_s);
            if let Some(t) = small.filter(|_| full % lnc == core) {
                s += t.per_tile_s;
            }
            slowest = slowest.max(s);
        }
        let fixed = big.or(small).map_or(0.0, |t| t.fixed_s);
        Ok(fixed + slowest)
    }

    /// The attention kernel's time ([`kernels::attention_run`]) for one layer of this rank:
    /// `heads` query heads of `tokens` new tokens per sequence against `context` positions
    /// (the causal mask and the sliding window skip whole key tiles): its seconds and FLOPs.
    fn attention_seconds(&self, tokens: u64, context: u64, prefill: bool) -> Result<(f64, f64)> {
        let m = self.model;
        let l = self.layout;
        let window = m.sliding_window.unwrap_or(u64::MAX);
        let kv_len = context.min(window);
        let lnc = l.lnc as u64;
        let (tile, kv_tile) = (Q_TILE as u64, KV_TILE as u64);
        if prefill {
            let (qk, vd) = match m.attention {
                AttentionKind::Gqa => (m.head_dim, m.head_dim),
                AttentionKind::Mla { qk_nope_head_dim, qk_rope_head_dim, v_head_dim, .. } => {
                    (qk_nope_head_dim + qk_rope_head_dim, v_head_dim)
                }
            };
            let shape = AttentionShape {
                q_rows: to_usize("tokens", tokens.min(tile))?,
                d_qk: to_usize("head_dim", qk)?,
                d_v: to_usize("v_head_dim", vd)?,
                shared_kv: false,
            };
            let t = kernels::attention_times(&shape)?;
            let heads = mul(&[l.batch, self.shard.heads])?;
            let q_tiles = tokens.div_ceil(tile);
            let blocks = causal_blocks(q_tiles, kv_len, tile, kv_tile)?;
            let (q, n) = (mul(&[heads, q_tiles])?, mul(&[heads, blocks])?);
            // The query tiles of all heads are spread evenly over the physical cores.
            let s = t.fixed_s + (q as f64 * t.per_q_tile_s + n as f64 * t.per_block_s) / lnc as f64;
            let flops = 2.0 * n as f64 * (tile * kv_tile * (qk + vd)) as f64;
            Ok((s, flops))
        } else {
            // One token per sequence: the query heads that share a key/value head form one
            // query tile (MLA: every head, against the compressed latent cache).
            let (d_qk, d_v, kv_heads) = match m.attention {
                AttentionKind::Gqa => (m.head_dim, m.head_dim, self.shard.kv_heads),
                AttentionKind::Mla { kv_lora_rank, qk_rope_head_dim, .. } => {
                    (kv_lora_rank + qk_rope_head_dim, kv_lora_rank, 1)
                }
            };
            let group = self.shard.heads.div_ceil(kv_heads);
            // MLA reads its latent cache once: the values are its first `kv_lora_rank` columns.
            let shape = AttentionShape {
                q_rows: to_usize("heads", group.min(tile))?,
                d_qk: to_usize("head_dim", d_qk)?,
                d_v: to_usize("v_head_dim", d_v)?,
                shared_kv: matches!(m.attention, AttentionKind::Mla { .. }),
            };
            let t = kernels::attention_tkg_times(&shape)?;
            let q = mul(&[l.batch, kv_heads, group.div_ceil(tile)])?;
            // Query tiles are dealt to the physical cores; with fewer tiles than cores each
            // tile's cache is split between them (NxD's sequence sharding; the exchange of
            // their partial results is not timed). A core's keys are whole 128-key chunks; a
            // short last block costs its share of a block (the blocks are DMA-bound).
            let split = lnc / q.min(lnc);
            let chunks = kv_len.div_ceil(tile).div_ceil(split);
            let per_block = (kernels::tkg_block_keys(shape.q_rows) / Q_TILE) as f64;
            let blocks = chunks as f64 / per_block;
            let per_core = q.div_ceil(lnc) as f64;
            let s = t.fixed_s + per_core * (t.per_q_tile_s + blocks * t.per_block_s);
            let keys = mul(&[q, kv_len.div_ceil(tile), tile])? as f64;
            let flops = 2.0 * keys * (group.min(tile) * (d_qk + d_v)) as f64;
            Ok((s, flops))
        }
    }

    /// Reading (or writing) `bytes` of HBM on this rank through the DMA model: the logical
    /// core's physical cores each move their share at once.
    pub(super) fn hbm_stream(&self, bytes: u64) -> Result<f64> {
        let per_core = bytes.div_ceil(self.layout.lnc as u64).max(1);
        let plan = DmaPlan {
            bytes: per_core,
            wire_bytes: per_core,
            partitions: SBUF_PARTITIONS as u64,
            src: Place::Hbm,
            dst: Place::Sbuf,
        };
        Ok(dma_time(&plan)?.seconds)
    }

    fn launch(&self) -> Launch {
        if self.layout.naive {
            Launch::Standalone
        } else {
            Launch::InGraph
        }
    }

    /// A collective over the tp ranks of `bytes` (nccom-test's size).
    fn collective(&self, c: Collective, bytes: u64) -> Result<(f64, f64, String)> {
        let tp = self.layout.tp;
        let elem = 2u64;
        let bytes = bytes.next_multiple_of(elem * tp as u64);
        let row =
            ranks_estimate(c, tp, self.layout.lnc, bytes, elem, Algorithm::Auto, self.launch())?;
        let steps: f64 = row.phases.iter().map(|p| f64::from(p.reduce_steps)).sum();
        Ok((row.seconds, steps, row.algorithm))
    }
}

/// Builds the step's ops.
pub(super) struct Step<'a> {
    pub(super) plan: &'a Plan<'a>,
    pub(super) ops: Vec<OpTime>,
    pub(super) parts: Parts,
    pub(super) fixed: f64,
}

impl Step<'_> {
    /// A norm: `bytes` of activations streamed through HBM in `seconds`, memory-bound.
    fn norm(&mut self, name: &str, scope: &'static str, count: u64, seconds: f64, bytes: u64) {
        let bound = "memory".to_string();
        self.push(name, scope, "norm", count, seconds, bytes as f64, 0.0, bound);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn push(
        &mut self, name: impl Into<String>, scope: &'static str, kind: &'static str, count: u64,
        seconds: f64, hbm: f64, flops: f64, bound: String,
    ) {
        let fixed = if kind == "collective" || kind == "serving" { 0.0 } else { self.fixed };
        if kind != "collective" && kind != "serving" {
            self.parts.fixed_ops += count as f64;
        }
        self.ops.push(OpTime {
            name: name.into(),
            scope,
            kind,
            count,
            seconds,
            fixed_s: fixed,
            hbm_bytes: hbm,
            flops,
            bound,
        });
    }

    fn collective(
        &mut self, name: &str, scope: &'static str, count: u64, c: Collective, bytes: u64,
    ) -> Result<()> {
        if self.plan.layout.tp <= 1 {
            return Ok(());
        }
        let (s, steps, alg) = self.plan.collective(c, bytes)?;
        if c.reduces() {
            self.parts.reduce_ops += count as f64;
            self.parts.reduce_steps += count as f64 * steps;
        }
        if scope != "step" {
            self.parts.layer_collectives_s += count as f64 * s;
        }
        self.push(name, scope, "collective", count, s, 0.0, 0.0, alg);
        Ok(())
    }

    /// A GEMM of `m x k` by `k x n` with weights in `weights` ([`Plan::gemm`]).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self, name: &str, scope: &'static str, count: u64, m: u64, k: u64, n: u64,
        weights: Format,
    ) -> Result<()> {
        let (s, hbm, fl, b) = self.plan.gemm(m, k, n, weights)?;
        self.push(name, scope, "gemm", count, s, hbm, fl, b);
        Ok(())
    }

    /// The reduction of a row-parallel GEMM's partial sums over the tp ranks: a reduce-scatter
    /// under sequence parallelism (`sp`), else an all-reduce.
    fn tp_reduce(&mut self, scope: &'static str, count: u64, sp: bool, act: u64) -> Result<()> {
        if sp {
            self.collective("reduce_scatter", scope, count, Collective::ReduceScatter, act)
        } else {
            self.collective("all_reduce", scope, count, Collective::AllReduce, act)
        }
    }

    /// The ops of one layer kind for `tokens` tokens per sequence attending to `context`.
    pub(super) fn layer(
        &mut self, scope: &'static str, count: u64, tokens: u64, context: u64, prefill: bool,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let p = self.plan;
        let m = p.model;
        let l = p.layout;
        let wf = l.weights;
        let rows = mul(&[l.batch, tokens])?;
        let tpu = l.tp as u64;
        let sp = prefill && l.sequence_parallel && l.tp > 1;
        let norm_rows = if sp { rows.div_ceil(tpu) } else { rows };
        let norm_bytes = mul(&[2, norm_rows, m.hidden, p.act_bytes])?;
        let norm_s = p.norm_seconds(norm_rows)?;
        let act = mul(&[rows, m.hidden, p.act_bytes])?;
        self.norm("input_norm", scope, count, norm_s, norm_bytes);
        if sp {
            self.collective("all_gather", scope, count, Collective::AllGather, act)?;
        }
        let gemms = p.attention_gemms();
        let (o_name, o_k, o_n) = gemms[gemms.len() - 1];
        for &(name, k, n) in &gemms[..gemms.len() - 1] {
            self.gemm(name, scope, count, rows, k, n, wf)?;
        }
        // Attention: the attention kernel, which also reads the KV cache in decode.
        let kv_len = context.min(m.sliding_window.unwrap_or(u64::MAX));
        let kv_bytes = if prefill {
            0.0
        } else {
            let per_token = match m.attention {
                AttentionKind::Gqa => 2 * p.shard.kv_heads * m.head_dim,
                AttentionKind::Mla { .. } => m.kv_elements_per_token(),
            };
            mul(&[l.batch, kv_len, per_token, p.act_bytes])? as f64
        };
        let (s, flops) = p.attention_seconds(tokens, context, prefill)?;
        let bound = if prefill { "compute" } else { "memory" };
        self.push("attention", scope, "attention", count, s, kv_bytes, flops, bound.into());
        self.gemm(o_name, scope, count, rows, o_k, o_n, wf)?;
        self.tp_reduce(scope, count, sp, act)?;
        self.norm("post_attention_norm", scope, count, norm_s, norm_bytes);
        if sp {
            self.collective("all_gather", scope, count, Collective::AllGather, act)?;
        }
        match (&m.moe, scope) {
            (Some(e), "moe") => {
                self.gemm("router", scope, count, rows, m.hidden, e.experts, Format::Bf16)?;
                let ep = l.ep as u64;
                let local = e.experts / ep;
                let shard = e.intermediate / (tpu / ep);
                if prefill {
                    self.moe_blocks(scope, count, rows, local, e.experts_per_token, shard)?;
                } else {
                    self.moe_touched(scope, count, rows, local, e, shard)?;
                }
                if e.shared_experts > 0 {
                    let si = mul(&[e.intermediate, e.shared_experts])? / tpu;
                    self.gemm("shared_gate_up", scope, count, rows, m.hidden, 2 * si.max(1), wf)?;
                    self.gemm("shared_down", scope, count, rows, si.max(1), m.hidden, wf)?;
                }
            }
            _ => {
                let i = m.intermediate / tpu;
                self.gemm("gate_up_proj", scope, count, rows, m.hidden, 2 * i, wf)?;
                self.gemm("down_proj", scope, count, rows, i, m.hidden, wf)?;
            }
        }
        self.tp_reduce(scope, count, sp, act)?;
        Ok(())
    }

    /// Token generation's routed experts: the experts the step's tokens reach (the expected
    /// number of distinct ones for uniform routing), each a GEMM of its share of the tokens.
    fn moe_touched(
        &mut self, scope: &'static str, count: u64, rows: u64, local: u64, e: &super::model::Moe,
        shard: u64,
    ) -> Result<()> {
        let p = self.plan;
        let (m, wf) = (p.model, p.layout.weights);
        let miss = (1.0 - e.experts_per_token as f64 / e.experts as f64).powf(rows as f64);
        let touched = ((local as f64) * (1.0 - miss)).ceil().max(1.0) as u64;
        let routed = mul(&[rows, e.experts_per_token])?;
        let per_expert = routed.div_ceil(e.experts).max(1);
        let (s1, h1, f1, b1) = p.gemm(per_expert, m.hidden, 2 * shard, wf)?;
        let (s2, h2, f2, _) = p.gemm(per_expert, shard, m.hidden, wf)?;
        let t = touched as f64;
        self.push(
            format!("experts_gate_up (x{touched})"),
            scope,
            "gemm",
            count,
            s1 * t,
            h1 * t,
            f1 * t,
            b1.clone(),
        );
        self.push(
            format!("experts_down (x{touched})"),
            scope,
            "gemm",
            count,
            s2 * t,
            h2 * t,
            f2 * t,
            b1,
        );
        Ok(())
    }

    /// Context encoding's routed experts as NxD's blockwise matmul runs them (`[S39]`): the
    /// worst-case number of blocks of [`WORKLOAD_MOE_BLOCK_TOKENS`] token rows, whatever the
    /// routing, each one expert's: its token rows gathered, the gate/up and down GEMMs with that
    /// expert's weights read for the block, and the rows added back (float32), every one an op
    /// of the step with its fixed cost.
    fn moe_blocks(
        &mut self, scope: &'static str, count: u64, rows: u64, local: u64, top_k: u64, shard: u64,
    ) -> Result<()> {
        let p = self.plan;
        let (m, wf) = (p.model, p.layout.weights);
        let b = WORKLOAD_MOE_BLOCK_TOKENS as u64;
        let routed = mul(&[rows, top_k])?;
        let spare = local - 1;
        let blocks = (routed.saturating_sub(spare).div_ceil(b) + spare).clamp(1, routed.max(1));
        let n = mul(&[count, blocks])?;
        let gather = mul(&[b, m.hidden, p.act_bytes])?;
        let g_s = p.hbm_stream(gather)?;
        self.push("expert_block_gather", scope, "dma", n, g_s, gather as f64, 0.0, "memory".into());
        self.gemm("expert_block_gate_up", scope, n, b, m.hidden, 2 * shard, wf)?;
        self.gemm("expert_block_down", scope, n, b, shard, m.hidden, wf)?;
        let add = mul(&[2, b, m.hidden, 4])?;
        let a_s = p.hbm_stream(add)?;
        self.push("expert_block_add", scope, "dma", n, a_s, add as f64, 0.0, "memory".into());
        Ok(())
    }
}

/// `x` as a `usize`, or `ValueError` naming `arg`.
fn to_usize(arg: &str, x: u64) -> Result<usize> {
    usize::try_from(x).map_err(|_| Error::value(arg, format!("{x} is too large")))
}

/// Key/value tiles of `kv_tile` keys that `q_tiles` causal query tiles of `tile` rows visit,
/// each query tile the tiles up to its last query (at most those covering a window of
/// `window` keys): `sum_i min(floor(i * tile / kv_tile) + 1, ceil(window / kv_tile) + 1)`,
/// in closed form.
pub(super) fn causal_blocks(q_tiles: u64, window: u64, tile: u64, kv_tile: u64) -> Result<u64> {
    let per = kv_tile / tile; // query tiles per key tile (4)
    let cap = window.div_ceil(kv_tile).saturating_add(1);
    let (groups, rest) = (q_tiles / per, q_tiles % per);
    // Groups g = 0 .. groups-1 of `per` query tiles visit min(g + 1, cap) key tiles each.
    let tri = |n: u64| -> Result<u64> { Ok(mul(&[n, n + 1])? / 2) };
    let full =
        if groups <= cap { tri(groups)? } else { add(&[tri(cap)?, mul(&[groups - cap, cap])?])? };
    add(&[mul(&[per, full])?, mul(&[rest, (groups + 1).min(cap)])?])
}

/// Estimates one step: `tokens` new tokens per sequence attending to `context` positions
/// (prefill: `tokens = context = bucket`; decode: one token, `context` = the bucket).
fn step(model: &Model, layout: &Layout, prefill: bool, asked: u64) -> Result<StepReport> {
    let plan = Plan::new(model, layout)?;
    let (bucket, tokens) = if prefill {
        if asked == 0 {
            return Err(Error::value("tokens", "must be at least 1"));
        }
        let b = bucket_for(asked, &layout.prefill_buckets, layout.seq_len, "tokens")?;
        (b, b)
    } else {
        let next = asked.checked_add(1).ok_or_else(|| Error::value("context", "too large"))?;
        let b = bucket_for(next, &layout.decode_buckets, layout.seq_len, "context")?;
        (b, 1)
    };
    let max_prefill = bucket_for(1, &layout.prefill_buckets, layout.seq_len, "tokens")
        .map(|_| max_prefill(layout))?;
    let memory = plan.memory(max_prefill)?;
    let mut st = Step {
        plan: &plan,
        ops: Vec::new(),
        parts: Parts::default(),
        fixed: if layout.naive { 0.0 } else { WORKLOAD_OP_FIXED_S },
    };
    let moe_layers = model.moe_layers();
    st.layer("dense", model.layers - moe_layers, tokens, bucket, prefill)?;
    st.layer("moe", moe_layers, tokens, bucket, prefill)?;
    // The last position's logits (NxD Inference computes only those), the final norm, and
    // on-device sampling's gather of each rank's best candidates.
    let rows = layout.batch;
    let norm_bytes = mul(&[2, rows, model.hidden, plan.act_bytes])?;
    let norm_s = plan.norm_seconds(rows)?;
    st.norm("final_norm", "step", 1, norm_s, norm_bytes);
    let vocab_shard = model.vocab.div_ceil(layout.tp as u64);
    st.gemm("lm_head", "step", 1, rows, model.hidden, vocab_shard, layout.weights)?;
    let cand = mul(&[rows, 8, layout.tp as u64])?;
    st.collective("sampling_all_gather", "step", 1, Collective::AllGather, cand)?;
    if layout.serving == Serving::Vllm && !layout.naive {
        let s =
            if prefill { SERVING_VLLM_REQUEST_OVERHEAD_S } else { SERVING_VLLM_TOKEN_OVERHEAD_S };
        st.push("vllm_serving", "step", "serving", 1, s, 0.0, 0.0, "host".into());
    }
    let seconds: f64 = st.ops.iter().map(OpTime::total_s).sum();
    let mut parts = st.parts;
    let in_graph = !layout.naive;
    let reduce_fixed = if in_graph {
        parts.reduce_ops * Launch::InGraph.op_fixed_s(Collective::AllReduce)
            + parts.reduce_steps * Launch::InGraph.reduce_step_s()
    } else {
        0.0
    };
    parts.other_s = seconds - reduce_fixed - parts.fixed_ops * st.fixed;
    let description = format!(
        "{} {} on {} tp={} ep={} lnc={} batch={} {} weights, bucket {}",
        model.name,
        if prefill { "prefill" } else { "decode" },
        layout.machine.name,
        layout.tp,
        layout.ep,
        layout.lnc,
        layout.batch,
        width_name(layout.weights),
        bucket
    );
    Ok(StepReport {
        phase: if prefill { "prefill" } else { "decode" },
        model: model.name.clone(),
        tokens: asked,
        bucket,
        seconds,
        ops: st.ops,
        memory,
        parts,
        uncertainty: if prefill {
            Uncertainty::WORKLOAD_PREFILL
        } else {
            Uncertainty::WORKLOAD_DECODE
        },
        description,
    })
}

/// The time to first token of a prompt of `tokens` tokens (per sequence of the batch): one
/// context-encoding step in the smallest compiled bucket that holds it.
pub fn prefill(model: &Model, layout: &Layout, tokens: u64) -> Result<StepReport> {
    step(model, layout, true, tokens)
}

/// The time per output token with `context` tokens already in the KV cache: one
/// token-generation step in the smallest bucket holding `context + 1`.
pub fn decode(model: &Model, layout: &Layout, context: u64) -> Result<StepReport> {
    step(model, layout, false, context)
}

/// `"bf16"` or `"fp8"`: how a description names the weights' (or training's) format.
pub(super) fn width_name(f: Format) -> &'static str {
    if f == Format::Bf16 {
        "bf16"
    } else {
        "fp8"
    }
}

/// Tokens of the largest context-encoding bucket (`seq_len` without buckets).
fn max_prefill(layout: &Layout) -> u64 {
    if layout.prefill_buckets.is_empty() {
        layout.seq_len
    } else {
        layout.prefill_buckets.iter().copied().max().unwrap_or(layout.seq_len)
    }
}

/// The memory plan alone (`CapacityError` if it does not fit).
pub fn memory(model: &Model, layout: &Layout) -> Result<MemoryPlan> {
    let plan = Plan::new(model, layout)?;
    plan.memory(max_prefill(layout))
}
