"""The tensor engine (contract section 2): bit-exact against trn2core.reference, and timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import trn2core
from trn2core import reference

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3
E5M2 = ml_dtypes.float8_e5m2
E3M4 = ml_dtypes.float8_e3m4
DTYPES = {
    "fp32": np.float32,
    "bf16": BF16,
    "fp16": np.float16,
    "fp8_e4m3": E4M3,
    "fp8_e5m2": E5M2,
    "fp8_e3m4": E3M4,
}
LOW = ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e3m4"]
# Every pair the engine accepts: low-precision formats mix freely; fp32 pairs with fp32.
PAIRS = [(a, b) for a in LOW for b in LOW] + [("fp32", "fp32")]


def bits(x: np.ndarray) -> np.ndarray:
    """float32 bit patterns with every NaN made canonical (payloads are not specified)."""
    x = np.asarray(x, np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), x).view(np.uint32)


def rand(shape, fmt, rng, scale=1.0):
    x = rng.standard_normal(shape) * scale
    return trn2core.quantize(x, fmt)


def adversarial(shape, fmt, rng):
    """Cancellation, huge and tiny magnitudes, subnormals, zeros of both signs, some Inf/NaN."""
    info = trn2core.format_info(fmt)
    choices = np.array(
        [info.max, -info.max, info.min_subnormal, -info.min_subnormal, info.min_normal,
         0.0, -0.0, 1.0, -1.0, 3.0, 1e-3, info.max / 3]
    )  # fmt: skip
    x = choices[rng.integers(0, len(choices), size=shape)] * rng.choice([1, -1], size=shape)
    x = np.where(rng.random(shape) < 0.5, rng.standard_normal(shape) * 10, x)
    return trn2core.quantize(x, fmt, saturate=True)


def with_specials(x, rng):
    x = np.array(x)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=max(1, flat.size // 500), replace=False)
    flat[idx[: len(idx) // 2]] = np.inf
    flat[idx[len(idx) // 2 :]] = np.nan
    return x


@pytest.mark.parametrize(("fa", "fb"), PAIRS)
def test_gemm_equals_reference_for_every_format_pair(fa, fb):
    rng = np.random.default_rng(hash((fa, fb)) % 2**32)
    a = rand((37, 300), fa, rng)
    b = rand((300, 45), fb, rng)
    got = trn2core.gemm(a, b).out
    assert got.dtype == np.float32 and got.shape == (37, 45)
    np.testing.assert_array_equal(bits(got), bits(reference.gemm(a, b)))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp32"])
def test_gemm_equals_reference_on_adversarial_data(fmt):
    rng = np.random.default_rng(7)
    a = adversarial((20, 520), fmt, rng)
    b = adversarial((520, 30), fmt, rng)
    np.testing.assert_array_equal(bits(trn2core.gemm(a, b).out), bits(reference.gemm(a, b)))
    a2, b2 = with_specials(a, rng), with_specials(b, rng)
    np.testing.assert_array_equal(bits(trn2core.gemm(a2, b2).out), bits(reference.gemm(a2, b2)))


def test_bf16_products_beyond_fp32_range_cancel():
    # 2^64 * 2^64 = 2^128 overflows float32 on its own, but the FMA forms it exactly and adds it
    # to -1.5 * 2^127: the partial sum 2^126 is finite.
    a = trn2core.quantize(np.array([[-1.5 * 2.0**127, 2.0**64]]), "bf16")
    b = trn2core.quantize(np.array([[1.0], [2.0**64]]), "bf16")
    got = trn2core.gemm(a, b).out
    assert got[0, 0] == 2.0**126
    np.testing.assert_array_equal(bits(got), bits(reference.gemm(a, b)))
    # The other way round the first partial sum overflows to +Inf, and stays there.
    got = trn2core.gemm(a[:, ::-1].copy(), b[::-1].copy()).out
    assert got[0, 0] == np.inf


@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 1, 1), (1, 4097, 1), (130, 4097, 3), (129, 128, 513), (2, 255, 1024)]
)
def test_awkward_shapes(m, k, n):
    rng = np.random.default_rng(m * 7 + k + n)
    a, b = rand((m, k), "bf16", rng), rand((k, n), "bf16", rng)
    np.testing.assert_array_equal(bits(trn2core.gemm(a, b).out), bits(reference.gemm(a, b)))


def test_k_tile_boundary_changes_bits_as_the_hardware_would():
    # Tile 0: 2^40 then 127 ones (lost to rounding); tile 1: -2^40 then 63 ones (lost too).
    # The PSUM add gives 0. One sequential chain over K would give 63 instead.
    k = 192
    a = np.ones((1, k))
    a[0, 0], a[0, 128] = 2.0**40, -(2.0**40)
    a = trn2core.quantize(a, "bf16")
    b = trn2core.quantize(np.ones((k, 1)), "bf16")
    assert trn2core.gemm(a, b).out[0, 0] == 0.0
    chain = np.float32(0)
    for v in a[0].astype(np.float32):
        chain = np.float32(chain + v)
    assert chain == 63.0


@pytest.mark.parametrize(("fa", "fb"), [("fp8_e4m3", "fp8_e4m3"), ("fp8_e4m3", "fp8_e5m2")])
@pytest.mark.parametrize("k", [256, 300, 1000])
def test_double_row_gemm(fa, fb, k):
    rng = np.random.default_rng(k)
    a, b = rand((40, k), fa, rng), rand((k, 33), fb, rng)
    got = trn2core.gemm(a, b, perf_mode="double_row")
    want = reference.gemm(a, b, perf_mode="double_row")
    np.testing.assert_array_equal(bits(got.out), bits(want))
    assert got.report.instructions == -(-k // 256)


def test_gemm_quantizes_inputs_and_output():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((50, 200)), rng.standard_normal((200, 60))
    r = trn2core.gemm(a, b, dtype="fp8_e4m3", out_dtype="bf16")
    qa, qb = trn2core.quantize(a, "fp8_e4m3"), trn2core.quantize(b, "fp8_e4m3")
    want = trn2core.quantize(reference.gemm(qa, qb), "bf16")
    assert r.out.dtype == np.dtype(BF16)
    np.testing.assert_array_equal(r.out.view(np.uint16), want.view(np.uint16))
    sr1 = trn2core.gemm(a, b, dtype="bf16", rounding="stochastic", seed=5).out
    sr2 = trn2core.gemm(a, b, dtype="bf16", rounding="stochastic", seed=5).out
    np.testing.assert_array_equal(bits(sr1), bits(sr2))
    qa = trn2core.quantize(a, "bf16", rounding="stochastic", seed=5)
    qb = trn2core.quantize(b, "bf16", rounding="stochastic", seed=6)
    np.testing.assert_array_equal(bits(sr1), bits(reference.gemm(qa, qb)))


def test_results_do_not_depend_on_thread_count(tmp_path):
    code = (
        "import numpy as np, trn2core, sys\n"
        "rng = np.random.default_rng(0)\n"
        "a = trn2core.quantize(rng.standard_normal((300, 700)), 'bf16')\n"
        "b = trn2core.quantize(rng.standard_normal((700, 600)), 'bf16')\n"
        "import hashlib\n"
        "sys.stdout.write(hashlib.sha256(trn2core.gemm(a, b).out.tobytes()).hexdigest())\n"
    )
    outs = []
    for threads in ("1", "2", "3"):
        env = dict(os.environ, RAYON_NUM_THREADS=threads)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] == outs[2]


def test_report_formulas():
    r = trn2core.estimate_gemm(300, 1000, 700, dtype="bf16")
    mt, nt, kt = 3, 2, 8
    assert r.instructions == mt * nt * kt
    # max(min(64, M_tile), N_tile) per instruction: M tiles 128,128,44; N tiles 512,188.
    per_k = 2 * (512 + 188) + (512 + 188)
    assert r.pe_cycles == kt * per_k
    assert r.flops == 2 * 300 * 1000 * 700
    assert 0 < r.utilization <= 1
    # This shape is balanced (about 8.2 us of compute and of DMA at 23 B/ns per engine): the
    # bound is whichever side is longer.
    d = r.details
    assert r.bound == ("memory" if d["memory_s"] > d["compute_s"] else "compute")
    f32 = trn2core.estimate_gemm(300, 1000, 700, dtype="fp32")
    assert f32.bound == "compute"  # 4x the PE cycles, the same bytes
    assert f32.pe_cycles == 4 * r.pe_cycles
    dr = trn2core.estimate_gemm(300, 1000, 700, dtype="fp8_e4m3", perf_mode="double_row")
    assert dr.instructions == mt * nt * 4


def test_large_bf16_gemm_reports_the_pe_peak():
    r = trn2core.estimate_gemm(8192, 8192, 8192, dtype="bf16")
    assert abs(r.pe_tflops - 128 * 128 * 2 * 2.4e9 / 1e12) < 1e-6
    assert 0.99 < r.utilization <= 1.0
    off = trn2core.estimate_gemm(8192, 8192, 8192, dtype="bf16", throttle=False)
    # The dI/dt throttle costs the 0.75 us ramp deficit (50% -> 100% over 3 us).
    assert abs((r.seconds - off.seconds) - 0.75e-6) < 1e-9
    dr = trn2core.estimate_gemm(8192, 8192, 8192, dtype="fp8_e4m3", perf_mode="double_row")
    assert abs(dr.pe_tflops - 2 * r.pe_tflops) < 1e-6


def test_gemm_report_matches_estimate():
    rng = np.random.default_rng(0)
    a, b = rand((200, 300), "bf16", rng), rand((300, 100), "bf16", rng)
    r = trn2core.gemm(a, b).report
    e = trn2core.estimate_gemm(200, 300, 100, dtype="bf16")
    assert r.to_dict() == e.to_dict()
    assert "TFLOPS" in str(r)


def test_trace(tmp_path):
    r = trn2core.estimate_gemm(1024, 512, 2048, dtype="bf16")
    path = r.save_trace(tmp_path / "t.json")
    doc = json.loads(Path(path).read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and "tid" in e}
    assert {"PE", "ACT (PSUM evict)", "DVE (PSUM evict)"} <= names
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == "matmul"]
    assert len(spans) == r.instructions
    end = max(e["ts"] + e["dur"] for e in doc["traceEvents"] if e.get("ph") == "X")
    assert abs(end - r.seconds * 1e6) < 1e-3


def test_core_matmul_and_psum_accumulation():
    rng = np.random.default_rng(1)
    core = trn2core.NeuronCore()
    s1, m1 = rand((128, 64), "bf16", rng), rand((128, 300), "bf16", rng)
    s2, m2 = rand((100, 64), "fp8_e4m3", rng), rand((100, 300), "bf16", rng)
    with pytest.raises(ValueError, match="accumulate"):
        core.matmul(s1, m1, bank=3, accumulate=True)
    p1 = core.matmul(s1, m1, bank=3)
    np.testing.assert_array_equal(bits(p1), bits(reference.nc_matmul(s1, m1)))
    p2 = core.matmul(s2, m2, bank=3, accumulate=True)
    want = reference.nc_matmul(s2, m2, psum=reference.nc_matmul(s1, m1))
    np.testing.assert_array_equal(bits(p2), bits(want))
    np.testing.assert_array_equal(bits(core.read_psum(3, 64, 300)), bits(want))
    # A region larger than what was written cannot be accumulated onto.
    with pytest.raises(ValueError, match="accumulate"):
        core.matmul(rand((128, 64), "bf16", rng), rand((128, 301), "bf16", rng), bank=3,
                    accumulate=True)  # fmt: skip
    assert core.report().instructions == 2


def test_core_double_row_and_limits():
    rng = np.random.default_rng(2)
    core = trn2core.NeuronCore()
    s, m = rand((128, 2, 32), "fp8_e4m3", rng), rand((128, 2, 200), "fp8_e5m2", rng)
    got = core.matmul(s, m, perf_mode="double_row")
    np.testing.assert_array_equal(
        bits(got), bits(reference.nc_matmul(s, m, perf_mode="double_row"))
    )
    bf = rand((128, 2, 32), "bf16", rng)
    with pytest.raises(trn2core.FormatError, match="double_row"):
        core.matmul(bf, m, perf_mode="double_row")
    with pytest.raises(trn2core.ShapeError, match="128"):
        core.matmul(rand((129, 4), "bf16", rng), rand((129, 4), "bf16", rng))
    with pytest.raises(trn2core.ShapeError, match="512"):
        core.matmul(rand((4, 4), "bf16", rng), rand((4, 513), "bf16", rng))
    with pytest.raises(trn2core.ShapeError, match="128"):
        core.matmul(rand((4, 129), "bf16", rng), rand((4, 4), "bf16", rng))
    fn = trn2core.quantize(rng.standard_normal((4, 4)), "fp8_e4m3fn")
    with pytest.raises(trn2core.FormatError, match="fp8_e4m3fn.*not supported"):
        core.matmul(fn, rand((4, 4), "bf16", rng))
    with pytest.raises(trn2core.FormatError, match="fp32"):
        core.matmul(rand((4, 4), "fp32", rng), rand((4, 4), "bf16", rng))
    with pytest.raises(trn2core.FormatError, match="tensor-engine format"):
        core.matmul(rng.standard_normal((4, 4)), rand((4, 4), "bf16", rng))


def test_row_tiles_run_in_parallel_in_the_cost_model():
    rng = np.random.default_rng(4)
    core = trn2core.NeuronCore()
    for r in range(4):
        s, m = rand((32, 32), "bf16", rng), rand((32, 512), "bf16", rng)
        out = core.matmul(s, m, bank=r, tile_position=(32 * r, 0), tile_size=(32, 128))
        np.testing.assert_array_equal(bits(out), bits(reference.nc_matmul(s, m)))
    rep = core.report()
    assert rep.instructions == 4 and rep.pe_cycles == 4 * 512
    assert rep.cycles == 512  # four disjoint row tiles overlap completely


def test_gemm_bad_inputs():
    rng = np.random.default_rng(5)
    a = rand((4, 5), "bf16", rng)
    with pytest.raises(trn2core.ShapeError, match="K"):
        trn2core.gemm(a, rand((6, 3), "bf16", rng))
    with pytest.raises(trn2core.ShapeError, match="2-D"):
        trn2core.gemm(np.ones(5, np.float32), rand((5, 3), "bf16", rng))
    with pytest.raises(trn2core.ShapeError, match="empty"):
        trn2core.gemm(np.ones((0, 5), np.float32), np.ones((5, 3), np.float32))
    with pytest.raises(trn2core.FormatError, match="fp32"):
        trn2core.gemm(rand((4, 5), "fp32", rng), rand((5, 3), "bf16", rng))
    with pytest.raises(trn2core.FormatError, match="perf_mode"):
        trn2core.gemm(a, rand((5, 3), "bf16", rng), perf_mode="turbo")
    with pytest.raises(trn2core.FormatError, match="double_row"):
        trn2core.gemm(a, rand((5, 3), "bf16", rng), perf_mode="double_row")
    with pytest.raises(trn2core.ShapeError, match="M"):
        trn2core.estimate_gemm(0, 5, 5)
    with pytest.raises(trn2core.FormatError, match="dtype"):
        trn2core.estimate_gemm(5, 5, 5, dtype="int8")


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp32"])
def test_transpose_mode_is_bit_exact(fmt):
    rng = np.random.default_rng(8)
    x = with_specials(rand((96, 40), fmt, rng), rng)
    core = trn2core.NeuronCore()
    ident = trn2core.quantize(np.eye(96), fmt)
    out = core.matmul(x, ident, bank=2, is_transpose=True)
    assert out.dtype == x.dtype and out.shape == (40, 96)
    np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(x.T).view(np.uint8))
    # PSUM holds the values, NaN and Inf included (a matmul with the identity would not).
    psum = core.read_psum(2, 40, 96)
    same = (psum == x.T.astype(np.float32)) | (np.isnan(psum) & np.isnan(x.T.astype(np.float32)))
    assert same.all()
    with pytest.raises(ValueError, match="accumulate"):
        core.matmul(rand((96, 40), "bf16", rng), rand((96, 96), "bf16", rng), bank=2,
                    accumulate=True)  # fmt: skip
    with pytest.raises(trn2core.ShapeError, match="identity"):
        core.matmul(x, trn2core.quantize(np.ones((96, 96)), fmt), is_transpose=True)
    cost = 96 * (2 if fmt == "fp32" else 1)
    assert core.report().pe_cycles == cost


def test_memory_side_decides_the_bound():
    small_k = trn2core.estimate_gemm(4096, 128, 4096, dtype="bf16")
    assert small_k.bound == "memory"
    d = small_k.details
    # 1 MiB of a, 1 MiB of b, 64 MiB of fp32 result through the DMA engines.
    assert d["hbm_bytes"] == 4096 * 128 * 2 * 2 + 4096 * 4096 * 4
    assert d["memory_s"] > d["compute_s"]
    assert abs(small_k.seconds - (d["dma_prologue_s"] + d["memory_s"])) < 1e-12
    square = trn2core.estimate_gemm(8192, 8192, 8192, dtype="bf16")
    assert square.bound == "compute"
    assert square.details["compute_s"] > square.details["memory_s"]
    # fp8 operands halve the operand traffic of bf16 (the fp32 result is the same).
    f8 = trn2core.estimate_gemm(4096, 128, 4096, dtype="fp8_e4m3")
    assert f8.details["hbm_bytes"] == 4096 * 128 * 2 + 4096 * 4096 * 4


def test_blocking_fills_sbuf_as_a_well_written_kernel_does():
    """16384^3 bf16: a block of b 512 columns wide (16 MiB) fits in SBUF beside two streaming
    128-row tiles of a (8 MiB), so b is read once and a 32 times: compute-bound at full rate,
    as the blocked kernels of the NKI tutorial are (it was memory-bound at 55 % of peak while
    the block was limited to half of SBUF)."""
    r = trn2core.estimate_gemm(16384, 16384, 16384, dtype="bf16")
    d = r.details
    assert r.bound == "compute" and r.utilization > 0.99
    assert d["sbuf_resident_b_columns"] == 512 and d["sbuf_resident_a_rows"] == 0
    gib = 1 << 30
    assert d["hbm_bytes"] == 32 * gib // 2 + gib // 2 + gib  # a x 32, b once, fp32 result
    # A short a and a very wide b: keeping all of a (8 MiB) resident while b streams reads
    # each operand once, where a block of b would re-read a 103 times.
    wide = trn2core.estimate_gemm(1024, 4096, 262144, dtype="bf16")
    assert wide.details["sbuf_resident_a_rows"] == 1024
    assert wide.details["sbuf_resident_b_columns"] == 0
    assert wide.details["hbm_bytes"] == 1024 * 4096 * 2 + 4096 * 262144 * 2 + 1024 * 262144 * 4
