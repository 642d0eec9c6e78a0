//! PyTorch's semi-structured sparse layout for the CUTLASS backend: the `(packed, meta)` pair
//! that `torch.sparse.to_sparse_semi_structured` builds with
//! `sparse_semi_structured_from_dense_cutlass` and reads back with
//! `sparse_semi_structured_to_dense_cutlass` (`torch/sparse/_semi_structured_conversions.py`),
//! itself a port of CUTLASS's `reorder_meta` (`tools/util/include/cutlass/util/host_reorder.h`)
//! into the `ColumnMajorInterleaved<2>` layout of its sparse GEMM. Written from a reading of that
//! source; the full description, with a worked example, is `docs/sparsity_layout_notes.md`.
//!
//! A dense matrix `[rows, cols]` (row-major) becomes:
//!
//! - **values** `[rows, cols / 2]`: for 16- and 8-bit elements each group of 4 consecutive
//!   elements of a row keeps 2 (2:4), in ascending position; for 32-bit elements each pair keeps
//!   1 (1:2).
//! - **a 4-bit code per group**, `idx0 | idx1 << 2`, with the positions `idx0 < idx1` of the two
//!   kept elements. A group with fewer than two stored elements takes PyTorch's fixed choice: one
//!   stored element at position 0 -> (0, 2); at 1 -> (1, 2); at 2 or 3, or none -> (2, 3). A
//!   32-bit pair is coded as the halves of 16-bit elements: first element kept -> `0b0100`, else
//!   `0b1110`.
//! - **meta words**: `int16` for 16- and 32-bit elements (4 codes per word), `int32` for 8-bit
//!   elements (8 codes); code `j` of a word sits at bits `4j .. 4j + 4`. Row `r`'s word `c` covers
//!   the codes of groups `c * codes_per_word ..`, so the unreordered matrix is
//!   `[rows, meta_cols]` with `meta_cols = cols / (group * codes_per_word)`.
//! - **reordering** for the tensor core's fetch: word `(r, c)` moves to flat position
//!   [`meta_offset`]`(r, c)` of the returned `[rows, meta_cols]` buffer.
//!
//! Stored means "bits not all zero" as everywhere in this module, whereas PyTorch tests
//! `dense != 0`: the two agree except on `-0.0`, which PyTorch drops and trn2core keeps (and
//! which then counts towards the 2 per group).

use rayon::prelude::*;

use super::Element;
use crate::{Error, Result};

/// The metadata words of the CUTLASS layout, with PyTorch's dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CutlassMeta {
    /// `torch.int16` words (16-bit elements, and 32-bit elements as 1:2).
    I16(Vec<i16>),
    /// `torch.int32` words (8-bit elements).
    I32(Vec<i32>),
}

impl CutlassMeta {
    /// Number of words.
    pub fn len(&self) -> usize {
        match self {
            CutlassMeta::I16(w) => w.len(),
            CutlassMeta::I32(w) => w.len(),
        }
    }

    /// Whether there is no word.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Word `i` zero-extended to 32 bits.
    fn word(&self, i: usize) -> Option<u32> {
        match self {
            CutlassMeta::I16(w) => w.get(i).map(|&v| v as u16 as u32),
            CutlassMeta::I32(w) => w.get(i).map(|&v| v as u32),
        }
    }
}

/// A matrix in PyTorch's CUTLASS semi-structured layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cutlass<T> {
    /// Rows of the dense matrix (and of `values` and the meta matrix).
    pub rows: usize,
    /// Columns of the dense matrix.
    pub cols: usize,
    /// The kept elements, `[rows, cols / 2]` row-major.
    pub values: Vec<T>,
    /// The reordered metadata, `[rows, meta_cols]` (see [`Cutlass::meta_shape`]).
    pub meta: CutlassMeta,
}

impl<T: Element> Cutlass<T> {
    /// Shape of `values`.
    pub fn values_shape(&self) -> [usize; 2] {
        [self.rows, self.cols / 2]
    }

    /// Shape of `meta`.
    pub fn meta_shape(&self) -> [usize; 2] {
        match Geometry::new::<T>("x", self.rows, self.cols) {
            Ok(g) => [self.rows, g.meta_cols],
            Err(_) => [self.rows, 0],
        }
    }

    /// Bytes held: values plus meta words.
    pub fn nbytes(&self) -> usize {
        let word = match self.meta {
            CutlassMeta::I16(_) => 2,
            CutlassMeta::I32(_) => 4,
        };
        self.values.len() * (T::BITS as usize / 8) + self.meta.len() * word
    }
}

