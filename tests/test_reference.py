"""Tests of ``trn2core.reference``, the numpy oracle of the tensor engine's accumulation order.

Every expectation is either worked out by hand in the comments or comes from a scalar loop over
:class:`fractions.Fraction` that rounds to fp32 with integer arithmetic, sharing no code with the
vectorised float64 implementation under test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from trn2core import reference as ref

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3
E5M2 = ml_dtypes.float8_e5m2
F32_MAX_EXP = 128  # fp32 values are < 2**128
F32_MIN_EXP = -149  # smallest fp32 subnormal is 2**-149


# --------------------------------------------------------------------------------------------
# Scalar exact oracle
# --------------------------------------------------------------------------------------------


def round_f32(q: Fraction) -> float:
    """The nonzero rational ``q`` rounded once to fp32 (nearest, ties to even; overflow to Inf).

    A ``q`` below half the smallest subnormal keeps its sign: -0.0 for a negative one."""
    assert q != 0
    sign = -1.0 if q < 0 else 1.0
    mag = abs(q)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()  # 2**e <= mag < 2**(e+2)
    if Fraction(2) ** e > mag:
        e -= 1
    # now 2**e <= mag < 2**(e+1); fp32 keeps 24 bits, subnormals a fixed quantum of 2**-149
    quantum = Fraction(2) ** max(e - 23, F32_MIN_EXP)
    n = round(mag / quantum)  # Fraction.__round__ rounds half to even
    value = n * quantum
    if value >= Fraction(2) ** F32_MAX_EXP:
        return sign * math.inf
    return sign * float(value)  # exact: value is an fp32 number


def exact_fma(p: float, a: float, b: float) -> float:
    """``fp32(p + a * b)``, exact product, one rounding; the IEEE sign rules for a zero sum."""
    q = Fraction(p) + Fraction(a) * Fraction(b)
    if q != 0:
        return round_f32(q)
    # An exact zero is +0.0 under round-to-nearest, except -0.0 + -0.0 = -0.0.
    product_is_neg_zero = a * b == 0 and math.copysign(1, a) * math.copysign(1, b) < 0
    return -0.0 if (p == 0 and math.copysign(1, p) < 0 and product_is_neg_zero) else 0.0


def slow_tile(pairs: list[tuple[float, float]]) -> float:
    """One tile's partial sum: ``pairs`` of (a, b) in the engine's contraction order."""
    partial = 0.0
    for a, b in pairs:
        partial = exact_fma(partial, a, b)
    return partial


def slow_gemm(a: np.ndarray, b: np.ndarray, perf_mode: str = "none") -> np.ndarray:
    """Scalar GEMM straight from the contract's words, skipping (not padding) missing indices."""
    m, k_total = a.shape
    n = b.shape[1]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tile = 256 if perf_mode == "double_row" else 128
    out = np.zeros((m, n), dtype=np.float32)
    for i in range(m):
        for j in range(n):
            acc = None
            for k0 in range(0, k_total, tile):
                length = min(tile, k_total - k0)
                if perf_mode == "double_row":  # "the order is k, k+128 for each row k"
                    order = [r + h for r in range(128) for h in (0, 128) if r + h < length]
                else:
                    order = list(range(length))
                partial = slow_tile([(a64[i, k0 + t], b64[k0 + t, j]) for t in order])
                acc = partial if acc is None else exact_fma(acc, partial, 1.0)
            out[i, j] = 0.0 if acc is None else acc
    return out


def bits(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def assert_bits_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    np.testing.assert_array_equal(bits(actual), bits(expected.astype(np.float32)))


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: object) -> np.ndarray:
    """Mixed-sign values spread over several binades, so sums round and cancel often."""
    scale = np.exp2(rng.integers(-6, 7, size=shape))
    top = float(ml_dtypes.finfo(dtype).max)
    return np.clip(rng.standard_normal(shape) * scale, -top, top).astype(dtype)


# --------------------------------------------------------------------------------------------
# The scalar oracle itself
# --------------------------------------------------------------------------------------------


