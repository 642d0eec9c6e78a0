//! Tiles: access patterns into the machine's memories, as NKI tiles are.
//!
//! A tile is a tensor id, a memory, a dtype, a partition range and a free-dimension access
//! pattern: up to [`MAX_FREE_DIMS`] `(size, stride)` pairs in elements, outermost first, from a
//! byte offset. In SBUF and PSUM the partitions are consecutive hardware partitions and every
//! partition uses the same free pattern (\[S2\]: "all active partitions must follow
//! the same F dimension access pattern", \[S2\]); the offset is the byte address within each
//! partition. In HBM, which has no partitions, the "partition" axis is the tile's first axis
//! with its own element stride (`partition_step`), and the offset is the byte address within
//! the tensor's buffer.
//!
//! Engines read a tile in its logical order: partition by partition, and within a partition in
//! C order of the free dimensions.

use crate::memory::Space;
use crate::{Error, Result};

use super::dtype::Dtype;

/// Free dimensions of a tile (the engines' access patterns are up to 4-D, \[S2\]\[S33\]).
pub const MAX_FREE_DIMS: usize = 4;

/// `error("pattern", ..)` unless an explicit free pattern has 1 to [`MAX_FREE_DIMS`] pairs
/// (`len`).
pub(crate) fn check_pattern_len(
    len: usize, error: fn(&'static str, String) -> Error,
) -> Result<()> {
    if len == 0 || len > MAX_FREE_DIMS {
        return Err(error(
            "pattern",
            format!("{len} [step, num] pairs; a pattern has 1 to {MAX_FREE_DIMS}"),
        ));
    }
    Ok(())
}

/// A tensor of one machine: which machine, the slot in its tensor table, and the slot's
/// generation (a freed slot is reused with a new generation, so an old tile is refused instead
/// of reaching the new tensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId {
    /// The machine (unique per process).
    pub machine: u32,
    /// Slot in the tensor table.
    pub slot: u32,
    /// Generation of the slot.
    pub generation: u32,
}

/// An access pattern into a tensor (see the module doc). Plain data: cheap to copy and slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// The tensor it belongs to (errors name it; the machine checks the tile stays inside it).
    pub tensor: TensorId,
    /// The memory.
    pub space: Space,
    /// Element type.
    pub dtype: Dtype,
    /// First partition (SBUF/PSUM), or 0 (HBM).
    pub start_partition: u32,
    /// Partitions (SBUF/PSUM), or the size of the first axis (HBM).
    pub partitions: u32,
    /// HBM only: elements between consecutive rows of the first axis (0 in SBUF/PSUM).
    pub partition_step: i64,
    /// Byte address of the first element: within each partition (SBUF/PSUM), or within the
    /// tensor's buffer (HBM).
    pub offset: i64,
    /// Number of free dimensions in use.
    pub ndim: u8,
    /// Sizes of the free dimensions, outermost first.
    pub shape: [u32; MAX_FREE_DIMS],
    /// Strides of the free dimensions in elements (may be negative or zero).
    pub strides: [i64; MAX_FREE_DIMS],
}

