"""``trn2core gemm --plot`` and ``trn2core.plot.roofline`` (matplotlib is an optional extra)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trn2core
from trn2core.plot import roofline


def test_roofline_writes_a_png_and_returns_the_chip_report(tmp_path):
    path = tmp_path / "roof.png"
    rep = roofline(4096, 128, 4096, path, dtype="bf16")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep.bound == "memory" and rep.details["cores"] == 8
    big = roofline(8192, 8192, 8192, tmp_path / "big.svg", dtype="fp8_e4m3", perf_mode="double_row")
    assert big.bound == "compute" and (tmp_path / "big.svg").read_text().startswith("<?xml")


def test_without_matplotlib_the_error_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(trn2core.Trn2Error, match=r"trn2core\[plot\]"):
        roofline(128, 128, 128, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_cli_gemm_plot(tmp_path):
    path = tmp_path / "r.png"
    r = subprocess.run(
        [sys.executable, "-m", "trn2core", "gemm", "--m", "1024", "--k", "4096", "--n", "1024",
         "--sparsity", "4:16", "--plot", str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "roofline" in r.stdout and path.stat().st_size > 10_000
