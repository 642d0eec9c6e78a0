"""The memory hierarchy of a NeuronCore-v3 as capacities: ``core.hbm``, ``core.sbuf``,
``core.psum``, ``core.alloc(...)`` and ``core.free(...)``.

- HBM: 4 stacks x 24 GiB per chip; stack ``s`` serves the adjacent cores ``2s`` and ``2s + 1``
  and sits on die ``s // 2``. An :class:`HbmStack` object can be handed to both of its cores
  (``NeuronCore(4, hbm=stack)``, ``NeuronCore(5, hbm=stack)``): a chip owns its four stacks
  and shares each between two cores. A standalone core gets a stack of its own.
- SBUF: 128 partitions x 224 KiB (28 MiB); PSUM: 128 partitions x 16 KiB (2 MiB). A tensor
  ``[P, F]`` takes ``F`` bytes on ``P`` consecutive partitions; a first axis longer than 128 is
  folded onto the 128 partitions, and a size given in bytes is spread over all 128.

Requests beyond capacity raise :class:`~trn2core.CapacityError` (also a ``MemoryError``)
naming the argument, the size and the limit, before anything is reserved. The model keeps
accounts only: no host memory stands behind an allocation, so ``core.alloc(10**15)`` is refused
at once. The rules live in the Rust core (``rust/trn2core/src/memory.rs``); see docs/dma.md.
"""

from __future__ import annotations

import math

import numpy as np

from . import _core, _validate
from ._names import MEMORIES
from .dtypes import FORMAT_DTYPES
from .errors import CapacityError, FormatError, ShapeError, Trn2ValueError

__all__ = ["SPACES", "HbmStack", "MemorySpace", "Allocation", "CoreMemory"]

#: The memories one core reaches.
SPACES: tuple[str, ...] = MEMORIES

_U64 = 1 << 64
_fmt = _validate.human_bytes


class HbmStack:
    """One HBM stack of a chip (24 GiB), shared by the two adjacent cores it serves.

    ``index`` 0..3; ``die`` (stacks 0, 1 on die 0); ``cores`` (the two cores it serves);
    ``capacity``, ``used``, ``free`` in bytes; ``allocations`` (live count)."""

    def __init__(self, index: int = 0, *, _native=None) -> None:
        if _native is None:
            _native = _core.HbmStack(_index(index, "index"))
        self._native = _native

    # Live attributes, read from the core on each access (as MemorySpace's).
    index = property(lambda self: self._native.placement().index)
    die = property(lambda self: self._native.placement().die)
    cores = property(lambda self: tuple(self._native.placement().cores))
    capacity = property(lambda self: self._native.usage().capacity)
    used = property(lambda self: self._native.usage().used)
    free = property(lambda self: self._native.usage().free)
    allocations = property(lambda self: self._native.usage().allocations)

    def __repr__(self) -> str:
        p, u = self._native.placement(), self._native.usage()
        return (
            f"HbmStack(index={p.index}, die={p.die}, cores={tuple(p.cores)}, "
            f"used={_fmt(u.used)} of {_fmt(u.capacity)})"
        )


class MemorySpace:
    """A live view of one memory of a core (``core.hbm``, ``core.sbuf``, ``core.psum``):
    ``name``, ``capacity``, ``used``, ``free`` (bytes); for SBUF/PSUM also ``partitions``,
    ``partition_bytes`` (capacity of one partition) and ``partition_free`` (the most bytes a
    tensor spanning all partitions could still take in each); ``allocations`` (live count)."""

    def __init__(self, memory: CoreMemory, name: str) -> None:
        self._memory = memory
        self.name = name

    def _usage(self):
        return self._memory._usage(self.name)

    capacity = property(lambda self: self._usage().capacity)
    used = property(lambda self: self._usage().used)
    free = property(lambda self: self._usage().free)
    partitions = property(lambda self: self._usage().partitions)
    partition_bytes = property(lambda self: self._usage().partition_bytes)
    partition_free = property(lambda self: self._usage().partition_free)
    allocations = property(lambda self: self._usage().allocations)

    def __repr__(self) -> str:
        u = self._usage()
        extra = f", {u.partitions} partitions x {_fmt(u.partition_bytes)}" if u.partitions else ""
        return (
            f"MemorySpace({self.name!r}, used={_fmt(u.used)} of {_fmt(u.capacity)}"
            f"{extra}, {u.allocations} allocations)"
        )


