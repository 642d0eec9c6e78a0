"""Roofline plots (optional: ``pip install trn2core[plot]`` brings matplotlib).

``roofline(M, K, N, path, ...)`` draws the roofline of the core a GEMM runs on, the same core
``estimate_gemm`` and ``trn2core gemm`` describe: one NeuronCore by default, or one Logical
NeuronCore of ``lnc`` physical cores. On it: each compute ceiling (fp32; bf16 / fp16 / tf32 /
fp8; fp8 with double_row; 4x structured sparsity) as its own flat line, the core's share of HBM
bandwidth as the slope they meet, and the shape's point (arithmetic intensity = FLOPs / HBM
bytes of its schedule, height = the modelled TFLOPS, the number the table prints). Every number
comes from the core (``LogicalCore.peak_tflops``, ``hbm_bandwidth``) and the cost model.
``roofline_figure`` returns the matplotlib figure instead of writing it.
"""

from __future__ import annotations

import os

from . import _validate
from .chip import Chip
from .engine import estimate_gemm
from .errors import Trn2Error, Trn2ValueError

__all__ = ["breakdown", "pareto", "roofline", "roofline_figure"]

#: One colour per line (matplotlib's tab10), so no two lines share one.
_COLOURS = {
    "hbm": "tab:gray",
    "fp32": "tab:blue",
    "bf16": "tab:orange",
    "double_row": "tab:green",
    "sparse": "tab:red",
}

#: The file formats ``roofline`` writes, by the path's suffix (any case).
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(value: object, arg: str = "path") -> str:
    """``value`` as a path whose suffix names a format ``roofline`` writes (``Trn2ValueError``
    naming ``arg`` otherwise): matplotlib raises a bare ``ValueError`` for an unknown suffix,
    and silently appends ``.png`` to a path without one (so the file named is not the file
    written)."""
    text = _validate.path(value, arg)
    suffix = os.path.splitext(text)[1].lower()
    if suffix not in PLOT_SUFFIXES or not os.path.basename(text)[: -len(suffix)]:
        raise Trn2ValueError(
            f"{arg}: {text!r} does not end in a file name with one of the suffixes "
            f"{', '.join(PLOT_SUFFIXES)} (the plot's format)"
        )
    return text


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise Trn2Error(
            "plot: drawing needs matplotlib, an optional extra: pip install 'trn2core[plot]'"
        ) from None
    return plt


