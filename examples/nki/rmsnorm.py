"""RMSNorm, ``out = x / sqrt(mean(x^2, axis=1) + eps) * g``, in the legacy NKI dialect
(``neuronxcc.nki``): ``nl.arange`` index expressions, ``mask=`` predicates for a last tile of
fewer than 128 rows, and ``nki.language`` operations that return new tiles. Written for
trn2core from the NKI documentation.

Per 128-row tile: a DMA load, ``square`` (Scalar engine), a sum over the row (Vector
``tensor_reduce``), ``* (1/D) + eps`` (Vector ``tensor_scalar``), ``rsqrt`` (Scalar), the
row scaling by a ``[P, 1]`` float32 operand (Vector ``tensor_scalar``), the weight (Vector
``tensor_tensor`` with ``g`` broadcast to 128 partitions once by a DMA) and a DMA store.
"""

from __future__ import annotations

import math

try:
    import neuronxcc.nki as nki
except ImportError:  # run directly: trn2core's emulation of NKI
    import trn2core.nki

    trn2core.nki.install()
    import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def rmsnorm(x, g, eps=1e-6):
    R, D = x.shape
    out = nl.ndarray((R, D), dtype=x.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    jf = nl.arange(D)[None, :]
    i0 = nl.arange(1)[:, None]
    g_row = nl.load(g.reshape((1, D))[i0, jf])
    g_all = g_row.broadcast_to((128, D))
    for t in nl.affine_range(math.ceil(R / 128)):
        rows = t * 128 + ip
        valid = rows < R
        xt = nl.load(x[rows, jf], mask=valid)
        sq = nl.square(xt, mask=valid)
        ss = nl.sum(sq, axis=[1], mask=valid)
        ms = nl.add(nl.multiply(ss, 1.0 / D, mask=valid), eps, mask=valid)
        r = nl.rsqrt(ms, mask=valid)
        y = nl.multiply(xt, r, mask=valid)
        o = nl.multiply(y, g_all, mask=valid)
        nl.store(out[rows, jf], value=o, mask=valid)
    return out
