"""Contract section 1: number formats, rounding, encode and decode.

Oracles, in the manner of ml_dtypes' exhaustive bit-pattern tests:

* ``x.astype(<ml_dtypes dtype>)`` for ``nearest_even`` without saturation, compared bit for bit,
  on float32 inputs only (ml_dtypes casts a float64 through float32 first, so it rounds twice);
* ``gfloat.round_ndarray`` for every mode and saturation flag, on float32 and float64 inputs;
  where gfloat is the oracle any NaN code matches any NaN code;
* an exact integer reference for stochastic rounding (``_exact_stochastic``), for the cases
  where gfloat's float64 sum ``delta + r / 2**n`` is not exact (float64 inputs, n >= 30).

Inputs are boundary-heavy: every value of the format (a dense sample of codes for fp32 and
tf32), every midpoint between neighbours (also the one above max and those among the
subnormals), the float32 (and float64) neighbours of every midpoint, both signs, zeros,
infinities, NaNs, values beyond max and values below half the smallest subnormal.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from functools import cache

import gfloat
import ml_dtypes
import numpy as np
import pytest
import trn2core
from gfloat import Domain, FormatInfo, RoundMode
from gfloat.formats import (
    format_info_bfloat16,
    format_info_binary16,
    format_info_binary32,
    format_info_ocp_e4m3,
    format_info_ocp_e5m2,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# ---------------------------------------------------------------------------------------------
# The formats, written down independently of the implementation.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fmt:
    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    min_normal: float
    min_subnormal: float
    has_inf: bool
    dtype: np.dtype  # what quantize returns
    code_dtype: np.dtype  # what encode returns
    nan_code: int  # canonical quiet NaN, positive sign
    num_high_nans: int  # gfloat's description of the special codes

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def is_fp8(self) -> bool:
        return self.name.startswith("fp8")

    @property
    def sign_bit(self) -> int:
        # tf32 lives in a float32 container: its sign is float32's.
        return 1 << (np.dtype(self.code_dtype).itemsize * 8 - 1)


F32 = np.dtype(np.float32)
U8, U16, U32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
# fmt: off
FMTS = {f.name: f for f in [
    #   name          e   m  bias  max                          min_normal  min_subnormal has_inf
    #   dtype                                  codes nan_code    num_high_nans
    Fmt("fp32",       8, 23, 127, float(np.finfo(F32).max),     2.0**-126, 2.0**-149, True,
        F32,                                   U32, 0x7FC00000, 2**23 - 1),
    Fmt("tf32",       8, 10, 127, (2 - 2.0**-10) * 2.0**127,    2.0**-126, 2.0**-136, True,
        F32,                                   U32, 0x7FC00000, 2**10 - 1),
    Fmt("bf16",       8,  7, 127, (2 - 2.0**-7) * 2.0**127,     2.0**-126, 2.0**-133, True,
        np.dtype(ml_dtypes.bfloat16),          U16, 0x7FC0,     2**7 - 1),
    Fmt("fp16",       5, 10,  15, 65504.0,                      2.0**-14,  2.0**-24,  True,
        np.dtype(np.float16),                  U16, 0x7E00,     2**10 - 1),
    Fmt("fp8_e4m3",   4,  3,   7, 240.0,                        2.0**-6,   2.0**-9,   True,
        np.dtype(ml_dtypes.float8_e4m3),       U8,  0x7C,       7),
    Fmt("fp8_e5m2",   5,  2,  15, 57344.0,                      2.0**-14,  2.0**-16,  True,
        np.dtype(ml_dtypes.float8_e5m2),       U8,  0x7E,       3),
    Fmt("fp8_e3m4",   3,  4,   3, 15.5,                         2.0**-2,   2.0**-6,   True,
        np.dtype(ml_dtypes.float8_e3m4),       U8,  0x78,       15),
    Fmt("fp8_e4m3fn", 4,  3,   7, 448.0,                        2.0**-6,   2.0**-9,   False,
        np.dtype(ml_dtypes.float8_e4m3fn),     U8,  0x7F,       1),
]}
# fmt: on
FORMATS = tuple(FMTS)
FP8 = tuple(n for n in FORMATS if FMTS[n].is_fp8)
EXHAUSTIVE = ("bf16", "fp16") + FP8  # formats small enough to enumerate every code
ROUNDING_MODES = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
)
DETERMINISTIC_MODES = ROUNDING_MODES[:-1]
GF_MODE = {
    "nearest_even": RoundMode.TiesToEven,
    "nearest_away": RoundMode.TiesToAway,
    "toward_zero": RoundMode.TowardZero,
    "toward_positive": RoundMode.TowardPositive,
    "toward_negative": RoundMode.TowardNegative,
    "stochastic": RoundMode.StochasticFastest,
}
LOW_PRECISION_INPUT_DTYPES = (
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e3m4),
    np.dtype(ml_dtypes.float8_e4m3fn),
)


@cache
def gf_info(name: str, bias: int | None = None) -> FormatInfo:
    """gfloat's description of a format, optionally with Trainium2's configurable FP8 bias."""
    f = FMTS[name]
    return FormatInfo(
        f"{name}" if bias is None else f"{name}_b{bias}",
        k=19 if name == "tf32" else f.bits,
        precision=f.mantissa_bits + 1,
        bias=f.bias if bias is None else bias,
        is_signed=True,
        domain=Domain.Extended if f.has_inf else Domain.Finite,
        has_nz=True,
        num_high_nans=f.num_high_nans,
        has_subnormals=True,
        is_twos_complement=False,
    )


def scale_of(name: str, bias: int | None) -> float:
    """A code means standard_value * scale under exponent_bias=bias."""
    return 1.0 if bias is None else 2.0 ** (FMTS[name].bias - bias)


# ---------------------------------------------------------------------------------------------
# Helpers: codes, oracles and a readable bitwise comparison.
# ---------------------------------------------------------------------------------------------


def as_codes(a: np.ndarray, name: str) -> np.ndarray:
    """View an output of quantize (the format's numpy dtype) as unsigned codes."""
    f = FMTS[name]
    a = np.asarray(a)
    assert a.dtype == f.dtype, f"{name}: dtype {a.dtype}, expected {f.dtype}"
    return np.array(a, order="C").view(f.code_dtype)  # (ascontiguousarray makes 0-d 1-d)


def codes_from_values(v: np.ndarray, name: str, bias: int | None = None) -> np.ndarray:
    """Codes of float64 values that the format represents exactly (also +-Inf, NaN)."""
    f = FMTS[name]
    std = np.asarray(v, np.float64) / scale_of(name, bias)  # a power of two: exact
    return std.astype(f.dtype).view(f.code_dtype)


def standard_values(codes: np.ndarray, name: str) -> np.ndarray:
    f = FMTS[name]
    return np.array(codes, order="C").astype(f.code_dtype).view(f.dtype).astype(np.float64)


def code_isnan(codes: np.ndarray, name: str) -> np.ndarray:
    return np.isnan(standard_values(codes, name))


def gf_round(name, x, mode="nearest_even", saturate=False, bits=None, nbits=0, bias=None):
    """gfloat's rounding of x (converted exactly to float64) as float64 values."""
    x64 = np.asarray(x).astype(np.float64)
    if bits is not None:
        bits = np.broadcast_to(np.asarray(bits, np.int64), x64.shape)
    with np.errstate(all="ignore"):
        return gfloat.round_ndarray(
            gf_info(name, bias), x64, GF_MODE[mode], sat=saturate, srbits=bits, srnumbits=nbits
        )


def describe(v) -> str:
    v = float(np.asarray(v).reshape(-1)[0])
    if math.isnan(v) or math.isinf(v):
        return repr(v)
    return f"{v!r} ({v.hex()})"


def assert_codes_equal(got, want, x, name, *, any_nan=False, label="", bias=None):
    """Bitwise comparison of code arrays with a readable report of the first differences."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{label}: shape {got.shape}, expected {want.shape}"
    bad = got != want
    if any_nan:
        bad &= ~(code_isnan(got, name) & code_isnan(want, name))
    if not bad.any():
        return
    width = np.dtype(FMTS[name].code_dtype).itemsize * 2
    scale = scale_of(name, bias)
    xs = np.broadcast_to(np.asarray(x), got.shape).ravel()
    g, w = got.ravel(), want.ravel()
    idx = np.flatnonzero(bad.ravel())
    lines = [
        f"  x={describe(xs[i])} [{np.asarray(x).dtype}]: expected 0x{int(w[i]):0{width}x} "
        f"({describe(standard_values(w[i], name) * scale)}), got 0x{int(g[i]):0{width}x} "
        f"({describe(standard_values(g[i], name) * scale)})"
        for i in idx[:12]
    ]
    pytest.fail(f"{name} {label}: {idx.size} of {bad.size} codes differ:\n" + "\n".join(lines))


def canonical_nan_codes(x, name) -> np.ndarray:
    f = FMTS[name]
    sign = np.signbit(np.asarray(x).astype(np.float64))
    return np.where(sign, f.nan_code | f.sign_bit, f.nan_code).astype(f.code_dtype)


# ---------------------------------------------------------------------------------------------
# Boundary-heavy samples.
# ---------------------------------------------------------------------------------------------


def _sampled_positive_codes(f: Fmt) -> np.ndarray:
    """A dense sample of the finite positive codes of fp32 / tf32 (2**31 / 2**18 codes)."""
    rng = np.random.default_rng(20240611)
    m = f.mantissa_bits
    top = 2**m - 1
    mants = np.array(
        sorted(
            {
                0,
                1,
                2,
                3,
                4,
                5,
                2 ** (m - 1) - 1,
                2 ** (m - 1),
                2 ** (m - 1) + 1,
                top - 4,
                top - 3,
                top - 2,
                top - 1,
                top,
            }
        ),
        np.int64,
    )
    exps = np.arange(0, 255, dtype=np.int64)
    codes = [(exps[:, None] << m | mants[None, :]).ravel()]
    codes.append(rng.integers(0, 255 << m, size=20000))
    full = np.arange(2**m) if m <= 10 else np.arange(2048)  # a whole binade where it is cheap
    for e in (0, 1, 2, 126, 127, 128, 253, 254):
        codes.append((e << m) | full)
    return np.unique(np.concatenate(codes)).astype(np.int64)


@cache
def positive_grid(name: str, bias: int | None = None):
    """(values, midpoints) of the format as float64: positive finite values incl. +0, and the
    midpoint of each value with its upper neighbour, plus the midpoint above max."""
    f = FMTS[name]
    fi = gf_info(name, bias)
    max_code = fi.code_of_max
    if name in ("fp32", "tf32"):
        codes = _sampled_positive_codes(f)
    else:
        codes = np.arange(max_code + 1, dtype=np.int64)
    values = gfloat.decode_ndarray(fi, codes)
    lower = codes[codes < max_code]
    mids = (gfloat.decode_ndarray(fi, lower) + gfloat.decode_ndarray(fi, lower + 1)) / 2
    fmax = float(gfloat.decode_ndarray(fi, np.array([max_code]))[0])
    ulp_max = fmax - float(gfloat.decode_ndarray(fi, np.array([max_code - 1]))[0])
    assert fmax == fi.max
    mids = np.append(mids, fmax + ulp_max / 2)
    return values, mids, fmax, ulp_max


def _extras(name: str, bias: int | None) -> np.ndarray:
    f = FMTS[name]
    _, _, fmax, ulp = positive_grid(name, bias)
    sub = f.min_subnormal * scale_of(name, bias)
    f32 = np.finfo(np.float32)
    return np.array(
        [
            sub / 4,
            sub * 0.49,
            sub * 0.51,
            sub * 0.75,
            sub * 1.25,
            sub * 1.5,
            sub * 1.75,
            fmax + ulp,
            fmax + ulp * 0.75,
            fmax + ulp * 0.25,
            fmax * 2,
            fmax * 16,
            float(f32.max),
            float(f32.smallest_subnormal),
            float(f32.smallest_normal),
            1e30,
            1e-30,
            1.0,
            65504.0,
            65520.0,
            65536.0,
            448.0,
            464.0,
            480.0,
            240.0,
            248.0,
            256.0,
            57344.0,
            61440.0,
            65535.0,
            15.5,
            15.75,
            16.0,
            3.0e38,
        ]
    )


_FLOAT64_ONLY = np.array(
    [
        1e300,
        1e-300,
        5e-324,
        2.0**-150,
        2.0**-150 * (1 + 2.0**-40),
        2.0**-150 * (1 - 2.0**-40),
        2.0**128,
        2.0**128 - 2.0**103,
        (2.0**128 - 2.0**103) * (1 - 2.0**-50),
        2.0**1000,
        1 + 2.0**-8 + 2.0**-40,
        1 + 2.0**-4 + 2.0**-40,
        1 + 2.0**-11 + 2.0**-40,
        1 + 2.0**-24 + 2.0**-60,
    ]
)
_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, np.copysign(np.nan, -1.0)])


def _exact_in_f32(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        v32 = v.astype(np.float32)
    return v32[(v32.astype(np.float64) == v) & np.isfinite(v)]


def _both_signs(v: np.ndarray, dtype) -> np.ndarray:
    v = np.asarray(v, dtype)
    return np.concatenate([v, -v, _SPECIALS.astype(dtype)])


@cache
def _sample(name: str, width: str, bias: int | None = None) -> np.ndarray:
    """Boundary-heavy inputs for a format: width 'f32' (float32) or 'f64' (float64)."""
    values, mids, _, _ = positive_grid(name, bias)
    extras = _extras(name, bias)
    if width == "f32":
        m32 = _exact_in_f32(mids)
        parts = [
            _exact_in_f32(values),
            m32,
            _exact_in_f32(extras),
            np.nextafter(m32, np.float32(np.inf)),
            np.nextafter(m32, np.float32(-np.inf)),
        ]
        out = _both_signs(np.concatenate(parts), np.float32)
    else:
        parts = [
            values,
            mids,
            extras,
            _FLOAT64_ONLY,
            np.nextafter(mids, np.inf),
            np.nextafter(mids, -np.inf),
        ]
        out = _both_signs(np.concatenate(parts), np.float64)
    return out


def sample(name: str, width: str, bias: int | None = None) -> np.ndarray:
    """A fresh, writeable copy of the cached sample."""
    return _sample(name, width, bias).copy()


def small_sample(name: str, width: str, size: int = 1500, bias: int | None = None) -> np.ndarray:
    """A fixed random subset of the sample (plus the specials) for the slow exact reference."""
    full = sample(name, width, bias)
    rng = np.random.default_rng(len(full))
    pick = rng.choice(full.size, size=min(size, full.size), replace=False)
    return np.concatenate([full[np.sort(pick)], full[-len(_SPECIALS) :]])


# ---------------------------------------------------------------------------------------------
# Exact reference for stochastic rounding (gfloat's StochasticFastest without the float64 sum).
# ---------------------------------------------------------------------------------------------


def _exact_stochastic(
    x: float, name: str, r: int, n: int, saturate: bool, bias: int | None = None
) -> float:
    """Round the magnitude of x up iff frac + r / 2**n >= 1, computed in Python integers."""
    fi = gf_info(name, bias)
    if math.isnan(x):
        return math.nan
    negative = math.copysign(1.0, x) < 0
    a = abs(x)
    overflow = fi.max if saturate else (math.inf if fi.domain == Domain.Extended else math.nan)
    if math.isinf(a):
        res = overflow
    elif a == 0:
        res = 0.0
    else:
        mant, ex = math.frexp(a)
        m, e = int(math.ldexp(mant, 53)), ex - 53  # a == m * 2**e exactly
        top = e + m.bit_length() - 1  # floor(log2(a))
        q = max(top, 1 - fi.bias) - (fi.precision - 1)  # exponent of the ulp at a
        if e >= q:
            lo, rem, den = m << (e - q), 0, 1
        else:
            lo, rem, den = m >> (q - e), m & ((1 << (q - e)) - 1), 1 << (q - e)
        up = rem != 0 and (rem << n) + r * den >= den << n
        try:
            res = math.ldexp(lo + int(up), q)
        except OverflowError:  # beyond float64: certainly beyond the format's max
            res = math.inf
        if res > fi.max:
            res = overflow
    return -res if negative else res


def exact_stochastic(x: np.ndarray, name, bits, n, saturate, bias=None) -> np.ndarray:
    xs = np.asarray(x).astype(np.float64)
    bs = np.broadcast_to(np.asarray(bits), xs.shape)
    out = [
        _exact_stochastic(float(v), name, int(r), n, saturate, bias)
        for v, r in zip(xs.ravel(), bs.ravel(), strict=True)
    ]
    return np.array(out, np.float64).reshape(xs.shape)


# ---------------------------------------------------------------------------------------------
# Self-checks of the oracles (these do not touch trn2core).
# ---------------------------------------------------------------------------------------------


def test_oracle_format_table_matches_gfloat_and_ml_dtypes():
    for builtin, name in [
        (format_info_binary32, "fp32"),
        (format_info_bfloat16, "bf16"),
        (format_info_binary16, "fp16"),
        (format_info_ocp_e5m2, "fp8_e5m2"),
        (format_info_ocp_e4m3, "fp8_e4m3fn"),
    ]:
        mine = gf_info(name)
        for field in ("k", "precision", "bias", "domain", "num_high_nans", "has_nz"):
            assert getattr(mine, field) == getattr(builtin, field), (name, field)
    for name, f in FMTS.items():
        fi = gf_info(name)
        assert (fi.max, fi.smallest_normal, fi.smallest_subnormal) == (
            f.max,
            f.min_normal,
            f.min_subnormal,
        ), name
        if name != "tf32":
            fin = ml_dtypes.finfo(f.dtype)
            assert (float(fin.max), float(fin.smallest_normal), float(fin.smallest_subnormal)) == (
                f.max,
                f.min_normal,
                f.min_subnormal,
            ), name
            assert np.isnan(np.array(f.nan_code, f.code_dtype).view(f.dtype).astype(np.float32))


@pytest.mark.parametrize("name", FORMATS)
def test_oracle_exact_stochastic_reference_agrees_with_gfloat(name, rng):
    x = small_sample(name, "f32", 600)
    for n in (1, 5, 29):
        bits = rng.integers(0, 2**n, size=x.shape)
        for saturate in (False, True):
            want = codes_from_values(gf_round(name, x, "stochastic", saturate, bits, n), name)
            mine = codes_from_values(exact_stochastic(x, name, bits, n, saturate), name)
            assert_codes_equal(mine, want, x, name, any_nan=True, label=f"reference n={n}")


# ---------------------------------------------------------------------------------------------
# Constants and format_info.
# ---------------------------------------------------------------------------------------------


def test_format_and_mode_tuples():
    assert trn2core.FORMATS == FORMATS
    assert trn2core.ROUNDING_MODES == ROUNDING_MODES
    assert type(trn2core.FORMATS) is tuple and type(trn2core.ROUNDING_MODES) is tuple


@pytest.mark.parametrize("name", FORMATS)
def test_format_info_fields(name):
    f = FMTS[name]
    info = trn2core.format_info(name)
    assert dataclasses.is_dataclass(info)
    assert info.name == name
    assert (info.exponent_bits, info.mantissa_bits, info.bias) == (
        f.exponent_bits,
        f.mantissa_bits,
        f.bias,
    )
    assert (info.max, info.min_normal, info.min_subnormal) == (f.max, f.min_normal, f.min_subnormal)
    assert info.has_inf is f.has_inf
    assert isinstance(info.dtype, np.dtype) and info.dtype == f.dtype
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.bias = 3  # type: ignore[misc]
    assert trn2core.format_info(name) == info


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("bias", [0, 1, 10, 20, 127])
def test_format_info_exponent_bias(name, bias):
    f = FMTS[name]
    info = trn2core.format_info(name, exponent_bias=bias)
    s = 2.0 ** (f.bias - bias)
    assert info.bias == bias
    assert (info.exponent_bits, info.mantissa_bits, info.has_inf) == (
        f.exponent_bits,
        f.mantissa_bits,
        f.has_inf,
    )
    assert (info.max, info.min_normal, info.min_subnormal) == (
        f.max * s,
        f.min_normal * s,
        f.min_subnormal * s,
    )
    assert trn2core.format_info(name, exponent_bias=f.bias) == trn2core.format_info(name)


# ---------------------------------------------------------------------------------------------
# Deterministic rounding against the oracles.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
def test_nearest_even_matches_ml_dtypes_bitwise(name):
    """RNE without saturation equals x.astype(<ml_dtypes dtype>), NaN codes included."""
    f = FMTS[name]
    x = sample(name, "f32")
    got = trn2core.quantize(x, name)
    if name == "tf32":
        # No ml_dtypes type: round the float32 pattern to 10 mantissa bits, ties to even.
        b = x.view(np.uint32).astype(np.uint64)
        want = ((b + 0xFFF + ((b >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32)
        want = np.where(np.isnan(x), canonical_nan_codes(x, name), want)
    else:
        want = x.astype(f.dtype).view(f.code_dtype)
        want = np.where(np.isnan(x), canonical_nan_codes(x, name), want)
        if name == "fp32":  # float32 -> fp32 is the identity on bits, NaN payloads included
            want = x.view(np.uint32)
    assert_codes_equal(as_codes(got, name), want, x, name, label="nearest_even vs ml_dtypes")


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
@pytest.mark.parametrize("saturate", [False, True], ids=["nosat", "sat"])
@pytest.mark.parametrize("width", ["f32", "f64"])
def test_quantize_and_encode_match_gfloat(name, mode, saturate, width):
    x = sample(name, width)
    want = codes_from_values(gf_round(name, x, mode, saturate), name)
    got = trn2core.quantize(x, name, rounding=mode, saturate=saturate)
    assert got.shape == x.shape and got.flags.c_contiguous
    label = f"quantize {mode} saturate={saturate} {width}"
    assert_codes_equal(as_codes(got, name), want, x, name, any_nan=True, label=label)
    enc = trn2core.encode(x, name, rounding=mode, saturate=saturate)
    assert enc.dtype == FMTS[name].code_dtype
    assert_codes_equal(enc, as_codes(got, name), x, name, label=f"encode vs quantize {label}")


@pytest.mark.parametrize("name", [n for n in FORMATS if n != "fp32"])
def test_float64_input_is_rounded_once(name):
    """float64 neighbours of midpoints round away from the midpoint; via float32 they would tie."""
    _, mids, _, _ = positive_grid(name)
    mids = _exact_in_f32(mids).astype(np.float64)
    x = np.concatenate([np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])
    x = np.concatenate([x, -x])
    want = codes_from_values(gf_round(name, x), name)
    twice = codes_from_values(gf_round(name, x.astype(np.float32)), name)
    assert (want != twice).any(), "sample has no double-rounding cases: the test is toothless"
    got = as_codes(trn2core.quantize(x, name), name)
    assert_codes_equal(got, want, x, name, label="float64 single rounding")


@pytest.mark.parametrize(
    "value, name, kwargs, expected",
    [
        (1 + 2.0**-8 + 2.0**-40, "bf16", {}, 1 + 2.0**-7),  # via float32: tie -> 1.0
        (1 + 2.0**-4 + 2.0**-40, "fp8_e4m3", {}, 1.125),
        (2.0**128 - 2.0**103, "fp32", {}, math.inf),  # float32 overflow midpoint
        (np.nextafter(2.0**128 - 2.0**103, 0), "fp32", {}, float(np.finfo(np.float32).max)),
        (2.0**-150, "fp32", {}, 0.0),
        (2.0**-150 * (1 + 2.0**-40), "fp32", {}, 2.0**-149),
        (1e-300, "fp32", {"rounding": "toward_positive"}, 2.0**-149),
        (-1e-300, "fp32", {"rounding": "toward_positive"}, -0.0),
        (1e300, "fp32", {"saturate": True}, float(np.finfo(np.float32).max)),
        (1e300, "tf32", {"rounding": "toward_zero"}, (2 - 2.0**-10) * 2.0**127),
        (248.0, "fp8_e4m3", {}, math.inf),  # tie between 240 and (virtual) 256: even is 256
        (247.99, "fp8_e4m3", {}, 240.0),
        (248.0, "fp8_e4m3", {"saturate": True}, 240.0),
        (1e9, "fp8_e4m3", {"rounding": "toward_zero"}, 240.0),
        (-1e9, "fp8_e4m3", {"rounding": "toward_positive"}, -240.0),
        (-1e9, "fp8_e4m3", {"rounding": "toward_negative"}, -math.inf),
        (464.0, "fp8_e4m3fn", {}, 448.0),  # tie: 448 has the even mantissa
        (464.0, "fp8_e4m3fn", {"rounding": "nearest_away"}, math.nan),
        (math.inf, "fp8_e4m3fn", {}, math.nan),
        (-math.inf, "fp8_e4m3fn", {"saturate": True}, -448.0),
        (math.inf, "bf16", {"saturate": True}, (2 - 2.0**-7) * 2.0**127),
        (65520.0, "fp16", {}, math.inf),
        (65519.99, "fp16", {}, 65504.0),
        (2.0**-25, "fp16", {}, 0.0),
        (-(2.0**-25), "fp16", {}, -0.0),
        (3 * 2.0**-25, "fp16", {}, 2.0**-23),
        (2.0**-10, "fp8_e4m3", {"rounding": "nearest_away"}, 2.0**-9),
        (2.0**-10, "fp8_e4m3", {}, 0.0),
        (16.0, "fp8_e3m4", {}, math.inf),
        (15.74, "fp8_e3m4", {}, 15.5),
    ],
)
def test_specific_values(value, name, kwargs, expected):
    for dtype in (np.float64, np.float32):
        x = np.array([value], dtype)
        if float(x[0]) != value:
            continue  # not representable in float32: only the float64 case applies
        got = trn2core.quantize(x, name, **kwargs).astype(np.float64)[0]
        if math.isnan(expected):
            assert math.isnan(got), (value, dtype, got)
        else:
            assert got == expected and math.copysign(1, got) == math.copysign(1, expected), (
                f"quantize({value!r} as {np.dtype(dtype)}, {name!r}, {kwargs}) = {got!r}, "
                f"expected {expected!r}"
            )


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "fp16"])
def test_long_and_odd_lengths_match_ml_dtypes(name, rng):
    """Chunking and vector tails: every length 0..70 and one long odd length."""
    f = FMTS[name]
    x = (rng.standard_normal(2**20 + 13) * rng.choice([1e-6, 1.0, 300.0], 2**20 + 13)).astype(
        np.float32
    )
    assert_codes_equal(
        as_codes(trn2core.quantize(x, name), name),
        x.astype(f.dtype).view(f.code_dtype),
        x,
        name,
        label="long array",
    )
    for length in range(71):
        y = x[1000 : 1000 + length]
        assert_codes_equal(
            as_codes(trn2core.quantize(y, name), name),
            y.astype(f.dtype).view(f.code_dtype),
            y,
            name,
            label=f"length {length}",
        )


# ---------------------------------------------------------------------------------------------
# NaN, signed zero, subnormals.
# ---------------------------------------------------------------------------------------------

_NAN32 = np.array(
    [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFF812345, 0xFFFFFFFF, 0x7FFFFFFF], np.uint32
).view(np.float32)
_NAN64 = np.array(
    [
        0x7FF8000000000000,
        0xFFF8000000000000,
        0x7FF0000000000001,
        0xFFF8000000000123,
        0x7FFFFFFFFFFFFFFF,
    ],
    np.uint64,
).view(np.float64)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", ROUNDING_MODES)
@pytest.mark.parametrize("saturate", [False, True], ids=["nosat", "sat"])
def test_nan_becomes_canonical_quiet_nan_with_sign(name, mode, saturate):
    kw = {"rounding": mode, "saturate": saturate}
    if mode == "stochastic":
        kw["seed"] = 11
    for x in (_NAN32, _NAN64):
        want = canonical_nan_codes(x, name)
        if name == "fp32" and x.dtype == np.float32:
            want = x.view(np.uint32)  # identity on bits, payload kept
        label = f"NaN {x.dtype} {mode} saturate={saturate}"
        assert_codes_equal(
            as_codes(trn2core.quantize(x, name, **kw), name), want, x, name, label=label
        )
        assert_codes_equal(trn2core.encode(x, name, **kw), want, x, name, label="encode " + label)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", ROUNDING_MODES)
def test_signed_zero_and_tiny_values(name, mode):
    f = FMTS[name]
    sub = f.min_subnormal
    x = np.array([0.0, -0.0, sub / 4, -sub / 4, sub * 0.49, -sub * 0.49, 1e-45, -1e-45], np.float64)
    kw = (
        {"rounding": mode}
        if mode != "stochastic"
        else {"rounding": mode, "random_bits": np.uint32(0), "random_bit_count": 8}
    )
    got = trn2core.quantize(x, name, **kw).astype(np.float64)
    assert np.array_equal(np.signbit(got), np.signbit(x)), (name, mode, got)
    expected = {
        "nearest_even": [0, 0, 0, 0, 0, 0, 0, 0],
        "nearest_away": [0, 0, 0, 0, 0, 0, 0, 0],
        "toward_zero": [0, 0, 0, 0, 0, 0, 0, 0],
        "toward_positive": [0, 0, sub, 0, sub, 0, sub, 0],
        "toward_negative": [0, 0, 0, -sub, 0, -sub, 0, -sub],
        "stochastic": [0, 0, 0, 0, 0, 0, 0, 0],  # r = 0 never rounds a fraction < 1 up
    }[mode]
    if name == "fp32":  # 1e-45 is float32's smallest subnormal region: recompute with gfloat
        expected = gf_round(
            name,
            x,
            mode,
            False,
            np.zeros(x.shape, np.int64) if mode == "stochastic" else None,
            8 if mode == "stochastic" else 0,
        )
    assert np.array_equal(got, np.asarray(expected, np.float64)), (name, mode, got, expected)


# ---------------------------------------------------------------------------------------------
# Stochastic rounding with explicit bits.
# ---------------------------------------------------------------------------------------------


def test_stochastic_spot_values():
    x = np.array([1 + 2.0**-9] * 4 + [-(1 + 2.0**-9)] * 4, np.float32)
    r = np.array([0, 1, 2, 3] * 2, np.uint32)  # frac = 1/4: up iff 1/4 + r/4 >= 1 iff r == 3
    got = trn2core.quantize(x, "bf16", rounding="stochastic", random_bits=r, random_bit_count=2)
    up = 1 + 2.0**-7
    assert got.astype(np.float64).tolist() == [1, 1, 1, up, -1, -1, -1, -up]
    # exactly representable values never move, whatever the bits
    y = np.array([1.0, -2.0, 0.0, 240.0], np.float32)
    for r in (0, 2**32 - 1):
        got = trn2core.quantize(
            y, "fp8_e4m3", rounding="stochastic", random_bits=np.uint32(r), random_bit_count=32
        )
        assert got.astype(np.float64).tolist() == y.tolist()


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("saturate", [False, True], ids=["nosat", "sat"])
@pytest.mark.parametrize("nbits", [1, 2, 7, 13, 24, 29])
def test_stochastic_explicit_bits_match_gfloat(name, saturate, nbits, rng):
    x = sample(name, "f32")
    if x.size > 100_000:  # keep the 16-bit formats fast: a fixed subset for the random pass
        x = x[rng.choice(x.size, 100_000, replace=False)]
    bits = rng.integers(0, 2**nbits, size=x.shape, dtype=np.uint64).astype(np.uint32)
    for r in (
        bits,
        np.uint32(0),
        np.uint32(2 ** (nbits - 1)),
        np.uint32(2 ** (nbits - 1) - 1),
        np.uint32(2**nbits - 1),
    ):
        want = codes_from_values(gf_round(name, x, "stochastic", saturate, r, nbits), name)
        got = trn2core.quantize(
            x, name, rounding="stochastic", saturate=saturate, random_bits=r, random_bit_count=nbits
        )
        label = f"stochastic n={nbits} saturate={saturate} bits={'array' if np.ndim(r) else int(r)}"
        assert_codes_equal(as_codes(got, name), want, x, name, any_nan=True, label=label)
        enc = trn2core.encode(
            x, name, rounding="stochastic", saturate=saturate, random_bits=r, random_bit_count=nbits
        )
        assert_codes_equal(enc, as_codes(got, name), x, name, label="encode vs quantize " + label)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("saturate", [False, True], ids=["nosat", "sat"])
@pytest.mark.parametrize("nbits", [1, 8, 30, 31, 32])
@pytest.mark.parametrize("width", ["f32", "f64"])
def test_stochastic_explicit_bits_match_exact_reference(name, saturate, nbits, width, rng):
    x = small_sample(name, width)
    bits = rng.integers(0, 2**nbits, size=x.shape, dtype=np.uint64)
    # the critical thresholds: r = 2**n - ceil(frac * 2**n) and its neighbour below
    bits[::7] = 2**nbits - 1
    bits[1::7] = 2 ** (nbits - 1)
    bits[2::7] = 2 ** (nbits - 1) - 1 if nbits > 1 else 0
    bits = bits.astype(np.uint32)
    want = codes_from_values(exact_stochastic(x, name, bits, nbits, saturate), name)
    got = trn2core.quantize(
        x, name, rounding="stochastic", saturate=saturate, random_bits=bits, random_bit_count=nbits
    )
    assert_codes_equal(
        as_codes(got, name),
        want,
        x,
        name,
        any_nan=True,
        label=f"stochastic n={nbits} saturate={saturate} exact reference",
    )


def test_stochastic_threshold_is_inclusive_at_32_bits():
    # frac = 2**-20 exactly for bf16 above 1 (ulp 2**-7): rounds up iff r >= 2**32 - 2**12.
    x = np.full(4, 1 + 2.0**-27, np.float64)
    r = np.array([2**32 - 2**12 - 1, 2**32 - 2**12, 2**32 - 1, 0], np.uint32)
    got = trn2core.quantize(x, "bf16", rounding="stochastic", random_bits=r, random_bit_count=32)
    assert got.astype(np.float64).tolist() == [1.0, 1 + 2.0**-7, 1 + 2.0**-7, 1.0]


def test_stochastic_random_bits_broadcast_and_dtypes(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    row = rng.integers(0, 256, size=(1, 7), dtype=np.uint32)
    full = np.ascontiguousarray(np.broadcast_to(row, x.shape))
    kw = {"rounding": "stochastic", "random_bit_count": 8}
    want = trn2core.quantize(x, "fp8_e4m3", random_bits=full, **kw)
    assert np.array_equal(
        trn2core.quantize(x, "fp8_e4m3", random_bits=row, **kw).view(np.uint8), want.view(np.uint8)
    )
    for dt in (np.uint8, np.uint16, np.uint64, np.int32, np.int64):
        got = trn2core.quantize(x, "fp8_e4m3", random_bits=full.astype(dt), **kw)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), dt
    strided = np.zeros((5, 14), np.uint32)
    strided[:, ::2] = full
    got = trn2core.quantize(x, "fp8_e4m3", random_bits=strided[:, ::2], **kw)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


# ---------------------------------------------------------------------------------------------
# Seeded stochastic rounding: counter-based bits keyed by (seed, flat C-order index).
# ---------------------------------------------------------------------------------------------


def test_stochastic_bits_shape_and_prefix_property():
    big = trn2core.stochastic_bits(((1 << 20) + 17,), 5)
    assert big.dtype == np.uint32 and big.shape == ((1 << 20) + 17,) and big.flags.c_contiguous
    for k in (0, 1, 7, 1000, 65537, (1 << 20) + 16):
        assert np.array_equal(trn2core.stochastic_bits((k,), 5), big[:k]), k
    two_d = trn2core.stochastic_bits((1024, 1024), 5)
    assert two_d.shape == (1024, 1024)
    assert np.array_equal(two_d.ravel(), big[: 1 << 20])
    scalar = trn2core.stochastic_bits((), 5)
    assert scalar.shape == () and scalar == big[0]
    assert trn2core.stochastic_bits((3, 0, 2), 5).shape == (3, 0, 2)
    assert np.array_equal(
        trn2core.stochastic_bits((1000,), 5), trn2core.stochastic_bits((1000,), 5)
    )


def test_stochastic_bits_look_uniform_and_depend_on_seed():
    n = 1 << 20
    a, b, c = (trn2core.stochastic_bits((n,), seed) for seed in (0, 1, 2**31 + 5))
    for words in (a, b, c):
        u = words / 2.0**32
        assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
        # Each of the 32 bits (little-endian words: byte j holds bits 8j .. 8j + 7).
        bits = np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little")
        for bit, ones in enumerate(bits.reshape(n, 32).mean(axis=0)):
            assert abs(ones - 0.5) < 5 * 0.5 / math.sqrt(n), (bit, ones)
        # consecutive indices are not correlated
        assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 5 / math.sqrt(n)
        distinct = np.count_nonzero(np.diff(np.sort(words))) + 1  # (np.unique is slower)
        assert distinct > n - 2000  # ~n**2 / 2**33 = 128 collisions expected
    for x, y in ((a, b), (a, c), (b, c)):
        assert (x == y).mean() < 1e-3
        assert ((x >> 24) == (y >> 24)).mean() < 1 / 256 + 5 * math.sqrt(1 / 256 / n)


def splitmix64_words(seed: int, n: int) -> np.ndarray:
    """The generator as docs/numerics.md defines it, in numpy uint64 arithmetic (independent of
    the Rust code): SplitMix64's outputs from state mix64(seed ^ c), as little-endian uint32."""

    def mix64(z):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        key = mix64(np.array([seed], dtype=np.uint64) ^ np.uint64(0x6A09E667F3BCC909))
        j = np.arange(1, (n + 1) // 2 + 1, dtype=np.uint64)
        z = mix64(key + j * np.uint64(0x9E3779B97F4A7C15))
    return z.astype("<u8").view("<u4")[:n].astype(np.uint32)


def test_stochastic_bits_are_the_documented_splitmix64_stream():
    for seed in (0, 1, 77, 2**63 + 12345, 2**64 - 1):
        for n in (1, 2, 3, 1001, 70000):
            got = trn2core.stochastic_bits((n,), seed)
            assert np.array_equal(got, splitmix64_words(seed, n)), (seed, n)
    # A fixed value of the reference itself, so a change of the definition cannot go unnoticed
    # (SplitMix64 from state 0 starts 0xe220a8397b1dcdaf: Vigna's splitmix64.c test vector).
    with np.errstate(over="ignore"):
        z = np.array([0x9E3779B97F4A7C15], dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    assert int(z[0]) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize(
    "name, width",
    [
        ("bf16", "f32"),
        ("fp8_e4m3", "f32"),
        ("fp8_e5m2", "f32"),
        ("fp16", "f32"),
        ("fp32", "f64"),
        ("tf32", "f32"),
        ("fp8_e4m3fn", "f64"),
    ],
)
def test_seeded_stochastic_uses_stochastic_bits(name, width):
    x = sample(name, width)
    for seed in (0, 3, 123456789):
        sb = trn2core.stochastic_bits(x.shape, seed)
        got = trn2core.quantize(x, name, rounding="stochastic", seed=seed)
        want = trn2core.quantize(
            x, name, rounding="stochastic", random_bits=sb, random_bit_count=32
        )
        assert_codes_equal(as_codes(got, name), as_codes(want, name), x, name, label=f"seed={seed}")
        enc = trn2core.encode(x, name, rounding="stochastic", seed=seed)
        assert_codes_equal(enc, as_codes(want, name), x, name, label=f"encode seed={seed}")
        for n in (1, 8, 31):
            got = trn2core.quantize(x, name, rounding="stochastic", seed=seed, random_bit_count=n)
            want = trn2core.quantize(
                x,
                name,
                rounding="stochastic",
                random_bits=sb >> np.uint32(32 - n),
                random_bit_count=n,
            )
            assert_codes_equal(
                as_codes(got, name), as_codes(want, name), x, name, label=f"seed={seed} n={n}"
            )
    a = trn2core.quantize(x, name, rounding="stochastic", seed=1)
    b = trn2core.quantize(x, name, rounding="stochastic", seed=2)
    if name != "fp32" or width == "f64":
        assert (as_codes(a, name) != as_codes(b, name)).any(), "seed has no effect"


def test_seeded_stochastic_independent_of_chunking_and_layout(rng):
    n = 3 * (1 << 19) + 5
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    kw = {"rounding": "stochastic", "seed": 77}
    q = as_codes(trn2core.quantize(x, "bf16", **kw), "bf16")
    want = as_codes(
        trn2core.quantize(
            x,
            "bf16",
            rounding="stochastic",
            random_bits=trn2core.stochastic_bits(x.shape, 77),
            random_bit_count=32,
        ),
        "bf16",
    )
    assert np.array_equal(q, want)
    for k in (1, 1000, 65537, 1 << 20, n - 1):
        assert np.array_equal(as_codes(trn2core.quantize(x[:k], "bf16", **kw), "bf16"), q[:k]), k
    x2 = x[:-5].reshape(1536, 1024)
    q2 = as_codes(trn2core.quantize(x2, "bf16", **kw), "bf16")
    assert np.array_equal(q2.ravel(), q[:-5])
    # the index is the flat C-order index of the logical array, whatever its memory layout
    for view in (np.asfortranarray(x2), x2[:, ::2], x2.T, x2[::-1], x2.astype(">f4")):
        got = as_codes(trn2core.quantize(view, "bf16", **kw), "bf16")
        ref = as_codes(
            trn2core.quantize(np.ascontiguousarray(view, np.float32), "bf16", **kw), "bf16"
        )
        assert np.array_equal(got, ref)


def test_seeded_stochastic_independent_of_thread_count(tmp_path):
    script = textwrap.dedent("""
        import hashlib, sys, numpy as np, trn2core
        x = (np.arange(1 << 21, dtype=np.float64) * 0.37 % 97 - 40).astype(np.float32)
        codes = trn2core.encode(x, "fp8_e4m3", rounding="stochastic", seed=9)
        sys.stdout.write(hashlib.sha256(codes.tobytes()).hexdigest())
    """)
    results = set()
    for threads in ("1", "2", "3"):
        env = dict(os.environ, RAYON_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
        out = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        results.add(out.stdout)
    x = (np.arange(1 << 21, dtype=np.float64) * 0.37 % 97 - 40).astype(np.float32)
    import hashlib

    here = hashlib.sha256(trn2core.encode(x, "fp8_e4m3", rounding="stochastic", seed=9).tobytes())
    results.add(here.hexdigest())
    assert len(results) == 1, results


def test_default_seed_comes_from_environment(monkeypatch, rng):
    x = (rng.standard_normal(4096) * 10).astype(np.float32)

    def codes(**kw):
        return as_codes(trn2core.quantize(x, "fp8_e5m2", rounding="stochastic", **kw), "fp8_e5m2")

    monkeypatch.delenv("NEURON_RT_STOCHASTIC_ROUNDING_SEED", raising=False)
    assert np.array_equal(codes(), codes(seed=0))
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_SEED", "123")
    assert np.array_equal(codes(), codes(seed=123))
    assert not np.array_equal(codes(), codes(seed=0))
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_SEED", "7")
    assert np.array_equal(codes(), codes(seed=7))
    assert np.array_equal(codes(random_bit_count=4), codes(seed=7, random_bit_count=4))


def test_stochastic_rounding_is_unbiased():
    n = 10**6
    x = np.full(n, 1 + 2.0**-10, np.float32)  # between 1 and 1 + 2**-7, p(up) = 1/8
    got = trn2core.quantize(x, "bf16", rounding="stochastic", seed=2024).astype(np.float64)
    assert set(np.unique(got)) == {1.0, 1 + 2.0**-7}
    ups = int((got > 1).sum())
    p = 1 / 8
    assert abs(ups - n * p) < 5 * math.sqrt(n * p * (1 - p)), ups
    # the same for a negative value, another seed, and a subnormal fp8 value
    got = trn2core.quantize(-x, "bf16", rounding="stochastic", seed=7).astype(np.float64)
    assert abs(int((got < -1).sum()) - n * p) < 5 * math.sqrt(n * p * (1 - p))
    y = np.full(n, 0.3 * 2.0**-9, np.float64)  # fp8_e4m3: between 0 and 2**-9, p(up) = 0.3
    got = trn2core.quantize(y, "fp8_e4m3", rounding="stochastic", seed=1).astype(np.float64)
    assert abs(int((got > 0).sum()) - n * 0.3) < 5 * math.sqrt(n * 0.3 * 0.7)


def test_stochastic_accumulation_neuron_example():
    """Neuron's SR example: fp16 a = 1024, then 2048 times a += 0.5 rounded to fp16.

    With nearest_even 1024.5 ties to 1024 and a never moves. With stochastic rounding every
    step is unbiased, so E[a] = 1024 + 2048 * 0.5 = 2048 exactly; a step's variance is at most
    3/4 (ulp 2 above 2048: 2 * Bernoulli(1/4)), so over 4096 independent chains the mean has
    standard deviation at most sqrt(2048 * 0.75 / 4096) ~ 0.61.
    """
    chains, steps = 4096, 2048
    a = np.full(chains, 1024.0, np.float16)
    for _ in range(steps):
        a = trn2core.quantize(a.astype(np.float32) + np.float32(0.5), "fp16")
    assert np.all(a == 1024)
    a = np.full(chains, 1024.0, np.float16)
    for step in range(steps):
        a = trn2core.quantize(
            a.astype(np.float32) + np.float32(0.5), "fp16", rounding="stochastic", seed=step
        )
    mean = float(a.astype(np.float64).mean())
    assert abs(mean - 2048.0) < 5 * math.sqrt(steps * 0.75 / chains), mean
    assert a.astype(np.float64).std() > 5  # chains differ: bits depend on the element index


# ---------------------------------------------------------------------------------------------
# Configurable FP8 exponent bias.
# ---------------------------------------------------------------------------------------------

BIAS_CASES = [(n, b) for n in FP8 for b in sorted({0, 1, FMTS[n].bias, 11, 20, 31, 64, 127})]


@pytest.mark.parametrize("name, bias", BIAS_CASES)
def test_exponent_bias_decode_every_code(name, bias):
    f = FMTS[name]
    codes = np.arange(256, dtype=np.uint8)
    got = trn2core.decode(codes, name, exponent_bias=bias)
    assert got.dtype == np.float32 and got.shape == (256,)
    want = gfloat.decode_ndarray(gf_info(name, bias), codes.astype(np.int64))
    scaled = codes.view(f.dtype).astype(np.float64) * scale_of(name, bias)
    assert np.array_equal(want, scaled, equal_nan=True)  # the oracle agrees with the contract text
    ok = (got.astype(np.float64) == want) & (np.signbit(got) == np.signbit(want))
    ok |= np.isnan(got) & np.isnan(want)
    bad = zip(codes[~ok], got[~ok], want[~ok], strict=True)
    assert ok.all(), [(hex(c), float(g), float(w)) for c, g, w in bad][:10]


@pytest.mark.parametrize("name, bias", BIAS_CASES)
def test_exponent_bias_encode_matches_gfloat(name, bias, rng):
    x = sample(name, "f32", bias)
    for mode in ROUNDING_MODES:
        for saturate in (False, True):
            kw = {"rounding": mode, "saturate": saturate, "exponent_bias": bias}
            bits = None
            if mode == "stochastic":
                bits = rng.integers(0, 2**13, size=x.shape, dtype=np.uint32)
                kw.update(random_bits=bits, random_bit_count=13)
            want_vals = gf_round(name, x, mode, saturate, bits, 13 if bits is not None else 0, bias)
            want = codes_from_values(want_vals, name, bias)
            got = trn2core.encode(x, name, **kw)
            assert got.dtype == np.uint8
            assert_codes_equal(
                got,
                want,
                x,
                name,
                any_nan=True,
                bias=bias,
                label=f"encode exponent_bias={bias} {mode} saturate={saturate}",
            )
            nan = np.isnan(x)
            assert_codes_equal(
                got[nan],
                canonical_nan_codes(x[nan], name),
                x[nan],
                name,
                label="NaN with exponent_bias",
            )
            back = trn2core.decode(got, name, exponent_bias=bias).astype(np.float64)
            same = (back == want_vals) | (np.isnan(back) & np.isnan(want_vals))
            assert same.all()


def test_exponent_bias_spot_values():
    # a code means standard_value * 2**(7 - 8): 1.0 is the standard code of 2.0
    assert trn2core.encode(np.array([1.0, -0.5, 120.0]), "fp8_e4m3", exponent_bias=8).tolist() == [
        0x40,
        0xB8,
        0x77,
    ]
    assert trn2core.decode(
        np.array([0x40, 0x38, 0x78], np.uint8), "fp8_e4m3", exponent_bias=8
    ).tolist() == [1.0, 0.5, math.inf]
    # standard bias is the default
    x = sample("fp8_e5m2", "f32")
    assert np.array_equal(
        trn2core.encode(x, "fp8_e5m2", exponent_bias=15), trn2core.encode(x, "fp8_e5m2")
    )


# ---------------------------------------------------------------------------------------------
# encode / decode.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", EXHAUSTIVE)
def test_decode_every_code_and_reencode(name):
    f = FMTS[name]
    codes = np.arange(2**f.bits, dtype=np.uint64).astype(f.code_dtype)
    got = trn2core.decode(codes, name)
    assert got.dtype == np.float32 and got.shape == codes.shape and got.flags.c_contiguous
    want = codes.view(f.dtype).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # NaN signs too
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    # the format's own dtype decodes the same
    assert np.array_equal(
        trn2core.decode(codes.view(f.dtype), name).view(np.uint32), got.view(np.uint32)
    )
    # re-encoding gives the code back; NaN codes become the canonical NaN of their sign
    back = trn2core.encode(got, name)
    expect = np.where(nan, canonical_nan_codes(got, name), codes)
    assert_codes_equal(back, expect, got, name, label="encode(decode(code))")
    for mode in DETERMINISTIC_MODES:
        again = trn2core.encode(got, name, rounding=mode, saturate=True)
        finite = np.isfinite(want)
        assert np.array_equal(again[finite], codes[finite]), mode


@pytest.mark.parametrize("name", ["fp32", "tf32"])
def test_decode_dense_codes_fp32_tf32(name):
    f = FMTS[name]
    pos = _sampled_positive_codes(f).astype(np.uint32) << np.uint32(23 - f.mantissa_bits)
    codes = np.concatenate(
        [
            pos,
            pos | np.uint32(1 << 31),
            np.array([0x7F800000, 0xFF800000, f.nan_code, f.nan_code | 1 << 31], np.uint32),
        ]
    )
    got = trn2core.decode(codes, name)
    assert got.dtype == np.float32 and got.shape == codes.shape
    assert np.array_equal(got.view(np.uint32), codes)  # float32 container: decode is a bit view
    assert np.array_equal(trn2core.encode(got, name), codes)


# ---------------------------------------------------------------------------------------------
# Inputs: shapes, layouts, dtypes; outputs: fresh C-contiguous arrays.
# ---------------------------------------------------------------------------------------------


def _layouts(rng):
    base = (rng.standard_normal((6, 10)) * 50).astype(np.float32)
    base[0, :4] = [np.nan, -np.inf, -0.0, 1e-42]
    ro = base.copy()
    ro.flags.writeable = False
    three = (rng.standard_normal((4, 6, 5)) * 3).astype(np.float32)
    return {
        "c2d": base,
        "strided": base.ravel()[::3],
        "fortran": np.asfortranarray(base),
        "transposed": base.T,
        "negative_stride": base[::-1, ::-2],
        "big_endian_f4": base.astype(">f4"),
        "big_endian_f8": base.astype(">f8"),
        "readonly": ro,
        "zero_d": np.array(2.75, np.float32),
        "zero_d_f64": np.array(-3.1e-5),
        "empty": np.zeros((0,), np.float32),
        "empty_3d": np.zeros((2, 0, 3), np.float64),
        "slice_3d": three[:, ::2, 1:],
        "broadcast_view": np.broadcast_to(base[0], (3, 10)),
    }


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("mode", ["nearest_even", "toward_negative", "stochastic"])
def test_layouts_shapes_and_fresh_outputs(name, mode, rng):
    kw = {"rounding": mode} | ({"seed": 5} if mode == "stochastic" else {})
    for layout, x in _layouts(rng).items():
        before = x.copy()
        ref_in = np.array(x, x.dtype.newbyteorder("="), order="C")
        for fn in (trn2core.quantize, trn2core.encode):
            out = fn(x, name, **kw)
            assert isinstance(out, np.ndarray) and out.shape == x.shape, (layout, fn)
            assert out.flags.c_contiguous and out.flags.writeable, (layout, fn)
            assert not np.shares_memory(out, x), (layout, fn)
            ref = fn(ref_in, name, **kw)
            assert out.dtype == ref.dtype
            assert np.array_equal(
                out.view(FMTS[name].code_dtype) if fn is trn2core.quantize else out,
                ref.view(FMTS[name].code_dtype) if fn is trn2core.quantize else ref,
            ), (layout, fn)
            assert x.tobytes() == before.tobytes() and x.dtype == before.dtype, (
                layout,
                "input modified",
            )
        codes = trn2core.encode(x, name, **kw)
        dec = trn2core.decode(codes, name)
        assert dec.shape == x.shape and dec.dtype == np.float32 and dec.flags.c_contiguous
        if codes.ndim == 2:
            assert np.array_equal(
                trn2core.decode(codes.T, name).view(np.uint32), dec.T.view(np.uint32)
            )
            assert np.array_equal(
                trn2core.decode(np.asfortranarray(codes), name).view(np.uint32), dec.view(np.uint32)
            )


@pytest.mark.parametrize("name", FORMATS)
def test_quantize_output_dtypes(name):
    f = FMTS[name]
    x = np.array([1.0, -2.5, 3.14159, 1e-3], np.float32)
    q = trn2core.quantize(x, name)
    assert q.dtype == f.dtype
    assert trn2core.encode(x, name).dtype == f.code_dtype
    assert trn2core.decode(trn2core.encode(x, name), name).dtype == np.float32
    if name == "tf32":
        big = (np.random.default_rng(1).standard_normal(10000) * 1e3).astype(np.float32)
        for mode in ROUNDING_MODES:
            kw = {"seed": 3} if mode == "stochastic" else {}
            bits = trn2core.quantize(big, name, rounding=mode, **kw).view(np.uint32)
            assert not (bits & 0x1FFF).any(), mode
    if name == "fp32":
        assert trn2core.quantize(x, name) is not x


@pytest.mark.parametrize("in_dtype", LOW_PRECISION_INPUT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", FORMATS)
def test_low_precision_inputs_equal_their_float32_widening(in_dtype, name):
    nbits = in_dtype.itemsize * 8
    x = np.arange(2**nbits, dtype=np.uint64).astype(f"u{in_dtype.itemsize}").view(in_dtype)
    x32 = x.astype(np.float32)  # exact
    for kw in (
        {},
        {"rounding": "toward_zero", "saturate": True},
        {"rounding": "stochastic", "seed": 4},
    ):
        got = as_codes(trn2core.quantize(x, name, **kw), name)
        want = as_codes(trn2core.quantize(x32, name, **kw), name)
        assert_codes_equal(got, want, x32, name, any_nan=True, label=f"{in_dtype} input {kw}")
        nan = np.isnan(x32)
        if name != "fp32":  # NaN inputs of any width become the canonical NaN of their sign
            assert_codes_equal(
                got[nan],
                canonical_nan_codes(x32[nan], name),
                x32[nan],
                name,
                label=f"NaN from {in_dtype}",
            )


@pytest.mark.parametrize("int_dtype", ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"])
@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "fp8_e4m3"])
def test_integer_inputs_convert_exactly_via_float64(int_dtype, name):
    info = np.iinfo(int_dtype)
    vals = [
        0,
        1,
        2,
        3,
        5,
        17,
        100,
        127,
        255,
        1000,
        2049,
        65504,
        65519,
        65520,
        2**24 + 1,
        2**24 + 3,
        2**31 - 1,
        2**53,
        2**53 - 1,
        2**62 + 2**40 + 1,
    ]
    vals += [-v for v in vals]
    x = np.array([v for v in vals if info.min <= v <= info.max] + [info.min, info.max], int_dtype)
    x64 = np.array([float(v) for v in x.tolist()])  # exact where float64 is
    for kw in ({}, {"rounding": "toward_zero"}, {"saturate": True}):
        got = as_codes(trn2core.quantize(x, name, **kw), name)
        want = as_codes(trn2core.quantize(x64, name, **kw), name)
        assert_codes_equal(got, want, x64, name, label=f"{int_dtype} input {kw}")


# ---------------------------------------------------------------------------------------------
# Property tests.
# ---------------------------------------------------------------------------------------------

_f32_arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9),
    elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
)


@given(x=_f32_arrays, name=st.sampled_from(FORMATS))
def test_property_quantize_matches_gfloat_and_roundtrips(x, name):
    got = trn2core.quantize(x, name)
    assert got.shape == x.shape
    want = codes_from_values(gf_round(name, x), name)
    assert_codes_equal(as_codes(got, name), want, x, name, any_nan=True, label="hypothesis RNE")
    codes = trn2core.encode(x, name)
    assert_codes_equal(codes, as_codes(got, name), x, name, label="hypothesis encode")
    back = trn2core.decode(codes, name)
    q32 = got.astype(np.float32)
    nan = np.isnan(q32)
    assert np.array_equal(np.isnan(back), nan)
    assert np.array_equal(back.view(np.uint32)[~nan], q32.view(np.uint32)[~nan])


@settings(max_examples=60)
@given(
    x=hnp.arrays(
        np.float64,
        st.integers(1, 40),
        elements=st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    ),
    name=st.sampled_from(FORMATS),
    nbits=st.integers(1, 32),
    saturate=st.booleans(),
    data=st.data(),
)
def test_property_stochastic_matches_exact_reference(x, name, nbits, saturate, data):
    bits = data.draw(hnp.arrays(np.uint32, x.shape, elements=st.integers(0, 2**nbits - 1)))
    got = trn2core.quantize(
        x, name, rounding="stochastic", saturate=saturate, random_bits=bits, random_bit_count=nbits
    )
    want = codes_from_values(exact_stochastic(x, name, bits, nbits, saturate), name)
    assert_codes_equal(
        as_codes(got, name),
        want,
        x,
        name,
        any_nan=True,
        label=f"hypothesis stochastic n={nbits} saturate={saturate}",
    )


# ---------------------------------------------------------------------------------------------
# Errors: every bad input raises the named class with a message naming the argument.
# ---------------------------------------------------------------------------------------------


def _no_panic(excinfo):
    msg = str(excinfo.value)
    assert msg and "panicked" not in msg and "PanicException" not in type(excinfo.value).__name__, (
        msg
    )
    return msg


def test_error_hierarchy():
    assert issubclass(trn2core.Trn2Error, Exception)
    for cls, extra in [
        (trn2core.ShapeError, ValueError),
        (trn2core.FormatError, ValueError),
        (trn2core.SparsityError, ValueError),
        (trn2core.CorruptDataError, ValueError),
        (trn2core.CapacityError, MemoryError),
    ]:
        assert issubclass(cls, trn2core.Trn2Error) and issubclass(cls, extra), cls


X = np.array([1.0, 2.5], np.float32)


@pytest.mark.parametrize("bad", ["fp7", "fp8", "FP32x", "float8_e4m3fnuz", "float", ""])
def test_unknown_format(bad):
    calls = [
        lambda: trn2core.quantize(X, bad),
        lambda: trn2core.encode(X, bad),
        lambda: trn2core.decode(np.zeros(2, np.uint8), bad),
        lambda: trn2core.format_info(bad),
    ]
    for call in calls:
        with pytest.raises(trn2core.FormatError) as excinfo:
            call()
        msg = _no_panic(excinfo)
        assert "fmt" in msg or "format" in msg, msg
        assert repr(bad) in msg or (bad and bad in msg), msg


@pytest.mark.parametrize("bad", ["nearest", "rne", "Stochastic", "round_up", ""])
def test_unknown_rounding_mode(bad):
    for fn in (trn2core.quantize, trn2core.encode):
        with pytest.raises(trn2core.FormatError) as excinfo:
            fn(X, "bf16", rounding=bad)
        msg = _no_panic(excinfo)
        assert "rounding" in msg and (bad in msg), msg


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16", "fp16"])
def test_exponent_bias_rejected_for_non_fp8(name):
    f = FMTS[name]
    calls = [
        lambda: trn2core.encode(X, name, exponent_bias=f.bias),
        lambda: trn2core.decode(np.zeros(2, f.code_dtype), name, exponent_bias=3),
        lambda: trn2core.format_info(name, exponent_bias=f.bias),
    ]
    for call in calls:
        with pytest.raises(trn2core.FormatError) as excinfo:
            call()
        assert "exponent_bias" in _no_panic(excinfo)


@pytest.mark.parametrize("bad", [-1, 128, 1000, -(2**40), 2**70])
def test_exponent_bias_out_of_range(bad):
    calls = [
        lambda: trn2core.encode(X, "fp8_e4m3", exponent_bias=bad),
        lambda: trn2core.decode(np.zeros(2, np.uint8), "fp8_e5m2", exponent_bias=bad),
        lambda: trn2core.format_info("fp8_e3m4", exponent_bias=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError) as excinfo:
            call()
        msg = _no_panic(excinfo)
        assert "exponent_bias" in msg, msg


@pytest.mark.parametrize("bad", [7.5, "7", 7.0])
def test_exponent_bias_not_an_int(bad):
    with pytest.raises((ValueError, TypeError)) as excinfo:
        trn2core.encode(X, "fp8_e4m3", exponent_bias=bad)
    assert "exponent_bias" in _no_panic(excinfo)


@pytest.mark.parametrize(
    "bits, count, seen",
    [
        (np.array([0, 256], np.uint32), 8, "256"),
        (np.array([0, 300], np.uint16), 8, "300"),
        (np.array([1, 2], np.uint32), 1, "2"),
        (np.array([2**32, 0], np.uint64), 32, "4294967296"),
        (np.array([-1, 0], np.int32), 8, "-1"),
        (np.int64(-5), 8, "-5"),
    ],
)
def test_random_bits_out_of_range(bits, count, seen):
    for fn in (trn2core.quantize, trn2core.encode):
        with pytest.raises(ValueError, match="random_bits") as excinfo:
            fn(X, "bf16", rounding="stochastic", random_bits=bits, random_bit_count=count)
        assert seen in _no_panic(excinfo), str(excinfo.value)


@pytest.mark.parametrize(
    "bits",
    [
        np.array([0.0, 1.0]),
        np.array([0.5, 1.0], np.float32),
        np.array([1 + 0j, 0]),
        np.array(["a", "b"]),
    ],
)
def test_random_bits_wrong_dtype(bits):
    with pytest.raises(ValueError, match="random_bits") as excinfo:
        trn2core.quantize(X, "bf16", rounding="stochastic", random_bits=bits, random_bit_count=8)
    _no_panic(excinfo)


def test_random_bits_not_broadcastable():
    with pytest.raises(ValueError, match="random_bits") as excinfo:
        trn2core.quantize(
            X, "bf16", rounding="stochastic", random_bits=np.zeros(3, np.uint32), random_bit_count=8
        )
    _no_panic(excinfo)


@pytest.mark.parametrize("count", [0, 33, -1, 64])
def test_random_bit_count_out_of_range(count):
    for kw in ({"random_bits": np.zeros(2, np.uint32)}, {"seed": 1}):
        with pytest.raises(ValueError, match="random_bit_count") as excinfo:
            trn2core.quantize(X, "bf16", rounding="stochastic", random_bit_count=count, **kw)
        assert str(count) in _no_panic(excinfo)


def test_seed_and_random_bits_together():
    for fn in (trn2core.quantize, trn2core.encode):
        with pytest.raises(ValueError) as excinfo:
            fn(
                X,
                "bf16",
                rounding="stochastic",
                seed=1,
                random_bits=np.zeros(2, np.uint32),
                random_bit_count=8,
            )
        msg = _no_panic(excinfo)
        assert "seed" in msg and "random_bits" in msg, msg


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_random_bits_with_deterministic_mode(mode):
    for fn in (trn2core.quantize, trn2core.encode):
        with pytest.raises(ValueError, match="random_bits") as excinfo:
            fn(X, "bf16", rounding=mode, random_bits=np.zeros(2, np.uint32), random_bit_count=8)
        _no_panic(excinfo)


@pytest.mark.parametrize(
    "bad, word",
    [
        (np.array([1 + 2j, 3]), "complex"),
        (np.array([1.0, None], dtype=object), "object"),
        (np.array(["1.0", "2"]), None),
        (np.array([b"1", b"2"]), None),
        (np.array([(1.0, 2.0)], dtype=[("a", "f4"), ("b", "f4")]), None),
        (np.array([1 + 0j], np.complex64), "complex"),
    ],
)
def test_non_numeric_input(bad, word):
    for call in (lambda: trn2core.quantize(bad, "bf16"), lambda: trn2core.encode(bad, "fp8_e4m3")):
        with pytest.raises(trn2core.FormatError) as excinfo:
            call()
        msg = _no_panic(excinfo)
        if word:
            assert word in msg, msg


def test_decode_rejects_codes_it_cannot_hold():
    with pytest.raises(ValueError, match="codes") as excinfo:
        trn2core.decode(np.array([0x1FF], np.uint16), "fp8_e4m3")
    _no_panic(excinfo)
    with pytest.raises((ValueError, TypeError)) as excinfo:
        trn2core.decode(np.array([1.0, 2.0], np.float64), "fp16")
    assert "codes" in _no_panic(excinfo)


# --- Formats as users write them (contract section 1) ---------------------------------------

#: Each ml_dtypes float type trn2core maps, with the format it is by bit semantics.
_ML_DTYPE_FORMATS = {
    ml_dtypes.float8_e4m3: "fp8_e4m3",  # IEEE-style, max 240: Neuron's float8_e4m3
    ml_dtypes.float8_e4m3fn: "fp8_e4m3fn",  # OCP E4M3, max 448
    ml_dtypes.float8_e5m2: "fp8_e5m2",
    ml_dtypes.float8_e3m4: "fp8_e3m4",
    ml_dtypes.bfloat16: "bf16",
}


@pytest.mark.parametrize("ml_type", list(_ML_DTYPE_FORMATS), ids=lambda t: t.__name__)
def test_ml_dtypes_map_by_bit_semantics_on_every_code(ml_type):
    fmt = _ML_DTYPE_FORMATS[ml_type]
    assert trn2core.dtypes.format_name(ml_type) == fmt
    assert trn2core.dtypes.format_name(np.dtype(ml_type)) == fmt
    assert trn2core.dtypes.format_name(ml_type.__name__) == fmt  # "float8_e4m3fn", ...
    width = np.dtype(ml_type).itemsize
    codes = np.arange(2 ** (8 * width), dtype={1: np.uint8, 2: np.uint16}[width])
    ours = trn2core.decode(codes, dtype=ml_type)
    theirs = codes.view(ml_type).astype(np.float32)
    nan = np.isnan(theirs)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    # Same values and the same sign of zero on every non-NaN code.
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32))
    finite = ours[np.isfinite(ours)]
    assert (
        float(finite.max())
        == trn2core.format_info(ml_type).max
        == float(ml_dtypes.finfo(ml_type).max)
    )
    assert (
        trn2core.format_info(ml_type).max
        == {
            "fp8_e4m3": 240.0,
            "fp8_e4m3fn": 448.0,
            "fp8_e5m2": 57344.0,
            "fp8_e3m4": 15.5,
            "bf16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max),
        }[fmt]
    )


@pytest.mark.parametrize(
    "ml_type",
    [ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e4m3b11fnuz],
    ids=lambda t: t.__name__,
)
def test_fnuz_formats_are_refused_with_the_e4m3_note(ml_type):
    x = np.ones(3, np.float32)
    for spelling in (ml_type, np.dtype(ml_type), ml_type.__name__):
        with pytest.raises(trn2core.FormatError, match="^dtype: ") as e:
            trn2core.quantize(x, spelling)
        assert "max 240" in str(e.value) and "max 448" in str(e.value)


def _fake_torch_dtype(name: str):
    """An object that looks like a ``torch.dtype`` (module ``torch``, class ``dtype``, ``str``
    ``torch.<name>``): torch is not a dependency, and trn2core never imports it."""
    cls = type("dtype", (), {"__module__": "torch", "__str__": lambda self: f"torch.{name}"})
    return cls()


_SPELLINGS = {
    "fp32": ["float32", np.float32, np.dtype("float32"), "torch.float32", "torch.float"],
    "bf16": ["bfloat16", ml_dtypes.bfloat16, np.dtype(ml_dtypes.bfloat16), "torch.bfloat16"],
    "fp16": ["float16", np.float16, np.dtype(np.float16), "half", "torch.float16", "torch.half"],
    "fp8_e4m3": ["float8_e4m3", ml_dtypes.float8_e4m3],
    "fp8_e5m2": ["float8_e5m2", ml_dtypes.float8_e5m2, "torch.float8_e5m2"],
    "fp8_e3m4": ["float8_e3m4", ml_dtypes.float8_e3m4],
    "fp8_e4m3fn": ["float8_e4m3fn", ml_dtypes.float8_e4m3fn, "torch.float8_e4m3fn"],
}


@pytest.mark.parametrize("fmt", list(_SPELLINGS))
def test_every_spelling_of_a_format_quantizes_the_same_bits(fmt):
    x = np.random.default_rng(3).normal(scale=4.0, size=257)
    want = trn2core.encode(x, fmt)
    spellings = [*_SPELLINGS[fmt], _fake_torch_dtype(_SPELLINGS[fmt][0])]
    if fmt in ("fp8_e4m3", "fp8_e3m4"):
        spellings.pop()  # torch has no float8_e4m3 / float8_e3m4
    for s in spellings:
        assert trn2core.dtypes.format_name(s) == fmt, s
        np.testing.assert_array_equal(trn2core.encode(x, s), want)
        np.testing.assert_array_equal(trn2core.encode(x, dtype=s), want)
        np.testing.assert_array_equal(trn2core.encode(x, fmt=s), want)
        q = trn2core.quantize(x, dtype=s)
        assert q.dtype == trn2core.dtypes.FORMAT_DTYPES[fmt]
        np.testing.assert_array_equal(trn2core.decode(want, dtype=s), trn2core.decode(want, fmt))
        assert trn2core.format_info(s) == trn2core.format_info(fmt=fmt)


def test_the_aliases_come_from_the_core_and_name_formats():
    from trn2core import _core

    aliases = trn2core.dtypes.FORMAT_ALIASES
    assert aliases == dict(_core.format_aliases())
    assert set(aliases.values()) <= set(trn2core.FORMATS)
    assert not set(aliases) & set(trn2core.FORMATS)
    # Exactly the bit-semantics pairs: Neuron's fp8_e4m3 is ml_dtypes' float8_e4m3 (max 240).
    assert aliases["float8_e4m3"] == "fp8_e4m3"
    assert aliases["float8_e4m3fn"] == aliases["torch.float8_e4m3fn"] == "fp8_e4m3fn"
    assert "float8_e4m3fnuz" not in aliases and "torch.float8_e4m3fnuz" not in aliases


def test_real_torch_dtypes_when_torch_is_installed():
    # torch is not a dependency: this checks the real objects only where torch happens to be.
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        torch = None
    if torch is not None:
        assert trn2core.dtypes.format_name(torch.bfloat16) == "bf16"
        assert trn2core.dtypes.format_name(torch.float8_e4m3fn) == "fp8_e4m3fn"
    assert "torch" not in sys.modules or torch is not None  # trn2core itself never imports it


def test_dtype_and_fmt_together_or_neither_is_an_error():
    x = np.ones(2)
    with pytest.raises(trn2core.Trn2ValueError, match="^dtype: given twice"):
        trn2core.quantize(x, "bf16", fmt="bf16")
    with pytest.raises(trn2core.Trn2ValueError, match="^dtype: given twice"):
        trn2core.decode(np.zeros(2, np.uint8), dtype="fp8_e4m3", fmt="fp8_e4m3")
    with pytest.raises(trn2core.FormatError, match="^dtype: missing"):
        trn2core.encode(x)
    with pytest.raises(trn2core.FormatError, match="^dtype: missing"):
        trn2core.format_info()


@pytest.mark.parametrize(
    "bad, text",
    [
        ("bfloat", "unknown format 'bfloat'"),
        ("e4m3", "max 240"),
        (np.float64, "dtype float64 is not a Trainium2 number format"),
        (np.int8, "dtype int8 is not a Trainium2 number format"),
        (3, "expected a format"),
        (True, "expected a format"),
        (object(), "neither a format name nor a dtype"),
        (_fake_torch_dtype("float8_e4m3fnuz"), "max 448"),
    ],
)
def test_bad_formats_are_format_errors_naming_the_argument(bad, text):
    x = np.ones(2)
    with pytest.raises(trn2core.FormatError, match="^dtype: ") as e:
        trn2core.quantize(x, bad)
    assert text in str(e.value)
    with pytest.raises(trn2core.FormatError, match="^out_dtype: "):
        trn2core.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), out_dtype=bad)


