//! The tensor engine's numbers against a naive scalar oracle of the contract (section 2).
//!
//! The oracle is written from the contract's text alone: K cut into tiles of 128 (256 in
//! double_row, order k, k + 128 for each row k), each tile's partial sum started at +0.0 and fed
//! its products in order through `round_fp32(partial + a * b)`, the first tile's sum written and
//! each later one added with one fp32 rounding. For inputs of 16 bits or less the step is the
//! contract's float64 recipe `((p as f64) + (a as f64) * (b as f64)) as f32`; for fp32 inputs
//! (whose 48-bit products that recipe could round twice) it is `f32::mul_add`. NaN results are
//! compared as the canonical quiet NaN the engine returns.

use trn2core::engine::{
    gemm_f32, gemm_f32_into, matmul, matmul_into, pe_fma, Operand, PeTile, PerfMode, CANONICAL_NAN,
};
use trn2core::numerics::{fp8_lut, mix64, Format};
use trn2core::Error;

/// How the oracle forms one step.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Step {
    /// The contract's float64 recipe (exact for inputs of 16 bits or less).
    F64,
    /// `f32::mul_add`, for fp32 inputs.
    MulAdd,
    /// Separate fp32 multiply and add: not the contract, used to show which data tell them apart.
    Unfused,
}

fn step(p: f32, x: f32, y: f32, how: Step) -> f32 {
    match how {
        Step::F64 => ((p as f64) + (x as f64) * (y as f64)) as f32,
        Step::MulAdd => x.mul_add(y, p),
        Step::Unfused => p + x * y,
    }
}

/// The contract's GEMM, straightforwardly: `a` `[m, k]`, `b` `[k, n]`, row-major.
pub(crate) fn oracle(
    a: &[f32], b: &[f32], m: usize, k: usize, n: usize, mode: PerfMode, how: Step,
) -> Vec<f32> {
    let tile = match mode {
        PerfMode::None => 128,
        PerfMode::DoubleRow => 256,
    };
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        let mut k0 = 0;
        while k0 < k {
            let len = tile.min(k - k0);
            let order: Vec<usize> = match mode {
                PerfMode::None => (0..len).collect(),
                PerfMode::DoubleRow => {
                    (0..128).flat_map(|r| [r, r + 128]).filter(|&o| o < len).collect()
                }
            };
            // One partial sum per output column, each fed in the tile's order.
            let mut partial = vec![0f32; n];
            for o in order {
                let x = a[i * k + k0 + o];
                for (j, p) in partial.iter_mut().enumerate() {
                    *p = step(*p, x, b[(k0 + o) * n + j], how);
                }
            }
            for (j, p) in partial.into_iter().enumerate() {
                let c = &mut c[i * n + j];
                *c = if k0 == 0 { p } else { *c + p };
            }
            k0 += len;
        }
    }
    c
}

pub(crate) fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut bad = 0;
    for (idx, (&g, &w)) in got.iter().zip(want).enumerate() {
        let w = if w.is_nan() { CANONICAL_NAN } else { w };
        if g.to_bits() != w.to_bits() {
            if bad < 5 {
                eprintln!(
                    "{what}: element {idx}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
                    g.to_bits(),
                    w.to_bits()
                );
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "{what}: {bad} of {} elements differ", got.len());
}

/// A counter-based stream of random words.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 += 1;
        mix64(self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A bf16 value with a random sign, mantissa and an exponent in `exps` (biased; 0 = subnormal).
fn bf16_value(rng: &mut Rng, exps: std::ops::RangeInclusive<u32>) -> f32 {
    let w = rng.next();
    let span = (exps.end() - exps.start() + 1) as u64;
    let e = exps.start() + ((w >> 8) % span) as u32;
    let bits = ((w as u32 & 1) << 31) | (e << 23) | (((w >> 1) as u32 & 0x7F) << 16);
    f32::from_bits(bits)
}

pub(crate) fn bf16_values(seed: u64, len: usize, exps: std::ops::RangeInclusive<u32>) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len).map(|_| bf16_value(&mut rng, exps.clone())).collect()
}

/// Every bf16 bit pattern equally likely: subnormals, huge and tiny exponents, Inf and NaN.
pub(crate) fn bf16_any(seed: u64, len: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len).map(|_| f32::from_bits((rng.next() as u32) << 16)).collect()
}

