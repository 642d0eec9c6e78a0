//! Bindings of `trn2core::dma` (inline compression streams) and of the DMA timing model.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use trn2core::dma::cost::{dma_time_on_queue, DmaPlan, Place};
use trn2core::dma::{self, Codec, StreamInfo};
use trn2core::Error;

use crate::arrays::{borrow, fill_new_array, slice};
use crate::errors::{guard_detached, guard_work, PyTrn2Result};
use crate::perf::PyReport;

/// What a stream's header says.
#[pyclass(name = "StreamInfo", module = "trn2core._core", frozen, get_all)]
pub struct PyStreamInfo {
    codec: &'static str,
    dtype: String,
    elem_size: u64,
    shape: Vec<u64>,
    raw_nbytes: u64,
    nbytes: u64,
}

impl From<&StreamInfo> for PyStreamInfo {
    fn from(i: &StreamInfo) -> Self {
        PyStreamInfo {
            codec: i.codec.name(),
            dtype: i.dtype.clone(),
            elem_size: i.elem_size as u64,
            shape: i.shape.clone(),
            raw_nbytes: i.raw_nbytes,
            nbytes: i.nbytes,
        }
    }
}

/// Compresses the raw bytes (a flat uint8 view) of an array into one self-describing stream:
/// `(stream as a flat uint8 array, info)`.
#[pyfunction]
pub fn dma_compress<'py>(
    py: Python<'py>, raw: &Bound<'py, PyAny>, elem_size: usize, codec: &str, dtype: &str,
    shape: Vec<u64>,
) -> PyTrn2Result<(Bound<'py, PyArray1<u8>>, PyStreamInfo)> {
    let c = Codec::parse("codec", codec)?;
    let a = borrow::<u8>(raw, "x", "uint8 (raw bytes)")?;
    let s = slice(&a, "x")?;
    let planned =
        guard_work(py, s.len() as u64, || dma::plan_compress(s, elem_size, c, dtype, &shape))?;
    let (stream, ()) =
        fill_new_array(py, planned.len(), "x", "the compressed stream", u64::MAX, |out| {
            planned.write(out)
        })?;
    Ok((stream, planned.info().into()))
}

/// Validates a stream (a flat uint8 array: structure and checksum) without decoding it.
#[pyfunction]
pub fn dma_inspect(py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyTrn2Result<PyStreamInfo> {
    let a = borrow::<u8>(stream, "stream", "uint8 (stream bytes)")?;
    let s = slice(&a, "stream")?;
    let info = guard_work(py, s.len() as u64, || dma::inspect(s))?;
    Ok((&info).into())
}

/// A stream's header (a flat uint8 array), without a pass over the data or the checksum:
/// enough to allocate the output of `dma_decompress_into`.
#[pyfunction]
pub fn dma_describe(stream: &Bound<'_, PyAny>) -> PyTrn2Result<PyStreamInfo> {
    let a = borrow::<u8>(stream, "stream", "uint8 (stream bytes)")?;
    let info = dma::describe(slice(&a, "stream")?)?;
    Ok((&info).into())
}

/// Decodes a stream (a flat uint8 array) into a fresh uint8 array of its raw size (allocated
/// after the host check, and, for a stream that declares far more than its own size, after its
/// checksum: `dma::describe_for_output`), verifying the checksum as it goes.
#[pyfunction]
pub fn dma_decompress<'py>(
    py: Python<'py>, stream: &Bound<'py, PyAny>,
) -> PyTrn2Result<Bound<'py, PyArray1<u8>>> {
    let a = borrow::<u8>(stream, "stream", "uint8 (stream bytes)")?;
    let s = slice(&a, "stream")?;
    let info = guard_work(py, s.len() as u64, || dma::describe_for_output(s))?;
    let n = usize::try_from(info.raw_nbytes).map_err(|_| {
        Error::capacity(
            "blob",
            format!("{} bytes exceed this host's address space", info.raw_nbytes),
        )
    })?;
    let (out, ()) = fill_new_array(py, n, "blob", "the decompressed array", n as u64, |o| {
        dma::decompress_into(s, o).map(|_| ())
    })?;
    Ok(out)
}

/// Decodes a stream (a flat uint8 array) into `out` (a writable uint8 array of exactly the
/// stream's raw size), verifying the checksum as it goes.
#[pyfunction]
pub fn dma_decompress_into<'py>(
    py: Python<'py>, stream: &Bound<'py, PyAny>, out: &Bound<'py, PyArray1<u8>>,
) -> PyTrn2Result<()> {
    let a = borrow::<u8>(stream, "stream", "uint8 (stream bytes)")?;
    let s = slice(&a, "stream")?;
    let mut rw = out
        .try_readwrite()
        .map_err(|_| Error::value("out", "the output array is borrowed elsewhere"))?;
    let o = rw.as_slice_mut().map_err(|_| Error::shape("out", "expected a C-contiguous output"))?;
    guard_detached(py, || dma::decompress_into(s, o).map(|_| ()))?;
    Ok(())
}

/// Costs one DMA transfer on DMA queue `queue`; returns the report and its trace JSON.
#[pyfunction]
#[pyo3(signature = (bytes, wire_bytes, partitions, src, dst, queue = 0))]
pub fn dma_copy_time(
    py: Python<'_>, bytes: u64, wire_bytes: u64, partitions: u64, src: &str, dst: &str,
    queue: usize,
) -> PyTrn2Result<(PyReport, String)> {
    let plan = DmaPlan {
        bytes,
        wire_bytes,
        partitions,
        src: Place::parse("src", src)?,
        dst: Place::parse("dst", dst)?,
    };
    let r = dma_time_on_queue(&plan, queue)?;
    Ok((PyReport::of(py, &r)?, r.chrome_trace_json()))
}
