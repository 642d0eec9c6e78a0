"""A matrix multiplication ``result[M, N] = lhsT[K, M].T @ rhs[K, N]`` in four stages, the
optimisation steps of NKI's matrix-multiplication tutorial, written for trn2core (current NKI
dialect: ``import nki``). Each stage computes the same bits; what changes is how much data the
DMA queues move and how busy the tensor engine (PE) is:

1. ``matmul_tiled``: every 128 x 128 x 512 step loads its two operand tiles from HBM.
2. ``matmul_hoisted``: a column of ``lhsT`` tiles is loaded once per ``m`` and a column of
   ``rhs`` tiles once per ``(m, n)``: no tile is loaded twice inside the ``k`` loop.
3. ``matmul_blocked_free``: blocks of ``BM`` x ``BN`` output tiles share their operand loads
   (each ``lhsT`` tile is reused ``BN`` times, each ``rhs`` tile ``BM`` times).
4. ``matmul_fully_blocked``: the contraction is blocked too (``BK`` tiles at a time, in a
   sequential loop); partial products of a K block accumulate in PSUM, then into a float32
   SBUF accumulator per output tile, so the operand blocks in SBUF stay small and every byte
   loaded is used ``BM`` or ``BN`` times. Large contiguous DMAs (one per K tile per block).

Stages 1 to 3 accumulate the whole contraction in PSUM in order, so they equal
``trn2core.gemm`` bit for bit (float32 results); stage 4 adds the K blocks' float32 partial
sums in order (``tests/test_nki_examples.py`` has the oracle).
The file is plain NKI: load it with ``trn2core.nki.install()`` in effect, or run
``trn2core nki run examples/nki/matmul.py::matmul_tiled --shapes 1024x1024:bf16 1024x1024:bf16``;
``python examples/nki/matmul.py`` prints each stage's time and bottleneck.
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

TM = 128  # stationary free size (nl.tile_size.gemm_stationary_fmax)
TK = 128  # contraction per instruction (nl.tile_size.pmax)
TN = 512  # moving free size (nl.tile_size.gemm_moving_fmax)


def _product(lhsT, rhs):
    """The sizes K, M, N of ``lhsT.T @ rhs`` and its float32 result tensor in HBM."""
    K, M = lhsT.shape
    _, N = rhs.shape
    return K, M, N, nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)


def _evict(result, res_psum, m: int, n: int) -> None:
    """PSUM -> SBUF (Vector copy) -> HBM (DMA) of output tile (m, n)."""
    res_sb = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res_sb, src=res_psum)
    nisa.dma_copy(dst=result[m * TM : (m + 1) * TM, n * TN : (n + 1) * TN], src=res_sb)


def _load_tile(src, k: int, col: int, width: int):
    """K tile ``k`` of the columns ``col * width .. (col + 1) * width`` of ``src`` ([K, *] in
    HBM) as an SBUF tile [TK, width]."""
    t = nl.ndarray((TK, width), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src[k * TK : (k + 1) * TK, col * width : (col + 1) * width])
    return t


def _load_block(src, k_first: int, k_tiles: int, col: int, width: int):
    """K tiles ``k_first .. k_first + k_tiles`` of the columns ``col * width .. (col + 1) *
    width`` of ``src`` ([K, *] in HBM) as one SBUF tensor [TK, k_tiles, width]: a DMA per K
    tile."""
    blk = nl.ndarray((TK, k_tiles, width), dtype=src.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(k_tiles):
        k0 = (k_first + k) * TK
        nisa.dma_copy(dst=blk[:, k, :], src=src[k0 : k0 + TK, col * width : (col + 1) * width])
    return blk


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M, N, result = _product(lhsT, rhs)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            res_psum = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                a = _load_tile(lhsT, k, m, TM)
                b = _load_tile(rhs, k, n, TN)
                nisa.nc_matmul(dst=res_psum, stationary=a, moving=b)
            _evict(result, res_psum, m, n)
    return result


@nki.jit
def matmul_hoisted(lhsT, rhs):
    K, M, N, result = _product(lhsT, rhs)
    for m in nl.affine_range(M // TM):
        a_col = [_load_tile(lhsT, k, m, TM) for k in nl.affine_range(K // TK)]
        for n in nl.affine_range(N // TN):
            b_col = [_load_tile(rhs, k, n, TN) for k in nl.affine_range(K // TK)]
            res_psum = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                nisa.nc_matmul(dst=res_psum, stationary=a_col[k], moving=b_col[k])
            _evict(result, res_psum, m, n)
    return result


@nki.jit
def matmul_blocked_free(lhsT, rhs, BM=2, BN=2):
    K, M, N, result = _product(lhsT, rhs)
    BM, BN = min(BM, M // TM), min(BN, N // TN)
    for mb in nl.affine_range(M // (TM * BM)):
        # One SBUF tensor per block: [TK, K/TK, BM*TM] holds BM column tiles of lhsT.
        a_blk = _load_block(lhsT, 0, K // TK, mb, BM * TM)
        for nb in nl.affine_range(N // (TN * BN)):
            b_blk = _load_block(rhs, 0, K // TK, nb, BN * TN)
            for i in nl.affine_range(BM):
                for j in nl.affine_range(BN):
                    res_psum = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TK):
                        nisa.nc_matmul(
                            dst=res_psum,
                            stationary=a_blk[:, k, i * TM : (i + 1) * TM],
                            moving=b_blk[:, k, j * TN : (j + 1) * TN],
                        )
                    _evict(result, res_psum, mb * BM + i, nb * BN + j)
    return result


@nki.jit
def matmul_fully_blocked(lhsT, rhs, BM=16, BN=2, BK=8):
    K, M, N, result = _product(lhsT, rhs)
    BM, BN, BK = min(BM, M // TM), min(BN, N // TN), min(BK, K // TK)
    for nb in nl.affine_range(N // (TN * BN)):
        # A float32 accumulator per output row tile of this N block: [TM, BN*TN].
        acc = []
        for _ in nl.affine_range(M // TM):
            t = nl.ndarray((TM, BN * TN), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=0.0)
            acc.append(t)
        for kb in nl.sequential_range(K // (TK * BK)):
            b_blk = _load_block(rhs, kb * BK, BK, nb, BN * TN)
            for mb in nl.affine_range(M // (TM * BM)):
                a_blk = _load_block(lhsT, kb * BK, BK, mb, BM * TM)
                for i in nl.affine_range(BM):
                    for j in nl.affine_range(BN):
                        part = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                        for k in nl.affine_range(BK):
                            nisa.nc_matmul(
                                dst=part,
                                stationary=a_blk[:, k, i * TM : (i + 1) * TM],
                                moving=b_blk[:, k, j * TN : (j + 1) * TN],
                            )
                        tgt = acc[mb * BM + i][:, j * TN : (j + 1) * TN]
                        nisa.tensor_tensor(dst=tgt, data1=tgt, data2=part, op=nl.add)
        for m in nl.affine_range(M // TM):
            nisa.dma_copy(
                dst=result[m * TM : (m + 1) * TM, nb * BN * TN : (nb + 1) * BN * TN], src=acc[m]
            )
    return result


STAGES = (matmul_tiled, matmul_hoisted, matmul_blocked_free, matmul_fully_blocked)


def main(k: int = 1024, m: int = 1024, n: int = 1024) -> None:
    import ml_dtypes
    import numpy as np
    import trn2core.nki

    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((k, m), dtype=np.float32).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((k, n), dtype=np.float32).astype(ml_dtypes.bfloat16)
    for stage in STAGES:
        res = trn2core.nki.run(stage, lhsT, rhs)
        r = res.report
        pe = 100 * r.utilization("PE")
        print(
            f"{stage.__name__:<22} {r.seconds * 1e6:9.1f} us  PE {pe:5.1f}%  bottleneck "
            f"{r.bottleneck}"
        )


if __name__ == "__main__":
    main()
