"""Row softmax, ``out = exp(x - max) / sum(exp(x - max))``, in the legacy NKI dialect with tile
operators (``xt - mx``, ``e * r``). Written for trn2core from the NKI documentation.

Per 128-row tile: a DMA load, a row max (Vector ``tensor_reduce``), the subtraction of a
``[P, 1]`` float32 operand (Vector ``tensor_scalar``), ``exp`` (Scalar engine), a row sum, a
reciprocal (Vector, IEEE) and the scaling (Vector ``tensor_scalar``), then a DMA store.
"""

from __future__ import annotations

try:
    import neuronxcc.nki as nki
except ImportError:  # run directly: trn2core's emulation of NKI
    import trn2core.nki

    trn2core.nki.install()
    import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def softmax(x):
    R, D = x.shape
    out = nl.ndarray((R, D), dtype=x.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.mgrid[0:128, 0:D]
    for t in nl.affine_range(R // 128):
        xt = nl.load(x[t * 128 + ip, jf])
        mx = nl.max(xt, axis=1)
        e = nl.exp(xt - mx)
        s = nl.sum(e, axis=1)
        r = nl.reciprocal(s)
        nl.store(out[t * 128 + ip, jf], value=e * r)
    return out
