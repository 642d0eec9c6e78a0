//! `GemmCall`, one `trn2core.gemm` call whole: operands of any dtype and layout (or N:M
//! compressed) rounded while the kernel packs them give, bit for bit, the old multi-step path:
//! each operand encoded whole (`encode_into`, `a` with seed s, `b` with seed s + 1), decoded,
//! multiplied by `gemm_f32`, the result encoded with seed s. The report is the cost model's.

use super::engine::{assert_bits_eq, Rng};
use trn2core::engine::cost::{estimate_gemm, estimate_gemm_cores, GemmPlan};
use trn2core::engine::{
    gemm_f32, Buffer, GemmCall, GemmOptions, GemmOut, Matrix, PerfMode, Sparse, Strided,
};
use trn2core::numerics::{decode, encode, encode_into, Codes, CodesMut, CodesRef, Random, Source};
use trn2core::sparsity::{compress, prune, Dtype, Pattern};
use trn2core::{Error, Format, Rounding};

/// A matrix's elements as codes of their width, row-major (the logical content).
#[derive(Clone)]
struct Codes64 {
    dtype: Dtype,
    shape: [usize; 2],
    codes: Vec<u64>,
}

/// Boundary-heavy float64 values: normals, ties and near-ties of bf16/fp16/fp8, subnormals of
/// several formats, signed zeros; with `specials`, a few Inf, NaN and out-of-range values too.
fn values(seed: u64, len: usize, specials: bool) -> Vec<f64> {
    let mut rng = Rng(seed);
    (0..len)
        .map(|_| {
            let w = rng.next();
            let sign = if w & 1 == 1 { -1.0 } else { 1.0 };
            let e = ((w >> 8) % 11) as i32 - 8;
            let mant = ((w >> 20) % 1024) as f64;
            let mid = (1.0 + (2.0 * mant + 1.0) / 2048.0) * 2f64.powi(e);
            match (w >> 40) % 16 {
                0 => sign * mid,
                1 => sign * f64::from_bits(mid.to_bits() + 1),
                2 => sign * (1.0 + (2.0 * (mant % 8.0) + 1.0) / 16.0) * 2f64.powi(e),
                3 => sign * mid * 2f64.powi(-130),
                4 => sign * mid * 2f64.powi(-16),
                5 => sign * 0.0,
                6 if specials => {
                    [f64::INFINITY, f64::NAN, 448.0, 65520.0, 3.5e38][(w >> 50) as usize % 5] * sign
                }
                _ => sign * mid * (((w >> 48) % 1000) as f64 / 300.0),
            }
        })
        .collect()
}

/// `x` stored as `dtype` codes (floats rounded to nearest-even, integers scaled and clamped).
fn stored(dtype: Dtype, x: &[f64], shape: [usize; 2]) -> Codes64 {
    let format = |f: Format| match encode(
        &Source::F64(x),
        &f.encoding(),
        Rounding::NearestEven,
        false,
        &Random::None,
    )
    .expect("valid")
    {
        Codes::U8(v) => v.into_iter().map(u64::from).collect(),
        Codes::U16(v) => v.into_iter().map(u64::from).collect(),
        Codes::U32(v) => v.into_iter().map(u64::from).collect(),
    };
    let int = |lo: f64, hi: f64, bits: u32| -> Vec<u64> {
        let mask = if bits == 64 { u64::MAX } else { (1 << bits) - 1 };
        x.iter()
            .enumerate()
            .map(|(i, &v)| {
                // Large magnitudes (beyond 2^53 for 64 bits) reach float64's rounding.
                let big = if bits == 64 && i % 3 == 0 { 2f64.powi(55) + i as f64 } else { 1.0 };
                let v = if v.is_finite() { (v * 50.0 * big).round().clamp(lo, hi) } else { 0.0 };
                (if lo < 0.0 { v as i64 as u64 } else { v as u64 }) & mask
            })
            .collect()
    };
    let codes = match dtype {
        Dtype::F64 => x.iter().map(|v| v.to_bits()).collect(),
        Dtype::F32 => x.iter().map(|&v| (v as f32).to_bits() as u64).collect(),
        Dtype::F16 => format(Format::Fp16),
        Dtype::Bf16 => format(Format::Bf16),
        Dtype::Fp8E4m3 => format(Format::Fp8E4m3),
        Dtype::Fp8E5m2 => format(Format::Fp8E5m2),
        Dtype::Fp8E3m4 => format(Format::Fp8E3m4),
        Dtype::Fp8E4m3fn => format(Format::Fp8E4m3fn),
        Dtype::I8 => int(-128.0, 127.0, 8),
        Dtype::I16 => int(-32768.0, 32767.0, 16),
        Dtype::I32 => int(-2e9, 2e9, 32),
        Dtype::I64 => int(-9e18, 9e18, 64),
        Dtype::U8 => int(0.0, 255.0, 8),
        Dtype::U16 => int(0.0, 65535.0, 16),
        Dtype::U32 => int(0.0, 4e9, 32),
        Dtype::U64 | Dtype::Bool => int(0.0, 1.8e19, 64),
    };
    Codes64 { dtype, shape, codes }
}

