//! The compressed form of an N:M-sparse array: packed values plus packed positions (layout in the
//! module doc of [`crate::sparsity`]).

use rayon::prelude::*;

use super::{blocks_per_task, AxisView, Element, Pattern};
use crate::{Error, Result};

/// An N:M-sparse array in compressed form: `n` values per group of `m` and their positions.
///
/// Built by [`compress()`] or, from stored parts, [`Compressed::from_parts()`]; either way the
/// positions of every group are distinct, ascending and below `m`, so [`decompress`] is
/// unambiguous.
///
/// [`decompress`]: Compressed::decompress
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed<T> {
    values: Vec<T>,
    indices: Vec<u8>,
    view: AxisView,
    pattern: Pattern,
}

/// The first group (in C order of its first element) with too many stored elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    /// `outer * (axis_len / m) + group`.
    block: usize,
    /// Index over the dimensions after the axis.
    inner: usize,
    /// Stored (not all-bits-zero) elements in the group.
    count: usize,
}

/// Geometry shared by compression, validation and decompression.
#[derive(Debug, Clone, Copy)]
struct Plan {
    n: usize,
    m: usize,
    inner: usize,
    bits: u32,
    /// Blocks per parallel task (a multiple of 8).
    blocks_per_task: usize,
}

impl Plan {
    fn new(view: &AxisView, pattern: Pattern) -> Plan {
        Plan {
            n: pattern.n(),
            m: pattern.m(),
            inner: view.inner,
            bits: pattern.index_bits(),
            blocks_per_task: blocks_per_task(pattern.m(), view.inner),
        }
    }
    /// Input (dense) elements per task.
    fn dense_chunk(&self) -> usize {
        self.blocks_per_task * self.m * self.inner
    }
    /// Values per task.
    fn value_chunk(&self) -> usize {
        self.blocks_per_task * self.n * self.inner
    }
    /// Packed index bytes per task (whole, as `blocks_per_task` is a multiple of 8).
    fn index_chunk(&self) -> usize {
        self.value_chunk() * self.bits as usize / 8
    }
}

fn packed_len(count: usize, bits: u32) -> usize {
    count.saturating_mul(bits as usize).div_ceil(8)
}

fn violation_error(view: &AxisView, pattern: Pattern, v: Violation) -> Error {
    let groups = (view.axis_len / pattern.m()).max(1);
    let (o, g) = (v.block / groups, v.block % groups);
    Error::Sparsity {
        arg: "x".into(),
        rule: None,
        message: format!(
            "group {g} along axis {axis} (elements x{index}) has {count} stored elements but \
             pattern {pattern} allows at most {n} per group of {m}; an element counts as stored \
             when its bits are not all zero (so -0.0 and NaN count); prune the array first",
            axis = view.axis,
            index = view.group_index(o, g, v.inner, pattern.m()),
            count = v.count,
            n = pattern.n(),
            m = pattern.m(),
        ),
    }
}

/// Checks that `x` (C-contiguous, `shape`) has at most `n` stored elements in every group of
/// `m` along `axis`, where stored means "bits not all zero". Returns the same errors as
/// [`compress()`] without building anything.
pub fn check<T: Element>(x: &[T], shape: &[usize], axis: isize, pattern: Pattern) -> Result<()> {
    let view = AxisView::new(shape, axis, x.len(), pattern)?;
    if x.is_empty() {
        return Ok(());
    }
    let plan = Plan::new(&view, pattern);
    let cancel = crate::cancel::current();
    let first = x
        .par_chunks(plan.dense_chunk())
        .enumerate()
        .filter(|_| !cancel.is_cancelled())
        .filter_map(|(t, src)| {
            let block0 = t * plan.blocks_per_task;
            src.chunks_exact(plan.m * plan.inner).enumerate().find_map(|(b, blk)| {
                (0..plan.inner).find_map(|i| {
                    let count = (0..plan.m).filter(|&k| blk[k * plan.inner + i] != T::ZERO).count();
                    (count > plan.n).then_some(Violation { block: block0 + b, inner: i, count })
                })
            })
        })
        .min();
    cancel.check()?;
    match first {
        Some(v) => Err(violation_error(&view, pattern, v)),
        None => Ok(()),
    }
}

