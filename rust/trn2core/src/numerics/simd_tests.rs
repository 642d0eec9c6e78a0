//! The SIMD levels give the portable code's bits exactly.
//!
//! Every format (fp8 with standard and non-standard biases, bf16, fp16, tf32) and random-bit
//! count, on boundary-heavy float32 inputs: every value of the format, every midpoint, their
//! float32 neighbours, both zeros, float32 subnormals and extremes, Inf, NaN, values below the
//! format's smallest subnormal and above its maximum. Stochastic rounding gets, per input, the
//! random words 0, `2^n - 1` and the exact threshold word (the smallest that rounds up) and the
//! one below it, found with the portable kernel, so both sides of every decision are tested.
//! Each input set runs twice: sorted (so most 16-lane vectors take the AVX-512 fast path) and
//! with every 16th lane replaced by a NaN (so every vector takes the general path). Lengths and
//! offsets that are not multiples of 16 or 64 test the masked tails.

use super::encode::{
    encode_into_level, fill_words, stochastic_words_level, SIMD_AVX2, SIMD_AVX512, SIMD_PORTABLE,
};
use super::{decode, CodesMut, CodesRef, Encoding, Format, Random, Rounding, Source};
use super::{mix64, StochasticBits};

/// The levels this CPU runs (the portable one first).
fn levels() -> Vec<u8> {
    let best = super::encode::simd_level();
    [SIMD_PORTABLE, SIMD_AVX2, SIMD_AVX512].into_iter().filter(|&l| l <= best).collect()
}

/// `src` rounded at `level`, as u32 codes.
/// [`codes`] of float32 inputs with stochastic rounding.
fn stochastic(x: &[f32], enc: &Encoding, sat: bool, random: &Random, level: u8) -> Vec<u32> {
    codes(&Source::F32(x), enc, Rounding::Stochastic, sat, random, level)
}

fn codes(
    src: &Source, enc: &Encoding, mode: Rounding, sat: bool, random: &Random, level: u8,
) -> Vec<u32> {
    let n = src.len();
    match enc.format.code_bits() {
        8 => {
            let mut o = vec![0u8; n];
            encode_into_level(src, enc, mode, sat, random, CodesMut::U8(&mut o), level)
                .expect("valid call");
            o.into_iter().map(u32::from).collect()
        }
        16 => {
            let mut o = vec![0u16; n];
            encode_into_level(src, enc, mode, sat, random, CodesMut::U16(&mut o), level)
                .expect("valid call");
            o.into_iter().map(u32::from).collect()
        }
        _ => {
            let mut o = vec![0u32; n];
            encode_into_level(src, enc, mode, sat, random, CodesMut::U32(&mut o), level)
                .expect("valid call");
            o
        }
    }
}

