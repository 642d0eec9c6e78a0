"""``nki.collectives`` across the ranks of a multi-rank launch (``trn2core.nki.run(kernel,
..., ranks=N)``): ``rank_id``, ``ReplicaGroup`` and ``all_gather`` (docs/nki.md, "Collectives
across ranks"). Small kernels of our own."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import trn2core.nki as tn
from trn2core import Trn2Error
from trn2core.nki._collectives import ReplicaGroup, all_gather, rank_id

nl, nisa = tn.language, tn.isa


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _bits(*shape, seed=0):
    """float32 arrays of arbitrary bits (NaNs and subnormals among them): a gather moves
    bytes, so every one must arrive."""
    r = np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint64)
    return r.astype(np.uint32).view(np.float32)


def _same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@tn.jit
def _my_rank(x):
    """Rank r's slice x[r], selected by its rank_id register as a scalar_offset."""
    _, h, w = x.shape
    out = nl.ndarray((h, w), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x.ap(pattern=[[w, h], [1, w]], scalar_offset=rank_id(),
                                    indirect_dim=0))  # fmt: skip
    return out


def test_rank_id_is_each_ranks_index_in_a_register():
    x = _bits(3, 4, 8)
    res = tn.run(_my_rank, x, ranks=3)
    assert [_same_bits(o, x[r]) for r, o in enumerate(res.outputs)] == [True] * 3
    assert _same_bits(_my_rank(x), x[0]), "a one-rank launch is rank 0"


