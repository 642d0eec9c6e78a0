//! Independent property checks of the rounding kernels.
//!
//! The oracle never looks at bits: it builds the sorted list of a format's non-negative finite
//! values from the format definition (sign, exponent, mantissa, bias), extended by the next value
//! of the grid above the maximum (where overflow starts), finds the two neighbours of the exact
//! input by comparison, and picks one by the rounding rule using exact f64 arithmetic (midpoints,
//! and for stochastic rounding the fraction `(x - lo) / (hi - lo)` against `1 - r / 2^n`). The
//! kernels under test are the production array path (`encode`), vectorised and parallel.
//!
//! - RNE into every fp8 format and bf16: all 2^32 float32 inputs.
//! - Every format and mode (fp16, tf32 included, saturate on and off, stochastic with random
//!   bits): 2.5e7 random float32 bit patterns per format (2e8 in all), covering every exponent.
//! - float32 from float64 (the only non-identity fp32 rounding): against the CPU's own
//!   conversion, which is an independent implementation of RNE, and neighbour checks for the rest.
//! - Every code of every 8- and 16-bit format decodes and re-encodes to itself.
//! - Non-standard fp8 exponent biases, and proptest over float64 inputs.

use proptest::prelude::*;
use rayon::prelude::*;
use trn2core::numerics::{
    decode, encode, stochastic_words, Codes, CodesRef, Encoding, Format, Random, Rounding, Source,
};

/// The value grid of a format, built from its definition alone.
struct Oracle {
    /// Non-negative finite values by magnitude code, plus the first value past the maximum.
    t: Vec<f64>,
    max_code: u32,
    /// Magnitude code of +Inf (IEEE-style) or of NaN (no Inf).
    overflow_code: u32,
    nan_code: u32,
    sign_bit: u32,
    out_shift: u32,
}

impl Oracle {
    fn new(format: Format, bias: i32) -> Oracle {
        let (e, m) = (format.exponent_bits() as i32, format.mantissa_bits() as i32);
        // Every exponent and mantissa bit set: NaN without Inf, else a NaN above Inf (mantissa 0).
        let top = (1u32 << (e + m)) - 1;
        let inf = top & !((1u32 << m) - 1);
        let (max_code, overflow_code, nan_code) = match format.has_inf() {
            true => (inf - 1, inf, inf | 1 << (m - 1)),
            false => (top - 1, top, top),
        };
        let t = (0..=max_code + 1)
            .map(|c| {
                let ef = (c >> m) as i32;
                let f = (c & ((1 << m) - 1)) as f64;
                if ef == 0 {
                    f * 2f64.powi(1 - bias - m)
                } else {
                    (1.0 + f / 2f64.powi(m)) * 2f64.powi(ef - bias)
                }
            })
            .collect();
        Oracle {
            t,
            max_code,
            overflow_code,
            nan_code,
            sign_bit: 1 << (e + m),
            out_shift: if format == Format::Tf32 { 13 } else { 0 },
        }
    }

    /// The expected code of `x` (exact), or of a value using random word `r` of `n` bits.
    fn expect(&self, x: f64, mode: Rounding, sat: bool, r: u32, n: u32) -> u32 {
        let a = x.abs();
        let i = if a.is_finite() { self.t.partition_point(|&v| v <= a) - 1 } else { 0 };
        self.expect_at(x, i, mode, sat, r, n)
    }

