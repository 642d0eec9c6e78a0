//! GpSimd instructions: the pattern instructions `iota` and `affine_select`, the
//! per-partition gather `nc_n_gather`, the reduction across partitions
//! `tensor_partition_reduce`, `nonzero_with_count` and `sequence_bounds`.
//!
//! Both evaluate, for partition `c` (counted from the tile's first partition) and free index
//! `(w, z, y, x)` of the pattern `[[step_w, num_w], ..., [step_x, num_x]]` (outermost first, up
//! to 4 pairs), the 32-bit integer `offset + c * channel_multiplier + w * step_w + ... + x *
//! step_x` (two's complement, wrapping). `iota` writes it converted to `dst`'s dtype (integers
//! saturate; floats round to nearest even through float32); `affine_select` compares it with 0
//! and picks `on_true`'s element or `on_false_value` (\[S9\]).
//!
//! `rand_set_state` / `rand_get_state` (documented: NeuronCore-v3 seeds and stores the PRNG
//! state of each GpSimd compute lane, one per partition, as 6 uint32 words in SBUF for its
//! XORWOW generator; the Vector engine's are NeuronCore-v4's and refused here, rule
//! `neuron_core_v4`). Ours, where the documentation is silent: the words are Marsaglia's
//! XORWOW state `[x, y, z, w, v, d]` in that order, a lane is the absolute SBUF partition, and
//! each step (`xorwow`) gives `v + d` after moving the state on, as the 2003 paper's code.
//! `rng` on GpSimd then draws, for each partition of `dst`, that lane's words in order. A lane
//! never seeded has no state to store (its power-on state is not published: rule
//! `rng_state`), and an `rng` over seeded and unseeded lanes at once is refused alike; over
//! unseeded lanes only it keeps the unseeded rule (`isa::elementwise`).

use crate::numerics::encode_scalar;
use crate::{Error, Result};

use super::super::dtype;
use super::super::record::{Engine, Opcode, Queue};
use super::super::Machine;
use super::alu::{self, AluOp};
use super::{shape_rule, Opnd};
use crate::machine::tile::{check_pattern_len, Tile, MAX_FREE_DIMS};
use crate::spec::{GPSIMD_PROCESSORS, SBUF_PARTITIONS};

/// SBUF partitions each GpSimd core is connected to (16: core `c` to `16c .. 16c + 16`,
/// \[S2\]; the nonzero_with_count documentation says the same, \[S9\]).
const PARTITIONS_PER_CORE: u32 = (SBUF_PARTITIONS / GPSIMD_PROCESSORS) as u32;

/// Words of XORWOW state per GpSimd lane (documented for `rand_set_state`: 6 on GpSimd).
pub(crate) const XORWOW_WORDS: usize = 6;

/// One step of Marsaglia's XORWOW ("Xorshift RNGs", J. Stat. Softw. 8(14), 2003): the state
/// `[x, y, z, w, v, d]` moves on, and the word is the new `v` plus the new `d`.
pub(crate) fn xorwow(s: &mut [u32; XORWOW_WORDS]) -> u32 {
    let t = s[0] ^ (s[0] >> 2);
    s[0] = s[1];
    s[1] = s[2];
    s[2] = s[3];
    s[3] = s[4];
    s[4] = (s[4] ^ (s[4] << 4)) ^ (t ^ (t << 1));
    s[5] = s[5].wrapping_add(362_437);
    s[4].wrapping_add(s[5])
}

/// An iota / affine_select pattern: `(step, num)` pairs, outermost first.
pub type Pattern<'a> = &'a [(i64, u64)];

/// `ValueError` unless an affine pattern's `offset` and `channel_multiplier` are 32-bit integers
/// (what the instruction holds).
fn check_i32_coefficients(offset: i64, channel_multiplier: i64) -> Result<()> {
    for (arg, v) in [("offset", offset), ("channel_multiplier", channel_multiplier)] {
        if i32::try_from(v).is_err() {
            return Err(Error::value(arg, format!("{v} is not a 32-bit integer")));
        }
    }
    Ok(())
}

