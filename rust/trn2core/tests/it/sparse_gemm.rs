//! The zero-skipping GEMM of a sparse stationary operand: bit for bit the dense GEMM (and the
//! contract's scalar oracle), sign of zero included, on every inner loop, thread count and
//! column-block edge; the dense kernel where skipping would change bits (non-finite `b`).

use super::engine::{assert_bits_eq, bf16_any, bf16_values, fp32_values, oracle, Rng, Step};
use trn2core::engine::{
    gemm_f32, gemm_skip_zeros_into, gemm_skip_zeros_into_with, Isa, PerfMode, SparseKernel,
};

/// `a` with N of every M consecutive elements of each row kept (random slots), the others +0.0
/// (and, with `neg_zeros`, some kept slots holding -0.0 or +0.0 as stored zeros).
fn prune_rows(a: &[f32], k: usize, n: usize, m: usize, seed: u64, neg_zeros: bool) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut out = vec![0f32; a.len()];
    for (src, dst) in a.chunks(k).zip(out.chunks_mut(k)) {
        for (sg, dg) in src.chunks(m).zip(dst.chunks_mut(m)) {
            let mut slots: Vec<usize> = (0..sg.len()).collect();
            for i in 0..n.min(sg.len()) {
                let j = i + (rng.next() as usize) % (slots.len() - i);
                slots.swap(i, j);
                let s = slots[i];
                dg[s] = match (neg_zeros, rng.next() % 16) {
                    (true, 0) => -0.0,
                    (true, 1) => 0.0,
                    _ => sg[s],
                };
            }
        }
    }
    out
}

fn skip(a: &[f32], b: &[f32], dims: (usize, usize, usize), isa: Isa) -> (Vec<f32>, SparseKernel) {
    let (m, k, n) = dims;
    let mut out = vec![f32::from_bits(0x7F80_0001); m * n]; // garbage: every element must be written
    let used = gemm_skip_zeros_into_with(a, b, m, k, n, &mut out, isa).expect("valid sparse gemm");
    (out, used)
}

/// The kernel `isa` takes for an operand that skipping suits (`wanted`): without AVX-512,
/// `Isa::Best` takes the dense kernel (its AVX2 path is faster than the skipping loop).
fn expected(isa: Isa, wanted: SparseKernel) -> SparseKernel {
    #[cfg(target_arch = "x86_64")]
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    let avx512 = false;
    if isa == Isa::Best && !avx512 {
        SparseKernel::Dense
    } else {
        wanted
    }
}

const SHAPES: [(usize, usize, usize); 8] = [
    (1, 16, 1),
    (5, 128, 31),
    (7, 129, 33),
    (9, 384, 64),
    (4, 1024, 257),
    (261, 272, 97),
    (33, 2048, 40),
    (130, 48, 530),
];

#[test]
fn skipping_zeros_gives_the_oracles_bits_for_every_pattern() {
    for (p, (n_keep, m_group)) in
        [(1, 2), (2, 4), (1, 4), (2, 8), (4, 8), (4, 16)].into_iter().enumerate()
    {
        for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
            let seed = (p * 100 + s) as u64;
            // Every finite bf16 exponent, subnormals included: products overflow, underflow to
            // zeros of either sign and cancel.
            let dense = bf16_values(seed, m * k, 0..=254);
            let a = prune_rows(&dense, k, n_keep, m_group, seed, true);
            let b = bf16_values(seed + 7, k * n, 0..=254);
            let want = oracle(&a, &b, m, k, n, PerfMode::None, Step::F64);
            let what = format!("{n_keep}:{m_group} {m}x{k}x{n}");
            // Operands more than 40% non-zero (1:2, 2:4, 4:8) take the dense kernel.
            let nnz = a.iter().filter(|&&x| x != 0.0).count();
            let kernel =
                if nnz * 5 <= m * k * 2 { SparseKernel::SkipZeros } else { SparseKernel::Dense };
            for isa in [Isa::Best, Isa::Portable] {
                let (got, used) = skip(&a, &b, (m, k, n), isa);
                assert_eq!(used, expected(isa, kernel), "{what}");
                assert_bits_eq(&got, &want, &format!("{what} {isa:?}"));
            }
        }
    }
}

#[test]
fn large_shapes_equal_the_dense_kernel() {
    // Several K-tile groups, column blocks and row tasks, with ragged edges everywhere.
    for (m, k, n) in [(517, 1300, 301), (300, 2176, 1030)] {
        let a = prune_rows(&bf16_values(m as u64, m * k, 100..=150), k, 4, 16, 3, true);
        let b = bf16_values(k as u64, k * n, 100..=150);
        let want = gemm_f32(&a, &b, m, k, n, PerfMode::None).expect("dense gemm");
        let (got, used) = skip(&a, &b, (m, k, n), Isa::Best);
        assert_eq!(used, expected(Isa::Best, SparseKernel::SkipZeros));
        assert_bits_eq(&got, &want, &format!("{m}x{k}x{n}"));
        let (got, used) = skip(&a, &b, (m, k, n), Isa::Portable);
        assert_eq!(used, SparseKernel::SkipZeros);
        assert_bits_eq(&got, &want, &format!("{m}x{k}x{n} portable"));
    }
}