def test_round_f32_oracle_matches_numpy_on_float64_values(rng: np.random.Generator) -> None:
    # A float64 -> float32 cast is a single correct rounding, so the two must agree everywhere,
    # including subnormals, ties and overflow.
    x = rng.standard_normal(3000) * np.exp2(rng.integers(-160, 130, size=3000))
    ties = (np.float32(1.0) + np.float64(2.0**-24)) * np.exp2(np.arange(-140, 128, dtype=float))
    x = np.concatenate([x, ties, -ties, [2.0**-150, 1.5 * 2.0**-150, 2.0**128 * (1 - 2.0**-25)]])
    with np.errstate(over="ignore"):
        expected = x.astype(np.float32)
    got = np.array([round_f32(Fraction(v)) for v in x], dtype=np.float32)
    np.testing.assert_array_equal(bits(got), bits(expected))
    assert np.signbit(got[(x < 0) & (expected == 0)]).all()  # -2**-151 rounds to -0.0


# --------------------------------------------------------------------------------------------
# fma_f32: one exactly rounded step for fp32 inputs
# --------------------------------------------------------------------------------------------


def test_fma_f32_single_rounding_beats_float64_double_rounding() -> None:
    # a * b = (1 + 2**-12)(1 - 4095 * 2**-24) = 1 + 2**-36 exactly (48-bit product).
    # 2**24 + 1 + 2**-36 is just above the fp32 tie 2**24 + 1, so it rounds up to 2**24 + 2;
    # in float64 the 2**-36 is lost first (ulp 2**-28), the tie goes to even: 2**24.
    p, a, b = np.float32(2**24), np.float32(1 + 2**-12), np.float32(1 - 4095 * 2**-24)
    assert Fraction(float(a)) * Fraction(float(b)) == 1 + Fraction(1, 2**36)
    naive = np.float32(np.float64(p) + np.float64(a) * np.float64(b))
    assert naive == 2**24
    assert ref.fma_f32(p, a, b) == 2**24 + 2
    assert ref.fma_f32(-p, -a, b) == -(2**24 + 2)
    # Exact tie: 2**24 + 1 goes to the even 2**24; 2**24 + 3 to 2**24 + 4.
    assert ref.fma_f32(np.float32(2**24), np.float32(1), np.float32(1)) == 2**24
    assert ref.fma_f32(np.float32(2**24 + 2), np.float32(1), np.float32(1)) == 2**24 + 4
    # Just below the tie: (1 + 2**-12)(1 - 4097 * 2**-24) = 1 - 2**-24 - 2**-36 (exact).
    b_low = np.float32(1 - 4097 * 2**-24)
    assert ref.fma_f32(p, a, b_low) == 2**24


def _near_tie_cases(rng: np.random.Generator, count: int) -> tuple[np.ndarray, ...]:
    """fp32 triples whose exact p + a*b is on or very near an fp32 tie (with p much larger than
    a*b, where a float64 sum loses the bits that decide the rounding)."""
    p = (rng.uniform(1, 2, count) * np.exp2(rng.integers(-100, 100, count))).astype(np.float32)
    p *= rng.choice(np.array([-1, 1], dtype=np.float32), count)
    half_ulp = np.spacing(np.abs(p)).astype(np.float64) / 2
    target = half_ulp * rng.choice([1, 3, 5, -1, -3], count)  # an exact tie offset
    a = (rng.uniform(1, 2, count) * np.exp2(rng.integers(-20, 20, count))).astype(np.float32)
    b = (target / a).astype(np.float32)  # a*b = target * (1 + O(2**-24))
    exact_tie = rng.random(count) < 0.25
    a = np.where(exact_tie, np.float32(1), a)
    b = np.where(exact_tie, target.astype(np.float32), b)
    return p, a, b


