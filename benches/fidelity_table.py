"""Every published Trainium2 measurement beside trn2core's prediction of it.

The measurements are data (``benches/fidelity/published.toml``: source, instance, LNC, what was
measured, and how sure we are that it was Trainium2); each is predicted here through
trn2core's public API only: ``nccom_rows`` (what ``trn2core nccom-test`` prints),
``NeuronCore.dma_copy``, ``estimate_gemm``, ``trn2core.workload`` and, for a published NKI
kernel, ``trn2core.nki.run`` of trn2core's own kernel of the same operation. Run it as a script::

    python benches/fidelity_table.py            # the points compared with the model, and a summary
    python benches/fidelity_table.py --all      # also the repeats, screenshot readings and curves

    python benches/fidelity_table.py --corpus ROOT  # also AWS's own kernels, run from ROOT
    python benches/fidelity_table.py --fit      # the calibrated constants, fitted on the points
    python benches/fidelity_table.py --loo      # each point predicted with the fit done without it

``factor = max(predicted / published, published / predicted)``: 1 is a perfect prediction,
2 means off by 2x either way. The summary gives the median and the worst factor over the
points marked ``use = "check"``, for the high-confidence points and for high and medium
together. tests/test_fidelity.py and benches/bench_fidelity.py import this module.

**AWS's own kernels.** A published kernel point may name the public kernel it measured
(``aws_kernel = "nki-library:module:function"``). With ``--corpus ROOT`` (a directory of
checkouts laid out as ``benches/nki_corpus.py`` takes them) that kernel is imported from ROOT,
never copied, and run through ``trn2core.nki.run`` at the published shape: a second prediction,
printed in its own table and kept out of the summary (which must not depend on what is checked
out next to the repository).

**Calibration.** The model's calibrated terms (``spec`` entries with status ``calibrated``)
are fitted here: the collective terms on the nccom-test points, the DMA terms on the DMA
points, by least squares on ``log(predicted / published)`` (medium-confidence points weigh
half). To refit without running the Rust model once per trial, each prediction is taken apart
into the parts the constants multiply (``Parts``): the model's reports give them (the phases of
a collective, a transfer's bytes per engine), and ``Parts.seconds(constants)`` puts them back
together with any constants, exactly as the Rust cost model does (``tests/test_fidelity.py``
checks that at the calibrated constants it equals the model's own prediction).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TABLE = Path(__file__).resolve().parent / "fidelity" / "published.toml"
CONFIDENCES = ("high", "medium", "low", "none")


@dataclasses.dataclass(frozen=True)
class Row:
    """One point: the published value, the model's, and how far apart they are."""

    point: dict
    published: float
    predicted: float | None
    unit: str
    algorithm: str | None = None

    @property
    def id(self) -> str:
        return self.point["id"]

    @property
    def ratio(self) -> float | None:
        """predicted / published."""
        if self.predicted is None:
            return None
        return self.predicted / self.published

    @property
    def factor(self) -> float | None:
        """max(p/q, q/p): how many times off, either way (None for a published bound, which
        the prediction should stay under: see ``within_bound``)."""
        r = self.ratio
        if r is None or self.point["kind"] == "bound":
            return None
        return max(r, 1.0 / r)

    @property
    def within_bound(self) -> bool | None:
        """For a published upper bound: whether the prediction is at most the bound."""
        if self.point["kind"] != "bound" or self.predicted is None:
            return None
        return self.predicted <= self.published


