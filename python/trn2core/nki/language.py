"""``nki.language`` (``nl``) on the emulated NeuronCore: tensors, memories, dtypes, loops, the
SPMD queries, and the element-wise, reduction and data-movement functions.

After ``trn2core.nki.install()``, ``import nki.language as nl`` (and the legacy
``neuronxcc.nki.language``) give this module. The functions lower onto the machine's
instructions (``trn2core.nki._runtime.Core``): binary operators on the Vector engine
(``tensor_tensor``, or ``tensor_scalar`` with a number or a ``[P, 1]`` float32 tile), activation
functions on the Scalar engine, reductions with ``tensor_reduce``, ``load``/``store`` with DMA,
``matmul``/``transpose`` on the tensor engine. Which engine each one uses is trn2core's choice
where NKI leaves it to the compiler (docs/nki.md lists them).
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import functools
import math
import os

import ml_dtypes
import numpy as np

from .. import spec as _spec
from ..errors import ShapeError, Trn2ValueError
from . import _dtypes as D
from ._api import user_frame
from ._index import IndexExpr, Mask, NotSupportedError, is_int
from ._index import arange as _arange
from ._index import mgrid as _mgrid
from ._ops import Op, alu_name
from ._register import VirtualRegister
from ._runtime import (
    HBM,
    PRIVATE_HBM,
    PSUM,
    SBUF,
    SHARED_HBM,
    Core,
    api,
    current,
    scalar_arg,
)
from ._surface import NKIObject
from ._tensor import DS, Buffer, Indirect, NkiTensor, PartitionDimError, Placement

# ----------------------------------------------------------------------------- dtypes
bool_ = D.bool_
int8 = D.int8
int16 = D.int16
int32 = D.int32
uint8 = D.uint8
uint16 = D.uint16
uint32 = D.uint32
float16 = D.float16
float32 = D.float32
bfloat16 = D.bfloat16
tfloat32 = D.tfloat32
float8_e4m3 = D.float8_e4m3
float8_e5m2 = D.float8_e5m2
float8_e4m3fn = D.float8_e4m3fn
float8_e8m0fnu = D.float8_e8m0fnu
float8_e5m2_x4 = D.float8_e5m2_x4
float8_e4m3fn_x4 = D.float8_e4m3fn_x4
float4_e2m1fn_x4 = D.float4_e2m1fn_x4

# ----------------------------------------------------------------------------- memories
sbuf = SBUF
psum = PSUM
hbm = HBM
private_hbm = PRIVATE_HBM
shared_hbm = SHARED_HBM

#: NKI's tensor class.
tensor = NkiTensor


def is_hbm(buffer) -> bool:
    """Whether ``buffer`` is an HBM memory."""
    return isinstance(buffer, Buffer) and buffer.space == "hbm"


def is_psum(buffer) -> bool:
    """Whether ``buffer`` is PSUM."""
    return buffer is PSUM


def is_sbuf(buffer) -> bool:
    """Whether ``buffer`` is SBUF."""
    return buffer is SBUF


def is_on_chip(buffer) -> bool:
    """Whether ``buffer`` is SBUF or PSUM."""
    return buffer is SBUF or buffer is PSUM


class _TileSize:
    """Hardware tile sizes (``nl.tile_size.pmax``, ...), from ``trn2core.spec``."""

    pmax = _spec.sbuf_partitions
    psum_fmax = _spec.psum_bank_fp32_elements
    psum_bank_fmax = _spec.psum_bank_fp32_elements
    psum_bank_fmax_bytes = _spec.psum_bank_bytes
    psum_num_banks = _spec.psum_banks
    gemm_stationary_fmax = _spec.matmul_stationary_free_max
    gemm_moving_fmax = _spec.matmul_moving_free_max
    bn_stats_fmax = _spec.bn_stats_fmax
    total_available_sbuf_size = _spec.sbuf_usable_partition_bytes
    sbuf_fmax_bytes = _spec.sbuf_usable_partition_bytes
    sbuf_fmax = _spec.sbuf_usable_partition_bytes // 4
    sbuf_size_bytes = _spec.sbuf_bytes

    def __repr__(self) -> str:
        return "nki.language.tile_size"


tile_size = _TileSize()


class _ParDim(int):
    """``nl.par_dim(n)``: marks the partition axis in a shape (legacy dialect)."""

    __slots__ = ()


def par_dim(n: int) -> int:
    """Marks a dimension of a shape as the partition dimension."""
    return _ParDim(int(n))


class _NC(int):
    """``nl.nc(n)``: a launch-grid dimension spread over ``n`` physical cores (legacy)."""

    __slots__ = ()
    nc = True


def nc(n: int) -> int:
    """A logical NeuronCore dimension of ``n`` physical cores in a legacy launch grid."""
    if n not in (1, 2):
        raise Trn2ValueError(f"nc: a Trainium2 logical core has 1 or 2 physical cores, got {n}")
    return _NC(n)


def spmd_dim(*parts: int) -> int:
    """A launch-grid dimension made of sub-dimensions; one of them may be ``nl.nc(2)``
    (program ``i`` of it runs on physical core ``i % 2``)."""
    n = math.prod(int(p) for p in parts)
    return _NC(n) if any(isinstance(p, _NC) and int(p) > 1 for p in parts) else n


@api
def ds(start: int, size: int) -> DS:
    """``nl.ds(start, size)``: the slice ``start : start + size`` of an axis."""
    for arg, v in (("start", start), ("size", size)):
        if not is_int(v):
            raise Trn2ValueError(f"ds: {arg} must be an integer, got {v!r}", arg=arg)
    if int(size) <= 0:
        raise Trn2ValueError(f"ds: size must be positive, got {size}", arg="size")
    return DS(int(start), int(size))


arange = _arange
mgrid = _mgrid

# ----------------------------------------------------------------------------- SPMD


def _grid_axis(axis, ndim: int, what: str, arg: str) -> int:
    if not is_int(axis):
        raise Trn2ValueError(f"{what}: {arg} must be an integer, got {axis!r}", arg=arg)
    if not 0 <= int(axis) < builtins.max(ndim, 1):
        raise Trn2ValueError(
            f"{what}: {arg} {axis} is not an axis of the {ndim}-D launch grid", arg=arg
        )
    return int(axis)


@api
def program_id(axis: int = 0) -> int:
    """This program's index along ``axis`` of the launch grid."""
    c = current()
    pid = c.program
    axis = _grid_axis(axis, len(pid), "program_id", "axis")
    return pid[axis] if pid else 0


