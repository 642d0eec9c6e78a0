//! The machine's memories as bytes: SBUF (128 partitions x 224 KiB), PSUM (128 partitions x
//! 16 KiB = 8 banks of 2 KiB), and HBM tensors (one buffer each); the tensor table; and which
//! bytes have been written (so a read of never-written memory is an error naming the tensor).
//! Where SBUF and PSUM tensors are placed is the allocator's (`machine/alloc.rs`).
//!
//! Sources: SBUF 128 x 224 KiB, of which the compiler allocates 212,984 B per
//! partition (\[S1\]\[S24\]); PSUM 128 x 8 banks x 2 KiB (\[S1\]\[S2\]).
//!
//! # Layout
//!
//! Partition `p` of SBUF lives at host offset `p * (224 KiB + 7744 B)`: the skew keeps the 128
//! partitions of a tile from landing on the same host cache sets (a stride that is a multiple of
//! 4 KiB would), which is what makes small instructions fast. It is invisible to
//! the model: addresses are per-partition byte offsets, as on the hardware.
//!
//! # Initialisation
//!
//! Per memory, a map of disjoint byte ranges to the set of partitions (a `u128` mask) whose bytes
//! there have been written. A tensor whose whole footprint is written is flagged, so the usual
//! case (reading a tile that was filled before) costs one flag test.

use std::collections::BTreeMap;

use crate::memory::Space;
use crate::spec::{PSUM_PARTITIONS, PSUM_PARTITION_BYTES, SBUF_PARTITIONS, SBUF_PARTITION_BYTES};
use crate::{Error, Result};

use super::dtype::Dtype;
use super::tile::{partition_mask, TensorId, Tile, MAX_FREE_DIMS};

/// Host-layout skew between partitions (see the module doc): partition strides of
/// 224 KiB + 121 x 64 B put consecutive partitions 633 cache lines apart modulo 1024 (about the
/// golden ratio of a 64 KiB way), so a tile's rows spread evenly over L1 and L2 sets.
const SKEW: usize = 121 * 64;
/// Allocation alignment in bytes (our choice; see the allocator's doc, `machine/alloc.rs`).
pub const ALIGN_BYTES: u64 = 64;

/// Host alignment of SBUF's and PSUM's first byte: a huge page, so every partition row is as
/// aligned as its address (a 64-byte-aligned tile row is whole cache lines: the allocator's
/// alignment holds on the host too, where the host allocator's 16-byte offset split every vector
/// load of the element-wise fast paths across two lines) and the whole memory is eligible for
/// huge pages from partition 0.
const ON_CHIP_ALIGN: usize = 2 << 20;
/// Bytes above glibc's largest mmap threshold (`DEFAULT_MMAP_THRESHOLD_MAX`, 32 MiB on 64-bit
/// hosts): what [`ByteMem::new`] asks for at least for memories of more than half of it.
const MMAP_FLOOR: usize = (32 << 20) + 4096;
/// Host alignment of an HBM buffer's first byte: a cache line.
const HBM_ALIGN: usize = 64;

/// One partitioned byte memory (SBUF or PSUM), or one HBM buffer (a single "partition").
///
/// Its bytes are reached only through its methods, each of which first waits for a copy the
/// duo helper may still be making into or out of it ([`copy_rows_detached`]), as its drop
/// does: the fence that lets a copy run while the caller goes on.
#[derive(Debug)]
pub(crate) struct ByteMem {
    /// Backing store; `u32` words so that 4-byte elements are aligned. The memory is the
    /// `len` words from `lead` on (aligned as [`ByteMem::new`] was asked).
    words: Vec<u32>,
    lead: usize,
    len: usize,
    /// Bytes between partitions in `words`.
    pub stride: usize,
    /// The host alignment of the memory's first byte (a power of two).
    align: usize,
    /// A copy into or out of these bytes that may still be running.
    pending: Option<std::sync::Arc<Pending>>,
}

/// A copy of rows between two memories run by the duo helper ([`copy_rows_detached`]): both
/// memories hold it, and wait for it before any use of their bytes.
pub(crate) struct Pending {
    dst: *mut u8,
    src: *const u8,
    moves: Vec<(usize, usize, usize)>,
    done: std::sync::atomic::AtomicBool,
    /// The process that posted it: a process forked meanwhile has no helper to finish it.
    pid: u32,
}

// SAFETY: the pointers are to the words of two memories that hold this copy, and neither
// touches its bytes (nor frees them) before `done` (`ByteMem::settle`); the helper runs the
// copy once (`run`), or, in a forked child, the waiter does, as the only thread there.
unsafe impl Send for Pending {}
unsafe impl Sync for Pending {}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("moves", &self.moves.len()).finish_non_exhaustive()
    }
}

impl Pending {
    /// Makes the copy (every move checked in bounds when it was posted).
    fn run(&self) {
        for &(t, f, l) in &self.moves {
            // SAFETY: `copy_rows_detached` checked `t + l` and `f + l` against the two
            // memories' lengths, which are different allocations; nothing else touches them
            // until `done`.
            unsafe { std::ptr::copy_nonoverlapping(self.src.add(f), self.dst.add(t), l) };
        }
    }

    /// Returns once the copy is made.
    fn wait(&self) {
        use std::sync::atomic::Ordering;
        if self.done.load(Ordering::Acquire) {
            return;
        }
        if self.pid != std::process::id() {
            // A forked child: the helper that was to copy is the parent's. The copy again,
            // whole (its source is unchanged: it waits for this copy too).
            self.run();
            self.done.store(true, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while !self.done.load(Ordering::Acquire) {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(16) {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }
}

impl ByteMem {
    /// `partitions` of `stride` bytes, zeroed, the first byte at a host address that is a
    /// multiple of `align` (a power of two).
    fn new(arg: &str, what: &str, partitions: usize, stride: usize, align: usize) -> Result<Self> {
        let len = (partitions * stride).div_ceil(4);
        // SBUF (30 MB) asks for a little more than glibc's largest mmap threshold (32 MiB), so
        // that it is always mapped fresh (zero pages the kernel fills as they are touched),
        // never a recycled heap block that calloc clears whole: once one SBUF is freed, glibc
        // raises its threshold to that size, and creating a Chip's eight cores took 350-600 ms
        // instead of 2 ms. The extra is address space, never touched.
        let floor = if len * 4 > MMAP_FLOOR / 2 { MMAP_FLOOR / 4 } else { 0 };
        let words = crate::host::zeroed_vec::<u32>(arg, what, (len + align / 4).max(floor))?;
        Ok(Self::aligned(words, len, stride, align))
    }

    /// One partition holding a copy of `data`, the first byte at a host address that is a
    /// multiple of `align` (a power of two): [`ByteMem::new`] then the copy, except that a
    /// buffer from the heap is not cleared first (calloc clears a recycled block whole, and
    /// the copy writes every byte again: a kernel that does nothing with two 8 MiB inputs took
    /// 2.2-2.3 ms, 1.96 without the clearing). Only the alignment lead and the last word's
    /// padding are zeroed. A buffer over half of
    /// glibc's largest mmap threshold takes [`ByteMem::new`]'s fresh pages, which are clear
    /// already.
    fn holding(arg: &str, what: &str, data: &[u8], align: usize) -> Result<Self> {
        let len = data.len().div_ceil(4);
        if len * 4 > MMAP_FLOOR / 2 {
            let mut m = Self::new(arg, what, 1, data.len(), align)?;
            // Fresh pages: the first write to each is the kernel clearing it, so the duo
            // helper copies the second half meanwhile (a kernel's inputs, hundreds of MiB).
            let dst = &mut m.bytes_mut()[..data.len()];
            let half = (data.len() / 2).next_multiple_of(4096).min(data.len());
            let ((lo, hi), (dlo, dhi)) = (dst.split_at_mut(half), data.split_at(half));
            crate::engine::duo_join(|| lo.copy_from_slice(dlo), || hi.copy_from_slice(dhi));
            return Ok(m);
        }
        let total = len + align / 4;
        let mut words: Vec<u32> = Vec::new();
        crate::host::reserve(&mut words, total, arg, what)?;
        // Where `aligned` will place the memory: the same pointer, the same bound.
        let lead = words.as_ptr().align_offset(align).min(total - len);
        words.resize(lead, 0);
        let spare = words.spare_capacity_mut();
        let dst = spare.as_mut_ptr().cast::<u8>();
        // SAFETY: `spare` holds `total - lead >= len` words, that is at least `len * 4 >=
        // data.len()` bytes, disjoint from `data` (a fresh allocation); the copy and the zeroed
        // padding together write all `len * 4` bytes of the first `len` spare words, which
        // `set_len` then counts as initialised (any bit pattern is a valid u32).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            std::ptr::write_bytes(dst.add(data.len()), 0, len * 4 - data.len());
            words.set_len(lead + len);
        }
        words.resize(total, 0);
        Ok(Self::aligned(words, len, data.len(), align))
    }

    /// A memory of no bytes (what a dropped machine's memory is left as when the pool takes
    /// it).
    fn empty() -> Self {
        ByteMem { words: Vec::new(), lead: 0, len: 0, stride: 1, align: 4, pending: None }
    }

    /// The memory of `len` words inside `words` (`align / 4` more than `len`), at its first
    /// `align`-aligned word.
    fn aligned(mut words: Vec<u32>, len: usize, stride: usize, align: usize) -> Self {
        let lead = words.as_ptr().align_offset(align).min(words.len() - len);
        // SBUF's partitions lie about 232 KiB apart: every row an instruction touches is on
        // its own 4 KiB page, and page translations, not bytes, bound small instructions.
        crate::host::advise_huge_pages(&mut words[lead..lead + len]);
        ByteMem { words, lead, len, stride, align, pending: None }
    }

    /// Waits for a copy into or out of this memory ([`Pending`]) to be made.
    #[inline]
    fn settle(&self) {
        if let Some(p) = &self.pending {
            p.wait();
        }
    }

    /// [`ByteMem::settle`], then forgets the copy.
    #[inline]
    fn settle_mut(&mut self) {
        if let Some(p) = self.pending.take() {
            p.wait();
        }
    }

    /// The memory's words.
    #[inline]
    fn view(&self) -> &[u32] {
        self.settle();
        &self.words[self.lead..self.lead + self.len]
    }

    /// All bytes (host layout).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        let w = self.view();
        // SAFETY: `u32` words viewed as their bytes: same allocation, every byte initialised.
        unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 4) }
    }

