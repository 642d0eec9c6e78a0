//! The ALU operators of the Vector, Scalar and GpSimd engines (NKI's `nki-aluop` table, \[S11\])
//! and their exact float32 semantics.
//!
//! # The rule (bit-exact by construction; `trn2core.reference` implements the same)
//!
//! Arithmetic operators take float32 operands (inputs widened exactly from their dtype) and give
//! a float32 result:
//! - `add`, `subtract`, `multiply`, `divide`: IEEE binary32, round to nearest even.
//! - `maximum`/`minimum`: IEEE 754-2019 `maximum`/`minimum`: a NaN operand gives NaN, and
//!   `+0 > -0`. `abs_max`/`abs_min`: the same on `|a|`, `|b|`.
//! - comparisons (`equal`, `not_equal`, `greater`, `greater_equal`, `less`, `less_equal`):
//!   1.0 or 0.0 (IEEE: any comparison with NaN is false, `not_equal` true).
//! - `logical_and`/`or`/`xor`: on "operand != 0" (NaN counts as true), giving 1.0 or 0.0.
//! - `power`: the C library's float64 `pow` of the two values, rounded once to float32 (the
//!   hardware's method is not published; see `act.rs` for the same rule on activations).
//! - unary `abs`, `square` (`a * a` in binary32), `relu` (`a > 0 ? a : +0`, NaN stays NaN),
//!   `reciprocal` (`1 / a` in binary32), `rsqrt` (`1 / sqrt(a)` in float64, rounded to float32).
//! - every NaN result is the canonical quiet NaN `0x7FC00000` (as the tensor engine's; NaN
//!   payloads are undocumented).
//!
//! Bitvec operators work on integer dtypes only, on the raw bits of each element zero-extended
//! to 32 bits; the result keeps the destination's low bits. `left_shift` / `right_shift`
//! (logical) by an amount of 32 or more give 0; `invert` is unary. (Arithmetic shift right is
//! not supported on the hardware.)

use super::super::simd::dispatch;

/// Why an operator without an element-wise rule (`average`) is refused.
pub(crate) const NOT_ELEMENTWISE: &str =
    "average is an operator of tensor_partition_reduce only (a mean across partitions)";

/// The canonical quiet NaN of every NaN result.
pub const CANONICAL_NAN: f32 = f32::from_bits(0x7FC0_0000);

named_enum! {
    /// An ALU operator (`op=` of NKI's ISA calls), named as `nki.language` names it.
    #[allow(missing_docs)]
    pub enum AluOp("ALU operator", value) {
        Add = "add",
        Subtract = "subtract",
        Multiply = "multiply",
        Divide = "divide",
        Maximum = "maximum",
        Minimum = "minimum",
        AbsMax = "abs_max",
        AbsMin = "abs_min",
        Power = "power",
        Equal = "equal",
        NotEqual = "not_equal",
        Greater = "greater",
        GreaterEqual = "greater_equal",
        Less = "less",
        LessEqual = "less_equal",
        LogicalAnd = "logical_and",
        LogicalOr = "logical_or",
        LogicalXor = "logical_xor",
        BitwiseAnd = "bitwise_and",
        BitwiseOr = "bitwise_or",
        BitwiseXor = "bitwise_xor",
        LeftShift = "left_shift",
        RightShift = "right_shift",
        Invert = "invert",
        Abs = "abs",
        Square = "square",
        Relu = "relu",
        Rsqrt = "rsqrt",
        Reciprocal = "reciprocal",
        /// `tensor_partition_reduce`'s mean across partitions (no element-wise rule: the
        /// instruction table refuses it for every other instruction).
        Average = "average",
    }
}

/// The kind of an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Binary, on float32 values.
    Arithmetic,
    /// Unary, on float32 values (the second operand is ignored).
    ArithmeticUnary,
    /// Binary, on raw integer bits.
    Bitvec,
    /// Unary, on raw integer bits.
    BitvecUnary,
    /// No element-wise rule: a reduction across partitions (`average`).
    Reduction,
}

