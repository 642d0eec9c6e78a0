"""``nki.collectives``: ``rank_id``, ``ReplicaGroup`` and ``all_gather`` between the ranks of
a multi-rank launch (``trn2core.nki.run(kernel, ..., ranks=N)``; ``_ranks``; docs/nki.md,
"Collectives across ranks"). The other collectives stay ``NotSupportedError``.

``all_gather`` on each rank records one ``dma_copy`` of its source into each slot of its
destination (the bytes the rank receives, the transfer's cost), meets the other ranks with
when the last of them would start, holds it to the latest rank of its group, and writes the
group's sources, concatenated along ``collective_dim`` in the group's rank order, into the
destination bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..errors import ShapeError, Trn2ValueError
from . import _dtypes as D
from ._api import api
from ._index import is_int
from ._lnc2 import _times, _where, one_dtype
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


@api
def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """Each rank's ``srcs[i]`` concatenated along ``collective_dim`` in its group's rank order,
    into every rank's ``dsts[i]`` (module doc)."""
    c = current()
    c.flush()
    srcs, dsts = _tensors("srcs", srcs), _tensors("dsts", dsts)
    if len(srcs) != len(dsts):
        raise Trn2ValueError(
            f"dsts: all_gather needs one destination per source, got {len(srcs)} sources and "
            f"{len(dsts)} destinations",
            arg="dsts",
        )
    group = _group(c, replica_group)
    spaces = {t.buffer.space for t in (*srcs, *dsts)}
    if spaces not in ({"hbm"}, {"sbuf"}):
        raise Trn2ValueError(
            "dsts: all_gather's tensors are all in HBM or all in SBUF (the NKI collectives "
            f"reference), got {' and '.join(sorted(spaces))}",
            arg="dsts",
            rule="collective_memory",
        )
    sbuf = spaces == {"sbuf"}
    if sbuf and len(srcs) > 1:
        raise Trn2ValueError(
            f"srcs: coalesced all_gather ({len(srcs)} tensors) is only supported in HBM (the "
            "NKI collectives reference)",
            arg="srcs",
            rule="collective_memory",
        )
    dims = (0, 1) if sbuf else (0,)
    if not is_int(collective_dim) or collective_dim not in dims:
        raise Trn2ValueError(
            f"collective_dim: all_gather of {'SBUF' if sbuf else 'HBM'} tensors concatenates "
            f"along dimension {' or '.join(map(str, dims))} (the NKI collectives reference), "
            f"got {collective_dim!r}",
            arg="collective_dim",
        )
    d = int(collective_dim)
    n = len(group)
    for s, t in zip(srcs, dsts, strict=True):
        if sbuf and (len(s.shape) != 2 or len(t.shape) != 2):
            raise ShapeError(
                f"srcs: SBUF collectives take 2D tiles (the NKI collectives reference), got "
                f"{tuple(s.shape)} and {tuple(t.shape)}",
                arg="srcs",
            )
        one_dtype("dsts", "all_gather needs a source and its destination", s, t)
        want = tuple(s.shape[:d]) + (s.shape[d] * n,) + tuple(s.shape[d + 1 :])
        if tuple(t.shape) != want:
            raise ShapeError(
                f"dsts: all_gather of a {tuple(s.shape)} source over a group of {n} ranks "
                f"along dimension {d} fills a {want} destination, got {tuple(t.shape)}",
                arg="dsts",
            )
    for s, t in zip(srcs, dsts, strict=True):
        for j in range(n):
            slot = tuple(
                slice(j * s.shape[k], (j + 1) * s.shape[k]) if k == d else slice(None)
                for k in range(len(s.shape))
            )
            c.issue("dma_copy", t[slot].tile, s.tile, None)
    check = (
        ("replica_group", replica_group.groups),
        ("collective_dim", d),
        ("shapes", tuple(tuple(s.shape) for s in srcs)),
        ("dtypes", tuple(D.machine_name(s.dtype) for s in srcs)),
    )
    calls = _exchange(c, "all_gather", group, srcs, check)
    for i, (s, t) in enumerate(zip(srcs, dsts, strict=True)):
        parts = [_elements(calls[r].payload[i], s) for r in group]
        c.m.write(t.tile, np.ascontiguousarray(np.concatenate(parts, axis=d)).reshape(-1))


