//! Fast paths of the element-wise instructions: tiles whose every partition is one contiguous
//! run of fp32 or bf16 elements, rounded to nearest even. They compute exactly what the
//! general path computes (the same operators of [`super::alu`], the same bf16 rounding kernel
//! of `numerics`), partition by partition straight from the machine's memory, with the SIMD
//! level chosen once per instruction. `tests/it/machine.rs` compares them with the general path
//! (strided views of the same data) and with scalar oracles, bit for bit.
//!
//! An input is either exactly the destination (the same bytes: each element is read before it
//! is written, at the same index) or disjoint from every destination row; [`Plan::new`]'s
//! caller guarantees that (`rows_compatible`), and partial overlaps take the general path.

use std::marker::PhantomData;

use crate::numerics::kernels::round_f32_bf16_rne;

use super::super::dtype::Dtype;
use super::super::simd::dispatch;
use super::alu::{apply, canon, maximum, minimum, per_op, AluOp};

/// Elements per buffered chunk of `tensor_scalar` (4 KiB of float32: stays in L1).
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

/// An input's rows: in the destination's memory (`mem: None`) or in another one.
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

/// The geometry of a row-wise instruction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    pub rows: usize,
    pub n: usize,
}

/// Where one input's row `p` starts.
#[derive(Debug, Clone, Copy)]
enum In {
    /// The destination row itself.
    Dst,
    /// Row `p` at `base + p * stride`.
    At { base: *const u8, stride: usize },
}

/// Validated rows of up to two inputs and the destination: every row in bounds and aligned
/// for its kind, each input either the destination itself or disjoint from all its rows.
pub(crate) struct Plan<'m> {
    g: Rows,
    dst: *mut u8,
    dstride: usize,
    dkind: Kind,
    ins: [In; 2],
    kinds: [Kind; 2],
    _mem: PhantomData<&'m mut [u8]>,
}

impl<'m> Plan<'m> {
    /// Checks bounds and alignment (`None` if they fail: the caller takes the general path).
    ///
    /// # Safety
    /// Every input in `mem` (`RowIn::mem == None`) must either have exactly the destination's
    /// rows (same offset, stride and kind) or rows that overlap no destination row.
    pub unsafe fn new(
        g: Rows, mem: &'m mut [u8], ins: &[RowIn<'m>], d: RowOut,
    ) -> Option<Plan<'m>> {
        if g.rows == 0 || g.n == 0 || ins.len() > 2 {
            return None;
        }
        let fits = |len: usize, base: *const u8, off: usize, stride: usize, k: Kind| {
            let last = off.checked_add((g.rows - 1).checked_mul(stride)?)?;
            let end = last.checked_add(g.n.checked_mul(k.size())?)?;
            let aligned =
                (base as usize + off).is_multiple_of(k.size()) && stride.is_multiple_of(k.size());
            (end <= len && aligned).then_some(())
        };
        fits(mem.len(), mem.as_ptr(), d.off, d.stride, d.kind)?;
        let mut plan = Plan {
            g,
            dst: mem.as_mut_ptr().wrapping_add(d.off),
            dstride: d.stride,
            dkind: d.kind,
            ins: [In::Dst; 2],
            kinds: [d.kind; 2],
            _mem: PhantomData,
        };
        for (k, x) in ins.iter().enumerate() {
            let (m, base) = match x.mem {
                Some(m) => (m.len(), m.as_ptr()),
                None => (mem.len(), mem.as_ptr()),
            };
            fits(m, base, x.off, x.stride, x.kind)?;
            let same =
                x.mem.is_none() && x.off == d.off && x.stride == d.stride && x.kind == d.kind;
            plan.ins[k] = if same {
                In::Dst
            } else {
                In::At { base: base.wrapping_add(x.off), stride: x.stride }
            };
            plan.kinds[k] = x.kind;
        }
        Some(plan)
    }

    /// Destination row `p` as `D`.
    #[inline(always)]
    fn dst_row<D>(&mut self, p: usize) -> &mut [D] {
        // SAFETY: `new` checked that every row lies inside the destination memory and is
        // aligned for the destination kind (`D` is `f32` or `u16` accordingly, any bits
        // valid); `&mut self` makes this the only live view of the row.
        unsafe {
            std::slice::from_raw_parts_mut(self.dst.add(p * self.dstride).cast::<D>(), self.g.n)
        }
    }

    /// Input `k`'s row `p` as `A`, or `None` when it is the destination row.
    #[inline(always)]
    fn in_row<A>(&self, k: usize, p: usize) -> Option<&[A]> {
        match self.ins[k] {
            In::Dst => None,
            // SAFETY: in bounds and aligned (checked by `new`); disjoint from every destination
            // row (`new`'s contract), so it never aliases a `dst_row` view.
            In::At { base, stride } => Some(unsafe {
                std::slice::from_raw_parts(base.add(p * stride).cast::<A>(), self.g.n)
            }),
        }
    }
}

