"""The whole NeuronCore (contract section 7) against ``trn2core.reference``'s independent numpy
oracles, bit for bit: every instruction over random, boundary and adversarial inputs (NaN
payloads, Inf, -0.0, subnormals, saturation) and every dtype its engine takes; the engine rules
as errors naming the rule and the operand; capacity and never-written memory; the report."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import trn2core
from trn2core import reference as ref
from trn2core.machine import ACTIVATION_FUNCTIONS, ALU_OPS, MACHINE_DTYPES

DT = ref.MACHINE_DTYPES
FLOATS = ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8_e3m4")
INTS = ("uint8", "int8", "uint16", "int16", "uint32", "int32")
ARITH = [o for o in ALU_OPS if o in ref._ARITH_BINARY]
UNARY = [o for o in ALU_OPS if o in ref._ARITH_UNARY]
BITVEC = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}

_SPECIAL = {
    4: [
        0,
        0x80000000,
        1,
        0x80000001,
        0x007FFFFF,
        0x00800000,
        0x3F800000,
        0xBF800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x7FA00001,
        0xFFC01234,
        0x3F808000,
        0x3F807FFF,
        0x4B800000,
        0x3F7FFFFF,
        0x40490FDB,
        0xC1200000,
    ],
    2: [
        0,
        0x8000,
        1,
        0x8001,
        0x007F,
        0x0080,
        0x3F80,
        0xBF80,
        0x7F7F,
        0xFF7F,
        0x7F80,
        0xFF80,
        0x7FC0,
        0x7FA1,
        0xFFC1,
        0x03FF,
        0x0400,
        0x3C00,
        0x7BFF,
        0x7C00,
        0x7E00,
        0x7C01,
    ],
}


def codes(dtype: str, shape, seed: int = 0) -> np.ndarray:
    """Random raw codes of ``dtype`` with its boundary values first, as an array of ``dtype``."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    size = DT[dtype].itemsize
    u = _UINT[size]
    raw = rng.integers(0, 2 ** (8 * size), n, dtype=np.uint64).astype(u)
    if dtype in ("fp32", "tf32"):
        # Three quarters moderate magnitudes, so sums and products stay finite and round.
        mod = rng.random(n) < 0.75
        exp = rng.integers(100, 150, n, dtype=np.uint32) << 23
        raw = np.where(mod, (raw & np.uint32(0x807FFFFF)) | exp, raw).astype(u)
    if dtype in INTS:
        info = np.iinfo(DT[dtype])
        special = [0, 1, info.max, info.min, info.max - 1, 2, 3]
        special = [np.array(v, dtype=DT[dtype]).view(u) for v in special]
    elif DT[dtype].itemsize == 1:
        special = list(range(256))
    else:
        special = _SPECIAL[size]
    k = min(len(special), n)
    raw[:k] = np.array(special[:k], dtype=u)
    if dtype == "tf32":
        raw &= np.uint32(0xFFFFE000)
    return raw.view(DT[dtype]).reshape(shape)


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(_UINT[a.dtype.itemsize])


def assert_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    g, w = bits(got), bits(want)
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    assert bad.size == 0, (
        f"{what}: {bad.size} of {g.size} differ; first at {bad[0]}: got "
        f"{g.reshape(-1)[bad[0]]:#x}, want {w.reshape(-1)[bad[0]]:#x}"
    )


def put(core, data, dtype: str, space: str = "sbuf"):
    t = core.tile(data.shape, dtype, space=space)
    core.write(t, data)
    return t


def out(core, shape, dtype: str, space: str = "sbuf"):
    return core.tile(shape, dtype, space=space)


# -------------------------------------------------------------------------- tensor_tensor


@pytest.mark.parametrize("op", ARITH)
@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_tensor_tensor_matches_the_oracle(op, dtype):
    engine = "gpsimd" if op == "power" else "vector"
    core = trn2core.NeuronCore()
    a = codes(dtype, (128, 40), 1)
    b = codes(dtype, (128, 40), 2)[:, ::-1].copy()
    ta, tb = put(core, a, dtype), put(core, b, dtype)
    d = out(core, (128, 40), dtype)
    getattr(core, engine).tensor_tensor(d, ta, tb, op=op)
    want = ref.tensor_tensor(a, b, op, dtype, engine=engine, dtypes=(dtype, dtype))
    assert_bits(core.read(d), want, f"{op} {dtype}")


@pytest.mark.parametrize(
    "da,db,dd",
    [
        ("fp32", "bf16", "bf16"),
        ("bf16", "fp32", "fp32"),
        ("fp32", "fp32", "fp8_e4m3"),
        ("int32", "fp16", "bf16"),
        ("fp8_e5m2", "uint8", "int16"),
        ("tf32", "fp32", "tf32"),
    ],
)
def test_tensor_tensor_mixed_dtypes_and_strided_views(da, db, dd):
    core = trn2core.NeuronCore()
    a, b = codes(da, (96, 64), 3), codes(db, (96, 64), 4)
    for op in ("add", "multiply", "maximum", "divide"):
        want = ref.tensor_tensor(a, b, op, dd, dtypes=(da, db))
        ta, tb, d = put(core, a, da), put(core, b, db), out(core, (96, 64), dd)
        core.vector.tensor_tensor(d, ta, tb, op=op)
        assert_bits(core.read(d), want, f"{op} {da} {db} {dd}")
        # The same through every other element of wider tiles (the general path).
        wa, wb, wd = (core.tile((96, 128), x) for x in (da, db, dd))
        core.write(wa[:, ::2], a)
        core.write(wb[:, ::2], b)
        core.vector.tensor_tensor(wd[:, ::2], wa[:, ::2], wb[:, ::2], op=op)
        assert_bits(core.read(wd[:, ::2]), want, f"{op} strided")


