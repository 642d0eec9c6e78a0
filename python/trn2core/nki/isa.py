"""``nki.isa`` (``nisa``), the current dialect: every instruction takes its destination first
(``dst=``) and is one instruction of the emulated NeuronCore (``trn2core._core.Machine``), which
checks the engine rules, computes the bits and records it for the timeline.

Semantics, engine rules and costs are the machine's (docs/machine.md); this module maps NKI's
arguments onto it: operators (``nl.add``, ``np.add``, ...), ``engine=`` (``engine.unknown``
picks the engine the NKI docs name as the default), ``reduce_cmd``, access patterns.
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ..errors import Trn2ValueError
from . import _dtypes as D
from . import _lnc2
from ._index import NotSupportedError
from ._ops import (
    Op,
    act_name,
    alu_name,
    dge_mode,
    dge_mode_name,
    dma_engine,
    engine,
    engine_name,
    gpsimd_engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
    reduce_cmd_name,
    scalar_engine,
    tensor_engine,
    unknown_engine,
    vector_engine,
)
from ._register import VirtualRegister, check_value
from ._runtime import PSUM, api, current, reduce_axes, scalar_arg
from ._surface import Unsupported as _Unsupported
from ._tensor import Dynamic, NkiTensor, VectorOffset


class NkiValidationError(Trn2ValueError):
    """A hardware constraint is violated (NKI's name; trn2core raises its own subclasses)."""


_TILE = _core.Tile


def _t(x, arg: str):
    if isinstance(x, NkiTensor):
        t = x._t
        # The common case (a resolved machine tile) without the property's checks.
        if type(t) is not _TILE:
            return x.tile
        return t
    raise Trn2ValueError(f"{arg}: expected a tensor, got {type(x).__name__}")


def _core_of(*xs):
    """The core of the first tensor of ``xs`` (or the running kernel's), its pending result
    issued. Each ``nisa`` instruction then goes out as ``c.m.issue_at(c.loc, ...)``: the
    kernel's line in the instruction's own crossing, without a Python frame between (this is
    every ``nisa`` instruction's path)."""
    for x in xs:
        if isinstance(x, NkiTensor):
            c = x._core
            if c.pending is not None:
                c.flush()
            return c
    c = current()
    c.flush()
    return c


def get_nc_version() -> nc_version:
    """The NeuronCore version emulated: ``nc_version.gen3`` (Trainium2)."""
    return nc_version.gen3


def get_nc_sub_version() -> int:
    """The NeuronCore sub-version (0)."""
    return 0


@api
def dma_copy(
    dst,
    src,
    priority=None,
    oob_mode=oob_mode.error,
    dge_mode=dge_mode.unknown,
    engine=engine.unknown,
    name=None,
    **kwargs,
) -> None:
    """Copies ``src`` to ``dst`` (HBM and SBUF, any direction) on a DMA queue; an HBM side
    indexed by ``.ap(vector_offset=...)`` scatters or gathers rows. With ``oob_mode.skip`` the
    rows of an HBM side that leave its tensor (a ``scalar_offset`` past its end) are skipped
    (``Core.oob_skip_copy``)."""
    c = _core_of(dst, src)
    if (isinstance(dst, NkiTensor) and type(dst._t) is VectorOffset) or (
        isinstance(src, NkiTensor) and type(src._t) is VectorOffset
    ):
        c.vector_offset_copy(dst, src, oob_mode)
        return
    if getattr(oob_mode, "name", oob_mode) == "skip" and c.oob_skip_copy(dst, src):
        return
    c.m.issue_at(c.loc, "dma_copy", _t(dst, "dst"), _t(src, "src"), None)


@api
def sendrecv(
    src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None
) -> None:
    """Sends ``src`` to the other physical core's ``dst`` and receives its ``src`` into this
    core's ``dst`` (LNC=2; docs/nki.md, "LNC=2 exchanges")."""
    c = _core_of(src, dst)
    gpsimd = getattr(dma_engine, "name", dma_engine) == "gpsimd_dma"
    _lnc2.sendrecv(c, src, dst, send_to_rank, recv_from_rank, pipe_id, gpsimd)


@api
def core_barrier(data, cores, engine=engine.gpsimd, name=None) -> None:
    """Both physical cores reach this point before either goes on; each then sees the
    other's writes to the shared HBM tensor ``data`` (LNC=2; docs/nki.md)."""
    c = _core_of(data)
    e = engine_name(engine, "gpsimd", ("gpsimd", "vector", "scalar"), "core_barrier")
    _lnc2.core_barrier(c, data, cores, e)


@api
def dma_compute(
    dst,
    srcs,
    reduce_op,
    scales=None,
    unique_indices=True,
    oob_mode=oob_mode.error,
    name=None,
    **kwargs,
) -> None:
    """``dst = srcs[0] + srcs[1] + ...`` on a DMA queue: each source widened to float32, added
    in order in float32, the sum rounded once to ``dst``'s dtype (HBM and SBUF, 1 to 16
    sources of ``dst``'s element count). NKI allows ``reduce_op=nl.add`` and unit ``scales``
    only. With a source indexed by ``vector_offset`` it is the ISA reference's
    read-modify-write: gather (``dst`` in SBUF, the other source ``dst``) or scatter (``dst``
    an indexed HBM view, one source the same view, the other in SBUF); two sources and
    ``unique_indices=True`` (``Core.vector_offset_compute``)."""
    if alu_name(reduce_op, "reduce_op") != "add":
        raise Trn2ValueError(
            f"reduce_op: dma_compute adds its sources (nl.add), got {reduce_op!r}",
            arg="reduce_op",
        )
    if not isinstance(srcs, (list, tuple)) or not srcs:
        raise Trn2ValueError(
            f"srcs: dma_compute takes a list of source tensors, got {srcs!r}", arg="srcs"
        )
    if scales is not None:
        scales = list(scales)
        if len(scales) != len(srcs) or any(float(v) != 1.0 for v in scales):
            raise Trn2ValueError(
                f"scales: dma_compute takes one scale per source, each 1.0 (NKI's rule), got "
                f"{scales} for {len(srcs)} sources",
                arg="scales",
            )
    c = _core_of(dst, *srcs)
    if any(isinstance(x, NkiTensor) and type(x._t) is VectorOffset for x in (dst, *srcs)):
        c.vector_offset_compute(dst, list(srcs), unique_indices, oob_mode)
        return
    tiles = [_t(x, f"srcs[{i}]") for i, x in enumerate(srcs)]
    c.m.issue_at(c.loc, "dma_compute", _t(dst, "dst"), tiles, None)


def _as_shaped(x, arg: str):
    """``x``'s tile with one machine axis per logical axis of ``x`` (unit axes kept): the
    machine checks a transpose's shapes on it."""
    t = _t(x, arg)
    if list(t.shape) == list(x.shape):
        return t
    return x._from_axes(x._axes()).tile


#: A direct dma_transpose's DGE modes: the ISA reference's unknown and hwdge, and none (no DGE:
#: nki-library's shipped Trn2 kernels transpose with it; docs/nki.md, "Inferred, not documented").
_DIRECT_TRANSPOSE_DGE_MODES = ("unknown", "hwdge", "none")


@api
def dma_transpose(
    dst,
    src,
    axes=None,
    priority=None,
    dge_mode=dge_mode.unknown,
    oob_mode=oob_mode.error,
    name=None,
    **kwargs,
) -> None:
    """``dst`` (SBUF) = ``src`` (HBM or SBUF, 2 to 4 axes, 2- or 4-byte elements) with its axes
    permuted by NKI's rule, ``[1, 0]``, ``[2, 1, 0]`` or ``[3, 1, 2, 0]`` (``dst[j, i] =
    src[i, j]`` in 2-D), bit for bit, on a DMA queue; ``dge_mode=hwdge`` adds the hardware
    DGE's limits, ``none`` (no DGE, as nki-library passes it) has unknown's. A source indexed
    by ``.ap(vector_offset=...)`` is the indirect (gather) transpose, ``dge_mode`` unknown or
    swdge (``Core.vector_offset_transpose``)."""
    mode = dge_mode_name(dge_mode)
    if isinstance(src, NkiTensor) and type(src._t) is VectorOffset:
        if mode not in ("unknown", "swdge"):
            raise Trn2ValueError(
                f"dge_mode: an indirect dma_transpose (a source indexed by vector_offset) "
                f"takes dge_mode unknown or swdge, got {mode}",
                arg="dge_mode",
            )
        perm = None if axes is None else [int(a) for a in axes]
        _core_of(dst, src).vector_offset_transpose(dst, src, perm, oob_mode)
        return
    if mode not in _DIRECT_TRANSPOSE_DGE_MODES:
        raise Trn2ValueError(
            f"dge_mode: a direct dma_transpose takes dge_mode unknown, hwdge or none, got {mode}",
            arg="dge_mode",
        )
    c = _core_of(dst, src)
    perm = None if axes is None else [int(a) for a in axes]
    c.m.issue_at(
        c.loc,
        "dma_transpose",
        _as_shaped(dst, "dst"),
        _as_shaped(src, "src"),
        perm,
        mode == "hwdge",
    )


@api
def tensor_copy(dst, src, engine=engine.unknown, name=None, **kwargs) -> None:
    """``dst = src`` (bits when the dtypes agree, else through float32)."""
    e = engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), "tensor_copy")
    c = _core_of(dst, src)
    c.m.issue_at(c.loc, "tensor_copy", e, _t(dst, "dst"), _t(src, "src"))


