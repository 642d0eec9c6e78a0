//! Access patterns on arbitrary bytes (issue 28): a chain of views (`with_pattern` = NKI's
//! `.ap()`, `with_rows`, `reshape_free`, `slice`) of an HBM or an SBUF tensor, with sizes,
//! strides and offsets drawn near the 64-bit limits, checked against a model in 128-bit
//! arithmetic written here: each `ap`/`rows`/`reshape_free` gives exactly the model's view (or
//! is refused only when a tile cannot represent it), a slice stays inside its parent's reach,
//! `check_tile` accepts exactly the views whose every element lies inside the tensor, a read
//! of a small view returns the model's elements, and a huge one is a `CapacityError`. No
//! operation may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trn2core::machine::tile::Index;
use trn2core::machine::{Dtype, Machine, MachineConfig, Tile};
use trn2core::memory::Space;
use trn2core::Error;

const ESIZE: i128 = 4;
const HBM_ELEMS: i128 = 64;
const SBUF_FREE: i128 = 16;

/// A view in exact integers: byte offset, rows (HBM) or partitions (SBUF) and the HBM row
/// step, and the free dimensions as (size, stride in elements).
#[derive(Debug, Clone, PartialEq)]
struct View {
    hbm: bool,
    offset: i128,
    rows: i128,
    row_step: i128,
    dims: Vec<(i128, i128)>,
}

impl View {
    fn of(t: &Tile) -> View {
        View {
            hbm: t.space == Space::Hbm,
            offset: t.offset as i128,
            rows: t.partitions as i128,
            row_step: if t.space == Space::Hbm {
                t.partition_step as i128
            } else {
                0
            },
            dims: t.dims().map(|(s, st)| (s as i128, st as i128)).collect(),
        }
    }

    fn elements(&self) -> i128 {
        self.dims
            .iter()
            .fold(self.rows, |n, d| n.saturating_mul(d.0))
    }

    /// Lowest and one-past-highest byte any element reaches.
    fn extent(&self) -> (i128, i128) {
        let mut reach: Vec<i128> = self.dims.iter().map(|&(s, st)| (s - 1) * st).collect();
        if self.hbm {
            reach.push((self.rows - 1) * self.row_step);
        }
        let lo: i128 = reach.iter().filter(|r| **r < 0).sum();
        let hi: i128 = reach.iter().filter(|r| **r > 0).sum();
        (self.offset + lo * ESIZE, self.offset + (hi + 1) * ESIZE)
    }

    fn inside(&self, first_partition: i128) -> bool {
        let (lo, hi) = self.extent();
        let end = if self.hbm { HBM_ELEMS } else { SBUF_FREE } * ESIZE;
        let parts_ok = self.hbm || (first_partition >= 0 && first_partition + self.rows <= 4);
        parts_ok && lo >= 0 && hi <= end && self.offset % ESIZE == 0
    }

    fn values(&self, first_partition: i128) -> Vec<f32> {
        let free: i128 = self.dims.iter().map(|d| d.0).product();
        let mut out = Vec::new();
        for r in 0..self.rows {
            let row = if self.hbm {
                r * self.row_step
            } else {
                (first_partition + r) * SBUF_FREE
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

    fn representable(&self) -> bool {
        let i64r = |v: i128| i64::try_from(v).is_ok();
        let u32r = |v: i128| (1..=u32::MAX as i128).contains(&v);
        i64r(self.offset)
            && u32r(self.rows)
            && i64r(self.row_step)
            && self.dims.iter().all(|&(s, st)| u32r(s) && i64r(st))
    }
}

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

fn setup(hbm: bool) -> (Machine, Tile) {
    let mut m = Machine::new(MachineConfig::default()).expect("machine");
    let t = if hbm {
        let data: Vec<u8> = (0..HBM_ELEMS)
            .flat_map(|k| (k as f32).to_le_bytes())
            .collect();
        m.hbm_tensor("h", &[8, 8], Dtype::Fp32, Some(&data))
            .expect("hbm")
    } else {
        let t = m
            .alloc(Space::Sbuf, "s", &[4, 16], Dtype::Fp32)
            .expect("sbuf");
        let data: Vec<u8> = (0..4 * SBUF_FREE)
            .flat_map(|k| (k as f32).to_le_bytes())
            .collect();
        m.write_tile(&t, &data).expect("write");
        t
    };
    (m, t)
}

/// One operation drawn from the bytes: its result and the model's view (`None` when the
/// model has none: a refused operation, or a slice).
fn step(t: &Tile, b: &mut Bytes) -> Option<(Result<Tile, Error>, Option<View>)> {
    let v = View::of(t);
    let kind = b.byte()? % 4;
    Some(match kind {
        0 => {
            let n = usize::from(b.byte()? % 6);
            let mut pattern = Vec::new();
            for _ in 0..n {
                pattern.push((b.i64()?, b.u32()?));
            }
            let offset = b.i64()?;
            let ok = (1..=4).contains(&n) && pattern.iter().all(|p| p.1 > 0);
            let mut w = v.clone();
            w.offset += offset as i128 * ESIZE;
            w.dims = pattern
                .iter()
                .map(|&(st, k)| (k as i128, st as i128))
                .collect();
            (t.with_pattern(&pattern, offset), ok.then_some(w))
        }
        1 => {
            let (count, stride) = (b.u32()?, b.i64()?);
            let mut w = v.clone();
            w.rows = count as i128;
            w.row_step = stride as i128;
            let ok = v.hbm && count > 0;
            (t.with_rows(count, stride), ok.then_some(w))
        }
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
            let free = v.dims.iter().fold(1i128, |n, d| n.saturating_mul(d.0));
            let prod = shape
                .iter()
                .try_fold(1i128, |a, &s| a.checked_mul(s as i128));
            let mut inner = 1i128;
            let mut contiguous = true;
            for &(s, st) in v.dims.iter().rev() {
                contiguous &= s <= 1 || st == inner;
                inner = inner.saturating_mul(s);
            }
            let ok = !shape.is_empty() && shape.len() <= 4 && prod == Some(free) && contiguous;
            let mut w = v.clone();
            let mut stride = 1i128;
            w.dims = shape
                .iter()
                .rev()
                .map(|&s| {
                    let d = (s as i128, stride);
                    stride = stride.saturating_mul(s as i128);
                    d
                })
                .collect();
            w.dims.reverse();
            (t.reshape_free(&shape), ok.then_some(w))
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
            (t.slice(&index), None)
        }
    })
}

fuzz_target!(|data: &[u8]| {
    // Huge in-bounds views must be refused by the host check, not allocated.
    std::env::set_var("TRN2CORE_HOST_MEMORY", "64MiB");
    let mut b = Bytes(data);
    let Some(first) = b.byte() else { return };
    let (m, mut tile) = setup(first % 2 == 0);
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
