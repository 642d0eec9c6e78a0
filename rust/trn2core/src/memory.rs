//! The memory hierarchy of a NeuronCore-v3 as capacities: HBM stacks (shared by two adjacent
//! cores, NUMA across the chip's two dies), SBUF (128 partitions of 224 KiB) and PSUM (128
//! partitions of 16 KiB). Every request beyond capacity is refused with
//! [`Error::Capacity`] before anything is reserved; nothing here allocates host memory for the
//! emulated device memory (the data lives in the caller's arrays), so a request of 10^15 bytes
//! is answered in nanoseconds.
//!
//! Sources (`docs/sources.md`): 4 HBM stacks x 24 GiB per chip, each shared by 2 physical cores
//! (\[S1\]\[S3\]\[S6\], driver `V3_HBM_ACTIVE_SIZE` \[S25\]); 2 dies, cores 0-3 on die 0 (\[S25\]); SBUF
//! 28 MiB = 128 x 224 KiB (\[S1\]); PSUM 2 MiB = 128 x 8 banks x 2 KiB (\[S1\]\[S2\]).
//!
//! # Model
//!
//! - **HBM**: one [`HbmStack`] of 24 GiB, byte-addressed, holds any number of allocations whose
//!   sizes add up to at most its capacity (no fragmentation is modelled). Stack `s` serves
//!   cores `2s` and `2s + 1` and sits on die `s / 2`. A [`CoreMemory`] reaches its stack through
//!   a [`SharedHbm`] (`Arc<Mutex<_>>`), so a chip can hand the same stack to both of its cores.
//! - **SBUF / PSUM**: a [`PartitionedMemory`] of 128 partitions. A tensor `[P, F]` takes `F`
//!   bytes on `P` consecutive partitions (the partition dimension is the first axis, as in NKI;
//!   a first axis longer than 128 is folded onto the 128 partitions, see [`Footprint`]). The
//!   allocator places it on the lowest run of `P` partitions that all have `F` bytes free; the
//!   address within a partition is not modelled (free space in a partition counts as one hole).
//!   Capacity is the physical 224 KiB per SBUF partition: the ~16 KiB the compiler keeps for
//!   itself ([`SBUF_USABLE_PARTITION_BYTES`]) is software policy, reported but not enforced.
//!
//! The DMA timing model (`dma::cost`) uses [`CoreMemory::check_transfer`] to refuse a transfer
//! whose destination cannot hold it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::spec::{
    CORES_PER_CHIP, CORES_PER_HBM_STACK, HBM_STACKS_PER_CHIP, HBM_STACKS_PER_DIE, HBM_STACK_BYTES,
    PSUM_PARTITIONS, PSUM_PARTITION_BYTES, SBUF_PARTITIONS, SBUF_PARTITION_BYTES,
    SBUF_USABLE_PARTITION_BYTES,
};
use crate::{Error, Result};

named_enum! {
    /// A memory of the core.
    pub enum Space("memory", value) {
        /// The core's HBM stack (24 GiB, shared with the neighbouring core).
        Hbm = "hbm",
        /// The state buffer: 128 partitions x 224 KiB.
        Sbuf = "sbuf",
        /// The partial-sum buffer: 128 partitions x 16 KiB.
        Psum = "psum",
    }
}

/// How a tensor lies in a partitioned memory: `bytes` in total over `partitions` partitions,
/// at most `partition_bytes` in any one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of the tensor.
    pub bytes: u64,
    /// Partitions it spans (1..=128).
    pub partitions: u64,
    /// Bytes it takes on each spanned partition (`bytes / partitions`, rounded up).
    pub partition_bytes: u64,
}

impl Footprint {
    /// `bytes` spread evenly over all 128 partitions (a request by size only).
    pub fn of_bytes(bytes: u64) -> Footprint {
        let p = SBUF_PARTITIONS as u64;
        Footprint { bytes, partitions: p, partition_bytes: bytes.div_ceil(p) }
    }