/// Finite values of an fp8 format, every finite code equally likely.
fn fp8_values(seed: u64, len: usize, format: Format) -> Vec<f32> {
    let lut = fp8_lut(&format.encoding());
    let finite: Vec<f32> = lut.iter().copied().filter(|v| v.is_finite()).collect();
    let mut rng = Rng(seed);
    (0..len).map(|_| finite[rng.below(finite.len() as u64) as usize]).collect()
}

/// fp32 values with full 24-bit mantissas and exponents in `2^-20..2^20`.
pub(crate) fn fp32_values(seed: u64, len: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..len)
        .map(|_| {
            let w = rng.next();
            let e = 107 + (w >> 40) as u32 % 41;
            f32::from_bits(((w as u32 & 1) << 31) | (e << 23) | ((w >> 1) as u32 & 0x7F_FFFF))
        })
        .collect()
}

/// `gemm_f32` against the oracle, bit for bit; `dims` is `(m, k, n)`.
fn check_gemm(
    a: &[f32], b: &[f32], dims: (usize, usize, usize), mode: PerfMode, how: Step, what: &str,
) {
    let (m, k, n) = dims;
    let got = gemm_f32(a, b, m, k, n, mode).expect("valid gemm");
    let want = oracle(a, b, m, k, n, mode, how);
    assert_bits_eq(&got, &want, what);
}

/// [`check_gemm`] in every perf mode against the float64-step oracle; a failure is named by
/// `what` and the mode.
fn check_gemm_modes(a: &[f32], b: &[f32], dims: (usize, usize, usize), what: &str) {
    for mode in PerfMode::ALL {
        check_gemm(a, b, dims, mode, Step::F64, &format!("{what} {mode:?}"));
    }
}

const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (1, 300, 1),
    (7, 129, 33),
    (130, 257, 1),
    (2, 4097, 513),
    (130, 4097, 65),
    (64, 512, 96),
    (33, 255, 17),
    (131, 384, 530),
];

#[test]
fn bf16_values_match_the_oracle() {
    for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
        let a = bf16_values(10 + s as u64, m * k, 117..=137);
        let b = bf16_values(20 + s as u64, k * n, 117..=137);
        check_gemm_modes(&a, &b, (m, k, n), &format!("bf16 {m}x{k}x{n}"));
    }
}

#[test]
fn large_awkward_shape_matches_the_oracle() {
    // M over one 128-row tile, K over 32 K tiles plus one, N over one 512-column bank.
    let (m, k, n) = (130, 4097, 513);
    let a = bf16_values(1, m * k, 120..=134);
    let b = bf16_values(2, k * n, 120..=134);
    check_gemm(&a, &b, (m, k, n), PerfMode::None, Step::F64, "bf16 130x4097x513");
}

#[test]
fn fp8_values_match_the_oracle() {
    for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
        for (f, format) in
            [Format::Fp8E4m3, Format::Fp8E5m2, Format::Fp8E3m4].into_iter().enumerate()
        {
            let seed = 100 * f as u64 + s as u64;
            let a = fp8_values(seed, m * k, format);
            let b = fp8_values(seed + 50, k * n, format);
            check_gemm_modes(&a, &b, (m, k, n), &format!("{format:?} {m}x{k}x{n}"));
        }
    }
}

#[test]
fn fp32_values_match_the_fused_oracle() {
    for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
        let a = fp32_values(30 + s as u64, m * k);
        let b = fp32_values(40 + s as u64, k * n);
        check_gemm(&a, &b, (m, k, n), PerfMode::None, Step::MulAdd, &format!("fp32 {m}x{k}x{n}"));
    }
}

#[test]
fn fp32_inputs_need_a_true_fma() {
    // x * y = 1 - 2^-46 exactly and p = 2^24 + 2 (odd mantissa): the exact sum lies just below
    // the fp32 midpoint 2^24 + 3 and rounds down to p. The float64 recipe first rounds the sum
    // to the midpoint itself, then ties to even, up to 2^24 + 4.
    let two = |e: i32| 2f32.powi(e);
    let (p, x, y) = (two(24) + 2.0, 1.0 + two(-23), 1.0 - two(-23));
    assert_eq!(pe_fma(p, x, y), two(24) + 2.0);
    assert_eq!(step(p, x, y, Step::F64), two(24) + 4.0);
    let got = gemm_f32(&[p, x], &[1.0, y], 1, 2, 1, PerfMode::None).expect("valid");
    assert_eq!(got, vec![two(24) + 2.0]);
}

