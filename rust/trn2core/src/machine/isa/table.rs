//! The instruction table: one row per instruction, the one description every surface reads.
//!
//! A row gives the instruction's NKI name, the engines it runs on (and the one NKI picks for
//! `engine=unknown`), and its arguments in order: name, kind, default. Everything else is
//! derived from it:
//! - [`Machine::issue`] takes an instruction's arguments as [`Value`]s, checks them against the
//!   row (count, kinds, required arguments, names in errors), fills the defaults, settles the
//!   queued matmuls, and calls the instruction's method in [`super`]'s files;
//! - the engine rule (`check_engine`) reads the row's engines;
//! - the Python binding converts each argument by its kind (one `Machine.issue` entry, no
//!   per-instruction method), and `trn2core.nki.isa`, the legacy dialect and the
//!   `core.vector/scalar/gpsimd/pe/dma` views read the rows through `_core.instruction_table()`.
//!
//! Adding an instruction: its [`Opcode`] (record.rs), its row and its arm in
//! [`Machine::issue`] (here), its method (values, checks, `record_engine`) in the file of its family;
//! the Python surfaces pick it up from the table (docs/architecture.md, "Adding an instruction").

use crate::engine::{PeTile, PerfMode};
use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::record::{Engine, Opcode};
use super::super::tile::Tile;
use super::super::Machine;
use super::act::ActFunc;
use super::alu::AluOp;
use super::elementwise::DynamicOffset;
use super::scalar::{Activate2Args, ActivationArgs};
use super::{PeOptions, ReduceCmd, Scalar};

/// What an argument holds (how the binding converts it, and what [`Machine::issue`] accepts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A tile (access pattern).
    Tile,
    /// A constant or a `[P, 1]` tile ([`Scalar`]).
    Scalar,
    /// An ALU operator's name ([`AluOp`]).
    Alu,
    /// An activation function's name ([`ActFunc`]).
    Act,
    /// An engine's name; missing means the row's default engine.
    Engine,
    /// A bool.
    Bool,
    /// A float constant.
    Float,
    /// A signed 64-bit integer.
    Int,
    /// An affine pattern `[(step, num), ...]`.
    Pattern,
    /// A `reduce_cmd` name ([`ReduceCmd`]).
    ReduceCmd,
    /// A matmul performance mode's name ([`PerfMode`]).
    PerfMode,
    /// A pair of sizes `(a, b)`.
    Pair,
    /// A DMA queue `0..16`.
    Queue,
    /// A list of integers.
    Ints,
    /// A list of tiles.
    Tiles,
}

impl Kind {
    /// The kind's name as the table export shows it.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Tile => "tile",
            Kind::Scalar => "scalar",
            Kind::Alu => "alu_op",
            Kind::Act => "activation_function",
            Kind::Engine => "engine",
            Kind::Bool => "bool",
            Kind::Float => "float",
            Kind::Int => "int",
            Kind::Pattern => "pattern",
            Kind::ReduceCmd => "reduce_cmd",
            Kind::PerfMode => "perf_mode",
            Kind::Pair => "pair",
            Kind::Queue => "queue",
            Kind::Ints => "ints",
            Kind::Tiles => "tiles",
        }
    }

    /// Whether values of this kind are names (strings) the core parses.
    pub const fn is_name(self) -> bool {
        matches!(self, Kind::Alu | Kind::Act | Kind::Engine | Kind::ReduceCmd | Kind::PerfMode)
    }
}

/// An argument's default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgDefault {
    /// The caller must give it.
    Required,
    /// Optional: absent means "none" (for an engine: the row's default engine).
    Absent,
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A name (operator, reduce command, performance mode).
    Name(&'static str),
}

/// One argument of an instruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arg {
    /// NKI's name for it.
    pub name: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// Its default.
    pub default: ArgDefault,
    /// Another name callers may give it (the machine API's `func` for NKI's `op`).
    pub alias: Option<&'static str>,
}

impl Arg {
    /// The same argument, also accepted as `alias`.
    pub const fn or(self, alias: &'static str) -> Arg {
        Arg { alias: Some(alias), ..self }
    }
}

const fn req(name: &'static str, kind: Kind) -> Arg {
    Arg { name, kind, default: ArgDefault::Required, alias: None }
}

const fn opt(name: &'static str, kind: Kind) -> Arg {
    Arg { name, kind, default: ArgDefault::Absent, alias: None }
}

const fn flag(name: &'static str) -> Arg {
    Arg { name, kind: Kind::Bool, default: ArgDefault::Bool(false), alias: None }
}

const fn int(name: &'static str, default: i64) -> Arg {
    Arg { name, kind: Kind::Int, default: ArgDefault::Int(default), alias: None }
}

const fn named(name: &'static str, kind: Kind, default: &'static str) -> Arg {
    Arg { name, kind, default: ArgDefault::Name(default), alias: None }
}

/// The result tile an instruction's value-returning form (NKI's legacy dialect) allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// The shape of the named input.
    Like(&'static str),
    /// `[P, n]`: the first input's partitions, `n` elements each.
    Columns(usize),
    /// `[1, ...]`: the named input's shape with one partition (a reduction across them).
    Partition(&'static str),
    /// Its own rule (a hand-written form: matmul, transpose, reductions, iota, memset, DMA).
    Own,
}

impl Out {
    /// `(kind, detail)` as the table export shows it.
    pub fn describe(self) -> (&'static str, String) {
        match self {
            Out::Like(a) => ("like", a.to_string()),
            Out::Columns(n) => ("columns", n.to_string()),
            Out::Partition(a) => ("partition", a.to_string()),
            Out::Own => ("own", String::new()),
        }
    }
}

/// One instruction's row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Info {
    /// The instruction.
    pub op: Opcode,
    /// The engines it runs on (empty: a DMA queue).
    pub engines: &'static [Engine],
    /// The engine NKI picks for `engine=unknown` (`None`: a DMA queue).
    pub default_engine: Option<Engine>,
    /// Its arguments, in order.
    pub args: &'static [Arg],
    /// One line: what it computes.
    pub summary: &'static str,
    /// The result tile of its value-returning form.
    pub out: Out,
    /// The result's dtype when the caller names none (`None`: the first tile input's).
    pub out_dtype: Option<Dtype>,
    /// A NeuronCore-v4 (Trainium3) instruction, as the NKI API docs mark it ("Available only on
    /// NeuronCore-v4 and newer"): [`Machine::issue`] refuses it, since Trainium2's NeuronCore
    /// is v3; its semantics are implemented (and tested) in the core all the same.
    pub neuron_core_v4: bool,
}

