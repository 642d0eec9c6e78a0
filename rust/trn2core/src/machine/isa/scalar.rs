//! The Scalar engine's `activation` and `activation_reduce`:
//! `dst = func(data * scale + bias)`, with an optional add-reduction of the float32 results
//! into the engine's 128 per-partition registers (`reduce_cmd`) and a read-out of the registers
//! into `reduce_res`.
//!
//! Arithmetic (ours where unpublished): `data * scale` and `+ bias` are two float32 operations
//! (each rounded); `func` follows [`super::act`]'s float64 rule (*not the chip's bits*); the
//! registers add the float32 results in order, `reg = reg + r[i]`, after a reset to +0.

use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::record::{flags, Engine, Opcode, Queue, Region};
use super::super::Machine;
use super::act::{self, ActFunc};
use super::alu::{self, canon, AluOp};
use super::reduce::identity;
use super::{dtype_rule, shape_rule, Opnd, ReduceCmd, Scalar};
use crate::machine::tile::Tile;

/// The optional parts of an `activation`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ActivationArgs {
    /// Added after the scale: a constant or a `[P, 1]` tile (any dtype but tf32).
    pub bias: Option<Scalar>,
    /// Multiplies the input: a constant or a `[P, 1]` fp32 tile (1.0 when `None`).
    pub scale: Option<Scalar>,
    /// The reduction operator of the registers (only `add`).
    pub reduce_op: Option<AluOp>,
    /// Tile (`[P, 1]`) receiving the registers after this instruction.
    pub reduce_res: Option<Tile>,
    /// What the instruction does to the registers.
    pub reduce_cmd: ReduceCmd,
}

/// The arguments of an `activate2` after its `op` and `data`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Activate2Args {
    /// The two tensor-scalar stages: operator (`None`: bypass), immediate, reversed.
    pub stages: [(Option<AluOp>, Scalar, bool); 2],
    /// The parameter of a parameterized function (none of the machine's functions takes one).
    pub relu_param: Option<Scalar>,
    /// The registers' reduction operator (add, maximum, minimum, abs_max, abs_min).
    pub reduce_op: Option<AluOp>,
    /// Tile (`[P, 1]`) receiving the registers after this instruction.
    pub reduce_res: Option<Tile>,
    /// What the instruction does to the registers.
    pub reduce_cmd: ReduceCmd,
}

/// `activate2`'s `(op0, op1)` pairs, as documented (`None`: bypass).
const ACTIVATE2_PAIRS: [(Option<AluOp>, Option<AluOp>); 6] = [
    (Some(AluOp::Multiply), Some(AluOp::Add)),
    (Some(AluOp::Multiply), Some(AluOp::Subtract)),
    (Some(AluOp::Multiply), None),
    (Some(AluOp::Add), None),
    (Some(AluOp::Subtract), None),
    (None, None),
];

