"""``nki.collectives`` between the ranks of a multi-rank launch (``trn2core.nki.run(kernel,
..., ranks=N)``; ``_ranks``; docs/nki.md, "Collectives across ranks"): ``rank_id``,
``ReplicaGroup``, ``all_gather``, ``all_reduce``, ``reduce_scatter``, ``all_to_all``,
``collective_permute``, ``collective_permute_implicit`` (and its ``_reduce`` form and
``_current_processing_rank_id``), ``all_gather_v``, ``all_to_all_v``.

Each call on each rank records one ``dma_copy`` per block the rank receives (the bytes it
receives, the transfer's cost; the variable-length forms: per chunk it sends, the counts it
knows), meets the other ranks with when the last of them would start,
holds it to the latest rank of its group, and writes what the group's sources make into the
destination. Moves are bit for bit; reductions are the machine collectives' ``mesh`` rule,
computed by the same core function (``_core.collective_reduce``, docs/collectives.md): each
chunk's owner's value, then the others' in the group's order, in fp32, rounded once.
"""

from __future__ import annotations

import numpy as np

from .. import _core
from ..dtypes import format_of_dtype
from ..errors import FormatError, ShapeError, Trn2Error, Trn2ValueError
from . import _dtypes as D
from ._api import api
from ._index import is_int
from ._lnc2 import _times, _where, one_dtype
from ._ops import alu_name
from ._register import VirtualRegister
from ._rendezvous import Call
from ._runtime import Core, current
from ._tensor import NkiTensor


class ReplicaGroup:
    """``nki.collectives.ReplicaGroup``: the ranks taking part in a collective, as disjoint
    lists of rank ids (``ReplicaGroup([[0, 1, 2, 3]])``); each list is one group, gathered in
    its order."""

    def __init__(self, groups) -> None:
        if isinstance(groups, ReplicaGroup):
            groups = groups.groups
        if not isinstance(groups, (list, tuple)) or not groups:
            raise Trn2ValueError(
                f"groups: a ReplicaGroup is a non-empty list of lists of rank ids, got {groups!r}",
                arg="groups",
            )
        out: list[tuple[int, ...]] = []
        seen: set[int] = set()
        for g in groups:
            if not isinstance(g, (list, tuple)) or not g or not all(is_int(r) for r in g):
                raise Trn2ValueError(
                    f"groups: each group is a non-empty list of rank ids, got {g!r}", arg="groups"
                )
            for r in g:
                if r < 0 or r in seen:
                    raise Trn2ValueError(
                        f"groups: rank {r} is "
                        + ("negative" if r < 0 else "in two groups (groups must not overlap)"),
                        arg="groups",
                    )
                seen.add(int(r))
            out.append(tuple(int(r) for r in g))
        self.groups = tuple(out)

    def __repr__(self) -> str:
        return f"ReplicaGroup({[list(g) for g in self.groups]!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ReplicaGroup) and other.groups == self.groups

    def __hash__(self) -> int:
        return hash(self.groups)


@api
def rank_id(name=None) -> VirtualRegister:
    """This rank's id (0 to N-1 under ``trn2core.nki.run(..., ranks=N)``; 0 in a one-rank
    launch) in a register, as on the chip (a ``scalar_offset``, a register operand)."""
    return VirtualRegister(current().launch.rank)


def _group(c: Core, replica_group) -> tuple[int, ...]:
    """The group of ``replica_group`` holding ``c``'s rank."""
    if not isinstance(replica_group, ReplicaGroup):
        raise Trn2ValueError(
            f"replica_group: expected a nki.collectives.ReplicaGroup, got "
            f"{type(replica_group).__name__}",
            arg="replica_group",
        )
    ranks = c.launch.ranks
    top = max(max(g) for g in replica_group.groups)
    if top >= ranks:
        raise Trn2ValueError(
            f"replica_group: names rank {top}, but this launch runs {ranks} rank"
            f"{'s' if ranks != 1 else ''} (launch it with trn2core.nki.run(..., ranks=N))",
            arg="replica_group",
        )
    for g in replica_group.groups:
        if c.launch.rank in g:
            return g
    raise Trn2ValueError(
        f"replica_group: rank {c.launch.rank} is in none of its groups {replica_group!r}",
        arg="replica_group",
    )


def _tensors(arg: str, xs) -> list[NkiTensor]:
    if not isinstance(xs, (list, tuple)) or not xs:
        raise Trn2ValueError(f"{arg}: expected a non-empty list of tensors, got {xs!r}", arg=arg)
    for t in xs:
        if not isinstance(t, NkiTensor):
            raise Trn2ValueError(
                f"{arg}: expected a list of tensors, got a {type(t).__name__} in it", arg=arg
            )
    return list(xs)