@tn.jit
def _gather_sb(x, groups, dim):
    p, f = x.shape
    n = len(groups[0])
    src = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    shape = (p, f * n) if dim == 1 else (p * n, f)
    dst = nl.ndarray(shape, dtype=x.dtype, buffer=nl.sbuf)
    all_gather(srcs=[src], dsts=[dst], replica_group=ReplicaGroup(groups), collective_dim=dim)
    out = nl.ndarray(shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("dim", [1, 0])
def test_all_gather_in_sbuf_concatenates_every_ranks_bits(dim):
    xs = [_bits(32, 16, seed=r) for r in range(4)]
    res = tn.run(_gather_sb, tn.PerRank(xs), [[0, 1, 2, 3]], dim, ranks=4)
    want = np.concatenate(xs, axis=dim)
    assert all(_same_bits(o, want) for o in res.outputs)
    assert res.report.opcodes["dma_copy"] == 2 + 4, "a load, one copy per slot, a store"


def test_all_gather_takes_each_group_in_its_rank_order():
    xs = [_bits(8, 4, seed=10 + r) for r in range(4)]
    res = tn.run(_gather_sb, tn.PerRank(xs), [[2, 0], [1, 3]], 1, ranks=4)
    a, b = np.concatenate([xs[2], xs[0]], 1), np.concatenate([xs[1], xs[3]], 1)
    assert [_same_bits(o, w) for o, w in zip(res.outputs, (a, b, a, b), strict=True)] == [True] * 4


@tn.jit
def _gather_hbm(x, y):
    """Coalesced: two HBM tensors gathered along dimension 0 in one call."""
    n = 3
    gx = nl.ndarray((x.shape[0] * n, *x.shape[1:]), dtype=x.dtype, buffer=nl.shared_hbm)
    gy = nl.ndarray((y.shape[0] * n, *y.shape[1:]), dtype=y.dtype, buffer=nl.shared_hbm)
    all_gather(srcs=[x, y], dsts=[gx, gy], replica_group=ReplicaGroup([[0, 1, 2]]),
               collective_dim=0)  # fmt: skip
    return gx, gy


def test_all_gather_in_hbm_coalesced():
    import ml_dtypes

    xs = [_bits(2, 3, 4, seed=20 + r) for r in range(3)]
    ys = [_bits(5, 6, seed=30 + r).view(np.uint16).view(ml_dtypes.bfloat16) for r in range(3)]
    res = tn.run(_gather_hbm, tn.PerRank(xs), tn.PerRank(ys), ranks=3)
    for gx, gy in res.outputs:
        assert _same_bits(gx, np.concatenate(xs))
        assert np.array_equal(gy.view(np.uint16), np.concatenate(ys).view(np.uint16))


@tn.jit
def _gather_lnc2(x):
    """At LNC=2 each physical core gathers its own half of ``x``'s rows (with the same core
    of every other rank)."""
    pid = nl.program_id(0)
    h = x.shape[0] // 2
    src = nl.ndarray((h, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x[pid * h : (pid + 1) * h, :])
    dst = nl.ndarray((h, x.shape[1] * 2), dtype=x.dtype, buffer=nl.sbuf)
    all_gather(srcs=[src], dsts=[dst], replica_group=ReplicaGroup([[0, 1]]), collective_dim=1)
    out = nl.ndarray((x.shape[0], x.shape[1] * 2), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[pid * h : (pid + 1) * h, :], src=dst)
    return out


def test_all_gather_at_lnc2_pairs_each_physical_core_across_ranks():
    xs = [_bits(64, 8, seed=40 + r) for r in range(2)]
    res = tn.run(_gather_lnc2, tn.PerRank(xs), grid=2, ranks=2)
    want = np.concatenate(xs, axis=1)
    assert all(_same_bits(o, want) for o in res.outputs)
    assert res.report.lnc == 2


@tn.jit
def _slow_rank(x, spin):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for _ in range(spin):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=1.0)
    g = nl.ndarray((x.shape[0], x.shape[1] * 2), dtype=x.dtype, buffer=nl.sbuf)
    all_gather(srcs=[t], dsts=[g], replica_group=ReplicaGroup([[0, 1]]), collective_dim=1)
    out = nl.ndarray(g.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=g)
    return out


def test_all_gather_waits_for_the_latest_rank():
    x = np.ones((16, 16), np.float32)
    quick = tn.run(_slow_rank, x, 0, ranks=2)
    slow = tn.run(_slow_rank, x, tn.PerRank([0, 50]), ranks=2)
    assert all(np.array_equal(o, np.ones((16, 32), np.float32)) for o in slow.outputs)
    # Rank 0's own instructions are the same; it waits at the gather for rank 1's spin.
    assert slow.report.opcodes == quick.report.opcodes
    assert slow.report.seconds > quick.report.seconds + 50 * 50e-9


def _raises(kernel, *args, arg, line_text, **kw):
    with pytest.raises(Trn2Error) as info:
        tn.run(kernel, *args, **kw)
    assert info.value.arg == arg, str(info.value)
    assert str(info.value).startswith(f"{__file__}:{_line_of(kernel, line_text)}:"), str(info.value)
    return info.value


@tn.jit
def _bad_gather(x, groups, dim, dst_rows, buffer):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray((dst_rows, x.shape[1] * 2), dtype=x.dtype, buffer=buffer)
    all_gather(srcs=[src], dsts=[dst], replica_group=groups, collective_dim=dim)  # bad
    return x


@pytest.mark.parametrize(
    ("groups", "dim", "rows", "buffer", "ranks", "arg", "words"),
    [
        ([[0, 1, 2]], 1, 8, "sbuf", 2, "replica_group", "names rank 2"),
        ([[1]], 1, 8, "sbuf", 2, "replica_group", "rank 0 is in none"),
        ("[[0, 1]]", 1, 8, "sbuf", 2, "replica_group", "expected a nki.collectives.ReplicaGroup"),
        ([[0, 1]], 2, 8, "sbuf", 2, "collective_dim", "dimension 0 or 1"),
        ([[0, 1]], 1, 4, "sbuf", 2, "dsts", "fills a (8, 8) destination"),
        ([[0, 1]], 1, 8, "shared_hbm", 2, "dsts", "all in HBM or all in SBUF"),
    ],
)
def test_all_gather_refuses_bad_input_at_the_kernels_line(
    groups, dim, rows, buffer, ranks, arg, words
):
    x = np.ones((8, 4), np.float32)
    rg = ReplicaGroup(groups) if isinstance(groups, list) else groups
    e = _raises(_bad_gather, x, rg, dim, rows, getattr(nl, buffer), ranks=ranks, arg=arg,
                line_text="# bad")  # fmt: skip
    assert words in str(e), str(e)


def test_replica_group_and_ranks_refuse_bad_values():
    for groups, words in (([[0, 1], [1, 2]], "in two groups"), ([], "non-empty"),
                          ([[0, -1]], "negative"), ([[0, 1.5]], "rank ids")):  # fmt: skip
        with pytest.raises(Trn2Error, match=words) as info:
            ReplicaGroup(groups)
        assert info.value.arg == "groups"
    x = np.zeros((2, 4, 8), np.float32)
    for ranks in (0, -2, 1.5, True):
        with pytest.raises(Trn2Error) as info:
            tn.run(_my_rank, x, ranks=ranks)
        assert info.value.arg == "ranks"
    with pytest.raises(Trn2Error, match="PerRank holds 2 values for a launch of 3 ranks") as info:
        tn.run(_my_rank, tn.PerRank([x, x]), ranks=3)
    assert info.value.arg == "x"
    for launch in (lambda: tn.run(_my_rank, tn.PerRank([x])), lambda: _my_rank(tn.PerRank([x]))):
        with pytest.raises(Trn2Error, match="a PerRank argument goes to a launch of several"):
            launch()


@tn.jit
def _rank1_skips(x, gather):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    g = nl.ndarray((x.shape[0], x.shape[1] * 2), dtype=x.dtype, buffer=nl.sbuf)
    if gather:
        all_gather(srcs=[t], dsts=[g], replica_group=ReplicaGroup([[0, 1]]), collective_dim=1)
    return x


def test_a_rank_that_never_gathers_fails_the_waiting_one():
    with pytest.raises(Trn2Error, match="has no match: rank 1 ended after 0 such calls") as info:
        tn.run(_rank1_skips, np.ones((4, 4), np.float32), tn.PerRank([True, False]), ranks=2)
    assert str(info.value).startswith(f"{__file__}:{_line_of(_rank1_skips, 'all_gather(')}:")


def test_the_legacy_compilers_collectives_are_refused_by_name():
    with tn.install():
        import nki.collectives as ncc
        from neuronxcc.nki import compiler

        with pytest.raises(tn.NotSupportedError, match="neuronxcc.nki.compiler.all_reduce"):
            compiler.all_reduce([], [], None, None)
        assert ncc.rank_id is rank_id and ncc.ReplicaGroup is ReplicaGroup


@tn.jit
def _ring(x, lookup, groups, steps):
    """``steps`` ring steps of a two-channel implicit collective permute (each channel half of
    ``x``'s columns); after each, the rank whose data arrived, from
    collective_permute_implicit_current_processing_rank_id, picks the output row it goes to
    (a scalar_offset, through ``lookup`` [[0, 1, ..]]): an all-gather by hand."""
    from trn2core.nki._collectives import (
        collective_permute_implicit,
        collective_permute_implicit_current_processing_rank_id,
    )

    p, f = x.shape
    n = len(groups[0])
    rg = ReplicaGroup(groups)
    out = nl.ndarray((n, p, f), dtype=x.dtype, buffer=nl.shared_hbm)
    bufs = [nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf) for _ in range(2)]
    nisa.dma_copy(dst=bufs[0], src=x)
    for it in range(steps + 1):
        if it:
            a, b = bufs[(it - 1) % 2], bufs[it % 2]
            h = f // 2
            collective_permute_implicit(
                srcs_by_channel=[[a[:, 0:h]], [a[:, h:f]]],
                dsts_by_channel=[[b[:, 0:h]], [b[:, h:f]]],
                replica_group=rg,
                channel_ids=[0, 1],
            )
        who = collective_permute_implicit_current_processing_rank_id(
            iteration_id=it, replica_group=rg, channel_id=1
        )
        row = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=row, src=lookup.ap(pattern=[[n, 1], [1, 1]], scalar_offset=who,
                                             indirect_dim=1))  # fmt: skip
        nisa.dma_copy(dst=out.ap(pattern=[[f, p], [1, f]], scalar_offset=row, indirect_dim=0),
                      src=bufs[it % 2])  # fmt: skip
    return out


