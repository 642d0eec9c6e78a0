//! The tensor engine, functional part (contract section 2): which bits an `nc_matmul` and a whole
//! tiled GEMM produce. How long they take is the performance model's business, kept apart.
//!
//! - [`matmul()`] / [`matmul_into()`]: one `nc_matmul` instruction, with the validation of its
//!   shapes, formats, `perf_mode` and PE tile ([`validate_matmul()`]).
//! - [`gemm_f32()`] / [`gemm_f32_into()`]: `a @ b` of any size, tiled onto the engine exactly as a
//!   kernel would (K by 128, or 256 in `double_row`; M and N tiling never changes a bit), computed
//!   by a parallel SIMD kernel that runs at host BLAS speed.
//! - [`GemmCall`]: one `trn2core.gemm` call whole: the operands as the caller holds them
//!   ([`Matrix`]: any dtype and layout, or N:M-compressed), rounded into their formats while the
//!   kernel packs them (no float32 copy of an operand), the output rounded into its format, and
//!   the timing report of the same tile schedule.
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
mod duo;
mod gemm;
mod kernel;
mod matmul;
mod operand;
mod sparse;

pub(crate) use duo::{join as duo_join, post as duo_post};
pub(crate) use gemm::{
    add_tile_in_place, run_chain_tiles, run_chains, ChainJob, ChainOperand, KTile, KeptPanels,
};
pub use gemm::{gemm_f32, gemm_f32_into};
pub(crate) use matmul::operand_readers_t;
pub use matmul::{
    matmul, matmul_into, matmul_into_validated, validate_matmul, validate_operands, MatmulShape,
    Operand, PeTile,
};
pub use operand::{Buffer, Matrix, Sparse, Strided};
pub(crate) use operand::{Reader, RUN};
pub use sparse::{gemm_skip_zeros_into, gemm_skip_zeros_into_with, Isa, SparseKernel};

use crate::engine::cost::GemmPlan;
use crate::numerics::{encode_into, CodesMut, Format, Random, Rounding, Source};
use crate::perf::Report;
use crate::{spec, Error, Result};

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

/// Checks that the engine multiplies operands `a` and `b` of these formats in `perf_mode` (the
/// rules of one instruction, [`validate_matmul`]); errors name `a` or `b`.
pub fn check_gemm_formats(a: Format, b: Format, perf_mode: PerfMode) -> Result<()> {
    matmul::check_format_pair(["a", "b"], [a, b], perf_mode)
}

/// What `trn2core.estimate_gemm` costs: a GEMM `[m, k] @ [k, n]` of `format` operands.
#[derive(Debug, Clone)]
pub struct EstimateRequest {
    /// Rows of `a` and of the result.
    pub m: u64,
    /// The contraction.
    pub k: u64,
    /// Columns of `b` and of the result.
    pub n: u64,
    /// Both operands' format.
    pub format: Format,
    /// The instructions' `perf_mode`.
    pub perf_mode: PerfMode,
    /// An N:M-sparse stationary operand (`a`), if any.
    pub sparsity: Option<crate::sparsity::Pattern>,
    /// Whether the dI/dt throttle is modelled.
    pub throttle: bool,
    /// Whether the report records events for a trace.
    pub trace: bool,
    /// The physical cores of a LogicalCore or Chip the GEMM is split over (`None`: one core).
    pub cores: Option<Vec<usize>>,
}

impl EstimateRequest {
    /// About how many elementary steps evaluating it takes (instructions x 16: what decides
    /// whether the binding runs it inline or interruptibly on a helper thread).
    pub fn work(&self) -> u64 {
        let tiles = |x: u64, t: usize| x.div_ceil(t as u64);
        tiles(self.m, spec::MATMUL_STATIONARY_FREE_MAX)
            .saturating_mul(tiles(self.n, spec::MATMUL_MOVING_FREE_MAX))
            .saturating_mul(tiles(self.k, spec::MATMUL_CONTRACTION_MAX))
            .saturating_mul(16)
    }
}

