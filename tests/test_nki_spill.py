"""The current dialect's compiler-placed SBUF tensors spill to HBM when the live ones do not fit
(docs/nki.md, current-dialect liveness): the least recently used is stored to a spill slot
and reloaded before its next use, bit for bit, its DMAs counted in ``spill_bytes``; one that is
a whole copy of an input nobody wrote (one ``dma_copy`` loaded it, nothing wrote it since) is
not stored but loaded from that input again. Explicit placements, tensors that cannot fit at
all and PSUM keep their ``CapacityError``. Every kernel here is our own."""

from __future__ import annotations

import numpy as np
import pytest
import trn2core.nki as tn
from kernel_lines import at as _at
from trn2core.errors import CapacityError, Trn2ValueError

nl, nisa = tn.language, tn.isa

#: Free size of a [128, F] fp32 tensor of 64 KiB per partition: three fit in SBUF's usable
#: 212,984 bytes per partition, four do not.
F = 16384
#: One spill or reload DMA of such a tensor (128 partitions of 64 KiB).
MOVE = 128 * F * 4


def _data(n: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).uniform(-4, 4, (n, 128, F)).astype(np.float32)
    a.view(np.uint32)[:, :, 100] = 0x7FC01234  # a NaN payload: bits move as they are
    return a


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint32)


def test_four_tensors_in_a_three_tensor_sbuf_spill_the_least_recently_used_and_reload_it():
    """Four 64 KiB tensors loaded, then stored in the order loaded: the fourth declaration
    spills the first; each store then reloads its tensor, spilling the least recently used of
    the other three. A spill's store is recorded when its tensor is used again, before the
    reload (the first tensor's second spill is never reloaded, so never stored). The first
    tensor is rewritten in part before it is spilled, and the third is loaded a column short
    and that column set: both are stored and reloaded (2 DMAs of 8 MiB each). The second and
    fourth are whole copies of the input: each is loaded from it again (1 DMA): 6 in all."""

    @tn.jit
    def k(a, bias):
        n = a.shape[0]
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ts = []
        for i in range(n):
            t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
            if i == 2:
                nisa.dma_copy(dst=t[:, 1:F], src=a[i, :, 1:F])
                nisa.memset(dst=t[:, 0:1], value=-2.0)
            else:
                nisa.dma_copy(dst=t, src=a[i])
            if i == 0:
                part = t[:, 0:64]
                nisa.tensor_scalar(dst=part, data=part, op0=nl.add, operand0=bias)
            ts.append(t)
        for i in range(n):
            nisa.dma_copy(dst=out[i], src=ts[i])
        return out

    a = _data(4, seed=1)
    res = tn.run(k, a, 0.5)
    want = a.copy()
    want[0, :, 0:64] += np.float32(0.5)
    want[2, :, 0] = -2.0
    assert np.array_equal(_bits(res.outputs), _bits(want))
    rep = res.report
    assert rep.spill_bytes == 6 * MOVE
    assert rep.to_dict()["spill_bytes"] == rep.cores[0].spill_bytes == 6 * MOVE
    assert rep.spill_s > 0 and f"spills: {6 * MOVE:,} bytes" in str(rep)
    # The kernel's own DMAs (4 loads, one of them a column short, and 4 stores) besides the
    # spills, which move whole tensors.
    assert rep.dma_bytes - rep.spill_bytes == 8 * MOVE - 128 * 4
    assert rep.opcodes["dma_copy"] == 8 + 6 and rep.opcodes["memset"] == 1

    # Three fit: nothing is spilled.
    fits = tn.run(k, a[:3], 0.5)
    assert np.array_equal(_bits(fits.outputs), _bits(want[:3]))
    assert fits.report.spill_bytes == 0 and "spills" not in str(fits.report)


