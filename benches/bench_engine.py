"""asv suites for the tensor engine: bit-exact GEMM against numpy's sgemm, and the cost model.

Run with `make bench` (asv against the package built into .venv). `track_*` record ratios
measured in the same process and the simulated Trn2 figures.
"""

import subprocess
import sys

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


# Peak extra memory of one gemm call, in a fresh process: VmHWM (the high-water mark, reset
# just before the call) over VmRSS with the inputs allocated and a small call made (threads, lazy
# initialisation), minus nothing: the figure includes the result (M x N float32).
_PEAK_CHILD = """
import sys, numpy as np, trn2core
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) * 1024
n = int(sys.argv[1])
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
trn2core.gemm(a[:64, :64], b[:64, :64], dtype='bf16')
base = status('VmRSS')
open('/proc/self/clear_refs', 'w').write('5')
trn2core.gemm(a, b, dtype='bf16')
print(status('VmHWM') - base)
"""


class GemmMemory:
    """Memory of ``gemm(a, b, dtype="bf16")`` on 4096 x 4096 float32 operands (64 MiB each):
    the operands are quantized while the panels are packed, so beyond the 64 MiB result only the
    packed panels (a few MiB) are held (the earlier multi-step path held 260 MiB in all)."""

    timeout = 600
    N = 4096

    def setup(self):
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((self.N, self.N), dtype=np.float32)
        self.b = rng.standard_normal((self.N, self.N), dtype=np.float32)

    def peakmem_gemm_quantizing_4096(self):
        # asv's figure: the whole process (the two 64 MiB inputs included).
        trn2core.gemm(self.a, self.b, dtype="bf16")

    def track_extra_mib_gemm_quantizing_4096(self):
        # The call's own peak, measured in a fresh process (Linux /proc).
        code = _PEAK_CHILD
        r = subprocess.run([sys.executable, "-c", code, str(self.N)], capture_output=True,
                           text=True, check=True)  # fmt: skip
        return int(r.stdout) / 2**20

    track_extra_mib_gemm_quantizing_4096.unit = "MiB"


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
