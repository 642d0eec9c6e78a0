//! The whole-core machine (issue 14) against scalar oracles written here from the rules in the
//! module docs: every instruction on boundary-heavy inputs of every dtype its engine takes, the
//! fast and the general paths on the same data, every engine rule as an error naming the rule
//! and the operand, capacity and never-written-memory errors, and the timeline's properties.

use super::engine::bf16_operand;
use trn2core::engine::{self, PeTile, PerfMode};
use trn2core::machine::isa::elementwise::SecondOp;
use trn2core::machine::isa::scalar::ActivationArgs;
use trn2core::machine::tile::Index;
use trn2core::machine::{
    cost, timeline, ActFunc, AluOp, Dtype, Engine, Machine, MachineConfig, OutputRounding,
    PeOptions, ReduceCmd, Scalar, Tile, Uninitialized,
};
use trn2core::memory::Space;
use trn2core::numerics::{encode_scalar, fp8_lut, mix64, Format, Rounding};
use trn2core::Error;

const NAN: u32 = 0x7FC0_0000;

fn core() -> Machine {
    Machine::new(MachineConfig::default()).expect("machine")
}

/// The index `start:stop`.
fn range(start: i64, stop: i64) -> Index {
    ix(Some(start), Some(stop), 1)
}

/// The index `start:stop:step`, either end left out as `None`.
fn ix(start: Option<i64>, stop: Option<i64>, step: i64) -> Index {
    Index::Range { start, stop, step }
}

fn alloc(m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype) -> Tile {
    m.alloc(Space::Sbuf, name, shape, dtype).expect("alloc")
}

/// An SBUF tile holding `codes(dtype, its element count, seed)`: the tile and those codes.
fn random_tile(
    m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype, seed: u64,
) -> (Tile, Vec<u32>) {
    let t = alloc(m, name, shape, dtype);
    let bits = codes(dtype, shape.iter().product(), seed);
    put(m, &t, &bits);
    (t, bits)
}

/// An SBUF tile the vector engine set to `value` everywhere.
fn filled(m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype, value: f64) -> Tile {
    let t = alloc(m, name, shape, dtype);
    m.memset(Engine::Vector, &t, value).expect("memset");
    t
}

/// A PSUM tile.
fn psum(m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype) -> Tile {
    m.alloc(Space::Psum, name, shape, dtype).expect("psum")
}

// ------------------------------------------------------------------------------ the oracle

/// The exact value of raw bits of `dtype` (independent of the machine's widening: the float
/// formats decode through `fp8_lut` / the binary16 definition / shifts, integers by sign extension).
fn value(dtype: Dtype, bits: u32) -> f64 {
    match dtype {
        Dtype::Fp32 => f32::from_bits(bits) as f64,
        Dtype::Tf32 => f32::from_bits(bits & !0x1FFF) as f64,
        Dtype::Bf16 => f32::from_bits(bits << 16) as f64,
        Dtype::Fp16 => crate::reference::f16_value(bits as u16),
        Dtype::Fp8E4m3 => fp8_lut(&Format::Fp8E4m3.encoding())[bits as usize & 0xFF] as f64,
        Dtype::Fp8E5m2 => fp8_lut(&Format::Fp8E5m2.encoding())[bits as usize & 0xFF] as f64,
        Dtype::Fp8E3m4 => fp8_lut(&Format::Fp8E3m4.encoding())[bits as usize & 0xFF] as f64,
        Dtype::Int8 => bits as u8 as i8 as f64,
        Dtype::Int16 => bits as u16 as i16 as f64,
        Dtype::Int32 => bits as i32 as f64,
        Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 => bits as f64,
    }
}

/// A float32 engine input: the value rounded to float32 (exact except int32 beyond 2^24).
fn input(dtype: Dtype, bits: u32) -> f32 {
    value(dtype, bits) as f32
}

/// The rule of every engine output: float32 result, canonical NaN, then rounded once to the
/// destination (floats: the f64 path of the encode kernels; integers: nearest even, saturated,
/// NaN to 0).
fn output(dtype: Dtype, v: f32) -> u32 {
    let v = if v.is_nan() { f32::from_bits(NAN) } else { v };
    match dtype.format() {
        Some(Format::Fp32) => v.to_bits(),
        Some(f) => encode_scalar(v as f64, &f.encoding(), Rounding::NearestEven, false, None)
            .expect("encode"),
        None => {
            if v.is_nan() {
                return 0;
            }
            let (lo, hi) = dtype.int_range();
            let r = (v as f64).round_ties_even().clamp(lo, hi) as i64;
            (r as u32) & mask(dtype)
        }
    }
}

fn mask(d: Dtype) -> u32 {
    match d.size() {
        1 => 0xFF,
        2 => 0xFFFF,
        _ => u32::MAX,
    }
}

fn canon(x: f32) -> f32 {
    if x.is_nan() {
        f32::from_bits(NAN)
    } else {
        x
    }
}

/// The ALU rule, written out independently of `alu::apply`.
fn alu(op: AluOp, a: f32, b: f32) -> f32 {
    let t = |c: bool| if c { 1.0 } else { 0.0 };
    let nz = |x: f32| x != 0.0;
    let ieee_max = |a: f32, b: f32| {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else if a == 0.0 && b == 0.0 {
            if a.is_sign_positive() || b.is_sign_positive() {
                0.0
            } else {
                -0.0
            }
        } else if a > b {
            a
        } else {
            b
        }
    };
    let ieee_min = |a: f32, b: f32| {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else if a == 0.0 && b == 0.0 {
            if a.is_sign_negative() || b.is_sign_negative() {
                -0.0
            } else {
                0.0
            }
        } else if a < b {
            a
        } else {
            b
        }
    };
    canon(match op {
        AluOp::Add => a + b,
        AluOp::Subtract => a - b,
        AluOp::Multiply => a * b,
        AluOp::Divide => a / b,
        AluOp::Maximum => ieee_max(a, b),
        AluOp::Minimum => ieee_min(a, b),
        AluOp::AbsMax => ieee_max(a.abs(), b.abs()),
        AluOp::AbsMin => ieee_min(a.abs(), b.abs()),
        AluOp::Power => (a as f64).powf(b as f64) as f32,
        AluOp::Equal => t(a == b),
        AluOp::NotEqual => t(a != b),
        AluOp::Greater => t(a > b),
        AluOp::GreaterEqual => t(a >= b),
        AluOp::Less => t(a < b),
        AluOp::LessEqual => t(a <= b),
        AluOp::LogicalAnd => t(nz(a) && nz(b)),
        AluOp::LogicalOr => t(nz(a) || nz(b)),
        AluOp::LogicalXor => t(nz(a) != nz(b)),
        AluOp::Abs => a.abs(),
        AluOp::Square => a * a,
        AluOp::Relu => {
            if a.is_nan() || a > 0.0 {
                a
            } else {
                0.0
            }
        }
        AluOp::Rsqrt => (1.0 / (a as f64).sqrt()) as f32,
        AluOp::Reciprocal => 1.0 / a,
        _ => panic!("not an arithmetic operator: {op}"),
    })
}

/// Boundary-heavy raw codes of a dtype (`n` of them, deterministic).
fn codes(dtype: Dtype, n: usize, seed: u64) -> Vec<u32> {
    let special: Vec<u32> = match dtype.format() {
        Some(Format::Fp32) | Some(Format::Tf32) => vec![
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x007F_FFFF,
            0x0080_0000,
            0x3F80_0000,
            0xBF80_0000,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0x7FA0_0001,
            0xFFC0_1234,
            0x3F80_8000,
            0x3F80_7FFF,
            0x3F80_8001,
            0x4B80_0000,
            0x7F7F_8000,
            0x3F7F_FFFF,
            0x4000_0000,
        ],
        Some(Format::Bf16) => vec![
            0, 0x8000, 1, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
            0x7FC0, 0x7FA1, 0xFFC1, 0x4000,
        ],
        Some(Format::Fp16) => vec![
            0, 0x8000, 1, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
            0x7E00, 0x7C01, 0xFE01, 0x4000,
        ],
        Some(_) => (0..256).collect(),
        None => {
            let (lo, hi) = dtype.int_range();
            [0.0, 1.0, -1.0, lo, hi, lo + 1.0, hi - 1.0, 2.0, 3.0, 16_777_217.0]
                .iter()
                .filter(|&&v| v >= lo && v <= hi)
                .map(|&v| (v as i64 as u32) & mask(dtype))
                .collect()
        }
    };
    (0..n)
        .map(|i| {
            if i < special.len() {
                special[i]
            } else {
                let r = mix64(seed.wrapping_add(i as u64)) as u32;
                match dtype.format() {
                    // Mostly moderate magnitudes (so products and sums stay finite), some raw.
                    Some(Format::Fp32) if i % 4 != 0 => {
                        (r & 0x807F_FFFF) | (((r >> 23) % 40 + 107) << 23)
                    }
                    Some(Format::Tf32) => r & !0x1FFF,
                    _ => r & mask(dtype),
                }
            }
        })
        .collect()
}

/// An fp32 HBM tensor holding `codes(Fp32, its element count, seed)`: the tensor and those codes.
fn random_hbm(m: &mut Machine, name: &str, shape: &[usize], seed: u64) -> (Tile, Vec<u32>) {
    let host = codes(Dtype::Fp32, shape.iter().product(), seed);
    let h =
        m.hbm_tensor(name, shape, Dtype::Fp32, Some(&to_bytes(Dtype::Fp32, &host))).expect("hbm");
    (h, host)
}

fn to_bytes(dtype: Dtype, bits: &[u32]) -> Vec<u8> {
    bits.iter().flat_map(|&b| b.to_le_bytes()[..dtype.size()].to_vec()).collect()
}

fn from_bytes(dtype: Dtype, bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(dtype.size())
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(w)
        })
        .collect()
}

fn put(m: &mut Machine, t: &Tile, bits: &[u32]) {
    m.write_tile(t, &to_bytes(t.dtype, bits)).expect("write");
}

fn get(m: &Machine, t: &Tile) -> Vec<u32> {
    from_bytes(t.dtype, &m.read_tile(t).expect("read"))
}

fn assert_bits(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}: element {i}: got {g:#x}, want {w:#x}");
    }
}

const FLOATS: [Dtype; 7] = [
    Dtype::Fp32,
    Dtype::Tf32,
    Dtype::Bf16,
    Dtype::Fp16,
    Dtype::Fp8E4m3,
    Dtype::Fp8E5m2,
    Dtype::Fp8E3m4,
];
const INTS: [Dtype; 6] =
    [Dtype::Uint8, Dtype::Int8, Dtype::Uint16, Dtype::Int16, Dtype::Uint32, Dtype::Int32];

fn arithmetic_ops() -> Vec<AluOp> {
    AluOp::ALL
        .into_iter()
        .filter(|o| o.is_elementwise() && !o.is_bitvec() && !o.is_unary())
        .collect()
}

// ------------------------------------------------------------------------- tensor_tensor

/// `tensor_tensor` on `[128, n]` tiles of the given dtypes against the oracle, through the
/// fast path (contiguous tiles) and the general path (every other element of a wider tile).
fn check_tensor_tensor(da: Dtype, db: Dtype, dd: Dtype, op: AluOp, engine: Engine) {
    let n = 96;
    let total = 128 * n;
    let a_bits = codes(da, total, 1);
    let b_bits: Vec<u32> = codes(db, total, 2).into_iter().rev().collect();
    let want: Vec<u32> = a_bits
        .iter()
        .zip(&b_bits)
        .map(|(&x, &y)| output(dd, alu(op, input(da, x), input(db, y))))
        .collect();
    let mut m = core();
    let a = alloc(&mut m, "a", &[128, n], da);
    let b = alloc(&mut m, "b", &[128, n], db);
    let d = alloc(&mut m, "d", &[128, n], dd);
    put(&mut m, &a, &a_bits);
    put(&mut m, &b, &b_bits);
    m.tensor_tensor(engine, &d, &a, &b, op).expect("tensor_tensor");
    let what = format!("{op} {da} {db} -> {dd} on {}", engine.name());
    assert_bits(&get(&m, &d), &want, &what);
    // General path: strided views.
    let wide = |m: &mut Machine, name: &str, dt: Dtype| {
        let t = alloc(m, name, &[128, 2 * n], dt);
        t.slice(&[Index::ALL, ix(None, None, 2)]).expect("slice")
    };
    let (a2, b2, d2) = (wide(&mut m, "a2", da), wide(&mut m, "b2", db), wide(&mut m, "d2", dd));
    put(&mut m, &a2, &a_bits);
    put(&mut m, &b2, &b_bits);
    m.tensor_tensor(engine, &d2, &a2, &b2, op).expect("strided");
    assert_bits(&get(&m, &d2), &want, &format!("{what} (strided)"));
}

#[test]
fn tensor_tensor_every_arithmetic_operator_and_dtype() {
    for op in arithmetic_ops() {
        let engine = if op == AluOp::Power { Engine::Gpsimd } else { Engine::Vector };
        for d in FLOATS.iter().chain(&INTS) {
            check_tensor_tensor(*d, *d, *d, op, engine);
        }
        for (a, b, d) in [
            (Dtype::Fp32, Dtype::Bf16, Dtype::Bf16),
            (Dtype::Bf16, Dtype::Fp32, Dtype::Fp32),
            (Dtype::Fp32, Dtype::Fp32, Dtype::Bf16),
            (Dtype::Bf16, Dtype::Bf16, Dtype::Fp32),
            (Dtype::Int32, Dtype::Fp32, Dtype::Bf16),
            (Dtype::Fp8E4m3, Dtype::Bf16, Dtype::Fp8E5m2),
            (Dtype::Fp16, Dtype::Uint8, Dtype::Int16),
        ] {
            check_tensor_tensor(a, b, d, op, engine);
        }
    }
}

#[test]
fn tensor_tensor_in_place_reads_before_writing() {
    for dt in [Dtype::Fp32, Dtype::Bf16, Dtype::Fp16] {
        let mut m = core();
        let a = alloc(&mut m, "a", &[128, 300], dt);
        let b = alloc(&mut m, "b", &[128, 300], dt);
        let ab = codes(dt, 128 * 300, 5);
        let bb = codes(dt, 128 * 300, 6);
        put(&mut m, &a, &ab);
        put(&mut m, &b, &bb);
        let want = |x: &[u32], y: &[u32]| -> Vec<u32> {
            x.iter()
                .zip(y)
                .map(|(&p, &q)| output(dt, alu(AluOp::Subtract, input(dt, p), input(dt, q))))
                .collect()
        };
        // a = a - b, then b = a - b (the new a), then a = a - a.
        m.tensor_tensor(Engine::Vector, &a, &a, &b, AluOp::Subtract).expect("a-=b");
        let a1 = want(&ab, &bb);
        assert_bits(&get(&m, &a), &a1, "a = a - b");
        m.tensor_tensor(Engine::Vector, &b, &a, &b, AluOp::Subtract).expect("b=a-b");
        let b1 = want(&a1, &bb);
        assert_bits(&get(&m, &b), &b1, "b = a - b");
        m.tensor_tensor(Engine::Vector, &a, &a, &a, AluOp::Subtract).expect("a-a");
        assert_bits(&get(&m, &a), &want(&a1, &a1), "a = a - a");
        // A shifted overlap (dst one element right of the input) goes through the general
        // path and still reads before writing.
        let (full, _) = random_tile(&mut m, "full", &[128, 301], dt, 7);
        let src = full.slice(&[Index::ALL, range(0, 300)]).expect("src");
        let dst = full.slice(&[Index::ALL, range(1, 301)]).expect("dst");
        let before = get(&m, &src);
        m.tensor_tensor(Engine::Vector, &dst, &src, &src, AluOp::Add).expect("shifted");
        let want: Vec<u32> = before
            .iter()
            .map(|&p| output(dt, alu(AluOp::Add, input(dt, p), input(dt, p))))
            .collect();
        assert_bits(&get(&m, &dst), &want, "shifted overlap");
    }
}

