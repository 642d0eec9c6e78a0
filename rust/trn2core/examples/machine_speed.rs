//! Speed figures of the whole-core machine (issue 14), measured in Rust, each with a baseline in
//! the same run: `cargo run --release -p trn2core --example machine_speed`.
//!
//! 1. Issue rate of small Vector-engine `tensor_tensor` instructions (`[128, 64]` fp32 and bf16,
//!    and `[128, 1]`, where only the per-instruction overhead counts), against a plain Rust loop
//!    doing the same arithmetic on the same bytes (the memory-traffic floor of this host).
//! 2. Scheduling time of the recorded program (1 million instructions).
//! 3. `tensor_tensor` element throughput on large tiles (`[128, 16384]` fp32) against a plain
//!    Rust loop over three contiguous vectors.
//!
//! Best of 3 (5 for throughput). `N_INSTR` sets the instruction count (default 1,000,000).

use std::hint::black_box;
use std::time::Instant;

use trn2core::machine::{AluOp, Dtype, Engine, Machine, MachineConfig};
use trn2core::memory::Space;

fn best<F: FnMut() -> f64>(runs: usize, mut f: F) -> f64 {
    (0..runs).map(|_| f()).fold(f64::INFINITY, f64::min)
}

/// Issues `n` `tensor_tensor` multiplies over four `[128, free]` tiles; seconds (best of 3).
fn issue(n: usize, free: usize, dtype: Dtype) -> trn2core::Result<(f64, Machine)> {
    let mut core = Machine::new(MachineConfig::default())?;
    let tiles: Vec<_> = (0..4)
        .map(|i| core.alloc(Space::Sbuf, &format!("t{i}"), &[128, free], dtype))
        .collect::<trn2core::Result<_>>()?;
    for t in &tiles {
        core.memset(Engine::Vector, t, 1.0)?;
    }
    let s = best(3, || {
        core.clear_program();
        let t0 = Instant::now();
        for i in 0..n {
            let (a, b, d) = (&tiles[i % 4], &tiles[(i + 1) % 4], &tiles[(i + 2) % 4]);
            core.tensor_tensor(Engine::Vector, d, a, b, AluOp::Multiply).expect("valid");
        }
        t0.elapsed().as_secs_f64()
    });
    Ok((s, core))
}

/// One instruction's arithmetic as a plain loop: `d = a * b` on 128 rows of `free` floats at
/// `stride` floats apart (raw pointers: the rows of `d` never overlap those of `a`, `b`).
///
/// # Safety
/// All rows in bounds of `mem`.
#[inline(always)]
unsafe fn plain_body(mem: *mut f32, a: usize, b: usize, d: usize, stride: usize, free: usize) {
    for p in 0..128 {
        // SAFETY: in bounds by the caller's contract.
        unsafe {
            let (pa, pb, pd) =
                (mem.add(a + p * stride), mem.add(b + p * stride), mem.add(d + p * stride));
            for j in 0..free {
                *pd.add(j) = *pa.add(j) * *pb.add(j);
            }
        }
    }
}

/// [`plain_body`] compiled for AVX-512.
///
/// # Safety
/// As [`plain_body`]; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn plain_avx512(mem: *mut f32, a: usize, b: usize, d: usize, stride: usize, free: usize) {
    // SAFETY: the caller's contract.
    unsafe { plain_body(mem, a, b, d, stride, free) }
}

/// [`plain_body`] compiled for AVX2.
///
/// # Safety
/// As [`plain_body`]; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn plain_avx2(mem: *mut f32, a: usize, b: usize, d: usize, stride: usize, free: usize) {
    // SAFETY: the caller's contract.
    unsafe { plain_body(mem, a, b, d, stride, free) }
}

