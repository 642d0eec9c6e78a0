"""NKI's data types as numpy / ml_dtypes dtypes, their machine names, and NKI's type promotion.

``nl.float32`` is ``numpy.float32``'s dtype, ``nl.bfloat16`` ml_dtypes' (as the legacy
``neuronxcc.nki.language`` defines them), so kernels may mix NKI and numpy dtypes freely.
``nl.tfloat32`` is a 4-byte void dtype (as in the legacy module): values are held in float32
containers and the engines read them as tf32.

Promotion follows "NKI Type Promotion" of the NKI API docs (Neuron 2.26,
``general/nki/api/nki.api.shared.rst``): (float, int) -> the float; (float, float) -> the wider,
or a widened type (fp16 with bf16 -> fp32, two different fp8 -> bf16); (int, int) -> the wider
or a widened integer (int32 with uint32 -> fp32); weakly typed Python scalars count as int32,
float32 or uint8 (bool).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import MACHINE_NP_DTYPES
from ..errors import FormatError

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e3m4 = np.dtype(ml_dtypes.float8_e3m4)
tfloat32 = np.dtype("V4")
# Named by NKI but held by no Trainium2 engine or memory: OCP fp8 E4M3 (NeuronCore-v4's fp8;
# values convert) and the microscaling (MX) types of NeuronCore-v4, four elements packed in
# 32 bits. They exist so that kernels naming them import; a tensor of one is a FormatError.
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
float8_e5m2_x4 = np.dtype([("float8_e5m2_x4", "V4")])
float8_e4m3fn_x4 = np.dtype([("float8_e4m3fn_x4", "V4")])
float4_e2m1fn_x4 = np.dtype([("float4_e2m1fn_x4", "V4")])
#: NKI dtype names with no Trainium2 storage -> why.
NOT_ON_TRN2: dict[np.dtype, str] = {
    float8_e4m3fn: "float8_e4m3fn (OCP E4M3) is not a Trainium2 dtype (Trainium2's fp8 formats "
    "are float8_e4m3 and float8_e5m2; NeuronCore-v4 has float8_e4m3fn)",
    float8_e8m0fnu: "float8_e8m0fnu (an MX scale type) is not a Trainium2 dtype (NeuronCore-v4)",
    float8_e5m2_x4: "float8_e5m2_x4 (MX, 4 packed) is not a Trainium2 dtype (NeuronCore-v4)",
    float8_e4m3fn_x4: "float8_e4m3fn_x4 (MX, 4 packed) is not a Trainium2 dtype (NeuronCore-v4)",
    float4_e2m1fn_x4: "float4_e2m1fn_x4 (MX, 4 packed) is not a Trainium2 dtype (NeuronCore-v4)",
}

#: numpy dtype -> the machine's dtype name (from the core's table of element types; NKI's
#: tfloat32 is its own 4-byte dtype, and bool_ is held as uint8).
MACHINE_NAME: dict[np.dtype, str] = {
    dt: name for name, dt in MACHINE_NP_DTYPES.items() if name != "tf32"
}
MACHINE_NAME[tfloat32] = "tf32"
MACHINE_NAME[bool_] = "uint8"

#: The machine's dtype name -> the NKI dtype of a tensor of it.
NKI_DTYPE: dict[str, np.dtype] = {v: k for k, v in MACHINE_NAME.items() if k != bool_}

#: numpy dtype of host arrays holding a machine dtype (tf32 in float32 containers).
HOST_DTYPE: dict[str, np.dtype] = dict(MACHINE_NP_DTYPES)

_FLOAT_RANK = {
    float8_e4m3: 1,
    float8_e5m2: 1,
    float8_e3m4: 1,
    float16: 2,
    bfloat16: 2,
    tfloat32: 3,
    float32: 4,
}

_NAMES = ", ".join(
    (
        "bool_",
        "int8",
        "int16",
        "int32",
        "uint8",
        "uint16",
        "uint32",
        "float16",
        "float32",
        "bfloat16",
        "tfloat32",
        "float8_e4m3",
        "float8_e5m2",
    )
)


def as_dtype(dtype: object, arg: str = "dtype") -> np.dtype:
    """An NKI dtype from ``nl.*``, a numpy / ml_dtypes dtype or type, or a name."""
    if isinstance(dtype, np.dtype) and dtype in MACHINE_NAME:
        return dtype
    if isinstance(dtype, np.dtype) and dtype in NOT_ON_TRN2:
        raise FormatError(f"{arg}: {NOT_ON_TRN2[dtype]}")
    if isinstance(dtype, str) and dtype in NKI_DTYPE:
        return NKI_DTYPE[dtype]
    if isinstance(dtype, str) and dtype in ("tfloat32", "tf32"):
        return tfloat32
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        raise FormatError(f"{arg}: {dtype!r} is not a dtype; NKI dtypes are nl.{_NAMES}") from None
    if dt in MACHINE_NAME:
        return dt
    if dt in NOT_ON_TRN2:
        raise FormatError(f"{arg}: {NOT_ON_TRN2[dt]}")
    raise FormatError(f"{arg}: {dt} is not an NKI dtype; expected one of nl.{_NAMES}")


def machine_name(dtype: np.dtype) -> str:
    """The machine's name of an NKI dtype."""
    return MACHINE_NAME[dtype]


def is_float(dtype: np.dtype) -> bool:
    """Whether an NKI dtype is a floating-point type."""
    return dtype in _FLOAT_RANK


def weak_dtype(value: object) -> np.dtype:
    """The dtype of a scalar operand: its own for numpy scalars, else NKI's weak types."""
    if isinstance(value, np.generic):
        return as_dtype(value.dtype)
    if isinstance(value, bool):
        return uint8
    if isinstance(value, (int, np.integer)):
        return int32
    return float32


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """NKI's promoted dtype of an arithmetic operation on ``a`` and ``b`` (module doc)."""
    a = uint8 if a == bool_ else a
    b = uint8 if b == bool_ else b
    if a == b:
        return a
    fa, fb = a in _FLOAT_RANK, b in _FLOAT_RANK
    if fa != fb:
        return a if fa else b
    if fa:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra != rb:
            return a if ra > rb else b
        # Same width, different formats: fp16 with bf16 widens to fp32, two fp8 to bf16.
        return float32 if ra == 2 else bfloat16
    p = np.promote_types(a, b)
    return float32 if p.itemsize > 4 else p
