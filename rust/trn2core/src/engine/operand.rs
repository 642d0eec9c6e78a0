//! The GEMM's operands as the caller holds them, and how a run of one row becomes the engine's
//! values.
//!
//! An operand is a [`Matrix`]: a dense matrix in any layout a numpy array can have ([`Strided`]:
//! any strides, negative or zero included, either byte order, any numeric dtype), or a matrix
//! compressed N:M along its rows ([`Sparse`]: the stored values and their packed positions, the
//! layout of [`crate::sparsity`]). The GEMM never copies an operand: its packing routines ask a
//! [`Reader`] for runs of consecutive elements of one row (at most [`RUN`]) and place the float32
//! values they get in the packed panels.
//!
//! A reader either widens exactly (the stored dtype is an engine format: float32, bfloat16,
//! float16, the fp8 dtypes) or rounds once into the engine format with the numerics kernels
//! ([`RunEncoder`]) and widens the codes exactly. Element `(i, j)` of a `[rows, cols]` operand is
//! flat C-order element `i * cols + j` whatever its layout, and that index keys its random word
//! in stochastic rounding: every value is the one `numerics::encode_into` of the whole operand,
//! then `numerics::decode`, would give (the bits of "quantize, then decode, then multiply").

use crate::numerics::{fp8_lut, CodesMut, EncodeScratch, Format, Rounding, RunEncoder, Source};
use crate::sparsity::{Dtype, Pattern};
use crate::{Error, Result};

/// The longest run of a row a [`Reader`] converts at once: stack buffers of this many elements
/// stay in L1, and it covers a whole K tile (256 in `double_row`).
pub(crate) const RUN: usize = 256;

const _: () = assert!(crate::spec::MATMUL_DOUBLE_ROW_CONTRACTION_MAX <= RUN);