def test_fma_f32_matches_fraction_on_random_and_near_tie_cases(rng: np.random.Generator) -> None:
    # Random bit patterns (every finite fp32 incl. subnormals; products far beyond fp32's range)
    raw = rng.integers(0, 2**32, size=(3, 1500), dtype=np.uint64).astype(np.uint32)
    p, a, b = raw.view(np.float32)
    keep = np.isfinite(p) & np.isfinite(a) & np.isfinite(b)
    p, a, b = p[keep], a[keep], b[keep]
    # ... plus products near the partial sum's magnitude, where rounding and cancellation happen
    p2 = random_values(rng, (1500,), np.float32)
    a2 = random_values(rng, (1500,), np.float32)
    b2 = random_values(rng, (1500,), np.float32)
    p3, a3, b3 = _near_tie_cases(rng, 3000)
    p, a, b = np.concatenate([p, p2, p3]), np.concatenate([a, a2, a3]), np.concatenate([b, b2, b3])
    expected = np.array(
        [exact_fma(*map(float, t)) for t in zip(p, a, b, strict=True)], dtype=np.float32
    )
    got = ref.fma_f32(p, a, b)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(bits(got), bits(expected))
    # The near-tie set must really contain cases where naive float64 evaluation double-rounds.
    with np.errstate(over="ignore"):
        naive = (p3.astype(np.float64) + a3.astype(np.float64) * b3.astype(np.float64)).astype(
            np.float32
        )
    assert np.count_nonzero(naive != got[-len(p3) :]) >= 10


def test_fma_f32_special_values() -> None:
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    one, zero = np.float32(1), np.float32(0)
    assert ref.fma_f32(zero, inf, one) == np.inf
    assert np.isnan(ref.fma_f32(zero, inf, zero))  # Inf * 0
    assert np.isnan(ref.fma_f32(-inf, inf, one))  # Inf - Inf
    assert np.isnan(ref.fma_f32(nan, one, one))
    assert ref.fma_f32(inf, np.float32(-3e38), np.float32(3e38)) == np.inf  # Inf stays
    # 2**127 + 2**64 * 2**63 = 2**128 overflows to Inf
    assert ref.fma_f32(np.float32(2**127), np.float32(2**64), np.float32(2**63)) == np.inf
    f32_max = np.finfo(np.float32).max
    # fp32 max has ulp 2**104: + 2**102 stays, + 2**103 is a tie and goes to the even 2**128 = Inf
    assert ref.fma_f32(f32_max, np.float32(2**100), np.float32(2**2)) == f32_max
    assert ref.fma_f32(f32_max, np.float32(2**100), np.float32(2**3)) == np.inf
    # a negative sum below half the smallest subnormal rounds to -0.0; -0.0 + -0.0 stays -0.0
    neg_zero = ref.fma_f32(zero, np.float32(-(2**-75)), np.float32(2**-76))
    assert neg_zero == 0 and np.signbit(neg_zero)
    assert np.signbit(ref.fma_f32(neg_zero, np.float32(-0.0), one))
    assert not np.signbit(ref.fma_f32(neg_zero, zero, one))  # -0.0 + +0.0 = +0.0


# --------------------------------------------------------------------------------------------
# nc_matmul: one instruction
# --------------------------------------------------------------------------------------------


def test_nc_matmul_1x1x1() -> None:
    out = ref.nc_matmul(np.array([[3.0]], dtype=BF16), np.array([[-0.5]], dtype=BF16))
    assert out.dtype == np.float32 and out.shape == (1, 1) and out.flags.c_contiguous
    assert out[0, 0] == -1.5


def test_nc_matmul_is_stationary_transposed_times_moving() -> None:
    # stationary [K=2, M=3], moving [K=2, N=2]: out[m, n] = sum_k s[k, m] * v[k, n]
    s = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float16)
    v = np.array([[1, -1], [0.5, 2]], dtype=np.float16)
    expected = np.array([[3, 7], [4.5, 8], [6, 9]], dtype=np.float32)
    assert_bits_equal(ref.nc_matmul(s, v), expected)


def test_nc_matmul_ascending_k_order_matters() -> None:
    # products 2**24, 1, 1, -2**24 in this order: 2**24 + 1 ties to even 2**24 twice, then 0.
    # Any other order (or an exact sum, 2) would differ.
    s = np.array([[2**24], [1], [1], [-(2**24)]], dtype=BF16)
    v = np.ones((4, 1), dtype=BF16)
    assert ref.nc_matmul(s, v)[0, 0] == 0.0
    assert ref.nc_matmul(s[::-1], v)[0, 0] == 2.0  # -2**24 + 1 + 1 is exact, + 2**24 = 2
    assert ref.nc_matmul(s[[0, 3, 1, 2]], v)[0, 0] == 2.0  # 0 + 1 + 1


