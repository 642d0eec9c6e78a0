//! The GEMM of a sparse stationary operand (contract section 3): the same bits as the dense GEMM
//! of the same matrix, with the work of its zeros skipped.
//!
//! # Which bits
//!
//! Exactly the dense tiling of [`super::gemm_f32`] in the normal (non-`double_row`) mode: K in
//! tiles of 128, each tile's partial sum starting at +0.0 and taking its products in ascending k,
//! the first tile written and every later one added with one fp32 rounding. A zero element of `a`
//! contributes a product `±0` (for finite `b`), and adding `±0` to a partial sum changes at most
//! the sign of a zero sum; so leaving those steps out gives the dense values for finite inputs,
//! up to the sign of zero (the contract's promise). With an infinite or NaN element in `b` the
//! dense GEMM computes `0 * Inf = NaN` where this one skips it: the contract leaves that open.
//!
//! # How fast
//!
//! `b` is packed once into `NR`-column panels, tile by tile, and `a` into a compact list of each
//! row's non-zero elements per K tile (`(k, value)` in ascending k). Output blocks are rayon
//! tasks; a task keeps its block's PSUM values for one panel in a small buffer and, tile by tile,
//! runs the kernel over its rows, [`ROWS`] at a time: for each listed element it loads the
//! panel's row `k` and issues one FMA per vector, interleaving the rows' independent chains.
//! A 4:16 operand needs a quarter of the dense kernel's FMAs, but each FMA needs its own load of
//! `b` (the dense kernel shares one load among 6 rows), so on the 2-core Zen 4 host it runs at
//! about the dense kernel's speed rather than 4x faster (docs/sparsity.md gives the figures).
//! The packed copies take about the size of `a` (8 bytes per element) and of `b`.

use rayon::prelude::*;

use super::gemm::{check_len, fp_env_error};
use super::kernel::fp_env_is_ieee;
use super::CANONICAL_NAN;
use crate::Result;

/// Rows of the output per task (the kernel works one row at a time).
const MC: usize = 96;
/// Rows the kernels take at once.
const ROWS: usize = 4;
/// Panels of `b` per task.
const NC_PANELS: usize = 8;
/// The contraction of one tile (the dense, non-`double_row` tile).
const TILE: usize = crate::spec::MATMUL_CONTRACTION_MAX;

/// A sparse row kernel. Holding a value proves the CPU supports its instructions.
trait RowKernel: Copy + Send + Sync {
    /// Columns per panel of `b`.
    const NR: usize;

    /// One tile of up to [`ROWS`] rows at once (independent rows give the FMA chains
    /// instruction-level parallelism; each row's sums keep their own order). `rows[r]` is row
    /// `r`'s `(offsets, values)` list and `psum[r]` its PSUM buffer; missing rows have empty
    /// lists and a null buffer.
    ///
    /// # Safety
    /// As [`RowKernel::run`] for every row with a non-null buffer.
    unsafe fn run_rows(
        self,
        rows: &[(&[u32], &[f32]); ROWS],
        panel: &[f32],
        psum: &[*mut f32; ROWS],
        first: bool,
    ) {
        for (&(o, v), &p) in rows.iter().zip(psum) {
            if !p.is_null() {
                // SAFETY: the caller's contract.
                unsafe { self.run(o, v, panel, p, first) };
            }
        }
    }

    /// One row's K tile over one panel of `NR` columns: the tile sum starts at +0.0 and takes
    /// the listed products `values[e] * panel[offsets[e]..][..NR]` in order (ascending k); then
    /// `psum[..NR]` is set to it (`first`) or has it added with one fp32 rounding.
    ///
    /// # Safety
    /// Every `offsets[e] + NR` is within `panel`; `psum` is valid for `NR` reads and writes and
    /// does not alias `panel`.
    unsafe fn run(
        self,
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        psum: *mut f32,
        first: bool,
    );
}

/// Portable kernel: `f32::mul_add` per lane (IEEE fusedMultiplyAdd on every target).
#[derive(Debug, Clone, Copy)]
struct Portable;

impl RowKernel for Portable {
    const NR: usize = 16;

    unsafe fn run(
        self,
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        psum: *mut f32,
        first: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { row_generic::<16>(offsets, values, panel, psum, first) }
    }
}

