//! Fast paths of the element-wise instructions: tiles whose every partition is one contiguous
//! run of fp32 or bf16 elements, rounded to nearest even. They compute exactly what the
//! general path computes (the same operators of [`super::alu`], the same bf16 rounding kernel
//! of `numerics`), partition by partition straight from the machine's memory through a small
//! float32 buffer in L1, with the SIMD level chosen once per instruction. The unit tests and
//! `tests/it/machine.rs` compare both paths bit for bit.
//!
//! An input may be the destination itself (the same bytes: read each chunk before writing it)
//! or lie elsewhere; the callers send partial overlaps to the general path.

use std::ops::Range;

use crate::numerics::kernels::round_f32_bf16_rne;

use super::super::dtype::Dtype;
use super::super::simd::dispatch;
use super::alu::{apply, maximum, minimum, AluOp, CANONICAL_NAN};

/// Elements per buffered chunk (4 KiB of float32: stays in L1).
const CHUNK: usize = 1024;

/// Element types of the fast paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    Bf16,
}

impl Kind {
    /// The fast-path kind of a dtype.
    pub fn of(d: Dtype) -> Option<Kind> {
        match d {
            Dtype::Fp32 => Some(Kind::F32),
            Dtype::Bf16 => Some(Kind::Bf16),
            _ => None,
        }
    }

    fn size(self) -> usize {
        match self {
            Kind::F32 => 4,
            Kind::Bf16 => 2,
        }
    }
}

/// Where an input's rows are: in the destination's memory (`None`) or another one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowIn<'a> {
    pub mem: Option<&'a [u8]>,
    /// Host offset of row 0 and bytes between rows.
    pub off: usize,
    pub stride: usize,
    pub kind: Kind,
}

/// The destination's rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowOut {
    pub off: usize,
    pub stride: usize,
    pub kind: Kind,
}

/// One input row, ready to read.
enum Src<'a> {
    Bytes(&'a [u8]),
    /// The destination row itself.
    Dst,
}

/// Splits `mem` around `d`: `(before, d, after)`.
#[inline(always)]
fn split3(mem: &mut [u8], d: Range<usize>) -> (&[u8], &mut [u8], &[u8]) {
    let (left, rest) = mem.split_at_mut(d.start);
    let (mid, right) = rest.split_at_mut(d.end - d.start);
    (left, mid, right)
}

/// Input row `p` of `x`, given the destination row range `d` and the split memory.
#[inline(always)]
fn src<'a>(
    x: &RowIn<'a>,
    p: usize,
    len: usize,
    d: &Range<usize>,
    left: &'a [u8],
    right: &'a [u8],
) -> Src<'a> {
    let start = x.off + p * x.stride;
    let r = start..start + len * x.kind.size();
    match x.mem {
        Some(m) => Src::Bytes(&m[r]),
        None if r == *d => Src::Dst,
        None if r.end <= d.start => Src::Bytes(&left[r]),
        None => Src::Bytes(&right[r.start - d.end..r.end - d.end]),
    }
}

/// `x` from element `done` of each row on.
fn shifted<'a>(x: &RowIn<'a>, done: usize) -> RowIn<'a> {
    RowIn {
        off: x.off + done * x.kind.size(),
        ..*x
    }
}

/// A view of little-endian bytes as `T` (`f32` or `u16`: every bit pattern valid).
#[inline(always)]
fn view<T: Copy>(b: &[u8]) -> &[T] {
    // SAFETY: `T` is f32 or u16 here (plain data, any bits valid); `align_to` only returns
    // properly aligned middles, and the assertion rejects a misaligned start.
    let (pre, mid, _) = unsafe { b.align_to::<T>() };
    assert!(pre.is_empty(), "misaligned row");
    mid
}

#[inline(always)]
fn view_mut<T: Copy>(b: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `view`.
    let (pre, mid, _) = unsafe { b.align_to_mut::<T>() };
    assert!(pre.is_empty(), "misaligned row");
    mid
}

