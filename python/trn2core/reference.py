"""Pure-numpy oracles of the tensor engine's arithmetic (contract section 2, "Numerics").

This module is the executable definition that the fast Rust kernels are checked against bit for
bit. It is written to be obviously correct, not fast: each output element is computed by the
same sequence of roundings the hardware performs, vectorised over the ``[M, N]`` output and
looping over the contraction index ``k`` only (a 256x4097x512 bf16 GEMM takes a few seconds).

The arithmetic, as the contract states it:

* One ``nc_matmul`` (a *tile*): the partial sum of every output element starts at +0.0 and takes
  the products in ascending ``k``; each step is a fused multiply-add,
  ``partial = fp32(partial + a[k, m] * b[k, n])``, with the product exact and one round-to-nearest-
  even to fp32 per step. In ``double_row`` mode the inputs are ``[128, 2, M]`` and ``[128, 2, N]``
  and the order is ``[k, 0]`` then ``[k, 1]`` for each row ``k``, i.e. contraction index ``k``
  then ``k + 128``.
* Accumulation into PSUM: ``psum = fp32(psum + partial)``, again one rounding.
* A GEMM cuts K into consecutive tiles of 128 (256 in double_row); the first tile's partial is
  written, each later one accumulated. Tiling M and N does not change any bit.

How one FMA step is evaluated exactly:

* Inputs of 16 bits or less (bf16, fp16, every fp8/fp6/fp4): the product has at most 22
  significant bits and an exponent far inside float64's range, so ``float64(a) * float64(b)`` is
  exact, and ``float32(float64(partial) + product)`` rounds the exact sum correctly. The float64
  addition rounds once before the float32 conversion, but that cannot double-round here: for the
  sum to be inexact in float64 the two addends must be more than 53 - 24 = 29 binades apart, and
  then the smaller one lies entirely below the fp32 rounding point of the larger, so the exact sum
  is at least a fraction of an fp32 ulp away from any fp32 tie, far more than float64's error.
  (This is the contract's "a float64 computation reproduces it exactly for these inputs".)
* Any fp32/tf32 (float32 container) operand: the product has up to 48 significant bits (still
  exact in float64), but ``partial + product`` can need more than 53 bits, and a float64 sum may
  then land exactly on an fp32 tie that the exact sum is not on (double rounding). Here the sum is
  evaluated with the TwoSum error-free transformation, ``s + e == partial + product`` exactly, and
  ``s`` is moved to *round-to-odd*: if ``e != 0`` and ``s`` has an even last bit, ``s`` steps one
  float64 ulp toward ``e``. Round-to-odd at 53 bits followed by round-to-nearest-even at 24 bits
  equals a single correct rounding whenever 53 >= 24 + 2 (Boldo and Melquiond, "Emulation of FMA
  and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
  :func:`fma_f32` exposes this step; the tests check it against :class:`fractions.Fraction`.
* The accumulate step adds two fp32 values in float64 and rounds to fp32, which is a correct
  rounding because 53 >= 2 * 24 + 2 (Figueroa, "When is double rounding innocuous?", 1995).

Special values follow IEEE arithmetic (numpy's float64 operations and float64 -> float32 cast):
Inf * 0 and Inf - Inf give NaN, a partial sum past fp32's range becomes +-Inf and stays there.
The payload and sign of a NaN result are whatever numpy produces; compare NaN *positions*, not
payloads. Signed zeros follow IEEE too: the partial sum starts at +0.0, an exact zero sum is +0.0
except -0.0 + -0.0, and a negative sum below half the smallest fp32 subnormal rounds to -0.0
(possible for bf16/fp16/fp32 products, never for fp8 ones, whose magnitude is at least 2**-32).

The oracle checks shapes and dtypes it cannot compute with, but not the engine's format pairing
rules (fp32 with fp32 only, double_row fp8 only) nor the ``M <= 128``, ``N <= 512`` limits, which
do not change the numbers; those are the engine's job to enforce.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from . import _names
from .dtypes import MACHINE_NP_DTYPES

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "CANONICAL_NAN_BITS",
    "MACHINE_DTYPES",
    "PERF_MODES",
    "TILE_K",
    "activation",
    "activation_values",
    "affine_select",
    "alu",
    "alu_bits",
    "bn_aggr",
    "bn_stats",
    "double_row_order",
    "engine_input",
    "engine_output",
    "fma_f32",
    "gemm",
    "iota",
    "memset",
    "nc_matmul",
    "nc_transpose",
    "prune",
    "reciprocal",
    "round_once",
    "scalar_tensor_tensor",
    "select",
    "tensor_copy",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_scalar_reduce",
    "tensor_tensor",
    "tensor_tensor_scan",
    "transpose",
]

#: perf modes the oracle understands.
PERF_MODES = _names.PERF_MODES

#: contraction rows per ``nc_matmul`` (partitions of the PE array); double_row takes 2 per row.
TILE_K = 128

# dtypes the tensor engine can read, all converted exactly to float64. Narrow ones (<= 16 bits)
# give products that are exact and take the plain float64 FMA path; float32 (fp32 or tf32 in a
# float32 container) needs the round-to-odd path.
_NARROW_DTYPES = frozenset(
    [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
    + [
        np.dtype(getattr(ml_dtypes, name))
        for name in dir(ml_dtypes)
        if name.startswith(("float8_", "float6_", "float4_"))
    ]
)
_F32 = np.dtype(np.float32)


def _is_float32(dt: np.dtype, arg: str) -> bool:
    """Whether ``dt`` is float32 (fp32/tf32); raises for dtypes the engine cannot read."""
    native = dt.newbyteorder("=")
    if native != _F32 and native not in _NARROW_DTYPES:
        raise TypeError(
            f"{arg}: dtype {dt} is not a tensor engine input; expected float32 (fp32/tf32), "
            "float16, ml_dtypes.bfloat16 or an ml_dtypes float8 dtype"
        )
    return native == _F32


def _as_float64(x: object, arg: str) -> tuple[np.ndarray, bool]:
    """``(exact float64 copy of x, whether x is float32)``; rejects what the engine cannot read."""
    a = np.asarray(x)
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly
        return a.astype(np.float64), _is_float32(a.dtype, arg)


def fma_f32(partial: object, a: object, b: object) -> np.ndarray:
    """``float32(partial + a * b)`` with the product exact and a single nearest-even rounding.

    ``partial`` holds float32 values (any float dtype whose values are float32-representable);
    ``a`` and ``b`` are any values whose product is exact in float64 (float32, float16, bf16, fp8).
    Broadcasts like numpy. This is one step of the tensor engine's accumulation chain.
    """
    p = np.asarray(partial, dtype=np.float64)
    with np.errstate(all="ignore"):
        prod = np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64)
        return _round_sum_f32(p, prod)


def _round_sum_f32(p: np.ndarray, prod: np.ndarray) -> np.ndarray:
    """``float32(p + prod)`` rounded once, for float64 arrays ``p`` and ``prod`` (any values)."""
    s = p + prod
    # TwoSum (Knuth): s + e == p + prod exactly, for finite operands without overflow (here the
    # magnitudes stay below 2**257, far inside float64). Non-finite s gives e = NaN.
    bp = s - p
    e = (p - (s - bp)) + (prod - bp)
    # Round to odd = truncate toward zero, then set the last bit if anything was cut off.
    # The exact sum is a multiple of 2**-298 (p is fp32, prod a product of fp32 numbers), far
    # above float64's subnormals, so an inexact s is a nonzero normal number. On the int64 view
    # of a nonzero float, subtracting 1 moves one ulp toward zero whatever the sign; that is the
    # truncation when e points toward zero (e and s of opposite signs).
    inexact = np.abs(e) > 0  # False for e == 0 and for e == NaN (Inf/NaN sums stay as they are)
    bits = s.view(np.int64)
    toward_zero = ((bits ^ e.view(np.int64)) < 0) & inexact
    odd = (bits - toward_zero) | inexact
    return odd.view(np.float64).astype(np.float32)


def _partial_sum(a: np.ndarray, b: np.ndarray, exact: bool) -> np.ndarray:
    """One tile's partial sums: ``a`` ``[K, M]`` and ``b`` ``[K, N]`` float64 in contraction
    order; returns float32 ``[M, N]``. ``exact`` selects the round-to-odd step (float32 inputs)."""
    k_len, m = a.shape
    n = b.shape[1]
    acc = np.zeros((m, n), dtype=np.float64)  # always holds float32 values; starts at +0.0
    acc32 = np.zeros((m, n), dtype=np.float32)
    prod = np.empty((m, n), dtype=np.float64)
    with np.errstate(all="ignore"):
        for k in range(k_len):
            np.multiply(a[k][:, None], b[k][None, :], out=prod)  # exact product
            if exact:
                acc32 = _round_sum_f32(acc, prod)
            else:
                np.add(acc, prod, out=acc)
                np.copyto(acc32, acc, casting="unsafe")  # the one fp32 rounding (nearest-even)
            np.copyto(acc, acc32)
    return acc32


def _check_perf_mode(perf_mode: str) -> None:
    if perf_mode not in PERF_MODES:
        raise ValueError(f"perf_mode: {perf_mode!r} is not one of {PERF_MODES}")


def nc_matmul(
    stationary: object,
    moving: object,
    *,
    psum: object | None = None,
    perf_mode: str = "none",
) -> np.ndarray:
    """One tensor engine instruction: ``stationary.T @ moving`` as a fresh float32 ``[M, N]``.

    ``stationary`` is ``[K, M]`` and ``moving`` ``[K, N]`` with ``K <= 128``; with
    ``perf_mode="double_row"`` they are ``[128, 2, M]`` and ``[128, 2, N]``, where ``[k, 0]`` is
    contraction index ``k`` and ``[k, 1]`` is ``k + 128``, taken in the order ``k, k + 128`` for
    each row. Without ``psum`` the result is the tile's partial sum (``accumulate=False``); with
    a float32 ``psum`` ``[M, N]`` it is ``float32(psum + partial)`` (``accumulate=True``).
    """
    _check_perf_mode(perf_mode)
    a, a_f32 = _as_float64(stationary, "stationary")
    b, b_f32 = _as_float64(moving, "moving")
    if perf_mode == "double_row":
        for arr, arg in ((a, "stationary"), (b, "moving")):
            if arr.ndim != 3 or arr.shape[:2] != (TILE_K, 2):
                raise ValueError(f"{arg}: shape {arr.shape} is not [128, 2, F] for double_row")
        # C-order reshape of [128, 2, F] lists [0,0], [0,1], [1,0], [1,1], ...: k, k+128, ...
        a = a.reshape(2 * TILE_K, a.shape[2])
        b = b.reshape(2 * TILE_K, b.shape[2])
    else:
        for arr, arg in ((a, "stationary"), (b, "moving")):
            if arr.ndim != 2:
                raise ValueError(f"{arg}: shape {arr.shape} is not [K, F]")
            if arr.shape[0] > TILE_K:
                raise ValueError(f"{arg}: K = {arr.shape[0]} exceeds the limit {TILE_K}")
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"moving: contraction length {b.shape[0]} differs from stationary's {a.shape[0]}"
        )
    partial = _partial_sum(a, b, exact=a_f32 or b_f32)
    if psum is None:
        return partial
    acc = np.asarray(psum)
    if acc.dtype != _F32 or acc.shape != partial.shape:
        raise ValueError(
            f"psum: {acc.dtype} {acc.shape} is not float32 of the result shape {partial.shape}"
        )
    return _accumulate(acc, partial)


def _accumulate(psum: np.ndarray, partial: np.ndarray) -> np.ndarray:
    """PSUM accumulation ``float32(psum + partial)`` of two float32 arrays."""
    with np.errstate(all="ignore"):
        # float32 + float32 in float64 is a correct single rounding (see module docstring).
        return (psum.astype(np.float64) + partial.astype(np.float64)).astype(np.float32)


def double_row_order(length: int) -> np.ndarray:
    """Contraction order inside a double_row K tile of ``length <= 256`` elements.

    Tile index ``j`` sits at row ``j % 128``, half ``j // 128`` of the ``[128, 2, F]`` layout, and
    each row is taken as ``k, k + 128``: ``0, 128, 1, 129, ...``. Indices ``>= length`` (a short
    last tile) are skipped. A kernel pads them with zeros in both operands instead; those products
    are +0.0, which changes nothing unless the partial sum is -0.0 (impossible for fp8 operands, the
    only ones double_row accepts)."""
    if not 0 <= length <= 2 * TILE_K:
        raise ValueError(f"length: {length} is not in 0..{2 * TILE_K}")
    rows = np.arange(TILE_K)
    order = np.stack([rows, rows + TILE_K], axis=1).reshape(-1)  # k, k + 128 for each row k
    return order[order < length]


def gemm(a: object, b: object, *, perf_mode: str = "none") -> np.ndarray:
    """``a @ b`` for ``a`` ``[M, K]`` and ``b`` ``[K, N]``, tiled onto the tensor engine.

    K is cut into consecutive tiles of 128 (256 in double_row, taken in the order of
    :func:`double_row_order`); the first tile's partial sum is written and each later one
    accumulated with one fp32 rounding. M and N are not tiled: that changes no bit.
    ``K == 0`` gives +0.0 everywhere. Returns a fresh float32 ``[M, N]``.
    """
    _check_perf_mode(perf_mode)
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    exact = _is_float32(a_arr.dtype, "a") | _is_float32(b_arr.dtype, "b")
    if a_arr.ndim != 2 or b_arr.ndim != 2:
        raise ValueError(f"a, b: shapes {a_arr.shape}, {b_arr.shape} are not [M, K], [K, N]")
    if a_arr.shape[1] != b_arr.shape[0]:
        raise ValueError(f"b: K = {b_arr.shape[0]} differs from a's K = {a_arr.shape[1]}")
    m, k_total = a_arr.shape
    n = b_arr.shape[1]
    with np.errstate(invalid="ignore"):  # exact; signalling NaNs widen quietly
        a64, b64 = a_arr.astype(np.float64), b_arr.astype(np.float64)
    tile = 2 * TILE_K if perf_mode == "double_row" else TILE_K
    psum = np.zeros((m, n), dtype=np.float32)
    for k0 in range(0, k_total, tile):
        length = min(tile, k_total - k0)
        order = k0 + (double_row_order(length) if perf_mode == "double_row" else np.arange(length))
        # a supplies the stationary tiles ([L, M]), b the moving ones ([L, N])
        stationary = np.ascontiguousarray(a64[:, order].T)
        partial = _partial_sum(stationary, b64[order], exact)
        psum = partial if k0 == 0 else _accumulate(psum, partial)
    return psum


def transpose(x: object) -> np.ndarray:
    """The PE transpose mode (``nc_transpose`` on the tensor engine): bit-exact ``x.T``.

    Trainium2's transpose mode moves bits, so NaN payloads, -0.0 and Inf survive, and the result
    keeps the input dtype (fp16/bf16 are written to PSUM as 16-bit values, fp8 as 16-bit elements
    whose value is the fp8 code; here it stays the fp8 dtype). Returns a fresh C-contiguous array.
    """
    arr = np.asarray(x)
    _is_float32(arr.dtype, "x")
    if arr.ndim != 2:
        raise ValueError(f"x: shape {arr.shape} is not [P, F]")
    return np.ascontiguousarray(arr.T)


def prune(x: object, pattern: str, *, axis: int = -1) -> np.ndarray:
    """Pure-numpy N:M magnitude pruning (the oracle of ``trn2core.prune``).

    Every group of M consecutive elements along ``axis`` keeps the elements that fewer than N
    others of the group outrank, where ``j`` outranks ``k`` if ``|x_j| > |x_k|``, or if they tie
    and ``j < k``; NaN counts as larger than everything (and NaNs tie with each other). The others
    become ``+0`` (all bits zero). Magnitudes are compared as numbers (float64 for floats, Python
    integers' order for ints), not as bit patterns, so this is independent of the Rust key trick.
    """
    n, m = (int(v) for v in pattern.split(":"))
    a = np.asarray(x)
    ax = axis % a.ndim if a.ndim else 0
    moved = np.moveaxis(a, ax, -1)
    if moved.shape[-1] % m:
        raise ValueError(f"axis length {moved.shape[-1]} is not a multiple of {m}")
    groups = moved.reshape(moved.shape[:-1] + (moved.shape[-1] // m, m))
    if a.dtype.kind == "b":
        mag = groups.astype(np.float64)
        nan = np.zeros(groups.shape, dtype=bool)
    elif a.dtype.kind in "iu":
        # Exact magnitudes as Python ints (int64's minimum has no int64 absolute value).
        mag = np.vectorize(lambda v: abs(int(v)), otypes=[object])(groups)
        nan = np.zeros(groups.shape, dtype=bool)
    else:
        with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly
            f = groups.astype(np.float64)
        nan = np.isnan(f)
        mag = np.where(nan, 0.0, np.abs(f))
    # outranks[..., j, k]: element j outranks element k.
    mj, mk = mag[..., :, None], mag[..., None, :]
    nj, nk = nan[..., :, None], nan[..., None, :]
    lower = np.arange(m)[:, None] < np.arange(m)[None, :]
    greater = (nj & ~nk) | (~nj & ~nk & (mj > mk))
    tie = (nj & nk) | (~nj & ~nk & (mj == mk))
    outranks = greater | (tie & lower)
    keep = outranks.sum(axis=-2) < n
    zero = np.zeros((), dtype=a.dtype)
    pruned = np.where(keep, groups, zero).reshape(moved.shape)
    return np.ascontiguousarray(np.moveaxis(pruned, -1, ax))


# ----------------------------------------------------------------------------------------------
# The whole NeuronCore (contract section 7): oracles of the Vector, Scalar and GpSimd
# instructions, written from the rules in docs/machine.md with numpy, ml_dtypes and Python's
# ``math`` (whose float64 functions are the C library's, as the Rust core's are).
#
# Tiles are numpy arrays ``[P, ...]`` (partition axis first) of the machine's dtypes:
# float32 (``"fp32"``, or ``"tf32"`` when declared), ml_dtypes bfloat16 / float8_e4m3 /
# float8_e5m2 / float8_e3m4, float16, and the 8/16/32-bit integers. Every oracle returns a fresh
# array of the destination dtype; ``out_dtype`` is a machine dtype name.
# ----------------------------------------------------------------------------------------------

#: numpy dtype of each machine dtype name (tf32 lives in a float32 container): the core's
#: table of element types.
MACHINE_DTYPES: dict[str, np.dtype] = MACHINE_NP_DTYPES

#: the canonical quiet NaN of every NaN result (bits of float32).
CANONICAL_NAN_BITS = 0x7FC00000

_ARITH_BINARY = (
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "abs_max",
    "abs_min",
    "power",
    "equal",
    "not_equal",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
)
_ARITH_UNARY = ("abs", "square", "relu", "rsqrt", "reciprocal")
_BITVEC = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "invert")


def _name_of(a: np.ndarray, dtype: str | None) -> str:
    if dtype is not None:
        return dtype
    for name, dt in MACHINE_DTYPES.items():
        if a.dtype == dt:
            return name
    raise TypeError(f"dtype {a.dtype} is not a machine dtype")


def engine_input(x: object, dtype: str | None = None) -> np.ndarray:
    """The float32 values an engine computes with: exact widening of floats (tf32: the low 13
    bits of the container ignored), integers rounded to nearest even past 2**24."""
    a = np.asarray(x)
    name = _name_of(a, dtype)
    if name == "tf32":
        return (a.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return a.astype(np.float32)


def _canon(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32).copy()
    v[np.isnan(v)] = np.array(CANONICAL_NAN_BITS, dtype=np.uint32).view(np.float32)
    return v


def engine_output(v: object, dtype: str) -> np.ndarray:
    """Float32 results (NaN made canonical) rounded once to ``dtype``: nearest even; floats
    overflow to Inf; integers saturate and NaN becomes 0."""
    f = _canon(np.asarray(v, dtype=np.float32))
    dt = MACHINE_DTYPES[dtype]
    with np.errstate(all="ignore"):
        if dtype == "fp32":
            return f
        if dtype == "tf32":
            bits = f.view(np.uint32).astype(np.uint64)
            finite = (bits & 0x7F800000) != 0x7F800000
            rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
            return np.where(finite, rounded, bits.astype(np.uint32)).view(np.float32)
        if dt.kind == "f" or dtype in ("bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e3m4"):
            return f.astype(dt)
        info = np.iinfo(dt)
        r = np.clip(np.rint(f.astype(np.float64)), info.min, info.max)
        r[np.isnan(f)] = 0
        return r.astype(dt)


def _c_pow(x: float, y: float) -> float:
    """C's ``pow`` through Python's ``math`` (which raises where C returns NaN or Inf)."""
    odd = math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0.0
    try:
        return math.pow(x, y)
    except ValueError:
        # C: pow(+-0, y < 0) is a pole (+-Inf, signed for odd integer y); the rest is NaN.
        if x == 0.0 and y < 0.0:
            return math.copysign(math.inf, x) if odd else math.inf
        return math.nan
    except OverflowError:
        return -math.inf if x < 0 and odd else math.inf


def _c_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _c_log(x: float) -> float:
    if x == 0.0:
        return -math.inf
    if x < 0.0 or math.isnan(x):
        return math.nan
    return math.log(x)


def _c_log1p(x: float) -> float:
    if x == -1.0:
        return -math.inf
    if x < -1.0 or math.isnan(x):
        return math.nan
    return math.log1p(x)


def _c_sin(x: float) -> float:
    return math.nan if math.isinf(x) else math.sin(x)


def _elementwise(f, *arrays: np.ndarray) -> np.ndarray:
    """``f`` on float64 values element by element (Python floats), as float64."""
    args = np.broadcast_arrays(*[np.asarray(a, dtype=np.float64) for a in arrays])
    out = np.empty(args[0].shape, dtype=np.float64)
    flat = [a.reshape(-1) for a in args]
    out.reshape(-1)[:] = [f(*vals) for vals in zip(*(a.tolist() for a in flat), strict=True)]
    return out


def _ieee_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754-2019 maximum of float32 arrays: NaN in, NaN out; +0 > -0."""
    both_zero = (a == 0) & (b == 0)
    zbits = (a.view(np.uint32) & b.view(np.uint32)).view(np.float32)
    r = np.where(a > b, a, b)
    r = np.where(both_zero, zbits, r)
    return np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), r).astype(np.float32)


