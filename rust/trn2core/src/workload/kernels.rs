//! The kernels a whole model's attention and norms run, built from the machine's own
//! instructions and timed on its timeline (TIME only: their values are computed on data nobody
//! reads, and only the [`KernelReport`] is kept).
//!
//! - [`attention_run`]: flash attention shaped like the project's `examples/nki/attention.py`,
//!   one 128-row (or fewer) query tile at a time against key/value tiles of one PSUM bank of
//!   scores (512 keys), with a running max and sum: per block the score `nc_matmul`, the row
//!   max (`tensor_reduce`), the new running max (`tensor_tensor`), its negated scale
//!   (`tensor_scalar`), the correction `exp` of the old max and `p = exp(scale * s - scale *
//!   max)` with its row sums (`activation`), the running sum (`scalar_tensor_tensor`), `p`
//!   transposed 128 keys at a time (`nc_transpose`, `tensor_copy`), `p @ v` accumulated in PSUM
//!   (`nc_matmul`) and the running output rescaled and added (`scalar_tensor_tensor`); per
//!   query tile the load of `q`, the initial running values (`memset`), `1 / sum`
//!   (`reciprocal`), the scaling (`tensor_scalar`) and the store.
//! - [`attention_tkg_run`]: token generation (decode), the keys on the partitions as NxD
//!   Inference's token-generation kernels lay them: per block of [`tkg_block_keys`] keys (up to
//!   16 chunks of 128) the loads of `K^T` and `V`, per chunk a score `nc_matmul` giving
//!   `scores^T` (`[128 keys, q rows]`, all chunks in one PSUM bank); the block max per
//!   partition (`tensor_reduce`), across the partitions by a PE transpose and a
//!   `tensor_reduce`, the running max (`tensor_tensor`, `tensor_scalar`) and the correction
//!   `exp` (`activation`); `-scale * max` and the correction transposed to a row and broadcast
//!   to the 128 partitions by a matmul with a row of ones (`nc_transpose`, `tensor_copy`,
//!   `nc_matmul`); `p = exp(scale * s - scale * max)` on all 128 partitions (`activation`; with
//!   more than one row the shift first, `scalar_tensor_tensor`); per chunk `v^T p` with V
//!   stationary and the sums of `p` (a matmul with a column of ones), accumulated in PSUM;
//!   the running sum and the transposed running output rescaled (`scalar_tensor_tensor`, or
//!   two `tensor_tensor` with several rows). Per query tile the load of `q`, `1 / sum`
//!   broadcast the same way, the scaling and the transposed store. A block's loads and scores
//!   are issued a block ahead (software pipelining), so its time is its cache read. With a
//!   shared cache ([`AttentionShape::shared_kv`], MLA's latent cache) the block's rows are
//!   read once, keys on the partitions (V), and `K^T` is made from them on chip: PE
//!   `nc_transpose`s into PSUM banks, each copied to SBUF (`tensor_copy`).
//! - [`rmsnorm_run`]: `examples/nki/rmsnorm.py`: per tile of up to 128 rows a load, `square`
//!   (Scalar), the row sum (`tensor_reduce`), `* (1/D) + eps` (`tensor_scalar`), `rsqrt`
//!   (Scalar), the row scaling in place (`tensor_scalar`), the weight (`tensor_tensor`, broadcast to the
//!   rows once by a DMA) and a store.
//!
//! Both keep two sets of buffers (double buffering) so that one tile's loads overlap the
//! previous tile's compute, as a compiled kernel's rotating buffers do.
//!
//! A model step needs their time for shapes of thousands of blocks; it takes it from a few
//! short runs: [`attention_times`] runs 1 query tile against `n` and `2n` key/value tiles and 2
//! query tiles against `n`, so that `T(q, k) = fixed + q * per_q_tile + q * k * per_block`
//! holds on the three runs ([`attention_tkg_times`] the same); [`rmsnorm_times`] runs `n` and `2n` row tiles. Both are cached per
//! shape for the process ([`OnceLock`] of a `Mutex<HashMap>`), so a search over thousands of
//! layouts runs each kernel once per shape.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::machine::isa::scalar::ActivationArgs;
use crate::machine::tile::Index;
use crate::machine::{
    ActFunc, AluOp, Dtype, Engine, KernelReport, Machine, MachineConfig, PeOptions, ReduceCmd,
    Scalar, Tile, Uninitialized,
};
use crate::memory::Space;
use crate::spec::{PSUM_BANK_BYTES, SBUF_PARTITIONS, SBUF_USABLE_PARTITION_BYTES};
use crate::{Error, Result};

/// Query rows of a full query tile (the partitions).
pub const Q_TILE: usize = SBUF_PARTITIONS;

/// Keys of one key/value tile: one PSUM bank of float32 scores per query row (512).
pub const KV_TILE: usize = (PSUM_BANK_BYTES / 4) as usize;

/// Key/value tiles of the shortest timed run ([`attention_times`]).
const ATTENTION_RUN_BLOCKS: usize = 4;

/// Row tiles of the shortest timed run ([`rmsnorm_times`]).
const NORM_RUN_TILES: usize = 4;

/// The shape of one attention block: a query tile of `q_rows` rows (one head, or the query
/// heads sharing a key/value head in decode) against [`KV_TILE`] keys, bf16 operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttentionShape {
    /// Query rows of the tile (1..=128).
    pub q_rows: usize,
    /// Query/key head dimension (the scores' contraction; over 128 in several passes).
    pub d_qk: usize,
    /// Value head dimension (the output's columns, at most 512).
    pub d_v: usize,
    /// The values are the first `d_v` columns of the keys (MLA's latent cache: keys `[c_kv |
    /// k_pe]`, values `c_kv`), so the token-generation kernel reads the cache once
    /// ([`attention_tkg_run`]); the prefill kernel takes separate K and V only.
    pub shared_kv: bool,
}

/// The time of the attention kernel of one shape: `T(q, k) = fixed_s + q * per_q_tile_s + q *
/// k * per_block_s` for `q` query tiles each against `k` key/value tiles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionTimes {
    /// Seconds paid once (the pipeline's fill and drain).
    pub fixed_s: f64,
    /// Seconds of one query tile besides its blocks (its load, initial values, scaling, store).
    pub per_q_tile_s: f64,
    /// Seconds of one block in steady state.
    pub per_block_s: f64,
}

/// The time of the rmsnorm kernel of one shape: `T(t) = fixed_s + t * per_tile_s` for `t`
/// row tiles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormTimes {
    /// Seconds paid once (the weight's broadcast load, the pipeline's fill and drain).
    pub fixed_s: f64,
    /// Seconds of one row tile in steady state.
    pub per_tile_s: f64,
}

fn machine() -> Result<Machine> {
    // The values are never read: new memory is filled with NaN instead of being checked.
    Machine::new(MachineConfig { uninitialized: Uninitialized::Nan, ..MachineConfig::default() })
}

fn range(start: usize, stop: usize) -> Index {
    Index::Range { start: Some(start as i64), stop: Some(stop as i64), step: 1 }
}

fn sbuf(m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype) -> Result<Tile> {
    m.alloc(Space::Sbuf, name, shape, dtype)
}

