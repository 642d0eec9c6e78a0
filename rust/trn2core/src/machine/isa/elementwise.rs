//! Element-wise instructions of the Vector, Scalar and GpSimd engines: `tensor_tensor`,
//! `tensor_scalar`, `scalar_tensor_tensor`, `tensor_copy`, `memset`, `reciprocal`, `select`,
//! and the Vector engine's partition shuffle `nc_stream_shuffle` and `dropout`.
//! Semantics from the NKI ISA documentation (\[S9\]); the arithmetic of each operator is
//! [`super::alu`]'s rule.
//!
//! `nc_stream_shuffle` (documented: within each quadrant of 32 partitions, output partition
//! `i` copies input partition `shuffle_mask[i]`, 255 leaves it unmodified, the same mask for
//! every quadrant; same dtype and elements per partition; the start partitions follow the
//! active partitions `ceil(max(P_src, P_dst) / 32) * 32`). Ours, where the documentation is
//! silent: partitions count from each tile's own start (dst partition `i` reads src partition
//! `32 * (i / 32) + shuffle_mask[i % 32]`), a mask naming a src partition the tile does not
//! have is refused (`shuffle_mask`), as are elements outside 0..=31 and 255; the elements
//! move bit for bit.
//!
//! `dropout` (documented: each element replaced by zero with the drop probability `prob` of its
//! partition, 1.0 dropping all and 0.0 none; the kept values unscaled). Its random stream is
//! *ours*, not the chip's bits (its generator is undocumented): the words of `numerics`'
//! counter-based generator (`StochasticBits`, the one behind seeded stochastic rounding) for
//! the seed `s + i`, `i` the instruction's index in the recorded program and `s` the machine's
//! stochastic-rounding seed (0 under nearest-even); element `k` of `data` in logical order
//! (partition-major, free axes flattened) is dropped when `word(k) < prob * 2^32`. Once
//! `set_rng_seed` (documented: seeds the Vector engine's generator with a `[1, 1]` 32-bit
//! value; the same seed gives the same random sequence) has run, the dropouts draw the stream
//! of seed `2^32 + v` instead, in order: each goes on at the word after the previous one's last
//! (`Machine::vector_rng`), whatever its index, so a forward and a backward kernel that seed
//! alike drop alike. A `prob`
//! outside `[0, 1]` (or NaN) is refused. Same dtypes: bits moved (a dropped element all zero
//! bits, +0); otherwise through float32.
//!
//! `tensor_copy_dynamic_src` / `_dst` (documented: a copy on the Vector, Scalar or GpSimd
//! engine whose source, or destination, sits at a dynamic offset within each partition, the
//! offset a scalar in SBUF; SBUF or PSUM on both sides, the same partitions and elements per
//! partition; cost `max(MIN_II_DYNAMIC, N)`). The machine reads the offset `v` from its own
//! SBUF when the instruction runs (one integer element, written before; signed types sign
//! extended) and moves the moved side's access pattern `v * offset_step` elements along its
//! partitions (the front end passes the stride of the axis NKI indexed with it). Ours, where
//! the documentation is silent: `v` outside `0..offset_limit` (the positions of that axis
//! where the access fits; 0 means no such bound) or a moved access leaving its tensor is a
//! `ShapeError` naming the moved argument (rule `dynamic_offset`) instead of the hardware's
//! unchecked access; the values move as `tensor_copy`'s (bits when the dtypes agree).

use crate::memory::Space;
use crate::numerics::{encode_scalar, Rounding, StochasticBits};
use crate::{Error, Result};

use super::super::dtype::{Dtype, OutputRounding};
use super::super::record::{flags, Engine, Opcode, Queue, Region, MEM_PSUM};
use super::super::Machine;
use super::alu::{self, AluOp};
use super::{check_engine, rule, Opnd, Scalar};
use crate::machine::tile::Tile;
use crate::spec::SBUF_QUADRANT_PARTITIONS;

/// The rule of a dynamic offset (`tensor_copy_dynamic_src` / `_dst`).
const DYNAMIC_OFFSET: &str = "dynamic_offset";

/// The dynamic offset of `tensor_copy_dynamic_src` / `_dst`: the tile holding it, the elements
/// one unit moves the access (the stride of the indexed axis), and the exclusive bound on its
/// value (0: none beyond the tensor's own bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamicOffset {
    /// One integer element in SBUF.
    pub tile: Tile,
    /// Elements per unit of the offset.
    pub step: i64,
    /// The offset is below this (0: no bound but the tensor's).
    pub limit: i64,
}

/// `nc_stream_shuffle`'s mask value leaving a partition unmodified.
const SHUFFLE_KEEP: i64 = 255;

/// The generator seed a `set_rng_seed` value `v` gives the Vector engine's stream: `2^32 + v`,
/// apart from the unseeded dropouts' `s + i` for any program shorter than 2^32 instructions.
const SEEDED_STREAM: u64 = 1 << 32;

