//! Magnitude pruning to an N:M pattern.

use rayon::prelude::*;

use super::{blocks_per_task, AxisView, Dtype, Element, KeyRule, Pattern};
use crate::{Error, Result};

/// Keeps the `n` largest magnitudes of every group of `m` consecutive elements along `axis` and
/// sets the others to all-bits-zero (`+0.0`); ties keep the lower index and NaN counts as the
/// largest (module doc, "Magnitude order").
///
/// `x` is the C-contiguous array of `shape` as raw codes of `dtype` (whose width must be `T`'s).
/// The result has the same shape. Errors: a dtype of another width (`Error::Format`), a shape
/// that does not hold `x.len()` elements, a bad axis, or an axis length that is not a multiple of
/// `m` (`Error::Shape`).
pub fn prune<T: Element>(
    x: &[T], dtype: Dtype, shape: &[usize], axis: isize, pattern: Pattern,
) -> Result<Vec<T>> {
    let bytes = x.len() as u128 * (T::BITS / 8) as u128;
    crate::host::check_alloc("x", "the pruned array", bytes)?;
    let mut out = vec![T::ZERO; x.len()];
    prune_to(x, &mut out, dtype, shape, axis, pattern)?;
    Ok(out)
}

/// [`prune`] into a caller's buffer of `x.len()` elements (e.g. a numpy-allocated output, whose
/// fresh pages come as huge pages): every element of `out` is written.
pub fn prune_to<T: Element>(
    x: &[T], out: &mut [T], dtype: Dtype, shape: &[usize], axis: isize, pattern: Pattern,
) -> Result<()> {
    if dtype.bits() != T::BITS {
        return Err(Error::format(
            "x",
            format!(
                "dtype {} has {}-bit codes but the data holds {}-bit elements",
                dtype.name(),
                dtype.bits(),
                T::BITS
            ),
        ));
    }
    if out.len() != x.len() {
        return Err(Error::shape(
            "out",
            format!("holds {} elements, the input {}", out.len(), x.len()),
        ));
    }
    let view = AxisView::new(shape, axis, x.len(), pattern)?;
    let cancel = crate::cancel::current();
    if !out.is_empty() {
        prune_into(x, out, dtype, view.inner, pattern);
    }
    // A cancelled run (crate::cancel) skipped its remaining tasks.
    cancel.check()?;
    Ok(())
}

/// The kernel behind [`prune`].
fn prune_into<T: Element>(x: &[T], out: &mut [T], dtype: Dtype, inner: usize, pattern: Pattern) {
    // A closure per key, so the hot loop holds no match. The key is `min(code & low, cap)`:
    // for floats the magnitude, with every NaN at `cap`, just above Inf; for unsigned codes
    // (`low` and `cap` all ones) the code itself. Sharing one closure, both rules share one set
    // of kernels: 14 per element width instead of 21, compiled in each crate that calls
    // `prune` (the binding, the integration tests).
    let (low, cap) = match dtype.key_rule() {
        KeyRule::Float { sign, nan_above } => (T::from_u64(sign - 1), T::from_u64(nan_above + 1)),
        KeyRule::Unsigned => (T::from_u64(u64::MAX), T::from_u64(u64::MAX)),
        KeyRule::Signed { .. } => {
            return by_pattern(x, out, inner, pattern, |c: T| c.abs_signed());
        }
    };
    by_pattern(x, out, inner, pattern, move |c: T| c.and(low).min(cap));
}

fn by_pattern<T: Element, F: Fn(T) -> T + Sync>(
    x: &[T], out: &mut [T], inner: usize, pattern: Pattern, key: F,
) {
    // Constant n and m let the compiler unroll everything per group and vectorise across groups.
    match (pattern.n(), pattern.m()) {
        (1, 2) => run::<T, F, 1, 2>(x, out, inner, &key),
        (2, 4) => run::<T, F, 2, 4>(x, out, inner, &key),
        (1, 4) => run::<T, F, 1, 4>(x, out, inner, &key),
        (2, 8) => run::<T, F, 2, 8>(x, out, inner, &key),
        (4, 8) => run::<T, F, 4, 8>(x, out, inner, &key),
        (4, 12) => run::<T, F, 4, 12>(x, out, inner, &key),
        _ => run::<T, F, 4, 16>(x, out, inner, &key),
    }
}