    /// All bytes (host layout), mutable.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.settle_mut();
        let w = &mut self.words[self.lead..self.lead + self.len];
        // SAFETY: as in `bytes`; the unique borrow of `words` makes this view unique.
        unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), w.len() * 4) }
    }

    /// All of the memory as float32 words, mutable: on a little-endian host, the floats its
    /// bytes hold at every multiple of 4.
    pub fn f32_words_mut(&mut self) -> &mut [f32] {
        self.settle_mut();
        let w = &mut self.words[self.lead..self.lead + self.len];
        // SAFETY: `u32` words viewed as as many `f32`: same size and alignment, every bit
        // pattern a valid `f32`; the unique borrow of `words` makes this view unique.
        unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<f32>(), w.len()) }
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
                std::slice::from_raw_parts(self.view().as_ptr().cast::<u16>(), self.len * 2)
            }),
            _ => Buffer::U32(self.view()),
        }
    }
}

impl Clone for ByteMem {
    /// A copy at its own aligned place (a derived clone would keep the offset of the original's
    /// alignment in a fresh allocation).
    fn clone(&self) -> Self {
        let mut m = Self::aligned(vec![0; self.words.len()], self.len, self.stride, self.align);
        m.bytes_mut().copy_from_slice(self.bytes());
        m
    }
}

impl Drop for ByteMem {
    /// Frees the words only once no copy into or out of them runs.
    fn drop(&mut self) {
        self.settle();
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
        let found = self.segs.range(..at).next_back().map(|(&s, &(e, m))| (s, e, m));
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
        self.segs.range(lo..hi).map(|(&s, &(e, m))| (s, e, m)).collect()
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
        let keys: Vec<(u64, u64, u128)> =
            self.segs.range(start..=hi).map(|(&s, &(e, m))| (s, e, m)).collect();
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
        let before = self.segs.range(..=lo).next_back().map(|(&s, &(e, m))| (s, e, m));
        let iter =
            before.into_iter().chain(self.segs.range(lo + 1..hi).map(|(&s, &(e, m))| (s, e, m)));
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

impl Uninitialized {
    /// The byte new SBUF and PSUM hold under this policy.
    fn fill(self) -> u8 {
        match self {
            Uninitialized::Error => 0,
            Uninitialized::Nan => 0xFF,
        }
    }
}

/// No byte address covered yet (see `Memories::touched`).
const UNTOUCHED: (u64, u64) = (u64::MAX, 0);

/// SBUF and PSUM memories of machines that are gone, kept for the next machines of the process
/// (a host detail, invisible to the model). A new machine's 30 MB would otherwise be fresh
/// pages that the host faults in and clears as its first instructions touch them, about
/// 20 ms for the 2048^3 matmul tutorial, and the host allocator clears a recycled block whole
/// (1 ms for a kernel of two tiles). A pooled memory is reset to its new policy's byte where
/// the last machine placed tensors (every byte it wrote lies in one), or whole if that
/// machine's byte was another.
mod pool {
    use super::{ByteMem, Space};
    use crate::Result;
    use std::sync::Mutex;

    /// Memories kept per kind: enough for the machines of a two-core launch and a few threads.
    const KEEP: usize = 4;

    /// A memory given back: its kind, the byte it was made with, the addresses it covered.
    struct Kept {
        space: Space,
        fill: u8,
        touched: (u64, u64),
        mem: ByteMem,
    }

    static POOL: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

    fn pool() -> std::sync::MutexGuard<'static, Vec<Kept>> {
        // A panic elsewhere while the lock was held leaves only whole entries: keep using it.
        POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A memory of `space` all of whose bytes are `fill`: a kept one reset, or `make()`'s
    /// (zeroed) filled.
    pub(super) fn take(
        space: Space, fill: u8, make: impl FnOnce() -> Result<ByteMem>,
    ) -> Result<ByteMem> {
        let kept = {
            let mut p = pool();
            let i = p.iter().rposition(|k| k.space == space);
            i.map(|i| p.swap_remove(i))
        };
        let Some(k) = kept else {
            let mut m = make()?;
            if fill != 0 {
                m.bytes_mut().fill(fill);
            }
            return Ok(m);
        };
        let mut m = k.mem;
        let (lo, hi) = k.touched;
        if k.fill != fill {
            m.bytes_mut().fill(fill);
        } else if lo < hi {
            let (stride, lo, hi) = (m.stride, lo as usize, hi as usize);
            for row in m.bytes_mut().chunks_mut(stride) {
                let n = row.len();
                row[lo.min(n)..hi.min(n)].fill(fill);
            }
        }
        Ok(m)
    }

    /// Keeps `mem` (its bytes `fill` outside `touched`) for a later machine, if there is room.
    pub(super) fn give(space: Space, fill: u8, touched: (u64, u64), mem: ByteMem) {
        if mem.len == 0 {
            return;
        }
        let mut p = pool();
        if p.iter().filter(|k| k.space == space).count() < KEEP {
            p.push(Kept { space, fill, touched, mem });
        }
    }
}

impl Drop for Memories {
    fn drop(&mut self) {
        let fill = self.uninitialized.fill();
        let sbuf = std::mem::replace(&mut self.sbuf, ByteMem::empty());
        let psum = std::mem::replace(&mut self.psum, ByteMem::empty());
        pool::give(Space::Sbuf, fill, self.touched[0], sbuf);
        pool::give(Space::Psum, fill, self.touched[1], psum);
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
    /// Its bytes were handed out for writing since it was made (HBM only: by an instruction, a
    /// host write or a spill), so they may differ from the data it was made with.
    pub(crate) stored: bool,
    /// The instruction that last wrote each byte (HBM only, once [`Memories::track_writers`]
    /// asked for it; [`NO_WRITER`]: none, or a write outside any instruction).
    pub(crate) writers: Option<Vec<u32>>,
    /// What this tensor is a copy of, if anything ([`CopyOf`]): an SBUF tensor that one
    /// `dma_copy` wrote whole from HBM, or the spill slot such a tensor was moved to.
    pub(crate) copy_of: Option<CopyOf>,
    /// HBM only: its bytes are exactly those SBUF tensor `.0` held, partition after partition,
    /// when SBUF's write count ([`SbufWrites`]) was `.1` (a spill slot just stored to or
    /// reloaded from): storing that tensor again, unwritten since, copies no byte
    /// ([`Memories::spill_bytes`]). Any other write to it ends the claim.
    pub(crate) holds: Option<(TensorId, u64)>,
    /// HBM only, a spill slot: its bytes were not copied in, since the tensor stored there
    /// was a whole copy of an unwritten HBM region ([`CopyOf`]) whose rows these are (byte
    /// offset of each partition's row in the source): they are taken from the source when
    /// reloaded, and copied in before the source is written, freed or handed over, or the
    /// slot itself is written ([`Memories::fill_lazy`]). Listed in [`Memories::lazy`].
    pub(crate) lazy: Option<(TensorId, Vec<usize>)>,
}

/// An SBUF tensor's whole contents loaded by one `dma_copy` from `src`, a region of an HBM
/// tensor no one has written since it was made (a kernel's input, its weights): when the
/// tensor must make room it need not be stored, since loading `src` again gives the same bytes
/// (the compiler reloads such data instead of spilling it: docs/nki.md, current-dialect
/// liveness). `stamp`: SBUF's write count ([`SbufWrites`]) right after the load; a write to the
/// tensor's bytes since ends the claim.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CopyOf {
    pub(crate) src: Tile,
    pub(crate) stamp: u64,
}

/// [`TensorInfo::writers`] of a byte no instruction wrote.
pub const NO_WRITER: u32 = u32::MAX;

impl TensorInfo {
    /// An HBM tensor's bytes are handed out for writing: they may differ from its data
    /// ([`TensorInfo::stored`]) and from what a spilled tensor held ([`TensorInfo::holds`];
    /// [`Memories::spill_bytes`] sets that claim again after its own write).
    fn note_hbm_write(&mut self) {
        self.stored = true;
        self.holds = None;
    }

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
/// `t` when it is an HBM tensor, else `ValueError` on `tile`: "`what`; tensor .. is in ..".
fn hbm_only<'a>(t: &'a TensorInfo, what: &str) -> Result<&'a TensorInfo> {
    if t.space != Space::Hbm {
        return Err(Error::value(
            "tile",
            format!("{what}; tensor {} is in {}", t.name, t.space.name()),
        ));
    }
    Ok(t)
}

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

/// A live allocation of SBUF or PSUM, for the allocator (`machine/alloc.rs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Live {
    pub(super) slot: u32,
    pub(super) start_partition: u32,
    pub(super) partitions: u32,
    pub(super) address: u64,
    pub(super) bytes: u64,
    /// Placed by the kernel (NKI's explicit allocation): may share bytes with other such
    /// tensors, as the kernel's placements do on the chip.
    pub(super) overlay: bool,
}

