//! Reductions and scans of the Vector engine: `tensor_reduce`, `tensor_tensor_scan`,
//! `tensor_scalar_reduce`, `tensor_scalar_cumulative`, `range_select`, `select_reduce`,
//! `exponential`, `bn_stats`, `bn_aggr`, and the top-8 search `max8` /
//! `nc_find_index8` / `nc_match_replace8`.
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
//! - `range_select` (the select and the index comparison in float32 are documented; the rest
//!   is ours): element `j` of a partition (its free axes flattened) is kept when
//!   `comp_op0(f32(range_start + j), bound0) and comp_op1(f32(range_start + j), bound1)`, else it
//!   becomes `on_false_value` (the documented only value, float32's lowest); the kept values
//!   widened to float32, a NaN canonical; the register takes the float32 results in order,
//!   `reg = max(reg, r[j])`, before they are rounded to `dst`'s dtype (so a bf16 `dst` holds
//!   -inf where `reduce_res` holds float32's lowest, as the documentation's note describes).
//! - `select_reduce` (the select and the maximum are documented; the rest is ours): element
//!   `i` is `on_true[i]` where `predicate[i] != 0` (negated by `reverse_pred`: a logical not,
//!   where the documentation's numpy `~` on an integer tile would be bitwise), else the
//!   partition's `on_false` value; both widened to float32, a NaN canonical; with `reduce_cmd`
//!   `reset_reduce` (the register from -Inf) or `reduce`, `reg = max(reg, r[i])` over the
//!   float32 results in order, before they are rounded to `dst`'s dtype; `idle` leaves the
//!   register as it is; `reduce_res`, when given, receives the register.
//! - `exponential` (the formula and the accumulator's commands are documented; the rest is
//!   ours): `r[i] = exp(f32(src[i] - max_value))`, the subtraction in float32 and `exp` as the
//!   activation functions define it (act.rs: float64 `exp` rounded once; not the chip's bits);
//!   with `reduce_cmd` `reset_reduce` (the register from +0), `load_reduce` (`reduce_init`) or
//!   `reduce`, `reg = reg + r[i]` over the float32 results in order, before they are rounded
//!   to `dst`'s dtype; `idle` (the default) leaves the register as it is; `reduce_res`, when
//!   given, receives the register.
//! - `tensor_scalar_cumulative` (the documented pseudocode, taken literally): per partition,
//!   the register set by `reduce_cmd` (`reset_reduce`: 0 for add and subtract, 1 for multiply,
//!   -Inf for maximum, +Inf for minimum; `load_reduce`: `imm1`; `reduce`: as it is), then for
//!   each element in order `reg = op1(op0(x[i], imm0), reg)` in float32 (so subtract gives
//!   `op0(x[i]) - reg`, the pseudocode's operand order) and `dst[i] = reg` rounded to `dst`'s
//!   dtype; the register keeps the last value for a following `reduce`.
//! - `bn_stats`: for the even-indexed and the odd-indexed elements of each partition:
//!   `count`; `mean = sum / count` with `sum` from +0 in order; `m2 = sum of (x - mean)^2` from
//!   +0 in order (each difference, square and sum rounded to float32); count 0 gives mean 0 and
//!   m2 0. Output `[count_even, mean_even, m2_even, count_odd, mean_odd, m2_odd]`.
//! - `bn_aggr`, over the `(count, mean, m2)` triples in order, all float32: `n = sum count`,
//!   `mean = (sum count * mean) / n`, `var = (sum m2 + count * ((mean_i - mean)^2)) / n`, each
//!   sum from +0 in order, each product and difference rounded; output `[mean, var]`.
//! - `max8` (the order is documented; NaN's place is ours): the elements widened to float32,
//!   sorted descending, stably (equal values keep their index order; -0 and +0 are equal), NaN
//!   above +Inf; the first 8, rounded to `dst`'s dtype.
//! - `nc_find_index8` (documented: first occurrence, duplicates of a value advance through its
//!   successive occurrences in ascending order, all ones when absent; NaN's match is ours): the
//!   data and the 8 values widened to float32 and compared with `==`, except that a NaN value
//!   matches a NaN element (so `max8`'s output is always found).
//! - `nc_match_replace8` (documented: the first occurrence of each value is replaced, the
//!   values taken in reverse order `vals[7]` .. `vals[0]`, so repeated values pair with
//!   successive occurrences in descending slot order): compared as `nc_find_index8` does;
//!   ours: each data position pairs with at most one value (a value equal to `imm` does not
//!   match a position already replaced), an absent value leaves `dst_idx` all ones (as
//!   `nc_find_index8`), `imm` is rounded to float32 then to `dst`'s dtype like every element.

use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::record::{flags, Engine, Opcode, Queue, Region, MEM_PSUM};
use super::super::Machine;
use super::act::{self, ActFunc};
use super::alu::{self, canon, AluOp};
use super::elementwise::check_op_pair;
use super::{check_p_n, shape_rule, Opnd, ReduceCmd, Scalar};
use crate::machine::tile::Tile;
use crate::spec::{BN_STATS_FMAX, MAX8_MAX_ELEMENTS, MAX8_MIN_ELEMENTS};

/// The identity of a reduction operator (what `reset_reduce` loads).
pub(super) fn identity(op: AluOp) -> f32 {
    match op {
        AluOp::Multiply => 1.0,
        AluOp::Maximum => f32::NEG_INFINITY,
        AluOp::Minimum | AluOp::AbsMin => f32::INFINITY,
        _ => 0.0,
    }
}

