//! The GEMM of a sparse stationary operand (an N:M-pruned `a`), skipping the products of `a`'s
//! zeros, with the dense GEMM's bits.
//!
//! # Which bits
//!
//! Exactly those of [`super::gemm_f32_into`] in the normal `perf_mode` (K tiles of 128, each
//! summed from +0.0 in ascending k, written or added to the accumulator with one fp32 rounding),
//! sign of zero included, whenever `b` is finite. Why skipping a product `0 * b[k, j]` changes
//! nothing: with `b` finite that product is a zero, and a fused multiply-add of a zero product
//! returns the partial sum unchanged unless the partial sum is itself a zero (then
//! `-0 + +0 = +0`). Follow the dense partial sum `d` and the skipping one `s` through a tile:
//! both start at +0.0; at every step either `d == s` bit for bit, or `d = +0` and `s = -0`
//! (a non-zero product gives both the same exact sum, hence the same rounding; a skipped zero
//! product can only turn a `-0` of `d` into `+0`). So the two differ only where the skipping sum
//! ends at `-0`, which takes an underflow to a negative zero and is rare; the kernel checks each
//! tile's sums for `-0` and recomputes those lanes densely, over the tile's 128 products. A `b`
//! holding an Inf or NaN (where `0 * Inf` is NaN) takes the dense kernel instead.
//!
//! # How fast
//!
//! `a` becomes per-row, per-K-tile lists of its non-zero elements (k, value), built a K tile of
//! a row at a time through its reader ([`super::operand`]): for an N:M-compressed `a`, from the
//! stored values and their positions, rounded into the engine format there, never from a dense
//! copy. `b` is packed, rounded the same way, into column blocks of 32 (`K x 32`, so a list
//! entry addresses one 128-byte row of the block, and a K tile of a block is 16 KiB, in L1).
//! Tasks are 256 rows by 256 columns; like the dense driver, the K tiles are taken in passes
//! (four tiles, 512 products, per pass), every task adding a pass into its block. Inside a pass an AVX-512 kernel runs four rows in lockstep, two accumulators
//! each (one broadcast, two loads and two FMAs per entry and row), and keeps each row's PSUM
//! sums in registers across the pass's tiles, so an output segment is loaded and stored once per
//! pass. When every element of `b` is a bf16 value (bf16, fp8 or narrower inputs), `b` is packed
//! as bf16 pairs, one 64-byte line per K row of a block, and widened exactly in registers (a
//! shift and a mask): half the loads. For a 4:16 operand that is a quarter of the dense kernel's
//! FMAs.
//! When more than 40% of `a` is non-zero (1:2, 2:4, 4:8) the dense kernel runs: it is faster there.

use rayon::prelude::*;

use super::gemm::{f32_reader, fp_env_error, run as dense_run, Aligned, Tiling};
use super::kernel::fp_env_is_ieee;
use super::operand::check_len;
use super::operand::{Reader, Scratch, RUN};
use super::{PerfMode, CANONICAL_NAN};
use crate::{Error, Result};

/// The contraction of one K tile (normal mode).
const TILE: usize = PerfMode::None.contraction_max();
/// Columns of `b` per block: two 16-lane vectors, so a K tile of the block (16 KiB) stays in L1
/// (host blocking, not a hardware number).
const W: usize = 32;
/// Rows the AVX-512 kernel runs in lockstep (eight accumulator chains hide the FMA latency).
const RB: usize = 4;
/// Rows of `a` per task (host blocking).
const MC: usize = 256;
/// Column blocks per task (host blocking).
const NC_BLOCKS: usize = 8;
/// K tiles per pass over the output: each output segment is loaded and stored once per pass.
const GROUP: usize = 4;
/// Above this fraction of non-zero elements of `a` the dense kernel is used.
const MAX_DENSITY: f64 = 0.4;

/// Which kernel computed a [`gemm_skip_zeros_into`] call (the bits are the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseKernel {
    /// The zero-skipping kernel.
    SkipZeros,
    /// The dense kernel: `b` had an Inf or NaN, `a` was more than 40% non-zero, or the CPU has
    /// no AVX-512.
    Dense,
}

/// Which inner loop [`gemm_skip_zeros_into_with`] uses (tests compare them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The AVX-512 loop, or the dense kernel on a CPU without AVX-512.
    Best,
    /// Plain Rust (`f32::mul_add`), on any CPU.
    Portable,
}

