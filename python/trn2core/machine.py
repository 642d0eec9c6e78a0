"""The whole NeuronCore (contract section 7): SBUF/PSUM tiles, the instructions of the four
engines and of DMA, and the engine-parallel timeline (``KernelReport``).

``trn2core.NeuronCore`` holds one machine and exposes it as ``core.tile``, ``core.hbm_tensor``,
``core.read``/``core.write``, the engines ``core.vector``, ``core.scalar``, ``core.gpsimd``,
``core.pe``, the DMA queues ``core.dma``, and ``core.run()``. Every instruction method is one
call into the Rust core (``_core.Machine``), which checks the engine rules, computes the bits
and records the instruction. Semantics, rules and costs: docs/machine.md.

Tiles (``trn2core.machine.Tile``) are handles: slicing (``t[0:64, ::2]``), ``reshape_free``
and ``ap`` make new handles without touching memory.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _core, _names, _validate
from .dtypes import FORMAT_DTYPES, MACHINE_NP_DTYPES, format_name
from .errors import FormatError, ShapeError, Trn2ValueError
from .report import TimingReport, _fmt_seconds, _Trace, count, is_protobuf, plain

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "ALU_OPS",
    "ENGINES",
    "MACHINE_DTYPES",
    "OPCODES",
    "KernelReport",
    "Tile",
]

#: A tile handle (an access pattern into one tensor of one core).
Tile = _core.Tile

#: Element types of tiles.
MACHINE_DTYPES: tuple[str, ...] = _names.MACHINE_DTYPES
#: ALU operators (``op=``), named as ``nki.language`` names them.
ALU_OPS: tuple[str, ...] = _names.ALU_OPS
#: Activation functions of the Scalar engine.
ACTIVATION_FUNCTIONS: tuple[str, ...] = _names.ACTIVATION_FUNCTIONS
#: The compute engines (``engine=``).
ENGINES: tuple[str, ...] = _names.ENGINES
#: The instructions the timeline counts.
OPCODES: tuple[str, ...] = _names.OPCODES

#: The core's instruction table by opcode: ``(opcode, engines, default engine, arguments,
#: summary)``.
_TABLE = {row[0]: row for row in _core.instruction_table()}

_NP_OF = MACHINE_NP_DTYPES
_NAME_OF = {v: k for k, v in _NP_OF.items() if k != "tf32"}
_NAME_OF[np.dtype(np.bool_)] = "uint8"


def np_dtype_of(dtype: str) -> np.dtype:
    """The numpy dtype holding a machine dtype (tf32 in float32 containers)."""
    return _NP_OF[dtype]


def to_machine(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` converted to machine ``dtype`` by the machine's rules, rounding once: floats are
    rounded from their exact value (float64 included, not through float32 first) by the core's
    encoder to nearest even, as ``quantize`` and the engines round; integers get the engines'
    integer rule (nearest even, NaN to 0, saturated to the type's range), not numpy's casts
    (which wrap 300 to 44 in int8). An array already of the dtype keeps its bits."""
    want = np_dtype_of(dtype)
    if a.dtype == want:  # its own bits (tf32 in a float32 container too)
        return a
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    if dtype in FORMAT_DTYPES:
        from .numerics import quantize

        return quantize(a, dtype)
    info = np.iinfo(want)
    if a.dtype.kind in "iu":
        src = np.iinfo(a.dtype)
        return np.clip(a, max(info.min, src.min), min(info.max, src.max)).astype(want)
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly (and become 0)
        v = np.rint(a.astype(np.float64))
    return np.nan_to_num(np.clip(v, info.min, info.max), nan=0.0).astype(want)


def dtype_name(dtype: Any, arg: str = "dtype") -> str:
    """A machine dtype name from a name, a format however written (``"bfloat16"``,
    ``ml_dtypes.float8_e5m2``, ``torch.float16``: ``trn2core.dtypes.format_name``) or a numpy
    integer / bool dtype."""
    if isinstance(dtype, str) and dtype in MACHINE_DTYPES:
        return dtype
    if not isinstance(dtype, (str, bool, int, float)) and dtype is not None:
        try:
            name = _NAME_OF.get(np.dtype(dtype))
        except (TypeError, ValueError):
            name = None
        if name is not None and name not in FORMAT_DTYPES:
            return name  # an integer type (or bool, held as uint8)
    try:
        # fp8_e4m3fn passes: the core refuses it saying why (OCP E4M3 is not a Trainium2 dtype).
        return format_name(dtype, arg)
    except FormatError as e:
        raise FormatError(
            f"{e}; a NeuronCore dtype is one of {MACHINE_DTYPES} (also numpy integer dtypes)"
        ) from None