def test_nc_matmul_double_row_order_is_k_then_k_plus_128() -> None:
    # fp8_e4m3: 128 * 128 = 2**14 (fp32 ulp 2**-9), 2**-9 * 2**-9 = 2**-18 (below half an ulp).
    # Order [0,0], [0,1], [1,0]: 2**14 - 2**14 = 0, + 2**-18 = 2**-18.
    # Index order 0..255 ([k,0] for all k first) would give (2**14 + 2**-18) - 2**14 = 0.
    s = np.zeros((128, 2, 1), dtype=E4M3)
    v = np.zeros((128, 2, 1), dtype=E4M3)
    s[0, 0, 0], v[0, 0, 0] = 128, 128
    s[0, 1, 0], v[0, 1, 0] = -128, 128
    s[1, 0, 0], v[1, 0, 0] = 2**-9, 2**-9
    assert float(s[1, 0, 0]) == 2**-9  # e4m3 subnormal, exactly
    out = ref.nc_matmul(s, v, perf_mode="double_row")
    assert out.shape == (1, 1) and out[0, 0] == 2**-18
    # the same data as [256, 1] in "k then k+128" index order gives the same bits
    flat_s = s.transpose(1, 0, 2).reshape(256, 1)
    flat_v = v.transpose(1, 0, 2).reshape(256, 1)
    assert ref.nc_matmul(flat_s[:128], flat_v[:128])[0, 0] == 2**14  # 2**-18 absorbed


def test_nc_matmul_fp32_uses_fused_single_rounding() -> None:
    s = np.array([[2**24], [1 + 2**-12]], dtype=np.float32)
    v = np.array([[1], [1 - 4095 * 2**-24]], dtype=np.float32)
    assert ref.nc_matmul(s, v)[0, 0] == 2**24 + 2  # see the fma_f32 test; float64 gives 2**24
    # bf16 stationary x fp32 moving: 205 * 5237765 = 2**30 + 1 (32-bit product). After 2**54
    # (fp32 ulp 2**31) the exact sum 2**54 + 2**30 + 1 is just above a tie: 2**54 + 2**31.
    # A float64 sum (ulp 4) drops the 1 and the tie goes to even, 2**54.
    assert 205 * 5237765 == 2**30 + 1
    s_bf16 = np.array([[2.0**54], [205]], dtype=BF16)
    v_f32 = np.array([[1], [5237765]], dtype=np.float32)
    assert ref.nc_matmul(s_bf16, v_f32)[0, 0] == 2**54 + 2**31
    assert np.float32(np.float64(2.0**54) + 205.0 * 5237765.0) == 2**54


def test_nc_matmul_accumulate() -> None:
    s = np.ones((2, 1), dtype=BF16)
    v = np.ones((2, 1), dtype=BF16)  # partial = 2
    psum = np.array([[2**24]], dtype=np.float32)
    assert ref.nc_matmul(s, v, psum=psum)[0, 0] == 2**24 + 2
    # partial 1: 2**24 + 1 is a tie and rounds to even, 2**24 (not +1 twice: no carry over)
    assert ref.nc_matmul(s[:1], v[:1], psum=psum)[0, 0] == 2**24
    assert ref.nc_matmul(s[:1], v[:1], psum=psum + 2)[0, 0] == 2**24 + 4
    # psum is read, never written
    assert psum[0, 0] == 2**24
    # Inf in PSUM stays; Inf - Inf is NaN
    big = np.array([[2.0**127]], dtype=BF16)
    assert ref.nc_matmul(big, big, psum=psum)[0, 0] == np.inf
    assert np.isnan(ref.nc_matmul(big, -big, psum=np.array([[np.inf]], np.float32))[0, 0])


def test_nc_matmul_matches_slow_oracle(rng: np.random.Generator) -> None:
    for dt_s, dt_v, k, m, n in [
        (BF16, BF16, 128, 3, 5),
        (np.float16, np.float16, 77, 2, 4),
        (E4M3, E5M2, 128, 4, 3),
        (BF16, E4M3, 33, 3, 3),
        (np.float32, np.float32, 128, 3, 4),
        (np.float32, np.float32, 1, 1, 1),
    ]:
        s = random_values(rng, (k, m), dt_s)
        v = random_values(rng, (k, n), dt_v)
        assert_bits_equal(ref.nc_matmul(s, v), slow_gemm(s.T, v))


