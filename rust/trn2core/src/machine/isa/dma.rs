//! `dma_copy`: moves a tile between HBM and SBUF (either way, or within one) on one of the
//! core's 16 DMA queues. Elements are copied in the logical order of both tiles (their counts
//! must match); equal dtypes copy bits, different ones convert through float32
//! ("DMA casts via FP32", \[S9\]). PSUM is not a DMA endpoint (NKI 0.3: "dma_copy cannot
//! read PSUM"; the docs list HBM and SBUF).
//!
//! `dma_transpose`: the same move with the source's axes permuted, HBM or SBUF to SBUF (the
//! NKI ISA reference: "dst ... must be a tile in SBUF", "src ... must be a tile in HBM or
//! SBUF", `src.dtype == dst.dtype`, the permutations `[1, 0]`, `[2, 1, 0]`, `[3, 1, 2, 0]` of
//! 2-, 3- and 4-axis sources; the Trn2 architecture guide: "bit-accurate transposition for both
//! 2-byte and 4-byte data types"; the migration guide: `dst.shape` must be the transposed
//! `src.shape` exactly, rank included). Bits move unchanged.

use crate::memory::Space;
use crate::spec::{DMA_COMPUTE_MAX_SOURCES, DMA_QUEUES_PER_ENGINE};
use crate::{Error, Result};

use super::super::record::{flags, CostInput, Engine, Opcode, Queue};
use super::super::Machine;
use super::{check_engine, dtype_rule, keeps_dtype, rule, shape_rule, Opnd};
use crate::machine::tile::Tile;

impl Machine {
    /// `core_barrier` on `engine`: an instruction of the engine's minimum time that reads and
    /// writes the HBM tensor `data` (so it waits for this core's earlier accesses of `data`,
    /// and later ones wait for it). Its meeting with the other core is the front end's: it
    /// holds the instruction to the later core's time ([`super::super::Program::hold_last`]).
    /// `data` in PSUM is refused (rule `core_barrier_data`); the NKI ISA reference asks for
    /// shared HBM, but nki-library's hybrid `moe_cte` (a Trainium2 kernel) barriers on an SBUF
    /// counter, so SBUF is accepted too (docs/nki.md, "Inferred, not documented").
    pub fn core_barrier(&mut self, engine: Engine, data: &Tile) -> Result<()> {
        let opc = Opcode::CoreBarrier;
        check_engine(opc, engine)?;
        if data.space == Space::Psum {
            return Err(rule(
                "data",
                "core_barrier_data",
                "core_barrier synchronises on a tensor in HBM (shared HBM, the NKI ISA \
                 reference) or SBUF (nki-library's kernels), not PSUM",
            ));
        }
        // No value is read (bytes never written are fine: the other core may write them).
        let d = self.operand("data", data, None, true)?;
        let cost = Self::cost_input(0, 1, 0);
        self.program.push(opc, Queue::Engine(engine), &[d.region()], &[d.region()], cost);
        Ok(())
    }

    /// `dma_copy` on DMA queue `queue` (`None`: the queues in turn).
    pub fn dma_copy(&mut self, dst: &Tile, src: &Tile, queue: Option<u8>) -> Result<()> {
        let opc = Opcode::DmaCopy;
        let q = self.dma_queue(queue)?;
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
        same_count("dst", "dma_copy needs the same number of elements: src", &s, &d)?;
        self.copy_values(&s, &d)?;
        let bytes =
            (s.tile.elements() * src.dtype.size()).max(d.tile.elements() * dst.dtype.size());
        let cost = dma_cost(dst, std::slice::from_ref(src), bytes);
        self.program.push(opc, Queue::Dma(q), &[s.region()], &[d.region()], cost);
        if dst.space == Space::Sbuf {
            // A whole SBUF tensor loaded unconverted from HBM no one has written: a copy of
            // that region (`CopyOf`), reloaded from it instead of stored if it must make room.
            let whole = self.mem.tensor(dst.tensor).is_ok_and(|t| t.full_tile(dst.tensor) == *dst);
            let copy = src.space == Space::Hbm
                && src.dtype == dst.dtype
                && whole
                && self.mem.tensor(src.tensor).is_ok_and(|t| !t.stored);
            self.mem.set_copy_of(dst.tensor, copy.then_some(*src));
        }
        Ok(())
    }

