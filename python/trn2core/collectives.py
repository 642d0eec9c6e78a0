"""Collectives over the chips of an instance, UltraServer or UltraCluster (contract section 5).

The machines in ``trn2core.topology`` call into here; users call their methods
(``inst.all_reduce(buffers)``) or ``machine.estimate(...)`` for timing without data. Every
algorithm is one schedule of chunk transfers and reductions, executed on the buffers by the Rust
core for the bits and costed over the links for the time (see docs/collectives.md).
"""

from __future__ import annotations

import dataclasses
import fractions
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core, _validate
from ._names import ALGORITHMS, COLLECTIVES, REDUCE_OPS
from .dtypes import FORMAT_DTYPES, format_name, format_of_dtype
from .errors import CapacityError, ShapeError, Trn2ValueError
from .report import Result, TimingReport, _fmt_seconds, _fmt_time, _Trace

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "REDUCE_OPS",
    "CollectiveReport",
    "CollectiveResult",
]

_CODE_DTYPE = {4: np.float32, 2: np.uint16, 1: np.uint8}


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
        """As ``TimingReport.from_fields``; the core's ``ranks`` (one per chip) become ``chips``."""
        fields = dict(fields)
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


def _report(fields: dict[str, Any], retrace) -> CollectiveReport:
    return CollectiveReport.from_fields(fields, retrace=retrace)


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
    results = []
    for o in outs:
        o = o.view(dtype)
        if collective == "all_reduce":
            o = o.reshape(shape)
        else:
            o = o.reshape(_share_shape(shape, n) or (-1,))
        results.append(o)
    t = machine.topology._t
    elements = length

    def retrace() -> str:
        return _core.collective_estimate(
            t, chips, collective, algorithm, elements, itemsize, None, True
        )[1]

    return CollectiveResult(results, _report(fields, retrace))


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
    results = []
    for o in outs:
        o = o.view(dtype)
        if collective == "all_gather":
            o = o.reshape((n, *shape))
        elif collective == "all_to_all":
            # Rank r receives block r of every rank: the input's shape when the first axis
            # divides by the rank count, else a flat array.
            o = o.reshape(shape if _share_shape(shape, n) else (-1,))
        else:
            o = o.reshape(shape)
        results.append(o)
    t = machine.topology._t

    def retrace() -> str:
        return _core.collective_estimate(
            t, chips, collective, algorithm, length, itemsize, peers, True
        )[1]

    return CollectiveResult(results, _report(fields, retrace))


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


# ----------------------------------------------------------------------------------- nccom-test

#: nccom-test's data types and their sizes in bytes.
NCCOM_DATATYPES = {
    "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "fp16": 2, "bf16": 2,
    "uint32": 4, "int32": 4, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1,
}  # fmt: skip

_GB = 1e9


#: Largest size nccom-test takes, bytes per rank (the limit of ``Machine.estimate``).
NCCOM_MAX_BYTES = 1 << 50
#: Most rows (sizes) one nccom-test run prints.
NCCOM_MAX_SIZES = 10_000