/// `a @ b` in the normal `perf_mode`, bit for bit [`super::gemm_f32_into`]'s result, skipping the
/// products of `a`'s zeros when that is faster (see the module doc). `a` `[M, K]`, `b` `[K, N]`
/// and `out` `[M, N]` are row-major float32. Returns the kernel that ran.
pub fn gemm_skip_zeros_into(
    a: &[f32], b: &[f32], m: usize, k: usize, n: usize, out: &mut [f32],
) -> Result<SparseKernel> {
    gemm_skip_zeros_into_with(a, b, m, k, n, out, Isa::Best)
}

/// [`gemm_skip_zeros_into`] with a choice of inner loop.
pub fn gemm_skip_zeros_into_with(
    a: &[f32], b: &[f32], m: usize, k: usize, n: usize, out: &mut [f32], isa: Isa,
) -> Result<SparseKernel> {
    let a = f32_reader("a", a, [m, k])?;
    let b = f32_reader("b", b, [k, n])?;
    check_len("out", out.len(), &[m, n])?;
    skip_zeros(&a, &b, [m, k, n], out, isa)
}

/// The driver of [`gemm_skip_zeros_into_with`] on operands read through their readers (which
/// round them into their formats): `a` is typically an N:M-compressed matrix, whose non-zero
/// lists are built from its stored values. `out` is `[m, n]`; shapes are the caller's to check.
pub(crate) fn skip_zeros(
    a: &Reader, b: &Reader, [m, k, n]: [usize; 3], out: &mut [f32], isa: Isa,
) -> Result<SparseKernel> {
    let dense = |out: &mut [f32]| {
        dense_run(a, b, m, k, n, Tiling::gemm(PerfMode::None), out).map(|_| SparseKernel::Dense)
    };
    // Without AVX-512 the skipping loop is slower than the dense kernel's AVX2 path: use that.
    let avx512 = x86::has_avx512();
    if (isa == Isa::Best && !avx512) || m == 0 || n == 0 || k == 0 {
        return dense(out);
    }
    if !fp_env_is_ieee() {
        return Err(fp_env_error());
    }
    let cancel = crate::cancel::current();
    let tiles = k.div_ceil(TILE);
    let Some(lists) = Lists::build(a, m, k, tiles)? else {
        return dense(out);
    };
    cancel.check()?;
    // A b holding Inf or NaN (where 0 * Inf is NaN) takes the dense kernel.
    let Some(mut packed) = PackedB::new(b, k, n)? else {
        return dense(out);
    };
    cancel.check()?;

    let ctx = Ctx {
        a,
        k,
        tiles,
        ptr: &lists.ptr,
        kidx: &lists.kidx,
        vals: &lists.vals,
        bpack: packed.buf.as_mut_slice(),
        row_floats: if packed.half { W / 2 } else { W },
        half: packed.half,
    };
    let avx512 = isa == Isa::Best && avx512;
    // Tasks: MC rows x NC columns, each holding its rows' segments of the output. As in the
    // dense driver, one K tile at a time is added into every task's block: per tile, a task
    // reads its rows' entries of the tile once and 16 KiB of packed b per column block.
    let mut tasks: Vec<(usize, usize, Vec<&mut [f32]>)> = Vec::new();
    let nc = NC_BLOCKS * W;
    for (rb, blk) in out.chunks_mut(MC * n).enumerate() {
        let ranges = n.div_ceil(nc);
        let segs = super::gemm::column_segments(blk.chunks_mut(n), nc, ranges, MC);
        for (cr, s) in segs.into_iter().enumerate() {
            tasks.push((rb * MC, cr * NC_BLOCKS, s));
        }
    }
    for t0 in (0..tiles).step_by(GROUP) {
        cancel.check()?;
        let t1 = (t0 + GROUP).min(tiles);
        tasks.par_iter_mut().try_for_each(|(row0, cb0, segs)| {
            cancel.check()?;
            if !fp_env_is_ieee() {
                return Err(fp_env_error());
            }
            ctx.add_tiles(t0..t1, *row0, *cb0, segs, avx512);
            Ok(())
        })?;
    }
    tasks.par_iter_mut().for_each(|(_, _, segs)| {
        for x in segs.iter_mut().flat_map(|s| s.iter_mut()) {
            if x.is_nan() {
                *x = CANONICAL_NAN;
            }
        }
    });
    Ok(SparseKernel::SkipZeros)
}

/// Each row's non-zero elements (k, value) per K tile, in row, tile, k order: the entries of
/// row `r` in tile `t` are `ptr[r * tiles + t]..ptr[r * tiles + t + 1]`.
struct Lists {
    ptr: Vec<usize>,
    kidx: Vec<u32>,
    vals: Vec<f32>,
}

