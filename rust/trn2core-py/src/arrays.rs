//! The only file that touches numpy: borrows input buffers (contiguous 1-D ones, and the GEMM's
//! 2-D operands in any layout), and makes the result arrays that the core fills. The Python
//! facade views ml_dtypes and byte-swapped arrays as unsigned integers of their width before
//! calling in, so only plain dtypes arrive here.

use numpy::{
    Element, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use trn2core::Error;

use crate::errors::{guard_work, poll_signals, PyTrn2Result};

/// A read-only borrow of a contiguous 1-D array of `T`, or a `FormatError` naming `arg`.
pub fn borrow<'py, T: Element>(
    x: &Bound<'py, PyAny>, arg: &str, what: &str,
) -> Result<PyReadonlyArray1<'py, T>, Error> {
    let arr = x
        .extract::<PyReadonlyArray1<'py, T>>()
        .map_err(|_| Error::format(arg, format!("expected a 1-D array of {what}")))?;
    if !arr.is_c_contiguous() {
        return Err(Error::shape(arg, "expected a C-contiguous array"));
    }
    Ok(arr)
}

/// The slice of a borrowed contiguous array.
pub fn slice<'a, T: Element>(a: &'a PyReadonlyArray1<'_, T>, arg: &str) -> Result<&'a [T], Error> {
    a.as_slice().map_err(|_| Error::shape(arg, "expected a C-contiguous array"))
}

/// Hands a vector to numpy without copying it (for small results; large ones are filled in
/// numpy's memory by [`fill_new_array`]).
pub fn to_numpy<T: Element>(py: Python<'_>, v: Vec<T>) -> Py<PyAny> {
    PyArray1::from_vec(py, v).into_any().unbind()
}

/// A fresh, uninitialised numpy array of `n` elements for a result (`what`, for messages):
/// `CapacityError` on `arg` if the host cannot hold it (checked before numpy allocates), and
/// also if numpy's allocation fails anyway. Allocated through `numpy.empty`, whose failure is a
/// `MemoryError` (rust-numpy's `PyArray1::new` panics instead), and whose allocator gives big
/// arrays huge pages: filling them costs far fewer page faults than a fresh Rust allocation.
///
/// # Safety
/// The caller must write every element before Python can read the array.
unsafe fn new_uninit<'py, T: Element>(
    py: Python<'py>, n: usize, arg: &str, what: &str,
) -> Result<Bound<'py, PyArray1<T>>, Error> {
    let bytes = n as u128 * std::mem::size_of::<T>() as u128;
    trn2core::host::check_alloc(arg, what, bytes)?;
    let refused = |why: String| {
        Error::capacity(
            arg,
            format!("{what}: numpy could not allocate {} ({why})", trn2core::host::human(bytes)),
        )
    };
    let arr = py
        .import("numpy")
        .and_then(|np| np.call_method1("empty", (n, numpy::dtype::<T>(py))))
        .map_err(|e| refused(e.to_string()))?;
    arr.cast_into::<PyArray1<T>>().map_err(|e| refused(e.to_string()))
}