# One check per kind of argument, before anything reaches the binding: a pyo3 conversion error
# (TypeError, OverflowError, UnicodeEncodeError) must never reach a user (issue 28). Tiles and
# scalar operands (a number or a [P, 1] tile) are converted by the binding, which names them;
# names of operators, functions and commands are checked as text here and as names in the core.


def _op(value, arg: str) -> str:
    return _validate.text(value, arg)


def _opt_op(value, arg: str) -> str | None:
    return None if value is None else _validate.text(value, arg)


def _flag(value, arg: str) -> bool:
    return _validate.boolean(value, arg)


def _opt_flag(value, arg: str) -> bool | None:
    return None if value is None else _validate.boolean(value, arg)


def _i64(value, arg: str) -> int:
    return _validate.integer(value, arg, lo=_validate.I64_MIN, hi=_validate.I64_MAX)


def _count(value, arg: str) -> int:
    return _validate.integer(value, arg, lo=0, hi=_validate.U64_MAX, cls=ShapeError)


def _queue(value) -> int | None:
    if value is None:
        return None
    # Representable here (a byte in the core); the core refuses a queue it does not have.
    return _validate.integer(value, "queue", lo=0, hi=255)


def _pair_or_none(value, arg: str) -> tuple[int, int] | None:
    return _validate.pair(value, arg)


class UnknownInstructionError(Trn2ValueError, AttributeError):
    """An engine view has no instruction of that name (none, or its row lists other engines)."""


class _Engine:
    """An engine's view of the core's instruction table: the methods below keep the contract's
    argument names; every other instruction whose row lists the engine is
    ``core.<engine>.<instruction>(dst, <the row's arguments>)`` (``_core.instruction_table()``)."""

    __slots__ = ("_m",)
    _engine = ""

    def __init__(self, machine) -> None:
        self._m = machine

    def __getattr__(self, name: str):
        row = _TABLE.get(name)
        if row is None or self._engine not in row[1]:
            runs = f" (it runs on {' or '.join(row[1])})" if row is not None else ""
            raise UnknownInstructionError(
                f"{name}: the {self._engine} engine has no instruction {name!r}{runs}",
                arg=name,
                rule="engine" if row is not None else None,
            )
        m, engine = self._m, self._engine
        if row[3] and row[3][0][0] == "engine":
            return functools.partial(m.issue, name, engine)
        return functools.partial(m.issue, name)