/// Compresses `x` (C-contiguous, `shape`) to the N:M `pattern` along `axis` (negative counts from
/// the end). Every element whose bits are not all zero is stored bit for bit; a group with more
/// than `n` of them gives [`Error::Sparsity`] naming the first such group in C order (its index in
/// `x`, its count and the limit). A bad shape or axis, or an axis length that is not a multiple
/// of `m`, gives [`Error::Shape`].
pub fn compress<T: Element>(
    x: &[T], shape: &[usize], axis: isize, pattern: Pattern,
) -> Result<Compressed<T>> {
    let layout = CompressedLayout::new(x.len(), shape, axis, pattern)?;
    crate::host::check_alloc("x", "the compressed array", layout.bytes::<T>())?;
    let mut values = vec![T::ZERO; layout.values];
    let mut indices = vec![0u8; layout.index_bytes];
    compress_into(x, &layout, &mut values, &mut indices)?;
    Ok(Compressed { values, indices, view: layout.view, pattern })
}

/// The sizes of the compressed form of an array, validated: what [`compress_into`] fills.
#[derive(Debug, Clone)]
pub struct CompressedLayout {
    view: AxisView,
    pattern: Pattern,
    /// Number of stored values.
    pub values: usize,
    /// Bytes of packed positions.
    pub index_bytes: usize,
}

impl CompressedLayout {
    /// Validates `shape` (of `len` elements) and `axis` for `pattern` (errors as [`compress`]).
    pub fn new(
        len: usize, shape: &[usize], axis: isize, pattern: Pattern,
    ) -> Result<CompressedLayout> {
        let view = AxisView::new(shape, axis, len, pattern)?;
        let values = len / pattern.m() * pattern.n();
        let index_bytes = packed_len(values, pattern.index_bits());
        Ok(CompressedLayout { view, pattern, values, index_bytes })
    }

    /// Bytes of values plus packed positions, for an element type `T`.
    pub fn bytes<T: Element>(&self) -> u128 {
        self.values as u128 * (T::BITS / 8) as u128 + self.index_bytes as u128
    }

    /// Shape of the values: the dense shape with the axis length times `n / m`.
    pub fn values_shape(&self) -> Vec<usize> {
        let mut s = self.view.shape.clone();
        s[self.view.axis] = self.view.axis_len / self.pattern.m() * self.pattern.n();
        s
    }

    /// The sparsity axis, in `0..ndim`.
    pub fn axis(&self) -> usize {
        self.view.axis
    }
}

/// [`compress`] into caller-provided buffers of exactly `layout.values` values and
/// `layout.index_bytes` bytes (a numpy array, say: fresh pages cost as much as the work). Every
/// element of both is written when it returns `Ok`; after an error their contents are unspecified.
pub fn compress_into<T: Element>(
    x: &[T], layout: &CompressedLayout, values: &mut [T], indices: &mut [u8],
) -> Result<()> {
    if x.len() != layout.view.len() {
        return Err(Error::shape(
            "x",
            format!("{} elements, the layout is for {}", x.len(), layout.view.len()),
        ));
    }
    if values.len() != layout.values || indices.len() != layout.index_bytes {
        return Err(Error::shape(
            "out",
            format!(
                "buffers of {} values and {} index bytes, need {} and {}",
                values.len(),
                indices.len(),
                layout.values,
                layout.index_bytes
            ),
        ));
    }
    let plan = Plan::new(&layout.view, layout.pattern);
    let cancel = crate::cancel::current();
    if !x.is_empty() {
        let first = match plan.m {
            2 => compress_all::<T, 2>(x, values, indices, plan),
            4 => compress_all::<T, 4>(x, values, indices, plan),
            8 => compress_all::<T, 8>(x, values, indices, plan),
            12 => compress_all::<T, 12>(x, values, indices, plan),
            _ => compress_all::<T, 16>(x, values, indices, plan),
        };
        cancel.check()?;
        if let Some(v) = first {
            return Err(violation_error(&layout.view, layout.pattern, v));
        }
    }
    Ok(())
}

fn compress_all<T: Element, const M: usize>(
    x: &[T], values: &mut [T], indices: &mut [u8], plan: Plan,
) -> Option<Violation> {
    let table = group_codes(plan.n, M, plan.bits);
    let kernel = |src: &[T], vals: &mut [T], packed: &mut [u8], block0: usize| {
        if plan.inner == 1 {
            compress_rows::<T, M>(src, vals, packed, plan, &table, block0)
        } else {
            compress_blocks::<T, M>(src, vals, packed, plan, block0)
        }
    };
    in_tasks(x, values, indices, plan, &kernel)
}