    /// `dma_compute` on DMA queue `queue` (`None`: the queues in turn): `dst = srcs[0] +
    /// srcs[1] + ...`, each source widened to float32 and added in order in float32, the sum
    /// rounded once to `dst`'s dtype (the NKI ISA reference: "The DMA engines perform all
    /// computations in float32 precision internally ... the final float32 result is cast to the
    /// output data type"; `reduce_op` add and unit scales only, which the front end checks).
    /// HBM and SBUF, 1 to 16 sources of `dst`'s element count, in logical order; every source
    /// is read before `dst` is written, so `dst` may be one of them.
    pub fn dma_compute(&mut self, dst: &Tile, srcs: &[Tile], queue: Option<u8>) -> Result<()> {
        let opc = Opcode::DmaCompute;
        if srcs.is_empty() || srcs.len() > DMA_COMPUTE_MAX_SOURCES {
            return Err(Error::value(
                "srcs",
                format!(
                    "dma_compute takes 1 to {DMA_COMPUTE_MAX_SOURCES} source tiles, got {}",
                    srcs.len()
                ),
            ));
        }
        let q = self.dma_queue(queue)?;
        for (arg, t) in srcs.iter().map(|t| ("srcs", t)).chain([("dst", dst)]) {
            if t.space == Space::Psum {
                return Err(rule(
                    arg,
                    "dma_memory",
                    "dma_compute reads and writes HBM and SBUF; PSUM is read and written by the \
                     engines (tensor_copy it to SBUF first)",
                ));
            }
        }
        let d = self.operand("dst", dst, None, true)?;
        let mut reads = Vec::with_capacity(srcs.len());
        let mut sum: Vec<f32> = Vec::new();
        let mut bytes = 0usize;
        for (i, src) in srcs.iter().enumerate() {
            let s = self.operand("srcs", src, None, false)?;
            let what =
                format!("dma_compute needs every source to have dst's element count: srcs[{i}]");
            same_count("srcs", &what, &s, &d)?;
            let x = self.gather_f32(&s.tile)?;
            if i == 0 {
                sum = x;
            } else {
                crate::cancel::check()?;
                sum.iter_mut().zip(&x).for_each(|(a, b)| *a += *b);
            }
            bytes = bytes.saturating_add(s.tile.elements() * src.dtype.size());
            reads.push(s.region());
        }
        for piece in sum.chunks_mut(1 << 20) {
            crate::cancel::check()?;
            piece.iter_mut().for_each(|v| *v = super::alu::canon(*v));
        }
        self.scatter_f32(&d, &sum)?;
        let bytes = bytes.max(d.tile.elements() * dst.dtype.size());
        let cost = dma_cost(dst, srcs, bytes);
        self.program.push(opc, Queue::Dma(q), &reads, &[d.region()], cost);
        Ok(())
    }

    /// What the compiler issues to spill a block: the whole SBUF tensor `src` to the HBM tensor
    /// `dst` of its size, or (reload) the HBM tensor `src` to the whole SBUF tensor `dst`, on
    /// DMA queue `queue` (`None`: the queues in turn). Bytes, and which of them were written,
    /// move as they are (a partly written block spills); timed as a `dma_copy` of those bytes
    /// and counted in the report's spill figures (`flags::SPILL`).
    pub fn dma_spill(&mut self, dst: &Tile, src: &Tile, queue: Option<u8>) -> Result<()> {
        self.dma_spill_copying(dst, src, queue, true)
    }

    /// [`Machine::dma_spill`]; `copy: false` when `dst` already holds `src`'s bytes (what
    /// [`Machine::spill_move`] just moved): the same instruction and state, no byte copied.
    fn dma_spill_copying(
        &mut self, dst: &Tile, src: &Tile, queue: Option<u8>, copy: bool,
    ) -> Result<()> {
        let q = self.dma_queue(queue)?;
        let s = self.operand("src", src, None, true)?;
        let d = self.operand("dst", dst, None, true)?;
        let to_hbm = dst.space == Space::Hbm;
        let (chip, hbm) = if to_hbm { (src, dst) } else { (dst, src) };
        let bytes = self.mem.spill_bytes(chip.tensor, hbm.tensor, to_hbm, copy)?;
        let info = self.mem.tensor(chip.tensor)?;
        let cost = CostInput {
            partitions: info.partitions as u16,
            start_partition: info.start_partition as u16,
            flags: flags::SPILL | if to_hbm { flags::DMA_TO_HBM } else { flags::DMA_FROM_HBM },
            bytes,
            ..CostInput::default()
        };
        self.program.push(Opcode::DmaCopy, Queue::Dma(q), &[s.region()], &[d.region()], cost);
        Ok(())
    }