@api
def num_programs(axes=None) -> int:
    """Programs along ``axes`` of the launch grid (all of them when ``None``)."""
    grid = current().launch.grid
    if axes is None:
        return math.prod(grid) if grid else 1
    items = axes if isinstance(axes, (tuple, list)) else (axes,)
    idx = [_grid_axis(a, len(grid), "num_programs", "axes") for a in items]
    return math.prod(grid[a] for a in idx) if grid else 1


def program_ndim() -> int:
    """Dimensions of the launch grid (0 without one)."""
    return len(current().launch.grid)


# ----------------------------------------------------------------------------- loops


def affine_range(*args, **kwargs) -> range:
    """Loop iterator; in the current dialect an alias of ``range`` (NKI 0.2 and later)."""
    return builtins.range(*args)


def sequential_range(*args, **kwargs) -> range:
    """Loop iterator for loops with carried dependencies (an alias of ``range``)."""
    return builtins.range(*args)


def static_range(*args, **kwargs) -> range:
    """Fully unrolled loop iterator (an alias of ``range``)."""
    return builtins.range(*args)


def _bound(v, arg: str) -> int:
    """A ``dynamic_range`` bound's value."""
    if isinstance(v, VirtualRegister):
        return v.get(arg)
    if not is_int(v):
        raise Trn2ValueError(
            f"{arg}: a dynamic_range bound is an int or a VirtualRegister, got {type(v).__name__}",
            arg=arg,
        )
    return int(v)


@api
def _dynamic_range(start, stop=None, step=1) -> range:
    """The values of a ``dynamic_range`` / ``fori_loop``, its bounds read now."""
    if stop is None:
        start, stop = 0, start
    if isinstance(step, VirtualRegister) or not is_int(step) or int(step) <= 0:
        raise Trn2ValueError(
            f"step: the step of dynamic_range is a compile-time positive int (the hardware "
            f"loop encodes it as an immediate), got {step!r}",
            arg="step",
        )
    # A register bound below the start runs the loop zero times, as an int bound does
    # (docs/nki.md, "Registers": trn2core's choice, the docs do not say).
    lo, hi = _bound(start, "start"), _bound(stop, "stop")
    return builtins.range(lo, hi, int(step))


def dynamic_range(start, stop=None, step=1):
    """An on-device loop: bounds are ints or registers (read when the loop starts), the step a
    positive int; each iteration's index is a frozen ``VirtualRegister`` (NKI's), usable as an
    index, a ``scalar_offset`` or a bound."""
    for i in _dynamic_range(start, stop, step):
        yield VirtualRegister(i, frozen=True)


def fori_loop(lower, upper, body_fun, step: int = 1) -> None:
    """``body_fun(i)`` for ``i`` in ``range(lower, upper, step)``; bounds are ints or registers,
    ``i`` a ``VirtualRegister`` passed by value (writing it does not change the loop)."""
    for i in _dynamic_range(lower, upper, step):
        body_fun(VirtualRegister(i))


def while_loop(init, body_fun) -> None:
    """``r = init; while r: r = body_fun(r)``: ``init`` and what the body returns are
    registers, the body's argument a copy of the condition's value."""
    r = _loop_register(init, "init")
    while r:
        r = _loop_register(body_fun(VirtualRegister(r.get("init"))), "body_fun")


@api
def _loop_register(r, arg: str) -> VirtualRegister:
    if not isinstance(r, VirtualRegister):
        what = "returns" if arg == "body_fun" else "is"
        raise Trn2ValueError(
            f"{arg}: while_loop's condition {what} a VirtualRegister, got {type(r).__name__}",
            arg=arg,
        )
    r.get(arg)
    return r


@contextlib.contextmanager
def no_reorder():
    """Accepted: the emulator issues in program order; the timeline still overlaps
    independent instructions on different engines."""
    yield


# ----------------------------------------------------------------------------- creation


def _shape_pdim(shape) -> tuple[tuple[int, ...], int]:
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    pd = [i for i, s in enumerate(shape) if isinstance(s, _ParDim)]
    if len(pd) > 1:
        raise ShapeError(f"shape: more than one par_dim in {shape}")
    for s in shape:
        if not is_int(s):
            raise ShapeError(f"shape: dimensions are integers, got {shape}")
    return tuple(int(s) for s in shape), (pd[0] if pd else 0)


def _buffer(buffer) -> Buffer:
    if buffer is None:
        return SBUF
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, str):
        for b in (SBUF, PSUM, HBM, PRIVATE_HBM, SHARED_HBM):
            if b.name == buffer:
                return b
    raise Trn2ValueError(
        f"buffer: expected nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm, got "
        f"{buffer!r}"
    )


def _new(shape, dtype, buffer, name, init=None) -> NkiTensor:
    shape, pdim = _shape_pdim(shape)
    place = None
    if isinstance(buffer, Placement):
        place, buffer = buffer, buffer.buffer
    return current().alloc(shape, D.as_dtype(dtype), _buffer(buffer), pdim, name or "", init, place)


def _address(address, buffer) -> Placement:
    """``address=(partition, byte)``: the tensor's first partition and its byte within each
    partition (PSUM: from the start of bank 0)."""
    ok = isinstance(address, (tuple, list)) and len(address) == 2
    ok = ok and builtins.all(is_int(a) and int(a) >= 0 for a in address)
    if not ok:
        raise Trn2ValueError(
            f"address: expected (start partition, byte address), two non-negative integers; "
            f"got {address!r}",
            arg="address",
        )
    if isinstance(buffer, Placement):
        raise Trn2ValueError(
            "address: the buffer is already a placement (mod_alloc)", arg="address"
        )
    b = _buffer(buffer)
    if b.space == "hbm":
        raise Trn2ValueError(
            f"address: an {b.name} tensor has no on-chip address; address= "
            "places SBUF and PSUM tensors",
            arg="address",
        )
    return Placement(b, int(address[0]), int(address[1]), what="address")