/// The machine's memories and tensor table.
#[derive(Debug, Clone)]
pub struct Memories {
    /// SBUF's bytes: private, so that every way to write them is one of this module's methods,
    /// each of which notes what it writes ([`SbufWrites`]).
    sbuf: ByteMem,
    pub(crate) psum: ByteMem,
    pub(crate) sbuf_init: InitMap,
    pub(crate) psum_init: InitMap,
    /// Tensor slots (freed slots are reused with a new generation).
    pub(crate) tensors: Vec<Option<TensorInfo>>,
    generations: Vec<u32>,
    pub(super) free_slots: Vec<u32>,
    pub(super) live_sbuf: Vec<Live>,
    pub(super) live_psum: Vec<Live>,
    /// Slots of tensors freed while the matmul queue still uses their bytes
    /// ([`Memories::retire`]): gone as tensors, their bytes taken until [`Memories::reclaim`].
    pub(super) retired: Vec<u32>,
    /// Tensors whose storage a front end gave up ([`Memories::give_up`]): the error (message,
    /// rule) a later use of one of their tiles is.
    pub(super) given_up: Vec<(TensorId, String, &'static str)>,
    /// The spill slots whose bytes are still their source's ([`TensorInfo::lazy`]).
    pub(crate) lazy: Vec<TensorId>,
    /// Policy for never-written memory.
    pub uninitialized: Uninitialized,
    /// This machine's number (tiles carry it).
    pub(super) machine: u32,
    /// The view of the whole of PSUM that host-issued instructions address by bank
    /// (`machine::host`), once made.
    pub(crate) psum_view: Option<TensorId>,
    /// SBUF tensors without an address go to the highest free address, not the lowest
    /// ([`Machine::set_sbuf_fit_from_top`](super::Machine::set_sbuf_fit_from_top)).
    pub(crate) sbuf_from_top: bool,
    /// The byte addresses `[lo, hi)` that SBUF's and PSUM's tensors have covered, in any
    /// partition, since the memory was made (empty: `lo > hi`): nothing outside them has been
    /// written, so a memory given back to the pool resets only these bytes.
    pub(super) touched: [(u64, u64); 2],
    /// When SBUF's bytes were last written, by column ([`SbufWrites`]).
    pub(crate) sbuf_writes: SbufWrites,
}

/// When each column of SBUF's bytes (the same byte addresses in every partition, 64 at a
/// time: the allocation alignment, so that two tensors never share one) was last written, as
/// a count of writes: whoever read some bytes can tell whether they may have changed since.
/// Coarse by design (any partition, whole columns): it may say that bytes changed which did
/// not, never that bytes did not change which did. Every mutable way into SBUF's bytes is a
/// method of [`Memories`] (its `sbuf` is private) that notes what it writes
/// ([`Memories::mem_mut`], [`Memories::src_dst`], [`Memories::split_on_chip`],
/// [`Memories::fill_on_chip`], a spill's reload).
#[derive(Debug, Clone, Default)]
pub(crate) struct SbufWrites {
    /// Writes noted so far.
    seq: u64,
    /// Per column: the write count after its last write (0: never written).
    stamps: Vec<u64>,
    /// The write count after the last write of unknown extent (all columns).
    all: u64,
}

impl SbufWrites {
    /// Bytes per column.
    const COLUMN: u64 = ALIGN_BYTES;

    /// The writes noted so far.
    pub(crate) fn now(&self) -> u64 {
        self.seq
    }

    /// Notes a write of bytes `[lo, hi)` of some partitions (`None`: of unknown extent).
    pub(crate) fn note(&mut self, span: Option<(u64, u64)>) {
        self.seq += 1;
        let Some((lo, hi)) = span.filter(|&(lo, hi)| hi <= SBUF_PARTITION_BYTES && lo < hi) else {
            if span.is_none_or(|(lo, hi)| lo < hi) {
                self.all = self.seq;
            }
            return;
        };
        let (first, last) = ((lo / Self::COLUMN) as usize, ((hi - 1) / Self::COLUMN) as usize);
        if self.stamps.len() <= last {
            self.stamps.resize(last + 1, 0);
        }
        self.stamps[first..=last].fill(self.seq);
    }

    /// Whether bytes `[lo, hi)` (`None`: of unknown extent) may have been written after the
    /// count was `at`.
    pub(crate) fn since(&self, span: Option<(u64, u64)>, at: u64) -> bool {
        if self.all > at {
            return true;
        }
        let Some((lo, hi)) = span else {
            return self.seq > at;
        };
        if lo >= hi {
            return false;
        }
        let (first, last) = ((lo / Self::COLUMN) as usize, ((hi - 1) / Self::COLUMN) as usize);
        let end = last.min(self.stamps.len().saturating_sub(1));
        first < self.stamps.len() && self.stamps[first..=end].iter().any(|&s| s > at)
    }
}

/// The byte addresses `[lo, hi)` within a partition that an on-chip tile's elements lie in
/// (all of them, with what lies between); `None` when they cannot be told (out of range).
pub(crate) fn byte_span(t: &Tile) -> Option<(u64, u64)> {
    if t.free_size_u128() == 0 {
        return Some((0, 0));
    }
    // As `check_tile` bounds an on-chip tile.
    let (esize, offset, (flo, fhi)) = (t.dtype.size() as i128, t.offset as i128, t.free_extent());
    let (lo, hi) = (offset + flo * esize, offset + (fhi + 1) * esize);
    Some((u64::try_from(lo).ok()?, u64::try_from(hi).ok()?))
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
        let fill = uninitialized.fill();
        let m = Memories {
            sbuf: pool::take(Space::Sbuf, fill, || {
                ByteMem::new("sbuf", "SBUF", SBUF_PARTITIONS, sbuf_size + SKEW, ON_CHIP_ALIGN)
            })?,
            psum: pool::take(Space::Psum, fill, || {
                ByteMem::new("psum", "PSUM", PSUM_PARTITIONS, psum_size + SKEW, ON_CHIP_ALIGN)
            })?,
            sbuf_init: InitMap::default(),
            psum_init: InitMap::default(),
            tensors: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            live_sbuf: Vec::new(),
            live_psum: Vec::new(),
            retired: Vec::new(),
            given_up: Vec::new(),
            lazy: Vec::new(),
            uninitialized,
            machine: NEXT_MACHINE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            psum_view: None,
            sbuf_from_top: false,
            touched: [UNTOUCHED; 2],
            sbuf_writes: SbufWrites::default(),
        };
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
            .ok_or_else(|| match self.given_up.iter().rev().find(|g| g.0 == id) {
                Some((_, message, rule)) => {
                    Error::capacity("tile", message.clone()).with_rule(rule)
                }
                None => Error::value(
                    "tile",
                    format!("tensor #{} was freed (its tiles are no longer valid)", id.slot),
                ),
            })
    }

    /// The handle of slot `slot` in its current generation.
    pub(super) fn id(&self, slot: u32) -> TensorId {
        TensorId { machine: self.machine, slot, generation: self.generations[slot as usize] }
    }

    pub(crate) fn tensor_mut(&mut self, id: TensorId) -> Result<&mut TensorInfo> {
        self.tensor(id)?;
        self.tensors[id.slot as usize]
            .as_mut()
            .ok_or_else(|| Error::value("tile", "tensor was freed"))
    }

