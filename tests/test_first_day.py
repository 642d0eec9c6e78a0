"""Issue 29, the first day: one LNC default, the GEMM command's shapes, errors and exit
statuses, optional dependencies checked before the work, long runs that say how long."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
import trn2core
from trn2core import cli
from trn2core._progress import Progress

# ---------------------------------------------------------------------------- one LNC default


def test_the_lnc_default_is_trn2s_and_the_environment_changes_it_everywhere(monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert trn2core.chip.default_lnc() == 2 == trn2core.spec.lnc_default
    assert trn2core.Chip().lnc == 2 and trn2core.Instance().lnc == 2
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert trn2core.Chip().lnc == 1 and len(trn2core.Chip().cores) == 8
    assert trn2core.Instance().lnc == 1 and trn2core.UltraServer().lnc == 1
    assert trn2core.Chip(lnc=2).lnc == 2  # an explicit value wins
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "3")
    with pytest.raises(trn2core.Trn2ValueError, match="NEURON_LOGICAL_NC_CONFIG: got '3'"):
        trn2core.Chip()


def test_estimate_gemm_and_gemm_take_lnc():
    lc = trn2core.Chip(lnc=2).cores[0]
    two = trn2core.estimate_gemm(4096, 4096, 4096, lnc=2)
    assert two.seconds == trn2core.estimate_gemm(4096, 4096, 4096, core=lc).seconds
    one = trn2core.estimate_gemm(4096, 4096, 4096, lnc=1)
    assert one.seconds == trn2core.estimate_gemm(4096, 4096, 4096).seconds  # a physical core
    assert two.seconds < 0.51 * one.seconds  # two physical cores share the work
    a = np.ones((256, 256), np.float32)
    r = trn2core.gemm(a, a, lnc=2)
    assert r.report.seconds == trn2core.gemm(a, a, core=lc).report.seconds
    assert float(r.out[0, 0]) == 256.0
    with pytest.raises(trn2core.Trn2ValueError, match="lnc: give core= or lnc=, not both"):
        trn2core.estimate_gemm(128, 128, 128, lnc=2, core=lc)
    with pytest.raises(trn2core.Trn2ValueError, match="lnc: got 3"):
        trn2core.estimate_gemm(128, 128, 128, lnc=3)


def test_the_gemm_command_answers_for_the_default_logical_core(run_cli, monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    rc, out, _ = run_cli("gemm", "2048x2048x2048", "--json")
    d = json.loads(out)
    assert rc == 0 and (d["lnc"], d["core"]) == (2, "one logical NeuronCore (LNC=2)")
    want = trn2core.estimate_gemm(2048, 2048, 2048, lnc=2).seconds
    assert d["report"]["seconds"] == want
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    d = json.loads(run_cli("gemm", "2048x2048x2048", "--json")[1])
    assert (d["lnc"], d["core"]) == (1, "one NeuronCore")
    assert d["report"]["seconds"] == trn2core.estimate_gemm(2048, 2048, 2048).seconds


# ---------------------------------------------------------------------- the gemm command


def test_gemm_takes_its_shape_three_ways(run_cli):
    outs = [
        json.loads(run_cli("gemm", *args, "--json")[1])["report"]["seconds"]
        for args in (
            ["512x1024x256"],
            ["-m", "512", "-k", "1024", "-n", "256"],
            ["--m", "512", "--k", "1024", "--n", "256"],
        )
    ]
    assert outs[0] == outs[1] == outs[2] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--m", "0", "--k", "4", "--n", "4"], "argument -m/--m: M must be at least 1, got 0"),
        (["-m", "4", "-k", "-3", "-n", "4"], "argument -k/--k: K must be at least 1, got -3"),
        (["4x4x0"], "argument MxKxN: N must be at least 1, got 0"),
        (["4x4"], "expected MxKxN such as 4096x4096x4096"),
        (["-m", "4", "-k", "4"], "the GEMM's shape is missing -n"),
        (["4x4x4", "-m", "4"], "give the shape as MxKxN or as -m M -k K -n N, not both"),
        (["4x4x4", "--out", "x.npy"], "--out saves the computed bits: add --run"),
    ],
)
def test_gemm_usage_errors_name_the_flag_in_plain_words(run_cli, argv, message):
    rc, out, err = run_cli("gemm", *argv)
    assert rc == 2 and message in err, err
    assert err.startswith("usage: trn2core gemm") and "1..=" not in err and "Traceback" not in err


def test_an_unknown_flag_gets_the_subcommands_usage(run_cli):
    rc, _, err = run_cli("ls", "--frobnicate")
    assert rc == 2 and err.startswith("usage: trn2core ls")
    assert "trn2core ls: error: unrecognized arguments: --frobnicate" in err


def test_usage_errors_exit_2_and_refusals_1(run_cli):
    assert run_cli("gemm", "--m", "0", "--k", "1", "--n", "1")[0] == 2
    rc, _, err = run_cli("gemm", "300000x300000x128", "--run")
    assert rc == 1 and "CapacityError" in err  # well-formed, refused by the model
    assert cli.exit_status(trn2core.CapacityError("x")) == 1
    assert cli.exit_status(trn2core.Trn2ValueError("x")) == 2


def test_gemm_run_prints_the_model_first_and_saves_the_bits(run_cli, tmp_path):
    path = tmp_path / "c.npy"
    rc, out, _ = run_cli("gemm", "128x256x64", "--run", "--out", str(path), "--lnc", "1")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("what") and "emulated bit-exactly" in out
    assert lines.index(next(x for x in lines if x.startswith("emulated"))) > 5
    c = np.load(path)
    rng = np.random.default_rng(0)
    a = trn2core.quantize(rng.standard_normal((128, 256), dtype=np.float32), "bf16")
    b = trn2core.quantize(rng.standard_normal((256, 64), dtype=np.float32), "bf16")
    assert c.dtype == np.float32 and np.array_equal(c, trn2core.gemm(a, b).out)


def test_optional_dependencies_are_checked_before_the_work(run_cli, monkeypatch, tmp_path):
    for mod in ("matplotlib", "matplotlib.pyplot"):  # as if not installed, even if imported
        monkeypatch.setitem(sys.modules, mod, None)
    rc, out, err = run_cli("gemm", "64x64x64", "--run", "--plot", str(tmp_path / "r.png"))
    assert rc == 2 and "pip install 'trn2core[plot]'" in err
    assert out == ""  # nothing printed, nothing emulated
    for mod in (
        "perfetto",
        "perfetto.protos",
        "perfetto.protos.perfetto.trace",
        "perfetto.trace_builder",
        "perfetto.trace_builder.proto_builder",
    ):
        monkeypatch.setitem(sys.modules, mod, None)
    rc, out, err = run_cli("gemm", "64x64x64", "--run", "--trace", str(tmp_path / "t.pftrace"))
    assert rc == 2 and "trn2core[perfetto]" in err and out == ""


# --------------------------------------------------------------------------- progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_elapsed_time_and_rate():
    s = _Tty()
    with Progress("sizes", 4, stream=s, unit="size") as bar:
        bar.step(2)
    text = s.getvalue()
    assert "2/4 sizes" in text and " s, " in text and "size/s" in text
    assert text.endswith("\r")  # wiped
    quiet = io.StringIO()  # not a terminal: nothing
    with Progress("sizes", 4, stream=quiet) as bar:
        bar.step()
    assert quiet.getvalue() == ""


def test_spec_finds_constants_by_part_of_their_name(run_cli):
    rc, out, _ = run_cli("spec", "hbm")
    names = [x.split(" = ")[0] for x in out.splitlines() if " = " in x and not x.startswith(" ")]
    assert rc == 0 and "hbm_chip_bytes" in names and "hbm_stacks_per_chip" in names
    assert all("hbm" in n for n in names) and len(names) == 15
    rc, out, _ = run_cli("spec", "hbm_chip_bytes")  # an exact name: that one alone
    heads = [x for x in out.splitlines() if " = " in x and not x.startswith(" ")]
    assert heads == [out.splitlines()[0]] and out.startswith("hbm_chip_bytes = 96 GiB")


# ------------------------------------------------------------------- traces that open


def _nki_report():
    a = np.ones((128, 512), np.float32)
    return trn2core.gemm(a[:, :128].T.copy(), a, dtype="bf16").report


def test_the_json_trace_is_chrome_trace_event_format(tmp_path):
    """The structure of Chrome's Trace Event Format (the JSON Object Format): a traceEvents
    list; every event a phase letter of the format, a name, integer pid/tid; timed events a
    numeric ts, complete events (X) a dur >= 0, counters (C) numeric args."""
    path = tmp_path / "t.json"
    _nki_report().save_trace(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert isinstance(events, list) and len(events) > 3
    phases = set("BEXIiCbnesTtSFfPpONDMVvRc")
    for ev in events:
        assert ev["ph"] in phases and isinstance(ev["name"], str), ev
        assert isinstance(ev["pid"], int), ev
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], (int, float)) and isinstance(ev.get("tid", 0), int), ev
        if ev["ph"] == "X":
            assert ev["dur"] >= 0, ev
        if ev["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in ev["args"].values()), ev
    assert {ev["ph"] for ev in events} >= {"M", "X"}


def test_the_pftrace_parses_as_a_perfetto_trace(tmp_path):
    """Parsed with the perfetto package's own protobuf classes (its TraceProcessor needs a
    binary downloaded at run time, which a test may not do)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb  # a dev dependency

    path = tmp_path / "t.pftrace"
    _nki_report().save_trace(str(path))
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    names = {p.track_descriptor.name for p in trace.packet if p.HasField("track_descriptor")}
    slices = [p for p in trace.packet if p.HasField("track_event")]
    assert len(slices) > 3 and any("PE" in n or "tensor" in n.lower() for n in names), names
