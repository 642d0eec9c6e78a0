//! Speed figures of the whole-core machine (issue 14), measured in Rust:
//! `cargo run --release -p trn2core --example machine_speed`.
//!
//! 1. Issue rate of small (128 x 64 fp32) Vector-engine `tensor_tensor` instructions.
//! 2. Scheduling time of the recorded program (1 million instructions).
//! 3. `tensor_tensor` element throughput on large tiles (128 x 16384 fp32).

use std::time::Instant;

use trn2core::machine::{AluOp, Dtype, Engine, Machine, MachineConfig};
use trn2core::memory::Space;

fn best<F: FnMut() -> f64>(runs: usize, mut f: F) -> f64 {
    (0..runs).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() -> trn2core::Result<()> {
    let n_instr: usize = std::env::var("N_INSTR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let mut core = Machine::new(MachineConfig::default())?;
    let tiles: Vec<_> = (0..4)
        .map(|i| core.alloc(Space::Sbuf, &format!("t{i}"), &[128, 64], Dtype::Fp32))
        .collect::<trn2core::Result<_>>()?;
    for t in &tiles {
        core.memset(Engine::Vector, t, 1.0)?;
    }
    core.clear_program();
    // 1. Issue rate.
    let mut issue_s = f64::INFINITY;
    for _ in 0..3 {
        core.clear_program();
        let t0 = Instant::now();
        for i in 0..n_instr {
            let (a, b, d) = (&tiles[i % 4], &tiles[(i + 1) % 4], &tiles[(i + 2) % 4]);
            core.tensor_tensor(Engine::Vector, d, a, b, AluOp::Multiply)?;
        }
        issue_s = issue_s.min(t0.elapsed().as_secs_f64());
    }
    println!(
        "issue: {n_instr} tensor_tensor [128, 64] fp32 in {:.3} s = {:.0} instructions/s ({:.2} us each)",
        issue_s,
        n_instr as f64 / issue_s,
        issue_s / n_instr as f64 * 1e6
    );
    // 2. Scheduling.
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
        rep.instructions as f64 / sched_s,
        rep.seconds * 1e3
    );
    // 3. Throughput on large tiles.
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
            big.tensor_tensor(Engine::Vector, &bt[2], &bt[0], &bt[1], AluOp::Add)
                .expect("valid");
        }
        t0.elapsed().as_secs_f64()
    });
    let elems = (128 * f * reps) as f64;
    println!(
        "throughput: tensor_tensor add [128, {f}] fp32: {:.2} Gelem/s ({:.2} ms per instruction)",
        elems / s / 1e9,
        s / reps as f64 * 1e3
    );
    Ok(())
}
