//! Bindings of `trn2core::memory`: an HBM stack that several cores can share, the memories of
//! one core, and the allocations they hand out. Conversion and error mapping only; the facade
//! is `trn2core/memory.py`.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use trn2core::dma::copy::{self, Endpoint, Payload};
use trn2core::dma::cost::Place;
use trn2core::dma::Codec;
use trn2core::memory::{
    self, Allocation, CoreMemory, Footprint, HbmStack, SharedHbm, Space, Usage,
};

use crate::arrays::{borrow, slice};
use crate::errors::{guard_work, PyTrn2Result};
use crate::perf::PyReport;

/// A transfer's end as Python gives it: a memory name or an `Allocation`.
#[derive(FromPyObject)]
pub enum PyEndpoint<'py> {
    /// A memory by name.
    Name(String),
    /// An allocation of this core's memory.
    Allocation(PyRef<'py, PyAllocation>),
}

impl PyEndpoint<'_> {
    fn resolve(&self, arg: &str) -> PyTrn2Result<Endpoint<'_>> {
        Ok(match self {
            PyEndpoint::Name(n) => Endpoint::Place(Place::parse(arg, n)?),
            PyEndpoint::Allocation(a) => Endpoint::Allocation(&a.inner),
        })
    }
}

/// `(report, trace JSON, bytes, wire bytes, src place, dst place)` of a DMA transfer.
pub type CopyResult = (PyReport, String, u64, u64, &'static str, &'static str);

/// One HBM stack (24 GiB), shareable between the two cores it serves.
#[pyclass(name = "HbmStack", module = "trn2core._core", frozen)]
pub struct PyHbmStack {
    inner: SharedHbm,
}

/// How full one memory is (bytes; partitions 0 for HBM).
#[pyclass(name = "MemoryUsage", module = "trn2core._core", frozen, get_all)]
pub struct PyMemoryUsage {
    capacity: u64,
    used: u64,
    free: u64,
    partitions: u64,
    partition_bytes: u64,
    partition_free: u64,
    allocations: usize,
}

impl From<Usage> for PyMemoryUsage {
    fn from(u: Usage) -> Self {
        PyMemoryUsage {
            capacity: u.capacity,
            used: u.used,
            free: u.free,
            partitions: u.partitions,
            partition_bytes: u.partition_bytes,
            partition_free: u.partition_free,
            allocations: u.allocations,
        }
    }
}

/// Where an HBM stack sits: `index`, `die`, `cores` it serves.
#[pyclass(name = "StackPlacement", module = "trn2core._core", frozen, get_all)]
pub struct PyStackPlacement {
    index: usize,
    die: usize,
    cores: Vec<usize>,
}

#[pymethods]
impl PyHbmStack {
    #[new]
    #[pyo3(signature = (index = 0))]
    fn new(index: usize) -> PyTrn2Result<Self> {
        Ok(PyHbmStack { inner: HbmStack::shared(index)? })
    }

    /// Where the stack sits.
    fn placement(&self) -> PyStackPlacement {
        let h = memory::lock(&self.inner);
        PyStackPlacement { index: h.index(), die: h.die(), cores: h.cores().to_vec() }
    }

    /// How full it is.
    fn usage(&self) -> PyMemoryUsage {
        memory::lock(&self.inner).usage().into()
    }
}

/// One allocation: what it reserved, and (hidden) which memory made it, so only that memory
/// can free it.
#[pyclass(name = "Allocation", module = "trn2core._core", frozen)]
pub struct PyAllocation {
    pub(crate) inner: Allocation,
}

view_pymethods! {
    impl PyAllocation {
        get {
            id: u64,
            nbytes: u64 = bytes,
            partition_start: u64,
            partitions: u64,
            partition_bytes: u64,
            stack: usize,
        }
        #[getter]
        fn space(&self) -> &'static str {
            self.inner.space.name()
        }
    }
}

/// The memories of one physical core: its HBM stack (shared), SBUF and PSUM. Shareable
/// between Python threads: the accounts sit behind a mutex (a `&mut self` method here made a
/// second thread's `alloc` or `free` raise pyo3's "Already borrowed" while a `dma_copy` ran
/// with the GIL released).
#[pyclass(name = "CoreMemory", module = "trn2core._core", frozen)]
pub struct PyCoreMemory {
    inner: Mutex<CoreMemory>,
}

impl PyCoreMemory {
    pub(crate) fn lock(&self) -> MutexGuard<'_, CoreMemory> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A footprint of an array of `shape` (`elem_size`-byte elements), or of `nbytes` spread over
/// every partition when `shape` is `None`.
pub(crate) fn footprint(
    shape: Option<Vec<u64>>, elem_size: u64, nbytes: u64,
) -> trn2core::Result<Footprint> {
    match shape {
        Some(s) => Footprint::of_shape(&s, elem_size),
        None => Ok(Footprint::of_bytes(nbytes)),
    }
}

#[pymethods]
impl PyCoreMemory {
    #[new]
    #[pyo3(signature = (core = 0, hbm = None))]
    fn new(core: usize, hbm: Option<PyRef<'_, PyHbmStack>>) -> PyTrn2Result<Self> {
        let inner = match hbm {
            Some(h) => CoreMemory::with_hbm(core, h.inner.clone())?,
            None => CoreMemory::new(core)?,
        };
        Ok(PyCoreMemory { inner: Mutex::new(inner) })
    }

