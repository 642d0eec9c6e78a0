"""``nki.collectives``' reductions and exchanges across the ranks of a multi-rank launch:
``all_reduce``, ``reduce_scatter``, ``all_to_all``, ``collective_permute`` and
``collective_permute_implicit_reduce`` (docs/nki.md, "Collectives across ranks"). Small kernels
of our own; the references sum in the order docs/collectives.md gives for ``mesh``."""

from __future__ import annotations

import functools
import inspect

import ml_dtypes
import numpy as np
import pytest
import trn2core.nki as tn
from trn2core import Trn2Error
from trn2core.nki._collectives import (
    ReplicaGroup,
    all_reduce,
    collective_permute,
    collective_permute_implicit_reduce,
    reduce_scatter,
)

nl, nisa = tn.language, tn.isa
BF16 = ml_dtypes.bfloat16


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _spread(*shape, seed=0, dtype=np.float32):
    """Values of many magnitudes, so that the order of a sum decides its bits."""
    r = np.random.default_rng(seed)
    x = r.standard_normal(shape) * 10.0 ** r.integers(-3, 4, shape)
    return x.astype(np.float32).astype(dtype)


def mesh(parts, op="sum"):
    """docs/collectives.md, ``mesh``: the flattened buffer of W elements cut into n chunks
    (chunk j: elements floor(jW/n) .. floor((j+1)W/n)); chunk j is position j's value
    combined with the others' in ascending position order, in fp32, rounded once to the
    buffer's dtype."""
    f = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    n, w = len(parts), parts[0].size
    flat = np.stack([p.astype(np.float32).reshape(-1) for p in parts])
    chunks = []
    for j in range(n):
        cols = slice(j * w // n, (j + 1) * w // n)
        order = [j, *(a for a in range(n) if a != j)]  # its own value first, then ascending
        chunks.append(functools.reduce(f, (flat[a, cols] for a in order)))
    return np.concatenate(chunks).astype(parts[0].dtype).reshape(parts[0].shape)


@tn.jit
def _reduce_sb(x, groups, op):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    all_reduce(srcs=[src], dsts=[dst], replica_group=ReplicaGroup(groups), op=op)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_all_reduce_sums_in_the_mesh_order_bit_for_bit():
    xs = [_spread(16, 24, seed=r) for r in range(4)]
    res = tn.run(_reduce_sb, tn.PerRank(xs), [[0, 1, 2, 3]], nl.add, ranks=4)
    want = mesh(xs)
    assert all(_same_bits(o, want) for o in res.outputs)
    # The order matters for these values: a plain left-to-right sum differs somewhere.
    naive = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    assert not _same_bits(naive, want)
    assert res.report.opcodes["dma_copy"] == 2 + 4, "a load, one transfer per rank, a store"


def test_all_reduce_is_the_machine_collectives_mesh_all_reduce():
    """One rule: the machine collectives' mesh all-reduce of the same buffers, on any chips,
    gives the same bits (docs/collectives.md)."""
    import trn2core

    xs = [_spread(6, 10, seed=100 + r, dtype=BF16) for r in range(5)]
    res = tn.run(_reduce_sb, tn.PerRank(xs), [[0, 1, 2, 3, 4]], nl.add, ranks=5)
    inst = trn2core.Instance("trn2.48xlarge")
    machine = inst.all_reduce(xs, algorithm="mesh", chips=[9, 2, 14, 0, 5]).outputs[0]
    assert _same_bits(res.outputs[3], machine) and _same_bits(machine, mesh(xs))


def test_all_reduce_follows_each_groups_order():
    xs = [_spread(8, 30, seed=10 + r) for r in range(6)]
    groups = [[4, 1, 5], [0, 3, 2]]
    res = tn.run(_reduce_sb, tn.PerRank(xs), groups, nl.add, ranks=6)
    for r, o in enumerate(res.outputs):
        g = next(g for g in groups if r in g)
        assert _same_bits(o, mesh([xs[q] for q in g])), r
    assert not _same_bits(mesh([xs[4], xs[1], xs[5]]), mesh([xs[1], xs[4], xs[5]]))


@pytest.mark.parametrize(("op", "name"), [(nl.maximum, "max"), (nl.minimum, "min")])
def test_all_reduce_max_and_min(op, name):
    xs = [_spread(4, 8, seed=20 + r) for r in range(3)]
    res = tn.run(_reduce_sb, tn.PerRank(xs), [[0, 1, 2]], op, ranks=3)
    assert all(_same_bits(o, mesh(xs, name)) for o in res.outputs)


def test_all_reduce_rounds_a_bf16_sum_once():
    # 256 + 3 x 0.5 = 257.5 in fp32, 258 in bf16; rounding each partial sum would keep 256.
    xs = [np.full((2, 4), v, BF16) for v in (256.0, 0.5, 0.5, 0.5)]
    res = tn.run(_reduce_sb, tn.PerRank(xs), [[0, 1, 2, 3]], nl.add, ranks=4)
    assert all(_same_bits(o, np.full((2, 4), 258.0, BF16)) for o in res.outputs)


@tn.jit
def _reduce_hbm_positional(x, y):
    """Coalesced: two HBM tensors reduced in one call, its arguments by position."""
    import nki.collectives as ncc

    dx = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    dy = nl.ndarray(y.shape, dtype=y.dtype, buffer=nl.shared_hbm)
    ncc.all_reduce([x, y], [dx, dy], ncc.ReplicaGroup([[1, 0]]), nl.add)
    return dx, dy


def test_all_reduce_in_hbm_coalesced_by_position():
    xs = [_spread(3, 5, 7, seed=30 + r) for r in range(2)]
    ys = [_spread(9, 6, seed=40 + r, dtype=BF16) for r in range(2)]
    with tn.install():
        res = tn.run(_reduce_hbm_positional, tn.PerRank(xs), tn.PerRank(ys), ranks=2)
    for dx, dy in res.outputs:
        assert _same_bits(dx, mesh([xs[1], xs[0]])) and _same_bits(dy, mesh([ys[1], ys[0]]))


@tn.jit
def _scatter(x, groups, sbuf):
    n = len(groups[0])
    p = x.shape[0] // n
    buf = nl.sbuf if sbuf else nl.shared_hbm
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=buf)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray((p, *x.shape[1:]), dtype=x.dtype, buffer=buf)
    reduce_scatter(srcs=[src], dsts=[dst], replica_group=ReplicaGroup(groups), collective_dim=0,
                   op=nl.add)  # fmt: skip
    out = nl.ndarray(dst.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("sbuf", [True, False])
def test_reduce_scatter_gives_each_rank_its_rows_of_the_sum(sbuf):
    xs = [_spread(12, 10, seed=50 + r) for r in range(3)]
    groups = [[2, 0, 1]]
    res = tn.run(_scatter, tn.PerRank(xs), groups, sbuf, ranks=3)
    whole = [xs[q] for q in groups[0]]
    # reduce_scatter's chunks are the positions' parts: part j is position j's rows, summed
    # with position j first.
    for r, o in enumerate(res.outputs):
        j = groups[0].index(r)
        assert _same_bits(o, mesh(whole)[4 * j : 4 * (j + 1)]), r


@tn.jit
def _scatter_lnc2(x):
    """At LNC=2 each physical core reduce-scatters its own half of ``x``'s columns."""
    pid = nl.program_id(0)
    h = x.shape[1] // 2
    src = nl.ndarray((x.shape[0], h), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x[:, pid * h : (pid + 1) * h])
    dst = nl.ndarray((x.shape[0] // 2, h), dtype=x.dtype, buffer=nl.sbuf)
    reduce_scatter(srcs=[src], dsts=[dst], replica_group=ReplicaGroup([[0, 1]]),
                   collective_dim=0, op=nl.add)  # fmt: skip
    out = nl.ndarray((x.shape[0] // 2, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[:, pid * h : (pid + 1) * h], src=dst)
    return out


def test_reduce_scatter_at_lnc2_pairs_each_physical_core_across_ranks():
    xs = [_spread(8, 12, seed=60 + r, dtype=BF16) for r in range(2)]
    res = tn.run(_scatter_lnc2, tn.PerRank(xs), grid=2, ranks=2)
    for r, o in enumerate(res.outputs):
        halves = [mesh([x[:, c * 6 : (c + 1) * 6] for x in xs])[4 * r : 4 * (r + 1)]
                  for c in range(2)]  # fmt: skip
        assert _same_bits(o, np.concatenate(halves, axis=1)), r
    assert res.report.lnc == 2


@tn.jit
def _a2a(x, groups):
    import nki.collectives as ncc

    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_to_all(dsts=[dst], srcs=[src], replica_group=ncc.ReplicaGroup(groups),
                   collective_dim=0)  # fmt: skip
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


@pytest.mark.parametrize("lnc", [1, 2])
def test_all_to_all_hands_part_j_of_every_rank_to_the_jth(lnc):
    r = np.random.default_rng(7)
    xs = [r.integers(0, 2**32, (6, 2, 3), dtype=np.uint64).astype(np.uint32).view(np.float32)
          for _ in range(4)]  # fmt: skip
    groups = [[3, 1], [0, 2]]
    with tn.install():
        res = tn.run(_a2a, tn.PerRank(xs), groups, grid=lnc, ranks=4)
    for q, o in enumerate(res.outputs):
        g = next(g for g in groups if q in g)
        j = g.index(q)
        want = np.concatenate([xs[s][3 * j : 3 * (j + 1)] for s in g])
        assert _same_bits(o, want), q


@tn.jit
def _permute(x, pairs):
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dst, src=x)  # kept by a rank no pair targets
    collective_permute(srcs=[src], dsts=[dst], source_target_pairs=pairs)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_collective_permute_follows_its_pairs():
    xs = [_spread(4, 6, seed=70 + r) for r in range(4)]
    res = tn.run(_permute, tn.PerRank(xs), [(0, 2), (2, 1), (1, 0)], ranks=4)
    assert [_same_bits(o, xs[s]) for o, s in zip(res.outputs, (1, 2, 0, 3), strict=True)] == [
        True
    ] * 4


@tn.jit
def _permute_first(x):
    """A collective_permute as the kernel's first instruction; rank 1 receives nothing."""
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    collective_permute(srcs=[x], dsts=[dst], source_target_pairs=[(1, 0)])
    return dst


def test_collective_permute_on_a_rank_with_nothing_issued_yet():
    xs = [np.full((2, 3), r + 1.0, np.float32) for r in range(2)]
    res = tn.run(_permute_first, tn.PerRank(xs), ranks=2, uninitialized="nan")
    assert _same_bits(res.outputs[0], xs[1]) and np.isnan(res.outputs[1]).all()


@tn.jit
def _ring_reduce(a, b, groups):
    sa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb, src=b)
    d = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    collective_permute_implicit_reduce(srcs0_by_channel=[[sa]], srcs1_by_channel=[[sb]],
                                       dsts_by_channel=[[d]], replica_group=ReplicaGroup(groups),
                                       op=nl.add)  # fmt: skip
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=d)
    return out


def test_collective_permute_implicit_reduce_sends_the_sum_round_the_ring():
    As = [_spread(8, 16, seed=80 + r, dtype=BF16) for r in range(3)]  # noqa: N806
    Bs = [_spread(8, 16, seed=90 + r, dtype=BF16) for r in range(3)]  # noqa: N806
    res = tn.run(_ring_reduce, tn.PerRank(As), tn.PerRank(Bs), [[0, 2, 1]], ranks=3)
    for r, o in enumerate(res.outputs):
        p = {0: 1, 2: 0, 1: 2}[r]  # the predecessor in the ring 0 -> 2 -> 1 -> 0
        want = (As[p].astype(np.float32) + Bs[p].astype(np.float32)).astype(BF16)
        assert _same_bits(o, want), r


@tn.jit
def _slow_reduce(x, spin):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for _ in range(spin):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=1.0)
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    all_reduce(srcs=[t], dsts=[d], replica_group=ReplicaGroup([[0, 1]]), op=nl.add)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=d)
    return out


