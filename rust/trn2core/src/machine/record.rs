//! The recorded program: every instruction the machine executed, as data. The functional side
//! (`isa`) appends one [`Instr`] per instruction with the memory regions it read and wrote and
//! the numbers its cost formula needs; the timing side (`cost`, `timeline`) reads them. Neither
//! side imports the other: this module is all they share.

use std::collections::HashMap;

use crate::spec::DMA_QUEUES_PER_ENGINE;
use crate::{Error, Result};

named_enum! {
    /// A compute engine of the NeuronCore (the `engine=` of NKI's ISA calls).
    pub enum Engine("engine", value) {
        /// The tensor engine (PE array).
        Tensor = "tensor",
        /// The Vector engine (DVE).
        Vector = "vector",
        /// The Scalar engine (ACT).
        Scalar = "scalar",
        /// The GpSimd engine (POOL).
        Gpsimd = "gpsimd",
    }
}

impl Engine {
    /// The profiler's name of the engine, used for trace tracks.
    pub const fn track(self) -> &'static str {
        match self {
            Engine::Tensor => "PE",
            Engine::Vector => "DVE",
            Engine::Scalar => "ACT",
            Engine::Gpsimd => "POOL",
        }
    }
}

/// Where an instruction runs: an engine's queue or one of the 16 DMA queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queue {
    /// A compute engine.
    Engine(Engine),
    /// DMA queue `0..16` (one queue id on every DMA engine, \[S12\]).
    Dma(u8),
}

impl Queue {
    /// Every queue: the four engines, then the DMA queues.
    pub fn all() -> impl Iterator<Item = Queue> {
        Engine::ALL
            .into_iter()
            .map(Queue::Engine)
            .chain((0..DMA_QUEUES_PER_ENGINE as u8).map(Queue::Dma))
    }

    /// A dense index: engines 0..4, DMA queue q at 4 + q.
    pub fn index(self) -> usize {
        match self {
            Queue::Engine(e) => e as usize,
            Queue::Dma(q) => 4 + q as usize,
        }
    }

    /// The trace track: `"PE"`, `"DVE"`, `"ACT"`, `"POOL"` or `"DMA queue 3"`.
    pub fn track(self) -> &'static str {
        const DMA: [&str; 16] = [
            "DMA queue 0",
            "DMA queue 1",
            "DMA queue 2",
            "DMA queue 3",
            "DMA queue 4",
            "DMA queue 5",
            "DMA queue 6",
            "DMA queue 7",
            "DMA queue 8",
            "DMA queue 9",
            "DMA queue 10",
            "DMA queue 11",
            "DMA queue 12",
            "DMA queue 13",
            "DMA queue 14",
            "DMA queue 15",
        ];
        match self {
            Queue::Engine(e) => e.track(),
            Queue::Dma(q) => DMA[(q as usize).min(DMA.len() - 1)],
        }
    }
}

