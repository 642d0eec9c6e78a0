"""trn2core.nki: the import hook, kernels in both dialects, SPMD grids and LNC=2, the report,
and every error class raised from a kernel at the kernel's own line (contract section 8)."""

from __future__ import annotations

import inspect
import json
import sys
import types

import ml_dtypes
import numpy as np
import pytest
import trn2core
import trn2core.nki as tn
from trn2core import reference as ref
from trn2core.errors import CapacityError, ShapeError, Trn2Error, Trn2ValueError

nl, nisa = tn.language, tn.isa
lnl, lisa = tn.language_legacy, tn.isa_legacy
BF16 = ml_dtypes.bfloat16
HOOK_NAMES = (
    "nki",
    "nki.language",
    "nki.isa",
    "nki.jit",
    "nki.typing",
    "neuronxcc",
    "neuronxcc.nki",
    "neuronxcc.nki.language",
    "neuronxcc.nki.isa",
    "neuronxcc.nki.typing",
)


def _line_of(fn, text: str) -> int:
    """The file line of the first source line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _raises_at(cls, fn, marker: str, rule: str, *args, **kwargs):
    with pytest.raises(cls) as info:
        tn.run(tn.jit(fn), *args, **kwargs)
    msg = str(info.value)
    where = f"{__file__}:{_line_of(fn, marker)}:"
    assert msg.startswith(where), (msg, where)
    assert rule in msg, msg
    assert info.value.nki_location == (__file__, _line_of(fn, marker))
    return info.value


# ----------------------------------------------------------------------------- the import hook


def test_install_resolves_both_dialects_and_uninstall_leaves_nothing():
    before_path = list(sys.meta_path)
    assert not tn.installed()
    with tn.install():
        import neuronxcc.nki as legacy
        import neuronxcc.nki.isa as lisa_
        import neuronxcc.nki.language as lnl_
        import neuronxcc.nki.typing as nt
        import nki
        import nki.isa as nisa_
        import nki.language as nl_
        from nki import jit

        assert tn.installed()
        assert nl_.add is nl.add and nisa_.tensor_tensor is nisa.tensor_tensor
        assert lnl_.affine_range is lnl.affine_range and lisa_.nc_matmul is lisa.nc_matmul
        assert jit is tn.jit and legacy.jit is tn.jit_legacy
        assert nt.tensor[(128, 512), nl.float32] is nt.tensor
        assert nki.language is nl_ and nl_.__name__ == "nki.language"
        import nki.jit as jit_mod  # the decorator keeps working after `import nki.jit`

        assert callable(nki.jit) and isinstance(jit_mod, types.ModuleType)
        k = nki.jit(lambda x: x)
        assert isinstance(k, tn.Kernel)
    assert not tn.installed()
    assert sys.meta_path == before_path
    assert not [n for n in HOOK_NAMES if n in sys.modules]
    assert nl.__name__ == "trn2core.nki.language"  # trn2core's own modules untouched
    with pytest.raises(ImportError):
        import nki  # noqa: F401


def test_install_sets_aside_and_restores_a_module_named_nki():
    fake = types.ModuleType("nki")
    sys.modules["nki"] = fake
    try:
        tn.install()
        import nki

        assert nki is not fake and nki.jit is tn.jit
        tn.uninstall()
        assert sys.modules["nki"] is fake
    finally:
        tn.uninstall()
        sys.modules.pop("nki", None)


def test_a_kernel_keeps_working_after_uninstall():
    with tn.install():
        import nki
        import nki.language as nl_

        @nki.jit
        def double(x):
            out = nl_.ndarray(x.shape, dtype=x.dtype, buffer=nl_.shared_hbm)
            nl_.store(out, value=nl_.load(x) * 2.0)
            return out

    x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    assert np.array_equal(double(x), x * 2)
    assert np.array_equal(tn.simulate(double)(x), x * 2)


# ----------------------------------------------------------------------------- kernels


@pytest.mark.parametrize(
    "dtype",
    [
        np.float32,
        BF16,
        np.float16,
        np.int32,
        np.uint8,
        ml_dtypes.float8_e4m3,
        ml_dtypes.float8_e5m2,
    ],
)
def test_copies_are_bit_exact_for_every_dtype(dtype, copy_kernel):
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 256, size=(64, 48 * np.dtype(dtype).itemsize), dtype=np.uint8)
    x = bits.view(dtype)
    out = tn.jit(copy_kernel)(x)
    assert out.dtype == x.dtype and np.array_equal(out.view(np.uint8), x.view(np.uint8))
    assert not np.shares_memory(out, x)


def _rounding_cases(shape):
    """float32 values round-to-nearest-even must get right: bf16 ties to even and odd and
    beside them, float16's overflow edge, its smallest subnormal and just above, a float32
    subnormal, signed zeros and infinities, then random magnitudes."""
    rng = np.random.default_rng(7)
    ties = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x477FE000, 0x477FF000,
                     0x7F7FFFFF, 0x00000001, 0x80400000, 0x33800000, 0x33800001, 0x387FE000,
                     0x00000000, 0x80000000, 0x7F800000, 0xFF800000], dtype=np.uint32)  # fmt: skip
    n = int(np.prod(shape))
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    vals[: len(ties)] = ties.view(np.float32)
    return vals.reshape(shape)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
@pytest.mark.parametrize("where", ["load", "store"])
def test_converting_dma_copies_round_to_nearest_even(dtype, where):
    # A dma_copy between dtypes rounds each element once, to nearest even: numpy's float16
    # and ml_dtypes' bfloat16 conversions are the references (rows of 77 elements; where runs
    # of the two sides meet at odd offsets is the Rust unit test's).
    x = _rounding_cases((128, 77))
    nd = nl.bfloat16 if dtype is BF16 else nl.float16

    @tn.jit
    def convert(x):
        out = nl.ndarray(x.shape, dtype=nd, buffer=nl.shared_hbm)
        if where == "load":
            t = nl.ndarray(x.shape, dtype=nd, buffer=nl.sbuf)
        else:
            t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out

    with np.errstate(over="ignore"):
        want = x.astype(dtype)
    out = convert(x)
    assert out.dtype == np.dtype(dtype)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))


def test_arguments_the_kernel_stores_into_are_written_back_and_outputs_do_not_alias():
    # An argument is the device memory the kernel works on, as in AWS's simulator: what the
    # kernel stores into it reaches the caller's array (issue 26, item 11).
    x = np.ones((4, 8), np.float32)
    keep = x.copy()

    @tn.jit
    def inc(x):
        t = nl.load(x)
        t += 1.0
        nl.store(x, value=t)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=t)
        return out

    out = inc(x)
    assert np.array_equal(x, keep + 1) and np.array_equal(out, keep + 1)
    assert not np.shares_memory(out, x)
    # Arguments it only reads are left alone: a read-only array is fine.
    y = np.full((4, 8), 2.0, np.float32)
    y.setflags(write=False)

    @tn.jit
    def double(y):
        out = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.load(y), 2.0))
        return out

    assert np.array_equal(double(y), np.full((4, 8), 4.0, np.float32))
    # A read-only array the kernel stores into cannot take its results: said, naming it.
    x.setflags(write=False)
    with pytest.raises(tn.KernelError, match=r"^x: the kernel stored into this argument"):
        inc(x)
    assert np.array_equal(x, keep + 1)


def test_outputs_handed_over_without_a_copy_hold_the_kernels_values(copy_kernel):
    # A launch's last read of an output it made hands the tensor's buffer over
    # (Machine.take_hbm) when every output is such a tensor, returned once; a view among the
    # outputs, or one tensor returned twice, is read (copied) as before. Values in every case.
    a = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)

    @tn.jit
    def two(a):
        s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        x = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        y = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=x, src=s)
        t = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=s)
        nisa.dma_copy(dst=y, src=t)
        return x, {"y": y}

    x, d = two(a)
    assert x.dtype == np.float32 and np.array_equal(x, a)
    assert d["y"].dtype == BF16 and np.array_equal(d["y"].astype(np.float32), a)
    # Taken: the array views the machine's buffer (its uint32 words; the tensor's first byte
    # on a cache line), not a fresh copy of it.
    assert x.base is not None and x.base.dtype == np.uint32 and x.ctypes.data % 64 == 0
    assert d["y"].base.dtype == np.uint32
    x2, _ = two(a)
    assert not np.shares_memory(x, x2)

    @tn.jit
    def twice(a):
        x = copy_kernel(a)
        return x, x, x[1:3, :]

    p, q, r = twice(a)
    assert np.array_equal(p, a) and np.array_equal(q, a) and np.array_equal(r, a[1:3])
    assert not np.shares_memory(p, q) and p.base.dtype == np.uint8

    @tn.jit
    def same(a):
        x = copy_kernel(a)
        return [x, x]

    p, q = same(a)
    assert np.array_equal(p, a) and np.array_equal(q, a) and not np.shares_memory(p, q)
    # An output the kernel did not write whole is still the error at its line.
    with pytest.raises(tn.KernelError, match="did not write every element"):

        @tn.jit
        def half(a):
            s = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=s, src=a)
            x = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=x[0:2, :], src=s[0:2, :])
            return x

        half(a)


def test_the_core_s_basic_view_is_the_front_end_s_quick_indexing():
    # Tile.basic_view (Rust) against NkiTensor._basic's quick path (Python), the rule it
    # replaces on the hot path: the same view (tile, shape, partition axis) for every key of
    # ints and step-1 slices in and around each axis, or None where Python defers.
    rng = np.random.default_rng(26)
    checked = []

    def same(v, r):
        if v is None or r is None:
            return v is None and r is None
        t, shape, pdim = r
        key = (t.space, t.start_partition, t.offset, t.pattern, t.shape, t.tensor_key)
        vt = v.tile
        want = (vt.space, vt.start_partition, vt.offset, vt.pattern, vt.shape, vt.tensor_key)
        return key == want and list(shape) == list(v.shape) and pdim == v._pdim

    def part(size):
        # Mostly in range (an index, a slice), sometimes just outside or empty.
        c = rng.integers(8)
        if c == 0:
            return int(rng.integers(-size - 1, size + 1))
        if c == 1:
            return int(rng.integers(-size, size))
        if c == 2:
            ends = [None, *range(-size - 1, size + 2)]
            return slice(ends[rng.integers(len(ends))], ends[rng.integers(len(ends))])
        b = int(rng.integers(size))
        e = int(rng.integers(b + 1, size + 1))
        b = b - size if rng.integers(2) else b
        e = e - size if rng.integers(2) and e < size else e
        return slice(
            None if b == 0 and rng.integers(2) else b, None if e == size and rng.integers(2) else e
        )

    @tn.jit
    def kernel(a):
        tensors = [
            a,
            nl.ndarray((4, 6, 5), dtype=nl.float32, buffer=nl.shared_hbm),
            nl.ndarray((128, 8, 16), dtype=nl.bfloat16, buffer=nl.sbuf),
            nl.ndarray((64, 12), dtype=nl.float32, buffer=nl.psum),
            nl.ndarray((2, 32, 3, 7), dtype=nl.float32, buffer=nl.sbuf),
        ]
        for t in tensors:
            for _ in range(400):
                key = tuple(part(n) for n in t.shape)
                r = t.tile.basic_view(key, t.shape, t._pdim)
                v = t._basic(key, True)
                assert same(v, r) or (r is None and v is not None and t._pdim is None), (
                    t.shape,
                    t._pdim,
                    key,
                )
                checked.append(r is not None)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=0.0)
        nisa.dma_copy(dst=out, src=s)
        return out

    kernel(np.zeros((3, 9), np.float32))
    assert sum(checked) > 600 and len(checked) - sum(checked) > 300
    # The legacy dialect's column: `a[0:3, j]` of an HBM tensor is [3, 1] (the current
    # dialect's is [3]); the core leaves that case to the front end.
    shapes = []

    def legacy(a, out):
        shapes.append(tuple(a[0:3, 2].shape))
        lnl.store(out[0:3, 0:1], value=lnl.load(a[0:3, 2]))

    out = np.zeros((3, 1), np.float32)
    a = np.arange(27, dtype=np.float32).reshape(3, 9)
    tn.simulate_kernel(tn.jit_legacy(legacy), a, out)
    assert shapes == [(3, 1)] and np.array_equal(out, a[:, 2:3])


def test_a_legacy_sub_kernel_fills_its_output_argument():
    # nki-library's sub-kernels take their output as an argument and return nothing.
    a = np.linspace(-3, 3, 128 * 8, dtype=np.float32).reshape(128, 8)
    out = np.zeros((128, 8), np.float32)

    def exp_into(a, out):
        i, j = lnl.arange(128)[:, None], lnl.arange(8)[None, :]
        lnl.store(out[i, j], value=lnl.exp(lnl.load(a[i, j])))

    assert tn.simulate_kernel(tn.jit_legacy(exp_into), a, out) is None
    want, _ = ref.activation(a, "exp", "fp32")
    assert np.array_equal(out, want)


def test_under_lnc2_each_cores_stores_into_an_argument_are_written_back():
    x = np.arange(256 * 4, dtype=np.float32).reshape(256, 4).astype(ml_dtypes.bfloat16)
    keep = x.copy()

    @tn.jit
    def halves(x):
        c = nl.program_id(0)  # each physical core negates its own half of the rows
        rows = x[c * 128 : c * 128 + 128, :]
        nl.store(rows, value=nl.negative(nl.load(rows)))

    halves[2](x)
    assert x.dtype == ml_dtypes.bfloat16 and np.array_equal(x, -keep)

    @tn.jit
    def clash(x):
        c = nl.program_id(0)  # both cores store different values into the same rows
        nl.store(x[0:128, :], value=nl.add(nl.load(x[0:128, :]), c + 1.0))

    with pytest.raises(tn.KernelError, match=r"x: both physical cores wrote element 0 \(flat"):
        clash[2](x)


def test_under_lnc2_a_returned_view_of_an_argument_has_the_other_cores_stores():
    # nki-library's attention_block_tkg updates its KV cache argument on physical core 1 only
    # and returns a reshape of it: the result is the argument as both cores left it (it was
    # core 0's copy, without core 1's stores).
    x = np.arange(2 * 128 * 4, dtype=np.float32).reshape(2, 1, 128, 4)

    @tn.jit
    def update_on_core1(x):
        flat = x.reshape((2 * 128, 4))
        if nl.program_id(0) == 1:
            t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=flat[128:256, :])
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=-1.0)
            nisa.dma_copy(dst=flat[128:256, :], src=t)
        return x.reshape((2, 128, 4)), flat[120:136, 1:3]

    want = x.copy()
    want[1] *= -1.0
    whole, part = tn.run(update_on_core1, x, grid=2).outputs
    assert np.array_equal(whole, want.reshape(2, 128, 4))
    assert np.array_equal(part, want.reshape(256, 4)[120:136, 1:3])
    assert np.array_equal(x, want)


def test_pending_results_issue_into_their_targets():
    @tn.jit
    def k(x):
        t = nl.load(x)  # one DMA
        y = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        y[...] = nl.exp(t)  # one activation, straight into y
        y[...] += 1.0  # one tensor_scalar in place
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=y)
        return out

    x = np.linspace(-2, 2, 4 * 32, dtype=np.float32).reshape(4, 32)
    res = tn.run(k, x)
    e, _ = ref.activation(x, "exp", "fp32")
    assert np.array_equal(res.outputs, ref.tensor_scalar(e, "add", 1.0, "fp32"))
    assert dict(res.report.opcodes) == {"dma_copy": 2, "activation": 1, "tensor_scalar": 1}


def test_psum_accumulation_with_plus_equals_is_one_matmul_per_tile_and_equals_gemm():
    @tn.jit_legacy
    def k(lhsT, rhs):
        out = lnl.ndarray((128, 512), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.zeros((128, 512), nl.float32, buffer=lnl.psum)
        for kk in lnl.affine_range(lhsT.shape[0] // 128):
            a = lnl.load(lhsT[kk * 128 : (kk + 1) * 128, :])
            b = lnl.load(rhs[kk * 128 : (kk + 1) * 128, :])
            acc += lisa.nc_matmul(a, b)
        lnl.store(out, value=lnl.copy(acc))
        return out

    rng = np.random.default_rng(1)
    a = rng.standard_normal((768, 128), dtype=np.float32).astype(BF16)
    b = rng.standard_normal((768, 512), dtype=np.float32).astype(BF16)
    res = tn.run(k, a, b)
    want = trn2core.gemm(np.ascontiguousarray(a.T), b).out
    assert np.array_equal(res.outputs.view(np.uint32), want.view(np.uint32))
    assert res.report.opcodes["nc_matmul"] == 6


def test_nl_matmul_transposes_x_on_the_tensor_engine():
    @tn.jit
    def k(x, y):
        out = nl.ndarray((x.shape[0], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.matmul(nl.load(x), nl.load(y)))
        return out

    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 128), dtype=np.float32).astype(BF16)
    y = rng.standard_normal((128, 256), dtype=np.float32).astype(BF16)
    res = tn.run(k, x, y)
    assert np.array_equal(res.outputs, ref.nc_matmul(np.ascontiguousarray(x.T), y))
    assert res.report.opcodes["nc_transpose"] == 1 and res.report.opcodes["nc_matmul"] == 1


def test_type_promotion_follows_the_nki_rules():
    from trn2core.nki import _dtypes as D

    assert D.promote(D.bfloat16, D.float16) == D.float32
    assert D.promote(D.float8_e4m3, D.float8_e5m2) == D.bfloat16
    assert D.promote(D.float8_e4m3, D.float16) == D.float16
    assert D.promote(D.int8, D.uint8) == D.int16
    assert D.promote(D.int32, D.uint32) == D.float32
    assert D.promote(D.int32, D.float16) == D.float16
    assert D.promote(D.float16, D.weak_dtype(1.5)) == D.float32

    @tn.jit
    def k(a, b):
        c = nl.load(a) + nl.load(b)
        out = nl.ndarray(a.shape, dtype=c.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=c)
        return out

    a = np.full((2, 4), 1.5, BF16)
    b = np.full((2, 4), 0.25, np.float16)
    out = k(a, b)
    assert out.dtype == np.float32 and np.all(out == 1.75)


def test_spmd_queries_in_a_legacy_grid():
    seen = []

    @tn.jit_legacy
    def k(x):
        seen.append(
            (
                lnl.program_id(0),
                lnl.program_id(1),
                lnl.num_programs(),
                lnl.num_programs(1),
                lnl.program_ndim(),
            )
        )
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        i, j = lnl.program_id(0), lnl.program_id(1)
        lnl.store(out[i : i + 1, j : j + 1], value=lnl.load(x[i : i + 1, j : j + 1]))
        return out

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert np.array_equal(k[3, 2](x), x)
    assert seen == [(i, j, 6, 2, 2) for i in range(3) for j in range(2)]


def test_lnc2_in_the_current_dialect_splits_work_over_two_cores():
    seen = []

    @tn.jit
    def k(x):
        seen.append((nl.program_id(0), nl.num_programs()))
        cols = x.shape[1] // nl.num_programs()
        c0 = nl.program_id(0) * cols
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((x.shape[0], cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, c0 : c0 + cols])
        nisa.activation(dst=t, op=nl.relu, data=t)
        nisa.dma_copy(dst=out[:, c0 : c0 + cols], src=t)
        return out

    x = np.random.default_rng(3).standard_normal((128, 8192), dtype=np.float32)
    one = tn.run(k, x)
    two = tn.run(k, x, grid=2)
    assert seen == [(0, 1), (0, 2), (1, 2)]
    assert np.array_equal(one.outputs, np.maximum(x, 0)) and np.array_equal(
        two.outputs, one.outputs
    )
    assert two.report.lnc == 2 and two.report.seconds < one.report.seconds
    assert "nc1 ACT" in two.report.engines
    with pytest.raises(Trn2ValueError, match="LNC degree"):
        k[3]


def test_two_cores_writing_different_values_to_one_element_is_a_race():
    @tn.jit
    def k(x):
        out = nl.ndarray((1, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.full((1, 4), float(nl.program_id(0)), nl.float32)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(tn.KernelError, match="race"):
        k[2](np.zeros(1, np.float32))
    # The same under uninitialized="nan" (which checks no read): the race is still found.
    with pytest.raises(tn.KernelError, match="race"):
        tn.run(k, np.zeros(1, np.float32), grid=2, uninitialized="nan")


def test_lnc2_halves_merge_under_every_uninitialized_mode():
    # Each physical core writes `rows` rows of a shared output: no race, whatever the mode
    # (under "nan" every HBM byte used to count as written by both cores).
    def writing(rows):
        @tn.jit
        def k(x):
            c = nl.program_id(0)
            out = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.shared_hbm)
            t = nl.ndarray((rows, 64), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[c * rows : (c + 1) * rows, :])
            nisa.dma_copy(dst=out[c * rows : (c + 1) * rows, :], src=t)
            return out

        return k

    x = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    for mode in ("error", "nan"):
        r = tn.run(writing(128), x, grid=2, uninitialized=mode)
        assert np.array_equal(r.outputs, x), mode
    # Rows neither core wrote: an error, or under "nan" the NaN fill one core's read-back gives.
    half = writing(64)
    with pytest.raises(Trn2Error, match="never written"):
        tn.run(half, x, grid=2)
    got = tn.run(half, x, grid=2, uninitialized="nan").outputs
    assert np.array_equal(got[:128], x[:128]) and np.isnan(got[128:]).all()
    one = tn.run(half, x, uninitialized="nan").outputs
    assert np.array_equal(one[:64], x[:64]) and np.isnan(one[64:]).all()


def test_masks_restrict_and_skip_instructions():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((128, 8), dtype=nl.float32, buffer=lnl.shared_hbm)
        ip, jf = lnl.mgrid[0:128, 0:8]
        t = lnl.zeros((128, 8), nl.float32)
        t[ip, jf] = lnl.load(x[ip, jf], mask=(ip < 5) & (jf >= 2))
        t[ip, jf] = lnl.exp(t, mask=(ip > 200))  # never true: no instruction
        lnl.store(out[ip, jf], value=t)
        return out

    x = np.ones((128, 8), np.float32)
    res = tn.run(k, x)
    want = np.zeros((128, 8), np.float32)
    want[:5, 2:] = 1
    assert np.array_equal(res.outputs, want)
    assert "activation" not in res.report.opcodes


def test_iota_and_affine_select_from_index_expressions():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((64, 32), dtype=nl.float32, buffer=lnl.shared_hbm)
        ip, jf = lnl.mgrid[0:64, 0:32]
        io = lisa.iota(3 * ip + jf - 7, dtype=nl.int32)
        t = lnl.load(x)
        sel = lisa.affine_select(ip - jf >= 0, t, -1.0)
        lnl.store(out, value=sel + lnl.copy(io, dtype=nl.float32))
        return out

    x = np.random.default_rng(4).standard_normal((64, 32), dtype=np.float32)
    io = ref.iota((64, 32), [(1, 32)], -7, 3, "int32")
    sel = ref.affine_select(x, [(-1, 32)], 1, -1.0, "greater_equal", 0, "fp32")
    want = ref.tensor_tensor(sel, io.astype(np.float32), "add", "fp32")
    assert np.array_equal(k(x), want)


def test_isa_calls_of_the_current_dialect_against_the_reference():
    @tn.jit
    def k(x, y):
        P, F = x.shape
        a = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=y)
        res = nl.ndarray((5, P, F), dtype=nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            dst=t, data=a, op0=nl.multiply, operand0=2.0, op1=nl.subtract, operand1=b
        )
        nisa.dma_copy(dst=res[0], src=t)
        nisa.tensor_tensor_scan(dst=t, data0=a, data1=b, initial=0.0, op0=nl.multiply, op1=nl.add)
        nisa.dma_copy(dst=res[1], src=t)
        nisa.tensor_scalar_reduce(
            dst=t, data=a, op0=nl.add, operand0=1.0, reduce_op=nl.maximum, reduce_res=red
        )
        nisa.dma_copy(dst=res[2], src=t)
        nisa.tensor_reduce(dst=red, op=nl.add, data=b, axis=1, negate=True)
        nisa.tensor_scalar(dst=t, data=a, op0=nl.maximum, operand0=red)
        nisa.dma_copy(dst=res[3], src=t)
        nisa.iota(dst=t, pattern=[[2, F]], offset=1, channel_multiplier=F)
        nisa.dma_copy(dst=res[4], src=t)
        return res

    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 16), dtype=np.float32)
    y = rng.standard_normal((32, 16), dtype=np.float32)
    out = k(x, y)
    assert np.array_equal(
        out[0], ref.scalar_tensor_tensor(x, "multiply", 2.0, "subtract", y, "fp32")
    )
    assert np.array_equal(out[1], ref.tensor_tensor_scan(x, y, 0.0, "multiply", "add", "fp32"))
    assert np.array_equal(out[2], ref.tensor_scalar_reduce(x, "add", 1.0, "maximum", "fp32")[0])
    red = ref.tensor_reduce(y, "add", 1, "fp32", negate=True).reshape(-1, 1)
    assert np.array_equal(out[3], ref.tensor_scalar(x, "maximum", red, "fp32"))
    assert np.array_equal(out[4], ref.iota((32, 16), [(2, 16)], 1, 16, "fp32"))


def test_legacy_par_dim_block_tensors():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        blocks = lnl.ndarray((4, lnl.par_dim(32), 16), dtype=x.dtype, buffer=lnl.sbuf)
        for i in lnl.affine_range(4):
            blocks[i] = lnl.load(x[i])
        for i in lnl.affine_range(4):
            lnl.store(out[i], value=blocks[i] * 3.0)
        return out

    x = np.random.default_rng(6).standard_normal((4, 32, 16), dtype=np.float32)
    assert np.array_equal(k(x), ref.tensor_scalar(x, "multiply", 3.0, "fp32"))


def test_load_transpose2d_and_partition_broadcast():
    @tn.jit
    def k(x, g):
        out = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(x)
        gb = nl.load(g.reshape((1, g.shape[0]))).broadcast_to((x.shape[1], x.shape[0]))
        nl.store(out, value=t * gb)
        return out

    rng = np.random.default_rng(7)
    x = rng.standard_normal((96, 40), dtype=np.float32)
    g = rng.standard_normal(96, dtype=np.float32)
    assert np.array_equal(
        k(x, g), ref.tensor_tensor(x.T, np.broadcast_to(g, (40, 96)), "multiply", "fp32")
    )


# ----------------------------------------------------------------------------- the report


def _bound_kernel(x, engine):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    u = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    for _ in range(40):
        if engine == "ACT":
            nisa.activation(dst=u, op=nl.exp, data=t)
        elif engine == "DVE":
            nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.multiply)
        elif engine == "POOL":
            nisa.tensor_copy(dst=u, src=t, engine=nisa.engine.gpsimd)
        elif engine == "DMA":
            nisa.dma_copy(dst=u, src=x)
        else:
            p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=p, stationary=t[:, 0:128], moving=t)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _tensor_tensor_forms(x, i, form, fail=False):
    a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray(i.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=i)
    u = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    v = nl.ndarray(i.shape, dtype=nl.int32, buffer=nl.sbuf)
    if form == "keywords":  # the api wrapper's inline common case
        nisa.tensor_tensor(dst=u, data1=a, data2=a, op=nl.multiply)
        nisa.tensor_tensor(dst=u, data1=u, data2=a, op=nl.power)
        nisa.tensor_tensor(dst=v, data1=b, data2=b, op=nl.add)
    else:  # the function itself: a numpy operator, an engine given
        nisa.tensor_tensor(u, a, a, np.multiply)
        nisa.tensor_tensor(u, u, a, nl.power, engine=nisa.gpsimd_engine)
        nisa.tensor_tensor(v, b, b, np.add, None)
    if fail:
        nisa.tensor_tensor(dst=u[0:64], data1=a, data2=a, op=nl.add)  # HERE: shapes differ
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=u)
    res = nl.ndarray(i.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=res, src=v)
    return out, res


def test_tensor_tensor_common_case_matches_the_function():
    """``nisa.tensor_tensor``'s common case runs in its api wrapper (``isa._TT_INLINE``): the
    same bits, engines (int32 and power on GpSimd), timeline and errors as the function."""
    x = np.random.default_rng(3).random((128, 8), dtype=np.float32) + 0.5
    i = np.arange(128 * 8, dtype=np.int32).reshape(128, 8) - 300
    runs = {f: tn.run(_tensor_tensor_forms, x, i, f) for f in ("keywords", "function")}
    (ku, kv), (fu, fv) = runs["keywords"].outputs, runs["function"].outputs
    np.testing.assert_array_equal(ku.view(np.uint32), fu.view(np.uint32))
    np.testing.assert_array_equal(kv, fv)
    assert kv.tolist() == (2 * i).tolist()
    kr, fr = runs["keywords"].report, runs["function"].report
    assert kr.seconds == fr.seconds and kr.engines["POOL"]["instructions"] == 2
    assert kr.engines == fr.engines
    errors = [
        str(_raises_at(ShapeError, _tensor_tensor_forms, "# HERE", "", x, i, f, fail=True))
        for f in ("keywords", "function")
    ]
    assert errors[0] == errors[1]


@pytest.mark.parametrize("engine", ["ACT", "DVE", "POOL", "DMA", "PE"])
def test_a_kernel_bound_by_one_engine_reports_it(engine):
    x = np.ones((128, 512), np.float32)
    rep = tn.run(_bound_kernel, x, engine=engine).report
    assert rep.bottleneck == engine, rep
    key = "DMA queue 0" if engine == "DMA" else engine
    assert rep.engines[key]["instructions"] >= (3 if engine == "DMA" else 40)


def test_report_table_dict_and_trace(tmp_path, copy_kernel):
    x = np.ones((128, 512), np.float32)
    rep = tn.run(_bound_kernel, x, engine="ACT").report
    text = str(rep)
    assert "bottleneck ACT" in text and "ACT" in text and "DMA bytes" in text
    d = rep.to_dict()
    assert set(d) >= {"seconds", "engines", "opcodes", "dma_bytes", "critical_path", "bottleneck"}
    assert d["dma_bytes"] == 2 * 128 * 512 * 4 and d["opcodes"]["activation"] == 40
    assert d["critical_path"][-1]["end_s"] == pytest.approx(rep.seconds)
    json.dumps(d)
    path = rep.save_trace(tmp_path / "k.json")
    ev = json.loads(open(path).read())["traceEvents"]
    assert sum(1 for e in ev if e.get("ph") == "X" and e.get("name") == "activation") == 40
    two = tn.run(tn.jit(copy_kernel)[2], x).report
    ev2 = json.loads(two.trace_json())["traceEvents"]
    assert {e["pid"] for e in ev2} == {0, 1}


def test_uninitialized_nan_mode_reads_nan_as_the_aws_simulator_does():
    @tn.jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.ones((2, 2), np.float32)
    assert np.isnan(tn.simulate(k, uninitialized="nan")(x)).all()
    with pytest.raises(tn.UninitializedReadError):
        k(x)


# ----------------------------------------------------------------------------- errors


def test_sbuf_over_capacity():
    def k(x):
        t = nl.ndarray((128, 60000), dtype=nl.float32, buffer=nl.sbuf)  # HERE
        return t

    e = _raises_at(CapacityError, k, "# HERE", "[rule sbuf_capacity]", np.ones(2, np.float32))
    assert "212984 B" in str(e)


def test_psum_over_capacity():
    # Three PSUM tensors in use at once need more than its 16 KiB: declaring the third gives
    # the least recently used one's storage up, and using that one again is the error.
    def k(x):
        a = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.psum)
        b = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.psum)
        c = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(dst=a, value=0.0)  # HERE
        return a, b, c

    e = _raises_at(CapacityError, k, "# HERE", "[rule psum_capacity]", np.ones(2, np.float32))
    assert "psum0: used after its storage was given to psum2 at test_nki.py:" in str(e)

    def one(x):
        return nl.ndarray((128, 4200), dtype=nl.float32, buffer=nl.psum)  # HERE

    _raises_at(CapacityError, one, "# HERE", "[rule psum_capacity]", np.ones(2, np.float32))


def test_partition_dim_over_128():
    def k(x):
        return nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)  # HERE

    _raises_at(tn.PartitionDimError, k, "# HERE", "[rule partition_dim]", np.ones(2, np.float32))

    def k2(x):
        return nl.load(x)  # HERE

    _raises_at(ShapeError, k2, "# HERE", "partition_dim", np.ones((200, 2), np.float32))


def test_psum_tile_over_one_bank():
    def k(x):
        a = nl.zeros((128, 128), dtype=nl.bfloat16)
        b = nl.zeros((128, 1024), dtype=nl.bfloat16)
        p = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=a, moving=b)  # HERE
        return p

    _raises_at(ShapeError, k, "# HERE", "[engine rule psum_bank]", np.ones(2, np.float32))


_RULE_CASES = {
    "two_psum_inputs": lambda p, q, s: nisa.tensor_tensor(dst=s, data1=p, data2=q, op=nl.add),
    "gpsimd_psum": lambda p, q, s: nisa.tensor_copy(dst=s, src=p, engine=nisa.engine.gpsimd),
    "act_tensor_scalar_ops": lambda p, q, s: nisa.tensor_scalar(
        dst=s, data=s, op0=nl.subtract, operand0=1.0, engine=nisa.engine.scalar
    ),
    "matmul_memory": lambda p, q, s: nisa.nc_matmul(dst=s, stationary=s, moving=s),
    "accumulate": lambda p, q, s: nisa.nc_matmul(
        dst=p[0:64, :], stationary=s, moving=s, accumulate=True
    ),
}


@pytest.mark.parametrize("case", sorted(_RULE_CASES))
def test_engine_rule_violations(case):
    def k(x):
        p = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)
        q = nl.zeros((128, 64), dtype=nl.float32, buffer=nl.psum)
        s = nl.zeros((128, 64), dtype=nl.float32)
        _RULE_CASES[case](p, q, s)
        return s

    # The innermost line outside trn2core is the kernel's caller of the instruction: here the
    # case's lambda (on its first line).
    src = inspect.getsource(sys.modules[__name__])
    want = next(i + 1 for i, ln in enumerate(src.splitlines()) if ln.startswith(f'    "{case}":'))
    with pytest.raises(Trn2Error) as info:
        tn.run(tn.jit(k), np.ones(2, np.float32))
    assert str(info.value).startswith(f"{__file__}:{want}:"), str(info.value)
    assert f"[engine rule {case}]" in str(info.value)
    assert info.value.rule == case  # relocated to the kernel's line, the rule kept


def test_out_of_range_slices():
    def k(x):
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        return t[:, 32:96]  # HERE

    _raises_at(tn.OutOfBoundsError, k, "# HERE", "[rule bounds]", np.ones(2, np.float32))

    def k2(x):
        return nl.load(x[3:9, :])  # HERE

    _raises_at(tn.OutOfBoundsError, k2, "# HERE", "out of range", np.ones((8, 4), np.float32))


# Keys of one slice or int per axis (the quick path inside the api wrapper) and the same keys
# with numpy integers or a step (the general path), with the view's shape (an int on the
# partition axis keeps it at size 1; on-chip views stay 2-D): each reads numpy's values.
_VIEW_KEYS = [
    ((slice(None), 2, slice(3, 7)), (8, 4)),
    ((slice(-5, None), -1, slice(None, -2)), (5, 8)),
    ((slice(2, 3), 0, 5), (1, 1)),
    ((3, slice(1, 4), slice(-8, -7)), (1, 3, 1)),
    ((slice(np.int64(1), np.int32(6)), np.int64(2), slice(None, 8, 2)), (5, 4)),
    ((np.int16(4), slice(None), slice(7, 8)), (1, 4, 1)),
]


@pytest.mark.parametrize("key,shape", _VIEW_KEYS, ids=[str(i) for i in range(len(_VIEW_KEYS))])
def test_views_of_slices_and_ints_read_numpys_slice(key, shape):
    x = np.arange(8 * 4 * 10, dtype=np.float32).reshape(8, 4, 10)
    want = x[key].reshape(shape)

    def k(x):
        t = nl.ndarray((8, 4, 10), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        v = t[key]
        out = nl.ndarray(v.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=v)
        return out

    got = tn.run(tn.jit(k), x).outputs
    assert got.shape == want.shape and (got == want).all()


@pytest.mark.parametrize("bad", ["9", "-9", "5:3", "2:2", "0:11", "-11:", "np9"])
def test_out_of_range_indices_are_refused_at_the_line_on_either_path(bad):
    key = {
        "9": (9, 0, 0),
        "-9": (-9, 0, 0),
        "5:3": (slice(5, 3), 0, 0),
        "2:2": (slice(None), 0, slice(2, 2)),
        "0:11": (slice(None), 0, slice(0, 11)),
        "-11:": (slice(None), 0, slice(-11, None)),
        "np9": (np.int64(9), 0, 0),
    }[bad]

    def k(x):
        t = nl.ndarray((8, 4, 10), dtype=nl.float32, buffer=nl.sbuf)
        return t[key]  # HERE

    e = _raises_at(tn.OutOfBoundsError, k, "# HERE", "index", np.ones(2, np.float32))
    assert ("empty" in str(e)) == (bad in ("5:3", "2:2")), str(e)


def test_reading_memory_no_instruction_wrote():
    def k(x):
        t = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        u = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t[:, 0:4], value=1.0)
        nisa.tensor_copy(dst=u, src=t)  # HERE
        return u

    e = _raises_at(
        tn.UninitializedReadError, k, "# HERE", "[rule uninitialized_read]", np.ones(2, np.float32)
    )
    assert isinstance(e, Trn2ValueError) and "never written" in str(e)


def test_a_loop_carried_dependency_inside_affine_range():
    def k(x):
        out = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.load(x)
        for _ in lnl.affine_range(3):
            acc[...] = lnl.exp(acc)  # HERE
        lnl.store(out, value=acc)
        return out

    with pytest.raises(tn.LoopCarriedDependencyError) as info:
        tn.run(tn.jit_legacy(k), np.ones((128, 64), np.float32))
    assert str(info.value).startswith(f"{__file__}:{_line_of(k, '# HERE')}:")
    assert "[rule affine_range]" in str(info.value) and "sequential_range" in str(info.value)

    def ok(x):  # the same loop as a sequential_range, and associative accumulations
        out = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.load(x)
        for _ in lnl.sequential_range(3):
            acc[...] = lnl.exp(acc)
        s = lnl.zeros((128, 64), nl.float32)
        for i in lnl.affine_range(4):
            s += acc * float(i)
        lnl.store(out, value=s)
        return out

    x = np.random.default_rng(8).standard_normal((128, 64), dtype=np.float32) / 4
    out = tn.run(tn.jit_legacy(ok), x).outputs
    acc = x
    for _ in range(3):
        acc, _ = ref.activation(acc, "exp", "fp32")
    want = np.zeros_like(x)
    for i in range(4):
        want = ref.tensor_tensor(
            want, ref.tensor_scalar(acc, "multiply", float(i), "fp32"), "add", "fp32"
        )
    assert np.array_equal(out, want)


def test_errors_outside_a_kernel_and_bad_arguments(copy_kernel):
    with pytest.raises(tn.KernelError, match="inside a kernel"):
        nl.ndarray((2, 2), nl.float32)
    with pytest.raises(trn2core.FormatError):
        tn.jit(copy_kernel)(np.ones((2, 2), ml_dtypes.float8_e4m3fn))
    with pytest.raises(tn.KernelError, match="float64"):
        tn.jit(copy_kernel)(np.ones((2, 2)))
    with pytest.raises(Trn2ValueError, match="not an ALU operator"):
        tn.run(
            lambda x: nisa.tensor_tensor(dst=x, data1=x, data2=x, op=nl.exp),
            np.ones((2, 2), np.float32),
        )
    with pytest.raises(tn.NotSupportedError, match="nki.isa.topk is not supported"):
        tn.run(lambda x: nisa.topk(0, 0, x, 1), np.ones((2, 2), np.float32))

    @tn.jit
    def half(x):
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:2, :], src=nl.load(x[0:2, :]))
        return out

    # The error points at the line that created the output (the kernel's file and line).
    with pytest.raises(tn.KernelError, match="did not write every element") as info:
        half(np.ones((4, 4), np.float32))
    line = _line_of(test_errors_outside_a_kernel_and_bad_arguments, "out = nl.ndarray((4, 4)")
    assert info.value.nki_location == (__file__, line), info.value.nki_location
    assert f"{__file__}:{line}:" in str(info.value) and "[rule output_unwritten]" in str(info.value)

    @tn.jit
    def half_view(x):
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:2, :], src=nl.load(x[0:2, :]))
        return out[0:4, :]

    with pytest.raises(tn.KernelError, match="did not write every element") as info:
        half_view(np.ones((4, 4), np.float32))
    assert info.value.nki_location[0] == __file__


# ----------------------------------------------------------------------------- the CLI

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples" / "nki"


def test_cli_nki_run_prints_the_timeline_and_writes_a_trace(capsys, tmp_path):
    from trn2core.cli import main

    trace = tmp_path / "t.json"
    rc = main(
        [
            "nki",
            "run",
            f"{EXAMPLES}/matmul.py::matmul_hoisted",
            "--shapes",
            "256x128:bf16",
            "256x512:bf16",
            "--trace",
            str(trace),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "float32 [128, 512]" in out and "bottleneck" in out and "PE" in out
    assert any(e.get("name") == "nc_matmul" for e in json.loads(trace.read_text())["traceEvents"])
    rc = main(
        [
            "nki",
            "run",
            f"{EXAMPLES}/layernorm.py::layernorm",
            "--shapes",
            "128x64",
            "64",
            "64",
            "--arg",
            "eps=0.001",
        ]
    )
    assert rc == 0 and "float32 [128, 64]" in capsys.readouterr().out


def test_cli_nki_run_reports_bad_input_and_kernel_errors(capsys):
    from trn2core.cli import main

    assert main(["nki", "run", f"{EXAMPLES}/matmul.py::nope"]) == 2
    assert "matmul_tiled" in capsys.readouterr().err
    assert main(["nki", "run", f"{EXAMPLES}/matmul.py::matmul_tiled", "--shapes", "12y"]) == 2
    assert "--shapes" in capsys.readouterr().err
    # A kernel the chip would refuse is a refusal (exit 1), not a usage error (exit 2).
    assert main(["nki", "run", f"{EXAMPLES}/mistakes.py::too_big", "--shapes", "128x28672"]) == 1
    err = capsys.readouterr().err
    assert "CapacityError" in err and "mistakes.py:" in err and "[rule sbuf_capacity]" in err
    assert main(["nki", "run", f"{EXAMPLES}/mistakes.py::half_written", "--shapes", "128x8"]) == 1
    assert "did not write every element" in capsys.readouterr().err
    assert main(["nki", "run", "no/such/file.py::k"]) == 2


def test_demo_part_runs_the_matmul_stages(capsys):
    from trn2core.cli import main

    assert main(["demo", "--only", "nki"]) == 0
    out = capsys.readouterr().out
    for stage in ("matmul_tiled", "matmul_hoisted", "matmul_blocked_free", "matmul_fully_blocked"):
        assert stage in out
    assert "= gemm" in out and "mistakes.py:" in out


# --------------------------------------------------------------- max8 and nc_find_index8


def _top8_reference(x):
    """numpy: the 8 largest per row, descending (a stable sort of -x; ties keep index order),
    and each value's k-th occurrence for its k-th repeat."""
    order = np.argsort(-x, axis=1, kind="stable")[:, :8]
    vals = np.take_along_axis(x, order, axis=1)
    return vals, order.astype(np.uint32)