def load(path: Path = TABLE) -> tuple[dict, list[dict]]:
    """The sources and the points of the table."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return data["source"], data["point"]


def _np_dtype(name: str):
    import ml_dtypes

    return {
        "bf16": ml_dtypes.bfloat16,
        "fp16": np.float16,
        "fp32": np.float32,
        "uint8": np.uint8,
    }[name]


def _dma_seconds(shape, dtype: str, src: str, dst: str, quantity: str) -> float:
    import trn2core

    x = np.zeros(shape, dtype=_np_dtype(dtype))
    rep = trn2core.NeuronCore(0).dma_copy(x, src=src, dst=dst)
    return rep.details["engines_s"] if quantity == "engine" else rep.seconds


def _kernel_seconds(p: dict, tiles: int | None = None) -> float:
    """trn2core's own NKI kernel ``p["kernel"]`` (an example of ``trn2core.nki``: rmsnorm) on
    ``rows`` rows of ``hidden`` columns, the rows split evenly over the ``lnc`` physical cores
    (the published kernels shard the outer dimension): one core's time for its share. Its loop
    over 128-row tiles is uniform, so ``t`` tiles take ``T(n) + (t - n) (T(2n) - T(n)) / n``,
    from runs of ``n = min(t, 4)`` and ``2n`` tiles (how the workload model times its norms);
    ``tiles``: run that many tiles only."""
    import trn2core.nki as tn
    from trn2core.nki._examples import load

    fn = getattr(load(p["kernel"]), p["kernel"])
    g = np.ones(p["hidden"], dtype=_np_dtype(p["dtype"]))

    def run(t: int) -> float:
        x = np.ones((128 * t, p["hidden"]), dtype=_np_dtype(p["dtype"]))
        return tn.run(fn, x, g).report.seconds

    t = tiles or -(-p["rows"] // (128 * p["lnc"]))
    n = min(t, 4)
    short = run(n)
    return short if t == n else short + (t - n) * (run(2 * n) - short) / n


def predict(p: dict) -> Row:
    """The model's prediction of point ``p`` (``predicted`` is None where nothing in trn2core
    predicts it)."""
    import trn2core
    from trn2core.nccom import nccom_rows

    kind = p["kind"]
    if kind == "nccom":
        if p["use"] == "excluded":
            return Row(p, p["time_us"], None, "us")
        r = nccom_rows(p["operation"], p["ranks"], [p["size_bytes"]], p["dtype"], p["lnc"], "auto")
        return Row(p, p["time_us"], r[0]["seconds"] * 1e6, "us", r[0]["algorithm"])
    if kind == "dma":
        s = _dma_seconds(p["shape"], p["dtype"], p["src"], p["dst"], p["quantity"])
        return Row(p, p["time_us"], s * 1e6, "us")
    if kind == "dma_curve":
        s, ref = p["bytes_per_partition"], p["relative_to"]
        rate = s / _dma_seconds([128, s], "uint8", "hbm", "sbuf", "transfer")
        rate_ref = ref / _dma_seconds([128, ref], "uint8", "hbm", "sbuf", "transfer")
        return Row(p, p["relative_throughput"], rate / rate_ref, "x")
    if kind == "model":
        if p["use"] == "excluded":
            return Row(p, p["time_us"], None, "us")
        rep = _model_step(p)
        if p["quantity"] == "layer_collectives":
            return Row(p, p["time_us"], rep.parts["layer_collectives_s"] * 1e6, "us")
        return Row(p, p["time_us"], rep.seconds * 1e6, "us")
    if kind in ("gemm", "bound"):
        if p["use"] == "excluded":
            return Row(p, p["time_us"], None, "us")
        rep = trn2core.estimate_gemm(
            p["m"], p["k"], p["n"], dtype=p["dtype"], perf_mode=p.get("perf_mode", "none")
        )
        return Row(p, p["time_us"], rep.seconds * 1e6, "us")
    if kind == "kernel" and p["use"] != "excluded" and "kernel" in p:
        return Row(p, p["time_us"], _kernel_seconds(p) * 1e6, "us")
    return Row(p, p["time_us"], None, "us")


#: Where a repository's kernel modules are importable from, inside its checkout (a module
#: named by a path ending in ``.py`` is loaded from that file under the repository).
CORPUS_PATHS = {
    "nki-library": ("nki-library", "src", "nkilib_src"),
    "nki-samples-reference": ("nki-samples-reference",),
    "aws-neuron-sdk": ("aws-neuron-sdk",),
}
#: Row tiles (128 rows per core) run directly; longer runs are extrapolated from this many
#: and twice as many (the kernels' loops over row tiles are uniform).
AWS_TILES = 8


def _aws_inputs(mod, name: str, shape: tuple, dtype: str) -> tuple[tuple, dict]:
    """The arguments of the named public kernel: ``shape`` is (rows, hidden) of a norm (batch
    1) or (m, k, n, *blocking) of a matmul; values do not matter to the time."""
    import ml_dtypes

    dt = _np_dtype(dtype)
    if name == "rmsnorm_quant_kernel":  # nki-library's RMSNorm-Quant, its default arguments
        rows, hidden = shape
        x, g = np.ones((1, rows, hidden), dtype=dt), np.ones(hidden, dtype=dt)
        return (x, g), {"kargs": mod.RmsNormQuantKernelArgs()}
    if name.startswith("mamba_v"):  # the fused Mamba tutorial: (batch, seq_len, channels, state)
        b, s, c, n = shape
        r = np.random.default_rng(0)  # the scan's values stay finite
        f = lambda *sh: r.uniform(0.1, 0.5, sh).astype(dt)  # noqa: E731
        return (f(b, c, s), f(b, c, s), -f(c, n), f(b, n, s), f(b, n, s)), {}
    if name == "matrix_multiply_kernel":  # the kernel-optimization tutorial: lhsT [K, M], rhs
        m, k, n = shape  # [K, N]
        return (np.ones((k, m), dt), np.ones((k, n), dt)), {}
    if name == "quantized_double_row_matmul":  # nki-samples: lhs [M, K]; rhs fp8, two K-tile
        m, k, n, *blocks = shape  # rows side by side [K / 2, 2 N]; its scale [128, N]
        fp8 = np.zeros((k // 2, 2 * n), dtype=ml_dtypes.float8_e4m3)
        return (np.ones((m, k), dt), fp8, np.ones((128, n), dt), *blocks), {}
    raise ValueError(f"aws_kernel: no inputs known for {name}")


def _rst_block(path: str, index: int) -> str:
    """The ``index``-th ``.. code-block:: python`` of a documentation page, dedented."""
    import re
    import textwrap

    lines = Path(path).read_text().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)\.\. code-block:: python", lines[i])
        i += 1
        if not m:
            continue
        body = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(m.group(1))
        ):
            body.append(lines[i])
            i += 1
        blocks.append(textwrap.dedent("\n".join(body)))
    return blocks[index]


def _aws_module(top: str, module: str):
    if ".rst#" in module:  # a kernel printed in a documentation page: its code block, run
        page, index = module.split("#")
        name = "fidelity_aws_" + page.replace("/", "_").replace(".", "_").replace("-", "_") + index
        if name not in sys.modules:
            mod = type(sys)(name)
            src = _rst_block(os.path.join(top, page), int(index))
            code = compile(src, f"{page}#{index}", "exec")
            exec(code, mod.__dict__)  # noqa: S102 - AWS's published kernel, from the checkout
            sys.modules[name] = mod
        return sys.modules[name]
    if module.endswith(".py"):  # a file: imported under a name of its own
        name = "fidelity_aws_" + module.replace("/", "_").removesuffix(".py")
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, os.path.join(top, module))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sys.modules[name] = mod
        return sys.modules[name]
    if top not in sys.path:
        sys.path.insert(0, top)
    return importlib.import_module(module)


#: Wall seconds of each ``tn.run`` ``_aws_run`` made (the emulation alone: not the kernel's
#: import or its inputs; a cached point adds none), for ``aws_table``'s emulation column.
_RUN_WALL: list[float] = []


@functools.cache
def _aws_run(root: str, spec: str, shape: tuple, dtype: str, lnc: int) -> float:
    repo, module, name = spec.split(":")
    top = os.path.join(root, *CORPUS_PATHS[repo])
    import trn2core.nki as tn

    with tn.install(), contextlib.redirect_stdout(sys.stderr):  # the kernels' own logs
        mod = _aws_module(top, module)
        args, kwargs = _aws_inputs(mod, name, shape, dtype)
        t0 = time.perf_counter()
        rep = tn.run(getattr(mod, name), *args, grid=lnc if lnc > 1 else None, **kwargs)
        _RUN_WALL.append(time.perf_counter() - t0)
    return rep.report.seconds


def aws_kernel_seconds(p: dict, root: str) -> float | None:
    """The public kernel ``p["aws_kernel"]`` run on trn2core at the point's shape, imported
    from the checkouts under ``root``; None when its repository is not there. Rows beyond
    ``AWS_TILES`` row tiles per core are extrapolated from ``AWS_TILES`` and twice as many."""
    repo = p["aws_kernel"].split(":")[0]
    if not os.path.isdir(os.path.join(root, *CORPUS_PATHS[repo])):
        return None
    lnc = p.get("lnc", 1)
    key = (os.path.abspath(root), p["aws_kernel"])
    if "aws_shape" in p:  # the kernel's own shape arguments, as published
        return _aws_run(*key, tuple(p["aws_shape"]), p.get("dtype", "fp32"), lnc)
    if "m" in p:  # a matmul: as published
        shape = (p["m"], p["k"], p["n"], *p.get("blocking", ()))
        return _aws_run(*key, shape, p.get("lhs_dtype", p["dtype"]), lnc)
    per = 128 * lnc
    t = -(-p["rows"] // per)
    if t <= AWS_TILES:
        return _aws_run(*key, (p["rows"], p["hidden"]), p["dtype"], lnc)
    n = AWS_TILES
    short = _aws_run(*key, (per * n, p["hidden"]), p["dtype"], lnc)
    long = _aws_run(*key, (per * 2 * n, p["hidden"]), p["dtype"], lnc)
    return short + (t - n) * (long - short) / n


def aws_table(points: list[dict], root: str) -> str:
    """The points naming a public kernel, each with that kernel run from ``root``, and the
    emulation's wall time (its ``nki.run`` calls: two when rows are extrapolated)."""
    lines = [
        ("point", "conf", "use", "published", "AWS kernel", "unit", "ratio", "factor", "emulation")
    ]
    for p in points:
        if "aws_kernel" not in p:
            continue
        from trn2core.errors import Trn2Error

        _RUN_WALL.clear()
        try:
            s, refused = aws_kernel_seconds(p, root), None
        except Trn2Error as e:  # what trn2core refuses in the kernel, named
            s, refused = None, f"refused: {type(e).__name__} [{getattr(e, 'rule', '') or '?'}]"
        r = Row(p, p["time_us"], None if s is None else s * 1e6, "us")
        lines.append(
            (r.id, p["confidence"], p["use"], _fmt(r.published, "us"),
             refused or _fmt(r.predicted, "us"), "us",
             "-" if r.ratio is None else f"{r.ratio:.3f}", _factor_text(r),
             f"{sum(_RUN_WALL):.1f} s" if _RUN_WALL else "-")
        )  # fmt: skip
    w = [max(len(x[i]) for x in lines) for i in range(len(lines[0]))]
    out = ["  ".join(v.ljust(w[i]) if i in (0, 1, 2, 5) else v.rjust(w[i])
                     for i, v in enumerate(x)).rstrip() for x in lines]  # fmt: skip
    out.insert(1, "  ".join("-" * n for n in w))
    return "\n".join(out)