@api
def ndarray(shape, dtype, buffer=None, name="", address=None, **kwargs) -> NkiTensor:
    """A new tensor of ``shape`` and ``dtype`` in ``buffer`` (SBUF by default), uninitialised;
    ``address=(partition, byte)`` places it there (its bytes are whatever is there: tensors
    placed on the same bytes share them)."""
    if address is not None:
        buffer = _address(address, buffer)
    return _new(shape, dtype, buffer, name)


def _filled(shape, value, dtype, buffer, name) -> NkiTensor:
    if not isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
        raise Trn2ValueError(f"fill_value: expected a number, got {value!r}", arg="fill_value")
    t = _new(shape, dtype, buffer, name, init=float(value))
    core = t._core
    core.flush()
    if t._pdim is None:
        # HBM: one element set on chip, then one DMA reading it with step 0.
        tmp = core.alloc((1, 1), t.dtype, SBUF, 0)
        core.issue("memset", "vector", tmp.tile, float(value))
        core.issue("dma_copy", t.tile, tmp.tile.ap([(0, t.size)], 0), None)
        return t
    core.issue("memset", "vector", t.tile, float(value))
    return t


@api
def zeros(shape, dtype, buffer=None, name="", **kwargs) -> NkiTensor:
    """A new tensor filled with zeros (one ``memset``)."""
    return _filled(shape, 0.0, dtype, buffer, name)


@api
def ones(shape, dtype, buffer=None, name="", **kwargs) -> NkiTensor:
    """A new tensor filled with ones."""
    return _filled(shape, 1.0, dtype, buffer, name)


@api
def full(shape, fill_value, dtype, buffer=None, name="", **kwargs) -> NkiTensor:
    """A new tensor filled with ``fill_value``."""
    return _filled(shape, fill_value, dtype, buffer, name)


def _like(x: NkiTensor, dtype, buffer):
    shape = list(x.shape)
    if x._pdim is not None and x._pdim != 0:
        shape[x._pdim] = _ParDim(shape[x._pdim])
    return (
        tuple(shape),
        (x.dtype if dtype is None else dtype),
        (x.buffer if buffer is None else buffer),
    )


@api
def zeros_like(x, dtype=None, buffer=None, name="", **kwargs) -> NkiTensor:
    """A zero-filled tensor of ``x``'s shape (and dtype, buffer unless given)."""
    shape, dt, buf = _like(x, dtype, buffer)
    return _filled(shape, 0.0, dt, buf, name)


@api
def ones_like(x, dtype=None, buffer=None, name="", **kwargs) -> NkiTensor:
    """A one-filled tensor of ``x``'s shape."""
    shape, dt, buf = _like(x, dtype, buffer)
    return _filled(shape, 1.0, dt, buf, name)


@api
def empty_like(x, dtype=None, buffer=None, name="", **kwargs) -> NkiTensor:
    """An uninitialised tensor of ``x``'s shape."""
    shape, dt, buf = _like(x, dtype, buffer)
    return _new(shape, dt, buf, name)


@api
def shared_constant(constant, dtype=None, **kwargs) -> NkiTensor:
    """An HBM tensor holding ``constant`` (a numpy array, or the path of a ``.npy`` file)."""
    if isinstance(constant, (str, os.PathLike)):
        try:
            constant = np.load(constant)
        except (OSError, ValueError) as e:
            raise Trn2ValueError(
                f"constant: cannot read {os.fspath(constant)!r} as a .npy array ({e})",
                arg="constant",
            ) from None
    a = np.asarray(constant)
    if dtype is not None:
        a = a.astype(D.HOST_DTYPE[D.machine_name(D.as_dtype(dtype))])
    return current().constant(a, "constant")


@api
def shared_identity_matrix(n: int, dtype=uint8, dst=None, **kwargs) -> NkiTensor:
    """An ``n x n`` identity matrix in SBUF (loaded by one DMA from a constant)."""
    dt = D.as_dtype(dtype)
    const = current().constant(np.eye(n).astype(D.HOST_DTYPE[D.machine_name(dt)]), "identity")
    core = const._core
    core.flush()
    t = dst if dst is not None else core.alloc((n, n), dt, SBUF, 0, "identity")
    core.issue("dma_copy", t.tile, const.tile, None)
    return t


# ----------------------------------------------------------------------------- movement


def _core_of(*xs) -> Core:
    for x in xs:
        if isinstance(x, NkiTensor):
            return x._core
    return current()


@api
def load(src, *, mask=None, dtype=None, **kwargs) -> NkiTensor:
    """A new SBUF tile with ``src``'s values (one DMA; ``dtype`` converts on the way)."""
    if not isinstance(src, NkiTensor):
        raise Trn2ValueError(f"src: expected an HBM tensor, got {type(src).__name__}")
    core = src._core
    ranges = core.mask_ranges(mask, src.ndim)
    dt = src.dtype if dtype is None else D.as_dtype(dtype)
    if type(src._access) is Indirect:
        return core.gather(src, ranges, dt)
    shape = src.shape if len(src.shape) >= 2 else (1, *src.shape)
    if shape[0] > tile_size.pmax:
        raise PartitionDimError(
            f"load: the tile's partition dimension would be {shape[0]}, over "
            f"{tile_size.pmax} (load at most 128 rows at a time) [rule partition_dim]",
            arg="src",
            rule="partition_dim",
        )

    def issue(dst: NkiTensor) -> None:
        if ranges is None:
            return
        core.m.issue_at(
            core.loc, "dma_copy", core.masked(dst, ranges).tile, core.masked(src, ranges).tile, None
        )

    return core.pend_valid(core.pend(shape, dt, SBUF, issue), ranges)