/// The portable kernel body (also inlined into the AVX2 kernel, where it vectorises).
///
/// # Safety
/// As [`RowKernel::run`] with `NR` columns.
#[inline(always)]
unsafe fn row_generic<const NR: usize>(
    offsets: &[u32],
    values: &[f32],
    panel: &[f32],
    psum: *mut f32,
    first: bool,
) {
    let mut acc = [0f32; NR];
    for (&o, &x) in offsets.iter().zip(values) {
        let y = &panel[o as usize..o as usize + NR];
        for (s, &yy) in acc.iter_mut().zip(y) {
            *s = x.mul_add(yy, *s);
        }
    }
    // SAFETY: the caller's contract: `psum` holds NR elements.
    let p = unsafe { std::slice::from_raw_parts_mut(psum, NR) };
    for (p, &s) in p.iter_mut().zip(&acc) {
        *p = if first { s } else { *p + s };
    }
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86 {
    use super::{row_generic, RowKernel, ROWS};
    use std::arch::x86_64::*;

    /// AVX-512: 64 columns, four zmm accumulators.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Avx512(());

    /// AVX2: 32 columns (the portable loop compiled with AVX2 and FMA).
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Avx2(());

    impl Avx512 {
        pub(super) fn detect() -> Option<Avx512> {
            (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"))
                .then_some(Avx512(()))
        }
    }

    impl Avx2 {
        pub(super) fn detect() -> Option<Avx2> {
            (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
                .then_some(Avx2(()))
        }
    }

    impl RowKernel for Avx512 {
        const NR: usize = 32;

        unsafe fn run_rows(
            self,
            rows: &[(&[u32], &[f32]); ROWS],
            panel: &[f32],
            psum: &[*mut f32; ROWS],
            first: bool,
        ) {
            // SAFETY: holding `self` proves AVX-512F and FMA; the rest is the caller's contract.
            unsafe { rows_avx512(rows, panel, psum, first) }
        }

        unsafe fn run(
            self,
            offsets: &[u32],
            values: &[f32],
            panel: &[f32],
            psum: *mut f32,
            first: bool,
        ) {
            // SAFETY: holding `self` proves AVX-512F and FMA; the rest is the caller's contract.
            unsafe { row_avx512(offsets, values, panel, psum, first) }
        }
    }

    impl RowKernel for Avx2 {
        const NR: usize = 32;

        unsafe fn run(
            self,
            offsets: &[u32],
            values: &[f32],
            panel: &[f32],
            psum: *mut f32,
            first: bool,
        ) {
            // SAFETY: holding `self` proves AVX2 and FMA; the rest is the caller's contract.
            unsafe { row_avx2(offsets, values, panel, psum, first) }
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; as [`RowKernel::run`] with 32 columns.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_avx2(
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        psum: *mut f32,
        first: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { row_generic::<32>(offsets, values, panel, psum, first) }
    }

    /// # Safety
    /// AVX-512F and FMA must be available; as [`RowKernel::run`] with 32 columns.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn row_avx512(
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        psum: *mut f32,
        first: bool,
    ) {
        let rows = [
            (offsets, values),
            (&[][..], &[][..]),
            (&[][..], &[][..]),
            (&[][..], &[][..]),
        ];
        let ptrs = [
            psum,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ];
        // SAFETY: the caller's contract, for the one row given.
        unsafe { rows_avx512(&rows, panel, &ptrs, first) }
    }

    /// # Safety
    /// AVX-512F and FMA must be available; as [`RowKernel::run_rows`] with 32 columns.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn rows_avx512(
        rows: &[(&[u32], &[f32]); ROWS],
        panel: &[f32],
        psum: &[*mut f32; ROWS],
        first: bool,
    ) {
        let base = panel.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        // The elements every row has, interleaved: ROWS x 2 independent FMA chains.
        let common = rows.iter().map(|(o, _)| o.len()).min().unwrap_or(0);
        for e in 0..common {
            for (r, a) in acc.iter_mut().enumerate() {
                let (o, v) = rows[r];
                let xv = _mm512_set1_ps(v[e]);
                let at = o[e] as usize;
                debug_assert!(at + 32 <= panel.len());
                // SAFETY: `at + 32 <= panel.len()` (the caller's contract).
                unsafe {
                    a[0] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(base.add(at)), a[0]);
                    a[1] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(base.add(at + 16)), a[1]);
                }
            }
        }
        // Each row's remaining elements, in order.
        for (r, a) in acc.iter_mut().enumerate() {
            let (o, v) = rows[r];
            for (&at, &x) in o[common..].iter().zip(&v[common..]) {
                let xv = _mm512_set1_ps(x);
                // SAFETY: as above.
                unsafe {
                    a[0] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(base.add(at as usize)), a[0]);
                    a[1] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(base.add(at as usize + 16)), a[1]);
                }
            }
        }
        for (a, &p) in acc.iter().zip(psum) {
            if p.is_null() {
                continue;
            }
            for (j, &s) in a.iter().enumerate() {
                // SAFETY: a non-null `p` holds 32 elements (the caller's contract).
                unsafe {
                    let q = p.add(16 * j);
                    // PSUM accumulation: one fp32 rounding.
                    let v = if first {
                        s
                    } else {
                        _mm512_add_ps(_mm512_loadu_ps(q), s)
                    };
                    _mm512_storeu_ps(q, v);
                }
            }
        }
    }
}