impl Info {
    /// The index of the argument called `name` (or aliased so).
    pub fn index(&self, name: &str) -> Option<usize> {
        self.args.iter().position(|a| a.name == name || a.alias == Some(name))
    }
}

use Engine::{Gpsimd, Scalar as Act, Tensor, Vector};
use Kind as K;

const DST: Arg = req("dst", K::Tile);
const ENGINE: Arg = opt("engine", K::Engine);

/// A row (the first engine listed is NKI's default for `engine=unknown`).
const fn row(
    op: Opcode, engines: &'static [Engine], out: Out, out_dtype: Option<Dtype>,
    summary: &'static str, args: &'static [Arg],
) -> Info {
    Info {
        op,
        engines,
        default_engine: match engines {
            [first, ..] => Some(*first),
            [] => None,
        },
        args,
        summary,
        out,
        out_dtype,
        neuron_core_v4: false,
    }
}

/// A NeuronCore-v4 row ([`Info::neuron_core_v4`]).
const fn v4(info: Info) -> Info {
    Info { neuron_core_v4: true, ..info }
}

use Dtype::{Fp32, Uint32};
use Opcode as Op;
use Out::{Columns, Like, Own, Partition};

/// The table, in [`Opcode::ALL`]'s order (a test checks): opcode, engines, the result of its
/// value-returning form and that result's dtype, what it computes, its arguments.
#[rustfmt::skip]
pub static TABLE: [Info; Opcode::ALL.len()] = [
    row(Op::NcMatmul, &[Tensor], Own, None,
        "dst = stationary.T @ moving into PSUM (fp32)",
        &[DST, req("stationary", K::Tile), req("moving", K::Tile), opt("accumulate", K::Bool),
            named("perf_mode", K::PerfMode, "none"), opt("tile_position", K::Pair),
            opt("tile_size", K::Pair), flag("is_transpose")],
    ),
    row(Op::NcTranspose, &[Tensor, Vector], Own, None,
        "dst = data.T, bit for bit",
        &[ENGINE, DST, req("data", K::Tile)],
    ),
    row(Op::TensorTensor, &[Vector, Gpsimd], Like("data1"), None,
        "dst = data1 op data2, element by element",
        &[ENGINE, DST, req("data1", K::Tile), req("data2", K::Tile), req("op", K::Alu)],
    ),
    row(Op::TensorScalar, &[Vector, Act, Gpsimd], Like("data"), None,
        "dst = (data op0 operand0) op1 operand1",
        &[ENGINE, DST, req("data", K::Tile), req("op0", K::Alu), req("operand0", K::Scalar),
            flag("reverse0"), opt("op1", K::Alu), opt("operand1", K::Scalar), flag("reverse1")],
    ),
    row(Op::ScalarTensorTensor, &[Vector], Like("data"), None,
        "dst = (data op0 operand0) op1 operand1, operand1 a tile",
        &[DST, req("data", K::Tile), req("op0", K::Alu), req("operand0", K::Scalar),
            req("op1", K::Alu), req("operand1", K::Tile), flag("reverse0"), flag("reverse1")],
    ),
    row(Op::TensorReduce, &[Vector], Own, None,
        "dst = op-reduction of data over its last `axes` free axes",
        &[DST, req("op", K::Alu), req("data", K::Tile), req("axes", K::Int), flag("negate")],
    ),
    row(Op::TensorCopy, &[Vector, Act, Gpsimd], Like("src"), None,
        "dst = src (bits when the dtypes agree)",
        &[ENGINE, DST, req("src", K::Tile)],
    ),
    row(Op::TensorTensorScan, &[Vector], Like("data0"), None,
        "dst[i] = (data0[i] op0 dst[i-1]) op1 data1[i] along the free axis",
        &[DST, req("data0", K::Tile), req("data1", K::Tile), req("initial", K::Scalar),
            req("op0", K::Alu), req("op1", K::Alu), flag("reverse0"), flag("reverse1")],
    ),
    row(Op::TensorScalarReduce, &[Vector], Like("data"), None,
        "dst = data op0 operand0, reduced along the free axis into reduce_res",
        &[DST, req("data", K::Tile), req("op0", K::Alu), req("operand0", K::Scalar),
            req("reduce_op", K::Alu), opt("reduce_res", K::Tile), flag("reverse0"),
            named("reduce_cmd", K::ReduceCmd, "reset_reduce"), opt("reduce_init", K::Scalar),
            flag("negate")],
    ),
    row(Op::Activation, &[Act], Like("data"), None,
        "dst = op(data * scale + bias), optional add-reduction",
        &[DST, req("op", K::Act).or("func"), req("data", K::Tile), opt("bias", K::Scalar),
            opt("scale", K::Scalar), opt("reduce_op", K::Alu), opt("reduce_res", K::Tile),
            named("reduce_cmd", K::ReduceCmd, "idle")],
    ),
    row(Op::ActivationReduce, &[Act], Like("data"), None,
        "activation, its results add-reduced into reduce_res",
        &[DST, req("op", K::Act).or("func"), req("data", K::Tile), req("reduce_op", K::Alu),
            req("reduce_res", K::Tile), opt("bias", K::Scalar), opt("scale", K::Scalar)],
    ),
    row(Op::Reciprocal, &[Vector], Like("data"), None,
        "dst = 1 / data",
        &[DST, req("data", K::Tile)],
    ),
    row(Op::Memset, &[Vector, Gpsimd], Own, None,
        "dst = value",
        &[ENGINE, DST, req("value", K::Float)],
    ),
    row(Op::Iota, &[Gpsimd], Own, None,
        "dst = offset + channel_multiplier * partition + the pattern's affine index",
        &[DST, req("pattern", K::Pattern), int("offset", 0), int("channel_multiplier", 0)],
    ),
    row(Op::AffineSelect, &[Gpsimd], Like("on_true_tile"), None,
        "dst = cmp_op(affine index, 0) ? on_true_tile : on_false_value",
        &[DST, req("pattern", K::Pattern), req("channel_multiplier", K::Int),
            req("on_true_tile", K::Tile), req("on_false_value", K::Float),
            named("cmp_op", K::Alu, "equal"), int("offset", 0)],
    ),
    row(Op::Select, &[Vector], Like("on_true"), None,
        "dst = predicate ? on_true : on_false",
        &[DST, req("predicate", K::Tile), req("on_true", K::Tile), req("on_false", K::Scalar)],
    ),
    row(Op::BnStats, &[Vector], Columns(6), Some(Fp32),
        "per-partition count, mean and M2 of data (6 values per 512 elements)",
        &[DST, req("data", K::Tile)],
    ),
    row(Op::BnAggr, &[Vector], Columns(2), Some(Fp32),
        "mean and variance from bn_stats triples",
        &[DST, req("data", K::Tile)],
    ),
    row(Op::DmaCopy, &[], Own, None,
        "dst = src over a DMA queue (HBM and SBUF)",
        &[DST, req("src", K::Tile), opt("queue", K::Queue)],
    ),
    row(Op::Max8, &[Vector], Columns(8), None,
        "dst = the 8 largest values of each partition of src, in descending order",
        &[DST, req("src", K::Tile)],
    ),
    row(Op::NcFindIndex8, &[Vector], Columns(8), Some(Uint32),
        "dst = where each of the 8 vals first occurs in its partition of data",
        &[DST, req("data", K::Tile), req("vals", K::Tile)],
    ),
    row(Op::NcMatchReplace8, &[Vector], Like("data"), None,
        "dst = data with the first occurrence of each of the 8 vals replaced by imm; \
         their indices into dst_idx",
        &[DST, req("data", K::Tile), req("vals", K::Tile), req("imm", K::Float),
            opt("dst_idx", K::Tile)],
    ),
    row(Op::NcStreamShuffle, &[Vector], Own, None,
        "dst partition i of each 32-partition quadrant = src partition shuffle_mask[i] of it \
         (255: unmodified)",
        &[DST, req("src", K::Tile), req("shuffle_mask", K::Ints)],
    ),
    row(Op::NcNGather, &[Gpsimd], Like("indices"), None,
        "dst[p, j] = data[p, indices[p, j]] (data's free axes flattened; uint32 indices)",
        &[DST, req("data", K::Tile), req("indices", K::Tile)],
    ),
    row(Op::DmaTranspose, &[], Own, None,
        "dst = src with its axes permuted ([1,0], [2,1,0] or [3,1,2,0]) over a DMA queue \
         (HBM or SBUF to SBUF, 2- or 4-byte elements)",
        &[DST, req("src", K::Tile), opt("axes", K::Ints), flag("hwdge"), opt("queue", K::Queue)],
    ),
    row(Op::RangeSelect, &[Vector], Own, None,
        "dst = on_true_tile where comp_op0(range_start + j, bound0) and comp_op1(range_start + j, \
         bound1) for free index j, else on_false_value; max-reduced into reduce_res",
        &[DST, req("on_true_tile", K::Tile), req("comp_op0", K::Alu), req("comp_op1", K::Alu),
            req("bound0", K::Scalar), req("bound1", K::Scalar),
            named("reduce_cmd", K::ReduceCmd, "reset_reduce"), opt("reduce_res", K::Tile),
            named("reduce_op", K::Alu, "maximum"), int("range_start", 0),
            opt("on_false_value", K::Float)],
    ),
    row(Op::SelectReduce, &[Vector], Own, None,
        "dst = predicate ? on_true : on_false (reverse_pred negates), max-reduced into reduce_res",
        &[DST, req("predicate", K::Tile), req("on_true", K::Tile), req("on_false", K::Scalar),
            opt("reduce_res", K::Tile), named("reduce_cmd", K::ReduceCmd, "idle"),
            named("reduce_op", K::Alu, "maximum"), flag("reverse_pred")],
    ),
    row(Op::TensorPartitionReduce, &[Gpsimd], Partition("data"), None,
        "dst[0, j] = op over the partitions p of data[p, j]",
        &[DST, req("op", K::Alu), req("data", K::Tile)],
    ),
    row(Op::NonzeroWithCount, &[Gpsimd], Own, None,
        "dst = positions + index_offset of src's nonzero elements, padding_val, then their \
         count (partitions 0, 16, .., 112 only)",
        &[DST, req("src", K::Tile), int("index_offset", 0), int("padding_val", -1)],
    ),
    row(Op::SequenceBounds, &[Gpsimd], Own, None,
        "dst[0, 0, i] / dst[0, 1, i] = the start / end (exclusive) of the run of equal \
         segment_ids around i (n / -1 for padding id 0)",
        &[DST, req("segment_ids", K::Tile)],
    ),
    row(Op::TensorScalarCumulative, &[Vector], Own, None,
        "dst[i] = reg = op1(op0(src[i], imm0), reg) along the free axis, reg set by reduce_cmd",
        &[DST, req("src", K::Tile), req("op0", K::Alu), req("op1", K::Alu),
            req("imm0", K::Scalar), opt("imm1", K::Scalar),
            named("reduce_cmd", K::ReduceCmd, "reset_reduce")],
    ),
    v4(row(Op::Exponential, &[Vector], Own, None,
        "dst = exp(src - max_value), add-reduced into reduce_res (NeuronCore-v4's, documented)",
        &[DST, req("src", K::Tile), opt("max_value", K::Scalar), opt("reduce_res", K::Tile),
            named("reduce_cmd", K::ReduceCmd, "idle"), opt("reduce_init", K::Scalar)],
    )),
    row(Op::Dropout, &[Vector], Like("data"), None,
        "dst = data with each element zeroed with probability prob (a deterministic stream, \
         not the chip's)",
        &[DST, req("data", K::Tile), req("prob", K::Scalar)],
    ),
    row(Op::SetRngSeed, &[Vector], Own, None,
        "seeds the Vector engine's random stream with src_seeds' 32-bit value ([1, 1], SBUF or \
         PSUM): the dropouts after it draw that stream in order (ours, not the chip's)",
        &[req("src_seeds", K::Tile)],
    ),
    row(Op::Rng, &[Vector, Gpsimd], Own, None,
        "dst = 32 random bits per element, its least significant ones for a narrower integer \
         dtype (the engine's stream, the Vector engine's seeded by set_rng_seed; ours, not the \
         chip's)",
        &[ENGINE, DST],
    ),
    row(Op::RandSetState, &[Gpsimd, Vector], Own, None,
        "seeds the XORWOW generator of each GpSimd lane (partition) src_seeds covers with its 6 \
         uint32 words (x, y, z, w, v, d; the order is ours): rng on GpSimd then draws them",
        &[req("src_seeds", K::Tile), ENGINE],
    ),
    row(Op::RandGetState, &[Gpsimd, Vector], Own, None,
        "dst = the 6 uint32 XORWOW state words of each GpSimd lane (partition) dst covers",
        &[ENGINE, DST],
    ),
    v4(row(Op::Activate2, &[Act], Own, None,
        "dst = op((data op0 imm0) op1 imm1) (op0/op1 absent: bypass), reduced into reduce_res \
         (NeuronCore-v4's, documented)",
        &[DST, req("op", K::Act), req("data", K::Tile), req("imm0", K::Scalar),
            req("imm1", K::Scalar), opt("op0", K::Alu), opt("op1", K::Alu),
            opt("relu_param", K::Scalar), flag("reverse0"), flag("reverse1"),
            opt("reduce_op", K::Alu), opt("reduce_res", K::Tile),
            named("reduce_cmd", K::ReduceCmd, "idle")],
    )),
    row(Op::TensorCopyDynamicSrc, &[Vector, Act, Gpsimd], Own, None,
        "dst = src moved v * offset_step elements along its partitions, v the integer read \
         from offset (one SBUF element) when it runs, 0 <= v < offset_limit (0: no limit)",
        DYNAMIC_COPY,
    ),
    row(Op::TensorCopyDynamicDst, &[Vector, Act, Gpsimd], Own, None,
        "dst moved v * offset_step elements along its partitions = src, v as for \
         tensor_copy_dynamic_src",
        DYNAMIC_COPY,
    ),
    row(Op::DmaCompute, &[], Own, None,
        "dst = srcs[0] + srcs[1] + ... in float32, in order, rounded once to dst's dtype, over a \
         DMA queue (HBM and SBUF; 1 to 16 sources of dst's element count)",
        &[DST, req("srcs", K::Tiles), opt("queue", K::Queue)],
    ),
    row(Op::CoreBarrier, &[Gpsimd, Vector, Act], Own, None,
        "wait on the engine until both physical cores reach the barrier (the front end holds it \
         to the later core's time); later accesses of the HBM tensor data wait for it",
        &[ENGINE, req("data", K::Tile)],
    ),
    row(Op::LocalGather, &[Gpsimd], Own, None,
        "dst[p, j*m + e] = src_buffer[p, i_j + e], e < m = num_elem_per_idx, i_j the j-th of the \
         uint16 index values of p's 16-partition group (partitions first); num_valid_indices \
         of them (0: all)",
        &[DST, req("src_buffer", K::Tile), req("index", K::Tile), int("num_elem_per_idx", 1),
            int("num_valid_indices", 0)],
    ),
    // NeuronCore-v4 only (the NKI API docs: "Available only on NeuronCore-v4 and newer"): rows
    // so that a Trainium2 kernel calling them gets the rule at its line; not computed.
    v4(row(Op::NcMatmulMx, &[Tensor], Own, None,
        "dst = the MXFP8/MXFP4 stationary.T @ moving, dequantized by their scales \
         (NeuronCore-v4's, documented)",
        &[DST, req("stationary", K::Tile), req("moving", K::Tile),
            req("stationary_scale", K::Tile), req("moving_scale", K::Tile),
            opt("tile_position", K::Pair), opt("tile_size", K::Pair), opt("accumulate", K::Bool)],
    )),
    v4(row(Op::QuantizeMx, &[Vector], Own, None,
        "dst, dst_scale = src (FP16/BF16) quantized to MXFP8 data and its group scales \
         (NeuronCore-v4's, documented)",
        &[DST, req("src", K::Tile), req("dst_scale", K::Tile)],
    )),
    v4(row(Op::Rand2, &[Vector], Own, None,
        "dst = uniform pseudo-random values in [min, max] (XORWOW; NeuronCore-v4's, documented)",
        &[DST, req("min", K::Scalar), req("max", K::Scalar)],
    )),
];

