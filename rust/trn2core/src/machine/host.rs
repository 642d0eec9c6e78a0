//! Tensor-engine instructions issued from the host on operands the host holds (the facade's
//! `NeuronCore.matmul`, transposes and `read_psum`): the same machine, PSUM and clock as every
//! other instruction (there is one model of a NeuronCore).
//!
//! A host operand is written into a scratch SBUF tensor (as `write` does: outside any
//! instruction, no time), the instruction runs through [`Machine::nc_matmul`] into the PSUM
//! bank the caller names, and the scratch tensors are freed. The bank is addressed as the
//! hardware addresses it (partition, bank, element), through a view of the whole of PSUM that
//! the allocator does not count: a tile allocated over the same bytes sees the result.

use super::memory::Memories;
use super::{Dtype, Machine, PeOptions, Tile, MAX_FREE_DIMS};
use crate::engine::{self, PeTile, PerfMode};
use crate::memory::Space;
use crate::numerics::{CodesRef, Format};
use crate::spec::{PSUM_BANKS, PSUM_BANK_BYTES, PSUM_PARTITIONS};
use crate::{Error, Result};

/// An operand the host holds: codes of `format` (flat, C order) of the array `shape`.
#[derive(Debug, Clone, Copy)]
pub struct HostOperand<'a> {
    /// The codes: u8 for fp8, u16 for bf16/fp16, u32 for the float32 containers of fp32/tf32.
    pub codes: CodesRef<'a>,
    /// The array's shape (`[K, M]`, or `[K, 2, M]` in double-row mode).
    pub shape: &'a [usize],
    /// Its number format.
    pub format: Format,
}

