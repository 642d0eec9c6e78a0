//! The machine's memories as bytes: SBUF (128 partitions x 224 KiB), PSUM (128 partitions x
//! 16 KiB = 8 banks of 2 KiB), and HBM tensors (one buffer each); the allocator of SBUF and PSUM;
//! and which bytes have been written (so a read of never-written memory is an error naming the
//! tensor).
//!
//! Sources: SBUF 128 x 224 KiB, of which the compiler allocates 212,984 B per
//! partition (\[S1\]\[S24\]); PSUM 128 x 8 banks x 2 KiB (\[S1\]\[S2\]).
//!
//! # Layout and allocation
//!
//! Partition `p` of SBUF lives at host offset `p * (224 KiB + 7744 B)`: the skew keeps the 128
//! partitions of a tile from landing on the same host cache sets (a stride that is a multiple of
//! 4 KiB would), which is what makes small instructions fast. It is invisible to
//! the model: addresses are per-partition byte offsets, as on the hardware.
//!
//! An allocation takes the same byte range `[address, address + bytes)` on a run of partitions
//! (NKI's tensors: the first axis on partitions, the rest in each partition). The allocator is
//! first-fit by address over the allocations that share a partition, 64-byte aligned (our
//! choice; the compiler's policy is not published), up to the usable 212,984 B of an SBUF
//! partition. A PSUM allocation of at most one bank never crosses a bank boundary; a larger one
//! starts on a bank boundary.
//!
//! # Initialisation
//!
//! Per memory, a map of disjoint byte ranges to the set of partitions (a `u128` mask) whose bytes
//! there have been written. A tensor whose whole footprint is written is flagged, so the usual
//! case (reading a tile that was filled before) costs one flag test.

use std::collections::BTreeMap;

use crate::memory::{fmt_bytes, Allocation, Footprint, OnChip, Space, Usage};
use crate::spec::{
    PSUM_BANK_BYTES, PSUM_PARTITIONS, PSUM_PARTITION_BYTES, SBUF_PARTITIONS, SBUF_PARTITION_BYTES,
    SBUF_USABLE_PARTITION_BYTES,
};
use crate::{Error, Result};

use super::dtype::Dtype;
use super::tile::{partition_mask, TensorId, Tile, MAX_FREE_DIMS};

/// Host-layout skew between partitions (see the module doc): partition strides of
/// 224 KiB + 121 x 64 B put consecutive partitions 633 cache lines apart modulo 1024 (about the
/// golden ratio of a 64 KiB way), so a tile's rows spread evenly over L1 and L2 sets.
const SKEW: usize = 121 * 64;
/// Allocation alignment in bytes (our choice; see the module doc).
pub const ALIGN_BYTES: u64 = 64;

/// One partitioned byte memory (SBUF or PSUM), or one HBM buffer (a single "partition").
#[derive(Debug, Clone)]
pub(crate) struct ByteMem {
    /// Backing store; `u32` words so that 4-byte elements are aligned.
    words: Vec<u32>,
    /// Bytes between partitions in `words`.
    pub stride: usize,
}

impl ByteMem {
    fn new(arg: &str, what: &str, partitions: usize, stride: usize) -> Result<Self> {
        let mut words =
            crate::host::zeroed_vec::<u32>(arg, what, (partitions * stride).div_ceil(4))?;
        // SBUF's partitions lie about 232 KiB apart: every row an instruction touches is on
        // its own 4 KiB page, and page translations, not bytes, bound small instructions.
        crate::host::advise_huge_pages(&mut words);
        Ok(ByteMem { words, stride })
    }

    /// All bytes (host layout).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `u32` words viewed as their bytes: same allocation, every byte initialised.
        unsafe {
            std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.words.len() * 4)
        }
    }

    /// All bytes (host layout), mutable.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the unique borrow of `words` makes this view unique.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.words.as_mut_ptr().cast::<u8>(),
                self.words.len() * 4,
            )
        }
    }

    /// Host offset of byte `address` of partition `p`.
    #[inline(always)]
    pub fn at(&self, p: usize, address: usize) -> usize {
        p * self.stride + address
    }

    /// All of the memory as native-order elements of `size` bytes (1, 2 or 4): how the tensor
    /// engine's operand readers see it.
    pub fn buffer(&self, size: usize) -> crate::engine::Buffer<'_> {
        use crate::engine::Buffer;
        match size {
            1 => Buffer::U8(self.bytes()),
            // SAFETY: `u32` words viewed as twice as many `u16`: same allocation, alignment 4
            // suffices for 2, every bit pattern is a valid `u16`.
            2 => Buffer::U16(unsafe {
                std::slice::from_raw_parts(self.words.as_ptr().cast::<u16>(), self.words.len() * 2)
            }),
            _ => Buffer::U32(&self.words),
        }
    }
}

/// Which partitions of each byte range have been written.
#[derive(Debug, Clone, Default)]
pub(crate) struct InitMap {
    /// `start -> (end, mask)`, disjoint, no empty masks.
    segs: BTreeMap<u64, (u64, u128)>,
}

impl InitMap {
    /// Splits the segment containing `at` (if any) so that a segment boundary falls on `at`.
    fn split(&mut self, at: u64) {
        let found = self
            .segs
            .range(..at)
            .next_back()
            .map(|(&s, &(e, m))| (s, e, m));
        if let Some((s, e, m)) = found {
            if e > at {
                self.segs.insert(s, (at, m));
                self.segs.insert(at, (e, m));
            }
        }
    }

    /// Splits at `lo` and `hi` and returns the segments inside `[lo, hi)`.
    fn cut(&mut self, lo: u64, hi: u64) -> Vec<(u64, u64, u128)> {
        self.split(lo);
        self.split(hi);
        self.segs
            .range(lo..hi)
            .map(|(&s, &(e, m))| (s, e, m))
            .collect()
    }

    /// Marks `[lo, hi)` written on `mask`.
    pub fn mark(&mut self, mask: u128, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        // Walk [lo, hi): existing segments gain `mask`, gaps become new segments.
        let inside = self.cut(lo, hi);
        let mut cur = lo;
        for (s, e, m) in inside {
            if s > cur {
                self.segs.insert(cur, (s, mask));
            }
            self.segs.insert(s, (e, m | mask));
            cur = e;
        }
        if cur < hi {
            self.segs.insert(cur, (hi, mask));
        }
        self.merge_around(lo, hi);
    }

