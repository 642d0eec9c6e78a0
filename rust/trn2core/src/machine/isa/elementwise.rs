//! Element-wise instructions of the Vector, Scalar and GpSimd engines: `tensor_tensor`,
//! `tensor_scalar`, `scalar_tensor_tensor`, `tensor_copy`, `memset`, `reciprocal`, `select`.
//! Semantics from the NKI ISA documentation (\[S9\]); the arithmetic of each operator is
//! [`super::alu`]'s rule.

use crate::memory::Space;
use crate::numerics::{encode_scalar, Rounding};
use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::record::{flags, Engine, Opcode, Region, MEM_PSUM};
use super::super::Machine;
use super::alu::{self, AluOp};
use super::{check_engine, rule, Opnd, Scalar};
use crate::machine::tile::Tile;

/// The second operator of `tensor_scalar`: `(op1, operand1, reverse1)`.
pub type SecondOp = (AluOp, Scalar, bool);

/// One bitvec operator with an optional reversal (`invert` ignores the operand).
#[inline]
fn bits_op(op: AluOp, x: u32, s: u32, reverse: bool) -> u32 {
    if op.is_unary() {
        alu::apply_bits(op, x, 0)
    } else if reverse {
        alu::apply_bits(op, s, x)
    } else {
        alu::apply_bits(op, x, s)
    }
}

/// `out[p * n + i] = op(x[p * n + i], s[p])` (reversed with `reverse`; unary ignores `s`).
fn per_partition(op: AluOp, x: &[f32], s: &[f32], reverse: bool, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    let rev = reverse && !op.is_unary();
    for (row, (xi, oi)) in x.chunks(n).zip(out.chunks_mut(n)).enumerate() {
        alu::with_scalar(op, xi, s[row], rev, oi);
    }
    out
}

/// The two-inputs-from-PSUM rule.
pub(crate) fn two_psum_check(opc: Opcode, a: (&str, &Opnd), b: (&str, &Opnd)) -> Result<()> {
    if a.1.tile.space == Space::Psum && b.1.tile.space == Space::Psum {
        return Err(rule(
            b.0,
            "two_psum_inputs",
            format!(
                "{} and {} are both in PSUM; {} takes at most one input from PSUM",
                a.0,
                b.0,
                opc.name()
            ),
        ));
    }
    Ok(())
}

