"""Attack surface: leaks. The resident memory of a process repeating a call (successful or
refused) stays flat: after a warm-up, 1000 more calls may not grow it by more than a few MiB."""

from __future__ import annotations

import pytest

from ._probe import probe

CALLS = {
    "quantize": "t.quantize(x, 'bf16', rounding='stochastic', seed=1)",
    "gemm": "t.gemm(a, a)",
    "chip-gemm": "t.gemm(a, a, core=chip)",
    "compress": "t.dma.decompress(t.dma.compress(x, 'zvc'))",
    "prune": "t.compress(t.prune(x.reshape(64, 64), '2:4'), '2:4').decompress()",
    "all_reduce": "inst.all_reduce(bufs)",
    "all_gather": "inst.all_gather(bufs)",
    "estimate": "inst.estimate('all_reduce', 1 << 20)",
    "alloc-free": "core.free(core.alloc(4096, space='hbm'))",
    "refused": "expect_error(lambda: t.quantize(x, 'nope'))",
    "refused-capacity": "expect_error(lambda: t.stochastic_bits((2**40,), seed=1))",
    "corrupt-stream": "expect_error(lambda: t.dma.decompress(b'TRN2' + bytes(64)))",
    "interrupted-style-error": "expect_error(lambda: inst.all_reduce(bufs[:3]))",
}

FAST = ["quantize", "all_reduce", "refused"]


def _rss_growth(call: str, n: int) -> tuple[float, float]:
    r = probe(
        f"""
        import numpy as np, trn2core as t
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096 / 2**20
        def expect_error(f):
            try:
                f()
            except t.Trn2Error:
                return
            raise AssertionError("no error")
        x = np.linspace(-1, 1, 4096, dtype=np.float32)
        a = np.ones((128, 128), np.float32)
        chip = t.Chip()
        inst = t.Instance()
        core = t.NeuronCore()
        bufs = [np.full(256, r, np.float32) for r in range(16)]
        for _ in range(100):
            {call}
        base = rss()
        for _ in range({n} // 2):
            {call}
        mid = rss()
        for _ in range({n} - {n} // 2):
            {call}
        print(mid - base, rss() - mid)
        """,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    first, second = (float(v) for v in r.stdout.split())
    return first, second


def _check(name: str, n: int) -> None:
    first, second = _rss_growth(CALLS[name], n)
    # A leak grows with every call: both halves would grow alike. Allocator noise settles.
    assert second < 4.0, (name, first, second)


@pytest.mark.parametrize("name", FAST)
def test_rss_is_flat_over_repeated_calls(name):
    _check(name, 200)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CALLS))
def test_rss_is_flat_over_1000_calls(name):
    _check(name, 1000)
