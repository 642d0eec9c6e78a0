//! The whole NeuronCore-v3 (issue 14, contract section 7): SBUF and PSUM as byte memories with
//! an allocator, HBM tensors, the instruction sets of the four compute engines and DMA, and a
//! clock that runs the engines in parallel.
//!
//! - [`memory`]: the bytes, the tensor table, initialisation tracking ([`Memories`]).
//! - `alloc`: the allocator (placement of SBUF/PSUM tensors; more methods of [`Memories`]).
//! - [`tile`]: access patterns ([`Tile`]) into the memories, as NKI tiles are.
//! - [`dtype`]: element types and the conversions on the way in and out of the engines.
//! - [`isa`]: the instructions' values (VALUES): one method of [`Machine`] per NKI ISA
//!   instruction, computed when issued, with the engine rules as errors.
//! - [`loops`]: loop-carried reads of a recorded loop (for front ends that promise
//!   independent iterations).
//! - [`record`]: the recorded program (what `isa` writes and `cost`/`timeline` read).
//! - [`cost`]: each instruction's duration from the published formulas (TIME).
//! - [`timeline`]: the engines' queues run in parallel under the dependencies of the recorded
//!   program; the [`KernelReport`] with makespan, busy times, critical path and trace.
//!
//! `isa` and `cost` never import each other; [`Machine::run`] hands the recorded program from
//! one to the other.
//!
//! ```
//! use trn2core::machine::{Machine, MachineConfig, Dtype, AluOp, Engine};
//! use trn2core::memory::Space;
//!
//! let mut core = Machine::new(MachineConfig::default()).unwrap();
//! let a = core.alloc(Space::Sbuf, "a", &[128, 64], Dtype::Fp32).unwrap();
//! let b = core.alloc(Space::Sbuf, "b", &[128, 64], Dtype::Fp32).unwrap();
//! core.memset(Engine::Vector, &a, 1.5).unwrap();
//! core.memset(Engine::Gpsimd, &b, 2.0).unwrap();
//! core.tensor_tensor(Engine::Vector, &b, &a, &b, AluOp::Add).unwrap();
//! assert_eq!(core.read_f32(&b).unwrap()[0], 3.5);
//! let rep = core.run().unwrap();
//! assert_eq!(rep.instructions, 3);
//! ```

mod alloc;
pub mod cost;
pub mod dtype;
pub mod host;
pub mod isa;
pub mod loops;
pub mod memory;
pub(crate) mod ranges;
pub mod record;
pub(crate) mod simd;
pub mod tile;
pub mod timeline;

pub use dtype::{Dtype, OutputRounding};
pub use host::HostOperand;
pub use isa::act::ActFunc;
pub use isa::alu::AluOp;
pub use isa::{PeOptions, ReduceCmd, Scalar};
pub use memory::{Memories, TensorInfo, Uninitialized};
pub use record::{Engine, Location, Opcode, Program, Queue, NO_LOCATION};
pub use tile::{TensorId, Tile, MAX_FREE_DIMS};
pub use timeline::KernelReport;

use crate::memory::{Allocation, Footprint, Space};
use crate::spec::{PSUM_PARTITIONS, PSUM_PARTITION_BYTES, SBUF_PARTITIONS};
use crate::Result;

/// How a machine is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineConfig {
    /// What reading never-written memory does.
    pub uninitialized: Uninitialized,
    /// Rounding of engine outputs to narrower float dtypes: nearest-even, or stochastic with a
    /// seed (each instruction then uses the counter-based generator keyed by
    /// `mix64(seed + instruction index)`, so results do not depend on the schedule).
    pub rounding: OutputRounding,
}