#: DMA quality-of-service levels of ``priority=`` (the NKI collectives reference: 0-3).
_PRIORITIES = range(4)


def _priority(priority) -> None:
    if priority is not None and (not is_int(priority) or priority not in _PRIORITIES):
        raise Trn2ValueError(
            f"priority: a DMA quality-of-service level 0 to 3 (lower is higher; the NKI "
            f"collectives reference) or None, got {priority!r}",
            arg="priority",
        )


def _lists(op: str, srcs, dsts, *, sbuf: bool = True) -> tuple[list, list, bool]:
    """``srcs`` and ``dsts`` as lists of one length, all in HBM or (``sbuf``) all in SBUF,
    several (coalesced) only in HBM, SBUF ones 2D (the NKI collectives reference). Returns
    them and whether they are in SBUF."""
    srcs, dsts = _tensors("srcs", srcs), _tensors("dsts", dsts)
    if len(srcs) != len(dsts):
        raise Trn2ValueError(
            f"dsts: {op} needs one destination per source, got {len(srcs)} sources and "
            f"{len(dsts)} destinations",
            arg="dsts",
        )
    spaces = {t.buffer.space for t in (*srcs, *dsts)}
    allowed = ("hbm", "sbuf") if sbuf else ("hbm",)
    for arg, xs in (("srcs", srcs), ("dsts", dsts)):
        bad = next((t for t in xs if t.buffer.space not in allowed), None)
        if bad is not None and bad.buffer.space not in ("hbm", "sbuf"):
            raise Trn2ValueError(
                f"{arg}: {op}'s tensors are in HBM{' or SBUF' if sbuf else ''} (the NKI "
                f"collectives reference), got one in {bad.buffer.name}",
                arg=arg,
                rule="collective_memory",
            )
    if not sbuf and spaces != {"hbm"}:
        bad = "srcs" if any(t.buffer.space != "hbm" for t in srcs) else "dsts"
        raise Trn2ValueError(
            f"{bad}: {op}'s tensors are in HBM (the NKI collectives reference: SBUF is not "
            f"supported), got {' and '.join(sorted(spaces))}",
            arg=bad,
            rule="collective_memory",
        )
    if spaces not in ({"hbm"}, {"sbuf"}):
        raise Trn2ValueError(
            f"dsts: {op}'s tensors are all in HBM or all in SBUF (the NKI collectives "
            f"reference), got {' and '.join(sorted(spaces))}",
            arg="dsts",
            rule="collective_memory",
        )
    in_sbuf = spaces == {"sbuf"}
    if in_sbuf and len(srcs) > 1:
        raise Trn2ValueError(
            f"srcs: coalesced {op} ({len(srcs)} tensors) is only supported in HBM (the NKI "
            "collectives reference)",
            arg="srcs",
            rule="collective_memory",
        )
    if in_sbuf:
        for s, t in zip(srcs, dsts, strict=True):
            if len(s.shape) != 2 or len(t.shape) != 2:
                raise ShapeError(
                    f"srcs: SBUF collectives take 2D tiles (the NKI collectives reference), "
                    f"got {tuple(s.shape)} and {tuple(t.shape)}",
                    arg="srcs",
                )
    for s, t in zip(srcs, dsts, strict=True):
        one_dtype("dsts", f"{op} needs a source and its destination", s, t)
    return srcs, dsts, in_sbuf


def _dim(op: str, collective_dim, dims: tuple[int, ...], where: str) -> int:
    if not is_int(collective_dim) or collective_dim not in dims:
        raise Trn2ValueError(
            f"collective_dim: {op} of {where} works along dimension "
            f"{' or '.join(map(str, dims))} (the NKI collectives reference), got "
            f"{collective_dim!r}",
            arg="collective_dim",
        )
    return int(collective_dim)


def _slot(shape, d: int, j: int, n: int) -> tuple[slice, ...]:
    """Part ``j`` of ``n`` of a tensor of ``shape`` cut along dimension ``d``."""
    k = shape[d] // n
    return tuple(slice(j * k, (j + 1) * k) if i == d else slice(None) for i in range(len(shape)))


def _check(*pairs, srcs=(), arg: str = "srcs") -> tuple:
    """What every rank's matching call must agree on: ``pairs`` (argument name, value) and the
    sources' shapes and dtypes (named ``arg``): ``_ranks.RankGroup.meet`` names the first
    that differs."""
    shapes = tuple(tuple(s.shape) for s in srcs)
    return (*pairs, (arg, (shapes, tuple(D.machine_name(s.dtype) for s in srcs))))