/// The layout parameters for one element width.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    rows: usize,
    /// Elements per 4-bit code: 4 (2:4) or 2 (1:2 for 32-bit elements).
    group: usize,
    /// Codes per meta word: 4 (int16) or 8 (int32).
    codes_per_word: usize,
    meta_cols: usize,
}

impl Geometry {
    fn new<T: Element>(arg: &str, rows: usize, cols: usize) -> Result<Geometry> {
        let (group, codes_per_word, what) = match T::BITS {
            16 => (4, 4, "16-bit elements (2:4, int16 meta)"),
            8 => (4, 8, "8-bit elements (2:4, int32 meta)"),
            32 => (2, 4, "32-bit elements (1:2, int16 meta)"),
            _ => {
                return Err(Error::format(
                    arg,
                    format!(
                        "the CUTLASS semi-structured layout takes 8-, 16- or 32-bit elements, \
                         not {}-bit",
                        T::BITS
                    ),
                ))
            }
        };
        // The reorder permutes rows within groups of 64 (see `meta_offset`).
        let row_multiple = ROW_GROUP;
        // The column swizzle pairs meta columns, so their count must be even.
        let col_multiple = 2 * group * codes_per_word;
        if !rows.is_multiple_of(row_multiple) || !cols.is_multiple_of(col_multiple) {
            return Err(Error::shape(
                arg,
                format!(
                    "the CUTLASS layout of {what} needs rows a multiple of {row_multiple} and \
                     columns a multiple of {col_multiple}; got {rows} x {cols}"
                ),
            ));
        }
        Ok(Geometry { rows, group, codes_per_word, meta_cols: cols / (group * codes_per_word) })
    }

    fn offset(&self, r: usize, c: usize) -> usize {
        meta_offset(self.rows, r, c)
    }
}

/// Rows permuted together by the reorder, for int16 and int32 meta words alike. (PyTorch's
/// conversion accepts 32 rows for int16 words and 16 for int32, but its offsets then leave the
/// buffer: only multiples of 64 give a permutation.)
const ROW_GROUP: usize = 64;

/// Where CUTLASS's reorder puts meta word `(r, c)` of a `[rows, meta_cols]` matrix of meta
/// words (int16 or int32 alike): the flat index into the reordered buffer.
///
/// As PyTorch's `_calculate_meta_reordering_scatter_offsets` computes it: rows are permuted within
/// groups of 64 by moving the bits of `r % 64`: bit 0 to weight 2, bit 1 to weight 32, bit 2 to
/// weight 1 and bits 3-5 to weights 4-16, i.e.
/// `r' = r / 64 * 64 + (r % 2) * 2 + (r % 8) / 4 + (r % 4) / 2 * 32 + (r % 64) / 8 * 4`
/// (PyTorch writes the third term with `r % G` first, G = 32 or 16, which does not change it);
/// then each 2 x 2 block of `(r', c)` is transposed (an even row with an odd column moves
/// down-left, an odd row with an even column up-right); and the result is stored column-major
/// interleaved by 2: `(c' / 2) * 2 * rows + 2 * r' + c' % 2`. `rows` must be a multiple of 64
/// and `meta_cols` even for this to be a permutation of `0 .. rows * meta_cols`.
pub fn meta_offset(rows: usize, r: usize, c: usize) -> usize {
    let mut dr = r / 64 * 64 + (r % 2) * 2 + (r % 8) / 4 + (r % 4) / 2 * 32 + (r % 64) / 8 * 4;
    let mut dc = c;
    if dr.is_multiple_of(2) && !dc.is_multiple_of(2) {
        dr += 1;
        dc -= 1;
    } else if !dr.is_multiple_of(2) && dc.is_multiple_of(2) {
        dr -= 1;
        dc += 1;
    }
    (dc / 2) * 2 * rows + 2 * dr + dc % 2
}

/// PyTorch's positions `(idx0, idx1)` for a group of 4 whose stored elements are the set bits of
/// `stored` (at most two): the stored positions, padded by PyTorch's fixed choices.
fn pair_positions(stored: u32) -> (usize, usize) {
    let (m0, m1, m3) = (stored & 1 != 0, stored & 2 != 0, stored & 8 != 0);
    match (m0, m1) {
        (true, true) => (0, 1),
        (true, false) => (0, 2 + m3 as usize),
        (false, true) => (1, 2 + m3 as usize),
        (false, false) => (2, 3),
    }
}