/// The arguments of `tensor_copy_dynamic_src` and `_dst`: NKI's (engine, dst, src) and the
/// dynamic offset NKI writes inside the moved side's index (its tile, the elements one unit
/// moves, the exclusive bound on its value).
const DYNAMIC_COPY: &[Arg] = &[
    ENGINE,
    DST,
    req("src", K::Tile),
    req("offset", K::Tile),
    int("offset_step", 1),
    int("offset_limit", 0),
];

/// The row of `op`.
pub fn info(op: Opcode) -> &'static Info {
    &TABLE[op as usize]
}

/// An argument's value, as the binding converted it by its [`Kind`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A tile.
    Tile(Tile),
    /// A float constant (also a [`Kind::Scalar`] constant).
    Float(f64),
    /// An integer (also a DMA queue).
    Int(i64),
    /// A bool.
    Bool(bool),
    /// An operator, function, engine, command or mode, by its canonical name
    /// ([`Value::name`] parses it).
    Name(&'static str),
    /// An affine pattern.
    Pattern(Vec<(i64, u64)>),
    /// A pair of sizes.
    Pair(usize, usize),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A list of tiles.
    Tiles(Vec<Tile>),
}

impl Value {
    /// The value of a name argument of kind `kind` (an operator, function, engine, command or
    /// mode): parsed here, so an unknown name is an error naming `arg` before the call, and
    /// kept as the canonical `&'static str` (no allocation per call).
    pub fn name(kind: Kind, arg: &str, s: &str) -> Result<Value> {
        Ok(Value::Name(match kind {
            K::Alu => AluOp::parse(arg, s)?.name(),
            K::Act => ActFunc::parse(arg, s)?.name(),
            K::Engine => Engine::parse(arg, s)?.name(),
            K::ReduceCmd => ReduceCmd::parse(arg, s)?.name(),
            K::PerfMode => PerfMode::parse(arg, s)?.name(),
            other => {
                return Err(Error::value(
                    arg,
                    format!("expected {}, got the name {s:?}", kind_expected(other)),
                ))
            }
        }))
    }

