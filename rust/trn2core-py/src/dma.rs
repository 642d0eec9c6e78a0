//! Bindings of `trn2core::dma` (inline compression streams) and of the DMA timing model.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn2core::dma::cost::{dma_time_on_queue, DmaPlan, Place};
use trn2core::dma::{self, Codec, StreamInfo};
use trn2core::Error;

use crate::arrays::{borrow, slice};
use crate::errors::{guard, guard_detached, guard_work};
use crate::perf::report_dict;

/// The codec names, in order (`trn2core.dma.CODECS`).
#[pyfunction]
pub fn dma_codecs() -> Vec<&'static str> {
    Codec::ALL.iter().map(|c| c.name()).collect()
}

fn info_dict<'py>(py: Python<'py>, i: &StreamInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("codec", i.codec.name())?;
    d.set_item("dtype", &i.dtype)?;
    d.set_item("elem_size", i.elem_size)?;
    d.set_item("shape", i.shape.clone())?;
    d.set_item("raw_nbytes", i.raw_nbytes)?;
    d.set_item("nbytes", i.nbytes)?;
    Ok(d)
}

/// A fresh numpy uint8 array of `n` bytes (allocated by numpy: huge pages for big arrays, so
/// first-touch page faults cost a fraction of a plain allocation's), filled by `fill` with the
/// GIL released. `fill` writes every byte before Python can see the array.
fn fill_bytes<'py>(
    py: Python<'py>,
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), Error> + Send,
) -> PyResult<Bound<'py, PyArray1<u8>>> {
    // SAFETY: `new_uninit` leaves the buffer uninitialised; every caller's `fill` writes all
    // `n` bytes (the core checks the length) and the array is dropped if it fails. (It is
    // `CapacityError` when numpy cannot allocate, where `PyArray1::new` would panic.)
    let arr = guard(py, || unsafe {
        crate::arrays::new_uninit::<u8>(py, n, "x", "the compressed stream")
    })?;
    {
        let mut rw = arr.readwrite();
        let out = guard(py, || {
            rw.as_slice_mut()
                .map_err(|_| Error::shape("out", "expected a contiguous output"))
        })?;
        guard_detached(py, || fill(out))?;
    }
    Ok(arr)
}

/// Compresses the raw bytes (a flat uint8 view) of an array into one self-describing stream:
/// `(stream as a flat uint8 array, info dict)`.
#[pyfunction]
pub fn dma_compress<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyAny>,
    elem_size: usize,
    codec: &str,
    dtype: &str,
    shape: Vec<u64>,
) -> PyResult<(Bound<'py, PyArray1<u8>>, Bound<'py, PyDict>)> {
    let c = guard(py, || Codec::parse("codec", codec))?;
    let a = guard(py, || borrow::<u8>(raw, "x", "uint8 (raw bytes)"))?;
    let s = guard(py, || slice(&a, "x"))?;
    let planned = guard_work(py, s.len() as u64, || {
        dma::plan_compress(s, elem_size, c, dtype, &shape)
    })?;
    let stream = fill_bytes(py, planned.len(), |out| planned.write(out))?;
    Ok((stream, info_dict(py, planned.info())?))
}

/// Validates a stream (a flat uint8 array: structure and checksum) without decoding it.
#[pyfunction]
pub fn dma_inspect<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let a = guard(py, || {
        borrow::<u8>(stream, "stream", "uint8 (stream bytes)")
    })?;
    let s = guard(py, || slice(&a, "stream"))?;
    let info = guard_work(py, s.len() as u64, || dma::inspect(s))?;
    info_dict(py, &info)
}

/// A stream's header (a flat uint8 array), without a pass over the data or the checksum:
/// enough to allocate the output of `dma_decompress_into`.
#[pyfunction]
pub fn dma_describe<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let a = guard(py, || {
        borrow::<u8>(stream, "stream", "uint8 (stream bytes)")
    })?;
    let s = guard(py, || slice(&a, "stream"))?;
    let info = guard(py, || dma::describe(s))?;
    info_dict(py, &info)
}

/// Decodes a stream (a flat uint8 array) into `out` (a writable uint8 array of exactly the
/// stream's raw size), verifying the checksum as it goes.
#[pyfunction]
pub fn dma_decompress_into<'py>(
    py: Python<'py>,
    stream: &Bound<'py, PyAny>,
    out: &Bound<'py, PyArray1<u8>>,
) -> PyResult<()> {
    let a = guard(py, || {
        borrow::<u8>(stream, "stream", "uint8 (stream bytes)")
    })?;
    let s = guard(py, || slice(&a, "stream"))?;
    let mut rw = guard(py, || {
        out.try_readwrite()
            .map_err(|_| Error::value("out", "the output array is borrowed elsewhere"))
    })?;
    let o = guard(py, || {
        rw.as_slice_mut()
            .map_err(|_| Error::shape("out", "expected a C-contiguous output"))
    })?;
    guard_detached(py, || dma::decompress_into(s, o).map(|_| ()))
}

/// Costs one DMA transfer on DMA queue `queue`; returns the report dict and its trace JSON.
#[pyfunction]
#[pyo3(signature = (bytes, wire_bytes, partitions, src, dst, queue = 0))]
pub fn dma_copy_time<'py>(
    py: Python<'py>,
    bytes: u64,
    wire_bytes: u64,
    partitions: u64,
    src: &str,
    dst: &str,
    queue: usize,
) -> PyResult<(Bound<'py, PyDict>, String)> {
    let s = guard(py, || Place::parse("src", src))?;
    let d = guard(py, || Place::parse("dst", dst))?;
    let plan = DmaPlan {
        bytes,
        wire_bytes,
        partitions,
        src: s,
        dst: d,
    };
    let r = guard(py, || dma_time_on_queue(&plan, queue))?;
    Ok((report_dict(py, &r)?, r.chrome_trace_json()))
}
