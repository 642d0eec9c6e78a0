//! How long each recorded instruction occupies its engine or DMA queue (TIME). Reads only the
//! recorded program ([`super::record`]) and `spec`; never the values.
//!
//! # The formulas
//!
//! `N` is the instruction's elements per partition, `MIN_II` = 64 cycles. Costs are the NKI
//! ISA's "Estimated instruction cost" formulas (written for NeuronCore-v2, removed from the 2026
//! docs, \[S10\]), applied at Trn2's clocks (inferred: no v3 table is published).
//!
//! | instruction | engine cycles | status |
//! |---|---|---|
//! | nc_matmul | `max(min(64, M), N_moving)`, x4 with an fp32 operand (PE, 2.4 GHz) | D |
//! | nc_matmul transpose / nc_transpose (PE) | `max(K, min(64, M))`, x2 fp32 | D |
//! | tensor_tensor (DVE) | `max(MIN_II, N)` with a PSUM input or all-bf16 add/sub/mul contiguous; else `max(MIN_II, 2N)` | D |
//! | tensor_scalar, tensor_copy, activation, bn_stats, nc_transpose (DVE) | `max(MIN_II, N)` | D |
//! | activation_reduce, activation with reduce_res, tensor_scalar_reduce with reduce_res | `max(MIN_II, N) + 64` | D |
//! | scalar_tensor_tensor | `N` for bf16 subtract-then-multiply with N even, else `2N` | D |
//! | tensor_reduce | `N/2` for bf16 add/max, else `N` | D |
//! | tensor_tensor_scan, select | `max(MIN_II, 2N)` (select: `N` with a PSUM input) | D |
//! | reciprocal (DVE) | `max(MIN_II, 8N)` | D |
//! | memset (DVE) | `max(MIN_II, N/2)` for zero into bf16/fp16, else `max(MIN_II, N)` | D |
//! | bn_aggr | `max(MIN_II, 13 * (N/3))` | D |
//! | iota, affine_select (POOL) | `150 + N` | D |
//! | other GpSimd element-wise | `150 + N` (`150 + 4N` for rsqrt) | I |
//! | tensor_copy_dynamic_src / _dst (DVE, ACT, POOL) | `max(MIN_II_DYNAMIC, N)`, `MIN_II_DYNAMIC` = 600 | D |
//!
//! - Trn2 Vector performance modes (\[S1\]): tensor_copy / tensor_scalar with
//!   bf16/fp16 in and out of SBUF and a contiguous innermost dimension run 4x faster; with a
//!   strided innermost dimension or one side in PSUM 2x; tensor_tensor with all-bf16/fp16 tiles
//!   and both inputs in SBUF 2x. Applied as `max(MIN_II, work / factor)` (inferred).
//! - Every ACT and DVE instruction also pays the ~60-cycle static overhead of initiating an
//!   SBUF/PSUM access (\[S2\]; the same `+ 60` as `engine::cost`'s PSUM
//!   eviction); GpSimd's start-up overhead is its `150`.
//! - DMA (`dma::cost`'s single-transfer model): its fixed cost (`dma::cost::fixed_cost_s`: the
//!   calibrated 0.75 us, plus 0.34 us when it reads HBM) on the queue, then the data phase on
//!   the DMA engines serving the SBUF partitions (engine `e` serves partitions `8e..8e+8`; all
//!   16 for HBM to HBM): each engine's share at 23 GB/s times `dma::cost::dma_efficiency` of
//!   the bytes per partition row, or the HBM stack's bandwidth if slower. Transfers on
//!   different queues overlap their fixed costs and share the engines. A `dma_transpose`
//!   moves its bytes at 90% of that rate from HBM and 50% SBUF to SBUF (the upper bounds the
//!   Trn2 architecture guide gives, \[S1\]\[S14\]).
//!
//! Time is counted in ticks of 4.8 GHz, the least common multiple of the engine clocks (PE
//! 2.4 GHz: 2 ticks per cycle, ACT and POOL 1.2 GHz: 4, DVE 0.96 GHz: 5), so every duration and
//! every sum is exact. DMA durations are rounded up to a whole tick.

