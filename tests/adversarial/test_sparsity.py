"""Attack surface: structured sparsity (prune, compress, SparseTensor and its CUTLASS
layout): broadcast views of gigabytes, numpy scalar arguments, fresh outputs."""

from __future__ import annotations

from ._probe import check_outcomes

SETUP = """
x = np.linspace(-1, 1, 8 * 16, dtype=np.float32).reshape(8, 16)
p = t.prune(x, '2:4')
h = t.prune(np.linspace(-1, 1, 64 * 64, dtype=np.float16).reshape(64, 64), '2:4')
"""

CALLS = {
    "prune of pruned is fresh": "fresh(t.prune(p, '2:4'), p)",
    "decompress is fresh": "s = t.compress(p, '2:4'); fresh(s.decompress(), p)",
    "numpy axis": "t.prune(x, '2:4', axis=np.int64(-1))",
    "numpy axis out of range": ("t.prune(x, '2:4', axis=np.int64(5))", "ShapeError"),
    "cutlass round trip": (
        "s = t.compress(h, '2:4'); v, m = s.to_cutlass(); "
        "back = t.SparseTensor.from_cutlass(v, m); fresh(back.decompress(), v, m)"
    ),
    "cutlass of broadcast values": (
        "t.SparseTensor.from_cutlass(np.broadcast_to(np.float16(1), (2**17, 2**15)), "
        "np.broadcast_to(np.int16(0x4444), (2**17, 2**12)))",
        "any",
    ),
    "prune broadcast": (
        "t.prune(np.broadcast_to(np.float32(1), (2**17, 2**16)), '2:4')",
        "CapacityError",
    ),
    "compress broadcast": (
        "t.compress(np.broadcast_to(np.float32(0), (2**17, 2**16)), '2:4')",
        "CapacityError",
    ),
    "pattern numpy str": ("t.prune(x, np.str_('2:4'))", "any"),
    "compress wrong pattern": ("t.compress(x, '2:4')", "SparsityError"),
}


def test_sparsity_surface():
    check_outcomes(CALLS, setup=SETUP)