impl HostOperand<'_> {
    /// The codes as little-endian bytes (what the machine's memories hold).
    fn bytes(&self, arg: &str) -> Result<Vec<u8>> {
        let n = self.shape.iter().try_fold(1usize, |a, &s| a.checked_mul(s));
        let len = match self.codes {
            CodesRef::U8(c) => c.len(),
            CodesRef::U16(c) => c.len(),
            CodesRef::U32(c) => c.len(),
        };
        if n != Some(len) {
            return Err(Error::shape(
                arg,
                format!("{len} codes for an array of shape {:?}", self.shape),
            ));
        }
        let width = self.format.code_bits().div_ceil(8) as usize;
        let fits = matches!(
            (self.codes, width),
            (CodesRef::U8(_), 1) | (CodesRef::U16(_), 2) | (CodesRef::U32(_), 4)
        );
        if !fits {
            return Err(Error::format(
                arg,
                format!("codes of the wrong width for {}", self.format),
            ));
        }
        Ok(match self.codes {
            CodesRef::U8(c) => c.to_vec(),
            CodesRef::U16(c) => c.iter().flat_map(|v| v.to_le_bytes()).collect(),
            CodesRef::U32(c) => c.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
    }
}

/// Checks a PSUM bank number.
pub fn check_bank(bank: usize) -> Result<()> {
    if bank >= PSUM_BANKS {
        return Err(Error::value("bank", format!("got {bank}; PSUM has banks 0..{PSUM_BANKS}")));
    }
    Ok(())
}

impl Memories {
    /// The view of the whole of PSUM that host-issued instructions address by bank: a tensor
    /// the allocator does not count (made on first use).
    fn psum_bank_view(&mut self) -> Result<super::TensorId> {
        if let Some(id) = self.psum_view {
            if self.tensor(id).is_ok() {
                return Ok(id);
            }
        }
        let id = self.view_tensor(Space::Psum, "psum")?;
        self.psum_view = Some(id);
        Ok(id)
    }
}

impl Machine {
    /// The PSUM region `[rows, cols]` of `dtype` at the start of `bank`, from partition `p0`.
    fn bank_tile(
        &mut self, bank: usize, p0: usize, rows: usize, cols: usize, dtype: Dtype,
    ) -> Result<Tile> {
        check_bank(bank)?;
        if rows == 0 || p0 + rows > PSUM_PARTITIONS {
            return Err(Error::shape(
                "rows",
                format!("partitions {p0}..{} of PSUM's {PSUM_PARTITIONS}", p0 + rows),
            ));
        }
        let per_bank = PSUM_BANK_BYTES as usize / dtype.size();
        if cols == 0 || cols > per_bank {
            return Err(Error::shape(
                "cols",
                format!(
                    "got {cols}; a PSUM bank holds 1..={per_bank} {dtype} elements per partition"
                ),
            ));
        }
        let id = self.mem.psum_bank_view()?;
        let mut shape = [1u32; MAX_FREE_DIMS];
        let mut strides = [0i64; MAX_FREE_DIMS];
        shape[0] = cols as u32;
        strides[0] = 1;
        Ok(Tile {
            tensor: id,
            space: Space::Psum,
            dtype,
            start_partition: p0 as u32,
            partitions: rows as u32,
            partition_step: 0,
            offset: (bank as u64 * PSUM_BANK_BYTES) as i64,
            ndim: 1,
            shape,
            strides,
        })
    }

    /// A scratch SBUF tensor holding a host operand.
    fn scratch(&mut self, arg: &str, op: &HostOperand) -> Result<Tile> {
        let dtype = Dtype::of_format(arg, op.format)?;
        let bytes = op.bytes(arg)?;
        let t = self.alloc(Space::Sbuf, arg, op.shape, dtype)?;
        if let Err(e) = self.write_tile(&t, &bytes) {
            let _ = self.free(&t);
            return Err(e);
        }
        Ok(t)
    }

    /// Runs `f` on scratch SBUF copies of `operands`, freeing them whatever `f` returns.
    fn with_scratch<T>(
        &mut self, operands: &[(&str, &HostOperand)],
        f: impl FnOnce(&mut Machine, &[Tile]) -> Result<T>,
    ) -> Result<T> {
        let mut tiles = Vec::with_capacity(operands.len());
        let mut result = Ok(());
        for (arg, op) in operands {
            match self.scratch(arg, op) {
                Ok(t) => tiles.push(t),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let out = result.and_then(|()| f(self, &tiles));
        for t in &tiles {
            let freed = self.free(t);
            if out.is_ok() {
                freed?;
            }
        }
        out
    }

    /// One `nc_matmul` on host operands into PSUM `bank` (at the output partitions of the PE
    /// tile's columns), written, or with `accumulate` added onto what matmuls wrote there;
    /// returns the region's new contents `[M, N]`, flat. Costed on the machine's clock.
    pub fn matmul_host(
        &mut self, stationary: &HostOperand, moving: &HostOperand, bank: usize, accumulate: bool,
        perf_mode: PerfMode, tile: PeTile,
    ) -> Result<Vec<f32>> {
        check_bank(bank)?;
        let (s, m) = (stationary, moving);
        let shape = engine::validate_matmul(s.shape, s.format, m.shape, m.format, perf_mode, tile)?;
        let p0 = tile.position.1;
        if p0 + shape.m > PSUM_PARTITIONS {
            return Err(Error::shape(
                "tile_position",
                format!("output partitions {p0}..{} exceed PSUM's {PSUM_PARTITIONS}", p0 + shape.m),
            ));
        }
        let dst = self.bank_tile(bank, p0, shape.m, shape.n, Dtype::Fp32)?;
        let opts = PeOptions { accumulate: Some(accumulate), perf_mode, tile, is_transpose: false };
        self.with_scratch(&[("stationary", stationary), ("moving", moving)], |m, t| {
            m.nc_matmul(&dst, &t[0], &t[1], &opts)
        })?;
        self.read_f32(&dst)
    }

    /// Transpose mode on a host operand `[K, M]`: PSUM `bank` receives its transpose `[M, K]`
    /// bit for bit, in the operand's own dtype (the PE array writes 16-bit PSUM elements for
    /// 16-bit inputs). `identity` is the `[K, K]` identity the instruction takes as moving.
    pub fn transpose_host(
        &mut self, stationary: &HostOperand, identity: &HostOperand, bank: usize,
    ) -> Result<()> {
        check_bank(bank)?;
        if stationary.shape.len() != 2 {
            return Err(Error::shape(
                "stationary",
                format!("transpose mode takes a [K, M] tile, got {:?}", stationary.shape),
            ));
        }
        let (k, m) = (stationary.shape[0], stationary.shape[1]);
        let dtype = Dtype::of_format("stationary", stationary.format)?;
        if k == 0 || k > PSUM_PARTITIONS || m == 0 || m > PSUM_PARTITIONS {
            return Err(Error::shape(
                "stationary",
                format!("transpose mode takes [K, M] with 1 <= K, M <= 128, got [{k}, {m}]"),
            ));
        }
        let dst = self.bank_tile(bank, 0, m, k, dtype)?;
        let opts = PeOptions { is_transpose: true, ..PeOptions::default() };
        self.with_scratch(&[("stationary", stationary), ("moving", identity)], |mc, t| {
            mc.nc_matmul(&dst, &t[0], &t[1], &opts)
        })
    }

    /// PSUM `bank`, partitions `0..rows`, elements `0..cols` of `dtype` (fp32 for matmul
    /// results), as packed little-endian bytes.
    pub fn read_psum(
        &mut self, bank: usize, rows: usize, cols: usize, dtype: Dtype,
    ) -> Result<Vec<u8>> {
        let t = self.bank_tile(bank, 0, rows, cols, dtype)?;
        self.settle()?;
        self.read_tile(&t)
    }
}
