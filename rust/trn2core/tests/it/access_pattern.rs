//! Access patterns (`with_pattern` = NKI's `.ap()`, `with_rows`, `reshape_free`, and views of
//! views) against an independent model in 128-bit arithmetic (issue 28): sizes, strides and
//! offsets near the 64-bit limits must neither wrap past the bounds check nor panic. The model
//! tracks each view's offset, rows and free pattern exactly; a view is inside its tensor iff
//! the lowest and highest byte any element reaches are inside it; a read inside the bounds
//! returns, element by element, the values the model addresses.

use proptest::prelude::*;
use trn2core::machine::tile::Index;
use trn2core::machine::{Dtype, Machine, MachineConfig, Tile};
use trn2core::memory::Space;
use trn2core::Error;

const ESIZE: i128 = 4;
/// The tensors: HBM 8 x 8 fp32, SBUF 4 partitions x 16 fp32; element k holds the value k.
const HBM_ELEMS: i128 = 64;
const SBUF_FREE: i128 = 16;

/// A view as the model sees it, in exact integers.
#[derive(Debug, Clone)]
struct View {
    hbm: bool,
    /// Byte offset of the first element.
    offset: i128,
    /// Rows (HBM) or partitions (SBUF), and the HBM row step in elements.
    rows: i128,
    row_step: i128,
    /// Free dimensions: (size, stride in elements), outermost first.
    dims: Vec<(i128, i128)>,
}

impl View {
    fn elements(&self) -> i128 {
        self.dims
            .iter()
            .fold(self.rows, |n, d| n.saturating_mul(d.0))
    }

    /// Lowest and one-past-highest byte reached.
    fn extent(&self) -> (i128, i128) {
        let mut reaches: Vec<i128> = self.dims.iter().map(|&(s, st)| (s - 1) * st).collect();
        if self.hbm {
            reaches.push((self.rows - 1) * self.row_step);
        }
        let lo: i128 = reaches.iter().filter(|r| **r < 0).sum();
        let hi: i128 = reaches.iter().filter(|r| **r > 0).sum();
        (self.offset + lo * ESIZE, self.offset + (hi + 1) * ESIZE)
    }

    fn inside(&self) -> bool {
        let (lo, hi) = self.extent();
        let end = if self.hbm { HBM_ELEMS } else { SBUF_FREE } * ESIZE;
        lo >= 0 && hi <= end && self.offset % ESIZE == 0
    }

