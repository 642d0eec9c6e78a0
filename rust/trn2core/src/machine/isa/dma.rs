//! `dma_copy`: moves a tile between HBM and SBUF (either way, or within one) on one of the
//! core's 16 DMA queues. Elements are copied in the logical order of both tiles (their counts
//! must match); equal dtypes copy bits, different ones convert through float32
//! ("DMA casts via FP32", \[S9\]). PSUM is not a DMA endpoint (NKI 0.3: "dma_copy cannot
//! read PSUM"; the docs list HBM and SBUF).

use crate::memory::Space;
use crate::spec::DMA_QUEUES_PER_ENGINE;
use crate::{Error, Result};

use super::super::record::{flags, CostInput, Opcode, Queue};
use super::super::Machine;
use super::{rule, shape_rule};
use crate::machine::tile::Tile;

impl Machine {
    /// `dma_copy` on DMA queue `queue` (`None`: the queues in turn).
    pub fn dma_copy(&mut self, dst: &Tile, src: &Tile, queue: Option<u8>) -> Result<()> {
        let opc = Opcode::DmaCopy;
        let q = match queue {
            Some(q) if q as usize >= DMA_QUEUES_PER_ENGINE => {
                return Err(Error::value(
                    "queue",
                    format!("got {q}; the DMA queues are 0..{DMA_QUEUES_PER_ENGINE}"),
                ))
            }
            Some(q) => q,
            None => {
                let q = self.next_dma_queue;
                self.next_dma_queue = ((q as usize + 1) % DMA_QUEUES_PER_ENGINE) as u8;
                q
            }
        };
        for (arg, t) in [("src", src), ("dst", dst)] {
            if t.space == Space::Psum {
                return Err(rule(
                    arg,
                    "dma_memory",
                    "dma_copy moves between HBM and SBUF; PSUM is read and written by the \
                     engines (tensor_copy it to SBUF first)",
                ));
            }
        }
        let s = self.operand("src", src, None, false)?;
        let d = self.operand("dst", dst, None, true)?;
        if s.tile.elements() != d.tile.elements() {
            return Err(shape_rule(
                "dst",
                "shape",
                format!(
                    "dma_copy needs the same number of elements: src {:?} has {}, dst {:?} has {}",
                    src.logical_shape(),
                    s.tile.elements(),
                    dst.logical_shape(),
                    d.tile.elements()
                ),
            ));
        }
        self.copy_values(&s, &d)?;
        let bytes =
            (s.tile.elements() * src.dtype.size()).max(d.tile.elements() * dst.dtype.size());
        let (start_partition, partitions) = [dst, src]
            .iter()
            .find(|t| t.space == Space::Sbuf)
            .map_or((0, crate::spec::SBUF_PARTITIONS as u32), |t| {
                (t.start_partition, t.partitions)
            });
        let mut f = 0;
        if src.space == Space::Hbm {
            f |= flags::DMA_FROM_HBM;
        }
        if dst.space == Space::Hbm {
            f |= flags::DMA_TO_HBM;
        }
        let cost = CostInput {
            n: 0,
            partitions: partitions as u16,
            start_partition: start_partition as u16,
            flags: f,
            bytes: bytes as u64,
            ..CostInput::default()
        };
        self.program
            .push(opc, Queue::Dma(q), &[s.region()], &[d.region()], cost);
        Ok(())
    }

    /// Writes host data (packed little-endian elements of the tile's dtype, logical order)
    /// into a tile without an instruction: how inputs reach the machine outside a kernel.
    pub fn write_tile(&mut self, tile: &Tile, data: &[u8]) -> Result<()> {
        let o = self.operand("tile", tile, None, true)?;
        let want = tile.elements() * tile.dtype.size();
        if data.len() != want {
            return Err(Error::shape(
                "data",
                format!("{} bytes for a tile of {} bytes", data.len(), want),
            ));
        }
        self.scatter_raw(&o, data)
    }

    /// Reads a tile's elements as packed little-endian bytes of its dtype, in logical order
    /// (no instruction; never-written memory is an error as for an engine).
    pub fn read_tile(&self, tile: &Tile) -> Result<Vec<u8>> {
        self.operand("tile", tile, None, false)?;
        self.gather_packed(tile)
    }

    /// A tile's elements widened to float32, in logical order.
    pub fn read_f32(&self, tile: &Tile) -> Result<Vec<f32>> {
        self.operand("tile", tile, None, false)?;
        self.gather_f32(tile)
    }
}