#[inline(always)]
fn bf(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
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

/// Elements per step of [`binary_rows`] (two AVX2 vectors of float32: measured best of 8,
/// 16 and 32 for both float32 and bf16 rows).
const LANES: usize = 16;

dispatch! {
    /// Every row of a `tensor_tensor` (kinds `A`, `B` into `D`): `d[i] = f(a[i], b[i])`. Each
    /// step loads [`LANES`] elements of each input into locals before storing any result, which
    /// is right whether an input is the destination row itself or disjoint from it (`Plan`'s
    /// guarantee) and lets the compiler vectorise without proving the rows apart; the whole
    /// loop is one call per instruction.
    fn binary_rows<A: Elem, B: Elem, D: Elem>(plan: &mut Plan, f: impl Fn(f32, f32) -> f32, _kinds: PhantomData<(A, B, D)>) {
        let n = plan.g.n;
        for p in 0..plan.g.rows {
            let a = plan.in_row::<A>(0, p).map(|s| s.as_ptr());
            let b = plan.in_row::<B>(1, p).map(|s| s.as_ptr());
            let d = plan.dst_row::<D>(p).as_mut_ptr();
            // An input that is the destination row has the destination's kind (`Plan::new`), so
            // `A` (or `B`) and `D` are the same type there.
            let a = a.unwrap_or(d.cast::<A>());
            let b = b.unwrap_or(d.cast::<B>());
            // A counted loop over the whole steps (not `while i + LANES <= n`): the compiler
            // unrolls it; float32 [128, 64] tiles take about 15% less time.
            let whole = n / LANES * LANES;
            for i in (0..whole).step_by(LANES) {
                // SAFETY: `i + LANES <= n`: rows of `n` elements, in bounds and aligned (`Plan`).
                let (x, y) = unsafe {
                    (
                        std::array::from_fn::<f32, LANES, _>(|k| (*a.add(i + k)).get()),
                        std::array::from_fn::<f32, LANES, _>(|k| (*b.add(i + k)).get()),
                    )
                };
                for k in 0..LANES {
                    // SAFETY: as above; every input element of this step was read above.
                    unsafe { *d.add(i + k) = D::put(f(x[k], y[k])) };
                }
            }
            for i in whole..n {
                // SAFETY: `i < n`, as above; the inputs are read before the store.
                unsafe { *d.add(i) = D::put(f((*a.add(i)).get(), (*b.add(i)).get())) };
            }
        }
    }
}

/// [`binary_rows`] for the kinds at hand.
#[inline(always)]
fn binary_kinds(plan: &mut Plan, f: impl Fn(f32, f32) -> f32) {
    use Kind::{Bf16 as H, F32 as S};
    match (plan.kinds[0], plan.kinds[1], plan.dkind) {
        (S, S, S) => binary_rows::<f32, f32, f32>(plan, f, PhantomData),
        (H, H, H) => binary_rows::<u16, u16, u16>(plan, f, PhantomData),
        (S, S, H) => binary_rows::<f32, f32, u16>(plan, f, PhantomData),
        (H, H, S) => binary_rows::<u16, u16, f32>(plan, f, PhantomData),
        (S, H, S) => binary_rows::<f32, u16, f32>(plan, f, PhantomData),
        (H, S, S) => binary_rows::<u16, f32, f32>(plan, f, PhantomData),
        (S, H, H) => binary_rows::<f32, u16, u16>(plan, f, PhantomData),
        (H, S, H) => binary_rows::<u16, f32, u16>(plan, f, PhantomData),
    }
}

/// `tensor_tensor`: `d = op(a, b)` row by row (`plan` built from `a`, `b`).
pub(crate) fn binary(op: AluOp, plan: &mut Plan) {
    per_op!(op, binary_kinds(plan));
}

/// `out[i] = f(x[i], s)` (or `f(s, x[i])` with `rev`).
#[inline(always)]
fn scalar_pass<A: Elem>(x: &[A], s: f32, rev: bool, out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    if rev {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f(s, v.get());
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f(v.get(), s);
        }
    }
}

