"""Attack surface: NKI launches (issue 28): launches from several threads at once (the running
kernel's core is per thread), what a finished launch leaves behind (its machines must be freed
when it ends, without waiting for the cyclic garbage collector), and grids too large to ever
finish (lazy: Ctrl-C stops them; no 10**12 program tuples built first)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from ._probe import _child_setup, probe

KERNEL = """
import gc, threading
import numpy as np
import trn2core.nki as tn
nl = tn.language

@tn.jit
def add(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x) + nl.load(y))
    return out

x = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
"""


def test_threads_launch_kernels_each_on_its_own_core():
    r = probe(
        KERNEL
        + """
import sys
sys.setswitchinterval(1e-6)  # threads interleave inside launches, as under load

@tn.jit
def chain(x, y):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    acc = nl.load(x)
    for _ in range(32):
        zero = nl.zeros(x.shape, dtype=x.dtype)  # allocated on the running core
        acc = acc + nl.load(y) + zero
    nl.store(out, value=acc)
    return out

failures = []
start = threading.Barrier(4)
def work(k):
    start.wait()
    for i in range(8):
        try:
            got = chain(x, np.full_like(x, k * 8 + i))
            assert np.array_equal(got, x + 32 * (k * 8 + i)), "wrong values"
        except BaseException as e:
            failures.append(f"{type(e).__name__}: {e}")
threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print("failures", len(failures), failures[:2])
""",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "failures 0 []" in r.stdout, r.stdout


def test_a_finished_launch_leaves_no_cycle_and_memory_stays_flat():
    r = probe(
        KERNEL
        + """
from trn2core.nki import _runtime
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
gc.collect()
gc.disable()
add(x, x)
gc.set_debug(gc.DEBUG_SAVEALL)
gc.collect()
kept = [type(o).__name__ for o in gc.garbage if isinstance(o, (_runtime.Core, _runtime.Launch))]
gc.set_debug(0)
gc.garbage.clear()
print("cyclic", kept)
for _ in range(20):
    add(x, x)
base = rss()
for _ in range(300):
    add(x, x)
print("growth %.0f" % (rss() - base))
""",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cyclic []" in r.stdout, r.stdout
    growth = float(r.stdout.split("growth ")[1])
    # Before: ~28 MB per launch until the cyclic GC ran (gc disabled here: 300 launches, GiBs).
    assert growth < 64, r.stdout


def test_a_grid_of_10_to_the_12_programs_starts_at_once_and_stops_on_ctrl_c():
    code = (
        KERNEL
        + """
import sys
@tn.jit_legacy
def one(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    print("program", flush=True)
    nl.store(out, value=nl.load(x))
    return out
one[10**6, 10**6](x)
"""
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_child_setup,
    )
    # A launch that builds its grid first never prints: the timer ends it, the test fails.
    timer = threading.Timer(30, p.kill)
    timer.start()
    try:
        assert p.stdout is not None
        # The first program runs at once (no 10**12 tuples built first).
        assert p.stdout.readline() == "program\n"
        p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=10)
        assert time.monotonic() - t0 < 5
        assert "KeyboardInterrupt" in err, err[-2000:]
    finally:
        timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