/// Boundary-heavy float32 inputs for `enc`, sorted by value.
fn boundary_inputs(enc: &Encoding) -> Vec<f32> {
    // The format's values: every fp8 code; of the wider formats, every code of the lowest and
    // highest 512 magnitudes and every 13th code between (tf32: its codes with the low 3
    // mantissa bits from the next bits up).
    let sample = |c: u32, mags: u32| {
        c % (mags / 2) < 512 || c % (mags / 2) >= mags / 2 - 512 || c.is_multiple_of(13)
    };
    let vals: Vec<f32> = match enc.format.code_bits() {
        8 => {
            let c: Vec<u8> = (0..=u8::MAX).collect();
            decode(CodesRef::U8(&c), enc)
        }
        16 => {
            let c: Vec<u16> = (0..=u16::MAX).filter(|&c| sample(c as u32, 1 << 16)).collect();
            decode(CodesRef::U16(&c), enc)
        }
        _ => {
            let c: Vec<u32> = (0..1u32 << 16)
                .filter(|&c| sample(c, 1 << 16))
                .map(|c| (c << 16) | ((c & 0xE000) >> 2))
                .collect();
            decode(CodesRef::U32(&c), enc)
        }
    };
    let mut pos: Vec<f64> =
        vals.iter().filter(|v| v.is_finite() && **v >= 0.0).map(|&v| v as f64).collect();
    pos.sort_by(f64::total_cmp);
    pos.dedup();
    // The first value past the maximum, where overflow starts.
    let top = pos[pos.len() - 1];
    let gap = top - pos[pos.len() - 2];
    pos.push(top + gap);
    let mut x: Vec<f32> = Vec::new();
    let mut push_near = |v: f64| {
        let f = v as f32; // exact for values, rounded for some midpoints (fine: still near)
        if f.is_finite() {
            let b = f.to_bits();
            for d in [-2i64, -1, 0, 1, 2] {
                let nb = (b as i64 + d).clamp(0, 0x7F80_0000) as u32;
                x.push(f32::from_bits(nb));
            }
        }
    };
    for w in pos.windows(2) {
        push_near(w[0]);
        push_near((w[0] + w[1]) / 2.0);
        push_near(w[0] + (w[1] - w[0]) * 0.25);
        push_near(w[0] + (w[1] - w[0]) * 0.75);
    }
    push_near(top + gap);
    // Float32 extremes and specials; values far below the smallest subnormal.
    let min_sub = pos[1];
    for k in 1..40 {
        push_near(min_sub * 2f64.powi(-k));
        push_near(min_sub * 2f64.powi(-k) * 1.5);
    }
    for b in [
        0u32,
        1,
        2,
        3,
        0x007F_FFFF,
        0x0080_0000,
        0x0080_0001,
        0x7F7F_FFFF,
        0x7F7F_FFFE,
        0x7F80_0000,
        0x7F80_0001,
        0x7FC0_0000,
        0x7FFF_FFFF,
    ] {
        x.push(f32::from_bits(b));
    }
    let mut g = 0x1234_5678_9ABC_DEF0u64;
    for _ in 0..4096 {
        g = g.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x.push(f32::from_bits(mix64(g) as u32 & 0x7FFF_FFFF));
    }
    x.sort_by(|a, b| a.total_cmp(b));
    // Both signs, interleaved in runs of 16 so vectors see both.
    let mut out = Vec::with_capacity(2 * x.len());
    for run in x.chunks(16) {
        out.extend_from_slice(run);
        out.extend(run.iter().map(|v| -v));
    }
    out
}

/// The same inputs with every 16th element a NaN, so every 16-lane vector takes the general path.
fn with_nans(x: &[f32]) -> Vec<f32> {
    let mut y = x.to_vec();
    for (i, v) in y.iter_mut().enumerate() {
        if i % 16 == 5 {
            *v = f32::NAN;
        }
    }
    y
}

/// The encodings under test.
fn encodings() -> Vec<Encoding> {
    let mut v: Vec<Encoding> = [
        Format::Fp8E4m3,
        Format::Fp8E5m2,
        Format::Fp8E3m4,
        Format::Fp8E4m3fn,
        Format::Bf16,
        Format::Fp16,
        Format::Tf32,
    ]
    .into_iter()
    .map(|f| f.encoding())
    .collect();
    for (f, b) in [(Format::Fp8E4m3, 0), (Format::Fp8E5m2, 30), (Format::Fp8E4m3fn, 127)] {
        v.push(f.encoding_with_bias(Some(b)).expect("valid bias"));
    }
    v
}

const COUNTS: [u32; 12] = [1, 2, 3, 7, 8, 12, 13, 16, 20, 23, 31, 32];