def test_a_none_format_is_missing_not_float64():
    # np.dtype(None) is float64; None here means "not given".
    with pytest.raises(trn2core.FormatError, match="^dtype: missing"):
        trn2core.quantize(np.ones(2), None)
    with pytest.raises(trn2core.FormatError, match="^out_dtype: expected a format"):
        trn2core.gemm(np.ones((2, 2)), np.ones((2, 2)), out_dtype=None)


def test_engine_collectives_and_machine_take_the_same_spellings():
    a = np.random.default_rng(1).normal(size=(8, 16))
    b = np.random.default_rng(2).normal(size=(16, 4))
    r1 = trn2core.gemm(a, b, dtype="bf16", out_dtype="bf16")
    r2 = trn2core.gemm(a, b, dtype=ml_dtypes.bfloat16, out_dtype="torch.bfloat16")
    assert r2.out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(r1.out.view(np.uint16), r2.out.view(np.uint16))
    e1 = trn2core.estimate_gemm(512, 512, 512, dtype="fp8_e5m2")
    e2 = trn2core.estimate_gemm(512, 512, 512, dtype=ml_dtypes.float8_e5m2)
    assert e1.to_dict() == e2.to_dict()
    inst = trn2core.Instance("trn2.48xlarge")
    c1 = inst.estimate("all_reduce", 1 << 20, dtype="bf16")
    c2 = inst.estimate("all_reduce", 1 << 20, dtype="bfloat16")
    assert c1.seconds == c2.seconds
    lc = trn2core.Chip().cores[0]
    assert lc.peak_tflops(np.float16) == lc.peak_tflops("fp16") == lc.peak_tflops("half")
    core = trn2core.NeuronCore()
    assert core.tile((4, 8), "bfloat16").dtype == "bf16"
    assert core.tile((4, 8), ml_dtypes.float8_e4m3).dtype == "fp8_e4m3"
    assert core.tile((4, 8), np.int16).dtype == "int16"
    with pytest.raises(trn2core.FormatError, match="OCP E4M3"):
        core.tile((4, 8), ml_dtypes.float8_e4m3fn)  # OCP E4M3 is not a Trainium2 dtype
