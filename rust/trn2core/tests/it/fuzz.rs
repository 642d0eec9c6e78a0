//! Fuzzing of every parser and decoder that reads untrusted input (issue 8): the DMA stream
//! parser (`dma::inspect`, `dma::decompress`) on arbitrary and mutated bytes, the sparsity
//! parsers (`Compressed::from_parts`, `from_cutlass`), the number-format decoders, the name
//! parsers and the GEMM and cost-model entry points. Each property asserts only that the call
//! returns (`Ok` or an `Err` of the right kind, never a panic) and, where it succeeds, that the
//! result is consistent (round trips bit for bit, sizes bounded by the input).
//!
//! cargo-fuzz needs a nightly toolchain, so these are proptest properties. `make test` runs the
//! default case count (`PROPTEST_CASES`, 256 unless set); `make fuzz` runs them with
//! `PROPTEST_CASES=200000` (docs/limitations.md records a run).

use proptest::prelude::*;
use proptest::test_runner::Config;

use trn2core::dma::{self, Codec};
use trn2core::engine::cost::{estimate_gemm, GemmPlan};
use trn2core::engine::{self, PerfMode};
use trn2core::numerics::{self, CodesRef, Format, Random, Rounding, Source};
use trn2core::sparsity::{self, Compressed, CutlassMeta, Pattern};
use trn2core::Error;

/// The case count: `PROPTEST_CASES` if set (what `make fuzz` raises), else 256.
fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    Config {
        cases,
        // Shrinking a failure of a 200000-case run may take long; the seed is reported anyway.
        max_shrink_iters: 2048,
        ..Config::default()
    }
}

/// A valid stream of `elem_size`-byte elements (made from `bytes`) with codec `codec`.
fn stream_of(bytes: &[u8], elem_size: usize, codec: Codec) -> (Vec<u8>, Vec<u8>) {
    let raw = &bytes[..bytes.len() / elem_size * elem_size];
    let shape = [(raw.len() / elem_size) as u64];
    let s = dma::compress(raw, elem_size, codec, "fuzz", &shape).expect("valid input");
    (s, raw.to_vec())
}

/// Decoding `stream` either fails with `CorruptDataError` or gives exactly `original` (a
/// mutation that changed nothing that matters); it never panics and never claims more output
/// than the format can describe.
fn decode_checked(stream: &[u8], original: Option<&[u8]>) -> Result<(), TestCaseError> {
    let inspected = dma::inspect(stream);
    match dma::decompress(stream) {
        Ok(d) => {
            prop_assert!(inspected.is_ok(), "decompress accepted what inspect refused");
            // A 4-byte table entry can stand for at most one 64 KiB block.
            prop_assert!(d.bytes.len() as u64 <= (stream.len() as u64 / 4 + 1) * 65536);
            if let Some(o) = original {
                prop_assert_eq!(&d.bytes[..], o);
            }
        }
        Err(e) => {
            prop_assert!(matches!(e, Error::CorruptData { .. }), "{e} is not CorruptDataError")
        }
    }
    Ok(())
}

/// One mutation of a stream.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    /// Overwrite the 4 bytes at an offset with a little-endian u32 (table entries, varints).
    Word(usize, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
        (any::<usize>(), any::<u32>()).prop_map(|(i, w)| Mutation::Word(i, w)),
    ]
}

fn apply(s: &mut Vec<u8>, m: &Mutation) {
    let len = s.len().max(1);
    match m {
        Mutation::Flip(i, b) => {
            if let Some(x) = s.get_mut(i % len) {
                *x ^= b;
            }
        }
        Mutation::Set(i, b) => {
            if let Some(x) = s.get_mut(i % len) {
                *x = *b;
            }
        }
        Mutation::Truncate(i) => s.truncate(i % len),
        Mutation::Insert(i, v) => {
            let at = i % (s.len() + 1);
            s.splice(at..at, v.iter().copied());
        }
        Mutation::Remove(i, n) => {
            let at = i % len;
            let end = (at + n).min(s.len());
            if at < end {
                s.drain(at..end);
            }
        }
        Mutation::Word(i, w) => {
            let at = i % len;
            for (k, b) in w.to_le_bytes().iter().enumerate() {
                if let Some(x) = s.get_mut(at + k) {
                    *x = *b;
                }
            }
        }
    }
}