@api
def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """Each rank's ``srcs[i]`` concatenated along ``collective_dim`` in its group's rank order,
    into every rank's ``dsts[i]`` (module doc)."""
    c = current()
    c.flush()
    srcs, dsts, sbuf = _lists("all_gather", srcs, dsts)
    group = _group(c, replica_group)
    _priority(priority)
    d = _dim("all_gather", collective_dim, (0, 1) if sbuf else (0,),
             "SBUF tiles" if sbuf else "HBM tensors")  # fmt: skip
    n = len(group)
    for s, t in zip(srcs, dsts, strict=True):
        want = tuple(s.shape[:d]) + (s.shape[d] * n,) + tuple(s.shape[d + 1 :])
        if tuple(t.shape) != want:
            raise ShapeError(
                f"dsts: all_gather of a {tuple(s.shape)} source over a group of {n} ranks "
                f"along dimension {d} fills a {want} destination, got {tuple(t.shape)}",
                arg="dsts",
            )
    bits = _bits(c, srcs)
    for s, t in zip(srcs, dsts, strict=True):
        for j in range(n):
            c.issue("dma_copy", t[_slot(t.shape, d, j, n)].tile, s.tile, None)
    check = _check(("replica_group", replica_group.groups), ("collective_dim", d), srcs=srcs)
    calls = _exchange(c, "all_gather", group, bits, check)
    for i, (s, t) in enumerate(zip(srcs, dsts, strict=True)):
        parts = [_elements(calls[r].payload[i], s) for r in group]
        c.m.write(t.tile, np.ascontiguousarray(np.concatenate(parts, axis=d)).reshape(-1))


def _bits(c: Core, tensors) -> list[np.ndarray]:
    """The bytes of ``tensors`` now (read before the call's own transfers write anything)."""
    return [c.m.read(t.tile) for t in tensors]


def _exchange(c: Core, op: str, group, bits, check, issued: bool = True) -> list[Call]:
    """Meets every rank with ``bits`` and the start of ``c``'s last instruction (the transfer
    just issued); holds that instruction to the latest start in ``group``. Returns every
    rank's call, in rank order. Without a transfer issued (``issued`` false) the rank brings
    the end of its last instruction (0 if none) and nothing is held."""
    start, end = _times(c)
    tick = float(start[-1]) if issued else float(end.max()) if len(end) else 0.0
    mine = Call(op, _where(), tick, bits, check)
    calls = c.launch.group.meet(c.launch.rank, c.index, mine)
    if issued:
        c.m.hold_last(max(calls[r].tick for r in group))
    return calls


def _elements(raw, like: NkiTensor) -> np.ndarray:
    """Raw bytes read from a tile like ``like``, as its elements' bytes [*shape, itemsize]."""
    return np.asarray(raw).view(np.uint8).reshape(*like.shape, like.dtype.itemsize)


#: ``op=`` of the reducing collectives (the NKI collectives reference) -> the machine
#: collectives' reduction (docs/collectives.md).
_REDUCE_OPS = {"add": "sum", "maximum": "max", "minimum": "min"}


def _reduce_op(op) -> str:
    try:
        name = alu_name(op, "op")
    except Trn2Error:
        name = None
    if name not in _REDUCE_OPS:
        raise Trn2ValueError(
            f"op: the collectives reduce with nl.add, nl.minimum or nl.maximum (the NKI "
            f"collectives reference), got {getattr(op, '__name__', op)!r}",
            arg="op",
        )
    return _REDUCE_OPS[name]


def _format(arg: str, t: NkiTensor) -> str:
    """The number format a reduction of ``t`` takes (floats only, as the machine
    collectives: the chip reduces in fp32; docs/collectives.md)."""
    try:
        return format_of_dtype(np.dtype(t.dtype), arg)
    except Trn2Error:
        pass
    raise FormatError(
        f"{arg}: the collectives reduce float32, bfloat16, float16 and float8 tensors in fp32 "
        f"(docs/collectives.md), got {D.machine_name(t.dtype)}",
        arg=arg,
    )


#: Chips enough for any group, all in one mesh (a reduction's bits depend only on the group's
#: order under ``mesh``, not on where its chips are).
_MESH_TORUS = _core.Torus([64, 16], 1, 1)
_CODE = {4: np.float32, 2: np.uint16, 1: np.uint8}


