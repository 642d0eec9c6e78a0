"""Attack surface: concurrency: fork, forkserver and spawn workers after the parent computed,
threads sharing a core and a machine while others allocate and free."""

from __future__ import annotations

import textwrap

import pytest

from ._probe import probe


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
    script.write_text(
        textwrap.dedent(
            f"""
        import multiprocessing as mp, numpy as np, trn2core as t

        def work(n):
            a = np.full((256, 256), n, np.float32)
            inst = t.Instance("trn2.3xlarge")
            s = inst.all_reduce([np.full(8, n, np.float32)]).outputs[0][0]
            return float(t.gemm(a, a).out[0, 0]) + float(s)

        if __name__ == "__main__":
            work(1)  # the parent's pool starts first
            with mp.get_context("{method}").Pool(2) as pool:
                print(pool.map(work, [1, 2, 3]))
        """
        )
    )
    r = probe(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", timeout=90)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[257.0, 1026.0, 2307.0]", r.stdout


def test_a_fork_while_another_thread_computes():
    # The child is forked while a parent thread is inside a parallel GEMM (the pool's locks
    # may be held): the child still computes, and the parent's thread finishes right.
    r = probe(
        """
        import os, threading, numpy as np, trn2core as t
        a = np.ones((1024, 1024), np.float32)
        done = []
        th = threading.Thread(target=lambda: done.append(
            all(t.gemm(a, a).out[0, 0] == 1024.0 for _ in range(5))))
        th.start()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if t.gemm(a[:64], a[:, :64]).out[0, 0] == 1024.0 else 3)
        _, status = os.waitpid(pid, 0)
        th.join()
        print(os.waitstatus_to_exitcode(status), done)
        """,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "[True]"], r.stdout


def test_forks_racing_another_threads_first_call():
    # Forty children forked, without waiting, while another thread makes the process's first
    # call. Everything built on first use (numpy's C API table and borrow-checking capsule,
    # crossbeam-epoch's collector that rayon's workers start) is behind a once-cell; a child
    # forked mid-build inherited it as "being built" and waited forever. Before these were
    # built at import, 4 of 6 interpreters here had a hung child (numpy's table), and then 2
    # of 30 (the collector). A hung child is killed by its alarm and counted.
    code = """
        import os, signal, sys, threading, numpy as np, trn2core as t
        sys.setswitchinterval(1e-6)
        a = np.ones((64, 64), np.float32)
        def calls():
            return (t.gemm(a, a).out[0, 0] == 64.0
                    and t.decode(t.encode(a[0], "fp8_e4m3"), "fp8_e4m3")[0] == 1.0)
        go = threading.Event()
        th = threading.Thread(target=lambda: (go.wait(), calls()))
        th.start()
        go.set()
        pids = []
        for _ in range(40):
            pid = os.fork()
            if pid == 0:
                signal.alarm(10)
                os._exit(0 if calls() else 3)
            pids.append(pid)
        th.join()
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        print(sum(c != 0 for c in codes))
        """
    for _ in range(6):
        r = probe(code, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["0"], r.stdout


def test_threads_sharing_a_core_and_memory_balance():
    r = probe(
        """
        import threading, numpy as np, trn2core as t
        core = t.NeuronCore()
        s = np.eye(128, dtype=np.float32)
        errors = []
        def matmuls(bank):
            for _ in range(10):
                if core.matmul(s, s, bank=bank)[5, 5] != 1.0:
                    errors.append(bank)
        def allocs():
            for _ in range(200):
                core.free(core.alloc(4096, space="hbm"))
        ths = [threading.Thread(target=matmuls, args=(b,)) for b in range(4)]
        ths += [threading.Thread(target=allocs) for _ in range(4)]
        for th in ths: th.start()
        for th in ths: th.join()
        u = core.hbm._usage()
        print(errors, u.used, u.allocations)
        """,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "0", "0"], r.stdout


def test_threads_allocating_while_another_costs_a_dma_copy_on_the_same_core():
    # A dma_copy costs with the GIL released; an alloc or free of another thread on the same
    # core then raised pyo3's "RuntimeError: Already borrowed" (a `&mut self` method).
    r = probe(
        """
        import threading, numpy as np, trn2core as t
        core = t.NeuronCore()
        x = np.ones(1 << 16, np.float32)
        errors = []
        def work():
            try:
                for _ in range(300):
                    core.free(core.alloc((128, 64), np.float32))
                    core.dma_copy(x)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
        ths = [threading.Thread(target=work) for _ in range(4)]
        for th in ths: th.start()
        for th in ths: th.join()
        print(repr(sorted(set(errors))), core.sbuf.used, core.sbuf.allocations)
        """,
        timeout=90,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "0", "0"], r.stdout