impl Lists {
    /// The lists of `a` `[m, k]`, read a K tile of a row at a time (from the stored values of a
    /// compressed `a`, never a dense copy); `None` when more than 40% of `a` is non-zero.
    fn build(a: &Reader, m: usize, k: usize, tiles: usize) -> Result<Option<Lists>> {
        let slots = m
            .checked_mul(tiles)
            .and_then(|s| s.checked_add(1))
            .ok_or_else(|| Error::capacity("a", format!("{m} x {tiles} tiles overflow usize")))?;
        let mut ptr: Vec<usize> = crate::host::zeroed_vec("a", "the sparse row index", slots)?;
        // Both passes read all of `a` (a second or more for 8192^2): a cancelled token skips
        // the remaining rows, and the check after each pass returns `Interrupted`.
        let cancel = crate::cancel::current();
        ptr[1..].par_chunks_mut(tiles).enumerate().for_each_init(Scratch::new, |s, (r, counts)| {
            if cancel.is_cancelled() {
                return;
            }
            let mut row = [0f32; TILE];
            for (t, c) in counts.iter_mut().enumerate() {
                let seg = &mut row[..TILE.min(k - t * TILE)];
                a.row_run(r, t * TILE, seg, s);
                *c = seg.iter().filter(|&&x| x != 0.0).count();
            }
        });
        cancel.check()?;
        for i in 1..slots {
            ptr[i] += ptr[i - 1];
        }
        let nnz = ptr[slots - 1];
        if nnz as f64 > MAX_DENSITY * (m as f64 * k as f64) {
            return Ok(None);
        }
        let mut kidx: Vec<u32> = crate::host::zeroed_vec("a", "the sparse entries", nnz)?;
        let mut vals: Vec<f32> = crate::host::zeroed_vec("a", "the sparse entries", nnz)?;
        // Split the entry arrays at row boundaries, then fill rows in parallel.
        let mut rows: Vec<(usize, &mut [u32], &mut [f32])> = Vec::with_capacity(m);
        let (mut ki, mut vi) = (&mut kidx[..], &mut vals[..]);
        for r in 0..m {
            let len = ptr[(r + 1) * tiles] - ptr[r * tiles];
            let (kh, kt) = ki.split_at_mut(len);
            let (vh, vt) = vi.split_at_mut(len);
            rows.push((r, kh, vh));
            ki = kt;
            vi = vt;
        }
        rows.into_par_iter().with_min_len(16).for_each_init(Scratch::new, |s, (r, ks, vs)| {
            if cancel.is_cancelled() {
                return;
            }
            let mut row = [0f32; TILE];
            // Branch-free: every element is written at the next free entry, which advances
            // only past non-zeros (the last write lands on a spare slot or is overwritten).
            let mut e = 0;
            for k0 in (0..k).step_by(TILE) {
                let seg = &mut row[..TILE.min(k - k0)];
                a.row_run(r, k0, seg, s);
                for (kk, &x) in seg.iter().enumerate() {
                    if e < ks.len() {
                        ks[e] = (k0 + kk) as u32;
                        vs[e] = x;
                    }
                    e += (x != 0.0) as usize;
                }
            }
        });
        cancel.check()?;
        Ok(Some(Lists { ptr, kidx, vals }))
    }
}

/// `b` packed by column blocks: block `cb` (columns `cb * W..`) is `K` rows of `W` floats at
/// `cb * K * W`. When every element of `b` is a bf16 value (inputs of bf16, fp8 or narrower),
/// a block's rows are 16 words instead, word j holding columns j (low half) and j + 16 (high
/// half) as bf16: half the bytes, one 64-byte line per row.
struct PackedB {
    buf: Aligned,
    half: bool,
}