    /// An array of `shape` with `elem_size`-byte elements: the first axis goes across the
    /// partitions (folded onto 128 when longer), the rest along each partition. A 0-d or 1-d
    /// array, or an empty first axis, is spread over all 128 partitions. `CapacityError` when
    /// the size overflows 64 bits.
    pub fn of_shape(shape: &[u64], elem_size: u64) -> Result<Footprint> {
        let bytes =
            shape.iter().try_fold(elem_size, |acc, &d| acc.checked_mul(d)).ok_or_else(|| {
                Error::capacity(
                    "shape",
                    format!(
                        "{shape:?} of {elem_size}-byte elements is more than 2^64 bytes; \
                         no memory holds it"
                    ),
                )
            })?;
        let p = SBUF_PARTITIONS as u64;
        let partitions = match shape {
            [first, _, ..] if *first > 0 => (*first).min(p),
            _ => p,
        };
        Ok(Footprint { bytes, partitions, partition_bytes: bytes.div_ceil(partitions) })
    }
}

/// A reservation in one memory: what `core.alloc` hands out and `core.free` takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The memory the reservation is in.
    pub space: Space,
    /// Identifier, unique within its memory (an HBM stack or a core's SBUF/PSUM).
    pub id: u64,
    /// Bytes reserved (for SBUF/PSUM: `partitions * partition_bytes`).
    pub bytes: u64,
    /// First partition (0 for HBM).
    pub partition_start: u64,
    /// Partitions spanned (0 for HBM).
    pub partitions: u64,
    /// Bytes reserved in each spanned partition (0 for HBM).
    pub partition_bytes: u64,
    /// The HBM stack (0..4) for HBM allocations, else the owning core's stack.
    pub stack: usize,
    /// The memory object that made it (process-unique): freeing it anywhere else is refused,
    /// even where the id and stack number match (two standalone cores both have a stack 0).
    pub owner: u64,
}

/// A process-unique identity for each memory object, the owner tag of its allocations.
fn next_owner() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The error for freeing an allocation made by another memory.
fn foreign(a: &Allocation, here: &str) -> Error {
    Error::value(
        "allocation",
        format!(
            "{} allocation {} was made by another core's memory, not {here}; free it on the core \
             that allocated it",
            a.space.name(),
            a.id
        ),
    )
}

/// How full one memory is, in bytes (`partitions`, `partition_bytes` and `partition_free` are 0
/// for HBM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes it can hold (SBUF in a NeuronCore: the compiler's usable bytes per partition).
    pub capacity: u64,
    /// Bytes reserved.
    pub used: u64,
    /// `capacity - used`.
    pub free: u64,
    /// Partitions (128 on chip).
    pub partitions: u64,
    /// Capacity of one partition.
    pub partition_bytes: u64,
    /// The most bytes a tensor spanning every partition could still take in each.
    pub partition_free: u64,
    /// Live allocations.
    pub allocations: usize,
}

/// SBUF and PSUM as a DMA transfer sees them: whether an array's footprint fits now or could
/// ever fit, and whether an allocation is theirs. A standalone [`CoreMemory`] answers with its
/// own per-partition accounts; a NeuronCore's machine with its allocator
/// (`machine::Memories`), so a core has one account of its on-chip memory.
pub trait OnChip {
    /// Refuses `fp` in `space` (SBUF or PSUM) when it does not fit in the free space now.
    fn fits_now(&self, arg: &str, space: Space, fp: Footprint) -> Result<()>;
    /// Refuses `fp` in `space` when it could never fit, whatever is allocated.
    fn fits_ever(&self, arg: &str, space: Space, fp: Footprint) -> Result<()>;
    /// Whether `a` is a live SBUF/PSUM allocation made here.
    fn holds_on_chip(&self, a: &Allocation) -> bool;
}

/// Formats a byte count for error messages: exact bytes plus a binary-prefixed size.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] =
        [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if b >= size {
            let v = format!("{:.2}", b as f64 / size as f64);
            let v = v.trim_end_matches('0').trim_end_matches('.');
            return format!("{b} B ({v} {unit})");
        }
    }
    format!("{b} B")
}

/// One HBM stack: 24 GiB shared by two adjacent physical cores.
#[derive(Debug, Clone)]
pub struct HbmStack {
    owner: u64,
    index: usize,
    capacity: u64,
    used: u64,
    live: BTreeMap<u64, u64>,
    next_id: u64,
}

