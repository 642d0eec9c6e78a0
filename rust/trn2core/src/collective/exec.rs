//! Executing a [`Schedule`] on data: the bits every rank ends with.
//!
//! # How
//!
//! The schedule is first run *symbolically*: every rank's working buffer holds, per fine chunk,
//! the identity of a value, either "rank r's input here" or "the combination of values a and b".
//! A transfer copies identities; a reducing transfer creates a combination node. This follows the
//! algorithm step by step (every hop, every partial sum) without touching data, and checks it:
//! a chunk that is sent before it exists, or a reduction that misses or repeats a rank, is an
//! error. What the ranks end with is a small expression per fine chunk; ranks that received the
//! same broadcast hold the same node.
//!
//! Then every distinct final expression is evaluated once over its chunk's elements, in blocks
//! that stay in L1, in parallel, and the result is written to every rank that holds it. So all
//! ranks get the same bits by construction, the order of the additions is exactly the
//! algorithm's (a ring adds the ranks in ring order starting after the chunk's owner; recursive
//! halving adds pairwise along the hypercube; the direct pattern adds the owner's value, then the
//! others in ascending rank order), and no per-step copy of the data is ever made.
//!
//! # Numerics
//!
//! Reductions compute in fp32, as the hardware does (\[S8\]\[S21\]): bf16, fp16 and fp8
//! buffers are decoded to their exact fp32 values, reduced in fp32 along the whole expression,
//! and the final fp32 result is encoded back to the buffer's format once, round to nearest even
//! (no saturation: an overflow becomes Inf, as an IEEE conversion does). Partial sums are *not*
//! rounded to the buffer's format between hops: the runtime documents fp32 reduction, but not
//! whether partial sums travel in fp32 or in the buffer's format; we choose fp32 and cost the
//! transfers at the buffer's element size. `sum` is IEEE addition; `max`/`min` propagate NaN and
//! order -0 below +0 (so they do not depend on operand order). Every NaN result is the canonical
//! quiet NaN of the format (payloads are not specified).

use rayon::prelude::*;

use super::ops::{Collective, ReduceOp};
use super::schedule::Schedule;
use crate::engine::CANONICAL_NAN;
use crate::numerics::{encode_into, fp8_lut, CodesMut, Encoding, Format, Random, Rounding, Source};
use crate::{Error, Result};

impl ReduceOp {
    /// One combination, the scalar definition.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => max_f32(a, b),
            ReduceOp::Min => min_f32(a, b),
        }
    }
}

#[inline(always)]
fn max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else {
        // Equal: only +0 / -0 can differ, and +0 wins.
        f32::from_bits(a.to_bits() & b.to_bits())
    }
}

#[inline(always)]
fn min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else {
        f32::from_bits(a.to_bits() | b.to_bits())
    }
}

/// An identity that is not yet there.
pub const UNDEF: u32 = u32::MAX;
/// Tag of a leaf identity: `LEAF | r` is rank `r`'s input at that position.
pub const LEAF: u32 = 1 << 31;

/// Most `ranks x fine chunks` cells the symbolic run tracks (a host-side limit: 2^28 cells are
/// 1 GiB of identities).
pub const MAX_SYMBOLIC_CELLS: usize = 1 << 28;

/// Moves (chunk copies) of the symbolic run between two checks of the cancellation token.
const CHECK_EVERY_MOVES: usize = 1 << 16;

/// Doubles the capacity of the combination nodes through the host check (a reducing step of a
/// large machine adds one node per moved chunk: up to 2^31 of 8 bytes).
fn grow_nodes(nodes: &mut Vec<[u32; 2]>) -> Result<()> {
    let more = nodes.capacity().max(1024);
    crate::host::reserve(nodes, more, "buffers", PARTIAL_SUMS)
}

/// What the node table is called in capacity errors.
const PARTIAL_SUMS: &str = "the functional model's partial sums";

/// The symbolic state after running a schedule.
#[derive(Debug, Clone)]
pub struct Symbolic {
    /// Ranks.
    pub n: usize,
    /// Fine chunks.
    pub g: usize,
    /// `state[r * g + f]`: the identity rank `r` holds at fine chunk `f`.
    pub state: Vec<u32>,
    /// Combination nodes: `nodes[i] = [a, b]` is identity `i`.
    pub nodes: Vec<[u32; 2]>,
}