/// How many elements the oracle run with separate fp32 multiply and add gets wrong: proof that
/// a data set exercises the fused step (for 16-bit inputs only products that leave fp32's
/// exponent range can tell the two apart).
fn unfused_differences(a: &[f32], b: &[f32], dims: (usize, usize, usize), mode: PerfMode) -> usize {
    let (m, k, n) = dims;
    let fused = oracle(a, b, m, k, n, mode, Step::F64);
    let unfused = oracle(a, b, m, k, n, mode, Step::Unfused);
    fused
        .iter()
        .zip(&unfused)
        .filter(|(f, u)| f.to_bits() != u.to_bits() && !(f.is_nan() && u.is_nan()))
        .count()
}

#[test]
fn overflowing_products_cancel_like_the_oracle() {
    // Every product lies beyond fp32's range except the first, yet the partial sums swing
    // between about -1.9 * 2^127 and +1.9 * 2^127 and stay finite: each column of b is built
    // so that row 0 of a (all 2^64) walks through the targets s_t exactly; the other rows scale
    // the products by up to 1 + 2^-7, so their sums round and drift.
    let (m, k, n) = (23, 128, 41);
    let mut rng = Rng(90);
    let two = |e: i32| 2f32.powi(e);
    let mut b = vec![0f32; k * n];
    let mut last = vec![0f32; n];
    for j in 0..n {
        let mut s_prev = 0f32;
        for t in 0..k {
            let sign = if t % 2 == 0 { -1.0 } else { 1.0 };
            let s = sign * (2 * (64 + rng.below(58))) as f32 * two(120);
            // s - s_prev is an even integer below 2^9 times 2^120: exact in bf16 after / 2^64.
            // (Computed in f64: the difference itself is beyond fp32's range.)
            b[t * n + j] = ((s as f64 - s_prev as f64) / 2f64.powi(64)) as f32;
            s_prev = s;
        }
        last[j] = s_prev;
    }
    let a: Vec<f32> = (0..m * k)
        .map(|idx| {
            let scale = if idx < k { 0 } else { rng.below(2) };
            two(64) * (1.0 + scale as f32 * two(-7))
        })
        .collect();
    check_gemm_modes(&a, &b, (m, k, n), "overflow");
    for mode in PerfMode::ALL {
        let got = gemm_f32(&a, &b, m, k, n, mode).expect("valid");
        assert_eq!(got[..n], last[..], "row 0 walks through the targets exactly");
        let finite = got.iter().filter(|x| x.is_finite()).count();
        assert!(finite > m * n / 2, "only {finite} finite results");
    }
    let unfused = unfused_differences(&a, &b, (m, k, n), PerfMode::None);
    assert!(unfused > m * n / 2, "unfused differs in only {unfused} elements");
}

#[test]
fn underflowing_products_match_the_oracle() {
    let (m, k, n) = (19, 300, 37);
    let cases = [
        // Products between 2^-266 and 2^-134: the sums live among fp32's subnormals.
        ("tiny", 0..=60, 0..=60),
        // Products below 2^-150: every step rounds to a zero whose sign is the product's.
        ("vanishing", 0..=40, 0..=40),
        // Partial sums near the subnormal range, products underflowing with either sign.
        ("edge of subnormals", 0..=70, 55..=70),
    ];
    for (s, (what, ea, eb)) in cases.into_iter().enumerate() {
        let a = bf16_values(200 + s as u64, m * k, ea);
        let b = bf16_values(300 + s as u64, k * n, eb);
        check_gemm_modes(&a, &b, (m, k, n), what);
        let unfused = unfused_differences(&a, &b, (m, k, n), PerfMode::None);
        assert!(unfused > 0, "{what}: the data do not exercise the fused step");
    }
    // Vanishing products: both zero signs occur (-0 only when every tile ends on a negative
    // product and no tile adds a +0 to it).
    let a = bf16_values(201, m * 100, 0..=40);
    let b = bf16_values(301, 100 * n, 0..=40);
    let got = gemm_f32(&a, &b, m, 100, n, PerfMode::None).expect("valid");
    let negative = got.iter().filter(|x| x.to_bits() == 0x8000_0000).count();
    let positive = got.iter().filter(|x| x.to_bits() == 0).count();
    assert_eq!(negative + positive, m * n);
    assert!(negative > 0 && positive > 0, "{negative} -0 and {positive} +0");
}