def _ieee_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    both_zero = (a == 0) & (b == 0)
    zbits = (a.view(np.uint32) | b.view(np.uint32)).view(np.float32)
    r = np.where(a < b, a, b)
    r = np.where(both_zero, zbits, r)
    return np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), r).astype(np.float32)


def alu(op: str, a: object, b: object = 0.0) -> np.ndarray:
    """One arithmetic ALU operator on float32 values (docs/machine.md, "ALU operators"); a
    float32 result with canonical NaN. Unary operators ignore ``b``."""
    x = np.asarray(a, dtype=np.float32)
    y = np.asarray(b, dtype=np.float32)
    x, y = np.broadcast_arrays(x, y)
    one, zero = np.float32(1), np.float32(0)
    with np.errstate(all="ignore"):
        if op == "add":
            r = x + y
        elif op == "subtract":
            r = x - y
        elif op == "multiply":
            r = x * y
        elif op == "divide":
            r = x / y
        elif op == "maximum":
            r = _ieee_max(x, y)
        elif op == "minimum":
            r = _ieee_min(x, y)
        elif op == "abs_max":
            r = _ieee_max(np.abs(x), np.abs(y))
        elif op == "abs_min":
            r = _ieee_min(np.abs(x), np.abs(y))
        elif op == "power":
            r = _elementwise(_c_pow, x, y).astype(np.float32)
        elif op in ("equal", "not_equal", "greater", "greater_equal", "less", "less_equal"):
            cmp = {
                "equal": np.equal,
                "not_equal": np.not_equal,
                "greater": np.greater,
                "greater_equal": np.greater_equal,
                "less": np.less,
                "less_equal": np.less_equal,
            }[op]
            r = np.where(cmp(x, y), one, zero)
        elif op in ("logical_and", "logical_or", "logical_xor"):
            f = {
                "logical_and": np.logical_and,
                "logical_or": np.logical_or,
                "logical_xor": np.logical_xor,
            }[op]
            r = np.where(f(x != 0, y != 0), one, zero)
        elif op == "abs":
            r = np.abs(x)
        elif op == "square":
            r = x * x
        elif op == "relu":
            r = np.where(np.isnan(x) | (x > 0), x, zero)
        elif op == "rsqrt":
            r = (1.0 / np.sqrt(x.astype(np.float64))).astype(np.float32)
        elif op == "reciprocal":
            r = one / x
        else:
            raise ValueError(f"op: {op!r} is not an arithmetic ALU operator")
    return _canon(r)


