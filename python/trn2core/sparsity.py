"""Structured N:M sparsity (contract section 3): ``prune``, ``compress`` -> ``SparseTensor``.

The work happens in Rust (``rust/trn2core/src/sparsity``) on the raw codes of the array, so every
bit of a stored element survives (``-0.0``, NaN payloads, subnormals). The layout of the values
and the packed position metadata is documented in docs/sparsity.md with a worked example.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import _core, _names, _validate
from .dtypes import UNSIGNED_OF_SIZE as _UINT
from .errors import FormatError, ShapeError, SparsityError, Trn2ValueError
from .report import Facts

__all__ = ["SPARSITY_PATTERNS", "SparseTensor", "prune", "compress"]

#: The N:M patterns of the tensor engine's sparse stationary operand ([S1][S4]; docs/sources.md).
SPARSITY_PATTERNS: tuple[str, ...] = _names.SPARSITY_PATTERNS

# Dtypes whose magnitude order `prune` knows: the core's list of names (numpy's and
# ml_dtypes' own), turned into numpy dtypes.
_PRUNE_DTYPES = {np.dtype(getattr(ml_dtypes, n, None) or n): n for n in _names.SPARSITY_DTYPES}


def _pattern(pattern: object, arg: str = "pattern") -> str:
    if not isinstance(pattern, str) or pattern.strip() not in SPARSITY_PATTERNS:
        raise Trn2ValueError(
            f"{arg}: unknown sparsity pattern {pattern!r}; expected one of {SPARSITY_PATTERNS}"
        )
    return pattern.strip()


def _axis(axis: object) -> int:
    return _validate.integer(axis, "axis", lo=-(2**63), hi=2**63 - 1, cls=ShapeError)


def _codes(x: object, arg: str, *, magnitudes: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(array, flat native unsigned view of its codes)``; the user's array is never written."""
    if isinstance(x, SparseTensor):
        raise FormatError(f"{arg}: already a SparseTensor (call .decompress() for the dense form)")
    a = _validate.array(x, arg)
    dt = a.dtype
    if magnitudes and dt.newbyteorder("=") not in _PRUNE_DTYPES:
        raise FormatError(
            f"{arg}: dtype {dt} has no magnitude order here; expected a float (float64, float32, "
            "float16, bfloat16, float8_*), integer or bool array"
        )
    if dt.kind not in "fiubV" or dt.itemsize not in _UINT or dt.fields is not None:
        raise FormatError(
            f"{arg}: dtype {dt} is not a real number type of 1, 2, 4 or 8 bytes "
            "(complex, object, string and structured arrays are refused)"
        )
    # One copy at most (strided, broadcast or byte-swapped input), after the host check of it
    # and of the result (the same size again).
    a = _validate.contiguous(a, arg, extra=int(a.nbytes))
    return a, a.reshape(-1).view(_UINT[a.dtype.itemsize])


def prune(x, pattern: str, *, axis: int = -1) -> np.ndarray:
    """Keeps the N largest magnitudes of every group of M consecutive elements along ``axis``
    and zeroes the rest (to ``+0``); ties keep the lower index, NaN counts as the largest.

    Any float dtype (bfloat16 and the float8 dtypes included), integers and bool. The result has
    the input's shape and (native byte order) dtype. An axis length that is not a multiple of M
    raises ``ShapeError``.
    """
    p = _pattern(pattern)
    ax = _axis(axis)
    a, codes = _codes(x, "x", magnitudes=True)
    name = _PRUNE_DTYPES[a.dtype]
    out = _core.sparsity_prune(codes, name, list(a.shape), ax, p)
    return out.view(a.dtype).reshape(a.shape)


def compress(x, pattern: str, *, axis: int = -1) -> SparseTensor:
    """The compressed form of an array that conforms to ``pattern`` along ``axis``: at most N
    elements whose bits are not all zero in every group of M (``-0.0`` and NaN count as stored).
    Otherwise ``SparsityError`` names the first offending group (its index in the array)."""
    p = _pattern(pattern)
    ax = _axis(axis)
    a, codes = _codes(x, "x", magnitudes=False)
    values, indices, vshape, norm_axis = _core.sparsity_compress(codes, list(a.shape), ax, p)
    return SparseTensor._make(
        values.view(a.dtype).reshape(vshape), indices, p, norm_axis, a.shape, a.dtype
    )


