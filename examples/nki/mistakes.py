"""Kernels with the mistakes trn2core reports at the kernel's own line (docs/nki.md, "Errors").
Each one runs on AWS's CPU simulator without complaint; on the hardware each would fail or
compute garbage."""

from __future__ import annotations

try:
    import neuronxcc.nki as nki
except ImportError:  # run directly: trn2core's emulation of NKI
    import trn2core.nki

    trn2core.nki.install()
    import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def carried_exp(x):
    """``affine_range`` promises independent iterations, but each one reads the previous one's
    result (use ``nl.sequential_range``)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    acc = nl.load(x)
    for _ in nl.affine_range(3):
        acc[...] = nl.exp(acc)
    nl.store(out, value=acc)
    return out


@nki.jit
def too_big(x):
    """Two [128, 28672] float32 tiles: 224 KiB per partition, over the 208 KiB of SBUF that
    the compiler can allocate per partition."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.exp(a)
    nl.store(out, value=b)
    return out


@nki.jit
def half_written(x):
    """Stores only the first 64 rows of a 128-row output: the rest is never written."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x[0:64, :])
    nl.store(out[0:64, :], value=t)
    return out