impl Machine {
    /// `tensor_reduce` (Vector engine): reduces the last `axes` free dimensions of `data` with
    /// `op`; `dst` holds the remaining elements per partition. See the module doc for the order.
    pub fn tensor_reduce(
        &mut self, dst: &Tile, op: AluOp, data: &Tile, axes: usize, negate: bool,
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
            return Err(Error::value("negate", "negate applies to arithmetic operators only"));
        }
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        let nd = data.ndim as usize;
        let r: usize = data.shape[nd - axes..nd].iter().map(|&s| s as usize).product();
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
                .map(|c| c[1..].iter().fold(c[0], |acc, &v| alu::apply_bits(op, acc, v)))
                .collect();
            self.scatter_bits(&d, &z)?;
        } else {
            let z: Vec<f32> = self
                .gather_f32(data)?
                .chunks(r)
                .map(|c| {
                    let acc = c[1..].iter().fold(canon(c[0]), |acc, &v| alu::apply(op, acc, v));
                    if negate {
                        canon(-acc)
                    } else {
                        acc
                    }
                })
                .collect();
            self.scatter_f32(&d, &z)?;
        }
        let f = if matches!(op, AluOp::Add | AluOp::Maximum) { flags::ADD_OR_MAX } else { 0 };
        self.record_engine(opc, engine, &[&a], &[], &d, f);
        Ok(())
    }

    /// `tensor_tensor_scan` (Vector engine): per partition,
    /// `out[i] = op1(op0(data0[i], out[i - 1]), data1[i])` from `out[-1] = initial`;
    /// `reverse0` makes `data0` the right-hand side of `op0`, `reverse1` makes `data1` the
    /// left-hand side of `op1`.
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_tensor_scan(
        &mut self, dst: &Tile, data0: &Tile, data1: &Tile, initial: &Scalar, op0: AluOp,
        op1: AluOp, reverse0: bool, reverse1: bool,
    ) -> Result<()> {
        let opc = Opcode::TensorTensorScan;
        let engine = Engine::Vector;
        check_op_pair(op0, op1, |op| {
            (op.is_bitvec() || op.is_unary())
                .then(|| format!("tensor_tensor_scan takes binary arithmetic operators; got {op}"))
        })?;
        let (a, b, d) =
            self.two_tensor_operands(opc, engine, ("data0", data0), ("data1", data1), dst)?;
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
        &mut self, dst: &Tile, data: &Tile, op0: AluOp, operand0: &Scalar, reverse0: bool,
        reduce_op: AluOp, reduce_res: Option<&Tile>, reduce_cmd: ReduceCmd,
        reduce_init: Option<&Scalar>, negate: bool,
    ) -> Result<()> {
        let opc = Opcode::TensorScalarReduce;
        let engine = Engine::Vector;
        if op0.is_bitvec() {
            return Err(Error::value("op0", "tensor_scalar_reduce takes an arithmetic operator"));
        }
        if !matches!(reduce_op, AluOp::Add | AluOp::Multiply | AluOp::Maximum | AluOp::Minimum) {
            return Err(Error::value(
                "reduce_op",
                format!("got {reduce_op}; tensor_scalar_reduce reduces with add, multiply, maximum or minimum"),
            ));
        }
        if !matches!(reduce_cmd, ReduceCmd::ResetReduce | ReduceCmd::Reduce | ReduceCmd::LoadReduce)
        {
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
        let (a, d) = self.data_dst_operands(opc, engine, data, dst)?;
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
        self.program.push(opc, Queue::Engine(engine), &reads, &writes, cost);
        Ok(())
    }

    /// `tensor_scalar_cumulative` (Vector engine): `dst[i] = reg = op1(op0(src[i], imm0), reg)`
    /// along each partition's elements, the register set by `reduce_cmd` first. See the module
    /// doc for the order; int32/uint32 tiles are refused (the documentation: "not supported
    /// as input/output dtypes (ISA limitation)").
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_scalar_cumulative(
        &mut self, dst: &Tile, src: &Tile, op0: AluOp, op1: AluOp, imm0: &Scalar,
        imm1: Option<&Scalar>, reduce_cmd: ReduceCmd,
    ) -> Result<()> {
        let opc = Opcode::TensorScalarCumulative;
        let engine = Engine::Vector;
        if op0.is_bitvec() {
            return Err(Error::value(
                "op0",
                format!("got {op0}; tensor_scalar_cumulative's op0 is an arithmetic operator"),
            ));
        }
        if !matches!(
            op1,
            AluOp::Add | AluOp::Subtract | AluOp::Multiply | AluOp::Maximum | AluOp::Minimum
        ) {
            return Err(Error::value(
                "op1",
                format!(
                    "got {op1}; tensor_scalar_cumulative accumulates with add, subtract, \
                     multiply, maximum or minimum"
                ),
            ));
        }
        if !matches!(reduce_cmd, ReduceCmd::ResetReduce | ReduceCmd::Reduce | ReduceCmd::LoadReduce)
        {
            return Err(Error::value(
                "reduce_cmd",
                format!(
                    "got {}; tensor_scalar_cumulative takes reset_reduce, reduce or load_reduce",
                    reduce_cmd.name()
                ),
            ));
        }
        if reduce_cmd == ReduceCmd::LoadReduce && imm1.is_none() {
            return Err(Error::value(
                "imm1",
                "reduce_cmd load_reduce loads the register from imm1; give imm1",
            ));
        }
        for (arg, t) in [("src", src), ("dst", dst)] {
            if matches!(t.dtype, Dtype::Int32 | Dtype::Uint32) {
                return Err(super::dtype_rule(
                    arg,
                    "cumulative_dtype",
                    format!(
                        "{arg} is {}; tensor_scalar_cumulative does not take int32/uint32 tiles \
                         (an ISA limitation, as documented)",
                        t.dtype
                    ),
                ));
            }
        }
        let a = self.operand("src", src, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "src", &a, &[("dst", &d)])?;
        let (p, n) = (a.p(), a.n());
        let mut extra = Vec::new();
        let s0 = self.scalar_f32("imm0", imm0, p, engine, &mut extra)?;
        let init = match (reduce_cmd, imm1) {
            (ReduceCmd::LoadReduce, Some(s1)) => {
                self.scalar_f32("imm1", s1, p, engine, &mut extra)?
            }
            _ => Vec::new(),
        };
        let x = self.gather_f32(src)?;
        let mut z = vec![0f32; x.len()];
        let p0 = dst.start_partition as usize;
        for (row, (xi, zi)) in x.chunks(n.max(1)).zip(z.chunks_mut(n.max(1))).enumerate() {
            let reg = &mut self.dve_regs[p0 + row];
            *reg = match reduce_cmd {
                ReduceCmd::ResetReduce => identity(op1),
                ReduceCmd::LoadReduce => canon(init[row]),
                _ => *reg,
            };
            for (&v, out) in xi.iter().zip(zi.iter_mut()) {
                *reg = alu::apply(op1, alu::apply(op0, v, s0[row]), *reg);
                *out = *reg;
            }
        }
        self.scatter_f32(&d, &z)?;
        let mut reads: Vec<Region> = vec![a.region()];
        reads.extend_from_slice(&extra);
        let cost = Self::cost_input(n, p, super::operand_flags(&[&a], Some(&d)));
        self.program.push(opc, Queue::Engine(engine), &reads, &[d.region()], cost);
        Ok(())
    }

    /// `range_select` (Vector engine): `dst = on_true_tile` where the element's free index
    /// plus `range_start` passes both comparisons with the partition's bounds, else
    /// `on_false_value`; the results max-reduced into the Vector registers by `reduce_cmd` and,
    /// with `reduce_res`, written there. See the module doc for the order.
    #[allow(clippy::too_many_arguments)]
    pub fn range_select(
        &mut self, dst: &Tile, on_true_tile: &Tile, comp: [AluOp; 2], bounds: [&Scalar; 2],
        reduce_cmd: ReduceCmd, reduce_res: Option<&Tile>, reduce_op: AluOp, range_start: i64,
        on_false_value: Option<f64>,
    ) -> Result<()> {
        let opc = Opcode::RangeSelect;
        let engine = Engine::Vector;
        for (arg, op) in [("comp_op0", comp[0]), ("comp_op1", comp[1])] {
            if !matches!(
                op,
                AluOp::Equal
                    | AluOp::Less
                    | AluOp::LessEqual
                    | AluOp::Greater
                    | AluOp::GreaterEqual
            ) {
                return Err(Error::value(
                    arg,
                    format!(
                        "got {op}; range_select compares with equal, less, less_equal, greater \
                         or greater_equal"
                    ),
                ));
            }
        }
        if reduce_op != AluOp::Maximum {
            return Err(Error::value(
                "reduce_op",
                format!("got {reduce_op}; range_select reduces with maximum only"),
            ));
        }
        if reduce_cmd == ReduceCmd::LoadReduce {
            return Err(Error::value(
                "reduce_cmd",
                "range_select has no initial value to load (load_reduce); use reset_reduce, \
                 reduce, reset or idle",
            ));
        }
        let fill = f32::MIN;
        if let Some(v) = on_false_value {
            // The constant as float32 (kernels write -3.4028235e+38, which rounds to it).
            if v as f32 != fill {
                return Err(Error::value(
                    "on_false_value",
                    format!(
                        "got {v}; range_select's on_false_value must be float32's lowest \
                         value, -3.4028235e+38 (a hardware constraint the documentation states)"
                    ),
                ));
            }
        }
        if on_true_tile.dtype.format().is_none() {
            return Err(super::dtype_rule(
                "on_true_tile",
                "range_select_dtype",
                format!(
                    "on_true_tile is {}; range_select selects floating-point elements",
                    on_true_tile.dtype
                ),
            ));
        }
        let a = self.operand("on_true_tile", on_true_tile, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "on_true_tile", &a, &[("dst", &d)])?;
        let (p, n) = (a.p(), a.n());
        // The index is compared in float32: exact up to 2^24 (the documented range).
        const EXACT: i64 = 1 << 24;
        let last = range_start.saturating_add(n as i64 - 1);
        if range_start < -EXACT || last > EXACT {
            return Err(Error::value(
                "range_start",
                format!(
                    "range_start {range_start} + the free index (up to {}) leaves [-2^24, 2^24], \
                     where float32 holds every integer (range_select compares in float32)",
                    n - 1
                ),
            ));
        }
        let res = self.reduce_res_operand(reduce_res, engine, p)?;
        let mut extra = Vec::new();
        let b0 = self.scalar_f32("bound0", bounds[0], p, engine, &mut extra)?;
        let b1 = self.scalar_f32("bound1", bounds[1], p, engine, &mut extra)?;
        let x = self.gather_f32(on_true_tile)?;
        let mut z = vec![0f32; x.len()];
        let p0 = dst.start_partition as usize;
        for (row, (xi, zi)) in x.chunks(n.max(1)).zip(z.chunks_mut(n.max(1))).enumerate() {
            for (j, (&v, out)) in xi.iter().zip(zi.iter_mut()).enumerate() {
                let idx = (range_start + j as i64) as f32;
                let keep = alu::apply(comp[0], idx, b0[row]) != 0.0
                    && alu::apply(comp[1], idx, b1[row]) != 0.0;
                *out = if keep { canon(v) } else { fill };
            }
            self.fold_register(p0 + row, reduce_cmd, reduce_op, zi);
        }
        // The published cost is max(MIN_II, N) [S10], reduce_res included.
        self.finish_with_registers(opc, (&d, &z), res.as_ref(), &[&a], &extra)
    }

    /// The Vector register of `partition` as `cmd` says: `Idle` leaves it, `Reset` sets `op`'s
    /// identity, `Reduce` folds `values` into it with `op`, `ResetReduce` does both.
    fn fold_register(&mut self, partition: usize, cmd: ReduceCmd, op: AluOp, values: &[f32]) {
        let reg = &mut self.dve_regs[partition];
        match cmd {
            ReduceCmd::Idle => {}
            ReduceCmd::Reset => *reg = identity(op),
            _ => {
                if cmd == ReduceCmd::ResetReduce {
                    *reg = identity(op);
                }
                for &v in values {
                    *reg = alu::apply(op, *reg, v);
                }
            }
        }
    }

    /// Writes `z` to `d` and, when `res` is given, the registers of the `p` partitions from `p0`
    /// to it: the regions written.
    fn write_with_registers(
        &mut self, d: &Opnd, z: &[f32], res: Option<&Opnd>, p0: usize, p: usize,
    ) -> Result<Vec<Region>> {
        self.scatter_f32(d, z)?;
        let mut writes = vec![d.region()];
        if let Some(o) = res {
            let vals = self.dve_regs[p0..p0 + p].to_vec();
            self.scatter_f32(o, &vals)?;
            writes.push(o.region());
        }
        Ok(writes)
    }

    /// `select_reduce` (Vector engine): `dst = predicate ? on_true : on_false` element-wise
    /// (`predicate` an 8- or 16-bit integer tile, true when nonzero, `reverse_pred` negating it;
    /// `on_false` a float32 immediate or a `[P, 1]` tile, one value per partition), the results
    /// max-reduced into the Vector registers. See the module doc for the order.
    #[allow(clippy::too_many_arguments)]
    pub fn select_reduce(
        &mut self, dst: &Tile, predicate: &Tile, on_true: &Tile, on_false: &Scalar,
        reduce_res: Option<&Tile>, reduce_cmd: ReduceCmd, reduce_op: AluOp, reverse_pred: bool,
    ) -> Result<()> {
        let opc = Opcode::SelectReduce;
        let engine = Engine::Vector;
        if reduce_op != AluOp::Maximum {
            return Err(Error::value(
                "reduce_op",
                format!("got {reduce_op}; select_reduce reduces with maximum only"),
            ));
        }
        if !matches!(reduce_cmd, ReduceCmd::Idle | ReduceCmd::ResetReduce | ReduceCmd::Reduce) {
            return Err(Error::value(
                "reduce_cmd",
                format!("got {reduce_cmd}; select_reduce documents idle, reset_reduce and reduce"),
            ));
        }
        if !matches!(predicate.dtype, Dtype::Int8 | Dtype::Uint8 | Dtype::Int16 | Dtype::Uint16) {
            return Err(super::dtype_rule(
                "predicate",
                "select_reduce_dtype",
                format!(
                    "predicate is {}; select_reduce's predicate is int8, uint8, int16 or uint16",
                    predicate.dtype
                ),
            ));
        }
        if matches!(on_true.dtype, Dtype::Int32 | Dtype::Uint32 | Dtype::Tf32) {
            return Err(super::dtype_rule(
                "on_true",
                "select_reduce_dtype",
                format!(
                    "on_true is {}; select_reduce takes any dtype but tfloat32, int32 and uint32",
                    on_true.dtype
                ),
            ));
        }
        let pr = self.operand("predicate", predicate, Some(engine), false)?;
        let t = self.operand("on_true", on_true, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "on_true", &t, &[("predicate", &pr), ("dst", &d)])?;
        if pr.region().mem == MEM_PSUM && t.region().mem == MEM_PSUM {
            return Err(super::rule(
                "on_true",
                "two_psum_inputs",
                "select_reduce takes on_true or predicate from PSUM, not both",
            ));
        }
        let (p, n) = (t.p(), t.n());
        let res = match reduce_res {
            Some(r) => {
                if r.dtype.format().is_none() {
                    return Err(super::dtype_rule(
                        "reduce_res",
                        "select_reduce_dtype",
                        format!("reduce_res is {}; it must be a float type", r.dtype),
                    ));
                }
                let o = self.operand("reduce_res", r, Some(engine), true)?;
                check_reduce_res(&o, p)?;
                Some(o)
            }
            None => None,
        };
        let mut extra: Vec<Region> = Vec::new();
        let fill: Vec<f32> = match on_false {
            Scalar::Imm(v) => vec![*v as f32; p as usize],
            Scalar::Tile(ft) => {
                let fo = self.operand("on_false", ft, Some(engine), false)?;
                self.check_vector_operand("on_false", &fo, p)?;
                extra.push(fo.region());
                self.gather_f32(ft)?
            }
        };
        let pv = self.gather_f32(predicate)?;
        let x = self.gather_f32(on_true)?;
        let mut z = vec![0f32; x.len()];
        let p0 = dst.start_partition as usize;
        let rows = x.chunks(n.max(1)).zip(pv.chunks(n.max(1)));
        for (row, ((xi, qi), zi)) in rows.zip(z.chunks_mut(n.max(1))).enumerate() {
            for ((&v, &q), out) in xi.iter().zip(qi).zip(zi.iter_mut()) {
                *out = if (q != 0.0) != reverse_pred { canon(v) } else { canon(fill[row]) };
            }
            // `reset` alone is refused above: the arms left are idle and the folds.
            self.fold_register(p0 + row, reduce_cmd, reduce_op, zi);
        }
        // No published formula: the Vector engine's one pass, max(MIN_II, N) (inferred).
        self.finish_with_registers(opc, (&d, &z), res.as_ref(), &[&t, &pr], &extra)
    }

    /// `exponential` (Vector engine; the documentation marks it NeuronCore-v4 and newer):
    /// `dst = exp(src - max_value)` element-wise (`max_value` a float32 immediate or a `[P, 1]`
    /// tile, 0 when absent), the results add-reduced into the Vector registers by `reduce_cmd`;
    /// `reduce_res` (`[P, 1]`, float), when given, receives the registers. See the module doc
    /// for the order and `act`'s for `exp` (not the chip's bits).
    pub fn exponential(
        &mut self, dst: &Tile, src: &Tile, max_value: Option<&Scalar>, reduce_res: Option<&Tile>,
        reduce_cmd: ReduceCmd, reduce_init: Option<&Scalar>,
    ) -> Result<()> {
        let opc = Opcode::Exponential;
        let engine = Engine::Vector;
        if reduce_cmd == ReduceCmd::Reset {
            return Err(Error::value(
                "reduce_cmd",
                "got reset; exponential documents idle, reset_reduce, reduce and load_reduce",
            ));
        }
        let init_is_zero = match reduce_init {
            None => true,
            Some(Scalar::Imm(v)) => *v == 0.0,
            Some(Scalar::Tile(_)) => false,
        };
        if reduce_cmd != ReduceCmd::LoadReduce && !init_is_zero {
            return Err(Error::value(
                "reduce_init",
                format!(
                    "reduce_cmd is {reduce_cmd}; reduce_init is unset or 0.0 unless reduce_cmd \
                     is load_reduce (as documented)"
                ),
            ));
        }
        let res_dtype = reduce_res.map_or(Dtype::Fp32, |r| r.dtype);
        let refused = [
            ("src", src.dtype, src.dtype == Dtype::Tf32, "any dtype but tfloat32"),
            ("dst", dst.dtype, dst.dtype == Dtype::Uint32, "any dtype but uint32"),
            ("reduce_res", res_dtype, res_dtype.format().is_none(), "a float dtype"),
        ];
        if let Some(&(arg, dt, _, allowed)) = refused.iter().find(|r| r.2) {
            let why = format!("{arg} is {dt}; exponential takes {allowed} there");
            return Err(super::dtype_rule(arg, "exponential_dtype", why));
        }
        let (a, d) = self.input_dst_operands(opc, engine, ("src", src), dst)?;
        let (p, n) = (a.p(), a.n());
        let res = self.reduce_res_operand(reduce_res, engine, p)?;
        let mut extra: Vec<Region> = Vec::new();
        let zero = Scalar::Imm(0.0);
        let mut cols = Vec::with_capacity(2);
        for (arg, s) in [("max_value", max_value), ("reduce_init", reduce_init)] {
            cols.push(self.scalar_f32(arg, s.unwrap_or(&zero), p, engine, &mut extra)?);
        }
        let (m, init) = (&cols[0], &cols[1]);
        let x = self.gather_f32(src)?;
        let mut z = vec![0f32; x.len()];
        let p0 = dst.start_partition as usize;
        for (row, (xi, zi)) in x.chunks(n.max(1)).zip(z.chunks_mut(n.max(1))).enumerate() {
            for (&v, out) in xi.iter().zip(zi.iter_mut()) {
                *out = act::eval(ActFunc::Exp, v - m[row]);
            }
            let cmd = if reduce_cmd == ReduceCmd::LoadReduce {
                self.dve_regs[p0 + row] = canon(init[row]);
                ReduceCmd::Reduce
            } else {
                reduce_cmd
            };
            self.fold_register(p0 + row, cmd, AluOp::Add, zi);
        }
        // No published formula: the Vector engine's one pass, max(MIN_II, N) (inferred).
        self.finish_with_registers(opc, (&d, &z), res.as_ref(), &[&a], &extra)
    }

    /// The `reduce_res` operand of a register-reducing instruction over `p` partitions on
    /// `engine`, when given: a `[P, 1]` tile.
    pub(super) fn reduce_res_operand(
        &self, reduce_res: Option<&Tile>, engine: Engine, p: u32,
    ) -> Result<Option<Opnd>> {
        let Some(r) = reduce_res else {
            return Ok(None);
        };
        let o = self.operand("reduce_res", r, Some(engine), true)?;
        check_reduce_res(&o, p)?;
        Ok(Some(o))
    }

    /// Writes `z` to `d` and the registers to `res` ([`Self::write_with_registers`]) and
    /// records the instruction: reads `inputs` and `extra`, the Vector engine's one pass.
    fn finish_with_registers(
        &mut self, opc: Opcode, (d, z): (&Opnd, &[f32]), res: Option<&Opnd>, inputs: &[&Opnd],
        extra: &[Region],
    ) -> Result<()> {
        let (p0, p) = (d.tile.start_partition as usize, d.p());
        let writes = self.write_with_registers(d, z, res, p0, p as usize)?;
        let mut reads: Vec<Region> = inputs.iter().map(|o| o.region()).collect();
        reads.extend_from_slice(extra);
        let cost = Self::cost_input(d.n(), p, super::operand_flags(inputs, Some(d)));
        let q = Queue::Engine(Engine::Vector);
        self.program.push(opc, q, &reads, &writes, cost);
        Ok(())
    }

    /// `bn_stats` (Vector engine): per partition, `[count, mean, m2]` of the even-indexed and
    /// of the odd-indexed elements of `data` (at most 512 per partition) into 6 elements of
    /// `dst`. See the module doc for the order.
    pub fn bn_stats(&mut self, dst: &Tile, data: &Tile) -> Result<()> {
        let check = |a: &Opnd| {
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
            Ok(())
        };
        self.partition_stats(Opcode::BnStats, dst, data, 6, check, |row, z| {
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
        })
    }

    /// `bn_aggr` (Vector engine): the mean and variance per partition from `bn_stats` triples
    /// (`data` has a multiple of 3 elements per partition) into 2 elements of `dst`.
    pub fn bn_aggr(&mut self, dst: &Tile, data: &Tile) -> Result<()> {
        let check = |a: &Opnd| {
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
            Ok(())
        };
        self.partition_stats(Opcode::BnAggr, dst, data, 2, check, |row, z| {
            let (total, sum) =
                row.chunks(3).fold((0.0f32, 0.0f32), |(t, s), c| (t + c[0], s + c[0] * c[1]));
            let mean = sum / total;
            let q = row.chunks(3).fold(0.0f32, |q, c| {
                let dlt = c[1] - mean;
                q + (c[2] + c[0] * (dlt * dlt))
            });
            z.extend([canon(mean), canon(q / total)]);
        })
    }

    /// A per-partition statistic `opc` (Vector engine) of `data` into `outputs` elements per
    /// partition of `dst`: `check` vets the data operand, `row` appends one partition's
    /// results to `z`.
    fn partition_stats(
        &mut self, opc: Opcode, dst: &Tile, data: &Tile, outputs: usize,
        check: impl FnOnce(&Opnd) -> Result<()>, mut row: impl FnMut(&[f32], &mut Vec<f32>),
    ) -> Result<()> {
        let engine = Engine::Vector;
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        check(&a)?;
        check_p_n("dst", &d, a.p(), outputs, |shape| {
            format!("{} writes [{}, {outputs}]; dst is {shape:?}", opc.name(), a.p())
        })?;
        let x = self.gather_f32(data)?;
        let mut z = Vec::with_capacity(outputs * a.p() as usize);
        for r in x.chunks(a.n()) {
            row(r, &mut z);
        }
        self.scatter_f32(&d, &z)?;
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }
}