#[test]
fn special_values_match_the_oracle() {
    let (m, n) = (19, 37);
    for (s, k) in [3usize, 300].into_iter().enumerate() {
        let seed = 400 + 10 * s as u64;
        let cases = [
            // Every bit pattern: NaN, Inf, subnormals, huge and tiny exponents.
            ("any", bf16_any(seed, m * k), bf16_any(seed + 1, k * n)),
            // Every finite exponent.
            ("mixed", bf16_values(seed + 2, m * k, 0..=254), bf16_values(seed + 3, k * n, 0..=254)),
            // Huge times tiny: products back in fp32's normal range from far outside.
            (
                "huge x tiny",
                bf16_values(seed + 4, m * k, 200..=254),
                bf16_values(seed + 5, k * n, 0..=40),
            ),
        ];
        for (what, a, b) in &cases {
            check_gemm_modes(a, b, (m, k, n), &format!("{what} k={k}"));
        }
        let got = gemm_f32(&cases[0].1, &cases[0].2, m, k, n, PerfMode::None).expect("valid");
        assert!(got.iter().any(|x| x.is_nan()), "k={k}: no NaN result");
        assert!(got.iter().any(|x| x.is_infinite()), "k={k}: no Inf result");
        if k == 3 {
            assert!(got.iter().filter(|x| x.is_finite()).count() > m * n / 2);
        }
    }
}

#[test]
fn cancellation_matches_the_oracle() {
    // Products come in near-opposite pairs, a * y and -a * y' with y' one bf16 ulp from y, over
    // exponents spanning 2^-60..2^60: the large terms cancel and the small residuals decide the
    // result, so every rounding of the running sum shows.
    let (m, k, n) = (21, 600, 45);
    let a0 = bf16_values(500, m * k, 97..=157);
    let a: Vec<f32> = (0..m * k).map(|i| a0[i - i % 2]).collect();
    let mut b = bf16_values(501, k * n, 97..=157);
    let mut rng = Rng(502);
    for kk in (1..k).step_by(2) {
        for j in 0..n {
            let y = b[(kk - 1) * n + j];
            let nudge = if rng.below(2) == 0 { 1 } else { 0 };
            b[kk * n + j] = -f32::from_bits(y.to_bits() ^ (nudge << 16));
        }
    }
    check_gemm_modes(&a, &b, (m, k, n), "cancellation");
    let results: Vec<Vec<f32>> = PerfMode::ALL
        .into_iter()
        .map(|mode| gemm_f32(&a, &b, m, k, n, mode).expect("valid"))
        .collect();
    let nonzero = results[0].iter().filter(|&&x| x != 0.0).count();
    assert!(nonzero > m * n / 2, "only {nonzero} results survive the cancellation");
    assert_ne!(results[0], results[1], "the product order should matter here");
}

#[test]
fn specific_values_follow_the_contract() {
    let two = |e: i32| 2f32.powi(e);
    let one =
        |a: &[f32], b: &[f32]| gemm_f32(a, b, 1, a.len(), 1, PerfMode::None).expect("valid")[0];
    // A bf16 product beyond fp32's range cancels: -2^127 + 2^64 * 2^64 = 2^127.
    assert_eq!(one(&[1.0, two(64)], &[-two(127), two(64)]), two(127));
    // A product below fp32's subnormals keeps its sign: +0 + 2^-100 * -2^-100 = -0.
    assert_eq!(one(&[two(-100)], &[-two(-100)]).to_bits(), (-0.0f32).to_bits());
    // The partial sum starts at +0.0: a single -0 product gives +0.
    assert_eq!(one(&[-0.0], &[1.0]).to_bits(), 0);
    // Inf propagates; Inf * 0 and Inf - Inf are the canonical NaN.
    assert_eq!(one(&[f32::INFINITY, 1.0], &[1.0, 1.0]), f32::INFINITY);
    assert_eq!(one(&[f32::INFINITY], &[0.0]).to_bits(), CANONICAL_NAN.to_bits());
    assert_eq!(
        one(&[f32::INFINITY, f32::NEG_INFINITY], &[1.0, 1.0]).to_bits(),
        CANONICAL_NAN.to_bits()
    );
    assert_eq!(one(&[f32::from_bits(0xFFC0_1234)], &[1.0]).to_bits(), CANONICAL_NAN.to_bits());
    // K tiles: 2^24 in tile 0, then 1 + 1 in tile 1 sums to 2 on its own before it is added:
    // 2^24 + 2 is exact, whereas one running sum would lose both ones (ties to even).
    let mut a = vec![0f32; 130];
    a[0] = two(24);
    a[128] = 1.0;
    a[129] = 1.0;
    let b = vec![1f32; 130];
    assert_eq!(one(&a, &b), two(24) + 2.0);
}