class VectorEngine(_Engine):
    """The Vector engine (DVE): ``core.vector``."""

    __slots__ = ()
    _engine = "vector"

    def tensor_tensor(self, dst, data1, data2, op: str = "add") -> None:
        """``dst = data1 <op> data2`` element-wise."""
        self._m.issue("tensor_tensor", "vector", dst, data1, data2, _op(op, "op"))

    def tensor_scalar(
        self, dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False
    ) -> None:
        """``dst = (data <op0> operand0) <op1> operand1``; operands are numbers or ``[P, 1]``
        fp32 tiles."""
        _tensor_scalar(
            self._m, "vector", dst, data, op0, operand0, reverse0, op1, operand1, reverse1
        )

    def scalar_tensor_tensor(
        self, dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False
    ) -> None:
        """``dst = (data <op0> operand0) <op1> operand1`` with ``operand1`` a tile."""
        self._m.issue(
            "scalar_tensor_tensor",
            dst,
            data,
            _op(op0, "op0"),
            operand0,
            _op(op1, "op1"),
            operand1,
            _flag(reverse0, "reverse0"),
            _flag(reverse1, "reverse1"),
        )

    def tensor_copy(self, dst, src) -> None:
        """``dst = src`` (bits when the dtypes agree, else through float32)."""
        self._m.issue("tensor_copy", "vector", dst, src)

    def memset(self, dst, value) -> None:
        """Fills ``dst`` with ``value``."""
        self._m.issue("memset", "vector", dst, _validate.number(value, "value"))

    def reciprocal(self, dst, data) -> None:
        """``dst = 1 / data`` (IEEE float32)."""
        self._m.issue("reciprocal", dst, data)

    def select(self, dst, predicate, on_true, on_false) -> None:
        """``dst = predicate != 0 ? on_true : on_false`` (``on_false`` a tile or a number)."""
        self._m.issue("select", dst, predicate, on_true, on_false)

    def tensor_reduce(self, dst, op, data, axes: int = 1, negate: bool = False) -> None:
        """Reduces the last ``axes`` free axes of ``data`` with ``op`` into ``dst``."""
        self._m.issue(
            "tensor_reduce", dst, _op(op, "op"), data, _count(axes, "axes"), _flag(negate, "negate")
        )

    def tensor_tensor_scan(
        self, dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False
    ) -> None:
        """``dst[i] = op1(op0(data0[i], dst[i-1]), data1[i])`` from ``initial``."""
        self._m.issue(
            "tensor_tensor_scan",
            dst,
            data0,
            data1,
            initial,
            _op(op0, "op0"),
            _op(op1, "op1"),
            _flag(reverse0, "reverse0"),
            _flag(reverse1, "reverse1"),
        )

    def tensor_scalar_reduce(
        self,
        dst,
        data,
        op0,
        operand0,
        reduce_op,
        reduce_res=None,
        reverse0=False,
        reduce_cmd="reset_reduce",
        reduce_init=None,
        negate=False,
    ) -> None:
        """``dst = data <op0> operand0`` and the results reduced into ``reduce_res``."""
        self._m.issue(
            "tensor_scalar_reduce",
            dst,
            data,
            _op(op0, "op0"),
            operand0,
            _op(reduce_op, "reduce_op"),
            reduce_res,
            _flag(reverse0, "reverse0"),
            _op(reduce_cmd, "reduce_cmd"),
            reduce_init,
            _flag(negate, "negate"),
        )

    def bn_stats(self, dst, data) -> None:
        """Per-partition ``[count, mean, m2]`` of the even and odd elements of ``data``."""
        self._m.issue("bn_stats", dst, data)

    def bn_aggr(self, dst, data) -> None:
        """Per-partition ``[mean, variance]`` from ``bn_stats`` triples."""
        self._m.issue("bn_aggr", dst, data)

    def transpose(self, dst, data) -> None:
        """``nc_transpose`` on the Vector engine (up to 32 x 32)."""
        self._m.issue("nc_transpose", "vector", dst, data)


def _tensor_scalar(m, engine, dst, data, op0, operand0, reverse0, op1, operand1, reverse1):
    m.issue(
        "tensor_scalar",
        engine,
        dst,
        data,
        _op(op0, "op0"),
        operand0,
        _flag(reverse0, "reverse0"),
        _opt_op(op1, "op1"),
        operand1,
        _flag(reverse1, "reverse1"),
    )


class ScalarEngine(_Engine):
    """The Scalar engine (ACT): ``core.scalar``."""

    __slots__ = ()
    _engine = "scalar"

    def activation(
        self,
        dst,
        data,
        func: str = "copy",
        *,
        scale=None,
        bias=None,
        reduce_op=None,
        reduce_res=None,
        reduce_cmd: str = "idle",
    ) -> None:
        """``dst = func(data * scale + bias)``; with ``reduce_cmd`` the float32 results are
        added into the engine's per-partition registers, read out into ``reduce_res``.
        Transcendental functions follow a float64 rule, *not the chip's bits*
        (docs/machine.md)."""
        m = self._m
        m.issue(
            "activation",
            dst,
            data=data,
            func=func,
            bias=bias,
            scale=scale,
            reduce_op=reduce_op,
            reduce_res=reduce_res,
            reduce_cmd=reduce_cmd,
        )

    def activation_reduce(self, dst, data, func, reduce_op, reduce_res, *, scale=None, bias=None):
        """``activation`` with the sums of the results written into ``reduce_res``."""
        self._m.issue(
            "activation_reduce",
            dst,
            data=data,
            func=func,
            reduce_op=reduce_op,
            reduce_res=reduce_res,
            bias=bias,
            scale=scale,
        )

    def tensor_scalar(
        self, dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False
    ) -> None:
        """``tensor_scalar`` on the Scalar engine ((multiply, add), (multiply) or (add))."""
        _tensor_scalar(
            self._m, "scalar", dst, data, op0, operand0, reverse0, op1, operand1, reverse1
        )

    def tensor_copy(self, dst, src) -> None:
        """``dst = src`` on the Scalar engine."""
        self._m.issue("tensor_copy", "scalar", dst, src)