impl Machine {
    /// `tensor_tensor`: `dst = data1 <op> data2`, element-wise (Vector or GpSimd engine).
    ///
    /// Arithmetic operators compute in float32 (see [`super::alu`]); bitvec operators on the raw
    /// bits of integer tiles. On GpSimd, when every tile is int32/uint32 and the operator is
    /// one of [`alu::int_native`], the engine computes in native 32-bit integers (wrapping),
    /// as the ISA documentation says of int32 `tensor_tensor`. `power` runs on GpSimd only.
    pub fn tensor_tensor(
        &mut self,
        engine: Engine,
        dst: &Tile,
        data1: &Tile,
        data2: &Tile,
        op: AluOp,
    ) -> Result<()> {
        let opc = Opcode::TensorTensor;
        check_engine(opc, engine)?;
        if op.is_unary() {
            return Err(Error::value(
                "op",
                format!("tensor_tensor takes a binary operator; {op} is unary (use tensor_scalar)"),
            ));
        }
        if op == AluOp::Power && engine != Engine::Gpsimd {
            return Err(rule(
                "op",
                "engine",
                "tensor_tensor with power runs on the GpSimd engine",
            ));
        }
        let a = self.operand("data1", data1, Some(engine), false)?;
        let b = self.operand("data2", data2, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        two_psum_check(opc, ("data1", &a), ("data2", &b))?;
        self.same_shape(opc, "data1", &a, &[("data2", &b), ("dst", &d)])?;
        self.check_op_dtypes(
            op,
            "op",
            &[("data1", data1), ("data2", data2), ("dst", dst)],
        )?;
        let int32 = |t: &Tile| matches!(t.dtype, Dtype::Int32 | Dtype::Uint32);
        let native = engine == Engine::Gpsimd
            && alu::int_native(op)
            && [data1, data2, dst].iter().all(|t| int32(t));
        if op.is_bitvec() || native {
            let mut x = self.gather_bits(data1)?;
            let y = self.gather_bits(data2)?;
            let (ta, tb) = (data1.dtype, data2.dtype);
            for (p, &q) in x.iter_mut().zip(&y) {
                *p = if op.is_bitvec() {
                    alu::apply_bits(op, *p, q)
                } else {
                    alu::apply_int(op, ta.int_value(*p), tb.int_value(q)) as u32
                };
            }
            self.scatter_bits(&d, &x)?;
        } else if !self.fast_binary(op, &a, &b, &d) {
            let (x, y) = (self.gather_f32(data1)?, self.gather_f32(data2)?);
            let mut z = vec![0f32; x.len()];
            alu::binary(op, &x, &y, &mut z);
            self.scatter_f32(&d, &z)?;
        }
        let f = if matches!(op, AluOp::Add | AluOp::Subtract | AluOp::Multiply) {
            flags::ADD_SUB_MUL
        } else {
            0
        };
        self.record_engine(opc, engine, &[&a, &b], &[], &d, f);
        Ok(())
    }

    /// `tensor_scalar`: `dst = (data <op0> operand0) <op1> operand1` with per-partition (or
    /// constant) operands broadcast along the free dimension; `reverse` swaps an operator's
    /// inputs. Vector, Scalar (only (multiply, add), (multiply), (add) on Trn2) or GpSimd (only
    /// `rsqrt`). Arithmetic operands must be fp32; bitvec operators run on Vector only.
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_scalar(
        &mut self,
        engine: Engine,
        dst: &Tile,
        data: &Tile,
        op0: AluOp,
        operand0: &Scalar,
        reverse0: bool,
        second: Option<&SecondOp>,
    ) -> Result<()> {
        let opc = Opcode::TensorScalar;
        check_engine(opc, engine)?;
        let op1 = second.map(|s| s.0);
        if engine == Engine::Scalar
            && !matches!(
                (op0, op1),
                (AluOp::Multiply, Some(AluOp::Add)) | (AluOp::Multiply, None) | (AluOp::Add, None)
            )
        {
            return Err(rule(
                "op0",
                "act_tensor_scalar_ops",
                format!(
                    "the Scalar engine's tensor_scalar on Trainium2 takes (multiply, add), \
                     (multiply) or (add); got ({op0}{})",
                    op1.map_or(String::new(), |o| format!(", {o}"))
                ),
            ));
        }
        if engine == Engine::Gpsimd && (op0 != AluOp::Rsqrt || op1.is_some()) {
            return Err(rule(
                "engine",
                "engine",
                "tensor_scalar runs on the GpSimd engine only for op0=rsqrt (without op1)",
            ));
        }
        if let Some(o1) = op1 {
            if o1.is_bitvec() != op0.is_bitvec() {
                return Err(Error::value(
                    "op1",
                    format!("op0 ({op0}) and op1 ({o1}) must both be bitvec or both arithmetic"),
                ));
            }
        }
        if op0.is_bitvec() && engine != Engine::Vector {
            return Err(rule(
                "engine",
                "engine",
                "bitvec tensor_scalar runs on the Vector engine",
            ));
        }
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "data", &a, &[("dst", &d)])?;
        self.check_op_dtypes(op0, "op0", &[("data", data), ("dst", dst)])?;
        let (p, n) = (a.p(), a.n());
        let mut extra = Vec::new();
        if op0.is_bitvec() {
            let s0 = self.scalar_bits("operand0", operand0, p, engine, &mut extra)?;
            let s1 = match second {
                Some((_, operand1, _)) => {
                    self.scalar_bits("operand1", operand1, p, engine, &mut extra)?
                }
                None => Vec::new(),
            };
            let mut x = self.gather_bits(data)?;
            for (row, chunk) in x.chunks_mut(n).enumerate() {
                for v in chunk.iter_mut() {
                    let t = bits_op(op0, *v, s0[row], reverse0);
                    *v = match second {
                        Some(&(o1, _, rev1)) => bits_op(o1, t, s1[row], rev1),
                        None => t,
                    };
                }
            }
            self.scatter_bits(&d, &x)?;
        } else {
            let s0 = self.scalar_f32("operand0", operand0, p, engine, &mut extra)?;
            let s1 = match second {
                Some((_, operand1, _)) => {
                    self.scalar_f32("operand1", operand1, p, engine, &mut extra)?
                }
                None => Vec::new(),
            };
            let second_f = second.map(|&(o1, _, rev1)| (o1, rev1, &s1[..]));
            if !self.fast_scalar((op0, reverse0, &s0), second_f, &a, &d) {
                let mut z = per_partition(op0, &self.gather_f32(data)?, &s0, reverse0, n);
                if let Some(&(o1, _, rev1)) = second {
                    z = per_partition(o1, &z, &s1, rev1, n);
                }
                self.scatter_f32(&d, &z)?;
            }
        }
        let f = if engine == Engine::Gpsimd {
            flags::RSQRT
        } else {
            0
        };
        self.record_engine(opc, engine, &[&a], &extra, &d, f);
        Ok(())
    }

