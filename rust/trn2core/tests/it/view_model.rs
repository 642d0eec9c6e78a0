//! The exact model of access-pattern views (issue 28) that the proptest (`access_pattern`) and
//! the libFuzzer target (fuzz/fuzz_targets/access_pattern.rs, which includes this file) both
//! check the machine against: views in 128-bit integers, so sizes, strides and offsets near
//! the 64-bit limits cannot wrap. A view is inside its tensor iff the lowest and highest byte
//! any element reaches are inside it; a read of a view returns, element by element, the
//! values the model addresses.
#![allow(dead_code)] // each of the two users needs a different part

use trn2core::machine::{Dtype, Machine, MachineConfig, Tile};
use trn2core::memory::Space;
use trn2core::Error;

pub const ESIZE: i128 = 4;
/// The tensors: HBM 8 x 8 fp32, SBUF 4 partitions x 16 fp32; element k holds the value k.
pub const HBM_ELEMS: i128 = 64;
pub const SBUF_FREE: i128 = 16;

/// A view as the model sees it, in exact integers.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub hbm: bool,
    /// Byte offset of the first element.
    pub offset: i128,
    /// Rows (HBM) or partitions (SBUF), and the HBM row step in elements.
    pub rows: i128,
    pub row_step: i128,
    /// Free dimensions: (size, stride in elements), outermost first.
    pub dims: Vec<(i128, i128)>,
}

impl View {
    /// The view a tile carries.
    pub fn of(t: &Tile) -> View {
        let hbm = t.space == Space::Hbm;
        View {
            hbm,
            offset: t.offset as i128,
            rows: t.partitions as i128,
            row_step: if hbm { t.partition_step as i128 } else { 0 },
            dims: t.dims().map(|(s, st)| (s as i128, st as i128)).collect(),
        }
    }

    pub fn elements(&self) -> i128 {
        self.dims.iter().fold(self.rows, |n, d| n.saturating_mul(d.0))
    }

    /// Lowest and one-past-highest byte any element reaches.
    pub fn extent(&self) -> (i128, i128) {
        let mut reach: Vec<i128> = self.dims.iter().map(|&(s, st)| (s - 1) * st).collect();
        if self.hbm {
            reach.push((self.rows - 1) * self.row_step);
        }
        let lo: i128 = reach.iter().filter(|r| **r < 0).sum();
        let hi: i128 = reach.iter().filter(|r| **r > 0).sum();
        (self.offset + lo * ESIZE, self.offset + (hi + 1) * ESIZE)
    }

    /// Whether every element lies inside the tensor (an SBUF view starting at partition
    /// `first_partition` of the 4).
    pub fn inside(&self, first_partition: i128) -> bool {
        let (lo, hi) = self.extent();
        let end = if self.hbm { HBM_ELEMS } else { SBUF_FREE } * ESIZE;
        let parts_ok = self.hbm || (first_partition >= 0 && first_partition + self.rows <= 4);
        parts_ok && lo >= 0 && hi <= end && self.offset % ESIZE == 0
    }

    /// Every element's value, in logical order (small views only): C order over the rows and
    /// the free dimensions, each element's address summed from its indices.
    pub fn values(&self, first_partition: i128) -> Vec<f32> {
        let free: i128 = self.dims.iter().map(|d| d.0).product();
        let mut out = Vec::new();
        for r in 0..self.rows {
            let row = if self.hbm { r * self.row_step } else { (first_partition + r) * SBUF_FREE };
            for mut k in 0..free {
                let mut off = 0;
                for &(s, st) in self.dims.iter().rev() {
                    off += (k % s) * st;
                    k /= s;
                }
                out.push((self.offset / ESIZE + row + off) as f32);
            }
        }
        out
    }

    /// Whether a tile's fields can hold the view (else the operation must refuse it).
    pub fn representable(&self) -> bool {
        let i64r = |v: i128| i64::try_from(v).is_ok();
        let u32r = |v: i128| (1..=u32::MAX as i128).contains(&v);
        i64r(self.offset)
            && u32r(self.rows)
            && i64r(self.row_step)
            && self.dims.iter().all(|&(s, st)| u32r(s) && i64r(st))
    }
}

/// An operation on a view.
#[derive(Debug, Clone)]
pub enum Op {
    Ap(Vec<(i64, u32)>, i64),
    Rows(u32, i64),
    Reshape(Vec<usize>),
}

/// The view `op` gives, or `None` where the machine must refuse it.
pub fn model(v: &View, op: &Op) -> Option<View> {
    let mut w = v.clone();
    match op {
        Op::Ap(pattern, offset) => {
            if pattern.is_empty() || pattern.len() > 4 || pattern.iter().any(|p| p.1 == 0) {
                return None;
            }
            w.offset += *offset as i128 * ESIZE;
            w.dims = pattern.iter().map(|&(st, n)| (n as i128, st as i128)).collect();
        }
        Op::Rows(count, step) => {
            if !v.hbm || *count == 0 {
                return None;
            }
            w.rows = *count as i128;
            w.row_step = *step as i128;
        }
        Op::Reshape(shape) => {
            let n = v.dims.iter().fold(1i128, |n, d| n.saturating_mul(d.0));
            let m = shape.iter().try_fold(1i128, |a, &s| a.checked_mul(s as i128));
            // Contiguous: each dimension with more than one element steps by the product of
            // the sizes inside it.
            let mut inner = 1i128;
            let mut contiguous = true;
            for &(s, st) in v.dims.iter().rev() {
                contiguous &= s <= 1 || st == inner;
                inner = inner.saturating_mul(s);
            }
            if shape.is_empty() || shape.len() > 4 || m != Some(n) || !contiguous {
                return None;
            }
            let mut dims = Vec::new();
            let mut stride = 1i128;
            for &s in shape.iter().rev() {
                dims.push((s as i128, stride));
                stride = stride.saturating_mul(s as i128);
            }
            dims.reverse();
            w.dims = dims;
        }
    }
    Some(w)
}

/// The machine's answer to `op`.
pub fn apply(t: &Tile, op: &Op) -> Result<Tile, Error> {
    match op {
        Op::Ap(p, o) => t.with_pattern(p, *o),
        Op::Rows(c, s) => t.with_rows(*c, *s),
        Op::Reshape(shape) => t.reshape_free(shape),
    }
}

/// A machine holding the HBM or the SBUF tensor, each element k holding the value k.
pub fn tensor(hbm: bool) -> (Machine, Tile) {
    let mut m = Machine::new(MachineConfig::default()).expect("machine");
    let values = |n: i128| -> Vec<u8> { (0..n).flat_map(|k| (k as f32).to_le_bytes()).collect() };
    let t = if hbm {
        m.hbm_tensor("h", &[8, 8], Dtype::Fp32, Some(&values(HBM_ELEMS))).expect("hbm")
    } else {
        let t = m.alloc(Space::Sbuf, "s", &[4, 16], Dtype::Fp32).expect("sbuf");
        m.write_tile(&t, &values(4 * SBUF_FREE)).expect("write");
        t
    };
    (m, t)
}
