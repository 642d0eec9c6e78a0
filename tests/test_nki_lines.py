"""Where the time goes, by source line (issue 26): every instruction an NKI kernel issues
carries the kernel line that issued it (a helper function's own line, a pending result's line);
the report sums busy time per line, names the busiest line on the bottleneck, and the trace
carries each slice's line."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import trn2core
import trn2core.nki as tn
from trn2core import _core
from trn2core.errors import Trn2ValueError

nl, nisa = tn.language, tn.isa
HERE = __file__


def _line(fn, marker: str) -> int:
    """The file line of the source line of ``fn`` carrying ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if marker in ln)


def _exp_into(src, dst):
    """A helper in user code: its instruction is its own line's, not the caller's."""
    nisa.activation(dst=dst, op=nl.exp, data=src)  # L:helper


def _kernel(x, w):
    t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)  # L:load-x
    s = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=w)  # L:load-w
    p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    for _ in range(24):
        nisa.nc_matmul(dst=p, stationary=s, moving=t)  # L:matmul
    u = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    _exp_into(p, u)  # L:call
    v = nl.multiply(u, 2.0)  # L:pending
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=v)  # L:store
    return out


def _lines():
    return {
        k: _line(_kernel, f"# L:{k}")
        for k in ("load-x", "load-w", "matmul", "call", "pending", "store")
    } | {"helper": _line(_exp_into, "# L:helper")}


@pytest.fixture(scope="module")
def run():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((128, 512), dtype=np.float32)
    w = rng.standard_normal((128, 128), dtype=np.float32)
    return tn.run(_kernel, x, w)


def _by_line(rep):
    return {row["line"]: row for row in rep.by_line()}


def test_each_instruction_is_attributed_to_the_line_that_issued_it(run):
    L = _lines()
    rows = _by_line(run.report)
    assert {row["file"] for row in run.report.by_line()} == {HERE}
    # The helper's line, not its call; the pending `nl.multiply` at its own line, though
    # issued when the store on the next line needed it.
    assert set(rows) == {
        L["load-x"],
        L["load-w"],
        L["matmul"],
        L["helper"],
        L["pending"],
        L["store"],
    }
    assert rows[L["matmul"]]["instructions"] == 24 and set(rows[L["matmul"]]["engines"]) == {"PE"}
    assert rows[L["helper"]]["instructions"] == 1 and set(rows[L["helper"]]["engines"]) == {"ACT"}
    assert rows[L["pending"]]["instructions"] == 1
    assert set(rows[L["pending"]]["engines"]) <= {"DVE", "ACT", "POOL"}
    for k in ("load-x", "load-w", "store"):
        assert set(rows[L[k]]["engines"]) == {"DMA"}, rows[L[k]]
    assert sum(row["instructions"] for row in rows.values()) == run.report.instructions


def test_per_line_busy_sums_to_each_engines_busy_time(run):
    rep = run.report
    rows = rep.by_line()
    for engine in ("PE", "ACT", "DVE", "POOL"):
        total = sum(row["engines"].get(engine, 0.0) for row in rows)
        assert total == pytest.approx(rep.engines[engine]["busy_s"], rel=1e-12, abs=1e-18)
    dma = sum(v["busy_s"] for k, v in rep.engines.items() if k.startswith("DMA"))
    assert dma > 0
    assert sum(row["engines"].get("DMA", 0.0) for row in rows) == pytest.approx(dma, rel=1e-12)
    assert [row["busy_s"] for row in rows] == sorted((row["busy_s"] for row in rows), reverse=True)
    assert sum(row["share"] for row in rows) == pytest.approx(1.0)
    for row in rows:
        assert row["busy_s"] == pytest.approx(sum(row["engines"].values()))


