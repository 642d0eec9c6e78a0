//! The tensor engine's instructions on the machine's memories: `nc_matmul` (reusing
//! [`crate::engine`]'s per-instruction numerics: an FMA per PE step, each tile's sum from +0 in
//! ascending k, fp32 PSUM accumulation, double_row, PE tiling) and `nc_transpose` (tensor
//! engine: bit-exact on NeuronCore-v3; Vector engine: up to 32 x 32).
//!
//! PSUM accumulation groups: one bit per PSUM fp32 slot says "written by a matmul since any
//! other write". `accumulate=True` needs every slot of `dst` set (accumulating onto memory a
//! non-matmul instruction wrote is undefined on v2/v3, \[S2\]\[S9\]); `accumulate=None`
//! accumulates exactly when they all are (the compiler's "first write overwrites").

use rayon::prelude::*;

use crate::engine::{self, Operand, PeTile, PerfMode, CANONICAL_NAN};
use crate::memory::Space;
use crate::numerics::Format;
use crate::spec::{PE_TILE_QUARTER, VECTOR_TRANSPOSE_MAX};
use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::record::{flags, CostInput, Engine, Opcode, Queue};
use super::super::{psum_words, Machine};
use super::{check_engine, dtype_rule, rule, shape_rule, Opnd};
use crate::machine::tile::Tile;

/// The options of `nc_matmul`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeOptions {
    /// `True` accumulates onto `dst`, `False` overwrites, `None` infers (see the module doc).
    pub accumulate: Option<bool>,
    /// `none` or `double_row`.
    pub perf_mode: PerfMode,
    /// The PE tile (`tile_position`, `tile_size`).
    pub tile: PeTile,
    /// Transpose mode: `dst = stationary.T`, bit for bit (`moving` must be the identity).
    pub is_transpose: bool,
}

fn format_of(arg: &str, t: &Tile) -> Result<Format> {
    t.dtype.format().ok_or_else(|| {
        dtype_rule(
            arg,
            "matmul_dtype",
            format!(
                "the tensor engine has no integer datapath; {arg} is {} (convert it to a float \
                 dtype first)",
                t.dtype
            ),
        )
    })
}

/// A checked `nc_matmul` whose arithmetic has not run yet: its destination, its operands'
/// float32 values, shapes and formats, and whether it accumulates.
#[derive(Debug, Clone)]
pub(crate) struct QueuedMatmul {
    dst: Opnd,
    stationary: (Vec<f32>, Vec<usize>, Format),
    moving: (Vec<f32>, Vec<usize>, Format),
    perf_mode: PerfMode,
    tile: PeTile,
    accumulate: bool,
}

impl QueuedMatmul {
    /// The tile's sums (`[M, N]`, row-major), each from +0.0 in the PE's order.
    fn sums(&self) -> Result<Vec<f32>> {
        let (sv, ss, sf) = &self.stationary;
        let (mv, ms, mf) = &self.moving;
        engine::matmul(
            &Operand {
                values: sv,
                shape: ss,
                format: *sf,
            },
            &Operand {
                values: mv,
                shape: ms,
                format: *mf,
            },
            self.perf_mode,
            self.tile,
        )
    }
}

/// The cost input of a tensor-engine instruction on PE tile `tile`.
fn pe_cost(partitions: usize, m: usize, k: usize, tile: PeTile, flags: u32) -> CostInput {
    let q = PE_TILE_QUARTER;
    CostInput {
        n: k as u32,
        partitions: partitions as u16,
        m: m as u16,
        k: k as u16,
        pe_tile: [
            (tile.position.0 / q) as u8,
            (tile.size.0 / q) as u8,
            (tile.position.1 / q) as u8,
            (tile.size.1 / q) as u8,
        ],
        flags,
        ..CostInput::default()
    }
}

impl Machine {
    fn pe_input(&self, arg: &str, t: &Tile) -> Result<Opnd> {
        let o = self.operand(arg, t, Some(Engine::Tensor), false)?;
        if t.space != Space::Sbuf {
            return Err(rule(
                arg,
                "matmul_memory",
                format!(
                    "{arg} is in {}; the tensor engine reads SBUF",
                    t.space.name()
                ),
            ));
        }
        Ok(o)
    }

