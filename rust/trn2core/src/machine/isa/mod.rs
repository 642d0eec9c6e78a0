//! The instructions' values (VALUES): one method of [`Machine`] per NKI ISA instruction.
//!
//! Every instruction is executed when it is issued: its operands are checked (the engine rules
//! below, bounds, never-written memory), its inputs are read and widened to float32, the result
//! is computed and rounded into the destination, and the instruction is appended to the recorded
//! program with the regions it read and wrote and the inputs of its cost formula. Inputs are
//! read in full before anything is written, so an instruction whose output overlaps an input
//! computes from the old values.
//!
//! Files: [`alu`] (the ALU operators), [`act`] (activation functions), [`elementwise`]
//! (tensor_tensor, tensor_scalar, scalar_tensor_tensor, tensor_copy, memset, reciprocal, select),
//! [`reduce`] (tensor_reduce, tensor_tensor_scan, tensor_scalar_reduce, bn_stats, bn_aggr),
//! [`scalar`] (activation, activation_reduce), [`gpsimd`] (iota, affine_select), [`pe`]
//! (nc_matmul, nc_transpose), [`dma`] (dma_copy).
//!
//! # Engine rules (errors naming the rule and the operand; sources: the NKI ISA and architecture guides, \[S2\]\[S9\])
//!
//! | rule | what | source |
//! |---|---|---|
//! | `engine_memory` | compute engines read and write SBUF or PSUM only | 4.3 \[S2\] |
//! | `partition_dim` | 1..=128 partitions | 4.3 \[S2\] |
//! | `start_partition` | more than 64 partitions start at 0; 33..=64 at 0 or 64; up to 32 at a multiple of 32 | 4.3 \[S2\] |
//! | `psum_bank` | a PSUM operand stays inside one 2 KiB bank per partition | 4.2 \[S2\]\[S9\] |
//! | `gpsimd_psum` | GpSimd cannot access PSUM | 4.2, 8 \[S9\] |
//! | `two_psum_inputs` | tensor_tensor (and scan, scalar_tensor_tensor) take at most one input from PSUM | 15 \[S9\] |
//! | `act_tensor_scalar_ops` | the Scalar engine's tensor_scalar takes only (multiply, add), (multiply), (add) | 7 \[S9\] |
//! | `fp32_operand` | tensor_scalar's operands, activation's scale are float32 | 15 \[S9\] |
//! | `bitvec_dtype` | bitvec operators need integer dtypes | 15 \[S11\] |
//! | `engine` | the instruction runs on the engines its documentation lists | \[S9\] |
//! | `matmul_memory`, `matmul_dst_fp32` | nc_matmul reads SBUF, writes fp32 PSUM | 5.1 \[S9\] |
//! | `accumulate` | accumulate=True needs a region written by a matmul | 5.1 \[S9\] |
//! | `transpose_size` | PE transpose up to 128 x 128, Vector up to 32 x 32 | 13 \[S9\] |
//! | `bn_stats_fmax` | bn_stats reads at most 512 elements per partition | 6 \[S9\] |
//! | `dma_memory` | DMA moves between HBM and SBUF only (not PSUM) | NKI 0.3 \[S9\] |
//! | `shape` | operands have the partitions and elements per partition the instruction needs | \[S9\] |

pub mod act;
pub mod alu;
pub mod dma;
pub mod elementwise;
pub mod gpsimd;
pub mod pe;
pub mod reduce;
mod rows;
pub mod scalar;
pub mod table;

use crate::memory::Space;
use crate::numerics::mix64;
use crate::spec::{PSUM_BANK_BYTES, SBUF_PARTITIONS, SBUF_QUADRANT_PARTITIONS};
use crate::{Error, Result};

use super::dtype::{self, Dtype, OutputRounding};
use super::memory::ByteMem;
use super::record::{
    flags, CostInput, Engine, Opcode, Queue, Region, MEM_HBM0, MEM_PSUM, MEM_SBUF,
};
use super::tile::Tile;
use super::Machine;
use alu::AluOp;

pub use pe::PeOptions;

/// A scalar operand: a compile-time constant, or a tile of one element per partition
/// (`[P, 1]`) broadcast along the free dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A constant (float32 for arithmetic operators, an integer for bitvec operators).
    Imm(f64),
    /// One value per partition.
    Tile(Tile),
}

named_enum! {
    /// The accumulator-register commands of `activation` and `tensor_scalar_reduce`
    /// (`nki.isa.reduce_cmd`).
    #[derive(Default)]
    pub enum ReduceCmd("reduce_cmd", value) {
        /// Registers untouched.
        #[default]
        Idle = "idle",
        /// Registers reset (to 0, or the reduce operator's identity).
        Reset = "reset",
        /// This instruction's results are accumulated onto the registers.
        Reduce = "reduce",
        /// Reset, then accumulate.
        ResetReduce = "reset_reduce",
        /// Load `reduce_init`, then accumulate.
        LoadReduce = "load_reduce",
    }
}

/// An engine-rule violation: names the operand, says what is wrong and which rule.
pub(crate) fn rule(arg: &str, rule: &'static str, message: impl std::fmt::Display) -> Error {
    Error::value(arg, format!("{message} [engine rule {rule}]")).with_rule(rule)
}

/// A shape-type engine-rule violation (`ShapeError`).
pub(crate) fn shape_rule(arg: &str, rule: &'static str, message: impl std::fmt::Display) -> Error {
    Error::shape(arg, format!("{message} [engine rule {rule}]")).with_rule(rule)
}

/// A dtype-type engine-rule violation (`FormatError`).
pub(crate) fn dtype_rule(arg: &str, rule: &'static str, message: impl std::fmt::Display) -> Error {
    Error::format(arg, format!("{message} [engine rule {rule}]")).with_rule(rule)
}

/// The dtype rule `rule` of an instruction whose `dst` keeps its source's dtype: `src` is the
/// source operand's argument name, `why` the message's tail.
pub(crate) fn keeps_dtype(
    rule: &'static str, dst: &Tile, src: (&str, &Tile), why: &str,
) -> Result<()> {
    if dst.dtype == src.1.dtype {
        return Ok(());
    }
    let message = format!("dst is {} and {} {}; {why}", dst.dtype, src.0, src.1.dtype);
    Err(dtype_rule("dst", rule, message))
}

/// Checks that `engine` is one the instruction runs on (its row of the instruction table).
pub(crate) fn check_engine(op: Opcode, engine: Engine) -> Result<()> {
    let allowed = table::info(op).engines;
    if allowed.contains(&engine) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(|e| e.name()).collect();
    Err(rule(
        "engine",
        "engine",
        format!(
            "{} does not run on the {} engine; it runs on {}",
            op.name(),
            engine.name(),
            names.join(" or ")
        ),
    ))
}

/// Whether `count` partitions may start at `start` (\[S2\]: more than 64 start at
/// 0, 33..=64 at 0 or 64, up to 32 at 0, 32, 64 or 96).
pub fn partition_start_ok(start: u32, count: u32) -> bool {
    let q = SBUF_QUADRANT_PARTITIONS as u32;
    if count > 2 * q {
        start == 0
    } else if count > q {
        start.is_multiple_of(2 * q)
    } else {
        start.is_multiple_of(q)
    }
}