@api
def store(dst, value, *, mask=None, **kwargs) -> None:
    """Writes ``value`` (an SBUF tile; PSUM is copied to SBUF first) into ``dst`` (DMA)."""
    if not isinstance(dst, NkiTensor):
        raise Trn2ValueError(f"dst: expected an HBM tensor, got {type(dst).__name__}")
    core = dst._core
    ranges = core.mask_ranges(mask, dst.ndim)
    if not isinstance(value, NkiTensor):
        raise Trn2ValueError(f"value: expected a tile, got {type(value).__name__}")
    core.flush()
    if ranges is None:
        return
    if value.buffer is PSUM:
        value = core.evict(value)
    core.m.issue_at(
        core.loc, "dma_copy", core.masked(dst, ranges).tile, core.masked(value, ranges).tile, None
    )


@api
def load_transpose2d(src, *, mask=None, dtype=None, **kwargs) -> NkiTensor:
    """``src`` ``[a, b]`` (HBM) loaded transposed into a new ``[b, a]`` SBUF tile (one DMA
    whose source pattern walks the columns)."""
    core = src._core
    if src._pdim is not None or src.ndim != 2:
        raise ShapeError("load_transpose2d: expected a 2-D HBM tensor")
    a, b = src.shape
    dt = src.dtype if dtype is None else D.as_dtype(dtype)
    t = src.tile
    col_step = t.pattern[0][0] if t.pattern else 1
    view = t.rows(b, col_step).ap([(t.row_step, a)], 0)

    def issue(dst: NkiTensor) -> None:
        core.issue("dma_copy", dst.tile, view, None)

    if b > tile_size.pmax:
        raise PartitionDimError(f"load_transpose2d: {b} partitions, over {tile_size.pmax}")
    return core.pend((b, a), dt, SBUF, issue)


def _copy_fn(x, *, dtype=None, mask=None, **kwargs):
    return x._core.unary_copy(x, dtype, mask) if isinstance(x, NkiTensor) else x


copy = Op("copy", api(_copy_fn), act="copy", doc="A copy of a tile (Vector tensor_copy).")