_COPY_ENGINES = ("vector", "scalar", "gpsimd")


def issue_dynamic_copy(c, op: str, e: str, dst, src) -> None:
    """``tensor_copy_dynamic_src`` (``op``; or ``_dst``) on engine ``e``: the moved side a view
    indexed by a dynamic offset (``Dynamic``), its value left in SBUF for the machine to read
    when the copy runs."""
    arg, moved = ("src", src) if op == "tensor_copy_dynamic_src" else ("dst", dst)
    d = moved._t if isinstance(moved, NkiTensor) else None
    if type(d) is not Dynamic:
        raise Trn2ValueError(
            f"{arg}: {op} takes {arg} indexed by a dynamic offset (t[:, off], the legacy "
            f"t[i, off + j], or t.ap(pattern, scalar_offset=off, indirect_dim=1); off a [1, 1] "
            f"integer tile in SBUF), got {'a static access' if d is not None else moved!r}",
            arg=arg,
        )
    tiles = {"dst": dst, "src": src}
    tiles = {k: d.static if k == arg else _t(x, k) for k, x in tiles.items()}
    c.m.issue_at(c.loc, op, e, tiles["dst"], tiles["src"], d.offset.tile, d.step, d.limit)


@api
def tensor_copy_dynamic_src(dst, src, engine=engine.unknown, name=None, **kwargs) -> None:
    """``dst = src`` with ``src`` at a dynamic offset within each partition (the offset a
    ``[1, 1]`` integer tile in SBUF, read by the machine when the copy runs)."""
    e = engine_name(engine, "vector", _COPY_ENGINES, "tensor_copy_dynamic_src")
    issue_dynamic_copy(_core_of(dst, src), "tensor_copy_dynamic_src", e, dst, src)


