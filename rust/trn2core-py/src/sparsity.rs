//! Bindings of `trn2core::sparsity` (N:M pruning, compression, the CUTLASS layout). Arrays
//! arrive as flat unsigned-integer views of their codes (the facade views every dtype as
//! `uint8/16/32/64` of its width) and leave the same way.

use pyo3::prelude::*;
use trn2core::sparsity::{self, Compressed, CompressedLayout, CutlassMeta, Dtype, Pattern};

use crate::arrays::{borrow, fill_new_array, fill_new_pair, slice, to_numpy, with_codes};
use crate::errors::{guard_work, PyTrn2Result};

/// `(values codes, packed indices, values shape, normalised axis)`.
type CompressedParts = (Py<PyAny>, Py<PyAny>, Vec<usize>, usize);

/// Magnitude pruning of the codes `x` (dtype name `dtype`, C-contiguous `shape`).
#[pyfunction]
pub fn sparsity_prune(
    py: Python<'_>, x: &Bound<'_, PyAny>, dtype: &str, shape: Vec<usize>, axis: isize,
    pattern: &str,
) -> PyTrn2Result<Py<PyAny>> {
    let p = Pattern::parse(pattern)?;
    let d = Dtype::parse("x", dtype)?;
    with_codes!(x, "x", |s: T| {
        let (arr, ()) =
            fill_new_array::<T, _>(py, s.len(), "x", "the pruned array", s.len() as u64, |out| {
                sparsity::prune_to::<T>(s, out, d, &shape, axis, p)
            })?;
        Ok(arr.into_any().unbind())
    })
}

/// Compresses the codes `x`: `(values codes, packed indices, values shape, axis)`.
#[pyfunction]
pub fn sparsity_compress(
    py: Python<'_>, x: &Bound<'_, PyAny>, shape: Vec<usize>, axis: isize, pattern: &str,
) -> PyTrn2Result<CompressedParts> {
    let p = Pattern::parse(pattern)?;
    with_codes!(x, "x", |s: T| {
        let layout = CompressedLayout::new(s.len(), &shape, axis, p)?;
        let (values, idx, ()) = fill_new_pair::<T, u8, _>(
            py,
            (layout.values, layout.index_bytes),
            "x",
            "the compressed array",
            s.len() as u64,
            |v, i| sparsity::compress_into::<T>(s, &layout, v, i),
        )?;
        Ok((
            values.into_any().unbind(),
            idx.into_any().unbind(),
            layout.values_shape(),
            layout.axis(),
        ))
    })
}

/// The dense codes of a compressed array (its parts are validated first).
#[pyfunction]
pub fn sparsity_decompress(
    py: Python<'_>, values: &Bound<'_, PyAny>, indices: &Bound<'_, PyAny>, shape: Vec<usize>,
    axis: isize, pattern: &str,
) -> PyTrn2Result<Py<PyAny>> {
    let p = Pattern::parse(pattern)?;
    let ia = borrow::<u8>(indices, "indices", "uint8")?;
    let idx = slice(&ia, "indices")?.to_vec();
    with_codes!(values, "values", |s: T| {
        let vals = s.to_vec();
        let work = shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64));
        let dense = guard_work(py, work, || {
            Compressed::<T>::from_parts(vals, idx, &shape, axis, p)?.decompress_checked()
        })?;
        Ok(to_numpy(py, dense))
    })
}

/// The positions (one byte each, in the order of the values) of packed indices.
#[pyfunction]
pub fn sparsity_positions(
    py: Python<'_>, indices: &Bound<'_, PyAny>, pattern: &str, count: usize,
) -> PyTrn2Result<Py<PyAny>> {
    let p = Pattern::parse(pattern)?;
    let ia = borrow::<u8>(indices, "indices", "uint8")?;
    let idx = slice(&ia, "indices")?;
    let pos = guard_work(py, count as u64, || sparsity::positions(idx, p, count))?;
    Ok(to_numpy(py, pos))
}

/// PyTorch's CUTLASS layout of the `[rows, cols]` codes `x`: `(values codes, meta words)`.
#[pyfunction]
pub fn sparsity_to_cutlass(
    py: Python<'_>, x: &Bound<'_, PyAny>, rows: usize, cols: usize,
) -> PyTrn2Result<(Py<PyAny>, Py<PyAny>)> {
    with_codes!(x, "x", |s: T| {
        let c = guard_work(py, s.len() as u64, || sparsity::to_cutlass::<T>(s, rows, cols))?;
        let meta = match c.meta {
            CutlassMeta::I16(w) => to_numpy(py, w),
            CutlassMeta::I32(w) => to_numpy(py, w),
        };
        Ok((to_numpy(py, c.values), meta))
    })
}

/// The dense `[rows, cols]` codes from PyTorch's CUTLASS layout (`meta` int16 or int32).
#[pyfunction]
pub fn sparsity_from_cutlass(
    py: Python<'_>, values: &Bound<'_, PyAny>, meta: &Bound<'_, PyAny>, rows: usize, cols: usize,
) -> PyTrn2Result<Py<PyAny>> {
    // The core takes owned words: the copy is checked against the host first.
    let copy = |bytes: usize| {
        trn2core::host::check_alloc("meta", "a copy of the meta words", bytes as u128)
    };
    let words = if let Ok(m) = borrow::<i16>(meta, "meta", "int16") {
        let w = slice(&m, "meta")?;
        copy(2 * w.len())?;
        CutlassMeta::I16(w.to_vec())
    } else {
        let m = borrow::<i32>(meta, "meta", "int16 or int32 words")?;
        let w = slice(&m, "meta")?;
        copy(4 * w.len())?;
        CutlassMeta::I32(w.to_vec())
    };
    with_codes!(values, "values", |s: T| {
        let dense = guard_work(py, 2 * s.len() as u64, || {
            sparsity::from_cutlass::<T>(s, &words, rows, cols)
        })?;
        Ok(to_numpy(py, dense))
    })
}
