"""examples/nki/: every example kernel against a numpy oracle built from ``trn2core.reference``
(pure numpy), step by step in the kernel's own order, bit for bit (activation functions follow
the documented float64 rule, which the oracle reproduces); the matmul stages against
``trn2core.gemm``; the stages' timelines in the tutorial's order."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest
import trn2core
import trn2core.nki as tn
from trn2core import reference as ref

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples" / "nki"
BF16 = ml_dtypes.bfloat16


def load(name: str):
    """An example file imported with the NKI import hook in effect (then removed)."""
    with tn.install():
        path = EXAMPLES / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"nki_example_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    assert not tn.installed() and "nki" not in sys.modules
    return mod


@pytest.fixture(scope="module")
def mm():
    return load("matmul")


def _operands(k, m, n, seed=0):
    rng = np.random.default_rng(seed)
    lhsT = rng.standard_normal((k, m), dtype=np.float32).astype(BF16)
    rhs = rng.standard_normal((k, n), dtype=np.float32).astype(BF16)
    return lhsT, rhs


@pytest.mark.parametrize("stage", ["matmul_tiled", "matmul_hoisted", "matmul_blocked_free"])
def test_matmul_stages_accumulating_in_psum_equal_gemm_bit_for_bit(mm, stage):
    lhsT, rhs = _operands(512, 256, 1024)
    out = getattr(mm, stage)(lhsT, rhs)
    want = trn2core.gemm(np.ascontiguousarray(lhsT.T), rhs).out
    assert out.dtype == np.float32 and out.shape == (256, 1024)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(out, ref.gemm(np.ascontiguousarray(lhsT.T), rhs))


def test_fully_blocked_matmul_adds_k_block_partials_in_order(mm):
    lhsT, rhs = _operands(1024, 256, 1024, seed=1)
    out = mm.matmul_fully_blocked(lhsT, rhs, BM=2, BN=1, BK=2)
    acc = np.zeros((256, 1024), np.float32)
    for kb in range(1024 // 256):  # BK = 2 tiles of 128: K blocks of 256, in PSUM in order
        sl = slice(kb * 256, (kb + 1) * 256)
        part = ref.gemm(np.ascontiguousarray(lhsT[sl].T), rhs[sl])
        acc = ref.tensor_tensor(acc, part, "add", "fp32")
    assert np.array_equal(out.view(np.uint32), acc.view(np.uint32))


def test_matmul_stages_get_faster_in_the_tutorials_order_and_the_last_keeps_pe_busy(mm):
    lhsT, rhs = _operands(1024, 1024, 1024, seed=2)
    reports = [tn.run(s, lhsT, rhs).report for s in mm.STAGES]
    secs = [r.seconds for r in reports]
    assert secs == sorted(secs, reverse=True) and len(set(secs)) == 4, secs
    assert reports[0].bottleneck == "DMA"  # the tiled stage waits for its loads
    last = reports[-1]
    assert last.bottleneck == "PE" and last.utilization("PE") > 0.6, last


def test_rmsnorm_with_a_masked_last_tile():
    ex = load("rmsnorm")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 96), dtype=np.float32)
    g = rng.standard_normal(96, dtype=np.float32)
    out = ex.rmsnorm(x, g)
    sq, _ = ref.activation(x, "square", "fp32")
    ss = ref.tensor_reduce(sq, "add", 1, "fp32").reshape(-1, 1)
    ms = ref.tensor_scalar(ss, "multiply", np.float32(1.0 / 96), "fp32")
    ms = ref.tensor_scalar(ms, "add", np.float32(1e-6), "fp32")
    r, _ = ref.activation(ms, "rsqrt", "fp32")
    y = ref.tensor_scalar(x, "multiply", r, "fp32")
    want = ref.tensor_tensor(y, np.broadcast_to(g, x.shape), "multiply", "fp32")
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_layernorm_with_bn_stats_chunks():
    ex = load("layernorm")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((256, 640), dtype=np.float32).astype(BF16)
    gamma = rng.standard_normal(640, dtype=np.float32)
    beta = rng.standard_normal(640, dtype=np.float32)
    out = ex.layernorm(x, gamma, beta)
    stats = np.concatenate([ref.bn_stats(x[:, :512]), ref.bn_stats(x[:, 512:])], axis=1)
    mv = ref.bn_aggr(stats)
    rstd, _ = ref.activation(mv[:, 1:2], "rsqrt", "fp32", bias=np.float32(1e-5))
    y = ref.tensor_scalar(x, "subtract", mv[:, 0:1], "fp32", op1="multiply", operand1=rstd)
    y = ref.tensor_tensor(y, np.broadcast_to(gamma, y.shape), "multiply", "fp32")
    want = ref.tensor_tensor(y, np.broadcast_to(beta, y.shape), "add", "bf16")
    assert out.dtype == BF16
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))


def test_softmax_with_tile_operators():
    ex = load("softmax")
    rng = np.random.default_rng(5)
    x = (4 * rng.standard_normal((256, 300))).astype(np.float32)
    out = ex.softmax(x)
    mx = ref.tensor_reduce(x, "maximum", 1, "fp32").reshape(-1, 1)
    sh = ref.tensor_scalar(x, "subtract", mx, "fp32")
    e, _ = ref.activation(sh, "exp", "fp32")
    s = ref.tensor_reduce(e, "add", 1, "fp32").reshape(-1, 1)
    r = ref.reciprocal(s, "fp32")
    want = ref.tensor_scalar(e, "multiply", r, "fp32")
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    assert np.allclose(out.sum(axis=1), 1, atol=1e-5)


def test_fused_attention_forward():
    ex = load("attention")
    rng = np.random.default_rng(6)
    d, sq, sk = 64, 256, 384
    q = rng.standard_normal((sq, d), dtype=np.float32).astype(BF16)
    k = rng.standard_normal((sk, d), dtype=np.float32).astype(BF16)
    v = rng.standard_normal((sk, d), dtype=np.float32).astype(BF16)
    qT, kT = np.ascontiguousarray(q.T), np.ascontiguousarray(k.T)
    out = ex.attention_fwd(qT, kT, v)
    scale = 1.0 / d**0.5
    want = np.empty((sq, d), BF16)
    for i in range(sq // 128):
        s = ref.nc_matmul(qT[:, i * 128 : (i + 1) * 128], kT)
        mx = ref.tensor_reduce(s, "maximum", 1, "fp32").reshape(-1, 1)
        neg = ref.tensor_scalar(mx, "multiply", np.float32(-scale), "fp32")
        p, rowsum = ref.activation(s, "exp", "bf16", scale=np.float32(scale), bias=neg)
        o = None
        for c in range(sk // 128):
            pT = ref.nc_transpose(p[:, c * 128 : (c + 1) * 128])
            o = ref.nc_matmul(pT, v[c * 128 : (c + 1) * 128], psum=o)
        inv = ref.reciprocal(rowsum.reshape(-1, 1), "fp32")
        want[i * 128 : (i + 1) * 128] = ref.tensor_scalar(o, "multiply", inv, "bf16")
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    exact = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    exact = np.exp(exact - exact.max(axis=1, keepdims=True))
    exact = (exact / exact.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    assert np.abs(out.astype(np.float64) - exact).max() < 0.05


def test_tensor_add_spmd_grid_and_two_physical_cores():
    ex = load("tensor_add")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((512, 1024), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((512, 1024), dtype=np.float32).astype(np.float16)
    want = ref.tensor_tensor(a, b, "add", "fp16")
    out = ex.tensor_add_grid(a, b)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    out2 = ex.tensor_add_lnc2(a, b)
    assert np.array_equal(out2.view(np.uint16), want.view(np.uint16))
    nc = ex.nl.nc(2)
    r1 = tn.run(ex.tensor_add, a, b, grid=(4, 2)).report
    r2 = tn.run(ex.tensor_add, a, b, grid=(ex.nl.spmd_dim(2, nc), 2)).report
    assert r1.lnc == 1 and r2.lnc == 2
    assert r2.seconds < r1.seconds  # two cores share the work
    assert r2.instructions == r1.instructions