/// The same arithmetic as [`issue`] as a plain SIMD loop (the widest this CPU has, as the
/// machine's row kernels pick) over the machine's SBUF layout (224 KiB + 7744 B between
/// partitions): this host's memory-traffic floor.
fn floor(n: usize, free: usize) -> f64 {
    type Plain = unsafe fn(*mut f32, usize, usize, usize, usize, usize);
    #[cfg(target_arch = "x86_64")]
    let kernel: Plain = if std::arch::is_x86_feature_detected!("avx512f") {
        plain_avx512
    } else if std::arch::is_x86_feature_detected!("avx2") {
        plain_avx2
    } else {
        plain_body
    };
    #[cfg(not(target_arch = "x86_64"))]
    let kernel: Plain = plain_body;
    let stride = (229_376 + 7_744) / 4;
    let mut mem = vec![0.0f32; 128 * stride];
    // The same host memory as the machine's SBUF (huge pages where the kernel gives them).
    trn2core::host::advise_huge_pages(&mut mem);
    mem.fill(1.0);
    let tiles = [0, free, 2 * free, 3 * free];
    best(3, || {
        let t0 = Instant::now();
        for i in 0..n {
            let (a, b, d) = (tiles[i % 4], tiles[(i + 1) % 4], tiles[(i + 2) % 4]);
            // SAFETY: 128 rows of `free` floats from offsets below `4 * free` stay inside
            // `mem`; the kernel's SIMD level was detected above.
            unsafe { kernel(mem.as_mut_ptr(), a, b, d, stride, free) };
            black_box(&mem);
        }
        t0.elapsed().as_secs_f64()
    })
}

fn main() -> trn2core::Result<()> {
    let n: usize = std::env::var("N_INSTR").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let rate = |s: f64, count: usize| count as f64 / s;
    for (free, dtype) in [(64, Dtype::Fp32), (64, Dtype::Bf16), (1, Dtype::Fp32)] {
        let (s, _) = issue(n, free, dtype)?;
        let f = floor(n, free);
        println!(
            "issue: tensor_tensor [128, {free}] {dtype}: {:.0} instructions/s ({:.2} us each); \
             plain-loop floor {:.2} us (machine / floor = {:.2})",
            rate(s, n),
            s / n as f64 * 1e6,
            f / n as f64 * 1e6,
            s / f
        );
    }
    let (_, core) = issue(n, 64, Dtype::Fp32)?;
    let mut rep = None;
    let sched_s = best(3, || {
        let t0 = Instant::now();
        rep = Some(core.run());
        t0.elapsed().as_secs_f64()
    });
    let rep = rep.expect("ran")?;
    println!(
        "schedule: {} instructions in {:.3} s ({:.0} instructions/s); makespan {:.3} ms",
        rep.instructions,
        sched_s,
        rate(sched_s, rep.instructions as usize),
        rep.seconds * 1e3
    );
    // Throughput on large tiles.
    let mut big = Machine::new(MachineConfig::default())?;
    let f = 16384;
    let bt: Vec<_> = (0..3)
        .map(|i| big.alloc(Space::Sbuf, &format!("b{i}"), &[128, f], Dtype::Fp32))
        .collect::<trn2core::Result<_>>()?;
    for t in &bt {
        big.memset(Engine::Vector, t, 0.5)?;
    }
    let reps = 20;
    let s = best(5, || {
        let t0 = Instant::now();
        for _ in 0..reps {
            big.tensor_tensor(Engine::Vector, &bt[2], &bt[0], &bt[1], AluOp::Add).expect("valid");
        }
        t0.elapsed().as_secs_f64()
    });
    let (x, y) = (vec![0.5f32; 128 * f], vec![0.25f32; 128 * f]);
    let mut z = vec![0f32; 128 * f];
    let plain = best(5, || {
        let t0 = Instant::now();
        for _ in 0..reps {
            for ((o, &a), &b) in z.iter_mut().zip(&x).zip(&y) {
                *o = a + b;
            }
            black_box(&z);
        }
        t0.elapsed().as_secs_f64()
    });
    let elems = (128 * f * reps) as f64;
    println!(
        "throughput: tensor_tensor add [128, {f}] fp32: {:.2} Gelem/s; plain loop {:.2} Gelem/s \
         (plain / machine = {:.2})",
        elems / s / 1e9,
        elems / plain / 1e9,
        s / plain
    );
    Ok(())
}