/// An HBM stack shared between the cores (and later the chip) that reach it.
pub type SharedHbm = Arc<Mutex<HbmStack>>;

impl HbmStack {
    /// Stack `index` (0..4) of a chip, empty. `ValueError` for another index.
    pub fn new(index: usize) -> Result<HbmStack> {
        if index >= HBM_STACKS_PER_CHIP {
            return Err(Error::value(
                "index",
                format!("got {index}; a Trainium2 chip has HBM stacks 0..{HBM_STACKS_PER_CHIP}"),
            ));
        }
        Ok(HbmStack {
            owner: next_owner(),
            index,
            capacity: HBM_STACK_BYTES,
            used: 0,
            live: BTreeMap::new(),
            next_id: 0,
        })
    }

    /// A new stack wrapped for sharing.
    pub fn shared(index: usize) -> Result<SharedHbm> {
        Ok(Arc::new(Mutex::new(HbmStack::new(index)?)))
    }

    /// The stack's index on its chip (0..4).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The die the stack is attached to (stacks 0, 1 on die 0; 2, 3 on die 1).
    pub fn die(&self) -> usize {
        self.index / HBM_STACKS_PER_DIE
    }

    /// The two physical cores that share this stack.
    pub fn cores(&self) -> [usize; CORES_PER_HBM_STACK] {
        let first = self.index * CORES_PER_HBM_STACK;
        std::array::from_fn(|i| first + i)
    }

    /// Capacity in bytes (24 GiB).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes reserved.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes still free.
    pub fn free_bytes(&self) -> u64 {
        self.capacity - self.used
    }

    /// Live allocations.
    pub fn allocations(&self) -> usize {
        self.live.len()
    }

    /// How full it is.
    pub fn usage(&self) -> Usage {
        Usage {
            capacity: self.capacity,
            used: self.used,
            free: self.free_bytes(),
            partitions: 0,
            partition_bytes: 0,
            partition_free: 0,
            allocations: self.live.len(),
        }
    }

    /// Refuses `bytes` that do not fit in the free space; `arg` names the request.
    pub fn check(&self, arg: &str, bytes: u64) -> Result<()> {
        if bytes > self.free_bytes() {
            return Err(Error::capacity(
                arg,
                format!(
                    "{} does not fit in HBM stack {}: {} free of {} capacity ({} used)",
                    fmt_bytes(bytes),
                    self.index,
                    fmt_bytes(self.free_bytes()),
                    fmt_bytes(self.capacity),
                    fmt_bytes(self.used)
                ),
            ));
        }
        Ok(())
    }

    /// Reserves `bytes`.
    pub fn alloc(&mut self, arg: &str, bytes: u64) -> Result<Allocation> {
        self.check(arg, bytes)?;
        let id = self.next_id;
        self.next_id += 1;
        self.used += bytes;
        self.live.insert(id, bytes);
        Ok(Allocation {
            space: Space::Hbm,
            id,
            bytes,
            partition_start: 0,
            partitions: 0,
            partition_bytes: 0,
            stack: self.index,
            owner: self.owner,
        })
    }

    /// Whether `a` was made here and is still live.
    pub fn holds(&self, a: &Allocation) -> bool {
        a.owner == self.owner && a.space == Space::Hbm && self.live.contains_key(&a.id)
    }

    /// Releases allocation `a`. `ValueError` if it is not live here (freed twice, or made by
    /// another stack).
    pub fn free(&mut self, a: &Allocation) -> Result<()> {
        if a.owner != self.owner || a.space != Space::Hbm {
            return Err(foreign(a, &format!("HBM stack {}", self.index)));
        }
        let id = a.id;
        let bytes = self.live.remove(&id).ok_or_else(|| {
            Error::value(
                "allocation",
                format!("HBM allocation {id} is not live on stack {} (already freed?)", self.index),
            )
        })?;
        self.used -= bytes;
        Ok(())
    }
}

/// SBUF or PSUM: 128 partitions, each with its own capacity, used per partition.
#[derive(Debug, Clone)]
pub struct PartitionedMemory {
    owner: u64,
    space: Space,
    partition_capacity: u64,
    used: Vec<u64>,
    live: BTreeMap<u64, (u64, u64, u64)>,
    next_id: u64,
}

