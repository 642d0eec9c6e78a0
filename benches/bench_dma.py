"""asv suites for DMA inline compression: the codecs on 64 MiB of ReLU activations, with numpy's
memcpy (``np.copyto`` of the same bytes) as the baseline, and the DMA timing model.

Run with `make bench`, or directly: `.venv/bin/asv run --python=same --bench Codecs`. The input
is always ``np.maximum(np.random.default_rng(0).standard_normal(n), 0)`` as float32 (16 Mi
elements) or bf16 (32 Mi elements): 64 MiB either way, about half zeros.

- ``Codecs``: wall time of compress/decompress for zvc and byteplane, and of ``np.copyto``.
- ``CodecMemory``: peak RSS of one compress / decompress (against ``peakmem_setup_only``, the
  input alone): the extra should be the stream (about half the input) or the output.
- ``Rates``: GB/s of zvc compress/decompress and their ratio to memcpy, each measured inside
  the function as the best of 5 runs with ``time.perf_counter`` (the machine is small and
  noisy); compression ratios; and the simulated DMA seconds of moving the tensor HBM -> SBUF
  with and without compression (local and other-die HBM).
"""

import ml_dtypes
import numpy as np
import trn2core
from trn2core import dma
from trn2core.testing import best_of

MIB = 1 << 20
NBYTES = 64 * MIB
REPEAT = 5
DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}


def relu(dtype: str) -> np.ndarray:
    dt = np.dtype(DTYPES[dtype])
    x = np.random.default_rng(0).standard_normal(NBYTES // dt.itemsize, dtype=np.float32)
    return np.maximum(x, 0).astype(dt)


class Codecs:
    """64 MiB ReLU activations: compress/decompress with each codec, and numpy's copy."""

    params = (["zvc", "byteplane"], ["fp32", "bf16"])
    param_names = ["codec", "dtype"]
    timeout = 300

    def setup(self, codec, dtype):
        self.x = relu(dtype)
        self.blob = dma.compress(self.x, codec)
        self.out = np.empty_like(self.x)

    def time_compress(self, codec, dtype):
        dma.compress(self.x, codec)

    def time_decompress(self, codec, dtype):
        dma.decompress(self.blob)

    def time_decompress_into(self, codec, dtype):
        dma.decompress(self.blob, out=self.out)

    def time_numpy_copyto(self, codec, dtype):
        np.copyto(self.out, self.x)


class CodecMemory:
    """Peak memory of one zvc compress / decompress of 64 MiB of fp32 ReLU activations."""

    timeout = 300

    def setup(self):
        self.x = relu("fp32")
        self.blob = dma.compress(self.x, "zvc")

    def peakmem_setup_only(self):
        pass

    def peakmem_compress_zvc(self):
        dma.compress(self.x, "zvc")

    def peakmem_decompress_zvc(self):
        dma.decompress(self.blob)


class Rates:
    """GB/s and ratios measured in one process, and the DMA model's seconds."""

    timeout = 600

    def setup(self):
        self.x = {d: relu(d) for d in DTYPES}
        self.out = {d: np.empty_like(x) for d, x in self.x.items()}
        self.blob = {d: dma.compress(x, "zvc") for d, x in self.x.items()}
        # One 8 MiB SBUF tile of each: the DMA model costs moving it HBM -> SBUF.
        self.tile = {d: x[: 8 * MIB // x.itemsize].reshape(128, -1) for d, x in self.x.items()}

    def _gbps(self, fn):
        return NBYTES / 1e9 / best_of(fn, REPEAT, warmup=True)

    def track_zvc_compress_gbps_fp32(self):
        return self._gbps(lambda: dma.compress(self.x["fp32"], "zvc"))

    def track_zvc_decompress_gbps_fp32(self):
        return self._gbps(lambda: dma.decompress(self.blob["fp32"]))

    def track_zvc_compress_gbps_bf16(self):
        return self._gbps(lambda: dma.compress(self.x["bf16"], "zvc"))

    def track_zvc_decompress_gbps_bf16(self):
        return self._gbps(lambda: dma.decompress(self.blob["bf16"]))

    def track_memcpy_gbps(self):
        return self._gbps(lambda: np.copyto(self.out["fp32"], self.x["fp32"]))

    def track_zvc_compress_vs_memcpy_fp32(self):
        copy = best_of(lambda: np.copyto(self.out["fp32"], self.x["fp32"]), REPEAT, warmup=True)
        return copy / best_of(lambda: dma.compress(self.x["fp32"], "zvc"), REPEAT, warmup=True)

    def track_zvc_decompress_vs_memcpy_fp32(self):
        copy = best_of(lambda: np.copyto(self.out["fp32"], self.x["fp32"]), REPEAT, warmup=True)
        return copy / best_of(lambda: dma.decompress(self.blob["fp32"]), REPEAT, warmup=True)

    def track_ratio_zvc_fp32(self):
        return self.blob["fp32"].ratio

    def track_ratio_zvc_bf16(self):
        return self.blob["bf16"].ratio

    def track_ratio_byteplane_bf16(self):
        return dma.compress(self.x["bf16"], "byteplane").ratio

    def track_dma_seconds_local_none_bf16(self):
        return trn2core.NeuronCore().dma_copy(self.tile["bf16"]).seconds

    def track_dma_seconds_local_zvc_bf16(self):
        return trn2core.NeuronCore().dma_copy(self.tile["bf16"], codec="zvc").seconds

    def track_dma_seconds_remote_none_bf16(self):
        return trn2core.NeuronCore().dma_copy(self.tile["bf16"], src="hbm_remote").seconds

    def track_dma_seconds_remote_zvc_bf16(self):
        core = trn2core.NeuronCore()
        return core.dma_copy(self.tile["bf16"], src="hbm_remote", codec="zvc").seconds


for _name in [n for n in vars(Rates) if n.startswith("track_")]:
    getattr(Rates, _name).unit = (
        "GB/s"
        if "gbps" in _name
        else "x memcpy"
        if "vs_memcpy" in _name
        else "seconds"
        if "dma_seconds" in _name
        else "x smaller"
    )