/// One emulated NeuronCore-v3 (see the module doc).
#[derive(Debug, Clone)]
pub struct Machine {
    pub(crate) mem: Memories,
    pub(crate) program: Program,
    /// The Scalar engine's 128 reduction registers (`activation`'s `reduce_cmd`).
    pub(crate) act_regs: [f32; SBUF_PARTITIONS],
    /// The Vector engine's 128 accumulator registers (`tensor_scalar_reduce`).
    pub(crate) dve_regs: [f32; SBUF_PARTITIONS],
    /// One bit per PSUM fp32 slot: written by a matmul since the last other write (the
    /// condition for `accumulate=True`, and what `accumulate=None` infers from).
    pub(crate) psum_mm: Vec<u64>,
    /// Matmuls checked and recorded whose arithmetic waits for [`Machine::settle`].
    pub(crate) pe_queue: Vec<isa::pe::QueuedMatmul>,
    /// `tensor_tensor`s waiting in the queue behind the matmuls issued before them
    /// ([`isa::pe::Drain`]).
    pub(crate) pe_drains: Vec<isa::pe::Drain>,
    /// The Vector engine's random stream once `set_rng_seed` seeded it: the seed and the words
    /// its dropouts have drawn since (`None`: never seeded; see `isa::elementwise`).
    pub(crate) vector_rng: Option<(u32, u64)>,
    /// Each GpSimd lane's (partition's) XORWOW state once `rand_set_state` seeded it (empty
    /// until then; see `isa::gpsimd`).
    pub(crate) gpsimd_rng: Vec<Option<[u32; 6]>>,
    /// The last wave's packed matmul operands ([`isa::pe::PackCache`]).
    pub(crate) pe_pack: isa::pe::PackCache,
    pub(crate) config: MachineConfig,
    /// The next DMA queue of the round-robin default.
    pub(crate) next_dma_queue: u8,
}

/// The on-chip bytes of a tensor as a recorded region (`None` for an HBM tensor).
fn region_of(t: &TensorInfo) -> Option<record::Region> {
    let mem = match t.space {
        Space::Sbuf => record::MEM_SBUF,
        Space::Psum => record::MEM_PSUM,
        Space::Hbm => return None,
    };
    Some(record::Region {
        mem,
        p0: t.start_partition as u16,
        pn: t.partitions as u16,
        lo: t.address,
        hi: t.address + t.bytes,
    })
}

/// Whether two recorded regions share a byte.
fn regions_meet(a: &record::Region, b: &record::Region) -> bool {
    a.mem == b.mem && a.p0 < b.p0 + b.pn && b.p0 < a.p0 + a.pn && a.lo < b.hi && b.lo < a.hi
}

/// PSUM fp32 slots per partition.
pub(crate) const PSUM_SLOTS: usize = (PSUM_PARTITION_BYTES / 4) as usize;