def test_all_reduce_waits_for_the_latest_rank():
    x = np.ones((16, 16), np.float32)
    quick = tn.run(_slow_reduce, x, 0, ranks=2)
    slow = tn.run(_slow_reduce, x, tn.PerRank([0, 50]), ranks=2)
    assert all(_same_bits(o, np.full((16, 16), 2.0, np.float32)) for o in slow.outputs)
    assert slow.report.opcodes == quick.report.opcodes
    assert slow.report.seconds > quick.report.seconds + 50 * 50e-9


# ----------------------------------------------------------------------------- bad input
@tn.jit
def _bad(x, how):
    import nki.collectives as ncc

    rg = ncc.ReplicaGroup([[0, 1]])
    sb = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=x)
    hbm = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=hbm, src=x)
    half = nl.ndarray((x.shape[0] // 2, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    dh = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if how == "op":
        ncc.all_reduce(srcs=[sb], dsts=[d], replica_group=rg, op=nl.multiply)  # bad
    elif how == "mixed":
        ncc.all_reduce(srcs=[sb], dsts=[dh], replica_group=rg, op=nl.add)  # bad
    elif how == "group":
        ncc.all_reduce(srcs=[sb], dsts=[d], replica_group=ncc.ReplicaGroup([[1]]), op=nl.add)  # bad
    elif how == "group_size":
        ncc.all_reduce(srcs=[sb], dsts=[d], replica_group=ncc.ReplicaGroup([[0, 1, 2]]),
                       op=nl.add)  # fmt: skip # bad
    elif how == "priority":
        ncc.all_reduce(srcs=[sb], dsts=[d], replica_group=rg, op=nl.add, priority=4)  # bad
    elif how == "coalesced_sbuf":
        ncc.all_reduce(srcs=[sb, sb], dsts=[d, d], replica_group=rg, op=nl.add)  # bad
    elif how == "dst_shape":
        ncc.all_reduce(srcs=[sb], dsts=[half], replica_group=rg, op=nl.add)  # bad
    elif how == "scatter_dim":
        ncc.reduce_scatter(srcs=[sb], dsts=[half], replica_group=rg, collective_dim=1,
                           op=nl.add)  # fmt: skip # bad
    elif how == "scatter_shape":
        ncc.reduce_scatter(srcs=[sb], dsts=[d], replica_group=rg, collective_dim=0,
                           op=nl.add)  # fmt: skip # bad
    elif how == "psum":
        ncc.all_reduce(srcs=[nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.psum)], dsts=[d],
                       replica_group=rg, op=nl.add)  # fmt: skip # bad
    elif how == "a2a_sbuf":
        ncc.all_to_all(srcs=[sb], dsts=[d], replica_group=rg, collective_dim=0)  # bad
    elif how == "permute_twice":
        ncc.collective_permute(srcs=[hbm], dsts=[dh], source_target_pairs=[(0, 1), (1, 1)])  # bad
    elif how == "permute_rank":
        ncc.collective_permute(srcs=[hbm], dsts=[dh], source_target_pairs=[(0, 5)])  # bad
    elif how == "ring_op":
        ncc.collective_permute_implicit_reduce([[sb]], [[sb]], [[d]], rg, nl.subtract)  # bad
    elif how == "ring_shape":
        ncc.collective_permute_implicit_reduce([[sb]], [[half]], [[d]], rg, nl.add)  # bad
    return x


@pytest.mark.parametrize(
    ("how", "arg", "words"),
    [
        ("op", "op", "nl.add, nl.minimum or nl.maximum"),
        ("mixed", "dsts", "all in HBM or all in SBUF"),
        ("group", "replica_group", "rank 0 is in none"),
        ("group_size", "replica_group", "names rank 2"),
        ("priority", "priority", "0 to 3"),
        ("coalesced_sbuf", "srcs", "only supported in HBM"),
        ("dst_shape", "dsts", "source's shape"),
        ("scatter_dim", "collective_dim", "dimension 0"),
        ("scatter_shape", "dsts", "fills a (4, 4) destination"),
        ("psum", "srcs", "got one in psum"),
        ("a2a_sbuf", "srcs", "SBUF is not supported"),
        ("permute_twice", "source_target_pairs", "rank 1 receives twice"),
        ("permute_rank", "source_target_pairs", "names rank 5"),
        ("ring_op", "op", "nl.add, nl.minimum or nl.maximum"),
        ("ring_shape", "srcs1_by_channel", "source's shape"),
    ],
)
def test_bad_input_is_refused_at_the_kernels_line(how, arg, words):
    with tn.install(), pytest.raises(Trn2Error) as info:
        tn.run(_bad, np.ones((8, 4), np.float32), how, ranks=2)
    e = info.value
    assert e.arg == arg, str(e)
    line = _line_of(_bad, f'how == "{how}"') + 1
    assert str(e).startswith(f"{__file__}:{line}:"), str(e)
    assert words in str(e), str(e)


def test_integers_are_not_reduced():
    with pytest.raises(Trn2Error, match="reduce float32, bfloat16") as info:
        tn.run(_reduce_sb, tn.PerRank([np.ones((2, 2), np.int32)] * 2), [[0, 1]], nl.add,
               ranks=2)  # fmt: skip
    assert info.value.arg == "srcs"
    assert str(info.value).startswith(f"{__file__}:{_line_of(_reduce_sb, 'all_reduce(')}:")


@pytest.mark.parametrize(
    ("xs", "op", "arg"),
    [
        ([np.ones((4, 4), np.float32), np.ones((2, 4), np.float32)], nl.add, "srcs"),
        ([np.ones((4, 4), np.float32), np.ones((4, 4), BF16)], nl.add, "srcs"),
        ([np.ones((4, 4), np.float32)] * 2, tn.PerRank([nl.add, nl.maximum]), "op"),
    ],
)
def test_ranks_that_disagree_are_a_mismatch_naming_the_argument(xs, op, arg):
    with pytest.raises(Trn2Error, match=r"does not match its call at .* on rank 1") as info:
        tn.run(_reduce_sb, tn.PerRank(xs), [[0, 1]], op, ranks=2)
    assert info.value.arg == arg
    assert str(info.value).startswith(f"{__file__}:{_line_of(_reduce_sb, 'all_reduce(')}:")


# ----------------------------------------------------------------------------- variable length
@tn.jit
def _gather_v(x, meta, recv_known):
    import nki.collectives as ncc

    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    md = nl.ndarray(meta.shape, dtype=meta.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=md, src=meta)
    dst = nl.ndarray((4, 2 * x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dst, src=nl.zeros((4, 2 * x.shape[1]), dtype=x.dtype, buffer=nl.sbuf))
    ncc.all_gather_v(srcs=[src], dsts=[dst], replica_group=ncc.ReplicaGroup([[0, 1, 2, 3]]),
                     metadata_tensor=md, recv_counts_known=recv_known)  # fmt: skip
    return dst, md


def _meta(rows):
    return np.array(rows, np.uint32)


def test_all_gather_v_broadcasts_each_ranks_chunk_to_its_slot():
    xs = [_spread(3, 5, seed=110 + r) for r in range(4)]
    counts, displs = (4, 0, 10, 7), (2, 0, 5, 8)
    metas = [_meta([[k] * 4, [d] * 4, [99] * 4]) for k, d in zip(counts, displs, strict=True)]
    with tn.install():
        res = tn.run(_gather_v, tn.PerRank(xs), tn.PerRank(metas), False, grid=2, ranks=4)
    want = np.zeros(40, np.float32)
    for s in range(4):
        want[s * 10 : s * 10 + counts[s]] = xs[s].reshape(-1)[displs[s] : displs[s] + counts[s]]
    for dst, md in res.outputs:
        assert _same_bits(dst, want.reshape(4, 10))
        assert md[2].tolist() == list(counts), "row 2: the counts received"
    with tn.install():
        res = tn.run(_gather_v, tn.PerRank(xs), tn.PerRank(metas), True, grid=2, ranks=4)
    assert all(md[2].tolist() == [99] * 4 for _, md in res.outputs), "known: left untouched"


@tn.jit
def _a2a_v(x, meta):
    import nki.collectives as ncc

    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    md = nl.ndarray((1, *meta.shape), dtype=meta.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=md, src=meta.reshape((1, *meta.shape)))
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=dst, src=nl.zeros(x.shape, dtype=x.dtype, buffer=nl.sbuf))
    ncc.all_to_all_v([src], [dst], ncc.ReplicaGroup([[2, 0, 1]]), md)
    out = nl.ndarray(md.shape, dtype=md.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=md)
    return dst, out


def test_all_to_all_v_sends_each_destination_its_own_chunk():
    xs = [_spread(3, 6, seed=120 + r) for r in range(3)]
    # Rank q sends counts[q][j] elements from displs[q][j] to the group's j-th rank.
    counts = {0: (1, 6, 0), 1: (5, 2, 3), 2: (6, 6, 6)}
    displs = {0: (17, 3, 0), 1: (0, 5, 9), 2: (0, 6, 12)}
    metas = [_meta([counts[q], displs[q], [0, 0, 0]]) for q in range(3)]
    with tn.install():
        res = tn.run(_a2a_v, tn.PerRank(xs), tn.PerRank(metas), ranks=3)
    group = [2, 0, 1]
    for q, (dst, md) in enumerate(res.outputs):
        j = group.index(q)
        want = np.zeros(18, np.float32)
        for i, s in enumerate(group):
            k, d = counts[s][j], displs[s][j]
            want[i * 6 : i * 6 + k] = xs[s].reshape(-1)[d : d + k]
        assert _same_bits(dst, want.reshape(3, 6)), q
        assert md[0, 2].tolist() == [counts[s][j] for s in group]


@tn.jit
def _bad_v(x, meta, how):
    import nki.collectives as ncc

    rg = ncc.ReplicaGroup([[0, 1]])
    src = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=src, src=x)
    md = nl.ndarray(meta.shape, dtype=meta.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=md, src=meta)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if how == "rdispls":
        ncc.all_to_all_v([src], [dst], rg, md, has_rdispls=True)  # bad
    elif how == "plain":
        ncc.all_to_all_v([src], [dst], rg, md)  # bad
    elif how == "lnc1":
        ncc.all_gather_v([src], [dst], rg, md)  # bad
    return dst