fn psum(m: &mut Machine, name: &str, shape: &[usize], dtype: Dtype) -> Result<Tile> {
    m.alloc(Space::Psum, name, shape, dtype)
}

impl AttentionShape {
    /// `ValueError` naming the dimension out of the kernel's range.
    fn check(&self) -> Result<()> {
        if self.q_rows == 0 || self.q_rows > Q_TILE {
            return Err(Error::value(
                "q_rows",
                format!("{}: a query tile has 1 to {Q_TILE} rows", self.q_rows),
            ));
        }
        if self.d_qk == 0 {
            return Err(Error::value("head_dim", "must be at least 1"));
        }
        if self.d_v == 0 || self.d_v > KV_TILE || (self.shared_kv && self.d_v > self.d_qk) {
            return Err(Error::value(
                "v_head_dim",
                format!(
                    "{}: the attention kernel keeps a query tile's output in one PSUM bank \
                     (1 to {KV_TILE} columns), and values shared with the keys are at most \
                     the {} key columns",
                    self.d_v, self.d_qk
                ),
            ));
        }
        Ok(())
    }
}

/// Buffers of one key/value block (double-buffered).
struct BlockBufs {
    k: Vec<Tile>,
    v: Tile,
    s: Tile,
    p: Tile,
    p_t_ps: Tile,
    p_t: Tile,
    o_ps: Tile,
}

/// Runs the attention kernel (see the module doc) for `q_tiles` query tiles each against
/// `kv_tiles` key/value tiles of `shape`, and returns the machine's report.
pub fn attention_run(
    shape: &AttentionShape, q_tiles: usize, kv_tiles: usize,
) -> Result<KernelReport> {
    shape.check()?;
    let AttentionShape { q_rows, d_qk, d_v, shared_kv } = *shape;
    if shared_kv {
        return Err(Error::value(
            "shared_kv",
            "the prefill attention kernel loads K and V apart; only the token-generation \
             kernel reads a shared latent cache",
        ));
    }
    let bf = Dtype::Bf16;
    let f32_ = Dtype::Fp32;
    let chunks: Vec<(usize, usize)> =
        (0..d_qk.div_ceil(Q_TILE)).map(|c| (c * Q_TILE, ((c + 1) * Q_TILE).min(d_qk))).collect();
    let keys = kv_tiles * KV_TILE;
    let mut m = machine()?;
    let q_hbm = m.hbm_tensor("qT", &[d_qk, q_tiles * q_rows], bf, None)?;
    let k_hbm = m.hbm_tensor("kT", &[d_qk, keys], bf, None)?;
    let v_hbm = m.hbm_tensor("v", &[keys, d_v], bf, None)?;
    let out = m.hbm_tensor("out", &[q_tiles * q_rows, d_v], bf, None)?;
    let scale = 1.0 / (d_qk as f64).sqrt();
    // PSUM first, so each score tile lies in one bank.
    let mut bufs = Vec::new();
    for b in 0..2 {
        let s = psum(&mut m, &format!("s{b}"), &[q_rows, KV_TILE], f32_)?;
        bufs.push(s);
    }
    let mut o_pss = Vec::new();
    for b in 0..2 {
        o_pss.push(psum(&mut m, &format!("o_ps{b}"), &[q_rows, d_v], f32_)?);
    }
    let mut blocks = Vec::new();
    for (b, s) in bufs.into_iter().enumerate() {
        let k = chunks
            .iter()
            .enumerate()
            .map(|(c, &(lo, hi))| sbuf(&mut m, &format!("k{b}_{c}"), &[hi - lo, KV_TILE], bf))
            .collect::<Result<Vec<_>>>()?;
        let per = KV_TILE / Q_TILE;
        blocks.push(BlockBufs {
            k,
            v: sbuf(&mut m, &format!("v{b}"), &[Q_TILE, per, d_v], bf)?,
            s,
            p: sbuf(&mut m, &format!("p{b}"), &[q_rows, KV_TILE], bf)?,
            p_t_ps: psum(&mut m, &format!("pT_ps{b}"), &[Q_TILE, q_rows], bf)?,
            p_t: sbuf(&mut m, &format!("pT{b}"), &[Q_TILE, q_rows], bf)?,
            o_ps: o_pss[b],
        });
    }
    let stat = |m: &mut Machine, name: &str| sbuf(m, name, &[q_rows, 1], f32_);
    let mut run_max = Vec::new();
    let mut stats = Vec::new();
    for b in 0..2 {
        run_max.push(stat(&mut m, &format!("max{b}"))?);
        // block max, negated scaled max, correction, row sum
        stats.push([
            stat(&mut m, &format!("bmax{b}"))?,
            stat(&mut m, &format!("neg{b}"))?,
            stat(&mut m, &format!("corr{b}"))?,
            stat(&mut m, &format!("rowsum{b}"))?,
        ]);
    }
    let run_sum = stat(&mut m, "sum")?;
    let inv = stat(&mut m, "inv")?;
    let o_acc = sbuf(&mut m, "o_acc", &[q_rows, d_v], f32_)?;
    let o_sb = sbuf(&mut m, "o_sb", &[q_rows, d_v], bf)?;
    let q_sb = chunks
        .iter()
        .enumerate()
        .map(|(c, &(lo, hi))| sbuf(&mut m, &format!("q{c}"), &[hi - lo, q_rows], bf))
        .collect::<Result<Vec<_>>>()?;
    let pe = |accumulate: bool| PeOptions { accumulate: Some(accumulate), ..PeOptions::default() };
    let mut n = 0usize;
    for i in 0..q_tiles {
        let rows = range(i * q_rows, (i + 1) * q_rows);
        for (c, &(lo, hi)) in chunks.iter().enumerate() {
            m.dma_copy(&q_sb[c], &q_hbm.slice(&[range(lo, hi), rows])?, None)?;
        }
        m.memset(Engine::Vector, &run_max[n % 2], -1e30)?;
        m.memset(Engine::Vector, &run_sum, 0.0)?;
        m.memset(Engine::Vector, &o_acc, 0.0)?;
        for j in 0..kv_tiles {
            let (b, old, new) = (&blocks[n % 2], run_max[n % 2], run_max[(n + 1) % 2]);
            let [bmax, neg, corr, rowsum] = stats[n % 2];
            let keys = range(j * KV_TILE, (j + 1) * KV_TILE);
            for (c, &(lo, hi)) in chunks.iter().enumerate() {
                m.dma_copy(&b.k[c], &k_hbm.slice(&[range(lo, hi), keys])?, None)?;
            }
            for c in 0..KV_TILE / Q_TILE {
                let r0 = j * KV_TILE + c * Q_TILE;
                let dst = b.v.slice(&[Index::ALL, Index::At(c as i64), Index::ALL])?;
                m.dma_copy(&dst, &v_hbm.slice(&[range(r0, r0 + Q_TILE)])?, None)?;
            }
            for (c, k) in b.k.iter().enumerate() {
                m.nc_matmul_queued(&b.s, &q_sb[c], k, &pe(c > 0))?;
            }
            m.settle()?;
            m.tensor_reduce(&bmax, AluOp::Maximum, &b.s, 1, false)?;
            m.tensor_tensor(Engine::Vector, &new, &old, &bmax, AluOp::Maximum)?;
            let neg_scale = Scalar::Imm(-scale);
            m.tensor_scalar(Engine::Vector, &neg, &new, AluOp::Multiply, &neg_scale, false, None)?;
            let exp = |bias: Tile, reduce: Option<Tile>| ActivationArgs {
                bias: Some(Scalar::Tile(bias)),
                scale: Some(Scalar::Imm(scale)),
                reduce_op: reduce.map(|_| AluOp::Add),
                reduce_res: reduce,
                reduce_cmd: if reduce.is_some() { ReduceCmd::ResetReduce } else { ReduceCmd::Idle },
            };
            m.activation(&corr, ActFunc::Exp, &old, &exp(neg, None))?;
            m.activation(&b.p, ActFunc::Exp, &b.s, &exp(neg, Some(rowsum)))?;
            let corr_s = Scalar::Tile(corr);
            m.scalar_tensor_tensor(
                &run_sum,
                &run_sum,
                AluOp::Multiply,
                &corr_s,
                false,
                AluOp::Add,
                &rowsum,
                false,
            )?;
            for c in 0..KV_TILE / Q_TILE {
                let cols = b.p.slice(&[Index::ALL, range(c * Q_TILE, (c + 1) * Q_TILE)])?;
                m.nc_transpose(Engine::Tensor, &b.p_t_ps, &cols)?;
                m.tensor_copy(Engine::Vector, &b.p_t, &b.p_t_ps)?;
                let v = b.v.slice(&[Index::ALL, Index::At(c as i64), Index::ALL])?;
                m.nc_matmul(&b.o_ps, &b.p_t, &v, &pe(c > 0))?;
            }
            m.scalar_tensor_tensor(
                &o_acc,
                &o_acc,
                AluOp::Multiply,
                &corr_s,
                false,
                AluOp::Add,
                &b.o_ps,
                false,
            )?;
            n += 1;
        }
        m.reciprocal(&inv, &run_sum)?;
        let inv_s = Scalar::Tile(inv);
        m.tensor_scalar(Engine::Vector, &o_sb, &o_acc, AluOp::Multiply, &inv_s, false, None)?;
        m.dma_copy(&out.slice(&[rows])?, &o_sb, None)?;
    }
    m.run()
}

