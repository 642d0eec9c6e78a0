"""Whole models on Trainium2: time to first token and time per
output token of a transformer on a Trn2 machine, composed in the core from the project's own
per-op models (``estimate_gemm``, the DMA/HBM model, collectives inside a compiled graph).

::

    from trn2core import workload
    m = workload.Model("llama-3.3-70b")                  # or Model.from_hf_config("config.json")
    inf = workload.Inference(m, "trn2.48xlarge", tp=64, lnc=2)
    inf.prefill(10_000).seconds                          # time to first token
    inf.decode(context=10_000).seconds                   # time per output token
    inf.memory()                                         # bytes per logical core
    workload.Training(m, "ultraserver", tp=16, pp=4, dp=4, global_batch=64, seq=8192).step()
    workload.search(m, "trn2.48xlarge", objective="itl")  # ranked parallel layouts

The facade only normalises arguments; every public call crosses into the core once. The model,
its terms and the validation against AWS's published runs: docs/workload.md.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import _core, _validate
from ._names import MODEL_PRESETS
from .errors import Trn2ValueError
from .report import core_fields

__all__ = [
    "PRESETS",
    "Inference",
    "Model",
    "SearchResult",
    "StepReport",
    "Training",
    "TrainReport",
    "search",
]

#: The preset names (``Model(name)``), read from the core.
PRESETS: tuple[str, ...] = MODEL_PRESETS

_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


#: The getters of each report class of the core, in the order of the facade's dicts.
_FIELDS: dict[type, str] = {
    _core.ModelInfo: "name hidden_size num_hidden_layers num_attention_heads num_key_value_heads "
    "head_dim intermediate_size vocab_size tie_word_embeddings sliding_window parameters "
    "moe_layers num_experts num_experts_per_tok shared_experts moe_intermediate_size attention",
    _core.OpTime: "name scope kind count seconds fixed_s total_s hbm_bytes flops bound",
    _core.MemoryPlan: "items total_bytes capacity_bytes ranks_per_chip",
    _core.StepParts: "other_s reduce_ops reduce_steps fixed_ops layer_collectives_s",
    _core.StepReport: "phase model tokens bucket seconds description ops memory parts uncertainty",
    _core.TrainReport: "phase model seconds tokens_per_s mfu model_flops peak_flops_per_s "
    "micro_batches bubble_fraction stage_layers forward_s backward_s dp_reduce_s dp_exposed_s "
    "description ops memory uncertainty schedule",
    _core.Candidate: "tp pp dp ep lnc batch ttft_s itl_s tokens_per_s cost_per_mtok mfu",
    _core.SearchResult: "layouts tried skipped_capacity skipped_invalid skipped_constraints",
}
#: The MoE fields, which a dense model's dict leaves out.
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "shared_experts", "moe_intermediate_size")


def _plain(value: Any) -> Any:
    """A report of the core (or a list of them) as the dicts the facade gives: its getters in
    ``_FIELDS`` order, nested reports likewise, a memory plan's ``items`` as bytes by name. The
    facade keeps these, not the core's objects: its models and reports stay plain data (they
    pickle and copy)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    names = _FIELDS.get(type(value))
    if names is None:
        return core_fields(value)
    out = {k: _plain(getattr(value, k)) for k in names.split()}
    if isinstance(value, _core.MemoryPlan):
        out["items"] = dict(value.items)
    if isinstance(value, _core.TrainReport):
        keys = ("stage", "name", "micro_batch", "start_s", "seconds")
        out["schedule"] = [dict(zip(keys, x, strict=True)) for x in value.schedule]
    if isinstance(value, _core.ModelInfo) and value.num_experts is None:
        out = {k: v for k, v in out.items() if k not in _MOE_FIELDS}
    return out