impl Tile {
    /// The free dimensions in use: `(size, stride)` pairs.
    pub fn dims(&self) -> impl Iterator<Item = (u32, i64)> + '_ {
        (0..self.ndim as usize).map(|d| (self.shape[d], self.strides[d]))
    }

    /// The logical shape: partitions first, then the free sizes.
    pub fn logical_shape(&self) -> Vec<usize> {
        std::iter::once(self.partitions as usize)
            .chain(self.dims().map(|(s, _)| s as usize))
            .collect()
    }

    /// The logical shape without narrowing (for messages about huge views).
    pub fn logical_shape_u64(&self) -> Vec<u64> {
        std::iter::once(self.partitions as u64).chain(self.dims().map(|(s, _)| s as u64)).collect()
    }

    /// Elements per partition, exactly (four `u32` sizes can exceed `u64`: a stride-0 view
    /// repeats memory without holding it).
    pub fn free_size_u128(&self) -> u128 {
        self.dims().map(|(s, _)| s as u128).product()
    }

    /// All elements, exactly.
    pub fn elements_u128(&self) -> u128 {
        self.partitions as u128 * self.free_size_u128()
    }

    /// Elements per partition, saturating at `usize::MAX` (exact for every tile an operand
    /// check accepted: the machine refuses to gather more than the host holds).
    pub fn free_size(&self) -> usize {
        usize::try_from(self.free_size_u128()).unwrap_or(usize::MAX)
    }

    /// All elements, saturating at `usize::MAX` (exact for every checked operand).
    pub fn elements(&self) -> usize {
        usize::try_from(self.elements_u128()).unwrap_or(usize::MAX)
    }

    /// The pattern with size-1 dimensions dropped and contiguous neighbours merged: the fewest
    /// `(size, stride)` pairs that visit the same addresses in the same order. Empty for a
    /// single element per partition.
    pub fn canonical(&self) -> Canonical {
        let mut c = Canonical { n: 0, dims: [(0, 0); MAX_FREE_DIMS] };
        for (size, stride) in self.dims() {
            if size == 1 {
                continue;
            }
            if c.n > 0 {
                let (ps, pst) = c.dims[c.n - 1];
                // Merged only when the products are exact (a huge stride or a repeated
                // dimension could wrap them).
                let merged = (stride as i128 * size as i128 == pst as i128)
                    .then(|| ps.checked_mul(size as u64))
                    .flatten();
                if let Some(ps) = merged {
                    c.dims[c.n - 1] = (ps, stride);
                    continue;
                }
            }
            c.dims[c.n] = (size as u64, stride);
            c.n += 1;
        }
        c
    }

    /// `(min, max)` element offset (relative to `offset`, in elements) the free pattern
    /// reaches; `(0, 0)` when it has one element. In 128-bit arithmetic: four `u32 x i64`
    /// reaches cannot overflow it, so the bounds check built on it is exact.
    pub fn free_extent(&self) -> (i128, i128) {
        let (mut lo, mut hi) = (0i128, 0i128);
        for (size, stride) in self.dims() {
            let reach = (size as i128 - 1) * stride as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        (lo, hi)
    }

    /// Whether the innermost dimension that has more than one element has stride 1 (the
    /// "contiguous" condition of the Vector engine's cost formulas and performance modes).
    pub fn inner_contiguous(&self) -> bool {
        let c = self.canonical();
        c.n == 0 || c.dims[c.n - 1].1 == 1
    }

    /// The partition mask of an SBUF/PSUM tile (bit `p` for partition `p`).
    pub fn partition_mask(&self) -> u128 {
        match self.space {
            Space::Hbm => 1,
            _ => partition_mask(self.start_partition, self.partitions),
        }
    }
}

/// One axis of a [`Tile::slice`]: an index (the axis is dropped, except the partition axis of
/// an on-chip tile, which keeps one partition) or a range with a step, numpy-style (negative
/// positions count from the end; the range is clamped to the axis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// One position.
    At(i64),
    /// `start..stop` by `step` (`None` as in Python's `a[start:stop:step]`).
    Range {
        /// First position.
        start: Option<i64>,
        /// End (exclusive).
        stop: Option<i64>,
        /// Step (non-zero).
        step: i64,
    },
}

impl Index {
    /// `:`, the whole axis.
    pub const ALL: Index = Index::Range { start: None, stop: None, step: 1 };

