//! GpSimd instructions: the pattern instructions `iota` and `affine_select`, and the
//! per-partition gather `nc_n_gather`.
//!
//! Both evaluate, for partition `c` (counted from the tile's first partition) and free index
//! `(w, z, y, x)` of the pattern `[[step_w, num_w], ..., [step_x, num_x]]` (outermost first, up
//! to 4 pairs), the 32-bit integer `offset + c * channel_multiplier + w * step_w + ... + x *
//! step_x` (two's complement, wrapping). `iota` writes it converted to `dst`'s dtype (integers
//! saturate; floats round to nearest even through float32); `affine_select` compares it with 0
//! and picks `on_true`'s element or `on_false_value` (\[S9\]).

use crate::numerics::encode_scalar;
use crate::{Error, Result};

use super::super::dtype;
use super::super::record::{Engine, Opcode};
use super::super::Machine;
use super::alu::{self, AluOp};
use super::{shape_rule, Opnd};
use crate::machine::tile::{check_pattern_len, Tile, MAX_FREE_DIMS};

/// An iota / affine_select pattern: `(step, num)` pairs, outermost first.
pub type Pattern<'a> = &'a [(i64, u64)];

/// `ValueError` unless an affine pattern's `offset` and `channel_multiplier` are 32-bit integers
/// (what the instruction holds).
fn check_i32_coefficients(offset: i64, channel_multiplier: i64) -> Result<()> {
    for (arg, v) in [
        ("offset", offset),
        ("channel_multiplier", channel_multiplier),
    ] {
        if i32::try_from(v).is_err() {
            return Err(Error::value(arg, format!("{v} is not a 32-bit integer")));
        }
    }
    Ok(())
}

