"""``NkiReport``: the timeline of one kernel launch (one or two physical cores)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from ..machine import (
    KernelReport,
    engine_rows,
    line_label,
    line_table,
    lines_by_source,
    spill_rows,
)
from ..report import TimingReport, _fmt_seconds, _Trace, count, moved_to_process, plain

_COMPUTE = ("PE", "ACT", "DVE", "POOL")


def _dma_share(report: KernelReport, seconds: float) -> float:
    """The share of a core's DMA bandwidth (16 engines x 23 GB/s) its transfers used."""
    from .. import spec

    return report.dma_bytes / (seconds * spec.dma_core_bytes_per_s) if seconds > 0 else 0.0


def _bottleneck(reports, seconds: float) -> str:
    """The busiest resource: PE, ACT, DVE or POOL by busy time, DMA by the larger of its
    bandwidth share and its busiest queue's utilisation (prefixed ``nc<i>`` under LNC=2)."""
    best, score = "none", 0.0
    for i, r in enumerate(reports):
        prefix = f"nc{i} " if len(reports) > 1 else ""
        cands = {k: r.engines[k]["busy_s"] / seconds for k in _COMPUTE if seconds > 0}
        queues = [v["busy_s"] / seconds for k, v in r.engines.items() if k.startswith("DMA")]
        cands["DMA"] = max([_dma_share(r, seconds), *queues])
        for k, v in cands.items():
            if v > score:
                best, score = prefix + k, v
    return best


def _bottleneck_line(reports, bottleneck: str) -> str | None:
    """``file:line`` of the line busiest on the bottleneck (its core's, under LNC=2), or
    ``None`` when no instruction there has a line."""
    if bottleneck == "none":
        return None
    core, _, engine = bottleneck.rpartition(" ")
    rs = [reports[int(core[2:])]] if core else reports
    rows = [row for row in lines_by_source(rs) if row["file"] is not None]
    best = max(rows, key=lambda row: row["engines"].get(engine, 0.0), default=None)
    if best is None or best["engines"].get(engine, 0.0) <= 0:
        return None
    return line_label(best)


