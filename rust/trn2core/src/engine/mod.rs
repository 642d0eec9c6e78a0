//! The tensor engine, functional part (contract section 2): which bits an `nc_matmul` and a whole
//! tiled GEMM produce. How long they take is the performance model's business, kept apart.
//!
//! - [`matmul()`] / [`matmul_into()`]: one `nc_matmul` instruction, with the validation of its
//!   shapes, formats, `perf_mode` and PE tile ([`validate_matmul()`]).
//! - [`gemm_f32()`] / [`gemm_f32_into()`]: `a @ b` of any size, tiled onto the engine exactly as a
//!   kernel would (K by 128, or 256 in `double_row`; M and N tiling never changes a bit), computed
//!   by a parallel SIMD kernel that runs at host BLAS speed.
//! - [`pe_fma()`]: one step of the PE accumulation, the scalar definition of the numerics.
//!
//! # Numerics (the reference semantics; contract section 2)
//!
//! Every PE step is a fused multiply-add `partial = round_fp32(partial + a * b)`: the product is
//! exact (never rounded, not even to fp32's exponent range) and the sum is rounded once to fp32,
//! nearest-even. That is precisely IEEE 754's `fusedMultiplyAdd` on binary32 operands (section
//! 5.4.1: "computes (x × y) + z as if with unbounded range and precision, rounding only once"),
//! which is what the x86 `VFMADD231PS` instruction and Rust's `f32::mul_add` implement. So the
//! engine uses hardware FMA for **every** input format, fp32 and tf32 included, and no range check
//! or float64 fallback is needed anywhere:
//!
//! - For inputs of 16 bits or less the product q = a * b has at most 11 + 11 = 22 significant
//!   bits, so it is exact in float64 and lies on fp32's significand grid (extended to unbounded
//!   exponents), and the contract's recipe `((partial as f64) + (a as f64) * (b as f64)) as f32`
//!   gives the same bits. Proof: the float64 sum s = partial + q is exact unless the two addends
//!   (24 and 22 bits) span more than 53 bit positions, i.e. unless the smaller one is below
//!   2^-7 ulp_fp32 of the larger. Then s lies within ulp/128 of a point of fp32's grid, at least
//!   ulp/4 - ulp/128 from every fp32 rounding boundary (midpoints, the overflow threshold),
//!   while float64's rounding moves it by at most 2^-29 ulp; both round to the same fp32 value.
//!   The integration tests also check FMA against the recipe on adversarial data.
//! - "Multiply, then add" with separate fp32 roundings would *not* do: a bf16 product beyond
//!   fp32's range becomes Inf instead of cancelling (`-2^127 + 2^64 * 2^64` is `2^127`), and a
//!   product below fp32's subnormals loses its sign (`+0 + 2^-100 * -2^-100` is `-0`) or rounds
//!   twice. FMA has neither problem.
//! - For fp32 inputs the product has up to 48 bits; FMA is still exact by definition, whereas the
//!   float64 recipe could round twice. [`pe_fma()`] is the scalar definition.
//!
//! A K tile's partial sum starts at +0.0 and takes the products in ascending k (in `double_row`:
//! k, k + 128 for each row k of the tile). The first tile's sum is written to PSUM; each later
//! tile's sum is added to PSUM with one fp32 rounding. NaN results are returned as the canonical
//! quiet NaN `0x7FC0_0000`: the hardware's NaN payloads are undocumented, and this makes the bits
//! independent of which operand the host CPU happens to propagate.
//!
//! The host floating-point environment must be IEEE's default (round to nearest even, subnormals
//! neither flushed nor treated as zero). Every parallel task checks that before computing and
//! returns an error otherwise, rather than wrong bits (a library built with `-ffast-math` can set
//! flush-to-zero for a whole process).

pub mod cost;
mod gemm;
mod kernel;
mod matmul;
mod sparse;

pub use gemm::{gemm_f32, gemm_f32_into};
pub use matmul::{
    matmul, matmul_into, matmul_into_validated, validate_matmul, validate_operands, MatmulShape,
    Operand, PeTile,
};
pub use sparse::{gemm_skip_zeros_into, gemm_skip_zeros_into_with, Isa, SparseKernel};

use crate::spec;

named_enum! {
    /// The `perf_mode` of an `nc_matmul` (contract section 2).
    #[derive(Default)]
    pub enum PerfMode("perf_mode", value) {
        /// The normal mode: a contraction of up to 128 (one per PE row).
        #[default]
        None = "none",
        /// FP8 "double_row" mode (NeuronCore-v3): each PE row holds two contraction elements, k and
        /// k + 128, so one instruction contracts up to 256 (\[S1\]\[S9\]).
        DoubleRow = "double_row",
    }
}

impl PerfMode {
    /// The largest contraction of one instruction in this mode: the K tile of a GEMM.
    pub const fn contraction_max(self) -> usize {
        match self {
            PerfMode::None => spec::MATMUL_CONTRACTION_MAX,
            PerfMode::DoubleRow => spec::MATMUL_DOUBLE_ROW_CONTRACTION_MAX,
        }
    }
}

/// One PE accumulation step, the scalar definition of the engine's numerics:
/// `round_fp32(partial + a * b)` with the product exact and a single nearest-even rounding
/// (IEEE 754 `fusedMultiplyAdd`). Exact for every pair of float32 inputs, fp32 included.
#[inline]
pub fn pe_fma(partial: f32, a: f32, b: f32) -> f32 {
    a.mul_add(b, partial)
}

/// The canonical quiet NaN the engine returns for every NaN result (positive, payload 0).
pub const CANONICAL_NAN: f32 = f32::from_bits(0x7FC0_0000);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_mode_names_round_trip() {
        for p in PerfMode::ALL {
            assert_eq!(PerfMode::parse("perf_mode", p.name()), Ok(p));
        }
        let err = PerfMode::parse("perf_mode", "fast").expect_err("unknown mode");
        assert!(err.to_string().contains("double_row"), "{err}");
        assert_eq!(PerfMode::None.contraction_max(), 128);
        assert_eq!(PerfMode::DoubleRow.contraction_max(), 256);
    }

    #[test]
    fn pe_fma_is_a_single_rounding() {
        // A product beyond fp32's range cancels against the partial sum.
        let two = |e: i32| 2f32.powi(e);
        assert_eq!(pe_fma(-two(127), two(64), two(64)), two(127));
        // A product below fp32's subnormals keeps its sign.
        let z = pe_fma(0.0, two(-100), -two(-100));
        assert_eq!(z.to_bits(), (-0.0f32).to_bits());
        // fp32 inputs: (1 + 2^-23)^2 = 1 + 2^-22 + 2^-46; minus (1 + 2^-22) leaves 2^-46 exactly.
        let x = 1.0 + two(-23);
        assert_eq!(pe_fma(-(1.0 + two(-22)), x, x), two(-46));
    }
}
