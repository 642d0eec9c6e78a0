"""DMA and inline compression (contract section 4): ``trn2core.dma``.

``compress``/``decompress``/``Compressed`` wrap the Rust codecs (``rust/trn2core/src/dma``):
lossless for every dtype and bit pattern, in a self-describing stream with a CRC32C checksum.
The timing of a transfer comes from the Rust DMA model (``perf/dma.rs``, docs/dma.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _core, _validate, spec
from ._names import CODECS, DMA_PLACES
from .errors import CorruptDataError, FormatError, ShapeError, Trn2ValueError
from .memory import Allocation, CoreMemory
from .report import Facts, Report

__all__ = ["CODECS", "PLACES", "Compressed", "compress", "decompress", "DmaReport", "dma_copy"]

#: Where a transfer reads or writes: this core's HBM stack, the other die's HBM, SBUF, PSUM.
PLACES: tuple[str, ...] = DMA_PLACES


def _dtype_name(dt: np.dtype) -> str:
    # numpy's own types by their byte-order-explicit code ("<f4", ">i2"); ml_dtypes by name.
    return dt.name if dt.isbuiltin == 2 else dt.str


def _stream_array(b, arg: str) -> np.ndarray:
    """A read-only flat uint8 array over the stream bytes ``b``: ``bytes`` are used in place
    (they are immutable); any other buffer is copied, so later changes to it cannot reach a
    validated ``Compressed``."""
    if isinstance(b, Compressed):
        return b._stream
    # bytes, bytearray, memoryview or a uint8 array (copied: later changes cannot reach a
    # validated stream); anything else is Trn2ValueError.
    a = np.frombuffer(_validate.bytes_like(b, arg), dtype=np.uint8)
    a.flags.writeable = False
    return a


class Compressed(Facts):
    """A compressed array: ``codec``, ``nbytes`` (stream size), ``raw_nbytes``, ``ratio``,
    ``dtype``, ``shape``; ``to_bytes()`` and ``Compressed.from_bytes(b)``.

    The stream is held in a read-only NumPy buffer; ``to_bytes()`` copies it into ``bytes``
    (``to_dict()`` leaves it out)."""

    FACTS = ("codec", "dtype", "shape", "nbytes", "raw_nbytes", "ratio")

    def __init__(self, stream: np.ndarray, info) -> None:
        self._stream = stream
        self.codec: str = info.codec
        self.nbytes: int = int(info.nbytes)
        self.raw_nbytes: int = int(info.raw_nbytes)
        self.dtype, self.shape = _layout_of(info)

    @property
    def ratio(self) -> float:
        """Raw bytes over compressed bytes (above 1 when compression helps)."""
        return self.raw_nbytes / self.nbytes if self.nbytes else 1.0

    def to_bytes(self) -> bytes:
        """The self-describing stream (magic, version, codec, dtype, shape, blocks, CRC32C)."""
        return self._stream.tobytes()

    @classmethod
    def from_bytes(cls, b) -> Compressed:
        """Validates ``b`` (structure and checksum): raises ``CorruptDataError`` if it was
        truncated or altered."""
        stream = _stream_array(b, "b")
        return cls(stream, _core.dma_inspect(stream))

    def __repr__(self) -> str:
        return (
            f"Compressed(codec={self.codec!r}, dtype={self.dtype}, shape={self.shape}, "
            f"nbytes={self.nbytes}, raw_nbytes={self.raw_nbytes}, ratio={self.ratio:.3f})"
        )


def _check_codec(codec) -> str:
    return _validate.name(codec, "codec", CODECS, what="codec")


def _compressible(x, arg: str = "x") -> np.ndarray:
    a = _validate.array(x, arg, complex_ok=True)
    if a.dtype.hasobject or a.dtype.kind not in "biufcV" or a.dtype.itemsize not in (1, 2, 4, 8):
        raise FormatError(
            f"{arg}: dtype {a.dtype} cannot be compressed; expected a numeric dtype of 1, 2, 4 "
            "or 8 bytes per element"
        )
    return a


def compress(x, codec: str = "zvc") -> Compressed:
    """Compresses array ``x`` losslessly with ``codec`` (see ``CODECS``). ``x`` is never
    written; a strided array is copied once. ``CapacityError`` (before any allocation) if the
    copy and the stream would not fit in this host's memory."""
    _check_codec(codec)
    a = _compressible(x)
    copy = 0 if a.flags.c_contiguous else a.nbytes
    _validate.check_alloc(copy + a.nbytes + a.nbytes // 50 + 64, "x", "compressing x")
    c = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    raw = c.reshape(-1).view(np.uint8)
    stream, info = _core.dma_compress(
        raw, c.dtype.itemsize, codec, _dtype_name(c.dtype), list(c.shape)
    )
    stream.flags.writeable = False
    return Compressed(stream, info)


def decompress(blob, *, out: np.ndarray | None = None) -> np.ndarray:
    """The original array: same dtype (byte order included), shape and bits. ``blob`` is a
    ``Compressed`` or the bytes of a stream; ``CorruptDataError`` if they were altered.

    ``out``: an existing writable C-contiguous array of the same dtype and shape to decode into
    (and return), like a DMA into a buffer that is already mapped: it skips the operating
    system's cost of handing out fresh pages, which on small VMs is a good part of the time."""
    stream = _stream_array(blob, "blob")
    # The header is not checksummed yet: nothing in it is trusted beyond its sizes (which the
    # core bounds by the stream's length, and checks against the checksum first when they claim
    # far more than the stream holds) until the payload has been decoded and verified. A dtype
    # or shape numpy cannot make is a damaged (or forged) stream either way.
    info = _core.dma_describe(stream)
    dtype, shape = _layout_of(info)
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise ShapeError(f"out: expected a numpy array, got {type(out).__name__}")
        if _dtype_name(out.dtype) != info.dtype or out.shape != shape:
            _core.dma_inspect(stream)  # CorruptDataError if the header was altered
            raise ShapeError(
                f"out: expected an array of dtype {info.dtype} and shape {shape}, got "
                f"dtype {_dtype_name(out.dtype)} and shape {out.shape}"
            )
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ShapeError("out: expected a writable C-contiguous array")
        raw = out.reshape(-1).view(np.uint8)
        _core.dma_decompress_into(stream, raw)
        _check_bools(dtype, raw)
        return out
    raw = _core.dma_decompress(stream)
    _check_bools(dtype, raw)
    return raw.view(dtype).reshape(shape)


def _check_bools(dtype: np.dtype, raw: np.ndarray) -> None:
    """A bool array holds only the bytes 0 and 1 (``compress`` never writes another): any other
    byte is a forged stream, which numpy would misread silently."""
    if dtype.kind == "b" and raw.size and int(raw.max()) > 1:
        raise CorruptDataError("stream: a bool array holds a byte other than 0 and 1")


def _layout_of(info) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape a stream names, as ``compress`` could have written them: a numeric
    numpy or ml_dtypes dtype of the stream's element size (no strings, dates, records,
    sub-arrays or objects) and a shape numpy can make; else ``CorruptDataError`` (a damaged
    header, or a forged one with a matching checksum)."""
    try:
        dt = np.dtype(info.dtype)
    except Exception:  # numpy parses dtype strings with several parsers, each its own error
        dt = None
    ml = dt is not None and dt.kind == "V" and dt.fields is None and dt.type is not np.void
    if (
        dt is None
        or not (dt.kind in "biufc" or ml)
        or dt.subdtype is not None
        or dt.itemsize != info.elem_size
    ):
        raise CorruptDataError(
            f"stream: dtype {info.dtype!r} is not a numeric numpy dtype of {info.elem_size} bytes"
        )
    shape = tuple(int(d) for d in info.shape)
    if len(shape) > 64:  # numpy's limit (the core's too)
        raise CorruptDataError(f"stream: {len(shape)} dimensions; numpy arrays have at most 64")
    try:
        _validate.shape(shape, "shape", itemsize=dt.itemsize)
    except ShapeError:
        raise CorruptDataError(
            f"stream: shape {shape} is larger than a numpy array can be"
        ) from None
    return dt, shape


@dataclasses.dataclass(frozen=True, repr=False, kw_only=True)
class DmaReport(Report):
    """Timing of one DMA transfer: ``bytes``, ``wire_bytes`` (bytes over HBM), ``seconds``,
    ``bandwidth`` (bytes/s achieved), ``codec``, ``src``, ``dst``, ``queue``, plus the Report
    fields and a trace with one track per DMA engine and queue."""

    bytes: int
    wire_bytes: int
    bandwidth: float
    codec: str
    src: str
    dst: str
    queue: int

    def _rows(self) -> list[tuple[str, str]]:
        return super()._rows() + [
            ("bytes", f"{self.bytes:,} ({self.wire_bytes:,} over HBM)"),
            ("bandwidth", f"{self.bandwidth / 1e9:.1f} GB/s achieved"),
            ("path", f"{self.src} -> {self.dst}, queue {self.queue}, codec {self.codec}"),
        ]

    def __str__(self) -> str:
        f = self.to_dict()
        u = f.get("uncertainty")
        return (
            f"{f['description']}\n  time {f['seconds'] * 1e6:.3f} us"
            + (f", {u['text']};" if u else ",")
            + f" {f['bandwidth'] / 1e9:.1f} GB/s achieved, bound by "
            f"{'HBM' if f['details']['hbm_s'] > f['details']['engines_s'] else 'the DMA engines'}"
        )


def _endpoint(p, arg: str, memory: CoreMemory):
    """A ``src``/``dst`` for the core: a memory name, or the core's side of an Allocation
    (the core checks names, which memory made it, and whether the array fits)."""
    if isinstance(p, Allocation):
        if not p.live:
            raise Trn2ValueError(f"{arg}: {p!r} was freed")
        return p._native
    return _validate.name(p, arg, PLACES, cls=Trn2ValueError, what="memory")


def dma_copy(
    x,
    *,
    src="hbm",
    dst="sbuf",
    codec: str = "none",
    queue: int = 0,
    memory: CoreMemory | None = None,
) -> DmaReport:
    """Costs moving ``x`` from ``src`` to ``dst`` on DMA queue ``queue`` (0..15) of the 16 DMA
    engines, with inline compression ``codec``: the HBM side moves the compressed bytes.

    ``src``/``dst``: "hbm" (this core's stack), "hbm_remote" (the other die's HBM), "sbuf",
    "psum", or an ``Allocation`` of ``memory`` (``core.alloc``). The on-chip side spans
    ``x.shape[0]`` partitions (folded onto 128 when longer; all 128 for 0-d/1-d arrays).

    Capacity (``CapacityError`` before any data is touched): the destination must have room
    for ``x`` now (its free space, or the allocation given), the source must be able to hold
    it at all. ``memory`` is the core's memory (``NeuronCore.dma_copy`` passes its own); by
    default an empty one. The copy is costed, not performed: it reserves nothing."""
    _check_codec(codec)
    queue = _validate.integer(queue, "queue", lo=0, hi=spec.dma_queues_per_engine - 1)
    if memory is not None and not isinstance(memory, CoreMemory):
        raise Trn2ValueError(
            "memory: expected a trn2core.memory.CoreMemory (or None), got "
            f"{_validate._show(memory)}"
        )
    mem = memory if memory is not None else CoreMemory()
    src_end, dst_end = _endpoint(src, "src", mem), _endpoint(dst, "dst", mem)
    a = _compressible(x) if codec != "none" else _validate.array(x, "x", complex_ok=True)
    if codec != "none":
        # The core reads the bytes once to size the compressed stream (nothing is written).
        copy = 0 if a.flags.c_contiguous and a.dtype.isnative else a.nbytes
        _validate.check_alloc(copy, "x", "a contiguous copy of x")
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    else:
        raw = np.empty(0, np.uint8)
    call = [
        raw,
        _dtype_name(a.dtype),
        a.dtype.itemsize,
        [int(v) for v in a.shape],
        codec,
        src_end,
        dst_end,
        int(queue),
    ]
    # A NeuronCore's memory passes its machine: SBUF and PSUM are the machine's account.
    fields, trace, nbytes, wire, s, d = mem._native.dma_copy(*call, mem._machine)
    bandwidth = nbytes / fields.seconds if fields.seconds > 0 else 0.0
    return DmaReport.from_fields(
        fields,
        trace,
        bytes=nbytes,
        wire_bytes=wire,
        bandwidth=bandwidth,
        codec=codec,
        src=s,
        dst=d,
        queue=int(queue),
    )