/// In place: `buf[i] = f(buf[i], s)` (or reversed).
#[inline(always)]
fn scalar_in_place(buf: &mut [f32], s: f32, rev: bool, f: impl Fn(f32, f32) -> f32) {
    if rev {
        buf.iter_mut().for_each(|v| *v = f(s, *v));
    } else {
        buf.iter_mut().for_each(|v| *v = f(*v, s));
    }
}

/// Stores float32 results into a row chunk.
#[inline(always)]
fn store_row<D: Elem>(buf: &[f32], d: &mut [D]) {
    for (o, &v) in d.iter_mut().zip(buf) {
        *o = D::put(v);
    }
}

/// `tensor_scalar` rows for one input and one output kind.
#[inline(always)]
fn scalar_rows<A: Elem, D: Elem>(
    plan: &mut Plan, op0: (AluOp, bool, &[f32]), op1: Option<(AluOp, bool, &[f32])>,
) {
    let mut buf = [0f32; CHUNK];
    let n = plan.g.n;
    for p in 0..plan.g.rows {
        let a = plan.in_row::<A>(0, p).map(|s| s.as_ptr());
        let d = plan.dst_row::<D>(p);
        let mut done = 0;
        while done < n {
            let len = (n - done).min(CHUNK);
            let out = &mut buf[..len];
            {
                // SAFETY: the input row checked by `in_row`, disjoint from `d`; `None` means
                // the input is `d` itself (then `A` and `D` are the same type: `Plan::new`
                // compares kinds), read here before this chunk is written.
                let x: &[A] = match a {
                    Some(ptr) => unsafe { std::slice::from_raw_parts(ptr.add(done), len) },
                    None => unsafe {
                        std::slice::from_raw_parts(d[done..].as_ptr().cast::<A>(), len)
                    },
                };
                let (op, rev, s) = op0;
                per_op!(op, scalar_pass(x, s[p], rev, out));
            }
            if let Some((op, rev, s)) = op1 {
                per_op!(op, scalar_in_place(out, s[p], rev));
            }
            store_row(out, &mut d[done..done + len]);
            done += len;
        }
    }
}

dispatch! {
    /// `tensor_scalar`: `d = op1(op0(a, s0[p]), s1[p])` row by row (`op1` optional; each
    /// `(operator, reverse, per-row operands)`).
    pub(crate) fn scalar(plan: &mut Plan, op0: (AluOp, bool, &[f32]), op1: Option<(AluOp, bool, &[f32])>) {
        use Kind::{Bf16 as H, F32 as S};
        match (plan.kinds[0], plan.dkind) {
            (S, S) => scalar_rows::<f32, f32>(plan, op0, op1),
            (H, H) => scalar_rows::<u16, u16>(plan, op0, op1),
            (S, H) => scalar_rows::<f32, u16>(plan, op0, op1),
            (H, S) => scalar_rows::<u16, f32>(plan, op0, op1),
        }
    }
}

/// Converts one row (`A` to `D`, NaN canonical).
#[inline(always)]
fn convert_row<A: Elem, D: Elem>(a: &[A], d: &mut [D]) {
    for (o, &x) in d.iter_mut().zip(a) {
        *o = D::put(canon(x.get()));
    }
}

/// `tensor_copy` rows for one input and one output kind.
#[inline(always)]
fn copy_rows<A: Elem, D: Elem>(plan: &mut Plan, same_kind: bool) {
    let n = plan.g.n;
    for p in 0..plan.g.rows {
        let Some(a) = plan.in_row::<A>(0, p).map(|s| s.as_ptr()) else {
            continue;
        };
        let d = plan.dst_row::<D>(p);
        // SAFETY: the input row checked by `in_row`, disjoint from `d`.
        let a = unsafe { std::slice::from_raw_parts(a, n) };
        if same_kind {
            // Bits unchanged (NaN payloads too): `A` and `D` are the same type here.
            // SAFETY: same element type and length; disjoint.
            unsafe { std::ptr::copy_nonoverlapping(a.as_ptr().cast::<D>(), d.as_mut_ptr(), n) };
        } else {
            convert_row(a, d);
        }
    }
}

dispatch! {
    /// `tensor_copy` between fp32/bf16 rows: bits when the kinds agree, else converted.
    pub(crate) fn copy(plan: &mut Plan) {
        use Kind::{Bf16 as H, F32 as S};
        match (plan.kinds[0], plan.dkind) {
            (S, S) => copy_rows::<f32, f32>(plan, true),
            (H, H) => copy_rows::<u16, u16>(plan, true),
            (S, H) => copy_rows::<f32, u16>(plan, false),
            (H, S) => copy_rows::<u16, f32>(plan, false),
        }
    }
}