    /// Removes `mask` from `[lo, hi)` (memory handed to a new tensor).
    pub fn clear(&mut self, mask: u128, lo: u64, hi: u64) {
        if lo >= hi {
            return;
        }
        for (s, e, m) in self.cut(lo, hi) {
            let m = m & !mask;
            if m == 0 {
                self.segs.remove(&s);
            } else {
                self.segs.insert(s, (e, m));
            }
        }
        self.merge_around(lo, hi);
    }

    /// Merges neighbouring segments with equal masks around `[lo, hi]`.
    fn merge_around(&mut self, lo: u64, hi: u64) {
        let start = self.segs.range(..lo).next_back().map_or(lo, |(&s, _)| s);
        let keys: Vec<(u64, u64, u128)> = self
            .segs
            .range(start..=hi)
            .map(|(&s, &(e, m))| (s, e, m))
            .collect();
        let mut prev: Option<(u64, u64, u128)> = None;
        for (s, e, m) in keys {
            match prev {
                Some((ps, pe, pm)) if pe == s && pm == m => {
                    self.segs.remove(&s);
                    self.segs.insert(ps, (e, m));
                    prev = Some((ps, e, m));
                }
                _ => prev = Some((s, e, m)),
            }
        }
    }

    /// The first byte of `[lo, hi)` not written on every partition of `mask`, with the
    /// partitions missing there.
    pub fn first_gap(&self, mask: u128, lo: u64, hi: u64) -> Option<(u64, u128)> {
        if lo >= hi {
            return None;
        }
        let mut cur = lo;
        let before = self
            .segs
            .range(..=lo)
            .next_back()
            .map(|(&s, &(e, m))| (s, e, m));
        let iter = before
            .into_iter()
            .chain(self.segs.range(lo + 1..hi).map(|(&s, &(e, m))| (s, e, m)));
        for (s, e, m) in iter {
            if e <= cur {
                continue;
            }
            if s > cur {
                return Some((cur, mask));
            }
            if m & mask != mask {
                return Some((cur, mask & !m));
            }
            cur = e;
            if cur >= hi {
                return None;
            }
        }
        (cur < hi).then_some((cur, mask))
    }
}

named_enum! {
    /// What the machine does with memory no instruction has written.
    #[derive(Default)]
    pub enum Uninitialized("uninitialized", value) {
        /// Reading it is an error naming the tensor (the default).
        #[default]
        Error = "error",
        /// New memory is filled with 0xFF bytes (NaN in every float dtype), as AWS's simulator
        /// fills new memory with NaN; reads are not checked.
        Nan = "nan",
    }
}

/// One tensor: an allocation in SBUF or PSUM, or an HBM buffer.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Name used in errors and the trace.
    pub name: String,
    /// Its memory.
    pub space: Space,
    /// Element type of its full tile.
    pub dtype: Dtype,
    /// Logical shape (partitions first in SBUF/PSUM).
    pub shape: Vec<usize>,
    /// First partition (SBUF/PSUM).
    pub start_partition: u32,
    /// Partitions (SBUF/PSUM; 1 for HBM).
    pub partitions: u32,
    /// Byte address within each partition (SBUF/PSUM; 0 for HBM).
    pub address: u64,
    /// Bytes per partition (SBUF/PSUM), or the buffer's size (HBM).
    pub bytes: u64,
    /// Generation of the slot this tensor occupies (handles of freed tensors are refused).
    pub generation: u32,
    /// The buffer (HBM only).
    pub(crate) hbm: Option<ByteMem>,
    /// Initialisation of the HBM buffer (HBM only).
    pub(crate) hbm_init: InitMap,
    /// Every byte of the footprint has been written.
    pub(crate) fully_written: bool,
}

impl TensorInfo {
    /// The tile covering the whole tensor, in C order.
    pub fn full_tile(&self, id: TensorId) -> Tile {
        let (partitions, free): (u32, &[usize]) = match self.space {
            Space::Hbm => (
                self.shape.first().copied().unwrap_or(1) as u32,
                self.shape.get(1..).unwrap_or(&[]),
            ),
            _ => (self.partitions, &self.shape[1..]),
        };
        let mut shape = [1u32; MAX_FREE_DIMS];
        let mut strides = [0i64; MAX_FREE_DIMS];
        let mut stride = 1i64;
        for (d, &s) in free.iter().enumerate().rev() {
            shape[d] = s as u32;
            strides[d] = stride;
            stride *= s as i64;
        }
        Tile {
            tensor: id,
            space: self.space,
            dtype: self.dtype,
            start_partition: self.start_partition,
            partitions,
            partition_step: if self.space == Space::Hbm { stride } else { 0 },
            offset: match self.space {
                Space::Hbm => 0,
                _ => self.address as i64,
            },
            ndim: free.len() as u8,
            shape,
            strides,
        }
    }
}

/// Whether a tile's bytes form one contiguous range per partition (SBUF/PSUM) or one range of
/// the buffer (HBM), so its byte range is exactly what it touches.
pub(crate) fn is_dense(tile: &Tile) -> bool {
    let c = tile.canonical();
    let per_partition = c.n == 0 || (c.n == 1 && c.dims[0].1 == 1);
    match tile.space {
        Space::Hbm => {
            per_partition
                && (tile.partitions == 1 || tile.partition_step == tile.free_size() as i64)
        }
        _ => per_partition,
    }
}

/// A live allocation of SBUF or PSUM, for the allocator.
#[derive(Debug, Clone, Copy)]
struct Live {
    slot: u32,
    start_partition: u32,
    partitions: u32,
    address: u64,
    bytes: u64,
    /// Placed by the kernel (NKI's explicit allocation): may share bytes with other such
    /// tensors, as the kernel's placements do on the chip.
    overlay: bool,
}