def _flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's top-level fields, a nested ``text_config`` (Llama-4, multimodal models)
    merged over them; nested objects and lists are dropped (the model reads none)."""
    out = {k: v for k, v in config.items() if not isinstance(v, (Mapping, list))}
    text = config.get("text_config")
    if isinstance(text, Mapping):
        out.update({k: v for k, v in text.items() if not isinstance(v, (Mapping, list))})
    return out


class Model:
    """A transformer: a preset (``Model("llama-3.3-70b")``, see ``PRESETS``) or the fields of
    a Hugging Face ``config.json`` (``Model.from_hf_config(path_or_dict)``). A config missing a
    required field, or with an inconsistent one, is a ``Trn2ValueError`` naming the field."""

    def __init__(self, name: str, *, config: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str):
            raise Trn2ValueError(f"model: expected a preset name or a config, got {name!r}")
        self._config = None if config is None else _flatten(config)
        self._name = name
        self._info = _plain(_core.workload_model(name, self._config))

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | os.PathLike, name: str = "") -> Model:
        """The model of a ``config.json``: a dict, or the path of the file (or of the
        directory holding it)."""
        if isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            try:
                with open(path, encoding="utf-8") as f:
                    config = json.load(f)
            except OSError as e:
                raise Trn2ValueError(f"config: cannot read {path!r}: {e.strerror}") from None
            except json.JSONDecodeError as e:
                raise Trn2ValueError(f"config: {path!r} is not JSON: {e.msg}") from None
        if not isinstance(config, Mapping):
            raise Trn2ValueError(f"config: expected a dict or a path, got {type(config).__name__}")
        return cls(name, config=config)

    @property
    def name(self) -> str:
        return self._info["name"]

    @property
    def parameters(self) -> int:
        """Total parameters."""
        return self._info["parameters"]

    def to_dict(self) -> dict[str, Any]:
        """The fields the model reads, and its parameter count."""
        return dict(self._info)

    def __repr__(self) -> str:
        return f"Model({self.name!r}, {self.parameters / 1e9:.1f}B parameters)"


def _model(model) -> Model:
    """A model argument: a ``Model``, a preset name, or the fields of a ``config.json``."""
    if isinstance(model, Model):
        return model
    if isinstance(model, Mapping):
        return Model.from_hf_config(model)
    return Model(model)


def _machine(machine) -> tuple[str, int | None]:
    """A machine's name for the core, and its LNC when it is a machine object."""
    from .topology import Instance, UltraCluster, UltraServer

    if isinstance(machine, str):
        return machine, None
    if isinstance(machine, Instance):
        return machine.instance_type, machine.lnc
    if isinstance(machine, UltraServer):
        return "ultraserver", machine.lnc
    if isinstance(machine, UltraCluster):
        return f"ultracluster:{len(machine.chips) // 64}", machine.lnc
    raise Trn2ValueError(
        f"machine: expected a name or an Instance/UltraServer/UltraCluster, got {machine!r}"
    )


def _buckets(value, arg: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise Trn2ValueError(f"{arg}: expected a list of token counts, got {value!r}")
    return [_validate.integer(b, arg, lo=1) for b in value]


class _Field:
    """A report's read-only field: the value the core reported under the attribute's name."""

    def __init__(self, doc: str = "") -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._d[self.name]


def _x_event(tid: int, start_s: float, seconds: float, name: str, args: dict) -> dict[str, Any]:
    """A Chrome/Perfetto complete event (``ph`` X) in microseconds."""
    return {
        "ph": "X",
        "pid": 0,
        "tid": tid,
        "ts": start_s * 1e6,
        "dur": seconds * 1e6,
        "name": name,
        "args": args,
    }


def _named_tracks(process: str, tracks: dict[str, int]) -> list[dict[str, Any]]:
    """The metadata events naming the process and each track."""
    meta: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": process}}
    ]
    meta += [
        {"ph": "M", "pid": 0, "tid": tid, "name": "thread_name", "args": {"name": track}}
        for track, tid in tracks.items()
    ]
    return meta