/// The dense row-major `[rows, cols]` matrix `dense` in PyTorch's CUTLASS layout: 2:4 for 16- and
/// 8-bit elements, 1:2 for 32-bit elements. Errors: another element width
/// ([`Error::Format`]); `rows` or `cols` not multiples of the layout's tile, or
/// `rows * cols != dense.len()` ([`Error::Shape`]); a group with too many stored (not
/// all-bits-zero) elements ([`Error::Sparsity`], naming the first one in row-major order).
pub fn to_cutlass<T: Element>(dense: &[T], rows: usize, cols: usize) -> Result<Cutlass<T>> {
    let g = Geometry::new::<T>("x", rows, cols)?;
    if rows.checked_mul(cols) != Some(dense.len()) {
        return Err(Error::shape(
            "x",
            format!("{rows} x {cols} does not match the {} elements given", dense.len()),
        ));
    }
    let mut values = vec![T::ZERO; dense.len() / 2];
    let mut words = vec![0u32; rows * g.meta_cols];
    if dense.is_empty() {
        return Ok(Cutlass { rows, cols, values, meta: meta_of::<T>(Vec::new()) });
    }
    let cancel = crate::cancel::current();
    let first_bad = values
        .par_chunks_mut(cols / 2)
        .zip(words.par_chunks_mut(g.meta_cols))
        .zip(dense.par_chunks(cols))
        .enumerate()
        .filter(|_| !cancel.is_cancelled())
        .filter_map(|(r, ((vals, row_words), row))| {
            encode_row(row, vals, row_words, g).map(|e| (r, e))
        })
        .min();
    cancel.check()?;
    if let Some((r, (group, count))) = first_bad {
        let c0 = group * g.group;
        return Err(Error::Sparsity {
            arg: "x".into(),
            rule: None,
            message: format!(
                "row {r}, columns {c0}..{} hold {count} stored elements but the CUTLASS layout \
                 of {}-bit elements keeps at most {} per group of {}; an element counts as \
                 stored when its bits are not all zero",
                c0 + g.group,
                T::BITS,
                g.group / 2,
                g.group
            ),
        });
    }
    let mut reordered = vec![0u32; words.len()];
    for r in 0..rows {
        for c in 0..g.meta_cols {
            if let Some(dst) = reordered.get_mut(g.offset(r, c)) {
                *dst = words[r * g.meta_cols + c];
            }
        }
    }
    Ok(Cutlass { rows, cols, values, meta: meta_of::<T>(reordered) })
}

fn meta_of<T: Element>(words: Vec<u32>) -> CutlassMeta {
    if T::BITS == 8 {
        CutlassMeta::I32(words.into_iter().map(|w| w as i32).collect())
    } else {
        CutlassMeta::I16(words.into_iter().map(|w| w as u16 as i16).collect())
    }
}

/// Encodes one row; on a non-conforming group returns `(group index, stored count)`.
fn encode_row<T: Element>(
    row: &[T], vals: &mut [T], words: &mut [u32], g: Geometry,
) -> Option<(usize, usize)> {
    let per_word = g.group * g.codes_per_word;
    for (c, (word, chunk)) in words.iter_mut().zip(row.chunks_exact(per_word)).enumerate() {
        let mut w = 0u32;
        for (j, grp) in chunk.chunks_exact(g.group).enumerate() {
            let gi = c * g.codes_per_word + j;
            let mut stored = 0u32;
            for (k, &e) in grp.iter().enumerate() {
                stored |= ((e != T::ZERO) as u32) << k;
            }
            let count = stored.count_ones() as usize;
            if count > g.group / 2 {
                return Some((gi, count));
            }
            let code = if g.group == 4 {
                let (i0, i1) = pair_positions(stored);
                vals[2 * gi] = grp[i0];
                vals[2 * gi + 1] = grp[i1];
                (i0 | i1 << 2) as u32
            } else if stored & 1 != 0 {
                vals[gi] = grp[0];
                0b0100
            } else {
                vals[gi] = grp[1];
                0b1110
            };
            w |= code << (4 * j);
        }
        *word = w;
    }
    None
}

