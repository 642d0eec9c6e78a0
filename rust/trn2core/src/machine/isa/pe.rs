//! The tensor engine's instructions on the machine's memories: `nc_matmul` (reusing
//! [`crate::engine`]'s per-instruction numerics: an FMA per PE step, each tile's sum from +0 in
//! ascending k, fp32 PSUM accumulation, double_row, PE tiling) and `nc_transpose` (tensor
//! engine: bit-exact on NeuronCore-v3; Vector engine: up to 32 x 32).
//!
//! PSUM accumulation groups: one bit per PSUM fp32 slot says "written by a matmul since any
//! other write". `accumulate=True` needs every slot of `dst` set (accumulating onto memory a
//! non-matmul instruction wrote is undefined on v2/v3, \[S2\]\[S9\]); `accumulate=None`
//! accumulates exactly when they all are (the compiler's "first write overwrites").

use crate::engine::{self, Operand, PeTile, PerfMode};
use crate::memory::Space;
use crate::numerics::Format;
use crate::spec::{PE_TILE_QUARTER, VECTOR_TRANSPOSE_MAX};
use crate::{Error, Result};

use super::super::dtype::Dtype;
use super::super::record::{flags, CostInput, Engine, Opcode, Queue};
use super::super::{Machine, PSUM_SLOTS};
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

    /// The bits of PSUM slots `dst` covers: `(all set, any unset)`.
    fn psum_mm_state(&self, d: &Opnd) -> bool {
        let (s0, s1) = ((d.range.0 / 4) as usize, d.range.1.div_ceil(4) as usize);
        (d.tile.start_partition as usize..(d.tile.start_partition + d.tile.partitions) as usize)
            .all(|p| {
                (s0..s1).all(|s| {
                    let bit = p * PSUM_SLOTS + s;
                    self.psum_mm[bit / 64] >> (bit % 64) & 1 == 1
                })
            })
    }

    fn set_psum_mm(&mut self, d: &Opnd) {
        let (s0, s1) = ((d.range.0 / 4) as usize, d.range.1.div_ceil(4) as usize);
        for p in
            d.tile.start_partition as usize..(d.tile.start_partition + d.tile.partitions) as usize
        {
            for s in s0..s1 {
                let bit = p * PSUM_SLOTS + s;
                self.psum_mm[bit / 64] |= 1 << (bit % 64);
            }
        }
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
        let (sv, mvv) = (self.gather_f32(stationary), self.gather_f32(moving));
        let mut acc = if accumulate {
            self.gather_f32(dst)
        } else {
            vec![0f32; shape.m * shape.n]
        };
        let so = Operand {
            values: &sv,
            shape: &ss,
            format: sf,
        };
        let mo = Operand {
            values: &mvv,
            shape: &ms,
            format: mf,
        };
        let r = engine::matmul_into_validated(&mut acc, shape.n, &so, &mo, shape, accumulate)
            .and_then(|()| self.scatter_f32(&d, &acc));
        r?;
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
