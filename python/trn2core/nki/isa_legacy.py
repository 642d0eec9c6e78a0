"""``neuronxcc.nki.isa``, the legacy dialect (NKI 0.1, Neuron 2.26 and earlier): instructions
return their result as a new tile (``x = nisa.activation(op=nl.exp, data=t)``), accept
``mask=`` predicates over ``nl.arange`` indices, and ``iota``/``affine_select`` take index
expressions. Each call lowers onto the same machine instruction as the current dialect's
(``trn2core.nki.isa``); the result is issued when first read, or straight into the target of an
assignment (``t[...] = nisa.tensor_copy(x)``) or of ``psum += nisa.nc_matmul(a, b)``.
"""

from __future__ import annotations

import numpy as np

from .. import _core as _core_module
from ..errors import Trn2ValueError
from . import _dtypes as D
from . import isa as _cur
from ._index import IndexExpr, Mask, NotSupportedError, grid_of, var_axis
from ._ops import (
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
from ._runtime import PSUM, SBUF, api, current, scalar_arg
from ._tensor import NkiTensor

get_nc_version = _cur.get_nc_version


def _core(*xs):
    for x in xs:
        if isinstance(x, NkiTensor):
            return x._core
    return current()


def _result(core, shape, dtype, buffer, mask, issue, *operands, kind=None, per_row=None):
    """A pending result: ``issue(dst, *operands)`` on the mask's region of each; with
    ``per_row`` (an accumulator of one value per partition, ``reduce_res``),
    ``issue(dst, *operands, per_row)``, its partitions those of the region."""
    tiles = [o for o in operands if isinstance(o, NkiTensor)]
    same = [o for o in tiles if o.shape == tuple(shape)]
    rows = [o for o in tiles if o.shape != tuple(shape) and o.shape[0] == shape[0]]
    ranges = core.mask_ranges(mask, len(shape), *same, rows=rows)
    if len(shape) < 2:
        shape = (*shape, 1)

    def fn(dst):
        if ranges is None:
            return
        d = core.masked(dst, ranges)
        ops = [core.masked(o, ranges) if isinstance(o, NkiTensor) else o for o in operands]
        if per_row is not None:
            p = ranges[1].get(0)
            ops.append(per_row if p is None else core.masked(per_row, ({}, {0: p})))
        issue(d, *ops)

    return core.pend_valid(core.pend(shape, dtype, buffer, fn, kind), ranges)


def _pe_operand(core, t):
    """An instruction's result in PSUM (a legacy tensor-engine ``nc_transpose``'s, placed by
    the front end, not a tensor the kernel declared) read by the tensor engine, which reads
    SBUF: placed as the legacy compiler places it, in PSUM then copied to SBUF (the NKI docs:
    a Tensor Engine transpose writes PSUM; ``nc_matmul``'s operands are in SBUF). ``t`` then
    names the SBUF copy for its later uses too."""
    if not isinstance(t, NkiTensor) or not t._result or t.buffer is not PSUM:
        return t
    if t is core.pending:
        core.flush()
    t._adopt(core.evict(t))
    t.buffer = SBUF
    return t


def _dt(dtype, default):
    return default if dtype is None else D.as_dtype(dtype)


def _sc(x, arg):
    return None if x is None else scalar_arg(x, arg)


@api
def nc_matmul(
    stationary,
    moving,
    *,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    tile_position=(),
    tile_size=(),
    mask=None,
    perf_mode="none",
    **kwargs,
) -> NkiTensor:
    """``stationary.T @ moving`` into a new PSUM tile (float32); ``psum += nc_matmul(...)``
    accumulates in place. ``perf_mode="double_row_gen3"`` (the legacy name of
    ``double_row``): fp8 operands ``[K, 2, M]`` and ``[K, 2, N]``, a contraction over both
    rows of each partition, into ``[M, N]``."""
    core = _core(stationary, moving)
    stationary, moving = _pe_operand(core, stationary), _pe_operand(core, moving)
    pm = perf_mode.value if isinstance(perf_mode, matmul_perf_mode) else str(perf_mode)
    pm = "double_row" if pm == "double_row_gen3" else pm
    if isinstance(mask, (bool, np.bool_)):
        # A compile-time constant: the matmul runs (True) or is left out (False).
        mask = None if mask else False
    elif mask is not None:
        raise NotSupportedError("nc_matmul: operand masks are not emulated")
    core.on_chip(stationary, "stationary")
    core.on_chip(moving, "moving")
    pos, size = _cur._pe_tile(tile_position, tile_size)
    if mask is False:
        shape = (stationary.shape[1], stationary.shape[0] if is_transpose else moving.shape[1])
        dt = stationary.dtype if is_transpose else D.float32
        return _no_matmul(core, shape, dt)
    if is_transpose:

        def issue(d):
            core.m.issue_at(
                core.loc,
                "nc_matmul",
                d.tile,
                stationary.tile,
                moving.tile,
                None,
                "none",
                pos,
                size,
                True,
            )

        return core.pend((stationary.shape[1], stationary.shape[0]), stationary.dtype, PSUM, issue)
    shape = (stationary.shape[-1], moving.shape[-1]) if pm == "double_row" else None
    if shape is None or len(stationary.shape) != 3 or len(moving.shape) != 3:
        shape = (stationary.shape[1], moving.shape[1])  # the engine checks the operands
    if stationary._valid or moving._valid:
        return _matmul_under(core, stationary, moving, shape, (pm, pos, size, False))
    return core.matmul_pending(stationary, moving, shape, (pm, pos, size, False))


def _no_matmul(core, shape, dtype):
    """The pending result of an ``nc_matmul`` that is left out (its mask never holds): no
    instruction, assigned or accumulated."""

    def nothing(*_):
        pass

    return core.pend(shape, dtype, PSUM, nothing, ("matmul", nothing))


def _matmul_under(core, stationary, moving, shape, opts):
    """``nc_matmul`` of operands that hold a region only (``t[mask]``, or a masked
    instruction's result): the contraction over the partitions both hold, into the result's
    rows the stationary holds and columns the moving holds; the result holds that region."""
    if len(stationary.shape) != 2 or len(moving.shape) != 2:
        raise NotSupportedError("nc_matmul: masked operands of more than two axes")
    sv, mv = stationary._valid or {}, moving._valid or {}
    k = (0, min(stationary.shape[0], moving.shape[0]))
    for r in (sv.get(0), mv.get(0)):
        if r is not None:
            k = (max(k[0], r[0]), min(k[1], r[1]))
    out = {a: r for a, r in ((0, sv.get(1)), (1, mv.get(1))) if r is not None}
    if k[0] >= k[1] or any(lo >= hi for lo, hi in out.values()):
        return _no_matmul(core, shape, D.float32)
    st = core.masked(stationary, ({}, {0: k, **({1: out[0]} if 0 in out else {})}))
    mo = core.masked(moving, ({}, {0: k, **({1: out[1]} if 1 in out else {})}))
    res = core.matmul_pending(st, mo, shape, opts)
    _, issue = core.pend_kind

    def region(dst, accumulate=False):
        issue(core.masked(dst, ({}, out)), accumulate)

    core.pend_fn, core.pend_kind = region, ("matmul", region)
    return core.pend_valid(res, ({}, out))


@api
def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, **kwargs) -> NkiTensor:
    """``data.T``: tensor engine into PSUM, or Vector engine (up to 32 x 32) into SBUF."""
    core = _core(data)
    core.on_chip(data, "data")
    p, f = data.shape[0], core.free_size(data)
    default = "vector" if p <= 32 and f <= 32 else "tensor"
    e = engine_name(engine, default, ("tensor", "vector"), "nc_transpose")
    buf = PSUM if e == "tensor" else SBUF
    return _result(
        core,
        (f, p),
        _dt(dtype, data.dtype),
        buf,
        mask,
        lambda d, a: core.issue("nc_transpose", e, d.tile, a.tile),
        data,
    )


