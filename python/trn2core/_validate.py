"""Argument checks shared by every public function (docs/limitations.md, "How to make a new
function robust").

Each check either returns the normalised value or raises a ``Trn2Error`` subclass whose message
names the argument, the value seen and the limit, *before* anything is allocated or computed.
The classes follow one rule:

- ``ShapeError``: shapes, dimensions, axes, sizes, ragged nested lists;
- ``FormatError``: dtypes, number formats, codecs and other names of formats or modes;
- ``Trn2ValueError``: every other bad scalar (wrong type or out of range): flags, seeds,
  counts, indices, patterns, memory names, paths;
- ``CapacityError``: a result the host cannot hold (``check_alloc``).

Wrong Python *types* get the same classes (never a bare ``TypeError``), so ``except
trn2core.Trn2Error`` catches every bad input; all of them are also ``ValueError`` (or
``MemoryError`` for ``CapacityError``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import _core
from .errors import CapacityError, FormatError, ShapeError, Trn2Error, Trn2ValueError

__all__ = [
    "human_bytes",
    "name",
    "integer",
    "boolean",
    "text",
    "number",
    "array",
    "shape",
    "pair",
    "bytes_like",
    "path",
    "check_alloc",
    "contiguous",
    "Exclusive",
]

#: Largest dimension or count accepted anywhere (u64 in the core).
U64_MAX = 2**64 - 1
#: The range of a signed 64-bit offset or stride in the core.
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def human_bytes(n: int, *, exact: bool = True) -> str:
    """A byte count for people, in binary units: ``"3145728 B (3 MiB)"`` (``exact``, for error
    messages: the exact count first) or ``"3 MiB"``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            short = f"{n / size:.2f}".rstrip("0").rstrip(".") + f" {unit}"
            return f"{n} B ({short})" if exact else short
    return f"{n} B"


def _show(value: Any, limit: int = 60) -> str:
    """``repr`` of a value, shortened for messages (a huge array must not flood them)."""
    try:
        r = repr(value)
    except Exception:  # a user object whose __repr__ fails
        r = f"<{type(value).__name__} object>"
    r = " ".join(r.split())  # an array's repr spans lines
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _bound(v: int | None, none: str) -> str:
    """A range bound for messages: powers of two near 2**63 and 2**64 as such."""
    named = {
        2**64 - 1: "2**64 - 1",
        2**63 - 1: "2**63 - 1",
        -(2**63): "-2**63",
        2**62 - 1: "2**62 - 1",
    }
    return none if v is None else named.get(v, str(v))


def name(
    value: object,
    arg: str,
    choices: Iterable[str],
    *,
    cls: type[Trn2Error] = FormatError,
    what: str = "name",
) -> str:
    """``value`` if it is one of ``choices`` (exactly, a ``str``), else ``cls``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise cls(f"{arg}: unknown {what} {_show(value)}; expected one of {choices}")
    return value


def integer(
    value: object,
    arg: str,
    *,
    lo: int | None = None,
    hi: int | None = None,
    cls: type[Trn2Error] = Trn2ValueError,
) -> int:
    """``value`` as an ``int`` if it is a Python or numpy integer (not ``bool``, not a float,
    even an integral one) with ``lo <= value <= hi``; else ``cls``."""
    rng = f"{_bound(lo, '-inf')}..={_bound(hi, 'inf')}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise cls(f"{arg}: expected an integer in {rng}, got {_show(value)}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise cls(f"{arg}: got {v}; it must be in {rng}")
    return v


def boolean(value: object, arg: str) -> bool:
    """``value`` if it is a ``bool`` (or ``numpy.bool_``), else ``Trn2ValueError``: a string
    like ``"no"`` must not silently mean ``True``."""
    if not isinstance(value, (bool, np.bool_)):
        raise Trn2ValueError(f"{arg}: expected True or False, got {_show(value)}")
    return bool(value)


def text(value: object, arg: str, *, cls: type[Trn2Error] = Trn2ValueError) -> str:
    """``value`` if it is a ``str`` the core can read (UTF-8: no lone surrogates), else ``cls``
    (never a ``TypeError`` or ``UnicodeEncodeError`` from the binding)."""
    if not isinstance(value, str):
        raise cls(f"{arg}: expected a str, got {_show(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise cls(f"{arg}: {value!r} is not valid text (a lone surrogate)") from None
    return value


def number(value: object, arg: str) -> float:
    """``value`` as a ``float`` if it is a real Python or numpy number (an integer of any size
    or a float, NaN and infinities included; not ``bool``, not a string), else
    ``Trn2ValueError``."""
    ok = isinstance(value, (int, float, np.integer, np.floating))
    if isinstance(value, (bool, np.bool_)) or not ok:
        raise Trn2ValueError(f"{arg}: expected a number, got {_show(value)}")
    try:
        return float(value)
    except OverflowError:
        raise Trn2ValueError(f"{arg}: {value} is beyond the float64 range") from None


def array(x: object, arg: str, *, complex_ok: bool = False) -> np.ndarray:
    """``numpy.asarray(x)``, refusing what is not an array of numbers: ragged nested lists
    (``ShapeError``), and object, string, bytes, complex (unless ``complex_ok``: DMA moves any
    bits), datetime, timedelta and structured dtypes (``FormatError``). Numeric dtypes (bool,
    integers, floats, the ml_dtypes types) pass; each function then checks the dtypes it
    supports."""
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:
        if "inhomogeneous" in str(e) or "sequence" in str(e):
            raise ShapeError(
                f"{arg}: a ragged nested sequence is not an array (its rows differ in length): "
                f"{_show(x)}"
            ) from None
        raise FormatError(f"{arg}: cannot be read as an array ({e}): {_show(x)}") from None
    dt = a.dtype
    # ml_dtypes' types (bfloat16, float8_*) are kind "V" without fields; numpy's own
    # structured and void dtypes have fields or no registered type.
    ml = dt.kind == "V" and dt.fields is None and dt.type is not np.void
    if not (dt.kind in ("biufc" if complex_ok else "biuf") or ml):
        raise FormatError(
            f"{arg}: dtype {dt} is not a real number type (got {type(x).__name__} "
            f"{_show(x)}); expected an array of bool, integers or floats (float64, float32, "
            "float16, bfloat16, float8_*)"
        )
    return a


def shape(value: object, arg: str = "shape", itemsize: int = 1) -> tuple[int, ...]:
    """A shape: an int or a sequence of ints, each ``>= 0``, that numpy can describe for
    elements of ``itemsize`` bytes: the product of the non-zero dimensions times ``itemsize``
    below ``2**63``, even when another dimension is 0 (``ShapeError``)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    dims = tuple(integer(d, arg, lo=0, hi=U64_MAX, cls=ShapeError) for d in items)
    nonzero = 1
    for d in dims:
        nonzero *= max(d, 1)
    if nonzero * itemsize >= 2**63:
        raise ShapeError(
            f"{arg}: {dims} is larger than an array can be: the product of its non-zero "
            f"dimensions times {itemsize} bytes must stay below 2**63"
        )
    return dims


