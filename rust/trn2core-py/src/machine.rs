//! Bindings of the whole-core machine (`trn2core::machine`): `Machine` (one NeuronCore's
//! memories and instructions), `Tile` (an access pattern: a cheap, frozen handle Python slices
//! without crossing into the core's state), and `KernelReport` (the timeline's result).
//!
//! Every instruction method converts its arguments, calls one core method, and maps errors;
//! issuing one is a few hundred nanoseconds of binding on top of the instruction itself. The
//! GIL stays held for small instructions (releasing it costs more than they do) and is released
//! around large ones.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySlice, PyTuple};
use trn2core::engine::{PeTile, PerfMode};
use trn2core::machine::isa::table::{self, Arg, ArgDefault, Kind, Value};
use trn2core::machine::tile::{Index, ViewIndex};
use trn2core::machine::timeline::{self, KernelReport, Wait};
use trn2core::machine::{
    AluOp, Dtype, Engine, Machine, MachineConfig, Opcode, OutputRounding, Tile, Uninitialized,
};
use trn2core::memory::Space;
use trn2core::numerics::Format;
use trn2core::Error;

use crate::arrays::{borrow, slice, to_numpy};
use crate::engine::Codes;
use crate::errors::{guard, guard_work, PyTrn2Result};
use crate::memory::{footprint, PyAllocation, PyMemoryUsage};

/// Elements below which an instruction runs with the GIL held.
const GIL_HELD_ELEMENTS: usize = 1 << 16;

/// A view [`PyTile::basic_view`] gives: its tile, logical shape and partition axis.
type BasicView = (PyTile, Vec<usize>, Option<usize>);

/// An access pattern into one tensor of one `Machine` (see `trn2core::machine::tile`).
#[pyclass(name = "Tile", module = "trn2core._core", frozen)]
pub struct PyTile {
    /// The core's tile.
    pub tile: Tile,
}

/// A Python index (int, slice, tuple of them) as the core's [`Index`] list.
fn indices(key: &Bound<'_, PyAny>) -> PyTrn2Result<Vec<Index>> {
    let one = |k: &Bound<'_, PyAny>| -> PyTrn2Result<Index> {
        if let Ok(s) = k.cast::<PySlice>() {
            let get = |name: &str| -> PyTrn2Result<Option<i64>> {
                let v = s.getattr(name)?;
                if v.is_none() {
                    Ok(None)
                } else {
                    Ok(Some(v.extract::<i64>().map_err(|_| {
                        Error::value("index", format!("slice {name} {v} is not an integer"))
                    })?))
                }
            };
            return Ok(Index::Range {
                start: get("start")?,
                stop: get("stop")?,
                step: get("step")?.unwrap_or(1),
            });
        }
        if k.is_instance_of::<pyo3::types::PyBool>() {
            return Err(Error::value("index", "a bool is not an index").into());
        }
        k.extract::<i64>().map(Index::At).map_err(|_| {
            Error::value(
                "index",
                format!(
                    "expected integers and slices, got {}",
                    k.get_type().name().map_or("?".into(), |n| n.to_string())
                ),
            )
            .into()
        })
    };
    match key.cast::<PyTuple>() {
        Ok(t) => t.iter().map(|k| one(&k)).collect(),
        Err(_) => Ok(vec![one(key)?]),
    }
}