class Allocation:
    """A reservation made by ``core.alloc``: ``space``, ``nbytes`` (bytes reserved),
    ``partition_start``, ``partitions``, ``partition_bytes`` (SBUF/PSUM), ``stack`` (the HBM
    stack), ``shape`` and ``dtype`` (when allocated by shape), ``live``, and ``tile``: the
    machine tile of an on-chip allocation by shape that engine instructions take (None
    otherwise). Pass it to ``core.free`` (or call ``free()``) to release it, as ``src``/``dst``
    of ``core.dma_copy``, or to the engines (``core.vector.tensor_tensor(a, a, b)``); ``a[...]``
    slices its tile."""

    def __init__(self, memory: CoreMemory, native, shape, dtype) -> None:
        self._memory = memory
        self._native = native  # the core's allocation: it knows which memory made it
        self.space: str = native.space
        self.id: int = native.id
        self.nbytes: int = native.nbytes
        self.partition_start: int = native.partition_start
        self.partitions: int = native.partitions
        self.partition_bytes: int = native.partition_bytes
        self.stack: int = native.stack
        self.shape: tuple[int, ...] | None = shape
        self.dtype: np.dtype | None = dtype
        self.live = True
        self.tile = None

    def __getitem__(self, index):
        if self.tile is None:
            raise Trn2ValueError(
                f"index: {self!r} has no machine tile to slice (allocate an SBUF/PSUM tensor "
                "by shape with a NeuronCore dtype, at most 128 partitions)"
            )
        return self.tile[index]

    def free(self) -> None:
        """Releases the reservation (same as ``core.free(self)``)."""
        self._memory.free(self)

    def __repr__(self) -> str:
        where = (
            f"stack {self.stack}"
            if self.space == "hbm"
            else f"partitions {self.partition_start}..{self.partition_start + self.partitions}"
            f" x {_fmt(self.partition_bytes)}"
        )
        what = f" shape={self.shape} dtype={self.dtype}," if self.shape is not None else ""
        state = "" if self.live else ", freed"
        return f"Allocation({self.space!r},{what} {_fmt(self.nbytes)}, {where}{state})"


def _index(v, arg: str) -> int:
    # The core takes indices and dimensions as u64 (it checks the real limits).
    return _validate.integer(v, arg, lo=0, hi=_validate.U64_MAX)


def _dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype in FORMAT_DTYPES:
        return FORMAT_DTYPES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise FormatError(f"dtype: {dtype!r} is not a dtype ({e})") from None
    if dt.hasobject or dt.itemsize == 0:
        raise FormatError(f"dtype: {dt} has no fixed size in device memory")
    # Numbers only, as for arrays (``_validate.array``): bool, integers, floats, complex and
    # the ml_dtypes formats; not strings, datetimes or structured records.
    ml = dt.kind == "V" and dt.fields is None and dt.type is not np.void
    if not (dt.kind in "biufc" or ml):
        raise FormatError(
            f"dtype: {dt} is not a number type; expected bool, an integer, float or complex "
            "dtype, or a format name such as 'bf16'"
        )
    return dt


def _space(space) -> str:
    return _validate.name(space, "space", SPACES, cls=Trn2ValueError, what="memory")