    /// Elements of a tile value (0 otherwise): the binding's measure of an instruction's work.
    pub fn elements(&self) -> usize {
        match self {
            Value::Tile(t) => usize::try_from(t.elements_u128()).unwrap_or(usize::MAX),
            Value::Tiles(v) => v.iter().fold(0usize, |n, t| {
                n.saturating_add(usize::try_from(t.elements_u128()).unwrap_or(usize::MAX))
            }),
            _ => 0,
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Value::Tile(_) => "a tile",
            Value::Float(_) => "a float",
            Value::Int(_) => "an integer",
            Value::Bool(_) => "a bool",
            Value::Name(_) => "a name",
            Value::Pattern(_) => "a pattern",
            Value::Pair(..) => "a pair",
            Value::Ints(_) => "a list of integers",
            Value::Tiles(_) => "a list of tiles",
        }
    }
}

/// An instruction's arguments checked against its row: every slot filled (given, default, or
/// absent when optional).
pub struct Args {
    info: &'static Info,
    vals: Vec<Option<Value>>,
}

impl Args {
    /// Checks `vals` (one slot per argument of `op`'s row, `None` = not given) and fills the
    /// defaults; errors name the argument.
    pub fn new(op: Opcode, mut vals: Vec<Option<Value>>) -> Result<Args> {
        let info = info(op);
        if vals.len() > info.args.len() {
            return Err(Error::value(
                "args",
                format!(
                    "{} takes {} arguments ({}), got {}",
                    op.name(),
                    info.args.len(),
                    info.args.iter().map(|a| a.name).collect::<Vec<_>>().join(", "),
                    vals.len()
                ),
            ));
        }
        vals.resize(info.args.len(), None);
        for (a, v) in info.args.iter().zip(vals.iter_mut()) {
            match v {
                None => {
                    *v = match a.default {
                        ArgDefault::Required => {
                            return Err(Error::value(
                                a.name,
                                format!("{} needs {}", op.name(), a.name),
                            ))
                        }
                        ArgDefault::Absent => None,
                        ArgDefault::Bool(b) => Some(Value::Bool(b)),
                        ArgDefault::Int(i) => Some(Value::Int(i)),
                        ArgDefault::Name(s) => Some(Value::Name(s)),
                    }
                }
                Some(x) => check_kind(a, x)?,
            }
        }
        Ok(Args { info, vals })
    }