/// The machine's memories and tensor table.
#[derive(Debug, Clone)]
pub struct Memories {
    pub(crate) sbuf: ByteMem,
    pub(crate) psum: ByteMem,
    pub(crate) sbuf_init: InitMap,
    pub(crate) psum_init: InitMap,
    /// Tensor slots (freed slots are reused with a new generation).
    pub(crate) tensors: Vec<Option<TensorInfo>>,
    generations: Vec<u32>,
    free_slots: Vec<u32>,
    live_sbuf: Vec<Live>,
    live_psum: Vec<Live>,
    /// Policy for never-written memory.
    pub uninitialized: Uninitialized,
    /// This machine's number (tiles carry it).
    machine: u32,
    /// The view of the whole of PSUM that host-issued instructions address by bank
    /// (`machine::host`), once made.
    pub(crate) psum_view: Option<TensorId>,
}

/// The number of the next machine created in this process.
static NEXT_MACHINE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// The largest dimension product the machine accepts for one tensor (2^40 elements).
const MAX_ELEMENTS: u128 = 1 << 40;

impl Memories {
    /// Empty SBUF and PSUM (zeroed; as never written).
    pub fn new(uninitialized: Uninitialized) -> Result<Memories> {
        let sbuf_size = SBUF_PARTITION_BYTES as usize;
        let psum_size = PSUM_PARTITION_BYTES as usize;
        let mut m = Memories {
            sbuf: ByteMem::new("sbuf", "SBUF", SBUF_PARTITIONS, sbuf_size + SKEW)?,
            psum: ByteMem::new("psum", "PSUM", PSUM_PARTITIONS, psum_size + SKEW)?,
            sbuf_init: InitMap::default(),
            psum_init: InitMap::default(),
            tensors: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            live_sbuf: Vec::new(),
            live_psum: Vec::new(),
            uninitialized,
            machine: NEXT_MACHINE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            psum_view: None,
        };
        if uninitialized == Uninitialized::Nan {
            m.sbuf.bytes_mut().fill(0xFF);
            m.psum.bytes_mut().fill(0xFF);
        }
        Ok(m)
    }

    /// The tensor of a handle, if it is live.
    pub fn tensor(&self, id: TensorId) -> Result<&TensorInfo> {
        if id.machine != self.machine {
            return Err(Error::value(
                "tile",
                format!(
                    "belongs to another NeuronCore (machine #{}, this is #{})",
                    id.machine, self.machine
                ),
            ));
        }
        self.tensors
            .get(id.slot as usize)
            .and_then(|t| t.as_ref())
            .filter(|t| t.generation == id.generation)
            .ok_or_else(|| {
                Error::value(
                    "tile",
                    format!(
                        "tensor #{} was freed (its tiles are no longer valid)",
                        id.slot
                    ),
                )
            })
    }

    /// The handle of slot `slot` in its current generation.
    fn id(&self, slot: u32) -> TensorId {
        TensorId {
            machine: self.machine,
            slot,
            generation: self.generations[slot as usize],
        }
    }

    pub(crate) fn tensor_mut(&mut self, id: TensorId) -> Result<&mut TensorInfo> {
        self.tensor(id)?;
        self.tensors[id.slot as usize]
            .as_mut()
            .ok_or_else(|| Error::value("tile", "tensor was freed"))
    }

    fn new_slot(&mut self) -> u32 {
        if let Some(s) = self.free_slots.pop() {
            self.generations[s as usize] += 1;
            s
        } else {
            self.tensors.push(None);
            self.generations.push(0);
            (self.tensors.len() - 1) as u32
        }
    }

    /// Checks a shape and returns its element count.
    fn elements(arg: &str, shape: &[usize]) -> Result<u64> {
        if shape.is_empty() {
            return Err(Error::shape(arg, "a tensor needs at least one dimension"));
        }
        if shape.len() > MAX_FREE_DIMS + 1 {
            return Err(Error::shape(
                arg,
                format!(
                    "shape {shape:?} has {} dimensions; the machine takes at most {} (a \
                     partition axis and {MAX_FREE_DIMS} free axes)",
                    shape.len(),
                    MAX_FREE_DIMS + 1
                ),
            ));
        }
        let mut n: u128 = 1;
        for &s in shape {
            if s == 0 {
                return Err(Error::shape(
                    arg,
                    format!("shape {shape:?} has a zero dimension"),
                ));
            }
            if s > u32::MAX as usize {
                return Err(Error::shape(
                    arg,
                    format!("dimension {s} of shape {shape:?} exceeds 2**32 - 1"),
                ));
            }
            n = n.saturating_mul(s as u128);
        }
        if n > MAX_ELEMENTS {
            return Err(Error::capacity(
                arg,
                format!("shape {shape:?} has {n} elements; at most 2**40 are accepted"),
            ));
        }
        Ok(n as u64)
    }