/// Keys of one token-generation block for a query tile of `q_rows` rows: [`TKG_CHUNKS`]
/// chunks of 128 keys, fewer when the block's scores (`chunks x q_rows` float32 columns a
/// partition) would not fit one PSUM bank: 2048 keys up to 32 rows, 512 at 128.
pub fn tkg_block_keys(q_rows: usize) -> usize {
    Q_TILE * TKG_CHUNKS.min(KV_TILE / q_rows.clamp(1, Q_TILE))
}

/// Chunks of 128 keys a token-generation block holds at most (2048 keys).
pub const TKG_CHUNKS: usize = 16;

/// 128-key chunks of transposed bf16 keys one PSUM bank holds (1024 columns).
const KT_BANK_CHUNKS: usize = (PSUM_BANK_BYTES / 2) as usize / Q_TILE;

/// Buffers of one token-generation block (double-buffered). With a shared cache `v` holds
/// the block's whole cache rows (`[128 keys, c, d_qk]`) and `k` views of one `K^T` tile made
/// from it by PE transposes through `kt_ps`.
struct TkgBufs {
    k: Vec<Tile>,
    v: Tile,
    kt_ps: Vec<Tile>,
    s: Tile,
    pmax: Tile,
    pmax_t: Tile,
    row_ps: Tile,
    row: Tile,
    bc_ps: Tile,
    bc: Tile,
    x: Tile,
    p: Tile,
    o_ps: Tile,
    sum_ps: Tile,
    // block max, [negated scaled running max, correction]
    bmax: Tile,
    stats: Tile,
}

/// Shapes of the token-generation kernel: the query rows, 128-key chunks and keys a block,
/// and whether the values are the keys' first columns (read once).
struct TkgDims {
    q: usize,
    c: usize,
    block: usize,
    shared: bool,
}

/// One block's loads and scores (issued a block ahead, so that the tensor engine computes
/// block `j + 1`'s scores while the other engines work on block `j`).
fn tkg_front(
    m: &mut Machine, b: &TkgBufs, dims: &TkgDims, chunks: &[(usize, usize)], q_sb: &[Tile],
    hbm: (&Tile, &Tile), k0: usize,
) -> Result<()> {
    let TkgDims { q, c, block, shared } = *dims;
    let (k_hbm, v_hbm) = hbm;
    if !shared {
        // The cache: K^T with the head dimension on the partitions, V with the keys.
        for (ci, &(lo, hi)) in chunks.iter().enumerate() {
            let src = k_hbm.slice(&[range(lo, hi), range(k0, k0 + block)])?;
            m.dma_copy(&b.k[ci], &src, None)?;
        }
    }
    // V with the keys on the partitions.
    let d_v = v_hbm.logical_shape()[1];
    if !shared {
        let v_src = v_hbm
            .slice(&[range(k0, k0 + Q_TILE)])?
            .with_pattern(&[((Q_TILE * d_v) as i64, c as u32), (1, d_v as u32)], 0)?;
        m.dma_copy(&b.v, &v_src, None)?;
    } else {
        // The whole cache rows once, a 128-key chunk a transfer (so that the transposes start
        // as chunks arrive); K^T from them by PE transposes of 128 keys x up to 128 head
        // columns, up to 8 chunks' transposes of one column range filling a PSUM bank (1024
        // bf16 columns), each bank copied to SBUF (two by the Vector engine, one by the
        // Scalar engine, in turn: the Vector engine reads PSUM at twice its element rate).
        for t in 0..c {
            let rows = range(k0 + t * Q_TILE, k0 + (t + 1) * Q_TILE);
            let dst = b.v.slice(&[Index::ALL, Index::At(t as i64), Index::ALL])?;
            m.dma_copy(&dst, &v_hbm.slice(&[rows])?, None)?;
        }
        let group = KT_BANK_CHUNKS.min(c);
        let mut u = 0;
        for g0 in (0..c).step_by(group) {
            let g1 = (g0 + group).min(c);
            for (ci, &(lo, hi)) in chunks.iter().enumerate() {
                let kt_ps = &b.kt_ps[u % b.kt_ps.len()];
                for t in g0..g1 {
                    let src = b.v.slice(&[Index::ALL, Index::At(t as i64), range(lo, hi)])?;
                    let cols = range((t - g0) * Q_TILE, (t - g0 + 1) * Q_TILE);
                    let dst = kt_ps.slice(&[range(0, hi - lo), cols])?;
                    m.nc_transpose(Engine::Tensor, &dst, &src)?;
                }
                let engine = [Engine::Vector, Engine::Vector, Engine::Scalar][u % 3];
                let src = kt_ps.slice(&[range(0, hi - lo), range(0, (g1 - g0) * Q_TILE)])?;
                let keys = range(g0 * Q_TILE, g1 * Q_TILE);
                let kt = b.k[0].slice(&[range(0, hi - lo), Index::At(ci as i64), keys])?;
                m.tensor_copy(engine, &kt, &src)?;
                u += 1;
            }
        }
    }
    // scores^T: 128 keys on the partitions by the tile's rows, per chunk.
    for t in 0..c {
        let dst = b.s.slice(&[Index::ALL, range(t * q, (t + 1) * q)])?;
        for (ci, &(lo, hi)) in chunks.iter().enumerate() {
            let keys = range(t * Q_TILE, (t + 1) * Q_TILE);
            let kt = if shared {
                b.k[0].slice(&[range(0, hi - lo), Index::At(ci as i64), keys])?
            } else {
                b.k[ci].slice(&[Index::ALL, keys])?
            };
            m.nc_matmul_queued(&dst, &kt, &q_sb[ci], &pe(ci > 0))?;
        }
    }
    m.settle()
}