/// The elements of an array as unsigned codes of their width (a numpy array of any dtype viewed
/// as `uint8`, `uint16`, `uint32` or `uint64`, without a copy).
#[derive(Debug, Clone, Copy)]
pub enum Buffer<'a> {
    /// 8-bit elements.
    U8(&'a [u8]),
    /// 16-bit elements.
    U16(&'a [u16]),
    /// 32-bit elements.
    U32(&'a [u32]),
    /// 64-bit elements.
    U64(&'a [u64]),
}

impl Buffer<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Buffer::U8(x) => x.len(),
            Buffer::U16(x) => x.len(),
            Buffer::U32(x) => x.len(),
            Buffer::U64(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Width of one element in bits.
    pub fn bits(&self) -> u32 {
        match self {
            Buffer::U8(_) => 8,
            Buffer::U16(_) => 16,
            Buffer::U32(_) => 32,
            Buffer::U64(_) => 64,
        }
    }
}

macro_rules! buffer_from {
    ($($t:ty => $v:ident),*) => {$(
        impl<'a> From<&'a [$t]> for Buffer<'a> {
            fn from(x: &'a [$t]) -> Buffer<'a> {
                Buffer::$v(x)
            }
        }
    )*};
}
buffer_from!(u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// The bit patterns of float32 values, borrowed as such.
pub(crate) fn f32_bits(x: &[f32]) -> &[u32] {
    // SAFETY: f32 and u32 have the same size and alignment, and every bit pattern is a u32.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) }
}

/// A dense `[rows, cols]` matrix in any layout: element `(i, j)` is
/// `buffer[origin + i * strides[0] + j * strides[1]]` (strides in elements, of any sign), its
/// bytes swapped first when `swapped` (a non-native byte order).
#[derive(Debug, Clone, Copy)]
pub struct Strided<'a> {
    buffer: Buffer<'a>,
    dtype: Dtype,
    swapped: bool,
    shape: [usize; 2],
    origin: usize,
    strides: [isize; 2],
}

impl<'a> Strided<'a> {
    /// A matrix of `dtype` elements held in `buffer` with this layout. Errors (naming `arg`):
    /// a buffer whose width is not the dtype's (`FormatError`), an element outside the buffer
    /// (`ShapeError`).
    pub fn new(
        arg: &str, buffer: Buffer<'a>, dtype: Dtype, swapped: bool, shape: [usize; 2],
        origin: usize, strides: [isize; 2],
    ) -> Result<Strided<'a>> {
        check_width(arg, buffer, dtype)?;
        if shape[0] > 0 && shape[1] > 0 {
            let (mut lo, mut hi) = (origin as i128, origin as i128);
            for (&d, &s) in shape.iter().zip(&strides) {
                let span = (d as i128 - 1) * s as i128;
                if span < 0 {
                    lo += span;
                } else {
                    hi += span;
                }
            }
            if lo < 0 || hi >= buffer.len() as i128 {
                return Err(Error::shape(
                    arg,
                    format!(
                        "the layout (shape {shape:?}, strides {strides:?} elements from element \
                         {origin}) reaches outside the {} elements of its buffer",
                        buffer.len()
                    ),
                ));
            }
        }
        Ok(Strided { buffer, dtype, swapped, shape, origin, strides })
    }

    /// A row-major (C-contiguous, native byte order) matrix: `ShapeError` unless `buffer` holds
    /// exactly `rows * cols` elements.
    pub fn row_major(
        arg: &str, buffer: Buffer<'a>, dtype: Dtype, shape: [usize; 2],
    ) -> Result<Strided<'a>> {
        check_len(arg, buffer.len(), &shape)?;
        // The length check bounds `cols` by the buffer length, itself below isize::MAX.
        let cols = isize::try_from(shape[1]).unwrap_or(isize::MAX);
        Strided::new(arg, buffer, dtype, false, shape, 0, [cols, 1])
    }

    /// Index into the buffer of element `(i, j)` (in bounds: checked by [`Strided::new`]).
    #[inline]
    fn index(&self, i: usize, j: usize) -> usize {
        (self.origin as isize + i as isize * self.strides[0] + j as isize * self.strides[1])
            as usize
    }

    /// Starts loading elements `(i, j0..j0 + len)` into the CPU's caches when they are
    /// consecutive (a hint: nothing is read, no value changes; other layouts are left alone).
    #[inline]
    fn prefetch(&self, i: usize, j0: usize, len: usize) {
        if self.strides[1] != 1 || len == 0 {
            return;
        }
        let at = self.index(i, j0);
        match self.buffer {
            Buffer::U8(x) => prefetch_bytes(x.get(at..at + len)),
            Buffer::U16(x) => prefetch_bytes(x.get(at..at + len)),
            Buffer::U32(x) => prefetch_bytes(x.get(at..at + len)),
            Buffer::U64(x) => prefetch_bytes(x.get(at..at + len)),
        }
    }

    /// Elements `(i, j0..j0 + len)`: borrowed when they are consecutive in native byte order,
    /// else gathered into `buf`.
    #[inline]
    fn fetch<'x, T: Raw>(
        &self, data: &'x [T], i: usize, j0: usize, buf: &'x mut [T; RUN], len: usize,
    ) -> &'x [T] {
        let base = self.index(i, j0);
        if self.strides[1] == 1 && !self.swapped {
            return &data[base..base + len];
        }
        let step = self.strides[1];
        for (jj, d) in buf[..len].iter_mut().enumerate() {
            let v = data[(base as isize + jj as isize * step) as usize];
            *d = if self.swapped { v.swapped() } else { v };
        }
        &buf[..len]
    }
}

