//! Bindings of `trn2core::memory`: an HBM stack that several cores can share, and the memories
//! of one core. Conversion and error mapping only; the facade is `trn2core/memory.py`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn2core::memory::{self, Allocation, CoreMemory, Footprint, HbmStack, SharedHbm, Space};

use crate::errors::guard;

/// One HBM stack (24 GiB), shareable between the two cores it serves.
#[pyclass(name = "HbmStack", module = "trn2core._core", frozen)]
pub struct PyHbmStack {
    inner: SharedHbm,
}

#[pymethods]
impl PyHbmStack {
    #[new]
    #[pyo3(signature = (index = 0))]
    fn new(py: Python<'_>, index: usize) -> PyResult<Self> {
        Ok(PyHbmStack {
            inner: guard(py, || HbmStack::shared(index))?,
        })
    }

    /// `{index, die, cores, capacity, used, free, allocations}`.
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let h = memory::lock(&self.inner);
        let d = PyDict::new(py);
        d.set_item("index", h.index())?;
        d.set_item("die", h.die())?;
        d.set_item("cores", h.cores().to_vec())?;
        d.set_item("capacity", h.capacity())?;
        d.set_item("used", h.used())?;
        d.set_item("free", h.free_bytes())?;
        d.set_item("allocations", h.allocations())?;
        Ok(d)
    }
}

fn footprint(shape: Option<Vec<u64>>, elem_size: u64, nbytes: u64) -> trn2core::Result<Footprint> {
    match shape {
        Some(s) => Footprint::of_shape(&s, elem_size),
        None => Ok(Footprint::of_bytes(nbytes)),
    }
}

fn allocation_dict<'py>(py: Python<'py>, a: &Allocation) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("space", a.space.name())?;
    d.set_item("id", a.id)?;
    d.set_item("nbytes", a.bytes)?;
    d.set_item("partition_start", a.partition_start)?;
    d.set_item("partitions", a.partitions)?;
    d.set_item("partition_bytes", a.partition_bytes)?;
    d.set_item("stack", a.stack)?;
    Ok(d)
}

/// `(bytes, partitions, partition_bytes)` of an array of `shape` (see `Footprint::of_shape`).
#[pyfunction]
pub fn memory_footprint(
    py: Python<'_>,
    shape: Vec<u64>,
    elem_size: u64,
) -> PyResult<(u64, u64, u64)> {
    let f = guard(py, || Footprint::of_shape(&shape, elem_size))?;
    Ok((f.bytes, f.partitions, f.partition_bytes))
}

/// The memories of one physical core: its HBM stack (shared), SBUF and PSUM.
#[pyclass(name = "CoreMemory", module = "trn2core._core")]
pub struct PyCoreMemory {
    inner: CoreMemory,
}

#[pymethods]
impl PyCoreMemory {
    #[new]
    #[pyo3(signature = (core = 0, hbm = None))]
    fn new(py: Python<'_>, core: usize, hbm: Option<PyRef<'_, PyHbmStack>>) -> PyResult<Self> {
        let inner = match hbm {
            Some(h) => {
                let shared = h.inner.clone();
                guard(py, || CoreMemory::with_hbm(core, shared))?
            }
            None => guard(py, || CoreMemory::new(core))?,
        };
        Ok(PyCoreMemory { inner })
    }

    /// The shared HBM stack object this core reaches.
    fn hbm_stack(&self) -> PyHbmStack {
        PyHbmStack {
            inner: self.inner.hbm().clone(),
        }
    }

    /// `(core, die, stack)`.
    fn placement(&self) -> (usize, usize, usize) {
        let stack = memory::lock(self.inner.hbm()).index();
        (self.inner.core(), self.inner.die(), stack)
    }

    /// `{capacity, used, free, partitions, partition_bytes, partition_free, allocations}` of
    /// `space` (partitions 0 for HBM).
    fn usage<'py>(&self, py: Python<'py>, space: &str) -> PyResult<Bound<'py, PyDict>> {
        let s = guard(py, || Space::parse("space", space))?;
        let d = PyDict::new(py);
        match s {
            Space::Hbm => {
                let h = memory::lock(self.inner.hbm());
                d.set_item("capacity", h.capacity())?;
                d.set_item("used", h.used())?;
                d.set_item("free", h.free_bytes())?;
                d.set_item("partitions", 0)?;
                d.set_item("partition_bytes", 0)?;
                d.set_item("partition_free", 0)?;
                d.set_item("allocations", h.allocations())?;
            }
            Space::Sbuf | Space::Psum => {
                let m = if s == Space::Sbuf {
                    self.inner.sbuf()
                } else {
                    self.inner.psum()
                };
                d.set_item("capacity", m.capacity())?;
                d.set_item("used", m.used())?;
                d.set_item("free", m.free_bytes())?;
                d.set_item("partitions", m.partitions())?;
                d.set_item("partition_bytes", m.partition_capacity())?;
                d.set_item("partition_free", m.partition_free())?;
                d.set_item("allocations", m.allocations())?;
            }
        }
        Ok(d)
    }

    /// Reserves an array of `shape` (`elem_size`-byte elements) or, with `shape=None`, `nbytes`
    /// bytes in `space`; `arg` names the request in errors. Returns the allocation as a dict.
    #[pyo3(signature = (arg, space, shape, elem_size, nbytes))]
    fn alloc<'py>(
        &mut self,
        py: Python<'py>,
        arg: &str,
        space: &str,
        shape: Option<Vec<u64>>,
        elem_size: u64,
        nbytes: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let s = guard(py, || Space::parse("space", space))?;
        let fp = guard(py, || footprint(shape, elem_size, nbytes))?;
        let a = guard(py, || self.inner.alloc(arg, s, fp))?;
        allocation_dict(py, &a)
    }

    /// Releases allocation `id` of `space` (made on HBM stack `stack`).
    fn free(&mut self, py: Python<'_>, space: &str, id: u64, stack: usize) -> PyResult<()> {
        let s = guard(py, || Space::parse("space", space))?;
        let a = Allocation {
            space: s,
            id,
            bytes: 0,
            partition_start: 0,
            partitions: 0,
            partition_bytes: 0,
            stack,
        };
        guard(py, || self.inner.free(&a))
    }

    /// Refuses a transfer of an array of `shape` into `space` that does not fit in its free
    /// space now (`hbm_bytes`: what HBM would hold).
    fn check_transfer(
        &self,
        py: Python<'_>,
        arg: &str,
        space: &str,
        shape: Vec<u64>,
        elem_size: u64,
        hbm_bytes: u64,
    ) -> PyResult<()> {
        let s = guard(py, || Space::parse("space", space))?;
        let fp = guard(py, || Footprint::of_shape(&shape, elem_size))?;
        guard(py, || self.inner.check_transfer(arg, s, fp, hbm_bytes))
    }

    /// Refuses an array of `shape` that could never be held in `space` (`hbm_bytes`: what HBM
    /// would hold).
    fn check_capacity(
        &self,
        py: Python<'_>,
        arg: &str,
        space: &str,
        shape: Vec<u64>,
        elem_size: u64,
        hbm_bytes: u64,
    ) -> PyResult<()> {
        let s = guard(py, || Space::parse("space", space))?;
        let mut fp = guard(py, || Footprint::of_shape(&shape, elem_size))?;
        if s == Space::Hbm {
            fp.bytes = hbm_bytes;
        }
        guard(py, || self.inner.check_capacity(arg, s, fp))
    }
}