impl Machine {
    /// `nc_stream_shuffle` (Vector engine): partition `i` of `dst` copies partition
    /// `shuffle_mask[i % 32]` of the same quadrant of `src`, bit for bit (255: unmodified).
    /// See the module doc.
    pub fn nc_stream_shuffle(
        &mut self, dst: &Tile, src: &Tile, shuffle_mask: &[i64],
    ) -> Result<()> {
        let opc = Opcode::NcStreamShuffle;
        let engine = Engine::Vector;
        let a = self.operand("src", src, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        super::keeps_dtype(
            "shuffle_dtype",
            dst,
            ("src", src),
            "nc_stream_shuffle keeps the dtype",
        )?;
        if d.n() != a.n() {
            return Err(super::shape_rule(
                "dst",
                "shape",
                format!(
                    "{} elements per partition and src {}; nc_stream_shuffle moves whole \
                     partitions",
                    d.n(),
                    a.n()
                ),
            ));
        }
        let q = SBUF_QUADRANT_PARTITIONS as u32;
        let active = a.p().max(d.p()).div_ceil(q) * q;
        for (arg, o) in [("src", &a), ("dst", &d)] {
            if !super::partition_start_ok(o.tile.start_partition, active) {
                return Err(super::shape_rule(
                    arg,
                    "start_partition",
                    format!(
                        "{arg} starts at partition {} with {active} active partitions \
                         (ceil(max(src, dst partitions) / 32) * 32); 96 or 128 start at 0, 64 \
                         at 0 or 64, 32 at 0, 32, 64 or 96",
                        o.tile.start_partition
                    ),
                ));
            }
        }
        let bad = |m: String| rule("shuffle_mask", "shuffle_mask", m);
        if shuffle_mask.len() != q as usize {
            return Err(bad(format!(
                "{} elements; the mask has {q}, one per partition of a quadrant",
                shuffle_mask.len()
            )));
        }
        if let Some((i, m)) = shuffle_mask
            .iter()
            .enumerate()
            .find(|(_, &m)| !(0..q as i64).contains(&m) && m != SHUFFLE_KEEP)
        {
            return Err(bad(format!(
                "element {i} is {m}; each is a partition of the quadrant (0..=31) or 255 \
                 (unmodified)"
            )));
        }
        // (dst partition, src partition) pairs, all checked before anything is written.
        let mut moves = Vec::with_capacity(d.p() as usize);
        for i in 0..d.p() {
            let m = shuffle_mask[(i % q) as usize];
            if m == SHUFFLE_KEEP {
                continue;
            }
            let s = i / q * q + m as u32;
            if s >= a.p() {
                return Err(bad(format!(
                    "dst partition {i} would copy src partition {s}; src has {} partitions",
                    a.p()
                )));
            }
            moves.push((i, s));
        }
        let x = self.gather_bits(src)?;
        let n = a.n();
        for (i, s) in moves {
            let row = Opnd {
                tile: Tile { start_partition: dst.start_partition + i, partitions: 1, ..*dst },
                range: d.range,
            };
            self.scatter_bits(&row, &x[s as usize * n..(s as usize + 1) * n])?;
        }
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }
}

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

/// Refuses `op0`, then `op1`, where `why(op)` gives a reason: a `ValueError` on that argument.
pub(crate) fn check_op_pair(
    op0: AluOp, op1: AluOp, why: impl Fn(AluOp) -> Option<String>,
) -> Result<()> {
    for (arg, op) in [("op0", op0), ("op1", op1)] {
        if !op.is_elementwise() {
            return Err(Error::value(arg, alu::NOT_ELEMENTWISE));
        }
        if let Some(msg) = why(op) {
            return Err(Error::value(arg, msg));
        }
    }
    Ok(())
}

impl Machine {
    /// The operands of an element-wise instruction of two tensor inputs `a` and `b` (name,
    /// tile) and `dst`: checked each, then the two-inputs-from-PSUM rule and equal shapes.
    pub(crate) fn two_tensor_operands(
        &self, opc: Opcode, engine: Engine, a: (&str, &Tile), b: (&str, &Tile), dst: &Tile,
    ) -> Result<(Opnd, Opnd, Opnd)> {
        let oa = self.operand(a.0, a.1, Some(engine), false)?;
        // The same tile twice (`x * x`) passes the same checks: checked once.
        let ob = if b.1 == a.1 { oa } else { self.operand(b.0, b.1, Some(engine), false)? };
        let d = self.operand("dst", dst, Some(engine), true)?;
        if oa.tile.space == Space::Psum && ob.tile.space == Space::Psum {
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
        self.same_shape(opc, a.0, &oa, &[(b.0, &ob), ("dst", &d)])?;
        Ok((oa, ob, d))
    }

    /// The operands of an element-wise instruction from `data` into `dst`: checked each, and
    /// of equal shapes.
    pub(crate) fn data_dst_operands(
        &self, opc: Opcode, engine: Engine, data: &Tile, dst: &Tile,
    ) -> Result<(Opnd, Opnd)> {
        self.input_dst_operands(opc, engine, ("data", data), dst)
    }

    /// [`Self::data_dst_operands`] with the input named `arg`.
    pub(crate) fn input_dst_operands(
        &self, opc: Opcode, engine: Engine, (arg, input): (&str, &Tile), dst: &Tile,
    ) -> Result<(Opnd, Opnd)> {
        let a = self.operand(arg, input, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, arg, &a, &[("dst", &d)])?;
        Ok((a, d))
    }
}

impl Machine {
    /// `tensor_tensor`: `dst = data1 <op> data2`, element-wise (Vector or GpSimd engine).
    ///
    /// Arithmetic operators compute in float32 (see [`super::alu`]); bitvec operators on the raw
    /// bits of integer tiles. On GpSimd, when every tile is int32/uint32 and the operator is
    /// one of [`alu::int_native`], the engine computes in native 32-bit integers (wrapping),
    /// as the ISA documentation says of int32 `tensor_tensor`. `power` runs on GpSimd only.
    pub fn tensor_tensor(
        &mut self, engine: Engine, dst: &Tile, data1: &Tile, data2: &Tile, op: AluOp,
    ) -> Result<()> {
        let (a, b, d, bits) = self.tensor_tensor_checked(engine, dst, data1, data2, op)?;
        self.tensor_tensor_values(op, bits, &a, &b, &d)?;
        self.record_tensor_tensor(engine, op, &a, &b, &d);
        Ok(())
    }

    /// [`Machine::tensor_tensor`] issued while matmuls are queued: when it is float32 in and
    /// out and writes SBUF, it waits in the queue behind them ([`super::pe::Drain`]): checked
    /// and recorded now, computed when the queue is settled, with the same bits (a kernel
    /// that adds each matmul chain's PSUM result into SBUF keeps its matmuls queued, and the
    /// chains are computed in parallel). `Ok(false)` (nothing done) when it does not qualify.
    pub(crate) fn tensor_tensor_deferred(
        &mut self, engine: Engine, dst: &Tile, data1: &Tile, data2: &Tile, op: AluOp,
    ) -> Result<bool> {
        if !self.tensor_tensor_may_wait(dst, data1, data2, op) {
            return Ok(false);
        }
        // The checks see the memories as they will be when it runs: the queued matmuls'
        // destinations are marked written when queued, the waiting tensor_tensors' when
        // deferred (the operand check refuses other instructions while matmuls wait).
        let queue = std::mem::take(&mut self.pe_queue);
        let drains = std::mem::take(&mut self.pe_drains);
        let checked = self.tensor_tensor_checked(engine, dst, data1, data2, op);
        (self.pe_queue, self.pe_drains) = (queue, drains);
        let (a, b, d, bits) = checked?;
        if bits {
            return Ok(false);
        }
        self.mem.mark_written(&d.tile, d.range);
        self.record_tensor_tensor(engine, op, &a, &b, &d);
        let after = self.pe_queue.len();
        self.pe_drains.push(super::pe::Drain { after, op, a, b, d });
        Ok(true)
    }