class GpSimdEngine(_Engine):
    """The GpSimd engine (POOL): ``core.gpsimd``."""

    __slots__ = ()
    _engine = "gpsimd"

    def iota(self, dst, pattern, offset: int = 0, channel_multiplier: int = 0) -> None:
        """``dst[c, ...] = offset + c * channel_multiplier + sum(index * step)`` (int32)."""
        self._m.issue(
            "iota",
            dst,
            _pattern(pattern),
            _i64(offset, "offset"),
            _i64(channel_multiplier, "channel_multiplier"),
        )

    def affine_select(
        self, dst, pattern, channel_multiplier, on_true, on_false_value, cmp_op="equal", offset=0
    ) -> None:
        """``dst = cmp_op(affine, 0) ? on_true : on_false_value``."""
        self._m.issue(
            "affine_select",
            dst,
            _pattern(pattern),
            _i64(channel_multiplier, "channel_multiplier"),
            on_true,
            _validate.number(on_false_value, "on_false_value"),
            _op(cmp_op, "cmp_op"),
            _i64(offset, "offset"),
        )

    def tensor_tensor(self, dst, data1, data2, op: str = "add") -> None:
        """``tensor_tensor`` on GpSimd (native int32 arithmetic for int32 tiles)."""
        self._m.issue("tensor_tensor", "gpsimd", dst, data1, data2, _op(op, "op"))

    def tensor_scalar(self, dst, data, op0, operand0=0.0, reverse0=False) -> None:
        """``tensor_scalar`` on GpSimd (``rsqrt`` only)."""
        _tensor_scalar(self._m, "gpsimd", dst, data, op0, operand0, reverse0, None, None, False)

    def tensor_copy(self, dst, src) -> None:
        """``dst = src`` on GpSimd (SBUF only)."""
        self._m.issue("tensor_copy", "gpsimd", dst, src)

    def memset(self, dst, value) -> None:
        """Fills ``dst`` with ``value``."""
        self._m.issue("memset", "gpsimd", dst, _validate.number(value, "value"))


class TensorEngine(_Engine):
    """The tensor engine (PE): ``core.pe``."""

    __slots__ = ()
    _engine = "tensor"

    def matmul(
        self,
        dst,
        stationary,
        moving,
        *,
        accumulate=None,
        perf_mode: str = "none",
        tile_position=None,
        tile_size=None,
        is_transpose: bool = False,
    ) -> None:
        """``nc_matmul``: ``dst = stationary.T @ moving`` into fp32 PSUM; ``accumulate=None``
        accumulates exactly when ``dst`` holds a matmul's result."""
        self._m.issue(
            "nc_matmul",
            dst,
            stationary,
            moving,
            _opt_flag(accumulate, "accumulate"),
            _op(perf_mode, "perf_mode"),
            _pair_or_none(tile_position, "tile_position"),
            _pair_or_none(tile_size, "tile_size"),
            _flag(is_transpose, "is_transpose"),
        )

    def transpose(self, dst, data) -> None:
        """``nc_transpose`` on the tensor engine (SBUF to PSUM, up to 128 x 128, bit-exact)."""
        self._m.issue("nc_transpose", "tensor", dst, data)


class DmaQueues(_Engine):
    """The 16 DMA queues: ``core.dma``."""

    __slots__ = ()

    def copy(self, dst, src, *, queue: int | None = None) -> None:
        """``dma_copy`` between HBM and SBUF tiles (same element count) on ``queue`` (0..15;
        ``None``: the queues in turn)."""
        self._m.issue("dma_copy", dst, src, _queue(queue))


def _pattern(pattern, arg: str = "pattern") -> list[tuple[int, int]]:
    """``[[step, num], ...]``: integer steps (signed 64-bit) and counts (unsigned 64-bit)."""
    if isinstance(pattern, (str, bytes)) or not isinstance(pattern, (list, tuple)):
        raise Trn2ValueError(f"{arg}: expected a list of [step, num] pairs, got {pattern!r:.60}")
    out = []
    for pair in pattern:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise Trn2ValueError(f"{arg}: expected [step, num] pairs, got {pair!r:.60}")
        out.append(
            (_i64(pair[0], arg), _validate.integer(pair[1], arg, lo=0, hi=_validate.U64_MAX))
        )
    return out


def spill_rows(report) -> list[tuple[str, str]]:
    """The report row of its spills to HBM and reloads (none when there were none)."""
    if not report.spill_bytes:
        return []
    return [
        (
            "spills",
            f"{report.spill_bytes:,} bytes, {_fmt_seconds(report.spill_s)} of DMA queue time",
        )
    ]


