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
use super::alu::{canon, AluOp};
use super::reduce::check_reduce_res;
use super::{dtype_rule, shape_rule, ReduceCmd, Scalar};
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

impl Machine {
    /// `activation` (Scalar engine): see the module doc.
    pub fn activation(
        &mut self,
        dst: &Tile,
        func: ActFunc,
        data: &Tile,
        args: &ActivationArgs,
    ) -> Result<()> {
        self.activation_impl(Opcode::Activation, dst, func, data, args)
    }

    #[allow(clippy::too_many_arguments)]
    /// `activation_reduce` (Scalar engine): `activation` with `reduce_cmd=reset_reduce`,
    /// writing the sums into `reduce_res`.
    pub fn activation_reduce(
        &mut self,
        dst: &Tile,
        func: ActFunc,
        data: &Tile,
        reduce_op: AluOp,
        reduce_res: &Tile,
        bias: Option<Scalar>,
        scale: Option<Scalar>,
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
        &mut self,
        opc: Opcode,
        dst: &Tile,
        func: ActFunc,
        data: &Tile,
        args: &ActivationArgs,
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
        let res = match &args.reduce_res {
            Some(t) => {
                let o = self.operand("reduce_res", t, Some(engine), true)?;
                check_reduce_res(&o, p)?;
                Some(o)
            }
            None => None,
        };
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
                    return Err(dtype_rule(
                        "bias",
                        "bias_dtype",
                        "bias may be any dtype but tf32",
                    ));
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
        self.scatter_f32(&d, &x)?;
        let mut writes: Vec<Region> = vec![d.region()];
        let mut f = super::operand_flags(&[&a], Some(&d));
        if let Some(o) = &res {
            let vals: Vec<f32> = self.act_regs[p0..p0 + p as usize].to_vec();
            self.scatter_f32(o, &vals)?;
            writes.push(o.region());
            f |= flags::READ_ACCUMULATOR;
        }
        self.program.push(
            opc,
            Queue::Engine(engine),
            &reads,
            &writes,
            Self::cost_input(n, p, f),
        );
        Ok(())
    }
}