impl Machine {
    /// `activate2` (Scalar engine; the documentation marks it NeuronCore-v4 and newer):
    /// `dst = op((data op0 imm0) op1 imm1)`, each stage a float32 operation (or bypassed), then
    /// the function by [`super::act`]'s rule; the float32 results reduced into the Scalar
    /// engine's registers by `reduce_cmd` and `reduce_op`, `reduce_res` receiving them.
    pub fn activate2(
        &mut self, dst: &Tile, func: ActFunc, data: &Tile, args: &Activate2Args,
    ) -> Result<()> {
        let (opc, engine) = (Opcode::Activate2, Engine::Scalar);
        let [(op0, imm0, rev0), (op1, imm1, rev1)] = &args.stages;
        if !ACTIVATE2_PAIRS.contains(&(*op0, *op1)) {
            let arg = if ACTIVATE2_PAIRS.iter().any(|p| p.0 == *op0) { "op1" } else { "op0" };
            let show = |o: &Option<AluOp>| o.map_or("bypass", |o| o.name());
            return Err(Error::value(
                arg,
                format!(
                    "(op0, op1) = ({}, {}); activate2 takes (multiply, add), (multiply, \
                     subtract), (multiply, bypass), (add, bypass), (subtract, bypass) or \
                     (bypass, bypass)",
                    show(op0),
                    show(op1)
                ),
            ));
        }
        for (arg, rev, op) in [("reverse0", rev0, op0), ("reverse1", rev1, op1)] {
            if *rev && op.is_none() {
                return Err(Error::value(arg, format!("{arg} needs its operator set")));
            }
        }
        let reduce_op = match args.reduce_op {
            Some(
                op @ (AluOp::Add | AluOp::Maximum | AluOp::Minimum | AluOp::AbsMax | AluOp::AbsMin),
            ) => Some(op),
            Some(op) => {
                return Err(Error::value(
                    "reduce_op",
                    format!(
                    "got {op}; activate2 reduces with add, maximum, minimum, abs_max or abs_min"
                ),
                ))
            }
            None => None,
        };
        let cmd = args.reduce_cmd;
        if cmd == ReduceCmd::LoadReduce {
            return Err(Error::value(
                "reduce_cmd",
                "activate2 takes idle, reset, reduce or reset_reduce",
            ));
        }
        let op = match (cmd, reduce_op) {
            (ReduceCmd::Idle, _) => AluOp::Add,
            (_, Some(op)) => op,
            (_, None) => {
                return Err(Error::value(
                    "reduce_op",
                    format!("reduce_cmd={} needs a reduce_op", cmd.name()),
                ))
            }
        };
        let (a, d) = self.data_dst_operands(opc, engine, data, dst)?;
        let (p, n) = (a.p(), a.n());
        let res = self.reduce_res_operand(args.reduce_res.as_ref(), engine, p)?;
        let mut reads: Vec<Region> = vec![a.region()];
        let mut imm = Vec::with_capacity(3);
        let relu = args.relu_param.unwrap_or(Scalar::Imm(0.0));
        for (arg, s) in [("imm0", imm0), ("imm1", imm1), ("relu_param", &relu)] {
            imm.push(self.scalar_f32(arg, s, p, engine, &mut reads)?);
        }
        let mut x = self.gather_f32(data)?;
        let p0 = dst.start_partition as usize;
        for (row, xi) in x.chunks_mut(n.max(1)).enumerate() {
            for v in xi.iter_mut() {
                for (k, (o, rev)) in [(op0, rev0), (op1, rev1)].into_iter().enumerate() {
                    if let Some(o) = o {
                        *v = canon(alu::apply_ordered(*o, *v, imm[k][row], *rev));
                    }
                }
                *v = act::eval(func, *v);
            }
            let reg = &mut self.act_regs[p0 + row];
            if matches!(cmd, ReduceCmd::Reset | ReduceCmd::ResetReduce) {
                *reg = identity(op);
            }
            if matches!(cmd, ReduceCmd::Reduce | ReduceCmd::ResetReduce) {
                for &v in xi.iter() {
                    *reg = alu::apply(op, *reg, v);
                }
            }
        }
        self.finish_activation(opc, (&a, &d, &x), res.as_ref(), &reads)
    }

    /// The Scalar engine's write-back: `x` into `d`, the registers into `res` when given
    /// (a read-out that costs extra), and the instruction recorded reading `reads`.
    fn finish_activation(
        &mut self, opc: Opcode, (a, d, x): (&Opnd, &Opnd, &[f32]), res: Option<&Opnd>,
        reads: &[Region],
    ) -> Result<()> {
        self.scatter_f32(d, x)?;
        let mut writes: Vec<Region> = vec![d.region()];
        let mut f = super::operand_flags(&[a], Some(d));
        if let Some(o) = res {
            let p0 = d.tile.start_partition as usize;
            let vals: Vec<f32> = self.act_regs[p0..p0 + d.p() as usize].to_vec();
            self.scatter_f32(o, &vals)?;
            writes.push(o.region());
            f |= flags::READ_ACCUMULATOR;
        }
        let cost = Self::cost_input(d.n(), d.p(), f);
        self.program.push(opc, Queue::Engine(Engine::Scalar), reads, &writes, cost);
        Ok(())
    }