/// `max8`'s order: descending, NaN first, stable.
fn max8_order(a: &(usize, f32), b: &(usize, f32)) -> std::cmp::Ordering {
    let key = |v: f32| if v.is_nan() { f32::INFINITY } else { v };
    match (a.1.is_nan(), b.1.is_nan()) {
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => {
            key(b.1).partial_cmp(&key(a.1)).unwrap_or(std::cmp::Ordering::Equal).then(a.0.cmp(&b.0))
        }
    }
}

impl Machine {
    /// Checks the search input of `max8` / `nc_find_index8` (8 to 16,384 elements per
    /// partition) and a `[P, 8]` destination.
    fn top8_operands(&self, arg: &str, src: &Tile, dst: &Tile) -> Result<(Opnd, Opnd)> {
        let engine = Engine::Vector;
        let a = self.top8_data(arg, src)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        check_eight("dst", &d, a.p())?;
        Ok((a, d))
    }

    /// Checks the searched input of `max8` / `nc_find_index8` / `nc_match_replace8`: 8 to
    /// 16,384 elements per partition.
    fn top8_data(&self, arg: &str, src: &Tile) -> Result<Opnd> {
        let a = self.operand(arg, src, Some(Engine::Vector), false)?;
        if !(MAX8_MIN_ELEMENTS..=MAX8_MAX_ELEMENTS).contains(&a.n()) {
            return Err(shape_rule(
                arg,
                "max8_size",
                format!(
                    "{} elements per partition; the search reads {MAX8_MIN_ELEMENTS} to \
                     {MAX8_MAX_ELEMENTS}",
                    a.n()
                ),
            ));
        }
        Ok(a)
    }

