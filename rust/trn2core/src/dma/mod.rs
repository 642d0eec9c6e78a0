//! DMA inline compression (contract section 4): the functional half of Trainium2's "3.5 TB/s
//! DMA with inline memory compression and decompression" (\[S3\], docs/sources.md).
//!
//! The hardware's compression format is undocumented, so trn2core defines its own, chosen for
//! the data a training step actually moves. Every codec is lossless for every bit pattern (NaN
//! payloads, `-0.0`, subnormals) and works on the raw bytes of a typed array with elements of
//! 1, 2, 4 or 8 bytes:
//!
//! - [`Codec::None`] (`"none"`): the bytes stored as they are.
//! - [`Codec::Zvc`] (`"zvc"`): zero-value compression, per block of 512 elements a bitmask of
//!   the non-zero elements followed by those elements packed; the scheme for ReLU activations
//!   and pruned weights. An element is zero only if all its bytes are (`-0.0` is kept).
//! - [`Codec::BytePlane`] (`"byteplane"`): zvc's bitmask (when the zeros pay for it), then
//!   each byte plane of the kept elements coded with fixed-width indices into a table of its
//!   most frequent values; it gains on dense bf16/fp32 tensors, whose sign-and-exponent byte
//!   takes few distinct values (see [below](self#the-byteplane-codec)).
//!
//! Each block independently falls back to being stored when coding does not make it smaller, so
//! incompressible data grows by at most 2% plus 64 bytes (a 4-byte table entry per block of at
//! least 512 bytes, plus a header of ~25 bytes and the checksum).
//!
//! # API
//!
//! - [`compress`] / [`compress_into`]: raw bytes + element size + codec + dtype name + shape
//!   to one self-describing stream (the `_into` form reuses the caller's buffer).
//! - [`decompress`]: stream to [`Decoded`] (codec, dtype, element size, shape, bytes);
//!   [`decompress_into`] decodes into a buffer the caller owns (e.g. a NumPy array).
//! - [`plan_compress`]: the same in two passes (size, then write into a buffer of exactly that
//!   size the caller allocated); [`describe`]: a stream's header without a pass over the data.
//! - [`inspect`]: validates a stream (structure and checksum) and returns its [`StreamInfo`]
//!   without decoding: what `Compressed.from_bytes` needs.
//! - [`Codec`]: `name()` / `parse()` / `ALL`, the contract's `trn2core.dma.CODECS`.
//!
//! Measured ratios (`tests/it/dma.rs`, 2^20 elements each; zvc on dense data is stored):
//!
//! | data                        | zvc   | byteplane |
//! |-----------------------------|-------|-----------|
//! | weights N(0, 0.02), bf16    | 0.996 | 1.402     |
//! | weights N(0, 0.02), fp32    | 0.998 | 1.167     |
//! | ReLU(N(0, 1)), bf16         | 1.764 | 2.533     |
//! | ReLU(N(0, 1)), fp32         | 1.874 | 2.234     |
//! | GELU(N(0, 1)), bf16         | 0.996 | 1.416     |
//! | GELU(N(0, 1)), fp32         | 0.998 | 1.172     |
//! | Adam v = N(0, 1e-3)^2, fp32 | 0.998 | 1.176     |
//!
//! # Stream format (version 1)
//!
//! ```text
//! magic        4 bytes   b"T2CZ"
//! version      u8        1
//! codec        u8        0 none, 1 zvc, 2 byteplane
//! elem_size    u8        1, 2, 4 or 8
//! dtype        u8 length + UTF-8 (the caller's dtype name, e.g. "<f4", "bfloat16")
//! ndim         u8        at most 64; then ndim dims, each a LEB128 varint
//! raw_nbytes   varint    = prod(shape) * elem_size, at most 2^40
//! block_elems  varint    elements per block: 512 zvc, 4096 byteplane, 0 none
//! block table  u32 LE per block: payload length | mode << 30 (0 stored, 1 coded, 2 all zero)
//! payload      the blocks' payloads, in order ("none": the raw bytes)
//! crc32c       u32 LE    CRC-32C (Castagnoli) of every byte before it
//! ```
//!
//! Integers are little-endian; dims and sizes are canonical varints, which keeps the header
//! within the 64-byte allowance for any realistic shape. [`decompress`] parses and
//! bounds-checks the header and table before allocating anything (the table must fit in the
//! stream, so the declared size is bounded by the stream's own length), checks that every length
//! adds up exactly to the stream's length, verifies the checksum, and decodes with checked reads
//! only: a truncated, altered or forged stream gives [`Error::CorruptData`], never a panic.
//!
//! A zvc block is `ceil(n / 8)` mask bytes (bit `i % 8` of byte `i / 8` set when element `i` is
//! non-zero) followed by the non-zero elements in order.
//!
//! # The byteplane codec
//!
//! ```text
//! flags u8                  0 = every element kept, 1 = a zvc bitmask follows
//! [mask ceil(n/8) bytes]    as in zvc; the planes then hold only the non-zero elements
//! S planes of m bytes each  plane p = byte p of every kept element, in memory order
//!   mode u8                 0x00 stored: m bytes | 0x80 constant: 1 byte |
//!                           k or 0x40|k (k = 1..=7): packed, 0x40 = with escapes
//!   t u8, table t bytes     (packed) the byte values of indices 0..t, most frequent first
//!   [n_esc u16 LE]          (with escapes) number of escaped bytes
//!   indices ceil(m*k/8)     little-endian bit order, unused high bits of the last byte zero
//!   [escapes n_esc bytes]   (with escapes) the bytes whose index is 2^k - 1, in order
//! ```
//!
//! The encoder picks, per plane, the smallest of these; no entropy coder is involved, so
//! decoding is one table lookup per byte.
//!
//! # Speed
//!
//! Blocks are independent. Compression sizes every zvc block first (a population count), so
//! each parallel task (rayon, ~256 KiB of input) then writes straight into its own slice of the
//! one output buffer; decompression gives each task its slice of the output. Each task
//! checksums its part of the stream while it is in cache, and the partial CRCs are joined with
//! the CRC combine operator. On x86-64 the checksum uses the SSE4.2 `CRC32` instruction (it is
//! CRC-32C) and zvc uses AVX-512 `VPCOMPRESS`/`VPEXPAND` (whose lane-mask-plus-packed layout is
//! exactly zvc's), both chosen at run time; the portable paths write identical streams.