@pytest.mark.parametrize(
    ("how", "meta", "arg", "words"),
    [
        ("rdispls", [[1, 1], [0, 0], [0, 0]], "has_rdispls", "not supported on Trainium2"),
        ("plain", [[1, 1], [0, 0]], "metadata_tensor", "uint32 [3, 2]"),
        ("plain", np.zeros((3, 2), np.int32), "metadata_tensor", "a uint32 tensor"),
        ("plain", [[1, 1], [0, 32], [0, 0]], "metadata_tensor", "leaves the source"),
        ("plain", [[17, 17], [0, 0], [0, 0]], "metadata_tensor", "exceed the destination's slot"),
        ("lnc1", [[1, 1], [0, 0], [0, 0]], None, "LNC=2 only"),
    ],
)
def test_variable_length_collectives_refuse_bad_input(how, meta, arg, words):
    x = np.ones((4, 8), np.float32)
    meta = np.asarray(meta, np.uint32) if isinstance(meta, list) else meta
    with tn.install(), pytest.raises(Trn2Error) as info:
        tn.run(_bad_v, x, meta, how, ranks=2)
    e = info.value
    assert e.arg == arg and words in str(e), str(e)
    line = _line_of(_bad_v, f'how == "{how}"') + 1
    assert str(e).startswith(f"{__file__}:{line}:"), str(e)
