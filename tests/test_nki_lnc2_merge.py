"""The LNC=2 merge of shared HBM (issue 26, nki-library's moe_cte): the two physical cores'
writes of one byte are ordered by when they ran on the cores' clocks (synchronised at
``core_barrier`` and ``sendrecv``), the later one wins as on the chip, and only writes whose
times overlap are a race. Small kernels of our own."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import trn2core.nki as tn

nl, nisa = tn.language, tn.isa


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-4, 4, shape).astype(np.float32)


def _spin(t, n: int) -> None:
    """``n`` Vector instructions on ``t``: a core's clock moves on before its next store."""
    for _ in range(n):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=1.0)


@tn.jit
def _zero_then_scatter(x, spin):
    """moe_cte's pattern: each core zeroes the whole output, computes, then stores its own
    rows (interleaved, as a block's scattered tokens), with no barrier in between."""
    half = x.shape[0] // 2
    pid = nl.program_id(0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=out[0:half, :], src=zero)  # zero the output
    nisa.dma_copy(dst=out[half : 2 * half, :], src=zero)
    mine = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid : x.shape[0] : 2, :])
    _spin(mine, spin)
    nisa.dma_copy(dst=out[pid : x.shape[0] : 2, :], src=mine)  # scattered store
    return out


def test_zero_then_scatter_across_cores_keeps_the_later_stores():
    x = _rand(128, 32)
    res = tn.run(_zero_then_scatter, x, 8, grid=2)
    assert np.array_equal(res.outputs, x), "each row is its core's store, after both zeroings"
    assert res.report.lnc == 2


def _scaled(x):
    """This core's rank, a shared output like ``x``, and ``x`` times the rank + 1 in SBUF."""
    pid = nl.program_id(0)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=float(pid + 1))
    return pid, out, t


@tn.jit
def _both_store(x, spin):
    """Both cores store their own values into the same rows; core 1 first spins."""
    pid, out, t = _scaled(x)
    if pid == 1:
        _spin(t, spin)
    nisa.dma_copy(dst=out, src=t)  # the store both cores make
    return out


def test_a_true_race_is_an_error_naming_the_line_and_rule():
    x = _rand(64, 32)
    with pytest.raises(tn.KernelError, match=r"overlapping times.*\[rule hbm_race\]") as info:
        tn.run(_both_store, x, 0, grid=2)
    where = f"{__file__}:{_line_of(_both_store, '# the store both cores make')}:"
    assert str(info.value).startswith(where), str(info.value)
    assert info.value.rule == "hbm_race"
    assert "physical core 0" in str(info.value) and "physical core 1" in str(info.value)
    # Under uninitialized="nan" too.
    with pytest.raises(tn.KernelError, match="hbm_race"):
        tn.run(_both_store, x, 0, grid=2, uninitialized="nan")


def test_writes_far_apart_in_time_are_ordered_without_a_barrier():
    # Core 1's store starts after core 0's has ended on the two clocks: the later one wins.
    x = _rand(64, 32)
    res = tn.run(_both_store, x, 60, grid=2)
    assert np.array_equal(res.outputs, x * np.float32(2))


@tn.jit
def _barrier_ordered(x, first):
    """Core ``first`` stores before the barrier on ``out``, the other core after it."""
    pid, out, t = _scaled(x)
    if pid == first:
        nisa.dma_copy(dst=out, src=t)
    nisa.core_barrier(out, (0, 1))
    if pid != first:
        nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("first", [0, 1])
def test_writes_ordered_by_core_barrier_keep_the_later(first):
    x = _rand(64, 32)
    res = tn.run(_barrier_ordered, x, first, grid=2)
    assert np.array_equal(res.outputs, x * np.float32(2 - first))


@tn.jit
def _seen_after_barrier(x, spin):
    """Core 0 stores into ``shared`` at once, core 1 later (after a spin); after a barrier
    each core reads ``shared`` back into its half of the output: both see core 1's store."""
    half = x.shape[0] // 2
    pid, shared, t = _scaled(x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    if pid == 1:
        _spin(t, spin)
    nisa.dma_copy(dst=shared, src=t)
    nisa.core_barrier(shared, (0, 1))
    back = nl.ndarray((half, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=back, src=shared[pid * half : (pid + 1) * half, :])
    nisa.dma_copy(dst=out[pid * half : (pid + 1) * half, :], src=back)
    return out


def test_a_barrier_gives_each_core_the_later_of_the_two_writes():
    x = _rand(128, 32)
    res = tn.run(_seen_after_barrier, x, 60, grid=2)
    assert np.array_equal(res.outputs, x * np.float32(2))


def test_an_output_neither_core_wrote_in_full_names_its_first_unwritten_byte():
    """Each core stores its half of the rows but the last row is left out: the merged output
    (whole, and through a reshaped view) is the output_unwritten error at the line that made
    it, naming the first byte no core wrote."""

    def k(x, view):
        pid = nl.program_id(0)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)  # made here
        t = nl.ndarray((31, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[32 * pid : 32 * pid + 31, :])
        nisa.dma_copy(dst=out[32 * pid : 32 * pid + 31, :], src=t)
        return out.reshape((x.shape[0] * x.shape[1],)) if view else out

    x = _rand(64, 32)
    for view in (False, True):
        with pytest.raises(tn.KernelError, match=r"\[rule output_unwritten\]") as info:
            tn.run(tn.jit(k), x, view, grid=2)
        first = 31 * 32 * 4  # row 31's first byte: core 0 stored rows 0-30
        assert f"byte {first} was never written by either physical core" in str(info.value)
        assert info.value.nki_location == (__file__, _line_of(k, "# made here"))
