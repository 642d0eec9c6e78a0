"""The asv suites in benches/ stay discoverable (`make bench`): asv refuses the whole tree when a
directory and a module share a name (``benches/fidelity/`` beside a ``fidelity.py`` once left
``asv run`` running 0 benchmarks), so this runs asv's own tree check and its discovery script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from asv import runner as asv_runner

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ROOT / "benches"


def test_asv_accepts_the_benchmark_tree():
    from asv.benchmarks import Benchmarks

    Benchmarks.check_tree(str(BENCHES))  # raises UserError on a name clash


def test_asv_discovers_a_suite_in_every_bench_module(tmp_path):
    out = tmp_path / "discovered.json"
    cmd = [sys.executable, asv_runner.BENCHMARK_RUN_SCRIPT, "discover", str(BENCHES), str(out)]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(out.read_text())
    modules = {b["name"].split(".")[0] for b in found}
    expected = {p.stem for p in BENCHES.glob("bench_*.py")}
    assert expected and modules == expected, sorted(expected ^ modules)
    kinds = {b["type"] for b in found}
    assert {"time", "track"} <= kinds, kinds


def test_bench_nki_alternates_the_kernel_and_its_baseline():
    """bench_nki's ratio runs the kernel and gemm alternately (a, b, a, b, ...), each figure the
    best of its own runs: both see the same stretches of a drifting host."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_nki_t", BENCHES / "bench_nki.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls: list[str] = []
    a, b = mod.best_of_alternating(lambda: calls.append("a"), lambda: calls.append("b"), 3)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert 0 <= a < 1 and 0 <= b < 1


def test_the_nki_speed_table_states_the_bench_s_targets():
    """docs/nki.md's Speed table gives the targets benches/bench_nki.py checks (the table once
    kept an older session's targets after the bench's had changed)."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("bench_nki_targets", BENCHES / "bench_nki.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "docs" / "nki.md").read_text(encoding="utf-8")
    speed = text.split("\n## Speed\n", 1)[1]
    rows = [ln for ln in speed.split("\n\n", 2)[1].splitlines() if ln.startswith("| ")]
    targets = {r.split(" | ")[0]: r.rstrip(" |").rsplit(" | ", 1)[1] for r in rows[1:]}
    instr = [t for k, t in targets.items() if "instruction" in k]
    matmul = [t for k, t in targets.items() if "matmul 2048^3" in k]
    assert instr == [f"< {mod.TARGET_INSTR_US:g} us"], targets
    assert matmul == [f"within {mod.TARGET_MATMUL_VS_GEMM:g}x"], targets
    assert re.search(r"\d+\.\d+-\d+\.\d+ us each", rows[1]), rows[1]