@api
def tensor_copy_dynamic_dst(dst, src, engine=engine.unknown, name=None, **kwargs) -> None:
    """``dst = src`` with ``dst`` at a dynamic offset within each partition."""
    e = engine_name(engine, "vector", _COPY_ENGINES, "tensor_copy_dynamic_dst")
    issue_dynamic_copy(_core_of(dst, src), "tensor_copy_dynamic_dst", e, dst, src)


@api
def memset(dst, value, engine=engine.unknown, name=None, **kwargs) -> None:
    """Fills ``dst`` with ``value``."""
    e = engine_name(engine, "vector", ("vector", "gpsimd"), "memset")
    c = _core_of(dst)
    c.m.issue_at(c.loc, "memset", e, _t(dst, "dst"), float(value))


def _pe_tile(tile_position, tile_size):
    pos = tuple(int(v) for v in tile_position) if tile_position else None
    size = tuple(int(v) for v in tile_size) if tile_size else None
    return pos, size


# nc_matmul's common case (dst, stationary and moving only, by keyword, three tensors on
# machine tiles, dst not a block of an explicitly placed tensor), run in its api wrapper (as
# tensor_tensor's): what the function does for it, without its calls.
_MM_INLINE = """
if (
    type(dst) is _NkiTensor
    and type(stationary) is _NkiTensor
    and type(moving) is _NkiTensor
    and dst._blocks is None
    and is_stationary_onezero is _MISSING
    and is_moving_onezero is _MISSING
    and is_transpose is _MISSING
    and accumulate is _MISSING
    and tile_position is _MISSING
    and tile_size is _MISSING
    and perf_mode is _MISSING
    and name is _MISSING
):
    _c = dst._core
    if _c.pending is not None:
        _c.flush()
    _t0, _t1, _t2 = dst._t, stationary._t, moving._t
    if type(_t0) is _TILE and type(_t1) is _TILE and type(_t2) is _TILE:
        _c.m.issue_at(_c.loc, "nc_matmul", _t0, _t1, _t2, None, "none", None, None, False)
        return None
"""


