//! The Scalar engine's activation functions (NKI's `nki-act-func` table, \[S11\]).
//!
//! # Not the chip's bits
//!
//! Trainium2 approximates these functions "with piece-wise polynomials on Scalar Engine"; the
//! polynomials are not published. trn2core therefore defines each function by a float64
//! formula evaluated on the float32 input and rounded once to float32 (nearest even). This is
//! *not* what the hardware computes: results can differ from a chip in the last bits, and
//! outside a function's documented valid range (e.g. `sin` outside `[-pi, pi]`, where the chip
//! extrapolates its polynomial: sin(9.0) is about 27.65 on hardware) they differ completely.
//! Every other instruction of the machine is bit-exact by construction.
//!
//! The rule, exactly (so that `trn2core.reference` reproduces it bit for bit): `x` is the
//! float32 input as float64; `exp`, `ln`, `ln_1p`, `tanh`, `sin`, `atan`, `erf` are the
//! platform C library's float64 functions (what Python's `math` module calls; Rust's `f64`
//! methods call the same functions), `sqrt` and `+ - * /` are IEEE float64, and the formulas
//! below are evaluated left to right as written. Constants are the float64 values nearest to
//! `1/sqrt(2)` ([`FRAC_1_SQRT_2`]), `2/sqrt(pi)` ([`FRAC_2_SQRT_PI`]), `sqrt(2/pi)`
//! ([`SQRT_2_OVER_PI`]), `1/sqrt(2 pi)` ([`FRAC_1_SQRT_2PI`]), 0.044715 and 1.702.
//!
//! | name | formula (float64) |
//! |---|---|
//! | copy | `x` |
//! | square | `x * x` |
//! | relu | `x > 0 ? x : +0` (NaN stays NaN) |
//! | sigmoid | `1 / (1 + exp(-x))` |
//! | tanh | `tanh(x)` |
//! | gelu | `0.5 * x * (1 + erf(x * FRAC_1_SQRT_2))` |
//! | gelu_dx | `0.5 * (1 + erf(x * FRAC_1_SQRT_2)) + x * exp(-0.5 * x * x) * FRAC_1_SQRT_2PI` |
//! | gelu_apprx_tanh | `0.5 * x * (1 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))` |
//! | gelu_apprx_sigmoid | `x / (1 + exp(-1.702 * x))` |
//! | gelu_apprx_sigmoid_dx | `s + 1.702 * x * s * (1 - s)`, `s = 1 / (1 + exp(-1.702 * x))` |
//! | silu | `x / (1 + exp(-x))` |
//! | silu_dx | `s * (1 + x * (1 - s))`, `s = 1 / (1 + exp(-x))` |
//! | softplus | `x > 0 ? x + ln_1p(exp(-x)) : ln_1p(exp(x))` |
//! | mish | `x * tanh(softplus(x))` |
//! | erf | `erf(x)` |
//! | erf_dx | `FRAC_2_SQRT_PI * exp(-(x * x))` |
//! | exp | `exp(x)` |
//! | log | `ln(x)` |
//! | sin | `sin(x)` |
//! | arctan | `atan(x)` |
//! | sqrt | `sqrt(x)` |
//! | rsqrt | `1 / sqrt(x)` |
//! | reciprocal | `1 / x` |
//! | sign | `x > 0 ? 1 : x < 0 ? -1 : x` (signed zeros and NaN pass) |
//! | abs | `abs(x)` |
//!
//! The result `r` becomes `r as f32` (round to nearest even, overflow to Inf), and a NaN the
//! canonical quiet NaN `0x7FC00000`. At infinite inputs the formulas give their IEEE values,
//! which for some are NaN rather than the limit (`silu(-Inf)`, `gelu(-Inf)`: `-Inf * 0`). For copy, square, relu, sqrt, reciprocal, sign and abs
//! this equals the correctly rounded float32 operation.

use super::super::simd::dispatch;
use super::alu::{canon, round_f64};

pub use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

/// `sqrt(2 / pi)` as float64.
pub const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// `1 / sqrt(2 pi)` as float64.
pub const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

extern "C" {
    /// The C library's `erf` (Rust's standard library does not expose one); the same function
    /// Python's `math.erf` calls, so `trn2core.reference` reproduces it bit for bit.
    #[link_name = "erf"]
    fn c_erf(x: f64) -> f64;
}

