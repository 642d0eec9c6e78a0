//! `estimate_gemm`'s fast evaluation of the GEMM schedule (perf/schedule.rs) against the walk
//! of every instruction (`estimate_gemm_walk`): the reports must be identical, bit for bit, on
//! every shape; and the fast one must cost huge shapes without walking them.

use std::time::Instant;

use proptest::prelude::*;
use trn2core::engine::cost::plan::TRACE_GROUP_LIMIT;
use trn2core::engine::cost::{
    estimate_gemm, estimate_gemm_cores, estimate_gemm_cores_walk, estimate_gemm_walk, GemmPlan,
};
use trn2core::engine::PerfMode;
use trn2core::perf::Report;
use trn2core::sparsity::Pattern;
use trn2core::Error;

/// The operand configurations: (dtype, perf_mode, sparsity).
fn configs() -> Vec<(&'static str, PerfMode, Option<Pattern>)> {
    let mut v = vec![
        ("bf16", PerfMode::None, None),
        ("fp32", PerfMode::None, None),
        ("fp8_e4m3", PerfMode::None, None),
        ("fp8_e5m2", PerfMode::DoubleRow, None),
        ("fp16", PerfMode::None, None),
        ("tf32", PerfMode::None, None),
        ("fp8_e3m4", PerfMode::None, None),
    ];
    for p in Pattern::ALL {
        v.push(("bf16", PerfMode::None, Some(p)));
    }
    v
}