def pair(value: object, arg: str) -> tuple[int, int] | None:
    """``None`` or a pair of non-negative ints (``Trn2ValueError``)."""
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise Trn2ValueError(
            f"{arg}: expected a pair of integers (row, column), got {_show(value)}"
        )
    a, b = (integer(v, arg, lo=0, hi=U64_MAX) for v in value)
    return a, b


def bytes_like(value: object, arg: str) -> bytes:
    """The bytes of ``bytes``, ``bytearray``, ``memoryview`` or a numpy ``uint8`` array;
    anything else (an ``int`` would make ``bytes(n)`` allocate ``n`` zero bytes) is
    ``Trn2ValueError``."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, memoryview):
        try:
            nbytes = value.nbytes
        except ValueError:  # released: its buffer is gone
            raise Trn2ValueError(f"{arg}: a released memoryview (no buffer left to read)") from None
        check_alloc(nbytes, arg, "a copy of the memoryview")
        return bytes(value)
    if isinstance(value, bytearray):
        check_alloc(len(value), arg, "a copy of the bytearray")
        return bytes(value)
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        # A broadcast view may stand for far more bytes than back it.
        check_alloc(value.nbytes, arg, f"a copy of the {value.shape} uint8 array")
        return value.tobytes()
    raise Trn2ValueError(
        f"{arg}: expected bytes (or bytearray, memoryview, a uint8 array), got "
        f"{type(value).__name__} {_show(value)}"
    )


def path(value: object, arg: str = "path") -> str:
    """A file path (``str`` or an ``os.PathLike`` of one) as a ``str``; an ``int`` would be
    taken by ``open`` as a file descriptor (and closed), and a NUL byte is not allowed in a path
    by the operating system (``open`` raises a bare ``ValueError``)."""
    text = None
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        try:
            text = os.fspath(value)
        except TypeError:  # a PathLike whose __fspath__ returns neither str nor bytes
            text = None
    if not isinstance(text, str):
        raise Trn2ValueError(
            f"{arg}: expected a file path (str or os.PathLike), got {_show(value)}"
        )
    if "\0" in text:
        raise Trn2ValueError(f"{arg}: a file path cannot contain a NUL byte, got {_show(text)}")
    return text


def check_alloc(nbytes: int, arg: str, what: str) -> None:
    """``CapacityError`` unless the host can hold ``nbytes`` more (trn2core::host)."""
    if nbytes >= 2**127:
        raise CapacityError(f"{arg}: {what} needs {nbytes} bytes, more than any host holds")
    _core.check_alloc(arg, what, int(nbytes))


def contiguous(
    a: np.ndarray, arg: str, *, dtype: object = None, extra: int = 0, what: str = ""
) -> np.ndarray:
    """``a`` as a C-contiguous array in native byte order (converted to ``dtype`` if given), with
    its shape. Copied only when it must be, and then only after the host check of the copy plus
    ``extra`` bytes the caller allocates next (``CapacityError`` naming ``arg``; nothing is
    allocated): a broadcast view of 2**33 elements has no memory behind it, its copy would."""
    dt = np.dtype(dtype) if dtype is not None else a.dtype
    dt = dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt
    if a.dtype == dt and a.flags.c_contiguous:
        if extra:
            check_alloc(extra, arg, what or f"the result for {arg}")
        return a
    copy = int(a.size) * dt.itemsize
    check_alloc(
        copy + extra,
        arg,
        what or f"a contiguous {dt} copy of {arg} (shape {a.shape}, {human_bytes(copy)})",
    )
    return np.array(a, dtype=dt, order="C", copy=True)


class Exclusive:
    """For an object whose Python-side state two threads must not change at once: ``with
    self._busy:`` around each mutating method makes a second thread's call raise
    ``Trn2ValueError`` ("busy in another thread") instead of racing. (Objects whose state lives
    in Rust, like ``NeuronCore``, serialise their calls behind a mutex instead: see
    docs/limitations.md.) Re-entrant within one thread."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise Trn2ValueError(
                f"{self._what}: busy in another thread; share it between threads only with your "
                "own lock, or give each thread its own"
            )

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