/// The C library's float64 `erf`.
#[inline]
pub fn erf(x: f64) -> f64 {
    // SAFETY: `erf` is a pure function of a double, defined for every input, in every C99
    // math library (glibc, musl, macOS libm, the Windows UCRT).
    unsafe { c_erf(x) }
}

named_enum! {
    /// An activation function (`op=` of `nki.isa.activation`), named as `nki.language` names it.
    #[allow(missing_docs)]
    pub enum ActFunc("activation function", value) {
        Copy = "copy",
        Square = "square",
        Relu = "relu",
        Sigmoid = "sigmoid",
        Tanh = "tanh",
        Gelu = "gelu",
        GeluDx = "gelu_dx",
        GeluApprxTanh = "gelu_apprx_tanh",
        GeluApprxSigmoid = "gelu_apprx_sigmoid",
        GeluApprxSigmoidDx = "gelu_apprx_sigmoid_dx",
        Silu = "silu",
        SiluDx = "silu_dx",
        Softplus = "softplus",
        Mish = "mish",
        Erf = "erf",
        ErfDx = "erf_dx",
        Exp = "exp",
        Log = "log",
        Sin = "sin",
        Arctan = "arctan",
        Sqrt = "sqrt",
        Rsqrt = "rsqrt",
        Reciprocal = "reciprocal",
        Sign = "sign",
        Abs = "abs",
    }
}

impl ActFunc {
    /// Whether the result is the correctly rounded float32 operation (no float64 function of
    /// the C library involved).
    pub const fn is_exact(self) -> bool {
        matches!(
            self,
            ActFunc::Copy
                | ActFunc::Square
                | ActFunc::Relu
                | ActFunc::Sqrt
                | ActFunc::Reciprocal
                | ActFunc::Sign
                | ActFunc::Abs
        )
    }
}

#[inline(always)]
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[inline(always)]
fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// The float64 value of `func` at `x` (the table of the module doc).
pub fn eval_f64(func: ActFunc, x: f64) -> f64 {
    match func {
        ActFunc::Copy => x,
        ActFunc::Square => x * x,
        ActFunc::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        ActFunc::Sigmoid => sigmoid(x),
        ActFunc::Tanh => x.tanh(),
        ActFunc::Gelu => 0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2)),
        ActFunc::GeluDx => {
            0.5 * (1.0 + erf(x * FRAC_1_SQRT_2)) + x * (-0.5 * x * x).exp() * FRAC_1_SQRT_2PI
        }
        ActFunc::GeluApprxTanh => {
            0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))).tanh())
        }
        ActFunc::GeluApprxSigmoid => x / (1.0 + (-1.702 * x).exp()),
        ActFunc::GeluApprxSigmoidDx => {
            let s = sigmoid(1.702 * x);
            s + 1.702 * x * s * (1.0 - s)
        }
        ActFunc::Silu => x / (1.0 + (-x).exp()),
        ActFunc::SiluDx => {
            let s = sigmoid(x);
            s * (1.0 + x * (1.0 - s))
        }
        ActFunc::Softplus => softplus(x),
        ActFunc::Mish => x * softplus(x).tanh(),
        ActFunc::Erf => erf(x),
        ActFunc::ErfDx => FRAC_2_SQRT_PI * (-(x * x)).exp(),
        ActFunc::Exp => x.exp(),
        ActFunc::Log => x.ln(),
        ActFunc::Sin => x.sin(),
        ActFunc::Arctan => x.atan(),
        ActFunc::Sqrt => x.sqrt(),
        ActFunc::Rsqrt => 1.0 / x.sqrt(),
        ActFunc::Reciprocal => 1.0 / x,
        ActFunc::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        ActFunc::Abs => x.abs(),
    }
}

/// `func(x)` for a float32 input: the float64 formula rounded once to float32.
#[inline]
pub fn eval(func: ActFunc, x: f32) -> f32 {
    round_f64(eval_f64(func, x as f64))
}