def test_views_made_before_a_spill_and_operands_spilled_for_each_other_come_back():
    """``v`` is a view of ``t1`` made while it is in SBUF; declaring ``s`` spills ``t1``.
    ``tensor_tensor`` then reads ``t0`` (spilled: reloaded, spilling ``t2``) and ``v``
    (its tensor spilled: reloaded, spilling ``t3``, not ``s`` or ``t0``, the call's own;
    the view moves with it)."""

    @tn.jit
    def k(a):
        out = nl.ndarray((2, 128, F), dtype=a.dtype, buffer=nl.shared_hbm)
        ts = []
        for i in range(4):
            t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i])  # the fourth spills t0
            ts.append(t)
        v = ts[1][:, 0:F]
        s = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)  # spills t1
        nisa.tensor_tensor(dst=s, data1=ts[0], data2=v, op=nl.add)
        nisa.dma_copy(dst=out[0], src=s)
        nisa.tensor_tensor(dst=s, data1=s, data2=ts[3], op=nl.subtract)  # t3 back, t2 out
        nisa.dma_copy(dst=out[1], src=s)
        return out

    a = np.round(_data(4, seed=2))
    a.view(np.uint32)[:, :, 100] = 0x3F800000  # 1.0: sums stay exact
    res = tn.run(k, a)
    s = a[0] + a[1]
    assert np.array_equal(res.outputs[0], s)
    assert np.array_equal(res.outputs[1], s - a[3])
    # t0 out; t1 out; t2 out, t0 in; t3 out, t1 in; then t0 out (it and t1 last used by one
    # instruction: the older first), t3 in. Each is a whole copy of the input: never stored,
    # each reload one DMA from the input.
    assert res.report.spill_bytes == 3 * MOVE
    assert res.report.opcodes["tensor_tensor"] == 2


def test_operands_that_cannot_be_in_sbuf_together_are_a_capacity_error_at_their_line():
    # Two 128 KiB operands of one instruction: 256 KiB at once, more than SBUF.
    def k(a):
        out = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        y = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf)  # spills x
        nisa.dma_copy(dst=y, src=a)
        nisa.tensor_tensor(dst=y, data1=x, data2=y, op=nl.add)  # both
        nisa.dma_copy(dst=out, src=y)
        return out

    with pytest.raises(CapacityError, match="reloading it from its HBM spill slot") as info:
        tn.run(tn.jit(k), np.ones((128, 2 * F), np.float32))
    _at(info, k, "# both")
    assert "[rule sbuf_capacity]" in str(info.value)


def test_a_tensor_larger_than_sbuf_is_still_a_capacity_error():
    def k(a):
        t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        big = nl.ndarray((128, 60_000), dtype=a.dtype, buffer=nl.sbuf)  # big
        return big

    with pytest.raises(CapacityError) as info:
        tn.run(tn.jit(k), np.ones((128, F), np.float32))
    _at(info, k, "# big")
    assert "[rule sbuf_capacity]" in str(info.value)