/// The 32-bit affine values of `pattern` for `partitions` channels, in logical order.
fn affine_values(
    pattern: Pattern,
    offset: i64,
    channel_multiplier: i64,
    partitions: u32,
    out: &mut Vec<i32>,
) {
    out.clear();
    let per: u64 = pattern.iter().map(|&(_, n)| n).product();
    for c in 0..partitions as i64 {
        let base = (offset as i32).wrapping_add((c as i32).wrapping_mul(channel_multiplier as i32));
        let mut idx = [0u64; MAX_FREE_DIMS];
        for _ in 0..per {
            let mut v = base;
            for (d, &(step, _)) in pattern.iter().enumerate() {
                v = v.wrapping_add((idx[d] as i32).wrapping_mul(step as i32));
            }
            out.push(v);
            let mut d = pattern.len();
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                if idx[d] < pattern[d].1 {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

impl Machine {
    fn check_pattern(&self, d: &Opnd, pattern: Pattern) -> Result<()> {
        check_pattern_len(pattern.len(), Error::value)?;
        let per: u128 = pattern.iter().map(|&(_, n)| n as u128).product();
        if per != d.n() as u128 {
            return Err(shape_rule(
                "pattern",
                "shape",
                format!(
                    "the pattern has {per} elements per partition; dst has {}",
                    d.n()
                ),
            ));
        }
        for (arg, v) in pattern.iter().map(|&(s, _)| ("pattern", s)) {
            if i32::try_from(v).is_err() {
                return Err(Error::value(
                    arg,
                    format!("step {v} is not a 32-bit integer"),
                ));
            }
        }
        Ok(())
    }

    /// `iota` (GpSimd engine): writes the affine pattern's values into `dst` (SBUF).
    pub fn iota(
        &mut self,
        dst: &Tile,
        pattern: Pattern,
        offset: i64,
        channel_multiplier: i64,
    ) -> Result<()> {
        let opc = Opcode::Iota;
        let engine = Engine::Gpsimd;
        check_i32_coefficients(offset, channel_multiplier)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.check_pattern(&d, pattern)?;
        let mut vals = Vec::new();
        affine_values(pattern, offset, channel_multiplier, d.p(), &mut vals);
        if dst.dtype.is_int() {
            let bits: Vec<u32> = vals
                .iter()
                .map(|&v| dst.dtype.saturate_int(v as i64))
                .collect();
            self.scatter_bits(&d, &bits)?;
        } else {
            let f: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
            self.scatter_f32(&d, &f)?;
        }
        self.record_engine(opc, engine, &[], &[], &d, 0);
        Ok(())
    }

    /// `affine_select` (GpSimd engine): `dst = cmp_op(affine, 0) ? on_true : on_false_value`
    /// (both tiles in SBUF); bit-exact when `on_true` has `dst`'s dtype, else through float32.
    #[allow(clippy::too_many_arguments)]
    pub fn affine_select(
        &mut self,
        dst: &Tile,
        pattern: Pattern,
        channel_multiplier: i64,
        on_true: &Tile,
        on_false_value: f64,
        cmp_op: AluOp,
        offset: i64,
    ) -> Result<()> {
        let opc = Opcode::AffineSelect;
        let engine = Engine::Gpsimd;
        if !matches!(
            cmp_op,
            AluOp::Equal
                | AluOp::NotEqual
                | AluOp::Greater
                | AluOp::GreaterEqual
                | AluOp::Less
                | AluOp::LessEqual
        ) {
            return Err(Error::value(
                "cmp_op",
                format!("{cmp_op} is not a comparison (equal, not_equal, greater, greater_equal, less, less_equal)"),
            ));
        }
        check_i32_coefficients(offset, channel_multiplier)?;
        let t = self.operand("on_true_tile", on_true, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.same_shape(opc, "on_true_tile", &t, &[("dst", &d)])?;
        self.check_pattern(&d, pattern)?;
        let mut aff = Vec::new();
        affine_values(pattern, offset, channel_multiplier, d.p(), &mut aff);
        let pred = |v: i32| alu::apply_int(cmp_op, v as i64, 0) != 0;
        if on_true.dtype == dst.dtype {
            let false_bits = match dst.dtype.format() {
                Some(f) => encode_scalar(
                    on_false_value as f32 as f64,
                    &f.encoding(),
                    crate::numerics::Rounding::NearestEven,
                    false,
                    None,
                )?,
                None => dtype::f32_to_int_bits(dst.dtype, on_false_value as f32),
            };
            let mut x = self.gather_bits(on_true)?;
            for (v, &a) in x.iter_mut().zip(&aff) {
                if !pred(a) {
                    *v = false_bits;
                }
            }
            self.scatter_bits(&d, &x)?;
        } else {
            let mut x = self.gather_f32(on_true)?;
            let fv = on_false_value as f32;
            for (v, &a) in x.iter_mut().zip(&aff) {
                let r = if pred(a) { *v } else { fv };
                *v = alu::canon(r);
            }
            let r = self.scatter_f32(&d, &x);
            r?;
        }
        self.record_engine(opc, engine, &[&t], &[], &d, 0);
        Ok(())
    }
}

impl Machine {
    /// `nc_n_gather` (GpSimd engine): `dst[p, j] = data[p, indices[p, j]]`, each partition's
    /// free axes of `data` flattened (logical order), bit for bit. All three in SBUF with the
    /// same partitions; `dst` has `data`'s dtype and `indices`' element count; `indices` is
    /// uint32, each in `0 .. elements per partition of data` (the documented range: an index
    /// outside it is an error here, naming it).
    pub fn nc_n_gather(&mut self, dst: &Tile, data: &Tile, indices: &Tile) -> Result<()> {
        let opc = Opcode::NcNGather;
        let engine = Engine::Gpsimd;
        let a = self.operand("data", data, Some(engine), false)?;
        let i = self.operand("indices", indices, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        if indices.dtype != dtype::Dtype::Uint32 {
            return Err(super::dtype_rule(
                "indices",
                "gather_dtype",
                format!(
                    "indices is {}; nc_n_gather reads uint32 indices",
                    indices.dtype
                ),
            ));
        }
        super::keeps_dtype(
            "gather_dtype",
            dst,
            ("data", data),
            "nc_n_gather keeps data's dtype",
        )?;
        if i.p() != a.p() || d.p() != a.p() || d.n() != i.n() {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "data has {} partitions, indices {:?} and dst {:?}; all three have the same \
                     partitions and dst one element per index",
                    a.p(),
                    indices.logical_shape(),
                    dst.logical_shape()
                ),
            ));
        }
        let (x, idx) = (self.gather_bits(data)?, self.gather_bits(indices)?);
        let (n, k) = (a.n(), i.n());
        let mut z = Vec::with_capacity(idx.len());
        for (p, row) in idx.chunks(k).enumerate() {
            for (j, &e) in row.iter().enumerate() {
                if e as usize >= n {
                    return Err(super::rule(
                        "indices",
                        "gather_index",
                        format!(
                            "index {e} at partition {p}, element {j}; data has {n} elements \
                             per partition (indices lie in 0 .. {n})"
                        ),
                    ));
                }
                z.push(x[p * n + e as usize]);
            }
        }
        self.scatter_bits(&d, &z)?;
        self.record_engine(opc, engine, &[&a, &i], &[], &d, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineConfig;
    use crate::memory::Space;
    use dtype::Dtype;

    fn put(m: &mut Machine, t: &Tile, words: &[u32], esize: usize) {
        let b: Vec<u8> = words
            .iter()
            .flat_map(|w| w.to_le_bytes()[..esize].to_vec())
            .collect();
        m.write_tile(t, &b).expect("write");
    }

    /// Each partition gathers from its own row, repeats and reverses included, bit for bit (a
    /// bf16 NaN payload and -0 survive); the oracle indexes the flattened rows.
    #[test]
    fn nc_n_gather_against_an_indexing_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n, k) = (3usize, 12usize, 7usize);
        let data = m
            .alloc(Space::Sbuf, "data", &[p, 3, 4], Dtype::Bf16)
            .expect("d");
        let idx = m
            .alloc(Space::Sbuf, "idx", &[p, k], Dtype::Uint32)
            .expect("i");
        let dst = m
            .alloc(Space::Sbuf, "dst", &[p, k], Dtype::Bf16)
            .expect("o");
        let vals: Vec<u32> = (0..p * n)
            .map(|e| match e {
                5 => 0x7fc1,  // a NaN with a payload
                13 => 0x8000, // -0
                _ => 0x3f80 + e as u32,
            })
            .collect();
        put(&mut m, &data, &vals, 2);
        let ids: Vec<u32> = (0..p * k)
            .map(|e| ((e / k) * 5 + (k - 1 - e % k) * 7) as u32 % n as u32)
            .collect();
        put(&mut m, &idx, &ids, 4);
        m.nc_n_gather(&dst, &data, &idx).expect("gather");
        let got = m.read_tile(&dst).expect("read");
        for r in 0..p {
            for j in 0..k {
                let want = vals[r * n + ids[r * k + j] as usize] as u16;
                let e = (r * k + j) * 2;
                assert_eq!(u16::from_le_bytes([got[e], got[e + 1]]), want, "({r}, {j})");
            }
        }
        // An index past the row is the documented range's error; a float index is refused.
        put(&mut m, &idx, &[12; 21], 4);
        let err = m.nc_n_gather(&dst, &data, &idx).expect_err("range");
        assert!(err.to_string().contains("gather_index"), "{err}");
        let fidx = m
            .alloc(Space::Sbuf, "fidx", &[p, k], Dtype::Fp32)
            .expect("f");
        put(&mut m, &fidx, &[0; 21], 4);
        let err = m.nc_n_gather(&dst, &data, &fidx).expect_err("dtype");
        assert!(err.to_string().contains("uint32"), "{err}");
    }
}