def _model_step(p: dict, naive: bool = False):
    """The whole-model step of point ``p`` through ``trn2core.workload``."""
    from trn2core import workload

    inf = workload.Inference(
        p["model"], p["machine"], tp=p["tp"], lnc=p["lnc"], batch=p["batch"], dtype=p["dtype"],
        seq_len=p["seq_len"], prefill_buckets=p.get("prefill_buckets"),
        decode_buckets=p.get("decode_buckets"), sequence_parallel=p["sequence_parallel"],
        serving=p["serving"], naive=naive,
    )  # fmt: skip
    return inf.prefill(p["tokens"]) if p["phase"] == "prefill" else inf.decode(p["tokens"])


# ------------------------------------------------------------------------------- calibration

#: The calibrated constants, by the category of points they are fitted on.
CALIBRATED = {
    "collective": (
        "collective_op_fixed_s",
        "collective_reduce_op_fixed_s",
        "collective_reduce_step_s",
        "neuronlink_achieved_fraction",
    ),
    "dma": ("dma_fixed_cost_s", "dma_hbm_read_latency_s", "dma_row_overhead_s"),
    "workload": ("collective_in_graph_reduce_op_fixed_s", "workload_op_fixed_s"),
}

#: Weight of a point's squared log error in the fit, by confidence.
WEIGHTS = {"high": 1.0, "medium": 0.5}