#[inline(always)]
fn bf(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// `buf[i] = value of element i` of a row chunk.
#[inline(always)]
fn load(kind: Kind, bytes: &[u8], buf: &mut [f32]) {
    match kind {
        Kind::F32 => buf.copy_from_slice(&view::<f32>(bytes)[..buf.len()]),
        Kind::Bf16 => {
            for (o, &x) in buf.iter_mut().zip(view::<u16>(bytes)) {
                *o = bf(x);
            }
        }
    }
}

/// Stores `buf` (canonical NaN already) rounded to nearest even into a row chunk.
#[inline(always)]
fn store(kind: Kind, buf: &[f32], bytes: &mut [u8]) {
    match kind {
        Kind::F32 => view_mut::<f32>(bytes)[..buf.len()].copy_from_slice(buf),
        Kind::Bf16 => {
            for (o, &v) in view_mut::<u16>(bytes).iter_mut().zip(buf) {
                *o = round_f32_bf16_rne(v.to_bits()) as u16;
            }
        }
    }
}

#[inline(always)]
fn canon(x: f32) -> f32 {
    if x.is_nan() {
        CANONICAL_NAN
    } else {
        x
    }
}

/// `out[i] = f(x[i], s)` (or `f(s, x[i])` with `rev`) over one chunk.
#[inline(always)]
fn with_scalar(k: Kind, x: &[u8], s: f32, rev: bool, out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let n = out.len();
    match (k, rev) {
        (Kind::F32, false) => {
            for (o, &v) in out.iter_mut().zip(&view::<f32>(x)[..n]) {
                *o = f(v, s);
            }
        }
        (Kind::F32, true) => {
            for (o, &v) in out.iter_mut().zip(&view::<f32>(x)[..n]) {
                *o = f(s, v);
            }
        }
        (Kind::Bf16, false) => {
            for (o, &v) in out.iter_mut().zip(&view::<u16>(x)[..n]) {
                *o = f(bf(v), s);
            }
        }
        (Kind::Bf16, true) => {
            for (o, &v) in out.iter_mut().zip(&view::<u16>(x)[..n]) {
                *o = f(s, bf(v));
            }
        }
    }
}

/// In place: `buf[i] = f(buf[i], s)` (or reversed).
#[inline(always)]
fn with_scalar_in_place(buf: &mut [f32], s: f32, rev: bool, f: impl Fn(f32, f32) -> f32) {
    if rev {
        buf.iter_mut().for_each(|v| *v = f(s, *v));
    } else {
        buf.iter_mut().for_each(|v| *v = f(*v, s));
    }
}

/// Calls `$each(args..., f)` with the operator as a closure specialised per common operator.
macro_rules! with_op {
    ($op:expr, $each:ident ( $($arg:expr),* )) => {
        match $op {
            AluOp::Add => $each($($arg,)* |x: f32, y: f32| canon(x + y)),
            AluOp::Subtract => $each($($arg,)* |x: f32, y: f32| canon(x - y)),
            AluOp::Multiply => $each($($arg,)* |x: f32, y: f32| canon(x * y)),
            AluOp::Divide => $each($($arg,)* |x: f32, y: f32| canon(x / y)),
            AluOp::Maximum => $each($($arg,)* maximum),
            AluOp::Minimum => $each($($arg,)* minimum),
            other => $each($($arg,)* move |x: f32, y: f32| apply(other, x, y)),
        }
    };
}

/// The geometry of a row-wise instruction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    pub rows: usize,
    pub n: usize,
}

/// An element type of the fused loops.
trait Elem: Copy {
    fn get(self) -> f32;
    fn put(v: f32) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
    #[inline(always)]
    fn put(v: f32) -> f32 {
        v
    }
}

impl Elem for u16 {
    #[inline(always)]
    fn get(self) -> f32 {
        bf(self)
    }
    #[inline(always)]
    fn put(v: f32) -> u16 {
        round_f32_bf16_rne(v.to_bits()) as u16
    }
}

/// `d[i] = f(a[i], b[i])` in one pass, for every way the inputs can be the destination.
#[inline(always)]
fn fused<A: Elem, B: Elem, D: Elem>(sa: Src, sb: Src, dm: &mut [u8], f: impl Fn(f32, f32) -> f32) {
    let d = view_mut::<D>(dm);
    match (sa, sb) {
        (Src::Bytes(a), Src::Bytes(b)) => {
            for ((o, &x), &y) in d.iter_mut().zip(view::<A>(a)).zip(view::<B>(b)) {
                *o = D::put(f(x.get(), y.get()));
            }
        }
        (Src::Dst, Src::Bytes(b)) => {
            for (o, &y) in d.iter_mut().zip(view::<B>(b)) {
                *o = D::put(f(o.get(), y.get()));
            }
        }
        (Src::Bytes(a), Src::Dst) => {
            for (o, &x) in d.iter_mut().zip(view::<A>(a)) {
                *o = D::put(f(x.get(), o.get()));
            }
        }
        (Src::Dst, Src::Dst) => {
            for o in d.iter_mut() {
                *o = D::put(f(o.get(), o.get()));
            }
        }
    }
}

