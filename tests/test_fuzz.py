"""Fuzzing the public API with hypothesis (issue 8): generated arrays (every dtype, 0-d and
empty, NaN/Inf, byte-swapped, strided) and arguments drawn from valid and invalid values.

Each property asserts that only the contract's exceptions (``Trn2Error`` and its subclasses)
appear, and that every successful result satisfies its invariants: shape and dtype, round trips
bit for bit (``decode(encode(x)) == quantize(x)``, ``decompress(compress(x)) == x``), agreement
with ``trn2core.reference`` for the GEMM, conformance for pruning.

``make test`` runs the default profile (100 examples per property); ``make fuzz`` runs the
``fuzz`` profile (``TRN2CORE_FUZZ_EXAMPLES``, 20000 by default). docs/limitations.md records a
run.
"""

from __future__ import annotations

import datetime

import ml_dtypes
import numpy as np
import trn2core as t
from hypothesis import assume, event, given, note
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from trn2core import CorruptDataError, Trn2Error
from trn2core.dtypes import CODE_DTYPES, FORMAT_DTYPES

ML = [
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e3m4,
    ml_dtypes.float8_e4m3fn,
]
NUMPY = [
    "<f8",
    ">f8",
    "<f4",
    ">f4",
    "<f2",
    "<i1",
    "<i2",
    ">i4",
    "<i8",
    "<u1",
    "<u2",
    "<u4",
    "<u8",
    "?",
]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)


@st.composite
def numeric_arrays(draw, shapes=SHAPES):
    """Arrays of every real dtype trn2core may meet, any bits (NaN payloads, Inf, subnormals,
    -0.0), sometimes strided or read-only."""
    shape = draw(shapes)
    kind = draw(st.sampled_from(["numpy", "ml"]))
    if kind == "ml":
        dt = np.dtype(draw(st.sampled_from(ML)))
        raw = draw(hnp.arrays(np.dtype(f"u{dt.itemsize}"), shape))
        x = raw.view(dt)
    else:
        x = draw(hnp.arrays(np.dtype(draw(st.sampled_from(NUMPY))), shape))
    if x.ndim >= 1 and x.shape[-1] > 1 and draw(st.booleans()):
        x = x[..., ::2]
    if draw(st.booleans()):
        x.flags.writeable = False
    return x


class Opaque:
    pass