@dataclasses.dataclass(frozen=True, repr=False)
class NkiReport(TimingReport):
    """How long Trainium2 takes to run the kernel: ``seconds`` (makespan over the launch's physical
    cores), ``engines`` (per engine and DMA queue, ``busy_s``, ``utilization``, ``instructions``;
    prefixed ``nc0``/``nc1`` under LNC=2), ``opcodes``, ``instructions``, ``dma_bytes``,
    ``dma_utilization`` (the share of a core's DMA bandwidth, 368 GB/s, its transfers used),
    ``bottleneck`` (the busiest resource: PE, ACT, DVE, POOL by busy time, DMA by the larger of
    ``dma_utilization`` and its busiest queue's utilisation), ``bottleneck_line`` (``file:line`` of
    the kernel line busiest on that engine, DMA queues together), ``spill_bytes`` and ``spill_s``
    (the bytes and DMA queue time of the spills of SBUF tensors to HBM and their reloads, legacy
    block arrays and the current dialect's tensors, in ``dma_bytes`` and the DMA queues' time
    too; docs/nki.md), ``by_line()`` (busy time per kernel
    line, summed over the physical cores under LNC=2; ``cores[i].by_line()`` is one core's),
    ``critical_path`` (of the core that ends last), ``cores`` (each core's ``KernelReport``). Prints
    as a table with the busiest lines; ``to_dict()``; ``save_trace(path)`` writes a Perfetto trace
    (one process per physical core, one track per engine and DMA queue, each instruction's kernel
    line as ``args.line``)."""

    seconds: float
    instructions: int
    engines: Mapping[str, Mapping[str, float]]
    opcodes: Mapping[str, int]
    dma_bytes: int
    bottleneck: str
    dma_utilization: float
    lnc: int
    bottleneck_line: str | None = None
    spill_bytes: int = 0
    spill_s: float = 0.0
    cores: tuple[KernelReport, ...] = dataclasses.field(default=(), compare=False)
    _trace: _Trace = dataclasses.field(
        default_factory=lambda: _Trace(None, None), compare=False, repr=False
    )

    @classmethod
    def from_cores(cls, reports: list[KernelReport]) -> NkiReport:
        """The launch's report from each physical core's."""
        if len(reports) == 1:
            r = reports[0]
            engines = {k: dict(v) for k, v in r.engines.items()}
        else:
            engines = {
                f"nc{i} {k}": dict(v) for i, r in enumerate(reports) for k, v in r.engines.items()
            }
        opcodes: dict[str, int] = {}
        for r in reports:
            for k, v in r.opcodes.items():
                opcodes[k] = opcodes.get(k, 0) + v
        seconds = max(r.seconds for r in reports)
        if len(reports) > 1 and seconds > 0:
            for i, r in enumerate(reports):
                for k, v in r.engines.items():
                    engines[f"nc{i} {k}"]["utilization"] = v["busy_s"] / seconds

        def retrace() -> str:
            if len(reports) == 1:
                return reports[0].trace_json()
            events: list[dict[str, Any]] = []
            for pid, r in enumerate(reports):
                for ev in json.loads(r.trace_json()).get("traceEvents", []):
                    ev = moved_to_process(ev, pid)
                    if ev.get("ph") == "M" and ev.get("name") == "process_name":
                        ev["args"] = {"name": f"NeuronCore {pid}"}
                    events.append(ev)
            return json.dumps({"displayTimeUnit": "ns", "traceEvents": events})

        bottleneck = _bottleneck(reports, seconds)
        return cls(
            seconds=seconds,
            instructions=sum(r.instructions for r in reports),
            engines=engines,
            opcodes=opcodes,
            dma_bytes=sum(r.dma_bytes for r in reports),
            spill_bytes=sum(r.spill_bytes for r in reports),
            spill_s=sum(r.spill_s for r in reports),
            bottleneck=bottleneck,
            bottleneck_line=_bottleneck_line(reports, bottleneck),
            dma_utilization=max(_dma_share(r, seconds) for r in reports),
            lnc=len(reports),
            cores=tuple(reports),
            _trace=_Trace(None, retrace),
        )

    @functools.cached_property
    def critical_path(self) -> tuple[Mapping[str, Any], ...]:
        """The chain of instructions that ends last (on the core that ends last)."""
        last = max(self.cores, key=lambda r: r.seconds)
        return last.critical_path

    def by_line(self) -> tuple[Mapping[str, Any], ...]:
        """Busy time per kernel source line, busiest first: ``file``, ``line``, ``engines``
        (engine -> busy seconds, the DMA queues together as ``"DMA"``), ``busy_s``,
        ``instructions``, ``share`` (of all engines' busy time). Under LNC=2 a line's time is
        summed over both physical cores (engines named without ``nc0``/``nc1``; one core's:
        ``cores[i].by_line()``)."""
        return self._lines

    @functools.cached_property
    def _lines(self) -> tuple[Mapping[str, Any], ...]:
        return lines_by_source(self.cores)

    def utilization(self, engine: str) -> float:
        """Busy fraction of ``engine`` ("PE", "ACT", "DVE", "POOL", or a DMA queue's name)."""
        return float(self.engines[engine]["utilization"])

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain, JSON-serialisable Python data, the critical path included."""
        return plain(
            {
                "seconds": self.seconds,
                "instructions": self.instructions,
                "engines": self.engines,
                "opcodes": self.opcodes,
                "dma_bytes": self.dma_bytes,
                "spill_bytes": self.spill_bytes,
                "spill_s": self.spill_s,
                "bottleneck": self.bottleneck,
                "bottleneck_line": self.bottleneck_line,
                "dma_utilization": self.dma_utilization,
                "lnc": self.lnc,
                "critical_path": self.critical_path,
                "lines": self.by_line(),
            }
        )

    def _rows(self) -> list[tuple[str, str]]:
        return [
            ("time", _fmt_seconds(self.seconds)),
            ("NeuronCores", str(self.lnc)),
            ("instructions", f"{self.instructions:,}"),
            ("bottleneck", self._bottleneck_text()),
            *engine_rows(self.engines),
            ("opcodes", ", ".join(f"{k} {v:,}" for k, v in self.opcodes.items()) or "none"),
            (
                "DMA bytes",
                f"{self.dma_bytes:,} ({100 * self.dma_utilization:.1f}% of the DMA bandwidth)",
            ),
            *spill_rows(self),
            ("critical path", count(len(self.critical_path), "instruction")),
        ]

    def __str__(self) -> str:
        lines = [
            f"NKI kernel on {self.lnc} NeuronCore{'s' if self.lnc > 1 else ''}: "
            f"{_fmt_seconds(self.seconds)}, {count(self.instructions, 'instruction')}, bottleneck "
            f"{self._bottleneck_text()}",
            f"  {'engine':<16} {'busy':>12} {'util':>7} {'instructions':>13}",
        ]
        for name, e in self.engines.items():
            if e["instructions"] == 0 and "DMA" in name:
                continue
            lines.append(
                f"  {name:<16} {_fmt_seconds(e['busy_s']):>12} "
                f"{100 * e['utilization']:>6.1f}% {int(e['instructions']):>13,}"
            )
        ops = ", ".join(f"{k} {v:,}" for k, v in self.opcodes.items())
        lines.append(f"  opcodes: {ops or 'none'}")
        lines.append(
            f"  DMA bytes: {self.dma_bytes:,} ({100 * self.dma_utilization:.1f}% of the DMA "
            "bandwidth)"
        )
        lines.extend(f"  {k}: {v}" for k, v in spill_rows(self))
        lines.append(f"  critical path: {len(self.critical_path):,} instructions")
        lines.extend(line_table(self.by_line()))
        return "\n".join(lines)

    def _bottleneck_text(self) -> str:
        at = self.bottleneck_line
        if at is None:
            return self.bottleneck
        return f"{self.bottleneck} (busiest line {os.path.basename(at) or at})"

    def __repr__(self) -> str:
        return (
            f"NkiReport(seconds={self.seconds:.6g}, instructions={self.instructions}, "
            f"bottleneck={self.bottleneck!r})"
        )
