//! Where the time of quantization goes, without Python: a profiling aid, not a test.
//!
//!     cargo run --release -p trn2core --example numerics_profile [elements]
//!
//! Prints throughputs (best of several runs) of the generator, stochastic rounding with explicit
//! and seeded words, and round-to-nearest-even, on standard-normal float32 input (like
//! `benches/compare_peers.py`): single-threaded on 64 Ki elements (cache-resident, so compute
//! cost), then on the whole array with every thread into a pre-faulted output (compute plus
//! memory), then into a fresh output of each call (plus page faults; numpy's own allocations
//! use huge pages, this one does not).

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;
use trn2core::numerics::{
    encode_into, stochastic_words, CodesMut, Encoding, Format, Random, Rounding, Source,
    StochasticBits,
};

fn best(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// `x` encoded by `enc` with `rounding` and `random` into `out` (no saturation).
fn encode(x: &[f32], enc: &Encoding, rounding: Rounding, random: &Random, out: CodesMut) {
    encode_into(&Source::F32(x), enc, rounding, false, random, out).expect("ok")
}

fn main() {
    let n: usize =
        std::env::args().nth(1).map_or(16 << 20, |s| s.parse().expect("an element count"));
    // Standard normal (Box-Muller over a 64-bit LCG).
    let mut s = 1u64;
    let mut uniform = || {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let x: Vec<f32> = (0..n)
        .map(|_| {
            let (a, b) = (uniform(), uniform());
            ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
        })
        .collect();
    let e4 = Format::Fp8E4m3.encoding();
    let bf = Format::Bf16.encoding();
    let mut words = vec![0u32; n];
    stochastic_words(1, &mut words);
    let sr = Rounding::Stochastic;
    let rne = Rounding::NearestEven;
    let seeded = Random::Seed(1, 32);
    let report = |name: &str, elems: usize, t: f64| {
        println!("{name:52} {:8.3} ms  {:6.2} Gelem/s", t * 1e3, elems as f64 / t / 1e9);
    };
    println!("threads: {}, elements: {n}", rayon::current_num_threads());

    // Single-threaded, cache-resident: 64 Ki elements (one parallel task), repeated.
    let k = (1usize << 16).min(n);
    let reps = (n / k).max(1);
    let mut o8 = vec![0u8; n];
    let mut o16 = vec![0u16; n];
    let mut wk = vec![0u32; k];
    let g = StochasticBits::new(1);
    let one = |name: &str, f: &mut dyn FnMut()| {
        let t = best(5, || (0..reps).for_each(|_| f()));
        report(&format!("1 thread, 64 Ki in cache: {name}"), reps * k, t);
    };
    one("generator words", &mut || stochastic_words(1, &mut wk));
    one("generator words (portable)", &mut || g.fill(0, &mut wk, !0));
    let (xk, rk) = (&x[..k], &words[..k]);
    one("SR fp8_e4m3, explicit words", &mut || {
        encode(xk, &e4, sr, &Random::Bits(rk, 32), CodesMut::U8(&mut o8[..k]))
    });
    one("SR fp8_e4m3, seeded", &mut || encode(xk, &e4, sr, &seeded, CodesMut::U8(&mut o8[..k])));
    one("SR bf16, seeded", &mut || encode(xk, &bf, sr, &seeded, CodesMut::U16(&mut o16[..k])));
    one("RNE fp8_e4m3", &mut || encode(xk, &e4, rne, &Random::None, CodesMut::U8(&mut o8[..k])));
    one("RNE bf16", &mut || encode(xk, &bf, rne, &Random::None, CodesMut::U16(&mut o16[..k])));

    // Whole array, all threads, output already faulted in.
    report(
        "all threads, memory: read the input (sum)",
        n,
        best(9, || {
            let s: u64 = x
                .par_chunks(1 << 16)
                .map(|c| c.iter().map(|v| v.to_bits() as u64).sum::<u64>())
                .sum();
            black_box(s);
        }),
    );
    report("all threads, memory: generator words", n, best(9, || stochastic_words(1, &mut words)));
    let all = |name: &str, f: &mut dyn FnMut()| {
        report(&format!("all threads, memory: {name}"), n, best(9, f));
    };
    all("SR fp8_e4m3, seeded", &mut || encode(&x, &e4, sr, &seeded, CodesMut::U8(&mut o8)));
    all("RNE fp8_e4m3", &mut || encode(&x, &e4, rne, &Random::None, CodesMut::U8(&mut o8)));
    all("RNE bf16", &mut || encode(&x, &bf, rne, &Random::None, CodesMut::U16(&mut o16)));
    all("SR fp8_e4m3, seeded, fresh output", &mut || {
        let mut o = vec![0u8; n];
        encode(&x, &e4, sr, &seeded, CodesMut::U8(&mut o));
        black_box(o);
    });
    all("RNE bf16, fresh output", &mut || {
        let mut o = vec![0u16; n];
        encode(&x, &bf, rne, &Random::None, CodesMut::U16(&mut o));
        black_box(o);
    });
}