mod byteplane;
pub mod copy;
pub mod cost;
mod crc32c;
// AVX-512 intrinsics and target features are stable since Rust 1.89; the crate already needs
// that for the AVX-512 kernels of `numerics` and `engine`.
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod simd;
mod stream;
mod word;
mod zvc;

use crate::{Error, Result};

/// The four magic bytes that open every compressed stream.
pub const MAGIC: [u8; 4] = *b"T2CZ";

/// The stream format version this build writes and reads.
pub const VERSION: u8 = 1;

/// Largest array (in bytes) a stream may hold: 1 TiB, far beyond any device's HBM, so that a
/// forged size is refused before anything is allocated.
pub const MAX_RAW_NBYTES: u64 = 1 << 40;

/// Most dimensions a shape may have (NumPy's own limit).
pub const MAX_NDIM: usize = 64;

/// Longest dtype name, in UTF-8 bytes.
pub const MAX_DTYPE_LEN: usize = 255;

named_enum! {
    /// A compression scheme of the DMA engines.
    pub enum Codec("codec", format) {
        /// Stored as is.
        None = "none",
        /// Zero-value compression: bitmask of non-zero elements plus the packed non-zero elements.
        Zvc = "zvc",
        /// Optional zvc bitmask, then byte planes coded with per-plane value tables.
        BytePlane = "byteplane",
    }
}

impl Codec {
    /// The codec's id byte in the stream header.
    const fn id(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Zvc => 1,
            Codec::BytePlane => 2,
        }
    }

    /// The codec with id byte `id`.
    fn from_id(id: u8) -> Option<Codec> {
        Codec::ALL.iter().copied().find(|c| c.id() == id)
    }

    /// Elements per block this build writes (0: the codec has no blocks).
    const fn block_elems(self) -> usize {
        match self {
            Codec::None => 0,
            Codec::Zvc => zvc::BLOCK_ELEMS,
            Codec::BytePlane => byteplane::BLOCK_ELEMS,
        }
    }
}