/// Asks the CPU to start loading the cache lines of `run` (x86-64's `prefetcht0`; elsewhere
/// nothing): a hint that reads nothing and cannot fault.
#[inline]
fn prefetch_bytes<T>(run: Option<&[T]>) {
    #[cfg(target_arch = "x86_64")]
    if let Some(run) = run {
        let (p, bytes) = (run.as_ptr().cast::<i8>(), std::mem::size_of_val(run));
        // The lines the run touches, from the one holding its first byte.
        let lead = p as usize % 64;
        for off in (0..lead + bytes).step_by(64) {
            // SAFETY: a prefetch is a hint: it neither reads architecturally nor faults, and
            // the address (`p` moved back to its line's start, then on by whole lines below
            // the run's end) is computed without dereferencing.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_sub(lead).wrapping_add(off));
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = run;
}

/// An `[rows, cols]` matrix compressed N:M along its rows (axis 1), as `trn2core.compress`
/// stores it: `values` `[rows, cols / m * n]` row-major in native byte order and `indices` the
/// packed positions (layout in [`crate::sparsity`]). Elements that are not stored are `+0`.
#[derive(Debug, Clone, Copy)]
pub struct Sparse<'a> {
    values: Buffer<'a>,
    indices: &'a [u8],
    dtype: Dtype,
    pattern: Pattern,
    shape: [usize; 2],
}

impl<'a> Sparse<'a> {
    /// The compressed matrix of `shape` from its parts. Errors (naming `arg`): a buffer width
    /// that is not the dtype's (`FormatError`); a column count that is not a multiple of the
    /// pattern's group, or parts of the wrong length (`ShapeError`).
    pub fn new(
        arg: &str, values: Buffer<'a>, indices: &'a [u8], dtype: Dtype, pattern: Pattern,
        shape: [usize; 2],
    ) -> Result<Sparse<'a>> {
        check_width(arg, values, dtype)?;
        let [rows, cols] = shape;
        if !cols.is_multiple_of(pattern.m()) {
            return Err(Error::shape(
                arg,
                format!(
                    "{cols} columns are not a multiple of the {pattern} pattern's group of {}",
                    pattern.m()
                ),
            ));
        }
        let slots = rows.checked_mul(cols / pattern.m() * pattern.n());
        if slots != Some(values.len()) {
            return Err(Error::shape(
                arg,
                format!(
                    "holds {} values but a {rows} x {cols} matrix compressed {pattern} has {slots:?}",
                    values.len()
                ),
            ));
        }
        let packed = (values.len() as u128 * pattern.index_bits() as u128).div_ceil(8);
        if packed != indices.len() as u128 {
            return Err(Error::shape(
                arg,
                format!(
                    "has {} bytes of packed positions; its {} values need {packed}",
                    indices.len(),
                    values.len()
                ),
            ));
        }
        Ok(Sparse { values, indices, dtype, pattern, shape })
    }

    /// Elements `(i, j0..j0 + len)` scattered from the stored values into `buf`.
    #[inline]
    fn fetch<'x, T: Raw>(
        &self, values: &[T], i: usize, j0: usize, buf: &'x mut [T; RUN], len: usize,
    ) -> &'x [T] {
        let (n, m) = (self.pattern.n(), self.pattern.m());
        let bits = self.pattern.index_bits() as usize;
        let row = i * (self.shape[1] / m * n);
        let out = &mut buf[..len];
        out.fill(T::default());
        for g in j0 / m..(j0 + len).div_ceil(m) {
            for s in 0..n {
                let v = row + g * n + s;
                let k = g * m + position(self.indices, v * bits, bits);
                if let Some(d) = k.checked_sub(j0).and_then(|kk| out.get_mut(kk)) {
                    *d = values[v];
                }
            }
        }
        out
    }
}

/// The `bits`-bit position starting at bit `at` of the LSB-first packed stream.
#[inline]
fn position(indices: &[u8], at: usize, bits: usize) -> usize {
    let (byte, shift) = (at / 8, at % 8);
    let lo = indices.get(byte).copied().unwrap_or(0) as usize;
    let hi = indices.get(byte + 1).copied().unwrap_or(0) as usize;
    ((lo | hi << 8) >> shift) & ((1 << bits) - 1)
}

