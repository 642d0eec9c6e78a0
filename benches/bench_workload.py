"""asv suites for whole models (docs/workload.md): the time of one estimate (target < 20 ms)
and of a 10,000-layout search (target < 10 s), and what the model predicts (``track_*``).

Run with `make bench`, or `python benches/bench_workload.py` for the two timings once. The
predicted figures change only when the model does; the timings are the emulator's on this host.
"""

import time

from trn2core import workload

# 2 LNCs x 8 TP degrees (1..128) x 625 batch sizes = 10,000 layouts.
SEARCH_10K = {"batch": list(range(1, 626)), "prompt": 1024, "output": 256}


class WholeModel:
    timeout = 300

    def setup(self):
        self.model = workload.Model("llama-3.3-70b")
        self.inf = workload.Inference(self.model, "trn2.48xlarge", tp=64, seq_len=12800)

    def time_estimate_decode_llama70b_tp64(self):
        self.inf.decode(10_000)

    def time_estimate_prefill_llama70b_tp64(self):
        self.inf.prefill(10_000)

    def time_training_step_llama70b_ultraserver(self):
        workload.Training(self.model, "ultraserver", tp=16, pp=4, dp=4, global_batch=64,
                          seq=4096).step()  # fmt: skip

    def time_search_10000_layouts(self):
        workload.search("llama-3.1-8b", "trn2.48xlarge", objective="itl", constraints=SEARCH_10K)

    def track_itl_llama70b_tp64_ms(self):
        return self.inf.decode(10_000).seconds * 1e3

    track_itl_llama70b_tp64_ms.unit = "ms"

    def track_search_layouts_tried(self):
        r = workload.search("llama-3.1-8b", "trn2.48xlarge", objective="itl",
                            constraints=SEARCH_10K)  # fmt: skip
        return r.tried

    track_search_layouts_tried.unit = "layouts"


if __name__ == "__main__":
    w = WholeModel()
    w.setup()
    names = [n for n in dir(w) if n.startswith("time_")]
    for name in names:
        f = getattr(w, name)
        f()
        t0 = time.perf_counter()
        f()
        print(f"{name}: {(time.perf_counter() - t0) * 1e3:.2f} ms")
    print("layouts tried:", w.track_search_layouts_tried())
