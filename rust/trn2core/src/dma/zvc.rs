//! Zero-value compression ("zvc"): the scheme for ReLU activations and pruned weights.
//!
//! A coded block of `n` elements is a bitmask of `ceil(n / 8)` bytes (bit `i % 8` of byte
//! `i / 8` set when element `i` is non-zero, least significant bit first) followed by the
//! non-zero elements in order, packed. An element is zero only when *all* its bytes are zero, so
//! `-0.0` and every NaN or subnormal pattern are kept. The block is coded only if that is
//! smaller than storing it; a block of zeros costs nothing but its table entry.
//!
//! Both directions are branch-light: the encoder writes every element and advances the output
//! position by `is_nonzero * size`; the decoder selects each element with an arithmetic mask, so
//! the ~50% random zeros of ReLU outputs cost no mispredicted branches.

use super::word::Word;
use super::{corrupt, BlockMode};
use crate::Result;

/// Elements per zvc block: small enough that all-zero regions (pruned channels, padding) are
/// caught at a fine grain, large enough that the 4-byte table entry is < 1% of a 1-byte block.
pub(super) const BLOCK_ELEMS: usize = 512;

/// `SELECT[m][r]`: position of the `r`-th set bit of mask byte `m` (the encoder's gather
/// pattern); entries past the population count are 0 (their writes are overwritten or dropped).
static SELECT: [[u8; 8]; 256] = build_tables().0;

/// `RANK[m][k]`: for a set bit `k` of `m`, how many set bits precede it (the decoder's source
/// slot); for a clear bit, 8 (a slot holding zero).
static RANK: [[u8; 8]; 256] = build_tables().1;

/// `(SELECT, RANK)`: set bit `k` of mask `m` is the `r`-th, so `SELECT[m][r] = k` and
/// `RANK[m][k] = r`.
const fn build_tables() -> ([[u8; 8]; 256], [[u8; 8]; 256]) {
    let (mut select, mut rank) = ([[0u8; 8]; 256], [[8u8; 8]; 256]);
    let mut m = 0;
    while m < 256 {
        let (mut k, mut r) = (0, 0);
        while k < 8 {
            if m >> k & 1 != 0 {
                select[m][r] = k as u8;
                rank[m][k] = r as u8;
                r += 1;
            }
            k += 1;
        }
        m += 1;
    }
    (select, rank)
}

/// The mode and payload length of `block` (a whole number of `W` elements) under zvc: counts
/// its non-zero elements only, so the stream's layout is known before anything is written.
pub(super) fn plan_block<W: Word>(block: &[u8]) -> (BlockMode, usize) {
    let s = W::SIZE;
    let nnz = count::<W>(block);
    let coded = (block.len() / s).div_ceil(8) + nnz * s;
    if nnz == 0 {
        (BlockMode::Zero, 0)
    } else if coded >= block.len() {
        (BlockMode::Stored, block.len())
    } else {
        (BlockMode::Coded, coded)
    }
}

/// Non-zero elements of `block` (a whole number of `W` elements).
pub(super) fn count<W: Word>(block: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = super::simd::Avx512::detect() {
        return k.zvc_count(W::SIZE, block);
    }
    count_portable::<W>(block)
}