    /// Records a checked `tensor_tensor`.
    fn record_tensor_tensor(&mut self, engine: Engine, op: AluOp, a: &Opnd, b: &Opnd, d: &Opnd) {
        let flags = if matches!(op, AluOp::Add | AluOp::Subtract | AluOp::Multiply) {
            flags::ADD_SUB_MUL
        } else {
            0
        };
        self.record_engine(Opcode::TensorTensor, engine, &[a, b], &[], d, flags);
    }

    /// Whether a `tensor_tensor` of these tiles waits in the matmul queue when issued
    /// ([`Machine::tensor_tensor_deferred`]): matmuls wait, room for one more, float32 in and
    /// out, `dst` in SBUF, an arithmetic operator.
    pub(crate) fn tensor_tensor_may_wait(
        &self, dst: &Tile, data1: &Tile, data2: &Tile, op: AluOp,
    ) -> bool {
        !self.pe_queue.is_empty()
            && self.pe_drains.len() < super::pe::MAX_DRAINS
            && [data1, data2, dst].iter().all(|t| t.dtype == Dtype::Fp32)
            && dst.space == Space::Sbuf
            && !op.is_bitvec()
    }

    /// `tensor_tensor`'s checks: its operands, and whether it computes on raw bits (bitvec
    /// operators, GpSimd's native int32 arithmetic).
    fn tensor_tensor_checked(
        &self, engine: Engine, dst: &Tile, data1: &Tile, data2: &Tile, op: AluOp,
    ) -> Result<(Opnd, Opnd, Opnd, bool)> {
        let opc = Opcode::TensorTensor;
        check_engine(opc, engine)?;
        if op.is_unary() {
            return Err(Error::value(
                "op",
                format!("tensor_tensor takes a binary operator; {op} is unary (use tensor_scalar)"),
            ));
        }
        if op == AluOp::Power && engine != Engine::Gpsimd {
            return Err(rule("op", "engine", "tensor_tensor with power runs on the GpSimd engine"));
        }
        let (a, b, d) =
            self.two_tensor_operands(opc, engine, ("data1", data1), ("data2", data2), dst)?;
        self.check_op_dtypes(op, "op", &[("data1", data1), ("data2", data2), ("dst", dst)])?;
        let int32 = |t: &Tile| matches!(t.dtype, Dtype::Int32 | Dtype::Uint32);
        let native = engine == Engine::Gpsimd
            && alu::int_native(op)
            && [data1, data2, dst].iter().all(|t| int32(t));
        Ok((a, b, d, op.is_bitvec() || native))
    }

    /// `tensor_tensor`'s values (`bits`: on raw bits).
    pub(crate) fn tensor_tensor_values(
        &mut self, op: AluOp, bits: bool, a: &Opnd, b: &Opnd, d: &Opnd,
    ) -> Result<()> {
        if bits {
            let mut x = self.gather_bits(&a.tile)?;
            let y = self.gather_bits(&b.tile)?;
            let (ta, tb) = (a.tile.dtype, b.tile.dtype);
            for (p, &q) in x.iter_mut().zip(&y) {
                *p = if op.is_bitvec() {
                    alu::apply_bits(op, *p, q)
                } else {
                    alu::apply_int(op, ta.int_value(*p), tb.int_value(q)) as u32
                };
            }
            self.scatter_bits(d, &x)?;
        } else if !self.fast_binary(op, a, b, d) {
            let (x, y) = (self.gather_f32(&a.tile)?, self.gather_f32(&b.tile)?);
            let mut z = vec![0f32; x.len()];
            alu::binary(op, &x, &y, &mut z);
            self.scatter_f32(d, &z)?;
        }
        Ok(())
    }

    /// `tensor_scalar`: `dst = (data <op0> operand0) <op1> operand1` with per-partition (or
    /// constant) operands broadcast along the free dimension; `reverse` swaps an operator's
    /// inputs. Vector, Scalar (only (multiply, add), (multiply), (add) on Trn2) or GpSimd (only
    /// `rsqrt`). Arithmetic operands must be fp32; bitvec operators run on Vector only.
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_scalar(
        &mut self, engine: Engine, dst: &Tile, data: &Tile, op0: AluOp, operand0: &Scalar,
        reverse0: bool, second: Option<&SecondOp>,
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
            return Err(rule("engine", "engine", "bitvec tensor_scalar runs on the Vector engine"));
        }
        let (a, d) = self.data_dst_operands(opc, engine, data, dst)?;
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
        let f = if engine == Engine::Gpsimd { flags::RSQRT } else { 0 };
        self.record_engine(opc, engine, &[&a], &extra, &d, f);
        Ok(())
    }

