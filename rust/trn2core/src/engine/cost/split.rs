//! Timing of a GEMM split over several physical cores: a Logical NeuronCore (LNC=2 or 4) or a
//! whole chip (\[S6\]; contract section 5).
//!
//! # Split
//!
//! The output's 128-row and 512-column tiles are dealt out in blocks: the cores form a
//! `pm x pn x pk` grid (M blocks x N blocks x K blocks, `pm * pn * pk` = the core count), every
//! core computes one block with the single-core schedule of [`estimate_gemm`], and the cores run
//! in parallel. Every factorisation of the core count that gives each core at least one tile is
//! costed and the fastest is kept (within 0.1 % counts as a tie; ties: no K split, then
//! splitting M before N). A GEMM with too few tiles for any factorisation (a 128 x 128 x 128
//! GEMM on two cores) runs on the most cores that each get a tile, the first ones of the
//! logical core; the others idle (detail `cores_used`; the peak and utilisation still count
//! every core).
//!
//! Splitting K leaves each core of a K group with a partial sum of the whole output block; the
//! partials are combined on the group's first core: each other partial is moved there by DMA
//! (one fixed cost plus its bytes at the core's DMA rate) and added by the Vector engine
//! (`tensor_tensor` on fp32 in SBUF: `max(MIN_II, 2N)` cycles per 128-partition tile, \[S10\]),
//! one partial after another. On hardware that combination rounds once more per partial; the
//! emulator keeps the contract's single-core order of additions, so the *bits* never depend on
//! the split (contract section 2) and only the *time* does.
//!
//! # Memory
//!
//! Each core streams its operands from HBM through its own 16 DMA engines. Cores that share an
//! HBM stack share its bandwidth evenly: an LNC=2 core's two halves get half a stack each, a core
//! working alone gets the whole stack (as in the single-core model).

use super::plan::{estimate_gemm, estimate_gemm_walk, GemmPlan};
use crate::dma::cost::{dma_efficiency, engines_bytes_per_s};

use crate::perf::{Event, Report};
use crate::spec::{
    CORES_PER_CHIP, CORES_PER_HBM_STACK, DMA_FIXED_COST_S, DMA_FULL_RATE_PARTITION_BYTES,
    HBM_STACK_BYTES_PER_S, MATMUL_MOVING_FREE_MAX, MATMUL_STATIONARY_FREE_MAX, MIN_II_CYCLES,
    SBUF_PARTITIONS, VECTOR_CLOCK_HZ,
};
use crate::{Error, Result};

/// Trace track of each physical core's tensor engine.
const CORE_TRACKS: [&str; CORES_PER_CHIP] = [
    "PE core 0",
    "PE core 1",
    "PE core 2",
    "PE core 3",
    "PE core 4",
    "PE core 5",
    "PE core 6",
    "PE core 7",
];

/// How a GEMM is dealt out over cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Blocks along M (the output's 128-row tiles).
    pub pm: u64,
    /// Blocks along N (the output's 512-column tiles).
    pub pn: u64,
    /// Blocks along K, whose partial sums are combined on the group's first core.
    pub pk: u64,
}

fn detail(r: &Report, name: &str) -> f64 {
    r.details.iter().find(|d| d.0 == name).map_or(0.0, |d| d.1)
}

/// Seconds to combine `pk` partial sums of an `m x n` fp32 block on one core.
pub fn combine_seconds(m: u64, n: u64, pk: u64) -> f64 {
    if pk <= 1 {
        return 0.0;
    }
    // In f64: a block's byte count of dimensions near 2^64 must not wrap (it only sizes a time).
    let bytes = m as f64 * n as f64 * 4.0;
    let dma_rate = engines_bytes_per_s() * dma_efficiency(DMA_FULL_RATE_PARTITION_BYTES as f64);
    let tiles = m.div_ceil(SBUF_PARTITIONS as u64) as f64;
    let add_cycles = tiles * (MIN_II_CYCLES as f64).max(2.0 * n as f64);
    let one = DMA_FIXED_COST_S + bytes / dma_rate + add_cycles / VECTOR_CLOCK_HZ;
    (pk - 1) as f64 * one
}

