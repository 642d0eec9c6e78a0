"""The command-line tools beside the ones they imitate (issue 17): ``trn2core nccom-test`` with
the flags of Neuron's current nccom-test, ``trn2core ls`` with neuron-ls's columns and JSON,
``gemm --json``, and progress bars that appear on a terminal and never in a pipe."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from trn2core import cli, spec
from trn2core.cli.nccom import _NCCOM_UNMODELLED_FLAGS

ROOT = Path(__file__).resolve().parent.parent


def table(out: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of nccom-test's table."""
    lines = out.strip().splitlines()
    return lines[0].split(), [x.split() for x in lines[1:] if x.split()[0].isdigit()]


@pytest.fixture(autouse=True)
def _no_lnc_env(monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)


# ------------------------------------------------------------------------------- nccom-test


def test_header_is_time_avg_as_the_tool_prints_it():
    r = run_cli("nccom-test", "-r", "16", "allr")
    assert r.returncode == 0, r.stderr
    head, rows = table(r.stdout)
    assert head == ["size(B)", "count(elems)", "type", "time:avg(us)", "algbw(GB/s)", "busbw(GB/s)"]
    assert [x[0] for x in rows] == ["33554432"]  # the tool's default size, 32M


def test_stats_give_one_column_each_all_equal_as_the_model_is_deterministic():
    stats = ["--stats", "avg", "p25", "p50", "p90", "p99", "--iters", "1000"]
    r = run_cli(
        "nccom-test", "-r", "8", "-b", "1kb", "-e", "1mb", "-f", "8", "-d", "fp32", *stats, "allg"
    )
    assert r.returncode == 0, r.stderr
    head, rows = table(r.stdout)
    assert head[3:8] == [
        "time:avg(us)",
        "time:p25(us)",
        "time:p50(us)",
        "time:p90(us)",
        "time:p99(us)",
    ]
    assert [int(x[0]) for x in rows] == [1024, 8192, 65536, 524288]
    for x in rows:
        assert len(set(x[3:8])) == 1 and float(x[3]) > 0
    # The same times as without --stats and --iters: iterations do not change the model.
    plain = table(
        run_cli(
            "nccom-test", "-r", "8", "-b", "1kb", "-e", "1mb", "-f", "8", "-d", "fp32", "allg"
        ).stdout
    )[1]
    assert [x[3] for x in plain] == [x[3] for x in rows]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "p101"], "stats: 'p101' is not a statistic"),
        (["-t", "median"], "stats: 'median' is not a statistic"),
        (["-n", "0"], "argument -n/--iters: expected a whole number >= 1, got 0"),
        (["-w", "-1"], "argument -w/--warmup_iters/--warmup-iters: expected a whole number >= 0"),
        (["-N", "0"], "argument -N/--nnodes: expected a whole number >= 1, got 0"),
    ],
)
def test_bad_iteration_and_stats_arguments_are_usage_errors(args, message):
    r = run_cli("nccom-test", "-r", "16", "allr", *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_json_report_file_and_json_output_agree_with_the_table(tmp_path):
    path = tmp_path / "nccom-results.json"
    args = [
        "nccom-test",
        "-r",
        "32",
        "-b",
        "1kb",
        "-e",
        "1mb",
        "-f",
        "8",
        "-d",
        "fp32",
        "allg",
        "-n",
        "50",
        "-w",
        "3",
        "-t",
        "avg",
        "p50",
    ]
    r = run_cli(*args, "--report-to-json-file", str(path))
    assert r.returncode == 0, r.stderr
    _, rows = table(r.stdout)
    rep = json.loads(path.read_text())
    assert set(rep) == {"config", "results", "avg_busbw(GB/s)", "uncertainty"}
    cfg = rep["config"]
    assert (cfg["operation"], cfg["nworkers"], cfg["nnodes"], cfg["lnc"], cfg["chips"]) == (
        "all_gather",
        32,
        1,
        2,
        8,
    )
    assert (cfg["iters"], cfg["warmup_iters"], cfg["stats"]) == (50, 3, ["avg", "p50"])
    assert cfg["deterministic"] is True and cfg["bandwidth_unit"] == "GB/s = 10^9 bytes/s"
    assert len(rep["results"]) == len(rows) == 4
    for rec, x in zip(rep["results"], rows, strict=True):
        assert list(rec) == [
            "size(B)",
            "count(elems)",
            "type",
            "time:avg(us)",
            "time:p50(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "algorithm",
        ]
        assert (rec["size(B)"], rec["count(elems)"], rec["type"]) == (int(x[0]), int(x[1]), "fp32")
        assert f"{rec['time:avg(us)']:.2f}" == x[3] == f"{rec['time:p50(us)']:.2f}"
        # GB/s is 10^9 bytes/s: size / time.
        assert rec["algbw(GB/s)"] == pytest.approx(rec["size(B)"] / rec["time:avg(us)"] / 1e3)
        assert f"{rec['busbw(GB/s)']:.2f}" == x[6]
    assert f"Avg bus bandwidth:\t{rep['avg_busbw(GB/s)']:.4f}GB/s" in r.stdout
    j = run_cli(*args, "--json")
    assert j.returncode == 0 and json.loads(j.stdout) == rep  # one object, the same report


def test_help_states_units_ranks_and_determinism():
    r = run_cli("nccom-test", "--help")
    text = " ".join(r.stdout.split())
    assert "GB/s = 10^9 bytes/s" in text
    assert "A rank is a logical NeuronCore" in text and "NEURON_LOGICAL_NC_CONFIG" in text
    assert "deterministic" in text and "percentiles equal the average" in text
    for flag in (
        "-N NNODES",
        "-n ITERS",
        "-w WARMUP_ITERS",
        "-t STAT",
        "--report-to-json-file",
        "--custom-src-target-pairs",
        "--json",
        "-c [MODE], --check [MODE]",
    ):
        assert flag in text, flag
    for flags, _, _ in _NCCOM_UNMODELLED_FLAGS:  # the flags it refuses are listed too
        assert "/".join(flags) in text


def test_nodes_divide_the_ranks_and_one_node_holds_one_instance():
    r = run_cli("nccom-test", "-r", "128", "allr")
    assert r.returncode == 2
    assert (
        "128 ranks at LNC=2 need 32 chips; one node (a 16-chip trn2 instance) holds 64 "
        "ranks: pass -N/--nnodes 2 or more" in r.stderr
    )
    two = run_cli("nccom-test", "-r", "128", "-N", "2", "allr", "--json")
    assert two.returncode == 0, two.stderr
    assert json.loads(two.stdout)["config"]["chips"] == 32
    half = run_cli("nccom-test", "-r", "64", "-N", "2", "allr")
    assert half.returncode == 2 and "32 ranks per node" in half.stderr
    uneven = run_cli("nccom-test", "-r", "63", "-N", "2", "allr")
    assert uneven.returncode == 2 and "do not divide equally over 2 nodes" in uneven.stderr
    six = run_cli("nccom-test", "-r", "384", "-N", "6", "allr")
    assert six.returncode == 2 and "whole UltraServers" in six.stderr


def test_hierarchical_algorithms_print_as_hier():
    r = run_cli(
        "nccom-test", "-r", "512", "-N", "8", "allr", "-b", "1G", "-e", "1G", "--show-algorithm"
    )
    assert r.returncode == 0, r.stderr
    head, rows = table(r.stdout)
    assert head[-1] == "algorithm" and rows[0][-1] == "hier"


def test_neuron_logical_nc_config_is_honoured_and_lnc_overrides_it():
    one = json.loads(
        run_cli(
            "nccom-test", "-r", "16", "allr", "--json", env={"NEURON_LOGICAL_NC_CONFIG": "1"}
        ).stdout
    )
    assert (one["config"]["lnc"], one["config"]["chips"]) == (1, 2)
    flag = json.loads(run_cli("nccom-test", "-r", "16", "allr", "--json", "--lnc", "1").stdout)
    assert flag["results"] == one["results"]
    over = json.loads(
        run_cli(
            "nccom-test",
            "-r",
            "16",
            "allr",
            "--json",
            "--lnc",
            "2",
            env={"NEURON_LOGICAL_NC_CONFIG": "1"},
        ).stdout
    )
    assert (over["config"]["lnc"], over["config"]["chips"]) == (2, 4)
    bad = run_cli("nccom-test", "-r", "16", "allr", env={"NEURON_LOGICAL_NC_CONFIG": "3"})
    assert bad.returncode == 2 and "NEURON_LOGICAL_NC_CONFIG: got '3'" in bad.stderr
    ls = run_cli("ls", env={"NEURON_LOGICAL_NC_CONFIG": "1"})
    assert "logical-neuroncore-config: 1" in ls.stdout


def _pairs(tmp_path, pairs) -> str:
    p = tmp_path / "pairs.json"
    p.write_text(json.dumps({"src_target_pairs": [pairs]}))
    return str(p)


def test_permute_within_chips_and_across_chips(tmp_path):
    within = _pairs(tmp_path, [[0, 1], [1, 0], [2, 3], [3, 2], [4, 4], [5, 5], [6, 6], [7, 7]])
    r = run_cli(
        "nccom-test", "-r", "8", "--custom-src-target-pairs", within, "permute", "--show-algorithm"
    )
    assert r.returncode == 0, r.stderr
    _, rows = table(r.stdout)
    size, t, algbw, busbw, alg = (
        int(rows[0][0]),
        float(rows[0][3]),
        rows[0][4],
        rows[0][5],
        rows[0][6],
    )
    assert size == 32 << 20 and alg == "local" and algbw == busbw  # bus factor 1
    # Four copies of 32 MiB within chip 0 (read and write) at the chip's HBM bandwidth, at least.
    assert t * 1e-6 > 4 * 2 * size / spec.hbm_chip_bytes_per_s
    shift = _pairs(tmp_path, [[i, (i + 4) % 16] for i in range(16)])  # each chip to the next
    x = run_cli(
        "nccom-test", "-r", "16", "--custom-src-target-pairs", shift, "permute", "--show-algorithm"
    )
    assert x.returncode == 0, x.stderr
    _, xrows = table(x.stdout)
    assert xrows[0][6] != "local" and float(xrows[0][3]) > t  # 128 MiB over a NeuronLink


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([[0, 1], [0, 2]], "rank 0 sends more than once"),
        ([[0, 2], [1, 2]], "rank 2 receives more than once"),
        ([[0, 9]], "rank 9 does not exist; -r 8 has ranks 0..7"),
        ([[0, "1"]], "expected a [src, dst] pair of ranks"),
    ],
)
def test_bad_permute_pairs_are_clear_errors(tmp_path, pairs, message):
    r = run_cli(
        "nccom-test", "-r", "8", "--custom-src-target-pairs", _pairs(tmp_path, pairs), "permute"
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_permute_needs_its_pairs_file():
    r = run_cli("nccom-test", "-r", "8", "permute")
    assert r.returncode == 2 and "permute needs --custom-src-target-pairs FILE" in r.stderr


@pytest.mark.parametrize("flags", [f for f, _, _ in _NCCOM_UNMODELLED_FLAGS], ids=lambda f: f[-1])
def test_flags_of_the_aws_tool_that_cannot_be_modelled_are_named(flags, capsys):
    for flag in flags:
        with pytest.raises(SystemExit) as e:
            cli.main(["nccom-test", "-r", "16", "allr", flag, "x"])
        err = capsys.readouterr().err
        assert e.value.code == 2
        assert f"error: {flag} is a flag of Neuron's nccom-test that trn2core cannot model (" in err


@pytest.mark.parametrize("op", ["alltoallv", "allgv", "all_gatherv"])
def test_operations_of_the_aws_tool_that_are_not_modelled_are_named(op):
    r = run_cli("nccom-test", "-r", "8", op)
    assert r.returncode == 2
    assert (
        f"{op} (" in r.stderr
        and "is an operation of Neuron's nccom-test that trn2core does not model" in r.stderr
    )


def test_default_step_is_the_tools_and_the_readme_example_gives_sizes_people_choose():
    # Without -f or -i, nccom-test steps by (max - min) / 10; trn2core does the same and says
    # so, pointing to -f.
    r = run_cli("nccom-test", "-r", "16", "allr", "--minbytes", "8", "--maxbytes", "1G")
    assert r.returncode == 0
    step = ((1 << 30) - 8) // 10
    assert [int(x[0]) for x in table(r.stdout)[1]] == [8 + i * step for i in range(11)]
    assert "-f 2 doubles the size each row" in r.stderr
    # The README's example: powers of two from 8 B to 1 GiB.
    cmd = "trn2core nccom-test -r 16 allr --minbytes 8 --maxbytes 1G -f 2"
    assert cmd in " ".join((ROOT / "README.md").read_text().split())
    ex = run_cli(*cmd.split()[1:])
    assert ex.returncode == 0 and ex.stderr == ""
    assert [int(x[0]) for x in table(ex.stdout)[1]] == [8 << i for i in range(28)]


# ------------------------------------------------------------------------------------- ls


def test_ls_prints_the_neuron_ls_columns_that_apply():
    out = run_cli("ls").stdout
    lines = out.splitlines()
    assert lines[0] == "instance-type: trn2.48xlarge"
    assert lines[1] == "logical-neuroncore-config: 2"
    box = [x for x in lines if x.startswith("|")]
    head = [c.strip() for c in box[0].strip("|").split("|")]
    head2 = [c.strip() for c in box[1].strip("|").split("|")]
    assert [f"{a} {b}" for a, b in zip(head, head2, strict=True)] == [
        "NEURON DEVICE",
        "NEURON CORES",
        "NEURON CORE IDS",
        "NEURON MEMORY",
        "CONNECTED DEVICES",
        "TORUS COORDS",
    ]
    first = [c.strip() for c in box[2].strip("|").split("|")]
    assert first[:4] == ["0", "4", "0-3", "96 GB"]


@pytest.mark.parametrize("flag", ["-j", "--json", "--json-output"])
def test_ls_json_is_neuron_ls_list_of_devices(flag):
    """Issue 29: scripts written for neuron-ls (`neuron-ls -j | jq '.[0].nc_count'`) work on
    `trn2core ls -j`: a top-level list of devices with neuron-ls's keys, in its order; the
    expressions below are those jq programs, on the parsed JSON."""
    r = run_cli("ls", flag)
    assert r.returncode == 0, r.stderr
    devs = json.loads(r.stdout)
    assert isinstance(devs, list) and len(devs) == 16
    keys = (
        "neuron_device bdf cpu_affinity numa_node connected_to nc_count logical_neuroncore_config"
    )
    assert list(devs[0]) == (keys + " memory_size neuroncore_ids neuron_processes").split()
    assert devs[0]["nc_count"] == 4  # jq '.[0].nc_count'
    assert sum(d["nc_count"] for d in devs) == 64  # jq '[.[].nc_count] | add'
    assert [d["neuron_device"] for d in devs] == list(range(16))  # jq '[.[].neuron_device]'
    assert devs[5]["neuroncore_ids"] == [20, 21, 22, 23]  # jq '.[5].neuroncore_ids'
    assert devs[0]["connected_to"] == [1, 3, 4, 12]  # jq '.[0].connected_to'
    assert devs[0]["memory_size"] == 96 << 30  # jq '.[0].memory_size'
    assert {d["logical_neuroncore_config"] for d in devs} == {2}
    assert (devs[0]["bdf"], devs[0]["cpu_affinity"], devs[0]["numa_node"]) == (None,) * 3
    assert devs[0]["neuron_processes"] == []  # jq '.[0].neuron_processes | length' is 0
    lnc1 = json.loads(run_cli("ls", flag, env={"NEURON_LOGICAL_NC_CONFIG": "1"}).stdout)
    assert lnc1[15]["nc_count"] == 8 and lnc1[15]["neuroncore_ids"] == list(range(120, 128))


def test_ls_topology_draws_the_torus():
    r = run_cli("ls", "-t")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("NeuronLink torus 4 x 4: every row (X) and column (Y) wraps")
    assert lines[1:4] == [
        "   0 --  1 --  2 --  3",
        "   |     |     |     |",
        "   4 --  5 --  6 --  7",
    ]
    us = run_cli("ls", "--topology", "--ultraserver").stdout.splitlines()
    assert "z = 3:" in us and "  48 -- 49 -- 50 -- 51" in us
    one = run_cli("ls", "-t", "--instance", "trn2.3xlarge").stdout
    assert one.strip() == "one chip: no NeuronLink torus (device 0)"


@pytest.mark.parametrize("flag", ["-j", "--json", "--json-output"])
def test_ls_topology_json_is_one_object_with_the_machine(flag):
    # Was `ls -j` before issue 29 (the machine-level object); now `ls -t -j`.
    r = run_cli("ls", "-t", flag)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["instance_type"], d["logical_neuroncore_config"], d["torus_shape"]) == (
        "trn2.48xlarge",
        2,
        [4, 4],
    )
    devs = d["neuron_devices"]
    assert [x["neuron_device"] for x in devs] == list(range(16))
    one = devs[1]
    keys = "neuron_device nc_count neuroncore_ids memory_size connected_to torus_coords"
    assert set(one) == {*keys.split(), "logical_neuroncore_config"}
    assert (one["nc_count"], one["neuroncore_ids"]) == (4, [4, 5, 6, 7])
    assert one["memory_size"] == 96 << 30 == spec.hbm_chip_bytes
    # The same neighbours as the text table.
    text = run_cli("ls").stdout.splitlines()
    row1 = next(x for x in text if x.startswith("| 1 "))
    assert ", ".join(map(str, one["connected_to"])) == row1.split("|")[5].strip()
    lnc1 = json.loads(run_cli("ls", "-t", "-j", "--lnc", "1", "--ultraserver").stdout)
    assert len(lnc1["neuron_devices"]) == 64 and lnc1["neuron_devices"][0]["nc_count"] == 8


