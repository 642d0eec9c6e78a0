"""``trn2core estimate MODEL|config.json``: time to first token and time per output token of a
whole model on a Trn2 machine (docs/workload.md)."""

from __future__ import annotations

import json
import os

from .. import workload


def cmd_estimate(args) -> int:
    src = args.model
    if os.path.exists(src) or src.endswith(".json"):
        model = workload.Model.from_hf_config(src)
    else:
        model = workload.Model(src)
    seq_len = args.seq_len or max(args.prefill + args.decode, 128)
    inf = workload.Inference(
        model, args.instance, tp=args.tp, ep=args.ep, lnc=args.lnc, batch=args.batch,
        dtype=args.dtype, seq_len=seq_len, sequence_parallel=args.sequence_parallel,
        serving=args.serving,
    )  # fmt: skip
    p = inf.prefill(args.prefill)
    d = inf.decode(args.prefill + args.decode // 2)
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


def add_commands(sub) -> None:
    """Adds ``trn2core estimate`` to the CLI's subparsers."""
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
    e.set_defaults(func=cmd_estimate)