dispatch! {
    /// Applies `func` to every element of `vals` in place. The functions whose rule is a
    /// correctly rounded float32 operation ([`ActFunc::is_exact`]) run as vectorised float32
    /// code (the same bits as the float64 formula: float64 then one rounding equals the
    /// correctly rounded float32 result for `x * x`, `1 / x`, `sqrt`, selections and signs).
    pub fn apply(func: ActFunc, vals: &mut [f32]) {
        match func {
            ActFunc::Copy => vals.iter_mut().for_each(|v| *v = canon(*v)),
            ActFunc::Square => vals.iter_mut().for_each(|v| *v = canon(*v * *v)),
            ActFunc::Abs => vals.iter_mut().for_each(|v| *v = canon(v.abs())),
            ActFunc::Reciprocal => vals.iter_mut().for_each(|v| *v = canon(1.0 / *v)),
            ActFunc::Sqrt => vals.iter_mut().for_each(|v| *v = canon(v.sqrt())),
            ActFunc::Relu => vals.iter_mut().for_each(|v| {
                let x = *v;
                *v = canon(if x > 0.0 || x.is_nan() { x } else { 0.0 });
            }),
            ActFunc::Sign => vals.iter_mut().for_each(|v| {
                let x = *v;
                *v = canon(if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                });
            }),
            _ => vals.iter_mut().for_each(|v| *v = eval(func, *v)),
        }
    }
}

dispatch! {
    /// `vals[i] = vals[i] * scale + bias` in float32 (two roundings), for one partition.
    pub fn scale_bias(vals: &mut [f32], scale: f32, bias: f32) {
        vals.iter_mut().for_each(|v| *v = *v * scale + bias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_functions_equal_float32_arithmetic() {
        for &x in &[0.0f32, -0.0, 1.5, -3.25, 1e-40, f32::MAX, f32::INFINITY, 7.0] {
            assert_eq!(eval(ActFunc::Square, x).to_bits(), (x * x).to_bits());
            assert_eq!(eval(ActFunc::Reciprocal, x).to_bits(), (1.0 / x).to_bits());
            assert_eq!(eval(ActFunc::Sqrt, x.abs()).to_bits(), x.abs().sqrt().to_bits());
        }
        assert_eq!(eval(ActFunc::Relu, -0.0).to_bits(), 0);
        assert_eq!(eval(ActFunc::Sign, -0.0).to_bits(), 0x8000_0000);
        assert_eq!(eval(ActFunc::Sign, -2.0), -1.0);
        assert_eq!(eval(ActFunc::Exp, f32::NAN).to_bits(), 0x7FC0_0000);
    }

    #[test]
    fn vectorised_exact_functions_equal_the_rule() {
        let xs: Vec<f32> = [
            0.0f32,
            -0.0,
            1.5,
            -3.25,
            1e-40,
            -1e-45,
            3e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            7.0,
        ]
        .into_iter()
        .chain((0..2000).map(|i| f32::from_bits(0x9E37_79B9u32.wrapping_mul(i))))
        .collect();
        for f in ActFunc::ALL.into_iter().filter(|f| f.is_exact()) {
            let mut v = xs.clone();
            apply(f, &mut v);
            for (x, y) in xs.iter().zip(&v) {
                assert_eq!(y.to_bits(), round_f64(eval_f64(f, *x as f64)).to_bits(), "{f} {x}");
            }
        }
    }

    #[test]
    fn formulas_have_their_known_values() {
        assert_eq!(eval(ActFunc::Exp, 0.0), 1.0);
        assert_eq!(eval(ActFunc::Sigmoid, 0.0), 0.5);
        assert_eq!(eval(ActFunc::Gelu, 0.0), 0.0);
        assert_eq!(eval(ActFunc::Erf, f32::INFINITY), 1.0);
        assert_eq!(eval(ActFunc::Softplus, 100.0), 100.0);
        assert_eq!(eval(ActFunc::Softplus, -200.0), 0.0);
        assert_eq!(eval(ActFunc::Log, 0.0), f32::NEG_INFINITY);
        // The formulas' IEEE values at -Inf: -Inf / Inf is NaN (documented, not a limit).
        assert_eq!(eval(ActFunc::Silu, f32::NEG_INFINITY).to_bits(), 0x7FC0_0000);
        assert_eq!(eval(ActFunc::Sigmoid, f32::NEG_INFINITY), 0.0);
        assert!((eval(ActFunc::Gelu, 1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((eval(ActFunc::GeluApprxTanh, 1.0) - 0.841_192).abs() < 1e-5);
        assert!((SQRT_2_OVER_PI - (2.0 / std::f64::consts::PI).sqrt()).abs() < 1e-16);
        assert!((FRAC_1_SQRT_2PI - 1.0 / (2.0 * std::f64::consts::PI).sqrt()).abs() < 1e-16);
    }
}