/// One task's compression: its dense elements, values and packed indices, and its first block.
type TaskKernel<'k, T> = dyn Fn(&[T], &mut [T], &mut [u8], usize) -> Option<Violation> + Sync + 'k;

/// Runs `kernel` on the pool over the tasks of `plan`: the first violation, if any. The kernel
/// comes as a trait object (one indirect call per task), so the parallel loop is compiled once
/// per element type, not once per group size.
fn in_tasks<T: Element>(
    x: &[T], values: &mut [T], indices: &mut [u8], plan: Plan, kernel: &TaskKernel<'_, T>,
) -> Option<Violation> {
    let cancel = crate::cancel::current();
    x.par_chunks(plan.dense_chunk())
        .zip(values.par_chunks_mut(plan.value_chunk()))
        .zip(indices.par_chunks_mut(plan.index_chunk()))
        .enumerate()
        .filter(|_| !cancel.is_cancelled())
        .filter_map(|(t, ((src, vals), packed))| {
            kernel(src, vals, packed, t * plan.blocks_per_task)
        })
        .min()
}

/// The slots of one group: its stored positions (bit mask `stored`) plus the lowest free
/// positions up to `n` in all, ascending, as a bit mask.
#[inline(always)]
fn slot_mask(stored: u32, n: usize) -> u32 {
    let mut sel = stored;
    for _ in stored.count_ones() as usize..n {
        sel |= !sel & sel.wrapping_add(1);
    }
    sel
}

/// A group's `n` positions packed as in the stream (slot `s` at bits `s*bits ..`), for a group
/// with at most `n` stored elements (set bits of `stored`).
#[inline(always)]
fn group_code(stored: u32, n: usize, bits: u32) -> u32 {
    let mut sel = slot_mask(stored, n);
    let mut code = 0u32;
    for s in 0..n {
        code |= sel.trailing_zeros() << (s as u32 * bits);
        sel &= sel.wrapping_sub(1);
    }
    code
}

/// [`group_code`] of every stored mask, for group sizes up to 8 (at most 256 entries); empty
/// for larger groups, which compute it per group.
fn group_codes(n: usize, m: usize, bits: u32) -> Vec<u32> {
    if m > 8 {
        return Vec::new();
    }
    (0..1u32 << m)
        .map(
            |stored| {
                if stored.count_ones() as usize > n {
                    0
                } else {
                    group_code(stored, n, bits)
                }
            },
        )
        .collect()
}

/// Writes codes of up to 32 bits LSB-first into a byte stream.
struct BitWriter<'a> {
    out: std::slice::IterMut<'a, u8>,
    acc: u64,
    filled: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut [u8]) -> Self {
        BitWriter { out: out.iter_mut(), acc: 0, filled: 0 }
    }
    #[inline(always)]
    fn put(&mut self, code: u32, bits: u32) {
        self.acc |= (code as u64) << self.filled;
        self.filled += bits;
        while self.filled >= 8 {
            if let Some(b) = self.out.next() {
                *b = self.acc as u8;
            }
            self.acc >>= 8;
            self.filled -= 8;
        }
    }
    fn finish(mut self) {
        if self.filled > 0 {
            if let Some(b) = self.out.next() {
                *b = self.acc as u8;
            }
        }
    }
}

/// Reads codes of up to 32 bits LSB-first from a byte stream (missing bytes read as zero).
struct BitReader<'a> {
    src: std::slice::Iter<'a, u8>,
    acc: u64,
    avail: u32,
}

impl<'a> BitReader<'a> {
    fn new(src: &'a [u8]) -> Self {
        BitReader { src: src.iter(), acc: 0, avail: 0 }
    }
    #[inline(always)]
    fn get(&mut self, bits: u32) -> u32 {
        while self.avail < bits {
            self.acc |= (self.src.next().copied().unwrap_or(0) as u64) << self.avail;
            self.avail += 8;
        }
        let v = (self.acc & ((1u64 << bits) - 1)) as u32;
        self.acc >>= bits;
        self.avail -= bits;
        v
    }
}