    /// `(first position, count, step)` on an axis of `size`, as Python's `slice.indices`.
    fn resolve(self, axis: usize, size: i64) -> Result<(i64, i64, i64, bool)> {
        match self {
            Index::At(i) => {
                let j = if i < 0 { i + size } else { i };
                if j < 0 || j >= size {
                    return Err(Error::shape(
                        "index",
                        format!("index {i} is out of range for axis {axis} of size {size}"),
                    ));
                }
                Ok((j, 1, 1, true))
            }
            Index::Range { start, stop, step } => {
                if step == 0 {
                    return Err(Error::value(
                        "index",
                        format!("axis {axis}: slice step cannot be zero"),
                    ));
                }
                let norm = |v: i64, lo: i64, hi: i64| {
                    let v = if v < 0 { v + size } else { v };
                    v.clamp(lo, hi)
                };
                let (lo, hi) = if step > 0 { (0, size) } else { (-1, size - 1) };
                let b = start.map_or(if step > 0 { 0 } else { size - 1 }, |v| norm(v, lo, hi));
                let e = stop.map_or(if step > 0 { size } else { -1 }, |v| norm(v, lo, hi));
                // In 128 bits: a step near i64::MAX (or i64::MIN, whose negation overflows)
                // wrapped the count.
                let (b1, e1, st) = (b as i128, e as i128, step as i128);
                let count = if step > 0 {
                    ((e1 - b1).max(0) + st - 1) / st
                } else {
                    ((b1 - e1).max(0) - st - 1) / -st
                };
                // At most the axis's size.
                Ok((b, count as i64, step, false))
            }
        }
    }
}

/// One index of [`Tile::basic_view`]: a position, or a step-1 range (`None` as in Python's
/// `a[start:stop]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewIndex {
    /// One position (negative counts from the end).
    At(i64),
    /// `start..stop`.
    Range(Option<i64>, Option<i64>),
}

impl Tile {
    /// NKI's basic indexing of the tensor (or view) this tile holds, of logical shape `dims`
    /// and partition axis `pdim` (`None` in HBM; the tile's axes are the logical ones with the
    /// partition axis first), by `key` (one entry per logical axis): the view's tile, logical
    /// shape and partition axis. An index drops its axis, except the
    /// partition axis (kept at size 1) and, on chip, the last free axis when no free axis is
    /// left (a tile stays 2-D); a whole-index key gives shape `[1]`. `None` where the front
    /// end's general rules decide instead: a position or range outside its axis, an empty
    /// range, a key of another length, or an HBM view left with one axis by an index after
    /// it (the legacy dialect's `a[0:128, j]` is a column).
    #[allow(clippy::type_complexity)]
    pub fn basic_view(
        &self, dims: &[usize], pdim: Option<usize>, key: &[ViewIndex],
    ) -> Result<Option<(Tile, Vec<usize>, Option<usize>)>> {
        if key.len() != dims.len() {
            return Ok(None);
        }
        if pdim.is_some_and(|p| p >= dims.len()) {
            return Err(Error::value(
                "pdim",
                format!("axis {pdim:?} of a tensor of {} axes", dims.len()),
            ));
        }
        let on_chip = pdim.is_some();
        let mut shape = Vec::with_capacity(dims.len() + 1);
        let mut mkey = vec![Index::ALL; dims.len()];
        let (mut new_pdim, mut free_kept, mut last_int) = (None, 0, None);
        for (a, (&k, &size)) in key.iter().zip(dims).enumerate() {
            let Ok(size) = i64::try_from(size) else {
                return Ok(None);
            };
            // The machine axis: on chip the partition axis first.
            let m = match pdim {
                Some(p) if a == p => 0,
                Some(p) if a < p => a + 1,
                _ => a,
            };
            match k {
                ViewIndex::Range(start, stop) => {
                    let from_end = |v: i64| if v < 0 { v.saturating_add(size) } else { v };
                    let (b, e) = (start.map_or(0, from_end), stop.map_or(size, from_end));
                    if !(0 <= b && b < e && e <= size) {
                        return Ok(None);
                    }
                    mkey[m] = Index::Range { start, stop, step: 1 };
                    if pdim == Some(a) {
                        new_pdim = Some(shape.len());
                    } else if pdim.is_some_and(|p| a > p) {
                        free_kept += 1;
                    }
                    shape.push((e - b) as usize);
                }
                ViewIndex::At(i) => {
                    if i < -size || i >= size {
                        return Ok(None);
                    }
                    let i = i.rem_euclid(size);
                    mkey[m] = Index::At(i);
                    if pdim == Some(a) {
                        // (`Tile::slice` keeps the partition an index selects.)
                        new_pdim = Some(shape.len());
                        shape.push(1);
                    } else if pdim.is_some_and(|p| a > p) || (!on_chip && !shape.is_empty()) {
                        last_int = Some((a, i, shape.len()));
                    }
                }
            }
        }
        if let Some((a, i, pos)) = last_int {
            if !on_chip && shape.len() == 1 {
                return Ok(None);
            }
            if on_chip && free_kept == 0 {
                mkey[a] = Index::Range { start: Some(i), stop: Some(i + 1), step: 1 };
                shape.insert(pos, 1);
            }
        }
        if shape.is_empty() {
            shape.push(1);
        }
        let view = self.slice(&mkey)?;
        // `dims` must describe this tile: a view of other sizes than its shape says is refused.
        let n = shape.iter().try_fold(1u128, |acc, &d| acc.checked_mul(d as u128));
        if n != Some(view.elements_u128()) {
            return Err(Error::shape(
                "dims",
                format!("{dims:?} do not describe this tile ({:?})", self.logical_shape()),
            ));
        }
        Ok(Some((view, shape, new_pdim)))
    }