#[test]
fn double_row_takes_k_then_k_plus_128() {
    // Products 2^24 (k = 0), -2^24 (k = 1), 1 (k = 128). Ascending: 2^24 - 2^24 + 1 = 1.
    // double_row: 2^24 + 1 ties to 2^24, then - 2^24 gives 0.
    let two = |e: i32| 2f32.powi(e);
    let mut a = vec![0f32; 256];
    a[0] = two(24);
    a[1] = -two(24);
    a[128] = 1.0;
    let b = vec![1f32; 256];
    let none = gemm_f32(&a, &b, 1, 256, 1, PerfMode::None).expect("valid");
    let dr = gemm_f32(&a, &b, 1, 256, 1, PerfMode::DoubleRow).expect("valid");
    assert_eq!((none[0], dr[0]), (1.0, 0.0));
    // An edge tile of 200 products in double_row: rows 0..72 take k and k + 128, rows 72..128
    // only k. Products: 2^24 (k = 71), 1 (k = 199), -2^24 (k = 72): 0 in that order.
    let mut a = vec![0f32; 456];
    a[256 + 71] = two(24);
    a[256 + 199] = 1.0;
    a[256 + 72] = -two(24);
    let b = vec![1f32; 456];
    let dr = gemm_f32(&a, &b, 1, 456, 1, PerfMode::DoubleRow).expect("valid");
    let none = gemm_f32(&a, &b, 1, 456, 1, PerfMode::None).expect("valid");
    assert_eq!((none[0], dr[0]), (1.0, 0.0));
}

#[test]
fn matmul_double_row_layout_is_the_product_order() {
    // The same three products through one double_row instruction with fp8_e5m2 values:
    // stationary [128, 2, 1], moving [128, 2, 1]; element (p, s) is contraction index s*128 + p.
    let two = |e: i32| 2f32.powi(e);
    let mut st = vec![0f32; 256];
    let mut mv = vec![0f32; 256];
    let at = |p: usize, s: usize| p * 2 + s;
    st[at(0, 0)] = two(15);
    mv[at(0, 0)] = two(9); // k = 0: 2^24
    st[at(1, 0)] = -two(15);
    mv[at(1, 0)] = two(9); // k = 1: -2^24
    st[at(0, 1)] = 1.0;
    mv[at(0, 1)] = 1.0; // k = 128: 1
    let shape = [128, 2, 1];
    let op = |values, format| Operand { values, shape: &shape, format };
    let out = matmul(
        &op(&st, Format::Fp8E5m2),
        &op(&mv, Format::Fp8E5m2),
        PerfMode::DoubleRow,
        PeTile::FULL,
    )
    .expect("valid double_row");
    assert_eq!(out, vec![0.0]);
}

/// A bf16 operand of `shape` holding `values`.
pub(crate) fn bf16_operand<'a>(values: &'a [f32], shape: &'a [usize]) -> Operand<'a> {
    Operand { values, shape, format: Format::Bf16 }
}

#[test]
fn matmul_equals_gemm_of_the_transpose() {
    let (k, m, n) = (128, 100, 512);
    let st = bf16_values(50, k * m, 100..=150);
    let mv = bf16_values(51, k * n, 100..=150);
    let out = matmul(
        &bf16_operand(&st, &[k, m]),
        &bf16_operand(&mv, &[k, n]),
        PerfMode::None,
        PeTile::FULL,
    )
    .expect("valid");
    let a: Vec<f32> = (0..m * k).map(|i| st[(i % k) * m + i / k]).collect();
    assert_bits_eq(&out, &oracle(&a, &mv, m, k, n, PerfMode::None, Step::F64), "matmul");
}

