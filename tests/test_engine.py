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
from trn2core import reference, spec

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
        [
            info.max,
            -info.max,
            info.min_subnormal,
            -info.min_subnormal,
            info.min_normal,
            0.0,
            -0.0,
            1.0,
            -1.0,
            3.0,
            1e-3,
            info.max / 3,
        ]
    )
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
        core.matmul(
            rand((128, 64), "bf16", rng), rand((128, 301), "bf16", rng), bank=3, accumulate=True
        )
    assert core.report().instructions == 2


def test_one_psum_and_one_clock_for_host_matmuls_and_machine_instructions():
    """A NeuronCore is one machine: a host-issued matmul writes the PSUM that tiles see and
    engines read, and lands on the same timeline as every other instruction."""
    rng = np.random.default_rng(21)
    core = trn2core.NeuronCore()
    acc = core.tile((128, 512), "fp32", space="psum", address=0)  # a tile over bank 0
    s, m = rand((64, 128), "bf16", rng), rand((64, 512), "bf16", rng)
    out = core.matmul(s, m, bank=0)
    want = reference.nc_matmul(s, m)
    np.testing.assert_array_equal(bits(out), bits(want))
    # The tile reads the matmul's result...
    np.testing.assert_array_equal(bits(core.read(acc)), bits(want))
    # ...the Vector engine copies it out of PSUM as NKI kernels do...
    sb = core.tile((128, 512), "fp32")
    core.vector.tensor_copy(sb, acc)
    np.testing.assert_array_equal(bits(core.read(sb)), bits(want))
    # ...and what an engine writes into the bank is what read_psum returns.
    core.vector.memset(acc, 2.5)
    assert (core.read_psum(0, 128, 512) == 2.5).all()
    # A memset is not a matmul: accumulating onto it is refused, as on the chip.
    with pytest.raises(ValueError, match="accumulate"):
        core.matmul(s, m, bank=0, accumulate=True)
    rep = core.report()
    assert rep.instructions == 3 and rep.opcodes == {"nc_matmul": 1, "tensor_copy": 1, "memset": 1}
    assert rep.engines["PE"]["instructions"] == 1 and rep.engines["DVE"]["instructions"] == 2
    # The operands' scratch SBUF is given back: all of SBUF is free again after a matmul.
    fresh = trn2core.NeuronCore()
    fresh.matmul(s, m, bank=7)
    whole = fresh.tile((128, spec.sbuf_usable_partition_bytes), "uint8")
    assert whole.shape == [128, spec.sbuf_usable_partition_bytes]


def test_core_matmul_takes_byte_swapped_operands():
    # The engine format of an operand comes from its dtype whatever its byte order (the
    # element-type table's map, as quantize and gemm read it); the values are the same.
    rng = np.random.default_rng(23)
    s, m = rand((32, 16), "fp16", rng), rand((32, 40), "fp16", rng)
    want = trn2core.NeuronCore().matmul(s, m)
    swapped = s.astype(s.dtype.newbyteorder(">")), m.astype(m.dtype.newbyteorder(">"))
    got = trn2core.NeuronCore().matmul(*swapped)
    np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(want), bits(reference.nc_matmul(s, m)))


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
    rep = core.report()  # the core's one timeline (a KernelReport)
    assert rep.instructions == 4 and rep.engines["PE"]["instructions"] == 4
    assert round(rep.seconds * spec.pe_clock_hz) == 512  # four disjoint row tiles overlap
    # The same four on one row tile run one after another: 512 PE cycles each.
    serial = trn2core.NeuronCore()
    for r in range(4):
        s, m = rand((32, 32), "bf16", rng), rand((32, 512), "bf16", rng)
        serial.matmul(s, m, bank=r, tile_position=(0, 0), tile_size=(32, 128))
    assert round(serial.report().seconds * spec.pe_clock_hz) == 4 * 512


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
    # PSUM holds the bits in the input's own dtype (the PE array writes 16-bit elements for
    # 16-bit inputs), NaN and Inf included (a matmul with the identity would not).
    psum = core.read_psum(2, 40, 96, dtype=fmt)
    assert psum.dtype == x.dtype
    np.testing.assert_array_equal(psum.view(np.uint8), np.ascontiguousarray(x.T).view(np.uint8))
    with pytest.raises(ValueError, match="accumulate"):
        core.matmul(
            rand((96, 40), "bf16", rng), rand((96, 96), "bf16", rng), bank=2, accumulate=True
        )
    with pytest.raises(trn2core.ShapeError, match="identity"):
        core.matmul(x, trn2core.quantize(np.ones((96, 96)), fmt), is_transpose=True)
    cost = 96 * (2 if fmt == "fp32" else 1)
    assert round(core.report().seconds * spec.pe_clock_hz) == cost


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


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((200, 300, 100), "bf16"),
        ((4096, 128, 4096), "bf16"),
        ((1000, 3000, 700), "fp8_e4m3"),
        ((64, 64, 64), "fp32"),
    ],
)
def test_the_trace_moves_each_hbm_byte_once(shape, dtype):
    # The first a and b tiles load in the prologue; the streams carry the rest. Both used to
    # carry the first tiles (200x300x100 bf16: 318,368 B in the trace for 260,000 B of traffic).
    rep = trn2core.estimate_gemm(*shape, dtype=dtype)
    events = json.loads(rep.trace_json())
    events = events["traceEvents"] if isinstance(events, dict) else events
    moved = [e["args"] for e in events if e.get("ph") == "X" and "hbm_bytes" in e.get("args", {})]
    assert len(moved) >= 5  # first a, first b tiles, a and b streams, results
    assert sum(a["hbm_bytes"] for a in moved) == rep.details["hbm_bytes"]


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