class SparseTensor(Facts):
    """An N:M-sparse array in compressed form (build it with ``trn2core.compress``).

    ``values``: the stored elements, the dense shape with the axis shortened to ``len / M * N``;
    ``indices``: the packed position metadata, a flat ``uint8`` bit stream of ``ceil(log2 M)``
    bits per value (docs/sparsity.md); ``positions``: the same positions unpacked, one ``uint8``
    each, shaped like ``values``; ``pattern``, ``axis`` (non-negative), ``shape``, ``dtype``;
    ``nbytes`` = values bytes + packed index bytes; ``decompress()`` gives the input bit for bit.
    """

    __slots__ = ("_values", "_indices", "pattern", "axis", "shape", "dtype")
    FACTS = ("pattern", "axis", "shape", "dtype", "nbytes", "density", "values", "indices")

    def __init__(self) -> None:
        raise TypeError("build a SparseTensor with trn2core.compress(x, pattern, axis=...)")

    @classmethod
    def _make(cls, values, indices, pattern, axis, shape, dtype) -> SparseTensor:
        self = object.__new__(cls)
        values.flags.writeable = False
        indices.flags.writeable = False
        self._values = values
        self._indices = indices
        self.pattern: str = pattern
        self.axis: int = int(axis)
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.dtype: np.dtype = np.dtype(dtype)
        return self

    @property
    def values(self) -> np.ndarray:
        """The stored elements (read-only)."""
        return self._values

    @property
    def indices(self) -> np.ndarray:
        """The packed positions, ``ceil(log2 M)`` bits each, LSB-first (read-only ``uint8``)."""
        return self._indices

    @property
    def positions(self) -> np.ndarray:
        """Each value's position within its group of M, one ``uint8`` each, shaped like
        ``values``."""
        flat = _core.sparsity_positions(self._indices, self.pattern, self._values.size)
        return flat.reshape(self._values.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes held: values plus packed position metadata."""
        return int(self._values.nbytes + self._indices.nbytes)

    @property
    def density(self) -> float:
        """Stored slots over dense elements: N / M."""
        n, m = (int(v) for v in self.pattern.split(":"))
        return n / m

    def decompress(self) -> np.ndarray:
        """The dense array, bit for bit the one that was compressed."""
        codes = self._values.reshape(-1).view(_UINT[self.dtype.itemsize])
        dense = _core.sparsity_decompress(
            codes, self._indices, list(self.shape), self.axis, self.pattern
        )
        return dense.view(self.dtype).reshape(self.shape)

    def to_cutlass(self) -> tuple[np.ndarray, np.ndarray]:
        """``(packed, meta)`` as PyTorch's ``to_sparse_semi_structured`` (CUTLASS backend) holds
        a 2-D matrix sparse along its rows: 2:4 for 8- and 16-bit elements (``meta`` int32 for
        8-bit, int16 for 16-bit), 1:2 for 32-bit elements (int16). ``packed`` is ``[rows, cols /
        2]``; ``meta`` is reordered for the sparse tensor core (docs/sparsity.md)."""
        want = "1:2" if self.dtype.itemsize == 4 else "2:4"
        if self.ndim != 2 or self.axis != 1 or self.pattern != want:
            raise SparsityError(
                f"to_cutlass: the CUTLASS layout holds a 2-D matrix {want}-sparse along axis 1 "
                f"for {self.dtype.itemsize}-byte elements; this tensor is {self.pattern} along "
                f"axis {self.axis} of shape {self.shape}"
            )
        rows, cols = self.shape
        codes = self.decompress().reshape(-1).view(_UINT[self.dtype.itemsize])
        values, meta = _core.sparsity_to_cutlass(codes, rows, cols)
        return values.view(self.dtype).reshape(rows, cols // 2), meta.reshape(rows, -1)

    @classmethod
    def from_cutlass(cls, values, meta) -> SparseTensor:
        """The inverse of ``to_cutlass``: ``values`` ``[rows, cols / 2]`` (any 1-, 2- or 4-byte
        dtype) and ``meta`` (int16 or int32 words, PyTorch's reordered layout). Codes that do not
        name valid positions raise ``Trn2ValueError``."""
        v, codes = _codes(values, "values", magnitudes=False)
        if v.ndim != 2:
            raise ShapeError(f"values: expected a 2-D [rows, cols / 2] matrix, got {v.shape}")
        mt = _validate.array(meta, "meta")
        native = mt.dtype.newbyteorder("=")  # either byte order: the words' values count
        if native not in (np.dtype(np.int16), np.dtype(np.int32)):
            raise FormatError(f"meta: expected int16 or int32 words, got dtype {mt.dtype}")
        mt = _validate.contiguous(mt, "meta", dtype=native).reshape(-1)
        rows, cols = v.shape[0], v.shape[1] * 2
        dense = _core.sparsity_from_cutlass(codes, mt, rows, cols)
        pattern = "1:2" if v.dtype.itemsize == 4 else "2:4"
        return compress(dense.view(v.dtype).reshape(rows, cols), pattern, axis=1)

    def __repr__(self) -> str:
        return (
            f"SparseTensor(pattern={self.pattern!r}, axis={self.axis}, shape={self.shape}, "
            f"dtype={self.dtype}, nbytes={self.nbytes})"
        )
