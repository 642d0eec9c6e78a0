//! Access patterns (`with_pattern` = NKI's `.ap()`, `with_rows`, `reshape_free`, and views of
//! views) against an independent model in 128-bit arithmetic (issue 28): sizes, strides and
//! offsets near the 64-bit limits must neither wrap past the bounds check nor panic. The model
//! tracks each view's offset, rows and free pattern exactly; a view is inside its tensor iff
//! the lowest and highest byte any element reaches are inside it; a read inside the bounds
//! returns, element by element, the values the model addresses.

use proptest::prelude::*;
use trn2core::machine::tile::Index;
use trn2core::machine::{Dtype, Machine, Tile};
use trn2core::memory::Space;
use trn2core::Error;

use crate::view_model::{apply, model, tensor, Op, View};

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
        (proptest::collection::vec((stride(), size()), 0..=5), stride())
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
    let (m, tile) = tensor(hbm);
    let view = whole(hbm, &tile);
    (m, tile, view)
}

/// The model's view of the whole tensor `tile`.
fn whole(hbm: bool, tile: &Tile) -> View {
    let (rows, cols) = if hbm { (8, 8) } else { (4, 16) };
    View {
        hbm,
        offset: tile.offset as i128,
        rows,
        row_step: if hbm { 8 } else { 0 },
        dims: vec![(cols, 1)],
    }
}

thread_local! {
    /// The SBUF and the HBM tensor, each in its machine, made once per thread: a case only
    /// views and reads them. A new machine per case was most of a case's cost whenever
    /// `Machine::new` had to clear 26 MiB of SBUF and PSUM instead of taking kept memories
    /// (machine/memory.rs, `pool`): 4096 cases took over a minute in `make test`.
    static TENSORS: [(Machine, Tile); 2] = [tensor(false), tensor(true)];
}

/// Runs `ops` on both and checks every step and the final read.
fn check(hbm: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    TENSORS.with(|t| {
        let (m, tile) = &t[usize::from(hbm)];
        check_on(m, *tile, hbm, ops)
    })
}

/// [`check`] on the tensor `tile` of machine `m`.
fn check_on(m: &Machine, mut tile: Tile, hbm: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut view = whole(hbm, &tile);
    for o in ops {
        let want = model(&view, o);
        match (apply(&tile, o), want) {
            (Ok(t), Some(w)) => {
                prop_assert_eq!(View::of(&t), w.clone(), "{:?}: tile {:?}", o, t);
                tile = t;
                view = w;
            }
            (Err(_), Some(w)) => {
                prop_assert!(!w.representable(), "{o:?} refused a representable view {w:?}");
                return Ok(());
            }
            (Ok(t), None) => prop_assert!(false, "{o:?} accepted: {t:?}"),
            (Err(_), None) => return Ok(()),
        }
    }
    let checked = m.check_tile("tile", &tile);
    prop_assert_eq!(
        checked.is_ok(),
        view.inside(0),
        "bounds of {:?} (extent {:?}): {:?}",
        view,
        view.extent(),
        checked
    );
    if view.inside(0) && view.elements() <= 4096 {
        let bytes = m.read_tile(&tile).expect("read inside");
        let got: Vec<f32> =
            bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        prop_assert_eq!(got, view.values(0));
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
        (true, vec![Op::Ap(vec![(0, u32::MAX), (0, u32::MAX)], 0), Op::Rows(u32::MAX, 0)]),
    ] {
        check(hbm, &ops).expect("matches the model");
    }
    // Slice steps at the i64 limits select one element (their counts wrapped before).
    let (_, s, _) = setup(false);
    let r = |step| Index::Range { start: None, stop: None, step };
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
    let rep = t.with_pattern(&[(0, 65536), (0, 65536)], 0).expect("a legal view");
    assert_eq!(rep.elements_u128(), 4 * 65536 * 65536);
    m.check_tile("tile", &rep).expect("inside: it repeats one element");
    match m.read_tile(&rep) {
        Err(Error::Capacity { arg, .. }) => assert_eq!(arg, "tile"),
        other => panic!("{other:?}"),
    }
    let (mut hm, h, _) = setup(true);
    let rows = h.with_rows(u32::MAX, 0).expect("a legal view");
    assert!(matches!(hm.read_tile(&rows), Err(Error::Capacity { .. })));
    // As an engine operand (the reduce over a broadcast of the issue): the same error, named.
    let d = m.alloc(Space::Sbuf, "d", &[4, 1], Dtype::Fp32).expect("alloc");
    let wide = t.with_pattern(&[(0, 1 << 31)], 0).expect("a legal view");
    let r = m.tensor_reduce(&d, trn2core::machine::AluOp::Add, &wide, 1, false);
    let _ = &mut hm;
    match r {
        Err(Error::Capacity { arg, .. }) => assert_eq!(arg, "data"),
        other => panic!("{other:?}"),
    }
}