/// The 32-bit affine values of `pattern` for `partitions` channels, in logical order.
fn affine_values(
    pattern: Pattern, offset: i64, channel_multiplier: i64, partitions: u32, out: &mut Vec<i32>,
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
                format!("the pattern has {per} elements per partition; dst has {}", d.n()),
            ));
        }
        for (arg, v) in pattern.iter().map(|&(s, _)| ("pattern", s)) {
            if i32::try_from(v).is_err() {
                return Err(Error::value(arg, format!("step {v} is not a 32-bit integer")));
            }
        }
        Ok(())
    }

    /// `iota` (GpSimd engine): writes the affine pattern's values into `dst` (SBUF).
    pub fn iota(
        &mut self, dst: &Tile, pattern: Pattern, offset: i64, channel_multiplier: i64,
    ) -> Result<()> {
        let opc = Opcode::Iota;
        let engine = Engine::Gpsimd;
        check_i32_coefficients(offset, channel_multiplier)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        self.check_pattern(&d, pattern)?;
        let mut vals = Vec::new();
        affine_values(pattern, offset, channel_multiplier, d.p(), &mut vals);
        if dst.dtype.is_int() {
            let bits: Vec<u32> = vals.iter().map(|&v| dst.dtype.saturate_int(v as i64)).collect();
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
        &mut self, dst: &Tile, pattern: Pattern, channel_multiplier: i64, on_true: &Tile,
        on_false_value: f64, cmp_op: AluOp, offset: i64,
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
    /// The operands of a GpSimd gather (`nc_n_gather`, `local_gather`): `data` read at the
    /// values of `index` (integers of the dtype named `want`) into `dst` of `data`'s dtype.
    fn gather_operands(
        &self, opc: Opcode, data: (&str, &Tile), index: (&str, &Tile), want: &str, dst: &Tile,
    ) -> Result<(Opnd, Opnd, Opnd)> {
        let engine = Some(Engine::Gpsimd);
        let a = self.operand(data.0, data.1, engine, false)?;
        let i = self.operand(index.0, index.1, engine, false)?;
        let d = self.operand("dst", dst, engine, true)?;
        let op = opc.name();
        if index.1.dtype.name() != want {
            return Err(super::dtype_rule(
                index.0,
                "gather_dtype",
                format!("{} is {}; {op} reads {want} indices", index.0, index.1.dtype),
            ));
        }
        super::keeps_dtype("gather_dtype", dst, data, &format!("{op} keeps {}'s dtype", data.0))?;
        Ok((a, i, d))
    }

    /// `nc_n_gather` (GpSimd engine): `dst[p, j] = data[p, indices[p, j]]`, each partition's
    /// free axes of `data` flattened (logical order), bit for bit. All three in SBUF with the
    /// same partitions; `dst` has `data`'s dtype and `indices`' element count; `indices` is
    /// uint32, each in `0 .. elements per partition of data` (the documented range: an index
    /// outside it is an error here, naming it).
    pub fn nc_n_gather(&mut self, dst: &Tile, data: &Tile, indices: &Tile) -> Result<()> {
        let opc = Opcode::NcNGather;
        let engine = Engine::Gpsimd;
        let (a, i, d) =
            self.gather_operands(opc, ("data", data), ("indices", indices), "uint32", dst)?;
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

    /// `local_gather` (GpSimd engine; \[S9\]): each of the eight GpSimd cores serves 16
    /// partitions and reads the indices of its own 16 partitions of `index` (uint16), flattened
    /// partitions first (`i_j = index[16c + j % 16, j / 16]`), the first `num_valid` of them
    /// (0: all); each partition `p` of the group then gathers from its own row of `src`:
    /// `dst[p, j * m + e] = src[p, i_j + e]` for `e < m = num_elem_per_idx` (the semantics of
    /// AWS's numpy reference for the instruction; each row's free axes flattened), bit for bit.
    /// The documented limits: `src` and `index` on the same partitions, a multiple of 16 of
    /// them; `m` one of 1, 2, 4, 8, 16, 32; at most 4096 indices per core; `dst` has `src`'s
    /// dtype and `num_valid * m` elements per partition. An index whose `m` elements pass the
    /// row's end is undefined on the chip: an error here, naming it.
    pub fn local_gather(
        &mut self, dst: &Tile, src: &Tile, index: &Tile, num_elem: i64, num_valid: i64,
    ) -> Result<()> {
        const GROUP: usize = 16;
        let opc = Opcode::LocalGather;
        let engine = Engine::Gpsimd;
        let (s, i, d) =
            self.gather_operands(opc, ("src_buffer", src), ("index", index), "uint16", dst)?;
        let p = s.p() as usize;
        if i.p() != s.p()
            || index.start_partition != src.start_partition
            || !p.is_multiple_of(GROUP)
            || !(src.start_partition as usize).is_multiple_of(GROUP)
        {
            return Err(shape_rule(
                "index",
                "shape",
                format!(
                    "src_buffer is on partitions {}..{}, index on {}..{}; local_gather needs \
                     both on the same partitions, whole groups of 16 (one GpSimd core each)",
                    src.start_partition,
                    src.start_partition as usize + p,
                    index.start_partition,
                    index.start_partition as usize + i.p() as usize
                ),
            ));
        }
        if ![1, 2, 4, 8, 16, 32].contains(&num_elem) {
            return Err(super::rule(
                "num_elem_per_idx",
                "local_gather",
                format!("num_elem_per_idx is {num_elem}; it is one of 1, 2, 4, 8, 16, 32"),
            ));
        }
        let m = num_elem as usize;
        let per_core = i.n() * GROUP;
        let valid = if num_valid == 0 { per_core as i64 } else { num_valid };
        if valid < 1 || valid as usize > per_core || valid > 4096 {
            return Err(super::rule(
                "num_valid_indices",
                "local_gather",
                format!(
                    "{valid} indices per GpSimd core; index holds {per_core} a core (16 \
                     partitions of {}), and a core gathers at most 4096",
                    i.n()
                ),
            ));
        }
        let k = valid as usize;
        if d.p() != s.p() || d.n() != k * m {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "dst is {:?}; local_gather writes {p} partitions of {k} indices x {m} \
                     elements",
                    dst.logical_shape()
                ),
            ));
        }
        let (x, idx) = (self.gather_bits(src)?, self.gather_bits(index)?);
        let (n, w) = (s.n(), i.n());
        let mut z = Vec::with_capacity(p * k * m);
        for part in 0..p {
            let base = part / GROUP * GROUP;
            for j in 0..k {
                let off = idx[(base + j % GROUP) * w + j / GROUP] as usize;
                if off + m > n {
                    return Err(super::rule(
                        "index",
                        "gather_index",
                        format!(
                            "index {off} (index {j} of partitions {base}..{}) reads {m} \
                             elements from a row of {n}: past its end (undefined on the chip)",
                            base + GROUP
                        ),
                    ));
                }
                z.extend_from_slice(&x[part * n + off..part * n + off + m]);
            }
        }
        self.scatter_bits(&d, &z)?;
        self.record_engine(opc, engine, &[&s, &i], &[], &d, 0);
        Ok(())
    }

    /// `tensor_partition_reduce` (GpSimd engine): `dst[0, j] = op` over the partitions `p` of
    /// `data[p, j]` (\[S9\]: "a reduction operation across partitions"; add, average, max,
    /// bitwise_or, bitwise_and). `dst` has one partition and `data`'s elements per partition.
    /// Arithmetic operators widen to float32 and reduce in partition order, `acc = x[0]`,
    /// `acc = op(acc, x[p])` (the order is ours: the hardware's is not published; average sums
    /// so, then divides once by the partition count), the result rounded once to `dst`'s
    /// dtype; bitwise operators combine the raw bits of integer tiles of one dtype.
    pub fn tensor_partition_reduce(&mut self, dst: &Tile, op: AluOp, data: &Tile) -> Result<()> {
        let opc = Opcode::TensorPartitionReduce;
        let engine = Engine::Gpsimd;
        if !matches!(
            op,
            AluOp::Add | AluOp::Average | AluOp::Maximum | AluOp::BitwiseOr | AluOp::BitwiseAnd
        ) {
            return Err(Error::value(
                "op",
                format!(
                    "got {op}; tensor_partition_reduce reduces with add, average, maximum, \
                     bitwise_or or bitwise_and"
                ),
            ));
        }
        let a = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        if d.p() != 1 || d.n() != a.n() {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "dst is {:?}; the reduction of data {:?} across its partitions is one \
                     partition of {} elements",
                    dst.logical_shape(),
                    data.logical_shape(),
                    a.n()
                ),
            ));
        }
        let (p, n) = (a.p() as usize, a.n());
        if op.is_bitvec() {
            for (arg, t) in [("data", data), ("dst", dst)] {
                if !t.dtype.is_int() {
                    return Err(super::dtype_rule(
                        arg,
                        "bitvec_dtype",
                        format!("bitvec operators take integer dtypes; {arg} is {}", t.dtype),
                    ));
                }
            }
            super::keeps_dtype(
                "bitvec_dtype",
                dst,
                ("data", data),
                "a bitwise reduction keeps the bits' dtype",
            )?;
            let x = self.gather_bits(data)?;
            let mut z = x[..n].to_vec();
            for row in x.chunks(n.max(1)).skip(1).take(p - 1) {
                for (acc, &v) in z.iter_mut().zip(row) {
                    *acc = alu::apply_bits(op, *acc, v);
                }
            }
            self.scatter_bits(&d, &z)?;
        } else {
            let x = self.gather_f32(data)?;
            let mut z = x[..n].to_vec();
            let fold = if op == AluOp::Average { AluOp::Add } else { op };
            for row in x.chunks(n.max(1)).skip(1).take(p - 1) {
                for (acc, &v) in z.iter_mut().zip(row) {
                    *acc = alu::apply(fold, *acc, v);
                }
            }
            // The mean: the float32 sum divided once by the partition count (exact in float32).
            let count = if op == AluOp::Average { p as f32 } else { 1.0 };
            z.iter_mut().for_each(|v| *v = alu::canon(*v / count)); // NaN canonical too
            self.scatter_f32(&d, &z)?;
        }
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }
}

