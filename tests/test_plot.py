"""``trn2core gemm --plot`` and ``trn2core.plot.roofline`` (matplotlib is an optional extra)."""

from __future__ import annotations

import subprocess
import sys

import matplotlib.pyplot as plt
import pytest
import trn2core
from trn2core import cli, plot
from trn2core.plot import roofline, roofline_figure


def test_roofline_writes_a_png_and_returns_the_core_report(tmp_path):
    path = tmp_path / "roof.png"
    rep = roofline(4096, 128, 4096, path, dtype="bf16")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep.bound == "memory" and "cores" not in rep.details  # one NeuronCore, not a split
    assert rep == trn2core.estimate_gemm(4096, 128, 4096, dtype="bf16")
    big = roofline(8192, 8192, 8192, tmp_path / "big.svg", dtype="fp8_e4m3", perf_mode="double_row")
    assert big.bound == "compute" and (tmp_path / "big.svg").read_text().startswith("<?xml")


def _lines(fig):
    return {line.get_gid(): line for line in fig.axes[0].get_lines()}


@pytest.mark.parametrize("lnc", [None, 1, 2, 4])
def test_the_point_is_the_report_of_the_core_the_title_names(lnc):
    fig, rep = roofline_figure(4096, 4096, 4096, lnc=lnc)
    try:
        core = None if lnc is None else trn2core.Chip(lnc=lnc).cores[0]
        assert rep == trn2core.estimate_gemm(4096, 4096, 4096, core=core)
        point = _lines(fig)["point"]
        x, y = point.get_xdata()[0], point.get_ydata()[0]
        assert x == rep.flops / rep.details["hbm_bytes"] and y == rep.tflops
        title = fig.axes[0].get_title()
        if lnc is None:
            assert title == "Trainium2 roofline: one NeuronCore" and "LNC" not in title
            assert 78 < y < 78.7  # one core's bf16 peak is 78.6 TFLOPS (not the chip's 629)
        else:
            assert f"one logical NeuronCore, LNC={lnc} ({lnc} physical cores)" in title
    finally:
        plt.close(fig)


def test_each_ceiling_is_its_own_flat_line_meeting_the_hbm_slope():
    fig, _ = roofline_figure(1024, 1024, 1024, lnc=2)
    try:
        lc = trn2core.Chip(lnc=2).cores[0]
        lines = _lines(fig)
        assert set(lines) == {"hbm", "fp32", "bf16", "double_row", "sparse", "point"}
        peaks = {
            "fp32": lc.peak_tflops("fp32"),
            "bf16": lc.peak_tflops("bf16"),
            "double_row": lc.peak_tflops("fp8_e4m3", perf_mode="double_row"),
            "sparse": lc.peak_tflops("sparse"),
        }
        bw = lc.hbm_bandwidth
        for key, peak in peaks.items():
            ys = list(lines[key].get_ydata())
            assert ys == [peak, peak]  # flat: no shared diagonal
            assert lines[key].get_xdata()[0] == pytest.approx(peak * 1e12 / bw)  # the ridge
        hx, hy = lines["hbm"].get_xdata(), lines["hbm"].get_ydata()
        for x, y in zip(hx, hy, strict=True):
            assert y / x == pytest.approx(bw / 1e12)  # TFLOPS = intensity x bandwidth
        colours = [lines[k].get_color() for k in ("hbm", *peaks)]
        assert len(set(colours)) == 5  # one colour each
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert legend[0] == f"HBM {bw / 1e9:,.1f} GB/s (slope)" == "HBM 725.0 GB/s (slope)"
        assert legend[1:5] == [
            "fp32: 39.3 TFLOPS",
            "bf16 / fp16 / tf32 / fp8: 157.3 TFLOPS",
            "fp8 double_row: 314.6 TFLOPS",
            "4x structured sparsity: 629.1 TFLOPS",
        ]
        assert legend[5].startswith("1024x1024x1024 bf16: ")
    finally:
        plt.close(fig)


def test_without_matplotlib_the_error_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(trn2core.Trn2Error, match=r"trn2core\[plot\]"):
        roofline(128, 128, 128, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_cli_gemm_plot(tmp_path):
    path = tmp_path / "r.png"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trn2core",
            "gemm",
            "--m",
            "1024",
            "--k",
            "4096",
            "--n",
            "1024",
            "--sparsity",
            "4:16",
            "--plot",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "roofline" in r.stdout and path.stat().st_size > 10_000


@pytest.mark.parametrize("lnc", [None, "2"])
def test_cli_plot_draws_the_table_s_core(tmp_path, capsys, monkeypatch, lnc):
    """The figure's point is the TFLOPS the table above it prints, and its title names LNC only
    when --lnc was given (the chip's 620 TFLOPS point under an LNC=2 title was drawn before)."""
    figs = []
    real = plot.roofline_figure

    def keep(*a, **kw):
        fig, rep = real(*a, **kw)
        figs.append((fig.axes[0].get_title(), _lines(fig)["point"].get_ydata()[0]))
        return fig, rep

    monkeypatch.setattr(plot, "roofline_figure", keep)
    args = ["gemm", "--m", "4096", "--k", "4096", "--n", "4096", "--plot", str(tmp_path / "r.png")]
    # None: one physical NeuronCore, now `--lnc 1` (the CLI's default became LNC=2, issue 29).
    assert cli.main(args + ["--lnc", lnc or "1"]) == 0
    out = capsys.readouterr().out
    table = float(next(x for x in out.splitlines() if x.startswith("TFLOPS (wall)")).split()[-1])
    title, y = figs[0]
    assert f"{y:.2f}" == f"{table:.2f}"
    if lnc:
        assert "LNC=2" in title and "on one logical NeuronCore (LNC=2) written" in out
    else:
        assert "LNC" not in title and "on one NeuronCore written" in out
        assert "on one NeuronCore" in out.splitlines()[0]  # the table's own words
