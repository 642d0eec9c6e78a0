"""LayerNorm, ``out = (x - mean) / sqrt(var + eps) * gamma + beta`` over each row, in the current
NKI dialect (``import nki``; every ``nki.isa`` call names its destination first). Written for
trn2core from the NKI documentation.

Per 128-row tile: a DMA load; ``bn_stats`` on chunks of at most 512 elements and ``bn_aggr``
for the mean and variance (Vector engine); ``rsqrt(var + eps)`` (Scalar engine ``activation``
with a bias); ``(x - mean) * rstd`` as one two-operator ``tensor_scalar``; the affine
``* gamma + beta`` as two ``tensor_tensor`` (gamma and beta broadcast to 128 partitions by one
DMA each, reading their row with step 0); a DMA store.
"""

from __future__ import annotations

try:
    import nki
except ImportError:  # run directly: trn2core's emulation of NKI
    import trn2core.nki

    trn2core.nki.install()
    import nki
import nki.isa as nisa
import nki.language as nl

P = 128


@nki.jit
def layernorm(x, gamma, beta, eps=1e-5):
    R, D = x.shape
    assert R % P == 0, "rows come in tiles of 128"
    out = nl.ndarray((R, D), dtype=x.dtype, buffer=nl.shared_hbm)
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (D + fmax - 1) // fmax
    g = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=g, src=gamma.reshape((1, D)).broadcast(0, P))
    b = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=beta.reshape((1, D)).broadcast(0, P))
    for t in nl.affine_range(R // P):
        xt = nl.ndarray((P, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[t * P : (t + 1) * P, :])
        stats = nl.ndarray((P, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(chunks):
            hi = min(D, (c + 1) * fmax)
            nisa.bn_stats(dst=stats[:, 6 * c : 6 * (c + 1)], data=xt[:, c * fmax : hi])
        mv = nl.ndarray((P, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        rstd = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=mv[:, 1:2], bias=eps)
        y = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(
            dst=y, data=xt, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd
        )
        nisa.tensor_tensor(dst=y, data1=y, data2=g, op=nl.multiply)
        o = nl.ndarray((P, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=o, data1=y, data2=b, op=nl.add)
        nisa.dma_copy(dst=out[t * P : (t + 1) * P, :], src=o)
    return out
