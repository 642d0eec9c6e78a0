"""Attack surface: device memory accounts (NeuronCore.alloc/free, HbmStack shared by two
cores, a chip's physical cores): any sequence of allocations and frees across cores leaves
every account equal to the sum of its live allocations, and zero at the end."""

from __future__ import annotations

from ._probe import check_outcomes, probe

SETUP = """
from trn2core.memory import HbmStack
c0, c1 = t.NeuronCore(0), t.NeuronCore(1)
"""

CALLS = {
    "foreign free": ("a = c1.alloc(4096, space='hbm'); c0.free(a)", "Trn2ValueError"),
    "foreign sbuf free": ("a = c1.alloc(128); c0.free(a)", "Trn2ValueError"),
    "double free": ("a = c0.alloc(128); c0.free(a); c0.free(a)", "Trn2ValueError"),
    "numpy sizes": "c0.free(c0.alloc(np.int64(256))); c0.free(c0.alloc((np.uint8(4), 4), 'bf16'))",
    "huge shape": ("c0.alloc((2**32, 2**32), 'bf16', space='hbm')", "CapacityError"),
    "beyond u64": ("c0.alloc(2**70, space='hbm')", "CapacityError"),
    "bool size": ("c0.alloc(True)", "Trn2ValueError"),
}


def test_memory_surface():
    check_outcomes(CALLS, setup=SETUP)


def test_accounts_balance_after_random_alloc_free_sequences_across_cores():
    r = probe(
        """
        import random, numpy as np, trn2core as t
        from trn2core.memory import HbmStack
        rnd = random.Random(19)
        stacks = [HbmStack(i) for i in range(4)]
        cores = [t.NeuronCore(i, hbm=stacks[i // 2]) for i in range(8)]
        cores += list(t.Chip(lnc=1).physical_cores) + [t.NeuronCore(3)]
        live, refused, foreign = [], 0, 0

        def stack_of(c):
            return c.memory.hbm_stack._native

        def check():
            for c in cores:
                for sp in ("sbuf", "psum"):
                    u = getattr(c, sp)._usage()
                    want = [a for o, a, s in live if o is c and s == sp]
                    assert u.used == sum(a.nbytes for a in want), (sp, u, len(want))
                    assert u.allocations == len(want), (sp, u, len(want))
                u = c.hbm._usage()
                want = [a for o, a, s in live if s == "hbm" and o.hbm._usage() is not None
                        and same_stack(o, c)]
                assert u.used == sum(a.nbytes for a in want), ("hbm", u, len(want))

        def same_stack(a, b):
            ua, ub = a.memory.hbm_stack, b.memory.hbm_stack
            return ua._native.placement().index == ub._native.placement().index and (
                (a in cores[:8]) == (b in cores[:8])) and (a in cores[:8] or a is b or
                (a in cores[8:16] and b in cores[8:16]))

        for step in range(4000):
            c = rnd.choice(cores)
            if rnd.random() < 0.55 or not live:
                space = rnd.choice(["hbm", "sbuf", "psum"])
                size = rnd.choice([0, 1, 128, 4096, 1 << 20, 1 << 30, 5 << 30, 1 << 40,
                                   (128, 64), (4, 4), (0, 9)])
                try:
                    dt = np.float32 if isinstance(size, tuple) else None
                    live.append((c, c.alloc(size, dt, space=space), space))
                except t.CapacityError:
                    refused += 1
            else:
                owner, a, space = live[i := rnd.randrange(len(live))]
                target = rnd.choice(cores)
                try:
                    target.free(a)
                    live.pop(i)
                except t.Trn2ValueError:
                    foreign += 1
            if step % 97 == 0:
                check()
        check()
        for owner, a, space in live:
            owner.free(a)
        live.clear()
        check()
        for c in cores:
            for sp in ("hbm", "sbuf", "psum"):
                u = getattr(c, sp)._usage()
                assert u.used == 0 and u.allocations == 0, (sp, u)
        print("balanced", refused > 0, foreign > 0)
        """,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["balanced", "True", "True"], r.stdout
