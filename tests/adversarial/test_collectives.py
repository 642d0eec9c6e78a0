"""Attack surface: topology and collectives on the largest machines (UltraCluster(256):
16,384 ranks; UltraCluster(4096): 262,144): no allocation a machine size controls may abort
the interpreter (each goes through the host check, CapacityError), none may take hours, and
outputs are fresh arrays."""

from __future__ import annotations

import pytest

from ._probe import check_outcomes, probe

SETUP = """
inst = t.Instance()
one = t.Instance('trn2.3xlarge')
bufs = [np.full(64, r, np.float32) for r in range(16)]
"""

CALLS = {
    **{
        f"{c} outputs are fresh": f"fresh(inst.{c}(bufs).outputs, *bufs)"
        for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
    },
    **{
        f"{c} on one chip is fresh": (
            f"b = [np.ones(4, np.float32)]; fresh(one.{c}(b).outputs, b[0])"
        )
        for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
    },
    "numpy chips": "inst.all_reduce(bufs[:2], chips=[np.int64(0), np.uint8(5)])",
    "numpy peers": "inst.send_recv(bufs, peers=[np.int32((r + 3) % 16) for r in range(16)])",
    "estimate numpy bytes": "inst.estimate('all_reduce', np.int64(1 << 20))",
    "estimate 2**64": ("inst.estimate('all_reduce', 2**64)", "CapacityError"),
    "torus huge extent": ("t.Torus((2**40, 4))", "any"),
    "ultracluster 4096 all-reduce is refused at once": (
        "uc = t.UltraCluster(4096); b = [np.ones(1, np.float32)] * len(uc.chips)\n"
        "import time; s = time.perf_counter()\n"
        "try:\n    uc.all_reduce(b, algorithm='rdh')\n"
        "finally:\n    assert time.perf_counter() - s < 20, time.perf_counter() - s",
        "CapacityError",
    ),
}


def test_collectives_surface():
    check_outcomes(CALLS, setup=SETUP, timeout=180)


def test_the_largest_send_recv_finishes_in_seconds():
    # 262144 ranks of one byte: listing every chunk of every transfer was n^2 = 7e10 steps
    # (hours, and deaf to Ctrl-C).
    r = probe(
        """
        import time, numpy as np, trn2core as t
        uc = t.UltraCluster(4096)
        b = [np.full(1, 7, np.uint8)] * len(uc.chips)
        s = time.perf_counter()
        out = uc.send_recv(b).outputs
        print(len(out), int(out[-1][0]), time.perf_counter() - s < 60)
        """,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["262144", "7", "True"], r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "call",
    [
        "t.UltraCluster(4096).estimate('all_reduce', 1 << 30, algorithm='rdh')",
        "t.UltraCluster(4096).estimate('reduce_scatter', 1 << 20, algorithm='rdh')",
        "t.UltraCluster(4096).estimate('all_gather', 1 << 20, algorithm='ring')",
    ],
)
def test_schedules_beyond_the_host_are_refused_not_aborted(call):
    # An RDH all-reduce over 262144 ranks has 36 steps of 4.7 million transfers (10 GiB of
    # schedule); it aborted the interpreter ("memory allocation failed") under a 2 GiB cap.
    r = probe(
        f"""
        import trn2core as t
        try:
            {call}
            print("ok")
        except t.CapacityError as e:
            print("CapacityError", "schedule" in str(e))
        """,
        cap=2 << 30,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() in (["ok"], ["CapacityError", "True"]), r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["auto", "ring", "rdh", "hierarchical"])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("elements", [1, 65536])
def test_ultracluster_256_collectives_never_abort(collective, algorithm, elements):
    # 16,384 ranks: run on data, or refused (CapacityError, Trn2ValueError for an algorithm
    # that does not apply); never an abort or a hang.
    r = probe(
        f"""
        import numpy as np, trn2core as t
        uc = t.UltraCluster(256)
        b = [np.ones({elements}, np.float32)] * len(uc.chips)
        try:
            res = uc.{collective}(b, algorithm={algorithm!r})
            print("ok", len(res.outputs))
        except (t.CapacityError, t.Trn2ValueError) as e:
            print(type(e).__name__, 16384)
        """,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[1:] == ["16384"], r.stdout