NOT_ARRAYS = st.one_of(
    st.text(max_size=4),
    st.none(),
    st.just(Opaque()),
    st.complex_numbers(allow_nan=True),
    st.just(datetime.datetime(2024, 1, 1)),
    st.just([[1.0, 2.0], [3.0]]),
    hnp.arrays(np.complex64, hnp.array_shapes(max_dims=2, max_side=4)),
    st.just(np.array(["2024-01-01"], dtype="datetime64[D]")),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
ANY_ARRAY = st.one_of(numeric_arrays(), numeric_arrays(), NOT_ARRAYS)


@st.composite
def mostly(draw, valid, junk, weight=3):
    """``valid`` except with probability ``2**-weight``, then ``junk``: enough valid calls to
    check results, enough invalid ones to check errors."""
    if all(draw(st.booleans()) for _ in range(weight)):
        return draw(junk)
    return draw(valid)


def names(valid):
    """A valid name most of the time, or junk."""
    junk = st.one_of(
        st.text(max_size=8), st.none(), st.integers(), st.sampled_from([v.upper() for v in valid])
    )
    return mostly(st.sampled_from(valid), junk)


def ints(lo, hi):
    """An integer in ``lo..=hi`` most of the time, or junk: just outside the range, beyond 64
    bits, or not an integer. (Never a large valid size: a valid 10**9 would make the property
    allocate gigabytes or walk for minutes, legitimately.)"""
    junk = st.one_of(
        st.integers(max_value=lo - 1),
        st.integers(hi + 1, hi + 10),
        st.integers(min_value=2**64),
        st.none(),
        st.floats(),
        st.text(max_size=3),
        st.booleans(),
    )
    return mostly(st.integers(lo, hi), junk)


BOOLS = mostly(st.booleans(), st.one_of(st.integers(0, 1), st.text(max_size=2), st.none()))

#: The engine's input formats and a dtype holding each.
ENGINE = {
    "fp32": np.float32,
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "fp8_e4m3": ml_dtypes.float8_e4m3,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp8_e3m4": ml_dtypes.float8_e3m4,
}


@st.composite
def engine_matrix(draw, shape):
    """A matrix of ``shape`` in one of the engine's formats (or float64 / int32, which gemm
    turns into fp32), with any bits of that format."""
    fmt = draw(st.sampled_from([*ENGINE, "float64", "int32"]))
    if fmt in ("float64", "int32"):
        return draw(hnp.arrays(np.dtype(fmt), shape))
    dt = np.dtype(ENGINE[fmt])
    return draw(hnp.arrays(np.dtype(f"u{dt.itemsize}"), shape)).view(dt)


@st.composite
def gemm_operands(draw):
    m, k, n = draw(st.integers(1, 9)), draw(st.integers(1, 300)), draw(st.integers(1, 9))
    a = draw(engine_matrix((m, k)))
    b = draw(engine_matrix((k, n)))
    return a, b


def bad_name(v, valid) -> bool:
    return not (isinstance(v, str) and v in valid)


def bad_int(v, lo, hi) -> bool:
    ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
    return not (ok and lo <= v <= hi)


def bad_bool(v) -> bool:
    return not isinstance(v, (bool, np.bool_))


def contract(f, *args, **kwargs):
    """Calls ``f``: its result, or ``None`` after a ``Trn2Error``; any other exception fails."""
    name = getattr(f, "__name__", "call")
    try:
        r = f(*args, **kwargs)
        event(f"{name}: ok")
        return r
    except Trn2Error as e:
        event(f"{name}: {type(e).__name__}")
        note(f"{type(e).__name__}: {e}")
        assert "panicked" not in str(e) and "internal error" not in str(e), e
        return None


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def canonical_f32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), x).view(np.uint32)


@given(
    x=mostly(numeric_arrays(), NOT_ARRAYS),
    fmt=names(t.FORMATS),
    rounding=names(t.ROUNDING_MODES),
    saturate=BOOLS,
    seed=st.one_of(st.none(), ints(0, 2**64 - 1)),
    bias=mostly(st.none(), ints(0, 127), 2),
)
def test_numerics(x, fmt, rounding, saturate, seed, bias):
    kw = dict(rounding=rounding, saturate=saturate, seed=seed)
    q = contract(t.quantize, x, fmt, **kw)
    codes = contract(t.encode, x, fmt, exponent_bias=bias, **kw)
    # Junk is refused, never silently taken (a seed is checked even where it is unused).
    junk = (
        bad_name(fmt, t.FORMATS)
        or bad_name(rounding, t.ROUNDING_MODES)
        or bad_bool(saturate)
        or (seed is not None and bad_int(seed, 0, 2**64 - 1))
    )
    if junk:
        assert q is None and codes is None
    if q is not None:
        assert q.shape == np.shape(x) and q.dtype == FORMAT_DTYPES[fmt]
        assert q.flags.c_contiguous
    if codes is not None:
        assert codes.shape == np.shape(x) and codes.dtype == CODE_DTYPES[fmt]
        values = contract(t.decode, codes, fmt, exponent_bias=bias)
        assert values is not None and values.dtype == np.float32
        if bias is None and q is not None:
            # decode(encode(x)) == quantize(x), bit for bit (NaN as NaN).
            want = canonical_f32(q.astype(np.float32))
            assert (canonical_f32(values) == want).all()
            # And encoding the decoded values again changes nothing (they are exact).
            again = t.encode(values, fmt, saturate=saturate)
            assert (canonical_f32(t.decode(again, fmt)) == canonical_f32(values)).all()


