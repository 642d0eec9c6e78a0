"""``NeuronCore`` (contract sections 2 and 7: one physical core, which is the machine of
``trn2core.machine``), ``gemm`` and ``estimate_gemm``.

Numbers come from the Rust core (bit-exact to ``trn2core.reference``); timing from its cost
models (the machine's timeline for a core's instructions; the GEMM planner's tile schedule for
``gemm``). This module only validates and arranges arguments and maps dtypes to formats.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _core, _names, _validate
from .dtypes import _FORMAT_OF_DTYPE, FORMAT_DTYPES, format_name
from .dtypes import UNSIGNED_OF_SIZE as _UINT
from .errors import (
    FormatError,
    ShapeError,
    SparsityError,
    Trn2ValueError,
)
from .machine import (
    DmaQueues,
    GpSimdEngine,
    KernelReport,
    ScalarEngine,
    TensorEngine,
    Tile,
    VectorEngine,
    dtype_name,
    np_dtype_of,
    to_machine,
)
from .numerics import ROUNDING_MODES, _check_seed, _env_seed
from .report import Report, Result
from .sparsity import SPARSITY_PATTERNS, SparseTensor

__all__ = ["NeuronCore", "GemmResult", "gemm", "estimate_gemm", "PERF_MODES"]

PERF_MODES = _names.PERF_MODES


def _tile(x):
    """The tile of a Tile or of an Allocation with one."""
    if isinstance(x, Tile):
        return x
    t = getattr(x, "tile", None)
    if isinstance(t, Tile):
        return t
    raise Trn2ValueError(
        f"tile: expected a Tile (core.tile, core.hbm_tensor, an allocation's .tile), got "
        f"{type(x).__name__}"
    )


def _format_of(x: np.ndarray, arg: str, declared: str | None = None) -> str:
    """The engine format of an array: from its dtype, or ``declared`` ("tf32" for a float32
    container holding tf32 values)."""
    fmt = _FORMAT_OF_DTYPE.get(x.dtype.newbyteorder("="))
    if declared is not None:
        declared = format_name(declared, arg)
        want = FORMAT_DTYPES[declared]
        if x.dtype != want:
            raise FormatError(f"{arg}: a {declared} operand must be a {want} array, got {x.dtype}")
        return declared
    if fmt is None:
        raise FormatError(
            f"{arg}: dtype {x.dtype} is not a tensor-engine format; the engine reads fp8_e4m3, "
            "fp8_e5m2, fp8_e3m4, bf16, fp16, tf32 or fp32 (convert with trn2core.quantize, or "
            "pass dtype= to gemm)"
        )
    return fmt


def _codes(x: np.ndarray) -> np.ndarray:
    """An instruction operand's codes, flat, C-contiguous and in native byte order, as unsigned
    integers of its width: the core widens them to fp32 itself (one crossing)."""
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return np.ascontiguousarray(x).reshape(-1).view(_UINT[x.dtype.itemsize])


class NeuronCore:
    """One physical NeuronCore-v3: one machine (``trn2core.machine``) with SBUF, PSUM
    (128 partitions x 8 banks x 2 KiB), the four engines, the DMA queues and one clock.
    ``matmul`` and ``read_psum`` address its PSUM by bank, as NKI's instructions do; every
    instruction, host-issued or not, lands on the same timeline (``run``/``report``).

    Memory (``trn2core.memory``): ``core.hbm``, ``core.sbuf``, ``core.psum`` (capacity, used,
    free), ``core.alloc(...)``, ``core.free(...)``; SBUF and PSUM have one account, the
    machine's allocator, which places ``tile``, ``alloc`` and NKI tensors alike. ``hbm``
    shares an ``HbmStack`` with the neighbouring core (stack ``index // 2``); by default the
    core gets a stack of its own.

    The whole core (contract section 7, docs/machine.md): SBUF/PSUM tiles (``core.tile``, or
    ``core.alloc(shape, dtype)``'s ``.tile``), HBM tensors (``core.hbm_tensor``), the engines
    ``core.vector``, ``core.scalar``, ``core.gpsimd``, ``core.pe`` and the DMA queues
    ``core.dma``, whose instructions compute their bits when issued, and ``core.run()``, the
    engine-parallel timeline of everything issued. ``uninitialized="nan"`` fills new memory
    with NaN instead of refusing reads of never-written bytes; ``rounding="stochastic"`` (with
    ``seed``) rounds engine outputs stochastically. The default seed 0 is the Neuron runtime's:
    every core made without a seed draws the same random bits; ``seed="random"`` takes a fresh
    one from the operating system, kept as ``core.seed``.
    """

    def __init__(
        self,
        index: int = 0,
        *,
        hbm=None,
        uninitialized: str = "error",
        rounding: str = "nearest_even",
        seed: int | str = 0,
    ) -> None:
        from . import spec
        from .memory import CoreMemory

        index = _validate.integer(index, "index", lo=0, hi=spec.cores_per_chip - 1)
        seed = _check_seed(seed)
        #: The stochastic-rounding seed of the core's engines (drawn for ``seed="random"``).
        self.seed = seed
        self.memory = CoreMemory(index, hbm)
        self._index = index
        self._m = _core.Machine(
            _validate.text(uninitialized, "uninitialized", cls=FormatError),
            _validate.text(rounding, "rounding", cls=FormatError),
            seed,
        )
        # One account of SBUF and PSUM: the machine's allocator (tiles, ``alloc``, DMA checks).
        self.memory._machine = self._m
        self.memory._reserve = self._reserve
        #: The Vector engine (DVE).
        self.vector = VectorEngine(self._m)
        #: The Scalar engine (ACT).
        self.scalar = ScalarEngine(self._m)
        #: The GpSimd engine (POOL).
        self.gpsimd = GpSimdEngine(self._m)
        #: The tensor engine (PE).
        self.pe = TensorEngine(self._m)
        #: The 16 DMA queues.
        self.dma = DmaQueues(self._m)
        self._names = 0

    def _name(self, name) -> str:
        if name is None:
            self._names += 1
            return f"t{self._names}"
        return _validate.text(name, "name")

    def tile(
        self,
        shape,
        dtype,
        *,
        space: str = "sbuf",
        name=None,
        start_partition: int = 0,
        address=None,
    ):
        """A tensor of ``shape`` (partition axis first, at most 128) and ``dtype`` in SBUF or
        PSUM (first fit from ``start_partition``, or at byte ``address`` of each partition);
        returns its tile. ``CapacityError`` when it does not fit (SBUF: 212,984 B usable per
        partition; PSUM: 16 KiB in banks of 2 KiB)."""
        shape = _validate.shape(shape, "shape")
        space = _validate.text(space, "space")
        start_partition = _validate.integer(start_partition, "start_partition", lo=0, hi=2**32 - 1)
        if address is not None:
            address = _validate.integer(address, "address", lo=0, hi=_validate.U64_MAX)
        return self._m.alloc(
            list(shape), dtype_name(dtype), space, self._name(name), start_partition, address
        )

    def hbm_tensor(self, data=None, *, shape=None, dtype=None, name=None):
        """An HBM tensor holding ``data`` (converted to ``dtype`` if given, else of its own
        NeuronCore dtype), or, without data, an uninitialised one of ``shape`` and ``dtype``
        (an output: DMA writes it). Returns its tile (first axis = the tile's partition axis)."""
        if data is None:
            if shape is None or dtype is None:
                raise Trn2ValueError("shape: an HBM tensor without data needs shape and dtype")
            shape = _validate.shape(shape, "shape")
            return self._m.hbm_tensor(self._name(name), list(shape), dtype_name(dtype), None)
        a = _validate.array(data, "data")
        dt = dtype_name(a.dtype if dtype is None else dtype, "dtype")
        name = self._name(name)
        packed = _packed(a, dt, "data")
        shape = list(packed.shape) or [1]
        return self._m.hbm_tensor(name, shape, dt, packed.reshape(-1).view(np.uint8))

    def read(self, tile) -> np.ndarray:
        """A tile's elements as a fresh numpy array of its shape and dtype."""
        t = _tile(tile)
        raw = self._m.read(t)
        return raw.view(np_dtype_of(t.dtype)).reshape(t.shape)

    def write(self, tile, data) -> None:
        """Writes ``data`` (converted to the tile's dtype, as many elements as the tile has)
        into ``tile``, outside any instruction (how inputs reach SBUF without a DMA)."""
        t = _tile(tile)
        a = _validate.array(data, "data")
        packed = _packed(a, t.dtype, "data").reshape(-1)
        self._m.write(t, packed.view(np.uint8))

    def run(self, *, trace_limit: int = 1_000_000) -> KernelReport:
        """Schedules every instruction issued so far on the engines' queues (docs/machine.md,
        "Time"): the makespan, busy times, critical path and trace."""
        trace_limit = _validate.integer(trace_limit, "trace_limit", lo=0, hi=_validate.U64_MAX)
        return KernelReport.from_core(self._m.run(trace_limit))

    def clear_program(self) -> None:
        """Forgets the instructions issued so far (memories keep their contents)."""
        self._m.clear_program()

    @property
    def hbm(self):
        """The core's HBM stack (24 GiB, shared with its neighbour on a chip): a live view."""
        return self.memory.hbm

    @property
    def sbuf(self):
        """SBUF, 128 partitions x 224 KiB of which 212,984 B each are usable (the compiler's
        limit): a live view of the machine's allocator (capacity, used, free, ...)."""
        return self.memory.sbuf

    @property
    def psum(self):
        """PSUM, 128 partitions x 16 KiB: a live view of the machine's allocator (the tensor
        engine's bank contents are read with ``read_psum``)."""
        return self.memory.psum

    def alloc(self, size, dtype=None, *, space: str = "sbuf", name=None):
        """Reserves ``size`` bytes, or an array of shape ``size`` and ``dtype``, in ``space``
        ("hbm", "sbuf", "psum"); ``CapacityError`` if it does not fit (see
        ``trn2core.memory.CoreMemory.alloc``). SBUF and PSUM are the machine's: its allocator
        places the reservation (within the compiler's usable 212,984 B per SBUF partition),
        beside the tiles of ``tile``, and ``core.sbuf``/``core.psum`` count both. An
        allocation by shape (partition axis first, at most 128, at most 5 axes) of a
        NeuronCore dtype is a machine tensor: its ``.tile`` (and ``a[...]``) goes to the
        engines; other reservations are bytes over the partitions, ``.tile`` None."""
        return self.memory.alloc(size, dtype, space=space, name=name)

    def _reserve(self, space: str, name, shape, dt, nbytes: int):
        """``CoreMemory.alloc`` of SBUF/PSUM on this core: one reservation in the machine."""
        from .memory import Allocation

        machine_dtype = None
        if (
            shape is not None
            and 0 < len(shape) <= 5
            and 0 < shape[0] <= 128
            and all(0 < d < 2**32 for d in shape)
        ):
            try:
                machine_dtype = dtype_name(dt)
            except FormatError:
                machine_dtype = None  # bytes of a dtype the engines do not take (float64, ...)
        stack = self.memory._native.placement()[2]
        info, tile = self._m.reserve(
            "size",
            space,
            self._name(name),
            None if shape is None else list(shape),
            1 if dt is None else dt.itemsize,
            nbytes,
            machine_dtype,
            stack,
        )
        a = Allocation(self.memory, info, shape, dt)
        a.tile = tile if machine_dtype is not None else None
        return a

    def free(self, allocation) -> None:
        """Releases an allocation made by ``alloc`` (and its tile), or a tile's tensor."""
        if isinstance(allocation, Tile):
            self._m.free(allocation)
            return
        self.memory.free(allocation)

    @property
    def index(self) -> int:
        return self._index

    @property
    def sbuf_bytes(self) -> int:
        from . import spec

        return spec.sbuf_bytes

    @property
    def psum_bytes(self) -> int:
        from . import spec

        return spec.psum_bytes

    def matmul(
        self,
        stationary,
        moving,
        *,
        bank: int = 0,
        accumulate: bool = False,
        perf_mode: str = "none",
        tile_position: tuple[int, int] | None = None,
        tile_size: tuple[int, int] | None = None,
        formats: tuple[str | None, str | None] = (None, None),
        is_transpose: bool = False,
    ) -> np.ndarray:
        """One ``nc_matmul``: ``stationary.T @ moving`` into PSUM ``bank`` (returned, float32),
        issued on this core's machine: the operands go to SBUF as ``write`` puts them there (no
        time), the instruction runs on the tensor engine's queue of the core's one timeline, and
        a PSUM tile allocated over the bank sees the result.

        ``stationary`` is ``[K, M]`` and ``moving`` ``[K, N]`` (``K <= 128``, ``M <= 128``,
        ``N <= 512``), or ``[128, 2, M]`` / ``[128, 2, N]`` with ``perf_mode="double_row"`` (fp8
        only). Formats come from the dtypes; ``formats=("tf32", "tf32")`` declares float32
        containers of tf32 values. ``accumulate=True`` adds into the bank's region, which a
        matmul must have written first. ``tile_position``/``tile_size`` select a PE tile (row
        tiling 2x64 / 4x32, column tiling likewise); the output lands on the partitions of the
        tile's columns.
        """
        s = _validate.array(stationary, "stationary")
        m = _validate.array(moving, "moving")
        if not isinstance(formats, (tuple, list)) or len(formats) != 2:
            raise Trn2ValueError(
                f"formats: expected a pair (stationary format, moving format), got {formats!r}"
            )
        sf = _format_of(s, "stationary", formats[0])
        is_transpose = _validate.boolean(is_transpose, "is_transpose")
        mf = _format_of(m, "moving", formats[1])
        pos = _validate.pair(tile_position, "tile_position")
        size = _validate.pair(tile_size, "tile_size")
        perf_mode = _perf_mode(perf_mode)
        accumulate = _validate.boolean(accumulate, "accumulate")
        if is_transpose:
            # Every argument is checked above, then refused here if transpose mode has no use
            # for it (junk was silently ignored before).
            unused = {
                "perf_mode": perf_mode != "none",
                "tile_position": pos is not None,
                "tile_size": size is not None,
                "accumulate": accumulate,
            }
            given = {
                "perf_mode": perf_mode,
                "tile_position": pos,
                "tile_size": size,
                "accumulate": accumulate,
            }
            for arg, bad in unused.items():
                if bad:
                    raise Trn2ValueError(
                        f"{arg}: transpose mode passes the whole stationary tile through the PE "
                        f"array into a fresh bank region and takes no {arg}; got {given[arg]!r}"
                    )
            return self._transpose(s, m, sf, mf, bank)
        out = self._m.matmul(
            _codes(s),
            list(s.shape),
            sf,
            _codes(m),
            list(m.shape),
            mf,
            _bank(bank),
            accumulate,
            perf_mode,
            pos,
            size,
        )
        return out.reshape(s.shape[-1], m.shape[-1])

    def _transpose(self, s, m, sf, mf, bank) -> np.ndarray:
        # Transpose mode: `moving` must be the identity of size K (the kernel idiom); the PE
        # passes the stationary tile through bit for bit. The result keeps the input's dtype
        # (the hardware writes 16-bit PSUM elements for 16-bit inputs, fp8 in the low byte).
        if s.ndim != 2:
            raise ShapeError(f"stationary: transpose mode takes a [K, M] tile, got {s.shape}")
        k, mm = s.shape
        limit = _core_limits()
        if not (1 <= k <= limit[0] and 1 <= mm <= limit[1]):
            raise ShapeError(
                f"stationary: transpose mode takes a [K, M] tile with 1 <= K <= {limit[0]} and "
                f"1 <= M <= {limit[1]}, got {s.shape}"
            )
        ident = np.eye(k)
        if m.shape != (k, k) or not np.array_equal(np.asarray(m, dtype=np.float64), ident):
            raise ShapeError(
                f"moving: transpose mode needs the identity matrix [{k}, {k}] as moving, "
                f"got shape {m.shape}"
            )
        self._m.transpose(_codes(s), k, mm, sf, _codes(m), mf, _bank(bank))
        # A fresh array, never a view of the caller's (s.T of a Fortran-ordered s is
        # C-contiguous already, and ascontiguousarray would return it as is).
        return np.array(s.T, order="C", copy=True)

    def dma_copy(self, x, *, src="hbm", dst="sbuf", codec: str = "none", queue: int = 0):
        """Costs a DMA transfer of ``x`` on this core's 16 DMA engines, DMA queue ``queue``
        (see ``trn2core.dma.dma_copy``). ``src``/``dst`` are memory names or allocations from
        ``alloc``; a destination that cannot hold ``x`` raises ``CapacityError``."""
        from .dma import dma_copy

        return dma_copy(x, src=src, dst=dst, codec=codec, queue=queue, memory=self.memory)

    def read_psum(self, bank: int, rows: int, cols: int, dtype="fp32") -> np.ndarray:
        """PSUM ``bank``, partitions ``0..rows``, elements ``0..cols`` of ``dtype`` (fp32, as
        matmuls write; a transpose of 16-bit or fp8 data leaves elements of its own dtype)."""
        rows = _validate.integer(rows, "rows", lo=0, hi=_validate.U64_MAX, cls=ShapeError)
        cols = _validate.integer(cols, "cols", lo=0, hi=_validate.U64_MAX, cls=ShapeError)
        dt = dtype_name(dtype, "dtype")
        raw = self._m.read_psum(_bank(bank), rows, cols, dt)
        return raw.view(np_dtype_of(dt)).reshape(rows, cols)

    def report(self) -> KernelReport:
        """The timeline of every instruction issued on this core so far (``run()``)."""
        return self.run()

    def _gemm_cores(self) -> None:
        """``gemm(core=...)``: a NeuronCore is costed on its own (no split)."""
        return None

    def __repr__(self) -> str:
        return f"NeuronCore(index={self.index})"


def _packed(a: np.ndarray, dtype: str, arg: str) -> np.ndarray:
    """``a`` converted to machine ``dtype``, C-contiguous: the host check of the copy (and of
    the float64 temporaries of an integer conversion) first, so a broadcast view of 2**32
    elements is a ``CapacityError`` naming ``arg``, not a 16 GiB copy."""
    itemsize = np_dtype_of(dtype).itemsize
    temporaries = 0 if a.dtype == np_dtype_of(dtype) or dtype in FORMAT_DTYPES else 16
    n = int(a.size)
    _validate.check_alloc(
        n * (itemsize + temporaries),
        arg,
        f"the {dtype} copy of {arg} ({n} elements of shape {a.shape})",
    )
    return np.ascontiguousarray(to_machine(a, dtype))


def _bank(bank) -> int:
    from . import spec

    return _validate.integer(bank, "bank", lo=0, hi=spec.psum_banks - 1)


def _core_limits() -> tuple[int, int]:
    """The largest contraction and stationary free size of one instruction."""
    from . import spec

    return spec.matmul_contraction_max, spec.matmul_stationary_free_max


def _perf_mode(perf_mode) -> str:
    return _validate.name(perf_mode, "perf_mode", PERF_MODES, what="perf_mode")


@dataclasses.dataclass(frozen=True, repr=False)
class GemmResult(Result):
    """``out``: the result (fp32 PSUM values, or ``out_dtype``); ``report``: its timing.
    ``to_dict()`` gives ``out`` as its shape and dtype; the repr never prints the array."""

    out: np.ndarray
    report: Report
    #: The stochastic-rounding seed used (``a``'s and the output's; ``b`` used ``seed + 1``):
    #: the one drawn for ``seed="random"``; None when nothing was rounded stochastically.
    seed: int | None = None


def _operand(x, arg: str) -> tuple[np.ndarray, str, bool]:
    """``(view, dtype name, swapped)``: the matrix ``x`` as a 2-D array of unsigned integers of
    its element width, in its own layout and byte order (no copy; ``swapped`` when that order is
    not the host's), for the core to read as the dtype says. Only layouts the core cannot address
    (misaligned data, strides that are not whole elements) are copied, after the host check."""
    x = _validate.array(x, arg)
    if x.ndim != 2:
        raise ShapeError(f"{arg}: expected a 2-D matrix, got shape {x.shape}")
    dt = x.dtype
    if dt.itemsize not in _UINT:
        raise FormatError(
            f"{arg}: dtype {dt} is not a supported real number type; expected float64, float32, "
            "float16, an integer type, or an ml_dtypes bfloat16/float8 dtype"
        )
    if not x.flags.aligned or any(s % dt.itemsize for s in x.strides):
        _validate.check_alloc(x.nbytes, arg, f"a contiguous copy of the {x.shape} {dt} matrix")
        x = np.array(x, order="C")  # a fresh, aligned copy
    return x.view(_UINT[dt.itemsize]), dt.name, not dt.isnative


def _seeds(rounding: str, seed: int | None) -> tuple[int, int]:
    """Stochastic-rounding seeds of ``a`` (and the output) and ``b``: ``seed`` and ``seed + 1``,
    or both ``$NEURON_RT_STOCHASTIC_ROUNDING_SEED`` (default 0) when no seed is given."""
    if seed is not None:
        return seed, (seed + 1) % 2**64
    env = _env_seed() if rounding == "stochastic" else 0
    return env, env


def _sparsity_pattern(pattern, perf_mode: str) -> str:
    if not isinstance(pattern, str) or pattern.strip() not in SPARSITY_PATTERNS:
        raise Trn2ValueError(
            f"sparsity: unknown sparsity pattern {pattern!r}; expected one of {SPARSITY_PATTERNS}"
        )
    if perf_mode == "double_row":
        raise Trn2ValueError(
            f"perf_mode: a sparse ({pattern}) stationary operand does not combine with "
            "double_row; use perf_mode='none'"
        )
    return pattern.strip()


def estimate_gemm(
    M: int,
    K: int,
    N: int,
    *,
    dtype: str = "bf16",
    core=None,
    perf_mode: str = "none",
    sparsity: str | None = None,
    throttle: bool = True,
    lnc: int | None = None,
) -> Report:
    """Timing of ``[M, K] @ [K, N]`` with ``dtype`` operands, walking the GEMM's tile schedule
    without data (shapes far beyond host memory cost milliseconds). ``throttle=False`` turns
    off the dI/dt throttle model (on by default, as on the hardware). ``lnc=2`` (or 4) costs it
    on one Logical NeuronCore of that many physical cores (``core=Chip(lnc=2).cores[0]``);
    ``lnc=1`` and the default (neither ``core`` nor ``lnc``) on one physical NeuronCore."""
    perf_mode = _perf_mode(perf_mode)
    if sparsity is not None:
        sparsity = _sparsity_pattern(sparsity, perf_mode)
    cores = _gemm_cores(core, lnc)
    m, k, n = (
        _validate.integer(v, name, lo=1, hi=_validate.U64_MAX, cls=ShapeError)
        for name, v in (("M", M), ("K", K), ("N", N))
    )
    dtype = format_name(dtype, "dtype")
    throttle = _validate.boolean(throttle, "throttle")
    fields = _estimate(cores, m, k, n, dtype, perf_mode, throttle, False, sparsity)[0]
    return _report(fields, cores, m, k, n, dtype, perf_mode, throttle, sparsity)


def gemm(
    a,
    b,
    *,
    core=None,
    dtype: str | None = None,
    perf_mode: str = "none",
    out_dtype: str = "fp32",
    rounding: str = "nearest_even",
    seed: int | str | None = None,
    throttle: bool = True,
    lnc: int | None = None,
) -> GemmResult:
    """``a @ b`` exactly as the tensor engine computes it, and how long it takes.

    ``a`` ``[M, K]`` supplies the stationary tiles, ``b`` ``[K, N]`` the moving ones; K is cut
    into tiles of 128 (256 in double_row), each tile summed from +0.0 in ascending k and added
    to the PSUM accumulator with one fp32 rounding (see docs/engine.md). With ``dtype``, float
    inputs are first quantized to it (``rounding``/``seed``; ``b`` uses ``seed + 1`` so the two
    operands draw different random bits). ``out_dtype`` other than fp32 quantizes the PSUM
    result on the way out with the same ``rounding``. Unseeded, stochastic rounding draws the
    same bits on every call (the Neuron runtime's default seed 0, or
    ``$NEURON_RT_STOCHASTIC_ROUNDING_SEED``); ``seed="random"`` takes a fresh seed from the
    operating system each call, reported back as the result's ``seed``.

    One call into the core: the operands go in as they are (any dtype, layout and byte order,
    or a ``SparseTensor``'s compressed parts) and are quantized while the kernel packs them.

    ``core`` (a NeuronCore, LogicalCore or Chip) or ``lnc`` (1, 2 or 4: one Logical NeuronCore
    of that many physical cores) says where it runs; with neither, one physical NeuronCore (the
    contract's default; the command line's default is ``NEURON_LOGICAL_NC_CONFIG``, else 2).
    """
    cores = _gemm_cores(core, lnc)
    perf_mode = _perf_mode(perf_mode)
    if dtype is not None:
        dtype = format_name(dtype, "dtype")
    out_dtype = format_name(out_dtype, "out_dtype")
    rounding = _validate.name(rounding, "rounding", ROUNDING_MODES, what="rounding mode")
    if seed is not None:
        seed = _check_seed(seed)
    throttle = _validate.boolean(throttle, "throttle")
    sparsity = None
    if isinstance(a, SparseTensor):
        if a.ndim != 2 or a.axis != 1:
            raise SparsityError(
                f"a: a sparse stationary operand is a [M, K] matrix pruned along K (axis 1); "
                f"got shape {a.shape} sparse along axis {a.axis}"
            )
        sparsity = _sparsity_pattern(a.pattern, perf_mode)
        values = a.values.reshape(-1).view(_UINT[a.dtype.itemsize])
        a_args = (values, a.dtype.name, False, (a.indices, a.pattern, a.shape))
        m, k = a.shape
    else:
        view, name, swapped = _operand(a, "a")
        a_args = (view, name, swapped, None)
        m, k = view.shape
    b_args = _operand(b, "b")
    n = b_args[0].shape[1]
    seeds = _seeds(rounding, seed)
    out, fields, cost = _core.gemm(
        *a_args,
        *b_args,
        dtype,
        rounding,
        seeds,
        perf_mode,
        out_dtype,
        throttle,
        cores,
    )
    out = out.view(FORMAT_DTYPES[out_dtype]).reshape(m, n)
    report = _report(fields, cores, m, k, n, cost, perf_mode, throttle, sparsity)
    return GemmResult(out=out, report=report, seed=seeds[0] if rounding == "stochastic" else None)


def _gemm_cores(core, lnc=None) -> list[int] | None:
    """The physical cores ``core`` splits a GEMM over (``None``: one NeuronCore, costed on its
    own). ``core`` must be None, a NeuronCore, or a LogicalCore or Chip (``trn2core.chip``);
    ``lnc`` (instead of ``core``) names logical core 0 of a chip at that LNC (1: one physical
    NeuronCore, the default)."""
    if lnc is not None:
        if core is not None:
            raise Trn2ValueError(
                "lnc: give core= or lnc=, not both (lnc=L means core=Chip(lnc=L).cores[0])"
            )
        lnc = _validate.integer(lnc, "lnc", lo=1, hi=4)
        members = list(_core.logical_core_members(lnc, 0))
        return None if len(members) == 1 else members
    if core is None:
        return None
    if not callable(getattr(type(core), "_gemm_cores", None)):
        raise Trn2ValueError(
            f"core: expected a NeuronCore, LogicalCore or Chip, got {type(core).__name__}"
        )
    return core._gemm_cores()


def _estimate(cores, m, k, n, dtype, perf_mode, throttle, trace, sparsity):
    """The timing of a GEMM on one NeuronCore (``cores`` None) or split over ``cores``: one
    call, which also checks the engine's format rule."""
    return _core.estimate_gemm(m, k, n, dtype, perf_mode, throttle, trace, sparsity, cores)


def _report(fields, cores, m, k, n, dtype, perf_mode, throttle, sparsity) -> Report:
    """A Report of these fields whose trace is computed when first saved."""

    def retrace() -> str:
        return _estimate(cores, m, k, n, dtype, perf_mode, throttle, True, sparsity)[1]

    return Report.from_fields(fields, retrace=retrace)