class StepReport:
    """One step's time with its per-layer, per-op breakdown, memory plan and uncertainty."""

    def __init__(self, r: _core.Step) -> None:
        self._d = _plain(r)

    seconds = _Field()
    phase = _Field()
    model = _Field("The model's name.")
    bucket = _Field("The compiled bucket the step ran in.")

    @property
    def ops(self) -> list[dict]:
        """Rows: name, scope (dense/moe layers or step), kind, count, seconds (one run),
        fixed_s, total_s, hbm_bytes, flops, bound."""
        return [dict(o) for o in self._d["ops"]]

    memory = _Field()
    uncertainty = _Field("The range the published whole-model cases of this phase fell in.")

    @property
    def parts(self) -> dict:
        """What the calibrated terms multiply (benches/fidelity_table.py refits with them)."""
        return dict(self._d["parts"])

    def by_kind(self) -> dict[str, float]:
        """Seconds per kind of op over the step (gemm, attention, norm, collective,
        serving) and ``fixed`` (the per-op fixed costs)."""
        out: dict[str, float] = {}
        for o in self._d["ops"]:
            out[o["kind"]] = out.get(o["kind"], 0.0) + o["count"] * o["seconds"]
            out["fixed"] = out.get("fixed", 0.0) + o["count"] * o["fixed_s"]
        return out

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._d))

    def trace_events(self) -> list[dict[str, Any]]:
        """The step as Chrome/Perfetto trace events: the ops one after another as the model
        runs them (each layer of a kind in turn, then the once-per-step ops), one track per
        component (gemm, attention, norm, collective, ...; the per-op fixed costs on
        their own track), times in microseconds."""
        tracks: dict[str, int] = {}
        events: list[dict[str, Any]] = []
        now = 0.0

        def slice_(track: str, name: str, dur_s: float, args: dict[str, Any]) -> None:
            nonlocal now
            tid = tracks.setdefault(track, len(tracks) + 1)
            events.append(_x_event(tid, now, dur_s, name, args))
            now += dur_s

        ops = self._d["ops"]
        for scope in ("dense", "moe", "step"):
            rows = [o for o in ops if o["scope"] == scope]
            runs = max((o["count"] for o in rows), default=0) if scope != "step" else 1
            for layer in range(runs):
                for o in rows:
                    reps = 1 if scope != "step" else o["count"]
                    for _ in range(reps):
                        args = {
                            "layer": layer if scope != "step" else None,
                            "scope": scope,
                            "bound": o["bound"],
                            "hbm_bytes": o["hbm_bytes"],
                            "flops": o["flops"],
                        }
                        slice_(o["kind"], o["name"], o["seconds"], args)
                        if o["fixed_s"] > 0:
                            slice_("fixed", o["name"] + " (fixed)", o["fixed_s"], {})
        return _named_tracks(self._d["description"], tracks) + events

    def save_trace(self, path: str | os.PathLike[str]) -> str:
        """Writes one step as a Chrome/Perfetto trace (``trace_events``) to ``path`` through
        the project's trace writer (``.pftrace``: Perfetto's protobuf, needs
        ``trn2core[perfetto]``); returns the path. Open it at https://ui.perfetto.dev."""
        from . import _perfetto
        from .report import _write_trace

        path = _validate.path(path, "path")
        _perfetto.require_for(path)
        events = self.trace_events()
        text = json.dumps({"displayTimeUnit": "ns", "traceEvents": events})
        return _write_trace(path, text, events)

    def table(self) -> str:
        """The breakdown as a text table (one row per op and layer kind)."""
        rows = [("op", "layers", "x", "each us", "fixed us", "total ms", "share", "bound")]
        total = self.seconds
        for o in self._d["ops"]:
            rows.append(
                (
                    o["name"],
                    o["scope"],
                    str(o["count"]),
                    f"{o['seconds'] * 1e6:.2f}",
                    f"{o['fixed_s'] * 1e6:.1f}",
                    f"{o['total_s'] * 1e3:.3f}",
                    f"{o['total_s'] / total:.1%}",
                    o["bound"],
                )
            )
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(v.ljust(w[i]) if i in (0, 1, 7) else v.rjust(w[i]) for i, v in enumerate(r))
            for r in rows
        ]
        lines.insert(1, "  ".join("-" * n for n in w))
        return "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        u = self.uncertainty["text"]
        return f"{self._d['description']}: {self.seconds * 1e3:.3f} ms, {u}\n{self.table()}"

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(str(self)) + "</pre>"


def _machine_lnc_dtype(machine, lnc, dtype) -> tuple[str, int, str]:
    """The machine's name, the Logical NeuronCore size (the machine's, else 2, unless given)
    and the core's name of ``dtype``: what an inference and a training run both check first."""
    name, machine_lnc = _machine(machine)
    if lnc is None:
        lnc = 2 if machine_lnc is None else machine_lnc
    if dtype not in _DTYPES:
        raise Trn2ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    return name, _validate.integer(lnc, "lnc", lo=1), _DTYPES[dtype]