@api
def activation(
    op,
    data,
    *,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    mask=None,
    dtype=None,
    **kwargs,
) -> NkiTensor:
    """``op(data * scale + bias)`` into a new tile (Scalar engine)."""
    core = _core(data)
    core.on_chip(data, "data")
    f = act_name(op)
    cmd = reduce_cmd_name(reduce_cmd)
    if reduce_res is not None and cmd == "idle":
        cmd = "reset_reduce"
    rop = None if reduce_op is None else alu_name(reduce_op, "reduce_op")

    def issue(d, a, b, s, r=None):
        core.issue(
            "activation",
            d.tile,
            f,
            a.tile,
            _sc(b, "bias"),
            _cur._scale(s),
            rop,
            None if r is None else r.tile,
            cmd,
        )

    dt = _dt(dtype, data.dtype)
    return _result(core, data.shape, dt, SBUF, mask, issue, data, bias, scale, per_row=reduce_res)


@api
def activation_reduce(
    op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, **kwargs
) -> NkiTensor:
    """``activation`` with the results also added per partition into ``reduce_res``."""
    core = _core(data)
    f, rop = act_name(op), alu_name(reduce_op, "reduce_op")

    def issue(d, a, b, s, r):
        bias, sc = _sc(b, "bias"), _cur._scale(s)
        core.issue("activation_reduce", d.tile, f, a.tile, rop, r.tile, bias, sc)

    dt = _dt(dtype, data.dtype)
    return _result(core, data.shape, dt, SBUF, mask, issue, data, bias, scale, per_row=reduce_res)


