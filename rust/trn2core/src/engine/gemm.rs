//! The tiled GEMM: `a @ b` cut onto the tensor engine as a kernel would, computed by a parallel,
//! cache-blocked, register-blocked SIMD driver.
//!
//! # Which bits
//!
//! K is cut into consecutive tiles of the engine's contraction (128, or 256 in `double_row`);
//! each tile's partial sums start at +0.0 and take their products in the tile's order
//! (ascending k; in `double_row` k, k + 128 for each row k of the tile, an edge tile skipping the
//! rows it does not have); the first tile's sums are written, every later tile's sums are added
//! with one fp32 rounding. M and N tiling (by 128 and 512 on the engine) do not change a bit:
//! every output element is computed on its own.
//!
//! # How fast
//!
//! The loop nest is the classic one of BLIS/GotoBLAS, with the K block fixed to the engine's K
//! tile (which is also about the size a BLAS would pick). For each K tile, in order:
//!
//! * the tile's slice of `a` is packed into `MR`-row micro-panels and the tile's rows of `b`
//!   into `NR`-column micro-panels, each element once, in parallel, both in the tile's product
//!   order (so `double_row`'s interleaving costs nothing in the kernel);
//! * the output is cut into blocks of `MC` rows x `NC` columns, one rayon task each, and every
//!   task adds the tile into its block: for each `MR`-row micro-panel of `a` (kept in L1), the
//!   micro-kernel ([`super::kernel`]) runs over the block's `NR`-column micro-panels of `b`
//!   (streamed from L2), holding an `MR x NR` block of partial sums in registers across the
//!   tile's products, then writing or adding it (the output rows are prefetched meanwhile).
//!
//! Every output element is written by exactly one task per tile, and the tiles follow one another,
//! so the bits do not depend on the number of threads or on who steals what. Measured on a
//! 2-core AVX-512 host (Zen 4): a 2048^3 GEMM at about 0.9 to 1.0 times numpy's OpenBLAS sgemm,
//! which is free to reorder its sums (docs/benchmarks.md, "Tensor engine").

use std::cell::RefCell;

use rayon::prelude::*;

use super::kernel::{fp_env_is_ieee, MicroKernel, Portable, MAX_MR};
use super::operand::{check_len, f32_bits, Buffer, Reader, Scratch, Strided, RUN};
use super::PerfMode;
use crate::sparsity::Dtype;
use crate::{Error, Result};

/// Host cache blocking (not a hardware number): rows of `a` per task, as micro-panels of `MR`.
const MC_PANELS: usize = 16;
/// Host cache blocking: columns of `b` per task, as micro-panels of `NR` (512 for AVX-512).
const NC_PANELS: usize = 8;
/// Host task sizing: a chain set is cut into at least this many tasks per thread where its
/// column blocks can be narrowed (see `drive_chains`).
const CHAIN_TASKS_PER_THREAD: usize = 16;
/// Packing jobs take at least this many micro-panels (a job of a few microseconds).
const PACK_MIN_PANELS: usize = 4;
/// Host prefetching (not a hardware number): how many rows ahead `pack_cols` asks the CPU to
/// load (4, 8 and 16 measured the same; none was about 3 ms slower a 2048^3 NKI matmul).
const PREFETCH_ROWS: usize = 4;
/// Host prefetching: how many micro-panels ahead `pack_a` asks for the rows of (none was
/// about 3 ms slower a 2048^3 `gemm`).
const PREFETCH_PANELS: usize = 2;

/// How the contraction is cut into tiles and ordered inside one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tiling {
    /// Products per full tile.
    pub tile: usize,
    /// `double_row` order: k, k + `tile / 2` for each row k of the tile.
    pub interleave: bool,
}

impl Tiling {
    /// The tiling of a GEMM in `perf_mode`.
    pub(crate) fn gemm(perf_mode: PerfMode) -> Tiling {
        Tiling { tile: perf_mode.contraction_max(), interleave: perf_mode == PerfMode::DoubleRow }
    }

    /// The product order of a tile of `len` products, as offsets into the tile.
    fn order(self, len: usize) -> Vec<usize> {
        if !self.interleave {
            return (0..len).collect();
        }
        // The PE row count is the distance between the two elements sharing a row.
        let half = self.tile / 2;
        (0..half.min(len)).flat_map(|r| [r, r + half]).filter(|&k| k < len).collect()
    }
}

/// Computes `a @ b` for `a` `[M, K]` and `b` `[K, N]`, both row-major float32 (the exact values
/// of the input format), tiled onto the tensor engine as the contract says (see the module doc
/// of [`crate::engine`]); returns the `[M, N]` result, row-major.
///
/// Bit-exact for every input format, fp32 and tf32 included, and independent of the thread
/// count. Rows are computed independently, so a caller may split `a` and the output into row
/// blocks (for instance to check for interrupts between them) without changing a bit.
///
/// Errors: a slice whose length is not the product of its dimensions (`ShapeError`); an output
/// too large for this host (`CapacityError`); a non-IEEE floating-point environment
/// (`ValueError`).
pub fn gemm_f32(
    a: &[f32], b: &[f32], m: usize, k: usize, n: usize, perf_mode: PerfMode,
) -> Result<Vec<f32>> {
    let len = m
        .checked_mul(n)
        .ok_or_else(|| Error::capacity("out", format!("{m} x {n} elements overflow usize")))?;
    check_len("a", a.len(), &[m, k])?;
    check_len("b", b.len(), &[k, n])?;
    let mut out = crate::host::zeroed_vec("out", &format!("the {m} x {n} float32 result"), len)?;
    gemm_f32_into(a, b, m, k, n, perf_mode, &mut out)?;
    Ok(out)
}

/// [`gemm_f32`] into a caller's buffer of `m * n` elements (e.g. a numpy-allocated output).
pub fn gemm_f32_into(
    a: &[f32], b: &[f32], m: usize, k: usize, n: usize, perf_mode: PerfMode, out: &mut [f32],
) -> Result<()> {
    let a = f32_reader("a", a, [m, k])?;
    let b = f32_reader("b", b, [k, n])?;
    check_len("out", out.len(), &[m, n])?;
    run(&a, &b, m, k, n, Tiling::gemm(perf_mode), out)
}

/// A row-major float32 matrix read as fp32 values as they stand (`ShapeError` unless `data` holds
/// `rows * cols` elements).
pub(crate) fn f32_reader<'a>(arg: &str, data: &'a [f32], shape: [usize; 2]) -> Result<Reader<'a>> {
    let buffer = Buffer::U32(f32_bits(data));
    Ok(Reader::f32(Strided::row_major(arg, buffer, Dtype::F32, shape)?))
}

/// The error every task returns when the floating-point environment is not IEEE's default.
pub(crate) fn fp_env_error() -> Error {
    Error::value(
        "floating-point environment",
        "this thread runs with flush-to-zero, denormals-are-zero or a non-default rounding mode \
         (MXCSR), probably set by a library built with -ffast-math; the tensor engine's \
         bit-exact results need IEEE defaults (round to nearest even, subnormals kept)",
    )
}

/// The driver: `out[i, j] = sum over tiles of sum over the tile's products of a[i, k] * b[k, j]`
/// with the engine's rounding, `a` `[m, k]` and `b` `[k, n]` read through their readers (which
/// round them into their formats as they are packed). `out` is `m x n` row-major; shapes are
/// the caller's to check.
pub(crate) fn run(
    a: &Reader, b: &Reader, m: usize, k: usize, n: usize, tiling: Tiling, out: &mut [f32],
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        // No tile ever writes PSUM; the empty sum is +0.0 (as numpy's).
        out.fill(0.0);
        return Ok(());
    }
    if !fp_env_is_ieee() {
        return Err(fp_env_error());
    }
    let orders = [tiling.order(tiling.tile), tiling.order(k % tiling.tile)];
    run_tiles(&k_tiles(a, b, k, tiling, &orders), m, n, true, out)
}

/// The K tiles of one GEMM of contraction `k` (`orders`: a full tile's and the tail's).
fn k_tiles<'r, 'a>(
    a: &'r Reader<'a>, b: &'r Reader<'a>, k: usize, tiling: Tiling, orders: &'r [Vec<usize>; 2],
) -> Vec<KTile<'r, 'a>> {
    (0..k)
        .step_by(tiling.tile)
        .map(|k0| KTile { a, b, k0, order: &orders[usize::from(k - k0 < tiling.tile)], a_t: false })
        .collect()
}

