"""``Report``: how long the emulated hardware takes (contract section 6)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = ["Report", "save_traces"]

_FIELDS = (
    "instructions",
    "pe_cycles",
    "cycles",
    "seconds",
    "flops",
    "tflops",
    "pe_tflops",
    "peak_tflops",
    "utilization",
    "bound",
)


class Report:
    """Timing of an operation: prints as a table, ``to_dict()``, ``save_trace(path)``.

    Fields: ``instructions`` (tensor-engine instructions), ``pe_cycles`` (tensor-engine busy
    cycles summed over instructions), ``cycles`` and ``seconds`` (wall time at the 2.4 GHz PE
    clock), ``flops``, ``tflops`` (over the wall time), ``pe_tflops`` (over the PE-busy time),
    ``peak_tflops``, ``utilization`` (``tflops / peak`` in (0, 1]), ``bound`` ("compute",
    "memory" or "collective"), ``details`` (a breakdown: keys ending in ``_s`` are seconds,
    the others counts such as ``hbm_bytes``) and ``uncertainty``: how far the published
    Trainium2 measurements of this kind of operation were from the model (a dict: every
    published case took between ``low`` and ``high`` times the predicted time, over ``cases``
    cases; ``text`` says it; None where no case is published, e.g. single instructions; see
    docs/fidelity.md).
    """

    def __init__(
        self,
        fields: dict[str, Any],
        trace_json: str | None = None,
        retrace: Callable[[], str] | None = None,
    ) -> None:
        self._fields = dict(fields)
        self._fields["details"] = dict(self._fields.get("details", {}))
        self._trace_json = trace_json
        self._retrace = retrace

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_fields"][name]
        except KeyError:
            raise AttributeError(f"Report has no field {name!r}") from None

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (``details`` as a nested dict)."""
        d = dict(self._fields)
        d["details"] = dict(d["details"])
        return d

    def save_trace(self, path: str | os.PathLike[str]) -> str:
        """Writes a Chrome/Perfetto trace (one track per engine) to ``path``; returns the path.

        Open it at https://ui.perfetto.dev or chrome://tracing.
        """
        from ._validate import path as _path

        path = _path(path, "path")
        if self._trace_json is None:
            if self._retrace is None:
                raise ValueError("this report has no timeline to trace")
            self._trace_json = self._retrace()
        json.loads(self._trace_json)  # fail here, not in the viewer, if it were malformed
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._trace_json)
        return os.fspath(path)

    def __str__(self) -> str:
        f = self._fields
        rows = [("what", f.get("description", f.get("kind", "")))]
        rows += [
            ("time", _fmt_time(f)),
            ("cycles (2.4 GHz)", f"{f['cycles']:,.0f}"),
            ("instructions", f"{f['instructions']:,}"),
            ("PE busy cycles", f"{f['pe_cycles']:,}"),
            ("FLOPs", f"{f['flops']:.4g}"),
            ("TFLOPS (wall)", f"{f['tflops']:.2f}"),
            ("TFLOPS (PE busy)", f"{f['pe_tflops']:.2f}"),
            ("utilization", f"{100 * f['utilization']:.1f}% of {f['peak_tflops']:.1f} TFLOPS"),
            ("bound", f["bound"]),
        ]
        rows += [(f"  {k}", _fmt_detail(k, v)) for k, v in f["details"].items()]
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)

    def __repr__(self) -> str:
        f = self._fields
        return (
            f"Report({f.get('kind')!r}, seconds={f['seconds']:.6g}, tflops={f['tflops']:.4g}, "
            f"utilization={f['utilization']:.3f}, bound={f['bound']!r})"
        )


def _fmt_detail(key: str, v: float) -> str:
    """A ``details`` entry: seconds for keys ending in ``_s``, a plain count otherwise."""
    if key.endswith("_s"):
        return _fmt_seconds(v)
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.4g}"


def _fmt_time(fields: dict[str, Any]) -> str:
    """The time, and the range the published cases of its kind fell in: "9.700 ms, published
    cases within -12%/+8% (17 collective cases)"."""
    u = fields.get("uncertainty")
    t = _fmt_seconds(fields["seconds"])
    return f"{t}, {u['text']}" if u else t


def _fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.3f} us"
    return f"{s * 1e9:.1f} ns"


def save_traces(path: str | os.PathLike[str], reports: list[tuple[str, Report]]) -> str:
    """Writes several reports into one Chrome/Perfetto trace, one process per report (named by
    its label), so they can be compared on one timeline; returns the path."""
    events: list[dict[str, Any]] = []
    for pid, (label, rep) in enumerate(reports):
        if rep._trace_json is None:
            if rep._retrace is None:
                raise ValueError(f"{label}: this report has no timeline to trace")
            rep._trace_json = rep._retrace()
        for ev in json.loads(rep._trace_json).get("traceEvents", []):
            ev = dict(ev)
            ev["pid"] = pid
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                ev["args"] = {"name": label}
            events.append(ev)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return os.fspath(path)