/// The old path's values of an operand: encoded whole into its format, decoded.
fn quantized(x: &Codes64, target: Option<Format>, rounding: Rounding, seed: u64) -> Vec<f32> {
    let own = match x.dtype {
        Dtype::F32 => Some(Format::Fp32),
        Dtype::F16 => Some(Format::Fp16),
        Dtype::Bf16 => Some(Format::Bf16),
        Dtype::Fp8E4m3 => Some(Format::Fp8E4m3),
        Dtype::Fp8E5m2 => Some(Format::Fp8E5m2),
        Dtype::Fp8E3m4 => Some(Format::Fp8E3m4),
        Dtype::Fp8E4m3fn => Some(Format::Fp8E4m3fn),
        _ => None,
    };
    let (format, rounding) = match (target, own) {
        (Some(f), _) => (f, rounding),
        (None, Some(f)) => (f, Rounding::NearestEven),
        (None, None) => (Format::Fp32, Rounding::NearestEven),
    };
    let c = &x.codes;
    let f64s: Vec<f64>;
    let (u8s, u16s, f32s): (Vec<u8>, Vec<u16>, Vec<f32>);
    let src = match (x.dtype, own) {
        (Dtype::F64, _) => {
            f64s = c.iter().map(|&b| f64::from_bits(b)).collect();
            Source::F64(&f64s)
        }
        (Dtype::F32, _) => {
            f32s = c.iter().map(|&b| f32::from_bits(b as u32)).collect();
            Source::F32(&f32s)
        }
        (Dtype::F16, _) => {
            u16s = c.iter().map(|&b| b as u16).collect();
            Source::F16(&u16s)
        }
        (Dtype::Bf16, _) => {
            u16s = c.iter().map(|&b| b as u16).collect();
            Source::Bf16(&u16s)
        }
        (_, Some(fp8)) => {
            u8s = c.iter().map(|&b| b as u8).collect();
            Source::Fp8(&u8s, fp8)
        }
        (d, None) => {
            f64s = c.iter().map(|&b| int_value(d, b)).collect();
            Source::F64(&f64s)
        }
    };
    let random = match rounding {
        Rounding::Stochastic => Random::Seed(seed, 32),
        _ => Random::None,
    };
    let enc = format.encoding();
    match encode(&src, &enc, rounding, false, &random).expect("valid") {
        Codes::U8(v) => decode(CodesRef::U8(&v), &enc),
        Codes::U16(v) => decode(CodesRef::U16(&v), &enc),
        Codes::U32(v) => decode(CodesRef::U32(&v), &enc),
    }
}