impl Machine {
    /// An idle core with empty memories.
    pub fn new(config: MachineConfig) -> Result<Machine> {
        Ok(Machine {
            mem: Memories::new(config.uninitialized)?,
            program: Program::default(),
            act_regs: [0.0; SBUF_PARTITIONS],
            dve_regs: [0.0; SBUF_PARTITIONS],
            psum_mm: vec![0; (PSUM_PARTITIONS * PSUM_SLOTS).div_ceil(64)],
            pe_queue: Vec::new(),
            pe_drains: Vec::new(),
            vector_rng: None,
            gpsimd_rng: Vec::new(),
            pe_pack: isa::pe::PackCache::default(),
            config,
            next_dma_queue: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> MachineConfig {
        self.config
    }

    /// Allocates a tensor of `shape` (partition axis first) in SBUF or PSUM, first-fit from
    /// partition 0, and returns its full tile. `CapacityError` when it does not fit.
    pub fn alloc(
        &mut self, space: Space, name: &str, shape: &[usize], dtype: Dtype,
    ) -> Result<Tile> {
        self.alloc_at(space, name, shape, dtype, 0, None, false)
    }

    /// Whether [`Machine::alloc`] of `shape` and `dtype` in `space` could succeed now (also
    /// when tensors the matmul queue used still hold bytes: settling may give them back);
    /// `false` only when it would be the `CapacityError` of no room, made here without its
    /// message.
    pub fn has_room(&self, space: Space, shape: &[usize], dtype: Dtype) -> bool {
        self.mem.has_retired() || self.mem.has_room(space, shape, dtype)
    }

    /// Where SBUF tensors without an address go: the highest free address when `on` (the NKI
    /// front end: kernels' explicit allocations count from address 0 up, so the tensors the
    /// front end places itself keep clear of them), else the lowest (the default).
    pub fn set_sbuf_fit_from_top(&mut self, on: bool) {
        self.mem.sbuf_from_top = on;
    }

    /// [`Machine::alloc`] with an explicit first partition and, optionally, byte address;
    /// `overlay`: a kernel's explicit placement, which may share bytes with other such tensors
    /// and holds what is there ([`Memories::alloc`]).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc_at(
        &mut self, space: Space, name: &str, shape: &[usize], dtype: Dtype, start_partition: u32,
        address: Option<u64>, overlay: bool,
    ) -> Result<Tile> {
        // No settle: a tensor the queue uses is retired when freed (`free`), its bytes kept
        // until the queue is settled, so a new tensor never lands on them; when they are in
        // the way, settling gives them back.
        let args = (space, name, shape, dtype, start_partition, address, overlay);
        match self.try_alloc_at(args)? {
            Some(tile) => Ok(tile),
            None => {
                crate::pool::install(|| self.settle())?;
                Ok(self.try_alloc_at(args)?.expect("nothing retired after a settle"))
            }
        }
    }

    /// [`Machine::alloc_at`] without settling the queue: `None` when the tensor does not fit
    /// while tensors the queue used still hold their bytes (settling would give them back).
    #[allow(clippy::type_complexity)]
    pub fn try_alloc_at(
        &mut self,
        (space, name, shape, dtype, start_partition, address, overlay): (
            Space,
            &str,
            &[usize],
            Dtype,
            u32,
            Option<u64>,
            bool,
        ),
    ) -> Result<Option<Tile>> {
        // With retired tensors in the way, a failure only means "settle first": no message.
        let retired = self.mem.has_retired();
        let id = match self.mem.alloc_or(
            space,
            name,
            shape,
            dtype,
            start_partition,
            address,
            overlay,
            !retired,
        ) {
            Err(_) if retired => return Ok(None),
            r => r?,
        };
        let t = self.mem.tensor(id)?;
        let (p0, pn, lo, hi) = (t.start_partition, t.partitions, t.address, t.address + t.bytes);
        let tile = t.full_tile(id);
        if space == Space::Psum && !overlay {
            self.clear_psum_mm(p0, pn, lo, hi);
        }
        Ok(Some(tile))
    }

    /// `core.alloc` in SBUF or PSUM: reserves a tensor of `typed = (shape, dtype)` (partition
    /// axis first) when given, else `fp` as bytes (`fp.partition_bytes` on `fp.partitions`
    /// partitions, at least one byte each); `arg` names the request in a `CapacityError`.
    /// Returns the reservation (`stack`: the core's HBM stack, recorded in it) and the tile of
    /// its tensor. The machine's allocator is the core's one account of SBUF and PSUM.
    pub fn reserve(
        &mut self, arg: &str, space: Space, name: &str, fp: Footprint,
        typed: Option<(&[usize], Dtype)>, stack: usize,
    ) -> Result<(Allocation, Tile)> {
        use crate::memory::OnChip;
        // A typed tensor lies as the machine lays it: its first axis on the partitions.
        let fp = match typed {
            Some((shape, dtype)) => {
                let per = shape
                    .get(1..)
                    .unwrap_or(&[])
                    .iter()
                    .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64));
                let partitions = shape.first().map_or(1, |&p| p as u64);
                match per.and_then(|b| b.checked_mul(partitions).map(|t| (b, t))) {
                    Some((partition_bytes, bytes)) => {
                        Footprint { bytes, partitions, partition_bytes }
                    }
                    None => fp,
                }
            }
            None => fp,
        };
        if self.mem.has_retired() {
            crate::pool::install(|| self.settle())?;
        }
        self.mem.fits_now(arg, space, fp)?;
        let start = self.mem.lowest_fit(space, fp).unwrap_or(0);
        let bytes = [fp.partitions as usize, fp.partition_bytes.max(1) as usize];
        let (shape, dtype) = typed.unwrap_or((&bytes, Dtype::Uint8));
        let tile = self.alloc_at(space, name, shape, dtype, start, None, false)?;
        Ok((self.mem.allocation(tile.tensor, stack)?, tile))
    }