impl Symbolic {
    /// The ranks whose inputs identity `id` combines, in the order the evaluation takes them
    /// (tests use it to check that a reduction takes every rank exactly once, in the
    /// algorithm's order). Combinations are commutative, so `a + b` and `b + a` are the same
    /// bits; the order of a chain is the order of its partial sums.
    pub fn leaves(&self, id: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut stack = vec![id];
        while let Some(x) = stack.pop() {
            if x & LEAF != 0 {
                out.push(x & !LEAF);
            } else {
                // The same traversal as `compile`: a leaf operand is folded after the other.
                let [a, b] = self.nodes[x as usize];
                if b & LEAF != 0 || a & LEAF == 0 {
                    stack.push(b);
                    stack.push(a);
                } else {
                    stack.push(a);
                    stack.push(b);
                }
            }
        }
        out
    }

    /// What rank `r` holds at fine chunk `f`.
    pub fn at(&self, r: usize, f: usize) -> u32 {
        self.state[r * self.g + f]
    }
}

/// Runs `s` symbolically (see the module doc). Errors if the schedule sends a chunk a rank does
/// not hold, or reduces into one it does not hold.
pub fn run_symbolic(s: &Schedule) -> Result<Symbolic> {
    let (n, k, g) = (s.n, s.k, s.fine_chunks());
    let cells = n.checked_mul(g).filter(|&c| c <= MAX_SYMBOLIC_CELLS).ok_or_else(|| {
        Error::capacity(
            "buffers",
            format!(
                "{n} chips x {g} chunks is beyond the {MAX_SYMBOLIC_CELLS} chunk cells the \
                     functional model tracks; cost it with estimate instead"
            ),
        )
    })?;
    // Ctrl-C: checked per rank of the initial state and per step (each at most a few
    // milliseconds of work at the cell limit).
    let cancel = crate::cancel::current();
    let mut state =
        crate::host::zeroed_vec::<u32>("buffers", "the functional model's chunk table", cells)?;
    for r in 0..n {
        cancel.check()?;
        state[r * g..(r + 1) * g].fill(UNDEF);
        for f in 0..g {
            let holds = match s.collective {
                Collective::AllGather => f / k == r,
                _ => true,
            };
            if holds {
                state[r * g + f] = LEAF | r as u32;
            }
        }
    }
    let mut nodes: Vec<[u32; 2]> = Vec::new();
    // Every reducing move adds one node: reserve them all at once (through the host check),
    // so that the table never doubles by copying gigabytes, which no Ctrl-C can interrupt.
    let reducing = s.phases.iter().filter(|p| p.reduce).try_fold(0usize, |acc, p| {
        let per_step =
            p.transfers.iter().try_fold(0usize, |a, t| a.checked_add(t.sel.fine_chunks(k)))?;
        acc.checked_add(per_step.checked_mul(p.repeat as usize)?)
    });
    if let Some(total) = reducing.filter(|&t| t > 0 && t < (LEAF - 1) as usize) {
        crate::host::reserve(&mut nodes, total, "buffers", PARTIAL_SUMS)?;
    }
    // One step's moves, `(cell, identity)`: every transfer of a step reads the state before the
    // step (they are concurrent), so they are gathered first. A step of a large machine moves
    // up to every cell (2^28 of them: 2 GiB of moves), so the vector is sized through the host
    // check, never grown blindly (an allocation failure would abort the process).
    let mut moves: Vec<(u32, u32)> = Vec::new();
    for phase in &s.phases {
        let per_step = phase
            .transfers
            .iter()
            .try_fold(0usize, |acc, t| acc.checked_add(t.sel.fine_chunks(k)))
            .ok_or_else(|| Error::capacity("buffers", "a step moves more chunks than exist"))?;
        if per_step > moves.capacity() {
            moves = Vec::new();
            crate::host::reserve(
                &mut moves,
                per_step,
                "buffers",
                "the functional model's moves of one step",
            )?;
        }
        for step in 0..phase.repeat {
            cancel.check()?;
            moves.clear();
            let mut checked = 0usize;
            for t in &phase.transfers {
                let (src, dst) = (t.src as usize, t.dst as usize);
                let mut bad = None;
                t.sel.for_each(step, k, &s.perms, |f| {
                    let v = state[src * g + f];
                    if v == UNDEF && bad.is_none() {
                        bad = Some(f);
                    }
                    // Cells are below MAX_SYMBOLIC_CELLS (2^28): they fit a u32.
                    moves.push(((dst * g + f) as u32, v));
                });
                if let Some(f) = bad {
                    return Err(Error::value(
                        "schedule",
                        format!(
                            "internal: {} step {step} sends chunk {f} from position {src}, which does \
                             not hold it",
                            phase.name
                        ),
                    ));
                }
                // Ctrl-C within a step too: one step of a large machine is seconds of work.
                if moves.len() - checked >= CHECK_EVERY_MOVES {
                    checked = moves.len();
                    cancel.check()?;
                }
            }
            for (i, &(cell, v)) in moves.iter().enumerate() {
                if i % CHECK_EVERY_MOVES == CHECK_EVERY_MOVES - 1 {
                    cancel.check()?;
                }
                let cell = cell as usize;
                if phase.reduce {
                    let have = state[cell];
                    if have == UNDEF {
                        return Err(Error::value(
                            "schedule",
                            format!("internal: {} reduces into an empty chunk", phase.name),
                        ));
                    }
                    if nodes.len() >= (LEAF - 1) as usize {
                        return Err(Error::capacity(
                            "buffers",
                            "too many partial sums for the functional model",
                        ));
                    }
                    // The arriving partial sum first, then the receiver's own value.
                    if nodes.len() == nodes.capacity() {
                        grow_nodes(&mut nodes)?;
                    }
                    nodes.push([v, have]);
                    state[cell] = (nodes.len() - 1) as u32;
                } else {
                    state[cell] = v;
                }
            }
        }
    }
    Ok(Symbolic { n, g, state, nodes })
}