named_enum! {
    /// The instructions, named as the NKI ISA names them.
    pub enum Opcode("opcode", value) {
        /// `nc_matmul` (tensor engine).
        NcMatmul = "nc_matmul",
        /// `nc_transpose` (tensor engine, or Vector for up to 32 x 32).
        NcTranspose = "nc_transpose",
        /// `tensor_tensor`.
        TensorTensor = "tensor_tensor",
        /// `tensor_scalar`.
        TensorScalar = "tensor_scalar",
        /// `scalar_tensor_tensor`.
        ScalarTensorTensor = "scalar_tensor_tensor",
        /// `tensor_reduce`.
        TensorReduce = "tensor_reduce",
        /// `tensor_copy`.
        TensorCopy = "tensor_copy",
        /// `tensor_tensor_scan`.
        TensorTensorScan = "tensor_tensor_scan",
        /// `tensor_scalar_reduce`.
        TensorScalarReduce = "tensor_scalar_reduce",
        /// `activation`.
        Activation = "activation",
        /// `activation_reduce`.
        ActivationReduce = "activation_reduce",
        /// `reciprocal` (Vector engine).
        Reciprocal = "reciprocal",
        /// `memset`.
        Memset = "memset",
        /// `iota` (GpSimd).
        Iota = "iota",
        /// `affine_select` (GpSimd).
        AffineSelect = "affine_select",
        /// `select` (Vector): `predicate ? on_true : on_false`.
        Select = "select",
        /// `bn_stats` (Vector).
        BnStats = "bn_stats",
        /// `bn_aggr` (Vector).
        BnAggr = "bn_aggr",
        /// `dma_copy`.
        DmaCopy = "dma_copy",
        /// `max8` (Vector): the 8 largest values of each partition.
        Max8 = "max8",
        /// `nc_find_index8` (Vector): where 8 values first occur in each partition.
        NcFindIndex8 = "nc_find_index8",
        /// `nc_match_replace8` (Vector): the first occurrences of 8 values replaced by `imm`.
        NcMatchReplace8 = "nc_match_replace8",
        /// `nc_stream_shuffle` (Vector): partitions moved within each quadrant by a mask.
        NcStreamShuffle = "nc_stream_shuffle",
        /// `nc_n_gather` (GpSimd): elements of each partition picked by uint32 indices.
        NcNGather = "nc_n_gather",
        /// `dma_transpose`: HBM or SBUF to SBUF with the source's axes permuted.
        DmaTranspose = "dma_transpose",
        /// `range_select` (Vector): elements kept by their free index's range, max-reduced.
        RangeSelect = "range_select",
        /// `select_reduce` (Vector): `predicate ? on_true : on_false`, max-reduced.
        SelectReduce = "select_reduce",
        /// `tensor_partition_reduce` (GpSimd): a reduction across partitions.
        TensorPartitionReduce = "tensor_partition_reduce",
        /// `nonzero_with_count` (GpSimd): positions of nonzero elements and their count.
        NonzeroWithCount = "nonzero_with_count",
        /// `sequence_bounds` (GpSimd): each element's segment start and end.
        SequenceBounds = "sequence_bounds",
        /// `tensor_scalar_cumulative` (Vector): a running op1 of op0's results along each
        /// partition.
        TensorScalarCumulative = "tensor_scalar_cumulative",
        /// `exponential` (Vector): `exp(src - max_value)`, add-reduced.
        Exponential = "exponential",
        /// `dropout` (Vector): elements zeroed with a probability (a deterministic stream).
        Dropout = "dropout",
        /// `set_rng_seed` (Vector): seeds the engine's random stream that dropouts draw.
        SetRngSeed = "set_rng_seed",
        /// `rng` (Vector or GpSimd): 32 random bits per element, truncated to dst's integers.
        Rng = "rng",
        /// `rand_set_state` (GpSimd): seeds each lane's XORWOW generator from SBUF.
        RandSetState = "rand_set_state",
        /// `rand_get_state` (GpSimd): stores each lane's XORWOW state to SBUF.
        RandGetState = "rand_get_state",
        /// `activate2` (Scalar): an activation after two tensor-scalar operations, reduced.
        Activate2 = "activate2",
        /// `tensor_copy_dynamic_src`: a copy whose source is moved along its partitions by an
        /// offset read from SBUF when it runs.
        TensorCopyDynamicSrc = "tensor_copy_dynamic_src",
        /// `tensor_copy_dynamic_dst`: a copy whose destination is moved so.
        TensorCopyDynamicDst = "tensor_copy_dynamic_dst",
        /// `dma_compute`: the float32 sum of several tiles, written to one, over a DMA queue.
        DmaCompute = "dma_compute",
        /// `core_barrier`: a point both physical cores of a logical core reach before either
        /// goes on (its engine waits; later accesses of its HBM tensor wait for it).
        CoreBarrier = "core_barrier",
        /// `local_gather` (GpSimd): each 16-partition group's partitions gather elements of
        /// their own row at the group's uint16 indices.
        LocalGather = "local_gather",
        /// `nc_matmul_mx` (Tensor, NeuronCore-v4): an MXFP8/MXFP4 matmul with its scales.
        NcMatmulMx = "nc_matmul_mx",
        /// `quantize_mx` (Vector, NeuronCore-v4): FP16/BF16 to MXFP8 data and scales.
        QuantizeMx = "quantize_mx",
        /// `rand2` (Vector, NeuronCore-v4): uniform random values in `[min, max]`.
        Rand2 = "rand2",
    }
}

/// A memory region an instruction touches: the partitions `p0 .. p0 + pn` of memory `mem`
/// (0 = SBUF, 1 = PSUM, 2 + slot = an HBM tensor, which has one "partition"), bytes
/// `lo .. hi` of each. Strided patterns are recorded by their bounding byte range (a
/// conservative dependency: never missed, sometimes one too many).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Memory id.
    pub mem: u32,
    /// First partition.
    pub p0: u16,
    /// Partitions.
    pub pn: u16,
    /// First byte.
    pub lo: u64,
    /// One past the last byte.
    pub hi: u64,
}