    /// The sub-tile selected by `index` (one entry per axis, partition axis first; missing
    /// trailing axes are whole). On-chip tiles keep consecutive partitions (step 1); HBM tiles
    /// slice their first axis freely. Empty selections are refused.
    pub fn slice(&self, index: &[Index]) -> Result<Tile> {
        let nd = 1 + self.ndim as usize;
        if index.len() > nd {
            return Err(Error::shape(
                "index",
                format!("{} indices for a tile of {nd} axes", index.len()),
            ));
        }
        let esize = self.dtype.size() as i64;
        // Axes as (size, stride in elements); the partition axis of an on-chip tile counts
        // partitions.
        let pstride = match self.space {
            Space::Hbm => self.partition_step,
            _ => 0,
        };
        let mut axes: Vec<(i64, i64, bool)> =
            std::iter::once((self.partitions as i64, pstride, true))
                .chain(self.dims().map(|(s, st)| (s as i64, st, false)))
                .collect();
        let mut offset = self.offset;
        let mut start_partition = self.start_partition as i64;
        let mut out: Vec<(i64, i64, bool)> = Vec::new();
        for (axis, ax) in axes.iter_mut().enumerate() {
            let idx = index.get(axis).copied().unwrap_or(Index::ALL);
            let (b, count, step, drop) = idx.resolve(axis, ax.0)?;
            if count == 0 {
                return Err(Error::shape("index", format!("axis {axis}: the selection is empty")));
            }
            let on_chip_partition = ax.2 && self.space != Space::Hbm;
            if on_chip_partition {
                if step != 1 {
                    return Err(Error::value(
                        "index",
                        format!(
                            "the partition axis of an on-chip tile takes consecutive partitions                              (step 1), got step {step}"
                        ),
                    ));
                }
                start_partition += b;
                out.push((count, 0, true));
                continue;
            }
            offset = (b as i128 * ax.1 as i128 * esize as i128)
                .checked_add(offset as i128)
                .and_then(|o| i64::try_from(o).ok())
                .ok_or_else(|| too_far("index", axis))?;
            if !drop {
                let stride = ax.1.checked_mul(step).ok_or_else(|| too_far("index", axis))?;
                out.push((count, stride, ax.2));
            }
        }
        // HBM: if the first axis was dropped, the next axis becomes the partition axis.
        if self.space == Space::Hbm && !out.first().is_some_and(|a| a.2) {
            if let Some(first) = out.first_mut() {
                first.2 = true;
            } else {
                out.push((1, 0, true));
            }
        }
        let (parts, pstep, _) = out[0];
        let free = &out[1..];
        if free.len() > MAX_FREE_DIMS {
            return Err(Error::shape("index", "too many free axes"));
        }
        let mut t = *self;
        t.start_partition = start_partition as u32;
        t.partitions = parts as u32;
        t.partition_step = pstep;
        t.offset = offset;
        t.ndim = free.len().max(1) as u8;
        t.shape = [1; MAX_FREE_DIMS];
        t.strides = [0; MAX_FREE_DIMS];
        for (d, &(s, st, _)) in free.iter().enumerate() {
            t.shape[d] = s as u32;
            t.strides[d] = st;
        }
        if free.is_empty() {
            t.strides[0] = 1;
        }
        Ok(t)
    }

