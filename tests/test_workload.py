"""Whole models: models from presets and config.json, time to first
token and time per output token composed from the per-op models, the memory plan, bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trn2core
from cli_inprocess import run_cli
from trn2core import workload
from trn2core.errors import CapacityError, Trn2ValueError

LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0},
    "torch_dtype": "bfloat16",
}


def test_a_config_and_its_preset_are_the_same_model(tmp_path):
    a = workload.Model("llama-3.1-8b")
    b = workload.Model.from_hf_config(LLAMA_8B_CONFIG)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG))
    c = workload.Model.from_hf_config(tmp_path)  # the directory holding config.json
    # Llama-3.1-8B has 8,030,261,248 parameters; the model leaves out the norms' 266,240.
    assert a.parameters == b.parameters == c.parameters == 8_030_261_248 - 266_240
    assert b.to_dict()["head_dim"] == 128
    ia = workload.Inference(a, tp=8).decode(100).seconds
    ib = workload.Inference(b, tp=8).decode(100).seconds
    assert ia == ib > 0


def test_llama4_text_config_is_read():
    cfg = {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 5120,
            "num_hidden_layers": 48,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 8192,
            "intermediate_size_mlp": 16384,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1,
            "vocab_size": 202048,
        },
    }
    m = workload.Model.from_hf_config(cfg)
    assert m.parameters == workload.Model("llama-4-scout").parameters
    assert m.to_dict()["moe_layers"] == 48


@pytest.mark.parametrize(
    ("drop", "field"),
    [
        ("hidden_size", "hidden_size"),
        ("vocab_size", "vocab_size"),
        ("intermediate_size", "intermediate_size"),
    ],
)
def test_a_config_missing_a_field_names_it(drop, field):
    cfg = {k: v for k, v in LLAMA_8B_CONFIG.items() if k != drop}
    with pytest.raises(Trn2ValueError, match=field):
        workload.Model.from_hf_config(cfg)
    with pytest.raises(Trn2ValueError, match="num_key_value_heads"):
        workload.Model.from_hf_config({**LLAMA_8B_CONFIG, "num_key_value_heads": 5})
    with pytest.raises(Trn2ValueError, match="hidden_size"):
        workload.Model.from_hf_config({**LLAMA_8B_CONFIG, "hidden_size": True})
    with pytest.raises(Trn2ValueError, match="model"):
        workload.Model("gpt-5")


def test_bad_layouts_name_both_numbers():
    m = workload.Model("llama-3.3-70b")
    with pytest.raises(Trn2ValueError, match=r"tp=128.*64"):
        workload.Inference(m, "trn2.48xlarge", tp=128).decode(10)
    # Heads need not divide (padded, below); the MLP's columns must.
    with pytest.raises(Trn2ValueError, match=r"tp=48.*intermediate_size=28672"):
        workload.Inference(m, "ultraserver", tp=48).decode(10)
    with pytest.raises(Trn2ValueError, match="ep"):
        workload.Inference(m, tp=64, ep=2).decode(10)
    with pytest.raises(Trn2ValueError, match="dtype"):
        workload.Inference(m, tp=64, dtype="int4")
    with pytest.raises(Trn2ValueError, match="tokens"):
        workload.Inference(m, tp=64, seq_len=4096).prefill(5000)
    with pytest.raises(Trn2ValueError, match="machine"):
        workload.Inference(m, "p5.48xlarge", tp=8).decode(10)


def test_a_plan_that_does_not_fit_is_a_capacity_error_naming_the_biggest_item():
    m = workload.Model("llama-3.1-405b")
    with pytest.raises(CapacityError, match="weights") as e:
        workload.Inference(m, "trn2.3xlarge", tp=4).memory()
    assert "GiB" in str(e.value)
    with pytest.raises(CapacityError, match="weights"):  # before anything is estimated
        workload.Inference(m, "trn2.3xlarge", tp=4).decode(10)
    plan = workload.Inference(m, "trn2.48xlarge", tp=64, seq_len=12800).memory()
    # A 64th of the weights, and the K/V projections of the rank's KV head, which 8 ranks share
    # (8 KV heads over 64 ranks: each rank holds a whole head).
    kv_replicated = (1 - 8 / 64) * 2 * 16384 * 128 * 126 * 2
    assert plan["items"]["weights"] == pytest.approx(405.9e9 * 2 / 64 + kv_replicated, rel=0.01)
    assert plan["total_bytes"] < plan["capacity_bytes"] == 24 << 30


def test_the_runtime_reserve_is_its_own_item_and_trinity_large_needs_tp64():
    # Trinity-Large's contrib README: TP=32 does not fit ("no room for scratchpad/KV cache"),
    # TP=64 runs. 96 MiB of runtime micro-code and a 512 MiB scratchpad page on each of the
    # logical core's two physical cores, the activations inside the pages.
    mib = 1 << 20
    m = workload.Model("trinity-large")
    with pytest.raises(CapacityError, match="weights") as e:
        workload.Inference(m, "trn2.48xlarge", tp=32, seq_len=2048, prefill_buckets=[2048]).memory()
    assert e.value.arg == "weights" and "24 GiB" in str(e.value)
    plan = workload.Inference(
        m, "trn2.48xlarge", tp=64, seq_len=2048, prefill_buckets=[2048]
    ).memory()
    items = plan["items"]
    assert list(items) == ["weights", "kv_cache", "activations", "runtime_reserve"]
    assert items["runtime_reserve"] == 2 * 96 * mib + 2 * 512 * mib - items["activations"]
    assert plan["total_bytes"] == sum(items.values())
    assert trn2core.spec.runtime_microcode_bytes_per_core == 96 * mib
    assert trn2core.spec.runtime_scratchpad_page_bytes == 512 * mib
    # Without the reserve TP=32 would fit: weights, KV cache and activations alone are 23.4 GiB.
    lnc1 = workload.Inference("llama-3.1-8b", "trn2.48xlarge", tp=8, lnc=1).memory()
    assert lnc1["items"]["runtime_reserve"] == 96 * mib + 512 * mib - lnc1["items"]["activations"]


def test_every_published_configuration_fits():
    # Every model configuration of benches/fidelity/published.toml ran on Trainium2: each
    # memory plan, runtime reserve included, must fit.
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    table = Path(__file__).resolve().parents[1] / "benches" / "fidelity" / "published.toml"
    points = tomllib.loads(table.read_text(encoding="utf-8"))["point"]
    rows = [p for p in points if p["kind"] == "model" and p["use"] != "excluded"]
    assert len(rows) >= 30
    for p in rows:
        plan = workload.Inference(
            p["model"],
            p["machine"],
            tp=p["tp"],
            lnc=p["lnc"],
            batch=p["batch"],
            dtype=p["dtype"],
            seq_len=p["seq_len"],
            prefill_buckets=p.get("prefill_buckets"),
        ).memory()
        assert plan["total_bytes"] <= plan["capacity_bytes"], p["id"]
        assert plan["items"]["runtime_reserve"] >= 2 * 96 << 20, p["id"]


def test_decode_composes_the_per_op_models():
    m = workload.Model("llama-3.3-70b")
    inf = workload.Inference(m, trn2core.Instance("trn2.48xlarge"), tp=64, seq_len=12800)
    d = inf.decode(10_000)
    assert d.bucket == 12800
    assert d.seconds == pytest.approx(sum(o["total_s"] for o in d.ops), rel=1e-12)
    kinds = d.by_kind()
    assert set(kinds) >= {"gemm", "attention", "norm", "collective", "fixed"}
    assert "kv_read" not in kinds  # the attention kernel reads the KV cache itself
    # In-graph all-reduces: tens of microseconds, where a standalone launch costs ~300 us.
    ar = [o for o in d.ops if o["name"] == "all_reduce"]
    assert sum(o["count"] for o in ar) == 160
    assert 10e-6 < ar[0]["seconds"] < 50e-6
    naive = workload.Inference(m, tp=64, seq_len=12800, naive=True).decode(10_000)
    assert naive.seconds > 2 * d.seconds
    assert "published cases within" in str(d) and "all_reduce" in d.table()
    assert d.to_dict()["uncertainty"]["basis"] == "workload_decode"
    assert "<pre>" in d._repr_html_()


def test_prefill_pads_to_the_bucket():
    m = workload.Model("qwen3-32b")
    inf = workload.Inference(m, tp=64, seq_len=6400)
    a, b = inf.prefill(129), inf.prefill(256)
    assert a.bucket == b.bucket == 256 and a.seconds == b.seconds
    assert inf.prefill(128).seconds < a.seconds
    vllm = workload.Inference(m, tp=64, seq_len=6400, serving="vllm")
    extra = vllm.prefill(128).seconds - inf.prefill(128).seconds
    assert extra == pytest.approx(trn2core.spec.serving_vllm_request_overhead_s)


def test_fp8_weights_and_lnc1():
    m = workload.Model("llama-3.1-8b")
    bf16 = workload.Inference(m, tp=8).decode(2000)
    fp8 = workload.Inference(m, tp=8, dtype="fp8").decode(2000)
    assert fp8.seconds < bf16.seconds
    lnc1 = workload.Inference(m, tp=8, lnc=1).memory()
    assert lnc1["capacity_bytes"] == 12 << 30


def test_cli_estimate_prints_ttft_and_tpot_as_json(capsys):
    from trn2core.cli import main

    argv = [
        "estimate",
        "llama-3.3-70b",
        "--instance",
        "trn2.48xlarge",
        "--tp",
        "64",
        "--prefill",
        "10000",
        "--decode",
        "1500",
        "--lnc",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    inf = workload.Inference("llama-3.3-70b", tp=64, seq_len=11500)
    assert out["ttft_s"] == inf.prefill(10000).seconds
    assert out["tpot_s"] == inf.decode(10750).seconds
    assert main(argv[:5] + ["128"] + argv[6:]) == 2
    assert "Trn2ValueError: tp: tp=128 needs 128 logical cores" in capsys.readouterr().err


def test_training_step_reports_mfu_bubble_and_no_published_case():
    tr = workload.Training(
        "llama-3.3-70b", "ultraserver", tp=16, pp=4, dp=4, global_batch=64, seq=4096
    )
    r = tr.step()
    assert r.micro_batches == 16
    assert r.bubble_fraction == pytest.approx(3 / 19)
    assert 0.0 < r.mfu <= 1.0
    assert r.tokens_per_s == pytest.approx(64 * 4096 / r.seconds)
    assert sum(o["total_s"] for o in r.ops) == pytest.approx(r.seconds)
    assert "no published case" in r.uncertainty["text"]
    assert set(r.memory["items"]) == {
        "weights",
        "gradients",
        "optimizer_states",
        "activations",
        "runtime_reserve",
    }
    assert "MFU" in str(r)


def test_training_bad_layouts_name_both_numbers():
    with pytest.raises(Trn2ValueError, match=r"tp\*pp\*dp = 16\*4\*4 = 256.*has 64"):
        workload.Training(
            "llama-3.3-70b", "trn2.48xlarge", tp=16, pp=4, dp=4, global_batch=64, seq=4096
        ).step()
    with pytest.raises(Trn2ValueError, match=r"global_batch=30 .* = 4"):
        workload.Training(
            "llama-3.3-70b", "ultraserver", tp=16, pp=4, dp=4, global_batch=30, seq=4096
        ).step()
    with pytest.raises(Trn2ValueError, match="recompute"):
        workload.Training("llama-3.1-8b", tp=8, global_batch=8, seq=128, recompute="some")
    with pytest.raises(CapacityError, match="optimizer_states"):
        workload.Training("llama-3.3-70b", "trn2.48xlarge", tp=1, global_batch=1, seq=4096).step()


def test_search_best_itl_is_no_slower_than_any_returned_layout():
    r = workload.search("llama-3.3-70b", "trn2.48xlarge", objective="itl")
    rows = r.layouts
    assert len(rows) > 5
    assert all(r.best["itl_s"] <= c["itl_s"] for c in rows)
    assert r.tried == len(rows) + r.skipped_capacity + r.skipped_invalid + r.skipped_constraints
    assert r.skipped_capacity > 0  # tp=1 cannot hold 70B in bf16
    assert all(c["tp"] > 1 for c in rows)
    capped = workload.search(
        "llama-3.3-70b",
        "trn2.48xlarge",
        objective="ttft",
        constraints={"max_itl_s": r.best["itl_s"] * 1.5},
    )
    assert capped.skipped_constraints > 0
    assert all(c["itl_s"] <= r.best["itl_s"] * 1.5 for c in capped.layouts)
    with pytest.raises(Trn2ValueError, match="price_per_hour"):
        workload.search("llama-3.1-8b", objective="cost")
    with pytest.raises(Trn2ValueError, match="constraints: unknown keys"):
        workload.search("llama-3.1-8b", constraints={"tensor_parallel": 8})


def test_search_cost_uses_the_price_and_training_fills_the_machine():
    r = workload.search(
        "llama-3.1-8b", objective="cost", price_per_hour=36.0, constraints={"tp": [8, 16], "lnc": 2}
    )
    best = r.best
    assert best["cost_per_mtok"] == pytest.approx(0.01 * 1e6 / best["tokens_per_s"])
    assert all(best["cost_per_mtok"] <= c["cost_per_mtok"] for c in r.layouts)
    space = {"tp": 8, "lnc": 2, "global_batch": 64, "seq": 2048}
    t = workload.search("llama-3.1-8b", objective="throughput", train=True, constraints=space)
    assert t.layouts and all(c["tp"] * c["pp"] * c["dp"] == 64 for c in t.layouts)
    assert all(t.best["tokens_per_s"] >= c["tokens_per_s"] for c in t.layouts)


def _cli(command: str, *more: str) -> subprocess.CompletedProcess:
    """``trn2core COMMAND MORE...`` (COMMAND split at spaces), run in this process."""
    return run_cli(*command.split(), *more)


def test_cli_estimate_train_and_plan():
    r = _cli(
        "estimate llama-3.3-70b --train --ultraserver --tp 16 --pp 4 --dp 4 --global-batch 64"
        " --seq 4096 --json"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bubble_fraction"] == pytest.approx(3 / 19)
    assert 0 < out["mfu"] <= 1 and out["step_s"] > 0
    r = _cli("estimate llama-3.3-70b --train --tp 16 --pp 4 --dp 4 --global-batch 64")
    assert r.returncode == 2 and "256" in r.stderr and "64" in r.stderr
    r = _cli("estimate llama-3.3-70b --train --tp 1 --global-batch 1")
    assert r.returncode == 1 and "CapacityError" in r.stderr
    r = _cli(
        "plan llama-3.1-8b --instance trn2.48xlarge --objective cost --price-per-hour 36 --json"
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["objective"] == "cost" and plan["layouts"]
    costs = [c["cost_per_mtok"] for c in plan["layouts"]]
    assert costs == sorted(costs)
    r = _cli("plan llama-3.1-8b --objective speed")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = _cli("plan llama-3.1-8b --objective cost")
    assert r.returncode == 2 and "price_per_hour" in r.stderr


def test_decode_trace_has_a_track_per_component_and_sums_to_the_step(tmp_path):
    inf = workload.Inference("llama-3.1-8b", "trn2.48xlarge", tp=8, seq_len=2048)
    d = inf.decode(1000)
    path = d.save_trace(tmp_path / "decode.json")
    events = json.loads(open(path).read())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert tracks == {o["kind"] for o in d.ops} | {"fixed"}
    slices = [e for e in events if e["ph"] == "X"]
    # Every layer's ops and the step's: 32 dense layers.
    assert sum(1 for e in slices if e["name"] == "qkv_proj") == 32
    end = max(e["ts"] + e["dur"] for e in slices)
    assert end == pytest.approx(d.seconds * 1e6, rel=1e-9)
    with pytest.raises(Trn2ValueError, match="path"):
        d.save_trace(None)


def test_training_trace_is_the_1f1b_schedule_and_ends_at_the_step(tmp_path):
    # PP=4, 8 micro-batches (64 sequences, micro-batch 2, DP=4) on an UltraServer.
    tr = workload.Training(
        "llama-3.3-70b", "ultraserver", tp=16, pp=4, dp=4, micro_batch=2, global_batch=64, seq=4096
    )
    r = tr.step()
    assert r.micro_batches == 8
    path = r.save_trace(tmp_path / "train.json")
    events = json.loads(open(path).read())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert sorted(names.values()) == ["dp", "stage 0", "stage 1", "stage 2", "stage 3", "step"]
    slices = [e for e in events if e["ph"] == "X"]
    d = r.to_dict()
    assert (r.forward_s, r.backward_s, r.dp_reduce_s) == (
        d["forward_s"],
        d["backward_s"],
        d["dp_reduce_s"],
    )
    assert 0 <= r.dp_exposed_s <= r.dp_reduce_s and r.forward_s < r.backward_s
    mb_s = d["forward_s"] + d["backward_s"]  # and the stage boundary's transfers
    for s in range(4):
        row = sorted((e for e in slices if names[e["tid"]] == f"stage {s}"), key=lambda e: e["ts"])
        work = [e["name"] for e in row if e["name"] != "bubble"]
        assert sum(n.startswith("F") for n in work) == 8
        assert sum(n.startswith("B") for n in work) == 8
        # 1F1B: 3 - s forwards, then one forward and one backward in turn, then backwards.
        warm = 3 - s
        want = [f"F{i}" for i in range(warm)]
        for i in range(8 - warm):
            want += [f"F{warm + i}", f"B{i}"]
        want += [f"B{i}" for i in range(8 - warm, 8)]
        assert work == want, s
        # The bubble: each stage idles 3 micro-batch times of the 11 the pipeline takes.
        idle = sum(e["dur"] for e in row if e["name"] == "bubble") / 1e6
        busy = sum(e["dur"] for e in row if e["name"] != "bubble") / 1e6
        assert idle / (idle + busy) == pytest.approx(r.bubble_fraction, rel=1e-9)
        assert busy / 8 == pytest.approx(mb_s, rel=0.05)
    end = max(e["ts"] + e["dur"] for e in slices)
    assert end == pytest.approx(r.seconds * 1e6, rel=1e-9)
    # The DP gradient reduce-scatter runs beside stage 0's last backward.
    (dp,) = [e for e in slices if names[e["tid"]] == "dp"]
    last_b = max((e for e in slices if names[e["tid"]] == "stage 0"), key=lambda e: e["ts"])
    assert last_b["name"] == "B7"
    assert dp["ts"] > last_b["ts"] and dp["ts"] < last_b["ts"] + last_b["dur"]
    assert dp["dur"] / 1e6 == pytest.approx(d["dp_reduce_s"], rel=1e-9)
    first = r.schedule[0]
    assert (first["stage"], first["name"], first["micro_batch"], first["start_s"]) == (
        0,
        "forward",
        0,
        0.0,
    )
    assert d["forward_s"] <= first["seconds"] < 1.1 * d["forward_s"]  # and its send onwards
    with pytest.raises(Trn2ValueError, match="path"):
        r.save_trace(None)
    # The CLI writes the same trace.
    trace = tmp_path / "cli.json"
    layout = "--tp 16 --pp 4 --dp 4 --micro-batch 2 --global-batch 64"
    c = _cli(f"estimate llama-3.3-70b --train --ultraserver {layout} --trace", str(trace))
    assert c.returncode == 0, c.stderr
    cli_events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in cli_events) == len(slices)


def test_breakdown_plot_and_cli_trace_and_plot(tmp_path):
    from trn2core import plot

    inf = workload.Inference("llama-3.1-8b", "trn2.48xlarge", tp=8, seq_len=2048)
    p, d = inf.prefill(1000), inf.decode(1000)
    assert p.model == d.model == "Llama-3.1-8B"  # the plot's title
    out = plot.breakdown([p, d], tmp_path / "b.png", labels=["prefill", "decode"])
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(Trn2ValueError, match="labels"):
        plot.breakdown([p, d], tmp_path / "c.png", labels=["one"])
    with pytest.raises(Trn2ValueError, match="suffixes"):
        plot.breakdown(d, tmp_path / "c.txt")
    trace, png = tmp_path / "t.json", tmp_path / "p.svg"
    r = _cli("estimate llama-3.1-8b --tp 8 --trace", str(trace), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    assert json.loads(trace.read_text())["traceEvents"] and png.read_text().startswith("<?xml")
    r = _cli("estimate llama-3.1-8b --tp 8 --plot", str(tmp_path / "p.bmp"))
    assert r.returncode == 2 and "--plot" in r.stderr


def test_the_search_has_a_pareto_front_and_its_plot(tmp_path):
    from trn2core import plot

    r = workload.search("llama-3.1-8b", "trn2.48xlarge", objective="itl")
    rows, front = r.layouts, r.pareto()
    assert 1 < len(front) < len(rows)
    # Fastest first, throughput rising along the front; no layout beats a front member on both.
    assert [c["itl_s"] for c in front] == sorted(c["itl_s"] for c in front)
    assert all(
        a["tokens_per_s"] < b["tokens_per_s"] for a, b in zip(front, front[1:], strict=False)
    )
    for f in front:
        assert not any(
            c["itl_s"] <= f["itl_s"] and c["tokens_per_s"] > f["tokens_per_s"] for c in rows
        )
    # Every other layout is beaten (or matched) on both by one on the front.
    for c in rows:
        assert any(
            f["itl_s"] <= c["itl_s"] and f["tokens_per_s"] >= c["tokens_per_s"] for f in front
        )
    assert front[0]["itl_s"] == min(c["itl_s"] for c in rows)
    assert front[-1]["tokens_per_s"] == max(c["tokens_per_s"] for c in rows)
    out = plot.pareto(r, tmp_path / "front.png")
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(Trn2ValueError, match="result"):
        plot.pareto(rows, tmp_path / "x.png")
    with pytest.raises(Trn2ValueError, match="suffixes"):
        plot.pareto(r, tmp_path / "x.txt")
    none = workload.search("llama-3.1-8b", "trn2.48xlarge", constraints={"max_itl_s": 1e-9})
    assert none.pareto() == []
    with pytest.raises(Trn2ValueError, match="no layouts"):
        plot.pareto(none, tmp_path / "y.png")


def test_attention_heads_are_padded_to_tp_as_nxd_inference_pads_them():
    # NxD Inference runs Trinity-Large's 48 heads at TP=64, one (padded) head per rank: the
    # step costs what 64 heads cost at TP=64, and more than 48 heads at TP=48 would per rank.
    cfg = {
        "hidden_size": 3072,
        "num_hidden_layers": 4,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 200192,
    }
    step = {}
    for heads in (48, 64):
        m = workload.Model.from_hf_config({**cfg, "num_attention_heads": heads})
        step[heads] = workload.Inference(m, "trn2.48xlarge", tp=64).decode(100).seconds
    assert step[48] == step[64] > 0
    large = workload.Model("trinity-large")
    d = large.to_dict()
    assert (d["num_attention_heads"], d["num_experts"]) == (48, 256)
    r = workload.Inference(large, "trn2.48xlarge", tp=64, seq_len=2048).decode(64)
    assert r.seconds > 0


def test_trinity_presets_are_their_configs_field_names():
    # The presets read Trinity's own config names (`num_dense_layers`, `num_shared_experts`),
    # as a user's config.json of the model would give them.
    mini = workload.Model("trinity-mini")
    d = mini.to_dict()
    assert (d["hidden_size"], d["num_hidden_layers"], d["moe_intermediate_size"]) == (
        2048,
        32,
        1024,
    )
    assert (d["shared_experts"], d["moe_layers"]) == (1, 30)
    assert round(mini.parameters / 1e9, 1) == 25.9
    cfg = {
        "hidden_size": 2048,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 1024,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_shared_experts": 1,
        "num_dense_layers": 2,
        "vocab_size": 200192,
        "tie_word_embeddings": False,
    }
    mine = workload.Model.from_hf_config(cfg).to_dict()
    assert mine == {**d, "name": mine["name"]}
    # A config's fields go straight into an estimate too.
    step = workload.Inference(cfg, "trn2.3xlarge", tp=4, seq_len=2048).decode(64).seconds
    assert step == workload.Inference(mini, "trn2.3xlarge", tp=4, seq_len=2048).decode(64).seconds


@pytest.mark.parametrize("tp", [1, 8])
def test_heads_of_64_decode(tp):
    # Llama-3.2-1B's shape (head_dim 64): the token-generation kernel's output lies on 64
    # partitions; decode used to fail inside the kernel with a ShapeError of its own.
    cfg = dict(LLAMA_8B_CONFIG, hidden_size=2048, num_attention_heads=32, intermediate_size=8192)
    cfg.update(num_hidden_layers=16, head_dim=64)
    inf = workload.Inference(workload.Model.from_hf_config(cfg), tp=tp, seq_len=2048)
    short, long = inf.decode(100).seconds, inf.decode(2000).seconds
    assert 0 < short < long


def test_an_estimate_is_flat_in_the_number_of_layers():
    # The "memory flat in the number of layers": a step is composed per kind of layer
    # (count x time), so 1,000 times the layers gives the same rows, the same Python memory,
    # and about 1,000 times the layers' time.
    import tracemalloc

    cfg = dict(LLAMA_8B_CONFIG, hidden_size=512, num_attention_heads=8, num_key_value_heads=8)
    cfg.update(intermediate_size=1024, vocab_size=32000, head_dim=64)
    runs = []
    for layers in (8, 8000):
        model = workload.Model.from_hf_config(dict(cfg, num_hidden_layers=layers))
        inf = workload.Inference(model, tp=8, seq_len=256)
        inf.decode(100)  # the per-shape kernel timings, cached once
        tracemalloc.start()
        r = inf.decode(100)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        layer_s = sum(o["total_s"] for o in r.ops if o["scope"] != "step")
        runs.append((len(r.ops), peak, layer_s))
    (rows8, peak8, s8), (rows8k, peak8k, s8k) = runs
    assert rows8 == rows8k and peak8k < 2 * peak8
    assert s8k == pytest.approx(1000 * s8, rel=1e-9)
