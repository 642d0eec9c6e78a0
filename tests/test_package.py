"""The package around the numerics: spec, errors, the command line (contract sections 0 and 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trn2core
from trn2core import _core, spec
from trn2core.errors import InternalError


def test_public_names_exist():
    for name in trn2core.__all__:
        assert hasattr(trn2core, name), name
    assert trn2core.__version__ == _core.__version__


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (trn2core.ShapeError, (trn2core.Trn2Error, ValueError)),
        (trn2core.FormatError, (trn2core.Trn2Error, ValueError)),
        (trn2core.SparsityError, (trn2core.Trn2Error, ValueError)),
        (trn2core.CorruptDataError, (trn2core.Trn2Error, ValueError)),
        (trn2core.CapacityError, (trn2core.Trn2Error, MemoryError)),
        (InternalError, (trn2core.Trn2Error,)),
    ],
)
def test_error_hierarchy(cls, bases):
    for b in bases:
        assert issubclass(cls, b)


def test_rust_panic_becomes_a_python_exception():
    with pytest.raises(InternalError, match="boom at the boundary"):
        _core._panic_for_test("boom at the boundary")
    # The interpreter is still fine afterwards.
    assert trn2core.quantize(np.array([1.0]), "bf16").astype(np.float32)[0] == 1.0


def test_spec_values_and_sources():
    assert spec.pe_clock_hz == 2.4e9
    assert spec.sbuf_bytes == 28 * 2**20 == 128 * spec.sbuf_partition_bytes
    assert spec.psum_bytes == 2 * 2**20 == 128 * spec.psum_banks * spec.psum_bank_bytes
    assert spec.psum_banks == 8
    assert spec.dma_engines_per_core == 16
    assert spec.hbm_stack_bytes == 24 * 2**30
    assert abs(spec.core_peak_bf16_flops_per_s - 128 * 128 * 2 * 2.4e9) < 1.0
    assert spec.core_peak_fp8_double_row_flops_per_s == 2 * spec.core_peak_bf16_flops_per_s
    names = [e.name for e in spec.entries()]
    assert len(names) == len(set(names)) > 50
    for e in spec.entries():
        assert e.source.strip() and e.unit.strip() and e.doc.strip(), e
        assert getattr(spec, e.name) == e.value
    assert spec.describe("pe_clock_hz").unit == "Hz"
    assert "S1" in spec.describe("pe_clock_hz").source


def test_spec_is_read_only():
    with pytest.raises(AttributeError, match="read-only"):
        spec.pe_clock_hz = 1.0
    with pytest.raises(AttributeError, match="read-only"):
        del spec.sbuf_bytes
    assert spec.pe_clock_hz == 2.4e9
    with pytest.raises(AttributeError, match="no constant"):
        spec.describe("warp_drive_hz")


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trn2core", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_cli_demo_writes_its_trace_where_asked(tmp_path):
    r = _run("demo", "--only", "tensor-engine", "--trace", "out/demo.json", cwd=tmp_path)
    assert r.returncode == 2 and "No such file or directory" in r.stderr  # out/ does not exist
    assert list(tmp_path.iterdir()) == []
    r = _run("demo", "--only", "tensor-engine", "--trace", "demo.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]
    trace = json.loads((tmp_path / "demo.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert any("bf16 GEMM" in n for n in names), names
    assert "timelines written to demo.json" in r.stdout


def test_cli_formats_spec_version_and_help():
    r = _run("formats")
    assert r.returncode == 0 and "57344" in r.stdout
    r = _run("spec")
    assert r.returncode == 0 and "pe_clock_hz" in r.stdout
    r = _run("--version")
    assert r.returncode == 0 and trn2core.__version__ in r.stdout
    r = _run("no-such-command")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_cli_docs_lists_and_prints_the_guides():
    docs = Path(__file__).resolve().parent.parent / "docs"
    r = _run("docs")
    assert r.returncode == 0, r.stderr
    listed = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert sorted(listed) == sorted(p.stem for p in docs.glob("*.md")) and listed[0] == "index"
    assert "  numerics " in r.stdout and "Numerics: formats and rounding" in r.stdout
    for name in ("numerics", "numerics.md"):
        r = _run("docs", name)
        assert r.returncode == 0 and r.stdout == (docs / "numerics.md").read_text(), name
    r = _run("docs", "numerix")
    assert r.returncode == 2 and "guide: unknown guide 'numerix'" in r.stderr
    assert "Traceback" not in r.stderr