#[test]
fn fp32_inputs_equal_the_fused_oracle() {
    let (m, k, n) = (20, 300, 70);
    let a = prune_rows(&fp32_values(1, m * k), k, 1, 4, 1, false);
    let b = fp32_values(2, k * n);
    let want = oracle(&a, &b, m, k, n, PerfMode::None, Step::MulAdd);
    let (got, _) = skip(&a, &b, (m, k, n), Isa::Best);
    assert_bits_eq(&got, &want, "fp32 1:4");
}

/// The case the `-0` repair exists for: a tile whose non-zero product underflows to `-0`
/// followed by a skipped `0 * b` with `b > 0`. The dense sum is `-0 + +0 = +0`; summing only the
/// non-zero products would leave `-0`.
#[test]
fn a_negative_zero_sum_is_repaired_to_the_dense_sign() {
    let tiny = f32::from_bits(0x0080_0000); // 2^-126
    for (m, k, n, col) in [(1, 4, 1, 0), (6, 300, 45, 37), (5, 260, 33, 32)] {
        let mut a = vec![0f32; m * k];
        let mut b = vec![1f32; k * n];
        // Row 2 (or 0): a[., 0] = -2^-126, b[0, col] = 2^-126: the product -2^-252 rounds to -0.
        let row = if m > 2 { 2 } else { 0 };
        a[row * k] = -tiny;
        b[col] = tiny;
        // A later tile of the same row holds a non-zero product with a zero column, for the
        // "add to PSUM" path.
        if k > 256 {
            a[row * k + 257] = 3.0;
            b[257 * n + col] = 0.0;
        }
        let want = oracle(&a, &b, m, k, n, PerfMode::None, Step::F64);
        assert_eq!(want[row * n + col].to_bits(), 0, "the dense sum is +0");
        for isa in [Isa::Best, Isa::Portable] {
            let (got, used) = skip(&a, &b, (m, k, n), isa);
            assert_eq!(used, expected(isa, SparseKernel::SkipZeros));
            assert_bits_eq(&got, &want, &format!("{m}x{k}x{n} {isa:?}"));
        }
    }
}

#[test]
fn non_finite_b_takes_the_dense_kernel_with_the_same_bits() {
    let (m, k, n) = (9, 200, 21);
    let a = prune_rows(&bf16_values(5, m * k, 110..=140), k, 1, 4, 5, false);
    for special in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let mut b = bf16_values(6, k * n, 110..=140);
        b[3 * n + 4] = special;
        let want = oracle(&a, &b, m, k, n, PerfMode::None, Step::F64);
        let (got, used) = skip(&a, &b, (m, k, n), Isa::Best);
        assert_eq!(used, SparseKernel::Dense, "{special}");
        assert_bits_eq(&got, &want, &format!("b holds {special}"));
    }
    // Non-finite values in `a` are stored elements: skipping still applies.
    let mut a2 = a.clone();
    let nz = a2.iter().position(|&x| x != 0.0).expect("a stored element");
    a2[nz] = f32::INFINITY;
    let b = bf16_values(6, k * n, 110..=140);
    let want = oracle(&a2, &b, m, k, n, PerfMode::None, Step::F64);
    let (got, used) = skip(&a2, &b, (m, k, n), Isa::Portable);
    assert_eq!(used, SparseKernel::SkipZeros);
    assert_bits_eq(&got, &want, "a holds Inf");
}

#[test]
fn a_mostly_dense_operand_takes_the_dense_kernel() {
    let (m, k, n) = (8, 64, 8);
    let a = bf16_values(8, m * k, 120..=130); // no zeros at all
    let b = bf16_any(9, k * n);
    let mut out = vec![0f32; m * n];
    let used = gemm_skip_zeros_into(&a, &b, m, k, n, &mut out).expect("valid");
    assert_eq!(used, SparseKernel::Dense);
    assert_bits_eq(
        &out,
        &gemm_f32(&a, &b, m, k, n, PerfMode::None).expect("dense gemm"),
        "dense a",
    );
}

#[test]
fn bits_do_not_depend_on_the_thread_count() {
    let (m, k, n) = (300, 640, 200);
    let a = prune_rows(&bf16_values(10, m * k, 0..=254), k, 4, 16, 10, true);
    let b = bf16_values(11, k * n, 0..=254);
    let run = |threads: usize| {
        let pool =
            rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
        pool.install(|| skip(&a, &b, (m, k, n), Isa::Best).0)
    };
    let one = run(1);
    for threads in [2, 3, 7] {
        assert_bits_eq(&run(threads), &one, &format!("{threads} threads"));
    }
}

#[test]
fn wrong_lengths_are_shape_errors() {
    let mut out = vec![0f32; 4];
    let err =
        gemm_skip_zeros_into(&[0.0; 5], &[0.0; 4], 2, 2, 2, &mut out).expect_err("a shape error");
    assert!(err.to_string().contains("a"), "{err}");
    let err = gemm_skip_zeros_into(&[0.0; 4], &[0.0; 4], 2, 2, 2, &mut out[..3])
        .expect_err("a shape error");
    assert!(err.to_string().contains("out"), "{err}");
}
