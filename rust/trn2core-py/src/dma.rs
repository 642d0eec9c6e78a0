//! Bindings of `trn2core::dma` (inline compression streams) and of the DMA timing model.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use trn2core::dma::{self, Codec, StreamInfo};
use trn2core::perf::dma::{dma_time, DmaPlan, Place};

use crate::arrays::{borrow, slice, to_numpy};
use crate::errors::{guard, guard_work};
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

/// Compresses the raw bytes (a flat uint8 view) of an array into one self-describing stream.
#[pyfunction]
pub fn dma_compress<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyAny>,
    elem_size: usize,
    codec: &str,
    dtype: &str,
    shape: Vec<u64>,
) -> PyResult<Bound<'py, PyBytes>> {
    let c = guard(py, || Codec::parse("codec", codec))?;
    let a = guard(py, || borrow::<u8>(raw, "x", "uint8 (raw bytes)"))?;
    let s = guard(py, || slice(&a, "x"))?;
    let stream = guard_work(py, s.len() as u64, || {
        dma::compress(s, elem_size, c, dtype, &shape)
    })?;
    Ok(PyBytes::new(py, &stream))
}

/// Validates a stream (structure and checksum) without decoding it.
#[pyfunction]
pub fn dma_inspect<'py>(py: Python<'py>, stream: &[u8]) -> PyResult<Bound<'py, PyDict>> {
    let info = guard_work(py, stream.len() as u64, || dma::inspect(stream))?;
    info_dict(py, &info)
}

/// Decodes a stream: `(info dict, flat uint8 array of the raw bytes)`.
#[pyfunction]
pub fn dma_decompress<'py>(
    py: Python<'py>,
    stream: &[u8],
) -> PyResult<(Bound<'py, PyDict>, Py<PyAny>)> {
    // All-zero blocks make the output up to 16384 times the stream: count the work so.
    let work = (stream.len() as u64).saturating_mul(64);
    let d = guard_work(py, work, || dma::decompress(stream))?;
    let info = StreamInfo {
        codec: d.codec,
        dtype: d.dtype.clone(),
        elem_size: d.elem_size,
        shape: d.shape.clone(),
        raw_nbytes: d.bytes.len() as u64,
        nbytes: stream.len() as u64,
    };
    Ok((info_dict(py, &info)?, to_numpy(py, d.bytes)))
}

/// Costs one DMA transfer; returns the report dict and its trace JSON.
#[pyfunction]
pub fn dma_copy_time<'py>(
    py: Python<'py>,
    bytes: u64,
    wire_bytes: u64,
    partitions: u64,
    src: &str,
    dst: &str,
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
    let r = guard(py, || dma_time(&plan))?;
    Ok((report_dict(py, &r)?, r.chrome_trace_json()))
}