/// One K tile of a GEMM: products `k0 + order[..]` of `a` (`[m, ..]`) and `b` (`[.., n]`);
/// `order.len() <= RUN`.
pub(crate) struct KTile<'r, 'a> {
    /// The rows' operand.
    pub a: &'r Reader<'a>,
    /// The columns' operand.
    pub b: &'r Reader<'a>,
    /// The tile's first product.
    pub k0: usize,
    /// The tile's product order, as offsets from `k0`.
    pub order: &'r [usize],
    /// `a` is given transposed, `[.., m]` (K rows of M): its panels are packed from runs of
    /// its rows, as `b`'s are (an `nc_matmul`'s stationary operand as it lies in SBUF).
    pub a_t: bool,
}

/// The driver over an explicit list of K tiles, each from its own operands (a chain of
/// `nc_matmul`s accumulating into one PSUM region is one call): `out += tile sums`, tile after
/// tile, each with one fp32 rounding; the first tile writes `out` when `first` (else every tile
/// adds to what `out` holds). NaN results are canonical. Shapes are the caller's to check.
pub(crate) fn run_tiles(
    tiles: &[KTile], m: usize, n: usize, first: bool, out: &mut [f32],
) -> Result<()> {
    run_tiles_in(tiles, m, n, first, out, false)
}

/// [`run_tiles`] for a chain of `nc_matmul`s (the machine's): a chain too long for one pass
/// runs in runs of tiles that each fit one (the same bits; up to [`ONE_PASS_FLOATS`] of packed
/// panels at a time, where [`run_tiles`], `trn2core.gemm`'s driver, packs a tile at a time).
pub(crate) fn run_chain_tiles(
    tiles: &[KTile], m: usize, n: usize, first: bool, out: &mut [f32],
) -> Result<()> {
    run_tiles_in(tiles, m, n, first, out, true)
}

fn run_tiles_in(
    tiles: &[KTile], m: usize, n: usize, first: bool, out: &mut [f32], in_runs: bool,
) -> Result<()> {
    if m == 0 || n == 0 || tiles.is_empty() {
        return Ok(());
    }
    if !fp_env_is_ieee() {
        return Err(fp_env_error());
    }
    let macs = tiles.iter().map(|t| t.order.len()).sum::<usize>().saturating_mul(m * n);
    // A long chain into a small output (an NKI kernel's 64 matmuls into one PSUM tile): tile
    // by tile on this thread and the duo helper, each tile's panels packed and added while
    // they are in cache, not the pool's one pass over all tiles' panels (16 MiB of them for
    // 51 such tiles, written and read back through memory).
    let per_tile = macs > SEQUENTIAL_MACS && m.saturating_mul(n) <= DUO_OUTPUT_FLOATS;
    let seq = macs <= SEQUENTIAL_MACS || per_tile;
    if !seq {
        super::duo::quiet(); // the pool's threads take both cores
    }
    let (limit, in_runs) = if per_tile { (0, false) } else { (ONE_PASS_FLOATS, in_runs) };
    drive_any(tiles, m, n, first, out.chunks_mut(n).collect(), limit, in_runs, seq)
}

/// [`drive`] with the best kernel the host has.
#[allow(clippy::too_many_arguments)]
fn drive_any(
    tiles: &[KTile], m: usize, n: usize, first: bool, rows: Vec<&mut [f32]>, limit: usize,
    in_runs: bool, seq: bool,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kernel) = super::kernel::Avx512::detect() {
            return drive(kernel, tiles, m, n, first, rows, limit, in_runs, seq);
        }
        if let Some(kernel) = super::kernel::Avx2::detect() {
            return drive(kernel, tiles, m, n, first, rows, limit, in_runs, seq);
        }
    }
    drive(Portable, tiles, m, n, first, rows, limit, in_runs, seq)
}

/// One K tile's products added onto `rows`, the `m` rows of `n` of an output held elsewhere (a
/// PSUM destination's, in place), or written to them when `first`: the bits
/// [`run_chain_tiles`] gives for a chain of that one tile. All or nothing: a product of at most
/// [`SEQUENTIAL_MACS`] multiply-adds runs on this thread (with the duo helper), and the cancel
/// token is checked before anything is written, never after, so an accumulating destination
/// never holds part of the tile's sums. `Ok(false)`, with nothing done, for a larger product
/// or rows of another shape.
pub(crate) fn add_tile_in_place(
    tile: &KTile, m: usize, n: usize, first: bool, rows: Vec<&mut [f32]>,
) -> Result<bool> {
    let macs = tile.order.len().saturating_mul(m).saturating_mul(n);
    if macs > SEQUENTIAL_MACS || rows.len() != m || rows.iter().any(|r| r.len() != n) {
        return Ok(false);
    }
    if m == 0 || n == 0 {
        return Ok(true);
    }
    if !fp_env_is_ieee() {
        return Err(fp_env_error());
    }
    drive_any(std::slice::from_ref(tile), m, n, first, rows, ONE_PASS_FLOATS, false, true)?;
    Ok(true)
}

/// Output elements up to which a product of more than [`SEQUENTIAL_MACS`] runs tile by tile on
/// the calling thread and the duo helper (see `run_tiles_in`): a 128 x 1024 float32 output,
/// 512 KiB, half in each core's cache.
const DUO_OUTPUT_FLOATS: usize = 128 * 1024;

/// Multiply-adds up to which [`run_tiles`] and [`run_chain_tiles`] run on the calling thread
/// alone: two of a machine's `nc_matmul`s of 128 x 128 x 512. Below it the pool's fork-joins
/// (waking its workers and waiting for them, three or four per K tile) cost more than the other
/// cores give back; a kernel that settles the matmul queue at every `dma_copy` (the NKI
/// tutorial's tiled matmul) computes one such product per settle. Host scheduling only: each
/// output block adds the same tiles in the same order, so the bits are the same.
const SEQUENTIAL_MACS: usize = 1 << 24;

/// A `[k, f]` operand of a set of chains ([`run_chains`]), read by rows (`k <= RUN` products in
/// natural order): a transposed `a` (an `nc_matmul`'s stationary, `f` = M) or a `b` (its moving,
/// `f` = N).
pub(crate) struct ChainOperand<'r, 'a> {
    pub reader: &'r Reader<'a>,
    pub k: usize,
    pub f: usize,
}

/// One chain of [`run_chains`]: its K tiles in order, each as its operands' indices (into the
/// set's `a` and `b` operands), and its `m x n` output as its `m` rows of `n` (written by its
/// first tile when `first`, else added to): a buffer's, or rows in place in a memory.
pub(crate) struct ChainJob<'o> {
    pub tiles: Vec<(usize, usize)>,
    pub m: usize,
    pub n: usize,
    pub first: bool,
    pub rows: Vec<&'o mut [f32]>,
}

/// Packed floats of one side of a chain set above which [`run_chains`] declines (the largest
/// packing buffer a thread keeps, [`SPARE_MAX_FLOATS`]).
const CHAIN_SET_MAX_FLOATS: usize = SPARE_MAX_FLOATS;

/// One side's packed operands of a chain set ([`run_chains`]), kept for the next set: a
/// machine keeps them, and hands them back when the next set's operands on that side are the
/// same tiles, none of whose bytes was written since (a blocked kernel's moving tiles serve
/// several waves of chains; the machine's check, which invalidates them otherwise), so that
/// they are not packed again. Packed panels are a function of the operands' values and the
/// kernel's panel width only.
#[derive(Default)]
pub(crate) struct KeptPanels {
    /// The buffer the side was packed into.
    buf: Option<Aligned>,
    /// What `buf` holds, valid: the panel width and each operand's packed length. `None`
    /// when it holds nothing valid (never packed, invalidated, or a packing was interrupted).
    packed: Option<(usize, Vec<usize>)>,
}

/// The buffers of kept panels whose machine is gone, for the next machine's (at most
/// [`KEPT_SPARES`], each of at most [`SPARE_MAX_FLOATS`]): a machine is dropped on the thread
/// that made it while its panels are packed on the pool's threads, so the thread-local spares
/// of [`PackBuf`] would not hand them on, and every launch of a kernel would zero and fault in
/// new ones. Contents unspecified, as a spare's.
static KEPT: std::sync::Mutex<Vec<Aligned>> = std::sync::Mutex::new(Vec::new());
const KEPT_SPARES: usize = 2;

impl KeptPanels {
    /// Forgets what was packed: the operands' tiles or bytes changed.
    pub(crate) fn invalidate(&mut self) {
        self.packed = None;
    }

    /// Whether the panels are valid for operands of these packed lengths at panel width `w`.
    fn holds(&self, w: usize, lens: &[usize]) -> bool {
        self.packed.as_ref().is_some_and(|(pw, pl)| *pw == w && pl == lens)
    }