    /// Releases a reservation of [`Machine::reserve`] (`ValueError` naming `allocation` when
    /// another memory made it or it was freed).
    pub fn release(&mut self, a: &Allocation) -> Result<()> {
        self.settle()?;
        let id = self.mem.reserved(a)?;
        self.mem.free(id)
    }

    /// Creates an HBM tensor from host data (packed little-endian elements of `dtype`, C
    /// order), or uninitialised when `data` is `None` (an output).
    pub fn hbm_tensor(
        &mut self, name: &str, shape: &[usize], dtype: Dtype, data: Option<&[u8]>,
    ) -> Result<Tile> {
        let id = self.mem.hbm_tensor(name, shape, dtype, data)?;
        Ok(self.mem.tensor(id)?.full_tile(id))
    }

    /// Checks that `tile` is a view of a live tensor of this machine lying wholly inside it
    /// (exactly: sizes, strides and offsets in 128-bit arithmetic), without reading it; returns
    /// its byte range `[lo, hi)` within each partition (SBUF/PSUM) or the buffer (HBM).
    pub fn check_tile(&self, arg: &str, tile: &Tile) -> Result<(u64, u64)> {
        self.mem.check_tile(arg, tile)
    }

    /// Frees a tensor (its tiles become invalid). One the matmul queue still uses is retired:
    /// its bytes stay taken until the queue is settled ([`Memories::retire`]).
    pub fn free(&mut self, tile: &Tile) -> Result<()> {
        if self.queue_uses(tile.tensor) {
            return self.mem.retire(tile.tensor);
        }
        self.mem.free(tile.tensor)
    }

    /// Frees the tensor of `tile`, whose storage a front end gives up to another: a later use
    /// of its tiles is a `CapacityError` with `message`, under `rule` (`sbuf_capacity` or
    /// `psum_capacity`).
    pub fn give_up(&mut self, tile: &Tile, message: &str, rule: &str) -> Result<()> {
        let rule = match rule {
            "sbuf_capacity" => "sbuf_capacity",
            "psum_capacity" => "psum_capacity",
            other => {
                return Err(crate::Error::value(
                    "rule",
                    format!("expected sbuf_capacity or psum_capacity, got {other:?}"),
                ))
            }
        };
        self.settle()?;
        self.mem.give_up(tile.tensor, message.to_string(), rule)
    }

    /// The live tensors of `space` (SBUF or PSUM) that a recorded instruction from `since` on
    /// read or wrote, each with the index of the last such instruction: what
    /// [`Machine::last_uses`] of every live tensor of `space` finds (the others, -1, left
    /// out), without naming them. Scans the program from its end back to `since`.
    pub fn touched_since(&self, space: Space, since: usize) -> Vec<(TensorId, i64)> {
        use record::{MEM_PSUM, MEM_SBUF};
        let mem = match space {
            Space::Sbuf => MEM_SBUF,
            Space::Psum => MEM_PSUM,
            Space::Hbm => return Vec::new(),
        };
        let live: Vec<(TensorId, record::Region)> = (self.mem.tensors.iter().enumerate())
            .filter_map(|(slot, t)| {
                let t = t.as_ref().filter(|t| t.space == space)?;
                let id = TensorId {
                    machine: self.mem.machine,
                    slot: slot as u32,
                    generation: t.generation,
                };
                Some((id, region_of(t)?))
            })
            .collect();
        let mut found = vec![false; live.len()];
        let (mut out, mut left) = (Vec::new(), live.len());
        let recorded = self.program.instrs.iter().enumerate();
        for (i, ins) in recorded.skip(since).rev() {
            if left == 0 {
                break;
            }
            let regions = self.program.reads(ins).iter().chain(self.program.writes(ins));
            for r in regions.filter(|r| r.mem == mem) {
                for (k, (id, span)) in live.iter().enumerate() {
                    if !found[k] && regions_meet(r, span) {
                        found[k] = true;
                        left -= 1;
                        out.push((*id, i as i64));
                    }
                }
            }
        }
        out
    }