def _sbuf_copy(a):
    """Kernel code: a new SBUF tile holding ``a``."""
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t


def _hbm_copy(t):
    """Kernel code: a new shared-HBM tensor (an output) holding ``t``."""
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _sbuf_max8(a):
    """Kernel code: ``a`` copied into SBUF, and ``max8`` of it (the 8 largest of each row)."""
    t = _sbuf_copy(a)
    top = nl.ndarray((a.shape[0], 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    return t, top


def test_max8_and_nc_find_index8_in_both_dialects_match_numpy():
    rng = np.random.default_rng(8)
    x = rng.integers(-20, 20, size=(64, 300)).astype(np.float32)  # many ties
    want_vals, want_idx = _top8_reference(x)

    @tn.jit
    def current(a):
        t, top = _sbuf_max8(a)
        idx = nl.ndarray((a.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=t, vals=top)
        out = _hbm_copy(idx)
        return out

    @tn.jit_legacy
    def legacy(a):
        t = lnl.load(a)
        top = lisa.max8(src=t)
        out_v = lnl.ndarray((a.shape[0], 8), dtype=nl.float32, buffer=lnl.shared_hbm)
        lnl.store(out_v, value=top)
        return out_v

    res = tn.run(current, x)
    assert np.array_equal(res.outputs, want_idx)
    assert res.report.opcodes["max8"] == 1 and res.report.opcodes["nc_find_index8"] == 1
    assert np.array_equal(tn.run(legacy, x).outputs, want_vals)


def test_max8_rules_name_the_argument():
    @tn.jit
    def too_few(a):
        _sbuf_max8(a)
        return a

    with pytest.raises(ShapeError, match="src: 7 elements per partition") as e:
        tn.run(too_few, np.zeros((4, 7), np.float32))
    assert e.value.rule == "max8_size"


# --------------------------------------------------------------- nc_match_replace8


def _match_replace8_reference(x, vals, imm):
    """numpy, as documented: for i = 7 .. 0 the first element of the (partly replaced) row equal
    to vals[i] becomes imm, its index going to column i (all ones when absent)."""
    out = x.copy()
    idx = np.full(vals.shape, 0xFFFFFFFF, np.uint32)
    for r in range(x.shape[0]):
        for i in range(7, -1, -1):
            hit = np.flatnonzero(out[r] == vals[r, i])
            if hit.size:
                out[r, hit[0]] = imm
                idx[r, i] = hit[0]
    return out, idx


def test_nc_match_replace8_in_both_dialects_matches_numpy():
    rng = np.random.default_rng(88)
    x = rng.integers(-6, 6, size=(32, 40)).astype(np.float32)  # every value repeated
    vals = rng.integers(-7, 7, size=(32, 8)).astype(np.float32)  # repeats; -7, 6 absent
    vals[0] = [3, 8, 8, 8, 8, 8, 8, 8]
    x[0, :11] = [1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]
    x[0, 11:] = 0
    want, want_idx = _match_replace8_reference(x, vals, -100.0)
    assert list(want_idx[0]) == [2, 10, 9, 8, 7, 6, 5, 4]  # the documentation's example

    @tn.jit
    def current(a, v):
        t = _sbuf_copy(a)
        w = _sbuf_copy(v)
        idx = nl.ndarray((a.shape[0], 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=t, data=t, vals=w, imm=-100.0, dst_idx=idx)  # in place
        out = _hbm_copy(t)
        out_idx = _hbm_copy(idx)
        return out, out_idx

    @tn.jit_legacy
    def legacy(a, v):
        r = lisa.nc_match_replace8(data=lnl.load(a), vals=lnl.load(v), imm=-100.0)
        out = lnl.ndarray(a.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=r)
        return out

    res = tn.run(current, x, vals)
    got, got_idx = res.outputs
    assert np.array_equal(got, want) and np.array_equal(got_idx, want_idx)
    assert res.report.opcodes["nc_match_replace8"] == 1
    assert np.array_equal(tn.run(legacy, x, vals).outputs, want)


def test_nc_match_replace8_rules_name_the_argument():
    @tn.jit
    def bad_idx(a):
        t = _sbuf_copy(a)
        idx = nl.ndarray((a.shape[0], 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=t, data=t, vals=t[:, :8], imm=0.0, dst_idx=idx)
        return a

    with pytest.raises(Trn2Error, match="dst_idx: nc_match_replace8 writes uint16") as e:
        tn.run(bad_idx, np.zeros((4, 16), np.float32))
    assert e.value.rule == "find_index_dtype"


# --------------------------------------------------------------- nc_stream_shuffle


def _shuffle_reference(src, dst, mask):
    """numpy, as documented: in each quadrant of 32 partitions, dst row i = src row mask[i]
    (255: dst's row unmodified)."""
    out = dst.copy()
    for i in range(dst.shape[0]):
        if mask[i % 32] != 255:
            out[i] = src[i // 32 * 32 + mask[i % 32]]
    return out


def test_nc_stream_shuffle_in_both_dialects_matches_numpy():
    rng = np.random.default_rng(32)
    x = rng.standard_normal((64, 24)).astype(np.float32)
    y = rng.standard_normal((64, 24)).astype(np.float32)
    mask = [int(v) for v in rng.permutation(32)]
    mask[3] = mask[17] = 255
    want = _shuffle_reference(x, y, mask)

    @tn.jit
    def current(a, b):
        s = _sbuf_copy(a)
        d = _sbuf_copy(b)
        nisa.nc_stream_shuffle(dst=d, src=s, shuffle_mask=mask)
        out = _hbm_copy(d)
        return out

    @tn.jit_legacy
    def legacy(a, b):
        s = lnl.load(a)
        d = lnl.load(b)
        lisa.nc_stream_shuffle(s, d, mask)  # the legacy order: src, dst
        out = lnl.ndarray(b.shape, dtype=b.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=d)
        return out

    res = tn.run(current, x, y)
    assert np.array_equal(res.outputs, want)
    assert res.report.opcodes["nc_stream_shuffle"] == 1
    assert np.array_equal(tn.run(legacy, x, y).outputs, want)


def test_nc_stream_shuffle_rules_name_the_argument():
    def kernel(mask):
        @tn.jit
        def k(a):
            s = _sbuf_copy(a)
            nisa.nc_stream_shuffle(dst=s, src=s, shuffle_mask=mask)
            return a

        return k

    x = np.zeros((32, 4), np.float32)
    with pytest.raises(Trn2ValueError, match="shuffle_mask: 31 elements") as e:
        tn.run(kernel(list(range(31))), x)
    assert e.value.rule == "shuffle_mask"
    with pytest.raises(Trn2ValueError, match="shuffle_mask: element 0 is 32"):
        tn.run(kernel([32] + list(range(31))), x)
    with pytest.raises(Trn2ValueError, match="shuffle_mask: expected a list of integers"):
        tn.run(kernel("0123"), x)


def test_nc_n_gather_in_both_dialects_matches_numpy():
    # nki-library's rotational top-k maps each partition's local top-k positions to global
    # indices with nc_n_gather (data's free axes flattened, uint32 indices per partition).
    rng = np.random.default_rng(33)
    x = rng.standard_normal((48, 3, 10)).astype(ml_dtypes.bfloat16)
    idx = rng.integers(0, 30, (48, 9)).astype(np.uint32)
    idx[0, :] = 29  # one element repeated; the last of the row
    want = np.take_along_axis(x.reshape(48, 30), idx.astype(np.int64), axis=1)

    @tn.jit
    def current(a, i):
        s = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        t = nl.ndarray(i.shape, dtype=i.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=i)
        d = nl.ndarray(i.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=d, data=s, indices=t)
        out = nl.ndarray(i.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    @tn.jit_legacy
    def legacy(a, i):
        g = lisa.nc_n_gather(lnl.load(a), lnl.load(i))
        out = lnl.ndarray(i.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=g)
        return out

    res = tn.run(current, x, idx)
    assert np.array_equal(res.outputs.view(np.uint16), want.view(np.uint16))
    assert res.report.opcodes["nc_n_gather"] == 1
    assert np.array_equal(tn.run(legacy, x, idx).outputs.view(np.uint16), want.view(np.uint16))
    idx[5, 2] = 30  # past the row: the documented range
    with pytest.raises(Trn2ValueError, match="index 30 at partition 5, element 2") as e:
        tn.run(current, x, idx)
    assert e.value.rule == "gather_index"
    assert str(e.value).startswith(f"{__file__}:{_line_of(current, 'nisa.nc_n_gather')}:")


def _local_gather_ref(src, index, m, k):
    """AWS's numpy semantics of local_gather: each 16-partition group's indices flattened
    partitions first (the first k), every partition of the group reading m elements of its
    own row (free axes flattened) at each."""
    p = src.shape[0]
    rows = src.reshape(p, -1)
    out = np.empty((p, k, m), src.dtype)
    for g in range(0, p, 16):
        ids = index[g : g + 16].reshape(16, -1).flatten(order="F")[:k].astype(np.int64)
        for e in range(m):
            out[g : g + 16, :, e] = rows[g : g + 16][:, ids + e]
    return out


def test_local_gather_in_both_dialects_matches_numpy():
    # nki-library's selective-expert moe_tkg gathers each token's affinities at its experts'
    # indices with local_gather (uint16 indices, one 16-partition group per GpSimd core).
    rng = np.random.default_rng(7)
    src = rng.standard_normal((32, 8, 4)).astype(np.float32)
    index = rng.integers(0, 16, (32, 4)).astype(np.uint16) * 2  # element offsets, runs of 2
    index[0, 0] = 30  # the last run of the row

    @tn.jit
    def current(a, i, k):
        s, t = _to_sbuf(a, i)
        d = nl.ndarray((a.shape[0], k * 2), dtype=a.dtype, buffer=nl.sbuf)
        nisa.local_gather(d, s, t, num_elem_per_idx=2, num_valid_indices=k)  # gather
        return _to_hbm(d)[0]

    @tn.jit_legacy
    def legacy(a, i):
        g = lisa.local_gather(lnl.load(a), lnl.load(i), 2)
        out = lnl.ndarray((a.shape[0], 4, 16, 2), dtype=a.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=g)
        return out

    for k in (64, 21):
        res = tn.run(current, src, index, k)
        want = _local_gather_ref(src, index, 2, k).reshape(32, k * 2)
        assert np.array_equal(res.outputs, want), k
        assert res.report.opcodes["local_gather"] == 1
    got = tn.run(legacy, src, index).outputs
    assert np.array_equal(got.reshape(32, 64, 2), _local_gather_ref(src, index, 2, 64))
    index[17, 1] = 31  # a run of 2 from element 31 passes the row's end
    with pytest.raises(Trn2ValueError, match="index 31 .* partitions 16..32") as e:
        tn.run(current, src, index, 64)
    assert e.value.rule == "gather_index"
    assert str(e.value).startswith(f"{__file__}:{_line_of(current, '# gather')}:")
    with pytest.raises(Trn2ValueError, match="num_valid_indices") as e:
        tn.run(current, src, index, 65)
    assert e.value.arg == "num_valid_indices"


def _range_select_ref(x, start, lo, hi, op0, op1):
    """The documented numpy equivalent: the float32 free index against each partition's
    bounds, float32's lowest where either comparison fails; the max per partition."""
    idx = (start + np.arange(x.shape[1])).astype(np.float32)
    mask = op0(idx[None, :], lo) & op1(idx[None, :], hi)
    sel = np.where(mask, x.astype(np.float32), np.finfo(np.float32).min)
    return sel, sel.max(axis=1, keepdims=True)


def test_range_select_masks_by_free_index_and_max_reduces_like_numpy():
    # nki-library attention_cte's dynamic masks (prior KV cache, sequence packing) and
    # attention_bwd: on_true_tile read from PSUM, bounds per partition, range_start the key
    # tile's offset. Partial tiles (20 of the 128 partitions), a NaN bound, -0.0 and +-inf.
    rng = np.random.default_rng(7)
    p, n, start = 20, 96, 256
    x = np.round(rng.uniform(-8, 8, (p, n))).astype(np.float32)
    x[1, 5], x[2, 7], x[3, 9], x[4, 11] = -0.0, np.inf, -np.inf, np.inf
    lo = rng.integers(start - 8, start + n, (p, 1)).astype(np.float32)
    hi = (lo + rng.integers(-4, 40, (p, 1))).astype(np.float32)
    lo[6, 0] = np.nan  # a NaN bound: every comparison false, the row all fill
    hi[7, 0] = lo[7, 0]  # an empty range

    @tn.jit
    def k(x, lo, hi):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        ps = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        b = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b[:, 0:1], src=lo)
        nisa.dma_copy(dst=b[:, 1:2], src=hi)
        d = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(
            d,
            on_true_tile=ps,
            comp_op0=nl.greater_equal,
            comp_op1=nl.less,
            bound0=b[:, 0:1],
            bound1=b[:, 1:2],
            reduce_op=nl.maximum,
            reduce_res=res,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
            range_start=start,
            on_false_value=-3.4028235e38,
        )
        out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        m = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=m, src=res)
        return out, m

    sel, mx = _range_select_ref(x, start, lo, hi, np.greater_equal, np.less)
    res = tn.run(k, x, lo, hi)
    out, m = res.outputs
    # bf16 of float32's lowest is -inf (nearest even), as the documentation's note says.
    assert np.array_equal(out.view(np.uint16), sel.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.all(np.isneginf(out[6].astype(np.float32))) and np.all(m[6:8] == sel.min())
    assert np.array_equal(m.view(np.uint32), mx.view(np.uint32))
    assert res.report.opcodes["range_select"] == 1


def test_range_select_legacy_form_returns_the_selected_tile():
    # Neuron 2.26's keyword-only form: the result a new tile, reduce_cmd idle by default (so
    # reset_reduce given here), on_false_value float32's lowest by default; numpy comparison
    # operators. A partial tile with a NaN bound, -0.0 and +-inf.
    rng = np.random.default_rng(8)
    p, n, start = 20, 64, 32
    x = np.round(rng.uniform(-8, 8, (p, n))).astype(np.float32)
    x[1, 5], x[2, 7], x[3, 9] = -0.0, np.inf, -np.inf
    lo = rng.integers(start - 8, start + n, (p, 1)).astype(np.float32)
    hi = (lo + rng.integers(-4, 40, (p, 1))).astype(np.float32)
    lo[6, 0] = np.nan

    @tn.jit_legacy
    def k(x, lo, hi):
        t = lnl.load(x)
        b0 = lnl.load(lo)
        b1 = lnl.load(hi)
        res = lnl.ndarray((x.shape[0], 1), dtype=lnl.float32, buffer=lnl.sbuf)
        r = lisa.range_select(
            on_true_tile=t,
            comp_op0=np.greater,
            comp_op1=np.less_equal,
            bound0=b0,
            bound1=b1,
            reduce_cmd=lisa.reduce_cmd.reset_reduce,
            reduce_res=res,
            range_start=start,
        )
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=r)
        m = lnl.ndarray((x.shape[0], 1), dtype=lnl.float32, buffer=lnl.shared_hbm)
        lnl.store(m, value=res)
        return out, m

    sel, mx = _range_select_ref(x, start, lo, hi, np.greater, np.less_equal)
    out, m = tn.run(k, x, lo, hi).outputs
    assert np.array_equal(out.view(np.uint32), sel.view(np.uint32))
    assert np.array_equal(m.view(np.uint32), mx.view(np.uint32))


def test_range_select_rules_name_the_argument_at_the_kernels_line():
    x = np.ones((8, 16), np.float32)

    def kern(case):
        def f(x):
            t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x)
            b = nl.ndarray((8, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=b, value=3.0)
            b16 = nl.ndarray((8, 1), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.memset(dst=b16, value=3.0)
            i = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
            nisa.memset(dst=i, value=1)
            kw = dict(comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b, bound1=b)
            if case == "comp_op0":
                kw["comp_op0"] = nl.add
            elif case == "reduce_op":
                kw["reduce_op"] = nl.add
            elif case == "on_false_value":
                kw["on_false_value"] = 0.0
            elif case == "range_start":
                kw["range_start"] = 2**24
            elif case == "bound1":
                kw["bound1"] = b16
            elif case == "reduce_cmd":
                kw["reduce_cmd"] = nisa.reduce_cmd.load_reduce
            src = i if case == "on_true_tile" else t
            nisa.range_select(t, on_true_tile=src, **kw)  # the call
            return x

        return f

    for case in (
        "comp_op0",
        "reduce_op",
        "on_false_value",
        "range_start",
        "bound1",
        "reduce_cmd",
        "on_true_tile",
    ):
        f = kern(case)
        with pytest.raises(Trn2Error) as e:
            tn.run(tn.jit(f), x)
        assert e.value.arg == case, (case, str(e.value))
        assert e.value.nki_location == (__file__, _line_of(f, "# the call")), case


def _ieee_max_rows(v):
    """IEEE maximum down each row (NaN propagates; +0 above -0), from -inf."""
    out = np.full((v.shape[0], 1), -np.inf, np.float32)
    for r, row in enumerate(v):
        acc = np.float32(-np.inf)
        for x in row:
            if np.isnan(acc) or np.isnan(x):
                acc = np.float32(np.nan)
            elif x == acc:
                acc = x if not np.signbit(x) else acc
            elif x > acc:
                acc = x
        out[r, 0] = acc
    return out


def _select_reduce_ref(pred, x, on_false, reverse):
    """The documented numpy equivalent, the predicate true when nonzero (reverse_pred a logical
    not: ours, where numpy's ``~`` on an integer tile would be bitwise)."""
    keep = (pred != 0) != reverse
    return np.where(keep, x.astype(np.float32), np.float32(on_false)).astype(np.float32)


def _bits_equal(a, b):
    na, nb = np.isnan(a), np.isnan(b)
    return np.array_equal(na, nb) and np.array_equal(a[~na].view(np.uint32), b[~nb].view(np.uint32))


def test_select_reduce_in_both_dialects_matches_numpy():
    # A partial tile (20 of 128 partitions), int16 predicates (negative, zero, positive),
    # NaN/-0/+-inf values, on_true read from PSUM, a per-partition on_false tile with a NaN and
    # -0, then reverse_pred with float32's lowest as the scalar, the reduction continuing.
    rng = np.random.default_rng(26)
    p, n = 20, 48
    x = np.round(rng.uniform(-8, 8, (p, n))).astype(np.float32)
    x[1, 5], x[2, 7], x[3, 9], x[4, 11], x[5, 0] = -0.0, np.inf, -np.inf, np.nan, 0.0
    x[6] = -0.0  # a row of -0 only
    pred = rng.choice(np.array([0, 1, -1, 300], np.int16), (p, n))
    pred[6] = 1
    fill = rng.uniform(-20, -10, (p, 1)).astype(np.float32)
    fill[8, 0], fill[9, 0] = np.nan, -0.0
    lowest = float(np.finfo(np.float32).min)

    @tn.jit
    def k(x, pred, fill):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        ps = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        q = nl.ndarray(pred.shape, dtype=pred.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=q, src=pred)
        f = nl.ndarray(fill.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=fill)
        d1 = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        d2 = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        r1 = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        r2 = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(
            dst=d1,
            predicate=q,
            on_true=ps,
            on_false=f,
            reduce_res=r1,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
            reduce_op=nl.maximum,
        )
        nisa.select_reduce(d2, q, t, lowest, r2, nisa.reduce_cmd.reduce, nl.maximum, True)
        outs = []
        for v in (d1, d2, r1, r2):
            o = nl.ndarray(v.shape, dtype=v.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=v)
            outs.append(o)
        return tuple(outs)

    s1 = _select_reduce_ref(pred, x, fill, False)
    s2 = _select_reduce_ref(pred, x, lowest, True)
    m1 = _ieee_max_rows(s1)
    m2 = _ieee_max_rows(np.concatenate([m1, s2], axis=1))
    res = tn.run(k, x, pred, fill)
    d1, d2, r1, r2 = res.outputs
    assert _bits_equal(d1, s1) and _bits_equal(r1, m1) and _bits_equal(r2, m2)
    want2 = s2.astype(ml_dtypes.bfloat16)  # float32's lowest rounds to -inf (nearest even)
    n2 = np.isnan(want2.astype(np.float32))
    assert np.array_equal(np.isnan(d2.astype(np.float32)), n2)
    assert np.array_equal(d2[~n2].view(np.uint16), want2[~n2].view(np.uint16))
    assert np.isnan(d1[8][pred[8] == 0]).all() and np.signbit(m1[6, 0]) and np.isnan(m1[4, 0])
    assert res.report.opcodes["select_reduce"] == 2

    @tn.jit_legacy
    def legacy(x, pred, fill):
        t = lnl.load(x)
        q = lnl.load(pred)
        f = lnl.load(fill)
        d = lnl.ndarray(x.shape, dtype=lnl.float32, buffer=lnl.sbuf)
        r = lnl.ndarray((x.shape[0], 1), dtype=lnl.float32, buffer=lnl.sbuf)
        lisa.select_reduce(
            dst=d,
            predicate=q,
            on_true=t,
            on_false=f,
            reduce_res=r,
            reduce_cmd=lisa.reduce_cmd.reset_reduce,
            reduce_op=np.max,
        )
        out = lnl.ndarray(x.shape, dtype=lnl.float32, buffer=lnl.shared_hbm)
        lnl.store(out, value=d)
        mo = lnl.ndarray((x.shape[0], 1), dtype=lnl.float32, buffer=lnl.shared_hbm)
        lnl.store(mo, value=r)
        return out, mo

    ld, lr = tn.run(legacy, x, pred, fill).outputs
    assert _bits_equal(ld, s1) and _bits_equal(lr, m1)


@pytest.mark.parametrize(
    "case, arg, rule",
    [
        ("predicate", "predicate", "select_reduce_dtype"),
        ("on_true", "on_true", "select_reduce_dtype"),
        ("reduce_op", "reduce_op", None),
        ("reduce_cmd", "reduce_cmd", None),
        ("on_false", "on_false", "shape"),
        ("reduce_res", "reduce_res", "shape"),
        ("dst", "predicate", "shape"),
        ("psum", "on_true", "two_psum_inputs"),
    ],
)
def test_select_reduce_rules_name_the_argument_at_the_kernels_line(case, arg, rule):
    def f(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        q = nl.ndarray(x.shape, dtype=nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=q, value=1)
        kw = dict(dst=t, predicate=q, on_true=t, on_false=0.0)
        if case == "predicate":
            kw["predicate"] = t
        elif case == "on_true":
            i = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
            nisa.memset(dst=i, value=1)
            kw["on_true"] = i
        elif case == "reduce_op":
            kw["reduce_op"] = nl.add
        elif case == "reduce_cmd":
            kw["reduce_cmd"] = nisa.reduce_cmd.load_reduce
        elif case == "on_false":
            kw["on_false"] = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=kw["on_false"], value=0.0)
        elif case == "reduce_res":
            kw["reduce_res"] = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        elif case == "dst":
            kw["predicate"] = q[:, 0:8]
        elif case == "psum":
            ps = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
            pq = nl.ndarray(x.shape, dtype=nl.uint8, buffer=nl.psum)
            nisa.tensor_copy(dst=ps, src=t)
            nisa.memset(dst=pq, value=1)
            kw["on_true"], kw["predicate"] = ps, pq
        nisa.select_reduce(**kw)  # the call
        return x

    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), np.ones((8, 16), np.float32))
    assert e.value.arg == arg, (case, str(e.value))
    assert rule is None or e.value.rule == rule, (case, str(e.value))
    assert e.value.nki_location == (__file__, _line_of(f, "# the call")), case


def _sequence_bounds_ref(seq):
    """The documented numpy loops: a run of equal nonzero ids spans [start, end); id 0 is
    padding (n, -1)."""
    n = len(seq)
    lo, hi = np.zeros(n), np.zeros(n)
    for i in range(n):
        lo[i] = n if seq[i] == 0 else lo[i - 1] if i and seq[i] == seq[i - 1] else i
    for i in range(n - 1, -1, -1):
        last = i == n - 1
        hi[i] = -1 if seq[i] == 0 else hi[i + 1] if not last and seq[i] == seq[i + 1] else i + 1
    return np.stack([lo, hi])[None]


def test_sequence_bounds_in_both_dialects_matches_the_documented_loops():
    # The documentation's example (padding inside and at the ends), sorted random ids as its
    # test draws them (float32), -0.0 as padding, int32 ids into a float32 result.
    seq = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.float32)
    rng = np.random.default_rng(3)
    ids = np.sort(rng.integers(0, 40, 64)).astype(np.float32)[None]
    ids[0, 5] = -0.0 if ids[0, 5] == 0 else ids[0, 5]

    @tn.jit
    def cur(s, dt):
        t = nl.ndarray(s.shape, dtype=s.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=s)
        d = nl.ndarray((1, 2, s.shape[1]), dtype=dt, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=d, segment_ids=t)
        out = nl.ndarray(d.shape, dtype=dt, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    @tn.jit_legacy
    def legacy(s):
        b = lisa.sequence_bounds(segment_ids=lnl.load(s))
        out = lnl.ndarray((1, 2, s.shape[1]), dtype=s.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=b)
        return out

    for s in (seq, ids, ids.astype(np.int32)):
        want = _sequence_bounds_ref(s[0])
        for dt in (nl.float32, nl.int32):
            got = tn.run(cur, s, dt).outputs
            assert np.array_equal(got, want.astype(got.dtype)), (s, dt)
        got = tn.run(legacy, s).outputs
        assert got.dtype == s.dtype and np.array_equal(got, want.astype(s.dtype))
    assert tn.run(cur, seq, nl.int32).outputs[0, :, 0].tolist() == [9, -1]


@pytest.mark.parametrize(
    "case, arg, rule",
    [
        ("dtype", "segment_ids", "sequence_bounds_dtype"),
        ("ids", "segment_ids", "sequence_bounds_ids"),
        ("rows", "segment_ids", "shape"),
        ("dst", "dst", "shape"),
    ],
)
def test_sequence_bounds_rules_name_the_argument_at_the_kernels_line(case, arg, rule):
    x = np.array([[1.0, 1.0, -2.0 if case == "ids" else 2.0, 0.0]], np.float32)

    def f(x):
        rows = 2 if case == "rows" else 1
        t = nl.ndarray((rows, 4), dtype=nl.bfloat16 if case == "dtype" else x.dtype, buffer=nl.sbuf)
        for r in range(rows):
            nisa.dma_copy(dst=t[r : r + 1, :], src=x)
        d = nl.ndarray((1, 2, 3 if case == "dst" else 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=d, segment_ids=t)  # the call
        return x

    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), x)
    assert e.value.arg == arg and e.value.rule == rule, (case, str(e.value))
    assert e.value.nki_location == (__file__, _line_of(f, "# the call")), case


def _partition_sum(x):
    """Our oracle: float32 additions down the partitions, in partition order."""
    acc = x[0].astype(np.float32)
    for row in x[1:]:
        acc = (acc + row.astype(np.float32)).astype(np.float32)
    return acc[None]


def test_tensor_partition_reduce_in_both_dialects_matches_numpy():
    # nki-library attention_bwd sums its sink gradients across partitions (current dialect,
    # dst first, a 3-D [1, heads, sinks] result); the legacy flash-attention backward of
    # nki-samples' reference kernels returns the [1, ...] tile. Values where the order shows:
    # 1e8 absorbs each +1 before -1e8 cancels it; -0.0 sums stay -0.0; NaN and inf propagate.
    rng = np.random.default_rng(11)
    x = np.round(rng.uniform(-50, 50, (100, 4, 6))).astype(np.float32)
    x[:, 0, 0] = 1.0
    x[0, 0, 0], x[99, 0, 0] = 1e8, -1e8
    x[:, 0, 1] = -0.0
    x[17, 1, 1], x[30, 2, 2], x[31, 2, 3] = np.nan, np.inf, -np.inf
    want = _partition_sum(x)
    assert want[0, 0, 0] == 0.0 and np.signbit(want[0, 0, 1])

    @tn.jit
    def current(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        r = nl.ndarray((1, *a.shape[1:]), dtype=a.dtype)
        nisa.tensor_partition_reduce(r, nl.add, t)
        m = nl.ndarray((1, *a.shape[1:]), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=m, op=nl.maximum, data=t)
        out = nl.ndarray(r.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=r)
        mo = nl.ndarray(m.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=mo, src=m)
        return out, mo

    @tn.jit_legacy
    def legacy(a):
        r = lisa.tensor_partition_reduce(np.add, lnl.load(a))
        out = lnl.ndarray((1, *a.shape[1:]), dtype=a.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=r)
        return out

    res = tn.run(current, x)
    got, mx = res.outputs
    assert np.array_equal(got, want, equal_nan=True) and np.signbit(got[0, 0, 1])
    want_max = np.max(x, axis=0, keepdims=True).astype(ml_dtypes.bfloat16)
    assert np.array_equal(mx.view(np.uint16) & 0x7FC0 == 0x7FC0, np.isnan(want_max))
    ok = ~np.isnan(want_max)
    assert np.array_equal(mx[ok].view(np.uint16), want_max[ok].view(np.uint16))
    assert res.report.opcodes["tensor_partition_reduce"] == 2
    assert np.array_equal(tn.run(legacy, x).outputs, want, equal_nan=True)

    i = rng.integers(-(2**31), 2**31, (8, 5), dtype=np.int64).astype(np.int32)

    @tn.jit
    def bits(a):
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        o = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        n = nl.ndarray((1, a.shape[1]), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(o, nl.bitwise_or, t)
        nisa.tensor_partition_reduce(n, nl.bitwise_and, t)
        out = nl.ndarray((2, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0:1, :], src=o)
        nisa.dma_copy(dst=out[1:2, :], src=n)
        return out

    got = tn.run(bits, i).outputs
    assert np.array_equal(got[0], np.bitwise_or.reduce(i, axis=0))
    assert np.array_equal(got[1], np.bitwise_and.reduce(i, axis=0))


def test_tensor_partition_reduce_average_is_the_sum_divided_once():
    # average (the current docs' operator list; the division is ours): the float32 sum in
    # partition order divided once by the partition count, rounded once to dst (bf16); NaN,
    # -0 and inf carried.
    rng = np.random.default_rng(4)
    x = rng.uniform(-9, 9, (96, 10)).astype(np.float32)
    x[:, 0], x[5, 1], x[7, 2] = -0.0, np.nan, np.inf

    @tn.jit
    def k(x):
        (t,) = _to_sbuf(x)
        r = nl.ndarray((1, x.shape[1]), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(r, nl.average, t)
        return _to_hbm(r)[0]

    with np.errstate(invalid="ignore"):
        want = (_partition_sum(x) / np.float32(96)).astype(np.float32)
    got = tn.run(k, x).outputs
    assert _bits_equal(got.astype(np.float32), want.astype(BF16).astype(np.float32))
    assert np.signbit(got[0, 0]) and np.isnan(got[0, 1]) and got[0, 2] == np.inf


@pytest.mark.parametrize(
    "case, arg, rule",
    [
        ("op", "op", None),
        ("dst", "dst", "shape"),
        ("bits", "data", "bitvec_dtype"),
        ("psum", "data", "gpsimd_psum"),
    ],
)
def test_tensor_partition_reduce_rules_name_the_argument_at_the_kernels_line(case, arg, rule):
    def f(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        ps = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=t)
        d = nl.ndarray((2, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        dst, op, data = r, nl.add, t
        if case == "op":
            op = nl.subtract
        elif case == "dst":
            dst = d
        elif case == "bits":
            op = nl.bitwise_or
        elif case == "psum":
            data = ps
        nisa.tensor_partition_reduce(dst, op, data)  # the call
        return x

    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), np.ones((8, 4), np.float32))
    assert e.value.arg == arg and e.value.rule == rule, str(e.value)
    assert e.value.nki_location == (__file__, _line_of(f, "# the call"))


def _nonzero_ref(row, offset, pad):
    """Our transcription of the documented pseudocode for one partition."""
    idx = [i + offset for i, v in enumerate(row) if v != 0 or np.isnan(v)]
    return np.array(idx + [pad] * (len(row) - len(idx)) + [len(idx)], np.int32)


def test_nonzero_with_count_writes_the_gpsimd_cores_partitions_like_the_pseudocode():
    # nki-library's find_nonzero_indices and MoE token routing: fp32 rows on partitions 0, 16,
    # .., 112 (one per GpSimd core); the other partitions of dst keep what they held.
    rng = np.random.default_rng(5)
    x = (rng.random((128, 40)) < 0.3).astype(np.float32) * rng.uniform(-2, 2, (128, 40))
    x = x.astype(np.float32)
    x[0, :] = 0.0  # no nonzero: all padding, count 0
    x[16, :] = 1.0  # all nonzero
    x[32, 3], x[32, 4], x[32, 5] = -0.0, np.nan, 1e-45  # -0 is zero; NaN, a denormal nonzero

    @tn.jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        d = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=d, value=7)
        nisa.nonzero_with_count(dst=d, src=t, index_offset=100, padding_val=-5)
        out = nl.ndarray(d.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=d)
        return out

    res = tn.run(k, x)
    got = res.outputs
    for p in range(128):
        want = _nonzero_ref(x[p], 100, -5) if p % 16 == 0 else np.full(41, 7, np.int32)
        assert np.array_equal(got[p], want), p
    assert got[0, -1] == 0 and got[16, -1] == 40 and got[16, 0] == 100
    assert res.report.opcodes["nonzero_with_count"] == 1


@pytest.mark.parametrize(
    "case, arg, rule",
    [
        ("src", "src", "nonzero_dtype"),
        ("dst", "dst", "nonzero_dtype"),
        ("shape", "dst", "shape"),
        ("padding_val", "padding_val", None),
        ("unwritten", "src", "uninitialized_read"),
    ],
)
def test_nonzero_with_count_rules_name_the_argument_at_the_kernels_line(case, arg, rule):
    def f(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        if case != "unwritten":
            nisa.dma_copy(dst=t, src=x)
        b = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=b, value=1.0)
        d = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.int32, buffer=nl.sbuf)
        df = nl.ndarray((x.shape[0], x.shape[1] + 1), dtype=nl.float32, buffer=nl.sbuf)
        src, dst, pad = t, d, -1
        if case == "src":
            src = b
        elif case == "dst":
            dst = df
        elif case == "shape":
            dst = d[:, : x.shape[1]]
        elif case == "padding_val":
            pad = 2**40
        nisa.nonzero_with_count(dst=dst, src=src, padding_val=pad)  # the call
        return x

    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), np.ones((32, 8), np.float32))
    assert e.value.arg == arg and e.value.rule == rule, str(e.value)
    assert e.value.nki_location == (__file__, _line_of(f, "# the call"))


def _cumulative_ref(x, op0, imm0, op1, init):
    """The documented pseudocode, per partition, in float32: reg = op1(op0(x[i], imm0), reg)."""
    out = np.empty(x.shape, np.float32)
    for p in range(x.shape[0]):
        reg = np.float32(init[p])
        for i in range(x.shape[1]):
            reg = np.float32(op1(np.float32(op0(np.float32(x[p, i]), np.float32(imm0[p]))), reg))
            out[p, i] = reg
    return out


def test_tensor_scalar_cumulative_follows_the_documented_pseudocode():
    # A running sum split over two calls (reset_reduce, then reduce continues the register),
    # a per-partition imm0 tile, load_reduce from an imm1 tile, subtract's literal operand
    # order (op0(x) - reg), bf16 in and out; NaN and infinities carried along.
    rng = np.random.default_rng(3)
    p, n = 24, 40
    x = np.round(rng.uniform(-4, 4, (p, n)) * 4).astype(ml_dtypes.bfloat16)
    x[1, 3], x[2, 5], x[3, 0] = np.nan, np.inf, -np.inf
    scale = rng.uniform(0.5, 2, (p, 1)).astype(np.float32)
    init = rng.uniform(-8, 8, (p, 1)).astype(np.float32)

    @tn.jit
    def k(x, scale, init):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        s = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s[:, 0:1], src=scale)
        nisa.dma_copy(dst=s[:, 1:2], src=init)
        h = x.shape[1] // 2
        a = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(
            dst=a[:, :h], src=t[:, :h], op0=nl.multiply, op1=nl.add, imm0=s[:, 0:1]
        )
        nisa.tensor_scalar_cumulative(
            dst=a[:, h:],
            src=t[:, h:],
            op0=nl.multiply,
            op1=nl.add,
            imm0=s[:, 0:1],
            reduce_cmd=nisa.reduce_cmd.reduce,
        )
        b = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(
            b, t, nl.add, nl.subtract, 1.0, s[:, 1:2], nisa.reduce_cmd.load_reduce
        )
        oa = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=oa, src=a)
        ob = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=ob, src=b)
        return oa, ob

    res = tn.run(k, x, scale, init)
    a, b = res.outputs
    want_a = _cumulative_ref(x, np.multiply, scale[:, 0], np.add, np.zeros(p))
    want_b = _cumulative_ref(x, np.add, np.ones(p), np.subtract, init[:, 0])
    with np.errstate(invalid="ignore"):
        assert np.array_equal(a, want_a, equal_nan=True)
        assert np.array_equal(
            b.astype(np.float32),
            want_b.astype(ml_dtypes.bfloat16).astype(np.float32),
            equal_nan=True,
        )
    assert res.report.opcodes["tensor_scalar_cumulative"] == 3