/// Computes `a @ b` for `a` `[M, K]` and `b` `[K, N]` (row-major float32 of exact input values)
/// into `out` `[M, N]`, skipping the products of `a`'s zeros (module doc): equal to
/// [`super::gemm_f32_into`] in the normal mode for finite inputs, up to the sign of zero.
pub fn sparse_gemm_f32_into(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    check_len("a", a.len(), &[m, k])?;
    check_len("b", b.len(), &[k, n])?;
    check_len("out", out.len(), &[m, n])?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    if !fp_env_is_ieee() {
        return Err(fp_env_error());
    }
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(kernel) = x86::Avx512::detect() {
            return drive(kernel, a, b, m, k, n, out);
        }
        if let Some(kernel) = x86::Avx2::detect() {
            return drive(kernel, a, b, m, k, n, out);
        }
    }
    drive(Portable, a, b, m, k, n, out)
}

/// One task: rows `row0..` of the output, columns `col0..col0 + width`.
struct Task<'o> {
    row0: usize,
    col0: usize,
    rows: Vec<&'o mut [f32]>,
}

fn drive<K: RowKernel>(
    kernel: K,
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let threads = rayon::current_num_threads().max(1);
    let mc = MC.min(m);
    let row_blocks = m.div_ceil(mc);
    let mut nc_panels = NC_PANELS;
    while nc_panels > 1 && row_blocks * n.div_ceil(nc_panels * K::NR) < 2 * threads {
        nc_panels /= 2;
    }
    let nc = nc_panels * K::NR;
    let col_blocks = n.div_ceil(nc);
    let mut tasks = Vec::with_capacity(row_blocks * col_blocks);
    for (rb, block) in out.chunks_mut(mc * n).enumerate() {
        let mut cols: Vec<Vec<&mut [f32]>> =
            (0..col_blocks).map(|_| Vec::with_capacity(mc)).collect();
        for row in block.chunks_mut(n) {
            let mut rest = row;
            for segs in cols.iter_mut() {
                let (seg, tail) = rest.split_at_mut(nc.min(rest.len()));
                segs.push(seg);
                rest = tail;
            }
        }
        for (cb, rows) in cols.into_iter().enumerate() {
            tasks.push(Task {
                row0: rb * mc,
                col0: cb * nc,
                rows,
            });
        }
    }

    // `b`, packed once: panel `jp` of tile `t` (its rows k, NR columns, zero-padded) starts at
    // `(jp * k_tiles + t) * tile_rows * NR`, so one panel's tiles follow each other.
    let k_tiles = k.div_ceil(TILE);
    let n_panels = n.div_ceil(K::NR);
    // A tile holds at most K rows: a short K must not cost 128 times `b`'s memory.
    let tile_rows = TILE.min(k);
    let tile_stride = tile_rows * K::NR;
    let mut bpack: Vec<f32> = crate::host::zeroed_vec(
        "b",
        "the packed copy of b",
        n_panels * k_tiles * tile_stride,
    )?;
    bpack
        .par_chunks_mut(tile_stride)
        .enumerate()
        .for_each(|(i, panel)| {
            let (jp, t) = (i / k_tiles, i % k_tiles);
            let (c0, k0) = (jp * K::NR, t * TILE);
            let cols = K::NR.min(n - c0);
            for (kk, dst) in panel
                .chunks_exact_mut(K::NR)
                .take(TILE.min(k - k0))
                .enumerate()
            {
                let src = (k0 + kk) * n + c0;
                dst[..cols].copy_from_slice(&b[src..src + cols]);
            }
        });
    // `a`, as each row's non-zero elements per tile (see `SparseRow`): tile `t`'s list starts
    // at `t * TILE` of the row's `k` slots.
    let row_len = k;
    let mut offsets: Vec<u32> = crate::host::zeroed_vec("a", "the packed copy of a", m * row_len)?;
    let mut values: Vec<f32> = crate::host::zeroed_vec("a", "the packed copy of a", m * row_len)?;
    let mut counts: Vec<u32> = crate::host::zeroed_vec("a", "the packed copy of a", m * k_tiles)?;
    offsets
        .par_chunks_mut(row_len)
        .zip(values.par_chunks_mut(row_len))
        .zip(counts.par_chunks_mut(k_tiles))
        .enumerate()
        .for_each(|(i, ((offs, vals), cnts))| {
            for (t, cnt) in cnts.iter_mut().enumerate() {
                let k0 = t * TILE;
                let row = &a[i * k + k0..i * k + (k0 + TILE).min(k)];
                let mut c = 0;
                for (kk, &x) in row.iter().enumerate() {
                    if x != 0.0 {
                        offs[k0 + c] = (kk * K::NR) as u32;
                        vals[k0 + c] = x;
                        c += 1;
                    }
                }
                *cnt = c as u32;
            }
        });
    let (bpack, offsets, values, counts) = (&bpack, &offsets, &values, &counts);
    // Ctrl-C (crate::cancel): checked by every task, for every panel and K tile.
    let cancel = crate::cancel::current();
    tasks.par_iter_mut().try_for_each(|task| {
        cancel.check()?;
        if !fp_env_is_ieee() {
            return Err(fp_env_error());
        }
        let width = task.rows.first().map_or(0, |r| r.len());
        let jp0 = task.col0 / K::NR;
        // The block's PSUM values for one panel: a few KiB that stay in L1/L2 across the tiles,
        // while the tile's panel of `b` (TILE x NR) is reused by every row of the block.
        let mut psum = vec![0f32; task.rows.len() * K::NR];
        for jp in 0..width.div_ceil(K::NR) {
            let c0 = jp * K::NR;
            let cols = K::NR.min(width - c0);
            let strip = &bpack[(jp0 + jp) * k_tiles * tile_stride..][..k_tiles * tile_stride];
            for (t, panel) in strip.chunks_exact(tile_stride).enumerate() {
                cancel.check()?;
                for (g, group) in psum.chunks_mut(ROWS * K::NR).enumerate() {
                    let mut lists: [(&[u32], &[f32]); ROWS] = [(&[], &[]); ROWS];
                    let mut ptrs = [std::ptr::null_mut(); ROWS];
                    for (r, p) in group.chunks_exact_mut(K::NR).enumerate() {
                        let i = task.row0 + g * ROWS + r;
                        let cnt = counts[i * k_tiles + t] as usize;
                        let list = i * row_len + t * TILE..i * row_len + t * TILE + cnt;
                        lists[r] = (&offsets[list.clone()], &values[list]);
                        ptrs[r] = p.as_mut_ptr();
                    }
                    // SAFETY: every listed offset is `kk * NR` with `kk < tile_rows`, so
                    // `offset + NR` is within the tile's panel; each non-null pointer is NR
                    // elements of the task's own buffer, distinct from the others.
                    unsafe { kernel.run_rows(&lists, panel, &ptrs, t == 0) };
                }
            }
            for (row, p) in task.rows.iter_mut().zip(psum.chunks_exact(K::NR)) {
                for (o, &v) in row[c0..c0 + cols].iter_mut().zip(p) {
                    *o = if v.is_nan() { CANONICAL_NAN } else { v };
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{gemm_f32, PerfMode};
    use crate::numerics::mix64;

    /// Finite bf16-valued data with about `keep` of 16 elements non-zero.
    fn sparse_values(seed: u64, len: usize, keep: u64) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = mix64(seed ^ (i as u64) << 20);
                if h % 16 >= keep {
                    return if h & 1 << 40 != 0 { -0.0 } else { 0.0 };
                }
                let bits = ((h >> 16) as u32) << 16;
                let v = f32::from_bits(bits);
                if v.is_finite() {
                    v
                } else {
                    1.5
                }
            })
            .collect()
    }

    fn run_with<K: RowKernel>(kernel: K, a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
        let mut out = vec![0f32; m * n];
        drive(kernel, a, b, m, k, n, &mut out).expect("valid");
        let dense = gemm_f32(a, b, m, k, n, PerfMode::None).expect("valid");
        for (i, (&s, &d)) in out.iter().zip(&dense).enumerate() {
            // Equal values (a zero sum may differ in sign), NaN in the same places.
            assert!(
                s == d || (s.is_nan() && d.is_nan()),
                "{m}x{k}x{n} element {i}: sparse {s:e} dense {d:e}"
            );
        }
    }

    #[test]
    fn every_kernel_matches_the_dense_gemm() {
        for (m, k, n) in [(1, 1, 1), (13, 300, 70), (7, 513, 129), (100, 130, 17)] {
            for keep in [0, 1, 4, 16] {
                let a = sparse_values(1 + keep, m * k, keep);
                let b = sparse_values(2, k * n, 16);
                run_with(Portable, &a, &b, m, k, n);
                #[cfg(target_arch = "x86_64")]
                {
                    if let Some(kernel) = x86::Avx2::detect() {
                        run_with(kernel, &a, &b, m, k, n);
                    }
                    if let Some(kernel) = x86::Avx512::detect() {
                        run_with(kernel, &a, &b, m, k, n);
                    }
                }
            }
        }
    }
}