fn check_width(arg: &str, buffer: Buffer, dtype: Dtype) -> Result<()> {
    if buffer.bits() == dtype.bits() {
        Ok(())
    } else {
        Err(Error::format(
            arg,
            format!(
                "{} elements have {} bits, but the buffer holds {}-bit codes",
                dtype.name(),
                dtype.bits(),
                buffer.bits()
            ),
        ))
    }
}

/// A GEMM operand as the caller holds it.
#[derive(Debug, Clone, Copy)]
pub enum Matrix<'a> {
    /// A dense matrix in any layout.
    Dense(Strided<'a>),
    /// A matrix compressed N:M along its rows.
    Sparse(Sparse<'a>),
}

impl Matrix<'_> {
    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Matrix::Dense(d) => d.shape,
            Matrix::Sparse(s) => s.shape,
        }
    }

    /// The dtype of the stored elements.
    pub fn dtype(&self) -> Dtype {
        match self {
            Matrix::Dense(d) => d.dtype,
            Matrix::Sparse(s) => s.dtype,
        }
    }

    /// The N:M pattern of a compressed matrix.
    pub fn pattern(&self) -> Option<Pattern> {
        match self {
            Matrix::Dense(_) => None,
            Matrix::Sparse(s) => Some(s.pattern),
        }
    }
}

/// An element code the reader can gather and byte-swap.
pub(crate) trait Raw: Copy + Default + Send + Sync + 'static {
    /// The code zero-extended.
    fn bits64(self) -> u64;
    /// The code with its bytes in the other order.
    fn swapped(self) -> Self;
}

macro_rules! raw {
    ($($t:ty),*) => {$(
        impl Raw for $t {
            #[inline(always)]
            fn bits64(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn swapped(self) -> Self {
                self.swap_bytes()
            }
        }
    )*};
}
raw!(u8, u16, u32, u64);

/// Per-thread buffers of a [`Reader`] (about 17 KiB: make one per packing job, not per run).
pub(crate) struct Scratch {
    raw8: [u8; RUN],
    raw16: [u16; RUN],
    raw32: [u32; RUN],
    raw64: [u64; RUN],
    work: Work,
}

struct Work {
    encode: EncodeScratch,
    wide32: [f32; RUN],
    wide64: [f64; RUN],
    code8: [u8; RUN],
    code16: [u16; RUN],
    code32: [u32; RUN],
}

impl Scratch {
    pub(crate) fn new() -> Box<Scratch> {
        Box::new(Scratch {
            raw8: [0; RUN],
            raw16: [0; RUN],
            raw32: [0; RUN],
            raw64: [0; RUN],
            work: Work {
                encode: EncodeScratch::new(),
                wide32: [0.0; RUN],
                wide64: [0.0; RUN],
                code8: [0; RUN],
                code16: [0; RUN],
                code32: [0; RUN],
            },
        })
    }
}

/// The engine format of elements stored as `dtype`, if they are its values as they stand.
fn stored_format(dtype: Dtype) -> Option<Format> {
    match dtype {
        Dtype::F32 => Some(Format::Fp32),
        Dtype::Bf16 => Some(Format::Bf16),
        Dtype::F16 => Some(Format::Fp16),
        Dtype::Fp8E4m3 => Some(Format::Fp8E4m3),
        Dtype::Fp8E5m2 => Some(Format::Fp8E5m2),
        Dtype::Fp8E3m4 => Some(Format::Fp8E3m4),
        Dtype::Fp8E4m3fn => Some(Format::Fp8E4m3fn),
        _ => None,
    }
}

/// How the engine reads an operand: runs of a row as exact float32 values of its format.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    matrix: Matrix<'a>,
    cols: usize,
    /// Rounds each element into the engine format; `None` when the stored values are it.
    round: Option<RunEncoder>,
    /// float32 values of the stored fp8 codes (a stored fp8 dtype).
    stored_lut: [f32; 256],
    /// float32 values of the engine format's fp8 codes (rounding into fp8).
    format_lut: [f32; 256],
}