def test_collective_permute_implicit_passes_data_round_the_ring():
    xs = [_bits(16, 8, seed=50 + r) for r in range(3)]
    lookup = np.arange(3, dtype=np.int32).reshape(1, 3)
    res = tn.run(_ring, tn.PerRank(xs), lookup, [[0, 1, 2]], 2, ranks=3)
    assert all(_same_bits(o, np.stack(xs)) for o in res.outputs)
    # The ring is the group's order: [2, 0, 1] sends 2 -> 0 -> 1 -> 2.
    ys = [_bits(16, 8, seed=60 + r) for r in range(3)]
    res = tn.run(_ring, tn.PerRank(ys), lookup, [[2, 0, 1]], 1, ranks=3, uninitialized="nan")
    for r, o in enumerate(res.outputs):
        pred = {0: 2, 1: 0, 2: 1}[r]
        assert _same_bits(o[r], ys[r]) and _same_bits(o[pred], ys[pred])


@tn.jit
def _bad_permute(x, how):
    from trn2core.nki._collectives import (
        collective_permute_implicit,
        collective_permute_implicit_current_processing_rank_id,
    )

    rg = ReplicaGroup([[0, 1]])
    a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    srcs, dsts, ids, it = [[a]], [[b]], [0], 0
    if how == "ids":
        ids = [1]
    elif how == "two":
        srcs, dsts = [[a, a]], [[b, b]]
    elif how == "shape":
        dsts = [[b[:, 0:2]]]
    elif how == "iteration":
        it = -1
    collective_permute_implicit(srcs_by_channel=srcs, dsts_by_channel=dsts,
                                replica_group=rg, channel_ids=ids)  # fmt: skip # bad
    collective_permute_implicit_current_processing_rank_id(iteration_id=it, replica_group=rg)  # bad
    return x


