//! Running a [`LocalPlan`] (see [`distributed`](super)): the message buffers, each round's
//! exchange over a [`Transport`], and a reduction's local evaluations or a data movement's byte
//! copies.

use rayon::prelude::*;

use super::super::exec::{
    self, check_fp_env, check_storage, encode_block, fold, fold_slice, load, merge_top,
    stream_copy_f32, Buf, BufMut, OutPtr, BLOCK,
};
use super::super::ops::ReduceOp;
use super::plan::{internal, words, Dest, From, LocalPlan, MsgSpec, Op, Piece, Src, To};
use crate::engine::CANONICAL_NAN;
use crate::numerics::{fp8_lut, Format};
use crate::{Error, Result};

/// One message of a round: to (or from) process `peer`.
#[derive(Debug)]
pub struct Message<'a> {
    /// The other process.
    pub peer: usize,
    /// The message's bytes.
    pub bytes: &'a [u8],
}

/// A message to receive: from process `peer`, into `bytes` (its exact length).
#[derive(Debug)]
pub struct MessageMut<'a> {
    /// The other process.
    pub peer: usize,
    /// Where the message lands (exactly its length).
    pub bytes: &'a mut [u8],
}

/// Moves one round's messages between the processes (MPI in the Python facade; threads and
/// channels in the tests). Every process calls it for every round, in order, with the messages
/// the plan gives; it returns once all of this process's sends of the round have left and all
/// its receives have arrived.
pub trait Transport {
    /// Sends `sends` and fills `recvs` (round `round`, counted from 0).
    fn exchange(
        &mut self, round: usize, sends: &[Message<'_>], recvs: &mut [MessageMut<'_>],
    ) -> Result<()>;
}

/// Message buffers, in whole 4-byte words (fp32 partial results are read in place).
struct Buffers {
    sends: Vec<Vec<f32>>,
    recvs: Vec<Vec<f32>>,
}

impl Buffers {
    fn new(plan: &LocalPlan) -> Result<Buffers> {
        let bytes: u128 =
            plan.sends.iter().chain(&plan.recvs).map(|m| words(m.bytes) as u128 * 4).sum();
        crate::host::check_alloc("buffers", "the messages between processes", bytes)?;
        let alloc = |m: &MsgSpec| {
            let mut v = crate::host::zeroed_vec::<f32>("buffers", "a message", words(m.bytes))?;
            crate::host::advise_huge_pages(&mut v);
            Ok(v)
        };
        Ok(Buffers {
            sends: plan.sends.iter().map(alloc).collect::<Result<_>>()?,
            recvs: plan.recvs.iter().map(alloc).collect::<Result<_>>()?,
        })
    }
}

fn as_bytes(v: &[f32], len: usize) -> &[u8] {
    // SAFETY: any f32 storage is valid as bytes; `len <= 4 * v.len()` (message sizes are whole
    // words, see `words`).
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), len.min(v.len() * 4)) }
}

fn as_bytes_mut(v: &mut [f32], len: usize) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every byte pattern is a valid f32, so writes through the bytes
    // leave valid floats.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len.min(v.len() * 4)) }
}

/// Runs round `round`'s exchange of `plan` over `transport`.
fn exchange(
    plan: &LocalPlan, bufs: &mut Buffers, round: usize, transport: &mut dyn Transport,
) -> Result<()> {
    let sends: Vec<Message> = plan
        .sends
        .iter()
        .zip(&bufs.sends)
        .filter(|(m, _)| m.round == round)
        .map(|(m, b)| Message { peer: m.peer, bytes: as_bytes(b, m.bytes) })
        .collect();
    let mut recvs: Vec<MessageMut> = plan
        .recvs
        .iter()
        .zip(bufs.recvs.iter_mut())
        .filter(|(m, _)| m.round == round)
        .map(|(m, b)| MessageMut { peer: m.peer, bytes: as_bytes_mut(b, m.bytes) })
        .collect();
    transport.exchange(round, &sends, &mut recvs)
}