/// Start of fine chunk `f` of `g` over `w` elements.
#[inline]
pub fn boundary(f: usize, g: usize, w: usize) -> usize {
    ((f as u128 * w as u128) / g.max(1) as u128) as usize
}

/// Element counts each rank's output has: all-reduce `l`; reduce-scatter rank `r` the elements
/// `floor(r l / n) .. floor((r + 1) l / n)`; all-gather `n l`; all-to-all `n` times the size of
/// input chunk `r` (chunk `j` is `floor(j l / n) .. floor((j + 1) l / n)`); send/recv `l`.
pub fn output_lengths(collective: Collective, n: usize, l: usize) -> Vec<usize> {
    (0..n)
        .map(|r| match collective {
            Collective::AllReduce | Collective::SendRecv => l,
            Collective::ReduceScatter => boundary(r + 1, n, l) - boundary(r, n, l),
            Collective::AllGather => n * l,
            Collective::AllToAll => n * (boundary(r + 1, n, l) - boundary(r, n, l)),
        })
        .collect()
}

/// An input buffer of a reduction, in its storage type.
#[derive(Debug, Clone, Copy)]
pub enum Buf<'a> {
    /// fp32 values.
    F32(&'a [f32]),
    /// bf16 or fp16 bit patterns (the format says which).
    U16(&'a [u16]),
    /// fp8 codes.
    U8(&'a [u8]),
}

impl Buf<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Buf::F32(x) => x.len(),
            Buf::U16(x) => x.len(),
            Buf::U8(x) => x.len(),
        }
    }
    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An output buffer of a reduction, in its storage type.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// fp32 values.
    F32(&'a mut [f32]),
    /// bf16 or fp16 bit patterns (the format says which).
    U16(&'a mut [u16]),
    /// fp8 codes.
    U8(&'a mut [u8]),
}

impl BufMut<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            BufMut::F32(x) => x.len(),
            BufMut::U16(x) => x.len(),
            BufMut::U8(x) => x.len(),
        }
    }
    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The buffer's first element and its element size in bytes.
    pub(super) fn raw(&mut self) -> (*mut u8, usize) {
        match self {
            BufMut::F32(x) => (x.as_mut_ptr().cast(), 4),
            BufMut::U16(x) => (x.as_mut_ptr().cast(), 2),
            BufMut::U8(x) => (x.as_mut_ptr(), 1),
        }
    }
}

