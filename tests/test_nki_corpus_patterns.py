"""Patterns that public NKI kernels (AWS's tutorials, nki-samples, nki-library) rely on, each in
a small kernel of our own, in both dialects where both have it (issue 26; the kernels
themselves are run by benches/nki_corpus.py from a local checkout). Also the front-end
argument errors of issue 28: a bad argument inside a kernel is a Trn2Error at its line."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import json
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
import trn2core.nki as tn
from kernel_lines import at as _at
from kernel_lines import line_of as _line_of
from trn2core import reference as ref
from trn2core.errors import CapacityError, FormatError, ShapeError, Trn2Error

nl, nisa = tn.language, tn.isa
lnl, lisa = tn.language_legacy, tn.isa_legacy


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-4, 4, shape).astype(np.float32)


# ----------------------------------------------------------------------------- names


def test_every_nki_dtype_name_exists_and_the_ones_trn2_lacks_fail_on_use():
    names = (
        "float8_e4m3fn",
        "float8_e8m0fnu",
        "float8_e5m2_x4",
        "float8_e4m3fn_x4",
        "float4_e2m1fn_x4",
    )
    dts = [getattr(nl, n) for n in names]
    assert len({str(d) for d in dts}) == len(dts)  # five distinct dtypes
    assert nl.float8_e4m3fn == np.dtype(ml_dtypes.float8_e4m3fn)
    assert all(getattr(lnl, n) == getattr(nl, n) for n in names)
    assert nl.bool == nl.bool_ and nl.range is range

    def k(x):
        t = nl.ndarray((128, 4), dtype=nl.float8_e4m3fn, buffer=nl.sbuf)  # e4m3fn
        return t

    with pytest.raises(FormatError, match="float8_e4m3fn.*not a Trainium2 dtype") as info:
        tn.run(tn.jit(k), np.ones((2, 2), np.float32))
    _at(info, k, "# e4m3fn")

    # nki-library's MX kernels (moe_cte's *_mx forms, NeuronCore-v4) stop so at their first
    # tile of an MX dtype (weights come in as uint32 and are only reinterpreted before).
    def mx(x):
        t = nl.ndarray((128, 2, 32), dtype=nl.float8_e4m3fn_x4)  # x4
        return t

    why = r"float8_e4m3fn_x4 \(MX, 4 packed\) is not a Trainium2 dtype \(NeuronCore-v4\)"
    with pytest.raises(FormatError, match=why) as info:
        tn.run(tn.jit(mx), np.ones((2, 2), np.float32))
    _at(info, mx, "# x4")


def test_import_surface_of_both_dialects_fails_only_on_use():
    mods = (
        "nki.isa.constants",
        "nki.collectives",
        "neuronxcc.nki.compiler",
        "neuronxcc.nki.isa.constants",
        "neuronxcc.nki.compiler.backends.neuron.dimensions",
    )
    with tn.install():
        import importlib

        for m in mods:
            importlib.import_module(m)
        import nki
        import nki.collectives as cc
        from neuronxcc import nki as legacy
        from neuronxcc.nki.compiler.backends.neuron.dimensions import VNC
        from nki.isa import NkiInstruction
        from nki.isa.constants import dge_mode, oob_mode

        assert nki.dtype is np.dtype and isinstance(nl.bfloat16, nki.dtype)
        assert oob_mode is nisa.oob_mode and dge_mode is nisa.dge_mode
        assert VNC(2) == 2 and VNC(2).nc
        # Package attributes without a submodule import, as kernels use them.
        ncc = legacy.compiler
        assert nki.language.add is nl.add and ncc.sbuf is not None

        @ncc.skip_middle_end_transformations
        def f(x):
            return x + 1

        @ncc.enable_stack_allocator(log_level=0)
        def g(x):
            return x * 2

        assert f(1) == 2 and g(2) == 4

        for use in (
            lambda: ncc.all_reduce(1),
            lambda: ncc.all_to_all(1),
            lambda: NkiInstruction.x,
        ):
            with pytest.raises(tn.NotSupportedError, match="not supported by trn2core"):
                use()
        assert ncc.sbuf.auto_alloc() is nl.sbuf and ncc.psum.auto_alloc() is nl.psum
        assert callable(cc.all_reduce) and callable(cc.all_to_all_v), "nki.collectives: emulated"

        # Compiler internals nki-samples' reference kernels import (the legacy tree): the
        # index type loop indices are annotated with, an element size, a tile class imported
        # unused, and a loop directive (a scheduling hint: iterations still run in order).
        from neuronxcc.nki.compiler.backends.neuron.indexing import TileIndex
        from neuronxcc.nki.compiler.backends.neuron.tensor import local_tile
        from neuronxcc.nki.language.constants import sizeinbytes

        assert isinstance(lnl.arange(4)[:, None], TileIndex)
        assert [sizeinbytes(d) for d in (np.float32, nl.bfloat16, nl.float8_e4m3)] == [4, 2, 1]
        with pytest.raises(tn.NotSupportedError, match="tensor.local_tile is not supported"):
            local_tile()
        assert repr(ncc.multi_buffer(4)) == "multi_buffer(4)"
        for bad in (0, 2.5, "4"):
            with pytest.raises(Trn2Error, match="buffers: expected an integer >= 1"):
                ncc.multi_buffer(bad)

        @tn.jit_legacy
        def k(x):
            out = lnl.ndarray((3, 128, 4), dtype=x.dtype, buffer=lnl.shared_hbm)
            for i in lnl.sequential_range(3, directives=ncc.multi_buffer(2)):
                lnl.store(out[i], value=lnl.load(x[i]))
            return out

        x = _rand(3, 128, 4)
        assert np.array_equal(k(x), x)


# ----------------------------------------------------------------------------- NKIObject


class _Tiling(nl.NKIObject):
    rows: int
    scale: float = 2.0

    def __post_init__(self):
        self.cols = self.rows * 4


@dataclasses.dataclass(frozen=True)
class _Frozen(nl.NKIObject):
    bias: float = 1.0
    use_bias: bool = True

    def __post_init__(self):
        if self.bias < 0:
            raise ValueError("negative bias")


@dataclasses.dataclass
class _Sections(nl.NKIObject):
    # Plain class attributes, no annotations: @dataclass alone would make an __init__ without
    # parameters; NKI builds every NKIObject alike (nki-library's attention_cte does this).
    index = None
    offset = 0

    def end(self, length):
        return self.offset + length


@dataclasses.dataclass(frozen=True)
class _Shape(nl.NKIObject):
    rows: int
    tags: list = dataclasses.field(default_factory=list)
    cols = 4


def test_nki_objects_take_their_fields_by_keyword_with_or_without_dataclass():
    s = _Sections(index=3, offset=512)
    assert (s.index, s.offset, s.end(128)) == (3, 512, 640)
    t = _Sections()
    assert (t.index, t.offset) == (None, 0)
    assert _Sections(7).index == 7
    with pytest.raises(Trn2Error, match="no field 'length'"):
        _Sections(length=1)
    a, b = _Shape(2), _Shape(rows=3, cols=8)
    assert (a.rows, a.tags, a.cols, b.rows, b.cols) == (2, [], 4, 3, 8)
    assert a.tags is not _Shape(2).tags  # a fresh default per instance
    assert _Shape().rows is None  # NKI's default for a field without one
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rows = 5

    @tn.jit
    def k(x, sec):
        out = nl.ndarray((8, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x[0:8, sec.offset : sec.end(4)]))
        return out

    x = _rand(8, 16)
    assert np.array_equal(tn.run(k, x, _Sections(index=1, offset=8)).outputs, x[:, 8:12])


def test_nki_object_configs_are_built_by_keyword_and_passed_into_kernels():
    cfg = _Tiling(rows=8)
    assert (cfg.rows, cfg.scale, cfg.cols) == (8, 2.0, 32)
    assert _Tiling(8, 3.0).scale == 3.0
    with pytest.raises(Trn2Error, match="no field 'colz'"):
        _Tiling(rows=8, colz=1)
    with pytest.raises(TypeError):  # rows defaults to None (NKI's rule): None * 4 fails
        _Tiling()
    with pytest.raises(ValueError, match="negative bias"):
        _Frozen(bias=-1.0)

    @tn.jit
    def k(x, cfg, fz):
        out = nl.ndarray((cfg.rows, cfg.cols), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x[0 : cfg.rows, 0 : cfg.cols])
        y = nl.multiply(t, cfg.scale)
        if fz.use_bias:
            y = nl.add(y, fz.bias)
        nl.store(out, value=y)
        return out

    x = _rand(16, 64)
    got = k(x, _Tiling(rows=8, scale=0.5), _Frozen(bias=3.0))
    assert np.array_equal(got, x[:8, :32] * np.float32(0.5) + np.float32(3.0))


# ----------------------------------------------------------------------------- indexing


def test_mgrid_result_has_p_x_y_z_and_unpacks():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((64, 24), dtype=x.dtype, buffer=lnl.shared_hbm)
        i = lnl.mgrid[0:64, 0:24]
        t = lnl.load(x[i.p, i.x + 8])
        lnl.store(out[i.p, i.x], value=t)
        return out

    x = _rand(64, 32)
    assert np.array_equal(k(x), x[:, 8:])
    g = lnl.mgrid[0:2, 0:3, 0:4, 0:5]
    assert (g.p.shape, g.z.shape) == ((2, 3, 4, 5), (2, 3, 4, 5))
    a, b, c, d = g
    assert a is g.p and b is g.x and c is g.y and d is g.z
    with pytest.raises(Trn2Error, match=r"\.y is axis 2 of a 2-D grid"):
        _ = lnl.mgrid[0:2, 0:3].y


def test_numpy_integers_work_where_python_ints_do():
    n = np.int32(64)

    @tn.jit_legacy
    def legacy(x):
        out = lnl.ndarray((n, np.int64(16)), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip = lnl.arange(np.int32(64))[:, None]
        jf = lnl.arange(np.int16(16))[None, :]
        i = lnl.mgrid[np.int32(0) : n, 0 : np.int64(16)]
        t = lnl.load(x[ip, jf + np.int32(4)])
        lnl.store(out[i.p, i.x], value=t)
        return out

    @tn.jit
    def current(x):
        out = nl.ndarray((n, 16), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((np.int64(64), np.int32(16)), dtype=x.dtype, buffer=nl.sbuf)
        for j in nl.affine_range(np.int32(2)):
            nisa.dma_copy(
                dst=t[:, nl.ds(j * np.int32(8), np.int32(8))],
                src=x[np.int32(0) : n, nl.ds(np.int64(4) + 8 * j, 8)],
            )
        nisa.dma_copy(dst=out, src=t)
        return out

    x = _rand(64, 32)
    assert np.array_equal(legacy(x), x[:, 4:20])
    assert np.array_equal(current(x), x[:, 4:20])


# ----------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("name", ["max", "min", "sum"])
def test_reductions_over_free_axes_that_are_not_the_last(name):
    @tn.jit
    def k(x):
        out = nl.ndarray((32, 5), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        r = getattr(nl, name)(t, axis=[1, 3])
        nisa.dma_copy(dst=out, src=r)
        return out

    x = np.round(_rand(32, 3, 5, 4) * 8)  # integers: sums exact in any order
    want = getattr(np, name)(x, axis=(1, 3))
    assert np.array_equal(k(x), want)


def test_legacy_pooling_by_index_expressions_reduces_axes_2_and_4():
    @tn.jit_legacy
    def avgpool(x):
        c, h, w = x.shape
        out = lnl.ndarray((c, h // 2, w // 2), dtype=x.dtype, buffer=lnl.shared_hbm)
        i0, i1, i2, i3, i4 = lnl.mgrid[0:c, 0 : h // 2, 0:2, 0 : w // 2, 0:2]
        t = lnl.load(x)
        s = lnl.sum(t[i0, 2 * i1 + i2, 2 * i3 + i4], axis=[2, 4])
        lnl.store(out, value=s * 0.25)
        return out

    x = np.round(_rand(16, 8, 12) * 4)
    want = x.reshape(16, 4, 2, 6, 2).sum(axis=(2, 4)) * np.float32(0.25)
    assert np.array_equal(avgpool(x), want)


def test_reduction_axes_are_checked():
    def k(x, axis):
        t = nl.load(x)
        return nl.sum(t, axis=axis)  # reduce

    for bad in (0, None, [0, 1], [1, 1], 7, "1"):
        with pytest.raises(ShapeError, match="free axes") as info:
            tn.run(tn.jit(k), np.ones((4, 8), np.float32), bad)
        _at(info, k, "# reduce")


def test_nl_reductions_and_numpy_functions_as_tensor_reduce_ops():
    @tn.jit
    def k(x):
        out = nl.ndarray((64, 3), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        r = nl.ndarray((64, 3), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=r[:, 0:1], op=nl.max, data=t, axis=1)
        nisa.tensor_reduce(dst=r[:, 1:2], op=nl.min, data=t, axis=(1,))
        nisa.tensor_reduce(dst=r[:, 2:3], op=np.max, data=t, axis=[np.int64(1)])
        nisa.dma_copy(dst=out, src=r)
        return out

    @tn.jit_legacy
    def legacy(x):
        out = lnl.ndarray((64, 1), dtype=x.dtype, buffer=lnl.shared_hbm)
        r = lisa.tensor_reduce(lnl.sum, lnl.load(x), axis=1)
        lnl.store(out, value=r)
        return out

    x = np.round(_rand(64, 40) * 4)
    want = np.stack([x.max(1), x.min(1), x.max(1)], axis=1)
    assert np.array_equal(k(x), want)
    assert np.array_equal(legacy(x), x.sum(1, keepdims=True))
    with pytest.raises(Trn2Error, match="mean is not an ALU operator"):
        tn.run(
            lambda x: nisa.tensor_reduce(dst=x, op=nl.mean, data=x, axis=1),
            np.ones((2, 2), np.float32),
        )


# ----------------------------------------------------------------------------- masks


def test_a_constant_bool_is_a_mask():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((32, 8), dtype=x.dtype, buffer=lnl.shared_hbm)
        t = lnl.load(x, mask=True)
        t[...] = lnl.multiply(t, 2.0, mask=np.bool_(True))
        t[...] = lnl.exp(t, mask=False)  # never: no instruction
        lnl.store(out, value=t, mask=True)
        return out

    x = _rand(32, 8)
    res = tn.run(k, x)
    assert np.array_equal(res.outputs, x * np.float32(2))
    assert "activation" not in res.report.opcodes


def test_a_constant_bool_joins_a_mask():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((32, 8), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, jf = lnl.arange(32)[:, None], lnl.arange(8)[None, :]
        t = lnl.load(x)
        lnl.store(out[ip, jf], value=t, mask=(jf < 8) & (2 * 3 < 7))
        lnl.store(out[ip, jf], value=lnl.multiply(t, 2.0), mask=(2 * 3 > 7) & (jf < 4))
        return out

    x = _rand(32, 8)
    assert np.array_equal(k(x), x)


# ----------------------------------------------------------------------------- math


def _unary_kernel(fn, dialect):
    lang = nl if dialect == "current" else lnl

    def k(x):
        out = lang.ndarray(x.shape, dtype=x.dtype, buffer=lang.shared_hbm)
        lang.store(out, value=fn(lang.load(x)))
        return out

    return tn.jit(k) if dialect == "current" else tn.jit_legacy(k)


ROUNDING_INPUTS = np.array(
    [
        -0.0,
        0.0,
        -0.5,
        0.5,
        1.5,
        2.5,
        -1.5,
        -2.5,
        3.7,
        -3.7,
        2.0**23,
        -(2.0**23),
        2.0**22 + 0.5,
        -(2.0**22) - 0.5,
        8388607.5,
        1e30,
        -1e30,
        np.inf,
        -np.inf,
        np.nan,
        1e-40,
        -1e-40,
        0.49999997,
        -0.99999994,
    ],
    np.float32,
).reshape(2, 12)


@pytest.mark.parametrize("dialect", ["current", "legacy"])
@pytest.mark.parametrize("name", ["floor", "ceil", "trunc"])
def test_floor_ceil_trunc_are_exact(name, dialect):
    x = np.concatenate([ROUNDING_INPUTS, _rand(2, 12) * 1000])
    got = _unary_kernel(getattr(nl, name), dialect)(x)
    want = getattr(np, name)(x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (x, got, want)


@pytest.mark.parametrize("name", ["cos", "tan"])
def test_cos_and_tan_on_their_valid_range(name):
    x = np.linspace(-np.pi, np.pi, 256, dtype=np.float32).reshape(2, 128)
    if name == "tan":
        x = x[np.abs(np.cos(x)) > 1e-2].reshape(2, -1)
    got = _unary_kernel(getattr(nl, name), "current")(x)
    want = getattr(np, name)(x.astype(np.float64))
    # cos is sin(pi/2 - |x|): the fp32 rounding of its argument is an absolute error of about
    # 1e-7, which tan (sin / cos) divides by |cos| (>= 1e-2 here).
    rtol, atol = (1e-5, 1e-7) if name == "tan" else (1e-6, 2e-7)
    assert np.allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dialect", ["current", "legacy"])
@pytest.mark.parametrize("name", ["mod", "fmod"])
def test_mod_and_fmod_of_integers_are_exact(name, dialect):
    lang = nl if dialect == "current" else lnl
    want_fn = np.mod if name == "mod" else np.fmod

    def k(x, xi):
        out = lang.ndarray(x.shape, dtype=x.dtype, buffer=lang.shared_hbm)
        outi = lang.ndarray(xi.shape, dtype=xi.dtype, buffer=lang.shared_hbm)
        fn = getattr(lang, name)
        lang.store(out, value=fn(lang.load(x), 3.0))
        lang.store(outi, value=fn(lang.load(xi), 7, dtype=nl.int32))
        return out, outi

    rng = np.random.default_rng(8)
    x = rng.integers(-10_000_000, 10_000_000, (128, 64)).astype(np.float32)
    xi = rng.integers(-1_000_000, 1_000_000, (128, 64)).astype(np.int32)
    jit = tn.jit if dialect == "current" else tn.jit_legacy
    got, goti = jit(k)(x, xi)
    assert np.array_equal(got, want_fn(x, np.float32(3.0)))
    assert np.array_equal(goti, want_fn(xi, 7))


# ----------------------------------------------------------------------------- bad arguments


def _k_full(x):
    return nl.full((4, 4), "abc", dtype=nl.float32)  # bad


def _k_assign(x):
    t = nl.load(x)
    t[...] = np.ones((4, 4), np.float32)  # bad
    return t


def _k_ds(x):
    return nl.load(x[nl.ds("a", 4), :])  # bad


def _k_sum(x):
    return nl.sum(nl.load(x), axis=None)  # bad


def _k_programs(x):
    return nl.num_programs(5)  # bad


def _k_program_id(x):
    return nl.program_id("0")  # bad


def _k_constant(x):
    return nl.shared_constant("missing-file-of-a-test.npy")  # bad


def _k_arange(x):
    return lnl.arange(2.5)  # bad


@pytest.mark.parametrize(
    ("kernel", "arg"),
    [
        (_k_full, "fill_value"),
        (_k_assign, "value"),
        (_k_ds, "start"),
        (_k_sum, "axis"),
        (_k_programs, "axes"),
        (_k_program_id, "axis"),
        (_k_constant, "constant"),
        (_k_arange, "arange"),
    ],
)
def test_bad_arguments_are_trn2_errors_at_the_kernel_line(kernel, arg):
    with pytest.raises(Trn2Error) as info:
        tn.run(tn.jit(kernel), np.ones((4, 4), np.float32))
    _at(info, kernel, "# bad")
    assert arg in str(info.value)
    assert info.value.nki_location == (__file__, _line_of(kernel, "# bad"))


def test_python_errors_inside_nl_calls_become_trn2_errors():
    def k(x):
        t = nl.load(x)
        return t.reshape("x")  # bad

    with pytest.raises(Trn2Error, match="reshape") as info:
        tn.run(tn.jit(k), np.ones((4, 4), np.float32))
    _at(info, k, "# bad")
    assert isinstance(info.value.__cause__, (TypeError, ValueError))


def test_unsupported_is_importable_via_sys_modules_only_while_installed():
    with tn.install():
        import nki.collectives  # noqa: F401

        assert "nki.collectives" in sys.modules
    assert "nki.collectives" not in sys.modules


# ----------------------------------------------------------------------------- legacy idioms


def test_a_mask_over_several_variables_that_holds_everywhere_or_nowhere():
    @tn.jit_legacy
    def k(x, n):
        out = lnl.ndarray((2, 32, 16), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, jf = lnl.arange(32)[:, None], lnl.arange(16)[None, :]
        for i in lnl.affine_range(2):
            flat = i * 512 + 16 * ip + jf  # the element's index in the whole tensor
            t = lnl.load(x[i, ip, jf], mask=flat < n)
            t2 = lnl.multiply(t, 3.0, mask=(flat < n) & (flat >= 0))
            lnl.store(out[i, ip, jf], value=t2, mask=flat < n)
            lnl.store(out[i, ip, jf], value=t, mask=flat > n + 5)  # never: skipped
        return out

    x = _rand(2, 32, 16)
    res = tn.run(k, x, 1024)
    assert np.array_equal(res.outputs, x * np.float32(3))
    assert res.report.opcodes.get("dma_copy", 0) == 4  # two loads, two stores

    with pytest.raises(tn.NotSupportedError, match="rectangular"):
        k(x, 1000)  # a ragged edge inside the grid: not a rectangle


def test_legacy_column_of_an_hbm_matrix_is_a_partition_column():
    @tn.jit_legacy
    def k(x, a):
        out = lnl.ndarray((128, 64), dtype=x.dtype, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        col = lnl.load(a[0:128, 2])  # [128, 1]: one value per partition
        y = lisa.activation(op=lnl.copy, data=t, scale=col)
        lnl.store(out, value=lnl.multiply(y, col))
        return out

    x, a = _rand(128, 64), _rand(128, 5, seed=1)
    c = a[:, 2:3]
    assert np.array_equal(k(x, a), (x * c) * c)


def test_tensor_engine_results_assigned_to_sbuf_go_through_psum():
    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((64, 128), dtype=x.dtype, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        tt = lnl.ndarray((64, 128), dtype=x.dtype, buffer=lnl.sbuf)
        tt[...] = lisa.nc_transpose(t)  # PE result, SBUF target
        lnl.store(out, value=tt)
        return out

    @tn.jit_legacy
    def mm(x, y):
        out = lnl.ndarray((128, 32), dtype=nl.float32, buffer=lnl.shared_hbm)
        xt = lnl.transpose(lnl.load(x))  # in PSUM
        r = lnl.matmul(xt, lnl.load(y), transpose_x=True)
        lnl.store(out, value=r)
        return out

    # A tensor-engine transpose read by nc_matmul (the reference flash_attn_bwd's
    # `trans_dy = nisa.nc_transpose(dy)`, then `nc_matmul(trans_dy, ...)`): PSUM, then one
    # copy to SBUF, which its later uses read too.
    @tn.jit_legacy
    def operand(x, y):
        out = lnl.ndarray((2, 64, 32), dtype=nl.float32, buffer=lnl.shared_hbm)
        xt = lisa.nc_transpose(lnl.load(x))  # [64, 128] in PSUM
        b = lnl.load(y)
        lnl.store(out[0], value=lisa.nc_matmul(xt, b))
        lnl.store(out[1], value=lisa.nc_matmul(xt, b))
        return out

    def declared(x, y):  # the kernel's own PSUM tile is no matmul operand
        out = lnl.ndarray((64, 32), dtype=nl.float32, buffer=lnl.shared_hbm)
        xt = lnl.ndarray((128, 64), dtype=x.dtype, buffer=lnl.psum)
        xt[...] = lisa.nc_transpose(lnl.load(x))
        lnl.store(out, value=lisa.nc_matmul(xt, lnl.load(y)))  # PSUM OPERAND
        return out

    x = _rand(128, 64)
    res = tn.run(k, x)
    assert np.array_equal(res.outputs, x.T)
    assert res.report.opcodes.get("tensor_copy", 0) == 1
    xr, y = np.round(x * 4), np.round(_rand(64, 32, seed=3))  # integers: exact products
    assert np.array_equal(mm(xr, y), xr @ y)
    y2 = np.round(_rand(128, 32, seed=4))
    res = tn.run(operand, xr.T.copy(), y2)
    assert np.array_equal(res.outputs, np.stack([xr.T @ y2] * 2))
    # xt copied once; each product copied out of PSUM for its store
    assert res.report.opcodes.get("tensor_copy", 0) == 3
    rule = r"stationary is in psum.*\[engine rule matmul_memory\]"
    with pytest.raises(Trn2Error, match=rule) as info:
        tn.run(tn.jit_legacy(declared), xr.T.copy(), y2)
    _at(info, declared, "# PSUM OPERAND")


def test_finfo_and_iinfo():
    assert lnl.finfo(nl.float32).min == np.finfo(np.float32).min
    assert nl.finfo(nl.bfloat16).max == ml_dtypes.finfo(ml_dtypes.bfloat16).max
    assert nl.iinfo(nl.int16).min == -32768
    with pytest.raises(Trn2Error, match="not a floating-point"):
        nl.finfo(nl.int32)
    with pytest.raises(Trn2Error, match="not an integer"):
        nl.iinfo(nl.float16)


def test_a_mask_carries_through_the_uses_of_the_tile_it_made():
    """Rows not a multiple of 128 (the legacy tutorials' idiom): the last tile is loaded
    under a mask, then used without one; only its loaded rows are computed."""

    @tn.jit_legacy
    def k(x, g):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, jf = lnl.arange(128)[:, None], lnl.arange(x.shape[1])[None, :]
        gt = lnl.load(g).broadcast_to((128, x.shape[1]))
        for i in lnl.affine_range((x.shape[0] + 127) // 128):
            t = lnl.load(x[i * 128 + ip, jf], mask=(i * 128 + ip < x.shape[0]))
            ms = lnl.mean(lnl.square(t), axis=1)
            y = lisa.tensor_scalar(t, np.multiply, lnl.rsqrt(ms), op1=np.add, operand1=1.0)
            y2 = (y - 1.0) * gt
            lnl.store(out[i * 128 + ip, jf], value=y2, mask=(i * 128 + ip < x.shape[0]))
        return out

    x, g = np.round(_rand(200, 64) * 4) + 0.5, _rand(1, 64, seed=5)
    got = k(x, g)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True)) * g
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)

    @tn.jit_legacy
    def unmasked_store(x):
        out = lnl.ndarray((128, 8), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, jf = lnl.arange(128)[:, None], lnl.arange(8)[None, :]
        t = lnl.load(x[ip, jf], mask=(ip < 100))
        lnl.store(out, value=lnl.exp(t))  # rows 100.. were never computed: an error
        return out

    with pytest.raises(tn.UninitializedReadError):
        unmasked_store(_rand(128, 8))

    # A view of it assigned into another tile copies its loaded rows (nki-samples' trilinear
    # interpolation copies its corners so, from a tile loaded under the planes' mask).
    @tn.jit_legacy
    def copied(x):
        out = lnl.ndarray((40, 3, 4), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, jd, jf = lnl.mgrid[0:128, 0:3, 0:4]
        t = lnl.load(x[ip, jd, jf], mask=(ip < 40))
        o = lnl.ndarray((128, 3, 4), dtype=x.dtype, buffer=lnl.sbuf)
        o[ip, jd, jf] = t[ip, 2 - jd, jf]  # the rows of t: 40
        lnl.store(out[ip, jd, jf], value=o[ip, jd, jf], mask=(ip < 40))
        return out

    x = _rand(128, 3, 4, seed=6)
    assert np.array_equal(copied(x), x[:40, ::-1])


def test_index_expressions_over_more_free_axes_than_an_access_pattern_run_in_parts():
    """nki-samples' trilinear interpolation indexes its tiles through a seven-axis nl.mgrid
    (the partitions, 2 x 2 x 2 and the three source extents): six free axes, where an access
    pattern takes four. The legacy compiler splits such an expression into instructions; so
    does trn2core, for reads and for the assignment, with the rows a mask made."""

    @tn.jit_legacy
    def k(x):
        n, d = x.shape[0], x.shape[1]
        out = lnl.ndarray((n, 2 * d, 2 * d, 2 * d), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, a, b, c = lnl.mgrid[0:128, 0:d, 0 : d + 1, 0 : d + 1]
        t = lnl.load(x[ip, a, b, c], mask=(ip < n))
        o = lnl.ndarray((128, 2 * d, 2 * d, 2 * d), dtype=x.dtype, buffer=lnl.sbuf)
        ip, u, v, w, a, b, c = lnl.mgrid[0:128, 0:2, 0:2, 0:2, 0:d, 0:d, 0:d]
        # out[2a+u, 2b+v, 2c+w] = 2 x[a, b+v, c+u] + x[d-1-a, b, c+w]: reads of six and five
        # free axes after merging (4 parts each), a write of six (4 parts)
        o[ip, 2 * a + u, 2 * b + v, 2 * c + w] = (
            2.0 * t[ip, a, b + v, c + u] + t[ip, d - 1 - a, b, c + w]
        )  # fmt: skip
        ip, a, b, c = lnl.mgrid[0:128, 0 : 2 * d, 0 : 2 * d, 0 : 2 * d]
        lnl.store(out[ip, a, b, c], value=o[ip, a, b, c], mask=(ip < n))
        return out

    x = np.round(_rand(40, 3, 4, 4, seed=7) * 8)  # small integers: exact
    want = np.zeros((40, 6, 6, 6), np.float32)
    for u, v, w in itertools.product(range(2), repeat=3):
        want[:, u::2, v::2, w::2] = (
            2 * x[:, :, v : v + 3, u : u + 3] + x[:, ::-1, :3, w : w + 3]
        )  # fmt: skip
    res = tn.run(k, x)
    assert np.array_equal(res.outputs, want)
    assert res.report.opcodes.get("tensor_copy", 0) == 4 + 4 + 4

    @tn.jit_legacy
    def read_only(x):  # the same six-axis read into a tile whose axes merge (no parts)
        n, d = x.shape[0], x.shape[1]
        out = lnl.ndarray((n, 8, d**3), dtype=x.dtype, buffer=lnl.shared_hbm)
        ip, a, b, c = lnl.mgrid[0:128, 0:d, 0 : d + 1, 0 : d + 1]
        t = lnl.load(x[ip, a, b, c], mask=(ip < n))
        o = lnl.ndarray((128, 8, d**3), dtype=x.dtype, buffer=lnl.sbuf)
        ip, u, v, w, a, b, c = lnl.mgrid[0:128, 0:2, 0:2, 0:2, 0:d, 0:d, 0:d]
        o[ip, 4 * u + 2 * v + w, d * d * a + d * b + c] = 2.0 * t[ip, a, b + v, c + u]
        ip, i, j = lnl.mgrid[0:128, 0:8, 0 : d**3]
        lnl.store(out[ip, i, j], value=o[ip, i, j], mask=(ip < n))
        return out

    want = np.stack(
        [2 * x[:, :, v : v + 3, u : u + 3] for u, v, _ in itertools.product(range(2), repeat=3)],
        axis=1,
    ).reshape(40, 8, 27)
    assert np.array_equal(read_only(x), want)

    def flat_temp_indexed(x):
        ip, u, v, w, a, b, c = lnl.mgrid[0:128, 0:2, 0:2, 0:2, 0:2, 0:2, 0:2]
        t = lnl.load(x)
        y = t[ip, a, b, c + u + v + w] * 2.0  # a result of six free axes, laid out flat
        return y[ip, u, v, w, a, b, c]  # INDEXED

    with pytest.raises(Trn2Error) as info:
        tn.run(tn.jit_legacy(flat_temp_indexed), np.ones((128, 2, 2, 5), np.float32))
    _at(info, flat_temp_indexed, "# INDEXED")


def test_a_jit_helper_called_inside_a_kernel_is_inlined():
    @tn.jit(mode="trace")
    def helper(dst, src, factor):
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=factor)

    @tn.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        helper(y, t, 3.0)
        nisa.dma_copy(dst=out, src=y)
        return out

    @tn.jit_legacy
    def lhelper(t):
        return lnl.exp(t)

    @tn.jit_legacy
    def lk(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=lhelper(lnl.load(x)))
        return out

    x = _rand(32, 16)
    res = tn.run(k, x)
    assert np.array_equal(res.outputs, x * np.float32(3))
    assert res.report.instructions == 3  # one program: load, multiply, store
    # Transcendentals are float64 math rounded once (docs/machine.md).
    assert np.array_equal(lk(x), np.exp(x.astype(np.float64)).astype(np.float32))


def test_legacy_affine_select_reads_a_psum_tile_through_sbuf():
    @tn.jit_legacy
    def k(q, kk):
        out = lnl.ndarray((64, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        s = lisa.nc_matmul(lnl.load(q), lnl.load(kk))  # [64, 64] in PSUM
        ip, jf = lnl.mgrid[0:64, 0:64]
        causal = lisa.affine_select(pred=(ip - jf >= 0), on_true_tile=s, on_false_value=-9.0)
        lnl.store(out, value=causal)
        return out

    q, kk = np.round(_rand(32, 64)), np.round(_rand(32, 64, seed=2))
    want = np.where(np.tril(np.ones((64, 64), bool)), q.T @ kk, np.float32(-9.0))
    assert np.array_equal(k(q, kk), want)

    def current(q):
        s = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
        d = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(q)
        nisa.nc_matmul(dst=s, stationary=t, moving=t)
        nisa.affine_select(
            dst=d,
            pattern=[[-1, 64]],
            channel_multiplier=1,
            on_true_tile=s,
            on_false_value=0.0,
            cmp_op=nl.greater_equal,
            offset=0,
        )  # PSUM
        return d

    with pytest.raises(Trn2Error, match="PSUM"):
        tn.run(tn.jit(current), q)


# ----------------------------------------------------------------------------- current dialect


def test_dma_with_a_scalar_offset_read_from_sbuf():
    @tn.jit
    def gather_rows(x, idx):
        out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        it = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=it, src=idx)
        t = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.sbuf)
        for p in range(4):
            sel = it.ap(pattern=[[1, 1], [1, 1]], offset=p)  # the row number, in SBUF
            src = x.ap(pattern=[[8, 1], [1, 8]], offset=0, scalar_offset=sel, indirect_dim=0)
            nisa.dma_copy(dst=t[p : p + 1, :], src=src)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = _rand(16, 8)
    idx = np.array([[3], [0], [15], [7]], np.int32)
    assert np.array_equal(gather_rows(x, idx), x[idx[:, 0]])

    def vector(x, idx):
        it = nl.load(idx)
        # a gather view: nisa.dma_copy reads it (test_dma_copy_scatters_and_gathers_...)
        return x.ap(pattern=[[8, 4], [1, 8]], vector_offset=it, indirect_dim=0)

    with pytest.raises(tn.NotSupportedError, match="vector_offset .* or read by nisa.dma_tr"):
        tn.run(tn.jit(vector), x, idx)


def test_scalar_offset_moves_by_the_base_tensors_dimension_not_the_patterns():
    # nki-library's selective-expert moe_tkg picks an expert's weights [E, H, I] with
    # TensorView.select(0, expert_id): the .ap pattern has no expert dimension left, and
    # indirect_dim=0 counts whole experts (H * I elements, the NKI access-pattern reference).
    w = _rand(3, 4, 8)

    @tn.jit
    def pick(w, idx):
        it = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=it, src=idx)
        t = nl.ndarray((4, 8), dtype=w.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=w.ap([[8, 4], [1, 8]], offset=0, scalar_offset=it, indirect_dim=0))
        u = nl.ndarray((4, 1), dtype=w.dtype, buffer=nl.sbuf)  # row 2's column 5 of it
        nisa.dma_copy(dst=u, src=w.ap([[8, 4], [1, 1]], offset=5, scalar_offset=it, indirect_dim=0))
        out = nl.ndarray((4, 9), dtype=w.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[:, 0:8], src=t)
        nisa.dma_copy(dst=out[:, 8:9], src=u)
        return out

    for e in range(3):
        got = pick(w, np.array([[e]], np.int32))
        assert np.array_equal(got[:, :8], w[e]) and np.array_equal(got[:, 8], w[e][:, 5]), e

    def bad(w, idx):
        it = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=it, src=idx)
        return w.ap([[8, 4], [1, 8]], offset=0, scalar_offset=it, indirect_dim=3)  # dim-3

    with pytest.raises(Trn2Error, match=r"indirect_dim 3 is not a dimension of the tensor") as e:
        tn.run(tn.jit(bad), w, np.array([[0]], np.int32))
    assert e.value.arg == "indirect_dim"
    _at(e, bad, "# dim-3")


def test_hbm_to_hbm_write_at_a_batch_read_into_sbuf_one_cache_per_core():
    # NxDI's KV-cache update: a [1, H, S, D] block written into [B, H, S_prior, D] at the batch
    # index held in a 1x1 SBUF tile (a 4-D destination pattern, indirect_dim=0), one cache per
    # LNC=2 core; oob_mode.skip writes nothing for an index past the caches, error refuses it.
    def make(oob):
        def put(k, v, k_cache, v_cache, idx):
            it = nl.ndarray((1, 1), dtype=idx.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=it, src=idx.reshape((1, 1)))
            n = nl.num_programs(0) if nl.program_ndim() else 1
            me = nl.program_id(0) if nl.program_ndim() else 0
            for src, dst, who in ((k, k_cache, 0), (v, v_cache, n - 1)):
                if me == who:
                    b, h, s_prior, d = dst.shape
                    s = src.shape[2]
                    view = dst.ap(
                        pattern=[[h * s_prior * d, 1], [s_prior * d, h], [d, s], [1, d]],
                        offset=0, scalar_offset=it, indirect_dim=0,
                    )  # fmt: skip
                    nisa.dma_copy(dst=view, src=src, oob_mode=oob)  # the-write
            return k_cache, v_cache

        return put

    k, v = _rand(1, 2, 3, 4, seed=1), _rand(1, 2, 3, 4, seed=2)
    kc, vc = _rand(3, 2, 5, 4, seed=3), _rand(3, 2, 5, 4, seed=4)
    for grid, b in ((2, 1), (None, 2), (2, 0)):
        want_k, want_v = kc.copy(), vc.copy()
        want_k[b, :, :3], want_v[b, :, :3] = k[0], v[0]
        args = (k, v, kc.copy(), vc.copy(), np.array([b], np.int32))
        got = tn.run(tn.jit(make(nisa.oob_mode.skip)), *args, grid=grid).outputs
        assert np.array_equal(got[0], want_k) and np.array_equal(got[1], want_v), (grid, b)
        assert not np.array_equal(got[0], kc), (grid, b)
    # past the caches (or before them): skipped, both caches as they were; or refused at
    # the kernel's line
    for b in (3, -1, 2**31 - 1):
        args = (k, v, kc.copy(), vc.copy(), np.array([b], np.int32))
        got = tn.run(tn.jit(make(nisa.oob_mode.skip)), *args, grid=2).outputs
        assert np.array_equal(got[0], kc) and np.array_equal(got[1], vc), b
    err = make(nisa.oob_mode.error)
    with pytest.raises(ShapeError, match=r"dst: the access pattern reaches bytes 480\.\.608 ") as e:
        tn.run(tn.jit(err), k, v, kc.copy(), vc.copy(), np.array([3], np.int32), grid=2)
    _at(e, err, "# the-write")


def test_lnc2_outputs_of_one_shape_are_told_apart():
    @tn.jit
    def two(x):
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        half = x.shape[0] // 2
        rows = nl.ds(nl.program_id(0) * half, half)
        t = nl.load(x[rows, :])
        nl.store(a[rows, :], value=nl.multiply(t, 2.0))
        nl.store(b[rows, :], value=nl.add(t, 1.0))
        return a, b

    x = _rand(64, 16)
    a, b = tn.run(two, x, grid=2).outputs
    assert np.array_equal(a, x * np.float32(2)) and np.array_equal(b, x + np.float32(1))


def test_lnc2_output_returned_as_a_view_merges_both_cores():
    # nki-library's cascaded max: each core writes its half of a [1, N] shared_hbm tensor
    # through `.ap(..., offset=)`, and the kernel returns `.reshape(...)` views of it.
    @tn.jit
    def halves(x):
        n = x.shape[0]
        half = n // 2
        pid = nl.program_id(0)
        out = nl.ndarray((1, n), dtype=x.dtype, buffer=nl.shared_hbm)
        col = nl.ndarray((1, n), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((half, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[pid * half : (pid + 1) * half, :])
        m = nl.ndarray((half, 1), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=m, op=nl.maximum, data=t, axis=1)
        row = m.ap([[1, half], [1, 1]])  # the column as one row
        nisa.dma_copy(dst=out.ap([[n, 1], [1, half]], offset=pid * half), src=row)
        ids = nl.ndarray((1, half), dtype=nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=ids, pattern=[[1, half]], offset=pid * half)
        nisa.dma_copy(dst=col.ap([[n, 1], [1, half]], offset=pid * half), src=ids)
        return out.reshape((2, half, 1)), col.reshape((n,))

    x = _rand(16, 4)
    v, c = tn.run(halves, x, grid=2).outputs
    assert np.array_equal(v, x.max(axis=1).reshape(2, 8, 1))
    assert np.array_equal(c, np.arange(16, dtype=np.int32))

    @tn.jit
    def one_half(x):
        out = nl.ndarray((1, 16), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:1, :])
        nisa.dma_copy(dst=out[0:1, 0:4], src=t)  # the same quarter from both cores
        return out.reshape((2, 8))  # unwritten

    with pytest.raises(tn.KernelError, match=r"byte 16 was never written") as info:
        tn.run(one_half, x, grid=2)
    assert f"{__file__}:{_line_of(one_half, 'out = nl.ndarray')}:" in str(info.value)


# ----------------------------------------------------------------------------- the API surface

# The names of NKI's API reference (module listings of nki, nki.language, nki.isa,
# nki.collectives; the legacy reference of Neuron 2.26 for neuronxcc.nki).
DOCUMENTED = {
    "nki": "jit simulate",
    "nki.language": """ndarray zeros ones full zeros_like empty_like shared_constant
        shared_identity_matrix rand random_seed NkiTensor load load_transpose2d store copy matmul
        transpose abs abs_max abs_min add arctan ceil cos exp floor log maximum minimum multiply
        negative power reciprocal rsqrt sign sin sqrt square subtract tan tanh trunc relu sigmoid
        silu silu_dx gelu gelu_dx gelu_apprx_sigmoid gelu_apprx_sigmoid_dx gelu_apprx_tanh mish
        softplus softmax erf erf_dx dropout rms_norm all max mean min prod sum var equal not_equal
        less less_equal greater greater_equal logical_and logical_or logical_xor logical_not
        bitwise_and bitwise_or bitwise_xor invert left_shift right_shift broadcast_to ds
        expand_dims where gather_flattened affine_range dynamic_range sequential_range
        static_range fori_loop while_loop psum sbuf hbm private_hbm shared_hbm is_psum is_sbuf
        is_hbm is_on_chip device_print no_reorder program_id num_programs program_ndim bool_ int8
        int16 int32 uint8 uint16 uint32 float16 float32 bfloat16 tfloat32 float8_e4m3
        float8_e5m2 float8_e4m3fn float8_e8m0fnu float8_e5m2_x4 float8_e4m3fn_x4
        float4_e2m1fn_x4 tile_size prelu bypass average""",
    "nki.isa": """nc_matmul nc_matmul_mx nc_transpose activation activation_reduce activate2
        tensor_reduce tensor_partition_reduce tensor_tensor tensor_tensor_scan
        scalar_tensor_tensor tensor_scalar tensor_scalar_reduce tensor_scalar_cumulative
        tensor_copy tensor_copy_predicated exponential reciprocal quantize_mx iota dropout
        affine_select range_select select_reduce sequence_bounds memset bn_stats bn_aggr
        local_gather nc_n_gather dma_copy dma_transpose dma_compute max8 nc_find_index8
        nc_match_replace8 nc_stream_shuffle register_alloc register_load register_move
        register_store core_barrier sendrecv rng rand2 rand_set_state rand_get_state
        set_rng_seed nonzero_with_count topk engine dma_engine reduce_cmd dge_mode oob_mode
        matmul_perf_mode nc_version get_nc_version VirtualRegister NkiInstruction""",
    "nki.collectives": """all_reduce all_gather all_gather_v reduce_scatter all_to_all
        all_to_all_v collective_permute collective_permute_implicit
        collective_permute_implicit_reduce collective_permute_implicit_current_processing_rank_id
        rank_id ReplicaGroup""",
    "neuronxcc.nki": "jit benchmark profile baremetal simulate_kernel tensor",
    "neuronxcc.nki.language": """load store load_transpose2d atomic_rmw copy broadcast_to
        ndarray empty_like zeros zeros_like ones full rand random_seed shared_constant
        shared_identity_matrix add subtract multiply divide power maximum minimum max min mean
        var sum prod all abs negative sign trunc floor ceil mod fmod exp log cos sin tan tanh
        arctan sqrt rsqrt sigmoid relu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid silu
        silu_dx erf erf_dx softplus mish square softmax rms_norm dropout matmul transpose
        reciprocal bitwise_and bitwise_or bitwise_xor invert left_shift right_shift equal
        not_equal greater greater_equal less less_equal logical_and logical_or logical_xor
        logical_not ds arange mgrid expand_dims where gather_flattened all_reduce static_range
        affine_range sequential_range par_dim psum sbuf hbm private_hbm shared_hbm program_id
        num_programs program_ndim spmd_dim nc device_print loop_reduce tfloat32 bfloat16
        float8_e4m3 float8_e5m2 tile_size fp32""",
    "neuronxcc.nki.isa": """nc_matmul nc_transpose activation activation_reduce tensor_reduce
        tensor_partition_reduce tensor_tensor tensor_tensor_scan scalar_tensor_tensor
        tensor_scalar tensor_scalar_reduce tensor_copy tensor_copy_dynamic_src
        tensor_copy_dynamic_dst tensor_copy_predicated reciprocal iota dropout affine_select
        range_select select_reduce sequence_bounds memset bn_stats bn_aggr local_gather dma_copy
        dma_transpose max8 nc_find_index8 nc_match_replace8 nc_stream_shuffle engine reduce_cmd
        dge_mode nc_version get_nc_version""",
    "neuronxcc.nki.compiler": """sbuf.alloc sbuf.mod_alloc sbuf.auto_alloc psum.alloc
        psum.mod_alloc psum.auto_alloc skip_middle_end_transformations enable_stack_allocator
        force_auto_alloc""",
}


def _resolve(mod, dotted: str):
    obj = mod
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_documented_name_imports_in_both_dialects():
    import importlib

    with tn.install():
        for modname, names in DOCUMENTED.items():
            mod = importlib.import_module(modname)
            missing = [n for n in names.split() if not _has(mod, n)]
            assert not missing, (modname, missing)


def _has(mod, dotted: str) -> bool:
    try:
        _resolve(mod, dotted)
    except AttributeError:
        return False
    return True


def test_the_unsupported_table_in_the_docs_is_the_code_s():
    import pathlib

    from trn2core.nki._finder import unsupported_api, unsupported_markdown

    doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "nki.md").read_text()
    inner = doc.split("<!-- unsupported-api:begin -->\n")[1].split("\n<!-- unsupported-api:end")[0]
    assert inner == unsupported_markdown()
    import importlib

    with tn.install():
        for modname, names in unsupported_api().items():
            mod = importlib.import_module(modname)
            for n in names:
                f = _resolve(mod, n)
                with pytest.raises(tn.NotSupportedError, match=n.split(".")[-1]):
                    tn.run(tn.jit(lambda x, f=f: f(x)), np.ones((2, 2), np.float32))


def test_legacy_benchmark_and_profile_report_the_emulated_latency(tmp_path):
    def exp_kernel(x):
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=lnl.exp(lnl.load(x)))
        return out

    x = _rand(128, 64)
    with tn.install():
        from neuronxcc import nki
        from neuronxcc.nki import benchmark

        bench = benchmark(warmup=5, iters=10)(nki.jit(exp_kernel))
        out = bench(x)
        want_us = tn.run(tn.jit_legacy(exp_kernel), x).report.seconds * 1e6
        lat = bench.benchmark_result.nc_latency
        assert lat.get_latency_percentile(50) == lat.get_latency_percentile(99) == want_us > 0
        assert np.array_equal(out, np.exp(x.astype(np.float64)).astype(np.float32))

        prof = nki.profile(working_directory=tmp_path, save_trace_name="profile.ntff")(exp_kernel)
        prof(x)
        trace = (tmp_path / "profile.ntff").read_text()
        assert '"traceEvents"' in trace and prof.benchmark_result.report.instructions == 3
        with pytest.raises(Trn2Error, match="iters"):
            benchmark(iters=-1)


SCRIPT = """
import sys
import numpy as np
import nki
import nki.language as nl
import neuronxcc.nki.language as lnl
from neuronxcc import nki as legacy


@nki.jit
def double(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(x), 2.0))
    return out


