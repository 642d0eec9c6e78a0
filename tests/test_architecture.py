"""The shape of the code (docs/architecture.md, "Rules"): no import cycles, every name list read
from the core, one crossing into Rust per public call."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import trn2core as t
from trn2core import _core

ROOT = Path(__file__).resolve().parent.parent


def _checker():
    spec = importlib.util.spec_from_file_location("check_cycles", ROOT / "tools/check_cycles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycles_in_rust_or_python():
    c = _checker()
    assert c.cycles(c.rust_graph()) == []
    assert c.cycles(c.python_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    c = _checker()
    assert c.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert c.cycles({"a": {"b"}, "b": set()}) == []


def test_name_lists_come_from_the_core():
    names = _core.names()
    assert t.FORMATS == tuple(names["formats"])
    assert t.ROUNDING_MODES == tuple(names["rounding_modes"])
    assert t.PERF_MODES == tuple(names["perf_modes"])
    assert t.SPARSITY_PATTERNS == tuple(names["sparsity_patterns"])
    assert t.ALGORITHMS == tuple(names["algorithms"])
    assert t.dma.CODECS == tuple(names["codecs"])
    assert t.dma.PLACES == tuple(names["dma_places"])
    assert t.memory.SPACES == tuple(names["memories"])
    from trn2core import collectives

    assert collectives.COLLECTIVES == tuple(names["collectives"])
    assert collectives.REDUCE_OPS == tuple(names["reduce_ops"])
    # NKI's enums carry NKI's own values, but their member names are the core's.
    from trn2core._names import REDUCE_CMDS
    from trn2core.nki import isa

    assert REDUCE_CMDS == tuple(names["reduce_cmds"])
    assert set(isa.reduce_cmd.__members__) == set(REDUCE_CMDS)
    from trn2core import workload

    assert workload.PRESETS == tuple(names["model_presets"])


def test_every_dtype_map_is_built_from_the_cores_element_type_table():
    from trn2core import dtypes
    from trn2core.machine import MACHINE_DTYPES
    from trn2core.nki import _dtypes as nki_dtypes

    table = _core.element_types()
    assert tuple(row[0] for row in table if row[4]) == t.FORMATS  # formats first, in order
    assert tuple(dtypes.FORMAT_DTYPES) == t.FORMATS
    assert set(dtypes.MACHINE_NP_DTYPES) == set(MACHINE_DTYPES)
    for name, numpy, bits, kind, is_format, on_chip in table:
        dt = np.dtype(numpy)
        assert dt.itemsize * 8 == bits, name
        assert (kind == "float") == (dt.kind in "fV" or "float" in dt.name), name
        if is_format:
            assert dtypes.FORMAT_DTYPES[name] == dt
        if on_chip:
            assert dtypes.MACHINE_NP_DTYPES[name] == dt == nki_dtypes.HOST_DTYPE[name]
    assert "fp8_e4m3fn" in dtypes.FORMAT_DTYPES and "fp8_e4m3fn" not in MACHINE_DTYPES


def test_dma_copy_crosses_once(count_calls):
    from trn2core import dma, memory

    mem = memory.CoreMemory()
    dst = mem.alloc((128, 512), np.float32, space="sbuf")
    x = np.maximum(np.random.default_rng(0).standard_normal((128, 512), np.float32), 0)
    proxy = count_calls(dma, memory)
    rep = dma.dma_copy(x, src="hbm", dst=dst, codec="zvc", memory=mem)
    assert proxy.calls == []  # the call goes through the core memory object, below
    assert rep.wire_bytes < rep.bytes == x.nbytes and rep.dst == "sbuf"


def test_quantize_and_collectives_cross_once(count_calls):
    from trn2core import _validate, collectives, numerics

    proxy = count_calls(numerics)
    t.quantize(np.linspace(-3, 3, 1000), "fp8_e4m3", rounding="stochastic", seed=3)
    assert proxy.calls == ["encode"]
    # The host check and the copies of strided or byte-swapped buffers are the same crossing
    # (issue 25: the facade's check_alloc was a second one).
    proxy = count_calls(collectives, _validate)
    inst = t.Instance("trn2.48xlarge")
    inst.all_reduce([np.ones(64, np.float32)] * 16)
    inst.all_reduce([np.ones(128, ">f4")[::2]] * 16)
    inst.all_gather([np.ones(64, np.float16)] * 16)
    assert proxy.calls == ["collective_reduce", "collective_reduce", "collective_move"]


def test_estimate_gemm_and_one_instruction_cross_once(count_calls):
    from trn2core import engine, numerics

    proxy = count_calls(engine, numerics)
    t.estimate_gemm(4096, 4096, 4096, dtype="bf16")
    t.estimate_gemm(4096, 4096, 4096, dtype="fp8_e4m3", perf_mode="double_row", core=t.Chip())
    assert proxy.calls == ["estimate_gemm", "estimate_gemm"]
    with pytest.raises(t.FormatError, match="fp8_e4m3fn"):  # the format rule, same call
        t.estimate_gemm(128, 128, 128, dtype="fp8_e4m3fn")
    proxy.calls.clear()
    core = t.NeuronCore()
    s = t.quantize(np.ones((128, 64)), "bf16")
    m = t.quantize(np.ones((128, 32)), "bf16")
    proxy.calls.clear()
    out = core.matmul(s, m)
    assert proxy.calls == []  # no decode through numerics: the core widens the codes itself
    assert out.shape == (64, 32) and (out == 128.0).all()


def test_workload_calls_cross_once(count_calls):
    from trn2core import workload

    proxy = count_calls(workload)
    m = workload.Model("llama-3.1-8b")
    inf = workload.Inference(m, "trn2.48xlarge", tp=8)
    inf.prefill(1000)
    inf.decode(1000)
    inf.memory()
    assert proxy.calls == ["workload_model", "workload_step", "workload_step", "workload_memory"]
    proxy.calls.clear()
    workload.Training(m, "trn2.48xlarge", tp=8, pp=2, dp=4, global_batch=32, seq=2048).step()
    workload.search(m, "trn2.48xlarge", objective="itl", constraints={"tp": [8], "lnc": 2})
    assert proxy.calls == ["workload_train", "workload_search"]


def test_every_machine_instruction_crosses_once_through_the_table():
    """Each engine view's instruction is one ``Machine.issue`` call (the binding has no
    per-instruction method), and every instruction of the core's table is reachable by it."""
    core = t.NeuronCore()
    calls = []

    class Recording:
        def __init__(self, m):
            self._inner = m

        def __getattr__(self, name):
            calls.append(name)
            return getattr(self._inner, name)

    a = core.tile((128, 8), "fp32")
    core.vector.memset(a, 2.0)
    d = core.tile((128, 8), "fp32")
    col = core.tile((128, 1), "fp32")
    for view in (core.vector, core.scalar, core.gpsimd, core.pe, core.dma):
        view._m = Recording(view._m)
    issued = [
        lambda: core.vector.tensor_tensor(d, a, a, "add"),
        lambda: core.vector.tensor_scalar(d, a, "multiply", 2.0),
        lambda: core.vector.tensor_reduce(col, "add", a),
        lambda: core.vector.max8(d, a),
        lambda: core.scalar.activation(d, a, "exp"),
        lambda: core.gpsimd.tensor_copy(d, a),
        lambda: core.dma.copy(d, a),
    ]
    for f in issued:
        calls.clear()
        f()
        assert calls == ["issue"], calls
    table = {row[0] for row in t._core.instruction_table()}
    assert {"max8", "nc_find_index8", "tensor_tensor", "dma_copy"} <= table
    assert not [n for n in dir(t._core.Machine) if n in table]  # no per-instruction methods