def test_in_place_and_overlapping_operands():
    core = trn2core.NeuronCore()
    a, b = codes("bf16", (128, 300), 5), codes("bf16", (128, 300), 6)
    ta, tb = put(core, a, "bf16"), put(core, b, "bf16")
    core.vector.tensor_tensor(ta, ta, tb, op="subtract")
    a1 = ref.tensor_tensor(a, b, "subtract", "bf16")
    assert_bits(core.read(ta), a1, "a -= b")
    core.vector.tensor_tensor(ta, ta, ta, op="multiply")
    assert_bits(core.read(ta), ref.tensor_tensor(a1, a1, "multiply", "bf16"), "a *= a")
    # Output one element right of the input: every input is read before it is overwritten.
    full = put(core, codes("fp32", (128, 301), 7), "fp32")
    before = core.read(full[:, 0:300])
    core.vector.tensor_tensor(full[:, 1:301], full[:, 0:300], full[:, 0:300], op="add")
    assert_bits(core.read(full[:, 1:301]), ref.tensor_tensor(before, before, "add", "fp32"), "")


def test_positional_tensor_tensor_agrees_with_keywords():
    """The binding's shortcut for a small positional tensor_tensor (the NKI front end's hot
    path, also ``Machine.tensor_tensor_at``'s) against the general path (the same call by
    keywords): the same bits, the same recorded program and the same errors, naming the same
    argument."""

    def issue(core, kw, engine, d, a, b, op, at=None):
        m = core._m
        if kw == "fixed":
            return m.tensor_tensor_at(at, engine, d, a, b, op)
        if kw:
            args = {"engine": engine, "dst": d, "data1": a, "data2": b, "op": op}
            return (
                m.issue("tensor_tensor", **args)
                if at is None
                else m.issue_at(at, "tensor_tensor", **args)
            )
        if at is None:
            return m.issue("tensor_tensor", engine, d, a, b, op)
        return m.issue_at(at, "tensor_tensor", engine, d, a, b, op)

    def program(kw):
        core = trn2core.NeuronCore()
        x, y = codes("fp32", (128, 24), 3), codes("bf16", (128, 24), 4)
        i, j = codes("int32", (4, 6), 5), codes("int32", (4, 6), 6)
        a, b = put(core, x, "fp32"), put(core, y, "bf16")
        p, q = put(core, i, "int32"), put(core, j, "int32")
        d, e, r = (
            out(core, (128, 24), "fp32"),
            out(core, (128, 24), "bf16"),
            out(core, (4, 6), "int32"),
        )
        loc = core._m.locate("k.py", 7)
        issue(core, kw, "vector", d, a, b, "multiply")
        issue(core, kw, "vector", e, d, a, "minimum", at=loc)
        issue(core, kw, "gpsimd", d, d, e, "power")
        issue(core, kw, "gpsimd", r, p, q, "subtract")
        issue(core, kw, "vector", r, r, q, "bitwise_xor")
        issue(core, kw, "vector", a[:, 1:7], a[:, 0:6], b[:, 2:8], "add")
        big = core.tile((128, 1024), "fp32")  # past the shortcut's size: the general path
        core._m.issue("memset", "vector", big, 1.5)
        issue(core, kw, "vector", big, big, big, "multiply")
        reads_big = bits(core.read(big))
        errors = []
        for args in [
            (7, d, a, b, "add"),
            ("vector", d, a, "b", "add"),
            ("vector", d, a, b, "abs"),
            ("scalar", d, a, b, "add"),
            ("vector", d, a, b, "power"),
            ("vector", d, a, p, "add"),
            ("vector", d[:4], a, b, "add"),
            ("vector", r, p, a, "bitwise_and"),
        ]:
            with pytest.raises(trn2core.Trn2Error) as err:
                issue(core, kw, *args)
            errors.append((type(err.value), str(err.value), err.value.arg))
        with pytest.raises(trn2core.Trn2Error) as err:
            issue(core, kw, "vector", d, a, b, "add", at=loc + 5)
        errors.append((type(err.value), str(err.value), err.value.arg))
        rep = core._m.run()
        reads = [bits(core.read(t)) for t in (a, d, e, r)] + [reads_big]
        return reads, errors, (rep.ticks, rep.opcodes, rep.queues, rep.lines, rep.times())

    (kr, ke, kp) = program(True)
    assert len(ke) == 9 and ke[0][2] == "engine" and ke[1][2] == "data2"
    for form in (False, "fixed"):
        pr, pe, pp = program(form)
        for got, want in zip(pr, kr, strict=True):
            np.testing.assert_array_equal(got, want)
        assert pe == ke
        assert pp == kp