/// The dense row-major `[rows, cols]` matrix from PyTorch's CUTLASS layout: `values`
/// `[rows, cols / 2]` and the reordered `meta` (`I16` for 16- and 32-bit elements, `I32` for
/// 8-bit). Every code must name two distinct positions in ascending order (2:4) or be `0b0100`
/// or `0b1110` (1:2), else [`Error::Value`] on `meta`; sizes are checked as in [`to_cutlass`].
pub fn from_cutlass<T: Element>(
    values: &[T], meta: &CutlassMeta, rows: usize, cols: usize,
) -> Result<Vec<T>> {
    let g = Geometry::new::<T>("values", rows, cols)?;
    let dense_len = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::shape("values", format!("{rows} x {cols} is too large")))?;
    let want_values = dense_len / 2;
    if values.len() != want_values {
        return Err(Error::shape(
            "values",
            format!(
                "a {rows} x {cols} matrix has {want_values} values in the CUTLASS layout, got {}",
                values.len()
            ),
        ));
    }
    let want_kind = if T::BITS == 8 { "int32" } else { "int16" };
    let kind_ok =
        matches!((meta, T::BITS == 8), (CutlassMeta::I32(_), true) | (CutlassMeta::I16(_), false));
    if !kind_ok {
        return Err(Error::format(
            "meta",
            format!("{}-bit elements take {want_kind} meta words", T::BITS),
        ));
    }
    let want_words = rows * g.meta_cols;
    if meta.len() != want_words {
        return Err(Error::shape(
            "meta",
            format!(
                "a {rows} x {cols} matrix has {rows} x {} = {want_words} meta words, got {}",
                g.meta_cols,
                meta.len()
            ),
        ));
    }
    let bytes = dense_len as u128 * (T::BITS / 8) as u128;
    crate::host::check_alloc("values", "the dense matrix", bytes)?;
    let mut dense = vec![T::ZERO; dense_len];
    if dense.is_empty() {
        return Ok(dense);
    }
    let cancel = crate::cancel::current();
    let first_bad = dense
        .par_chunks_mut(cols)
        .zip(values.par_chunks(cols / 2))
        .enumerate()
        .filter(|_| !cancel.is_cancelled())
        .filter_map(|(r, (row, vals))| decode_row(r, row, vals, meta, g).map(|e| (r, e)))
        .min();
    cancel.check()?;
    if let Some((r, (gi, code))) = first_bad {
        let c0 = gi * g.group;
        let allowed = if g.group == 4 {
            "two positions idx0 < idx1 as idx0 | idx1 << 2"
        } else {
            "0b0100 or 0b1110"
        };
        return Err(Error::value(
            "meta",
            format!(
                "the code {code:#06b} of row {r}, columns {c0}..{} is not a valid position code \
                 (expected {allowed})",
                c0 + g.group
            ),
        ));
    }
    Ok(dense)
}

/// Decodes one row; on an invalid code returns `(group index, code)`.
fn decode_row<T: Element>(
    r: usize, row: &mut [T], vals: &[T], meta: &CutlassMeta, g: Geometry,
) -> Option<(usize, u32)> {
    for c in 0..g.meta_cols {
        let w = meta.word(g.offset(r, c)).unwrap_or(0);
        for j in 0..g.codes_per_word {
            let gi = c * g.codes_per_word + j;
            let code = (w >> (4 * j)) & 0xF;
            let base = gi * g.group;
            if g.group == 4 {
                let (i0, i1) = ((code & 3) as usize, (code >> 2) as usize);
                if i0 >= i1 {
                    return Some((gi, code));
                }
                row[base + i0] = vals[2 * gi];
                row[base + i1] = vals[2 * gi + 1];
            } else {
                match code {
                    0b0100 => row[base] = vals[gi],
                    0b1110 => row[base + 1] = vals[gi],
                    _ => return Some((gi, code)),
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_codes_of_every_conforming_group() {
        // The table of sparse_semi_structured_from_dense_cutlass, as (mask of stored) -> code.
        let table = [
            (0b0011, 0b0100),
            (0b0101, 0b1000),
            (0b0110, 0b1001),
            (0b1001, 0b1100),
            (0b1010, 0b1101),
            (0b1100, 0b1110),
            (0b0000, 0b1110),
            (0b1000, 0b1110),
            (0b0100, 0b1110),
            (0b0010, 0b1001),
            (0b0001, 0b1000),
        ];
        for (stored, code) in table {
            let (i0, i1) = pair_positions(stored);
            assert_eq!(i0 | i1 << 2, code, "stored {stored:#06b}");
        }
    }

    #[test]
    fn meta_offsets_are_permutations() {
        for (rows, cols) in [(64, 2), (64, 6), (128, 2), (192, 4)] {
            let mut seen = vec![false; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    let o = meta_offset(rows, r, c);
                    assert!(o < seen.len() && !seen[o], "{rows}x{cols} ({r},{c}) -> {o}");
                    seen[o] = true;
                }
            }
        }
        // The first eight reordered slots (docs/sparsity_layout_notes.md), computed by hand from
        // PyTorch's formula: row 4 is reordered row 1, row 1 is reordered row 2.
        let first = [(0, 0), (4, 0), (0, 1), (4, 1), (1, 0), (5, 0), (1, 1), (5, 1)];
        for (slot, (r, c)) in first.into_iter().enumerate() {
            assert_eq!(meta_offset(64, r, c), slot);
        }
        assert_eq!(meta_offset(64, 8, 0), 8);
        assert_eq!(meta_offset(64, 2, 0), 64);
        assert_eq!(meta_offset(64, 0, 2), 128);
    }
}
