"""nccom-test, the Neuron collectives benchmark, as trn2core models it: its sizes and data
types, one row per size from the core's ``nccom_estimate``, its table and the rank placement of
``-r``/``-N`` (``trn2core nccom-test`` is the command; ``trn2core.collectives`` the API of the
machines' collectives).
"""

from __future__ import annotations

import fractions
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core, _validate
from ._names import ALGORITHMS, COLLECTIVES
from .collectives import _check_choice, _plain
from .errors import CapacityError, Trn2ValueError

#: nccom-test's data types and their sizes in bytes.
NCCOM_DATATYPES = {
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "fp16": 2,
    "bf16": 2,
    "uint32": 4,
    "int32": 4,
    "fp32": 4,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

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
        row = _core.nccom_estimate(op, int(ranks), int(lnc), int(size), elem, algorithm)
        rows.append(_plain(row))
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
            "size(B)": int(r["size_bytes"]),
            "count(elems)": int(r["count"]),
            "type": datatype,
        }
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
    them (the core's rule, ``collective::nccom_chips``: ``8 / lnc`` ranks per chip, the ranks
    divided equally over the nodes, several nodes only as whole 16-chip instances of
    UltraServers). ``Trn2ValueError`` naming ``ranks``, ``nnodes`` or ``lnc`` otherwise."""
    lnc = _validate.integer(lnc, "lnc", lo=1, hi=_validate.U64_MAX)
    ranks = _validate.integer(ranks, "ranks", lo=1, hi=_validate.U64_MAX)
    nnodes = _validate.integer(nnodes, "nnodes", lo=1, hi=_validate.U64_MAX)
    return _core.nccom_chips(ranks, nnodes, lnc)


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