    fn slot(&self, name: &str) -> (&'static str, Option<&Value>) {
        let i = self
            .info
            .index(name)
            .unwrap_or_else(|| panic!("{} has no argument {name}", self.info.op.name()));
        (self.info.args[i].name, self.vals[i].as_ref())
    }

    fn need(&self, name: &str) -> Result<&Value> {
        match self.slot(name) {
            (arg, None) => Err(Error::value(arg, format!("{} needs {arg}", self.info.op.name()))),
            (_, Some(v)) => Ok(v),
        }
    }

    fn tile(&self, name: &str) -> Result<Tile> {
        self.opt_tile(name)?
            .ok_or_else(|| Error::value(name, format!("{} needs {name}", self.info.op.name())))
    }

    fn opt_tile(&self, name: &str) -> Result<Option<Tile>> {
        Ok(match self.slot(name).1 {
            Some(Value::Tile(t)) => Some(*t),
            _ => None,
        })
    }

    fn opt_scalar(&self, name: &str) -> Result<Option<Scalar>> {
        Ok(match self.slot(name).1 {
            Some(Value::Tile(t)) => Some(Scalar::Tile(*t)),
            Some(Value::Float(v)) => Some(Scalar::Imm(*v)),
            Some(Value::Int(v)) => Some(Scalar::Imm(*v as f64)),
            _ => None,
        })
    }

    fn scalar(&self, name: &str) -> Result<Scalar> {
        self.need(name)?;
        Ok(self.opt_scalar(name)?.expect("checked kind"))
    }

    fn name_of(&self, name: &str) -> Option<(&'static str, &str)> {
        match self.slot(name) {
            (arg, Some(Value::Name(s))) => Some((arg, *s)),
            _ => None,
        }
    }

    fn opt_alu(&self, name: &str) -> Result<Option<AluOp>> {
        let Some((arg, s)) = self.name_of(name) else {
            return Ok(None);
        };
        let op = AluOp::parse(arg, s)?;
        if !op.is_elementwise() && self.info.op != Opcode::TensorPartitionReduce {
            return Err(Error::value(arg, super::alu::NOT_ELEMENTWISE));
        }
        Ok(Some(op))
    }

    fn alu(&self, name: &str) -> Result<AluOp> {
        self.need(name)?;
        Ok(self.opt_alu(name)?.expect("checked kind"))
    }

    fn act(&self, name: &str) -> Result<ActFunc> {
        let (arg, s) = self.name_of(name).expect("a required name");
        ActFunc::parse(arg, s)
    }

    fn reduce_cmd(&self, name: &str) -> Result<ReduceCmd> {
        let (arg, s) = self.name_of(name).expect("a defaulted name");
        ReduceCmd::parse(arg, s)
    }