    /// For each tile, the index of the last recorded instruction from `since` on that read or
    /// wrote any of its tensor's bytes (-1: none; a tensor no longer live counts as never
    /// used): what [`Machine::touched_since`] finds for the tiles' memories (a front end that
    /// keeps what it learnt asks only about the instructions recorded since).
    pub fn last_uses(&self, tiles: &[Tile], since: usize) -> Vec<i64> {
        let mut found: Vec<(TensorId, i64)> = Vec::new();
        for space in [Space::Sbuf, Space::Psum] {
            if tiles.iter().any(|t| t.space == space) {
                found.extend(self.touched_since(space, since));
            }
        }
        // Only live tensors are found, by their current generation: a freed one's tile is -1.
        let last = |t: &Tile| found.iter().find(|(id, _)| *id == t.tensor).map_or(-1, |f| f.1);
        tiles.iter().map(last).collect()
    }

    /// The tensor a tile belongs to.
    pub fn tensor(&self, tile: &Tile) -> Result<&TensorInfo> {
        self.mem.tensor(tile.tensor)
    }

    /// The memories (for inspection).
    pub fn memories(&self) -> &Memories {
        &self.mem
    }

    /// The recorded program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Instructions issued so far.
    pub fn instructions(&self) -> usize {
        self.program.instrs.len()
    }

    /// The id of the kernel source line `file:line` (see [`Program::locate`]), for
    /// [`Machine::set_location`].
    pub fn locate(&mut self, file: &str, line: u32) -> Result<u32> {
        self.program.locate(file, line)
    }

    /// The source location (an id of [`Machine::locate`], `None` for none) of the
    /// instructions issued from now on: the timeline sums busy time per location and the trace
    /// names it on each slice. `ValueError` naming `location` for an unknown id.
    pub fn set_location(&mut self, location: Option<u32>) -> Result<()> {
        self.program.set_location(location)
    }

    /// [`Machine::issue`] with `location` (an id of [`Machine::locate`], `None` for none)
    /// stamped on this instruction only: a front end's line travels with its instruction.
    /// `ValueError` naming `location` for an unknown id (nothing issued).
    pub fn issue_at(
        &mut self, op: Opcode, vals: Vec<Option<isa::table::Value>>, location: Option<u32>,
    ) -> Result<()> {
        self.at(location, |m| m.issue(op, vals))
    }

    /// Runs `f` with `location` (an id of [`Machine::locate`], `None` for none) stamped on the
    /// instructions it issues. `ValueError` naming `location` for an unknown id (`f` not run).
    pub fn at<T>(
        &mut self, location: Option<u32>, f: impl FnOnce(&mut Machine) -> Result<T>,
    ) -> Result<T> {
        let before = self.program.location();
        self.program.set_location(location)?;
        let done = f(self);
        // `before` was valid when set: restoring it cannot fail.
        let _ = self.program.set_location(before);
        done
    }

    /// The location id of recorded instruction `index` (`None`: issued with none, or no such
    /// instruction).
    pub fn instruction_location(&self, index: usize) -> Option<u32> {
        self.program.instrs.get(index).map(|i| i.location).filter(|&l| l != NO_LOCATION)
    }

    /// Forgets the recorded program (memories keep their contents): the next [`Machine::run`]
    /// times only what is issued after this.
    pub fn clear_program(&mut self) {
        self.program.clear();
    }

    /// Holds the last recorded instruction until `tick` at least (see
    /// [`Program::hold_last`]): a front end joining two cores' clocks at a rendezvous.
    pub fn hold_last(&mut self, tick: u64) -> Result<()> {
        self.program.hold_last(tick)
    }

    /// Schedules every recorded instruction on the engines' queues (see [`timeline`]).
    pub fn run(&self) -> Result<KernelReport> {
        timeline::schedule(&self.program, &timeline::Options::default())
    }

    /// [`Machine::run`] with options (trace events on or off).
    pub fn run_with(&self, options: &timeline::Options) -> Result<KernelReport> {
        timeline::schedule(&self.program, options)
    }

    /// The loop-carried reads of the recorded instructions `iterations[0] .. end` (see
    /// [`loops::carried_reads`]).
    pub fn carried_reads(
        &self, iterations: &[usize], end: usize, limit: usize,
    ) -> Result<Vec<(u32, u32)>> {
        loops::carried_reads(&self.program, iterations, end, limit)
    }