def _bits(a: np.ndarray) -> np.ndarray:
    """Raw bits of integer elements, zero-extended to uint32."""
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]).astype(np.uint32)


def alu_bits(op: str, a: np.ndarray, b: object = 0) -> np.ndarray:
    """One bitvec operator on raw bits (uint32; shifts of 32 or more give 0)."""
    x = np.asarray(a, dtype=np.uint64)
    y = np.asarray(b, dtype=np.uint64)
    if op == "bitwise_and":
        r = x & y
    elif op == "bitwise_or":
        r = x | y
    elif op == "bitwise_xor":
        r = x ^ y
    elif op == "left_shift":
        r = np.where(y >= 32, 0, (x << np.minimum(y, 31)) & 0xFFFFFFFF)
    elif op == "right_shift":
        r = np.where(y >= 32, 0, x >> np.minimum(y, 31))
    elif op == "invert":
        r = ~x & 0xFFFFFFFF
    else:
        raise ValueError(f"op: {op!r} is not a bitvec operator")
    return r.astype(np.uint32)


def _from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    dt = MACHINE_DTYPES[dtype]
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize]
    return (bits & np.uint32((1 << (8 * dt.itemsize)) - 1)).astype(u).view(dt)


def _scalar_values(operand: object, rows: int) -> np.ndarray:
    """A constant or a ``[P, 1]`` operand as ``[P, 1]`` float32 (a constant rounded once)."""
    if np.ndim(operand) == 0:
        return np.full((rows, 1), np.float32(float(operand)), dtype=np.float32)
    return np.asarray(operand).astype(np.float32).reshape(rows, 1)