/// A crafted header: magic, version 1, codec, element size, a dtype, a shape and the block
/// size, then arbitrary bytes. Reaches the table and payload checks far more often than
/// random bytes do.
fn crafted(codec: u8, elem: u8, dims: &[u64], block: u64, tail: &[u8]) -> Vec<u8> {
    let mut s = b"T2CZ\x01".to_vec();
    s.extend_from_slice(&[codec, elem, 2, b'u', b'8', dims.len() as u8]);
    let varint = |s: &mut Vec<u8>, mut v: u64| {
        while v >= 0x80 {
            s.push(v as u8 | 0x80);
            v >>= 7;
        }
        s.push(v as u8);
    };
    let mut raw = elem as u64;
    for &d in dims {
        varint(&mut s, d);
        raw = raw.saturating_mul(d);
    }
    varint(&mut s, raw);
    varint(&mut s, block);
    s.extend_from_slice(tail);
    s
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn stream_parser_survives_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_checked(&bytes, None)?;
        // With the magic in front, the parser gets past the first check.
        let mut s = b"T2CZ\x01".to_vec();
        s.extend_from_slice(&bytes);
        decode_checked(&s, None)?;
    }

    #[test]
    fn stream_parser_survives_crafted_headers(
        codec in 0u8..4,
        elem in prop_oneof![Just(1u8), Just(2), Just(4), Just(8), any::<u8>()],
        dims in proptest::collection::vec(prop_oneof![0u64..70, any::<u64>()], 0..4),
        block in prop_oneof![Just(0u64), Just(512), Just(4096), any::<u64>()],
        tail in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        decode_checked(&crafted(codec, elem, &dims, block, &tail), None)?;
    }

    #[test]
    fn stream_parser_survives_mutated_streams(
        data in proptest::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..5000),
        elem_idx in 0usize..4,
        codec_idx in 0usize..3,
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let elem = [1usize, 2, 4, 8][elem_idx];
        let (mut s, raw) = stream_of(&data, elem, Codec::ALL[codec_idx]);
        let pristine = s.clone();
        for m in &mutations {
            apply(&mut s, m);
        }
        if s == pristine {
            // The mutations cancelled out: it must still decode to the original.
            let d = dma::decompress(&s).expect("unchanged stream");
            prop_assert_eq!(d.bytes, raw);
        } else {
            // The CRC-32C catches every change up to 32 bits and almost every other one.
            decode_checked(&s, Some(&raw))?;
        }
    }

    #[test]
    fn sparse_parts_parser_survives_anything(
        values in proptest::collection::vec(any::<u16>(), 0..300),
        indices in proptest::collection::vec(any::<u8>(), 0..300),
        shape in proptest::collection::vec(0usize..40, 0..4),
        axis in -5isize..5,
        pattern in 0usize..7,
    ) {
        let p = Pattern::ALL[pattern];
        match Compressed::<u16>::from_parts(values, indices, &shape, axis, p) {
            Ok(c) => {
                // Valid parts: decompressing and compressing again gives them back.
                let dense = c.decompress();
                let again = sparsity::compress(&dense, &shape, axis, p).expect("conforms");
                prop_assert_eq!(again.values(), c.values());
                prop_assert_eq!(again.packed_indices(), c.packed_indices());
            }
            Err(e) => prop_assert!(
                matches!(e, Error::Shape { .. } | Error::Sparsity { .. }),
                "{e}"
            ),
        }
    }

    #[test]
    fn sparse_parts_parser_survives_mutated_parts(
        seed in any::<u64>(),
        outer in 1usize..6,
        groups in 1usize..6,
        axis_last in any::<bool>(),
        pattern in 0usize..7,
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..4),
    ) {
        // Valid parts of a pruned array, then a few index bytes altered.
        let p = Pattern::ALL[pattern];
        let len = groups * p.m();
        let shape = if axis_last { vec![outer, len] } else { vec![len, outer] };
        let x: Vec<u16> = (0..outer * len).map(|i| numerics::mix64(seed ^ i as u64) as u16).collect();
        let axis = if axis_last { 1 } else { 0 };
        let pruned = sparsity::prune(&x, sparsity::Dtype::U16, &shape, axis, p).expect("valid");
        let c = sparsity::compress(&pruned, &shape, axis, p).expect("conforms");
        let mut idx = c.packed_indices().to_vec();
        for (at, b) in &flips {
            let n = idx.len();
            if n > 0 {
                idx[at % n] ^= b;
            }
        }
        match Compressed::<u16>::from_parts(c.values().to_vec(), idx, &shape, axis, p) {
            Ok(c2) => {
                let dense = c2.decompress();
                let again = sparsity::compress(&dense, &shape, axis, p).expect("conforms");
                prop_assert_eq!(again.values(), c2.values());
            }
            Err(e) => prop_assert!(matches!(e, Error::Sparsity { .. }), "{e}"),
        }
    }

    #[test]
    fn cutlass_parser_survives_mutated_meta(
        seed in any::<u64>(),
        row_tiles in 1usize..3,
        col_tiles in 1usize..3,
        words in proptest::collection::vec((any::<usize>(), any::<i16>()), 1..4),
    ) {
        let (rows, cols) = (64 * row_tiles, 32 * col_tiles);
        let x: Vec<u16> = (0..rows * cols).map(|i| numerics::mix64(seed ^ i as u64) as u16).collect();
        let shape = [rows, cols];
        let pruned = sparsity::prune(&x, sparsity::Dtype::U16, &shape, 1, Pattern::TWO_FOUR)
            .expect("valid");
        let c = sparsity::to_cutlass::<u16>(&pruned, rows, cols).expect("2:4");
        let CutlassMeta::I16(mut meta) = c.meta else { panic!("16-bit elements take int16") };
        for &(at, w) in &words {
            let n = meta.len();
            meta[at % n] = w;
        }
        let meta = CutlassMeta::I16(meta);
        match sparsity::from_cutlass::<u16>(&c.values, &meta, rows, cols) {
            Ok(dense) => {
                let back = sparsity::to_cutlass::<u16>(&dense, rows, cols).expect("2:4");
                prop_assert_eq!(&back.values, &c.values);
            }
            Err(e) => prop_assert!(matches!(e, Error::Value { .. }), "{e}"),
        }
    }

    #[test]
    fn cutlass_parser_survives_anything(
        rows in prop_oneof![Just(0usize), Just(32), Just(64), 0usize..130],
        cols in prop_oneof![Just(0usize), Just(16), Just(32), 0usize..70],
        meta_words in proptest::collection::vec(any::<i16>(), 0..200),
        wide in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let values: Vec<u16> = (0..rows * cols / 2)
            .map(|i| numerics::mix64(seed ^ i as u64) as u16)
            .collect();
        let meta = if wide {
            CutlassMeta::I32(meta_words.iter().map(|&w| w as i32).collect())
        } else {
            CutlassMeta::I16(meta_words.clone())
        };
        match sparsity::from_cutlass::<u16>(&values, &meta, rows, cols) {
            Ok(dense) => {
                prop_assert_eq!(dense.len(), rows * cols);
                // What was decoded encodes back to the same values and meta.
                let c = sparsity::to_cutlass::<u16>(&dense, rows, cols).expect("2:4 matrix");
                prop_assert_eq!(&c.values, &values);
                prop_assert_eq!(c.meta, meta);
            }
            Err(e) => prop_assert!(
                matches!(e, Error::Shape { .. } | Error::Format { .. } | Error::Value { .. }),
                "{e}"
            ),
        }
    }

    #[test]
    fn every_code_decodes_and_reencodes(
        codes in proptest::collection::vec(any::<u32>(), 0..200),
        f in 0usize..8,
        bias in prop_oneof![Just(None), (-300i64..300).prop_map(Some)],
    ) {
        let format = Format::ALL[f];
        let enc = match format.encoding_with_bias(bias) {
            Ok(e) => e,
            Err(e) => {
                prop_assert!(matches!(e, Error::Format { .. } | Error::Value { .. }), "{e}");
                return Ok(());
            }
        };
        let bits = format.code_bits();
        let mask = if bits == 32 { u32::MAX } else { (1u32 << bits) - 1 };
        let codes: Vec<u32> = codes.iter().map(|&c| c & mask).collect();
        let values = match bits {
            8 => numerics::decode(CodesRef::U8(&codes.iter().map(|&c| c as u8).collect::<Vec<_>>()), &enc),
            16 => numerics::decode(CodesRef::U16(&codes.iter().map(|&c| c as u16).collect::<Vec<_>>()), &enc),
            _ => numerics::decode(CodesRef::U32(&codes), &enc),
        };
        prop_assert_eq!(values.len(), codes.len());
        // Every non-NaN value is exact in the format: encoding it gives its code back (tf32
        // drops the container's low 13 bits, as the hardware does).
        let back = numerics::encode(&Source::F32(&values), &enc, Rounding::NearestEven, false, &Random::None)
            .expect("valid arguments");
        let back: Vec<u32> = match back {
            numerics::Codes::U8(v) => v.into_iter().map(u32::from).collect(),
            numerics::Codes::U16(v) => v.into_iter().map(u32::from).collect(),
            numerics::Codes::U32(v) => v,
        };
        for ((&c, &v), &b) in codes.iter().zip(&values).zip(&back) {
            if v.is_nan() {
                prop_assert!(b & (mask >> 1) > enc.max_code, "NaN stays NaN");
                continue;
            }
            let want = if format == Format::Tf32 { c & 0xFFFF_E000 } else { c };
            prop_assert_eq!(b, want, "code {:#x} value {:e}", c, v);
        }
    }

    #[test]
    fn name_parsers_survive_any_string(s in ".{0,12}") {
        for r in [
            Format::parse("fmt", &s).map(|_| ()),
            Rounding::parse("rounding", &s).map(|_| ()),
            Codec::parse("codec", &s).map(|_| ()),
            PerfMode::parse("perf_mode", &s).map(|_| ()),
            Pattern::parse(&s).map(|_| ()),
        ] {
            if let Err(e) = r {
                prop_assert!(e.to_string().contains(&format!("{s:?}")) || e.to_string().contains(&s), "{e}");
            }
        }
    }

    #[test]
    fn gemm_entry_points_check_lengths(
        m in 0usize..20, k in 0usize..300, n in 0usize..20,
        da in -2isize..3, db in -2isize..3,
        double_row in any::<bool>(),
    ) {
        let la = ((m * k) as isize + da).max(0) as usize;
        let lb = ((k * n) as isize + db).max(0) as usize;
        let a: Vec<f32> = (0..la).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..lb).map(|i| (i % 5) as f32 * 0.5).collect();
        let mode = if double_row { PerfMode::DoubleRow } else { PerfMode::None };
        let valid = la == m * k && lb == k * n;
        match engine::gemm_f32(&a, &b, m, k, n, mode) {
            Ok(out) => {
                prop_assert!(valid);
                prop_assert_eq!(out.len(), m * n);
            }
            Err(e) => prop_assert!(matches!(e, Error::Shape { .. }) && !valid, "{e}"),
        }
        // The sparse-operand entry point: same checks, and the dense kernel's bits.
        let mut out = vec![0f32; m * n];
        match engine::gemm_skip_zeros_into(&a, &b, m, k, n, &mut out) {
            Ok(_) => {
                prop_assert!(valid);
                let dense = engine::gemm_f32(&a, &b, m, k, n, PerfMode::None);
                prop_assert!(dense.is_ok_and(|d| d.iter().zip(&out).all(|(x, y)| x.to_bits() == y.to_bits())));
            }
            Err(e) => prop_assert!(matches!(e, Error::Shape { .. }) && !valid, "{e}"),
        }
    }

    #[test]
    fn cost_model_survives_any_dims(
        m in prop_oneof![1u64..5000, Just(0), Just(1 << 40), Just(u64::MAX)],
        k in prop_oneof![1u64..5000, Just(0), Just(1 << 40), Just(u64::MAX)],
        n in prop_oneof![1u64..5000, Just(0), Just(1 << 40), Just(u64::MAX)],
        dtype in prop_oneof![Just("bf16"), Just("fp32"), Just("fp8_e4m3"), Just("nope")],
        double_row in any::<bool>(),
        pattern in proptest::option::of(0usize..7),
    ) {
        let mode = if double_row { PerfMode::DoubleRow } else { PerfMode::None };
        let plan = Format::parse("dtype", dtype)
            .and_then(|f| GemmPlan::new(m, k, n, f, mode))
            .and_then(|p| match pattern {
                Some(i) => p.with_sparsity(Pattern::ALL[i]),
                None => Ok(p),
            });
        let Ok(plan) = plan else { return Ok(()) };
        match estimate_gemm(&plan) {
            Ok(r) => {
                prop_assert!(r.seconds > 0.0 && r.seconds.is_finite());
                prop_assert!(r.utilization > 0.0 && r.utilization <= 1.0 + 1e-9, "{}", r.utilization);
            }
            Err(e) => prop_assert!(matches!(e, Error::Capacity { .. }), "{e}"),
        }
    }
}

/// A 90-byte stream that declares a 1 TiB array of all-zero blocks is refused before anything is
/// allocated: its table cannot fit.
#[test]
fn forged_sizes_are_refused_before_allocating() {
    let s = crafted(1, 8, &[1 << 37], 512, &[0u8; 64]);
    let err = dma::decompress(&s).expect_err("forged");
    assert!(matches!(err, Error::CorruptData { .. }), "{err}");
    // A real all-zero stream of 64 MiB (16384x smaller) would pass the table check; then the
    // host check refuses what does not fit. Beyond 2**40 bytes the header is refused outright.
    let s = crafted(1, 8, &[1 << 38], 512, &[0u8; 64]);
    let err = dma::decompress(&s).expect_err("forged");
    assert!(err.to_string().contains("exceeds"), "{err}");
}