#[pymethods]
impl PyTile {
    /// The logical shape (partition axis first).
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.tile.logical_shape()
    }

    /// The dtype's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.tile.dtype.name()
    }

    /// The memory's name (`"sbuf"`, `"psum"`, `"hbm"`).
    #[getter]
    fn space(&self) -> &'static str {
        self.tile.space.name()
    }

    /// First partition (SBUF/PSUM; 0 in HBM).
    #[getter]
    fn start_partition(&self) -> u32 {
        self.tile.start_partition
    }

    /// Byte address of the first element (within each partition; within the buffer in HBM).
    #[getter]
    fn offset(&self) -> i64 {
        self.tile.offset
    }

    /// The free pattern: `[(stride in elements, size), ...]`, outermost first.
    #[getter]
    fn pattern(&self) -> Vec<(i64, u32)> {
        self.tile.dims().map(|(s, st)| (st, s)).collect()
    }

    /// Elements in the tile.
    #[getter]
    fn size(&self) -> u128 {
        self.tile.elements_u128()
    }

    fn __len__(&self) -> usize {
        self.tile.partitions as usize
    }

    /// NKI's basic indexing of the tensor (or view) this tile holds (logical shape `dims`,
    /// partition axis `pdim`, None in HBM) by `key`, a tuple of one int or step-1 slice of
    /// ints per axis: `(tile, shape, pdim)` of the view, or None where the front end's
    /// general path decides (any other key, or what `Tile::basic_view` leaves to it).
    fn basic_view(
        &self, key: &Bound<'_, PyAny>, dims: &Bound<'_, PyAny>, pdim: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<Option<BasicView>> {
        use pyo3::types::PyInt;
        let key = key.cast::<PyTuple>().map_err(|_| {
            Error::value("key", format!("expected a tuple of indices, got {}", shown(key)))
        })?;
        let dims: Vec<usize> = dims.extract().map_err(|_| {
            Error::shape("dims", format!("expected a list of sizes, got {}", shown(dims)))
        })?;
        let bad = || Error::value("pdim", format!("expected None or an axis, got {}", shown(pdim)));
        let pdim: Option<usize> = if pdim.is_none() {
            None
        } else if pdim.is_instance_of::<pyo3::types::PyBool>() {
            return Err(bad().into());
        } else {
            Some(pdim.extract().map_err(|_| bad())?)
        };
        let int = |v: &Bound<'_, PyAny>| -> Option<i64> {
            if v.is_exact_instance_of::<PyInt>() {
                v.extract::<i64>().ok()
            } else {
                None
            }
        };
        let mut idx = Vec::with_capacity(key.len());
        for k in key.iter() {
            if let Ok(s) = k.cast::<PySlice>() {
                let bound =
                    |v: Bound<'_, PyAny>| if v.is_none() { Some(None) } else { int(&v).map(Some) };
                let py = s.py();
                let step = s.getattr(pyo3::intern!(py, "step"))?;
                let (Some(start), Some(stop)) = (
                    bound(s.getattr(pyo3::intern!(py, "start"))?),
                    bound(s.getattr(pyo3::intern!(py, "stop"))?),
                ) else {
                    return Ok(None);
                };
                if !step.is_none() {
                    return Ok(None);
                }
                idx.push(ViewIndex::Range(start, stop));
            } else if let Some(i) = int(&k) {
                idx.push(ViewIndex::At(i));
            } else {
                return Ok(None);
            }
        }
        let view = self.tile.basic_view(&dims, pdim, &idx)?;
        Ok(view.map(|(tile, shape, p)| (PyTile { tile }, shape, p)))
    }

    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyTrn2Result<PyTile> {
        Ok(PyTile { tile: self.tile.slice(&indices(key)?)? })
    }

    /// The same elements with the free axes reshaped (a contiguous pattern only).
    fn reshape_free(&self, shape: &Bound<'_, PyAny>) -> PyTrn2Result<PyTile> {
        let shape: Vec<usize> = shape.extract().map_err(|_| {
            Error::shape(
                "shape",
                format!("expected a list of sizes (0..2**64), got {}", shown(shape)),
            )
        })?;
        Ok(PyTile { tile: self.tile.reshape_free(&shape)? })
    }

    /// The same bytes as elements of `dtype` (one contiguous free axis).
    fn view_as(&self, dtype: &str) -> PyTrn2Result<PyTile> {
        let dt = Dtype::parse_name("dtype", dtype)?;
        Ok(PyTile { tile: self.tile.view_as(dt)? })
    }

    /// An explicit free pattern `[(step, num), ...]` from `offset` elements past the first
    /// element (NKI's `.ap()`).
    #[pyo3(signature = (pattern, offset = None))]
    fn ap(
        &self, pattern: &Bound<'_, PyAny>, offset: Option<&Bound<'_, PyAny>>,
    ) -> PyTrn2Result<PyTile> {
        let pattern: Vec<(i64, u32)> = pattern.extract().map_err(|_| {
            Error::value(
                "pattern",
                format!(
                    "expected a list of [step, num] pairs (step a signed 64-bit integer, num \
                     1..2**32), got {}",
                    shown(pattern)
                ),
            )
        })?;
        let offset: i64 = match offset {
            None => 0,
            Some(o) => no_bool(o, "offset")?.extract().map_err(|_| {
                Error::value(
                    "offset",
                    format!("expected a signed 64-bit integer, got {}", shown(o)),
                )
            })?,
        };
        Ok(PyTile { tile: self.tile.with_pattern(&pattern, offset)? })
    }

    /// An HBM tile whose first axis is `count` rows `step` elements apart (NKI's `.ap()` on
    /// HBM; a step of 0 repeats one row).
    fn rows(&self, count: &Bound<'_, PyAny>, step: &Bound<'_, PyAny>) -> PyTrn2Result<PyTile> {
        let count: u32 = no_bool(count, "count")?.extract().map_err(|_| {
            Error::shape("count", format!("expected an integer in 1..2**32, got {}", shown(count)))
        })?;
        let step: i64 = no_bool(step, "step")?.extract().map_err(|_| {
            Error::value("step", format!("expected a signed 64-bit integer, got {}", shown(step)))
        })?;
        Ok(PyTile { tile: self.tile.with_rows(count, step)? })
    }

    /// Elements between consecutive rows of the first axis (HBM; 0 in SBUF/PSUM).
    #[getter]
    fn row_step(&self) -> i64 {
        self.tile.partition_step
    }

    /// The tensor the tile belongs to: `(machine, slot, generation)`, the same for every
    /// tile of one tensor and never for two live tensors.
    #[getter]
    fn tensor_key(&self) -> (u32, u32, u32) {
        let id = self.tile.tensor;
        (id.machine, id.slot, id.generation)
    }

    /// This tile moved with its tensor from `old` to `new` (whole tiles of two tensors of one
    /// shape and dtype: a tensor spilled and reloaded elsewhere): the same elements of `new`'s
    /// tensor. `None` when this tile is not one of `old`'s tensor.
    fn moved(&self, old: &PyTile, new: &PyTile) -> PyTrn2Result<Option<PyTile>> {
        let (o, n) = (&old.tile, &new.tile);
        if self.tile.tensor != o.tensor {
            return Ok(None);
        }
        if o.space != n.space || o.dtype != n.dtype || o.logical_shape() != n.logical_shape() {
            return Err(Error::value(
                "new",
                format!(
                    "expected a tile of {:?} {} in {}, got {:?} {} in {}",
                    o.logical_shape(),
                    o.dtype.name(),
                    o.space.name(),
                    n.logical_shape(),
                    n.dtype.name(),
                    n.space.name()
                ),
            )
            .into());
        }
        let mut t = self.tile;
        t.tensor = n.tensor;
        t.offset = t.offset - o.offset + n.offset;
        t.start_partition = t.start_partition - o.start_partition + n.start_partition;
        Ok(Some(PyTile { tile: t }))
    }

    fn __repr__(&self) -> String {
        let t = &self.tile;
        format!(
            "Tile({} {:?} {}, partitions {}..{}, offset {}, pattern {:?})",
            t.space.name(),
            t.logical_shape(),
            t.dtype.name(),
            t.start_partition,
            t.start_partition + t.partitions,
            t.offset,
            self.pattern()
        )
    }
}

/// The tile of a Python argument, or a `ValueError` naming it.
/// `x` unless it is a `bool` (an integer to Python, but `True` must not silently mean 1).
fn no_bool<'a, 'py>(x: &'a Bound<'py, PyAny>, arg: &str) -> PyTrn2Result<&'a Bound<'py, PyAny>> {
    if x.is_instance_of::<pyo3::types::PyBool>() {
        return Err(Error::value(arg, "expected an integer, got a bool").into());
    }
    Ok(x)
}

/// A short description of a value for messages (its repr, cut; its type if that fails).
fn shown(x: &Bound<'_, PyAny>) -> String {
    let r = x.repr().map_or_else(
        |_| x.get_type().name().map_or("?".into(), |n| n.to_string()),
        |r| r.to_string(),
    );
    if r.chars().count() > 60 {
        format!("{}...", r.chars().take(60).collect::<String>())
    } else {
        r
    }
}

