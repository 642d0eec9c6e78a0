"""Attack surface: reports (str, to_dict, traces) of odd and huge runs, and the paths a trace
is saved to."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trn2core as t
from trn2core import Trn2ValueError

from ._probe import check_outcomes, probe

SETUP = """
import json, os, tempfile
g = t.gemm(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)).report
big = t.UltraCluster(64).estimate('all_reduce', 1 << 30)
d = tempfile.mkdtemp()
"""

CALLS = {
    "gemm report round trips": "json.loads(g.trace_json()); str(g); g.to_dict()",
    "huge collective report": (
        "json.loads(big.trace_json()); assert len(str(big)) < 10000; big.to_dict()"
    ),
    "trace of an empty collective": (
        "r = t.Instance().all_reduce([np.zeros(0, np.float32)] * 16).report\n"
        "json.loads(r.trace_json())"
    ),
    # The file system's own OSError, passed on as documented (limitations.md, "Errors").
    "save into a directory that is a file": (
        "open(os.path.join(d, 'f'), 'w').close()\n"
        "try:\n    g.save_trace(os.path.join(d, 'f', 'x.json'))\n"
        "except NotADirectoryError:\n    pass"
    ),
    "save to bytes path": ("g.save_trace(os.path.join(d, 'x.json').encode())", "Trn2ValueError"),
    "save to an int": ("g.save_trace(1)", "Trn2ValueError"),
    "save to a path with NUL": ("g.save_trace(os.path.join(d, 'a\\0b.json'))", "Trn2ValueError"),
    "estimate of a huge gemm reports": "str(t.estimate_gemm(10**6, 10**6, 10**6, core=t.Chip()))",
}


def test_reports_surface():
    check_outcomes(CALLS, setup=SETUP, timeout=120)


def test_a_path_with_a_nul_byte_is_a_trn2_error(tmp_path):
    rep = t.gemm(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)).report
    with pytest.raises(Trn2ValueError, match="NUL"):
        rep.save_trace(str(tmp_path / "a\0b.json"))


def test_saving_the_trace_of_a_million_instructions_needs_little_memory(tmp_path):
    # Its JSON is about 415 MB; saving it used to take 3.6 GB (the trace as one Rust string,
    # as one Python string, and parsed again "to check"). Written piece by piece now: the
    # process's peak grows by far less than the file's size.
    r = probe(
        f"""
        import json, os, resource
        import trn2core as t
        core = t.NeuronCore()
        a = core.tile((128, 8), "fp32"); core.vector.memset(a, 1.0)
        b = core.tile((128, 8), "fp32")
        for _ in range(1_000_000):
            core.vector.tensor_copy(b, a)
        rep = core.run()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        path = os.path.join({str(tmp_path)!r}, "trace.json")
        rep.save_trace(path)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({{"grew": after - before, "size": os.path.getsize(path)}}))
        """,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["size"] > 300 << 20, out
    assert out["grew"] < 100 << 20, out
    with open(tmp_path / "trace.json") as f:
        f.seek(out["size"] - 2)
        assert f.read() == "]}"