    /// Allocates a tensor of `shape` (partitions first) in SBUF or PSUM, at `address` if given
    /// (bytes within each partition), else first-fit. Errors: `CapacityError` with the bytes
    /// asked, the free bytes per partition and the largest live allocations. With `overlay`
    /// (an explicit `address` only) the tensor may overlap other overlay tensors and holds the
    /// bytes already there (they keep their written state): NKI's explicit allocations, where two tensors placed on the same bytes are the same
    /// memory. It still may not overlap a first-fit tensor, and must fit (`CapacityError`).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc(
        &mut self,
        space: Space,
        name: &str,
        shape: &[usize],
        dtype: Dtype,
        start_partition: u32,
        address: Option<u64>,
        overlay: bool,
    ) -> Result<TensorId> {
        if overlay && address.is_none() {
            return Err(Error::value(
                "address",
                format!("{name}: an overlay tensor needs an explicit address"),
            ));
        }
        let (limit, parts) = match space {
            Space::Sbuf => (SBUF_USABLE_PARTITION_BYTES, SBUF_PARTITIONS),
            Space::Psum => (PSUM_PARTITION_BYTES, PSUM_PARTITIONS),
            Space::Hbm => {
                return Err(Error::value(
                    "space",
                    "HBM tensors are created from host data or with hbm_tensor, not alloc",
                ))
            }
        };
        Self::elements("shape", shape)?;
        let p = shape[0];
        if p > parts || start_partition as usize + p > parts {
            return Err(Error::shape(
                "shape",
                format!(
                    "{name}: partition dimension {p} from partition {start_partition} exceeds \
                     the {parts} partitions of {} (the first axis of an on-chip tensor is its \
                     partition axis)",
                    space.name()
                ),
            ));
        }
        let free: u64 = shape[1..].iter().map(|&s| s as u64).product();
        let bytes = free.saturating_mul(dtype.size() as u64);
        let live = match space {
            Space::Sbuf => &self.live_sbuf,
            _ => &self.live_psum,
        };
        let too_big =
            || self.capacity_error(space, name, shape, dtype, bytes, start_partition, p, limit);
        let address = match address {
            Some(a) => {
                let end = a.saturating_add(bytes);
                let clash = live.iter().find(|l| {
                    !(overlay && l.overlay)
                        && overlaps(l.start_partition, l.partitions, start_partition, p as u32)
                        && l.address < end
                        && a < l.address + l.bytes
                });
                if end > limit {
                    return Err(too_big());
                }
                if let Some(l) = clash {
                    let other = self.tensors[l.slot as usize]
                        .as_ref()
                        .map_or("?", |t| t.name.as_str());
                    return Err(Error::value(
                        "address",
                        format!(
                            "{name}: bytes {a}..{end} on partitions {start_partition}..{} \
                             overlap the live tensor {other} (bytes {}..{})",
                            start_partition as usize + p,
                            l.address,
                            l.address + l.bytes
                        ),
                    ));
                }
                if space == Space::Psum && !psum_placement_ok(a, bytes) {
                    return Err(Error::value(
                        "address",
                        format!(
                            "{name}: a PSUM tensor of {bytes} B per partition at byte {a} \
                             crosses a {PSUM_BANK_BYTES}-byte bank boundary (one bank or less \
                             must stay inside its bank; more must start on a bank boundary)"
                        ),
                    ));
                }
                a
            }
            None => match first_fit(live, space, start_partition, p as u32, bytes, limit) {
                Some(a) => a,
                None => return Err(too_big()),
            },
        };
        let slot = self.new_slot();
        let live = Live {
            slot,
            start_partition,
            partitions: p as u32,
            address,
            bytes,
            overlay,
        };
        let mask = partition_mask(start_partition, p as u32);
        // An overlay tensor's bytes are those already there: no fresh (unwritten) state.
        match space {
            Space::Sbuf => {
                self.live_sbuf.push(live);
                if !overlay {
                    self.sbuf_init.clear(mask, address, address + bytes);
                }
            }
            _ => {
                self.live_psum.push(live);
                if !overlay {
                    self.psum_init.clear(mask, address, address + bytes);
                }
            }
        }
        if self.uninitialized == Uninitialized::Nan && !overlay {
            let mem = match space {
                Space::Sbuf => &mut self.sbuf,
                _ => &mut self.psum,
            };
            for q in start_partition as usize..start_partition as usize + p {
                let o = mem.at(q, address as usize);
                mem.bytes_mut()[o..o + bytes as usize].fill(0xFF);
            }
        }
        let place = (start_partition, p as u32, address, bytes);
        self.put_on_chip(slot, name, space, dtype, shape, place);
        Ok(self.id(slot))
    }

    /// The usable bytes per partition and the partitions of SBUF or PSUM.
    fn limits(space: Space) -> (u64, usize) {
        match space {
            Space::Psum => (PSUM_PARTITION_BYTES, PSUM_PARTITIONS),
            _ => (SBUF_USABLE_PARTITION_BYTES, SBUF_PARTITIONS),
        }
    }

    fn live(&self, space: Space) -> &[Live] {
        match space {
            Space::Psum => &self.live_psum,
            _ => &self.live_sbuf,
        }
    }

    /// How full SBUF or PSUM is, as this allocator places tensors: capacity the usable bytes
    /// (SBUF: the compiler's 212,984 B of each 224 KiB partition), used the bytes of the live
    /// tensors (overlay tensors each count), `partition_free` the largest first-fit size a
    /// tensor over every partition could still take.
    pub fn usage(&self, space: Space) -> Usage {
        let (limit, parts) = Self::limits(space);
        let live = self.live(space);
        let capacity = limit * parts as u64;
        let used: u64 = live.iter().map(|l| l.bytes * l.partitions as u64).sum();
        Usage {
            capacity,
            used,
            free: capacity.saturating_sub(used),
            partitions: parts as u64,
            partition_bytes: limit,
            partition_free: largest_gap(live, space, parts as u32, limit),
            allocations: live.len(),
        }
    }

    /// The lowest first partition from which `fp` fits now (first fit over the partitions,
    /// then over the bytes), if any.
    pub(crate) fn lowest_fit(&self, space: Space, fp: Footprint) -> Option<u32> {
        let (limit, parts) = Self::limits(space);
        let p = u32::try_from(fp.partitions).ok()?;
        let live = self.live(space);
        (0..=(parts as u32).checked_sub(p)?)
            .find(|&s| first_fit(live, space, s, p, fp.partition_bytes, limit).is_some())
    }

    /// The owner tag of this machine's reservations (`memory::Allocation::owner`): apart from
    /// every `CoreMemory`'s (those count up from 1 below 2^63).
    pub(crate) fn owner(&self) -> u64 {
        (1 << 63) | self.machine as u64
    }

    /// The reservation a live SBUF/PSUM tensor stands for (`core.alloc`'s handle).
    pub(crate) fn allocation(&self, id: TensorId, stack: usize) -> Result<Allocation> {
        let t = self.tensor(id)?;
        Ok(Allocation {
            space: t.space,
            id: (id.generation as u64) << 32 | id.slot as u64,
            bytes: t.bytes * t.partitions as u64,
            partition_start: t.start_partition as u64,
            partitions: t.partitions as u64,
            partition_bytes: t.bytes,
            stack,
            owner: self.owner(),
        })
    }

    /// The tensor of a reservation made here, if it is live; `ValueError` naming `allocation`
    /// when another memory made it or it was freed.
    pub(crate) fn reserved(&self, a: &Allocation) -> Result<TensorId> {
        if a.owner != self.owner() || a.space == Space::Hbm {
            return Err(Error::value(
                "allocation",
                format!(
                    "{} allocation {} was made by another core's memory, not this core's; free                      it on the core that allocated it",
                    a.space.name(),
                    a.id
                ),
            ));
        }
        let id = TensorId {
            machine: self.machine,
            slot: a.id as u32,
            generation: (a.id >> 32) as u32,
        };
        match self.tensor(id) {
            Ok(t) if t.space == a.space => Ok(id),
            _ => Err(Error::value(
                "allocation",
                format!(
                    "{} allocation {} is not live (already freed?)",
                    a.space.name().to_uppercase(),
                    a.id
                ),
            )),
        }
    }

    /// A tensor over the whole of SBUF or PSUM (all partitions, every byte, as uint8) that the
    /// allocator does not count: addressing memory as the hardware does (by partition and byte),
    /// beside the allocations. Its bytes are those of the tensors it overlaps.
    pub(crate) fn view_tensor(&mut self, space: Space, name: &str) -> Result<TensorId> {
        let (partitions, bytes) = match space {
            Space::Sbuf => (SBUF_PARTITIONS, SBUF_PARTITION_BYTES),
            Space::Psum => (PSUM_PARTITIONS, PSUM_PARTITION_BYTES),
            Space::Hbm => {
                return Err(Error::value(name, "a view covers SBUF or PSUM, not HBM"));
            }
        };
        let slot = self.new_slot();
        let shape = [partitions, bytes as usize];
        let place = (0, partitions as u32, 0, bytes);
        self.put_on_chip(slot, name, space, Dtype::Uint8, &shape, place);
        Ok(self.id(slot))
    }

    /// Fills tensor slot `slot` with an SBUF/PSUM tensor at `(start partition, partitions,
    /// byte address, bytes per partition)`.
    fn put_on_chip(
        &mut self,
        slot: u32,
        name: &str,
        space: Space,
        dtype: Dtype,
        shape: &[usize],
        (start_partition, partitions, address, bytes): (u32, u32, u64, u64),
    ) {
        self.tensors[slot as usize] = Some(TensorInfo {
            name: name.to_string(),
            space,
            dtype,
            shape: shape.to_vec(),
            start_partition,
            partitions,
            address,
            bytes,
            generation: self.generations[slot as usize],
            hbm: None,
            hbm_init: InitMap::default(),
            fully_written: false,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn capacity_error(
        &self,
        space: Space,
        name: &str,
        shape: &[usize],
        dtype: Dtype,
        bytes: u64,
        start: u32,
        p: usize,
        limit: u64,
    ) -> Error {
        let live = match space {
            Space::Sbuf => &self.live_sbuf,
            _ => &self.live_psum,
        };
        // Free bytes per partition: the usable size minus what live allocations take there.
        let mut used = vec![0u64; p];
        for l in live {
            for (q, u) in used.iter_mut().enumerate() {
                let q = start as usize + q;
                if q >= l.start_partition as usize
                    && q < (l.start_partition + l.partitions) as usize
                {
                    *u += l.bytes;
                }
            }
        }
        let min_free = used
            .iter()
            .map(|u| limit.saturating_sub(*u))
            .min()
            .unwrap_or(0);
        let max_free = used
            .iter()
            .map(|u| limit.saturating_sub(*u))
            .max()
            .unwrap_or(0);
        let mut biggest: Vec<&Live> = live.iter().collect();
        biggest.sort_by_key(|l| std::cmp::Reverse(l.bytes * l.partitions as u64));
        let largest: Vec<String> = biggest
            .iter()
            .take(3)
            .map(|l| {
                let n = self.tensors[l.slot as usize]
                    .as_ref()
                    .map_or("?", |t| t.name.as_str());
                format!(
                    "{n} ({} x {} partitions at byte {})",
                    fmt_bytes(l.bytes),
                    l.partitions,
                    l.address
                )
            })
            .collect();
        let physical = match space {
            Space::Sbuf => format!(
                " ({} usable per partition of the physical {})",
                fmt_bytes(limit),
                fmt_bytes(SBUF_PARTITION_BYTES)
            ),
            _ => format!(" ({} per partition)", fmt_bytes(limit)),
        };
        Error::capacity(
            "shape",
            format!(
                "{name} {shape:?} {dtype} needs {} per partition on partitions {start}..{} but \
                 {} has {}..{} free there{physical}, and no free range of that size; largest \
                 live allocations: {}",
                fmt_bytes(bytes),
                start as usize + p,
                space.name(),
                fmt_bytes(min_free),
                fmt_bytes(max_free),
                if largest.is_empty() {
                    "none".to_string()
                } else {
                    largest.join(", ")
                }
            ),
        )
        .with_rule(match space {
            Space::Sbuf => "sbuf_capacity",
            _ => "psum_capacity",
        })
    }

    /// Creates an HBM tensor holding `data` (little-endian packed elements of `dtype`, C order),
    /// or uninitialised when `data` is `None`.
    pub fn hbm_tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: Dtype,
        data: Option<&[u8]>,
    ) -> Result<TensorId> {
        let n = Self::elements("shape", shape)?;
        let bytes = n * dtype.size() as u64;
        if let Some(d) = data {
            if d.len() as u64 != bytes {
                return Err(Error::shape(
                    "data",
                    format!(
                        "{name}: {} bytes given for shape {shape:?} {dtype}, which needs {bytes}",
                        d.len()
                    ),
                ));
            }
        }
        let mut mem = ByteMem::new("shape", name, 1, bytes as usize)?;
        let mut init = InitMap::default();
        match data {
            Some(d) => {
                mem.bytes_mut()[..d.len()].copy_from_slice(d);
                init.mark(1, 0, bytes);
            }
            None if self.uninitialized == Uninitialized::Nan => mem.bytes_mut().fill(0xFF),
            None => {}
        }
        let slot = self.new_slot();
        self.tensors[slot as usize] = Some(TensorInfo {
            name: name.to_string(),
            space: Space::Hbm,
            dtype,
            shape: shape.to_vec(),
            start_partition: 0,
            partitions: 1,
            address: 0,
            bytes,
            generation: self.generations[slot as usize],
            hbm: Some(mem),
            hbm_init: init,
            fully_written: data.is_some(),
        });
        Ok(self.id(slot))
    }

    /// Frees a tensor; its handles become invalid. The bytes keep their contents (a new tensor
    /// there starts as never written).
    pub fn free(&mut self, id: TensorId) -> Result<()> {
        let t = self.tensor(id)?;
        let space = t.space;
        match space {
            Space::Sbuf => self.live_sbuf.retain(|l| l.slot != id.slot),
            Space::Psum => self.live_psum.retain(|l| l.slot != id.slot),
            Space::Hbm => {}
        }
        self.tensors[id.slot as usize] = None;
        self.free_slots.push(id.slot);
        Ok(())
    }

    /// The memory of a tile (HBM: the tensor's buffer).
    pub(crate) fn mem(&self, tile: &Tile) -> &ByteMem {
        match tile.space {
            Space::Sbuf => &self.sbuf,
            Space::Psum => &self.psum,
            Space::Hbm => self.tensors[tile.tensor.slot as usize]
                .as_ref()
                .and_then(|t| t.hbm.as_ref())
                .unwrap_or(&self.psum),
        }
    }

    /// The memory of a tile, mutable.
    pub(crate) fn mem_mut(&mut self, tile: &Tile) -> &mut ByteMem {
        match tile.space {
            Space::Sbuf => &mut self.sbuf,
            Space::Psum => &mut self.psum,
            Space::Hbm => match self.tensors[tile.tensor.slot as usize]
                .as_mut()
                .and_then(|t| t.hbm.as_mut())
            {
                Some(m) => m,
                None => &mut self.psum,
            },
        }
    }

    /// The bytes of on-chip memory `dst` (mutable) and of the other on-chip memory.
    pub(crate) fn split_on_chip(&mut self, dst: Space) -> (&mut [u8], &[u8]) {
        match dst {
            Space::Psum => (self.psum.bytes_mut(), self.sbuf.bytes()),
            _ => (self.sbuf.bytes_mut(), self.psum.bytes()),
        }
    }

    /// Checks that `tile` is a live tensor's, lies inside it, and returns its per-partition
    /// byte range `[lo, hi)` (relative to the partition / buffer start).
    pub fn check_tile(&self, arg: &str, tile: &Tile) -> Result<(u64, u64)> {
        let t = self.tensor(tile.tensor).map_err(|e| match e {
            Error::Value { message, .. } => Error::value(arg, message),
            other => other,
        })?;
        if t.space != tile.space {
            return Err(Error::value(
                arg,
                format!(
                    "the tile says {} but tensor {} is in {}",
                    tile.space.name(),
                    t.name,
                    t.space.name()
                ),
            ));
        }
        if tile.partitions == 0 || tile.free_size() == 0 {
            return Err(Error::shape(
                arg,
                format!("an empty tile of tensor {}", t.name),
            ));
        }
        // Exact, in 128-bit arithmetic: no user size, stride or offset can wrap it.
        let esize = tile.dtype.size() as i128;
        let (flo, fhi) = tile.free_extent();
        let offset = tile.offset as i128;
        let (lo, hi) = match tile.space {
            Space::Hbm => {
                let reach = (tile.partitions as i128 - 1) * tile.partition_step as i128;
                let (plo, phi) = if reach < 0 { (reach, 0) } else { (0, reach) };
                (
                    offset + (flo + plo) * esize,
                    offset + (fhi + phi + 1) * esize,
                )
            }
            _ => {
                let p0 = tile.start_partition as u64;
                let end = p0 + tile.partitions as u64;
                let t_end = t.start_partition as u64 + t.partitions as u64;
                if p0 < t.start_partition as u64 || end > t_end {
                    return Err(Error::shape(
                        arg,
                        format!(
                            "partitions {p0}..{end} are outside tensor {} (partitions {}..{t_end})",
                            t.name, t.start_partition,
                        ),
                    ));
                }
                (offset + flo * esize, offset + (fhi + 1) * esize)
            }
        };
        let (tlo, thi) = (t.address as i128, t.address as i128 + t.bytes as i128);
        if lo < tlo || hi > thi {
            return Err(Error::shape(
                arg,
                format!(
                    "the access pattern reaches bytes {lo}..{hi} but tensor {} holds bytes \
                     {tlo}..{thi}{}",
                    t.name,
                    if tile.space == Space::Hbm {
                        String::new()
                    } else {
                        " of each partition".to_string()
                    }
                ),
            ));
        }
        if offset % esize != 0 && tile.dtype.size() > 1 {
            return Err(Error::value(
                arg,
                format!(
                    "byte offset {} is not a multiple of the {}-byte {} element",
                    tile.offset, esize, tile.dtype
                ),
            ));
        }
        Ok((lo as u64, hi as u64))
    }

    /// The name of a tile's tensor (for messages).
    pub fn name(&self, tile: &Tile) -> &str {
        self.tensor(tile.tensor).map_or("?", |t| t.name.as_str())
    }

    fn init_map(&self, tile: &Tile) -> &InitMap {
        match tile.space {
            Space::Sbuf => &self.sbuf_init,
            Space::Psum => &self.psum_init,
            Space::Hbm => self.tensors[tile.tensor.slot as usize]
                .as_ref()
                .map_or(&self.psum_init, |t| &t.hbm_init),
        }
    }

    /// Errors if any element `tile` reads was never written (under [`Uninitialized::Error`]).
    pub fn check_written(&self, arg: &str, tile: &Tile, range: (u64, u64)) -> Result<()> {
        if self.uninitialized == Uninitialized::Nan {
            return Ok(());
        }
        let t = self.tensor(tile.tensor)?;
        if t.fully_written {
            return Ok(());
        }
        let map = self.init_map(tile);
        let mask = tile.partition_mask();
        let Some(_) = map.first_gap(mask, range.0, range.1) else {
            return Ok(());
        };
        // The bounding range has a hole; check the exact elements, run by run.
        let mut gap = None;
        self.for_each_byte_run(tile, |m, lo, hi| {
            if gap.is_none() {
                gap = map.first_gap(m, lo, hi);
            }
        });
        match gap {
            None => Ok(()),
            Some((byte, parts)) => {
                let p = parts.trailing_zeros();
                let rel = byte.saturating_sub(t.address);
                let where_ = match tile.space {
                    Space::Hbm => format!("byte {byte}"),
                    _ => format!("partition {p}, address {byte}: byte {rel} of the tensor"),
                };
                Err(Error::value(
                    arg,
                    format!(
                        "reads {} memory of tensor {} that was never written ({where_}); \
                         write it first (memset, a DMA, ...), or create the core with \
                         uninitialized=\"nan\" to read NaN there as AWS's simulator does",
                        tile.space.name(),
                        t.name
                    ),
                )
                .with_rule("uninitialized_read"))
            }
        }
    }

    /// The byte ranges of an HBM tensor that have been written, in order (the whole buffer
    /// when it is fully written). Under [`Uninitialized::Nan`] nothing is tracked and the whole
    /// buffer counts as written.
    pub fn written_ranges(&self, tile: &Tile) -> Result<Vec<(u64, u64)>> {
        let t = self.tensor(tile.tensor)?;
        if t.space != Space::Hbm {
            return Err(Error::value(
                "tile",
                format!(
                    "written_ranges reads an HBM tensor's map; tensor {} is in {}",
                    t.name,
                    t.space.name()
                ),
            ));
        }
        if t.fully_written || self.uninitialized == Uninitialized::Nan {
            return Ok(vec![(0, t.bytes)]);
        }
        Ok(t.hbm_init
            .segs
            .iter()
            .filter(|(_, &(_, m))| m & 1 != 0)
            .map(|(&s, &(e, _))| (s, e))
            .collect())
    }

    /// Records that `tile`'s elements were written.
    pub fn mark_written(&mut self, tile: &Tile, range: (u64, u64)) {
        if self.uninitialized == Uninitialized::Nan {
            return;
        }
        let Ok(t) = self.tensor(tile.tensor) else {
            return;
        };
        if t.fully_written {
            return;
        }
        let (tmask, tlo, thi) = (
            match t.space {
                Space::Hbm => 1,
                _ => partition_mask(t.start_partition, t.partitions),
            },
            t.address,
            t.address + t.bytes,
        );
        let mut runs = Vec::new();
        if is_dense(tile) {
            runs.push((tile.partition_mask(), range.0, range.1));
        } else {
            self.for_each_byte_run(tile, |m, lo, hi| runs.push((m, lo, hi)));
        }
        let map = match tile.space {
            Space::Sbuf => &mut self.sbuf_init,
            Space::Psum => &mut self.psum_init,
            Space::Hbm => match self.tensors[tile.tensor.slot as usize].as_mut() {
                Some(t) => &mut t.hbm_init,
                None => return,
            },
        };
        for (m, lo, hi) in runs {
            map.mark(m, lo, hi);
        }
        let full = map.first_gap(tmask, tlo, thi).is_none();
        if full {
            if let Ok(t) = self.tensor_mut(tile.tensor) {
                t.fully_written = true;
            }
        }
    }

    /// Calls `f(mask, lo, hi)` for every maximal byte run of `tile` (contiguous elements).
    fn for_each_byte_run(&self, tile: &Tile, mut f: impl FnMut(u128, u64, u64)) {
        let esize = tile.dtype.size() as i64;
        let c = tile.canonical();
        let (len, stride) = (c.run_len() as i64, c.run_stride());
        let rows: Vec<(u128, i64)> = match tile.space {
            Space::Hbm => (0..tile.partitions as i64)
                .map(|p| (1u128, tile.offset + p * tile.partition_step * esize))
                .collect(),
            _ => vec![(tile.partition_mask(), tile.offset)],
        };
        for (mask, base) in rows {
            c.for_each_run(|start| {
                let b = base + start * esize;
                if stride == 1 {
                    f(mask, b as u64, (b + len * esize) as u64);
                } else {
                    for i in 0..len {
                        let e = b + i * stride * esize;
                        f(mask, e as u64, (e + esize) as u64);
                    }
                }
            });
        }
    }
}

impl OnChip for Memories {
    fn fits_ever(&self, arg: &str, space: Space, fp: Footprint) -> Result<()> {
        let (limit, parts) = Self::limits(space);
        if fp.partitions > parts as u64 || fp.partition_bytes > limit {
            let name = space.name().to_uppercase();
            let usable = if space == Space::Sbuf {
                format!(
                    " usable (of the physical {})",
                    fmt_bytes(SBUF_PARTITION_BYTES)
                )
            } else {
                String::new()
            };
            return Err(Error::capacity(
                arg,
                format!(
                    "{} over {} partitions needs {} per partition; {name} has {parts} \
                     partitions of {}{usable}",
                    fmt_bytes(fp.bytes),
                    fp.partitions,
                    fmt_bytes(fp.partition_bytes),
                    fmt_bytes(limit)
                ),
            )
            .with_rule(if space == Space::Sbuf {
                "sbuf_capacity"
            } else {
                "psum_capacity"
            }));
        }
        Ok(())
    }

    fn fits_now(&self, arg: &str, space: Space, fp: Footprint) -> Result<()> {
        self.fits_ever(arg, space, fp)?;
        if self.lowest_fit(space, fp).is_some() {
            return Ok(());
        }
        let u = self.usage(space);
        Err(Error::capacity(
            arg,
            format!(
                "{} over {} partitions needs {} free on {} consecutive partitions; {} has at \
                 most {} free on every partition ({} used of {} in {} allocations)",
                fmt_bytes(fp.bytes),
                fp.partitions,
                fmt_bytes(fp.partition_bytes),
                fp.partitions,
                space.name().to_uppercase(),
                fmt_bytes(u.partition_free),
                fmt_bytes(u.used),
                fmt_bytes(u.capacity),
                u.allocations
            ),
        )
        .with_rule(if space == Space::Sbuf {
            "sbuf_capacity"
        } else {
            "psum_capacity"
        }))
    }

    fn holds_on_chip(&self, a: &Allocation) -> bool {
        self.reserved(a).is_ok()
    }
}

/// The largest size (bytes per partition) a first-fit tensor over every partition could take.
fn largest_gap(live: &[Live], space: Space, parts: u32, limit: u64) -> u64 {
    // The sizes that could fit are monotone: search the largest by bisection.
    let (mut lo, mut hi) = (0u64, limit);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if first_fit(live, space, 0, parts, mid, limit).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Whether partition ranges `[a, a + n)` and `[b, b + m)` overlap.
fn overlaps(a: u32, n: u32, b: u32, m: u32) -> bool {
    a < b + m && b < a + n
}

/// Whether a PSUM allocation of `bytes` per partition at `address` respects the banks.
fn psum_placement_ok(address: u64, bytes: u64) -> bool {
    if bytes <= PSUM_BANK_BYTES {
        address / PSUM_BANK_BYTES == (address + bytes - 1) / PSUM_BANK_BYTES
    } else {
        address.is_multiple_of(PSUM_BANK_BYTES)
    }
}

/// The lowest aligned address where `bytes` fit on partitions `[start, start + p)`.
fn first_fit(
    live: &[Live],
    space: Space,
    start: u32,
    p: u32,
    bytes: u64,
    limit: u64,
) -> Option<u64> {
    let mut taken: Vec<(u64, u64)> = live
        .iter()
        .filter(|l| overlaps(l.start_partition, l.partitions, start, p))
        .map(|l| (l.address, l.address + l.bytes))
        .collect();
    taken.sort_unstable();
    let align = |a: u64| a.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
    let place = |a: u64| -> u64 {
        let a = align(a);
        if space == Space::Psum && !psum_placement_ok(a, bytes) {
            a.div_ceil(PSUM_BANK_BYTES) * PSUM_BANK_BYTES
        } else {
            a
        }
    };
    let mut cand = place(0);
    for (lo, hi) in taken {
        if cand + bytes <= lo {
            break;
        }
        if hi > cand {
            cand = place(hi);
        }
    }
    (cand + bytes <= limit).then_some(cand)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_map_tracks_partitions_and_ranges() {
        let mut m = InitMap::default();
        m.mark(0b11, 0, 100);
        assert_eq!(m.first_gap(0b11, 0, 100), None);
        assert_eq!(m.first_gap(0b111, 10, 20), Some((10, 0b100)));
        assert_eq!(m.first_gap(0b1, 50, 150), Some((100, 0b1)));
        m.mark(0b100, 0, 100);
        m.mark(0b111, 100, 150);
        assert_eq!(m.first_gap(0b111, 0, 150), None);
        assert_eq!(m.segs.len(), 1, "merged: {:?}", m.segs);
        m.clear(0b10, 40, 60);
        assert_eq!(m.first_gap(0b111, 0, 150), Some((40, 0b10)));
        assert_eq!(m.first_gap(0b101, 0, 150), None);
    }

    #[test]
    fn overlay_tensors_share_bytes_with_each_other_only() -> Result<()> {
        let mut m = Memories::new(Uninitialized::Error)?;
        let (sb, f32) = (Space::Sbuf, Dtype::Fp32);
        let a = m.alloc(sb, "a", &[128, 64], f32, 0, Some(1024), true)?;
        // Another overlay on a's bytes is the same memory; a first-fit tensor avoids both.
        m.alloc(sb, "b", &[64, 32], f32, 32, Some(1100), true)?;
        let c = m.alloc(sb, "c", &[128, 512], f32, 0, None, false)?;
        assert_eq!(m.tensor(c)?.address, 1024 + 256);
        let d = m.alloc(sb, "d", &[128, 8], f32, 0, None, false)?;
        assert_eq!(m.tensor(d)?.address, 0);
        // An overlay may not land on a first-fit tensor, nor a plain placement on an overlay.
        let e = m.alloc(sb, "e", &[1, 4], f32, 0, Some(1300), true);
        assert!(e.is_err());
        assert!(m
            .alloc(sb, "f", &[1, 4], f32, 0, Some(1024), false)
            .is_err());
        assert!(m.alloc(sb, "g", &[1, 4], f32, 0, None, true).is_err());
        m.free(a)
    }

    #[test]
    fn first_fit_and_psum_banks() {
        let live = vec![Live {
            slot: 0,
            start_partition: 0,
            partitions: 128,
            address: 0,
            bytes: 100,
            overlay: false,
        }];
        assert_eq!(first_fit(&live, Space::Sbuf, 0, 128, 64, 1000), Some(128));
        assert_eq!(
            first_fit(&live, Space::Psum, 0, 128, 2000, 16384),
            Some(2048)
        );
        assert_eq!(
            first_fit(&live, Space::Psum, 0, 128, 1900, 16384),
            Some(128)
        );
        assert_eq!(first_fit(&live, Space::Psum, 0, 128, 1990, 2048), None);
        assert!(psum_placement_ok(2048, 4096));
        assert!(!psum_placement_ok(1024, 2048));
    }

    #[test]
    fn reservations_and_tensors_share_one_account() -> Result<()> {
        use crate::machine::{Machine, MachineConfig};
        let mut m = Machine::new(MachineConfig::default())?;
        let sb = Space::Sbuf;
        let t = m.alloc(sb, "t", &[128, 1024], Dtype::Fp32)?;
        let fp = Footprint::of_bytes(128 * 200_000);
        let (a, _) = m.reserve("size", sb, "a", fp, None, 0)?;
        assert_eq!(
            (a.partitions, a.partition_bytes, a.bytes),
            (128, 200_000, 128 * 200_000)
        );
        let u = m.memories().usage(sb);
        assert_eq!((u.used, u.allocations), (128 * (4096 + 200_000), 2));
        // 4096..204096 taken; 204096..212984 left.
        assert_eq!(u.partition_free, SBUF_USABLE_PARTITION_BYTES - 204_096);
        let left = Footprint::of_shape(&[128, u.partition_free], 1)?;
        assert!(m.memories().fits_now("x", sb, left).is_ok());
        let over = Footprint::of_shape(&[128, u.partition_free + 1], 1)?;
        let e = m
            .memories()
            .fits_now("x", sb, over)
            .expect_err("one byte too many");
        assert_eq!((e.arg(), e.rule()), (Some("x"), Some("sbuf_capacity")));
        // A one-partition tensor goes to the lowest partition where it fits.
        let row = Footprint::of_shape(&[1, 8_000], 1)?;
        let (b, _) = m.reserve("size", sb, "b", row, Some((&[1, 8_000], Dtype::Uint8)), 0)?;
        assert_eq!(b.partition_start, 0);
        let (c, _) = m.reserve("size", sb, "c", row, Some((&[1, 8_000], Dtype::Uint8)), 0)?;
        assert_eq!(c.partition_start, 1);
        m.release(&a)?;
        assert!(m.release(&a).is_err(), "a second release is refused");
        assert!(!m.memories().holds_on_chip(&a));
        assert!(m.memories().holds_on_chip(&b));
        // Another machine's reservation is not this one's.
        let mut other = Machine::new(MachineConfig::default())?;
        let (o, _) = other.reserve("size", sb, "o", Footprint::of_bytes(128), None, 0)?;
        assert!(m.release(&o).is_err() && !m.memories().holds_on_chip(&o));
        m.free(&t)?;
        assert_eq!(m.memories().usage(sb).allocations, 2);
        Ok(())
    }
}