@pytest.mark.parametrize(
    "case, arg, rule",
    [
        ("op1", "op1", None),
        ("reduce_cmd", "reduce_cmd", None),
        ("imm1", "imm1", None),
        ("dst", "dst", "cumulative_dtype"),
        ("imm0", "imm0", "fp32_operand"),
    ],
)
def test_tensor_scalar_cumulative_rules_name_the_argument_at_the_kernels_line(case, arg, rule):
    def f(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        i = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
        b16 = nl.ndarray((x.shape[0], 1), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(dst=b16, value=1.0)
        kw = dict(dst=t, src=t, op0=nl.add, op1=nl.add, imm0=1.0)
        if case == "op1":
            kw["op1"] = nl.divide
        elif case == "reduce_cmd":
            kw["reduce_cmd"] = nisa.reduce_cmd.idle
        elif case == "imm1":
            kw["reduce_cmd"] = nisa.reduce_cmd.load_reduce
        elif case == "dst":
            kw["dst"] = i
        else:
            kw["imm0"] = b16
        nisa.tensor_scalar_cumulative(**kw)  # the call
        return x

    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), np.ones((8, 4), np.float32))
    assert e.value.arg == arg and e.value.rule == rule, str(e.value)
    assert e.value.nki_location == (__file__, _line_of(f, "# the call"))


