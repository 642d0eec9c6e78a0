//! Access patterns on arbitrary bytes (issue 28): a chain of views (`with_pattern` = NKI's
//! `.ap()`, `with_rows`, `reshape_free`, `slice`) of an HBM or an SBUF tensor, with sizes,
//! strides and offsets drawn near the 64-bit limits, checked against the model in 128-bit
//! arithmetic that the proptest uses too (rust/trn2core/tests/it/view_model.rs): each
//! `ap`/`rows`/`reshape_free` gives exactly the model's view (or is refused only when a tile
//! cannot represent it), a slice stays inside its parent's reach, `check_tile` accepts exactly
//! the views whose every element lies inside the tensor, a read of a small view returns the
//! model's elements, and a huge one is a `CapacityError`. No operation may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trn2core::machine::tile::Index;
use trn2core::machine::Tile;
use trn2core::Error;

// The model the proptest checks against too (one copy of it).
#[path = "../../rust/trn2core/tests/it/view_model.rs"]
mod view_model;
use view_model::{apply, model, tensor, Op, View};

/// Reads numbers from the fuzzer's bytes, biased towards the 64-bit limits.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn i64(&mut self) -> Option<i64> {
        let k = self.byte()?;
        let small = i64::from(k as i8 % 9);
        Some(match k % 8 {
            0..=3 => small,
            4 => i64::MAX - small.abs(),
            5 => i64::MIN + small.abs(),
            6 => (1i64 << (62 - (k / 8) % 3)) + small,
            _ => {
                let mut w = [0u8; 8];
                for b in &mut w {
                    *b = self.byte()?;
                }
                i64::from_le_bytes(w)
            }
        })
    }

    fn u32(&mut self) -> Option<u32> {
        let k = self.byte()?;
        Some(match k % 6 {
            0..=3 => u32::from(k / 6 % 5),
            4 => u32::MAX - u32::from(k / 6 % 3),
            _ => 1 << (31 - u32::from(k / 6 % 3)),
        })
    }
}

/// One operation drawn from the bytes: its result and the model's view (`None` when the
/// model has none: a refused operation, or a slice).
fn step(t: &Tile, b: &mut Bytes) -> Option<(Result<Tile, Error>, Option<View>)> {
    let op = match b.byte()? % 4 {
        0 => {
            let n = usize::from(b.byte()? % 6);
            let mut pattern = Vec::new();
            for _ in 0..n {
                pattern.push((b.i64()?, b.u32()?));
            }
            Op::Ap(pattern, b.i64()?)
        }
        1 => Op::Rows(b.u32()?, b.i64()?),
        2 => {
            let n = usize::from(b.byte()? % 6);
            let mut shape = Vec::new();
            for _ in 0..n {
                let k = b.byte()?;
                shape.push(match k % 4 {
                    0 => (1usize << 62) + 1,
                    1 => usize::MAX,
                    _ => usize::from(k / 4 % 9),
                });
            }
            Op::Reshape(shape)
        }
        _ => {
            let n = usize::from(b.byte()? % 4);
            let mut index = Vec::new();
            for _ in 0..n {
                let k = b.byte()?;
                index.push(if k % 3 == 0 {
                    Index::At(b.i64()?)
                } else {
                    let step = b.i64()?;
                    Index::Range {
                        start: (k & 4 != 0).then(|| b.i64()).flatten(),
                        stop: (k & 8 != 0).then(|| b.i64()).flatten(),
                        step,
                    }
                });
            }
            // No model of numpy's slice rules here: only that the selection stays inside
            // the parent's reach (checked by the caller).
            return Some((t.slice(&index), None));
        }
    };
    Some((apply(t, &op), model(&View::of(t), &op)))
}

fuzz_target!(|data: &[u8]| {
    // Huge in-bounds views must be refused by the host check, not allocated.
    std::env::set_var("TRN2CORE_HOST_MEMORY", "64MiB");
    let mut b = Bytes(data);
    let Some(first) = b.byte() else { return };
    let (m, mut tile) = tensor(first % 2 == 0);
    for _ in 0..4 {
        let parent = View::of(&tile);
        let Some((result, want)) = step(&tile, &mut b) else {
            break;
        };
        match result {
            Ok(t) => {
                let got = View::of(&t);
                if let Some(w) = want {
                    assert_eq!(got, w, "the view differs from the model");
                } else if parent.inside(tile.start_partition as i128) && !got.hbm {
                    // A slice of an SBUF view that was inside stays inside its reach.
                    let (plo, phi) = parent.extent();
                    let (lo, hi) = got.extent();
                    assert!(plo <= lo && hi <= phi, "slice {got:?} leaves {parent:?}");
                }
                tile = t;
            }
            Err(e) => {
                // Refused: only when the model has no such view, or a tile cannot hold it.
                if let Some(w) = want {
                    assert!(!w.representable(), "refused a representable {w:?}: {e:?}");
                }
                break;
            }
        }
    }
    let v = View::of(&tile);
    let inside = v.inside(tile.start_partition as i128);
    let checked = m.check_tile("tile", &tile);
    assert_eq!(checked.is_ok(), inside, "bounds of {v:?}: {checked:?}");
    match m.read_tile(&tile) {
        Ok(bytes) => {
            assert!(inside, "read outside: {v:?}");
            let got: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if v.elements() <= 4096 {
                assert_eq!(got, v.values(tile.start_partition as i128));
            }
        }
        Err(Error::Capacity { .. }) => assert!(v.elements() * 4 >= 1 << 22, "{v:?}"),
        Err(_) => assert!(!inside, "refused a read inside: {v:?}"),
    }
});
