"""The NKI parts of the ``trn2core`` CLI: ``trn2core nki run FILE.py::KERNEL --shapes ...``
(run a kernel file written for AWS's NKI on random inputs: its outputs' summary, the emulated
timeline, optionally a Perfetto trace) and the ``nki`` part of ``trn2core demo`` (the matmul
tutorial's stages, their timelines and bottlenecks)."""

from __future__ import annotations

import argparse
import inspect
import math
import re
import sys
import time

import numpy as np

from .. import _validate
from ..errors import Trn2ValueError

__all__ = ["add_commands", "demo_nki", "parse_shape"]

_DTYPE_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "fp8_e4m3": "float8_e4m3",
    "fp8_e5m2": "float8_e5m2",
}


def parse_shape(text: str) -> tuple[tuple[int, ...], str]:
    """``"128x512:bf16"`` -> ``((128, 512), "bfloat16")`` (dtype fp32 by default)."""
    m = re.fullmatch(r"\s*(\d+(?:x\d+)*)\s*(?::\s*([A-Za-z0-9_]+))?\s*", text)
    if not m:
        raise Trn2ValueError(
            f"--shapes: {text!r} is not DIMSxDIMS[:DTYPE] (e.g. 128x512:bf16 or 1024x1024)"
        )
    dims = tuple(int(d) for d in m.group(1).split("x"))
    dtype = m.group(2) or "float32"
    return dims, _DTYPE_ALIASES.get(dtype, dtype)


def _seed(text: str) -> int:
    """``--seed``: a whole number >= 0 (numpy's generator refuses negative seeds)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return v


def _grid(text: str) -> int | tuple[int, ...]:
    """``--grid G[,G2...]``: whole numbers >= 1 (checked against the kernel's dialect by
    ``kernel[...]``)."""
    try:
        g = tuple(int(v) for v in text.split(","))
    except ValueError:
        g = ()
    if not g or any(v < 1 for v in g):
        raise argparse.ArgumentTypeError(
            f"expected whole numbers >= 1 separated by commas (e.g. 2 or 4,2), got {text!r}"
        )
    return g[0] if len(g) == 1 else g


def _value(text: str):
    """A ``--arg NAME=VALUE`` value: int, float, bool or the string itself."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _input_plan(text: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """One ``--shapes`` entry: its shape, its dtype and the bytes making it takes (the host
    check is made on every input's bytes before any is allocated)."""
    from ..nki import _dtypes as D

    shape, name = parse_shape(text)
    dt = D.as_dtype(name, "--shapes")
    n = math.prod(shape)
    if D.is_float(dt):  # drawn as float32, then converted
        host = np.dtype(D.HOST_DTYPE[D.machine_name(dt)])
        return shape, dt, n * (4 + host.itemsize)
    return shape, dt, n * (8 + dt.itemsize)  # drawn as int64, then converted


def _random_input(shape, dt: np.dtype, rng: np.random.Generator) -> np.ndarray:
    from ..nki import _dtypes as D

    if D.is_float(dt):
        host = D.HOST_DTYPE[D.machine_name(dt)]
        return rng.standard_normal(shape, dtype=np.float32).astype(host)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape).astype(dt)


def _check_arity(kernel, name: str, inputs: list, kwargs: dict) -> None:
    """A usage error, before the launch, when ``--shapes`` / ``--arg`` do not match the
    kernel's parameters (the call would fail with Python's TypeError)."""
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):  # no signature to compare with: the launch says
        return
    try:
        sig.bind(*inputs, **kwargs)
    except TypeError as e:
        raise Trn2ValueError(
            f"--shapes: {len(inputs)} arrays and --arg {sorted(kwargs)} do not fit "
            f"{name}{sig} ({e})"
        ) from None


def _summary(x) -> str:
    if isinstance(x, np.ndarray):
        v = x.astype(np.float64)
        return (
            f"{x.dtype} {list(x.shape)}  min {np.nanmin(v):.4g}  max {np.nanmax(v):.4g}  "
            f"mean {np.nanmean(v):.4g}"
        )
    if isinstance(x, (tuple, list)):
        return "; ".join(_summary(v) for v in x)
    return repr(x)


