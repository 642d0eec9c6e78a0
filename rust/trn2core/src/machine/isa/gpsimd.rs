//! GpSimd pattern instructions: `iota` and `affine_select`.
//!
//! Both evaluate, for partition `c` (counted from the tile's first partition) and free index
//! `(w, z, y, x)` of the pattern `[[step_w, num_w], ..., [step_x, num_x]]` (outermost first, up
//! to 4 pairs), the 32-bit integer `offset + c * channel_multiplier + w * step_w + ... + x *
//! step_x` (two's complement, wrapping). `iota` writes it converted to `dst`'s dtype (integers
//! saturate; floats round to nearest even through float32); `affine_select` compares it with 0
//! and picks `on_true`'s element or `on_false_value` (\[S9\]).

use crate::numerics::encode_scalar;
use crate::{Error, Result};

use super::super::dtype;
use super::super::record::{Engine, Opcode};
use super::super::Machine;
use super::alu::{self, AluOp};
use super::{shape_rule, Opnd};
use crate::machine::tile::{check_pattern_len, Tile, MAX_FREE_DIMS};

/// An iota / affine_select pattern: `(step, num)` pairs, outermost first.
pub type Pattern<'a> = &'a [(i64, u64)];

/// `ValueError` unless an affine pattern's `offset` and `channel_multiplier` are 32-bit integers
/// (what the instruction holds).
fn check_i32_coefficients(offset: i64, channel_multiplier: i64) -> Result<()> {
    for (arg, v) in [
        ("offset", offset),
        ("channel_multiplier", channel_multiplier),
    ] {
        if i32::try_from(v).is_err() {
            return Err(Error::value(arg, format!("{v} is not a 32-bit integer")));
        }
    }
    Ok(())
}

/// The 32-bit affine values of `pattern` for `partitions` channels, in logical order.
fn affine_values(
    pattern: Pattern,
    offset: i64,
    channel_multiplier: i64,
    partitions: u32,
    out: &mut Vec<i32>,
) {
    out.clear();
    let per: u64 = pattern.iter().map(|&(_, n)| n).product();
    for c in 0..partitions as i64 {
        let base = (offset as i32).wrapping_add((c as i32).wrapping_mul(channel_multiplier as i32));
        let mut idx = [0u64; MAX_FREE_DIMS];
        for _ in 0..per {
            let mut v = base;
            for (d, &(step, _)) in pattern.iter().enumerate() {
                v = v.wrapping_add((idx[d] as i32).wrapping_mul(step as i32));
            }
            out.push(v);
            let mut d = pattern.len();
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                if idx[d] < pattern[d].1 {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

impl Machine {
    fn check_pattern(&self, d: &Opnd, pattern: Pattern) -> Result<()> {
        check_pattern_len(pattern.len(), Error::value)?;
        let per: u128 = pattern.iter().map(|&(_, n)| n as u128).product();
        if per != d.n() as u128 {
            return Err(shape_rule(
                "pattern",
                "shape",
                format!(
                    "the pattern has {per} elements per partition; dst has {}",
                    d.n()
                ),
            ));
        }
        for (arg, v) in pattern.iter().map(|&(s, _)| ("pattern", s)) {
            if i32::try_from(v).is_err() {
                return Err(Error::value(
                    arg,
                    format!("step {v} is not a 32-bit integer"),
                ));
            }
        }
        Ok(())
    }

    /// `iota` (GpSimd engine): writes the affine pattern's values into `dst` (SBUF).
    pub fn iota(
        &mut self,
        dst: &Tile,
        pattern: Pattern,
        offset: i64,
        channel_multiplier: i64,
    ) -> Result<()> {
        let opc = Opcode::Iota;
        let engine = Engine::Gpsimd;
        check_i32_coefficients(offset, channel_multiplier)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.check_pattern(&d, pattern)?;
        let mut vals = Vec::new();
        affine_values(pattern, offset, channel_multiplier, d.p(), &mut vals);
        if dst.dtype.is_int() {
            let bits: Vec<u32> = vals
                .iter()
                .map(|&v| dst.dtype.saturate_int(v as i64))
                .collect();
            self.scatter_bits(&d, &bits)?;
        } else {
            let f: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
            self.scatter_f32(&d, &f)?;
        }
        self.record_engine(opc, engine, &[], &[], &d, 0);
        Ok(())
    }

    /// `affine_select` (GpSimd engine): `dst = cmp_op(affine, 0) ? on_true : on_false_value`
    /// (both tiles in SBUF); bit-exact when `on_true` has `dst`'s dtype, else through float32.
    #[allow(clippy::too_many_arguments)]
    pub fn affine_select(
        &mut self,
        dst: &Tile,
        pattern: Pattern,
        channel_multiplier: i64,
        on_true: &Tile,
        on_false_value: f64,
        cmp_op: AluOp,
        offset: i64,
    ) -> Result<()> {
        let opc = Opcode::AffineSelect;
        let engine = Engine::Gpsimd;
        if !matches!(
            cmp_op,
            AluOp::Equal
                | AluOp::NotEqual
                | AluOp::Greater
                | AluOp::GreaterEqual
                | AluOp::Less
                | AluOp::LessEqual
        ) {
            return Err(Error::value(
                "cmp_op",
                format!("{cmp_op} is not a comparison (equal, not_equal, greater, greater_equal, less, less_equal)"),
            ));
        }
        check_i32_coefficients(offset, channel_multiplier)?;
        let t = self.operand("on_true_tile", on_true, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "on_true_tile", &t, &[("dst", &d)])?;
        self.check_pattern(&d, pattern)?;
        let mut aff = Vec::new();
        affine_values(pattern, offset, channel_multiplier, d.p(), &mut aff);
        let pred = |v: i32| alu::apply_int(cmp_op, v as i64, 0) != 0;
        if on_true.dtype == dst.dtype {
            let false_bits = match dst.dtype.format() {
                Some(f) => encode_scalar(
                    on_false_value as f32 as f64,
                    &f.encoding(),
                    crate::numerics::Rounding::NearestEven,
                    false,
                    None,
                )?,
                None => dtype::f32_to_int_bits(dst.dtype, on_false_value as f32),
            };
            let mut x = self.gather_bits(on_true)?;
            for (v, &a) in x.iter_mut().zip(&aff) {
                if !pred(a) {
                    *v = false_bits;
                }
            }
            self.scatter_bits(&d, &x)?;
        } else {
            let mut x = self.gather_f32(on_true)?;
            let fv = on_false_value as f32;
            for (v, &a) in x.iter_mut().zip(&aff) {
                let r = if pred(a) { *v } else { fv };
                *v = alu::canon(r);
            }
            let r = self.scatter_f32(&d, &x);
            r?;
        }
        self.record_engine(opc, engine, &[&t], &[], &d, 0);
        Ok(())
    }
}