impl<'a> Reader<'a> {
    /// Starts loading the stored elements `(i, j0..j0 + len)` into the CPU's caches (dense
    /// matrices with consecutive rows; a hint, see [`Reader::row_run`]'s caller `pack_cols`).
    #[inline]
    pub(crate) fn prefetch_run(&self, i: usize, j0: usize, len: usize) {
        if let Matrix::Dense(d) = self.matrix {
            d.prefetch(i, j0, len);
        }
    }

    /// How the engine reads `matrix` (the argument `arg`), and the format of its values: rounded
    /// once into `target` with `rounding` (stochastic rounding keyed by `seed`) when a target is
    /// given; else as stored (float32 is fp32, bfloat16 bf16, float16 fp16, the fp8 dtypes their
    /// formats), float64 and integers (via float64) rounded to fp32, nearest-even, as a DMA cast
    /// would. A bool matrix is a `FormatError`.
    pub(crate) fn new(
        arg: &str, matrix: Matrix<'a>, target: Option<Format>, rounding: Rounding, seed: u64,
    ) -> Result<(Reader<'a>, Format)> {
        let dtype = matrix.dtype();
        if dtype == Dtype::Bool {
            return Err(Error::format(
                arg,
                if target.is_some() {
                    "dtype bool is not a supported real number type; expected float64, float32, \
                     float16, an integer type, or an ml_dtypes bfloat16/float8 dtype"
                } else {
                    "dtype bool is not a tensor-engine format; the engine reads fp8_e4m3, \
                     fp8_e5m2, fp8_e3m4, bf16, fp16, tf32 or fp32 (convert with \
                     trn2core.quantize, or pass dtype= to gemm)"
                },
            ));
        }
        let (format, round) = match (target, stored_format(dtype)) {
            (Some(f), _) => (f, Some(RunEncoder::new(f, rounding, seed))),
            (None, Some(f)) => (f, None),
            (None, None) => {
                (Format::Fp32, Some(RunEncoder::new(Format::Fp32, Rounding::NearestEven, 0)))
            }
        };
        let lut = |f: Option<Format>| match f {
            Some(f) if f.is_fp8() => fp8_lut(&f.encoding()),
            _ => [0.0; 256],
        };
        let reader = Reader {
            matrix,
            cols: matrix.shape()[1],
            round,
            stored_lut: lut(stored_format(dtype)),
            format_lut: lut(round.map(|r| r.format())),
        };
        Ok((reader, format))
    }

    /// Reads a dense float32 matrix as fp32 values, as they stand.
    pub(crate) fn f32(matrix: Strided<'a>) -> Reader<'a> {
        Reader {
            matrix: Matrix::Dense(matrix),
            cols: matrix.shape[1],
            round: None,
            stored_lut: [0.0; 256],
            format_lut: [0.0; 256],
        }
    }

    /// The operand.
    pub(crate) fn matrix(&self) -> &Matrix<'a> {
        &self.matrix
    }

