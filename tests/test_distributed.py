"""Collectives with the chips spread over MPI processes (issue 18, docs/distributed.md).

Each test launches ``mpiexec`` (MPICH's wheel from PyPI, the ``trn2core[mpi]`` extra the
Makefile installs) with 2 or 4 processes on this machine, oversubscribed, running
tests/mpi_worker.py; the worker writes what every process saw to JSON files, asserted here. The
cases are batched into a few launches (a launch costs about a second)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from trn2core._names import ALGORITHMS

WORKER = Path(__file__).with_name("mpi_worker.py")


def _mpiexec() -> str:
    beside = Path(sys.executable).with_name("mpiexec")
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    assert found, "mpiexec not found: install the trn2core[mpi] extra (make build does)"
    return found


def _launch(mode: str, procs: int, tmp: Path, env=None, timeout: float = 300):
    """Runs the worker; returns (completed process, seconds, every process's JSON or None)."""
    cmd = [_mpiexec(), "-n", str(procs), sys.executable, str(WORKER), mode, str(tmp)]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    seconds = time.monotonic() - t0
    outs = []
    for r in range(procs):
        f = tmp / f"{mode}-{r}.json"
        outs.append(json.loads(f.read_text()) if f.exists() else None)
    return done, seconds, outs


@pytest.fixture(scope="module")
def bits(tmp_path_factory):
    """Every process's cases of the ``bits`` mode, for 2 and 4 processes."""
    runs = {}
    for procs in (2, 4):
        tmp = tmp_path_factory.mktemp(f"bits{procs}")
        done, _, outs = _launch("bits", procs, tmp)
        assert done.returncode == 0, done.stdout + done.stderr
        runs[procs] = outs
    return runs


def _compared(runs) -> list[dict]:
    return [c for outs in runs.values() for o in outs for c in o["cases"]]


def test_every_collective_and_algorithm_has_the_bits_of_one_process(bits):
    cases = _compared(bits)
    ran = [c for c in cases if c["ref_error"] is None]
    assert ran and all(c.get("error") is None for c in ran), [c for c in ran if c.get("error")]
    for c in ran:
        assert c["bits_equal"], c
        assert c["ranks"] == c["expected_ranks"], c
    # P in {1, 2, 4}: 1 is MPI.COMM_SELF inside the 2-process job.
    assert {c["procs"] for c in ran} == {1, 2, 4}
    covered = {(c["collective"], c["algorithm"], c["procs"]) for c in ran}
    for procs in (1, 2, 4):
        for coll in ("all_reduce", "reduce_scatter", "all_gather"):
            for alg in ALGORITHMS:
                assert (coll, alg, procs) in covered, (coll, alg, procs)
        for coll, alg in (("all_to_all", "auto"), ("all_to_all", "mesh"), ("send_recv", "auto")):
            assert (coll, alg, procs) in covered, (coll, alg, procs)
    # Placements other than the default, a subset of the chips, a process holding none.
    assert {"round-robin", "reversed", "on-one"} <= {c["placement"] for c in ran if c["procs"] > 1}
    assert any(c["chips"] for c in ran if c["procs"] == 4)
    assert any(c["expected_ranks"] == [] for c in ran)


def test_timing_report_is_the_single_process_one_plus_the_emulations(bits):
    ran = [c for c in _compared(bits) if c["ref_error"] is None]
    for c in ran:
        assert c["report_equal"], c
        assert c["processes"] == c["procs"] and c["wall_s"] > 0 and c["text_ok"], c
        if c["procs"] == 1:
            assert c["exchanged_bytes"] == c["sent_bytes"] == c["received_bytes"] == 0, c
    spread = [c for c in ran if c["procs"] > 1 and c["placement"] == "default"]
    assert all(c["exchanged_bytes"] > 0 for c in spread if c["collective"] != "send_recv")
    # fp32 pieces need no padding: never more than the schedule's own transfers would move.
    four = [c for c in spread if c["dtype"] == "float32" and c["chips"] is None]
    assert four and all(c["exchanged_bytes"] <= c["schedule_bytes"] for c in four), four
    # Every process of a job agrees on the total; each its own share.
    for outs in bits.values():
        by_case: dict = {}
        for o in outs:
            for k, c in enumerate(o["cases"]):
                if c["ref_error"] is None:
                    by_case.setdefault((c["procs"], k), []).append(c)
        for group in by_case.values():
            if group[0]["procs"] > 1:
                assert len({c["exchanged_bytes"] for c in group}) == 1, group
                assert sum(c["sent_bytes"] for c in group) == group[0]["exchanged_bytes"]
                assert sum(c["received_bytes"] for c in group) == group[0]["exchanged_bytes"]


def test_what_one_process_refuses_every_process_refuses_alike(bits):
    for c in _compared(bits):
        if c["ref_error"] is not None:
            assert c.get("error") == c["ref_error"], c


def test_processes_that_do_not_divide_the_chips_are_refused(bits):
    errs = [o["errors"].get("indivisible") for o in bits[4][:3]]
    for e in errs:
        assert e.startswith("Trn2ValueError: processes: 3 processes cannot share the 16 chips"), e
        assert "placement=" in e


@pytest.mark.parametrize("procs", [2, 4])
def test_placements_that_do_not_fit_are_refused(bits, procs):
    for o in bits[procs]:
        e = o["errors"]
        assert e["short_placement"].startswith("ShapeError: placement: got 1 entries"), e
        assert e["placement_beyond"].startswith(
            f"Trn2ValueError: placement: chip 0 is placed on process {procs}; the processes "
            f"are 0..{procs}"
        ), e


def test_comm_and_placement_are_checked_without_mpi():
    # No MPI needed: refused before anything touches a communicator.
    from trn2core import Instance, Trn2ValueError, UltraServer

    with pytest.raises(Trn2ValueError, match="comm: expected an mpi4py communicator"):
        Instance("trn2.48xlarge", comm="world")
    with pytest.raises(Trn2ValueError, match="comm: expected an mpi4py communicator"):
        UltraServer(comm=object())
    with pytest.raises(Trn2ValueError, match="placement: only with comm="):
        Instance("trn2.48xlarge", placement=[0] * 16)
    assert Instance("trn2.48xlarge").local_chips == tuple(range(16))


@pytest.mark.parametrize("procs", [2, 4])
def test_wrong_input_on_one_process_is_a_clear_error_on_every_process(bits, procs):
    for rank, o in enumerate(bits[procs]):
        e = o["errors"]
        prefix = "" if rank == 1 else f"process 1 of {procs}: "
        assert e["bad_dtype"].startswith(f"FormatError: {prefix}buffers: dtype int64"), e
        assert e["missing_buffer"].startswith(f"ShapeError: {prefix}buffers: got "), e
        assert e["bad_algorithm"].startswith("Trn2ValueError: algorithm: hierarchical"), e
        # The calls line up again afterwards.
        assert e["after_errors_bits_equal"] is True


@pytest.mark.parametrize("procs", [2, 4])
def test_mismatched_calls_are_detected_on_every_process(bits, procs):
    for o in bits[procs]:
        e = o["errors"]
        assert "mismatched collective calls" in e["other_collective"], e
        assert "all_gather" in e["other_collective"] and "all_reduce" in e["other_collective"]
        assert "mismatched collective calls" in e["other_size"], e
        assert "elements=39" in e["other_size"] and "elements=40" in e["other_size"]
        assert "mismatched collective calls" in e["other_machine"], e
        assert "UltraServer (64 chips)" in e["other_machine"], e
        assert "trn2.48xlarge (16 chips)" in e["other_machine"], e


def test_ultraserver_all_reduce_larger_than_one_process_may_hold(tmp_path):
    elements = 1 << 20  # 4 MiB per chip: 512 MiB of inputs and outputs for 64 chips
    limit = 200 << 20
    done, _, outs = _launch(
        "big",
        4,
        tmp_path,
        env={"TRN2CORE_HOST_MEMORY": str(limit), "TRN2CORE_TEST_ELEMENTS": str(elements)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert outs[0]["total_buffer_bytes"] > limit
    # One process alone is refused before allocating; four complete.
    assert outs[0]["single_process_error"].startswith("CapacityError: buffers: the all_reduce")
    assert sorted(c for o in outs for c in o["local_chips"]) == list(range(64))
    assert all(o["sample_matches"] for o in outs), outs
    assert len({o["exchanged_bytes"] for o in outs}) == 1 and outs[0]["exchanged_bytes"] > 0


@pytest.mark.parametrize(
    "mode, message",
    [
        ("kill", "Killed"),
        ("raise", "MemoryError: simulated: process 1 ran out of memory"),
        ("uncaught", "RuntimeError: simulated: process 1 failed before the collective"),
        ("badinput", "FormatError: buffers: dtype int64 is not a Trainium2 number format"),
    ],
)
def test_a_failing_process_ends_the_job_quickly_with_its_error(tmp_path, mode, message):
    done, seconds, outs = _launch(mode, 2, tmp_path, timeout=60)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    assert seconds < 30, seconds
    assert outs == [None, None], outs  # no process got past the collective
    assert message in text, text
    if mode != "kill":
        assert "process 1 of 2" in text, text


def _mpi_doc_blocks() -> list[str]:
    text = (Path(__file__).resolve().parent.parent / "docs" / "distributed.md").read_text()
    return re.findall(r"^```python mpi[ \t]*\n(.*?)^```", text, re.S | re.M)


def test_the_guides_mpi_example_runs_under_mpiexec(tmp_path):
    blocks = _mpi_doc_blocks()
    assert blocks
    for k, code in enumerate(blocks):
        script = tmp_path / f"block{k}.py"
        script.write_text(code)
        done = subprocess.run(
            [_mpiexec(), "-n", "2", sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 processes" in done.stdout and "between processes" in done.stdout, done.stdout


def _trn2core_cli() -> str:
    return str(Path(sys.executable).with_name("trn2core"))


@pytest.mark.parametrize("procs", [1, 2, 4])
def test_nccom_test_check_runs_on_data_under_mpi(procs):
    ops = [
        ("allr", "fp32"),
        ("redsct", "bf16"),
        ("allg", "fp16"),
        ("alltoall", "int8"),
        ("sendrecv", "uint32"),
    ]
    for op, dtype in ops:
        cmd = [
            _trn2core_cli(),
            "nccom-test",
            op,
            "-r",
            "32",
            "-b",
            "4k",
            "-e",
            "1M",
            "-f",
            "16",
            "-d",
            dtype,
            "--check",
        ]
        if procs > 1:
            done = subprocess.run(
                [_mpiexec(), "-n", str(procs), *cmd], capture_output=True, text=True, timeout=300
            )
        else:  # one process, no launcher: the command line in this process
            done = run_cli(*cmd[1:])
        assert done.returncode == 0, done.stdout + done.stderr
        lines = [x for x in done.stdout.splitlines() if x.startswith("check ")]
        assert len(lines) == 3, done.stdout  # 4k, 64k, 1M
        assert all("every output as expected" in x and "8 chips" in x for x in lines), lines
        spread = f"spread over {procs} MPI processes"
        assert all((spread in x) == (procs > 1) for x in lines), lines
        assert done.stdout.count("size(B)") == 1  # the table printed once


def test_nccom_test_check_refuses_integer_reductions_naming_the_datatype():
    done = run_cli(*"nccom-test allr -r 16 -b 4k -e 4k -d int32 --check".split())
    assert done.returncode != 0
    assert "FormatError: datatype: --check runs all_reduce on data" in done.stderr, done.stderr


def test_nccom_test_check_refuses_processes_that_do_not_divide_the_chips():
    cmd = [_mpiexec(), "-n", "3", _trn2core_cli(), "nccom-test", "allr", "-r", "32"]
    cmd += "-b 4k -e 4k -d fp32 --check".split()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "3 processes cannot share the 8 chips" in done.stdout + done.stderr