use crate::dma::cost::{dma_efficiency, fixed_cost_s, Place};
use crate::spec::{
    ACT_READ_ACCUMULATOR_CYCLES, DMA_ENGINES_PER_CORE, DMA_ENGINE_BYTES_PER_S,
    DMA_PARTITIONS_PER_ENGINE, DMA_TRANSPOSE_HBM_TO_SBUF_EFFICIENCY,
    DMA_TRANSPOSE_SBUF_TO_SBUF_EFFICIENCY, DVE_BN_AGGR_CYCLES_PER_TRIPLE, DVE_PERF_MODE,
    DVE_PERF_MODE_FAST, DVE_RECIPROCAL_CYCLES_PER_ELEMENT, DVE_TWO_INPUT_CYCLES_PER_ELEMENT,
    GPSIMD_CLOCK_HZ, GPSIMD_CYCLES_PER_ELEMENT, GPSIMD_RSQRT_CYCLES_PER_ELEMENT,
    GPSIMD_START_CYCLES, HBM_STACK_BYTES_PER_S, MIN_II_CYCLES, MIN_II_DYNAMIC_CYCLES,
    MM_INIT_LATENCY_CYCLES, PE_CLOCK_HZ, SCALAR_CLOCK_HZ, TENSOR_ACCESS_INIT_CYCLES,
    VECTOR_CLOCK_HZ,
};

use super::record::{flags as fl, CostInput, Engine, Instr, Opcode, Queue};

/// Ticks per second: 4.8 GHz, the least common multiple of the engine clocks.
pub const TICK_HZ: f64 = 4.8e9;

/// Ticks per cycle of an engine's clock.
pub const fn ticks_per_cycle(engine: Engine) -> u64 {
    let hz = match engine {
        Engine::Tensor => PE_CLOCK_HZ,
        Engine::Vector => VECTOR_CLOCK_HZ,
        Engine::Scalar => SCALAR_CLOCK_HZ,
        Engine::Gpsimd => GPSIMD_CLOCK_HZ,
    };
    (TICK_HZ / hz) as u64
}

/// Seconds of `ticks`.
pub fn seconds(ticks: u64) -> f64 {
    ticks as f64 / TICK_HZ
}

/// The tick of `seconds` (the inverse of [`seconds`], exact for the times it gives);
/// `ValueError` naming `seconds` for a negative, non-finite or too large time.
pub fn ticks_of_seconds(seconds: f64) -> crate::Result<u64> {
    let t = (seconds * TICK_HZ).round();
    if !(0.0..=u64::MAX as f64 / 2.0).contains(&t) {
        return Err(crate::Error::value("seconds", format!("{seconds} is not a time >= 0 s")));
    }
    Ok(t as u64)
}

/// The cost of one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Ticks the instruction occupies its engine (DMA: fixed part plus data part).
    pub ticks: u64,
    /// DMA: the fixed part, on the queue only.
    pub fixed: u64,
    /// DMA: the data part, on the DMA engines in `engines`.
    pub data: u64,
    /// DMA: bit `e` for each DMA engine the transfer uses.
    pub engines: u16,
}

/// `max(MIN_II, work)` in cycles.
fn ii(work: u64) -> u64 {
    work.max(MIN_II_CYCLES as u64)
}

