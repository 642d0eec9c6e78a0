//! Tiles: access patterns into the machine's memories, as NKI tiles are.
//!
//! A tile is a tensor id, a memory, a dtype, a partition range and a free-dimension access
//! pattern: up to [`MAX_FREE_DIMS`] `(size, stride)` pairs in elements, outermost first, from a
//! byte offset. In SBUF and PSUM the partitions are consecutive hardware partitions and every
//! partition uses the same free pattern (trn2_facts.md 4.3: "all active partitions must follow
//! the same F dimension access pattern", \[S2\]); the offset is the byte address within each
//! partition. In HBM, which has no partitions, the "partition" axis is the tile's first axis
//! with its own element stride (`partition_step`), and the offset is the byte address within
//! the tensor's buffer.
//!
//! Engines read a tile in its logical order: partition by partition, and within a partition in
//! C order of the free dimensions.

use crate::memory::Space;

use super::dtype::Dtype;

/// Free dimensions of a tile (the engines' access patterns are up to 4-D, trn2_facts.md 4.3).
pub const MAX_FREE_DIMS: usize = 4;

/// The index of a tensor in the machine's tensor table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

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

    /// Elements per partition.
    pub fn free_size(&self) -> usize {
        self.dims().map(|(s, _)| s as usize).product()
    }

    /// All elements.
    pub fn elements(&self) -> usize {
        self.partitions as usize * self.free_size()
    }

    /// The pattern with size-1 dimensions dropped and contiguous neighbours merged: the fewest
    /// `(size, stride)` pairs that visit the same addresses in the same order. Empty for a
    /// single element per partition.
    pub fn canonical(&self) -> Canonical {
        let mut c = Canonical {
            n: 0,
            dims: [(0, 0); MAX_FREE_DIMS],
        };
        for (size, stride) in self.dims() {
            if size == 1 {
                continue;
            }
            if c.n > 0 {
                let (ps, pst) = c.dims[c.n - 1];
                if pst == stride * size as i64 {
                    c.dims[c.n - 1] = (ps * size as u64, stride);
                    continue;
                }
            }
            c.dims[c.n] = (size as u64, stride);
            c.n += 1;
        }
        c
    }

    /// `(min, max)` element offset (relative to `offset`, in elements) the free pattern
    /// reaches; `(0, 0)` when it has one element.
    pub fn free_extent(&self) -> (i64, i64) {
        let (mut lo, mut hi) = (0i64, 0i64);
        for (size, stride) in self.dims() {
            let reach = (size as i64 - 1) * stride;
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

/// The mask of partitions `start .. start + count` (count <= 128).
pub fn partition_mask(start: u32, count: u32) -> u128 {
    let ones = if count >= 128 {
        u128::MAX
    } else {
        (1u128 << count) - 1
    };
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
        self.dims[..self.n.saturating_sub(1)]
            .iter()
            .map(|&(s, _)| s as usize)
            .product()
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
            tensor: TensorId(0),
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
    fn masks() {
        assert_eq!(partition_mask(0, 128), u128::MAX);
        assert_eq!(partition_mask(32, 2), 0b11 << 32);
        assert_eq!(partition_mask(96, 32), u128::MAX << 96);
    }
}