@api
def tensor_tensor(
    data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown, **kwargs
) -> NkiTensor:
    """``data1 <op> data2`` into a new tile. A ``[P, 1]`` operand beside a ``[P, F]`` one is
    read with a stride-0 free axis (the legacy front end's broadcast; docs/nki.md,
    "Inferred, not documented")."""
    core = _core(data1, data2)
    if isinstance(data1, NkiTensor) and isinstance(data2, NkiTensor):
        data1, data2 = _free_broadcast(data1, data2)
    o = alu_name(op)
    e = _cur._tt_engine(engine, o, data1, data2)
    return _result(
        core,
        data1.shape,
        _dt(dtype, D.promote(data1.dtype, data2.dtype)),
        SBUF,
        mask,
        lambda d, a, b: core.issue("tensor_tensor", e, d.tile, a.tile, b.tile, o),
        data1,
        data2,
        kind=("alu", o),
    )


def _free_broadcast(a: NkiTensor, b: NkiTensor) -> tuple[NkiTensor, NkiTensor]:
    """Two 2-D on-chip tiles of the same partitions, one of a single element per partition:
    that one as a stride-0 view of the other's shape (anything else: unchanged, for the
    engine's own shape rule)."""
    sa, sb = a.shape, b.shape
    if sa == sb or len(sa) != 2 or len(sb) != 2 or sa[0] != sb[0]:
        return a, b
    if sb[1] == 1:
        return a, b.broadcast_to(sa)
    if sa[1] == 1:
        return a.broadcast_to(sb), b
    return a, b


@api
def tensor_scalar(
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    *,
    dtype=None,
    mask=None,
    engine=engine.unknown,
    **kwargs,
) -> NkiTensor:
    """``(data <op0> operand0) <op1> operand1`` into a new tile."""
    core = _core(data)
    e = engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), "tensor_scalar")
    o0 = alu_name(op0, "op0")
    o1 = None if op1 is None else alu_name(op1, "op1")

    def issue(d, a, s0, s1):
        core.issue(
            "tensor_scalar",
            e,
            d.tile,
            a.tile,
            o0,
            scalar_arg(s0, "operand0"),
            bool(reverse0),
            o1,
            _sc(s1, "operand1"),
            bool(reverse1),
        )

    return _result(
        core, data.shape, _dt(dtype, data.dtype), SBUF, mask, issue, data, operand0, operand1
    )


