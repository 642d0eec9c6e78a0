use super::*;
use crate::numerics::Format;
use crate::spec::WORKLOAD_OP_FIXED_S;

fn layout(machine: &str, tp: usize, seq_len: u64) -> Layout {
    let machine = Machine::named(machine).expect("machine");
    Layout::native(machine, tp, 1, 2, 1, Format::Bf16, seq_len)
}

#[test]
fn decode_is_the_sum_of_its_ops_and_reads_every_weight_once() {
    let m = Model::preset("llama-3.3-70b").expect("preset");
    let l = layout("trn2.48xlarge", 64, 12800);
    let d = decode(&m, &l, 10_000).expect("decode");
    let sum: f64 = d.ops.iter().map(OpTime::total_s).sum();
    assert!((d.seconds - sum).abs() < 1e-12);
    assert_eq!(d.bucket, 12800);
    // The GEMMs read the rank's weights (bf16) once per step: the memory plan's weights less
    // the embedding, which the step does not read.
    let gemm_bytes: f64 =
        d.ops.iter().filter(|o| o.kind == "gemm").map(|o| o.count as f64 * o.hbm_bytes).sum();
    let weights = d.memory.items[0].bytes as f64;
    let embed = (128_256f64 / 64.0).ceil() * 8192.0 * 2.0;
    assert!((gemm_bytes / (weights - embed) - 1.0).abs() < 0.02, "{gemm_bytes} {weights}");
    // Two all-reduces per layer, in-graph: far below the standalone nccom-test floor.
    let ar: Vec<&OpTime> = d.ops.iter().filter(|o| o.name == "all_reduce").collect();
    assert_eq!(ar.iter().map(|o| o.count).sum::<u64>(), 160);
    assert!(ar[0].seconds < 50e-6 && ar[0].seconds > 10e-6, "{}", ar[0].seconds);
    let mut naive = l.clone();
    naive.naive = true;
    let n = decode(&m, &naive, 10_000).expect("decode");
    let nar = n.ops.iter().find(|o| o.name == "all_reduce").expect("ar");
    assert!(nar.seconds > 250e-6, "standalone: {}", nar.seconds);
}

#[test]
fn decode_grows_with_context_and_fp8_halves_the_weight_reads() {
    let m = Model::preset("llama-3.1-8b").expect("preset");
    let l = layout("trn2.3xlarge", 4, 32768);
    let short = decode(&m, &l, 1000).expect("decode");
    let long = decode(&m, &l, 30000).expect("decode");
    assert!(long.seconds > short.seconds);
    assert_eq!((short.bucket, long.bucket), (1024, 32768));
    let mut f = l.clone();
    f.weights = Format::Fp8E4m3;
    let fp8 = decode(&m, &f, 1000).expect("decode");
    let bytes = |r: &StepReport| -> f64 {
        r.ops.iter().filter(|o| o.kind == "gemm").map(|o| o.count as f64 * o.hbm_bytes).sum()
    };
    let ratio = bytes(&fp8) / bytes(&short);
    assert!(ratio > 0.45 && ratio < 0.6, "{ratio}");
    assert!(fp8.seconds < short.seconds);
    assert!(fp8.memory.items[0].bytes * 2 > short.memory.items[0].bytes * 9 / 10);
}

#[test]
fn prefill_pads_to_the_bucket_and_is_compute_bound() {
    let m = Model::preset("llama-3.3-70b").expect("preset");
    let mut l = layout("trn2.48xlarge", 64, 12800);
    l.prefill_buckets = vec![2048, 4096, 8192, 12288];
    l.sequence_parallel = true;
    let a = prefill(&m, &l, 8193).expect("prefill");
    let b = prefill(&m, &l, 12288).expect("prefill");
    assert_eq!(a.bucket, 12288);
    assert_eq!(a.seconds, b.seconds);
    let flops: f64 = a.ops.iter().map(|o| o.count as f64 * o.flops).sum();
    // 2 x params x tokens / 64 ranks, plus attention: between 1x and 1.3x the weights' FLOPs.
    let weights = 2.0 * 69.5e9 * 12288.0 / 64.0;
    assert!(flops > weights && flops < 1.3 * weights, "{flops} {weights}");
    let e = prefill(&m, &l, 12289).expect_err("no bucket");
    assert_eq!(arg_of(&e), Some("tokens"));
    // Sequence parallelism replaces each all-reduce by a reduce-scatter and an all-gather.
    assert!(a.ops.iter().any(|o| o.name == "reduce_scatter"));
    assert!(!a.ops.iter().any(|o| o.name == "all_reduce"));
}