def _reduce(collective: str, op: str, fmt: str, itemsize: int, parts) -> list[np.ndarray]:
    """The machine collectives' ``mesh`` ``collective`` (``all_reduce``, ``reduce_scatter``)
    of ``parts`` (each position's raw bytes, in the group's order), as each position's output
    bytes: the same core function and order as ``Instance.all_reduce(..., algorithm="mesh")``."""
    n = len(parts)
    if n > _MESH_TORUS.size:
        raise Trn2ValueError(
            f"replica_group: a group of {n} ranks; reductions are modelled for up to "
            f"{_MESH_TORUS.size}",
            arg="replica_group",
        )
    code = _CODE[itemsize]
    arrays = [np.asarray(p).view(np.uint8).view(code) for p in parts]
    outs, _ = _core.collective_reduce(_MESH_TORUS, list(range(n)), collective, op, "mesh", fmt,
                                      arrays)  # fmt: skip
    return [np.ascontiguousarray(o).view(np.uint8).reshape(-1) for o in outs]


@api
def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None) -> None:
    """Every rank of a group gets the reduction (``op``: ``nl.add``, ``nl.minimum``,
    ``nl.maximum``) of the group's ``srcs[i]`` in ``dsts[i]`` (module doc: the ``mesh`` order
    of docs/collectives.md, each tensor on its own)."""
    c = current()
    c.flush()
    srcs, dsts, _ = _lists("all_reduce", srcs, dsts)
    group = _group(c, replica_group)
    how = _reduce_op(op)
    _priority(priority)
    fmts = [_format("srcs", s) for s in srcs]
    for s, t in zip(srcs, dsts, strict=True):
        if tuple(t.shape) != tuple(s.shape):
            raise ShapeError(
                f"dsts: all_reduce's destination has its source's shape {tuple(s.shape)}, got "
                f"{tuple(t.shape)}",
                arg="dsts",
            )
    bits = _bits(c, srcs)
    for s, t in zip(srcs, dsts, strict=True):
        for _ in group:
            c.issue("dma_copy", t.tile, s.tile, None)
    check = _check(("replica_group", replica_group.groups), ("op", how), srcs=srcs)
    calls = _exchange(c, "all_reduce", group, bits, check)
    me = group.index(c.launch.rank)
    for i, t in enumerate(dsts):
        parts = [calls[r].payload[i] for r in group]
        outs = _reduce("all_reduce", how, fmts[i], t.dtype.itemsize, parts)
        c.m.write(t.tile, outs[me])


