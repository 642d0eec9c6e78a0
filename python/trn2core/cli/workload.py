"""``trn2core estimate MODEL|config.json``: time to first token and time per output token of a
whole model on a Trn2 machine, or with ``--train`` one training step; ``trn2core plan MODEL``:
the parallel layouts ranked by an objective (docs/workload.md)."""

from __future__ import annotations

import json
import os

from .. import workload
from ..errors import Trn2ValueError


def _model(src: str) -> workload.Model:
    if os.path.exists(src) or src.endswith(".json"):
        return workload.Model.from_hf_config(src)
    return workload.Model(src)


def _train(args, model: workload.Model) -> int:
    machine = "ultraserver" if args.ultraserver else args.instance
    if args.global_batch is None:
        raise Trn2ValueError("--global-batch: needed with --train")
    tr = workload.Training(
        model,
        machine,
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        lnc=args.lnc,
        micro_batch=args.micro_batch,
        global_batch=args.global_batch,
        seq=args.seq,
        dtype=args.dtype,
        zero1=not args.no_zero1,
        recompute=args.recompute,
    )
    r = tr.step()
    _save(args, r, [r], ["train step"])
    out = {
        "model": model.name,
        "machine": machine,
        "tp": args.tp,
        "pp": args.pp,
        "dp": args.dp,
        "step_s": r.seconds,
        "tokens_per_s": r.tokens_per_s,
        "mfu": r.mfu,
        "bubble_fraction": r.bubble_fraction,
        "micro_batches": r.micro_batches,
        "uncertainty": r.uncertainty["text"],
        "memory_per_logical_core": r.memory,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(r)
    return 0


def _outputs_ready(args) -> None:
    """Checks, before any work, that --trace and --plot can be written (their optional
    packages, their suffixes)."""
    if args.trace:
        from .. import _perfetto

        _perfetto.require_for(args.trace)
    if args.plot:
        from .. import plot

        plot.check_plot_path(args.plot, "--plot")
        plot._pyplot()


def _save(args, trace_step, plot_steps, labels) -> None:
    if args.trace:
        trace_step.save_trace(args.trace)
    if args.plot:
        from .. import plot

        plot.breakdown(plot_steps, args.plot, labels=labels)


def cmd_estimate(args) -> int:
    _outputs_ready(args)
    model = _model(args.model)
    if args.train:
        return _train(args, model)
    if args.ultraserver:
        args.instance = "ultraserver"
    seq_len = args.seq_len or max(args.prefill + args.decode, 128)
    inf = workload.Inference(
        model,
        args.instance,
        tp=args.tp,
        ep=args.ep,
        lnc=args.lnc,
        batch=args.batch,
        dtype=args.dtype,
        seq_len=seq_len,
        sequence_parallel=args.sequence_parallel,
        serving=args.serving,
    )
    p = inf.prefill(args.prefill)
    d = inf.decode(args.prefill + args.decode // 2)
    _save(args, d, [p, d], ["prefill", "decode"])
    out = {
        "model": model.name,
        "machine": args.instance,
        "tp": args.tp,
        "lnc": args.lnc,
        "batch": args.batch,
        "dtype": args.dtype,
        "ttft_s": p.seconds,
        "tpot_s": d.seconds,
        "end_to_end_s": p.seconds + max(args.decode - 1, 0) * d.seconds,
        "prefill_bucket": p.bucket,
        "decode_bucket": d.bucket,
        "ttft_uncertainty": p.uncertainty["text"],
        "tpot_uncertainty": d.uncertainty["text"],
        "memory_per_logical_core": p.memory,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    ut, ud = out["ttft_uncertainty"], out["tpot_uncertainty"]
    print(
        f"{model.name} on {args.instance}, tp={args.tp}, lnc={args.lnc}, "
        f"batch={args.batch}, {args.dtype}"
    )
    print(f"time to first token  {p.seconds * 1e3:10.2f} ms  (bucket {p.bucket}; {ut})")
    print(f"time per token       {d.seconds * 1e3:10.3f} ms  (bucket {d.bucket}; {ud})")
    print(f"request end to end   {out['end_to_end_s']:10.3f} s")
    print()
    print(d.table())
    return 0


def cmd_plan(args) -> int:
    model = _model(args.model)
    constraints = {"prompt": args.prefill, "output": args.decode, "dtype": args.dtype}
    if args.lnc is not None:
        constraints["lnc"] = args.lnc
    r = workload.search(
        model,
        args.instance,
        objective=args.objective,
        constraints=constraints,
        price_per_hour=args.price_per_hour,
        train=args.train,
    )
    if args.json:
        print(json.dumps(r.to_dict()))
    else:
        print(f"{model.name} on {args.instance}: {r}")
    return 0


def add_commands(sub) -> None:
    """Adds ``trn2core estimate`` and ``trn2core plan`` to the CLI's subparsers."""
    e = sub.add_parser("estimate", help="time to first token and per token of a whole model")
    e.add_argument("model", help=f"a preset ({', '.join(workload.PRESETS)}) or a config.json")
    e.add_argument("--instance", default="trn2.48xlarge", help="trn2.48xlarge, ultraserver, ...")
    e.add_argument("--tp", type=int, required=True, help="tensor-parallel degree")
    e.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE)")
    e.add_argument("--lnc", type=int, default=2, help="logical core size (default 2)")
    e.add_argument("--batch", type=int, default=1)
    e.add_argument("--dtype", default="bf16", help="weights: bf16 or fp8")
    e.add_argument("--prefill", type=int, default=1024, help="prompt tokens")
    e.add_argument("--decode", type=int, default=256, help="output tokens")
    e.add_argument("--seq-len", type=int, default=None, help="compiled sequence length")
    e.add_argument("--sequence-parallel", action="store_true")
    e.add_argument("--serving", default="native", help="native or vllm")
    e.add_argument("--json", action="store_true", help="one JSON object (ttft_s, tpot_s, ...)")
    e.add_argument("--trace", default=None, help="a Perfetto trace of one decode (or train) step")
    e.add_argument("--plot", default=None, help="a stacked time breakdown (.png/.svg/.pdf)")
    e.add_argument("--ultraserver", action="store_true", help="the machine is one UltraServer")
    t = e.add_argument_group("training (--train)")
    t.add_argument("--train", action="store_true", help="one training step instead")
    t.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    t.add_argument("--dp", type=int, default=1, help="data-parallel degree")
    t.add_argument("--micro-batch", type=int, default=1)
    t.add_argument("--global-batch", type=int, default=None, help="sequences per step")
    t.add_argument("--seq", type=int, default=4096, help="tokens per sequence")
    t.add_argument("--recompute", choices=("full", "none"), default="full")
    t.add_argument("--no-zero1", action="store_true", help="replicate the optimizer states")
    e.set_defaults(func=cmd_estimate)
    p = sub.add_parser("plan", help="parallel layouts of a whole model ranked by an objective")
    p.add_argument("model", help=f"a preset ({', '.join(workload.PRESETS)}) or a config.json")
    p.add_argument("--instance", default="trn2.48xlarge", help="trn2.48xlarge, ultraserver, ...")
    p.add_argument("--objective", choices=("ttft", "itl", "throughput", "cost"), default="itl")
    p.add_argument("--price-per-hour", type=float, default=None, help="for --objective cost")
    p.add_argument("--lnc", type=int, default=None, help="only this LNC (default: 1 and 2)")
    p.add_argument("--prefill", type=int, default=1024, help="prompt tokens")
    p.add_argument("--decode", type=int, default=256, help="output tokens")
    p.add_argument("--dtype", default="bf16", help="weights: bf16 or fp8")
    p.add_argument("--train", action="store_true", help="rank training layouts")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_plan)
