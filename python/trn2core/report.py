"""``Report``: how long the emulated hardware takes (contract section 6).

Every report and result also has ``to_dict()`` (plain, JSON-serialisable data), a one-line
``repr`` (arrays appear as their shape and dtype, never their values) and ``_repr_html_`` (a
small table in Jupyter)."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import _core
from .errors import Trn2ValueError

__all__ = ["Report", "Result", "TimingReport", "save_traces"]


def plain(v: Any) -> Any:
    """``v`` as JSON-serialisable Python data: mappings as dicts, sequences as lists, numpy
    scalars as Python numbers, dtypes as their names, arrays as ``{"shape", "dtype"}`` (a
    summary: the values stay in the result object), reports and results as their ``to_dict()``."""
    if isinstance(v, (str, bool, int, float)) or v is None:
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return {"shape": list(v.shape), "dtype": v.dtype.name}
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, Mapping):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    to_dict = getattr(v, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return str(v)


#: The getters of the core's ``Report`` and ``Uncertainty`` in the order of the facade's dicts:
#: their ``FIELDS`` (rust/trn2core-py/src/perf.rs).
CORE_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(cls.FIELDS) for cls in (_core.Report, _core.Uncertainty)
}


def core_fields(v: Any) -> Any:
    """A ``Report`` or ``Uncertainty`` of the core as the facade's dict: its getters in
    ``CORE_FIELDS`` order, ``details`` (pairs) as a dict, the uncertainty likewise; anything
    else (None, a dict of fields) as it is."""
    names = CORE_FIELDS.get(type(v))
    if names is None:
        return v
    out = {k: core_fields(getattr(v, k)) for k in names}
    if "details" in out:
        out["details"] = dict(out["details"])
    return out


def short(v: Any) -> str:
    """A value in a few characters: an array as ``<bfloat16[128, 512]>``, a sequence of arrays
    as ``[3 x <float32[1024]>]``, anything else by its ``repr``."""
    if isinstance(v, np.ndarray):
        return f"<{v.dtype.name}{list(v.shape)}>"
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, np.ndarray) for x in v):
        kinds = {short(x) for x in v}
        if len(kinds) == 1:
            return f"[{len(v)} x {kinds.pop()}]"
        return "[" + ", ".join(short(x) for x in v) + "]"
    return repr(v)


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``"1 instruction"``,
    ``"1,024 instructions"``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def html_table(title: str, rows: list[tuple[str, str]]) -> str:
    """A small HTML table (Jupyter's ``_repr_html_``): a caption and one row per
    ``(label, text)``; labels indented with spaces keep their indent."""
    body = []
    for k, v in rows:
        indent = len(k) - len(k.lstrip(" "))
        pad = f"padding-left:{indent}em;" if indent else ""
        body.append(
            f'<tr><th style="{pad}text-align:left">{html.escape(k.strip())}</th>'
            f'<td style="text-align:left">{html.escape(str(v))}</td></tr>'
        )
    return (
        f'<table class="trn2core"><caption>{html.escape(title)}</caption>'
        + "".join(body)
        + "</table>"
    )


class Facts:
    """A value described by named facts (``Compressed``, ``SparseTensor``): ``to_dict()``, the
    attributes ``FACTS`` names as plain JSON-serialisable data (arrays as shape and dtype), and
    a Jupyter table of them."""

    __slots__ = ()
    FACTS: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """What it is, as plain JSON-serialisable data."""
        return plain({name: getattr(self, name) for name in self.FACTS})

    def _repr_html_(self) -> str:
        return html_table(type(self).__name__, [(k, str(v)) for k, v in self.to_dict().items()])


class Result:
    """What the result classes (``GemmResult``, ``CollectiveResult``, ``RunResult``, ...)
    share: ``to_dict()`` (arrays as shape and dtype, the report as its ``to_dict()``), a short
    ``repr`` and a Jupyter table. Subclasses are dataclasses declared with ``repr=False``."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain, JSON-serialisable data (arrays summarised by shape and dtype)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def __repr__(self) -> str:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        inner = ", ".join(f"{f.name}={short(getattr(self, f.name))}" for f in fields)
        return f"{type(self).__name__}({inner})"

    def _repr_html_(self) -> str:
        rows: list[tuple[str, str]] = []
        report = None
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, TimingReport):
                report = v
            else:
                rows.append((f.name, short(v)))
        if report is not None:
            rows += report._rows()
        return html_table(type(self).__name__, rows)