@api(inline=_MM_INLINE, names={"_NkiTensor": NkiTensor, "_TILE": _TILE})
def nc_matmul(
    dst,
    stationary,
    moving,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    accumulate=None,
    tile_position=(),
    tile_size=(),
    perf_mode=matmul_perf_mode.none,
    name=None,
    **kwargs,
) -> None:
    """``dst = stationary.T @ moving`` into PSUM (float32). ``accumulate=None``: the first
    matmul into memory not written by a matmul overwrites it, later ones accumulate."""
    pos, size = _pe_tile(tile_position, tile_size)
    pm = perf_mode.value if isinstance(perf_mode, matmul_perf_mode) else str(perf_mode)
    c = _core_of(dst, stationary, moving)
    acc = None if accumulate is None else bool(accumulate)
    # accumulate=None: "first write overwrites" per tensor, as the compiler infers it. A tensor
    # placed (address=) on bytes that last held another tensor's matmul result starts anew.
    if isinstance(dst, NkiTensor) and dst._core.block_fresh(dst) and acc is None:
        acc = False
    c.m.issue_at(
        c.loc,
        "nc_matmul",
        _t(dst, "dst"),
        _t(stationary, "stationary"),
        _t(moving, "moving"),
        acc,
        pm,
        pos,
        size,
        bool(is_transpose),
    )


@api
def nc_transpose(dst, data, engine=engine.unknown, name=None, **kwargs) -> None:
    """``dst = data.T`` on the tensor engine (SBUF to PSUM, up to 128 x 128) or the Vector
    engine (up to 32 x 32); by default the tensor engine when ``dst`` is in PSUM."""
    default = "tensor" if isinstance(dst, NkiTensor) and dst.buffer is PSUM else "vector"
    e = engine_name(engine, default, ("tensor", "vector"), "nc_transpose")
    c = _core_of(dst, data)
    c.m.issue_at(c.loc, "nc_transpose", e, _t(dst, "dst"), _t(data, "data"))


# A set: a dtype's hash lookup is a quarter of comparing it with each (every tensor_tensor).
_INT32 = frozenset((D.int32, D.uint32))


def _tt_engine(e, op: str, *tiles) -> str:
    ints = True
    for t in tiles:
        if not (isinstance(t, NkiTensor) and t.dtype in _INT32):
            ints = False
            break
    default = "gpsimd" if op == "power" or ints else "vector"
    return engine_name(e, default, ("vector", "gpsimd"), "tensor_tensor")


