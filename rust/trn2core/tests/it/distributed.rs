//! Collectives spread over processes: every placement gives the single-process bits (here the
//! processes are threads exchanging their messages over channels), and the plan moves no more
//! than the schedule's own transfers between processes.

use std::sync::mpsc::{channel, Receiver, Sender};

/// What one process ends with in a low-precision reduction: its ranks and their outputs (bf16
/// codes, fp8 codes).
type ProcessOutputs = (Vec<usize>, Vec<Vec<u16>>, Vec<Vec<u8>>);

use super::collectives::{applicable, buffers, nan_outputs, run_f32};
use trn2core::collective::distributed::{
    execute_move_local, execute_reduce_local, plan, Message, MessageMut, Placement,
};
use trn2core::collective::{
    build, execute_move, execute_reduce, output_lengths, Algorithm, Buf, BufMut, Collective, Group,
    ReduceOp, Transport,
};
use trn2core::numerics::Format;
use trn2core::topology::Torus;
use trn2core::{Error, Result};

/// One process's end of a full mesh of channels.
struct Threads {
    me: usize,
    tx: Vec<Sender<(usize, usize, Vec<u8>)>>,
    rx: Receiver<(usize, usize, Vec<u8>)>,
    /// Messages that arrived before they were asked for: (round, from, bytes).
    early: Vec<(usize, usize, Vec<u8>)>,
}

impl Transport for Threads {
    fn exchange(
        &mut self, round: usize, sends: &[Message<'_>], recvs: &mut [MessageMut<'_>],
    ) -> Result<()> {
        for m in sends {
            self.tx[m.peer]
                .send((round, self.me, m.bytes.to_vec()))
                .map_err(|_| Error::value("transport", "peer gone"))?;
        }
        for m in recvs.iter_mut() {
            let got = loop {
                if let Some(i) = self.early.iter().position(|(r, f, _)| *r == round && *f == m.peer)
                {
                    break self.early.swap_remove(i).2;
                }
                let msg = self.rx.recv().map_err(|_| Error::value("transport", "peer gone"))?;
                self.early.push(msg);
            };
            assert_eq!(got.len(), m.bytes.len(), "message length, round {round}");
            m.bytes.copy_from_slice(&got);
        }
        Ok(())
    }
}

fn transports(procs: usize) -> Vec<Threads> {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..procs).map(|_| channel()).unzip();
    rxs.into_iter()
        .enumerate()
        .map(|(me, rx)| Threads { me, tx: txs.clone(), rx, early: Vec::new() })
        .collect()
}