/// [`fused`] for the kinds at hand.
#[inline(always)]
fn fused_kinds(
    k: (Kind, Kind, Kind),
    sa: Src,
    sb: Src,
    dm: &mut [u8],
    f: impl Fn(f32, f32) -> f32,
) {
    use Kind::{Bf16 as H, F32 as S};
    match k {
        (S, S, S) => fused::<f32, f32, f32>(sa, sb, dm, f),
        (H, H, H) => fused::<u16, u16, u16>(sa, sb, dm, f),
        (S, S, H) => fused::<f32, f32, u16>(sa, sb, dm, f),
        (H, H, S) => fused::<u16, u16, f32>(sa, sb, dm, f),
        (S, H, S) => fused::<f32, u16, f32>(sa, sb, dm, f),
        (H, S, S) => fused::<u16, f32, f32>(sa, sb, dm, f),
        (S, H, H) => fused::<f32, u16, u16>(sa, sb, dm, f),
        (H, S, H) => fused::<u16, f32, u16>(sa, sb, dm, f),
    }
}

dispatch! {
    /// `tensor_tensor`: `d = op(a, b)` row by row.
    pub(crate) fn binary(op: AluOp, g: Rows, mem: &mut [u8], a: RowIn, b: RowIn, d: RowOut) {
        let kinds = (a.kind, b.kind, d.kind);
        for p in 0..g.rows {
            let ds = d.off + p * d.stride;
            let dr = ds..ds + g.n * d.kind.size();
            let (left, dm, right) = split3(mem, dr.clone());
            let sa = src(&a, p, g.n, &dr, left, right);
            let sb = src(&b, p, g.n, &dr, left, right);
            with_op!(op, fused_kinds(kinds, sa, sb, dm));
        }
    }
}

dispatch! {
    /// `tensor_scalar`: `d = op1(op0(a, s0[p]), s1[p])` row by row (`op1` optional).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scalar(
        op0: AluOp,
        rev0: bool,
        s0: &[f32],
        op1: Option<(AluOp, bool)>,
        s1: &[f32],
        g: Rows,
        mem: &mut [u8],
        a: RowIn,
        d: RowOut,
    ) {
        let mut buf = [0f32; CHUNK];
        for p in 0..g.rows {
            let mut done = 0;
            while done < g.n {
                let len = (g.n - done).min(CHUNK);
                let ds = d.off + p * d.stride + done * d.kind.size();
                let dr = ds..ds + len * d.kind.size();
                let (left, dm, right) = split3(mem, dr.clone());
                let sa = src(&shifted(&a, done), p, len, &dr, left, right);
                let ab: &[u8] = match sa { Src::Bytes(x) => x, Src::Dst => dm };
                let out = &mut buf[..len];
                with_op!(op0, with_scalar(a.kind, ab, s0[p], rev0, out));
                if let Some((o1, rev1)) = op1 {
                    with_op!(o1, with_scalar_in_place(out, s1[p], rev1));
                }
                store(d.kind, out, dm);
                done += len;
            }
        }
    }
}

dispatch! {
    /// `tensor_copy` between fp32/bf16 rows: bits when the kinds agree, else converted.
    pub(crate) fn copy(g: Rows, mem: &mut [u8], a: RowIn, d: RowOut) {
        let mut buf = [0f32; CHUNK];
        for p in 0..g.rows {
            let mut done = 0;
            while done < g.n {
                let len = (g.n - done).min(CHUNK);
                let ds = d.off + p * d.stride + done * d.kind.size();
                let dr = ds..ds + len * d.kind.size();
                let (left, dm, right) = split3(mem, dr.clone());
                let sa = src(&shifted(&a, done), p, len, &dr, left, right);
                match sa {
                    Src::Dst => {}
                    Src::Bytes(x) if a.kind == d.kind => dm.copy_from_slice(x),
                    Src::Bytes(x) => {
                        let out = &mut buf[..len];
                        load(a.kind, x, out);
                        out.iter_mut().for_each(|v| *v = canon(*v));
                        store(d.kind, out, dm);
                    }
                }
                done += len;
            }
        }
    }
}