@pytest.mark.parametrize("dtype", INTS)
def test_bitvec_operators_work_on_raw_bits(dtype):
    core = trn2core.NeuronCore()
    a = codes(dtype, (64, 32), 8)
    b = (bits(codes(dtype, (64, 32), 9)) % 40).astype(DT[dtype].newbyteorder("=")).view(DT[dtype])
    ta, tb, d = put(core, a, dtype), put(core, b, dtype), out(core, (64, 32), dtype)
    for op in BITVEC:
        core.vector.tensor_tensor(d, ta, tb, op=op)
        assert_bits(core.read(d), ref.tensor_tensor(a, b, op, dtype), f"{op} {dtype}")
    core.vector.tensor_scalar(d, ta, "invert", 0)
    assert_bits(core.read(d), ref.tensor_scalar(a, "invert", 0, dtype), f"invert {dtype}")
    core.vector.tensor_scalar(d, ta, "bitwise_and", 0x0F0F, op1="left_shift", operand1=3)
    want = ref.tensor_scalar(a, "bitwise_and", 0x0F0F, dtype, op1="left_shift", operand1=3)
    assert_bits(core.read(d), want, f"and/shift {dtype}")


def test_gpsimd_int32_is_native_and_vector_is_fp32():
    core = trn2core.NeuronCore()
    a = np.array([[2**31 - 1, 16_777_217, -5, -(2**31)]], dtype=np.int32)
    ta, d = put(core, a, "int32"), out(core, (1, 4), "int32")
    for engine in ("gpsimd", "vector"):
        for op in ("add", "multiply", "subtract", "maximum", "less"):
            getattr(core, engine).tensor_tensor(d, ta, ta, op=op)
            want = ref.tensor_tensor(a, a, op, "int32", engine=engine)
            assert_bits(core.read(d), want, f"{engine} {op}")
    core.gpsimd.tensor_tensor(d, ta, ta, op="add")
    assert core.read(d).tolist() == [[-2, 33_554_434, -10, 0]]


# -------------------------------------------------------------------------- tensor_scalar


@pytest.mark.parametrize("dtype", ("fp32", "bf16", "fp16", "fp8_e4m3", "int16", "tf32"))
@pytest.mark.parametrize("op0", ARITH + UNARY)
def test_tensor_scalar_matches_the_oracle(dtype, op0):
    core = trn2core.NeuronCore()
    a = codes(dtype, (128, 24), 11)
    s0 = ((np.arange(128, dtype=np.float32) - 60) * 0.37).reshape(128, 1)
    op1 = ARITH[(ARITH.index(op0) * 5 + 3) % len(ARITH)] if op0 in ARITH else "add"
    ta, ts, d = put(core, a, dtype), put(core, s0, "fp32"), out(core, (128, 24), dtype)
    for rev in (False, True):
        core.vector.tensor_scalar(d, ta, op0, ts, rev, op1, 1.5, rev)
        want = ref.tensor_scalar(
            a, op0, s0, dtype, reverse0=rev, op1=op1, operand1=1.5, reverse1=rev, dtype=dtype
        )
        assert_bits(core.read(d), want, f"{op0},{op1} rev={rev}")
    # A constant operand is rounded once to float32.
    core.vector.tensor_scalar(d, ta, op0, 0.1)
    assert_bits(core.read(d), ref.tensor_scalar(a, op0, 0.1, dtype, dtype=dtype), "constant")


def test_scalar_engine_tensor_scalar_and_gpsimd_rsqrt():
    core = trn2core.NeuronCore()
    a = codes("bf16", (128, 64), 12)
    ta, d = put(core, a, "bf16"), out(core, (128, 64), "fp32")
    core.scalar.tensor_scalar(d, ta, "multiply", 0.5, op1="add", operand1=-1.0)
    want = ref.tensor_scalar(a, "multiply", 0.5, "fp32", op1="add", operand1=-1.0)
    assert_bits(core.read(d), want, "ACT mult+add")
    core.gpsimd.tensor_scalar(d, ta, "rsqrt")
    assert_bits(core.read(d), ref.tensor_scalar(a, "rsqrt", 0.0, "fp32"), "POOL rsqrt")


def test_scalar_tensor_tensor_reciprocal_select():
    core = trn2core.NeuronCore()
    a, b = codes("bf16", (128, 50), 13), codes("fp32", (128, 50), 14)
    ta, tb, d = put(core, a, "bf16"), put(core, b, "fp32"), out(core, (128, 50), "bf16")
    for op0, op1, r0, r1 in [
        ("subtract", "multiply", False, False),
        ("divide", "maximum", True, True),
        ("abs", "add", False, True),
    ]:
        core.vector.scalar_tensor_tensor(d, ta, op0, 0.75, op1, tb, r0, r1)
        want = ref.scalar_tensor_tensor(a, op0, 0.75, op1, b, "bf16", reverse0=r0, reverse1=r1)
        assert_bits(core.read(d), want, f"stt {op0} {op1}")
    core.vector.reciprocal(d, tb)
    assert_bits(core.read(d), ref.reciprocal(b, "bf16"), "reciprocal")
    p = np.tile(np.array([0, -0.0, np.nan, 2.0], np.float32), (128, 13))[:, :50].copy()
    tp = put(core, p, "fp32")
    core.vector.select(d, tp, ta, tb)
    assert_bits(core.read(d), ref.select(p, a, b, "bf16"), "select")
    core.vector.select(d, tp, ta, -7.25)
    assert_bits(core.read(d), ref.select(p, a, -7.25, "bf16"), "select constant")
    tb16 = put(core, codes("bf16", (128, 50), 15), "bf16")
    core.vector.select(d, tp, ta, tb16)
    assert_bits(core.read(d), ref.select(p, a, core.read(tb16), "bf16"), "select keeps bits")