/// Runs `work(p, transport)` for every process `p` of `placement`, each on its own thread;
/// their results in process order.
fn per_process<T: Send>(
    placement: &Placement, work: impl Fn(usize, Threads) -> T + Sync,
) -> Vec<T> {
    let work = &work;
    std::thread::scope(|sc| {
        let hs: Vec<_> = transports(placement.procs())
            .into_iter()
            .enumerate()
            .map(|(p, tr)| sc.spawn(move || work(p, tr)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    })
}

fn placements(chips: usize) -> Vec<(String, Placement)> {
    let mut v = Vec::new();
    for procs in [1, 2, 4] {
        v.push((
            format!("contiguous/{procs}"),
            Placement::contiguous(chips, procs).expect("divides"),
        ));
    }
    // The worst case for traffic: chips dealt out round-robin over 3 processes.
    let rr: Vec<usize> = (0..chips).map(|c| c % 3).collect();
    v.push(("round-robin/3".into(), Placement::explicit(&rr, 3, chips).expect("valid")));
    v
}

fn values(n: usize, l: usize, seed: u32) -> Vec<Vec<f32>> {
    // Wide-ranging floats (so the order of additions shows), with zeros, a NaN and infinities.
    let mut x = seed.wrapping_mul(2654435761) | 1;
    buffers(n, l, |_, i| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        match i % 97 {
            5 => 0.0,
            6 => -0.0,
            _ => f32::from_bits((x & 0x807f_ffff) | ((100 + x % 56) << 23)),
        }
    })
}

/// Runs `group`'s collective on `inputs` spread by `placement`, one thread per process;
/// returns every rank's output in rank order.
fn spread_reduce(
    group: &Group, placement: &Placement, collective: Collective, op: ReduceOp, alg: Algorithm,
    format: Format, inputs: &[Vec<f32>],
) -> Vec<Vec<f32>> {
    let n = group.n();
    let l = inputs[0].len();
    let mut outs = nan_outputs(collective, n, l);
    let results = per_process(placement, |p, mut tr| {
        let (_, pl) = plan(group, placement, p, collective, alg, 4, l, None).expect("plan");
        let ins: Vec<Buf> = pl.ranks.iter().map(|&r| Buf::F32(&inputs[r])).collect();
        let mut mine: Vec<Vec<f32>> = pl.output_lens.iter().map(|&m| vec![0f32; m]).collect();
        let mut bm: Vec<BufMut> = mine.iter_mut().map(|o| BufMut::F32(o)).collect();
        execute_reduce_local(&pl, op, format, &ins, &mut bm, &mut tr).expect("run");
        (pl.ranks.clone(), mine)
    });
    for (ranks, mine) in results {
        for (r, o) in ranks.into_iter().zip(mine) {
            outs[r] = o;
        }
    }
    outs
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every algorithm that applies to the whole of `t`, and `Auto`.
fn algorithms(t: &Torus) -> Vec<Algorithm> {
    let mut v = applicable(t);
    v.push(Algorithm::Auto);
    v
}

#[test]
fn every_placement_gives_the_single_process_bits_of_every_reduction() {
    for t in [Torus::instance(), Torus::ultraserver()] {
        let g = Group::all(&t);
        let n = g.n();
        for alg in algorithms(&t) {
            for collective in [Collective::AllReduce, Collective::ReduceScatter] {
                for (l, op) in [(1000, ReduceOp::Sum), (37, ReduceOp::Max), (3, ReduceOp::Sum)] {
                    let inputs = values(n, l, l as u32);
                    let want = run_f32(&g, collective, op, alg, &inputs);
                    for (name, pl) in placements(n) {
                        let got =
                            spread_reduce(&g, &pl, collective, op, alg, Format::Fp32, &inputs);
                        for r in 0..n {
                            assert_eq!(
                                bits(&got[r]),
                                bits(&want[r]),
                                "{collective:?} {alg:?} {op:?} l={l} {name} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn low_precision_formats_round_once_wherever_the_sum_ends() {
    let t = Torus::instance();
    let g = Group::all(&t);
    let n = g.n();
    let l = 300;
    for format in [Format::Bf16, Format::Fp8E4m3] {
        // Codes with small exponents, so sums stay finite; stored one per u16 / u8.
        let codes: Vec<Vec<u16>> = buffers(n, l, |r, i| {
            let c = ((r * 131 + i * 71) % 200) as u16;
            if format == Format::Bf16 {
                0x3c00 + c + (((r + i) % 2) as u16) * 0x8000
            } else {
                c % 0x70 + (((r + i) % 2) as u16) * 0x80
            }
        });
        let bytes: Vec<Vec<u8>> =
            codes.iter().map(|c| c.iter().map(|&x| x as u8).collect()).collect();
        for alg in [Algorithm::Ring, Algorithm::Rdh, Algorithm::KangaRing] {
            let ins: Vec<Buf> = if format == Format::Bf16 {
                codes.iter().map(|x| Buf::U16(x)).collect()
            } else {
                bytes.iter().map(|x| Buf::U8(x)).collect()
            };
            let elem = (format.code_bits() / 8) as usize;
            let s = build(&g, Collective::AllReduce, alg, (l * elem) as u64, None).expect("build");
            let mut want16 = vec![vec![0u16; l]; n];
            let mut want8 = vec![vec![0u8; l]; n];
            let mut wm: Vec<BufMut> = if format == Format::Bf16 {
                want16.iter_mut().map(|o| BufMut::U16(o)).collect()
            } else {
                want8.iter_mut().map(|o| BufMut::U8(o)).collect()
            };
            execute_reduce(&s, ReduceOp::Sum, format, &ins, &mut wm).expect("exec");
            for (name, placement) in placements(n) {
                let outs: Vec<ProcessOutputs> = per_process(&placement, |p, mut tr| {
                    let all = Collective::AllReduce;
                    let (_, pl) = plan(&g, &placement, p, all, alg, elem, l, None).expect("plan");
                    let mine: Vec<Buf> = pl.ranks.iter().map(|&r| ins[r]).collect();
                    let mut o16 = vec![vec![0u16; l]; pl.ranks.len()];
                    let mut o8 = vec![vec![0u8; l]; pl.ranks.len()];
                    let mut om: Vec<BufMut> = if format == Format::Bf16 {
                        o16.iter_mut().map(|o| BufMut::U16(o)).collect()
                    } else {
                        o8.iter_mut().map(|o| BufMut::U8(o)).collect()
                    };
                    execute_reduce_local(&pl, ReduceOp::Sum, format, &mine, &mut om, &mut tr)
                        .expect("run");
                    (pl.ranks.clone(), o16, o8)
                });
                for (ranks, o16, o8) in outs {
                    for (i, r) in ranks.into_iter().enumerate() {
                        if format == Format::Bf16 {
                            assert_eq!(o16[i], want16[r], "{format:?} {alg:?} {name} rank {r}");
                        } else {
                            assert_eq!(o8[i], want8[r], "{format:?} {alg:?} {name} rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_placement_moves_data_like_one_process() {
    let t = Torus::instance();
    let g = Group::all(&t);
    let n = g.n();
    for (l, elem) in [(10usize, 4usize), (33, 2), (1, 1)] {
        let inputs: Vec<Vec<u8>> = buffers(n, l * elem, |r, i| (r * 37 + i * 11) as u8);
        let ins: Vec<&[u8]> = inputs.iter().map(|x| x.as_slice()).collect();
        for collective in [Collective::AllGather, Collective::AllToAll, Collective::SendRecv] {
            let algs: &[Algorithm] = if collective == Collective::AllGather {
                &[Algorithm::Ring, Algorithm::Rdh, Algorithm::KangaRing, Algorithm::Torus]
            } else {
                &[Algorithm::Mesh]
            };
            for &alg in algs {
                let peers: Vec<usize> = (0..n).map(|r| (r * 5 + 3) % n).collect();
                let peers = (collective == Collective::SendRecv).then_some(peers.as_slice());
                let size =
                    if collective == Collective::AllGather { n * l * elem } else { l * elem };
                let s = build(&g, collective, alg, size as u64, peers).expect("build");
                let mut want: Vec<Vec<u8>> =
                    output_lengths(collective, n, l).iter().map(|&m| vec![0u8; m * elem]).collect();
                let mut wm: Vec<&mut [u8]> = want.iter_mut().map(|o| o.as_mut_slice()).collect();
                execute_move(&s, elem, &ins, &mut wm).expect("exec");
                for (name, placement) in placements(n) {
                    let outs = per_process(&placement, |p, mut tr| {
                        let (_, pl) =
                            plan(&g, &placement, p, collective, alg, elem, l, peers).expect("plan");
                        let mine: Vec<&[u8]> = pl.ranks.iter().map(|&r| ins[r]).collect();
                        let mut o: Vec<Vec<u8>> =
                            pl.output_lens.iter().map(|&m| vec![0u8; m]).collect();
                        let mut om: Vec<&mut [u8]> =
                            o.iter_mut().map(|x| x.as_mut_slice()).collect();
                        execute_move_local(&pl, &mine, &mut om, &mut tr).expect("run");
                        (pl.ranks.clone(), o)
                    });
                    for (ranks, o) in outs {
                        for (i, r) in ranks.into_iter().enumerate() {
                            assert_eq!(o[i], want[r], "{collective:?} {alg:?} {name} rank {r}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_plan_moves_no_more_than_the_schedule_between_processes() {
    let t = Torus::instance();
    let g = Group::all(&t);
    let l = 1 << 16;
    for alg in algorithms(&t) {
        for procs in [2, 4] {
            let placement = Placement::contiguous(16, procs).expect("divides");
            let (_, p0) =
                plan(&g, &placement, 0, Collective::AllReduce, alg, 4, l, None).expect("plan");
            let tr = p0.traffic;
            assert!(tr.total <= tr.schedule, "{alg:?} P={procs}: {tr:?}");
            // Every process needs every other's contribution and gets the whole result: at
            // least one buffer's worth arrives at each.
            let sum: u64 = (0..procs)
                .map(|p| {
                    plan(&g, &placement, p, Collective::AllReduce, alg, 4, l, None)
                        .expect("plan")
                        .1
                        .traffic
                        .received
                })
                .sum();
            assert_eq!(sum, tr.total, "{alg:?} P={procs}");
            assert!(tr.received >= (l * 4) as u64, "{alg:?} P={procs}: {tr:?}");
        }
    }
    // The contiguous placement puts the snake ring's halves on the two processes: each chunk's
    // chain crosses at most twice, plus one delivery of the result.
    let placement = Placement::contiguous(16, 2).expect("divides");
    let (_, p0) =
        plan(&g, &placement, 0, Collective::AllReduce, Algorithm::Ring, 4, l, None).expect("plan");
    assert!(p0.traffic.total <= 3 * (l * 4) as u64, "{:?}", p0.traffic);
    assert!(p0.traffic.rounds <= 3, "{:?}", p0.traffic);
}

#[test]
fn placements_are_checked() {
    let e = Placement::contiguous(16, 3).expect_err("3 does not divide 16").to_string();
    assert!(e.contains("processes") && e.contains("16") && e.contains('3'), "{e}");
    assert!(Placement::contiguous(16, 0).is_err());
    assert!(Placement::contiguous(16, 32).is_err());
    let e = Placement::explicit(&[0, 1, 2], 2, 3).expect_err("process 2 of 2").to_string();
    assert!(e.contains("placement") && e.contains("chip 2"), "{e}");
    let e = Placement::explicit(&[0, 1], 2, 3).expect_err("2 entries for 3 chips").to_string();
    assert!(e.contains("placement") && e.contains("3 chips"), "{e}");
    let p = Placement::contiguous(16, 4).expect("divides");
    assert_eq!(p.of_chips()[..5], [0, 0, 0, 0, 1]);
    let t = Torus::instance();
    let g = Group::all(&t);
    assert_eq!(p.local_ranks(&g, 2).expect("ok"), vec![8, 9, 10, 11]);
    let e = plan(&g, &p, 4, Collective::AllReduce, Algorithm::Ring, 4, 10, None)
        .expect_err("process 4 of 4");
    assert!(e.to_string().contains("process 4"), "{e}");
}
