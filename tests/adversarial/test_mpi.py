"""Attack surface: the MPI layer. Calls that one process refuses, or that differ between
processes, must raise a ``Trn2Error`` on every process: never a hang (mpiexec under a timeout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent.parent / "mpi_worker.py"


def _launch(mode: str, procs: int, tmp: Path, timeout: float):
    """``mpiexec -n procs`` of tests/mpi_worker.py; every process's JSON (None if missing)."""
    beside = Path(sys.executable).with_name("mpiexec")
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found: install the trn2core[mpi] extra (make build does)"
    cmd = [mpiexec, "-n", str(procs), sys.executable, str(WORKER), mode, str(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ)
    files = [tmp / f"{mode}-{r}.json" for r in range(procs)]
    return done, [json.loads(f.read_text()) if f.exists() else None for f in files]


def _every_process(mode: str, procs: int, tmp: Path, hang: str) -> list:
    """``_launch`` under a 60 s timeout (a timeout fails the test with ``hang``): every
    process's JSON, the launch having exited 0."""
    try:
        done, outs = _launch(mode, procs, tmp, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(hang)
    assert done.returncode == 0, done.stdout + done.stderr
    return outs


@pytest.mark.parametrize("procs", [2, 4])
def test_a_placement_refused_or_different_on_one_process_fails_every_process(tmp_path, procs):
    hang = "a process waited forever for the others (no agreement on the placement)"
    for rank, o in enumerate(_every_process("placement", procs, tmp_path, hang)):
        refused = o["one_refused"]
        prefix = "" if rank == 1 else f"process 1 of {procs}: "
        assert refused and refused.startswith(
            f"Trn2ValueError: {prefix}placement: chip 0 is placed on process {procs}"
        ), (rank, refused)
        differ = o["differ"]
        assert differ and differ.startswith("Trn2ValueError: mismatched collective calls"), differ
        assert "making trn2.48xlarge (16 chips) placement=[0, 1, " in differ, differ
        # The calls line up again afterwards: the sum of chips 0..15 on every chip.
        assert o["after"] and all(v == [120.0] * 8 for v in o["after"]), o["after"]


@pytest.mark.parametrize("procs", [2, 4])
def test_a_freed_communicators_handle_reused_by_another_runs_on_the_other(tmp_path, procs):
    # trn2core keeps a duplicate of each communicator it is given; keyed by the handle
    # (py2f), a new communicator that MPI gives a freed one's handle would run on the freed
    # one's duplicate: other processes, other values, or a wait forever.
    hang = "a collective waited forever (it ran on a freed communicator's duplicate)"
    for rank, o in enumerate(_every_process("reuse", procs, tmp_path, hang)):
        cases = o["cases"]
        # MPI did reuse the handle (else this test proves nothing).
        assert len({c["handle"] for c in cases}) < len(cases), (rank, cases)
        for c in cases:
            assert rank in c["members"], (rank, c)
            assert c["processes"] == len(c["members"]), (rank, c)
            assert c["values"] == [c["expected"]], (rank, c)
        after = o["after_free"]
        assert after and "freed" in after, (rank, after)
        # No duplicate left behind per cycle: MPI hands out the same few handles again (a
        # duplicate leaked per cycle makes it 26 of 50 under 2 processes, 50 under 4).
        assert o["cycle_handles"] <= 5, (rank, o["cycle_handles"])
