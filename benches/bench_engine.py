"""asv suites for the tensor engine: bit-exact GEMM against numpy's sgemm, and the cost model.

Run with `make bench` (asv against the package built into .venv). `track_*` record ratios
measured in the same process and the simulated Trn2 figures.
"""

import numpy as np
import trn2core
from trn2core.testing import best_of

N = 1024


def _best(fn, repeat=5):
    return best_of(fn, repeat)


class Gemm:
    """1024^3 bf16: trn2core's bit-exact GEMM and numpy's float32 BLAS on the same values."""

    timeout = 300

    def setup(self):
        rng = np.random.default_rng(0)
        self.a = trn2core.quantize(rng.standard_normal((N, N), dtype=np.float32), "bf16")
        self.b = trn2core.quantize(rng.standard_normal((N, N), dtype=np.float32), "bf16")
        self.a8 = trn2core.quantize(rng.standard_normal((N, N), dtype=np.float32), "fp8_e4m3")
        self.b8 = trn2core.quantize(rng.standard_normal((N, N), dtype=np.float32), "fp8_e4m3")
        self.a32, self.b32 = self.a.astype(np.float32), self.b.astype(np.float32)

    def time_trn2core_gemm_bf16(self):
        trn2core.gemm(self.a, self.b)

    def time_trn2core_gemm_fp8(self):
        trn2core.gemm(self.a8, self.b8)

    def time_numpy_sgemm(self):
        self.a32 @ self.b32

    def track_ratio_vs_sgemm(self):
        return _best(lambda: self.a32 @ self.b32) / _best(lambda: trn2core.gemm(self.a, self.b))

    track_ratio_vs_sgemm.unit = "x sgemm speed"


class CostModel:
    """The cost model: how fast it walks a schedule, and what it predicts."""

    def time_estimate_gemm_16384(self):
        trn2core.estimate_gemm(16384, 16384, 16384)

    def time_estimate_gemm_10e6_cubed(self):
        # 1.2e11 instructions, fast-forwarded (the walk would take about half an hour).
        trn2core.estimate_gemm(10**6, 10**6, 10**6)

    def time_estimate_gemm_10e7_10e7_10e5(self):
        trn2core.estimate_gemm(10**7, 10**7, 10**5)

    def track_simulated_tflops_bf16_4096(self):
        return trn2core.estimate_gemm(4096, 4096, 4096, dtype="bf16").tflops

    track_simulated_tflops_bf16_4096.unit = "TFLOPS"

    def track_simulated_tflops_fp8_double_row_4096(self):
        r = trn2core.estimate_gemm(4096, 4096, 4096, dtype="fp8_e4m3", perf_mode="double_row")
        return r.tflops

    track_simulated_tflops_fp8_double_row_4096.unit = "TFLOPS"

    def track_simulated_us_small_k(self):
        return trn2core.estimate_gemm(4096, 128, 4096, dtype="bf16").seconds * 1e6

    track_simulated_us_small_k.unit = "us"