impl AluOp {
    /// Its kind.
    pub const fn kind(self) -> OpKind {
        match self {
            AluOp::BitwiseAnd
            | AluOp::BitwiseOr
            | AluOp::BitwiseXor
            | AluOp::LeftShift
            | AluOp::RightShift => OpKind::Bitvec,
            AluOp::Invert => OpKind::BitvecUnary,
            AluOp::Average => OpKind::Reduction,
            AluOp::Abs | AluOp::Square | AluOp::Relu | AluOp::Rsqrt | AluOp::Reciprocal => {
                OpKind::ArithmeticUnary
            }
            _ => OpKind::Arithmetic,
        }
    }

    /// Whether it works on raw integer bits.
    pub const fn is_bitvec(self) -> bool {
        matches!(self.kind(), OpKind::Bitvec | OpKind::BitvecUnary)
    }

    /// Whether it has an element-wise rule (every operator but `average`).
    pub const fn is_elementwise(self) -> bool {
        !matches!(self.kind(), OpKind::Reduction)
    }

    /// Whether it is unary.
    pub const fn is_unary(self) -> bool {
        matches!(self.kind(), OpKind::ArithmeticUnary | OpKind::BitvecUnary)
    }

    /// Whether NKI allows it as a reduction operator (the table's "Legal Reduction op").
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            AluOp::Add
                | AluOp::Subtract
                | AluOp::Multiply
                | AluOp::Maximum
                | AluOp::Minimum
                | AluOp::LogicalAnd
                | AluOp::LogicalOr
                | AluOp::LogicalXor
                | AluOp::BitwiseAnd
                | AluOp::BitwiseOr
                | AluOp::BitwiseXor
        )
    }
}

/// `x`, or the canonical NaN if `x` is a NaN.
///
/// On the integer bits on purpose: LLVM treats the payload of a NaN produced by a float
/// operation as unspecified, so a float `select(isnan(r), CANONICAL_NAN, r)` may legally be
/// folded to `r` (it does so for `sqrt` under AVX-512), which would leak payloads and signs.
#[inline(always)]
pub fn canon(x: f32) -> f32 {
    let b = x.to_bits();
    f32::from_bits(if b & 0x7FFF_FFFF > 0x7F80_0000 { 0x7FC0_0000 } else { b })
}