fn pe(accumulate: bool) -> PeOptions {
    PeOptions { accumulate: Some(accumulate), ..PeOptions::default() }
}

/// Copies `row` (`[1, n]` in PSUM) to SBUF and broadcasts it to the 128 partitions (a matmul
/// with a row of ones), into `bc` (SBUF).
fn broadcast_row(
    m: &mut Machine, row_ps: &Tile, row: &Tile, ones_row: &Tile, bc_ps: &Tile, bc: &Tile,
) -> Result<()> {
    m.tensor_copy(Engine::Scalar, row, row_ps)?;
    m.nc_matmul(bc_ps, ones_row, row, &pe(false))?;
    m.tensor_copy(Engine::Scalar, bc, bc_ps)
}

/// Runs the token-generation attention kernel (see the module doc) for `q_tiles` query tiles
/// (a sequence's query heads sharing one key/value head each) against `blocks` blocks of
/// [`tkg_block_keys`] keys, and returns the machine's report.
pub fn attention_tkg_run(
    shape: &AttentionShape, q_tiles: usize, blocks: usize,
) -> Result<KernelReport> {
    shape.check()?;
    let AttentionShape { q_rows, d_qk, d_v, shared_kv: shared } = *shape;
    let q = q_rows;
    let bf = Dtype::Bf16;
    let f32_ = Dtype::Fp32;
    let block = tkg_block_keys(q);
    let c = block / Q_TILE;
    let (nv, dvc) = (d_v.div_ceil(Q_TILE), d_v.min(Q_TILE));
    if d_v > Q_TILE && !d_v.is_multiple_of(Q_TILE) {
        return Err(Error::value(
            "v_head_dim",
            format!("{d_v}: the token-generation kernel takes up to 128 or a multiple of 128"),
        ));
    }
    let dims = TkgDims { q, c, block, shared };
    let chunks: Vec<(usize, usize)> =
        (0..d_qk.div_ceil(Q_TILE)).map(|i| (i * Q_TILE, ((i + 1) * Q_TILE).min(d_qk))).collect();
    let keys = blocks * block;
    let mut m = machine()?;
    // Each query tile its own cache (a sequence and key/value head): K^T and V, or one shared
    // cache of `d_qk` columns whose first `d_v` are V. The output is written transposed
    // (`[d_v, rows]`), as the value-stationary matmul leaves it.
    let q_hbm = m.hbm_tensor("qT", &[d_qk, q_tiles * q], bf, None)?;
    let (k_hbm, v_hbm) = if shared {
        let kv = m.hbm_tensor("kv", &[q_tiles * keys, d_qk], bf, None)?;
        (kv, kv)
    } else {
        (
            m.hbm_tensor("kT", &[d_qk, q_tiles * keys], bf, None)?,
            m.hbm_tensor("v", &[q_tiles * keys, d_v], bf, None)?,
        )
    };
    let v_cols = if shared { d_qk } else { d_v };
    let out = m.hbm_tensor("outT", &[d_v, q_tiles * q], bf, None)?;
    let scale = 1.0 / (d_qk as f64).sqrt();
    // PSUM, largest first so that each tile lies in one bank: with a shared cache first the
    // banks of transposed keys (`[128, 1024]` bf16), four while the block's scores and
    // output take little PSUM (up to 32 query rows), else one.
    let n_chunks = d_qk.div_ceil(Q_TILE);
    let kt_banks = match (shared, q <= 32) {
        (false, _) => 0,
        (true, true) => 4,
        (true, false) => 1,
    };
    let mut kt_ps = Vec::new();
    for b in 0..kt_banks {
        kt_ps.push(psum(&mut m, &format!("kT_ps{b}"), &[Q_TILE, KT_BANK_CHUNKS * Q_TILE], bf)?);
    }
    let mut ps = Vec::new();
    for b in 0..2 {
        ps.push([
            psum(&mut m, &format!("s{b}"), &[Q_TILE, c * q], f32_)?,
            psum(&mut m, &format!("o_ps{b}"), &[dvc, nv * q], f32_)?,
        ]);
    }
    let mut small_ps = Vec::new();
    for b in 0..2 {
        small_ps.push([
            psum(&mut m, &format!("pmaxT{b}"), &[q, Q_TILE], f32_)?,
            psum(&mut m, &format!("bc_ps{b}"), &[Q_TILE, 2 * q], f32_)?,
            psum(&mut m, &format!("row_ps{b}"), &[1, 2 * q], f32_)?,
            psum(&mut m, &format!("sum_ps{b}"), &[q, 1], f32_)?,
        ]);
    }
    let mut sets = Vec::new();
    for b in 0..2 {
        let [s, o_ps] = ps[b];
        let [pmax_t, bc_ps, row_ps, sum_ps] = small_ps[b];
        let k = if shared {
            vec![sbuf(&mut m, &format!("kT{b}"), &[Q_TILE, n_chunks, block], bf)?]
        } else {
            chunks
                .iter()
                .enumerate()
                .map(|(i, &(lo, hi))| sbuf(&mut m, &format!("k{b}_{i}"), &[hi - lo, block], bf))
                .collect::<Result<Vec<_>>>()?
        };
        sets.push(TkgBufs {
            k,
            v: sbuf(&mut m, &format!("v{b}"), &[Q_TILE, c, v_cols], bf)?,
            kt_ps: kt_ps.clone(),
            s,
            pmax: sbuf(&mut m, &format!("pmax{b}"), &[Q_TILE, q], f32_)?,
            pmax_t,
            row_ps,
            row: sbuf(&mut m, &format!("row{b}"), &[1, 2 * q], f32_)?,
            bc_ps,
            bc: sbuf(&mut m, &format!("bc{b}"), &[Q_TILE, 2 * q], f32_)?,
            x: sbuf(&mut m, &format!("x{b}"), &[Q_TILE, c * q], f32_)?,
            p: sbuf(&mut m, &format!("p{b}"), &[Q_TILE, c * q], bf)?,
            o_ps,
            sum_ps,
            bmax: sbuf(&mut m, &format!("bmax{b}"), &[q, 1], f32_)?,
            stats: sbuf(&mut m, &format!("stats{b}"), &[q, 2], f32_)?,
        });
    }
    let mut run_max = Vec::new();
    for b in 0..2 {
        run_max.push(sbuf(&mut m, &format!("max{b}"), &[q, 1], f32_)?);
    }
    let run_sum = sbuf(&mut m, "sum", &[q, 1], f32_)?;
    let inv = sbuf(&mut m, "inv", &[q, 1], f32_)?;
    let o_acc = sbuf(&mut m, "o_accT", &[dvc, nv, q], f32_)?;
    let o_sb = sbuf(&mut m, "o_sbT", &[dvc, nv, q], bf)?;
    // Ones: a row that broadcasts a value to the 128 partitions, a column that sums them.
    let ones_row = sbuf(&mut m, "ones_row", &[1, Q_TILE], f32_)?;
    let ones_col = sbuf(&mut m, "ones_col", &[Q_TILE, 1], bf)?;
    m.memset(Engine::Vector, &ones_row, 1.0)?;
    m.memset(Engine::Vector, &ones_col, 1.0)?;
    let q_sb = chunks
        .iter()
        .enumerate()
        .map(|(i, &(lo, hi))| sbuf(&mut m, &format!("q{i}"), &[hi - lo, q], bf))
        .collect::<Result<Vec<_>>>()?;
    // The scores of chunk t for row r lie at column t * q + r.
    let by_row = [(1i64, q as u32), (q as i64, c as u32)];
    let over_chunks = |n: usize| [(0i64, n as u32), (1i64, q as u32)];
    let mut n = 0usize;
    for i in 0..q_tiles {
        let rows = range(i * q, (i + 1) * q);
        for (ci, &(lo, hi)) in chunks.iter().enumerate() {
            m.dma_copy(&q_sb[ci], &q_hbm.slice(&[range(lo, hi), rows])?, None)?;
        }
        m.memset(Engine::Vector, &run_max[n % 2], -1e30)?;
        m.memset(Engine::Vector, &run_sum, 0.0)?;
        m.memset(Engine::Vector, &o_acc, 0.0)?;
        let hbm = (&k_hbm, &v_hbm);
        if blocks > 0 {
            tkg_front(&mut m, &sets[n % 2], &dims, &chunks, &q_sb, hbm, i * keys)?;
        }
        for j in 0..blocks {
            // The next block's loads and scores: issued first, or with a shared cache (whose
            // transposes would hold the engines' in-order queues until its cache arrives)
            // after this block's work; its transfers start when their buffers are free either
            // way.
            let k0 = i * keys + (j + 1) * block;
            if j + 1 < blocks && !shared {
                tkg_front(&mut m, &sets[(n + 1) % 2], &dims, &chunks, &q_sb, hbm, k0)?;
            }
            let (b, old, new) = (&sets[n % 2], run_max[n % 2], run_max[(n + 1) % 2]);
            let neg = b.stats.slice(&[Index::ALL, range(0, 1)])?;
            let corr = b.stats.slice(&[Index::ALL, range(1, 2)])?;
            // The block max: each partition's over its chunks, then across the partitions
            // (a PE transpose and a reduction along the free axis).
            let s_rows = b.s.with_pattern(&by_row, 0)?;
            m.tensor_reduce(&b.pmax, AluOp::Maximum, &s_rows, 1, false)?;
            m.nc_transpose(Engine::Tensor, &b.pmax_t, &b.pmax)?;
            m.tensor_reduce(&b.bmax, AluOp::Maximum, &b.pmax_t, 1, false)?;
            m.tensor_tensor(Engine::Vector, &new, &old, &b.bmax, AluOp::Maximum)?;
            m.tensor_scalar(
                Engine::Vector,
                &neg,
                &new,
                AluOp::Multiply,
                &Scalar::Imm(-scale),
                false,
                None,
            )?;
            let corr_args = ActivationArgs {
                bias: Some(Scalar::Tile(neg)),
                scale: Some(Scalar::Imm(scale)),
                ..ActivationArgs::default()
            };
            m.activation(&corr, ActFunc::Exp, &old, &corr_args)?;
            // -scale * max and the correction to the 128 partitions: each transposed to a
            // row, then times a row of ones.
            for (col, t) in [neg, corr].iter().enumerate() {
                let dst = b.row_ps.slice(&[Index::ALL, range(col * q, (col + 1) * q)])?;
                m.nc_transpose(Engine::Tensor, &dst, t)?;
            }
            broadcast_row(&mut m, &b.row_ps, &b.row, &ones_row, &b.bc_ps, &b.bc)?;
            let neg_bc = b.bc.slice(&[Index::ALL, range(0, q)])?;
            // The output's partitions are the value head's columns (`dvc`, fewer than 128
            // for a head of 64).
            let corr_bc = b.bc.slice(&[range(0, dvc), range(q, 2 * q)])?;
            // p = exp(scale * s - scale * max) on all 128 partitions.
            if q == 1 {
                let args = ActivationArgs {
                    bias: Some(Scalar::Tile(neg_bc)),
                    scale: Some(Scalar::Imm(scale)),
                    ..ActivationArgs::default()
                };
                m.activation(&b.p, ActFunc::Exp, &b.s, &args)?;
            } else {
                let nb = neg_bc.with_pattern(&over_chunks(c), 0)?;
                let x3 = b.x.reshape_free(&[c, q])?;
                let s3 = b.s.reshape_free(&[c, q])?;
                m.scalar_tensor_tensor(
                    &x3,
                    &s3,
                    AluOp::Multiply,
                    &Scalar::Imm(scale),
                    false,
                    AluOp::Add,
                    &nb,
                    false,
                )?;
                m.activation(&b.p, ActFunc::Exp, &b.x, &ActivationArgs::default())?;
            }
            // (p^T v)^T = v^T p with V stationary, and the sums of p over the keys (a matmul
            // with a column of ones), accumulated over the chunks in PSUM.
            for t in 0..c {
                let pt = b.p.slice(&[Index::ALL, range(t * q, (t + 1) * q)])?;
                for vi in 0..nv {
                    let dst = b.o_ps.slice(&[Index::ALL, range(vi * q, (vi + 1) * q)])?;
                    let v = b.v.slice(&[
                        Index::ALL,
                        Index::At(t as i64),
                        range(vi * dvc, (vi + 1) * dvc),
                    ])?;
                    m.nc_matmul_queued(&dst, &v, &pt, &pe(t > 0))?;
                }
                m.nc_matmul_queued(&b.sum_ps, &pt, &ones_col, &pe(t > 0))?;
            }
            m.settle()?;
            m.scalar_tensor_tensor(
                &run_sum,
                &run_sum,
                AluOp::Multiply,
                &Scalar::Tile(corr),
                false,
                AluOp::Add,
                &b.sum_ps,
                false,
            )?;
            let o_ps = b.o_ps.reshape_free(&[nv, q])?;
            if q == 1 {
                m.scalar_tensor_tensor(
                    &o_acc,
                    &o_acc,
                    AluOp::Multiply,
                    &Scalar::Tile(corr_bc),
                    false,
                    AluOp::Add,
                    &o_ps,
                    false,
                )?;
            } else {
                let cb = corr_bc.with_pattern(&over_chunks(nv), 0)?;
                m.tensor_tensor(Engine::Vector, &o_acc, &o_acc, &cb, AluOp::Multiply)?;
                m.tensor_tensor(Engine::Vector, &o_acc, &o_acc, &o_ps, AluOp::Add)?;
            }
            if j + 1 < blocks && shared {
                tkg_front(&mut m, &sets[(n + 1) % 2], &dims, &chunks, &q_sb, hbm, k0)?;
            }
            n += 1;
        }
        // 1 / sum to the value head's partitions, the scaling and the (transposed) store.
        let b = &sets[n % 2];
        m.reciprocal(&inv, &run_sum)?;
        let dst = b.row_ps.slice(&[Index::ALL, range(0, q)])?;
        m.nc_transpose(Engine::Tensor, &dst, &inv)?;
        broadcast_row(&mut m, &b.row_ps, &b.row, &ones_row, &b.bc_ps, &b.bc)?;
        let inv_bc =
            b.bc.slice(&[range(0, dvc), range(0, q)])?.with_pattern(&over_chunks(nv), 0)?;
        m.tensor_tensor(Engine::Vector, &o_sb, &o_acc, &inv_bc, AluOp::Multiply)?;
        for vi in 0..nv {
            let src = o_sb.slice(&[Index::ALL, Index::At(vi as i64), Index::ALL])?;
            let dst = out.slice(&[range(vi * dvc, (vi + 1) * dvc), rows])?;
            m.dma_copy(&dst, &src, None)?;
        }
    }
    m.run()
}