#[test]
fn moe_touches_the_experts_its_tokens_route_to() {
    let m = Model::preset("qwen3-30b-a3b").expect("preset");
    let l = layout("trn2.48xlarge", 16, 4096);
    let d = decode(&m, &l, 100).expect("decode");
    let up = d.ops.iter().find(|o| o.name.starts_with("experts_gate_up")).expect("experts");
    assert_eq!(up.name, "experts_gate_up (x8)");
    // Prefill is NxD's blockwise matmul: ceil((4096 * 8 - 127) / 512) + 127 = 191 blocks of
    // 512 tokens in each of the 48 layers (95 with 32 experts a rank at ep=4), each block's
    // four ops with their fixed cost.
    let blocks = |r: &StepReport, name: &str| {
        r.ops.iter().find(|o| o.name == name).map(|o| (o.count, o.fixed_s))
    };
    let p = prefill(&m, &l, 4096).expect("prefill");
    for op in
        ["expert_block_gather", "expert_block_gate_up", "expert_block_down", "expert_block_add"]
    {
        assert_eq!(blocks(&p, op), Some((48 * 191, WORKLOAD_OP_FIXED_S)), "{op}");
    }
    assert!(!p.ops.iter().any(|o| o.name.starts_with("experts_gate_up")));
    let mut ep = l.clone();
    ep.ep = 4;
    let pe = prefill(&m, &ep, 4096).expect("prefill");
    assert_eq!(blocks(&pe, "expert_block_down"), Some((48 * 95, WORKLOAD_OP_FIXED_S)));
}

#[test]
fn bad_layouts_name_both_numbers() {
    let m = Model::preset("llama-3.3-70b").expect("preset");
    let e = decode(&m, &layout("trn2.48xlarge", 128, 4096), 10).expect_err("too many");
    assert_eq!(arg_of(&e), Some("tp"));
    assert!(e.to_string().contains("128") && e.to_string().contains("64"), "{e}");
    // 64 heads at tp=48 are padded (NxD Inference's rule); the MLP's 28672 columns are not.
    let e = decode(&m, &layout("ultraserver", 48, 4096), 10).expect_err("intermediate");
    assert!(
        e.to_string().contains("48") && e.to_string().contains("intermediate_size=28672"),
        "{e}"
    );
    let e = decode(&m, &layout("trn2.48xlarge", 3, 4096), 10).expect_err("3");
    assert_eq!(arg_of(&e), Some("tp"));
    let mut l = layout("trn2.48xlarge", 64, 4096);
    l.ep = 2;
    let e = decode(&m, &l, 10).expect_err("dense model");
    assert_eq!(arg_of(&e), Some("ep"));
    let e = Machine::named("p5.48xlarge").expect_err("not trn2");
    assert_eq!(arg_of(&e), Some("machine"));
}

#[test]
fn a_plan_that_does_not_fit_names_its_biggest_item() {
    let m = Model::preset("llama-3.1-405b").expect("preset");
    // 810 GB of weights on 4 logical cores of one chip.
    let e = decode(&m, &layout("trn2.3xlarge", 4, 4096), 10).expect_err("too big");
    assert!(matches!(e, crate::Error::Capacity { .. }));
    assert_eq!(arg_of(&e), Some("weights"));
    // The KV cache of a long context at a large batch.
    let m = Model::preset("llama-3.1-8b").expect("preset");
    let mut l = layout("trn2.48xlarge", 8, 131072);
    l.batch = 64;
    let e = memory(&m, &l).expect_err("kv");
    assert_eq!(arg_of(&e), Some("kv_cache"));
    let l = layout("trn2.48xlarge", 64, 12800);
    let plan = memory(&Model::preset("llama-3.3-70b").expect("p"), &l).expect("fits");
    assert!(plan.total_bytes < plan.capacity_bytes);
    assert_eq!(plan.capacity_bytes, 24 << 30);
}