#[test]
fn bitvec_and_native_integer_operators() {
    for dt in INTS {
        let mut m = core();
        let a = alloc(&mut m, "a", &[64, 20], dt);
        let b = alloc(&mut m, "b", &[64, 20], dt);
        let d = alloc(&mut m, "d", &[64, 20], dt);
        let ab = codes(dt, 64 * 20, 11);
        let bb: Vec<u32> = codes(dt, 64 * 20, 12).iter().map(|&x| x % 40).collect();
        put(&mut m, &a, &ab);
        put(&mut m, &b, &bb);
        for op in [
            AluOp::BitwiseAnd,
            AluOp::BitwiseOr,
            AluOp::BitwiseXor,
            AluOp::LeftShift,
            AluOp::RightShift,
        ] {
            m.tensor_tensor(Engine::Vector, &d, &a, &b, op).expect("bitvec");
            let want: Vec<u32> = ab
                .iter()
                .zip(&bb)
                .map(|(&x, &y)| {
                    (match op {
                        AluOp::BitwiseAnd => x & y,
                        AluOp::BitwiseOr => x | y,
                        AluOp::BitwiseXor => x ^ y,
                        AluOp::LeftShift => {
                            if y >= 32 {
                                0
                            } else {
                                x << y
                            }
                        }
                        _ => {
                            if y >= 32 {
                                0
                            } else {
                                x >> y
                            }
                        }
                    }) & mask(dt)
                })
                .collect();
            assert_bits(&get(&m, &d), &want, &format!("{op} {dt}"));
        }
        // invert through tensor_scalar (Vector only).
        m.tensor_scalar(Engine::Vector, &d, &a, AluOp::Invert, &Scalar::Imm(0.0), false, None)
            .expect("invert");
        let want: Vec<u32> = ab.iter().map(|&x| !x & mask(dt)).collect();
        assert_bits(&get(&m, &d), &want, &format!("invert {dt}"));
    }
    // GpSimd int32: native wrapping arithmetic.
    let mut m = core();
    let a = alloc(&mut m, "a", &[1, 3], Dtype::Int32);
    let d = alloc(&mut m, "d", &[1, 3], Dtype::Int32);
    put(&mut m, &a, &[0x7FFF_FFFF, 16_777_217, (-5i32) as u32]);
    m.tensor_tensor(Engine::Gpsimd, &d, &a, &a, AluOp::Add).expect("int add");
    assert_eq!(get(&m, &d), vec![0xFFFF_FFFE, 33_554_434, (-10i32) as u32]);
    // The Vector engine computes in fp32: 16777217 is not a float32.
    m.tensor_tensor(Engine::Vector, &d, &a, &a, AluOp::Add).expect("fp32 add");
    assert_eq!(get(&m, &d), vec![0x7FFF_FFFF, 33_554_432, (-10i32) as u32]);
}

// ------------------------------------------------------------------------- tensor_scalar

#[test]
fn tensor_scalar_one_and_two_operators() {
    let ops = arithmetic_ops();
    let unary = [AluOp::Abs, AluOp::Square, AluOp::Relu, AluOp::Rsqrt, AluOp::Reciprocal];
    for dt in [Dtype::Fp32, Dtype::Bf16, Dtype::Fp16, Dtype::Fp8E4m3, Dtype::Int16] {
        for (k, op0) in ops.iter().chain(&unary).enumerate() {
            let op1 = ops[(k * 7 + 3) % ops.len()];
            for &rev in &[false, true] {
                let n = 40;
                let ab = codes(dt, 128 * n, 21 + k as u64);
                let s0: Vec<f32> = (0..128).map(|p| (p as f32 - 60.0) * 0.37).collect();
                let s1 = 1.5f32;
                let want: Vec<u32> = ab
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let x = input(dt, x);
                        let s = s0[i / n];
                        let t = if op0.is_unary() {
                            alu(*op0, x, 0.0)
                        } else if rev {
                            alu(*op0, s, x)
                        } else {
                            alu(*op0, x, s)
                        };
                        let u = if rev { alu(op1, s1, t) } else { alu(op1, t, s1) };
                        output(dt, u)
                    })
                    .collect();
                let mut m = core();
                let a = alloc(&mut m, "a", &[128, n], dt);
                let d = alloc(&mut m, "d", &[128, n], dt);
                let sv = alloc(&mut m, "s", &[128, 1], Dtype::Fp32);
                put(&mut m, &a, &ab);
                put(&mut m, &sv, &s0.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                let second: SecondOp = (op1, Scalar::Imm(s1 as f64), rev);
                let sv = Scalar::Tile(sv);
                // a through both operators (the scalar tile first) into `dst`.
                let ts = |m: &mut Machine, dst: &Tile| {
                    m.tensor_scalar(Engine::Vector, dst, &a, *op0, &sv, rev, Some(&second))
                };
                ts(&mut m, &d).expect("tensor_scalar");
                assert_bits(&get(&m, &d), &want, &format!("{op0},{op1} rev={rev} {dt}"));
                // In place, and on a strided view: the same bits.
                ts(&mut m, &a).expect("in place");
                assert_bits(&get(&m, &a), &want, &format!("{op0},{op1} in place {dt}"));
            }
        }
    }
}

#[test]
fn scalar_tensor_tensor_and_reciprocal_and_select() {
    let dt = Dtype::Bf16;
    let n = 50;
    let ab = codes(dt, 128 * n, 31);
    let bb = codes(dt, 128 * n, 32);
    let mut m = core();
    let a = alloc(&mut m, "a", &[128, n], dt);
    let b = alloc(&mut m, "b", &[128, n], dt);
    let d = alloc(&mut m, "d", &[128, n], Dtype::Fp32);
    put(&mut m, &a, &ab);
    put(&mut m, &b, &bb);
    for (op0, op1, r0, r1) in [
        (AluOp::Subtract, AluOp::Multiply, false, false),
        (AluOp::Divide, AluOp::Maximum, true, true),
        (AluOp::Abs, AluOp::Add, false, true),
    ] {
        m.scalar_tensor_tensor(&d, &a, op0, &Scalar::Imm(0.75), r0, op1, &b, r1).expect("stt");
        let want: Vec<u32> = ab
            .iter()
            .zip(&bb)
            .map(|(&x, &y)| {
                let (x, y) = (input(dt, x), input(dt, y));
                let t = if op0.is_unary() {
                    alu(op0, x, 0.0)
                } else if r0 {
                    alu(op0, 0.75, x)
                } else {
                    alu(op0, x, 0.75)
                };
                output(Dtype::Fp32, if r1 { alu(op1, y, t) } else { alu(op1, t, y) })
            })
            .collect();
        assert_bits(&get(&m, &d), &want, &format!("stt {op0} {op1}"));
    }
    m.reciprocal(&d, &a).expect("reciprocal");
    let want: Vec<u32> = ab.iter().map(|&x| output(Dtype::Fp32, 1.0 / input(dt, x))).collect();
    assert_bits(&get(&m, &d), &want, "reciprocal");
    // select: predicate != 0 (NaN true).
    let p = alloc(&mut m, "p", &[128, n], Dtype::Fp32);
    let pb: Vec<u32> = (0..128 * n).map(|i| [0u32, 0x8000_0000, NAN, 0x3F80_0000][i % 4]).collect();
    put(&mut m, &p, &pb);
    m.select(&d, &p, &a, &Scalar::Tile(b)).expect("select");
    let want: Vec<u32> = (0..128 * n)
        .map(|i| {
            let pick = if i % 4 < 2 { bb[i] } else { ab[i] };
            output(Dtype::Fp32, input(dt, pick))
        })
        .collect();
    assert_bits(&get(&m, &d), &want, "select");
    let db = alloc(&mut m, "db", &[128, n], dt);
    m.select(&db, &p, &a, &Scalar::Tile(b)).expect("select bits");
    let want: Vec<u32> = (0..128 * n).map(|i| if i % 4 < 2 { bb[i] } else { ab[i] }).collect();
    assert_bits(&get(&m, &db), &want, "select keeps bits");
}

#[test]
fn tensor_copy_is_bit_exact_or_goes_through_fp32() {
    for (s, d) in [
        (Dtype::Fp32, Dtype::Fp32),
        (Dtype::Bf16, Dtype::Bf16),
        (Dtype::Fp8E5m2, Dtype::Fp8E5m2),
        (Dtype::Int32, Dtype::Int32),
        (Dtype::Fp32, Dtype::Bf16),
        (Dtype::Bf16, Dtype::Fp32),
        (Dtype::Fp32, Dtype::Fp8E4m3),
        (Dtype::Fp16, Dtype::Int8),
        (Dtype::Int32, Dtype::Fp32),
        (Dtype::Uint32, Dtype::Bf16),
    ] {
        for engine in [Engine::Vector, Engine::Scalar, Engine::Gpsimd] {
            let mut m = core();
            let a = alloc(&mut m, "a", &[128, 33], s);
            let o = alloc(&mut m, "o", &[128, 33], d);
            let ab = codes(s, 128 * 33, 41);
            put(&mut m, &a, &ab);
            m.tensor_copy(engine, &o, &a).expect("copy");
            let want: Vec<u32> = if s == d {
                ab.clone()
            } else {
                ab.iter().map(|&x| output(d, input(s, x))).collect()
            };
            assert_bits(&get(&m, &o), &want, &format!("copy {s} -> {d} on {}", engine.name()));
        }
    }
}

#[test]
fn memset_rounds_once_and_saturates() {
    let mut m = core();
    for (dt, v, want) in [
        (Dtype::Bf16, 1.0 + 2f64.powi(-8), 0x3F80u32),
        (Dtype::Bf16, 1.0 + 2f64.powi(-8) + 2f64.powi(-30), 0x3F81),
        (Dtype::Fp8E4m3, 1e9, 0x78),
        (Dtype::Fp32, -0.0, 0x8000_0000),
        (Dtype::Int8, 300.0, 127),
        (Dtype::Int8, -2.5, 0xFE),
        (Dtype::Uint16, -3.0, 0),
        (Dtype::Int32, 16_777_217.0, 16_777_217),
    ] {
        let t = alloc(&mut m, "t", &[32, 3], dt);
        m.memset(Engine::Gpsimd, &t, v).expect("memset");
        assert_eq!(get(&m, &t), vec![want; 96], "memset {dt} {v}");
        m.free(&t).expect("free");
    }
}

// ------------------------------------------------------------------ reductions and scans

#[test]
fn tensor_reduce_orders_and_axes() {
    let dt = Dtype::Fp32;
    let mut m = core();
    let (a, ab) = random_tile(&mut m, "a", &[16, 3, 8], dt, 51);
    for op in [
        AluOp::Add,
        AluOp::Maximum,
        AluOp::Minimum,
        AluOp::Multiply,
        AluOp::Subtract,
        AluOp::LogicalOr,
    ] {
        for (axes, r) in [(1usize, 8usize), (2, 24)] {
            for negate in [false, true] {
                let d = alloc(&mut m, "d", &[16, 24 / r], Dtype::Bf16);
                m.tensor_reduce(&d, op, &a, axes, negate).expect("reduce");
                let want: Vec<u32> = ab
                    .chunks(r)
                    .map(|c| {
                        let mut acc = canon(input(dt, c[0]));
                        for &x in &c[1..] {
                            acc = alu(op, acc, input(dt, x));
                        }
                        output(Dtype::Bf16, if negate { -acc } else { acc })
                    })
                    .collect();
                assert_bits(&get(&m, &d), &want, &format!("reduce {op} axes={axes} neg={negate}"));
                m.free(&d).expect("free");
            }
        }
    }
    // Bitvec reductions on integers.
    let (i, ib) = random_tile(&mut m, "i", &[4, 8], Dtype::Uint16, 52);
    let d = alloc(&mut m, "di", &[4, 1], Dtype::Uint16);
    m.tensor_reduce(&d, AluOp::BitwiseXor, &i, 1, false).expect("xor");
    let want: Vec<u32> = ib.chunks(8).map(|c| c.iter().fold(0, |x, y| x ^ y)).collect();
    assert_eq!(get(&m, &d), want);
    let err = m.tensor_reduce(&d, AluOp::Divide, &i, 1, false).expect_err("not a reduction");
    assert!(err.to_string().contains("not a reduction"), "{err}");
}

#[test]
fn tensor_tensor_scan_keeps_an_fp32_state() {
    let mut m = core();
    let n = 37;
    let a = alloc(&mut m, "a", &[128, n], Dtype::Bf16);
    let b = alloc(&mut m, "b", &[128, n], Dtype::Bf16);
    let d = alloc(&mut m, "d", &[128, n], Dtype::Bf16);
    let init = alloc(&mut m, "init", &[128, 1], Dtype::Fp32);
    let ab = codes(Dtype::Bf16, 128 * n, 61);
    let bb = codes(Dtype::Bf16, 128 * n, 62);
    let ib: Vec<u32> = (0..128).map(|p| (p as f32 * 0.25).to_bits()).collect();
    put(&mut m, &a, &ab);
    put(&mut m, &b, &bb);
    put(&mut m, &init, &ib);
    for (op0, op1, r0, r1) in
        [(AluOp::Multiply, AluOp::Add, false, false), (AluOp::Subtract, AluOp::Maximum, true, true)]
    {
        m.tensor_tensor_scan(&d, &a, &b, &Scalar::Tile(init), op0, op1, r0, r1).expect("scan");
        let mut want = Vec::new();
        for p in 0..128 {
            let mut s = f32::from_bits(ib[p]);
            for i in 0..n {
                let (x, y) = (input(Dtype::Bf16, ab[p * n + i]), input(Dtype::Bf16, bb[p * n + i]));
                let t = if r0 { alu(op0, s, x) } else { alu(op0, x, s) };
                s = if r1 { alu(op1, y, t) } else { alu(op1, t, y) };
                want.push(output(Dtype::Bf16, s));
            }
        }
        assert_bits(&get(&m, &d), &want, &format!("scan {op0} {op1}"));
    }
}

#[test]
fn bn_stats_and_bn_aggr_follow_the_documented_order() {
    let mut m = core();
    let n = 100;
    let a = alloc(&mut m, "a", &[128, n], Dtype::Bf16);
    let ab: Vec<u32> = codes(Dtype::Bf16, 128 * n, 71)
        .iter()
        .map(|&x| if (x & 0x7F80) == 0x7F80 { 0x3F00 } else { x & 0xC7FF })
        .collect();
    put(&mut m, &a, &ab);
    let st = alloc(&mut m, "st", &[128, 2, 6], Dtype::Fp32);
    let half = |i: i64| st.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    m.bn_stats(&half(0), &a.slice(&[Index::ALL, range(0, 50)]).expect("lo")).expect("stats");
    m.bn_stats(&half(1), &a.slice(&[Index::ALL, range(50, 100)]).expect("hi")).expect("stats");
    let agg = alloc(&mut m, "agg", &[128, 2], Dtype::Fp32);
    m.bn_aggr(&agg, &st.reshape_free(&[12]).expect("flat")).expect("aggr");
    let stats = get(&m, &st);
    let out = get(&m, &agg);
    for p in 0..128 {
        let row: Vec<f32> = ab[p * n..(p + 1) * n].iter().map(|&x| input(Dtype::Bf16, x)).collect();
        let mut triples = Vec::new();
        for h in 0..2 {
            for parity in 0..2 {
                let v: Vec<f32> =
                    row[h * 50..(h + 1) * 50].iter().skip(parity).step_by(2).copied().collect();
                let c = v.len() as f32;
                let mut s = 0.0f32;
                for &x in &v {
                    s += x;
                }
                let mean = s / c;
                let mut q = 0.0f32;
                for &x in &v {
                    q += (x - mean) * (x - mean);
                }
                triples.push((c, mean, q));
            }
        }
        let got: Vec<f32> =
            stats[p * 12..(p + 1) * 12].iter().map(|&b| f32::from_bits(b)).collect();
        let want: Vec<f32> = triples.iter().flat_map(|&(c, mu, q)| [c, mu, q]).collect();
        assert_eq!(got, want, "bn_stats partition {p}");
        let mut tot = 0.0f32;
        let mut sum = 0.0f32;
        for &(c, mu, _) in &triples {
            tot += c;
            sum += c * mu;
        }
        let mean = sum / tot;
        let mut q = 0.0f32;
        for &(c, mu, m2) in &triples {
            q += m2 + c * ((mu - mean) * (mu - mean));
        }
        assert_eq!(
            (f32::from_bits(out[2 * p]), f32::from_bits(out[2 * p + 1])),
            (mean, q / tot),
            "bn_aggr partition {p}"
        );
        // And close to the float64 mean / variance.
        let m64 = row.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        let v64 = row.iter().map(|&x| (x as f64 - m64).powi(2)).sum::<f64>() / n as f64;
        assert!((mean as f64 - m64).abs() <= 1e-5 * (1.0 + m64.abs()), "{mean} {m64}");
        assert!(((q / tot) as f64 - v64).abs() <= 1e-4 * (1.0 + v64), "{} {v64}", q / tot);
    }
}