@api
def scalar_tensor_tensor(
    *,
    data,
    op0,
    operand0,
    op1,
    operand1,
    reverse0=False,
    reverse1=False,
    dtype=None,
    mask=None,
    **kwargs,
) -> NkiTensor:
    """``(data <op0> operand0) <op1> operand1`` (``operand1`` a tile) into a new tile."""
    core = _core(data)
    o0, o1 = alu_name(op0, "op0"), alu_name(op1, "op1")

    def issue(d, a, s0, b):
        core.issue(
            "scalar_tensor_tensor",
            d.tile,
            a.tile,
            o0,
            scalar_arg(s0, "operand0"),
            o1,
            b.tile,
            bool(reverse0),
            bool(reverse1),
        )

    return _result(
        core, data.shape, _dt(dtype, data.dtype), SBUF, mask, issue, data, operand0, operand1
    )


@api
def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown, **kwargs) -> NkiTensor:
    """A copy of ``src`` in a new SBUF tile."""
    core = _core(src)
    e = engine_name(engine, "vector", ("vector", "scalar", "gpsimd"), "tensor_copy")
    return _result(
        core,
        src.shape,
        _dt(dtype, src.dtype),
        SBUF,
        mask,
        lambda d, a: core.issue("tensor_copy", e, d.tile, a.tile),
        src,
    )


@api
def tensor_reduce(
    op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, **kwargs
) -> NkiTensor:
    """``reduce(op, data, axis)`` over the last free axes into a new tile."""
    core = _core(data)
    o = alu_name(op)
    n = _cur._axes(data, axis)
    kept = data.shape[: data.ndim - n]
    shape = (
        tuple(kept) + ((1,) * n if keepdims else ())
        if len(kept) > 1 or keepdims
        else (data.shape[0], 1)
    )
    ranges = core.mask_ranges(mask, data.ndim, data)

    def fn(dst):
        if ranges is None:
            return
        d = core.masked(dst, (ranges[0], {g: r for g, r in ranges[1].items() if g == 0}))
        core.m.issue_at(
            core.loc, "tensor_reduce", d.tile, o, core.masked(data, ranges).tile, n, bool(negate)
        )

    return core.pend_valid(core.pend(shape, _dt(dtype, data.dtype), SBUF, fn), ranges, (0,))


@api
def tensor_tensor_scan(
    data0,
    data1,
    initial,
    op0,
    op1,
    reverse0=False,
    reverse1=False,
    *,
    dtype=None,
    mask=None,
    **kwargs,
) -> NkiTensor:
    """The scan ``r[i] = op1(op0(data0[i], r[i - 1]), data1[i])`` into a new tile."""
    core = _core(data0, data1)
    o0, o1 = alu_name(op0, "op0"), alu_name(op1, "op1")

    def issue(d, a, b, init):
        core.issue(
            "tensor_tensor_scan",
            d.tile,
            a.tile,
            b.tile,
            scalar_arg(init, "initial"),
            o0,
            o1,
            bool(reverse0),
            bool(reverse1),
        )

    return _result(
        core, data0.shape, _dt(dtype, data0.dtype), SBUF, mask, issue, data0, data1, initial
    )


@api
def tensor_scalar_reduce(
    *, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None, **kwargs
) -> NkiTensor:
    """``data <op0> operand0`` into a new tile, reduced per partition into ``reduce_res``."""
    core = _core(data)
    o0, rop = alu_name(op0, "op0"), alu_name(reduce_op, "reduce_op")

    def issue(d, a, s0, r):
        core.issue(
            "tensor_scalar_reduce",
            d.tile,
            a.tile,
            o0,
            scalar_arg(s0, "operand0"),
            rop,
            r.tile,
            bool(reverse0),
            "reset_reduce",
            None,
            False,
        )

    dt = _dt(dtype, data.dtype)
    return _result(core, data.shape, dt, SBUF, mask, issue, data, operand0, per_row=reduce_res)