@dataclasses.dataclass(frozen=True, repr=False)
class KernelReport(TimingReport):
    """The timeline of the instructions issued on a core: ``seconds`` (makespan), ``engines`` (per
    engine and DMA queue: ``busy_s``, ``utilization``, ``instructions``), ``opcodes`` (instructions
    per opcode), ``dma_bytes``, ``spill_bytes`` and ``spill_s`` (the bytes and DMA queue time of
    those that spill SBUF tensors to HBM and reload them, NKI's compiler-placed tensors:
    docs/nki.md),
    ``critical_path`` (the chain of instructions that ends last, each with what it waited for; built
    on first use), ``instructions``, ``ticks`` (4.8 GHz), ``by_line()`` (busy time per kernel source
    line, for instructions an NKI kernel issued). Prints as a table; ``to_dict()``;
    ``save_trace(path)`` writes a Perfetto trace with one track per engine and DMA queue and one
    slice per instruction (its kernel line as ``args.line``)."""

    seconds: float
    ticks: int
    instructions: int
    engines: Mapping[str, Mapping[str, float]]
    opcodes: Mapping[str, int]
    dma_bytes: int
    spill_bytes: int
    spill_s: float
    _core: Any = dataclasses.field(default=None, compare=False, repr=False)
    _trace: _Trace = dataclasses.field(
        default_factory=lambda: _Trace(None, None), compare=False, repr=False
    )

    @classmethod
    def from_core(cls, rep) -> KernelReport:
        """Builds the report from the core's ``KernelReport``."""
        engines = {
            name: {"busy_s": busy, "utilization": util, "instructions": n}
            for name, busy, util, n in rep.queues
        }
        report = cls.from_fields(
            {
                "seconds": rep.seconds,
                "ticks": rep.ticks,
                "instructions": rep.instructions,
                "engines": engines,
                "opcodes": dict(rep.opcodes),
                "dma_bytes": rep.dma_bytes,
                "spill_bytes": rep.spill_bytes,
                "spill_s": rep.spill_s,
            },
            retrace=rep.trace_json,
        )
        object.__setattr__(report, "_core", rep)
        return report

    @functools.cached_property
    def critical_path(self) -> tuple[Mapping[str, Any], ...]:
        """The chain of instructions that ends last, first to last: ``index``, ``opcode``,
        ``engine``, ``start_s``, ``end_s``, ``waited_for`` ("start", "dependency" or "queue")
        and ``on`` (the instruction waited for, or -1)."""
        keys = ("index", "opcode", "engine", "start_s", "end_s", "waited_for", "on")
        return tuple(dict(zip(keys, step, strict=True)) for step in self._core.critical_path)

    def by_line(self) -> tuple[Mapping[str, Any], ...]:
        """Busy time per kernel source line, busiest first (see ``lines_by_source``): ``file``,
        ``line``, ``engines`` (engine -> busy seconds; the DMA queues together as ``"DMA"``),
        ``busy_s``, ``instructions``, ``share`` (of the busy time of all engines and queues).
        Instructions issued outside a kernel (the machine used directly) are one row with
        ``file`` and ``line`` ``None``."""
        return self._lines

    @functools.cached_property
    def _lines(self) -> tuple[Mapping[str, Any], ...]:
        return lines_by_source([self])

    def save_trace(self, path: str | os.PathLike[str]) -> str:
        """As ``TimingReport.save_trace``; a JSON trace is written by the core piece by piece
        (a million instructions never make one string of hundreds of MB), Ctrl-C honoured."""
        path = _validate.path(path, "path")
        if self._core is None or is_protobuf(path):
            return super().save_trace(path)
        self._core.save_trace(path)
        return path

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python data, the critical path and ``by_line()`` included."""
        d = super().to_dict()
        d["critical_path"] = plain(self.critical_path)
        d["lines"] = plain(self.by_line())
        return d

    def _rows(self) -> list[tuple[str, str]]:
        return [
            ("time", _fmt_seconds(self.seconds)),
            ("instructions", f"{self.instructions:,}"),
            *engine_rows(self.engines),
            ("opcodes", ", ".join(f"{k} {v:,}" for k, v in self.opcodes.items()) or "none"),
            ("DMA bytes", f"{self.dma_bytes:,}"),
            *spill_rows(self),
            ("critical path", count(self._core.critical_path_length, "instruction")),
        ]

    def __str__(self) -> str:
        lines = [
            f"NeuronCore timeline: {count(self.instructions, 'instruction')}, "
            f"{_fmt_seconds(self.seconds)}",
            f"  {'engine':<14} {'busy':>12} {'util':>7} {'instructions':>13}",
        ]
        for name, e in self.engines.items():
            lines.append(
                f"  {name:<14} {_fmt_seconds(e['busy_s']):>12} "
                f"{100 * e['utilization']:>6.1f}% {e['instructions']:>13,}"
            )
        ops = ", ".join(f"{k} {v:,}" for k, v in self.opcodes.items())
        lines.append(f"  opcodes: {ops or 'none'}")
        lines.append(f"  DMA bytes: {self.dma_bytes:,}")
        lines.extend(f"  {k}: {v}" for k, v in spill_rows(self))
        lines.append("  critical path: " + count(self._core.critical_path_length, "instruction"))
        lines.extend(line_table(self.by_line()))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"KernelReport(seconds={self.seconds:.6g}, instructions={self.instructions})"


def _engine_of(queue: str) -> str:
    """The engine a per-line row counts a queue under: the DMA queues together."""
    return "DMA" if queue.startswith("DMA") else queue


def lines_by_source(reports) -> tuple[Mapping[str, Any], ...]:
    """Busy time per kernel source line over ``reports`` (one core's, or the physical cores of
    one launch: a line's time is then summed over them), busiest first (ties by file and
    line). Each row: ``file``, ``line`` (``None`` for instructions issued outside a kernel),
    ``engines`` (engine -> busy seconds, the DMA queues together as ``"DMA"``), ``busy_s``
    (their sum), ``instructions``, ``share`` (of all the engines' and queues' busy time).
    Per engine, the rows sum to its busy time (``engines[...]["busy_s"]``): each instruction
    counts what it added to its queue's busy time."""
    rows: dict[tuple, dict[str, Any]] = {}
    for r in reports:
        core = r._core
        if core is None:
            continue
        for file, line, queue, busy, n in core.lines:
            row = rows.get((file, line))
            if row is None:
                row = rows[(file, line)] = {
                    "file": file,
                    "line": line,
                    "engines": {},
                    "busy_s": 0.0,
                    "instructions": 0,
                }
            eng = _engine_of(queue)
            row["engines"][eng] = row["engines"].get(eng, 0.0) + busy
            row["busy_s"] += busy
            row["instructions"] += n
    total = sum(row["busy_s"] for row in rows.values())
    out = []
    for row in rows.values():
        row["share"] = row["busy_s"] / total if total > 0 else 0.0
        row["engines"] = dict(sorted(row["engines"].items(), key=lambda kv: -kv[1]))
        out.append(row)
    out.sort(
        key=lambda row: (-row["busy_s"], row["file"] is None, row["file"] or "", row["line"] or 0)
    )
    return tuple(out)