/// Memory id of SBUF in a [`Region`].
pub const MEM_SBUF: u32 = 0;
/// Memory id of PSUM in a [`Region`].
pub const MEM_PSUM: u32 = 1;
/// Memory id of the first HBM tensor (slot 0) in a [`Region`].
pub const MEM_HBM0: u32 = 2;

/// Flags of [`CostInput`]: conditions of the published cost formulas.
pub mod flags {
    /// An input operand is in PSUM.
    pub const PSUM_INPUT: u32 = 1;
    /// The output is in PSUM.
    pub const PSUM_OUTPUT: u32 = 1 << 1;
    /// Every tensor operand (in and out) is bf16 or fp16.
    pub const ALL_16BIT: u32 = 1 << 2;
    /// Every tensor operand (in and out) is bf16.
    pub const ALL_BF16: u32 = 1 << 3;
    /// Every tensor operand's innermost dimension has stride 1.
    pub const CONTIGUOUS: u32 = 1 << 4;
    /// `tensor_tensor`: the op is add, subtract or multiply.
    pub const ADD_SUB_MUL: u32 = 1 << 5;
    /// `tensor_reduce`: the op is add or maximum.
    pub const ADD_OR_MAX: u32 = 1 << 6;
    /// `scalar_tensor_tensor`: op0 subtract, op1 multiply.
    pub const SUB_THEN_MUL: u32 = 1 << 7;
    /// `memset`: the value is zero.
    pub const ZERO_VALUE: u32 = 1 << 8;
    /// Reads out accumulation registers into a tile (activation with `reduce_res`).
    pub const READ_ACCUMULATOR: u32 = 1 << 9;
    /// `nc_matmul`: an operand is fp32 (x4 cost); `nc_transpose`: the data is fp32 (x2).
    pub const FP32: u32 = 1 << 10;
    /// `nc_matmul` in transpose mode.
    pub const TRANSPOSE: u32 = 1 << 11;
    /// A DMA reads HBM.
    pub const DMA_FROM_HBM: u32 = 1 << 12;
    /// A DMA writes HBM.
    pub const DMA_TO_HBM: u32 = 1 << 13;
    /// GpSimd `tensor_scalar` with `rsqrt` (4x lower throughput, \[S11\]).
    pub const RSQRT: u32 = 1 << 14;
    /// A DMA transposes (`dma_transpose`: a fraction of the copy throughput).
    pub const DMA_TRANSPOSE: u32 = 1 << 15;
    /// A DMA the compiler adds to spill a block to HBM or reload it (`dma_spill`).
    pub const SPILL: u32 = 1 << 16;
}

/// What an instruction's cost formula needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CostInput {
    /// N: elements per partition of the instruction's main input (the formulas' N).
    pub n: u32,
    /// Partitions the instruction spans (DMA: of its SBUF side).
    pub partitions: u16,
    /// First of those partitions (DMA: which DMA engines serve the transfer).
    pub start_partition: u16,
    /// `nc_matmul`: stationary free size M; `nc_transpose`: the input's partitions.
    pub m: u16,
    /// `nc_matmul`: moving free size N; `nc_transpose`: the input's free size.
    pub k: u16,
    /// `nc_matmul`: PE tile `(row start, rows, column start, columns)` in units of 32.
    pub pe_tile: [u8; 4],
    /// Condition flags ([`flags`]).
    pub flags: u32,
    /// DMA: bytes moved.
    pub bytes: u64,
}

/// One recorded instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instr {
    /// What it is.
    pub opcode: Opcode,
    /// Where it runs.
    pub queue: Queue,
    /// First of its regions in [`Program::regions`].
    pub first_region: u32,
    /// Regions read (they come first).
    pub reads: u8,
    /// Regions written (after the reads).
    pub writes: u8,
    /// Cost-formula inputs.
    pub cost: CostInput,
    /// Where in a kernel's source it was issued: an index into [`Program::locations`], or
    /// [`NO_LOCATION`].
    pub location: u32,
}

/// The location of an instruction issued with none set (the machine used directly, outside
/// any kernel).
pub const NO_LOCATION: u32 = u32::MAX;

/// A line of a kernel's source: what a front end names as the issuer of instructions (for
/// NKI, the innermost frame of the user's code). Opaque to the machine: it only carries it
/// into the timeline's per-line sums and the trace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// The source file (`"<string>"` for code without a file).
    pub file: String,
    /// The line in it (1-based).
    pub line: u32,
}