fn tile_of(x: &Bound<'_, PyAny>, arg: &str) -> PyTrn2Result<Tile> {
    if let Ok(t) = x.cast::<PyTile>() {
        return Ok(t.get().tile);
    }
    // An allocation of `NeuronCore.alloc` carries its tile.
    if let Ok(inner) = x.getattr("tile") {
        if let Ok(t) = inner.cast::<PyTile>() {
            return Ok(t.get().tile);
        }
    }
    match x.cast::<PyTile>() {
        Ok(t) => Ok(t.get().tile),
        Err(_) => Err(Error::value(
            arg,
            format!(
                "expected a Tile (from NeuronCore.alloc, .hbm or slicing one), got {}",
                x.get_type().name().map_or("?".into(), |n| n.to_string())
            ),
        )
        .into()),
    }
}

/// One emulated NeuronCore-v3 with memories (the facade's `NeuronCore` holds one).
///
/// Shareable between Python threads: the state sits behind a mutex, so concurrent
/// instructions run one at a time, each whole.
#[pyclass(name = "Machine", module = "trn2core._core", frozen)]
pub struct PyMachine {
    inner: Mutex<Machine>,
}

impl PyMachine {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Machine> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The machine with its queued matmuls settled (what every call but `nc_matmul` sees).
    fn settled(&self) -> Result<MutexGuard<'_, Machine>, Error> {
        let mut m = self.lock();
        if m.has_queued_work() {
            // Settling runs parallel sections: on the fork-safe pool (GIL-held callers too).
            let core = &mut *m;
            trn2core::pool::install(|| core.settle())?;
        }
        Ok(m)
    }

    /// The work of settling the queued matmuls (for `guard_work`: long enough to be
    /// interruptible when some wait).
    fn queued_work(&self) -> u64 {
        self.lock().queued_matmuls() as u64 * QUEUED_MATMUL_WORK
    }

    /// `f` on the machine with its queued matmuls settled: with the GIL held when `elements`
    /// is small and no matmul waits, else with the GIL released and, for long work (queued
    /// matmuls count as [`QUEUED_MATMUL_WORK`] each), Ctrl-C honoured (`guard_work`).
    fn with_settled<T: Send>(
        &self, py: Python<'_>, elements: usize,
        f: impl FnOnce(&mut Machine) -> Result<T, Error> + Send,
    ) -> PyTrn2Result<T> {
        self.with_queue(py, elements, |m| {
            if m.has_queued_work() {
                // Settling runs parallel sections: on the fork-safe pool.
                trn2core::pool::install(|| m.settle())?;
            }
            f(m)
        })
    }

    /// [`Self::with_settled`] for a call that settles the queue itself when it needs to
    /// (`issue`, `alloc`, `free`: a tensor_tensor may wait in the queue, a freed tensor be
    /// retired), with the same GIL and Ctrl-C choice.
    fn with_queue<T: Send>(
        &self, py: Python<'_>, elements: usize,
        f: impl FnOnce(&mut Machine) -> Result<T, Error> + Send,
    ) -> PyTrn2Result<T> {
        let queued = self.lock().queued_matmuls();
        if elements < GIL_HELD_ELEMENTS && queued == 0 {
            Ok(guard(py, || f(&mut self.lock()))?)
        } else {
            let work = (elements as u64).saturating_add(queued as u64 * QUEUED_MATMUL_WORK);
            Ok(guard_work(py, work, || f(&mut self.lock()))?)
        }
    }
}

/// A tensor as `PyTile::tensor_key` names it: `(machine, slot, generation)`.
type TensorKey = (u32, u32, u32);

/// Work counted for one queued matmul when a call settles the queue first: up to 128 x 128 x
/// 512 multiply-adds, so a few queued ones already go to the interruptible path.
const QUEUED_MATMUL_WORK: u64 = 1 << 20;

#[pymethods]
impl PyMachine {
    #[new]
    #[pyo3(signature = (uninitialized = "error", rounding = "nearest_even", seed = 0))]
    fn new(py: Python<'_>, uninitialized: &str, rounding: &str, seed: u64) -> PyTrn2Result<Self> {
        let uninitialized = Uninitialized::parse("uninitialized", uninitialized)?;
        let rounding = OutputRounding::new(rounding, seed)?;
        let m = guard(py, || Machine::new(MachineConfig { uninitialized, rounding }))?;
        Ok(PyMachine { inner: Mutex::new(m) })
    }

