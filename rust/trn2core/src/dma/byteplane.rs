//! The "byteplane" codec, for dense bf16/fp32 weights, activations and optimizer state.
//!
//! Float tensors are incompressible as whole words, yet their sign-and-exponent byte takes few
//! distinct values (a weight tensor of scale 0.02 spans about a dozen binades) while the mantissa
//! bytes are noise. So a block of up to [`BLOCK_ELEMS`] elements is
//!
//! 1. split into *zero elements* and *the rest* by an optional zvc bitmask (used when the zero
//!    elements' bytes outweigh the mask, as in ReLU outputs),
//! 2. transposed into byte planes (plane `p` holds byte `p` of every kept element, in memory
//!    order), and
//! 3. each plane coded with whichever fixed-width scheme is smallest for it: stored, a constant,
//!    or `k`-bit indices (`k` = 1..=7) into a table of its most frequent byte values, where the
//!    all-ones index escapes to a verbatim byte when more than `2^k` values occur.
//!
//! No entropy coder is involved: every index has the same width within a plane, so decoding is a
//! table lookup per byte. Block layout (after the stream's block table says "coded"):
//!
//! ```text
//! flags u8                  0 = every element kept, 1 = a zvc bitmask follows
//! [mask ceil(n/8) bytes]    as in zvc: bit i set when element i is non-zero
//! S planes of m bytes each  (m = n, or the mask's population count)
//!   mode u8                 0x00 stored: m bytes
//!                           0x80 constant: 1 byte
//!                           k or 0x40|k (k = 1..=7): packed, 0x40 = with escapes
//!   t u8, table t bytes     (packed) the byte values of indices 0..t
//!   [n_esc u16 LE]          (with escapes) number of escaped bytes
//!   indices ceil(m*k/8)     little-endian bit order, unused high bits of the last byte zero
//!   [escapes n_esc bytes]   (with escapes) the bytes of index 2^k - 1, in order
//! ```

use super::word::Word;
use super::{corrupt, zvc, BlockMode, Reader};
use crate::Result;

/// Elements per byteplane block: a 4096-byte plane, large enough that the value tables (at most
/// 127 bytes per plane) cost ~3% only in the worst case and ~0.1% typically.
pub(super) const BLOCK_ELEMS: usize = 4096;

const MODE_STORED: u8 = 0x00;
const MODE_CONST: u8 = 0x80;
const FLAG_ESCAPE: u8 = 0x40;

/// Per-thread working memory of the codec: the byte planes of one block and its packed
/// non-zero elements.
pub(super) struct Scratch {
    planes: Vec<u8>,
    packed: Vec<u8>,
}

impl Scratch {
    /// Room for any block (at most 8 planes of [`BLOCK_ELEMS`] bytes, plus the zvc kernels'
    /// spare group).
    pub(super) fn new() -> Self {
        Scratch { planes: vec![0; 8 * BLOCK_ELEMS], packed: vec![0; 8 * BLOCK_ELEMS + 64] }
    }
}

/// Plane `p` of `planes` (`m` bytes each) gets byte `p` of every element of `elems`.
fn split_planes(elems: &[u8], s: usize, planes: &mut [u8]) {
    let m = elems.len() / s;
    if m == 0 {
        return;
    }
    for (p, plane) in planes.chunks_exact_mut(m).enumerate() {
        for (d, e) in plane.iter_mut().zip(elems.chunks_exact(s)) {
            *d = e.get(p).copied().unwrap_or(0);
        }
    }
}

/// The inverse of [`split_planes`].
fn join_planes(planes: &[u8], s: usize, elems: &mut [u8]) {
    let m = elems.len() / s;
    if m == 0 {
        return;
    }
    for (p, plane) in planes.chunks_exact(m).enumerate() {
        for (e, &b) in elems.chunks_exact_mut(s).zip(plane) {
            if let Some(d) = e.get_mut(p) {
                *d = b;
            }
        }
    }
}

/// Appends the coded form of `block` (at most [`BLOCK_ELEMS`] whole `W` elements) to `out` and
/// returns the block's mode; for [`BlockMode::Stored`] and [`BlockMode::Zero`] nothing is
/// appended.
pub(super) fn encode_block<W: Word>(
    block: &[u8], out: &mut Vec<u8>, scratch: &mut Scratch,
) -> BlockMode {
    let s = W::SIZE;
    let n = block.len() / s;
    let nnz = zvc::count::<W>(block);
    if nnz == 0 {
        return BlockMode::Zero;
    }
    let use_mask = (n - nnz) * s > n.div_ceil(8);
    let start = out.len();
    out.push(use_mask as u8);
    let elems = if use_mask {
        let mask_at = out.len();
        out.resize(mask_at + n.div_ceil(8), 0);
        let used = zvc::pack::<W>(block, &mut out[mask_at..], &mut scratch.packed);
        scratch.packed.get(..used).unwrap_or(&[])
    } else {
        block
    };
    let m = elems.len() / s;
    let Some(planes) = scratch.planes.get_mut(..s * m) else {
        out.truncate(start);
        return BlockMode::Stored;
    };
    split_planes(elems, s, planes);
    for plane in planes.chunks_exact(m) {
        encode_plane(plane, out);
    }
    if out.len() - start >= block.len() {
        out.truncate(start);
        BlockMode::Stored
    } else {
        BlockMode::Coded
    }
}