# tensor_tensor's common case (an ``nl`` operator, the default engine, three tensors on
# machine tiles), run in its api wrapper (``api``'s ``inline``: one Python frame per call, not
# two): what alu_name, _tt_engine, _core_of and _t do, in the same order, without their calls.
# Any other call goes on to the function.
_TT_INLINE = """
if (
    type(op) is _Op
    and (engine is _MISSING or engine is _unknown or engine is None)
    and type(dst) is _NkiTensor
    and type(data1) is _NkiTensor
    and type(data2) is _NkiTensor
    and (_o := op.alu) is not None
):
    _ints = dst.dtype in _INT32 and data1.dtype in _INT32 and data2.dtype in _INT32
    _eng = "gpsimd" if _ints or _o == "power" else "vector"
    _c = dst._core
    if _c.pending is not None:
        _c.flush()
    _t0, _t1, _t2 = dst._t, data1._t, data2._t
    if type(_t0) is _TILE and type(_t1) is _TILE and type(_t2) is _TILE:
        _c.m.tensor_tensor_at(_c.loc, _eng, _t0, _t1, _t2, _o)
        return None
"""


@api(
    inline=_TT_INLINE,
    names={"_Op": Op, "_unknown": unknown_engine, "_NkiTensor": NkiTensor, "_INT32": _INT32,
           "_TILE": _TILE},
)  # fmt: skip
def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None, **kwargs) -> None:
    """``dst = data1 <op> data2`` element-wise (Vector; GpSimd for int32 tiles and power)."""
    o = alu_name(op)
    e = _tt_engine(engine, o, dst, data1, data2)
    c = _core_of(dst, data1, data2)
    c.m.issue_at(
        c.loc, "tensor_tensor", e, _t(dst, "dst"), _t(data1, "data1"), _t(data2, "data2"), o
    )


@api
def tensor_scalar(
    dst,
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    engine=engine.unknown,
    name=None,
    **kwargs,
) -> None:
    """``dst = (data <op0> operand0) <op1> operand1``; operands are numbers or ``[P, 1]``
    float32 tiles."""
    e = engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), "tensor_scalar")
    c = _core_of(dst, data, operand0, operand1)
    c.m.issue_at(
        c.loc,
        "tensor_scalar",
        e,
        _t(dst, "dst"),
        _t(data, "data"),
        alu_name(op0, "op0"),
        scalar_arg(operand0, "operand0"),
        bool(reverse0),
        None if op1 is None else alu_name(op1, "op1"),
        None if operand1 is None else scalar_arg(operand1, "operand1"),
        bool(reverse1),
    )


def _axes(data: NkiTensor, axis) -> int:
    axes = reduce_axes(axis, data.shape)
    if axes != list(range(data.ndim - len(axes), data.ndim)):
        raise Trn2ValueError(
            f"axis: tensor_reduce reduces the last free axes ([1], [1, 2], ...); got {axis} "
            f"for a tile of shape {data.shape}"
        )
    return len(axes)


@api
def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None, **kwargs) -> None:
    """``dst = reduce(op, data, axis)`` over the last free axes (Vector engine)."""
    c = _core_of(dst, data)
    c.m.issue_at(
        c.loc,
        "tensor_reduce",
        _t(dst, "dst"),
        alu_name(op),
        _t(data, "data"),
        _axes(data, axis),
        bool(negate),
    )


def _scale(scale):
    if scale is None or (not isinstance(scale, NkiTensor) and float(scale) == 1.0):
        return None
    return scalar_arg(scale, "scale")


@api
def activation(
    dst,
    op,
    data,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    name=None,
    **kwargs,
) -> None:
    """``dst = op(data * scale + bias)`` on the Scalar engine; with ``reduce_op`` (add) the
    results are also added into ``reduce_res``. Transcendental functions follow trn2core's
    float64 rule, not the chip's unpublished polynomials (docs/machine.md)."""
    c = _core_of(dst, data, bias, scale)
    cmd = reduce_cmd_name(reduce_cmd)
    if reduce_res is not None and cmd == "idle":
        cmd = "reset_reduce"
    c.m.issue_at(
        c.loc,
        "activation",
        _t(dst, "dst"),
        act_name(op),
        _t(data, "data"),
        None if bias is None else scalar_arg(bias, "bias"),
        _scale(scale),
        None if reduce_op is None else alu_name(reduce_op, "reduce_op"),
        None if reduce_res is None else _t(reduce_res, "reduce_res"),
        cmd,
    )


