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