@pytest.mark.parametrize(
    ("how", "arg", "line"),
    [
        ("ids", "channel_ids", "collective_permute_implicit(srcs_by"),
        ("two", "srcs_by_channel", "collective_permute_implicit(srcs_by"),
        ("shape", "dsts_by_channel", "collective_permute_implicit(srcs_by"),
        ("iteration", "iteration_id", "iteration_id=it"),
    ],
)
def test_collective_permute_implicit_refuses_bad_input_at_the_kernels_line(how, arg, line):
    _raises(_bad_permute, np.ones((4, 4), np.float32), how, ranks=2, arg=arg, line_text=line)


@tn.jit
def _rank_fails(x, fail):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if fail:
        nisa.dma_copy(dst=t[:, 0:2], src=x)  # fails
    g = nl.ndarray((x.shape[0], x.shape[1] * 2), dtype=x.dtype, buffer=nl.sbuf)
    all_gather(srcs=[t], dsts=[g], replica_group=ReplicaGroup([[0, 1]]), collective_dim=1)
    return x


def test_a_failing_rank_raises_its_own_error_not_the_waiting_ranks():
    with pytest.raises(Trn2Error) as info:
        tn.run(_rank_fails, np.ones((4, 4), np.float32), tn.PerRank([False, True]), ranks=2)
    assert str(info.value).startswith(f"{__file__}:{_line_of(_rank_fails, '# fails')}:")


def test_ranks_gathering_different_shapes_are_a_mismatch():
    xs = [np.ones((4, 4), np.float32), np.ones((4, 2), np.float32)]
    with pytest.raises(Trn2Error, match=r"does not match its call at .* on rank 1"):
        tn.run(_rank_fails, tn.PerRank(xs), False, ranks=2)