/// Partitions each row takes in the rmsnorm kernel: with fewer than 128 rows a row's `hidden`
/// columns are folded onto `f` partitions (the largest divisor of `hidden` up to `128 / rows`),
/// so a decode step's few rows still use the engines' lanes.
pub fn rmsnorm_fold(rows: usize, hidden: usize) -> usize {
    let most = (Q_TILE / rows.max(1)).max(1);
    (1..=most.min(hidden)).rev().find(|f| hidden.is_multiple_of(*f)).unwrap_or(1)
}

/// Runs the rmsnorm kernel (see the module doc) over `tiles` tiles of `rows` rows (1..=128) of
/// `hidden` bf16 columns. With fewer than 128 rows each row lies on [`rmsnorm_fold`]
/// partitions and the partial sums of squares are added across them by one `nc_matmul` with
/// a block-diagonal matrix of ones (PE), which also hands each partition its row's sum.
pub fn rmsnorm_run(rows: usize, hidden: usize, tiles: usize) -> Result<KernelReport> {
    if rows == 0 || rows > Q_TILE {
        return Err(Error::value("rows", format!("{rows}: a row tile has 1 to {Q_TILE} rows")));
    }
    if hidden == 0 {
        return Err(Error::value("hidden", "must be at least 1"));
    }
    if tiles == 0 {
        return Err(Error::value("tiles", "must be at least 1"));
    }
    let bf = Dtype::Bf16;
    let fold = rmsnorm_fold(rows, hidden);
    let (parts, cols) = (rows * fold, hidden / fold);
    // Per partition: the weight, and per buffer set x (scaled in place) and sq (reused for
    // the output).
    let row = 2 * cols as u64;
    let sets = if 5 * row <= SBUF_USABLE_PARTITION_BYTES {
        2
    } else if 3 * row <= SBUF_USABLE_PARTITION_BYTES {
        1
    } else {
        return Err(Error::capacity(
            "hidden",
            format!(
                "hidden_size={hidden}: the rmsnorm kernel keeps three bf16 rows of {cols} \
                 columns per partition ({} B of the {SBUF_USABLE_PARTITION_BYTES} B an SBUF \
                 partition has)",
                3 * row
            ),
        ));
    };
    let mut m = machine()?;
    let x_hbm = m.hbm_tensor("x", &[tiles * parts, cols], bf, None)?;
    // The weight as the tile lays it out (a broadcast read of the same bytes).
    let g_hbm = m.hbm_tensor("g", &[parts, cols], bf, None)?;
    let out = m.hbm_tensor("out", &[tiles * parts, cols], bf, None)?;
    let g = sbuf(&mut m, "g", &[parts, cols], bf)?;
    m.dma_copy(&g, &g_hbm, None)?;
    let ones = if fold > 1 {
        let t = sbuf(&mut m, "ones", &[parts, parts], Dtype::Fp32)?;
        m.memset(Engine::Vector, &t, 1.0)?;
        Some(t)
    } else {
        None
    };
    let mut set = Vec::new();
    for b in 0..sets {
        set.push([
            sbuf(&mut m, &format!("x{b}"), &[parts, cols], bf)?,
            sbuf(&mut m, &format!("sq{b}"), &[parts, cols], bf)?,
        ]);
    }
    let mut stats = Vec::new();
    for b in 0..2 {
        stats.push([
            sbuf(&mut m, &format!("ss{b}"), &[parts, 1], Dtype::Fp32)?,
            psum(&mut m, &format!("tot{b}"), &[parts, 1], Dtype::Fp32)?,
            sbuf(&mut m, &format!("ms{b}"), &[parts, 1], Dtype::Fp32)?,
            sbuf(&mut m, &format!("r{b}"), &[parts, 1], Dtype::Fp32)?,
        ]);
    }
    let eps = 1e-6;
    let load = |m: &mut Machine, t: usize| -> Result<()> {
        let hbm_rows = range(t * parts, (t + 1) * parts);
        m.dma_copy(&set[t % sets][0], &x_hbm.slice(&[hbm_rows])?, None)
    };
    load(&mut m, 0)?;
    for t in 0..tiles {
        // The next tile's load is issued first, so it overlaps this tile's compute.
        if t + 1 < tiles {
            load(&mut m, t + 1)?;
        }
        let [x, sq] = set[t % sets];
        let [ss, tot, ms, r] = stats[t % 2];
        m.activation(&sq, ActFunc::Square, &x, &ActivationArgs::default())?;
        m.tensor_reduce(&ss, AluOp::Add, &sq, 1, false)?;
        let sum = match &ones {
            Some(ones) => {
                let opts = PeOptions { accumulate: Some(false), ..PeOptions::default() };
                m.nc_matmul(&tot, ones, &ss, &opts)?;
                tot
            }
            None => ss,
        };
        let second = (AluOp::Add, Scalar::Imm(eps), false);
        m.tensor_scalar(
            Engine::Vector,
            &ms,
            &sum,
            AluOp::Multiply,
            &Scalar::Imm(1.0 / hidden as f64),
            false,
            Some(&second),
        )?;
        m.activation(&r, ActFunc::Rsqrt, &ms, &ActivationArgs::default())?;
        m.tensor_scalar(Engine::Vector, &x, &x, AluOp::Multiply, &Scalar::Tile(r), false, None)?;
        m.tensor_tensor(Engine::Vector, &sq, &x, &g, AluOp::Multiply)?;
        let hbm_rows = range(t * parts, (t + 1) * parts);
        m.dma_copy(&out.slice(&[hbm_rows])?, &sq, None)?;
    }
    m.run()
}