/// Runs this process's part of a reduction planned by [`plan_reduce`](super::plan_reduce):
/// `inputs` and `outputs` are its ranks' buffers (in `plan.ranks` order).
pub fn execute_reduce_local(
    plan: &LocalPlan, op: ReduceOp, format: Format, inputs: &[Buf], outputs: &mut [BufMut],
    transport: &mut dyn Transport,
) -> Result<()> {
    exec::check_reduce_format(format)?;
    check_local(plan, inputs.len(), outputs.len())?;
    if let Some(b) = inputs.first() {
        check_storage(format, inputs, b.len())?;
    }
    check_output_lens(plan, outputs.iter().map(|o| o.len()), "elements")?;
    let mut bufs = Buffers::new(plan)?;
    let lut = if format.code_bits() == 8 { fp8_lut(&format.encoding()) } else { [0f32; 256] };
    let enc = format.encoding();
    let elem = (format.code_bits() / 8) as usize;
    let outs: Vec<OutPtr> = outputs.iter_mut().map(|o| OutPtr(o.raw().0)).collect();
    let cancel = crate::cancel::current();
    let max_depth = plan.max_depth;
    for (round, parts) in plan.parts.iter().enumerate() {
        cancel.check()?;
        // Blocks of every part of the round, evaluated in parallel.
        let tasks: Vec<(usize, usize, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                (p.c0..p.c1).step_by(BLOCK).map(move |st| (i, st, (st + BLOCK).min(p.c1)))
            })
            .collect();
        let sends: Vec<OutPtr> =
            bufs.sends.iter_mut().map(|b| OutPtr(b.as_mut_ptr().cast::<u8>())).collect();
        let recvs = &bufs.recvs;
        tasks.par_iter().try_for_each_init(
            || (vec![0f32; (max_depth + 1) * BLOCK], vec![0u16; BLOCK], vec![0u8; BLOCK]),
            |(stack, codes16, codes8), &(pi, start, end)| -> Result<()> {
                cancel.check()?;
                check_fp_env()?;
                let part = &parts[pi];
                let len = end - start;
                let rel = start - part.c0;
                let (stack_buf, tmp_all) = stack.split_at_mut(max_depth * BLOCK);
                let tmp = &mut tmp_all[..BLOCK];
                let mut top = 0usize;
                let received = |msg: u32, at: usize| -> Result<&[f32]> {
                    recvs
                        .get(msg as usize)
                        .and_then(|b| b.get(at + rel..at + rel + len))
                        .ok_or_else(|| internal("an operand outside its message"))
                };
                for &o in &part.prog {
                    match o {
                        Op::Load(src) => {
                            let dst = &mut stack_buf[top * BLOCK..top * BLOCK + len];
                            match src {
                                Src::Input(i) => {
                                    load(dst, &inputs[i as usize], start, &lut, format)
                                }
                                Src::Recv { msg, at } => dst.copy_from_slice(received(msg, at)?),
                            }
                            top += 1;
                        }
                        Op::Fold(src) => {
                            let acc = &mut stack_buf[(top - 1) * BLOCK..(top - 1) * BLOCK + len];
                            match src {
                                Src::Input(i) => {
                                    fold(acc, &inputs[i as usize], start, op, &lut, format, tmp)
                                }
                                Src::Recv { msg, at } => fold_slice(acc, received(msg, at)?, op),
                            }
                        }
                        Op::Merge => merge_top(stack_buf, &mut top, len, op),
                    }
                }
                let result = &mut stack_buf[..len];
                match &part.dest {
                    Dest::Send { msg, at } => {
                        let b = &bufs_len(&plan.sends, *msg)?;
                        if (at + rel + len) * 4 > *b {
                            return Err(internal("a partial result outside its message"));
                        }
                        // SAFETY: the message has room for the range (checked above); parts
                        // write disjoint ranges of their messages, and no one reads the send
                        // messages during the round.
                        unsafe {
                            let dst = (sends[*msg as usize].0 as *mut f32).add(at + rel);
                            std::ptr::copy_nonoverlapping(result.as_ptr(), dst, len);
                        }
                    }
                    Dest::Final { local, remote } => {
                        let codes: &[u8] = match format {
                            Format::Fp32 => {
                                for v in result.iter_mut() {
                                    if v.is_nan() {
                                        *v = CANONICAL_NAN;
                                    }
                                }
                                for &(i, off) in local {
                                    // SAFETY: local output i has `output_lens[i]` f32 elements
                                    // and the part's range lies in it (offsets from the
                                    // schedule's chunks, as in `execute_reduce`); no other
                                    // task writes this range.
                                    unsafe {
                                        let dst = (outs[i as usize].0 as *mut f32).add(off + rel);
                                        stream_copy_f32(result, dst);
                                    }
                                }
                                as_bytes(result, len * 4)
                            }
                            _ => {
                                let codes = encode_block(result, &enc, codes16, codes8)?;
                                for &(i, off) in local {
                                    // SAFETY: as above, in units of the element size.
                                    unsafe {
                                        let dst = outs[i as usize].0.add((off + rel) * elem);
                                        std::ptr::copy_nonoverlapping(
                                            codes.as_ptr(),
                                            dst,
                                            len * elem,
                                        );
                                    }
                                }
                                codes
                            }
                        };
                        for &(msg, at) in remote {
                            let b = bufs_len(&plan.sends, msg)?;
                            if at + (rel + len) * elem > b {
                                return Err(internal("a final value outside its message"));
                            }
                            // SAFETY: in range (checked above), disjoint from other tasks'
                            // ranges.
                            unsafe {
                                let dst = sends[msg as usize].0.add(at + rel * elem);
                                std::ptr::copy_nonoverlapping(codes.as_ptr(), dst, len * elem);
                            }
                        }
                    }
                }
                Ok(())
            },
        )?;
        exchange(plan, &mut bufs, round, transport)?;
    }
    // Final values computed elsewhere.
    let recvs = &bufs.recvs;
    plan.deliveries.par_iter().try_for_each(|d| -> Result<()> {
        cancel.check()?;
        let src = as_bytes(&recvs[d.msg as usize], plan.recvs[d.msg as usize].bytes)
            .get(d.at..d.at + d.len * elem)
            .ok_or_else(|| internal("a delivery outside its message"))?;
        for &(i, off) in &d.to {
            if (off + d.len) > plan.output_lens[i as usize] {
                return Err(internal("a delivery outside its output"));
            }
            // SAFETY: in range (checked above); deliveries write disjoint ranges. fp32 values
            // are read from a whole-word message offset (aligned).
            unsafe {
                let dst = outs[i as usize].0.add(off * elem);
                if elem == 4 {
                    let words = std::slice::from_raw_parts(src.as_ptr().cast::<f32>(), d.len);
                    stream_copy_f32(words, dst.cast::<f32>());
                } else {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), dst, d.len * elem);
                }
            }
        }
        Ok(())
    })
}