#[test]
fn tensor_scalar_reduce_uses_the_vector_registers() {
    let mut m = core();
    let (a, ab) = random_tile(&mut m, "a", &[128, 10], Dtype::Fp32, 81);
    let d = alloc(&mut m, "d", &[128, 10], Dtype::Fp32);
    let r = alloc(&mut m, "r", &[128, 1], Dtype::Fp32);
    for op in [AluOp::Add, AluOp::Maximum, AluOp::Minimum, AluOp::Multiply] {
        m.tensor_scalar_reduce(
            &d,
            &a,
            AluOp::Multiply,
            &Scalar::Imm(0.5),
            false,
            op,
            Some(&r),
            ReduceCmd::ResetReduce,
            None,
            true,
        )
        .expect("tsr");
        let want: Vec<u32> = ab
            .chunks(10)
            .map(|c| {
                let mut acc = match op {
                    AluOp::Multiply => 1.0,
                    AluOp::Maximum => f32::NEG_INFINITY,
                    AluOp::Minimum => f32::INFINITY,
                    _ => 0.0,
                };
                for &x in c {
                    acc = alu(op, acc, alu(AluOp::Multiply, input(Dtype::Fp32, x), 0.5));
                }
                output(Dtype::Fp32, -acc)
            })
            .collect();
        assert_bits(&get(&m, &r), &want, &format!("tensor_scalar_reduce {op}"));
    }
}

// ------------------------------------------------------------------------------ activation

#[test]
fn activation_every_function_scale_bias_and_accumulation() {
    for func in ActFunc::ALL {
        for dt in [Dtype::Fp32, Dtype::Bf16] {
            let n = 60;
            let ab = codes(dt, 128 * n, 91 + func as u64);
            let mut m = core();
            let a = alloc(&mut m, "a", &[128, n], dt);
            let d = alloc(&mut m, "d", &[128, n], Dtype::Bf16);
            let bias = alloc(&mut m, "bias", &[128, 1], Dtype::Bf16);
            let acc = alloc(&mut m, "acc", &[128, 1], Dtype::Fp32);
            put(&mut m, &a, &ab);
            let bb: Vec<u32> = (0..128).map(|p| 0x3E00 + p as u32).collect();
            put(&mut m, &bias, &bb);
            let args = ActivationArgs {
                bias: Some(Scalar::Tile(bias)),
                scale: Some(Scalar::Imm(0.5)),
                reduce_op: Some(AluOp::Add),
                reduce_res: Some(acc),
                reduce_cmd: ReduceCmd::ResetReduce,
            };
            m.activation(&d, func, &a, &args).expect("activation");
            // The float64 rule, computed here from the formulas.
            let f = |x: f64| -> f64 {
                let sig = |z: f64| 1.0 / (1.0 + (-z).exp());
                let sp = |z: f64| {
                    if z > 0.0 {
                        z + (-z).exp().ln_1p()
                    } else {
                        z.exp().ln_1p()
                    }
                };
                let erf = trn2core::machine::isa::act::erf;
                match func {
                    ActFunc::Copy => x,
                    ActFunc::Square => x * x,
                    ActFunc::Relu => {
                        if x > 0.0 || x.is_nan() {
                            x
                        } else {
                            0.0
                        }
                    }
                    ActFunc::Sigmoid => sig(x),
                    ActFunc::Tanh => x.tanh(),
                    ActFunc::Gelu => 0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2)),
                    ActFunc::GeluDx => {
                        0.5 * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))
                            + x * (-0.5 * x * x).exp() * 0.398_942_280_401_432_7
                    }
                    ActFunc::GeluApprxTanh => {
                        0.5 * x
                            * (1.0
                                + (0.797_884_560_802_865_4 * (x + 0.044715 * (x * x * x))).tanh())
                    }
                    ActFunc::GeluApprxSigmoid => x / (1.0 + (-1.702 * x).exp()),
                    ActFunc::GeluApprxSigmoidDx => {
                        let s = sig(1.702 * x);
                        s + 1.702 * x * s * (1.0 - s)
                    }
                    ActFunc::Silu => x / (1.0 + (-x).exp()),
                    ActFunc::SiluDx => {
                        let s = sig(x);
                        s * (1.0 + x * (1.0 - s))
                    }
                    ActFunc::Softplus => sp(x),
                    ActFunc::Mish => x * sp(x).tanh(),
                    ActFunc::Erf => erf(x),
                    ActFunc::ErfDx => std::f64::consts::FRAC_2_SQRT_PI * (-(x * x)).exp(),
                    ActFunc::Exp => x.exp(),
                    ActFunc::Log => x.ln(),
                    ActFunc::Sin => x.sin(),
                    ActFunc::Arctan => x.atan(),
                    ActFunc::Sqrt => x.sqrt(),
                    ActFunc::Rsqrt => 1.0 / x.sqrt(),
                    ActFunc::Reciprocal => 1.0 / x,
                    ActFunc::Sign => {
                        if x > 0.0 {
                            1.0
                        } else if x < 0.0 {
                            -1.0
                        } else {
                            x
                        }
                    }
                    ActFunc::Abs => x.abs(),
                }
            };
            let mut want = Vec::new();
            let mut sums = Vec::new();
            for p in 0..128 {
                let bias = input(Dtype::Bf16, bb[p]);
                let mut s = 0.0f32;
                for i in 0..n {
                    let t = input(dt, ab[p * n + i]) * 0.5 + bias;
                    let r = canon(f(t as f64) as f32);
                    s += r;
                    want.push(output(Dtype::Bf16, r));
                }
                sums.push(output(Dtype::Fp32, s));
            }
            assert_bits(&get(&m, &d), &want, &format!("activation {func} {dt}"));
            assert_bits(&get(&m, &acc), &sums, &format!("activation {func} {dt} reduce"));
            // activation_reduce is the same instruction with reset_reduce.
            let acc2 = alloc(&mut m, "acc2", &[128, 1], Dtype::Fp32);
            m.activation_reduce(
                &d,
                func,
                &a,
                AluOp::Add,
                &acc2,
                Some(Scalar::Tile(bias)),
                Some(Scalar::Imm(0.5)),
            )
            .expect("activation_reduce");
            assert_bits(&get(&m, &acc2), &sums, &format!("activation_reduce {func}"));
        }
    }
}

#[test]
fn activation_registers_accumulate_across_instructions() {
    let mut m = core();
    let a = alloc(&mut m, "a", &[4, 3], Dtype::Fp32);
    let d = alloc(&mut m, "d", &[4, 3], Dtype::Fp32);
    let r = alloc(&mut m, "r", &[4, 1], Dtype::Fp32);
    put(&mut m, &a, &(0..12).map(|i| (i as f32).to_bits()).collect::<Vec<_>>());
    let mut args = ActivationArgs {
        reduce_op: Some(AluOp::Add),
        reduce_cmd: ReduceCmd::ResetReduce,
        ..ActivationArgs::default()
    };
    m.activation(&d, ActFunc::Copy, &a, &args).expect("first");
    args.reduce_cmd = ReduceCmd::Reduce;
    args.reduce_res = Some(r);
    m.activation(&d, ActFunc::Square, &a, &args).expect("second");
    let want: Vec<f32> =
        (0..4).map(|p| (0..3).map(|i| (3 * p + i) as f32).map(|x| x + x * x).sum()).collect();
    let got: Vec<f32> = get(&m, &r).iter().map(|&b| f32::from_bits(b)).collect();
    assert_eq!(got, want);
}

/// activate2's stages as float32 operations (reversed where asked, bypassed as `None`), the
/// function by act's rule, and the registers folded with each reduce_op from its identity.
#[test]
fn activate2_against_its_documented_stages() {
    use trn2core::machine::isa::act;
    use trn2core::machine::isa::scalar::Activate2Args;
    let mut m = core();
    let (p, n) = (4usize, 6usize);
    let [a, d] = ["a", "d"].map(|s| alloc(&mut m, s, &[p, n], Dtype::Fp32));
    let [s0, r] = ["s0", "r"].map(|s| alloc(&mut m, s, &[p, 1], Dtype::Fp32));
    let mut x: Vec<f32> = (0..p * n).map(|i| i as f32 * 0.75 - 8.0).collect();
    x[..5].copy_from_slice(&[f32::NAN, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e30]);
    put(&mut m, &a, &x.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let sv = [2.0f32, -0.5, 0.0, 3.0];
    put(&mut m, &s0, &sv.map(f32::to_bits));
    let (mul, add, sub) = (Some(AluOp::Multiply), Some(AluOp::Add), Some(AluOp::Subtract));
    let (t0, i15, im2) = (Scalar::Tile(s0), Scalar::Imm(1.5), Scalar::Imm(-2.0));
    let (rr, rd, idle) = (ReduceCmd::ResetReduce, ReduceCmd::Reduce, ReduceCmd::Idle);
    let bypass = (None, im2, false);
    // (stages, function, reduce_op, reduce_cmd)
    let calls = [
        ([(mul, t0, false), (sub, i15, true)], ActFunc::Gelu, AluOp::Maximum, rr),
        ([(add, im2, true), bypass], ActFunc::Relu, AluOp::AbsMin, rr),
        ([bypass, bypass], ActFunc::Copy, AluOp::AbsMin, rd),
        ([bypass, bypass], ActFunc::Exp, AluOp::Add, idle),
    ];
    let mut reg = [0f32; 4];
    for (k, (stages, func, op, cmd)) in calls.into_iter().enumerate() {
        let args = Activate2Args {
            stages,
            relu_param: None,
            reduce_op: Some(op),
            reduce_res: Some(r),
            reduce_cmd: cmd,
        };
        m.activate2(&d, func, &a, &args).expect("activate2");
        let mut want = Vec::new();
        for row in 0..p {
            if cmd == ReduceCmd::ResetReduce {
                reg[row] = if op == AluOp::Maximum { f32::NEG_INFINITY } else { f32::INFINITY };
            }
            for &v0 in &x[row * n..(row + 1) * n] {
                let mut v = v0;
                for (o, s, rev) in stages {
                    let s = match s {
                        Scalar::Tile(_) => sv[row],
                        Scalar::Imm(c) => c as f32,
                    };
                    v = match (o, rev) {
                        (Some(AluOp::Multiply), _) => v * s,
                        (Some(AluOp::Add), _) => v + s,
                        (Some(_), true) => s - v,
                        (Some(_), false) => v - s,
                        (None, _) => v,
                    };
                }
                let y = act::eval(func, if v.is_nan() { f32::from_bits(NAN) } else { v });
                if cmd != ReduceCmd::Idle {
                    reg[row] = match (reg[row].is_nan() || y.is_nan(), op) {
                        (true, _) => f32::from_bits(NAN),
                        (_, AluOp::Maximum) => reg[row].max(y),
                        _ => {
                            if y.abs() < reg[row].abs() {
                                y.abs()
                            } else {
                                reg[row].abs()
                            }
                        }
                    };
                }
                want.push(output(Dtype::Fp32, y));
            }
        }
        assert_bits(&get(&m, &d), &want, &format!("call {k}"));
        let regs: Vec<u32> = reg.iter().map(|&v| output(Dtype::Fp32, v)).collect();
        assert_bits(&get(&m, &r), &regs, &format!("call {k} registers"));
    }
    // (op0, reverse0, op1, reduce_op, reduce_cmd) and the argument refused.
    let (times, plus) = (Some(AluOp::Multiply), Some(AluOp::Add));
    let cases = [
        (add, false, add, None, idle, "op1"),
        (None, false, add, None, idle, "op1"),
        (None, true, None, None, idle, "reverse0"),
        (mul, false, None, times, rd, "reduce_op"),
        (mul, false, None, None, rd, "reduce_op"),
        (mul, false, None, plus, ReduceCmd::LoadReduce, "reduce_cmd"),
    ];
    for (op0, reverse0, op1, reduce_op, reduce_cmd, arg) in cases {
        let stages = [(op0, i15, reverse0), (op1, i15, false)];
        let (relu_param, reduce_res) = (None, None);
        let args = Activate2Args { stages, relu_param, reduce_op, reduce_res, reduce_cmd };
        let e = m.activate2(&d, ActFunc::Copy, &a, &args).expect_err(arg);
        assert_eq!(e.arg(), Some(arg), "{e}");
    }
}

// ------------------------------------------------------------------------------- GpSimd

#[test]
fn iota_and_affine_select() {
    let mut m = core();
    let t = alloc(&mut m, "t", &[8, 2, 5], Dtype::Int32);
    m.iota(&t, &[(100, 2), (-3, 5)], 7, 1000).expect("iota");
    let want: Vec<u32> = (0..8)
        .flat_map(|c| {
            (0..2).flat_map(move |w| (0..5).map(move |x| (7 + 1000 * c + 100 * w - 3 * x) as u32))
        })
        .collect();
    assert_eq!(get(&m, &t), want);
    let f = alloc(&mut m, "f", &[8, 10], Dtype::Bf16);
    m.iota(&f, &[(1, 10)], 0, 10).expect("iota bf16");
    let want: Vec<u32> = (0..80).map(|v| output(Dtype::Bf16, v as f32)).collect();
    assert_eq!(get(&m, &f), want);
    // Causal mask: keep j <= p (p - j >= 0), else -inf-ish.
    let sc = alloc(&mut m, "sc", &[8, 10], Dtype::Bf16);
    m.affine_select(&sc, &[(-1, 10)], 1, &f, -30000.0, AluOp::GreaterEqual, 0)
        .expect("affine_select");
    let fb = get(&m, &f);
    let want: Vec<u32> = (0..80)
        .map(|i| {
            let (p, j) = (i / 10, i % 10);
            if p >= j {
                fb[i]
            } else {
                output(Dtype::Bf16, -30000.0)
            }
        })
        .collect();
    assert_eq!(get(&m, &sc), want);
}

// ------------------------------------------------------------------------- tensor engine

/// Host-issued matmuls (`NeuronCore.matmul`) run on the same machine: the same bits as the
/// engine, in the PSUM a tile over the bank reads, on the one timeline, scratch SBUF returned.
#[test]
fn host_matmul_writes_the_machines_psum_on_its_clock() {
    use trn2core::machine::HostOperand;
    use trn2core::numerics::CodesRef;
    let mut m = core();
    let (k, mm, n) = (128, 64, 300);
    let bank3 = m
        .alloc_at(Space::Psum, "bank3", &[mm, 512], Dtype::Fp32, 0, Some(3 * 2048), false)
        .expect("psum tile over bank 3");
    let sb: Vec<u16> = codes(Dtype::Bf16, k * mm, 201).iter().map(|&c| c as u16).collect();
    let mb: Vec<u16> = codes(Dtype::Bf16, k * n, 202).iter().map(|&c| c as u16).collect();
    let host = |c: &[u16]| c.iter().map(|&x| input(Dtype::Bf16, x as u32)).collect::<Vec<f32>>();
    let (sv, mvv) = (host(&sb), host(&mb));
    let once = engine::matmul(
        &bf16_operand(&sv, &[k, mm]),
        &bf16_operand(&mvv, &[k, n]),
        PerfMode::None,
        PeTile::FULL,
    )
    .expect("engine");
    let st = HostOperand { codes: CodesRef::U16(&sb), shape: &[k, mm], format: Format::Bf16 };
    let mv = HostOperand { codes: CodesRef::U16(&mb), shape: &[k, n], format: Format::Bf16 };
    let out = m.matmul_host(&st, &mv, 3, false, PerfMode::None, PeTile::FULL).expect("host matmul");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&once));
    // The tile allocated over bank 3 holds the result in its first n columns.
    let all = m.read_f32(&bank3).err();
    assert!(all.is_some(), "columns n..512 were never written");
    let cols = bank3.slice(&[ix(None, None, 1), range(0, n as i64)]);
    let seen = m.read_f32(&cols.expect("slice")).expect("read");
    assert_eq!(bits(&seen), bits(&once));
    // Accumulating onto it adds, as a second matmul of the group.
    let twice = m.matmul_host(&st, &mv, 3, true, PerfMode::None, PeTile::FULL).expect("accumulate");
    let want: Vec<u32> = once.iter().map(|&v| canon(v + v).to_bits()).collect();
    assert_eq!(bits(&twice), want);
    // One timeline: two PE instructions; the scratch operands were freed.
    let rep = m.run().expect("run");
    assert_eq!(rep.instructions, 2);
    let usable = trn2core::spec::SBUF_USABLE_PARTITION_BYTES as usize;
    m.alloc(Space::Sbuf, "all", &[128, usable], Dtype::Uint8).expect("all of SBUF is free again");
    // Bad banks and operands are errors naming the argument, with nothing recorded.
    let err = m.matmul_host(&st, &mv, 8, false, PerfMode::None, PeTile::FULL).expect_err("bank 8");
    assert!(err.to_string().contains("bank"), "{err}");
    let short = HostOperand { codes: CodesRef::U16(&sb[1..]), ..st };
    let err = m
        .matmul_host(&short, &mv, 0, false, PerfMode::None, PeTile::FULL)
        .expect_err("short codes");
    assert!(err.to_string().contains("stationary"), "{err}");
    assert_eq!(m.instructions(), 2);
}

