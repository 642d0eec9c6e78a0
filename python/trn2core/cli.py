"""The ``trn2core`` command line (also ``python -m trn2core``).

Subcommands: ``demo`` (the main job: a tour of what trn2core computes), ``formats`` (the number
formats) and ``spec`` (the hardware constants). Later parts add ``gemm``, ``ls`` and
``nccom-test`` in the manner of the Neuron tools.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import __version__, spec
from .numerics import FORMATS, ROUNDING_MODES, format_info, quantize


def _formats_table() -> str:
    rows = [
        ("format", "layout", "bias", "max", "min normal", "min subnormal", "Inf", "numpy dtype")
    ]
    for f in FORMATS:
        i = format_info(f)
        rows.append(
            (
                f,
                f"1-{i.exponent_bits}-{i.mantissa_bits}",
                str(i.bias),
                f"{i.max:.6g}",
                f"{i.min_normal:.6g}",
                f"{i.min_subnormal:.6g}",
                "yes" if i.has_inf else "no",
                str(i.dtype),
            )
        )
    return _table(rows)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def demo_numerics(out=sys.stdout) -> None:
    """The numerics part of the demo."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p("== Number formats (Trainium2 NeuronCore-v3) ==")
    p(_formats_table())
    p()
    p("== One value, every rounding mode: x = 1.0625 into fp8_e4m3, a tie between 1.0 and 1.125 ==")
    x = np.array([1.0625, -1.0625])
    rows = [("rounding", "x", "-x")]
    for mode in ROUNDING_MODES:
        kw = {"seed": 7} if mode == "stochastic" else {}
        q = quantize(x, "fp8_e4m3", rounding=mode, **kw).astype(np.float64)
        rows.append((mode, f"{q[0]:g}", f"{q[1]:g}"))
    p(_table(rows))
    p()
    p("== Overflow: 300.0 in the two E4M3 flavours ==")
    big = np.array([300.0])
    rows = [("format", "saturate=False", "saturate=True")]
    for f in ("fp8_e4m3", "fp8_e4m3fn"):
        a = quantize(big, f).astype(np.float64)[0]
        b = quantize(big, f, saturate=True).astype(np.float64)[0]
        rows.append((f, f"{a:g}", f"{b:g}"))
    p(_table(rows))
    p("   (Neuron's fp8_e4m3 tops out at 240 with Inf; OCP e4m3fn at 448 with no Inf.)")
    p()
    p("== Stochastic rounding (the Neuron docs' example): fp16 a = 1024, then 2048 x (a += 0.5) ==")
    runs = 1000
    a_rne = np.full(runs, 1024.0, np.float16)
    a_sr = a_rne.copy()
    for step in range(2048):
        a_rne = quantize(a_rne.astype(np.float64) + 0.5, "fp16")
        a_sr = quantize(a_sr.astype(np.float64) + 0.5, "fp16", rounding="stochastic", seed=step)
    p(f"   nearest_even: {float(a_rne[0]):g}   (every run: the 0.5 is lost each time)")
    p(
        f"   stochastic  : mean {a_sr.astype(np.float64).mean():.1f} over {runs} runs "
        f"(exact answer 2048; seeded, so reproducible)"
    )
    p()
    p("== Speed: float32 -> fp8_e4m3, round to nearest even, 4 Mi elements ==")
    rng = np.random.default_rng(0)
    v = rng.standard_normal(1 << 22, dtype=np.float32)
    t = _best(lambda: quantize(v, "fp8_e4m3"))
    line = f"   trn2core: {v.size / t / 1e6:,.0f} Melem/s"
    try:
        import ml_dtypes

        tm = _best(lambda: v.astype(ml_dtypes.float8_e4m3), repeat=3)
        line += f"   ml_dtypes astype: {v.size / tm / 1e6:,.0f} Melem/s   ratio {tm / t:.1f}x"
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency
        pass
    p(line)
    ts = _best(lambda: quantize(v, "fp8_e4m3", rounding="stochastic", seed=1))
    p(f"   stochastic rounding (seeded): {v.size / ts / 1e6:,.0f} Melem/s")


def _best(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


#: The parts of ``trn2core demo``, in order; each prints to the stream it is given.
DEMO_PARTS = [("numerics", demo_numerics)]


def cmd_demo(args: argparse.Namespace) -> int:
    print(f"trn2core {__version__}: an AWS Trainium2 emulator on this CPU\n")
    for name, part in DEMO_PARTS:
        if args.only and name not in args.only:
            continue
        part(sys.stdout)
        print()
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    print(_formats_table())
    return 0


def cmd_spec(args: argparse.Namespace) -> int:
    print(spec.table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trn2core",
        description="Bit-exact AWS Trainium2 emulator: numbers and timing on the CPU.",
    )
    parser.add_argument("--version", action="version", version=f"trn2core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="a tour of what trn2core computes (the main job)")
    d.add_argument(
        "--only", nargs="*", choices=[n for n, _ in DEMO_PARTS], help="run only these parts"
    )
    d.set_defaults(func=cmd_demo)
    sub.add_parser("formats", help="the number formats").set_defaults(func=cmd_formats)
    sub.add_parser("spec", help="the hardware constants and their sources").set_defaults(
        func=cmd_spec
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `trn2core spec | head`
        return 0