fn bufs_len(specs: &[MsgSpec], msg: u32) -> Result<usize> {
    specs.get(msg as usize).map(|m| m.bytes).ok_or_else(|| internal("no such message"))
}

fn check_local(plan: &LocalPlan, inputs: usize, outputs: usize) -> Result<()> {
    let mine = plan.ranks.len();
    if inputs != mine || outputs != mine {
        return Err(Error::shape(
            "buffers",
            format!(
                "process {} holds {mine} chips; got {inputs} buffers and {outputs} outputs",
                plan.process
            ),
        ));
    }
    Ok(())
}

/// `ShapeError` on `outputs` unless each has the plan's length (`lens`, in `unit`).
fn check_output_lens(
    plan: &LocalPlan, lens: impl Iterator<Item = usize>, unit: &str,
) -> Result<()> {
    for (len, &want) in lens.zip(&plan.output_lens) {
        if len != want {
            return Err(Error::shape(
                "outputs",
                format!("an output has {len} {unit}, expected {want}"),
            ));
        }
    }
    Ok(())
}

/// Runs this process's part of a data-movement collective planned by
/// [`plan_move`](super::plan_move): `inputs` and `outputs` are its ranks' buffers as bytes (in
/// `plan.ranks` order).
pub fn execute_move_local(
    plan: &LocalPlan, inputs: &[&[u8]], outputs: &mut [&mut [u8]], transport: &mut dyn Transport,
) -> Result<()> {
    check_local(plan, inputs.len(), outputs.len())?;
    check_output_lens(plan, outputs.iter().map(|o| o.len()), "bytes")?;
    let mut bufs = Buffers::new(plan)?;
    let cancel = crate::cancel::current();
    let copy = |p: &Piece,
                outputs: &mut [&mut [u8]],
                sends: &mut [Vec<f32>],
                recvs: &[Vec<f32>]|
     -> Result<()> {
        let src: &[u8] = match p.from {
            From::Input { i, at } => inputs
                .get(i as usize)
                .and_then(|b| b.get(at..at + p.len))
                .ok_or_else(|| internal("a piece outside its input"))?,
            From::Recv { msg, at } => {
                as_bytes(&recvs[msg as usize], plan.recvs[msg as usize].bytes)
                    .get(at..at + p.len)
                    .ok_or_else(|| internal("a piece outside its message"))?
            }
        };
        let dst: &mut [u8] = match p.to {
            To::Output { i, at } => outputs
                .get_mut(i as usize)
                .and_then(|b| b.get_mut(at..at + p.len))
                .ok_or_else(|| internal("a piece outside its output"))?,
            To::Send { msg, at } => {
                let len = plan.sends[msg as usize].bytes;
                as_bytes_mut(&mut sends[msg as usize], len)
                    .get_mut(at..at + p.len)
                    .ok_or_else(|| internal("a piece outside its message"))?
            }
        };
        exec::copy_checked(dst, src, &cancel)
    };
    for p in &plan.before {
        copy(p, outputs, &mut bufs.sends, &bufs.recvs)?;
    }
    if plan.traffic.rounds > 0 {
        exchange(plan, &mut bufs, 0, transport)?;
    }
    for p in &plan.after {
        copy(p, outputs, &mut bufs.sends, &bufs.recvs)?;
    }
    Ok(())
}

/// A loop-back [`Transport`] for one process (nothing to exchange): what a single process runs
/// with, and what the tests compare every placement against.
#[derive(Debug, Default)]
pub struct Alone;

impl Transport for Alone {
    fn exchange(
        &mut self, _round: usize, sends: &[Message<'_>], recvs: &mut [MessageMut<'_>],
    ) -> Result<()> {
        if sends.is_empty() && recvs.is_empty() {
            Ok(())
        } else {
            Err(internal("a single process has no one to exchange with"))
        }
    }
}