    /// Every element's value, in logical order (small views only): C order over the rows
    /// and the free dimensions, each element's address summed from its indices.
    fn values(&self) -> Vec<f32> {
        let free: i128 = self.dims.iter().map(|d| d.0).product();
        let mut out = Vec::new();
        for r in 0..self.rows {
            let row = if self.hbm {
                r * self.row_step
            } else {
                r * SBUF_FREE
            };
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

    /// Whether the real tile carries exactly this view.
    fn same_as(&self, t: &Tile) -> bool {
        let dims: Vec<(i128, i128)> = t.dims().map(|(s, st)| (s as i128, st as i128)).collect();
        t.offset as i128 == self.offset
            && t.partitions as i128 == self.rows
            && (!self.hbm || t.partition_step as i128 == self.row_step)
            && dims == self.dims
    }

    /// Whether a tile's fields can hold the view (else the operation must refuse it).
    fn representable(&self) -> bool {
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
enum Op {
    Ap(Vec<(i64, u32)>, i64),
    Rows(u32, i64),
    Reshape(Vec<usize>),
}

fn model(v: &View, op: &Op) -> Option<View> {
    let mut w = v.clone();
    match op {
        Op::Ap(pattern, offset) => {
            if pattern.is_empty() || pattern.len() > 4 || pattern.iter().any(|p| p.1 == 0) {
                return None;
            }
            w.offset += *offset as i128 * ESIZE;
            w.dims = pattern
                .iter()
                .map(|&(st, n)| (n as i128, st as i128))
                .collect();
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
            let m = shape
                .iter()
                .try_fold(1i128, |a, &s| a.checked_mul(s as i128));
            // Contiguous: each dimension with more than one element steps by the product of
            // the sizes inside it.
            let mut inner = 1i128;
            let mut contiguous = true;
            for &(s, st) in v.dims.iter().rev() {
                if s > 1 && st != inner {
                    contiguous = false;
                }
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

fn apply(t: &Tile, op: &Op) -> Result<Tile, Error> {
    match op {
        Op::Ap(p, o) => t.with_pattern(p, *o),
        Op::Rows(c, s) => t.with_rows(*c, *s),
        Op::Reshape(shape) => t.reshape_free(shape),
    }
}

fn size() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 1u32..=4,
        1 => Just(u32::MAX),
        1 => (1u32 << 31)..=u32::MAX,
    ]
}

fn stride() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => -9i64..=9,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => (-4i64..=4).prop_map(|k| (1i64 << 62) + k),
        1 => (-4i64..=4).prop_map(|k| (1i64 << 61) + k),
        1 => any::<i64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            proptest::collection::vec((stride(), size()), 0..=5),
            stride()
        )
            .prop_map(|(p, o)| Op::Ap(p, o)),
        (size(), stride()).prop_map(|(c, s)| Op::Rows(c, s)),
        proptest::collection::vec(
            prop_oneof![1usize..=8, Just((1usize << 62) + 1), Just(usize::MAX)],
            0..=5
        )
        .prop_map(Op::Reshape),
    ]
}

fn setup(hbm: bool) -> (Machine, Tile, View) {
    let mut m = Machine::new(MachineConfig::default()).expect("machine");
    let (tile, rows, cols) = if hbm {
        let data: Vec<u8> = (0..HBM_ELEMS)
            .flat_map(|k| (k as f32).to_le_bytes())
            .collect();
        let t = m
            .hbm_tensor("h", &[8, 8], Dtype::Fp32, Some(&data))
            .expect("hbm");
        (t, 8, 8)
    } else {
        let t = m
            .alloc(Space::Sbuf, "s", &[4, 16], Dtype::Fp32)
            .expect("sbuf");
        let data: Vec<u8> = (0..4 * SBUF_FREE)
            .flat_map(|k| (k as f32).to_le_bytes())
            .collect();
        m.write_tile(&t, &data).expect("write");
        (t, 4, 16)
    };
    let view = View {
        hbm,
        offset: tile.offset as i128,
        rows,
        row_step: if hbm { 8 } else { 0 },
        dims: vec![(cols, 1)],
    };
    (m, tile, view)
}

/// Runs `ops` on both and checks every step and the final read.
fn check(hbm: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let (m, mut tile, mut view) = setup(hbm);
    for o in ops {
        let want = model(&view, o);
        match (apply(&tile, o), want) {
            (Ok(t), Some(w)) => {
                prop_assert!(w.same_as(&t), "{o:?}: tile {t:?} but the model says {w:?}");
                tile = t;
                view = w;
            }
            (Err(_), Some(w)) => {
                prop_assert!(
                    !w.representable(),
                    "{o:?} refused a representable view {w:?}"
                );
                return Ok(());
            }
            (Ok(t), None) => prop_assert!(false, "{o:?} accepted: {t:?}"),
            (Err(_), None) => return Ok(()),
        }
    }
    let checked = m.check_tile("tile", &tile);
    prop_assert_eq!(
        checked.is_ok(),
        view.inside(),
        "bounds of {:?} (extent {:?}): {:?}",
        view,
        view.extent(),
        checked
    );
    if view.inside() && view.elements() <= 4096 {
        let bytes = m.read_tile(&tile).expect("read inside");
        let got: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        prop_assert_eq!(got, view.values());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn access_patterns_match_the_u128_model(hbm in any::<bool>(), ops in proptest::collection::vec(op(), 1..=4)) {
        check(hbm, &ops)?;
    }
}

#[test]
fn access_patterns_at_the_64_bit_limits() {
    // The cases: each refused exactly, none wraps to element 0 or panics.
    let big = 1i64 << 62;
    for (hbm, ops) in [
        (false, vec![Op::Ap(vec![(big, 2)], 0)]),
        (false, vec![Op::Ap(vec![(1 << 61, 2)], 0)]),
        (false, vec![Op::Ap(vec![(1, 4)], big)]),
        (true, vec![Op::Rows(2, big)]),
        (true, vec![Op::Reshape(vec![(1 << 62) + 1, 4])]),
        (
            true,
            vec![
                Op::Ap(vec![(0, u32::MAX), (0, u32::MAX)], 0),
                Op::Rows(u32::MAX, 0),
            ],
        ),
    ] {
        check(hbm, &ops).expect("matches the model");
    }
    // Slice steps at the i64 limits select one element (their counts wrapped before).
    let (_, s, _) = setup(false);
    let r = |step| Index::Range {
        start: None,
        stop: None,
        step,
    };
    let first = s.slice(&[Index::ALL, r(i64::MAX)]).expect("first element");
    assert_eq!((first.shape[0], first.offset), (1, 0));
    let last = s.slice(&[Index::ALL, r(i64::MIN)]).expect("last element");
    assert_eq!((last.shape[0], last.offset), (1, 60));
    // A wrapping product must not pass for the 64 elements of the HBM tensor.
    let (_, h, _) = setup(true);
    let h = h.reshape_free(&[64]).err();
    assert!(h.is_some(), "8 x 8 has 8 elements per row, not 64");
}

#[test]
fn a_huge_repeating_view_is_a_capacity_error_not_an_abort() {
    let (mut m, t, _) = setup(false);
    let rep = t
        .with_pattern(&[(0, 65536), (0, 65536)], 0)
        .expect("a legal view");
    assert_eq!(rep.elements_u128(), 4 * 65536 * 65536);
    m.check_tile("tile", &rep)
        .expect("inside: it repeats one element");
    match m.read_tile(&rep) {
        Err(Error::Capacity { arg, .. }) => assert_eq!(arg, "tile"),
        other => panic!("{other:?}"),
    }
    let (mut hm, h, _) = setup(true);
    let rows = h.with_rows(u32::MAX, 0).expect("a legal view");
    assert!(matches!(hm.read_tile(&rows), Err(Error::Capacity { .. })));
    // As an engine operand (the reduce over a broadcast of the issue): the same error, named.
    let d = m
        .alloc(Space::Sbuf, "d", &[4, 1], Dtype::Fp32)
        .expect("alloc");
    let wide = t.with_pattern(&[(0, 1 << 31)], 0).expect("a legal view");
    let r = m.tensor_reduce(&d, trn2core::machine::AluOp::Add, &wide, 1, false);
    let _ = &mut hm;
    match r {
        Err(Error::Capacity { arg, .. }) => assert_eq!(arg, "data"),
        other => panic!("{other:?}"),
    }
}