@api
def activation_reduce(
    dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None, **kwargs
) -> None:
    """``activation`` whose results are also reduced (added) per partition into
    ``reduce_res``."""
    c = _core_of(dst, data, bias, scale)
    c.m.issue_at(
        c.loc,
        "activation_reduce",
        _t(dst, "dst"),
        act_name(op),
        _t(data, "data"),
        alu_name(reduce_op, "reduce_op"),
        _t(reduce_res, "reduce_res"),
        None if bias is None else scalar_arg(bias, "bias"),
        _scale(scale),
    )


def _pattern(pattern) -> list[tuple[int, int]]:
    return [(int(step), int(num)) for step, num in pattern]


@api
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None, **kwargs) -> None:
    """``dst[c, ...] = offset + c * channel_multiplier + sum(index * step)`` (GpSimd)."""
    c = _core_of(dst)
    c.m.issue_at(
        c.loc, "iota", _t(dst, "dst"), _pattern(pattern), int(offset), int(channel_multiplier)
    )


@api
def affine_select(
    dst,
    pattern,
    channel_multiplier,
    on_true_tile,
    on_false_value,
    cmp_op=None,
    offset=0,
    name=None,
    **kwargs,
) -> None:
    """``dst = cmp_op(affine, 0) ? on_true_tile : on_false_value`` where ``affine`` is
    ``offset + c * channel_multiplier + sum(index * step)`` (GpSimd)."""
    cmp = "equal" if cmp_op is None else alu_name(cmp_op, "cmp_op")
    c = _core_of(dst, on_true_tile)
    c.m.issue_at(
        c.loc,
        "affine_select",
        _t(dst, "dst"),
        _pattern(pattern),
        int(channel_multiplier),
        _t(on_true_tile, "on_true_tile"),
        float(on_false_value),
        cmp,
        int(offset),
    )


@api
def bn_stats(dst, data, name=None, **kwargs) -> None:
    """Per-partition mean statistics of ``data`` (Vector; up to 512 elements)."""
    c = _core_of(dst, data)
    c.m.issue_at(c.loc, "bn_stats", _t(dst, "dst"), _t(data, "data"))


@api
def bn_aggr(dst, data, name=None, **kwargs) -> None:
    """``[mean, variance]`` per partition from ``bn_stats`` results (Vector)."""
    c = _core_of(dst, data)
    c.m.issue_at(c.loc, "bn_aggr", _t(dst, "dst"), _t(data, "data"))


@api
def tensor_tensor_scan(
    dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None, **kwargs
) -> None:
    """``dst[i] = op1(op0(data0[i], dst[i - 1]), data1[i])`` from ``initial`` (Vector)."""
    c = _core_of(dst, data0, data1, initial)
    c.m.issue_at(
        c.loc,
        "tensor_tensor_scan",
        _t(dst, "dst"),
        _t(data0, "data0"),
        _t(data1, "data1"),
        scalar_arg(initial, "initial"),
        alu_name(op0, "op0"),
        alu_name(op1, "op1"),
        bool(reverse0),
        bool(reverse1),
    )


@api
def reciprocal(dst, data, name=None, **kwargs) -> None:
    """``dst = 1 / data`` (Vector engine, IEEE float32)."""
    c = _core_of(dst, data)
    c.m.issue_at(c.loc, "reciprocal", _t(dst, "dst"), _t(data, "data"))


@api
def scalar_tensor_tensor(
    dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None, **kwargs
) -> None:
    """``dst = (data <op0> operand0) <op1> operand1`` with ``operand1`` a tile (Vector)."""
    c = _core_of(dst, data, operand0, operand1)
    c.m.issue_at(
        c.loc,
        "scalar_tensor_tensor",
        _t(dst, "dst"),
        _t(data, "data"),
        alu_name(op0, "op0"),
        scalar_arg(operand0, "operand0"),
        alu_name(op1, "op1"),
        _t(operand1, "operand1"),
        bool(reverse0),
        bool(reverse1),
    )


