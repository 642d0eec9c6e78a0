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
    encode_into, stochastic_words, CodesMut, Format, Random, Rounding, Source, StochasticBits,
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

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(16 << 20, |s| s.parse().expect("an element count"));
    // Standard normal (Box-Muller over a 64-bit LCG).
    let mut s = 1u64;
    let mut uniform = || {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
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
        println!(
            "{name:52} {:8.3} ms  {:6.2} Gelem/s",
            t * 1e3,
            elems as f64 / t / 1e9
        );
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
        let out = CodesMut::U8(&mut o8[..k]);
        encode_into(&Source::F32(xk), &e4, sr, false, &Random::Bits(rk, 32), out).expect("ok")
    });
    one("SR fp8_e4m3, seeded", &mut || {
        let out = CodesMut::U8(&mut o8[..k]);
        encode_into(&Source::F32(xk), &e4, sr, false, &seeded, out).expect("ok")
    });
    one("SR bf16, seeded", &mut || {
        let out = CodesMut::U16(&mut o16[..k]);
        encode_into(&Source::F32(xk), &bf, sr, false, &seeded, out).expect("ok")
    });
    one("RNE fp8_e4m3", &mut || {
        let out = CodesMut::U8(&mut o8[..k]);
        encode_into(&Source::F32(xk), &e4, rne, false, &Random::None, out).expect("ok")
    });
    one("RNE bf16", &mut || {
        let out = CodesMut::U16(&mut o16[..k]);
        encode_into(&Source::F32(xk), &bf, rne, false, &Random::None, out).expect("ok")
    });

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
    report(
        "all threads, memory: generator words",
        n,
        best(9, || stochastic_words(1, &mut words)),
    );
    let all = |name: &str, f: &mut dyn FnMut()| {
        report(&format!("all threads, memory: {name}"), n, best(9, f));
    };
    all("SR fp8_e4m3, seeded", &mut || {
        encode_into(
            &Source::F32(&x),
            &e4,
            sr,
            false,
            &seeded,
            CodesMut::U8(&mut o8),
        )
        .expect("ok")
    });
    all("RNE fp8_e4m3", &mut || {
        let out = CodesMut::U8(&mut o8);
        encode_into(&Source::F32(&x), &e4, rne, false, &Random::None, out).expect("ok")
    });
    all("RNE bf16", &mut || {
        let out = CodesMut::U16(&mut o16);
        encode_into(&Source::F32(&x), &bf, rne, false, &Random::None, out).expect("ok")
    });
    all("SR fp8_e4m3, seeded, fresh output", &mut || {
        let mut o = vec![0u8; n];
        encode_into(
            &Source::F32(&x),
            &e4,
            sr,
            false,
            &seeded,
            CodesMut::U8(&mut o),
        )
        .expect("ok");
        black_box(o);
    });
    all("RNE bf16, fresh output", &mut || {
        let mut o = vec![0u16; n];
        let out = CodesMut::U16(&mut o);
        encode_into(&Source::F32(&x), &bf, rne, false, &Random::None, out).expect("ok");
        black_box(o);
    });
}