def test_the_bottleneck_names_its_busiest_line_and_the_table_the_top_lines(run):
    rep = run.report
    L = _lines()
    assert rep.bottleneck == "PE"  # 24 fp32 matmuls of 128 x 128 x 512
    assert rep.bottleneck_line == f"{HERE}:{L['matmul']}"
    assert rep.by_line()[0]["line"] == L["matmul"]
    text = str(rep)
    assert f"bottleneck PE (busiest line test_nki_lines.py:{L['matmul']})" in text
    table = text.split("busiest lines (5 of 6):\n")[1].splitlines()
    assert len(table) == 5
    assert table[0].split()[0] == f"test_nki_lines.py:{L['matmul']}"
    assert "24 instructions (PE " in table[0]
    d = rep.to_dict()
    json.dumps(d)
    assert d["bottleneck_line"] == rep.bottleneck_line
    assert [(r["file"], r["line"]) for r in d["lines"]] == [
        (r["file"], r["line"]) for r in rep.by_line()
    ]


def test_the_trace_carries_each_instructions_line(run, tmp_path):
    L = _lines()
    ev = [e for e in json.loads(run.report.trace_json())["traceEvents"] if e["ph"] == "X"]
    lines = {}
    for e in ev:
        lines.setdefault(e["name"], set()).add(e["args"]["line"])
    assert lines["nc_matmul"] == {f"{HERE}:{L['matmul']}"}
    assert lines["activation"] >= {f"{HERE}:{L['helper']}"}
    assert lines["dma_copy"] == {f"{HERE}:{L[k]}" for k in ("load-x", "load-w", "store")}
    assert len(ev) == run.report.instructions
    # The file the core writes piece by piece, and Perfetto's protobuf.
    saved = json.loads(open(run.report.save_trace(tmp_path / "k.json")).read())["traceEvents"]
    assert [e["args"].get("line") for e in saved if e["ph"] == "X"] == [
        e["args"]["line"] for e in ev
    ]
    pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    trace = pb.Trace.FromString(open(run.report.save_trace(tmp_path / "k.pftrace"), "rb").read())
    got = [
        a.string_value
        for p in trace.packet
        if p.HasField("track_event")
        for a in p.track_event.debug_annotations
        if a.name == "line"
    ]
    assert sorted(got) == sorted(e["args"]["line"] for e in ev)


def test_lnc2_sums_a_line_over_both_physical_cores():
    @tn.jit
    def k(x):
        cols = x.shape[1] // nl.num_programs()
        c0 = nl.program_id(0) * cols
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((x.shape[0], cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, c0 : c0 + cols])  # L:load
        nisa.activation(dst=t, op=nl.relu, data=t)  # L:act
        nisa.dma_copy(dst=out[:, c0 : c0 + cols], src=t)
        return out

    x = np.ones((128, 2048), np.float32)
    rep = tn.run(k, x, grid=2).report
    act = _line(k, "# L:act")
    row = _by_line(rep)[act]
    per_core = [_by_line(c)[act] for c in rep.cores]
    assert row["instructions"] == 2 and [r["instructions"] for r in per_core] == [1, 1]
    assert row["engines"]["ACT"] == pytest.approx(
        rep.engines["nc0 ACT"]["busy_s"] + rep.engines["nc1 ACT"]["busy_s"]
    )
    assert row["busy_s"] == pytest.approx(sum(r["busy_s"] for r in per_core))
    assert sum(r["instructions"] for r in rep.by_line()) == rep.instructions == 6
    # The bottleneck is one core's; its busiest line is that core's (the load: its DMA from
    # HBM takes longer than the store's).
    assert rep.bottleneck == "nc0 DMA" and rep.bottleneck_line == f"{HERE}:{_line(k, '# L:load')}"
    # Each core's trace events carry the line too.
    ev = json.loads(rep.trace_json())["traceEvents"]
    acts = [e for e in ev if e.get("name") == "activation"]
    assert sorted(e["pid"] for e in acts) == [0, 1]
    assert {e["args"]["line"] for e in acts} == {f"{HERE}:{act}"}


def test_a_kernel_without_a_file_is_named_string_and_line():
    src = (
        "def k(x):\n"
        "    t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)\n"
        "    nisa.dma_copy(dst=t, src=x)\n"
        "    out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)\n"
        "    nisa.dma_copy(dst=out, src=t)\n"
        "    return out\n"
    )
    scope = {"nl": nl, "nisa": nisa}
    exec(src, scope)  # noqa: S102 - the point of the test
    rep = tn.run(scope["k"], np.ones((128, 64), np.float32)).report
    assert [
        (r["file"], r["line"], r["instructions"])
        for r in sorted(rep.by_line(), key=lambda r: r["line"])
    ] == [("<string>", 3, 1), ("<string>", 5, 1)]
    assert "<string>:3" in str(rep) and "<string>:5" in str(rep)