    /// The buffer for `len` floats, invalid until packed: this one if it has the room, else a
    /// kept spare that has, else a new one.
    fn take(&mut self, len: usize) -> Result<&mut [f32]> {
        self.packed = None;
        if self.buf.as_ref().is_none_or(|b| b.room() < len) {
            let spare = KEPT.lock().ok().and_then(|mut kept| {
                let i = (0..kept.len())
                    .filter(|&i| kept[i].room() >= len)
                    .min_by_key(|&i| kept[i].room())?;
                Some(kept.swap_remove(i))
            });
            let fresh = match spare {
                Some(b) => b,
                None => Aligned::new(len, "the packed operands of a chain set")?,
            };
            give_back(self.buf.replace(fresh));
        }
        let buf = self.buf.as_mut().expect("set above");
        buf.len = len;
        Ok(buf.as_mut_slice())
    }

    fn slice(&self) -> &[f32] {
        self.buf.as_ref().map_or(&[], |b| &b.buf[b.offset..b.offset + b.len])
    }
}

/// Keeps a kept-panels buffer for the next machine, the longer ones first.
fn give_back(buf: Option<Aligned>) {
    let Some(buf) = buf.filter(|b| b.room() > 0 && b.room() <= SPARE_MAX_FLOATS) else {
        return;
    };
    if let Ok(mut kept) = KEPT.lock() {
        if kept.len() < KEPT_SPARES {
            kept.push(buf);
        } else if let Some(short) = kept.iter_mut().min_by_key(|b| b.room()) {
            if short.room() < buf.room() {
                *short = buf;
            }
        }
    }
}

impl Drop for KeptPanels {
    fn drop(&mut self) {
        give_back(self.buf.take());
    }
}

/// Several chains at once, each with the bits [`run_tiles`] gives it (`a_t` tiles in natural
/// order): every distinct operand is packed once, in parallel (chains of one kernel share their
/// operands: a stationary tile across the output's column blocks, a moving one across its row
/// blocks), then every output block of every chain adds its chain's tiles in order, in one
/// parallel pass. `kept` holds each side's panels between sets: a side whose panels are valid
/// for these operands (the caller invalidates them when its operands change) is not packed
/// again; the others are packed into it. `Ok(false)` (nothing computed) when the packed
/// operands would exceed [`CHAIN_SET_MAX_FLOATS`] on either side. Shapes are the caller's to
/// check.
pub(crate) fn run_chains(
    a_ops: &[ChainOperand], b_ops: &[ChainOperand], chains: &mut [ChainJob],
    kept: &mut [KeptPanels; 2],
) -> Result<bool> {
    if !fp_env_is_ieee() {
        return Err(fp_env_error());
    }
    super::duo::quiet(); // the pool's threads take both cores
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kernel) = super::kernel::Avx512::detect() {
            return drive_chains(kernel, a_ops, b_ops, chains, kept);
        }
        if let Some(kernel) = super::kernel::Avx2::detect() {
            return drive_chains(kernel, a_ops, b_ops, chains, kept);
        }
    }
    drive_chains(Portable, a_ops, b_ops, chains, kept)
}

fn drive_chains<K: MicroKernel>(
    kernel: K, a_ops: &[ChainOperand], b_ops: &[ChainOperand], chains: &mut [ChainJob],
    kept: &mut [KeptPanels; 2],
) -> Result<bool> {
    let len = |ops: &[ChainOperand], w: usize| -> Vec<usize> {
        ops.iter().map(|o| o.f.div_ceil(w) * w * o.k).collect()
    };
    let (a_lens, b_lens) = (len(a_ops, K::MR), len(b_ops, K::NR));
    let (a_total, b_total): (usize, usize) = (a_lens.iter().sum(), b_lens.iter().sum());
    if a_total > CHAIN_SET_MAX_FLOATS || b_total > CHAIN_SET_MAX_FLOATS {
        return Ok(false);
    }
    let cancel = crate::cancel::current();
    // One packing job per operand of a side not kept: (operand, panel width, its share of the
    // side's buffer).
    let mut jobs: Vec<(&ChainOperand, usize, &mut [f32])> =
        Vec::with_capacity(a_ops.len() + b_ops.len());
    let mut packed = [false; 2];
    let sides = [(a_ops, &a_lens, K::MR, a_total), (b_ops, &b_lens, K::NR, b_total)];
    for ((keep, (ops, lens, w, total)), packs) in kept.iter_mut().zip(sides).zip(&mut packed) {
        if keep.holds(w, lens) {
            continue;
        }
        *packs = true;
        let mut rest = keep.take(total)?;
        for (op, &l) in ops.iter().zip(lens) {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(l);
            jobs.push((op, w, mine));
            rest = tail;
        }
    }
    let order: Vec<usize> = (0..RUN).collect();
    jobs.par_iter_mut().try_for_each_init(Scratch::new, |s, (op, w, panels)| {
        cancel.check()?;
        let (order, w) = (&order[..op.k], *w);
        let group = (RUN / w).max(1);
        for (g, chunk) in panels.chunks_mut(group * w * op.k).enumerate() {
            pack_cols(op.reader, op.f, w, g * group, 0, order, chunk, s);
        }
        Ok::<(), Error>(())
    })?;
    let offsets = |lens: &[usize]| -> Vec<usize> {
        lens.iter().scan(0, |acc, &l| Some(std::mem::replace(acc, *acc + l))).collect()
    };
    let (a_off, b_off) = (offsets(&a_lens), offsets(&b_lens));
    drop(jobs);
    for ((keep, (w, lens)), packs) in
        kept.iter_mut().zip([(K::MR, &a_lens), (K::NR, &b_lens)]).zip(packed)
    {
        if packs {
            keep.packed = Some((w, lens.clone()));
        }
    }
    let [akept, bkept] = &*kept;
    let (apack, bpack) = (akept.slice(), bkept.slice());
    // Output blocks of at most MC x NC, a chain's rows cut into blocks of equal panel counts
    // (a 128-row chain is two blocks of 11 panels, not 16 and 6), and narrower column blocks
    // while the set makes fewer than CHAIN_TASKS_PER_THREAD tasks per thread: a wave's last
    // tasks, which one thread runs while the other waits, are then short (eight 128 x 512
    // chains: 32 tasks of 66 x 256, not 16 of 96 or 32 x 512).
    let mc_of = |m: usize| {
        let panels = m.div_ceil(K::MR);
        panels.div_ceil(panels.div_ceil(MC_PANELS)) * K::MR
    };
    let threads = rayon::current_num_threads().max(1);
    let mut nc_panels = NC_PANELS;
    let count = |nc: usize| -> usize {
        chains.iter().filter(|c| c.m > 0).map(|c| c.m.div_ceil(mc_of(c.m)) * c.n.div_ceil(nc)).sum()
    };
    while nc_panels > 1 && count(nc_panels * K::NR) < CHAIN_TASKS_PER_THREAD * threads {
        nc_panels /= 2;
    }
    let nc = nc_panels * K::NR;
    let plans: Vec<(Vec<(usize, usize)>, bool)> =
        chains.iter_mut().map(|c| (std::mem::take(&mut c.tiles), c.first)).collect();
    let mut tasks: Vec<(usize, Task)> = Vec::new();
    for (c, chain) in chains.iter_mut().enumerate() {
        let (m, n) = (chain.m, chain.n);
        if m == 0 || n == 0 {
            continue;
        }
        let mc = mc_of(m);
        let col_blocks = n.div_ceil(nc);
        if chain.rows.len() != m || chain.rows.iter().any(|r| r.len() != n) {
            return Err(Error::shape("out", format!("a chain's output is not {m} rows of {n}")));
        }
        for (rb, block) in chain.rows.chunks_mut(mc).enumerate() {
            let cap = block.len();
            let cols = column_segments(block.iter_mut().map(std::mem::take), nc, col_blocks, cap);
            for (cb, rows) in cols.into_iter().enumerate() {
                tasks.push((c, Task { row0: rb * mc, col0: cb * nc, rows }));
            }
        }
    }
    tasks.par_iter_mut().try_for_each(|(c, task)| {
        // Worker threads have their own floating-point environment: check each.
        if !fp_env_is_ieee() {
            return Err(fp_env_error());
        }
        let (tiles, first) = &plans[*c];
        for (t, &(ia, ib)) in tiles.iter().enumerate() {
            cancel.check()?;
            let kc = a_ops[ia].k;
            let ap = &apack[a_off[ia]..][..a_lens[ia]];
            let bp = &bpack[b_off[ib]..][..b_lens[ib]];
            add_tile(kernel, kc, ap, bp, *first && t == 0, t + 1 == tiles.len(), task);
        }
        Ok(())
    })?;
    Ok(true)
}

