"""Attack surface: the command line. Every subcommand with bad values of every option: exit
status 0 or 2, never a traceback, never a hang (a fast subset here; the whole sweep is slow)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BAD = ["", "-1", "0", "abc", "1e999", "nan", "inf", "2**64", "18446744073709551616", "1.5",
       "\x01", "é", "-", "/nonexistent/x", "/", " ", "99999999999999999999999"]  # fmt: skip


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
        capture_output=True, text=True, timeout=120, cwd=cwd,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip
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
