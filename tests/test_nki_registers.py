"""NKI's virtual registers (issue 26): register_alloc / register_move / register_load /
register_store, loops bounded by them (dynamic_range, fori_loop, while_loop, a bare
``while reg:``), a register as ``scalar_offset``, and the errors of their misuse at the
kernel's own line (docs/nki.md, "Registers"). Registers exist only in the current dialect
(NKI 0.3 and later): the legacy one has none."""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import trn2core.nki as tn
from trn2core.errors import Trn2Error

nl, nisa = tn.language, tn.isa


def _line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _sbuf_int(value: int, dtype=np.int32):
    t = nl.ndarray((1, 1), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=value)
    return t


def _int_out(n: int):
    """A [1, n] int32 output of the kernel."""
    return nl.ndarray((1, n), dtype=nl.int32, buffer=nl.shared_hbm)


def _add(acc, by) -> None:
    """``acc += by`` of two [1, 1] SBUF tensors."""
    nisa.tensor_tensor(dst=acc, data1=acc, data2=by, op=nl.add)


# ----------------------------------------------------------------------------- values


def test_alloc_move_load_store_round_trip():
    @tn.jit
    def k(x):
        out = _int_out(4)
        a = nisa.register_alloc(7)
        b = nisa.register_alloc()
        nisa.register_move(b, a)  # another register's value
        c = nisa.register_alloc(None)
        nisa.register_load(c, x[0:1, 0:1])  # from HBM
        s = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=s, value=0)
        nisa.register_store(s[0:1, 0:1], a)
        nisa.register_store(s[0:1, 1:2], b)
        nisa.register_store(s[0:1, 2:3], c)
        d = nisa.register_alloc(_sbuf_int(-3))  # the release notes' tensor initialiser
        nisa.register_move(a, 2_000_000_001)  # beyond float32's exact integers
        nisa.register_store(s[0:1, 3:4], d)
        nisa.dma_copy(dst=out, src=s)
        e = _int_out(1)
        nisa.register_store(e, a)  # straight to HBM
        return out, e

    out, e = k(np.array([[41, 0]], np.int32))
    assert out.tolist() == [[7, 7, 41, -3]]
    assert e.tolist() == [[2_000_000_001]]


def test_register_load_reads_in_program_order():
    # The value a register gets is the tensor's when register_load runs (after the memset
    # before it, before the one after it).
    @tn.jit
    def k(x):
        out = _int_out(2)
        t = _sbuf_int(5)
        r = nisa.register_alloc()
        nisa.register_load(r, t)
        nisa.memset(dst=t, value=9)
        s = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_store(s[0:1, 0:1], r)
        nisa.register_load(r, t)
        nisa.register_store(s[0:1, 1:2], r)
        nisa.dma_copy(dst=out, src=s)
        return out

    assert k(np.zeros((1, 1), np.float32)).tolist() == [[5, 9]]


# ----------------------------------------------------------------------------- loops


