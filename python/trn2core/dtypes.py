"""Mapping between trn2core's format names and the numpy / ml_dtypes dtypes users hold."""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16, float8_* with numpy)
import numpy as np

from . import _validate
from ._names import ELEMENT_TYPES, FORMAT_ALIASES, FORMATS
from .errors import FormatError, Trn2ValueError

#: numpy dtype of ``quantize``'s output for each format (contract section 1), from the core's
#: one table of element types (``ml_dtypes`` registers the names of its dtypes with numpy).
FORMAT_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(numpy) for name, numpy, _, _, is_format, _ in ELEMENT_TYPES if is_format
}
#: numpy dtype holding each element type of the machine's memories (tf32 in float32).
MACHINE_NP_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(numpy) for name, numpy, _, _, _, on_chip in ELEMENT_TYPES if on_chip
}

assert tuple(FORMAT_DTYPES) == FORMATS, "FORMAT_DTYPES must follow the core's format list"

#: unsigned dtype of ``encode``'s raw codes for each format.
CODE_DTYPES: dict[str, np.dtype] = {
    name: np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize])
    for name, dt in FORMAT_DTYPES.items()
}

#: The format whose values an array of this dtype holds (float32 means fp32; tf32 is declared).
_FORMAT_OF_DTYPE: dict[np.dtype, str] = {
    dt: name for name, dt in FORMAT_DTYPES.items() if name != "tf32"
}


def format_of_dtype(np_dtype: np.dtype, arg: str, *, advice: str = "") -> str:
    """The trn2core format an array of ``np_dtype`` holds (``float32`` -> ``"fp32"``,
    ``ml_dtypes.bfloat16`` -> ``"bf16"``, ...), or ``FormatError`` on ``arg``."""
    name = _FORMAT_OF_DTYPE.get(np.dtype(np_dtype).newbyteorder("="))
    if name is None:
        raise FormatError(
            f"{arg}: dtype {np_dtype} is not a Trainium2 number format (float32, bfloat16, "
            f"float16, float8_e4m3, float8_e5m2, float8_e3m4, float8_e4m3fn)"
            + (f"; {advice}" if advice else "")
        )
    return name


#: Said wherever Neuron's fp8_e4m3 and OCP's E4M3 may be confused (docs/numerics.md).
E4M3_NOTE = (
    "fp8_e4m3 is Neuron's IEEE-style E4M3 (max 240; ml_dtypes.float8_e4m3), fp8_e4m3fn is OCP "
    "E4M3 (max 448; ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn), and the fnuz formats "
    "(ml_dtypes.float8_e4m3fnuz, float8_e5m2fnuz: bias 8/16, NaN at 0x80) are not Trainium2's"
)


def _torch_name(value: object) -> str | None:
    """``str(value)`` ("torch.bfloat16") if ``value`` is a ``torch.dtype``, without importing
    torch (it is not a dependency)."""
    t = type(value)
    if t.__module__ == "torch" and t.__name__ == "dtype":
        return str(value)
    return None


def format_name(value: object, arg: str = "dtype", *, allowed: tuple[str, ...] = FORMATS) -> str:
    """The trn2core format a user named, however they wrote it (contract section 1).

    Accepted: a name of ``FORMATS`` (``"bf16"``), an alias from the core (``"bfloat16"``,
    ``"float8_e4m3fn"``, ``"torch.bfloat16"``: ``trn2core.dtypes.FORMAT_ALIASES``), a numpy or
    ml_dtypes dtype or scalar type (``np.float16``, ``np.dtype("float32")``,
    ``ml_dtypes.float8_e5m2``) and a ``torch.dtype`` if torch is installed. Formats map by bit
    semantics: ``float8_e4m3`` (max 240) is ``fp8_e4m3``, ``float8_e4m3fn`` (max 448) is
    ``fp8_e4m3fn``. ``FormatError`` naming ``arg`` otherwise, or when the format is not in
    ``allowed``.
    """
    name = _torch_name(value)
    text = value if isinstance(value, str) else name
    if text is not None:
        fmt = text if text in FORMATS else FORMAT_ALIASES.get(text)
        if fmt is None:
            note = f"; {E4M3_NOTE}" if "e4m3" in text or "fnuz" in text else ""
            raise FormatError(
                f"{arg}: unknown format {text!r}; expected one of {FORMATS} or their other "
                f"names {tuple(FORMAT_ALIASES)} (or a numpy / ml_dtypes dtype){note}"
            )
    elif value is None or isinstance(value, (bool, int, float)):
        # np.dtype(None) is float64: a missing format is not a request for float64.
        raise FormatError(
            f"{arg}: expected a format (a name such as 'bf16' or a numpy / ml_dtypes dtype), "
            f"got {_validate._show(value)}"
        )
    else:
        try:
            dt = np.dtype(value)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise FormatError(
                f"{arg}: {_validate._show(value)} is neither a format name nor a dtype; "
                f"expected one of {FORMATS}, their other names or a numpy / ml_dtypes dtype"
            ) from None
        fmt = _FORMAT_OF_DTYPE.get(dt.newbyteorder("="))
        if fmt is None:
            note = f"; {E4M3_NOTE}" if "e4m3" in dt.name or "fnuz" in dt.name else ""
            raise FormatError(
                f"{arg}: dtype {dt} is not a Trainium2 number format (float32, bfloat16, "
                f"float16, float8_e4m3, float8_e5m2, float8_e3m4, float8_e4m3fn){note}"
            )
    if fmt not in allowed:
        raise FormatError(f"{arg}: format {fmt} is not accepted here; expected one of {allowed}")
    return fmt


