"""asv suites for trn2core's numerics on 16 Mi float32 elements, with ml_dtypes as the baseline.

Run with `make bench` (which calls `asv run --python=same --quick --show-stderr`), or directly:
`.venv/bin/asv run --python=same --bench Quantize`. The input is always
`np.random.default_rng(0).standard_normal(1 << 24, dtype=np.float32)`.

- ``Quantize``: wall time of trn2core RNE / seeded SR and of ml_dtypes ``astype`` (same suite,
  same input, so the two columns compare directly).
- ``PeakMemory``: peak RSS of one fp8 quantize; compare with ``peakmem_setup_only`` (input only)
  and ``peakmem_ml_dtypes_fp8``: the difference should be the 16 MiB output, no larger temporary.
- ``Ratios``: speedups over ml_dtypes and SR throughput, each measured inside the function as the
  best of 5 runs with ``time.perf_counter`` (the machine is small and noisy).
"""

import ml_dtypes
import numpy as np
import trn2core
from trn2core.testing import best_of

N = 1 << 24  # 16 Mi elements
REPEAT = 5  # best-of count inside the track_* functions
SEED = 1

ML_DTYPES = {"fp8_e4m3": ml_dtypes.float8_e4m3, "bf16": ml_dtypes.bfloat16}


def _input():
    return np.random.default_rng(0).standard_normal(N, dtype=np.float32)


def _best(fn, repeat=REPEAT):
    return best_of(fn, repeat)


class Quantize:
    """float32 -> fmt on 16 Mi elements: trn2core against ml_dtypes astype."""

    params = ["fp8_e4m3", "bf16"]
    param_names = ["fmt"]
    timeout = 120

    def setup(self, fmt):
        self.x = _input()
        self.dtype = ML_DTYPES[fmt]
        # Start the worker threads outside the timed region.
        trn2core.quantize(self.x[:4096], fmt)

    def time_trn2core_rne(self, fmt):
        trn2core.quantize(self.x, fmt)

    def time_trn2core_sr_seeded(self, fmt):
        trn2core.quantize(self.x, fmt, rounding="stochastic", seed=SEED)

    def time_ml_dtypes_astype(self, fmt):
        self.x.astype(self.dtype)


class PeakMemory:
    """Peak resident memory (input included) of one float32 -> fp8_e4m3 conversion."""

    timeout = 120

    def setup(self):
        self.x = _input()

    def peakmem_setup_only(self):
        # Reference: the interpreter, the modules and the 64 MiB input, nothing converted.
        pass

    def peakmem_trn2core_fp8(self):
        trn2core.quantize(self.x, "fp8_e4m3")

    def peakmem_trn2core_fp8_sr_seeded(self):
        trn2core.quantize(self.x, "fp8_e4m3", rounding="stochastic", seed=SEED)

    def peakmem_ml_dtypes_fp8(self):
        self.x.astype(ml_dtypes.float8_e4m3)


class Ratios:
    """Speedups over ml_dtypes and the SR rate, best of 5 each, measured in one process."""

    timeout = 180

    def setup(self):
        self.x = _input()
        trn2core.quantize(self.x[:4096], "fp8_e4m3")

    def _speedup(self, fmt):
        ours = _best(lambda: trn2core.quantize(self.x, fmt))
        peer = _best(lambda: self.x.astype(ML_DTYPES[fmt]))
        return peer / ours

    def track_fp8_rne_speedup_vs_ml_dtypes(self):
        return self._speedup("fp8_e4m3")

    track_fp8_rne_speedup_vs_ml_dtypes.unit = "x (ml_dtypes time / trn2core time)"

    def track_bf16_rne_speedup_vs_ml_dtypes(self):
        return self._speedup("bf16")

    track_bf16_rne_speedup_vs_ml_dtypes.unit = "x (ml_dtypes time / trn2core time)"

    def track_fp8_sr_seeded_throughput(self):
        t = _best(lambda: trn2core.quantize(self.x, "fp8_e4m3", rounding="stochastic", seed=SEED))
        return N / t / 1e6

    track_fp8_sr_seeded_throughput.unit = "Melem/s"