    /// The shared HBM stack object this core reaches.
    fn hbm_stack(&self) -> PyHbmStack {
        PyHbmStack { inner: self.lock().hbm().clone() }
    }

    /// `(core, die, stack)`.
    fn placement(&self) -> (usize, usize, usize) {
        let m = self.lock();
        let stack = memory::lock(m.hbm()).index();
        (m.core(), m.die(), stack)
    }

    /// How full `space` is.
    fn usage(&self, space: &str) -> PyTrn2Result<PyMemoryUsage> {
        Ok(match Space::parse("space", space)? {
            Space::Hbm => self.hbm_stack().usage(),
            Space::Sbuf => self.lock().sbuf().usage().into(),
            Space::Psum => self.lock().psum().usage().into(),
        })
    }

    /// Reserves an array of `shape` (`elem_size`-byte elements) or, with `shape=None`, `nbytes`
    /// bytes in `space`; `arg` names the request in errors.
    #[pyo3(signature = (arg, space, shape, elem_size, nbytes))]
    fn alloc(
        &self, arg: &str, space: &str, shape: Option<Vec<u64>>, elem_size: u64, nbytes: u64,
    ) -> PyTrn2Result<PyAllocation> {
        let s = Space::parse("space", space)?;
        let fp = footprint(shape, elem_size, nbytes)?;
        Ok(PyAllocation { inner: self.lock().alloc(arg, s, fp)? })
    }

    /// Releases `allocation` (`ValueError` if another memory made it, or it was freed).
    fn free(&self, allocation: PyRef<'_, PyAllocation>) -> PyTrn2Result<()> {
        Ok(self.lock().free(&allocation.inner)?)
    }

    /// Costs one DMA transfer of an array (`raw`: its bytes, read only to size a compressed
    /// stream) from `src` to `dst` on DMA queue `queue` with inline compression `codec`,
    /// checking that both sides can hold it (`trn2core::dma::copy::dma_copy`). `machine`: the
    /// NeuronCore's machine, whose allocator is the account of SBUF and PSUM (else this
    /// memory's own).
    #[pyo3(signature = (raw, dtype, elem_size, shape, codec, src, dst, queue, machine = None))]
    #[allow(clippy::too_many_arguments)]
    fn dma_copy<'py>(
        &self, py: Python<'py>, raw: &Bound<'py, PyAny>, dtype: &str, elem_size: usize,
        shape: Vec<u64>, codec: &str, src: PyEndpoint<'py>, dst: PyEndpoint<'py>, queue: usize,
        machine: Option<PyRef<'py, crate::machine::PyMachine>>,
    ) -> PyTrn2Result<CopyResult> {
        let transfer = Transfer { raw, dtype, elem_size, shape, codec, src, dst, queue };
        transfer.cost(py, self, machine.as_deref())
    }
}

/// One `dma_copy` request as Python gives it.
pub struct Transfer<'a, 'py> {
    pub raw: &'a Bound<'py, PyAny>,
    pub dtype: &'a str,
    pub elem_size: usize,
    pub shape: Vec<u64>,
    pub codec: &'a str,
    pub src: PyEndpoint<'py>,
    pub dst: PyEndpoint<'py>,
    pub queue: usize,
}

impl<'py> Transfer<'_, 'py> {
    /// Costs it on the core whose HBM is `mem`'s and whose SBUF/PSUM are `machine`'s (`mem`'s
    /// own when `None`): `trn2core::dma::copy::dma_copy`. Both are locked only while the GIL
    /// is released (a thread holding the GIL may be waiting for either).
    pub fn cost(
        self, py: Python<'py>, mem: &PyCoreMemory, machine: Option<&crate::machine::PyMachine>,
    ) -> PyTrn2Result<CopyResult> {
        let codec = Codec::parse("codec", self.codec)?;
        let (s, d) = (self.src.resolve("src")?, self.dst.resolve("dst")?);
        let a = borrow::<u8>(self.raw, "x", "uint8 (raw bytes)")?;
        let payload = Payload {
            raw: slice(&a, "x")?,
            dtype: self.dtype,
            elem_size: self.elem_size,
            shape: &self.shape,
        };
        let work = payload.raw.len() as u64;
        let queue = self.queue;
        let c = guard_work(py, work, || {
            let core = mem.lock();
            match machine {
                Some(m) => {
                    let m = m.lock();
                    copy::dma_copy(&core, m.memories(), payload, codec, s, d, queue)
                }
                None => copy::dma_copy(&core, &*core, payload, codec, s, d, queue),
            }
        })?;
        Ok((
            PyReport::of(py, &c.report)?,
            c.report.chrome_trace_json(),
            c.bytes,
            c.wire_bytes,
            c.src.name(),
            c.dst.name(),
        ))
    }
}

/// `(bytes, partitions, partition_bytes)` of an array of `shape` (see `Footprint::of_shape`).
#[pyfunction]
pub fn memory_footprint(shape: Vec<u64>, elem_size: u64) -> PyTrn2Result<(u64, u64, u64)> {
    let f = Footprint::of_shape(&shape, elem_size)?;
    Ok((f.bytes, f.partitions, f.partition_bytes))
}