/// The fastest `pm x pn x pk` split of `plan` over exactly the cores `cores` that gives each
/// core at least one tile (`tiles`: M, N and K tiles; `sizes`: their sizes), with its total
/// seconds, the block's report, memory and combination seconds, and the per-core HBM rate.
#[allow(clippy::type_complexity)]
fn best_split(
    plan: &GemmPlan, cores: &[usize], (mt, nt, kt): (u64, u64, u64),
    (sf, mf, kpi): (u64, u64, u64), estimate: Estimator,
) -> Result<Option<(f64, Split, Report, f64, f64, f64)>> {
    let nc = cores.len() as u64;
    // HBM bandwidth of each core: its stack shared by the split's cores on it.
    let on_stack = |c: usize| {
        cores.iter().filter(|&&o| o / CORES_PER_HBM_STACK == c / CORES_PER_HBM_STACK).count()
    };
    let dma_rate = engines_bytes_per_s() * dma_efficiency(DMA_FULL_RATE_PARTITION_BYTES as f64);
    let worst_share = cores
        .iter()
        .map(|&c| HBM_STACK_BYTES_PER_S / on_stack(c) as f64)
        .fold(f64::INFINITY, f64::min);
    let rate = dma_rate.min(worst_share);
    let mut best: Option<(f64, Split, Report, f64, f64, f64)> = None;
    for pk in (1..=nc).filter(|d| nc.is_multiple_of(*d)) {
        for pn in (1..=nc / pk).filter(|d| (nc / pk).is_multiple_of(*d)) {
            let pm = nc / pk / pn;
            if pm > mt || pn > nt || pk > kt {
                continue;
            }
            let mut sub = plan.clone();
            // Saturating: tiles times tile size can pass 2^64 for dimensions near it (a block
            // is never larger than the whole, so the min gives the right size).
            sub.m = mt.div_ceil(pm).saturating_mul(sf).min(plan.m);
            sub.n = nt.div_ceil(pn).saturating_mul(mf).min(plan.n);
            sub.k = kt.div_ceil(pk).saturating_mul(kpi).min(plan.k);
            sub.trace = false;
            let r = estimate(&sub)?;
            let prologue = detail(&r, "dma_prologue_s");
            let compute = detail(&r, "compute_s");
            let memory = detail(&r, "hbm_bytes") / rate;
            let core_s = prologue + compute.max(memory);
            let combine = combine_seconds(sub.m, sub.n, pk);
            let total = core_s + combine;
            let better = match &best {
                None => true,
                // Within 0.1 % is a tie: keep the earlier (simpler) split.
                Some((t, ..)) => total < *t * (1.0 - 1e-3),
            };
            if better {
                best = Some((total, Split { pm, pn, pk }, r, memory, combine, rate));
            }
        }
    }
    Ok(best)
}

/// How one core's block is costed: [`estimate_gemm`], or the reference walk in tests.
type Estimator = fn(&GemmPlan) -> Result<Report>;

/// Costs `plan` split over the physical cores `cores` (indices 0..8 of one chip, each once).
pub fn estimate_gemm_cores(plan: &GemmPlan, cores: &[usize]) -> Result<Report> {
    split_with(plan, cores, estimate_gemm)
}

/// [`estimate_gemm_cores`] with every block costed by the reference walk
/// ([`estimate_gemm_walk`]), to test the fast evaluation against; not part of the API.
#[doc(hidden)]
pub fn estimate_gemm_cores_walk(plan: &GemmPlan, cores: &[usize]) -> Result<Report> {
    split_with(plan, cores, estimate_gemm_walk)
}