def _to_sbuf(*arrays):
    """Inside a current-dialect kernel: each input copied into a new SBUF tile."""
    tiles = [nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf) for a in arrays]
    for t, a in zip(tiles, arrays, strict=True):
        nisa.dma_copy(dst=t, src=a)
    return tiles


def _to_hbm(*tiles):
    """Inside a current-dialect kernel: each tile copied into a new shared-HBM output."""
    outs = [nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm) for t in tiles]
    for o, t in zip(outs, tiles, strict=True):
        nisa.dma_copy(dst=o, src=t)
    return tuple(outs)


def _refused_at_the_call(f, x, arg, rule):
    """Runs ``f`` as a kernel on ``x``: a Trn2Error naming ``arg`` and ``rule`` (None: no engine
    rule) at the line of ``f`` marked ``# the call``."""
    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), x)
    assert e.value.arg == arg and e.value.rule == rule, str(e.value)
    assert e.value.nki_location == (__file__, _line_of(f, "# the call"))


@pytest.mark.parametrize(
    "op, tiles, kw",
    [
        ("exponential", ("src",), dict(max_value=0.5)),
        ("activate2", ("data",), dict(op=nl.relu, imm0=1, imm1=0, op0=nl.multiply, op1=nl.add)),
        ("nc_matmul_mx", ("stationary", "moving", "stationary_scale", "moving_scale"), {}),
        ("quantize_mx", ("src", "dst_scale"), {}),
        ("rand2", (), dict(min=0.0, max=1.0)),
    ],
)
def test_neuron_core_v4_instructions_are_refused_at_the_kernels_line(op, tiles, kw):
    # "Available only on NeuronCore-v4 and newer" (the NKI API docs): a Trainium2 kernel that
    # calls them is one the compiler refuses. exponential's and activate2's semantics are in
    # the core all the same (machine/isa reduce.rs and scalar.rs test them against their
    # oracles); the MX instructions and rand2 are rows only.
    def f(x):
        (t,) = _to_sbuf(x)
        getattr(nisa, op)(dst=t, **dict.fromkeys(tiles, t), **kw)  # the call
        return x

    _refused_at_the_call(f, np.ones((8, 4), np.float32), op, "neuron_core_v4")