@legacy.jit
def inc(x):
    out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
    lnl.store(out, value=lnl.add(lnl.load(x), 1.0))
    return out


if __name__ == "__main__":
    x = np.full((4, 8), float(sys.argv[1]), np.float32)
    print("double", double(x)[0, 0], "inc", inc(x)[0, 0])
"""


def test_python_m_trn2core_nki_runs_an_unmodified_script(tmp_path):
    import os
    import subprocess

    script = tmp_path / "my_kernels.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "NEURON_PLATFORM_TARGET_OVERRIDE"}
    run = [sys.executable, "-m", "trn2core.nki", str(script), "3"]
    out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["double", "6.0", "inc", "4.0"]

    for target, ok in (("trn2", True), ("gen3", True), ("trn1", False), ("trn3", False)):
        env["NEURON_PLATFORM_TARGET_OVERRIDE"] = target
        out = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
        assert (out.returncode == 0) == ok, (target, out.stderr)
        if not ok:
            assert "emulates Trainium2" in out.stderr and target in out.stderr


def test_a_target_other_than_trn2_is_refused_at_launch(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(tn.KernelError, match="emulates Trainium2"):
        tn.run(tn.jit(lambda x: x), np.ones((2, 2), np.float32))


def test_a_mask_carries_through_an_index_expression_view_of_the_tile():
    """Max pooling by index expressions, rows not a multiple of 128: the view
    t[i_p, i_k, i_w + i_j] of a masked load holds the load's rows only."""

    @tn.jit_legacy
    def pool(x):
        h, w = x.shape
        out = lnl.ndarray((h - 1, w - 1), dtype=x.dtype, buffer=lnl.shared_hbm)
        for i in lnl.affine_range((h + 127) // 128):
            ip, ik, iw = lnl.mgrid[0:128, 0:2, 0:w]
            t = lnl.load(x[i * 128 + ip + ik, iw], mask=(i * 128 + ip < h - 1))
            ip, ik, iw, ij = lnl.mgrid[0:128, 0:2, 0 : w - 1, 0:2]
            m = lnl.max(t[ip, ik, iw + ij], axis=[1, 3])  # no mask: the load's rows
            op, ow = lnl.mgrid[0:128, 0 : w - 1]
            lnl.store(out[i * 128 + op, ow], value=m, mask=(i * 128 + op < h - 1))
        return out

    x = _rand(150, 9)
    want = np.maximum.reduce([x[:-1, :-1], x[1:, :-1], x[:-1, 1:], x[1:, 1:]])
    assert np.array_equal(pool(x), want)


def test_an_unknown_name_is_a_not_supported_error_at_the_kernel_line():
    with tn.install():
        import nki.language as inl

        def k(x):
            return inl.frobnicate(x)  # unknown

        with pytest.raises(tn.NotSupportedError, match="nki.language.frobnicate") as info:
            tn.run(tn.jit(k), np.ones((2, 2), np.float32))
        _at(info, k, "# unknown")
        assert isinstance(info.value, AttributeError)  # hasattr and `from` imports still work
        assert not hasattr(inl, "frobnicate") and hasattr(inl, "add")
        with pytest.raises(ImportError):
            from nki.language import frobnicate  # noqa: F401


def test_a_declared_tile_filled_by_masked_results_holds_their_rows():
    """bn_stats of a masked load assigned block by block into a declared tile, then bn_aggr
    of the whole tile (the layernorm tutorial's idiom at rows not a multiple of 128)."""

    @tn.jit_legacy
    def stats(x):
        n, f = x.shape
        out = lnl.ndarray((n, 2), dtype=nl.float32, buffer=lnl.shared_hbm)
        ip, jf = lnl.arange(128)[:, None], lnl.arange(f)[None, :]
        jb, j6 = lnl.arange(f // 2)[None, :], lnl.arange(6)[None, :]
        for i in lnl.affine_range((n + 127) // 128):
            t = lnl.load(x[i * 128 + ip, jf], mask=(i * 128 + ip < n))
            st = lnl.ndarray((128, 12), dtype=nl.float32, buffer=lnl.sbuf)
            for j in lnl.affine_range(2):
                st[ip, j * 6 + j6] = lisa.bn_stats(t[ip, j * (f // 2) + jb], dtype=nl.float32)
            mv = lisa.bn_aggr(st)
            lnl.store(out[i * 128 + ip, lnl.arange(2)[None, :]], value=mv, mask=(i * 128 + ip < n))
        return out

    x = np.round(_rand(200, 64) * 8) / 8  # exact in fp32 sums
    got = stats(x)
    assert np.allclose(got[:, 0], x.mean(axis=1), rtol=1e-6, atol=1e-6)
    assert np.allclose(got[:, 1], x.var(axis=1), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- explicit allocation


def _ncc():
    with tn.install():
        import neuronxcc.nki.compiler as ncc
    return ncc


def test_sbuf_mod_alloc_maps_blocks_onto_physical_tiles_modulo_their_count():
    """Four blocks on two physical tiles: block i lives in tile i % 2, and a second tensor
    placed at tile 1's address reads the bytes block 3 left there (the same SBUF bytes)."""
    ncc = _ncc()

    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((4, 128, 64), dtype=x.dtype, buffer=lnl.shared_hbm)
        seen = lnl.ndarray((128, 64), dtype=x.dtype, buffer=lnl.shared_hbm)
        bufs = lnl.ndarray(
            (4, lnl.par_dim(128), 64),
            dtype=x.dtype,
            buffer=ncc.sbuf.mod_alloc(base_addr=512, num_free_tiles=(2,)),
        )
        for i in lnl.sequential_range(4):
            bufs[i] = lnl.load(x[i])
            bufs[i] = lisa.tensor_scalar(bufs[i], np.multiply, float(i + 1))
            lnl.store(out[i], value=bufs[i])
        alias = lnl.ndarray(
            (lnl.par_dim(128), 64), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=512 + 64 * 4)
        )
        lnl.store(seen, value=alias)
        return out, seen

    x = _rand(4, 128, 64)
    out, seen = k(x)
    assert np.array_equal(out, x * np.arange(1, 5, dtype=np.float32)[:, None, None])
    assert np.array_equal(seen, x[3] * 4)  # block 3 is physical tile 1


def test_psum_mod_alloc_blocks_sharing_a_bank_each_start_their_own_accumulation():
    ncc = _ncc()

    @tn.jit_legacy
    def k(a, b):
        q_n, k_n = a.shape[0], a.shape[1]
        out = lnl.ndarray((q_n, 128, 256), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.ndarray(
            (q_n, lnl.par_dim(128), 256),
            dtype=nl.float32,
            buffer=ncc.psum.mod_alloc(base_bank=3, num_bank_tiles=(1,)),
        )
        for q in lnl.sequential_range(q_n):
            for j in lnl.affine_range(k_n):
                acc[q] += lisa.nc_matmul(lnl.load(a[q, j]), lnl.load(b[q, j]))
            lnl.store(out[q], value=lnl.copy(acc[q]))
        return out

    @tn.jit_legacy
    def redeclared(a, b):
        q_n, k_n = a.shape[0], a.shape[1]
        out = lnl.ndarray((q_n, 128, 256), dtype=nl.float32, buffer=lnl.shared_hbm)
        for q in lnl.sequential_range(q_n):
            # A new tensor on the same bank each time: its first matmul starts afresh.
            acc = lnl.ndarray(
                (lnl.par_dim(128), 256), dtype=nl.float32, buffer=ncc.psum.mod_alloc(base_bank=5)
            )
            for j in lnl.affine_range(k_n):
                acc += lisa.nc_matmul(lnl.load(a[q, j]), lnl.load(b[q, j]))
            lnl.store(out[q], value=lnl.copy(acc))
        return out

    a = np.round(_rand(3, 2, 128, 128, seed=1))  # integers: exact sums
    b = np.round(_rand(3, 2, 128, 256, seed=2))
    want = np.einsum("qjkm,qjkn->qmn", a.astype(np.float64), b).astype(np.float32)
    assert np.array_equal(k(a, b), want)
    assert np.array_equal(redeclared(a, b), want)


def test_alloc_places_each_block_where_its_function_says():
    """PSUM blocks on banks 6 and 2 (a function of the block), SBUF blocks on partitions 64
    and 0; a second tensor at block 1's SBUF place reads its bytes."""
    ncc = _ncc()

    def bank(banks, idx, pdim_size, fdim_size):  # called by keyword: partial binds banks
        assert pdim_size == 64 and fdim_size == 256 * 4
        return (banks[idx], 0, 0)

    def sbuf_at(idx, pdim_size, fdim_size):
        return (64 * (1 - idx[0]), 4096)

    @tn.jit_legacy
    def k(a, b):
        out = lnl.ndarray((2, 64, 256), dtype=nl.float32, buffer=lnl.shared_hbm)
        seen = lnl.ndarray((64, 256), dtype=nl.float32, buffer=lnl.shared_hbm)
        ps = lnl.ndarray(
            (2, lnl.par_dim(64), 256),
            dtype=nl.float32,
            buffer=ncc.psum.alloc(functools.partial(bank, {(0,): 6, (1,): 2})),
        )
        sb = lnl.ndarray(
            (2, lnl.par_dim(64), 256), dtype=nl.float32, buffer=ncc.sbuf.alloc(sbuf_at)
        )
        for i in lnl.sequential_range(2):
            for j in lnl.sequential_range(2):
                ps[i] += lisa.nc_matmul(lnl.load(a[i, j]), lnl.load(b[i, j]))
            sb[i] = lnl.copy(ps[i])
            lnl.store(out[i], value=sb[i])
        alias = lnl.ndarray(
            (lnl.par_dim(64), 256), dtype=nl.float32, buffer=ncc.sbuf.alloc(lambda **kw: (0, 4096))
        )
        lnl.store(seen, value=alias)
        return out, seen

    a = np.round(_rand(2, 2, 128, 64, seed=9))
    b = np.round(_rand(2, 2, 128, 256, seed=10))
    want = np.einsum("ijkm,ijkn->imn", a.astype(np.float64), b).astype(np.float32)
    out, seen = k(a, b)
    assert np.array_equal(out, want)
    assert np.array_equal(seen, want[1])

    def bad(x):
        t = lnl.ndarray(
            (2, lnl.par_dim(64), 8), dtype=x.dtype, buffer=ncc.psum.alloc(lambda **kw: (9, 0, 0))
        )
        t[0] = 0.0  # bank 9
        return x

    with pytest.raises(Trn2Error, match="bank 9") as info:
        tn.run(tn.jit_legacy(bad), np.ones((2, 2), np.float32))
    _at(info, bad, "# bank 9")


def test_ndarray_at_an_address_shares_bytes_with_what_overlaps_it():
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        low = nl.ndarray((64, 64), dtype=x.dtype, buffer=nl.sbuf, address=(32, 1024))
        high = nl.ndarray((32, 32), dtype=x.dtype, buffer=nl.sbuf, address=(64, 1024 + 128))
        nisa.dma_copy(dst=low, src=x)
        nisa.memset(dst=high, value=7.0)  # partitions 64..95, bytes of low[32:64, 32:64]
        nisa.dma_copy(dst=out, src=low)
        return out

    x = _rand(64, 64)
    want = x.copy()
    want[32:, 32:] = 7.0
    assert np.array_equal(tn.jit(k)(x), want)


def test_explicit_allocation_errors_name_the_argument_at_the_kernel_line():
    ncc = _ncc()

    def over(x):
        t = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.sbuf, address=(0, 212_900))  # cap
        return t

    with pytest.raises(CapacityError) as info:
        tn.run(tn.jit(over), np.ones((2, 2), np.float32))
    _at(info, over, "# cap")

    def bad(x):
        t = lnl.ndarray((128, 4), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr="a"))  # ba
        return t

    with pytest.raises(Trn2Error, match="base_addr") as info:
        tn.run(tn.jit_legacy(bad), np.ones((2, 2), np.float32))
    _at(info, bad, "# ba")

    def blocks(x):
        alloc = ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2, 2))
        t = lnl.ndarray((4, lnl.par_dim(128), 4), dtype=x.dtype, buffer=alloc)  # nf
        return t

    with pytest.raises(Trn2Error, match="num_free_tiles") as info:
        tn.run(tn.jit_legacy(blocks), np.ones((2, 2), np.float32))
    _at(info, blocks, "# nf")


def test_nc_versions_are_ordered():
    for isa in (nisa, lisa):
        assert isa.get_nc_version() >= isa.nc_version.gen3 > isa.nc_version.gen2
        assert isa.get_nc_version() < isa.nc_version.gen4


def test_legacy_matmul_under_a_constant_mask_runs_or_is_left_out():
    @tn.jit_legacy
    def k(a, b):
        out = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.zeros((128, 64), dtype=nl.float32, buffer=lnl.psum)
        for j in lnl.sequential_range(3):
            acc += lisa.nc_matmul(lnl.load(a[j]), lnl.load(b[j]), mask=(j * 128 < 256))
        lnl.store(out, value=lnl.copy(acc))
        return out

    a, b = np.round(_rand(3, 128, 128, seed=4)), np.round(_rand(3, 128, 64, seed=5))
    want = a[0].T.astype(np.float64) @ b[0] + a[1].T.astype(np.float64) @ b[1]
    assert np.array_equal(k(a, b), want.astype(np.float32))


def test_legacy_double_row_matmul_contracts_both_rows_of_each_partition():
    # nki-samples' FP8 double-row matmul (legacy dialect): fp8 operands [K, 2, M] and [K, 2, N]
    # with perf_mode="double_row_gen3" (the legacy name): out[M, N] = sum over k and the row.
    f8 = ml_dtypes.float8_e4m3

    def kernel(pm):
        def k(a, b):
            out = lnl.ndarray((a.shape[2], b.shape[2]), dtype=nl.float32, buffer=lnl.shared_hbm)
            i = lnl.mgrid[0:128, 0:2, 0 : a.shape[2]]
            j = lnl.mgrid[0:128, 0:2, 0 : b.shape[2]]
            ta = lnl.load(a[i.p, i.x, i.y])
            tb = lnl.load(b[j.p, j.x, j.y])
            lnl.store(out, value=lnl.copy(lisa.nc_matmul(ta, tb, perf_mode=pm)))  # the-mm
            return out

        return k

    r = np.random.default_rng(7)
    a = r.integers(-3, 4, (128, 2, 96)).astype(f8)
    b = r.integers(-3, 4, (128, 2, 200)).astype(f8)
    want = np.einsum("kri,krj->ij", a.astype(np.float64), b.astype(np.float64))
    for pm in ("double_row_gen3", "double_row", lisa.matmul_perf_mode.double_row):
        got = tn.run(tn.jit_legacy(kernel(pm)), a, b).outputs
        assert np.array_equal(got, want.astype(np.float32)), pm
    # its rules: fp8 operands only, and a perf mode the engine knows, each at the kernel's line
    with pytest.raises(FormatError) as e:
        tn.run(tn.jit_legacy(kernel("double_row")), a.astype(ml_dtypes.bfloat16), b)
    _at(e, kernel("double_row"), "# the-mm")
    with pytest.raises(Trn2Error, match="perf_mode") as e:
        tn.run(tn.jit_legacy(kernel("triple_row")), a, b)
    _at(e, kernel("triple_row"), "# the-mm")


def test_legacy_tensor_tensor_reads_a_one_column_operand_along_the_free_axis():
    # nki-samples' double-row matmul dequantizes [128, F] by a [128, 1] scale with
    # nisa.tensor_tensor: the legacy front end broadcasts it (a stride-0 free axis), either side.
    def k(x, s):
        out = lnl.ndarray((128, 2 * x.shape[1]), dtype=nl.float32, buffer=lnl.shared_hbm)
        tx, ts = lnl.load(x), lnl.load(s)
        lnl.store(out[:, 0 : x.shape[1]], value=lisa.tensor_tensor(tx, ts, lnl.multiply))
        lnl.store(out[:, x.shape[1] :], value=lisa.tensor_tensor(ts, tx, lnl.subtract))
        return out

    x, s = _rand(128, 40, seed=8), _rand(128, 1, seed=9)
    got = tn.run(tn.jit_legacy(k), x, s).outputs
    assert np.array_equal(got[:, :40], x * s) and np.array_equal(got[:, 40:], s - x)

    def bad(x, s):  # two columns beside forty: no broadcast, the engine's shape rule
        return lisa.tensor_tensor(lnl.load(x), lnl.load(s), lnl.add)  # the-add

    with pytest.raises(ShapeError, match="same partitions and elements per partition") as e:
        tn.run(tn.jit_legacy(bad), x, _rand(128, 2, seed=9))
    _at(e, bad, "# the-add")
    with pytest.raises(ShapeError, match="same partitions") as e:
        tn.run(tn.jit_legacy(bad), x, _rand(64, 1, seed=9))
    _at(e, bad, "# the-add")


# ----------------------------------------------------------------------------- legacy liveness


def test_legacy_block_array_larger_than_psum_gets_storage_block_by_block():
    """16 PSUM banks' worth of blocks (PSUM has 8), each live for one iteration: the compiler
    reuses the memory of dead blocks, and so does trn2core."""

    @tn.jit_legacy
    def k(a, b):
        n = a.shape[0]
        out = lnl.ndarray((n, 128, 512), dtype=nl.float32, buffer=lnl.shared_hbm)
        ps = lnl.ndarray((n, lnl.par_dim(128), 512), dtype=nl.float32, buffer=lnl.psum)
        for i in lnl.affine_range(n):
            ps[i] = lisa.nc_matmul(lnl.load(a[i]), lnl.load(b[i]))
            lnl.store(out[i], value=lnl.copy(ps[i]))
        return out

    a, b = np.round(_rand(16, 128, 128, seed=6)), np.round(_rand(16, 128, 512, seed=7))
    want = np.einsum("ikm,ikn->imn", a.astype(np.float64), b).astype(np.float32)
    assert np.array_equal(k(a, b), want)


def test_legacy_block_array_read_after_its_block_was_released_is_a_capacity_error():
    def k(a):
        out = lnl.ndarray((128, 512), dtype=nl.float32, buffer=lnl.shared_hbm)
        ps = lnl.ndarray((16, lnl.par_dim(128), 512), dtype=nl.float32, buffer=lnl.psum)
        t = lnl.load(a)
        for i in lnl.sequential_range(16):
            ps[i] = lisa.nc_matmul(t[:, 0:128], t)
        lnl.store(out, value=lnl.copy(ps[0]))  # block 0 released
        return out

    with pytest.raises(CapacityError, match="released") as info:
        tn.run(tn.jit_legacy(k), np.ones((128, 512), np.float32))
    _at(info, k, "# block 0 released")

    def whole(a):
        ps = lnl.ndarray((16, lnl.par_dim(128), 512), dtype=nl.float32, buffer=lnl.psum)
        ps[0] = 0.0  # block 0 gets storage of its own
        ps[...] = 0.0  # whole
        return a

    with pytest.raises(CapacityError, match="spans several blocks") as info:
        tn.run(tn.jit_legacy(whole), np.ones((128, 512), np.float32))
    _at(info, whole, "# whole")

    @tn.jit_legacy
    def whole_first(a):
        out = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        ps = lnl.ndarray((2, lnl.par_dim(128), 64), dtype=nl.float32, buffer=lnl.psum)
        ps[...] = 3.0  # before any block has storage: the array whole
        lnl.store(out, value=lnl.copy(ps[1]))
        return out

    assert np.array_equal(whole_first(np.ones((2, 2), np.float32)), np.full((128, 64), 3.0))


def _spilling_kernel(a, bias):
    """Blocks of 32 KiB per partition, all loaded before any is read (8 of them need 256 KiB
    of SBUF's 192 KiB), then stored in reverse order and added in order: the compiler spills
    blocks to HBM and reloads them."""
    n = a.shape[0]
    out = lnl.ndarray(a.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
    twice = lnl.ndarray(a.shape, dtype=a.dtype, buffer=lnl.shared_hbm)
    blk = lnl.ndarray((n, lnl.par_dim(128), a.shape[2]), dtype=a.dtype, buffer=lnl.sbuf)
    for i in lnl.sequential_range(n):
        blk[i] = lnl.load(a[i])
        if i == 0:
            blk[0][:, 0:64] = lnl.add(blk[0][:, 0:64], bias)  # rewritten in part, then spilled
    for i in lnl.sequential_range(n):
        lnl.store(out[n - 1 - i], value=blk[n - 1 - i])
    for i in lnl.sequential_range(n):
        lnl.store(twice[i], value=lnl.add(blk[i], blk[n - 1 - i]))
    return out, twice


@pytest.mark.parametrize("n", [2, 8])
def test_legacy_block_array_larger_than_sbuf_spills_to_hbm_bit_exactly(n):
    a = _rand(n, 128, 8192, seed=8)
    a.view(np.uint32)[:, :, 100] = 0x7FC01234  # a NaN payload: bits move as they are
    bias = np.float32(0.5)
    res = tn.run(tn.jit_legacy(_spilling_kernel), a, bias)
    b = a.copy()
    b[0, :, 0:64] += bias
    assert np.array_equal(res.outputs[0].view(np.uint32), b.view(np.uint32))
    assert np.array_equal(res.outputs[1], b + b[::-1], equal_nan=True)
    rep, block = res.report, 128 * 8192 * 4
    assert rep.to_dict()["spill_bytes"] == rep.spill_bytes == rep.cores[0].spill_bytes
    if n == 2:  # fits: no spill
        assert rep.spill_bytes == 0 and rep.spill_s == 0 and "spills" not in str(rep)
        return
    assert rep.spill_bytes > 0 and rep.spill_bytes % block == 0 and rep.spill_s > 0
    assert f"spills: {rep.spill_bytes:,} bytes" in str(rep)
    plain = tn.run(tn.jit_legacy(_spilling_kernel), a[:2], bias).report
    assert rep.dma_bytes - rep.spill_bytes == 4 * plain.dma_bytes  # loads and stores: x n/2


def test_current_dialect_allocations_over_capacity_stay_capacity_errors():
    def k(a):
        t = nl.ndarray((128, 4, 15_000), dtype=nl.float32, buffer=nl.sbuf)  # cap
        return t

    with pytest.raises(CapacityError) as info:
        tn.run(tn.jit(k), np.ones((2, 2), np.float32))
    _at(info, k, "# cap")


def test_current_dialect_psum_kept_by_a_handle_past_its_last_use_gives_its_storage_up():
    # nki-library's moe_cte (shard on block) keeps lists of PSUM transposes and projections in
    # variables after their last use, then declares eight full banks: the compiler reuses the
    # dead tensors' memory; trn2core gives the least recently used ones' storage up.
    @tn.jit
    def k(a):
        out = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        old = []
        for _ in range(4):  # 4 KiB of transposes, kept by ``old`` and ``t``
            t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=t, data=x)
            old.append(t)
        xt = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=xt, src=old[2])
        banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        res = nl.ndarray((128, 8, 512), dtype=nl.float32, buffer=nl.sbuf)
        for j in range(8):
            nisa.memset(dst=res[:, j, :], value=float(j))
            nisa.nc_matmul(dst=banks[j][:, 0:128], stationary=xt, moving=xt)
            nisa.tensor_copy(dst=res[:, j, 0:128], src=banks[j][:, 0:128])
        nisa.dma_copy(dst=out, src=res)
        return out

    a = np.arange(128 * 128, dtype=np.float32).reshape(128, 128) % 7 - 3
    want = np.repeat(np.arange(8, dtype=np.float32)[None, :, None], 128, 0).repeat(512, 2)
    want[:, :, :128] = (a @ a.T)[:, None, :]
    assert np.array_equal(tn.run(k, a).outputs, want)

    @tn.jit
    def late(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=x)
        _ = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
        nisa.tensor_copy(dst=x, src=t)  # late
        nisa.dma_copy(dst=out, src=x)
        return out

    with pytest.raises(CapacityError, match=r"psum\d+: used after its storage was given") as info:
        tn.run(late, a)
    _at(info, late, "# late")
    assert "[rule psum_capacity]" in str(info.value)


def test_current_dialect_psum_tensors_past_their_last_use_give_their_storage_up():
    """Twelve one-bank PSUM tensors (PSUM has eight banks), each with a handle kept to the end
    but last used when copied out, as NxDI's LTX-2 cross attention holds its unrolled tiles:
    the compiler frees a tensor after its last use, so the least recently used give their
    storage up to later ones (PSUM has no spill)."""

    @tn.jit
    def k(x, identity):
        n = 12
        out = nl.ndarray((n, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        eye = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=eye, src=identity)
        xs = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xs, src=x)
        held = []
        for i in range(n):
            m = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=m, data=xs, op0=nl.multiply, operand0=float(i + 1))
            p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=p, stationary=eye, moving=m)
            s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=s, src=p)
            nisa.dma_copy(dst=out[i], src=s)
            held.append((p, s))
        return out

    x = np.round(_rand(128, 512, seed=3))
    want = x[None] * np.arange(1, 13, dtype=np.float32)[:, None, None]
    assert np.array_equal(k(x, np.eye(128, dtype=np.float32)), want)