def spec_constants() -> dict[str, float]:
    """The calibrated constants as the model has them (``trn2core.spec``)."""
    import trn2core

    return {name: getattr(trn2core.spec, name) for names in CALIBRATED.values() for name in names}


def category(p: dict) -> str | None:
    """The calibration category of a checked point: ``collective``, ``dma``, or None (GEMM:
    nothing in the GEMM model is fitted)."""
    if p["kind"] == "nccom":
        return "collective"
    if p["kind"] == "dma":
        return "dma"
    if p["kind"] == "model" and p.get("fit"):
        return "workload"
    return None


@dataclasses.dataclass(frozen=True)
class Parts:
    """A prediction taken apart into what the calibrated constants multiply, so it can be
    recomputed with other constants (``seconds``) exactly as the Rust cost model does."""

    point: dict
    row: dict | None = None  # nccom_rows' row (collectives)
    step: dict | None = None  # a whole-model step's parts (workload)

    def seconds(self, c: dict[str, float]) -> float:
        """The prediction with constants ``c`` (any subset overrides the calibrated ones)."""
        import trn2core

        spec = trn2core.spec
        k = {**spec_constants(), **c}
        p = self.point
        if p["kind"] == "nccom":
            row = self.row
            cal = spec.neuronlink_achieved_fraction
            chip = 0.0
            for ph in row["phases"]:
                assert not ph["efa"], "the published collectives never cross EFA"
                link = ph["link_s"] * cal / k["neuronlink_achieved_fraction"]
                step = ph["latency_s"] + max(link, ph["hbm_s"], ph["reduce_s"])
                chip += ph["steps"] * step + ph["reduce_steps"] * k["collective_reduce_step_s"]
            reduces = p["operation"] in ("all_reduce", "reduce_scatter")
            op = 0.0
            if row["chips"] > 1 or row["intra_chip_bytes"] > 0:
                op = k["collective_reduce_op_fixed_s"] if reduces else k["collective_op_fixed_s"]
            if row["intra_chip_bytes"] > 0:
                fixed = k["dma_fixed_cost_s"] + k["dma_hbm_read_latency_s"]
                intra = row["intra_chip_bytes"] / spec.hbm_chip_bytes_per_s
                return op + max(chip, intra) + fixed
            return op + chip
        if p["kind"] == "dma":
            return _dma_parts_seconds(p, k)
        if p["kind"] == "model":
            return _model_parts_seconds(p, self.step, k)
        raise ValueError(f"{p['id']}: no calibrated constants")


