"""asv suites for the whole-core machine (issue 14): issuing instructions, scheduling them, and
element throughput against numpy.

Run with `make bench`, or directly: `.venv/bin/asv run --python=same --bench Machine`.

- ``Issue``: wall time of 10,000 small Vector instructions issued one by one from Python
  (``tensor_tensor`` on ``[128, 64]`` tiles of fp32 and bf16, and ``activation(copy)``).
- ``Schedule``: ``core.run()`` on a recorded program of 1 million instructions (a chain on the
  Vector engine, and a mixed program over four engines and 16 DMA queues).
- ``Throughput``: ``tensor_tensor`` add on ``[128, 16384]`` fp32 tiles, and numpy's
  ``np.add(x, y, out=z)`` on arrays of the same size; ``track_*`` give the rates measured
  inside the function (best of 5 with ``time.perf_counter``) and the ratio, in one run.
"""

import numpy as np
import trn2core
from trn2core.testing import best_of

N_ISSUE = 10_000


def _tiles(core, n, shape, dtype):
    ts = [core.tile(shape, dtype) for _ in range(n)]
    for t in ts:
        core.vector.memset(t, 1.0)
    core.clear_program()
    return ts


class Issue:
    """10,000 instructions issued from Python, one call each."""

    params = (["fp32", "bf16"],)
    param_names = ["dtype"]

    def setup(self, dtype):
        self.core = trn2core.NeuronCore()
        self.t = _tiles(self.core, 4, (128, 64), dtype)

    def time_tensor_tensor(self, dtype):
        v, t = self.core.vector, self.t
        for i in range(N_ISSUE):
            v.tensor_tensor(t[(i + 2) % 4], t[i % 4], t[(i + 1) % 4], "multiply")
        self.core.clear_program()

    def time_activation_copy(self, dtype):
        s, t = self.core.scalar, self.t
        for i in range(N_ISSUE):
            s.activation(t[(i + 1) % 4], t[i % 4], "copy")
        self.core.clear_program()

    def track_instructions_per_second(self, dtype):
        def run():
            self.time_tensor_tensor(dtype)

        return N_ISSUE / best_of(run, 5)

    track_instructions_per_second.unit = "instructions/s"


class Schedule:
    """``core.run()`` on 1 million recorded instructions."""

    params = (["chain", "mixed"],)
    param_names = ["program"]
    timeout = 600

    def setup(self, program):
        core = trn2core.NeuronCore()
        n = 1_000_000
        if program == "chain":
            t = _tiles(core, 4, (128, 64), "fp32")
            v = core.vector
            for i in range(n):
                v.tensor_tensor(t[(i + 2) % 4], t[i % 4], t[(i + 1) % 4], "add")
        else:
            t = _tiles(core, 256, (128, 64), "bf16")
            h = core.hbm_tensor(np.zeros((128 * 256, 64), np.float32))
            rng = np.random.default_rng(0)
            idx = rng.integers(0, 256, (n, 3)).tolist()
            kind = rng.integers(0, 4, n).tolist()
            for (a, b, d), k in zip(idx, kind, strict=True):
                if k == 0:
                    core.vector.tensor_tensor(t[d], t[a], t[b], "add")
                elif k == 1:
                    core.scalar.activation(t[d], t[a], "copy")
                elif k == 2:
                    core.gpsimd.tensor_tensor(t[d], t[a], t[b], "multiply")
                else:
                    core.dma.copy(t[d], h[a * 128 : (a + 1) * 128])
        self.core = core

    def time_run(self, program):
        self.core.run(trace_limit=0)


class Throughput:
    """``tensor_tensor`` add on ``[128, 16384]`` fp32 tiles against numpy's ``np.add``."""

    def setup(self):
        self.core = trn2core.NeuronCore()
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((128, 16384), dtype=np.float32)
        self.y = rng.standard_normal((128, 16384), dtype=np.float32)
        self.z = np.empty_like(self.x)
        self.a, self.b, self.d = (self.core.tile((128, 16384), "fp32") for _ in range(3))
        self.core.write(self.a, self.x)
        self.core.write(self.b, self.y)

    def time_tensor_tensor(self):
        self.core.vector.tensor_tensor(self.d, self.a, self.b, "add")

    def time_numpy_add(self):
        np.add(self.x, self.y, out=self.z)

    def track_gelem_per_s(self):
        t = best_of(lambda: self.core.vector.tensor_tensor(self.d, self.a, self.b, "add"), 5)
        return self.x.size / t / 1e9

    track_gelem_per_s.unit = "Gelem/s"

    def track_ratio_to_numpy(self):
        ours = best_of(lambda: self.core.vector.tensor_tensor(self.d, self.a, self.b, "add"), 5)
        peer = best_of(lambda: np.add(self.x, self.y, out=self.z), 5)
        return peer / ours

    track_ratio_to_numpy.unit = "x numpy"