class CoreMemory:
    """The memories of physical core ``core`` (0..7): its HBM stack (its own, or ``hbm``
    shared with the neighbouring core), its SBUF and its PSUM. ``NeuronCore`` holds one as
    ``core.memory`` and forwards ``hbm``, ``sbuf``, ``psum``, ``alloc`` and ``free``."""

    def __init__(self, core: int = 0, hbm: HbmStack | None = None) -> None:
        if hbm is not None and not isinstance(hbm, HbmStack):
            raise Trn2ValueError(f"hbm: expected a trn2core.memory.HbmStack, got {type(hbm)}")
        native_hbm = None if hbm is None else hbm._native
        self._native = _core.CoreMemory(_index(core, "index"), native_hbm)
        # A NeuronCore's memory: its machine is the one account of SBUF and PSUM (the core's
        # allocator places every tile, ``alloc`` and DMA check there); None when standalone.
        self._machine = None
        self._reserve = None
        self.hbm = MemorySpace(self, "hbm")
        self.sbuf = MemorySpace(self, "sbuf")
        self.psum = MemorySpace(self, "psum")

    @property
    def core(self) -> int:
        return self._native.placement()[0]

    @property
    def die(self) -> int:
        """The die the core sits on (cores 0-3 on die 0, 4-7 on die 1)."""
        return self._native.placement()[1]

    @property
    def hbm_stack(self) -> HbmStack:
        """The HBM stack this core reaches (shared with its neighbour on a chip)."""
        return HbmStack(_native=self._native.hbm_stack())

    def _usage(self, space: str):
        if self._machine is not None and space != "hbm":
            return self._machine.usage(space)
        return self._native.usage(space)

    def alloc(self, size, dtype=None, *, space: str = "sbuf", name=None) -> Allocation:
        """Reserves ``size`` bytes (an int) or an array of shape ``size`` (a tuple) and
        ``dtype`` (a numpy/ml_dtypes dtype or a format name such as ``"bf16"``) in ``space``
        ("hbm", "sbuf" or "psum"). Raises ``CapacityError`` when it does not fit, before
        anything is reserved. ``name``: the tensor's name on a NeuronCore's machine."""
        space = _space(space)
        if name is not None:  # checked before anything is reserved
            name = _validate.text(name, "name")
        if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
            if dtype is not None:
                raise Trn2ValueError(
                    "dtype: give a shape with a dtype, or a size in bytes without one"
                )
            nbytes = int(size)
            if nbytes < 0:
                raise Trn2ValueError(f"size: expected a byte count >= 0, got {nbytes}")
            self._refuse_beyond_u64("size", nbytes, space)
            if self._reserve is not None and space != "hbm":
                return self._reserve(space, name, None, None, nbytes)
            info = self._native.alloc("size", space, None, 1, nbytes)
            return Allocation(self, info, None, None)
        if isinstance(size, (tuple, list)):
            # No upper bound here: a dimension beyond 2**64 is a ShapeError below.
            shape = tuple(_validate.integer(d, "size", lo=0) for d in size)
            if dtype is None:
                raise Trn2ValueError("dtype: a shape needs a dtype (e.g. np.float32 or 'bf16')")
            dt = _dtype(dtype)
            nbytes = math.prod(shape) * dt.itemsize
            self._refuse_beyond_u64("size", nbytes, space)
            if any(d >= _U64 for d in shape):  # only possible with a zero elsewhere
                raise ShapeError(f"size: dimension beyond 2**64 in {shape}")
            if self._reserve is not None and space != "hbm":
                return self._reserve(space, name, shape, dt, nbytes)
            info = self._native.alloc("size", space, list(shape), dt.itemsize, 0)
            return Allocation(self, info, shape, dt)
        raise Trn2ValueError(
            f"size: expected a byte count (int) or a shape (tuple), got {type(size).__name__}"
        )

    def _refuse_beyond_u64(self, arg: str, nbytes: int, space: str) -> None:
        if nbytes >= _U64:
            cap = self._native.usage(space).capacity
            raise CapacityError(
                f"{arg}: {nbytes} B does not fit in {space.upper()} of {_fmt(cap)} "
                "(nor in any memory: it is beyond 2**64 bytes)"
            )

    def free(self, allocation: Allocation) -> None:
        """Releases ``allocation``. ``Trn2ValueError`` if it was freed already or belongs to
        another core's SBUF/PSUM or another HBM stack."""
        if not isinstance(allocation, Allocation):
            raise Trn2ValueError(
                f"allocation: expected an Allocation from core.alloc, got {type(allocation)}"
            )
        # The core refuses an allocation another memory made (it carries its owner).
        if self._machine is not None and allocation.space != "hbm":
            self._machine.release(allocation._native)
        else:
            self._native.free(allocation._native)
        allocation.live = False

    def __repr__(self) -> str:
        core, die, stack = self._native.placement()
        return f"CoreMemory(core={core}, die={die}, hbm_stack={stack})"