def test_instructions_issued_outside_a_kernel_have_no_line():
    core = trn2core.NeuronCore()
    a = core.tile((128, 64), "fp32")
    core.vector.memset(a, 1.0)
    core.scalar.activation(a, a, "exp")
    rep = core.run()
    rows = rep.by_line()
    assert len(rows) == 1
    assert (rows[0]["file"], rows[0]["line"], rows[0]["instructions"]) == (None, None, 2)
    assert set(rows[0]["engines"]) == {"DVE", "ACT"} and rows[0]["share"] == 1.0
    assert "busiest lines" not in str(rep)
    json.dumps(rep.to_dict())
    assert all("line" not in e.get("args", {}) for e in json.loads(rep.trace_json())["traceEvents"])


def test_a_loop_carried_read_still_names_both_lines():
    lnl = tn.language_legacy

    def k(x):
        out = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        acc = lnl.load(x)
        tmp = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.sbuf)
        for _ in lnl.affine_range(2):
            tmp[...] = lnl.exp(acc)  # L:reads
            acc[...] = lnl.add(tmp, 1.0)  # L:writes
        lnl.store(out, value=acc)
        return out

    with pytest.raises(tn.LoopCarriedDependencyError) as info:
        tn.run(tn.jit_legacy(k), np.ones((128, 64), np.float32))
    msg = str(info.value)
    assert msg.startswith(f"{HERE}:{_line(k, '# L:reads')}:"), msg
    assert f"(at line {_line(k, '# L:writes')})" in msg


def test_the_machine_refuses_an_unknown_location_naming_it():
    m = _core.Machine()
    assert m.locate("k.py", 3) == 0 and m.locate("k.py", 4) == 1 and m.locate("k.py", 3) == 0
    with pytest.raises(Trn2ValueError, match="location") as info:
        m.set_location(2)
    assert info.value.arg == "location"
    m.set_location(1)
    m.set_location(None)
    t = m.alloc([128, 8], "fp32", "sbuf", "t", 0, None)
    with pytest.raises(Trn2ValueError, match="location") as info:
        m.issue_at(5, "memset", "vector", t, 1.0)
    assert info.value.arg == "location" and m.instructions == 0  # nothing issued
    m.issue_at(0, "memset", "vector", t, 1.0)  # this instruction only
    m.issue("memset", "vector", t, 2.0)
    assert [m.instruction_location(i) for i in range(2)] == [0, None]


def test_every_instruction_of_a_kernel_has_a_line_whatever_issued_it():
    """Language-level results (pending, assigned, composite: ``nl.cos`` is several
    instructions), a memset by assignment, legacy ``nisa`` calls and tensor operators: no
    instruction is left without its line."""
    lnl, lisa = tn.language_legacy, tn.isa_legacy

    def k(x):
        out = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.shared_hbm)
        a = lnl.load(x)
        b = lnl.cos(a)
        c = lnl.ndarray((128, 64), dtype=nl.float32, buffer=lnl.sbuf)
        c[...] = 1.0
        d = lisa.tensor_tensor(b, c, op=nl.add)
        e = d * 2.0 + a
        lnl.store(out, value=e)
        return out

    x = np.linspace(-1, 1, 128 * 64, dtype=np.float32).reshape(128, 64)
    res = tn.run(tn.jit_legacy(k), x)
    assert np.allclose(res.outputs, (np.cos(x) + 1.0) * 2.0 + x, atol=1e-5)
    rows = res.report.by_line()
    assert all(r["file"] == HERE for r in rows), rows
    cos = _line(k, "lnl.cos(a)")
    assert _by_line(res.report)[cos]["instructions"] >= 2  # the composite's instructions
    assert {r["line"] for r in rows} == {
        _line(k, t)
        for t in (
            "lnl.load(x)",
            "lnl.cos(a)",
            "c[...] = 1.0",
            "lisa.tensor_tensor",
            "d * 2.0",
            "lnl.store(out",
        )
    }