class Inference:
    """A model compiled for inference on a machine, as NxD Inference runs it: ``tp`` ranks
    (logical cores), ``ep`` expert-parallel groups for MoE layers, LNC 1 or 2, ``batch``
    sequences, bf16 or fp8 weights, context-encoding and token-generation buckets (default:
    powers of two from 128 up to ``seq_len``), optional sequence parallelism in prefill,
    served natively or through vLLM. ``naive=True`` is the per-op sum before whole models were
    composed (standalone collectives, no per-op or serving costs), for comparison."""

    def __init__(
        self,
        model: Model | str | Mapping[str, Any],
        machine="trn2.48xlarge",
        *,
        tp: int,
        ep: int = 1,
        lnc: int | None = None,
        batch: int = 1,
        dtype: str = "bf16",
        seq_len: int = 4096,
        prefill_buckets: Sequence[int] | None = None,
        decode_buckets: Sequence[int] | None = None,
        sequence_parallel: bool = False,
        serving: str = "native",
        naive: bool = False,
    ) -> None:
        self.model = _model(model)
        name, lnc, dt = _machine_lnc_dtype(machine, lnc, dtype)
        self._args = dict(
            machine=name,
            tp=_validate.integer(tp, "tp", lo=1),
            ep=_validate.integer(ep, "ep", lo=1),
            lnc=lnc,
            batch=_validate.integer(batch, "batch", lo=1),
            dtype=dt,
            sequence_parallel=bool(sequence_parallel),
            seq_len=_validate.integer(seq_len, "seq_len", lo=1),
            prefill_buckets=_buckets(prefill_buckets, "prefill_buckets"),
            decode_buckets=_buckets(decode_buckets, "decode_buckets"),
            serving=serving,
            naive=bool(naive),
        )

    def _step(self, phase: str, tokens) -> StepReport:
        r = _core.workload_step(self.model._name, self.model._config, phase, tokens, self._args)
        return StepReport(r)

    def prefill(self, tokens: int) -> StepReport:
        """Time to first token of a prompt of ``tokens`` tokens (padded to its bucket)."""
        return self._step("prefill", _validate.integer(tokens, "tokens", lo=1))

    def decode(self, context: int) -> StepReport:
        """Time per output token with ``context`` tokens already in the KV cache."""
        return self._step("decode", _validate.integer(context, "context", lo=0))

    def memory(self) -> dict:
        """Bytes per logical core: weights, KV cache, activations, against its HBM
        (``CapacityError`` naming the biggest item if they do not fit)."""
        return _plain(_core.workload_memory(self.model._name, self.model._config, self._args))


class TrainReport(StepReport):
    """One training step: step time, tokens/s, MFU, the 1F1B bubble, the DP reduction and
    how much of it the backward pass hides, the per-op breakdown (counts over the step) and
    the memory plan (weights, gradients, optimizer states, activations per logical core)."""

    tokens_per_s = _Field()
    mfu = _Field("Model FLOPs utilisation against the bf16 peak of the cores the layout occupies.")
    bubble_fraction = _Field("The 1F1B pipeline bubble: (pp - 1) / (micro_batches + pp - 1).")
    micro_batches = _Field()
    forward_s = _Field("One micro-batch's forward pass through one pipeline stage.")
    backward_s = _Field("One micro-batch's backward pass through one pipeline stage.")
    dp_reduce_s = _Field(
        "The data-parallel gradient collective (all-reduce, or ZeRO-1's reduce-scatter)."
    )
    dp_exposed_s = _Field("The part of ``dp_reduce_s`` the last backward pass does not hide.")

    @property
    def schedule(self) -> list[dict]:
        """The step as the core schedules it: rows of stage (``None`` for the DP collective
        and the optimizer), name (``forward``, ``backward``, ``bubble``, ``dp_grad_reduce``,
        ``optimizer``, ``dp_param_all_gather``), micro_batch, start_s and seconds; every
        stage's forward and backward micro-batches in 1F1B order, the last ending at
        ``seconds``."""
        return [dict(x) for x in self._d["schedule"]]

    def trace_events(self) -> list[dict[str, Any]]:
        """The step's 1F1B pipeline schedule as Chrome/Perfetto trace events: one track per
        pipeline stage with its forward (``F<i>``) and backward (``B<i>``) micro-batches and
        its idle time (``bubble``), a ``dp`` track with the gradient collective beside the
        last backward, and a ``step`` track with the optimizer (and ZeRO-1's all-gather);
        times in microseconds."""
        rows = self._d["schedule"]
        stages = sorted({r["stage"] for r in rows if r["stage"] is not None})
        tracks = {f"stage {s}": i + 1 for i, s in enumerate(stages)}
        tracks["dp"] = len(tracks) + 1
        tracks["step"] = len(tracks) + 1
        events: list[dict[str, Any]] = []
        for r in rows:
            if r["stage"] is not None:
                track = f"stage {r['stage']}"
                mb = r["micro_batch"]
                name = r["name"] if mb is None else f"{r['name'][0].upper()}{mb}"
            else:
                track = "dp" if r["name"] == "dp_grad_reduce" else "step"
                name = r["name"]
            args = {"stage": r["stage"], "kind": r["name"], "micro_batch": r["micro_batch"]}
            events.append(_x_event(tracks[track], r["start_s"], r["seconds"], name, args))
        return _named_tracks(self._d["description"], tracks) + events

    def __str__(self) -> str:
        d = self._d
        u = self.uncertainty["text"]
        return (
            f"{d['description']}: {self.seconds:.3f} s a step, {self.tokens_per_s:,.0f} tokens/s, "
            f"MFU {self.mfu:.1%}, bubble {self.bubble_fraction:.1%}, {u}\n{self.table()}"
        )