    /// Allocates a tensor in SBUF or PSUM; returns its full tile. `overlay`: an explicit
    /// placement that may share bytes with other overlay tensors (NKI's explicit allocation).
    #[pyo3(signature = (shape, dtype, space, name, start_partition = 0, address = None, overlay = false))]
    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &self, py: Python<'_>, shape: Vec<usize>, dtype: &str, space: &str, name: &str,
        start_partition: u32, address: Option<u64>, overlay: bool,
    ) -> PyTrn2Result<PyTile> {
        let dt = Dtype::parse_name("dtype", dtype)?;
        let sp = Space::parse("space", space)?;
        let args = (sp, name, &shape[..], dt, start_partition, address, overlay);
        // Without settling first, with the GIL held; settling (what retired tensors hold is in
        // the way) as other long calls do.
        let tile = match guard(py, || self.lock().try_alloc_at(args))? {
            Some(tile) => tile,
            None => self.with_queue(py, 0, |m| {
                m.alloc_at(sp, name, &shape, dt, start_partition, address, overlay)
            })?,
        };
        Ok(PyTile { tile })
    }

    /// Whether `alloc(shape, dtype, space, ...)` without an address, from partition 0, could
    /// succeed now: `False` only when it would raise the `CapacityError` of no room (checked
    /// without making that error: a front end trying again as it frees memory).
    fn has_room(&self, shape: Vec<usize>, dtype: &str, space: &str) -> PyTrn2Result<bool> {
        let dt = Dtype::parse_name("dtype", dtype)?;
        let sp = Space::parse("space", space)?;
        Ok(self.lock().has_room(sp, &shape, dt))
    }

    /// `alloc(shape, dtype, space, name)` when `has_room` says it would succeed, else `None`
    /// (also when it raises the `CapacityError` of no room after all): one call for a front
    /// end that frees memory until a tensor fits, never making that error's message.
    fn alloc_if_room(
        &self, py: Python<'_>, shape: Vec<usize>, dtype: &str, space: &str, name: &str,
    ) -> PyTrn2Result<Option<PyTile>> {
        let dt = Dtype::parse_name("dtype", dtype)?;
        let sp = Space::parse("space", space)?;
        let args = (sp, name, &shape[..], dt, 0, None, false);
        let tile = {
            let mut m = self.lock();
            if !m.has_room(sp, &shape, dt) {
                return Ok(None);
            }
            guard(py, || m.try_alloc_at(args))?
        };
        let tile = match tile {
            Some(tile) => Some(tile),
            // Settling (what retired tensors hold is in the way), as `alloc` does.
            None => self.with_queue(py, 0, |m| {
                match m.alloc_at(sp, name, &shape, dt, 0, None, false) {
                    Ok(tile) => Ok(Some(tile)),
                    Err(Error::Capacity { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })?,
        };
        Ok(tile.map(|tile| PyTile { tile }))
    }

    /// `core.alloc` in SBUF/PSUM: a tensor of `shape` and `dtype` when `dtype` is given, else
    /// `nbytes` (or an array of `shape` with `elem_size`-byte elements) as bytes over the
    /// partitions; returns the reservation and its tensor's tile.
    #[pyo3(signature = (arg, space, name, shape, elem_size, nbytes, dtype, stack))]
    #[allow(clippy::too_many_arguments)]
    fn reserve(
        &self, py: Python<'_>, arg: &str, space: &str, name: &str, shape: Option<Vec<u64>>,
        elem_size: u64, nbytes: u64, dtype: Option<&str>, stack: usize,
    ) -> PyTrn2Result<(PyAllocation, PyTile)> {
        let sp = Space::parse("space", space)?;
        let dt = dtype.map(|d| Dtype::parse_name("dtype", d)).transpose()?;
        let typed: Option<Vec<usize>> = match (dt, &shape) {
            (Some(_), Some(s)) => Some(s.iter().map(|&d| d as usize).collect()),
            _ => None,
        };
        let fp = footprint(shape, elem_size, nbytes)?;
        let (inner, tile) = self.with_settled(py, 0, |m| {
            m.reserve(arg, sp, name, fp, typed.as_deref().zip(dt), stack)
        })?;
        Ok((PyAllocation { inner }, PyTile { tile }))
    }

    /// Releases a reservation of `reserve`.
    fn release(&self, py: Python<'_>, allocation: PyRef<'_, PyAllocation>) -> PyTrn2Result<()> {
        let a = allocation.inner;
        self.with_settled(py, 0, |m| m.release(&a))
    }

    /// SBUF tensors without an address at the highest free address (`on`) or the lowest.
    fn set_sbuf_fit_from_top(&self, on: bool) {
        self.lock().set_sbuf_fit_from_top(on);
    }

    /// How full SBUF or PSUM is, as the machine's allocator places tensors.
    fn usage(&self, space: &str) -> PyTrn2Result<PyMemoryUsage> {
        let sp = Space::parse("space", space)?;
        if sp == Space::Hbm {
            return Err(Error::value(
                "space",
                "the machine holds SBUF and PSUM; HBM is the stack's",
            )
            .into());
        }
        // Settled: a tensor freed while the matmul queue used it holds its bytes until then.
        Ok(self.settled()?.memories().usage(sp).into())
    }

    /// An HBM tensor from packed little-endian bytes (C order), or uninitialised (`None`).
    #[pyo3(signature = (name, shape, dtype, data = None))]
    fn hbm_tensor(
        &self, py: Python<'_>, name: &str, shape: Vec<usize>, dtype: &str,
        data: Option<&Bound<'_, PyAny>>,
    ) -> PyTrn2Result<PyTile> {
        let dt = Dtype::parse_name("dtype", dtype)?;
        let arr = data.map(|d| borrow::<u8>(d, "data", "uint8")).transpose()?;
        let bytes = arr.as_ref().map(|a| slice(a, "data")).transpose()?;
        // A large tensor's bytes are copied with the GIL released (Ctrl-C and other threads).
        let work = bytes.map_or(0, <[u8]>::len);
        let tile = self.with_settled(py, work, |m| m.hbm_tensor(name, &shape, dt, bytes))?;
        Ok(PyTile { tile })
    }

    /// The compiler's spill of a whole SBUF tensor to an HBM tensor of its size, or its reload
    /// (`Machine::dma_spill`), stamped with the source `location`.
    fn dma_spill(
        &self, py: Python<'_>, dst: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>,
        location: Option<u32>,
    ) -> PyTrn2Result<()> {
        let (d, s) = (tile_of(dst, "dst")?, tile_of(src, "src")?);
        self.with_settled(py, s.elements().max(d.elements()), |m| {
            m.at(location, |m| m.dma_spill(&d, &s, None))
        })
    }

    /// The bytes `dma_spill` moves, moved outside any instruction (`Machine::spill_move`).
    fn spill_move(
        &self, py: Python<'_>, dst: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<()> {
        let (d, s) = (tile_of(dst, "dst")?, tile_of(src, "src")?);
        self.with_settled(py, s.elements().max(d.elements()), |m| m.spill_move(&d, &s))
    }

    /// The reload of a tensor whose store was not recorded (`spill_move` when it gave its
    /// storage up): `spill_move(tile, slot)`, `dma_spill(slot, tile, location)` and
    /// `dma_spill(tile, slot, location)`, the bytes copied once (`Machine::spill_reload`).
    fn spill_reload(
        &self, py: Python<'_>, tile: &Bound<'_, PyAny>, slot: &Bound<'_, PyAny>,
        location: Option<u32>,
    ) -> PyTrn2Result<()> {
        let (t, s) = (tile_of(tile, "tile")?, tile_of(slot, "slot")?);
        self.with_settled(py, s.elements().max(t.elements()), |m| {
            m.at(location, |m| m.spill_reload(&t, &s, None))
        })
    }

    /// Frees the tensor of `tile`.
    fn free(&self, py: Python<'_>, tile: &Bound<'_, PyAny>) -> PyTrn2Result<()> {
        let t = tile_of(tile, "tile")?;
        // Never settles (a tensor the queue uses is retired): with the GIL held.
        Ok(guard(py, || self.lock().free(&t))?)
    }

    /// Frees the tensor of `tile`, whose storage a kernel's front end gives up to another: a
    /// later use of its tiles is a `CapacityError` with `message` under `rule`.
    fn give_up(
        &self, py: Python<'_>, tile: &Bound<'_, PyAny>, message: &str, rule: &str,
    ) -> PyTrn2Result<()> {
        let t = tile_of(tile, "tile")?;
        self.with_queue(py, 0, |m| m.give_up(&t, message, rule))
    }

    /// The live tensors of `space` ("sbuf" or "psum") that a recorded instruction from `since`
    /// on read or wrote: `(tensor_key, index of the last such instruction)` each
    /// (`Machine::touched_since`).
    fn touched_since(&self, space: &str, since: usize) -> PyTrn2Result<Vec<(TensorKey, i64)>> {
        let sp = Space::parse("space", space)?;
        let found = self.lock().touched_since(sp, since);
        Ok(found.into_iter().map(|(id, i)| ((id.machine, id.slot, id.generation), i)).collect())
    }

    /// For each tile, the index of the last recorded instruction from `since` on that read or
    /// wrote its tensor (-1: none).
    #[pyo3(signature = (tiles, since = 0))]
    fn last_uses(&self, tiles: Vec<Bound<'_, PyAny>>, since: usize) -> PyTrn2Result<Vec<i64>> {
        let tiles = tiles.iter().map(|t| tile_of(t, "tiles")).collect::<PyTrn2Result<Vec<_>>>()?;
        Ok(self.lock().last_uses(&tiles, since))
    }

    /// The name, dtype and logical shape of `tile`'s tensor.
    fn tensor_info(
        &self, py: Python<'_>, tile: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<(String, &'static str, Vec<usize>, &'static str)> {
        let t = tile_of(tile, "tile")?;
        Ok(guard(py, || {
            let m = self.lock();
            let info = m.tensor(&t)?;
            Ok((info.name.clone(), info.dtype.name(), info.shape.clone(), info.space.name()))
        })?)
    }

    /// One `nc_matmul` issued from the host on operands given as flat unsigned views of their
    /// codes (uint8 for fp8, uint16 for bf16/fp16, uint32 for the float32 containers of
    /// fp32/tf32), into PSUM `bank`; returns the region's new contents, flat `[M * N]` fp32.
    #[pyo3(signature = (stationary, stationary_shape, stationary_format, moving, moving_shape, moving_format, bank, accumulate, perf_mode, tile_position, tile_size))]
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self, py: Python<'_>, stationary: &Bound<'_, PyAny>, stationary_shape: Vec<usize>,
        stationary_format: &str, moving: &Bound<'_, PyAny>, moving_shape: Vec<usize>,
        moving_format: &str, bank: usize, accumulate: bool, perf_mode: &str,
        tile_position: Option<(usize, usize)>, tile_size: Option<(usize, usize)>,
    ) -> PyTrn2Result<Py<PyAny>> {
        let sf = Format::parse("stationary", stationary_format)?;
        let mf = Format::parse("moving", moving_format)?;
        let mode = PerfMode::parse("perf_mode", perf_mode)?;
        let tile = PeTile::from_options(tile_position, tile_size)?;
        let sa = Codes::borrow(stationary, "stationary", sf)?;
        let ma = Codes::borrow(moving, "moving", mf)?;
        let st = sa.operand("stationary", &stationary_shape, sf)?;
        let mv = ma.operand("moving", &moving_shape, mf)?;
        // One instruction is bounded (at most 256 x 128 x 512 multiply-adds): inline, unless
        // queued matmuls are settled first (then interruptible).
        let out = guard_work(py, self.queued_work(), || {
            self.settled()?.matmul_host(&st, &mv, bank, accumulate, mode, tile)
        })?;
        Ok(to_numpy(py, out))
    }

    /// Transpose mode issued from the host: PSUM `bank` receives `stationary.T` (flat codes of
    /// `format`, shape `[k, m]`) in its own dtype; `identity` is the `[k, k]` moving operand.
    #[allow(clippy::too_many_arguments)]
    fn transpose(
        &self, py: Python<'_>, stationary: &Bound<'_, PyAny>, k: usize, m: usize, format: &str,
        identity: &Bound<'_, PyAny>, identity_format: &str, bank: usize,
    ) -> PyTrn2Result<()> {
        let f = Format::parse("stationary", format)?;
        let idf = Format::parse("moving", identity_format)?;
        let sa = Codes::borrow(stationary, "stationary", f)?;
        let ia = Codes::borrow(identity, "moving", idf)?;
        let (shape, ishape) = ([k, m], [k, k]);
        let st = sa.operand("stationary", &shape, f)?;
        let id = ia.operand("moving", &ishape, idf)?;
        Ok(guard_work(py, self.queued_work(), || self.settled()?.transpose_host(&st, &id, bank))?)
    }

    /// PSUM `bank`, partitions `0..rows`, elements `0..cols` of `dtype`, as packed bytes.
    fn read_psum(
        &self, py: Python<'_>, bank: usize, rows: usize, cols: usize, dtype: &str,
    ) -> PyTrn2Result<Py<PyAny>> {
        let dt = Dtype::parse_name("dtype", dtype)?;
        let out =
            guard_work(py, self.queued_work(), || self.settled()?.read_psum(bank, rows, cols, dt))?;
        Ok(to_numpy(py, out))
    }

    /// Writes packed little-endian bytes (logical order) into a tile, outside any instruction.
    fn write(
        &self, py: Python<'_>, tile: &Bound<'_, PyAny>, data: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<()> {
        let t = tile_of(tile, "tile")?;
        let arr = borrow::<u8>(data, "data", "uint8")?;
        let bytes = slice(&arr, "data")?;
        self.with_settled(py, bytes.len(), |m| m.write_tile(&t, bytes))
    }

    /// A tile's elements as packed little-endian bytes (logical order).
    fn read(&self, py: Python<'_>, tile: &Bound<'_, PyAny>) -> PyTrn2Result<Py<PyAny>> {
        let t = tile_of(tile, "tile")?;
        let bytes = self.with_settled(py, t.elements(), |m| m.read_tile(&t))?;
        Ok(to_numpy(py, bytes))
    }

    /// `read(tile)` of a whole HBM tensor without a copy, for a last read: its buffer handed
    /// over as uint32 words, with the first and end byte of the tensor in them; the tensor is
    /// freed. None, nothing done, when `tile` is not a whole HBM tensor.
    fn take_hbm(
        &self, py: Python<'_>, tile: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<Option<(Py<PyAny>, usize, usize)>> {
        let t = tile_of(tile, "tile")?;
        let got = self.with_settled(py, 0, |m| m.take_hbm(&t))?;
        Ok(got.map(|(words, r)| (to_numpy(py, words), r.start, r.end)))
    }

    /// Whether an HBM tensor's bytes may have changed since it was made (False: they are still
    /// exactly the data it was made with).
    fn stored(&self, py: Python<'_>, tile: &Bound<'_, PyAny>) -> PyTrn2Result<bool> {
        let t = tile_of(tile, "tile")?;
        Ok(guard(py, || self.lock().stored(&t))?)
    }

    /// The byte ranges of an HBM tensor written so far (the whole buffer once fully written).
    fn written_ranges(
        &self, py: Python<'_>, tile: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<Vec<(u64, u64)>> {
        let t = tile_of(tile, "tile")?;
        Ok(guard(py, || self.lock().written_ranges(&t))?)
    }

    /// Keeps, from now on, the index of the instruction that last wrote each byte of an HBM
    /// tensor (``writers``).
    fn track_writers(&self, py: Python<'_>, tile: &Bound<'_, PyAny>) -> PyTrn2Result<()> {
        let t = tile_of(tile, "tile")?;
        Ok(guard(py, || self.lock().track_writers(&t))?)
    }

    /// The index of the instruction that last wrote each byte of an HBM tensor (uint32;
    /// 0xFFFFFFFF: none, or a write outside any instruction), or None when not kept.
    fn writers(&self, py: Python<'_>, tile: &Bound<'_, PyAny>) -> PyTrn2Result<Option<Py<PyAny>>> {
        let t = tile_of(tile, "tile")?;
        let w = guard(py, || self.lock().writers(&t))?;
        Ok(w.map(|v| to_numpy(py, v)))
    }

    /// Loop-carried reads among the recorded instructions `iterations[0] .. end`: up to `limit`
    /// pairs `(reader, writer)` where `reader` reads bytes last written in an earlier iteration.
    #[pyo3(signature = (iterations, end, limit = 16))]
    fn carried_reads(
        &self, py: Python<'_>, iterations: Vec<usize>, end: usize, limit: usize,
    ) -> PyTrn2Result<Vec<(u32, u32)>> {
        Ok(guard(py, || self.lock().carried_reads(&iterations, end, limit))?)
    }

    /// Instructions recorded so far.
    #[getter]
    fn instructions(&self) -> usize {
        self.lock().instructions()
    }

    /// The id of the kernel source line `file:line` (the same id for the same pair), for
    /// `set_location`.
    fn locate(&self, file: &str, line: u32) -> PyTrn2Result<u32> {
        Ok(self.lock().locate(file, line)?)
    }

    /// The source location (an id from `locate`, or `None`) stamped on the instructions issued
    /// from now on.
    #[pyo3(signature = (location))]
    fn set_location(&self, location: Option<u32>) -> PyTrn2Result<()> {
        Ok(self.lock().set_location(location)?)
    }

    /// The location id of recorded instruction `index` (`None`: issued with none).
    fn instruction_location(&self, index: usize) -> Option<u32> {
        self.lock().instruction_location(index)
    }

    /// Forgets the recorded program (memories keep their contents).
    fn clear_program(&self) {
        self.lock().clear_program();
    }

    /// Holds the last recorded instruction until `seconds` at least (a time the timeline gave,
    /// `KernelReport.times()`, taken back to its exact tick): the timeline starts it no
    /// earlier (the other core's clock at a rendezvous). `ValueError` naming `seconds` for a
    /// negative or non-finite time.
    fn hold_last(&self, seconds: f64) -> PyTrn2Result<()> {
        let tick = trn2core::machine::cost::ticks_of_seconds(seconds)?;
        Ok(self.lock().hold_last(tick)?)
    }

    /// Schedules the recorded program; trace slices for the first `trace_limit` instructions.
    #[pyo3(signature = (trace_limit = 1_000_000))]
    fn run(&self, py: Python<'_>, trace_limit: usize) -> PyTrn2Result<PyKernelReport> {
        let n = self.lock().instructions();
        let rep = guard_work(py, n as u64 * 64, || {
            self.lock().run_with(&timeline::Options { trace_limit })
        })?;
        Ok(PyKernelReport { inner: rep })
    }

    // ------------------------------------------------------------------ instructions

    /// Issues instruction `opcode` (a row of the core's instruction table) with its arguments,
    /// positional in the row's order or by name: each is converted by its kind, and the core
    /// checks them against the row, settles queued matmuls and executes the instruction.
    #[pyo3(signature = (opcode, *args, **kwargs))]
    fn issue(
        &self, py: Python<'_>, opcode: &Bound<'_, PyAny>, args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyTrn2Result<()> {
        self.issue_with(py, None, opcode, args, kwargs)
    }

    /// `issue` with the source `location` (an id from `locate`, or `None`) stamped on this
    /// instruction: a kernel front end's line in the same crossing as the instruction.
    #[pyo3(signature = (location, opcode, *args, **kwargs))]
    fn issue_at(
        &self, py: Python<'_>, location: Option<u32>, opcode: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyTrn2Result<()> {
        self.issue_with(py, Some(location), opcode, args, kwargs)
    }

    /// `issue_at(location, "tensor_tensor", engine, dst, data1, data2, op)` with its arguments
    /// fixed: a call without an argument tuple, the NKI front end's hot path (the same checks,
    /// errors and work as `issue_at`).
    #[allow(clippy::too_many_arguments)]
    fn tensor_tensor_at(
        &self, py: Python<'_>, location: Option<u32>, engine: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>, data1: &Bound<'_, PyAny>, data2: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
    ) -> PyTrn2Result<()> {
        let args = [engine, dst, data1, data2, op];
        if let Some(done) = self.small_tensor_tensor(py, Some(location), args) {
            return done;
        }
        let opcode = pyo3::types::PyString::new(py, Opcode::TensorTensor.name());
        let args = PyTuple::new(py, args)?;
        self.issue_with(py, Some(location), opcode.as_any(), &args, None)
    }
}

impl PyMachine {
    /// `issue` / `issue_at` (`at`: the location, when given).
    fn issue_with(
        &self, py: Python<'_>, at: Option<Option<u32>>, opcode: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyTrn2Result<()> {
        if kwargs.is_none() && args.len() == 5 && is_tensor_tensor(opcode) {
            let items = [0, 1, 2, 3, 4].map(|i| args.get_item(i));
            if let [Ok(e), Ok(d), Ok(x), Ok(y), Ok(o)] = items {
                if let Some(done) = self.small_tensor_tensor(py, at, [&e, &d, &x, &y, &o]) {
                    return done;
                }
            }
        }
        let name =
            opcode.cast::<pyo3::types::PyString>().ok().and_then(|n| n.to_str().ok()).ok_or_else(
                || {
                    Error::value(
                        "opcode",
                        format!("expected an instruction's name, got {}", shown(opcode)),
                    )
                },
            )?;
        let op = Opcode::parse("opcode", name)?;
        let row = table::info(op);
        let mut vals: Vec<Option<Value>> = vec![None; row.args.len().max(args.len())];
        for (i, x) in args.iter().enumerate() {
            if let Some(a) = row.args.get(i) {
                vals[i] = value_of(&x, a, a.name)?;
            } // too many: the core's check names the count
        }
        // Arguments given under an alias: errors name them as the caller wrote them.
        let mut aliased: Option<(&'static str, String)> = None;
        if let Some(kw) = kwargs {
            for (k, x) in kw.iter() {
                let k: String = k.extract().map_err(|_| {
                    Error::value("kwargs", format!("a keyword that is not text: {}", shown(&k)))
                })?;
                let i = row.index(&k).ok_or_else(|| {
                    Error::value(&k, format!("{} has no argument {k:?}", op.name()))
                })?;
                if vals[i].is_some() {
                    return Err(Error::value(&k, "given twice (by position and by name)").into());
                }
                vals[i] = value_of(&x, &row.args[i], &k)?;
                if row.args[i].name != k {
                    aliased = Some((row.args[i].name, k));
                }
            }
        }
        let rename = |e: Error| match &aliased {
            Some((from, to)) => e.renamed(from, to),
            None => e,
        };
        let elements = vals.iter().flatten().map(Value::elements);
        // Neither settling nor gathering: with the GIL held, whatever its size.
        let quick = self.lock().issues_without_settling(op, &vals);
        // An nc_matmul is queued: its arithmetic runs, in parallel with its neighbours', when
        // the next instruction or read settles the queue. The others settle the queue first
        // (the core does, inside `issue`; the binding only decides whether the GIL is released
        // and Ctrl-C honoured for that work).
        let work = if op == Opcode::NcMatmul {
            elements.sum::<usize>()
        } else {
            elements.max().unwrap_or(0)
        };
        let issue = move |m: &mut Machine| {
            match at {
                Some(loc) => m.issue_at(op, vals, loc),
                None => m.issue(op, vals),
            }
            .map_err(rename)
        };
        if quick || (op == Opcode::NcMatmul && work < GIL_HELD_ELEMENTS) {
            return Ok(guard(py, || issue(&mut self.lock()))?);
        }
        if op == Opcode::NcMatmul {
            return Ok(guard_work(py, work as u64, || issue(&mut self.lock()))?);
        }
        self.with_queue(py, work, issue)
    }
}

impl PyMachine {
    /// The NKI front end's hot path, a small `tensor_tensor` issued positionally (an engine's
    /// name, three tiles, an operator's name) with nothing queued, without the general path's
    /// argument table: the same core call (`Machine::issue`'s, with the GIL held as there),
    /// without the vector of values and the lookups by name, under one lock (not three).
    /// `None` (nothing done) for any other call or argument, which the general path then
    /// takes and names the errors of.
    fn small_tensor_tensor(
        &self, py: Python<'_>, at: Option<Option<u32>>, args: [&Bound<'_, PyAny>; 5],
    ) -> Option<PyTrn2Result<()>> {
        fn named<T>(x: &Bound<'_, PyAny>, parse: impl Fn(&str) -> Result<T, Error>) -> Option<T> {
            parse(x.cast::<pyo3::types::PyString>().ok()?.to_str().ok()?).ok()
        }
        let small = |x: &Bound<'_, PyAny>| -> Option<Tile> {
            let t = x.cast::<PyTile>().ok()?.get().tile;
            (t.elements_u128() < GIL_HELD_ELEMENTS as u128).then_some(t)
        };
        let engine = named(args[0], |s| Engine::parse("engine", s))?;
        let (dst, x, y) = (small(args[1])?, small(args[2])?, small(args[3])?);
        let op = named(args[4], |s| AluOp::parse("op", s))?;
        let done = guard(py, || {
            let mut m = self.lock();
            if m.has_queued_work() {
                return Ok(false);
            }
            let issue = |m: &mut Machine| m.tensor_tensor(engine, &dst, &x, &y, op);
            match at {
                Some(loc) => m.at(loc, issue),
                None => issue(&mut m),
            }
            .map(|()| true)
        });
        match done {
            Ok(false) => None,
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(e.into())),
        }
    }
}

/// Whether `opcode` is the text "tensor_tensor".
fn is_tensor_tensor(opcode: &Bound<'_, PyAny>) -> bool {
    opcode
        .cast::<pyo3::types::PyString>()
        .is_ok_and(|s| s.to_str().is_ok_and(|s| s == Opcode::TensorTensor.name()))
}

/// An argument converted by its kind in the instruction table (`None`: not given).
fn value_of(x: &Bound<'_, PyAny>, a: &Arg, name: &str) -> PyTrn2Result<Option<Value>> {
    let bad = || -> PyTrn2Result<Option<Value>> {
        Err(Error::value(
            name,
            format!("expected {}, got {}", table::kind_expected(a.kind), shown(x)),
        )
        .into())
    };
    if x.is_none() {
        // `None` is "not given" for an optional argument (and a required one, which the core
        // then names); an argument with a default takes a value of its kind.
        return match a.default {
            ArgDefault::Absent | ArgDefault::Required => Ok(None),
            _ => bad(),
        };
    }
    let is_bool = x.is_instance_of::<pyo3::types::PyBool>();
    Ok(Some(match a.kind {
        Kind::Tile => Value::Tile(tile_of(x, name)?),
        Kind::Scalar => match x.cast::<PyTile>() {
            Ok(t) => Value::Tile(t.get().tile),
            Err(_) if is_bool => return bad(),
            Err(_) => match x.extract::<f64>() {
                Ok(v) => Value::Float(v),
                Err(_) => return bad(),
            },
        },
        Kind::Float => match x.extract::<f64>() {
            Ok(v) if !is_bool => Value::Float(v),
            _ => return bad(),
        },
        Kind::Int | Kind::Queue => match x.extract::<i64>() {
            Ok(v) if !is_bool => Value::Int(v),
            _ => return bad(),
        },
        Kind::Bool => match x.extract::<bool>() {
            Ok(v) => Value::Bool(v),
            _ => return bad(),
        },
        Kind::Pattern => match x.extract::<Vec<(i64, u64)>>() {
            Ok(v) => Value::Pattern(v),
            _ => return bad(),
        },
        Kind::Pair => match x.extract::<(usize, usize)>() {
            Ok((p, q)) => Value::Pair(p, q),
            _ => return bad(),
        },
        Kind::Tiles => {
            if x.is_instance_of::<pyo3::types::PyString>() {
                return bad();
            }
            let Ok(items) = x.try_iter() else {
                return bad();
            };
            let mut tiles = Vec::new();
            for item in items {
                let Ok(item) = item else {
                    return bad();
                };
                tiles.push(tile_of(&item, name)?);
            }
            Value::Tiles(tiles)
        }
        Kind::Ints => match x.extract::<Vec<i64>>() {
            Ok(v) if !x.is_instance_of::<pyo3::types::PyString>() => Value::Ints(v),
            _ => return bad(),
        },
        Kind::Alu | Kind::Act | Kind::Engine | Kind::ReduceCmd | Kind::PerfMode => {
            match x.cast::<pyo3::types::PyString>() {
                Ok(v) => match v.to_str() {
                    Ok(v) => Value::name(a.kind, name, v)?,
                    Err(_) => return bad(),
                },
                Err(_) => return bad(),
            }
        }
    }))
}

/// The timeline of a recorded program (a value: frozen, read through getters).
#[pyclass(name = "KernelReport", module = "trn2core._core", frozen)]
pub struct PyKernelReport {
    inner: KernelReport,
}

view_pymethods! {
    impl PyKernelReport {
        get {
            /// Makespan, seconds.
            seconds: f64,
            /// Makespan in ticks of 4.8 GHz.
            ticks: u64,
            /// Instructions scheduled.
            instructions: u64,
            /// Bytes moved by DMA.
            dma_bytes: u64,
            /// Bytes of those the compiler's spills and reloads moved.
            spill_bytes: u64,
            /// DMA queue time of the spills and reloads, seconds.
            spill_s: f64,
        }
        /// Per queue: `(name, busy seconds, utilization, instructions)`.
        #[getter]
        fn queues(&self) -> Vec<(&'static str, f64, f64, u64)> {
            self.inner
                .queues
                .iter()
                .map(|q| (q.name, q.busy_s, q.utilization, q.instructions))
                .collect()
        }

        /// Busy time per source line and queue: `(file, line, queue, busy seconds,
        /// instructions)`, `file` and `line` `None` for instructions issued with no location.
        #[getter]
        #[allow(clippy::type_complexity)]
        fn lines(&self) -> Vec<(Option<String>, Option<u32>, &'static str, f64, u64)> {
            let locs = &self.inner.locations;
            self.inner
                .lines
                .iter()
                .map(|l| {
                    let at = locs.get(l.location as usize);
                    (
                        at.map(|a| a.file.clone()),
                        at.map(|a| a.line),
                        l.queue.track(),
                        l.busy_s,
                        l.instructions,
                    )
                })
                .collect()
        }

        /// `(opcode, count)` for every opcode that ran.
        #[getter]
        fn opcodes(&self) -> Vec<(&'static str, u64)> {
            self.inner
                .opcodes
                .iter()
                .map(|(o, c)| (o.name(), *c))
                .collect()
        }

        /// The critical path: `(index, opcode, queue, start_s, end_s, waited_for, on)` with
        /// `waited_for` one of "start", "dependency", "queue" and `on` the instruction (or -1).
        #[getter]
        #[allow(clippy::type_complexity)]
        fn critical_path(&self) -> Vec<(u32, &'static str, &'static str, f64, f64, &'static str, i64)> {
            self.inner
                .critical_path
                .iter()
                .map(|s| {
                    let (w, on) = match s.wait {
                        Wait::Start => ("start", -1),
                        Wait::Peer => ("peer", -1),
                        Wait::Dependency(j) => ("dependency", j as i64),
                        Wait::Queue(j) => ("queue", j as i64),
                    };
                    (
                        s.index,
                        s.opcode.name(),
                        s.queue.track(),
                        s.start_s,
                        s.end_s,
                        w,
                        on,
                    )
                })
                .collect()
        }

        /// Instructions on the critical path.
        #[getter]
        fn critical_path_length(&self) -> usize {
            self.inner.critical_path.len()
        }

        /// Start and end of every instruction, seconds (two lists in issue order).
        fn times<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            let s = |t: &[u64]| -> Vec<f64> {
                t.iter()
                    .map(|&x| trn2core::machine::cost::seconds(x))
                    .collect()
            };
            d.set_item("start", PyList::new(py, s(&self.inner.start_ticks))?)?;
            d.set_item("end", PyList::new(py, s(&self.inner.end_ticks))?)?;
            Ok(d)
        }

        /// The Chrome/Perfetto trace JSON.
        fn trace_json(&self) -> String {
            self.inner.chrome_trace_json()
        }

        /// Writes the Chrome/Perfetto trace JSON to the file `path` in pieces (never held whole),
        /// with the GIL released and Ctrl-C honoured; `OSError` from the file system.
        fn save_trace(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
            use std::io::Write as _;
            let file = std::fs::File::create(&path)?;
            let mut w = std::io::BufWriter::with_capacity(timeline::TRACE_CHUNK, file);
            let mut failed: Option<std::io::Error> = None;
            let work = self.inner.slices.len() as u64 * 64;
            let written = guard_work(py, work, || {
                let cancel = trn2core::cancel::current();
                self.inner.write_chrome_trace(&cancel, &mut |chunk| {
                    // An I/O error stops the writer; it is raised as the OSError it is.
                    w.write_all(chunk.as_bytes()).map_err(|e| {
                        failed = Some(e);
                        Error::Interrupted
                    })
                })?;
                w.flush().map_err(|e| {
                    failed = Some(e);
                    Error::Interrupted
                })
            });
            match failed {
                Some(e) => Err(e.into()),
                None => written,
            }
        }

        fn __str__(&self) -> String {
            self.inner.to_string()
        }
    }
}
