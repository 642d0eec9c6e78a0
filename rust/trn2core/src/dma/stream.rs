//! The stream container: header, block table, parallel block coding and the checksum.

use rayon::prelude::*;

use super::crc32c::{combine, crc32c};
use super::word::Word;
use super::{
    byteplane, corrupt, zvc, BlockMode, Codec, Reader, StreamInfo, MAGIC, MAX_NDIM, MAX_RAW_NBYTES,
    VERSION,
};
use crate::Result;

/// Raw bytes per parallel task: big enough to amortise scheduling, small enough that a task's
/// input, output and stream slice stay in L2 while it is checksummed and coded.
const TASK_RAW_BYTES: usize = 256 * 1024;

/// Largest block a reader accepts, in bytes and in elements: blocks are coded in per-thread
/// scratch memory, and the cap bounds how much output a single 4-byte table entry may claim.
const MAX_BLOCK_BYTES: u64 = 64 * 1024;
const MAX_BLOCK_ELEMS: u64 = byteplane::BLOCK_ELEMS as u64;

/// Bits of a table entry holding the payload length; the two above hold the [`BlockMode`].
const LEN_BITS: u32 = 30;
const LEN_MASK: u32 = (1 << LEN_BITS) - 1;

/// Appends `v` as an unsigned LEB128 varint.
pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Calls `f::<W>` with the word type of `elem_size` bytes (callers have validated it).
macro_rules! with_word {
    ($elem_size:expr, $f:ident ( $($arg:expr),* )) => {
        match $elem_size {
            1 => $f::<u8>($($arg),*),
            2 => $f::<u16>($($arg),*),
            4 => $f::<u32>($($arg),*),
            _ => $f::<u64>($($arg),*),
        }
    };
}

/// One parallel task's share of a stream being written: its blocks' table entries, the
/// length of its payload, and (for codecs whose sizes are only known by coding) the payload.
struct TaskPlan {
    table: Vec<u32>,
    coded: Option<Vec<u8>>,
    len: usize,
}

/// First pass over `chunk` (whole blocks of `block_bytes`, the last possibly short): zvc only
/// counts non-zero elements to size every block; byteplane codes into a buffer of its own.
fn plan_task<W: Word>(chunk: &[u8], codec: Codec, block_bytes: usize) -> TaskPlan {
    let entry = |mode: BlockMode, len: usize| {
        // Block payloads are at most MAX_BLOCK_BYTES, far below 2^30.
        len as u32 | (mode as u32) << LEN_BITS
    };
    match codec {
        Codec::None => TaskPlan { table: Vec::new(), coded: None, len: chunk.len() },
        Codec::Zvc => {
            let mut len = 0;
            let table = chunk
                .chunks(block_bytes)
                .map(|block| {
                    let (mode, n) = zvc::plan_block::<W>(block);
                    len += n;
                    entry(mode, n)
                })
                .collect();
            TaskPlan { table, coded: None, len }
        }
        Codec::BytePlane => {
            let mut scratch = byteplane::Scratch::new();
            let mut payload = Vec::with_capacity(chunk.len() + 64);
            let table = chunk
                .chunks(block_bytes)
                .map(|block| {
                    let at = payload.len();
                    let mode = byteplane::encode_block::<W>(block, &mut payload, &mut scratch);
                    if mode == BlockMode::Stored {
                        payload.extend_from_slice(block);
                    }
                    entry(mode, payload.len() - at)
                })
                .collect();
            TaskPlan { table, len: payload.len(), coded: Some(payload) }
        }
    }
}

/// Second pass: writes the task's payload into its slice `dst` of the stream (`plan.len`
/// bytes) and returns the slice's CRC, computed while it is in cache.
fn fill_task<W: Word>(chunk: &[u8], plan: &TaskPlan, dst: &mut [u8], block_bytes: usize) -> u32 {
    match &plan.coded {
        Some(p) if p.len() == dst.len() => dst.copy_from_slice(p),
        None if plan.table.is_empty() && chunk.len() == dst.len() => dst.copy_from_slice(chunk),
        _ => {
            let mut at = 0usize;
            for (block, &e) in chunk.chunks(block_bytes).zip(&plan.table) {
                let len = (e & LEN_MASK) as usize;
                let Some(d) = dst.get_mut(at..at + len) else {
                    break;
                };
                match e >> LEN_BITS {
                    0 if block.len() == len => d.copy_from_slice(block),
                    1 => {
                        let sized = zvc::encode_block::<W>(block, d);
                        debug_assert!(sized, "zvc plan and coding disagree");
                    }
                    _ => {}
                }
                at += len;
            }
        }
    }
    crc32c(dst)
}