    /// The same elements with the free axes reshaped to `shape` (C order); the free pattern
    /// must be contiguous (one run of stride 1).
    pub fn reshape_free(&self, shape: &[usize]) -> Result<Tile> {
        // Exact: a product that wraps must not match (2**62 + 1 by 4 is not 4 elements).
        let n = shape.iter().try_fold(1u128, |n, &s| n.checked_mul(s as u128));
        if n != Some(self.free_size_u128())
            || shape.is_empty()
            || shape.len() > MAX_FREE_DIMS
            || shape.iter().any(|&s| u32::try_from(s).is_err())
        {
            return Err(Error::shape(
                "shape",
                format!("cannot reshape {} elements per partition to {shape:?}", self.free_size()),
            ));
        }
        let c = self.canonical();
        if !(c.n == 0 || c.n == 1 && c.dims[0].1 == 1) {
            return Err(Error::shape("shape", "only a contiguous free pattern can be reshaped"));
        }
        let mut t = *self;
        t.ndim = shape.len() as u8;
        let mut stride = 1i64;
        for (d, &s) in shape.iter().enumerate().rev() {
            t.shape[d] = s as u32;
            t.strides[d] = stride;
            stride *= s as i64;
        }
        for d in shape.len()..MAX_FREE_DIMS {
            t.shape[d] = 1;
            t.strides[d] = 0;
        }
        Ok(t)
    }

    /// The same bytes as elements of `dtype` (NKI's `.ap(..., dtype=)`: an fp32 scale stored
    /// as four fp8 bytes): one free axis over the tile's bytes. The free pattern must be
    /// contiguous, its bytes (and an HBM tile's row step) a whole number of `dtype`'s
    /// elements, and the offset aligned to one; `ShapeError` naming `dtype` otherwise.
    pub fn view_as(&self, dtype: Dtype) -> Result<Tile> {
        let (old, new) = (self.dtype.size() as u128, dtype.size() as u128);
        let c = self.canonical();
        let bytes = self.free_size_u128() * old;
        let step = self.partition_step as i128 * old as i128;
        let refuse = |why: String| {
            Error::shape(
                "dtype",
                format!("cannot view {} as {}: {why}", self.dtype.name(), dtype.name()),
            )
        };
        if !(c.n == 0 || c.n == 1 && c.dims[0].1 == 1) {
            return Err(refuse("only a contiguous free pattern can be viewed".into()));
        }
        let whole = |x: i128| x % new as i128 == 0;
        if !bytes.is_multiple_of(new) || !whole(step) || !whole(self.offset as i128) {
            return Err(refuse(format!(
                "{bytes} bytes per row at byte {} are not whole {new}-byte elements",
                self.offset
            )));
        }
        let n = u32::try_from(bytes / new).map_err(|_| refuse("too many elements".into()))?;
        let mut t = *self;
        t.dtype = dtype;
        t.partition_step = (step / new as i128) as i64;
        t.ndim = 1;
        t.shape = [1; MAX_FREE_DIMS];
        t.strides = [0; MAX_FREE_DIMS];
        t.shape[0] = n;
        t.strides[0] = 1;
        Ok(t)
    }