/// A GEMM's timing without data, in one call: the engine's format rule (errors name `dtype`,
/// the one format the caller gave: there are no operands `a`/`b` here), the plan, and its
/// evaluation on one core or split over `cores`.
pub fn estimate(req: &EstimateRequest) -> Result<Report> {
    matmul::check_format_pair(["dtype", "dtype"], [req.format, req.format], req.perf_mode)?;
    let mut plan = GemmPlan::new(req.m, req.k, req.n, req.format, req.perf_mode)?;
    if let Some(p) = req.sparsity {
        plan = plan.with_sparsity(p)?;
    }
    plan.throttle = req.throttle;
    plan.trace = req.trace;
    match &req.cores {
        None => cost::estimate_gemm(&plan),
        Some(cores) => cost::estimate_gemm_cores(&plan, cores),
    }
}

/// The one operand format the cost model's plan of a GEMM of `a` and `b` operands takes (the
/// plan holds one format for both: instruction cost, peak, bytes per element): fp32 when either
/// is (4x the cycles); else `a`'s, or `b`'s when only `a` is fp8, so a mixed pair is costed as
/// its wider member.
pub fn cost_format(a: Format, b: Format) -> Format {
    if a == Format::Fp32 || b == Format::Fp32 {
        Format::Fp32
    } else if a.is_fp8() && !b.is_fp8() {
        b
    } else {
        a
    }
}

/// What a [`GemmCall`] takes besides its operands (the arguments of `trn2core.gemm`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmOptions {
    /// Round both operands once into this format (`dtype=`); `None`: each operand in the format
    /// its dtype holds (float64 and integers rounded to fp32, nearest-even).
    pub dtype: Option<Format>,
    /// The rounding of `dtype` and of the output.
    pub rounding: Rounding,
    /// Stochastic-rounding seeds: `a`'s (also the output's) and `b`'s. Word `i` of a seed's
    /// generator rounds flat C-order element `i` of its matrix.
    pub seeds: [u64; 2],
    /// The instruction mode.
    pub perf_mode: PerfMode,
    /// The format of the result (fp32: the PSUM values as they are).
    pub out_format: Format,
    /// The dI/dt throttle of the timing model.
    pub throttle: bool,
    /// The physical cores of one chip the timing splits the work over; `None`: one standalone
    /// NeuronCore (the bits never depend on the split).
    pub cores: Option<Vec<usize>>,
}

/// Where a [`GemmCall`] writes its `[M, N]` result (row-major).
#[derive(Debug)]
pub enum GemmOut<'a> {
    /// fp32: the PSUM values.
    Fp32(&'a mut [f32]),
    /// The codes of another `out_format` (its code width).
    Codes(CodesMut<'a>),
}

/// One `trn2core.gemm` call: `a @ b` with the engine's bits and the timing of its tile schedule.
///
/// The operands arrive as the caller holds them ([`Matrix`]) and are rounded into their formats
/// while the GEMM packs its panels, a run of a row at a time, through the numerics kernels: no
/// operand is ever copied whole, in float32 or otherwise. The bits equal those of rounding each
/// operand whole (`numerics::encode_into`, `a` with `seeds[0]` and `b` with `seeds[1]`), decoding
/// and multiplying ([`gemm_f32`]; the zero-skipping kernel for a compressed `a`), then rounding
/// the result into `out_format` with `seeds[0]`.
#[derive(Debug)]
pub struct GemmCall<'a> {
    a: Reader<'a>,
    b: Reader<'a>,
    dims: [usize; 3],
    options: GemmOptions,
    plan: GemmPlan,
}