def _dma_parts_seconds(p: dict, k: dict[str, float]) -> float:
    """One DMA transfer of point ``p`` with constants ``k``: the model of ``dma/cost.rs``
    (engine ``e`` moves its 8 partitions' rows, each costing ``dma_row_overhead_s`` besides its
    bytes; HBM caps the rate; the fixed cost comes first)."""
    import trn2core

    spec = trn2core.spec
    shape = p["shape"]
    nbytes = int(np.prod(shape)) * np.dtype(_np_dtype(p["dtype"])).itemsize
    parts = min(shape[0], spec.sbuf_partitions) if len(shape) >= 2 else spec.sbuf_partitions
    row = nbytes / parts
    rate = spec.dma_engine_bytes_per_s
    eff = row / (row + rate * k["dma_row_overhead_s"])
    engine_bytes = row * min(spec.dma_partitions_per_engine, parts)
    engines_s = engine_bytes / (rate * eff)
    if p["quantity"] == "engine":
        return engines_s
    hbm_sides = sum(1 for side in (p["src"], p["dst"]) if side == "hbm")
    hbm_s = hbm_sides * nbytes / spec.hbm_stack_bytes_per_s
    fixed = k["dma_fixed_cost_s"] + (k["dma_hbm_read_latency_s"] if p["src"] == "hbm" else 0.0)
    return fixed + max(engines_s, hbm_s)