def format_arg(dtype: object, fmt: object, *, required: bool = True) -> object:
    """The format argument of a function that takes ``dtype=`` and the older ``fmt=`` (an
    alias): whichever was given; ``Trn2ValueError`` if both were, ``FormatError`` if neither
    was (or ``None``) and it is ``required``."""
    if dtype is not None and fmt is not None:
        raise Trn2ValueError(
            "dtype: given twice, as dtype= and as fmt= (fmt is the older name of dtype); "
            "pass only dtype"
        )
    if dtype is None and fmt is None and required:
        raise FormatError("dtype: missing; pass the number format, e.g. dtype='bf16'")
    return fmt if dtype is None else dtype


#: The unsigned dtype of each element width: a view of any array as codes, bits unchanged.
UNSIGNED_OF_SIZE: dict[int, np.dtype] = {
    n: np.dtype(t) for n, t in ((1, np.uint8), (2, np.uint16), (4, np.uint32), (8, np.uint64))
}

_FP8_BY_DTYPE = {FORMAT_DTYPES[n]: n for n in ("fp8_e4m3", "fp8_e5m2", "fp8_e3m4", "fp8_e4m3fn")}
_BF16 = FORMAT_DTYPES["bf16"]


def source_view(
    x: object, arg: str = "x", *, out_itemsize: int = 0
) -> tuple[np.ndarray, str, tuple[int, ...]]:
    """Turns any real-valued array into ``(flat C-contiguous native array, source, shape)``.

    ``source`` tells the core how to read the buffer: ``"f64"``, ``"f32"``, ``"f16"``, ``"bf16"``
    or an fp8 format name (the last three as unsigned-integer views). Contiguous native arrays are
    not copied; strided, broadcast or byte-swapped ones (and integers, read as float64) are copied
    once, after the host check of the copy plus the caller's result (``out_itemsize`` bytes per
    element). The caller's array is never written.
    """
    a = _validate.array(x, arg)
    dt = a.dtype
    if dt.kind in "iu":
        # Integers are exact in float64 up to 2**53; beyond that they are rounded to float64 first.
        dt = np.dtype(np.float64)
    elif dt == _BF16 or dt in _FP8_BY_DTYPE:
        pass
    elif dt.kind != "f" or dt.itemsize > 8:
        raise FormatError(
            f"{arg}: dtype {dt} is not a supported real number type; expected float64, float32, "
            "float16, an integer type, or an ml_dtypes bfloat16/float8 dtype"
        )
    shape = a.shape
    flat = _validate.contiguous(a, arg, dtype=dt, extra=int(a.size) * out_itemsize).reshape(-1)
    dt = flat.dtype
    if dt == np.float64:
        return flat, "f64", shape
    if dt == np.float32:
        return flat, "f32", shape
    if dt == np.float16:
        return flat.view(np.uint16), "f16", shape
    if dt == _BF16:
        return flat.view(np.uint16), "bf16", shape
    return flat.view(np.uint8), _FP8_BY_DTYPE[dt], shape