    /// The written byte ranges of an HBM tensor (see [`Memories::written_ranges`]).
    pub fn written_ranges(&self, tile: &Tile) -> Result<Vec<(u64, u64)>> {
        self.mem.written_ranges(tile)
    }

    /// Whether an HBM tensor's bytes may have changed since it was made
    /// ([`Memories::stored`]).
    pub fn stored(&self, tile: &Tile) -> Result<bool> {
        self.mem.stored(tile)
    }

    /// Keeps the last writer of each byte of an HBM tensor from now on (see
    /// [`Memories::track_writers`]).
    pub fn track_writers(&mut self, tile: &Tile) -> Result<()> {
        self.mem.track_writers(tile)
    }

    /// The index of the instruction that last wrote each byte of an HBM tensor
    /// ([`memory::NO_WRITER`]: none), when kept ([`Machine::track_writers`]).
    pub fn writers(&self, tile: &Tile) -> Result<Option<Vec<u32>>> {
        Ok(self.mem.writers(tile)?.map(<[u32]>::to_vec))
    }

    /// Clears the matmul-written bits of a PSUM byte region.
    pub(crate) fn clear_psum_mm(&mut self, p0: u32, pn: u32, lo: u64, hi: u64) {
        psum_put(&mut self.psum_mm, p0, pn, lo, hi, false);
    }
}

/// Words of the PSUM slot bitmap per partition (one bit per fp32 slot, `PSUM_SLOTS` per
/// partition): every partition's bits start on a word.
const PSUM_ROW_WORDS: usize = PSUM_SLOTS / 64;
const _: () = assert!(PSUM_SLOTS.is_multiple_of(64));

/// The words of a partition's row of the PSUM slot bitmap that bytes `lo..hi` cover (the same
/// in every partition): the first and last word and their masks, the words between whole.
#[derive(Debug, Clone, Copy)]
struct SlotSpan {
    w0: usize,
    first: u64,
    w1: usize,
    last: u64,
}

impl SlotSpan {
    /// The span of slots `lo / 4 .. ceil(hi / 4)`, clamped to a partition; `None` if empty.
    fn of(lo: u64, hi: u64) -> Option<SlotSpan> {
        let (s0, s1) = ((lo / 4) as usize, (hi.div_ceil(4) as usize).min(PSUM_SLOTS));
        if s0 >= s1 {
            return None;
        }
        let (w0, w1) = (s0 / 64, (s1 - 1) / 64);
        // Bits s0 % 64 .. of the first word, ..= (s1 - 1) % 64 of the last.
        let (first, last) = (u64::MAX << (s0 % 64), u64::MAX >> (63 - (s1 - 1) % 64));
        Some(if w0 == w1 {
            SlotSpan { w0, first: first & last, w1, last: first & last }
        } else {
            SlotSpan { w0, first, w1, last }
        })
    }

    /// Where the bitmap rows of partitions `p0 .. p0 + pn` lie.
    fn rows(p0: u32, pn: u32) -> std::ops::Range<usize> {
        p0 as usize * PSUM_ROW_WORDS..(p0 as usize + pn as usize) * PSUM_ROW_WORDS
    }

    /// Whether every bit of the span is set in `row`.
    #[inline(always)]
    fn all_set(&self, row: &[u64]) -> bool {
        let &SlotSpan { w0, first, w1, last } = self;
        row[w0] & first == first
            && row[w1] & last == last
            && row[w0 + 1..w1.max(w0 + 1)].iter().all(|&x| x == u64::MAX)
    }

    /// Sets (`on`) or clears every bit of the span in `row`.
    #[inline(always)]
    fn put(&self, row: &mut [u64], on: bool) {
        let &SlotSpan { w0, first, w1, last } = self;
        if on {
            row[w0] |= first;
            row[w1] |= last;
        } else {
            row[w0] &= !first;
            row[w1] &= !last;
        }
        row[w0 + 1..w1.max(w0 + 1)].fill(if on { u64::MAX } else { 0 });
    }
}