/// The one way results are made: fresh numpy arrays of `lens[i]` elements (refused with
/// `CapacityError` on `arg` before anything is allocated if the host cannot hold them all),
/// handed to `fill` as mutable slices with the GIL released (inline below about a millisecond
/// of `work`, else interruptible by Ctrl-C: `errors::guard_work`). `fill` must write every
/// element of every slice when it returns `Ok` (the core's functions check their lengths); on
/// an error the arrays are dropped without Python ever seeing them.
pub fn fill_new_arrays<'py, T, R>(
    py: Python<'py>, lens: &[usize], arg: &str, what: &str, work: u64,
    fill: impl FnOnce(&mut [&mut [T]]) -> Result<R, Error> + Send,
) -> PyTrn2Result<(Vec<Bound<'py, PyArray1<T>>>, R)>
where
    T: Element + Send,
    R: Send,
{
    let total = lens
        .iter()
        .fold(0u128, |a, &m| a.saturating_add(m as u128))
        .saturating_mul(size_of::<T>() as u128);
    trn2core::host::check_alloc(arg, what, total)?;
    // SAFETY: `fill` writes every element before the arrays are returned (contract above).
    let arrays = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            poll_signals(py, i)?;
            // SAFETY: as above.
            Ok(unsafe { new_uninit::<T>(py, n, arg, what) }?)
        })
        .collect::<PyTrn2Result<Vec<_>>>()?;
    let r = {
        let mut rws: Vec<_> = arrays.iter().map(|a| a.readwrite()).collect();
        let mut outs = rws
            .iter_mut()
            .map(|rw| {
                rw.as_slice_mut()
                    .map_err(|_| Error::shape(arg, "a fresh result array is not contiguous"))
            })
            .collect::<Result<Vec<&mut [T]>, Error>>()?;
        guard_work(py, work, || fill(&mut outs))?
    };
    Ok((arrays, r))
}

/// [`fill_new_arrays`] for two result arrays of different element types (a compressed
/// tensor's values and its packed indices), checked against the host together.
#[allow(clippy::type_complexity)]
pub fn fill_new_pair<'py, A, B, R>(
    py: Python<'py>, (len_a, len_b): (usize, usize), arg: &str, what: &str, work: u64,
    fill: impl FnOnce(&mut [A], &mut [B]) -> Result<R, Error> + Send,
) -> PyTrn2Result<(Bound<'py, PyArray1<A>>, Bound<'py, PyArray1<B>>, R)>
where
    A: Element + Send,
    B: Element + Send,
    R: Send,
{
    let total = (len_a as u128 * size_of::<A>() as u128)
        .saturating_add(len_b as u128 * size_of::<B>() as u128);
    trn2core::host::check_alloc(arg, what, total)?;
    // SAFETY: `fill` writes every element of both before they are returned (contract of
    // `fill_new_arrays`).
    let (a, b) =
        unsafe { (new_uninit::<A>(py, len_a, arg, what)?, new_uninit::<B>(py, len_b, arg, what)?) };
    let r = {
        let (mut aw, mut bw) = (a.readwrite(), b.readwrite());
        let contiguous = |_| Error::shape(arg, "a fresh result array is not contiguous");
        let sa = aw.as_slice_mut().map_err(contiguous)?;
        let sb = bw.as_slice_mut().map_err(contiguous)?;
        guard_work(py, work, || fill(sa, sb))?
    };
    Ok((a, b, r))
}

/// [`fill_new_arrays`] for one result array.
pub fn fill_new_array<'py, T, R>(
    py: Python<'py>, len: usize, arg: &str, what: &str, work: u64,
    fill: impl FnOnce(&mut [T]) -> Result<R, Error> + Send,
) -> PyTrn2Result<(Bound<'py, PyArray1<T>>, R)>
where
    T: Element + Send,
    R: Send,
{
    let (mut arrays, r) = fill_new_arrays(py, &[len], arg, what, work, |outs| fill(&mut *outs[0]))?;
    let array = arrays.pop().ok_or_else(|| Error::shape(arg, "no result array"))?;
    Ok((array, r))
}

/// A read-only borrow of an array of `T` of any shape and layout, or a `FormatError` naming
/// `arg` (the facade passes operands as unsigned views of their element width).
pub fn borrow_any<'py, T: Element>(
    x: &Bound<'py, PyAny>, arg: &str, what: &str,
) -> Result<PyReadonlyArrayDyn<'py, T>, Error> {
    x.extract::<PyReadonlyArrayDyn<'py, T>>()
        .map_err(|_| Error::format(arg, format!("expected an array of {what}")))
}

