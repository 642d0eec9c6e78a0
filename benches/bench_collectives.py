"""asv suites for chips and collectives: the functional all-reduce against numpy, the cost
model's speed on big machines, and the predicted bus bandwidths (``track_*``).

Run with `make bench`. The predicted figures change only when the model does; the timings are
ratios or absolute costs of the emulator on this host.
"""

import numpy as np
import trn2core
from trn2core.testing import best_of

MI = 1 << 20


class AllReduceFunctional:
    """16 x 64 MiB fp32 buffers on a trn2.48xlarge: every chip's bits, against numpy's sum."""

    timeout = 600

    def setup(self):
        rng = np.random.default_rng(0)
        self.inst = trn2core.Instance("trn2.48xlarge")
        self.bufs = [rng.standard_normal(16 * MI, dtype=np.float32) for _ in range(16)]

    def time_trn2core_all_reduce(self):
        self.inst.all_reduce(self.bufs)

    def time_numpy_sum_stack(self):
        np.sum(np.stack(self.bufs), 0)

    def track_ratio_vs_numpy(self):
        ours = best_of(lambda: self.inst.all_reduce(self.bufs), 3, warmup=True)
        peer = best_of(lambda: np.sum(np.stack(self.bufs), 0), 3, warmup=True)
        return peer / ours

    track_ratio_vs_numpy.unit = "x numpy speed"


class CollectiveCostModel:
    """Costing without data: how fast, and what it predicts."""

    def setup(self):
        self.inst = trn2core.Instance("trn2.48xlarge")
        self.us = trn2core.UltraServer()
        self.uc = trn2core.UltraCluster(32)

    def time_estimate_all_reduce_2048_chips(self):
        self.uc.estimate("all_reduce", 1 << 30)

    def time_estimate_all_reduce_2048_chips_flat_ring(self):
        self.uc.estimate("all_reduce", 1 << 30, algorithm="ring")

    def track_busbw_all_reduce_1gib_trn2_48xlarge(self):
        return self.inst.estimate("all_reduce", 1 << 30).busbw / 1e9

    track_busbw_all_reduce_1gib_trn2_48xlarge.unit = "GB/s"

    def track_busbw_all_reduce_16mib_trn2_48xlarge(self):
        return self.inst.estimate("all_reduce", 16 * MI).busbw / 1e9

    track_busbw_all_reduce_16mib_trn2_48xlarge.unit = "GB/s"

    def track_us_all_reduce_8b_trn2_48xlarge(self):
        return self.inst.estimate("all_reduce", 8).seconds * 1e6

    track_us_all_reduce_8b_trn2_48xlarge.unit = "us"

    def track_busbw_all_reduce_1gib_ultraserver(self):
        return self.us.estimate("all_reduce", 1 << 30).busbw / 1e9

    track_busbw_all_reduce_1gib_ultraserver.unit = "GB/s"

    def track_busbw_all_reduce_1gib_2048_chips(self):
        return self.uc.estimate("all_reduce", 1 << 30).busbw / 1e9

    track_busbw_all_reduce_1gib_2048_chips.unit = "GB/s"

    def track_busbw_all_gather_1gib_trn2_48xlarge(self):
        return self.inst.estimate("all_gather", 64 * MI).busbw / 1e9

    track_busbw_all_gather_1gib_trn2_48xlarge.unit = "GB/s"


class LogicalCoreGemm:
    """Predicted time of a 4096^3 bf16 GEMM on one logical core, by LNC."""

    params = [1, 2, 4]
    param_names = ["lnc"]

    def track_us_gemm_4096(self, lnc):
        core = trn2core.Chip(lnc=lnc).cores[0]
        return trn2core.estimate_gemm(4096, 4096, 4096, core=core).seconds * 1e6

    track_us_gemm_4096.unit = "us"