    /// The bytes (and which of them were written) that [`Machine::dma_spill`] moves, moved
    /// outside any instruction: a front end keeps the bits of a tensor whose storage it gives
    /// up, and records the spill's DMAs only if the tensor is used again (NKI's current
    /// dialect: the compiler stores only live tensors, and a running trace learns that a
    /// tensor was live at its next use).
    pub fn spill_move(&mut self, dst: &Tile, src: &Tile) -> Result<()> {
        self.operand("src", src, None, true)?;
        self.operand("dst", dst, None, true)?;
        let to_hbm = dst.space == Space::Hbm;
        let (chip, hbm) = if to_hbm { (src, dst) } else { (dst, src) };
        self.mem.spill_bytes(chip.tensor, hbm.tensor, to_hbm, true)?;
        if to_hbm {
            // The slot holds what the tensor held: a copy of an HBM region if it was one.
            let copy = self.mem.intact_copy(chip.tensor).map(|c| c.src);
            self.mem.set_copy_of(hbm.tensor, copy);
        }
        Ok(())
    }

    /// The reload of a tensor whose store was not recorded when it gave its storage up
    /// ([`Machine::spill_move`]): the HBM spill slot `slot`'s bytes moved into the whole SBUF
    /// tensor `tile`, then the store's `dma_spill` (`tile` to `slot`) and the load's (`slot`
    /// to `tile`) recorded, on `queue` (`None`: the queues in turn). The same as those three
    /// calls, with the bytes copied once.
    ///
    /// A tensor that was a copy of an HBM region no one has written since ([`CopyOf`]: one
    /// `dma_copy` loaded it whole, nothing wrote it after) is not stored: the reload is one DMA
    /// from that region, priced as the load was, and counted as a reload (the compiler loads
    /// such data again instead of spilling it; NKI's profile counts weights "loaded multiple
    /// times" apart from spilled intermediates). The bytes come from the slot either way (the
    /// same bytes, since the region is unchanged).
    pub fn spill_reload(&mut self, tile: &Tile, slot: &Tile, queue: Option<u8>) -> Result<()> {
        let copy = self.mem.intact_copy(slot.tensor);
        self.spill_move(tile, slot)?;
        let Some(copy) = copy else {
            self.dma_spill_copying(slot, tile, queue, false)?;
            return self.dma_spill_copying(tile, slot, queue, false);
        };
        let q = self.dma_queue(queue)?;
        let s = self.operand("src", &copy.src, None, false)?;
        let d = self.operand("dst", tile, None, true)?;
        let bytes = tile.elements() * tile.dtype.size();
        let mut cost = dma_cost(tile, std::slice::from_ref(&copy.src), bytes);
        cost.flags |= flags::SPILL;
        self.program.push(Opcode::DmaCopy, Queue::Dma(q), &[s.region()], &[d.region()], cost);
        self.mem.set_copy_of(tile.tensor, Some(copy.src));
        Ok(())
    }

    /// The next DMA queue: `queue`, checked, or (`None`) the queues in turn.
    fn dma_queue(&mut self, queue: Option<u8>) -> Result<u8> {
        Ok(match queue {
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
        })
    }

