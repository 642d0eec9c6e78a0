"""``nisa.sendrecv`` and ``nisa.core_barrier``: the two physical cores of an LNC=2 launch
meeting mid-kernel (``_rendezvous`` matches the calls; docs/nki.md, "LNC=2 exchanges").

Each side records its own instruction on its own machine (``sendrecv``: a ``dma_copy`` of
``src`` into ``dst``, the transfer's cost; ``core_barrier``: the machine's ``core_barrier`` on
the tensor), reads when that instruction would start on its timeline, and meets the other side
with that time and what the other side needs (the bits it sends; the bytes of the shared tensor
it wrote). Both then hold their instruction to the later of the two times
(``Machine.hold_last``), so both clocks go on from there, and take the other side's data: the
received bits into ``dst`` (bit for bit), the other core's writes into this core's copy of the
shared tensor.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, ShapeError, Trn2ValueError
from . import _dtypes as D
from ._api import user_location
from ._rendezvous import Call, RendezvousError, shown
from ._runtime import Core, WrittenBytes
from ._tensor import HBM, PRIVATE_HBM, SBUF, SHARED_HBM, NkiTensor

#: ``dma_engine=gpsimd_dma``'s documented limit: bytes per partition by element size.
_GPSIMD_DMA_BYTES = {4: 1024, 2: 512, 1: 256}


def _lnc2(op: str, c: Core) -> None:
    if c.launch.lnc != 2:
        raise Trn2ValueError(
            f"nki.isa.{op} runs between the two physical cores of a logical core (LNC=2, the "
            "NKI ISA reference: 'only allowed ... when LNC is enabled'); this launch runs on "
            "one physical core: launch it over nl.spmd_dim(n, nl.nc(2))",
            rule="lnc2",
        )


def _times(c: Core) -> tuple[np.ndarray, np.ndarray]:
    """When each instruction recorded so far starts and ends on ``c``'s timeline (seconds)."""
    r = c.m.run(0).times()
    return np.asarray(r["start"]), np.asarray(r["end"])


def one_dtype(arg: str, what: str, a: NkiTensor, b: NkiTensor) -> None:
    """A ``FormatError`` naming ``arg`` unless ``a`` and ``b`` have one dtype (``what``: who
    needs that, e.g. "sendrecv needs src and dst")."""
    if a.dtype != b.dtype:
        raise FormatError(
            f"{arg}: {what} of one dtype, got {D.machine_name(a.dtype)} and "
            f"{D.machine_name(b.dtype)}",
            arg=arg,
        )


def _where() -> str:
    file, line = user_location()
    return f"{file}:{line}"


def _meet(c: Core, op: str, payload, check, times=None) -> Call:
    """Meets the other core with ``c``'s last instruction's start time (from ``times``, the
    timeline's, scheduled here when not given); holds it to the later of the two. ``check``
    must be equal on both sides."""
    where = _where()
    mine = Call(op, where, float((times or _times(c))[0][-1]), payload, check)
    other = c.launch.rendezvous(c).meet(c.index, mine)
    if other.check != check:
        raise RendezvousError(
            f"{op} on physical core {c.index} ({shown(check)}) does not match its call at "
            f"{other.where} on physical core {1 - c.index} ({shown(other.check)})"
        )
    c.m.hold_last(max(mine.tick, other.tick))
    return other