    /// Whether every PSUM slot `dst` covers was last written by a matmul.
    fn psum_mm_state(&self, d: &Opnd) -> bool {
        let mut all = true;
        let (p0, pn) = (d.tile.start_partition, d.tile.partitions);
        psum_words(p0, pn, d.range.0, d.range.1, |w, mask| {
            all &= self.psum_mm[w] & mask == mask
        });
        all
    }

    fn set_psum_mm(&mut self, d: &Opnd) {
        let (p0, pn) = (d.tile.start_partition, d.tile.partitions);
        let words = &mut self.psum_mm;
        psum_words(p0, pn, d.range.0, d.range.1, |w, mask| words[w] |= mask);
    }

    /// Writes a settled matmul's sums to PSUM (added to what is there when it accumulates;
    /// NaN canonical). Dense float32 rows are updated in place.
    fn apply_queued(&mut self, q: &QueuedMatmul, s: &[f32]) -> Result<()> {
        let d = &q.dst;
        let c = d.tile.canonical();
        let dense = c.n == 0 || (c.n == 1 && c.dims[0].1 == 1);
        if d.tile.dtype == Dtype::Fp32 && dense {
            let n = d.n();
            let mem = self.mem.mem_mut(&d.tile);
            let base = mem.at(d.tile.start_partition as usize, d.tile.offset as usize);
            let stride = mem.stride;
            let bytes = mem.bytes_mut();
            for (i, row) in s.chunks_exact(n).enumerate() {
                let off = base + i * stride;
                for (b, &x) in bytes[off..off + 4 * n].chunks_exact_mut(4).zip(row) {
                    let v = if q.accumulate {
                        f32::from_le_bytes([b[0], b[1], b[2], b[3]]) + x
                    } else {
                        x
                    };
                    let v = if v.is_nan() { CANONICAL_NAN } else { v };
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            self.mem.mark_written(&d.tile, d.range);
        } else {
            let vals: Vec<f32> = if q.accumulate {
                let mut acc = self.gather_f32(&d.tile);
                for (a, &x) in acc.iter_mut().zip(s) {
                    let v = *a + x;
                    *a = if v.is_nan() { CANONICAL_NAN } else { v };
                }
                acc
            } else {
                s.iter()
                    .map(|&v| if v.is_nan() { CANONICAL_NAN } else { v })
                    .collect()
            };
            self.scatter_f32(d, &vals)?;
        }
        // The write above is the matmul's own: its slots stay "written by a matmul".
        self.set_psum_mm(d);
        Ok(())
    }

    /// `nc_matmul`: `dst = stationary.T @ moving` into PSUM (or onto it, see
    /// [`PeOptions::accumulate`]); in transpose mode `dst = stationary.T` bit for bit.
    pub fn nc_matmul(
        &mut self,
        dst: &Tile,
        stationary: &Tile,
        moving: &Tile,
        opts: &PeOptions,
    ) -> Result<()> {
        self.nc_matmul_queued(dst, stationary, moving, opts)?;
        self.settle()
    }

    /// [`Machine::nc_matmul`] with its arithmetic left in the machine's matmul queue: checked,
    /// recorded and its operands read now, its result written to PSUM by the next
    /// [`Machine::settle`], which computes every queued matmul in parallel and writes them in
    /// issue order (the same bits as one at a time). A front end that issues many matmuls in a
    /// row (an NKI kernel) uses this and settles before anything else touches the memories.
    pub fn nc_matmul_queued(
        &mut self,
        dst: &Tile,
        stationary: &Tile,
        moving: &Tile,
        opts: &PeOptions,
    ) -> Result<()> {
        let opc = Opcode::NcMatmul;
        let st = self.pe_input("stationary", stationary)?;
        let mv = self.pe_input("moving", moving)?;
        let d = self.operand("dst", dst, Some(Engine::Tensor), true)?;
        if dst.space != Space::Psum {
            return Err(rule(
                "dst",
                "matmul_memory",
                "nc_matmul writes PSUM; dst is not in PSUM",
            ));
        }
        let sf = format_of("stationary", stationary)?;
        let mf = format_of("moving", moving)?;
        if opts.is_transpose {
            self.settle()?;
            return self.pe_transpose(opc, &d, &st, Some(&mv), opts.tile);
        }
        if dst.dtype != Dtype::Fp32 {
            return Err(dtype_rule(
                "dst",
                "matmul_dst_fp32",
                format!(
                    "nc_matmul writes fp32 PSUM on NeuronCore-v3; dst is {}",
                    dst.dtype
                ),
            ));
        }
        let shape_of = |t: &Tile| -> Vec<usize> {
            match opts.perf_mode {
                PerfMode::None => vec![t.partitions as usize, t.free_size()],
                PerfMode::DoubleRow => t.logical_shape(),
            }
        };
        let (ss, ms) = (shape_of(stationary), shape_of(moving));
        let shape = engine::validate_matmul(&ss, sf, &ms, mf, opts.perf_mode, opts.tile)?;
        if d.p() as usize != shape.m || d.n() != shape.n {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "stationary.T @ moving is [{}, {}]; dst is {:?}",
                    shape.m,
                    shape.n,
                    dst.logical_shape()
                ),
            ));
        }
        let all_mm = self.psum_mm_state(&d);
        let accumulate = match opts.accumulate {
            None => all_mm,
            Some(true) if !all_mm => {
                return Err(rule(
                    "accumulate",
                    "accumulate",
                    format!(
                        "accumulate=True onto PSUM of {} that no matmul wrote (or that another \
                         instruction overwrote); the first matmul of an accumulation group needs \
                         accumulate=False (undefined on the hardware)",
                        self.mem.name(dst)
                    ),
                ))
            }
            Some(a) => a,
        };
        // The arithmetic waits in the queue (see `QueuedMatmul`): the operands are read now,
        // PSUM when the queue is settled, in issue order.
        self.pe_queue.push(QueuedMatmul {
            dst: d,
            stationary: (self.gather_f32(stationary), ss, sf),
            moving: (self.gather_f32(moving), ms, mf),
            perf_mode: opts.perf_mode,
            tile: opts.tile,
            accumulate,
        });
        self.set_psum_mm(&d);
        let f = if sf == Format::Fp32 || mf == Format::Fp32 {
            flags::FP32
        } else {
            0
        };
        let cost = pe_cost(shape.partitions, shape.m, shape.n, opts.tile, f);
        self.record(
            opc,
            Queue::Engine(Engine::Tensor),
            &[st.region(), mv.region()],
            &[d.region()],
            cost,
        );
        Ok(())
    }

    /// Matmuls waiting in the queue (see [`Machine::nc_matmul_queued`]).
    pub fn queued_matmuls(&self) -> usize {
        self.pe_queue.len()
    }

    /// Computes every queued matmul (in parallel when there are several: each one's tile sums
    /// are independent of the others') and writes them to PSUM in issue order, so an
    /// accumulation group adds its tiles in order.
    pub fn settle(&mut self) -> Result<()> {
        if self.pe_queue.is_empty() {
            return Ok(());
        }
        let queue = std::mem::take(&mut self.pe_queue);
        let sums: Vec<Result<Vec<f32>>> = if queue.len() == 1 {
            queue.iter().map(QueuedMatmul::sums).collect()
        } else {
            queue.par_iter().map(QueuedMatmul::sums).collect()
        };
        for (q, s) in queue.iter().zip(sums) {
            self.apply_queued(q, &s?)?;
        }
        Ok(())
    }

    /// `nc_transpose`: `dst = data.T` (partition axis and flattened free axis swapped), bit for
    /// bit. Tensor engine: `data` in SBUF up to 128 x 128, `dst` in PSUM; Vector engine: up to
    /// 32 x 32, SBUF or PSUM.
    pub fn nc_transpose(&mut self, engine: Engine, dst: &Tile, data: &Tile) -> Result<()> {
        let opc = Opcode::NcTranspose;
        check_engine(opc, engine, &[Engine::Tensor, Engine::Vector])?;
        if engine == Engine::Tensor {
            let x = self.pe_input("data", data)?;
            let d = self.operand("dst", dst, Some(engine), true)?;
            if dst.space != Space::Psum {
                return Err(rule(
                    "dst",
                    "matmul_memory",
                    "the tensor engine writes PSUM; dst is not in PSUM",
                ));
            }
            return self.pe_transpose(opc, &d, &x, None, PeTile::FULL);
        }
        let x = self.operand("data", data, Some(engine), false)?;
        let d = self.operand("dst", dst, Some(engine), true)?;
        let lim = VECTOR_TRANSPOSE_MAX as u32;
        if x.p() > lim || x.n() > lim as usize {
            return Err(shape_rule(
                "data",
                "transpose_size",
                format!(
                    "{} x {}; the Vector engine transposes up to {lim} x {lim}",
                    x.p(),
                    x.n()
                ),
            ));
        }
        self.transpose_values(&d, &x)?;
        self.record_engine(opc, engine, &[&x], &[], &d, 0);
        Ok(())
    }

    /// Checks shapes and dtypes of a transpose and moves the bits.
    fn transpose_values(&mut self, d: &Opnd, x: &Opnd) -> Result<()> {
        if d.tile.dtype != x.tile.dtype {
            return Err(dtype_rule(
                "dst",
                "transpose_dtype",
                format!(
                    "a transpose keeps the dtype: data is {}, dst is {}",
                    x.tile.dtype, d.tile.dtype
                ),
            ));
        }
        let (k, m) = (x.p() as usize, x.n());
        if d.p() as usize != m || d.n() != k {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "the transpose of {k} x {m} is {m} x {k}; dst is {:?}",
                    d.tile.logical_shape()
                ),
            ));
        }
        let v = self.gather_bits(&x.tile);
        let mut t = vec![0u32; k * m];
        for i in 0..k {
            for j in 0..m {
                t[j * k + i] = v[i * m + j];
            }
        }
        self.scatter_bits(d, &t);
        Ok(())
    }

    /// The tensor engine's transpose (nc_transpose, or nc_matmul with is_transpose).
    fn pe_transpose(
        &mut self,
        opc: Opcode,
        d: &Opnd,
        x: &Opnd,
        identity: Option<&Opnd>,
        tile: PeTile,
    ) -> Result<()> {
        format_of("data", &x.tile)?;
        let lim = crate::spec::PE_ROWS as u32;
        if x.p() > lim || x.n() > lim as usize {
            return Err(shape_rule(
                "data",
                "transpose_size",
                format!(
                    "{} x {}; the tensor engine transposes up to {lim} x {lim}",
                    x.p(),
                    x.n()
                ),
            ));
        }
        let k = x.p() as usize;
        let mut reads = vec![x.region()];
        if let Some(id) = identity {
            let v = self.gather_f32(&id.tile);
            let is_identity = id.p() as usize == k
                && id.n() == k
                && v.iter()
                    .enumerate()
                    .all(|(i, &e)| e == if i / k == i % k { 1.0 } else { 0.0 });
            if !is_identity {
                return Err(Error::value(
                    "moving",
                    format!("transpose mode needs the {k} x {k} identity as moving"),
                ));
            }
            reads.push(id.region());
        }
        self.transpose_values(d, x)?;
        let mut f = flags::TRANSPOSE;
        if x.tile.dtype == Dtype::Fp32 {
            f |= flags::FP32;
        }
        // The transpose formula reads `m` as the input's partitions and `k` as its free size.
        let cost = pe_cost(x.p() as usize, x.p() as usize, x.n(), tile, f);
        self.record(
            opc,
            Queue::Engine(Engine::Tensor),
            &reads,
            &[d.region()],
            cost,
        );
        Ok(())
    }
}