@api
def tensor_scalar_reduce(
    dst,
    data,
    op0,
    operand0,
    reduce_op,
    reduce_res=None,
    reverse0=False,
    reduce_cmd=reduce_cmd.reset_reduce,
    reduce_init=None,
    reduce_res_negate=False,
    name=None,
    **kwargs,
) -> None:
    """``dst = data <op0> operand0``, the results reduced with ``reduce_op`` into
    ``reduce_res`` (Vector)."""
    c = _core_of(dst, data, operand0)
    c.m.issue_at(
        c.loc,
        "tensor_scalar_reduce",
        _t(dst, "dst"),
        _t(data, "data"),
        alu_name(op0, "op0"),
        scalar_arg(operand0, "operand0"),
        alu_name(reduce_op, "reduce_op"),
        None if reduce_res is None else _t(reduce_res, "reduce_res"),
        bool(reverse0),
        reduce_cmd_name(reduce_cmd),
        None if reduce_init is None else scalar_arg(reduce_init, "reduce_init"),
        bool(reduce_res_negate),
    )


@api
def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None, **kwargs) -> None:
    """``dst = predicate ? src : dst`` (Vector ``select``; ``reverse_pred`` negates)."""
    c = _core_of(dst, src, predicate)
    if reverse_pred:
        c.m.issue_at(
            c.loc,
            "select",
            _t(dst, "dst"),
            _t(predicate, "predicate"),
            _t(dst, "dst"),
            _t(src, "src"),
        )
    elif isinstance(src, NkiTensor):
        c.m.issue_at(
            c.loc,
            "select",
            _t(dst, "dst"),
            _t(predicate, "predicate"),
            _t(src, "src"),
            _t(dst, "dst"),
        )
    else:
        raise NotSupportedError("tensor_copy_predicated: a scalar src")


# ----------------------------------------------------------------------------- registers
# No engine and no cost: docs/nki.md "Registers" (trn2core's choice, the docs give neither).


def _register(x, arg: str) -> VirtualRegister:
    if not isinstance(x, VirtualRegister):
        raise Trn2ValueError(
            f"{arg}: expected a VirtualRegister (nisa.register_alloc), got {type(x).__name__}",
            arg=arg,
        )
    return x


def _scalar_slot(t, arg: str) -> NkiTensor:
    """``t`` as the one-element HBM or SBUF integer tensor a register is loaded from or
    stored to (at most 32 bits), or an error naming ``arg``."""
    if not isinstance(t, NkiTensor):
        raise Trn2ValueError(f"{arg}: expected a tensor, got {type(t).__name__}", arg=arg)
    if t.size != 1:
        raise Trn2ValueError(
            f"{arg}: a register moves one element; the tensor has shape {t.shape}", arg=arg
        )
    if t.buffer is PSUM:
        raise Trn2ValueError(f"{arg}: a register moves to or from HBM or SBUF, not PSUM", arg=arg)
    if t.dtype.kind not in "iu" or t.dtype.itemsize > 4:
        raise Trn2ValueError(
            f"{arg}: a register holds a 32-bit integer here; the tensor is {t.dtype}", arg=arg
        )
    return t


@api
def register_alloc(x=None, name=None) -> VirtualRegister:
    """A new virtual register holding ``x`` (an integer within 32 bits, or the one element of
    a tensor as ``register_load`` reads it), or no value yet."""
    current()
    if isinstance(x, NkiTensor):
        t = _scalar_slot(x, "x")
        return VirtualRegister(check_value(t._core.offset_value(t), "x"))
    return VirtualRegister(None if x is None else check_value(x, "x"))


@api
def register_move(dst, src, name=None) -> None:
    """``dst = src``: an integer or another register's value."""
    reg = _register(dst, "dst")
    reg.set(check_value(src, "src"), "dst")


@api
def register_load(dst, src, name=None) -> None:
    """``dst`` = the one element of ``src`` (HBM or SBUF), read now in program order."""
    reg = _register(dst, "dst")
    t = _scalar_slot(src, "src")
    reg.set(check_value(t._core.offset_value(t), "src"), "dst")