/// numpy's `astype(float64)` of an integer code.
fn int_value(dtype: Dtype, b: u64) -> f64 {
    match dtype {
        Dtype::I8 => b as u8 as i8 as f64,
        Dtype::I16 => b as u16 as i16 as f64,
        Dtype::I32 => b as u32 as i32 as f64,
        Dtype::I64 => b as i64 as f64,
        _ => b as f64,
    }
}

/// A buffer of codes of one width.
enum Owned {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl Owned {
    fn new(bits: u32, codes: Vec<u64>) -> Owned {
        match bits {
            8 => Owned::U8(codes.into_iter().map(|c| c as u8).collect()),
            16 => Owned::U16(codes.into_iter().map(|c| c as u16).collect()),
            32 => Owned::U32(codes.into_iter().map(|c| c as u32).collect()),
            _ => Owned::U64(codes),
        }
    }
    fn buffer(&self) -> Buffer<'_> {
        match self {
            Owned::U8(v) => Buffer::U8(v),
            Owned::U16(v) => Buffer::U16(v),
            Owned::U32(v) => Buffer::U32(v),
            Owned::U64(v) => Buffer::U64(v),
        }
    }
}

/// The layouts a numpy array can have.
#[derive(Debug, Clone, Copy)]
enum Layout {
    RowMajor,
    ColumnMajor,
    Reversed,
    Padded,
    Swapped,
}

const LAYOUTS: [Layout; 5] =
    [Layout::RowMajor, Layout::ColumnMajor, Layout::Reversed, Layout::Padded, Layout::Swapped];

/// `x` stored in `layout`: the buffer and the strided description of it.
struct Stored {
    owned: Owned,
    dtype: Dtype,
    shape: [usize; 2],
    origin: usize,
    strides: [isize; 2],
    swapped: bool,
}

impl Stored {
    fn new(x: &Codes64, layout: Layout) -> Stored {
        let [r, c] = x.shape;
        let bits = x.dtype.bits();
        let at = |i: usize, j: usize| x.codes[i * c + j];
        let (codes, origin, strides, swapped) = match layout {
            Layout::RowMajor => (x.codes.clone(), 0, [c as isize, 1], false),
            Layout::ColumnMajor => {
                let v = (0..c).flat_map(|j| (0..r).map(move |i| at(i, j))).collect();
                (v, 0, [1, r as isize], false)
            }
            Layout::Reversed => {
                let v: Vec<u64> = x.codes.iter().rev().copied().collect();
                (v, r * c - 1, [-(c as isize), -1], false)
            }
            Layout::Padded => {
                let mut v = vec![0x5A5A_5A5A_5A5A_5A5A; 2 * r * 3 * c];
                for i in 0..r {
                    for j in 0..c {
                        v[2 * i * 3 * c + 3 * j + 1] = at(i, j);
                    }
                }
                (v, 1, [6 * c as isize, 3], false)
            }
            Layout::Swapped => {
                let v = x
                    .codes
                    .iter()
                    .map(|&b| match bits {
                        8 => b,
                        16 => (b as u16).swap_bytes() as u64,
                        32 => (b as u32).swap_bytes() as u64,
                        _ => b.swap_bytes(),
                    })
                    .collect();
                (v, 0, [c as isize, 1], true)
            }
        };
        Stored {
            owned: Owned::new(bits, codes),
            dtype: x.dtype,
            shape: x.shape,
            origin,
            strides,
            swapped,
        }
    }

    fn matrix(&self, arg: &str) -> Matrix<'_> {
        let m = Strided::new(
            arg,
            self.owned.buffer(),
            self.dtype,
            self.swapped,
            self.shape,
            self.origin,
            self.strides,
        )
        .expect("valid layout");
        Matrix::Dense(m)
    }
}

fn options(
    dtype: Option<Format>, rounding: Rounding, seed: u64, perf_mode: PerfMode,
) -> GemmOptions {
    GemmOptions {
        dtype,
        rounding,
        seeds: [seed, seed.wrapping_add(1)],
        perf_mode,
        out_format: Format::Fp32,
        throttle: true,
        cores: None,
    }
}