def _apply(op: str, x: np.ndarray, s: np.ndarray, reverse: bool) -> np.ndarray:
    if op in _ARITH_UNARY:
        return alu(op, x)
    return alu(op, s, x) if reverse else alu(op, x, s)


def tensor_tensor(
    data1: object,
    data2: object,
    op: str,
    out_dtype: str,
    *,
    engine: str = "vector",
    dtypes: tuple[str | None, str | None] = (None, None),
) -> np.ndarray:
    """``tensor_tensor``: ``op(data1, data2)`` element-wise. Bitvec operators on raw bits; on
    GpSimd with every tile int32/uint32, native wrapping integer arithmetic for add, subtract,
    multiply, maximum, minimum and comparisons; otherwise float32."""
    a, b = np.asarray(data1), np.asarray(data2)
    na, nb = _name_of(a, dtypes[0]), _name_of(b, dtypes[1])
    if op in _BITVEC:
        return _from_bits(alu_bits(op, _bits(a), _bits(b)), out_dtype).reshape(a.shape)
    ints = {"int32", "uint32"}
    native = (
        "add",
        "subtract",
        "multiply",
        "maximum",
        "minimum",
        "equal",
        "not_equal",
        "greater",
        "greater_equal",
        "less",
        "less_equal",
    )
    if engine == "gpsimd" and op in native and {na, nb, out_dtype} <= ints:
        x, y = a.astype(np.int64), b.astype(np.int64)
        r = {
            "add": x + y,
            "subtract": x - y,
            "multiply": (x * y),
            "maximum": np.maximum(x, y),
            "minimum": np.minimum(x, y),
            "equal": x == y,
            "not_equal": x != y,
            "greater": x > y,
            "greater_equal": x >= y,
            "less": x < y,
            "less_equal": x <= y,
        }[op]
        return _from_bits((np.asarray(r, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32), out_dtype)
    return engine_output(alu(op, engine_input(a, na), engine_input(b, nb)), out_dtype)


def tensor_scalar(
    data: object,
    op0: str,
    operand0: object,
    out_dtype: str,
    *,
    reverse0: bool = False,
    op1: str | None = None,
    operand1: object = None,
    reverse1: bool = False,
    dtype: str | None = None,
) -> np.ndarray:
    """``tensor_scalar``: ``(data <op0> operand0) <op1> operand1`` with constants or ``[P, 1]``
    fp32 operands broadcast along the free axes (bitvec operators: integer bits)."""
    a = np.asarray(data)
    rows = a.shape[0]
    if op0 in _BITVEC:
        x = _bits(a).reshape(rows, -1)
        s0 = np.asarray(operand0).astype(np.int64).astype(np.uint64).reshape(-1, 1) & 0xFFFFFFFF
        r = alu_bits(op0, x, s0)
        if op1 is not None:
            s1 = np.asarray(operand1).astype(np.int64).astype(np.uint64).reshape(-1, 1) & 0xFFFFFFFF
            r = alu_bits(op1, s1, r) if reverse1 else alu_bits(op1, r, s1)
        return _from_bits(r, out_dtype).reshape(a.shape)
    x = engine_input(a, dtype).reshape(rows, -1)
    r = _apply(op0, x, _scalar_values(operand0, rows), reverse0)
    if op1 is not None:
        r = _apply(op1, r, _scalar_values(operand1, rows), reverse1)
    return engine_output(r, out_dtype).reshape(a.shape)


def scalar_tensor_tensor(
    data: object,
    op0: str,
    operand0: object,
    op1: str,
    operand1: object,
    out_dtype: str,
    *,
    reverse0: bool = False,
    reverse1: bool = False,
) -> np.ndarray:
    """``scalar_tensor_tensor``: ``(data <op0> operand0) <op1> operand1``, ``operand1`` a tile."""
    a = np.asarray(data)
    rows = a.shape[0]
    x = engine_input(a).reshape(rows, -1)
    y = engine_input(operand1).reshape(rows, -1)
    t = _apply(op0, x, _scalar_values(operand0, rows), reverse0)
    r = alu(op1, t) if op1 in _ARITH_UNARY else (alu(op1, y, t) if reverse1 else alu(op1, t, y))
    return engine_output(r, out_dtype).reshape(a.shape)


def tensor_copy(src: object, out_dtype: str, *, dtype: str | None = None) -> np.ndarray:
    """``tensor_copy`` (and ``dma_copy``): bits when the dtypes agree, else through float32."""
    a = np.asarray(src)
    if _name_of(a, dtype) == out_dtype:
        return a.copy()
    return engine_output(engine_input(a, dtype), out_dtype)


def memset(shape: tuple[int, ...], value: float, dtype: str) -> np.ndarray:
    """``memset``: ``value`` rounded once to ``dtype`` (integers: nearest even, saturated)."""
    dt = MACHINE_DTYPES[dtype]
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if math.isnan(value):
            v = 0
        elif math.isinf(value):
            v = info.max if value > 0 else info.min
        else:  # round() is nearest-even, as the rule says
            v = min(max(round(value), info.min), info.max)
        return np.full(shape, v, dtype=dt)
    with np.errstate(all="ignore"):
        return np.full(shape, np.float64(round_once(value, dtype))).astype(dt)


#: (stored mantissa bits, exponent of the smallest normal, largest finite) of the float dtypes.
_FLOAT_PARAMS = {
    "fp32": (23, -126, float(np.finfo(np.float32).max)),
    "tf32": (10, -126, (2 - 2.0**-10) * 2.0**127),
    "bf16": (7, -126, (2 - 2.0**-7) * 2.0**127),
    "fp16": (10, -14, 65504.0),
    "fp8_e4m3": (3, -6, 240.0),
    "fp8_e5m2": (2, -14, 57344.0),
    "fp8_e3m4": (4, -2, 15.5),
}


def round_once(value: float, dtype: str) -> float:
    """``value`` (a float64) rounded once to a float dtype, nearest even, overflowing to Inf:
    exact float64 arithmetic on the significand (``round`` ties to even), independent of any
    cast (ml_dtypes casts float64 through float32, which rounds twice)."""
    m_bits, emin, top = _FLOAT_PARAMS[dtype]
    if not math.isfinite(value) or value == 0.0:
        return value
    if abs(value) < 2.0**emin:  # subnormal range: one quantum 2**(emin - M)
        q = round(value * 2.0 ** (m_bits - emin)) * 2.0 ** (emin - m_bits)
    else:
        m, e = math.frexp(value)
        q = math.ldexp(round(m * 2.0 ** (m_bits + 1)) / 2.0 ** (m_bits + 1), e)
    return math.copysign(math.inf, value) if abs(q) > top else q


def reciprocal(data: object, out_dtype: str) -> np.ndarray:
    """``reciprocal`` (Vector engine): ``1 / x`` in IEEE float32."""
    return engine_output(alu("reciprocal", engine_input(data)), out_dtype)


def select(predicate: object, on_true: object, on_false: object, out_dtype: str) -> np.ndarray:
    """``select``: ``predicate != 0 ? on_true : on_false`` (NaN counts as true); bits when
    ``on_true``, a tile ``on_false`` and the destination share a dtype, else float32."""
    p = engine_input(predicate)
    t = np.asarray(on_true)
    if np.ndim(on_false) and t.dtype == np.asarray(on_false).dtype == MACHINE_DTYPES[out_dtype]:
        return np.where(p != 0, t, np.asarray(on_false))
    f = engine_input(on_false) if np.ndim(on_false) else np.float32(float(on_false))
    return engine_output(np.where(p != 0, engine_input(t), f), out_dtype)


def tensor_reduce(
    data: object, op: str, axes: int, out_dtype: str, *, negate: bool = False
) -> np.ndarray:
    """``tensor_reduce`` over the last ``axes`` free axes: ``acc = x[0]``, then
    ``acc = op(acc, x[i])`` in logical order; ``negate`` flips the sign."""
    a = np.asarray(data)
    kept = a.shape[: a.ndim - axes]
    if op in _BITVEC:
        groups = _bits(a).reshape(-1, int(np.prod(a.shape[a.ndim - axes :])))
        acc = groups[:, 0].copy()
        for i in range(1, groups.shape[1]):
            acc = alu_bits(op, acc, groups[:, i])
        return _from_bits(acc, out_dtype).reshape(kept)
    groups = engine_input(a).reshape(-1, int(np.prod(a.shape[a.ndim - axes :])))
    acc = _canon(groups[:, 0])
    for i in range(1, groups.shape[1]):
        acc = alu(op, acc, groups[:, i])
    if negate:
        acc = _canon(-acc)
    return engine_output(acc, out_dtype).reshape(kept)


def tensor_tensor_scan(
    data0: object,
    data1: object,
    initial: object,
    op0: str,
    op1: str,
    out_dtype: str,
    *,
    reverse0: bool = False,
    reverse1: bool = False,
) -> np.ndarray:
    """``tensor_tensor_scan``: per partition ``s = op1(op0(data0[i], s), data1[i])`` from
    ``s = initial``, the state kept in float32; every ``s`` is written."""
    a = np.asarray(data0)
    rows = a.shape[0]
    x = engine_input(a).reshape(rows, -1)
    y = engine_input(data1).reshape(rows, -1)
    s = _canon(_scalar_values(initial, rows)[:, 0])
    out = np.empty_like(x)
    for i in range(x.shape[1]):
        t = alu(op0, s, x[:, i]) if reverse0 else alu(op0, x[:, i], s)
        s = alu(op1, y[:, i], t) if reverse1 else alu(op1, t, y[:, i])
        out[:, i] = s
    return engine_output(out, out_dtype).reshape(a.shape)


def _act(func: str):
    """The float64 formula of an activation function (docs/machine.md, "Activation")."""
    # The float64 constants of the rule (Rust's FRAC_1_SQRT_2 and FRAC_2_SQRT_PI, and the
    # nearest float64 values of sqrt(2/pi) and 1/sqrt(2 pi)); 1 / math.sqrt(2) would be one ulp
    # off.
    frac_1_sqrt_2 = 0.7071067811865476
    frac_2_sqrt_pi = 1.1283791670955126
    sqrt_2_over_pi = 0.7978845608028654
    frac_1_sqrt_2pi = 0.3989422804014327

    def sig(z: float) -> float:
        return 1.0 / (1.0 + _c_exp(-z))

    def softplus(z: float) -> float:
        return z + _c_log1p(_c_exp(-z)) if z > 0.0 else _c_log1p(_c_exp(z))

    def gelu(x: float) -> float:
        return 0.5 * x * (1.0 + math.erf(x * frac_1_sqrt_2))

    table = {
        "copy": lambda x: x,
        "square": lambda x: x * x,
        "relu": lambda x: x if (x > 0.0 or math.isnan(x)) else 0.0,
        "sigmoid": sig,
        "tanh": math.tanh,
        "gelu": gelu,
        "gelu_dx": lambda x: (
            0.5 * (1.0 + math.erf(x * frac_1_sqrt_2)) + x * _c_exp(-0.5 * x * x) * frac_1_sqrt_2pi
        ),
        "gelu_apprx_tanh": lambda x: (
            0.5 * x * (1.0 + math.tanh(sqrt_2_over_pi * (x + 0.044715 * (x * x * x))))
        ),
        "gelu_apprx_sigmoid": lambda x: _div(x, 1.0 + _c_exp(-1.702 * x)),
        "gelu_apprx_sigmoid_dx": lambda x: (lambda s: s + 1.702 * x * s * (1.0 - s))(
            sig(1.702 * x)
        ),
        "silu": lambda x: _div(x, 1.0 + _c_exp(-x)),
        "silu_dx": lambda x: (lambda s: s * (1.0 + x * (1.0 - s)))(sig(x)),
        "softplus": softplus,
        "mish": lambda x: x * math.tanh(softplus(x)),
        "erf": math.erf,
        "erf_dx": lambda x: frac_2_sqrt_pi * _c_exp(-(x * x)),
        "exp": _c_exp,
        "log": _c_log,
        "sin": _c_sin,
        "arctan": math.atan,
        "sqrt": lambda x: math.nan if x < 0 else math.sqrt(x),
        "rsqrt": lambda x: _div(1.0, math.nan if x < 0 else math.sqrt(x)),
        "reciprocal": lambda x: _div(1.0, x),
        "sign": lambda x: 1.0 if x > 0.0 else (-1.0 if x < 0.0 else x),
        "abs": abs,
    }
    if func not in table:
        raise ValueError(f"func: {func!r} is not an activation function")
    return table[func]


def _div(a: float, b: float) -> float:
    """IEEE float64 division (Python raises on division by zero)."""
    return float(np.float64(a) / np.float64(b))


#: the activation functions the oracle knows (docs/machine.md).
ACTIVATION_FUNCTIONS = (
    "copy",
    "square",
    "relu",
    "sigmoid",
    "tanh",
    "gelu",
    "gelu_dx",
    "gelu_apprx_tanh",
    "gelu_apprx_sigmoid",
    "gelu_apprx_sigmoid_dx",
    "silu",
    "silu_dx",
    "softplus",
    "mish",
    "erf",
    "erf_dx",
    "exp",
    "log",
    "sin",
    "arctan",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sign",
    "abs",
)


def activation_values(func: str, x: object) -> np.ndarray:
    """The activation rule on float32 inputs: the float64 formula rounded once to float32 (NaN
    canonical). *Not the chip's bits* (its polynomials are unpublished)."""
    f = _act(func)
    with np.errstate(all="ignore"):
        r = _elementwise(f, np.asarray(x, dtype=np.float32)).astype(np.float32)
    return _canon(r)


def activation(
    data: object,
    func: str,
    out_dtype: str,
    *,
    scale: object = 1.0,
    bias: object = 0.0,
    dtype: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``activation``: ``func(data * scale + bias)`` (two float32 roundings before ``func``);
    returns ``(dst, sums)`` where ``sums`` ``[P]`` float32 are the add-reduction of the float32
    results from +0 in order (what ``reduce_cmd=reset_reduce`` leaves in the registers)."""
    a = np.asarray(data)
    rows = a.shape[0]
    x = engine_input(a, dtype).reshape(rows, -1)
    s = _scalar_values(scale, rows)
    b = (
        engine_input(bias).reshape(rows, 1)
        if np.ndim(bias)
        else np.full((rows, 1), np.float32(float(bias)))
    )
    with np.errstate(all="ignore"):
        t = (x * s).astype(np.float32) + b
    r = activation_values(func, t)
    sums = np.zeros(rows, dtype=np.float32)
    with np.errstate(all="ignore"):
        for i in range(r.shape[1]):
            sums = (sums + r[:, i]).astype(np.float32)
    return engine_output(r, out_dtype).reshape(a.shape), _canon(sums)


def tensor_scalar_reduce(
    data: object,
    op0: str,
    operand0: object,
    reduce_op: str,
    out_dtype: str,
    *,
    reverse0: bool = False,
    negate: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``tensor_scalar_reduce`` with ``reset_reduce``: ``(dst, reduce_res [P] float32)``, the
    register starting at the operator's identity and taking the float32 results in order."""
    a = np.asarray(data)
    rows = a.shape[0]
    r = _apply(op0, engine_input(a).reshape(rows, -1), _scalar_values(operand0, rows), reverse0)
    ident = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}[reduce_op]
    acc = np.full(rows, np.float32(ident))
    for i in range(r.shape[1]):
        acc = alu(reduce_op, acc, r[:, i])
    if negate:
        acc = _canon(-acc)
    return engine_output(r, out_dtype).reshape(a.shape), acc


def _affine(pattern, offset: int, channel_multiplier: int, rows: int) -> np.ndarray:
    """The iota / affine_select values ``[P, F]`` as wrapping 32-bit integers (int64 here)."""
    v = np.full((rows, 1), offset, dtype=np.int64) + channel_multiplier * np.arange(rows)[:, None]
    grid = np.zeros((1,), dtype=np.int64)
    for step, num in pattern:
        grid = (grid[:, None] + step * np.arange(num)[None, :]).reshape(-1)
    r = (v + grid[None, :]) & 0xFFFFFFFF
    return np.where(r >= 1 << 31, r - (1 << 32), r)


def iota(
    shape: tuple[int, ...], pattern, offset: int, channel_multiplier: int, dtype: str
) -> np.ndarray:
    """``iota``: the affine pattern's int32 values converted to ``dtype`` (integers saturate,
    floats through float32)."""
    v = _affine(pattern, offset, channel_multiplier, shape[0])
    dt = MACHINE_DTYPES[dtype]
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(v, info.min, info.max).astype(dt).reshape(shape)
    return engine_output(v.astype(np.float32), dtype).reshape(shape)


def affine_select(
    on_true: object,
    pattern,
    channel_multiplier: int,
    on_false_value: float,
    cmp_op: str,
    offset: int,
    out_dtype: str,
) -> np.ndarray:
    """``affine_select``: ``cmp_op(affine, 0) ? on_true : on_false_value``; bits when
    ``on_true`` has the destination's dtype, else float32."""
    t = np.asarray(on_true)
    v = _affine(pattern, offset, channel_multiplier, t.shape[0]).reshape(t.shape)
    cmp = {
        "equal": np.equal,
        "not_equal": np.not_equal,
        "greater": np.greater,
        "greater_equal": np.greater_equal,
        "less": np.less,
        "less_equal": np.less_equal,
    }[cmp_op]
    pred = cmp(v, 0)
    if t.dtype == MACHINE_DTYPES[out_dtype]:
        false = engine_output(np.float32(on_false_value), out_dtype)
        return np.where(pred, t, false)
    return engine_output(np.where(pred, engine_input(t), np.float32(on_false_value)), out_dtype)


def bn_stats(data: object, out_dtype: str = "fp32") -> np.ndarray:
    """``bn_stats``: per partition ``[count, mean, m2]`` of the even- and odd-indexed elements;
    sums from +0 in order, each step rounded to float32 (count 0: mean 0, m2 0)."""
    a = np.asarray(data)
    x = engine_input(a).reshape(a.shape[0], -1)
    cols = []
    with np.errstate(all="ignore"):
        for parity in (0, 1):
            v = x[:, parity::2]
            c = np.float32(v.shape[1])
            if v.shape[1] == 0:
                cols += [np.zeros(x.shape[0], np.float32)] * 3
                continue
            s = np.zeros(x.shape[0], np.float32)
            for i in range(v.shape[1]):
                s = (s + v[:, i]).astype(np.float32)
            mean = _canon((s / c).astype(np.float32))
            q = np.zeros(x.shape[0], np.float32)
            for i in range(v.shape[1]):
                d = (v[:, i] - mean).astype(np.float32)
                q = (q + (d * d).astype(np.float32)).astype(np.float32)
            cols += [np.full(x.shape[0], c), mean, _canon(q)]
    return engine_output(np.stack(cols, axis=1), out_dtype)


def bn_aggr(stats: object, out_dtype: str = "fp32") -> np.ndarray:
    """``bn_aggr``: ``[mean, variance]`` per partition from ``(count, mean, m2)`` triples:
    ``n = sum c``, ``mean = (sum c * m) / n``, ``var = (sum (m2 + c * ((m - mean)^2))) / n``,
    float32 steps in order."""
    s = engine_input(stats)
    t = s.reshape(s.shape[0], -1, 3)
    with np.errstate(all="ignore"):
        n = np.zeros(s.shape[0], np.float32)
        tot = np.zeros(s.shape[0], np.float32)
        for i in range(t.shape[1]):
            n = (n + t[:, i, 0]).astype(np.float32)
            tot = (tot + (t[:, i, 0] * t[:, i, 1]).astype(np.float32)).astype(np.float32)
        mean = (tot / n).astype(np.float32)
        q = np.zeros(s.shape[0], np.float32)
        for i in range(t.shape[1]):
            d = (t[:, i, 1] - mean).astype(np.float32)
            u = (t[:, i, 2] + (t[:, i, 0] * (d * d)).astype(np.float32)).astype(np.float32)
            q = (q + u).astype(np.float32)
        var = (q / n).astype(np.float32)
    return engine_output(np.stack([_canon(mean), _canon(var)], axis=1), out_dtype)


def nc_transpose(data: object) -> np.ndarray:
    """``nc_transpose`` (tensor or Vector engine): bits, ``[P, F] -> [F, P]``, any dtype."""
    a = np.asarray(data)
    return np.ascontiguousarray(a.reshape(a.shape[0], -1).T)