    /// A tile of the same place and dtype with an explicit free pattern: `(step, num)` pairs
    /// in elements, outermost first, from `offset` elements past this tile's first element
    /// (NKI's `.ap()`; the machine checks it stays inside the tensor).
    pub fn with_pattern(&self, pattern: &[(i64, u32)], offset: i64) -> Result<Tile> {
        check_pattern_len(pattern.len(), Error::shape)?;
        let mut t = *self;
        t.offset = i64::try_from(offset as i128 * self.dtype.size() as i128 + self.offset as i128)
            .map_err(|_| {
                Error::shape(
                    "offset",
                    format!(
                        "offset {offset} elements from byte {} is beyond any tensor",
                        self.offset
                    ),
                )
            })?;
        t.ndim = pattern.len() as u8;
        t.shape = [1; MAX_FREE_DIMS];
        t.strides = [0; MAX_FREE_DIMS];
        for (d, &(step, num)) in pattern.iter().enumerate() {
            if num == 0 {
                return Err(Error::shape("pattern", "a pattern axis has num = 0"));
            }
            t.shape[d] = num;
            t.strides[d] = step;
        }
        Ok(t)
    }
}

impl Tile {
    /// An HBM tile with its first axis set to `count` rows `step` elements apart (NKI's
    /// `.ap()` on HBM, whose first `[step, count]` pair is free: HBM has no partitions). Used
    /// for transposing and broadcasting DMA access patterns (a step of 0 repeats a row).
    pub fn with_rows(&self, count: u32, step: i64) -> Result<Tile> {
        if self.space != Space::Hbm {
            return Err(Error::value(
                "rows",
                format!(
                    "only an HBM tile has a free first axis; this tile is in {} (its partitions \
                     are consecutive)",
                    self.space.name()
                ),
            ));
        }
        if count == 0 {
            return Err(Error::shape("rows", "a tile has at least one row"));
        }
        let mut t = *self;
        t.partitions = count;
        t.partition_step = step;
        Ok(t)
    }
}

/// The error of a slice whose offset or stride leaves the 64-bit address range.
fn too_far(arg: &str, axis: usize) -> Error {
    Error::shape(arg, format!("axis {axis}: the selection's offset or stride is beyond any tensor"))
}

/// The mask of partitions `start .. start + count` (count <= 128).
pub fn partition_mask(start: u32, count: u32) -> u128 {
    let ones = if count >= 128 { u128::MAX } else { (1u128 << count) - 1 };
    ones << start.min(127)
}

/// A canonical free pattern: at most [`MAX_FREE_DIMS`] `(size, stride)` pairs, no size-1
/// dimension, no two mergeable neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Canonical {
    /// Dimensions in use.
    pub n: usize,
    /// `(size, stride in elements)`, outermost first.
    pub dims: [(u64, i64); MAX_FREE_DIMS],
}

impl Canonical {
    /// Length of one contiguous-or-strided run (the innermost dimension), 1 if none.
    pub fn run_len(&self) -> usize {
        if self.n == 0 {
            1
        } else {
            self.dims[self.n - 1].0 as usize
        }
    }

    /// Stride of the innermost dimension in elements (1 if none).
    pub fn run_stride(&self) -> i64 {
        if self.n == 0 {
            1
        } else {
            self.dims[self.n - 1].1
        }
    }

    /// Number of runs per partition.
    pub fn runs(&self) -> usize {
        self.dims[..self.n.saturating_sub(1)].iter().map(|&(s, _)| s as usize).product()
    }