    /// `dma_transpose` on DMA queue `queue` (`None`: the queues in turn): `dst` (SBUF) receives
    /// `src` (HBM or SBUF, 2 to 4 logical axes) with its axes permuted by NKI's rule
    /// ([`transpose_axes`]; `axes`, when given, must be that permutation). `hwdge`: the
    /// hardware-DGE form, with its extra limits (2-byte dtypes; `src.shape[0]` 16 in 2-D, or
    /// 1, 2, 4, 8 or 16 with `src.shape[0] * src.shape[-2]` a multiple of 16 in 3-D and 4-D;
    /// `src.shape[-1] <= 128`). An SBUF source overlapping `dst` is refused: the DMA engines
    /// move the elements in pieces, in no documented order.
    pub fn dma_transpose(
        &mut self, dst: &Tile, src: &Tile, axes: Option<&[i64]>, hwdge: bool, queue: Option<u8>,
    ) -> Result<()> {
        let opc = Opcode::DmaTranspose;
        let q = self.dma_queue(queue)?;
        if dst.space != Space::Sbuf {
            return Err(rule(
                "dst",
                "dma_transpose_memory",
                format!("dma_transpose writes SBUF; dst is in {}", dst.space.name()),
            ));
        }
        if src.space == Space::Psum {
            return Err(rule(
                "src",
                "dma_transpose_memory",
                "dma_transpose reads HBM or SBUF; src is in PSUM (tensor_copy it to SBUF first)",
            ));
        }
        let shape = src.logical_shape();
        let perm = transpose_axes(shape.len()).ok_or_else(|| {
            shape_rule(
                "src",
                "dma_transpose_shape",
                format!(
                    "dma_transpose permutes a source of 2, 3 or 4 axes; src has shape {shape:?}"
                ),
            )
        })?;
        if let Some(axes) = axes {
            if axes.len() != perm.len() || axes.iter().zip(perm).any(|(&a, &p)| a != p as i64) {
                return Err(rule(
                    "axes",
                    "dma_transpose_axes",
                    format!(
                        "got {axes:?}; a source of {} axes is transposed by {perm:?} (the only \
                         permutations dma_transpose has: [1, 0], [2, 1, 0], [3, 1, 2, 0])",
                        perm.len()
                    ),
                ));
            }
        }
        keeps_dtype(
            "dma_transpose_dtype",
            dst,
            ("src", src),
            "dma_transpose moves bits (src.dtype == dst.dtype)",
        )?;
        let esize = src.dtype.size();
        let widths: &[usize] = if hwdge { &[2] } else { &[2, 4] };
        if !widths.contains(&esize) {
            return Err(dtype_rule(
                "src",
                "dma_transpose_dtype",
                format!(
                    "src is {} ({esize}-byte elements); DMA transpose{} moves {} elements",
                    src.dtype,
                    if hwdge { " by the hardware DGE" } else { "" },
                    if hwdge { "2-byte" } else { "2- and 4-byte" }
                ),
            ));
        }
        if hwdge {
            check_hwdge_shape(&shape)?;
        }
        let want: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
        if dst.logical_shape() != want {
            return Err(shape_rule(
                "dst",
                "dma_transpose_shape",
                format!(
                    "dst has shape {:?}; the transpose of src {shape:?} by {perm:?} is {want:?}",
                    dst.logical_shape()
                ),
            ));
        }
        let s = self.operand("src", src, None, false)?;
        let d = self.operand("dst", dst, None, true)?;
        let (rs, rd) = (s.region(), d.region());
        if rs.mem == rd.mem
            && rs.p0 < rd.p0 + rd.pn
            && rd.p0 < rs.p0 + rs.pn
            && rs.lo < rd.hi
            && rd.lo < rs.hi
        {
            return Err(rule(
                "dst",
                "dma_transpose_overlap",
                "dst overlaps src; a DMA transpose moves its elements in pieces in no \
                 documented order, so in place it has no defined result (transpose into \
                 another tile)",
            ));
        }
        let x = self.gather_packed(&s.tile)?;
        let y = permute_packed(&x, &shape, perm, esize)?;
        self.scatter_raw(&d, &y)?;
        let bytes = x.len();
        let mut f = flags::DMA_TRANSPOSE;
        if src.space == Space::Hbm {
            f |= flags::DMA_FROM_HBM;
        }
        let cost = CostInput {
            n: 0,
            partitions: dst.partitions as u16,
            start_partition: dst.start_partition as u16,
            flags: f,
            bytes: bytes as u64,
            ..CostInput::default()
        };
        self.program.push(opc, Queue::Dma(q), &[rs], &[rd], cost);
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
        self.scatter_raw(&o, data)?;
        // Outside any instruction: no instruction is its writer.
        self.mem.mark_writer(&o.tile, o.range, crate::machine::memory::NO_WRITER);
        Ok(())
    }