@api
def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None):
    """The ``j``-th rank of a group gets part ``j`` (along ``collective_dim``, 0) of the
    reduction of the group's ``srcs[i]`` in ``dsts[i]`` (``all_reduce``'s order)."""
    c = current()
    c.flush()
    srcs, dsts, sbuf = _lists("reduce_scatter", srcs, dsts)
    group = _group(c, replica_group)
    d = _dim("reduce_scatter", collective_dim, (0,), "SBUF tiles" if sbuf else "HBM tensors")
    how = _reduce_op(op)
    _priority(priority)
    fmts = [_format("srcs", s) for s in srcs]
    n = len(group)
    for s, t in zip(srcs, dsts, strict=True):
        if s.shape[0] % n:
            raise ShapeError(
                f"srcs: reduce_scatter over a group of {n} ranks cuts dimension 0 into {n} "
                f"parts, got {tuple(s.shape)}",
                arg="srcs",
            )
        want = (s.shape[0] // n, *s.shape[1:])
        if tuple(t.shape) != want:
            raise ShapeError(
                f"dsts: reduce_scatter of a {tuple(s.shape)} source over a group of {n} ranks "
                f"fills a {want} destination, got {tuple(t.shape)}",
                arg="dsts",
            )
    me = group.index(c.launch.rank)
    bits = _bits(c, srcs)
    for s, t in zip(srcs, dsts, strict=True):
        for _ in group:
            c.issue("dma_copy", t.tile, s[_slot(s.shape, d, me, n)].tile, None)
    check = _check(("replica_group", replica_group.groups), ("collective_dim", d),
                   ("op", how), srcs=srcs)  # fmt: skip
    calls = _exchange(c, "reduce_scatter", group, bits, check)
    for i, t in enumerate(dsts):
        outs = _reduce(
            "reduce_scatter", how, fmts[i], t.dtype.itemsize, [calls[r].payload[i] for r in group]
        )
        c.m.write(t.tile, outs[me])


@api
def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """The ``j``-th rank of a group gets part ``j`` (along ``collective_dim``, 0) of every
    group member's ``srcs[i]``, in the group's order, in ``dsts[i]`` (HBM; bits moved)."""
    c = current()
    c.flush()
    srcs, dsts, _ = _lists("all_to_all", srcs, dsts, sbuf=False)
    group = _group(c, replica_group)
    d = _dim("all_to_all", collective_dim, (0,), "HBM tensors")
    _priority(priority)
    n = len(group)
    for s, t in zip(srcs, dsts, strict=True):
        if s.shape[0] % n:
            raise ShapeError(
                f"srcs: all_to_all over a group of {n} ranks cuts dimension 0 into {n} parts, "
                f"got {tuple(s.shape)}",
                arg="srcs",
            )
        if tuple(t.shape) != tuple(s.shape):
            raise ShapeError(
                f"dsts: all_to_all's destination has its source's shape {tuple(s.shape)}, got "
                f"{tuple(t.shape)}",
                arg="dsts",
            )
    me = group.index(c.launch.rank)
    bits = _bits(c, srcs)
    for s, t in zip(srcs, dsts, strict=True):
        for j in range(n):
            c.issue("dma_copy", t[_slot(t.shape, d, j, n)].tile,
                    s[_slot(s.shape, d, me, n)].tile, None)  # fmt: skip
    check = _check(("replica_group", replica_group.groups), ("collective_dim", d), srcs=srcs)
    calls = _exchange(c, "all_to_all", group, bits, check)
    for i, (s, t) in enumerate(zip(srcs, dsts, strict=True)):
        parts = [_elements(calls[r].payload[i], s)[_slot(s.shape, d, me, n)] for r in group]
        c.m.write(t.tile, np.ascontiguousarray(np.concatenate(parts, axis=d)).reshape(-1))


@api
def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None) -> None:
    """Each ``(source, target)`` pair: rank ``source``'s ``srcs[0]`` into rank ``target``'s
    ``dsts[0]`` (HBM, one tensor); a rank no pair targets keeps its ``dsts[0]``."""
    c = current()
    c.flush()
    srcs, dsts, _ = _lists("collective_permute", srcs, dsts, sbuf=False)
    if len(srcs) != 1:
        raise Trn2ValueError(
            f"srcs: collective_permute takes exactly one tensor (coalesced collectives are not "
            f"supported, the NKI collectives reference), got {len(srcs)}",
            arg="srcs",
        )
    pairs = _permute_pairs(c, source_target_pairs)
    _priority(priority)
    (s,), (t,) = srcs, dsts
    if tuple(t.shape) != tuple(s.shape):
        raise ShapeError(
            f"dsts: collective_permute's destination has its source's shape {tuple(s.shape)}, "
            f"got {tuple(t.shape)}",
            arg="dsts",
        )
    me = c.launch.rank
    source = next((a for a, b in pairs if b == me), None)
    bits = _bits(c, srcs)
    if source is not None:
        c.issue("dma_copy", t.tile, s.tile, None)
    check = _check(("source_target_pairs", pairs), srcs=srcs)
    # A rank no pair targets receives nothing: it meets the others, holding nothing.
    group = (me,) if source is None else (me, source)
    calls = _exchange(c, "collective_permute", group, bits, check, issued=source is not None)
    if source is not None:
        c.m.write(t.tile, np.ascontiguousarray(_elements(calls[source].payload[0], s)).reshape(-1))


def _permute_pairs(c: Core, pairs) -> tuple[tuple[int, int], ...]:
    """``source_target_pairs`` as a tuple of (source, target) ranks of this launch, each
    source and each target at most once."""
    arg = "source_target_pairs"
    ok = isinstance(pairs, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(is_int(r) for r in p) for p in pairs
    )
    if not ok:
        raise Trn2ValueError(f"{arg}: expected a list of (source, target) rank ids, got {pairs!r}",
                             arg=arg)  # fmt: skip
    out = tuple((int(a), int(b)) for a, b in pairs)
    for a, b in out:
        for r in (a, b):
            if not 0 <= r < c.launch.ranks:
                raise Trn2ValueError(
                    f"{arg}: names rank {r}, but this launch runs {c.launch.ranks} rank"
                    f"{'s' if c.launch.ranks != 1 else ''} (launch it with "
                    "trn2core.nki.run(..., ranks=N))",
                    arg=arg,
                )
    for k, what in ((0, "sends"), (1, "receives")):
        seen = [p[k] for p in out]
        dup = next((r for r in seen if seen.count(r) > 1), None)
        if dup is not None:
            raise Trn2ValueError(
                f"{arg}: rank {dup} {what} twice (each rank is at most one source and one "
                f"target), got {pairs!r}",
                arg=arg,
            )
    return out