impl PackedB {
    /// Packs `b` `[k, n]` read through its reader; `None` if it holds an Inf or NaN.
    fn new(b: &Reader, k: usize, n: usize) -> Result<Option<PackedB>> {
        let blocks = n.div_ceil(W);
        let overflow = || Error::capacity("b", "the packed b overflows usize");
        let panel = k.checked_mul(W).ok_or_else(overflow)?;
        let total = blocks.checked_mul(panel).ok_or_else(overflow)?;
        let mut buf = Aligned::new(total, "the packed b")?;
        // A job packs several blocks, so one run of a row of b fills several.
        let group = RUN / W;
        let cancel = crate::cancel::current();
        let (finite, half) = buf
            .as_mut_slice()
            .par_chunks_mut(group * panel)
            .enumerate()
            .map_init(Scratch::new, |s, (g, dst)| {
                let c0 = g * group * W;
                let width = (dst.len() / k).min(n - c0);
                let (mut finite, mut half) = (true, true);
                if cancel.is_cancelled() {
                    return (finite, half);
                }
                let mut row = [0f32; RUN];
                let row = &mut row[..width];
                for kk in 0..k {
                    b.row_run(kk, c0, row, s);
                    for (q, blk) in dst.chunks_exact_mut(panel).enumerate() {
                        let d = &mut blk[kk * W..][..W];
                        let src = row.get(q * W..).unwrap_or(&[]);
                        let cols = W.min(src.len());
                        d[..cols].copy_from_slice(&src[..cols]);
                        d[cols..].fill(0.0);
                    }
                    for &x in row.iter() {
                        finite &= x.is_finite();
                        half &= x.to_bits() & 0xFFFF == 0;
                    }
                }
                (finite, half)
            })
            .reduce(|| (true, true), |x, y| (x.0 && y.0, x.1 && y.1));
        cancel.check()?;
        if !finite {
            return Ok(None);
        }
        if half {
            // In place, row by row: row kk's 16 words land at kk * 16, never past row kk's
            // floats at kk * 32, which are read first.
            buf.as_mut_slice().par_chunks_mut(panel).for_each(|blk| {
                for kk in 0..k {
                    let mut src = [0f32; W];
                    src.copy_from_slice(&blk[kk * W..][..W]);
                    for (j, w) in blk[kk * (W / 2)..][..W / 2].iter_mut().enumerate() {
                        let lo = src[j].to_bits() >> 16;
                        let hi = src[j + W / 2].to_bits() & 0xFFFF_0000;
                        *w = f32::from_bits(hi | lo);
                    }
                }
            });
        }
        Ok(Some(PackedB { buf, half }))
    }
}

/// What every task reads.
struct Ctx<'a> {
    a: &'a Reader<'a>,
    k: usize,
    tiles: usize,
    ptr: &'a [usize],
    kidx: &'a [u32],
    vals: &'a [f32],
    bpack: &'a [f32],
    /// Floats (or bf16 pairs) per packed row of b: W, or W / 2 when `half`.
    row_floats: usize,
    /// b is packed as bf16 pairs.
    half: bool,
}