/// A stream whose size is known and whose content is not yet written: the first pass of
/// compression (header built, every block sized; byteplane blocks already coded). Splitting the
/// two passes lets a caller allocate the output itself (a NumPy array) once the size is known.
pub(super) struct Encoder<'a> {
    bytes: &'a [u8],
    elem_size: usize,
    head: Vec<u8>,
    plans: Vec<TaskPlan>,
    block_bytes: usize,
    task_bytes: usize,
    front_len: usize,
    payload_len: usize,
}

impl<'a> Encoder<'a> {
    /// First pass over `bytes`, the array `info` describes (arguments validated by
    /// [`super::plan_compress`]). `Error::Interrupted` if the installed cancellation token fires
    /// (checked per 256 KiB task).
    pub(super) fn plan(bytes: &'a [u8], info: &StreamInfo) -> Result<Encoder<'a>> {
        let (codec, elem_size, dtype, shape) =
            (info.codec, info.elem_size, &info.dtype, &info.shape);
        let block_elems = codec.block_elems();
        let mut head = Vec::with_capacity(32 + dtype.len() + 10 * shape.len());
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&[VERSION, codec.id(), elem_size as u8, dtype.len() as u8]);
        head.extend_from_slice(dtype.as_bytes());
        head.push(shape.len() as u8);
        for &d in shape {
            put_varint(&mut head, d);
        }
        put_varint(&mut head, bytes.len() as u64);
        put_varint(&mut head, block_elems as u64);

        let block_bytes = block_elems * elem_size;
        let task_bytes = match block_bytes {
            0 => TASK_RAW_BYTES,
            b => (TASK_RAW_BYTES / b).max(1) * b,
        };
        let cancel = crate::cancel::current();
        let plans: Vec<TaskPlan> = bytes
            .par_chunks(task_bytes)
            .map(|chunk| {
                if cancel.is_cancelled() {
                    // Skipped: the result is thrown away below.
                    return TaskPlan { table: Vec::new(), coded: None, len: 0 };
                }
                with_word!(elem_size, plan_task(chunk, codec, block_bytes))
            })
            .collect();
        cancel.check()?;
        let table_len: usize = plans.iter().map(|t| 4 * t.table.len()).sum();
        let payload_len: usize = plans.iter().map(|t| t.len).sum();
        let front_len = head.len() + table_len;
        Ok(Encoder {
            bytes,
            elem_size,
            head,
            plans,
            block_bytes,
            task_bytes,
            front_len,
            payload_len,
        })
    }

    /// Length of the whole stream in bytes.
    pub(super) fn len(&self) -> usize {
        self.front_len + self.payload_len + 4
    }

    /// Second pass: writes the stream into `out`, exactly [`Encoder::len`] bytes long. Every
    /// byte is written (the caller may hand over uninitialised-then-zeroed or dirty memory).
    /// `Error::Interrupted` if the installed cancellation token fires (checked per task; the
    /// output is then incomplete).
    pub(super) fn write(&self, out: &mut [u8]) -> Result<()> {
        debug_assert_eq!(out.len(), self.len());
        let (front, rest) = out.split_at_mut(self.front_len);
        let (head_out, mut table_out) = front.split_at_mut(self.head.len());
        head_out.copy_from_slice(&self.head);
        for e in self.plans.iter().flat_map(|t| &t.table) {
            if let Some((d, r)) = std::mem::take(&mut table_out).split_first_chunk_mut::<4>() {
                *d = e.to_le_bytes();
                table_out = r;
            }
        }
        let crc_front = crc32c(front);
        let (mut payload, crc_out) = rest.split_at_mut(self.payload_len);
        let mut slices = Vec::with_capacity(self.plans.len());
        for t in &self.plans {
            let (a, b) = std::mem::take(&mut payload).split_at_mut(t.len);
            slices.push(a);
            payload = b;
        }
        let (elem_size, block_bytes) = (self.elem_size, self.block_bytes);
        let cancel = crate::cancel::current();
        let crcs: Vec<u32> = slices
            .into_par_iter()
            .zip(self.plans.par_iter())
            .zip(self.bytes.par_chunks(self.task_bytes))
            .map(|((dst, plan), chunk)| {
                if cancel.is_cancelled() {
                    return 0;
                }
                with_word!(elem_size, fill_task(chunk, plan, dst, block_bytes))
            })
            .collect();
        cancel.check()?;
        let crc = self
            .plans
            .iter()
            .zip(&crcs)
            .fold(crc_front, |acc, (t, &c)| combine(acc, c, t.len as u64));
        crc_out.copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }
}

/// A parsed and bounds-checked stream: everything but the payload's content is known valid.
pub(super) struct Layout {
    /// The header's description of the array.
    pub(super) info: StreamInfo,
    /// Elements per block (0 for "none").
    block_elems: usize,
    /// Offset of the payload in the stream.
    payload_at: usize,
    /// The block table.
    table: Vec<u32>,
    /// The checksum stored in the stream's last 4 bytes.
    stored_crc: u32,
}