def cmd_nki_run(args: argparse.Namespace) -> int:
    from .. import nki
    from ..nki._examples import load_file

    path, _, name = args.kernel.rpartition("::")
    if not path or not name:
        raise Trn2ValueError(f"KERNEL: expected FILE.py::KERNEL, got {args.kernel!r}")
    mod = load_file(path)
    kernel = getattr(mod, name, None)
    if kernel is None or not callable(kernel):
        found = [k for k, v in vars(mod).items() if isinstance(v, nki.Kernel)]
        raise Trn2ValueError(
            f"KERNEL: {path} has no kernel {name!r}; its @nki.jit kernels: {', '.join(found)}"
        )
    plans = [_input_plan(s) for s in args.shapes or []]
    kwargs = {}
    for kv in args.arg or []:
        key, sep, val = kv.partition("=")
        if not sep:
            raise Trn2ValueError(f"--arg: expected NAME=VALUE, got {kv!r}")
        kwargs[key] = _value(val)
    _check_arity(kernel, name, [None] * len(plans), kwargs)
    _validate.check_alloc(
        sum(b for _, _, b in plans),
        "--shapes",
        f"the random inputs ({' '.join(args.shapes or [])})",
    )
    rng = np.random.default_rng(args.seed)
    inputs = [_random_input(shape, dt, rng) for shape, dt, _ in plans]
    grid = args.grid
    t0 = time.perf_counter()
    res = nki.run(kernel, *inputs, grid=grid, uninitialized=args.uninitialized, **kwargs)
    dt = time.perf_counter() - t0
    print(f"{name}({', '.join(args.shapes or [])}): emulated on this CPU in {dt:.3f} s")
    print(f"outputs: {_summary(res.outputs)}")
    print(res.report)
    if args.trace:
        res.report.save_trace(args.trace)
        print(f"trace written to {args.trace} (open it at https://ui.perfetto.dev)")
    return 0


def add_commands(sub) -> None:
    """Adds ``trn2core nki ...`` to the CLI's subparsers."""
    p = sub.add_parser("nki", help="run NKI kernels (files written for AWS's NKI) on the emulator")
    nsub = p.add_subparsers(dest="nki_command", metavar="SUBCOMMAND")
    r = nsub.add_parser(
        "run",
        help="run FILE.py::KERNEL on random inputs: outputs, timeline, bottleneck",
        description="Imports FILE.py with trn2core's `nki` / `neuronxcc.nki` in place of AWS's, "
        "calls KERNEL on random arrays of the given shapes and prints the emulated timeline.",
    )
    r.add_argument("kernel", metavar="FILE.py::KERNEL")
    r.add_argument(
        "--shapes",
        nargs="*",
        metavar="SHAPE",
        help="one per array argument: DIMSxDIMS[:DTYPE], e.g. 1024x1024:bf16",
    )
    r.add_argument(
        "--arg",
        action="append",
        metavar="NAME=VALUE",
        help="a keyword argument of the kernel (int, float, bool or text)",
    )
    r.add_argument(
        "--grid",
        metavar="G[,G2...]",
        type=_grid,
        help="kernel[G] / kernel[G, G2]: the LNC degree (current dialect) or the "
        "launch grid (legacy)",
    )
    r.add_argument("--seed", type=_seed, default=0, help="seed of the random inputs (>= 0)")
    r.add_argument(
        "--uninitialized",
        choices=("error", "nan"),
        default="error",
        help="never-written memory: an error (default) or NaN as AWS's simulator",
    )
    r.add_argument("--trace", metavar="PATH", help="write a Perfetto trace of the timeline")
    r.set_defaults(func=cmd_nki_run)
    p.set_defaults(func=lambda a: (p.print_help(), 0)[1])


def demo_nki(out=sys.stdout, traces: list | None = None) -> None:
    """The ``nki`` part of ``trn2core demo``: the matmul tutorial's four stages (examples/nki/
    matmul.py, unmodified NKI) on 2048^3 bf16, their bits against ``trn2core.gemm`` and how
    the timeline's bottleneck moves from the DMA queues to the tensor engine."""
    import ml_dtypes

    from .. import gemm, nki
    from ..nki._examples import load

    def p(*a):
        print(*a, file=out)

    p("== NKI kernels: examples/nki/matmul.py (plain NKI, `import nki`) on the emulator ==")
    mm = load("matmul")
    n = 2048
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((n, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    want = gemm(np.ascontiguousarray(lhsT.T), rhs).out
    p(f"   [{n}, {n}] @ [{n}, {n}] bf16, the stages of NKI's matmul tutorial:")
    p(
        f"   {'stage':<22} {'Trainium2':>10} {'PE busy':>8} {'DMA bw':>7}  bottleneck  "
        f"{'bits':>14}  {'emulated in':>11}"
    )
    for stage in mm.STAGES:
        t0 = time.perf_counter()
        res = nki.run(stage, lhsT, rhs)
        dt = time.perf_counter() - t0
        r = res.report
        same = "= gemm" if np.array_equal(res.outputs, want) else "K-block sums"
        p(
            f"   {stage.__name__:<22} {r.seconds * 1e6:8.1f} us {100 * r.utilization('PE'):7.1f}% "
            f"{100 * r.dma_utilization:6.1f}%  {r.bottleneck:<10}  {same:>14}  "
            f"{dt:9.2f} s"
        )
        if traces is not None:
            traces.append((f"nki {stage.__name__}", r))
    p("   (the first three accumulate K in PSUM in order: trn2core.gemm's bits; the last adds")
    p("   its K blocks' float32 partial sums in SBUF: another order, checked in the tests)")
    p("   errors point at the kernel's own line (examples/nki/mistakes.py):")
    bad = load("mistakes")
    try:
        nki.run(bad.carried_exp, np.zeros((128, 64), np.float32))
    except nki.LoopCarriedDependencyError as e:
        file, line = e.nki_location
        p(
            f"   mistakes.py:{line}: {type(e).__name__}: iteration 1 of an affine_range reads "
            "iteration 0's result"
        )