/// Checks that `format` can be reduced and that the buffers' storage matches it.
pub fn check_reduce_format(format: Format) -> Result<()> {
    match format {
        Format::Fp32
        | Format::Bf16
        | Format::Fp16
        | Format::Fp8E4m3
        | Format::Fp8E5m2
        | Format::Fp8E3m4 => Ok(()),
        other => Err(Error::format(
            "buffers",
            format!(
                "{} buffers cannot be reduced: Trainium2 collectives reduce fp32, bf16, fp16 and \
                 fp8 (e4m3, e5m2, e3m4) data",
                other.name()
            ),
        )),
    }
}

/// Checks that every buffer has `w` elements stored as `format`'s codes.
pub(super) fn check_storage(format: Format, inputs: &[Buf], w: usize) -> Result<()> {
    let storage_ok = |b: &Buf| match (b, format) {
        (Buf::F32(_), Format::Fp32) => true,
        (Buf::U16(_), Format::Bf16 | Format::Fp16) => true,
        (Buf::U8(_), f) => f.code_bits() == 8,
        _ => false,
    };
    for (r, b) in inputs.iter().enumerate() {
        if b.len() != w {
            return Err(Error::shape(
                "buffers",
                format!("buffer {r} has {} elements, buffer 0 has {w}", b.len()),
            ));
        }
        if !storage_ok(b) {
            return Err(Error::format(
                "buffers",
                format!("buffer {r} is not stored as {}", format.name()),
            ));
        }
    }
    Ok(())
}

/// A postfix program evaluating one expression over a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Push rank's input.
    Load(u32),
    /// Combine the top with rank's input.
    Fold(u32),
    /// Pop the top and combine it into the new top.
    Merge,
}