impl Machine {
    /// `sequence_bounds` (GpSimd engine; \[S9\], whose numpy equivalent this follows): for
    /// one partition of `n` segment ids (fp32 or int32, non-negative integers), element `i` of
    /// a run of equal nonzero ids gets the run's first index (`dst[0, 0, i]`) and one past its
    /// last (`dst[0, 1, i]`); an id 0 (padding; -0.0 too) gets `n` and -1. `dst` `[1, 2, n]`
    /// (or any one-partition tile of `2n` elements: the starts, then the ends), fp32 or int32.
    pub fn sequence_bounds(&mut self, dst: &Tile, segment_ids: &Tile) -> Result<()> {
        let opc = Opcode::SequenceBounds;
        let engine = Engine::Gpsimd;
        for (arg, t) in [("segment_ids", segment_ids), ("dst", dst)] {
            if !matches!(t.dtype, dtype::Dtype::Fp32 | dtype::Dtype::Int32) {
                return Err(super::dtype_rule(
                    arg,
                    "sequence_bounds_dtype",
                    format!("{arg} is {}; sequence_bounds takes float32 or int32", t.dtype),
                ));
            }
        }
        let a = self.operand("segment_ids", segment_ids, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        if a.p() != 1 {
            return Err(shape_rule(
                "segment_ids",
                "shape",
                format!(
                    "segment_ids is {:?}; sequence_bounds reads one partition",
                    segment_ids.logical_shape()
                ),
            ));
        }
        let n = a.n();
        if d.p() != 1 || d.n() != 2 * n {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "dst is {:?}; sequence_bounds of {n} ids writes [1, 2, {n}]",
                    dst.logical_shape()
                ),
            ));
        }
        // int32 ids compared as integers (exact in f64), float32 ids as float32.
        let ids: Vec<f64> = if segment_ids.dtype == dtype::Dtype::Int32 {
            let b = self.gather_bits(segment_ids)?;
            b.iter().map(|&w| w as i32 as f64).collect()
        } else {
            let x = self.gather_f32(segment_ids)?;
            x.iter().map(|&v| v as f64).collect()
        };
        if let Some((i, v)) =
            ids.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0 && v.fract() == 0.0))
        {
            return Err(super::rule(
                "segment_ids",
                "sequence_bounds_ids",
                format!(
                    "segment_ids[0, {i}] is {v}; segment ids are non-negative integers (the \
                     documented rule)"
                ),
            ));
        }
        let mut z = vec![0f32; 2 * n];
        let (starts, ends) = z.split_at_mut(n);
        for i in 0..n {
            starts[i] = if ids[i] == 0.0 {
                n as f32
            } else if i > 0 && ids[i] == ids[i - 1] {
                starts[i - 1]
            } else {
                i as f32
            };
        }
        for i in (0..n).rev() {
            ends[i] = if ids[i] == 0.0 {
                -1.0
            } else if i + 1 < n && ids[i] == ids[i + 1] {
                ends[i + 1]
            } else {
                (i + 1) as f32
            };
        }
        self.scatter_f32(&d, &z)?;
        self.record_engine(opc, engine, &[&a], &[], &d, 0);
        Ok(())
    }
}