class Training:
    """A training layout: ``tp`` x ``pp`` x ``dp`` ranks (x ``ep`` inside the TP group for MoE
    layers), ``micro_batch`` sequences per micro-batch, ``global_batch`` per optimizer step,
    ``seq`` tokens each, bf16 (or fp8) GEMMs with fp32 master weights and Adam states (sharded
    over DP with ``zero1``), activation recomputation ``"full"`` or ``"none"``, sequence
    parallelism in the TP group. ``step()`` estimates one optimizer step (docs/workload.md)."""

    def __init__(
        self,
        model: Model | str | Mapping[str, Any],
        machine="ultraserver",
        *,
        tp: int,
        pp: int = 1,
        dp: int = 1,
        ep: int = 1,
        lnc: int | None = None,
        micro_batch: int = 1,
        global_batch: int,
        seq: int,
        dtype: str = "bf16",
        zero1: bool = True,
        recompute: str = "full",
        sequence_parallel: bool = True,
    ) -> None:
        self.model = _model(model)
        name, lnc, dt = _machine_lnc_dtype(machine, lnc, dtype)
        if recompute not in ("full", "none"):
            raise Trn2ValueError(f"recompute: expected 'full' or 'none', got {recompute!r}")
        self._args = dict(
            machine=name,
            tp=_validate.integer(tp, "tp", lo=1),
            pp=_validate.integer(pp, "pp", lo=1),
            dp=_validate.integer(dp, "dp", lo=1),
            ep=_validate.integer(ep, "ep", lo=1),
            lnc=lnc,
            micro_batch=_validate.integer(micro_batch, "micro_batch", lo=1),
            global_batch=_validate.integer(global_batch, "global_batch", lo=1),
            seq=_validate.integer(seq, "seq", lo=1),
            dtype=dt,
            zero1=bool(zero1),
            recompute=recompute,
            sequence_parallel=bool(sequence_parallel),
        )

    def step(self) -> TrainReport:
        """One optimizer step (``CapacityError`` naming the biggest item if it does not fit;
        ``Trn2ValueError`` naming both numbers of a layout the machine or model does not
        allow)."""
        return TrainReport(_core.workload_train(self.model._name, self.model._config, self._args))