@pytest.mark.parametrize("src", MACHINE_DTYPES)
def test_tensor_copy_every_dtype_pair(src):
    core = trn2core.NeuronCore()
    a = codes(src, (32, 16), 16)
    ta = put(core, a, src)
    for dst in MACHINE_DTYPES:
        for engine in ("vector", "scalar", "gpsimd"):
            d = out(core, (32, 16), dst)
            getattr(core, engine).tensor_copy(d, ta)
            assert_bits(core.read(d), ref.tensor_copy(a, dst, dtype=src), f"{src}->{dst}")
            core.free(d)
    # DMA casts the same way, through HBM.
    for dst in MACHINE_DTYPES:
        h = core.hbm_tensor(shape=(32, 16), dtype=dst)
        core.dma.copy(h, ta)
        assert_bits(core.read(h), ref.tensor_copy(a, dst, dtype=src), f"dma {src}->{dst}")


@pytest.mark.parametrize("dtype", MACHINE_DTYPES)
def test_memset_rounds_once(dtype):
    core = trn2core.NeuronCore()
    t = out(core, (16, 5), dtype)
    for v in (
        0.0,
        -0.0,
        1.0,
        1 + 2**-8,
        1 + 2**-8 + 2**-30,
        -2.5,
        300.0,
        1e9,
        -1e40,
        16_777_217.0,
        float("inf"),
        float("nan"),
        3.0e-45,
    ):
        core.gpsimd.memset(t, v)
        assert_bits(core.read(t), ref.memset((16, 5), v, dtype), f"memset {dtype} {v}")


# --------------------------------------------------------------------- reductions and scans


@pytest.mark.parametrize(
    "op", ["add", "maximum", "minimum", "multiply", "subtract", "logical_or", "logical_xor"]
)
def test_tensor_reduce(op):
    core = trn2core.NeuronCore()
    a = codes("fp32", (16, 3, 8), 21)
    ta = put(core, a, "fp32")
    for axes, kept in ((1, (16, 3)), (2, (16,))):
        for negate in (False, True):
            d = out(core, kept if len(kept) > 1 else (16, 1), "bf16")
            core.vector.tensor_reduce(d, op, ta, axes, negate)
            want = ref.tensor_reduce(a, op, axes, "bf16", negate=negate).reshape(d.shape)
            assert_bits(core.read(d), want, f"{op} axes={axes} negate={negate}")
            core.free(d)


def test_tensor_reduce_bitvec():
    core = trn2core.NeuronCore()
    a = codes("uint16", (8, 32), 22)
    ta, d = put(core, a, "uint16"), out(core, (8, 1), "uint16")
    for op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        core.vector.tensor_reduce(d, op, ta, 1)
        assert_bits(core.read(d), ref.tensor_reduce(a, op, 1, "uint16").reshape(8, 1), op)


def test_tensor_tensor_scan():
    core = trn2core.NeuronCore()
    a, b = codes("bf16", (128, 37), 23), codes("bf16", (128, 37), 24)
    init = (np.arange(128, dtype=np.float32) * 0.25).reshape(128, 1)
    ta, tb, ti, d = (
        put(core, a, "bf16"),
        put(core, b, "bf16"),
        put(core, init, "fp32"),
        out(core, (128, 37), "bf16"),
    )
    for op0, op1, r0, r1 in [
        ("multiply", "add", False, False),
        ("subtract", "maximum", True, True),
        ("add", "multiply", True, False),
    ]:
        core.vector.tensor_tensor_scan(d, ta, tb, ti, op0, op1, r0, r1)
        want = ref.tensor_tensor_scan(a, b, init, op0, op1, "bf16", reverse0=r0, reverse1=r1)
        assert_bits(core.read(d), want, f"scan {op0} {op1}")
    core.vector.tensor_tensor_scan(d, ta, tb, 2.5, "multiply", "add")
    assert_bits(core.read(d), ref.tensor_tensor_scan(a, b, 2.5, "multiply", "add", "bf16"), "c")


@pytest.mark.parametrize("reduce_op", ["add", "multiply", "maximum", "minimum"])
def test_tensor_scalar_reduce(reduce_op):
    core = trn2core.NeuronCore()
    a = codes("fp32", (128, 10), 25)
    ta, d, r = put(core, a, "fp32"), out(core, (128, 10), "bf16"), out(core, (128, 1), "fp32")
    core.vector.tensor_scalar_reduce(d, ta, "multiply", 0.5, reduce_op, r, negate=True)
    dst, res = ref.tensor_scalar_reduce(a, "multiply", 0.5, reduce_op, "bf16", negate=True)
    assert_bits(core.read(d), dst, "dst")
    assert_bits(core.read(r).reshape(-1), res, "reduce_res")


