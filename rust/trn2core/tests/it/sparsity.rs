//! Structured sparsity (contract section 3) against naive scalar oracles written from the
//! contract's text: prune keeps the N largest magnitudes of each group (ties to the lower index,
//! NaN the largest), compress/decompress round-trip bit for bit, and PyTorch's CUTLASS layout.

use proptest::prelude::*;
use trn2core::numerics::{fp8_lut, mix64, Format};
use trn2core::sparsity::{
    check, compress, compress_into, from_cutlass, pack_indices, prune, to_cutlass, unpack_indices,
    Compressed, CompressedLayout, CutlassMeta, Dtype, Element, Pattern,
};
use trn2core::Error;

// ------------------------------------------------------------------------------------------
// Oracles
// ------------------------------------------------------------------------------------------

/// A magnitude that sorts like the contract says, computed from the decoded value (not from the
/// bit tricks of the implementation): `(is_nan, |float|, |integer|)`.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
struct Mag(bool, f64, u128);

fn magnitude(dtype: Dtype, code: u64) -> Mag {
    let float = |v: f64| Mag(v.is_nan(), if v.is_nan() { 0.0 } else { v.abs() }, 0);
    let fp8 = |f: Format| float(fp8_lut(&f.encoding())[code as usize & 0xFF] as f64);
    let signed = |bits: u32| {
        let v = ((code << (64 - bits)) as i64) >> (64 - bits);
        Mag(false, 0.0, (v as i128).unsigned_abs())
    };
    match dtype {
        Dtype::F64 => float(f64::from_bits(code)),
        Dtype::F32 => float(f32::from_bits(code as u32) as f64),
        Dtype::F16 => float(crate::reference::f16_value(code as u16)),
        Dtype::Bf16 => float(f64::from(f32::from_bits((code as u32) << 16))),
        Dtype::Fp8E4m3 => fp8(Format::Fp8E4m3),
        Dtype::Fp8E5m2 => fp8(Format::Fp8E5m2),
        Dtype::Fp8E3m4 => fp8(Format::Fp8E3m4),
        Dtype::Fp8E4m3fn => fp8(Format::Fp8E4m3fn),
        Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => signed(dtype.bits()),
        _ => Mag(false, 0.0, code as u128),
    }
}

/// Flat indices of the elements of group `(o, g, i)` along the axis of `shape`.
fn group_elements(shape: &[usize], axis: usize, m: usize) -> Vec<Vec<usize>> {
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut groups = Vec::new();
    for o in 0..outer {
        for g in 0..len / m {
            for i in 0..inner {
                groups.push((0..m).map(|k| (o * len + g * m + k) * inner + i).collect());
            }
        }
    }
    groups
}

/// The contract's prune, by a stable sort of each group on descending magnitude.
fn oracle_prune<T: Element>(
    x: &[T], dtype: Dtype, shape: &[usize], axis: usize, p: Pattern,
) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    for group in group_elements(shape, axis, p.m()) {
        let mut order: Vec<usize> = (0..group.len()).collect();
        let mags: Vec<Mag> = group.iter().map(|&e| magnitude(dtype, x[e].to_u64())).collect();
        // Stable: equal magnitudes keep ascending index.
        order.sort_by(|&a, &b| mags[b].partial_cmp(&mags[a]).unwrap_or(std::cmp::Ordering::Equal));
        for &k in order.iter().take(p.n()) {
            out[group[k]] = x[group[k]];
        }
    }
    out
}

/// Random codes of `T`'s width with many zeros, `-0.0`, NaNs with payloads, ties and extremes.
fn codes<T: Element>(seed: u64, len: usize) -> Vec<T> {
    let bits = T::BITS;
    let all = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let sign = 1u64 << (bits - 1);
    (0..len)
        .map(|i| {
            let r = mix64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64);
            let v = match r % 16 {
                0..=4 => 0,
                5 => sign,                        // -0.0 (or the most negative integer)
                6 => all,                         // a NaN with full payload (or -1)
                7 => (all >> 1) ^ (r >> 40) & 3,  // NaNs near the top, or large integers
                8 | 9 => 1 + (r >> 32) % 3,       // ties among small values
                10 => sign | (1 + (r >> 32) % 3), // the same magnitudes, negative
                _ => r >> 8,
            };
            T::from_u64(v & all)
        })
        .collect()
}

fn dtypes_of_width(bits: u32) -> Vec<Dtype> {
    Dtype::ALL.iter().copied().filter(|d| d.bits() == bits).collect()
}

/// Shapes whose axis (first, middle, last) has length `3 * m`, plus one-group shapes.
fn shapes(m: usize) -> Vec<(Vec<usize>, isize)> {
    vec![
        (vec![5, 3 * m], -1),
        (vec![3 * m, 5], 0),
        (vec![2, 3 * m, 3], 1),
        (vec![2, 3, 3 * m], 2),
        (vec![m], 0),
        (vec![1, m, 1], 1),
        (vec![1, m], -1),
        (vec![0, m], -1),
    ]
}

