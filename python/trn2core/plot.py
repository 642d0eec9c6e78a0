"""Roofline plots (optional: ``pip install trn2core[plot]`` brings matplotlib).

``roofline(M, K, N, ...)`` draws the roofline of one Trainium2 chip (8 NeuronCores, 4 HBM stacks)
for a GEMM shape: the compute ceilings of each operand type (fp32, bf16, fp8 double_row, 4x
structured sparsity), HBM's bandwidth slope, and the shape's point, from ``estimate_gemm`` on a
whole ``Chip`` (arithmetic intensity = FLOPs / HBM bytes of the schedule, height = modelled
TFLOPS). Every number comes from ``trn2core.spec`` and the cost model.
"""

from __future__ import annotations

import os

from . import _validate, spec
from .chip import Chip
from .engine import estimate_gemm
from .errors import Trn2Error, Trn2ValueError

__all__ = ["roofline"]

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
            "plot: the roofline needs matplotlib, an optional extra: pip install 'trn2core[plot]'"
        ) from None
    return plt


def roofline(
    M: int,
    K: int,
    N: int,
    path: str | os.PathLike[str],
    *,
    dtype: str = "bf16",
    perf_mode: str = "none",
    sparsity: str | None = None,
    lnc: int = 2,
):
    """Writes the roofline of ``[M, K] @ [K, N]`` on one chip to ``path`` (PNG, SVG or PDF by
    the suffix; ``Trn2ValueError`` for any other) and returns the shape's ``Report``."""
    path = check_plot_path(path)
    plt = _pyplot()
    chip = Chip(lnc=lnc)
    rep = estimate_gemm(M, K, N, dtype=dtype, perf_mode=perf_mode, sparsity=sparsity, core=chip)
    cores = len(chip.physical_cores)
    bw = spec.hbm_chip_bytes_per_s
    ceilings = [
        ("fp32", spec.core_peak_fp32_flops_per_s),
        ("bf16 / fp16 / fp8", spec.core_peak_bf16_flops_per_s),
        ("fp8 double_row", spec.core_peak_fp8_double_row_flops_per_s),
        ("4x sparse", spec.core_peak_sparse_flops_per_s),
    ]
    intensity = rep.flops / rep.details["hbm_bytes"]
    lo = min(intensity / 10, 1.0)
    hi = max(intensity * 10, 1e4)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for label, peak in ceilings:
        chip_peak = peak * cores
        ax.plot(xs, [min(chip_peak, x * bw) / 1e12 for x in xs], label=f"{label}: "
                f"{chip_peak / 1e12:,.0f} TFLOPS")  # fmt: skip
    ax.plot([intensity], [rep.tflops], "o", color="black", markersize=8)
    ax.annotate(
        f"{M}x{K}x{N} {dtype}{' ' + sparsity if sparsity else ''}\n"
        f"{rep.tflops:,.0f} TFLOPS, {rep.bound}-bound",
        (intensity, rep.tflops), textcoords="offset points", xytext=(10, -30),
    )  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(f"Trainium2 chip roofline (8 NeuronCores, HBM {bw / 1e12:.1f} TB/s, LNC={lnc})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return rep