/// What a stream's header says about the array it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The codec the stream was compressed with.
    pub codec: Codec,
    /// The dtype name the caller gave to [`compress`].
    pub dtype: String,
    /// Bytes per element (1, 2, 4 or 8).
    pub elem_size: usize,
    /// The array's shape (empty for a 0-d array).
    pub shape: Vec<u64>,
    /// Bytes of the array: `prod(shape) * elem_size`.
    pub raw_nbytes: u64,
    /// Bytes of the whole stream (what crosses the wire).
    pub nbytes: u64,
}

impl StreamInfo {
    /// Compression ratio `raw_nbytes / nbytes` (above 1 when the stream is smaller).
    pub fn ratio(&self) -> f64 {
        self.raw_nbytes as f64 / self.nbytes as f64
    }
}

/// A decompressed array: its description and its raw bytes (C order, native byte order as they
/// were given to [`compress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The codec the stream was compressed with.
    pub codec: Codec,
    /// The dtype name the caller gave to [`compress`].
    pub dtype: String,
    /// Bytes per element (1, 2, 4 or 8).
    pub elem_size: usize,
    /// The array's shape (empty for a 0-d array).
    pub shape: Vec<u64>,
    /// The array's bytes, bit for bit.
    pub bytes: Vec<u8>,
}

/// Compresses the raw bytes of an array into one self-describing stream.
///
/// `bytes` holds `prod(shape)` elements of `elem_size` bytes (1, 2, 4 or 8); `dtype` is stored
/// verbatim for the reader (at most [`MAX_DTYPE_LEN`] bytes). Errors: `ValueError` for another
/// element size, `ShapeError` when the byte count does not match the shape or the shape has more
/// than [`MAX_NDIM`] dims, `FormatError` for a too-long dtype name, `CapacityError` beyond
/// [`MAX_RAW_NBYTES`].
pub fn compress(
    bytes: &[u8], elem_size: usize, codec: Codec, dtype: &str, shape: &[u64],
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    compress_into(bytes, elem_size, codec, dtype, shape, &mut out)?;
    Ok(out)
}

/// [`compress`] into `out` (its old content replaced), reusing its allocation when it is large
/// enough: for a caller that streams many tensors, this skips the operating system's cost of
/// handing out fresh pages (on a VM, often more than the coding itself).
pub fn compress_into(
    bytes: &[u8], elem_size: usize, codec: Codec, dtype: &str, shape: &[u64], out: &mut Vec<u8>,
) -> Result<()> {
    let planned = plan_compress(bytes, elem_size, codec, dtype, shape)?;
    let total = planned.len();
    if out.capacity() >= total {
        out.clear();
        out.resize(total, 0);
    } else {
        // Zeroed by the allocator (fresh pages); each task then writes its own slice, so the
        // pages are first touched in parallel rather than by a memset here.
        *out = vec![0u8; total];
    }
    planned.write(out)
}

/// The first pass of [`compress`]: validates the arguments and sizes every block, so the
/// caller learns the stream's exact length ([`PlannedStream::len`]) before it allocates the
/// output, then writes it with [`PlannedStream::write`]. The Python binding uses this to let
/// NumPy allocate the stream (its allocator asks the kernel for huge pages, which on the test
/// VMs makes first-touch page faults several times cheaper than for a plain `Vec`).
pub fn plan_compress<'a>(
    bytes: &'a [u8], elem_size: usize, codec: Codec, dtype: &str, shape: &[u64],
) -> Result<PlannedStream<'a>> {
    validate(bytes, elem_size, dtype, shape)?;
    let info = StreamInfo {
        codec,
        dtype: dtype.to_string(),
        elem_size,
        shape: shape.to_vec(),
        raw_nbytes: bytes.len() as u64,
        nbytes: 0,
    };
    let encoder = stream::Encoder::plan(bytes, &info)?;
    let info = StreamInfo { nbytes: encoder.len() as u64, ..info };
    Ok(PlannedStream { encoder, info })
}