    /// Checks the 8 values per partition (`vals`) of `nc_find_index8` / `nc_match_replace8`.
    fn top8_vals(&self, vals: &Tile, p: u32) -> Result<Opnd> {
        let v = self.operand("vals", vals, Some(Engine::Vector), false)?;
        if v.p() != p || v.n() != 8 {
            return Err(shape_rule(
                "vals",
                "shape",
                format!(
                    "expected 8 values in each of {p} partitions, got {:?}",
                    vals.logical_shape()
                ),
            ));
        }
        Ok(v)
    }

    /// `max8` (Vector engine): the 8 largest values of each partition of `src` (8 to 16,384
    /// elements), in descending order, into `dst` (`[P, 8]`). See the module doc for NaN.
    pub fn max8(&mut self, dst: &Tile, src: &Tile) -> Result<()> {
        let (a, d) = self.top8_operands("src", src, dst)?;
        let x = self.gather_f32(src)?;
        let mut z = Vec::with_capacity(8 * a.p() as usize);
        let mut row_keys: Vec<(usize, f32)> = Vec::with_capacity(a.n());
        for row in x.chunks(a.n()) {
            row_keys.clear();
            row_keys.extend(row.iter().copied().enumerate());
            row_keys.sort_by(max8_order);
            z.extend(row_keys[..8].iter().map(|&(_, v)| v));
        }
        self.scatter_f32(&d, &z)?;
        self.record_engine(Opcode::Max8, Engine::Vector, &[&a], &[], &d, 0);
        Ok(())
    }