# -- gemm in one crossing: operands as they are, quantized while the panels are packed --------

FORMATS = list(trn2core.FORMATS)
ROUNDINGS = list(trn2core.ROUNDING_MODES)
INPUT_DTYPES = [
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3",
    "float8_e5m2",
    "float8_e3m4",
    "float8_e4m3fn",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint64",
]


def boundary(shape, rng, specials=True):
    """float64 values heavy on rounding boundaries: exact midpoints between bf16/fp16/fp8
    neighbours and values one float64 ulp off them, subnormals of fp32 and of the narrow
    formats, signed zeros; with ``specials``, Inf, NaN and values beyond the narrow formats'
    range in the first row only (so most outputs stay finite)."""
    n = int(np.prod(shape))
    x = rng.standard_normal(n)
    kind = rng.integers(0, 8, n)
    e = rng.integers(-8, 3, n)
    m = rng.integers(0, 2**10, n)
    mid = (1 + (2 * m + 1) / 2**11) * 2.0**e * np.sign(x)
    x = np.where(kind == 1, mid, x)
    x = np.where(kind == 2, np.nextafter(mid, np.inf), x)
    x = np.where(kind == 3, (1 + (2 * (m % 8) + 1) / 16) * 2.0**e, x)
    x = np.where(kind == 4, x * 2.0**-130, x)
    x = np.where(kind == 5, x * 2.0**-16, x)
    x = np.where(kind == 6, -0.0, x).reshape(shape)
    if specials:
        pool = np.array([np.inf, -np.inf, np.nan, 448.0, 65520.0, 1e5, 3.5e38, -0.0])
        x[0] = pool[rng.integers(0, len(pool), shape[1])]
    return x


def as_input(x, dtype: str):
    """``x`` stored as ``dtype`` (floats rounded to nearest-even; integers scaled, with values
    beyond 2**53 for the 64-bit types so float64's own rounding takes part)."""
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        v = np.nan_to_num(np.round(x * 50), nan=0.0, posinf=0.0, neginf=0.0)
        if info.bits == 64:
            v = v * 2.0**50 + np.arange(v.size).reshape(v.shape) % 7
        v = np.abs(v) if info.min == 0 else v
        # The largest float64 each type holds (2**63 and 2**64 themselves do not fit).
        hi = {8: 127.0, 16: 32767.0, 32: 2.0**31 - 1, 64: 2.0**63 - 2**11}[info.bits]
        hi = float(info.max) if info.bits < 64 and info.min == 0 else hi
        hi = 2.0**64 - 2**12 if info.bits == 64 and info.min == 0 else hi
        return np.clip(v, info.min, hi).astype(dtype)
    if dtype in ("float64", "float32", "float16"):
        with np.errstate(over="ignore"):
            return x.astype(dtype)
    fmt = {
        "bfloat16": "bf16",
        "float8_e4m3": "fp8_e4m3",
        "float8_e5m2": "fp8_e5m2",
        "float8_e3m4": "fp8_e3m4",
        "float8_e4m3fn": "fp8_e4m3fn",
    }[dtype]
    return trn2core.quantize(x, fmt)