@given(
    codes=mostly(
        hnp.arrays(st.sampled_from([np.uint8, np.uint16, np.uint32, ">u2"]), SHAPES), ANY_ARRAY
    ),
    fmt=names(t.FORMATS),
    bias=mostly(st.none(), ints(0, 127), 2),
)
def test_decode(codes, fmt, bias):
    if isinstance(codes, np.ndarray) and codes.dtype.kind == "u" and fmt in t.FORMATS:
        codes = codes.astype(codes.dtype.newbyteorder("=")).astype(
            CODE_DTYPES[fmt], casting="unsafe"
        )
    v = contract(t.decode, codes, fmt, exponent_bias=bias)
    if v is not None:
        assert v.shape == np.shape(codes) and v.dtype == np.float32


@given(
    shape=st.one_of(SHAPES, ints(0, 100), st.lists(ints(0, 5), max_size=3)), seed=ints(0, 2**64 - 1)
)
def test_stochastic_bits(shape, seed):
    w = contract(t.stochastic_bits, shape, seed=seed)
    if w is not None:
        assert w.dtype == np.uint32
        assert w.shape == (tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))


MATRICES = st.one_of(
    numeric_arrays(hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=7)), ANY_ARRAY
)


@given(
    ab=mostly(gemm_operands(), st.tuples(MATRICES, MATRICES)),
    dtype=mostly(st.none(), names(t.FORMATS), 2),
    perf_mode=names(t.PERF_MODES),
    out_dtype=mostly(st.just("fp32"), names(t.FORMATS), 2),
    seed=st.one_of(st.none(), ints(0, 2**64 - 1)),
)
def test_gemm(ab, dtype, perf_mode, out_dtype, seed):
    a, b = ab
    res = contract(t.gemm, a, b, dtype=dtype, perf_mode=perf_mode, out_dtype=out_dtype, seed=seed)
    junk = (
        (dtype is not None and bad_name(dtype, t.FORMATS))
        or bad_name(perf_mode, t.PERF_MODES)
        or bad_name(out_dtype, t.FORMATS)
        or (seed is not None and bad_int(seed, 0, 2**64 - 1))
    )
    if junk:
        assert res is None
    if res is None:
        return
    m, n = np.shape(a)[0], np.shape(b)[1]
    assert res.out.shape == (m, n) and res.out.dtype == FORMAT_DTYPES[out_dtype]
    assert res.report.seconds > 0 and 0 < res.report.utilization <= 1
    if dtype is None and out_dtype == "fp32":
        # The reference oracle, on the engine's inputs (float64 and integers enter as fp32).
        def engine_input(x):
            x = np.asarray(x)
            x = x.astype(x.dtype.newbyteorder("="))
            return t.quantize(x, "fp32") if x.dtype.kind in "iu" or x.dtype == np.float64 else x

        want = t.reference.gemm(engine_input(a), engine_input(b), perf_mode=perf_mode)
        assert (canonical_f32(res.out) == canonical_f32(want)).all()


@given(
    m=ints(1, 3000),
    k=ints(1, 3000),
    n=ints(1, 3000),
    dtype=names(t.FORMATS),
    perf_mode=names(t.PERF_MODES),
    sparsity=mostly(st.none(), names(t.SPARSITY_PATTERNS), 2),
)
def test_estimate_gemm(m, k, n, dtype, perf_mode, sparsity):
    rep = contract(t.estimate_gemm, m, k, n, dtype=dtype, perf_mode=perf_mode, sparsity=sparsity)
    junk = (
        any(bad_int(v, 1, 2**64 - 1) for v in (m, k, n))
        or bad_name(dtype, t.FORMATS)
        or bad_name(perf_mode, t.PERF_MODES)
        or (sparsity is not None and bad_name(sparsity, t.SPARSITY_PATTERNS))
    )
    if junk:
        assert rep is None
    if rep is not None:
        assert rep.seconds > 0 and 0 < rep.utilization <= 1 and rep.instructions >= 1
        assert rep.flops == 2 * m * k * n