fn split_with(plan: &GemmPlan, cores: &[usize], estimate: Estimator) -> Result<Report> {
    let nc = cores.len() as u64;
    if nc == 0 || cores.iter().any(|&c| c >= CORES_PER_CHIP) {
        return Err(Error::value(
            "core",
            format!("cores {cores:?}: expected 1..=8 distinct physical cores 0..8"),
        ));
    }
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != cores.len() {
        return Err(Error::value("core", format!("cores {cores:?} repeat a core")));
    }
    // The whole GEMM on one core, for the instruction count and the speed-up; first, so a shape
    // whose counters overflow is refused before any split is tried (as on one core).
    let mut whole = plan.clone();
    whole.trace = false;
    let single = estimate(&whole)?;
    let sf = MATMUL_STATIONARY_FREE_MAX as u64;
    let mf = MATMUL_MOVING_FREE_MAX as u64;
    let kpi = plan.k_per_instruction.max(1);
    let (mt, nt, kt) = (plan.m.div_ceil(sf), plan.n.div_ceil(mf), plan.k.div_ceil(kpi));
    // All the cores when the GEMM has tiles enough for one of the factorisations; else the
    // most cores that can each get a tile (the first ones of `cores`), the rest idle. One core
    // always fits (every dimension is at least one tile).
    let mut found = None;
    for used in (1..=nc).rev() {
        found = best_split(plan, &cores[..used as usize], (mt, nt, kt), (sf, mf, kpi), estimate)?;
        if found.is_some() {
            break;
        }
    }
    let (total, split, sub, memory, combine, rate) = found
        .ok_or_else(|| Error::value("core", "internal: no split of the GEMM fits the cores"))?;
    let used = split.pm * split.pn * split.pk;
    let core_s = total - combine;
    let mut rep = Report::new("gemm");
    rep.description = format!(
        "GEMM M={} K={} N={} {}{} perf_mode={} on {} physical cores {:?}: split M x N x K = {} x {} x {}",
        plan.m,
        plan.k,
        plan.n,
        plan.format,
        plan.sparsity
            .map_or(String::new(), |p| format!(" sparse {p} stationary")),
        plan.perf_mode.name(),
        nc,
        cores,
        split.pm,
        split.pn,
        split.pk
    );
    rep.instructions = single.instructions;
    rep.pe_cycles = single.pe_cycles;
    rep.seconds = total;
    rep.cycles = total * crate::spec::PE_CLOCK_HZ;
    rep.flops = single.flops;
    rep.tflops = rep.flops / total / 1e12;
    let pe_seconds = sub.pe_cycles as f64 / crate::spec::PE_CLOCK_HZ;
    rep.pe_tflops = rep.flops / (pe_seconds * used as f64) / 1e12;
    rep.peak_tflops = plan.peak_flops_per_s * nc as f64 / 1e12;
    rep.utilization = (rep.flops / total / (plan.peak_flops_per_s * nc as f64)).min(1.0);
    super::plan::set_bound(&mut rep, plan, memory > detail(&sub, "compute_s"), nc as usize);
    rep.details = vec![
        ("cores", nc as f64),
        ("split_m", split.pm as f64),
        ("split_n", split.pn as f64),
        ("split_k", split.pk as f64),
        ("core_s", core_s),
        ("combine_s", combine),
        ("compute_s", detail(&sub, "compute_s")),
        ("memory_s", memory),
        ("dma_prologue_s", detail(&sub, "dma_prologue_s")),
        ("hbm_bytes", detail(&sub, "hbm_bytes") * used as f64),
        ("hbm_bytes_per_s_per_core", rate),
        ("throttle_s", detail(&sub, "throttle_s")),
        ("single_core_s", single.seconds),
        ("cores_used", used as f64),
    ];
    if plan.trace {
        let core_hbm = detail(&sub, "hbm_bytes");
        for &c in &cores[..used as usize] {
            rep.events.push(
                Event::new(CORE_TRACKS[c], "gemm block", 0.0, core_s)
                    .with("core", c as f64)
                    .with("hbm_bytes", core_hbm)
                    .with("instructions", sub.instructions as f64),
            );
        }
        if combine > 0.0 {
            rep.events.push(
                Event::new(CORE_TRACKS[cores[0]], "combine K partials", core_s, combine)
                    .with("core", cores[0] as f64)
                    .with("partials", used as f64),
            );
        }
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::PerfMode;

    fn plan(m: u64, k: u64, n: u64) -> GemmPlan {
        GemmPlan::new(m, k, n, crate::numerics::Format::Bf16, PerfMode::None).expect("valid")
    }

    #[test]
    fn shapes_near_2_64_are_refused_or_costed_never_wrapped() {
        // Tiles times tile size wrapped past 2^64: the chip's split costed blocks of K = 0 or
        // walked a wrapped plan for ever, where one core refuses the shape at once.
        let huge = u64::MAX;
        for (m, k, n) in
            [(huge, huge, huge), (huge, 128, 512), (128, huge, 512), (1 << 40, 1 << 62, 1 << 40)]
        {
            let p = GemmPlan::new(m, k, n, crate::numerics::Format::Bf16, PerfMode::None);
            let Ok(p) = p else { continue };
            let one = estimate_gemm(&p);
            let chip = estimate_gemm_cores(&p, &[0, 1, 2, 3, 4, 5, 6, 7]);
            assert_eq!(one.is_ok(), chip.is_ok(), "{m} {k} {n}: {one:?} / {chip:?}");
            if let Ok(r) = chip {
                assert!(r.description.contains(&format!("K={k}")), "{}", r.description);
                assert!(r.seconds > 0.0 && r.seconds.is_finite());
            }
        }
    }

    #[test]
    fn two_cores_halve_a_compute_bound_gemm() {
        let p = plan(4096, 4096, 4096);
        let one = estimate_gemm_cores(&p, &[0]).expect("ok");
        let two = estimate_gemm_cores(&p, &[0, 1]).expect("ok");
        let ratio = two.seconds / one.seconds;
        assert!(ratio > 0.49 && ratio < 0.53, "{ratio}");
        assert_eq!(two.instructions, one.instructions);
        assert_eq!(two.details[3], ("split_k", 1.0));
    }

    #[test]
    fn a_single_output_tile_splits_k_and_pays_the_combination() {
        let p = plan(128, 65536, 512);
        let r = estimate_gemm_cores(&p, &[0, 1]).expect("ok");
        let get = |n: &str| r.details.iter().find(|d| d.0 == n).map_or(-1.0, |d| d.1);
        assert_eq!(get("split_k"), 2.0);
        assert!(get("combine_s") > 0.0);
        let one = estimate_gemm_cores(&p, &[0]).expect("ok");
        assert!(r.seconds < one.seconds);
    }

    #[test]
    fn a_gemm_smaller_than_the_cores_uses_the_cores_it_can() {
        // One output tile and one K tile: nothing to split, one core works (was an error).
        let get = |r: &Report, n: &str| r.details.iter().find(|d| d.0 == n).map_or(-1.0, |d| d.1);
        let p = plan(4, 4, 4);
        let one = estimate_gemm_cores(&p, &[0]).expect("ok");
        let two = estimate_gemm_cores(&p, &[0, 1]).expect("ok");
        assert_eq!(get(&two, "cores_used"), 1.0);
        assert_eq!(two.seconds, one.seconds);
        assert_eq!(two.peak_tflops, 2.0 * one.peak_tflops);
        // Three M tiles on eight cores: 3 x 1 x 1 is not a factorisation of 8 or 7..4, so
        // the best of two cores (M split), never an error.
        let p = plan(384, 128, 512);
        let chip = estimate_gemm_cores(&p, &[0, 1, 2, 3, 4, 5, 6, 7]).expect("ok");
        let used = get(&chip, "cores_used");
        assert!((1.0..=3.0).contains(&used), "{used}");
        assert_eq!(get(&chip, "split_m") * get(&chip, "split_n") * get(&chip, "split_k"), used);
        assert!(chip.seconds <= estimate_gemm_cores(&p, &[0]).expect("ok").seconds);
    }
}