def test_nc_matmul_double_row_matches_slow_oracle(rng: np.random.Generator) -> None:
    s = random_values(rng, (256, 3), E4M3)
    v = random_values(rng, (256, 4), E5M2)
    out = ref.nc_matmul(
        s.reshape(2, 128, 3).transpose(1, 0, 2),
        v.reshape(2, 128, 4).transpose(1, 0, 2),
        perf_mode="double_row",
    )
    assert_bits_equal(out, slow_gemm(s.T, v, perf_mode="double_row"))


def test_fast_path_equals_round_to_odd_path_for_16_bit_inputs(rng: np.random.Generator) -> None:
    # The float64 shortcut for <= 16-bit inputs must agree with the exact path everywhere,
    # including products beyond fp32's range and below its subnormals.
    for dt in (BF16, np.float16, E4M3, E5M2):
        info = ml_dtypes.finfo(dt)
        lo, hi = np.log2(float(info.smallest_subnormal)), np.log2(float(info.max))
        s = (rng.choice([-1, 1], (128, 16)) * np.exp2(rng.uniform(lo, hi, (128, 16)))).astype(dt)
        v = (rng.choice([-1, 1], (128, 16)) * np.exp2(rng.uniform(lo, hi, (128, 16)))).astype(dt)
        s64, v64 = s.astype(np.float64), v.astype(np.float64)
        fast = ref._partial_sum(s64, v64, exact=False)
        exact = ref._partial_sum(s64, v64, exact=True)
        np.testing.assert_array_equal(bits(fast), bits(exact))


# --------------------------------------------------------------------------------------------
# gemm: K tiling
# --------------------------------------------------------------------------------------------


def test_gemm_tile_boundary_at_128_changes_the_result() -> None:
    # bf16 row of K = 192 against ones:
    #   tile 0 (k < 128): 2**24 then 127 ones, each 2**24 + 1 ties to even -> 2**24
    #   tile 1: 63 ones then -2**24 -> 63 - 2**24 = -16777153, exact
    #   PSUM: 2**24 - 16777153 = 63.
    # A single ascending chain would give 0, the exact sum 190.
    a = np.ones((1, 192), dtype=BF16)
    a[0, 0] = 2**24
    a[0, 191] = -(2**24)
    b = np.ones((192, 1), dtype=BF16)
    assert ref.gemm(a, b)[0, 0] == 63.0
    assert slow_tile([(float(x), 1.0) for x in a[0]]) == 0.0  # one chain: cancelled away
    assert_bits_equal(ref.gemm(a, b), slow_gemm(a, b))