@st.composite
def matmul_operands(draw):
    """Half the time operands within the instruction's limits (any bits of the formats), else
    any engine-format matrices (mostly too large or mismatched)."""

    def of(fmt, shape):
        dt = np.dtype(ENGINE[fmt])
        return draw(hnp.arrays(np.dtype(f"u{dt.itemsize}"), shape)).view(dt)

    if draw(st.booleans()):
        k, m, n = draw(st.integers(1, 128)), draw(st.integers(1, 128)), draw(st.integers(1, 512))
        fmt = draw(st.sampled_from(list(ENGINE)))
        fmt2 = "fp32" if fmt == "fp32" else draw(st.sampled_from(list(ENGINE)[1:]))
        return of(fmt, (k, m)), of(fmt2, (k, n))
    return draw(engine_matrix((draw(st.integers(0, 130)), draw(st.integers(0, 9))))), draw(
        engine_matrix((draw(st.integers(0, 130)), draw(st.integers(0, 9))))
    )


@given(
    ops=mostly(matmul_operands(), st.tuples(MATRICES, MATRICES)),
    bank=ints(0, 7),
    accumulate=mostly(st.just(False), BOOLS, 2),
    perf_mode=names(t.PERF_MODES),
    tile=mostly(
        st.none(),
        st.one_of(st.tuples(ints(0, 96), ints(0, 96)), st.sampled_from([(0, 0), (64, 0), (0, 32)])),
        2,
    ),
    size=st.one_of(
        st.none(),
        st.tuples(ints(32, 128), ints(32, 128)),
        st.sampled_from([(64, 64), (32, 128), (128, 128)]),
    ),
)
def test_matmul(ops, bank, accumulate, perf_mode, tile, size):
    s, mv = ops
    core = t.NeuronCore()
    out = contract(
        core.matmul,
        s,
        mv,
        bank=bank,
        accumulate=accumulate,
        perf_mode=perf_mode,
        tile_position=tile,
        tile_size=size,
    )
    if bad_int(bank, 0, 7) or bad_bool(accumulate) or bad_name(perf_mode, t.PERF_MODES):
        assert out is None
    if out is not None:
        assert out.shape == (np.shape(s)[-1], np.shape(mv)[-1]) and out.dtype == np.float32
        if tile is None:
            psum = core.read_psum(bank, *out.shape)
            assert (canonical_f32(psum) == canonical_f32(out)).all()
    # The core stays usable whatever happened.
    assert core.matmul(np.ones((2, 2), np.float32), np.ones((2, 3), np.float32))[0, 0] == 2.0


@given(
    pattern=st.sampled_from(t.SPARSITY_PATTERNS),
    dims=st.tuples(st.integers(1, 70), st.integers(1, 30), st.integers(1, 70)),
    dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3]),
    seed=st.integers(0, 2**32 - 1),
    spread=st.integers(0, 140),
    special=st.sampled_from([None, np.inf, -np.inf, np.nan]),
)
def test_sparse_gemm_bits(pattern, dims, dtype, seed, spread, special):
    """``gemm`` of a compressed operand has the dense GEMM's bits (zero signs, NaNs, Infs) on
    data whose products overflow, underflow and cancel, with the zero-skipping kernel or not."""
    m, groups, n = dims
    k = groups * int(pattern.split(":")[1])
    rng = np.random.default_rng(seed)

    def data(shape):
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, shape)
        with np.errstate(over="ignore"):  # beyond float32's range: Inf, on purpose
            return x.astype(np.float32).astype(dtype)

    a = t.prune(data((m, k)), pattern, axis=1)
    b = data((k, n))
    if special is not None:
        b[rng.integers(k), rng.integers(n)] = special
    s, d = t.gemm(t.compress(a, pattern, axis=1), b).out, t.gemm(a, b).out
    assert same_bits(s, d)