/// A sized, not yet written stream (see [`plan_compress`]).
pub struct PlannedStream<'a> {
    encoder: stream::Encoder<'a>,
    info: StreamInfo,
}

impl PlannedStream<'_> {
    /// Length of the stream in bytes.
    pub fn len(&self) -> usize {
        self.encoder.len()
    }

    /// Always false: a stream has at least its header and checksum.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// What the stream will describe (its `nbytes` is [`PlannedStream::len`]).
    pub fn info(&self) -> &StreamInfo {
        &self.info
    }

    /// Writes the stream into `out`, which must be exactly [`PlannedStream::len`] bytes long
    /// (its previous content does not matter: every byte is written).
    pub fn write(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.len() {
            return Err(Error::shape(
                "out",
                format!("output of {} bytes for a stream of {} bytes", out.len(), self.len()),
            ));
        }
        self.encoder.write(out)
    }
}

/// Checks the arguments of [`compress`].
fn validate(bytes: &[u8], elem_size: usize, dtype: &str, shape: &[u64]) -> Result<()> {
    if !matches!(elem_size, 1 | 2 | 4 | 8) {
        return Err(Error::value(
            "elem_size",
            format!("element size must be 1, 2, 4 or 8 bytes, got {elem_size}"),
        ));
    }
    if dtype.len() > MAX_DTYPE_LEN {
        return Err(Error::format(
            "dtype",
            format!("dtype name of {} bytes; at most {MAX_DTYPE_LEN} allowed", dtype.len()),
        ));
    }
    if shape.len() > MAX_NDIM {
        return Err(Error::shape(
            "shape",
            format!("{} dimensions; at most {MAX_NDIM} allowed", shape.len()),
        ));
    }
    let count = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|c| c.checked_mul(elem_size as u64));
    if count != Some(bytes.len() as u64) {
        return Err(Error::shape(
            "shape",
            format!(
                "shape {shape:?} of {elem_size}-byte elements does not match {} bytes",
                bytes.len()
            ),
        ));
    }
    if bytes.len() as u64 > MAX_RAW_NBYTES {
        return Err(Error::capacity(
            "x",
            format!("{} bytes; a compressed stream holds at most {MAX_RAW_NBYTES}", bytes.len()),
        ));
    }
    Ok(())
}

/// Decompresses a stream made by [`compress`]: the array's description and its exact bytes.
///
/// Any truncation, altered bit, bad magic or version, inconsistent length or absurd size gives
/// `CorruptDataError` ([`Error::CorruptData`]); sizes are checked against the stream before the
/// output is allocated.
pub fn decompress(stream: &[u8]) -> Result<Decoded> {
    let layout = stream::Layout::parse(stream)?;
    let n = usize::try_from(layout.info.raw_nbytes).map_err(|_| {
        Error::capacity(
            "stream",
            format!("{} bytes do not fit in this host's address space", layout.info.raw_nbytes),
        )
    })?;
    // All-zero blocks let a short stream declare a large array: the host must hold it.
    let mut bytes = crate::host::zeroed_vec("stream", "the decompressed array", n)?;
    layout.decode_into(stream, &mut bytes)?;
    let info = layout.info;
    Ok(Decoded {
        codec: info.codec,
        dtype: info.dtype,
        elem_size: info.elem_size,
        shape: info.shape,
        bytes,
    })
}

/// Decompresses a stream into `out`, which must be exactly `raw_nbytes` long (read it first
/// with [`inspect`]); returns the stream's description. Lets a caller decode straight into an
/// array it owns (a NumPy buffer) without a copy.
pub fn decompress_into(stream: &[u8], out: &mut [u8]) -> Result<StreamInfo> {
    let layout = stream::Layout::parse(stream)?;
    if out.len() as u64 != layout.info.raw_nbytes {
        return Err(Error::shape(
            "out",
            format!(
                "output of {} bytes for a stream of {} raw bytes",
                out.len(),
                layout.info.raw_nbytes
            ),
        ));
    }
    layout.decode_into(stream, out)?;
    Ok(layout.info)
}