/// The recorded program: instructions in issue order and their regions.
#[derive(Debug, Clone)]
pub struct Program {
    /// Instructions in issue order.
    pub instrs: Vec<Instr>,
    /// Regions of all instructions, each instruction's reads then writes.
    pub regions: Vec<Region>,
    /// The source locations instructions name, each once ([`Program::locate`]).
    pub locations: Vec<Location>,
    /// The location stamped on instructions pushed from now on.
    location: u32,
    /// Each location's index in `locations`.
    location_ids: HashMap<Location, u32>,
    /// `(instruction, tick)`: the instruction starts no earlier than the tick (another core's
    /// clock at a rendezvous, [`Program::hold_last`]), in increasing instruction order.
    pub holds: Vec<(u32, u64)>,
}

/// The instruction and region vectors of programs that are gone, kept empty for the next
/// programs of the process (a host detail, like the memories' pool in `memory.rs`): a kernel of
/// thousands of instructions otherwise grows both from nothing each launch, and each doubling
/// is fresh memory the host faults in and clears (a few percent of a small instruction's cost).
mod spare {
    use super::{Instr, Region};
    use std::sync::Mutex;

    /// Pairs kept: enough for the machines of a two-core launch and a few threads.
    const KEEP: usize = 4;
    /// Bytes of capacity above which a vector is given back to the host instead.
    const MAX_BYTES: usize = 8 << 20;

    static SPARE: Mutex<Vec<(Vec<Instr>, Vec<Region>)>> = Mutex::new(Vec::new());

    fn spare() -> std::sync::MutexGuard<'static, Vec<(Vec<Instr>, Vec<Region>)>> {
        // A panic elsewhere while the lock was held leaves only whole entries: keep using it.
        SPARE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Empty vectors, with the capacity of a gone program's when one is kept.
    pub(super) fn take() -> (Vec<Instr>, Vec<Region>) {
        spare().pop().unwrap_or_default()
    }

    /// Keeps a gone program's vectors (emptied) for a later one, if there is room.
    pub(super) fn give(mut instrs: Vec<Instr>, mut regions: Vec<Region>) {
        let bytes = |cap: usize, size: usize| cap.saturating_mul(size);
        if instrs.capacity() == 0
            || bytes(instrs.capacity(), size_of::<Instr>()) > MAX_BYTES
            || bytes(regions.capacity(), size_of::<Region>()) > MAX_BYTES
        {
            return;
        }
        instrs.clear();
        regions.clear();
        let mut s = spare();
        if s.len() < KEEP {
            s.push((instrs, regions));
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        spare::give(std::mem::take(&mut self.instrs), std::mem::take(&mut self.regions));
    }
}

impl Default for Program {
    fn default() -> Self {
        let (instrs, regions) = spare::take();
        Program {
            instrs,
            regions,
            locations: Vec::new(),
            location: NO_LOCATION,
            location_ids: HashMap::new(),
            holds: Vec::new(),
        }
    }
}

impl Program {
    /// The id of `file:line` in [`Program::locations`] (added when new).
    pub fn locate(&mut self, file: &str, line: u32) -> Result<u32> {
        let key = Location { file: file.to_owned(), line };
        if let Some(&id) = self.location_ids.get(&key) {
            return Ok(id);
        }
        let id = self.locations.len();
        if id >= NO_LOCATION as usize {
            return Err(Error::capacity(
                "location",
                format!("{id} source locations; a program names fewer than 2**32 - 1"),
            ));
        }
        self.locations.push(key.clone());
        self.location_ids.insert(key, id as u32);
        Ok(id as u32)
    }

    /// Stamps `location` (an id of [`Program::locate`], or `None` for no location) on the
    /// instructions pushed from now on; `ValueError` naming `location` for an unknown id.
    pub fn set_location(&mut self, location: Option<u32>) -> Result<()> {
        self.location = match location {
            None => NO_LOCATION,
            Some(id) if (id as usize) < self.locations.len() => id,
            Some(id) => {
                return Err(Error::value(
                    "location",
                    format!(
                        "{id} is not a location of this machine (it has {}; ids come from \
                         locate)",
                        self.locations.len()
                    ),
                ))
            }
        };
        Ok(())
    }

    /// The location stamped on instructions pushed now (`None`: no location).
    pub fn location(&self) -> Option<u32> {
        (self.location != NO_LOCATION).then_some(self.location)
    }

