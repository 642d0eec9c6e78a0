"""Structured sparsity (contract section 3): prune, compress/SparseTensor, CUTLASS layout, sparse
GEMM and its timing. Oracles: ``trn2core.reference.prune`` (pure numpy, numeric comparisons),
a numpy bit packer, and a numpy transliteration of PyTorch's CUTLASS conversion."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn2core as t
from hypothesis import given, settings
from hypothesis import strategies as st
from trn2core import reference

PATTERNS = ("1:2", "2:4", "1:4", "2:8", "4:8", "4:12", "4:16")
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
FLOAT_DTYPES = [
    np.dtype(d)
    for d in (
        np.float64,
        np.float32,
        np.float16,
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e3m4,
        ml_dtypes.float8_e4m3fn,
    )
]
INT_DTYPES = [np.dtype(d) for d in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32)]


def nm(pattern: str) -> tuple[int, int]:
    n, m = pattern.split(":")
    return int(n), int(m)


def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(UINT[x.dtype.itemsize])


def boundary_array(dtype: np.dtype, shape, seed: int) -> np.ndarray:
    """Random codes (every bit pattern: NaN payloads, Inf, +-0, subnormals), mixed with a few
    repeated small magnitudes so that ties are common."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    if dtype.kind == "b":
        return rng.integers(0, 2, size).astype(bool).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        raw = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        small = rng.integers(-2 if dtype.kind == "i" else 0, 3, size).astype(dtype)
        edge = np.array([info.min, info.max, 0], dtype=dtype)[rng.integers(0, 3, size)]
        pick = rng.integers(0, 3, size)
        return np.where(pick == 0, raw, np.where(pick == 1, small, edge)).reshape(shape)
    u = UINT[dtype.itemsize]
    raw = rng.integers(0, np.iinfo(u).max, size, dtype=u, endpoint=True).view(dtype)
    small = np.array([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -2.0], dtype=np.float64)
    small = small[rng.integers(0, len(small), size)].astype(dtype)
    pick = rng.integers(0, 2, size)
    return np.where(pick == 0, raw, small).reshape(shape)


# ------------------------------------------------------------------------------- patterns


def test_patterns_are_the_contracts():
    assert t.SPARSITY_PATTERNS == PATTERNS


# ---------------------------------------------------------------------------------- prune


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES + [np.dtype(bool)], ids=str)
def test_prune_equals_the_numpy_reference(pattern, dtype):
    n, m = nm(pattern)
    for axis, shape in ((-1, (5, 3 * m)), (0, (2 * m, 7)), (1, (3, 2 * m, 4))):
        x = boundary_array(dtype, shape, seed=m * 31 + n)
        before = x.copy()
        got = t.prune(x, pattern, axis=axis)
        want = reference.prune(x, pattern, axis=axis)
        assert got.dtype == x.dtype and got.shape == x.shape
        assert np.array_equal(bits(got), bits(want)), (pattern, dtype, axis)
        assert np.array_equal(bits(x), bits(before))  # input untouched