class TimingReport:
    """What every report type shares (``Report``, ``CollectiveReport``, ``DmaReport``, ...):
    frozen fields built from the core's, ``to_dict()``, and a Chrome/Perfetto trace computed
    on first use (``trace_json()``, ``save_trace(path)``). Subclasses are frozen dataclasses
    whose last field is ``_trace``."""

    _trace: _Trace

    @classmethod
    def from_fields(
        cls,
        fields: Mapping[str, Any],
        trace_json: str | None = None,
        retrace: Callable[[], str] | None = None,
        **extra: Any,
    ):
        """A report from the core's ``fields`` (a ``_core.Report``, or a mapping; unknown keys
        ignored) and ``extra`` ones; mappings (``details``) are frozen read-only."""
        fields = core_fields(fields)
        names = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        kw = {k: v for k, v in {**fields, **extra}.items() if k in names}
        for k, v in kw.items():
            if isinstance(v, dict):
                kw[k] = types.MappingProxyType(v)
        return cls(**kw, _trace=_Trace(trace_json, retrace))

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain, JSON-serialisable Python data (mappings as dicts)."""
        return {
            f.name: plain(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if not f.name.startswith("_")
        }

    def _rows(self) -> list[tuple[str, str]]:
        """The report's table as ``(label, text)`` rows (``str`` and the Jupyter table)."""
        rows = []
        for k, v in self.to_dict().items():
            if isinstance(v, (dict, list)):
                continue
            rows.append((k, _fmt_seconds(v) if k.endswith("seconds") else str(v)))
        return rows

    def __str__(self) -> str:
        rows = self._rows()
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)

    def _repr_html_(self) -> str:
        return html_table(type(self).__name__, self._rows())

    def trace_json(self) -> str:
        """The Chrome/Perfetto trace as a JSON string (computed on first use)."""
        return self._trace.json()

    def save_trace(self, path: str | os.PathLike[str]) -> str:
        """Writes a Chrome/Perfetto trace (one track per engine, DMA queue or link; ``args`` on
        every slice, bandwidth counter tracks, dependency flows where the report has them) to
        ``path``; returns the path. Open it at https://ui.perfetto.dev or chrome://tracing. A
        path ending in ``.pftrace`` gets Perfetto's protobuf format instead (typed arguments,
        real counter tracks, flows attached to their slices; needs ``trn2core[perfetto]``)."""
        from ._validate import path as _path

        path = _path(path, "path")
        return _write_trace(path, self.trace_json())


@dataclasses.dataclass(frozen=True, repr=False)
class Report(TimingReport):
    """Timing of an operation: prints as a table, ``to_dict()``, ``save_trace(path)``.

    Fields: ``operation`` (what was costed: "gemm", "matmul", "dma"), ``description``,
    ``instructions`` (tensor-engine instructions), ``pe_cycles`` (tensor-engine busy cycles
    summed over instructions), ``cycles`` and ``seconds`` (wall time at the 2.4 GHz PE clock),
    ``flops``, ``tflops`` (over the wall time), ``pe_tflops`` (over the PE-busy time),
    ``peak_tflops``, ``utilization`` (``tflops / peak`` in (0, 1]), ``bound`` ("compute",
    "memory" or "collective"), ``details`` (a breakdown: keys ending in ``_s`` are seconds,
    the others counts such as ``hbm_bytes``) and ``uncertainty``: how far the published
    Trainium2 measurements of this kind of operation were from the model (a dict: every
    published case took between ``low`` and ``high`` times the predicted time, over ``cases``
    cases; ``text`` says it; None where no case is published, e.g. single instructions; see
    docs/fidelity.md).
    """

    operation: str
    description: str
    instructions: int
    pe_cycles: int
    cycles: float
    seconds: float
    flops: float
    tflops: float
    pe_tflops: float
    peak_tflops: float
    utilization: float
    bound: str
    details: Mapping[str, float]
    uncertainty: Mapping[str, Any] | None = None
    _trace: _Trace = dataclasses.field(
        default_factory=lambda: _Trace(None, None), compare=False, repr=False
    )

    def _rows(self) -> list[tuple[str, str]]:
        rows = [("what", self.description or self.operation)]
        rows += [
            ("time", _fmt_time(self.seconds, self.uncertainty)),
            ("cycles (2.4 GHz)", f"{self.cycles:,.0f}"),
            ("instructions", f"{self.instructions:,}"),
            ("PE busy cycles", f"{self.pe_cycles:,}"),
            ("FLOPs", f"{self.flops:.4g}"),
            ("TFLOPS (wall)", f"{self.tflops:.2f}"),
            ("TFLOPS (PE busy)", f"{self.pe_tflops:.2f}"),
            ("utilization", f"{100 * self.utilization:.1f}% of {self.peak_tflops:.1f} TFLOPS"),
            ("bound", self.bound),
        ]
        rows += [(f"  {k}", _fmt_detail(k, v)) for k, v in self.details.items()]
        return rows

    def __repr__(self) -> str:
        return (
            f"Report({self.operation!r}, seconds={self.seconds:.6g}, tflops={self.tflops:.4g}, "
            f"utilization={self.utilization:.3f}, bound={self.bound!r})"
        )


