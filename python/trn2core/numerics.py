"""Number formats and rounding (contract section 1): ``quantize``, ``encode``, ``decode``.

This module only normalises arguments; every bit is computed by the Rust core
(``rust/trn2core/src/numerics``), in parallel and with the GIL released.
"""

from __future__ import annotations

import dataclasses
import os
import secrets

import numpy as np

from . import _core, _validate
from ._names import FORMATS, ROUNDING_MODES
from .dtypes import CODE_DTYPES, FORMAT_DTYPES, format_arg, format_name, source_view
from .errors import FormatError, ShapeError, Trn2ValueError
from .report import html_table, plain

__all__ = [
    "FORMATS",
    "ROUNDING_MODES",
    "FormatInfo",
    "format_info",
    "quantize",
    "encode",
    "decode",
    "stochastic_bits",
    "SEED_ENV",
]

#: Environment variable the Neuron runtime reads for its stochastic-rounding seed.
SEED_ENV = "NEURON_RT_STOCHASTIC_ROUNDING_SEED"


@dataclasses.dataclass(frozen=True)
class FormatInfo:
    """What a format can represent (all values exact)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    min_normal: float
    min_subnormal: float
    has_inf: bool
    dtype: np.dtype

    def to_dict(self) -> dict[str, object]:
        """The facts as plain, JSON-serialisable data (``dtype`` as its numpy name)."""
        return plain({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    def _repr_html_(self) -> str:
        return html_table(
            f"FormatInfo {self.name}", [(k, str(v)) for k, v in self.to_dict().items()]
        )


def _check_format(dtype: object, fmt: object = None) -> str:
    """The format of ``dtype=`` (or its older name ``fmt=``), however the user wrote it:
    a name of ``FORMATS``, an alias (``"bfloat16"``), a numpy / ml_dtypes / torch dtype."""
    return format_name(format_arg(dtype, fmt), "dtype")


def _check_bias(exponent_bias: object) -> int | None:
    """An integer the core can take (the core checks the range, 0..=127, and the format)."""
    if exponent_bias is None:
        return None
    return _validate.integer(exponent_bias, "exponent_bias", lo=-(2**63), hi=2**63 - 1)


def format_info(
    dtype: object = None, *, exponent_bias: int | None = None, fmt: object = None
) -> FormatInfo:
    """The facts of format ``dtype`` (optionally with a non-standard fp8 ``exponent_bias``).
    ``dtype`` is a format however written (``"bf16"``, ``"bfloat16"``, ``ml_dtypes.bfloat16``;
    contract section 1); ``fmt=`` is its older name."""
    fmt = _check_format(dtype, fmt)
    i = _core.format_info(fmt, _check_bias(exponent_bias))
    fields = {
        f.name: getattr(i, f.name) for f in dataclasses.fields(FormatInfo) if f.name != "dtype"
    }
    return FormatInfo(dtype=FORMAT_DTYPES[fmt], **fields)


def _env_seed() -> int:
    raw = os.environ.get(SEED_ENV)
    if raw is None or raw.strip() == "":
        return 0
    try:
        seed = int(raw.strip(), 0)
    except ValueError:
        raise Trn2ValueError(
            f"{SEED_ENV}: {raw!r} is not an integer seed (decimal or 0x-prefixed hex)"
        ) from None
    return _check_seed(seed, SEED_ENV)


def _check_seed(seed: object, arg: str = "seed") -> int:
    if isinstance(seed, str) and seed == "random":
        return fresh_seed()
    return _validate.integer(seed, arg, lo=0, hi=_validate.U64_MAX)


def fresh_seed() -> int:
    """A stochastic-rounding seed from the operating system's entropy (``seed="random"``):
    different on every call, unlike the Neuron runtime's default seed 0, which repeats the
    same random bits on every call."""
    return secrets.randbits(64)


def _random_args(rounding, seed, random_bits, random_bit_count, shape):
    """Validates the stochastic-rounding arguments; returns ``(bits or None, count, seed)``."""
    rounding = _validate.name(rounding, "rounding", ROUNDING_MODES, what="rounding mode")
    if random_bit_count is not None:
        # The core checks 1..=32; here only what a u32 can carry across.
        random_bit_count = _validate.integer(
            random_bit_count, "random_bit_count", lo=0, hi=2**32 - 1
        )
    if seed is not None:
        # Checked in every mode: a bad seed is a bug in the caller even where it is unused.
        seed = _check_seed(seed)
    if random_bits is None:
        if rounding != "stochastic":
            return None, 32, None
        seed = _env_seed() if seed is None else _check_seed(seed)
        return None, 32 if random_bit_count is None else random_bit_count, seed
    if rounding != "stochastic":
        raise Trn2ValueError(
            f"random_bits: only used with rounding='stochastic', not rounding={rounding!r}"
        )
    if seed is not None:
        raise Trn2ValueError("random_bits: give either random_bits or seed, not both")
    if random_bit_count is None:
        raise Trn2ValueError("random_bit_count: required with random_bits (1..=32)")
    try:
        rb = np.asarray(random_bits)
    except (ValueError, TypeError) as e:
        raise ShapeError(
            f"random_bits: cannot be read as an array of random words ({e}): "
            f"{_validate._show(random_bits)}"
        ) from None
    if rb.dtype.kind not in "iu":
        raise Trn2ValueError(f"random_bits: expected unsigned integers, got dtype {rb.dtype}")
    if rb.size:
        # What uint32 words can carry; the core checks each against 2**random_bit_count.
        lo, hi = int(rb.min()), int(rb.max())
        if lo < 0:
            raise Trn2ValueError(f"random_bits: contains {lo}; random bits must be >= 0")
        if hi >= 2 ** min(random_bit_count, 32):
            raise Trn2ValueError(
                f"random_bits: contains {hi}, not below 2**random_bit_count = {2**random_bit_count}"
            )
    try:
        rb = np.broadcast_to(rb, shape)
    except ValueError:
        raise ShapeError(
            f"random_bits: shape {rb.shape} does not broadcast to the input's shape {shape}"
        ) from None
    words = _validate.contiguous(rb, "random_bits", dtype=np.uint32).reshape(-1)
    return words, random_bit_count, None


def encode(
    x,
    dtype: object = None,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int | str | None = None,
    random_bits=None,
    random_bit_count: int | None = None,
    exponent_bias: int | None = None,
    fmt: object = None,
) -> np.ndarray:
    """Rounds ``x`` once to format ``dtype`` and returns the raw codes.

    Codes are uint8 for fp8, uint16 for bf16/fp16 and uint32 (the float32 container) for
    tf32/fp32. See ``quantize`` for the rounding semantics and the ways to name a format.
    """
    fmt = _check_format(dtype, fmt)
    bias = _check_bias(exponent_bias)
    saturate = _validate.boolean(saturate, "saturate")
    flat, source, shape = source_view(x, out_itemsize=CODE_DTYPES[fmt].itemsize)
    bits, count, seed = _random_args(rounding, seed, random_bits, random_bit_count, shape)
    codes = _core.encode(flat, source, fmt, rounding, saturate, bits, count, seed, bias)
    return codes.reshape(shape)


def quantize(
    x,
    dtype: object = None,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    seed: int | str | None = None,
    random_bits=None,
    random_bit_count: int | None = None,
    fmt: object = None,
) -> np.ndarray:
    """Rounds ``x`` once to format ``dtype``; returns an array of the format's numpy dtype.

    ``dtype`` is a name of ``FORMATS`` (``"bf16"``), the name numpy, JAX or PyTorch uses
    (``"bfloat16"``, ``"float8_e4m3fn"``, ``"torch.float16"``), or a numpy / ml_dtypes / torch
    dtype (``ml_dtypes.float8_e5m2``); ``fmt=`` is its older name (contract section 1). Neuron's
    ``fp8_e4m3`` (max 240) is ``ml_dtypes.float8_e4m3``, not OCP's ``float8_e4m3fn`` (max 448).

    The exact input value (float64 included, never pre-rounded to float32) is rounded once under
    ``rounding``; subnormals and the sign of zero are kept and NaN stays NaN. Overflow follows the
    IEEE rules of the mode, or goes to +-max with ``saturate=True``. ``rounding="stochastic"``
    rounds the magnitude up iff ``frac + r / 2**n >= 1`` with ``r`` the element's random bits:
    ``random_bits``/``random_bit_count`` if given, else 32-bit words of the counter-based
    generator keyed by ``seed`` (default ``$NEURON_RT_STOCHASTIC_ROUNDING_SEED``, else 0).

    Unseeded, stochastic rounding draws the same bits on every call, as the Neuron runtime does
    with its default seed 0: rounding the same array twice gives the same result, and repeated
    accumulation can drift. Pass a different ``seed`` per call, or ``seed="random"`` for a fresh
    one from the operating system each call.
    """
    fmt = _check_format(dtype, fmt)
    codes = encode(
        x,
        fmt,
        rounding=rounding,
        saturate=saturate,
        seed=seed,
        random_bits=random_bits,
        random_bit_count=random_bit_count,
    )
    return codes.view(FORMAT_DTYPES[fmt])


def decode(
    codes, dtype: object = None, *, exponent_bias: int | None = None, fmt: object = None
) -> np.ndarray:
    """Exact float32 values of raw ``codes`` of format ``dtype`` (unsigned ints of the format's
    width, or an array of the format's own dtype); ``fmt=`` is the older name of ``dtype``."""
    fmt = _check_format(dtype, fmt)
    bias = _check_bias(exponent_bias)
    c = _validate.array(codes, "codes")
    want = CODE_DTYPES[fmt]
    if c.dtype.newbyteorder("=") == FORMAT_DTYPES[fmt]:
        c = _validate.contiguous(c, "codes", extra=4 * int(c.size)).view(want)
    elif c.dtype.kind != "u" or c.dtype.itemsize != want.itemsize:
        raise FormatError(
            f"codes: {fmt} codes must be {want} (or {FORMAT_DTYPES[fmt]}), got {c.dtype}"
        )
    else:
        c = _validate.contiguous(c, "codes", dtype=want, extra=4 * int(c.size))
    shape = c.shape
    out = _core.decode(c.reshape(-1), fmt, bias)
    return out.reshape(shape)


def stochastic_bits(shape, seed: int = 0) -> np.ndarray:
    """The uint32 random words seeded stochastic rounding uses for an array of ``shape``: word
    ``k`` belongs to flat C-order index ``k`` and depends only on ``(seed, k)``.

    The words are SplitMix64's 64-bit output stream, started from the state
    ``mix64(seed ^ 0x6A09E667F3BCC909)``, read as little-endian uint32: output ``j`` gives
    words ``2j`` (its low half) and ``2j + 1`` (its high half). See docs/numerics.md."""
    seed = _check_seed(seed)
    shape = _validate.shape(shape, "shape", itemsize=4)
    n = 1
    for s in shape:
        n *= s
    _validate.check_alloc(4 * n, "shape", f"the {n} random words of shape {shape}")
    return _core.stochastic_bits(n, seed).reshape(shape)
