"""asv suites for structured sparsity: prune/compress throughput, the sparse GEMM against the
dense GEMM of the same pruned matrix, and the modelled Trn2 speed-up (``track_*``)."""

import numpy as np
import trn2core

SIDE = 4096
G = 1024


class PruneCompress:
    """N:M pruning and compression of a 4096x4096 bf16 matrix."""

    params = ["2:4", "4:16"]
    param_names = ["pattern"]

    def setup(self, pattern):
        rng = np.random.default_rng(0)
        self.w = trn2core.quantize(rng.standard_normal((SIDE, SIDE), dtype=np.float32), "bf16")
        self.pruned = trn2core.prune(self.w, pattern)
        self.sp = trn2core.compress(self.pruned, pattern)

    def time_prune(self, pattern):
        trn2core.prune(self.w, pattern)

    def time_compress(self, pattern):
        trn2core.compress(self.pruned, pattern)

    def time_decompress(self, pattern):
        self.sp.decompress()

    def peakmem_prune_compress(self, pattern):
        trn2core.compress(trn2core.prune(self.w, pattern), pattern)

    def track_compressed_fraction(self, pattern):
        return self.sp.nbytes / self.w.nbytes

    track_compressed_fraction.unit = "fraction of dense bytes"


class SparseGemm:
    """1024^3 bf16 with a 4:16 stationary operand, and the dense GEMM of the same matrix."""

    timeout = 300

    def setup(self):
        rng = np.random.default_rng(1)
        a = trn2core.quantize(rng.standard_normal((G, G), dtype=np.float32), "bf16")
        self.a = trn2core.prune(a, "4:16", axis=1)
        self.b = trn2core.quantize(rng.standard_normal((G, G), dtype=np.float32), "bf16")
        self.sp = trn2core.compress(self.a, "4:16", axis=1)

    def time_sparse_gemm(self):
        trn2core.gemm(self.sp, self.b)

    def time_dense_gemm_of_pruned(self):
        trn2core.gemm(self.a, self.b)

    def track_trn2_speedup_4_16_4096(self):
        dense = trn2core.estimate_gemm(4096, 4096, 4096)
        sparse = trn2core.estimate_gemm(4096, 4096, 4096, sparsity="4:16")
        return dense.seconds / sparse.seconds

    track_trn2_speedup_4_16_4096.unit = "x"

    def track_trn2_sparse_tflops_4096(self):
        return trn2core.estimate_gemm(4096, 4096, 4096, sparsity="4:16").tflops

    track_trn2_sparse_tflops_4096.unit = "TFLOPS"
