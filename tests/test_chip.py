"""Chips and Logical NeuronCores (contract section 5): resources, and GEMMs split over the
physical cores of a logical core or a chip with the same bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trn2core
from trn2core import Chip, LogicalCore, NeuronCore

MIB = 1 << 20
BF16_PEAK_TFLOPS = 128 * 128 * 2 * 2.4e9 / 1e12  # 78.6432


@pytest.mark.parametrize("lnc", [1, 2, 4])
def test_chip_groups_adjacent_cores(lnc):
    chip = Chip(lnc=lnc)
    assert chip.lnc == lnc
    assert len(chip.physical_cores) == 8
    assert [c.index for c in chip.physical_cores] == list(range(8))
    assert all(isinstance(c, NeuronCore) for c in chip.physical_cores)
    assert len(chip.cores) == 8 // lnc
    seen = []
    for i, lc in enumerate(chip.cores):
        assert isinstance(lc, LogicalCore)
        assert lc.index == i and lc.lnc == lnc
        idx = [c.index for c in lc.physical_cores]
        assert idx == list(range(i * lnc, (i + 1) * lnc))
        # The chip's own objects, not copies.
        assert all(p is chip.physical_cores[j] for p, j in zip(lc.physical_cores, idx, strict=True))
        assert len({j // 4 for j in idx}) == 1, "a logical core stays on one die"
        seen += idx
    assert sorted(seen) == list(range(8))


@pytest.mark.parametrize("lnc", [1, 2, 4])
def test_logical_core_resources_scale_with_lnc(lnc):
    lc = Chip(lnc=lnc).cores[0]
    assert lc.sbuf_bytes == lnc * 28 * MIB
    assert lc.hbm_bandwidth == pytest.approx(lnc * 362.5e9)
    assert lc.hbm_bytes == lnc * 12 * (1 << 30)
    assert lc.peak_tflops("bf16") == pytest.approx(lnc * BF16_PEAK_TFLOPS)
    assert lc.peak_tflops("fp32") == pytest.approx(lnc * BF16_PEAK_TFLOPS / 4)
    assert lc.peak_tflops("fp8_e4m3") == pytest.approx(lnc * BF16_PEAK_TFLOPS)
    assert lc.peak_tflops("fp8_e4m3", perf_mode="double_row") == pytest.approx(
        2 * lnc * BF16_PEAK_TFLOPS
    )
    with pytest.raises(trn2core.FormatError, match="double_row"):
        lc.peak_tflops("bf16", perf_mode="double_row")
    with pytest.raises(trn2core.FormatError, match="fp99"):
        lc.peak_tflops("fp99")


def test_adjacent_cores_share_an_hbm_stack():
    chip = Chip(lnc=2)
    c0, c1, c2 = chip.physical_cores[:3]
    c0.alloc(1 << 30, space="hbm")
    assert c1.hbm.used == 1 << 30
    assert c2.hbm.used == 0
    assert len(chip.hbm_stacks) == 4


def test_chip_totals():
    chip = Chip()
    assert chip.lnc == 2
    assert chip.sbuf_bytes == 224 * MIB
    assert chip.hbm_bytes == 96 * (1 << 30)
    assert chip.hbm_bandwidth == pytest.approx(2.9e12)
    assert chip.peak_tflops("bf16") == pytest.approx(8 * BF16_PEAK_TFLOPS)


@pytest.mark.parametrize("bad", [0, 3, 8, -2, 2.0, "2", True])
def test_bad_lnc_is_refused_with_its_value(bad):
    with pytest.raises(trn2core.Trn2Error) as e:
        Chip(lnc=bad)
    assert "lnc" in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "core_of",
    [
        lambda: Chip(lnc=1).cores[3],
        lambda: Chip(lnc=2).cores[1],
        lambda: Chip(lnc=4).cores[1],
        lambda: Chip(lnc=2),
    ],
)
def test_gemm_on_logical_cores_has_the_same_bits(core_of, rng):
    a = trn2core.quantize(rng.standard_normal((300, 700)), "bf16")
    b = trn2core.quantize(rng.standard_normal((700, 530)), "bf16")
    core = core_of()
    one = trn2core.gemm(a, b)
    split = trn2core.gemm(a, b, core=core)
    assert np.array_equal(one.out.view(np.uint32), split.out.view(np.uint32))
    assert split.report.flops == one.report.flops
    assert split.report.instructions == one.report.instructions


def test_lnc2_halves_a_compute_bound_gemm():
    one = trn2core.estimate_gemm(4096, 4096, 4096, core=Chip(lnc=1).cores[0])
    two = trn2core.estimate_gemm(4096, 4096, 4096, core=Chip(lnc=2).cores[0])
    four = trn2core.estimate_gemm(4096, 4096, 4096, core=Chip(lnc=4).cores[0])
    assert 0.49 <= two.seconds / one.seconds <= 0.53
    assert 0.24 <= four.seconds / one.seconds <= 0.28
    # A one-core logical core costs exactly like a lone NeuronCore.
    alone = trn2core.estimate_gemm(4096, 4096, 4096)
    assert one.seconds == pytest.approx(alone.seconds, rel=1e-12)
    assert two.details["cores"] == 2 and two.details["split_k"] == 1
    assert two.utilization <= 1.0
    assert two.peak_tflops == pytest.approx(2 * BF16_PEAK_TFLOPS)


def test_whole_chip_splits_over_eight_cores():
    one = trn2core.estimate_gemm(8192, 8192, 8192)
    chip = trn2core.estimate_gemm(8192, 8192, 8192, core=Chip(lnc=2))
    assert chip.details["cores"] == 8
    assert 0.124 <= chip.seconds / one.seconds <= 0.14


def test_k_split_pays_for_combining_partial_sums():
    lc = Chip(lnc=2).cores[0]
    r = trn2core.estimate_gemm(128, 65536, 512, core=lc)
    assert r.details["split_k"] == 2
    assert r.details["combine_s"] > 0
    one = trn2core.estimate_gemm(128, 65536, 512)
    # Faster than one core, slower than half of it: the combination is not free.
    assert one.seconds / 2 < r.seconds < one.seconds


def test_sparse_gemm_on_a_logical_core(rng):
    w = trn2core.quantize(rng.standard_normal((256, 512)), "bf16")
    x = trn2core.quantize(rng.standard_normal((512, 256)), "bf16")
    sp = trn2core.compress(trn2core.prune(w, "2:4", axis=1), "2:4", axis=1)
    lc = Chip(lnc=2).cores[0]
    res = trn2core.gemm(sp, x, core=lc)
    assert np.array_equal(res.out, trn2core.gemm(sp, x).out)
    dense = trn2core.estimate_gemm(256, 512, 256, core=lc)
    assert res.report.pe_cycles < dense.pe_cycles


def test_gemm_refuses_other_cores():
    a = np.ones((4, 4), np.float32)
    with pytest.raises(trn2core.Trn2Error, match="core"):
        trn2core.gemm(a, a, core="chip0")
    with pytest.raises(trn2core.Trn2Error, match="core"):
        trn2core.estimate_gemm(4, 4, 4, core=3)


def test_split_gemm_trace(tmp_path):
    r = trn2core.estimate_gemm(128, 65536, 512, core=Chip(lnc=2).cores[1])
    path = r.save_trace(tmp_path / "t.json")
    import json

    names = {
        e["args"]["name"]
        for e in json.loads(Path(path).read_text())["traceEvents"]
        if e["ph"] == "M"
    }
    assert {"PE core 2", "PE core 3"} <= names