def old_path(
    a, b, *, dtype=None, rounding="nearest_even", seed=None, perf_mode="none", out_dtype="fp32"
):
    """What gemm did before it took operands as they are: quantize each operand whole (``b``
    with ``seed + 1``; float64 and integers to fp32 without ``dtype``), multiply the values
    (``trn2core.reference``, pure numpy), quantize the result."""

    def prepare(x, s):
        x = np.asarray(x)
        if dtype is not None:
            return trn2core.quantize(x, dtype, rounding=rounding, seed=s)
        if x.dtype == np.float64 or x.dtype.kind in "iu":
            return trn2core.quantize(x, "fp32")
        return x

    qa = prepare(a, seed)
    qb = prepare(b, None if seed is None else (seed + 1) % 2**64)
    out = reference.gemm(qa, qb, perf_mode=perf_mode)
    out = np.where(np.isnan(out), np.float32(np.nan), out)  # the engine's one NaN (docs)
    if out_dtype != "fp32":
        out = trn2core.quantize(out, out_dtype, rounding=rounding, seed=seed)
    return out


def same_bits(got, want, what=""):
    assert got.dtype == np.asarray(want).dtype, what
    g, w = np.asarray(got), np.asarray(want)
    if g.dtype.itemsize == 4:
        np.testing.assert_array_equal(bits(g), bits(w), err_msg=what)
    else:
        np.testing.assert_array_equal(
            g.view(f"u{g.dtype.itemsize}"), w.view(f"u{w.dtype.itemsize}"), err_msg=what
        )


@pytest.mark.parametrize("src", INPUT_DTYPES)
@pytest.mark.parametrize("target", [None, *FORMATS])
def test_gemm_quantizing_operands_gives_the_old_paths_bits(src, target, rng):
    a = as_input(boundary((5, 300), rng), src)
    b = as_input(boundary((300, 7), rng, specials=False), src if src != "float8_e4m3fn" else "int8")
    refused = target == "fp8_e4m3fn" or (target is None and src == "float8_e4m3fn")
    for rounding in ROUNDINGS if target is not None else ["nearest_even"]:
        for seed in [None, 0, 7, 2**64 - 1] if rounding == "stochastic" else [None]:
            what = f"{src} -> {target} {rounding} seed={seed}"
            if refused:
                with pytest.raises(trn2core.FormatError, match="^a: fp8_e4m3fn"):
                    trn2core.gemm(a, b, dtype=target, rounding=rounding, seed=seed)
                continue
            got = trn2core.gemm(a, b, dtype=target, rounding=rounding, seed=seed).out
            same_bits(got, old_path(a, b, dtype=target, rounding=rounding, seed=seed), what)


@pytest.mark.parametrize("target", ["fp8_e4m3", "fp8_e5m2", "bf16"])
@pytest.mark.parametrize("perf_mode", ["none", "double_row"])
def test_gemm_perf_modes_and_outputs_give_the_old_paths_bits(target, perf_mode, rng):
    a, b = boundary((9, 600), rng), boundary((600, 70), rng, specials=False).astype(np.float32)
    for out_dtype in FORMATS:
        for rounding, seed in (("nearest_even", None), ("stochastic", 3), ("toward_zero", None)):
            kw = dict(
                dtype=target, rounding=rounding, seed=seed, perf_mode=perf_mode, out_dtype=out_dtype
            )
            if perf_mode == "double_row" and target == "bf16":
                with pytest.raises(trn2core.FormatError, match="^a: .*double_row"):
                    trn2core.gemm(a, b, **kw)
                continue
            same_bits(trn2core.gemm(a, b, **kw).out, old_path(a, b, **kw), str(kw))