/// The old path's result and the call's, as bits.
fn both(
    a: &Codes64, b: &Codes64, (la, lb): (Layout, Layout), opts: &GemmOptions,
) -> Result<(Vec<u32>, Vec<u32>), Error> {
    let ([m, k], n) = (a.shape, b.shape[1]);
    let (sa, sb) = (Stored::new(a, la), Stored::new(b, lb));
    let call = GemmCall::new(sa.matrix("a"), sb.matrix("b"), opts.clone())?;
    let got = run(&call, m * n);
    let qa = quantized(a, opts.dtype, opts.rounding, opts.seeds[0]);
    let qb = quantized(b, opts.dtype, opts.rounding, opts.seeds[1]);
    let want = gemm_f32(&qa, &qb, m, k, n, opts.perf_mode)?;
    Ok((got, out_codes(&want, opts)))
}

/// The call's result as bits (float32 or the codes of the output format).
fn run(call: &GemmCall, len: usize) -> Vec<u32> {
    match call.out_format() {
        Format::Fp32 => {
            let mut out = vec![f32::from_bits(0x7F80_0001); len];
            call.run(GemmOut::Fp32(&mut out)).expect("runs");
            out.iter().map(|x| x.to_bits()).collect()
        }
        f => match f.code_bits() {
            8 => {
                let mut out = vec![0xA5u8; len];
                call.run(GemmOut::Codes(CodesMut::U8(&mut out))).expect("runs");
                out.into_iter().map(u32::from).collect()
            }
            16 => {
                let mut out = vec![0xA5A5u16; len];
                call.run(GemmOut::Codes(CodesMut::U16(&mut out))).expect("runs");
                out.into_iter().map(u32::from).collect()
            }
            _ => {
                let mut out = vec![0xA5A5_A5A5u32; len];
                call.run(GemmOut::Codes(CodesMut::U32(&mut out))).expect("runs");
                out
            }
        },
    }
}

/// The old path's output step: the fp32 result encoded into the output format.
fn out_codes(values: &[f32], opts: &GemmOptions) -> Vec<u32> {
    if opts.out_format == Format::Fp32 {
        return values.iter().map(|x| x.to_bits()).collect();
    }
    let random = match opts.rounding {
        Rounding::Stochastic => Random::Seed(opts.seeds[0], 32),
        _ => Random::None,
    };
    let enc = opts.out_format.encoding();
    let n = values.len();
    let src = Source::F32(values);
    let into = |o: CodesMut| {
        encode_into(&src, &enc, opts.rounding, false, &random, o).expect("ok");
    };
    match opts.out_format.code_bits() {
        8 => {
            let mut o = vec![0u8; n];
            into(CodesMut::U8(&mut o));
            o.into_iter().map(u32::from).collect()
        }
        16 => {
            let mut o = vec![0u16; n];
            into(CodesMut::U16(&mut o));
            o.into_iter().map(u32::from).collect()
        }
        _ => {
            let mut o = vec![0u32; n];
            into(CodesMut::U32(&mut o));
            o
        }
    }
}

fn bits_eq(got: &[u32], want: &[u32], what: &str) {
    let f = |v: &[u32]| v.iter().map(|&b| f32::from_bits(b)).collect::<Vec<f32>>();
    assert_bits_eq(&f(got), &f(want), what);
}

/// Every numeric dtype (bool is no number: refused).
fn dtypes() -> impl Iterator<Item = Dtype> {
    Dtype::ALL.into_iter().filter(|&d| d != Dtype::Bool)
}

