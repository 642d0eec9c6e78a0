//! Cancellation (Ctrl-C in Python, issue 8): the long loops of the collectives, the codec's two
//! passes and the collective cost walk stop with `Error::Interrupted` when the installed token
//! is cancelled, and the same calls succeed with identical results once it is not.

use trn2core::cancel::Cancel;
use trn2core::collective::{
    estimate, run_move, run_reduce, Algorithm, Buf, BufMut, Collective, Group, ReduceOp,
};
use trn2core::dma::{self, Codec};
use trn2core::numerics::Format;
use trn2core::topology::Torus;
use trn2core::Error;

fn cancelled() -> Cancel {
    let c = Cancel::new();
    c.cancel();
    c
}

fn reduce(
    g: &Group, collective: Collective, bufs: &[Vec<f32>], token: &Cancel,
) -> Result<Vec<Vec<f32>>, Error> {
    let n = g.n();
    let l = bufs[0].len();
    let lens = trn2core::collective::output_lengths(collective, n, l);
    let mut outs: Vec<Vec<f32>> = lens.iter().map(|&m| vec![0f32; m]).collect();
    let inputs: Vec<Buf> = bufs.iter().map(|b| Buf::F32(b)).collect();
    let mut o: Vec<BufMut> = outs.iter_mut().map(|x| BufMut::F32(x)).collect();
    token.install(|| {
        run_reduce(g, collective, ReduceOp::Sum, Algorithm::Ring, Format::Fp32, &inputs, &mut o)
    })?;
    drop(o);
    Ok(outs)
}

#[test]
fn a_cancelled_reduction_is_interrupted_and_an_armed_one_completes() {
    let t = Torus::instance();
    let g = Group::all(&t);
    let bufs: Vec<Vec<f32>> = (0..16).map(|r| vec![r as f32; 50_000]).collect();
    for collective in [Collective::AllReduce, Collective::ReduceScatter] {
        assert_eq!(reduce(&g, collective, &bufs, &cancelled()), Err(Error::Interrupted));
        let a = reduce(&g, collective, &bufs, &Cancel::new()).expect("armed token");
        let b = reduce(&g, collective, &bufs, &Cancel::none()).expect("no token");
        assert_eq!(a, b);
        assert!(a.iter().flatten().all(|&v| v == 120.0));
    }
}

#[test]
fn cancelled_data_movement_is_interrupted() {
    let t = Torus::instance();
    let g = Group::all(&t);
    let bufs: Vec<Vec<u8>> = (0..16).map(|r| vec![r as u8; 64 * 16]).collect();
    let inputs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
    for collective in [Collective::AllGather, Collective::AllToAll, Collective::SendRecv] {
        let lens = trn2core::collective::output_lengths(collective, 16, bufs[0].len());
        let mut outs: Vec<Vec<u8>> = lens.iter().map(|&m| vec![0u8; m]).collect();
        let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|x| x.as_mut_slice()).collect();
        let r = cancelled()
            .install(|| run_move(&g, collective, Algorithm::Auto, 1, &inputs, &mut o, None));
        assert_eq!(r.err(), Some(Error::Interrupted), "{collective:?}");
        let r = Cancel::new()
            .install(|| run_move(&g, collective, Algorithm::Auto, 1, &inputs, &mut o, None));
        assert!(r.is_ok(), "{collective:?}");
    }
}

#[test]
fn a_cancelled_cost_walk_is_interrupted() {
    let t = Torus::ultracluster(2).expect("two UltraServers");
    let g = Group::all(&t);
    let walk = || estimate(&g, Collective::AllReduce, Algorithm::Auto, 1 << 20, 4, None, false);
    let r = cancelled().install(walk);
    assert_eq!(r.err(), Some(Error::Interrupted));
    let a = walk().expect("ok");
    let b = Cancel::new().install(walk).expect("ok");
    assert_eq!(a.1, b.1);
}

#[test]
fn a_cancelled_two_pass_compression_is_interrupted() {
    let x: Vec<u8> = (0..1u32 << 20).map(|i| (i % 7) as u8 * (i % 3 == 0) as u8).collect();
    for codec in [Codec::Zvc, Codec::BytePlane, Codec::None] {
        let planned = cancelled().install(|| dma::plan_compress(&x, 4, codec, "<f4", &[1 << 18]));
        assert!(matches!(planned, Err(Error::Interrupted)), "{codec:?}");
        let planned = dma::plan_compress(&x, 4, codec, "<f4", &[1 << 18]).expect("plan");
        let mut out = vec![0u8; planned.len()];
        assert_eq!(cancelled().install(|| planned.write(&mut out)), Err(Error::Interrupted));
        planned.write(&mut out).expect("write");
        assert_eq!(out, dma::compress(&x, 4, codec, "<f4", &[1 << 18]).expect("compress"));
    }
}