/// The Vector engine's cycles (before the access overhead) of one instruction.
pub fn vector_cycles(op: Opcode, c: &CostInput) -> u64 {
    let n = c.n as u64;
    let f = c.flags;
    let two = DVE_TWO_INPUT_CYCLES_PER_ELEMENT as u64;
    let sbuf_only = f & (fl::PSUM_INPUT | fl::PSUM_OUTPUT) == 0;
    let all16 = f & fl::ALL_16BIT != 0;
    // Performance modes (\[S1\]): 4x, 2x, or none.
    let copy_mode = if all16 && sbuf_only && f & fl::CONTIGUOUS != 0 {
        DVE_PERF_MODE_FAST as u64
    } else if all16 {
        DVE_PERF_MODE as u64
    } else {
        1
    };
    match op {
        Opcode::TensorTensor => {
            let work = if f & fl::PSUM_INPUT != 0
                || f & fl::ALL_BF16 != 0 && f & fl::ADD_SUB_MUL != 0 && f & fl::CONTIGUOUS != 0
            {
                n
            } else {
                two * n
            };
            let mode = if all16 && f & fl::PSUM_INPUT == 0 { DVE_PERF_MODE as u64 } else { 1 };
            ii(work.div_ceil(mode))
        }
        Opcode::TensorScalar | Opcode::TensorCopy => ii(n.div_ceil(copy_mode)),
        Opcode::ScalarTensorTensor => {
            if f & fl::ALL_BF16 != 0 && f & fl::SUB_THEN_MUL != 0 && n.is_multiple_of(2) {
                n
            } else {
                two * n
            }
        }
        Opcode::TensorReduce => {
            if f & fl::ALL_BF16 != 0 && f & fl::ADD_OR_MAX != 0 {
                n.div_ceil(2)
            } else {
                n
            }
        }
        Opcode::TensorTensorScan => ii(two * n),
        Opcode::Select => {
            if f & fl::PSUM_INPUT != 0 {
                ii(n)
            } else {
                ii(two * n)
            }
        }
        Opcode::TensorScalarReduce => {
            ii(n) + if f & fl::READ_ACCUMULATOR != 0 { MIN_II_CYCLES as u64 } else { 0 }
        }
        Opcode::Reciprocal => ii(DVE_RECIPROCAL_CYCLES_PER_ELEMENT as u64 * n),
        Opcode::Memset => {
            if f & fl::ZERO_VALUE != 0 && all16 {
                ii(n.div_ceil(2))
            } else {
                ii(n)
            }
        }
        Opcode::BnAggr => ii(DVE_BN_AGGR_CYCLES_PER_TRIPLE as u64 * (n / 3)),
        _ => ii(n),
    }
}

/// The Scalar engine's cycles (before the access overhead).
pub fn scalar_cycles(op: Opcode, c: &CostInput) -> u64 {
    let base = ii(c.n as u64);
    let readout = op == Opcode::ActivationReduce || c.flags & fl::READ_ACCUMULATOR != 0;
    base + if readout { ACT_READ_ACCUMULATOR_CYCLES as u64 } else { 0 }
}

/// The GpSimd engine's cycles (start-up included).
pub fn gpsimd_cycles(_op: Opcode, c: &CostInput) -> u64 {
    let per = if c.flags & fl::RSQRT != 0 {
        GPSIMD_RSQRT_CYCLES_PER_ELEMENT
    } else {
        GPSIMD_CYCLES_PER_ELEMENT
    } as u64;
    GPSIMD_START_CYCLES as u64 + per * c.n as u64
}

/// The tensor engine's cycles: `engine::cost`'s matmul formula, or the transpose formula.
pub fn pe_cycles(_op: Opcode, c: &CostInput) -> u64 {
    let fp32 = c.flags & fl::FP32 != 0;
    if c.flags & fl::TRANSPOSE != 0 {
        let (k, m) = (c.m as u64, c.k as u64);
        k.max(m.min(MM_INIT_LATENCY_CYCLES as u64)) * if fp32 { 2 } else { 1 }
    } else {
        crate::engine::cost::instr::matmul_cycles(c.m as usize, c.k as usize, fp32)
    }
}

