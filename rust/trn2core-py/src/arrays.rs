//! The only file that touches numpy: borrows input buffers (contiguous 1-D ones, and the GEMM's
//! 2-D operands in any layout) and hands vectors back to Python without a copy. The Python facade
//! views ml_dtypes and byte-swapped arrays as unsigned integers of their width before calling in,
//! so only plain dtypes arrive here.

use numpy::{Element, PyArray1, PyReadonlyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use trn2core::Error;

/// A read-only borrow of a contiguous 1-D array of `T`, or a `FormatError` naming `arg`.
pub fn borrow<'py, T: Element>(
    x: &Bound<'py, PyAny>,
    arg: &str,
    what: &str,
) -> Result<PyReadonlyArray1<'py, T>, Error> {
    let arr = x
        .extract::<PyReadonlyArray1<'py, T>>()
        .map_err(|_| Error::format(arg, format!("expected a 1-D array of {what}")))?;
    if !arr.is_c_contiguous() {
        return Err(Error::shape(arg, "expected a C-contiguous array"));
    }
    Ok(arr)
}

/// Hands a vector to numpy without copying it.
pub fn to_numpy<T: Element>(py: Python<'_>, v: Vec<T>) -> Py<PyAny> {
    PyArray1::from_vec(py, v).into_any().unbind()
}

/// The slice of a borrowed contiguous array.
pub fn slice<'a, T: Element>(a: &'a PyReadonlyArray1<'_, T>, arg: &str) -> Result<&'a [T], Error> {
    a.as_slice()
        .map_err(|_| Error::shape(arg, "expected a C-contiguous array"))
}

/// A fresh, uninitialised numpy array of `n` elements for a result (`what`, for messages):
/// `CapacityError` on `arg` if the host cannot hold it (checked before numpy allocates), and
/// also if numpy's allocation fails anyway. Allocated through `numpy.empty`, whose failure is a
/// `MemoryError` (rust-numpy's `PyArray1::new` panics instead).
///
/// # Safety
/// The caller must write every element before Python can read the array.
pub unsafe fn new_uninit<'py, T: Element>(
    py: Python<'py>,
    n: usize,
    arg: &str,
    what: &str,
) -> Result<Bound<'py, PyArray1<T>>, Error> {
    let bytes = n as u128 * std::mem::size_of::<T>() as u128;
    trn2core::host::check_alloc(arg, what, bytes)?;
    let refused = |why: String| {
        Error::capacity(
            arg,
            format!(
                "{what}: numpy could not allocate {} ({why})",
                trn2core::host::human(bytes)
            ),
        )
    };
    let arr = py
        .import("numpy")
        .and_then(|np| np.call_method1("empty", (n, numpy::dtype::<T>(py))))
        .map_err(|e| refused(e.to_string()))?;
    arr.cast_into::<PyArray1<T>>()
        .map_err(|e| refused(e.to_string()))
}

/// A read-only borrow of an array of `T` of any shape and layout, or a `FormatError` naming
/// `arg` (the facade passes operands as unsigned views of their element width).
pub fn borrow_any<'py, T: Element>(
    x: &Bound<'py, PyAny>,
    arg: &str,
    what: &str,
) -> Result<PyReadonlyArrayDyn<'py, T>, Error> {
    x.extract::<PyReadonlyArrayDyn<'py, T>>()
        .map_err(|_| Error::format(arg, format!("expected an array of {what}")))
}

/// The memory of a borrowed 2-D array in any layout: the slice from its lowest to its highest
/// element, the index of element `(0, 0)` in that slice, and the strides in elements (of any
/// sign). `ShapeError` for another rank, strides that are not whole elements, or misaligned data.
pub fn strided<'a, T: Element>(
    a: &'a PyReadonlyArrayDyn<'_, T>,
    arg: &str,
) -> Result<(&'a [T], usize, [isize; 2]), Error> {
    let size = std::mem::size_of::<T>() as isize;
    if a.ndim() != 2 || a.strides().iter().any(|s| s % size != 0) {
        return Err(Error::shape(
            arg,
            format!(
                "expected a 2-D array whose strides are whole elements, got shape {:?} strides {:?}",
                a.shape(),
                a.strides()
            ),
        ));
    }
    let view = a.as_array();
    let ptr = view.as_ptr();
    let strides = [view.strides()[0], view.strides()[1]];
    if view.is_empty() {
        return Ok((&[], 0, strides));
    }
    if !ptr.is_aligned() {
        return Err(Error::shape(
            arg,
            "the array's data is not aligned to its elements",
        ));
    }
    let (mut lo, mut hi) = (0isize, 0isize);
    for (&d, &s) in view.shape().iter().zip(&strides) {
        let span = (d as isize - 1) * s;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    // SAFETY: every element of a numpy array lies inside the one allocation that holds its data,
    // so the span from its lowest to its highest element does too; it is aligned (checked), stays
    // alive and is borrowed read-only as long as `a`, which the returned slice borrows.
    let span = unsafe { std::slice::from_raw_parts(ptr.offset(lo), (hi - lo + 1) as usize) };
    Ok((span, (-lo) as usize, strides))
}