    pub(super) fn new_slot(&mut self) -> u32 {
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
    pub(super) fn elements(arg: &str, shape: &[usize]) -> Result<u64> {
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
                return Err(Error::shape(arg, format!("shape {shape:?} has a zero dimension")));
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
    pub(super) fn put_on_chip(
        &mut self, slot: u32, name: &str, space: Space, dtype: Dtype, shape: &[usize],
        (start_partition, partitions, address, bytes): (u32, u32, u64, u64),
    ) {
        let t = &mut self.touched[usize::from(space == Space::Psum)];
        *t = (t.0.min(address), t.1.max(address.saturating_add(bytes)));
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
            stored: false,
            writers: None,
            copy_of: None,
            holds: None,
            lazy: None,
        });
    }

    /// Creates an HBM tensor holding `data` (little-endian packed elements of `dtype`, C order),
    /// or uninitialised when `data` is `None`.
    pub fn hbm_tensor(
        &mut self, name: &str, shape: &[usize], dtype: Dtype, data: Option<&[u8]>,
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
        let mut init = InitMap::default();
        let mem = match data {
            Some(d) => {
                init.mark(1, 0, bytes);
                ByteMem::holding("shape", name, d, HBM_ALIGN)?
            }
            None => {
                let mut mem = ByteMem::new("shape", name, 1, bytes as usize, HBM_ALIGN)?;
                if self.uninitialized == Uninitialized::Nan {
                    mem.bytes_mut().fill(0xFF);
                }
                mem
            }
        };
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
            stored: false,
            writers: None,
            copy_of: None,
            holds: None,
            lazy: None,
        });
        Ok(self.id(slot))
    }

    /// Hands HBM tensor `id`'s buffer over and frees the tensor (its tiles invalid from now
    /// on): the buffer's words and the tensor's bytes' range in them.
    pub(crate) fn take_hbm(&mut self, id: TensorId) -> Result<(Vec<u32>, std::ops::Range<usize>)> {
        self.fill_lazy(id, true, true);
        let t = self.tensor_mut(id)?;
        let bytes = t.bytes as usize;
        let mem = t.hbm.take().ok_or_else(|| {
            Error::value("tile", format!("tensor {} is not an HBM tensor", t.name))
        })?;
        self.free(id)?;
        let mut mem = mem;
        mem.settle_mut();
        let lo = mem.lead * 4;
        Ok((std::mem::take(&mut mem.words), lo..lo + bytes))
    }

    /// SBUF's bytes, to read.
    pub(crate) fn sbuf(&self) -> &ByteMem {
        &self.sbuf
    }

    /// SBUF's bytes to read beside PSUM's to write (a wave of matmuls computed into PSUM).
    pub(crate) fn sbuf_and_psum_mut(&mut self) -> (&ByteMem, &mut ByteMem) {
        (&self.sbuf, &mut self.psum)
    }

    /// Fills bytes `[address, address + bytes)` of partitions `start..start + partitions` of
    /// `space`'s memory with `byte` (a new tensor's never-written fill), noting an SBUF write.
    pub(super) fn fill_on_chip(
        &mut self, space: Space, start: u32, partitions: usize, address: u64, bytes: u64, byte: u8,
    ) {
        let mem = match space {
            Space::Sbuf => {
                self.sbuf_writes.note(Some((address, address + bytes)));
                &mut self.sbuf
            }
            _ => &mut self.psum,
        };
        for q in start as usize..start as usize + partitions {
            let o = mem.at(q, address as usize);
            mem.bytes_mut()[o..o + bytes as usize].fill(byte);
        }
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
            Space::Sbuf => {
                self.sbuf_writes.note(byte_span(tile));
                &mut self.sbuf
            }
            Space::Psum => &mut self.psum,
            Space::Hbm => {
                if !self.lazy.is_empty() {
                    self.fill_lazy(tile.tensor, true, true);
                }
                match self.tensors[tile.tensor.slot as usize].as_mut().and_then(|t| {
                    t.note_hbm_write();
                    t.hbm.as_mut()
                }) {
                    Some(m) => m,
                    None => &mut self.psum,
                }
            }
        }
    }

    /// The memory of `s` and the memory of `d`, to be written, when they are different
    /// memories (`None` for two tiles of one memory, or a tile whose tensor has no storage).
    /// Both mutable: a copy left to the duo helper marks both ([`copy_rows_detached`]); the
    /// source's bytes are only read.
    pub(crate) fn src_dst(&mut self, s: &Tile, d: &Tile) -> Option<(&mut ByteMem, &mut ByteMem)> {
        fn hbm(t: &mut Option<TensorInfo>) -> Option<&mut ByteMem> {
            t.as_mut().and_then(|t| t.hbm.as_mut())
        }
        // Only the destination is written (a source read through `hbm` is not `stored`).
        if d.space == Space::Sbuf {
            self.sbuf_writes.note(byte_span(d));
        }
        if !self.lazy.is_empty() {
            if d.space == Space::Hbm {
                self.fill_lazy(d.tensor, true, true);
            }
            if s.space == Space::Hbm {
                self.fill_lazy(s.tensor, false, true);
            }
        }
        if d.space == Space::Hbm {
            if let Some(Some(t)) = self.tensors.get_mut(d.tensor.slot as usize) {
                t.note_hbm_write();
            }
        }
        match (s.space, d.space) {
            (Space::Sbuf, Space::Psum) => Some((&mut self.sbuf, &mut self.psum)),
            (Space::Psum, Space::Sbuf) => Some((&mut self.psum, &mut self.sbuf)),
            (Space::Hbm, Space::Hbm) => {
                let (i, j) = (s.tensor.slot as usize, d.tensor.slot as usize);
                if i == j || i.max(j) >= self.tensors.len() {
                    return None;
                }
                let (lo, hi) = self.tensors.split_at_mut(i.max(j));
                let (a, b) = (hbm(&mut lo[i.min(j)])?, hbm(&mut hi[0])?);
                Some(if i < j { (a, b) } else { (b, a) })
            }
            (Space::Hbm, _) => {
                let src = hbm(self.tensors.get_mut(s.tensor.slot as usize)?)?;
                let dst = if d.space == Space::Sbuf { &mut self.sbuf } else { &mut self.psum };
                Some((src, dst))
            }
            (_, Space::Hbm) => {
                let dst = hbm(self.tensors.get_mut(d.tensor.slot as usize)?)?;
                let src = if s.space == Space::Sbuf { &mut self.sbuf } else { &mut self.psum };
                Some((src, dst))
            }
            _ => None,
        }
    }

    /// The bytes of on-chip memory `dst`'s (mutable, for `dst` to be written) and of the other
    /// on-chip memory.
    pub(crate) fn split_on_chip(&mut self, dst: &Tile) -> (&mut [u8], &[u8]) {
        match dst.space {
            Space::Psum => (self.psum.bytes_mut(), self.sbuf.bytes()),
            _ => {
                self.sbuf_writes.note(byte_span(dst));
                (self.sbuf.bytes_mut(), self.psum.bytes())
            }
        }
    }

    /// Checks that `tile` is a live tensor's, lies inside it, and returns its per-partition
    /// byte range `[lo, hi)` (relative to the partition / buffer start).
    pub fn check_tile(&self, arg: &str, tile: &Tile) -> Result<(u64, u64)> {
        let t = self.tensor(tile.tensor).map_err(|e| e.renamed("tile", arg))?;
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
            return Err(Error::shape(arg, format!("an empty tile of tensor {}", t.name)));
        }
        // Exact, in 128-bit arithmetic: no user size, stride or offset can wrap it.
        let esize = tile.dtype.size() as i128;
        let (flo, fhi) = tile.free_extent();
        let offset = tile.offset as i128;
        let (lo, hi) = match tile.space {
            Space::Hbm => {
                let reach = (tile.partitions as i128 - 1) * tile.partition_step as i128;
                let (plo, phi) = if reach < 0 { (reach, 0) } else { (0, reach) };
                (offset + (flo + plo) * esize, offset + (fhi + phi + 1) * esize)
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

    /// The claim of SBUF tensor (or spill slot) `id` to be a copy of an HBM region
    /// ([`CopyOf`]), if it still holds: the region's tensor is live and unwritten since it was
    /// made, and (an SBUF tensor) no byte of the tensor was written after the load.
    pub(crate) fn intact_copy(&self, id: TensorId) -> Option<CopyOf> {
        let t = self.tensor(id).ok()?;
        let c = t.copy_of?;
        let src = self.tensor(c.src.tensor).ok()?;
        if src.space != Space::Hbm || src.stored {
            return None;
        }
        if t.space == Space::Sbuf {
            let span = Some((t.address, t.address.saturating_add(t.bytes)));
            if self.sbuf_writes.since(span, c.stamp) {
                return None;
            }
        }
        Some(c)
    }

    /// The source and the byte offset there of each partition's row of SBUF tensor `chip`
    /// (`np` partitions of `b` bytes), when it is a whole copy of an unwritten HBM region
    /// ([`Memories::intact_copy`]) whose rows are `b` consecutive bytes each.
    fn source_rows(&self, chip: TensorId, np: usize, b: u64) -> Option<(TensorId, Vec<usize>)> {
        let t = self.intact_copy(chip)?.src;
        let esize = t.dtype.size() as i64;
        let c = t.canonical();
        let dense = c.runs() == 1 && (c.n == 0 || c.run_stride() == 1);
        if !dense
            || t.partitions as usize != np
            || (c.run_len() as u64).checked_mul(esize as u64)? != b
        {
            return None;
        }
        let total = self.tensor(t.tensor).ok()?.bytes;
        let mut rows = Vec::with_capacity(np);
        for p in 0..np as i64 {
            let at = t.offset.checked_add(p.checked_mul(t.partition_step)?.checked_mul(esize)?)?;
            let at = u64::try_from(at).ok()?;
            if at.checked_add(b)? > total {
                return None;
            }
            rows.push(usize::try_from(at).ok()?);
        }
        Some((t.tensor, rows))
    }

    /// Gives lazy spill slots ([`TensorInfo::lazy`]) the bytes they stand for: those whose
    /// source is tensor `id` (`sourced`: before `id` is written, freed or handed over), and
    /// `id` itself if it is one (`itself`: before it is read or written other than by
    /// [`Memories::spill_bytes`]).
    pub(crate) fn fill_lazy(&mut self, id: TensorId, sourced: bool, itself: bool) {
        if !sourced && self.tensor(id).map_or(true, |t| t.lazy.is_none()) {
            return; // (a DMA reading an input: no scan of the list)
        }
        let mut i = 0;
        while i < self.lazy.len() {
            let slot = self.lazy[i];
            let Some(src) = self.tensor(slot).ok().and_then(|t| t.lazy.as_ref()).map(|l| l.0)
            else {
                self.lazy.swap_remove(i); // freed, or written whole since
                continue;
            };
            if (sourced && src == id) || (itself && slot == id) {
                self.fill_slot(slot);
                self.lazy.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Copies a lazy slot's rows from its source into its own bytes.
    fn fill_slot(&mut self, slot: TensorId) {
        let Some(Some(t)) = self.tensors.get_mut(slot.slot as usize) else { return };
        let (Some((src, rows)), Some(mut mem)) = (t.lazy.take(), t.hbm.take()) else { return };
        let bu = (t.bytes as usize).checked_div(rows.len()).unwrap_or(0);
        if let Some(smem) = self.tensor(src).ok().and_then(|s| s.hbm.as_ref()) {
            for (p, &r) in rows.iter().enumerate() {
                mem.bytes_mut()[p * bu..][..bu].copy_from_slice(&smem.bytes()[r..r + bu]);
            }
        }
        if let Some(Some(t)) = self.tensors.get_mut(slot.slot as usize) {
            t.hbm = Some(mem);
        }
    }

    /// Records that SBUF tensor `id` now holds a copy of `src` (a region of an HBM tensor
    /// unwritten since it was made), as of SBUF's write count now; `None` forgets any claim.
    pub(crate) fn set_copy_of(&mut self, id: TensorId, src: Option<Tile>) {
        let stamp = self.sbuf_writes.now();
        if let Ok(t) = self.tensor_mut(id) {
            t.copy_of = src.map(|src| CopyOf { src, stamp });
        }
    }

    /// Whether an HBM tensor's bytes may have changed since it was made (see
    /// [`TensorInfo::stored`]): `false` means they are exactly its data (or fill) still.
    pub fn stored(&self, tile: &Tile) -> Result<bool> {
        Ok(hbm_only(self.tensor(tile.tensor)?, "stored asks about an HBM tensor")?.stored)
    }

    /// The byte ranges of an HBM tensor that have been written, in order (the whole buffer
    /// when it is fully written). HBM tensors keep this map under [`Uninitialized::Nan`] too:
    /// an LNC=2 launch merges each physical core's written bytes of a shared output.
    pub fn written_ranges(&self, tile: &Tile) -> Result<Vec<(u64, u64)>> {
        let t = hbm_only(self.tensor(tile.tensor)?, "written_ranges reads an HBM tensor's map")?;
        if t.fully_written {
            return Ok(vec![(0, t.bytes)]);
        }
        Ok(t.hbm_init
            .segs
            .iter()
            .filter(|(_, &(_, m))| m & 1 != 0)
            .map(|(&s, &(e, _))| (s, e))
            .collect())
    }

    /// Keeps, from now on, the index of the instruction that last wrote each byte of the HBM
    /// tensor of `tile` ([`Memories::writers`]): an LNC=2 launch orders the two physical cores'
    /// writes of a shared tensor by when they ran.
    pub fn track_writers(&mut self, tile: &Tile) -> Result<()> {
        hbm_only(self.tensor(tile.tensor)?, "track_writers keeps an HBM tensor's writers")?;
        let t = self.tensor_mut(tile.tensor)?;
        if t.writers.is_none() {
            t.writers = Some(vec![NO_WRITER; t.bytes as usize]);
        }
        Ok(())
    }

    /// The instruction that last wrote each byte of the HBM tensor of `tile` (see
    /// [`Memories::track_writers`]; `None` when not kept).
    pub fn writers(&self, tile: &Tile) -> Result<Option<&[u32]>> {
        Ok(self.tensor(tile.tensor)?.writers.as_deref())
    }

    /// Records `writer` as the last writer of `tile`'s bytes when its tensor keeps them.
    pub(crate) fn mark_writer(&mut self, tile: &Tile, range: (u64, u64), writer: u32) {
        if tile.space != Space::Hbm {
            return;
        }
        match self.tensors.get(tile.tensor.slot as usize) {
            Some(Some(t)) if t.writers.is_some() && t.generation == tile.tensor.generation => {}
            _ => return,
        }
        let mut runs = Vec::new();
        if is_dense(tile) {
            runs.push((range.0, range.1));
        } else {
            self.for_each_byte_run(tile, |_, lo, hi| runs.push((lo, hi)));
        }
        if let Some(Some(t)) = self.tensors.get_mut(tile.tensor.slot as usize) {
            if let Some(w) = t.writers.as_mut() {
                let n = w.len() as u64;
                for (lo, hi) in runs {
                    w[lo.min(n) as usize..hi.min(n) as usize].fill(writer);
                }
            }
        }
    }

    /// Records that `tile`'s elements were written.
    pub fn mark_written(&mut self, tile: &Tile, range: (u64, u64)) {
        // Reads are not checked under `Nan`, so on-chip writes need no record; HBM tensors
        // keep theirs (`written_ranges`).
        if self.uninitialized == Uninitialized::Nan && tile.space != Space::Hbm {
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

    /// Moves the bytes of the whole SBUF tensor `chip`, and which of them were written, to the
    /// HBM tensor `hbm` of the same size (`to_hbm`; partition after partition) or back: a
    /// block the compiler spills to HBM and reloads. Returns the bytes moved. `copy: false`:
    /// the caller has just made both hold the same bytes, so only which of them were written
    /// moves (as it would with the copy).
    pub(crate) fn spill_bytes(
        &mut self, chip: TensorId, hbm: TensorId, to_hbm: bool, copy: bool,
    ) -> Result<u64> {
        let c = self.tensor(chip)?;
        let (p0, np, addr, b, full) = (
            c.start_partition as usize,
            c.partitions as usize,
            c.address,
            c.bytes,
            c.fully_written,
        );
        let (space, h) = (c.space, self.tensor(hbm)?);
        if space != Space::Sbuf || h.space != Space::Hbm || h.bytes != np as u64 * b {
            return Err(Error::value(
                "src",
                format!(
                    "a spill moves a whole SBUF tensor to an HBM tensor of its size or back: \
                     got {} ({} B) and {} ({} B)",
                    space.name(),
                    np as u64 * b,
                    h.space.name(),
                    h.bytes
                ),
            ));
        }
        let span = Some((addr, addr.saturating_add(b)));
        let (bu, au) = (b as usize, addr as usize);
        // A slot that still holds what the tensor holds (stored or reloaded, neither written
        // since): storing it again moves which bytes were written, not the bytes.
        let same = h.holds.is_some_and(|(id, at)| id == chip && !self.sbuf_writes.since(span, at));
        // Only a slot never written can be another slot's source ([`CopyOf`] needs a region no
        // one has written): its first store fills those first.
        let maybe_source = !h.stored;
        // Bytes to move: a store to a slot that does not hold them, or a reload.
        let moving = copy && !(to_hbm && same);
        // A store of a whole copy of an unwritten HBM region moves none: the slot's bytes stay
        // the source's rows ([`TensorInfo::lazy`]), and a reload copies those.
        let rows = if to_hbm && moving { self.source_rows(chip, np, b) } else { None };
        if to_hbm && moving {
            if maybe_source {
                self.fill_lazy(hbm, true, false);
            }
            self.lazy.retain(|&l| l != hbm);
            if rows.is_some() {
                self.lazy.push(hbm);
            }
            if let Some(Some(ht)) = self.tensors.get_mut(hbm.slot as usize) {
                ht.lazy = rows.clone();
            }
        }
        let mut from_slot = moving && rows.is_none();
        if moving && !to_hbm {
            self.sbuf_writes.note(span);
            if let Some((src, rows)) = self.tensor(hbm)?.lazy.clone() {
                let moves: Vec<(usize, usize, usize)> = rows
                    .iter()
                    .enumerate()
                    .map(|(p, &r)| (self.sbuf.at(p0 + p, au), r, bu))
                    .collect();
                // (`self.tensor` with the one field borrowed: SBUF is written meanwhile.)
                let machine = self.machine;
                let smem = self.tensors.get_mut(src.slot as usize).and_then(|t| t.as_mut());
                let smem =
                    smem.filter(|t| t.generation == src.generation && src.machine == machine);
                let Some(smem) = smem.and_then(|t| t.hbm.as_mut()) else {
                    return Err(Error::value("src", "a spill slot's source is gone (internal)"));
                };
                copy_rows_detached(&mut self.sbuf, smem, moves);
                from_slot = false;
            }
        }
        let ht = self.tensors[hbm.slot as usize].as_mut();
        let Some(ht) = ht else { return Ok(0) };
        ht.note_hbm_write();
        let Some(hmem) = ht.hbm.as_mut() else {
            return Ok(0);
        };
        if from_slot {
            let rows = (0..np).map(|p| (self.sbuf.at(p0 + p, au), p * bu));
            if to_hbm {
                let moves: Vec<_> = rows.map(|(chip, slot)| (slot, chip, bu)).collect();
                copy_rows_detached(hmem, &mut self.sbuf, moves);
            } else {
                let moves: Vec<_> = rows.map(|(chip, slot)| (chip, slot, bu)).collect();
                copy_rows_detached(&mut self.sbuf, hmem, moves);
            }
        }
        if copy || same {
            ht.holds = Some((chip, self.sbuf_writes.now()));
        }
        if self.uninitialized == Uninitialized::Nan {
            ht.fully_written = true;
            return Ok(np as u64 * b);
        }
        // Which bytes were written: partition `p`'s bytes `addr + j` are byte `p * b + j` in HBM.
        let mut runs = Vec::new();
        if to_hbm {
            ht.hbm_init = InitMap::default();
            // A tensor written whole leaves the slot written whole: no runs to walk (the map
            // is not read while `fully_written`).
            for p in (0..np).filter(|_| !full) {
                let bit = 1u128 << (p0 + p);
                let segs = self.sbuf_init.segs.range(..addr + b);
                for (&s, &(e, _)) in segs.filter(|(_, &(e, m))| e > addr && m & bit != 0) {
                    let (lo, hi) = (s.max(addr) - addr, e.min(addr + b) - addr);
                    runs.push((1, p as u64 * b + lo, p as u64 * b + hi));
                }
            }
            let map = &mut ht.hbm_init;
            runs.iter().for_each(|&(m, lo, hi)| map.mark(m, lo, hi));
            ht.fully_written = full || map.first_gap(1, 0, np as u64 * b).is_none();
        } else {
            let mask = partition_mask(p0 as u32, np as u32);
            if ht.fully_written {
                runs.push((mask, addr, addr + b));
            }
            let segs = ht.hbm_init.segs.iter().filter(|_| !ht.fully_written);
            for (&s, &(e, _)) in segs.filter(|(_, &(_, m))| m & 1 != 0) {
                for p in s / b..e.div_ceil(b) {
                    let (lo, hi) = (s.max(p * b) - p * b, e.min(p * b + b) - p * b);
                    runs.push((1u128 << (p0 as u64 + p), addr + lo, addr + hi));
                }
            }
            runs.iter().for_each(|&(m, lo, hi)| self.sbuf_init.mark(m, lo, hi));
            let full = self.sbuf_init.first_gap(mask, addr, addr + b).is_none();
            self.tensor_mut(chip)?.fully_written = full;
        }
        Ok(np as u64 * b)
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

/// Bytes from which [`copy_rows`] shares the rows with the duo helper: a tensor of 128
/// partitions of 1 KiB, a few microseconds of copying against about one to hand half over.
const SHARED_COPY_BYTES: usize = 128 << 10;

/// Copies `len` bytes from `src[from..]` to `dst[to..]` for every `(to, from, len)` of
/// `moves` (in increasing order of `to`, the destinations disjoint): a spill's store or
/// reload, a DMA's rows. From [`SHARED_COPY_BYTES`] on, the duo helper copies the second half
/// of the moves meanwhile (a reload reads rows of an input far apart in memory: two threads
/// wait on them at once). The caller keeps such a copy small enough not to need the cancel
/// token (see [`SHARED_COPY_MAX`]).
pub(crate) fn copy_rows(dst: &mut [u8], src: &[u8], moves: &[(usize, usize, usize)]) {
    let one = |dst: &mut [u8], moves: &[(usize, usize, usize)], base: usize| {
        for &(t, f, l) in moves {
            dst[t - base..t - base + l].copy_from_slice(&src[f..f + l]);
        }
    };
    let bytes = moves.iter().fold(0usize, |b, m| b.saturating_add(m.2));
    if moves.len() < 2 || bytes < SHARED_COPY_BYTES {
        return one(dst, moves, 0);
    }
    let half = moves.len() / 2;
    let base = moves[half].0;
    let (lo, hi) = dst.split_at_mut(base);
    crate::engine::duo_join(|| one(lo, &moves[..half], 0), || one(hi, &moves[half..], base));
}

/// Bytes from which [`copy_rows_detached`] leaves a copy to the duo helper: some 10 us of
/// copying from memory, against about a microsecond to hand it over.
const DETACHED_COPY_BYTES: usize = 32 << 10;

/// [`copy_rows`] from memory `src` into memory `dst` (two different memories; moves as
/// there, byte offsets into each memory's bytes), made by the duo helper while the caller goes
/// on, for copies from [`DETACHED_COPY_BYTES`] on: both memories then hold the copy
/// ([`Pending`]), and every later use of either one's bytes, or its drop, waits for it (a
/// reload's rows land while the front end works out the next instruction). Made here, at
/// once, when smaller, when a move is out of bounds (`copy_rows` then panics, as it would),
/// or when the helper is busy or absent.
pub(crate) fn copy_rows_detached(
    dst: &mut ByteMem, src: &mut ByteMem, moves: Vec<(usize, usize, usize)>,
) {
    dst.settle_mut();
    src.settle_mut();
    let (dlen, slen) = (dst.len * 4, src.len * 4);
    let bytes = moves.iter().fold(0usize, |b, m| b.saturating_add(m.2));
    let fits = |at: usize, l: usize, len: usize| at.checked_add(l).is_some_and(|e| e <= len);
    let in_bounds = moves.iter().all(|&(t, f, l)| fits(t, l, dlen) && fits(f, l, slen));
    if bytes < DETACHED_COPY_BYTES || !in_bounds {
        return copy_rows(dst.bytes_mut(), src.bytes(), &moves);
    }
    let p = std::sync::Arc::new(Pending {
        dst: dst.bytes_mut().as_mut_ptr(),
        src: src.bytes().as_ptr(),
        moves,
        done: std::sync::atomic::AtomicBool::new(false),
        pid: std::process::id(),
    });
    let job = {
        let p = p.clone();
        Box::new(move || {
            /// Marks the copy made however the job ends (a panic cannot happen: every move
            /// is in bounds).
            struct Done(std::sync::Arc<Pending>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.done.store(true, std::sync::atomic::Ordering::Release);
                }
            }
            let done = Done(p);
            done.0.run();
        })
    };
    match crate::engine::duo_post(job) {
        Ok(()) => {
            dst.pending = Some(p.clone());
            src.pending = Some(p);
        }
        Err(_) => {
            // Not handed over: the copy here (`p` is dropped unrun).
            p.run();
        }
    }
}

/// Bytes up to which a DMA's rows may go through [`copy_rows`], copied without a look at the
/// cancel token (a few milliseconds); larger copies are walked in checked pieces.
pub(crate) const SHARED_COPY_MAX: usize = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbuf_writes_tell_which_columns_changed_since() {
        let mut w = SbufWrites::default();
        w.note(Some((64, 200)));
        let at = w.now();
        assert!(!w.since(Some((64, 200)), at) && w.since(Some((64, 200)), 0));
        w.note(Some((256, 257)));
        // Columns of 64 bytes: 256..257 is column 4, which 200..260 reaches and 0..256 does not.
        assert!(w.since(Some((200, 260)), at) && !w.since(Some((0, 256)), at));
        assert!(!w.since(Some((1 << 16, 1 << 17)), at), "never written");
        assert!(!w.since(Some((300, 300)), 0), "no bytes");
        // A write of unknown extent, or beyond SBUF, changes everything; an empty one nothing.
        let at = w.now();
        w.note(Some((9, 9)));
        assert!(!w.since(Some((0, 256)), at) && !w.since(None, w.now()));
        w.note(None);
        assert!(w.since(Some((1 << 16, 1 << 17)), at) && w.since(None, at));
        let at = w.now();
        w.note(Some((0, u64::MAX)));
        assert!(w.since(Some((5000, 5001)), at));
    }

    #[test]
    fn a_tiles_byte_span_covers_its_elements_either_way() {
        use super::super::tile::Index;
        let mut m = Memories::new(Uninitialized::Error).expect("memories");
        let id = m.alloc(Space::Sbuf, "t", &[4, 8, 16], Dtype::Bf16, 0, Some(256), false);
        let id = id.expect("alloc");
        let t = m.tensor(id).expect("tensor").full_tile(id);
        assert_eq!(byte_span(&t), Some((256, 256 + 8 * 16 * 2)));
        let back = Index::Range { start: None, stop: None, step: -1 };
        let rows = t.slice(&[Index::ALL, Index::At(2), back]).expect("reversed row");
        assert_eq!(byte_span(&rows), Some((256 + 64, 256 + 96)));
    }

    /// A spill slot that holds what its tensor holds (stored to or reloaded from it, neither
    /// written since) is not copied to again: storing the tensor moves no byte. A write to the
    /// tensor's bytes, or to the slot, ends that. (Seen here by changing the slot's bytes
    /// behind the machine's back: a store that copies restores them.)
    #[test]
    fn a_slot_holding_its_tensors_bytes_is_not_copied_to_again() {
        let mut m = Memories::new(Uninitialized::Error).expect("memories");
        let id = m.alloc(Space::Sbuf, "t", &[4, 16], Dtype::Uint8, 0, None, false).expect("t");
        let t = m.tensor(id).expect("t").full_tile(id);
        let slot = m.hbm_tensor("slot", &[64], Dtype::Uint8, None).expect("slot");
        let s = m.tensor(slot).expect("slot").full_tile(slot);
        let fill = |m: &mut Memories, v: u8| {
            let (p0, a) = (t.start_partition as usize, t.offset as usize);
            let mem = m.mem_mut(&t);
            for p in 0..4 {
                let at = mem.at(p0 + p, a);
                mem.bytes_mut()[at..at + 16].fill(v);
            }
        };
        let poke = |m: &mut Memories, v: u8| {
            let h = m.tensors[slot.slot as usize].as_mut().and_then(|h| h.hbm.as_mut());
            h.expect("slot bytes").bytes_mut()[..64].fill(v);
        };
        let slot_bytes = |m: &Memories| m.mem(&s).bytes()[..64].to_vec();
        fill(&mut m, 7);
        m.spill_bytes(id, slot, true, true).expect("store");
        assert_eq!(slot_bytes(&m), vec![7; 64]);
        // Stored, unwritten since: the next store copies nothing.
        poke(&mut m, 9);
        m.spill_bytes(id, slot, true, true).expect("store again");
        assert_eq!(slot_bytes(&m), vec![9; 64], "copied although the slot held the bytes");
        // Reloaded (the tensor gets the slot's bytes), unwritten since: the same.
        m.spill_bytes(id, slot, false, true).expect("reload");
        poke(&mut m, 3);
        m.spill_bytes(id, slot, true, true).expect("store after reload");
        assert_eq!(slot_bytes(&m), vec![3; 64]);
        // The tensor written since: copied.
        fill(&mut m, 5);
        m.spill_bytes(id, slot, true, true).expect("store after a write");
        assert_eq!(slot_bytes(&m), vec![5; 64]);
        // The slot written since (through the machine): copied.
        let mem = m.mem_mut(&s);
        mem.bytes_mut()[..64].fill(1);
        m.spill_bytes(id, slot, true, true).expect("store after a slot write");
        assert_eq!(slot_bytes(&m), vec![5; 64]);
        // Another tensor's store into the slot: copied.
        let other = m.alloc(Space::Sbuf, "o", &[4, 16], Dtype::Uint8, 0, None, false).expect("o");
        m.spill_bytes(other, slot, true, true).expect("store another");
        m.spill_bytes(id, slot, true, true).expect("store it back");
        assert_eq!(slot_bytes(&m), vec![5; 64]);
    }

    /// A spilled tensor that is a whole copy of rows of an unwritten input is not copied to its
    /// slot: the slot's bytes stay the input's rows, and a reload copies those. Before the
    /// input is written or freed, the slot gets the bytes (the tensor's, not the input's new
    /// ones); a store of another tensor into the slot copies as before. (The slot's own bytes
    /// are looked at behind the machine's back.)
    #[test]
    fn a_spilled_copy_of_an_input_stays_the_inputs_rows_until_the_input_changes() {
        let mut m = Memories::new(Uninitialized::Error).expect("memories");
        let data: Vec<u8> = (0..8 * 32).map(|i| (i % 251) as u8).collect();
        use super::super::tile::Index;
        let range = |a: i64, b: i64| Index::Range { start: Some(a), stop: Some(b), step: 1 };
        // Rows 2..6, columns 8..24 of the input: 4 rows of 16 bytes.
        let want: Vec<u8> = (2..6).flat_map(|r| data[r * 32 + 8..r * 32 + 24].to_vec()).collect();
        let setup = |m: &mut Memories| {
            let x = m.hbm_tensor("x", &[8, 32], Dtype::Uint8, Some(&data)).expect("x");
            let xt = m.tensor(x).expect("x").full_tile(x);
            let id = m.alloc(Space::Sbuf, "t", &[4, 16], Dtype::Uint8, 0, None, false).expect("t");
            let t = m.tensor(id).expect("t").full_tile(id);
            put(m, &t, &want);
            m.set_copy_of(id, Some(xt.slice(&[range(2, 6), range(8, 24)]).expect("region")));
            let slot = m.hbm_tensor("slot", &[64], Dtype::Uint8, None).expect("slot");
            (x, xt, id, t, slot)
        };
        let slot_bytes = |m: &Memories, s: TensorId| {
            m.tensors[s.slot as usize].as_ref().and_then(|h| h.hbm.as_ref()).expect("slot").bytes()
                [..64]
                .to_vec()
        };
        let (x, xt, id, t, slot) = setup(&mut m);
        m.spill_bytes(id, slot, true, true).expect("store");
        assert_eq!(slot_bytes(&m, slot), vec![0; 64], "copied to the slot");
        put(&mut m, &t, &[0xEE; 64]); // the storage reused meanwhile
        m.spill_bytes(id, slot, false, true).expect("reload");
        assert_eq!(get(&m, &t), want, "reloaded from the input's rows");
        // The input written: the slot gets the tensor's bytes first.
        let (_, xt1, id1, t1, slot1) = setup(&mut m);
        m.spill_bytes(id1, slot1, true, true).expect("store");
        assert_eq!(slot_bytes(&m, slot1), vec![0; 64]);
        m.mem_mut(&xt1).bytes_mut()[..256].fill(0x55);
        assert_eq!(slot_bytes(&m, slot1), want, "filled before the input's write");
        put(&mut m, &t1, &[0xEE; 64]);
        m.spill_bytes(id1, slot1, false, true).expect("reload");
        assert_eq!(get(&m, &t1), want);
        let _ = (id, t, xt);
        // The input freed: the same.
        let (x2, _, id2, t2, slot2) = setup(&mut m);
        m.spill_bytes(id2, slot2, true, true).expect("store");
        assert_eq!(slot_bytes(&m, slot2), vec![0; 64]);
        m.free(x2).expect("free the input");
        assert_eq!(slot_bytes(&m, slot2), want, "filled before the input was freed");
        put(&mut m, &t2, &[0xEE; 64]);
        m.spill_bytes(id2, slot2, false, true).expect("reload");
        assert_eq!(get(&m, &t2), want);
        // Another tensor stored into a lazy slot: copied, and reloaded from the slot.
        let (_, _, id3, _, slot3) = setup(&mut m);
        m.spill_bytes(id3, slot3, true, true).expect("store");
        let o = m.alloc(Space::Sbuf, "o", &[4, 16], Dtype::Uint8, 0, None, false).expect("o");
        let ot = m.tensor(o).expect("o").full_tile(o);
        put(&mut m, &ot, &[7; 64]);
        m.spill_bytes(o, slot3, true, true).expect("store another");
        assert_eq!(slot_bytes(&m, slot3), vec![7; 64]);
        put(&mut m, &ot, &[0xEE; 64]);
        m.spill_bytes(o, slot3, false, true).expect("reload it");
        assert_eq!(get(&m, &ot), vec![7; 64]);
        let _ = x;
    }

    /// `copy_rows` gives what a move-by-move copy gives, below and above the size from which
    /// the duo helper takes half of the moves (an odd count of moves of different lengths,
    /// gaps between the destinations, sources in any order).
    #[test]
    fn copy_rows_equals_a_move_by_move_copy() {
        let src: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + i / 251) as u8).collect();
        for (count, len) in [(3usize, 100usize), (129, 2048), (257, 1500)] {
            let mut moves = Vec::new();
            let mut at = 5;
            for i in 0..count {
                let l = len + i % 3;
                let from = (i * 7919 * 13) % (src.len() - l);
                moves.push((at, from, l));
                at += l + i % 5;
            }
            let bytes: usize = moves.iter().map(|m| m.2).sum();
            assert_eq!(bytes >= SHARED_COPY_BYTES, count > 3);
            let mut want = vec![0xAAu8; at + 9];
            for &(t, f, l) in &moves {
                want[t..t + l].copy_from_slice(&src[f..f + l]);
            }
            let mut got = vec![0xAAu8; at + 9];
            copy_rows(&mut got, &src, &moves);
            assert!(got == want, "{count} moves of about {len} bytes");
        }
    }

    /// A copy left to the duo helper has landed before any use of either memory's bytes: a
    /// read of the destination right after sees every move, as it does after a write to the
    /// source (which does not reach the destination) or the source's drop (which does not free
    /// it under the copy). Most rounds leave the copy to the helper (some may find it busy
    /// with another test's work and copy at once).
    #[test]
    fn detached_copies_land_before_any_use() {
        let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 13 + i / 509) as u8).collect();
        let mut detached = 0;
        for round in 0..50usize {
            let mut src = ByteMem::holding("src", "test", &data, 64).expect("src");
            let mut dst = ByteMem::new("dst", "test", 1, 1 << 20, 64).expect("dst");
            let moves: Vec<(usize, usize, usize)> = (0..256)
                .map(|r| (r * 4096 + round, (r * 7919 + round * 31) % 1000000, 4000))
                .collect();
            let mut want = vec![0u8; 1 << 20];
            for &(t, f, l) in &moves {
                want[t..t + l].copy_from_slice(&data[f..f + l]);
            }
            copy_rows_detached(&mut dst, &mut src, moves);
            detached += usize::from(dst.pending.is_some() && src.pending.is_some());
            match round % 3 {
                0 => {}
                1 => src.bytes_mut().fill(0x5A),
                _ => drop(src),
            }
            assert!(dst.bytes() == &want[..], "round {round}");
        }
        assert!(detached > 0, "no copy was left to the helper");
        // Below the size worth handing over: made at once.
        let (mut src, mut dst) = (
            ByteMem::holding("src", "test", &data[..4096], 64).expect("src"),
            ByteMem::new("dst", "test", 1, 4096, 64).expect("dst"),
        );
        copy_rows_detached(&mut dst, &mut src, vec![(0, 0, 4096)]);
        assert!(dst.pending.is_none() && dst.bytes() == &data[..4096]);
    }

    /// In a forked child (a pending copy of another process), waiting makes the copy.
    #[test]
    fn a_copy_pending_in_another_process_is_made_by_the_waiter() {
        let src: Vec<u8> = (0..64u8).collect();
        let mut dst = vec![0u8; 64];
        let p = Pending {
            dst: dst.as_mut_ptr(),
            src: src.as_ptr(),
            moves: vec![(8, 0, 16), (32, 40, 24)],
            done: std::sync::atomic::AtomicBool::new(false),
            pid: std::process::id().wrapping_add(1),
        };
        p.wait();
        assert!(p.done.load(std::sync::atomic::Ordering::Acquire));
        let mut want = vec![0u8; 64];
        want[8..24].copy_from_slice(&src[..16]);
        want[32..56].copy_from_slice(&src[40..64]);
        assert_eq!(dst, want);
    }

    /// Writes `bytes` over SBUF tile `t` (rows of its partitions), noting the write.
    fn put(m: &mut Memories, t: &Tile, bytes: &[u8]) {
        let (p0, a, w) = (t.start_partition as usize, t.offset as usize, bytes.len() / 4);
        let mem = m.mem_mut(t);
        for (p, row) in bytes.chunks(w).enumerate() {
            let at = mem.at(p0 + p, a);
            mem.bytes_mut()[at..at + w].copy_from_slice(row);
        }
    }

    /// SBUF tile `t`'s bytes, its 4 partitions' rows.
    fn get(m: &Memories, t: &Tile) -> Vec<u8> {
        let (p0, a, w) = (t.start_partition as usize, t.offset as usize, 16);
        let mem = m.mem(t);
        (0..4).flat_map(|p| mem.bytes()[mem.at(p0 + p, a)..][..w].to_vec()).collect()
    }

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

    /// An HBM tensor made from host data (`ByteMem::holding`: not cleared before the copy)
    /// holds exactly those bytes, from a 64-byte-aligned first byte, with the last word's
    /// padding zero, even in a heap block that held other bytes just before (each length is
    /// made twice: first from 0xFF bytes, freed, then from the pattern). The last length is
    /// above the mapped-memory floor: copied in two halves, one by the duo helper.
    #[test]
    fn hbm_tensors_from_data_hold_those_bytes_and_zero_padding() {
        for n in [1usize, 2, 3, 4, 5, 7, 64, 4093, (1 << 20) + 3, (17 << 20) + 4091] {
            for fill in [None, Some(0xFFu8)] {
                let data: Vec<u8> = match fill {
                    Some(b) => vec![b; n + 3],
                    None => (0..n).map(|i| (i * 7 + 3) as u8).collect(),
                };
                let mut m = Memories::new(Uninitialized::Error).expect("memories");
                let id = m.hbm_tensor("t", &[data.len()], Dtype::Uint8, Some(&data)).expect("t");
                let t = m.tensor(id).expect("live").full_tile(id);
                let bytes = m.mem(&t).bytes();
                assert_eq!(bytes.len(), data.len().div_ceil(4) * 4, "n={n}");
                assert_eq!(&bytes[..data.len()], &data[..], "n={n}: the data");
                assert!(bytes[data.len()..].iter().all(|&b| b == 0), "n={n}: padding {bytes:?}");
                assert_eq!(bytes.as_ptr() as usize % HBM_ALIGN, 0, "n={n}: alignment");
                assert!(m.tensor(id).expect("live").fully_written, "n={n}");
            }
        }
    }

    /// Every byte of a machine's new SBUF and PSUM is its policy's byte, whatever the machines
    /// before it wrote and under whichever policy (memories come back through the pool, which
    /// resets only where tensors were placed).
    #[test]
    fn memories_from_the_pool_are_reset() {
        let all = |m: &Memories, b: u8| {
            m.sbuf.bytes().iter().all(|&x| x == b) && m.psum.bytes().iter().all(|&x| x == b)
        };
        let policies = [Uninitialized::Error, Uninitialized::Error, Uninitialized::Nan];
        for (round, &policy) in policies.iter().cycle().take(9).enumerate() {
            let mut m = Memories::new(policy).expect("memories");
            assert!(all(&m, policy.fill()), "round {round}: a new memory is not all fill");
            // Tensors at the bottom, in the middle and at the top of SBUF, one in PSUM, then
            // garbage written over each one's footprint.
            let top = (crate::spec::SBUF_USABLE_PARTITION_BYTES / 64 - 1) * 64;
            for (space, at) in [
                (Space::Sbuf, 0),
                (Space::Sbuf, 4096 * (round as u64 + 1)),
                (Space::Sbuf, top),
                (Space::Psum, 2048),
            ] {
                let id = m
                    .alloc(space, "t", &[128, 16], Dtype::Uint8, 0, Some(at), false)
                    .expect("alloc");
                let t = m.tensor(id).expect("live").full_tile(id);
                let mem = m.mem_mut(&t);
                for p in 0..128 {
                    let o = mem.at(p, at as usize);
                    mem.bytes_mut()[o..o + 16].fill(0xA5 ^ round as u8);
                }
            }
            drop(m);
        }
    }

    /// A clone of the memories holds the same bytes at its own aligned place (SBUF is larger
    /// than its bytes on the host: the mmap floor).
    #[test]
    fn cloned_memories_keep_bytes_and_alignment() {
        let mut m = Memories::new(Uninitialized::Error).expect("memories");
        let id =
            m.alloc(Space::Sbuf, "t", &[128, 64], Dtype::Uint8, 0, Some(128), false).expect("t");
        let t = m.tensor(id).expect("live").full_tile(id);
        let mem = m.mem_mut(&t);
        let o = mem.at(5, 128);
        mem.bytes_mut()[o..o + 64].fill(7);
        let c = m.clone();
        for (a, b) in [(&m.sbuf, &c.sbuf), (&m.psum, &c.psum)] {
            assert_eq!(a.bytes(), b.bytes());
            assert_eq!(b.bytes().as_ptr() as usize % ON_CHIP_ALIGN, 0);
        }
        assert!(c.sbuf.words.len() * 4 >= MMAP_FLOOR);
    }
}
