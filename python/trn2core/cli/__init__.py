"""The ``trn2core`` command line (also ``python -m trn2core``).

Subcommands: ``demo`` (the main job: a tour of what trn2core computes), ``formats`` (the number
formats), ``spec`` (the hardware constants and their sources), ``docs`` (the guides), and
``gemm``, ``ls``, ``nccom-test``, ``nki run`` and ``estimate`` in the manner of the Neuron tools.
The package's modules: ``nccom`` (``ls``, ``nccom-test``), ``check`` (``nccom-test --check`` on
data), ``nki`` (``nki run``), ``workload`` (``estimate``); this module builds the parser and
runs ``main``.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
import time

import numpy as np

from .. import __version__, _validate, spec
from .._progress import Progress
from ..errors import CapacityError, Trn2Error, Trn2ValueError
from ..numerics import FORMATS, ROUNDING_MODES, format_info, quantize
from ..sparsity import SPARSITY_PATTERNS
from ..testing import best_of
from .nccom import add_commands as add_collective_commands
from .nccom import bare_check, demo_collectives
from .nki import add_commands as add_nki_commands
from .nki import demo_nki
from .workload import add_commands as add_workload_commands


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


def demo_numerics(out=sys.stdout, traces: list | None = None) -> None:
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
    return best_of(fn, repeat)


def demo_tensor_engine(out=sys.stdout, traces: list | None = None) -> None:
    """The tensor-engine part of the demo."""
    from .. import reference
    from ..engine import estimate_gemm, gemm

    p = lambda *a: print(*a, file=out)  # noqa: E731
    m, k, n = 512, 2048, 1024
    p(f"== Tensor engine: a {m}x{k} @ {k}x{n} bf16 GEMM, bit-exact, with its Trn2 timing ==")
    rng = np.random.default_rng(0)
    a = quantize(rng.standard_normal((m, k)), "bf16")
    b = quantize(rng.standard_normal((k, n)), "bf16")
    res = gemm(a, b)
    if traces is not None:
        traces.append((f"bf16 GEMM {m}x{k}x{n}", res.report))
    ref = reference.gemm(a[:16], b)
    same = np.array_equal(res.out[:16].view(np.uint32), ref.view(np.uint32))
    naive = (a[:16].astype(np.float32) @ b.astype(np.float32)).view(np.uint32)
    differ = int(np.count_nonzero(naive != res.out[:16].view(np.uint32)))
    p(f"   first 16 rows equal trn2core.reference (PSUM order) bit for bit: {same}")
    p(f"   ...and differ from numpy's float32 matmul in {differ} of {16 * n} elements")
    p(str(res.report))
    p()
    p("== Same shape, other formats (timing only, no data) ==")
    rows = [("dtype", "perf_mode", "time", "TFLOPS", "utilization")]
    for dt, pm in (("fp32", "none"), ("bf16", "none"), ("fp8_e4m3", "double_row")):
        r = estimate_gemm(m, k, n, dtype=dt, perf_mode=pm)
        rows.append(
            (dt, pm, f"{r.seconds * 1e6:.2f} us", f"{r.tflops:.1f}", f"{r.utilization:.1%}")
        )
    p(_table(rows))
    big = estimate_gemm(16384, 16384, 16384, dtype="bf16")
    p(f"   16384^3 bf16: {big.seconds * 1e3:.2f} ms on one NeuronCore, {big.tflops:.1f} TFLOPS")
    p()
    p("== Emulation speed: bit-exact bf16 GEMM 1024^3 on this CPU vs numpy float32 sgemm ==")
    a = quantize(rng.standard_normal((1024, 1024)), "bf16")
    b = quantize(rng.standard_normal((1024, 1024)), "bf16")
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    bar = Progress("timing GEMMs", 2)
    t_np = _best(lambda: a32 @ b32)
    bar.step()
    t_us = _best(lambda: gemm(a, b))
    bar.step()
    bar.close()
    p(
        f"   trn2core {2 * 1024**3 / t_us / 1e9:.0f} GFLOP/s, numpy sgemm "
        f"{2 * 1024**3 / t_np / 1e9:.0f} GFLOP/s: {t_np / t_us:.2f}x of sgemm's speed"
    )


def demo_sparsity(out=sys.stdout, traces: list | None = None) -> None:
    """The structured-sparsity part of the demo."""
    from ..engine import gemm
    from ..sparsity import compress, prune

    p = lambda *a: print(*a, file=out)  # noqa: E731
    m, k, n = 512, 3072, 1024  # K a multiple of every M (4:12 too)
    p(f"== Structured sparsity: a {m}x{k} bf16 weight pruned N:M along K, times {k}x{n} ==")
    rng = np.random.default_rng(1)
    w = quantize(rng.standard_normal((m, k)), "bf16")
    x = quantize(rng.standard_normal((k, n)), "bf16")
    dense = gemm(w, x)
    rows = [
        (
            "pattern",
            "nbytes",
            "of dense",
            "PE cycles",
            "Trn2 time",
            "speed-up",
            "bound",
            "same bits",
        )
    ]
    rows.append(
        (
            "dense",
            f"{w.nbytes:,}",
            "100%",
            f"{dense.report.pe_cycles:,}",
            f"{dense.report.seconds * 1e6:.2f} us",
            "1.00x",
            dense.report.bound,
            "-",
        )
    )
    bar = Progress("sparse GEMMs", len(SPARSITY_PATTERNS))
    for pat in SPARSITY_PATTERNS:
        bar.step()
        pruned = prune(w, pat, axis=1)
        sp = compress(pruned, pat, axis=1)
        res = gemm(sp, x)
        same = np.array_equal(res.out, gemm(pruned, x).out)
        if pat == "4:16":
            if traces is not None:
                traces.append((f"4:16-sparse GEMM {m}x{k}x{n}", res.report))
        rows.append(
            (
                pat,
                f"{sp.nbytes:,}",
                f"{sp.nbytes / w.nbytes:.0%}",
                f"{res.report.pe_cycles:,}",
                f"{res.report.seconds * 1e6:.2f} us",
                f"{dense.report.seconds / res.report.seconds:.2f}x",
                res.report.bound,
                str(same),
            )
        )
    bar.close()
    p(_table(rows))
    p("   nbytes = stored values + packed positions (ceil(log2 M) bits each; docs/sparsity.md)")
    p("   'same bits': the sparse GEMM equals the dense GEMM of the pruned matrix")
    sp = compress(prune(w, "2:4", axis=1), "2:4", axis=1)
    vals, meta = sp.to_cutlass()
    p(
        f"   2:4 export to PyTorch's CUTLASS layout: values {vals.shape} {vals.dtype}, "
        f"meta {meta.shape} {meta.dtype}"
    )


def demo_dma(out=sys.stdout, traces: list | None = None) -> None:
    """The DMA / inline-compression / memory part of the demo."""
    from .. import dma
    from ..engine import NeuronCore
    from ..errors import CapacityError

    p = lambda *a: print(*a, file=out)  # noqa: E731
    rows_, cols = 128, 32768  # one SBUF tile: 128 partitions x 64 KiB of bf16 (8 MiB)
    bf16 = quantize(np.zeros(1), "bf16").dtype
    rng = np.random.default_rng(0)
    tensors = {
        "ReLU activations": np.maximum(rng.standard_normal((rows_, cols), np.float32), 0),
        "weights N(0, 0.02)": 0.02 * rng.standard_normal((rows_, cols), np.float32),
    }
    tensors = {k: v.astype(bf16) for k, v in tensors.items()}
    core = NeuronCore()
    p(
        f"== DMA with inline compression: a {rows_} x {cols} bf16 tile (8 MiB) HBM -> SBUF on "
        "one NeuronCore's 16 DMA engines =="
    )
    rows = [("data", "codec", "ratio", "HBM bytes", "bit-exact", "local HBM", "other die's HBM")]
    for name, x in tensors.items():
        for codec in dma.CODECS:
            blob = dma.compress(x, codec)
            same = dma.decompress(blob).view(np.uint16).tobytes() == x.view(np.uint16).tobytes()
            near = core.dma_copy(x, src="hbm", codec=codec)
            far = core.dma_copy(x, src="hbm_remote", codec=codec)
            rows.append(
                (
                    name,
                    codec,
                    f"{blob.ratio:.2f}",
                    f"{near.wire_bytes / 2**20:.2f} MiB",
                    "yes" if same else "NO",
                    f"{near.seconds * 1e6:.1f} us",
                    f"{far.seconds * 1e6:.1f} us",
                )
            )
    p(_table(rows))
    engines = spec.dma_engines_per_core * spec.dma_engine_bytes_per_s
    stack = spec.hbm_stack_bytes_per_s
    p(
        f"   One core's {spec.dma_engines_per_core} DMA engines move at most {engines / 1e9:.0f} "
        f"GB/s, about its share of an HBM stack ({stack / 1e9:.0f} GB/s for two cores):\n"
        "   compression saves HBM bytes (bandwidth left for the neighbouring core) but time only "
        "where HBM is the limit,\n   as from the other die's HBM (NUMA, an assumption: "
        f"{spec.numa_remote_bandwidth_factor:g} x {stack / 1e9:.0f} GB/s, "
        f"+{spec.numa_remote_extra_latency_s * 1e6:g} us)."
    )
    p()
    p("== Memory: capacities, and a tensor that does not fit ==")
    p(f"   {core.hbm}\n   {core.sbuf}\n   {core.psum}")
    tile = core.alloc((rows_, cols), "bf16")
    p(f"   core.alloc((128, 32768), 'bf16') -> {tile}")
    big = np.zeros((128, 80 * 1024), np.float32)  # 40 MiB
    try:
        core.dma_copy(big, dst="sbuf")
    except CapacityError as e:
        p(f"   core.dma_copy(<40 MiB fp32>, dst='sbuf') -> CapacityError:\n      {e}")
    core.free(tile)
    p()
    p("== Speed of the codecs on this CPU: zvc on 32 MiB of ReLU activations (fp32) ==")
    x = np.maximum(rng.standard_normal(1 << 23, dtype=np.float32), 0)
    dst = np.empty_like(x)
    t_copy = _best(lambda: np.copyto(dst, x))
    blob = dma.compress(x, "zvc")
    t_c = _best(lambda: dma.compress(x, "zvc"))
    t_d = _best(lambda: dma.decompress(blob))
    gb = x.nbytes / 1e9
    p(
        f"   compress {gb / t_c:.1f} GB/s, decompress {gb / t_d:.1f} GB/s, numpy copyto "
        f"{gb / t_copy:.1f} GB/s (ratio {blob.ratio:.2f}; every stream CRC32C-checked)"
    )


#: The parts of ``trn2core demo``, in order; each prints to the stream it is given and adds
#: the reports worth a timeline to ``traces`` (written at the end with ``--trace``).
DEMO_PARTS = [
    ("numerics", demo_numerics),
    ("tensor-engine", demo_tensor_engine),
    ("sparsity", demo_sparsity),
    ("dma", demo_dma),
    ("collectives", demo_collectives),
    ("nki", demo_nki),
]


def cmd_demo(args: argparse.Namespace) -> int:
    from ..report import save_traces

    print(f"trn2core {__version__}: an AWS Trainium2 emulator on this CPU\n")
    t0 = time.perf_counter()
    traces: list = []
    for name, part in DEMO_PARTS:
        if args.only and name not in args.only:
            continue
        part(sys.stdout, traces)
        print()
    if traces and args.trace:
        path = save_traces(args.trace, traces)
        print(f"== Trace: {len(traces)} timelines written to {path} ==")
        print("   open it at https://ui.perfetto.dev (Open trace file) or chrome://tracing;")
        print("   each emulated operation is a process, each engine / DMA queue / link a track.")
    elif traces:
        print(
            f"(`trn2core demo --trace PATH` writes these {len(traces)} timelines as one "
            "Perfetto trace)"
        )
    print(f"\n(demo took {time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    print(_formats_table())
    return 0


def cmd_spec(args: argparse.Namespace) -> int:
    import json

    known = {e.name: e for e in spec.entries()}
    picked: list[str] = []
    for n in args.names:
        # An exact name, else every constant whose name contains it (`trn2core spec hbm`).
        found = [n] if n in known else [k for k in known if n.lower() in k]
        if not found:
            close = difflib.get_close_matches(n, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise Trn2ValueError(
                f"NAME: unknown constant {n!r}, and no constant's name contains "
                f"it{hint}; `trn2core spec` lists all {len(known)}"
            )
        picked += [k for k in found if k not in picked]
    chosen = [known[n] for n in picked] if args.names else list(known.values())
    if args.sources:
        order = [s.tag for s in spec.sources()]
        tags = sorted({t for e in chosen for t in e.tags}, key=order.index) if args.names else None
        picked = [spec.source(t) for t in tags] if tags else spec.sources()
        if args.json:
            print(json.dumps([s._asdict() for s in picked], indent=1))
        else:
            print(spec.sources_table(tags))
    elif args.json:
        print(json.dumps([e._asdict() for e in chosen], indent=1))
    elif args.names:
        for e in chosen:
            print(f"{e.name} = {e.text}  ({e.value!r} {e.unit})")
            print(f"  {e.doc}")
            st = next(s for s in spec.statuses() if s.letter == e.status)
            print(f"  source {e.source}; {st.letter} = {st.name}: {st.meaning}")
            if e.note:
                print(
                    textwrap.fill(
                        e.note,
                        95,
                        initial_indent="  note: ",
                        subsequent_indent="    ",
                        break_on_hyphens=False,
                    )
                )
            for s in e.sources:
                print(f"  [{s.tag}] {s.title}: {s.url or '(no public address)'}")
    else:
        print(spec.table())
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from .. import _guides

    if not args.guide:
        print(_guides.listing())
        return 0
    text = _guides.read(args.guide)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _gemm_shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """M, K, N from ``MxKxN`` or ``-m/-k/-n`` (one way, not both), each a whole number >= 1."""
    flags = (args.m, args.k, args.n)
    if args.shape is not None:
        if any(v is not None for v in flags):
            raise _Usage("give the shape as MxKxN or as -m M -k K -n N, not both")
        return args.shape
    missing = [f"-{x}" for x, v in zip("mkn", flags, strict=True) if v is None]
    if missing:
        raise _Usage(
            f"the GEMM's shape is missing {', '.join(missing)}: give MxKxN (e.g. 4096x4096x4096) "
            "or -m M -k K -n N"
        )
    return flags  # type: ignore[return-value]


def cmd_gemm(args: argparse.Namespace) -> int:
    import json

    from ..chip import default_lnc
    from ..engine import estimate_gemm, gemm
    from ..sparsity import compress, prune

    m, k, n = _gemm_shape(args)
    lnc = args.lnc if args.lnc is not None else default_lnc()
    where = "one NeuronCore" if lnc == 1 else f"one logical NeuronCore (LNC={lnc})"
    # Optional dependencies are checked before any work (not after a long emulation).
    if args.plot:
        from ..plot import _pyplot

        _pyplot()
    if args.trace:
        from .._perfetto import require_for

        require_for(args.trace)
    rep = estimate_gemm(
        m,
        k,
        n,
        dtype=args.dtype,
        perf_mode=args.perf_mode,
        sparsity=args.sparsity,
        throttle=not args.no_throttle,
        lnc=lnc,
    )
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    run = None
    if not args.json:
        print(rep, flush=True)  # the model's answer at once; --run then computes the bits
    if args.run:
        # Refused before anything is made: the float32 data, its quantized copy and the result.
        elems = m * k + k * n
        _validate.check_alloc(
            8 * elems + 4 * m * n,
            "--m/--k/--n",
            f"--run on {m} x {k} x {n} random data",
        )
        with Progress(f"emulating the {m}x{k}x{n} GEMM", 3, unit="stage") as bar:
            rng = np.random.default_rng(args.seed)
            a = quantize(rng.standard_normal((m, k), dtype=np.float32), args.dtype)
            b = quantize(rng.standard_normal((k, n), dtype=np.float32), args.dtype)
            if args.sparsity:
                a = compress(prune(a, args.sparsity, axis=1), args.sparsity, axis=1)
            bar.step()
            t0 = time.perf_counter()
            res = gemm(
                a,
                b,
                dtype=None if args.sparsity else args.dtype,
                perf_mode=args.perf_mode,
                throttle=not args.no_throttle,
                lnc=lnc,
            )
            dt = time.perf_counter() - t0
            bar.step(2)
        rep = res.report
        run = {"emulated_s": dt, "gflop_per_s": rep.flops / dt / 1e9, "seed": args.seed}
        say(f"emulated bit-exactly on this CPU in {dt:.3f} s ({rep.flops / dt / 1e9:.1f} GFLOP/s)")
        if args.out:
            np.save(args.out, res.out)
            run["out"] = args.out
            say(f"the {m} x {n} fp32 result written to {args.out} (numpy .npy)")
    elif args.out:
        raise _Usage("--out saves the computed bits: add --run")
    if args.trace:
        rep.save_trace(args.trace)
        say(f"trace written to {args.trace} (open it at https://ui.perfetto.dev)")
    if args.plot:
        from ..plot import roofline

        roofline(
            m,
            k,
            n,
            args.plot,
            dtype=args.dtype,
            perf_mode=args.perf_mode,
            sparsity=args.sparsity,
            lnc=None if lnc == 1 else lnc,
            throttle=not args.no_throttle,
        )
        say(f"roofline of this shape on {where} written to {args.plot}")
    if args.json:
        out = {
            "m": m,
            "k": k,
            "n": n,
            "dtype": args.dtype,
            "perf_mode": args.perf_mode,
            "sparsity": args.sparsity,
            "lnc": lnc,
            "core": where,
            "report": rep.to_dict(),
            "run": run,
            "trace": args.trace,
            "plot": args.plot,
        }
        print(json.dumps(out, indent=1))
    return 0


class _Usage(Exception):
    """A usage error found after parsing: printed with the subcommand's usage, exit status 2."""


