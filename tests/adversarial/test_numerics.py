"""Attack surface: number formats and rounding (quantize, encode, decode, stochastic_bits,
format_info) with odd arrays, numpy scalar arguments and sizes that need gigabytes."""

from __future__ import annotations

from ._probe import check_outcomes

SETUP = """
x = np.linspace(-300, 300, 1001, dtype=np.float32)
BIG = 2**33
"""

CALLS = {
    # odd but valid inputs: fresh outputs, right shapes
    "fp32 of fp32 is a copy": "fresh(t.quantize(x, 'fp32'), x)",
    "bf16 of bf16 is a copy": "b = t.quantize(x, 'bf16'); fresh(t.quantize(b, 'bf16'), b)",
    "encode fp32 is a copy": "fresh(t.encode(x, 'fp32'), x)",
    "decode fp32 is a copy": "u = x.view(np.uint32); fresh(t.decode(u, 'fp32'), u, x)",
    "byte-swapped fp16": "t.quantize(x.astype('>f2'), 'fp8_e4m3')",
    "fortran 2-d": "t.encode(np.asfortranarray(x[:1000].reshape(20, 50)), 'bf16')",
    "negative strides": "assert (t.quantize(x[::-3], 'fp32') == x[::-3]).all()",
    "0-d numpy scalar": "assert t.quantize(np.float16(1.5), 'bf16').shape == ()",
    "bool array": ("t.quantize(np.array([True, False]), 'fp8_e5m2')", "FormatError"),
    "uint64 extremes": "t.quantize(np.array([0, 2**64 - 1], np.uint64), 'bf16')",
    "numpy int seed": "t.quantize(x, 'bf16', rounding='stochastic', seed=np.uint64(2**64 - 1))",
    "numpy int bias": "t.encode(x, 'fp8_e4m3', exponent_bias=np.int8(7))",
    "numpy bit count": (
        "t.quantize(x, 'bf16', rounding='stochastic', random_bits=np.zeros(1001, np.uint32), "
        "random_bit_count=np.int64(16))"
    ),
    # bad values: a Trn2Error subclass, never numpy's or Python's own exception
    "ragged random_bits": (
        "t.quantize(x[:2], 'bf16', rounding='stochastic', random_bits=[[1, 2], [3]])",
        "any",
    ),
    "random_bits object": (
        "t.quantize(x[:2], 'bf16', rounding='stochastic', random_bits=object())",
        "Trn2ValueError",
    ),
    "seed numpy float": (
        "t.quantize(x, 'bf16', rounding='stochastic', seed=np.float64(3))",
        "Trn2ValueError",
    ),
    "seed 2**64": ("t.quantize(x, 'bf16', rounding='stochastic', seed=2**64)", "Trn2ValueError"),
    "bias numpy bool": ("t.encode(x, 'fp8_e4m3', exponent_bias=np.bool_(True))", "Trn2ValueError"),
    "format numpy str": ("t.quantize(x, np.str_('bf16'))", "any"),
    "stochastic_bits huge": ("t.stochastic_bits((2**40,), seed=1)", "CapacityError"),
    "stochastic_bits numpy dims": "t.stochastic_bits((np.int64(3), np.uint8(2)), seed=1)",
    "stochastic_bits empty but huge": ("t.stochastic_bits((0, 2**62), seed=1)", "any"),
    # gigabytes behind a broadcast view: refused before numpy copies it
    "quantize broadcast": (
        "t.quantize(np.broadcast_to(np.float64(1), (BIG,)), 'bf16')",
        "CapacityError",
    ),
    "encode broadcast": (
        "t.encode(np.broadcast_to(np.float64(1), (BIG,)), 'fp8_e4m3')",
        "CapacityError",
    ),
    "decode broadcast": (
        "t.decode(np.broadcast_to(np.uint8(1), (BIG,)), 'fp8_e4m3')",
        "CapacityError",
    ),
    "random_bits broadcast": (
        "t.quantize(np.broadcast_to(np.float32(1), (BIG,)), 'bf16', rounding='stochastic', "
        "random_bits=np.broadcast_to(np.uint32(1), (BIG,)))",
        "CapacityError",
    ),
}


def test_numerics_surface():
    check_outcomes(CALLS, setup=SETUP)