/// Compression along the last axis: a group's positions are consecutive in the stream, so each
/// group writes its whole code at once.
fn compress_rows<T: Element, const M: usize>(
    src: &[T], vals: &mut [T], packed: &mut [u8], plan: Plan, table: &[u32], block0: usize,
) -> Option<Violation> {
    let (n, bits) = (plan.n, plan.bits);
    let pos_mask = (1u32 << bits) - 1;
    let mut w = BitWriter::new(packed);
    for (b, (s, v)) in src.chunks_exact(M).zip(vals.chunks_exact_mut(n)).enumerate() {
        let group: [T; M] = std::array::from_fn(|k| s[k]);
        let mut stored = 0u32;
        let mut count = 0usize;
        for (k, &e) in group.iter().enumerate() {
            stored |= ((e != T::ZERO) as u32) << k;
            count += (e != T::ZERO) as usize;
        }
        if count > n {
            return Some(Violation { block: block0 + b, inner: 0, count });
        }
        let code = match table.get(stored as usize) {
            Some(&c) => c,
            None => group_code(stored, n, bits),
        };
        for (slot, value) in v.iter_mut().enumerate() {
            let k = (code >> (slot as u32 * bits)) & pos_mask;
            *value = group[(k as usize).min(M - 1)];
        }
        w.put(code, n as u32 * bits);
    }
    w.finish();
    None
}

/// Compression along an inner axis: group `i` of a block is column `i` of `M` rows of `inner`.
fn compress_blocks<T: Element, const M: usize>(
    src: &[T], vals: &mut [T], packed: &mut [u8], plan: Plan, block0: usize,
) -> Option<Violation> {
    let (n, inner) = (plan.n, plan.inner);
    let mut positions = vec![0u8; vals.len()];
    for (b, ((s, v), p)) in src
        .chunks_exact(M * inner)
        .zip(vals.chunks_exact_mut(n * inner))
        .zip(positions.chunks_exact_mut(n * inner))
        .enumerate()
    {
        for i in 0..inner {
            let group: [T; M] = std::array::from_fn(|k| s[k * inner + i]);
            let mut stored = 0u32;
            for (k, &e) in group.iter().enumerate() {
                stored |= ((e != T::ZERO) as u32) << k;
            }
            let count = stored.count_ones() as usize;
            if count > n {
                return Some(Violation { block: block0 + b, inner: i, count });
            }
            let mut sel = slot_mask(stored, n);
            for slot in 0..n {
                let k = (sel.trailing_zeros() as usize).min(M - 1);
                sel &= sel.wrapping_sub(1);
                v[slot * inner + i] = group[k];
                p[slot * inner + i] = k as u8;
            }
        }
    }
    pack_into(&positions, plan.bits, packed);
    None
}

/// Packs positions of `bits` bits each LSB-first into a little-endian bit stream (module doc).
/// Only the low `bits` bits of each position are used.
pub fn pack_indices(positions: &[u8], bits: u32) -> Vec<u8> {
    let bits = bits.clamp(1, 8);
    let mut out = vec![0u8; packed_len(positions.len(), bits)];
    pack_into(positions, bits, &mut out);
    out
}

