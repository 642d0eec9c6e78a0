//! Reductions and scans of the Vector engine: `tensor_reduce`, `tensor_tensor_scan`,
//! `tensor_scalar_reduce`, `bn_stats`, `bn_aggr`.
//!
//! # Orders (ours; the hardware's are not published)
//!
//! - `tensor_reduce`: per partition and output element, the reduced elements in logical (C)
//!   order: `acc = x[0]`, then `acc = op(acc, x[i])` for `i = 1, 2, ...`; `negate` flips the
//!   sign of the result.
//! - `tensor_tensor_scan`: the state is kept in float32 (not rounded to `dst`'s dtype):
//!   `state = initial; out[i] = state = op1(op0(data0[i], state), data1[i])`.
//! - `tensor_scalar_reduce`: the per-partition register takes `op0`'s float32 results in order:
//!   `reg = reduce_op(reg, r[i])`, after `reset_reduce` (the operator's identity: 0, 1, -Inf,
//!   +Inf), `load_reduce` (`reduce_init`) or `reduce` (the register as it is).
//! - `bn_stats`: for the even-indexed and the odd-indexed elements of each partition:
//!   `count`; `mean = sum / count` with `sum` from +0 in order; `m2 = sum of (x - mean)^2` from
//!   +0 in order (each difference, square and sum rounded to float32); count 0 gives mean 0 and
//!   m2 0. Output `[count_even, mean_even, m2_even, count_odd, mean_odd, m2_odd]`.
//! - `bn_aggr`, over the `(count, mean, m2)` triples in order, all float32: `n = sum count`,
//!   `mean = (sum count * mean) / n`, `var = (sum m2 + count * ((mean_i - mean)^2)) / n`, each
//!   sum from +0 in order, each product and difference rounded; output `[mean, var]`.
use crate::{Error, Result};

use super::super::record::{flags, Engine, Opcode, Queue, Region};
use super::super::Machine;
use super::alu::{self, canon, AluOp};
use super::elementwise::two_psum_check;
use super::{shape_rule, Opnd, ReduceCmd, Scalar};
use crate::machine::tile::Tile;
use crate::spec::BN_STATS_FMAX;

/// The identity of a reduction operator (what `reset_reduce` loads).
fn identity(op: AluOp) -> f32 {
    match op {
        AluOp::Multiply => 1.0,
        AluOp::Maximum => f32::NEG_INFINITY,
        AluOp::Minimum => f32::INFINITY,
        _ => 0.0,
    }
}