/// One task: an output block of whole rows' column segments.
struct Task<'o> {
    /// First row of the block in the output.
    row0: usize,
    /// First column of the block in the output.
    col0: usize,
    /// The block's row segments, all of the same width.
    rows: Vec<&'o mut [f32]>,
}

/// A float32 buffer whose data starts on a 64-byte boundary (one cache line, one zmm load).
#[derive(Default)]
pub(crate) struct Aligned {
    /// The allocation: `LANES` floats more than the longest slice it serves, so that the data
    /// can start on a 64-byte boundary within the first `LANES`.
    buf: Vec<f32>,
    /// Where the data starts in `buf` (fixed: the allocation never moves).
    offset: usize,
    /// The length of the slice handed out.
    len: usize,
}

impl Aligned {
    const LANES: usize = 16;

    /// `len` zeros (a `CapacityError` naming `what` when the host cannot hold them).
    pub(crate) fn new(len: usize, what: &str) -> Result<Aligned> {
        let total = len.saturating_add(Self::LANES);
        let buf: Vec<f32> = crate::host::zeroed_vec("a, b", what, total)?;
        let offset = buf.as_ptr().align_offset(64).min(Self::LANES);
        Ok(Aligned { buf, offset, len })
    }

    /// The longest slice this allocation can serve from its aligned start.
    fn room(&self) -> usize {
        self.buf.len().saturating_sub(self.offset)
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        &mut self.buf[self.offset..self.offset + self.len]
    }
}

/// Packing buffers a thread keeps for its next GEMM call: a chain of `nc_matmul`s settles as
/// one driver call of a few MiB of packed panels, and an NKI kernel settles hundreds of them;
/// zeroing fresh buffers (and faulting their pages in) for each cost more than a tenth of the
/// arithmetic. At most [`SPARES`] per thread, each of at most [`SPARE_MAX_FLOATS`].
const SPARES: usize = 2;
/// The largest packing buffer kept for reuse, in floats (8 MiB).
const SPARE_MAX_FLOATS: usize = 2 << 20;

thread_local! {
    static SPARE: RefCell<Vec<Aligned>> = const { RefCell::new(Vec::new()) };
}

/// A packing buffer of `len` floats, 64-byte aligned, of **unspecified contents** (what an
/// earlier call packed into it): the packers write every element a kernel reads, padding
/// included. Taken from the calling thread's spares when one is long enough (a call that runs
/// while another waits on the same thread, as rayon's work stealing allows, finds the spares
/// already taken and allocates its own), otherwise new (through the host check); given back to
/// the thread's spares when dropped.
pub(crate) struct PackBuf(Aligned);

impl PackBuf {
    pub(crate) fn take(len: usize, what: &str) -> Result<PackBuf> {
        let spare = SPARE
            .try_with(|spares| {
                let mut spares = spares.try_borrow_mut().ok()?;
                // The shortest spare that is long enough.
                let (i, _) = spares
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.room() >= len)
                    .min_by_key(|(_, b)| b.room())?;
                Some(spares.swap_remove(i))
            })
            .ok()
            .flatten();
        let buf = match spare {
            Some(mut buf) => {
                buf.len = len;
                buf
            }
            None => Aligned::new(len, what)?,
        };
        Ok(PackBuf(buf))
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        self.0.as_mut_slice()
    }
}

impl Drop for PackBuf {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if buf.room() == 0 || buf.room() > SPARE_MAX_FLOATS {
            return;
        }
        // During the thread's exit the spares may be gone: the buffer is then simply freed.
        let _ = SPARE.try_with(|spares| {
            let Ok(mut spares) = spares.try_borrow_mut() else {
                return;
            };
            if spares.len() < SPARES {
                spares.push(buf);
            } else if let Some(short) = spares.iter_mut().min_by_key(|b| b.room()) {
                // Keep the longer buffers: they serve more calls.
                if short.room() < buf.room() {
                    *short = buf;
                }
            }
        });
    }
}

/// Output `rows` cut into `ranges` column ranges of `nc`: element `c` holds range `c` of every
/// row (room for `cap` rows).
pub(super) fn column_segments<'o>(
    rows: impl IntoIterator<Item = &'o mut [f32]>, nc: usize, ranges: usize, cap: usize,
) -> Vec<Vec<&'o mut [f32]>> {
    let mut cols: Vec<Vec<&mut [f32]>> = (0..ranges).map(|_| Vec::with_capacity(cap)).collect();
    for row in rows {
        let mut rest = row;
        for segs in cols.iter_mut() {
            let (seg, tail) = rest.split_at_mut(nc.min(rest.len()));
            segs.push(seg);
            rest = tail;
        }
    }
    cols
}

#[allow(clippy::too_many_arguments)]
fn drive<K: MicroKernel>(
    kernel: K, tiles: &[KTile], m: usize, n: usize, first: bool, rows: Vec<&mut [f32]>,
    one_pass_floats: usize, in_runs: bool, seq: bool,
) -> Result<()> {
    let threads = rayon::current_num_threads().max(1);
    // Blocks: MC x NC by default; narrower column blocks when there would be too few tasks to
    // keep every thread busy (the blocking never changes a bit).
    let mc = (MC_PANELS * K::MR).min(m.div_ceil(K::MR) * K::MR);
    let row_blocks = m.div_ceil(mc);
    let mut nc_panels = NC_PANELS;
    while nc_panels > 1 && row_blocks * n.div_ceil(nc_panels * K::NR) < 2 * threads {
        nc_panels /= 2;
    }
    let nc = nc_panels * K::NR;
    let col_blocks = n.div_ceil(nc);

    let mut tasks = Vec::with_capacity(row_blocks * col_blocks);
    let mut rows = rows.into_iter();
    for rb in 0..row_blocks {
        let cols = column_segments(rows.by_ref().take(mc), nc, col_blocks, mc);
        for (cb, rows) in cols.into_iter().enumerate() {
            tasks.push(Task { row0: rb * mc, col0: cb * nc, rows });
        }
    }

    // One K tile at a time: pack the tile's A rows and B columns once (in parallel), then let
    // every task add the tile into its block. Tiles run one after the other, so each output
    // element takes its tile sums in order no matter which thread computes which block.
    let m_panels = m.div_ceil(K::MR);
    let n_panels = n.div_ceil(K::NR);
    let (a_len, b_len) = (m_panels * K::MR, n_panels * K::NR);
    let cancel = crate::cancel::current();
    let total_k: usize = tiles.iter().map(|t| t.order.len()).sum();
    if tiles.len() > 1 && (a_len + b_len).saturating_mul(total_k) <= one_pass_floats {
        return drive_one_pass(kernel, tiles, m, n, first, &mut tasks, total_k, seq);
    }
    // A tile holds at most its products: a short K must not cost 128 times the operands' memory.
    let kc_max = tiles.iter().map(|t| t.order.len()).max().unwrap_or(0);
    if in_runs && tiles.len() > 1 && (a_len + b_len).saturating_mul(2 * kc_max) <= one_pass_floats {
        // A long chain (a K of 8192 in 128-row tiles): runs of consecutive tiles, each as many
        // as one pass holds, one after the other. Each run adds its tiles in order onto what
        // the runs before left, so the bits are those of the tile-by-tile loop (NaNs are made
        // canonical at the end either way).
        let mut start = 0;
        while start < tiles.len() {
            let (mut end, mut k) = (start, 0);
            while end < tiles.len()
                && (a_len + b_len).saturating_mul(k + tiles[end].order.len()) <= one_pass_floats
            {
                k += tiles[end].order.len();
                end += 1;
            }
            let run = &tiles[start..end];
            drive_one_pass(kernel, run, m, n, first && start == 0, &mut tasks, k, seq)?;
            start = end;
        }
        return Ok(());
    }
    let mut apack = PackBuf::take(m_panels * K::MR * kc_max, "the packed tile of a")?;
    let mut bpack = PackBuf::take(n_panels * K::NR * kc_max, "the packed tile of b")?;
    let (apack, bpack) = (apack.as_mut_slice(), bpack.as_mut_slice());
    // Ctrl-C (crate::cancel): checked between K tiles and by every output block of a tile.
    for (t, tile) in tiles.iter().enumerate() {
        cancel.check()?;
        let (a, b, k0, order) = (tile.a, tile.b, tile.k0, tile.order);
        let a_t = tile.a_t;
        let kc = order.len();
        let (apack, bpack) =
            (&mut apack[..m_panels * K::MR * kc], &mut bpack[..n_panels * K::NR * kc]);
        if seq {
            // The same packing and adds, on this thread ([`SEQUENTIAL_MACS`]), both shared
            // with the duo helper ([`pack_tile_shared`], [`each_task`]).
            pack_tile_shared::<K>(tile, m, n, apack, bpack, m * n * kc);
            let (ap, bp, f) = (&*apack, &*bpack, first && t == 0);
            let last = t + 1 == tiles.len();
            each_task(&mut tasks, m * n * kc, |task| {
                add_tile(kernel, kc, ap, bp, f, last, task);
                Ok(())
            })?;
            continue;
        }
        if a_t {
            // Panels of the transposed a are packed as b's are, a few at a time.
            let group = (RUN / K::MR).max(1);
            apack
                .par_chunks_mut(group * K::MR * kc)
                .enumerate()
                .for_each_init(Scratch::new, |s, (g, panels)| {
                    pack_cols(a, m, K::MR, g * group, k0, order, panels, s)
                });
        } else {
            apack
                .par_chunks_mut(K::MR * kc)
                .with_min_len(PACK_MIN_PANELS)
                .enumerate()
                .for_each_init(Scratch::new, |s, (ip, panel)| {
                    pack_a::<K>(a, m, ip, k0, order, panel, s)
                });
        }
        // Panels of b are packed a few at a time, so one run of a row of b fills several.
        let group = (RUN / K::NR).max(1);
        bpack
            .par_chunks_mut(group * K::NR * kc)
            .enumerate()
            .for_each_init(Scratch::new, |s, (g, panels)| {
                pack_cols(b, n, K::NR, g * group, k0, order, panels, s)
            });
        let (apack, bpack) = (&*apack, &*bpack);
        tasks.par_iter_mut().try_for_each(|task| {
            cancel.check()?;
            // Worker threads have their own floating-point environment: check each.
            if !fp_env_is_ieee() {
                return Err(fp_env_error());
            }
            add_tile(kernel, kc, apack, bpack, first && t == 0, t + 1 == tiles.len(), task);
            Ok(())
        })?;
    }
    Ok(())
}