#[inline(always)]
fn b2f(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// `m`, or the canonical NaN when `nan` (a select on the bits: see [`canon`]).
#[inline(always)]
fn nan_if(nan: bool, m: f32) -> f32 {
    f32::from_bits(if nan { 0x7FC0_0000 } else { m.to_bits() })
}

/// IEEE 754-2019 `maximum` (NaN in, NaN out; `+0 > -0`).
#[inline(always)]
pub fn maximum(a: f32, b: f32) -> f32 {
    let m = if a > b { a } else { b };
    // Equal values: the same bits, or +0 and -0, where AND of the bits picks +0.
    let m = if a == b { f32::from_bits(a.to_bits() & b.to_bits()) } else { m };
    nan_if(a.is_nan() || b.is_nan(), m)
}

/// IEEE 754-2019 `minimum` (NaN in, NaN out; `-0 < +0`).
#[inline(always)]
pub fn minimum(a: f32, b: f32) -> f32 {
    let m = if a < b { a } else { b };
    let m = if a == b { f32::from_bits(a.to_bits() | b.to_bits()) } else { m };
    nan_if(a.is_nan() || b.is_nan(), m)
}

/// The float64 rule of transcendental operators: `f(x)` rounded once to float32.
#[inline(always)]
pub(crate) fn round_f64(x: f64) -> f32 {
    canon(x as f32)
}

/// One arithmetic operator on float32 values: the scalar definition of the rule.
#[inline(always)]
pub fn apply(op: AluOp, a: f32, b: f32) -> f32 {
    match op {
        AluOp::Add => canon(a + b),
        AluOp::Subtract => canon(a - b),
        AluOp::Multiply => canon(a * b),
        AluOp::Divide => canon(a / b),
        AluOp::Maximum => maximum(a, b),
        AluOp::Minimum => minimum(a, b),
        AluOp::AbsMax => maximum(a.abs(), b.abs()),
        AluOp::AbsMin => minimum(a.abs(), b.abs()),
        AluOp::Power => round_f64((a as f64).powf(b as f64)),
        AluOp::Equal => b2f(a == b),
        AluOp::NotEqual => b2f(a != b),
        AluOp::Greater => b2f(a > b),
        AluOp::GreaterEqual => b2f(a >= b),
        AluOp::Less => b2f(a < b),
        AluOp::LessEqual => b2f(a <= b),
        AluOp::LogicalAnd => b2f((a != 0.0) & (b != 0.0)),
        AluOp::LogicalOr => b2f((a != 0.0) | (b != 0.0)),
        AluOp::LogicalXor => b2f((a != 0.0) ^ (b != 0.0)),
        AluOp::Abs => canon(a.abs()),
        AluOp::Square => canon(a * a),
        AluOp::Relu => canon(if a > 0.0 || a.is_nan() { a } else { 0.0 }),
        AluOp::Rsqrt => round_f64(1.0 / (a as f64).sqrt()),
        AluOp::Reciprocal => canon(1.0 / a),
        // Bitvec operators never reach the float path (the instructions check the kind).
        _ => CANONICAL_NAN,
    }
}

/// One bitvec operator on raw bits.
#[inline(always)]
pub fn apply_bits(op: AluOp, a: u32, b: u32) -> u32 {
    match op {
        AluOp::BitwiseAnd => a & b,
        AluOp::BitwiseOr => a | b,
        AluOp::BitwiseXor => a ^ b,
        AluOp::LeftShift => a.checked_shl(b).unwrap_or(0),
        AluOp::RightShift => a.checked_shr(b).unwrap_or(0),
        AluOp::Invert => !a,
        _ => 0,
    }
}

/// Whether the GpSimd engine computes `op` natively on int32/uint32 values (\[S2\]:
/// native integer SIMD; the ISA docs: int32 `tensor_tensor` "uses native integer arithmetic").
pub const fn int_native(op: AluOp) -> bool {
    matches!(
        op,
        AluOp::Add
            | AluOp::Subtract
            | AluOp::Multiply
            | AluOp::Maximum
            | AluOp::Minimum
            | AluOp::Equal
            | AluOp::NotEqual
            | AluOp::Greater
            | AluOp::GreaterEqual
            | AluOp::Less
            | AluOp::LessEqual
    )
}

/// One native integer operator (two's complement, wrapping to 32 bits).
#[inline(always)]
pub fn apply_int(op: AluOp, a: i64, b: i64) -> i64 {
    match op {
        AluOp::Add => a.wrapping_add(b),
        AluOp::Subtract => a.wrapping_sub(b),
        AluOp::Multiply => a.wrapping_mul(b),
        AluOp::Maximum => a.max(b),
        AluOp::Minimum => a.min(b),
        AluOp::Equal => (a == b) as i64,
        AluOp::NotEqual => (a != b) as i64,
        AluOp::Greater => (a > b) as i64,
        AluOp::GreaterEqual => (a >= b) as i64,
        AluOp::Less => (a < b) as i64,
        AluOp::LessEqual => (a <= b) as i64,
        _ => 0,
    }
}

/// Calls `$each(args..., f)` with `f` the operator as a closure, specialised for the common
/// operators so that each gets its own vectorised loop (used here and by the row kernels).
macro_rules! per_op {
    ($op:expr, $each:ident ( $($arg:expr),* )) => {
        match $op {
            AluOp::Add => $each($($arg,)* |x: f32, y: f32| canon(x + y)),
            AluOp::Subtract => $each($($arg,)* |x: f32, y: f32| canon(x - y)),
            AluOp::Multiply => $each($($arg,)* |x: f32, y: f32| canon(x * y)),
            AluOp::Divide => $each($($arg,)* |x: f32, y: f32| canon(x / y)),
            AluOp::Maximum => $each($($arg,)* maximum),
            AluOp::Minimum => $each($($arg,)* minimum),
            other => $each($($arg,)* move |x: f32, y: f32| apply(other, x, y)),
        }
    };
}
pub(crate) use per_op;

dispatch! {
    /// `out[i] = op(a[i], b[i])`.
    pub fn binary(op: AluOp, a: &[f32], b: &[f32], out: &mut [f32]) {
        #[inline(always)]
        fn each(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        per_op!(op, each(a, b, out))
    }
}

dispatch! {
    /// `out[i] = op(a[i], s)`, or `op(s, a[i])` with `reverse`.
    pub fn with_scalar(op: AluOp, a: &[f32], s: f32, reverse: bool, out: &mut [f32]) {
        #[inline(always)]
        fn each(a: &[f32], s: f32, reverse: bool, out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
            if reverse {
                for (o, &x) in out.iter_mut().zip(a) {
                    *o = f(s, x);
                }
            } else {
                for (o, &x) in out.iter_mut().zip(a) {
                    *o = f(x, s);
                }
            }
        }
        per_op!(op, each(a, s, reverse, out))
    }
}

/// Applies a binary-or-unary arithmetic operator with an optional reversal: `op(x, y)`, or
/// `op(y, x)` when `reverse`; unary operators take `x` only.
#[inline(always)]
pub fn apply_ordered(op: AluOp, x: f32, y: f32, reverse: bool) -> f32 {
    if op.is_unary() {
        apply(op, x, 0.0)
    } else if reverse {
        apply(op, y, x)
    } else {
        apply(op, x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_min_follow_ieee_2019() {
        assert_eq!(maximum(-0.0, 0.0).to_bits(), 0);
        assert_eq!(maximum(0.0, -0.0).to_bits(), 0);
        assert_eq!(minimum(0.0, -0.0).to_bits(), 0x8000_0000);
        assert_eq!(maximum(f32::NAN, 1.0).to_bits(), 0x7FC0_0000);
        assert_eq!(minimum(1.0, -f32::NAN).to_bits(), 0x7FC0_0000);
        assert_eq!(maximum(f32::NEG_INFINITY, -1.0), -1.0);
        assert_eq!(apply(AluOp::AbsMax, -3.0, 2.0), 3.0);
    }

    #[test]
    fn special_values() {
        assert_eq!(apply(AluOp::Add, f32::INFINITY, f32::NEG_INFINITY).to_bits(), 0x7FC0_0000);
        assert_eq!(apply(AluOp::Divide, 1.0, -0.0), f32::NEG_INFINITY);
        assert_eq!(apply(AluOp::Equal, f32::NAN, f32::NAN), 0.0);
        assert_eq!(apply(AluOp::NotEqual, f32::NAN, f32::NAN), 1.0);
        assert_eq!(apply(AluOp::LogicalAnd, f32::NAN, 2.0), 1.0);
        assert_eq!(apply(AluOp::Relu, -0.0, 0.0).to_bits(), 0);
        assert_eq!(apply(AluOp::Rsqrt, 4.0, 0.0), 0.5);
        assert_eq!(apply(AluOp::Rsqrt, -0.0, 0.0), f32::NEG_INFINITY);
        assert_eq!(apply(AluOp::Power, 2.0, 10.0), 1024.0);
        assert_eq!(apply_bits(AluOp::LeftShift, 1, 33), 0);
        assert_eq!(apply_bits(AluOp::RightShift, 0x8000_0000, 31), 1);
        assert_eq!(apply_int(AluOp::Add, 0x7FFF_FFFF, 1) as i32, i32::MIN);
    }

    #[test]
    fn vector_kernels_equal_the_scalar_rule() {
        let vals = [
            0.0f32,
            -0.0,
            1.5,
            -2.25,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE / 3.0,
            3.0e38,
        ];
        let a: Vec<f32> = vals.iter().flat_map(|&x| vals.iter().map(move |_| x)).collect();
        let b: Vec<f32> = vals.iter().flat_map(|_| vals.iter().copied()).collect();
        let mut out = vec![0f32; a.len()];
        for op in AluOp::ALL.into_iter().filter(|o| !o.is_bitvec()) {
            binary(op, &a, &b, &mut out);
            for i in 0..a.len() {
                assert_eq!(out[i].to_bits(), apply(op, a[i], b[i]).to_bits(), "{op} {i}");
            }
            with_scalar(op, &a, 1.5, true, &mut out);
            for i in 0..a.len() {
                assert_eq!(out[i].to_bits(), apply(op, 1.5, a[i]).to_bits(), "{op} rev {i}");
            }
        }
    }
}
