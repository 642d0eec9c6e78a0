"""Every bad input on every public function (issue 8): a table of (function, argument, bad value,
expected error class). Each case asserts the contract's class and that the message names the
argument; docs/limitations.md lists the same table.

Rule (python/trn2core/_validate.py): ShapeError for shapes, dimensions, axes and ragged lists;
FormatError for dtypes, formats, codecs and modes; Trn2ValueError for other bad scalars (wrong
type or range); CapacityError for results the host cannot hold. Never a bare TypeError, never a
crash.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
import trn2core as t
from trn2core import (
    CapacityError,
    CorruptDataError,
    FormatError,
    ShapeError,
    SparsityError,
    Trn2Error,
)
from trn2core.errors import Trn2ValueError

X = np.array([1.0, -2.5, 3.0, 0.0])
BF = t.quantize(np.arange(16, dtype=np.float32).reshape(4, 4) / 7, "bf16")
F32 = np.ones((4, 4), np.float32)
SPARSE = np.array([[1.0, 0, 2.0, 0, 0, 3.0, 0, 4.0]], np.float32)
STREAM = t.dma.compress(X).to_bytes()


class Opaque:
    """A user object numpy cannot read as numbers."""


#: Values that are not arrays of real numbers, and the class each must get.
BAD_ARRAYS = [
    ("str", "abc", FormatError),
    ("bytes", b"\x00\x01", FormatError),
    ("object", Opaque(), FormatError),
    ("none", None, FormatError),
    ("complex", np.array([1 + 2j, 3j]), FormatError),
    ("complex-scalar", 1 + 2j, FormatError),
    ("datetime", datetime.datetime(2024, 1, 1), FormatError),
    ("datetime64", np.array(["2024-01-01"], dtype="datetime64[D]"), FormatError),
    ("timedelta64", np.array([1, 2], dtype="timedelta64[s]"), FormatError),
    ("ragged", [[1.0, 2.0], [3.0]], ShapeError),
    ("object-array", np.array([1.0, "a"], dtype=object), FormatError),
    ("structured", np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")]), FormatError),
    ("dict", {"a": 1}, FormatError),
]

#: Scalars of the wrong type for any integer argument.
BAD_INTS = [
    ("str", "3"),
    ("float", 1.5),
    ("integral-float", 2.0),
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("list", [1]),
    ("complex", 1j),
    ("bool", True),
]
#: Values that are not one of a set of names.
BAD_NAMES = [
    ("unknown", "nope"),
    ("int", 3),
    ("none", None),
    ("bytes", b"bf16"),
    ("padded", " bf16"),
    ("upper", "BF16"),
    ("object", Opaque()),
]
#: Values that are not booleans.
BAD_BOOLS = [("str", "no"), ("int", 1), ("none", None), ("float", 0.0), ("list", [])]


@dataclass
class Case:
    id: str
    call: Callable[[], object]
    error: type[BaseException]
    arg: str  # the message must name it


CASES: list[Case] = []


def case(id: str, error, arg: str, call) -> None:
    CASES.append(Case(id, call, error, arg))


def arrays(fn: str, arg: str, call: Callable[[object], object], *, complex_ok=False) -> None:
    """Every non-array for an array argument (complex data is fine where only bytes move)."""
    for name, bad, err in BAD_ARRAYS:
        if not (complex_ok and name.startswith("complex")):
            case(f"{fn}-{arg}-{name}", err, arg, lambda bad=bad: call(bad))


def ints(fn: str, arg: str, call, err=Trn2ValueError, extra=(), optional=False, skip=()) -> None:
    """Bad values for an integer argument (``None`` too, unless the argument is optional)."""
    bad_values = list(BAD_INTS) + ([] if optional else [("none", None)]) + list(extra)
    for name, bad in bad_values:
        if name not in skip:
            case(f"{fn}-{arg}-{name}", err, arg, lambda bad=bad: call(bad))


def names(fn: str, arg: str, call, err=FormatError, optional=False) -> None:
    """Bad values for a name argument (``None`` too, unless the argument is optional)."""
    for name, bad in BAD_NAMES:
        if not (optional and bad is None):
            case(f"{fn}-{arg}-{name}", err, arg, lambda bad=bad: call(bad))


def bools(fn: str, arg: str, call) -> None:
    for name, bad in BAD_BOOLS:
        case(f"{fn}-{arg}-{name}", Trn2ValueError, arg, lambda bad=bad: call(bad))


# -- numerics -------------------------------------------------------------------------------
names("format_info", "dtype", lambda v: t.format_info(v))
ints(
    "format_info",
    "exponent_bias",
    lambda v: t.format_info("fp8_e4m3", exponent_bias=v),
    optional=True,
    extra=[("negative", -1), ("too-big", 128), ("huge", 2**70)],
)
case(
    "format_info-exponent_bias-not-fp8",
    FormatError,
    "exponent_bias",
    lambda: t.format_info("bf16", exponent_bias=3),
)
for fn, f in (("quantize", t.quantize), ("encode", t.encode)):
    arrays(fn, "x", lambda v, f=f: f(v, "bf16"))
    case(f"{fn}-x-bool", FormatError, "x", lambda f=f: f(np.array([True, False]), "bf16"))
    names(fn, "dtype", lambda v, f=f: f(X, v))
    names(fn, "rounding", lambda v, f=f: f(X, "bf16", rounding=v))
    bools(fn, "saturate", lambda v, f=f: f(X, "bf16", saturate=v))
    ints(
        fn,
        "seed",
        lambda v, f=f: f(X, "bf16", rounding="stochastic", seed=v),
        optional=True,
        extra=[("negative", -1), ("too-big", 2**64)],
    )
    ints(
        fn,
        "random_bit_count",
        lambda v, f=f: f(
            X, "bf16", rounding="stochastic", random_bits=np.zeros(4, np.uint32), random_bit_count=v
        ),
        extra=[("zero", 0), ("too-big", 33)],
    )
    for name, bad in [
        ("float", np.zeros(4)),
        ("negative", np.array([-1, 0, 0, 0])),
        ("too-big", np.full(4, 256)),
        ("str", "abc"),
        ("none-count", None),
    ]:
        count = None if name == "none-count" else 8
        bits = np.zeros(4, np.uint32) if name == "none-count" else bad
        err = Trn2ValueError
        arg = "random_bit_count" if name == "none-count" else "random_bits"
        case(
            f"{fn}-random_bits-{name}",
            err,
            arg,
            lambda f=f, b=bits, c=count: f(
                X, "bf16", rounding="stochastic", random_bits=b, random_bit_count=c
            ),
        )
    case(
        f"{fn}-random_bits-shape",
        ShapeError,
        "random_bits",
        lambda f=f: f(
            X, "bf16", rounding="stochastic", random_bits=np.zeros(3, np.uint32), random_bit_count=8
        ),
    )
    case(
        f"{fn}-random_bits-not-stochastic",
        Trn2ValueError,
        "random_bits",
        lambda f=f: f(X, "bf16", random_bits=np.zeros(4, np.uint32), random_bit_count=8),
    )
    case(
        f"{fn}-seed-and-bits",
        Trn2ValueError,
        "random_bits",
        lambda f=f: f(
            X,
            "bf16",
            rounding="stochastic",
            seed=1,
            random_bits=np.zeros(4, np.uint32),
            random_bit_count=8,
        ),
    )
ints(
    "encode",
    "exponent_bias",
    lambda v: t.encode(X, "fp8_e4m3", exponent_bias=v),
    optional=True,
    extra=[("negative", -1), ("too-big", 128)],
)
case(
    "encode-exponent_bias-not-fp8",
    FormatError,
    "exponent_bias",
    lambda: t.encode(X, "bf16", exponent_bias=3),
)
arrays("decode", "codes", lambda v: t.decode(v, "fp8_e4m3"))
case("decode-codes-float", FormatError, "codes", lambda: t.decode(X, "fp8_e4m3"))
case(
    "decode-codes-width", FormatError, "codes", lambda: t.decode(np.zeros(3, np.uint16), "fp8_e4m3")
)
case(
    "decode-codes-signed", FormatError, "codes", lambda: t.decode(np.zeros(3, np.int8), "fp8_e4m3")
)
names("decode", "dtype", lambda v: t.decode(np.zeros(3, np.uint8), v))
ints(
    "decode",
    "exponent_bias",
    lambda v: t.decode(np.zeros(3, np.uint8), "fp8_e4m3", exponent_bias=v),
    optional=True,
)
ints(
    "stochastic_bits",
    "shape",
    lambda v: t.stochastic_bits(v),
    err=ShapeError,
    skip=("list",),
    extra=[("negative", -1), ("negative-dim", (3, -1)), ("ragged", [[1, 2], 3])],
)
case("stochastic_bits-shape-huge", CapacityError, "shape", lambda: t.stochastic_bits((2**40,)))
case(
    "stochastic_bits-shape-overflow", ShapeError, "shape", lambda: t.stochastic_bits((2**40, 2**40))
)
case(
    "stochastic_bits-shape-empty-but-huge",
    ShapeError,
    "shape",
    lambda: t.stochastic_bits((0, 2**61)),
)
case("stochastic_bits-shape-beyond-u64", ShapeError, "shape", lambda: t.stochastic_bits(2**70))
ints(
    "stochastic_bits",
    "seed",
    lambda v: t.stochastic_bits(3, seed=v),
    extra=[("negative", -1), ("too-big", 2**64)],
)

# -- tensor engine --------------------------------------------------------------------------
ints("NeuronCore", "index", lambda v: t.NeuronCore(v), extra=[("negative", -1), ("huge", 2**70)])
CORE = t.NeuronCore()
arrays("matmul", "stationary", lambda v: CORE.matmul(v, BF))
arrays("matmul", "moving", lambda v: CORE.matmul(BF, v))
for name, bad, err in [
    ("0-d", np.float32(1.0), ShapeError),
    ("1-d", np.ones(4, np.float32), ShapeError),
    ("empty", np.ones((0, 4), np.float32), ShapeError),
    ("too-big-K", np.ones((129, 4), np.float32), ShapeError),
    ("float64", np.ones((4, 4)), FormatError),
    ("e4m3fn", t.quantize(np.ones((4, 4)), "fp8_e4m3fn"), FormatError),
]:
    case(f"matmul-stationary-{name}", err, "stationary", lambda b=bad: CORE.matmul(b, F32))
ints(
    "matmul",
    "bank",
    lambda v: CORE.matmul(BF, BF, bank=v),
    extra=[("negative", -1), ("too-big", 8), ("huge", 2**70)],
)
bools("matmul", "accumulate", lambda v: CORE.matmul(BF, BF, accumulate=v))
names("matmul", "perf_mode", lambda v: CORE.matmul(BF, BF, perf_mode=v))
for arg in ("tile_position", "tile_size"):
    for name, bad in [
        ("str", "ab"),
        ("short", (0,)),
        ("float", (0.5, 0)),
        ("negative", (-1, 0)),
        ("huge", (2**70, 0)),
        ("none-item", (None, 0)),
    ]:
        kw = {"tile_position": (0, 0), "tile_size": (64, 64)}
        kw[arg] = bad
        case(f"matmul-{arg}-{name}", Trn2ValueError, arg, lambda kw=kw: CORE.matmul(BF, BF, **kw))
case(
    "matmul-tile_size-not-a-size",
    Trn2ValueError,
    "tile_size",
    lambda: CORE.matmul(BF, BF, tile_position=(0, 0), tile_size=(48, 48)),
)
case(
    "matmul-formats-unknown",
    FormatError,
    "stationary",
    lambda: CORE.matmul(F32, F32, formats=("fp7", None)),
)
case("matmul-formats-type", Trn2ValueError, "formats", lambda: CORE.matmul(F32, F32, formats=3))
bools("matmul", "is_transpose", lambda v: CORE.matmul(BF, BF, is_transpose=v))
case(
    "matmul-transpose-huge",
    ShapeError,
    "stationary",
    lambda: CORE.matmul(np.ones((10**6, 1), np.float32), F32, is_transpose=True),
)
case(
    "matmul-accumulate-unwritten",
    Trn2ValueError,
    "accumulate",
    lambda: t.NeuronCore().matmul(BF, BF, bank=5, accumulate=True),
)
for arg, pos in (("bank", 0), ("rows", 1), ("cols", 2)):

    def read(v, pos=pos):
        args = [0, 4, 4]
        args[pos] = v
        return CORE.read_psum(*args)

    err = Trn2ValueError if arg == "bank" else ShapeError
    ints("read_psum", arg, read, err=err, extra=[("negative", -1), ("huge", 2**70)])
case("read_psum-rows-too-big", ShapeError, "rows", lambda: CORE.read_psum(0, 129, 4))
case("read_psum-cols-too-big", ShapeError, "cols", lambda: CORE.read_psum(0, 4, 513))

arrays("gemm", "a", lambda v: t.gemm(v, F32))
arrays("gemm", "b", lambda v: t.gemm(F32, v))
for name, bad, err in [
    ("0-d", np.float32(2.0), ShapeError),
    ("1-d", np.ones(4), ShapeError),
    ("3-d", np.ones((2, 2, 2)), ShapeError),
    ("empty", np.ones((0, 4)), ShapeError),
    ("bool", np.ones((4, 4), bool), FormatError),
    ("K-mismatch", np.ones((4, 5)), ShapeError),
]:
    case(f"gemm-a-{name}", err, "a" if name != "K-mismatch" else "b", lambda b=bad: t.gemm(b, F32))
case(
    "gemm-a-sparse-wrong-axis",
    SparsityError,
    "a",
    lambda: t.gemm(t.compress(SPARSE.T.copy(), "2:4", axis=0), np.ones((1, 3))),
)
case("gemm-core-type", Trn2ValueError, "core", lambda: t.gemm(F32, F32, core="core0"))
names("gemm", "dtype", lambda v: t.gemm(F32, F32, dtype=v), optional=True)
names("gemm", "out_dtype", lambda v: t.gemm(F32, F32, out_dtype=v))
names("gemm", "perf_mode", lambda v: t.gemm(F32, F32, perf_mode=v))
names("gemm", "rounding", lambda v: t.gemm(F32, F32, rounding=v))
ints(
    "gemm",
    "seed",
    lambda v: t.gemm(F32, F32, dtype="bf16", rounding="stochastic", seed=v),
    optional=True,
    extra=[("negative", -1), ("too-big", 2**64)],
)
bools("gemm", "throttle", lambda v: t.gemm(F32, F32, throttle=v))
case(
    "gemm-double_row-bf16",
    FormatError,
    "double_row",
    lambda: t.gemm(BF, BF, perf_mode="double_row"),
)
# A 4 TiB result from two 4 MiB operands: refused before anything is allocated.
case(
    "gemm-out-beyond-host",
    CapacityError,
    "out",
    lambda: t.gemm(np.ones((2**20, 1), np.float32), np.ones((1, 2**20), np.float32)),
)
for arg, pos in (("M", 0), ("K", 1), ("N", 2)):

    def est(v, pos=pos):
        dims = [4, 4, 4]
        dims[pos] = v
        return t.estimate_gemm(*dims)

    ints(
        "estimate_gemm",
        arg,
        est,
        err=ShapeError,
        extra=[("zero", 0), ("negative", -5), ("beyond-u64", 2**64)],
    )
case(
    "estimate_gemm-too-many-instructions",
    CapacityError,
    "shape",
    lambda: t.estimate_gemm(2**62, 2**62, 2**62),
)
names("estimate_gemm", "dtype", lambda v: t.estimate_gemm(4, 4, 4, dtype=v))
names("estimate_gemm", "perf_mode", lambda v: t.estimate_gemm(4, 4, 4, perf_mode=v))
names(
    "estimate_gemm",
    "sparsity",
    lambda v: t.estimate_gemm(4, 4, 4, sparsity=v),
    err=Trn2ValueError,
    optional=True,
)
case("estimate_gemm-core-type", Trn2ValueError, "core", lambda: t.estimate_gemm(4, 4, 4, core=1))
bools("estimate_gemm", "throttle", lambda v: t.estimate_gemm(4, 4, 4, throttle=v))

# -- sparsity -------------------------------------------------------------------------------
for fn, f in (("prune", t.prune), ("compress", t.compress)):
    arrays(fn, "x", lambda v, f=f: f(v, "2:4"))
    names(fn, "pattern", lambda v, f=f: f(SPARSE, v), err=Trn2ValueError)
    ints(
        fn,
        "axis",
        lambda v, f=f: f(SPARSE, "2:4", axis=v),
        err=ShapeError,
        extra=[("out-of-range", 2), ("negative-out-of-range", -3), ("huge", 2**70)],
    )
    case(f"{fn}-x-0-d", ShapeError, "axis", lambda f=f: f(np.float32(1.0), "2:4"))
    case(f"{fn}-x-not-multiple", ShapeError, "axis", lambda f=f: f(np.ones((2, 6)), "2:4"))
case("compress-x-not-sparse", SparsityError, "x", lambda: t.compress(np.ones((1, 8)), "2:4"))
case("compress-x-already", FormatError, "x", lambda: t.compress(t.compress(SPARSE, "2:4"), "2:4"))
arrays(
    "from_cutlass", "values", lambda v: t.SparseTensor.from_cutlass(v, np.zeros((1, 1), np.int16))
)
arrays(
    "from_cutlass", "meta", lambda v: t.SparseTensor.from_cutlass(np.ones((16, 8), np.float16), v)
)
case(
    "from_cutlass-meta-dtype",
    FormatError,
    "meta",
    lambda: t.SparseTensor.from_cutlass(np.ones((16, 8), np.float16), np.zeros(8, np.uint16)),
)
case(
    "from_cutlass-meta-size",
    ShapeError,
    "meta",
    lambda: t.SparseTensor.from_cutlass(np.ones((16, 8), np.float16), np.zeros(3, np.int16)),
)
case(
    "from_cutlass-values-1-d",
    ShapeError,
    "values",
    lambda: t.SparseTensor.from_cutlass(np.ones(8, np.float16), np.zeros(8, np.int16)),
)
_CUT_VALUES, _CUT_META = t.compress(
    np.tile([1, 0, 2, 0], (64, 8)).astype(np.float16), "2:4", axis=1
).to_cutlass()
case(
    "from_cutlass-meta-codes",
    Trn2ValueError,
    "meta",
    lambda: t.SparseTensor.from_cutlass(_CUT_VALUES, np.full_like(_CUT_META, 0x7FFF)),
)
case(
    "to_cutlass-pattern",
    SparsityError,
    "to_cutlass",
    lambda: t.compress(np.zeros((4, 16), np.float16), "4:16", axis=1).to_cutlass(),
)

# -- DMA ------------------------------------------------------------------------------------
arrays("dma.compress", "x", lambda v: t.dma.compress(v))
names("dma.compress", "codec", lambda v: t.dma.compress(X, v))
for fn, f in (("dma.decompress", t.dma.decompress), ("from_bytes", t.dma.Compressed.from_bytes)):
    for name, bad in [
        ("int", 10**12),
        ("str", "T2CZ"),
        ("none", None),
        ("list", [1, 2]),
        ("float-array", np.zeros(4)),
    ]:
        case(
            f"{fn}-{name}",
            Trn2ValueError,
            "blob" if fn == "dma.decompress" else "b",
            lambda bad=bad, f=f: f(bad),
        )
    for name, bad in [
        ("empty", b""),
        ("truncated", STREAM[:-1]),
        ("garbage", b"\x00" * 100),
        ("flipped", STREAM[:9] + bytes([STREAM[9] ^ 1]) + STREAM[10:]),
    ]:
        case(f"{fn}-{name}", CorruptDataError, "stream", lambda bad=bad, f=f: f(bad))
arrays("dma_copy", "x", lambda v: t.dma.dma_copy(v), complex_ok=True)
names("dma_copy", "codec", lambda v: t.dma.dma_copy(X, codec=v))
names("dma_copy", "src", lambda v: t.dma.dma_copy(X, src=v), err=Trn2ValueError)
names("dma_copy", "dst", lambda v: t.dma.dma_copy(X, dst=v), err=Trn2ValueError)
names("core.dma_copy", "src", lambda v: CORE.dma_copy(X, src=v), err=Trn2ValueError)

# -- chips, logical cores, machines, torus ----------------------------------------------------
# lnc=None is the default since issue 29 (NEURON_LOGICAL_NC_CONFIG, else 2), not a bad value.
ints(
    "Chip",
    "lnc",
    lambda v: t.Chip(lnc=v),
    optional=True,
    extra=[("zero", 0), ("three", 3), ("eight", 8), ("negative", -1), ("huge", 2**70)],
)
ints("Chip", "index", lambda v: t.Chip(index=v), extra=[("negative", -1), ("huge", 2**70)])
CHIP = t.Chip()
case("LogicalCore-chip-type", Trn2ValueError, "chip", lambda: t.LogicalCore("chip0", 0))
ints(
    "LogicalCore",
    "index",
    lambda v: t.LogicalCore(CHIP, v),
    extra=[("negative", -1), ("out-of-range", 4), ("huge", 2**70)],
)
names("peak_tflops", "dtype", lambda v: CHIP.cores[0].peak_tflops(v))
names("peak_tflops", "perf_mode", lambda v: CHIP.peak_tflops("bf16", perf_mode=v))
case("peak_tflops-dtype-list", FormatError, "dtype", lambda: CHIP.peak_tflops(["bf16"]))
names("Instance", "instance_type", lambda v: t.Instance(v), err=Trn2ValueError)
case(
    "Instance-instance_type-list",
    Trn2ValueError,
    "instance_type",
    lambda: t.Instance(["trn2.48xlarge"]),
)
for fn, make in (
    ("Instance", lambda v: t.Instance(lnc=v)),
    ("UltraServer", lambda v: t.UltraServer(lnc=v)),
):
    ints(fn, "lnc", make, optional=True, extra=[("zero", 0), ("three", 3), ("huge", 2**70)])
ints(
    "UltraCluster",
    "n_ultraservers",
    lambda v: t.UltraCluster(v),
    extra=[("zero", 0), ("negative", -1), ("too-big", 4097), ("huge", 2**70)],
)
for name, bad, err in [
    ("int", 3, ShapeError),
    ("none", None, ShapeError),
    ("str", "4x4", ShapeError),
    ("zero", (0,), ShapeError),
    ("too-big", (65, 4), ShapeError),
    ("four-d", (4, 4, 4, 4), ShapeError),
    ("float", (4.0, 4), Trn2ValueError),
    ("huge", (2**70,), Trn2ValueError),
]:
    case(f"Torus-shape-{name}", err, "shape", lambda bad=bad: t.Torus(bad))
# (the message says n_ultraservers)
ints(
    "Torus", "ultraservers", lambda v: t.Torus((4, 4, 4), v), extra=[("zero", 0), ("too-big", 4097)]
)
TORUS = t.Instance().topology
ints(
    "Torus.coords",
    "i",
    lambda v: TORUS.coords(v),
    extra=[("negative", -1), ("out-of-range", 16), ("huge", 2**70)],
)
for fn in ("hops", "link_bandwidth", "route", "neighbors"):
    call = (
        (lambda v, fn=fn: getattr(TORUS, fn)(v))
        if fn == "neighbors"
        else (lambda v, fn=fn: getattr(TORUS, fn)(0, v))
    )
    arg = "i" if fn == "neighbors" else "j"
    ints(f"Torus.{fn}", arg, call, extra=[("negative", -1), ("out-of-range", 16)])
case(
    "Torus.link_bandwidth-j-not-linked",
    Trn2ValueError,
    "not directly linked",
    lambda: TORUS.link_bandwidth(0, 5),
)
for name, bad, err in [
    ("none", None, ShapeError),
    ("int", 3, ShapeError),
    ("short", (0,), ShapeError),
    ("out-of-range", (4, 0), Trn2ValueError),
    ("str-item", ("a", 0), Trn2ValueError),
]:
    case(f"Torus.index-coords-{name}", err, "coords", lambda bad=bad: TORUS.index(bad))

# -- collectives ------------------------------------------------------------------------------
INST = t.Instance()
GOOD = [np.full(8, r, np.float32) for r in range(16)]
NOT_SEQUENCES = [
    ("str", "abc"),
    ("none", None),
    ("object", Opaque()),
    ("int", 3),
    ("ndarray", np.zeros((16, 4), np.float32)),
    ("dict", {i: GOOD[i] for i in range(16)}),
    ("generator", (b for b in GOOD)),
]
COLLECTIVE_CALLS = {
    "all_reduce": lambda b, **kw: INST.all_reduce(b, **kw),
    "reduce_scatter": lambda b, **kw: INST.reduce_scatter(b, **kw),
    "all_gather": lambda b, **kw: INST.all_gather(b, **kw),
    "all_to_all": lambda b, **kw: INST.all_to_all(b, **kw),
    "send_recv": lambda b, **kw: INST.send_recv(b, **kw),
}
for fn, f in COLLECTIVE_CALLS.items():
    reduces = fn in ("all_reduce", "reduce_scatter")
    for name, bad in NOT_SEQUENCES:
        case(f"{fn}-buffers-{name}", ShapeError, "buffers", lambda f=f, bad=bad: f(bad))
    # One bad buffer among good ones: the message names it (buffers[5]).
    for name, bad, err in BAD_ARRAYS:
        if name.startswith("complex"):
            continue  # data movement moves any bits, complex included; reductions: below
        case(
            f"{fn}-buffers[5]-{name}",
            err,
            "buffers[5]",
            lambda f=f, bad=bad: f(GOOD[:5] + [bad] + GOOD[6:]),
        )
    case(f"{fn}-buffers-count", ShapeError, "buffers", lambda f=f: f(GOOD[:3]))
    case(
        f"{fn}-buffers-mixed-shapes",
        ShapeError,
        "buffers",
        lambda f=f: f(GOOD[:15] + [np.ones(9, np.float32)]),
    )
    case(
        f"{fn}-buffers-mixed-dtypes",
        ShapeError,
        "buffers",
        lambda f=f: f(GOOD[:15] + [np.ones(8, np.float16)]),
    )
    if reduces:
        for name, dt in [
            ("float64", np.float64),
            ("int32", np.int32),
            ("bool", np.bool_),
            ("complex", np.complex64),
            ("e4m3fn", ml_dtypes.float8_e4m3fn),
        ]:
            case(
                f"{fn}-buffers-{name}",
                FormatError,
                "buffers",
                lambda f=f, dt=dt: f([np.ones(8, dt)] * 16),
            )
        names(fn, "op", lambda v, f=f: f(GOOD, op=v), err=Trn2ValueError)
    if fn != "send_recv":
        names(fn, "algorithm", lambda v, f=f: f(GOOD, algorithm=v), err=Trn2ValueError)
    for name, bad in [
        ("int", 3),
        ("str", "0,1"),
        ("empty", []),
        ("twice", [0, 0]),
        ("negative", [-1, 0]),
        ("out-of-range", [0, 16]),
        ("float", [0, 1.5]),
        ("bool", [True, 0]),
    ]:
        case(
            f"{fn}-chips-{name}",
            Trn2ValueError,
            "chips",
            lambda f=f, bad=bad: f(GOOD[:2], chips=bad),
        )
for name, bad, err in [
    ("int", 3, Trn2ValueError),
    ("str", "abc", Trn2ValueError),
    ("not-a-permutation", [0] * 16, Trn2ValueError),
    ("short", list(range(15)), ShapeError),
    ("out-of-range", [16] + list(range(1, 16)), Trn2ValueError),
    ("float", [1.0] * 16, Trn2ValueError),
]:
    case(f"send_recv-peers-{name}", err, "peers", lambda bad=bad: INST.send_recv(GOOD, peers=bad))
# Outputs the host cannot hold, from inputs that take no memory (broadcast views): refused
# before the outputs or the contiguous copies are allocated.
_HUGE = np.broadcast_to(np.float32(1), (1 << 34,))  # 64 GiB a rank, no memory behind it
for fn, f in COLLECTIVE_CALLS.items():
    case(f"{fn}-buffers-beyond-host", CapacityError, "buffers", lambda f=f: f([_HUGE] * 16))
case(
    "all_gather-buffers-2048-ranks",
    CapacityError,
    "all_gather",
    lambda: t.UltraCluster(32).all_gather([np.broadcast_to(np.float32(1), (1 << 20,))] * 2048),
)
names("estimate", "collective", lambda v: INST.estimate(v, 1024), err=Trn2ValueError)
names("estimate", "dtype", lambda v: INST.estimate("all_reduce", 1024, dtype=v))
names(
    "estimate",
    "algorithm",
    lambda v: INST.estimate("all_reduce", 1024, algorithm=v),
    err=Trn2ValueError,
)
ints(
    "estimate",
    "nbytes",
    lambda v: INST.estimate("all_reduce", v),
    extra=[("negative", -4), ("not-whole-elements", 3)],
)
case(
    "estimate-nbytes-beyond-model",
    CapacityError,
    "nbytes",
    lambda: INST.estimate("all_reduce", 2**64),
)
case("estimate-peers-int", Trn2ValueError, "peers", lambda: INST.estimate("send_recv", 64, peers=3))

# -- memory and DMA queues --------------------------------------------------------------------
MEMCORE = t.NeuronCore(2)
for name, bad, err in [
    ("str", "16", Trn2ValueError),
    ("float", 1.5, Trn2ValueError),
    ("none", None, Trn2ValueError),
    ("bool", True, Trn2ValueError),
    ("object", Opaque(), Trn2ValueError),
    ("negative", -1, Trn2ValueError),
    ("beyond-sbuf", 10**15, CapacityError),
    ("beyond-u64", 2**70, CapacityError),
]:
    case(f"alloc-size-{name}", err, "size", lambda bad=bad: MEMCORE.alloc(bad))
for name, bad, err in [
    ("huge-shape", (2**40, 2**40), CapacityError),
    ("negative-dim", (4, -1), Trn2ValueError),
    ("str-dim", (4, "a"), Trn2ValueError),
    ("float-dim", (4, 2.0), Trn2ValueError),
    ("beyond-u64-empty", (2**64, 0), ShapeError),
]:
    case(f"alloc-size-{name}", err, "size", lambda bad=bad: MEMCORE.alloc(bad, "bf16"))
names("alloc", "space", lambda v: MEMCORE.alloc(16, space=v), err=Trn2ValueError)
for name, bad in [
    ("unknown", "nope"),
    ("int", 3),
    ("object", Opaque()),
    ("str-dtype", "U3"),
    ("datetime", "M8[s]"),
    ("structured", np.dtype([("a", "<f4")])),
    ("object-dtype", object),
    ("void", "V0"),
]:
    case(f"alloc-dtype-{name}", FormatError, "dtype", lambda bad=bad: MEMCORE.alloc((4,), bad))
case("alloc-dtype-none-with-shape", Trn2ValueError, "dtype", lambda: MEMCORE.alloc((4,)))
case("alloc-dtype-with-bytes", Trn2ValueError, "dtype", lambda: MEMCORE.alloc(16, "bf16"))
case(
    "alloc-size-beyond-partition",
    CapacityError,
    "size",
    lambda: MEMCORE.alloc((128, 230 * 1024), np.uint8),
)
for name, bad in [("none", None), ("int", 3), ("str", "a"), ("object", Opaque())]:
    case(f"free-allocation-{name}", Trn2ValueError, "allocation", lambda bad=bad: MEMCORE.free(bad))
_FREED = MEMCORE.alloc(16)
MEMCORE.free(_FREED)
case("free-allocation-twice", Trn2ValueError, "allocation", lambda: MEMCORE.free(_FREED))
case(
    "free-allocation-other-core",
    Trn2ValueError,
    "allocation",
    lambda: MEMCORE.free(t.NeuronCore(3).alloc(16)),
)
for fn, f in (("dma_copy", t.dma.dma_copy), ("core.dma_copy", MEMCORE.dma_copy)):
    ints(
        fn,
        "queue",
        lambda v, f=f: f(X, queue=v),
        extra=[("negative", -1), ("too-big", 16), ("huge", 2**70)],
    )
case("core.dma_copy-dst-freed", Trn2ValueError, "dst", lambda: MEMCORE.dma_copy(X, dst=_FREED))
case(
    "core.dma_copy-dst-too-small",
    CapacityError,
    "dst",
    lambda: MEMCORE.dma_copy(np.ones(4096), dst=MEMCORE.alloc(16)),
)
case("dma_copy-memory-type", Trn2ValueError, "memory", lambda: t.dma.dma_copy(X, memory="core0"))
ints(
    "HbmStack",
    "index",
    lambda v: t.memory.HbmStack(v),
    extra=[("negative", -1), ("out-of-range", 4)],
)
case("NeuronCore-hbm-type", Trn2ValueError, "hbm", lambda: t.NeuronCore(hbm="stack0"))
case(
    "NeuronCore-hbm-other-pair",
    Trn2ValueError,
    "hbm",
    lambda: t.NeuronCore(3, hbm=t.memory.HbmStack(0)),
)

# -- reports --------------------------------------------------------------------------------
REPORT = t.estimate_gemm(4, 4, 4)
for name, bad in [("int-fd", 1), ("none", None), ("float", 1.5), ("bytes", b"x.json")]:
    case(f"save_trace-{name}", Trn2ValueError, "path", lambda bad=bad: REPORT.save_trace(bad))


def _ids(cases):
    return [c.id for c in cases]


def test_the_table_is_large_and_unique():
    ids = _ids(CASES)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    assert len(ids) > 400


@pytest.mark.parametrize("c", CASES, ids=_ids(CASES))
def test_bad_input_gets_the_contract_error(c: Case):
    with pytest.raises(Trn2Error) as excinfo:
        c.call()
    e = excinfo.value
    assert isinstance(e, c.error), f"{type(e).__name__}: {e}"
    msg = str(e)
    assert c.arg in msg, msg
    assert "panicked" not in msg and "internal error" not in msg, msg
    # Every Trn2Error is also a ValueError (or MemoryError for CapacityError), so code that
    # catches the builtin classes keeps working.
    assert isinstance(e, (ValueError, MemoryError)), type(e).__mro__


def test_objects_still_work_after_bad_calls():
    # Every case above ran on the shared CORE; PSUM and its clock are still consistent.
    out = CORE.matmul(BF, BF, bank=1)
    ref = BF.astype(np.float32).T @ BF.astype(np.float32)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(CORE.read_psum(1, 4, 4), ref)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.float32(1.5),
        lambda: np.array(2.0),
        lambda: np.zeros((0,)),
        lambda: np.zeros((3, 0)),
        lambda: np.zeros((0, 0, 0), ml_dtypes.bfloat16),
    ],
    ids=["np-scalar", "0-d", "empty", "empty-2d", "empty-3d-bf16"],
)
def test_zero_d_and_empty_arrays_round_trip(make):
    x = make()
    q = t.quantize(x, "fp8_e4m3")
    assert q.shape == np.shape(x) and q.dtype == ml_dtypes.float8_e4m3
    assert t.decode(t.encode(x, "bf16"), "bf16").shape == np.shape(x)
    d = t.dma.decompress(t.dma.compress(x))
    assert d.shape == np.shape(x) and d.dtype == np.asarray(x).dtype
    assert t.dma.dma_copy(x).bytes == np.asarray(x).nbytes


def test_nan_and_inf_are_data_not_errors():
    x = np.array([[np.nan, np.inf, -np.inf, 1.0]], np.float32)
    assert np.isnan(t.quantize(x, "bf16")[0, 0].astype(np.float32))
    assert t.prune(x, "2:4").shape == (1, 4)
    out = t.gemm(x, np.ones((4, 1), np.float32)).out
    assert np.isnan(out[0, 0])


def test_read_only_and_strided_inputs_are_not_modified():
    base = np.arange(32, dtype=np.float64).reshape(4, 8)
    x = base[:, ::2]
    x.flags.writeable = False
    before = x.copy()
    t.quantize(x, "bf16")
    t.prune(x, "2:4")
    t.dma.compress(x)
    t.gemm(x, x.T)
    np.testing.assert_array_equal(x, before)


def test_host_memory_limit_is_honoured_before_allocating(host_limited):
    # With TRN2CORE_HOST_MEMORY at 8 MiB, a 16 MiB result is refused; a small one is computed.
    out = host_limited(
        "a = np.ones((2048, 1), np.float32)",
        "t.gemm(a, np.ones((1, 2048), np.float32))",
        "print(t.gemm(a[:8], np.ones((1, 8), np.float32)).out.sum())",
    )
    assert "refused out: the 2048 x 2048 float32 result needs 16.0 MiB" in out, out
    assert "TRN2CORE_HOST_MEMORY" in out
    assert out.strip().endswith("64.0"), out


def test_collective_outputs_beyond_the_host_limit_are_refused(host_limited):
    # 16 ranks x 1 MiB all-reduce: 16 MiB of outputs under an 8 MiB limit; 16 x 64 KiB is fine.
    out = host_limited(
        "inst = t.Instance()\nbufs = [np.ones(1 << 18, np.float32)] * 16",
        "inst.all_reduce(bufs)",
        "print(inst.all_reduce([b[: 1 << 14] for b in bufs]).outputs[3].sum())",
    )
    assert "refused buffers: the all_reduce of 16 buffers of 1048576 bytes" in out, out
    assert "TRN2CORE_HOST_MEMORY" in out
    assert out.strip().endswith(str(16.0 * (1 << 14))), out


def test_collectives_take_nan_inf_empty_and_0_d_buffers():
    inst = t.Instance()
    x = np.zeros((16, 4), np.float32)
    x[3, 0] = np.nan  # NaN anywhere: NaN in the sum, max and min (IEEE, canonical quiet NaN)
    x[5, 1], x[6, 1] = np.inf, -np.inf  # inf + -inf = NaN; max inf; min -inf
    x[7, 2] = np.inf  # inf + finite = inf
    for op, want in [
        ("sum", [np.nan, np.nan, np.inf, 0.0]),
        ("max", [np.nan, np.inf, np.inf, 0.0]),
        ("min", [np.nan, -np.inf, 0.0, 0.0]),
    ]:
        outs = inst.all_reduce(list(x), op=op).outputs
        np.testing.assert_array_equal(outs[0], np.array(want, np.float32))
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)
        assert outs[0].view(np.uint32)[0] == 0x7FC00000
    # Empty buffers give empty outputs; 0-d buffers keep their shape where it can.
    empty = [np.zeros((0, 3), np.float32)] * 16
    assert [o.shape for o in inst.all_reduce(empty).outputs] == [(0, 3)] * 16
    assert inst.all_gather(empty).outputs[0].shape == (16, 0, 3)
    scalars = [np.float32(r) for r in range(16)]
    assert inst.all_reduce(scalars).outputs[9].shape == () and inst.all_reduce(scalars).outputs[
        9
    ] == sum(range(16))
    assert inst.all_gather(scalars).outputs[0].tolist() == list(range(16))
    assert inst.send_recv(scalars).outputs[1] == 0
    parts = inst.reduce_scatter(scalars).outputs
    assert sum(p.size for p in parts) == 1 and [p for p in parts if p.size][0][0] == 120
    # One chip sending to itself: a copy in its HBM, no bus crossed (fuzzing found a busbw of
    # 1450 GB/s against a link capacity of 0 here).
    one = t.Instance("trn2.3xlarge").send_recv([np.ones(4, np.float32)]).report
    assert one.busbw == 0 and one.chip_link_capacity == 0


def test_collectives_do_not_modify_their_inputs():
    inst = t.Instance()
    bufs = [np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2] + r for r in range(16)]
    for b in bufs:
        b.flags.writeable = False
    before = [b.copy() for b in bufs]
    inst.all_reduce(bufs)
    inst.reduce_scatter(bufs, op="max")
    inst.all_gather(bufs)
    inst.all_to_all(bufs)
    inst.send_recv(bufs)
    assert all(
        np.array_equal(b, c) and b.dtype == c.dtype for b, c in zip(bufs, before, strict=True)
    )


def test_host_memory_is_reported():
    avail = t._core.host_memory()
    if sys.platform.startswith("linux") and "TRN2CORE_HOST_MEMORY" not in os.environ:
        assert avail is not None and avail[0] > 0


def test_cli_bad_input_is_an_error_message_not_a_traceback(tmp_path):
    cmds = [
        (["gemm", "--m", "0", "--k", "4", "--n", "4"], "M"),
        (["gemm", "--m", str(2**64), "--k", "4", "--n", "4"], "M"),
        (
            ["gemm", "--m", "4", "--k", "4", "--n", "4", "--trace", str(tmp_path / "no" / "x")],
            str(tmp_path / "no" / "x"),
        ),
    ]
    for argv, word in cmds:
        r = subprocess.run(
            [sys.executable, "-m", "trn2core", *argv], capture_output=True, text=True
        )
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        assert word in r.stderr, r.stderr


#: Bad arguments of ``trn2core ls`` and ``trn2core nccom-test``, and a word the error names.
CLI_CASES = [
    (["ls", "--ultracluster", "0"], "n_ultraservers"),
    (["ls", "--ultracluster", "-5"], "n_ultraservers"),
    (["ls", "--ultracluster", "4097"], "n_ultraservers"),
    (["ls", "--ultracluster", "abc"], "--ultracluster"),
    (["ls", "--instance", "trn1.32xlarge"], "--instance"),
    (["ls", "--lnc", "3"], "--lnc"),
    (["nccom-test", "-r", "0", "allr"], "ranks"),
    (["nccom-test", "-r", "-3", "allr"], "ranks"),
    (["nccom-test", "-r", str(2**70), "allr"], "ranks"),
    (["nccom-test", "-r", "12", "allr", "--lnc", "1"], "ranks"),
    (["nccom-test", "-r", "1000000", "allr"], "ranks"),
    (["nccom-test", "-r", "16", "allr", "-b", "inf"], "minbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "nan"], "minbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "1.5"], "minbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "-5"], "minbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "0"], "minbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "12Q"], "minbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "1", "-e", "1e30"], "maxbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "1", "-e", "2P"], "maxbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "64M", "-e", "32M"], "maxbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "1", "-e", "1G", "-i", "1"], "stepbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "1", "-e", "1G", "-i", "0.5"], "stepbytes"),
    (["nccom-test", "-r", "16", "allr", "-b", "1", "-e", "1G", "-f", "1"], "stepfactor"),
    (["nccom-test", "-r", "16", "allr", "-f", "abc"], "--stepfactor"),
    (["nccom-test", "-r", "16", "allr", "-d", "fp64"], "--datatype"),
    (["nccom-test", "-r", "16", "allreduce"], "operation"),
    (["nccom-test", "-r", "16", "allr", "--algorithm", "nope"], "--algorithm"),
]


@pytest.mark.parametrize("argv,word", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_ls_and_nccom_test_refuse_bad_arguments(argv, word, capsys):
    from trn2core import cli

    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own refusals (choices, int parsing)
        rc = e.code
    err = capsys.readouterr().err
    # Usage errors exit 2; a refusal by the model (CapacityError) 1 since issue 29.
    assert rc == (1 if "CapacityError" in err else 2), (rc, err)
    assert "Traceback" not in err and word in err, err


def markdown_table() -> str:
    """The table of docs/limitations.md: every case grouped by function, argument and error,
    with one real message each (``python tests/test_robustness.py`` prints it)."""
    groups: dict[tuple[str, str, str], dict] = {}
    for c in CASES:
        fn = c.id.split("-")[0]
        rest = c.id[len(fn) + 1 :]
        value = rest[len(c.arg) + 1 :] if rest.startswith(c.arg + "-") else rest
        g = groups.setdefault((fn, c.arg, c.error.__name__), {"values": [], "message": ""})
        g["values"].append(value)
        if not g["message"]:
            try:
                c.call()
            except Exception as e:  # the message of the first case of the group
                g["message"] = str(e)
    rows = [
        "| function | argument | bad values tried | error | example message |",
        "|---|---|---|---|---|",
    ]
    for (fn, arg, err), g in groups.items():
        msg = g["message"].replace("|", "\\|").replace("\n", " ")
        msg = msg if len(msg) <= 110 else msg[:107] + "..."
        rows.append(f"| `{fn}` | `{arg}` | {', '.join(g['values'])} | `{err}` | {msg} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
    print(f"\n{len(CASES)} cases", file=sys.stderr)