@api
def matmul(x, y, *, transpose_x=False, mask=None, **kwargs) -> NkiTensor:
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) into a new PSUM tile (float32).
    Without ``transpose_x`` the tensor engine transposes ``x`` first (``nc_transpose`` to
    PSUM and a copy back to SBUF), as ``nl.matmul`` is documented to."""
    core = _core_of(x, y)
    core.on_chip(x, "x")
    core.on_chip(y, "y")
    core.flush()
    # An operand in PSUM (e.g. an nl.transpose result) is copied to SBUF first, as the
    # compiler does: the tensor engine reads SBUF.
    x = core.evict(x) if x.buffer is PSUM else x
    y = core.evict(y) if y.buffer is PSUM else y
    if not transpose_x:
        xt_ps = core.alloc((x.shape[1], x.shape[0]), x.dtype, PSUM, 0)
        core.issue("nc_transpose", "tensor", xt_ps.tile, x.tile)
        xt = core.alloc(xt_ps.shape, x.dtype, SBUF, 0)
        core.issue("tensor_copy", "vector", xt.tile, xt_ps.tile)
        x = xt
    return core.matmul_pending(x, y, (x.shape[1], y.shape[1]), ("none", None, None, False))


@api
def transpose(x, *, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """``x`` ``[P, F]`` transposed into a new ``[F, P]`` PSUM tile (tensor engine, bit-exact)."""
    core = _core_of(x)
    core.on_chip(x, "x")
    if x.ndim != 2:
        raise ShapeError(f"transpose: a 2-D tile, got {x.shape}")
    dt = x.dtype if dtype is None else D.as_dtype(dtype)

    def issue(dst: NkiTensor) -> None:
        if dst.dtype == x.dtype:
            core.issue("nc_transpose", "tensor", dst.tile, x.tile)
        else:
            tmp = core.alloc(dst.shape, x.dtype, PSUM, 0)
            core.issue("nc_transpose", "tensor", tmp.tile, x.tile)
            core.issue("tensor_copy", "vector", dst.tile, tmp.tile)

    return core.pend((x.shape[1], x.shape[0]), dt, PSUM, issue)


@api
def broadcast_to(x, shape=None, *, dtype=None, **kwargs) -> NkiTensor:
    """``x`` with size-1 axes repeated to ``shape``."""
    if shape is None:
        shape = kwargs.get("shape")
    return x.broadcast_to(shape)


@api
def expand_dims(x, axis) -> NkiTensor:
    """``x`` with a new size-1 axis at ``axis``."""
    return x.expand_dims(axis)


@api
def where(condition, x, y, *, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """``condition ? x : y`` element-wise (Vector ``select``)."""
    core = _core_of(condition, x, y)
    core.on_chip(condition, "condition")
    if not isinstance(x, NkiTensor):
        raise NotSupportedError("where: x must be a tile (y may be a number)")
    dt = x.dtype if dtype is None else D.as_dtype(dtype)
    ranges = core.mask_ranges(mask, x.ndim, condition, x, y)

    def issue(dst: NkiTensor) -> None:
        if ranges is None:
            return
        f = core.masked(y, ranges).tile if isinstance(y, NkiTensor) else float(y)
        core.issue(
            "select",
            core.masked(dst, ranges).tile,
            core.masked(condition, ranges).tile,
            core.masked(x, ranges).tile,
            f,
        )

    return core.pend_valid(core.pend(x.shape, dt, SBUF, issue), ranges)


@api
def device_print(prefix, x, *, mask=None, **kwargs) -> None:
    """Prints ``prefix`` and the tensor's values now (reads the machine's memory; no
    instruction)."""
    core = _core_of(x)
    core.flush()
    raw = core.m.read(x.tile)
    mname = D.machine_name(x.dtype)
    print(prefix, raw.view(D.HOST_DTYPE[mname]).reshape(x.shape))


# ----------------------------------------------------------------------------- math


def _binary(name: str, doc: str) -> Op:
    def f(x, y, *, dtype=None, mask=None, **kwargs):
        return _core_of(x, y).arith(name, x, y, dtype=dtype, mask=mask)

    f.__name__ = name
    return Op(name, api(f), alu=name, doc=doc)


def _unary(name: str, doc: str, *, act: str | None = None, alu: str | None = None) -> Op:
    def f(x, *, dtype=None, mask=None, **kwargs):
        return _core_of(x).unary(name, x, dtype=dtype, mask=mask)

    f.__name__ = name
    return Op(name, api(f), act=act, alu=alu, doc=doc)


add = _binary("add", "x + y element-wise")
subtract = _binary("subtract", "x - y element-wise")
multiply = _binary("multiply", "x * y element-wise")
divide = _binary("divide", "x / y element-wise")
maximum = _binary("maximum", "the larger of x and y element-wise")
minimum = _binary("minimum", "the smaller of x and y element-wise")
abs_max = _binary("abs_max", "max(|x|, |y|) element-wise")
abs_min = _binary("abs_min", "min(|x|, |y|) element-wise")
power = _binary("power", "x ** y element-wise (GpSimd)")
equal = _binary("equal", "x == y element-wise (1 or 0)")
not_equal = _binary("not_equal", "x != y element-wise")
greater = _binary("greater", "x > y element-wise")
greater_equal = _binary("greater_equal", "x >= y element-wise")
less = _binary("less", "x < y element-wise")
less_equal = _binary("less_equal", "x <= y element-wise")
logical_and = _binary("logical_and", "x and y element-wise")
logical_or = _binary("logical_or", "x or y element-wise")
logical_xor = _binary("logical_xor", "x xor y element-wise")
bitwise_and = _binary("bitwise_and", "x & y on integer bits")
bitwise_or = _binary("bitwise_or", "x | y on integer bits")
bitwise_xor = _binary("bitwise_xor", "x ^ y on integer bits")
left_shift = _binary("left_shift", "x << y on integer bits")
right_shift = _binary("right_shift", "x >> y (logical) on integer bits")

exp = _unary("exp", "e**x (Scalar engine)", act="exp")
log = _unary("log", "natural logarithm (Scalar engine)", act="log")
sqrt = _unary("sqrt", "square root (Scalar engine)", act="sqrt")
rsqrt = _unary("rsqrt", "1/sqrt(x) (Scalar engine)", act="rsqrt", alu="rsqrt")
tanh = _unary("tanh", "tanh (Scalar engine)", act="tanh")
sigmoid = _unary("sigmoid", "logistic sigmoid (Scalar engine)", act="sigmoid")
relu = _unary("relu", "max(x, 0) (Scalar engine)", act="relu", alu="relu")
gelu = _unary("gelu", "GELU (Scalar engine)", act="gelu")
gelu_dx = _unary("gelu_dx", "GELU derivative", act="gelu_dx")
gelu_apprx_tanh = _unary("gelu_apprx_tanh", "GELU, tanh approximation", act="gelu_apprx_tanh")
gelu_apprx_sigmoid = _unary(
    "gelu_apprx_sigmoid", "GELU, sigmoid approximation", act="gelu_apprx_sigmoid"
)
gelu_apprx_sigmoid_dx = _unary(
    "gelu_apprx_sigmoid_dx", "its derivative", act="gelu_apprx_sigmoid_dx"
)
silu = _unary("silu", "x * sigmoid(x)", act="silu")
silu_dx = _unary("silu_dx", "SiLU derivative", act="silu_dx")
softplus = _unary("softplus", "log(1 + e**x)", act="softplus")
mish = _unary("mish", "x * tanh(softplus(x))", act="mish")
erf = _unary("erf", "error function", act="erf")
erf_dx = _unary("erf_dx", "erf derivative", act="erf_dx")
sin = _unary("sin", "sine (valid on [-pi, pi])", act="sin")
arctan = _unary("arctan", "arctangent", act="arctan")
sign = _unary("sign", "-1, 0 or 1", act="sign")
abs = _unary("abs", "|x| (Scalar engine)", act="abs", alu="abs")  # noqa: A001
square = _unary("square", "x * x (Scalar engine)", act="square", alu="square")
reciprocal = _unary("reciprocal", "1 / x (Vector engine, IEEE)", act="reciprocal", alu="reciprocal")
negative = _unary("negative", "-x (Vector engine)")
invert = _unary("invert", "~x on integer bits", alu="invert")
logical_not = _unary("logical_not", "not x (1 or 0)")
cos = _unary("cos", "cosine: sin(pi/2 - |x|) on the Scalar engine (valid on [-pi, pi])")
tan = _unary("tan", "tangent: sin(x) / cos(x)")
ceil = _unary("ceil", "ceiling (exact; a Vector-engine sequence)")
floor = _unary("floor", "floor (exact; a Vector-engine sequence)")
trunc = _unary("trunc", "truncation toward zero (exact; a Vector-engine sequence)")

#: Activation-function markers (``op=`` of ``nisa.activation``).
prelu = Op("prelu", None, doc="parametric ReLU (not emulated)")
bypass = Op("bypass", None, doc="no operation")


def _average(*args, **kwargs):
    raise NotSupportedError("nki.language.average is an op= of nisa.tensor_partition_reduce")


#: ``op=`` of ``nisa.tensor_partition_reduce`` only: the mean across partitions.
average = Op("average", _average, alu="average", doc="the mean (tensor_partition_reduce's op)")


def _reduction(name: str, alu: str, mean: bool = False) -> Op:
    def f(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
        return _core_of(x).reduce(alu, x, axis, dtype, keepdims, mask, mean)

    f.__name__ = name
    doc = f"{name} over the given free axes (Vector tensor_reduce)"
    # Passed as ``op=`` (``nisa.tensor_reduce(nl.max, ...)``) a reduction names its ALU operator.
    return Op(name, api(f), alu=None if mean else alu, doc=doc)


sum = _reduction("sum", "add")  # noqa: A001
max = _reduction("max", "maximum")  # noqa: A001
min = _reduction("min", "minimum")  # noqa: A001
prod = _reduction("prod", "multiply")
mean = _reduction("mean", "add", mean=True)
all = _reduction("all", "logical_and")  # noqa: A001


@api
def softmax(x, axis=-1, *, dtype=None, compute_dtype=None, mask=None, **kwargs) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` over the last free axis: a max reduce, an
    activation ``exp`` with the negated max as bias, a sum reduce, a reciprocal and a
    multiply."""
    core = _core_of(x)
    x = core.on_chip(x, "x")
    if x.ndim != 2 or axis not in (1, -1):
        raise NotSupportedError("softmax: a 2-D tile over its free axis")
    core.flush()
    p = x.shape[0]
    mx = core.alloc((p, 1), float32, SBUF, 0)
    core.issue("tensor_reduce", mx.tile, "maximum", x.tile, 1, True)
    e = core.alloc(x.shape, float32, SBUF, 0)
    s = core.alloc((p, 1), float32, SBUF, 0)
    core.m.issue_at(
        core.loc, "activation", e.tile, "exp", x.tile, mx.tile, None, "add", s.tile, "reset_reduce"
    )
    r = core.alloc((p, 1), float32, SBUF, 0)
    core.issue("reciprocal", r.tile, s.tile)
    dt = x.dtype if dtype is None else D.as_dtype(dtype)

    def issue(dst: NkiTensor) -> None:
        core.issue("tensor_scalar", "vector", dst.tile, e.tile, "multiply", r.tile)

    return core.pend(x.shape, dt, SBUF, issue)