impl Ctx<'_> {
    /// Adds K tiles `ts` into a task's block: output rows `row0..`, column blocks `cb0..`, one
    /// segment of the block's width per row (tile 0's sums are written, later ones added).
    fn add_tiles(
        &self, ts: std::ops::Range<usize>, row0: usize, cb0: usize, segs: &mut [&mut [f32]],
        avx512: bool,
    ) {
        let width = segs.first().map_or(0, |s| s.len());
        for lc in 0..width.div_ceil(W) {
            let cb = cb0 + lc;
            let (lo, hi) = (lc * W, (lc * W + W).min(width));
            let panel = &self.bpack[cb * self.k * W..][..self.k * self.row_floats];
            for (g, group) in segs.chunks_mut(RB).enumerate() {
                let r0 = row0 + g * RB;
                let entries = |r: usize, t: usize| {
                    let s = (r0 + r) * self.tiles + t;
                    let (e0, e1) = (self.ptr[s], self.ptr[s + 1]);
                    (&self.kidx[e0..e1], &self.vals[e0..e1])
                };
                // Rows the fast path left alone (a -0 tile sum, or no AVX-512).
                let mut dirty = (1u32 << group.len()) - 1;
                if avx512 {
                    if let Ok(full) = <&mut [&mut [f32]; RB]>::try_from(&mut *group) {
                        let mut sub = full.each_mut().map(|s| &mut s[lo..hi]);
                        // SAFETY: has_avx512() checked the CPU; every entry's k is < K, so its
                        // W floats lie inside `panel`; each segment holds at most W floats.
                        dirty = unsafe {
                            if self.half {
                                x86::tiles::<RB, true, _>(entries, ts.clone(), panel, &mut sub)
                            } else {
                                x86::tiles::<RB, false, _>(entries, ts.clone(), panel, &mut sub)
                            }
                        };
                    } else {
                        dirty = 0;
                        for (r, seg) in group.iter_mut().enumerate() {
                            let one = |_: usize, t: usize| entries(r, t);
                            // SAFETY: as above, one row at a time.
                            let row = &mut [&mut seg[lo..hi]];
                            let d = unsafe {
                                if self.half {
                                    x86::tiles::<1, true, _>(one, ts.clone(), panel, row)
                                } else {
                                    x86::tiles::<1, false, _>(one, ts.clone(), panel, row)
                                }
                            };
                            dirty |= d << r;
                        }
                    }
                }
                for (r, seg) in group.iter_mut().enumerate() {
                    if dirty & (1 << r) != 0 {
                        for t in ts.clone() {
                            let (ks, vs) = entries(r, t);
                            self.portable_tile(ks, vs, r0 + r, t, panel, &mut seg[lo..hi]);
                        }
                    }
                }
            }
        }
    }

    /// Row `kk` of a packed block of b, as floats.
    fn b_row(&self, panel: &[f32], kk: usize) -> [f32; W] {
        let mut row = [0f32; W];
        if self.half {
            let words = &panel[kk * (W / 2)..][..W / 2];
            for (j, w) in words.iter().enumerate() {
                row[j] = f32::from_bits(w.to_bits() << 16);
                row[j + W / 2] = f32::from_bits(w.to_bits() & 0xFFFF_0000);
            }
        } else {
            row.copy_from_slice(&panel[kk * W..][..W]);
        }
        row
    }

    /// One row's tile on the portable path, fixing `-0` sums: written (`t == 0`) or added to
    /// `seg` (the first columns of the block `panel` of row `i`).
    fn portable_tile(
        &self, ks: &[u32], vs: &[f32], i: usize, t: usize, panel: &[f32], seg: &mut [f32],
    ) {
        let mut acc = [0f32; W];
        for (&kk, &v) in ks.iter().zip(vs) {
            let row = self.b_row(panel, kk as usize);
            for (s, &y) in acc.iter_mut().zip(&row).take(seg.len()) {
                *s = v.mul_add(y, *s);
            }
        }
        // A -0 sum may be a +0 of the dense kernel: recompute those lanes densely, over every
        // product of the tile, zeros included (their signs matter here).
        if acc[..seg.len()].iter().any(|s| s.to_bits() == 0x8000_0000) {
            let k0 = t * TILE;
            let mut a_tile = [0f32; TILE];
            let a_tile = &mut a_tile[..TILE.min(self.k - k0)];
            self.a.row_run(i, k0, a_tile, &mut Scratch::new());
            let rows: Vec<[f32; W]> =
                (0..a_tile.len()).map(|d| self.b_row(panel, k0 + d)).collect();
            for (j, s) in acc.iter_mut().enumerate().take(seg.len()) {
                if s.to_bits() == 0x8000_0000 {
                    *s = a_tile.iter().zip(&rows).fold(0f32, |p, (&x, r)| x.mul_add(r[j], p));
                }
            }
        }
        if t == 0 {
            seg.copy_from_slice(&acc[..seg.len()]);
        } else {
            for (o, &p) in seg.iter_mut().zip(&acc) {
                *o += p;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86 {
    use super::W;
    use std::arch::x86_64::*;

    pub(super) fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    /// `s[q] += x * (columns 16q..16q + 16 of the packed row at `row`)`: two fp32 vectors, or
    /// one vector of bf16 pairs widened exactly (low halves shifted up, high halves masked).
    ///
    /// # Safety
    /// AVX-512F; `row` valid for a packed row (`W` floats, or `W / 2` words when `HALF`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn fma_row<const HALF: bool>(
        x: __m512, row: *const f32, s: &mut [__m512; W / 16], high: __m512i,
    ) {
        if HALF {
            // SAFETY: the caller's contract: 16 words at `row`.
            let w = _mm512_castps_si512(unsafe { _mm512_loadu_ps(row) });
            let lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w));
            let hi = _mm512_castsi512_ps(_mm512_and_si512(w, high));
            s[0] = _mm512_fmadd_ps(x, lo, s[0]);
            s[1] = _mm512_fmadd_ps(x, hi, s[1]);
        } else {
            for (q, sq) in s.iter_mut().enumerate() {
                // SAFETY: the caller's contract: W floats at `row`.
                *sq = _mm512_fmadd_ps(x, unsafe { _mm512_loadu_ps(row.add(q * 16)) }, *sq);
            }
        }
    }

    /// K tiles `ts` of `R` rows over a column block, the rows' sums kept in registers across
    /// the tiles: each tile's sums (two zmm accumulators per row, the rows in lockstep over
    /// their common number of entries, then each row's remaining entries) are those of
    /// the portable path's (`Ctx::portable_tile`), written for tile 0 and added otherwise, with one fp32
    /// rounding, as PSUM does; each row's segment is loaded once and stored once. Returns a bit
    /// mask of the rows left alone because one of their tile sums is `-0` (the caller
    /// recomputes those rows' tiles on the portable path, which fixes such lanes).
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `panel` must hold `W` floats from every `k * W` of the
    /// entries; `segs` holds `R` segments of at most `W` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tiles<'e, const R: usize, const HALF: bool, F>(
        entries: F, ts: std::ops::Range<usize>, panel: &[f32], segs: &mut [&mut [f32]; R],
    ) -> u32
    where
        F: Fn(usize, usize) -> (&'e [u32], &'e [f32]),
    {
        const V: usize = W / 16;
        let p = panel.as_ptr();
        let stride = if HALF { W / 2 } else { W };
        let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        let live = |cols: usize, q: usize| -> __mmask16 {
            let lanes = cols.saturating_sub(q * 16).min(16);
            ((1u32 << lanes) - 1) as u16
        };
        let mut out = [[_mm512_setzero_ps(); V]; R];
        if ts.start > 0 {
            for (o, seg) in out.iter_mut().zip(segs.iter()) {
                for (q, oq) in o.iter_mut().enumerate() {
                    // SAFETY: lanes at or beyond the segment's length are masked off.
                    *oq = unsafe {
                        _mm512_maskz_loadu_ps(live(seg.len(), q), seg.as_ptr().add(q * 16))
                    };
                }
            }
        }
        let negzero = _mm512_set1_epi32(0x8000_0000u32 as i32);
        let mut dirty = 0u32;
        for t in ts {
            let es: [(&[u32], &[f32]); R] = std::array::from_fn(|r| entries(r, t));
            let mut s = [[_mm512_setzero_ps(); V]; R];
            let common = es.iter().map(|e| e.0.len().min(e.1.len())).min().unwrap_or(0);
            for e in 0..common {
                for (r, sr) in s.iter_mut().enumerate() {
                    let (ks, vs) = es[r];
                    // SAFETY: e < common <= both lengths; the caller guarantees `W` floats
                    // from `k * W`, and q * 16 + 16 <= W.
                    unsafe {
                        let x = _mm512_set1_ps(*vs.get_unchecked(e));
                        let row = p.add(*ks.get_unchecked(e) as usize * stride);
                        fma_row::<HALF>(x, row, sr, high);
                    }
                }
            }
            for (r, sr) in s.iter_mut().enumerate() {
                let (ks, vs) = es[r];
                for (&kk, &v) in ks[common..].iter().zip(&vs[common..]) {
                    let x = _mm512_set1_ps(v);
                    // SAFETY: as above.
                    unsafe {
                        let row = p.add(kk as usize * stride);
                        fma_row::<HALF>(x, row, sr, high);
                    }
                }
            }
            for (r, ((sr, o), seg)) in s.iter().zip(out.iter_mut()).zip(segs.iter()).enumerate() {
                let mut bad = 0u16;
                for (q, sq) in sr.iter().enumerate() {
                    bad |= _mm512_mask_cmpeq_epi32_mask(
                        live(seg.len(), q),
                        _mm512_castps_si512(*sq),
                        negzero,
                    );
                }
                dirty |= ((bad != 0) as u32) << r;
                for (oq, sq) in o.iter_mut().zip(sr) {
                    *oq = if t == 0 { *sq } else { _mm512_add_ps(*oq, *sq) };
                }
            }
        }
        for (r, (o, seg)) in out.iter().zip(segs.iter_mut()).enumerate() {
            if dirty & (1 << r) != 0 {
                continue;
            }
            for (q, oq) in o.iter().enumerate() {
                let m = live(seg.len(), q);
                if m != 0 {
                    // SAFETY: lanes at or beyond the segment's length are masked off.
                    unsafe { _mm512_mask_storeu_ps(seg.as_mut_ptr().add(q * 16), m, *oq) };
                }
            }
        }
        dirty
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub(super) fn has_avx512() -> bool {
        false
    }
    pub(super) unsafe fn tiles<'e, const R: usize, const HALF: bool, F>(
        _: F, _: std::ops::Range<usize>, _: &[f32], _: &mut [&mut [f32]; R],
    ) -> u32
    where
        F: Fn(usize, usize) -> (&'e [u32], &'e [f32]),
    {
        (1 << R) - 1
    }
}