/// Per input, the smallest `n`-bit word that makes the portable kernel round up (`2^n` when no
/// word does): rounding up is monotone in the word, so a bisection over whole arrays finds it.
fn thresholds(x: &[f32], enc: &Encoding, sat: bool, n: u32) -> Vec<u64> {
    let zero = vec![0u32; x.len()];
    let rnd = |w: &[u32]| stochastic(x, enc, sat, &Random::Bits(w, n), SIMD_PORTABLE);
    let down = rnd(&zero);
    let (mut lo, mut hi) = (vec![0u64; x.len()], vec![1u64 << n; x.len()]);
    // Invariant: lo rounds down (or lo = 0), hi rounds up or hi = 2^n.
    for _ in 0..=n {
        let mid: Vec<u32> =
            lo.iter().zip(&hi).map(|(&l, &h)| ((l + h) / 2).min((1u64 << n) - 1) as u32).collect();
        let got = rnd(&mid);
        for i in 0..x.len() {
            if hi[i] - lo[i] <= 1 {
                continue;
            }
            if got[i] != down[i] {
                hi[i] = mid[i] as u64;
            } else {
                lo[i] = mid[i] as u64;
            }
        }
    }
    // Word 0 never rounds up (F + 0 cannot carry), so the threshold is hi.
    hi
}

#[test]
fn stochastic_explicit_bits_equal_across_levels() {
    let lv = levels();
    for enc in encodings() {
        let base = boundary_inputs(&enc);
        for x in [base.clone(), with_nans(&base)] {
            for sat in [false, true] {
                for n in COUNTS {
                    let top = ((1u64 << n) - 1) as u32;
                    let th = thresholds(&x, &enc, sat, n);
                    let mut g = (n as u64) << 40 | enc.bias as u64;
                    let words: Vec<Vec<u32>> = vec![
                        vec![0; x.len()],
                        vec![top; x.len()],
                        th.iter().map(|&t| t.min(top as u64) as u32).collect(),
                        th.iter().map(|&t| t.saturating_sub(1).min(top as u64) as u32).collect(),
                        (0..x.len())
                            .map(|_| {
                                g = g.wrapping_add(0x9E37_79B9_7F4A_7C15);
                                mix64(g) as u32 & top
                            })
                            .collect(),
                    ];
                    for w in &words {
                        let rnd = Random::Bits(w, n);
                        let want = stochastic(&x, &enc, sat, &rnd, SIMD_PORTABLE);
                        for &l in &lv[1..] {
                            let got = stochastic(&x, &enc, sat, &rnd, l);
                            assert_same(&x, &got, &want, &enc, l, &format!("n={n} sat={sat}"));
                        }
                    }
                    // The threshold words do split the decision (a check on the test itself).
                    let w_up: Vec<u32> = th.iter().map(|&t| t.min(top as u64) as u32).collect();
                    let up = stochastic(&x, &enc, sat, &Random::Bits(&w_up, n), SIMD_PORTABLE);
                    let dn = stochastic(&x, &enc, sat, &Random::Bits(&words[0], n), SIMD_PORTABLE);
                    let split =
                        (0..x.len()).filter(|&i| th[i] < (1u64 << n) && up[i] != dn[i]).count();
                    let inexact = th.iter().filter(|&&t| t < (1u64 << n)).count();
                    assert_eq!(split, inexact, "{:?}: thresholds", enc.format);
                    assert!(inexact > x.len() / 10, "{:?}: too few inexact inputs", enc.format);
                }
            }
        }
    }
}

#[test]
fn stochastic_seeded_equal_across_levels_and_lengths() {
    let lv = levels();
    for enc in encodings() {
        let x = boundary_inputs(&enc);
        let xn = with_nans(&x);
        for n in COUNTS {
            for (xs, seed) in [(&x, 0u64), (&xn, 0xDEAD_BEEF_u64 + n as u64)] {
                let rnd = Random::Seed(seed, n);
                let want = stochastic(xs, &enc, false, &rnd, SIMD_PORTABLE);
                for &l in &lv[1..] {
                    let got = stochastic(xs, &enc, false, &rnd, l);
                    assert_same(xs, &got, &want, &enc, l, &format!("seed n={n}"));
                }
            }
        }
        // Prefixes of every length around the vector sizes: the masked tails.
        let rnd = Random::Seed(7, 32);
        let full = stochastic(&x, &enc, true, &rnd, SIMD_PORTABLE);
        for len in (0..200).chain([1023, 1024, 1025, 4097]) {
            let len = len.min(x.len());
            for &l in &lv {
                let got = stochastic(&x[..len], &enc, true, &rnd, l);
                assert_eq!(got, full[..len], "{:?} level {l} len {len}", enc.format);
            }
        }
    }
}