@api
def reciprocal(data, *, dtype=None, mask=None, **kwargs) -> NkiTensor:
    """``1 / data`` into a new tile (Vector engine)."""
    core = _core(data)
    return _result(
        core,
        data.shape,
        _dt(dtype, data.dtype),
        SBUF,
        mask,
        lambda d, a: core.issue("reciprocal", d.tile, a.tile),
        data,
    )


@api
def bn_stats(data, *, mask=None, dtype=None, **kwargs) -> NkiTensor:
    """Per-partition ``bn_stats`` of ``data`` into a new ``[P, 6]`` tile."""
    core = _core(data)
    return _result(
        core,
        (data.shape[0], 6),
        _dt(dtype, D.float32),
        SBUF,
        mask,
        lambda d, a: core.issue("bn_stats", d.tile, a.tile),
        data,
    )


@api
def bn_aggr(data, *, mask=None, dtype=None, **kwargs) -> NkiTensor:
    """``[mean, variance]`` per partition from ``bn_stats`` results, into a new tile."""
    core = _core(data)
    ranges = core.mask_ranges(mask, data.ndim, data)

    def fn(dst):
        if ranges is not None:
            d = core.masked(dst, (ranges[0], {g: r for g, r in ranges[1].items() if g == 0}))
            core.issue("bn_aggr", d.tile, core.masked(data, ranges).tile)

    return core.pend_valid(
        core.pend((data.shape[0], 2), _dt(dtype, D.float32), SBUF, fn), ranges, (0,)
    )


@api
def memset(shape, value, dtype, *, mask=None, engine=engine.unknown, **kwargs) -> NkiTensor:
    """A new tile of ``shape`` filled with ``value``."""
    core = current()
    e = engine_name(engine, "vector", ("vector", "gpsimd"), "memset")
    return _result(
        core,
        tuple(shape),
        D.as_dtype(dtype),
        SBUF,
        mask,
        lambda d: core.issue("memset", e, d.tile, float(value)),
    )


@api
def dma_copy(
    *,
    dst,
    src,
    mask=None,
    dst_rmw_op=None,
    oob_mode=oob_mode.error,
    dge_mode=dge_mode.unknown,
    **kwargs,
) -> None:
    """Copies ``src`` into ``dst`` on a DMA queue."""
    if dst_rmw_op is not None:
        raise NotSupportedError("dma_copy: dst_rmw_op (accumulating DMA) is not emulated")
    core = _core(dst, src)
    ranges = core.mask_ranges(mask, dst.ndim)
    core.flush()
    if ranges is not None:
        core.m.issue_at(
            core.loc, "dma_copy", core.masked(dst, ranges).tile, core.masked(src, ranges).tile, None
        )


@api
def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, **kwargs) -> None:
    """Copies partition ``shuffle_mask[i]`` of each 32-partition quadrant of ``src`` into
    partition ``i`` of ``dst``'s (255: unmodified); the legacy order, ``src`` first."""
    if mask is not None:
        raise NotSupportedError("nc_stream_shuffle: mask (a dst predicate) is not emulated")
    core = _core(dst, src)
    core.flush()
    core.issue("nc_stream_shuffle", dst.tile, src.tile, shuffle_mask)


def _affine(expr: IndexExpr, what: str):
    """``(pattern, offset, channel_multiplier, grid shape)`` of an affine index expression
    over a ``[P, F...]`` grid (partition variable on grid axis 0)."""
    if not isinstance(expr, IndexExpr):
        raise NotSupportedError(f"{what}: expected an index expression of nl.arange indices")
    shape = grid_of([expr])
    nd = len(shape)
    by_axis = {var_axis(v, nd): (v, c) for v, c in expr.terms.items()}
    cm = by_axis.get(0, (None, 0))[1] if nd > 1 else by_axis.get(0, (None, 0))[1]
    pattern = [(by_axis.get(g, (None, 0))[1], shape[g]) for g in range(1, nd)] or [(0, 1)]
    return pattern, expr.const, cm, shape if nd > 1 else (shape[0], 1)