def _unsupported(name: str):
    def f(*args, **kwargs):
        raise NotSupportedError(
            f"nki.language.{name} is not supported by trn2core (docs/nki.md lists the supported "
            "API)"
        )

    f.__name__ = name
    g = api(f)
    g.nki_unsupported = True  # type: ignore[attr-defined]  (docs/nki.md lists these)
    return g


@api
def gather_flattened(data, indices, axis=0, dtype=None, **kwargs) -> NkiTensor:
    """``out[p, j] = data[p, indices[p, j]]``, ``data``'s free axes flattened: each partition
    gathers from its own row, as the NKI docs describe it (experimental there), on GpSimd's
    ``nc_n_gather`` (uint32 indices; int32 ones read as their bits). A new SBUF tile of
    ``indices``' shape, in ``data``'s dtype or ``dtype`` (then converted by a copy). trn2core
    takes the default ``axis=0`` only (the gather is along the free axes)."""
    core = _core_of(data, indices)
    core.on_chip(data, "data")
    core.on_chip(indices, "indices")
    if not is_int(axis) or int(axis) != 0:
        raise NotSupportedError(
            f"axis: gather_flattened gathers along data's flattened free axes; trn2core takes "
            f"the default axis=0, got {axis!r}"
        )
    if np.dtype(indices.dtype) == np.dtype(np.int32):
        indices = indices.view(uint32)
    dt = data.dtype if dtype is None else D.as_dtype(dtype, "dtype")

    def issue(dst: NkiTensor) -> None:
        if dt == data.dtype:
            core.issue("nc_n_gather", dst.tile, data.tile, indices.tile)
            return
        tmp = core.alloc(indices.shape, data.dtype, SBUF, 0)
        core.issue("nc_n_gather", tmp.tile, data.tile, indices.tile)
        core.issue("tensor_copy", "vector", dst.tile, tmp.tile)

    return core.pend(indices.shape, dt, SBUF, issue)


@api
def rand(shape, dtype=float32, **kwargs) -> NkiTensor:
    """A new SBUF tile of ``shape`` with values in [0, 1] (NKI: uniform between 0 and 1): 16
    random bits per element from the Vector engine's stream (``nisa.rng`` into uint16, seeded
    by ``nl.random_seed``), times 1/65535 in float32, as the ``rng`` docs suggest; ours, not
    the chip's bits."""
    core = current()
    core.flush()  # a pending dropout draws first, in program order
    bits = core.alloc(shape, D.uint16, SBUF, 0)
    core.m.issue_at(core.loc, "rng", engine="vector", dst=bits.tile)
    return core.arith("multiply", bits, 1.0 / 65535.0, dtype=D.as_dtype(dtype))


@api
def random_seed(seed, *, mask=None, **kwargs) -> None:
    """Seeds the random number generator (``nisa.set_rng_seed``, the Vector engine's): ``seed``
    a 32-bit integer, or a ``[1, 1]`` tile of one. The same seed gives the same dropouts after
    it, in order (our stream, not the chip's: docs/machine.md, ``dropout``)."""
    core = _core_of(seed)
    if core.mask_ranges(mask, 2) is None:
        return  # a mask that never holds: not executed
    if isinstance(seed, NkiTensor):
        t = core.on_chip(seed, "seed")
    elif is_int(seed) and not isinstance(seed, (builtins.bool, np.bool_)):
        v = int(seed)
        if not -(2**31) <= v < 2**32:
            raise Trn2ValueError(f"seed: {v} is not a 32-bit value", arg="seed")
        t = core.alloc((1, 1), D.uint32, SBUF, 0)
        core.issue("memset", "vector", t.tile, float(v % 2**32))
    else:
        raise Trn2ValueError(
            f"seed: expected a 32-bit integer or a [1, 1] tile, got {type(seed).__name__}",
            arg="seed",
        )
    core.flush()
    core.m.issue_at(core.loc, "set_rng_seed", src_seeds=t.tile)