/// The one run of an HBM tile whose "partitions" (its first axis) continue one another, as
/// `(byte offset, elements, element stride)`; `None` for other tiles. A 1-D tensor is
/// otherwise walked an element at a time (a copy of 1 Mi float32 elements took 36 ms against
/// 1.4 ms as [1, N]).
fn one_hbm_run(tile: &Tile) -> Option<(usize, usize, i64)> {
    let step = tile.partition_step;
    if tile.space != Space::Hbm || tile.partitions < 2 || step <= 0 {
        return None;
    }
    let c = tile.canonical();
    let len = c.run_len();
    if c.runs() != 1 {
        return None;
    }
    let parts = tile.partitions as usize;
    if len == 1 {
        Some((tile.offset as usize, parts, step))
    } else if c.run_stride() == 1 && step == len as i64 {
        Some((tile.offset as usize, parts * len, 1))
    } else {
        None
    }
}

/// Runs of `tile` a direct copy lists (see [`DIRECT_COPY_RUNS`]).
fn run_count(tile: &Tile) -> u128 {
    match one_hbm_run(tile) {
        Some(_) => 1,
        None => tile.elements_u128() / tile.canonical().run_len().max(1) as u128,
    }
}

/// Calls `f(host offset, run length, run stride in elements)` for every run of `tile` in
/// logical order; `stride` is the memory's bytes between partitions.
#[inline]
pub(crate) fn for_each_run(stride: usize, tile: &Tile, mut f: impl FnMut(usize, usize, i64)) {
    if let Some((off, len, step)) = one_hbm_run(tile) {
        f(off, len, step);
        return;
    }
    let esize = tile.dtype.size() as i64;
    let c = tile.canonical();
    let (len, rstride) = (c.run_len(), c.run_stride());
    for p in 0..tile.partitions as i64 {
        let base = match tile.space {
            Space::Hbm => tile.offset + p * tile.partition_step * esize,
            _ => (tile.start_partition as i64 + p) * stride as i64 + tile.offset,
        };
        c.for_each_run(|s| f((base + s * esize) as usize, len, rstride));
    }
}

/// Makes room in `out` for the elements of `tile` through the host check (a stride-0 view can
/// name far more elements than any memory holds: a `CapacityError`, never an abort).
fn gather_buffer<T>(out: &mut Vec<T>, tile: &Tile) -> Result<()> {
    let n = tile.elements_u128();
    let n = usize::try_from(n).map_err(|_| too_many(n))?;
    out.clear();
    if n > out.capacity() {
        crate::host::reserve(out, n, "tile", &format!("gathering {n} elements"))?;
    }
    Ok(())
}

/// Bytes of `tile`'s elements packed in its dtype, if the host's address space can hold them.
fn packed_len(tile: &Tile) -> Result<usize> {
    let n = tile.elements_u128();
    n.checked_mul(tile.dtype.size() as u128)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| too_many(n))
}

/// A zeroed staging buffer for `len` elements of `tile`'s dtype, through the host check.
fn staging(len: usize, tile: &Tile) -> Result<Vec<u8>> {
    let bytes = (len as u128)
        .checked_mul(tile.dtype.size() as u128)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| too_many(len as u128))?;
    crate::host::zeroed_vec("tile", "the staged elements", bytes)
}

/// Elements of the run [`Machine::scatter_fill`] copies into contiguous pieces (4 KiB of
/// float32).
const FILL_PATTERN_ELEMENTS: usize = 1024;

/// The most runs of a destination [`Machine::copy_direct`] lists (32 bytes each: at most 2 MiB;
/// a tile cut finer is staged instead).
const DIRECT_COPY_RUNS: usize = 1 << 16;

/// Elements [`Machine::copy_convert_direct`] converts at a time (on the stack: 4 KiB of
/// float32 and as many bytes of the result).
const CONVERT_CHUNK: usize = 1024;

/// Elements a long gather or scatter copies between checks of the cancellation token
/// (`crate::cancel`): 1 Mi elements, about a millisecond of copying, so that Ctrl-C during a
/// 1 GiB `dma_copy` acts within the binding's second (issue 28).
const CANCEL_CHUNK: usize = 1 << 20;

/// Calls `f(k, i, l)` for pieces `i .. i + l` of a run of `len` elements whose first element is
/// element `k` in logical order, checking `cancel` every [`CANCEL_CHUNK`] elements (counted in
/// `done` across runs); `false` once cancelled (nothing more is copied).
#[inline]
fn in_pieces(
    cancel: &crate::cancel::Cancel, done: &mut usize, k: usize, len: usize,
    mut f: impl FnMut(usize, usize, usize),
) -> bool {
    let mut i = 0;
    while i < len {
        let l = (len - i).min(CANCEL_CHUNK - *done);
        f(k + i, i, l);
        i += l;
        *done += l;
        if *done == CANCEL_CHUNK {
            *done = 0;
            if cancel.is_cancelled() {
                return false;
            }
        }
    }
    true
}

/// Walks `tile`'s elements in logical order in pieces, checking for cancellation as
/// [`in_pieces`] does: `f(k, off, l, stride)` gets `l` elements from element `k` in logical
/// order, the first at host byte offset `off` and the next ones `stride` elements apart (see
/// [`piece_at`]). `Interrupted` once cancelled.
fn for_each_piece(
    stride_p: usize, tile: &Tile, mut f: impl FnMut(usize, usize, usize, i64),
) -> Result<()> {
    let esize = tile.dtype.size();
    let (cancel, mut done, mut live) = (crate::cancel::current(), 0, true);
    let mut k = 0;
    for_each_run(stride_p, tile, |off, len, stride| {
        live = live
            && in_pieces(&cancel, &mut done, k, len, |k, i, l| {
                f(k, piece_at(off, i, stride, esize), l, stride)
            });
        k += len;
    });
    if live {
        Ok(())
    } else {
        Err(Error::Interrupted)
    }
}

/// Writes the packed elements `src` (`esize` bytes each) to `to` from byte `off` on, the
/// elements `stride` elements apart.
#[inline]
fn put_packed(to: &mut [u8], off: usize, stride: i64, esize: usize, src: &[u8]) {
    if stride == 1 {
        to[off..off + src.len()].copy_from_slice(src);
    } else {
        for (j, e) in src.chunks_exact(esize).enumerate() {
            let at = piece_at(off, j, stride, esize);
            to[at..at + esize].copy_from_slice(e);
        }
    }
}

/// Walks `s`'s elements in logical order against `places`, the destination's runs as
/// [`Machine::direct_places`] lists them: `f(source byte offset, source stride, destination
/// byte offset, destination stride, n)` for each stretch of at most `max` elements that lies in
/// one piece of `s` and one run of the destination (`dsize` bytes an element), in order.
/// Stops at `f`'s first error; interruptible as [`for_each_piece`] is.
fn for_each_stretch(
    stride_p: usize, s: &Tile, dsize: usize, places: &[(usize, usize, usize, i64)], max: usize,
    mut f: impl FnMut(usize, i64, usize, i64, usize) -> Result<()>,
) -> Result<()> {
    let ssize = s.dtype.size();
    let (mut at, mut failed) = (0, None);
    for_each_piece(stride_p, s, |k, off, l, stride| {
        let mut j = 0;
        while j < l && failed.is_none() {
            let (dk, doff, dl, dstride) = places[at];
            let into = k + j - dk;
            let n = (l - j).min(dl - into).min(max);
            let (so, dof) = (piece_at(off, j, stride, ssize), piece_at(doff, into, dstride, dsize));
            if let Err(e) = f(so, stride, dof, dstride, n) {
                failed = Some(e);
            }
            j += n;
            if into + n == dl {
                at += 1;
            }
        }
    })?;
    failed.map_or(Ok(()), Err)
}