    /// The location of instruction `index` (`None`: issued with none, or no such
    /// instruction).
    pub fn location_of(&self, index: usize) -> Option<&Location> {
        let id = self.instrs.get(index)?.location;
        self.locations.get(id as usize)
    }

    /// Holds the last recorded instruction until `tick` at least (a front end joining two
    /// cores' clocks at a rendezvous: the timeline starts it at the later of its own ready time
    /// and `tick`, [`super::timeline::Wait::Peer`]). `ValueError` naming `tick` with no
    /// instruction recorded.
    pub fn hold_last(&mut self, tick: u64) -> Result<()> {
        let Some(last) = self.instrs.len().checked_sub(1) else {
            return Err(Error::value("tick", "no instruction recorded to hold"));
        };
        let last = last as u32;
        match self.holds.last_mut() {
            Some(h) if h.0 == last => h.1 = h.1.max(tick),
            _ => self.holds.push((last, tick)),
        }
        Ok(())
    }

    /// Appends an instruction with its regions.
    pub fn push(
        &mut self, opcode: Opcode, queue: Queue, reads: &[Region], writes: &[Region],
        cost: CostInput,
    ) {
        self.push_with(opcode, queue, cost, |regions| {
            regions.extend_from_slice(reads);
            regions.extend_from_slice(writes);
            (reads.len(), writes.len())
        });
    }

    /// [`Program::push`] of an instruction writing one region and reading `reads` then
    /// `extra`, without staging its regions anywhere else.
    pub(crate) fn push_one_write(
        &mut self, opcode: Opcode, queue: Queue, reads: impl ExactSizeIterator<Item = Region>,
        extra: &[Region], write: Region, cost: CostInput,
    ) {
        let n = reads.len() + extra.len();
        self.push_with(opcode, queue, cost, |regions| {
            regions.extend(reads);
            regions.extend_from_slice(extra);
            regions.push(write);
            (n, 1)
        });
    }

    /// Appends an instruction whose regions `add` appends (its reads, then its writes),
    /// returning how many it read and wrote.
    fn push_with(
        &mut self, opcode: Opcode, queue: Queue, cost: CostInput,
        add: impl FnOnce(&mut Vec<Region>) -> (usize, usize),
    ) {
        let first_region = self.regions.len() as u32;
        let (reads, writes) = add(&mut self.regions);
        self.instrs.push(Instr {
            opcode,
            queue,
            first_region,
            reads: reads as u8,
            writes: writes as u8,
            cost,
            location: self.location,
        });
    }

    /// Forgets every instruction, keeping the vectors' capacity for the next program (and the
    /// locations, whose ids a front end may hold).
    pub(crate) fn clear(&mut self) {
        self.instrs.clear();
        self.regions.clear();
        self.holds.clear();
    }

    /// The regions an instruction reads.
    pub fn reads(&self, i: &Instr) -> &[Region] {
        let s = i.first_region as usize;
        &self.regions[s..s + i.reads as usize]
    }

    /// The regions an instruction writes.
    pub fn writes(&self, i: &Instr) -> &[Region] {
        let s = i.first_region as usize + i.reads as usize;
        &self.regions[s..s + i.writes as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program's vectors are kept for the next one when it is dropped (`spare`): the next
    /// program starts empty whatever the last one recorded, and records the same.
    #[test]
    fn a_new_program_starts_empty_after_a_kept_one() {
        let region = |lo| Region { mem: MEM_SBUF, p0: 0, pn: 128, lo, hi: lo + 256 };
        let record = |p: &mut Program, n: u64| {
            for i in 0..n {
                p.push(
                    Opcode::TensorTensor,
                    Queue::Engine(Engine::Vector),
                    &[region(i)],
                    &[region(i + 1)],
                    CostInput::default(),
                );
            }
        };
        let mut first = Program::default();
        record(&mut first, 1000);
        let kept = first.instrs.clone();
        drop(first);
        for _ in 0..3 {
            let mut p = Program::default();
            assert!(p.instrs.is_empty() && p.regions.is_empty() && p.holds.is_empty());
            assert!(p.locations.is_empty() && p.location().is_none());
            record(&mut p, 1000);
            assert_eq!(p.instrs, kept);
            assert_eq!(p.regions.len(), 2000);
            assert_eq!(p.writes(&p.instrs[999]), &[region(1000)]);
        }
    }
}
