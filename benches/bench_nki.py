"""trn2core.nki speed (issues 15, 26): the front end's cost next to the arithmetic, in one run.

- A fully blocked NKI matmul kernel (``examples/nki/matmul.py``, stage 4) on 2048 x 2048 x 2048
  bf16 against ``trn2core.gemm`` on the same operands (issue 26's target: within 1.5x).
- The tiled NKI matmul (stage 1, two tile loads per matmul: every ``dma_copy`` settles the one
  matmul queued before it) at the same size in fp32 against ``trn2core.gemm``: tracked, no
  target (the NKI tutorial's form of it at its 4096 x 8192 x 8192 is issue 26's 10 s row).
- The per-instruction overhead of a Python-issued NKI instruction: a kernel that issues N small
  ``nisa.tensor_tensor`` instructions ([128, 64] fp32), wall time per instruction (issue 26's
  target: under 3 us).

Run: ``python benches/bench_nki.py [--repeat 3] [--size 2048] [--instructions 20000]``.
Also the ``--only-nki`` rows of ``benches/compare_peers.py`` and the asv suite below.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import trn2core
import trn2core.nki

ROOT = Path(__file__).resolve().parent.parent
TARGET_MATMUL_VS_GEMM = 1.5
TARGET_INSTR_US = 3.0


def _matmul_module():
    trn2core.nki.install()
    path = ROOT / "examples" / "nki" / "matmul.py"
    spec = importlib.util.spec_from_file_location("nki_matmul_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _chain_kernel():
    trn2core.nki.install()
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def chain(a, n):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        for _ in nl.sequential_range(n // 2):
            nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.multiply)
            nisa.tensor_tensor(dst=t, data1=u, data2=u, op=nl.minimum)
        nisa.dma_copy(dst=out, src=t)
        return out

    return chain


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def best_of_alternating(fa, fb, repeat: int) -> tuple[float, float]:
    """The best of ``repeat`` runs of ``fa`` and of ``fb``, run alternately (a, b, a, b, ...):
    on a shared host whose speed drifts between minutes, both see the same stretch of it, so
    their ratio does not depend on which ran first."""
    best_a = best_b = float("inf")
    for _ in range(repeat):
        best_a = min(best_a, best_of(fa, 1))
        best_b = min(best_b, best_of(fb, 1))
    return best_a, best_b


def matmul_vs_gemm(size: int, repeat: int) -> dict:
    mm = _matmul_module()
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((size, size), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((size, size), dtype=np.float32).astype(ml_dtypes.bfloat16)
    a = np.ascontiguousarray(lhsT.T)
    res = trn2core.nki.run(mm.matmul_fully_blocked, lhsT, rhs)
    ours, base = best_of_alternating(
        lambda: trn2core.nki.run(mm.matmul_fully_blocked, lhsT, rhs),
        lambda: trn2core.gemm(a, rhs),
        repeat,
    )
    g = trn2core.gemm(a, rhs).out
    diff = float(np.max(np.abs(np.asarray(res.outputs, dtype=np.float64) - g)))
    scale = float(np.max(np.abs(g)))
    return {"kernel_s": ours, "gemm_s": base, "ratio": ours / base, "report": res.report,
            "max_abs_diff_vs_gemm": diff, "max_abs": scale}  # fmt: skip


def tiled_vs_gemm(size: int, repeat: int) -> dict:
    """The tiled matmul (``examples/nki/matmul.py``, stage 1: two tile loads per matmul, so
    every ``dma_copy`` settles the one matmul queued before it) at ``size``^3 fp32, against
    ``trn2core.gemm`` on the same operands: the cost of a settle per instruction."""
    mm = _matmul_module()
    rng = np.random.default_rng(2)
    lhsT = rng.standard_normal((size, size), dtype=np.float32)
    rhs = rng.standard_normal((size, size), dtype=np.float32)
    a = np.ascontiguousarray(lhsT.T)
    ours, base = best_of_alternating(
        lambda: trn2core.nki.run(mm.matmul_tiled, lhsT, rhs),
        lambda: trn2core.gemm(a, rhs),
        repeat,
    )
    return {"kernel_s": ours, "gemm_s": base, "ratio": ours / base}


def instruction_overhead(n: int, repeat: int) -> dict:
    chain = _chain_kernel()
    a = np.random.default_rng(1).random((128, 64), dtype=np.float32)
    r = trn2core.nki.run(chain, a, n)
    instrs = r.report.instructions
    t = best_of(lambda: trn2core.nki.run(chain, a, n), repeat)
    return {"seconds": t, "instructions": instrs, "us_per_instruction": t / instrs * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--instructions", type=int, default=20000)
    args = ap.parse_args()
    m = matmul_vs_gemm(args.size, args.repeat)
    s = args.size
    ok1 = m["ratio"] <= TARGET_MATMUL_VS_GEMM
    print(
        f"fully blocked NKI matmul {s}^3 bf16: {m['kernel_s'] * 1e3:.1f} ms; trn2core.gemm on "
        f"the same operands {m['gemm_s'] * 1e3:.1f} ms: {m['ratio']:.2f}x "
        f"(target within {TARGET_MATMUL_VS_GEMM:g}x: {'pass' if ok1 else 'BELOW TARGET'})"
    )
    r = m["report"]
    print(
        f"  emulated time {r.seconds * 1e6:.1f} us, bottleneck {r.bottleneck},"
        f" PE {100 * r.utilization('PE'):.1f}%; max |kernel - gemm| "
        f"{m['max_abs_diff_vs_gemm']:.3g} (of max |gemm| {m['max_abs']:.3g}: the kernel adds "
        f"its K blocks' fp32 partial sums in SBUF)"
    )
    t = tiled_vs_gemm(args.size, args.repeat)
    print(
        f"tiled NKI matmul {s}^3 fp32 (a settle per dma_copy): {t['kernel_s'] * 1e3:.1f} ms; "
        f"trn2core.gemm {t['gemm_s'] * 1e3:.1f} ms: {t['ratio']:.2f}x (tracked, no target)"
    )
    o = instruction_overhead(args.instructions, args.repeat)
    ok2 = o["us_per_instruction"] < TARGET_INSTR_US
    print(
        f"Python-issued NKI instructions: {o['instructions']:,} in {o['seconds'] * 1e3:.1f} ms = "
        f"{o['us_per_instruction']:.2f} us each (target < {TARGET_INSTR_US:g} us: "
        f"{'pass' if ok2 else 'BELOW TARGET'})"
    )
    return 0 if ok1 and ok2 else 1


class TimeNki:
    """asv: the same two measurements."""

    timeout = 600

    def setup(self):
        self.mm = _matmul_module()
        rng = np.random.default_rng(0)
        self.lhsT = rng.standard_normal((1024, 1024), dtype=np.float32).astype(ml_dtypes.bfloat16)
        self.rhs = rng.standard_normal((1024, 1024), dtype=np.float32).astype(ml_dtypes.bfloat16)
        self.chain = _chain_kernel()
        self.a = np.random.default_rng(1).random((128, 64), dtype=np.float32)

    def time_fully_blocked_matmul_1024(self):
        trn2core.nki.run(self.mm.matmul_fully_blocked, self.lhsT, self.rhs)

    def time_tiled_matmul_1024_fp32(self):
        a = self.lhsT.astype(np.float32)
        trn2core.nki.run(self.mm.matmul_tiled, a, a)

    def time_10000_instructions(self):
        trn2core.nki.run(self.chain, self.a, 10000)


if __name__ == "__main__":
    raise SystemExit(main())
