"""Attack surface: the NeuronCore machine API (issue 28): tiles and access patterns (stride-0
views of terabytes, offsets and strides near 2**63, reshape products that wrap), and every
public method under hostile argument values. Each call runs in a capped interpreter: a crash is
a failure, a refusal must be the named ``Trn2Error`` subclass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import trn2core as t
from trn2core import Trn2Error

from ._probe import check_outcomes

SETUP = """
c = t.NeuronCore()
a = c.tile((128, 4), "fp32")
c.vector.memset(a, 1.0)
row = c.tile((1, 64), "fp32")
c.vector.memset(row, 2.0)
h = c.hbm_tensor(np.arange(64, dtype=np.float32).reshape(8, 8))
"""

CALLS = {
    # A stride-0 view is legal and holds no memory; gathering it must be refused, not abort.
    "read a 2 TiB repeating view": ("c.read(a.ap([(0, 65536), (0, 65536)]))", "CapacityError"),
    "read 2**32-1 repeated HBM rows": ("c.read(h.rows(2**32 - 1, 0))", "CapacityError"),
    "reduce a repeating operand": (
        "d = c.tile((128, 1), 'fp32'); c.vector.tensor_reduce(d, 'add', a.ap([(0, 2**31)]))",
        "CapacityError",
    ),
    "a small repeating view reads": "assert c.read(a.ap([(0, 3)])).tolist() == [[1.0] * 3] * 128",
    # Offsets and strides that wrapped past the bounds check (read element 0) or panicked.
    "stride 2**62": ("c.read(row.ap([(2**62, 2)]))", "ShapeError"),
    "stride 2**61": ("c.read(row.ap([(2**61, 2)]))", "ShapeError"),
    "offset 2**61": ("c.read(row.ap([(1, 2)], 2**61))", "ShapeError"),
    "rows step 2**62": ("c.read(h.rows(2, 2**62))", "ShapeError"),
    "size of a huge view is exact": (
        "assert h.ap([(0, 2**32 - 1), (0, 2**32 - 1)]).size == 8 * (2**32 - 1) ** 2"
    ),
    "reshape product that wraps": ("h.reshape_free([2**62 + 1, 4])", "ShapeError"),
    "reshape past u32": ("h.reshape_free([2**32, 1])", "ShapeError"),
    "the last element reads": "assert c.read(row.ap([(1, 1)], 63)).tolist() == [[2.0]]",
    "one past the last": ("c.read(row.ap([(1, 1)], 64))", "ShapeError"),
    # pyo3 conversion errors that escaped as TypeError / OverflowError / ValueError.
    "ap of a string": ("a.ap('ab')", "Trn2ValueError"),
    "ap num 2**32": ("a.ap([(1, 2**32)])", "Trn2ValueError"),
    "ap offset str": ("a.ap([(1, 2)], 'x')", "Trn2ValueError"),
    "rows of None": ("h.rows(None, 0)", "ShapeError"),
    "reshape of a string": ("h.reshape_free('ab')", "ShapeError"),
    # Tile.basic_view with sizes that do not describe the tile (it clamps to 128 partitions).
    "basic_view of other dims": ("a.basic_view((slice(0, 200), 0), [200, 4], 0)", "ShapeError"),
    "basic_view of a tile's dims": (
        "v, s, p = a.basic_view((slice(0, 64), 1), [128, 4], 0)\n"
        "assert (v.shape, s, p) == ([64, 1], [64, 1], 0), (v.shape, s, p)"
    ),
    "uninitialized None": ("t.NeuronCore(uninitialized=None)", "FormatError"),
    "start_partition -1": ("c.tile((1, 4), 'fp32', start_partition=-1)", "Trn2ValueError"),
    "space None": ("c.tile((1, 4), 'fp32', space=None)", "Trn2ValueError"),
    "name surrogate": ("c.tile((1, 4), 'fp32', name='\\udc80')", "Trn2ValueError"),
    "op None": ("c.vector.tensor_tensor(a, a, a, op=None)", "Trn2ValueError"),
    "reverse0 yes": ("c.vector.tensor_scalar(a, a, 'add', 1.0, reverse0='yes')", "Trn2ValueError"),
    "memset str": ("c.vector.memset(a, 'x')", "Trn2ValueError"),
    "axes -1": (
        "d = c.tile((128, 1), 'fp32'); c.vector.tensor_reduce(d, 'add', a, axes=-1)",
        "ShapeError",
    ),
    "iota pattern str": ("c.gpsimd.iota(c.tile((1, 4), 'int32'), 'ab')", "Trn2ValueError"),
    "dma queue -1": ("c.dma.copy(c.tile((8, 8), 'fp32'), h, queue=-1)", "Trn2ValueError"),
    "dma queue True": ("c.dma.copy(c.tile((8, 8), 'fp32'), h, queue=True)", "Trn2ValueError"),
    "dma queue 16": ("c.dma.copy(c.tile((8, 8), 'fp32'), h, queue=16)", "Trn2ValueError"),
}

# Host data a user passes: the host check of its machine copy comes before the copy (a
# broadcast scalar of 2**32 elements used to be copied, 16 GiB, before any check).
NAMED = "except t.CapacityError as e:\n    assert str(e).startswith('{arg}:'), e\n    raise"
HOST_CALLS = {
    "write a 2**32 broadcast": (
        "big = np.broadcast_to(np.float32(1), (2**32,))\n"
        "try:\n    c.write(a, big)\n" + NAMED.format(arg="data"),
        "CapacityError",
    ),
    "write a 2**32 float64 broadcast into bf16": (
        "big = np.broadcast_to(np.float64(1), (2**32,))\n"
        "try:\n    c.write(c.tile((128, 4), 'bf16'), big)\n" + NAMED.format(arg="data"),
        "CapacityError",
    ),
    "hbm_tensor of a 2**32 broadcast": (
        "big = np.broadcast_to(np.float32(1), (2**32,))\n"
        "try:\n    c.hbm_tensor(big)\n" + NAMED.format(arg="data"),
        "CapacityError",
    ),
    "hbm_tensor of a 2**31 broadcast into int8": (
        "big = np.broadcast_to(np.float64(1), (2**31,))\n"
        "try:\n    c.hbm_tensor(big, dtype='int8')\n" + NAMED.format(arg="data"),
        "CapacityError",
    ),
    "a small write still works": (
        "c.write(a, np.broadcast_to(np.float32(3), (128, 4)))\nassert (c.read(a) == 3).all()"
    ),
}


def test_host_data_is_checked_before_it_is_copied():
    # 2 GiB of address space: far below any of the copies, far above a small write.
    check_outcomes(HOST_CALLS, setup=SETUP, cap=2 << 30)


# Refused allocations leave every account as it was (the bytes of `alloc(..., name=5)` and of
# a dtype the machine refuses used to stay counted).
ACCOUNT_CALLS = {
    "name 5": ("c.alloc((128, 4), np.float32, name=5)", "Trn2ValueError"),
    "fp8_e4m3fn": ("c.alloc((128, 4), 'fp8_e4m3fn')", "FormatError"),
    "fp8_e4m3fn in psum": ("c.alloc((128, 4), 'fp8_e4m3fn', space='psum')", "FormatError"),
    "name surrogate": ("c.alloc((2, 4), np.float32, name='\\udc80')", "Trn2ValueError"),
    "accounts unchanged": (
        "now = [(m.used, m.allocations) for m in (c.sbuf, c.psum, c.hbm)]\n"
        "assert now == before, (now, before)"
    ),
}


def test_refused_allocations_leave_the_accounts_unchanged():
    setup = SETUP + "before = [(m.used, m.allocations) for m in (c.sbuf, c.psum, c.hbm)]\n"
    check_outcomes(ACCOUNT_CALLS, setup=setup)


def test_machine_api_refuses_hostile_patterns_and_values_by_name():
    check_outcomes(CALLS, setup=SETUP)


NKI_SETUP = """
import trn2core.nki as tn
nl = tn.language
lnl = tn.language_legacy
"""

NKI_CALLS = {
    "sum of a 2**31 broadcast": (
        "@tn.jit\n"
        "def k(x):\n"
        "    out = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.shared_hbm)\n"
        "    t = nl.load(x)\n"
        "    nl.store(out, value=nl.sum(t.broadcast_to((128, 2**31)), axis=1, keepdims=True))\n"
        "    return out\n"
        "k(np.ones((128, 1), np.float32))",
        "CapacityError",
    ),
    "mask over arange(10**12)": (
        "@tn.jit_legacy\n"
        "def k(x):\n"
        "    out = lnl.ndarray((128, 4), dtype=nl.float32, buffer=lnl.shared_hbm)\n"
        "    i = lnl.arange(10**12)[:, None]\n"
        "    j = lnl.arange(4)[None, :]\n"
        "    t = lnl.load(x[i, j], mask=(i < 128))\n"
        "    lnl.store(out[i, j], value=t, mask=(i < 128))\n"
        "    return out\n"
        "k(np.ones((128, 4), np.float32))",
        "any",
    ),
}


def test_nki_launches_refuse_huge_views_and_solve_masks_arithmetically():
    check_outcomes(NKI_CALLS, setup=NKI_SETUP, timeout=60)


# ------------------------------------------------------------------ hostile values, in process

HOSTILE = [None, -1, 2**64, "x", True, 1.5, math.nan]


def _core():
    c = t.NeuronCore()
    a = c.tile((128, 4), "fp32")
    c.vector.memset(a, 1.0)
    return c, a


# (method, argument, call(c, a, value)); each argument of the public machine methods that is
# not a tile (tiles are named by the binding's own conversion).
METHODS = {
    "NeuronCore(uninitialized)": ("uninitialized", lambda c, a, v: t.NeuronCore(uninitialized=v)),
    "NeuronCore(rounding)": ("rounding", lambda c, a, v: t.NeuronCore(rounding=v)),
    "NeuronCore(seed)": ("seed", lambda c, a, v: t.NeuronCore(seed=v)),
    "tile(space)": ("space", lambda c, a, v: c.tile((1, 4), "fp32", space=v)),
    "tile(start_partition)": (
        "start_partition",
        lambda c, a, v: c.tile((1, 4), "fp32", start_partition=v),
    ),
    "tile(address)": ("address", lambda c, a, v: c.tile((1, 4), "fp32", address=v)),
    "tile(name)": ("name", lambda c, a, v: c.tile((1, 4), "fp32", name=v)),
    "vector.tensor_tensor(op)": ("op", lambda c, a, v: c.vector.tensor_tensor(a, a, a, op=v)),
    "vector.tensor_scalar(op0)": ("op0", lambda c, a, v: c.vector.tensor_scalar(a, a, v, 1.0)),
    "vector.tensor_scalar(reverse0)": (
        "reverse0",
        lambda c, a, v: c.vector.tensor_scalar(a, a, "add", 1.0, reverse0=v),
    ),
    "vector.tensor_scalar(op1)": (
        "op1",
        lambda c, a, v: c.vector.tensor_scalar(a, a, "add", 1.0, op1=v, operand1=1.0),
    ),
    "vector.memset(value)": ("value", lambda c, a, v: c.vector.memset(a, v)),
    "gpsimd.memset(value)": ("value", lambda c, a, v: c.gpsimd.memset(a, v)),
    "vector.tensor_reduce(axes)": (
        "axes",
        lambda c, a, v: c.vector.tensor_reduce(c.tile((128, 1), "fp32"), "add", a, axes=v),
    ),
    "vector.tensor_reduce(negate)": (
        "negate",
        lambda c, a, v: c.vector.tensor_reduce(c.tile((128, 1), "fp32"), "add", a, negate=v),
    ),
    "vector.tensor_reduce(op)": (
        "op",
        lambda c, a, v: c.vector.tensor_reduce(c.tile((128, 1), "fp32"), v, a),
    ),
    "scalar.activation(func)": ("func", lambda c, a, v: c.scalar.activation(a, a, v)),
    "scalar.activation(reduce_cmd)": (
        "reduce_cmd",
        lambda c, a, v: c.scalar.activation(a, a, "copy", reduce_cmd=v),
    ),
    "gpsimd.iota(pattern)": (
        "pattern",
        lambda c, a, v: c.gpsimd.iota(c.tile((1, 4), "int32"), v),
    ),
    "gpsimd.iota(offset)": (
        "offset",
        lambda c, a, v: c.gpsimd.iota(c.tile((1, 4), "int32"), [(1, 4)], offset=v),
    ),
    "gpsimd.affine_select(on_false_value)": (
        "on_false_value",
        lambda c, a, v: c.gpsimd.affine_select(a, [(1, 4)], 1, a, v),
    ),
    "pe.matmul(is_transpose)": (
        "is_transpose",
        lambda c, a, v: c.pe.matmul(c.tile((128, 4), "fp32", space="psum"), a, a, is_transpose=v),
    ),
    "dma.copy(queue)": ("queue", lambda c, a, v: c.dma.copy(a, a, queue=v)),
    "Tile.ap(pattern)": ("pattern", lambda c, a, v: a.ap(v)),
    "Tile.ap(offset)": ("offset", lambda c, a, v: a.ap([(1, 2)], v)),
    "Tile.reshape_free(shape)": ("shape", lambda c, a, v: a.reshape_free(v)),
    "Tile.basic_view(key)": ("key", lambda c, a, v: a.basic_view(v, [128, 4], 0)),
    "Tile.basic_view(dims)": ("dims", lambda c, a, v: a.basic_view((0, 0), v, 0)),
    "Tile.basic_view(pdim)": ("pdim", lambda c, a, v: a.basic_view((0, 0), [128, 4], v)),
    "Tile.rows(count)": ("count", lambda c, a, v: c.hbm_tensor(np.ones(4, np.float32)).rows(v, 0)),
    "Tile.rows(step)": ("step", lambda c, a, v: c.hbm_tensor(np.ones(4, np.float32)).rows(1, v)),
}

# Values that are legal for an argument (they must not raise at all, or raise for another
# reason a Trn2Error covers): a number for a number, nan for memset, None for optionals.
LEGAL = {
    ("value", 1.5),
    ("value", math.nan),
    ("value", -1),
    ("value", 2**64),
    ("on_false_value", 1.5),
    ("on_false_value", math.nan),
    ("on_false_value", -1),
    ("on_false_value", 2**64),
    ("op1", None),
    ("address", None),
    ("name", None),
    ("queue", None),
    ("offset", -1),
    ("offset", None),
    ("step", -1),
    ("seed", None),
    ("negate", True),
    ("reverse0", True),
    ("is_transpose", True),
    ("name", "x"),
    ("pdim", None),
}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_every_machine_method_names_a_hostile_argument(method, value):
    arg, call = METHODS[method]
    c, a = _core()
    try:
        call(c, a, value)
    except Trn2Error as e:
        if (arg, value) not in LEGAL:
            assert arg in str(e), (method, value, str(e))
        return
    except BaseException as e:  # noqa: BLE001 - anything else breaks the contract
        pytest.fail(f"{method} with {value!r}: {type(e).__name__}: {e}")
    assert (arg, value) in LEGAL, f"{method} accepted {value!r}"


@pytest.mark.parametrize("how", ["write", "hbm_tensor"])
def test_host_data_is_converted_once_by_the_machines_rules(how):
    c = t.NeuronCore()

    def put(data, dtype):
        data = np.asarray(data)
        if how == "hbm_tensor":
            return c.read(c.hbm_tensor(data, dtype=dtype))
        tile = c.tile((1, data.size), dtype)
        c.write(tile, data.reshape(1, -1))
        return c.read(tile).reshape(-1)

    # Rounded once from float64 (through float32 it was 1.0, a double rounding).
    assert put([1 + 2**-8 + 2**-30], "bf16").astype(np.float64).tolist() == [1.0078125]
    assert (
        put([1 + 2**-8 + 2**-30], "bf16").tolist()
        == t.quantize(np.array([1 + 2**-8 + 2**-30]), "bf16").tolist()
    )
    # Integers saturate, round to nearest even and take NaN to 0, as tensor_copy does (numpy's
    # cast gave [44, 0, ...]).
    got = put([300.0, -1e10, np.nan, 2.5, -3.5], "int8")
    assert got.tolist() == [127, -128, 0, 2, -4]
    src = c.tile((1, 5), "fp32")
    c.write(src, np.array([[300.0, -1e10, np.nan, 2.5, -3.5]], np.float32))
    dst = c.tile((1, 5), "int8")
    c.vector.tensor_copy(dst, src)
    assert c.read(dst).reshape(-1).tolist() == got.tolist()
    assert put(np.array([300, -129, 5], np.int64), "int8").tolist() == [127, -128, 5]
    assert put(np.array([2**63 + 5], np.uint64), "uint32").tolist() == [2**32 - 1]


# The instruction table's one entry (`_core.Machine.issue`) and the forms generated from its
# rows: every argument is checked against the row, so no conversion error escapes and every
# refusal names the argument the caller wrote.
ISSUE_SETUP = (
    SETUP
    + """