impl PartitionedMemory {
    /// An empty SBUF: 128 partitions x 224 KiB.
    pub fn sbuf() -> Self {
        PartitionedMemory::new(Space::Sbuf, SBUF_PARTITIONS, SBUF_PARTITION_BYTES)
    }

    /// An empty PSUM: 128 partitions x 16 KiB.
    pub fn psum() -> Self {
        PartitionedMemory::new(Space::Psum, PSUM_PARTITIONS, PSUM_PARTITION_BYTES)
    }

    fn new(space: Space, partitions: usize, partition_capacity: u64) -> Self {
        PartitionedMemory {
            owner: next_owner(),
            space,
            partition_capacity,
            used: vec![0; partitions],
            live: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// Which memory this is.
    pub fn space(&self) -> Space {
        self.space
    }

    /// Number of partitions (128).
    pub fn partitions(&self) -> u64 {
        self.used.len() as u64
    }

    /// Capacity of one partition in bytes.
    pub fn partition_capacity(&self) -> u64 {
        self.partition_capacity
    }

    /// Total capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.partition_capacity * self.partitions()
    }

    /// Bytes reserved, summed over partitions.
    pub fn used(&self) -> u64 {
        self.used.iter().sum()
    }

    /// Bytes free, summed over partitions.
    pub fn free_bytes(&self) -> u64 {
        self.capacity() - self.used()
    }

    /// Bytes reserved in each partition.
    pub fn partition_used(&self) -> &[u64] {
        &self.used
    }

    /// The most bytes a tensor spanning all partitions could still take in each of them.
    pub fn partition_free(&self) -> u64 {
        self.partition_capacity - self.used.iter().copied().max().unwrap_or(0)
    }

    /// Live allocations.
    pub fn allocations(&self) -> usize {
        self.live.len()
    }

    /// How full it is.
    pub fn usage(&self) -> Usage {
        Usage {
            capacity: self.capacity(),
            used: self.used(),
            free: self.free_bytes(),
            partitions: self.partitions(),
            partition_bytes: self.partition_capacity,
            partition_free: self.partition_free(),
            allocations: self.live.len(),
        }
    }

    fn name(&self) -> &'static str {
        match self.space {
            Space::Psum => "PSUM",
            _ => "SBUF",
        }
    }

    /// Refuses a footprint that could never fit, whatever else is allocated: more partitions
    /// than there are, or more bytes per partition than one holds.
    pub fn check_capacity(&self, arg: &str, fp: Footprint) -> Result<()> {
        if fp.partitions > self.partitions() {
            return Err(Error::capacity(
                arg,
                format!(
                    "spans {} partitions; {} has {}",
                    fp.partitions,
                    self.name(),
                    self.partitions()
                ),
            ));
        }
        if fp.partition_bytes > self.partition_capacity {
            let usable = if self.space == Space::Sbuf {
                format!(
                    "; the compiler lets kernels use {} of it",
                    fmt_bytes(SBUF_USABLE_PARTITION_BYTES)
                )
            } else {
                String::new()
            };
            return Err(Error::capacity(
                arg,
                format!(
                    "{} over {} partitions needs {} per partition; each {} partition holds {}{usable} \
                     ({} in all {} partitions)",
                    fmt_bytes(fp.bytes),
                    fp.partitions,
                    fmt_bytes(fp.partition_bytes),
                    self.name(),
                    fmt_bytes(self.partition_capacity),
                    fmt_bytes(self.capacity()),
                    self.partitions()
                ),
            ));
        }
        Ok(())
    }

    /// The first partition of the lowest run of `fp.partitions` partitions with
    /// `fp.partition_bytes` free in each, if any.
    fn place(&self, fp: Footprint) -> Option<u64> {
        let p = fp.partitions as usize;
        let cap = self.partition_capacity;
        (0..=self.used.len().checked_sub(p)?)
            .find(|&s| self.used[s..s + p].iter().all(|&u| u + fp.partition_bytes <= cap))
            .map(|s| s as u64)
    }