/// Compiles identity `id` into a postfix program; returns it and the stack depth it needs.
fn compile(sym: &Symbolic, id: u32) -> (Vec<Op>, usize) {
    enum Work {
        Visit(u32),
        Fold(u32),
        Merge,
    }
    let mut prog = Vec::new();
    let mut work = vec![Work::Visit(id)];
    let (mut depth, mut max_depth) = (0usize, 0usize);
    while let Some(w) = work.pop() {
        match w {
            Work::Visit(x) if x & LEAF != 0 => {
                prog.push(Op::Load(x & !LEAF));
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            Work::Visit(x) => {
                let [a, b] = sym.nodes[x as usize];
                // A combination with a leaf folds the leaf straight from its input; two subtrees
                // are evaluated one after the other and merged. (The operators are commutative,
                // so which side is folded changes no bit.)
                if b & LEAF != 0 {
                    work.push(Work::Fold(b & !LEAF));
                    work.push(Work::Visit(a));
                } else if a & LEAF != 0 {
                    work.push(Work::Fold(a & !LEAF));
                    work.push(Work::Visit(b));
                } else {
                    work.push(Work::Merge);
                    work.push(Work::Visit(b));
                    work.push(Work::Visit(a));
                }
            }
            Work::Fold(r) => prog.push(Op::Fold(r)),
            Work::Merge => {
                prog.push(Op::Merge);
                depth -= 1;
            }
        }
    }
    (prog, max_depth)
}

/// Elements per evaluation block (16 KiB of fp32 per stack level).
pub(super) const BLOCK: usize = 4096;

#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut u8);
// SAFETY: the pointers are only written through in disjoint element ranges by different tasks
// (see `execute_reduce`), and the buffers outlive the parallel section.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// One group of receivers of the same value: `(rank, output offset of the chunk's first element)`.
struct Target {
    prog: Vec<Op>,
    receivers: Vec<(u32, usize)>,
}

struct Task {
    target: u32,
    /// Element range in the working buffer.
    start: usize,
    end: usize,
    /// Working-buffer start of the fine chunk (output offsets are relative to it).
    chunk_start: usize,
}

#[inline(always)]
fn read(inp: &Buf, i: usize, lut: &[f32; 256], fmt: Format) -> f32 {
    match inp {
        Buf::F32(x) => x[i],
        Buf::U16(x) => {
            if fmt == Format::Bf16 {
                f32::from_bits((x[i] as u32) << 16)
            } else {
                crate::numerics::f16_to_f32(x[i])
            }
        }
        Buf::U8(x) => lut[x[i] as usize],
    }
}

pub(super) fn load(dst: &mut [f32], inp: &Buf, start: usize, lut: &[f32; 256], fmt: Format) {
    match inp {
        Buf::F32(x) => dst.copy_from_slice(&x[start..start + dst.len()]),
        _ => {
            for (i, d) in dst.iter_mut().enumerate() {
                *d = read(inp, start + i, lut, fmt);
            }
        }
    }
}

#[inline(always)]
pub(super) fn fold_slice(acc: &mut [f32], other: &[f32], op: ReduceOp) {
    match op {
        ReduceOp::Sum => acc.iter_mut().zip(other).for_each(|(a, &b)| *a += b),
        ReduceOp::Max => acc.iter_mut().zip(other).for_each(|(a, &b)| *a = max_f32(*a, b)),
        ReduceOp::Min => acc.iter_mut().zip(other).for_each(|(a, &b)| *a = min_f32(*a, b)),
    }
}

/// `Op::Merge` of a block's reduction program: folds the top of the stack (`top` slots of
/// [`BLOCK`] floats, the first `len` of each in use) into the slot below it, and pops it.
#[inline(always)]
pub(super) fn merge_top(stack: &mut [f32], top: &mut usize, len: usize, op: ReduceOp) {
    let (lo, hi) = stack.split_at_mut((*top - 1) * BLOCK);
    let acc = &mut lo[(*top - 2) * BLOCK..(*top - 2) * BLOCK + len];
    fold_slice(acc, &hi[..len], op);
    *top -= 1;
}

pub(super) fn fold(
    acc: &mut [f32], inp: &Buf, start: usize, op: ReduceOp, lut: &[f32; 256], fmt: Format,
    tmp: &mut [f32],
) {
    match inp {
        Buf::F32(x) => fold_slice(acc, &x[start..start + acc.len()], op),
        _ => {
            let t = &mut tmp[..acc.len()];
            load(t, inp, start, lut, fmt);
            fold_slice(acc, t, op);
        }
    }
}

/// Executes a reducing schedule (all-reduce or reduce-scatter): `inputs[r]` is rank `r`'s
/// buffer in `format`, all of one length; `outputs[r]` receives rank `r`'s result
/// ([`output_lengths`]). Returns the symbolic run (for inspection).
pub fn execute_reduce(
    s: &Schedule, op: ReduceOp, format: Format, inputs: &[Buf], outputs: &mut [BufMut],
) -> Result<Symbolic> {
    check_reduce_format(format)?;
    if !s.collective.reduces() {
        return Err(Error::value("collective", "execute_reduce runs all_reduce or reduce_scatter"));
    }
    let n = s.n;
    check_buffer_counts(n, inputs.len(), outputs.len())?;
    let w = inputs[0].len();
    let want = output_lengths(s.collective, n, w);
    check_storage(format, inputs, w)?;
    for (r, o) in outputs.iter().enumerate() {
        if o.len() != want[r] {
            return Err(Error::shape(
                "outputs",
                format!("output {r} has {} elements, expected {}", o.len(), want[r]),
            ));
        }
    }
    let sym = run_symbolic(s)?;
    let (g, k) = (sym.g, s.k);
    // Receivers per fine chunk, grouped by the identity they hold; each distinct identity is
    // checked once to combine every rank's input, compiled once, and evaluated once.
    let mut targets: Vec<Target> = Vec::new();
    let mut tasks: Vec<Task> = Vec::new();
    let mut max_depth = 1;
    let cancel = crate::cancel::current();
    for f in 0..g {
        // Every chunk: with 16384 ranks, one chunk's receivers are a millisecond of work.
        cancel.check()?;
        let (c0, c1) = (boundary(f, g, w), boundary(f + 1, g, w));
        if c0 == c1 {
            continue;
        }
        let receivers: Vec<usize> = match s.collective {
            Collective::AllReduce => (0..n).collect(),
            _ => vec![f / k],
        };
        let mut local: Vec<(u32, u32)> = Vec::new(); // (identity, target index)
        for r in receivers {
            let id = sym.at(r, f);
            let offset = match s.collective {
                Collective::AllReduce => c0,
                _ => c0 - boundary(r, n, w),
            };
            let t = match local.iter().find(|(i, _)| *i == id) {
                Some(&(_, t)) => t,
                None => {
                    if id == UNDEF || sym.leaves(id).len() != n {
                        return Err(Error::value(
                            "schedule",
                            format!(
                                "internal: {} leaves position {r} with an incomplete reduction of \
                                 chunk {f}",
                                s.algorithm_name()
                            ),
                        ));
                    }
                    let (prog, depth) = compile(&sym, id);
                    max_depth = max_depth.max(depth);
                    targets.push(Target { prog, receivers: Vec::new() });
                    let t = (targets.len() - 1) as u32;
                    local.push((id, t));
                    let mut st = c0;
                    while st < c1 {
                        let en = (st + BLOCK).min(c1);
                        tasks.push(Task { target: t, start: st, end: en, chunk_start: c0 });
                        st = en;
                    }
                    t
                }
            };
            targets[t as usize].receivers.push((r as u32, offset));
        }
    }
    let lut = if format.code_bits() == 8 { fp8_lut(&format.encoding()) } else { [0f32; 256] };
    let enc = format.encoding();
    let ptrs: Vec<(OutPtr, usize)> = outputs
        .iter_mut()
        .map(|o| {
            let (p, e) = o.raw();
            (OutPtr(p), e)
        })
        .collect();
    tasks.par_iter().try_for_each_init(
        || (vec![0f32; (max_depth + 1) * BLOCK], vec![0u16; BLOCK], vec![0u8; BLOCK]),
        |(stack, codes16, codes8), task| -> Result<()> {
            // One relaxed load per 4096-element block: Ctrl-C stops the reduction promptly.
            cancel.check()?;
            check_fp_env()?;
            let tgt = &targets[task.target as usize];
            let len = task.end - task.start;
            let (stack_buf, tmp_all) = stack.split_at_mut(max_depth * BLOCK);
            let tmp = &mut tmp_all[..BLOCK];
            let mut top = 0usize;
            for &o in &tgt.prog {
                match o {
                    Op::Load(r) => {
                        let dst = &mut stack_buf[top * BLOCK..top * BLOCK + len];
                        load(dst, &inputs[r as usize], task.start, &lut, format);
                        top += 1;
                    }
                    Op::Fold(r) => {
                        let acc = &mut stack_buf[(top - 1) * BLOCK..(top - 1) * BLOCK + len];
                        fold(acc, &inputs[r as usize], task.start, op, &lut, format, tmp);
                    }
                    Op::Merge => merge_top(stack_buf, &mut top, len, op),
                }
            }
            let result = &mut stack_buf[..len];
            let rel = task.start - task.chunk_start;
            match format {
                Format::Fp32 => {
                    for v in result.iter_mut() {
                        if v.is_nan() {
                            *v = CANONICAL_NAN;
                        }
                    }
                    for &(r, off) in &tgt.receivers {
                        let (p, _) = ptrs[r as usize];
                        // SAFETY: output r has `want[r]` f32 elements; `off + rel + len` is within
                        // its chunk (checked by construction of the offsets above), and no other
                        // task writes this range of this output.
                        unsafe {
                            let dst = (p.0 as *mut f32).add(off + rel);
                            stream_copy_f32(result, dst);
                        }
                    }
                }
                _ => {
                    let src = encode_block(result, &enc, codes16, codes8)?.as_ptr();
                    for &(r, off) in &tgt.receivers {
                        let (p, e) = ptrs[r as usize];
                        // SAFETY: as above, in units of the output's element size `e`; `src`
                        // points at the `len` codes just encoded into this task's scratch.
                        unsafe {
                            let dst = p.0.add((off + rel) * e);
                            std::ptr::copy_nonoverlapping(src, dst, len * e);
                        }
                    }
                }
            }
            Ok(())
        },
    )?;
    Ok(sym)
}

/// Rounds the fp32 `result` once to nearest even into the codes of `enc`'s format, in a task's
/// scratch (`codes16` for 16-bit codes, else `codes8`; each at least `result.len()` long), and
/// returns those codes as bytes: what every rank receiving the value gets.
pub(super) fn encode_block<'a>(
    result: &[f32], enc: &Encoding, codes16: &'a mut [u16], codes8: &'a mut [u8],
) -> Result<&'a [u8]> {
    let len = result.len();
    let rne = |out| {
        encode_into(&Source::F32(result), enc, Rounding::NearestEven, false, &Random::None, out)
    };
    if enc.format.code_bits() == 16 {
        let c = &mut codes16[..len];
        rne(CodesMut::U16(c))?;
        // SAFETY: `c` holds `len` initialised u16 codes, `2 len` bytes, borrowed for `'a`.
        Ok(unsafe { std::slice::from_raw_parts(c.as_ptr().cast::<u8>(), len * 2) })
    } else {
        let c = &mut codes8[..len];
        rne(CodesMut::U8(c))?;
        Ok(c)
    }
}