    /// [`Oracle::expect`] given `i`, the index of the largest grid value `<= |x|`.
    fn expect_at(&self, x: f64, i: usize, mode: Rounding, sat: bool, r: u32, n: u32) -> u32 {
        let neg = x.is_sign_negative();
        let sign = if neg { self.sign_bit } else { 0 };
        let a = x.abs();
        let ovf = |toward_zero: bool| {
            if sat || toward_zero {
                self.max_code
            } else {
                self.overflow_code
            }
        };
        let mag = if a.is_nan() {
            self.nan_code
        } else if a.is_infinite() {
            if sat {
                self.max_code
            } else {
                self.overflow_code
            }
        } else {
            let ext = self.max_code as usize + 1;
            let toward_zero = match mode {
                Rounding::TowardZero => true,
                Rounding::TowardPositive => neg,
                Rounding::TowardNegative => !neg,
                _ => false,
            };
            if i >= ext {
                ovf(toward_zero)
            } else if self.t[i] == a {
                i as u32
            } else {
                let (lo, hi) = (self.t[i], self.t[i + 1]);
                let mid = (lo + hi) / 2.0;
                let up = match mode {
                    Rounding::NearestEven => a > mid || (a == mid && i % 2 == 1),
                    Rounding::NearestAway => a >= mid,
                    Rounding::TowardZero => false,
                    Rounding::TowardPositive => !neg,
                    Rounding::TowardNegative => neg,
                    Rounding::Stochastic => {
                        let frac = (a - lo) / (hi - lo);
                        frac >= (2f64.powi(n as i32) - r as f64) / 2f64.powi(n as i32)
                    }
                };
                let c = if up { i + 1 } else { i };
                if c == ext {
                    ovf(toward_zero)
                } else {
                    c as u32
                }
            }
        };
        (sign | mag) << self.out_shift
    }
}

fn codes_u32(c: Codes) -> Vec<u32> {
    match c {
        Codes::U8(v) => v.into_iter().map(u32::from).collect(),
        Codes::U16(v) => v.into_iter().map(u32::from).collect(),
        Codes::U32(v) => v,
    }
}

fn run(src: &Source, enc: &Encoding, mode: Rounding, sat: bool, random: &Random) -> Vec<u32> {
    codes_u32(encode(src, enc, mode, sat, random).expect("valid arguments"))
}

/// [`run`] rounding to nearest even, saturation off, no random words.
fn run_rne(src: &Source, enc: &Encoding) -> Vec<u32> {
    run(src, enc, Rounding::NearestEven, false, &Random::None)
}

/// One `#[test]` per format: `name => Format` calls `check(Format::Format)`.
macro_rules! per_format {
    ($check:expr; $($name:ident => $format:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                ($check)(Format::$format);
            }
        )*
    };
}

/// How many of `got` differ from the oracle's code for the same input of `x` (rounded with
/// random word `r[k]` of `n` bits); the first three are printed after `what`.
#[allow(clippy::too_many_arguments)]
fn count_wrong(
    o: &Oracle, x: &[f32], got: &[u32], r: &[u32], n: u32, mode: Rounding, sat: bool, what: &str,
) -> usize {
    let mut bad = 0;
    for k in 0..x.len() {
        let want = o.expect(x[k] as f64, mode, sat, r[k], n);
        if got[k] != want {
            if bad < 3 {
                eprintln!(
                    "{what} r={}: x = {:e} ({:#010x}): got {:#x}, want {want:#x}",
                    r[k],
                    x[k],
                    x[k].to_bits(),
                    got[k]
                );
            }
            bad += 1;
        }
    }
    bad
}

/// How many of `got[k0..k1]` differ from `want` (one run of inputs with the same expected code).
fn count_run(got: &Codes, k0: usize, k1: usize, want: u32) -> usize {
    match got {
        Codes::U8(v) => v[k0..k1].iter().filter(|&&g| u32::from(g) != want).count(),
        Codes::U16(v) => v[k0..k1].iter().filter(|&&g| u32::from(g) != want).count(),
        Codes::U32(v) => v[k0..k1].iter().filter(|&&g| g != want).count(),
    }
}

/// The code at `k` of `got`.
fn code_at(got: &Codes, k: usize) -> u32 {
    match got {
        Codes::U8(v) => u32::from(v[k]),
        Codes::U16(v) => u32::from(v[k]),
        Codes::U32(v) => v[k],
    }
}