    /// Refuses a footprint that does not fit now (capacity first, then the free space).
    pub fn check(&self, arg: &str, fp: Footprint) -> Result<()> {
        self.check_capacity(arg, fp)?;
        if self.place(fp).is_none() {
            return Err(Error::capacity(
                arg,
                format!(
                    "{} over {} partitions needs {} free on {} consecutive partitions; {} has \
                     at most {} free on every partition ({} used of {} in {} allocations)",
                    fmt_bytes(fp.bytes),
                    fp.partitions,
                    fmt_bytes(fp.partition_bytes),
                    fp.partitions,
                    self.name(),
                    fmt_bytes(self.partition_free()),
                    fmt_bytes(self.used()),
                    fmt_bytes(self.capacity()),
                    self.live.len()
                ),
            ));
        }
        Ok(())
    }

    /// Reserves `fp`; `stack` is recorded in the handle.
    pub fn alloc(&mut self, arg: &str, fp: Footprint, stack: usize) -> Result<Allocation> {
        self.check(arg, fp)?;
        let start = self.place(fp).ok_or_else(|| {
            Error::capacity(arg, "no room (checked above; unreachable)".to_string())
        })?;
        for u in &mut self.used[start as usize..(start + fp.partitions) as usize] {
            *u += fp.partition_bytes;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(id, (start, fp.partitions, fp.partition_bytes));
        Ok(Allocation {
            space: self.space,
            id,
            bytes: fp.partitions * fp.partition_bytes,
            partition_start: start,
            partitions: fp.partitions,
            partition_bytes: fp.partition_bytes,
            stack,
            owner: self.owner,
        })
    }

    /// Whether `a` was made here and is still live.
    pub fn holds(&self, a: &Allocation) -> bool {
        a.owner == self.owner && a.space == self.space && self.live.contains_key(&a.id)
    }

    /// Releases allocation `id`. `ValueError` if it is not live here.
    pub fn free(&mut self, a: &Allocation) -> Result<()> {
        if a.owner != self.owner || a.space != self.space {
            return Err(foreign(a, &format!("this core's {}", self.name())));
        }
        let id = a.id;
        let (start, n, pb) = self.live.remove(&id).ok_or_else(|| {
            Error::value(
                "allocation",
                format!("{} allocation {id} is not live (already freed?)", self.name()),
            )
        })?;
        for u in &mut self.used[start as usize..(start + n) as usize] {
            *u -= pb;
        }
        Ok(())
    }
}

/// The memories one physical core reaches: its (shared) HBM stack, its SBUF and its PSUM.
///
/// A standalone core owns a stack of its own; a chip creates its four stacks and gives each to
/// its two cores with [`CoreMemory::with_hbm`].
#[derive(Debug, Clone)]
pub struct CoreMemory {
    core: usize,
    hbm: SharedHbm,
    sbuf: PartitionedMemory,
    psum: PartitionedMemory,
}

/// Locks a shared stack; a panic elsewhere while it was held cannot leave its counters
/// half-updated (every update is a single step), so a poisoned lock is simply taken over.
pub fn lock(hbm: &SharedHbm) -> MutexGuard<'_, HbmStack> {
    hbm.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl CoreMemory {
    /// The memories of physical core `core` (0..8), with a fresh HBM stack of its own.
    pub fn new(core: usize) -> Result<CoreMemory> {
        let stack = HbmStack::shared(Self::check_core(core)? / CORES_PER_HBM_STACK)?;
        CoreMemory::with_hbm(core, stack)
    }

    /// The memories of core `core` reaching the shared stack `hbm`, which must be the one
    /// that serves it (stack `core / 2`).
    pub fn with_hbm(core: usize, hbm: SharedHbm) -> Result<CoreMemory> {
        Self::check_core(core)?;
        let stack = lock(&hbm).index();
        if stack != core / CORES_PER_HBM_STACK {
            return Err(Error::value(
                "hbm",
                format!("HBM stack {stack} serves cores {:?}, not core {core}", lock(&hbm).cores()),
            ));
        }
        Ok(CoreMemory {
            core,
            hbm,
            sbuf: PartitionedMemory::sbuf(),
            psum: PartitionedMemory::psum(),
        })
    }

    fn check_core(core: usize) -> Result<usize> {
        if core >= CORES_PER_CHIP {
            return Err(Error::value(
                "index",
                format!("core index {core}; a Trainium2 chip has cores 0..{CORES_PER_CHIP}"),
            ));
        }
        Ok(core)
    }

    /// The core's index on its chip.
    pub fn core(&self) -> usize {
        self.core
    }

    /// The die the core sits on (cores 0-3 on die 0).
    pub fn die(&self) -> usize {
        lock(&self.hbm).die()
    }

    /// The shared HBM stack (clone the `Arc` to share it further).
    pub fn hbm(&self) -> &SharedHbm {
        &self.hbm
    }

    /// The state buffer.
    pub fn sbuf(&self) -> &PartitionedMemory {
        &self.sbuf
    }

    /// The partial-sum buffer.
    pub fn psum(&self) -> &PartitionedMemory {
        &self.psum
    }

    /// Reserves `fp` in `space` (for HBM only `fp.bytes` counts).
    pub fn alloc(&mut self, arg: &str, space: Space, fp: Footprint) -> Result<Allocation> {
        match space {
            Space::Hbm => lock(&self.hbm).alloc(arg, fp.bytes),
            Space::Sbuf => {
                let stack = self.core / CORES_PER_HBM_STACK;
                self.sbuf.alloc(arg, fp, stack)
            }
            Space::Psum => {
                let stack = self.core / CORES_PER_HBM_STACK;
                self.psum.alloc(arg, fp, stack)
            }
        }
    }

    /// Whether `a` was made by this core's SBUF or PSUM, or by the HBM stack it reaches, and
    /// is still live (not freed).
    pub fn holds(&self, a: &Allocation) -> bool {
        match a.space {
            Space::Hbm => lock(&self.hbm).holds(a),
            Space::Sbuf => self.sbuf.holds(a),
            Space::Psum => self.psum.holds(a),
        }
    }

    /// Releases `a`. `ValueError` if it was not made by this core's memories (or its stack).
    pub fn free(&mut self, a: &Allocation) -> Result<()> {
        match a.space {
            Space::Hbm => {
                let mut h = lock(&self.hbm);
                if h.index() != a.stack {
                    return Err(Error::value(
                        "allocation",
                        format!(
                            "belongs to HBM stack {}; this core reaches stack {}",
                            a.stack,
                            h.index()
                        ),
                    ));
                }
                h.free(a)
            }
            Space::Sbuf => self.sbuf.free(a),
            Space::Psum => self.psum.free(a),
        }
    }

    /// Refuses a transfer of `fp` into `space` that would not fit in its free space now
    /// (`bytes_in_hbm`: what HBM would hold, the compressed size with inline compression).
    pub fn check_transfer(
        &self, arg: &str, space: Space, fp: Footprint, bytes_in_hbm: u64,
    ) -> Result<()> {
        match space {
            Space::Hbm => lock(&self.hbm).check(arg, bytes_in_hbm),
            Space::Sbuf => self.sbuf.check(arg, fp),
            Space::Psum => self.psum.check(arg, fp),
        }
    }

    /// Refuses a tensor of `fp` that could never be in `space`, whatever is allocated (used
    /// for the source side of a transfer: the data is there already; `bytes_in_hbm`: what HBM
    /// holds, the compressed size with inline compression).
    pub fn check_capacity(
        &self, arg: &str, space: Space, fp: Footprint, bytes_in_hbm: u64,
    ) -> Result<()> {
        match space {
            Space::Hbm => {
                let cap = lock(&self.hbm).capacity();
                if bytes_in_hbm > cap {
                    return Err(Error::capacity(
                        arg,
                        format!(
                            "{} does not fit in an HBM stack of {}",
                            fmt_bytes(bytes_in_hbm),
                            fmt_bytes(cap)
                        ),
                    ));
                }
                Ok(())
            }
            Space::Sbuf => self.sbuf.check_capacity(arg, fp),
            Space::Psum => self.psum.check_capacity(arg, fp),
        }
    }
}

impl OnChip for CoreMemory {
    fn fits_now(&self, arg: &str, space: Space, fp: Footprint) -> Result<()> {
        self.check_transfer(arg, space, fp, fp.bytes)
    }

