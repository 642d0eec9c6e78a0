"""Attack surface: the command line. Every subcommand with bad values of every option: exit
status 0 or 2, never a traceback, never a hang (a fast subset here; the whole sweep is slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BAD = [
    "",
    "-1",
    "0",
    "abc",
    "1e999",
    "nan",
    "inf",
    "2**64",
    "18446744073709551616",
    "1.5",
    "\x01",
    "é",
    "-",
    "/nonexistent/x",
    "/",
    " ",
    "99999999999999999999999",
]


def _commands(values):
    for v in values:
        yield ["gemm", "--m", v, "--k", "8", "--n", "8"]
        yield ["gemm", "--m", "8", "--k", "8", "--n", "8", "--trace", v]
        yield ["gemm", "--m", "8", "--k", "8", "--n", "8", "--plot", v]
        yield ["gemm", "--m", "8", "--k", "8", "--n", "8", "--run", "--seed", v]
        yield ["gemm", "--m", "8", "--k", "8", "--n", "8", "--lnc", v]
        yield ["demo", "--only", "numerics", "--trace", v]
        yield ["ls", "--ultracluster", v]
        yield ["ls", "--instance", v]
        yield ["nccom-test", "-r", v, "allr"]
        yield ["nccom-test", "-r", "4", "allr", "-b", v]
        yield ["nccom-test", "-r", "4", "allr", "-b", "1K", "-e", v]
        yield ["nccom-test", "-r", "4", "allr", "-b", "1K", "-e", "8K", "-f", v]
        yield ["nccom-test", "-r", "4", "allr", "-b", "1K", "-e", "8K", "-i", v]
        yield ["nccom-test", "-r", "4", v]
        yield ["nki", "run", v]
        yield ["nki", "run", v + "::k"]
        yield ["spec", v]
        yield ["docs", v]


EXTRA = [
    ["gemm", "--m", "8", "--k", "8", "--n", "8", "--plot", "out.xyz"],
    ["gemm", "--m", "8", "--k", "8", "--n", "8", "--trace", "/dev/full"],
    ["nccom-test", "-r", "4", "allr", "-d", "uint8", "-c"],
    ["nccom-test", "-r", "4", "alltoall", "-c", "-b", "3", "-e", "3"],
    ["nccom-test", "-r", "1", "sendrecv", "-c", "-b", "1", "-e", "1"],
    ["nccom-test", "-r", "65536", "allg", "-c", "-b", "1M", "-e", "1M"],
]


def _run(args, cwd):
    r = subprocess.run(
        [sys.executable, "-m", "trn2core", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    return r.returncode, r.stderr


def _check(cmds, cwd):
    bad = []
    for c in cmds:
        rc, err = _run(c, cwd)
        if rc not in (0, 1, 2) or "Traceback" in err:  # 1: refused by the model
            bad.append((c, rc, err.strip().splitlines()[-1:] if err else ""))
    assert not bad, bad


def test_cli_bad_values_fast_subset(tmp_path):
    # One bad value per option kind (each command is a fresh interpreter: about 0.5 s).
    cmds = list(_commands(["1e999"]))
    _check([cmds[i] for i in (0, 2, 3, 6, 9, 11, 14, 16)] + EXTRA[:1], tmp_path)


@pytest.mark.slow
def test_cli_bad_values_every_subcommand(tmp_path):
    _check(list(_commands(BAD)) + EXTRA, tmp_path)


NKI_KERNEL = (
    str(Path(__file__).resolve().parents[2] / "examples" / "nki" / "tensor_add.py") + "::tensor_add"
)
NKI_RUN = [
    # (options, exit status: 2 a usage error, 1 a refusal by the model or the host)
    (["--shapes", "128x512", "128x512", "--grid", "abc"], 2),
    (["--shapes", "128x512", "128x512", "--grid", "0"], 2),
    (["--shapes", "128x512", "128x512", "--seed", "-1"], 2),
    (["--shapes", "128x512"], 2),  # the kernel takes two arrays
    (["--shapes", "128x512", "128x512", "128x512"], 2),
    (["--shapes", "128x512", "128x512", "--arg", "nope=1"], 2),
    (["--shapes", "99999999x99999999", "128x512"], 1),  # the host check, before allocating
    (["--shapes", "99999999999999999999999x1", "128x512"], 1),
    (["--shapes", "128x512:bool", "128x512:bool"], None),  # runs, or a one-line refusal
]


@pytest.mark.parametrize(("options", "status"), NKI_RUN)
def test_nki_run_bad_options_are_one_line_errors(tmp_path, options, status):
    rc, err = _run(["nki", "run", NKI_KERNEL, *options], tmp_path)
    assert "Traceback" not in err, err
    if status is None:
        assert rc in (0, 1) and (rc == 0 or len(err.strip().splitlines()) == 1), (rc, err)
    else:
        assert rc == status, (rc, err)
        assert err.strip().splitlines()[-1].startswith("trn2core nki"), err