def _pairs(
    srcs_by_channel, dsts_by_channel, *more, first: str = "srcs_by_channel"
) -> list[tuple[NkiTensor, ...]]:
    """Each channel's (source, [second source,] destination): one tensor each (the NKI
    collectives reference), of one dtype, shape and memory. ``more``: (name, lists) of a
    second source before the destinations; ``first`` the sources' argument name."""
    named = [(first, srcs_by_channel), *more, ("dsts_by_channel", dsts_by_channel)]
    for arg, xs in named:
        if not isinstance(xs, (list, tuple)) or not xs:
            raise Trn2ValueError(f"{arg}: expected a non-empty list of lists, got {xs!r}", arg=arg)
        for inner in xs:
            if _tensors(arg, inner) and len(inner) != 1:
                raise Trn2ValueError(
                    f"{arg}: each channel takes exactly one tensor (coalesced collectives are "
                    f"not supported here, the NKI collectives reference), got {len(inner)}",
                    arg=arg,
                )
    for arg, xs in named[1:]:
        if len(xs) != len(srcs_by_channel):
            raise Trn2ValueError(
                f"{arg}: {len(xs)} channels for {len(srcs_by_channel)} source channels", arg=arg
            )
    out = []
    for chans in zip(*(xs for _, xs in named), strict=True):
        s = chans[0][0]
        for (arg, _), (t,) in zip(named[1:], chans[1:], strict=True):
            if s.dtype != t.dtype or tuple(s.shape) != tuple(t.shape):
                raise ShapeError(
                    f"{arg}: a channel's tensors have its source's shape and dtype, got "
                    f"{tuple(t.shape)} {D.machine_name(t.dtype)} for {tuple(s.shape)} "
                    f"{D.machine_name(s.dtype)}",
                    arg=arg,
                )
            if s.buffer.space not in ("hbm", "sbuf") or t.buffer.space != s.buffer.space:
                raise Trn2ValueError(
                    f"{arg}: a channel moves HBM to HBM or SBUF to SBUF, got "
                    f"{s.buffer.name} and {t.buffer.name}",
                    arg=arg,
                    rule="collective_memory",
                )
        out.append(tuple(x[0] for x in chans))
    return out


#: Channels of an implicit collective permute (the NKI collectives reference: at most 4).
_MAX_CHANNELS = 4


@api
def collective_permute_implicit(
    srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None, name=None
) -> None:
    """Each rank sends each channel's source to its successor in its group's ring (the
    group's rank order, the last to the first) and receives its predecessor's into the
    channel's destination (module doc; docs/nki.md, "Collectives across ranks")."""
    c = current()
    c.flush()
    pairs = _pairs(srcs_by_channel, dsts_by_channel)
    group = _group(c, replica_group)
    _channel_ids(channel_ids, len(pairs))
    _priority(priority)
    bits = _bits(c, [s for s, _ in pairs])
    for s, t in pairs:
        c.issue("dma_copy", t.tile, s.tile, None)
    check = _check(("replica_group", replica_group.groups), srcs=[s for s, _ in pairs],
                   arg="srcs_by_channel")  # fmt: skip
    calls = _exchange(c, "collective_permute_implicit", group, bits, check)
    pred = group[(group.index(c.launch.rank) - 1) % len(group)]
    for i, (s, t) in enumerate(pairs):
        c.m.write(t.tile, np.ascontiguousarray(_elements(calls[pred].payload[i], s)).reshape(-1))


def _channel_ids(channel_ids, n: int) -> None:
    ids = list(channel_ids) if isinstance(channel_ids, (list, tuple)) else None
    if ids != list(range(n)) or n > _MAX_CHANNELS:
        raise Trn2ValueError(
            f"channel_ids: consecutive integers from 0, one per channel (at most "
            f"{_MAX_CHANNELS}; the NKI collectives reference), got {channel_ids!r} for "
            f"{n} channels",
            arg="channel_ids",
        )


@api
def collective_permute_implicit_reduce(
    srcs0_by_channel,
    srcs1_by_channel,
    dsts_by_channel,
    replica_group,
    op,
    channel_ids=(0,),
    priority=None,
    name=None,
) -> None:
    """``collective_permute_implicit`` of ``op(srcs0, srcs1)`` per channel: each rank's
    channel destination gets its ring predecessor's two sources reduced (in fp32, rounded
    once: the two-rank ``mesh`` reduction of docs/collectives.md)."""
    c = current()
    c.flush()
    chans = _pairs(srcs0_by_channel, dsts_by_channel, ("srcs1_by_channel", srcs1_by_channel),
                   first="srcs0_by_channel")  # fmt: skip
    group = _group(c, replica_group)
    how = _reduce_op(op)
    _channel_ids(channel_ids, len(chans))
    _priority(priority)
    fmts = [_format("srcs0_by_channel", a) for a, _, _ in chans]
    bits = _bits(c, [x for a, b, _ in chans for x in (a, b)])
    for a, _, t in chans:
        c.issue("dma_copy", t.tile, a.tile, None)
    check = _check(("replica_group", replica_group.groups), ("op", how),
                   srcs=[a for a, _, _ in chans], arg="srcs0_by_channel")  # fmt: skip
    calls = _exchange(c, "collective_permute_implicit_reduce", group, bits, check)
    pred = calls[group[(group.index(c.launch.rank) - 1) % len(group)]].payload
    for i, (a, _, t) in enumerate(chans):
        out = _reduce("all_reduce", how, fmts[i], a.dtype.itemsize, pred[2 * i : 2 * i + 2])
        c.m.write(t.tile, out[0])


