"""estimate_gemm at any scale (contract section 2: "shapes far beyond host memory can be costed
in milliseconds"): the fast evaluation of the schedule gives the walk's numbers exactly, costs
huge shapes in well under a second, and refuses shapes its counters cannot hold.

Design: docs/performance-model.md, "How the schedule is evaluated".
"""

from __future__ import annotations

import json
import time

import pytest
import trn2core as t
from trn2core import _core
from trn2core.errors import CapacityError

PE_HZ = t.spec.pe_clock_hz


def matmul_cycles(m: int, n: int, fp32: bool) -> int:
    """max(min(64, M), N) PE cycles, x4 with fp32 operands ([S10])."""
    c = max(min(64, m), n)
    return 4 * c if fp32 else c


def closed_form_pe_cycles(m: int, k: int, n: int, k_per_instruction: int, fp32: bool) -> int:
    """PE cycles of every instruction of the schedule, summed in closed form."""
    mt, nt, kt = -(-m // 128), -(-n // 512), -(-k // k_per_instruction)
    last_m, last_n = m - (mt - 1) * 128, n - (nt - 1) * 512

    def row(rows: int) -> int:
        return (nt - 1) * matmul_cycles(rows, 512, fp32) + matmul_cycles(rows, last_n, fp32)

    return kt * ((mt - 1) * row(128) + row(last_m))


HUGE = [
    (10**6, 10**6, 10**6),
    (10**7, 10**7, 10**5),
    (10**7, 10**5, 10**7),
    (2**40, 2**12, 2**12),
]


@pytest.mark.parametrize("shape", HUGE)
@pytest.mark.parametrize("throttle", [True, False])
def test_huge_shapes_cost_in_well_under_a_second(shape, throttle):
    m, k, n = shape
    start = time.perf_counter()
    r = t.estimate_gemm(m, k, n, throttle=throttle)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, elapsed
    assert r.instructions == -(-m // 128) * -(-n // 512) * -(-k // 128)
    assert r.pe_cycles == closed_form_pe_cycles(m, k, n, 128, False)
    d = r.details
    assert d["pe_busy_s"] == r.pe_cycles / PE_HZ
    # K is long: no group ever waits for a PSUM bank, and the throttle ramps once (3 us from
    # half rate: 0.75 us lost) or not at all.
    assert d["psum_wait_s"] == 0.0
    assert d["throttle_s"] == (0.75e-6 if throttle else 0.0)
    assert d["compute_s"] > d["pe_busy_s"]
    assert d["compute_s"] - d["pe_busy_s"] < 2e-6
    assert r.seconds == d["dma_prologue_s"] + max(d["compute_s"], d["memory_s"])
    assert 0.0 < r.utilization <= 1.0


def test_a_long_single_column_gemm_matches_its_closed_form_exactly():
    # N = 512: one PSUM bank per group and K long enough that no eviction is waited for; the
    # evictors alternate ACT, DVE, ..., so with an odd number of groups the last is ACT's:
    # (512 + 60) ACT cycles = 1144 PE cycles after the last matmul, which follows the exposed
    # first LoadStationary (128 / 4 = 32 cycles) and every matmul back to back (throttle off).
    groups = 2 * 1_000_003 + 1
    r = t.estimate_gemm(groups * 128, 10**4, 512, throttle=False)
    kt = -(-(10**4) // 128)
    assert r.pe_cycles == groups * kt * 512
    ticks = 2 * (32 + r.pe_cycles + 1144)  # the model's clock: 4.8 GHz, 2 ticks a PE cycle
    assert r.details["compute_s"] == ticks / 4.8e9
    assert r.bound == "compute"
    assert r.cycles == (r.details["dma_prologue_s"] + r.details["compute_s"]) * PE_HZ


WALKABLE = [
    ((1, 1, 1), {}),
    ((300, 1000, 700), {}),
    ((4096, 128, 4096), {}),
    ((4096, 128, 4096), {"throttle": False}),
    ((129, 129, 4097), {"dtype": "fp32"}),
    ((5000, 300, 7000), {"dtype": "fp8_e4m3", "perf_mode": "double_row"}),
    ((2000, 3000, 1000), {"sparsity": "4:16"}),
    ((2000, 3000, 1000), {"sparsity": "2:4", "throttle": False}),
    ((1, 100_000, 1), {}),
    ((100_000, 1, 1), {"dtype": "fp16"}),
    ((16384, 8192, 8192), {}),
]


@pytest.mark.parametrize(("shape", "kw"), WALKABLE)
def test_the_fast_evaluation_equals_the_walk_of_every_instruction(shape, kw):
    dtype = kw.get("dtype", "bf16")
    mode = kw.get("perf_mode", "none")
    throttle = kw.get("throttle", True)
    fast = t.estimate_gemm(*shape, **kw).to_dict()
    walk = _core._estimate_gemm_walk(*shape, dtype, mode, throttle, kw.get("sparsity"))
    assert fast.keys() <= walk.keys() | {"events"}
    for key, value in walk.items():
        assert fast[key] == value, key  # floats equal exactly, details included


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ((2**40, 2**20, 2**20), "2**62 PE cycles"),
        ((2**36, 2**15, 2**20), "2**63 bytes"),
        ((2**62, 2**62, 2**62), "too many tiles"),
    ],
)
def test_shapes_beyond_the_counters_raise_capacity_error(shape, says):
    with pytest.raises(CapacityError, match=rf"^shape: M={shape[0]} K={shape[1]} N={shape[2]}"):
        t.estimate_gemm(*shape)
    with pytest.raises(CapacityError, match=says.replace("*", r"\*")):
        t.estimate_gemm(*shape)


def test_a_huge_shape_trace_is_truncated_with_a_marker(tmp_path):
    r = t.estimate_gemm(10**6, 10**6, 10**6)
    path = tmp_path / "trace.json"
    start = time.perf_counter()
    r.save_trace(str(path))
    assert time.perf_counter() - start < 10.0
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    blocks = [e for e in events if e["name"] == "matmul block"]
    assert len(blocks) == 1 << 16
    (marker,) = [e for e in events if e["name"].startswith("trace truncated")]
    # The marker spans from the last recorded block to the end of the PE side.
    last = max(e["ts"] + e["dur"] for e in blocks)
    assert marker["ts"] == pytest.approx(last, abs=1e-3)
    end_us = (r.details["dma_prologue_s"] + r.details["compute_s"]) * 1e6
    assert marker["ts"] + marker["dur"] == pytest.approx(end_us, rel=1e-12)
