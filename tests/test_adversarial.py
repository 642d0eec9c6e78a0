"""Robustness, second pass (issue 19): probes of the attacks the first pass missed. Every probe
that could crash, hang or exhaust memory runs in a subprocess with an address-space cap and a
timeout, so a crash or a hang is a failed test, not a dead run.

Organised by attack surface: concurrency (fork), environment, host limits before copies,
arithmetic, paths, streams.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import trn2core as t
from trn2core import CapacityError, CorruptDataError, Trn2ValueError

CAP = 8 << 30  # address-space cap of a probe: far below what any refused call would need


def probe(
    code: str, *, env: dict | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter capped at CAP bytes of address space."""
    head = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({CAP}, {CAP}))\n"
    return subprocess.run(
        [sys.executable, "-c", head + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# -- concurrency: fork ------------------------------------------------------------------------


def test_a_forked_child_runs_parallel_work_after_the_parent_did():
    # The parent's thread pool has no threads in a forked child; the child must start its own
    # (it used to wait forever for the parent's workers).
    r = probe(
        """
        import os, numpy as np, trn2core as t
        a = np.ones((512, 512), np.float32)
        assert t.gemm(a, a).out[0, 0] == 512.0
        pid = os.fork()
        if pid == 0:
            ok = t.gemm(a, a).out[0, 0] == 512.0 and t.quantize(a, "bf16").shape == a.shape
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"], r.stdout


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_multiprocessing_workers_compute_after_the_parent(method, tmp_path):
    # A script file: forkserver and spawn re-import the main module in their workers.
    script = tmp_path / "workers.py"
    script.write_text(textwrap.dedent(
        f"""
        import multiprocessing as mp, numpy as np, trn2core as t

        def work(n):
            a = np.full((256, 256), n, np.float32)
            return float(t.gemm(a, a).out[0, 0])

        if __name__ == "__main__":
            work(1)  # the parent's pool starts first
            with mp.get_context("{method}").Pool(2) as pool:
                print(pool.map(work, [1, 2, 3]))
        """
    ))  # fmt: skip
    r = probe(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[256.0, 1024.0, 2304.0]", r.stdout


# -- environment ------------------------------------------------------------------------------


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


# -- host limits before copies ----------------------------------------------------------------

BIG = 2**33  # elements of a broadcast view: nothing behind it, 32-64 GiB as a copy


@pytest.mark.parametrize(
    "call",
    [
        "t.quantize(np.broadcast_to(np.float64(1), (BIG,)), 'bf16')",
        "t.encode(np.broadcast_to(np.float64(1), (BIG,)), 'fp8_e4m3')",
        "t.decode(np.broadcast_to(np.uint8(1), (BIG,)), 'fp8_e4m3')",
        "t.prune(np.broadcast_to(np.float32(1), (2**17, 2**16)), '2:4')",
        "t.compress(np.broadcast_to(np.float32(0), (2**17, 2**16)), '2:4')",
        "t.dma.compress(np.broadcast_to(np.float32(0), (BIG,)), 'zvc')",
    ],
)
def test_a_broadcast_view_is_refused_before_numpy_copies_it(call):
    r = probe(
        f"""
        import numpy as np, trn2core as t
        BIG = {BIG}
        try:
            {call}
            print("no error")
        except t.CapacityError as e:
            print("CapacityError")
        """,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "CapacityError", (r.stdout, r.stderr[-500:])


# -- arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ["t.Chip()", "t.Chip(lnc=2).cores[0]"])
def test_estimate_gemm_near_2_64_is_refused_with_the_shape_as_given(make):
    core = eval(make)  # noqa: S307 - a fixed expression of this test
    with pytest.raises(CapacityError) as e:
        t.estimate_gemm(2**63, 2**63, 128, core=core)
    # The message carries the dimensions as given (M used to come out divided by the split).
    assert f"M={2**63}" in str(e.value) and f"K={2**63}" in str(e.value)


def test_numpy_integer_seeds_are_accepted():
    a = np.ones((8, 8), np.float32) / 3
    want = t.gemm(a, a, dtype="bf16", rounding="stochastic", seed=5).out
    for seed in (np.int64(5), np.uint32(5), np.int8(5)):
        got = t.gemm(a, a, dtype="bf16", rounding="stochastic", seed=seed).out
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# -- paths ------------------------------------------------------------------------------------


def test_a_path_with_a_nul_byte_is_a_trn2_error(tmp_path):
    rep = t.gemm(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)).report
    with pytest.raises(Trn2ValueError, match="NUL"):
        rep.save_trace(str(tmp_path / "a\0b.json"))


# -- DMA streams ------------------------------------------------------------------------------


def test_an_altered_stream_dtype_is_corrupt_data():
    blob = t.dma.compress(np.arange(64, dtype=np.float32), "zvc").to_bytes()
    i = blob.find(b"<f4")
    assert i > 0
    forged = blob[:i] + b"<U1" + blob[i + 3 :]  # a 4-byte string dtype: not a number
    with pytest.raises(CorruptDataError):
        t.dma.decompress(t.dma.Compressed.from_bytes(forged))


@pytest.mark.parametrize(
    "kwargs",
    [{"accumulate": True}, {"perf_mode": "double_row"}, {"tile_position": (0, 0)},
     {"tile_size": (128, 128)}],
)  # fmt: skip
def test_transpose_mode_refuses_the_arguments_it_ignores(kwargs):
    s = np.ones((128, 128), np.float32)
    with pytest.raises(Trn2ValueError, match=f"{next(iter(kwargs))}: transpose mode"):
        t.NeuronCore().matmul(s, s, is_transpose=True, **kwargs)