fn run<T: Element, F: Fn(T) -> T + Sync, const N: usize, const M: usize>(
    x: &[T], out: &mut [T], inner: usize, key: &F,
) {
    #[cfg(target_arch = "x86_64")]
    let wide = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    let kernel = |src: &[T], dst: &mut [T]| {
        if wide {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F and AVX-512BW were detected above.
            unsafe {
                task_avx512::<T, F, N, M>(src, dst, inner, key)
            };
        } else {
            task::<T, F, N, M>(src, dst, inner, key);
        }
    };
    in_tasks(x, out, blocks_per_task(M, inner) * M * inner, &kernel);
}

/// Runs `kernel` on the pool over tasks of `chunk` elements of `x` and `out`. The kernel comes
/// as a trait object (one indirect call per task): the parallel loop is then compiled once per
/// element type instead of once per pattern, key rule and instruction set.
fn in_tasks<T: Element>(
    x: &[T], out: &mut [T], chunk: usize, kernel: &(dyn Fn(&[T], &mut [T]) + Sync),
) {
    let cancel = crate::cancel::current();
    out.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .filter(|_| !cancel.is_cancelled())
        .for_each(|(dst, src)| kernel(src, dst));
}

/// [`task`] compiled for AVX-512 (the same loops, 512-bit lanes: one group per 8- to 64-bit
/// lane; same results, since the loops only compare and select integers).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn task_avx512<T: Element, F: Fn(T) -> T, const N: usize, const M: usize>(
    src: &[T], dst: &mut [T], inner: usize, key: &F,
) {
    task::<T, F, N, M>(src, dst, inner, key);
}

/// One task: whole blocks of `M * inner` elements.
///
/// Every loop is written so that the compiler vectorises it across groups, even for baseline
/// x86-64 (SSE2): one group per SIMD lane, with the `M` elements of a group in `M` registers.
/// The groups are copied tile by tile into `M` local columns ([`select_tile`]), except along the
/// last axis for 1:2, where reading the pairs in place is faster. Measured on bf16 with one
/// thread and no page faults, that gave 5-8 GB/s for m <= 8 and about 2 GB/s for 4:12 and 4:16;
/// AVX2 builds of the same loops gained at most about 25%, so there is no run-time dispatch.
/// A whole call is bound by writing its fresh output anyway.
#[inline(always)]
fn task<T: Element, F: Fn(T) -> T, const N: usize, const M: usize>(
    src: &[T], dst: &mut [T], inner: usize, key: &F,
) {
    if inner == 1 {
        if M == 2 {
            direct_groups::<T, F, N, M>(src, dst, key);
        } else {
            tiled_groups::<T, F, N, M>(src, dst, key);
        }
        return;
    }
    let block = M * inner;
    for (d, s) in dst.chunks_exact_mut(block).zip(src.chunks_exact(block)) {
        strided_block::<T, F, N, M>(s, d, inner, key);
    }
}

/// Which elements of a group are kept, by the n-th largest key `t`: every key above `t`, and of
/// the keys equal to `t` the lowest-indexed ones until `N` are kept. `t` comes from inserting
/// each key into a descending list of the `N` largest (`2 N M` min/max operations).
#[inline(always)]
fn keep_top<T: Element, const N: usize, const M: usize>(keys: &[T; M]) -> [bool; M] {
    let mut top = [T::ZERO; N];
    for &key in keys {
        let mut x = key;
        for slot in top.iter_mut() {
            let hi = (*slot).max(x);
            x = (*slot).min(x);
            *slot = hi;
        }
    }
    let t = top[N - 1];
    // Counters in the element's own width keep one group per SIMD lane.
    let one = |b: bool| T::from_u64(b as u64);
    let mut above = T::ZERO;
    for &key in keys {
        above = above.wrapping_add(one(key > t));
    }
    // Keep ties while `above + ties_before < N`.
    let limit = T::from_u64(N as u64);
    let mut taken = above;
    let mut kept = [false; M];
    for (k, &key) in keys.iter().enumerate() {
        let tie = key == t;
        kept[k] = (key > t) | (tie & (taken < limit));
        taken = taken.wrapping_add(one(tie));
    }
    kept
}