/// Parses a stream's header and block table and checks that every size is consistent, without
/// reading the payload or verifying the checksum (cheap: no pass over the data). Enough to
/// allocate the output of [`decompress_into`], which verifies the checksum as it decodes.
pub fn describe(stream: &[u8]) -> Result<StreamInfo> {
    Ok(stream::Layout::parse(stream)?.info)
}

/// How many times its own length a stream may declare as its array before the checksum is
/// verified ahead of allocating the output ([`describe_for_output`]).
pub const TRUSTED_EXPANSION: u64 = 4;

/// A stream's header (as [`describe`]) to allocate the output of [`decompress_into`] from.
/// All-zero blocks let a stream of `L` bytes declare up to about `8192 L` bytes of array (a
/// 4-byte table entry per 32 KiB block), so when the header declares more than
/// [`TRUSTED_EXPANSION`] times the stream's length (and at least
/// [`crate::host::CHECK_FROM_BYTES`]), the checksum is verified first: a forged or damaged
/// length is refused as `CorruptDataError` before a large output is allocated, not after it
/// was filled. (A stream forged with a matching checksum can still declare that much: then
/// only the host check limits it.)
pub fn describe_for_output(stream: &[u8]) -> Result<StreamInfo> {
    let layout = stream::Layout::parse(stream)?;
    let raw = layout.info.raw_nbytes;
    if raw >= crate::host::CHECK_FROM_BYTES
        && raw > (stream.len() as u64).saturating_mul(TRUSTED_EXPANSION)
    {
        layout.verify_checksum(stream)?;
    }
    Ok(layout.info)
}

/// Validates a stream without decoding it: header, block table, lengths and checksum. This is
/// what `Compressed.from_bytes` runs; a stream that passes decodes unless it was forged with a
/// matching checksum (which [`decompress`] still reports as `CorruptDataError`).
pub fn inspect(stream: &[u8]) -> Result<StreamInfo> {
    let layout = stream::Layout::parse(stream)?;
    layout.verify_checksum(stream)?;
    Ok(layout.info)
}

/// The `CorruptDataError` every malformed stream produces.
pub(crate) fn corrupt(message: impl Into<String>) -> Error {
    Error::CorruptData { arg: "stream".to_string(), rule: None, message: message.into() }
}

/// How one block is held in the stream (the top two bits of its table entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockMode {
    /// The raw bytes.
    Stored = 0,
    /// The codec's coded form.
    Coded = 1,
    /// Nothing: every element is zero.
    Zero = 2,
}