/// Packed operands of all K tiles at once up to this many floats (16 MiB): then the driver
/// packs every tile in one parallel pass and adds all of them in a second (two fork-joins in
/// all instead of three per tile: a chain of `nc_matmul`s of 128 x 128 x 512 is mostly joins
/// otherwise). Host blocking only: the bits are those of the tile-by-tile loop.
const ONE_PASS_FLOATS: usize = 4 << 20;

/// [`drive`] for K tiles whose packed operands all fit in [`ONE_PASS_FLOATS`]: every tile's
/// panels packed in parallel (one job per tile), then every output block adds the tiles in
/// order (and canonicalises its NaN).
#[allow(clippy::too_many_arguments)]
fn drive_one_pass<K: MicroKernel>(
    kernel: K, tiles: &[KTile], m: usize, n: usize, first: bool, tasks: &mut [Task],
    total_k: usize, seq: bool,
) -> Result<()> {
    let (a_len, b_len) = (m.div_ceil(K::MR) * K::MR, n.div_ceil(K::NR) * K::NR);
    let cancel = crate::cancel::current();
    let mut apack = PackBuf::take(a_len * total_k, "the packed tiles of a")?;
    let mut bpack = PackBuf::take(b_len * total_k, "the packed tiles of b")?;
    // Each tile's share of both buffers.
    let mut jobs: Vec<(&KTile, &mut [f32], &mut [f32])> = Vec::with_capacity(tiles.len());
    let (mut ar, mut br) = (apack.as_mut_slice(), bpack.as_mut_slice());
    for tile in tiles {
        let kc = tile.order.len();
        let (ap, arest) = std::mem::take(&mut ar).split_at_mut(a_len * kc);
        let (bp, brest) = std::mem::take(&mut br).split_at_mut(b_len * kc);
        jobs.push((tile, ap, bp));
        (ar, br) = (arest, brest);
    }
    let pack = |s: &mut Scratch, (tile, ap, bp): &mut (&KTile, &mut [f32], &mut [f32])| {
        cancel.check()?;
        pack_tile::<K>(tile, m, n, ap, bp, s);
        Ok::<(), Error>(())
    };
    if seq {
        let s = &mut Scratch::new();
        jobs.iter_mut().try_for_each(|job| pack(s, job))?;
    } else {
        jobs.par_iter_mut().try_for_each_init(Scratch::new, |s, job| pack(s, job))?;
    }
    let packed: Vec<(usize, &[f32], &[f32])> =
        jobs.iter().map(|(tile, ap, bp)| (tile.order.len(), &**ap, &**bp)).collect();
    let add = |task: &mut Task| {
        // Worker threads have their own floating-point environment: check each.
        if !fp_env_is_ieee() {
            return Err(fp_env_error());
        }
        for (t, &(kc, ap, bp)) in packed.iter().enumerate() {
            cancel.check()?;
            add_tile(kernel, kc, ap, bp, first && t == 0, t + 1 == packed.len(), task);
        }
        Ok(())
    };
    if seq {
        each_task(tasks, m * n * total_k, add)
    } else {
        tasks.par_iter_mut().try_for_each(add)
    }
}

/// Multiply-adds from which a product run on the calling thread ([`SEQUENTIAL_MACS`]) shares
/// its output blocks with the duo helper ([`super::duo`]): a quarter of one 128 x 128 x 512
/// `nc_matmul`, some 40 us of adds, against about a microsecond to hand half of them over.
const DUO_MACS: usize = 1 << 21;

/// `f` on every task (output block): on this thread, or, for a product of at least
/// [`DUO_MACS`] multiply-adds on a host with two or more cores, shared with the duo helper
/// ([`halves`]). Each block is computed whole by one thread, so the bits do not depend on the
/// split.
fn each_task<'o, F>(tasks: &mut [Task<'o>], macs: usize, f: F) -> Result<()>
where
    F: Fn(&mut Task<'o>) -> Result<()> + Sync,
{
    if macs < DUO_MACS || tasks.len() < 2 || rayon::current_num_threads() < 2 {
        return tasks.iter_mut().try_for_each(&f);
    }
    let (left, right) = halves(tasks);
    let (mut l, mut r) = (Ok(()), Ok(()));
    super::duo::join(
        || l = left.iter_mut().try_for_each(&f),
        || r = right.iter_mut().try_for_each(&f),
    );
    l.and(r)
}

/// The tasks in two halves of about equal work (elements), both non-empty when there are two
/// or more: by column, then row (a 128-row product is blocks of 96 and 32 rows, so halves by
/// count would not be even), cut where the first half reaches half of the elements.
fn halves<'t, 'o>(tasks: &'t mut [Task<'o>]) -> (&'t mut [Task<'o>], &'t mut [Task<'o>]) {
    tasks.sort_unstable_by_key(|t| (t.col0, t.row0));
    let size = |t: &Task| t.rows.len() * t.rows.first().map_or(0, |r| r.len());
    let total: usize = tasks.iter().map(size).sum();
    let (mut cut, mut sum) = (1, tasks.first().map_or(0, size));
    while cut + 1 < tasks.len() && 2 * (sum + size(&tasks[cut])) <= total {
        sum += size(&tasks[cut]);
        cut += 1;
    }
    tasks.split_at_mut(cut.min(tasks.len()))
}

/// Packs K tile `tile` of an `m x n` product on this thread: `a`'s rows into `ap` and `b`'s
/// columns into `bp` (panels of the kernel's widths, `tile.order.len()` products deep).
fn pack_tile<K: MicroKernel>(
    tile: &KTile, m: usize, n: usize, ap: &mut [f32], bp: &mut [f32], s: &mut Scratch,
) {
    pack_tile_a::<K>(tile, m, ap, s);
    pack_tile_b::<K>(tile, n, 0, bp, s);
}