fn pack_into(positions: &[u8], bits: u32, out: &mut [u8]) {
    let mask = (1u64 << bits) - 1;
    let mut acc = 0u64;
    let mut filled = 0u32;
    let mut dst = out.iter_mut();
    for &p in positions {
        acc |= (p as u64 & mask) << filled;
        filled += bits;
        if filled >= 8 {
            if let Some(d) = dst.next() {
                *d = acc as u8;
            }
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        if let Some(d) = dst.next() {
            *d = acc as u8;
        }
    }
}

/// The positions of `count` values from the packed `indices` of `pattern` (what
/// `SparseTensor.positions` shows), after checking that `indices` holds exactly that many:
/// `ShapeError` on `indices` otherwise.
pub fn positions(indices: &[u8], pattern: Pattern, count: usize) -> Result<Vec<u8>> {
    let need = (count as u128 * pattern.index_bits() as u128).div_ceil(8);
    if need != indices.len() as u128 {
        return Err(Error::shape(
            "indices",
            format!("{count} positions take {need} bytes, got {}", indices.len()),
        ));
    }
    crate::host::check_alloc("indices", "the positions", count as u128)?;
    Ok(unpack_indices(indices, pattern.index_bits(), count))
}

/// Unpacks `count` positions of `bits` bits each from a stream written by [`pack_indices`];
/// bytes missing from a short stream read as zero.
pub fn unpack_indices(packed: &[u8], bits: u32, count: usize) -> Vec<u8> {
    let bits = bits.clamp(1, 8);
    let mut out = vec![0u8; count];
    unpack_into(packed, bits, &mut out);
    out
}

fn unpack_into(packed: &[u8], bits: u32, out: &mut [u8]) {
    let mask = (1u64 << bits) - 1;
    let mut acc = 0u64;
    let mut avail = 0u32;
    let mut src = packed.iter();
    for o in out.iter_mut() {
        if avail < bits {
            acc |= (src.next().copied().unwrap_or(0) as u64) << avail;
            avail += 8;
        }
        *o = (acc & mask) as u8;
        acc >>= bits;
        avail -= bits;
    }
}

impl<T: Element> Compressed<T> {
    /// Rebuilds a compressed array from its parts: `values` (shape [`values_shape`]) and the
    /// packed positions `indices`, for an original array of `shape` compressed along `axis`.
    /// The parts are checked: their sizes ([`Error::Shape`]) and that every group's positions are
    /// strictly ascending and below `m` ([`Error::Sparsity`] on `indices`).
    ///
    /// [`values_shape`]: Compressed::values_shape
    pub fn from_parts(
        values: Vec<T>, indices: Vec<u8>, shape: &[usize], axis: isize, pattern: Pattern,
    ) -> Result<Compressed<T>> {
        let len = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::shape("shape", format!("shape {shape:?} is too large")))?;
        let view = AxisView::new(shape, axis, len, pattern)?;
        let plan = Plan::new(&view, pattern);
        let value_count = len / plan.m * plan.n;
        if values.len() != value_count {
            return Err(Error::shape(
                "values",
                format!(
                    "a {pattern} array of shape {shape:?} has {value_count} values, got {}",
                    values.len()
                ),
            ));
        }
        let want = packed_len(value_count, plan.bits);
        if indices.len() != want {
            return Err(Error::shape(
                "indices",
                format!(
                    "{value_count} positions of {} bits take {want} bytes, got {}",
                    plan.bits,
                    indices.len()
                ),
            ));
        }
        let cancel = crate::cancel::current();
        let bad = if value_count == 0 {
            None
        } else {
            indices
                .par_chunks(plan.index_chunk())
                .enumerate()
                .filter(|_| !cancel.is_cancelled())
                .filter_map(|(t, packed)| {
                    let count =
                        plan.value_chunk().min(value_count.saturating_sub(t * plan.value_chunk()));
                    let pos = unpack_indices(packed, plan.bits, count);
                    let block0 = t * plan.blocks_per_task;
                    pos.chunks_exact(plan.n * plan.inner).enumerate().find_map(|(b, blk)| {
                        (0..plan.inner).find_map(|i| {
                            let group: Vec<u8> =
                                (0..plan.n).map(|s| blk[s * plan.inner + i]).collect();
                            let ok = group.iter().all(|&p| (p as usize) < plan.m)
                                && group.windows(2).all(|w| w[0] < w[1]);
                            (!ok).then_some((block0 + b, i, group))
                        })
                    })
                })
                .min()
        };
        cancel.check()?;
        if let Some((block, i, group)) = bad {
            let groups = view.axis_len / plan.m;
            let (o, g) = (block / groups.max(1), block % groups.max(1));
            return Err(Error::Sparsity {
                arg: "indices".into(),
                rule: None,
                message: format!(
                    "the positions {group:?} of group {g} along axis {} (elements x{}) are not \
                     strictly ascending within 0..{}",
                    view.axis,
                    view.group_index(o, g, i, plan.m),
                    plan.m
                ),
            });
        }
        Ok(Compressed { values, indices, view, pattern })
    }

    /// [`Compressed::decompress`] after checking that the host can hold the dense array
    /// (`CapacityError`), and `Error::Interrupted` if it was cancelled (`crate::cancel`).
    pub fn decompress_checked(&self) -> Result<Vec<T>> {
        let bytes = self.view.len() as u128 * (T::BITS / 8) as u128;
        crate::host::check_alloc("shape", "the dense array", bytes)?;
        let cancel = crate::cancel::current();
        let out = self.decompress();
        cancel.check()?;
        Ok(out)
    }

    /// The stored values, C-contiguous with shape [`Compressed::values_shape`].
    pub fn values(&self) -> &[T] {
        &self.values
    }

    /// The values, by move.
    pub fn into_values(self) -> Vec<T> {
        self.values
    }

    /// The packed positions (`ceil(log2 m)` bits each, module doc).
    pub fn packed_indices(&self) -> &[u8] {
        &self.indices
    }

    /// The positions unpacked, one byte each, in the order (and shape) of the values.
    pub fn indices(&self) -> Vec<u8> {
        unpack_indices(&self.indices, self.pattern.index_bits(), self.values.len())
    }

    /// Shape of the original (dense) array.
    pub fn shape(&self) -> &[usize] {
        &self.view.shape
    }

    /// Shape of the values: the dense shape with the axis length times `n / m`.
    pub fn values_shape(&self) -> Vec<usize> {
        let mut s = self.view.shape.clone();
        s[self.view.axis] = self.view.axis_len / self.pattern.m() * self.pattern.n();
        s
    }

    /// The sparsity axis, in `0..ndim`.
    pub fn axis(&self) -> usize {
        self.view.axis
    }

    /// The pattern.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// Bytes held: values plus packed positions.
    pub fn nbytes(&self) -> usize {
        self.values.len() * (T::BITS as usize / 8) + self.indices.len()
    }

    /// The dense array, bit for bit the one that was compressed (free slots hold all-bits-zero
    /// codes at positions that were all-bits-zero).
    ///
    /// Under a cancelled token (`crate::cancel`) the result is incomplete: check the token
    /// afterwards, or call [`Compressed::decompress_checked`].
    pub fn decompress(&self) -> Vec<T> {
        let mut out = vec![T::ZERO; self.view.len()];
        if out.is_empty() {
            return out;
        }
        let plan = Plan::new(&self.view, self.pattern);
        let (n, m, inner) = (plan.n, plan.m, plan.inner);
        let cancel = crate::cancel::current();
        out.par_chunks_mut(plan.dense_chunk())
            .zip(self.values.par_chunks(plan.value_chunk()))
            .zip(self.indices.par_chunks(plan.index_chunk()))
            .filter(|_| !cancel.is_cancelled())
            .for_each(|((dst, vals), packed)| {
                if inner == 1 {
                    // Along the last axis a group's positions are one code of n * bits bits.
                    let pos_mask = (1u32 << plan.bits) - 1;
                    let mut r = BitReader::new(packed);
                    for (d, v) in dst.chunks_exact_mut(m).zip(vals.chunks_exact(n)) {
                        let code = r.get(n as u32 * plan.bits);
                        for (s, &val) in v.iter().enumerate() {
                            let k = (code >> (s as u32 * plan.bits)) & pos_mask;
                            if let Some(slot) = d.get_mut(k as usize) {
                                *slot = val;
                            }
                        }
                    }
                    return;
                }
                let pos = unpack_indices(packed, plan.bits, vals.len());
                for ((d, v), p) in dst
                    .chunks_exact_mut(m * inner)
                    .zip(vals.chunks_exact(n * inner))
                    .zip(pos.chunks_exact(n * inner))
                {
                    for ((j, &val), &k) in v.iter().enumerate().zip(p) {
                        let i = j % inner;
                        if let Some(slot) = d.get_mut(k as usize * inner + i) {
                            *slot = val;
                        }
                    }
                }
            });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_masks_fill_the_lowest_free_positions() {
        assert_eq!(slot_mask(0b0000, 2), 0b0011);
        assert_eq!(slot_mask(0b1000, 2), 0b1001);
        assert_eq!(slot_mask(0b0001, 2), 0b0011);
        assert_eq!(slot_mask(0b0101, 2), 0b0101);
        assert_eq!(slot_mask(0b1000_0000_0000_0000, 4), 0b1000_0000_0000_0111);
    }

    #[test]
    fn three_bit_positions_straddle_bytes() {
        let pos = [7u8, 0, 5, 3, 1, 6, 2, 4, 7];
        let packed = pack_indices(&pos, 3);
        assert_eq!(packed.len(), 4);
        // 7 | 0 << 3 | 5 << 6 (low 2 bits of 5 = 0b01) -> 0b01_000_111
        assert_eq!(packed[0], 0b0100_0111);
        assert_eq!(unpack_indices(&packed, 3, pos.len()), pos);
    }
}
