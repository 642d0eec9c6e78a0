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
    let gemm_bytes: f64 = d
        .ops
        .iter()
        .filter(|o| o.kind == "gemm")
        .map(|o| o.count as f64 * o.hbm_bytes)
        .sum();
    let weights = d.memory.items[0].bytes as f64;
    let embed = (128_256f64 / 64.0).ceil() * 8192.0 * 2.0;
    assert!(
        (gemm_bytes / (weights - embed) - 1.0).abs() < 0.02,
        "{gemm_bytes} {weights}"
    );
    // Two all-reduces per layer, in-graph: far below the standalone nccom-test floor.
    let ar: Vec<&OpTime> = d.ops.iter().filter(|o| o.name == "all_reduce").collect();
    assert_eq!(ar.iter().map(|o| o.count).sum::<u64>(), 160);
    assert!(
        ar[0].seconds < 50e-6 && ar[0].seconds > 10e-6,
        "{}",
        ar[0].seconds
    );
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
        r.ops
            .iter()
            .filter(|o| o.kind == "gemm")
            .map(|o| o.count as f64 * o.hbm_bytes)
            .sum()
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
    assert!(
        flops > weights && flops < 1.3 * weights,
        "{flops} {weights}"
    );
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
    let up = d
        .ops
        .iter()
        .find(|o| o.name.starts_with("experts_gate_up"))
        .expect("experts");
    assert_eq!(up.name, "experts_gate_up (x8)");
    // Prefill is NxD's blockwise matmul: ceil((4096 * 8 - 127) / 512) + 127 = 191 blocks of
    // 512 tokens in each of the 48 layers (95 with 32 experts a rank at ep=4), each block's
    // four ops with their fixed cost.
    let blocks = |r: &StepReport, name: &str| {
        r.ops
            .iter()
            .find(|o| o.name == name)
            .map(|o| (o.count, o.fixed_s))
    };
    let p = prefill(&m, &l, 4096).expect("prefill");
    for op in [
        "expert_block_gather",
        "expert_block_gate_up",
        "expert_block_down",
        "expert_block_add",
    ] {
        assert_eq!(
            blocks(&p, op),
            Some((48 * 191, WORKLOAD_OP_FIXED_S)),
            "{op}"
        );
    }
    assert!(!p.ops.iter().any(|o| o.name.starts_with("experts_gate_up")));
    let mut ep = l.clone();
    ep.ep = 4;
    let pe = prefill(&m, &ep, 4096).expect("prefill");
    assert_eq!(
        blocks(&pe, "expert_block_down"),
        Some((48 * 95, WORKLOAD_OP_FIXED_S))
    );
}

#[test]
fn bad_layouts_name_both_numbers() {
    let m = Model::preset("llama-3.3-70b").expect("preset");
    let e = decode(&m, &layout("trn2.48xlarge", 128, 4096), 10).expect_err("too many");
    assert_eq!(arg_of(&e), Some("tp"));
    assert!(
        e.to_string().contains("128") && e.to_string().contains("64"),
        "{e}"
    );
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
        r.ops
            .iter()
            .filter(|o| o.scope != "step")
            .map(OpTime::total_s)
            .sum()
    };
    assert!((per_layer(&b) / per_layer(&a) - 4.0).abs() < 1e-9);
}