/// Appends the smallest of the plane encodings of `plane` (non-empty) to `out`.
fn encode_plane(plane: &[u8], out: &mut Vec<u8>) {
    let m = plane.len();
    // Four partial histograms: runs of one value (the exponent plane) would otherwise chain
    // every increment on the previous one's store.
    let mut hists = [[0u32; 256]; 4];
    let mut quads = plane.chunks_exact(4);
    for q in &mut quads {
        for (h, &b) in hists.iter_mut().zip(q) {
            h[b as usize] += 1;
        }
    }
    for &b in quads.remainder() {
        hists[0][b as usize] += 1;
    }
    // Sort keys `count << 8 | (255 - value)`, descending: byte values by falling frequency,
    // ties by rising value (so the output is canonical).
    let mut keys: Vec<u32> = (0..256usize)
        .filter_map(|v| {
            let c = hists[0][v] + hists[1][v] + hists[2][v] + hists[3][v];
            (c > 0).then_some(c << 8 | (255 - v as u32))
        })
        .collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let order: Vec<u8> = keys.iter().map(|&k| 255 - (k & 0xFF) as u8).collect();
    let distinct = order.len();
    if distinct == 1 {
        out.extend_from_slice(&[MODE_CONST, order[0]]);
        return;
    }
    // covered[t]: elements whose value is among the `t` most frequent.
    let mut covered = Vec::with_capacity(distinct + 1);
    covered.push(0usize);
    for &k in &keys {
        let last = covered.last().copied().unwrap_or(0);
        covered.push(last + (k >> 8) as usize);
    }
    let mut best: (usize, Option<(usize, bool)>) = (1 + m, None);
    for k in 1..=7usize {
        let cap = 1usize << k;
        let index_bytes = (m * k).div_ceil(8);
        let cost = if distinct <= cap {
            (2 + distinct + index_bytes, false)
        } else {
            let escapes = m - covered[cap - 1];
            if escapes > u16::MAX as usize {
                continue;
            }
            (2 + (cap - 1) + 2 + index_bytes + escapes, true)
        };
        if cost.0 < best.0 {
            best = (cost.0, Some((k, cost.1)));
        }
    }
    let Some((k, escape)) = best.1 else {
        out.push(MODE_STORED);
        out.extend_from_slice(plane);
        return;
    };
    let cap = 1usize << k;
    let t = if escape { cap - 1 } else { distinct };
    let esc_code = (cap - 1) as u64;
    let mut code_of = [esc_code; 256];
    for (r, &v) in order.iter().take(t).enumerate() {
        code_of[v as usize] = r as u64;
    }
    out.push(k as u8 | if escape { FLAG_ESCAPE } else { 0 });
    out.push(t as u8);
    out.extend_from_slice(&order[..t]);
    let n_esc = m - covered[t];
    if escape {
        out.extend_from_slice(&(n_esc as u16).to_le_bytes());
    }
    // Eight k-bit indices fill exactly k bytes: pack each group of 8 into a word and store it
    // whole (8 bytes, the spare ones overwritten by the next group and cut at the end).
    let at = out.len();
    let index_bytes = (m * k).div_ceil(8);
    out.resize(at + index_bytes + 8, 0);
    let dst = &mut out[at..];
    for (g, grp) in plane.chunks(8).enumerate() {
        let mut acc = 0u64;
        for (i, &b) in grp.iter().enumerate() {
            acc |= code_of[b as usize] << (k * i);
        }
        if let Some(d) = dst.get_mut(g * k..g * k + 8) {
            d.copy_from_slice(&acc.to_le_bytes());
        }
    }
    out.truncate(at + index_bytes);
    if escape {
        out.extend(plane.iter().filter(|&&b| code_of[b as usize] == esc_code));
    }
}