    /// `nc_find_index8` (Vector engine): per partition, the index in `data` (8 to 16,384
    /// elements) of the first occurrence of each of the 8 `vals`, a repeated value taking its
    /// next occurrence; all ones where a value is absent. `dst` is `[P, 8]` uint16 or uint32.
    pub fn nc_find_index8(&mut self, dst: &Tile, data: &Tile, vals: &Tile) -> Result<()> {
        let engine = Engine::Vector;
        let (a, d) = self.top8_operands("data", data, dst)?;
        let v = self.top8_vals(vals, a.p())?;
        let none = index_sentinel("dst", "nc_find_index8", dst.dtype)?;
        let (x, want) = (self.gather_f32(data)?, self.gather_f32(vals)?);
        let mut z = Vec::with_capacity(8 * a.p() as usize);
        for (row, want) in x.chunks(a.n()).zip(want.chunks(8)) {
            for (j, &w) in want.iter().enumerate() {
                let same = |e: &f32| *e == w || e.is_nan() && w.is_nan();
                // Earlier equal values took the earlier occurrences.
                let skip = want[..j].iter().filter(|&&u| same(&u)).count();
                let at = row.iter().enumerate().filter(|(_, e)| same(e)).nth(skip);
                z.push(at.map_or(none, |(i, _)| i as u32));
            }
        }
        self.scatter_bits(&d, &z)?;
        self.record_engine(Opcode::NcFindIndex8, engine, &[&a, &v], &[], &d, 0);
        Ok(())
    }
}

impl Machine {
    /// `nc_match_replace8` (Vector engine): `dst` = `data` (8 to 16,384 elements per
    /// partition) with the first occurrence of each of the 8 `vals` replaced by `imm`; the
    /// values are taken in reverse order (`vals[7]` first), each pairing with the first data
    /// position no later value took; `dst_idx` (`[P, 8]` uint16 or uint32), if given, receives
    /// the positions (all ones where a value is absent). See the module doc.
    pub fn nc_match_replace8(
        &mut self, dst: &Tile, data: &Tile, vals: &Tile, imm: f64, dst_idx: Option<&Tile>,
    ) -> Result<()> {
        let opc = Opcode::NcMatchReplace8;
        let engine = Engine::Vector;
        let a = self.top8_data("data", data)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "data", &a, &[("dst", &d)])?;
        let v = self.top8_vals(vals, a.p())?;
        let idx = match dst_idx {
            Some(t) => {
                let o = self.operand("dst_idx", t, Some(engine), true)?;
                check_eight("dst_idx", &o, a.p())?;
                Some((o, index_sentinel("dst_idx", "nc_match_replace8", t.dtype)?))
            }
            None => None,
        };
        let (mut x, want) = (self.gather_f32(data)?, self.gather_f32(vals)?);
        let imm = imm as f32;
        let none = idx.as_ref().map_or(u32::MAX, |i| i.1);
        let mut at = Vec::with_capacity(8 * a.p() as usize);
        for (row, want) in x.chunks_mut(a.n()).zip(want.chunks(8)) {
            let mut slots = [none; 8];
            let mut taken: Vec<usize> = Vec::with_capacity(8);
            for j in (0..8).rev() {
                let w = want[j];
                let same = |e: f32| e == w || e.is_nan() && w.is_nan();
                let hit = (0..row.len()).find(|&i| same(row[i]) && !taken.contains(&i));
                if let Some(i) = hit {
                    taken.push(i);
                    slots[j] = i as u32;
                }
            }
            for &i in &taken {
                row[i] = imm;
            }
            at.extend_from_slice(&slots);
        }
        self.scatter_f32(&d, &x)?;
        let mut writes = vec![d.region()];
        if let Some((o, _)) = &idx {
            self.scatter_bits(o, &at)?;
            writes.push(o.region());
        }
        let cost = Self::cost_input(a.n(), a.p(), super::operand_flags(&[&a, &v], Some(&d)));
        self.program.push(opc, Queue::Engine(engine), &[a.region(), v.region()], &writes, cost);
        Ok(())
    }
}

/// Checks a `[p, 8]` output of the top-8 instructions.
fn check_eight(arg: &str, o: &Opnd, p: u32) -> Result<()> {
    check_p_n(arg, o, p, 8, |shape| format!("the search writes [{p}, 8]; {arg} is {shape:?}"))
}

