//! The tensor engine's instructions on the machine's memories: `nc_matmul` (reusing
//! [`crate::engine`]'s per-instruction numerics: an FMA per PE step, each tile's sum from +0 in
//! ascending k, fp32 PSUM accumulation, double_row, PE tiling) and `nc_transpose` (tensor
//! engine: bit-exact on NeuronCore-v3; Vector engine: up to 32 x 32).
//!
//! PSUM accumulation groups: one bit per PSUM fp32 slot says "written by a matmul since any
//! other write". `accumulate=True` needs every slot of `dst` set (accumulating onto memory a
//! non-matmul instruction wrote is undefined on v2/v3, \[S2\]\[S9\]); `accumulate=None`
//! accumulates exactly when they all are (the compiler's "first write overwrites").

use rayon::prelude::*;

use crate::engine::{self, KTile, MatmulShape, Matrix, PeTile, PerfMode, Reader, Strided, RUN};
use crate::memory::Space;
use crate::numerics::{Format, Rounding};
use crate::sparsity::Dtype as SDtype;
use crate::spec::{PE_TILE_QUARTER, VECTOR_TRANSPOSE_MAX};
use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::memory::{byte_span, ByteMem, SbufWrites};
use super::super::record::{flags, CostInput, Engine, Opcode, Queue};
use super::super::{psum_all_set, psum_put, Machine};
use super::{check_engine, dtype_rule, rule, shape_rule, Opnd};
use crate::machine::tile::Tile;

/// The options of `nc_matmul`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeOptions {
    /// `True` accumulates onto `dst`, `False` overwrites, `None` infers (see the module doc).
    pub accumulate: Option<bool>,
    /// `none` or `double_row`.
    pub perf_mode: PerfMode,
    /// The PE tile (`tile_position`, `tile_size`).
    pub tile: PeTile,
    /// Transpose mode: `dst = stationary.T`, bit for bit (`moving` must be the identity).
    pub is_transpose: bool,
}

fn format_of(arg: &str, t: &Tile) -> Result<Format> {
    t.dtype.format().ok_or_else(|| {
        dtype_rule(
            arg,
            "matmul_dtype",
            format!(
                "the tensor engine has no integer datapath; {arg} is {} (convert it to a float \
                 dtype first)",
                t.dtype
            ),
        )
    })
}

/// Where a queued matmul's operands (stationary, moving) are read from when the queue is
/// settled.
#[derive(Debug, Clone)]
enum Operands {
    /// Straight from SBUF: tiles with one run per partition in float dtypes the readers take
    /// as stored (nothing writes memory before the queue is settled: every other instruction,
    /// allocation and free settles it first).
    Sbuf(Tile, Tile),
    /// The operands' float32 values, gathered when the matmul was queued (other layouts,
    /// tf32, `double_row`'s `[128, 2, F]`).
    Values(Vec<f32>, Vec<f32>),
}

/// A checked `nc_matmul` whose arithmetic has not run yet: its destination, where its operands
/// are, its geometry, and whether it accumulates.
#[derive(Debug, Clone)]
pub(crate) struct QueuedMatmul {
    dst: Opnd,
    operands: Operands,
    shape: MatmulShape,
    accumulate: bool,
}

/// A `tensor_tensor` waiting in the matmul queue (`Machine::tensor_tensor_deferred`): checked
/// and recorded when issued, its values computed when the queue is settled, right after the
/// chains of the `after` matmuls issued before it are written to PSUM and before any issued
/// after it. It reads SBUF and PSUM and writes SBUF, float32 throughout (no rounding, so no
/// dependence on when it runs); a matmul that reads what it writes settles the queue first.
#[derive(Debug, Clone)]
pub(crate) struct Drain {
    /// Matmuls of the queue issued before it.
    pub(crate) after: usize,
    pub(crate) op: crate::machine::AluOp,
    pub(crate) a: Opnd,
    pub(crate) b: Opnd,
    pub(crate) d: Opnd,
}

/// At most this many `tensor_tensor`s wait in the queue (each matmul queued checks its operands
/// against every one of them).
pub(crate) const MAX_DRAINS: usize = 64;

/// At most this many chains are computed at once (their sums are held until written: a chain
/// writes at most one PSUM bank, 256 KiB).
const WAVE_CHAINS: usize = 64;

/// The GEMM reader of SBUF tile `t` of memory `mem` (see [`Machine::sbuf_reader`]).
fn reader_in<'a>(mem: &'a ByteMem, arg: &str, t: &Tile) -> Result<Reader<'a>> {
    let esize = t.dtype.size();
    let pstride = (mem.stride / esize) as isize;
    let c = t.canonical();
    let step = if c.n == 0 { 1 } else { c.dims[0].1 as isize };
    let (k, f) = (t.partitions as usize, t.free_size());
    let origin = (t.start_partition as usize * mem.stride + t.offset as usize) / esize;
    let (shape, strides) = ([k, f], [pstride, step]);
    let dtype = reader_dtype(t.dtype).unwrap_or(SDtype::F32);
    let swapped = cfg!(target_endian = "big");
    let matrix = Strided::new(arg, mem.buffer(esize), dtype, swapped, shape, origin, strides)?;
    Ok(Reader::new(arg, Matrix::Dense(matrix), None, Rounding::NearestEven, 0)?.0)
}