/// The DMA cost of moving `c.bytes` (see the module doc).
pub fn dma_cost(c: &CostInput) -> Cost {
    let per = DMA_PARTITIONS_PER_ENGINE as u64;
    let (p0, pn) = (c.start_partition as u64, (c.partitions as u64).max(1));
    let first = p0 / per;
    let last = (p0 + pn - 1) / per;
    let mut engines = 0u16;
    let mut engines_s = 0f64;
    // A DMA transpose reaches a fraction of the copy's throughput ([S1][S14]: up to 90% from
    // HBM, 50% SBUF to SBUF); applied to every engine's share.
    let transpose = match (c.flags & fl::DMA_TRANSPOSE != 0, c.flags & fl::DMA_FROM_HBM != 0) {
        (false, _) => 1.0,
        (true, true) => DMA_TRANSPOSE_HBM_TO_SBUF_EFFICIENCY,
        (true, false) => DMA_TRANSPOSE_SBUF_TO_SBUF_EFFICIENCY,
    };
    let eff = (dma_efficiency(c.bytes as f64 / pn as f64) * transpose).max(1e-9);
    for e in first..=last.min(DMA_ENGINES_PER_CORE as u64 - 1) {
        engines |= 1 << e;
        let lo = (e * per).max(p0);
        let hi = ((e + 1) * per).min(p0 + pn);
        let share = c.bytes as f64 * (hi - lo) as f64 / pn as f64;
        engines_s = engines_s.max(share / (DMA_ENGINE_BYTES_PER_S * eff));
    }
    let hbm_sides =
        (c.flags & fl::DMA_FROM_HBM != 0) as u32 + (c.flags & fl::DMA_TO_HBM != 0) as u32;
    let hbm_s = c.bytes as f64 * hbm_sides as f64 / HBM_STACK_BYTES_PER_S;
    let place = |hbm: bool| if hbm { Place::Hbm } else { Place::Sbuf };
    let fixed_s =
        fixed_cost_s(place(c.flags & fl::DMA_FROM_HBM != 0), place(c.flags & fl::DMA_TO_HBM != 0));
    let fixed = (fixed_s * TICK_HZ).round() as u64;
    let data = (engines_s.max(hbm_s) * TICK_HZ).ceil() as u64;
    Cost { ticks: fixed + data, fixed, data, engines }
}

/// Whether `op` is a copy at a dynamic address (`tensor_copy_dynamic_src` / `_dst`).
fn dynamic(op: Opcode) -> bool {
    matches!(op, Opcode::TensorCopyDynamicSrc | Opcode::TensorCopyDynamicDst)
}

/// A dynamic-address copy's cycles on any engine: `max(MIN_II_DYNAMIC, N)` (\[S10\]).
fn dynamic_cycles(c: &CostInput) -> u64 {
    (c.n as u64).max(MIN_II_DYNAMIC_CYCLES as u64)
}