def test_prune_rules_on_a_hand_example():
    x = np.array([[1.0, -3.0, 3.0, 0.5], [np.nan, 7.0, -np.inf, 1.0]], dtype=np.float32)
    got = t.prune(x, "2:4")
    # Row 0: |-3| ties |3|, both kept; row 1: NaN is the largest, then Inf.
    want = np.array([[0, -3.0, 3.0, 0], [np.nan, 0, -np.inf, 0]], dtype=np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    ties = t.prune(np.array([2.0, -2.0, 2.0, 2.0], dtype=np.float32), "1:4")
    assert np.array_equal(bits(ties), bits(np.array([2.0, 0, 0, 0], dtype=np.float32)))
    # Pruned elements are +0.0 (all bits zero), even where a -0.0 was.
    z = t.prune(np.array([-0.0, -0.0, 1.0, 0.0], dtype=np.float32), "1:4")
    assert bits(z).tolist() == [0, 0, 0x3F800000, 0]


def test_prune_accepts_strided_and_big_endian_inputs():
    x = boundary_array(np.dtype(np.float32), (16, 32), seed=3)
    strided = x[::2, ::2]
    assert np.array_equal(bits(t.prune(strided, "2:4")), bits(reference.prune(strided, "2:4")))
    be = x.astype(">f4")
    got = t.prune(be, "4:16")
    assert got.dtype == np.float32
    assert np.array_equal(bits(got), bits(reference.prune(x, "4:16")))
    ro = x.copy()
    ro.flags.writeable = False
    assert np.array_equal(bits(t.prune(ro, "4:8")), bits(reference.prune(x, "4:8")))


@settings(max_examples=60, deadline=None)
@given(
    pattern=st.sampled_from(PATTERNS),
    dtype=st.sampled_from(FLOAT_DTYPES),
    rows=st.integers(1, 5),
    groups=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_prune_hypothesis(pattern, dtype, rows, groups, seed):
    _, m = nm(pattern)
    x = boundary_array(dtype, (rows, groups * m), seed)
    assert np.array_equal(bits(t.prune(x, pattern)), bits(reference.prune(x, pattern)))


# ------------------------------------------------------------------------------- compress


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
def test_compress_round_trips_bit_exactly(pattern, dtype):
    n, m = nm(pattern)
    for axis, shape in ((-1, (3, 2 * m)), (0, (m, 5)), (1, (2, 3 * m, 3)), (0, (m,))):
        x = t.prune(boundary_array(dtype, shape, seed=n + m), pattern, axis=axis)
        sp = t.compress(x, pattern, axis=axis)
        assert sp.pattern == pattern and sp.shape == x.shape and sp.dtype == x.dtype
        assert sp.axis == axis % x.ndim
        vshape = list(x.shape)
        vshape[sp.axis] = x.shape[sp.axis] // m * n
        assert sp.values.shape == tuple(vshape) and sp.values.dtype == x.dtype
        b = int(np.ceil(np.log2(m)))
        assert sp.indices.dtype == np.uint8 and sp.indices.ndim == 1
        assert sp.indices.size == -(-sp.values.size * b // 8)
        assert sp.nbytes == sp.values.nbytes + sp.indices.nbytes
        out = sp.decompress()
        assert out.dtype == x.dtype and out.shape == x.shape
        assert np.array_equal(bits(out), bits(x))


def test_compress_keeps_negative_zero_and_nan_payloads():
    codes = np.array([0x80000000, 0, 0x7FC01234, 0, 0, 0xFF800001, 0, 0], dtype=np.uint32)
    x = codes.view(np.float32)
    sp = t.compress(x, "2:4")
    assert np.array_equal(bits(sp.decompress()), codes)
    with pytest.raises(t.SparsityError):
        t.compress(np.array([-0.0, -0.0, -0.0, 0.0], dtype=np.float32), "2:4")


def test_worked_example_of_the_layout():
    # docs/sparsity.md: 2:4 along the last axis of one float32 row of 8.
    x = np.array([0, 3.0, 0, -1.0, 5.0, 0, 0, 0], dtype=np.float32)
    sp = t.compress(x, "2:4")
    assert sp.values.tolist() == [3.0, -1.0, 5.0, 0.0]
    assert sp.positions.tolist() == [1, 3, 0, 1]
    assert sp.indices.tolist() == [0x4D]
    assert sp.nbytes == 17
    one = np.zeros(16, dtype=np.float32)
    one[9] = 7.0
    sp16 = t.compress(one, "4:16")
    assert sp16.positions.tolist() == [0, 1, 2, 9]
    assert sp16.indices.tolist() == [0x10, 0x92]


def numpy_positions(x: np.ndarray, pattern: str, axis: int) -> np.ndarray:
    """Positions of the stored slots, as docs/sparsity.md defines them, in numpy."""
    n, m = nm(pattern)
    moved = np.moveaxis(x, axis, -1)
    g = bits(np.ascontiguousarray(moved)).reshape(moved.shape[:-1] + (-1, m)) != 0
    out = np.zeros(g.shape[:-1] + (n,), dtype=np.uint8)
    for idx in np.ndindex(g.shape[:-1]):
        stored = [k for k in range(m) if g[idx][k]]
        free = [k for k in range(m) if not g[idx][k]]
        out[idx] = sorted(stored + free[: n - len(stored)])
    pos = out.reshape(moved.shape[:-1] + (-1,))
    return np.ascontiguousarray(np.moveaxis(pos, -1, axis))


def numpy_pack(positions: np.ndarray, b: int) -> np.ndarray:
    """LSB-first bit stream of ``b`` bits per position."""
    flat = positions.reshape(-1).astype(np.uint64)
    stream = ((flat[:, None] >> np.arange(b, dtype=np.uint64)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(stream, bitorder="little")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_packed_indices_equal_a_numpy_packer(pattern):
    _, m = nm(pattern)
    b = int(np.ceil(np.log2(m)))
    for axis in (0, 1):
        x = boundary_array(np.dtype(np.float32), (3 * m, 2 * m), seed=m)
        x = t.prune(x, pattern, axis=axis)
        # Sparser groups exercise the padding rule.
        x[np.random.default_rng(m).random(x.shape) < 0.4] = 0
        sp = t.compress(x, pattern, axis=axis)
        pos = numpy_positions(x, pattern, axis)
        assert np.array_equal(sp.positions, pos)
        assert np.array_equal(sp.indices, numpy_pack(pos, b))
        # Each value is the element at its position.
        moved = np.moveaxis(x, axis, -1).reshape(np.moveaxis(x, axis, -1).shape[:-1] + (-1, m))
        n = nm(pattern)[0]
        p = np.moveaxis(pos, axis, -1).reshape(moved.shape[:-1] + (n,))
        gathered = np.take_along_axis(moved, p.astype(np.intp), axis=-1)
        want = np.moveaxis(gathered.reshape(p.shape[:-2] + (-1,)), -1, axis)
        assert np.array_equal(bits(sp.values), bits(np.ascontiguousarray(want)))


def test_shape_errors():
    with pytest.raises(t.ShapeError, match="not a multiple of the group size 16"):
        t.prune(np.ones((4, 24), dtype=np.float32), "4:16")
    with pytest.raises(t.ShapeError):
        t.compress(np.zeros((3, 4), dtype=np.float32), "2:4", axis=0)
    with pytest.raises(t.ShapeError):
        t.prune(np.float32(1.0), "1:2")
    with pytest.raises(t.ShapeError):
        t.prune(np.ones((2, 4), dtype=np.float32), "2:4", axis=2)
    with pytest.raises(t.ShapeError):
        t.prune(np.ones(4, dtype=np.float32), "2:4", axis=1.5)
    empty = np.zeros((0, 8), dtype=np.float32)
    assert t.prune(empty, "2:4").shape == (0, 8)
    assert t.compress(empty, "2:4").decompress().shape == (0, 8)


def test_non_conforming_input_names_the_first_group():
    x = np.zeros((3, 16), dtype=np.float32)
    x[1, 4:8] = [1, 2, 3, 0]
    x[2, 0:4] = [1, 1, 1, 1]
    with pytest.raises(t.SparsityError) as e:
        t.compress(x, "2:4")
    msg = str(e.value)
    assert "group 1" in msg and "x[1, 4:8]" in msg and "3 stored" in msg and "2:4" in msg
    assert isinstance(e.value, ValueError)


def test_bad_arguments():
    x = np.ones(8, dtype=np.float32)
    with pytest.raises(t.Trn2Error, match="unknown sparsity pattern"):
        t.prune(x, "3:4")
    with pytest.raises(t.Trn2Error, match="unknown sparsity pattern"):
        t.compress(x, 24)
    with pytest.raises(t.FormatError):
        t.prune(np.ones(4, dtype=np.complex64), "2:4")
    with pytest.raises(t.FormatError):
        t.compress(np.array(["a", "b"]), "1:2")
    with pytest.raises(t.FormatError):
        t.prune(np.array([None, 1], dtype=object), "1:2")
    with pytest.raises(TypeError):
        t.SparseTensor()
    sp = t.compress(t.prune(x, "2:4"), "2:4")
    with pytest.raises(t.FormatError):
        t.compress(sp, "2:4")
    with pytest.raises(ValueError):
        sp.values[0] = 1  # read-only: the tensor cannot be corrupted in place


# -------------------------------------------------------------------------------- CUTLASS


def torch_cutlass_from_dense(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy transliteration of PyTorch's ``sparse_semi_structured_from_dense_cutlass``
    (torch/sparse/_semi_structured_conversions.py), as documented in docs/sparsity.md."""
    m, k = dense.shape
    width = dense.dtype.itemsize
    meta_dtype = np.int32 if width == 1 else np.int16
    quad = np.dtype(meta_dtype).itemsize * 8 // 4
    nz = bits(dense) != 0
    if width != 4:
        ks = 4
        g = nz.reshape(m, k // 4, 4)
        m0, m1, m2, m3 = (g[..., i] for i in range(4))
    else:
        ks = 2
        g = nz.reshape(m, k // 2, 2)
        m0, m2 = g[..., 0], g[..., 1]
        m1, m3 = m0, m2
    meta_ncols = k // (ks * quad)
    expr0, expr1, expr2 = m0 & m1, ~m0 & m1, ~m0 & ~m1
    bit0, bit1 = expr1, expr2
    bit2, bit3 = expr0 | expr2 | m3, expr1 | ~m1
    idxs0 = bit0.astype(np.int64) | (bit1.astype(np.int64) << 1)
    idxs1 = bit2.astype(np.int64) | (bit3.astype(np.int64) << 1)
    if width != 4:
        d4 = dense.reshape(m, k // 4, 4)
        s0 = np.take_along_axis(d4, idxs0[..., None], -1)
        s1 = np.take_along_axis(d4, idxs1[..., None], -1)
        sparse = np.stack((s0, s1), axis=-1).reshape(m, k // 2)
    else:
        d2 = dense.reshape(m, k // 2, 2)
        sparse = np.take_along_axis(d2, (idxs0 // 2)[..., None], -1).reshape(m, k // 2)
    meta4 = (idxs0 | (idxs1 << 2)).reshape(m, meta_ncols, quad)
    meta = np.zeros((m, meta_ncols), dtype=np.int64)
    for j in range(quad):
        meta |= meta4[:, :, j] << (4 * j)
    # _calculate_meta_reordering_scatter_offsets
    dst_rows = np.repeat(np.arange(m)[:, None], meta_ncols, axis=1)
    dst_cols = np.repeat(np.arange(meta_ncols)[None, :], m, axis=0)
    group_x, group_y = 64, (32 if meta_dtype == np.int16 else 16)
    dst_rows = (
        dst_rows // group_x * group_x
        + (dst_rows % 2) * 2
        + (dst_rows % 8) // 4
        + ((dst_rows % group_y) % 4) // 2 * 32
        + ((dst_rows % group_x) // 8) * 4
    )
    topright = ((dst_rows % 2 == 0) & (dst_cols % 2 == 1)).astype(np.int64)
    bottomleft = ((dst_rows % 2 == 1) & (dst_cols % 2 == 0)).astype(np.int64)
    dst_rows = dst_rows + topright - bottomleft
    dst_cols = dst_cols - topright + bottomleft
    offsets = (dst_cols // 2) * m * 2 + dst_rows * 2 + dst_cols % 2
    out = np.zeros(m * meta_ncols, dtype=np.int64)
    out[offsets.reshape(-1)] = meta.reshape(-1)
    word_bits = 8 * np.dtype(meta_dtype).itemsize
    out = np.where(out >= 1 << (word_bits - 1), out - (1 << word_bits), out)
    return sparse, out.astype(meta_dtype).reshape(m, meta_ncols)


@pytest.mark.parametrize(
    "dtype,shape",
    [
        (np.dtype(np.float16), (64, 128)),
        (np.dtype(ml_dtypes.bfloat16), (128, 64)),
        (np.dtype(np.int8), (64, 128)),
        (np.dtype(ml_dtypes.float8_e4m3), (128, 64)),
        (np.dtype(np.float32), (64, 32)),
    ],
    ids=str,
)
def test_cutlass_layout_equals_pytorchs(dtype, shape):
    pattern = "1:2" if dtype.itemsize == 4 else "2:4"
    rng = np.random.default_rng(shape[0])
    x = boundary_array(dtype, shape, seed=shape[1])
    if dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            x = np.where(np.isnan(x.astype(np.float64)), dtype.type(1.5), x).astype(dtype)
    x = t.prune(x, pattern)
    x[rng.random(shape) < 0.3] = 0  # groups with 0 or 1 stored elements
    x = np.where(
        bits(x) == bits(np.array(-0.0, dtype=dtype)) if dtype.kind == "f" else False,
        dtype.type(0),
        x,
    )
    values, meta = t.compress(x, pattern, axis=1).to_cutlass()
    want_values, want_meta = torch_cutlass_from_dense(x)
    assert meta.dtype == want_meta.dtype and meta.shape == want_meta.shape
    assert np.array_equal(meta, want_meta)
    assert np.array_equal(bits(values), bits(want_values))
    back = t.SparseTensor.from_cutlass(values, meta)
    assert back.pattern == pattern and np.array_equal(bits(back.decompress()), bits(x))
    # Metadata words in big-endian order (as read from a big-endian file) are the same words.
    swapped = meta.astype(meta.dtype.newbyteorder(">"))
    again = t.SparseTensor.from_cutlass(values, swapped)
    assert np.array_equal(bits(again.decompress()), bits(x))


def test_cutlass_refuses_other_layouts():
    x = t.prune(np.ones((64, 64), dtype=np.float16), "4:16")
    with pytest.raises(t.SparsityError, match="CUTLASS"):
        t.compress(x, "4:16").to_cutlass()
    v, m = t.compress(t.prune(np.ones((64, 64), dtype=np.float16), "2:4"), "2:4").to_cutlass()
    bad = m.copy()
    bad[0, 0] = 0  # code 0b0000 names position 0 twice
    with pytest.raises(t.Trn2Error):
        t.SparseTensor.from_cutlass(v, bad)
    with pytest.raises(t.FormatError):
        t.SparseTensor.from_cutlass(v, m.astype(np.float32))


# ---------------------------------------------------------------------------- sparse GEMM


def finite_matrix(shape, seed, dtype=ml_dtypes.bfloat16):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_sparse_gemm_equals_dense_gemm_of_the_pruned_matrix(pattern):
    _, m = nm(pattern)
    k = 48 * m  # tiles of 128 cut through groups for 4:12
    a = t.prune(finite_matrix((70, k), 1), pattern, axis=1)
    b = finite_matrix((k, 130), 2)
    sp = t.compress(a, pattern, axis=1)
    s = t.gemm(sp, b)
    d = t.gemm(a, b)
    assert s.out.dtype == np.float32
    assert np.array_equal(s.out.view(np.uint32), d.out.view(np.uint32))  # bits, zero signs too
    assert np.array_equal(s.out, reference.gemm(a, b))


def wide_bf16(shape, seed):
    """bf16 values with random signs and mantissas, exponents mostly 2^-17..2^18, 2% of them
    anywhere in the finite range (subnormals included), and the first four rows and columns
    tiny (2^-126..2^-97 and subnormals): products overflow, underflow to zeros of either sign
    (whole tiny row-by-column sums end at +0 or -0) and cancel."""
    rng = np.random.default_rng(seed)
    sign = rng.integers(0, 2, size=shape, dtype=np.uint16) << 15
    exp = rng.integers(110, 146, size=shape, dtype=np.uint16)
    wild = rng.random(shape) < 0.02
    exp[wild] = rng.integers(0, 255, size=int(wild.sum()), dtype=np.uint16)
    exp[:4, :] = rng.integers(0, 31, size=exp[:4, :].shape, dtype=np.uint16)
    exp[:, :4] = rng.integers(0, 31, size=exp[:, :4].shape, dtype=np.uint16)
    man = rng.integers(0, 128, size=shape, dtype=np.uint16)
    return (sign | exp << 7 | man).view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("pattern", ["2:4", "1:4", "4:16", "4:12"])
def test_sparse_gemm_bits_on_boundary_heavy_data(pattern):
    """The zero-skipping kernel gives the dense GEMM's bits (sign of zero included) and the
    reference's values on data whose products overflow, underflow and cancel; a `b` holding Inf
    or NaN (where 0 * Inf is NaN) too."""
    _, m = nm(pattern)
    k = 12 * 16 * (3 if m != 12 else 2)
    a = t.prune(wide_bf16((37, k), 11), pattern, axis=1)
    b = wide_bf16((k, 75), 12)
    assert np.isfinite(b.astype(np.float32)).all()
    sp = t.compress(a, pattern, axis=1)
    s, d = t.gemm(sp, b).out, t.gemm(a, b).out
    assert np.array_equal(s.view(np.uint32), d.view(np.uint32))
    ref = reference.gemm(a, b)
    assert np.array_equal(s, ref, equal_nan=True)
    num = ~np.isnan(s)
    assert num.mean() > 0.5 and (s[num] == 0).sum() > 4  # zeros, not only NaN
    assert np.array_equal(np.signbit(s[num]), np.signbit(ref[num]))
    b2 = b.copy()
    b2[5, 3], b2[9, 70] = np.inf, np.nan
    s2, d2 = t.gemm(sp, b2).out, t.gemm(a, b2).out
    assert np.array_equal(s2.view(np.uint32), d2.view(np.uint32))
    assert np.isnan(s2[:, 3]).any()


def test_sparse_gemm_with_quantization_and_out_dtype():
    a = t.prune(finite_matrix((64, 256), 3, np.float32), "2:4", axis=1)
    b = finite_matrix((256, 96), 4, np.float32)
    sp = t.compress(a, "2:4", axis=1)
    for kw in (
        {"dtype": "fp8_e4m3"},
        {"dtype": "bf16", "rounding": "stochastic", "seed": 7},
        {"dtype": "fp16", "out_dtype": "bf16"},
    ):
        s, d = t.gemm(sp, b, **kw), t.gemm(a, b, **kw)
        assert np.array_equal(s.out.astype(np.float32), d.out.astype(np.float32)), kw


@pytest.mark.parametrize("pattern", PATTERNS)
def test_sparse_pe_cycles_are_dense_over_m_by_n(pattern):
    n, m = nm(pattern)
    k = 128 * 12  # a multiple of every 128 * M / N
    a = t.prune(finite_matrix((256, k), 5), pattern, axis=1)
    b = finite_matrix((k, 512), 6)
    s = t.gemm(t.compress(a, pattern, axis=1), b).report
    d = t.gemm(a, b).report
    assert s.pe_cycles * (m // n) == d.pe_cycles
    assert s.instructions * (m // n) == d.instructions
    assert s.pe_tflops <= 316.0 + 1e-9
    assert pattern in s.description
    e = t.estimate_gemm(4096, k * 4, 4096, sparsity=pattern)
    e0 = t.estimate_gemm(4096, k * 4, 4096)
    assert e.pe_cycles * (m // n) == e0.pe_cycles
    assert e.peak_tflops == pytest.approx(e0.peak_tflops * (m // n))
    assert e.details["hbm_bytes"] < e0.details["hbm_bytes"]


def test_sparse_gemm_refusals():
    a = t.prune(finite_matrix((8, 64), 7), "2:4", axis=1)
    b = finite_matrix((64, 8), 8)
    with pytest.raises(t.SparsityError, match="axis 1"):
        t.gemm(t.compress(t.prune(a, "2:4", axis=0), "2:4", axis=0), b)
    fp8 = t.quantize(a.astype(np.float32), "fp8_e4m3")
    with pytest.raises(t.Trn2Error, match="double_row"):
        t.gemm(
            t.compress(fp8, "2:4", axis=1),
            b.astype(np.float32),
            dtype="fp8_e4m3",
            perf_mode="double_row",
        )
    with pytest.raises(t.Trn2Error, match="double_row"):
        t.estimate_gemm(256, 512, 512, dtype="fp8_e4m3", perf_mode="double_row", sparsity="2:4")
    with pytest.raises(t.Trn2Error, match="unknown sparsity pattern"):
        t.estimate_gemm(256, 512, 512, sparsity="2:3")
    with pytest.raises(t.ShapeError):
        t.gemm(t.compress(a, "2:4", axis=1), finite_matrix((32, 8), 9))


# ------------------------------------------------------------------------------------ CLI


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "trn2core", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_gemm_sparsity_and_demo_part():
    r = _cli("gemm", "--m", "256", "--k", "1024", "--n", "512", "--sparsity", "4:16", "--run")
    assert r.returncode == 0, r.stderr
    assert "sparse 4:16 stationary" in r.stdout and "emulated bit-exactly" in r.stdout
    dense = t.estimate_gemm(256, 1024, 512)
    assert f"{dense.pe_cycles // 4:,}" in r.stdout  # PE busy cycles: a quarter of dense
    r = _cli("gemm", "--m", "256", "--k", "1024", "--n", "512", "--sparsity", "3:4")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = _cli("demo", "--only", "sparsity")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()]
    table = [c for c in rows if len(c) == 9 and c[0] in PATTERNS]
    assert [c[0] for c in table] == list(PATTERNS) and all(c[-1] == "True" for c in table)
    assert "CUTLASS" in r.stdout


def test_demo_writes_a_merged_trace(tmp_path):
    import json

    path = tmp_path / "demo.json"
    r = _cli("demo", "--only", "tensor-engine", "sparsity", "--trace", str(path))
    assert r.returncode == 0, r.stderr
    assert str(path) in r.stdout and "ui.perfetto.dev" in r.stdout
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"bf16 GEMM 512x2048x1024", "4:16-sparse GEMM 512x3072x1024"}
    assert {e["pid"] for e in events} == {0, 1}
    assert any(e.get("ph") == "X" and e["pid"] == 1 for e in events)