#[test]
fn narrow_inputs_and_all_modes_equal_across_levels() {
    // bf16, fp16 and fp8 inputs are widened to float32 and take the same kernels; the other
    // modes run the auto-vectorised loops at each level.
    let lv = levels();
    let all16: Vec<u16> = (0..=u16::MAX).collect();
    let all8: Vec<u8> = (0..=u8::MAX).collect();
    let mut g = 99u64;
    let w: Vec<u32> = (0..all16.len())
        .map(|_| {
            g = g.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(g) as u32
        })
        .collect();
    for enc in encodings() {
        let sources = [
            Source::Bf16(&all16),
            Source::F16(&all16),
            Source::Fp8(&all8, Format::Fp8E5m2),
            Source::Fp8(&all8, Format::Fp8E3m4),
        ];
        for src in &sources {
            for mode in Rounding::ALL {
                for sat in [false, true] {
                    let rnd = match mode {
                        Rounding::Stochastic => Random::Bits(&w[..src.len()], 32),
                        _ => Random::None,
                    };
                    let want = codes(src, &enc, mode, sat, &rnd, SIMD_PORTABLE);
                    for &l in &lv[1..] {
                        let got = codes(src, &enc, mode, sat, &rnd, l);
                        assert_eq!(got, want, "{:?} {mode:?} sat={sat} level {l}", enc.format);
                    }
                    if mode == Rounding::Stochastic {
                        // Seeded: the AVX-512 level generates the words inside the kernel.
                        let rnd = Random::Seed(31, 24);
                        let want = codes(src, &enc, mode, sat, &rnd, SIMD_PORTABLE);
                        for &l in &lv[1..] {
                            let got = codes(src, &enc, mode, sat, &rnd, l);
                            assert_eq!(got, want, "{:?} seeded sat={sat} level {l}", enc.format);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn generator_words_equal_across_levels() {
    let lv = levels();
    let g = StochasticBits::new(0x0123_4567_89AB_CDEF);
    let mut want = vec![0u32; 5000];
    g.fill(0, &mut want, !0);
    for (k, &w) in want.iter().enumerate() {
        assert_eq!(w, g.word(k as u64));
    }
    for &l in &lv {
        for start in [0usize, 1, 2, 15, 16, 17, 31, 33, 1000, 1001] {
            for len in [0usize, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 3999] {
                for mask in [!0u32, 0xFFFF_FF00, 0x8000_0000] {
                    let mut got = vec![0xAAAA_AAAAu32; len + 1];
                    fill_words(&g, start as u64, &mut got[..len], mask, l);
                    let exp: Vec<u32> = want[start..start + len].iter().map(|w| w & mask).collect();
                    assert_eq!(got[..len], exp, "level {l} start {start} len {len}");
                    assert_eq!(got[len], 0xAAAA_AAAA, "wrote past the end");
                }
            }
        }
        // Whole arrays in parallel chunks.
        let mut big = vec![0u32; (1 << 17) + 3];
        stochastic_words_level(0x0123_4567_89AB_CDEF, &mut big, l);
        assert!(big.iter().enumerate().all(|(k, &w)| w == g.word(k as u64)));
    }
}

fn assert_same(x: &[f32], got: &[u32], want: &[u32], enc: &Encoding, level: u8, what: &str) {
    if got != want {
        let i = (0..x.len()).find(|&i| got[i] != want[i]).expect("a difference");
        panic!(
            "{:?} bias {} level {level} {what}: x[{i}] = {:e} ({:#010x}): got {:#x}, portable {:#x} ({} differ)",
            enc.format,
            enc.bias,
            x[i],
            x[i].to_bits(),
            got[i],
            want[i],
            (0..x.len()).filter(|&i| got[i] != want[i]).count()
        );
    }
}