@api
def dropout(x, rate, *, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """``x`` with each element zeroed with probability ``rate`` (a number, or a ``[P, 1]``
    tile: one per partition), the kept ones unscaled: ``nisa.dropout`` into a new tile (the
    Vector engine's random stream; seeded by ``nl.random_seed``)."""
    core = _core_of(x)
    if not isinstance(x, NkiTensor):
        raise Trn2ValueError(f"x: expected a tile, got {type(x).__name__}", arg="x")
    core.on_chip(x, "x")
    if not isinstance(rate, NkiTensor):
        rate = scalar_arg(rate, "rate")
    ranges = core.mask_ranges(mask, len(x.shape), x)
    dt = x.dtype if dtype is None else D.as_dtype(dtype)

    def issue(dst: NkiTensor) -> None:
        if ranges is None:
            return
        d, a = core.masked(dst, ranges), core.masked(x, ranges)
        prob = rate.tile if isinstance(rate, NkiTensor) else rate
        core.m.issue_at(core.loc, "dropout", dst=d.tile, data=a.tile, prob=prob)

    return core.pend_valid(core.pend(x.shape, dt, SBUF, issue), ranges)


@api
def var(x, axis, *, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """Variance over free axes (the population variance, as ``numpy.var``): the mean of
    ``(x - mean(x))**2``, in float32 (a mean, a subtraction, a square, a mean)."""
    core = _core_of(x)
    f32 = D.float32
    m = core.reduce("add", x, axis, f32, True, mask, True)
    d = core.arith("subtract", x, m, dtype=f32, mask=mask)
    sq = core.arith("multiply", d, d, dtype=f32, mask=mask)
    out_dt = dtype if dtype is not None else x.dtype
    return core.reduce("add", sq, axis, out_dt, False, mask, True)


@api
def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None, **kwargs) -> NkiTensor:
    """``x / RMS(x) * w`` over the free axis of a 2-D tile (experimental in the NKI docs),
    ``RMS(x) = sqrt(sum(x^2) / n + epsilon)`` with ``n`` the count the caller gives. Lowered
    by trn2core (the compiler's sequence is not published): the squares' float32 sum in order
    (Scalar ``activation``), ``rsqrt(sum * (1/n) + epsilon)`` (``activation``, epsilon a
    float32 bias tile), then ``(x * that) * w`` in float32, rounded once to ``dtype`` (``x``'s
    by default; Vector ``scalar_tensor_tensor``). ``compute_dtype`` other than float32 is
    refused."""
    core = _core_of(x, w)
    x, w = core.on_chip(x, "x"), core.on_chip(w, "w")
    if x.ndim != 2 or not is_int(axis) or int(axis) not in (1, -1):
        raise NotSupportedError(
            f"rms_norm: a 2-D tile normalised over its free axis (axis=1); got {x.shape}, "
            f"axis={axis!r}"
        )
    if w.shape != x.shape:
        raise ShapeError(f"w: expected {x.shape} (x's shape), got {w.shape} [rule shape]")
    if not is_int(n) or int(n) < 1:
        raise Trn2ValueError(f"n: a positive count of values, got {n!r}", arg="n")
    if compute_dtype is not None and D.as_dtype(compute_dtype, "compute_dtype") != float32:
        raise NotSupportedError("compute_dtype: trn2core computes rms_norm in float32")
    eps = float(epsilon)
    core.flush()
    p = x.shape[0]
    sq = core.alloc(x.shape, float32, SBUF, 0)
    ss = core.alloc((p, 1), float32, SBUF, 0)
    core.m.issue_at(
        core.loc, "activation", sq.tile, "square", x.tile, None, None, "add", ss.tile,
        "reset_reduce",
    )  # fmt: skip
    bias = core.alloc((p, 1), float32, SBUF, 0)
    core.issue("memset", "vector", bias.tile, eps)
    inv = core.alloc((p, 1), float32, SBUF, 0)
    core.m.issue_at(core.loc, "activation", inv.tile, "rsqrt", ss.tile, bias.tile, 1.0 / int(n))
    dt = x.dtype if dtype is None else D.as_dtype(dtype, "dtype")

    def issue(dst: NkiTensor) -> None:
        core.issue(
            "scalar_tensor_tensor", dst.tile, x.tile, "multiply", inv.tile, "multiply", w.tile
        )

    return core.pend(x.shape, dt, SBUF, issue)


def _loop_index(i) -> bool:
    return is_int(i) and not isinstance(i, (builtins.bool, np.bool_))


@api
def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, **kwargs):
    """Reduces ``x`` into the tile the result is assigned to, across loop iterations (NKI's
    ``nki.language.loop_reduce``): ``dst[...] = nl.loop_reduce(x, op, loop_indices)`` is
    ``dst[...] = nisa.tensor_tensor(data1=dst[...], data2=x, op=op)``, the destination being
    also an input, as the NKI docs give it. ``b = nl.loop_reduce(x, ...)``, with ``b`` a tile
    already, is ``b = nisa.tensor_tensor(data1=b, data2=x, op=op)`` (a new tile, the old one
    unchanged). ``dtype`` is the operation's output type (a different
    one from the destination's is converted once more on the store); ``loop_indices`` (a
    loop index or a list of them) only tells the compiler which loops the reduction crosses:
    an associative ``op`` may cross ``affine_range`` iterations, as ``+=`` does."""
    core = _core_of(x)
    if not isinstance(x, NkiTensor):
        raise Trn2ValueError(f"x: expected a tile, got {type(x).__name__}", arg="x")
    core.on_chip(x, "x")
    name = alu_name(op)
    idx = loop_indices if isinstance(loop_indices, (list, tuple)) else [loop_indices]
    if not idx or not builtins.all(_loop_index(i) for i in idx):
        raise Trn2ValueError(
            f"loop_indices: expected a loop index or a list of loop indices (ints of "
            f"nl.affine_range and the like), got {loop_indices!r}",
            arg="loop_indices",
        )
    out_dt = None if dtype is None else D.as_dtype(dtype)

    def issue(dst: NkiTensor) -> None:
        core.reduce_into(name, dst, x, out_dt, mask)

    b = _bound_target(core)
    if b is not None:
        # ``b = nl.loop_reduce(x, ...)`` is ``b = nisa.tensor_tensor(data1=b, data2=x)``: a new
        # tile (``b``'s old one, perhaps a view of another tensor, unchanged).
        return core.reduce_new(name, b, x, out_dt, mask)
    return core.pend(x.shape, x.dtype if out_dt is None else out_dt, SBUF, issue, ("loop_reduce",))