/// The cost of a recorded instruction.
pub fn cost(i: &Instr) -> Cost {
    let c = &i.cost;
    let access = TENSOR_ACCESS_INIT_CYCLES as u64;
    let ticks = match i.queue {
        Queue::Dma(_) => return dma_cost(c),
        Queue::Engine(e) => {
            let cycles = match e {
                Engine::Tensor => pe_cycles(i.opcode, c),
                Engine::Gpsimd if dynamic(i.opcode) => dynamic_cycles(c),
                _ if dynamic(i.opcode) => dynamic_cycles(c) + access,
                Engine::Vector => vector_cycles(i.opcode, c) + access,
                Engine::Scalar => scalar_cycles(i.opcode, c) + access,
                Engine::Gpsimd => gpsimd_cycles(i.opcode, c),
            };
            cycles * ticks_per_cycle(e)
        }
    };
    Cost { ticks, fixed: 0, data: 0, engines: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_go_back_to_their_tick() {
        for t in [0u64, 1, 3, 12_345, 987_654_321, 1 << 40] {
            assert_eq!(ticks_of_seconds(seconds(t)).expect("tick"), t);
        }
        for bad in [-1e-9, f64::NAN, f64::INFINITY] {
            assert_eq!(ticks_of_seconds(bad).expect_err("refused").arg(), Some("seconds"));
        }
    }
    use crate::machine::record::Instr;

    fn instr(op: Opcode, e: Engine, n: u32, flags: u32) -> Instr {
        Instr {
            opcode: op,
            queue: Queue::Engine(e),
            first_region: 0,
            reads: 0,
            writes: 0,
            location: crate::machine::record::NO_LOCATION,
            cost: CostInput { n, partitions: 128, flags, ..CostInput::default() },
        }
    }

    #[test]
    fn ticks_are_whole_cycles_of_every_clock() {
        for (e, t) in
            [(Engine::Tensor, 2), (Engine::Scalar, 4), (Engine::Gpsimd, 4), (Engine::Vector, 5)]
        {
            assert_eq!(ticks_per_cycle(e), t);
        }
        for hz in [PE_CLOCK_HZ, VECTOR_CLOCK_HZ, SCALAR_CLOCK_HZ, GPSIMD_CLOCK_HZ] {
            assert_eq!((TICK_HZ / hz).fract(), 0.0);
        }
    }

    #[test]
    fn published_formulas() {
        let c = |op, e, n, f| cost(&instr(op, e, n, f)).ticks;
        // fp32 tensor_tensor in SBUF: max(64, 2N) + 60 DVE cycles of 5 ticks.
        assert_eq!(c(Opcode::TensorTensor, Engine::Vector, 512, 0), (1024 + 60) * 5);
        assert_eq!(c(Opcode::TensorTensor, Engine::Vector, 8, 0), (64 + 60) * 5);
        assert_eq!(c(Opcode::TensorTensor, Engine::Vector, 512, fl::PSUM_INPUT), (512 + 60) * 5);
        // all-bf16 add in SBUF, contiguous: N, and the 2x mode.
        let bf = fl::ALL_16BIT | fl::ALL_BF16 | fl::CONTIGUOUS | fl::ADD_SUB_MUL;
        assert_eq!(c(Opcode::TensorTensor, Engine::Vector, 512, bf), (256 + 60) * 5);
        // tensor_copy bf16 contiguous SBUF: 4x.
        assert_eq!(c(Opcode::TensorCopy, Engine::Vector, 1024, bf), (256 + 60) * 5);
        assert_eq!(c(Opcode::Activation, Engine::Scalar, 1024, 0), (1024 + 60) * 4);
        assert_eq!(c(Opcode::ActivationReduce, Engine::Scalar, 10, 0), (64 + 64 + 60) * 4);
        assert_eq!(c(Opcode::Reciprocal, Engine::Vector, 100, 0), (800 + 60) * 5);
        assert_eq!(c(Opcode::BnAggr, Engine::Vector, 30, 0), (130 + 60) * 5);
        assert_eq!(c(Opcode::Iota, Engine::Gpsimd, 100, 0), 250 * 4);
        assert_eq!(c(Opcode::TensorScalar, Engine::Gpsimd, 100, fl::RSQRT), 550 * 4);
        // A dynamic-address copy: max(600, N), plus the access overhead on DVE and ACT.
        assert_eq!(c(Opcode::TensorCopyDynamicSrc, Engine::Vector, 64, bf), (600 + 60) * 5);
        assert_eq!(c(Opcode::TensorCopyDynamicDst, Engine::Scalar, 1000, 0), (1000 + 60) * 4);
        assert_eq!(c(Opcode::TensorCopyDynamicSrc, Engine::Gpsimd, 10, 0), 600 * 4);
        let mut mm = instr(Opcode::NcMatmul, Engine::Tensor, 512, 0);
        mm.cost.m = 128;
        mm.cost.k = 512;
        assert_eq!(cost(&mm).ticks, 512 * 2);
        mm.cost.flags = fl::FP32;
        assert_eq!(cost(&mm).ticks, 2048 * 2);
        mm.cost.flags = fl::TRANSPOSE;
        mm.cost.m = 128;
        mm.cost.k = 32;
        assert_eq!(cost(&mm).ticks, 128 * 2);
    }

    #[test]
    fn dma_pays_its_fixed_cost_and_shares_engines() {
        let small = dma_cost(&CostInput {
            bytes: 128 * 64,
            partitions: 128,
            flags: fl::DMA_FROM_HBM,
            ..CostInput::default()
        });
        let want = fixed_cost_s(Place::Hbm, Place::Sbuf);
        assert_eq!(small.fixed, (want * TICK_HZ).round() as u64);
        assert_eq!(small.engines, 0xFFFF);
        let big = dma_cost(&CostInput {
            bytes: 128 << 16,
            partitions: 128,
            flags: fl::DMA_FROM_HBM,
            ..CostInput::default()
        });
        let rate = (128u64 << 16) as f64 / seconds(big.data);
        assert!(
            rate < 16.0 * DMA_ENGINE_BYTES_PER_S && rate > 0.9 * 16.0 * DMA_ENGINE_BYTES_PER_S,
            "{rate}"
        );
        let half = dma_cost(&CostInput {
            bytes: 64 * 1024,
            partitions: 64,
            start_partition: 64,
            ..CostInput::default()
        });
        assert_eq!(half.engines, 0xFF00);
    }
}
