//! Per-instruction costs of the tensor engine, the leaf every GEMM cost model builds on.
//!
//! Sources (docs/sources.md): instruction cost `max(min(64, N_stationary), N_moving)` PE
//! cycles, x4 for fp32 (\[S10\]; NCv2 formulas applied at the v3 clock of 2.4 GHz); fast
//! LoadStationary up to 4x faster than an MM of the same free size; PSUM evictions by the
//! Scalar or Vector engine at `max(MIN_II, N)` cycles plus the tensor-access overhead.

use crate::spec::{
    FAST_LOAD_STATIONARY_SPEEDUP, MATMUL_FP32_COST_FACTOR, MIN_II_CYCLES, MM_INIT_LATENCY_CYCLES,
    SCALAR_CLOCK_HZ, TENSOR_ACCESS_INIT_CYCLES, VECTOR_CLOCK_HZ,
};

/// PE cycles of one `nc_matmul` with stationary free size `m` and moving free size `n`:
/// `max(min(64, m), n)`, times 4 when an operand is fp32.
pub fn matmul_cycles(m: usize, n: usize, fp32: bool) -> u64 {
    let c = (m.min(MM_INIT_LATENCY_CYCLES)).max(n) as u64;
    if fp32 {
        c * MATMUL_FP32_COST_FACTOR as u64
    } else {
        c
    }
}

/// PE cycles of loading a stationary tile of free size `m` (fast LoadStationary: a quarter of
/// an MM of the same free size). It runs in the background of the previous MM.
pub fn load_stationary_cycles(m: usize) -> u64 {
    (m.div_ceil(FAST_LOAD_STATIONARY_SPEEDUP)).max(1) as u64
}

/// Seconds to evict one finished `[m, n]` fp32 PSUM tile to SBUF on the Scalar (`act = true`)
/// or the Vector engine.
pub fn eviction_seconds(n: usize, act: bool) -> f64 {
    let cycles = (n.max(MIN_II_CYCLES) + TENSOR_ACCESS_INIT_CYCLES) as f64;
    cycles / if act { SCALAR_CLOCK_HZ } else { VECTOR_CLOCK_HZ }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instruction_cost_formula() {
        assert_eq!(matmul_cycles(128, 512, false), 512);
        assert_eq!(matmul_cycles(128, 16, false), 64);
        assert_eq!(matmul_cycles(32, 16, false), 32);
        assert_eq!(matmul_cycles(128, 512, true), 2048);
    }
}