impl Layout {
    /// Parses the header and block table of `stream` and checks that every size is consistent
    /// with the shape and adds up to the stream's length. Reads no payload.
    pub(super) fn parse(stream: &[u8]) -> Result<Layout> {
        let (body, crc_bytes) = stream
            .split_last_chunk::<4>()
            .ok_or_else(|| corrupt(format!("{} bytes are too short for a stream", stream.len())))?;
        let stored_crc = u32::from_le_bytes(*crc_bytes);
        let mut rd = Reader::new(body);
        if rd.take(4, "magic")? != MAGIC {
            return Err(corrupt("not a trn2core compressed stream (bad magic bytes)"));
        }
        let version = rd.u8("version")?;
        if version != VERSION {
            return Err(corrupt(format!(
                "stream format version {version}; this build reads version {VERSION}"
            )));
        }
        let codec_id = rd.u8("codec")?;
        let codec = Codec::from_id(codec_id)
            .ok_or_else(|| corrupt(format!("unknown codec id {codec_id}")))?;
        let elem_size = rd.u8("element size")? as usize;
        if !matches!(elem_size, 1 | 2 | 4 | 8) {
            return Err(corrupt(format!("element size {elem_size}")));
        }
        let dtype_len = rd.u8("dtype length")? as usize;
        let dtype = std::str::from_utf8(rd.take(dtype_len, "dtype")?)
            .map_err(|_| corrupt("dtype name is not UTF-8"))?
            .to_string();
        let ndim = rd.u8("ndim")? as usize;
        if ndim > MAX_NDIM {
            return Err(corrupt(format!("{ndim} dimensions; at most {MAX_NDIM}")));
        }
        let mut shape = Vec::with_capacity(ndim);
        let mut count = Some(elem_size as u64);
        for _ in 0..ndim {
            let d = rd.varint("shape")?;
            count = count.and_then(|c| c.checked_mul(d));
            shape.push(d);
        }
        let raw_nbytes = rd.varint("raw size")?;
        if count != Some(raw_nbytes) || raw_nbytes > MAX_RAW_NBYTES {
            return Err(corrupt(format!(
                "raw size {raw_nbytes} does not match shape {shape:?} of {elem_size}-byte \
                 elements, or exceeds {MAX_RAW_NBYTES}"
            )));
        }
        let block_elems = rd.varint("block size")?;
        let payload_left = |rd: &Reader<'_>| rd.remaining() as u64;
        let mut table = Vec::new();
        if codec == Codec::None {
            if block_elems != 0 || payload_left(&rd) != raw_nbytes {
                return Err(corrupt(format!(
                    "stored stream of {raw_nbytes} raw bytes carries {} payload bytes",
                    payload_left(&rd)
                )));
            }
        } else {
            if block_elems == 0
                || block_elems > MAX_BLOCK_ELEMS
                || block_elems * elem_size as u64 > MAX_BLOCK_BYTES
            {
                return Err(corrupt(format!("block of {block_elems} elements")));
            }
            let block_bytes = block_elems * elem_size as u64;
            let n_blocks = raw_nbytes.div_ceil(block_bytes);
            // Refuse a table that cannot fit before allocating it: this bounds the declared
            // raw size by the stream's own length.
            if n_blocks.saturating_mul(4) > payload_left(&rd) {
                return Err(corrupt(format!(
                    "{n_blocks} blocks need a {}-byte table; only {} bytes follow",
                    n_blocks.saturating_mul(4),
                    payload_left(&rd)
                )));
            }
            let entries = rd.take(n_blocks as usize * 4, "block table")?;
            table.reserve_exact(n_blocks as usize);
            let mut sum = 0u64;
            for (b, e) in entries.chunks_exact(4).enumerate() {
                let e = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
                let len = (e & LEN_MASK) as u64;
                let raw = (raw_nbytes - b as u64 * block_bytes).min(block_bytes);
                let ok = match e >> LEN_BITS {
                    0 => len == raw,
                    1 => len > 0 && len < raw,
                    2 => len == 0,
                    _ => false,
                };
                if !ok {
                    return Err(corrupt(format!(
                        "block {b}: table entry {e:#010x} invalid for a block of {raw} bytes"
                    )));
                }
                sum += len;
                table.push(e);
            }
            if sum != payload_left(&rd) {
                return Err(corrupt(format!(
                    "block table accounts for {sum} payload bytes; the stream has {}",
                    payload_left(&rd)
                )));
            }
        }
        Ok(Layout {
            info: StreamInfo {
                codec,
                dtype,
                elem_size,
                shape,
                raw_nbytes,
                nbytes: stream.len() as u64,
            },
            block_elems: block_elems as usize,
            payload_at: rd.pos(),
            table,
            stored_crc,
        })
    }