def test_dynamic_range_register_bounds_and_scalar_offset():
    # nki-library's dynamic_elementwise_add pattern in small: the trip count comes from a
    # tensor through a register; the loop index (a frozen register) is the row offset.
    @tn.jit
    def k(a, n):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ns = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ns, src=n)
        stop = nisa.register_alloc()
        nisa.register_load(stop, ns)
        start = nisa.register_alloc(1)
        for i in nl.dynamic_range(start, stop, 2):
            t = nl.ndarray((1, 8), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a.ap([[8, 1], [1, 8]], scalar_offset=i, indirect_dim=0))
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=10.0)
            nisa.dma_copy(dst=out.ap([[8, 1], [1, 8]], scalar_offset=i, indirect_dim=0), src=t)
        z = nl.ndarray((1, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z, value=0.0)
        for r in (0, 2, 4, 6, 7):
            nisa.dma_copy(dst=out[r : r + 1, :], src=z)
        return out

    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    got = k(a, np.array([[6]], np.int32))
    want = np.zeros_like(a)
    want[[1, 3, 5]] = a[[1, 3, 5]] * 10
    np.testing.assert_array_equal(got, want)


def test_loop_index_is_a_frozen_register_usable_as_an_index():
    seen = []

    @tn.jit
    def k(x):
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.dynamic_range(3):
            assert isinstance(i, nisa.VirtualRegister) and i.frozen
            seen.append(int(i))
            assert list(range(i)) == list(range(len(seen) - 1))
        nisa.dma_copy(dst=out, src=x[0:1, 0:1])
        return out

    k(np.ones((2, 2), np.float32))
    assert seen == [0, 1, 2]


def test_a_register_indexes_a_tensor():
    # The language guide's ``process_tensor(t[i])``: the loop index as an integer index.
    @tn.jit
    def k(a):
        out = nl.ndarray((4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        for i in nl.dynamic_range(nisa.register_alloc(4)):
            t = nl.ndarray((1, 8), dtype=a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a[i])
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
            nisa.dma_copy(dst=out[i], src=t)
        return out

    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(k(a), a + 1)


def test_fori_loop_and_while_loop_with_registers():
    @tn.jit
    def k(x):
        out = _int_out(3)
        acc, one = _sbuf_int(0), _sbuf_int(1)
        hi = nisa.register_alloc(4)

        def body(i):
            # i is passed by value: writing it does not change the loop.
            nisa.register_move(i, 100)
            _add(acc, one)

        nl.fori_loop(0, hi, body)
        # while_loop: count down from 3, the body's register the next condition.
        cnt = _sbuf_int(3)
        acc2 = _sbuf_int(0)

        def wbody(r):
            _add(acc2, cnt)
            nisa.tensor_tensor(dst=cnt, data1=cnt, data2=one, op=nl.subtract)
            nisa.register_load(r, cnt)
            return r

        nl.while_loop(nisa.register_alloc(1), wbody)
        # A bare ``while reg:`` (the parser front end's form): runs until the register is 0.
        cnt3 = _sbuf_int(2)
        acc3 = _sbuf_int(0)
        reg = nisa.register_alloc(1)
        while reg:
            _add(acc3, one)
            nisa.tensor_tensor(dst=cnt3, data1=cnt3, data2=one, op=nl.subtract)
            nisa.register_load(reg, cnt3)
        # A zero condition: the body never runs (a true while).
        nl.while_loop(nisa.register_alloc(0), lambda r: pytest.fail("ran"))
        s = nl.ndarray((1, 3), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s[0:1, 0:1], src=acc)
        nisa.tensor_copy(dst=s[0:1, 1:2], src=acc2)
        nisa.tensor_copy(dst=s[0:1, 2:3], src=acc3)
        nisa.dma_copy(dst=out, src=s)
        return out

    # fori 4 iterations; while 3 + 2 + 1 = 6; bare while 2 iterations.
    assert k(np.zeros((1, 1), np.float32)).tolist() == [[4, 6, 2]]


# ----------------------------------------------------------------------------- misuse


def _err(kernel) -> Trn2Error:
    with pytest.raises(Trn2Error) as e:
        tn.jit(kernel)(np.zeros((2, 2), np.float32))
    return e.value


def _at(e: Trn2Error, kernel, text: str, arg: str) -> None:
    assert e.arg == arg, (e.arg, str(e))
    assert e.nki_location == (__file__, _line_of(kernel, text)), str(e)
    assert str(e).startswith(f"{__file__}:{_line_of(kernel, text)}: ")


def k_alloc_float(x):
    nisa.register_alloc(1.5)  # BAD: x


def k_alloc_huge(x):
    nisa.register_alloc(2**32)  # BAD: x


def k_move_to_tensor(x):
    nisa.register_move(x, 1)  # BAD: dst


def k_load_two(x):
    r = nisa.register_alloc()
    nisa.register_load(r, nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf))  # BAD: src


def k_load_float(x):
    r = nisa.register_alloc()
    nisa.register_load(r, x[0:1, 0:1])  # BAD: src


def k_move_huge(x):
    r = nisa.register_alloc()
    nisa.register_move(r, -(2**31) - 1)  # BAD: src


def k_store_uint32_to_int32(x):
    r = nisa.register_alloc(2**32 - 1)  # a uint32 value, beyond int32
    nisa.register_store(_sbuf_int(0), r)  # BAD: dst


def k_store_uninit(x):
    r = nisa.register_alloc()
    nisa.register_store(_sbuf_int(0), r)  # BAD: src


def k_store_no_fit(x):
    r = nisa.register_alloc(300)
    nisa.register_store(_sbuf_int(0, np.int8), r)  # BAD: dst


def k_frozen(x):
    for i in nl.dynamic_range(2):
        nisa.register_move(i, 5)  # BAD: dst


def k_step_register(x):
    for _ in nl.dynamic_range(0, 4, nisa.register_alloc(1)):  # BAD: step
        pass


def k_uninit_bound(x):
    for _ in nl.dynamic_range(0, nisa.register_alloc()):  # BAD: stop
        pass


def k_while_uninit(x):
    r = nisa.register_alloc()
    while r:  # BAD: register
        pass


def k_host_arith(x):
    r = nisa.register_alloc(3)
    return r * 128  # BAD: register


def k_index_uninit(x):
    r = nisa.register_alloc()
    nisa.dma_copy(dst=nl.ndarray((1, 2), dtype=x.dtype, buffer=nl.sbuf), src=x[r])  # BAD: index


def k_register_as_operand(x):
    t = nl.ndarray((2, 2), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=nisa.register_alloc(1))  # BAD: operand0


def k_while_loop_returns(x):
    nl.while_loop(nisa.register_alloc(1), lambda r: 0)  # BAD: body_fun


#: Each misuse kernel's bad line ends ``# BAD: <the argument its error names>``.
MISUSES = [
    k_alloc_float,
    k_alloc_huge,
    k_move_to_tensor,
    k_load_two,
    k_load_float,
    k_move_huge,
    k_store_uint32_to_int32,
    k_store_uninit,
    k_store_no_fit,
    k_frozen,
    k_step_register,
    k_uninit_bound,
    k_while_uninit,
    k_host_arith,
    k_index_uninit,
    k_register_as_operand,
    k_while_loop_returns,
]


@pytest.mark.parametrize("kernel", MISUSES, ids=lambda k: k.__name__)
def test_register_misuse_names_the_argument_at_the_kernel_line(kernel):
    bad = next(ln for ln in inspect.getsource(kernel).splitlines() if "# BAD: " in ln)
    _at(_err(kernel), kernel, "# BAD", bad.rsplit("# BAD: ", 1)[1])


def test_negative_register_values_are_valid():
    # Signed registers are documented. A negative start below a positive stop runs; a stop
    # below the start runs zero times (trn2core's choice, as Python's range).
    @tn.jit
    def k(x):
        out = _int_out(2)
        acc, one = _sbuf_int(0), _sbuf_int(1)
        for _ in nl.dynamic_range(nisa.register_alloc(-2), 2):
            _add(acc, one)
        for _ in nl.dynamic_range(nisa.register_alloc(-5)):
            _add(acc, one)
        for _ in nl.dynamic_range(3, nisa.register_alloc(1)):
            _add(acc, one)
        r = nisa.register_alloc()
        nisa.register_load(r, _sbuf_int(-7))
        nisa.dma_copy(dst=out[0:1, 0:1], src=acc)
        nisa.register_store(out[0:1, 1:2], r)
        return out

    assert k(np.zeros((1, 1), np.float32)).tolist() == [[4, -7]]


# ----------------------------------------------------------------------------- Ctrl-C

_LONG_LOOP = textwrap.dedent(
    """
    import sys
    import numpy as np
    import trn2core.nki as tn
    nl, nisa = tn.language, tn.isa

    @tn.jit
    def k(x):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        n = nisa.register_alloc(2**31 - 1)  # the largest signed 32-bit trip count
        for i in nl.dynamic_range(n):
            nisa.memset(dst=t, value=0)
            if int(i) == 10:
                print("looping", flush=True)
        return x

    try:
        k(np.zeros((1, 1), np.float32))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    """
)


def test_a_huge_register_loop_honours_ctrl_c():
    p = subprocess.Popen(
        [sys.executable, "-c", _LONG_LOOP],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert p.stdout.readline().strip() == "looping", p.stderr.read()
        time.sleep(0.2)
        sent = time.perf_counter()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 3, (out, err)
        assert "interrupted" in out
        assert time.perf_counter() - sent < 10
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