/// A checked cursor over untrusted bytes: every read fails with `CorruptDataError` instead of
/// reading past the end.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let got = self.pos.checked_add(n).and_then(|end| self.buf.get(self.pos..end)).ok_or_else(
            || {
                corrupt(format!(
                    "data ends inside {what}: {n} bytes needed, {} left",
                    self.remaining()
                ))
            },
        )?;
        self.pos += n;
        Ok(got)
    }

    /// The next byte.
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    /// The next unsigned LEB128 varint (canonical: at most 10 bytes, no redundant high zeros).
    pub(crate) fn varint(&mut self, what: &str) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            let bits = (b & 0x7F) as u64;
            if i == 9 && bits > 1 {
                return Err(corrupt(format!("{what} overflows 64 bits")));
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(corrupt(format!("{what} is not a canonical varint")));
                }
                return Ok(v);
            }
        }
        Err(corrupt(format!("{what} overflows 64 bits")))
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// Bytes read so far.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint_bytes(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        stream::put_varint(&mut out, v);
        out
    }

    #[test]
    fn varints_round_trip_and_reject_non_canonical() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, 1 << 40, u64::MAX] {
            let b = varint_bytes(v);
            let mut rd = Reader::new(&b);
            assert_eq!(rd.varint("v"), Ok(v));
            assert_eq!(rd.remaining(), 0);
        }
        for bad in [&[0x80u8, 0x00][..], &[0xFF; 10][..], &[0x80; 11][..], &[0x80][..]] {
            assert!(matches!(Reader::new(bad).varint("v"), Err(Error::CorruptData { .. })));
        }
    }

    #[test]
    fn codec_names_parse() {
        for c in Codec::ALL {
            assert_eq!(Codec::parse("codec", c.name()), Ok(c));
            assert_eq!(Codec::from_id(c.id()), Some(c));
        }
        let err = Codec::parse("codec", "lz4").expect_err("unknown codec");
        assert!(
            matches!(&err, Error::Format { arg, message, .. } if arg == "codec" && message.contains("zvc"))
        );
    }

    /// Replaces the stream's checksum with the right one for its (altered) content.
    fn reseal(stream: &mut [u8]) {
        let n = stream.len() - 4;
        let crc = crc32c::crc32c(&stream[..n]);
        stream[n..].copy_from_slice(&crc.to_le_bytes());
    }

    fn sample(codec: Codec, elem_size: usize, n: usize) -> Vec<u8> {
        let mut z = 99u64;
        let bytes: Vec<u8> = (0..n * elem_size)
            .map(|i| {
                z = crate::numerics::mix64(z);
                // Runs of zero elements, and values with few distinct high bytes.
                if (i / elem_size) % 5 < 2 {
                    0
                } else {
                    (z as u8) & if i % elem_size == elem_size - 1 { 0x1F } else { 0xFF }
                }
            })
            .collect();
        compress(&bytes, elem_size, codec, "x", &[n as u64]).expect("valid")
    }

    fn corrupt_err(r: Result<Decoded>) -> String {
        match r {
            Err(Error::CorruptData { arg, message, .. }) => {
                assert_eq!(arg, "stream");
                message
            }
            other => panic!("expected CorruptData, got {other:?}"),
        }
    }

    #[test]
    fn forged_headers_with_valid_checksums_are_refused() {
        let good = sample(Codec::Zvc, 4, 3000);
        // Version 2.
        let mut s = good.clone();
        s[4] = 2;
        reseal(&mut s);
        assert!(corrupt_err(decompress(&s)).contains("version 2"));
        // Unknown codec id.
        let mut s = good.clone();
        s[5] = 9;
        reseal(&mut s);
        assert!(corrupt_err(decompress(&s)).contains("codec"));
        // Element size 3.
        let mut s = good.clone();
        s[6] = 3;
        reseal(&mut s);
        corrupt_err(decompress(&s));
        // A shape claiming 2^40 bytes of zeros: the table it needs cannot fit, so nothing is
        // allocated.
        let mut s = MAGIC.to_vec();
        s.extend_from_slice(&[VERSION, 1, 1, 0, 1]);
        stream::put_varint(&mut s, 1 << 40);
        stream::put_varint(&mut s, 1 << 40);
        stream::put_varint(&mut s, 512);
        s.extend_from_slice(&[0; 4 + 4]);
        reseal(&mut s);
        assert!(corrupt_err(decompress(&s)).contains("table"));
        // Beyond the 2^40 limit, or not matching the shape.
        for (dim, raw) in [((1u64 << 40) + 1, (1u64 << 40) + 1), (10, 11)] {
            let mut s = MAGIC.to_vec();
            s.extend_from_slice(&[VERSION, 0, 1, 0, 1]);
            stream::put_varint(&mut s, dim);
            stream::put_varint(&mut s, raw);
            stream::put_varint(&mut s, 0);
            s.extend_from_slice(&[0; 11 + 4]);
            reseal(&mut s);
            assert!(corrupt_err(decompress(&s)).contains("raw size"));
        }
        // A shape whose element count overflows u64.
        let mut s = MAGIC.to_vec();
        s.extend_from_slice(&[VERSION, 0, 1, 0, 2]);
        stream::put_varint(&mut s, u64::MAX);
        stream::put_varint(&mut s, 2);
        stream::put_varint(&mut s, 0);
        stream::put_varint(&mut s, 0);
        s.extend_from_slice(&[0; 4]);
        reseal(&mut s);
        corrupt_err(decompress(&s));
    }

    /// Random alterations with a recomputed checksum reach the block decoders: whatever they
    /// do, decoding returns (an error or some array of the declared size) and never panics.
    #[test]
    fn forged_payloads_never_panic() {
        let mut z = 5u64;
        let mut rnd = || {
            z = crate::numerics::mix64(z);
            z
        };
        for codec in [Codec::Zvc, Codec::BytePlane, Codec::None] {
            for elem_size in [1, 2, 4, 8] {
                let good = sample(codec, elem_size, 1500);
                let info = inspect(&good).expect("valid");
                let mut rejected = 0;
                for round in 0..1500 {
                    let mut s = good.clone();
                    let body = s.len() - 4;
                    let edits = 1 + (rnd() % 4) as usize;
                    for _ in 0..edits {
                        let at = (rnd() as usize) % body;
                        s[at] = if round % 2 == 0 { rnd() as u8 } else { s[at] ^ 1 << (rnd() % 8) };
                    }
                    if round % 7 == 0 {
                        // Also cut the stream somewhere.
                        let cut = (rnd() as usize) % body;
                        s.drain(cut..body);
                    }
                    reseal(&mut s);
                    match decompress(&s) {
                        Ok(d) => assert_eq!(
                            d.bytes.len() as u64,
                            d.shape.iter().product::<u64>() * d.elem_size as u64
                        ),
                        Err(Error::CorruptData { .. }) => rejected += 1,
                        Err(e) => panic!("unexpected error kind {e:?}"),
                    }
                }
                // Edits inside stored bytes decode (to other bytes); the rest break some rule.
                println!("{codec:?} {elem_size}: {rejected} of 1500 forgeries rejected");
                assert!(rejected > 150, "{codec:?} {elem_size}: only {rejected} rejected");
                assert_eq!(info.codec, codec);
            }
        }
    }

    /// The portable kernels and the x86 ones (AVX-512 zvc, SSE4.2 CRC) write identical streams
    /// and read each other's.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn portable_paths_write_and_read_the_same_streams() {
        let portable = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .start_handler(|_| simd::FORCE_PORTABLE.with(|f| f.set(true)))
            .build()
            .expect("thread pool");
        let mut z = 3u64;
        for elem_size in [1, 2, 4, 8] {
            for n in [0usize, 1, 9, 700, 5000, 70_001] {
                for density in [0u64, 3, 8, 16] {
                    let bytes: Vec<u8> = (0..n)
                        .flat_map(|_| {
                            z = crate::numerics::mix64(z);
                            let v = if z & 15 < density { z >> 8 | 1 } else { 0 };
                            v.to_le_bytes().into_iter().take(elem_size)
                        })
                        .collect();
                    for codec in Codec::ALL {
                        let shape = [n as u64];
                        let fast = compress(&bytes, elem_size, codec, "t", &shape).expect("ok");
                        let slow = portable
                            .install(|| compress(&bytes, elem_size, codec, "t", &shape))
                            .expect("ok");
                        assert!(fast == slow, "{codec:?} {elem_size} {n} {density}");
                        let back = portable.install(|| decompress(&fast)).expect("ok");
                        assert!(back.bytes == bytes, "{codec:?} {elem_size} {n} {density}");
                    }
                }
            }
        }
    }

    /// Every block mode and plane mode of byteplane is exercised by data designed for it.
    #[test]
    fn byteplane_plane_modes() {
        let mut scratch = byteplane::Scratch::new();
        // Constant high byte, 3 distinct low bytes (2-bit), 40 distinct (6-bit), random (stored).
        let mut block = Vec::new();
        for i in 0..4096u32 {
            let lo =
                [(i % 3) as u8, (i % 40) as u8 + 1, (i.wrapping_mul(2_654_435_761) >> 13) as u8];
            block.extend_from_slice(&[lo[0], lo[1], lo[2], 0x3F]);
        }
        let mut out = Vec::new();
        let mode = byteplane::encode_block::<u32>(&block, &mut out, &mut scratch);
        assert_eq!(mode, BlockMode::Coded);
        // flags + 2-bit plane (2+3+1024) + 6-bit plane (2+40+3072) + stored (1+4096) + const (2)
        assert_eq!(out.len(), 1 + 1029 + 3114 + 4097 + 2);
        let mut back = vec![0u8; block.len()];
        byteplane::decode_block::<u32>(&out, &mut back, &mut scratch).expect("valid block");
        assert_eq!(back, block);
    }
}
