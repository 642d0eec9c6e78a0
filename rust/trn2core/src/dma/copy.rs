//! One DMA transfer of a core, whole: which memories it reads and writes, whether they can
//! hold it, how many bytes cross HBM with inline compression, and how long it takes. The
//! capacity rules are the memory model's ([`CoreMemory`]); the time is the DMA model's
//! ([`super::cost`]); the compressed size is the codecs' ([`super::plan_compress`], a sizing
//! pass that writes nothing).

use super::cost::{dma_time_on_queue, DmaPlan, Place};
use super::{plan_compress, Codec};
use crate::memory::{fmt_bytes, Allocation, CoreMemory, Footprint, OnChip, Space};
use crate::perf::Report;
use crate::spec::HBM_STACKS_PER_DIE;
use crate::{Error, Result};

/// One end of a transfer: a memory by name, or an allocation made by the core's memory.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint<'a> {
    /// A memory: `hbm` (this core's stack), `hbm_remote` (the other die's), `sbuf`, `psum`.
    Place(Place),
    /// An allocation of `CoreMemory::alloc` (the transfer must fit in it).
    Allocation(&'a Allocation),
}

/// What is moved: an array of `shape` with `elem_size`-byte elements; `raw` are its bytes,
/// needed only to size the compressed stream (`codec` other than none).
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    /// The array's bytes in C order (may be empty when `codec` is none).
    pub raw: &'a [u8],
    /// Its dtype name (recorded in a compressed stream's header).
    pub dtype: &'a str,
    /// Bytes per element.
    pub elem_size: usize,
    /// Its shape: the first axis spans partitions (folded onto 128), as for `alloc`.
    pub shape: &'a [u64],
}

/// The result: the report and the bytes that crossed HBM.
#[derive(Debug, Clone)]
pub struct Copied {
    /// Timing of the transfer.
    pub report: Report,
    /// Bytes delivered (the array's size).
    pub bytes: u64,
    /// Bytes over HBM: the compressed stream's size with a codec, else `bytes`.
    pub wire_bytes: u64,
    /// Where it read.
    pub src: Place,
    /// Where it wrote.
    pub dst: Place,
}

/// Costs moving `payload` from `src` to `dst` on DMA queue `queue` of the core whose memories
/// are `mem` (its HBM) and `on_chip` (its SBUF and PSUM: `mem` itself for a standalone core, the
/// machine's allocator for a NeuronCore), with inline compression `codec`. Nothing is reserved
/// or written.
///
/// Capacity (`CapacityError` before the data is read): the destination must have room now (its
/// free space, or the allocation given), the source must be able to hold the array at all;
/// HBM sides hold what crosses the wire (the compressed size). An allocation must be live and
/// made by this core's memories (or the HBM stack it reaches, or for HBM any stack: the other
/// die's stacks cost as `hbm_remote`); `ValueError` otherwise.
pub fn dma_copy(
    mem: &CoreMemory, on_chip: &dyn OnChip, payload: Payload, codec: Codec, src: Endpoint,
    dst: Endpoint, queue: usize,
) -> Result<Copied> {
    let fp = Footprint::of_shape(payload.shape, payload.elem_size as u64)?;
    let (s, d) = (place(mem, on_chip, "src", src)?, place(mem, on_chip, "dst", dst)?);
    // On-chip sides first: nothing has been read yet.
    for (p, end, is_dst) in [(s, src, false), (d, dst, true)] {
        if matches!(p, Place::Sbuf | Place::Psum) {
            check_side(mem, on_chip, p, end, is_dst, fp, fp.bytes)?;
        }
    }
    let wire = match codec {
        Codec::None => fp.bytes,
        c => {
            plan_compress(payload.raw, payload.elem_size, c, payload.dtype, payload.shape)?
                .info()
                .nbytes
        }
    };
    for (p, end, is_dst) in [(s, src, false), (d, dst, true)] {
        if matches!(p, Place::Hbm | Place::HbmRemote) {
            check_side(mem, on_chip, p, end, is_dst, fp, wire)?;
        }
    }
    let plan =
        DmaPlan { bytes: fp.bytes, wire_bytes: wire, partitions: fp.partitions, src: s, dst: d };
    Ok(Copied {
        report: dma_time_on_queue(&plan, queue)?,
        bytes: fp.bytes,
        wire_bytes: wire,
        src: s,
        dst: d,
    })
}

/// The place an endpoint stands for, after checking an allocation is this core's and live.
fn place(mem: &CoreMemory, on_chip: &dyn OnChip, arg: &str, end: Endpoint) -> Result<Place> {
    let a = match end {
        Endpoint::Place(p) => return Ok(p),
        Endpoint::Allocation(a) => a,
    };
    match a.space {
        // Any stack of the chip is reachable; one on the other die costs as remote (NUMA).
        Space::Hbm => Ok(if a.stack / HBM_STACKS_PER_DIE == mem.die() {
            Place::Hbm
        } else {
            Place::HbmRemote
        }),
        space if on_chip.holds_on_chip(a) => {
            Ok(if space == Space::Sbuf { Place::Sbuf } else { Place::Psum })
        }
        space => Err(Error::value(
            arg,
            format!(
                "{} allocation {} is not a live allocation of this core's {} (freed, or made \
                 by another core)",
                space.name(),
                a.id,
                space.name()
            ),
        )),
    }
}

/// Refuses a side that cannot hold the array (`held` bytes of it in that memory).
fn check_side(
    mem: &CoreMemory, on_chip: &dyn OnChip, p: Place, end: Endpoint, is_dst: bool, fp: Footprint,
    held: u64,
) -> Result<()> {
    let arg = if is_dst { "dst" } else { "src" };
    if let Endpoint::Allocation(a) = end {
        return fits_allocation(arg, a, fp, held);
    }
    let on = match p {
        Place::Hbm | Place::HbmRemote => None,
        Place::Sbuf => Some(Space::Sbuf),
        Place::Psum => Some(Space::Psum),
    };
    // The other die's stacks are not tracked by one core: only whether any stack could hold it.
    match (on, is_dst && p != Place::HbmRemote) {
        (Some(space), true) => on_chip.fits_now("x", space, fp),
        (Some(space), false) => on_chip.fits_ever("x", space, fp),
        (None, true) => mem.check_transfer("x", Space::Hbm, fp, held),
        (None, false) => mem.check_capacity("x", Space::Hbm, fp, held),
    }
}

/// Refuses an array (`held` bytes in the allocation's memory) that does not fit `a`.
fn fits_allocation(arg: &str, a: &Allocation, fp: Footprint, held: u64) -> Result<()> {
    if a.space == Space::Hbm {
        if held > a.bytes {
            return Err(Error::capacity(
                "x",
                format!(
                    "{} do not fit in {arg}, an HBM allocation of {}",
                    fmt_bytes(held),
                    fmt_bytes(a.bytes)
                ),
            ));
        }
        return Ok(());
    }
    if fp.partitions > a.partitions || fp.partition_bytes > a.partition_bytes {
        return Err(Error::capacity(
            "x",
            format!(
                "{} B as {} partitions x {} B do not fit in {arg}, a {} allocation of {} \
                 partitions x {} B",
                fp.bytes,
                fp.partitions,
                fp.partition_bytes,
                a.space.name().to_uppercase(),
                a.partitions,
                a.partition_bytes
            ),
        ));
    }
    Ok(())
}