/// Writes the bitmask of `block` to `mask` (`ceil(n / 8)` bytes) and its non-zero elements to
/// `vals`, which needs `8 * W::SIZE` bytes of room past them; returns the bytes of `vals` used.
pub(super) fn pack<W: Word>(block: &[u8], mask: &mut [u8], vals: &mut [u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = super::simd::Avx512::detect() {
        return k.zvc_encode(W::SIZE, block, mask, vals);
    }
    encode_portable::<W>(block, mask, vals)
}

/// Expands a validated bitmask and its packed elements into `out` (the inverse of [`pack`]);
/// false if `vals` runs short (impossible once validated).
pub(super) fn unpack<W: Word>(mask: &[u8], vals: &[u8], out: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = super::simd::Avx512::detect() {
        return k.zvc_decode(W::SIZE, mask, vals, out);
    }
    decode_portable::<W>(mask, vals, out);
    true
}

/// Non-zero elements of `block`.
pub(super) fn count_portable<W: Word>(block: &[u8]) -> usize {
    block.chunks_exact(W::SIZE).map(|e| W::load(e).is_some_and(W::is_nonzero) as usize).sum()
}

/// Writes the coded form of `block` into `dst`, whose length [`plan_block`] gave for a
/// [`BlockMode::Coded`] block. Returns false if the lengths disagree (a bug, never data).
pub(super) fn encode_block<W: Word>(block: &[u8], dst: &mut [u8]) -> bool {
    let s = W::SIZE;
    let mask_len = (block.len() / s).div_ceil(8);
    let Some((mask, vals)) = dst.split_at_mut_checked(mask_len) else {
        return false;
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = super::simd::Avx512::detect() {
        return k.zvc_encode(s, block, mask, vals) == vals.len();
    }
    // The portable kernel writes whole groups of 8 gathered elements: code into scratch room
    // with 8 spare elements, then copy the exact bytes.
    let mut room = [0u8; BLOCK_ELEMS * 8 + 64];
    let Some(room) = room.get_mut(..block.len() + 8 * s) else {
        return false;
    };
    let used = encode_portable::<W>(block, mask, room);
    match room.get(..used) {
        Some(v) if used == vals.len() => {
            vals.copy_from_slice(v);
            true
        }
        _ => false,
    }
}

/// The portable encoder: writes the bitmask of `block` to `mask` and the packed non-zero
/// elements to `vals` (which needs `8 * W::SIZE` spare bytes); returns the bytes of `vals` used.
pub(super) fn encode_portable<W: Word>(block: &[u8], mask: &mut [u8], vals: &mut [u8]) -> usize {
    let s = W::SIZE;
    let mut j = 0usize;
    for (grp, m_out) in block.chunks(8 * s).zip(mask.iter_mut()) {
        // A short last group reads as zeros past its end, which the mask then leaves out.
        let g: [W; 8] =
            std::array::from_fn(|k| grp.get(k * s..).and_then(W::load).unwrap_or(W::ZERO));
        let mut m = 0u8;
        for (k, w) in g.iter().enumerate() {
            m |= (w.is_nonzero() as u8) << k;
        }
        if let Some(dst) = vals.get_mut(j..j + 8 * s) {
            for (d, &k) in dst.chunks_exact_mut(s).zip(&SELECT[m as usize]) {
                g[k as usize & 7].store(d);
            }
        }
        j += m.count_ones() as usize * s;
        *m_out = m;
    }
    j
}

/// Decodes one coded block `payload` into `out` (the block's raw bytes, a whole number of `W`
/// elements). Checks the payload's length against the mask's population count first, so no read
/// depends on unchecked input.
pub(super) fn decode_block<W: Word>(payload: &[u8], out: &mut [u8]) -> Result<()> {
    let s = W::SIZE;
    let n = out.len() / s;
    let mask_len = n.div_ceil(8);
    let (mask, vals) = payload
        .split_at_checked(mask_len)
        .ok_or_else(|| corrupt("zvc block shorter than its bitmask"))?;
    let nnz: usize = mask.iter().map(|b| b.count_ones() as usize).sum();
    if !n.is_multiple_of(8) && mask.last().is_some_and(|&l| l >> (n % 8) != 0) {
        return Err(corrupt("zvc bitmask has bits set past the end of the block"));
    }
    if nnz == 0 || nnz * s != vals.len() || payload.len() >= out.len() {
        return Err(corrupt(format!(
            "zvc block of {n} elements: bitmask counts {nnz} non-zero elements but {} value \
             bytes follow",
            vals.len()
        )));
    }
    if unpack::<W>(mask, vals, out) {
        Ok(())
    } else {
        Err(corrupt("zvc values run short"))
    }
}

/// The portable decoder of a validated block: `mask` of `ceil(n / 8)` bytes, `vals` holding
/// exactly its population count of elements, `out` of `n` elements.
pub(super) fn decode_portable<W: Word>(mask: &[u8], vals: &[u8], out: &mut [u8]) {
    let s = W::SIZE;
    let mut j = 0usize;
    for (og, &m) in out.chunks_mut(8 * s).zip(mask) {
        let window = vals.get(j..j + 8 * s);
        let src: [W; 16] = std::array::from_fn(|k| {
            window.and_then(|w| w.get(k * s..)).and_then(W::load).unwrap_or(W::ZERO)
        });
        if window.is_some() {
            // Eight candidates loaded unconditionally; each output picks its slot (8 = zero).
            for (d, &r) in og.chunks_exact_mut(s).zip(&RANK[m as usize]) {
                src[r as usize & 15].store(d);
            }
        } else {
            // Fewer than 8 elements left in the payload: the checked path.
            let mut r = j;
            for (k, d) in og.chunks_exact_mut(s).enumerate() {
                let bit = (m >> k) as usize & 1;
                let w = vals.get(r..).and_then(W::load).unwrap_or(W::ZERO);
                w.keep(bit).store(d);
                r += bit * s;
            }
        }
        j += m.count_ones() as usize * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every length up to a few vectors, with zeros at random places and densities.
    fn blocks(s: usize) -> Vec<Vec<u8>> {
        let mut z = 7u64;
        let mut out = Vec::new();
        for n in (0..=70).chain([127, 128, 129, 511, 512]) {
            for density in [0u64, 1, 8, 15, 16] {
                let mut b = Vec::with_capacity(n * s);
                for _ in 0..n {
                    z = crate::numerics::mix64(z);
                    let keep = (z & 15) < density;
                    let v = if keep { (z >> 8) | 1 << (z % (8 * s as u64)) } else { 0 };
                    b.extend_from_slice(&v.to_le_bytes()[..s]);
                }
                out.push(b);
            }
        }
        out
    }

    fn check<W: Word>() {
        for block in blocks(W::SIZE) {
            let n = block.len() / W::SIZE;
            let mask_len = n.div_ceil(8);
            let mut a = vec![0u8; mask_len + block.len() + 64];
            let (mask, vals) = a.split_at_mut(mask_len);
            let used = encode_portable::<W>(&block, mask, vals);
            assert_eq!(count_portable::<W>(&block), used / W::SIZE);
            let (mask, vals) = (mask.to_vec(), vals[..used].to_vec());
            let mut back = vec![0xEEu8; block.len()];
            decode_portable::<W>(&mask, &vals, &mut back);
            assert_eq!(back, block, "portable, {n} elements of {}", W::SIZE);
            #[cfg(target_arch = "x86_64")]
            if let Some(k) = super::super::simd::Avx512::detect() {
                assert_eq!(k.zvc_count(W::SIZE, &block), used / W::SIZE);
                let mut b = vec![0u8; mask_len + used];
                let (m2, v2) = b.split_at_mut(mask_len);
                assert_eq!(k.zvc_encode(W::SIZE, &block, m2, v2), used);
                assert_eq!((&*m2, &*v2), (&mask[..], &vals[..]), "AVX-512 encode");
                let mut back2 = vec![0xEEu8; block.len()];
                assert!(k.zvc_decode(W::SIZE, &mask, &vals, &mut back2));
                assert_eq!(back2, block, "AVX-512 decode");
            }
        }
    }

    #[test]
    fn portable_and_avx512_kernels_agree() {
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
    }
}