def test_explicit_placements_are_never_spilled_and_keep_their_capacity_error():
    def over(a):
        t = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        u = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf, address=(0, 100_000))  # o
        return u

    with pytest.raises(CapacityError) as info:
        tn.run(tn.jit(over), np.ones((128, 2 * F), np.float32))
    _at(info, over, "# o")
    assert "[rule sbuf_capacity]" in str(info.value)

    # Placed over an allocator tensor's bytes: refused as before, nothing spilled for it.
    def placed_last(a):
        t = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        u = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))  # placed
        return u

    with pytest.raises(Trn2ValueError, match="overlap the live tensor") as info:
        tn.run(tn.jit(placed_last), np.ones((128, 2 * F), np.float32))
    _at(info, placed_last, "# placed")

    # An explicit placement takes 128 KiB: a 100 KiB allocator tensor cannot fit even when
    # every allocator tensor is spilled, and the placed one is not.
    def beside(a):
        p = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))
        nisa.dma_copy(dst=p, src=a)
        t = nl.ndarray((128, F // 2), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[:, 0 : F // 2])
        big = nl.ndarray((128, 25_000), dtype=a.dtype, buffer=nl.sbuf)  # beside
        return big

    with pytest.raises(CapacityError) as info:
        tn.run(tn.jit(beside), np.ones((128, 2 * F), np.float32))
    _at(info, beside, "# beside")

    # Allocator tensors make room beside a placed one: they spill, it stays.
    @tn.jit
    def room(a):
        out = nl.ndarray((3, 128, F // 2), dtype=a.dtype, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 2 * F), dtype=a.dtype, buffer=nl.sbuf, address=(0, 0))
        nisa.dma_copy(dst=p, src=a)
        ts = []
        for i in range(3):  # 32 KiB each: two fit beside p's 128 KiB
            t = nl.ndarray((128, F // 2), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=p[:, i * (F // 2) : (i + 1) * (F // 2)])
            ts.append(t)
        for i in range(3):
            nisa.dma_copy(dst=out[i], src=ts[i])
        return out

    a = np.random.default_rng(3).uniform(-4, 4, (128, 2 * F)).astype(np.float32)
    res = tn.run(room, a)
    want = a[:, : 3 * (F // 2)].reshape(128, 3, F // 2).transpose(1, 0, 2)
    assert np.array_equal(res.outputs, want)
    # t0 out (third declaration); t1 out, t0 stored and in; t2 out, t1 stored and in; t0
    # out, t2 stored and in: 6 DMAs of 4 MiB.
    assert res.report.spill_bytes == 3 * MOVE


def test_psum_over_capacity_is_not_spilled():
    def k(a):
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a)
        ps = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
        nisa.nc_matmul(dst=ps[0][:, 0:128], stationary=x, moving=x)  # gone
        return a

    with pytest.raises(CapacityError, match="used after its storage was given") as info:
        tn.run(tn.jit(k), np.ones((128, 128), np.float32))
    _at(info, k, "# gone")
    assert "[rule psum_capacity]" in str(info.value)


def test_an_access_pattern_over_a_spilled_tensor_reloads_it():
    @tn.jit
    def k(a):
        out = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.shared_hbm)
        ts = []
        for i in range(4):
            t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i])  # the fourth spills t0
            ts.append(t)
        nisa.dma_copy(dst=out, src=ts[0].ap([[F, 128], [1, F]], 0))  # t1 out, t0 back
        return out

    a = _data(4, seed=4)
    res = tn.run(k, a)
    assert np.array_equal(_bits(res.outputs), _bits(a[0]))
    assert res.report.spill_bytes == MOVE  # t0 loaded from the input again


def test_matmuls_accumulating_through_views_of_spilled_tensors_add_each_product_once():
    """``wv`` and ``mv``, views of ``t0`` and ``t1``, are made before ``t0`` is spilled; the
    accumulating matmuls that read them afterwards are made again with ``t0`` back (not
    twice: the PSUM sum holds each product once)."""

    @tn.jit
    def k(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        ts = []
        for i in range(3):
            t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i])
            ts.append(t)
        wv, mv = ts[0][:, 0:128], ts[1][:, 0:512]
        ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=wv, moving=mv)
        for _ in range(2):  # spill t2, then t0 (t0 and t1 last used together: the older)
            x = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=x, src=a[3])
        nisa.nc_matmul(dst=ps, stationary=wv, moving=mv)  # t0 back: the first x out
        nisa.nc_matmul(dst=ps, stationary=wv, moving=ts[2][:, 0:512])  # t2 back, x out
        res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        nisa.dma_copy(dst=out, src=res)
        return out

    a = np.round(_data(4, seed=5))
    a.view(np.uint32)[:, :, 100] = 0x3F800000  # 1.0: the sums stay exact
    res = tn.run(k, a)
    w = a[0][:, :128].astype(np.float64)
    want = (2 * (w.T @ a[1][:, :512]) + w.T @ a[2][:, :512]).astype(np.float32)
    assert np.array_equal(res.outputs, want)
    assert res.report.spill_bytes == 2 * MOVE  # t0 and t2 loaded from the input again
    assert res.report.opcodes["nc_matmul"] == 3


def _reload_first_of_four(a, how: str):
    """Loads ``t0`` from ``a[0]`` (``how``: whole, or in two halves), then ``t1``-``t3`` (the
    fourth declaration spills ``t0``); ``how == "written"`` then writes the input ``a``; storing
    ``t0`` to the output brings it back."""

    @tn.jit
    def k(a):
        out = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.shared_hbm)
        t0 = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
        if how == "halves":
            nisa.dma_copy(dst=t0[:, 0 : F // 2], src=a[0, :, 0 : F // 2])
            nisa.dma_copy(dst=t0[:, F // 2 : F], src=a[0, :, F // 2 : F])
        else:
            nisa.dma_copy(dst=t0, src=a[0])
        ts = [t0]
        for i in (1, 2, 3):
            t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i])
            ts.append(t)
        if how == "written":
            nisa.dma_copy(dst=a[3], src=ts[1])
        nisa.dma_copy(dst=out, src=ts[0])
        return out

    return tn.run(k, a)


def test_a_whole_copy_of_an_unwritten_input_is_loaded_again_instead_of_spilled():
    """The compiler loads data it can load again (weights, inputs) instead of spilling it:
    NKI's profile counts spill saves for intermediates computed by the engines, and data loaded
    "multiple times" apart (docs/sources.md). ``t0``, one ``dma_copy`` of ``a[0]`` that nothing
    wrote since, is not stored: its reload is one DMA reading ``a[0]``, priced as the load was
    and counted as a reload."""
    a = _data(4, seed=7)
    res = _reload_first_of_four(a, "whole")
    assert np.array_equal(_bits(res.outputs), _bits(a[0]))
    rep = res.report
    assert rep.spill_bytes == MOVE
    assert rep.opcodes["dma_copy"] == 4 + 1 + 1  # loads, the output's store, the reload
    assert rep.dma_bytes == 6 * MOVE


@pytest.mark.parametrize("how", ["halves", "written"])
def test_a_tensor_that_is_not_a_whole_copy_of_an_unwritten_input_is_stored_and_reloaded(how):
    """Loaded by two DMAs (neither a copy of the whole), or its input written afterwards (the
    input no longer holds what was loaded): ``t0`` is stored to its slot and reloaded from it,
    2 DMAs, with the same bits."""
    a = _data(4, seed=8)
    res = _reload_first_of_four(a, how)
    assert np.array_equal(_bits(res.outputs), _bits(a[0]))
    assert res.report.spill_bytes == 2 * MOVE
    kernel_dmas = 4 + (1 if how == "halves" else 0) + (1 if how == "written" else 0) + 1
    assert res.report.opcodes["dma_copy"] == kernel_dmas + 2


def test_spill_slots_of_dead_tensors_serve_later_spills_with_their_own_bits():
    """Each round declares four tensors, each loaded and then added to (not copies of the
    input: they are stored when spilled), so the fourth spills the first and the store of the
    first reloads it, spilling the second. The round's tensors die with the round, and their
    spill slots serve the next round's spills: every round's output is its own tensor's bits,
    never a slot's earlier contents."""
    rounds = 3
    a = _data(rounds, seed=9)

    @tn.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for r in range(a.shape[0]):
            ts = []
            for i in range(4):
                t = nl.ndarray((128, F), dtype=a.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=t, src=a[r])
                nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=float(i + 1))
                ts.append(t)
            nisa.dma_copy(dst=out[r], src=ts[0])
        return out

    res = tn.run(k, a)
    want = a + np.float32(1)
    _bits(want)[np.isnan(want)] = 0x7FC00000  # the engines' canonical NaN
    assert np.array_equal(_bits(res.outputs), _bits(want))
    # Per round: the first tensor stored and reloaded (the second, spilled for that reload, is
    # never used again, so its store is not recorded).
    assert res.report.spill_bytes == rounds * 2 * MOVE


def test_alloc_if_room_is_none_exactly_when_there_is_no_room_and_refuses_bad_arguments():
    """The spill loop's one call per try (``Core.fit``): a tile when ``has_room`` says the
    allocation fits, ``None`` (no ``CapacityError`` made) when it does not; an argument it
    cannot read is a ``Trn2Error`` naming it, not ``None``."""
    from trn2core import _core
    from trn2core.errors import Trn2Error

    m = _core.Machine()
    big = m.alloc_if_room([128, 50_000], "fp32", "sbuf", "big")  # 200,000 B per partition
    assert big is not None and m.usage("sbuf").allocations == 1
    # 212,984 B per partition usable: 12,000 B more fit, 14,000 do not.
    assert not m.has_room([128, 3500], "fp32", "sbuf")
    assert m.alloc_if_room([128, 3500], "fp32", "sbuf", "t") is None
    assert m.usage("sbuf").allocations == 1  # the refused one made nothing
    assert m.has_room([128, 3000], "fp32", "sbuf")
    assert m.alloc_if_room([128, 3000], "fp32", "sbuf", "t") is not None
    assert m.usage("sbuf").allocations == 2
    assert m.alloc_if_room([128, 300], "fp32", "sbuf", "t") is None  # 952 B are left
    for args, arg in (
        (([128, 4], "fp99", "sbuf", "t"), "dtype"),
        (([128, 4], "fp32", "dram", "t"), "space"),
    ):
        with pytest.raises(Trn2Error) as info:
            m.alloc_if_room(*args)
        assert info.value.arg == arg
    m.free(big)
    assert m.alloc_if_room([128, 3500], "fp32", "sbuf", "t") is not None