def test_gemm_unseeded_stochastic_rounding_takes_the_environment_seed(rng, monkeypatch):
    # Without a seed both operands (and the output) use $NEURON_RT_STOCHASTIC_ROUNDING_SEED,
    # b not seed + 1: as quantize did for each of them.
    a, b = boundary((6, 200), rng), boundary((200, 5), rng, specials=False)
    monkeypatch.setenv(trn2core.numerics.SEED_ENV, "0x2545")
    kw = dict(dtype="fp8_e4m3", rounding="stochastic", out_dtype="bf16")
    qa = trn2core.quantize(a, "fp8_e4m3", rounding="stochastic", seed=0x2545)
    qb = trn2core.quantize(b, "fp8_e4m3", rounding="stochastic", seed=0x2545)
    out = reference.gemm(qa, qb)
    out = np.where(np.isnan(out), np.float32(np.nan), out)
    want = trn2core.quantize(out, "bf16", rounding="stochastic", seed=0x2545)
    same_bits(trn2core.gemm(a, b, **kw).out, want)
    monkeypatch.setenv(trn2core.numerics.SEED_ENV, "0x2546")
    assert not np.array_equal(trn2core.gemm(a, b, **kw).out.view(np.uint16), want.view(np.uint16))


def layouts(x):
    """``x`` in the layouts numpy arrays come in, each holding the same matrix."""
    yield "C", np.ascontiguousarray(x)
    yield "F", np.asfortranarray(x)
    big = np.zeros((2 * x.shape[0], 3 * x.shape[1]), x.dtype)
    big[::2, ::3] = x
    yield "strided", big[::2, ::3]
    yield "reversed", np.ascontiguousarray(x[::-1, ::-1])[::-1, ::-1]
    if x.dtype.itemsize > 1:
        swapped = x.astype(x.dtype.newbyteorder("S"))
        yield "byte-swapped", swapped
        yield "byte-swapped F", np.asfortranarray(swapped)
    if x.dtype.itemsize > 1:
        # Misaligned data: the one layout the core cannot address, copied once.
        misaligned = np.zeros(x.nbytes + 1, np.uint8)[1:].view(x.dtype).reshape(x.shape)
        misaligned[...] = x
        assert not misaligned.flags.aligned
        yield "misaligned", misaligned


@pytest.mark.parametrize(
    "src", ["float64", "float32", "float16", "bfloat16", "float8_e5m2", "int16", "uint64"]
)
def test_gemm_reads_every_layout_and_byte_order_without_changing_a_bit(src, rng):
    a0 = as_input(boundary((7, 260), rng), src)
    b0 = as_input(boundary((260, 33), rng, specials=False), src)
    for target, rounding in (
        (None, "nearest_even"),
        ("bf16", "stochastic"),
        ("fp8_e4m3", "toward_positive"),
    ):
        want = old_path(a0, b0, dtype=target, rounding=rounding, seed=11)
        for (la, a), (lb, b) in zip(layouts(a0), list(layouts(b0))[::-1], strict=True):
            before = (a.copy(), b.copy())
            got = trn2core.gemm(a, b, dtype=target, rounding=rounding, seed=11).out
            same_bits(got, want, f"{src} a {la}, b {lb}, {target} {rounding}")
            for x, x0 in zip((a, b), before, strict=True):  # inputs are never altered
                u = f"u{x.dtype.itemsize}"
                np.testing.assert_array_equal(x.view(u), x0.view(u))


def test_gemm_of_a_sparse_tensor_quantizes_the_compressed_values(rng, monkeypatch):
    b = boundary((192, 40), rng, specials=False)
    for pattern in trn2core.SPARSITY_PATTERNS:
        dense = trn2core.prune(boundary((33, 192), rng, specials=False), pattern, axis=1)
        sp = trn2core.compress(dense, pattern, axis=1)
        for target, rounding, seed in (
            (None, "nearest_even", None),
            ("bf16", "stochastic", 4),
            ("fp8_e4m3", "toward_negative", None),
        ):
            want = old_path(dense, b, dtype=target, rounding=rounding, seed=seed)
            got = trn2core.gemm(sp, b, dtype=target, rounding=rounding, seed=seed).out
            same_bits(got, want, f"{pattern} {target} {rounding}")
    # The compressed parts go in as they are: nothing decompresses them.
    monkeypatch.setattr(trn2core.SparseTensor, "decompress", lambda self: 1 / 0)
    trn2core.gemm(sp, b)