class SearchResult:
    """Ranked layouts (``layouts``: dicts of tp, pp, dp, ep, lnc, batch, ttft_s, itl_s,
    tokens_per_s, cost_per_mtok, mfu; best first) and the counts left out: ``tried``,
    ``skipped_capacity`` (memory plan does not fit), ``skipped_invalid`` (degrees the model or
    machine does not allow), ``skipped_constraints`` (over ``max_ttft_s``/``max_itl_s``)."""

    def __init__(self, r: _core.SearchResult, objective: str) -> None:
        self._d = _plain(r)
        self.objective = objective

    @property
    def layouts(self) -> list[dict]:
        return [dict(c) for c in self._d["layouts"]]

    @property
    def best(self) -> dict | None:
        rows = self._d["layouts"]
        return dict(rows[0]) if rows else None

    def __getattr__(self, name: str):
        if name in ("tried", "skipped_capacity", "skipped_invalid", "skipped_constraints"):
            return self._d[name]
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective, **json.loads(json.dumps(self._d))}

    def pareto(self) -> list[dict]:
        """The Pareto front of the layouts: those no other layout beats on both time per token
        (``itl_s``; a training step's time) and throughput (``tokens_per_s``), fastest first."""
        front: list[dict] = []
        for c in sorted(self.layouts, key=lambda c: (c["itl_s"], -c["tokens_per_s"])):
            if not front or c["tokens_per_s"] > front[-1]["tokens_per_s"]:
                front.append(c)
        return front

    def table(self, limit: int = 10) -> str:
        head = "  tp  pp   dp  ep lnc batch   ttft ms    itl ms    tokens/s   $/Mtok"
        lines = [head]
        for c in self._d["layouts"][:limit]:
            cost = "-" if c["cost_per_mtok"] is None else f"{c['cost_per_mtok']:.3f}"
            lines.append(
                f"{c['tp']:4d}{c['pp']:4d}{c['dp']:5d}{c['ep']:4d}{c['lnc']:4d}{c['batch']:6d}"
                f"{c['ttft_s'] * 1e3:10.2f}{c['itl_s'] * 1e3:10.3f}{c['tokens_per_s']:12.1f}"
                f"{cost:>9}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        d = self._d
        return (
            f"{len(d['layouts'])} layouts by {self.objective} ({d['tried']} tried; skipped: "
            f"{d['skipped_capacity']} do not fit, {d['skipped_invalid']} not allowed, "
            f"{d['skipped_constraints']} over the constraints)\n{self.table()}"
        )


_SEARCH_KEYS = {
    "prompt",
    "output",
    "tp",
    "pp",
    "ep",
    "lnc",
    "batch",
    "dtype",
    "global_batch",
    "seq",
    "max_ttft_s",
    "max_itl_s",
}


def _int_list(value, arg: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise Trn2ValueError(f"constraints[{arg!r}]: expected an int or a list, got {value!r}")
    return [_validate.integer(v, f"constraints[{arg!r}]", lo=1) for v in value]


def _seconds(value, arg: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise Trn2ValueError(f"constraints[{arg!r}]: expected seconds > 0, got {value!r}")
    return float(value)


def search(
    model: Model | str | Mapping[str, Any],
    machine="trn2.48xlarge",
    objective: str = "itl",
    constraints: Mapping[str, Any] | None = None,
    price_per_hour: float | None = None,
    train: bool = False,
) -> SearchResult:
    """Ranks parallel layouts (TP, PP, DP, EP, batch, LNC) of ``model`` on ``machine`` by
    ``objective``: ``"ttft"``, ``"itl"``, ``"throughput"`` or ``"cost"`` (per million tokens at
    ``price_per_hour`` per instance-hour). ``constraints`` narrows the space: ``tp``, ``pp``,
    ``ep``, ``lnc``, ``batch`` (an int or a list each), ``prompt`` and ``output`` tokens
    (inference, default 1024 and 256), ``global_batch`` and ``seq`` (training, default 64 and
    4096), ``dtype``, ``max_ttft_s``, ``max_itl_s``. ``train=True`` ranks training layouts
    (throughput or cost). Layouts that do not fit are skipped and counted."""
    m = _model(model)
    name, machine_lnc = _machine(machine)
    c = dict(constraints or {})
    unknown = sorted(set(c) - _SEARCH_KEYS)
    if unknown:
        raise Trn2ValueError(f"constraints: unknown keys {unknown}; known: {sorted(_SEARCH_KEYS)}")
    if objective not in ("ttft", "itl", "throughput", "cost"):
        raise Trn2ValueError(
            f"objective: expected 'ttft', 'itl', 'throughput' or 'cost', got {objective!r}"
        )
    if price_per_hour is not None and (
        isinstance(price_per_hour, bool)
        or not isinstance(price_per_hour, (int, float))
        or not price_per_hour > 0
    ):
        raise Trn2ValueError(f"price_per_hour: expected a price > 0, got {price_per_hour!r}")
    dtype = c.get("dtype", "bf16")
    if dtype not in _DTYPES:
        raise Trn2ValueError(f"constraints['dtype']: expected one of {sorted(_DTYPES)}")
    lnc = c.get("lnc", [] if machine_lnc is None else [machine_lnc])
    r = _core.workload_search(
        m._name,
        m._config,
        name,
        objective,
        None if price_per_hour is None else float(price_per_hour),
        bool(train),
        _validate.integer(c.get("prompt", 1024), "constraints['prompt']", lo=1),
        _validate.integer(c.get("output", 256), "constraints['output']", lo=1),
        _int_list(c.get("tp", []), "tp"),
        _int_list(c.get("pp", []), "pp"),
        _int_list(c.get("ep", []), "ep"),
        _int_list(lnc, "lnc"),
        _int_list(c.get("batch", []), "batch"),
        _DTYPES[dtype],
        _validate.integer(c.get("global_batch", 64), "constraints['global_batch']", lo=1),
        _validate.integer(c.get("seq", 4096), "constraints['seq']", lo=1),
        _seconds(c.get("max_ttft_s"), "max_ttft_s"),
        _seconds(c.get("max_itl_s"), "max_itl_s"),
    )
    return SearchResult(r, objective)