/// Host byte offset of element `j` of a piece whose element 0 is at `off` ([`for_each_piece`]).
#[inline]
fn piece_at(off: usize, j: usize, stride: i64, esize: usize) -> usize {
    (off as i64 + j as i64 * stride * esize as i64) as usize
}

/// A `ShapeError` (rule `shape`) on `arg` unless operand `o` is `[p, n]`, its message
/// `message(o's logical shape)`.
pub(crate) fn check_p_n(
    arg: &str, o: &Opnd, p: u32, n: usize, message: impl FnOnce(&[usize]) -> String,
) -> Result<()> {
    if o.p() != p || o.n() != n {
        return Err(shape_rule(arg, "shape", message(&o.tile.logical_shape())));
    }
    Ok(())
}

fn too_many(n: u128) -> Error {
    Error::capacity("tile", format!("{n} elements are more than this host's address space"))
}

/// Raw bits of the element at host offset `o`.
#[inline(always)]
fn raw_at(bytes: &[u8], o: usize, size: usize) -> u32 {
    match size {
        1 => bytes[o] as u32,
        2 => u16::from_le_bytes([bytes[o], bytes[o + 1]]) as u32,
        _ => u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]),
    }
}

/// A checked operand: the tile and its per-partition byte range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opnd {
    pub tile: Tile,
    pub range: (u64, u64),
}

impl Opnd {
    /// The region this operand touches.
    pub fn region(&self) -> Region {
        let mem = match self.tile.space {
            Space::Sbuf => MEM_SBUF,
            Space::Psum => MEM_PSUM,
            Space::Hbm => MEM_HBM0 + self.tile.tensor.slot,
        };
        let (p0, pn) = match self.tile.space {
            Space::Hbm => (0, 1),
            _ => (self.tile.start_partition as u16, self.tile.partitions as u16),
        };
        Region { mem, p0, pn, lo: self.range.0, hi: self.range.1 }
    }

    /// Elements per partition.
    pub fn n(&self) -> usize {
        self.tile.free_size()
    }

    /// Partitions.
    pub fn p(&self) -> u32 {
        self.tile.partitions
    }
}

/// The fast-path row geometry of an on-chip operand: `(host offset of row 0, host bytes between
/// rows, kind)` when every partition is one contiguous run of fp32 or bf16 elements.
pub(crate) fn row_geometry(
    o: &Opnd, partition_stride: usize,
) -> Option<(usize, usize, rows::Kind)> {
    if o.tile.space == Space::Hbm {
        return None;
    }
    let kind = rows::Kind::of(o.tile.dtype)?;
    let c = o.tile.canonical();
    if !(c.n == 0 || c.n == 1 && c.dims[0].1 == 1) {
        return None;
    }
    let off = o.tile.start_partition as usize * partition_stride + o.tile.offset as usize;
    Some((off, partition_stride, kind))
}

/// An input of a fast path: `(in the destination's memory, host offset of row 0, host bytes
/// between rows, kind)`.
pub(crate) type RowGeometry = (bool, usize, usize, rows::Kind);

/// Whether input `x` can be read row by row while `d` is written: another memory, other
/// partitions, disjoint bytes, or exactly the same elements.
pub(crate) fn rows_compatible(x: &Opnd, d: &Opnd) -> bool {
    let (a, b) = (&x.tile, &d.tile);
    a.space != b.space
        || a.start_partition != b.start_partition
        || x.range.1 <= d.range.0
        || d.range.1 <= x.range.0
        || (a.offset == b.offset && a.dtype == b.dtype && x.range == d.range)
}

/// The cost flags describing a set of tensor operands (inputs first, output last).
pub(crate) fn operand_flags(inputs: &[&Opnd], output: Option<&Opnd>) -> u32 {
    let all = || inputs.iter().copied().chain(output);
    let mut f = 0;
    if inputs.iter().any(|o| o.tile.space == Space::Psum) {
        f |= flags::PSUM_INPUT;
    }
    if output.is_some_and(|o| o.tile.space == Space::Psum) {
        f |= flags::PSUM_OUTPUT;
    }
    if all().all(|o| o.tile.dtype.is_16bit_float()) {
        f |= flags::ALL_16BIT;
    }
    if all().all(|o| o.tile.dtype == Dtype::Bf16) {
        f |= flags::ALL_BF16;
    }
    if all().all(|o| o.tile.inner_contiguous()) {
        f |= flags::CONTIGUOUS;
    }
    f
}

impl Machine {
    /// Whether outputs are rounded to nearest even (the fast paths' condition).
    pub(crate) fn nearest_even(&self) -> bool {
        self.config.rounding == OutputRounding::NearestEven
    }

    /// The fast paths' view of inputs `xs` and output `d`, if they all qualify.
    fn fast_rows<const N: usize>(
        &self, xs: [&Opnd; N], d: &Opnd,
    ) -> Option<([RowGeometry; N], rows::RowOut)> {
        let stride_of = |s: Space| match s {
            Space::Psum => self.mem.psum.stride,
            _ => self.mem.sbuf().stride,
        };
        let (doff, dstride, dkind) = row_geometry(d, stride_of(d.tile.space))?;
        if !self.nearest_even() && dkind != rows::Kind::F32 {
            return None;
        }
        let mut ins = [(false, 0, 0, rows::Kind::F32); N];
        for (slot, x) in ins.iter_mut().zip(xs) {
            if !rows_compatible(x, d) {
                return None;
            }
            let (off, stride, kind) = row_geometry(x, stride_of(x.tile.space))?;
            *slot = (x.tile.space == d.tile.space, off, stride, kind);
        }
        Some((ins, rows::RowOut { off: doff, stride: dstride, kind: dkind }))
    }

    /// Runs `f` on the fast-path plan of inputs `xs` and output `d`; `false` (nothing done)
    /// if they do not qualify.
    fn with_plan<const N: usize>(
        &mut self, xs: [&Opnd; N], d: &Opnd, f: impl FnOnce(&mut rows::Plan),
    ) -> bool {
        let Some((ins, out)) = self.fast_rows(xs, d) else {
            return false;
        };
        let g = rows::Rows { rows: d.p() as usize, n: d.n() };
        let (mem, other) = self.mem.split_on_chip(&d.tile);
        let ins = ins.map(|(same, off, stride, kind)| rows::RowIn {
            mem: if same { None } else { Some(other) },
            off,
            stride,
            kind,
        });
        // SAFETY: `fast_rows` admitted each input only if `rows_compatible` holds: another
        // memory, other partitions, bytes disjoint from the destination's in every partition
        // (rows are partitions, shorter than the partition stride), or exactly its elements.
        let Some(mut plan) = (unsafe { rows::Plan::new(g, mem, &ins, out) }) else {
            return false;
        };
        f(&mut plan);
        self.after_write(d);
        true
    }