fn norm(axis: isize, ndim: usize) -> usize {
    if axis < 0 {
        (axis + ndim as isize) as usize
    } else {
        axis as usize
    }
}

// ------------------------------------------------------------------------------------------
// prune, compress, decompress for every pattern, width and axis
// ------------------------------------------------------------------------------------------

fn prune_and_round_trip<T: Element>() {
    for dtype in dtypes_of_width(T::BITS) {
        for (pi, p) in Pattern::ALL.into_iter().enumerate() {
            for (si, (shape, axis)) in shapes(p.m()).into_iter().enumerate() {
                let len: usize = shape.iter().product();
                let seed = (pi * 100 + si) as u64 ^ (T::BITS as u64) << 20;
                let x: Vec<T> = codes(seed, len);
                let ctx = format!("{} {p} {shape:?} axis {axis}", dtype.name());
                let got = prune(&x, dtype, &shape, axis, p).expect("valid prune");
                let want = oracle_prune(&x, dtype, &shape, norm(axis, shape.len()), p);
                assert_eq!(got, want, "{ctx}");
                // The pruned array conforms, compresses and comes back bit for bit.
                check(&got, &shape, axis, p).expect("pruned arrays conform");
                let c = compress(&got, &shape, axis, p).expect("pruned arrays compress");
                assert_eq!(c.decompress(), got, "{ctx}");
                let mut vshape = shape.clone();
                vshape[norm(axis, shape.len())] = shape[norm(axis, shape.len())] / p.m() * p.n();
                assert_eq!(c.values_shape(), vshape, "{ctx}");
                assert_eq!(c.values().len(), len / p.m() * p.n(), "{ctx}");
                let idx_bytes = (c.values().len() * p.index_bits() as usize).div_ceil(8);
                assert_eq!(c.packed_indices().len(), idx_bytes, "{ctx}");
                assert_eq!(c.nbytes(), c.values().len() * T::BITS as usize / 8 + idx_bytes);
                // Rebuilt from its parts, it is the same object.
                let again = Compressed::from_parts(
                    c.values().to_vec(),
                    c.packed_indices().to_vec(),
                    &shape,
                    axis,
                    p,
                )
                .expect("parts of a compressed array are valid");
                assert_eq!(again, c, "{ctx}");
            }
        }
    }
}

/// One `#[test]` per element width: `name: T` runs `prune_and_round_trip::<T>`.
macro_rules! prune_round_trip_tests {
    ($($name:ident: $t:ty),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                prune_and_round_trip::<$t>();
            }
        )*
    };
}

prune_round_trip_tests!(
    prune_matches_the_oracle_and_round_trips_8_bit: u8,
    prune_matches_the_oracle_and_round_trips_16_bit: u16,
    prune_matches_the_oracle_and_round_trips_32_bit: u32,
    prune_matches_the_oracle_and_round_trips_64_bit: u64,
);

#[test]
fn prune_keeps_the_largest_with_lower_index_ties() {
    // bf16 codes: 1.0, -2.0, 1.0, 0.5 -> keep -2.0 and the first 1.0.
    let x: [u16; 4] = [0x3F80, 0xC000, 0x3F80, 0x3F00];
    let got = prune(&x, Dtype::Bf16, &[4], -1, Pattern::TWO_FOUR).expect("valid");
    assert_eq!(got, [0x3F80, 0xC000, 0, 0]);
    // NaN beats Inf; two NaNs with different payloads tie, so the lower index wins.
    let x: [u16; 4] = [0x7F80, 0x7FC1, 0xFFFF, 0x0001];
    let got = prune(&x, Dtype::Bf16, &[4], 0, Pattern::new(1, 4).expect("1:4")).expect("ok");
    assert_eq!(got, [0, 0x7FC1, 0, 0]);
}