    /// `scalar_tensor_tensor` (Vector engine): `dst = (data <op0> operand0) <op1> operand1`
    /// with `operand0` a constant or `[P, 1]` tile and `operand1` a tile like `data`.
    #[allow(clippy::too_many_arguments)]
    pub fn scalar_tensor_tensor(
        &mut self,
        dst: &Tile,
        data: &Tile,
        op0: AluOp,
        operand0: &Scalar,
        reverse0: bool,
        op1: AluOp,
        operand1: &Tile,
        reverse1: bool,
    ) -> Result<()> {
        let opc = Opcode::ScalarTensorTensor;
        let engine = Engine::Vector;
        for (arg, op) in [("op0", op0), ("op1", op1)] {
            if op.is_bitvec() {
                return Err(Error::value(
                    arg,
                    format!("scalar_tensor_tensor takes arithmetic operators; {op} is bitvec"),
                ));
            }
        }
        let a = self.operand("data", data, Some(engine), false)?;
        let b = self.operand("operand1", operand1, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        two_psum_check(opc, ("data", &a), ("operand1", &b))?;
        self.same_shape(opc, "data", &a, &[("operand1", &b), ("dst", &d)])?;
        let (p, n) = (a.p(), a.n());
        let mut extra = Vec::new();
        let s0 = self.scalar_f32("operand0", operand0, p, engine, &mut extra)?;
        let t = per_partition(op0, &self.gather_f32(data)?, &s0, reverse0, n);
        let y = self.gather_f32(operand1)?;
        let mut z = vec![0f32; t.len()];
        if op1.is_unary() {
            alu::with_scalar(op1, &t, 0.0, false, &mut z);
        } else if reverse1 {
            alu::binary(op1, &y, &t, &mut z);
        } else {
            alu::binary(op1, &t, &y, &mut z);
        }
        self.scatter_f32(&d, &z)?;
        let f = if op0 == AluOp::Subtract && op1 == AluOp::Multiply {
            flags::SUB_THEN_MUL
        } else {
            0
        };
        self.record_engine(opc, engine, &[&a, &b], &extra, &d, f);
        Ok(())
    }

    /// `tensor_copy` (Vector, Scalar or GpSimd): bit-exact when the dtypes are equal, else
    /// through float32 (NaN becomes the canonical NaN).
    pub fn tensor_copy(&mut self, engine: Engine, dst: &Tile, src: &Tile) -> Result<()> {
        let opc = Opcode::TensorCopy;
        check_engine(opc, engine)?;
        let s = self.operand("src", src, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "src", &s, &[("dst", &d)])?;
        self.copy_values(&s, &d)?;
        self.record_engine(opc, engine, &[&s], &[], &d, 0);
        Ok(())
    }

    /// Copies `s` into `d` (same element count): raw bits when the dtypes are equal, else
    /// widened to float32 (NaN canonical) and rounded to `d`'s dtype.
    pub(crate) fn copy_values(&mut self, s: &Opnd, d: &Opnd) -> Result<()> {
        if s.tile.space != Space::Hbm && d.tile.space != Space::Hbm && self.fast_copy(s, d) {
            return Ok(());
        }
        if s.tile.dtype == d.tile.dtype {
            let x = self.gather_packed(&s.tile)?;
            self.scatter_raw(d, &x);
            Ok(())
        } else {
            let mut x = self.gather_f32(&s.tile)?;
            x.iter_mut().for_each(|v| *v = alu::canon(*v));
            self.scatter_f32(d, &x)
        }
    }

    /// `memset` (Vector or GpSimd): every element of `dst` becomes `value`, rounded once to the
    /// dtype (nearest even; integers saturate, a fraction rounds to nearest even).
    pub fn memset(&mut self, engine: Engine, dst: &Tile, value: f64) -> Result<()> {
        let opc = Opcode::Memset;
        check_engine(opc, engine)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        let bits = match dst.dtype.format() {
            Some(f) => encode_scalar(value, &f.encoding(), Rounding::NearestEven, false, None)?,
            None if value.is_nan() => 0,
            None => dst
                .dtype
                .saturate_int(value.round_ties_even().clamp(-1e18, 1e18) as i64),
        };
        self.scatter_bits(&d, &vec![bits; d.tile.elements()])?;
        let f = if value == 0.0 { flags::ZERO_VALUE } else { 0 };
        self.record_engine(opc, engine, &[], &[], &d, f);
        Ok(())
    }

    /// `reciprocal` (Vector engine): `dst = 1 / data` in IEEE float32.
    pub fn reciprocal(&mut self, dst: &Tile, data: &Tile) -> Result<()> {
        let opc = Opcode::Reciprocal;
        let engine = Engine::Vector;
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "data", &a, &[("dst", &d)])?;
        let x = self.gather_f32(data)?;
        let mut z = vec![0f32; x.len()];
        alu::with_scalar(AluOp::Reciprocal, &x, 0.0, false, &mut z);
        self.scatter_f32(&d, &z)?;
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }

