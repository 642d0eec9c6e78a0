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
//! The driver is the dense one's loop nest (output blocks as rayon tasks, one K tile at a time,
//! `b` packed into `NR`-column panels), but `a` is packed per tile as a compact list of its
//! non-zero elements per row (`(k, value)` in ascending k). The kernel keeps one row's `NR`
//! partial sums in registers and, for each listed element, loads the `b` panel's row `k` and
//! issues one FMA per vector: a 4:16 operand costs about a quarter of the dense kernel's FMAs.

use rayon::prelude::*;

use super::gemm::{check_len, fp_env_error};
use super::kernel::fp_env_is_ieee;
use super::CANONICAL_NAN;
use crate::Result;

/// Rows of the output per task (a multiple of nothing: the kernel works one row at a time).
const MC: usize = 96;
/// Panels of `b` per task.
const NC_PANELS: usize = 8;
/// The contraction of one tile (the dense, non-`double_row` tile).
const TILE: usize = crate::spec::MATMUL_CONTRACTION_MAX;

/// A sparse row kernel. Holding a value proves the CPU supports its instructions.
trait RowKernel: Copy + Send + Sync {
    /// Columns per panel of `b`.
    const NR: usize;

    /// One row's tile: for each listed `(offset, value)`, `acc += value * b[offset..][..NR]`
    /// (the offsets are `k * NR` into the packed panel), then `c[..cols]` is written (`first`)
    /// or has the sums added.
    ///
    /// # Safety
    /// Every `offsets[e] + NR` is within `panel`; `c` is valid for `cols <= NR` reads and writes
    /// and does not alias `panel`.
    unsafe fn run(
        self,
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        c: *mut f32,
        cols: usize,
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
        c: *mut f32,
        cols: usize,
        first: bool,
    ) {
        let acc = row_sums::<16>(offsets, values, panel);
        // SAFETY: the caller's contract: `c` holds `cols` elements.
        let out = unsafe { std::slice::from_raw_parts_mut(c, cols) };
        for (o, &s) in out.iter_mut().zip(&acc) {
            *o = if first { s } else { *o + s };
        }
    }
}