/// Copies `src` to `dst` with non-temporal stores where the CPU has them (x86-64 SSE): the
/// results go to every rank's fresh output once and are not read back, so streaming them past
/// the caches saves the read-for-ownership of every output line (a third of the memory traffic).
///
/// # Safety
/// `dst` must be valid for `src.len()` writes and not overlap `src`.
pub(super) unsafe fn stream_copy_f32(src: &[f32], dst: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_sfence, _mm_stream_ps};
        let n = src.len();
        // Elements before the first 16-byte boundary of the destination.
        let head = ((16 - (dst as usize % 16)) % 16 / 4).min(n);
        // SAFETY: all offsets are below `n`, which the caller guarantees `dst` can hold;
        // `_mm_stream_ps` gets 16-byte aligned addresses (after `head`); SSE is part of x86-64.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            let mut i = head;
            while i + 4 <= n {
                _mm_stream_ps(dst.add(i), _mm_loadu_ps(src.as_ptr().add(i)));
                i += 4;
            }
            std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), n - i);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: as the caller guarantees.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
}

/// Refuses a host floating-point environment that flushes subnormals (a library built with
/// fast-math can set it for a whole thread): the sums would silently differ.
pub(super) fn check_fp_env() -> Result<()> {
    let tiny = std::hint::black_box(f32::MIN_POSITIVE);
    let half = std::hint::black_box(0.5f32);
    let sub = std::hint::black_box(f32::from_bits(1));
    if tiny * half == 0.0 || sub * std::hint::black_box(1.0f32) == 0.0 {
        return Err(Error::value(
            "environment",
            "the host floating-point environment flushes subnormals to zero; collectives need \
             the IEEE default",
        ));
    }
    Ok(())
}