    /// `select` (Vector engine): `dst = predicate != 0 ? on_true : on_false` element-wise
    /// (`predicate` widened to float32; NaN counts as true). Bit-exact when `on_true`,
    /// `on_false` (a tile) and `dst` share a dtype, else through float32.
    pub fn select(
        &mut self,
        dst: &Tile,
        predicate: &Tile,
        on_true: &Tile,
        on_false: &Scalar,
    ) -> Result<()> {
        let opc = Opcode::Select;
        let engine = Engine::Vector;
        let pr = self.operand("predicate", predicate, Some(engine), false)?;
        let t = self.operand("on_true", on_true, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "on_true", &t, &[("predicate", &pr), ("dst", &d)])?;
        let mut extra: Vec<Region> = Vec::new();
        let f_tile = match on_false {
            Scalar::Tile(ft) => {
                let fo = self.operand("on_false", ft, Some(engine), false)?;
                self.same_shape(opc, "on_true", &t, &[("on_false", &fo)])?;
                extra.push(fo.region());
                Some(*ft)
            }
            Scalar::Imm(_) => None,
        };
        let psum_inputs = [pr.region(), t.region()]
            .iter()
            .chain(&extra)
            .filter(|r| r.mem == MEM_PSUM)
            .count();
        if psum_inputs > 1 {
            return Err(rule(
                "on_true",
                "two_psum_inputs",
                "select takes at most one input from PSUM",
            ));
        }
        let pv = self.gather_f32(predicate)?;
        match f_tile {
            Some(ft) if ft.dtype == dst.dtype && on_true.dtype == dst.dtype => {
                let mut x = self.gather_bits(on_true)?;
                let y = self.gather_bits(&ft)?;
                for ((v, &w), &q) in x.iter_mut().zip(&y).zip(&pv) {
                    if q == 0.0 {
                        *v = w;
                    }
                }
                self.scatter_bits(&d, &x)?;
            }
            _ => {
                let mut x = self.gather_f32(on_true)?;
                let y = match (f_tile, on_false) {
                    (Some(ft), _) => self.gather_f32(&ft)?,
                    (None, Scalar::Imm(v)) => vec![*v as f32; x.len()],
                    (None, Scalar::Tile(_)) => Vec::new(),
                };
                for ((v, &w), &q) in x.iter_mut().zip(&y).zip(&pv) {
                    *v = alu::canon(if q == 0.0 { w } else { *v });
                }
                self.scatter_f32(&d, &x)?;
            }
        }
        self.record_engine(opc, engine, &[&t, &pr], &extra, &d, 0);
        Ok(())
    }
}