def _gemm_dims(text: str) -> tuple[int, int, int]:
    """``MxKxN`` (``4096x4096x4096``; ``X`` and ``*`` also separate): three whole numbers >= 1."""
    parts = text.lower().replace("*", "x").split("x")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(
            f"expected MxKxN such as 4096x4096x4096 (rows of a, contraction, columns of b), "
            f"got {text!r}"
        )
    return tuple(_dim(name)(p) for name, p in zip("MKN", parts, strict=True))  # type: ignore[return-value]


def _dim(name: str):
    """A GEMM dimension: a whole number from 1 to 2**64 - 1, refused in plain words."""

    def parse(text: str) -> int:
        try:
            v = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number of at least 1, got {text!r}"
            ) from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {v}")
        if v > _validate.U64_MAX:
            raise argparse.ArgumentTypeError(
                f"{name} must be at most {_validate.U64_MAX:,} (2**64 - 1), got {v:,}"
            )
        return v

    return parse


def _tensor_engine_formats() -> tuple[str, ...]:
    """The formats the tensor engine accepts, as the core answers (OCP fp8_e4m3fn is refused by
    Trainium2's engine, so `gemm --dtype` does not offer it)."""
    from ..engine import estimate_gemm

    ok = []
    for f in FORMATS:
        try:
            estimate_gemm(128, 128, 128, dtype=f)
        except Trn2Error:
            continue
        ok.append(f)
    return tuple(ok)