impl Machine {
    /// `nonzero_with_count` (GpSimd engine; \[S9\], whose pseudocode this follows): in each
    /// partition a GpSimd core reads (the first of its 16, hardware partitions 0, 16, .., 112),
    /// `dst` gets the positions `i + index_offset` of `src`'s nonzero elements (free axes
    /// flattened, ascending), then `padding_val` up to `src`'s element count, then the count;
    /// `dst`'s other partitions are not written. `src` fp32 (a NaN is nonzero, -0.0 is zero)
    /// or int32; `dst` int32 with one element more per partition; both SBUF, on the same
    /// partitions.
    pub fn nonzero_with_count(
        &mut self, dst: &Tile, src: &Tile, index_offset: i64, padding_val: i64,
    ) -> Result<()> {
        let opc = Opcode::NonzeroWithCount;
        let engine = Engine::Gpsimd;
        // Only the cores' partitions are read, so the others may hold nothing yet: the tiles'
        // engine rules here, the written check per core partition below.
        let a = self.operand("src", src, Some(engine), true)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        if !matches!(src.dtype, dtype::Dtype::Fp32 | dtype::Dtype::Int32) {
            return Err(super::dtype_rule(
                "src",
                "nonzero_dtype",
                format!("src is {}; nonzero_with_count reads fp32 or int32", src.dtype),
            ));
        }
        if dst.dtype != dtype::Dtype::Int32 {
            return Err(super::dtype_rule(
                "dst",
                "nonzero_dtype",
                format!("dst is {}; nonzero_with_count writes int32", dst.dtype),
            ));
        }
        let n = a.n();
        if d.p() != a.p() || dst.start_partition != src.start_partition || d.n() != n + 1 {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "src is {:?} from partition {}, dst {:?} from partition {}; dst has src's \
                     partitions and one element more per partition (the count)",
                    src.logical_shape(),
                    src.start_partition,
                    dst.logical_shape(),
                    dst.start_partition
                ),
            ));
        }
        let last = index_offset.saturating_add(n as i64 - 1);
        if i32::try_from(index_offset).is_err() || i32::try_from(last).is_err() {
            return Err(Error::value(
                "index_offset",
                format!(
                    "{index_offset}: the indices it gives ({index_offset} .. {last}) are not all \
                     int32"
                ),
            ));
        }
        let pad = i32::try_from(padding_val)
            .map_err(|_| Error::value("padding_val", format!("{padding_val} is not an int32")))?;
        let float = src.dtype == dtype::Dtype::Fp32;
        for p in 0..a.p() {
            let hw = src.start_partition + p;
            if !hw.is_multiple_of(PARTITIONS_PER_CORE) {
                continue;
            }
            let (mut s1, mut d1) = (*src, *dst);
            (s1.start_partition, s1.partitions) = (hw, 1);
            (d1.start_partition, d1.partitions) = (hw, 1);
            self.operand("src", &s1, None, false)?;
            let x = self.gather_bits(&s1)?;
            let mut z: Vec<u32> = x
                .iter()
                .enumerate()
                .filter(|(_, &b)| if float { b & 0x7FFF_FFFF != 0 } else { b != 0 })
                .map(|(i, _)| (i as i64 + index_offset) as i32 as u32)
                .collect();
            let count = z.len() as u32;
            z.resize(n, pad as u32);
            z.push(count);
            let row = Opnd { tile: d1, range: d.range };
            self.scatter_bits(&row, &z)?;
        }
        let cost = Self::cost_input(n, a.p(), 0);
        self.program.push(opc, Queue::Engine(engine), &[a.region()], &[d.region()], cost);
        Ok(())
    }
}

impl Machine {
    /// The checks of a GpSimd PRNG state operand (`rand_set_state`'s `src_seeds`,
    /// `rand_get_state`'s `dst`): the GpSimd engine (the Vector engine's state is
    /// NeuronCore-v4's), uint32, 6 words a partition.
    fn rng_state_operand(
        &self, opc: Opcode, engine: Engine, arg: &str, t: &Tile, write: bool,
    ) -> Result<Opnd> {
        super::check_engine(opc, engine)?;
        if engine != Engine::Gpsimd {
            return Err(super::rule(
                "engine",
                "neuron_core_v4",
                format!(
                    "{} on the Vector engine is NeuronCore-v4 and newer (the NKI API docs); \
                     Trainium2's NeuronCore (v3) keeps the PRNG state of its GpSimd lanes",
                    opc.name()
                ),
            ));
        }
        if t.dtype != dtype::Dtype::Uint32 {
            return Err(super::dtype_rule(
                arg,
                "rng_state_dtype",
                format!("{arg} is {}; the PRNG state is uint32 words", t.dtype),
            ));
        }
        let o = self.operand(arg, t, Some(engine), write)?;
        if o.n() != XORWOW_WORDS {
            return Err(shape_rule(
                arg,
                "shape",
                format!(
                    "{arg} has {} elements per partition; a GpSimd lane's XORWOW state is \
                     {XORWOW_WORDS} uint32 words",
                    o.n()
                ),
            ));
        }
        Ok(o)
    }

    /// The lanes (absolute partitions) of an operand.
    fn lanes(o: &Opnd) -> std::ops::Range<usize> {
        let first = o.tile.start_partition as usize;
        first..first + o.p() as usize
    }

    /// `rand_set_state` (GpSimd): seeds the XORWOW generator of each lane `src_seeds` covers
    /// with that partition's 6 words, read when issued (module doc).
    pub fn rand_set_state(&mut self, engine: Engine, src_seeds: &Tile) -> Result<()> {
        let opc = Opcode::RandSetState;
        let s = self.rng_state_operand(opc, engine, "src_seeds", src_seeds, false)?;
        let words = self.gather_bits(src_seeds)?;
        let lanes = Self::lanes(&s);
        if self.gpsimd_rng.len() < SBUF_PARTITIONS {
            self.gpsimd_rng.resize(SBUF_PARTITIONS, None);
        }
        for (lane, w) in lanes.zip(words.chunks_exact(XORWOW_WORDS)) {
            self.gpsimd_rng[lane] = Some(w.try_into().expect("6 words"));
        }
        let cost = Self::cost_input(s.n(), s.p(), 0);
        self.program.push(opc, Queue::Engine(engine), &[s.region()], &[], cost);
        Ok(())
    }

    /// `rand_get_state` (GpSimd): each lane's state as `dst`'s 6 words of its partition.
    pub fn rand_get_state(&mut self, engine: Engine, dst: &Tile) -> Result<()> {
        let opc = Opcode::RandGetState;
        let d = self.rng_state_operand(opc, engine, "dst", dst, true)?;
        let mut words = Vec::with_capacity(d.p() as usize * XORWOW_WORDS);
        for lane in Self::lanes(&d) {
            match self.gpsimd_rng.get(lane).copied().flatten() {
                Some(s) => words.extend_from_slice(&s),
                None => return Err(Self::unseeded_lane("dst", lane)),
            }
        }
        self.scatter_bits(&d, &words)?;
        self.record_engine(opc, engine, &[], &[], &d, 0);
        Ok(())
    }