@api
def collective_permute_implicit_current_processing_rank_id(
    iteration_id, replica_group, channel_id=0, name=None
) -> VirtualRegister:
    """The rank whose data this rank holds after ``iteration_id`` ring steps of
    ``collective_permute_implicit``: its own at 0, then its predecessors' in turn, in a
    register (the NKI collectives reference)."""
    c = current()
    group = _group(c, replica_group)
    for arg, v in (("iteration_id", iteration_id), ("channel_id", channel_id)):
        if not is_int(v) or v < 0:
            raise Trn2ValueError(f"{arg}: expected a non-negative integer, got {v!r}", arg=arg)
    if channel_id >= _MAX_CHANNELS:
        raise Trn2ValueError(
            f"channel_id: at most {_MAX_CHANNELS} channels (0 to {_MAX_CHANNELS - 1}; the NKI "
            f"collectives reference), got {channel_id}",
            arg="channel_id",
        )
    pos = group.index(c.launch.rank)
    return VirtualRegister(group[(pos - int(iteration_id)) % len(group)])


# ----------------------------------------------------------------------------- variable length
def _v_start(op: str, srcs, dsts, replica_group, priority):
    """What a variable-length collective checks first: this rank's core (its queued work
    issued), its one HBM source and destination, its group and ``priority``."""
    c = current()
    c.flush()
    src, dst = _one_hbm(op, srcs, dsts)
    group = _group(c, replica_group)
    _priority(priority)
    return c, src, dst, group


def _one_hbm(op: str, srcs, dsts) -> tuple[NkiTensor, NkiTensor]:
    """The one HBM source and destination of a variable-length collective (one dtype)."""
    srcs, dsts, _ = _lists(op, srcs, dsts, sbuf=False)
    if len(srcs) != 1:
        raise Trn2ValueError(
            f"srcs: {op} takes exactly one tensor (the NKI collectives reference), got {len(srcs)}",
            arg="srcs",
        )
    return srcs[0], dsts[0]


def _flat(t: NkiTensor, lo: int, hi: int) -> NkiTensor:
    """Elements ``lo`` to ``hi`` of an HBM tensor, flattened."""
    return t.reshape((1, t.size))[0:1, lo:hi]


def _metadata(op: str, meta, n: int, has_rdispls) -> tuple[np.ndarray, NkiTensor]:
    """Rows 0 and 1 of ``metadata_tensor`` (uint32 [rows, n] in HBM, [1, rows, n] in SBUF;
    rows 3, or 4 with ``has_rdispls``), and its row 2 (a view, the received counts)."""
    c = current()
    arg = "metadata_tensor"
    if not isinstance(meta, NkiTensor):
        raise Trn2ValueError(f"{arg}: expected a tensor, got {type(meta).__name__}", arg=arg)
    if has_rdispls:
        raise Trn2ValueError(
            f"has_rdispls: {op} with receive displacements is not supported on Trainium2 (the "
            "NKI collectives reference); chunks land at equal slots",
            arg="has_rdispls",
        )
    if np.dtype(meta.dtype) != np.uint32:
        raise FormatError(
            f"{arg}: a uint32 tensor (the NKI collectives reference), got "
            f"{D.machine_name(meta.dtype)}",
            arg=arg,
        )
    space = meta.buffer.space
    want = (3, n) if space == "hbm" else (1, 3, n)
    if space not in ("hbm", "sbuf") or tuple(meta.shape) != want:
        raise ShapeError(
            f"{arg}: {op} over a group of {n} ranks takes its metadata as uint32 [3, {n}] in "
            f"HBM or [1, 3, {n}] in SBUF (the NKI collectives reference), got "
            f"{tuple(meta.shape)} in {meta.buffer.name}",
            arg=arg,
        )
    rows = meta[0:2, :] if space == "hbm" else meta[:, 0:2, :]
    recv = meta[2:3, :] if space == "hbm" else meta[:, 2:3, :]
    vals = np.asarray(c.m.read(rows.tile)).view(np.uint8).view(np.uint32).reshape(2, n)
    c.issue("dma_copy", rows.tile, rows.tile, None)  # the collective reads its metadata
    return vals.astype(np.int64), recv