    /// `tensor_tensor`'s fast path; `false` if it does not apply.
    pub(crate) fn fast_binary(&mut self, op: AluOp, a: &Opnd, b: &Opnd, d: &Opnd) -> bool {
        self.with_plan([a, b], d, |plan| rows::binary(op, plan))
    }

    /// `tensor_scalar`'s fast path (arithmetic operators); `false` if it does not apply.
    pub(crate) fn fast_scalar(
        &mut self, op0: (AluOp, bool, &[f32]), op1: Option<(AluOp, bool, &[f32])>, a: &Opnd,
        d: &Opnd,
    ) -> bool {
        let op0 = (op0.0, op0.1 && !op0.0.is_unary(), op0.2);
        let op1 = op1.map(|(o, r, s)| (o, r && !o.is_unary(), s));
        self.with_plan([a], d, |plan| rows::scalar(plan, op0, op1))
    }

    /// `tensor_copy`'s fast path; `false` if it does not apply.
    pub(crate) fn fast_copy(&mut self, s: &Opnd, d: &Opnd) -> bool {
        self.with_plan([s], d, rows::copy)
    }

    /// Checks a tile that some engine reads (`write = false`) or writes: live, in bounds, and
    /// for compute engines the memory, partition and PSUM-bank rules.
    pub(crate) fn operand(
        &self, arg: &str, tile: &Tile, engine: Option<Engine>, write: bool,
    ) -> Result<Opnd> {
        if self.has_queued_work() && engine != Some(Engine::Tensor) {
            // Queued matmuls read SBUF and write PSUM when settled (`nc_matmul_queued`).
            return Err(Error::value(
                arg,
                "matmuls issued with nc_matmul_queued are waiting: call settle() before any \
                 other instruction or read touches the memories",
            ));
        }
        let range = self.mem.check_tile(arg, tile)?;
        // A view may repeat memory (stride 0) without holding it; reading or writing it stages
        // every element widened to 4 bytes, so the host must hold that first (named by the
        // argument, before any engine or gather allocates).
        let n = tile.elements_u128();
        let staged = n.saturating_mul(4);
        if staged >= crate::host::CHECK_FROM_BYTES as u128 {
            crate::host::check_alloc(
                arg,
                &format!(
                    "staging the {n} elements of {arg} ({:?} of {})",
                    tile.logical_shape_u64(),
                    self.mem.name(tile)
                ),
                staged,
            )?;
        }
        if let Some(engine) = engine {
            // The tensor's name only for an error message.
            let name = || self.mem.name(tile);
            if tile.space == Space::Hbm {
                return Err(rule(
                    arg,
                    "engine_memory",
                    format!(
                        "tile of {} is in HBM; the {} engine reads and writes SBUF or PSUM \
                         only (move it with dma_copy)",
                        name(),
                        engine.name()
                    ),
                ));
            }
            if engine == Engine::Gpsimd && tile.space == Space::Psum {
                return Err(rule(
                    arg,
                    "gpsimd_psum",
                    format!("tile of {} is in PSUM, which the GpSimd engine cannot access", name()),
                ));
            }
            let (p0, pn) = (tile.start_partition, tile.partitions);
            if pn as usize > SBUF_PARTITIONS {
                return Err(shape_rule(
                    arg,
                    "partition_dim",
                    format!(
                        "{pn} partitions; an engine instruction spans at most {SBUF_PARTITIONS}"
                    ),
                ));
            }
            if !partition_start_ok(p0, pn) {
                return Err(shape_rule(
                    arg,
                    "start_partition",
                    format!(
                        "{pn} partitions starting at partition {p0} of {}; more than 64 \
                         partitions must start at 0, 33 to 64 at 0 or 64, up to 32 at a \
                         multiple of 32",
                        name()
                    ),
                ));
            }
            if tile.space == Space::Psum {
                let (lo, hi) = range;
                if lo / PSUM_BANK_BYTES != (hi - 1) / PSUM_BANK_BYTES {
                    return Err(shape_rule(
                        arg,
                        "psum_bank",
                        format!(
                            "the PSUM tile of {} spans bytes {lo}..{hi} of each partition, \
                             across a {PSUM_BANK_BYTES}-byte bank boundary; an instruction's \
                             PSUM operand stays inside one bank",
                            name()
                        ),
                    ));
                }
            }
        }
        if !write {
            self.mem.check_written(arg, tile, range)?;
        }
        Ok(Opnd { tile: *tile, range })
    }