def _dropout_ref(x, prob, seed):
    """Our stream (docs/machine.md): element k dropped (+0 bits) when word k of the seeded
    generator, seed = the instruction's index in the program, is below prob * 2^32."""
    words = trn2core._core.stochastic_bits(x.size, seed).reshape(x.shape)
    drop = words.astype(np.float64) < np.asarray(prob, np.float64) * 2.0**32
    return np.where(drop, np.zeros((), x.dtype), x), drop


def test_dropout_in_both_dialects_follows_the_documented_stream():
    # The documentation's examples: a [128, 512] tile with per-partition probabilities (here 0,
    # 1 and spread values), and a scalar 0.2; int32 bits above 2^24, NaN payloads, -0 and inf
    # kept as bits; a float32 -> bf16 legacy result; the same program drops the same elements.
    rng = np.random.default_rng(7)
    x = rng.uniform(-100, 100, (128, 512)).astype(np.float32)
    x[2, :4] = [np.nan, -0.0, np.inf, -np.inf]
    x[2, 4] = np.uint32(0x7FC01234).view(np.float32)
    prob = rng.uniform(0, 1, (128, 1)).astype(np.float32)
    prob[0, 0], prob[1, 0], prob[2, 0] = 0.0, 1.0, 0.0
    ints = rng.integers(-(2**31), 2**31, (128, 512), dtype=np.int64).astype(np.int32)

    @tn.jit
    def cur(x, prob):
        t, q = _to_sbuf(x, prob)
        nisa.dropout(dst=t, data=t, prob=q)  # the third instruction: seed 2
        return _to_hbm(t)[0]

    @tn.jit_legacy
    def legacy(x):
        b = lisa.dropout(lnl.load(x), prob=0.2, dtype=lnl.bfloat16)  # seed 1
        out = lnl.ndarray(x.shape, dtype=lnl.bfloat16, buffer=lnl.shared_hbm)
        lnl.store(out, value=b)
        return out

    for data in (x, ints):
        want, drop = _dropout_ref(data, prob, 2)
        got = tn.run(cur, data, prob).outputs
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert not drop[0].any() and drop[1].all()
        assert abs(drop.mean() - prob.mean()) < 0.01
    assert np.array_equal(tn.run(cur, ints, prob).outputs, got)
    want, drop = _dropout_ref(x, 0.2, 1)
    got = tn.run(legacy, x).outputs
    assert np.array_equal(got.view(np.uint16), want.astype(BF16).view(np.uint16))
    assert abs(drop.mean() - 0.2) < 0.01


