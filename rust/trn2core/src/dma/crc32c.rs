//! CRC-32C (Castagnoli), the checksum that closes every compressed stream.
//!
//! Reflected polynomial `0x82F63B78`, initial value and final XOR `0xFFFFFFFF` (the iSCSI / ext4
//! / `crc32c` crate definition; check value `crc32c(b"123456789") == 0xE3069283`). Written here
//! with slicing-by-16 tables built at compile time, so the core needs no extra dependency, and with
//! [`combine`] so that chunks checksummed in parallel give the checksum of the whole stream.

/// The reflected CRC-32C polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Slicing tables: `TABLES[0]` is the byte-at-a-time table; `TABLES[k][b]` is the CRC of byte `b`
/// followed by `k` zero bytes, so 16 input bytes are folded with 16 independent lookups.
static TABLES: [[u32; 256]; 16] = build_tables();

const fn build_tables() -> [[u32; 256]; 16] {
    let mut t = [[0u32; 256]; 16];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 16 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

/// Feeds `data` into a running (not yet finalised, i.e. inverted) CRC register: the `CRC32`
/// instruction where the CPU has it, the tables otherwise.
fn update_raw(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(c) = sse42::crc32c_update_raw(crc, data) {
        return c;
    }
    update_raw_tables(crc, data)
}

/// [`update_raw`] with the slicing-by-16 tables (the portable path).
pub(super) fn update_raw_tables(mut crc: u32, data: &[u8]) -> u32 {
    let t = &TABLES;
    let mut chunks = data.chunks_exact(16);
    for c in &mut chunks {
        // Byte j of the 16 (the first four XORed with the register) is followed by 15 - j more.
        let head = (crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes();
        crc = c.iter().enumerate().fold(0, |x, (j, &b)| {
            let b = if j < 4 { head[j] } else { b };
            x ^ t[15 - j][b as usize]
        });
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ b as u32) & 0xFF) as usize];
    }
    crc
}

/// The CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    update(0, data)
}

/// Continues a finished CRC-32C `crc` (of some prefix) over `data`:
/// `update(crc32c(a), b) == crc32c(a ++ b)`.
pub fn update(crc: u32, data: &[u8]) -> u32 {
    !update_raw(!crc, data)
}

/// Multiplies two polynomials modulo the CRC polynomial (bit-reflected representation, where
/// `1 << 31` is `x^0`): zlib's `multmodp`.
const fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `X2N[k]` is `x^(2^k)` modulo the polynomial.
const X2N: [u32; 64] = build_x2n();

const fn build_x2n() -> [u32; 64] {
    let mut t = [0u32; 64];
    let mut p = 1u32 << 30; // x^1
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = mult_mod_p(p, p);
        k += 1;
    }
    t
}