def _send(c: Core, src: NkiTensor, chunks, arg: str) -> None:
    """Checks that each (displacement, count) of ``chunks`` lies in ``src`` and records the
    DMA reading it (the bytes sent: the counts are the sender's)."""
    for displ, count in chunks:
        if displ + count > src.size:
            raise Trn2ValueError(
                f"{arg}: a chunk of {count} elements at {displ} of a {src.size}-element source "
                f"(its send count and displacement) leaves the source",
                arg=arg,
            )
        if count:
            part = _flat(src, int(displ), int(displ + count))
            c.issue("dma_copy", part.tile, part.tile, None)


def _land(c: Core, op: str, dst: NkiTensor, n: int, parts, recv, known) -> None:
    """Writes each sender's chunk (``parts``, raw bytes in the group's order) at its equal slot
    of ``dst`` and, unless ``known``, the counts received into ``recv`` (row 2)."""
    if dst.size % n:
        raise ShapeError(
            f"dsts: {op} cuts its destination into {n} equal slots, got {dst.size} elements",
            arg="dsts",
        )
    slot = dst.size // n
    size = dst.dtype.itemsize
    counts = []
    for s, raw in enumerate(parts):
        count = np.asarray(raw).size // size
        if count > slot:
            raise Trn2ValueError(
                f"metadata_tensor: {count} elements from the group's rank {s} exceed the "
                f"destination's slot of {slot} elements",
                arg="metadata_tensor",
            )
        if count:
            c.m.write(_flat(dst, s * slot, s * slot + count).tile, np.asarray(raw).view(np.uint8))
        counts.append(count)
    if not known:
        c.m.write(recv.tile, np.asarray(counts, np.uint32).view(np.uint8))


@api
def all_gather_v(
    srcs,
    dsts,
    replica_group,
    metadata_tensor,
    recv_counts_known=False,
    has_rdispls=False,
    priority=None,
    name=None,
) -> None:
    """Each rank's chunk ``src[send_displ : send_displ + send_count]`` (its metadata's rows 0
    and 1, first column) into every group member's ``dst`` at slot ``j`` (the sender's position;
    slots of ``dst.size / n`` elements); row 2 gets the counts received unless
    ``recv_counts_known`` (the NKI collectives reference: LNC=2, groups of 4 ranks)."""
    c, src, dst, group = _v_start("all_gather_v", srcs, dsts, replica_group, priority)
    if c.launch.lnc != 2:
        raise Trn2ValueError(
            "all_gather_v runs at LNC=2 only (the NKI collectives reference: 'Only LNC=2 is "
            "supported'); launch it over two physical cores (grid=2)",
            rule="lnc2",
        )
    if len(group) != 4:
        raise Trn2ValueError(
            f"replica_group: all_gather_v's groups have exactly 4 ranks (the NKI collectives "
            f"reference: intra-chip), got {len(group)}",
            arg="replica_group",
        )
    meta, recv = _metadata("all_gather_v", metadata_tensor, len(group), has_rdispls)
    count, displ = int(meta[0, 0]), int(meta[1, 0])
    _send(c, src, [(displ, count)] * len(group), "metadata_tensor")
    bits = [np.asarray(c.m.read(_flat(src, displ, displ + count).tile)) if count else b""]
    check = _check(("replica_group", replica_group.groups), srcs=[src])
    calls = _exchange(c, "all_gather_v", group, bits, check)
    parts = [np.frombuffer(bytes(calls[r].payload[0]), np.uint8) for r in group]
    _land(c, "all_gather_v", dst, len(group), parts, recv, recv_counts_known)


@api
def all_to_all_v(
    srcs,
    dsts,
    replica_group,
    metadata_tensor,
    recv_counts_known=False,
    has_rdispls=False,
    priority=None,
    name=None,
) -> None:
    """Each rank sends ``src[send_displs[j] : send_displs[j] + send_counts[j]]`` (its
    metadata's rows 1 and 0, column ``j``) to the group's ``j``-th rank, which places it at
    slot ``i`` (the sender's position; slots of ``dst.size / n`` elements); row 2 gets the
    counts received unless ``recv_counts_known``."""
    c, src, dst, group = _v_start("all_to_all_v", srcs, dsts, replica_group, priority)
    n = len(group)
    meta, recv = _metadata("all_to_all_v", metadata_tensor, n, has_rdispls)
    chunks = [(int(meta[1, j]), int(meta[0, j])) for j in range(n)]
    _send(c, src, chunks, "metadata_tensor")
    bits = [np.asarray(c.m.read(_flat(src, d, d + k).tile)) if k else b"" for d, k in chunks]
    check = _check(("replica_group", replica_group.groups), srcs=[src])
    calls = _exchange(c, "all_to_all_v", group, bits, check)
    me = group.index(c.launch.rank)
    parts = [np.frombuffer(bytes(calls[r].payload[me]), np.uint8) for r in group]
    _land(c, "all_to_all_v", dst, n, parts, recv, recv_counts_known)