    /// Elements `(i, j0..j0 + len)` borrowed as the engine's values, when they are those as
    /// stored: float32 read as fp32 (no rounding), consecutive, in native byte order (what
    /// [`Reader::row_run`] would copy out unchanged); else `None`.
    #[inline]
    pub(crate) fn row_f32(&self, i: usize, j0: usize, len: usize) -> Option<&'a [f32]> {
        let Matrix::Dense(d) = self.matrix else { return None };
        let Buffer::U32(x) = d.buffer else { return None };
        if self.round.is_some() || d.dtype != Dtype::F32 || d.strides[1] != 1 || d.swapped {
            return None;
        }
        debug_assert!(i < d.shape[0] && j0 + len <= self.cols);
        let run = x.get(d.index(i, j0)..)?.get(..len)?;
        // SAFETY: f32 and u32 have the same size and alignment, and every u32 is a valid f32
        // (the bits, reinterpreted: what `widen` does for float32).
        Some(unsafe { std::slice::from_raw_parts(run.as_ptr().cast::<f32>(), run.len()) })
    }

    /// The engine's values of elements `(i, j0..j0 + out.len())`; `out` holds at most [`RUN`].
    pub(crate) fn row_run(&self, i: usize, j0: usize, out: &mut [f32], s: &mut Scratch) {
        let len = out.len();
        debug_assert!(len <= RUN && i < self.matrix.shape()[0] && j0 + len <= self.cols);
        let key0 = (i * self.cols + j0) as u64;
        let Scratch { raw8, raw16, raw32, raw64, work } = s;
        match self.matrix {
            Matrix::Dense(d) => match d.buffer {
                Buffer::U8(x) => self.convert(d.fetch(x, i, j0, raw8, len), key0, out, work),
                Buffer::U16(x) => self.convert(d.fetch(x, i, j0, raw16, len), key0, out, work),
                Buffer::U32(x) => self.convert(d.fetch(x, i, j0, raw32, len), key0, out, work),
                Buffer::U64(x) => self.convert(d.fetch(x, i, j0, raw64, len), key0, out, work),
            },
            Matrix::Sparse(sp) => match sp.values {
                Buffer::U8(x) => self.convert(sp.fetch(x, i, j0, raw8, len), key0, out, work),
                Buffer::U16(x) => self.convert(sp.fetch(x, i, j0, raw16, len), key0, out, work),
                Buffer::U32(x) => self.convert(sp.fetch(x, i, j0, raw32, len), key0, out, work),
                Buffer::U64(x) => self.convert(sp.fetch(x, i, j0, raw64, len), key0, out, work),
            },
        }
    }

    /// Stored codes to engine values: widened, or rounded (flat indices from `key0`) and then
    /// widened.
    #[inline]
    fn convert<T: Raw>(&self, raw: &[T], key0: u64, out: &mut [f32], w: &mut Work) {
        let dtype = self.matrix.dtype();
        let Some(enc) = self.round else {
            // The stored dtype is the engine format (`Reader::new`): only float kinds get here.
            widen(dtype, raw, out, &self.stored_lut);
            return;
        };
        let len = raw.len();
        let src = match dtype {
            Dtype::F64 => {
                for (d, &x) in w.wide64.iter_mut().zip(raw) {
                    *d = f64::from_bits(x.bits64());
                }
                Source::F64(&w.wide64[..len])
            }
            // bfloat16, float16 and fp8 widen exactly to float32 first, as in `encode_into`.
            d if stored_format(d).is_some() => {
                widen(dtype, raw, &mut w.wide32[..len], &self.stored_lut);
                Source::F32(&w.wide32[..len])
            }
            // Integers enter as float64 (rounded to nearest-even beyond 2^53, as numpy's
            // astype does), then round once into the format.
            d => {
                integers(d, raw, &mut w.wide64[..len]);
                Source::F64(&w.wide64[..len])
            }
        };
        // The codes' exact values: the format's codes read as its container dtype.
        let (format, lut) = (Dtype::from(enc.format()), &self.format_lut);
        match enc.format().code_bits() {
            8 => {
                enc.encode(&src, key0, CodesMut::U8(&mut w.code8[..len]), &mut w.encode);
                widen(format, &w.code8[..len], out, lut);
            }
            16 => {
                enc.encode(&src, key0, CodesMut::U16(&mut w.code16[..len]), &mut w.encode);
                widen(format, &w.code16[..len], out, lut);
            }
            // fp32 and tf32: float32 containers (tf32's low 13 bits are zero).
            _ => {
                enc.encode(&src, key0, CodesMut::U32(&mut w.code32[..len]), &mut w.encode);
                widen(format, &w.code32[..len], out, lut);
            }
        }
    }
}