def _pairing_operands(k: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    """fp8_e4m3 operands 1 x k and k x 1, zero but for products 2**14 at ``j``, -2**14 at
    ``j + 128`` and 2**-18 at ``j + 1``."""
    a = np.zeros((1, k), dtype=E4M3)
    b = np.zeros((k, 1), dtype=E4M3)
    a[0, j], b[j, 0] = 128, 128
    a[0, j + 128], b[j + 128, 0] = -128, 128
    a[0, j + 1], b[j + 1, 0] = 2**-9, 2**-9
    return a, b


def test_gemm_double_row_pairs_k_with_k_plus_128() -> None:
    # fp8_e4m3, K = 256: products 2**14 at j=0, -2**14 at j=128, 2**-18 at j=1.
    # double_row order 0, 128, 1, ...: 2**-18. Plain tiles (0..127 then 128..255): 0.
    a, b = _pairing_operands(256, 0)
    assert ref.gemm(a, b, perf_mode="double_row")[0, 0] == 2**-18
    assert ref.gemm(a, b)[0, 0] == 0.0


def test_gemm_double_row_short_tile_keeps_k_plus_128_pairing() -> None:
    # K = 256 + 130: the second tile has 130 elements; its order is 0, 128, 1, 129, 2, 3, ...
    # (local indices). Products 2**14 at local 0, -2**14 at local 128, 2**-18 at local 1 give
    # 2**-18; pairing the halves of a short tile differently (e.g. j and j + 65) gives 0.
    a, b = _pairing_operands(386, 256)
    assert ref.gemm(a, b, perf_mode="double_row")[0, 0] == 2**-18
    assert_bits_equal(ref.gemm(a, b, perf_mode="double_row"), slow_gemm(a, b, "double_row"))


def test_double_row_order() -> None:
    assert ref.double_row_order(256).tolist()[:6] == [0, 128, 1, 129, 2, 130]
    assert sorted(ref.double_row_order(256).tolist()) == list(range(256))
    assert ref.double_row_order(130).tolist() == [0, 128, 1, 129, *range(2, 128)]
    assert ref.double_row_order(5).tolist() == [0, 1, 2, 3, 4]
    assert ref.double_row_order(0).tolist() == []
    with pytest.raises(ValueError, match="257"):
        ref.double_row_order(257)


def test_gemm_double_row_full_tiles_equal_nc_matmul_layout(rng: np.random.Generator) -> None:
    # gemm's double_row tile t is nc_matmul on a[:, t].T reshaped [2, 128, M] -> [128, 2, M]
    a = random_values(rng, (3, 512), E4M3)
    b = random_values(rng, (512, 4), E5M2)

    def layout(x: np.ndarray) -> np.ndarray:
        return x.reshape(2, 128, x.shape[1]).transpose(1, 0, 2)

    psum = ref.nc_matmul(layout(a[:, :256].T), layout(b[:256]), perf_mode="double_row")
    psum = ref.nc_matmul(layout(a[:, 256:].T), layout(b[256:]), perf_mode="double_row", psum=psum)
    assert_bits_equal(ref.gemm(a, b, perf_mode="double_row"), psum)


def test_gemm_accumulates_tiles_like_chained_nc_matmul(rng: np.random.Generator) -> None:
    a = random_values(rng, (5, 300), BF16)
    b = random_values(rng, (300, 7), BF16)
    psum = ref.nc_matmul(a[:, :128].T, b[:128])
    psum = ref.nc_matmul(a[:, 128:256].T, b[128:256], psum=psum)
    psum = ref.nc_matmul(a[:, 256:].T, b[256:], psum=psum)
    assert_bits_equal(ref.gemm(a, b), psum)
    # M and N tiling change no bit: any block of the output is the gemm of the blocks
    assert_bits_equal(ref.gemm(a[2:4], b[:, 3:6]), ref.gemm(a, b)[2:4, 3:6])


@pytest.mark.parametrize(
    ("dt_a", "dt_b", "m", "k", "n", "perf_mode"),
    [
        (BF16, BF16, 1, 1, 1, "none"),
        (np.float32, np.float32, 1, 1, 1, "none"),
        (BF16, BF16, 2, 4097, 3, "none"),
        (np.float16, np.float16, 2, 1000, 2, "none"),
        (np.float32, np.float32, 2, 4097, 2, "none"),
        (E4M3, E5M2, 3, 257, 2, "none"),
        (E4M3, E4M3, 2, 4097, 2, "double_row"),
        (E5M2, E4M3, 3, 300, 3, "double_row"),
        (E4M3, E4M3, 1, 1, 1, "double_row"),
    ],
)
def test_gemm_matches_slow_oracle(
    rng: np.random.Generator, dt_a: object, dt_b: object, m: int, k: int, n: int, perf_mode: str
) -> None:
    a = random_values(rng, (m, k), dt_a)
    b = random_values(rng, (k, n), dt_b)
    got = ref.gemm(a, b, perf_mode=perf_mode)
    assert_bits_equal(got, slow_gemm(a, b, perf_mode))
    # and it is close to the exact product (a sanity check on the slow oracle's plumbing)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert np.all(np.abs(got - exact) <= (k + 2) * 2.0**-24 * scale + 2.0**-149)


def test_gemm_input_layouts_do_not_matter(rng: np.random.Generator) -> None:
    a = random_values(rng, (6, 200), np.float16)
    b = random_values(rng, (200, 5), np.float16)
    expected = ref.gemm(a, b)
    strided = np.zeros((200, 10), dtype=np.float16)
    strided[:, ::2] = b
    assert_bits_equal(ref.gemm(np.asfortranarray(a), strided[:, ::2]), expected)
    a_ro = a.copy()
    a_ro.flags.writeable = False
    assert_bits_equal(ref.gemm(a_ro, b), expected)
    assert_bits_equal(ref.gemm(a.astype(">f2"), b), expected)


def test_gemm_takes_a_signalling_nan_quietly() -> None:
    # bf16 0x7F81 is a signalling NaN: widening it raises numpy's "invalid value" warning,
    # which the test suite makes an error. The oracle's products with it are NaN.
    snan = np.array([[0x7F81]], np.uint16).view(BF16)
    out = ref.gemm(np.zeros((1, 1), BF16), snan)
    assert np.isnan(out).all() and out.shape == (1, 1)
    # The same in nc_matmul's oracle, and in the host's conversion to an integer machine dtype
    # (NaN to 0).
    assert np.isnan(ref.nc_matmul(snan, np.ones((1, 1), BF16))).all()
    from trn2core.machine import to_machine

    assert to_machine(snan, "int32").tolist() == [[0]]


def test_gemm_k_zero_and_negative_zero() -> None:
    out = ref.gemm(np.zeros((2, 0), BF16), np.zeros((0, 3), BF16))
    assert out.shape == (2, 3) and out.dtype == np.float32
    assert not np.signbit(out).any() and not out.any()
    # every product -0.0: the partial sum starts at +0.0 and +0.0 + -0.0 = +0.0
    neg = ref.gemm(np.full((1, 130), -0.0, BF16), np.ones((130, 1), BF16))
    assert neg[0, 0] == 0 and not np.signbit(neg[0, 0])
    # -2**-151 underflows to -0.0; -0.0 products keep it, a +0.0 product or partial makes it +0.0
    a = np.array([[-(2.0**-75), 0.0, 0.0]], dtype=BF16)
    b = np.array([[2.0**-76], [-1.0], [1.0]], dtype=BF16)
    assert np.signbit(ref.gemm(a[:, :2], b[:2])[0, 0])  # -0.0, then + (0 * -1 = -0.0)
    assert not np.signbit(ref.gemm(a, b)[0, 0])  # ... then + (0 * 1 = +0.0)
    # Across K tiles: tile 0 = -2**-151 -> -0.0, then 0 * -2**-76 = -0.0 keeps -0.0.
    # Tile 1 starts again at +0.0: with a zero first product it is +0.0 and PSUM -0.0 + +0.0 is
    # +0.0; with -2**-151 first it is -0.0 and PSUM -0.0 + -0.0 stays -0.0.
    a_tiles = np.zeros((1, 130), BF16)
    a_tiles[0, 0] = -(2.0**-75)
    b_tiles = np.full((130, 1), -(2.0**-76), BF16)
    b_tiles[[0, 128], 0] = 2.0**-76
    plus = ref.gemm(a_tiles, b_tiles)
    assert plus[0, 0] == 0 and not np.signbit(plus[0, 0])
    a_tiles[0, 128] = -(2.0**-75)
    minus = ref.gemm(a_tiles, b_tiles)
    assert minus[0, 0] == 0 and np.signbit(minus[0, 0])
    assert_bits_equal(minus, slow_gemm(a_tiles, b_tiles))


# --------------------------------------------------------------------------------------------
# Special values and range
# --------------------------------------------------------------------------------------------


def test_inf_and_nan_propagate() -> None:
    a = np.array([[np.inf, 1.0], [np.inf, 0.0], [np.nan, 1.0], [np.inf, -np.inf]], dtype=BF16)
    b = np.array([[1.0, 0.0], [2.0, 1.0]], dtype=BF16)  # K = 2
    out = ref.gemm(a, b)
    # row 0: inf*1 + 1*2 = inf; inf*0 + 1*1 = NaN
    # row 1: inf*1 + 0*2 = inf; inf*0 + 0 = NaN
    # row 2: NaN everywhere; row 3: inf*1 + -inf*2 = NaN, inf*0 + ... = NaN
    assert out[0, 0] == np.inf and out[1, 0] == np.inf
    np.testing.assert_array_equal(
        np.isnan(out), [[False, True], [False, True], [True, True], [True, True]]
    )
    # an Inf in the first K tile survives the accumulation of later finite tiles
    a2 = np.ones((1, 300), dtype=BF16)
    a2[0, 5] = -np.inf
    assert ref.gemm(a2, np.ones((300, 1), BF16))[0, 0] == -np.inf


def test_partial_sum_overflow_to_inf_is_final() -> None:
    # bf16 products 2**127, 2**127, -2**127: the second step rounds 2**128 to Inf, and Inf stays,
    # although the exact total (2**127) is finite.
    a = np.array([[2.0**64, 2.0**64, -(2.0**64)]], dtype=BF16)
    b = np.array([[2.0**63], [2.0**63], [2.0**63]], dtype=BF16)
    assert ref.gemm(a, b)[0, 0] == np.inf
    assert ref.gemm(a[:, [0, 2, 1]], b)[0, 0] == 2**127  # other order: no overflow


def test_bf16_products_beyond_fp32_range_cancel_exactly() -> None:
    # -1.5 * 2**127 (fits fp32) then 2**64 * 2**64 = 2**128 (does not): the exact sum 2**126 is
    # the answer, because the product joins the partial sum before any rounding.
    a = np.array([[-1.5 * 2.0**127, 2.0**64]], dtype=BF16)
    b = np.array([[1], [2.0**64]], dtype=BF16)
    assert ref.gemm(a, b)[0, 0] == 2**126
    # max_bf16**2 ~ 2**256 is Inf once rounded (no fp32 partial can cancel it)
    big = np.array([[float(ml_dtypes.finfo(BF16).max)]], dtype=BF16)
    assert ref.gemm(big, big)[0, 0] == np.inf
    assert ref.gemm(-big, big)[0, 0] == -np.inf
    # products below fp32's subnormals round once: 2**-150 is a tie -> +0, 1.5 * 2**-150 -> 2**-149
    tiny = np.array([[2.0**-75]], dtype=BF16)
    assert ref.gemm(tiny, tiny)[0, 0] == 0.0
    assert ref.gemm(tiny, (tiny.astype(np.float32) * 1.5).astype(BF16))[0, 0] == 2.0**-149
    # ... and 2**-100 * 2**-100 added to 2**-149 does not move it (exact sum just above the value)
    a3 = np.array([[2.0**-75, 2.0**-100]], dtype=BF16)
    b3 = np.array([[2.0**-74], [2.0**-100]], dtype=BF16)
    assert ref.gemm(a3, b3)[0, 0] == 2.0**-149


# --------------------------------------------------------------------------------------------
# transpose and argument checks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [BF16, np.float16, E4M3, E5M2, np.float32])
def test_transpose_is_bit_exact(rng: np.random.Generator, dt: object) -> None:
    itemsize = np.dtype(dt).itemsize
    codes = rng.integers(0, 2 ** (8 * itemsize), size=(7, 5), dtype=np.uint64)
    codes = codes.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[itemsize])
    x = codes.view(dt)  # every code, NaN payloads and -0.0 included
    t = ref.transpose(x)
    assert t.dtype == np.dtype(dt) and t.shape == (5, 7) and t.flags.c_contiguous
    np.testing.assert_array_equal(bits(t), codes.T)


def test_argument_errors() -> None:
    x = np.ones((4, 3), dtype=BF16)
    with pytest.raises(ValueError, match="contraction length"):
        ref.nc_matmul(x, np.ones((5, 3), dtype=BF16))
    with pytest.raises(ValueError, match="exceeds the limit 128"):
        ref.nc_matmul(np.ones((129, 2), BF16), np.ones((129, 2), BF16))
    with pytest.raises(ValueError, match=r"\[128, 2, F\]"):
        ref.nc_matmul(x, x, perf_mode="double_row")
    with pytest.raises(ValueError, match="perf_mode"):
        ref.gemm(x.T, x, perf_mode="fast")
    with pytest.raises(TypeError, match="float64"):
        ref.gemm(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(TypeError, match="int"):
        ref.nc_matmul(np.ones((2, 2), np.int32), x[:2])
    with pytest.raises(ValueError, match="psum"):
        ref.nc_matmul(x, x, psum=np.zeros((3, 3), np.float64))
    with pytest.raises(ValueError, match="K = 5"):
        ref.gemm(x.T, np.ones((5, 2), BF16))