#[test]
fn the_runtime_reserve_is_microcode_and_whole_scratchpad_pages() {
    const MIB: u64 = 1 << 20;
    // LNC=2: 96 MiB of micro-code and a 512 MiB scratchpad page on each physical core, the
    // activations inside the pages.
    assert_eq!(runtime_reserve(2, 0).expect("r"), 2 * 96 * MIB + 1024 * MIB);
    assert_eq!(runtime_reserve(2, 30 * MIB).expect("r"), 2 * 96 * MIB + 994 * MIB);
    assert_eq!(runtime_reserve(1, 0).expect("r"), 96 * MIB + 512 * MIB);
    // 1.5 GiB of activations a core fill three pages each, 1 MiB more takes a fourth.
    assert_eq!(runtime_reserve(2, 3 << 30).expect("r"), 2 * 96 * MIB);
    let acts = (3 << 30) + 2 * MIB;
    assert_eq!(runtime_reserve(2, acts).expect("r"), 2 * 96 * MIB + (4 << 30) - acts);
    assert_eq!(runtime_reserve(1, 1024 * MIB).expect("r"), 96 * MIB);
    // Trinity-Large at TP=32 (its contrib README: does not fit, no room for the scratchpad):
    // 23.4 GiB of weights, KV cache and activations, and 1.16 GiB of runtime.
    let m = Model::preset("trinity-large").expect("preset");
    let mut l = layout("trn2.48xlarge", 32, 2048);
    l.prefill_buckets = vec![2048];
    let e = memory(&m, &l).expect_err("does not fit");
    assert!(matches!(e, crate::Error::Capacity { .. }));
    assert_eq!(arg_of(&e), Some("weights"));
    l.tp = 64;
    let plan = memory(&m, &l).expect("fits at TP=64");
    let names: Vec<_> = plan.items.iter().map(|i| i.name).collect();
    assert_eq!(names, ["weights", "kv_cache", "activations", "runtime_reserve"]);
    let reserve = plan.items[3].bytes;
    assert_eq!(reserve, 2 * 96 * MIB + 1024 * MIB - plan.items[2].bytes);
    assert_eq!(plan.total_bytes, plan.items.iter().map(|i| i.bytes).sum::<u64>());
}

#[test]
fn layers_of_one_kind_are_costed_once() {
    // Time grows linearly with layers; the breakdown has one row per op and layer kind.
    let small = Model::preset("llama-3.1-8b").expect("preset");
    let mut big = small.clone();
    big.layers *= 4;
    let l = layout("trn2.48xlarge", 32, 4096);
    let a = decode(&small, &l, 100).expect("decode");
    let b = decode(&big, &l, 100).expect("decode");
    assert_eq!(a.ops.len(), b.ops.len());
    let per_layer = |r: &StepReport| -> f64 {
        r.ops.iter().filter(|o| o.scope != "step").map(OpTime::total_s).sum()
    };
    assert!((per_layer(&b) / per_layer(&a) - 4.0).abs() < 1e-9);
}