    /// The engine argument, or the row's default engine when absent.
    fn engine(&self) -> Result<Engine> {
        match self.name_of("engine") {
            Some((arg, s)) => Engine::parse(arg, s),
            None => Ok(self.info.default_engine.expect("an engine instruction")),
        }
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.slot(name).1, Some(Value::Bool(true)))
    }

    fn opt_flag(&self, name: &str) -> Option<bool> {
        match self.slot(name).1 {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    fn int(&self, name: &str) -> Result<i64> {
        match self.need(name)? {
            Value::Int(i) => Ok(*i),
            _ => unreachable!("checked kind"),
        }
    }

    fn float(&self, name: &str) -> Result<f64> {
        match self.need(name)? {
            Value::Float(v) => Ok(*v),
            Value::Int(i) => Ok(*i as f64),
            _ => unreachable!("checked kind"),
        }
    }

    fn pattern(&self, name: &str) -> Result<&[(i64, u64)]> {
        match self.need(name)? {
            Value::Pattern(p) => Ok(p),
            _ => unreachable!("checked kind"),
        }
    }

    fn ints(&self, name: &str) -> Result<&[i64]> {
        match self.need(name)? {
            Value::Ints(v) => Ok(v),
            _ => unreachable!("checked kind"),
        }
    }

    fn tiles(&self, name: &str) -> Result<&[Tile]> {
        match self.need(name)? {
            Value::Tiles(v) => Ok(v),
            _ => unreachable!("checked kind"),
        }
    }

    fn opt_pair(&self, name: &str) -> Option<(usize, usize)> {
        match self.slot(name).1 {
            Some(Value::Pair(a, b)) => Some((*a, *b)),
            _ => None,
        }
    }

    fn queue(&self, name: &str) -> Result<Option<u8>> {
        match self.slot(name) {
            (_, None) => Ok(None),
            (arg, Some(Value::Int(q))) => u8::try_from(*q)
                .map(Some)
                .map_err(|_| Error::value(arg, format!("DMA queue {q} is not in 0..16"))),
            _ => unreachable!("checked kind"),
        }
    }
}

/// Checks that value `v` fits argument `a`'s kind.
fn check_kind(a: &Arg, v: &Value) -> Result<()> {
    let ok = match a.kind {
        K::Tile => matches!(v, Value::Tile(_)),
        K::Scalar => matches!(v, Value::Tile(_) | Value::Float(_) | Value::Int(_)),
        K::Float => matches!(v, Value::Float(_) | Value::Int(_)),
        K::Int | K::Queue => matches!(v, Value::Int(_)),
        K::Bool => matches!(v, Value::Bool(_)),
        K::Pattern => matches!(v, Value::Pattern(_)),
        K::Pair => matches!(v, Value::Pair(..)),
        K::Ints => matches!(v, Value::Ints(_)),
        K::Tiles => matches!(v, Value::Tiles(_)),
        K::Alu | K::Act | K::Engine | K::ReduceCmd | K::PerfMode => matches!(v, Value::Name(_)),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::value(a.name, format!("expected {}, got {}", kind_expected(a.kind), v.what())))
    }
}

/// What a kind's values look like, for errors (the binding's conversion errors use it too).
pub fn kind_expected(k: Kind) -> &'static str {
    match k {
        K::Tile => "a tile",
        K::Scalar => "a number or a [P, 1] tile",
        K::Float => "a number",
        K::Int => "an integer",
        K::Queue => "a DMA queue number 0..16",
        K::Bool => "True or False",
        K::Pattern => "a list of [step, num] pairs",
        K::Pair => "a pair of sizes",
        K::Ints => "a list of integers",
        K::Tiles => "a list of tiles",
        K::Alu => "an ALU operator's name",
        K::Act => "an activation function's name",
        K::Engine => "an engine's name",
        K::ReduceCmd => "a reduce_cmd name",
        K::PerfMode => "a perf_mode name",
    }
}

impl Machine {
    /// Whether [`Machine::issue`] of `op` with `vals` neither settles the matmul queue nor
    /// gathers an operand (so a front end may run it without releasing the GIL or watching
    /// for Ctrl-C): an `nc_matmul` the queue reads straight from SBUF (no waiting
    /// tensor_tensor writing its operands), or a `tensor_tensor` that will wait in the queue.
    /// `false` when unsure, or when the arguments are wrong (the issue reports that).
    pub fn issues_without_settling(&self, op: Opcode, vals: &[Option<Value>]) -> bool {
        let queued = self.queued_matmuls() > 0;
        if !(op == Opcode::NcMatmul || (op == Opcode::TensorTensor && queued)) {
            return false;
        }
        let Ok(a) = Args::new(op, vals.to_vec()) else {
            return false;
        };
        let tiles = |names: [&str; 3]| -> Option<[Tile; 3]> {
            let [x, y, z] = names.map(|n| a.tile(n).ok());
            Some([x?, y?, z?])
        };
        if op == Opcode::NcMatmul {
            let Some([_, st, mv]) = tiles(["dst", "stationary", "moving"]) else {
                return false;
            };
            let plain = a.name_of("perf_mode").is_none_or(|(_, m)| m == "none");
            return plain && !a.flag("is_transpose") && self.matmul_reads_sbuf(&st, &mv);
        }
        let Some([dst, x, y]) = tiles(["dst", "data1", "data2"]) else {
            return false;
        };
        a.alu("op").is_ok_and(|alu| self.tensor_tensor_may_wait(&dst, &x, &y, alu))
    }