def _model_parts_seconds(p: dict, step: dict, k: dict[str, float]) -> float:
    """A whole-model step with constants ``k``: the in-graph reducing collectives pay the fixed
    cost (and their steps the same fraction of the standalone step cost), every other op the
    per-op fixed cost, as ``workload/inference.rs`` composes them."""
    import trn2core

    spec = trn2core.spec
    fixed = k["collective_in_graph_reduce_op_fixed_s"]
    step_s = spec.collective_reduce_step_s * fixed / spec.collective_reduce_op_fixed_s
    cal = spec.collective_in_graph_reduce_op_fixed_s
    cal_step = spec.collective_in_graph_reduce_step_s
    if p["quantity"] == "layer_collectives":
        n = step["layer_reduce_ops"]
        return (
            step["layer_collectives_s"]
            + n * (fixed - cal)
            + step["layer_reduce_steps"] * (step_s - cal_step)
        )
    return (
        step["other_s"]
        + step["reduce_ops"] * fixed
        + step["reduce_steps"] * step_s
        + step["fixed_ops"] * k["workload_op_fixed_s"]
    )


def parts(p: dict) -> Parts:
    """The parts of point ``p``'s prediction."""
    from trn2core.nccom import nccom_rows

    if p["kind"] == "nccom":
        r = nccom_rows(p["operation"], p["ranks"], [p["size_bytes"]], p["dtype"], p["lnc"], "auto")
        return Parts(p, r[0])
    if p["kind"] == "model":
        rep = _model_step(p)
        step = rep.parts
        layer = [o for o in rep.ops if o["kind"] == "collective" and o["scope"] != "step"]
        step["layer_reduce_ops"] = sum(o["count"] for o in layer if o["name"] != "all_gather")
        # Decode all-reduces are single-step Mesh: no reducing steps in the fitted point.
        step["layer_reduce_steps"] = 0.0 if p["phase"] == "decode" else step["reduce_steps"]
        return Parts(p, step=step)
    return Parts(p)


def _loss(items: list[tuple[Parts, float]], c: dict[str, float]) -> float:
    total = 0.0
    for pa, published_s in items:
        w = WEIGHTS[pa.point["confidence"]]
        total += w * np.log(pa.seconds(c) / published_s) ** 2
    return total


def fit(cat: str, points: list[dict], start: dict[str, float] | None = None) -> dict[str, float]:
    """The constants of category ``cat`` minimising the weighted squared log errors over the
    checked points of that category in ``points`` (coordinate search in log space, from the
    calibrated values; fractions stay at most 1)."""
    names = CALIBRATED[cat]
    items = [
        (parts(p), p["time_us"] * 1e-6)
        for p in points
        if p["use"] == "check" and category(p) == cat
    ]
    c = dict(start or {n: spec_constants()[n] for n in names})
    best = _loss(items, c)
    step = 0.5
    while step > 1e-5:
        improved = False
        for n in names:
            for f in (np.exp(step), np.exp(-step)):
                trial = dict(c)
                trial[n] = c[n] * f
                if n.endswith("_fraction") and trial[n] > 1.0:
                    trial[n] = 1.0
                loss = _loss(items, trial)
                if loss < best - 1e-15:
                    best, c, improved = loss, trial, True
        if not improved:
            step /= 2
    return c