/// Every pattern, width and dtype, with the axis last (`inner` 1) or followed by 5 elements,
/// against ranks computed the slow way from the library's own magnitude key, on data full of
/// ties and zeros. (Moved from the module's unit tests: the kernels are then compiled once for
/// the tests, here, not again in the unit-test binary.)
#[test]
fn prune_selection_matches_ranks_of_the_magnitude_key() {
    fn check_width<T: Element>() {
        let len = 48 * 40;
        let x: Vec<T> = (0..len as u64)
            .map(|i| {
                let r = mix64(i ^ ((T::BITS as u64) << 32));
                // A few distinct magnitudes of both signs, and zeros.
                T::from_u64(if r.is_multiple_of(3) {
                    0
                } else {
                    (r >> 8) % 5 + (((r >> 16) % 2) << (T::BITS - 1))
                })
            })
            .collect();
        for dtype in dtypes_of_width(T::BITS) {
            for p in Pattern::ALL {
                for inner in [1usize, 5] {
                    let (m, n) = (p.m(), p.n());
                    let shape = [len / (m * inner), m, inner];
                    let got = prune(&x, dtype, &shape, 1, p).expect("valid");
                    for block in 0..len / (m * inner) {
                        for i in 0..inner {
                            let at = |k: usize| block * m * inner + k * inner + i;
                            let key = |k: usize| dtype.magnitude_key(x[at(k)].to_u64());
                            for k in 0..m {
                                let above = (0..m)
                                    .filter(|&j| key(j) > key(k) || (key(j) == key(k) && j < k))
                                    .count();
                                let want = if above < n { x[at(k)] } else { T::ZERO };
                                assert_eq!(got[at(k)], want, "{} {p} inner {inner}", dtype.name());
                            }
                        }
                    }
                }
            }
        }
    }
    check_width::<u8>();
    check_width::<u16>();
    check_width::<u32>();
    check_width::<u64>();
}

// (The next two were the compress module's unit tests: compressing u16 and u32 codes there
// compiled those kernels again in the unit-test binary.)
#[test]
fn compress_into_fills_caller_buffers_like_compress() {
    // 3 rows of 8 along the last axis, 2:4, every group holding two stored codes.
    let x: Vec<u16> =
        (0..24u16).map(|i| if i % 4 == 1 || i % 4 == 2 { i + 1 } else { 0 }).collect();
    let p = Pattern::parse("2:4").expect("a pattern");
    let layout = CompressedLayout::new(x.len(), &[3, 8], -1, p).expect("a layout");
    assert_eq!((layout.values, layout.index_bytes), (12, 3));
    assert_eq!(layout.values_shape(), vec![3, 4]);
    // Garbage in the buffers must all be overwritten.
    let (mut v, mut i) = (vec![0xAAAAu16; 12], vec![0x55u8; 3]);
    compress_into(&x, &layout, &mut v, &mut i).expect("compressed");
    let c = compress(&x, &[3, 8], -1, p).expect("compressed");
    assert_eq!(v, c.values());
    assert_eq!(i, c.packed_indices());
    let err = compress_into(&x, &layout, &mut v[..11], &mut i).expect_err("a shape error");
    assert!(err.to_string().contains("need 12 and 3"), "{err}");
    let err = compress_into(&x[..20], &layout, &mut v, &mut i).expect_err("a shape error");
    assert!(err.to_string().contains("20 elements"), "{err}");
}

#[test]
fn compress_worked_example_of_the_module_doc() {
    let x: Vec<u32> =
        [0.0f32, 3.0, 0.0, -1.0, 5.0, 0.0, 0.0, 0.0].iter().map(|v| v.to_bits()).collect();
    let c = compress(&x, &[8], -1, Pattern::TWO_FOUR).expect("conforms");
    let want: Vec<u32> = [3.0f32, -1.0, 5.0, 0.0].iter().map(|v| v.to_bits()).collect();
    assert_eq!(c.values(), want.as_slice());
    assert_eq!(c.indices(), [1, 3, 0, 1]);
    assert_eq!(c.packed_indices(), [0x4D]);
    assert_eq!(c.nbytes(), 17);
    assert_eq!(c.values_shape(), [4]);
    assert_eq!(c.decompress(), x);
}

#[test]
fn prune_on_large_arrays_spanning_many_tasks() {
    // Several parallel tasks along every axis position, 2:4 and 4:12 (a non-power-of-two m).
    for p in [Pattern::TWO_FOUR, Pattern::new(4, 12).expect("4:12")] {
        for (shape, axis) in [(vec![96, 1200], -1), (vec![1200, 96], 0), (vec![7, 1200, 13], 1)] {
            let len: usize = shape.iter().product();
            let x: Vec<u16> = codes(42, len);
            let got = prune(&x, Dtype::Bf16, &shape, axis, p).expect("valid");
            let want = oracle_prune(&x, Dtype::Bf16, &shape, norm(axis, shape.len()), p);
            assert_eq!(got, want, "{p} {shape:?}");
            let c = compress(&got, &shape, axis, p).expect("conforms");
            assert_eq!(c.decompress(), got);
        }
    }
}