/// Whether a tile is float32 rows of contiguous elements (partitions by one run each): what a
/// chain's sums are written to as they stand.
fn dense_fp32_rows(t: &Tile) -> bool {
    let c = t.canonical();
    t.dtype == Dtype::Fp32 && (c.n == 0 || (c.n == 1 && c.dims[0].1 == 1))
}

/// Rows `words[at..at + n]` for each `(at, n)` of `places` (ascending), as disjoint mutable
/// slices in that order; `None` when two overlap or one runs past the end.
fn split_rows<'w>(words: &'w mut [f32], places: &[(usize, usize)]) -> Option<Vec<&'w mut [f32]>> {
    let (mut rest, mut pos) = (words, 0);
    let mut rows = Vec::with_capacity(places.len());
    for &(at, n) in places {
        let tail = std::mem::take(&mut rest).get_mut(at.checked_sub(pos)?..)?;
        let (row, after) = tail.split_at_mut_checked(n)?;
        rows.push(row);
        (rest, pos) = (after, at + n);
    }
    Some(rows)
}

/// What [`Machine::wave_sums`] computed.
enum WaveSums {
    /// Each chain's final values, to be written in issue order.
    Sums(Vec<Vec<f32>>),
    /// Every chain's final values already in its PSUM destination (see
    /// [`Machine::in_place_rows`]).
    InPlace,
}

/// The element type the GEMM readers use for a tile read as stored (`None`: gather instead).
fn reader_dtype(d: Dtype) -> Option<SDtype> {
    Some(match d {
        Dtype::Fp32 => SDtype::F32,
        Dtype::Bf16 => SDtype::Bf16,
        Dtype::Fp16 => SDtype::F16,
        Dtype::Fp8E4m3 => SDtype::Fp8E4m3,
        Dtype::Fp8E5m2 => SDtype::Fp8E5m2,
        Dtype::Fp8E3m4 => SDtype::Fp8E3m4,
        _ => return None,
    })
}

/// Whether the GEMM readers can take `t` straight from SBUF: one run per partition (any
/// element step), element-aligned partitions.
fn direct(t: &Tile, stride: usize) -> bool {
    let esize = t.dtype.size();
    t.space == Space::Sbuf
        && reader_dtype(t.dtype).is_some()
        && t.canonical().n <= 1
        && stride.is_multiple_of(esize)
        && t.offset >= 0
        && (t.offset as usize).is_multiple_of(esize)
}

/// The packed operands of the last wave of chains computed as a set, per side (stationary,
/// moving; [`engine::KeptPanels`]), with the tiles they were packed from and SBUF's write count
/// then ([`SbufWrites`]): a side whose operands are the same tiles in the next wave, none of
/// whose bytes has been written since, is not packed again (the moving tiles of a blocked
/// kernel serve the waves of all its row blocks). Packed panels are a function of the tiles'
/// bytes only ([`reader_in`] reads them as stored, no rounding). Only a cache: a cloned machine
/// starts without it.
#[derive(Default)]
pub(crate) struct PackCache {
    panels: [engine::KeptPanels; 2],
    /// Per side: the tiles, and the write count when they were packed; `None` when nothing is
    /// kept.
    seen: [Option<(Vec<Tile>, u64)>; 2],
    /// Sides packed so far (not kept from the wave before).
    packed: u64,
}

impl Clone for PackCache {
    fn clone(&self) -> Self {
        PackCache::default()
    }
}

impl std::fmt::Debug for PackCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackCache").finish_non_exhaustive()
    }
}

impl PackCache {
    /// Keeps each side's panels where its operands are the tiles they were packed from and
    /// none of their bytes has been written since; elsewhere invalidates them and records the
    /// tiles, to be packed now.
    fn check(&mut self, writes: &SbufWrites, sides: [&[Tile]; 2]) {
        for ((panels, seen), tiles) in self.panels.iter_mut().zip(&mut self.seen).zip(sides) {
            let same = seen.as_ref().is_some_and(|(kept, at)| {
                kept.as_slice() == tiles && !tiles.iter().any(|t| writes.since(byte_span(t), *at))
            });
            if !same {
                panels.invalidate();
                *seen = Some((tiles.to_vec(), writes.now()));
                self.packed += 1;
            }
        }
    }

    /// Forgets everything (a wave that failed may have packed a side only in part).
    fn clear(&mut self) {
        self.panels.iter_mut().for_each(engine::KeptPanels::invalidate);
        self.seen = [None, None];
    }
}

/// Whether two PSUM destinations share a byte.
fn overlaps(a: &Opnd, b: &Opnd) -> bool {
    let (ap, bp) = (a.tile.start_partition, b.tile.start_partition);
    ap < bp + b.tile.partitions
        && bp < ap + a.tile.partitions
        && a.range.0 < b.range.1
        && b.range.0 < a.range.1
}

/// The cost input of a tensor-engine instruction on PE tile `tile`.
fn pe_cost(partitions: usize, m: usize, k: usize, tile: PeTile, flags: u32) -> CostInput {
    let q = PE_TILE_QUARTER;
    CostInput {
        n: k as u32,
        partitions: partitions as u16,
        m: m as u16,
        k: k as u16,
        pe_tile: [
            (tile.position.0 / q) as u8,
            (tile.size.0 / q) as u8,
            (tile.position.1 / q) as u8,
            (tile.size.1 / q) as u8,
        ],
        flags,
        ..CostInput::default()
    }
}