def fitted(points: list[dict] | None = None) -> dict[str, float]:
    """Every calibrated constant, fitted on the table's points."""
    if points is None:
        points = load()[1]
    out: dict[str, float] = {}
    for cat in CALIBRATED:
        out.update(fit(cat, points))
    return out


@dataclasses.dataclass(frozen=True)
class LooRow:
    """A checked point predicted by the model calibrated without it."""

    point: dict
    published: float
    in_sample: float
    left_out: float

    @property
    def factor(self) -> float:
        r = self.left_out / self.published
        return max(r, 1.0 / r)


def leave_one_out(points: list[dict] | None = None) -> list[LooRow]:
    """Each checked point of a calibrated category, predicted with its category's constants
    refitted without it (GEMM points, with nothing fitted, are predicted as they are)."""
    if points is None:
        points = load()[1]
    cal = spec_constants()
    out = []
    for p in points:
        if p["use"] != "check":
            continue
        cat = category(p)
        published = p["time_us"] * 1e-6
        if cat is None:
            s = predict(p).predicted * 1e-6
            out.append(LooRow(p, published, s, s))
            continue
        pa = parts(p)
        rest = [q for q in points if q is not p]
        c = fit(cat, rest)
        out.append(LooRow(p, published, pa.seconds(cal), pa.seconds(c)))
    return out


def residual_ranges(rows: list[Row]) -> dict[str, tuple[float, float, int]]:
    """Published / predicted, lowest and highest, and the count, over the checked points (high
    and medium) of each kind of report: ``collective``, ``dma``, ``gemm`` (the ``spec``
    constants ``*_PUBLISHED_RATIO_*`` every report prints)."""
    out = {}
    for cat, kinds in (
        ("collective", ("nccom",)),
        ("dma", ("dma",)),
        ("gemm", ("gemm",)),
        ("workload_prefill", ("model",)),
        ("workload_decode", ("model",)),
    ):
        sel = [r for r in checked(rows, ("high", "medium")) if r.point["kind"] in kinds]
        if cat.startswith("workload"):
            phase = cat.split("_")[1]
            sel = [r for r in sel if r.point["phase"] == phase and r.point["quantity"] == "step"]
        ratios = [r.published / r.predicted for r in sel]
        out[cat] = (min(ratios), max(ratios), len(ratios))
    return out


def evaluate(points: list[dict] | None = None) -> list[Row]:
    """Every point of the table with its prediction."""
    if points is None:
        points = load()[1]
    return [predict(p) for p in points]


def checked(rows: list[Row], confidences=("high",)) -> list[Row]:
    """The rows compared with the model (``use = "check"``) of the given confidences."""
    return [r for r in rows if r.point["use"] == "check" and r.point["confidence"] in confidences]