impl Machine {
    /// `tensor_reduce` (Vector engine): reduces the last `axes` free dimensions of `data` with
    /// `op`; `dst` holds the remaining elements per partition. See the module doc for the order.
    pub fn tensor_reduce(
        &mut self,
        dst: &Tile,
        op: AluOp,
        data: &Tile,
        axes: usize,
        negate: bool,
    ) -> Result<()> {
        let opc = Opcode::TensorReduce;
        let engine = Engine::Vector;
        if !op.reduces() {
            return Err(Error::value(
                "op",
                format!("{op} is not a reduction operator (add, subtract, multiply, maximum, minimum, logical and bitwise and/or/xor)"),
            ));
        }
        if axes == 0 || axes > data.ndim as usize {
            return Err(Error::value(
                "axis",
                format!(
                    "reduces the last {axes} free axes, but data has {} free axes; the reduced \
                     axes are the last 1..={} (the partition axis cannot be reduced)",
                    data.ndim, data.ndim
                ),
            ));
        }
        if negate && op.is_bitvec() {
            return Err(Error::value(
                "negate",
                "negate applies to arithmetic operators only",
            ));
        }
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        let nd = data.ndim as usize;
        let r: usize = data.shape[nd - axes..nd]
            .iter()
            .map(|&s| s as usize)
            .product();
        let kept = a.n() / r;
        if d.p() != a.p() || d.n() != kept {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "reducing the last {axes} axes of {:?} leaves {} x {kept}; dst is {:?}",
                    data.logical_shape(),
                    a.p(),
                    dst.logical_shape()
                ),
            ));
        }
        self.check_op_dtypes(op, "op", &[("data", data), ("dst", dst)])?;
        if op.is_bitvec() {
            let z: Vec<u32> = self
                .gather_bits(data)?
                .chunks(r)
                .map(|c| {
                    c[1..]
                        .iter()
                        .fold(c[0], |acc, &v| alu::apply_bits(op, acc, v))
                })
                .collect();
            self.scatter_bits(&d, &z)?;
        } else {
            let z: Vec<f32> = self
                .gather_f32(data)?
                .chunks(r)
                .map(|c| {
                    let acc = c[1..]
                        .iter()
                        .fold(canon(c[0]), |acc, &v| alu::apply(op, acc, v));
                    if negate {
                        canon(-acc)
                    } else {
                        acc
                    }
                })
                .collect();
            self.scatter_f32(&d, &z)?;
        }
        let f = if matches!(op, AluOp::Add | AluOp::Maximum) {
            flags::ADD_OR_MAX
        } else {
            0
        };
        self.record_engine(opc, engine, &[&a], &[], &d, f);
        Ok(())
    }

    /// `tensor_tensor_scan` (Vector engine): per partition,
    /// `out[i] = op1(op0(data0[i], out[i - 1]), data1[i])` from `out[-1] = initial`;
    /// `reverse0` makes `data0` the right-hand side of `op0`, `reverse1` makes `data1` the
    /// left-hand side of `op1`.
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_tensor_scan(
        &mut self,
        dst: &Tile,
        data0: &Tile,
        data1: &Tile,
        initial: &Scalar,
        op0: AluOp,
        op1: AluOp,
        reverse0: bool,
        reverse1: bool,
    ) -> Result<()> {
        let opc = Opcode::TensorTensorScan;
        let engine = Engine::Vector;
        for (arg, op) in [("op0", op0), ("op1", op1)] {
            if op.is_bitvec() || op.is_unary() {
                return Err(Error::value(
                    arg,
                    format!("tensor_tensor_scan takes binary arithmetic operators; got {op}"),
                ));
            }
        }
        let a = self.operand("data0", data0, Some(engine), false)?;
        let b = self.operand("data1", data1, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        two_psum_check(opc, ("data0", &a), ("data1", &b))?;
        self.same_shape(opc, "data0", &a, &[("data1", &b), ("dst", &d)])?;
        let (p, n) = (a.p(), a.n());
        let mut extra = Vec::new();
        let s0 = self.scalar_f32("initial", initial, p, engine, &mut extra)?;
        let mut x = self.gather_f32(data0)?;
        let y = self.gather_f32(data1)?;
        for (row, (xi, yi)) in x.chunks_mut(n).zip(y.chunks(n)).enumerate() {
            let mut state = canon(s0[row]);
            for (v, &w) in xi.iter_mut().zip(yi) {
                let t = alu::apply_ordered(op0, *v, state, reverse0);
                state = alu::apply_ordered(op1, t, w, reverse1);
                *v = state;
            }
        }
        self.scatter_f32(&d, &x)?;
        self.record_engine(opc, engine, &[&a, &b], &extra, &d, 0);
        Ok(())
    }

    /// `tensor_scalar_reduce` (Vector engine): `dst = data <op0> operand0`, and the Vector
    /// engine's per-partition registers reduce the float32 results with `reduce_op` (add,
    /// multiply, maximum, minimum) under `reduce_cmd`; `reduce_res` (`[P, 1]`), if given,
    /// receives the registers (negated with `negate`).
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_scalar_reduce(
        &mut self,
        dst: &Tile,
        data: &Tile,
        op0: AluOp,
        operand0: &Scalar,
        reverse0: bool,
        reduce_op: AluOp,
        reduce_res: Option<&Tile>,
        reduce_cmd: ReduceCmd,
        reduce_init: Option<&Scalar>,
        negate: bool,
    ) -> Result<()> {
        let opc = Opcode::TensorScalarReduce;
        let engine = Engine::Vector;
        if op0.is_bitvec() {
            return Err(Error::value(
                "op0",
                "tensor_scalar_reduce takes an arithmetic operator",
            ));
        }
        if !matches!(
            reduce_op,
            AluOp::Add | AluOp::Multiply | AluOp::Maximum | AluOp::Minimum
        ) {
            return Err(Error::value(
                "reduce_op",
                format!("got {reduce_op}; tensor_scalar_reduce reduces with add, multiply, maximum or minimum"),
            ));
        }
        if !matches!(
            reduce_cmd,
            ReduceCmd::ResetReduce | ReduceCmd::Reduce | ReduceCmd::LoadReduce
        ) {
            return Err(Error::value(
                "reduce_cmd",
                format!(
                    "got {}; tensor_scalar_reduce takes reset_reduce, reduce or load_reduce",
                    reduce_cmd.name()
                ),
            ));
        }
        if (reduce_cmd == ReduceCmd::LoadReduce) != reduce_init.is_some() {
            return Err(Error::value(
                "reduce_init",
                "reduce_init is given exactly when reduce_cmd is load_reduce",
            ));
        }
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "data", &a, &[("dst", &d)])?;
        let (p, n) = (a.p(), a.n());
        let res = match reduce_res {
            Some(t) => {
                let o = self.operand("reduce_res", t, Some(engine), true)?;
                check_reduce_res(&o, p)?;
                Some(o)
            }
            None => None,
        };
        let mut extra = Vec::new();
        let s0 = self.scalar_f32("operand0", operand0, p, engine, &mut extra)?;
        let init = match reduce_init {
            Some(ri) => self.scalar_f32("reduce_init", ri, p, engine, &mut extra)?,
            None => Vec::new(),
        };
        let x = self.gather_f32(data)?;
        let mut z = vec![0f32; x.len()];
        let rev0 = reverse0 && !op0.is_unary();
        let p0 = dst.start_partition as usize;
        for (row, (xi, zi)) in x.chunks(n).zip(z.chunks_mut(n)).enumerate() {
            alu::with_scalar(op0, xi, s0[row], rev0, zi);
            let reg = &mut self.dve_regs[p0 + row];
            *reg = match reduce_cmd {
                ReduceCmd::ResetReduce => identity(reduce_op),
                ReduceCmd::LoadReduce => canon(init[row]),
                _ => *reg,
            };
            for &v in zi.iter() {
                *reg = alu::apply(reduce_op, *reg, v);
            }
        }
        self.scatter_f32(&d, &z)?;
        let mut f = 0;
        let mut writes = vec![d.region()];
        if let Some(o) = &res {
            let vals: Vec<f32> = self.dve_regs[p0..p0 + p as usize]
                .iter()
                .map(|&v| if negate { canon(-v) } else { v })
                .collect();
            self.scatter_f32(o, &vals)?;
            writes.push(o.region());
            f = flags::READ_ACCUMULATOR;
        }
        let mut reads: Vec<Region> = vec![a.region()];
        reads.extend_from_slice(&extra);
        let cost = Self::cost_input(n, p, super::operand_flags(&[&a], Some(&d)) | f);
        self.record(opc, Queue::Engine(engine), &reads, &writes, cost);
        Ok(())
    }

    /// `bn_stats` (Vector engine): per partition, `[count, mean, m2]` of the even-indexed and
    /// of the odd-indexed elements of `data` (at most 512 per partition) into 6 elements of
    /// `dst`. See the module doc for the order.
    pub fn bn_stats(&mut self, dst: &Tile, data: &Tile) -> Result<()> {
        let opc = Opcode::BnStats;
        let engine = Engine::Vector;
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        if a.n() > BN_STATS_FMAX {
            return Err(shape_rule(
                "data",
                "bn_stats_fmax",
                format!(
                    "{} elements per partition; bn_stats reads at most {BN_STATS_FMAX}",
                    a.n()
                ),
            ));
        }
        if d.p() != a.p() || d.n() != 6 {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "bn_stats writes [{}, 6]; dst is {:?}",
                    a.p(),
                    dst.logical_shape()
                ),
            ));
        }
        let n = a.n();
        let x = self.gather_f32(data)?;
        let mut z = Vec::with_capacity(6 * a.p() as usize);
        for row in x.chunks(n) {
            for parity in 0..2 {
                let vals = row.iter().skip(parity).step_by(2);
                let count = vals.clone().count() as f32;
                if count == 0.0 {
                    z.extend([0.0, 0.0, 0.0]);
                    continue;
                }
                let sum = vals.clone().fold(0.0f32, |s, &v| s + v);
                let mean = canon(sum / count);
                let m2 = vals.fold(0.0f32, |s, &v| {
                    let dlt = v - mean;
                    s + dlt * dlt
                });
                z.extend([count, mean, canon(m2)]);
            }
        }
        self.scatter_f32(&d, &z)?;
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }

    /// `bn_aggr` (Vector engine): the mean and variance per partition from `bn_stats` triples
    /// (`data` has a multiple of 3 elements per partition) into 2 elements of `dst`.
    pub fn bn_aggr(&mut self, dst: &Tile, data: &Tile) -> Result<()> {
        let opc = Opcode::BnAggr;
        let engine = Engine::Vector;
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        if !a.n().is_multiple_of(3) {
            return Err(shape_rule(
                "data",
                "shape",
                format!(
                    "{} elements per partition; bn_aggr reads (count, mean, m2) triples",
                    a.n()
                ),
            ));
        }
        if d.p() != a.p() || d.n() != 2 {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "bn_aggr writes [{}, 2]; dst is {:?}",
                    a.p(),
                    dst.logical_shape()
                ),
            ));
        }
        let n = a.n();
        let x = self.gather_f32(data)?;
        let mut z = Vec::with_capacity(2 * a.p() as usize);
        for row in x.chunks(n) {
            let (total, sum) = row
                .chunks(3)
                .fold((0.0f32, 0.0f32), |(t, s), c| (t + c[0], s + c[0] * c[1]));
            let mean = sum / total;
            let q = row.chunks(3).fold(0.0f32, |q, c| {
                let dlt = c[1] - mean;
                q + (c[2] + c[0] * (dlt * dlt))
            });
            z.extend([canon(mean), canon(q / total)]);
        }
        self.scatter_f32(&d, &z)?;
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }
}

/// Checks a `[P, 1]` accumulator-readout tile.
pub(crate) fn check_reduce_res(o: &Opnd, p: u32) -> Result<()> {
    if o.p() != p || o.n() != 1 {
        return Err(shape_rule(
            "reduce_res",
            "shape",
            format!("expected a [{p}, 1] tile, got {:?}", o.tile.logical_shape()),
        ));
    }
    Ok(())
}

