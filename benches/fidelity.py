"""Every published Trainium2 measurement beside trn2core's prediction of it.

The measurements are data (``benches/fidelity/published.toml``: source, instance, LNC, what was
measured, and how sure we are that it was Trainium2); each is predicted here through
trn2core's public API only: ``nccom_rows`` (what ``trn2core nccom-test`` prints),
``NeuronCore.dma_copy`` and ``estimate_gemm``. Run it as a script::

    python benches/fidelity.py            # the points compared with the model, and a summary
    python benches/fidelity.py --all      # also the repeats, screenshot readings and curves

``factor = max(predicted / published, published / predicted)``: 1 is a perfect prediction,
2 means off by 2x either way. The summary gives the median and the worst factor over the
points marked ``use = "check"``, for the high-confidence points and for high and medium
together. tests/test_fidelity.py and benches/bench_fidelity.py import this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TABLE = Path(__file__).resolve().parent / "fidelity" / "published.toml"
CONFIDENCES = ("high", "medium", "low", "none")


@dataclasses.dataclass(frozen=True)
class Row:
    """One point: the published value, the model's, and how far apart they are."""

    point: dict
    published: float
    predicted: float | None
    unit: str
    algorithm: str | None = None

    @property
    def id(self) -> str:
        return self.point["id"]

    @property
    def ratio(self) -> float | None:
        """predicted / published."""
        if self.predicted is None:
            return None
        return self.predicted / self.published

    @property
    def factor(self) -> float | None:
        """max(p/q, q/p): how many times off, either way (None for a published bound, which
        the prediction should stay under: see ``within_bound``)."""
        r = self.ratio
        if r is None or self.point["kind"] == "bound":
            return None
        return max(r, 1.0 / r)

    @property
    def within_bound(self) -> bool | None:
        """For a published upper bound: whether the prediction is at most the bound."""
        if self.point["kind"] != "bound" or self.predicted is None:
            return None
        return self.predicted <= self.published


def load(path: Path = TABLE) -> tuple[dict, list[dict]]:
    """The sources and the points of the table."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return data["source"], data["point"]


def _np_dtype(name: str):
    import ml_dtypes

    return {
        "bf16": ml_dtypes.bfloat16,
        "fp16": np.float16,
        "fp32": np.float32,
        "uint8": np.uint8,
    }[name]


def _dma_seconds(shape, dtype: str, src: str, dst: str, quantity: str) -> float:
    import trn2core

    x = np.zeros(shape, dtype=_np_dtype(dtype))
    rep = trn2core.NeuronCore(0).dma_copy(x, src=src, dst=dst)
    return rep.details["engines_s"] if quantity == "engine" else rep.seconds


def predict(p: dict) -> Row:
    """The model's prediction of point ``p`` (``predicted`` is None where nothing in trn2core
    predicts it)."""
    import trn2core
    from trn2core.collectives import nccom_rows

    kind = p["kind"]
    if kind == "nccom":
        if p["use"] == "excluded":
            return Row(p, p["time_us"], None, "us")
        r = nccom_rows(p["operation"], p["ranks"], [p["size_bytes"]], p["dtype"], p["lnc"], "auto")
        return Row(p, p["time_us"], r[0]["seconds"] * 1e6, "us", r[0]["algorithm"])
    if kind == "dma":
        s = _dma_seconds(p["shape"], p["dtype"], p["src"], p["dst"], p["quantity"])
        return Row(p, p["time_us"], s * 1e6, "us")
    if kind == "dma_curve":
        s, ref = p["bytes_per_partition"], p["relative_to"]
        rate = s / _dma_seconds([128, s], "uint8", "hbm", "sbuf", "transfer")
        rate_ref = ref / _dma_seconds([128, ref], "uint8", "hbm", "sbuf", "transfer")
        return Row(p, p["relative_throughput"], rate / rate_ref, "x")
    if kind in ("gemm", "bound"):
        if p["use"] == "excluded":
            return Row(p, p["time_us"], None, "us")
        rep = trn2core.estimate_gemm(
            p["m"], p["k"], p["n"], dtype=p["dtype"], perf_mode=p.get("perf_mode", "none")
        )
        return Row(p, p["time_us"], rep.seconds * 1e6, "us")
    return Row(p, p["time_us"], None, "us")


def evaluate(points: list[dict] | None = None) -> list[Row]:
    """Every point of the table with its prediction."""
    if points is None:
        points = load()[1]
    return [predict(p) for p in points]


def checked(rows: list[Row], confidences=("high",)) -> list[Row]:
    """The rows compared with the model (``use = "check"``) of the given confidences."""
    return [r for r in rows if r.point["use"] == "check" and r.point["confidence"] in confidences]


def summary(rows: list[Row], confidences=("high",)) -> dict:
    """``count``, ``median`` and ``worst`` factor, and the ``worst_id``, over the checked rows
    of the given confidences."""
    sel = checked(rows, confidences)
    factors = [r.factor for r in sel]
    worst = max(sel, key=lambda r: r.factor)
    return {
        "count": len(sel),
        "median": statistics.median(factors),
        "worst": worst.factor,
        "worst_id": worst.id,
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "x":
        return f"{v:.3f}"
    return f"{v:.2f}" if v < 1e4 else f"{v:.0f}"


def _factor_text(r: Row) -> str:
    if r.within_bound is not None:
        return "under" if r.within_bound else "OVER"
    return "-" if r.factor is None else f"{r.factor:.2f}"


def table(rows: list[Row], show_all: bool = False) -> str:
    """The rows as a text table (only the checked ones unless ``show_all``)."""
    head = ("point", "conf", "use", "published", "predicted", "unit", "ratio", "factor", "alg")
    lines = [head]
    for r in rows:
        if not show_all and r.point["use"] != "check":
            continue
        alg = ""
        if r.algorithm is not None:
            alg = r.algorithm
            if r.point.get("algorithm"):
                alg += f" (published {r.point['algorithm']})"
        lines.append(
            (
                r.id,
                r.point["confidence"],
                r.point["use"],
                _fmt(r.published, r.unit),
                _fmt(r.predicted, r.unit),
                r.unit,
                "-" if r.ratio is None else f"{r.ratio:.3f}",
                _factor_text(r),
                alg,
            )
        )
    w = [max(len(x[i]) for x in lines) for i in range(len(head))]
    out = []
    for k, x in enumerate(lines):
        out.append(
            "  ".join(
                v.ljust(w[i]) if i in (0, 1, 2, 5, 8) else v.rjust(w[i]) for i, v in enumerate(x)
            ).rstrip()
        )
        if k == 0:
            out.append("  ".join("-" * n for n in w))
    return "\n".join(out)


def report(rows: list[Row]) -> str:
    """The summary lines."""
    out = []
    for label, conf in (("high", ("high",)), ("high+medium", ("high", "medium"))):
        s = summary(rows, conf)
        out.append(
            f"{label:<12} {s['count']:>3} points: median factor {s['median']:.3f}, "
            f"worst {s['worst']:.3f} ({s['worst_id']})"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="also the points not in the summary")
    args = ap.parse_args(argv)
    rows = evaluate()
    print(table(rows, args.all))
    print()
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
