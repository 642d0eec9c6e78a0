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

import ml_dtypes
import numpy as np

from . import _names

__all__ = [
    "PERF_MODES",
    "TILE_K",
    "double_row_order",
    "fma_f32",
    "gemm",
    "nc_matmul",
    "prune",
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
    a64, b64 = a_arr.astype(np.float64), b_arr.astype(np.float64)  # exact
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