fn plan(
    [m, k, n]: [u64; 3], (dtype, mode, sparsity): (&'static str, PerfMode, Option<Pattern>),
    throttle: bool,
) -> GemmPlan {
    let format = trn2core::Format::parse("dtype", dtype).expect("a format");
    let mut p = GemmPlan::new(m, k, n, format, mode).expect("valid plan");
    if let Some(s) = sparsity {
        p = p.with_sparsity(s).expect("sparse plan");
    }
    p.throttle = throttle;
    p
}

/// Every field, floats compared by their bits (so -0.0 != 0.0 and a NaN would fail).
fn assert_identical(fast: &Report, walk: &Report, what: &str) {
    assert_eq!(fast.description, walk.description, "{what}");
    assert_eq!(fast.instructions, walk.instructions, "{what}");
    assert_eq!(fast.pe_cycles, walk.pe_cycles, "{what}");
    assert_eq!(fast.bound, walk.bound, "{what}");
    let floats = |r: &Report| {
        let mut v = vec![
            ("cycles", r.cycles),
            ("seconds", r.seconds),
            ("flops", r.flops),
            ("tflops", r.tflops),
            ("pe_tflops", r.pe_tflops),
            ("peak_tflops", r.peak_tflops),
            ("utilization", r.utilization),
        ];
        v.extend(r.details.iter().copied());
        v.into_iter().map(|(k, x)| (k, x.to_bits())).collect::<Vec<_>>()
    };
    assert_eq!(floats(fast), floats(walk), "{what}");
    assert_eq!(fast.events, walk.events, "{what}");
    assert_eq!(fast, walk, "{what}");
}

fn check(shape: [u64; 3], cfg: (&'static str, PerfMode, Option<Pattern>), throttle: bool) {
    let p = plan(shape, cfg, throttle);
    let what = format!("{shape:?} {cfg:?} throttle={throttle}");
    let fast = estimate_gemm(&p).expect("fast");
    let walk = estimate_gemm_walk(&p).expect("walk");
    assert_identical(&fast, &walk, &what);
}

/// Edge shapes: single tiles, ragged last row and column tiles, exactly one and just over one
/// group of 8 banks, one K tile (every matmul waits for a bank and evicts), two K tiles (no
/// middle), K just past a tile, tiny M (matmuls of 1 cycle), long thin shapes whose ramp covers
/// many groups or rows.
const EDGE_SHAPES: &[[u64; 3]] = &[
    [1, 1, 1],
    [128, 128, 512],
    [129, 129, 513],
    [127, 255, 511],
    [128, 128, 4096],
    [128, 128, 4097],
    [256, 128, 4096 + 512],
    [1000, 1, 1000],
    [1, 1, 100_000],
    [100_000, 1, 1],
    [1, 100_000, 1],
    [64, 300, 64],
    [200, 300, 100],
    [300, 1000, 700],
    [1024, 512, 2048],
    [4096, 128, 4096],
    [2048, 256, 9000],
    [3000, 129, 3000],
    [8192, 257, 1024],
    [640, 640, 40_000],
    [12_800, 128, 600],
    [5000, 3000, 7000],
    [1, 1_000_000, 512],
    [128, 2_000_000, 1],
];

#[test]
fn fast_equals_walk_on_edge_shapes_for_every_operand_configuration() {
    for &shape in EDGE_SHAPES {
        for cfg in configs() {
            for throttle in [true, false] {
                check(shape, cfg, throttle);
            }
        }
    }
}

/// Short K with a ragged last group: the evictors set the pace, and since 5 ACT evictions take
/// exactly as long as 4 DVE ones the phase between them is neutral; each row's ragged group
/// shifts it, so the row tiles repeat only after hundreds or thousands of rows (Brent's cycle
/// detection over rows, with a cycle over groups inside each row). With K = 1, N = 1300 the
/// rows repeat every 1512 (found at row 3559), N = 2600 every 2916 (at 7011), N = 11111 every
/// 4788 (at 12979), N = 2100 every 72.
#[test]
fn fast_equals_walk_when_the_evictors_phase_drifts_over_many_rows() {
    for (shape, cfg) in [
        ([128 * 8000 + 5, 1, 1300], ("bf16", PerfMode::None, None)),
        ([128 * 10_000, 1, 2600], ("bf16", PerfMode::None, None)),
        ([128 * 20_000, 100, 11_111], ("bf16", PerfMode::None, None)),
        ([128 * 3000, 1, 2100], ("bf16", PerfMode::None, None)),
        ([128 * 3000, 7, 23_813], ("fp8_e4m3", PerfMode::None, None)),
        ([128 * 800, 1, 420_049], ("bf16", PerfMode::None, None)),
        ([128 * 4000 + 77, 153, 14_861], ("fp8_e4m3", PerfMode::DoubleRow, None)),
        ([128 * 2500, 300, 55_769], ("bf16", PerfMode::None, Some(Pattern::ALL[6]))),
    ] {
        for throttle in [true, false] {
            check(shape, cfg, throttle);
        }
    }
}

#[test]
fn fast_equals_walk_on_multi_core_splits() {
    let splits: &[&[usize]] = &[&[0, 1], &[0, 1, 2, 3], &[0, 1, 2, 3, 4, 5, 6, 7], &[2, 5, 7]];
    for &shape in &[[4096, 4096, 4096], [128, 65_536, 512], [300, 1000, 700], [1, 5000, 1]] {
        for cfg in [
            ("bf16", PerfMode::None, None),
            ("fp8_e4m3", PerfMode::DoubleRow, None),
            ("bf16", PerfMode::None, Some(Pattern::ALL[3])),
        ] {
            for cores in splits {
                let p = plan(shape, cfg, true);
                let fast = estimate_gemm_cores(&p, cores).expect("fast");
                let walk = estimate_gemm_cores_walk(&p, cores).expect("walk");
                assert_identical(&fast, &walk, &format!("{shape:?} {cfg:?} on {cores:?}"));
            }
        }
    }
}

#[test]
fn block_traces_equal_the_walks_and_long_ones_are_truncated_with_a_marker() {
    // Above 100000 instructions a trace has one event per group: the fast pass records the
    // walk's events exactly.
    let mut p = plan([16384, 8192, 8192], configs()[0], true);
    p.trace = true;
    assert!(p.instructions() > 100_000);
    let fast = estimate_gemm(&p).expect("fast");
    let walk = estimate_gemm_walk(&p).expect("walk");
    assert_identical(&fast, &walk, "traced 16384 x 8192 x 8192");
    assert!(fast.events.iter().any(|e| e.name == "matmul block"));
    // At most 100000 instructions: one event per matmul, from the walk.
    let mut small = plan([1024, 1024, 1024], configs()[0], true);
    small.trace = true;
    let r = estimate_gemm(&small).expect("fast");
    assert_eq!(r.events.iter().filter(|e| e.name == "matmul").count(), 8 * 2 * 8);
    // More groups than the trace records: the numbers are the untraced ones, the trace stops
    // after TRACE_GROUP_LIMIT groups and a marker covers the rest.
    let groups = TRACE_GROUP_LIMIT + 1000;
    let mut long = plan([128 * groups, 256, 512], configs()[0], true);
    long.trace = true;
    let traced = estimate_gemm(&long).expect("traced");
    long.trace = false;
    let untraced = estimate_gemm(&long).expect("untraced");
    assert_eq!(traced.seconds.to_bits(), untraced.seconds.to_bits());
    assert_eq!(traced.details, untraced.details);
    let blocks = traced.events.iter().filter(|e| e.name == "matmul block").count() as u64;
    assert_eq!(blocks, TRACE_GROUP_LIMIT);
    let marker =
        traced.events.iter().find(|e| e.name.starts_with("trace truncated")).expect("a marker");
    let compute = untraced.details[1];
    assert_eq!(compute.0, "compute_s");
    let prologue = untraced.details[3].1;
    assert!((marker.start_s + marker.dur_s - (prologue + compute.1)).abs() < 1e-12);
    assert!(marker.dur_s > 0.0 && marker.start_s > prologue);
}

#[test]
fn huge_shapes_cost_in_milliseconds_with_exact_pe_cycles() {
    for (shape, cfg) in [
        ([1_000_000, 1_000_000, 1_000_000], configs()[0]),
        ([10_000_000, 100_000, 10_000_000], configs()[0]),
        ([1 << 40, 1 << 12, 1 << 12], configs()[0]),
        ([1_000_000, 1_000_000, 1_000_000], configs()[1]),
        ([1_000_000, 1_000_000, 1_000_000], configs()[3]),
        ([1_000_000, 1_000_000, 1_000_000], configs()[9]),
    ] {
        for throttle in [true, false] {
            let p = plan(shape, cfg, throttle);
            let t = Instant::now();
            let r = estimate_gemm(&p).expect("costed");
            let dt = t.elapsed().as_secs_f64();
            assert!(dt < 1.0, "{shape:?} {cfg:?}: {dt} s");
            // Full tiles cost max(min(64, 128), 512) = 512 cycles (x4 in fp32); the ragged
            // last row and column tiles less.
            let sf = 128u64;
            let mf = 512u64;
            let (mt, nt) = (shape[0].div_ceil(sf), shape[2].div_ceil(mf));
            let kt = shape[1].div_ceil(p.k_per_instruction);
            let cyc = |m: u64, n: u64| {
                trn2core::engine::cost::instr::matmul_cycles(m as usize, n as usize, p.fp32)
            };
            let (lm, ln) = (shape[0] - (mt - 1) * sf, shape[2] - (nt - 1) * mf);
            let row = |m: u64| (nt - 1) * cyc(m, mf) + cyc(m, ln);
            assert_eq!(r.pe_cycles, kt * ((mt - 1) * row(sf) + row(lm)), "{shape:?}");
            assert_eq!(r.instructions, mt * nt * kt);
            assert!(r.utilization > 0.0 && r.utilization <= 1.0, "{}", r.utilization);
            let get = |n: &str| r.details.iter().find(|d| d.0 == n).map(|d| d.1);
            assert_eq!(get("psum_wait_s"), Some(0.0), "{shape:?}");
            if !throttle {
                assert_eq!(get("throttle_s"), Some(0.0));
            } else {
                // One ramp at the start: half the ramp's 3 us at half rate.
                assert_eq!(get("throttle_s"), Some(0.75e-6), "{shape:?} {cfg:?}");
            }
        }
    }
}

#[test]
fn a_single_column_of_long_groups_has_an_exact_closed_form() {
    // N = 512: one bank per group, K long enough that no eviction is ever waited for; the
    // evictors alternate ACT, DVE, ... so with an odd number of groups the last eviction is
    // ACT's: (512 + 60) ACT cycles = 1144 PE cycles after the last matmul.
    let p = plan([(2 * 1_000_003 + 1) * 128, 1_000_000, 512], configs()[0], false);
    let r = estimate_gemm(&p).expect("costed");
    let groups = 2 * 1_000_003 + 1u64;
    let kt = 1_000_000u64.div_ceil(128);
    assert_eq!(r.pe_cycles, groups * kt * 512);
    let compute_ticks = 2 * (32 + r.pe_cycles + 1144);
    assert_eq!(r.details[1], ("compute_s", compute_ticks as f64 / 4.8e9));
}

#[test]
fn shapes_beyond_the_counters_are_refused() {
    for (shape, says) in [
        ([1 << 40, 1 << 20, 1 << 20], "the cost model's clock holds at most 2**62 PE cycles"),
        ([1 << 36, 1 << 15, 1 << 20], "the DMA model counts at most 2**63 bytes"),
        ([u64::MAX, u64::MAX, 1], "has too many tiles to cost"),
        ([1 << 62, 1 << 62, 1 << 62], "has too many tiles to cost"),
    ] {
        let p = plan(shape, configs()[0], true);
        match estimate_gemm(&p) {
            Err(Error::Capacity { arg, message, .. }) => {
                assert_eq!(arg, "shape");
                assert!(message.contains(says), "{message}");
                assert!(message.contains(&format!("M={}", shape[0])), "{message}");
            }
            other => panic!("{shape:?}: {other:?}"),
        }
    }
}

/// A GEMM shape `[M, K, N]`, a configuration number (of `configs()`) and the throttle.
type Case = ([u64; 3], usize, bool);

/// Cases whose M, K and N each come from `1..small` or `1..large` (half the time each), with
/// every configuration, throttle on and off.
fn cases(small: [u64; 3], large: [u64; 3]) -> impl Strategy<Value = Case> {
    let dim = |i: usize| prop_oneof![1..small[i], 1..large[i]];
    ([dim(0), dim(1), dim(2)], 0usize..14, any::<bool>())
}

/// The fast report of the case's GEMM is the walk's, bit for bit; schedules of more than `max`
/// instructions are rejected as cases.
fn fast_equals_walk(case: Case, max: u64) -> Result<(), TestCaseError> {
    let (mkn, cfg, throttle) = case;
    let cfg = configs()[cfg];
    let p = plan(mkn, cfg, throttle);
    prop_assume!(p.instructions() <= max);
    let fast = estimate_gemm(&p).expect("fast");
    let walk = estimate_gemm_walk(&p).expect("walk");
    assert_identical(&fast, &walk, &format!("{mkn:?} {cfg:?} {throttle}"));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Random shapes up to a few thousand instructions, every configuration, throttle on and
    /// off: the fast report is the walk's, bit for bit.
    #[test]
    fn fast_equals_walk_on_random_shapes(case in cases([300, 600, 1100], [4000, 20_000, 40_000])) {
        fast_equals_walk(case, 20_000)?;
    }

    /// Larger schedules (up to 300000 instructions), biased to short K (every group waits for
    /// PSUM banks and the evictors set the pace) and to tiny M (1-cycle matmuls: the ramp spans
    /// many groups and rows).
    #[test]
    fn fast_equals_walk_on_larger_memory_bound_shapes(
        case in cases([64, 400, 200], [40_000, 3000, 60_000])
    ) {
        fast_equals_walk(case, 300_000)?;
    }
}
