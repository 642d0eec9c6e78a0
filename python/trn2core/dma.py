"""DMA and inline compression (contract section 4): ``trn2core.dma``.

``compress``/``decompress``/``Compressed`` wrap the Rust codecs (``rust/trn2core/src/dma``):
lossless for every dtype and bit pattern, in a self-describing stream with a CRC32C checksum.
The timing of a transfer comes from the Rust DMA model (``perf/dma.rs``, docs/dma.md).
"""

from __future__ import annotations

import numpy as np

from . import _core, _validate
from .errors import FormatError
from .report import Report

__all__ = ["CODECS", "Compressed", "compress", "decompress", "DmaReport", "dma_copy"]

#: The inline-compression codecs: "none", "zvc" (zero-value compression), "byteplane".
CODECS: tuple[str, ...] = tuple(_core.dma_codecs())


def _dtype_name(dt: np.dtype) -> str:
    # numpy's own types by their byte-order-explicit code ("<f4", ">i2"); ml_dtypes by name.
    return dt.name if dt.isbuiltin == 2 else dt.str


class Compressed:
    """A compressed array: ``codec``, ``nbytes`` (stream size), ``raw_nbytes``, ``ratio``,
    ``dtype``, ``shape``; ``to_bytes()`` and ``Compressed.from_bytes(b)``."""

    def __init__(self, stream: bytes, info: dict) -> None:
        self._stream = bytes(stream)
        self.codec: str = info["codec"]
        self.nbytes: int = int(info["nbytes"])
        self.raw_nbytes: int = int(info["raw_nbytes"])
        self.dtype = np.dtype(info["dtype"])
        self.shape: tuple[int, ...] = tuple(int(d) for d in info["shape"])

    @property
    def ratio(self) -> float:
        """Raw bytes over compressed bytes (above 1 when compression helps)."""
        return self.raw_nbytes / self.nbytes if self.nbytes else 1.0

    def to_bytes(self) -> bytes:
        """The self-describing stream (magic, version, codec, dtype, shape, blocks, CRC32C)."""
        return self._stream

    @classmethod
    def from_bytes(cls, b: bytes) -> Compressed:
        """Validates ``b`` (structure and checksum): raises ``CorruptDataError`` if it was
        truncated or altered."""
        stream = _validate.bytes_like(b, "b")
        return cls(stream, _core.dma_inspect(stream))

    def __repr__(self) -> str:
        return (
            f"Compressed(codec={self.codec!r}, dtype={self.dtype}, shape={self.shape}, "
            f"nbytes={self.nbytes}, raw_nbytes={self.raw_nbytes}, ratio={self.ratio:.3f})"
        )


def compress(x, codec: str = "zvc") -> Compressed:
    """Compresses array ``x`` losslessly with ``codec`` (see ``CODECS``)."""
    if not isinstance(codec, str) or codec not in CODECS:
        raise FormatError(f"codec: unknown codec {codec!r}; expected one of {CODECS}")
    a = _validate.array(x, "x", complex_ok=True)
    if a.dtype.hasobject or a.dtype.kind not in "biufcV" or a.dtype.itemsize not in (1, 2, 4, 8):
        raise FormatError(
            f"x: dtype {a.dtype} cannot be compressed; expected a numeric dtype of 1, 2, 4 or 8 "
            "bytes per element"
        )
    c = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
    raw = c.reshape(-1).view(np.uint8)
    stream = _core.dma_compress(raw, c.dtype.itemsize, codec, _dtype_name(c.dtype), list(c.shape))
    return Compressed(stream, _core.dma_inspect(stream))


def decompress(blob: Compressed | bytes) -> np.ndarray:
    """The original array: same dtype (byte order included), shape and bits."""
    stream = blob.to_bytes() if isinstance(blob, Compressed) else _validate.bytes_like(blob, "blob")
    info, raw = _core.dma_decompress(stream)
    shape = tuple(int(d) for d in info["shape"])
    return raw.view(np.dtype(info["dtype"])).reshape(shape)


class DmaReport(Report):
    """Timing of one DMA transfer: ``bytes``, ``wire_bytes`` (bytes over HBM), ``seconds``,
    ``bandwidth`` (bytes/s achieved), plus the Report fields and trace."""

    def __init__(self, fields: dict, trace_json: str, nbytes: int, wire: int) -> None:
        fields = dict(fields)
        fields["bytes"] = nbytes
        fields["wire_bytes"] = wire
        fields["bandwidth"] = nbytes / fields["seconds"] if fields["seconds"] > 0 else 0.0
        super().__init__(fields, trace_json=trace_json)

    def __str__(self) -> str:
        f = self.to_dict()
        return (
            f"{f['description']}\n  time {f['seconds'] * 1e6:.3f} us, "
            f"{f['bandwidth'] / 1e9:.1f} GB/s achieved, bound by "
            f"{'HBM' if f['details']['hbm_s'] > f['details']['engines_s'] else 'the DMA engines'}"
        )


def dma_copy(x, *, src: str = "hbm", dst: str = "sbuf", codec: str = "none") -> DmaReport:
    """Costs moving ``x`` from ``src`` to ``dst`` ("hbm", "hbm_remote" for the other die's
    HBM, "sbuf", "psum") with inline compression ``codec``: the HBM side moves the compressed
    bytes. The on-chip side spans ``x.shape[0]`` partitions (at most 128)."""
    if not isinstance(codec, str) or codec not in CODECS:
        raise FormatError(f"codec: unknown codec {codec!r}; expected one of {CODECS}")
    a = _validate.array(x, "x", complex_ok=True)
    wire = a.nbytes if codec == "none" else compress(a, codec).nbytes
    partitions = min(128, a.shape[0]) if a.ndim >= 2 and a.shape[0] > 0 else 128
    fields, trace = _core.dma_copy_time(a.nbytes, wire, partitions, str(src), str(dst))
    return DmaReport(fields, trace, a.nbytes, wire)
