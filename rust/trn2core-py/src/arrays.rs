//! The only file that touches numpy: borrows contiguous 1-D input buffers and hands vectors
//! back to Python without a copy. The Python facade flattens, byte-swaps and views ml_dtypes
//! arrays as unsigned integers before calling in, so only plain dtypes arrive here.

use numpy::{Element, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
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