/// One input and one output buffer per chip of `n`.
fn check_buffer_counts(n: usize, inputs: usize, outputs: usize) -> Result<()> {
    if inputs != n || outputs != n {
        return Err(Error::shape(
            "buffers",
            format!("{inputs} inputs and {outputs} outputs for {n} chips"),
        ));
    }
    Ok(())
}

/// Executes a data-movement schedule on raw bytes (`elem` bytes per element): all-gather
/// (symbolically, then one copy per received chunk), all-to-all and send/recv (whose schedules
/// are single direct steps: each transfer is one copy). `inputs` all have one length;
/// `outputs[r]` has [`output_lengths`] elements.
pub fn execute_move(
    s: &Schedule, elem: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]],
) -> Result<()> {
    let n = s.n;
    check_buffer_counts(n, inputs.len(), outputs.len())?;
    if elem == 0 || !inputs[0].len().is_multiple_of(elem) {
        return Err(Error::shape("buffers", "byte length is not a multiple of the element size"));
    }
    let l = inputs[0].len() / elem;
    if let Some(r) = inputs.iter().position(|b| b.len() != l * elem) {
        return Err(Error::shape(
            "buffers",
            format!("buffer {r} has {} bytes, buffer 0 has {}", inputs[r].len(), l * elem),
        ));
    }
    let want = output_lengths(s.collective, n, l);
    for (r, o) in outputs.iter().enumerate() {
        if o.len() != want[r] * elem {
            return Err(Error::shape(
                "outputs",
                format!("output {r} has {} bytes, expected {}", o.len(), want[r] * elem),
            ));
        }
    }
    let cancel = crate::cancel::current();
    match s.collective {
        Collective::AllGather => {
            let sym = run_symbolic(s)?;
            let (g, w) = (sym.g, n * l);
            outputs.par_iter_mut().enumerate().try_for_each(|(r, out)| {
                for f in 0..g {
                    let id = sym.at(r, f);
                    if id == UNDEF || id & LEAF == 0 {
                        return Err(Error::value(
                            "schedule",
                            format!("internal: position {r} misses gathered chunk {f}"),
                        ));
                    }
                    let src = (id & !LEAF) as usize;
                    let (c0, c1) = (boundary(f, g, w), boundary(f + 1, g, w));
                    let from = c0 - src * l;
                    copy_checked(
                        &mut out[c0 * elem..c1 * elem],
                        &inputs[src][from * elem..(from + c1 - c0) * elem],
                        &cancel,
                    )?;
                }
                Ok(())
            })
        }
        Collective::AllToAll | Collective::SendRecv => {
            // Direct schedules: one step, each transfer delivers final data. Group by receiver.
            let phase = s.phases.first().ok_or_else(|| Error::value("schedule", "empty"))?;
            let mut by_dst: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
            for (i, t) in phase.transfers.iter().enumerate() {
                if i % 4096 == 0 {
                    cancel.check()?;
                }
                // A send/recv transfer carries the whole buffer (all n chunks): only an
                // all-to-all's one chunk is needed. Listing the n chunks of each of n
                // transfers was n^2 work: hours for an UltraCluster's 262144 ranks.
                let j = if s.collective == Collective::SendRecv {
                    0
                } else {
                    let mut first = None;
                    t.sel.for_each(0, s.k, &s.perms, |f| {
                        first.get_or_insert(f);
                    });
                    first.unwrap_or(0)
                };
                by_dst[t.dst as usize].push((t.src as usize, j));
            }
            outputs.par_iter_mut().enumerate().try_for_each(|(d, out)| {
                for &(src, j) in &by_dst[d] {
                    if s.collective == Collective::SendRecv {
                        copy_checked(out, inputs[src], &cancel)?;
                    } else {
                        // Rank src's chunk j lands at position src of rank j's output.
                        let (c0, c1) = (boundary(j, n, l), boundary(j + 1, n, l));
                        let len = c1 - c0;
                        copy_checked(
                            &mut out[src * len * elem..(src + 1) * len * elem],
                            &inputs[src][c0 * elem..c1 * elem],
                            &cancel,
                        )?;
                    }
                }
                Ok(())
            })
        }
        _ => {
            Err(Error::value("collective", "execute_move runs all_gather, all_to_all or send_recv"))
        }
    }
}

/// Bytes copied between two checks of the cancellation token by [`copy_checked`] (about a
/// millisecond of memory bandwidth).
const COPY_CHUNK: usize = 4 << 20;

/// `dst.copy_from_slice(src)` in pieces of [`COPY_CHUNK`], checking `cancel` before each: a
/// send/recv of a 1 GiB buffer stops within a piece's time of Ctrl-C.
pub(super) fn copy_checked(
    dst: &mut [u8], src: &[u8], cancel: &crate::cancel::Cancel,
) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::shape(
            "outputs",
            format!("internal: a copy of {} bytes into {}", src.len(), dst.len()),
        ));
    }
    for (d, s) in dst.chunks_mut(COPY_CHUNK).zip(src.chunks(COPY_CHUNK)) {
        cancel.check()?;
        d.copy_from_slice(s);
    }
    Ok(())
}