impl Machine {
    fn pe_input(&self, arg: &str, t: &Tile) -> Result<Opnd> {
        let o = self.operand(arg, t, Some(Engine::Tensor), false)?;
        if t.space != Space::Sbuf {
            return Err(rule(
                arg,
                "matmul_memory",
                format!("{arg} is in {}; the tensor engine reads SBUF", t.space.name()),
            ));
        }
        Ok(o)
    }

    /// Whether every PSUM slot `dst` covers was last written by a matmul.
    fn psum_mm_state(&self, d: &Opnd) -> bool {
        let (p0, pn) = (d.tile.start_partition, d.tile.partitions);
        psum_all_set(&self.psum_mm, p0, pn, d.range.0, d.range.1)
    }

    fn set_psum_mm(&mut self, d: &Opnd) {
        let (p0, pn) = (d.tile.start_partition, d.tile.partitions);
        psum_put(&mut self.psum_mm, p0, pn, d.range.0, d.range.1, true);
    }

    /// The GEMM reader of a queued operand read straight from SBUF: `[K, F]`, partitions by
    /// free elements (the stationary one is the driver's transposed `a`).
    fn sbuf_reader<'a>(&'a self, arg: &str, t: &Tile) -> Result<Reader<'a>> {
        reader_in(self.mem.mem(t), arg, t)
    }

    /// The readers of a queued matmul's operands, both `[K, F]` (the stationary one the
    /// driver's transposed `a`).
    fn readers<'a>(&'a self, q: &'a QueuedMatmul) -> Result<(Reader<'a>, Reader<'a>)> {
        match &q.operands {
            Operands::Sbuf(s, m) => {
                Ok((self.sbuf_reader("stationary", s)?, self.sbuf_reader("moving", m)?))
            }
            Operands::Values(s, m) => engine::operand_readers_t(s, m, q.shape),
        }
    }

    /// The PSUM values a chain of queued matmuls into one destination leaves (its first
    /// overwrites or accumulates; the others accumulate): one GEMM whose K tiles are the
    /// instructions, each tile's sums from +0.0 in the PE's order, added with one fp32 rounding
    /// each, in issue order; NaN canonical.
    fn chain_sums(&self, chain: &[QueuedMatmul]) -> Result<Vec<f32>> {
        let head = &chain[0];
        let (m, n) = (head.shape.m, head.shape.n);
        let mut out =
            if head.accumulate { self.gather_f32(&head.dst.tile)? } else { vec![0f32; m * n] };
        let readers = chain.iter().map(|q| self.readers(q)).collect::<Result<Vec<_>>>()?;
        let order: Vec<usize> = (0..RUN).collect();
        let tiles: Vec<KTile> = readers
            .iter()
            .zip(chain)
            .map(|((a, b), q)| KTile { a, b, k0: 0, order: &order[..q.shape.k], a_t: true })
            .collect();
        engine::run_chain_tiles(&tiles, m, n, !head.accumulate, &mut out)?;
        Ok(out)
    }

    /// A chain of one matmul from SBUF into dense float32 rows of PSUM, computed in place
    /// ([`engine::add_tile_in_place`]: all or nothing, so one that accumulates is never left
    /// half added after Ctrl-C): no copy of the destination gathered and written back, which
    /// for a 128 x 128 x 512 product moves as many bytes as its operands. `Ok(false)`, with
    /// nothing done, for any other chain (then [`Machine::chain_sums`]). The caller marks the
    /// destination written ([`Machine::chain_written`]), as for a wave computed in place.
    fn chain_in_place(&mut self, chain: &[QueuedMatmul]) -> Result<bool> {
        let [q] = chain else { return Ok(false) };
        let Operands::Sbuf(st, mv) = &q.operands else { return Ok(false) };
        let (m, n) = (q.shape.m, q.shape.n);
        let Some(starts) = self.psum_row_words(&q.dst.tile, m) else { return Ok(false) };
        let places: Vec<(usize, usize)> = starts.map(|at| (at, n)).collect();
        let (sbuf, psum) = self.mem.sbuf_and_psum_mut();
        let (a, b) = (reader_in(sbuf, "stationary", st)?, reader_in(sbuf, "moving", mv)?);
        let order: Vec<usize> = (0..q.shape.k).collect();
        let tile = KTile { a: &a, b: &b, k0: 0, order: &order, a_t: true };
        let Some(rows) = split_rows(psum.f32_words_mut(), &places) else { return Ok(false) };
        engine::add_tile_in_place(&tile, m, n, !q.accumulate, rows)
    }

    /// Writes a settled chain's final values to its PSUM destination (dense float32 rows in
    /// place) and marks them written by a matmul.
    fn write_chain(&mut self, d: &Opnd, vals: &[f32]) -> Result<()> {
        if dense_fp32_rows(&d.tile) {
            let n = d.n();
            let mem = self.mem.mem_mut(&d.tile);
            let base = mem.at(d.tile.start_partition as usize, d.tile.offset as usize);
            let stride = mem.stride;
            let bytes = mem.bytes_mut();
            for (i, row) in vals.chunks_exact(n).enumerate() {
                let off = base + i * stride;
                for (b, &v) in bytes[off..off + 4 * n].chunks_exact_mut(4).zip(row) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            self.chain_written(d);
        } else {
            self.scatter_f32(d, vals)?;
            // The write above is the matmul's own: its slots stay "written by a matmul".
            self.set_psum_mm(d);
        }
        Ok(())
    }

    /// `nc_matmul`: `dst = stationary.T @ moving` into PSUM (or onto it, see
    /// [`PeOptions::accumulate`]); in transpose mode `dst = stationary.T` bit for bit.
    pub fn nc_matmul(
        &mut self, dst: &Tile, stationary: &Tile, moving: &Tile, opts: &PeOptions,
    ) -> Result<()> {
        self.nc_matmul_queued(dst, stationary, moving, opts)?;
        self.settle()
    }

    /// [`Machine::nc_matmul`] with its arithmetic left in the machine's matmul queue: checked,
    /// recorded and its operands read now, its result written to PSUM by the next
    /// [`Machine::settle`], which computes every queued matmul in parallel and writes them in
    /// issue order (the same bits as one at a time). A front end that issues many matmuls in a
    /// row (an NKI kernel) uses this and settles before anything else touches the memories.
    pub fn nc_matmul_queued(
        &mut self, dst: &Tile, stationary: &Tile, moving: &Tile, opts: &PeOptions,
    ) -> Result<()> {
        let opc = Opcode::NcMatmul;
        let st = self.pe_input("stationary", stationary)?;
        let mv = self.pe_input("moving", moving)?;
        let d = self.operand("dst", dst, Some(Engine::Tensor), true)?;
        if dst.space != Space::Psum {
            return Err(rule("dst", "matmul_memory", "nc_matmul writes PSUM; dst is not in PSUM"));
        }
        let sf = format_of("stationary", stationary)?;
        let mf = format_of("moving", moving)?;
        if opts.is_transpose {
            self.settle()?;
            return self.pe_transpose(opc, &d, &st, Some(&mv), opts.tile);
        }
        if dst.dtype != Dtype::Fp32 {
            return Err(dtype_rule(
                "dst",
                "matmul_dst_fp32",
                format!("nc_matmul writes fp32 PSUM on NeuronCore-v3; dst is {}", dst.dtype),
            ));
        }
        let shape_of = |t: &Tile| -> Vec<usize> {
            match opts.perf_mode {
                PerfMode::None => vec![t.partitions as usize, t.free_size()],
                PerfMode::DoubleRow => t.logical_shape(),
            }
        };
        let (ss, ms) = (shape_of(stationary), shape_of(moving));
        let shape = engine::validate_matmul(&ss, sf, &ms, mf, opts.perf_mode, opts.tile)?;
        if d.p() as usize != shape.m || d.n() != shape.n {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "stationary.T @ moving is [{}, {}]; dst is {:?}",
                    shape.m,
                    shape.n,
                    dst.logical_shape()
                ),
            ));
        }
        let all_mm = self.psum_mm_state(&d);
        let accumulate = match opts.accumulate {
            None => all_mm,
            Some(true) if !all_mm => {
                return Err(rule(
                    "accumulate",
                    "accumulate",
                    format!(
                        "accumulate=True onto PSUM of {} that no matmul wrote (or that another \
                         instruction overwrote); the first matmul of an accumulation group needs \
                         accumulate=False (undefined on the hardware)",
                        self.mem.name(dst)
                    ),
                ))
            }
            Some(a) => a,
        };
        // The arithmetic waits in the queue (see `QueuedMatmul`); PSUM is written when the
        // queue is settled, in issue order.
        // A waiting tensor_tensor that writes what this matmul reads runs first.
        if self.pe_drains.iter().any(|w| overlaps(&w.d, &st) || overlaps(&w.d, &mv)) {
            self.settle()?;
        }
        let stride = self.mem.mem(stationary).stride;
        let from_sbuf = opts.perf_mode == PerfMode::None
            && direct(stationary, stride)
            && direct(moving, stride);
        let operands = if from_sbuf {
            Operands::Sbuf(*stationary, *moving)
        } else {
            Operands::Values(self.gather_f32(stationary)?, self.gather_f32(moving)?)
        };
        self.pe_queue.push(QueuedMatmul { dst: d, operands, shape, accumulate });
        self.set_psum_mm(&d);
        // Written as of now for the checks of what reads it before the queue is settled (a
        // waiting tensor_tensor); the bytes follow in issue order.
        self.mem.mark_written(&d.tile, d.range);
        let f = if sf == Format::Fp32 || mf == Format::Fp32 { flags::FP32 } else { 0 };
        let cost = pe_cost(shape.partitions, shape.m, shape.n, opts.tile, f);
        self.program.push(
            opc,
            Queue::Engine(Engine::Tensor),
            &[st.region(), mv.region()],
            &[d.region()],
            cost,
        );
        Ok(())
    }

    /// Matmuls waiting in the queue (see [`Machine::nc_matmul_queued`]).
    pub fn queued_matmuls(&self) -> usize {
        self.pe_queue.len()
    }

    /// Whether a plain `nc_matmul` of these operands waits in the queue reading them straight
    /// from SBUF, with no waiting tensor_tensor writing them (it then neither gathers nor
    /// settles).
    pub(crate) fn matmul_reads_sbuf(&self, st: &Tile, mv: &Tile) -> bool {
        let (Ok(sr), Ok(mr)) =
            (self.mem.check_tile("stationary", st), self.mem.check_tile("moving", mv))
        else {
            return false;
        };
        let stride = self.mem.mem(st).stride;
        let (so, mo) = (Opnd { tile: *st, range: sr }, Opnd { tile: *mv, range: mr });
        direct(st, stride)
            && direct(mv, stride)
            && !self.pe_drains.iter().any(|w| overlaps(&w.d, &so) || overlaps(&w.d, &mo))
    }

    /// Whether matmuls or tensor_tensors wait in the queue ([`Machine::settle`] runs them).
    pub fn has_queued_work(&self) -> bool {
        !self.pe_queue.is_empty() || !self.pe_drains.is_empty()
    }

    /// Whether queued work (a matmul, or a waiting tensor_tensor) reads or writes tensor `id`.
    pub(crate) fn queue_uses(&self, id: crate::machine::TensorId) -> bool {
        self.pe_queue.iter().any(|q| {
            q.dst.tile.tensor == id
                || matches!(&q.operands, Operands::Sbuf(s, m) if s.tensor == id || m.tensor == id)
        }) || self.pe_drains.iter().any(|w| [&w.a, &w.b, &w.d].iter().any(|o| o.tile.tensor == id))
    }

    /// Computes every queued matmul and writes PSUM as if they ran one at a time in issue
    /// order, and runs the waiting `tensor_tensor`s between them ([`Drain`]). Consecutive
    /// matmuls accumulating into one destination form a chain computed as one GEMM (its K tiles
    /// are the instructions). Chains are computed in parallel in waves (a chain that accumulates
    /// onto PSUM an earlier chain of the wave writes starts the next wave: it reads it), then
    /// written in issue order, each waiting tensor_tensor run just before the first chain issued
    /// after it. Tensors freed meanwhile give their bytes back at the end.
    pub fn settle(&mut self) -> Result<()> {
        if self.pe_queue.is_empty() && self.pe_drains.is_empty() {
            self.mem.reclaim();
            return Ok(());
        }
        let mut queue = std::mem::take(&mut self.pe_queue);
        let mut drains = std::mem::take(&mut self.pe_drains);
        // Ctrl-C (crate::cancel): checked between waves, and by each chain's GEMM. A cancelled
        // settle puts the chains it has not written (and the tensor_tensors not run) back in
        // the queue, so PSUM never shows a destination's older values as if its matmuls had
        // run: the next settle computes them.
        let cancel = crate::cancel::current();
        let mut chains: Vec<std::ops::Range<usize>> = Vec::new();
        for (i, q) in queue.iter().enumerate() {
            match chains.last_mut() {
                Some(c) if q.accumulate && q.dst.tile == queue[c.start].dst.tile => c.end = i + 1,
                _ => chains.push(i..i + 1),
            }
        }
        // What is not done yet waits again: the matmuls from `first` on, the drains from `next`.
        let requeue = |m: &mut Machine,
                       queue: &mut Vec<QueuedMatmul>,
                       drains: &mut Vec<Drain>,
                       first: usize,
                       next: usize| {
            m.pe_queue = queue.split_off(first);
            m.pe_drains = drains.split_off(next);
            for w in &mut m.pe_drains {
                w.after = w.after.saturating_sub(first);
            }
        };
        let mut next = 0;
        let mut start = 0;
        while start < chains.len() {
            let mut end = start + 1;
            while end < chains.len() && end - start < WAVE_CHAINS && {
                let c = &queue[chains[end].start];
                !(c.accumulate
                    && chains[start..end].iter().any(|w| overlaps(&queue[w.start].dst, &c.dst)))
            } {
                end += 1;
            }
            let wave = &chains[start..end];
            // The tensor_tensors issued before the wave's first chain run before it is computed
            // (a wave computed in place writes all its chains' PSUM at once).
            while next < drains.len() && drains[next].after <= wave[0].start {
                if let Err(e) = self.run_drain(&drains[next]) {
                    requeue(self, &mut queue, &mut drains, wave[0].start, next);
                    return Err(e);
                }
                next += 1;
            }
            let sums: Result<WaveSums> = match cancel.check() {
                Err(e) => Err(e),
                Ok(()) if wave.len() == 1 => match self.chain_in_place(&queue[wave[0].clone()]) {
                    Ok(true) => Ok(WaveSums::InPlace),
                    Ok(false) => {
                        self.chain_sums(&queue[wave[0].clone()]).map(|s| WaveSums::Sums(vec![s]))
                    }
                    Err(e) => Err(e),
                },
                Ok(()) => match self.wave_sums(&queue, wave, &drains[next..]) {
                    Ok(Some(sums)) => Ok(sums),
                    Ok(None) => {
                        // rayon's workers do not inherit the caller's token: each chain
                        // installs it.
                        let this = &*self;
                        wave.par_iter()
                            .map(|c| cancel.install(|| this.chain_sums(&queue[c.clone()])))
                            .collect::<Result<Vec<_>>>()
                            .map(WaveSums::Sums)
                    }
                    Err(e) => Err(e),
                },
            };
            let sums: Vec<Option<Vec<f32>>> = match sums {
                Ok(WaveSums::Sums(sums)) => sums.into_iter().map(Some).collect(),
                Ok(WaveSums::InPlace) => wave.iter().map(|_| None).collect(),
                Err(e) => {
                    // Nothing of this wave is written yet (or, in place, only values its
                    // overwriting chains give again): it and the rest wait again.
                    let first = chains[start].start;
                    requeue(self, &mut queue, &mut drains, first, next);
                    return Err(e);
                }
            };
            for (c, s) in wave.iter().zip(sums) {
                while next < drains.len() && drains[next].after <= c.start {
                    if let Err(e) = self.run_drain(&drains[next]) {
                        requeue(self, &mut queue, &mut drains, c.start, next);
                        return Err(e);
                    }
                    next += 1;
                }
                let dst = &queue[c.start].dst;
                let written = match s {
                    Some(s) => self.write_chain(dst, &s),
                    None => {
                        self.chain_written(dst);
                        Ok(())
                    }
                };
                if let Err(e) = written {
                    requeue(self, &mut queue, &mut drains, c.start, next);
                    return Err(e);
                }
            }
            start = end;
        }
        while next < drains.len() {
            if let Err(e) = self.run_drain(&drains[next]) {
                let first = queue.len();
                requeue(self, &mut queue, &mut drains, first, next);
                return Err(e);
            }
            next += 1;
        }
        self.mem.reclaim();
        Ok(())
    }

    /// The sums of a wave of chains whose operands all lie in SBUF, computed as one set
    /// ([`engine::run_chains`]: each distinct operand tile packed once), into their PSUM
    /// destinations at once where [`Machine::in_place_rows`] allows it; `None` when an operand
    /// was gathered or the packed set would be too large (then each chain on its own). `drains`
    /// are the waiting tensor_tensors not yet run (none issued before the wave's first chain).
    fn wave_sums(
        &mut self, queue: &[QueuedMatmul], wave: &[std::ops::Range<usize>], drains: &[Drain],
    ) -> Result<Option<WaveSums>> {
        // Distinct operand tiles (the memories do not change while a wave is computed).
        let (mut st, mut mv): (Vec<Tile>, Vec<Tile>) = (Vec::new(), Vec::new());
        let index = |set: &mut Vec<Tile>, t: &Tile| match set.iter().position(|x| x == t) {
            Some(i) => i,
            None => {
                set.push(*t);
                set.len() - 1
            }
        };
        let mut plans = Vec::with_capacity(wave.len());
        for c in wave {
            let mut tiles = Vec::with_capacity(c.len());
            for q in &queue[c.clone()] {
                let Operands::Sbuf(s, m) = &q.operands else {
                    return Ok(None);
                };
                tiles.push((index(&mut st, s), index(&mut mv, m)));
            }
            plans.push(tiles);
        }
        fn readers<'a>(mem: &'a ByteMem, arg: &str, set: &[Tile]) -> Result<Vec<Reader<'a>>> {
            set.iter().map(|t| reader_in(mem, arg, t)).collect()
        }
        fn ops<'r, 'a>(set: &[Tile], rs: &'r [Reader<'a>]) -> Vec<engine::ChainOperand<'r, 'a>> {
            set.iter()
                .zip(rs)
                .map(|(t, r)| engine::ChainOperand {
                    reader: r,
                    k: t.partitions as usize,
                    f: t.free_size(),
                })
                .collect()
        }
        let job = |tiles, head: &QueuedMatmul, rows| engine::ChainJob {
            tiles,
            m: head.shape.m,
            n: head.shape.n,
            first: !head.accumulate,
            rows,
        };
        // Each side packed again only where its tiles changed, or their bytes were written,
        // since the last wave.
        self.pe_pack.check(&self.mem.sbuf_writes, [&st, &mv]);
        if let Some(places) = self.in_place_rows(queue, wave, drains) {
            // Operands read from SBUF while the sums go straight into PSUM's rows.
            let mem = &mut self.mem;
            let (sbuf, psum) = mem.sbuf_and_psum_mut();
            let (sr, mr) = (readers(sbuf, "stationary", &st)?, readers(sbuf, "moving", &mv)?);
            let (a_ops, b_ops) = (ops(&st, &sr), ops(&mv, &mr));
            let mut rows: Vec<Vec<&mut [f32]>> =
                wave.iter().map(|c| Vec::with_capacity(queue[c.start].shape.m)).collect();
            let widths: Vec<(usize, usize)> =
                places.iter().map(|&(at, ci)| (at, queue[wave[ci].start].shape.n)).collect();
            let Some(split) = split_rows(psum.f32_words_mut(), &widths) else {
                return Ok(None);
            };
            for (row, &(_, ci)) in split.into_iter().zip(&places) {
                rows[ci].push(row);
            }
            let mut jobs: Vec<engine::ChainJob> = plans
                .into_iter()
                .zip(rows)
                .zip(wave)
                .map(|((tiles, rows), c)| job(tiles, &queue[c.start], rows))
                .collect();
            let done = engine::run_chains(&a_ops, &b_ops, &mut jobs, &mut self.pe_pack.panels);
            if done.is_err() {
                self.pe_pack.clear();
            }
            return Ok(done?.then_some(WaveSums::InPlace));
        }
        let (sr, mr) = (
            readers(self.mem.sbuf(), "stationary", &st)?,
            readers(self.mem.sbuf(), "moving", &mv)?,
        );
        let (a_ops, b_ops) = (ops(&st, &sr), ops(&mv, &mr));
        let mut outs = Vec::with_capacity(wave.len());
        for c in wave {
            let head = &queue[c.start];
            let (m, n) = (head.shape.m, head.shape.n);
            outs.push(if head.accumulate {
                self.gather_f32(&head.dst.tile)?
            } else {
                crate::host::zeroed_vec("dst", "a matmul chain's sums", m * n)?
            });
        }
        let mut jobs: Vec<engine::ChainJob> = outs
            .iter_mut()
            .zip(plans)
            .zip(wave)
            .map(|((out, tiles), c)| {
                let head = &queue[c.start];
                job(tiles, head, out.chunks_mut(head.shape.n.max(1)).collect())
            })
            .collect();
        let done = engine::run_chains(&a_ops, &b_ops, &mut jobs, &mut self.pe_pack.panels);
        drop(jobs);
        if done.is_err() {
            self.pe_pack.clear();
        }
        let done = done?;
        Ok(done.then_some(WaveSums::Sums(outs)))
    }

    /// Where each chain of a wave can be computed straight into its PSUM destination: the
    /// host word index of every destination row (with its chain's index in the wave), in
    /// ascending order; `None` unless every chain overwrites (its first matmul does not
    /// accumulate, so a wave computed again after Ctrl-C gives the same values), its
    /// destination is dense float32 rows of PSUM, no two destinations share a byte, and no
    /// waiting tensor_tensor that runs between the wave's chains (in `drains`, issue order)
    /// touches the destination of a chain issued after it (it must see that PSUM as it was).
    fn in_place_rows(
        &self, queue: &[QueuedMatmul], wave: &[std::ops::Range<usize>], drains: &[Drain],
    ) -> Option<Vec<(usize, usize)>> {
        let mut rows = Vec::new();
        for (ci, c) in wave.iter().enumerate() {
            let head = &queue[c.start];
            // (Its shape, m rows of n, was checked when the matmul was queued.)
            if head.accumulate {
                return None;
            }
            rows.extend(self.psum_row_words(&head.dst.tile, head.shape.m)?.map(|at| (at, ci)));
        }
        rows.sort_unstable();
        let width = |r: &(usize, usize)| queue[wave[r.1].start].shape.n;
        if rows.windows(2).any(|w| w[0].0 + width(&w[0]) > w[1].0) {
            return None;
        }
        let last = wave.last()?.start;
        for w in drains.iter().take_while(|w| w.after <= last) {
            let mut later = wave.iter().filter(|c| c.start >= w.after).map(|c| &queue[c.start].dst);
            if later.any(|d| overlaps(&w.a, d) || overlaps(&w.b, d) || overlaps(&w.d, d)) {
                return None;
            }
        }
        Some(rows)
    }

    /// The host word index of each of the `m` rows of PSUM destination `d`, when a chain can
    /// be computed straight into them: dense float32 rows of PSUM, 4-byte aligned, on a
    /// little-endian host ([`Machine::in_place_rows`], [`Machine::chain_in_place`]).
    fn psum_row_words(&self, d: &Tile, m: usize) -> Option<impl Iterator<Item = usize>> {
        let stride = self.mem.psum.stride;
        if !cfg!(target_endian = "little")
            || !stride.is_multiple_of(4)
            || d.space != Space::Psum
            || !dense_fp32_rows(d)
            || d.offset < 0
            || d.offset % 4 != 0
        {
            return None;
        }
        let base = self.mem.psum.at(d.start_partition as usize, d.offset as usize);
        Some((0..m).map(move |i| (base + i * stride) / 4))
    }

    /// A chain computed in place ([`Machine::in_place_rows`]): its destination marked written
    /// by a matmul, as [`Machine::write_chain`] marks it.
    fn chain_written(&mut self, d: &Opnd) {
        self.mem.mark_written(&d.tile, d.range);
        self.set_psum_mm(d);
    }

    /// Computes a waiting tensor_tensor's values ([`Drain`]).
    fn run_drain(&mut self, w: &Drain) -> Result<()> {
        self.tensor_tensor_values(w.op, false, &w.a, &w.b, &w.d)
    }

    /// `nc_transpose`: `dst = data.T` (partition axis and flattened free axis swapped), bit for
    /// bit. Tensor engine: `data` in SBUF up to 128 x 128, `dst` in PSUM; Vector engine: up to
    /// 32 x 32, SBUF or PSUM.
    pub fn nc_transpose(&mut self, engine: Engine, dst: &Tile, data: &Tile) -> Result<()> {
        let opc = Opcode::NcTranspose;
        check_engine(opc, engine)?;
        self.settle()?;
        if engine == Engine::Tensor {
            let x = self.pe_input("data", data)?;
            let d = self.operand("dst", dst, Some(engine), true)?;
            if dst.space != Space::Psum {
                return Err(rule(
                    "dst",
                    "matmul_memory",
                    "the tensor engine writes PSUM; dst is not in PSUM",
                ));
            }
            return self.pe_transpose(opc, &d, &x, None, PeTile::FULL);
        }
        let x = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        let lim = VECTOR_TRANSPOSE_MAX as u32;
        if x.p() > lim || x.n() > lim as usize {
            return Err(shape_rule(
                "data",
                "transpose_size",
                format!("{} x {}; the Vector engine transposes up to {lim} x {lim}", x.p(), x.n()),
            ));
        }
        self.transpose_values(&d, &x)?;
        self.record_engine(opc, engine, &[&x], &[], &d, 0);
        Ok(())
    }

    /// Checks shapes and dtypes of a transpose and moves the bits.
    fn transpose_values(&mut self, d: &Opnd, x: &Opnd) -> Result<()> {
        if d.tile.dtype != x.tile.dtype {
            return Err(dtype_rule(
                "dst",
                "transpose_dtype",
                format!(
                    "a transpose keeps the dtype: data is {}, dst is {}",
                    x.tile.dtype, d.tile.dtype
                ),
            ));
        }
        let (k, m) = (x.p() as usize, x.n());
        if d.p() as usize != m || d.n() != k {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "the transpose of {k} x {m} is {m} x {k}; dst is {:?}",
                    d.tile.logical_shape()
                ),
            ));
        }
        let v = self.gather_bits(&x.tile)?;
        let mut t = vec![0u32; k * m];
        for i in 0..k {
            for j in 0..m {
                t[j * k + i] = v[i * m + j];
            }
        }
        self.scatter_bits(d, &t)?;
        Ok(())
    }

    /// The tensor engine's transpose (nc_transpose, or nc_matmul with is_transpose).
    fn pe_transpose(
        &mut self, opc: Opcode, d: &Opnd, x: &Opnd, identity: Option<&Opnd>, tile: PeTile,
    ) -> Result<()> {
        format_of("data", &x.tile)?;
        let lim = crate::spec::PE_ROWS as u32;
        if x.p() > lim || x.n() > lim as usize {
            return Err(shape_rule(
                "data",
                "transpose_size",
                format!("{} x {}; the tensor engine transposes up to {lim} x {lim}", x.p(), x.n()),
            ));
        }
        let k = x.p() as usize;
        let mut reads = vec![x.region()];
        if let Some(id) = identity {
            let v = self.gather_f32(&id.tile)?;
            let is_identity = id.p() as usize == k
                && id.n() == k
                && v.iter().enumerate().all(|(i, &e)| e == if i / k == i % k { 1.0 } else { 0.0 });
            if !is_identity {
                return Err(Error::value(
                    "moving",
                    format!("transpose mode needs the {k} x {k} identity as moving"),
                ));
            }
            reads.push(id.region());
        }
        self.transpose_values(d, x)?;
        let mut f = flags::TRANSPOSE;
        if x.tile.dtype == Dtype::Fp32 {
            f |= flags::FP32;
        }
        // The transpose formula reads `m` as the input's partitions and `k` as its free size.
        let cost = pe_cost(x.p() as usize, x.p() as usize, x.n(), tile, f);
        self.program.push(opc, Queue::Engine(Engine::Tensor), &reads, &[d.region()], cost);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::{Machine, MachineConfig, PeOptions};
    use super::*;
    use crate::machine::tile::Index;

    /// A wave of two chains (two PSUM tiles, `st`'s column halves times `mv`), settled.
    fn wave(m: &mut Machine, st: &Tile, mv: &Tile) {
        for i in 0..2i64 {
            let p = m.alloc(Space::Psum, "p", &[64, mv.free_size()], Dtype::Fp32).expect("psum");
            let cols = Index::Range { start: Some(i * 64), stop: Some(i * 64 + 64), step: 1 };
            let s = st.slice(&[Index::ALL, cols]).expect("st");
            m.nc_matmul_queued(&p, &s, mv, &PeOptions::default()).expect("queued");
            m.free(&p).expect("free");
        }
        m.settle().expect("settle");
    }

    #[test]
    fn a_wave_reuses_the_packed_operands_of_the_last_while_their_bytes_stand() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let alloc = |m: &mut Machine, name: &str, shape: &[usize]| {
            let t = m.alloc(Space::Sbuf, name, shape, Dtype::Bf16).expect("alloc");
            m.write_tile(&t, &vec![0x3F; t.elements() * 2]).expect("write");
            t
        };
        let (st, mv, other) = (
            alloc(&mut m, "st", &[128, 128]),
            alloc(&mut m, "mv", &[128, 96]),
            alloc(&mut m, "o", &[128, 512]),
        );
        wave(&mut m, &st, &mv);
        assert_eq!(m.pe_pack.packed, 2, "both sides packed");
        wave(&mut m, &st, &mv);
        assert_eq!(m.pe_pack.packed, 2, "nothing written: both kept");
        // A write elsewhere in SBUF (other columns) keeps them; one into `mv` packs it again.
        m.write_tile(&other, &vec![0; 128 * 512 * 2]).expect("write other");
        wave(&mut m, &st, &mv);
        assert_eq!(m.pe_pack.packed, 2, "another tensor written: both kept");
        m.write_tile(&mv, &vec![0; 128 * 96 * 2]).expect("write mv");
        wave(&mut m, &st, &mv);
        assert_eq!(m.pe_pack.packed, 3, "mv written: packed again");
        // Other tiles: packed.
        let half =
            mv.slice(&[Index::ALL, Index::Range { start: Some(0), stop: Some(48), step: 1 }]);
        wave(&mut m, &st, &half.expect("half"));
        assert_eq!(m.pe_pack.packed, 4, "another moving tile");
    }
}