def test_bn_stats_and_bn_aggr():
    core = trn2core.NeuronCore()
    rng = np.random.default_rng(26)
    x = (rng.standard_normal((128, 1000)) * 3 + 1).astype(ml_dtypes.bfloat16)
    x[0, 5] = np.inf  # an adversarial row
    tx = put(core, x, "bf16")
    st = out(core, (128, 2, 6), "fp32")
    core.vector.bn_stats(st[:, 0], tx[:, 0:500])
    core.vector.bn_stats(st[:, 1], tx[:, 500:1000])
    want_st = np.stack([ref.bn_stats(x[:, :500]), ref.bn_stats(x[:, 500:])], axis=1)
    assert_bits(core.read(st), want_st, "bn_stats")
    agg = out(core, (128, 2), "fp32")
    core.vector.bn_aggr(agg, st.reshape_free([12]))
    want = ref.bn_aggr(want_st.reshape(128, 12))
    assert_bits(core.read(agg), want, "bn_aggr")
    mean, var = core.read(agg)[1:].T
    x64 = x[1:].astype(np.float64)
    np.testing.assert_allclose(mean, x64.mean(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(var, x64.var(axis=1), rtol=1e-4)


# ----------------------------------------------------------------------------- activation


@pytest.mark.parametrize("func", ACTIVATION_FUNCTIONS)
@pytest.mark.parametrize("dtype", ("fp32", "bf16", "fp8_e4m3"))
def test_activation_matches_the_float64_rule(func, dtype):
    core = trn2core.NeuronCore()
    a = codes(dtype, (128, 48), 31)
    bias = (np.arange(128) * 0.0625 - 4).astype(ml_dtypes.bfloat16).reshape(128, 1)
    ta, tbias = put(core, a, dtype), put(core, bias, "bf16")
    d, acc = out(core, (128, 48), "bf16"), out(core, (128, 1), "fp32")
    core.scalar.activation(
        d,
        ta,
        func,
        scale=0.5,
        bias=tbias,
        reduce_op="add",
        reduce_res=acc,
        reduce_cmd="reset_reduce",
    )
    want, sums = ref.activation(a, func, "bf16", scale=0.5, bias=bias, dtype=dtype)
    assert_bits(core.read(d), want, f"{func} {dtype}")
    assert_bits(core.read(acc).reshape(-1), sums, f"{func} sums")
    acc2 = out(core, (128, 1), "fp32")
    core.scalar.activation_reduce(d, ta, func, "add", acc2, scale=0.5, bias=tbias)
    assert_bits(core.read(acc2).reshape(-1), sums, f"{func} activation_reduce")


def test_activation_registers_accumulate_across_instructions():
    core = trn2core.NeuronCore()
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    ta, d, r = put(core, a, "fp32"), out(core, (4, 3), "fp32"), out(core, (4, 1), "fp32")
    core.scalar.activation(d, ta, "copy", reduce_op="add", reduce_cmd="reset_reduce")
    core.scalar.activation(d, ta, "square", reduce_op="add", reduce_res=r, reduce_cmd="reduce")
    assert core.read(r).reshape(-1).tolist() == (a + a * a).sum(axis=1).tolist()


def test_activation_transcendentals_on_every_bf16_value():
    # Every bf16 code through exp, tanh, gelu and log: the float64 rule, bit for bit.
    core = trn2core.NeuronCore()
    a = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    a = a.reshape(128, 512)
    ta, d = put(core, a, "bf16"), out(core, (128, 512), "fp32")
    for func in ("exp", "tanh", "gelu", "log", "sigmoid", "erf"):
        core.scalar.activation(d, ta, func)
        want, _ = ref.activation(a, func, "fp32")
        assert_bits(core.read(d), want, func)


# --------------------------------------------------------------------------------- GpSimd


@pytest.mark.parametrize("dtype", ("int32", "int8", "uint16", "fp32", "bf16", "fp8_e5m2"))
def test_iota(dtype):
    core = trn2core.NeuronCore()
    d = out(core, (8, 2, 5), dtype)
    pattern = [(1000, 2), (-3, 5)]
    core.gpsimd.iota(d, pattern, offset=7, channel_multiplier=-300)
    assert_bits(core.read(d), ref.iota((8, 2, 5), pattern, 7, -300, dtype), dtype)


@pytest.mark.parametrize(
    "cmp", ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal")
)
def test_affine_select_causal_masks(cmp):
    core = trn2core.NeuronCore()
    x = codes("bf16", (128, 64), 41)
    tx = put(core, x, "bf16")
    for dtype in ("bf16", "fp32"):
        d = out(core, (128, 64), dtype)
        core.gpsimd.affine_select(d, [(-1, 64)], 1, tx, -30000.0, cmp, 3)
        want = ref.affine_select(x, [(-1, 64)], 1, -30000.0, cmp, 3, dtype)
        assert_bits(core.read(d), want, f"{cmp} {dtype}")


# ------------------------------------------------------------------------- tensor engine


@pytest.mark.parametrize("dtype", ("bf16", "fp16", "fp8_e4m3", "fp32"))
def test_nc_matmul_and_accumulation(dtype):
    core = trn2core.NeuronCore()
    k, m, n = 128, 64, 200
    rng = np.random.default_rng(51)
    st = rng.standard_normal((k, m)).astype(DT[dtype])
    mv = rng.standard_normal((k, n)).astype(DT[dtype])
    ts, tm = put(core, st, dtype), put(core, mv, dtype)
    ps = core.tile((m, n), "fp32", space="psum")
    core.pe.matmul(ps, ts, tm)
    once = ref.nc_matmul(st, mv)
    assert_bits(core.read(ps), once, "first write")
    core.pe.matmul(ps, ts, tm)
    assert_bits(core.read(ps), ref.nc_matmul(st, mv, psum=once), "accumulated")
    core.pe.matmul(ps, ts, tm, accumulate=False)
    assert_bits(core.read(ps), once, "overwritten")


def test_nc_matmul_double_row_and_transposes():
    core = trn2core.NeuronCore()
    rng = np.random.default_rng(52)
    st = rng.standard_normal((128, 2, 16)).astype(ml_dtypes.float8_e4m3)
    mv = rng.standard_normal((128, 2, 100)).astype(ml_dtypes.float8_e5m2)
    ts, tm = put(core, st, "fp8_e4m3"), put(core, mv, "fp8_e5m2")
    ps = core.tile((16, 100), "fp32", space="psum")
    core.pe.matmul(ps, ts, tm, perf_mode="double_row")
    assert_bits(core.read(ps), ref.nc_matmul(st, mv, perf_mode="double_row"), "double_row")
    x = codes("bf16", (100, 70), 53)
    tx = put(core, x, "bf16")
    pt = core.tile((70, 100), "bf16", space="psum")
    core.pe.transpose(pt, tx)
    assert_bits(core.read(pt), ref.nc_transpose(x), "PE transpose")
    v = codes("fp8_e3m4", (32, 20), 54)
    tv, vt = put(core, v, "fp8_e3m4"), out(core, (20, 32), "fp8_e3m4")
    core.vector.transpose(vt, tv)
    assert_bits(core.read(vt), ref.nc_transpose(v), "DVE transpose")


# ------------------------------------------------------------------------ rules and errors


def test_engine_rules_raise_errors_naming_rule_and_operand():
    core = trn2core.NeuronCore()
    a = put(core, np.ones((128, 64), np.float32), "fp32")
    b = put(core, np.ones((128, 64), np.float32), "fp32")
    p1 = put(core, np.zeros((128, 64), np.float32), "fp32", space="psum")
    p2 = put(core, np.zeros((128, 64), np.float32), "fp32", space="psum")
    h = core.hbm_tensor(np.zeros((128, 64), np.float32))
    cases = [
        (
            lambda: core.vector.tensor_tensor(a, p1, p2),
            "two_psum_inputs",
            "data2",
            trn2core.Trn2ValueError,
        ),
        (
            lambda: core.gpsimd.tensor_tensor(a, p1, b),
            "gpsimd_psum",
            "data1",
            trn2core.Trn2ValueError,
        ),
        (
            lambda: core.vector.tensor_tensor(a, h, b),
            "engine_memory",
            "data1",
            trn2core.Trn2ValueError,
        ),
        (
            lambda: core.vector.tensor_copy(a[32:128], b[32:128]),
            "start_partition",
            "src",
            trn2core.ShapeError,
        ),
        (lambda: core.vector.tensor_copy(a, b[0:64]), "shape", "dst", trn2core.ShapeError),
        (
            lambda: core.scalar.tensor_scalar(a, b, "add", 1.0, op1="multiply", operand1=2.0),
            "act_tensor_scalar_ops",
            "op0",
            trn2core.Trn2ValueError,
        ),
        (
            lambda: core.vector.tensor_scalar(a, b, "add", core.tile((128, 1), "bf16")),
            "fp32_operand",
            "operand0",
            trn2core.FormatError,
        ),
        (
            lambda: core.vector.tensor_tensor(a, a, b, op="bitwise_or"),
            "bitvec_dtype",
            "data1",
            trn2core.FormatError,
        ),
        (
            lambda: core.vector.tensor_tensor(a, a, b, op="power"),
            "engine",
            "op",
            trn2core.Trn2ValueError,
        ),
        (lambda: core.gpsimd.iota(p1, [(1, 64)]), "gpsimd_psum", "dst", trn2core.Trn2ValueError),
        (lambda: core.pe.matmul(p1, p2, b), "matmul_memory", "stationary", trn2core.Trn2ValueError),
        (lambda: core.pe.matmul(p1[:, 0:32], a, b), "shape", "dst", trn2core.ShapeError),
        (lambda: core.dma.copy(p1, h), "dma_memory", "dst", trn2core.Trn2ValueError),
    ]
    for call, rule, arg, cls in cases:
        with pytest.raises(cls) as e:
            call()
        msg = str(e.value)
        assert f"[engine rule {rule}]" in msg and msg.startswith(f"{arg}:"), (rule, msg)
        # The same facts as attributes, set by the core (no message to parse).
        assert (e.value.rule, e.value.arg) == (rule, arg), (rule, msg)
    big = core.tile((128, 1024), "fp32", space="psum")
    with pytest.raises(trn2core.ShapeError, match=r"^src:.*engine rule psum_bank"):
        core.vector.tensor_copy(core.tile((128, 1024), "fp32"), big)


def test_capacity_and_never_written_errors_carry_their_rule():
    core = trn2core.NeuronCore()
    with pytest.raises(trn2core.CapacityError) as e:
        core.tile((128, 300_000), "uint8")
    assert (e.value.rule, e.value.arg) == ("sbuf_capacity", "shape")
    with pytest.raises(trn2core.CapacityError) as e:
        core.tile((128, 5000), "fp32", space="psum")
    assert e.value.rule == "psum_capacity"
    t = core.tile((4, 4), "fp32")
    with pytest.raises(trn2core.Trn2ValueError) as e:
        core.read(t)
    assert (e.value.rule, e.value.arg) == ("uninitialized_read", "tile")
    # An error that breaks no documented rule still names its argument, with rule None.
    with pytest.raises(trn2core.ShapeError) as e:
        core.tile((129, 4), "fp32")
    assert e.value.rule is None and e.value.arg == "shape"


def test_bad_arguments_are_trn2_errors():
    core = trn2core.NeuronCore()
    a = core.tile((4, 4), "fp32")
    with pytest.raises(trn2core.Trn2ValueError, match="^dst: expected a Tile"):
        core.vector.memset(np.zeros((4, 4)), 1.0)
    with pytest.raises(trn2core.Trn2ValueError, match="^op: unknown ALU operator"):
        core.vector.tensor_tensor(a, a, a, op="mod")
    with pytest.raises(trn2core.Trn2ValueError, match="^func: unknown activation"):
        core.scalar.activation(a, a, "prelu")
    with pytest.raises(trn2core.FormatError, match="not a Trainium2 dtype"):
        core.tile((4, 4), "fp8_e4m3fn")
    with pytest.raises(trn2core.FormatError, match="dtype"):
        core.tile((4, 4), np.float64)
    with pytest.raises(trn2core.ShapeError, match="partition"):
        core.tile((129, 4), "fp32")
    with pytest.raises(trn2core.ShapeError, match="out of range"):
        a[4]
    with pytest.raises(trn2core.Trn2ValueError, match="step"):
        a[::2]


def test_capacity_and_never_written_memory():
    core = trn2core.NeuronCore()
    core.tile((128, 100_000), "fp16", name="big_a")
    with pytest.raises(trn2core.CapacityError) as e:
        core.tile((128, 10_000), "fp32", name="too_much")
    msg = str(e.value)
    for needle in ("too_much", "40000 B", "12984 B", "big_a", "212984 B"):
        assert needle in msg, (needle, msg)
    t = core.tile((16, 8), "fp32", name="unwritten")
    d = core.tile((16, 8), "fp32")
    core.vector.memset(t[:, 0:4], 2.0)
    with pytest.raises(trn2core.Trn2ValueError, match="unwritten.*never written.*byte 16 of"):
        core.vector.tensor_copy(d, t)
    nan = trn2core.NeuronCore(uninitialized="nan")
    a = nan.tile((4, 4), "bf16")
    d = nan.tile((4, 4), "fp32")
    nan.vector.tensor_copy(d, a)
    assert (bits(nan.read(d)) == 0x7FC00000).all()
    core.free(t)
    with pytest.raises(trn2core.Trn2ValueError, match="freed"):
        core.read(t)
    with pytest.raises(trn2core.Trn2ValueError, match="another NeuronCore"):
        core.read(d)


def test_allocations_carry_tiles():
    core = trn2core.NeuronCore()
    a = core.alloc((128, 2048), "bf16", space="sbuf")
    b = core.alloc((128, 2048), "bf16", space="sbuf")
    core.vector.memset(a, 1.5)
    core.gpsimd.memset(b, 2.0)
    core.vector.tensor_tensor(b, a, b, op="add")
    assert (core.read(b).astype(np.float32) == 3.5).all()
    assert core.read(a[0:2, 0:3]).shape == (2, 3)
    assert core.sbuf.used == 2 * 128 * 4096
    core.free(a)
    with pytest.raises(trn2core.Trn2ValueError, match="freed"):
        core.read(a.tile)


def test_stochastic_rounding_is_seeded():
    def run(seed):
        core = trn2core.NeuronCore(rounding="stochastic", seed=seed)
        x = (1 + np.arange(8192, dtype=np.float32) * 2.0**-20).reshape(128, 64)
        t, d = put(core, x, "fp32"), out(core, (128, 64), "bf16")
        core.vector.tensor_copy(d, t)
        return bits(core.read(d))

    x, y, z = run(1), run(1), run(2)
    assert (x == y).all() and (x != z).any()
    assert 100 < (x == 0x3F81).sum() < 8000


# ------------------------------------------------------------------------------- timeline


def test_run_reports_overlap_critical_path_and_trace(tmp_path):
    core = trn2core.NeuronCore()
    x = core.hbm_tensor(np.ones((128, 512), np.float32))
    a, b, c = (core.tile((128, 512), "fp32") for _ in range(3))
    core.dma.copy(a, x)
    core.gpsimd.memset(b, 2.0)
    core.scalar.activation(c, a, "exp")
    core.vector.tensor_tensor(c, c, b, op="multiply")
    rep = core.run()
    assert rep.instructions == 4 and rep.dma_bytes == 128 * 512 * 4
    assert set(rep.engines) >= {"PE", "ACT", "DVE", "POOL", "DMA queue 0"}
    assert rep.opcodes == {"tensor_tensor": 1, "activation": 1, "memset": 1, "dma_copy": 1}
    path = [s["opcode"] for s in rep.critical_path]
    assert path == ["dma_copy", "activation", "tensor_tensor"], rep.critical_path
    assert rep.critical_path[1]["waited_for"] == "dependency"
    busy = {k: v["busy_s"] for k, v in rep.engines.items()}
    assert busy["POOL"] > 0 and busy["POOL"] < rep.seconds
    assert rep.seconds == pytest.approx(rep.critical_path[-1]["end_s"])
    text = str(rep)
    assert "DVE" in text and "critical path: 3" in text
    d = rep.to_dict()
    assert d["instructions"] == 4 and d["engines"]["ACT"]["instructions"] == 1
    path_ = rep.save_trace(tmp_path / "k.json")
    trace = json.load(open(path_))
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert names == {"dma_copy", "memset", "activation", "tensor_tensor"}
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"DMA queue 0", "ACT", "DVE", "POOL"} <= tracks


def test_name_lists_come_from_the_core():
    names = trn2core._core.names()
    m = trn2core.machine
    assert m.MACHINE_DTYPES == tuple(names["machine_dtypes"])
    assert m.ALU_OPS == tuple(names["alu_ops"])
    assert m.ACTIVATION_FUNCTIONS == tuple(names["activation_functions"])
    assert m.ENGINES == tuple(names["engines"]) == ("tensor", "vector", "scalar", "gpsimd")
    assert set(ref.ACTIVATION_FUNCTIONS) == set(m.ACTIVATION_FUNCTIONS)
    assert set(ref.MACHINE_DTYPES) == set(m.MACHINE_DTYPES)
    assert trn2core.KernelReport is m.KernelReport


def test_results_do_not_depend_on_the_schedule():
    def run(order):
        core = trn2core.NeuronCore()
        ts = [put(core, codes("bf16", (128, 40), 60 + i), "bf16") for i in range(4)]
        outs = [core.tile((128, 40), "fp32") for _ in range(4)]
        for i in order:
            eng = (core.vector, core.gpsimd)[i % 2]
            eng.tensor_tensor(outs[i], ts[i], ts[(i + 1) % 4], op="multiply")
        return [bits(core.read(o)) for o in outs], core.run().ticks

    (a, ta), (b, tb) = run([0, 1, 2, 3]), run([3, 1, 2, 0])
    assert all((x == y).all() for x, y in zip(a, b, strict=True)) and ta == tb


def test_long_calls_in_a_forked_child_start_their_own_helper():
    # A long call on the main thread runs on a helper thread kept between calls; a child forked
    # after the parent made one has no such thread and must start its own (each call here is a
    # 256^3 GEMM and an NKI-style settle of 16 queued matmuls: well above the inline limit).
    code = textwrap.dedent(
        """
        import os, numpy as np, trn2core
        def run():
            rng = np.random.default_rng(5)
            a = rng.standard_normal((256, 256), dtype=np.float32)
            g = trn2core.gemm(a, a).out
            core = trn2core.NeuronCore()
            st = core.tile((128, 128), "fp32"); core.write(st, a[:128, :128])
            ps = core.tile((128, 128), "fp32", space="psum")
            for i in range(16):
                core.pe.matmul(ps, st, st, accumulate=i > 0)
            return g.tobytes() + core.read(ps).tobytes()
        first = run()
        assert run() == first
        pid = os.fork()
        if pid == 0:
            os._exit(0 if run() == first and run() == first else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), int(run() == first))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1"], r.stdout


def test_queued_matmuls_settle_in_a_forked_child():
    # nc_matmul queues its arithmetic; a read settles it with parallel sections. In a child
    # forked after the parent computed, those must run on the child's own threads (a GIL-held
    # read used to wait for the parent's pool workers, which do not exist in the child).
    code = textwrap.dedent(
        """
        import os, numpy as np, trn2core
        def run():
            core = trn2core.NeuronCore()
            a = np.ones((128, 128), np.float32)
            st = core.tile((128, 128), "fp32"); core.write(st, a)
            outs = [core.tile((128, 128), "fp32", space="psum") for _ in range(2)]
            for ps in outs:
                core.pe.matmul(ps, st, st)
            return [float(core.read(ps)[0, 0]) for ps in outs]
        assert run() == [128.0, 128.0]
        pid = os.fork()
        if pid == 0:
            os._exit(0 if run() == [128.0, 128.0] else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"], r.stdout