#[test]
fn every_dtype_format_rounding_and_layout_gives_the_old_paths_bits() {
    let (m, k, n) = (5, 140, 9);
    let mut cases = 0;
    for (d, dtype) in dtypes().enumerate() {
        let a = stored(dtype, &values(d as u64, m * k, true), [m, k]);
        // b has no specials in most columns, so most outputs stay finite and informative.
        let b = stored(dtype, &values(100 + d as u64, k * n, false), [k, n]);
        for target in std::iter::once(None).chain(Format::ALL.iter().copied().map(Some)) {
            for (r, rounding) in Rounding::ALL.into_iter().enumerate() {
                for seed in [0, 7, u64::MAX] {
                    let opts = options(target, rounding, seed, PerfMode::None);
                    let layouts =
                        (LAYOUTS[(d + r) % 5], LAYOUTS[(d + r + (seed % 5) as usize) % 5]);
                    let what =
                        format!("{dtype:?} -> {target:?} {rounding:?} seed {seed} {layouts:?}");
                    match both(&a, &b, layouts, &opts) {
                        Ok((got, want)) => bits_eq(&got, &want, &what),
                        Err(e) => {
                            // Only the formats the engine refuses: fp8_e4m3fn, as stored or asked for.
                            let refused = target == Some(Format::Fp8E4m3fn)
                                || (target.is_none() && dtype == Dtype::Fp8E4m3fn);
                            assert!(refused, "{what}: {e}");
                            assert!(e.to_string().starts_with("a: fp8_e4m3fn"), "{what}: {e}");
                        }
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 16 * 9 * 6 * 3);
}

#[test]
fn every_layout_reads_the_same_matrix() {
    let (m, k, n) = (7, 300, 70);
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F64, Dtype::I16, Dtype::Fp8E5m2, Dtype::U64] {
        let a = stored(dtype, &values(1, m * k, false), [m, k]);
        let b = stored(dtype, &values(2, k * n, false), [k, n]);
        for la in LAYOUTS {
            for lb in LAYOUTS {
                for target in [None, Some(Format::Bf16), Some(Format::Fp8E4m3)] {
                    let opts = options(target, Rounding::Stochastic, 3, PerfMode::None);
                    let (got, want) = both(&a, &b, (la, lb), &opts).expect("valid");
                    bits_eq(&got, &want, &format!("{dtype:?} {la:?} {lb:?} {target:?}"));
                }
            }
        }
    }
}

#[test]
fn perf_modes_and_output_formats_give_the_old_paths_bits() {
    // Shapes with tails in every blocking: K tiles of 256 in double_row, panels of 6 and 64.
    for (s, (m, k, n)) in [(13, 600, 70), (1, 257, 1), (130, 300, 129)].into_iter().enumerate() {
        let a = stored(Dtype::F32, &values(10 + s as u64, m * k, true), [m, k]);
        let b = stored(Dtype::F64, &values(20 + s as u64, k * n, false), [k, n]);
        for target in [Format::Fp8E4m3, Format::Fp8E5m2] {
            for perf_mode in PerfMode::ALL {
                for out_format in Format::ALL {
                    for rounding in
                        [Rounding::NearestEven, Rounding::Stochastic, Rounding::TowardNegative]
                    {
                        let mut opts = options(Some(target), rounding, 99, perf_mode);
                        opts.out_format = out_format;
                        let what = format!(
                            "{m}x{k}x{n} {target:?} {perf_mode:?} -> {out_format:?} {rounding:?}"
                        );
                        let (got, want) =
                            both(&a, &b, (Layout::RowMajor, Layout::ColumnMajor), &opts)
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                        bits_eq(&got, &want, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn a_compressed_operand_gives_the_dense_paths_bits() {
    let (m, n) = (37, 45);
    for pattern in Pattern::ALL {
        let k = pattern.m() * 24;
        for (d, dtype) in
            [Dtype::Bf16, Dtype::F32, Dtype::Fp8E4m3, Dtype::I8, Dtype::F64].into_iter().enumerate()
        {
            let dense = stored(dtype, &values(30 + d as u64, m * k, false), [m, k]);
            let pruned = {
                let owned = Owned::new(dtype.bits(), dense.codes.clone());
                let codes: Vec<u64> = match &owned {
                    Owned::U8(v) => prune(v, dtype, &[m, k], 1, pattern)
                        .expect("ok")
                        .into_iter()
                        .map(u64::from)
                        .collect(),
                    Owned::U16(v) => prune(v, dtype, &[m, k], 1, pattern)
                        .expect("ok")
                        .into_iter()
                        .map(u64::from)
                        .collect(),
                    Owned::U32(v) => prune(v, dtype, &[m, k], 1, pattern)
                        .expect("ok")
                        .into_iter()
                        .map(u64::from)
                        .collect(),
                    Owned::U64(v) => prune(v, dtype, &[m, k], 1, pattern).expect("ok"),
                };
                Codes64 { codes, ..dense.clone() }
            };
            // Without a target, `b` must pair with `a`'s format (fp32 only with fp32).
            let bd = match dtype {
                Dtype::Bf16 | Dtype::Fp8E4m3 => Dtype::Bf16,
                _ => Dtype::F32,
            };
            let b = stored(bd, &values(40 + d as u64, k * n, d == 0), [k, n]);
            for target in [None, Some(Format::Bf16), Some(Format::Fp8E5m2)] {
                for rounding in [Rounding::NearestEven, Rounding::Stochastic] {
                    let opts = options(target, rounding, 5, PerfMode::None);
                    let what = format!("{pattern} {dtype:?} {target:?} {rounding:?}");
                    let (_, want) = both(&pruned, &b, (Layout::RowMajor, Layout::RowMajor), &opts)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let sb = Stored::new(&b, Layout::RowMajor);
                    let shape = [m, k];
                    let got = match Owned::new(dtype.bits(), pruned.codes.clone()) {
                        Owned::U8(v) => sparse_run(&v, dtype, pattern, shape, &sb, &opts),
                        Owned::U16(v) => sparse_run(&v, dtype, pattern, shape, &sb, &opts),
                        Owned::U32(v) => sparse_run(&v, dtype, pattern, shape, &sb, &opts),
                        Owned::U64(v) => sparse_run(&v, dtype, pattern, shape, &sb, &opts),
                    };
                    bits_eq(&got, &want, &what);
                }
            }
        }
    }
}

/// The call's bits for `a` (row-major codes of `shape`) compressed with `pattern`.
fn sparse_run<T>(
    dense: &[T], dtype: Dtype, pattern: Pattern, shape: [usize; 2], b: &Stored, opts: &GemmOptions,
) -> Vec<u32>
where
    T: trn2core::sparsity::Element,
    for<'a> Buffer<'a>: From<&'a [T]>,
{
    let c = compress(dense, &shape, 1, pattern).expect("conforms");
    let a = Sparse::new("a", c.values().into(), c.packed_indices(), dtype, pattern, shape)
        .expect("valid");
    let call = GemmCall::new(Matrix::Sparse(a), b.matrix("b"), opts.clone()).expect("valid");
    run(&call, shape[0] * b.shape[1])
}

#[test]
fn the_report_is_the_cost_models() {
    let a = stored(Dtype::Bf16, &values(1, 300 * 400, false), [300, 400]);
    let b = stored(Dtype::Fp8E4m3, &values(2, 400 * 700, false), [400, 700]);
    let (sa, sb) = (Stored::new(&a, Layout::RowMajor), Stored::new(&b, Layout::RowMajor));
    for cores in [None, Some(vec![2, 3]), Some((0..8).collect())] {
        let mut opts = options(None, Rounding::NearestEven, 0, PerfMode::None);
        opts.cores = cores.clone();
        let call = GemmCall::new(sa.matrix("a"), sb.matrix("b"), opts).expect("valid");
        let mut out = vec![0f32; 300 * 700];
        let report = call.run(GemmOut::Fp32(&mut out)).expect("runs");
        // bf16 x fp8: costed as bf16 (fp8 speeds nothing up unless both are).
        assert_eq!(call.cost_format(), Format::Bf16);
        let plan = GemmPlan::new(300, 400, 700, Format::Bf16, PerfMode::None).expect("valid");
        let want = match &cores {
            None => estimate_gemm(&plan),
            Some(c) => estimate_gemm_cores(&plan, c),
        }
        .expect("valid");
        assert_eq!(report.seconds, want.seconds, "{cores:?}");
        assert_eq!(report.instructions, want.instructions, "{cores:?}");
    }
}

#[test]
fn bad_calls_are_errors_naming_the_argument() {
    let f = |shape: [usize; 2]| stored(Dtype::F32, &values(1, shape[0] * shape[1], false), shape);
    let opts = options(None, Rounding::NearestEven, 0, PerfMode::None);
    let call = |a: &Codes64, b: &Codes64, opts: &GemmOptions| {
        let (sa, sb) = (Stored::new(a, Layout::RowMajor), Stored::new(b, Layout::RowMajor));
        GemmCall::new(sa.matrix("a"), sb.matrix("b"), opts.clone()).map(|_| ())
    };
    let err = call(&f([3, 4]), &f([5, 2]), &opts).expect_err("K mismatch");
    assert!(
        matches!(err, Error::Shape { .. })
            && err.to_string().starts_with("b: a is (3, 4) and b is (5, 2)"),
        "{err}"
    );
    let err = call(&f([0, 4]), &f([4, 2]), &opts).expect_err("empty");
    assert!(err.to_string().starts_with("a, b: empty matrices (M=0, K=4, N=2)"), "{err}");
    let bools = Codes64 { dtype: Dtype::Bool, ..f([3, 4]) };
    let err =
        call(&f([3, 4]), &Codes64 { shape: [4, 3], ..bools.clone() }, &opts).expect_err("bool");
    assert!(
        matches!(err, Error::Format { .. }) && err.to_string().starts_with("b: dtype bool"),
        "{err}"
    );
    let bf16 = stored(Dtype::Bf16, &values(3, 8, false), [4, 2]);
    let err = call(&f([3, 4]), &bf16, &opts).expect_err("fp32 with bf16");
    assert_eq!(
        err.to_string(),
        "b: bf16 cannot pair with fp32: fp32 and tf32 pair only with fp32 or tf32"
    );
    let dr = options(Some(Format::Bf16), Rounding::NearestEven, 0, PerfMode::DoubleRow);
    let err = call(&f([3, 4]), &f([4, 2]), &dr).expect_err("double_row bf16");
    assert!(err.to_string().starts_with("a: perf_mode=\"double_row\""), "{err}");
    // A layout reaching outside its buffer, a buffer of the wrong width.
    let buf = [0u32; 12];
    // A 3 x 4 fp32 view of `buf` from element `offset` by `strides`.
    let view = |offset: usize, strides: [isize; 2]| {
        Strided::new("a", Buffer::U32(&buf), Dtype::F32, false, [3, 4], offset, strides)
    };
    let err = view(1, [4, 1]).expect_err("outside");
    assert!(
        matches!(err, Error::Shape { .. }) && err.to_string().starts_with("a: the layout"),
        "{err}"
    );
    let err = view(11, [-4, 1]).expect_err("outside");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert!(view(11, [-4, -1]).is_ok());
    let err = Strided::row_major("a", Buffer::U32(&buf), Dtype::F64, [3, 4]).expect_err("width");
    assert!(matches!(err, Error::Format { .. }), "{err}");
    // Compressed parts of the wrong length.
    let p = Pattern::TWO_FOUR;
    let vals = [0u16; 6];
    assert!(Sparse::new("a", Buffer::U16(&vals), &[0u8; 2], Dtype::Bf16, p, [3, 4]).is_ok());
    let err = Sparse::new("a", Buffer::U16(&vals), &[0u8; 1], Dtype::Bf16, p, [3, 4])
        .expect_err("indices");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let err =
        Sparse::new("a", Buffer::U16(&vals), &[0u8; 2], Dtype::Bf16, p, [3, 6]).expect_err("cols");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
}