@api
def iota(expr, dtype, *, mask=None, **kwargs) -> NkiTensor:
    """A new tile holding the values of an index expression (GpSimd ``iota``)."""
    core = current()
    pattern, offset, cm, shape = _affine(expr, "iota")
    return _result(
        core,
        shape,
        D.as_dtype(dtype),
        SBUF,
        mask,
        lambda d: core.issue("iota", d.tile, pattern, offset, cm),
    )


_CMP_OP = {
    "<": "less",
    "<=": "less_equal",
    ">": "greater",
    ">=": "greater_equal",
    "==": "equal",
    "!=": "not_equal",
}


@api
def affine_select(
    pred, on_true_tile, on_false_value, *, mask=None, dtype=None, **kwargs
) -> NkiTensor:
    """``pred ? on_true_tile : on_false_value`` where ``pred`` compares an affine expression of
    the tile's indices with zero (GpSimd ``affine_select``). An ``on_true_tile`` in PSUM
    (which GpSimd cannot read) is first copied to SBUF by the Vector engine: the legacy
    compiler places operands (AWS's flash-attention kernel selects straight from a matmul's
    PSUM result); the current dialect requires SBUF, as its documentation says."""
    if not isinstance(pred, Mask) or len(pred.conds) != 1:
        raise NotSupportedError("affine_select: pred is one comparison of nl.arange indices")
    ((expr, op),) = pred.conds
    core = _core(on_true_tile)
    if isinstance(on_true_tile, NkiTensor) and on_true_tile.buffer is PSUM:
        core.flush()
        on_true_tile = core.evict(on_true_tile)
    pattern, offset, cm, _ = _affine(expr, "affine_select")
    cmp = _CMP_OP[op]

    def issue(d, t):
        core.m.issue_at(
            core.loc,
            "affine_select",
            d.tile,
            pattern,
            cm,
            t.tile,
            float(on_false_value),
            cmp,
            offset,
        )

    return _result(
        core, on_true_tile.shape, _dt(dtype, on_true_tile.dtype), SBUF, mask, issue, on_true_tile
    )


_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


@api
def dma_transpose(
    src, *, axes=None, mask=None, dtype=None, dge_mode=dge_mode.unknown, **kwargs
) -> NkiTensor:
    """A new SBUF tile holding ``src`` (HBM or SBUF) with its axes permuted by NKI's rule,
    ``[1, 0]``, ``[2, 1, 0]`` or ``[3, 1, 2, 0]`` (or ``axes``), bit for bit, on a DMA queue."""
    if mask is not None:
        raise NotSupportedError("dma_transpose: mask (a dst predicate) is not emulated")
    mode = dge_mode_name(dge_mode)
    if mode not in _cur._DIRECT_TRANSPOSE_DGE_MODES:
        raise Trn2ValueError(
            f"dge_mode: a direct dma_transpose takes dge_mode unknown, hwdge or none, got {mode}",
            arg="dge_mode",
        )
    core = _core(src)
    perm = None if axes is None else [int(a) for a in axes]
    order = perm or _TRANSPOSE_AXES.get(src.ndim) or tuple(range(src.ndim))[::-1]
    shape = tuple(src.shape[a] if 0 <= a < src.ndim else 1 for a in order)

    def issue(d):
        core.m.issue_at(
            core.loc,
            "dma_transpose",
            _cur._as_shaped(d, "dst"),
            _cur._as_shaped(src, "src"),
            perm,
            mode == "hwdge",
        )

    return _result(core, shape, _dt(dtype, src.dtype), SBUF, None, issue)