def line_label(row: Mapping[str, Any], short: bool = False) -> str:
    """``file:line`` of a ``by_line()`` row (``short``: the file's base name), or
    ``(outside a kernel)``."""
    if row["file"] is None:
        return "(outside a kernel)"
    file = os.path.basename(row["file"]) or row["file"] if short else row["file"]
    return f"{file}:{row['line']}"


def line_table(rows, top: int = 5) -> list[str]:
    """The busiest ``top`` lines of ``by_line()`` rows as a report's closing lines (none when
    no instruction has a line)."""
    if not any(row["file"] is not None for row in rows):
        return []
    shown = rows[:top]
    out = [f"  busiest lines ({len(shown)} of {len(rows)}):"]
    for row in shown:
        engines = ", ".join(f"{k} {_fmt_seconds(v)}" for k, v in row["engines"].items() if v > 0)
        out.append(
            f"    {line_label(row, short=True):<24} {_fmt_seconds(row['busy_s']):>10} "
            f"{100 * row['share']:>5.1f}%  {count(row['instructions'], 'instruction')}"
            + (f" ({engines})" if engines else "")
        )
    return out


def engine_rows(engines: Mapping[str, Mapping[str, float]]) -> list[tuple[str, str]]:
    """One ``(engine, "busy, utilisation, instructions")`` row per engine or DMA queue that
    ran something (a report's table)."""
    return [
        (
            f"  {name}",
            f"{_fmt_seconds(e['busy_s'])} busy, {100 * e['utilization']:.1f}%, "
            f"{count(int(e['instructions']), 'instruction')}",
        )
        for name, e in engines.items()
        if e["instructions"]
    ]