/// Decodes one coded block `payload` into `out` (the block's raw bytes, a whole number of `W`
/// elements, at most [`BLOCK_ELEMS`] of them).
pub(super) fn decode_block<W: Word>(
    payload: &[u8], out: &mut [u8], scratch: &mut Scratch,
) -> Result<()> {
    let s = W::SIZE;
    let n = out.len() / s;
    let mut rd = Reader::new(payload);
    let mask = match rd.u8("byteplane flags")? {
        0 => None,
        1 => {
            let mask = rd.take(n.div_ceil(8), "byteplane bitmask")?;
            if !n.is_multiple_of(8) && mask.last().is_some_and(|&l| l >> (n % 8) != 0) {
                return Err(corrupt("byteplane bitmask has bits set past the end of the block"));
            }
            Some(mask)
        }
        f => return Err(corrupt(format!("byteplane block flags {f:#04x} unknown"))),
    };
    let m = mask.map_or(n, |mk| mk.iter().map(|b| b.count_ones() as usize).sum());
    if m == 0 {
        return Err(corrupt("byteplane block has no non-zero element"));
    }
    let planes = scratch
        .planes
        .get_mut(..s * m)
        .ok_or_else(|| corrupt("byteplane block larger than the codec allows"))?;
    for plane in planes.chunks_exact_mut(m) {
        decode_plane(&mut rd, plane)?;
    }
    if rd.remaining() != 0 {
        return Err(corrupt("byteplane block has trailing bytes"));
    }
    if payload.len() >= out.len() {
        return Err(corrupt("byteplane block coded larger than stored"));
    }
    match mask {
        None => join_planes(planes, s, out),
        Some(mask) => {
            let elems = scratch
                .packed
                .get_mut(..s * m)
                .ok_or_else(|| corrupt("byteplane block larger than the codec allows"))?;
            join_planes(planes, s, elems);
            if !zvc::unpack::<W>(mask, elems, out) {
                return Err(corrupt("byteplane bitmask and planes disagree"));
            }
        }
    }
    Ok(())
}

/// Decodes one plane from `rd` into `dst` (its `m` bytes).
fn decode_plane(rd: &mut Reader<'_>, dst: &mut [u8]) -> Result<()> {
    let m = dst.len();
    let mode = rd.u8("byteplane plane mode")?;
    match mode {
        MODE_STORED => dst.copy_from_slice(rd.take(m, "stored plane")?),
        MODE_CONST => dst.fill(rd.u8("constant plane")?),
        1..=7 | 0x41..=0x47 => {
            let k = (mode & 7) as usize;
            let escape = mode & FLAG_ESCAPE != 0;
            let cap = 1usize << k;
            let t = rd.u8("plane table size")? as usize;
            if t == 0 || t > cap - escape as usize {
                return Err(corrupt(format!("plane table of {t} entries for {k}-bit indices")));
            }
            let mut lut = [0u8; 128];
            lut[..t].copy_from_slice(rd.take(t, "plane table")?);
            let n_esc = if escape {
                let b = rd.take(2, "plane escape count")?;
                u16::from_le_bytes([b[0], b[1]]) as usize
            } else {
                0
            };
            let index_bytes = (m * k).div_ceil(8);
            let indices = rd.take(index_bytes, "plane indices")?;
            let escapes = rd.take(n_esc, "plane escapes")?;
            let code_mask = (cap - 1) as u64;
            let esc_code = if escape { cap - 1 } else { usize::MAX };
            // Each group of 8 indices is k whole bytes: read them as one word (zero-padded
            // past the end of the indices), then select each output byte without branching.
            let mut e = 0usize;
            let mut bad = false;
            for (g, grp) in dst.chunks_mut(8).enumerate() {
                let mut word = [0u8; 8];
                if let Some(w) = indices.get(g * k..g * k + 8) {
                    word.copy_from_slice(w);
                } else if let Some(w) = indices.get(g * k..) {
                    word[..w.len().min(8)].copy_from_slice(&w[..w.len().min(8)]);
                }
                let mut acc = u64::from_le_bytes(word);
                for d in grp.iter_mut() {
                    let code = (acc & code_mask) as usize;
                    acc >>= k;
                    let is_esc = code == esc_code;
                    bad |= code >= t && !is_esc;
                    *d =
                        if is_esc { escapes.get(e).copied().unwrap_or(0) } else { lut[code & 127] };
                    e += is_esc as usize;
                }
            }
            // The unused high bits of the last index byte must be zero.
            let pad = index_bytes * 8 - m * k;
            let last_ok = indices.last().is_none_or(|&l| pad == 0 || l >> (8 - pad) == 0);
            if bad || e != n_esc || !last_ok {
                return Err(corrupt(
                    "plane indices outside their table, or escapes or padding do not add up",
                ));
            }
        }
        _ => return Err(corrupt(format!("byteplane plane mode {mode:#04x} unknown"))),
    }
    Ok(())
}