    /// Issues instruction `op` with its arguments `vals` (one slot per argument of its row, in
    /// order; `None` = not given): the arguments are checked against the table, the queued
    /// matmuls settled (all but `nc_matmul`, which queues), and the instruction executed and
    /// recorded.
    pub fn issue(&mut self, op: Opcode, vals: Vec<Option<Value>>) -> Result<()> {
        let a = Args::new(op, vals)?;
        if info(op).neuron_core_v4 {
            let name = op.name();
            return Err(super::rule(
                name,
                "neuron_core_v4",
                format!(
                    "{name} is available only on NeuronCore-v4 and newer (Trainium3; the NKI API \
                     docs); Trainium2's NeuronCore is v3"
                ),
            ));
        }
        if op == Opcode::NcMatmul {
            let opts = PeOptions {
                accumulate: a.opt_flag("accumulate"),
                perf_mode: {
                    let (arg, s) = a.name_of("perf_mode").expect("defaulted");
                    PerfMode::parse(arg, s)?
                },
                tile: PeTile::from_options(a.opt_pair("tile_position"), a.opt_pair("tile_size"))?,
                is_transpose: a.flag("is_transpose"),
            };
            let (d, s, m) = (a.tile("dst")?, a.tile("stationary")?, a.tile("moving")?);
            return self.nc_matmul_queued(&d, &s, &m, &opts);
        }
        if op == Opcode::TensorTensor && self.queued_matmuls() > 0 {
            // A float32 tensor_tensor into SBUF waits behind the queued matmuls.
            let (d, x, y) = (a.tile("dst")?, a.tile("data1")?, a.tile("data2")?);
            if self.tensor_tensor_deferred(a.engine()?, &d, &x, &y, a.alu("op")?)? {
                return Ok(());
            }
        }
        if self.has_queued_work() {
            // Settling runs parallel sections: on the fork-safe pool.
            crate::pool::install(|| self.settle())?;
        }
        // The rows without a dst.
        if op == Opcode::CoreBarrier {
            return self.core_barrier(a.engine()?, &a.tile("data")?);
        }
        if op == Opcode::SetRngSeed {
            return self.set_rng_seed(&a.tile("src_seeds")?);
        }
        if op == Opcode::RandSetState {
            return self.rand_set_state(a.engine()?, &a.tile("src_seeds")?);
        }
        let dst = a.tile("dst")?;
        match op {
            Opcode::NcMatmul => unreachable!("issued above"),
            Opcode::NcMatmulMx | Opcode::QuantizeMx | Opcode::Rand2 => {
                unreachable!("NeuronCore-v4 rows are refused above")
            }
            Opcode::NcTranspose => self.nc_transpose(a.engine()?, &dst, &a.tile("data")?),
            Opcode::TensorTensor => self.tensor_tensor(
                a.engine()?,
                &dst,
                &a.tile("data1")?,
                &a.tile("data2")?,
                a.alu("op")?,
            ),
            Opcode::TensorScalar => {
                let second = match a.opt_alu("op1")? {
                    None => None,
                    Some(op1) => {
                        let s1 = a
                            .opt_scalar("operand1")?
                            .ok_or_else(|| Error::value("operand1", "op1 needs operand1"))?;
                        Some((op1, s1, a.flag("reverse1")))
                    }
                };
                self.tensor_scalar(
                    a.engine()?,
                    &dst,
                    &a.tile("data")?,
                    a.alu("op0")?,
                    &a.scalar("operand0")?,
                    a.flag("reverse0"),
                    second.as_ref(),
                )
            }
            Opcode::ScalarTensorTensor => self.scalar_tensor_tensor(
                &dst,
                &a.tile("data")?,
                a.alu("op0")?,
                &a.scalar("operand0")?,
                a.flag("reverse0"),
                a.alu("op1")?,
                &a.tile("operand1")?,
                a.flag("reverse1"),
            ),
            Opcode::TensorReduce => {
                let axes = a.int("axes")?;
                let axes = usize::try_from(axes).map_err(|_| {
                    Error::value("axes", format!("{axes} axes; expected a count of 1 or more"))
                })?;
                self.tensor_reduce(&dst, a.alu("op")?, &a.tile("data")?, axes, a.flag("negate"))
            }
            Opcode::TensorCopy => self.tensor_copy(a.engine()?, &dst, &a.tile("src")?),
            Opcode::TensorTensorScan => self.tensor_tensor_scan(
                &dst,
                &a.tile("data0")?,
                &a.tile("data1")?,
                &a.scalar("initial")?,
                a.alu("op0")?,
                a.alu("op1")?,
                a.flag("reverse0"),
                a.flag("reverse1"),
            ),
            Opcode::TensorScalarReduce => self.tensor_scalar_reduce(
                &dst,
                &a.tile("data")?,
                a.alu("op0")?,
                &a.scalar("operand0")?,
                a.flag("reverse0"),
                a.alu("reduce_op")?,
                a.opt_tile("reduce_res")?.as_ref(),
                a.reduce_cmd("reduce_cmd")?,
                a.opt_scalar("reduce_init")?.as_ref(),
                a.flag("negate"),
            ),
            Opcode::Activation => {
                let args = ActivationArgs {
                    bias: a.opt_scalar("bias")?,
                    scale: a.opt_scalar("scale")?,
                    reduce_op: a.opt_alu("reduce_op")?,
                    reduce_res: a.opt_tile("reduce_res")?,
                    reduce_cmd: a.reduce_cmd("reduce_cmd")?,
                };
                self.activation(&dst, a.act("op")?, &a.tile("data")?, &args)
            }
            Opcode::ActivationReduce => self.activation_reduce(
                &dst,
                a.act("op")?,
                &a.tile("data")?,
                a.alu("reduce_op")?,
                &a.tile("reduce_res")?,
                a.opt_scalar("bias")?,
                a.opt_scalar("scale")?,
            ),
            Opcode::Reciprocal => self.reciprocal(&dst, &a.tile("data")?),
            Opcode::Memset => self.memset(a.engine()?, &dst, a.float("value")?),
            Opcode::Iota => self.iota(
                &dst,
                a.pattern("pattern")?,
                a.int("offset")?,
                a.int("channel_multiplier")?,
            ),
            Opcode::AffineSelect => self.affine_select(
                &dst,
                a.pattern("pattern")?,
                a.int("channel_multiplier")?,
                &a.tile("on_true_tile")?,
                a.float("on_false_value")?,
                a.alu("cmp_op")?,
                a.int("offset")?,
            ),
            Opcode::Select => self.select(
                &dst,
                &a.tile("predicate")?,
                &a.tile("on_true")?,
                &a.scalar("on_false")?,
            ),
            Opcode::BnStats => self.bn_stats(&dst, &a.tile("data")?),
            Opcode::BnAggr => self.bn_aggr(&dst, &a.tile("data")?),
            Opcode::DmaCopy => self.dma_copy(&dst, &a.tile("src")?, a.queue("queue")?),
            Opcode::Max8 => self.max8(&dst, &a.tile("src")?),
            Opcode::NcFindIndex8 => self.nc_find_index8(&dst, &a.tile("data")?, &a.tile("vals")?),
            Opcode::NcMatchReplace8 => self.nc_match_replace8(
                &dst,
                &a.tile("data")?,
                &a.tile("vals")?,
                a.float("imm")?,
                a.opt_tile("dst_idx")?.as_ref(),
            ),
            Opcode::NcStreamShuffle => {
                self.nc_stream_shuffle(&dst, &a.tile("src")?, a.ints("shuffle_mask")?)
            }
            Opcode::NcNGather => self.nc_n_gather(&dst, &a.tile("data")?, &a.tile("indices")?),
            Opcode::LocalGather => self.local_gather(
                &dst,
                &a.tile("src_buffer")?,
                &a.tile("index")?,
                a.int("num_elem_per_idx")?,
                a.int("num_valid_indices")?,
            ),
            Opcode::RangeSelect => self.range_select(
                &dst,
                &a.tile("on_true_tile")?,
                [a.alu("comp_op0")?, a.alu("comp_op1")?],
                [&a.scalar("bound0")?, &a.scalar("bound1")?],
                a.reduce_cmd("reduce_cmd")?,
                a.opt_tile("reduce_res")?.as_ref(),
                a.alu("reduce_op")?,
                a.int("range_start")?,
                match a.slot("on_false_value").1 {
                    Some(Value::Float(v)) => Some(*v),
                    Some(Value::Int(i)) => Some(*i as f64),
                    _ => None,
                },
            ),
            Opcode::TensorPartitionReduce => {
                self.tensor_partition_reduce(&dst, a.alu("op")?, &a.tile("data")?)
            }
            Opcode::SequenceBounds => self.sequence_bounds(&dst, &a.tile("segment_ids")?),
            Opcode::NonzeroWithCount => self.nonzero_with_count(
                &dst,
                &a.tile("src")?,
                a.int("index_offset")?,
                a.int("padding_val")?,
            ),
            Opcode::TensorScalarCumulative => self.tensor_scalar_cumulative(
                &dst,
                &a.tile("src")?,
                a.alu("op0")?,
                a.alu("op1")?,
                &a.scalar("imm0")?,
                a.opt_scalar("imm1")?.as_ref(),
                a.reduce_cmd("reduce_cmd")?,
            ),
            Opcode::Exponential => self.exponential(
                &dst,
                &a.tile("src")?,
                a.opt_scalar("max_value")?.as_ref(),
                a.opt_tile("reduce_res")?.as_ref(),
                a.reduce_cmd("reduce_cmd")?,
                a.opt_scalar("reduce_init")?.as_ref(),
            ),
            Opcode::Dropout => self.dropout(&dst, &a.tile("data")?, &a.scalar("prob")?),
            Opcode::Rng => self.rng(a.engine()?, &dst),
            Opcode::RandGetState => self.rand_get_state(a.engine()?, &dst),
            Opcode::Activate2 => {
                let stage = |k: &str| -> Result<(Option<AluOp>, Scalar, bool)> {
                    Ok((
                        a.opt_alu(&format!("op{k}"))?,
                        a.scalar(&format!("imm{k}"))?,
                        a.flag(&format!("reverse{k}")),
                    ))
                };
                let args = Activate2Args {
                    stages: [stage("0")?, stage("1")?],
                    relu_param: a.opt_scalar("relu_param")?,
                    reduce_op: a.opt_alu("reduce_op")?,
                    reduce_res: a.opt_tile("reduce_res")?,
                    reduce_cmd: a.reduce_cmd("reduce_cmd")?,
                };
                self.activate2(&dst, a.act("op")?, &a.tile("data")?, &args)
            }
            Opcode::SelectReduce => self.select_reduce(
                &dst,
                &a.tile("predicate")?,
                &a.tile("on_true")?,
                &a.scalar("on_false")?,
                a.opt_tile("reduce_res")?.as_ref(),
                a.reduce_cmd("reduce_cmd")?,
                a.alu("reduce_op")?,
                a.flag("reverse_pred"),
            ),
            Opcode::TensorCopyDynamicSrc | Opcode::TensorCopyDynamicDst => {
                let offset = DynamicOffset {
                    tile: a.tile("offset")?,
                    step: a.int("offset_step")?,
                    limit: a.int("offset_limit")?,
                };
                self.tensor_copy_dynamic(op, a.engine()?, &dst, &a.tile("src")?, &offset)
            }
            Opcode::DmaTranspose => {
                let axes = match a.slot("axes").1 {
                    Some(Value::Ints(v)) => Some(v.as_slice()),
                    _ => None,
                };
                let (src, hwdge) = (a.tile("src")?, a.flag("hwdge"));
                self.dma_transpose(&dst, &src, axes, hwdge, a.queue("queue")?)
            }
            Opcode::DmaCompute => self.dma_compute(&dst, a.tiles("srcs")?, a.queue("queue")?),
            Opcode::CoreBarrier | Opcode::SetRngSeed | Opcode::RandSetState => {
                unreachable!("issued above")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_the_opcodes() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(TABLE[i].op, *op, "row {i}");
            let d = TABLE[i].default_engine;
            assert_eq!(d.is_some(), !TABLE[i].engines.is_empty());
            assert!(
                TABLE[i].args.len() <= 13,
                "a row of at most 13 arguments (activate2 has 13; the binding's issue takes \
                 *args, any count)"
            );
            assert!(d.is_none_or(|e| TABLE[i].engines.contains(&e)));
            // dst first; the rows without one: core_barrier (engine first), set_rng_seed and
            // rand_set_state.
            let first = match (TABLE[i].args[0].kind, *op) {
                (K::Engine, _) => "engine",
                (_, Opcode::SetRngSeed | Opcode::RandSetState) => "src_seeds",
                _ => "dst",
            };
            assert_eq!(TABLE[i].args[0].name, first, "row {i}");
        }
    }

    #[test]
    fn arguments_are_checked_against_the_row() {
        let mut m = Machine::new(Default::default()).expect("machine");
        let e = m.issue(Opcode::Reciprocal, vec![]).expect_err("refused");
        assert_eq!(e.arg(), Some("dst"));
        let e = m.issue(Opcode::Memset, vec![None, Some(Value::Float(1.0))]).expect_err("refused");
        assert_eq!(e.arg(), Some("dst"));
        assert!(e.to_string().contains("expected a tile, got a float"), "{e}");
        let e = m.issue(Opcode::BnAggr, vec![None, None, None]).expect_err("refused");
        assert_eq!(e.arg(), Some("args"));
    }
}