def summary(rows: list[Row], confidences=("high",)) -> dict:
    """``count``, ``median`` and ``worst`` factor, and the ``worst_id``, over the checked rows
    of the given confidences."""
    sel = checked(rows, confidences)
    factors = [r.factor for r in sel]
    worst = max(sel, key=lambda r: r.factor)
    return {
        "count": len(sel),
        "median": statistics.median(factors),
        "worst": worst.factor,
        "worst_id": worst.id,
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "x":
        return f"{v:.3f}"
    return f"{v:.2f}" if v < 1e4 else f"{v:.0f}"


def _factor_text(r: Row) -> str:
    if r.within_bound is not None:
        return "under" if r.within_bound else "OVER"
    return "-" if r.factor is None else f"{r.factor:.2f}"


def table(rows: list[Row], show_all: bool = False) -> str:
    """The rows as a text table (only the checked ones unless ``show_all``)."""
    head = ("point", "conf", "use", "published", "predicted", "unit", "ratio", "factor", "alg")
    lines = [head]
    for r in rows:
        if not show_all and r.point["use"] != "check":
            continue
        alg = ""
        if r.algorithm is not None:
            alg = r.algorithm
            if r.point.get("algorithm"):
                alg += f" (published {r.point['algorithm']})"
        lines.append(
            (
                r.id,
                r.point["confidence"],
                r.point["use"],
                _fmt(r.published, r.unit),
                _fmt(r.predicted, r.unit),
                r.unit,
                "-" if r.ratio is None else f"{r.ratio:.3f}",
                _factor_text(r),
                alg,
            )
        )
    w = [max(len(x[i]) for x in lines) for i in range(len(head))]
    out = []
    for k, x in enumerate(lines):
        out.append(
            "  ".join(
                v.ljust(w[i]) if i in (0, 1, 2, 5, 8) else v.rjust(w[i]) for i, v in enumerate(x)
            ).rstrip()
        )
        if k == 0:
            out.append("  ".join("-" * n for n in w))
    return "\n".join(out)


def report(rows: list[Row]) -> str:
    """The summary lines."""
    out = []
    for label, conf in (("high", ("high",)), ("high+medium", ("high", "medium"))):
        s = summary(rows, conf)
        out.append(
            f"{label:<12} {s['count']:>3} points: median factor {s['median']:.3f}, "
            f"worst {s['worst']:.3f} ({s['worst_id']})"
        )
    return "\n".join(out)


def fit_report(points: list[dict]) -> str:
    """The fitted constants beside the model's, and the residual ranges."""
    cal = spec_constants()
    fit_c = fitted(points)
    lines = ["constant                          model        fit     fit / model"]
    for n in cal:
        lines.append(f"{n:<32}  {cal[n]:.4g}  {fit_c[n]:>10.4g}  {fit_c[n] / cal[n]:>10.3f}")
    lines.append("")
    lines.append("published / predicted over the checked points (the *_published_ratio_* terms):")
    for cat, (lo, hi, n) in residual_ranges(evaluate(points)).items():
        lines.append(f"  {cat:<10}  low {lo:.3f}  high {hi:.3f}  cases {n}")
    return "\n".join(lines)


def loo_report(points: list[dict]) -> str:
    """Leave-one-out predictions and their summary."""
    rows = leave_one_out(points)
    lines = [
        f"{'point':<30} {'conf':<7} {'published':>10} {'in-sample':>10} {'left out':>10}"
        f" {'factor':>7}"
    ]
    for r in rows:
        lines.append(
            f"{r.point['id']:<30} {r.point['confidence']:<7} {r.published * 1e6:>10.2f}"
            f" {r.in_sample * 1e6:>10.2f} {r.left_out * 1e6:>10.2f} {r.factor:>7.2f}"
        )
    for label, conf in (("high", ("high",)), ("high+medium", ("high", "medium"))):
        fs = [r.factor for r in rows if r.point["confidence"] in conf]
        worst = max((r for r in rows if r.point["confidence"] in conf), key=lambda r: r.factor)
        lines.append(
            f"leave-one-out {label:<12} {len(fs)} points: median factor "
            f"{statistics.median(fs):.3f}, worst {max(fs):.3f} ({worst.point['id']})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="also the points not in the summary")
    ap.add_argument("--fit", action="store_true", help="fit the calibrated constants")
    ap.add_argument("--loo", action="store_true", help="leave-one-out predictions")
    ap.add_argument("--corpus", metavar="ROOT", help="also run AWS's kernels from checkouts here")
    args = ap.parse_args(argv)
    points = load()[1]
    if args.fit:
        print(fit_report(points))
        return 0
    if args.loo:
        print(loo_report(points))
        return 0
    rows = evaluate(points)
    print(table(rows, args.all))
    print()
    print(report(rows))
    if args.corpus:
        print()
        print(f"AWS's own kernels, imported from {args.corpus} (not in the summary):")
        print(aws_table(points, args.corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