/// Exact float32 values of float codes of `dtype` (float32, bfloat16, float16, fp8 via `lut`).
#[inline]
fn widen<T: Raw>(dtype: Dtype, raw: &[T], out: &mut [f32], lut: &[f32; 256]) {
    let pairs = out.iter_mut().zip(raw);
    match dtype {
        Dtype::F32 => pairs.for_each(|(o, &x)| *o = f32::from_bits(x.bits64() as u32)),
        Dtype::Bf16 => pairs.for_each(|(o, &x)| *o = f32::from_bits((x.bits64() as u32) << 16)),
        Dtype::F16 => pairs.for_each(|(o, &x)| *o = crate::numerics::f16_to_f32(x.bits64() as u16)),
        _ => pairs.for_each(|(o, &x)| *o = lut[x.bits64() as u8 as usize]),
    }
}

/// float64 values of integer codes of `dtype` (two's complement when signed).
#[inline]
fn integers<T: Raw>(dtype: Dtype, raw: &[T], out: &mut [f64]) {
    let pairs = out.iter_mut().zip(raw);
    match dtype {
        Dtype::I8 => pairs.for_each(|(o, &x)| *o = x.bits64() as u8 as i8 as f64),
        Dtype::I16 => pairs.for_each(|(o, &x)| *o = x.bits64() as u16 as i16 as f64),
        Dtype::I32 => pairs.for_each(|(o, &x)| *o = x.bits64() as u32 as i32 as f64),
        Dtype::I64 => pairs.for_each(|(o, &x)| *o = x.bits64() as i64 as f64),
        _ => pairs.for_each(|(o, &x)| *o = x.bits64() as f64),
    }
}

/// A `ShapeError` unless `len` is the product of `dims`.
pub(crate) fn check_len(arg: &str, len: usize, dims: &[usize]) -> Result<()> {
    let want = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if want == Some(len) {
        Ok(())
    } else {
        Err(Error::shape(
            arg,
            format!("holds {len} elements but its shape {dims:?} needs {want:?}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefetch is a hint that must stay inside its buffer: asked for at every row, start
    /// and length of a row-major matrix up to the row's end (elements of each width), and for
    /// a layout whose rows are not consecutive (left alone), it returns without a panic.
    #[test]
    fn prefetch_hints_stay_inside_their_buffer() {
        let (rows, cols) = (3usize, 70usize);
        let w8: Vec<u8> = (0..rows * cols).map(|i| i as u8).collect();
        let w16: Vec<u16> = (0..rows * cols).map(|i| i as u16).collect();
        let w32: Vec<u32> = (0..rows * cols).map(|i| i as u32).collect();
        let w64: Vec<u64> = (0..rows * cols).map(|i| i as u64).collect();
        let mats = [
            (Buffer::U8(&w8), Dtype::Fp8E4m3),
            (Buffer::U16(&w16), Dtype::Bf16),
            (Buffer::U32(&w32), Dtype::F32),
            (Buffer::U64(&w64), Dtype::F64),
        ]
        .map(|(b, d)| Strided::row_major("m", b, d, [rows, cols]).expect("valid"));
        for m in &mats {
            for i in 0..rows {
                for j0 in 0..=cols {
                    for len in 0..=cols - j0 {
                        m.prefetch(i, j0, len);
                    }
                }
            }
        }
        // The transpose: consecutive down its columns, not along its rows.
        let t = Strided::new("t", Buffer::U16(&w16), Dtype::Bf16, false, [cols, rows], 0, [1, 70])
            .expect("valid");
        for i in 0..cols {
            t.prefetch(i, 0, rows);
        }
        Reader::f32(mats[2]).prefetch_run(rows - 1, cols - 1, 1);
    }
}