/// An allocation that only retired tensors (freed while queued matmuls still write them) keep
/// out is "settle first" (`try_alloc_at` is `None`, with no error made); after settling, the
/// one that fits is placed and the one that does not fit is the full `CapacityError`.
#[test]
fn an_allocation_blocked_by_retired_tensors_settles_first_then_fits_or_explains() {
    let mut m = core();
    let st = alloc(&mut m, "st", &[128, 128], Dtype::Bf16);
    let mv = alloc(&mut m, "mv", &[128, 512], Dtype::Bf16);
    put(&mut m, &st, &codes(Dtype::Bf16, 128 * 128, 7));
    put(&mut m, &mv, &codes(Dtype::Bf16, 128 * 512, 8));
    // PSUM's eight banks, the last written by a queued matmul, then freed (retired).
    let banks: Vec<Tile> =
        (0..8).map(|i| psum(&mut m, &format!("bank{i}"), &[128, 512], Dtype::Fp32)).collect();
    m.nc_matmul_queued(&banks[7], &st, &mv, &PeOptions::default()).expect("mm");
    assert!(m.has_queued_work(), "the matmul waits in the queue");
    m.free(&banks[7]).expect("free");
    let one = (Space::Psum, "one", &[128usize, 512][..], Dtype::Fp32, 0, None, false);
    let two = (Space::Psum, "two", &[128usize, 1024][..], Dtype::Fp32, 0, None, false);
    assert_eq!(m.try_alloc_at(one).expect("no error"), None, "a bank: settle first");
    assert_eq!(m.try_alloc_at(two).expect("no error"), None, "two banks: settle first");
    let err = m.alloc_at(Space::Psum, "two", &[128, 1024], Dtype::Fp32, 0, None, false);
    let msg = err.expect_err("seven banks live: no room for two").to_string();
    assert!(msg.contains("largest live allocations") && msg.contains("bank0"), "{msg}");
    assert!(!m.has_queued_work(), "settled");
    let t = m.try_alloc_at(one).expect("no error").expect("a bank fits once settled");
    assert_eq!(t.start_partition, 0);
    // PSUM full, nothing retired: the full error at once.
    let msg = m.try_alloc_at(one).expect_err("no room").to_string();
    assert!(msg.contains("largest live allocations") && msg.contains("bank0"), "{msg}");
}

