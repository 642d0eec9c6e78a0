"""Collectives over the chips of an instance, UltraServer or UltraCluster (contract section 5).

The machines in ``trn2core.topology`` call into here; users call their methods
(``inst.all_reduce(buffers)``) or ``machine.estimate(...)`` for timing without data. Every
algorithm is one schedule of chunk transfers and reductions, executed on the buffers by the Rust
core for the bits and costed over the links for the time (see docs/collectives.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core, _validate
from ._names import ALGORITHMS, COLLECTIVES, REDUCE_OPS
from .dtypes import FORMAT_DTYPES, format_name, format_of_dtype
from .errors import CapacityError, ShapeError, Trn2ValueError
from .report import Result, TimingReport, _fmt_seconds, _fmt_time, _Trace, core_fields

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "REDUCE_OPS",
    "CollectiveReport",
    "CollectiveResult",
]

_CODE_DTYPE = {4: np.float32, 2: np.uint16, 1: np.uint8}

# The getters of the core's collective classes, in the order of the facade's dicts.
_FIELDS: dict[type, str] = {
    _core.CollectiveReport: "collective algorithm op ranks logical_ranks elements elem_bytes "
    "size_bytes seconds algbw busbw bus_factor chip_link_capacity max_link_utilization "
    "network_bytes channels bound description op_fixed_s phases uncertainty link_bytes "
    "link_bandwidth",
    _core.PhaseTiming: "name steps seconds step_s latency_s link_s hbm_s reduce_s reduce_steps "
    "sync_s start_s efa max_hops bound busiest_link busiest_link_step_bytes",
    _core.NccomRow: "size_bytes count seconds algbw busbw algorithm intra_chip_s intra_chip_bytes "
    "chips op_fixed_s phases uncertainty",
}


def _plain(value: Any) -> Any:
    """A collective report, nccom-test row or phase of the core (or a list of them) as the
    facade's dicts: its getters in ``_FIELDS`` order, nested ones likewise (an uncertainty as
    ``core_fields`` makes it); anything else as it is."""
    if type(value) in _FIELDS:
        return {k: _plain(getattr(value, k)) for k in _FIELDS[type(value)].split()}
    return [_plain(v) for v in value] if isinstance(value, list) else core_fields(value)


@dataclasses.dataclass(frozen=True, repr=False)
class CollectiveReport(TimingReport):
    """Timing of a collective. Fields: ``seconds``, ``algbw`` and ``busbw`` (bytes/s;
    ``busbw = algbw x`` the collective's bus factor for ``logical_ranks`` ranks, as in
    nccom-test: a rank is a Logical NeuronCore, 8 / LNC per chip), ``algorithm`` (after
    ``auto``), ``collective``, ``op`` (the reduction, or None), ``chips`` (the chips taking
    part: a machine's collectives have one buffer per chip; ``ranks`` is an old alias of it,
    while "rank" elsewhere, as in nccom-test, means a logical NeuronCore), ``elements`` and
    ``elem_bytes`` (of one chip's input), ``size_bytes`` (nccom-test's ``size(B)``),
    ``chip_link_capacity`` (what one chip's links can send at once, bytes/s), ``bound``
    (``latency``, ``link``, ``efa``, ``hbm`` or ``reduce``), ``max_link_utilization`` (at most 1),
    ``network_bytes``, ``channels``, ``phases`` (a list of dicts: steps, seconds and what bounds
    each step), ``link_bytes`` (``{"3->7 Y+": bytes}``: the bytes moved over every used link,
    one direction each), ``link_bandwidth`` (the same links' bandwidths), ``op_fixed_s`` (the
    runtime's fixed cost of the operation, included in ``seconds``), ``uncertainty`` (how far the
    published collective measurements were from the model: see ``Report``) and ``details``."""

    collective: str
    algorithm: str
    op: str | None
    chips: int
    elements: int
    elem_bytes: int
    size_bytes: float
    seconds: float
    algbw: float
    busbw: float
    bus_factor: float
    chip_link_capacity: float
    max_link_utilization: float
    network_bytes: float
    channels: int
    bound: str
    description: str
    op_fixed_s: float
    phases: list
    link_bytes: Mapping[str, float]
    link_bandwidth: Mapping[str, float]
    details: Mapping[str, float]
    uncertainty: Mapping[str, Any] | None = None
    logical_ranks: int = 0
    _trace: _Trace = dataclasses.field(
        default_factory=lambda: _Trace(None, None), compare=False, repr=False
    )

    @classmethod
    def from_fields(cls, fields, trace_json=None, retrace=None, **extra):
        """As ``TimingReport.from_fields``, from the core's report or its fields; the core's
        ``ranks`` (one per chip) become ``chips``; ``details`` is empty."""
        fields = {"details": {}, **_plain(fields)}
        if "ranks" in fields:
            fields.setdefault("chips", fields.pop("ranks"))
        return super().from_fields(fields, trace_json, retrace, **extra)

    @property
    def ranks(self) -> int:
        """Old name of ``chips`` (kept so code written against it still runs)."""
        return self.chips

    def __str__(self) -> str:
        rows = self._rows()
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)

    def _rows(self) -> list[tuple[str, str]]:
        """The report's lines as (label, text)."""
        rows = [
            ("what", self.description),
            ("algorithm", self.algorithm),
            ("time", _fmt_time(self.seconds, self.uncertainty)),
            ("runtime fixed cost", _fmt_seconds(self.op_fixed_s)),
            ("algbw", f"{self.algbw / 1e9:.2f} GB/s"),
            (
                "busbw",
                f"{self.busbw / 1e9:.2f} GB/s (x{self.bus_factor:.3f}, "
                f"nccom-test's factor for {self.logical_ranks} logical cores)",
            ),
            ("chip link capacity", f"{self.chip_link_capacity / 1e9:.0f} GB/s out of each chip"),
            ("bound", self.bound),
            ("busiest link use", f"{100 * self.max_link_utilization:.1f}% in its busiest step"),
            ("links used", f"{len(self.link_bytes)}"),
        ]
        for p in self.phases:
            sync = ""
            if p["reduce_steps"]:
                per = p["sync_s"] / p["reduce_steps"]
                sync = f" + {p['reduce_steps']} reducing steps x {_fmt_seconds(per)}"
            rows.append(
                (
                    f"  {p['name']}",
                    f"{p['steps']} x {_fmt_seconds(p['step_s'])}{sync} = "
                    f"{_fmt_seconds(p['seconds'])} ({p['bound']}, max {p['max_hops']} hops)",
                )
            )
        return rows

    def __repr__(self) -> str:
        return (
            f"CollectiveReport({self.collective!r}, algorithm={self.algorithm!r}, "
            f"seconds={self.seconds:.6g}, busbw={self.busbw / 1e9:.4g} GB/s)"
        )


@dataclasses.dataclass(frozen=True, repr=False)
class CollectiveResult(Result):
    """``outputs``: one array per chip, in the order of the machine's chips (or of
    ``chips=[...]``); ``report``: the timing. ``to_dict()`` gives each output as its shape and
    dtype; the repr never prints the arrays."""

    outputs: list[np.ndarray]
    report: CollectiveReport


def _check_choice(value, choices, name: str) -> str:
    return _validate.name(value, name, choices, cls=Trn2ValueError, what=name)


def _is_sequence(value) -> bool:
    """A list, tuple or other sized, indexable sequence; not a string, bytes, mapping or a
    numpy array (whose rows are not one buffer per chip)."""
    if isinstance(value, (str, bytes, bytearray, memoryview, np.ndarray, Mapping)):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _buffers(buffers, n: int) -> tuple[list[np.ndarray], tuple[int, ...], np.dtype]:
    """Every chip's buffer as an ndarray (any byte order); all of one shape and dtype. Numbers
    only: ragged lists are ``ShapeError``; strings, objects, datetimes and structured arrays
    ``FormatError`` (``buffers[i]`` named); complex data is bits to move (not to reduce)."""
    if not _is_sequence(buffers):
        raise ShapeError(
            f"buffers: expected a sequence of {n} arrays (one per chip), got "
            f"{type(buffers).__name__} {_validate._show(buffers)}"
        )
    if len(buffers) != n:
        raise ShapeError(f"buffers: got {len(buffers)} buffers for {n} chips; pass one per chip")
    arrays = [_validate.array(b, f"buffers[{i}]", complex_ok=True) for i, b in enumerate(buffers)]
    shape, dtype = arrays[0].shape, arrays[0].dtype
    for i, a in enumerate(arrays):
        if a.shape != shape:
            raise ShapeError(
                f"buffers: buffer {i} has shape {a.shape}, buffer 0 has {shape}; every chip's "
                "buffer must have the same shape"
            )
        if a.dtype != dtype:
            raise ShapeError(
                f"buffers: buffer {i} has dtype {a.dtype}, buffer 0 has {dtype}; every chip's "
                "buffer must have the same dtype"
            )
    return arrays, shape, dtype


def _check_host(arrays: list[np.ndarray], out_bytes: int, collective: str) -> None:
    """``CapacityError`` on ``buffers`` unless the host can hold the outputs (``out_bytes``)
    and the copies of inputs that are not C-contiguous in native byte order, before any of them
    is made (``_validate.check_alloc``: the host's available memory or
    ``TRN2CORE_HOST_MEMORY``)."""
    copies = sum(a.nbytes for a in arrays if not (a.flags.c_contiguous and a.dtype.isnative))
    n = len(arrays)
    _validate.check_alloc(
        out_bytes + copies,
        "buffers",
        f"the {collective} of {n} buffers of {arrays[0].nbytes} bytes ({out_bytes} bytes of "
        f"outputs, {copies} of input copies)",
    )


def _native_contiguous(arrays: list[np.ndarray], code) -> list[np.ndarray]:
    """Flat C-contiguous native-order views (copies where needed) as ``code`` words."""
    out = []
    for a in arrays:
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        out.append(np.ascontiguousarray(a).reshape(-1).view(code))
    return out


def _share_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...] | None:
    """The shape of each rank's share of a buffer of ``shape`` cut ``n`` ways (reduce-scatter,
    all-to-all) when whole rows divide evenly; ``None`` for flat pieces (whose lengths the core
    gives: its output arrays)."""
    if shape and shape[0] % n == 0:
        return (shape[0] // n, *shape[1:])
    return None


def _report(fields, retrace) -> CollectiveReport:
    return CollectiveReport.from_fields(fields, retrace=retrace)


def _result(machine, outs, fields, dtype, shape, estimate) -> CollectiveResult:
    """The core's outputs as arrays of ``dtype`` (native order) and ``shape``, with the report
    of ``fields``; its trace is made on request by estimating the same collective again
    (``estimate``: the arguments of ``_core.collective_estimate`` after the torus, up to the
    trace flag)."""
    results = [o.view(dtype).reshape(shape) for o in outs]
    t = machine.topology._t

    def retrace() -> str:
        return _core.collective_estimate(t, *estimate, True)[1]

    return CollectiveResult(results, _report(fields, retrace))


def run_reduce(
    machine, collective: str, buffers, op: str, algorithm: str, chips
) -> CollectiveResult:
    """All-reduce or reduce-scatter (see ``Machine.all_reduce``)."""
    _check_choice(op, REDUCE_OPS, "op")
    _check_choice(algorithm, ALGORITHMS, "algorithm")
    n = machine._ranks(chips)
    arrays, shape, dtype = _buffers(buffers, n)
    # The core says which formats Trainium2 reduces; a dtype that is no format at all is
    # refused here with the same advice.
    fmt = format_of_dtype(
        dtype.newbyteorder("="),
        "buffers",
        advice=f"{collective} reduces in fp32 on Trainium2; convert integers or float64 with "
        "astype(np.float32) first",
    )
    length = int(np.prod(shape, dtype=np.int64)) if shape else 1
    itemsize = dtype.itemsize
    dtype = dtype.newbyteorder("=")
    # The buffers as held: the core checks the host and copies strided or byte-swapped ones.
    outs, fields = _core.collective_reduce(
        machine.topology._t, chips, collective, op, algorithm, fmt, arrays
    )
    out_shape = shape if collective == "all_reduce" else _share_shape(shape, n) or (-1,)
    estimate = (chips, collective, algorithm, length, itemsize, None)
    return _result(machine, outs, fields, dtype, out_shape, estimate)


def run_move(
    machine, collective: str, buffers, algorithm: str, chips, peers=None
) -> CollectiveResult:
    """All-gather, all-to-all or send/recv: any dtype, bits moved unchanged."""
    _check_choice(algorithm, ALGORITHMS, "algorithm")
    n = machine._ranks(chips)
    arrays, shape, dtype = _buffers(buffers, n)
    peers = _peers(peers, n)
    length = int(np.prod(shape, dtype=np.int64)) if shape else 1
    itemsize = max(1, dtype.itemsize)
    dtype = dtype.newbyteorder("=")
    outs, fields = _core.collective_move(
        machine.topology._t, chips, collective, algorithm, itemsize, arrays, peers
    )
    if collective == "all_gather":
        out_shape = (n, *shape)
    elif collective == "all_to_all":
        # Rank r receives block r of every rank: the input's shape when the first axis
        # divides by the rank count, else a flat array.
        out_shape = shape if _share_shape(shape, n) else (-1,)
    else:
        out_shape = shape
    estimate = (chips, collective, algorithm, length, itemsize, peers)
    return _result(machine, outs, fields, dtype, out_shape, estimate)


def _peers(peers, n: int) -> list[int] | None:
    """``None`` or a list of ``n`` chip positions, ``peers[i]`` the position the ``i``-th chip
    of the collective sends to (``Trn2ValueError``; the core checks that it is a
    permutation)."""
    if peers is None:
        return None
    if not _is_sequence(peers):
        raise Trn2ValueError(
            f"peers: expected a list of {n} chip positions (a permutation of 0..{n - 1}), got "
            f"{_validate._show(peers)}"
        )
    return [_rank_arg(p, n, "peers") for p in peers]


def _rank_arg(value, n: int, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise Trn2ValueError(f"{name}: expected chip positions, got {_validate._show(value)}")
    if not 0 <= value < n:
        raise Trn2ValueError(
            f"{name}: position {value} does not exist; the {n} chips are 0..{n - 1}"
        )
    return int(value)


def estimate(machine, collective: str, nbytes, dtype, algorithm: str, chips, peers):
    """Timing of a collective of ``nbytes`` per chip's input, without data."""
    _check_choice(collective, COLLECTIVES, "collective")
    _check_choice(algorithm, ALGORITHMS, "algorithm")
    n = machine._ranks(chips)
    dtype = format_name(dtype, "dtype")
    itemsize = FORMAT_DTYPES[dtype].itemsize
    if isinstance(nbytes, (bool, np.bool_)) or not isinstance(nbytes, (int, np.integer)):
        raise Trn2ValueError(f"nbytes: expected a byte count >= 0, got {_validate._show(nbytes)}")
    if nbytes < 0:
        raise Trn2ValueError(f"nbytes: expected a byte count >= 0, got {nbytes}")
    if nbytes % itemsize:
        raise Trn2ValueError(
            f"nbytes: {nbytes} is not a whole number of {itemsize}-byte {dtype} elements"
        )
    if nbytes > 1 << 50:
        raise CapacityError(f"nbytes: {nbytes} bytes per chip is beyond the model's 2**50")
    peers = _peers(peers, n)
    elements = int(nbytes) // itemsize
    t = machine.topology._t
    fields, _ = _core.collective_estimate(
        t, chips, collective, algorithm, elements, itemsize, peers, False
    )

    def retrace() -> str:
        return _core.collective_estimate(
            t, chips, collective, algorithm, elements, itemsize, peers, True
        )[1]

    return _report(fields, retrace)
