"""The command line as a first-day user meets it (issues 17 and 19): the run agrees with the
header, every offered choice works, bad values are one-line errors, oversized work is refused
before anything is allocated, and no size text can hang the parser."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_inprocess import run_cli
from trn2core import _core, cli


def run_child(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m trn2core *args`` in a child, for the tests whose point is that it ends in
    time (a hang would otherwise hold the suite)."""
    return subprocess.run(
        [sys.executable, "-m", "trn2core", *args], capture_output=True, text=True, timeout=timeout
    )


def _gemm_choices() -> tuple[str, ...]:
    g = cli.build_parser()._subparsers._group_actions[0].choices["gemm"]
    return next(a.choices for a in g._actions if a.dest == "dtype")


def test_gemm_offers_exactly_the_formats_the_tensor_engine_takes():
    assert _gemm_choices() == tuple(f for f in _core.names()["formats"] if f != "fp8_e4m3fn")


@pytest.mark.parametrize("dtype", _gemm_choices())
def test_every_offered_gemm_dtype_runs_in_that_format(dtype):
    r = run_cli("gemm", "--m", "64", "--k", "64", "--n", "64", "--dtype", dtype, "--run")
    assert r.returncode == 0, r.stderr
    what = next(line for line in r.stdout.splitlines() if line.startswith("what"))
    # tf32 was rounded to tf32 and then run (and reported) as fp32.
    assert f" {dtype} perf_mode" in what, what


def test_the_ocp_fp8_format_is_not_offered_to_the_tensor_engine():
    r = run_cli("gemm", "--m", "64", "--k", "64", "--n", "64", "--dtype", "fp8_e4m3fn")
    assert r.returncode == 2
    assert "argument --dtype: invalid choice: 'fp8_e4m3fn'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "alias, fmt", [("bfloat16", "bf16"), ("float16", "fp16"), ("float8_e4m3", "fp8_e4m3")]
)
def test_gemm_dtype_takes_the_numpy_jax_pytorch_names(alias, fmt):
    r = run_cli("gemm", "--m", "64", "--k", "64", "--n", "64", "--dtype", alias, "--run")
    assert r.returncode == 0, r.stderr
    what = next(line for line in r.stdout.splitlines() if line.startswith("what"))
    assert f" {fmt} perf_mode" in what, what
    # OCP E4M3 by its PyTorch name is refused as its trn2core name is.
    r = run_cli("gemm", "--m", "64", "--k", "64", "--n", "64", "--dtype", "torch.float8_e4m3fn")
    assert r.returncode == 2 and "invalid choice: 'fp8_e4m3fn'" in r.stderr, r.stderr


def test_a_negative_seed_is_a_usage_error():
    r = run_cli("gemm", "--m", "8", "--k", "8", "--n", "8", "--run", "--seed", "-1")
    assert r.returncode == 2
    assert "argument --seed: expected a whole number >= 0, got -1" in r.stderr
    assert "Traceback" not in r.stderr


def test_gemm_run_beyond_the_host_is_refused_before_allocating():
    r = run_child("gemm", "--m", "300000", "--k", "300000", "--n", "128", "--run", timeout=30)
    assert r.returncode == 1, r.stderr  # a refusal by the model (was 2 before issue 29)
    assert r.stderr.startswith("trn2core gemm: CapacityError: --m/--k/--n:"), r.stderr
    assert "nothing was allocated" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("size", "error"),
    [
        ("1e999999999", "CapacityError"),
        ("1e-999999999", "Trn2ValueError"),
        ("0e999999999", "Trn2ValueError"),
    ],
)
def test_sizes_with_huge_exponents_are_refused_at_once(size, error):
    r = run_child("nccom-test", "-r", "2", "allr", "-b", size, "-e", size, timeout=20)
    # Beyond the model's limit is a refusal (1), a size below one byte a usage error (2).
    assert r.returncode == (1 if error == "CapacityError" else 2), r.stderr
    assert f"{error}: minbytes:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("path", ["out.xyz", "", "out", ".png", "dir/"])
def test_a_plot_path_without_a_plot_suffix_is_a_usage_error(path, tmp_path, monkeypatch):
    # A bad suffix was matplotlib's ValueError traceback after the report was printed; a path
    # without a suffix was written as PATH.png while the CLI said PATH; "" drew nothing.
    monkeypatch.chdir(tmp_path)
    r = run_cli("gemm", "--m", "8", "--k", "8", "--n", "8", "--plot", path)
    assert r.returncode == 2, r.stderr
    assert "argument --plot:" in r.stderr and ".png, .svg, .pdf" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_roofline_refuses_a_path_it_cannot_write_as_named(tmp_path):
    from trn2core import Trn2ValueError
    from trn2core.plot import roofline

    for bad in (tmp_path / "r.xyz", tmp_path / "r", 3):
        with pytest.raises(Trn2ValueError, match=r"path: .*\.png, \.svg, \.pdf|path: expected"):
            roofline(128, 128, 128, bad)
    assert list(tmp_path.iterdir()) == []


def test_nccom_check_is_refused_before_its_buffers_are_made():
    # 64 chips x 16 MiB all-gathered: 64 GiB of outputs. The check built its 1 GiB of inputs
    # (and 8 GiB of int64 patterns, one at a time) before the collective refused the outputs;
    # under a 1 GiB address-space cap that was numpy's MemoryError traceback.
    cap = 1 << 30
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))\n"
        "from trn2core.cli import main\n"
        "sys.exit(main(['nccom-test', '-N', '4', '-r', '256', 'allg', '-c', '-b', '16M',\n"
        "               '-e', '16M']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr  # a refusal by the model (was 2 before issue 29)
    assert "CapacityError: --check: the check of all_gather on 64 chips" in r.stderr, r.stderr
    assert "nothing was allocated" in r.stderr and "Traceback" not in r.stderr