    /// Calls `f(start)` with the element offset of every run, in order.
    #[inline]
    pub fn for_each_run(&self, mut f: impl FnMut(i64)) {
        let outer = &self.dims[..self.n.saturating_sub(1)];
        match outer {
            [] => f(0),
            [(s0, t0)] => {
                for i in 0..*s0 as i64 {
                    f(i * t0);
                }
            }
            _ => {
                let mut idx = [0u64; MAX_FREE_DIMS];
                let total = self.runs();
                let mut off = 0i64;
                for _ in 0..total {
                    f(off);
                    // Odometer over the outer dimensions, innermost of them fastest.
                    let mut d = outer.len();
                    while d > 0 {
                        d -= 1;
                        idx[d] += 1;
                        off += outer[d].1;
                        if idx[d] < outer[d].0 {
                            break;
                        }
                        off -= outer[d].1 * outer[d].0 as i64;
                        idx[d] = 0;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile(dims: &[(u32, i64)]) -> Tile {
        let mut t = Tile {
            tensor: TensorId { machine: 0, slot: 0, generation: 0 },
            space: Space::Sbuf,
            dtype: Dtype::Fp32,
            start_partition: 0,
            partitions: 4,
            partition_step: 0,
            offset: 0,
            ndim: dims.len() as u8,
            shape: [1; MAX_FREE_DIMS],
            strides: [0; MAX_FREE_DIMS],
        };
        for (d, &(s, st)) in dims.iter().enumerate() {
            t.shape[d] = s;
            t.strides[d] = st;
        }
        t
    }

    #[test]
    fn canonical_merges_contiguous_dims() {
        let c = tile(&[(2, 12), (3, 4), (4, 1)]).canonical();
        assert_eq!((c.n, c.dims[0]), (1, (24, 1)));
        let c = tile(&[(2, 16), (1, 5), (4, 1)]).canonical();
        assert_eq!((c.n, c.dims[0], c.dims[1]), (2, (2, 16), (4, 1)));
        assert_eq!(tile(&[(1, 7)]).canonical().n, 0);
    }

    #[test]
    fn runs_visit_c_order() {
        let c = tile(&[(2, 100), (3, 10), (4, 1)]).canonical();
        let mut starts = Vec::new();
        c.for_each_run(|s| starts.push(s));
        assert_eq!(starts, vec![0, 10, 20, 100, 110, 120]);
        assert_eq!((c.run_len(), c.runs()), (4, 6));
        let t = tile(&[(3, -2), (2, 1)]);
        assert_eq!(t.free_extent(), (-4, 1));
        assert!(t.inner_contiguous());
        assert!(!tile(&[(3, 2)]).inner_contiguous());
    }

    #[test]
    fn slicing_follows_numpy() {
        let t = tile(&[(8, 16), (16, 1)]);
        let r = |a, b, c| Index::Range { start: a, stop: b, step: c };
        let s = t.slice(&[r(Some(1), Some(3), 1), Index::At(2), r(None, None, -2)]).expect("valid");
        assert_eq!((s.start_partition, s.partitions), (1, 2));
        assert_eq!((s.ndim, s.shape[0], s.strides[0]), (1, 8, -2));
        assert_eq!(s.offset, (2 * 16 + 15) * 4);
        assert!(t.slice(&[r(None, None, 2)]).is_err(), "partition step");
        assert!(t.slice(&[Index::At(4)]).is_err(), "out of range");
        assert!(t.slice(&[Index::ALL, r(Some(5), Some(5), 1)]).is_err(), "empty");
        let u = t.reshape_free(&[2, 64]).expect("contiguous per partition? no: 8x16 is");
        assert_eq!((u.shape[0], u.shape[1], u.strides[0]), (2, 64, 64));
    }

    #[test]
    fn masks() {
        assert_eq!(partition_mask(0, 128), u128::MAX);
        assert_eq!(partition_mask(32, 2), 0b11 << 32);
        assert_eq!(partition_mask(96, 32), u128::MAX << 96);
    }
}