@api
def register_store(dst, src, name=None) -> None:
    """The one element of ``dst`` (HBM or SBUF) = register ``src``'s value."""
    t = _scalar_slot(dst, "dst")
    v = _register(src, "src").get("src")
    info = np.iinfo(t.dtype)
    if not info.min <= v <= info.max:
        raise Trn2ValueError(f"dst: the register's value {v} does not fit {t.dtype}", arg="dst")
    c = _core_of(t)
    c.m.write(t.tile, np.array([v], dtype=t.dtype).view(np.uint8))


def _unsupported(module: str, name: str):
    def f(*args, **kwargs):
        raise NotSupportedError(
            f"{module}.{name} is not supported by trn2core (docs/nki.md lists the supported API)"
        )

    f.__name__ = name
    g = api(f)
    g.nki_unsupported = True  # type: ignore[attr-defined]  (docs/nki.md lists these)
    return g


def define_unsupported(namespace: dict, module: str, names: tuple[str, ...]) -> None:
    """Documented instructions not emulated yet: a stub in ``namespace`` for each of ``names``
    that raises ``NotSupportedError`` naming it, unless the core's table has a row for it (then
    the module defines it from the row)."""
    in_table = {row[0] for row in _core.instruction_table()}
    for name in names:
        if name not in in_table:
            namespace[name] = _unsupported(module, name)


define_unsupported(globals(), "nki.isa", ("topk",))
NkiInstruction = _Unsupported("nki.isa.NkiInstruction")


def bind(op: str, names: list[str], pos: tuple, kw: dict) -> dict:
    """``{argument: value}`` of a call of instruction ``op`` whose arguments are ``names`` in
    order (NKI's ``name=`` dropped); errors name the argument."""
    kw.pop("name", None)
    if len(pos) > len(names):
        raise Trn2ValueError(f"args: {op} takes {len(names)} arguments ({', '.join(names)})")
    given = dict(zip(names[: len(pos)], pos, strict=True))
    for k, v in kw.items():
        if k in given:
            raise Trn2ValueError(f"{k}: given twice (by position and by name)")
        given[k] = v
    return given


def _from_table(row):
    """The current dialect's form of an instruction of the core's table that needs no more than
    its row says: ``f(dst, <the row's arguments>, engine=..., name=...)``, tensors as their
    tiles, operators and engines by NKI's names."""
    op, engines, _default, args, summary, _out = row
    names = [a[0] for a in args if a[0] != "engine"]
    kinds = {a[0]: a[1] for a in args}

    def f(*pos, **kw):
        given = bind(op, names, pos, kw)
        tensors = [v for v in given.values() if isinstance(v, NkiTensor)]
        out = {}
        for k, v in given.items():
            kind = kinds.get(k)
            if kind == "tile":
                out[k] = _t(v, k)
            elif kind == "alu_op" and v is not None:
                # nl.bypass: the stage skipped, as an optional operator left out (activate2).
                out[k] = None if isinstance(v, Op) and v.name == "bypass" else alu_name(v, k)
            elif kind == "activation_function":
                out[k] = act_name(v, k)
            elif kind == "engine":
                out[k] = engine_name(v, _default, tuple(engines), op)
            elif kind == "reduce_cmd" and v is not None:
                out[k] = reduce_cmd_name(v)
            elif isinstance(v, NkiTensor):
                out[k] = scalar_arg(v, k)
            else:
                out[k] = v
        c = _core_of(*tensors)
        c.m.issue_at(c.loc, op, **out)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"``{summary}`` (the core's instruction table; docs/machine.md)."
    return api(f)


# Every instruction of the table without a hand-written form above takes the generic one.
for _row in _core.instruction_table():
    if _row[0] not in globals():
        globals()[_row[0]] = _from_table(_row)
del _row

__all__ = [
    "dge_mode",
    "dma_engine",
    "engine",
    "tensor_engine",
    "vector_engine",
    "scalar_engine",
    "gpsimd_engine",
    "unknown_engine",
    "matmul_perf_mode",
    "nc_version",
    "oob_mode",
    "reduce_cmd",
    "np",
]
