"""Contract section 6: every result and report has ``to_dict()`` (JSON-serialisable), a short
``repr`` (no array values) and a Jupyter table (``_repr_html_``)."""

from __future__ import annotations

import dataclasses
import html.parser
import itertools
import json
import sys

import ml_dtypes
import numpy as np
import pytest
import trn2core
import trn2core.nki as tn
from trn2core.distributed import DistributedReport, DistributedResult


class _Table(html.parser.HTMLParser):
    """Parses a ``_repr_html_`` table: its caption and ``(th, td)`` rows; fails on tags that
    do not nest."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.caption = ""
        self.rows: list[list[str]] = []
        self.tables = 0

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)
        if tag == "table":
            self.tables += 1
        if tag == "tr":
            self.rows.append([])
        if tag in ("th", "td"):
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "caption":
            self.caption += data
        elif self.stack and self.stack[-1] in ("th", "td"):
            self.rows[-1][-1] += data


def _table(obj) -> _Table:
    text = obj._repr_html_()
    t = _Table()
    t.feed(text)
    t.close()
    assert t.tables == 1 and not t.stack and t.rows
    assert all(len(r) == 2 for r in t.rows), t.rows
    return t


@pytest.fixture(scope="module")
def things(copy_kernel):
    """One of each result and report a public function returns."""
    a = np.random.default_rng(0).normal(size=(200, 300)).astype(np.float32)
    b = np.random.default_rng(1).normal(size=(300, 100)).astype(np.float32)
    gemm = trn2core.gemm(a, b, dtype="bf16", out_dtype="bf16")
    inst = trn2core.Instance("trn2.48xlarge")
    bufs = [np.full(1024, i, np.float32) for i in range(16)]
    coll = inst.all_reduce(bufs)
    core = trn2core.NeuronCore()
    x = core.hbm_tensor(np.ones((128, 64), np.float32))
    t = core.tile((128, 64), "fp32")
    core.dma.copy(t, x)
    core.scalar.activation(t, t, "exp")
    kernel = core.run()
    run = tn.run(copy_kernel, np.ones((128, 64), np.float32))
    dist_rep = DistributedReport.from_fields(
        {**coll.report.to_dict(), "processes": 2, "exchanged_bytes": 4096, "rounds": 3}
    )
    return {
        "GemmResult": gemm,
        "Report": gemm.report,
        # 262,144 instructions: traced by accumulation group ("matmul block").
        "estimate": trn2core.estimate_gemm(16384, 8192, 16384, dtype="fp8_e4m3"),
        "DmaReport": trn2core.dma.dma_copy(np.ones((128, 256), np.float32)),
        "CollectiveResult": coll,
        "CollectiveReport": coll.report,
        "estimate_collective": inst.estimate("all_gather", 1 << 20),
        "DistributedReport": dist_rep,
        "DistributedResult": DistributedResult(
            coll.outputs[:2], dist_rep, ranks=(0, 1), chips=(0, 1)
        ),
        "KernelReport": kernel,
        "RunResult": run,
        "NkiReport": run.report,
        "FormatInfo": trn2core.format_info("fp8_e4m3"),
        "SparseTensor": trn2core.compress(
            trn2core.prune(np.arange(64, dtype=np.float32).reshape(4, 16), "2:4"), "2:4"
        ),
        "Compressed": trn2core.dma.compress(np.zeros(4096, np.float32)),
    }


NAMES = [
    "GemmResult",
    "Report",
    "estimate",
    "DmaReport",
    "CollectiveResult",
    "CollectiveReport",
    "estimate_collective",
    "DistributedReport",
    "DistributedResult",
    "KernelReport",
    "RunResult",
    "NkiReport",
    "FormatInfo",
    "SparseTensor",
    "Compressed",
]


@pytest.mark.parametrize("name", NAMES)
def test_to_dict_is_json_and_round_trips_the_key_figures(things, name):
    obj = things[name]
    d = obj.to_dict()
    text = json.dumps(d)  # plain data only: no numpy scalars, dtypes, arrays or proxies
    assert json.loads(text) == json.loads(json.dumps(json.loads(text)))
    if hasattr(obj, "seconds"):
        assert d["seconds"] == obj.seconds > 0
    if hasattr(obj, "report"):
        assert d["report"] == obj.report.to_dict()


def test_arrays_are_summarised_by_shape_and_dtype(things):
    g = things["GemmResult"]
    assert g.to_dict()["out"] == {"shape": [200, 100], "dtype": "bfloat16"}
    c = things["CollectiveResult"]
    assert c.to_dict()["outputs"] == [{"shape": [1024], "dtype": "float32"}] * 16
    assert things["FormatInfo"].to_dict()["dtype"] == "float8_e4m3"
    assert things["FormatInfo"].to_dict()["max"] == 240.0
    sp = things["SparseTensor"].to_dict()
    assert sp["values"] == {"shape": [4, 8], "dtype": "float32"} and sp["density"] == 0.5
    assert sp["pattern"] == "2:4" and sp["shape"] == [4, 16]
    c = things["Compressed"].to_dict()
    assert c["codec"] == "zvc" and c["raw_nbytes"] == 4096 * 4 and c["ratio"] > 1


@pytest.mark.parametrize("name", NAMES)
def test_repr_is_short_and_never_prints_array_values(things, name):
    r = repr(things[name])
    assert len(r) < 300, r
    assert "array(" not in r and "\n" not in r, r


def test_result_reprs_name_shape_dtype_and_timing(things):
    r = repr(things["GemmResult"])
    assert r.startswith("GemmResult(out=<bfloat16[200, 100]>, report=Report('gemm', seconds=")
    r = repr(things["CollectiveResult"])
    assert r.startswith("CollectiveResult(outputs=[16 x <float32[1024]>], report=Collective")
    r = repr(things["RunResult"])
    assert r.startswith("RunResult(outputs=<float32[128, 64]>, report=NkiReport(seconds=")
    r = repr(things["DistributedResult"])
    assert "ranks=(0, 1), chips=(0, 1)" in r


@pytest.mark.parametrize("name", NAMES)
def test_jupyter_table_parses_and_holds_the_key_figures(things, name):
    obj = things[name]
    t = _table(obj)
    labels = [r[0] for r in t.rows]
    cells = " | ".join(r[1] for r in t.rows)
    assert type(obj).__name__ in t.caption
    report = getattr(obj, "report", obj)
    if isinstance(report, trn2core.Report):
        assert "time" in labels and "TFLOPS (wall)" in labels and "bound" in labels
        assert f"{report.tflops:.2f}" in cells and report.bound in cells
    if isinstance(report, trn2core.CollectiveReport):
        assert {"algorithm", "time", "algbw", "busbw"} <= set(labels)
        assert f"{report.busbw / 1e9:.2f} GB/s" in cells and report.algorithm in cells
    if isinstance(report, (trn2core.KernelReport, tn.NkiReport)):
        assert {"time", "instructions", "DMA bytes", "critical path"} <= set(labels)
        assert f"{report.dma_bytes:,}" in cells
    if name == "GemmResult":
        assert t.rows[0] == ["out", "<bfloat16[200, 100]>"]
    if name == "DmaReport":
        assert f"{obj.bandwidth / 1e9:.1f} GB/s achieved" in cells
    if name == "DistributedReport":
        assert "2 processes" in cells
    if name == "FormatInfo":
        assert ["max", "240.0"] in t.rows and ["dtype", "float8_e4m3"] in t.rows


def test_html_escapes_what_it_shows():
    rep = trn2core.estimate_gemm(128, 128, 128)
    odd = dataclasses.replace(rep, description="<b>&</b>")
    text = odd._repr_html_()
    assert "<b>" not in text and "&lt;b&gt;&amp;&lt;/b&gt;" in text
    assert ["what", "<b>&</b>"] in _table(odd).rows


def test_every_public_result_class_has_the_three():
    classes = [
        trn2core.GemmResult,
        trn2core.Report,
        trn2core.dma.DmaReport,
        trn2core.CollectiveResult,
        trn2core.CollectiveReport,
        trn2core.DistributedResult,
        trn2core.DistributedReport,
        trn2core.KernelReport,
        tn.RunResult,
        tn.NkiReport,
        trn2core.FormatInfo,
        trn2core.SparseTensor,
        trn2core.dma.Compressed,
    ]
    for cls in classes:
        assert callable(getattr(cls, "to_dict", None)), cls
        assert callable(getattr(cls, "_repr_html_", None)), cls
        assert "__repr__" in {k for c in cls.__mro__[:-1] for k in vars(c)}, cls


def test_bf16_result_dict_names_the_ml_dtypes_dtype():
    g = trn2core.gemm(np.ones((2, 2)), np.ones((2, 2)), out_dtype=ml_dtypes.bfloat16)
    assert g.to_dict()["out"]["dtype"] == "bfloat16"


# --- Traces: args on every slice, bandwidth counters, dependency flows ----------------------


def _events(rep) -> list[dict]:
    return json.loads(rep.trace_json())["traceEvents"]


def _counter(events, name: str) -> list[tuple[float, float]]:
    """``(ts_us, GB/s)`` of counter ``name``, in time order."""
    pts = [(e["ts"], e["args"]["GB/s"]) for e in events if e["ph"] == "C" and e["name"] == name]
    assert pts == sorted(pts, key=lambda p: p[0]), name
    return pts


def _integral_bytes(points: list[tuple[float, float]]) -> float:
    """Bytes under a piecewise-constant GB/s counter (ts in microseconds)."""
    return sum(v * 1e9 * (t1 - t0) * 1e-6 for (t0, v), (t1, _) in itertools.pairwise(points))


def _check_flows(events) -> list[tuple[dict, dict]]:
    """Every flow start has exactly one end with its id, later or at the same time; each end
    lands where a slice on its track starts, each start inside a slice on its track."""
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == sum(e["ph"] == "s" for e in events)
    assert len(ends) == sum(e["ph"] == "f" for e in events)
    assert starts.keys() == ends.keys()
    slices = [e for e in events if e["ph"] == "X"]
    pairs = []
    for i, s in starts.items():
        f = ends[i]
        assert f["ts"] >= s["ts"] and f.get("bp") == "e" and f["cat"] == s["cat"]
        assert any(
            x["tid"] == s["tid"]
            and x["pid"] == s["pid"]
            and x["ts"] <= s["ts"] <= x["ts"] + x["dur"]
            for x in slices
        )
        assert any(
            x["tid"] == f["tid"] and x["pid"] == f["pid"] and x["ts"] == f["ts"] for x in slices
        )
        pairs.append((s, f))
    return pairs


@pytest.mark.parametrize(
    "name",
    [
        "Report",
        "estimate",
        "DmaReport",
        "CollectiveReport",
        "estimate_collective",
        "KernelReport",
        "NkiReport",
    ],
)
def test_every_slice_carries_args(things, name):
    events = _events(things[name])
    slices = [e for e in events if e["ph"] == "X"]
    assert slices
    for e in slices:
        assert isinstance(e.get("args"), dict) and e["args"], e
        assert all(isinstance(v, (int, float, str)) for v in e["args"].values()), e


def test_gemm_trace_names_bank_tile_instruction_and_hbm_bandwidth(things):
    rep = things["Report"]  # 200 x 300 x 100: traced instruction by instruction
    events = _events(rep)
    mm = [e["args"] for e in events if e["ph"] == "X" and e["name"] == "matmul"]
    assert [a["instruction"] for a in mm] == list(range(rep.instructions))
    assert {(a["m_tile"], a["k_tile"]) for a in mm} == {(m, k) for m in (0, 1) for k in (0, 1, 2)}
    assert all(0 <= a["bank"] < 8 and a["cols"] == 100 for a in mm)
    assert sorted({a["rows"] for a in mm}) == [72, 128]
    ev = [e["args"] for e in events if e["ph"] == "X" and e["name"] == "psum_to_sbuf"]
    assert len(ev) == 2 and all(a["bytes"] == a["rows"] * a["cols"] * 4 for a in ev)
    hbm = _counter(events, "HBM bandwidth")
    assert hbm and hbm[-1][1] == 0 and max(v for _, v in hbm) > 0
    assert max(v for _, v in hbm) <= trn2core.spec.hbm_chip_bytes_per_s / 1e9
    # The counter carries exactly the HBM bytes of the DMA spans: the first a and b tiles,
    # which the model moves ahead of the streams, and the operand and result streams, which
    # carry the rest; together, each byte of the report's hbm_bytes once (the streams used to
    # carry the first tiles again).
    dma = [e for e in events if e["ph"] == "X" and "hbm_bytes" in e["args"]]
    spans = sum(e["args"]["hbm_bytes"] for e in dma)
    # Timestamps are written to 1 ps: on spans of about a microsecond that is 1e-6 relative.
    assert _integral_bytes(hbm) == pytest.approx(spans, rel=1e-6)
    assert spans == rep.details["hbm_bytes"]
    first = sum(e["args"]["hbm_bytes"] for e in dma if e["name"].startswith("first"))
    assert first == 128 * 128 * 2 + 128 * 100 * 2


def test_estimate_trace_blocks_have_banks_and_tiles(things):
    events = _events(things["estimate"])
    blocks = [e["args"] for e in events if e["ph"] == "X" and e["name"] == "matmul block"]
    assert blocks and all(a["n_tiles"] <= 8 and 0 <= a["first_bank"] < 8 for a in blocks)
    assert blocks[0]["instructions"] == blocks[0]["n_tiles"] * blocks[0]["k_tiles"]
    assert _counter(events, "HBM bandwidth")


def test_dma_trace_counts_its_bytes(things):
    rep = things["DmaReport"]
    events = _events(rep)
    moved = [e["args"] for e in events if e["ph"] == "X" and e["name"] != "descriptor/semaphore"]
    assert sum(a["bytes"] for a in moved) == pytest.approx(rep.bytes)
    assert _integral_bytes(_counter(events, "HBM bandwidth")) == pytest.approx(rep.wire_bytes)


def test_collective_trace_has_link_counters_and_phase_flows(things):
    rep = things["CollectiveReport"]
    events = _events(rep)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    links = {t for t in tracks.values() if t != "collective"}
    assert links and links <= set(rep.link_bytes)
    for link in links:
        pts = _counter(events, f"link {link} bandwidth")
        assert pts[-1][1] == 0
        assert _integral_bytes(pts) == pytest.approx(rep.link_bytes[link], rel=1e-6)
    slices = [e for e in events if e["ph"] == "X"]
    assert all("bytes" in e["args"] for e in slices if tracks[e["tid"]] != "collective")
    phases = [e for e in slices if tracks[e["tid"]] == "collective"]
    pairs = _check_flows(events)
    assert len(pairs) == len(phases) - 1 and len(phases) >= 2


def test_machine_trace_flows_follow_dependencies_and_the_critical_path(things):
    rep = things["KernelReport"]
    events = _events(rep)
    slices = {e["args"]["index"]: e for e in events if e["ph"] == "X"}
    deps = {
        i: e["args"]["on"] for i, e in slices.items() if e["args"]["waited_for"] == "dependency"
    }
    pairs = _check_flows(events)
    assert {f["id"]: s["tid"] for s, f in pairs} == {i: slices[j]["tid"] for i, j in deps.items()}
    path = [s["index"] for s in rep.critical_path]
    assert [i for i, e in slices.items() if e["args"]["critical_path"]] == sorted(path)
    crit = sorted(f["id"] for s, f in pairs if s["cat"] == "critical_path")
    assert crit == [b for a, b in itertools.pairwise(path) if deps.get(b) == a] and crit
    dma = slices[0]["args"]
    assert dma["bytes"] == 128 * 64 * 4 and dma["partitions"] == 128
    assert _integral_bytes(_counter(events, "DMA bandwidth")) == pytest.approx(rep.dma_bytes)
    assert _integral_bytes(_counter(events, "HBM bandwidth")) == pytest.approx(rep.dma_bytes)


def test_matmul_slices_name_their_psum_bank_and_pe_tile():
    core = trn2core.NeuronCore()
    s = core.tile((128, 64), "bf16")
    m = core.tile((128, 256), "bf16")
    out = core.tile((64, 256), "fp32", space="psum")
    core.gpsimd.memset(s, 1.0)
    core.gpsimd.memset(m, 2.0)
    core.pe.matmul(out, s, m)
    events = _events(core.run())
    (mm,) = [e["args"] for e in events if e["ph"] == "X" and e["name"] == "nc_matmul"]
    assert mm["bank"] == 0 and mm["tile_rows"] == 128 and mm["bytes"] == 64 * 256 * 4


def test_merged_traces_keep_flow_ids_unique(tmp_path, things):
    rep = things["KernelReport"]
    path = trn2core.report.save_traces(tmp_path / "two.json", [("a", rep), ("b", rep)])
    events = json.load(open(path))["traceEvents"]
    pairs = _check_flows(events)
    assert len(pairs) == 2 * len(_check_flows(_events(rep)))


# --- Perfetto protobuf (the optional `perfetto` extra; `make test` installs it) -------------


@pytest.mark.parametrize("name", ["Report", "CollectiveReport", "KernelReport"])
def test_pftrace_holds_the_same_slices_counters_and_flows(tmp_path, things, name):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    rep = things[name]
    events = _events(rep)
    path = rep.save_trace(tmp_path / "t.pftrace")
    trace = pb.Trace.FromString(open(path, "rb").read())
    tev = [p.track_event for p in trace.packet if p.HasField("track_event")]
    T = pb.TrackEvent
    begins = [e for e in tev if e.type in (T.TYPE_SLICE_BEGIN, T.TYPE_INSTANT)]
    slices = [e for e in events if e["ph"] == "X"]
    assert sorted(e.name for e in begins) == sorted(e["name"] for e in slices)
    ends = [e for e in tev if e.type == T.TYPE_SLICE_END]
    assert len(ends) == sum(e.type == T.TYPE_SLICE_BEGIN for e in begins)
    # Every slice keeps its arguments, typed.
    assert all(len(e.debug_annotations) > 0 for e in begins)
    want = sorted(sorted(e["args"].items()) for e in slices)
    got = []
    for e in begins:
        got.append(sorted((a.name, getattr(a, a.WhichOneof("value"))) for a in e.debug_annotations))
    assert sorted(got) == want
    # Counters: one counter track per JSON counter name, the same values.
    tracks = [p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")]
    names = {d.uuid: d.name for d in tracks if d.HasField("counter")}
    assert set(names.values()) == {f"{e['name']} (GB/s)" for e in events if e["ph"] == "C"}
    values = sorted(e.double_counter_value for e in tev if e.type == T.TYPE_COUNTER)
    assert values == sorted(e["args"]["GB/s"] for e in events if e["ph"] == "C")
    # Flows: each id starts on one slice and ends on another.
    out = [i for e in begins for i in e.flow_ids]
    into = [i for e in begins for i in e.terminating_flow_ids]
    assert sorted(out) == sorted(into) == sorted(e["id"] for e in events if e["ph"] == "s")
    # Packets are in time order.
    ts = [p.timestamp for p in trace.packet if p.HasField("track_event")]
    assert ts == sorted(ts)


def test_pftrace_of_merged_reports(tmp_path, things):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    rep = things["KernelReport"]
    path = trn2core.report.save_traces(tmp_path / "two.pftrace", [("a", rep), ("b", rep)])
    trace = pb.Trace.FromString(open(path, "rb").read())
    tracks = [p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")]
    procs = [d.process for d in tracks if d.HasField("process")]
    assert sorted(p.process_name for p in procs) == ["a", "b"]
    ids = [i for p in trace.packet for i in p.track_event.flow_ids]
    assert len(ids) == len(set(ids)) == 2 * sum(e["ph"] == "s" for e in _events(rep))


def test_pftrace_without_the_perfetto_package_is_a_clear_error(tmp_path, monkeypatch, things):
    monkeypatch.setitem(sys.modules, "perfetto", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "perfetto.trace_builder.proto_builder", None)
    with pytest.raises(trn2core.Trn2ValueError, match=r"trn2core\[perfetto\]"):
        things["Report"].save_trace(tmp_path / "t.pftrace")
    assert not (tmp_path / "t.pftrace").exists()
    assert things["Report"].save_trace(tmp_path / "t.json").endswith("t.json")  # JSON still


def test_the_core_returns_cost_reports_as_frozen_classes_the_facade_reads_whole():
    # rust/trn2core-py/src/perf.rs: a field the binding adds and the facade does not name
    # would be left out of the facade's reports.
    import types

    from trn2core import _core
    from trn2core import report as rep_mod

    kinds = (types.GetSetDescriptorType, types.MemberDescriptorType)
    for cls, names in rep_mod.CORE_FIELDS.items():
        assert {n for n, v in vars(cls).items() if isinstance(v, kinds)} == set(names)
    core, _ = _core.estimate_gemm(128, 128, 512, "fp32", "none", True, False)
    assert type(core) is _core.Report and type(core.uncertainty) is _core.Uncertainty
    for obj in (core, core.uncertainty):
        with pytest.raises(AttributeError):
            obj.seconds = 0.0
    fields = rep_mod.core_fields(core)
    assert list(fields) == list(rep_mod.CORE_FIELDS[_core.Report])
    assert fields["details"] == dict(core.details) and fields["uncertainty"] == core.uncertainty
    assert (
        trn2core.Report.from_fields(core).to_dict()
        == trn2core.estimate_gemm(128, 128, 512, dtype="fp32").to_dict()
    )