def _exchange(c: Core, op: str, group: tuple[int, ...], srcs, check) -> list[Call]:
    """Meets every rank with the bits of ``srcs`` and the start of ``c``'s last instruction
    (the transfer just issued); holds that instruction to the latest start in ``group``.
    Returns every rank's call, in rank order."""
    bits = [c.m.read(s.tile) for s in srcs]
    mine = Call(op, _where(), float(_times(c)[0][-1]), bits, check)
    calls = c.launch.group.meet(c.launch.rank, c.index, mine)
    c.m.hold_last(max(calls[r].tick for r in group))
    return calls


def _elements(raw, like: NkiTensor) -> np.ndarray:
    """Raw bytes read from a tile like ``like``, as its elements' bytes [*shape, itemsize]."""
    return np.asarray(raw).view(np.uint8).reshape(*like.shape, like.dtype.itemsize)


def _pairs(srcs_by_channel, dsts_by_channel) -> list[tuple[NkiTensor, NkiTensor]]:
    """Each channel's (source, destination): one tensor each (the NKI collectives reference),
    of one dtype, shape and memory."""
    out = []
    for arg, xs in (("srcs_by_channel", srcs_by_channel), ("dsts_by_channel", dsts_by_channel)):
        if not isinstance(xs, (list, tuple)) or not xs:
            raise Trn2ValueError(f"{arg}: expected a non-empty list of lists, got {xs!r}", arg=arg)
        for inner in xs:
            if _tensors(arg, inner) and len(inner) != 1:
                raise Trn2ValueError(
                    f"{arg}: each channel takes exactly one tensor (coalesced collectives are "
                    f"not supported here, the NKI collectives reference), got {len(inner)}",
                    arg=arg,
                )
    if len(srcs_by_channel) != len(dsts_by_channel):
        raise Trn2ValueError(
            f"dsts_by_channel: {len(dsts_by_channel)} channels for {len(srcs_by_channel)} "
            "source channels",
            arg="dsts_by_channel",
        )
    for (s,), (t,) in zip(srcs_by_channel, dsts_by_channel, strict=True):
        if s.dtype != t.dtype or tuple(s.shape) != tuple(t.shape):
            raise ShapeError(
                "dsts_by_channel: a channel's destination has its source's shape and dtype, got "
                f"{tuple(t.shape)} {D.machine_name(t.dtype)} for {tuple(s.shape)} "
                f"{D.machine_name(s.dtype)}",
                arg="dsts_by_channel",
            )
        if s.buffer.space not in ("hbm", "sbuf") or t.buffer.space != s.buffer.space:
            raise Trn2ValueError(
                "dsts_by_channel: a channel moves HBM to HBM or SBUF to SBUF, got "
                f"{s.buffer.name} to {t.buffer.name}",
                arg="dsts_by_channel",
                rule="collective_memory",
            )
        out.append((s, t))
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
    ids = list(channel_ids) if isinstance(channel_ids, (list, tuple)) else None
    if ids != list(range(len(pairs))) or len(pairs) > _MAX_CHANNELS:
        raise Trn2ValueError(
            f"channel_ids: consecutive integers from 0, one per channel (at most "
            f"{_MAX_CHANNELS}; the NKI collectives reference), got {channel_ids!r} for "
            f"{len(pairs)} channels",
            arg="channel_ids",
        )
    for s, t in pairs:
        c.issue("dma_copy", t.tile, s.tile, None)
    check = (
        ("replica_group", replica_group.groups),
        ("channels", len(pairs)),
        ("shapes", tuple(tuple(s.shape) for s, _ in pairs)),
        ("dtypes", tuple(D.machine_name(s.dtype) for s, _ in pairs)),
    )
    calls = _exchange(c, "collective_permute_implicit", group, [s for s, _ in pairs], check)
    pred = group[(group.index(c.launch.rank) - 1) % len(group)]
    for i, (s, t) in enumerate(pairs):
        c.m.write(t.tile, np.ascontiguousarray(_elements(calls[pred].payload[i], s)).reshape(-1))


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