def test_gemm_crosses_into_rust_once(rng, count_calls):
    # Every module calling the core (trn2core.spec reads its table once, at import, and refuses
    # new attributes).
    proxy = count_calls(
        *(
            module
            for name, module in list(sys.modules.items())
            if name.startswith("trn2core.")
            and name != "trn2core.spec"
            and getattr(module, "_core", None) is trn2core._core
        )
    )
    x = boundary((40, 300), rng, specials=False)
    y = boundary((300, 20), rng, specials=False)
    sp = trn2core.compress(trn2core.prune(x, "2:4"), "2:4")
    swapped = np.asfortranarray(y.astype(">f4"))
    chip = trn2core.Chip(lnc=2)
    for args, kw in (
        ((x, y), dict(dtype="bf16")),
        ((x.astype(np.float32), y.astype(np.float32)), {}),
        ((x, swapped), dict(dtype="fp8_e4m3", rounding="stochastic", seed=5, out_dtype="bf16")),
        ((x.astype(np.int32), y.astype(np.int64)), {}),
        ((sp, y), dict(dtype="bf16", core=chip.cores[1])),
        ((x, y), dict(dtype="fp8_e5m2", perf_mode="double_row", core=chip)),
    ):
        proxy.calls.clear()
        trn2core.gemm(*args, **kw)
        assert proxy.calls == ["gemm"], (kw, proxy.calls)


def test_gemm_needs_no_operand_sized_temporary():
    # 2048^2 float32 operands (16 MiB each) quantized to bf16: beyond the 16 MiB result, the
    # call may hold the packed panels (1 MiB each) but no copy of an operand, not even its 8 MiB
    # of bf16 codes (the old path held 48 MiB: codes and float32 values of both).
    code = (
        "import numpy as np, trn2core as t\n"
        "def rss(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key + ':'):\n"
        "            return int(line.split()[1]) * 1024\n"
        "rng = np.random.default_rng(0)\n"
        "a = rng.standard_normal((2048, 2048), dtype=np.float32)\n"
        "b = rng.standard_normal((2048, 2048), dtype=np.float32)\n"
        "t.gemm(a[:64, :64], b[:64, :64], dtype='bf16')\n"
        "base = rss('VmRSS')\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "out = t.gemm(a, b, dtype='bf16').out\n"
        "print(rss('VmHWM') - base - out.nbytes)\n"
    )
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/status and clear_refs to measure peak memory")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    extra = int(r.stdout)
    assert extra < 6 * 2**20, f"{extra / 2**20:.1f} MiB of temporaries"


def test_gemm_checks_the_host_before_copying_a_misaligned_operand(host_limited):
    out = host_limited(
        "raw = np.zeros(2048 * 2048 * 4 + 1, np.uint8)[1:]\n"
        "a = raw.view(np.float32).reshape(2048, 2048)",
        "t.gemm(a, np.ones((2048, 1), np.float32))",
    )
    assert "refused a: a contiguous copy of the (2048, 2048) float32 matrix" in out, out


def test_transpose_mode_returns_a_fresh_array_for_a_fortran_ordered_stationary():
    # s.T of a Fortran-ordered s is C-contiguous already: the result used to be that view, so
    # writing it changed the caller's input.
    s = np.asfortranarray(trn2core.quantize(np.arange(32 * 16).reshape(32, 16), "bf16"))
    keep = s.copy()
    out = trn2core.NeuronCore().matmul(
        s, np.eye(32, dtype=np.float32).astype(s.dtype), is_transpose=True
    )
    assert not np.shares_memory(out, s) and out.flags.c_contiguous
    assert np.array_equal(out.view(np.uint16), keep.T.view(np.uint16))
    out[...] = 0
    assert np.array_equal(s.view(np.uint16), keep.view(np.uint16))
