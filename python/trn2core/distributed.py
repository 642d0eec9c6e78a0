"""Collectives with the emulated chips spread over MPI processes (contract section 9).

Under ``mpirun -n P python script.py`` (or ``srun``), give a machine the communicator::

    from mpi4py import MPI
    inst = trn2core.Instance("trn2.48xlarge", comm=MPI.COMM_WORLD)
    inst.local_chips                    # the chips this process holds: (0..7) on process 0 of 2
    bufs = [np.full(1 << 20, c, np.float32) for c in inst.local_chips]
    res = inst.all_reduce(bufs)         # res.outputs: this process's chips' results
    res.report                          # the same timing as in one process, plus the emulation's

Each process passes and receives only its own chips' buffers; every output has the bits of the
single-process run. By default process ``p`` of ``P`` holds chips ``p N/P .. (p+1) N/P - 1``
(``P`` must divide the ``N`` chips); ``placement=[process of chip 0, ...]`` overrides it.
See docs/distributed.md.

Faults: making a machine with ``comm=`` agrees on the machine and its whole placement, and
every call first agrees on what is called (collective, algorithm, op, dtype, shape, chips,
placement) with a small all-gather, so a refused placement, a wrong buffer or a mismatched call
on one process raises the same ``Trn2Error`` on every process. Any error after that point (a
process out of memory, an MPI failure) prints the error, prefixed by the process, and aborts
the whole MPI job (``MPI.COMM_WORLD.Abort``): the other processes would otherwise wait for it
forever. A machine made with ``comm=`` also makes an uncaught exception abort the job, as
``python -m mpi4py`` does.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
import zlib
from typing import Any

import numpy as np

from . import _core, _validate, errors
from . import collectives as _coll
from ._names import ALGORITHMS, COLLECTIVES, FORMATS, REDUCE_OPS
from .collectives import CollectiveReport, CollectiveResult
from .dtypes import FORMAT_DTYPES, format_of_dtype
from .errors import ShapeError, Trn2ValueError
from .report import _fmt_seconds

__all__ = ["DistributedReport", "DistributedResult", "abort_on_exception"]

#: Bytes MPI moves in one send or receive (a message longer than this is cut into pieces: MPI
#: counts are C ints).
MAX_PIECE = 1 << 30

_MAGIC = 0x74726E32  # "trn2"
_FIELDS = 17
_TEXT = 1024
_HEADER = _FIELDS * 8 + _TEXT
#: Header field 15 holds a format's index in FORMATS, or this plus the bytes per element.
_BYTES_CODE = 1 << 20
_ERRORS = ("Trn2Error", "ShapeError", "FormatError", "Trn2ValueError", "CapacityError")


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class DistributedReport(CollectiveReport):
    """A ``CollectiveReport`` (the model's timing, identical to the single-process run's) plus
    what the emulation itself did: ``processes``, ``emulation_wall_s`` (this process's wall
    time for the call), ``exchanged_bytes`` (bytes every process together sent to others: the
    least this algorithm's order of combination needs, each piece padded to whole 4-byte
    words so that fp32 partial sums stay aligned), ``schedule_bytes`` (what the
    schedule's own transfers would move between processes if executed step by step),
    ``sent_bytes`` and ``received_bytes`` (this process's), ``rounds`` of exchange."""

    processes: int = 1
    emulation_wall_s: float = 0.0
    exchanged_bytes: int = 0
    schedule_bytes: int = 0
    sent_bytes: int = 0
    received_bytes: int = 0
    rounds: int = 0

    def timing(self) -> CollectiveReport:
        """The model's part alone (equal to the single-process report)."""
        names = {f.name for f in dataclasses.fields(CollectiveReport)}
        kw = {k: getattr(self, k) for k in names}
        return CollectiveReport(**kw)

    def __repr__(self) -> str:
        return (
            f"DistributedReport({self.collective!r}, algorithm={self.algorithm!r}, "
            f"seconds={self.seconds:.6g}, processes={self.processes}, "
            f"exchanged_bytes={self.exchanged_bytes})"
        )

    def _rows(self) -> list[tuple[str, str]]:
        return super()._rows() + [
            ("emulated on", f"{self.processes} processes, {_fmt_seconds(self.emulation_wall_s)}"),
            (
                "between processes",
                f"{_human(self.exchanged_bytes)} in {self.rounds} rounds (the schedule's own "
                f"transfers: {_human(self.schedule_bytes)}); this process sent "
                f"{_human(self.sent_bytes)}, received {_human(self.received_bytes)}",
            ),
        ]


def _human(n: int) -> str:
    return _validate.human_bytes(n, exact=False)


@dataclasses.dataclass(frozen=True, repr=False)
class DistributedResult(CollectiveResult):
    """``outputs``: the results of this process's ranks, in rank order; ``ranks`` and ``chips``:
    which they are; ``report``: a ``DistributedReport``."""

    ranks: tuple[int, ...] = ()
    chips: tuple[int, ...] = ()


class Spread:
    """The processes a machine's chips are spread over (made by the machine from ``comm=``).

    Making one is itself a collective step over ``comm``: every process checks its own
    ``placement``, then the processes agree (over the machine's channel) on the machine and the
    whole placement, so a placement refused on one process, or two processes placing the chips
    differently, raise the same ``Trn2Error`` on every process instead of leaving the others
    waiting in the first collective."""

    def __init__(self, chips: int, comm, placement, machine: str) -> None:
        methods = "Get_size Get_rank Dup Allgather Isend Irecv Get_attr Set_attr".split()
        for method in methods:
            if not hasattr(comm, method):
                raise Trn2ValueError(
                    f"comm: expected an mpi4py communicator such as MPI.COMM_WORLD, got "
                    f"{_validate._show(comm)}"
                )
        self.procs = int(comm.Get_size())
        self.process = int(comm.Get_rank())
        self.explicit = placement is not None
        self.placement: tuple[int, ...] = ()
        error = None
        try:
            if placement is not None:
                if not _coll._is_sequence(placement):
                    raise Trn2ValueError(
                        f"placement: expected the process of every chip (a list of {chips} "
                        f"integers), got {_validate._show(placement)}"
                    )
                placement = [
                    _validate.integer(p, "placement", lo=0, hi=_validate.U64_MAX) for p in placement
                ]
            self.placement = tuple(_core.placement(chips, self.procs, placement))
        except Exception as e:  # agreed on below, then raised on every process
            error = e
        # Every process reaches the channel's (collective) Dup and the agreement, refused or not.
        self.channel = _channel(comm)
        self.comm = self.channel.comm
        self.agree({"collective": "making", "machine": machine, "placement": self.placement}, error)
        abort_on_exception(comm)

    def local_ranks(self, chips) -> list[int]:
        group = range(len(self.placement)) if chips is None else chips
        return [r for r, c in enumerate(group) if self.placement[c] == self.process]

    # ------------------------------------------------------------------------------- agreement

    def agree(self, what: dict[str, Any], error: BaseException | None) -> np.ndarray:
        """Every process's header (after an all-gather of a fixed-size header, one row per
        process: see :func:`_size_from`); raises the same ``Trn2Error`` on every process when
        one of them failed its checks (``error``) or the calls differ."""
        if self.channel.freed:  # comm.Free() is collective: every process raises this
            raise Trn2ValueError(
                "comm: the communicator this machine was made with has been freed (comm.Free()); "
                "make a machine with a live communicator"
            )
        self.channel.calls += 1
        fields = np.full(_FIELDS, -1, np.int64)
        fields[0], fields[1] = _MAGIC, self.channel.calls
        keys = ("collective", "algorithm", "op", "chips", "peers", "machine")
        for i, k in enumerate(keys[:5]):
            fields[2 + i] = zlib.crc32(repr(what.get(k)).encode())
        fields[13] = zlib.crc32(repr(what.get("machine")).encode())
        fields[16] = zlib.crc32(repr(what.get("placement")).encode())
        fmt = what.get("format")
        if error is None and fmt is not None:  # for a process that holds none of the chips
            fields[14] = what["elements"]
            fields[15] = FORMATS.index(fmt) if isinstance(fmt, str) else _BYTES_CODE + fmt
        for i, k in enumerate(("dtype", "shape", "elements", "format")):
            if what.get(k) is not None:
                fields[7 + i] = zlib.crc32(repr(what[k]).encode())
        if error is not None:
            fields[11] = 1
            name = type(error).__name__
            fields[12] = _ERRORS.index(name) if name in _ERRORS else 0
            text = f"{name}: {error}" if name not in _ERRORS else str(error)
        else:
            fields[11] = 0
            text = _describe(what)
        data = text.encode()[:_TEXT]
        send = np.zeros(_HEADER, np.uint8)
        send[: _FIELDS * 8] = fields.view(np.uint8)
        send[_FIELDS * 8 : _FIELDS * 8 + len(data)] = np.frombuffer(data, np.uint8)
        recv = np.empty(self.procs * _HEADER, np.uint8)
        self.comm.Allgather(send, recv)
        rows = recv.reshape(self.procs, _HEADER)
        heads = rows[:, : _FIELDS * 8].copy().view(np.int64)
        texts = [bytes(r[_FIELDS * 8 :]).rstrip(b"\0").decode(errors="replace") for r in rows]
        for p in range(self.procs):
            if heads[p, 0] != _MAGIC:
                raise Trn2ValueError(
                    f"process {p} sent something else than a trn2core collective call: the "
                    "processes do not run the same program"
                )
        failed = [p for p in range(self.procs) if heads[p, 11] == 1]
        if failed:
            if error is not None:  # this process's own error (every process may share it)
                raise error
            p = failed[0]
            cls = getattr(errors, _ERRORS[int(heads[p, 12])])
            raise cls(f"process {p} of {self.procs}: {texts[p]}")
        mine = heads[self.process]
        for p in range(self.procs):
            other = heads[p]
            same = (
                other[1] == mine[1]
                and all(other[2:7] == mine[2:7])
                and other[13] == mine[13]
                and other[16] == mine[16]
            )
            for j in range(7, 11):
                if other[j] >= 0 and mine[j] >= 0:
                    same = same and other[j] == mine[j]
            if not same:
                raise Trn2ValueError(
                    f"mismatched collective calls: process {self.process} of {self.procs} "
                    f"makes call #{mine[1]}: {texts[self.process]}; process {p} makes call "
                    f"#{other[1]}: {texts[p]}. Every process must make the same collective "
                    "calls in the same order"
                )
        return heads

    # -------------------------------------------------------------------------------- messages

    def exchange(self, round_: int, sends, recvs) -> None:
        """One round's messages (lists of ``(peer, memoryview)``), non-blocking sends and
        receives of numpy views of them; any failure aborts the job (the other processes wait
        for these messages)."""
        try:
            _move(self.comm, round_, sends, recvs)
        except BaseException as e:  # every failure here ends the job
            self.abort(e)

    def abort(self, e: BaseException) -> None:
        """Prints ``e`` as coming from this process and aborts the MPI job."""
        _abort(self.comm, e, self.process, self.procs)


class _Channel:
    """The communicator every machine made with one ``comm`` shares (a duplicate of it, so
    trn2core's messages never meet the user's), and the count of calls made over it: a call on
    one machine meeting a call on another is then a mismatch the agreement reports, not two
    processes waiting on different communicators."""

    def __init__(self, comm) -> None:
        self.comm = comm.Dup()
        self.calls = 0
        self.freed = False

    def free(self) -> None:
        """Frees the duplicate (when the user's communicator is freed: every process does)."""
        if not self.freed:
            self.freed = True
            self.comm.Free()


#: The MPI attribute key under which a communicator holds its channel (made on first use).
_KEYVAL: int | None = None


def _delete_channel(comm, keyval, channel: _Channel) -> None:
    """MPI's delete callback for ``_KEYVAL``: the user's communicator is being freed (or MPI
    finalized), so its duplicate goes with it."""
    from mpi4py import MPI

    if not MPI.Is_finalized():
        channel.free()


def _channel(comm) -> _Channel:
    """The channel of ``comm`` (made, with a collective ``Dup``, by its first machine).

    It is cached on the communicator itself, as an MPI attribute (not in a table keyed by the
    communicator's handle, which MPI reuses once a communicator is freed: a new communicator
    would then get a freed one's duplicate, its processes and its calls). The attribute is not
    copied by ``comm.Dup()`` (a duplicate is another communicator: it gets its own channel), and
    its delete callback frees the duplicate when ``comm`` is freed."""
    global _KEYVAL
    from mpi4py import MPI

    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete_channel)
    channel = comm.Get_attr(_KEYVAL)
    if channel is None:
        channel = _Channel(comm)
        comm.Set_attr(_KEYVAL, channel)
    return channel


def _move(comm, round_: int, sends, recvs) -> None:
    from mpi4py import MPI

    reqs = []
    for peer, view in recvs:
        buf = np.frombuffer(view, np.uint8)
        for s in range(0, max(1, buf.size), MAX_PIECE):
            reqs.append(comm.Irecv(buf[s : s + MAX_PIECE], source=peer, tag=round_))
    for peer, view in sends:
        buf = np.frombuffer(view, np.uint8)
        for s in range(0, max(1, buf.size), MAX_PIECE):
            reqs.append(comm.Isend(buf[s : s + MAX_PIECE], dest=peer, tag=round_))
    MPI.Request.Waitall(reqs)


#: Seconds a failing process waits between printing its error and aborting the job: the
#: launcher forwards each process's output asynchronously, and an abort can cut it off.
_DRAIN_S = 0.25


def _print_and_abort(comm, head: str, e: BaseException) -> None:
    """Prints ``head`` and ``e``'s traceback in one write, then aborts the MPI job."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    sys.stderr.write(f"{head}\n{text}")
    sys.stderr.flush()
    time.sleep(_DRAIN_S)
    comm.Abort(1)


def _abort(comm, e: BaseException, process: int, procs: int) -> None:
    _print_and_abort(comm, f"trn2core: process {process} of {procs} failed; aborting the job", e)


def _describe(what: dict[str, Any]) -> str:
    if what["collective"] == "making":  # a machine made with comm=: its whole placement
        return f"making {what['machine']} placement={list(what['placement'])}"
    parts = [f"{what['collective']} on {what['machine']}"]
    for k in ("op", "algorithm", "dtype", "shape", "elements", "format", "chips", "peers"):
        if what.get(k) is not None:
            parts.append(f"{k}={what[k]}")
    return " ".join(parts)


_HOOKED = False


def abort_on_exception(comm=None) -> None:
    """Makes an uncaught exception print its traceback (prefixed by the process) and abort
    the MPI job, as ``python -m mpi4py`` does, so one failing process never leaves the others
    waiting. Machines made with ``comm=`` call it; it keeps an excepthook someone else set."""
    global _HOOKED
    if _HOOKED or sys.excepthook is not sys.__excepthook__:
        return
    from mpi4py import MPI

    world = MPI.COMM_WORLD

    def hook(kind, value, tb) -> None:
        head = (
            f"trn2core: uncaught exception in process {world.Get_rank()} of "
            f"{world.Get_size()}; aborting the MPI job"
        )
        _print_and_abort(world, head, value.with_traceback(tb))

    sys.excepthook = hook
    _HOOKED = True


# ------------------------------------------------------------------------------------ the calls


def _local_buffers(buffers, n_local: int, chips_local: list[int]):
    if not _coll._is_sequence(buffers):
        raise ShapeError(
            f"buffers: expected a sequence of {n_local} arrays (one per chip this process "
            f"holds: {chips_local}), got {type(buffers).__name__} {_validate._show(buffers)}"
        )
    if len(buffers) != n_local:
        raise ShapeError(
            f"buffers: got {len(buffers)} buffers; this process holds {n_local} of the "
            f"collective's chips ({chips_local}): pass one buffer per chip it holds"
        )
    if n_local == 0:
        return [], None, None
    return _coll._buffers(buffers, n_local)


def _call(machine, collective: str, buffers, chips, *, op=None, algorithm="auto", peers=None):
    """Shared by the five collectives: local checks, the agreement, then one crossing into
    the core with the exchange as a callback."""
    start = time.perf_counter()
    sp: Spread = machine._spread
    n = machine._ranks(chips)
    local = sp.local_ranks(chips)
    group_chips = list(range(n)) if chips is None else chips
    local_chips = [group_chips[r] for r in local]
    what: dict[str, Any] = {
        "collective": collective,
        "op": op,
        "algorithm": algorithm,
        "chips": chips,
        "peers": peers,
        "machine": _machine(machine.name, machine.topology.size),
        "placement": sp.placement,
    }
    error = None
    arrays: list[np.ndarray] = []
    shape = dtype = fmt = None
    try:
        _coll._check_choice(collective, COLLECTIVES, "collective")
        _coll._check_choice(algorithm, ALGORITHMS, "algorithm")
        if op is not None:
            _coll._check_choice(op, REDUCE_OPS, "op")
        if peers is not None:
            peers = _coll._peers(peers, n)
            what["peers"] = peers
        arrays, shape, dtype = _local_buffers(buffers, len(local), local_chips)
        if dtype is not None:
            what["dtype"], what["shape"] = dtype.newbyteorder("=").name, shape
            what["elements"] = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if op is not None:
                fmt = format_of_dtype(
                    dtype.newbyteorder("="),
                    "buffers",
                    advice=f"{collective} reduces in fp32 on Trainium2; convert integers or "
                    "float64 with astype(np.float32) first",
                )
                what["format"] = fmt
            else:
                what["format"] = max(1, dtype.itemsize)
            _coll._check_host(arrays, _out_bytes(collective, n, len(local), what), collective)
            # What the schedule refuses (an algorithm the machine lacks, peers that are no
            # permutation) is refused here, before any message, on every process alike.
            _core.collective_estimate(
                machine.topology._t,
                chips,
                collective,
                algorithm,
                what["elements"],
                _itemsize(what["format"]),
                peers,
                False,
            )
    except Exception as e:  # shared with every process, then raised
        error = e
    heads = sp.agree(what, error)
    if what.get("elements") is None:
        # This process holds none of the chips: take the size from one that does.
        what.update(_size_from(heads))
    try:
        exchange = sp.exchange
        t = machine.topology._t
        if op is not None:
            code = _coll._CODE_DTYPE[FORMATS_ITEMSIZE[what["format"]]]
            flats = _coll._native_contiguous(arrays, code)
            outs, fields, traffic = _core.collective_reduce_local(
                t,
                chips,
                collective,
                op,
                algorithm,
                what["format"],
                sp.procs,
                sp.process,
                list(sp.placement),
                what["elements"],
                flats,
                exchange,
            )
            itemsize = FORMATS_ITEMSIZE[what["format"]]
        else:
            itemsize = what["format"]
            flats = _coll._native_contiguous(arrays, np.uint8)
            outs, fields, traffic = _core.collective_move_local(
                t,
                chips,
                collective,
                algorithm,
                itemsize,
                sp.procs,
                sp.process,
                list(sp.placement),
                what["elements"],
                flats,
                peers,
                exchange,
            )
    except BaseException as e:  # the others wait for this process: end the job
        sp.abort(e)
        raise
    results = []
    if dtype is not None:
        dtype = dtype.newbyteorder("=")
        for o in outs:
            o = o.view(dtype)
            if collective == "all_reduce" or collective == "send_recv":
                o = o.reshape(shape)
            elif collective == "reduce_scatter":
                o = o.reshape(_coll._share_shape(shape, n) or (-1,))
            elif collective == "all_gather":
                o = o.reshape((n, *shape))
            else:
                o = o.reshape(shape if _coll._share_shape(shape, n) else (-1,))
            results.append(o)
    elements = what["elements"]

    def retrace() -> str:
        return _core.collective_estimate(
            t, chips, collective, algorithm, elements, itemsize, peers, True
        )[1]

    wall = time.perf_counter() - start
    report = DistributedReport.from_fields(
        fields,
        retrace=retrace,
        processes=sp.procs,
        emulation_wall_s=wall,
        exchanged_bytes=traffic.exchanged_bytes,
        schedule_bytes=traffic.schedule_bytes,
        sent_bytes=traffic.sent_bytes,
        received_bytes=traffic.received_bytes,
        rounds=traffic.rounds,
    )
    return DistributedResult(results, report, ranks=tuple(local), chips=tuple(local_chips))


def _itemsize(format_or_bytes: str | int) -> int:
    """Bytes per element: of a format's name (reductions) or given (data movement)."""
    if isinstance(format_or_bytes, str):
        return FORMATS_ITEMSIZE[format_or_bytes]
    return format_or_bytes


def _out_bytes(collective: str, n: int, n_local: int, what: dict) -> int:
    per = what["elements"] * _itemsize(what["format"])
    share = {"all_reduce": n_local, "reduce_scatter": n_local / n, "all_gather": n_local * n}
    return int(share.get(collective, n_local) * per)


def _size_from(heads: np.ndarray) -> dict:
    """The element count and format of the buffers (a format's name, or bytes per element
    for data movement), from the header of a process that holds some: fields 14 and 15."""
    for head in heads:
        if head[14] >= 0:
            code = int(head[15])
            fmt = FORMATS[code] if code < _BYTES_CODE else code - _BYTES_CODE
            return {"elements": int(head[14]), "format": fmt}
    raise Trn2ValueError("buffers: no process passes any buffer to this collective")


#: Bytes of one element of each format.
FORMATS_ITEMSIZE: dict[str, int] = {f: FORMAT_DTYPES[f].itemsize for f in FORMATS}


def run_reduce(machine, collective: str, buffers, op: str, algorithm: str, chips):
    """All-reduce or reduce-scatter of this process's chips' buffers (see ``Machine``)."""
    return _call(machine, collective, buffers, chips, op=op, algorithm=algorithm)


def run_move(machine, collective: str, buffers, algorithm: str, chips, peers=None):
    """All-gather, all-to-all or send/recv of this process's chips' buffers."""
    return _call(machine, collective, buffers, chips, algorithm=algorithm, peers=peers)


def _machine(name: str, chips: int) -> str:
    """How the agreement names a machine (its hash is compared, its text shown)."""
    return f"{name} ({chips} chips)"


def spread(chips: int, comm, placement, name: str = "") -> Spread | None:
    """The machine's processes for ``comm`` (None: one process)."""
    if comm is None:
        if placement is not None:
            raise Trn2ValueError("placement: only with comm= (the chips of one process)")
        return None
    return Spread(chips, comm, placement, _machine(name, chips))