impl<'a> GemmCall<'a> {
    /// Validates a call, before anything is allocated: the operands' dtypes and formats (the
    /// engine's rules, errors naming `a` or `b`), their shapes (`a`'s columns equal `b`'s rows,
    /// no empty dimension), that the host can hold the result, and the timing plan.
    pub fn new(a: Matrix<'a>, b: Matrix<'a>, options: GemmOptions) -> Result<GemmCall<'a>> {
        let [seed_a, seed_b] = options.seeds;
        let (ra, af) = Reader::new("a", a, options.dtype, options.rounding, seed_a)?;
        let (rb, bf) = Reader::new("b", b, options.dtype, options.rounding, seed_b)?;
        let ([m, k], [k_b, n]) = (a.shape(), b.shape());
        if k != k_b {
            return Err(Error::shape(
                "b",
                format!(
                    "a is ({m}, {k}) and b is ({k_b}, {n}); a's columns (K) must equal b's rows"
                ),
            ));
        }
        if m == 0 || k == 0 || n == 0 {
            return Err(Error::shape(
                "a, b",
                format!("empty matrices (M={m}, K={k}, N={n}); every dimension must be >= 1"),
            ));
        }
        check_gemm_formats(af, bf, options.perf_mode)?;
        // The fp32 PSUM values, and the codes of another output format rounded from them.
        let (what, codes) = match options.out_format {
            Format::Fp32 => (format!("the {m} x {n} float32 result"), 0),
            f => (
                format!("the {m} x {n} float32 result and its {} codes", f.name()),
                f.code_bits() as u128 / 8,
            ),
        };
        crate::host::check_alloc("out", &what, (m as u128 * n as u128) * (4 + codes))?;
        let dims = |d: usize| d as u64;
        let cost = cost_format(af, bf);
        let mut plan = GemmPlan::new(dims(m), dims(k), dims(n), cost, options.perf_mode)?;
        if let Some(pattern) = a.pattern() {
            plan = plan.with_sparsity(pattern)?;
        }
        plan.throttle = options.throttle;
        Ok(GemmCall { a: ra, b: rb, dims: [m, k, n], options, plan })
    }

    /// `[M, K, N]`.
    pub fn dims(&self) -> [usize; 3] {
        self.dims
    }

    /// The format of the result.
    pub fn out_format(&self) -> Format {
        self.options.out_format
    }

    /// The operand format the timing is costed at ([`cost_format`]).
    pub fn cost_format(&self) -> Format {
        self.plan.format
    }

    /// Computes the result into `out` (`M * N` elements: float32 for fp32, else the codes of
    /// `out_format`) and returns the timing report. Interruptible (`crate::cancel`).
    pub fn run(&self, out: GemmOut) -> Result<Report> {
        let report = match &self.options.cores {
            None => crate::engine::cost::estimate_gemm(&self.plan)?,
            Some(cores) => crate::engine::cost::estimate_gemm_cores(&self.plan, cores)?,
        };
        let [m, _, n] = self.dims;
        match out {
            GemmOut::Fp32(values) => {
                operand::check_len("out", values.len(), &[m, n])?;
                if self.options.out_format != Format::Fp32 {
                    return Err(Error::format(
                        "out",
                        "float32 output buffer for a result that is not fp32",
                    ));
                }
                self.values(values)?;
            }
            GemmOut::Codes(codes) => {
                let what = format!("the {m} x {n} float32 result");
                let mut values = crate::host::zeroed_vec("out", &what, m * n)?;
                self.values(&mut values)?;
                let random = match self.options.rounding {
                    Rounding::Stochastic => Random::Seed(self.options.seeds[0], 32),
                    _ => Random::None,
                };
                let enc = self.options.out_format.encoding();
                let src = Source::F32(&values);
                encode_into(&src, &enc, self.options.rounding, false, &random, codes)?;
            }
        }
        Ok(report)
    }

    /// The fp32 PSUM result, `[M, N]`.
    fn values(&self, out: &mut [f32]) -> Result<()> {
        let [m, k, n] = self.dims;
        if self.a.matrix().pattern().is_some() {
            // A sparse stationary operand gives the dense GEMM's bits (docs/sparsity.md); the
            // kernel skips the products of its zeros when that is faster.
            sparse::skip_zeros(&self.a, &self.b, self.dims, out, Isa::Best).map(|_| ())
        } else {
            let tiling = gemm::Tiling::gemm(self.options.perf_mode);
            gemm::run(&self.a, &self.b, m, k, n, tiling, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_mode_contraction() {
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