def _bound_target(core: Core) -> NkiTensor | None:
    """The tile the kernel statement calling us rebinds (``b = nl.loop_reduce(...)``):
    the current value of the name the call's result is stored to, when that is one of this
    core's tiles; ``None`` for any other use of the result (``dst[...] = ...``)."""
    f = user_frame()
    if f is None:
        return None
    store = _stores_after_calls(f.f_code).get(f.f_lasti)
    if store is None:
        return None
    op, name = store
    if op == "STORE_GLOBAL":
        cur = f.f_globals.get(name)
    else:
        cur = f.f_locals.get(name, f.f_globals.get(name) if op == "STORE_NAME" else None)
    return cur if isinstance(cur, NkiTensor) and cur._core is core else None


_STORES = ("STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF")


@functools.lru_cache(maxsize=256)
def _stores_after_calls(code) -> dict[int, tuple[str, str]]:
    """``{bytecode offset: (store instruction, name)}`` over each call of ``code`` whose result
    is stored straight to a name (``b = f(...)``): every offset from the call instruction to
    the store, as a calling frame's ``f_lasti`` may be the call's or one of its inline
    caches' (CPython 3.11)."""
    ins = list(dis.get_instructions(code))
    out = {}
    for a, b in zip(ins, ins[1:], strict=False):
        # CPython 3.13 may fuse the store with the next one (STORE_FAST_LOAD_FAST, ...).
        if a.opname.startswith("CALL") and b.opname.startswith(_STORES):
            name = b.argval[0] if isinstance(b.argval, tuple) else b.argval
            op = "STORE_FAST" if b.opname.startswith("STORE_FAST") else b.opname
            out.update(dict.fromkeys(range(a.offset, b.offset, 2), (op, name)))
    return out


all_reduce = _unsupported("all_reduce")


@api
def atomic_rmw(dst, value, op, *, mask=None, **kwargs) -> None:
    """``dst = op(dst, value)`` atomically on HBM (the legacy NKI docs): ``dst`` an indirect
    access ``a[idx_tile, j]`` (the only form documented), ``op`` ``np.add`` (the only one),
    ``value`` a tile of one row per index. Row ``idx[p]`` of ``a`` gets partition ``p`` of
    ``value`` added in float32 and rounded once to ``a``'s dtype (``dma_compute``), partition
    after partition, so repeated indices accumulate (the order among them is ours)."""
    if not isinstance(dst, NkiTensor) or type(dst._access) is not Indirect:
        raise NotSupportedError(
            "dst: atomic_rmw updates an indirect HBM access a[idx_tile, j] (the documented form)"
        )
    if alu_name(op, "op") != "add":
        raise NotSupportedError(f"op: atomic_rmw supports np.add (the NKI docs), got {op!r}")
    core = _core_of(dst, value)
    value = core.on_chip(value, "value")
    if value.shape != dst.shape:
        raise ShapeError(
            f"value: a {value.shape} tile for a {dst.shape} indirect access [rule shape]"
        )
    core.atomic_rmw(dst, value, core.mask_ranges(mask, dst.ndim, value))


def _remainder(name: str, rounding: str, doc: str) -> Op:
    def f(x, y, *, dtype=None, mask=None, **kwargs):
        # No instruction computes it: x - y * round(x / y) in fp32 (four nl operations; exact
        # for integer values below 2**24, where x / y rounds no quotient across an integer).
        core = _core_of(x, y)
        if not isinstance(x, NkiTensor) and not isinstance(y, NkiTensor):
            raise Trn2ValueError(f"{name}: at least one operand must be a tile", arg="x")
        f32 = D.float32
        q = core.arith("divide", x, y, dtype=f32, mask=mask)
        r = core.unary(rounding, q, dtype=f32, mask=mask)
        p = core.arith("multiply", r, y, dtype=f32, mask=mask)
        if dtype is None:
            dx = x.dtype if isinstance(x, NkiTensor) else D.weak_dtype(x)
            dy = y.dtype if isinstance(y, NkiTensor) else D.weak_dtype(y)
            dtype = D.promote(dx, dy)
        return core.arith("subtract", x, p, dtype=dtype, mask=mask)

    f.__name__ = name
    return Op(name, api(f), doc=doc)


mod = _remainder("mod", "floor", "x - y * floor(x / y) element-wise (the sign of y, as np.mod)")
fmod = _remainder("fmod", "trunc", "x - y * trunc(x / y) element-wise (the sign of x, as np.fmod)")


class fp32:  # noqa: N801 - the legacy module's name
    """float32 limits (legacy ``nl.fp32.min`` / ``nl.fp32.max``)."""

    min = float(np.finfo(np.float32).min)
    max = float(np.finfo(np.float32).max)


def _sizeinbytes(dtype) -> int:
    """Bytes of one element of an NKI dtype (``neuronxcc.nki.language.constants``)."""
    return D.as_dtype(dtype).itemsize


@api
def finfo(dtype):
    """Machine limits of a floating-point NKI dtype (``.min``, ``.max``, ``.eps``, ``.tiny``,
    ``.bits``), as numpy's ``finfo`` (ml_dtypes' for bfloat16 and the fp8 types)."""
    dt = D.as_dtype(dtype)
    if not D.is_float(dt) or dt == D.tfloat32:
        raise Trn2ValueError(f"finfo: {dt} is not a floating-point NKI dtype", arg="dtype")
    return ml_dtypes.finfo(dt)


@api
def iinfo(dtype):
    """Machine limits of an integer NKI dtype (``.min``, ``.max``, ``.bits``)."""
    dt = D.as_dtype(dtype)
    if D.is_float(dt) or dt == D.bool_:
        raise Trn2ValueError(f"iinfo: {dt} is not an integer NKI dtype", arg="dtype")
    return np.iinfo(dt)


def static_cast(x, dtype) -> NkiTensor:
    """``x`` converted to ``dtype`` (a copy)."""
    return copy(x, dtype=dtype)


#: ``nl.range``: loops are Python ranges (NKI 0.2 and later; nki-library uses the name).
range = builtins.range  # noqa: A001
#: ``nl.bool``: the same dtype as ``nl.bool_`` (nki-library uses the name).
bool = bool_  # noqa: A001

_ = (IndexExpr, Mask, NKIObject)