    /// [`Machine::read_tile`] of a whole HBM tensor without a copy: its buffer handed over (the
    /// host's bytes, little-endian on every host this runs on) and the tensor freed, for a front
    /// end's last read of an output. The buffer's words and the tensor's bytes' range in them;
    /// `None`, nothing done, when `tile` is not a whole HBM tensor. Never-written bytes are an
    /// error as for `read_tile`.
    pub fn take_hbm(&mut self, tile: &Tile) -> Result<Option<(Vec<u32>, std::ops::Range<usize>)>> {
        self.operand("tile", tile, None, false)?;
        let whole = tile.space == Space::Hbm
            && cfg!(target_endian = "little")
            && *tile == self.mem.tensor(tile.tensor)?.full_tile(tile.tensor);
        if !whole {
            return Ok(None);
        }
        self.mem.take_hbm(tile.tensor).map(Some)
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

/// The shape rule of a DMA: `s` (argument `arg`, introduced by `what`) has `d`'s element count.
fn same_count(arg: &str, what: &str, s: &Opnd, d: &Opnd) -> Result<()> {
    if s.tile.elements() == d.tile.elements() {
        return Ok(());
    }
    Err(shape_rule(
        arg,
        "shape",
        format!(
            "{what} {:?} has {}, dst {:?} has {}",
            s.tile.logical_shape(),
            s.tile.elements(),
            d.tile.logical_shape(),
            d.tile.elements()
        ),
    ))
}

/// A DMA's cost input: `bytes` moved, the partitions of its SBUF side (`dst`'s, else the first
/// SBUF source's; all 128 between HBM tensors), and whether it reads or writes HBM.
fn dma_cost(dst: &Tile, srcs: &[Tile], bytes: usize) -> CostInput {
    let (start_partition, partitions) = std::iter::once(dst)
        .chain(srcs)
        .find(|t| t.space == Space::Sbuf)
        .map_or((0, crate::spec::SBUF_PARTITIONS as u32), |t| (t.start_partition, t.partitions));
    let mut f = 0;
    if srcs.iter().any(|t| t.space == Space::Hbm) {
        f |= flags::DMA_FROM_HBM;
    }
    if dst.space == Space::Hbm {
        f |= flags::DMA_TO_HBM;
    }
    CostInput {
        n: 0,
        partitions: partitions as u16,
        start_partition: start_partition as u16,
        flags: f,
        bytes: bytes as u64,
        ..CostInput::default()
    }
}

/// NKI's permutation of a `rank`-axis source (`dst` axis `i` is `src` axis `perm[i]`), `None`
/// for other ranks.
pub(crate) fn transpose_axes(rank: usize) -> Option<&'static [usize]> {
    match rank {
        2 => Some(&[1, 0]),
        3 => Some(&[2, 1, 0]),
        4 => Some(&[3, 1, 2, 0]),
        _ => None,
    }
}

/// The hardware DGE's limits on a transposed source's shape (the NKI ISA reference's "DMA
/// Direct Transpose Constraints").
fn check_hwdge_shape(shape: &[usize]) -> Result<()> {
    let (first, last) = (shape[0], shape[shape.len() - 1]);
    let ok_first = if shape.len() == 2 {
        first == 16
    } else {
        [1, 2, 4, 8, 16].contains(&first) && (first * shape[shape.len() - 2]).is_multiple_of(16)
    };
    if !ok_first || last > 128 {
        return Err(shape_rule(
            "src",
            "dma_transpose_hwdge",
            format!(
                "src has shape {shape:?}; a hardware-DGE transpose needs src.shape[0] == 16 \
                 (2-D) or in {{1, 2, 4, 8, 16}} with src.shape[0] * src.shape[-2] a multiple of \
                 16 (3-D, 4-D), and src.shape[-1] <= 128"
            ),
        ));
    }
    Ok(())
}

/// `x` (packed elements of `esize` bytes of a C-order array of `shape`) with its axes
/// permuted: element `[i_0, .., i_k]` of the result is `x[i_perm^-1 ...]`, i.e. result axis `a`
/// runs over source axis `perm[a]`.
fn permute_packed(x: &[u8], shape: &[usize], perm: &[usize], esize: usize) -> Result<Vec<u8>> {
    let rank = shape.len();
    let mut stride = vec![1usize; rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        stride[a] = stride[a + 1] * shape[a + 1];
    }
    // The source stride and extent of each result axis, innermost last.
    let dims: Vec<(usize, usize)> = perm.iter().map(|&a| (shape[a], stride[a])).collect();
    let mut out = crate::host::zeroed_vec("dst", "the transposed elements", x.len())?;
    let (inner_n, inner_s) = dims[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    let (mut k, mut since_check) = (0, 0);
    'rows: loop {
        // Ctrl-C between pieces of about 1 Mi elements, as the machine's other long copies.
        since_check += inner_n;
        if since_check >= 1 << 20 {
            crate::cancel::check()?;
            since_check = 0;
        }
        let base: usize = idx.iter().zip(&dims).map(|(&i, &(_, s))| i * s).sum();
        for j in 0..inner_n {
            let at = (base + j * inner_s) * esize;
            out[k * esize..(k + 1) * esize].copy_from_slice(&x[at..at + esize]);
            k += 1;
        }
        for a in (0..rank - 1).rev() {
            idx[a] += 1;
            if idx[a] < dims[a].0 {
                continue 'rows;
            }
            idx[a] = 0;
        }
        break;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::cost::cost;
    use crate::machine::dtype::Dtype;
    use crate::machine::record::Instr;
    use crate::machine::MachineConfig;

    use crate::machine::isa::test_util::put_words as put;

    fn words(m: &Machine, t: &Tile, esize: usize) -> Vec<u32> {
        let b = m.read_tile(t).expect("read");
        b.chunks_exact(esize)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..esize].copy_from_slice(c);
                u32::from_le_bytes(w)
            })
            .collect()
    }

    /// Element codes with the awkward ones: a NaN with a payload, -0, infinity.
    fn codes(n: usize, esize: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|e| match (e % 7, esize) {
                (3, 2) => 0x7fc1,
                (3, _) => 0x7fc0_0001,
                (5, 2) => 0x8000,
                (5, _) => 0x8000_0000,
                (6, 2) => 0x7f80,
                _ => 0x3f80 + e,
            })
            .collect()
    }

    /// Each rank's documented permutation, checked against an oracle that indexes the source
    /// by NKI's rule (2-D `dst[j, i] = src[i, j]`, 3-D `dst[k, j, i] = src[i, j, k]`, 4-D
    /// `dst[l, j, k, i] = src[i, j, k, l]`), bit for bit, SBUF and HBM sources, bf16 and fp32.
    #[test]
    fn dma_transpose_against_an_indexing_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        // 2-D fp32 SBUF -> SBUF.
        let (a, b) = (5usize, 7usize);
        let src = m.alloc(Space::Sbuf, "s2", &[a, b], Dtype::Fp32).expect("s");
        let dst = m.alloc(Space::Sbuf, "d2", &[b, a], Dtype::Fp32).expect("d");
        let x = codes(a * b, 4);
        put(&mut m, &src, &x, 4);
        m.dma_transpose(&dst, &src, Some(&[1, 0]), false, None).expect("2-D");
        let y = words(&m, &dst, 4);
        for i in 0..a {
            for j in 0..b {
                assert_eq!(y[j * a + i], x[i * b + j], "({i}, {j})");
            }
        }
        // 3-D bf16 SBUF -> SBUF.
        let (a, b, c) = (3usize, 2usize, 4usize);
        let src = m.alloc(Space::Sbuf, "s3", &[a, b, c], Dtype::Bf16).expect("s");
        let dst = m.alloc(Space::Sbuf, "d3", &[c, b, a], Dtype::Bf16).expect("d");
        let x = codes(a * b * c, 2);
        put(&mut m, &src, &x, 2);
        m.dma_transpose(&dst, &src, None, false, Some(3)).expect("3-D");
        let y = words(&m, &dst, 2);
        for i in 0..a {
            for j in 0..b {
                for k in 0..c {
                    assert_eq!(y[(k * b + j) * a + i], x[(i * b + j) * c + k]);
                }
            }
        }
        // 4-D bf16 from HBM, and a 4-D SBUF view (a `.ap` pattern with a unit axis).
        let (a, b, c, d) = (2usize, 3usize, 2usize, 5usize);
        let x = codes(a * b * c * d, 2);
        let packed: Vec<u8> = x.iter().flat_map(|w| w.to_le_bytes()[..2].to_vec()).collect();
        let src = m.hbm_tensor("s4", &[a, b, c, d], Dtype::Bf16, Some(&packed)).expect("s");
        let dst = m.alloc(Space::Sbuf, "d4", &[d, b, c, a], Dtype::Bf16).expect("d");
        m.dma_transpose(&dst, &src, Some(&[3, 1, 2, 0]), false, None).expect("4-D");
        let y = words(&m, &dst, 2);
        let oracle = |x: &[u32], y: &[u32], (a, b, c, d): (usize, usize, usize, usize)| {
            for i in 0..a {
                for j in 0..b {
                    for k in 0..c {
                        for l in 0..d {
                            let got = y[((l * b + j) * c + k) * a + i];
                            assert_eq!(got, x[((i * b + j) * c + k) * d + l], "{i} {j} {k} {l}");
                        }
                    }
                }
            }
        };
        oracle(&x, &y, (a, b, c, d));
        let flat = m.alloc(Space::Sbuf, "s4s", &[a, c * d], Dtype::Bf16).expect("s");
        let xs = codes(a * c * d, 2);
        put(&mut m, &flat, &xs, 2);
        let view = flat.with_pattern(&[(0, 1), (d as i64, c as u32), (1, d as u32)], 0);
        let out = m.alloc(Space::Sbuf, "d4s", &[d, c * a], Dtype::Bf16).expect("d");
        let out_view = out.with_pattern(&[(0, 1), (a as i64, c as u32), (1, a as u32)], 0);
        m.dma_transpose(&out_view.expect("v"), &view.expect("v"), None, false, None)
            .expect("4-D view");
        oracle(&xs, &words(&m, &out, 2), (a, 1, c, d));
        // Its time: the copy's DMA model at 50% (SBUF to SBUF) or 90% (from HBM) of the rate.
        let last = m.program.instrs.last().expect("recorded");
        assert_ne!(last.cost.flags & flags::DMA_TRANSPOSE, 0);
        let as_copy = Instr {
            cost: CostInput { flags: last.cost.flags & !flags::DMA_TRANSPOSE, ..last.cost },
            ..*last
        };
        let (t, c) = (cost(last), cost(&as_copy));
        assert_eq!(t.fixed, c.fixed);
        assert!(t.data > c.data, "{} vs {}", t.data, c.data);
    }

    /// `dma_compute` against an oracle that adds the widened sources in order in float32 and
    /// rounds once: bf16 HBM sources into a bf16 HBM `dst` (where bf16 partial sums would round
    /// differently), `dst` one of the sources, and its rules.
    #[test]
    fn dma_compute_against_a_float32_oracle() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let bf16 = |v: f32| (v.to_bits() >> 16) as u16; // exact for these values
        let vals: [[f32; 4]; 3] = [
            [1.0, 256.0, -0.0, 3.0],
            [1.0 / 256.0, 1.0, -0.0, -3.0],
            [1.0 / 256.0, 1.0 / 512.0, -0.0, 0.5],
        ];
        let srcs: Vec<Tile> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let b: Vec<u8> = v.iter().flat_map(|x| bf16(*x).to_le_bytes()).collect();
                m.hbm_tensor(&format!("s{i}"), &[1, 4], Dtype::Bf16, Some(&b)).expect("src")
            })
            .collect();
        let dst = m.hbm_tensor("d", &[1, 4], Dtype::Bf16, None).expect("dst");
        m.dma_compute(&dst, &srcs, None).expect("three sources");
        let got = words(&m, &dst, 2);
        let want: Vec<u32> = (0..4)
            .map(|j| {
                let s = vals[0][j] + vals[1][j] + vals[2][j];
                let b = s.to_bits();
                // Round to nearest even to bf16 (no NaN here).
                ((b + 0x7fff + ((b >> 16) & 1)) >> 16) & 0xffff
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(got[0], bf16(1.0 + 1.0 / 128.0) as u32); // bf16 partial sums give 1.0
        assert_eq!(got[2], 0x8000); // -0 + -0 + -0
                                    // In place: dst = dst + srcs[1].
        m.dma_compute(&dst, &[dst, srcs[1]], Some(2)).expect("in place");
        let again = words(&m, &dst, 2);
        assert_eq!(again[3], bf16(0.5 - 3.0) as u32);
        let check = |r: Result<()>, arg: &str, text: &str| {
            let e = r.expect_err(text);
            assert_eq!(e.arg(), Some(arg), "{e}");
            assert!(e.to_string().contains(text), "{e}");
        };
        check(m.dma_compute(&dst, &[], None), "srcs", "1 to 16 source tiles, got 0");
        check(m.dma_compute(&dst, &[srcs[0]; 17], None), "srcs", "got 17");
        let short = m.hbm_tensor("short", &[1, 3], Dtype::Bf16, None).expect("short");
        check(m.dma_compute(&short, &srcs, None), "srcs", "dst's element count");
        let ps = m.alloc(Space::Psum, "p", &[1, 4], Dtype::Fp32).expect("psum");
        check(m.dma_compute(&ps, &srcs, None), "dst", "dma_memory");
    }

    /// Each documented limit is an error naming its argument.
    #[test]
    fn dma_transpose_rules() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let src = m.alloc(Space::Sbuf, "s", &[16, 8], Dtype::Fp32).expect("s");
        let dst = m.alloc(Space::Sbuf, "d", &[8, 16], Dtype::Fp32).expect("d");
        put(&mut m, &src, &codes(128, 4), 4);
        let check = |r: Result<()>, arg: &str, rule: &str| {
            let e = r.expect_err(rule);
            assert_eq!(e.arg(), Some(arg), "{e}");
            assert!(e.to_string().contains(rule), "{e}");
        };
        let bf = m.alloc(Space::Sbuf, "b", &[8, 16], Dtype::Bf16).expect("b");
        check(m.dma_transpose(&bf, &src, None, false, None), "dst", "dma_transpose_dtype");
        let f8 = m.alloc(Space::Sbuf, "f8", &[16, 8], Dtype::Fp8E4m3).expect("f");
        let g8 = m.alloc(Space::Sbuf, "g8", &[8, 16], Dtype::Fp8E4m3).expect("g");
        put(&mut m, &f8, &[0; 128], 1);
        check(m.dma_transpose(&g8, &f8, None, false, None), "src", "dma_transpose_dtype");
        check(m.dma_transpose(&dst, &src, None, true, None), "src", "dma_transpose_dtype");
        let sq = m.alloc(Space::Sbuf, "sq", &[16, 8], Dtype::Fp32).expect("q");
        check(m.dma_transpose(&sq, &src, None, false, None), "dst", "dma_transpose_shape");
        check(
            m.dma_transpose(&dst, &src, Some(&[0, 1]), false, None),
            "axes",
            "dma_transpose_axes",
        );
        check(
            m.dma_transpose(&dst, &src, Some(&[2, 1, 0]), false, None),
            "axes",
            "dma_transpose_axes",
        );
        let one = src.with_pattern(&[(1, 2), (2, 2), (4, 2), (0, 1)], 0).expect("5-D");
        check(m.dma_transpose(&dst, &one, None, false, None), "src", "dma_transpose_shape");
        let hbm = m.hbm_tensor("h", &[8, 16], Dtype::Fp32, None).expect("h");
        check(m.dma_transpose(&hbm, &src, None, false, None), "dst", "dma_transpose_memory");
        let ps = m.alloc(Space::Psum, "p", &[16, 8], Dtype::Fp32).expect("p");
        check(m.dma_transpose(&dst, &ps, None, false, None), "src", "dma_transpose_memory");
        // In place (a square tile onto itself) is refused: no defined order.
        let sq2 = m.alloc(Space::Sbuf, "sq2", &[8, 8], Dtype::Fp32).expect("q");
        put(&mut m, &sq2, &codes(64, 4), 4);
        check(m.dma_transpose(&sq2, &sq2, None, false, None), "dst", "dma_transpose_overlap");
        // The hardware DGE: 2-byte, src.shape[0] == 16 in 2-D, src.shape[-1] <= 128.
        let h16 = m.alloc(Space::Sbuf, "h16", &[16, 8], Dtype::Bf16).expect("h");
        let h16t = m.alloc(Space::Sbuf, "h16t", &[8, 16], Dtype::Bf16).expect("h");
        put(&mut m, &h16, &codes(128, 2), 2);
        m.dma_transpose(&h16t, &h16, None, true, None).expect("hwdge 16 x 8");
        let h8 = m.alloc(Space::Sbuf, "h8", &[8, 16], Dtype::Bf16).expect("h");
        let h8t = m.alloc(Space::Sbuf, "h8t", &[16, 8], Dtype::Bf16).expect("h");
        put(&mut m, &h8, &codes(128, 2), 2);
        check(m.dma_transpose(&h8t, &h8, None, true, None), "src", "dma_transpose_hwdge");
        check(m.dma_transpose(&h8t, &h8, None, false, Some(16)), "queue", "DMA queues");
    }

    /// `core_barrier` waits for this core's DMA into its tensor, a hold (the other core's
    /// clock) starts it later, and a later DMA reading the tensor waits for the barrier.
    #[test]
    fn core_barrier_orders_the_tensor_and_takes_a_hold() {
        use crate::machine::timeline::Wait;
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let x = m.alloc(Space::Sbuf, "x", &[128, 64], Dtype::Fp32).expect("x");
        put(&mut m, &x, &codes(128 * 64, 4), 4);
        let h = m.hbm_tensor("h", &[128, 64], Dtype::Fp32, None).expect("h");
        let y = m.alloc(Space::Sbuf, "y", &[128, 64], Dtype::Fp32).expect("y");
        let ps = m.alloc(Space::Psum, "ps", &[128, 64], Dtype::Fp32).expect("ps");
        m.dma_copy(&h, &x, Some(0)).expect("store");
        let sb = m.core_barrier(Engine::Vector, &ps).expect_err("PSUM data");
        assert_eq!(sb.rule(), Some("core_barrier_data"));
        assert!(m.core_barrier(Engine::Tensor, &h).is_err(), "not on the tensor engine");
        m.core_barrier(Engine::Gpsimd, &h).expect("barrier");
        let ready = m.run().expect("run");
        assert!(ready.start_ticks[1] >= ready.end_ticks[0], "the barrier waits for the store");
        let tick = ready.end_ticks[1] + 1000;
        m.hold_last(tick).expect("hold");
        m.dma_copy(&y, &h, Some(1)).expect("load");
        let held = m.run().expect("run");
        assert_eq!(held.start_ticks[1], tick, "held to the other core's time");
        assert!(held.start_ticks[2] >= held.end_ticks[1], "the load waits for the barrier");
        assert!(held.critical_path.iter().any(|s| s.index == 1 && s.wait == Wait::Peer));
        assert_eq!(words(&m, &y, 4), codes(128 * 64, 4), "values move unchanged");
    }
}