# ----------------------------------------------------------------------------- indirect DMA


def test_load_with_an_index_tile_gathers_rows():
    @tn.jit_legacy
    def k(table, idx):
        n = 100
        out = lnl.ndarray((n, 8), dtype=table.dtype, buffer=lnl.shared_hbm)
        i_p, i_f = lnl.arange(128)[:, None], lnl.arange(8)[None, :]
        ix = lnl.load(idx)
        g = lnl.load(table[1, ix, i_f], mask=(i_p < n))  # gather
        lnl.store(out[i_p, i_f], value=g, mask=(i_p < n))
        return out

    table = _rand(2, 40, 8)
    idx = np.floor(np.arange(128) * 0.3).astype(np.int32)[:, None]  # runs and repeats
    idx[50:60, 0] = [39, 3, 17, 17, 17, 0, 5, 10, 15, 20]
    assert np.array_equal(k(table, idx), table[1, idx[:100, 0]])

    bad = idx.copy()
    bad[7, 0] = 40

    with pytest.raises(tn.OutOfBoundsError, match="holds 40 at partition 7") as info:
        k(table, bad)
    _at(info, k.fn, "# gather")


@pytest.mark.parametrize("dialect", ["current", "legacy"])
def test_integer_division_is_true_division(dialect):
    lang = nl if dialect == "current" else lnl

    def k(xi):
        out = lang.ndarray(xi.shape, dtype=nl.float32, buffer=lang.shared_hbm)
        outi = lang.ndarray(xi.shape, dtype=nl.int32, buffer=lang.shared_hbm)
        t = lang.load(xi)
        q = t / 38
        assert q.dtype == nl.float32
        lang.store(out, value=q)
        lang.store(outi, value=lang.floor(lang.divide(t, 38), dtype=nl.int32))
        return out, outi

    xi = np.arange(128 * 20, dtype=np.int32).reshape(128, 20) - 1000
    jit = tn.jit if dialect == "current" else tn.jit_legacy
    q, fl = jit(k)(xi)
    assert np.array_equal(q, xi.astype(np.float32) / np.float32(38))
    assert np.array_equal(fl, xi // 38)


@pytest.mark.parametrize("dialect", ["current", "legacy"])
def test_var_is_the_population_variance(dialect):
    lang = nl if dialect == "current" else lnl

    def k(x, x3):
        out = lang.ndarray((128, 1), dtype=x.dtype, buffer=lang.shared_hbm)
        out3 = lang.ndarray((128, 1, 1), dtype=x.dtype, buffer=lang.shared_hbm)
        lang.store(out, value=lang.var(lang.load(x), axis=1))
        v3 = lang.var(lang.load(x3), axis=[1, 2])
        lang.store(out3, value=v3.reshape((128, 1, 1)) if v3.ndim == 2 else v3)
        return out, out3

    x = _rand(128, 64, seed=11)
    x3 = _rand(128, 4, 16, seed=12)
    jit = tn.jit if dialect == "current" else tn.jit_legacy
    got, got3 = jit(k)(x, x3)
    assert np.allclose(got, x.astype(np.float64).var(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    want3 = x3.astype(np.float64).var(axis=(1, 2)).reshape(128, 1, 1)
    assert np.allclose(got3, want3, rtol=1e-5, atol=1e-6)


def test_ap_with_dtype_views_a_tensors_bytes_as_another_dtype():
    # nki-library's rmsnorm-quant stores an fp32 scale as four fp8 bytes: `.ap(pattern=...,
    # dtype=...)` reads a tensor's storage as elements of another dtype (pattern and offset
    # in those elements). Both an SBUF tile and an HBM tensor, against numpy's view.
    x = np.linspace(-3, 3, 128 * 4, dtype=np.float32).reshape(128, 4)

    @tn.jit
    def as_bytes(x):
        t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((128, 16), dtype=nl.uint8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.ap(pattern=[[16, 128], [1, 16]], dtype=nl.uint8))
        halves = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=halves, src=x.ap(pattern=[[8, 128], [1, 8]], dtype=nl.bfloat16))
        return out, halves

    out, halves = as_bytes(x)
    assert np.array_equal(out, x.view(np.uint8))
    assert np.array_equal(halves.view(np.uint16), x.view(np.uint16))
    # Bytes that do not split into whole elements are refused, naming dtype.
    y = np.ones((128, 3), np.uint8)

    @tn.jit
    def odd(y):
        t = nl.ndarray((128, 3), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=y)
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.ap(pattern=[[1, 128], [1, 1]], dtype=nl.float32))
        return out

    with pytest.raises(ShapeError, match="dtype: cannot view uint8 as fp32"):
        odd(y)


def test_dma_transpose_permutes_2d_3d_and_4d_hbm_sources():
    # NKI's permutations: [1, 0], [2, 1, 0], [3, 1, 2, 0]; nki-library's attention_cte loads
    # q transposed through a 4-D `.ap` with two unit axes.
    x = np.arange(6 * 16, dtype=np.float32).reshape(6, 16).astype(ml_dtypes.bfloat16)

    @tn.jit
    def four(x):
        n, d = x.shape
        t = nl.ndarray((d, n), dtype=x.dtype, buffer=nl.sbuf)
        src = x.ap([[d, n], [1, 1], [1, 1], [1, d]], offset=0)  # [n, 1, 1, d]
        nisa.dma_transpose(dst=t.ap([[n, d], [1, 1], [1, 1], [1, n]]), src=src)
        out = nl.ndarray((d, n), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    assert np.array_equal(tn.run(four, x).outputs, x.T)

    y = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8).astype(ml_dtypes.bfloat16)

    @tn.jit
    def three(y):
        t = nl.ndarray((8, 3, 2), dtype=y.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=y)
        out = nl.ndarray((8, 3, 2), dtype=y.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    assert np.array_equal(tn.run(three, y).outputs, y.transpose(2, 1, 0))


def test_dma_transpose_legacy_form_returns_the_permuted_tile():
    # Neuron 2.26's value-returning form: an HBM 2-D source (bf16 NaN payloads, -0, inf kept
    # bit for bit) and an SBUF 3-D tile, the result a new SBUF tile of the permuted shape.
    x = np.arange(16 * 6, dtype=np.float32).reshape(16, 6).astype(ml_dtypes.bfloat16)
    xb = x.view(np.uint16)
    xb[0, 1], xb[3, 2], xb[5, 5] = 0x7FC1, 0x8000, 0x7F80
    y = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 3, 8)
    y[1, 2, 7] = np.nan

    @tn.jit_legacy
    def k(x, y):
        a = lisa.dma_transpose(x)
        b = lisa.dma_transpose(lnl.load(y), axes=(2, 1, 0))
        oa = lnl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(oa, value=a)
        ob = lnl.ndarray((8, 3, 2), dtype=y.dtype, buffer=lnl.shared_hbm)
        lnl.store(ob, value=b)
        return oa, ob

    a, b = tn.run(k, x, y).outputs
    assert np.array_equal(a.view(np.uint16), xb.T)
    assert np.array_equal(b.view(np.uint32), y.transpose(2, 1, 0).view(np.uint32))


def test_a_tensor_compared_with_none_is_a_python_bool():
    # Optional tensor arguments tested as `t != None` / `t == None` (nki-library's rope_hf).
    @tn.jit
    def k(x, extra=None):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        assert (x == None) is False and (x != None) is True  # noqa: E711
        if extra != None:  # noqa: E711
            e = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=e, src=extra)
            nisa.tensor_tensor(dst=t, data1=t, data2=e, op=nl.add)
        nisa.dma_copy(dst=out, src=t)
        return out

    x, y = _rand(8, 4), _rand(8, 4, seed=1)
    assert np.array_equal(tn.run(k, x).outputs, x)
    assert np.array_equal(tn.run(k, x, y).outputs, x + y)


