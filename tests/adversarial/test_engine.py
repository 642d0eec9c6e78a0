"""Attack surface: the tensor engine (gemm, NeuronCore.matmul/read_psum, estimate_gemm on
cores, logical cores and chips): fresh outputs, numpy scalar arguments, sizes near 2**64 and
operands that are broadcast views of gigabytes."""

from __future__ import annotations

import numpy as np
import pytest
import trn2core as t
from trn2core import CapacityError, Trn2ValueError

from ._probe import check_outcomes

SETUP = """
a = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
s128 = np.eye(128, dtype=np.float32)
core = t.NeuronCore()
chip = t.Chip(lnc=2)
"""

CALLS = {
    "gemm out is fresh": "fresh(t.gemm(a, a).out, a)",
    "chip gemm out is fresh": "fresh(t.gemm(a, a, core=chip).out, a)",
    "transpose is fresh": "fresh(core.matmul(s128, s128, is_transpose=True), s128)",
    "transpose of fortran is fresh": (
        "f = np.asfortranarray(s128); fresh(core.matmul(f, s128, is_transpose=True), f)"
    ),
    "read_psum twice is two arrays": (
        "core.matmul(s128, s128, bank=2); p = core.read_psum(2, 128, 128); "
        "fresh(core.read_psum(2, 128, 128), p)"
    ),
    "numpy bank and sizes": (
        "core.matmul(s128, s128, bank=np.int64(3))\n"
        "core.read_psum(np.uint8(3), np.int32(4), np.int16(4))"
    ),
    "numpy seed": "t.gemm(a, a, dtype='bf16', rounding='stochastic', seed=np.int64(9))",
    "read-only operands": "r = a.copy(); r.flags.writeable = False; t.gemm(r, r)",
    "byte-swapped operands": "t.gemm(a.astype('>f4'), a.astype('>f4'))",
    "strided operands": "t.gemm(a[::2, ::2], a[::2, ::2])",
    "estimate 2**64-1 on a core": (
        "t.estimate_gemm(2**64 - 1, 2**64 - 1, 2**64 - 1)",
        "CapacityError",
    ),
    "estimate near 2**64 on a chip": (
        "t.estimate_gemm(2**63, 2**63, 128, core=chip)",
        "CapacityError",
    ),
    "estimate near 2**64 on a logical core": (
        "t.estimate_gemm(2**63, 128, 2**63, core=chip.cores[0])",
        "CapacityError",
    ),
    "estimate numpy dims": "t.estimate_gemm(np.int64(128), np.uint16(128), np.int8(64))",
    "gemm of broadcast gigabytes": (
        "t.gemm(np.broadcast_to(np.float32(1), (2**20, 2**14)), "
        "np.broadcast_to(np.float32(1), (2**14, 2**20)))",
        "CapacityError",
    ),
    "matmul huge transpose": (
        "core.matmul(np.ones((10**6, 1), np.float32), s128, is_transpose=True)",
        "any",
    ),
    "core index numpy": "t.NeuronCore(np.int64(7))",
    "core index 2**70": ("t.NeuronCore(2**70)", "Trn2ValueError"),
}


def test_engine_surface():
    check_outcomes(CALLS, setup=SETUP)


@pytest.mark.parametrize("make", ["t.Chip()", "t.Chip(lnc=2).cores[0]"])
def test_estimate_gemm_near_2_64_is_refused_with_the_shape_as_given(make):
    core = eval(make)  # noqa: S307 - a fixed expression of this test
    with pytest.raises(CapacityError) as e:
        t.estimate_gemm(2**63, 2**63, 128, core=core)
    # The message carries the dimensions as given (M used to come out divided by the split).
    assert f"M={2**63}" in str(e.value) and f"K={2**63}" in str(e.value)


def test_numpy_integer_seeds_give_the_same_bits():
    a = np.ones((8, 8), np.float32) / 3
    want = t.gemm(a, a, dtype="bf16", rounding="stochastic", seed=5).out
    for seed in (np.int64(5), np.uint32(5), np.int8(5)):
        got = t.gemm(a, a, dtype="bf16", rounding="stochastic", seed=seed).out
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"accumulate": True},
        {"perf_mode": "double_row"},
        {"tile_position": (0, 0)},
        {"tile_size": (128, 128)},
    ],
)
def test_transpose_mode_refuses_the_arguments_it_ignores(kwargs):
    s = np.ones((128, 128), np.float32)
    with pytest.raises(Trn2ValueError, match=f"{next(iter(kwargs))}: transpose mode"):
        t.NeuronCore().matmul(s, s, is_transpose=True, **kwargs)


@pytest.mark.parametrize("perf_mode", ["none", "double_row"])
def test_estimate_gemm_names_the_dtype_it_was_given_not_operands(perf_mode):
    # estimate_gemm has no operands: its format errors named `a`, an argument never passed.
    dtype = "fp8_e4m3fn" if perf_mode == "none" else "bf16"
    with pytest.raises(t.FormatError) as e:
        t.estimate_gemm(128, 128, 128, dtype=dtype, perf_mode=perf_mode)
    assert str(e.value).startswith(f"dtype: {'fp8_e4m3fn' if perf_mode == 'none' else 'perf_mode'}")
