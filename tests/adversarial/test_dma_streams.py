"""Attack surface: the DMA stream format (dma.compress / decompress / Compressed.from_bytes):
forged lengths, shapes, dtypes and checksums, streams declaring more than the host holds, and
the zero-copy paths (fresh outputs)."""

from __future__ import annotations

import numpy as np
import pytest
import trn2core as t
from trn2core import CorruptDataError

from ._probe import check_outcomes, probe

SETUP = """
x = np.arange(4096, dtype=np.float32)
z = t.dma.compress(x, 'zvc').to_bytes()
"""

CALLS = {
    "round trip is fresh": "fresh(t.dma.decompress(z), x)",
    "none codec is fresh": "c = t.dma.compress(x, 'none'); fresh(t.dma.decompress(c), x)",
    "memoryview": "t.dma.decompress(memoryview(z))",
    "bytearray": "t.dma.decompress(bytearray(z))",
    "strided uint8 array": ("t.dma.decompress(np.frombuffer(z + z, np.uint8)[::2])", "any"),
    "empty": ("t.dma.decompress(b'')", "CorruptDataError"),
    "truncated": ("t.dma.decompress(z[:-5])", "CorruptDataError"),
    "one byte longer": ("t.dma.decompress(z + b'\\0')", "CorruptDataError"),
    "every byte flipped in turn": (
        "bad = 0\n"
        "for i in range(0, len(z), 7):\n"
        "    f = bytearray(z); f[i] ^= 0x40\n"
        "    try:\n"
        "        t.dma.decompress(bytes(f)); bad += 1\n"
        "    except t.CorruptDataError:\n"
        "        pass\n"
        "assert bad == 0, bad"
    ),
    "int blob": ("t.dma.decompress(10**12)", "Trn2ValueError"),
    # A released memoryview raised numpy's ValueError; an np.matrix or memoryview out= must
    # be refused by name too.
    "released memoryview blob": (
        "m = memoryview(bytearray(z)); m.release(); t.dma.decompress(m)",
        "Trn2ValueError",
    ),
    "released memoryview from_bytes": (
        "m = memoryview(bytearray(z)); m.release(); t.dma.Compressed.from_bytes(m)",
        "Trn2ValueError",
    ),
    "np.matrix out": (
        "t.dma.decompress(z, out=np.asmatrix(np.zeros(4096, np.float32)))",
        "ShapeError",
    ),
    "memoryview out": ("t.dma.decompress(z, out=memoryview(bytearray(16384)))", "ShapeError"),
    "released memoryview out": (
        "o = memoryview(bytearray(16384)); o.release(); t.dma.decompress(z, out=o)",
        "ShapeError",
    ),
    "compress of a broadcast view": (
        "t.dma.compress(np.broadcast_to(np.float32(0), (2**33,)), 'zvc')",
        "CapacityError",
    ),
    "a forged dtype": (
        "i = z.find(b'<f4')\n"
        "t.dma.decompress(t.dma.Compressed.from_bytes(z[:i] + b'<U1' + z[i + 3 :]))",
        "CorruptDataError",
    ),
    "from_bytes garbage": ("t.dma.Compressed.from_bytes(b'TRN2' + bytes(100))", "CorruptDataError"),
}


def test_dma_streams_surface():
    check_outcomes(CALLS, setup=SETUP)


def _zeros_stream(nbytes: int) -> bytes:
    return t.dma.compress(np.zeros(nbytes // 4, np.float32), "zvc").to_bytes()


def _decompress_in_a_probe(blob: bytes, tmp_path, **kw) -> tuple[list[str], str]:
    """``t.dma.decompress(blob)`` in a probe (``kw`` as for ``probe``). Its stdout's words:
    ``allowed``, or the ``Trn2Error``'s class, whether its message says nothing was allocated
    and whether the peak RSS grew by less than 16 MiB; and its stderr."""
    path = tmp_path / "stream.bin"
    path.write_bytes(blob)
    r = probe(
        f"""
        import resource, trn2core as t
        blob = open({str(path)!r}, "rb").read()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            t.dma.decompress(blob)
            print("allowed")
        except t.Trn2Error as e:
            grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            print(type(e).__name__, "nothing was allocated" in str(e), grew < 16 * 1024)
        """,
        **kw,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split(), r.stderr


def test_a_stream_declaring_more_than_the_host_limit_is_refused_before_allocating(tmp_path):
    # A valid 128 KiB stream of all-zero blocks declares 64 MiB; under an 8 MiB host limit
    # it is refused before the output is allocated (the child's peak RSS stays small).
    out, err = _decompress_in_a_probe(
        _zeros_stream(64 << 20), tmp_path, env={"TRN2CORE_HOST_MEMORY": "8MiB"}
    )
    assert out == ["CapacityError", "True", "True"], (out, err)


def _forge_length(blob: bytes, factor: int) -> bytes:
    """The stream with its shape and raw size multiplied by ``factor`` (varints re-encoded),
    block table and checksum left as they were."""
    i = blob.find(b"<f4") + 3
    ndim = blob[i]
    j, vals = i + 1, []
    for _ in range(ndim + 1):  # the shape, then the raw size
        v, s = 0, 0
        while True:
            b = blob[j]
            j += 1
            v |= (b & 0x7F) << s
            s += 7
            if b < 0x80:
                break
        vals.append(v)
    out = bytearray(blob[: i + 1])
    for v in [vals[0] * factor, *vals[1:-1], vals[-1] * factor]:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + blob[j:]


@pytest.mark.parametrize("factor", [2, 1 << 20, 1 << 40])
def test_a_forged_length_is_corrupt_data_before_allocating(factor, tmp_path):
    # The length field claims up to 2**40 times the real array (far beyond
    # TRN2CORE_HOST_MEMORY): refused from the header and table (CorruptDataError) or by the
    # host check, never allocated.
    blob = t.dma.compress(np.arange(1 << 16, dtype=np.float32), "zvc").to_bytes()
    forged = _forge_length(blob, factor)
    assert forged != blob
    out, err = _decompress_in_a_probe(
        forged, tmp_path, env={"TRN2CORE_HOST_MEMORY": "8MiB"}, cap=2 << 30
    )
    assert out[0] in ("CorruptDataError", "CapacityError"), (out, err)
    with pytest.raises(CorruptDataError):
        t.dma.Compressed.from_bytes(forged)


def test_a_zero_stream_with_a_bad_checksum_is_corrupt_before_allocating(tmp_path):
    # Declares 64 MiB from 128 KiB: the checksum is verified before the output is allocated.
    blob = _zeros_stream(64 << 20)
    out, err = _decompress_in_a_probe(blob[:-1] + bytes([blob[-1] ^ 1]), tmp_path)
    assert out[::2] == ["CorruptDataError", "True"], (out, err)