def test_numpy_scalar_arguments_are_python_constants():
    # `scale=1 / np.sqrt(d)` is a numpy float64: a constant of the kernel, not an HBM tensor.
    @tn.jit
    def k(x, scale, n):
        assert isinstance(scale, float) and isinstance(n, int)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=scale * n)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = _rand(8, 4)
    out = tn.run(k, x, 1 / np.sqrt(16.0), np.int64(2)).outputs
    assert np.array_equal(out, x * np.float32(0.5))


def _awkward_bf16(*shape, seed=0):
    """bf16 values with NaN (a payload), -0.0, +-inf and ties among them."""
    x = np.round(_rand(*shape, seed=seed)).astype(ml_dtypes.bfloat16)
    flat = x.reshape(-1).view(np.uint16)
    flat[::7] = 0x7FC1  # NaN with a payload
    flat[1::11] = 0x8000  # -0.0
    flat[2::13] = 0x7F80  # +inf
    flat[3::17] = 0xFF80  # -inf
    return x


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16 if a.itemsize == 2 else np.uint32)


def test_dma_transpose_sbuf_to_sbuf_moves_bits_2d_and_4d_partial_tiles():
    # SBUF-to-SBUF: the source's innermost free axis becomes the destination's partitions, bit
    # for bit (NaN payloads, -0.0, infinities kept). The 4-D form is nki-library attention_cte's
    # transposition of its exponentiated scores: `.ap` views with a unit axis, a group of
    # `nf` blocks of `b` elements, `num_p` of the source's partitions (a partial tile).
    x = _awkward_bf16(6, 24)

    @tn.jit
    def two(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        u = nl.ndarray((x.shape[1], x.shape[0]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=u, src=t)
        out = nl.ndarray(u.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    res = tn.run(two, x)
    assert np.array_equal(_bits(res.outputs), _bits(x.T))
    assert res.report.opcodes["dma_transpose"] == 1

    @tn.jit
    def four(x, num_p, nf, b):
        p, f = x.shape
        t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        u = nl.ndarray((b, nf * p), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=u, value=0.0)
        nisa.dma_transpose(
            dst=u.ap([[nf * p, b], [1, 1], [p, nf], [1, num_p]]),
            src=t.ap([[f, num_p], [1, 1], [b, nf], [1, b]]),
        )
        out = nl.ndarray(u.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    num_p, nf, b = 5, 3, 8
    got = tn.run(four, x, num_p, nf, b).outputs
    want = np.zeros((b, nf * 6), ml_dtypes.bfloat16)
    for i in range(num_p):  # our oracle: dst[l, 0, k, i] = src[i, 0, k, l]
        for k in range(nf):
            for l in range(b):  # noqa: E741
                want[l, k * 6 + i] = x[i, k * b + l]
    assert np.array_equal(_bits(got), _bits(want))

    y = _rand(4, 3, 2)  # 3-D, 4-byte elements, SBUF to SBUF

    @tn.jit
    def three(y):
        t = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=y)
        u = nl.ndarray((2, 3, 4), dtype=y.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=u, src=t, axes=(2, 1, 0))
        out = nl.ndarray(u.shape, dtype=y.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    assert np.array_equal(_bits(tn.run(three, y).outputs), _bits(y.transpose(2, 1, 0)))


def test_dma_transpose_sbuf_to_sbuf_takes_twice_the_copys_data_time():
    # The architecture guide: SBUF-to-SBUF transpose reaches up to 50% of the DMA throughput.
    x = _awkward_bf16(128, 128)

    def kernel(transpose):
        @tn.jit
        def k(x):
            t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x)
            u = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            for _ in range(16):
                if transpose:
                    nisa.dma_transpose(dst=u, src=t)
                else:
                    nisa.dma_copy(dst=u, src=t)
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=u)
            return out

        return k

    copy, tr = tn.run(kernel(False), x), tn.run(kernel(True), x)
    assert np.array_equal(_bits(tr.outputs), _bits(x.T))
    assert tr.report.seconds > copy.report.seconds


@pytest.mark.parametrize(
    "case, arg, error",
    [
        ("fp8", "src", FormatError),
        ("dtypes", "dst", FormatError),
        ("shape", "dst", ShapeError),
        ("axes", "axes", Trn2Error),
        ("dge", "dge_mode", Trn2Error),
        ("hwdge", "src", FormatError),
        ("in_place", "dst", Trn2Error),
        ("psum", "src", Trn2Error),
        ("five", "src", ShapeError),
    ],
)
def test_dma_transpose_rules_name_the_argument_at_the_kernels_line(case, arg, error):
    @tn.jit
    def k(x):
        p, f = x.shape
        t = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        u = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.sbuf)
        if case == "fp8":
            a = nl.ndarray((p, f), dtype=nl.float8_e4m3, buffer=nl.sbuf)
            b = nl.ndarray((f, p), dtype=nl.float8_e4m3, buffer=nl.sbuf)
            nisa.tensor_copy(dst=a, src=t)
            nisa.dma_transpose(dst=b, src=a)  # case fp8
        elif case == "dtypes":
            b = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_transpose(dst=b, src=t)  # case dtypes
        elif case == "shape":
            nisa.dma_transpose(dst=u[:, : p // 2], src=t)  # case shape
        elif case == "axes":
            nisa.dma_transpose(dst=u, src=t, axes=(0, 1))  # case axes
        elif case == "dge":
            nisa.dma_transpose(dst=u, src=t, dge_mode=nisa.dge_mode.swdge)  # case dge
        elif case == "hwdge":
            a = nl.ndarray((p, f), dtype=nl.float32, buffer=nl.sbuf)
            b = nl.ndarray((f, p), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=a, src=t)
            nisa.dma_transpose(dst=b, src=a, dge_mode=nisa.dge_mode.hwdge)  # case hwdge
        elif case == "in_place":
            nisa.dma_transpose(dst=t[:, :p], src=t[:, :p])  # case in_place
        elif case == "psum":
            ps = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.psum)
            nisa.tensor_copy(dst=ps, src=t)
            nisa.dma_transpose(dst=u, src=ps)  # case psum
        else:
            five = t.ap([[f, p], [1, 1], [1, 1], [1, 1], [1, f]])
            nisa.dma_transpose(dst=u, src=five)  # case five
        return x

    x = _awkward_bf16(16, 16)
    with pytest.raises(error) as info:
        tn.run(k, x)
    assert info.value.arg == arg, str(info.value)
    _at(info, k, f"# case {case}")


@pytest.mark.parametrize("mode", ["number", "enum"])
def test_dma_transpose_dge_mode_none_moves_float32_bits_as_unknown_does(mode):
    # nki-library's mlp_tkg (ROW quantization without column tiling, as its Trn2 tests run it)
    # loads its float32 scales [tiles, 128] transposed through a 4-D `.ap` with dge_mode=3,
    # "none" (no DGE): the transpose as with unknown, 4-byte elements included (the hardware
    # DGE's 2-byte limit is not applied). A number that is no dge_mode names the argument.
    x = np.arange(3 * 128, dtype=np.float32).reshape(3, 128) * np.float32(-0.37)
    x.reshape(-1).view(np.uint32)[::5] = 0x7FC00123  # NaN payloads, kept bit for bit
    dge = 3 if mode == "number" else nisa.dge_mode.none

    @tn.jit
    def k(x):
        n, d = x.shape
        t = nl.ndarray((d, n), dtype=x.dtype, buffer=nl.sbuf)
        src = x.ap([[d, n], [1, 1], [1, 1], [1, d]], offset=0)  # [n, 1, 1, d]
        nisa.dma_transpose(dst=t.ap([[n, d], [1, 1], [1, 1], [1, n]]), src=src, dge_mode=dge)
        out = nl.ndarray((d, n), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    assert np.array_equal(_bits(tn.run(k, x).outputs), _bits(x.T))

    @tn.jit
    def bad(x):
        n, d = x.shape
        t = nl.ndarray((d, n), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=x, dge_mode=7 if mode == "number" else "none")  # bad
        return x

    with pytest.raises(Trn2Error) as info:
        tn.run(bad, x)
    assert info.value.arg == "dge_mode", str(info.value)
    _at(info, bad, "# bad")


@pytest.mark.parametrize("view", ["index", "ap", "reshape"])
def test_matmul_accumulate_none_starts_anew_in_each_tensor_placed_on_the_same_psum_bytes(view):
    # nki-library's attention_cte declares each query group's PSUM tile with address= at the
    # same bank: "first write overwrites, later ones accumulate" is per tensor, not per byte.
    # Its attention_tkg does so per batch and writes each matmul through a TensorView (an .ap()
    # view) of the tile: a view of the placed tensor is that tensor.
    a = _rand(32, 16)
    b = _rand(32, 8, seed=1)

    @tn.jit
    def k(a, b):
        sa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sa, src=a)
        nisa.dma_copy(dst=sb, src=b)
        out = nl.ndarray((3, 16, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        for g in range(3):
            p = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum, address=(0, 0))
            for i in range(2):
                for _ in range(g + 1):  # group g accumulates g + 1 products in each block
                    if view == "ap":
                        dst = p.ap([[16, 16], [1, 8]], offset=8 * i)
                    elif view == "reshape":
                        dst = p.reshape((16, 2, 8))[:, i, :]
                    else:
                        dst = p[:, 8 * i : 8 * i + 8]
                    nisa.nc_matmul(dst=dst, stationary=sa, moving=sb)
            s = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=s, src=p)
            nisa.dma_copy(dst=out[g], src=s)
        return out

    got = tn.run(k, a, b).outputs
    one = a.T.astype(np.float64) @ b.astype(np.float64)
    for g in range(3):  # not 1, 3 and 6 products: each tensor starts anew
        want = np.concatenate([one, one], axis=1) * (g + 1)
        assert np.allclose(got[g], want, rtol=1e-5, atol=1e-4), g


def test_dma_compute_adds_its_sources_in_float32_and_rounds_once():
    # nki-library's qkv and mlp fused residual add: dst = hidden + attn_prev + mlp_prev over a
    # DMA, HBM to HBM (flattened [1, N] views) and HBM to an SBUF tile (.ap views). The sum is
    # float32, in order, rounded once to dst's dtype: three bf16 values whose bf16 partial sum
    # would round differently.
    bf16 = ml_dtypes.bfloat16
    a, b, c = (_rand(4, 256, seed=s).astype(bf16) for s in (1, 2, 3))
    a[0, :3] = np.array([1.0, 256.0, -0.0], np.float32).astype(bf16)
    b[0, :3] = np.array([2.0**-8, 1.0, -0.0], np.float32).astype(bf16)
    c[0, :3] = np.array([2.0**-8, 2.0**-9, -0.0], np.float32).astype(bf16)
    a[1, 0] = np.float32(np.nan).astype(bf16)

    @tn.jit
    def k(a, b, c):
        n, h = a.shape
        flat = nl.ndarray((n, h), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(
            flat.reshape((1, n * h)),
            (a.reshape((1, n * h)), b.reshape((1, n * h)), c.reshape((1, n * h))),
            scales=(1.0, 1.0, 1.0),
            reduce_op=nl.add,
        )
        t = nl.ndarray((n, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_compute(dst=t, srcs=[a.ap([[h, n], [1, h]], offset=0), b], reduce_op=nl.add)
        wide = nl.ndarray((n, h), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=wide, src=t)
        return flat, wide

    flat, wide = tn.run(k, a, b, c).outputs
    f32 = [x.astype(np.float32) for x in (a, b, c)]
    want = ((f32[0] + f32[1]) + f32[2]).astype(bf16)
    assert np.array_equal(flat.view(np.uint16), want.view(np.uint16))  # NaN: canonical 0x7FC0
    assert float(flat[0, 0]) == 1.0 + 2.0**-7  # not 1.0, as bf16 partial sums would give
    assert np.signbit(flat[0, 2].astype(np.float32)) and np.isnan(flat[1, 0].astype(np.float32))
    assert np.array_equal(wide, f32[0] + f32[1], equal_nan=True)


def _rmw_kernel(case=""):
    """nki-library's experimental topk_reduce: rows of an HBM tensor gathered by a [P, 1] index
    tile and added into an SBUF accumulator by dma_compute (gather read-modify-write), and our
    scatter form: an SBUF tile added into the indexed HBM rows."""

    def k(x, acc, idx):
        n, h = idx.shape[0], x.shape[1]
        i = nl.ndarray((n, 1), dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        t = nl.ndarray((n, h), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=acc)
        rows = x.ap([[h, n], [1, h]], offset=0, vector_offset=i, indirect_dim=0)
        srcs = [rows, t[:, :]] if case != "count" else [rows, t, t]
        unique = case != "unique"
        oob = nisa.oob_mode.skip if case == "skip" else nisa.oob_mode.error
        nisa.dma_compute(t[:, :], srcs, nl.add, unique_indices=unique, oob_mode=oob)  # rmw
        out = nl.ndarray((n, h), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        dst = x.ap([[h, n], [1, h]], offset=0, vector_offset=i, indirect_dim=0)
        nisa.dma_compute(dst=dst, srcs=[t, dst], reduce_op=nl.add, oob_mode=nisa.oob_mode.skip)
        return out

    return k


def test_dma_compute_gathers_and_scatters_rows_by_vector_offset():
    bf16 = ml_dtypes.bfloat16
    x = _rand(20, 32).astype(bf16)
    acc = _rand(8, 32, seed=1)
    # A run of evenly stepped indices and single rows.
    idx = np.array([3, 5, 7, 9, 0, 19, 12, 11], np.uint32)[:, None]
    x0 = x.copy()
    got = tn.run(tn.jit(_rmw_kernel()), x, acc, idx).outputs
    want = x0[idx[:, 0]].astype(np.float32) + acc
    assert np.array_equal(got, want)
    back = x0.copy()
    back[idx[:, 0]] = (x0[idx[:, 0]].astype(np.float32) + want).astype(bf16)
    assert np.array_equal(x.view(np.uint16), back.view(np.uint16))  # written back
    # The ISA reference's rules for the read-modify-write forms.
    for case, arg in (("count", "srcs"), ("unique", "unique_indices")):
        k = _rmw_kernel(case)
        with pytest.raises(Trn2Error, match="read-modify-write") as info:
            tn.run(tn.jit(k), x0.copy(), acc, idx)
        assert (info.value.arg, info.value.rule) == (arg, "dma_compute_rmw"), str(info.value)
        _at(info, k, "# rmw")
    bad = idx.copy()
    bad[2, 0] = 20
    with pytest.raises(tn.OutOfBoundsError, match="index 20 at partition 2"):
        tn.run(tn.jit(_rmw_kernel()), x0.copy(), acc, bad)
    # oob_mode.skip: the row of an index out of bounds is left alone (gathered: acc's row).
    x = x0.copy()
    got = tn.run(tn.jit(_rmw_kernel("skip")), x, acc, bad).outputs
    assert np.array_equal(got[2], acc[2])
    assert np.array_equal(np.delete(got, 2, 0), np.delete(want, 2, 0))
    back = x0.copy()
    ok = np.delete(np.arange(8), 2)
    back[bad[ok, 0]] = (x0[bad[ok, 0]].astype(np.float32) + got[ok]).astype(bf16)
    assert np.array_equal(x.view(np.uint16), back.view(np.uint16))  # row 7 not scattered


def test_dma_copy_with_oob_skip_leaves_out_the_rows_past_a_scalar_offset_tensors_end():
    # nki-library's indexed_flatten: blocks written at a scalar_offset that may run past the
    # output's end, with oob_mode.skip; the rows inside are written, the others skipped.
    x = np.arange(8 * 4, dtype=np.int32).reshape(8, 4)

    def kernel(mode):
        def k(x, at):
            t = nl.ndarray((8, 4), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x)
            a = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=at)
            out = nl.ndarray((10, 4), dtype=nl.int32, buffer=nl.shared_hbm)
            fill = nl.ndarray((10, 4), dtype=nl.int32, buffer=nl.sbuf)
            nisa.memset(fill, -1)
            nisa.dma_copy(dst=out, src=fill)
            dst = out.ap([[4, 8], [1, 4]], offset=0, scalar_offset=a, indirect_dim=0)
            nisa.dma_copy(dst=dst, src=t, oob_mode=mode)  # oob
            return out

        return k

    skip = kernel(nisa.oob_mode.skip)
    for at, rows in ((1, 8), (5, 5), (-3, 5), (-100, 0)):
        want = np.full((10, 4), -1, np.int32)
        for i in range(8):
            if 0 <= at + i < 10:
                want[at + i] = x[i]
        got = tn.run(tn.jit(skip), x, np.array([[at]], np.int32)).outputs
        assert np.array_equal(got, want), at
        assert (want[:, 0] >= 0).sum() == rows
    k = kernel(nisa.oob_mode.error)
    with pytest.raises(ShapeError, match="reaches bytes") as info:
        tn.run(tn.jit(k), x, np.array([[5]], np.int32))
    _at(info, k, "# oob")


def test_an_hbm_view_as_a_wider_dtype_reads_pairs_of_elements():
    # nki-library's topk_reduce reads the int32 index packed in a bf16 row's last two columns:
    # `.ap(..., dtype=nl.int32)` of a bf16 HBM tensor (the pattern and offset in int32s).
    idx = np.array([7, -1, 70000, 3], np.int32)
    rows = np.zeros((4, 10), ml_dtypes.bfloat16)
    rows[:, :8] = _rand(4, 8).astype(ml_dtypes.bfloat16)
    rows[:, 8:] = idx.reshape(4, 1).view(ml_dtypes.bfloat16)

    @tn.jit
    def k(x):
        t = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap([[5, 4], [1, 1]], offset=4, dtype=nl.int32))
        out = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    assert np.array_equal(tn.run(k, rows).outputs[:, 0], idx)


def test_dma_compute_rules_name_the_argument_at_the_kernels_line():
    x = _rand(2, 8)

    def kernel(case):
        def k(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            small = nl.ndarray((2, 4), dtype=x.dtype, buffer=nl.shared_hbm)
            if case == "op":
                nisa.dma_compute(out, [x, x], reduce_op=nl.multiply)  # m-op
            elif case == "scales":
                nisa.dma_compute(out, [x, x], reduce_op=nl.add, scales=[1.0, 2.0])  # m-scales
            elif case == "count":
                nisa.dma_compute(out, [x] * 17, reduce_op=nl.add)  # m-count
            elif case == "shape":
                nisa.dma_compute(small, [x, x], reduce_op=nl.add)  # m-shape
            else:
                nisa.dma_compute(out, x, reduce_op=nl.add)  # m-list
            return out

        return k

    for case, cls, arg, text in (
        ("op", Trn2Error, "reduce_op", "adds its sources"),
        ("scales", Trn2Error, "scales", "each 1.0"),
        ("count", Trn2Error, "srcs", "1 to 16 source tiles, got 17"),
        ("shape", ShapeError, "srcs", "dst's element count"),
        ("list", Trn2Error, "srcs", "a list of source tensors"),
    ):
        k = kernel(case)
        with pytest.raises(cls, match=text) as info:
            tn.run(tn.jit(k), x)
        assert info.value.arg == arg, (case, info.value.arg)
        _at(info, k, f"# m-{case}")


# ----------------------------------------------------------------------------- LNC=2 exchanges


def _lnc2(kernel, *args):
    return tn.run(kernel, *args, grid=2)


def _events(rep, core: int, line: int) -> list[dict]:
    """The trace events of physical core ``core`` issued at ``line`` of this file."""
    evs = json.loads(rep.cores[core].trace_json())["traceEvents"]
    at = f"{__file__}:{line}"
    return [e for e in evs if e.get("ph") == "X" and e.get("args", {}).get("line") == at]


@tn.jit
def _swap_add(x, spin):
    """Each core loads its half of ``x``, scales it by its rank + 1, swaps it with the other
    core (``sendrecv``) and stores the sum of both halves at its half. Core 1 first spins
    ``spin`` Vector instructions, so core 0 waits for it at the exchange."""
    half = x.shape[0] // 2
    pid = nl.program_id(0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid * half : (pid + 1) * half, :])
    nisa.tensor_scalar(dst=mine, data=mine, op0=nl.multiply, operand0=float(pid + 1))
    if pid == 1:
        for _ in range(spin):
            nisa.tensor_scalar(dst=mine, data=mine, op0=nl.multiply, operand0=1.0)
    got = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    nisa.tensor_tensor(dst=mine, data1=mine, data2=got, op=nl.add)
    nisa.dma_copy(dst=out[pid * half : (pid + 1) * half, :], src=mine)
    return out


def test_lnc2_sendrecv_swaps_tiles_and_joins_the_clocks():
    x = _rand(128, 64)
    a, b = x[:64], x[64:] * np.float32(2)
    res = _lnc2(_swap_add, x, 40)
    assert np.array_equal(res.outputs, np.concatenate([a + b, b + a]))
    line = _line_of(_swap_add, "nisa.sendrecv(")
    (s0,), (s1,) = _events(res.report, 0, line), _events(res.report, 1, line)
    assert s0["ts"] == s1["ts"], "both sides start the transfer at the later core's time"
    assert s0["args"]["waited_for"] == "peer" and s1["args"]["waited_for"] != "peer"
    spin = _events(res.report, 1, _line_of(_swap_add, "operand0=1.0"))
    assert len(spin) == 40 and s0["ts"] >= max(e["ts"] + e["dur"] for e in spin)
    assert res.report.cores[0].seconds == pytest.approx(res.report.cores[1].seconds, rel=0.05)
    quick = _lnc2(_swap_add, x, 0)
    assert np.array_equal(quick.outputs, res.outputs)
    assert quick.report.cores[0].seconds < res.report.cores[0].seconds  # core 0 waited
    assert res.report.opcodes["dma_copy"] == quick.report.opcodes["dma_copy"] == 6


def test_lnc2_core_barrier_shows_each_core_the_others_writes():
    @tn.jit
    def halves(x):
        half = x.shape[0] // 2
        pid = nl.program_id(0)
        shared = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[pid * half : (pid + 1) * half, :])
        nisa.dma_copy(dst=shared[pid * half : (pid + 1) * half, :], src=t)
        nisa.core_barrier(shared, (0, 1))
        other = 1 - pid  # the other core's half, read back from shared HBM
        nisa.dma_copy(dst=t, src=shared[other * half : (other + 1) * half, :])
        nisa.dma_copy(dst=out[pid * half : (pid + 1) * half, :], src=t)
        return out

    x = _rand(128, 32)
    res = _lnc2(halves, x)
    assert np.array_equal(res.outputs, np.concatenate([x[64:], x[:64]]))
    bar = _line_of(halves, "nisa.core_barrier(")
    (b0,), (b1,) = _events(res.report, 0, bar), _events(res.report, 1, bar)
    assert b0["ts"] == b1["ts"] and b0["name"] == "core_barrier"
    (load0,) = _events(res.report, 0, _line_of(halves, "src=shared[other"))
    assert load0["ts"] >= b0["ts"] + b0["dur"], "the read-back waits for the barrier"


def test_lnc2_core_barrier_on_an_sbuf_counter_orders_the_cores_and_keeps_each_its_own():
    # nki-library's hybrid moe_cte barriers on an SBUF block counter each core increments:
    # SBUF is each physical core's own, so nothing merges, but both cores meet there.
    @tn.jit
    def counters(x):
        pid = nl.program_id(0)
        out = nl.ndarray((2, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        n = nl.ndarray((1, 8), dtype=nl.int32, buffer=nl.sbuf)
        for _ in range(1 + 30 * pid):  # core 1 reaches the barrier later
            nisa.dma_copy(dst=n, src=x[pid : pid + 1, :])
        nisa.tensor_scalar(dst=n, data=n, op0=nl.add, operand0=1)
        nisa.core_barrier(n, (0, 1))
        nisa.dma_copy(dst=out[pid : pid + 1, :], src=n)  # after
        return out

    res = _lnc2(counters, np.array([[10] * 8, [20] * 8], np.int32))
    assert np.array_equal(res.outputs, np.array([[11] * 8, [21] * 8], np.int32))
    bar = _line_of(counters, "nisa.core_barrier(")
    (b0,), (b1,) = _events(res.report, 0, bar), _events(res.report, 1, bar)
    assert b0["ts"] == b1["ts"] and b0["name"] == "core_barrier", (b0, b1)
    (inc0,) = _events(res.report, 0, _line_of(counters, "nisa.tensor_scalar("))
    assert b0["ts"] > inc0["ts"] + inc0["dur"], "core 0 waited at the barrier for core 1"
    (store0,) = _events(res.report, 0, _line_of(counters, "# after"))
    assert store0["ts"] >= b0["ts"] + b0["dur"], "the counter's store waits for the barrier"


def test_lnc2_exchange_errors_name_the_kernels_line():
    @tn.jit
    def unmatched(x):
        t = nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:64, :])
        if nl.program_id(0) == 0:
            nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # alone
        return x

    x = _rand(64, 8)
    with pytest.raises(Trn2Error, match="has no match: physical core 1 ended") as info:
        _lnc2(unmatched, x)
    _at(info, unmatched, "# alone")

    @tn.jit
    def raising(x):
        t = nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:64, :])
        if nl.program_id(0) == 1:
            nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.sbuf)[0:65, :]  # out of bounds
        nisa.sendrecv(
            src=t,
            dst=t,
            send_to_rank=1 - nl.program_id(0),
            recv_from_rank=1 - nl.program_id(0),
            pipe_id=0,
        )
        return x

    with pytest.raises(Trn2Error, match="slice 0:65 of axis 0 is out of range") as info:
        _lnc2(raising, x)  # core 1's own error, not core 0's unmatched sendrecv
    _at(info, raising, "# out of bounds")
    waited = str(info.value.__context__)
    assert "has no match: physical core 1 raised OutOfBoundsError" in waited, waited
    assert waited.startswith(f"{__file__}:{_line_of(raising, 'nisa.sendrecv(')}:"), waited

    @tn.jit
    def mismatched(x):
        pid = nl.program_id(0)
        t = nl.ndarray((64, 8 - 4 * pid), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        nisa.sendrecv(src=t, dst=t, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)  # here
        return x

    with pytest.raises(
        Trn2Error, match=r"shape \(64, 8\).*does not match.*shape \(64, 4\)"
    ) as info:
        _lnc2(mismatched, x)
    _at(info, mismatched, "# here")

    @tn.jit
    def one_core(x):
        t = nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # lnc1
        return x

    with pytest.raises(Trn2Error, match="LNC=2") as info:
        tn.run(one_core, x)
    _at(info, one_core, "# lnc1")

    @tn.jit
    def barrier_one_core(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.core_barrier(out, (0, 1))  # barrier lnc1
        return out

    with pytest.raises(Trn2Error, match="LNC=2") as info:
        tn.run(barrier_one_core, x)
    _at(info, barrier_one_core, "# barrier lnc1")


def test_lnc2_exchange_argument_errors():
    x = _rand(64, 8)

    @tn.jit
    def crossed(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=1.0)
        if nl.program_id(0) == 0:
            nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # send
        else:
            nisa.core_barrier(out, (0, 1))
        return out

    with pytest.raises(
        Trn2Error, match="sendrecv on physical core 0 meets core_barrier at"
    ) as info:
        _lnc2(crossed, x)
    _at(info, crossed, "# send")

    def bad(call):
        @tn.jit
        def k(x):
            out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
            t = nl.ndarray((64, 8), dtype=x.dtype, buffer=nl.sbuf)
            wide = nl.ndarray((64, 512), dtype=x.dtype, buffer=nl.sbuf)
            nisa.memset(dst=t, value=1.0)
            nisa.memset(dst=wide, value=1.0)
            call(x, out, t, wide, 1 - nl.program_id(0))
            return out

        return k

    cases = [
        (lambda x, o, t, w, r: nisa.sendrecv(t, t, r, 1 - r, 0), "recv_from_rank: physical core"),
        (lambda x, o, t, w, r: nisa.sendrecv(x, t, r, r, 0), "src: sendrecv moves SBUF tiles"),
        (
            lambda x, o, t, w, r: nisa.sendrecv(w, w, r, r, 0, nisa.dma_engine.gpsimd_dma),
            "src: dma_engine=gpsimd_dma moves at most 1024 bytes per partition",
        ),
        (lambda x, o, t, w, r: nisa.core_barrier(o, (0,)), r"cores: only \(0, 1\)"),
        (
            lambda x, o, t, w, r: nisa.core_barrier(
                nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.psum), (0, 1)
            ),
            "data: core_barrier synchronises on a tensor in HBM .* or SBUF .*, got psum",
        ),
    ]
    for call, message in cases:
        with pytest.raises(Trn2Error, match=message) as info:
            _lnc2(bad(call), x)
        assert str(info.value).startswith(f"{__file__}:{inspect.getsourcelines(call)[1]}:")
    # Every launch above joined the other core's thread before raising.
    assert not [t for t in threading.enumerate() if t.name.startswith("trn2core-nc")]


# ----------------------------------------------------------------------------- indirect DMA


def _scatter_kernel(oob=None, case=""):
    """nki-library's router_topk scatter: each row's value to element idx[p] of a flat [N]
    HBM tensor, through `.ap(..., vector_offset=idx, indirect_dim=0)`; then a gather back."""

    def k(out, vals, idx):
        n = idx.shape[0]
        i = nl.ndarray((n, 1), dtype=idx.dtype, buffer=nl.sbuf)
        v = nl.ndarray((n, 1), dtype=vals.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        nisa.dma_copy(dst=v, src=vals)
        flat = out.reshape((out.shape[0] * out.shape[1],))
        kw = {} if oob is None else {"oob_mode": oob}
        if case == "dim":
            dst = flat.ap([[1, n], [1, 1]], offset=0, vector_offset=i, indirect_dim=1)  # c-dim
        elif case == "sbuf":
            dst = v.ap([[1, n], [1, 1]], offset=0, vector_offset=i, indirect_dim=0)  # c-sbuf
        elif case == "float":
            dst = flat.ap([[1, n], [1, 1]], offset=0, vector_offset=v, indirect_dim=0)  # c-float
        elif case == "rows":
            dst = flat.ap([[1, n + 1], [1, 1]], offset=0, vector_offset=i)  # c-rows
        else:
            dst = flat.ap([[1, n], [1, 1]], offset=0, vector_offset=i, indirect_dim=0)
        nisa.dma_copy(dst=dst, src=v, **kw)  # c-copy
        back = nl.ndarray((n, 1), dtype=vals.dtype, buffer=nl.sbuf)
        nisa.memset(dst=back, value=-1.0)  # rows skipped (oob_mode=skip) keep it
        nisa.dma_copy(dst=back, src=flat.ap([[1, n], [1, 1]], offset=0, vector_offset=i), **kw)
        got = nl.ndarray((n, 1), dtype=vals.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=got, src=back)
        return out, got

    return k


def test_dma_copy_scatters_and_gathers_rows_by_vector_offset():
    out = np.zeros((4, 8), np.float32)
    vals = np.arange(1, 7, dtype=np.float32).reshape(6, 1)
    # Runs of evenly stepped indices (one DMA each) and single rows.
    idx = np.array([[3], [5], [7], [30], [0], [17]], np.uint32)
    res = tn.run(tn.jit(_scatter_kernel()), out, vals, idx)
    got_out, got = res.outputs
    want = np.zeros(32, np.float32)
    want[idx[:, 0]] = vals[:, 0]
    assert np.array_equal(got_out.reshape(-1), want)
    assert np.array_equal(out.reshape(-1), want)  # the argument, written back
    assert np.array_equal(got, vals)

    # Rows of more than one element: a [N, 4] tensor's row idx[p] is 4 elements in.
    @tn.jit
    def rows(x, idx):
        n = idx.shape[0]
        i = nl.ndarray((n, 1), dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        t = nl.ndarray((n, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap([[4, n], [1, 4]], offset=0, vector_offset=i))
        out = nl.ndarray((n, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = _rand(10, 4)
    sel = np.array([[9], [2], [4], [6], [0]], np.int32)
    assert np.array_equal(tn.run(rows, x, sel).outputs, x[sel[:, 0]])


def test_dma_copy_vector_offset_out_of_bounds_and_argument_errors():
    out = np.zeros((4, 8), np.float32)
    vals = np.arange(1, 4, dtype=np.float32).reshape(3, 1)
    idx = np.array([[3], [32], [1]], np.uint32)
    k = _scatter_kernel()
    with pytest.raises(tn.OutOfBoundsError, match=r"index 32 at partition 1 .* 32 rows") as info:
        tn.run(tn.jit(k), out, vals, idx)
    _at(info, k, "# c-copy")
    # oob_mode=skip: the row whose index is outside is not copied.
    out = np.zeros((4, 8), np.float32)
    got_out, got = tn.run(tn.jit(_scatter_kernel(nisa.oob_mode.skip)), out, vals, idx).outputs
    want = np.zeros(32, np.float32)
    want[[3, 1]] = [1.0, 3.0]
    assert np.array_equal(got_out.reshape(-1), want)
    assert np.array_equal(got[:, 0], [1.0, -1.0, 3.0])
    idx = np.array([[3], [2], [1]], np.uint32)
    for case, cls, arg in (
        ("dim", Trn2Error, "indirect_dim"),
        ("sbuf", tn.NotSupportedError, None),
        ("float", Trn2Error, "vector_offset"),
        ("rows", ShapeError, "vector_offset"),
    ):
        k = _scatter_kernel(case=case)
        with pytest.raises(cls) as info:
            tn.run(tn.jit(k), np.zeros((4, 8), np.float32), vals, idx)
        assert getattr(info.value, "arg", None) == arg, (case, str(info.value))
        _at(info, k, f"# c-{case}")


def _gather_transpose_kernel(case=""):
    """nki-library's attention_tkg block KV cache: the blocks a [P, 1] uint32 index tile names
    (rows of a [N, 1, L, D] HBM tensor) gathered and transposed into [D, 1, L, P] SBUF by one
    indirect `dma_transpose` (`.ap(..., vector_offset=idx, indirect_dim=0)`, swdge); and the
    2-D form, rows of [N, D] into [D, P]."""

    def k(x, x2, idx):
        n = idx.shape[0]
        i = nl.ndarray((n, 1), dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        _, _, ln, d = x.shape
        t = nl.ndarray((d, 1, ln, n), dtype=x.dtype, buffer=nl.sbuf)
        pat = [[ln * d, n], [1, 1], [d, ln], [1, d]]
        if case == "wide":  # axes 1 and 2 both over 1
            pat = [[ln * d, n], [d, ln], [d // 2, 2], [1, d // 2]]
        src = x.ap(pat, offset=0, vector_offset=i, indirect_dim=0)
        mode = nisa.dge_mode.hwdge if case == "hwdge" else nisa.dge_mode.swdge
        nisa.dma_transpose(dst=t, src=src, axes=(3, 1, 2, 0), dge_mode=mode)  # g-4d
        t2 = nl.ndarray((x2.shape[1], n), dtype=x2.dtype, buffer=nl.sbuf)
        src2 = x2.ap([[x2.shape[1], n], [1, x2.shape[1]]], offset=0, vector_offset=i)
        nisa.dma_transpose(dst=t2, src=src2)  # g-2d
        out = nl.ndarray(t.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray(t2.shape, dtype=x2.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        nisa.dma_copy(dst=out2, src=t2)
        return out, out2

    return k


def test_dma_transpose_gathers_rows_by_vector_offset():
    bf16 = ml_dtypes.bfloat16
    x = _rand(40, 1, 3, 8).astype(bf16)
    x2 = _rand(40, 24, seed=1).astype(bf16)
    # Runs of evenly stepped indices (one transpose each) and single rows.
    idx = np.array([5, 6, 7, 8, 39, 0, 12, 30, 20, 10, 1, 2, 3, 33, 34, 9], np.uint32)[:, None]
    got, got2 = tn.run(tn.jit(_gather_transpose_kernel()), x, x2, idx).outputs
    want = x[idx[:, 0]].transpose(3, 1, 2, 0)
    assert got.dtype == bf16 and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(got2.view(np.uint16), x2[idx[:, 0]].T.view(np.uint16))
    assert got[2, 0, 1, 4] == x[39, 0, 1, 2]  # partition p of the tile is block idx[p]
    # The ISA reference's rules for the indirect form.
    k = _gather_transpose_kernel("hwdge")
    with pytest.raises(Trn2Error, match="indirect dma_transpose .* unknown or swdge") as info:
        tn.run(tn.jit(k), x, x2, idx)
    assert info.value.arg == "dge_mode"
    _at(info, k, "# g-4d")
    k = _gather_transpose_kernel()
    for xs, ids, arg, rule in (
        ((x.astype(np.float32), x2), idx, "src", "dma_transpose_dtype"),  # 4-byte elements
        ((x, x2), idx[:8], "src", "dma_transpose_shape"),  # 8 rows, not a multiple of 16
        ((x, x2), idx.astype(np.int32), "vector_offset", "dma_transpose_indices"),
        ("wide", idx, "src", "dma_transpose_shape"),  # [16, 3, 2, 4]
    ):
        kk = _gather_transpose_kernel(xs) if xs == "wide" else k
        with pytest.raises(Trn2Error) as info:
            tn.run(tn.jit(kk), *((x, x2) if xs == "wide" else xs), ids)
        assert (info.value.arg, info.value.rule) == (arg, rule), str(info.value)
        _at(info, kk, "# g-4d")
    bad = idx.copy()
    bad[3, 0] = 40
    with pytest.raises(tn.OutOfBoundsError, match="index 40 at partition 3"):
        tn.run(tn.jit(k), x, x2, bad)


def test_lnc2_an_argument_the_kernel_returns_holds_both_cores_stores():
    # nki-library's router_topk, sharded on tokens, writes each core's rows of the output
    # arrays it is given, and a caller returns those arguments: both cores' rows come back.
    @tn.jit
    def k(x, out):
        half = x.shape[0] // 2
        pid = nl.program_id(0)
        t = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[pid * half : (pid + 1) * half, :])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[pid * half : (pid + 1) * half, :], src=t)
        return out

    x = _rand(8, 4)
    out = np.zeros_like(x)
    got = tn.run(k, x, out, grid=2).outputs
    assert np.array_equal(got, 2 * x)
    assert np.array_equal(out, 2 * x)


# ----------------------------------------------------------------------------- moe_tkg


def test_explicit_placement_from_address_zero_stays_clear_of_automatic_tensors():
    # nki-library's all-expert moe_tkg places its tensors with SbufManager(0, 200000) and
    # also takes nl.shared_identity_matrix (placed by the compiler): the front end places its
    # own from the top of SBUF down, so a placement counting from address 0 does not meet it.
    ncc = _ncc()

    @tn.jit
    def current(x):
        ident = nl.shared_identity_matrix(32, dtype=nl.float32)
        auto = nl.ndarray((32, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=auto, value=3.0)
        placed = nl.ndarray((32, 40_000), dtype=x.dtype, buffer=nl.sbuf, address=(0, 0))
        nisa.memset(dst=placed, value=1.0)
        nisa.dma_copy(dst=placed[:, 0:64], src=x)
        s = nl.ndarray((32, 64), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=placed[:, 0:64], data2=auto, op=nl.add)
        nisa.tensor_tensor(dst=s[:, 0:32], data1=s[:, 0:32], data2=ident, op=nl.add)
        out = nl.ndarray((32, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=s)
        return out

    @tn.jit_legacy
    def legacy(x):
        auto = lnl.full((32, 64), 3.0, dtype=x.dtype)
        placed = lnl.ndarray(
            (lnl.par_dim(32), 40_000), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=0)
        )
        placed[:, 0:64] = lnl.load(x)
        out = lnl.ndarray((32, 64), dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=lnl.add(placed[:, 0:64], auto))
        return out

    x = _rand(32, 64)
    want = x + 3.0
    want[:, :32] += np.eye(32, dtype=np.float32)
    assert np.array_equal(current(x), want)
    assert np.array_equal(legacy(x), x + 3.0)


def test_a_tensor_is_true_as_an_object_and_a_comparison_has_no_truth_value():
    # nki-library's mlp_tkg_constants.py tests an optional tensor with `if expert_index:`.
    def k(x, opt, case):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if opt:  # a tensor: taken
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        if case == "compare" and t > 0.0:  # c-compare
            pass
        nisa.dma_copy(dst=out, src=t)
        return out

    x = _rand(8, 4)
    assert np.array_equal(tn.run(tn.jit(k), x, x, "").outputs, 2 * x)
    with pytest.raises(Trn2Error, match="a comparison of tensors has no Python truth") as info:
        tn.run(tn.jit(k), x, x, "compare")
    _at(info, k, "# c-compare")

    def legacy(x, case):
        t = lnl.load(x)
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        if t:
            lnl.store(out, value=t)
        if case == "compare" and lnl.greater(t, 0.0):  # l-compare
            pass
        return out

    assert np.array_equal(tn.run(tn.jit_legacy(legacy), x, "").outputs, x)
    with pytest.raises(Trn2Error, match="a comparison of tensors has no Python truth") as info:
        tn.run(tn.jit_legacy(legacy), x, "compare")
    _at(info, legacy, "# l-compare")


def test_scalar_tensor_tensor_widens_a_bf16_operand0_tile():
    # nki-library's moe_cte (shard on I) scales each block's down projection by the tokens'
    # affinities with scalar_tensor_tensor, the [P, 1] operand0 in bf16: the Vector engine
    # casts its inputs to float32 (tensor_scalar's operands alone must be float32).
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 16, 8)).astype(np.float32)
    s = rng.standard_normal((16, 1)).astype(ml_dtypes.bfloat16)
    want = x * s.astype(np.float32) + y

    @tn.jit
    def current(x, s, y):
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        b = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.sbuf)
        c = nl.ndarray(s.shape, dtype=s.dtype, buffer=nl.sbuf)
        for t, src in ((a, x), (b, y), (c, s)):
            nisa.dma_copy(dst=t, src=src)
        nisa.scalar_tensor_tensor(
            dst=a, data=a, op0=nl.multiply, operand0=c, op1=nl.add, operand1=b
        )
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        return out

    @tn.jit_legacy
    def legacy(x, s, y):
        r = lisa.scalar_tensor_tensor(
            data=lnl.load(x), op0=np.multiply, operand0=lnl.load(s), op1=np.add,
            operand1=lnl.load(y),
        )  # fmt: skip
        out = lnl.ndarray(x.shape, dtype=x.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, value=r)
        return out

    assert np.array_equal(current(x, s, y), want)
    assert np.array_equal(legacy(x, s, y), want)


# ----------------------------------------------------------------------------- loop_reduce
# nki-samples' contributed matmul and pipelined attention, and the reference attention
# backward, reduce a PSUM result across loop iterations with nl.loop_reduce into the tile it
# is assigned to ("the destination tile is also the rhs input to op"; the NKI docs give it as
# `b = nisa.tensor_tensor(data1=b, data2=a, op=op)`).


def test_loop_reduce_adds_each_block_into_its_destination_across_affine_range():
    @tn.jit_legacy
    def blocked(a, b):  # the contributed matmul's shape: K in blocks, Z kept in SBUF
        kb, m, n = a.shape[0] // 256, a.shape[1], b.shape[1]
        out = lnl.ndarray((m, n), dtype=nl.float32, buffer=lnl.shared_hbm)
        z = lnl.zeros((lnl.par_dim(m), n), dtype=nl.float32, buffer=lnl.sbuf)
        for k2 in lnl.affine_range(kb):
            zp = lnl.zeros((m, n), dtype=nl.float32, buffer=lnl.psum)
            for k1 in lnl.affine_range(2):
                k0 = k2 * 256 + k1 * 128
                zp += lisa.nc_matmul(lnl.load(a[k0 : k0 + 128, :]), lnl.load(b[k0 : k0 + 128, :]))
            z[:, :] = lnl.loop_reduce(zp, op=np.add, loop_indices=[k2], dtype=nl.float32)
        lnl.store(out, value=z)
        return out

    a = np.round(_rand(768, 64, seed=3))  # integers: every sum exact
    b = np.round(_rand(768, 96, seed=4))
    assert np.array_equal(blocked(a, b), (a.T.astype(np.float64) @ b).astype(np.float32))


def test_loop_reduce_takes_the_destination_as_data1_and_crosses_affine_range_only_if_associative():
    def body(loop):
        def k(x):
            out = lnl.ndarray((128, 32), dtype=nl.float32, buffer=lnl.shared_hbm)
            acc = lnl.full((128, 32), 100.0, dtype=nl.float32, buffer=lnl.sbuf)
            for i in loop(x.shape[0]):
                acc[...] = lnl.loop_reduce(lnl.load(x[i]), np.subtract, i)  # SUB
            lnl.store(out, value=acc)
            return out

        return k

    x = np.round(_rand(3, 128, 32, seed=5))
    want = np.float32(100.0) - x[0] - x[1] - x[2]  # acc - x each step, not x - acc
    assert np.array_equal(tn.run(tn.jit_legacy(body(lnl.sequential_range)), x).outputs, want)
    with pytest.raises(tn.LoopCarriedDependencyError, match=r"\[rule affine_range\]") as info:
        tn.run(tn.jit_legacy(body(lnl.affine_range)), x)
    _at(info, body(lnl.affine_range), "# SUB")


def test_loop_reduce_bound_to_a_name_rebinds_it_to_a_new_tile_in_both_dialects():
    """``b = nl.loop_reduce(x, ...)`` is ``b = nisa.tensor_tensor(data1=b, data2=x)``: the
    reduction lands in a new tile; a tensor ``b`` was a view of is unchanged."""
    x = _rand(4, 128, 48, seed=6)

    @tn.jit_legacy
    def view(x):
        out = lnl.ndarray((2, 128, 48), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.full((128, 96), 1.0, dtype=nl.float32, buffer=lnl.sbuf)
        b = acc[:, 0:48]
        for i in lnl.affine_range(x.shape[0]):
            b = lnl.loop_reduce(lnl.load(x[i]), np.add, i)
        lnl.store(out[0], value=b)
        lnl.store(out[1], value=acc[:, 0:48])
        return out

    got = view(x)
    assert np.array_equal(got[1], np.ones((128, 48), np.float32)), "acc unchanged"
    want = np.ones((128, 48), np.float32)
    for i in range(4):
        want = want + x[i]
    assert np.array_equal(got[0], want)

    @tn.jit_legacy
    def legacy(x):
        out = lnl.ndarray((128, 48), dtype=nl.float32, buffer=lnl.shared_hbm)
        m = lnl.full((128, 48), -1e30, dtype=nl.float32, buffer=lnl.sbuf)
        for i in lnl.affine_range(x.shape[0]):
            m = lnl.loop_reduce(lnl.load(x[i]), op=np.maximum, loop_indices=[i])
        lnl.store(out, value=m)
        return out

    @tn.jit
    def current(x):
        out = nl.ndarray((128, 48), dtype=nl.float32, buffer=nl.shared_hbm)
        m = nl.ndarray((128, 48), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.ndarray((128, 48), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=m, src=x[0])
        for i in range(1, x.shape[0]):
            nisa.dma_copy(dst=t, src=x[i])
            m = nl.loop_reduce(t, nl.maximum, i)
        nisa.dma_copy(dst=out, src=m)
        return out

    assert np.array_equal(legacy(x), x.max(axis=0))
    assert np.array_equal(current(x), x.max(axis=0))


def test_loop_reduce_in_another_dtype_rounds_then_converts_and_honours_a_mask():
    x = _rand(3, 128, 16, seed=7)

    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((128, 16), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.zeros((128, 16), dtype=nl.float32, buffer=lnl.sbuf)
        i_p = lnl.arange(128)[:, None]
        i_f = lnl.arange(16)[None, :]
        for i in lnl.sequential_range(x.shape[0]):
            acc[i_p, i_f] = lnl.loop_reduce(
                lnl.load(x[i]), np.add, [i], dtype=nl.bfloat16, mask=(i_p < 100)
            )
        lnl.store(out, value=acc)
        return out

    want = np.zeros((128, 16), np.float32)
    for i in range(3):  # each step: add in float32, round to bf16, widen back on the store
        s = ref.tensor_tensor(want[:100], x[i, :100], "add", "bf16")
        want[:100] = np.asarray(s, dtype=np.float32)
    assert np.array_equal(k(x), want)
    assert not np.array_equal(want[:100], (x[0] + x[1] + x[2])[:100])  # the rounding shows


def _reducing(width=8, op=np.add, idx=0, hbm=False, **kw):
    """A kernel reducing its input into a [128, width] tile with nl.loop_reduce, one argument
    made wrong."""

    def k(x):
        acc = lnl.zeros((128, width), dtype=nl.float32, buffer=lnl.sbuf)
        acc[...] = lnl.loop_reduce(x if hbm else lnl.load(x), op, idx, **kw)  # CALL
        return x

    return k


def test_loop_reduce_misuse_is_an_error_at_its_line():
    def unassigned(x):
        out = lnl.ndarray((128, 8), dtype=nl.float32, buffer=lnl.shared_hbm)
        lnl.store(out, value=lnl.loop_reduce(lnl.load(x), np.add, 0))  # CALL
        return out

    x = np.ones((128, 8), np.float32)
    for fn, cls, text in (
        (unassigned, Trn2Error, "loop_reduce: its result is the tile it reduces into"),
        (_reducing(op=lnl.exp), Trn2Error, "op: .*not an ALU operator"),
        (_reducing(idx="k"), Trn2Error, "loop_indices: expected a loop index"),
        (_reducing(hbm=True), Trn2Error, "x: the tensor is in HBM"),
        (_reducing(width=16), ShapeError, r"cannot broadcast \(128, 8\) to \(128, 16\)"),
        (_reducing(dtype="f64"), FormatError, "dtype: 'f64' is not a dtype"),
    ):
        with pytest.raises(cls, match=text) as info:
            tn.run(tn.jit_legacy(fn), x)
        _at(info, fn, "# CALL")


# ------------------------------------------------- masks as indices, reinterpreting views


def _refused_at(fn, marker: str, cls, text: str, *args, legacy: bool = True) -> None:
    """Running kernel ``fn`` raises ``cls`` matching ``text`` at its line holding ``marker``."""
    with pytest.raises(cls, match=text) as info:
        tn.run((tn.jit_legacy if legacy else tn.jit)(fn), *args)
    _at(info, fn, marker)


def test_a_mask_as_an_index_restricts_the_region_a_matmul_reads_and_writes():
    # nki-samples' reference rmsnorm_quant broadcasts its last, partial gamma tile through the
    # PE as nc_matmul(ones, gamma[i, j][mask]): the view reaches past the tensor, the mask
    # keeps it inside; the result holds the masked columns only.
    g = np.arange(640, dtype=np.float32).reshape(1, 640)

    @tn.jit_legacy
    def k(g):
        out = lnl.ndarray((128, 640), dtype=nl.float32, buffer=lnl.shared_hbm)
        seen = lnl.ndarray((128, 512), dtype=nl.float32, buffer=lnl.shared_hbm)
        gs = lnl.ndarray((1, 640), dtype=nl.float32, buffer=lnl.sbuf)
        pg, fg = lnl.mgrid[0:1, 0:640]
        lisa.dma_copy(dst=gs[pg, fg], src=g[pg, fg])
        ones = lnl.ndarray((1, 128), dtype=nl.float32, buffer=lnl.sbuf)
        ones[...] = 1.0
        po, fo = lnl.mgrid[0:1, 0:128]
        pt, ft = lnl.mgrid[0:128, 0:512]
        p1, f1 = lnl.mgrid[0:1, 0:512]
        res = lnl.ndarray((128, 640), dtype=nl.float32, buffer=lnl.sbuf)
        last = lnl.ndarray((128, 512), dtype=nl.float32, buffer=lnl.sbuf)
        for t in lnl.sequential_range(2):
            gi = t * 512 + f1
            ps = lnl.ndarray((128, 512), nl.float32, buffer=lnl.psum)
            ps[pt, ft] = lisa.memset((128, 512), -1.0, nl.float32)
            ps[pt, ft] = lisa.nc_matmul(ones[po, fo], gs[p1, gi][gi < 640])
            res[pt, t * 512 + ft] = lisa.tensor_copy(ps[pt, ft], mask=(t * 512 + ft < 640))
            last[pt, ft] = lisa.tensor_copy(ps[pt, ft])
        lnl.store(out, res)
        lnl.store(seen, last)
        return out, seen

    out, seen = k(g)
    assert np.array_equal(out, np.broadcast_to(g, (128, 640)))
    # The last tile's matmul wrote its 128 valid columns only.
    assert np.array_equal(seen[:, :128], np.broadcast_to(g[:, 512:], (128, 128)))
    assert np.all(seen[:, 128:] == -1.0)


def test_a_masked_operand_limits_the_matmuls_rows_and_contraction():
    a = _rand(4, 128, seed=1)
    b = _rand(4, 512, seed=2)

    @tn.jit_legacy
    def k(a, b):
        out = lnl.ndarray((2, 128, 512), dtype=nl.float32, buffer=lnl.shared_hbm)
        sa, sb = lnl.load(a), lnl.load(b)
        pk, fm = lnl.mgrid[0:4, 0:128]
        pk2, fn = lnl.mgrid[0:4, 0:512]
        pt, ft = lnl.mgrid[0:128, 0:512]
        for i in lnl.static_range(2):
            ps = lnl.ndarray((128, 512), nl.float32, buffer=lnl.psum)
            ps[pt, ft] = lisa.memset((128, 512), 7.0, nl.float32)
            if i == 0:  # the stationary's first 64 columns: the result's first 64 rows
                ps[pt, ft] = lisa.nc_matmul(sa[pk, fm][fm < 64], sb[pk2, fn])
            else:  # the moving's first 2 partitions: a contraction over 2 rows
                ps[pt, ft] = lisa.nc_matmul(sa[pk, fm], sb[pk2, fn][pk2 < 2])
            lnl.store(out[i], lisa.tensor_copy(ps))
        return out

    out = k(a, b)
    full = ref.gemm(a.T, b)
    assert np.array_equal(out[0, :64], full[:64]) and np.all(out[0, 64:] == 7.0)
    assert np.array_equal(out[1], ref.gemm(a[:2].T, b[:2]))
    assert not np.array_equal(out[1], full)


def test_a_mask_index_errors():
    x = np.ones((128, 8), np.float32)

    def outside(x):
        t = lnl.load(x)
        i, j, k3 = lnl.mgrid[0:128, 0:8, 0:2]
        u = t[k3 < 1]  # MASK
        return u

    _refused_at(outside, "# MASK", Trn2Error, r"index: the mask restricts grid axis 2", x)

    def unmasked(x):
        out = lnl.ndarray((128, 8), dtype=nl.float32, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        ones = lnl.ndarray((128, 128), dtype=nl.float32, buffer=lnl.sbuf)
        ones[...] = 1.0
        p, f = lnl.mgrid[0:128, 0:8]
        lnl.store(out, lisa.nc_matmul(ones, t[p, f + 4]))  # OOB
        return out

    _refused_at(unmasked, "# OOB", Trn2Error, r"axis 1 reaches 11, outside size 8", x)


def test_assigning_through_a_mask_index_writes_where_the_mask_holds():
    x = _rand(128, 8, seed=6)

    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((128, 8), dtype=nl.float32, buffer=lnl.shared_hbm)
        i, j = lnl.mgrid[0:128, 0:8]
        t = lnl.load(x)
        u = lnl.ndarray((128, 8), dtype=nl.float32, buffer=lnl.sbuf)
        u[...] = -1.0
        u[i, j][j < 4] = t  # a tile: its masked part copied
        u[i, j][(i < 3) & (j >= 6)] = 5.0  # a number: a memset of the region
        lnl.store(out, u)
        return out

    out = k(x)
    want = np.full((128, 8), -1.0, np.float32)
    want[:, :4] = x[:, :4]
    want[:3, 6:] = 5.0
    assert np.array_equal(out, want)


def test_an_instructions_result_through_a_mask_index_is_refused_at_its_line():
    x = np.ones((128, 8), np.float32)

    def pending(x):
        i, j = lnl.mgrid[0:128, 0:8]
        u = lnl.ndarray((128, 8), dtype=nl.float32, buffer=lnl.sbuf)
        u[i, j][j < 4] = lisa.tensor_copy(lnl.load(x))  # SET
        return x

    def inplace(x):
        i, j = lnl.mgrid[0:128, 0:8]
        u = lnl.load(x)
        u[i, j][j < 4] += 1.0  # SET
        return x

    for fn, text in ((pending, "result assigned through a mask index"),
                     (inplace, "in-place update through a mask index")):  # fmt: skip
        _refused_at(fn, "# SET", tn.NotSupportedError, text, x)


@pytest.mark.parametrize("dialect", ["current", "legacy"])
def test_view_reinterprets_a_tiles_bytes_as_another_dtype(dialect):
    x = _rand(128, 2, seed=3)
    lang, isa = (nl, nisa) if dialect == "current" else (lnl, lisa)
    jit = tn.jit if dialect == "current" else tn.jit_legacy

    @jit
    def k(x):
        out = lang.ndarray((128, 8), dtype=nl.uint8, buffer=lang.shared_hbm)
        back = lang.ndarray((128, 2), dtype=nl.float32, buffer=lang.shared_hbm)
        t = lang.ndarray((128, 2), dtype=nl.float32, buffer=lang.sbuf)
        isa.dma_copy(dst=t, src=x)
        b = t.view(nl.uint8)  # [128, 8]
        isa.dma_copy(dst=out, src=b)
        isa.dma_copy(dst=back, src=b.view(nl.float32).reinterpret_cast(nl.float32))
        return out, back

    out, back = k(x)
    assert out.shape == (128, 8) and np.array_equal(out, x.view(np.uint8))
    assert np.array_equal(back, x)


def test_view_argument_errors():
    x = np.ones((128, 3), ml_dtypes.bfloat16)
    x8 = np.ones((128, 8), np.float32)

    def odd(x):
        t = nl.ndarray((128, 3), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        return t.view(nl.float32)  # VIEW

    _refused_at(odd, "# VIEW", ShapeError, "dtype: the last axis holds 6 bytes", x, legacy=False)

    def bad(x):
        t = nl.ndarray((128, 3), dtype=nl.bfloat16, buffer=nl.sbuf)
        return t.view("f64")  # VIEW

    _refused_at(bad, "# VIEW", FormatError, "dtype: 'f64' is not a dtype", x, legacy=False)

    def wide(x):
        t = lnl.load(x)
        a, b, c, d, e, f = lnl.mgrid[0:128, 0:2, 0:2, 0:2, 0:1, 0:1]
        return t[a, b * 4 + c * 2 + d + e + f].view(nl.uint8)  # VIEW

    _refused_at(wide, "# VIEW", tn.NotSupportedError, "more than 4 free axes", x8)


def test_a_masked_reductions_per_partition_result_keeps_the_masked_partitions_only():
    # nki-samples' reference rmsnorm_quant: the last row tile's activation_reduce runs under a
    # row mask, its reduce_res an index view of another grid ([P, 1]).
    x = _rand(128, 16, seed=4)

    @tn.jit_legacy
    def k(x):
        out = lnl.ndarray((3, 128, 1), dtype=nl.float32, buffer=lnl.shared_hbm)
        t = lnl.load(x)
        pi, fi = lnl.mgrid[0:128, 0:16]
        pv, fv = lnl.mgrid[0:128, 0:1]
        for i in lnl.static_range(3):
            r = lnl.ndarray((128, 1), dtype=nl.float32, buffer=lnl.sbuf)
            r[...] = -1.0
            sq = lnl.ndarray((128, 16), dtype=nl.float32, buffer=lnl.sbuf)
            if i == 0:
                sq[pi, fi] = lisa.activation_reduce(
                    op=lnl.square, data=t[pi, fi], reduce_op=np.add, reduce_res=r[pv, fv],
                    mask=(pi < 72),
                )  # fmt: skip
            elif i == 1:
                sq[pi, fi] = lisa.activation(
                    op=lnl.square, data=t[pi, fi], reduce_op=np.add, reduce_res=r[pv, fv],
                    mask=(pi < 72),
                )  # fmt: skip
            else:
                sq[pi, fi] = lisa.tensor_scalar_reduce(
                    data=t[pi, fi], op0=np.multiply, operand0=2.0, reduce_op=np.add,
                    reduce_res=r[pv, fv], mask=(pi < 72),
                )  # fmt: skip
            lnl.store(out[i], r)
        return out

    out = k(x)
    sums = [np.zeros(72, np.float32) for _ in range(3)]
    for c in range(16):  # the float32 results added in order
        sq = x[:72, c] * x[:72, c]
        sums[0] += sq
        sums[1] += sq
        sums[2] += x[:72, c] * np.float32(2.0)
    for i in range(3):
        assert np.array_equal(out[i, :72, 0], sums[i]), i
        assert np.all(out[i, 72:] == -1.0), i


def _pipelined(**kw):
    """A legacy kernel whose affine_range iterations each read what the one before wrote
    (a hand-made pipeline, as nki-samples' contributed pipelined_attention has)."""

    def k(x):
        out = lnl.ndarray((128, 4), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.ndarray((5, lnl.par_dim(128), 4), dtype=nl.float32, buffer=lnl.sbuf)
        acc[0] = lnl.load(x)
        for i in lnl.affine_range(4, **kw):  # LOOP
            acc[i + 1] = lisa.tensor_scalar(acc[i], np.multiply, 2.0, op1=np.add, operand1=1.0)
        lnl.store(out, acc[4])
        return out

    return k


def test_affine_range_with_precise_schedule_keeps_its_iterations_in_order():
    x = _rand(128, 4, seed=5)
    want = x.copy()
    for _ in range(4):
        want = want * np.float32(2.0) + np.float32(1.0)
    assert np.array_equal(tn.run(tn.jit_legacy(_pipelined(precise_schedule=True)), x).outputs, want)
    with pytest.raises(Trn2Error, match="loop-carried dependency in affine_range"):
        tn.run(tn.jit_legacy(_pipelined()), x)
    fn = _pipelined(precise_schedule="yes")
    _refused_at(fn, "# LOOP", Trn2Error, "precise_schedule: expected True or False", x)


@pytest.mark.parametrize("dialect", ["current", "legacy"])
@pytest.mark.parametrize("idt", [np.uint32, np.int32])
def test_gather_flattened_picks_each_partitions_elements_of_its_flattened_row(dialect, idt):
    data = _rand(128, 2, 8, seed=8).astype(ml_dtypes.bfloat16)
    idx = np.random.default_rng(9).integers(0, 16, (128, 5)).astype(idt)
    lang = nl if dialect == "current" else lnl

    def k(data, idx):
        d, i = lang.load(data), lang.load(idx)
        out = lang.ndarray((128, 5), dtype=nl.bfloat16, buffer=lang.shared_hbm)
        wide = lang.ndarray((128, 5), dtype=nl.float32, buffer=lang.shared_hbm)
        lang.store(out, lang.gather_flattened(d, i))
        lang.store(wide, lang.gather_flattened(d, i, dtype=nl.float32))
        return out, wide

    jit = tn.jit if dialect == "current" else tn.jit_legacy
    out, wide = tn.run(jit(k), data, idx).outputs
    want = np.take_along_axis(data.reshape(128, 16), idx.astype(np.int64), axis=1)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert np.array_equal(wide, want.astype(np.float32))


def test_gather_flattened_errors_name_the_argument_at_the_line():
    data = _rand(128, 16, seed=8)
    good = np.zeros((128, 4), np.uint32)

    def axis(data, idx):
        return nl.gather_flattened(nl.load(data), nl.load(idx), axis=1)  # CALL

    def far(data, idx):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.gather_flattened(nl.load(data), nl.load(idx)))  # CALL
        return out

    _refused_at(axis, "# CALL", tn.NotSupportedError, "axis: .*default axis=0", data, good,
                legacy=False)  # fmt: skip
    _refused_at(far, "# CALL", Trn2Error, "indices", data, good + 16, legacy=False)


@pytest.mark.parametrize("dialect", ["current", "legacy"])
def test_rms_norm_is_x_over_its_rms_times_w_in_trn2cores_order(dialect):
    x = _rand(128, 64, seed=10).astype(ml_dtypes.bfloat16)
    w = _rand(128, 64, seed=11)
    lang = nl if dialect == "current" else lnl

    def k(x, w):
        out = lang.ndarray((128, 64), dtype=nl.bfloat16, buffer=lang.shared_hbm)
        lang.store(out, lang.rms_norm(lang.load(x), lang.load(w), axis=1, n=100, epsilon=1e-3))
        return out

    jit = tn.jit if dialect == "current" else tn.jit_legacy
    got = tn.run(jit(k), x, w).outputs
    f32 = np.float32
    xf = x.astype(f32)
    ss = np.zeros((128, 1), f32)
    for c in range(64):  # the squares' float32 sum in order
        ss += xf[:, c : c + 1] * xf[:, c : c + 1]
    t = (ss * f32(1 / 100)).astype(f32) + f32(1e-3)  # n=100: not the axis length
    inv = (1.0 / np.sqrt(t.astype(np.float64))).astype(f32)
    want = ((xf * inv) * w).astype(ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_rms_norm_refuses_what_it_does_not_take():
    x = np.ones((128, 8), np.float32)

    def shape(x):
        return nl.rms_norm(nl.load(x), nl.load(x)[:, 0:4], axis=1, n=8)  # CALL

    def count(x):
        return nl.rms_norm(nl.load(x), nl.load(x), axis=1, n=0)  # CALL

    def axis(x):
        return nl.rms_norm(nl.load(x), nl.load(x), axis=0, n=8)  # CALL

    _refused_at(shape, "# CALL", ShapeError, r"w: expected \(128, 8\)", x, legacy=False)
    _refused_at(count, "# CALL", Trn2Error, "n: a positive count", x, legacy=False)
    _refused_at(axis, "# CALL", tn.NotSupportedError, "over its free axis", x, legacy=False)


def test_atomic_rmw_adds_each_partitions_row_into_its_indexed_row_in_order():
    @tn.jit_legacy
    def k(table, idx, v):
        out = lnl.ndarray(table.shape, dtype=table.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, lnl.load(table))
        i_f = lnl.arange(8)[None, :]
        ix = lnl.load(idx)
        lnl.atomic_rmw(out[ix, i_f], value=lnl.load(v), op=np.add)  # RMW
        return out

    table = _rand(40, 8, seed=12)
    idx = np.array([3, 1, 3, 0, 39, 3] * 4, np.int32)[:, None]  # repeats accumulate
    v = _rand(24, 8, seed=13)
    want = table.copy()
    for p in range(24):  # in partition order, each add rounded to float32
        want[idx[p, 0]] = want[idx[p, 0]] + v[p]
    assert np.array_equal(k(table, idx, v), want)
    bad = idx.copy()
    bad[5, 0] = 40
    with pytest.raises(tn.OutOfBoundsError, match="holds 40 at partition 5") as info:
        k(table, bad, v)
    _at(info, k.fn, "# RMW")

    def direct(table, idx, v):
        out = lnl.ndarray(table.shape, dtype=table.dtype, buffer=lnl.shared_hbm)
        lnl.atomic_rmw(out[0:24, :], value=lnl.load(v), op=np.add)  # CALL
        return out

    def mul(table, idx, v):
        out = lnl.ndarray(table.shape, dtype=table.dtype, buffer=lnl.shared_hbm)
        ix = lnl.load(idx)
        lnl.atomic_rmw(out[ix, lnl.arange(8)[None, :]], value=lnl.load(v), op=np.multiply)  # CALL
        return out

    _refused_at(direct, "# CALL", tn.NotSupportedError, "dst: atomic_rmw updates an indirect",
                table, idx, v)  # fmt: skip
    _refused_at(mul, "# CALL", tn.NotSupportedError, "op: atomic_rmw supports np.add",
                table, idx, v)  # fmt: skip