    /// Checks that operands have the same partitions and elements per partition.
    pub(crate) fn same_shape(
        &self, op: Opcode, ref_arg: &str, r: &Opnd, others: &[(&str, &Opnd)],
    ) -> Result<()> {
        for (arg, o) in others {
            if o.p() != r.p() || o.n() != r.n() {
                return Err(shape_rule(
                    arg,
                    "shape",
                    format!(
                        "{} needs the same partitions and elements per partition as {ref_arg}: \
                         {arg} is {:?} ({} x {}), {ref_arg} is {:?} ({} x {})",
                        op.name(),
                        o.tile.logical_shape(),
                        o.p(),
                        o.n(),
                        r.tile.logical_shape(),
                        r.p(),
                        r.n()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A tile's elements, widened to float32, in logical order.
    pub(crate) fn gather_f32(&self, tile: &Tile) -> Result<Vec<f32>> {
        self.gather(
            tile,
            |run, o| dtype::widen(tile.dtype, run, o),
            |bits| dtype::widen_one(tile.dtype, bits),
        )
    }

    /// A tile's raw element bits (zero-extended) in logical order.
    pub(crate) fn gather_bits(&self, tile: &Tile) -> Result<Vec<u32>> {
        self.gather(tile, |run, o| dtype::raw_bits(tile.dtype, run, o), |b| b)
    }

    /// A tile's elements in logical order: `run` converts the packed bytes of consecutive
    /// elements, `one` the raw bits of one element.
    fn gather<T: Copy + Default>(
        &self, tile: &Tile, mut run: impl FnMut(&[u8], &mut [T]), one: impl Fn(u32) -> T,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        gather_buffer(&mut out, tile)?;
        let mem = self.mem.mem(tile);
        let bytes = mem.bytes();
        let esize = tile.dtype.size();
        // Grown piece by piece (the pieces come in logical order), each piece's slots set just
        // before they are filled, while in cache: not the whole buffer zeroed first (a
        // settled matmul chain that accumulates gathers its PSUM destination this way each
        // time). The walk checks the cancel token between pieces.
        for_each_piece(mem.stride, tile, |k, off, l, stride| {
            if out.len() < k + l {
                out.resize(k + l, T::default());
            }
            if stride == 1 {
                run(&bytes[off..off + l * esize], &mut out[k..k + l]);
            } else {
                for (j, o) in out[k..k + l].iter_mut().enumerate() {
                    *o = one(raw_at(bytes, piece_at(off, j, stride, esize), esize));
                }
            }
        })?;
        out.resize(tile.elements(), T::default());
        Ok(out)
    }

    /// A tile's elements as packed little-endian bytes of its dtype, in logical order (runs of
    /// consecutive elements copied whole).
    pub(crate) fn gather_packed(&self, tile: &Tile) -> Result<Vec<u8>> {
        let mem = self.mem.mem(tile);
        let bytes = mem.bytes();
        let esize = tile.dtype.size();
        let n = packed_len(tile)?;
        let mut out = crate::host::zeroed_vec("tile", "the gathered elements", n)?;
        for_each_piece(mem.stride, tile, |k, off, l, stride| {
            let dst = &mut out[k * esize..(k + l) * esize];
            if stride == 1 {
                dst.copy_from_slice(&bytes[off..off + l * esize]);
            } else {
                for (j, e) in dst.chunks_exact_mut(esize).enumerate() {
                    let at = piece_at(off, j, stride, esize);
                    e.copy_from_slice(&bytes[at..at + esize]);
                }
            }
        })?;
        Ok(out)
    }

    /// The memories of a direct copy from `s` to `d` and `d`'s runs in logical order (first
    /// element, host offset, length, element stride); `None` unless both hold the same
    /// nonzero count of elements in two memories and `d` is at most [`DIRECT_COPY_RUNS`] runs.
    #[allow(clippy::type_complexity)]
    fn direct_places(
        &mut self, s: &Opnd, d: &Opnd,
    ) -> Option<(&mut ByteMem, &mut ByteMem, Vec<(usize, usize, usize, i64)>)> {
        let runs = run_count(&d.tile);
        let n = d.tile.elements_u128();
        if n == 0 || s.tile.elements_u128() != n || runs > DIRECT_COPY_RUNS as u128 {
            return None;
        }
        let (src, dst) = self.mem.src_dst(&s.tile, &d.tile)?;
        let mut places = Vec::with_capacity(runs as usize);
        let mut k = 0;
        for_each_run(dst.stride, &d.tile, |off, len, stride| {
            places.push((k, off, len, stride));
            k += len;
        });
        Some((src, dst, places))
    }

    /// Copies the elements of `s` into `d` (one dtype, the same element count, two different
    /// memories) run by run, with no staged copy of the tile: each piece of `s` in logical order
    /// goes straight to its places in `d`; marks `d` written. `false` (nothing done) when both
    /// lie in one memory or `d` has more than [`DIRECT_COPY_RUNS`] runs. Interruptible as
    /// [`Machine::scatter_raw`] is (a cancelled copy leaves `d` partly written, not marked).
    pub(crate) fn copy_direct(&mut self, s: &Opnd, d: &Opnd) -> Result<bool> {
        /// Moves up to which a copy's contiguous stretches are listed for `copy_rows`.
        const SHARED_COPY_MOVES: usize = 4096;
        let esize = d.tile.dtype.size();
        if s.tile.dtype != d.tile.dtype {
            return Ok(false);
        }
        let Some((src, dst, places)) = self.direct_places(s, d) else {
            return Ok(false);
        };
        // Contiguous stretches in increasing order, at most SHARED_COPY_MAX bytes in all (a
        // DMA of a tile's rows): copied as a list of moves by the duo helper, while the
        // caller goes on (the two memories wait for it before any other use of their bytes).
        let bytes =
            usize::try_from(d.tile.elements_u128()).unwrap_or(usize::MAX).saturating_mul(esize);
        if bytes <= super::memory::SHARED_COPY_MAX {
            let mut moves: Vec<(usize, usize, usize)> = Vec::with_capacity(places.len());
            let mut ok = true;
            for_each_stretch(
                src.stride,
                &s.tile,
                esize,
                &places,
                usize::MAX,
                |so, ss, dof, ds, n| {
                    let end = moves.last().map_or(0, |m| m.0 + m.2);
                    ok = ok
                        && (ss == 1 || n == 1)
                        && (ds == 1 || n == 1)
                        && dof >= end
                        && moves.len() < SHARED_COPY_MOVES;
                    if ok {
                        moves.push((dof, so, n * esize));
                    }
                    Ok(())
                },
            )?;
            if ok {
                super::memory::copy_rows_detached(dst, src, moves);
                self.after_write(d);
                return Ok(true);
            }
        }
        let (from, to) = (src.bytes(), dst.bytes_mut());
        for_each_stretch(src.stride, &s.tile, esize, &places, usize::MAX, |so, ss, dof, ds, n| {
            if ss == 1 {
                put_packed(to, dof, ds, esize, &from[so..so + n * esize]);
            } else {
                for e in 0..n {
                    let (a, b) = (piece_at(so, e, ss, esize), piece_at(dof, e, ds, esize));
                    to[b..b + esize].copy_from_slice(&from[a..a + esize]);
                }
            }
            Ok(())
        })?;
        self.after_write(d);
        Ok(true)
    }

    /// [`Machine::copy_values`] of a converting copy between two memories (or two HBM
    /// tensors), run by run without staging the whole tile: each run's elements widened to
    /// float32, NaN made canonical, rounded to the destination's dtype, as the staged path
    /// does (`gather_f32`, `alu::canon`, `scatter_f32`), a chunk at a time. `Ok(false)`
    /// (nothing done) unless `s` and `d` hold the same count of elements of different dtypes,
    /// `d`'s is a float format, the rounding is nearest-even (a stochastic stream is drawn over
    /// the whole tile at once), and `d` is at most [`DIRECT_COPY_RUNS`] runs.
    pub(crate) fn copy_convert_direct(&mut self, s: &Opnd, d: &Opnd) -> Result<bool> {
        let (sd, dd) = (s.tile.dtype, d.tile.dtype);
        if sd == dd
            || dd.format().is_none()
            || !matches!(self.rounding(), OutputRounding::NearestEven)
        {
            return Ok(false);
        }
        let Some((src, dst, places)) = self.direct_places(s, d) else {
            return Ok(false);
        };
        let (ssize, dsize) = (sd.size(), dd.size());
        let (from, to) = (src.bytes(), dst.bytes_mut());
        let mut vals = [0f32; CONVERT_CHUNK];
        let mut packed = [0u8; CONVERT_CHUNK * 4];
        let mut gathered = [0u8; CONVERT_CHUNK * 4];
        let mut words = Vec::new();
        for_each_stretch(
            src.stride,
            &s.tile,
            dsize,
            &places,
            CONVERT_CHUNK,
            |so, ss, dof, ds, m| {
                let v = &mut vals[..m];
                // A strided source piece is packed first, so `widen` decodes every element.
                let src = if ss == 1 {
                    &from[so..so + m * ssize]
                } else {
                    for (e, b) in gathered[..m * ssize].chunks_exact_mut(ssize).enumerate() {
                        let a = piece_at(so, e, ss, ssize);
                        b.copy_from_slice(&from[a..a + ssize]);
                    }
                    &gathered[..m * ssize]
                };
                dtype::widen(sd, src, v);
                v.iter_mut().for_each(|x| *x = alu::canon(*x));
                let bytes = &mut packed[..m * dsize];
                dtype::narrow(dd, v, OutputRounding::NearestEven, bytes, &mut words)?;
                put_packed(to, dof, ds, dsize, bytes);
                Ok(())
            },
        )?;
        self.after_write(d);
        Ok(true)
    }

    /// Writes packed little-endian elements of the tile's dtype (logical order) as they stand;
    /// marks them written.
    pub(crate) fn scatter_raw(&mut self, o: &Opnd, packed: &[u8]) -> Result<()> {
        self.scatter_packed(&o.tile, packed)?;
        self.after_write(o);
        Ok(())
    }

    /// The rounding of the instruction about to be recorded.
    fn rounding(&self) -> OutputRounding {
        match self.config.rounding {
            OutputRounding::NearestEven => OutputRounding::NearestEven,
            OutputRounding::Stochastic(seed) => OutputRounding::Stochastic(mix64(
                seed.wrapping_add(self.program.instrs.len() as u64),
            )),
        }
    }

    /// Writes float32 results, rounded to the tile's dtype, in logical order; marks them
    /// written.
    pub(crate) fn scatter_f32(&mut self, o: &Opnd, vals: &[f32]) -> Result<()> {
        let mut staged = staging(vals.len(), &o.tile)?;
        dtype::narrow(o.tile.dtype, vals, self.rounding(), &mut staged, &mut Vec::new())?;
        self.scatter_packed(&o.tile, &staged)?;
        self.after_write(o);
        Ok(())
    }

    /// Writes raw element bits (low bits of each word) in logical order; marks them written.
    pub(crate) fn scatter_bits(&mut self, o: &Opnd, bits: &[u32]) -> Result<()> {
        let mut staged = staging(bits.len(), &o.tile)?;
        dtype::pack_bits(o.tile.dtype, bits, &mut staged);
        self.scatter_packed(&o.tile, &staged)?;
        self.after_write(o);
        Ok(())
    }

    /// Writes one element's raw bits (low bits of `bits`) to every element of the tile, as
    /// [`Machine::scatter_bits`] with that value repeated, in one pass over the tile's places
    /// (a memset: no staged copy of the whole tile); marks them written.
    pub(crate) fn scatter_fill(&mut self, o: &Opnd, bits: u32) -> Result<()> {
        let esize = o.tile.dtype.size();
        let mut one = [0u8; 4];
        dtype::pack_bits(o.tile.dtype, &[bits], &mut one[..esize]);
        // A run of the element, copied whole into each contiguous piece (memcpy's speed).
        let pattern = one[..esize].repeat(FILL_PATTERN_ELEMENTS);
        let mem: &mut ByteMem = self.mem.mem_mut(&o.tile);
        let stride_p = mem.stride;
        let bytes = mem.bytes_mut();
        for_each_piece(stride_p, &o.tile, |_, off, l, stride| {
            if stride == 1 {
                for run in bytes[off..off + l * esize].chunks_mut(pattern.len()) {
                    run.copy_from_slice(&pattern[..run.len()]);
                }
            } else {
                for j in 0..l {
                    let at = piece_at(off, j, stride, esize);
                    bytes[at..at + esize].copy_from_slice(&pattern[..esize]);
                }
            }
        })?;
        self.after_write(o);
        Ok(())
    }

    /// Copies packed elements (logical order) into the tile's places. Interruptible
    /// ([`CANCEL_CHUNK`]): a cancelled scatter leaves the tile partly written, not marked
    /// written, and the instruction unrecorded.
    fn scatter_packed(&mut self, tile: &Tile, staged: &[u8]) -> Result<()> {
        let esize = tile.dtype.size();
        let mem: &mut ByteMem = self.mem.mem_mut(tile);
        let stride_p = mem.stride;
        let bytes = mem.bytes_mut();
        for_each_piece(stride_p, tile, |k, off, l, stride| {
            put_packed(bytes, off, stride, esize, &staged[k * esize..(k + l) * esize]);
        })
    }

    /// Bookkeeping after a non-matmul write: initialisation, and PSUM's matmul bits.
    pub(crate) fn after_write(&mut self, o: &Opnd) {
        self.mem.mark_written(&o.tile, o.range);
        self.mem.mark_writer(&o.tile, o.range, self.program.instrs.len() as u32);
        if o.tile.space == Space::Psum {
            self.clear_psum_mm(o.tile.start_partition, o.tile.partitions, o.range.0, o.range.1);
        }
    }

    /// Per-partition float32 values of a scalar operand (`partitions` of them); a tile
    /// operand must be fp32 (rule `fp32_operand`).
    pub(crate) fn scalar_f32(
        &self, arg: &str, s: &Scalar, partitions: u32, engine: Engine, reads: &mut Vec<Region>,
    ) -> Result<Vec<f32>> {
        self.scalar_values(arg, s, partitions, engine, reads, true)
    }

    /// [`Machine::scalar_f32`] for an instruction that widens a tile operand of any dtype to
    /// float32 (`scalar_tensor_tensor`'s `operand0`: the ISA casts its inputs to float32 and
    /// asks no dtype of it).
    pub(crate) fn scalar_widened(
        &self, arg: &str, s: &Scalar, partitions: u32, engine: Engine, reads: &mut Vec<Region>,
    ) -> Result<Vec<f32>> {
        self.scalar_values(arg, s, partitions, engine, reads, false)
    }

    fn scalar_values(
        &self, arg: &str, s: &Scalar, partitions: u32, engine: Engine, reads: &mut Vec<Region>,
        fp32_only: bool,
    ) -> Result<Vec<f32>> {
        match s {
            Scalar::Imm(v) => Ok(vec![*v as f32; partitions as usize]),
            Scalar::Tile(t) => {
                if fp32_only && t.dtype != Dtype::Fp32 {
                    return Err(dtype_rule(
                        arg,
                        "fp32_operand",
                        format!("the [P, 1] operand is {}; it must be fp32", t.dtype),
                    ));
                }
                let o = self.operand(arg, t, Some(engine), false)?;
                self.check_vector_operand(arg, &o, partitions)?;
                reads.push(o.region());
                self.gather_f32(t)
            }
        }
    }

    /// Per-partition raw bits of a scalar operand of a bitvec operator.
    pub(crate) fn scalar_bits(
        &self, arg: &str, s: &Scalar, partitions: u32, engine: Engine, reads: &mut Vec<Region>,
    ) -> Result<Vec<u32>> {
        match s {
            Scalar::Imm(v) => {
                if v.fract() != 0.0 || *v < -(2f64.powi(31)) || *v >= 2f64.powi(32) {
                    return Err(Error::value(
                        arg,
                        format!(
                            "{v} is not an integer in [-2**31, 2**32); a bitvec operator's \
                             constant is a 32-bit pattern"
                        ),
                    ));
                }
                Ok(vec![(*v as i64) as u32; partitions as usize])
            }
            Scalar::Tile(t) => {
                let o = self.operand(arg, t, Some(engine), false)?;
                self.check_vector_operand(arg, &o, partitions)?;
                if !t.dtype.is_int() {
                    return Err(dtype_rule(
                        arg,
                        "bitvec_dtype",
                        format!("bitvec operators take integer dtypes; the operand is {}", t.dtype),
                    ));
                }
                reads.push(o.region());
                self.gather_bits(t)
            }
        }
    }

    /// A `[P, 1]` operand: `partitions` partitions, one element each.
    fn check_vector_operand(&self, arg: &str, o: &Opnd, partitions: u32) -> Result<()> {
        check_p_n(arg, o, partitions, 1, |shape| {
            format!("expected a [{partitions}, 1] tile (one value per partition), got {shape:?}")
        })
    }

    /// Checks the operator's kind against the operands' dtypes.
    pub(crate) fn check_op_dtypes(
        &self, op: AluOp, arg: &str, tiles: &[(&str, &Tile)],
    ) -> Result<()> {
        if !op.is_elementwise() {
            return Err(Error::value(arg, alu::NOT_ELEMENTWISE));
        }
        if op.is_bitvec() {
            for (a, t) in tiles {
                if !t.dtype.is_int() {
                    return Err(dtype_rule(
                        a,
                        "bitvec_dtype",
                        format!(
                            "{} works on integer bit patterns; {a} is {} (operator {arg})",
                            op.name(),
                            t.dtype
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Records an engine instruction that reads `inputs` (and `extra` regions: scalar
    /// operands) and writes `d`; its cost input is the first input's elements per partition
    /// (the destination's without inputs) and the operands' flags plus `flags`.
    pub(crate) fn record_engine(
        &mut self, opc: Opcode, engine: Engine, inputs: &[&Opnd], extra: &[Region], d: &Opnd,
        flags: u32,
    ) {
        let main = inputs.first().copied().unwrap_or(d);
        let f = operand_flags(inputs, Some(d)) | flags;
        let cost = Self::cost_input(main.n(), main.p(), f);
        self.program.push_one_write(
            opc,
            Queue::Engine(engine),
            inputs.iter().map(|o| o.region()),
            extra,
            d.region(),
            cost,
        );
    }

    /// The usual cost input of an engine instruction on `n` elements per partition.
    pub(crate) fn cost_input(n: usize, partitions: u32, flags: u32) -> CostInput {
        CostInput {
            n: n.min(u32::MAX as usize) as u32,
            partitions: partitions as u16,
            flags,
            ..CostInput::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long gather or scatter stops at a cancelled token (Ctrl-C); a short one (below one
    /// check's worth of elements) finishes.
    #[test]
    fn long_copies_stop_at_a_cancelled_token() {
        use crate::machine::MachineConfig;
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let shape = [4usize, CANCEL_CHUNK / 2 + 3];
        let bytes = vec![0u8; shape[0] * shape[1] * 4];
        let a = m.hbm_tensor("a", &shape, Dtype::Fp32, Some(&bytes)).expect("a");
        let b = m.hbm_tensor("b", &shape, Dtype::Bf16, None).expect("b");
        let c = m.hbm_tensor("c", &shape, Dtype::Fp32, None).expect("c");
        let token = crate::cancel::Cancel::new();
        token.cancel();
        token.install(|| {
            for dst in [&b, &c] {
                let e = m.dma_copy(dst, &a, None).expect_err("interrupted");
                assert!(matches!(e, Error::Interrupted), "{e}");
            }
            let e = m.write_tile(&a, &bytes).expect_err("interrupted");
            assert!(matches!(e, Error::Interrupted), "{e}");
            let row =
                [crate::machine::tile::Index::Range { start: Some(0), stop: Some(1), step: 1 }];
            let (s, d) = (a.slice(&row).expect("row"), c.slice(&row).expect("row"));
            m.dma_copy(&d, &s, None).expect("below one check");
        });
        m.dma_copy(&c, &a, None).expect("no token");
    }

    /// `for_each_run` walks an HBM tile's elements at the byte offsets, in the order, that
    /// walking its first axis one position at a time gives (the reference below), whether or
    /// not it merges the positions into one run: 1-D tensors and strided 1-D views, contiguous
    /// 2-D and 3-D tensors, column slices, a middle-axis slice, a reversed and a repeated axis.
    #[test]
    fn hbm_runs_cover_the_same_elements_in_the_same_order() {
        use crate::machine::tile::Index;
        use crate::machine::MachineConfig;
        fn expand(tile: &Tile, walk: impl Fn(&mut dyn FnMut(usize, usize, i64))) -> Vec<usize> {
            let esize = tile.dtype.size() as i64;
            let mut out = Vec::new();
            walk(&mut |off, len, stride| {
                out.extend((0..len as i64).map(|j| (off as i64 + j * stride * esize) as usize))
            });
            out
        }
        let reference = |tile: &Tile| {
            expand(tile, |f| {
                let esize = tile.dtype.size() as i64;
                let c = tile.canonical();
                for p in 0..tile.partitions as i64 {
                    let base = tile.offset + p * tile.partition_step * esize;
                    c.for_each_run(|s| f((base + s * esize) as usize, c.run_len(), c.run_stride()));
                }
            })
        };
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let r =
            |a: Option<i64>, b: Option<i64>, step: i64| Index::Range { start: a, stop: b, step };
        let one = m.hbm_tensor("one", &[1000], Dtype::Bf16, None).expect("one");
        let two = m.hbm_tensor("two", &[24, 40], Dtype::Fp32, None).expect("two");
        let three = m.hbm_tensor("three", &[6, 5, 8], Dtype::Fp8E4m3, None).expect("three");
        let tiles = [
            one,
            one.slice(&[r(Some(3), Some(997), 3)]).expect("strided"),
            one.slice(&[r(Some(900), Some(100), -7)]).expect("reversed"),
            two,
            two.slice(&[r(Some(2), Some(20), 1), r(None, None, 1)]).expect("rows"),
            two.slice(&[r(None, None, 1), r(Some(2), Some(5), 1)]).expect("columns"),
            two.slice(&[r(None, None, 2), r(None, None, 1)]).expect("every other row"),
            three,
            three
                .slice(&[r(None, None, 1), r(Some(1), Some(4), 1), r(None, None, 1)])
                .expect("middle"),
            three.slice(&[Index::At(2), r(None, None, 1), r(None, None, 1)]).expect("at"),
            Tile {
                partition_step: 0,
                ..two.slice(&[r(None, None, 1), r(None, None, 1)]).expect("b")
            },
        ];
        for (i, t) in tiles.iter().enumerate() {
            let got = expand(t, |f| for_each_run(0, t, &mut *f));
            assert_eq!(got, reference(t), "tile {i}: {t:?}");
            assert_eq!(got.len(), t.elements(), "tile {i}");
        }
    }

    /// Converting copies between memories, computed run by run (`copy_convert_direct`), give
    /// each element the bits the staged path's steps give it one element at a time: widened to
    /// float32, NaN made canonical, rounded to nearest even into the destination's dtype. Over
    /// every pair of float dtypes, bit patterns with NaN payloads, infinities, signed zeros,
    /// subnormals and ties, and layouts whose runs meet at different places on the two sides
    /// (a strided destination or source, rows split at another column, a partition offset).
    #[test]
    fn converting_copies_give_each_element_its_rounded_bits() {
        use crate::machine::tile::Index;
        use crate::machine::MachineConfig;
        let floats =
            [Dtype::Fp32, Dtype::Bf16, Dtype::Fp16, Dtype::Fp8E4m3, Dtype::Fp8E5m2, Dtype::Fp8E3m4];
        let specials: [u32; 18] = [
            0x0000_0000,
            0x8000_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x7F80_0001,
            0xFFC0_1234,
            0x7FFF_FFFF,
            0x0000_0001,
            0x807F_FFFF,
            0x3F80_8000,
            0x3F81_8000,
            0x3F80_8001,
            0x477F_E000,
            0x477F_F000,
            0x43E0_0000,
            0x43E8_0000,
            0x4760_0000,
            0x3380_0000,
        ];
        let (p, f) = (96usize, 80usize);
        let range =
            |a: i64, b: i64, step: i64| Index::Range { start: Some(a), stop: Some(b), step };
        for (si, &sd) in floats.iter().enumerate() {
            for &dd in &floats {
                if sd == dd {
                    continue;
                }
                let mut m = Machine::new(MachineConfig::default()).expect("machine");
                // Raw source bits: the specials (as float32, or cut to the dtype's width), then
                // a mixed stream of every width's patterns.
                let bits: Vec<u32> = (0..p * f)
                    .map(|i| {
                        let w = match specials.get(i % 97) {
                            Some(&b) if sd == Dtype::Fp32 => b,
                            Some(&b) => b >> (32 - 8 * sd.size()),
                            None => mix64(((si * 1000 + i) as u64) ^ 0x5EED) as u32,
                        };
                        w & if sd.size() == 4 { u32::MAX } else { (1 << (8 * sd.size())) - 1 }
                    })
                    .collect();
                let bytes: Vec<u8> =
                    bits.iter().flat_map(|b| b.to_le_bytes()[..sd.size()].to_vec()).collect();
                let src = m.hbm_tensor("src", &[p, f], sd, Some(&bytes)).expect("src");
                // Element bits `b` of dtype `from` as the copy gives them in dtype `to`.
                let rounded = |from: Dtype, to: Dtype, b: u32| -> u32 {
                    let v = alu::canon(dtype::widen_one(from, b));
                    let mut out = [0u8; 4];
                    dtype::narrow(to, &[v], OutputRounding::NearestEven, &mut out, &mut Vec::new())
                        .expect("narrow");
                    u32::from_le_bytes(out)
                };
                let expect = |b: u32| rounded(sd, dd, b);
                // 1. HBM -> SBUF, whole.
                let t = m.alloc(Space::Sbuf, "t", &[p, f], dd).expect("t");
                m.dma_copy(&t, &src, None).expect("load");
                let got = m.gather_bits(&t).expect("read");
                for (i, (&g, &b)) in got.iter().zip(&bits).enumerate() {
                    assert_eq!(g, expect(b), "{sd:?} -> {dd:?} element {i} (source {b:#x})");
                }
                // 2. HBM columns 3..43 -> every other column of SBUF rows 32.., src rows 1..65.
                let u = m.alloc(Space::Sbuf, "u", &[128, 2 * f], dd).expect("u");
                let d = u.slice(&[range(32, 96, 1), range(1, 81, 2)]).expect("d");
                let s2 = src.slice(&[range(1, 65, 1), range(3, 43, 1)]).expect("s");
                m.dma_copy(&d, &s2, None).expect("strided load");
                let got = m.gather_bits(&d).expect("read");
                for (i, &g) in got.iter().enumerate() {
                    let b = bits[(1 + i / 40) * f + 3 + i % 40];
                    assert_eq!(g, expect(b), "{sd:?} -> {dd:?} strided element {i}");
                }
                // 3. SBUF -> HBM, the rows cut at another column: the tile [96, 80] into an HBM
                //    tensor [160, 48] (its runs 48 long against the tile's 80).
                let back = m.hbm_tensor("back", &[p * f / 48, 48], sd, None).expect("back");
                m.dma_copy(&back, &t, None).expect("store");
                let got = m.gather_bits(&back).expect("read");
                let mid = m.gather_bits(&t).expect("read");
                for (i, (&g, &b)) in got.iter().zip(&mid).enumerate() {
                    assert_eq!(g, rounded(dd, sd, b), "{dd:?} -> {sd:?} stored element {i}");
                }
                // 4. SBUF rows of 15 (odd) -> one HBM run: each row ends inside the run at an
                //    odd offset.
                let cols = t.slice(&[range(0, p as i64, 1), range(0, 15, 1)]).expect("cols");
                let flat = m.hbm_tensor("flat", &[p * 15], sd, None).expect("flat");
                m.dma_copy(&flat, &cols, None).expect("store rows");
                let got = m.gather_bits(&flat).expect("read");
                let mid = m.gather_bits(&cols).expect("read");
                for (i, (&g, &b)) in got.iter().zip(&mid).enumerate() {
                    assert_eq!(g, rounded(dd, sd, b), "{dd:?} -> {sd:?} row element {i}");
                }
                // 5. SBUF every other column (strided source pieces) -> HBM [96, 40].
                let odd = t.slice(&[range(0, p as i64, 1), range(1, f as i64, 2)]).expect("odd");
                let half = m.hbm_tensor("half", &[p, f / 2], sd, None).expect("half");
                m.dma_copy(&half, &odd, None).expect("strided store");
                let got = m.gather_bits(&half).expect("read");
                let mid = m.gather_bits(&odd).expect("read");
                for (i, (&g, &b)) in got.iter().zip(&mid).enumerate() {
                    assert_eq!(
                        g,
                        rounded(dd, sd, b),
                        "{dd:?} -> {sd:?} strided-source element {i}"
                    );
                }
                // 6. One HBM run of 7680 (a 1-D tensor) -> SBUF rows of 1920: more than one
                //    chunk a row.
                let one = m.hbm_tensor("one", &[p * f], sd, Some(&bytes)).expect("one");
                let w = m.alloc(Space::Sbuf, "w", &[4, p * f / 4], dd).expect("w");
                m.dma_copy(&w, &one, None).expect("long load");
                let got = m.gather_bits(&w).expect("read");
                for (i, (&g, &b)) in got.iter().zip(&bits).enumerate() {
                    assert_eq!(g, expect(b), "{sd:?} -> {dd:?} long-run element {i}");
                }
            }
        }
    }

    #[test]
    fn start_partition_rule() {
        assert!(partition_start_ok(0, 128));
        assert!(!partition_start_ok(32, 96));
        assert!(partition_start_ok(64, 64));
        assert!(!partition_start_ok(32, 64));
        assert!(partition_start_ok(96, 32));
        assert!(!partition_start_ok(5, 1));
        assert!(partition_start_ok(0, 1));
    }
}

/// Helpers the engines' unit tests share.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::machine::{Machine, Tile};

    /// Writes `words` into `t`, each cut to its low `esize` bytes (little-endian).
    pub(crate) fn put_words(m: &mut Machine, t: &Tile, words: &[u32], esize: usize) {
        let b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()[..esize].to_vec()).collect();
        m.write_tile(t, &b).expect("write");
    }

    /// `t`'s elements as words, each read from its `esize` little-endian bytes (the inverse
    /// of [`put_words`]).
    pub(crate) fn read_words(m: &Machine, t: &Tile, esize: usize) -> Vec<u32> {
        let b = m.read_tile(t).expect("read");
        b.chunks(esize).map(|c| c.iter().rev().fold(0u32, |a, &x| a << 8 | x as u32)).collect()
    }
}