type Cache<K, V> = OnceLock<Mutex<HashMap<K, V>>>;

static ATTENTION: Cache<AttentionShape, AttentionTimes> = OnceLock::new();
static ATTENTION_TKG: Cache<AttentionShape, AttentionTimes> = OnceLock::new();
static NORM: Cache<(usize, usize), NormTimes> = OnceLock::new();

/// Looks `key` up in `cache`, else computes it (outside the lock) and keeps it.
fn cached<K: std::hash::Hash + Eq + Copy, V: Copy>(
    cache: &Cache<K, V>, key: K, compute: impl FnOnce() -> Result<V>,
) -> Result<V> {
    let map = cache.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(v) = map.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(*v);
    }
    let v = compute()?;
    map.lock().unwrap_or_else(|e| e.into_inner()).insert(key, v);
    Ok(v)
}

/// `T(q, k) = fixed + q x per_q_tile + q x k x per_block` from three runs of `run`: 1 query
/// tile against `n` and `2n` blocks and 2 query tiles against `n`.
fn three_runs(
    shape: &AttentionShape, run: fn(&AttentionShape, usize, usize) -> Result<KernelReport>,
) -> Result<AttentionTimes> {
    let cancel = crate::cancel::current();
    let n = ATTENTION_RUN_BLOCKS;
    let t1 = run(shape, 1, n)?.seconds;
    cancel.check()?;
    let t2 = run(shape, 1, 2 * n)?.seconds;
    cancel.check()?;
    let q2 = run(shape, 2, n)?.seconds;
    let per_block_s = (t2 - t1) / n as f64;
    let per_q_tile_s = q2 - t1 - n as f64 * per_block_s;
    Ok(AttentionTimes {
        fixed_s: t1 - per_q_tile_s - n as f64 * per_block_s,
        per_q_tile_s,
        per_block_s,
    })
}