#[test]
fn exhaustive_bf16_pairs_under_1_2() {
    // Every ordered pair of a representative set of bf16 codes: keep the larger magnitude, the
    // first one on a tie, NaN over everything.
    let specials: Vec<u16> = vec![
        0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x3F81, 0x7F7F, 0xFF7F,
        0x7F80, 0xFF80, 0x7F81, 0x7FC0, 0xFFC0, 0xFFFF, 0x7FFF,
    ];
    let p = Pattern::new(1, 2).expect("1:2");
    for &a in &specials {
        for &b in &specials {
            let got = prune(&[a, b], Dtype::Bf16, &[2], 0, p).expect("valid");
            let (ma, mb) = (magnitude(Dtype::Bf16, a as u64), magnitude(Dtype::Bf16, b as u64));
            let want = if mb > ma { [0, b] } else { [a, 0] };
            assert_eq!(got, want, "{a:#06x} {b:#06x}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------

#[test]
fn an_axis_that_is_not_a_multiple_of_m_is_a_shape_error() {
    let x = vec![0u16; 2 * 6];
    for p in [Pattern::TWO_FOUR, Pattern::new(4, 8).expect("4:8")] {
        let e = prune(&x, Dtype::Bf16, &[2, 6], -1, p).expect_err("6 is no multiple");
        assert!(matches!(&e, Error::Shape { message, .. } if message.contains("length 6")), "{e}");
        assert!(matches!(compress(&x, &[2, 6], 1, p), Err(Error::Shape { .. })));
        assert!(matches!(check(&x, &[2, 6], -1, p), Err(Error::Shape { .. })));
    }
    // The other axis is fine for 1:2.
    assert!(compress(&x, &[2, 6], 0, Pattern::new(1, 2).expect("1:2")).is_ok());
    // Bad axes, a shape that does not match the data, a 0-d array.
    assert!(matches!(compress(&x, &[2, 6], 2, Pattern::TWO_FOUR), Err(Error::Shape { .. })));
    assert!(matches!(compress(&x, &[2, 6], -3, Pattern::TWO_FOUR), Err(Error::Shape { .. })));
    assert!(matches!(compress(&x, &[4, 4], -1, Pattern::TWO_FOUR), Err(Error::Shape { .. })));
    assert!(matches!(compress(&x[..1], &[], 0, Pattern::TWO_FOUR), Err(Error::Shape { .. })));
    let huge = [usize::MAX, 4, 4];
    assert!(matches!(
        prune(&x, Dtype::Bf16, &huge, -1, Pattern::TWO_FOUR),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn a_non_conforming_group_is_a_sparsity_error_naming_the_first_one() {
    // Shape [2, 8, 3] along axis 1: 2 stored elements in group (o=0, g=1, i=2), which is fine,
    // and 3 in group (o=1, g=1, i=2), the offender.
    let shape = [2usize, 8, 3];
    let mut x = vec![0u32; 48];
    let at = |o: usize, a: usize, i: usize| (o * 8 + a) * 3 + i;
    x[at(0, 4, 2)] = 1;
    x[at(0, 5, 2)] = 1; // 2 in group (0, 1, 2): fine for 2:4
    x[at(1, 4, 2)] = 0x8000_0000; // -0.0 counts
    x[at(1, 6, 2)] = 0x7FC0_0001; // a NaN counts
    x[at(1, 7, 2)] = 5;
    let e = compress(&x, &shape, 1, Pattern::TWO_FOUR).expect_err("3 stored in one group");
    let Error::Sparsity { arg, message, .. } = &e else {
        panic!("expected a sparsity error, got {e:?}")
    };
    assert_eq!(arg, "x");
    assert!(message.contains("x[1, 4:8, 2]"), "{message}");
    assert!(message.contains("group 1 along axis 1"), "{message}");
    assert!(message.contains("3 stored"), "{message}");
    assert!(message.contains("at most 2"), "{message}");
    assert_eq!(check(&x, &shape, 1, Pattern::TWO_FOUR), Err(e));
    // Under 4:8 the same array conforms.
    let c = compress(&x, &shape, 1, Pattern::new(4, 8).expect("4:8")).expect("conforms");
    assert_eq!(c.decompress(), x);
}

#[test]
fn the_first_offending_group_is_found_across_parallel_tasks() {
    // Violations far apart (different tasks): the error names the earliest in C order.
    let (rows, cols) = (64usize, 4096usize);
    let mut x = vec![0u16; rows * cols];
    for &(r, c) in &[(50usize, 4000usize), (3, 2048), (40, 8)] {
        x[r * cols + c] = 1;
        x[r * cols + c + 1] = 1;
        x[r * cols + c + 2] = 1;
    }
    for _ in 0..5 {
        let e = compress(&x, &[rows, cols], -1, Pattern::TWO_FOUR).expect_err("violations");
        assert!(e.to_string().contains("x[3, 2048:2052]"), "{e}");
    }
}

#[test]
fn prune_rejects_a_dtype_of_another_width() {
    let x = vec![0u8; 8];
    assert!(matches!(
        prune(&x, Dtype::Bf16, &[8], -1, Pattern::TWO_FOUR),
        Err(Error::Format { .. })
    ));
    assert!(matches!(
        prune(&[0u16; 4], Dtype::F32, &[4], -1, Pattern::TWO_FOUR),
        Err(Error::Format { .. })
    ));
}

// ------------------------------------------------------------------------------------------
// Bits that must survive
// ------------------------------------------------------------------------------------------

#[test]
fn negative_zero_and_nan_payloads_survive() {
    // bf16: -0.0, a signalling NaN with payload, a negative NaN, a subnormal.
    let x: Vec<u16> = vec![0x8000, 0, 0x7F81, 0, 0, 0xFFC5, 0, 0, 0, 0, 0, 0x0001];
    for p in [Pattern::TWO_FOUR, Pattern::new(4, 12).expect("4:12")] {
        let c = compress(&x, &[12], 0, p).expect("conforms");
        assert_eq!(c.decompress(), x, "{p}");
        assert!(c.values().contains(&0x7F81) && c.values().contains(&0xFFC5));
    }
    // -0.0 is stored, so it counts towards n.
    let e = compress(&[0x8000u16, 1, 2, 0], &[4], 0, Pattern::TWO_FOUR).expect_err("3 stored");
    assert!(matches!(e, Error::Sparsity { .. }));
    // Pruning keeps a NaN over Inf and over a -0.0 (which ranks with +0.0).
    let got = prune(&[0x8000u16, 0x7F80, 0xFF81, 0], Dtype::Bf16, &[4], 0, Pattern::TWO_FOUR)
        .expect("valid");
    assert_eq!(got, [0, 0x7F80, 0xFF81, 0]);
    // f64 too: every payload bit.
    let nan = 0xFFF0_0000_DEAD_BEEFu64;
    let x = vec![0, nan, (-0.0f64).to_bits(), 0];
    let c = compress(&x, &[4], 0, Pattern::TWO_FOUR).expect("conforms");
    assert_eq!(c.values(), [nan, (-0.0f64).to_bits()]);
    assert_eq!(c.decompress(), x);
}

#[test]
fn free_slots_take_the_lowest_free_positions() {
    // 4:16 group with one stored element at 9 -> positions [0, 1, 2, 9], values [0, 0, 0, v].
    let mut x = vec![0u8; 16];
    x[9] = 0x42;
    let c = compress(&x, &[16], 0, Pattern::new(4, 16).expect("4:16")).expect("conforms");
    assert_eq!(c.indices(), [0, 1, 2, 9]);
    assert_eq!(c.values(), [0, 0, 0, 0x42]);
    // 4-bit positions: 0 | 1 << 4, 2 | 9 << 4.
    assert_eq!(c.packed_indices(), [0x10, 0x92]);
    assert_eq!(c.nbytes(), 4 + 2);
}

#[test]
fn from_parts_rejects_bad_parts() {
    let x: Vec<u16> = vec![0, 7, 0, 9, 1, 0, 0, 0];
    let c = compress(&x, &[8], 0, Pattern::TWO_FOUR).expect("conforms");
    let vals = c.values().to_vec();
    // Positions [3, 1] (descending) in group 0.
    let bad = pack_indices(&[3, 1, 0, 1], 2);
    let e = Compressed::from_parts(vals.clone(), bad, &[8], 0, Pattern::TWO_FOUR)
        .expect_err("descending positions");
    assert!(
        matches!(&e, Error::Sparsity { arg, message, .. } if arg == "indices" && message.contains("x[0:4]")),
        "{e}"
    );
    // Repeated positions.
    let bad = pack_indices(&[1, 3, 2, 2], 2);
    assert!(Compressed::from_parts(vals.clone(), bad, &[8], 0, Pattern::TWO_FOUR).is_err());
    // A position >= m (4:12 uses 4-bit positions that can name 12..15).
    let p412 = Pattern::new(4, 12).expect("4:12");
    let bad = pack_indices(&[0, 1, 2, 12], 4);
    assert!(matches!(
        Compressed::from_parts(vec![0u16; 4], bad, &[12], 0, p412),
        Err(Error::Sparsity { .. })
    ));
    // Wrong sizes.
    let good = c.packed_indices().to_vec();
    assert!(matches!(
        Compressed::from_parts(vals[..3].to_vec(), good.clone(), &[8], 0, Pattern::TWO_FOUR),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        Compressed::from_parts(vals.clone(), vec![0; 2], &[8], 0, Pattern::TWO_FOUR),
        Err(Error::Shape { .. })
    ));
    let back = Compressed::from_parts(vals, good, &[8], 0, Pattern::TWO_FOUR).expect("valid");
    assert_eq!(back.decompress(), x);
}

#[test]
fn index_packing_round_trips_for_every_width() {
    for bits in 1..=4u32 {
        let pos: Vec<u8> = (0..1000u64).map(|i| (mix64(i) % (1 << bits)) as u8).collect();
        let packed = pack_indices(&pos, bits);
        assert_eq!(packed.len(), (pos.len() * bits as usize).div_ceil(8));
        assert_eq!(unpack_indices(&packed, bits, pos.len()), pos);
    }
}

// ------------------------------------------------------------------------------------------
// Property tests
// ------------------------------------------------------------------------------------------

fn round_trip_prop<T: Element>(seed: u64, dims: &[usize], axis_pos: usize, pi: usize) {
    let p = Pattern::ALL[pi % Pattern::ALL.len()];
    let mut shape = dims.to_vec();
    let ax = axis_pos % shape.len();
    shape[ax] *= p.m();
    let len: usize = shape.iter().product();
    let dtype = dtypes_of_width(T::BITS)[seed as usize % dtypes_of_width(T::BITS).len()];
    let x: Vec<T> = codes(seed, len);
    let pruned = prune(&x, dtype, &shape, ax as isize, p).expect("valid");
    assert_eq!(pruned, oracle_prune(&x, dtype, &shape, ax, p));
    let c = compress(&pruned, &shape, ax as isize - shape.len() as isize, p).expect("conforms");
    assert_eq!(c.decompress(), pruned);
    // Positions are strictly ascending below m in every group.
    let pos = c.indices();
    let inner: usize = shape[ax + 1..].iter().product();
    for (o, chunk) in pos.chunks(p.n() * inner).enumerate() {
        for i in 0..inner {
            let g: Vec<u8> = (0..p.n()).map(|s| chunk[s * inner + i]).collect();
            assert!(
                g.windows(2).all(|w| w[0] < w[1]) && g.iter().all(|&q| (q as usize) < p.m()),
                "{o} {g:?}"
            );
        }
    }
}

/// One proptest per element width: `name: T` runs `round_trip_prop::<T>`.
macro_rules! round_trip_props {
    ($($name:ident: $t:ty),* $(,)?) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            $(
                #[test]
                fn $name(seed in any::<u64>(), dims in prop::collection::vec(1usize..5, 1..4), axis in 0usize..4, pi in 0usize..7) {
                    round_trip_prop::<$t>(seed, &dims, axis, pi);
                }
            )*
        }
    };
}

round_trip_props!(
    prop_round_trip_u8: u8,
    prop_round_trip_u16: u16,
    prop_round_trip_u32: u32,
    prop_round_trip_u64: u64,
);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_any_conforming_array_round_trips(seed in any::<u64>(), groups in 1usize..40, pi in 0usize..7) {
        // Arbitrary stored codes (any bits) at arbitrary conforming positions.
        let p = Pattern::ALL[pi];
        let mut x = vec![0u16; groups * p.m()];
        for (g, grp) in x.chunks_mut(p.m()).enumerate() {
            let r = mix64(seed ^ g as u64);
            let count = (r % (p.n() as u64 + 1)) as usize;
            for j in 0..count {
                let k = (mix64(r ^ j as u64) % p.m() as u64) as usize;
                grp[k] = (mix64(r.wrapping_add(j as u64)) as u16).max(1);
            }
        }
        let c = compress(&x, &[x.len()], 0, p).expect("conforms");
        prop_assert_eq!(c.decompress(), x);
    }
}

// ------------------------------------------------------------------------------------------
// CUTLASS / PyTorch semi-structured layout
// ------------------------------------------------------------------------------------------

/// A conforming matrix for the CUTLASS layout of `T` (2:4, or 1:2 for 32-bit elements).
fn cutlass_input<T: Element>(seed: u64, rows: usize, cols: usize) -> Vec<T> {
    let p = if T::BITS == 32 { Pattern::new(1, 2).expect("1:2") } else { Pattern::TWO_FOUR };
    let dtype = if T::BITS == 8 { Dtype::I8 } else { dtypes_of_width(T::BITS)[0] };
    prune(&codes::<T>(seed, rows * cols), dtype, &[rows, cols], -1, p).expect("valid")
}

fn cutlass_round_trip<T: Element>(rows: usize, cols: usize) {
    for seed in 0..4 {
        let x = cutlass_input::<T>(seed, rows, cols);
        let c = to_cutlass(&x, rows, cols).expect("conforming input");
        assert_eq!(c.values.len(), rows * cols / 2);
        assert_eq!(c.values_shape(), [rows, cols / 2]);
        let [mr, mc] = c.meta_shape();
        assert_eq!(mr * mc, c.meta.len());
        assert_eq!(from_cutlass(&c.values, &c.meta, rows, cols).expect("valid"), x);
        // For 16- and 8-bit elements the values equal those of `compress` when every group holds
        // two stored elements or none (both keep ascending order; they pad differently).
        if T::BITS != 32 {
            let full: Vec<T> = x
                .chunks(4)
                .flat_map(|g| {
                    let n = g.iter().filter(|&&e| e != T::ZERO).count();
                    if n == 2 {
                        g.to_vec()
                    } else {
                        vec![T::ZERO; 4]
                    }
                })
                .collect();
            let cc = to_cutlass(&full, rows, cols).expect("valid");
            let gc = compress(&full, &[rows, cols], -1, Pattern::TWO_FOUR).expect("valid");
            assert_eq!(cc.values, gc.values());
        }
    }
}

#[test]
fn cutlass_round_trips() {
    cutlass_round_trip::<u16>(64, 32);
    cutlass_round_trip::<u16>(192, 128);
    cutlass_round_trip::<u8>(64, 64);
    cutlass_round_trip::<u8>(128, 192);
    cutlass_round_trip::<u32>(64, 16);
    cutlass_round_trip::<u32>(128, 48);
}

#[test]
fn cutlass_meta_words_of_a_hand_computed_fp16_example() {
    // fp16 64 x 32: row 0 = [0, 3, 0, -1 | 5, 0, 0, 0 | 0...], row 8 = [0, 2, 0, 0 | 0...].
    let (rows, cols) = (64usize, 32usize);
    let mut x = vec![0u16; rows * cols];
    x[1] = 0x4200; // 3.0
    x[3] = 0xBC00; // -1.0
    x[4] = 0x4500; // 5.0
    x[8 * cols + 1] = 0x4000; // 2.0
    let c = to_cutlass(&x, rows, cols).expect("conforms");
    // Codes idx0 | idx1 << 2: (1,3) -> 0xD, (0,2) -> 0x8, empty -> (2,3) -> 0xE, (1,2) -> 0x9.
    // Word (0,0) = 0xEE8D, (8,0) = 0xEEE9, all others 0xEEEE. Row 8 is reordered row 4, so word
    // (8,0) lands in slot 2 * 4 = 8.
    let CutlassMeta::I16(meta) = &c.meta else { panic!("fp16 takes int16 meta") };
    assert_eq!(meta.len(), 128);
    let words: Vec<u16> = meta.iter().map(|&w| w as u16).collect();
    assert_eq!(words[0], 0xEE8D);
    assert_eq!(words[8], 0xEEE9);
    assert_eq!(words.iter().filter(|&&w| w == 0xEEEE).count(), 126);
    // Values: row 0 = [3, -1, 5, 0, 0...], row 8 = [2, 0, 0...].
    assert_eq!(&c.values[..4], &[0x4200, 0xBC00, 0x4500, 0]);
    assert!(c.values[4..16].iter().all(|&v| v == 0));
    assert_eq!(c.values[8 * 16], 0x4000);
    assert_eq!(c.nbytes(), 64 * 16 * 2 + 128 * 2);
}

#[test]
fn cutlass_meta_words_of_hand_computed_int8_and_fp32_examples() {
    // int8 64 x 64 (meta 64 x 2 int32): row 1 group 0 = [1, 0, 0, 0] -> (0, 2) -> 0x8, so word
    // (1, 0) = 0xEEEE_EEE8; row 1 is reordered row 2, slot 2 * 2 = 4.
    let mut x = vec![0u8; 64 * 64];
    x[64] = 1;
    let c = to_cutlass(&x, 64, 64).expect("conforms");
    let CutlassMeta::I32(meta) = &c.meta else { panic!("int8 takes int32 meta") };
    assert_eq!(meta[4] as u32, 0xEEEE_EEE8);
    assert_eq!(meta.iter().filter(|&&w| w as u32 == 0xEEEE_EEEE).count(), 127);
    assert_eq!(from_cutlass(&c.values, &c.meta, 64, 64).expect("valid"), x);
    // fp32 64 x 16 (1:2, meta 64 x 2 int16): row 0 pairs [0, 1.5], [2.5, 0], [0, 0], [0, 0] ->
    // codes 0b1110, 0b0100, 0b1110, 0b1110 -> word 0xEE4E in slot 0.
    let mut x = vec![0u32; 64 * 16];
    x[1] = 1.5f32.to_bits();
    x[2] = 2.5f32.to_bits();
    let c = to_cutlass(&x, 64, 16).expect("conforms");
    let CutlassMeta::I16(meta) = &c.meta else { panic!("fp32 takes int16 meta") };
    assert_eq!(meta[0] as u16, 0xEE4E);
    assert_eq!(&c.values[..3], &[1.5f32.to_bits(), 2.5f32.to_bits(), 0]);
    assert_eq!(from_cutlass(&c.values, &c.meta, 64, 16).expect("valid"), x);
}

#[test]
fn cutlass_errors() {
    // Three stored in a group of four.
    let mut x = vec![0u16; 64 * 32];
    x[5 * 32 + 8] = 1;
    x[5 * 32 + 9] = 1;
    x[5 * 32 + 11] = 0x8000; // -0.0 is stored
    let e = to_cutlass(&x, 64, 32).expect_err("3 in a group");
    assert!(
        matches!(&e, Error::Sparsity { message, .. } if message.contains("row 5, columns 8..12")),
        "{e}"
    );
    // Shapes: rows not a multiple of 64, odd meta column count, size mismatch.
    assert!(matches!(to_cutlass(&vec![0u16; 32 * 32], 32, 32), Err(Error::Shape { .. })));
    assert!(matches!(to_cutlass(&vec![0u16; 64 * 16], 64, 16), Err(Error::Shape { .. })));
    assert!(matches!(to_cutlass(&[0u16; 10], 64, 32), Err(Error::Shape { .. })));
    // 64-bit elements have no CUTLASS layout.
    assert!(matches!(to_cutlass(&vec![0u64; 64 * 32], 64, 32), Err(Error::Format { .. })));
    // Decoding: wrong meta kind, wrong sizes, invalid codes.
    let c = to_cutlass(&vec![0u16; 64 * 32], 64, 32).expect("zeros conform");
    let as_i32 = CutlassMeta::I32(vec![0; 128]);
    assert!(matches!(from_cutlass(&c.values, &as_i32, 64, 32), Err(Error::Format { .. })));
    assert!(matches!(from_cutlass(&c.values[1..], &c.meta, 64, 32), Err(Error::Shape { .. })));
    assert!(matches!(
        from_cutlass(&c.values, &CutlassMeta::I16(vec![0; 3]), 64, 32),
        Err(Error::Shape { .. })
    ));
    // All-zero words mean (0, 0) codes: not two distinct positions.
    let e =
        from_cutlass(&c.values, &CutlassMeta::I16(vec![0; 128]), 64, 32).expect_err("bad codes");
    assert!(matches!(&e, Error::Value { arg, .. } if arg == "meta"), "{e}");
    let f32s = vec![0u32; 64 * 16];
    let c = to_cutlass(&f32s, 64, 16).expect("zeros conform");
    let bad = CutlassMeta::I16(vec![0x4848; 128]);
    assert!(matches!(from_cutlass(&c.values, &bad, 64, 16), Err(Error::Value { .. })));
}

// ------------------------------------------------------------------------------------------
// Throughput (run with --ignored --nocapture in release)
// ------------------------------------------------------------------------------------------

#[test]
#[ignore = "timing; run in release with --ignored --nocapture"]
fn throughput_8192_squared_bf16() {
    use rayon::prelude::*;
    use std::time::Instant;
    let (rows, cols) = (8192usize, 8192usize);
    // Normal-ish bf16 values of both signs: exponents 2^-7 .. 2^7, random mantissas.
    let x: Vec<u16> = (0..rows * cols)
        .map(|i| {
            let r = mix64(i as u64);
            (r as u16 & 0x807F) | 0x3C00 | ((r >> 20) as u16 & 0x0380)
        })
        .collect();
    let gb = (x.len() * 2) as f64 / 1e9;
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    // The floor on this machine: a parallel copy into a freshly allocated buffer (the page faults
    // of a new output are most of it).
    let copy = best(&mut || {
        let mut out = vec![0u16; x.len()];
        out.par_chunks_mut(1 << 16)
            .zip(x.par_chunks(1 << 16))
            .for_each(|(o, s)| o.copy_from_slice(s));
        assert_eq!(out.len(), x.len());
    });
    println!("fresh parallel copy: {:.2} GB/s", gb / copy);
    for (p, axis) in [
        (Pattern::TWO_FOUR, -1isize),
        (Pattern::new(4, 16).expect("4:16"), -1),
        (Pattern::TWO_FOUR, 0),
    ] {
        let pruned = prune(&x, Dtype::Bf16, &[rows, cols], axis, p).expect("valid");
        let c = compress(&pruned, &[rows, cols], axis, p).expect("conforms");
        let t_prune = best(&mut || {
            let y = prune(&x, Dtype::Bf16, &[rows, cols], axis, p).expect("valid");
            assert_eq!(y.len(), x.len());
        });
        let t_compress = best(&mut || {
            let y = compress(&pruned, &[rows, cols], axis, p).expect("conforms");
            assert_eq!(y.values().len(), x.len() / p.m() * p.n());
        });
        let t_decompress = best(&mut || assert_eq!(c.decompress().len(), x.len()));
        println!(
            "{p} axis {axis}: prune {:.2} GB/s ({:.2}x copy time), compress {:.2} GB/s, \
             prune+compress {:.2} GB/s, decompress {:.2} GB/s (dense input bytes / s)",
            gb / t_prune,
            t_prune / copy,
            gb / t_compress,
            gb / (t_prune + t_compress),
            gb / t_decompress
        );
    }
}