def _seeded_words(seed, start, n):
    """Words start .. start + n of the stream set_rng_seed(seed) starts (docs/machine.md): the
    generator for 2^32 + seed."""
    return trn2core._core.stochastic_bits(start + n, 2**32 + seed)[start:]


def test_set_rng_seed_makes_the_dropouts_after_it_a_stream_of_the_seed():
    """The reference flash attention's dropout: nl.random_seed(seed) then nl.dropout(x, rate),
    in a forward kernel and again in the backward one, must drop the same elements. After
    set_rng_seed(v) the dropouts draw the words of the stream for 2^32 + v in order, whatever
    their instruction's index; the same seed again restarts it."""
    rng = np.random.default_rng(11)
    x = rng.uniform(1, 2, (128, 64)).astype(np.float32)
    prob = np.full((128, 1), 0.25, np.float32)

    @tn.jit
    def cur(x, prob, seed):
        t, q, s = _to_sbuf(x, prob, seed)
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        c = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.set_rng_seed(s)
        nisa.dropout(dst=a, data=t, prob=q)  # words 0 .. 8191
        nisa.dropout(dst=b, data=t, prob=0.25)  # words 8192 ..
        nisa.set_rng_seed(src_seeds=s)
        nisa.dropout(dst=c, data=t, prob=q)  # words 0 .. again
        return _to_hbm(a, b, c)

    @tn.jit_legacy
    def legacy(x, seed):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        z = lnl.zeros((128, 1), dtype=lnl.float32, buffer=lnl.sbuf)  # shifts the indices
        lnl.store(out[:, 0:1], value=z)
        lnl.random_seed(seed=lnl.add(lnl.load(seed), 0))  # a [1, 1] tile, as flash_attn_bwd
        lnl.store(out, value=lnl.dropout(t, rate=0.25))
        return out

    @tn.jit
    def words(seed):
        (s,) = _to_sbuf(seed)
        w = nl.ndarray((4, 8), dtype=nl.uint32, buffer=nl.sbuf)
        h = nl.ndarray((2, 8), dtype=nl.int16, buffer=nl.sbuf)
        nisa.set_rng_seed(s)
        nisa.rng(dst=w)  # words 0 .. 31
        nisa.rng(h, engine=nisa.vector_engine)  # words 32 .. 47, their low 16 bits
        return _to_hbm(w, h)

    w, h = tn.run(words, np.array([[99]], np.int32)).outputs
    assert np.array_equal(w.reshape(-1), _seeded_words(99, 0, 32))
    assert np.array_equal(h.reshape(-1), _seeded_words(99, 32, 16).astype(np.uint16).view(np.int16))

    @tn.jit_legacy
    def uniform(x):  # nl.rand: 16 random bits times 1/65535 in float32
        out = lnl.ndarray((64, 100), dtype=lnl.float32, buffer=lnl.shared_hbm)
        lnl.random_seed(99)
        lnl.store(out, value=lnl.rand((64, 100)))
        return out

    u = uniform(np.ones((2, 2), np.float32))
    lo16 = _seeded_words(99, 0, 6400).astype(np.uint16).astype(np.float32).reshape(64, 100)
    assert np.array_equal(u, lo16 * np.float32(1 / 65535))
    assert u.min() >= 0 and u.max() <= 1 and abs(u.mean() - 0.5) < 0.02

    @tn.jit_legacy
    def in_order(x):  # a dropout not yet placed, then rand: the dropout draws first
        out = lnl.ndarray((2, 64, 100), dtype=lnl.float32, buffer=lnl.shared_hbm)
        lnl.random_seed(99)
        d = lnl.dropout(lnl.load(x), rate=0.5)
        r = lnl.rand((64, 100))
        lnl.store(out[0], value=d)
        lnl.store(out[1], value=r)
        return out

    d, r = in_order(np.ones((64, 100), np.float32))
    assert np.array_equal(d, np.where(_seeded_words(99, 0, 6400) < 2**31, 0, 1).reshape(64, 100))
    lo16 = _seeded_words(99, 6400, 6400).astype(np.uint16).astype(np.float32).reshape(64, 100)
    assert np.array_equal(r, lo16 * np.float32(1 / 65535))

    seed = np.array([[0x8000_0001]], np.uint32)
    a, b, c = tn.run(cur, x, prob, seed).outputs
    for got, start in ((a, 0), (b, x.size), (c, 0)):
        drop = _seeded_words(0x8000_0001, start, x.size).reshape(x.shape) < 0.25 * 2**32
        assert np.array_equal(got, np.where(drop, np.float32(0), x))
    assert not np.array_equal(a, b) and np.array_equal(a, c)
    assert abs((a == 0).mean() - 0.25) < 0.02
    # (the legacy kernel adds 0 on the Vector engine, in float32: a seed below 2^24 keeps)
    a2 = tn.run(cur, x, prob, np.array([[12345]], np.uint32)).outputs[0]
    got = tn.run(legacy, x, np.array([[12345]], np.int32)).outputs
    assert np.array_equal(got, a2), "the same seed, another kernel: the same elements dropped"
    assert not np.array_equal(a2, a)

    @tn.jit_legacy
    def by_int(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.random_seed(0xFFFF_FFFF)  # an integer seed, the largest
        lnl.store(out, value=lnl.dropout(lnl.load(x), rate=0.5))
        return out

    drop = _seeded_words(0xFFFF_FFFF, 0, x.size).reshape(x.shape) < 0.5 * 2**32
    assert np.array_equal(by_int(x), np.where(drop, np.float32(0), x))


@pytest.mark.parametrize(
    "seed, text",
    [
        (np.zeros((1, 1), np.float16), "src_seeds is fp16; the seed is a 32-bit value"),
        (np.zeros((1, 2), np.int32), r"src_seeds is \[1, 2\]; the seed is a \[1, 1\] tensor"),
        (np.zeros((2, 1), np.int32), r"src_seeds is \[2, 1\]; the seed is a \[1, 1\] tensor"),
    ],
)
def test_set_rng_seed_refuses_what_its_docs_rule_out(seed, text):
    def f(seed):
        (s,) = _to_sbuf(seed)
        nisa.set_rng_seed(s)  # the call
        return seed

    with pytest.raises(Trn2Error, match=text) as e:
        tn.run(tn.jit(f), seed)
    assert e.value.arg == "src_seeds"
    assert str(e.value).startswith(f"{__file__}:{_line_of(f, '# the call')}:")

    def big(x):
        lnl.random_seed(2**32)  # SEED
        return x

    with pytest.raises(Trn2Error, match="seed: 4294967296 is not a 32-bit value") as e:
        tn.run(tn.jit_legacy(big), np.ones((2, 2), np.float32))
    assert str(e.value).startswith(f"{__file__}:{_line_of(big, '# SEED')}:")


def _xorwow(state, n):
    """n words of Marsaglia's XORWOW from ``state`` [x, y, z, w, v, d] (Python integers, an
    oracle apart from the core's), and the state after them."""
    m = 0xFFFFFFFF
    x, y, z, w, v, d = (int(s) for s in state)
    out = []
    for _ in range(n):
        t = x ^ (x >> 2)
        x, y, z, w = y, z, w, v
        v = (v ^ ((v << 4) & m)) ^ (t ^ ((t << 1) & m))
        d = (d + 362437) & m
        out.append((v + d) & m)
    return out, [x, y, z, w, v, d]


def test_rand_set_state_seeds_each_gpsimd_lane_that_rng_draws_and_rand_get_state_stores():
    seeds = np.random.default_rng(9).integers(0, 2**32, size=(32, 6), dtype=np.uint32)

    def f(seeds):
        (s,) = _to_sbuf(seeds)
        nisa.rand_set_state(s, engine=nisa.engine.gpsimd)
        r = nl.ndarray((32, 5), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rng(r, engine=nisa.engine.gpsimd)
        b = nl.ndarray((32, 3), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.rng(dst=b, engine=nisa.engine.gpsimd)
        st = nl.ndarray((32, 6), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(st)  # GpSimd by default
        return _to_hbm(r, b, st)

    r, b, st = tn.run(tn.jit(f), seeds).outputs
    for p in range(32):
        words, after = _xorwow(seeds[p], 8)
        assert r[p].tolist() == words[:5], p
        assert b[p].tolist() == [w & 0xFF for w in words[5:]], p
        assert st[p].tolist() == after, p


@pytest.mark.parametrize(
    "call, arg, text",
    [
        ("set_vector", "engine", "rand_set_state on the Vector engine is NeuronCore-v4"),
        ("get_unseeded", "dst", "GpSimd lane 0 .* was never seeded by rand_set_state"),
        ("set_int32", "src_seeds", "src_seeds is int32; the PRNG state is uint32 words"),
        ("set_five", "src_seeds", "src_seeds has 5 elements per partition"),
    ],
)
def test_rand_state_refuses_what_its_docs_rule_out(call, arg, text):
    def f(x):
        seeds = {
            "set_int32": nl.ndarray((32, 6), dtype=nl.int32, buffer=nl.sbuf),
            "set_five": nl.ndarray((32, 5), dtype=nl.uint32, buffer=nl.sbuf),
        }.get(call, nl.ndarray((32, 6), dtype=nl.uint32, buffer=nl.sbuf))
        nisa.memset(dst=seeds, value=1)
        engine = nisa.engine.vector if call == "set_vector" else nisa.engine.gpsimd
        if call == "get_unseeded":
            nisa.rand_get_state(dst=seeds)  # GET
        else:
            nisa.rand_set_state(src_seeds=seeds, engine=engine)  # SET
        return x

    with pytest.raises(Trn2Error, match=text) as e:
        tn.run(tn.jit(f), np.ones((2, 2), np.float32))
    assert e.value.arg == arg
    marker = "# GET" if call == "get_unseeded" else "# SET"
    assert str(e.value).startswith(f"{__file__}:{_line_of(f, marker)}:")


# (instruction, what replaces its arguments, the argument named, the rule): the values are
# names the kernel resolves ("col": a [P, 2] bf16 tile, "col0" its first column, "fcol"/"fcol0"
# the same in float32, "u32"/"f32" tiles of the data's shape, "narrow" two columns of it).
_ISA_RULE_CASES = [
    ("tensor_tensor", {"op": nl.average}, "op", None),
    ("dropout", {"dst": "f32"}, "dst", "dropout_dtype"),
    ("dropout", {"prob": "col0"}, "prob", "dropout_dtype"),
    ("dropout", {"prob": 1.5}, "prob", None),
    ("dropout", {"prob": "fcol"}, "prob", "shape"),
    ("dropout", {"dst": "narrow"}, "dst", "shape"),
]


@pytest.mark.parametrize("op, change, arg, rule", _ISA_RULE_CASES)
def test_new_isa_rules_name_the_argument_at_the_kernels_line(op, change, arg, rule):
    x = np.ones((8, 4), np.int32)

    def f(x):
        (t,) = _to_sbuf(x)
        tiles = {"narrow": t[:, 0:2]}
        for name, dt in (("col", nl.bfloat16), ("fcol", nl.float32), ("icol", nl.int32)):
            tiles[name] = nl.ndarray((x.shape[0], 2), dtype=dt, buffer=nl.sbuf)
            nisa.memset(dst=tiles[name], value=0.5)
            tiles[name + "0"] = tiles[name][:, 0:1]
        for name, dt in (("u32", nl.uint32), ("f32", nl.float32)):
            tiles[name] = nl.ndarray(x.shape, dtype=dt, buffer=nl.sbuf)
        cmds = {c: getattr(nisa.reduce_cmd, c) for c in ("reset", "reduce", "load_reduce")}
        kw = {
            "dropout": dict(data=t, prob=0.5),
            "tensor_tensor": dict(data1=t, data2=t),
        }[op]
        kw["dst"] = t
        for k, v in change.items():
            kw[k] = tiles.get(v, cmds.get(v, v)) if isinstance(v, str) else v
        getattr(nisa, op)(**kw)  # the call
        return x

    _refused_at_the_call(f, x, arg, rule)


def test_the_machine_views_and_nki_isa_carry_every_table_instruction():
    table = trn2core._core.instruction_table()
    core = trn2core.NeuronCore()
    views = {"vector": core.vector, "scalar": core.scalar, "gpsimd": core.gpsimd}
    for name, engines, *_ in table:
        assert callable(getattr(nisa, name)), name
        for e in engines:
            if e in views:
                assert callable(getattr(views[e], name)), (e, name)
    a = core.tile((2, 16), "fp32")
    core.write(a, np.arange(32, dtype=np.float32).reshape(2, 16))
    r = core.tile((2, 16), "fp32")
    core.vector.nc_transpose(r[:, :2], a[:, :2])  # no hand-written form: the table's view
    assert np.array_equal(core.read(r[:, :2]), np.array([[0, 16], [1, 17]], np.float32))
    top = core.tile((2, 8), "fp32")
    core.vector.max8(top, a)
    assert np.array_equal(core.read(top), np.arange(32, dtype=np.float32).reshape(2, 16)[:, :7:-1])


def test_every_table_instruction_exists_in_both_dialects():
    # A row without a hand-written legacy form and with a result of its own rule still has a
    # name in neuronxcc.nki.isa (NotSupportedError on use), never an AttributeError.
    for name, *_ in trn2core._core.instruction_table():
        assert callable(getattr(nisa, name)) and callable(getattr(lisa, name)), name


def test_a_launch_checks_the_host_before_copying_its_inputs(host_limited):
    # Issue 28: a launch converted and copied its inputs before any host check. A broadcast
    # view of 2**31 float16 elements (no memory behind it) must be refused naming the
    # argument, before the float32 -> bf16 conversion or the device copy is made.
    out = host_limited(
        "import time, ml_dtypes, trn2core.nki as tn\n"
        "nl = tn.language\n"
        "def k(x):\n"
        "    return x\n"
        "big = np.broadcast_to(np.float16(1), (1 << 21, 1024))\n"
        "t0 = time.perf_counter()",
        "tn.run(k, big)",
        "print('seconds', time.perf_counter() - t0 < 1.0)",
    )
    # 4 GiB held: its contiguous copy, the device copy and two read-backs.
    assert out.startswith("refused x: the kernel's inputs (17179869184 B (16 GiB)"), out
    assert out.endswith("seconds True\n"), out


def test_byte_swapped_arrays_are_inputs_and_take_their_results_back():
    # Issue 28: a launch refused a big-endian array ("constant: >f4 is not an NKI dtype").
    x = np.arange(8, dtype=">f4").reshape(2, 4)

    @tn.jit
    def neg(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.negative(nl.load(x)))
        nl.store(x, value=nl.load(out))
        return out

    out = neg(x)
    want = -np.arange(8, dtype=np.float32).reshape(2, 4)
    assert out.dtype == np.float32 and np.array_equal(out, want)
    assert x.dtype == np.dtype(">f4") and np.array_equal(x, want)


# ----------------------------------------------------------------------------- dynamic copies


def _dyn_data(p=16, n=64):
    """A float32 [p, n] tile whose bits name their place (NaN payloads, -0 and inf among them)
    and the offsets the dynamic copies read (int32, in a [1, 8] row)."""
    x = (np.arange(p * n, dtype=np.uint32) | 0x7FC0_0000).view(np.float32).reshape(p, n)
    x[0, :3] = [-0.0, np.inf, 1.5]
    return x, np.array([[5, 0, 63, 7, 7, 31, 2, 60]], np.int32)


def _legacy_dyn_kernel(shape, body, make=lnl.ndarray):
    """A legacy kernel: ``x`` and ``offs`` loaded, ``body(t, o, out)`` on a new SBUF tile of
    ``shape`` (made by ``make``), stored to HBM."""

    @tn.jit_legacy
    def k(x, offs):
        t, o = lnl.load(x), lnl.load(offs)
        out = make(shape, dtype=x.dtype, buffer=lnl.sbuf)
        body(t, o, out)
        res = lnl.ndarray(shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(res, value=out)
        return res

    return k


def test_tensor_copy_dynamic_src_and_dst_in_the_legacy_dialect_match_numpy():
    x, offs = _dyn_data()
    x3 = np.arange(16 * 12 * 4, dtype=np.int32).reshape(16, 12, 4)

    def gather_body(t, o, out):
        ix, iy = lnl.mgrid[0:16, 0:1]
        for i in lnl.affine_range(8):
            out[ix, i] = lisa.tensor_copy_dynamic_src(t[ix, o[0, i] + iy])

    def gather3_body(t, o, out):
        ix, _, iz = lnl.mgrid[0:16, 0:1, 0:4]
        for i in lnl.affine_range(4):
            e = lisa.gpsimd_engine
            out[ix, i, iz] = lisa.tensor_copy_dynamic_src(t[ix, o[0, i], iz], engine=e)

    def scatter_body(t, o, out):
        ix, iy = lnl.mgrid[0:16, 0:1]
        for i in lnl.sequential_range(8):
            e = lisa.scalar_engine
            lisa.tensor_copy_dynamic_dst(dst=out[ix, o[0, i] + iy], src=t[ix, i], engine=e)

    gather = _legacy_dyn_kernel((16, 8), gather_body)
    gather3 = _legacy_dyn_kernel((16, 4, 4), gather3_body)
    scatter = _legacy_dyn_kernel((16, 64), scatter_body, lnl.zeros)
    got = tn.run(gather, x, offs).outputs
    assert np.array_equal(got.view(np.uint32), x[:, offs[0]].view(np.uint32))
    three = offs[:, [0, 1, 3, 6]]
    assert np.array_equal(tn.run(gather3, x3, three).outputs, x3[:, three[0], :])
    want = np.zeros_like(x)
    for i, o in enumerate(offs[0]):
        want[:, o] = x[:, i]  # in order: the later copy wins (offset 7 twice)
    got = tn.run(scatter, x, offs).outputs
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_tensor_copy_dynamic_in_the_current_dialect_matches_numpy_and_costs_min_ii_dynamic():
    x, offs = _dyn_data()
    xb = x.astype(BF16)
    offs = np.array([[5, 0, 60, 33]], np.int32)

    @tn.jit
    def windows(x, offs):
        t, o = _to_sbuf(x, offs)
        out = nl.ndarray((16, 4, 4), dtype=x.dtype, buffer=nl.sbuf)
        for i in range(4):
            src = t.ap([[64, 16], [1, 4]], offset=0, scalar_offset=o[0, i], indirect_dim=1)
            nisa.tensor_copy_dynamic_src(dst=out[:, i, :], src=src)
        return _to_hbm(out)[0]

    @tn.jit
    def scatter(x, offs):
        t, o = _to_sbuf(x, offs)
        out = nl.ndarray((16, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=out, value=0.0)
        for i in range(4):
            nisa.tensor_copy_dynamic_dst(
                dst=out[:, o[0, i]], src=t[:, i], engine=nisa.gpsimd_engine
            )
        return _to_hbm(out)[0]

    for data in (x, xb):
        res = tn.run(windows, data, offs)
        want = np.stack([data[:, o : o + 4] for o in offs[0]], axis=1)
        assert np.array_equal(res.outputs.view(np.uint8), want.view(np.uint8))
        # Four copies on the Vector engine: max(MIN_II_DYNAMIC, 4) + 60 cycles each at 0.96 GHz.
        assert res.report.engines["DVE"]["busy_s"] == pytest.approx(4 * 660 / 0.96e9)
        want = np.zeros_like(data)
        want[:, offs[0]] = data[:, :4]
        got = tn.run(scatter, data, offs).outputs
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_a_dynamic_view_read_by_another_instruction_reads_its_offset_when_issued():
    x, offs = _dyn_data()

    @tn.jit
    def k(x, offs):
        t, o = _to_sbuf(x, offs)
        out = nl.ndarray((16, 2), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(
            dst=out, src=t.ap([[64, 16], [1, 2]], scalar_offset=o[0, 3], indirect_dim=1)
        )
        return _to_hbm(out)[0]

    got = tn.run(k, x, offs).outputs
    assert np.array_equal(got.view(np.uint32), x[:, 7:9].view(np.uint32))


# (what the kernel does wrong, the offsets, the argument named, the rule)
_DYN_CASES = [
    ("src past the axis", [[61]], "src", "dynamic_offset"),
    ("dst negative", [[-1]], "dst", "dynamic_offset"),
    ("float offset", [[1]], "offset", "dynamic_offset"),
    ("static src", [[1]], "src", None),
]


@pytest.mark.parametrize("case, offs, arg, rule", _DYN_CASES)
def test_tensor_copy_dynamic_rules_name_the_argument_at_the_kernels_line(case, offs, arg, rule):
    x = np.ones((8, 64), np.float32)
    offs = np.array(offs, np.float32 if case == "float offset" else np.int32)

    def f(x, offs):
        t, o = _to_sbuf(x, offs)
        out = nl.ndarray((8, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=out, value=0.0)
        dst, src, op = out, t.ap([[64, 8], [1, 4]], scalar_offset=o[0, 0], indirect_dim=1), "src"
        if case == "dst negative":
            dst, src, op = t[:, o[0, 0]], out[:, 0:1], "dst"
        elif case == "static src":
            src = t[:, 0:4]
        getattr(nisa, f"tensor_copy_dynamic_{op}")(dst=dst, src=src)  # the call
        return _to_hbm(out)[0]

    with pytest.raises(Trn2Error) as e:
        tn.run(tn.jit(f), x, offs)
    assert (e.value.arg, e.value.rule) == (arg, rule), str(e.value)
    assert e.value.nki_location == (__file__, _line_of(f, "# the call"))
    assert str(e.value).startswith(f"{__file__}:{_line_of(f, '# the call')}:")


def test_a_legacy_dynamic_index_past_its_axis_is_refused_at_the_kernels_line():
    x, _ = _dyn_data()

    def f(x, offs):
        t, o = lnl.load(x), lnl.load(offs)
        ix, iy = lnl.mgrid[0:16, 0:4]
        y = lisa.tensor_copy_dynamic_src(t[ix, o[0, 0] + iy])  # the call
        res = lnl.ndarray((16, 4), dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(res, value=y)
        return res

    got = tn.run(tn.jit_legacy(f), x, np.array([[60]], np.int32)).outputs
    assert np.array_equal(got.view(np.uint32), x[:, 60:].view(np.uint32))
    with pytest.raises(ShapeError) as e:
        tn.run(tn.jit_legacy(f), x, np.array([[61]], np.int32))
    assert (e.value.arg, e.value.rule) == ("src", "dynamic_offset"), str(e.value)
    assert "must be in 0..61" in str(e.value)
    assert e.value.nki_location == (__file__, _line_of(f, "# the call"))


# ------------------------------------------- tensor_tensor waiting behind queued matmuls


def _chains_then_adds(n: int, k: int = 2):
    """A kernel: n chains of k matmuls, each into a fresh PSUM tile and added into an SBUF
    accumulator (the blocked-matmul idiom: the additions wait behind the queued matmuls)."""

    def kern(a, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, k, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, k, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        nisa.dma_copy(dst=y, src=b)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for _ in range(n):
            p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for j in range(k):
                nisa.nc_matmul(dst=p, stationary=x[:, j, :], moving=y[:, j, :])
            nisa.tensor_tensor(dst=acc, data1=acc, data2=p, op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    return kern


def test_additions_waiting_behind_queued_matmuls_give_the_sums_of_one_at_a_time():
    # 100 additions: more than wait at once (64), eight PSUM banks reused many times.
    rng = np.random.default_rng(5)
    a = rng.standard_normal((128, 2, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((128, 2, 512), dtype=np.float32).astype(ml_dtypes.bfloat16)
    out = tn.run(tn.jit(_chains_then_adds(100)), a, b).outputs
    # One chain: K = 256 in two tiles of 128 (the stationary tiles are lhsT's K rows).
    lhs = np.concatenate([a[:, 0, :], a[:, 1, :]], axis=0).T
    part = trn2core.gemm(np.ascontiguousarray(lhs), np.concatenate([b[:, 0], b[:, 1]])).out
    want = np.zeros((128, 512), np.float32)
    for _ in range(100):
        want = want + part
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_a_waiting_addition_is_checked_at_its_own_line():
    def kernel(acc_cols, mm_cols):
        def k(a, b):
            out = nl.ndarray((128, acc_cols), dtype=nl.float32, buffer=nl.shared_hbm)
            x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
            y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.dma_copy(dst=x, src=a)
            nisa.dma_copy(dst=y, src=b)
            acc = nl.ndarray((128, acc_cols), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=p[:, 0:mm_cols], stationary=x, moving=y[:, 0:mm_cols])
            nisa.tensor_tensor(dst=acc, data1=acc, data2=p, op=nl.add)  # add
            nisa.dma_copy(dst=out, src=acc)
            return out

        return k

    a = np.ones((128, 128), ml_dtypes.bfloat16)
    b = np.ones((128, 512), ml_dtypes.bfloat16)
    shape = "data2: tensor_tensor needs the same"
    _raises_at(ShapeError, kernel(256, 512), "# add", shape, a, b)
    e = _raises_at(tn.UninitializedReadError, kernel(512, 256), "# add", "data2", a, b)
    assert "psum" in str(e) and "address 1024" in str(e), str(e)


def test_a_launch_leaves_no_cycle_keeping_its_tensors_and_cores_alive():
    # A reference cycle through a kernel argument kept each launch's core (and its 24 MiB of
    # SBUF) alive until a garbage-collector pass, which then freed them inside a later call.
    import gc

    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.reshape(a.shape)[:, :])
        nisa.dma_copy(dst=out, src=t)
        return out

    a = np.ones((128, 64), np.float32)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.garbage.clear()
        for _ in range(3):
            assert np.array_equal(tn.run(tn.jit(k), a).outputs, a)
        gc.collect()
        kept = {type(x).__name__ for x in gc.garbage} & {"NkiTensor", "Core", "Machine"}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not kept, kept


def test_large_copies_between_memories_keep_every_byte_in_place():
    """dma_copy of 2 MiB between HBM and SBUF (run by run, no staged tile) and one into every
    other column of an SBUF tile: the bytes land where numpy's slicing puts them."""
    x = np.random.default_rng(5).standard_normal((128, 4096)).astype(np.float32)

    def k(x):
        t = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((2, 128, 4096), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[0], src=t)
        u = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=u, value=0.0)
        nisa.dma_copy(dst=u[:, 0:4096:2], src=x[:, 0:2048])
        nisa.dma_copy(dst=out[1], src=u)
        return out

    got = tn.run(tn.jit(k), x).outputs
    assert got[0].tobytes() == x.tobytes()
    want = np.zeros_like(x)
    want[:, 0::2] = x[:, :2048]
    assert got[1].tobytes() == want.tobytes()