/// `x^(8 * len)` modulo the polynomial: the operator that shifts a CRC past `len` zero bytes.
const fn x8n_mod_p(len: u64) -> u32 {
    let mut p = 1u32 << 31; // x^0
    let mut n = len;
    let mut k = 3; // 8 * len = len << 3
    while n != 0 {
        if n & 1 != 0 {
            p = mult_mod_p(X2N[k & 63], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// Tables that shift a raw CRC register past `len` zero bytes with four lookups:
/// `shift(r) = T[0][r & 0xFF] ^ T[1][(r >> 8) & 0xFF] ^ T[2][(r >> 16) & 0xFF] ^ T[3][r >> 24]`
/// (the shift is linear over GF(2), so it splits by byte).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const fn shift_tables(len: u64) -> [[u32; 256]; 4] {
    let k = x8n_mod_p(len);
    let mut t = [[0u32; 256]; 4];
    let mut i = 0;
    while i < 4 {
        let mut b = 0;
        while b < 256 {
            t[i][b] = mult_mod_p(k, (b as u32) << (8 * i));
            b += 1;
        }
        i += 1;
    }
    t
}

/// The CRC-32C of `a ++ b` from `crc_a = crc32c(a)`, `crc_b = crc32c(b)` and `b.len()`
/// (zlib's `crc32_combine`), so chunks checksummed on different threads give one stream checksum.
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    mult_mod_p(x8n_mod_p(len_b), crc_a) ^ crc_b
}

/// The SSE4.2 `CRC32` instruction computes exactly CRC-32C: the fast path, chosen at run time;
/// it gives the same register as the portable loop (unit tests compare them).
#[cfg(target_arch = "x86_64")]
mod sse42 {
    use std::arch::x86_64::*;

    /// Feeds `data` into a running (inverted) CRC-32C register with the `CRC32` instruction, or
    /// returns `None` when the CPU lacks SSE4.2.
    #[inline]
    pub(super) fn crc32c_update_raw(crc: u32, data: &[u8]) -> Option<u32> {
        if !super::super::simd::forced_portable() && is_x86_feature_detected!("sse4.2") {
            // SAFETY: SSE4.2 was just detected.
            Some(unsafe { crc32c_sse42(crc, data) })
        } else {
            None
        }
    }

    /// Bytes per stream of the three-stream CRC loop.
    const LANE: usize = 8192;

    /// Shifts a raw CRC register past [`LANE`] zero bytes.
    static LANE_SHIFT: [[u32; 256]; 4] = super::shift_tables(LANE as u64);

    #[inline(always)]
    fn shift_lane(r: u64) -> u64 {
        let t = &LANE_SHIFT;
        (t[0][(r & 0xFF) as usize]
            ^ t[1][((r >> 8) & 0xFF) as usize]
            ^ t[2][((r >> 16) & 0xFF) as usize]
            ^ t[3][((r >> 24) & 0xFF) as usize]) as u64
    }

    #[target_feature(enable = "sse4.2")]
    fn crc32c_sse42(crc: u32, data: &[u8]) -> u32 {
        // Three independent streams over the thirds of each 24 KiB stretch hide the instruction's
        // 3-cycle latency; the registers are joined by shifting (the CRC is linear over GF(2)):
        // the register after `a ++ b` is shift(register after `a`, |b|) ^ (register after `b`
        // started from 0).
        let mut c = crc as u64;
        let mut big = data.chunks_exact(3 * LANE);
        for stretch in &mut big {
            let (a, rest) = stretch.split_at(LANE);
            let (b, d) = rest.split_at(LANE);
            let (mut ca, mut cb, mut cd) = (c, 0u64, 0u64);
            for ((x, y), z) in a.chunks_exact(8).zip(b.chunks_exact(8)).zip(d.chunks_exact(8)) {
                ca = _mm_crc32_u64(ca, le64(x));
                cb = _mm_crc32_u64(cb, le64(y));
                cd = _mm_crc32_u64(cd, le64(z));
            }
            c = shift_lane(shift_lane(ca) ^ cb) ^ cd;
        }
        let rest = big.remainder();
        let mut words = rest.chunks_exact(8);
        for w in &mut words {
            c = _mm_crc32_u64(c, le64(w));
        }
        let mut c = c as u32;
        for &b in words.remainder() {
            c = _mm_crc32_u8(c, b);
        }
        c
    }

    #[inline(always)]
    fn le64(b: &[u8]) -> u64 {
        b.first_chunk::<8>().map_or(0, |a| u64::from_le_bytes(*a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-at-a-time reference straight from the polynomial.
    fn slow(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 B.4: 32 bytes of zeros, of 0xFF, and an ascending sequence.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
    }

    #[test]
    fn tables_and_instruction_match_bitwise() {
        // Long enough for the instruction path's three-stream stretches and their remainders.
        let data: Vec<u8> =
            (0..60_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let lens = (0..200).chain([8191, 24_575, 24_576, 24_577, 30_001, 49_152, 60_000]);
        for n in lens {
            let want = slow(&data[..n]);
            assert_eq!(crc32c(&data[..n]), want, "length {n}");
            assert_eq!(!update_raw_tables(!0, &data[..n]), want, "tables, length {n}");
        }
    }

    #[test]
    fn shift_tables_shift() {
        let t = shift_tables(1000);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for r in [1u32, 0xDEAD_BEEF, 0x8000_0000, u32::MAX] {
            let want = update_raw_tables(r, &[0u8; 1000]);
            let got = t[0][(r & 0xFF) as usize]
                ^ t[1][((r >> 8) & 0xFF) as usize]
                ^ t[2][((r >> 16) & 0xFF) as usize]
                ^ t[3][(r >> 24) as usize];
            assert_eq!(got, want);
            // Linearity: the register after `data` from `r` is shift(r) ^ (from 0).
            assert_eq!(update_raw_tables(r, &data), got ^ update_raw_tables(0, &data));
        }
    }

    #[test]
    fn update_and_combine_match_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 + 7) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 7, 15, 16, 17, 500, 999, 1000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(update(crc32c(a), b), whole, "update at {cut}");
            assert_eq!(combine(crc32c(a), crc32c(b), b.len() as u64), whole, "combine at {cut}");
        }
    }
}