    fn unseeded_lane(arg: &str, lane: usize) -> Error {
        super::rule(
            arg,
            "rng_state",
            format!(
                "GpSimd lane {lane} (partition {lane}) was never seeded by rand_set_state; its \
                 power-on PRNG state is not published"
            ),
        )
    }

    /// The words a GpSimd `rng` into `d` draws from its lanes' generators (`count` a lane, in
    /// order, each lane's state moved on), or `None` when no lane of `d` is seeded (the
    /// unseeded rule applies); `mask` keeps the bits `dst`'s dtype holds.
    pub(crate) fn gpsimd_lane_words(
        &mut self, d: &Opnd, count: usize, mask: u32,
    ) -> Result<Option<Vec<u32>>> {
        let lanes = Self::lanes(d);
        let seeded = |m: &Self, l: usize| m.gpsimd_rng.get(l).is_some_and(Option::is_some);
        if !lanes.clone().any(|l| seeded(self, l)) {
            return Ok(None);
        }
        if let Some(l) = lanes.clone().find(|&l| !seeded(self, l)) {
            return Err(Self::unseeded_lane("dst", l));
        }
        let total = lanes.len().saturating_mul(count);
        let mut out = crate::host::zeroed_vec::<u32>("dst", "the random words", total)?;
        for (lane, chunk) in lanes.zip(out.chunks_mut(count.max(1))) {
            let s = self.gpsimd_rng[lane].as_mut().expect("seeded");
            for w in chunk.iter_mut() {
                *w = xorwow(s) & mask;
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineConfig;
    use crate::memory::Space;
    use dtype::Dtype;

    use crate::machine::isa::test_util::put_words as put;
    use crate::machine::tile::Index;

    /// Marsaglia's own seed (the 2003 paper's code) steps to the words his code gives
    /// (computed apart with Python integers).
    #[test]
    fn xorwow_steps_as_marsaglias_code() {
        let mut s = [123_456_789, 362_436_069, 521_288_629, 88_675_123, 5_783_321, 6_615_241];
        let words: Vec<u32> = (0..4).map(|_| xorwow(&mut s)).collect();
        assert_eq!(words, [246_875_399, 3_690_007_200, 1_264_581_005, 3_906_711_041]);
        assert_eq!(
            s,
            [5_783_321, 239_897_721, 3_682_667_085, 1_256_878_453, 3_898_646_052, 8_064_989]
        );
    }

    /// rand_set_state seeds the lanes (absolute partitions) its tile covers, rand_get_state
    /// stores them back, and a GpSimd rng draws each partition's lane in order (truncated to
    /// dst's width), moving its state on; the rules: GpSimd only on Trainium2, uint32, 6 words,
    /// seeded lanes.
    #[test]
    fn gpsimd_lanes_seed_draw_and_store_their_xorwow_state() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let seeds = m.alloc(Space::Sbuf, "seeds", &[40, 6], Dtype::Uint32).expect("seeds");
        let words: Vec<u32> = (0..240).map(|i| 0x9E37_79B9u32.wrapping_mul(i + 1)).collect();
        put(&mut m, &seeds, &words, 4);
        // Partitions 32..35 of the tile (an engine starts at a multiple of 32): lanes 32..35.
        let rows = |t: &Tile, a: i64, b: i64| {
            let r = Index::Range { start: Some(a), stop: Some(b), step: 1 };
            t.slice(&[r]).expect("rows")
        };
        m.rand_set_state(Engine::Gpsimd, &rows(&seeds, 32, 35)).expect("set");
        let state = m.alloc(Space::Sbuf, "state", &[40, 6], Dtype::Uint32).expect("state");
        m.rand_get_state(Engine::Gpsimd, &rows(&state, 32, 35)).expect("get");
        let read = crate::machine::isa::test_util::read_words;
        assert_eq!(read(&m, &rows(&state, 32, 35), 4), words[192..210]);
        let out = m.alloc(Space::Sbuf, "out", &[40, 4], Dtype::Uint16).expect("out");
        m.rng(Engine::Gpsimd, &rows(&out, 32, 35)).expect("rng");
        let mut want = Vec::new();
        for lane in 32..35 {
            let mut s: [u32; 6] = words[lane * 6..lane * 6 + 6].try_into().expect("6");
            want.extend((0..4).map(|_| xorwow(&mut s) & 0xFFFF));
        }
        assert_eq!(read(&m, &rows(&out, 32, 35), 2), want);
        // The draw moved lane 32 on by four steps.
        let mut s: [u32; 6] = words[192..198].try_into().expect("6");
        (0..4).for_each(|_| {
            xorwow(&mut s);
        });
        m.rand_get_state(Engine::Gpsimd, &rows(&state, 32, 33)).expect("get");
        assert_eq!(read(&m, &rows(&state, 32, 33), 4), s);
        // The rules.
        let e = m.rand_set_state(Engine::Vector, &seeds).expect_err("vector");
        assert_eq!((e.arg(), e.rule()), (Some("engine"), Some("neuron_core_v4")));
        let f = m.alloc(Space::Sbuf, "f", &[2, 6], Dtype::Int32).expect("f");
        let e = m.rand_set_state(Engine::Gpsimd, &f).expect_err("int32");
        assert_eq!((e.arg(), e.rule()), (Some("src_seeds"), Some("rng_state_dtype")));
        let five = m.alloc(Space::Sbuf, "five", &[2, 5], Dtype::Uint32).expect("five");
        let e = m.rand_get_state(Engine::Gpsimd, &five).expect_err("5 words");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("shape")));
        let e = m.rand_get_state(Engine::Gpsimd, &state).expect_err("lanes 0..32 unseeded");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("rng_state")));
        let e = m.rng(Engine::Gpsimd, &out).expect_err("seeded and unseeded lanes");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("rng_state")));
        let ps = m.alloc(Space::Psum, "ps", &[2, 6], Dtype::Uint32).expect("ps");
        assert!(m.rand_get_state(Engine::Gpsimd, &ps).is_err(), "GpSimd cannot write PSUM");
        assert!(m.rand_set_state(Engine::Scalar, &seeds).is_err(), "GpSimd only");
    }

    /// Each partition gathers from its own row, repeats and reverses included, bit for bit (a
    /// bf16 NaN payload and -0 survive); the oracle indexes the flattened rows.
    #[test]
    fn nc_n_gather_against_an_indexing_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n, k) = (3usize, 12usize, 7usize);
        let data = m.alloc(Space::Sbuf, "data", &[p, 3, 4], Dtype::Bf16).expect("d");
        let idx = m.alloc(Space::Sbuf, "idx", &[p, k], Dtype::Uint32).expect("i");
        let dst = m.alloc(Space::Sbuf, "dst", &[p, k], Dtype::Bf16).expect("o");
        let vals: Vec<u32> = (0..p * n)
            .map(|e| match e {
                5 => 0x7fc1,  // a NaN with a payload
                13 => 0x8000, // -0
                _ => 0x3f80 + e as u32,
            })
            .collect();
        put(&mut m, &data, &vals, 2);
        let ids: Vec<u32> =
            (0..p * k).map(|e| ((e / k) * 5 + (k - 1 - e % k) * 7) as u32 % n as u32).collect();
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
        let fidx = m.alloc(Space::Sbuf, "fidx", &[p, k], Dtype::Fp32).expect("f");
        put(&mut m, &fidx, &[0; 21], 4);
        let err = m.nc_n_gather(&dst, &data, &fidx).expect_err("dtype");
        assert!(err.to_string().contains("uint32"), "{err}");
    }

    /// local_gather against AWS's numpy semantics: each 16-partition group's indices
    /// flattened partitions first, every partition of the group gathering runs of its own row
    /// (different indices per group, num_valid_indices below all, runs of 2), bit for bit; the
    /// documented limits are errors naming their argument.
    #[test]
    fn local_gather_against_a_group_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n, w, k, run) = (32usize, 20usize, 3usize, 40usize, 2usize);
        let src = m.alloc(Space::Sbuf, "src", &[p, 4, 5], Dtype::Fp32).expect("s");
        let idx = m.alloc(Space::Sbuf, "idx", &[p, w], Dtype::Uint16).expect("i");
        let dst = m.alloc(Space::Sbuf, "dst", &[p, k * run], Dtype::Fp32).expect("o");
        let vals: Vec<u32> = (0..p * n).map(|e| 0x3f80_0000 + e as u32).collect();
        put(&mut m, &src, &vals, 4);
        let ids: Vec<u32> = (0..p * w).map(|e| ((e * 7 + e / 16) % (n - 1)) as u32).collect();
        put(&mut m, &idx, &ids, 2);
        let ok = |m: &mut Machine, k: i64| m.local_gather(&dst, &src, &idx, run as i64, k);
        ok(&mut m, k as i64).expect("gather");
        let got = m.read_tile(&dst).expect("read");
        for r in 0..p {
            let g = r / 16 * 16;
            for j in 0..k {
                let i = ids[(g + j % 16) * w + j / 16] as usize;
                for e in 0..run {
                    let at = ((r * k + j) * run + e) * 4;
                    let v = u32::from_le_bytes([got[at], got[at + 1], got[at + 2], got[at + 3]]);
                    assert_eq!(v, vals[r * n + i + e], "({r}, {j}, {e})");
                }
            }
        }
        let err = ok(&mut m, 49).expect_err("more than 48 a core");
        assert!(err.to_string().contains("num_valid_indices"), "{err}");
        let err = m.local_gather(&dst, &src, &idx, 3, k as i64).expect_err("run of 3");
        assert!(err.to_string().contains("num_elem_per_idx"), "{err}");
        put(&mut m, &idx, &[19; 96], 2);
        let err = ok(&mut m, k as i64).expect_err("past the row");
        assert!(err.to_string().contains("gather_index"), "{err}");
        let odd = m.alloc(Space::Sbuf, "odd", &[p - 8, w], Dtype::Uint16).expect("odd");
        put(&mut m, &odd, &[0; 72], 2);
        let err = m.local_gather(&dst, &src, &odd, 2, 0).expect_err("partitions");
        assert!(err.to_string().contains("groups of 16"), "{err}");
    }

    /// tensor_partition_reduce against a column-by-column oracle: float32 sums and maxima in
    /// partition order (NaN, -0, inf and an overflow to inf among the inputs), a bf16 result
    /// rounded once, bitwise or/and on int32 bits, and each rule naming its argument.
    #[test]
    fn tensor_partition_reduce_against_a_column_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (5usize, 6usize);
        let data = m.alloc(Space::Sbuf, "data", &[p, 2, 3], Dtype::Fp32).expect("d");
        let x: Vec<f32> = vec![
            1.0,
            -0.0,
            f32::MAX,
            1e8,
            2.5,
            f32::NAN, //
            2.0,
            -0.0,
            f32::MAX,
            1.0,
            -2.5,
            0.0, //
            -3.0,
            -0.0,
            0.0,
            1.0,
            1.0,
            0.0, //
            0.5,
            -0.0,
            0.0,
            1.0,
            f32::INFINITY,
            0.0, //
            0.25,
            -0.0,
            0.0,
            -1e8,
            7.0,
            0.0,
        ];
        put(&mut m, &data, &x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), 4);
        let sum = m.alloc(Space::Sbuf, "sum", &[1, n], Dtype::Fp32).expect("s");
        let mx = m.alloc(Space::Sbuf, "mx", &[1, n], Dtype::Bf16).expect("m");
        m.tensor_partition_reduce(&sum, AluOp::Add, &data).expect("add");
        m.tensor_partition_reduce(&mx, AluOp::Maximum, &data).expect("max");
        let got = m.read_f32(&sum).expect("read");
        for j in 0..n {
            let mut acc = x[j];
            for r in 1..p {
                acc += x[r * n + j]; // float32 additions in partition order
            }
            let want = if acc.is_nan() { f32::from_bits(0x7FC0_0000) } else { acc };
            assert_eq!(got[j].to_bits(), want.to_bits(), "column {j}");
        }
        // Column 1: -0 + -0 ... = -0; column 2: MAX + MAX overflows to inf; column 3: each
        // 1e8 + 1 rounds back to 1e8 before -1e8 cancels it: 0, not the exact 3 (the order
        // is visible).
        assert_eq!(got[1].to_bits(), (-0.0f32).to_bits());
        assert_eq!(got[2], f32::INFINITY);
        assert_eq!(got[3], 0.0);
        // average: the same float32 sums, each divided once by the 5 partitions.
        m.tensor_partition_reduce(&sum, AluOp::Average, &data).expect("average");
        let avg = m.read_f32(&sum).expect("read");
        for (j, (&a, &s)) in avg.iter().zip(&got).enumerate() {
            let want = alu::canon(s / p as f32);
            assert_eq!(a.to_bits(), want.to_bits(), "average, column {j}");
        }
        let b = m.read_tile(&mx).expect("read");
        let b16: Vec<u16> = b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        // max: 2.0, -0 (all -0), MAX (rounds to inf in bf16), 1e8 (rounded), inf, NaN.
        assert_eq!(b16[0], 0x4000);
        assert_eq!(b16[1], 0x8000);
        assert_eq!(b16[2], 0x7F80);
        assert_eq!(b16[3], 0x4CBF); // 1e8 = 0x4CBEBC20 -> nearest even bf16 0x4CBF
        assert_eq!(b16[4], 0x7F80);
        assert_eq!(b16[5] & 0x7FC0, 0x7FC0);
        // Bitwise, on int32 bits.
        let ints = m.alloc(Space::Sbuf, "ints", &[3, 2], Dtype::Int32).expect("i");
        put(&mut m, &ints, &[0x0F, 0xFFFF_FFFF, 0xF0, 0x8000_0000, 0x100, 0x7FFF_FFFF], 4);
        let or = m.alloc(Space::Sbuf, "or", &[1, 2], Dtype::Int32).expect("o");
        m.tensor_partition_reduce(&or, AluOp::BitwiseOr, &ints).expect("or");
        assert_eq!(m.read_tile(&or).expect("r"), [0xFF, 1, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
        m.tensor_partition_reduce(&or, AluOp::BitwiseAnd, &ints).expect("and");
        assert_eq!(m.read_tile(&or).expect("r"), [0, 0, 0, 0, 0, 0, 0, 0]);
        // The rules.
        let e = m.tensor_partition_reduce(&sum, AluOp::Subtract, &data).expect_err("op");
        assert_eq!(e.arg(), Some("op"));
        let two = m.alloc(Space::Sbuf, "two", &[2, n], Dtype::Fp32).expect("t");
        let e = m.tensor_partition_reduce(&two, AluOp::Add, &data).expect_err("shape");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("shape")));
        let e = m.tensor_partition_reduce(&sum, AluOp::BitwiseOr, &data).expect_err("float bits");
        assert_eq!((e.arg(), e.rule()), (Some("data"), Some("bitvec_dtype")));
        let u = m.alloc(Space::Sbuf, "u", &[1, 2], Dtype::Uint32).expect("u");
        let e = m.tensor_partition_reduce(&u, AluOp::BitwiseOr, &ints).expect_err("dtype");
        assert_eq!((e.arg(), e.rule()), (Some("dst"), Some("bitvec_dtype")));
        let ps = m.alloc(Space::Psum, "ps", &[p, n], Dtype::Fp32).expect("p");
        let e = m.tensor_partition_reduce(&sum, AluOp::Add, &ps).expect_err("psum");
        assert_eq!(e.arg(), Some("data"));
    }

    /// sequence_bounds against the documented numpy loops: runs of equal ids, padding (0 and
    /// -0.0) inside and at both ends, a run of one, int32 ids above 2^24 kept distinct.
    #[test]
    fn sequence_bounds_against_the_documented_loops() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        // Each element on its own: walk out to both ends of its run of equal ids.
        let oracle = |seq: &[f64]| {
            let n = seq.len();
            let bounds = |i: usize| match seq[i] == 0.0 {
                true => (n as f64, -1.0),
                false => {
                    let start = (0..=i).rev().take_while(|&j| seq[j] == seq[i]).last();
                    let end = (i..n).take_while(|&j| seq[j] == seq[i]).last();
                    (start.unwrap_or(i) as f64, (end.unwrap_or(i) + 1) as f64)
                }
            };
            let (lo, hi): (Vec<f64>, Vec<f64>) = (0..n).map(bounds).unzip();
            [lo, hi].concat()
        };
        // sequence_bounds on one row of ids (raw 32-bit words) into a dst of `out`, as f64.
        let run = |m: &mut Machine, tag: &str, ids: (Dtype, Vec<u32>), out: Dtype| {
            let n = ids.1.len();
            let t = m.alloc(Space::Sbuf, &format!("ids_{tag}"), &[1, n], ids.0);
            let d = m.alloc(Space::Sbuf, &format!("d_{tag}"), &[1, 2, n], out);
            let (t, d) = (t.expect("ids"), d.expect("d"));
            put(m, &t, &ids.1, 4);
            m.sequence_bounds(&d, &t).expect(tag);
            let word = |c: &[u8]| [c[0], c[1], c[2], c[3]];
            let value = |c: &[u8]| match out {
                Dtype::Int32 => i32::from_le_bytes(word(c)) as f64,
                _ => f32::from_le_bytes(word(c)) as f64,
            };
            let got: Vec<f64> = m.read_tile(&d).expect("read").chunks(4).map(value).collect();
            (got, d)
        };
        let f: Vec<f32> = vec![0.0, 1.0, 1.0, 2.0, 2.0, 2.0, -0.0, 3.0, 3.0, 5.0, 4.0, 4.0];
        let bits = f.iter().map(|v| v.to_bits()).collect();
        let (got, _) = run(&mut m, "fp32", (Dtype::Fp32, bits), Dtype::Int32);
        assert_eq!(got, oracle(&f.iter().map(|&v| v as f64).collect::<Vec<_>>()));
        assert_eq!(&got[..3], &[12.0, 1.0, 1.0]);
        let big: Vec<i32> = vec![16_777_217, 16_777_216, 16_777_216, 0, 7];
        let bits = big.iter().map(|&v| v as u32).collect();
        let (got, d) = run(&mut m, "int32", (Dtype::Int32, bits), Dtype::Fp32);
        assert_eq!(got, oracle(&big.iter().map(|&v| v as f64).collect::<Vec<_>>()));
        let bad = m.alloc(Space::Sbuf, "bad", &[1, 2], Dtype::Fp32).expect("bad");
        put(&mut m, &bad, &[1.5f32.to_bits(), 1.0f32.to_bits()], 4);
        let e = m.sequence_bounds(&d, &bad).expect_err("shape first? no: ids");
        assert!(e.to_string().contains("segment_ids") || e.to_string().contains("dst"));
        let d2 = m.alloc(Space::Sbuf, "d2", &[1, 2, 2], Dtype::Fp32).expect("d2");
        let e = m.sequence_bounds(&d2, &bad).expect_err("1.5");
        assert_eq!(e.rule(), Some("sequence_bounds_ids"));
        let two = m.alloc(Space::Sbuf, "two", &[2, 2], Dtype::Fp32).expect("two");
        put(&mut m, &two, &[0, 0, 0, 0], 4);
        let e = m.sequence_bounds(&d2, &two).expect_err("two partitions");
        assert_eq!(e.rule(), Some("shape"));
        let h = m.alloc(Space::Sbuf, "h", &[1, 2], Dtype::Bf16).expect("h");
        let e = m.sequence_bounds(&d2, &h).expect_err("bf16");
        assert_eq!(e.rule(), Some("sequence_bounds_dtype"));
    }

    /// nonzero_with_count against the documented pseudocode on the cores' partitions (0, 16,
    /// 32 of a 40-partition tile): -0.0 is zero, NaN and denormals nonzero, an all-zero and an
    /// all-nonzero row; the other partitions of dst keep what they held, and src's other
    /// partitions may never have been written.
    #[test]
    fn nonzero_with_count_against_the_documented_pseudocode() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let (p, n) = (40usize, 6usize);
        let src = m.alloc(Space::Sbuf, "src", &[p, 2, 3], Dtype::Fp32).expect("s");
        let dst = m.alloc(Space::Sbuf, "dst", &[p, n + 1], Dtype::Int32).expect("d");
        put(&mut m, &dst, &vec![0xAAAA_AAAA; p * (n + 1)], 4);
        let rows: [[u32; 6]; 3] = [
            [0, 0x3F80_0000, 0x8000_0000, 0x7FC0_0000, 0, 1], // 0, 1.0, -0.0, NaN, 0, denormal
            [0; 6],
            [0x4000_0000; 6],
        ];
        for (k, row) in rows.iter().enumerate() {
            let mut one = src;
            (one.start_partition, one.partitions) = (16 * k as u32, 1);
            put(&mut m, &one, row, 4);
        }
        m.nonzero_with_count(&dst, &src, 16, -1).expect("nonzero");
        let got: Vec<i32> = m
            .read_tile(&dst)
            .expect("read")
            .chunks(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        for r in 0..p {
            let out = &got[r * (n + 1)..(r + 1) * (n + 1)];
            if r % 16 != 0 {
                assert!(out.iter().all(|&v| v == 0xAAAA_AAAAu32 as i32), "row {r} untouched");
                continue;
            }
            // The documented pseudocode, on the row's values.
            let x = rows[r / 16];
            let mut want: Vec<i32> = (0..n)
                .filter(|&i| f32::from_bits(x[i]) != 0.0 || f32::from_bits(x[i]).is_nan())
                .map(|i| i as i32 + 16)
                .collect();
            let c = want.len() as i32;
            want.resize(n, -1);
            want.push(c);
            assert_eq!(out, &want[..], "row {r}");
        }
        assert_eq!(&got[..7], &[17, 19, 21, -1, -1, -1, 3]);
        // int32: bits; the rules.
        let ints = m.alloc(Space::Sbuf, "ints", &[1, 3], Dtype::Int32).expect("i");
        put(&mut m, &ints, &[0, 0x8000_0000, 7], 4);
        let o = m.alloc(Space::Sbuf, "o", &[1, 4], Dtype::Int32).expect("o");
        m.nonzero_with_count(&o, &ints, 0, 9).expect("int32");
        assert_eq!(m.read_tile(&o).expect("r"), [1, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0, 0]);
        let check = |r: Result<()>, arg: &str, rule: Option<&str>| {
            let e = r.expect_err(arg);
            assert_eq!((e.arg(), e.rule()), (Some(arg), rule), "{e}");
        };
        let bf = m.alloc(Space::Sbuf, "bf", &[1, 3], Dtype::Bf16).expect("b");
        check(m.nonzero_with_count(&o, &bf, 0, -1), "src", Some("nonzero_dtype"));
        let of = m.alloc(Space::Sbuf, "of", &[1, 4], Dtype::Fp32).expect("f");
        check(m.nonzero_with_count(&of, &ints, 0, -1), "dst", Some("nonzero_dtype"));
        let o3 = m.alloc(Space::Sbuf, "o3", &[1, 3], Dtype::Int32).expect("o");
        check(m.nonzero_with_count(&o3, &ints, 0, -1), "dst", Some("shape"));
        check(m.nonzero_with_count(&o, &ints, i32::MAX as i64 - 1, -1), "index_offset", None);
        check(m.nonzero_with_count(&o, &ints, 0, 1 << 40), "padding_val", None);
        let ps = m.alloc(Space::Psum, "ps", &[1, 3], Dtype::Int32).expect("p");
        check(m.nonzero_with_count(&o, &ps, 0, -1), "src", Some("gpsimd_psum"));
    }
}