/// Whether the PSUM slot bitmap `words` has every bit of bytes `lo..hi` of partitions
/// `p0 .. p0 + pn` set (`true` for no bytes; `false` past the bitmap).
pub(crate) fn psum_all_set(words: &[u64], p0: u32, pn: u32, lo: u64, hi: u64) -> bool {
    let Some(span) = SlotSpan::of(lo, hi) else {
        return true;
    };
    words
        .get(SlotSpan::rows(p0, pn))
        .is_some_and(|rows| rows.chunks_exact(PSUM_ROW_WORDS).all(|row| span.all_set(row)))
}

/// Sets (`on`) or clears the bits of bytes `lo..hi` of partitions `p0 .. p0 + pn` in the PSUM
/// slot bitmap `words` (nothing if they reach past it: the machine checks tiles first).
pub(crate) fn psum_put(words: &mut [u64], p0: u32, pn: u32, lo: u64, hi: u64, on: bool) {
    let Some(span) = SlotSpan::of(lo, hi) else {
        return;
    };
    if let Some(rows) = words.get_mut(SlotSpan::rows(p0, pn)) {
        rows.chunks_exact_mut(PSUM_ROW_WORDS).for_each(|row| span.put(row, on));
    }
}

#[cfg(test)]
mod tests {
    use super::{psum_all_set, psum_put, PSUM_SLOTS};

    /// `psum_put` sets, and clears, exactly the bits of the slots `lo / 4 .. ceil(hi / 4)`
    /// (clamped to a partition) of each partition asked, and `psum_all_set` says whether all
    /// of them are set: against one bit per slot, for regions starting, ending and lying inside
    /// words and spanning many, on a bitmap of other bits.
    #[test]
    fn psum_bits_cover_exactly_the_slots_of_the_region() {
        let words = 3 * PSUM_SLOTS / 64;
        let ends = [0u64, 1, 3, 4, 5, 252, 256, 260, 508, 512, 2048, 4 * PSUM_SLOTS as u64 - 4];
        // Random bits around every region: only the region's bits may change.
        let noise: Vec<u64> = (0..words as u64).map(crate::numerics::mix64).collect();
        for p0 in [0u32, 1] {
            for pn in [1u32, 2] {
                for &lo in &ends {
                    for hi in
                        ends.iter().map(|h| h + 4).chain([lo, lo + 1, 4 * PSUM_SLOTS as u64 + 9])
                    {
                        let (s0, s1) =
                            ((lo / 4) as usize, (hi.div_ceil(4) as usize).min(PSUM_SLOTS));
                        let mut region = vec![0u64; words];
                        for p in p0 as usize..(p0 + pn) as usize {
                            for s in s0..s1.max(s0) {
                                let b = p * PSUM_SLOTS + s;
                                region[b / 64] |= 1 << (b % 64);
                            }
                        }
                        let at = format!("p0 {p0} pn {pn} bytes {lo}..{hi}");
                        let mut got = noise.clone();
                        psum_put(&mut got, p0, pn, lo, hi, true);
                        let want: Vec<u64> =
                            noise.iter().zip(&region).map(|(n, r)| n | r).collect();
                        assert_eq!(got, want, "set {at}");
                        assert!(psum_all_set(&got, p0, pn, lo, hi), "all set {at}");
                        psum_put(&mut got, p0, pn, lo, hi, false);
                        let want: Vec<u64> =
                            noise.iter().zip(&region).map(|(n, r)| n & !r).collect();
                        assert_eq!(got, want, "clear {at}");
                        let empty = s0 >= s1;
                        assert_eq!(psum_all_set(&got, p0, pn, lo, hi), empty, "none set {at}");
                        // One bit of the region missing (its first, a middle one or its
                        // last) is not all.
                        let bits: Vec<usize> = (0..words * 64)
                            .filter(|&b| region[b / 64] >> (b % 64) & 1 == 1)
                            .collect();
                        if let (Some(&first), Some(&last)) = (bits.first(), bits.last()) {
                            assert!(psum_all_set(&region, p0, pn, lo, hi), "exactly {at}");
                            for b in [first, bits[bits.len() / 2], last] {
                                let mut one_short = region.clone();
                                one_short[b / 64] &= !(1 << (b % 64));
                                assert!(!psum_all_set(&one_short, p0, pn, lo, hi), "bit {b} {at}");
                            }
                        }
                    }
                }
            }
        }
    }
}
