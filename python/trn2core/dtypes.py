"""Mapping between trn2core's format names and the numpy / ml_dtypes dtypes users hold."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import _validate
from ._names import FORMATS
from .errors import FormatError

#: numpy dtype of ``quantize``'s output for each format (contract section 1).
FORMAT_DTYPES: dict[str, np.dtype] = {
    "fp32": np.dtype(np.float32),
    "tf32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "fp8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "fp8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "fp8_e3m4": np.dtype(ml_dtypes.float8_e3m4),
    "fp8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
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