/// All 2^32 float32 inputs, round to nearest even, against the oracle. Consecutive positive bit
/// patterns are ascending in value, so a chunk of them splits into runs on which
/// [`Oracle::expect_at`] in this mode is constant: within a grid interval `[t[i], t[i + 1])`
/// the answer depends only on where `|x|` lies against the interval's midpoint (on `t[i]`,
/// below, on, above), and past the grid, among the infinities and among the NaNs, it is one
/// answer. Each run's ends are found by comparing the inputs' values with the grid (binary
/// search over the sorted chunk), the oracle is asked once per run for `x` and for `-x`, and
/// every input's code (of `x` and of `-x`) is compared with that answer.
fn exhaustive_rne(format: Format) {
    let enc = format.encoding();
    let o = Oracle::new(format, enc.bias);
    // Small chunks: the buffers are reused by the allocator instead of faulted in afresh.
    const CH: u32 = 1 << 16;
    let failures: usize = (0..(1u32 << 31) / CH)
        .into_par_iter()
        .map(|c| {
            let start = c * CH;
            let pos: Vec<f32> = (start..start + CH).map(f32::from_bits).collect();
            let negs: Vec<f32> = pos.iter().map(|v| -v).collect();
            let rne = |x: &[f32]| {
                encode(&Source::F32(x), &enc, Rounding::NearestEven, false, &Random::None)
                    .expect("valid arguments")
            };
            let (got_p, got_n) = (rne(&pos), rne(&negs));
            let ask = |a: f64, i: usize| {
                (
                    o.expect_at(a, i, Rounding::NearestEven, false, 0, 1),
                    o.expect_at(-a, i, Rounding::NearestEven, false, 0, 1),
                )
            };
            // The end of the run from `k` on which `same` holds (`same(pos[k])` is true).
            let run_end = |k: usize, same: &dyn Fn(f64) -> bool| {
                k + pos[k..].partition_point(|&v| same(v as f64))
            };
            let mut bad = 0;
            let mut k = 0;
            while k < pos.len() {
                let a = pos[k] as f64;
                let (k1, i) = if a.is_nan() {
                    (run_end(k, &|v| v.is_nan()), 0)
                } else if a.is_infinite() {
                    (k + 1, 0)
                } else {
                    let i = o.t.partition_point(|&v| v <= a) - 1;
                    let k1 = match o.t.get(i + 1) {
                        _ if a == o.t[i] => k + 1,
                        // Past the grid: every finite input overflows alike.
                        None => run_end(k, &|v| v.is_finite()),
                        Some(&hi) => {
                            let mid = (o.t[i] + hi) / 2.0;
                            if a < mid {
                                run_end(k, &|v| v < mid)
                            } else if a == mid {
                                k + 1
                            } else {
                                run_end(k, &|v| v < hi)
                            }
                        }
                    };
                    (k1, i)
                };
                let (want, want_n) = ask(a, i);
                let wrong = count_run(&got_p, k, k1, want) + count_run(&got_n, k, k1, want_n);
                if wrong > 0 && bad < 3 {
                    let j = (k..k1)
                        .find(|&j| code_at(&got_p, j) != want || code_at(&got_n, j) != want_n)
                        .expect("a wrong code in the run");
                    eprintln!(
                        "{format:?}: x = {:e} ({:#010x}): got {:#x}/{:#x}, want {want:#x}/{want_n:#x}",
                        pos[j],
                        pos[j].to_bits(),
                        code_at(&got_p, j),
                        code_at(&got_n, j),
                    );
                }
                bad += wrong;
                k = k1;
            }
            bad
        })
        .sum();
    assert_eq!(failures, 0, "{format:?}: {failures} float32 inputs rounded wrongly");
}

per_format!(exhaustive_rne;
    exhaustive_rne_fp8_e4m3 => Fp8E4m3,
    exhaustive_rne_fp8_e5m2 => Fp8E5m2,
    exhaustive_rne_fp8_e3m4 => Fp8E3m4,
    exhaustive_rne_fp8_e4m3fn => Fp8E4m3fn,
    exhaustive_rne_bf16 => Bf16,
);

/// A small, fast generator for test inputs (xorshift64*).
struct Xs(u64);
impl Xs {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `len` random words of `n` bits.
    fn words(&mut self, len: usize, n: u32) -> Vec<u32> {
        (0..len).map(|_| ((self.next() >> 32) as u32) >> (32 - n)).collect()
    }
}