#[test]
fn psum_accumulate_adds_with_one_rounding() {
    let (k, m, n) = (64, 8, 16);
    let stride = 512;
    let (st_shape, mv_shape) = ([k, m], [k, n]);
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = (0..2)
        .map(|i| (bf16_values(60 + i, k * m, 110..=140), bf16_values(70 + i, k * n, 110..=140)))
        .collect();
    fn ops<'a>(
        input: &'a (Vec<f32>, Vec<f32>), shapes: &'a ([usize; 2], [usize; 2]),
    ) -> (Operand<'a>, Operand<'a>) {
        (bf16_operand(&input.0, &shapes.0), bf16_operand(&input.1, &shapes.1))
    }
    let shapes = (st_shape, mv_shape);
    let mut psum = vec![7.0f32; m * stride];
    let mut sums = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let (st, mv) = ops(input, &shapes);
        sums.push(matmul(&st, &mv, PerfMode::None, PeTile::FULL).expect("valid"));
        let shape = matmul_into(&mut psum, stride, &st, &mv, PerfMode::None, PeTile::FULL, i > 0)
            .expect("valid");
        assert_eq!((shape.m, shape.n), (m, n));
    }
    for i in 0..m {
        for j in 0..n {
            let want = sums[0][i * n + j] + sums[1][i * n + j];
            assert_eq!(psum[i * stride + j].to_bits(), want.to_bits(), "({i}, {j})");
        }
        let outside = &psum[i * stride + n..(i + 1) * stride];
        assert!(outside.iter().all(|&v| v == 7.0), "row {i} outside the region");
    }
    let (st, mv) = ops(&inputs[0], &shapes);
    let err = matmul_into(&mut psum[..100], stride, &st, &mv, PerfMode::None, PeTile::FULL, false)
        .expect_err("region does not fit");
    assert!(matches!(err, Error::Shape { ref arg, .. } if arg == "psum"), "{err}");
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (m, k, n) = (300, 1000, 700);
    let a = bf16_values(70, m * k, 100..=150);
    let b = bf16_values(71, k * n, 100..=150);
    let default = gemm_f32(&a, &b, m, k, n, PerfMode::None).expect("valid");
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
        let got = pool.install(|| gemm_f32(&a, &b, m, k, n, PerfMode::None)).expect("valid");
        assert_bits_eq(&got, &default, &format!("{threads} threads"));
    }
    // Rows are independent: computing a row block alone gives the same bits.
    let rows = 37..111;
    let mut part = vec![0f32; rows.len() * n];
    gemm_f32_into(
        &a[rows.start * k..rows.end * k],
        &b,
        rows.len(),
        k,
        n,
        PerfMode::None,
        &mut part,
    )
    .expect("valid");
    assert_bits_eq(&part, &default[rows.start * n..rows.end * n], "row block");
}

#[test]
fn degenerate_shapes_and_errors() {
    assert_eq!(gemm_f32(&[], &[], 0, 5, 0, PerfMode::None), Ok(vec![]));
    assert_eq!(gemm_f32(&[], &[], 2, 0, 3, PerfMode::None), Ok(vec![0.0; 6]));
    let err = gemm_f32(&[1.0; 5], &[1.0; 6], 2, 3, 2, PerfMode::None).expect_err("a too short");
    assert!(matches!(err, Error::Shape { ref arg, .. } if arg == "a"), "{err}");
    let err = gemm_f32(&[1.0; 6], &[1.0; 5], 2, 3, 2, PerfMode::None).expect_err("b too short");
    assert!(matches!(err, Error::Shape { ref arg, .. } if arg == "b"), "{err}");
    let err = gemm_f32(&[], &[], usize::MAX, 0, 2, PerfMode::None).expect_err("huge");
    assert!(matches!(err, Error::Capacity { .. }), "{err}");
}

/// Throughput of GEMMs on bf16-valued inputs, for comparison with numpy's sgemm on the same
/// shapes (`cargo test --release -p trn2core --test it gemm_throughput -- --ignored --nocapture`).
#[test]
#[ignore = "a throughput report, not a check: cargo test --release -p trn2core --test it gemm_throughput -- --ignored --nocapture"]
fn gemm_throughput() {
    let shapes = [
        (2048, 2048, 2048, PerfMode::None),
        (2048, 2048, 2048, PerfMode::DoubleRow),
        (4096, 4096, 4096, PerfMode::None),
        (8192, 256, 8192, PerfMode::None),
        (64, 8192, 4096, PerfMode::None),
    ];
    for (m, k, n, mode) in shapes {
        let a = bf16_values(80, m * k, 120..=134);
        let b = bf16_values(81, k * n, 120..=134);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let c = gemm_f32(&a, &b, m, k, n, mode).expect("valid");
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(c);
        }
        let gflops = 2.0 * (m * k * n) as f64 / best / 1e9;
        println!("gemm_f32 {m}x{k}x{n} {mode:?} bf16-valued: {gflops:.1} GFLOP/s");
    }
}
