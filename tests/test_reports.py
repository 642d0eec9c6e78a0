"""Contract section 6: every result and report has ``to_dict()`` (JSON-serialisable), a short
``repr`` (no array values) and a Jupyter table (``_repr_html_``)."""

from __future__ import annotations

import dataclasses
import html.parser
import json

import ml_dtypes
import numpy as np
import pytest
import trn2core
import trn2core.nki as tn
from trn2core.distributed import DistributedReport, DistributedResult

nl, nisa = tn.language, tn.isa


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


def _kernel(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.fixture(scope="module")
def things():
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
    run = tn.run(_kernel, np.ones((128, 64), np.float32))
    dist_rep = DistributedReport.from_fields(
        {**coll.report.to_dict(), "processes": 2, "exchanged_bytes": 4096, "rounds": 3}
    )
    return {
        "GemmResult": gemm,
        "Report": gemm.report,
        "estimate": trn2core.estimate_gemm(4096, 4096, 4096, dtype="fp8_e4m3"),
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
    }


NAMES = [
    "GemmResult", "Report", "estimate", "DmaReport", "CollectiveResult", "CollectiveReport",
    "estimate_collective", "DistributedReport", "DistributedResult", "KernelReport",
    "RunResult", "NkiReport", "FormatInfo",
]  # fmt: skip


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
        trn2core.GemmResult, trn2core.Report, trn2core.dma.DmaReport, trn2core.CollectiveResult,
        trn2core.CollectiveReport, trn2core.DistributedResult, trn2core.DistributedReport,
        trn2core.KernelReport, tn.RunResult, tn.NkiReport, trn2core.FormatInfo,
    ]  # fmt: skip
    for cls in classes:
        assert callable(getattr(cls, "to_dict", None)), cls
        assert callable(getattr(cls, "_repr_html_", None)), cls
        assert "__repr__" in {k for c in cls.__mro__[:-1] for k in vars(c)}, cls


def test_bf16_result_dict_names_the_ml_dtypes_dtype():
    g = trn2core.gemm(np.ones((2, 2)), np.ones((2, 2)), out_dtype=ml_dtypes.bfloat16)
    assert g.to_dict()["out"]["dtype"] == "bfloat16"