#[test]
fn decode_attention_is_the_kernels_blocks_and_doubles_with_the_context() {
    use super::kernels::{attention_tkg_run, attention_tkg_times, tkg_block_keys, AttentionShape};
    let attn = |m: &Model, l: &Layout, ctx: u64| -> f64 {
        let d = decode(m, l, ctx).expect("decode");
        assert!(!d.ops.iter().any(|o| o.kind == "kv_read"), "read by the kernel");
        d.ops
            .iter()
            .find(|o| o.name == "attention" && o.scope == "dense")
            .expect("attention")
            .seconds
    };
    // 32 heads and 8 KV heads over tp=4: 2 KV heads a rank, each a query tile of its 4
    // query heads, one per physical core (LNC=2), against ceil(bucket / 128) chunks of 128
    // keys, 16 chunks a block.
    let m = Model::preset("llama-3.1-8b").expect("preset");
    let l = layout("trn2.3xlarge", 4, 32768);
    let shape = AttentionShape { q_rows: 4, d_qk: 128, d_v: 128, shared_kv: false };
    assert_eq!(tkg_block_keys(4), 2048);
    let t = attention_tkg_times(&shape).expect("times");
    let want = |blocks: f64| t.fixed_s + t.per_q_tile_s + blocks * t.per_block_s;
    let (a, b, c) = (attn(&m, &l, 1000), attn(&m, &l, 2000), attn(&m, &l, 4000));
    assert!((a - want(0.5)).abs() < 1e-12, "{a} {}", want(0.5));
    assert!((b - want(1.0)).abs() < 1e-12);
    assert!((c - want(2.0)).abs() < 1e-12);
    // Doubling the context (bucket 1024 -> 2048 -> 4096) doubles the blocks.
    assert!(((c - b) / (b - a) - 2.0).abs() < 1e-9);
    // The per-block time is the machine's timeline of the kernel, read off directly.
    let run = |k| attention_tkg_run(&shape, 1, k).expect("run").seconds;
    assert!(((run(8) - run(4)) / 4.0 - t.per_block_s).abs() < 1e-15);
    // Llama-3.3-70B at TP=64: one query row a rank, one query tile; its cache (bucket
    // 12800: 100 chunks) is split between the two physical cores, 50 chunks each.
    let m = Model::preset("llama-3.3-70b").expect("preset");
    let l = layout("trn2.48xlarge", 64, 12800);
    let one = AttentionShape { q_rows: 1, ..shape };
    let t = attention_tkg_times(&one).expect("times");
    let want = t.fixed_s + t.per_q_tile_s + 50.0 / 16.0 * t.per_block_s;
    let got = attn(&m, &l, 10_000);
    assert!((got - want).abs() < 1e-12, "{got} {want}");
    // Far below the prefill layout's 70 us a layer, above the cache read alone.
    assert!(got < 15e-6, "{got}");
}

#[test]
fn prefill_attention_and_norms_are_the_kernels_tiles() {
    use super::inference::causal_blocks;
    use super::kernels::{attention_times, rmsnorm_times, AttentionShape};
    let m = Model::preset("llama-3.1-8b").expect("preset");
    let l = layout("trn2.3xlarge", 4, 4096);
    let p = prefill(&m, &l, 4096).expect("prefill");
    let op = |name: &str| p.ops.iter().find(|o| o.name == name).expect("op").seconds;
    // 32 tiles of 128 rows of the hidden size (4096), 16 on each physical core.
    let n = rmsnorm_times(128, 4096).expect("norm");
    let want = n.fixed_s + 16.0 * n.per_tile_s;
    assert!((op("input_norm") - want).abs() < 1e-12, "{} {want}", op("input_norm"));
    assert_eq!(op("input_norm"), op("post_attention_norm"));
    // 8 heads a rank, 32 query tiles each; causal: tiles 4g..4g+3 visit g + 1 key tiles.
    let t = attention_times(&AttentionShape { q_rows: 128, d_qk: 128, d_v: 128, shared_kv: false })
        .expect("attention");
    let blocks = 4 * (1..=8).sum::<u64>();
    assert_eq!(causal_blocks(32, 4096, 128, 512).expect("blocks"), blocks);
    let want = t.fixed_s + 8.0 * (32.0 * t.per_q_tile_s + blocks as f64 * t.per_block_s) / 2.0;
    assert!((op("attention") - want).abs() < 1e-12 * want.max(1.0));
    // Norms scale with the hidden size: a row twice as wide takes about twice as long.
    let w = rmsnorm_times(128, 8192).expect("norm");
    assert!(w.per_tile_s / n.per_tile_s > 1.8);
}

#[test]
fn causal_blocks_match_counting_them() {
    use super::inference::causal_blocks;
    for q_tiles in 0..40u64 {
        for window in [1, 100, 512, 513, 1500, 4096, u64::MAX] {
            let count: u64 = (0..q_tiles)
                .map(|i| {
                    let last = (i + 1) * 128 - 1;
                    let first = (i * 128).saturating_sub(window.saturating_sub(1));
                    // Key tiles holding a key some query of the tile sees, at most the cap.
                    (last / 512 - first / 512 + 1).min(window.div_ceil(512).saturating_add(1))
                })
                .sum();
            let closed = causal_blocks(q_tiles, window, 128, 512).expect("blocks");
            assert!(closed >= count, "{q_tiles} {window}: {closed} < {count}");
            if window >= q_tiles * 128 {
                assert_eq!(closed, count, "{q_tiles} {window}");
            }
        }
    }
}