#[test]
fn nc_matmul_equals_the_engine_and_accumulates() {
    let mut m = core();
    let (k, mm, n) = (128, 96, 200);
    let st = alloc(&mut m, "st", &[k, mm], Dtype::Bf16);
    let mv = alloc(&mut m, "mv", &[k, n], Dtype::Bf16);
    let ps = psum(&mut m, "ps", &[mm, n], Dtype::Fp32);
    let sb = codes(Dtype::Bf16, k * mm, 101);
    let mb = codes(Dtype::Bf16, k * n, 102);
    put(&mut m, &st, &sb);
    put(&mut m, &mv, &mb);
    let sv: Vec<f32> = sb.iter().map(|&x| input(Dtype::Bf16, x)).collect();
    let mvv: Vec<f32> = mb.iter().map(|&x| input(Dtype::Bf16, x)).collect();
    let shapes = ([k, mm], [k, n]);
    let (so, mo) = (bf16_operand(&sv, &shapes.0), bf16_operand(&mvv, &shapes.1));
    let once = engine::matmul(&so, &mo, PerfMode::None, PeTile::FULL).expect("engine");
    // accumulate=None: the first write overwrites, the second accumulates.
    let opts = PeOptions::default();
    m.nc_matmul(&ps, &st, &mv, &opts).expect("mm");
    assert_eq!(get(&m, &ps), once.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    m.nc_matmul(&ps, &st, &mv, &opts).expect("mm acc");
    let twice: Vec<u32> = once.iter().map(|&v| canon(v + v).to_bits()).collect();
    assert_eq!(get(&m, &ps), twice);
    // accumulate=False overwrites.
    let over = PeOptions { accumulate: Some(false), ..opts };
    m.nc_matmul(&ps, &st, &mv, &over).expect("overwrite");
    assert_eq!(get(&m, &ps), once.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    // Another engine's write ends the group: accumulate=True is then refused.
    let sbuf = alloc(&mut m, "out", &[mm, n], Dtype::Fp32);
    m.tensor_copy(Engine::Vector, &sbuf, &ps).expect("evict");
    m.tensor_copy(Engine::Scalar, &ps, &sbuf).expect("write back");
    let acc = PeOptions { accumulate: Some(true), ..opts };
    let err = m.nc_matmul(&ps, &st, &mv, &acc).expect_err("undefined accumulate");
    assert!(err.to_string().contains("[engine rule accumulate]"), "{err}");
    // fp32 PSUM only; SBUF inputs only.
    let bad = psum(&mut m, "bad", &[mm, n], Dtype::Bf16);
    let err = m.nc_matmul(&bad, &st, &mv, &opts).expect_err("bf16 dst");
    assert!(
        err.to_string().contains("matmul_dst_fp32")
            && matches!(err, Error::Format { ref arg, .. } if arg == "dst"),
        "{err}"
    );
    let err = m.nc_matmul(&ps, &mv, &mv, &opts).expect_err("M = 200");
    assert!(matches!(err, Error::Shape { .. }) && err.to_string().contains("M <= 128"), "{err}");
    let err = m.nc_matmul(&ps, &sbuf, &mv, &opts).expect_err("fp32 with bf16");
    assert!(matches!(err, Error::Format { .. }), "{err}");
    let ints = filled(&mut m, "ints", &[k, n], Dtype::Int8, 1.0);
    let err = m.nc_matmul(&ps, &st, &ints, &opts).expect_err("int");
    assert!(err.to_string().contains("no integer datapath"), "{err}");
}

#[test]
fn transposes_are_bit_exact() {
    let mut m = core();
    let (x, xb) = random_tile(&mut m, "x", &[100, 70], Dtype::Bf16, 111);
    let t = psum(&mut m, "t", &[70, 100], Dtype::Bf16);
    m.nc_transpose(Engine::Tensor, &t, &x).expect("pe transpose");
    // The codes of a row-major [rows, cols] array, transposed.
    let transposed = |b: &[u32], rows: usize, cols: usize| -> Vec<u32> {
        (0..rows * cols).map(|i| b[(i % rows) * cols + i / rows]).collect()
    };
    let want = transposed(&xb, 100, 70);
    assert_eq!(get(&m, &t), want);
    // Through nc_matmul(is_transpose=True) with the identity.
    let id = alloc(&mut m, "id", &[100, 100], Dtype::Bf16);
    m.iota(&id, &[(-1, 100)], 0, 1).expect("iota");
    let ones = filled(&mut m, "ones", &[100, 100], Dtype::Bf16, 1.0);
    m.affine_select(&id, &[(-1, 100)], 1, &ones, 0.0, AluOp::Equal, 0).expect("identity");
    let t2 = psum(&mut m, "t2", &[70, 100], Dtype::Bf16);
    let opts = PeOptions { is_transpose: true, ..PeOptions::default() };
    m.nc_matmul(&t2, &x, &id, &opts).expect("transpose mode");
    assert_eq!(get(&m, &t2), want);
    let err = m.nc_matmul(&t2, &x, &ones, &opts).expect_err("not identity");
    assert!(err.to_string().contains("identity"), "{err}");
    // Vector engine: up to 32 x 32.
    let (v, vb) = random_tile(&mut m, "v", &[32, 20], Dtype::Fp8E4m3, 112);
    let vt = alloc(&mut m, "vt", &[20, 32], Dtype::Fp8E4m3);
    m.nc_transpose(Engine::Vector, &vt, &v).expect("dve transpose");
    assert_eq!(get(&m, &vt), transposed(&vb, 32, 20));
    let err = m.nc_transpose(Engine::Vector, &t, &x).expect_err("too big");
    assert!(err.to_string().contains("transpose_size"), "{err}");
}

// ---------------------------------------------------------------------------------- DMA

#[test]
fn dma_copies_between_hbm_and_sbuf_with_casts() {
    let mut m = core();
    let (h, host) = random_hbm(&mut m, "in", &[256, 64], 121);
    let out = m.hbm_tensor("out", &[128, 64], Dtype::Bf16, None).expect("hbm out");
    let s = alloc(&mut m, "s", &[128, 64], Dtype::Fp32);
    m.dma_copy(&s, &h.slice(&[range(128, 256)]).expect("rows"), None).expect("load");
    assert_eq!(get(&m, &s), host[128 * 64..].to_vec());
    m.dma_copy(&out, &s, Some(3)).expect("store");
    let want: Vec<u32> =
        host[128 * 64..].iter().map(|&x| output(Dtype::Bf16, input(Dtype::Fp32, x))).collect();
    assert_eq!(get(&m, &out), want);
    // A column slice of HBM (strided) into a narrower tile.
    let s2 = alloc(&mut m, "s2", &[128, 8], Dtype::Fp32);
    let cols = h.slice(&[range(0, 128), ix(Some(3), None, 8)]).expect("cols");
    m.dma_copy(&s2, &cols, None).expect("strided load");
    let want: Vec<u32> = (0..128)
        .flat_map(|r| (0..8).map(move |c| (r, 3 + 8 * c)))
        .map(|(r, c)| host[r * 64 + c])
        .collect();
    assert_eq!(get(&m, &s2), want);
    let ps = psum(&mut m, "ps", &[128, 64], Dtype::Fp32);
    let err = m.dma_copy(&ps, &h.slice(&[range(0, 128)]).expect("rows"), None).expect_err("psum");
    assert!(err.to_string().contains("[engine rule dma_memory]"), "{err}");
    let rep = m.run().expect("run");
    assert_eq!(rep.dma_bytes, (128 * 64 * 4 + 128 * 64 * 4 + 128 * 8 * 4) as u64);
}

/// A spill moves a whole SBUF tensor's bits to HBM and back, with which of them were written
/// (a partly written block stays partly written), timed as DMA and counted as spill.
#[test]
fn dma_spill_moves_bits_and_written_state_to_hbm_and_back() {
    let mut m = core();
    let (h, host) = random_hbm(&mut m, "in", &[128, 8], 122);
    let s = alloc(&mut m, "s", &[128, 16], Dtype::Fp32);
    let half = s.slice(&[range(0, 128), range(0, 8)]).expect("cols");
    m.dma_copy(&half, &h, None).expect("load half");
    let slot = m.hbm_tensor("slot", &[128, 16], Dtype::Fp32, None).expect("slot");
    m.dma_spill(&slot, &s, None).expect("spill");
    m.free(&s).expect("free");
    let back = alloc(&mut m, "back", &[128, 16], Dtype::Fp32);
    m.dma_spill(&back, &slot, None).expect("reload");
    let half = back.slice(&[range(0, 128), range(0, 8)]).expect("cols");
    assert_eq!(get(&m, &half), host);
    let out = m.hbm_tensor("out", &[128, 16], Dtype::Fp32, None).expect("out");
    let err = m.dma_copy(&out, &back, None).expect_err("unwritten half");
    assert!(err.to_string().contains("never written"), "{err}");
    let ps = psum(&mut m, "ps", &[128, 16], Dtype::Fp32);
    assert!(m.dma_spill(&slot, &ps, None).is_err());
    let rep = m.run().expect("run");
    assert_eq!(rep.spill_bytes, 2 * 128 * 16 * 4);
    assert_eq!(rep.dma_bytes, rep.spill_bytes + 128 * 8 * 4);
    assert!(rep.spill_s > 0.0 && rep.spill_s < rep.seconds, "{rep}");
}

/// An SBUF tensor [128, 16] fp32 whose first half is loaded (one DMA of HBM codes from `seed`),
/// moved to a spill slot and freed: the codes and the slot.
fn half_written_in_a_slot(m: &mut Machine, seed: u64) -> (Vec<u32>, Tile) {
    let (h, host) = random_hbm(m, "in", &[128, 8], seed);
    let s = alloc(m, "s", &[128, 16], Dtype::Fp32);
    let half = s.slice(&[range(0, 128), range(0, 8)]).expect("cols");
    m.dma_copy(&half, &h, None).expect("load half");
    let slot = m.hbm_tensor("slot", &[128, 16], Dtype::Fp32, None).expect("slot");
    m.spill_move(&slot, &s).expect("save");
    m.free(&s).expect("free");
    (host, slot)
}

/// `back` holds `host` in its first half and its second half is still never written.
fn assert_half_back(m: &mut Machine, back: &Tile, host: &[u32]) {
    let half = back.slice(&[range(0, 128), range(0, 8)]).expect("cols");
    assert_eq!(get(m, &half), host);
    let out = m.hbm_tensor("out", &[128, 16], Dtype::Fp32, None).expect("out");
    let err = m.dma_copy(&out, back, None).expect_err("unwritten half");
    assert!(err.to_string().contains("never written"), "{err}");
}

/// `spill_move` moves what `dma_spill` moves (bits, which were written) without an
/// instruction: nothing is recorded or timed.
#[test]
fn spill_move_moves_bits_and_written_state_without_an_instruction() {
    let mut m = core();
    let (host, slot) = half_written_in_a_slot(&mut m, 123);
    let back = alloc(&mut m, "back", &[128, 16], Dtype::Fp32);
    m.spill_move(&back, &slot).expect("restore");
    assert_eq!(m.instructions(), 1);
    assert_half_back(&mut m, &back, &host);
    let ps = psum(&mut m, "ps", &[128, 16], Dtype::Fp32);
    assert!(m.spill_move(&slot, &ps).is_err());
    let rep = m.run().expect("run");
    assert_eq!(rep.spill_bytes, 0);
}

/// `spill_reload` is `spill_move` into the tensor, then `dma_spill` to the slot and back: the
/// same bits, written state, instructions and times, the bytes copied once.
#[test]
fn spill_reload_is_a_move_and_two_spill_dmas() {
    let run = |reload: &dyn Fn(&mut Machine, &Tile, &Tile)| {
        let mut m = core();
        let (host, slot) = half_written_in_a_slot(&mut m, 124);
        let pad = alloc(&mut m, "pad", &[128, 4], Dtype::Fp32);
        let back = alloc(&mut m, "back", &[128, 16], Dtype::Fp32);
        reload(&mut m, &back, &slot);
        assert_eq!(m.instructions(), 3);
        assert_half_back(&mut m, &back, &host);
        m.free(&pad).expect("free");
        let rep = m.run().expect("run");
        assert_eq!(rep.spill_bytes, 2 * 128 * 16 * 4);
        (rep.seconds, rep.spill_s, rep.dma_bytes)
    };
    let once = run(&|m, back, slot| m.spill_reload(back, slot, None).expect("reload"));
    let three = run(&|m, back, slot| {
        m.spill_move(back, slot).expect("restore");
        m.dma_spill(slot, back, None).expect("store");
        m.dma_spill(back, slot, None).expect("load");
    });
    assert_eq!(once, three);
    let mut m = core();
    let s = alloc(&mut m, "s", &[128, 16], Dtype::Fp32);
    let slot = m.hbm_tensor("slot", &[128, 8], Dtype::Fp32, None).expect("slot");
    assert!(m.spill_reload(&s, &slot, None).is_err());
    assert_eq!(m.instructions(), 0);
}

/// An SBUF tensor one `dma_copy` loaded whole from an HBM input nobody has written is a copy of
/// it: moved to a slot and reloaded, it is loaded from the input again (one DMA reading what
/// the load read, counted as a reload), not stored and loaded. Once the input is written (here
/// while the tensor is out), the reload is the slot's store and load, with the bits the tensor
/// had.
#[test]
fn spill_reload_of_a_whole_copy_of_an_unwritten_input_loads_the_input_again() {
    for written in [false, true] {
        let mut m = core();
        let (h, host) = random_hbm(&mut m, "in", &[128, 16], 125);
        let s = alloc(&mut m, "s", &[128, 16], Dtype::Fp32);
        m.dma_copy(&s, &h, None).expect("load");
        let slot = m.hbm_tensor("slot", &[128, 16], Dtype::Fp32, None).expect("slot");
        m.spill_move(&slot, &s).expect("save");
        m.free(&s).expect("free");
        if written {
            let (other, _) = random_tile(&mut m, "other", &[128, 16], Dtype::Fp32, 126);
            m.dma_copy(&h, &other, None).expect("write the input");
        }
        let back = alloc(&mut m, "back", &[128, 16], Dtype::Fp32);
        let before = m.instructions();
        m.spill_reload(&back, &slot, None).expect("reload");
        assert_eq!(get(&m, &back), host);
        let rep = m.run().expect("run");
        let bytes = 128 * 16 * 4;
        if written {
            assert_eq!(m.instructions() - before, 2);
            assert_eq!(rep.spill_bytes, 2 * bytes);
        } else {
            assert_eq!(m.instructions() - before, 1);
            assert_eq!(rep.spill_bytes, bytes);
            let reload = m.program().instrs.last().expect("recorded");
            let load = &m.program().instrs[0];
            assert_eq!(m.program().reads(reload), m.program().reads(load));
        }
    }
}

// --------------------------------------------------------------------- rules and errors

#[test]
fn every_engine_rule_is_an_error_naming_rule_and_operand() {
    let mut m = core();
    let a = filled(&mut m, "a", &[128, 64], Dtype::Fp32, 1.0);
    let b = filled(&mut m, "b", &[128, 64], Dtype::Fp32, 1.0);
    let [p1, p2] = ["p1", "p2"].map(|name| {
        let p = psum(&mut m, name, &[128, 64], Dtype::Fp32);
        m.memset(Engine::Vector, &p, 0.0).expect("memset");
        p
    });
    let h =
        m.hbm_tensor("h", &[128, 64], Dtype::Fp32, Some(&vec![0u8; 128 * 64 * 4])).expect("hbm");
    let rule = |r: Result<(), Error>, rule: &str, arg: &str| {
        let err = r.expect_err(rule);
        let s = err.to_string();
        assert!(s.contains(&format!("[engine rule {rule}]")), "{rule}: {s}");
        assert!(s.starts_with(&format!("{arg}:")), "{rule} should name {arg}: {s}");
    };
    // tensor_tensor(engine, a, data1, data2, op), refused by rule `name` naming `arg`.
    let add = AluOp::Add;
    for (engine, data1, data2, op, name, arg) in [
        (Engine::Vector, &p1, &p2, add, "two_psum_inputs", "data2"),
        (Engine::Gpsimd, &p1, &b, add, "gpsimd_psum", "data1"),
        (Engine::Vector, &h, &b, add, "engine_memory", "data1"),
        (Engine::Scalar, &a, &b, add, "engine", "engine"),
        (Engine::Vector, &a, &b, AluOp::Power, "engine", "op"),
    ] {
        rule(m.tensor_tensor(engine, &a, data1, data2, op), name, arg);
    }
    let sub = |t: &Tile, s: i64, e: i64| t.slice(&[range(s, e)]).expect("slice");
    rule(
        m.tensor_copy(Engine::Vector, &sub(&a, 32, 128), &sub(&b, 32, 128)),
        "start_partition",
        "src",
    );
    rule(m.tensor_copy(Engine::Vector, &sub(&a, 0, 8), &sub(&b, 3, 11)), "start_partition", "src");
    m.tensor_copy(Engine::Vector, &sub(&a, 32, 64), &sub(&b, 0, 32)).expect("quadrant move");
    rule(m.tensor_copy(Engine::Vector, &a, &sub(&b, 0, 64)), "shape", "dst");
    // tensor_scalar of b into a on `engine`: `op0` with `operand0`, then `op1` with 1.0 if any.
    let ts = |m: &mut Machine, engine, op0, operand0: Scalar, op1: Option<AluOp>| {
        let second: Option<SecondOp> = op1.map(|o| (o, Scalar::Imm(1.0), false));
        m.tensor_scalar(engine, &a, &b, op0, &operand0, false, second.as_ref())
    };
    let mut m2 = m.clone();
    let mul = AluOp::Multiply;
    let one = || Scalar::Imm(1.0);
    rule(ts(&mut m2, Engine::Scalar, add, one(), Some(mul)), "act_tensor_scalar_ops", "op0");
    ts(&mut m2, Engine::Scalar, mul, one(), Some(add)).expect("mult+add on ACT");
    rule(ts(&mut m2, Engine::Gpsimd, add, one(), None), "engine", "engine");
    ts(&mut m2, Engine::Gpsimd, AluOp::Rsqrt, Scalar::Imm(0.0), None).expect("rsqrt on pool");
    let bf = filled(&mut m2, "bf", &[128, 1], Dtype::Bf16, 1.0);
    let bf_operand = ts(&mut m2, Engine::Vector, add, Scalar::Tile(bf), None);
    rule(bf_operand, "fp32_operand", "operand0");
    rule(m2.tensor_tensor(Engine::Vector, &a, &a, &b, AluOp::BitwiseAnd), "bitvec_dtype", "data1");
    let big = psum(&mut m2, "big", &[128, 1024], Dtype::Fp32);
    let sb = alloc(&mut m2, "sb", &[128, 1024], Dtype::Fp32);
    rule(m2.tensor_copy(Engine::Vector, &sb, &big), "psum_bank", "src");
    let wide = filled(&mut m2, "wide", &[128, 600], Dtype::Fp32, 0.5);
    let st = alloc(&mut m2, "st", &[128, 6], Dtype::Fp32);
    rule(m2.bn_stats(&st, &wide), "bn_stats_fmax", "data");
    let ps = psum(&mut m2, "ps", &[64, 64], Dtype::Fp32);
    rule(
        m2.nc_matmul(&ps, &p1.slice(&[ix(None, None, 1)]).expect("p"), &b, &PeOptions::default()),
        "matmul_memory",
        "stationary",
    );
    rule(m2.iota(&p1, &[(1, 64)], 0, 0), "gpsimd_psum", "dst");
}

#[test]
fn capacity_and_never_written_memory() {
    let mut m = core();
    let _a = alloc(&mut m, "big_a", &[128, 100_000], Dtype::Fp16);
    let err =
        m.alloc(Space::Sbuf, "too_much", &[128, 10_000], Dtype::Fp32).expect_err("over capacity");
    let s = err.to_string();
    assert!(matches!(err, Error::Capacity { .. }), "{s}");
    for needle in ["too_much", "40000 B", "12984 B", "big_a", "212984 B"] {
        assert!(s.contains(needle), "{needle} missing: {s}");
    }
    let err = m.alloc(Space::Sbuf, "parts", &[129, 4], Dtype::Fp32).expect_err("129 partitions");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    // PSUM: 16 KiB per partition.
    m.alloc(Space::Psum, "p", &[128, 4096], Dtype::Fp32).expect("all of PSUM");
    assert!(matches!(
        m.alloc(Space::Psum, "q", &[128, 1], Dtype::Fp32),
        Err(Error::Capacity { .. })
    ));
    // Reading memory nobody wrote names the tensor.
    let mut m = core();
    let a = alloc(&mut m, "unwritten", &[16, 8], Dtype::Fp32);
    let d = alloc(&mut m, "d", &[16, 8], Dtype::Fp32);
    let half = a.slice(&[Index::ALL, ix(None, Some(4), 1)]).expect("half");
    m.memset(Engine::Vector, &half, 2.0).expect("memset");
    m.tensor_copy(Engine::Vector, &d.slice(&[Index::ALL, ix(None, Some(4), 1)]).expect("d"), &half)
        .expect("written half");
    let err = m.tensor_copy(Engine::Vector, &d, &a).expect_err("unwritten");
    let s = err.to_string();
    assert!(
        s.contains("unwritten")
            && s.contains("never written")
            && s.contains("byte 16 of the tensor"),
        "{s}"
    );
    // Every other element written: reading exactly those is fine.
    let even = a.slice(&[Index::ALL, ix(None, None, 2)]).expect("even");
    m.memset(Engine::Vector, &even, 3.0).expect("even");
    let d4 = alloc(&mut m, "d4", &[16, 4], Dtype::Fp32);
    m.tensor_copy(Engine::Vector, &d4, &even).expect("even elements are written");
    // The NaN policy fills new memory with NaN instead.
    let mut m = Machine::new(MachineConfig {
        uninitialized: Uninitialized::Nan,
        ..MachineConfig::default()
    })
    .expect("machine");
    let a = alloc(&mut m, "a", &[4, 4], Dtype::Bf16);
    let d = alloc(&mut m, "d", &[4, 4], Dtype::Fp32);
    m.tensor_copy(Engine::Vector, &d, &a).expect("NaN reads");
    assert!(get(&m, &d).iter().all(|&b| b == NAN));
    // Freed tensors' tiles are refused, also once their slot holds a new tensor.
    m.free(&a).expect("free");
    let err = m.tensor_copy(Engine::Vector, &d, &a).expect_err("freed");
    assert!(err.to_string().contains("freed"), "{err}");
    let again = alloc(&mut m, "again", &[4, 4], Dtype::Bf16);
    assert_eq!(again.tensor.slot, a.tensor.slot);
    let err = m.tensor_copy(Engine::Vector, &d, &a).expect_err("stale");
    assert!(err.to_string().contains("freed"), "{err}");
    // Tiles of another core are refused.
    let other = core();
    let err = other.read_tile(&d).expect_err("other core");
    assert!(err.to_string().contains("another NeuronCore"), "{err}");
}

#[test]
fn stochastic_rounding_is_seeded_and_schedule_independent() {
    let run = |seed| {
        let mut m = Machine::new(MachineConfig {
            rounding: OutputRounding::Stochastic(seed),
            ..MachineConfig::default()
        })
        .expect("machine");
        let a = alloc(&mut m, "a", &[128, 64], Dtype::Fp32);
        let d = alloc(&mut m, "d", &[128, 64], Dtype::Bf16);
        let ab: Vec<u32> =
            (0..8192).map(|i| (1.0f32 + (i as f32) * 2f32.powi(-20)).to_bits()).collect();
        put(&mut m, &a, &ab);
        m.tensor_copy(Engine::Vector, &d, &a).expect("copy");
        get(&m, &d)
    };
    let (x, y, z) = (run(1), run(1), run(2));
    assert_eq!(x, y);
    assert_ne!(x, z);
    let ups = x.iter().filter(|&&b| b == 0x3F81).count();
    assert!(ups > 100 && ups < 8000, "{ups}");
}

// ------------------------------------------------------------------------------- timeline

#[test]
fn independent_engines_overlap_and_dependent_ones_wait() {
    let mut m = core();
    let [a, b, c] = ["a", "b", "c"].map(|name| alloc(&mut m, name, &[128, 512], Dtype::Fp32));
    m.memset(Engine::Vector, &a, 1.0).expect("0: DVE writes a");
    m.memset(Engine::Gpsimd, &b, 2.0).expect("1: POOL writes b");
    m.activation(&c, ActFunc::Exp, &a, &ActivationArgs::default()).expect("2: ACT reads a");
    let rep = m.run().expect("run");
    let (s, e) = (&rep.start_ticks, &rep.end_ticks);
    assert_eq!((s[0], s[1]), (0, 0), "different engines start together");
    assert_eq!(s[2], e[0], "ACT waits for the DVE's write of a (read after write)");
    let costs: Vec<u64> = m.program().instrs.iter().map(|i| cost::cost(i).ticks).collect();
    assert_eq!(e[2] - s[2], costs[2]);
    assert_eq!(rep.ticks, (e[0] + costs[2]).max(e[1]));
    // Write after read: POOL overwriting a waits for ACT's read.
    m.memset(Engine::Gpsimd, &a, 3.0).expect("3: WAR");
    // Write after write on b from the Vector engine.
    m.memset(Engine::Vector, &b, 4.0).expect("4: WAW");
    let rep = m.run().expect("run");
    assert_eq!(rep.start_ticks[3], rep.end_ticks[2].max(rep.end_ticks[1]));
    assert_eq!(rep.start_ticks[4], rep.end_ticks[1].max(rep.end_ticks[0]));
    assert_eq!(
        rep.critical_path.iter().map(|p| p.index).collect::<Vec<_>>(),
        vec![0, 2, 3],
        "{:?}",
        rep.critical_path
    );
}

#[test]
fn a_chain_takes_the_sum_of_its_costs_and_disjoint_partitions_do_not_wait() {
    let mut m = core();
    let a = filled(&mut m, "a", &[128, 256], Dtype::Bf16, 1.0);
    let engines = [Engine::Vector, Engine::Scalar, Engine::Gpsimd];
    for i in 0..30 {
        m.tensor_copy(engines[i % 3], &a, &a).expect("chain link");
    }
    let rep = m.run().expect("run");
    let sum: u64 = m.program().instrs.iter().map(|i| cost::cost(i).ticks).sum();
    assert_eq!(rep.ticks, sum);
    assert_eq!(rep.critical_path.len(), 31);
    // Two tiles on disjoint partitions of one tensor: no dependency.
    let mut m = core();
    let t = alloc(&mut m, "t", &[128, 64], Dtype::Fp32);
    let half = |s: i64| t.slice(&[range(s, s + 64)]).expect("half");
    m.memset(Engine::Vector, &half(0), 1.0).expect("top");
    m.memset(Engine::Gpsimd, &half(64), 1.0).expect("bottom");
    m.tensor_copy(Engine::Scalar, &half(64), &half(0)).expect("copy");
    let rep = m.run().expect("run");
    assert_eq!((rep.start_ticks[0], rep.start_ticks[1]), (0, 0));
    assert_eq!(rep.start_ticks[2], rep.end_ticks[0].max(rep.end_ticks[1]));
}

#[test]
fn results_do_not_depend_on_the_issue_order_of_independent_work() {
    let build = |order: &[usize]| {
        let mut m = core();
        let ts: Vec<Tile> =
            (0..4).map(|i| alloc(&mut m, &format!("t{i}"), &[128, 40], Dtype::Bf16)).collect();
        let outs: Vec<Tile> =
            (0..4).map(|i| alloc(&mut m, &format!("o{i}"), &[128, 40], Dtype::Fp32)).collect();
        for (i, t) in ts.iter().enumerate() {
            put(&mut m, t, &codes(Dtype::Bf16, 128 * 40, 200 + i as u64));
        }
        for &i in order {
            let e = [Engine::Vector, Engine::Gpsimd][i % 2];
            m.tensor_tensor(e, &outs[i], &ts[i], &ts[(i + 1) % 4], AluOp::Multiply).expect("tt");
        }
        let rep = m.run().expect("run");
        (outs.iter().map(|o| get(&m, o)).collect::<Vec<_>>(), rep.ticks)
    };
    let (a, ta) = build(&[0, 1, 2, 3]);
    let (b, tb) = build(&[3, 1, 2, 0]);
    assert_eq!(a, b);
    assert_eq!(ta, tb, "the same work on the same queues takes the same time");
}

#[test]
fn dma_queues_overlap_fixed_costs_and_share_engines() {
    let mut m = core();
    let h = m
        .hbm_tensor("h", &[128, 4096], Dtype::Fp32, Some(&vec![0u8; 128 * 4096 * 4]))
        .expect("hbm");
    let s = alloc(&mut m, "s", &[128, 4096], Dtype::Fp32);
    let cols = |c: i64| range(c * 1024, c * 1024 + 1024);
    for c in 0..4 {
        m.dma_copy(
            &s.slice(&[Index::ALL, cols(c)]).expect("s"),
            &h.slice(&[Index::ALL, cols(c)]).expect("h"),
            Some(c as u8),
        )
        .expect("dma");
    }
    let rep = m.run().expect("run");
    let one = cost::cost(&m.program().instrs[0]);
    assert!(rep.start_ticks.iter().all(|&t| t == 0), "four queues start together");
    assert_eq!(rep.ticks, one.fixed + 4 * one.data, "the data phases share the 16 engines");
    let trace = rep.chrome_trace_json();
    assert!(trace.contains("\"DMA queue 3\"") && trace.contains("\"name\":\"dma_copy\""));
    assert_eq!(rep.queues.iter().filter(|q| q.name.starts_with("DMA")).count(), 4);
}

#[test]
fn pe_tiles_overlap() {
    let mut m = core();
    let st = filled(&mut m, "st", &[32, 32], Dtype::Bf16, 1.0);
    let mv = filled(&mut m, "mv", &[32, 512], Dtype::Bf16, 1.0);
    let p0 = psum(&mut m, "p0", &[32, 512], Dtype::Fp32);
    let p1 = psum(&mut m, "p1", &[32, 512], Dtype::Fp32);
    let quarter = |r| PeOptions {
        tile: PeTile::from_options(Some((r, 0)), Some((32, 32))).expect("tile"),
        ..PeOptions::default()
    };
    m.clear_program();
    m.nc_matmul(&p0, &st, &mv, &quarter(0)).expect("mm0");
    m.nc_matmul(&p1, &st, &mv, &quarter(32)).expect("mm1");
    let rep = m.run_with(&timeline::Options::default()).expect("run");
    assert_eq!(rep.start_ticks, vec![0, 0], "disjoint PE tiles run together");
    assert_eq!(rep.ticks, 512 * 2);
}

// ------------------------------------------ additions for the NKI front end (issue 15)

#[test]
fn hbm_rows_transpose_and_broadcast_dma_patterns() {
    let mut m = core();
    let (h, host) = random_hbm(&mut m, "h", &[4, 3], 7);
    // Transposed: 3 rows one element apart, each of 4 elements 3 apart.
    let t = h.with_rows(3, 1).and_then(|t| t.with_pattern(&[(3, 4)], 0)).expect("pattern");
    let s = alloc(&mut m, "s", &[3, 4], Dtype::Fp32);
    m.dma_copy(&s, &t, None).expect("transposing load");
    let want: Vec<u32> =
        (0..3).flat_map(|c| (0..4).map(move |r| (r, c))).map(|(r, c)| host[r * 3 + c]).collect();
    assert_eq!(get(&m, &s), want);
    // Broadcast: row 2 repeated on 5 partitions (a step of 0).
    let row = h.slice(&[range(2, 3)]).expect("row");
    let b = row.with_rows(5, 0).expect("broadcast");
    let s5 = alloc(&mut m, "s5", &[5, 3], Dtype::Fp32);
    m.dma_copy(&s5, &b, None).expect("broadcast load");
    assert_eq!(get(&m, &s5), host[6..9].repeat(5));
    let err = s5.with_rows(2, 0).expect_err("sbuf");
    assert!(err.to_string().contains("HBM"), "{err}");
}

/// An HBM tensor is `stored` once anything may have written its bytes (an instruction, a copy
/// between memories, a host write), never by being read: a kernel's read-only arguments need
/// no read-back.
#[test]
fn an_hbm_tensor_is_stored_once_written_never_when_read() {
    let mut m = core();
    let (h, _) = random_hbm(&mut m, "in", &[128, 8], 5);
    let (g, _) = random_hbm(&mut m, "g", &[128, 8], 6);
    let s = alloc(&mut m, "s", &[128, 8], Dtype::Fp32);
    m.dma_copy(&s, &h, None).expect("load");
    m.dma_copy(
        &s,
        &h.slice(&[ix(Some(0), None, 2)]).expect("rows").with_rows(128, 0).expect("bcast"),
        None,
    )
    .expect("broadcast load");
    assert!(!m.stored(&h).expect("in"), "read only");
    m.dma_copy(
        &g.slice(&[range(0, 4)]).expect("rows"),
        &h.slice(&[range(4, 8)]).expect("rows"),
        None,
    )
    .expect("hbm to hbm");
    assert!(!m.stored(&h).expect("in"), "a source");
    assert!(m.stored(&g).expect("g"), "a destination");
    let (o, _) = random_hbm(&mut m, "o", &[4, 8], 7);
    m.write_tile(&o.slice(&[range(0, 1)]).expect("row"), &[0; 32]).expect("host write");
    assert!(m.stored(&o).expect("o"), "a host write");
    let err = m.stored(&s).expect_err("sbuf");
    assert!(err.to_string().contains("HBM"), "{err}");
}

#[test]
fn take_hbm_hands_a_whole_written_tensor_over_and_frees_it() {
    let mut m = core();
    // An output of an odd byte count (3 x 5 bf16), written by a store.
    let out = m.hbm_tensor("out", &[3, 5], Dtype::Bf16, None).expect("hbm");
    let s = filled(&mut m, "s", &[3, 5], Dtype::Bf16, -2.5);
    // Not written yet: the error names the tile, and nothing is taken.
    let err = m.take_hbm(&out).expect_err("unwritten");
    assert_eq!((err.arg(), err.rule()), (Some("tile"), Some("uninitialized_read")), "{err}");
    m.dma_copy(&out, &s, None).expect("store");
    let want = m.read_tile(&out).expect("read");
    // A view (one row), an SBUF tile: not whole HBM tensors, so nothing is done.
    assert!(m.take_hbm(&out.slice(&[range(1, 2)]).expect("row")).expect("view").is_none());
    assert!(m.take_hbm(&s).expect("sbuf").is_none());
    let (words, r) = m.take_hbm(&out).expect("take").expect("whole");
    assert_eq!(r.len(), 30);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(&bytes[r.clone()], &want[..], "the bytes read_tile gives");
    assert_eq!(bytes.as_ptr() as usize % 4, 0);
    assert_eq!((words.as_ptr() as usize + r.start) % 64, 0, "a cache line");
    // The tensor is gone: a second take or a read is an error naming the tile.
    for err in [m.take_hbm(&out).expect_err("taken"), m.read_tile(&out).expect_err("read")] {
        assert!(matches!(err, Error::Value { ref arg, .. } if arg == "tile"), "{err}");
    }
    // The machine goes on: a new tensor of the same shape holds its own data.
    let data: Vec<u8> = (0..30).collect();
    let again = m.hbm_tensor("again", &[3, 5], Dtype::Bf16, Some(&data)).expect("hbm");
    assert_eq!(m.read_tile(&again).expect("read"), data);
}

#[test]
fn written_ranges_of_an_output() {
    let mut m = core();
    let out = m.hbm_tensor("out", &[4, 8], Dtype::Bf16, None).expect("hbm");
    assert!(m.written_ranges(&out).expect("ranges").is_empty());
    let s = filled(&mut m, "s", &[2, 8], Dtype::Bf16, 1.0);
    let rows = range(1, 3);
    m.dma_copy(&out.slice(&[rows]).expect("rows"), &s, None).expect("store");
    assert_eq!(m.written_ranges(&out).expect("ranges"), vec![(16, 48)]);
    let err = m.written_ranges(&s).expect_err("sbuf");
    assert!(err.to_string().contains("HBM"), "{err}");
}

#[test]
fn writers_of_an_hbm_tensor_name_the_last_writing_instruction() {
    let mut m = core();
    let out = m.hbm_tensor("out", &[4, 8], Dtype::Bf16, None).expect("hbm");
    assert_eq!(m.writers(&out).expect("writers"), None, "kept only when asked");
    m.track_writers(&out).expect("track");
    let none = trn2core::machine::memory::NO_WRITER;
    assert_eq!(m.writers(&out).expect("writers"), Some(vec![none; 64]));
    let s = filled(&mut m, "s", &[2, 8], Dtype::Bf16, 1.0);
    let first = m.instructions() as u32;
    m.dma_copy(&out.slice(&[range(1, 3)]).expect("rows"), &s, None).expect("store");
    // Every other row (strided): rows 0 and 2; row 2 now last written by this store.
    let strided = out.slice(&[ix(Some(0), Some(4), 2)]).expect("rows");
    m.dma_copy(&strided, &s, None).expect("store");
    let w = m.writers(&out).expect("writers").expect("kept");
    let row = |r: usize| w[r * 16..(r + 1) * 16].to_vec();
    assert_eq!((row(0), row(1)), (vec![first + 1; 16], vec![first; 16]));
    assert_eq!((row(2), row(3)), (vec![first + 1; 16], vec![none; 16]));
    // A write outside any instruction has no writer.
    m.write_tile(&out.slice(&[range(0, 1)]).expect("row"), &[0; 16]).expect("write");
    assert_eq!(m.writers(&out).expect("writers").expect("kept")[..16], [none; 16]);
    let err = m.track_writers(&s).expect_err("sbuf");
    assert!(err.to_string().contains("HBM"), "{err}");
}

#[test]
fn loop_carried_reads_are_found_and_independent_iterations_are_not() {
    let mut m = core();
    let acc = alloc(&mut m, "acc", &[128, 64], Dtype::Fp32);
    let x = alloc(&mut m, "x", &[128, 4, 64], Dtype::Fp32);
    m.memset(Engine::Vector, &acc, 0.0).expect("memset");
    m.memset(Engine::Gpsimd, &x, 1.0).expect("memset");
    let col = |i: i64| x.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    // Independent: iteration i reads x[:, i] (written before the loop), writes x[:, i].
    let start = m.instructions();
    let mut its = Vec::new();
    for i in 0..4 {
        its.push(m.instructions());
        m.tensor_scalar(
            Engine::Vector,
            &col(i),
            &col(i),
            AluOp::Multiply,
            &Scalar::Imm(2.0),
            false,
            None,
        )
        .expect("scale");
    }
    assert!(m.carried_reads(&its, m.instructions(), 8).expect("ok").is_empty());
    assert_eq!(its[0], start);
    // Carried: iteration i reads x[:, i - 1], written by iteration i - 1.
    let mut its = Vec::new();
    for i in 0..4 {
        its.push(m.instructions());
        m.tensor_copy(Engine::Vector, &col(i), &col((i + 3) % 4)).expect("copy");
    }
    let pairs = m.carried_reads(&its, m.instructions(), 8).expect("ok");
    assert_eq!(
        pairs,
        vec![
            (its[1] as u32, its[0] as u32),
            (its[2] as u32, its[1] as u32),
            (its[3] as u32, its[2] as u32)
        ]
    );
    // An accumulation reads what the previous iteration wrote: reported (the caller decides).
    let mut its = Vec::new();
    for i in 0..3 {
        its.push(m.instructions());
        m.tensor_tensor(Engine::Vector, &acc, &acc, &col(i), AluOp::Add).expect("acc");
    }
    let pairs = m.carried_reads(&its, m.instructions(), 1).expect("ok");
    assert_eq!(pairs, vec![(its[1] as u32, its[0] as u32)]);
    assert!(m.carried_reads(&[5, 2], 6, 1).is_err());
}

/// A machine holding a stationary `[128, k, M]` and a moving `[128, k, N]` SBUF tile of
/// pseudo-random codes, for the matmul queue's tests.
fn pe_operands(
    k: usize, (sm, sd): (usize, Dtype), (mn, md): (usize, Dtype),
) -> (Machine, Tile, Tile) {
    let mut m = core();
    let st = alloc(&mut m, "st", &[128, k, sm], sd);
    let mv = alloc(&mut m, "mv", &[128, k, mn], md);
    m.write_tile(&st, &to_bytes(sd, &codes(sd, 128 * k * sm, 3))).expect("st");
    m.write_tile(&mv, &to_bytes(md, &codes(md, 128 * k * mn, 4))).expect("mv");
    (m, st, mv)
}

/// A settle interrupted at once (Ctrl-C): `Interrupted`, and the queue still holds work.
fn interrupted_settle(m: &mut Machine) {
    let token = trn2core::cancel::Cancel::new();
    token.cancel();
    let e = token.install(|| m.settle()).expect_err("interrupted");
    assert!(matches!(e, Error::Interrupted), "{e}");
    assert!(m.has_queued_work());
}

#[test]
fn a_cancelled_settle_keeps_its_unwritten_chains_queued() {
    // Ctrl-C during a settle: PSUM must not show a destination's older values as if its queued
    // matmuls had run. The chains not written go back in the queue; the next settle gives the
    // bits of an uninterrupted one.
    let setup = || {
        let (mut m, st, mv) = pe_operands(2, (64, Dtype::Bf16), (80, Dtype::Bf16));
        let p = psum(&mut m, "p", &[64, 80], Dtype::Fp32);
        (m, st, mv, p)
    };
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let fresh = PeOptions { accumulate: Some(false), ..PeOptions::default() };
    let acc = PeOptions { accumulate: Some(true), ..PeOptions::default() };
    let run = |m: &mut Machine, st: &Tile, mv: &Tile, p: &Tile, cancelled: bool| {
        // One settled chain, then a new one into the same tile, queued.
        m.nc_matmul(p, &slice(st, 0), &slice(mv, 0), &fresh).expect("first");
        let before = get(m, p);
        m.nc_matmul_queued(p, &slice(st, 1), &slice(mv, 1), &fresh).expect("queued");
        m.nc_matmul_queued(p, &slice(st, 0), &slice(mv, 1), &acc).expect("queued");
        if cancelled {
            interrupted_settle(m);
            // Both wait again (the machine refuses reads until they are settled).
            assert_eq!(m.queued_matmuls(), 2);
        }
        m.settle().expect("settle");
        assert_eq!(m.queued_matmuls(), 0);
        let after = get(m, p);
        assert_ne!(after, before);
        after
    };
    let (mut a, sta, mva, pa) = setup();
    let (mut b, stb, mvb, pb) = setup();
    assert_eq!(run(&mut a, &sta, &mva, &pa, false), run(&mut b, &stb, &mvb, &pb, true));
}

/// `tensor_tensor(dst, data1, data2, add)` on the Vector engine through the instruction table
/// (where it may wait behind queued matmuls).
fn issue_add(m: &mut Machine, dst: &Tile, data1: &Tile, data2: &Tile) -> trn2core::Result<()> {
    use trn2core::machine::isa::table::{Kind, Value};
    let op = Value::name(Kind::Alu, "op", "add")?;
    let tiles = [dst, data1, data2].map(|t| Some(Value::Tile(*t)));
    let [d, a, b] = tiles;
    m.issue(trn2core::machine::Opcode::TensorTensor, vec![None, d, a, b, Some(op)])
}

/// A blocked-matmul step as NKI kernels write it, on machine `m`: for each of two PSUM tiles
/// in turn (allocated, freed after use), a chain of two matmuls into it and its sum added into
/// an SBUF accumulator; then a matmul whose stationary operand is the accumulator (what the
/// waiting additions write). `settle_each`: settle before every addition (no waiting). Returns
/// (accumulator, last PSUM tile) bits, and whether additions waited in the queue.
fn blocked_step(
    m: &mut Machine, st: &Tile, mv: &Tile, settle_each: bool,
) -> (Vec<u32>, Vec<u32>, bool) {
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let acc = alloc(m, "acc", &[96, 200], Dtype::Fp32);
    put(m, &acc, &vec![0x3F80_0000; 96 * 200]);
    let mv96 = alloc(m, "mvf", &[96, 200], Dtype::Fp32);
    put(m, &mv96, &codes(Dtype::Fp32, 96 * 200, 9));
    let mut waited = false;
    for i in 0..2 {
        let p = psum(m, "part", &[96, 200], Dtype::Fp32);
        for k in 0..2 {
            let opts = PeOptions { accumulate: Some(k > 0), ..PeOptions::default() };
            m.nc_matmul_queued(&p, &slice(st, i * 2 + k), &slice(mv, 3 - i - k), &opts)
                .expect("queued");
        }
        if settle_each {
            m.settle().expect("settle");
        }
        issue_add(m, &acc, &acc, &p).expect("add");
        waited |= m.has_queued_work();
        m.free(&p).expect("free");
    }
    // A matmul reading the accumulator: the additions run first.
    let q = psum(m, "q", &[96, 200], Dtype::Fp32);
    let acc_st = acc.slice(&[Index::ALL, range(0, 96)]).expect("acc as stationary");

    m.nc_matmul_queued(&q, &acc_st, &mv96, &PeOptions::default()).expect("reads acc");
    m.settle().expect("settle");
    assert!(!m.has_queued_work());
    (get(m, &acc), get(m, &q), waited)
}

#[test]
fn which_issues_run_without_settling() {
    use trn2core::machine::isa::table::{Kind, Value};
    use trn2core::machine::Opcode;
    let (mut m, st, mv) = pe_operands(2, (64, Dtype::Bf16), (80, Dtype::Bf16));
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let p = psum(&mut m, "p", &[64, 80], Dtype::Fp32);
    let acc = alloc(&mut m, "acc", &[64, 80], Dtype::Fp32);
    let half = alloc(&mut m, "half", &[64, 80], Dtype::Bf16);
    let t = |x: &Tile| Some(Value::Tile(*x));
    let add = || Some(Value::name(Kind::Alu, "op", "add").expect("add"));
    let mm = |s: &Tile, v: &Tile| vec![t(&p), t(s), t(v)];
    let tt = |d: &Tile, a: &Tile, b: &Tile| vec![None, t(d), t(a), t(b), add()];
    // A matmul read straight from SBUF; a tensor_tensor settles while none waits.
    assert!(m.issues_without_settling(Opcode::NcMatmul, &mm(&slice(&st, 0), &slice(&mv, 0))));
    assert!(!m.issues_without_settling(Opcode::TensorTensor, &tt(&acc, &acc, &p)));
    m.nc_matmul_queued(&p, &slice(&st, 0), &slice(&mv, 0), &PeOptions::default()).expect("mm");
    // Float32 into SBUF waits; into bf16 it settles; so does anything else, or a bad argument.
    assert!(m.issues_without_settling(Opcode::TensorTensor, &tt(&acc, &acc, &p)));
    assert!(!m.issues_without_settling(Opcode::TensorTensor, &tt(&half, &acc, &p)));
    assert!(!m.issues_without_settling(Opcode::TensorTensor, &[None, t(&acc)]));
    assert!(!m.issues_without_settling(Opcode::Memset, &[t(&acc)]));
    issue_add(&mut m, &acc, &acc, &p).expect_err("acc was never written");
    put_after_settle(&mut m, &acc);
    m.nc_matmul_queued(&p, &slice(&st, 1), &slice(&mv, 1), &PeOptions::default()).expect("mm");
    issue_add(&mut m, &acc, &acc, &p).expect("waits");
    assert_eq!(m.queued_matmuls(), 1);
    // A matmul reading what the waiting addition writes settles first.
    let acc_st = acc.slice(&[Index::ALL, range(0, 64)]).expect("acc as stationary");
    assert!(!m.issues_without_settling(Opcode::NcMatmul, &mm(&acc_st, &acc)));
}

/// Settles, then fills `t` with zeros.
fn put_after_settle(m: &mut Machine, t: &Tile) {
    m.settle().expect("settle");
    put(m, t, &vec![0; t.elements()]);
}

#[test]
fn a_tensor_tensor_waits_behind_queued_matmuls_with_the_same_bits() {
    let setup = || pe_operands(4, (96, Dtype::Bf16), (200, Dtype::Bf16));
    let (mut a, sta, mva) = setup();
    let (mut b, stb, mvb) = setup();
    let (acc_a, q_a, waited_a) = blocked_step(&mut a, &sta, &mva, true);
    let (acc_b, q_b, waited_b) = blocked_step(&mut b, &stb, &mvb, false);
    assert!(!waited_a && waited_b);
    assert_eq!(acc_a, acc_b);
    assert_eq!(q_a, q_b);
    assert_ne!(acc_a, vec![0x3F80_0000; 96 * 200]);
    // The same instructions, in the same order.
    let ops = |m: &Machine| m.program().instrs.iter().map(|i| i.opcode).collect::<Vec<_>>();
    assert_eq!(ops(&a), ops(&b));
}

#[test]
fn a_cancelled_settle_keeps_its_waiting_tensor_tensors() {
    let (mut a, sta, mva) = pe_operands(2, (64, Dtype::Bf16), (80, Dtype::Bf16));
    let (mut b, stb, mvb) = pe_operands(2, (64, Dtype::Bf16), (80, Dtype::Bf16));
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let run = |m: &mut Machine, st: &Tile, mv: &Tile, cancelled: bool| {
        let acc = alloc(m, "acc", &[64, 80], Dtype::Fp32);
        put(m, &acc, &vec![0; 64 * 80]);
        for i in 0..2 {
            let p = psum(m, "p", &[64, 80], Dtype::Fp32);
            m.nc_matmul_queued(&p, &slice(st, i), &slice(mv, 1 - i), &PeOptions::default())
                .expect("queued");
            issue_add(m, &acc, &acc, &p).expect("waits");
            m.free(&p).expect("retired");
            // A retired tensor is gone for every use.
            assert!(m.check_tile("p", &p).is_err());
        }
        assert_eq!(m.queued_matmuls(), 2);
        if cancelled {
            interrupted_settle(m);
            assert_eq!(m.queued_matmuls(), 2);
        }
        m.settle().expect("settle");
        get(m, &acc)
    };
    let want = run(&mut a, &sta, &mva, false);
    assert_ne!(want, vec![0; 64 * 80]);
    assert_eq!(run(&mut b, &stb, &mvb, true), want);
}

#[test]
fn retired_psum_is_given_back_when_an_allocation_needs_it() {
    // Eight banks: a tile freed while a matmul into it waits keeps its bank until the queue is
    // settled; the allocation that needs the bank settles the queue and gets it.
    let (mut m, st, mv) = pe_operands(1, (128, Dtype::Bf16), (512, Dtype::Bf16));
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let acc = alloc(&mut m, "acc", &[128, 512], Dtype::Fp32);
    put(&mut m, &acc, &vec![0; 128 * 512]);
    let mut banks = Vec::new();
    for _ in 0..9 {
        let p = psum(&mut m, "p", &[128, 512], Dtype::Fp32);
        banks.push(p.offset);
        m.nc_matmul_queued(&p, &slice(&st, 0), &slice(&mv, 0), &PeOptions::default())
            .expect("queued");
        issue_add(&mut m, &acc, &acc, &p).expect("waits");
        m.free(&p).expect("free");
    }
    // The first eight took the eight banks; the ninth settled the queue and reused the first.
    let distinct: std::collections::BTreeSet<_> = banks[..8].iter().collect();
    assert_eq!(distinct.len(), 8);
    assert_eq!(banks[8], banks[0]);
    assert_eq!(m.queued_matmuls(), 1);
    m.settle().expect("settle");
    // Nine times the same product, added in fp32 from zero, against one product times nine.
    let one = {
        let (mut n, st1, mv1) = pe_operands(1, (128, Dtype::Bf16), (512, Dtype::Bf16));
        let p = psum(&mut n, "p", &[128, 512], Dtype::Fp32);
        n.nc_matmul(&p, &slice(&st1, 0), &slice(&mv1, 0), &PeOptions::default()).expect("mm");
        get(&n, &p)
    };
    let want: Vec<u32> =
        one.iter().map(|&b| (0..9).fold(0f32, |s, _| s + f32::from_bits(b)).to_bits()).collect();
    assert_eq!(get(&m, &acc), want);
}

#[test]
fn queued_matmuls_settle_to_the_bits_of_one_at_a_time() {
    // Two machines with the same data: one issues matmuls one at a time, the other queues them
    // (an accumulation group of 4 into one PSUM tile, then one into another tile, then an
    // overwrite of the first) and settles; PSUM and the recorded programs must agree.
    let setup = || {
        let (mut m, st, mv) = pe_operands(4, (96, Dtype::Bf16), (200, Dtype::Fp16));
        let p = psum(&mut m, "p", &[96, 200], Dtype::Fp32);
        let q = psum(&mut m, "q", &[96, 200], Dtype::Fp32);
        (m, st, mv, p, q)
    };
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let ops = |st: &Tile, mv: &Tile, p: &Tile, q: &Tile| {
        let mut v: Vec<(Tile, Tile, Tile, PeOptions)> =
            (0..4).map(|k| (*p, slice(st, k), slice(mv, k), PeOptions::default())).collect();
        v.push((*q, slice(st, 1), slice(mv, 2), PeOptions::default()));
        let overwrite = PeOptions { accumulate: Some(false), ..PeOptions::default() };
        v.push((*p, slice(st, 3), slice(mv, 0), overwrite));
        v
    };
    let (mut a, sta, mva, pa, qa) = setup();
    for (d, s, m, o) in ops(&sta, &mva, &pa, &qa) {
        a.nc_matmul(&d, &s, &m, &o).expect("one at a time");
    }
    let (mut b, stb, mvb, pb, qb) = setup();
    for (d, s, m, o) in ops(&stb, &mvb, &pb, &qb) {
        b.nc_matmul_queued(&d, &s, &m, &o).expect("queued");
    }
    assert_eq!(b.queued_matmuls(), 6);
    b.settle().expect("settle");
    assert_eq!(b.queued_matmuls(), 0);
    assert_eq!(get(&a, &pa), get(&b, &pb));
    assert_eq!(get(&a, &qa), get(&b, &qb));
    assert_eq!(a.program().instrs, b.program().instrs);
    // An accumulation group continues across a settle.
    let acc = PeOptions { accumulate: Some(true), ..PeOptions::default() };
    a.nc_matmul(&qa, &slice(&sta, 0), &slice(&mva, 0), &acc).expect("acc");
    b.nc_matmul_queued(&qb, &slice(&stb, 0), &slice(&mvb, 0), &acc).expect("acc queued");
    b.settle().expect("settle");
    assert_eq!(get(&a, &qa), get(&b, &qb));
}

#[test]
fn settled_chains_equal_a_scalar_fma_oracle() {
    // Queued matmuls in random chains into three PSUM destinations (two of them overlapping),
    // from operands the settle reads straight from SBUF (bf16, fp8, fp16 with a step of 2, K of
    // 64 and 128) and from gathered values (tf32 with fp32), against an oracle written out
    // here: each instruction's sums are FMAs from +0.0 in ascending k, then overwrite or one
    // fp32 add onto PSUM, NaN canonical; accumulate=None follows the per-slot matmul bits.
    let mut m = core();
    let stb = alloc(&mut m, "stb", &[128, 4, 64], Dtype::Bf16);
    let mv8 = alloc(&mut m, "mv8", &[128, 4, 96], Dtype::Fp8E4m3);
    let mvh = alloc(&mut m, "mvh", &[128, 192], Dtype::Fp16);
    let stf = alloc(&mut m, "stf", &[128, 2, 64], Dtype::Tf32);
    let mvf = alloc(&mut m, "mvf", &[128, 2, 96], Dtype::Fp32);
    for (i, t) in [stb, mv8, mvh, stf, mvf].iter().enumerate() {
        put(&mut m, t, &codes(t.dtype, t.elements(), 70 + i as u64));
    }
    let p = psum(&mut m, "p", &[64, 96], Dtype::Fp32);
    let q = psum(&mut m, "q", &[64, 96], Dtype::Fp32);
    let r = |a: i64, b: i64, step: i64| ix(Some(a), Some(b), step);
    let sub = p.slice(&[r(0, 32, 1), r(0, 48, 1)]).expect("p_sub");
    // Host oracle: PSUM values and matmul bits of p and q ([64, 96] each).
    let mut host = [vec![0f32; 64 * 96], vec![0f32; 64 * 96]];
    let mut mm = [vec![false; 64 * 96], vec![false; 64 * 96]];
    let vals = |m: &Machine, t: &Tile| -> Vec<f32> {
        get(m, t).iter().map(|&b| input(t.dtype, b)).collect()
    };
    let mut ops = Vec::new();
    for i in 0..60u64 {
        let h = mix64(i ^ 0x5eed);
        let (dst, which, rows, cols) = match h % 3 {
            0 => (p, 0, 64usize, 96usize),
            1 => (q, 1, 64, 96),
            _ => (sub, 0, 32, 48),
        };
        let k = ((h >> 8) % 4) as i64;
        let kk: i64 = if (h >> 12).is_multiple_of(3) { 64 } else { 128 };
        let (st, mv) = match (h >> 16) % 3 {
            0 => (
                stb.slice(&[r(0, kk, 1), Index::At(k), r(0, rows as i64, 1)]),
                mv8.slice(&[r(0, kk, 1), Index::At(k), r(0, cols as i64, 1)]),
            ),
            1 => (
                stb.slice(&[r(0, kk, 1), Index::At(k), r(0, rows as i64, 1)]),
                mvh.slice(&[r(0, kk, 1), r(1, 1 + 2 * cols as i64, 2)]),
            ),
            _ => (
                stf.slice(&[r(0, kk, 1), Index::At(k % 2), r(0, rows as i64, 1)]),
                mvf.slice(&[r(0, kk, 1), Index::At(k % 2), r(0, cols as i64, 1)]),
            ),
        };
        let (st, mv) = (st.expect("st"), mv.expect("mv"));
        let acc_opt = if (h >> 20).is_multiple_of(6) { Some(false) } else { None };
        let settle_after = (h >> 24).is_multiple_of(8);
        let (sv, vv) = (vals(&m, &st), vals(&m, &mv));
        ops.push((dst, which, rows, cols, kk as usize, st, mv, acc_opt, settle_after, sv, vv));
    }
    let mut longest = 0;
    let mut run = 0;
    for (dst, which, rows, cols, kk, st, mv, acc_opt, settle_after, sv, vv) in &ops {
        let (which, rows, cols) = (*which, *rows, *cols);
        let slots: Vec<usize> = (0..rows * cols).map(|e| (e / cols) * 96 + e % cols).collect();
        let acc = acc_opt.unwrap_or_else(|| slots.iter().all(|&s| mm[which][s]));
        for (e, &s) in slots.iter().enumerate() {
            let (row, col) = (e / cols, e % cols);
            let mut sum = 0f32;
            for x in 0..*kk {
                sum = sv[x * rows + row].mul_add(vv[x * cols + col], sum);
            }
            let v = if acc { host[which][s] + sum } else { sum };
            host[which][s] = canon(v);
            mm[which][s] = true;
        }
        let opts = PeOptions { accumulate: *acc_opt, ..PeOptions::default() };
        m.nc_matmul_queued(dst, st, mv, &opts).expect("queued");
        run += 1;
        longest = longest.max(run);
        if *settle_after {
            m.settle().expect("settle");
            run = 0;
        }
    }
    assert!(longest >= 8, "queues of {longest}");
    m.settle().expect("settle");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_bits(&get(&m, &p), &bits(&host[0]), "p");
    assert_bits(&get(&m, &q), &bits(&host[1]), "q");
}

#[test]
fn one_matmul_settled_in_place_gives_the_oracles_bits_and_a_cancel_leaves_psum_as_it_was() {
    // A chain of one matmul into dense float32 PSUM rows is computed in place (no copy of the
    // destination gathered and written back), with the duo helper at 128 x 128 x 512: an
    // overwrite, then accumulations, each settled alone, against the scalar FMA oracle. A
    // settle cancelled before it computes leaves the accumulating matmul queued and PSUM
    // unchanged (never half added): the next settle adds it once, to the oracle's bits.
    let (k, rows, cols) = (128usize, 128usize, 512usize);
    let (mut m, st, mv) = pe_operands(2, (rows, Dtype::Bf16), (cols, Dtype::Bf16));
    let p = psum(&mut m, "p", &[rows, cols], Dtype::Fp32);
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let vals = |m: &Machine, t: &Tile| -> Vec<f32> {
        get(m, t).iter().map(|&b| input(t.dtype, b)).collect()
    };
    // The oracle's PSUM after a matmul of stationary `si` and moving `vi` (overwrite or add).
    let mut host = vec![0f32; rows * cols];
    let mut oracle = |m: &Machine, si: i64, vi: i64, acc: bool| {
        let (sv, vv) = (vals(m, &slice(&st, si)), vals(m, &slice(&mv, vi)));
        for (e, h) in host.iter_mut().enumerate() {
            let (row, col) = (e / cols, e % cols);
            let mut sum = 0f32;
            for x in 0..k {
                sum = sv[x * rows + row].mul_add(vv[x * cols + col], sum);
            }
            *h = canon(if acc { *h + sum } else { sum });
        }
        host.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    let fresh = PeOptions { accumulate: Some(false), ..PeOptions::default() };
    let acc = PeOptions { accumulate: Some(true), ..PeOptions::default() };
    m.nc_matmul_queued(&p, &slice(&st, 0), &slice(&mv, 0), &fresh).expect("queued");
    m.settle().expect("settle");
    assert_bits(&get(&m, &p), &oracle(&m, 0, 0, false), "overwrite");
    m.nc_matmul_queued(&p, &slice(&st, 1), &slice(&mv, 1), &acc).expect("queued");
    m.settle().expect("settle");
    let once = oracle(&m, 1, 1, true);
    assert_bits(&get(&m, &p), &once, "accumulated once");
    m.nc_matmul_queued(&p, &slice(&st, 0), &slice(&mv, 1), &acc).expect("queued");
    interrupted_settle(&mut m);
    assert_eq!(m.queued_matmuls(), 1);
    m.settle().expect("settle");
    let twice = oracle(&m, 0, 1, true);
    assert_ne!(twice, once);
    assert_bits(&get(&m, &p), &twice, "accumulated after the cancelled settle");
}

#[test]
fn a_trace_written_in_pieces_is_the_whole_trace_and_stops_when_cancelled() {
    use trn2core::cancel::Cancel;
    use trn2core::machine::timeline::TRACE_CHUNK;
    let mut m = core();
    let h = m.hbm_tensor("h", &[128, 8], Dtype::Fp32, Some(&vec![0u8; 128 * 8 * 4])).expect("hbm");
    let a = alloc(&mut m, "a", &[128, 8], Dtype::Fp32);
    let b = alloc(&mut m, "b", &[128, 8], Dtype::Fp32);
    m.dma_copy(&a, &h, None).expect("dma");
    // Enough instructions for several pieces (about 200 bytes of JSON each).
    for _ in 0..20_000 {
        m.tensor_copy(Engine::Vector, &b, &a).expect("copy");
    }
    let rep = m.run().expect("run");
    let whole = rep.chrome_trace_json();
    assert!(whole.len() > 3 * TRACE_CHUNK, "{}", whole.len());
    let mut pieces: Vec<String> = Vec::new();
    rep.write_chrome_trace(&Cancel::new(), &mut |p| {
        pieces.push(p.to_owned());
        Ok(())
    })
    .expect("write");
    assert!(pieces.len() > 3, "{}", pieces.len());
    // Each piece is handed on once it reaches TRACE_CHUNK: at most one event beyond it.
    assert!(pieces.iter().all(|p| p.len() < TRACE_CHUNK + 4096));
    assert_eq!(pieces.concat(), whole);
    // A cancelled token stops the writer at its first check, before anything is handed on.
    let cancelled = Cancel::new();
    cancelled.cancel();
    let mut handed = 0;
    let r = rep.write_chrome_trace(&cancelled, &mut |_| {
        handed += 1;
        Ok(())
    });
    assert_eq!(r, Err(Error::Interrupted));
    assert_eq!(handed, 0);
    // The sink's own error ends the write at once.
    let mut calls = 0;
    let r = rep.write_chrome_trace(&Cancel::new(), &mut |_| {
        calls += 1;
        Err(Error::value("path", "disk full"))
    });
    assert!(matches!(r, Err(Error::Value { .. })) && calls == 1, "{r:?}");
}

/// `has_room` says whether `alloc` would find room, without making its error: false exactly
/// when the allocation is the `CapacityError` of no room.
#[test]
fn has_room_is_whether_alloc_finds_room() {
    let mut m = core();
    let big = alloc(&mut m, "big", &[128, 50_000], Dtype::Fp32); // 200,000 B per partition
    for (space, shape) in [(Space::Sbuf, &[128, 4000][..]), (Space::Psum, &[128, 512][..])] {
        let room = m.has_room(space, shape, Dtype::Fp32);
        assert_eq!(room, m.alloc(space, "t", shape, Dtype::Fp32).is_ok(), "{space:?}");
    }
    assert!(!m.has_room(Space::Sbuf, &[128, 4000], Dtype::Fp32));
    assert!(m.has_room(Space::Sbuf, &[64, 100], Dtype::Fp32));
    // Errors other than room are the allocation's own: has_room does not stand for them.
    assert!(m.has_room(Space::Sbuf, &[129, 4], Dtype::Fp32));
    assert!(m.has_room(Space::Sbuf, &[], Dtype::Fp32));
    assert!(m.has_room(Space::Hbm, &[128, 4], Dtype::Fp32));
    m.free(&big).expect("free");
    assert!(m.has_room(Space::Sbuf, &[128, 4000], Dtype::Fp32));
    assert!(m.alloc(Space::Sbuf, "t", &[128, 4000], Dtype::Fp32).is_ok());
}

#[test]
fn last_uses_and_a_given_up_tensor() {
    let mut m = core();
    let a = filled(&mut m, "a", &[128, 64], Dtype::Fp32, 1.0); // instruction 0 (memset)
    let b = filled(&mut m, "b", &[128, 64], Dtype::Fp32, 2.0); // 1
    let c = alloc(&mut m, "c", &[128, 64], Dtype::Fp32);
    m.tensor_tensor(Engine::Vector, &c, &a, &a, AluOp::Add).expect("2");
    let half = a.slice(&[Index::ALL, range(0, 32)]).expect("view");
    assert_eq!(m.last_uses(&[a, b, c, half], 0), vec![2, 1, 2, 2]);
    // From `since` on only: b's last use (1) is before 2.
    assert_eq!(m.last_uses(&[a, b, c, half], 2), vec![2, -1, 2, 2]);
    assert_eq!(m.last_uses(&[a, b], 3), vec![-1, -1]);
    assert_eq!(m.last_uses(&[a], 99), vec![-1]);
    // The live tensors of a memory touched from `since` on, found without naming them.
    let mut seen = m.touched_since(Space::Sbuf, 1);
    seen.sort_by_key(|&(id, _)| id.slot);
    assert_eq!(seen, vec![(a.tensor, 2), (b.tensor, 1), (c.tensor, 2)]);
    assert_eq!(m.touched_since(Space::Sbuf, 2).len(), 2);
    assert!(m.touched_since(Space::Sbuf, 3).is_empty());
    assert!(m.touched_since(Space::Psum, 0).is_empty());
    assert!(m.touched_since(Space::Hbm, 0).is_empty());
    // Given up: a later use is the CapacityError the front end gave, under its rule.
    m.give_up(&b, "b: used after its storage was given to d", "psum_capacity").expect("give up");
    let e = m.tensor_tensor(Engine::Vector, &c, &b, &a, AluOp::Add).expect_err("gone");
    assert!(matches!(e, Error::Capacity { .. }), "{e}");
    assert_eq!(e.arg(), Some("data1"));
    assert_eq!(e.rule(), Some("psum_capacity"));
    assert!(e.to_string().contains("given to d"), "{e}");
    assert_eq!(m.last_uses(&[b], 0), vec![-1]);
    // A plain free stays the usual error; an unknown rule is refused.
    m.free(&c).expect("free");
    let e = m.tensor_tensor(Engine::Vector, &a, &c, &a, AluOp::Add).expect_err("freed");
    assert!(matches!(e, Error::Value { .. }) && e.to_string().contains("was freed"), "{e}");
    assert!(m.give_up(&a, "x", "nonsense").is_err());
}

/// Two chains into two PSUM tiles queued with an addition between them that reads the second
/// tile, then (`later`) an addition reading both: the bits of settling before each addition.
/// A wave computes chains straight into PSUM at once only where no waiting addition between
/// them reads a destination a later chain of the wave overwrites (here the first addition must
/// see the second tile's older values).
#[test]
fn chains_computed_in_place_keep_the_additions_between_them_in_order() {
    let slice = |t: &Tile, i: i64| t.slice(&[Index::ALL, Index::At(i)]).expect("slice");
    let fresh = PeOptions { accumulate: Some(false), ..PeOptions::default() };
    let run = |settle_each: bool, between: bool| {
        let (mut m, st, mv) = pe_operands(4, (64, Dtype::Bf16), (80, Dtype::Bf16));
        let (p0, p1) = (
            psum(&mut m, "p0", &[64, 80], Dtype::Fp32),
            psum(&mut m, "p1", &[64, 80], Dtype::Fp32),
        );
        let acc = alloc(&mut m, "acc", &[64, 80], Dtype::Fp32);
        put(&mut m, &acc, &vec![0x3F80_0000; 64 * 80]);
        // p1's older values.
        m.nc_matmul(&p1, &slice(&st, 3), &slice(&mv, 3), &fresh).expect("older");
        m.nc_matmul_queued(&p0, &slice(&st, 0), &slice(&mv, 1), &fresh).expect("p0");
        if between {
            if settle_each {
                m.settle().expect("settle");
            }
            issue_add(&mut m, &acc, &acc, &p1).expect("reads the older p1");
        }
        m.nc_matmul_queued(&p1, &slice(&st, 2), &slice(&mv, 0), &fresh).expect("p1");
        if settle_each {
            m.settle().expect("settle");
        }
        issue_add(&mut m, &acc, &acc, &p0).expect("reads p0");
        issue_add(&mut m, &acc, &acc, &p1).expect("reads p1");
        m.settle().expect("settle");
        (get(&m, &acc), get(&m, &p0), get(&m, &p1))
    };
    for between in [false, true] {
        let (queued, each) = (run(false, between), run(true, between));
        assert_eq!(queued, each, "between: {between}");
    }
    // The first addition saw p1's older values: the accumulators differ.
    assert_ne!(run(false, true).0, run(false, false).0);
}

/// A copy of one dtype between two memories (run by run, no staged copy) writes exactly its
/// elements, in logical order, whichever side is strided, and leaves every other element as it
/// was: HBM columns into SBUF columns, SBUF rows into every other row of another HBM tensor,
/// and HBM into HBM.
#[test]
fn a_copy_between_memories_writes_exactly_its_elements() {
    let mut m = core();
    let (h, host) = random_hbm(&mut m, "h", &[40, 12], 41);
    let other = 0x1357_9BDFu32;
    let t = alloc(&mut m, "t", &[40, 12], Dtype::Fp32);
    put(&mut m, &t, &vec![other; 480]);
    let src = h.slice(&[Index::ALL, ix(Some(1), None, 3)]).expect("hbm cols");
    let dst = t.slice(&[Index::ALL, ix(Some(0), None, 3)]).expect("sbuf cols");
    m.dma_copy(&dst, &src, None).expect("strided load");
    let got = get(&m, &t);
    for p in 0..40 {
        for j in 0..12 {
            let w = if j % 3 == 0 { host[p * 12 + 1 + j] } else { other };
            assert_eq!(got[p * 12 + j], w, "sbuf [{p}, {j}]");
        }
    }
    let keep = codes(Dtype::Fp32, 480, 42);
    let h2 = m
        .hbm_tensor("h2", &[40, 12], Dtype::Fp32, Some(&to_bytes(Dtype::Fp32, &keep)))
        .expect("h2");
    let rows = h2.slice(&[ix(Some(0), None, 2)]).expect("every other row");
    m.dma_copy(&rows, &t.slice(&[range(0, 20)]).expect("rows"), None).expect("strided store");
    let got = get(&m, &h2);
    for r in 0..40 {
        let want =
            if r % 2 == 0 { &get(&m, &t)[r / 2 * 12..][..12] } else { &keep[r * 12..][..12] };
        assert_eq!(&got[r * 12..][..12], want, "hbm row {r}");
    }
    m.dma_copy(
        &h2.slice(&[range(10, 20)]).expect("h2 rows"),
        &h.slice(&[range(0, 10)]).expect("h rows"),
        None,
    )
    .expect("hbm to hbm");
    assert_eq!(get(&m, &h2)[120..240], host[..120]);
    // Two-byte elements, a transposing pattern (runs of one element).
    let (b, bits) = random_tile(&mut m, "b", &[3, 4], Dtype::Bf16, 43);
    let hb = m.hbm_tensor("hb", &[4, 3], Dtype::Bf16, None).expect("hb");
    let tr = hb.with_rows(3, 1).and_then(|x| x.with_pattern(&[(3, 4)], 0)).expect("pattern");
    m.dma_copy(&tr, &b, None).expect("transposing store");
    let got = get(&m, &hb);
    for r in 0..4 {
        for c in 0..3 {
            assert_eq!(got[r * 3 + c], bits[c * 4 + r], "hb [{r}, {c}]");
        }
    }
}

/// A memset writes its value's bits to exactly the elements of its tile, strided (every third
/// column of some partitions) or contiguous (whole rows), for values whose bytes are all alike
/// (0) or not, and leaves every other element as it was.
#[test]
fn memset_writes_exactly_its_elements_strided_or_not() {
    let mut m = core();
    for (dt, v, want, other) in [
        (Dtype::Bf16, 1.5, 0x3FC0u32, 0x1234u32),
        (Dtype::Fp32, 0.0, 0, 0x4000_0000),
        (Dtype::Int8, -2.0, 0xFE, 0x11),
        (Dtype::Fp32, -3.0, 0xC040_0000, 7),
    ] {
        let t = alloc(&mut m, "t", &[40, 10], dt);
        put(&mut m, &t, &vec![other; 400]);
        let cols = t.slice(&[ix(Some(0), Some(5), 1), ix(Some(1), None, 3)]).expect("strided");
        m.memset(Engine::Vector, &cols, v).expect("memset strided");
        let rows = t.slice(&[ix(Some(32), Some(40), 1), Index::ALL]).expect("rows");
        m.memset(Engine::Gpsimd, &rows, v).expect("memset rows");
        let got = get(&m, &t);
        for p in 0..40 {
            for j in 0..10 {
                let inside = p >= 32 || p < 5 && j % 3 == 1;
                let w = if inside { want } else { other };
                assert_eq!(got[p * 10 + j], w, "{dt} {v} at [{p}, {j}]");
            }
        }
        m.free(&t).expect("free");
    }
}

/// What runs between the two waves of [`two_waves`]: it writes some bytes of the moving
/// operand `mv` ([128, 2, 96] bf16) by one of the ways into SBUF.
type Between = fn(&mut Machine, &Tile);

/// `n` bfloat16 codes of small integers over 16 (-2 to 2): exact sums that any changed
/// operand changes.
fn small_bf16(n: usize, seed: u64) -> Vec<u32> {
    (0..n as u64).map(|i| (((mix64(seed ^ i) % 65) as f32 - 32.0) / 16.0).to_bits() >> 16).collect()
}

/// The moving operand's bytes of `mv[:, 1, 8:24]`.
fn mv_part(mv: &Tile) -> Tile {
    mv.slice(&[Index::ALL, Index::At(1), range(8, 24)]).expect("part of mv")
}

/// A wave of two chains of two matmuls (`st`'s two column halves times `mv`, K tiles 0 and 1)
/// into two PSUM tiles: their bits.
fn wave_of_two(m: &mut Machine, st: &Tile, mv: &Tile) -> Vec<u32> {
    let mut out = Vec::new();
    let ps: Vec<Tile> = (0..2).map(|i| psum(m, &format!("p{i}"), &[64, 96], Dtype::Fp32)).collect();
    for (i, p) in ps.iter().enumerate() {
        let cols = range(i as i64 * 64, i as i64 * 64 + 64);
        for k in 0..2 {
            let s = st.slice(&[Index::ALL, Index::At(k), cols]).expect("st");
            let v = mv.slice(&[Index::ALL, Index::At(k), Index::ALL]).expect("mv");
            let opts = PeOptions { accumulate: Some(k > 0), ..PeOptions::default() };
            m.nc_matmul_queued(p, &s, &v, &opts).expect("queued");
        }
    }
    m.settle().expect("settle");
    for p in &ps {
        out.extend(get(m, p));
        m.free(p).expect("free");
    }
    out
}

/// A machine with stationary `st` ([128, 2, 128] bf16, first-fit) and moving `mv` ([128, 2, 96]
/// bf16, an explicit overlay allocation at byte 64 KiB), both written.
fn waves_machine() -> (Machine, Tile, Tile) {
    let mut m = core();
    let st = alloc(&mut m, "st", &[128, 2, 128], Dtype::Bf16);
    put(&mut m, &st, &small_bf16(128 * 2 * 128, 31));
    let mv = m
        .alloc_at(Space::Sbuf, "mv", &[128, 2, 96], Dtype::Bf16, 0, Some(64 << 10), true)
        .expect("mv");
    put(&mut m, &mv, &small_bf16(128 * 2 * 96, 32));
    (m, st, mv)
}

/// Two waves on the same operand tiles with `between` run after the first: the second wave's
/// bits, and the bits of the same wave on a machine where `between` ran before any wave.
fn two_waves(between: Between) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let (mut m, st, mv) = waves_machine();
    let first = wave_of_two(&mut m, &st, &mv);
    between(&mut m, &mv);
    let second = wave_of_two(&mut m, &st, &mv);
    let (mut fresh, fst, fmv) = waves_machine();
    between(&mut fresh, &fmv);
    (first, second, wave_of_two(&mut fresh, &fst, &fmv))
}

#[test]
fn a_wave_after_its_operands_bytes_changed_reads_the_new_bytes() {
    // The second of two waves on the same tiles may reuse the first's packed operands only
    // while no byte of them was written: every way into SBUF counts, including a tensor
    // placed over the same bytes and a spill's reload.
    let ways: [(&str, Between); 7] = [
        ("host write", |m, mv| put(m, &mv_part(mv), &small_bf16(128 * 16, 33))),
        ("memset", |m, mv| m.memset(Engine::Vector, &mv_part(mv), 1.5).expect("memset")),
        ("tensor_copy", |m, mv| {
            let src = alloc(m, "src", &[128, 16], Dtype::Bf16);
            put(m, &src, &small_bf16(128 * 16, 34));
            m.tensor_copy(Engine::Vector, &mv_part(mv), &src).expect("copy");
        }),
        ("dma_copy", |m, mv| {
            let host = small_bf16(128 * 16, 35);
            let h = m.hbm_tensor("h", &[128, 16], Dtype::Bf16, Some(&to_bytes(Dtype::Bf16, &host)));
            m.dma_copy(&mv_part(mv), &h.expect("hbm"), None).expect("dma");
        }),
        ("tensor_tensor", |m, mv| {
            let part = mv_part(mv);
            m.tensor_tensor(Engine::Vector, &part, &part, &part, AluOp::Add).expect("add");
        }),
        ("overlay", |m, _| {
            let at = (64 << 10) + 96 * 2 + 16;
            let alias = m.alloc_at(Space::Sbuf, "alias", &[128, 8], Dtype::Bf16, 0, Some(at), true);
            let alias = alias.expect("alias");
            put(m, &alias, &small_bf16(128 * 8, 36));
        }),
        ("spill reload", |m, mv| {
            let host = small_bf16(128 * 2 * 96, 37);
            let bytes = to_bytes(Dtype::Bf16, &host);
            let slot = m.hbm_tensor("slot", &[128, 2 * 96], Dtype::Bf16, Some(&bytes));
            m.dma_spill(mv, &slot.expect("slot"), None).expect("reload");
        }),
    ];
    for (way, between) in ways {
        let (first, second, fresh) = two_waves(between);
        let wrong = second.iter().zip(&fresh).position(|(a, b)| a != b);
        assert_eq!(wrong, None, "{way}: the second wave reads the bytes written");
        assert!(first != second, "{way}: the write changes the sums");
        assert!(first.iter().all(|&b| f32::from_bits(b).is_finite()), "{way}: finite sums");
    }
}