def parse_size(text, arg: str = "size") -> int:
    """A size as nccom-test takes it: a whole number of bytes, or with a binary unit (``32M``,
    ``1kb``, ``1GB``, ``1MiB``, ``1.5G``; K, M, G and T are powers of 1024 in every spelling),
    from 1 byte to ``NCCOM_MAX_BYTES``. ``Trn2ValueError`` for anything else (fractions of a
    byte, ``inf``, ``nan``, negative or zero sizes, unknown units); ``CapacityError`` beyond
    the limit."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, (bool, np.bool_)):
        s, mult = str(int(text)), 1
    elif isinstance(text, str):
        s = text.strip().lower()
        units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
        mult = 1
        # nccom-test's units are binary whichever way they are written: 1M = 1MB = 1MiB.
        for suffix in ("kib", "mib", "gib", "tib", "kb", "mb", "gb", "tb", "k", "m", "g", "t", "b"):
            if s.endswith(suffix):
                mult = units.get(suffix[0], 1)
                s = s[: -len(suffix)]
                break
    else:
        raise Trn2ValueError(f"{arg}: expected a byte count like 32M or 1kb, got {text!r}")
    m = re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)e([+-]?\d+)", s.strip())
    if m and abs(int(m.group(2))) > 40:
        # Exact arithmetic on 1e999999999 would build a billion-digit integer (a hang): any
        # exponent this large is far beyond the limit, or far below one byte.
        if int(m.group(2)) > 0 and float(m.group(1)) > 0:
            raise CapacityError(f"{arg}: {text!r} is beyond the model's limit of 2**50 bytes")
        raise Trn2ValueError(f"{arg}: {text!r} is not a positive whole number of bytes")
    try:
        # Exact arithmetic: "1.5G" is 1610612736 bytes, "1e30" is 10**30 (then too large).
        value = fractions.Fraction(s.strip()) * mult
    except (ValueError, ZeroDivisionError):
        raise Trn2ValueError(
            f"{arg}: cannot read {text!r} as a byte count (e.g. 32M, 1kb, 1.5G)"
        ) from None
    if value.denominator != 1:
        raise Trn2ValueError(f"{arg}: {text!r} is {float(value)} bytes, not a whole number")
    if value < 1:
        raise Trn2ValueError(f"{arg}: {text!r} is not a positive byte count")
    if value > NCCOM_MAX_BYTES:
        raise CapacityError(
            f"{arg}: {text!r} is {int(value)} bytes per rank, beyond the model's limit of "
            f"2**50 ({NCCOM_MAX_BYTES}) bytes"
        )
    return int(value)


def nccom_sizes(minbytes: int, maxbytes: int, stepfactor, stepbytes) -> list[int]:
    """The sizes nccom-test runs: from min to max, times ``stepfactor`` or plus ``stepbytes``
    (default: a tenth of the range); at most ``NCCOM_MAX_SIZES`` of them (``Trn2ValueError``
    for more, rather than a silently shortened table)."""
    if maxbytes < minbytes:
        raise Trn2ValueError(f"maxbytes: {maxbytes} is below minbytes {minbytes}")
    sizes = [minbytes]
    if stepfactor is not None:
        stepfactor = _validate.integer(stepfactor, "stepfactor", lo=2, hi=_validate.U64_MAX)
        while sizes[-1] * stepfactor <= maxbytes:
            sizes.append(sizes[-1] * stepfactor)
        return sizes
    step = stepbytes if stepbytes is not None else max(1, (maxbytes - minbytes) // 10)
    step = _validate.integer(step, "stepbytes", lo=1, hi=_validate.U64_MAX)
    count = (maxbytes - minbytes) // step + 1
    if count > NCCOM_MAX_SIZES:
        raise Trn2ValueError(
            f"stepbytes: {minbytes}..{maxbytes} in steps of {step} is {count} sizes; at most "
            f"{NCCOM_MAX_SIZES} (use a larger step or --stepfactor)"
        )
    return [minbytes + i * step for i in range(count)]


def nccom_rows(op: str, ranks: int, sizes, datatype: str, lnc: int, algorithm: str):
    """One dict per size: ``size_bytes``, ``count``, ``seconds``, ``algbw``, ``busbw`` (bytes/s),
    ``algorithm``, ``chips``, ``op_fixed_s`` (the runtime's fixed cost, in ``seconds``),
    ``intra_chip_s`` and ``intra_chip_bytes`` (the within-chip stage), ``phases`` (the
    chip-level collective's, as in ``CollectiveReport``) and ``uncertainty`` (how far the
    published collective measurements were from the model: see ``Report``)."""
    _check_choice(algorithm, ALGORITHMS, "algorithm")
    _check_choice(op, COLLECTIVES, "operation")
    _check_choice(datatype, tuple(NCCOM_DATATYPES), "datatype")
    ranks = _validate.integer(ranks, "ranks", lo=1, hi=_validate.U64_MAX)
    lnc = _validate.integer(lnc, "lnc", lo=1, hi=_validate.U64_MAX)
    elem = NCCOM_DATATYPES[datatype]
    rows = []
    for size in sizes:
        size = max(elem, size - size % elem)
        rows.append(_core.nccom_estimate(op, int(ranks), int(lnc), int(size), elem, algorithm))
    return rows


def nccom_algorithm(name: str) -> str:
    """An algorithm as nccom-test prints it: hierarchical ones as ``hier``, without the
    sub-algorithms (``hierarchical(torus+efa)`` is ``hier``; the Python report keeps them)."""
    return "hier" if name.startswith("hierarchical") else name


def parse_stats(stats) -> list[str]:
    """nccom-test's ``--stats``: ``avg`` and percentiles ``p0`` .. ``p100`` (``p50``, ``p99.9``),
    in the order given, each once. ``Trn2ValueError`` naming ``stats`` otherwise."""
    out: list[str] = []
    for st in stats:
        t = str(st).strip().lower()
        m = re.fullmatch(r"p(\d+(?:\.\d+)?)", t)
        if t != "avg" and not (m and 0 <= float(m.group(1)) <= 100):
            raise Trn2ValueError(
                f"stats: {st!r} is not a statistic; use avg or a percentile p0..p100 (p50, p99)"
            )
        if t not in out:
            out.append(t)
    if not out:
        raise Trn2ValueError("stats: give at least one statistic (avg, p50, ...)")
    return out


def _time_header(stat: str) -> str:
    return f"time:{stat}(us)"


def nccom_results(rows, datatype: str, stats=("avg",), show_algorithm: bool = False) -> list:
    """The rows as the records of nccom-test's JSON report: ``size(B)``, ``count(elems)``,
    ``type``, one ``time:<stat>(us)`` per statistic, ``algbw(GB/s)`` and ``busbw(GB/s)`` (10^9
    bytes/s), and ``algorithm`` with ``show_algorithm``. The model is deterministic: every
    iteration of a size takes the same time, so every statistic (average and any percentile
    over the iterations) is that time."""
    out = []
    for r in rows:
        rec: dict[str, Any] = {
            "size(B)": int(r["size_bytes"]), "count(elems)": int(r["count"]), "type": datatype,
        }  # fmt: skip
        for st in stats:
            rec[_time_header(st)] = r["seconds"] * 1e6
        rec["algbw(GB/s)"] = r["algbw"] / _GB
        rec["busbw(GB/s)"] = r["busbw"] / _GB
        if show_algorithm:
            rec["algorithm"] = nccom_algorithm(r["algorithm"])
        out.append(rec)
    return out


def nccom_table(rows, datatype: str, show_algorithm: bool = False, stats=("avg",)) -> str:
    """The rows as nccom-test prints them: ``size(B) count(elems) type time:avg(us) algbw(GB/s)
    busbw(GB/s)`` (one ``time:<stat>(us)`` column per statistic of ``stats``; all equal, as the
    model is deterministic), bandwidths as size / time in 10^9 B/s, as every published output
    of Neuron's tool since 2025 is (its guide's text says GiB/s, which only its 2023 examples
    were; docs/fidelity.md), then the average bus bandwidth and the range the published
    collective measurements fell in."""
    head = ["size(B)", "count(elems)", "type", *(_time_header(st) for st in stats)]
    head += ["algbw(GB/s)", "busbw(GB/s)"]
    if show_algorithm:
        head.append("algorithm")
    lines = []
    for r in rows:
        line = [str(r["size_bytes"]), str(r["count"]), datatype]
        line += [f"{r['seconds'] * 1e6:.2f}"] * len(stats)
        line += [f"{r['algbw'] / _GB:.2f}", f"{r['busbw'] / _GB:.2f}"]
        if show_algorithm:
            line.append(nccom_algorithm(r["algorithm"]))
        lines.append(line)
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    out = ["    ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    out += ["    ".join(v.rjust(w) for v, w in zip(x, widths, strict=True)) for x in lines]
    out.append(f"Avg bus bandwidth:\t{nccom_avg_busbw(rows):.4f}GB/s")
    if rows:
        out.append(f"Predicted times: {rows[0]['uncertainty']['text']} (docs/fidelity.md)")
    return "\n".join(out)


def nccom_avg_busbw(rows) -> float:
    """The average of the busbw column, GB/s (10^9 B/s)."""
    return sum(r["busbw"] for r in rows) / max(1, len(rows)) / _GB


def nccom_chips(ranks: int, nnodes: int, lnc: int) -> int:
    """The chips ``ranks`` logical NeuronCores on ``nnodes`` nodes span, as nccom-test places
    them: ``8 / lnc`` ranks per chip, the ranks divided equally over the nodes. A node is one
    16-chip instance: one node holds at most 16 chips' ranks; several nodes are the
    trn2u.48xlarge instances of UltraServers (four per UltraServer, NeuronLink between them,
    EFA between UltraServers), each node used whole (the model places chips on whole instances
    only). ``Trn2ValueError`` naming ``nworkers`` or ``nnodes`` otherwise."""
    lnc = _validate.integer(lnc, "lnc", lo=1, hi=_validate.U64_MAX)
    ranks = _validate.integer(ranks, "ranks", lo=1, hi=_validate.U64_MAX)
    nnodes = _validate.integer(nnodes, "nnodes", lo=1, hi=_validate.U64_MAX)
    from . import spec

    per_chip = spec.cores_per_chip // lnc
    per_node = spec.chips_per_instance * per_chip
    if ranks % nnodes:
        raise Trn2ValueError(
            f"nnodes: {ranks} ranks do not divide equally over {nnodes} nodes (nccom-test puts "
            f"nworkers / nnodes ranks on each node)"
        )
    here = ranks // nnodes
    if nnodes == 1:
        if here > per_node:
            need = -(-ranks // per_node)
            raise Trn2ValueError(
                f"ranks: {ranks} ranks at LNC={lnc} need {-(-ranks // per_chip)} chips; one node "
                f"(a 16-chip trn2 instance) holds {per_node} ranks: pass -N/--nnodes {need} or "
                f"more"
            )
        return 1 if here <= per_chip else here // per_chip
    if here != per_node:
        raise Trn2ValueError(
            f"nnodes: {ranks} ranks on {nnodes} nodes is {here} ranks per node; trn2core models "
            f"several nodes only when each is used whole ({per_node} ranks per node at "
            f"LNC={lnc}: -r {per_node * nnodes} -N {nnodes})"
        )
    per_us = spec.ultraserver_instances
    if nnodes > per_us and nnodes % per_us:
        raise Trn2ValueError(
            f"nnodes: {nnodes} nodes span several UltraServers of {per_us} nodes; use at most "
            f"{per_us} or a multiple of {per_us} (whole UltraServers, joined by EFA)"
        )
    return nnodes * spec.chips_per_instance


def parse_src_target_pairs(data, ranks: int) -> list[tuple[int, int]]:
    """The pairs of nccom-test's ``--custom-src-target-pairs`` file, read as JSON
    (``{"src_target_pairs": [[[src, dst], ...]]}``: groups of ``[source, target]`` rank pairs;
    every group's pairs are used together). A source sends at most once and a target receives
    at most once; ranks are ``0 .. ranks - 1``. ``Trn2ValueError`` naming the file's key."""
    key = "src_target_pairs"
    if not isinstance(data, Mapping) or key not in data:
        raise Trn2ValueError(f"{key}: expected a JSON object with a {key!r} list")
    groups = data[key]
    if not isinstance(groups, list) or not groups:
        raise Trn2ValueError(f"{key}: expected a non-empty list of groups of [src, dst] pairs")
    if all(isinstance(p, list) and len(p) == 2 and all(_is_rank(x) for x in p) for p in groups):
        groups = [groups]  # one group written without its outer list
    pairs: list[tuple[int, int]] = []
    for g in groups:
        if not isinstance(g, list):
            raise Trn2ValueError(f"{key}: expected groups of [src, dst] pairs, got {g!r}")
        for p in g:
            if not (isinstance(p, list) and len(p) == 2 and all(_is_rank(x) for x in p)):
                raise Trn2ValueError(f"{key}: expected a [src, dst] pair of ranks, got {p!r}")
            for x in p:
                if x >= ranks:
                    raise Trn2ValueError(
                        f"{key}: rank {x} does not exist; -r {ranks} has ranks 0..{ranks - 1}"
                    )
            pairs.append((p[0], p[1]))
    for i, what in ((0, "sends"), (1, "receives")):
        seen = set()
        for p in pairs:
            if p[i] in seen:
                raise Trn2ValueError(f"{key}: rank {p[i]} {what} more than once")
            seen.add(p[i])
    return pairs


def _is_rank(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
