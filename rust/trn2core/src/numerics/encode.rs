//! Parallel, vectorised drivers of the rounding kernels: any input array into codes of any
//! format. The work is cut into fixed chunks (rayon) and each chunk into sub-blocks small enough
//! to stay in L1; narrow inputs (bf16, fp16, fp8) are widened to float32 one sub-block at a time,
//! so no temporary ever grows with the array. Random words for stochastic rounding come from the
//! caller's array or from the counter-based generator at the element's flat index, so the result
//! never depends on the chunking or the thread count.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::avx512::{self, Store};
use super::decode::fp8_lut;
use super::format::{Encoding, Format};
use super::kernels::{self, Params, AWAY, RNE, SR, TN, TP, TZ};
use super::rng::StochasticBits;
use super::Rounding;
use crate::{Error, Result};

/// Elsewhere the AVX-512 store trait asks nothing.
#[cfg(not(target_arch = "x86_64"))]
trait Store {}
#[cfg(not(target_arch = "x86_64"))]
impl<T> Store for T {}

/// Elements per parallel task.
const CHUNK: usize = 1 << 16;
/// Elements per sub-block (stack buffers of this size stay in L1).
const SUB: usize = 1024;

/// A borrowed input array, flattened in C order.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// float64 values (rounded once, straight to the target format).
    F64(&'a [f64]),
    /// float32 values.
    F32(&'a [f32]),
    /// bfloat16 bit patterns.
    Bf16(&'a [u16]),
    /// IEEE binary16 bit patterns.
    F16(&'a [u16]),
    /// fp8 codes of the given format (standard bias).
    Fp8(&'a [u8], Format),
}

impl Source<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Source::F64(x) => x.len(),
            Source::F32(x) => x.len(),
            Source::Bf16(x) | Source::F16(x) => x.len(),
            Source::Fp8(x, _) => x.len(),
        }
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where the random bits of stochastic rounding come from.
#[derive(Debug, Clone, Copy)]
pub enum Random<'a> {
    /// Deterministic modes.
    None,
    /// One word per element, each `< 2^count`.
    Bits(&'a [u32], u32),
    /// The counter-based generator keyed by `seed`; its 32-bit words are cut to their top
    /// `count` bits.
    Seed(u64, u32),
}

impl<'a> Random<'a> {
    /// The random source of a call (contract section 1): explicit `bits` (each `< 2^count`)
    /// when given, else the seeded generator for stochastic rounding, else none.
    pub fn choose(mode: Rounding, bits: Option<&'a [u32]>, seed: Option<u64>, count: u32) -> Self {
        match (bits, seed) {
            (Some(b), _) => Random::Bits(b, count),
            (None, Some(s)) if mode == Rounding::Stochastic => Random::Seed(s, count),
            _ => Random::None,
        }
    }
}

/// Raw codes in the width of their format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Codes {
    /// fp8 codes.
    U8(Vec<u8>),
    /// bf16 or fp16 bit patterns.
    U16(Vec<u16>),
    /// tf32 or fp32 bit patterns (tf32 in a float32 container).
    U32(Vec<u32>),
}

/// A code word type (u8, u16, u32).
pub trait Code: Copy + Default + Send + Sync + 'static {
    /// The low bits of `v` as a code (the kernels compute codes in 32 bits).
    fn from_u32(v: u32) -> Self;
    /// The code widened to 32 bits.
    fn to_u32(self) -> u32;
}
/// [`Code`] for unsigned integer words: truncation and zero-extension.
macro_rules! code_words {
    ($($t:ty),*) => {$(
        impl Code for $t {
            #[inline(always)]
            fn from_u32(v: u32) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_u32(self) -> u32 {
                self as u32
            }
        }
    )*};
}
code_words!(u8, u16, u32);

/// Rounds every element of `src` once into `enc` and returns the codes.
///
/// Errors: random bits of the wrong length or out of range, or random bits with a
/// deterministic mode.
pub fn encode(
    src: &Source, enc: &Encoding, mode: Rounding, saturate: bool, random: &Random,
) -> Result<Codes> {
    let n = src.len();
    let mut out = match enc.format.code_bits() {
        8 => Codes::U8(vec![0; n]),
        16 => Codes::U16(vec![0; n]),
        _ => Codes::U32(vec![0; n]),
    };
    let dst = match &mut out {
        Codes::U8(v) => CodesMut::U8(v),
        Codes::U16(v) => CodesMut::U16(v),
        Codes::U32(v) => CodesMut::U32(v),
    };
    encode_into(src, enc, mode, saturate, random, dst)?;
    Ok(out)
}

/// Caller-owned output for [`encode_into`] (the Python binding hands numpy's buffer here, so
/// the output is allocated once, by numpy, with its huge-page hints).
#[derive(Debug)]
pub enum CodesMut<'a> {
    /// fp8 codes.
    U8(&'a mut [u8]),
    /// bf16 or fp16 bit patterns.
    U16(&'a mut [u16]),
    /// tf32 or fp32 bit patterns (tf32 in a float32 container).
    U32(&'a mut [u32]),
}

/// [`encode`] into `out`, which must have the format's code width and the input's length.
pub fn encode_into(
    src: &Source, enc: &Encoding, mode: Rounding, saturate: bool, random: &Random, out: CodesMut,
) -> Result<()> {
    encode_into_level(src, enc, mode, saturate, random, out, SIMD_BEST)
}

/// [`encode_into`] using at most the SIMD level `level` ([`SIMD_PORTABLE`], [`SIMD_AVX2`],
/// [`SIMD_AVX512`]; capped at what this CPU has), so tests can compare the levels bit for bit.
pub(crate) fn encode_into_level(
    src: &Source, enc: &Encoding, mode: Rounding, saturate: bool, random: &Random, out: CodesMut,
    level: u8,
) -> Result<()> {
    let n = src.len();
    let count = match (*random, mode) {
        (Random::None, Rounding::Stochastic) => {
            return Err(Error::value(
                "random_bits",
                "stochastic rounding needs random bits or a seed",
            ))
        }
        (Random::None, _) => 32,
        (_, m) if m != Rounding::Stochastic => {
            return Err(Error::value(
                "random_bits",
                format!(
                    "random bits are only used with rounding=\"stochastic\", not {:?}",
                    m.name()
                ),
            ))
        }
        (Random::Bits(bits, count), _) => {
            check_count(count)?;
            if bits.len() != n {
                return Err(Error::shape(
                    "random_bits",
                    format!("has {} elements, the input has {n}", bits.len()),
                ));
            }
            if count < 32 {
                if let Some(pos) = bits.iter().position(|&b| b >> count != 0) {
                    return Err(Error::value(
                        "random_bits",
                        format!(
                            "element {pos} is {}, not below 2**random_bit_count = {}",
                            bits[pos],
                            1u64 << count
                        ),
                    ));
                }
            }
            count
        }
        (Random::Seed(_, count), _) => {
            check_count(count)?;
            count
        }
    };
    let (len, bits) = match &out {
        CodesMut::U8(o) => (o.len(), 8),
        CodesMut::U16(o) => (o.len(), 16),
        CodesMut::U32(o) => (o.len(), 32),
    };
    if len != n || bits != enc.format.code_bits() {
        return Err(Error::shape(
            "out",
            format!("needs {n} codes of {} bits, got {len} of {bits}", enc.format.code_bits()),
        ));
    }
    let job = Prepared {
        enc: *enc,
        params: Params::new(enc, mode, saturate, count),
        mode: kernels::mode_id(mode),
        random: *random,
        level: level.min(simd_level()),
    };
    let cancel = crate::cancel::current();
    match out {
        CodesMut::U8(o) => run::<u8>(src, &job, o, &cancel),
        CodesMut::U16(o) => run::<u16>(src, &job, o, &cancel),
        CodesMut::U32(o) => run::<u32>(src, &job, o, &cancel),
    }
    // A cancelled run skipped its remaining chunks.
    cancel.check()
}

fn check_count(count: u32) -> Result<()> {
    if (1..=32).contains(&count) {
        Ok(())
    } else {
        Err(Error::value("random_bit_count", format!("got {count}; it must be in 1..=32")))
    }
}

fn run<O: Code + Store>(
    src: &Source, job: &Prepared, out: &mut [O], cancel: &crate::cancel::Cancel,
) {
    let n = src.len();
    let task = |(ci, oc): (usize, &mut [O])| {
        if cancel.is_cancelled() {
            return;
        }
        job.chunk(src, ci * CHUNK, 0, oc, &mut EncodeScratch::new());
    };
    if n <= CHUNK {
        out.chunks_mut(CHUNK).enumerate().for_each(task);
    } else {
        out.par_chunks_mut(CHUNK).enumerate().for_each(task);
    }
}

/// One rounding, prepared: what every chunk of it needs.
#[derive(Debug, Clone, Copy)]
struct Prepared<'r> {
    enc: Encoding,
    params: Params,
    /// The const-generic id of the mode (`kernels::mode_id`).
    mode: u8,
    random: Random<'r>,
    /// The SIMD level (at most this CPU's).
    level: u8,
}

impl Prepared<'_> {
    /// [`chunk`] for this rounding's mode.
    #[inline]
    fn chunk<O: Code + Store>(
        &self, src: &Source, start: usize, key0: u64, out: &mut [O], s: &mut EncodeScratch,
    ) {
        match self.mode {
            RNE => chunk::<RNE, O>(src, start, key0, out, self, s),
            AWAY => chunk::<AWAY, O>(src, start, key0, out, self, s),
            TZ => chunk::<TZ, O>(src, start, key0, out, self, s),
            TP => chunk::<TP, O>(src, start, key0, out, self, s),
            TN => chunk::<TN, O>(src, start, key0, out, self, s),
            _ => chunk::<SR, O>(src, start, key0, out, self, s),
        }
    }
}

/// The buffers of one sub-block of a rounding: narrow inputs widened to float32, random words.
/// A caller rounding many short runs keeps one ([`RunEncoder::encode`]) rather than clearing
/// 8 KiB of stack for each run.
#[derive(Debug, Clone)]
pub struct EncodeScratch {
    x: [f32; SUB],
    r: [u32; SUB],
}

impl EncodeScratch {
    /// Zeroed buffers.
    pub fn new() -> EncodeScratch {
        EncodeScratch { x: [0.0; SUB], r: [0; SUB] }
    }
}

impl Default for EncodeScratch {
    fn default() -> EncodeScratch {
        EncodeScratch::new()
    }
}

/// A rounding prepared once and applied to many short runs of elements on the calling thread:
/// the GEMM rounds its operands while it packs them, a run of a row at a time. Same kernels and
/// same seeded random words as [`encode_into`], so the codes of every run are those one
/// `encode_into` of the whole array gives its elements.
#[derive(Debug, Clone, Copy)]
pub struct RunEncoder(Prepared<'static>);

impl RunEncoder {
    /// Rounding into `format` (standard bias, no saturation) with `mode`; stochastic rounding
    /// takes the 32-bit words of the generator keyed by `seed` (ignored by the other modes).
    pub fn new(format: Format, mode: Rounding, seed: u64) -> RunEncoder {
        let enc = format.encoding();
        let random =
            if mode == Rounding::Stochastic { Random::Seed(seed, 32) } else { Random::None };
        RunEncoder(Prepared {
            enc,
            params: Params::new(&enc, mode, false, 32),
            mode: kernels::mode_id(mode),
            random,
            level: simd_level(),
        })
    }

    /// The target format.
    pub fn format(&self) -> Format {
        self.0.enc.format
    }

    /// Rounds `src` into `out` (codes of the format's width; `out.len()` elements are
    /// rounded, at most `src.len()`): element `s` of `src` is element `key0 + s` of the whole
    /// array, which keys its random word. `scratch`: the caller's buffers, reused across runs.
    pub fn encode(&self, src: &Source, key0: u64, out: CodesMut, scratch: &mut EncodeScratch) {
        match out {
            CodesMut::U8(o) => self.0.chunk(src, 0, key0, o, scratch),
            CodesMut::U16(o) => self.0.chunk(src, 0, key0, o, scratch),
            CodesMut::U32(o) => self.0.chunk(src, 0, key0, o, scratch),
        }
    }
}

/// Processes elements `start..start + out.len()` of `src`; element `s` takes the random word
/// of flat index `key0 + s` (seeded) or `bits[s]` (explicit words).
fn chunk<const MODE: u8, O: Code + Store>(
    src: &Source, start: usize, key0: u64, out: &mut [O], job: &Prepared,
    scratch: &mut EncodeScratch,
) {
    let (p, random, enc, level) = (&job.params, &job.random, &job.enc, job.level);
    let identity = enc.format == Format::Fp32;
    // Seeded words keep their top `count` bits in place (the low ones masked off), which is
    // `(word >> (32 - count)) << (32 - count)`: the kernels then use them as 32-bit words.
    let (seeded, p) = match random {
        Random::Seed(seed, count) => {
            (Some((StochasticBits::new(*seed), !0u32 << (32 - count))), &Params { sr_k: 32, ..*p })
        }
        _ => (None, p),
    };
    // Seeded stochastic rounding of float32 values under AVX-512 generates the words in
    // registers (`avx512::sr_f32_seeded`) instead of through `rbuf`.
    let fused = cfg!(target_arch = "x86_64")
        && MODE == SR
        && level == SIMD_AVX512
        && seeded.is_some()
        && !identity
        && !matches!(src, Source::F64(_));
    let EncodeScratch { x: xbuf, r: rbuf } = scratch;
    let lut = match src {
        Source::Fp8(_, f) => Some(fp8_lut(&f.encoding())),
        _ => None,
    };
    for (bi, ob) in out.chunks_mut(SUB).enumerate() {
        let s = start + bi * SUB;
        let len = ob.len();
        // Word pairs start at even indices: always so in a whole array (`start` and `SUB` are
        // even), not in every run of a row.
        let key = key0.wrapping_add(s as u64);
        let fused = fused && key.is_multiple_of(2);
        let r: &[u32] = if MODE == SR && !fused {
            match random {
                Random::Bits(bits, _) => &bits[s..s + len],
                Random::Seed(..) => {
                    let (g, mask) = seeded.as_ref().expect("set for Random::Seed");
                    fill_words(g, key, &mut rbuf[..len], *mask, level);
                    &rbuf[..len]
                }
                Random::None => &rbuf[..len],
            }
        } else {
            &rbuf[..len]
        };
        if let Source::F64(x) = src {
            f64_block::<MODE, O>(&x[s..s + len], r, ob, p, level);
            continue;
        }
        let x: &[f32] = match src {
            Source::F32(x) => &x[s..s + len],
            Source::Bf16(x) => {
                for (d, &b) in xbuf.iter_mut().zip(&x[s..s + len]) {
                    *d = f32::from_bits((b as u32) << 16);
                }
                &xbuf[..len]
            }
            Source::F16(x) => {
                for (d, &b) in xbuf.iter_mut().zip(&x[s..s + len]) {
                    *d = super::f16_to_f32(b);
                }
                &xbuf[..len]
            }
            Source::Fp8(x, _) => {
                let lut = lut.as_ref().map_or(&[0f32; 256], |l| l);
                for (d, &b) in xbuf.iter_mut().zip(&x[s..s + len]) {
                    *d = lut[b as usize];
                }
                &xbuf[..len]
            }
            Source::F64(_) => unreachable!("handled above"),
        };
        if identity {
            // Every float32 is an fp32 value: the identity, NaN payloads included; only an
            // infinite input changes, to +-max, under saturation.
            let inf_mag = p.inf_code;
            for (o, &v) in ob.iter_mut().zip(x) {
                let b = v.to_bits();
                let b =
                    if b & 0x7FFF_FFFF == 0x7F80_0000 { (b & 0x8000_0000) | inf_mag } else { b };
                *o = O::from_u32(b);
            }
        } else if fused {
            #[cfg(target_arch = "x86_64")]
            {
                let (g, mask) = seeded.as_ref().expect("fused implies a seed");
                // SAFETY: `fused` implies level SIMD_AVX512, which never exceeds the detected
                // level, so the CPU has the features.
                unsafe { avx512::sr_f32_seeded::<O>(x, g, key, *mask, ob, p) }
            }
        } else {
            f32_block::<MODE, O>(x, r, ob, p, level);
        }
    }
}

#[inline(always)]
fn f32_loop<const MODE: u8, O: Code>(x: &[f32], r: &[u32], out: &mut [O], p: &Params) {
    if MODE == RNE && p.bf16_rne {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = O::from_u32(kernels::round_f32_bf16_rne(v.to_bits()));
        }
    } else if MODE == SR {
        for ((o, &v), &w) in out.iter_mut().zip(x).zip(r) {
            *o = O::from_u32(kernels::round_f32::<MODE>(v.to_bits(), w, p));
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = O::from_u32(kernels::round_f32::<MODE>(v.to_bits(), 0, p));
        }
    }
}

#[inline(always)]
fn f64_loop<const MODE: u8, O: Code>(x: &[f64], r: &[u32], out: &mut [O], p: &Params) {
    if MODE == SR {
        for ((o, &v), &w) in out.iter_mut().zip(x).zip(r) {
            *o = O::from_u32(kernels::round_f64::<MODE>(v.to_bits(), w, p));
        }
    } else {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = O::from_u32(kernels::round_f64::<MODE>(v.to_bits(), 0, p));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2,bmi2")]
    pub unsafe fn fill_avx2(g: &StochasticBits, start: u64, out: &mut [u32], mask: u32) {
        g.fill(start, out, mask)
    }

    /// `$name`: the loop `$body` compiled with the target features `$features` (so that it
    /// vectorises for them).
    macro_rules! compiled_for {
        ($name:ident, $features:literal, $x:ty, $body:ident) => {
            /// # Safety
            #[doc = concat!("The CPU must support ", $features, ".")]
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const MODE: u8, O: Code>(
                x: &[$x], r: &[u32], out: &mut [O], p: &Params,
            ) {
                $body::<MODE, O>(x, r, out, p)
            }
        };
    }

    compiled_for!(f32_avx512, "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi2", f32, f32_loop);
    compiled_for!(f32_avx2, "avx2,bmi2", f32, f32_loop);
    compiled_for!(f64_avx512, "avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi2", f64, f64_loop);
    compiled_for!(f64_avx2, "avx2,bmi2", f64, f64_loop);
}

/// SIMD levels: portable Rust, AVX2 (auto-vectorised), AVX-512 (explicit where it pays).
pub(crate) const SIMD_PORTABLE: u8 = 0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const SIMD_AVX2: u8 = 1;
pub(crate) const SIMD_AVX512: u8 = 2;
const SIMD_BEST: u8 = SIMD_AVX512;

/// Whether this CPU has AVX-512F with the BW, VL and DQ subsets (what the explicit AVX-512
/// code of the core needs).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_bw_vl_dq() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq")
}

/// The widest SIMD level this CPU offers (feature detection caches its answers).
#[cfg(target_arch = "x86_64")]
pub(crate) fn simd_level() -> u8 {
    if has_avx512_bw_vl_dq() {
        SIMD_AVX512
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi2")
    {
        SIMD_AVX2
    } else {
        SIMD_PORTABLE
    }
}

/// Without x86-64 there is only the portable code.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn simd_level() -> u8 {
    SIMD_PORTABLE
}

/// The seeded generator's words for flat indices `0..out.len()` (what `Random::Seed` uses),
/// vectorised and in parallel.
/// Under a cancelled token (`crate::cancel`) the remaining chunks are skipped: check it after.
pub fn stochastic_words(seed: u64, out: &mut [u32]) {
    stochastic_words_level(seed, out, SIMD_BEST)
}

/// Most words [`random_words_into`] writes in one call: an emulator limit (256 GiB of words),
/// not the hardware's, so a request is refused at once on any host.
pub const MAX_RANDOM_WORDS: u64 = 1 << 36;

/// The length of a request for `n` generator words, or `CapacityError` on `arg` beyond
/// [`MAX_RANDOM_WORDS`]: checked before the result is allocated.
pub fn random_words_len(arg: &str, n: u64) -> Result<usize> {
    if n > MAX_RANDOM_WORDS {
        return Err(Error::capacity(
            arg,
            format!("{n} elements is more than this emulator allocates at once (2**36)"),
        ));
    }
    usize::try_from(n).map_err(|_| Error::capacity(arg, format!("{n} elements")))
}

/// [`stochastic_words`] for a request checked by [`random_words_len`]: `Error::Interrupted`
/// when the call was cancelled (the words are then incomplete).
pub fn random_words_into(seed: u64, out: &mut [u32]) -> Result<()> {
    random_words_len("shape", out.len() as u64)?;
    stochastic_words(seed, out);
    crate::cancel::check()
}

/// [`stochastic_words`] at SIMD level at most `level`.
pub(crate) fn stochastic_words_level(seed: u64, out: &mut [u32], level: u8) {
    let g = StochasticBits::new(seed);
    let level = level.min(simd_level());
    let cancel = crate::cancel::current();
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .filter(|_| !cancel.is_cancelled())
        .for_each(|(i, c)| fill_words(&g, (i * CHUNK) as u64, c, !0, level));
}

/// The generator's words for `start..start + out.len()`, ANDed with `mask`, at `level`
/// (at most this CPU's).
pub(crate) fn fill_words(g: &StochasticBits, start: u64, out: &mut [u32], mask: u32, level: u8) {
    #[cfg(target_arch = "x86_64")]
    {
        match level {
            // SAFETY: `level` never exceeds the detected level, so the CPU has the features.
            SIMD_AVX512 => return unsafe { avx512::fill_words(g, start, out, mask) },
            // SAFETY: as above.
            SIMD_AVX2 => return unsafe { simd::fill_avx2(g, start, out, mask) },
            _ => {}
        }
    }
    g.fill(start, out, mask)
}

fn f32_block<const MODE: u8, O: Code + Store>(
    x: &[f32], r: &[u32], out: &mut [O], p: &Params, level: u8,
) {
    #[cfg(target_arch = "x86_64")]
    {
        match level {
            // SAFETY: `level` never exceeds the detected level, so the CPU has the features.
            SIMD_AVX512 if MODE == SR => return unsafe { avx512::sr_f32::<O>(x, r, out, p) },
            // SAFETY: as above.
            SIMD_AVX512 => return unsafe { simd::f32_avx512::<MODE, O>(x, r, out, p) },
            // SAFETY: as above.
            SIMD_AVX2 => return unsafe { simd::f32_avx2::<MODE, O>(x, r, out, p) },
            _ => {}
        }
    }
    f32_loop::<MODE, O>(x, r, out, p)
}

fn f64_block<const MODE: u8, O: Code>(x: &[f64], r: &[u32], out: &mut [O], p: &Params, level: u8) {
    #[cfg(target_arch = "x86_64")]
    {
        match level {
            // SAFETY: `level` never exceeds the detected level, so the CPU has the features.
            SIMD_AVX512 => return unsafe { simd::f64_avx512::<MODE, O>(x, r, out, p) },
            // SAFETY: as above.
            SIMD_AVX2 => return unsafe { simd::f64_avx2::<MODE, O>(x, r, out, p) },
            _ => {}
        }
    }
    f64_loop::<MODE, O>(x, r, out, p)
}