m = c._m
d = c.tile((128, 4), "fp32")
top = c.tile((128, 8), "fp32")
wide = c.tile((128, 16), "fp32")
c.vector.memset(wide, 1.0)
import trn2core.nki as tn
"""
)


def _names(arg: str) -> str:
    return f"except t.Trn2Error as e:\n    assert e.arg == {arg!r}, (e.arg, str(e))\n    raise"


ISSUE_CALLS = {
    "unknown opcode": ("try:\n    m.issue('max9', d, a)\n" + _names("opcode"), "Trn2ValueError"),
    "opcode not a str": ("try:\n    m.issue(5, d, a)\n" + _names("opcode"), "Trn2ValueError"),
    "opcode surrogate": ("m.issue('\\udc80', d, a)", "Trn2ValueError"),
    "keyword surrogate": ("m.issue('reciprocal', d, a, **{'\\udc80': 1})", "Trn2ValueError"),
    "too many arguments": (
        "try:\n    m.issue('reciprocal', d, a, a)\n" + _names("args"),
        "Trn2ValueError",
    ),
    "missing argument": ("try:\n    m.issue('reciprocal', d)\n" + _names("data"), "Trn2ValueError"),
    "unknown keyword": (
        "try:\n    m.issue('reciprocal', d, a, bogus=1)\n" + _names("bogus"),
        "Trn2ValueError",
    ),
    "given twice": (
        "try:\n    m.issue('reciprocal', d, a, data=a)\n" + _names("data"),
        "Trn2ValueError",
    ),
    "a number for a tile": (
        "try:\n    m.issue('reciprocal', d, 1.0)\n" + _names("data"),
        "Trn2ValueError",
    ),
    "a tile for an operator": (
        "try:\n    m.issue('tensor_tensor', 'vector', d, a, a, a)\n" + _names("op"),
        "Trn2ValueError",
    ),
    "None for a defaulted flag": (
        "try:\n    m.issue('tensor_reduce', c.tile((128, 1), 'fp32'), 'add', a, 1, None)\n"
        + _names("negate"),
        "Trn2ValueError",
    ),
    "2**70 for an integer": (
        "try:\n    m.issue('iota', c.tile((1, 4), 'int32'), [(1, 4)], 2**70)\n" + _names("offset"),
        "Trn2ValueError",
    ),
    "a negative pattern size": (
        "try:\n    m.issue('iota', c.tile((1, 4), 'int32'), [(1, -4)])\n" + _names("pattern"),
        "Trn2ValueError",
    ),
    "queue 300": (
        "try:\n    m.issue('dma_copy', c.tile((8, 8), 'fp32'), h, 300)\n" + _names("queue"),
        "Trn2ValueError",
    ),
    "an engine the row does not list": (
        "try:\n    m.issue('tensor_tensor', 'scalar', d, a, a, 'add')\n" + _names("engine"),
        "Trn2ValueError",
    ),
    "the machine API's func alias is named as written": (
        "try:\n    c.scalar.activation(d, a, func='nope')\n" + _names("func"),
        "Trn2ValueError",
    ),
    "a NaN float is a value": "m.issue('memset', 'vector', d, float('nan'))",
    "a generated view refuses a wrong kind": (
        "try:\n    c.vector.max8(top, 'x')\n" + _names("src"),
        "Trn2ValueError",
    ),
    "an engine without the instruction": (
        "try:\n    c.gpsimd.max8(top, wide)\n" + _names("max8"),
        "UnknownInstructionError",
    ),
    "hasattr still works": "assert not hasattr(c.gpsimd, 'max8')",
    "max8 through the view works": "c.vector.max8(top, wide)\nassert (c.read(top) == 1).all()",
}


def test_the_instruction_table_entry_names_every_bad_argument():
    check_outcomes(ISSUE_CALLS, setup=ISSUE_SETUP)