@api
def range_select(
    *,
    on_true_tile,
    comp_op0,
    comp_op1,
    bound0,
    bound1,
    reduce_cmd=reduce_cmd.idle,
    reduce_res=None,
    reduce_op=np.amax,
    range_start=0,
    on_false_value=None,
    mask=None,
    dtype=None,
    **kwargs,
) -> NkiTensor:
    """A new tile: ``on_true_tile`` where ``comp_op0(range_start + j, bound0)`` and
    ``comp_op1(range_start + j, bound1)`` for free index ``j``, else ``on_false_value``
    (float32's lowest), max-reduced into ``reduce_res`` (Vector ``range_select``; the legacy
    default ``reduce_cmd`` is idle)."""
    if mask is not None:
        raise NotSupportedError("range_select: mask (a dst predicate) is not emulated")
    core = _core(on_true_tile, bound0, bound1)
    fill = float(np.finfo(np.float32).min) if on_false_value is None else float(on_false_value)

    def issue(d):
        core.m.issue_at(
            core.loc,
            "range_select",
            d.tile,
            on_true_tile.tile,
            alu_name(comp_op0, "comp_op0"),
            alu_name(comp_op1, "comp_op1"),
            scalar_arg(bound0, "bound0"),
            scalar_arg(bound1, "bound1"),
            reduce_cmd_name(reduce_cmd),
            None if reduce_res is None else reduce_res.tile,
            alu_name(reduce_op, "reduce_op"),
            int(range_start),
            fill,
        )

    return _result(core, on_true_tile.shape, _dt(dtype, on_true_tile.dtype), SBUF, None, issue)


@api
def sequence_bounds(*, segment_ids, dtype=None, **kwargs) -> NkiTensor:
    """A new ``[1, 2, n]`` tile: each element's segment start and end (exclusive), ``n`` and
    -1 for padding (id 0) (GpSimd ``sequence_bounds``; float32 or int32)."""
    core = _core(segment_ids)
    shape = (segment_ids.shape[0], 2, *segment_ids.shape[1:])

    def issue(d):
        core.m.issue_at(core.loc, "sequence_bounds", d.tile, segment_ids.tile)

    return _result(core, shape, _dt(dtype, segment_ids.dtype), SBUF, None, issue)


@api
def select_reduce(
    *,
    dst,
    predicate,
    on_true,
    on_false,
    reduce_res=None,
    reduce_cmd=reduce_cmd.idle,
    reduce_op=np.amax,
    reverse_pred=False,
    mask=None,
    dtype=None,
    **kwargs,
) -> None:
    """``dst = predicate ? on_true : on_false`` (Vector), max-reduced into ``reduce_res``; the
    legacy form also writes its ``dst`` (keywords only)."""
    if mask is not None:
        raise NotSupportedError("select_reduce: mask (a dst predicate) is not emulated")
    core = _core(dst, predicate, on_true)
    core.flush()
    core.m.issue_at(
        core.loc,
        "select_reduce",
        dst.tile,
        predicate.tile,
        on_true.tile,
        scalar_arg(on_false, "on_false"),
        None if reduce_res is None else reduce_res.tile,
        reduce_cmd_name(reduce_cmd),
        alu_name(reduce_op, "reduce_op"),
        bool(reverse_pred),
    )


@api
def tensor_copy_dynamic_src(
    src, *, mask=None, dtype=None, engine=engine.unknown, **kwargs
) -> NkiTensor:
    """A copy of ``src``, indexed by a dynamic offset (``t[i, off + j]``), in a new tile."""
    core = _core(src)
    e = _dynamic_engine(engine, mask, "tensor_copy_dynamic_src")

    def issue(d):
        _cur.issue_dynamic_copy(core, "tensor_copy_dynamic_src", e, d, src)

    return core.pend(src.shape, _dt(dtype, src.dtype), SBUF, issue)


@api
def tensor_copy_dynamic_dst(
    *, dst, src, mask=None, dtype=None, engine=engine.unknown, **kwargs
) -> None:
    """``dst`` (indexed by a dynamic offset) ``= src``."""
    core = _core(dst, src)
    e = _dynamic_engine(engine, mask, "tensor_copy_dynamic_dst")
    if dtype is not None and isinstance(dst, NkiTensor) and D.as_dtype(dtype) != dst.dtype:
        raise Trn2ValueError(f"dtype: {dtype} differs from dst's {dst.dtype}", arg="dtype")
    core.flush()
    _cur.issue_dynamic_copy(core, "tensor_copy_dynamic_dst", e, dst, src)