def roofline_figure(
    M: int,
    K: int,
    N: int,
    *,
    dtype: str = "bf16",
    perf_mode: str = "none",
    sparsity: str | None = None,
    lnc: int | None = None,
    throttle: bool = True,
):
    """``(figure, report)``: the roofline of ``[M, K] @ [K, N]`` on one NeuronCore
    (``lnc=None``, as ``estimate_gemm`` without ``core``) or on one Logical NeuronCore of
    ``lnc`` physical cores (as ``estimate_gemm(core=Chip(lnc=lnc).cores[0])``), and the report
    its point is drawn from. The caller owns the figure (``matplotlib.pyplot.close`` it)."""
    plt = _pyplot()
    lc = Chip(lnc=1 if lnc is None else lnc).cores[0]
    rep = estimate_gemm(
        M,
        K,
        N,
        dtype=dtype,
        perf_mode=perf_mode,
        sparsity=sparsity,
        throttle=throttle,
        core=None if lnc is None else lc,
    )
    bw = lc.hbm_bandwidth  # bytes/s: the core's share of HBM
    ceilings = [
        ("fp32", "fp32", lc.peak_tflops("fp32")),
        ("bf16", "bf16 / fp16 / tf32 / fp8", lc.peak_tflops("bf16")),
        ("double_row", "fp8 double_row", lc.peak_tflops("fp8_e4m3", perf_mode="double_row")),
        ("sparse", "4x structured sparsity", lc.peak_tflops("sparse")),
    ]
    intensity = rep.flops / rep.details["hbm_bytes"]
    top = max(p for *_, p in ceilings)
    lo = min(intensity / 10, min(p for *_, p in ceilings) * 1e12 / bw / 10, 1.0)
    hi = max(intensity * 10, top * 1e12 / bw * 10, 1e4)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    # The HBM slope: TFLOPS = intensity x bandwidth, up to the highest ceiling.
    ax.plot(
        [lo, top * 1e12 / bw],
        [lo * bw / 1e12, top],
        color=_COLOURS["hbm"],
        linestyle="--",
        label=f"HBM {bw / 1e9:,.1f} GB/s (slope)",
        gid="hbm",
    )
    for key, label, peak in ceilings:
        ridge = peak * 1e12 / bw  # where the slope reaches this ceiling
        ax.plot(
            [ridge, hi],
            [peak, peak],
            color=_COLOURS[key],
            gid=key,
            label=f"{label}: {peak:,.1f} TFLOPS",
        )
    what = f"{M}x{K}x{N} {dtype}{' ' + sparsity if sparsity else ''}"
    if perf_mode != "none":
        what += f" {perf_mode}"
    ax.plot(
        [intensity],
        [rep.tflops],
        "o",
        color="black",
        markersize=8,
        gid="point",
        label=f"{what}: {rep.tflops:,.1f} TFLOPS, {rep.bound}-bound",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("TFLOPS")
    where = (
        "one NeuronCore"
        if lnc is None
        else f"one logical NeuronCore, LNC={lnc} ({lnc} physical cores)"
    )
    ax.set_title(f"Trainium2 roofline: {where}", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig, rep


def roofline(
    M: int,
    K: int,
    N: int,
    path: str | os.PathLike[str],
    *,
    dtype: str = "bf16",
    perf_mode: str = "none",
    sparsity: str | None = None,
    lnc: int | None = None,
    throttle: bool = True,
):
    """Writes the roofline of ``[M, K] @ [K, N]`` (see ``roofline_figure``: one NeuronCore, or
    one Logical NeuronCore of ``lnc`` cores) to ``path`` (PNG, SVG or PDF by the suffix;
    ``Trn2ValueError`` for any other) and returns the shape's ``Report``, the one its point is
    drawn from."""
    path = check_plot_path(path)
    fig, rep = roofline_figure(
        M, K, N, dtype=dtype, perf_mode=perf_mode, sparsity=sparsity, lnc=lnc, throttle=throttle
    )
    plt = _pyplot()
    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
    return rep


def breakdown(reports, path: str | os.PathLike[str], *, labels=None) -> str:
    """Writes a stacked bar per whole-model step report (``trn2core.workload``: a prefill,
    decode or training step, or a list of them) to ``path`` (PNG, SVG or PDF): the step's
    seconds by component (``StepReport.by_kind``: gemm, attention, norm, collective,
    bubble, optimizer, serving, fixed). matplotlib is checked before anything is drawn;
    returns the path."""
    from .workload import StepReport

    path = check_plot_path(path)
    plt = _pyplot()
    reps = [reports] if isinstance(reports, StepReport) else list(reports)
    if not reps or not all(isinstance(r, StepReport) for r in reps):
        raise Trn2ValueError("reports: expected a workload StepReport or a list of them")
    if labels is None:
        labels = [r.phase for r in reps]
    if len(labels) != len(reps):
        raise Trn2ValueError(f"labels: {len(labels)} labels for {len(reps)} reports")
    parts = [r.by_kind() for r in reps]
    kinds = sorted({k for p in parts for k in p}, key=lambda k: -max(p.get(k, 0) for p in parts))
    fig, ax = plt.subplots(figsize=(2.0 + 1.2 * len(reps), 4.5))
    try:
        bottom = [0.0] * len(reps)
        for i, kind in enumerate(kinds):
            ms = [p.get(kind, 0.0) * 1e3 for p in parts]
            ax.bar(labels, ms, bottom=bottom, label=kind, color=f"C{i % 10}")
            bottom = [b + m for b, m in zip(bottom, ms, strict=True)]
        _finish(fig, ax, path, "", "ms per step", reps[0].model)
    finally:
        plt.close(fig)
    return path


def _finish(fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> None:
    """Labels ``ax``, adds its legend and writes ``fig`` to ``path``."""
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)


def pareto(result, path: str | os.PathLike[str]) -> str:
    """Writes a layout search's result (``trn2core.workload.search``) to ``path`` (PNG, SVG or
    PDF): every layout's time per token (a training search: its step time) against its
    throughput, log-log, with the Pareto front (``SearchResult.pareto``) drawn and labelled.
    matplotlib is checked before anything is drawn; returns the path."""
    from .workload import SearchResult

    path = check_plot_path(path)
    if not isinstance(result, SearchResult):
        raise Trn2ValueError(f"result: expected a workload SearchResult, got {result!r}")
    rows = result.layouts
    if not rows:
        raise Trn2ValueError("result: no layouts to draw (every layout was skipped)")
    plt = _pyplot()
    front = result.pareto()
    fig, ax = plt.subplots(figsize=(7.0, 4.8))
    try:
        ax.scatter(
            [c["itl_s"] * 1e3 for c in rows],
            [c["tokens_per_s"] for c in rows],
            s=10,
            color="tab:gray",
            label=f"{len(rows)} layouts",
        )
        fx = [c["itl_s"] * 1e3 for c in front]
        fy = [c["tokens_per_s"] for c in front]
        ax.plot(fx, fy, marker="o", color="tab:red", label=f"Pareto front ({len(front)})")
        for c, x, y in zip(front, fx, fy, strict=True):
            tag = f"tp{c['tp']} pp{c['pp']} dp{c['dp']} ep{c['ep']} b{c['batch']}"
            ax.annotate(tag, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        xlabel = "ms per output token (training: per step)"
        _finish(fig, ax, path, xlabel, "tokens/s", f"layouts by {result.objective}")
    finally:
        plt.close(fig)
    return path