    /// `activation` (Scalar engine): see the module doc.
    pub fn activation(
        &mut self, dst: &Tile, func: ActFunc, data: &Tile, args: &ActivationArgs,
    ) -> Result<()> {
        self.activation_impl(Opcode::Activation, dst, func, data, args)
    }

    #[allow(clippy::too_many_arguments)]
    /// `activation_reduce` (Scalar engine): `activation` with `reduce_cmd=reset_reduce`,
    /// writing the sums into `reduce_res`.
    pub fn activation_reduce(
        &mut self, dst: &Tile, func: ActFunc, data: &Tile, reduce_op: AluOp, reduce_res: &Tile,
        bias: Option<Scalar>, scale: Option<Scalar>,
    ) -> Result<()> {
        let args = ActivationArgs {
            bias,
            scale,
            reduce_op: Some(reduce_op),
            reduce_res: Some(*reduce_res),
            reduce_cmd: ReduceCmd::ResetReduce,
        };
        self.activation_impl(Opcode::ActivationReduce, dst, func, data, &args)
    }

    fn activation_impl(
        &mut self, opc: Opcode, dst: &Tile, func: ActFunc, data: &Tile, args: &ActivationArgs,
    ) -> Result<()> {
        let engine = Engine::Scalar;
        if let Some(op) = args.reduce_op {
            if op != AluOp::Add {
                return Err(Error::value(
                    "reduce_op",
                    format!("got {op}; the Scalar engine's activation reduces with add only"),
                ));
            }
        }
        let accumulates = matches!(args.reduce_cmd, ReduceCmd::Reduce | ReduceCmd::ResetReduce);
        if accumulates && args.reduce_op.is_none() {
            return Err(Error::value(
                "reduce_op",
                format!("reduce_cmd={} needs reduce_op=add", args.reduce_cmd.name()),
            ));
        }
        if args.reduce_cmd == ReduceCmd::LoadReduce {
            return Err(Error::value(
                "reduce_cmd",
                "activation takes idle, reset, reduce or reset_reduce",
            ));
        }
        let (a, d) = self.data_dst_operands(opc, engine, data, dst)?;
        let (p, n) = (a.p(), a.n());
        let res = self.reduce_res_operand(args.reduce_res.as_ref(), engine, p)?;
        let mut reads: Vec<Region> = vec![a.region()];
        let scale = match &args.scale {
            None => vec![1.0; p as usize],
            Some(s) => self.scalar_f32("scale", s, p, engine, &mut reads)?,
        };
        let bias = match &args.bias {
            None => vec![0.0; p as usize],
            Some(Scalar::Imm(v)) => vec![*v as f32; p as usize],
            Some(Scalar::Tile(t)) => {
                if t.dtype == Dtype::Tf32 {
                    return Err(dtype_rule("bias", "bias_dtype", "bias may be any dtype but tf32"));
                }
                let o = self.operand("bias", t, Some(engine), false)?;
                if o.p() != p || o.n() != 1 {
                    return Err(shape_rule(
                        "bias",
                        "shape",
                        format!("expected a [{p}, 1] tile, got {:?}", t.logical_shape()),
                    ));
                }
                reads.push(o.region());
                self.gather_f32(t)?
            }
        };
        let mut x = self.gather_f32(data)?;
        let p0 = dst.start_partition as usize;
        for (row, xi) in x.chunks_mut(n).enumerate() {
            act::scale_bias(xi, scale[row], bias[row]);
            act::apply(func, xi);
            let reg = &mut self.act_regs[p0 + row];
            if matches!(args.reduce_cmd, ReduceCmd::Reset | ReduceCmd::ResetReduce) {
                *reg = 0.0;
            }
            if accumulates {
                for &v in xi.iter() {
                    *reg += v;
                }
                *reg = canon(*reg);
            }
        }
        self.finish_activation(opc, (&a, &d, &x), res.as_ref(), &reads)
    }
}