/// [`pack_tile`] for a product of `macs` multiply-adds run on the calling thread: from
/// [`DUO_MACS`] on, with two or more of `b`'s panels, the duo helper packs `b`'s last panels
/// meanwhile, about half of the columns packed in all (`a`'s rows count as columns). Where a
/// panel is packed does not change it.
fn pack_tile_shared<K: MicroKernel>(
    tile: &KTile, m: usize, n: usize, ap: &mut [f32], bp: &mut [f32], macs: usize,
) {
    let panel = K::NR * tile.order.len();
    let n_panels = bp.len().checked_div(panel).unwrap_or(0);
    if macs < DUO_MACS || n_panels < 2 || rayon::current_num_threads() < 2 {
        return pack_tile::<K>(tile, m, n, ap, bp, &mut Scratch::new());
    }
    let columns = m.div_ceil(K::MR) * K::MR + n_panels * K::NR;
    let theirs = (columns / 2 / K::NR).clamp(1, n_panels - 1);
    let ours = n_panels - theirs;
    let (mine, helper) = bp.split_at_mut(ours * panel);
    super::duo::join(
        || {
            let s = &mut Scratch::new();
            pack_tile_a::<K>(tile, m, ap, s);
            pack_tile_b::<K>(tile, n, 0, mine, s);
        },
        || pack_tile_b::<K>(tile, n, ours, helper, &mut Scratch::new()),
    );
}

/// `a`'s part of [`pack_tile`].
fn pack_tile_a<K: MicroKernel>(tile: &KTile, m: usize, ap: &mut [f32], s: &mut Scratch) {
    let (k0, order) = (tile.k0, tile.order);
    let kc = order.len();
    if tile.a_t {
        let group = (RUN / K::MR).max(1);
        for (g, panels) in ap.chunks_mut(group * K::MR * kc).enumerate() {
            pack_cols(tile.a, m, K::MR, g * group, k0, order, panels, s);
        }
    } else {
        for (ip, panel) in ap.chunks_mut(K::MR * kc).enumerate() {
            pack_a::<K>(tile.a, m, ip, k0, order, panel, s);
        }
    }
}

/// `b`'s part of [`pack_tile`], from panel `jp0` on: `bp` holds whole panels.
fn pack_tile_b<K: MicroKernel>(
    tile: &KTile, n: usize, jp0: usize, bp: &mut [f32], s: &mut Scratch,
) {
    let (k0, order) = (tile.k0, tile.order);
    let kc = order.len();
    let group = (RUN / K::NR).max(1);
    for (g, panels) in bp.chunks_mut(group * K::NR * kc).enumerate() {
        pack_cols(tile.b, n, K::NR, jp0 + g * group, k0, order, panels, s);
    }
}

/// Adds one K tile of `kc` products into a task's block (writes it, for the `first` tile), from
/// the tile's packed panels of all of `a`'s rows and all of `b`'s columns; the `last` tile
/// stores every NaN as the canonical NaN (a NaN made canonical earlier stays a NaN, so the
/// block's final bits are those of a pass over it after its last tile).
fn add_tile<K: MicroKernel>(
    kernel: K, kc: usize, apack: &[f32], bpack: &[f32], first: bool, last: bool, task: &mut Task,
) {
    let width = task.rows.first().map_or(0, |r| r.len());
    // Blocks start on panel boundaries (MC and NC are multiples of MR and NR).
    let (ip0, jp0) = (task.row0 / K::MR, task.col0 / K::NR);
    for (ip, rows) in task.rows.chunks_mut(K::MR).enumerate() {
        let ap = &apack[(ip0 + ip) * K::MR * kc..][..K::MR * kc];
        for jp in 0..width.div_ceil(K::NR) {
            let c0 = jp * K::NR;
            let cols = K::NR.min(width - c0);
            let bp = &bpack[(jp0 + jp) * K::NR * kc..][..K::NR * kc];
            let mut c = [std::ptr::null_mut(); MAX_MR];
            for (p, row) in c.iter_mut().zip(rows.iter_mut()) {
                *p = row[c0..].as_mut_ptr();
            }
            // SAFETY: `ap` and `bp` hold exactly `kc * MR` and `kc * NR` elements; each
            // non-null `c[i]` points into a distinct row segment with `cols` elements from
            // `c0`; the output never aliases the packed panels.
            unsafe { kernel.run(kc, ap.as_ptr(), bp.as_ptr(), &c, cols, first, last) };
        }
    }
}

/// Packs micro-panel `ip` of `a` (rows `ip * MR..`, of `m`), products `k0 + order[..]`, k-major;
/// rows past `m` are zero (computed, never stored). `order` is a permutation of the tile's
/// `order.len() <= RUN` offsets.
fn pack_a<K: MicroKernel>(
    a: &Reader, m: usize, ip: usize, k0: usize, order: &[usize], panel: &mut [f32], s: &mut Scratch,
) {
    let in_order = order.iter().enumerate().all(|(p, &o)| p == o);
    let mut vals = [0f32; RUN];
    let vals = &mut vals[..order.len()];
    // The next micro-panels' rows are asked for meanwhile: a row-major `a` gives each panel
    // row as a run of the K tile's 128 products, 256 B of bf16 with the rows a whole row of
    // `a` apart (as `pack_cols` does, see `PREFETCH_ROWS`).
    for r in (ip + 1) * K::MR..((ip + 1 + PREFETCH_PANELS) * K::MR).min(m) {
        a.prefetch_run(r, k0, order.len());
    }
    for i in 0..K::MR {
        let r = ip * K::MR + i;
        let dst = panel.iter_mut().skip(i).step_by(K::MR);
        if r >= m {
            dst.for_each(|d| *d = 0.0);
            continue;
        }
        a.row_run(r, k0, vals, s);
        if in_order {
            dst.zip(vals.iter()).for_each(|(d, &v)| *d = v);
        } else {
            dst.zip(order).for_each(|(d, &o)| *d = vals[o]);
        }
    }
}

/// Packs the `w`-column micro-panels of `b` (`[k, n]`, read by rows: `b` itself, or the
/// transposed `a`) from `jp0` on into `panels` (whole panels of `w * order.len()` each),
/// products `k0 + order[..]`, k-major; columns past `n` are zero. The panels cover at most
/// `RUN` columns.
#[allow(clippy::too_many_arguments)]
fn pack_cols(
    b: &Reader, n: usize, w: usize, jp0: usize, k0: usize, order: &[usize], panels: &mut [f32],
    s: &mut Scratch,
) {
    // The kernels' panel widths (MR and NR of each) copy a full panel row as a fixed number of
    // moves: a library call per 6 floats (MR) cost more than the packing it did.
    let args = (b, n, w, jp0, k0, order, panels, s);
    match w {
        4 => pack_cols_with::<4>(args),
        6 => pack_cols_with::<6>(args),
        8 => pack_cols_with::<8>(args),
        16 => pack_cols_with::<16>(args),
        64 => pack_cols_with::<64>(args),
        _ => pack_cols_with::<0>(args),
    }
}