@given(
    x=mostly(numeric_arrays(hnp.array_shapes(min_dims=1, max_dims=3, max_side=16)), NOT_ARRAYS),
    pattern=names(t.SPARSITY_PATTERNS),
    axis=ints(-3, 2),
)
def test_sparsity(x, pattern, axis):
    p = contract(t.prune, x, pattern, axis=axis)
    if bad_name(pattern, t.SPARSITY_PATTERNS) or bad_int(axis, -(2**63), 2**63 - 1):
        assert p is None
    if p is None:
        return
    a = np.asarray(x)
    assert p.shape == a.shape and p.dtype == a.dtype.newbyteorder("=")
    # The pruned array conforms: compress takes it, and decompress gives it back bit for bit.
    sp = t.compress(p, pattern, axis=axis)
    assert same_bits(sp.decompress(), p)
    n, m = (int(v) for v in pattern.split(":"))
    assert sp.values.size == p.size // m * n
    # Compressing the original works exactly when it already conformed.
    c = contract(t.compress, x, pattern, axis=axis)
    if c is not None:
        assert same_bits(c.decompress(), np.ascontiguousarray(a, a.dtype.newbyteorder("=")))
    # As a stationary operand (pruned along K): the dense GEMM's bits, or the same refusal.
    if p.ndim == 2 and axis % 2 == 1:
        b = np.ascontiguousarray(p.T)
        s, d = contract(t.gemm, sp, b), contract(t.gemm, p, b)
        assert (s is None) == (d is None)
        if s is not None:
            event("sparse gemm compared")
            assert same_bits(s.out, d.out)


@given(x=mostly(numeric_arrays(), NOT_ARRAYS), codec=names(t.dma.CODECS))
def test_dma_round_trip(x, codec):
    blob = contract(t.dma.compress, x, codec)
    if bad_name(codec, t.dma.CODECS):
        assert blob is None
    if blob is None:
        return
    a = np.asarray(x)
    back = t.dma.decompress(blob)
    assert back.shape == a.shape and back.dtype == a.dtype
    assert back.tobytes() == np.ascontiguousarray(a).tobytes()
    assert same_bits(t.dma.decompress(t.dma.Compressed.from_bytes(blob.to_bytes())), back)
    # The contract's growth bound for incompressible data.
    assert blob.nbytes <= a.nbytes * 1.02 + 64, (blob.nbytes, a.nbytes, a.dtype, a.shape)
    rep = contract(t.dma.dma_copy, x, codec=codec)
    assert rep is not None and rep.bytes == a.nbytes and rep.seconds > 0