/// The portable row sums (also inlined into the AVX2 kernel, where it vectorises).
#[inline(always)]
fn row_sums<const NR: usize>(offsets: &[u32], values: &[f32], panel: &[f32]) -> [f32; NR] {
    let mut acc = [0f32; NR];
    for (&o, &x) in offsets.iter().zip(values) {
        let row = &panel[o as usize..o as usize + NR];
        for (s, &y) in acc.iter_mut().zip(row) {
            *s = x.mul_add(y, *s);
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod x86 {
    use super::{row_sums, RowKernel};
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
        const NR: usize = 64;

        unsafe fn run(
            self,
            offsets: &[u32],
            values: &[f32],
            panel: &[f32],
            c: *mut f32,
            cols: usize,
            first: bool,
        ) {
            // SAFETY: holding `self` proves AVX-512F and FMA; the rest is the caller's contract.
            unsafe { row_avx512(offsets, values, panel, c, cols, first) }
        }
    }

    impl RowKernel for Avx2 {
        const NR: usize = 32;

        unsafe fn run(
            self,
            offsets: &[u32],
            values: &[f32],
            panel: &[f32],
            c: *mut f32,
            cols: usize,
            first: bool,
        ) {
            // SAFETY: holding `self` proves AVX2 and FMA; the rest is the caller's contract.
            unsafe { row_avx2(offsets, values, panel, c, cols, first) }
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; as [`RowKernel::run`] with 32 columns.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_avx2(
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        c: *mut f32,
        cols: usize,
        first: bool,
    ) {
        let acc = row_sums::<32>(offsets, values, panel);
        // SAFETY: the caller's contract: `c` holds `cols` elements.
        let out = unsafe { std::slice::from_raw_parts_mut(c, cols) };
        for (o, &s) in out.iter_mut().zip(&acc) {
            *o = if first { s } else { *o + s };
        }
    }

    /// # Safety
    /// AVX-512F and FMA must be available; as [`RowKernel::run`] with 64 columns.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn row_avx512(
        offsets: &[u32],
        values: &[f32],
        panel: &[f32],
        c: *mut f32,
        cols: usize,
        first: bool,
    ) {
        let mut acc = [_mm512_setzero_ps(); 4];
        let base = panel.as_ptr();
        for (&o, &x) in offsets.iter().zip(values) {
            debug_assert!(o as usize + 64 <= panel.len());
            let xv = _mm512_set1_ps(x);
            for (j, s) in acc.iter_mut().enumerate() {
                // SAFETY: `o + 64 <= panel.len()` (the caller's contract).
                let y = unsafe { _mm512_loadu_ps(base.add(o as usize + 16 * j)) };
                // One fused multiply-add: the PE step, exactly.
                *s = _mm512_fmadd_ps(xv, y, *s);
            }
        }
        for (j, &s) in acc.iter().enumerate() {
            let valid = cols.saturating_sub(16 * j).min(16);
            if valid == 0 {
                break;
            }
            let mask: __mmask16 = ((1u32 << valid) - 1) as u16;
            // SAFETY: the mask covers only the `cols` elements `c` holds.
            unsafe {
                let p = c.add(16 * j);
                let v = if first {
                    s
                } else {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), s)
                };
                _mm512_mask_storeu_ps(p, mask, v);
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

    let n_panels = n.div_ceil(K::NR);
    let mut bpack = vec![0f32; n_panels * K::NR * TILE];
    // Per row of `a`, the tile's non-zero elements: offsets `k * NR` into a panel, and values.
    let mut offsets = vec![0u32; m * TILE];
    let mut values = vec![0f32; m * TILE];
    let mut counts = vec![0usize; m];
    for (t, k0) in (0..k).step_by(TILE).enumerate() {
        let kc = TILE.min(k - k0);
        let bpack = &mut bpack[..n_panels * K::NR * kc];
        bpack
            .par_chunks_mut(K::NR * kc)
            .enumerate()
            .for_each(|(jp, panel)| {
                let c0 = jp * K::NR;
                let cols = K::NR.min(n - c0);
                for (kk, dst) in panel.chunks_exact_mut(K::NR).enumerate() {
                    let src = (k0 + kk) * n + c0;
                    dst[..cols].copy_from_slice(&b[src..src + cols]);
                    dst[cols..].fill(0.0);
                }
            });
        offsets
            .par_chunks_mut(TILE)
            .zip(values.par_chunks_mut(TILE))
            .zip(counts.par_iter_mut())
            .enumerate()
            .with_min_len(64)
            .for_each(|(i, ((offs, vals), count))| {
                let row = &a[i * k + k0..][..kc];
                let mut c = 0;
                for (kk, &x) in row.iter().enumerate() {
                    if x != 0.0 {
                        offs[c] = (kk * K::NR) as u32;
                        vals[c] = x;
                        c += 1;
                    }
                }
                *count = c;
            });
        let (bpack, offsets, values, counts) = (&*bpack, &offsets, &values, &counts);
        tasks.par_iter_mut().try_for_each(|task| {
            if !fp_env_is_ieee() {
                return Err(fp_env_error());
            }
            let width = task.rows.first().map_or(0, |r| r.len());
            let jp0 = task.col0 / K::NR;
            for jp in 0..width.div_ceil(K::NR) {
                let c0 = jp * K::NR;
                let cols = K::NR.min(width - c0);
                let panel = &bpack[(jp0 + jp) * K::NR * kc..][..K::NR * kc];
                for (r, row) in task.rows.iter_mut().enumerate() {
                    let i = task.row0 + r;
                    let cnt = counts[i];
                    let offs = &offsets[i * TILE..][..cnt];
                    let vals = &values[i * TILE..][..cnt];
                    // SAFETY: every offset is `kk * NR` with `kk < kc`, so `offset + NR` is
                    // within the panel of `kc * NR`; the row segment holds `cols` elements
                    // from `c0` and is not part of the packed panel.
                    unsafe { kernel.run(offs, vals, panel, row[c0..].as_mut_ptr(), cols, t == 0) };
                }
            }
            Ok(())
        })?;
    }
    tasks.par_iter_mut().for_each(|task| {
        for row in task.rows.iter_mut() {
            for x in row.iter_mut() {
                if x.is_nan() {
                    *x = CANONICAL_NAN;
                }
            }
        }
    });
    Ok(())
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