/// 2.5e7 random float32 bit patterns per format over every mode, saturate on and off, and
/// stochastic rounding with random words of random widths.
fn sampled_all_modes(format: Format, bias: Option<i64>) {
    let enc = format.encoding_with_bias(bias).expect("valid bias");
    let o = Oracle::new(format, enc.bias);
    const CH: usize = 1 << 20;
    const CHUNKS: u64 = 24; // 24 * 2^20 = 2.5e7 inputs per format, 2e8 over all formats
    let failures: usize = (0..CHUNKS)
        .into_par_iter()
        .map(|c| {
            let mut g = Xs(0x9E37_79B9_7F4A_7C15 ^ (c + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
            let x: Vec<f32> = (0..CH).map(|_| f32::from_bits(g.next() as u32)).collect();
            let mode = Rounding::ALL[(c % 6) as usize];
            let sat = (c / 6) % 2 == 1;
            let n = 1 + (c as u32 * 7) % 32;
            let r = g.words(CH, n);
            let random =
                if mode == Rounding::Stochastic { Random::Bits(&r, n) } else { Random::None };
            let got = run(&Source::F32(&x), &enc, mode, sat, &random);
            let what = format!("{format:?} bias {bias:?} {mode:?} sat={sat} n={n}");
            count_wrong(&o, &x, &got, &r, n, mode, sat, &what)
        })
        .sum();
    assert_eq!(failures, 0, "{format:?}: {failures} inputs rounded wrongly");
}

per_format!(|f| sampled_all_modes(f, None);
    sampled_fp8_e4m3 => Fp8E4m3,
    sampled_fp8_e5m2 => Fp8E5m2,
    sampled_fp8_e3m4 => Fp8E3m4,
    sampled_fp8_e4m3fn => Fp8E4m3fn,
    sampled_bf16 => Bf16,
    sampled_fp16 => Fp16,
    sampled_tf32 => Tf32,
);
#[test]
fn sampled_fp8_nonstandard_biases() {
    // Trainium2's configurable FP8 exponent bias: a shifted grid, same rules.
    sampled_all_modes(Format::Fp8E4m3, Some(0));
    sampled_all_modes(Format::Fp8E5m2, Some(31));
    sampled_all_modes(Format::Fp8E4m3fn, Some(127));
}

/// Stochastic rounding of float32 values mostly inside the format's range (exponents from two
/// binades below the smallest normal to one above the largest), so that whole 16-element
/// vectors take the AVX-512 fast path and some mix in subnormal or overflowing lanes: explicit
/// words and seeded words (checked through `stochastic_words`) of every width, against the
/// oracle. 2^22 inputs per format.
fn sampled_stochastic_in_range(format: Format, bias: Option<i64>) {
    let enc = format.encoding_with_bias(bias).expect("valid bias");
    let o = Oracle::new(format, enc.bias);
    let lo_e = (enc.emin + 127 - 2).max(0) as u64;
    let hi_e = ((enc.max_value().log2().floor() as i64 + 127 + 1).min(254)) as u64;
    const CH: usize = 1 << 20;
    let failures: usize = (0..4u64)
        .into_par_iter()
        .map(|c| {
            let mut g = Xs(0x5DEE_CE66_D1CE_4E5B ^ (c + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let x: Vec<f32> = (0..CH)
                .map(|_| {
                    let b = g.next();
                    let e = lo_e + (b >> 40) % (hi_e - lo_e + 1);
                    f32::from_bits(((b as u32) & 0x807F_FFFF) | ((e as u32) << 23))
                })
                .collect();
            let n = [32, 1, 8, 13, 20, 23, 24, 31][(c as usize * 2 + (enc.bias as usize)) % 8];
            let seeded = c % 2 == 1;
            let sat = c >= 2;
            let seed = 1000 + c;
            let r: Vec<u32> = if seeded {
                let mut w = vec![0u32; CH];
                stochastic_words(seed, &mut w);
                w.iter().map(|w| w >> (32 - n)).collect()
            } else {
                g.words(CH, n)
            };
            let random = if seeded { Random::Seed(seed, n) } else { Random::Bits(&r, n) };
            let got = run(&Source::F32(&x), &enc, Rounding::Stochastic, sat, &random);
            let what = format!("{format:?} bias {bias:?} seeded={seeded} sat={sat} n={n}");
            count_wrong(&o, &x, &got, &r, n, Rounding::Stochastic, sat, &what)
        })
        .sum();
    assert_eq!(failures, 0, "{format:?}: {failures} inputs rounded wrongly");
}

#[test]
fn sampled_stochastic_in_range_all_formats() {
    for f in Format::ALL {
        if f != Format::Fp32 {
            sampled_stochastic_in_range(f, None);
        }
    }
    sampled_stochastic_in_range(Format::Fp8E4m3, Some(0));
    sampled_stochastic_in_range(Format::Fp8E5m2, Some(31));
    sampled_stochastic_in_range(Format::Fp8E4m3fn, Some(127));
}

/// float64 -> fp32: the CPU's `as f32` is an independent RNE; the other modes are checked
/// against the two float32 neighbours of the input.
#[test]
fn fp32_from_f64_all_modes() {
    let enc = Format::Fp32.encoding();
    let mut g = Xs(12345);
    let x: Vec<f64> = (0..1 << 22)
        .map(|k| {
            let b = g.next();
            // Half the inputs near float32's range (every float32 exponent), half anywhere.
            if k % 2 == 0 {
                let e = (b >> 52) % 300;
                f64::from_bits((b & 0x800F_FFFF_FFFF_FFFF) | ((e + 1023 - 160) << 52))
            } else {
                f64::from_bits(b)
            }
        })
        .collect();
    let rne = run_rne(&Source::F64(&x), &enc);
    for (k, &v) in x.iter().enumerate() {
        let want = v as f32;
        if want.is_nan() {
            assert!(f32::from_bits(rne[k]).is_nan());
        } else {
            assert_eq!(rne[k], want.to_bits(), "x = {v:e}");
        }
    }
    for mode in [
        Rounding::TowardZero,
        Rounding::TowardPositive,
        Rounding::TowardNegative,
        Rounding::NearestAway,
    ] {
        let got = run(&Source::F64(&x), &enc, mode, false, &Random::None);
        for (k, &v) in x.iter().enumerate() {
            if v.is_nan() {
                continue;
            }
            let c = v as f32;
            // The float32 neighbours lo <= v <= hi.
            let (lo, hi) = if (c as f64) == v {
                (c, c)
            } else if (c as f64) < v {
                (c, c.next_up())
            } else {
                (c.next_down(), c)
            };
            let r = f32::from_bits(got[k]);
            let want = match mode {
                Rounding::TowardPositive => hi,
                Rounding::TowardNegative => lo,
                Rounding::TowardZero => {
                    if v >= 0.0 {
                        lo
                    } else {
                        hi
                    }
                }
                _ => {
                    // Past float32's max the grid continues at 2^128 (where overflow starts).
                    let ext = |f: f32| {
                        if f.is_infinite() {
                            f64::copysign(2f64.powi(128), f as f64)
                        } else {
                            f as f64
                        }
                    };
                    let (dl, dh) = (v - ext(lo), ext(hi) - v);
                    if dl < dh || (dl == dh && v < 0.0) {
                        lo
                    } else {
                        hi
                    }
                }
            };
            // Overflow past float32's max in the toward-zero directions stays at max.
            let want =
                if want.is_infinite() && lo.is_finite() && matches!(mode, Rounding::TowardZero) {
                    lo
                } else {
                    want
                };
            assert_eq!(r.to_bits(), want.to_bits(), "{mode:?}: x = {v:e}");
        }
    }
}

/// Every code of every 8- and 16-bit format decodes to its value and re-encodes to itself
/// (NaN codes to the canonical NaN of their sign).
#[test]
fn every_code_round_trips() {
    for format in Format::ALL.into_iter().filter(|f| f.code_bits() <= 16) {
        let enc = format.encoding();
        let o = Oracle::new(format, enc.bias);
        let n = 1usize << format.code_bits();
        let vals = if n == 256 {
            let c: Vec<u8> = (0..=255).collect();
            decode(CodesRef::U8(&c), &enc)
        } else {
            let c: Vec<u16> = (0..=65535).collect();
            decode(CodesRef::U16(&c), &enc)
        };
        let again = run_rne(&Source::F32(&vals), &enc);
        for code in 0..n as u32 {
            let mag = code & (o.sign_bit - 1);
            let v = vals[code as usize] as f64;
            if mag <= o.max_code {
                assert_eq!(v.abs(), o.t[mag as usize], "{format:?} code {code:#x}");
                assert_eq!(again[code as usize], code, "{format:?} code {code:#x}");
            } else if format.has_inf() && mag == o.overflow_code {
                assert!(v.is_infinite());
                assert_eq!(again[code as usize], code);
            } else {
                assert!(v.is_nan(), "{format:?} code {code:#x}");
                assert_eq!(again[code as usize], (code & o.sign_bit) | o.nan_code);
            }
        }
    }
}

/// Every format's encoding and oracle, built once for all cases of `f64_inputs_round_once`
/// (tf32's grid alone has 2^19 values).
fn f64_oracles() -> &'static [(Format, Encoding, Oracle)] {
    static ORACLES: std::sync::OnceLock<Vec<(Format, Encoding, Oracle)>> =
        std::sync::OnceLock::new();
    ORACLES.get_or_init(|| {
        [
            Format::Tf32,
            Format::Bf16,
            Format::Fp16,
            Format::Fp8E4m3,
            Format::Fp8E5m2,
            Format::Fp8E3m4,
            Format::Fp8E4m3fn,
        ]
        .into_iter()
        .map(|format| {
            let enc = format.encoding();
            let o = Oracle::new(format, enc.bias);
            (format, enc, o)
        })
        .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// float64 inputs are rounded once, directly, in every mode, into every format.
    #[test]
    fn f64_inputs_round_once(bits in any::<u64>(), near in any::<bool>(), r in any::<u32>(), n in 1u32..=32, sat in any::<bool>()) {
        // Half the cases are steered into the formats' ranges, where rounding is interesting.
        let x = if near {
            let e = (bits >> 52) % 200;
            f64::from_bits((bits & 0x800F_FFFF_FFFF_FFFF) | ((e + 1023 - 150) << 52))
        } else {
            f64::from_bits(bits)
        };
        let r = if n == 32 { r } else { r >> (32 - n) };
        for (format, enc, o) in f64_oracles() {
            let format = *format;
            for mode in Rounding::ALL {
                let bits_arr = [r];
                let random = if mode == Rounding::Stochastic { Random::Bits(&bits_arr, n) } else { Random::None };
                let got = run(&Source::F64(&[x]), enc, mode, sat, &random)[0];
                prop_assert_eq!(got, o.expect(x, mode, sat, r, n), "{:?} {:?} sat={} x={:e}", format, mode, sat, x);
            }
        }
    }
}

#[test]
fn every_fp16_code_widens_to_its_exact_value() {
    use trn2core::numerics::f16_to_f32;
    for code in 0..=u16::MAX {
        let got = f16_to_f32(code);
        let want = crate::reference::f16_value(code);
        if want.is_nan() {
            // Sign and payload kept, quiet bit set (as x86's vcvtph2ps).
            let payload = u32::from(code & 0x3FF) << 13;
            let sign = u32::from(code & 0x8000) << 16;
            assert_eq!(got.to_bits(), sign | 0x7FC0_0000 | payload, "{code:#06x}");
        } else {
            assert_eq!(f64::from(got), want, "{code:#06x}");
            assert_eq!(got.is_sign_negative(), code & 0x8000 != 0, "{code:#06x}");
        }
    }
    assert_eq!(f16_to_f32(0x7C01).to_bits(), 0x7FC0_2000);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x7BFF), 65504.0);
}