/// The all-ones "absent" index of an index output (`find_index_dtype`: uint16 or uint32).
fn index_sentinel(arg: &str, op: &str, dtype: Dtype) -> Result<u32> {
    match dtype {
        Dtype::Uint32 => Ok(u32::MAX),
        Dtype::Uint16 => Ok(u16::MAX as u32),
        other => Err(super::dtype_rule(
            arg,
            "find_index_dtype",
            format!("{op} writes uint16 or uint32 indices; {arg} is {other}"),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineConfig;
    use crate::memory::Space;

    fn put(m: &mut Machine, t: &Tile, v: &[f32]) {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        m.write_tile(t, &b).expect("write");
    }

    fn sbuf(m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype) -> Tile {
        m.alloc(Space::Sbuf, name, shape, dtype).expect(name)
    }

    fn words(m: &Machine, t: &Tile) -> Vec<u32> {
        let b = m.read_tile(t).expect("read");
        b.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// Rows with ties, signed zeros, infinities and NaN; the oracle selects the largest
    /// remaining element eight times (first index among equals, NaN above everything).
    #[test]
    fn max8_and_find_index8_against_a_selection_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (4usize, 40usize);
        let src = sbuf(&mut m, "src", &[p, n], Dtype::Fp32);
        let top = sbuf(&mut m, "top", &[p, 8], Dtype::Fp32);
        let idx = sbuf(&mut m, "idx", &[p, 8], Dtype::Uint32);
        let special = [0.0, -0.0, 3.5, 3.5, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -1.0];
        let mut x = vec![0f32; p * n];
        for (k, v) in x.iter_mut().enumerate() {
            let r = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            *v = if r.is_multiple_of(5) {
                special[(r as usize / 5) % special.len()]
            } else {
                (r % 17) as f32 - 8.0
            };
        }
        put(&mut m, &src, &x);
        m.max8(&top, &src).expect("max8");
        m.nc_find_index8(&idx, &src, &top).expect("find");
        let (got, at) = (words(&m, &top), words(&m, &idx));
        for r in 0..p {
            let row = &x[r * n..(r + 1) * n];
            let mut taken = vec![false; n];
            for j in 0..8 {
                let mut best: Option<usize> = None;
                for i in 0..n {
                    if taken[i] {
                        continue;
                    }
                    let better = match best {
                        None => true,
                        Some(b) => {
                            let (u, v) = (row[i], row[b]);
                            !v.is_nan() && (u.is_nan() || u > v)
                        }
                    };
                    if better {
                        best = Some(i);
                    }
                }
                let b = best.expect("n >= 8");
                taken[b] = true;
                let want = if row[b].is_nan() { 0x7FC0_0000 } else { row[b].to_bits() };
                let g = got[r * 8 + j];
                let same = g == want || row[b] == 0.0 && f32::from_bits(g) == 0.0;
                assert!(same, "row {r} slot {j}: {g:#x} vs {want:#x}");
                // The equal value's occurrences are handed out in order.
                let v = f32::from_bits(g);
                let eq = |e: f32| e == v || e.is_nan() && v.is_nan();
                let before = (0..j).filter(|&q| eq(f32::from_bits(got[r * 8 + q]))).count();
                let want_i = (0..n).filter(|&i| eq(row[i])).nth(before).expect("present");
                assert_eq!(at[r * 8 + j], want_i as u32, "row {r} slot {j}");
            }
        }
        // Absent values: all ones (uint16: 0xFFFF); sizes and dtypes by their rules.
        let vals = sbuf(&mut m, "vals", &[p, 8], Dtype::Fp32);
        put(&mut m, &vals, &[1234.5; 32]);
        let i16t = sbuf(&mut m, "i16", &[p, 8], Dtype::Uint16);
        m.nc_find_index8(&i16t, &src, &vals).expect("find");
        assert!(m.read_tile(&i16t).expect("r").iter().all(|&b| b == 0xFF));
        let e = m.nc_find_index8(&top, &src, &vals).expect_err("refused");
        assert_eq!(e.rule(), Some("find_index_dtype"));
        let short = src.reshape_free(&[n]).expect("flat");
        let short = short
            .slice(&[
                crate::machine::tile::Index::ALL,
                crate::machine::tile::Index::Range { start: Some(0), stop: Some(7), step: 1 },
            ])
            .expect("7");
        let e = m.max8(&top, &short).expect_err("refused");
        assert_eq!((e.arg(), e.rule()), (Some("src"), Some("max8_size")));
    }

    /// The oracle follows the documentation literally: for `i = 7 .. 0`, the first element of
    /// the (already partly replaced) row equal to `vals[i]` becomes `imm` and its position
    /// goes to slot `i` (an `imm` that no value equals, so the two readings agree).
    #[test]
    fn match_replace8_against_the_documented_reverse_order() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        // The documentation's example first.
        let data = sbuf(&mut m, "d", &[1, 11], Dtype::Fp32);
        let vals = sbuf(&mut m, "v", &[1, 8], Dtype::Fp32);
        let idx = sbuf(&mut m, "i", &[1, 8], Dtype::Uint32);
        put(&mut m, &data, &[1., 2., 3., 4., 8., 8., 8., 8., 8., 8., 8.]);
        put(&mut m, &vals, &[3., 8., 8., 8., 8., 8., 8., 8.]);
        m.nc_match_replace8(&data, &data, &vals, -1.0, Some(&idx)).expect("in place");
        assert_eq!(words(&m, &idx), vec![2, 10, 9, 8, 7, 6, 5, 4]);
        let got: Vec<f32> = words(&m, &data).into_iter().map(f32::from_bits).collect();
        assert_eq!(got, vec![1., 2., -1., 4., -1., -1., -1., -1., -1., -1., -1.]);

        // Rows of a few values (repeats, absent values, -0 vs +0, NaN), uint16 indices.
        let (p, n) = (8usize, 24usize);
        let src = sbuf(&mut m, "src", &[p, n], Dtype::Fp32);
        let vals = sbuf(&mut m, "vals", &[p, 8], Dtype::Fp32);
        let dst = sbuf(&mut m, "dst", &[p, n], Dtype::Fp32);
        let idx = sbuf(&mut m, "idx", &[p, 8], Dtype::Uint16);
        let pool = [0.0, -0.0, 1.5, 2.0, f32::NAN, -3.0, 7.0];
        let pick = |k: usize, salt: u64| {
            let r = (k as u64 ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            pool[r as usize % pool.len()]
        };
        let x: Vec<f32> = (0..p * n).map(|k| pick(k, 1)).collect();
        let mut w: Vec<f32> = (0..p * 8).map(|k| pick(k, 77)).collect();
        w[3] = 99.0; // absent from every row
        put(&mut m, &src, &x);
        put(&mut m, &vals, &w);
        let imm = 1234.5f32;
        m.nc_match_replace8(&dst, &src, &vals, imm as f64, Some(&idx)).expect("replace");
        let got = words(&m, &dst);
        let b = m.read_tile(&idx).expect("idx");
        let at: Vec<u32> = b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect();
        for r in 0..p {
            let mut row = x[r * n..(r + 1) * n].to_vec();
            let mut want_at = [0xFFFFu32; 8];
            for i in (0..8).rev() {
                let v = w[r * 8 + i];
                let hit = row.iter().position(|&e| e == v || (e.is_nan() && v.is_nan()));
                if let Some(k) = hit {
                    row[k] = imm;
                    want_at[i] = k as u32;
                }
            }
            assert_eq!(&at[r * 8..(r + 1) * 8], &want_at, "row {r}");
            for (k, e) in row.iter().enumerate() {
                let g = got[r * n + k];
                let same = g == e.to_bits() || e.is_nan() && f32::from_bits(g).is_nan();
                assert!(same, "row {r} element {k}: {g:#x} vs {e}");
            }
        }
        // Without dst_idx; the rules name their argument.
        m.nc_match_replace8(&dst, &src, &vals, 0.0, None).expect("no idx");
        let e = m.nc_match_replace8(&dst, &src, &vals, 0.0, Some(&dst)).expect_err("refused");
        assert_eq!((e.arg(), e.rule()), (Some("dst_idx"), Some("shape")));
        let e = m.nc_match_replace8(&dst, &src, &vals, 0.0, Some(&vals)).expect_err("refused");
        assert_eq!((e.arg(), e.rule()), (Some("dst_idx"), Some("find_index_dtype")));
        let e = m.nc_match_replace8(&idx, &src, &vals, 0.0, None).expect_err("refused");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("shape")));
    }

    /// select_reduce against `where(pred, on_true, on_false)` and an IEEE maximum fold: int16
    /// predicates (negative, zero, positive), NaN/-0/+-inf values, a per-partition on_false tile
    /// holding a NaN, reverse_pred, reduce continuing, idle leaving the register, bf16 rounding.
    #[test]
    fn select_reduce_against_where_and_a_maximum_fold() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (5usize, 9usize);
        let data = sbuf(&mut m, "data", &[p, n], Dtype::Fp32);
        let pred = sbuf(&mut m, "pred", &[p, n], Dtype::Int16);
        let fill = sbuf(&mut m, "fill", &[p, 1], Dtype::Fp32);
        let d32 = sbuf(&mut m, "d32", &[p, n], Dtype::Fp32);
        let d16 = sbuf(&mut m, "d16", &[p, n], Dtype::Bf16);
        let res = sbuf(&mut m, "res", &[p, 1], Dtype::Fp32);
        let special = [f32::NAN, -0.0, f32::INFINITY, f32::NEG_INFINITY, 0.0, 1.5];
        let x: Vec<f32> = (0..p * n)
            .map(|k| if k % 4 == 1 { special[(k / 4) % 6] } else { (k % 7) as f32 - 3.0 })
            .collect();
        put(&mut m, &data, &x);
        let q: Vec<i16> = (0..p * n).map(|k| [0, 1, -1, 0, 300][k % 5]).collect();
        let qw: Vec<u32> = q.iter().map(|&v| v as u16 as u32).collect();
        crate::machine::isa::test_util::put_words(&mut m, &pred, &qw, 2);
        let f = [-100.0, f32::NAN, -0.0, 7.0, f32::NEG_INFINITY];
        put(&mut m, &fill, &f);
        let ft = Scalar::Tile(fill);
        let imm = Scalar::Imm(-2.0);
        let calls: [(&Tile, &Scalar, ReduceCmd, bool); 3] = [
            (&d32, &ft, ReduceCmd::ResetReduce, false),
            (&d16, &imm, ReduceCmd::Reduce, true),
            (&d32, &ft, ReduceCmd::Idle, false),
        ];
        let mut reg = [f32::NEG_INFINITY; 5];
        for (k, &(d, on_false, cmd, rev)) in calls.iter().enumerate() {
            m.select_reduce(d, &pred, &data, on_false, Some(&res), cmd, AluOp::Maximum, rev)
                .expect("select_reduce");
            let got: Vec<u32> = if d.dtype == Dtype::Fp32 {
                words(&m, d)
            } else {
                let b = m.read_tile(d).expect("read");
                b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect()
            };
            for r in 0..p {
                for j in 0..n {
                    let i = r * n + j;
                    let other = match on_false {
                        Scalar::Imm(v) => *v as f32,
                        Scalar::Tile(_) => f[r],
                    };
                    let v = if (q[i] != 0) != rev { x[i] } else { other };
                    let v = if v.is_nan() { f32::from_bits(0x7FC0_0000) } else { v };
                    if cmd != ReduceCmd::Idle {
                        reg[r] = alu::maximum(reg[r], v);
                    }
                    let want = if d.dtype == Dtype::Fp32 {
                        v.to_bits()
                    } else {
                        v.to_bits() >> 16 // exact in bf16 (small integers, specials)
                    };
                    assert_eq!(got[i], want, "call {k} ({r}, {j})");
                }
            }
            let got_res = words(&m, &res);
            for r in 0..p {
                assert_eq!(got_res[r], reg[r].to_bits(), "call {k} register {r}");
            }
        }
        // A NaN in the row makes the register NaN; the -0/+0 row keeps +0 (IEEE maximum).
        assert!(reg[1].is_nan());
        let bad = sbuf(&mut m, "bad", &[p, n], Dtype::Fp32);
        let e = m
            .select_reduce(&d32, &bad, &data, &imm, None, ReduceCmd::Idle, AluOp::Maximum, false)
            .expect_err("fp32 predicate");
        assert_eq!(e.rule(), Some("select_reduce_dtype"));
        let e = m
            .select_reduce(
                &d32,
                &pred,
                &data,
                &imm,
                None,
                ReduceCmd::LoadReduce,
                AluOp::Maximum,
                false,
            )
            .expect_err("load_reduce");
        assert!(e.to_string().contains("reduce_cmd"));
        let e = m
            .select_reduce(&d32, &pred, &data, &imm, None, ReduceCmd::Idle, AluOp::Add, false)
            .expect_err("add");
        assert!(e.to_string().contains("reduce_op"));
    }

    /// `exp(f32(x - max))` (float64 `exp`, rounded once; NaN canonical) and the add fold over
    /// the float32 results in order, across reset_reduce, reduce, load_reduce and idle.
    #[test]
    fn exponential_against_exp_and_an_add_fold() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (4usize, 7usize);
        let [src, d32] = ["src", "d32"].map(|s| sbuf(&mut m, s, &[p, n], Dtype::Fp32));
        let [mx, init, res] = ["mx", "init", "res"].map(|s| sbuf(&mut m, s, &[p, 1], Dtype::Fp32));
        let special = [f32::NAN, -0.0, f32::INFINITY, f32::NEG_INFINITY, 100.0, -200.0, 0.5];
        let mut x: Vec<f32> = (0..p * n).map(|k| (k % 5) as f32 - 2.5).collect();
        for (k, v) in x.iter_mut().enumerate().step_by(3) {
            *v = special[(k / 3) % 7];
        }
        put(&mut m, &src, &x);
        let mv = [1.0, f32::INFINITY, -0.0, 3.25];
        put(&mut m, &mx, &mv);
        let iv = [10.0, -1.0, f32::NAN, 0.0];
        put(&mut m, &init, &iv);
        let (mt, it, imm) = (Scalar::Tile(mx), Scalar::Tile(init), Scalar::Imm(1.5));
        let calls: [(Option<&Scalar>, ReduceCmd, Option<&Scalar>); 4] = [
            (Some(&mt), ReduceCmd::ResetReduce, None),
            (Some(&imm), ReduceCmd::Reduce, None),
            (None, ReduceCmd::LoadReduce, Some(&it)),
            (Some(&imm), ReduceCmd::Idle, Some(&Scalar::Imm(0.0))),
        ];
        let canon_nan = |v: f32| {
            if v.is_nan() {
                f32::from_bits(0x7FC0_0000)
            } else {
                v
            }
        };
        let mut reg = [0f32; 4];
        for (k, &(max, cmd, ri)) in calls.iter().enumerate() {
            m.exponential(&d32, &src, max, Some(&res), cmd, ri).expect("exponential");
            let got = words(&m, &d32);
            for r in 0..p {
                let mr = match max {
                    Some(Scalar::Tile(_)) => mv[r],
                    Some(Scalar::Imm(v)) => *v as f32,
                    None => 0.0,
                };
                if cmd == ReduceCmd::ResetReduce {
                    reg[r] = 0.0;
                } else if cmd == ReduceCmd::LoadReduce {
                    reg[r] = canon_nan(iv[r]);
                }
                for j in 0..n {
                    let v = canon_nan((((x[r * n + j] - mr) as f64).exp()) as f32);
                    if cmd != ReduceCmd::Idle {
                        reg[r] = canon_nan(reg[r] + v);
                    }
                    assert_eq!(got[r * n + j], v.to_bits(), "call {k} ({r}, {j})");
                }
            }
            let got_res = words(&m, &res);
            for r in 0..p {
                assert_eq!(got_res[r], reg[r].to_bits(), "call {k} register {r}");
            }
        }
        // A NaN element (row 0) or a NaN reduce_init (row 2) makes the register NaN; exp(98.5)
        // overflows float32 to +inf (row 1).
        assert!(reg[0].is_nan() && reg[2].is_nan() && reg[1] == f32::INFINITY);
        let bad = sbuf(&mut m, "bad", &[p, n], Dtype::Tf32);
        let e = m.exponential(&d32, &bad, None, None, ReduceCmd::Idle, None).expect_err("tf32 src");
        assert_eq!(e.rule(), Some("exponential_dtype"));
        let e = m.exponential(&d32, &src, None, None, ReduceCmd::Reset, None).expect_err("reset");
        assert!(e.to_string().contains("reduce_cmd"));
        let e = m
            .exponential(&d32, &src, None, None, ReduceCmd::Reduce, Some(&imm))
            .expect_err("reduce_init without load_reduce");
        assert!(e.to_string().contains("reduce_init"));
    }

    /// range_select against an oracle of the documented numpy equivalent: each partition's
    /// bounds (a NaN bound selects nothing), both comparisons on the float32 index, the fill
    /// float32's lowest (-inf once rounded to bf16), NaN kept (canonical), -0 kept, and the
    /// register's max over the float32 results, continued by `reduce` on a second call.
    #[test]
    fn range_select_against_the_documented_numpy_equivalent() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (5usize, 12usize);
        let data = sbuf(&mut m, "data", &[p, 3, 4], Dtype::Fp32);
        let dst = sbuf(&mut m, "dst", &[p, n], Dtype::Bf16);
        let dst32 = sbuf(&mut m, "dst32", &[p, n], Dtype::Fp32);
        let (lo, hi) =
            (sbuf(&mut m, "lo", &[p, 1], Dtype::Fp32), sbuf(&mut m, "hi", &[p, 1], Dtype::Fp32));
        let res = sbuf(&mut m, "res", &[p, 1], Dtype::Fp32);
        let special = [f32::NAN, -0.0, f32::INFINITY, f32::NEG_INFINITY, 2.5, 2.5];
        let x: Vec<f32> =
            (0..p * n)
                .map(|k| {
                    if k % 5 == 2 {
                        special[(k / 5) % special.len()]
                    } else {
                        (k % 9) as f32 - 4.0
                    }
                })
                .collect();
        put(&mut m, &data, &x);
        let start = 100i64;
        let b0 = [100.0, 103.0, 98.0, f32::NAN, 111.0];
        let b1 = [111.0, 105.5, 104.0, 110.0, 111.0];
        put(&mut m, &lo, &b0);
        put(&mut m, &hi, &b1);
        let (lo_s, hi_s) = (Scalar::Tile(lo), Scalar::Tile(hi));
        let cmp = [AluOp::GreaterEqual, AluOp::Less];
        for (d, cmd) in [(&dst32, ReduceCmd::ResetReduce), (&dst, ReduceCmd::Reduce)] {
            m.range_select(
                d,
                &data,
                cmp,
                [&lo_s, &hi_s],
                cmd,
                Some(&res),
                AluOp::Maximum,
                start,
                Some(f32::MIN as f64),
            )
            .expect("range_select");
        }
        let got32 = words(&m, &dst32);
        let got16 = m.read_tile(&dst).expect("read");
        let reg = m.read_f32(&res).expect("res");
        for r in 0..p {
            let mut want_max = f32::NEG_INFINITY;
            for j in 0..n {
                let i = (start + j as i64) as f32;
                let v = x[r * n + j];
                let want = if i >= b0[r] && i < b1[r] {
                    if v.is_nan() {
                        f32::from_bits(0x7FC0_0000)
                    } else {
                        v
                    }
                } else {
                    f32::MIN
                };
                // Twice over the same values: max(max(x)) = max(x).
                want_max =
                    if want.is_nan() || want_max.is_nan() { f32::NAN } else { want_max.max(want) };
                assert_eq!(got32[r * n + j], want.to_bits(), "fp32 ({r}, {j})");
                let b16 = u16::from_le_bytes([got16[2 * (r * n + j)], got16[2 * (r * n + j) + 1]]);
                let want16 = if want == f32::MIN {
                    0xFF80 // float32's lowest rounds to -inf in bf16 (nearest even)
                } else {
                    (want.to_bits() >> 16) as u16 // exact in bf16 (small integers, specials)
                };
                assert_eq!(b16, want16, "bf16 ({r}, {j})");
            }
            assert_eq!(
                reg[r].to_bits() | (reg[r].is_nan() as u32 * 0x0040_0000),
                want_max.to_bits() | (want_max.is_nan() as u32 * 0x0040_0000),
                "register {r}"
            );
        }
        // A NaN bound compares false: partition 3 is all fill, its maximum the fill.
        assert_eq!(reg[3], f32::MIN);
        // The rules, each naming its argument.
        let call = |m: &mut Machine, cmp: [AluOp; 2], cmd, red, start, fill, on: &Tile| {
            m.range_select(&dst, on, cmp, [&lo_s, &hi_s], cmd, None, red, start, fill)
        };
        let rr = ReduceCmd::ResetReduce;
        let mx = AluOp::Maximum;
        let fill = Some(f32::MIN as f64);
        let bad = [
            (call(&mut m, [AluOp::Add, cmp[1]], rr, mx, 0, fill, &data), "comp_op0"),
            (call(&mut m, [cmp[0], AluOp::NotEqual], rr, mx, 0, fill, &data), "comp_op1"),
            (call(&mut m, cmp, rr, AluOp::Add, 0, fill, &data), "reduce_op"),
            (call(&mut m, cmp, ReduceCmd::LoadReduce, mx, 0, fill, &data), "reduce_cmd"),
            (call(&mut m, cmp, rr, mx, 0, Some(0.0), &data), "on_false_value"),
            (call(&mut m, cmp, rr, mx, 1 << 24, fill, &data), "range_start"),
        ];
        for (r, arg) in bad {
            assert_eq!(r.expect_err(arg).arg(), Some(arg));
        }
        let ints = sbuf(&mut m, "ints", &[p, n], Dtype::Int32);
        let e = call(&mut m, cmp, rr, mx, 0, fill, &ints).expect_err("int");
        assert_eq!((e.arg(), e.rule()), (Some("on_true_tile"), Some("range_select_dtype")));
        let short = sbuf(&mut m, "short", &[p, n - 1], Dtype::Fp32);
        put(&mut m, &short, &vec![0.0; p * (n - 1)]);
        let e = call(&mut m, cmp, rr, mx, 0, fill, &short).expect_err("shape");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("shape")));
        let lo16 = sbuf(&mut m, "lo16", &[p, 1], Dtype::Bf16);
        let e = m
            .range_select(&dst, &data, cmp, [&Scalar::Tile(lo16), &hi_s], rr, None, mx, 0, fill)
            .expect_err("bf16 bound");
        assert_eq!((e.arg(), e.rule()), (Some("bound0"), Some("fp32_operand")));
    }

    /// tensor_scalar_cumulative against the documented pseudocode, literally: each op1 with
    /// its identity (subtract's running `v - reg` alternates), load_reduce from a per-partition
    /// imm1, reduce continuing the register of the previous call, NaN and infinities carried,
    /// a bf16 dst rounded once per element; and each rule naming its argument.
    #[test]
    fn tensor_scalar_cumulative_against_the_documented_pseudocode() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (3usize, 7usize);
        let src = sbuf(&mut m, "src", &[p, n], Dtype::Fp32);
        let dst = sbuf(&mut m, "dst", &[p, n], Dtype::Fp32);
        let x: Vec<f32> = vec![
            1.0,
            2.0,
            -3.0,
            0.5,
            f32::INFINITY,
            4.0,
            -0.0, //
            1e8,
            1.0,
            1.0,
            1.0,
            -1e8,
            2.0,
            0.25, //
            f32::NAN,
            1.0,
            2.0,
            3.0,
            4.0,
            5.0,
            6.0,
        ];
        put(&mut m, &src, &x);
        let imm1 = sbuf(&mut m, "imm1", &[p, 1], Dtype::Fp32);
        put(&mut m, &imm1, &[10.0, -1.0, 0.5]);
        let oracle = |op0: AluOp, imm0: f32, op1: AluOp, init: &[f32]| -> Vec<f32> {
            let mut out = Vec::new();
            for r in 0..p {
                let mut reg = init[r];
                for &v in &x[r * n..(r + 1) * n] {
                    let a = alu::apply(op0, v, imm0);
                    reg = match op1 {
                        AluOp::Add => a + reg,
                        AluOp::Subtract => a - reg,
                        AluOp::Multiply => a * reg,
                        AluOp::Maximum => alu::apply(AluOp::Maximum, a, reg),
                        _ => alu::apply(AluOp::Minimum, a, reg),
                    };
                    out.push(canon(reg));
                }
            }
            out
        };
        let cases = [
            (AluOp::Multiply, 2.0, AluOp::Add, [0.0; 3]),
            (AluOp::Add, 1.0, AluOp::Subtract, [0.0; 3]),
            (AluOp::Multiply, 0.5, AluOp::Multiply, [1.0; 3]),
            (AluOp::Subtract, 1.0, AluOp::Maximum, [f32::NEG_INFINITY; 3]),
            (AluOp::Add, 0.0, AluOp::Minimum, [f32::INFINITY; 3]),
        ];
        for (op0, imm0, op1, init) in cases {
            m.tensor_scalar_cumulative(
                &dst,
                &src,
                op0,
                op1,
                &Scalar::Imm(imm0 as f64),
                None,
                ReduceCmd::ResetReduce,
            )
            .expect("cumulative");
            let got = m.read_f32(&dst).expect("read");
            let want = oracle(op0, imm0, op1, &init);
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{op0} {op1} element {k}");
            }
        }
        // load_reduce from imm1, then reduce continuing from the last values.
        let add = AluOp::Add;
        let one = Scalar::Imm(1.0);
        m.tensor_scalar_cumulative(
            &dst,
            &src,
            AluOp::Multiply,
            add,
            &one,
            Some(&Scalar::Tile(imm1)),
            ReduceCmd::LoadReduce,
        )
        .expect("load");
        let first = m.read_f32(&dst).expect("read");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&first), bits(&oracle(AluOp::Multiply, 1.0, add, &[10.0, -1.0, 0.5])));
        let bf = sbuf(&mut m, "bf", &[p, n], Dtype::Bf16);
        m.tensor_scalar_cumulative(&bf, &src, AluOp::Multiply, add, &one, None, ReduceCmd::Reduce)
            .expect("reduce");
        let last: Vec<f32> = (0..p).map(|r| first[r * n + n - 1]).collect();
        let cont = oracle(AluOp::Multiply, 1.0, add, &last);
        let got = m.read_tile(&bf).expect("read");
        for (k, w) in cont.iter().enumerate() {
            let g = u16::from_le_bytes([got[2 * k], got[2 * k + 1]]);
            // bf16 nearest even of the float32 value (a NaN quieted).
            let b = w.to_bits();
            let want =
                if w.is_nan() { 0x7FC0 } else { ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16 };
            assert_eq!(g, want, "element {k}");
        }
        // The rules.
        let imm = Scalar::Imm(1.0);
        let rc = ReduceCmd::ResetReduce;
        let e = m
            .tensor_scalar_cumulative(&dst, &src, AluOp::BitwiseAnd, add, &imm, None, rc)
            .expect_err("op0");
        assert_eq!(e.arg(), Some("op0"));
        let e = m
            .tensor_scalar_cumulative(&dst, &src, add, AluOp::Divide, &imm, None, rc)
            .expect_err("op1");
        assert_eq!(e.arg(), Some("op1"));
        let e = m
            .tensor_scalar_cumulative(&dst, &src, add, add, &imm, None, ReduceCmd::Idle)
            .expect_err("cmd");
        assert_eq!(e.arg(), Some("reduce_cmd"));
        let e = m
            .tensor_scalar_cumulative(&dst, &src, add, add, &imm, None, ReduceCmd::LoadReduce)
            .expect_err("imm1");
        assert_eq!(e.arg(), Some("imm1"));
        let ints = sbuf(&mut m, "ints", &[p, n], Dtype::Int32);
        let e =
            m.tensor_scalar_cumulative(&ints, &src, add, add, &imm, None, rc).expect_err("int32");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("cumulative_dtype")));
        let short = sbuf(&mut m, "short", &[p, n - 1], Dtype::Fp32);
        let e =
            m.tensor_scalar_cumulative(&short, &src, add, add, &imm, None, rc).expect_err("shape");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("shape")));
        let bf1 = sbuf(&mut m, "bf1", &[p, 1], Dtype::Bf16);
        let e = m
            .tensor_scalar_cumulative(&dst, &src, add, add, &Scalar::Tile(bf1), None, rc)
            .expect_err("imm0 dtype");
        assert_eq!((e.arg(), e.rule()), (Some("imm0"), Some("fp32_operand")));
    }
}