/// [`pack_cols`], a full panel row copied as `W` floats when `W` is not 0 (then `w == W`).
#[inline(always)]
#[allow(clippy::type_complexity)]
fn pack_cols_with<const W: usize>(
    (b, n, w, jp0, k0, order, panels, s): (
        &Reader,
        usize,
        usize,
        usize,
        usize,
        &[usize],
        &mut [f32],
        &mut Scratch,
    ),
) {
    let kc = order.len();
    let c0 = jp0 * w;
    let width = (panels.len() / kc).min(n - c0);
    let mut buf = [0f32; RUN];
    let buf = &mut buf[..width];
    // The rows `PREFETCH_ROWS` ahead are asked for while this one is packed: an operand tile
    // in SBUF has its rows on partitions some 232 KiB apart, each only 256 B (a 128-column
    // bf16 stationary) to 1 KiB long, too short for the CPU's own prefetchers to follow, so
    // without the hint each row waits for memory in turn (docs/nki.md, Speed).
    for &o in order.iter().take(PREFETCH_ROWS) {
        b.prefetch_run(k0 + o, c0, width);
    }
    for (p, &o) in order.iter().enumerate() {
        if let Some(&ahead) = order.get(p + PREFETCH_ROWS) {
            b.prefetch_run(k0 + ahead, c0, width);
        }
        // Float32 as stored is read where it lies, not copied out first.
        let vals: &[f32] = match b.row_f32(k0 + o, c0, width) {
            Some(run) => run,
            None => {
                b.row_run(k0 + o, c0, buf, s);
                &*buf
            }
        };
        for (q, panel) in panels.chunks_exact_mut(w * kc).enumerate() {
            let dst = &mut panel[p * w..][..w];
            let src = vals.get(q * w..).unwrap_or(&[]);
            if W != 0 {
                if let (Some(d), Some(v)) = (dst.first_chunk_mut::<W>(), src.first_chunk::<W>()) {
                    *d = *v;
                    continue;
                }
            }
            let cols = w.min(src.len());
            dst[..cols].copy_from_slice(&src[..cols]);
            dst[cols..].fill(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::mix64;

    fn values(seed: u64, len: usize) -> Vec<f32> {
        // Every bf16 bit pattern, so huge, tiny, subnormal, Inf and NaN inputs all occur.
        (0..len).map(|i| f32::from_bits((mix64(seed ^ (i as u64) << 20) as u32) << 16)).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn with_kernel<K: MicroKernel>(
        kernel: K, a: &[f32], b: &[f32], dims: (usize, usize, usize), mode: PerfMode,
    ) -> Vec<u32> {
        let (m, k, n) = dims;
        let a = f32_reader("a", a, [m, k]).expect("valid");
        let b = f32_reader("b", b, [k, n]).expect("valid");
        let mut out = vec![0f32; m * n];
        let tiling = Tiling::gemm(mode);
        let orders = [tiling.order(tiling.tile), tiling.order(k % tiling.tile)];
        let tiles = k_tiles(&a, &b, k, tiling, &orders);
        let rows = out.chunks_mut(n).collect();
        drive(kernel, &tiles, m, n, true, rows, ONE_PASS_FLOATS, false, false).expect("valid");
        // Tile by tile (no one-pass packing), and both on this thread alone: the same bits.
        for (limit, seq, how) in [
            (0, false, "tile by tile"),
            (ONE_PASS_FLOATS, true, "one pass on one thread"),
            (0, true, "tile by tile on one thread"),
        ] {
            let mut other = vec![0f32; m * n];
            let rows = other.chunks_mut(n).collect();
            drive(kernel, &tiles, m, n, true, rows, limit, false, seq).expect("valid");
            assert_eq!(bits(&other), bits(&out), "{m}x{k}x{n} one pass vs {how}");
        }
        bits(&out)
    }

    /// The duo's halves hold every task once, the first half the blocks up to half of the
    /// elements (by column, then row): 96- and 32-row blocks of two column blocks split two
    /// and two, not three and one.
    #[test]
    fn halves_split_the_tasks_by_work() {
        let mut buf = vec![0f32; 8 * 128 * 256];
        let mut chunks = buf.chunks_mut(256);
        let mut block = |row0, col0, rows: usize| Task {
            row0,
            col0,
            rows: (0..rows).map(|_| chunks.next().expect("rows")).collect(),
        };
        let mut tasks =
            vec![block(0, 0, 96), block(96, 0, 32), block(0, 256, 96), block(96, 256, 32)];
        tasks.reverse();
        let (l, r) = halves(&mut tasks);
        let key = |t: &Task| (t.row0, t.col0, t.rows.len());
        assert_eq!(l.iter().map(key).collect::<Vec<_>>(), [(0, 0, 96), (96, 0, 32)]);
        assert_eq!(r.iter().map(key).collect::<Vec<_>>(), [(0, 256, 96), (96, 256, 32)]);
        // One big block and small ones: the big one alone, the rest on the other side.
        let mut tasks = vec![block(0, 0, 96), block(0, 1, 8), block(0, 2, 8)];
        let (l, r) = halves(&mut tasks);
        assert_eq!((l.len(), r.len()), (1, 2));
        let mut two = vec![block(0, 0, 1), block(0, 1, 200)];
        let (l, r) = halves(&mut two);
        assert_eq!((l.len(), r.len()), (1, 1));
    }

    #[test]
    fn every_kernel_gives_the_same_bits() {
        // The last two shapes are over DUO_MACS: their drives on one thread share the adds
        // with the duo helper (on a host of two or more cores). (128, 300, 512) is over
        // SEQUENTIAL_MACS into an output of at most DUO_OUTPUT_FLOATS: `gemm_f32` runs it tile
        // by tile on the duo.
        let shapes = [
            (1, 1, 1),
            (13, 300, 70),
            (7, 513, 129),
            (100, 130, 17),
            (130, 160, 129),
            (128, 300, 512),
        ];
        for (m, k, n) in shapes {
            let a = values(1, m * k);
            let b = values(2, k * n);
            for mode in PerfMode::ALL {
                let portable = with_kernel(Portable, &a, &b, (m, k, n), mode);
                #[cfg(target_arch = "x86_64")]
                {
                    if let Some(kernel) = crate::engine::kernel::Avx2::detect() {
                        assert_eq!(with_kernel(kernel, &a, &b, (m, k, n), mode), portable);
                    }
                    if let Some(kernel) = crate::engine::kernel::Avx512::detect() {
                        assert_eq!(with_kernel(kernel, &a, &b, (m, k, n), mode), portable);
                    }
                }
                let public = gemm_f32(&a, &b, m, k, n, mode).expect("valid");
                assert_eq!(bits(&public), portable, "{m}x{k}x{n} {mode:?}");
            }
        }
    }

    #[test]
    fn a_transposed_and_chained_tiles_give_the_same_bits() {
        // The machine's chains: K tiles of different lengths, each from its own operands, `a`
        // given as [K, M]; against one GEMM over the concatenated K with tiles of those lengths.
        for (m, n, ks) in [(13, 70, vec![128, 64, 5]), (128, 512, vec![128, 128]), (1, 1, vec![1])]
        {
            let k: usize = ks.iter().sum();
            let a = values(3, m * k);
            let b = values(4, k * n);
            let mut want = vec![0f32; m * n];
            let ra = f32_reader("a", &a, [m, k]).expect("valid");
            let rb = f32_reader("b", &b, [k, n]).expect("valid");
            let orders: Vec<Vec<usize>> = ks.iter().map(|&kc| (0..kc).collect()).collect();
            let starts: Vec<usize> = ks
                .iter()
                .scan(0, |s, &kc| {
                    *s += kc;
                    Some(*s - kc)
                })
                .collect();
            let whole: Vec<KTile> = starts
                .iter()
                .zip(&orders)
                .map(|(&k0, o)| KTile { a: &ra, b: &rb, k0, order: o, a_t: false })
                .collect();
            run_tiles(&whole, m, n, true, &mut want).expect("whole");
            // Per tile: a^T [kc, m] and b [kc, n] of its own.
            let parts: Vec<(Vec<f32>, Vec<f32>)> = starts
                .iter()
                .zip(&ks)
                .map(|(&k0, &kc)| {
                    let at = (0..kc * m).map(|e| a[(e % m) * k + k0 + e / m]).collect();
                    (at, b[k0 * n..(k0 + kc) * n].to_vec())
                })
                .collect();
            let readers: Vec<(Reader, Reader)> = parts
                .iter()
                .zip(&ks)
                .map(|((at, bb), &kc)| {
                    (
                        f32_reader("a", at, [kc, m]).expect("valid"),
                        f32_reader("b", bb, [kc, n]).expect("valid"),
                    )
                })
                .collect();
            let tiles: Vec<KTile> = readers
                .iter()
                .zip(&orders)
                .map(|((x, y), o)| KTile { a: x, b: y, k0: 0, order: o, a_t: true })
                .collect();
            let mut got = vec![0f32; m * n];
            run_tiles(&tiles, m, n, true, &mut got).expect("chained");
            assert_eq!(bits(&got), bits(&want), "{m}x{ks:?}x{n}");
            // first = false adds onto what `out` holds.
            let mut twice = want.clone();
            run_tiles(&tiles, m, n, false, &mut twice).expect("accumulated");
            let mut again = want.clone();
            run_tiles(&whole, m, n, false, &mut again).expect("accumulated whole");
            assert_eq!(bits(&twice), bits(&again));
        }
    }

    /// This thread's spare packing buffers, as (address, room).
    fn spares() -> Vec<(usize, usize)> {
        SPARE.with(|s| s.borrow().iter().map(|b| (b.buf.as_ptr() as usize, b.room())).collect())
    }

    /// Fills every float of this thread's spare packing buffers with garbage: NaN, Inf,
    /// subnormals, huge values.
    fn poison_spares() {
        SPARE.with(|s| {
            for (i, b) in s.borrow_mut().iter_mut().enumerate() {
                let junk = values(77 + i as u64, b.buf.len());
                b.buf.copy_from_slice(&junk);
            }
        });
    }

    /// One GEMM through `drive` as a chain of K tiles (`a_t`: `a` given transposed, as the
    /// machine's chains give it), written into an output that starts as garbage.
    fn chain_bits<K: MicroKernel>(
        kernel: K, a: &[f32], b: &[f32], dims: (usize, usize, usize), mode: PerfMode, a_t: bool,
        one_pass_floats: usize,
    ) -> Vec<u32> {
        let (m, k, n) = dims;
        let at: Vec<f32> = (0..k * m).map(|e| a[(e % m) * k + e / m]).collect();
        let ra = if a_t { f32_reader("a", &at, [k, m]) } else { f32_reader("a", a, [m, k]) }
            .expect("valid");
        let rb = f32_reader("b", b, [k, n]).expect("valid");
        let tiling = Tiling::gemm(mode);
        let orders = [tiling.order(tiling.tile), tiling.order(k % tiling.tile)];
        let mut tiles = k_tiles(&ra, &rb, k, tiling, &orders);
        for t in tiles.iter_mut() {
            t.a_t = a_t;
        }
        let mut out = values(99, m * n);
        let rows = out.chunks_mut(n).collect();
        drive(kernel, &tiles, m, n, true, rows, one_pass_floats, true, false).expect("valid");
        bits(&out)
    }

    /// Reused packing buffers hold what an earlier call left; every bit must come out as from
    /// fresh (zeroed) ones.
    fn dirty_spares_give_the_same_bits_with<K: MicroKernel + Send + 'static>(kernel: K) {
        // m and n are multiples of no kernel's MR (4, 6) or NR (8, 16, 64): the panels carry
        // padding rows and columns; k has a tail tile.
        let shapes = [(13, 300, 70), (7, 130, 129), (1, 5, 1)];
        for (m, k, n) in shapes {
            let a = values(5, m * k);
            let b = values(6, k * n);
            for mode in PerfMode::ALL {
                for a_t in [false, true] {
                    for one_pass in [ONE_PASS_FLOATS, 0] {
                        let case = format!("{m}x{k}x{n} {mode:?} a_t={a_t} one_pass={one_pass}");
                        // A fresh thread starts with no spares: zeroed buffers.
                        let fresh = {
                            let (a, b) = (a.clone(), b.clone());
                            std::thread::spawn(move || {
                                assert!(spares().is_empty());
                                chain_bits(kernel, &a, &b, (m, k, n), mode, a_t, one_pass)
                            })
                            .join()
                            .expect("fresh thread")
                        };
                        // Here: a larger GEMM of other operands leaves its panels in this
                        // thread's spares, then garbage overwrites every float of them.
                        let (bm, bk, bn) = (40, 520, 150);
                        let big_a = values(7, bm * bk);
                        let big_b = values(8, bk * bn);
                        chain_bits(kernel, &big_a, &big_b, (bm, bk, bn), mode, a_t, one_pass);
                        for _ in 0..2 {
                            poison_spares();
                            let before = spares();
                            assert_eq!(before.len(), SPARES, "{case}");
                            let got = chain_bits(kernel, &a, &b, (m, k, n), mode, a_t, one_pass);
                            assert_eq!(got, fresh, "{case}: reused buffers changed bits");
                            // The call took the dirty buffers and gave them back.
                            let mut after = spares();
                            let mut before = before;
                            after.sort_unstable();
                            before.sort_unstable();
                            assert_eq!(after, before, "{case}: spares not reused");
                        }
                    }
                }
            }
        }
    }

    /// A chain too long for one pass runs in runs of tiles, each one pass: the same bits as
    /// the tile-by-tile loop and as one pass over all of it, NaN, infinities and a tail tile
    /// included.
    #[test]
    fn a_chain_in_runs_of_one_pass_gives_the_tile_by_tile_bits() {
        let (m, k, n) = (20, 1000, 70);
        let mut a = values(11, m * k);
        let b = values(12, k * n);
        (a[3], a[500], a[k + 7]) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY);
        let kernel = Portable;
        let (ap, bp) =
            (m.div_ceil(Portable::MR) * Portable::MR, n.div_ceil(Portable::NR) * Portable::NR);
        for a_t in [false, true] {
            let per_tile = chain_bits(kernel, &a, &b, (m, k, n), PerfMode::None, a_t, 0);
            let whole = chain_bits(kernel, &a, &b, (m, k, n), PerfMode::None, a_t, usize::MAX);
            // Two or three 128-row tiles a run (the last run shorter, with the tail tile).
            for run_k in [256, 384] {
                let limit = (ap + bp) * run_k;
                let runs = chain_bits(kernel, &a, &b, (m, k, n), PerfMode::None, a_t, limit);
                assert_eq!(runs, per_tile, "a_t={a_t} runs of {run_k}");
            }
            assert_eq!(whole, per_tile, "a_t={a_t}");
            assert!(per_tile.iter().any(|&x| f32::from_bits(x).is_nan()));
        }
    }

    #[test]
    fn dirty_packing_buffers_give_the_same_bits() {
        dirty_spares_give_the_same_bits_with(Portable);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(kernel) = crate::engine::kernel::Avx2::detect() {
                dirty_spares_give_the_same_bits_with(kernel);
            }
            if let Some(kernel) = crate::engine::kernel::Avx512::detect() {
                dirty_spares_give_the_same_bits_with(kernel);
            }
        }
    }

    #[test]
    fn packing_buffers_are_kept_per_thread_within_limits() {
        std::thread::spawn(|| {
            // Exactly the length asked for, aligned.
            for len in [0, 1, 100, 1000] {
                let mut p = PackBuf::take(len, "x").expect("small");
                let s = p.as_mut_slice();
                assert_eq!(s.len(), len);
                assert_eq!(s.as_ptr() as usize % 64, 0);
            }
            // The longest kept; at most SPARES of them.
            assert_eq!(spares().len(), SPARES);
            assert!(spares().iter().all(|&(_, room)| room >= 100));
            // A shorter request reuses a longer spare and still sees only its own length.
            let addrs: Vec<usize> = spares().iter().map(|s| s.0).collect();
            {
                let mut p = PackBuf::take(10, "x").expect("small");
                assert_eq!(p.as_mut_slice().len(), 10);
                assert_eq!(spares().len(), SPARES - 1);
                // Nested takes (work stealing on this thread) never share a buffer.
                let mut q = PackBuf::take(10, "x").expect("small");
                let mut r = PackBuf::take(10, "x").expect("small");
                assert!(spares().is_empty());
                let (pp, qp, rp) = (
                    p.as_mut_slice().as_ptr(),
                    q.as_mut_slice().as_ptr(),
                    r.as_mut_slice().as_ptr(),
                );
                assert!(pp != qp && qp != rp && pp != rp);
            }
            assert_eq!(spares().len(), SPARES);
            assert!(spares().iter().all(|s| addrs.contains(&s.0)));
            // Beyond the cap: freed, not kept.
            drop(PackBuf::take(SPARE_MAX_FLOATS + 1, "x").expect("fits"));
            assert!(spares().iter().all(|&(_, room)| room <= SPARE_MAX_FLOATS));
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn double_row_order_interleaves_rows() {
        let dr = Tiling::gemm(PerfMode::DoubleRow);
        assert_eq!(dr.order(256)[..6], [0, 128, 1, 129, 2, 130]);
        assert_eq!(dr.order(130), {
            let mut o = vec![0, 128, 1, 129];
            o.extend(2..128);
            o
        });
        assert_eq!(dr.order(5), vec![0, 1, 2, 3, 4]);
        assert_eq!(Tiling::gemm(PerfMode::None).order(4), vec![0, 1, 2, 3]);
    }

    /// Runs `f` with `set` or-ed into this thread's MXCSR, then restores it.
    #[cfg(target_arch = "x86_64")]
    fn with_mxcsr<R>(set: u32, f: impl FnOnce() -> R) -> R {
        use std::arch::asm;
        let mut old = 0u32;
        // SAFETY: stmxcsr stores 4 bytes into `old`.
        unsafe { asm!("stmxcsr [{}]", in(reg) &mut old, options(nostack)) };
        let new = old | set;
        // SAFETY: a valid MXCSR value (only control bits added), restored below.
        unsafe { asm!("ldmxcsr [{}]", in(reg) &new, options(nostack)) };
        let r = f();
        // SAFETY: the value read above.
        unsafe { asm!("ldmxcsr [{}]", in(reg) &old, options(nostack)) };
        r
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn non_ieee_environment_is_an_error() {
        const DAZ: u32 = 1 << 6;
        const ROUND_TOWARD_ZERO: u32 = 3 << 13;
        const FTZ: u32 = 1 << 15;
        for set in [DAZ, ROUND_TOWARD_ZERO, FTZ] {
            let (ieee, result) = with_mxcsr(set, || {
                let ieee = super::super::kernel::fp_env_is_ieee();
                (ieee, gemm_f32(&[1.0], &[1.0], 1, 1, 1, PerfMode::None))
            });
            assert!(!ieee, "MXCSR bits {set:#x} not detected");
            let err = result.expect_err("non-IEEE environment");
            assert!(matches!(err, Error::Value { .. }), "{err}");
            assert!(err.to_string().contains("flush-to-zero"), "{err}");
        }
        assert!(super::super::kernel::fp_env_is_ieee());
    }
}