/// The memory of a borrowed 2-D array in any layout: the slice from its lowest to its highest
/// element, the index of element `(0, 0)` in that slice, and the strides in elements (of any
/// sign). `ShapeError` for another rank, strides that are not whole elements, or misaligned data.
pub fn strided<'a, T: Element>(
    a: &'a PyReadonlyArrayDyn<'_, T>, arg: &str,
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
        return Err(Error::shape(arg, "the array's data is not aligned to its elements"));
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

/// Runs `$body` with `$s` bound to the codes of `$x` as a slice of its unsigned width (`$t` is
/// the element type: u8, u16, u32 or u64); any other width is a `FormatError` on `$arg`.
macro_rules! with_codes {
    ($x:expr, $arg:expr, |$s:ident: $t:ident| $body:expr) => {{
        let width = $x
            .getattr("dtype")?
            .getattr("itemsize")?
            .extract::<usize>()?;
        $crate::arrays::with_codes!(@width width, $x, $arg, |$s: $t| $body,
            1 => u8 "uint8 codes", 2 => u16 "uint16 codes", 4 => u32 "uint32 codes",
            8 => u64 "uint64 codes")
    }};
    // One arm per width: `$s` borrows the codes as a slice of `$t`, the width's unsigned type.
    (@width $w:ident, $x:expr, $arg:expr, |$s:ident: $t:ident| $body:expr,
        $($bytes:literal => $u:ident $what:literal),+) => {
        match $w {
            $($bytes => {
                type $t = $u;
                let a = $crate::arrays::borrow::<$t>($x, $arg, $what)?;
                let $s = $crate::arrays::slice(&a, $arg)?;
                $body
            })+
            w => Err(trn2core::Error::format(
                $arg,
                format!("elements of {w} bytes are not supported (1, 2, 4 or 8)"),
            )
            .into()),
        }
    };
}
pub(crate) use with_codes;

/// CPython's `PyBUF_READ` / `PyBUF_WRITE` (part of the stable ABI; pyo3 leaves them out of its
/// limited-API build).
const PYBUF_READ: std::ffi::c_int = 0x100;
const PYBUF_WRITE: std::ffi::c_int = 0x200;

/// A memoryview of `bytes` (read-only) or of `bytes_mut` (writable) without a copy, for a
/// Python callback that hands the memory to MPI (`distributed.py`). The view must not outlive
/// the borrow: [`release`] it when the callback returns.
pub fn memoryview<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the view is read-only (PyBUF_READ) over `bytes.len()` valid bytes; the caller
    // releases it before the borrow ends.
    unsafe { raw_memoryview(py, bytes.as_ptr().cast_mut(), bytes.len(), PYBUF_READ) }
}

/// The writable counterpart of [`memoryview`].
pub fn memoryview_mut<'py>(py: Python<'py>, bytes: &mut [u8]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: a writable view over `bytes.len()` bytes the caller lends exclusively until it
    // releases the view.
    unsafe { raw_memoryview(py, bytes.as_mut_ptr(), bytes.len(), PYBUF_WRITE) }
}

/// A memoryview of the `len` bytes at `ptr`, read-only or writable by `flags`.
///
/// # Safety
/// The bytes stay valid (and, for a writable view, lent exclusively) until the view is
/// released.
unsafe fn raw_memoryview<'py>(
    py: Python<'py>, ptr: *mut u8, len: usize, flags: std::ffi::c_int,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the caller's contract.
    unsafe {
        let p = pyo3::ffi::PyMemoryView_FromMemory(
            ptr.cast::<std::ffi::c_char>(),
            len as pyo3::ffi::Py_ssize_t,
            flags,
        );
        Bound::from_owned_ptr_or_err(py, p)
    }
}

/// Releases a view made by [`memoryview`] or [`memoryview_mut`]: afterwards Python can no longer
/// reach the memory through it. Fails (`BufferError`) while something still holds a buffer
/// exported from it, such as a numpy array made with `numpy.frombuffer`.
pub fn release(view: &Bound<'_, PyAny>) -> PyResult<()> {
    view.call_method0("release").map(|_| ())
}