    fn fits_ever(&self, arg: &str, space: Space, fp: Footprint) -> Result<()> {
        self.check_capacity(arg, space, fp, fp.bytes)
    }

    fn holds_on_chip(&self, a: &Allocation) -> bool {
        a.space != Space::Hbm && self.holds(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn capacities_come_from_the_spec() {
        let m = CoreMemory::new(3).expect("core 3");
        assert_eq!(m.sbuf().capacity(), 28 * MIB);
        assert_eq!(m.sbuf().partition_capacity(), 224 * KIB);
        assert_eq!(m.psum().capacity(), 2 * MIB);
        let h = lock(m.hbm());
        assert_eq!(h.capacity(), 24 * GIB);
        assert_eq!((h.index(), h.die(), h.cores()), (1, 0, [2, 3]));
        drop(h);
        assert_eq!(CoreMemory::new(4).expect("core 4").die(), 1);
        assert!(matches!(CoreMemory::new(8), Err(Error::Value { .. })));
    }

    #[test]
    fn footprints_put_the_first_axis_on_partitions() {
        let f = Footprint::of_shape(&[128, 4096], 2).expect("fits u64");
        assert_eq!((f.bytes, f.partitions, f.partition_bytes), (1 << 20, 128, 8 * KIB));
        let f = Footprint::of_shape(&[1000, 10], 4).expect("fits u64");
        assert_eq!((f.partitions, f.partition_bytes), (128, 40_000u64.div_ceil(128)));
        let f = Footprint::of_shape(&[3, 5], 4).expect("fits u64");
        assert_eq!((f.partitions, f.partition_bytes), (3, 20));
        let f = Footprint::of_shape(&[], 8).expect("fits u64");
        assert_eq!((f.bytes, f.partitions, f.partition_bytes), (8, 128, 1));
        assert!(matches!(Footprint::of_shape(&[1 << 40, 1 << 40], 4), Err(Error::Capacity { .. })));
    }

    #[test]
    fn sbuf_refuses_what_does_not_fit_and_reserves_nothing() {
        let mut m = CoreMemory::new(0).expect("core 0");
        // 40 MiB over 128 partitions = 320 KiB per partition > 224 KiB.
        let err = m.alloc("x", Space::Sbuf, Footprint::of_bytes(40 * MIB)).expect_err("too big");
        let msg = err.to_string();
        assert!(matches!(err, Error::Capacity { .. }), "{msg}");
        assert!(
            msg.starts_with("x: ") && msg.contains("327680 B") && msg.contains("229376 B"),
            "{msg}"
        );
        assert_eq!(m.sbuf().used(), 0);
        // One row of 225 KiB on a single partition is refused; 224 KiB fits exactly.
        let row = |b: u64| Footprint::of_shape(&[1, b], 1).expect("fits");
        assert!(m.alloc("x", Space::Sbuf, row(225 * KIB)).is_err());
        let a = m.alloc("x", Space::Sbuf, row(224 * KIB)).expect("fits exactly");
        assert_eq!((a.partition_start, a.partitions, a.bytes), (0, 1, 224 * KIB));
        // Partition 0 is now full: the next one-partition tensor lands on partition 1, and a
        // 128-partition one no longer fits at all.
        let b = m.alloc("y", Space::Sbuf, row(KIB)).expect("fits");
        assert_eq!(b.partition_start, 1);
        assert!(m.alloc("z", Space::Sbuf, Footprint::of_bytes(128)).is_err());
        m.free(&a).expect("live");
        assert!(matches!(m.free(&a), Err(Error::Value { .. })), "double free");
        let c = m
            .alloc("z", Space::Sbuf, Footprint::of_bytes(128 * 200 * KIB))
            .expect("fits after the free");
        assert_eq!(c.partition_start, 0);
        assert_eq!(m.sbuf().used(), 128 * 200 * KIB + KIB);
        assert_eq!(m.sbuf().partition_free(), 23 * KIB);
    }

    #[test]
    fn psum_holds_two_mib() {
        let mut m = CoreMemory::new(0).expect("core 0");
        let a = m
            .alloc("p", Space::Psum, Footprint::of_shape(&[128, 4096], 4).expect("ok"))
            .expect("2 MiB fits");
        assert_eq!(a.bytes, 2 * MIB);
        assert!(m.alloc("q", Space::Psum, Footprint::of_shape(&[1, 1], 4).expect("ok")).is_err());
        assert_eq!(m.psum().free_bytes(), 0);
    }

    #[test]
    fn an_hbm_stack_is_shared_by_its_two_cores() {
        let stack = HbmStack::shared(2).expect("stack 2");
        let mut c4 = CoreMemory::with_hbm(4, stack.clone()).expect("core 4");
        let mut c5 = CoreMemory::with_hbm(5, stack.clone()).expect("core 5");
        assert!(CoreMemory::with_hbm(3, stack.clone()).is_err());
        let a = c4.alloc("a", Space::Hbm, Footprint::of_bytes(20 * GIB)).expect("fits");
        // The neighbour sees the same stack: 4 GiB left.
        let err =
            c5.alloc("b", Space::Hbm, Footprint::of_bytes(5 * GIB)).expect_err("only 4 GiB left");
        assert!(err.to_string().contains("4294967296 B (4 GiB) free"), "{err}");
        let b = c5.alloc("b", Space::Hbm, Footprint::of_bytes(4 * GIB)).expect("exactly fits");
        assert_eq!(lock(&stack).free_bytes(), 0);
        c5.free(&a).expect("either core may free it");
        c4.free(&b).expect("live");
        assert_eq!(lock(&stack).used(), 0);
        let mut other = CoreMemory::new(0).expect("core 0");
        let x = other.alloc("x", Space::Hbm, Footprint::of_bytes(1)).expect("fits");
        assert!(c4.free(&x).is_err(), "stack 0's allocation is not stack 2's");
        // A request of 10^15 bytes is refused at once.
        assert!(matches!(
            other.alloc("x", Space::Hbm, Footprint::of_bytes(1_000_000_000_000_000)),
            Err(Error::Capacity { .. })
        ));
    }

    #[test]
    fn transfers_are_checked_against_free_space_and_sources_against_capacity() {
        let mut m = CoreMemory::new(0).expect("core 0");
        let big = Footprint::of_bytes(40 * MIB);
        assert!(m.check_transfer("x", Space::Sbuf, big, big.bytes).is_err());
        assert!(m.check_capacity("x", Space::Sbuf, big, big.bytes).is_err());
        let half = Footprint::of_bytes(16 * MIB);
        m.check_transfer("x", Space::Sbuf, half, half.bytes).expect("16 MiB fits");
        m.alloc("x", Space::Sbuf, half).expect("fits");
        assert!(m.check_transfer("x", Space::Sbuf, half, half.bytes).is_err());
        m.check_capacity("x", Space::Sbuf, half, half.bytes)
            .expect("a source is checked against capacity only");
        // HBM holds what crosses the wire (compressed size).
        m.check_transfer("x", Space::Hbm, Footprint::of_bytes(30 * GIB), 20 * GIB)
            .expect("20 GiB compressed fits");
        assert!(m
            .check_transfer("x", Space::Hbm, Footprint::of_bytes(30 * GIB), 30 * GIB)
            .is_err());
    }

    #[test]
    fn an_allocation_is_freed_only_by_the_memory_that_made_it() {
        // Two standalone cores: both have an HBM "stack 0" and allocations numbered from 0.
        let (mut a, mut b) = (CoreMemory::new(0).expect("a"), CoreMemory::new(0).expect("b"));
        for space in Space::ALL {
            let fp = Footprint::of_bytes(128 * KIB);
            let mine = a.alloc("x", space, fp).expect("fits");
            let theirs = b.alloc("x", space, fp).expect("fits");
            assert_eq!((mine.id, mine.stack), (theirs.id, theirs.stack));
            let err = b.free(&mine).expect_err("foreign");
            assert!(err.to_string().contains("another core's memory"), "{err}");
            // b's own allocation is untouched, and frees once.
            b.free(&theirs).expect("own");
            assert!(b.free(&theirs).is_err());
            a.free(&mine).expect("own");
        }
    }
}