/// Groups of `M` adjacent elements read in place (the compiler de-interleaves across groups).
#[inline(always)]
fn direct_groups<T: Element, F: Fn(T) -> T, const N: usize, const M: usize>(
    src: &[T], dst: &mut [T], key: &F,
) {
    for (d, s) in dst.chunks_exact_mut(M).zip(src.chunks_exact(M)) {
        let vals: [T; M] = std::array::from_fn(|k| s[k]);
        let keys: [T; M] = std::array::from_fn(|k| key(vals[k]));
        let kept = keep_top::<T, N, M>(&keys);
        for k in 0..M {
            d[k] = if kept[k] { vals[k] } else { T::ZERO };
        }
    }
}

/// Groups per tile of the selection loop.
const TILE: usize = 128;

/// Group `i` is element `i` of each of the `M` columns of a tile (the first `len` of them). The
/// loop over `i` reads and writes `M` unit-stride streams of local arrays, which the compiler
/// can prove distinct, so it vectorises with one group per SIMD lane even for baseline x86-64.
/// (Computing on the caller's slices instead left it scalar, up to 4x slower.)
#[inline(always)]
fn select_tile<T: Element, F: Fn(T) -> T, const N: usize, const M: usize>(
    ins: &[[T; TILE]; M], outs: &mut [[T; TILE]; M], len: usize, key: &F,
) {
    for i in 0..len.min(TILE) {
        let vals: [T; M] = std::array::from_fn(|k| ins[k][i]);
        let keys: [T; M] = std::array::from_fn(|k| key(vals[k]));
        let kept = keep_top::<T, N, M>(&keys);
        for k in 0..M {
            outs[k][i] = if kept[k] { vals[k] } else { T::ZERO };
        }
    }
}

/// Groups of `M` adjacent elements (the last axis), transposed tile by tile into columns.
#[inline(always)]
fn tiled_groups<T: Element, F: Fn(T) -> T, const N: usize, const M: usize>(
    src: &[T], dst: &mut [T], key: &F,
) {
    let mut ins = [[T::ZERO; TILE]; M];
    let mut outs = [[T::ZERO; TILE]; M];
    for (d, s) in dst.chunks_mut(TILE * M).zip(src.chunks(TILE * M)) {
        let groups = s.len() / M;
        for (g, grp) in s.chunks_exact(M).enumerate() {
            for k in 0..M {
                ins[k][g] = grp[k];
            }
        }
        select_tile::<T, F, N, M>(&ins, &mut outs, groups, key);
        for (g, grp) in d.chunks_exact_mut(M).enumerate() {
            for k in 0..M {
                grp[k] = outs[k][g];
            }
        }
    }
}

/// One block of `M` rows of `inner` elements (an inner axis): group `i` is column `i`, copied
/// tile by tile into local columns.
#[inline(always)]
fn strided_block<T: Element, F: Fn(T) -> T, const N: usize, const M: usize>(
    src: &[T], dst: &mut [T], inner: usize, key: &F,
) {
    let mut ins = [[T::ZERO; TILE]; M];
    let mut outs = [[T::ZERO; TILE]; M];
    let mut i0 = 0;
    while i0 < inner {
        let len = (inner - i0).min(TILE);
        for (k, col) in ins.iter_mut().enumerate() {
            if let Some(row) = src.get(k * inner + i0..k * inner + i0 + len) {
                col[..len].copy_from_slice(row);
            }
        }
        select_tile::<T, F, N, M>(&ins, &mut outs, len, key);
        for (k, col) in outs.iter().enumerate() {
            if let Some(row) = dst.get_mut(k * inner + i0..k * inner + i0 + len) {
                row.copy_from_slice(&col[..len]);
            }
        }
        i0 += len;
    }
}