/// The attention kernel's time for `shape` (see the module doc), from three runs of
/// [`attention_run`], cached for the process.
pub fn attention_times(shape: &AttentionShape) -> Result<AttentionTimes> {
    shape.check()?;
    cached(&ATTENTION, *shape, || three_runs(shape, attention_run))
}

/// The token-generation attention kernel's time for `shape` (blocks of
/// [`tkg_block_keys`]`(shape.q_rows)` keys), from three runs of [`attention_tkg_run`] as
/// [`attention_times`] takes its own, cached for the process.
pub fn attention_tkg_times(shape: &AttentionShape) -> Result<AttentionTimes> {
    shape.check()?;
    cached(&ATTENTION_TKG, *shape, || three_runs(shape, attention_tkg_run))
}

/// The rmsnorm kernel's time for tiles of `rows` rows of `hidden` columns, from runs of
/// [`NORM_RUN_TILES`] and twice as many tiles of [`rmsnorm_run`], cached for the process.
/// A short tile is timed as one of the next power of two rows: the same columns per
/// partition after [`rmsnorm_fold`] (so the same engine time), at most twice the DMA bytes;
/// it keeps the cache to 8 shapes per hidden size, where a search over batch sizes would
/// otherwise time up to 128.
pub fn rmsnorm_times(rows: usize, hidden: usize) -> Result<NormTimes> {
    if rows == 0 || rows > Q_TILE {
        return Err(Error::value("rows", format!("{rows}: a row tile has 1 to {Q_TILE} rows")));
    }
    let rows = rows.next_power_of_two();
    cached(&NORM, (rows, hidden), || {
        let cancel = crate::cancel::current();
        let n = NORM_RUN_TILES;
        let t1 = rmsnorm_run(rows, hidden, n)?.seconds;
        cancel.check()?;
        let t2 = rmsnorm_run(rows, hidden, 2 * n)?.seconds;
        let per_tile_s = (t2 - t1) / n as f64;
        Ok(NormTimes { fixed_s: t1 - n as f64 * per_tile_s, per_tile_s })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::cost::{seconds, ticks_per_cycle};
    use crate::machine::Queue;
    use crate::spec::{
        ACT_READ_ACCUMULATOR_CYCLES, DMA_ENGINES_PER_CORE, DMA_ENGINE_BYTES_PER_S, MIN_II_CYCLES,
        TENSOR_ACCESS_INIT_CYCLES,
    };

    const HEAD: AttentionShape =
        AttentionShape { q_rows: 128, d_qk: 128, d_v: 128, shared_kv: false };

    /// DeepSeek-V3's decode at TP=64: 2 heads a rank against the latent cache (512 latent and
    /// 64 rope columns).
    const MLA: AttentionShape = AttentionShape { q_rows: 2, d_qk: 576, d_v: 512, shared_kv: true };

    #[test]
    fn the_three_terms_predict_a_run_they_were_not_taken_from() {
        let t = attention_times(&HEAD).expect("times");
        let model = |q: usize, k: usize| {
            t.fixed_s + q as f64 * t.per_q_tile_s + (q * k) as f64 * t.per_block_s
        };
        // The runs the terms come from, exactly.
        let n = ATTENTION_RUN_BLOCKS;
        for (q, k) in [(1, n), (1, 2 * n), (2, n)] {
            let run = attention_run(&HEAD, q, k).expect("run").seconds;
            assert!((model(q, k) - run).abs() < 1e-12, "{q} {k}");
        }
        // One they are not: 3 query tiles of 6 blocks.
        let run = attention_run(&HEAD, 3, 6).expect("run").seconds;
        assert!((model(3, 6) / run - 1.0).abs() < 0.03, "{} {run}", model(3, 6));
        assert!(t.per_block_s > 0.0 && t.per_q_tile_s > 0.0 && t.fixed_s >= 0.0);
    }

    #[test]
    fn a_block_takes_at_least_what_its_activations_cost_the_scalar_engine() {
        // Per block the Scalar engine runs exp over the 512 scores with its row sums and exp
        // of the one correction value: the machine's activation cost of each.
        let n = ATTENTION_RUN_BLOCKS;
        let busy = |k: usize| {
            let r = attention_run(&HEAD, 1, k).expect("run");
            r.queue(Queue::Engine(Engine::Scalar)).expect("ACT").busy_s
        };
        let act = (busy(2 * n) - busy(n)) / n as f64;
        let cyc = |work: usize| (work.max(MIN_II_CYCLES) + TENSOR_ACCESS_INIT_CYCLES) as u64;
        let want = seconds(
            (cyc(KV_TILE) + ACT_READ_ACCUMULATOR_CYCLES as u64 + cyc(1))
                * ticks_per_cycle(Engine::Scalar),
        );
        assert!((act - want).abs() < 1e-12, "{act} {want}");
        let t = attention_times(&HEAD).expect("times");
        assert!(t.per_block_s >= act, "{} {act}", t.per_block_s);
    }

    #[test]
    fn the_token_generation_kernel_keeps_the_keys_on_the_partitions() {
        // One query row (Llama at TP=64): the prefill layout runs its softmax on 1 of 128
        // partitions; the token-generation kernel on all of them.
        let one = AttentionShape { q_rows: 1, ..HEAD };
        let t = attention_tkg_times(&one).expect("tkg");
        // T(q, k) holds on a run its terms were not taken from.
        let run = attention_tkg_run(&one, 3, 6).expect("run").seconds;
        let model = t.fixed_s + 3.0 * t.per_q_tile_s + 18.0 * t.per_block_s;
        assert!((model / run - 1.0).abs() < 0.03, "{model} {run}");
        let block = tkg_block_keys(1);
        assert_eq!(block, 2048);
        assert_eq!(tkg_block_keys(128), 512);
        let busy = |r: &KernelReport, e: Engine| r.queue(Queue::Engine(e)).expect("q").busy_s;
        let n = ATTENTION_RUN_BLOCKS;
        let per_key = |run: fn(&AttentionShape, usize, usize) -> Result<KernelReport>,
                       keys: usize| {
            let (a, b) = (run(&one, 1, n).expect("a"), run(&one, 1, 2 * n).expect("b"));
            let d = |e| (busy(&b, e) - busy(&a, e)) / (n * keys) as f64;
            (d(Engine::Vector), d(Engine::Scalar))
        };
        let (dve_p, act_p) = per_key(attention_run, KV_TILE);
        let (dve_t, act_t) = per_key(attention_tkg_run, block);
        assert!(dve_p > 8.0 * dve_t, "{dve_p} {dve_t}");
        assert!(act_p > 4.0 * act_t, "{act_p} {act_t}");
        // A block's time is then its cache read: no faster than the DMA engines' peak for
        // its K and V bytes, within 25 % of it, and far below the prefill layout's per key.
        let bytes = (block * (HEAD.d_qk + HEAD.d_v) * 2) as f64;
        let peak = bytes / (DMA_ENGINES_PER_CORE as f64 * DMA_ENGINE_BYTES_PER_S);
        assert!(t.per_block_s >= peak && t.per_block_s < 1.25 * peak, "{} {peak}", t.per_block_s);
        let prefill = attention_times(&one).expect("prefill");
        let ratio = (prefill.per_block_s / KV_TILE as f64) / (t.per_block_s / block as f64);
        assert!(ratio > 3.0, "{ratio}");
    }

    #[test]
    fn a_head_of_64_decodes_on_its_64_partitions() {
        // Llama-3.2-1B's heads: the output (and the corrections scaling it) on 64 partitions.
        for q_rows in [1, 8] {
            let small = AttentionShape { q_rows, d_qk: 64, d_v: 64, ..HEAD };
            let t = attention_tkg_times(&small).expect("a head of 64");
            let full = attention_tkg_times(&AttentionShape { q_rows, ..HEAD }).expect("128");
            let bytes = (tkg_block_keys(q_rows) * 128 * 2) as f64;
            let peak = bytes / (DMA_ENGINES_PER_CORE as f64 * DMA_ENGINE_BYTES_PER_S);
            assert!(t.per_block_s >= peak && t.per_block_s < full.per_block_s, "{q_rows}");
        }
    }

    #[test]
    fn a_shared_latent_cache_is_read_once() {
        let block = tkg_block_keys(MLA.q_rows);
        assert_eq!(block, 2048);
        let apart = AttentionShape { shared_kv: false, ..MLA };
        let n = ATTENTION_RUN_BLOCKS;
        let bytes = |shape: &AttentionShape, k: usize| {
            attention_tkg_run(shape, 1, k).expect("run").dma_bytes as f64
        };
        // Per block the DMA moves the cache's 576 columns once (2048 x 576 x 2 bytes), where
        // apart it moved K^T (576 rows) and V (512 columns).
        let once = (bytes(&MLA, 2 * n) - bytes(&MLA, n)) / n as f64;
        let twice = (bytes(&apart, 2 * n) - bytes(&apart, n)) / n as f64;
        assert_eq!(once, (block * 576 * 2) as f64);
        assert_eq!(twice, (block * (576 + 512) * 2) as f64);
        // K^T is made on chip: per 128-key chunk 5 PE transposes (4 x 128 + 64 columns), in 2
        // banks of 8 chunks per column range: 10 PSUM-to-SBUF copies.
        let r = attention_tkg_run(&MLA, 1, 1).expect("run");
        let count = |op| r.opcodes.iter().find(|(o, _)| *o == op).map_or(0, |x| x.1);
        let r_apart = attention_tkg_run(&apart, 1, 1).expect("run");
        let count_apart = |op| r_apart.opcodes.iter().find(|(o, _)| *o == op).map_or(0, |x| x.1);
        use crate::machine::Opcode;
        assert_eq!(count(Opcode::NcTranspose) - count_apart(Opcode::NcTranspose), 16 * 5);
        assert_eq!(count(Opcode::TensorCopy) - count_apart(Opcode::TensorCopy), 2 * 5);
        // A block costs at least its single read at the DMA engines' peak, and about three
        // quarters of what the separate loads did (now the tensor engine's transposes and
        // matmuls bound it: 9.4 us against 12.9 us).
        let t = attention_tkg_times(&MLA).expect("times");
        let t_apart = attention_tkg_times(&apart).expect("times");
        let peak = once / (DMA_ENGINES_PER_CORE as f64 * DMA_ENGINE_BYTES_PER_S);
        assert!(t.per_block_s >= peak, "{} {peak}", t.per_block_s);
        assert!(
            t.per_block_s < 0.8 * t_apart.per_block_s && t.per_block_s > 0.6 * t_apart.per_block_s,
            "{} {}",
            t.per_block_s,
            t_apart.per_block_s
        );
        // T(q, k) holds on a run its terms were not taken from.
        let run = attention_tkg_run(&MLA, 3, 6).expect("run").seconds;
        let model = t.fixed_s + 3.0 * t.per_q_tile_s + 18.0 * t.per_block_s;
        assert!((model / run - 1.0).abs() < 0.03, "{model} {run}");
        // Query tiles of up to 128 rows (a small MLA model at TP=1) keep one bank of keys.
        for q_rows in [32, 33, 128] {
            let shape = AttentionShape { q_rows, ..MLA };
            attention_tkg_run(&shape, 1, 2).expect("fits PSUM");
        }
        // The prefill kernel takes K and V apart only; values wider than the keys are refused.
        let e = attention_run(&MLA, 1, 1).expect_err("prefill");
        assert_eq!(crate::workload::arg_of(&e), Some("shared_kv"));
        let wide = AttentionShape { d_v: 640, ..MLA };
        let e = attention_tkg_times(&wide).expect_err("wide");
        assert_eq!(crate::workload::arg_of(&e), Some("v_head_dim"));
    }

    #[test]
    fn norm_tiles_scale_with_the_hidden_size() {
        let a = rmsnorm_times(128, 4096).expect("4096");
        let b = rmsnorm_times(128, 8192).expect("8192");
        let r = b.per_tile_s / a.per_tile_s;
        assert!(r > 1.8 && r < 2.05, "{r}");
        // T(t) = fixed + t x per_tile holds on a run it was not taken from.
        let run = rmsnorm_run(128, 4096, 6).expect("run").seconds;
        let model = a.fixed_s + 6.0 * a.per_tile_s;
        assert!((model / run - 1.0).abs() < 0.03, "{model} {run}");
        // A decode step's single row is folded onto 128 partitions.
        for (rows, hidden, fold) in [(1, 8192, 128), (3, 8192, 32), (128, 8192, 1), (1, 7, 7)] {
            assert_eq!(rmsnorm_fold(rows, hidden), fold, "{rows} x {hidden}");
        }
    }

    #[test]
    fn shapes_out_of_range_name_their_argument() {
        let bad = |shape: AttentionShape| {
            let e = attention_times(&shape).expect_err("bad");
            crate::workload::arg_of(&e).map(str::to_owned)
        };
        let v = AttentionShape { d_v: 513, ..HEAD };
        assert_eq!(bad(v).as_deref(), Some("v_head_dim"));
        let q = AttentionShape { q_rows: 129, ..HEAD };
        assert_eq!(bad(q).as_deref(), Some("q_rows"));
        let e = rmsnorm_times(128, 1 << 20).expect_err("too wide");
        assert!(matches!(e, Error::Capacity { .. }));
        assert_eq!(crate::workload::arg_of(&e), Some("hidden"));
    }
}
