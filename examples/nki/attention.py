"""A fused attention forward for one head, ``softmax(q @ k.T * scale) @ v``, in the current NKI
dialect. Written for trn2core from the NKI documentation (no causal mask).

Inputs: ``qT`` ``[d, Sq]`` and ``kT`` ``[d, Sk]`` (the head dimension ``d <= 128`` on the
partitions, the contraction axis of ``q @ k.T``), ``v`` ``[Sk, d]``; ``Sq`` and ``Sk`` are
multiples of 128 and ``Sk <= 512`` (one PSUM bank of scores per query tile). Per 128-query
tile:

1. scores ``[128, Sk]`` = one ``nc_matmul`` into PSUM (float32);
2. the row max (Vector ``tensor_reduce`` from PSUM), negated and scaled (``tensor_scalar``);
3. ``p = exp(scale * s - scale * max)`` (Scalar ``activation`` with scale and a per-row
   bias) in bfloat16, its float32 row sums accumulated by the same instruction;
4. ``p`` transposed 128 columns at a time on the tensor engine (``nc_transpose``) and copied
   back to SBUF, so the key axis lies on the partitions;
5. ``o = p @ v`` accumulated over the key chunks in PSUM (``nc_matmul``);
6. ``o * (1 / rowsum)`` (Vector ``reciprocal`` and ``tensor_scalar``) and a DMA store.
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
def attention_fwd(qT, kT, v, scale=None):
    d, Sq = qT.shape
    _, Sk = kT.shape
    assert d <= P and Sq % P == 0 and Sk % P == 0 and Sk <= 512
    scale = (1.0 / d**0.5) if scale is None else float(scale)
    out = nl.ndarray((Sq, d), dtype=v.dtype, buffer=nl.shared_hbm)
    k_sb = nl.ndarray((d, Sk), dtype=kT.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=k_sb, src=kT)
    v_sb = nl.ndarray((P, Sk // P, d), dtype=v.dtype, buffer=nl.sbuf)
    for c in nl.affine_range(Sk // P):
        nisa.dma_copy(dst=v_sb[:, c, :], src=v[c * P : (c + 1) * P, :])
    for i in nl.affine_range(Sq // P):
        q_sb = nl.ndarray((d, P), dtype=qT.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=q_sb, src=qT[:, i * P : (i + 1) * P])
        s = nl.ndarray((P, Sk), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=s, stationary=q_sb, moving=k_sb)
        mx = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mx, op=nl.maximum, data=s, axis=1)
        neg = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg, data=mx, op0=nl.multiply, operand0=-scale)
        p = nl.ndarray((P, Sk), dtype=nl.bfloat16, buffer=nl.sbuf)
        rowsum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(
            dst=p, op=nl.exp, data=s, bias=neg, scale=scale, reduce_op=nl.add, reduce_res=rowsum
        )
        o = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.psum)
        for c in nl.affine_range(Sk // P):
            pT_ps = nl.ndarray((P, P), dtype=nl.bfloat16, buffer=nl.psum)
            nisa.nc_transpose(dst=pT_ps, data=p[:, c * P : (c + 1) * P])
            pT = nl.ndarray((P, P), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_copy(dst=pT, src=pT_ps)
            nisa.nc_matmul(dst=o, stationary=pT, moving=v_sb[:, c, :])
        inv = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=rowsum)
        o_sb = nl.ndarray((P, d), dtype=v.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o_sb, data=o, op0=nl.multiply, operand0=inv)
        nisa.dma_copy(dst=out[i * P : (i + 1) * P, :], src=o_sb)
    return out