class _Trace:
    """A report's trace: the JSON given, or computed once by ``retrace`` (the timing is run
    again with events recorded only when someone asks for the trace)."""

    def __init__(self, text: str | None, retrace: Callable[[], str] | None) -> None:
        self._text = text
        self._retrace = retrace
        self._lock = threading.Lock()

    def json(self) -> str:
        with self._lock:
            if self._text is None:
                if self._retrace is None:
                    raise Trn2ValueError(
                        "trace: this report has no timeline to trace (a core's report of "
                        "single instructions; estimate_gemm and gemm reports have one)"
                    )
                self._text = self._retrace()
            return self._text


def _fmt_detail(key: str, v: float) -> str:
    """A ``details`` entry: seconds for keys ending in ``_s``, a plain count otherwise."""
    if key.endswith("_s"):
        return _fmt_seconds(v)
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.4g}"


def _fmt_time(seconds: float, uncertainty: Mapping[str, Any] | None) -> str:
    """The time, and the range the published cases of its kind fell in: "9.700 ms, published
    cases within -12%/+8% (17 collective cases)"."""
    t = _fmt_seconds(seconds)
    return f"{t}, {uncertainty['text']}" if uncertainty else t


def _fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.3f} us"
    return f"{s * 1e9:.1f} ns"


def moved_to_process(ev: Mapping[str, Any], pid: int) -> dict[str, Any]:
    """A copy of trace event ``ev`` on process ``pid``; a flow event's ``id`` is made unique
    across processes (each report numbers its flows from 0)."""
    ev = dict(ev)
    ev["pid"] = pid
    if ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int):
        ev["id"] = (pid << 32) + ev["id"]
    return ev


def save_traces(path: str | os.PathLike[str], reports: list[tuple[str, Report]]) -> str:
    """Writes several reports into one Chrome/Perfetto trace, one process per report (named by
    its label), so they can be compared on one timeline; returns the path."""
    from ._validate import path as _path

    path = _path(path, "path")
    events: list[dict[str, Any]] = []
    for pid, (label, rep) in enumerate(reports):
        try:
            text = rep.trace_json()
        except ValueError:
            raise Trn2ValueError(f"{label}: this report has no timeline to trace") from None
        for ev in json.loads(text).get("traceEvents", []):
            ev = moved_to_process(ev, pid)
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                ev["args"] = {"name": label}
            events.append(ev)
    text = json.dumps({"displayTimeUnit": "ns", "traceEvents": events})
    return _write_trace(path, text, events)


def is_protobuf(path: str) -> bool:
    """Whether ``save_trace`` writes ``path`` as Perfetto protobuf (its suffix)."""
    from . import _perfetto

    return str(path).lower().endswith(_perfetto.PROTOBUF_SUFFIXES)


def _write_trace(path: str, text: str, events: list[dict[str, Any]] | None = None) -> str:
    """Writes the trace to ``path``: Perfetto protobuf for a ``.pftrace`` or
    ``.perfetto-trace`` file (the optional ``perfetto`` package; from ``events``, else from
    ``text`` parsed), else the JSON ``text`` as it is (never parsed again: a report's own
    JSON is well formed by construction, and parsing a trace of a million instructions took
    gigabytes and seconds)."""
    from . import _perfetto

    if is_protobuf(path):
        if events is None:
            events = json.loads(text)["traceEvents"]
        data = _perfetto.to_protobuf(events)
        with open(path, "wb") as f:
            f.write(data)
        return path
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