@given(
    x=numeric_arrays(),
    codec=st.sampled_from(t.dma.CODECS),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_dma_corrupt_streams(x, codec, edits, cut):
    good = t.dma.compress(x, codec).to_bytes()
    bad = bytearray(good)
    for at, v in edits:
        bad[at % len(bad)] = v
    if cut is not None:
        del bad[cut % len(bad) :]
    assume(bytes(bad) != good)
    for f in (t.dma.Compressed.from_bytes, t.dma.decompress):
        try:
            f(bytes(bad))
        except CorruptDataError:
            continue
        raise AssertionError(f"{f.__name__} accepted an altered stream")


@given(blob=st.one_of(st.binary(max_size=300), st.integers(), st.text(max_size=5), st.none()))
def test_dma_arbitrary_blobs(blob):
    contract(t.dma.decompress, blob)
    contract(t.dma.Compressed.from_bytes, blob)


@st.composite
def cutlass_parts(draw):
    """PyTorch-layout parts of a pruned matrix, with a few meta words sometimes altered."""
    width = draw(st.sampled_from([1, 2, 4]))
    # The layout's tiles: 64 rows; 16, 32 or 64 columns for 4-, 2- and 1-byte elements.
    rows = 64 * draw(st.integers(1, 2))
    cols = {4: 16, 2: 32, 1: 64}[width] * draw(st.integers(1, 3))
    dt = {1: ml_dtypes.float8_e4m3, 2: ml_dtypes.bfloat16, 4: np.float32}[width]
    x = draw(hnp.arrays(np.dtype(f"u{width}"), (rows, cols))).view(dt)
    pattern = "1:2" if width == 4 else "2:4"
    assume(contract(t.prune, x, pattern, axis=1) is not None)
    values, meta = t.compress(t.prune(x, pattern, axis=1), pattern, axis=1).to_cutlass()
    meta = meta.copy()
    for at, w in draw(
        st.lists(st.tuples(st.integers(0, 10**6), st.integers(-(2**15), 2**15 - 1)), max_size=2)
    ):
        meta.reshape(-1)[at % meta.size] = w
    return values, meta


@given(
    parts=mostly(
        cutlass_parts(),
        st.tuples(
            st.one_of(
                numeric_arrays(hnp.array_shapes(min_dims=2, max_dims=2, max_side=70)), ANY_ARRAY
            ),
            st.one_of(
                hnp.arrays(
                    st.sampled_from([np.int16, np.int32, np.uint16]),
                    hnp.array_shapes(max_dims=2, max_side=70),
                ),
                ANY_ARRAY,
            ),
        ),
        2,
    )
)
def test_from_cutlass(parts):
    values, meta = parts
    sp = contract(t.SparseTensor.from_cutlass, values, meta)
    if sp is not None:
        v, mt = sp.to_cutlass()
        want = np.ascontiguousarray(values, np.asarray(values).dtype.newbyteorder("="))
        assert same_bits(v, want)


# -- chips and collectives --------------------------------------------------------------------

#: The collectives reduce in the engine's six formats.
REDUCE = ENGINE
INSTANCE = t.Instance()
ONE_CHIP = t.Instance("trn2.3xlarge")
REDUCE_OPS = ("sum", "max", "min")


@st.composite
def rank_buffers(draw, n):
    """``n`` buffers of one shape and reduction format: exact small integers (their sum does not
    depend on the order of additions) or any bits (NaN, Inf, subnormals)."""
    fmt = draw(st.sampled_from(list(REDUCE)))
    dt = np.dtype(REDUCE[fmt])
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=40))
    exact = draw(st.booleans())
    bufs = []
    for _ in range(n):
        if exact:
            bufs.append(draw(hnp.arrays(np.int8, shape, elements=st.integers(-8, 8))).astype(dt))
        else:
            bufs.append(draw(hnp.arrays(np.dtype(f"u{dt.itemsize}"), shape)).view(dt))
    return fmt, exact, bufs


@st.composite
def collective_call(draw):
    """A machine, the chips taking part (all, or a subset in any order) and their buffers."""
    machine = draw(st.sampled_from([INSTANCE, ONE_CHIP]))
    size = machine.topology.size
    chips = None
    if size > 1 and draw(st.booleans()):
        chips = draw(st.permutations(range(size)).map(lambda p: p[: draw(st.integers(1, size))]))
    n = size if chips is None else len(chips)
    fmt, exact, bufs = draw(rank_buffers(n))
    return machine, chips, fmt, exact, bufs


def value_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same values (NaN equals NaN; -0 equals +0) and the same dtype and shape."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.array_equal(a.astype(np.float32), b.astype(np.float32), equal_nan=True)
    )