# ----------------------------------------------------------------------------------- gemm


def test_gemm_json_is_one_object_with_the_tables_numbers(tmp_path):
    # --lnc 1: one physical NeuronCore (the CLI's default became LNC=2 with issue 29).
    r = run_cli(
        "gemm",
        "--m",
        "512",
        "--k",
        "1024",
        "--n",
        "256",
        "--run",
        "--json",
        "--trace",
        str(tmp_path / "t.json"),
        "--lnc",
        "1",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) == {
        "m",
        "k",
        "n",
        "dtype",
        "perf_mode",
        "sparsity",
        "lnc",
        "core",
        "report",
        "run",
        "trace",
        "plot",
    }
    assert (d["m"], d["k"], d["n"], d["dtype"], d["core"]) == (
        512,
        1024,
        256,
        "bf16",
        "one NeuronCore",
    )
    assert d["report"]["flops"] == 2 * 512 * 1024 * 256 and d["run"]["seed"] == 0
    table_run = run_cli("gemm", "--m", "512", "--k", "1024", "--n", "256", "--lnc", "1").stdout
    tf = float(next(x for x in table_run.splitlines() if x.startswith("TFLOPS (wall)")).split()[-1])
    assert f"{d['report']['tflops']:.2f}" == f"{tf:.2f}"
    assert "trace written to" in r.stderr and (tmp_path / "t.json").exists()
    est = json.loads(run_cli("gemm", "--m", "64", "--k", "64", "--n", "64", "--json").stdout)
    assert est["run"] is None