def _dynamic_engine(e, mask, op: str) -> str:
    if mask is not None:
        raise NotSupportedError(f"{op}: mask= is not emulated")
    return engine_name(e, "vector", _cur._COPY_ENGINES, op)


_cur.define_unsupported(
    globals(),
    "neuronxcc.nki.isa",
    (
        "local_gather",
        "nc_match_replace8",
        "nc_stream_shuffle",
        "tensor_copy_predicated",
        "builtin_custom_op",
    ),
)


@api
def local_gather(
    src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, **kwargs
) -> NkiTensor:
    """A new tile of the gathered elements (GpSimd ``local_gather``: each 16-partition group's
    partitions gather runs of ``num_elem_per_idx`` elements of their own row at the group's
    uint16 indices): ``[P, k / 16, 16, m]`` for ``k`` indices a group, a multiple of 16 (the
    legacy reference's example: ``[128, 4, 16, 4]``), else ``[P, k, m]``."""
    core = _core(src_buffer, index)
    k = index.size // index.shape[0] * 16 if num_valid_indices is None else num_valid_indices
    k, m = int(k), int(num_elem_per_idx)
    p = src_buffer.shape[0]
    shape = (p, k // 16, 16, m) if k % 16 == 0 else (p, k, m)

    def issue(d):
        core.m.issue_at(core.loc, "local_gather", d.tile, src_buffer.tile, index.tile, m, k)

    return _result(core, shape, src_buffer.dtype, SBUF, mask, issue)


def _from_table(row):
    """The legacy form of an instruction of the core's table whose result tile its row
    describes (``("like", input)``, ``("columns", n)`` or ``("partition", input)``: the input's
    shape with one partition): ``x = f(<inputs>, dtype=, mask=, engine=)`` allocates the result
    and issues the instruction into it."""
    op, engines, default, args, summary, (kind, detail, out_dtype) = row
    names = [a[0] for a in args if a[0] not in ("dst", "engine")]
    kinds = {a[0]: a[1] for a in args}

    def f(*pos, mask=None, dtype=None, engine=engine.unknown, **kw):
        given = _cur.bind(op, names, pos, kw)
        tiles = [k for k in names if kinds[k] == "tile" and isinstance(given.get(k), NkiTensor)]
        if not tiles:
            raise Trn2ValueError(f"{names[0]}: {op} needs its input tensors")
        first = given[tiles[0]]
        core = _core(*(given[k] for k in tiles))
        if kind == "columns":
            shape = (first.shape[0], int(detail))
        else:
            shape = given[detail].shape
            shape = (1, *shape[1:]) if kind == "partition" else shape
        dt = _dt(dtype, first.dtype if out_dtype is None else D.as_dtype(out_dtype))
        rest = {}
        for k, v in given.items():
            if k in tiles:
                continue
            if kinds.get(k) == "alu_op" and v is not None:
                rest[k] = alu_name(v, k)
            else:
                rest[k] = scalar_arg(v, k) if isinstance(v, NkiTensor) else v
        if "engine" in kinds:
            rest["engine"] = engine_name(engine, default, tuple(engines), op)

        def issue(d, *ops):
            core.m.issue_at(
                core.loc,
                op,
                dst=d.tile,
                **rest,
                **{k: o.tile for k, o in zip(tiles, ops, strict=True)},
            )

        return _result(core, shape, dt, SBUF, mask, issue, *(given[k] for k in tiles))

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"``{summary}``, into a new tile (the core's instruction table)."
    return api(f)


# Every instruction of the table with a result its row describes and no hand-written form above.
# A row whose result is its own rule ("own") needs a hand-written legacy form; until it has one
# the name exists and raises NotSupportedError (never an AttributeError).
for _row in _core_module.instruction_table():
    if _row[0] not in globals():
        own = _row[5][0] == "own"
        globals()[_row[0]] = (
            _cur._unsupported("neuronxcc.nki.isa", _row[0]) if own else _from_table(_row)
        )
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
]