@given(
    call=mostly(
        collective_call(),
        st.tuples(
            st.just(INSTANCE),
            st.none(),
            st.none(),
            st.none(),
            st.one_of(ANY_ARRAY, st.lists(ANY_ARRAY, min_size=16, max_size=16)),
        ),
    ),
    op=names(REDUCE_OPS),
    algorithm=names(t.ALGORITHMS),
)
def test_collectives(call, op, algorithm):
    machine, chips, fmt, exact, bufs = call
    ar = contract(machine.all_reduce, bufs, op=op, algorithm=algorithm, chips=chips)
    rs = contract(machine.reduce_scatter, bufs, op=op, algorithm=algorithm, chips=chips)
    ag = contract(machine.all_gather, bufs, algorithm=algorithm, chips=chips)
    a2a = contract(machine.all_to_all, bufs, algorithm=algorithm, chips=chips)
    sr = contract(machine.send_recv, bufs, chips=chips)
    if fmt is None or bad_name(op, REDUCE_OPS) or bad_name(algorithm, t.ALGORITHMS):
        assert ar is None and rs is None  # junk is refused, never silently taken
    if fmt is None:
        return
    n, shape = len(bufs), bufs[0].shape
    if ar is not None:
        outs = ar.outputs
        assert len(outs) == n and all(o.shape == shape and o.dtype == bufs[0].dtype for o in outs)
        # Every rank has the same bits.
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)
        x = np.stack([b.astype(np.float32) for b in bufs])
        if op in ("max", "min"):
            want = t.quantize(getattr(np, op)(x, axis=0), fmt)  # exact: one of the inputs
            assert value_equal(outs[0], want.reshape(shape))
        elif exact:
            want = t.quantize(x.astype(np.float64).sum(axis=0), fmt)  # order-free, rounded once
            assert value_equal(outs[0], want.reshape(shape))
        assert ar.report.seconds >= 0 and ar.report.max_link_utilization <= 1 + 1e-12
        if rs is not None and (op != "sum" or exact):
            # reduce_scatter's parts are the all-reduce's, in rank order (order-free cases).
            joined = np.concatenate([p.reshape(-1) for p in rs.outputs])
            assert joined.tobytes() == outs[0].reshape(-1).tobytes()
    if ag is not None:
        want = np.stack(bufs)
        assert all(o.tobytes() == want.tobytes() and o.shape == (n, *shape) for o in ag.outputs)
    if a2a is not None:
        # A permutation of the parts: rank j holds part j of every rank, in rank order.
        flat = [b.reshape(-1) for b in bufs]
        length = flat[0].size
        for j, o in enumerate(a2a.outputs):
            lo, hi = j * length // n, (j + 1) * length // n
            want = np.concatenate([f[lo:hi] for f in flat])
            assert o.reshape(-1).tobytes() == want.tobytes()
    if sr is not None:
        for r in range(n):
            assert sr.outputs[(r + 1) % n].tobytes() == bufs[r].tobytes()


@given(
    ab=gemm_operands(),
    lnc=mostly(st.sampled_from([1, 2, 4]), st.one_of(st.integers(-2, 9), st.none(), st.text())),
    which=st.integers(0, 8),
    perf_mode=names(t.PERF_MODES),
)
def test_chip_gemm(ab, lnc, which, perf_mode):
    # A GEMM on a Chip or one of its logical cores has the bits of the GEMM on one core.
    a, b = ab
    chip = contract(t.Chip, lnc=lnc)
    if lnc is None:  # the default LNC (NEURON_LOGICAL_NC_CONFIG, else 2)
        assert chip is not None and chip.lnc in (1, 2)
    elif bad_int(lnc, 1, 4) or lnc == 3:
        assert chip is None
        return
    core = chip if which == 8 else chip.cores[which % len(chip.cores)]
    res = contract(t.gemm, a, b, core=core, perf_mode=perf_mode)
    one = contract(t.gemm, a, b, perf_mode=perf_mode)
    assert (res is None) == (one is None)
    if res is not None:
        assert res.out.tobytes() == one.out.tobytes()
        assert res.report.flops == one.report.flops
        assert res.report.seconds > 0 and 0 < res.report.utilization <= 1


@given(
    machine=st.sampled_from([INSTANCE, ONE_CHIP, t.UltraServer(), t.UltraCluster(2)]),
    collective=names(t.collectives.COLLECTIVES),
    nbytes=ints(0, 1 << 34),
    dtype=names(["fp32", "bf16", "fp8_e4m3"]),
    algorithm=names(t.ALGORITHMS),
)
def test_collective_estimate(machine, collective, nbytes, dtype, algorithm):
    rep = contract(machine.estimate, collective, nbytes, dtype=dtype, algorithm=algorithm)
    junk = (
        bad_name(collective, t.collectives.COLLECTIVES)
        or bad_int(nbytes, 0, 2**50)
        or bad_name(dtype, t.FORMATS)
        or bad_name(algorithm, t.ALGORITHMS)
    )
    if junk:
        assert rep is None
    if rep is not None:
        # Physics: no link above its bandwidth; busbw within what a chip's links carry.
        assert rep.seconds >= 0 and rep.max_link_utilization <= 1 + 1e-12
        assert rep.busbw <= rep.chip_link_capacity * (1 + 1e-12)