def _format(text: str) -> str:
    """A format as users write it (``bfloat16``, ``float8_e5m2``, ``torch.float16``): its
    trn2core name, which argparse's ``choices`` then checks."""
    from ..dtypes import format_name

    try:
        return format_name(text, "dtype")
    except Trn2Error:
        return text  # argparse reports it as an invalid choice, listing the choices


def _plot_path(text: str) -> str:
    """``--plot``: a path ending in .png, .svg or .pdf (checked before any work is done)."""
    from ..plot import check_plot_path

    try:
        return check_plot_path(text, "PNG")
    except Trn2Error as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("PNG: ")) from None


def _seed(text: str) -> int:
    """A seed for numpy's generator: a whole number >= 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {v}")
    return v


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
    d.add_argument(
        "--trace",
        metavar="PATH",
        help="also write a Perfetto trace of the demo's operations to PATH (nothing by default)",
    )
    d.set_defaults(func=cmd_demo)
    g = sub.add_parser(
        "gemm",
        help="how long a GEMM takes on one logical NeuronCore (and, with --run, its bits)",
        description="How long [M, K] @ [K, N] takes on one Logical NeuronCore (--lnc, else "
        "NEURON_LOGICAL_NC_CONFIG, else 2), and with --run its exact bits. Exit status: 0, 1 "
        "when the model refuses (beyond the host's memory or the model's limits), 2 for a "
        "usage error.",
    )
    g.add_argument(
        "shape",
        nargs="?",
        type=_gemm_dims,
        metavar="MxKxN",
        help="the shape, e.g. 4096x4096x4096 (or -m, -k, -n)",
    )
    g.add_argument("-m", "--m", type=_dim("M"), help="rows of a (and of the result)")
    g.add_argument("-k", "--k", type=_dim("K"), help="contraction length")
    g.add_argument("-n", "--n", type=_dim("N"), help="columns of b (and of the result)")
    g.add_argument(
        "--dtype",
        default="bf16",
        type=_format,
        choices=_tensor_engine_formats(),
        help="operand format (default bf16; the formats the Trn2 tensor engine takes, also by "
        "their numpy/JAX/PyTorch names such as bfloat16, float16, float8_e4m3)",
    )
    g.add_argument("--perf-mode", default="none", choices=("none", "double_row"))
    g.add_argument(
        "--sparsity", choices=SPARSITY_PATTERNS, help="N:M-sparse stationary operand a (along K)"
    )
    g.add_argument("--no-throttle", action="store_true", help="leave out the dI/dt throttle ramp")
    g.add_argument("--trace", metavar="PATH", help="write a Perfetto/Chrome trace")
    g.add_argument(
        "--plot",
        metavar="PNG",
        type=_plot_path,
        help="draw the shape's roofline on the core the table describes: one NeuronCore, or "
        "one logical core with --lnc, into PNG (.png, .svg or .pdf; needs trn2core[plot])",
    )
    g.add_argument(
        "--run",
        action="store_true",
        help="also compute it on random data (the model's answer is printed first)",
    )
    g.add_argument(
        "--out",
        metavar="NPY",
        help="with --run: save the computed fp32 result to NPY (numpy .npy, np.load reads it)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of the table: m, k, n, dtype, perf_mode, sparsity, "
        "lnc, core, report (the table's fields), run (emulated_s, gflop_per_s, seed; null "
        "without --run), trace, plot",
    )
    g.add_argument("--seed", type=_seed, default=0, help="seed of the random data (--run)")
    g.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2, 4),
        help="run on one Logical NeuronCore of this size (its physical cores split the work; "
        "default NEURON_LOGICAL_NC_CONFIG, else 2, Trn2's default; 1: one physical core)",
    )
    g.set_defaults(func=cmd_gemm)
    add_collective_commands(sub)
    add_nki_commands(sub)
    add_workload_commands(sub)
    sub.add_parser("formats", help="the number formats").set_defaults(func=cmd_formats)
    sp = sub.add_parser(
        "spec",
        help="the hardware constants, their units and sources",
        description="Every Trainium2 constant trn2core uses, with its value for people, its "
        "source tags and status letter (D documented, I inferred, C sources conflict).",
    )
    sp.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="show only these constants, with their sources resolved (e.g. hbm_chip_bytes_per_s)",
    )
    sp.add_argument(
        "--sources",
        action="store_true",
        help="list the sources the tags name "
        "(title, address, version read); with NAMEs, only theirs",
    )
    sp.add_argument("--json", action="store_true", help="raw numbers (and tags) as JSON")
    sp.set_defaults(func=cmd_spec)
    dp = sub.add_parser(
        "docs", help="the guides, shipped inside the package (list them, or print one)"
    )
    dp.add_argument("guide", nargs="?", metavar="GUIDE", help="e.g. numerics, engine, sources")
    dp.set_defaults(func=cmd_docs)
    return parser


def exit_status(e: Trn2Error) -> int:
    """The CLI's exit status for ``e``: 1 when the model refuses well-formed input (a
    ``CapacityError``: beyond the host's memory or the model's limits; a ``NotSupportedError``:
    not modelled; an error a kernel raised at its own ``file:line``), 2 for a usage error (a
    bad value of a flag or argument)."""
    in_kernel = getattr(e, "nki_location", None) is not None
    refusal = isinstance(e, CapacityError) or type(e).__name__ == "NotSupportedError"
    return 1 if refusal or in_kernel else 2


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = bare_check(sys.argv[1:] if argv is None else list(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's usage, not the top level's (`trn2core ls -x`)
        _subparser(parser, getattr(args, "command", None)).error(
            f"unrecognized arguments: {' '.join(extra)}"
        )
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `trn2core spec | head`
        return 0
    except _Usage as e:
        _subparser(parser, args.command).error(str(e))  # usage, message, exit status 2
        return 2  # not reached
    except Trn2Error as e:
        print(f"trn2core {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return exit_status(e)
    except OSError as e:  # e.g. --trace into a directory that does not exist
        print(f"trn2core {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the shell's convention, without a traceback
        print(f"trn2core {args.command}: interrupted", file=sys.stderr)
        return 130