# ------------------------------------------------------------------------------- progress


def _on_a_terminal(*args: str) -> tuple[str, bytes]:
    """Runs the CLI with stderr on a pseudo-terminal and stdout on a pipe: (stdout, what the
    terminal received)."""
    master, slave = pty.openpty()
    env = dict(os.environ)
    env.pop("NEURON_LOGICAL_NC_CONFIG", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "trn2core", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = p.stdout.read().decode()
    p.wait(timeout=120)
    os.close(master)
    assert p.returncode == 0, seen
    return out, seen


NCCOM_LONG = ("nccom-test", "-r", "64", "allr", "-b", "8", "-e", "1G", "-f", "2")


def test_progress_bar_on_a_terminal():
    out, tty = _on_a_terminal(*NCCOM_LONG)
    text = tty.decode()
    assert re.search(r"\r   \[#{30}\] 28/28 all_reduce sizes", text), text
    assert text.endswith("\r"), text  # wiped at the end, the terminal left clean
    assert "\r" not in out and table(out)[1][-1][0] == str(1 << 30)  # stdout: the table only
    gemm_out, gemm_tty = _on_a_terminal("gemm", "--m", "256", "--k", "256", "--n", "256", "--run")
    assert b"emulating the 256x256x256 GEMM" in gemm_tty and b"\r" not in gemm_out.encode()


def test_no_progress_when_piped_or_non_interactive():
    r = run_cli(*NCCOM_LONG)
    assert r.returncode == 0 and r.stderr == ""  # nothing but the table when piped
    g = run_cli("gemm", "--m", "256", "--k", "256", "--n", "256", "--run")
    assert g.returncode == 0 and g.stderr == ""
    _, tty = _on_a_terminal(*NCCOM_LONG, "--non-interactive")
    assert tty == b""


def test_json_with_check_keeps_stdout_one_object():
    r = run_cli(
        "nccom-test", "-r", "16", "allr", "-b", "4k", "-e", "4k", "-d", "fp32", "-c", "--json"
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["sizes"] == [4096]
    assert "check all_reduce size 4096: 4 chips x 1024 fp32 elements (random, seed " in r.stderr
    assert "): every output as expected" in r.stderr


def test_the_tools_fp8_names_are_neurons_fp8_e4m3():
    base = table(run_cli("nccom-test", "-r", "16", "allg", "-d", "fp8_e4m3").stdout)[1]
    for name in ("fp8", "fp8e4"):
        r = run_cli("nccom-test", "-r", "16", "allg", "-d", name)
        assert r.returncode == 0, r.stderr
        assert table(r.stdout)[1] == base and base[0][2] == "fp8_e4m3"
    bad = run_cli("nccom-test", "-r", "16", "allg", "-d", "fp64")
    assert bad.returncode == 2 and "argument -d/--datatype: invalid choice: 'fp64'" in bad.stderr
