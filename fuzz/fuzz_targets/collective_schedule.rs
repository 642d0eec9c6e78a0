//! The collective schedule builder on arbitrary machines, chip subsets, collectives,
//! algorithms, message sizes, runtime ranks per chip and send/recv permutations: `build`
//! returns a schedule or a `Trn2ValueError`/`CapacityError` (never a panic); every schedule it
//! returns is valid when run symbolically (no rank sends what it does not hold), reduces or
//! gathers every rank exactly once, computes exact integer sums on data, and costs to a finite
//! time with no link busier than its capacity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trn2core::collective::{
    build, cost, execute_move, execute_reduce, output_lengths, run_symbolic, Algorithm, Buf,
    BufMut, Collective, Group, ReduceOp, LEAF_TAG, UNDEF,
};
use trn2core::topology::Torus;
use trn2core::{Error, Format};

/// Reads the fuzzer's bytes as small numbers (zero when they run out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, i| acc | u64::from(self.u8()) << (8 * i))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let torus = match b.u8() % 5 {
        0 => Torus::single_chip(),
        1 => Torus::instance(),
        2 => Torus::ultraserver(),
        _ => match Torus::ultracluster(1 + usize::from(b.u8() % 2)) {
            Ok(t) => t,
            Err(_) => return,
        },
    };
    let size = torus.size();
    // Every chip in order, or a subset in an order the bytes pick.
    let chips: Vec<usize> = if b.u8() % 2 == 0 {
        (0..size).collect()
    } else {
        let want = 1 + usize::from(b.u8()) % size.min(64);
        let mut pool: Vec<usize> = (0..size).collect();
        (0..want)
            .map(|_| {
                let i = (usize::from(b.u8()) | usize::from(b.u8()) << 8) % pool.len();
                pool.swap_remove(i)
            })
            .collect()
    };
    let group = match Group::new(&torus, chips) {
        Ok(g) => g.with_ranks_per_chip(usize::from(b.u8() % 9)),
        Err(e) => panic!("valid chips refused: {e}"),
    };
    let n = group.n();
    let collective = Collective::ALL[usize::from(b.u8()) % Collective::ALL.len()];
    let algorithm = Algorithm::ALL[usize::from(b.u8()) % Algorithm::ALL.len()];
    let message = b.u64() >> (b.u8() % 64);
    let peers: Option<Vec<usize>> = (b.u8() % 2 == 1).then(|| {
        // A permutation, or (rarely) not one: the builder must refuse the latter.
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, usize::from(b.u8()) % (i + 1));
        }
        if b.u8() == 255 && n > 1 {
            p[0] = p[1];
        }
        p
    });
    let sched = match build(&group, collective, algorithm, message, peers.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            assert!(
                matches!(e, Error::Value { .. } | Error::Capacity { .. }),
                "{collective:?} {algorithm:?} on {n} ranks: {e:?}"
            );
            return;
        }
    };
    assert_eq!(sched.n, n);
    // The timing: finite, and no link used beyond its capacity.
    let timing = cost(&sched, &group, 4096.0, false).expect("a built schedule costs");
    assert!(timing.seconds.is_finite() && timing.seconds >= 0.0);
    assert!(timing.max_link_utilization <= 1.0 + 1e-9, "{}", timing.max_link_utilization);
    if matches!(collective, Collective::AllToAll | Collective::SendRecv) || n > 256 {
        if n <= 256 {
            check_move(&sched, n, collective, peers.as_deref());
        }
        return;
    }
    // Symbolically: every rank ends with what the collective promises.
    let sym = run_symbolic(&sched).expect("a built schedule runs");
    let (g, k) = (sym.g, sched.k);
    // Every chunk, on three of its ranks (all of them is n^3 work: seconds per input).
    for f in 0..g {
        for r in [0, n - 1, f % n] {
            let id = sym.at(r, f);
            let must = match collective {
                Collective::AllReduce => true,
                Collective::ReduceScatter => f / k == r,
                _ => true,
            };
            if !must {
                continue;
            }
            assert_ne!(id, UNDEF, "rank {r} lacks chunk {f}");
            if collective == Collective::AllGather {
                assert_eq!(id & LEAF_TAG, LEAF_TAG, "a gathered chunk is one rank's input");
            } else {
                let mut leaves = sym.leaves(id);
                leaves.sort_unstable();
                assert!(leaves.iter().copied().eq(0..n as u32), "chunk {f} of rank {r}");
            }
        }
    }
    if collective.reduces() && n <= 64 {
        // On data: rank r holds r + j at element j; sums are exact in fp32 here.
        let l = 1 + usize::from(b.u8() % 40);
        let inputs: Vec<Vec<f32>> =
            (0..n).map(|r| (0..l).map(|j| (r + j) as f32).collect()).collect();
        let bufs: Vec<Buf> = inputs.iter().map(|v| Buf::F32(v)).collect();
        let lens = output_lengths(collective, n, l);
        let mut outs: Vec<Vec<f32>> = lens.iter().map(|&m| vec![f32::NAN; m]).collect();
        let mut views: Vec<BufMut> = outs.iter_mut().map(|v| BufMut::F32(v)).collect();
        execute_reduce(&sched, ReduceOp::Sum, Format::Fp32, &bufs, &mut views)
            .expect("a built schedule reduces");
        let base = (n * (n - 1) / 2) as f32;
        let mut at = 0;
        for (r, o) in outs.iter().enumerate() {
            for (i, &v) in o.iter().enumerate() {
                let j = if collective == Collective::AllReduce { i } else { at + i };
                assert_eq!(v, base + (n * j) as f32, "rank {r} element {i}");
            }
            at += o.len();
        }
    }
});

/// All-to-all and send/recv on bytes: rank r's byte j is (r * 7 + j) mod 251.
fn check_move(
    sched: &trn2core::collective::Schedule, n: usize, c: Collective, peers: Option<&[usize]>,
) {
    let l = 2 * n;
    let inputs: Vec<Vec<u8>> =
        (0..n).map(|r| (0..l).map(|j| ((r * 7 + j) % 251) as u8).collect()).collect();
    let ins: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let lens = output_lengths(c, n, l);
    let mut outs: Vec<Vec<u8>> = lens.iter().map(|&m| vec![0u8; m]).collect();
    let mut views: Vec<&mut [u8]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
    execute_move(sched, 1, &ins, &mut views).expect("a built schedule moves");
    if c == Collective::SendRecv {
        for (r, input) in inputs.iter().enumerate() {
            let to = peers.map_or((r + 1) % n, |p| p[r]);
            assert_eq!(&outs[to], input, "rank {r} -> {to}");
        }
    }
}