    /// Compares the checksum of `parts` (consecutive slices covering the stream up to the
    /// stored checksum; their CRCs computed in parallel) with the stored one.
    fn check(&self, crcs: impl IntoIterator<Item = (u32, usize)>) -> Result<()> {
        let crc = crcs.into_iter().fold(0u32, |acc, (c, n)| combine(acc, c, n as u64));
        if crc != self.stored_crc {
            return Err(corrupt(format!(
                "checksum mismatch: stream says {:#010x}, content gives {crc:#010x}",
                self.stored_crc
            )));
        }
        Ok(())
    }

    /// Verifies the stream's checksum without decoding (`stream` is the one parsed).
    pub(super) fn verify_checksum(&self, stream: &[u8]) -> Result<()> {
        let body = stream.get(..stream.len().saturating_sub(4)).unwrap_or(&[]);
        let crcs: Vec<(u32, usize)> =
            body.par_chunks(TASK_RAW_BYTES).map(|c| (crc32c(c), c.len())).collect();
        self.check(crcs)
    }

    /// Decodes the payload of `stream` (the one parsed) into `out` (`raw_nbytes` long),
    /// checksumming each task's slice of the stream as it goes.
    pub(super) fn decode_into(&self, stream: &[u8], out: &mut [u8]) -> Result<()> {
        let head = stream.get(..self.payload_at).unwrap_or(&[]);
        let end = stream.len().saturating_sub(4);
        let payload = stream.get(self.payload_at..end).unwrap_or(&[]);
        if self.info.codec == Codec::None {
            if payload.len() != out.len() {
                return Err(corrupt("stored payload of the wrong length"));
            }
            let crcs: Vec<(u32, usize)> = out
                .par_chunks_mut(TASK_RAW_BYTES)
                .zip(payload.par_chunks(TASK_RAW_BYTES))
                .map(|(o, p)| {
                    o.copy_from_slice(p);
                    (crc32c(p), p.len())
                })
                .collect();
            return self.check(std::iter::once((crc32c(head), head.len())).chain(crcs));
        }
        let block_bytes = self.block_elems * self.info.elem_size;
        let blocks_per_task = (TASK_RAW_BYTES / block_bytes).max(1);
        // Each task's slice of the payload, from the table's lengths.
        let mut spans = Vec::with_capacity(self.table.len().div_ceil(blocks_per_task));
        let mut at = 0usize;
        for entries in self.table.chunks(blocks_per_task) {
            let len: usize = entries.iter().map(|&e| (e & LEN_MASK) as usize).sum();
            spans.push(at..at + len);
            at += len;
        }
        let cancel = crate::cancel::current();
        let results: Vec<(u32, usize, Result<()>)> = out
            .par_chunks_mut(blocks_per_task * block_bytes)
            .zip(self.table.par_chunks(blocks_per_task))
            .zip(spans.par_iter())
            .map(|((o, entries), span)| {
                if cancel.is_cancelled() {
                    return (0, 0, Err(crate::Error::Interrupted));
                }
                let p = payload.get(span.clone()).unwrap_or(&[]);
                let crc = crc32c(p);
                let r = with_word!(
                    self.info.elem_size,
                    decode_task(entries, p, o, self.info.codec, block_bytes)
                );
                (crc, p.len(), r)
            })
            .collect();
        // Skipped tasks make the checksum differ: report the interruption, not corruption.
        cancel.check()?;
        self.check(
            std::iter::once((crc32c(head), head.len()))
                .chain(results.iter().map(|&(c, n, _)| (c, n))),
        )?;
        results.into_iter().try_for_each(|(_, _, r)| r)
    }
}

/// Decodes the blocks of one task: `entries` are their table entries, `payload` their payloads
/// back to back, `out` their raw bytes.
fn decode_task<W: Word>(
    entries: &[u32], payload: &[u8], out: &mut [u8], codec: Codec, block_bytes: usize,
) -> Result<()> {
    let mut scratch = (codec == Codec::BytePlane).then(byteplane::Scratch::new);
    let mut at = 0usize;
    for (&e, o) in entries.iter().zip(out.chunks_mut(block_bytes)) {
        let len = (e & LEN_MASK) as usize;
        let p = payload
            .get(at..at + len)
            .ok_or_else(|| corrupt("block payload runs past the stream"))?;
        at += len;
        match e >> LEN_BITS {
            0 if p.len() == o.len() => o.copy_from_slice(p),
            0 => return Err(corrupt("stored block of the wrong length")),
            2 => o.fill(0),
            _ => match &mut scratch {
                Some(s) => byteplane::decode_block::<W>(p, o, s)?,
                None => zvc::decode_block::<W>(p, o)?,
            },
        }
    }
    Ok(())
}
