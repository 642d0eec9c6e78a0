"""Attack surface: the environment (TRN2CORE_HOST_MEMORY, RAYON_NUM_THREADS,
NEURON_RT_STOCHASTIC_ROUNDING_SEED): documented forms work, garbage is a clear Trn2Error
naming the variable or is ignored as documented, nothing hangs."""

from __future__ import annotations

import pytest

from ._probe import probe


@pytest.mark.parametrize("value", ["8MiB", "8 MiB", "8M", "8388608"])
def test_host_memory_limit_takes_the_documented_forms(value):
    r = probe(
        """
        import numpy as np, trn2core as t
        try:
            t.quantize(np.ones(3 << 20, np.float32), "fp32")   # a 12 MiB result
            print("allowed")
        except t.CapacityError as e:
            print("refused", "8.0 MiB" in str(e) or "8388608" in str(e))
        """,
        env={"TRN2CORE_HOST_MEMORY": value},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "True"], (r.stdout, r.stderr)


@pytest.mark.parametrize("value", ["lots", "-5", "8XB", "1e999999999", ""])
def test_a_garbage_host_memory_limit_is_refused_clearly(value):
    r = probe(
        """
        import numpy as np, trn2core as t
        try:
            t.quantize(np.ones(4, np.float32), "bf16")
            print("allowed")
        except t.Trn2ValueError as e:
            print("refused", "TRN2CORE_HOST_MEMORY" in str(e))
        """,
        env={"TRN2CORE_HOST_MEMORY": value},
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    # An empty value means unset; everything else is an error naming the variable.
    want = ["allowed"] if value == "" else ["refused", "True"]
    assert r.stdout.split() == want, (r.stdout, r.stderr)


@pytest.mark.parametrize("value", ["0", "abc", "-1", "100000", "1", "3"])
def test_any_rayon_thread_count_computes_promptly(value):
    # RAYON_NUM_THREADS=100000 made the first call start 100000 threads: minutes before
    # anything ran (the pool is now capped at max(4 per CPU, 64) threads, pool.rs).
    r = probe(
        """
        import time, numpy as np, trn2core as t
        s = time.perf_counter()
        a = np.ones((512, 512), np.float32)
        ok = t.gemm(a, a).out[0, 0] == 512.0 and t.quantize(a, "bf16").shape == a.shape
        print(ok, time.perf_counter() - s < 20)
        """,
        env={"RAYON_NUM_THREADS": value},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"], r.stdout


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("abc", "Trn2ValueError"),
        ("-1", "Trn2ValueError"),
        ("99999999999999999999999", "Trn2ValueError"),
        ("", "ok"),
        ("0x10", "ok"),
        ("16", "ok"),
    ],
)
def test_the_runtime_seed_variable(value, want):
    r = probe(
        """
        import numpy as np, trn2core as t
        try:
            t.quantize(np.ones(8, np.float32) / 3, "bf16", rounding="stochastic")
            print("ok")
        except t.Trn2Error as e:
            print(type(e).__name__, "NEURON_RT_STOCHASTIC_ROUNDING_SEED" in str(e))
        """,
        env={"NEURON_RT_STOCHASTIC_ROUNDING_SEED": value},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == want, r.stdout
    if want != "ok":
        assert r.stdout.split()[1] == "True"
