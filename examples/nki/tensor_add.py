"""Element-wise ``a + b`` as an SPMD launch grid (legacy NKI dialect): each program adds one
128 x 512 tile, picked by ``nl.program_id`` (``kernel[R // 128, C // 512](a, b)``); with
``nl.spmd_dim(n, nl.nc(2))`` on the first axis the programs are spread over the two physical
cores of a Trainium2 logical core. Written for trn2core from the NKI documentation.
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
def tensor_add(a, b):
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    cols = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    at = nl.load(a[rows, cols])
    bt = nl.load(b[rows, cols])
    nl.store(c[rows, cols], value=at + bt)
    return c


def tensor_add_grid(a, b):
    """Launches one program per 128 x 512 tile on one NeuronCore."""
    return tensor_add[a.shape[0] // 128, a.shape[1] // 512](a, b)


def tensor_add_lnc2(a, b):
    """The same programs spread over two physical cores (the first grid axis, even / odd)."""
    return tensor_add[nl.spmd_dim(a.shape[0] // 256, nl.nc(2)), a.shape[1] // 512](a, b)