    /// `scalar_tensor_tensor` (Vector engine): `dst = (data <op0> operand0) <op1> operand1`
    /// with `operand0` a constant or `[P, 1]` tile and `operand1` a tile like `data`.
    #[allow(clippy::too_many_arguments)]
    pub fn scalar_tensor_tensor(
        &mut self, dst: &Tile, data: &Tile, op0: AluOp, operand0: &Scalar, reverse0: bool,
        op1: AluOp, operand1: &Tile, reverse1: bool,
    ) -> Result<()> {
        let opc = Opcode::ScalarTensorTensor;
        let engine = Engine::Vector;
        check_op_pair(op0, op1, |op| {
            op.is_bitvec()
                .then(|| format!("scalar_tensor_tensor takes arithmetic operators; {op} is bitvec"))
        })?;
        let (a, b, d) =
            self.two_tensor_operands(opc, engine, ("data", data), ("operand1", operand1), dst)?;
        let (p, n) = (a.p(), a.n());
        let mut extra = Vec::new();
        let s0 = self.scalar_widened("operand0", operand0, p, engine, &mut extra)?;
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
        let f =
            if op0 == AluOp::Subtract && op1 == AluOp::Multiply { flags::SUB_THEN_MUL } else { 0 };
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

    /// `tensor_copy_dynamic_src` (`opc`; or `_dst`) on the Vector, Scalar or GpSimd engine:
    /// `tensor_copy` with its source (destination) moved along the partitions by the dynamic
    /// offset `offset`, read from the machine's SBUF now. See the module doc.
    pub fn tensor_copy_dynamic(
        &mut self, opc: Opcode, engine: Engine, dst: &Tile, src: &Tile, offset: &DynamicOffset,
    ) -> Result<()> {
        check_engine(opc, engine)?;
        let (o, v) = self.dynamic_offset_value(&offset.tile)?;
        let (src, dst) = if opc == Opcode::TensorCopyDynamicSrc {
            (self.moved("src", src, v, offset)?, *dst)
        } else {
            (*src, self.moved("dst", dst, v, offset)?)
        };
        let s = self.operand("src", &src, Some(engine), false)?;
        let d = self.operand("dst", &dst, Some(engine), true)?;
        self.same_shape(opc, "src", &s, &[("dst", &d)])?;
        self.copy_values(&s, &d)?;
        self.record_engine(opc, engine, &[&s], &[o.region()], &d, 0);
        Ok(())
    }

    /// The checked operand of a dynamic offset and the integer it holds (rule
    /// `dynamic_offset`: one integer element in SBUF, written before).
    fn dynamic_offset_value(&self, t: &Tile) -> Result<(Opnd, i64)> {
        let o = self.operand("offset", t, None, false)?;
        let name = || self.mem.name(t).to_string();
        if t.space != Space::Sbuf {
            let message =
                format!("{} is in {}; a dynamic offset is read from SBUF", name(), t.space.name());
            return Err(rule("offset", DYNAMIC_OFFSET, message));
        }
        if t.elements_u128() != 1 {
            let message = format!(
                "a dynamic offset is one value (a [1, 1] tile); {} gives {:?}",
                name(),
                t.logical_shape_u64()
            );
            return Err(super::shape_rule("offset", DYNAMIC_OFFSET, message));
        }
        if !t.dtype.is_int() {
            let message =
                format!("a dynamic offset is an integer; {} is {}", name(), t.dtype.name());
            return Err(super::dtype_rule("offset", DYNAMIC_OFFSET, message));
        }
        let bits = self.gather_bits(t)?;
        Ok((o, t.dtype.int_value(bits[0])))
    }

    /// `tile` moved `v * offset.step` elements along its partitions: `v` in
    /// `0..offset.limit` (any `v >= 0` when the limit is 0) and the moved access inside its
    /// tensor, else a `ShapeError` naming `arg` (rule `dynamic_offset`).
    fn moved(&self, arg: &str, tile: &Tile, v: i64, offset: &DynamicOffset) -> Result<Tile> {
        self.mem.check_tile(arg, tile)?;
        let refuse = |why: String| {
            let name = self.mem.name(&offset.tile);
            let message = format!("the dynamic offset read from {name} is {v}; {why}");
            super::shape_rule(arg, DYNAMIC_OFFSET, message)
        };
        if v < 0 || (offset.limit > 0 && v >= offset.limit) {
            return Err(refuse(match offset.limit {
                0 => "an offset is 0 or more".to_string(),
                n => format!(
                    "it must be in 0..{n} (the positions of the indexed axis where the access fits)"
                ),
            }));
        }
        let bytes = v as i128 * offset.step as i128 * tile.dtype.size() as i128;
        let mut t = *tile;
        t.offset = i64::try_from(tile.offset as i128 + bytes)
            .map_err(|_| refuse("the moved access is beyond any tensor".into()))?;
        self.mem.check_tile(arg, &t).map_err(|e| {
            refuse(format!(
                "moved by {v} x {} elements the access leaves its tensor ({e})",
                offset.step
            ))
        })?;
        Ok(t)
    }

    /// Copies `s` into `d` (same element count): raw bits when the dtypes are equal, else
    /// widened to float32 (NaN canonical) and rounded to `d`'s dtype.
    pub(crate) fn copy_values(&mut self, s: &Opnd, d: &Opnd) -> Result<()> {
        if s.tile.space != Space::Hbm && d.tile.space != Space::Hbm && self.fast_copy(s, d) {
            return Ok(());
        }
        if s.tile.dtype == d.tile.dtype {
            if self.copy_direct(s, d)? {
                return Ok(());
            }
            // Both halves check the cancellation token (a 1 GiB HBM copy takes seconds).
            let x = self.gather_packed(&s.tile)?;
            self.scatter_raw(d, &x)
        } else {
            if self.copy_convert_direct(s, d)? {
                return Ok(());
            }
            let mut x = self.gather_f32(&s.tile)?;
            // In pieces with the token checked between them, as the gather and scatter are.
            for piece in x.chunks_mut(1 << 20) {
                crate::cancel::check()?;
                piece.iter_mut().for_each(|v| *v = alu::canon(*v));
            }
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
            None => dst.dtype.saturate_int(value.round_ties_even().clamp(-1e18, 1e18) as i64),
        };
        self.scatter_fill(&d, bits)?;
        let f = if value == 0.0 { flags::ZERO_VALUE } else { 0 };
        self.record_engine(opc, engine, &[], &[], &d, f);
        Ok(())
    }

    /// `reciprocal` (Vector engine): `dst = 1 / data` in IEEE float32.
    pub fn reciprocal(&mut self, dst: &Tile, data: &Tile) -> Result<()> {
        let opc = Opcode::Reciprocal;
        let engine = Engine::Vector;
        let (a, d) = self.data_dst_operands(opc, engine, data, dst)?;
        let x = self.gather_f32(data)?;
        let mut z = vec![0f32; x.len()];
        alu::with_scalar(AluOp::Reciprocal, &x, 0.0, false, &mut z);
        self.scatter_f32(&d, &z)?;
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }

    /// `set_rng_seed` (Vector engine): seeds the engine's random stream with the 32-bit value
    /// of `src_seeds` (`[1, 1]`, SBUF or PSUM; its bits, whatever its 32-bit dtype), read when
    /// the instruction is issued. See the module doc for what the dropouts after it draw.
    pub fn set_rng_seed(&mut self, src_seeds: &Tile) -> Result<()> {
        let opc = Opcode::SetRngSeed;
        let engine = Engine::Vector;
        if src_seeds.dtype.size() != 4 {
            return Err(super::dtype_rule(
                "src_seeds",
                "rng_seed_dtype",
                format!("src_seeds is {}; the seed is a 32-bit value", src_seeds.dtype),
            ));
        }
        if src_seeds.partitions != 1 || src_seeds.elements() != 1 {
            return Err(super::shape_rule(
                "src_seeds",
                "shape",
                format!(
                    "src_seeds is {:?}; the seed is a [1, 1] tensor",
                    src_seeds.logical_shape()
                ),
            ));
        }
        let s = self.operand("src_seeds", src_seeds, Some(engine), false)?;
        let bits = self.gather_bits(src_seeds)?;
        self.vector_rng = Some((bits[0], 0));
        let cost = Self::cost_input(1, 1, 0);
        self.program.push(opc, Queue::Engine(engine), &[s.region()], &[], cost);
        Ok(())
    }

    /// The generator and first word of `count` random words an instruction on `engine` draws
    /// (module doc): the Vector engine once seeded (`set_rng_seed`), its seed's stream from
    /// where it stands (which then moves on by `count`); otherwise the unseeded rule, the seed
    /// `s + i` from word 0.
    fn random_words(&mut self, engine: Engine, count: u64) -> (StochasticBits, u64) {
        match (engine, self.vector_rng) {
            (Engine::Vector, Some((seed, drawn))) => {
                self.vector_rng = Some((seed, drawn.wrapping_add(count)));
                (StochasticBits::new(SEEDED_STREAM | u64::from(seed)), drawn)
            }
            _ => {
                let seed = match self.config.rounding {
                    OutputRounding::Stochastic(s) => s,
                    OutputRounding::NearestEven => 0,
                };
                (StochasticBits::new(seed.wrapping_add(self.program.instrs.len() as u64)), 0)
            }
        }
    }

    /// `rng` (Vector or GpSimd engine): 32 random bits for each element of `dst` in logical
    /// order, the least significant `8 * size` kept (integer dtypes only). The words are the
    /// Vector engine's seeded stream after `set_rng_seed` (drawn on from where it stands), on
    /// GpSimd each partition's lane generator after `rand_set_state` (`isa::gpsimd`), else
    /// those of the unseeded dropouts' rule (the seed `s + i`, from word 0).
    pub fn rng(&mut self, engine: Engine, dst: &Tile) -> Result<()> {
        let opc = Opcode::Rng;
        check_engine(opc, engine)?;
        if dst.dtype.format().is_some() || dst.dtype.size() > 4 {
            return Err(super::dtype_rule(
                "dst",
                "rng_dtype",
                format!(
                    "dst is {}; rng writes int8, int16, int32, uint8, uint16 or uint32",
                    dst.dtype
                ),
            ));
        }
        let d = self.operand("dst", dst, Some(engine), true)?;
        let mask = u32::MAX >> (32 - 8 * dst.dtype.size() as u32);
        let lanes = match engine {
            // Its lanes' XORWOW generators once rand_set_state seeded them (`isa::gpsimd`).
            Engine::Gpsimd => self.gpsimd_lane_words(&d, d.n(), mask)?,
            _ => None,
        };
        let w = match lanes {
            Some(w) => w,
            None => {
                let count = (d.p() as usize).saturating_mul(d.n());
                let mut w = crate::host::zeroed_vec::<u32>("dst", "the random words", count)?;
                // Drawn (the stream moved on) only once the instruction can run.
                let (bits, first) = self.random_words(engine, count as u64);
                bits.fill(first, &mut w, mask);
                w
            }
        };
        self.scatter_bits(&d, &w)?;
        self.record_engine(opc, engine, &[], &[], &d, 0);
        Ok(())
    }

    /// `dropout` (Vector engine): each element of `data` zeroed with the drop probability
    /// `prob` (a constant or a `[P, 1]` tile, one per partition), else kept. See the module doc
    /// for the random stream (ours, not the chip's).
    pub fn dropout(&mut self, dst: &Tile, data: &Tile, prob: &Scalar) -> Result<()> {
        let opc = Opcode::Dropout;
        let engine = Engine::Vector;
        let int_data = data.dtype.format().is_none();
        if int_data && dst.dtype != data.dtype {
            return Err(super::dtype_rule(
                "dst",
                "dropout_dtype",
                format!(
                    "dst is {}, data {}; dropout keeps an integer data's dtype",
                    dst.dtype, data.dtype
                ),
            ));
        }
        let (a, d) = self.data_dst_operands(opc, engine, data, dst)?;
        let (p, n) = (a.p() as usize, a.n());
        let mut extra: Vec<Region> = Vec::new();
        let probs: Vec<f32> = match prob {
            Scalar::Imm(v) => vec![*v as f32; p],
            Scalar::Tile(t) => {
                if t.dtype.format().is_none() || (int_data && t.dtype != Dtype::Fp32) {
                    return Err(super::dtype_rule(
                        "prob",
                        "dropout_dtype",
                        format!("prob is {}; a float tile (float32 for integer data)", t.dtype),
                    ));
                }
                let o = self.operand("prob", t, Some(engine), false)?;
                self.check_vector_operand("prob", &o, p as u32)?;
                extra.push(o.region());
                self.gather_f32(t)?
            }
        };
        if let Some((row, q)) = probs.iter().enumerate().find(|(_, q)| !(0.0..=1.0).contains(*q)) {
            return Err(Error::value(
                "prob",
                format!("{q} (partition {row}); a drop probability is in [0, 1]"),
            ));
        }
        let (bits, first) = self.random_words(engine, (p as u64).saturating_mul(n as u64));
        // Dropped when word < prob * 2^32 (exact in float64): prob 1 drops every element.
        let dropped = |k: usize| {
            (bits.word(first.wrapping_add(k as u64)) as f64)
                < probs[k / n.max(1)] as f64 * 4294967296.0
        };
        if dst.dtype == data.dtype {
            let mut w = self.gather_bits(data)?;
            for (k, v) in w.iter_mut().enumerate() {
                if dropped(k) {
                    *v = 0;
                }
            }
            self.scatter_bits(&d, &w)?;
        } else {
            let mut x = self.gather_f32(data)?;
            for (k, v) in x.iter_mut().enumerate() {
                *v = if dropped(k) { 0.0 } else { alu::canon(*v) };
            }
            self.scatter_f32(&d, &x)?;
        }
        self.record_engine(opc, engine, &[&a], &extra, &d, 0);
        Ok(())
    }

    /// `select` (Vector engine): `dst = predicate != 0 ? on_true : on_false` element-wise
    /// (`predicate` widened to float32; NaN counts as true). Bit-exact when `on_true`,
    /// `on_false` (a tile) and `dst` share a dtype, else through float32.
    pub fn select(
        &mut self, dst: &Tile, predicate: &Tile, on_true: &Tile, on_false: &Scalar,
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
        let psum_inputs =
            [pr.region(), t.region()].iter().chain(&extra).filter(|r| r.mem == MEM_PSUM).count();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineConfig;

    /// The dynamic copies move their side by the offset the machine reads from its SBUF, bit
    /// for bit (NaN payloads kept), against an oracle of column indices; each rule names its
    /// argument: the moved side for a value out of range, `offset` for its place, shape, dtype.
    #[test]
    fn dynamic_copies_read_their_offset_from_sbuf() {
        use crate::machine::tile::Index;
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n, w) = (4usize, 16usize, 3usize);
        let src = m.alloc(Space::Sbuf, "src", &[p, n], Dtype::Fp32).expect("src");
        let sv: Vec<u32> = (0..p * n).map(|k| 0x7FC0_0000 | k as u32).collect();
        super::super::test_util::put_words(&mut m, &src, &sv, 4);
        let off = m.alloc(Space::Sbuf, "off", &[1, 1], Dtype::Int32).expect("off");
        let small = m.alloc(Space::Sbuf, "small", &[p, w], Dtype::Fp32).expect("small");
        let big = m.alloc(Space::Sbuf, "big", &[p, n], Dtype::Fp32).expect("big");
        let cols = |t: &Tile, a: i64, b: i64, step: i64| {
            let r = Index::Range { start: Some(a), stop: Some(b), step };
            t.slice(&[Index::ALL, r]).expect("columns")
        };
        let dynamic = |tile: Tile, step: i64, limit: i64| DynamicOffset { tile, step, limit };
        let (v_src, v_dst) = (Opcode::TensorCopyDynamicSrc, Opcode::TensorCopyDynamicDst);
        // src: columns 0, 2, 4 moved by 5 x 1 -> columns 5, 7, 9.
        super::super::test_util::put_words(&mut m, &off, &[5], 4);
        let strided = cols(&src, 0, 6, 2);
        m.tensor_copy_dynamic(v_src, Engine::Vector, &small, &strided, &dynamic(off, 1, 10))
            .expect("src");
        let want: Vec<u32> = (0..p).flat_map(|r| [5, 7, 9].map(|c| sv[r * n + c])).collect();
        assert_eq!(m.gather_bits(&small).expect("small"), want);
        // dst: columns 0..3 moved by 4 x 3 -> columns 12..15, on GpSimd.
        super::super::test_util::put_words(&mut m, &off, &[4], 4);
        m.memset(Engine::Vector, &big, 0.0).expect("memset");
        let first = cols(&big, 0, 3, 1);
        m.tensor_copy_dynamic(v_dst, Engine::Gpsimd, &first, &small, &dynamic(off, 3, 0))
            .expect("dst");
        let got = m.gather_bits(&big).expect("big");
        for r in 0..p {
            for c in 0..n {
                let want = if (12..15).contains(&c) { want[r * w + c - 12] } else { 0 };
                assert_eq!(got[r * n + c], want, "partition {r} column {c}");
            }
        }
        // Out of range: the limit, the tensor's end, a negative value (int8 0xFF = -1).
        let refused = |m: &mut Machine, opc, d: &Tile, s: &Tile, o: DynamicOffset, arg: &str| {
            let e = m.tensor_copy_dynamic(opc, Engine::Vector, d, s, &o).expect_err("refused");
            assert_eq!((e.arg(), e.rule()), (Some(arg), Some(DYNAMIC_OFFSET)), "{e}");
            e.to_string()
        };
        let e = refused(&mut m, v_src, &small, &strided, dynamic(off, 1, 4), "src");
        assert!(e.contains("is 4; it must be in 0..4"), "{e}");
        let e = refused(&mut m, v_dst, &first, &small, dynamic(off, 4, 0), "dst");
        assert!(e.contains("leaves its tensor"), "{e}");
        let neg = m.alloc(Space::Sbuf, "neg", &[1, 1], Dtype::Int8).expect("neg");
        super::super::test_util::put_words(&mut m, &neg, &[0xFF], 1);
        let e = refused(&mut m, v_src, &small, &strided, dynamic(neg, 1, 0), "src");
        assert!(e.contains("is -1"), "{e}");
        // The offset itself: SBUF, one element, an integer.
        let ps = m.alloc(Space::Psum, "ps", &[1, 1], Dtype::Int32).expect("ps");
        super::super::test_util::put_words(&mut m, &ps, &[0], 4);
        let two = m.alloc(Space::Sbuf, "two", &[1, 2], Dtype::Int32).expect("two");
        super::super::test_util::put_words(&mut m, &two, &[0, 0], 4);
        let fl = m.alloc(Space::Sbuf, "fl", &[1, 1], Dtype::Fp32).expect("fl");
        super::super::test_util::put_words(&mut m, &fl, &[0], 4);
        for bad in [ps, two, fl] {
            refused(&mut m, v_src, &small, &strided, dynamic(bad, 1, 0), "offset");
        }
        // Never written: the uninitialized-read rule on offset.
        let fresh = m.alloc(Space::Sbuf, "fresh", &[1, 1], Dtype::Int32).expect("fresh");
        let e = m
            .tensor_copy_dynamic(v_src, Engine::Vector, &small, &strided, &dynamic(fresh, 1, 0))
            .expect_err("unwritten");
        assert_eq!(e.arg(), Some("offset"), "{e}");
    }

    fn bits16(m: &Machine, t: &Tile) -> Vec<u16> {
        let b = m.read_tile(t).expect("read");
        b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
    }

    /// Each element kept or zeroed by the generator's word for its flat index, keyed by the
    /// instruction's index: int32 bits above 2^24 survive, prob 0 keeps and 1 drops a whole
    /// partition, a float32 -> bf16 call goes through float32; the rules name their argument.
    #[test]
    fn dropout_against_the_generators_words() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (4usize, 300usize);
        let mut tile = |name: &str, shape: &[usize], dt: Dtype| {
            m.alloc(Space::Sbuf, name, shape, dt).expect(name)
        };
        let (xi, di) = (tile("xi", &[p, n], Dtype::Int32), tile("di", &[p, n], Dtype::Int32));
        let (xf, db) = (tile("xf", &[p, n], Dtype::Fp32), tile("db", &[p, n], Dtype::Bf16));
        let (pt, pb) = (tile("pt", &[p, 1], Dtype::Fp32), tile("pb", &[p, 1], Dtype::Bf16));
        let iv: Vec<u32> = (0..p * n).map(|k| (k as u32).wrapping_mul(0x9E37_79B9) | 1).collect();
        super::super::test_util::put_words(&mut m, &xi, &iv, 4);
        let fv: Vec<u32> = (0..p * n).map(|k| ((k % 64) as f32 - 32.0).to_bits()).collect();
        super::super::test_util::put_words(&mut m, &xf, &fv, 4);
        let probs = [0.0f32, 1.0, 0.25, 0.5];
        let pw: Vec<u32> = probs.iter().map(|v| v.to_bits()).collect();
        super::super::test_util::put_words(&mut m, &pt, &pw, 4);
        let calls = [(&xi, &di, Scalar::Tile(pt)), (&xf, &db, Scalar::Imm(0.3))];
        for (k, (x, d, prob)) in calls.iter().enumerate() {
            let bits = StochasticBits::new(m.program.instrs.len() as u64);
            m.dropout(d, x, prob).expect("dropout");
            let got = m.read_tile(d).expect("read");
            let mut kept = 0usize;
            for i in 0..p * n {
                let q = match prob {
                    Scalar::Tile(_) => probs[i / n],
                    Scalar::Imm(v) => *v as f32,
                };
                let drop = (bits.word(i as u64) as f64) < q as f64 * 4294967296.0;
                let want = match (drop, k) {
                    (true, _) => 0,
                    (false, 0) => iv[i],
                    (false, _) => fv[i] >> 16, // small integers: exact in bf16
                };
                let w = if k == 0 {
                    u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().expect("4"))
                } else {
                    u16::from_le_bytes([got[2 * i], got[2 * i + 1]]) as u32
                };
                assert_eq!(w, want, "call {k} element {i}");
                kept += usize::from(!drop);
                if k == 0 && i / n < 2 {
                    assert_eq!(drop, i / n == 1, "prob 0 keeps, 1 drops");
                }
            }
            let frac = kept as f64 / (p * n) as f64;
            let expect = if k == 0 { 1.0 - 1.75 / 4.0 } else { 0.7 };
            assert!((frac - expect).abs() < 0.05, "call {k}: kept {frac}");
        }
        let e = m.dropout(&db, &xi, &Scalar::Imm(0.5)).expect_err("int to bf16");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("dropout_dtype")));
        let e = m.dropout(&di, &xi, &Scalar::Tile(pb)).expect_err("bf16 prob");
        assert_eq!((e.arg(), e.rule()), (Some("prob"), Some("dropout_dtype")));
        let e = m.dropout(&di, &xi, &Scalar::Imm(1.5)).expect_err("prob 1.5");
        assert_eq!(e.arg(), Some("prob"));
    }

    /// `rng` writes the stream's words, truncated to dst's integer width: on the Vector engine
    /// after `set_rng_seed`, the seeded stream in order (shared with the dropouts); on GpSimd
    /// not seeded by rand_set_state, the unseeded rule, seed `s + i`.
    #[test]
    fn rng_writes_the_engines_stream_truncated_to_dst() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let seed = m.alloc(Space::Sbuf, "seed", &[1, 1], Dtype::Int32).expect("seed");
        super::super::test_util::put_words(&mut m, &seed, &[7], 4);
        let w32 = m.alloc(Space::Psum, "w32", &[2, 5], Dtype::Uint32).expect("w32");
        let w8 = m.alloc(Space::Sbuf, "w8", &[1, 4], Dtype::Int8).expect("w8");
        let g16 = m.alloc(Space::Sbuf, "g16", &[3, 2], Dtype::Uint16).expect("g16");
        let read = super::super::test_util::read_words;
        m.set_rng_seed(&seed).expect("seed");
        let seeded = StochasticBits::new((1 << 32) | 7);
        m.rng(Engine::Vector, &w32).expect("rng");
        m.rng(Engine::Vector, &w8).expect("rng");
        let want: Vec<u32> = (0..10).map(|k| seeded.word(k)).collect();
        assert_eq!(read(&m, &w32, 4), want);
        let want: Vec<u32> = (10..14).map(|k| seeded.word(k) & 0xFF).collect();
        assert_eq!(read(&m, &w8, 1), want);
        let i = m.program.instrs.len() as u64;
        m.rng(Engine::Gpsimd, &g16).expect("rng");
        let want: Vec<u32> = (0..6).map(|k| StochasticBits::new(i).word(k) & 0xFFFF).collect();
        assert_eq!(read(&m, &g16, 2), want);
        let f = m.alloc(Space::Sbuf, "f", &[1, 4], Dtype::Fp32).expect("f");
        let e = m.rng(Engine::Vector, &f).expect_err("float dst");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("rng_dtype")));
        assert!(m.rng(Engine::Gpsimd, &w32).is_err(), "GpSimd cannot write PSUM");
        assert!(m.rng(Engine::Scalar, &w8).is_err(), "Vector or GpSimd only");
    }

    /// After `set_rng_seed(v)` the dropouts draw the words of the generator for 2^32 + v in
    /// order (the second dropout goes on where the first stopped), whatever their index; a
    /// second `set_rng_seed` restarts the stream. The seed's rules: 32 bits, `[1, 1]`.
    #[test]
    fn seeded_dropouts_draw_one_stream_in_order() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (3usize, 50usize);
        let x = m.alloc(Space::Sbuf, "x", &[p, n], Dtype::Int32).expect("x");
        let d = m.alloc(Space::Sbuf, "d", &[p, n], Dtype::Int32).expect("d");
        let seed = m.alloc(Space::Psum, "seed", &[1, 1], Dtype::Uint32).expect("seed");
        let xv: Vec<u32> = (0..p * n).map(|k| k as u32 + 1).collect();
        super::super::test_util::put_words(&mut m, &x, &xv, 4);
        super::super::test_util::put_words(&mut m, &seed, &[0xDEAD_BEEF], 4);
        let bits = StochasticBits::new((1 << 32) | 0xDEAD_BEEF);
        let check = |m: &mut Machine, first: u64| {
            m.dropout(&d, &x, &Scalar::Imm(0.5)).expect("dropout");
            let got = m.read_tile(&d).expect("read");
            for (i, v) in xv.iter().enumerate() {
                let drop = (bits.word(first + i as u64) as f64) < 0.5 * 4294967296.0;
                let w = u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().expect("4"));
                assert_eq!(w, if drop { 0 } else { *v }, "word {}", first + i as u64);
            }
        };
        m.set_rng_seed(&seed).expect("seed");
        check(&mut m, 0);
        check(&mut m, (p * n) as u64);
        m.set_rng_seed(&seed).expect("seed again");
        check(&mut m, 0);
        let wrong = [
            (m.alloc(Space::Sbuf, "h", &[1, 1], Dtype::Fp16).expect("h"), "rng_seed_dtype"),
            (m.alloc(Space::Sbuf, "w", &[1, 2], Dtype::Int32).expect("w"), "shape"),
            (m.alloc(Space::Sbuf, "t", &[2, 1], Dtype::Int32).expect("t"), "shape"),
        ];
        for (t, rule) in wrong {
            let e = m.set_rng_seed(&t).expect_err("refused");
            assert_eq!((e.arg(), e.rule()), (Some("src_seeds"), Some(rule)), "{e}");
        }
    }

    /// The oracle moves rows of a copy of the whole SBUF view partition by partition, from the
    /// documented rule; bf16 elements include NaN payloads and -0 (bits must survive).
    #[test]
    fn stream_shuffle_against_a_row_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let n = 6usize;
        let all = m.alloc(Space::Sbuf, "all", &[128, n], Dtype::Bf16).expect("a");
        let init: Vec<u16> = (0..128 * n)
            .map(|k| match k % 7 {
                0 => 0x7FC1,
                1 => 0x8000,
                _ => (k as u16).wrapping_mul(0x9E37),
            })
            .collect();
        let bytes: Vec<u8> = init.iter().flat_map(|v| v.to_le_bytes()).collect();
        m.write_tile(&all, &bytes).expect("write");
        let part = |t: &Tile, p0: u32, pn: u32| Tile {
            start_partition: t.start_partition + p0,
            partitions: pn,
            ..*t
        };
        let mut mask: Vec<i64> = (0..32).map(|i| (i * 7 + 3) % 32).collect();
        mask[5] = 255;
        mask[30] = 255;
        // (src start, src partitions, dst start, dst partitions)
        let cases = [(0, 128, 0, 128), (32, 32, 96, 32), (64, 64, 0, 64), (0, 64, 0, 64)];
        let mut want = init.clone();
        for &(s0, sp, d0, dp) in &cases {
            let (src, dst) = (part(&all, s0, sp), part(&all, d0, dp));
            let snapshot = want.clone();
            for i in 0..dp as usize {
                let mi = mask[i % 32];
                if mi == 255 {
                    continue;
                }
                let s = s0 as usize + i / 32 * 32 + mi as usize;
                let d = d0 as usize + i;
                want[d * n..(d + 1) * n].copy_from_slice(&snapshot[s * n..(s + 1) * n]);
            }
            m.nc_stream_shuffle(&dst, &src, &mask).expect("shuffle");
            assert_eq!(bits16(&m, &all), want, "case {s0} {sp} {d0} {dp}");
        }
        // The rules, each naming its argument.
        let e = m.nc_stream_shuffle(&all, &all, &mask[..31]).expect_err("31");
        assert_eq!((e.arg(), e.rule()), (Some("shuffle_mask"), Some("shuffle_mask")));
        let mut wide = mask.clone();
        wide[2] = 40;
        let e = m.nc_stream_shuffle(&all, &all, &wide).expect_err("40");
        assert_eq!((e.arg(), e.rule()), (Some("shuffle_mask"), Some("shuffle_mask")));
        let e = m
            .nc_stream_shuffle(&part(&all, 0, 16), &part(&all, 0, 16), &mask)
            .expect_err("src partition 20 of 16");
        assert_eq!(e.rule(), Some("shuffle_mask"));
        let e = m
            .nc_stream_shuffle(&part(&all, 32, 32), &part(&all, 0, 64), &mask)
            .expect_err("64 active partitions start at 0 or 64");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("start_partition")));
        let f = m.alloc(Space::Sbuf, "f", &[128, n], Dtype::Fp32).expect("f");
        let e = m.nc_stream_shuffle(&f, &all, &mask).expect_err("dtype");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("shuffle_dtype")));
    }
}