def sendrecv(c: Core, src, dst, send_to_rank, recv_from_rank, pipe_id, gpsimd: bool) -> None:
    """``nisa.sendrecv`` on core ``c`` (see the module doc)."""
    _lnc2("sendrecv", c)
    for arg, t in (("src", src), ("dst", dst)):
        if not isinstance(t, NkiTensor):
            raise Trn2ValueError(f"{arg}: expected a tensor, got {type(t).__name__}", arg=arg)
        if t.buffer is not SBUF:
            raise Trn2ValueError(
                f"{arg}: sendrecv moves SBUF tiles (the NKI ISA reference), got a tile in "
                f"{t.buffer.name}",
                arg=arg,
                rule="sendrecv_memory",
            )
    one_dtype("dst", "sendrecv needs src and dst", src, dst)
    if tuple(src.shape) != tuple(dst.shape):
        raise ShapeError(
            f"dst: sendrecv needs src and dst of one shape, got {tuple(src.shape)} and "
            f"{tuple(dst.shape)}",
            arg="dst",
        )
    peer = 1 - c.index
    for arg, rank in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank != peer:
            raise Trn2ValueError(
                f"{arg}: physical core {c.index} of an LNC=2 launch exchanges with core "
                f"{peer} only, got {rank!r}",
                arg=arg,
            )
    if gpsimd:
        es = src.dtype.itemsize
        per = int(np.prod(src.shape[1:], dtype=np.int64)) * es
        if per > _GPSIMD_DMA_BYTES.get(es, 1024):
            raise ShapeError(
                f"src: dma_engine=gpsimd_dma moves at most {_GPSIMD_DMA_BYTES.get(es, 1024)} "
                f"bytes per partition of {8 * es}-bit elements (the NKI ISA reference), got "
                f"{per}",
                arg="src",
            )
    bits = c.m.read(src.tile)
    c.issue("dma_copy", dst.tile, src.tile, None)
    check = (
        ("pipe_id", pipe_id),
        ("shape", tuple(src.shape)),
        ("dtype", D.machine_name(src.dtype)),
    )
    other = _meet(c, "sendrecv", bits, check)
    c.m.write(dst.tile, other.payload)


def core_barrier(c: Core, data, cores, engine: str) -> None:
    """``nisa.core_barrier`` on core ``c`` (see the module doc)."""
    _lnc2("core_barrier", c)
    if tuple(cores) != (0, 1):
        raise Trn2ValueError(
            f"cores: only (0, 1) is supported with LNC=2 (the NKI ISA reference), got {cores!r}",
            arg="cores",
        )
    # The NKI ISA reference asks for shared HBM; nki-library's hybrid moe_cte (a Trainium2
    # kernel) barriers on an SBUF counter, so SBUF is accepted too (each core's own: nothing
    # merges; the barrier still orders both cores). docs/nki.md, "Inferred, not documented".
    if not isinstance(data, NkiTensor) or data.buffer not in (SHARED_HBM, HBM, PRIVATE_HBM, SBUF):
        got = data.buffer.name if isinstance(data, NkiTensor) else type(data).__name__
        raise Trn2ValueError(
            "data: core_barrier synchronises on a tensor in HBM (shared HBM, the NKI ISA "
            f"reference) or SBUF (nki-library's kernels), got {got}",
            arg="data",
            rule="core_barrier_data",
        )
    c.issue("core_barrier", engine, data.tile)
    j = data._shared
    store = c.launch.shared[c.index][j] if j is not None else None
    times = _times(c)
    mine = c.written_bytes(store, times) if store is not None else None
    other = _meet(c, "core_barrier", mine, (("shared tensor", j),), times)
    if store is not None:
        c.write_parts(store, _later_parts(mine, other.payload, store.dtype.itemsize))


def _later_parts(
    mine: WrittenBytes, other: WrittenBytes, itemsize: int
) -> list[tuple[int, int, np.ndarray]]:
    """The byte runs of the other core's copy of a shared tensor that this core takes at a
    barrier: those it wrote that this core did not, or wrote later (the chip's later write
    wins; ``later_wins``). Where neither write can be ordered, this core keeps its own and the
    launch's merge reports the race."""
    take = other.seen & ~mine.seen
    differ = np.flatnonzero(other.seen & mine.seen & (mine.vals != other.vals))
    if differ.size:
        (_, m_end), (o_start, o_end) = mine.when(differ), other.when(differ)
        ta, tb = ~np.isnan(m_end), ~np.isnan(o_end)
        take[differ[tb & (~ta | (m_end <= o_start))]] = True
    # Whole elements (``write_parts`` writes elements): an element's bytes are written together.
    take = np.repeat(take.reshape(-1, itemsize).any(axis=1), itemsize)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], take.view(np.int8), [0]))))
    return [
        (int(lo), int(hi), other.vals[lo:hi])
        for lo, hi in zip(edges[::2], edges[1::2], strict=True)
    ]
