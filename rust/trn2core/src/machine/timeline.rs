//! The timeline: the recorded program run on the core's engines in parallel (TIME).
//!
//! # Semantics
//!
//! - Each instruction goes to its queue: PE, ACT, DVE, POOL, or DMA queue `0..16`. Every queue
//!   runs its instructions in issue order, one at a time (an instruction starts once the previous
//!   one on its queue has finished); the queues run in parallel.
//! - An instruction also waits for every earlier instruction it depends on to finish: it reads
//!   bytes an earlier one writes (read after write), or writes bytes an earlier one reads or
//!   writes (write after read, write after write), on overlapping partitions of the same memory
//!   (SBUF, PSUM, or an HBM tensor). These are the semaphores the compiler would insert.
//!   Strided access patterns count by their bounding byte range per partition.
//! - PE: instructions on disjoint PE tiles (row/column tiling) overlap, as `engine::cost` models
//!   single instructions; the PE still issues in order (an instruction never starts before the
//!   previous PE instruction started).
//! - DMA: an instruction holds its queue for the fixed cost, then for its data phase, which also
//!   needs the DMA engines serving its partitions (shared by all queues).
//! - Durations are [`super::cost`]'s, in exact integer ticks of 4.8 GHz.
//!
//! The result ([`KernelReport`]): the makespan, every queue's busy time and utilisation,
//! instruction counts per queue and opcode, DMA bytes, the critical path (the chain of
//! instructions, each started by the end of the previous one through a dependency or its queue,
//! that ends last), and a Perfetto trace with one track per engine and DMA queue.
//!
//! # Dependency tracking
//!
//! Per memory, a map from disjoint byte ranges to a few entries `(partition mask, last writer
//! and its finish, latest reader since and its finish)`, partitions as a `u128` mask; an
//! instruction touching one tile looks up and updates O(log ranges) entries, so a million
//! instructions schedule in well under a second.

use std::fmt::Write as _;

use crate::cancel::Cancel;
use crate::perf::write_bandwidth_counter_drained;
use crate::spec::{
    DMA_ENGINES_PER_CORE, DMA_QUEUES_PER_ENGINE, PE_COLS, PE_ROWS, PE_TILE_QUARTER, PSUM_BANK_BYTES,
};
use crate::{Error, Result};

use super::cost::{self, seconds};
use super::ranges::Ranges;
use super::record::{
    flags, Engine, Location, Opcode, Program, Queue, Region, MEM_HBM0, MEM_PSUM, NO_LOCATION,
};
use super::tile::partition_mask;

/// No instruction.
const NONE: u32 = u32::MAX;

/// Options of [`schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Trace slices for at most this many instructions (the numbers always cover all).
    pub trace_limit: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { trace_limit: 1_000_000 }
    }
}

/// One entry of a byte range's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    mask: u128,
    w_fin: u64,
    w_id: u32,
    r_fin: u64,
    r_id: u32,
}

/// A byte range's entries (disjoint masks).
type Entries = Vec<Entry>;

/// The history of one memory: disjoint byte ranges with their entries.
#[derive(Debug, Default)]
struct MemTrack {
    segs: Ranges<Entry>,
}

impl MemTrack {
    /// The latest finish among instructions that `(mask, lo..hi)` must wait for, and which.
    fn wait(&self, mask: u128, lo: u64, hi: u64, write: bool, best: &mut (u64, u32)) {
        for entries in self.segs.overlapping(lo, hi) {
            for e in entries {
                if e.mask & mask == 0 {
                    continue;
                }
                if e.w_fin > best.0 {
                    *best = (e.w_fin, e.w_id);
                }
                if write && e.r_fin > best.0 {
                    *best = (e.r_fin, e.r_id);
                }
            }
        }
    }

    /// Applies an access of `(mask, lo..hi)` that finishes at `fin`.
    fn update(&mut self, mask: u128, lo: u64, hi: u64, write: bool, fin: u64, id: u32) {
        if lo >= hi {
            return;
        }
        for entries in self.segs.cover(lo, hi) {
            if write {
                entries.retain_mut(|e| {
                    e.mask &= !mask;
                    e.mask != 0
                });
                entries.push(Entry { mask, w_fin: fin, w_id: id, r_fin: 0, r_id: NONE });
            } else {
                let mut uncovered = mask;
                let mut extra = Vec::new();
                for e in entries.iter_mut() {
                    let ov = e.mask & mask;
                    if ov == 0 {
                        continue;
                    }
                    uncovered &= !ov;
                    if e.r_fin >= fin {
                        continue;
                    }
                    if ov != e.mask {
                        extra.push(Entry { mask: e.mask & !ov, ..*e });
                        e.mask = ov;
                    }
                    e.r_fin = fin;
                    e.r_id = id;
                }
                entries.extend(extra);
                if uncovered != 0 {
                    entries.push(Entry {
                        mask: uncovered,
                        w_fin: 0,
                        w_id: NONE,
                        r_fin: fin,
                        r_id: id,
                    });
                }
                merge_entries(entries);
            }
        }
        self.segs.merge_at(lo);
        self.segs.merge_at(hi);
    }
}

/// Joins entries with the same history (their masks are disjoint).
fn merge_entries(entries: &mut Entries) {
    if entries.len() < 2 {
        return;
    }
    let mut i = 0;
    while i < entries.len() {
        let mut j = i + 1;
        while j < entries.len() {
            let (a, b) = (entries[i], entries[j]);
            if (a.w_fin, a.w_id, a.r_fin, a.r_id) == (b.w_fin, b.w_id, b.r_fin, b.r_id) {
                entries[i].mask |= b.mask;
                entries.swap_remove(j);
            } else {
                j += 1;
            }
        }
        i += 1;
    }
}

/// Why an instruction started when it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// At time 0, nothing before it.
    Start,
    /// When instruction `.0`, which it depends on, finished.
    Dependency(u32),
    /// When its queue (or the PE tile, or a DMA engine) was freed by instruction `.0`.
    Queue(u32),
    /// When the other physical core reached the same rendezvous (`sendrecv`, `core_barrier`:
    /// a hold of [`Program::hold_last`]).
    Peer,
}

/// One instruction of the critical path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathStep {
    /// Index in issue order.
    pub index: u32,
    /// What it is.
    pub opcode: Opcode,
    /// Where it ran.
    pub queue: Queue,
    /// Start, seconds.
    pub start_s: f64,
    /// End, seconds.
    pub end_s: f64,
    /// What it waited for.
    pub wait: Wait,
}

/// One instruction in the trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slice {
    /// Index in issue order.
    pub index: u32,
    /// What it is (the slice's name).
    pub opcode: Opcode,
    /// Its track.
    pub queue: Queue,
    /// Start, seconds.
    pub start_s: f64,
    /// Duration, seconds.
    pub dur_s: f64,
    /// What it waited for.
    pub wait: Wait,
    /// Bytes it moves (DMA) or writes (compute: its output regions).
    pub bytes: u64,
    /// Partitions it spans.
    pub partitions: u16,
    /// Elements per partition of its main input (the cost formulas' N).
    pub elements: u32,
    /// The PSUM bank it writes, if it writes PSUM.
    pub bank: Option<u8>,
    /// `nc_matmul`: the PE tile `(row start, rows, column start, columns)` in units of 32.
    pub pe_tile: Option<[u8; 4]>,
    /// Whether a side of it is in HBM (a DMA from or to an HBM tensor).
    pub touches_hbm: bool,
    /// Its source location (an index into [`KernelReport::locations`], or
    /// [`NO_LOCATION`]).
    pub location: u32,
}

/// Busy time one source location gave one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct LineStats {
    /// The location (an index into [`KernelReport::locations`], or [`NO_LOCATION`] for the
    /// instructions issued with none).
    pub location: u32,
    /// The queue.
    pub queue: Queue,
    /// Seconds of the queue's busy time its instructions account for: each instruction's
    /// share of [`QueueStats::busy_s`] (PE: what it added to the union of PE intervals; DMA:
    /// from taking its queue to its end), so a queue's rows sum to its busy time.
    pub busy_s: f64,
    /// Its instructions on the queue.
    pub instructions: u64,
}

/// Busy time and counts of one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    /// The queue.
    pub queue: Queue,
    /// Its track name (`"PE"`, `"DVE"`, `"DMA queue 3"`, ...).
    pub name: &'static str,
    /// Seconds with an instruction running (PE: the union over its tiles).
    pub busy_s: f64,
    /// `busy_s / seconds`.
    pub utilization: f64,
    /// Instructions run.
    pub instructions: u64,
}

/// The timeline of a recorded program (contract section 7's `KernelReport`).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelReport {
    /// Makespan in seconds.
    pub seconds: f64,
    /// Makespan in ticks of 4.8 GHz.
    pub ticks: u64,
    /// Instructions scheduled.
    pub instructions: u64,
    /// Per engine (always the four) and per DMA queue that ran something.
    pub queues: Vec<QueueStats>,
    /// Instructions per opcode (opcodes that ran, in [`Opcode::ALL`] order).
    pub opcodes: Vec<(Opcode, u64)>,
    /// Bytes moved by DMA.
    pub dma_bytes: u64,
    /// Bytes of those the compiler's spills and reloads moved (`dma_spill`).
    pub spill_bytes: u64,
    /// DMA queue time of the spills and reloads, seconds.
    pub spill_s: f64,
    /// The chain of instructions that ends last, first to last.
    pub critical_path: Vec<PathStep>,
    /// Start and end of every instruction (ticks), in issue order.
    pub start_ticks: Vec<u64>,
    /// End of every instruction (ticks), in issue order.
    pub end_ticks: Vec<u64>,
    /// Trace slices (up to the trace limit).
    pub slices: Vec<Slice>,
    /// Busy time per source location and queue (pairs that ran something), by location id
    /// then queue; the instructions issued with no location last.
    pub lines: Vec<LineStats>,
    /// The source locations of the program (what [`LineStats::location`] and
    /// [`Slice::location`] index).
    pub locations: Vec<Location>,
}

/// Schedules `program` (see the module doc).
pub fn schedule(program: &Program, options: &Options) -> Result<KernelReport> {
    let n = program.instrs.len();
    if n >= NONE as usize {
        return Err(Error::capacity(
            "program",
            format!("{n} instructions; a timeline takes fewer than 2**32"),
        ));
    }
    let nq = 4 + DMA_QUEUES_PER_ENGINE;
    let mut queue_free = vec![0u64; nq];
    let mut queue_last = vec![NONE; nq];
    let mut queue_busy = vec![0u64; nq];
    let mut queue_count = vec![0u64; nq];
    // PE: 4 x 4 blocks of 32 x 32, and the issue order.
    let blocks = PE_ROWS / PE_TILE_QUARTER;
    let mut pe_free = vec![(0u64, NONE); blocks * (PE_COLS / PE_TILE_QUARTER)];
    let mut pe_last_start = 0u64;
    let mut pe_busy_until = 0u64;
    let mut dma_engine_free = [(0u64, NONE); DMA_ENGINES_PER_CORE];
    let mut tracks: Vec<MemTrack> = Vec::new();
    let mut start = vec![0u64; n];
    let mut end = vec![0u64; n];
    let mut waits = vec![Wait::Start; n];
    let mut opcodes = vec![0u64; Opcode::ALL.len()];
    let mut dma_bytes = 0u64;
    let (mut spill_bytes, mut spill_ticks) = (0u64, 0u64);
    // Busy ticks and instructions per (location, queue); row `nloc` holds "no location".
    let nloc = program.locations.len();
    let mut line_busy = vec![(0u64, 0u64); (nloc + 1) * nq];
    let mut holds = program.holds.iter().peekable();

    for (i, ins) in program.instrs.iter().enumerate() {
        let id = i as u32;
        let c = cost::cost(ins);
        let q = ins.queue.index();
        // Dependencies.
        let mut dep = (0u64, NONE);
        let reads = program.reads(ins);
        let writes = program.writes(ins);
        for (r, write) in reads.iter().map(|r| (r, false)).chain(writes.iter().map(|r| (r, true))) {
            if let Some(t) = tracks.get(r.mem as usize) {
                t.wait(region_mask(r), r.lo, r.hi, write, &mut dep);
            }
        }
        let mut wait = if dep.1 == NONE { Wait::Start } else { Wait::Dependency(dep.1) };
        let mut ready = dep.0;
        while let Some(&&(at, tick)) = holds.peek() {
            if at > id {
                break;
            }
            if at == id && tick > ready {
                ready = tick;
                wait = Wait::Peer;
            }
            holds.next();
        }
        let (s, e, busy) = match ins.queue {
            Queue::Engine(Engine::Tensor) => {
                let t = ins.cost.pe_tile;
                let rows = t[0] as usize..(t[0] + t[1].max(1)) as usize;
                let cols = t[2] as usize..(t[2] + t[3].max(1)) as usize;
                let mut blk = (0u64, NONE);
                for r in rows.clone() {
                    for col in cols.clone() {
                        let b = pe_free[r.min(blocks - 1) * blocks + col.min(blocks - 1)];
                        if b.0 > blk.0 {
                            blk = b;
                        }
                    }
                }
                if blk.0 > ready {
                    ready = blk.0;
                    wait = Wait::Queue(blk.1);
                }
                if pe_last_start > ready {
                    ready = pe_last_start;
                    wait = Wait::Queue(queue_last[q]);
                }
                let e = ready + c.ticks;
                for r in rows {
                    for col in cols.clone() {
                        pe_free[r.min(blocks - 1) * blocks + col.min(blocks - 1)] = (e, id);
                    }
                }
                pe_last_start = ready;
                // Busy time is the union of PE intervals (tiles may overlap in time).
                let busy = e.saturating_sub(ready.max(pe_busy_until));
                pe_busy_until = pe_busy_until.max(e);
                (ready, e, busy)
            }
            Queue::Dma(_) => {
                if queue_free[q] > ready {
                    ready = queue_free[q];
                    wait = Wait::Queue(queue_last[q]);
                }
                let mut data_start = ready + c.fixed;
                for (k, f) in dma_engine_free.iter().enumerate() {
                    if c.engines >> k & 1 == 1 && f.0 > data_start {
                        data_start = f.0;
                        wait = Wait::Queue(f.1);
                    }
                }
                let e = data_start + c.data;
                for (k, f) in dma_engine_free.iter_mut().enumerate() {
                    if c.engines >> k & 1 == 1 {
                        *f = (e, id);
                    }
                }
                dma_bytes += ins.cost.bytes;
                if ins.cost.flags & flags::SPILL != 0 {
                    spill_bytes += ins.cost.bytes;
                    spill_ticks += e - ready;
                }
                (ready, e, e - ready)
            }
            Queue::Engine(_) => {
                if queue_free[q] > ready {
                    ready = queue_free[q];
                    wait = Wait::Queue(queue_last[q]);
                }
                let e = ready + c.ticks;
                (ready, e, c.ticks)
            }
        };
        queue_busy[q] += busy;
        let row = (ins.location as usize).min(nloc);
        let cell = &mut line_busy[row * nq + q];
        cell.0 += busy;
        cell.1 += 1;
        queue_free[q] = queue_free[q].max(e);
        queue_last[q] = id;
        queue_count[q] += 1;
        start[i] = s;
        end[i] = e;
        waits[i] = wait;
        opcodes[ins.opcode as usize] += 1;
        // Record the accesses.
        for (r, write) in reads.iter().map(|r| (r, false)).chain(writes.iter().map(|r| (r, true))) {
            let m = r.mem as usize;
            if tracks.len() <= m {
                tracks.resize_with(m + 1, MemTrack::default);
            }
            tracks[m].update(region_mask(r), r.lo, r.hi, write, e, id);
        }
    }

    let ticks = end.iter().copied().max().unwrap_or(0);
    let total_s = seconds(ticks);
    let queues = Queue::all()
        .filter(|qq| matches!(qq, Queue::Engine(_)) || queue_count[qq.index()] > 0)
        .map(|qq| {
            let k = qq.index();
            QueueStats {
                queue: qq,
                name: qq.track(),
                busy_s: seconds(queue_busy[k]),
                utilization: if ticks > 0 { queue_busy[k] as f64 / ticks as f64 } else { 0.0 },
                instructions: queue_count[k],
            }
        })
        .collect();
    let step = |i: usize| PathStep {
        index: i as u32,
        opcode: program.instrs[i].opcode,
        queue: program.instrs[i].queue,
        start_s: seconds(start[i]),
        end_s: seconds(end[i]),
        wait: waits[i],
    };
    let mut critical_path = Vec::new();
    if let Some((last, _)) = end.iter().enumerate().max_by_key(|&(i, &e)| (e, std::cmp::Reverse(i)))
    {
        let mut i = last;
        loop {
            critical_path.push(step(i));
            match waits[i] {
                Wait::Dependency(j) | Wait::Queue(j) if j != NONE && (j as usize) < i => {
                    i = j as usize
                }
                _ => break,
            }
        }
        critical_path.reverse();
    }
    let slices = (0..n.min(options.trace_limit))
        .map(|i| {
            let ins = &program.instrs[i];
            let writes = program.writes(ins);
            let written: u64 = writes.iter().map(|r| (r.hi - r.lo) * u64::from(r.pn)).sum();
            let is_dma = matches!(ins.queue, Queue::Dma(..));
            let hbm = program.reads(ins).iter().chain(writes).any(|r| r.mem >= MEM_HBM0);
            Slice {
                index: i as u32,
                opcode: ins.opcode,
                queue: ins.queue,
                start_s: seconds(start[i]),
                dur_s: seconds(end[i] - start[i]),
                wait: waits[i],
                bytes: if is_dma { ins.cost.bytes } else { written },
                partitions: ins.cost.partitions,
                elements: ins.cost.n,
                bank: writes
                    .iter()
                    .find(|r| r.mem == MEM_PSUM)
                    .map(|r| (r.lo / PSUM_BANK_BYTES).min(255) as u8),
                pe_tile: (ins.opcode == Opcode::NcMatmul).then_some(ins.cost.pe_tile),
                touches_hbm: is_dma && hbm,
                location: if (ins.location as usize) < nloc { ins.location } else { NO_LOCATION },
            }
        })
        .collect();
    let lines = line_busy
        .iter()
        .enumerate()
        .filter(|(_, cell)| cell.1 > 0)
        .filter_map(|(k, &(busy, count))| {
            let queue = Queue::all().nth(k % nq)?;
            Some(LineStats {
                location: if k / nq < nloc { (k / nq) as u32 } else { NO_LOCATION },
                queue,
                busy_s: seconds(busy),
                instructions: count,
            })
        })
        .collect();
    Ok(KernelReport {
        seconds: total_s,
        ticks,
        instructions: n as u64,
        queues,
        opcodes: Opcode::ALL
            .iter()
            .filter(|o| opcodes[**o as usize] > 0)
            .map(|o| (*o, opcodes[*o as usize]))
            .collect(),
        dma_bytes,
        spill_bytes,
        spill_s: seconds(spill_ticks),
        critical_path,
        start_ticks: start,
        end_ticks: end,
        slices,
        lines,
        locations: program.locations.clone(),
    })
}

/// Appends `text` as a JSON string (quoted; quotes, backslashes and control characters escaped):
/// a file name may hold any of them.
fn write_json_string(out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The partition mask of a region.
fn region_mask(r: &Region) -> u128 {
    partition_mask(r.p0 as u32, r.pn as u32)
}

/// Bytes of trace text [`KernelReport::write_chrome_trace`] hands on at a time.
pub const TRACE_CHUNK: usize = 1 << 20;

impl KernelReport {
    /// The statistics of a queue.
    pub fn queue(&self, q: Queue) -> Option<&QueueStats> {
        self.queues.iter().find(|s| s.queue == q)
    }

    /// The Chrome/Perfetto trace: one track per engine and DMA queue, one slice per
    /// instruction named by its opcode, with its index, what it waited for, bytes,
    /// partitions, elements per partition, PSUM bank, PE tile and whether it is on the critical
    /// path as arguments; a flow arrow from each instruction to the one that waited for its
    /// result (category `critical_path` along the critical path, else `dependency`); counter
    /// tracks of the DMA and HBM bandwidth (GB/s).
    pub fn chrome_trace_json(&self) -> String {
        let mut text = String::with_capacity(256 + self.slices.len() * 140);
        // Into a string, with no token: neither the sink nor a check can fail.
        let _ = self.write_chrome_trace(&Cancel::none(), &mut |chunk| {
            text.push_str(chunk);
            Ok(())
        });
        text
    }

    /// [`KernelReport::chrome_trace_json`] handed to `sink` in pieces of about
    /// [`TRACE_CHUNK`] bytes, checking `cancel` between pieces: a trace of a million
    /// instructions is written to a file without ever being held whole (hundreds of MB).
    /// Stops at the first error of `sink` or of the check.
    pub fn write_chrome_trace(
        &self, cancel: &Cancel, sink: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let mut drain = |out: &mut String| -> Result<()> {
            if out.len() >= TRACE_CHUNK {
                cancel.check()?;
                sink(out.as_str())?;
                out.clear();
            }
            Ok(())
        };
        let mut order: Vec<Queue> = Vec::new();
        for s in &self.slices {
            if !order.contains(&s.queue) {
                order.push(s.queue);
            }
        }
        order.sort_by_key(|q| q.index());
        let mut out = String::with_capacity(TRACE_CHUNK + 4096);
        out.push_str("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
        out.push_str(
            "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"trn2core NeuronCore-v3 (machine)\"}}",
        );
        for q in &order {
            let _ = write!(
                out,
                ",{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                q.index(),
                q.track()
            );
        }
        let on_path: std::collections::HashSet<u32> =
            self.critical_path.iter().map(|p| p.index).collect();
        for s in &self.slices {
            let (kind, on) = match s.wait {
                Wait::Start => ("start", -1i64),
                Wait::Peer => ("peer", -1i64),
                Wait::Dependency(j) => ("dependency", j as i64),
                Wait::Queue(j) => ("queue", j as i64),
            };
            let _ = write!(
                out,
                ",{{\"ph\":\"X\",\"name\":\"{}\",\"pid\":0,\"tid\":{},\"ts\":{:.6},\"dur\":{:.6},\"args\":{{\"index\":{},\"waited_for\":\"{kind}\",\"on\":{on},\"bytes\":{},\"partitions\":{},\"elements\":{},\"critical_path\":{}",
                s.opcode.name(),
                s.queue.index(),
                s.start_s * 1e6,
                s.dur_s * 1e6,
                s.index,
                s.bytes,
                s.partitions,
                s.elements,
                u8::from(on_path.contains(&s.index)),
            );
            if let Some(b) = s.bank {
                let _ = write!(out, ",\"bank\":{b}");
            }
            if let Some(loc) = self.locations.get(s.location as usize) {
                out.push_str(",\"line\":");
                write_json_string(&mut out, &format!("{}:{}", loc.file, loc.line));
            }
            if let Some([r0, rn, c0, cn]) = s.pe_tile {
                let q = PE_TILE_QUARTER;
                let _ = write!(
                    out,
                    ",\"tile_row\":{},\"tile_rows\":{},\"tile_col\":{},\"tile_cols\":{}",
                    usize::from(r0) * q,
                    usize::from(rn) * q,
                    usize::from(c0) * q,
                    usize::from(cn) * q
                );
            }
            out.push_str("}}");
            drain(&mut out)?;
        }
        // Dependencies: instruction j's result is what instruction i waited for. The arrow
        // leaves j's slice in its middle and ends where i starts.
        let traced = self.slices.len();
        for s in &self.slices {
            if let Wait::Dependency(j) = s.wait {
                let j = j as usize;
                if j >= traced {
                    continue;
                }
                let from = &self.slices[j];
                let cat = if on_path.contains(&s.index) && on_path.contains(&from.index) {
                    "critical_path"
                } else {
                    "dependency"
                };
                let _ = write!(
                    out,
                    ",{{\"ph\":\"s\",\"name\":\"{cat}\",\"cat\":\"{cat}\",\"id\":{},\"pid\":0,\"tid\":{},\"ts\":{:.6}}}",
                    s.index,
                    from.queue.index(),
                    (from.start_s + from.dur_s / 2.0) * 1e6
                );
                let _ = write!(
                    out,
                    ",{{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"{cat}\",\"cat\":\"{cat}\",\"id\":{},\"pid\":0,\"tid\":{},\"ts\":{:.6}}}",
                    s.index,
                    s.queue.index(),
                    s.start_s * 1e6
                );
                drain(&mut out)?;
            }
        }
        let dma: Vec<(f64, f64, f64)> = self
            .slices
            .iter()
            .filter(|s| matches!(s.queue, Queue::Dma(..)))
            .map(|s| (s.start_s, s.dur_s, s.bytes as f64))
            .collect();
        write_bandwidth_counter_drained(&mut out, 0, "DMA bandwidth", &dma, &mut drain)?;
        let hbm: Vec<(f64, f64, f64)> = self
            .slices
            .iter()
            .filter(|s| s.touches_hbm)
            .map(|s| (s.start_s, s.dur_s, s.bytes as f64))
            .collect();
        write_bandwidth_counter_drained(&mut out, 0, "HBM bandwidth", &hbm, &mut drain)?;
        out.push_str("]}");
        cancel.check()?;
        sink(out.as_str())
    }
}

impl std::fmt::Display for KernelReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "NeuronCore timeline: {} instructions in {:.3} us",
            self.instructions,
            self.seconds * 1e6
        )?;
        writeln!(f, "  {:<14} {:>12} {:>8} {:>12}", "queue", "busy (us)", "util", "instructions")?;
        for q in &self.queues {
            writeln!(
                f,
                "  {:<14} {:>12.3} {:>7.1}% {:>12}",
                q.name,
                q.busy_s * 1e6,
                q.utilization * 100.0,
                q.instructions
            )?;
        }
        let ops: Vec<String> =
            self.opcodes.iter().map(|(o, c)| format!("{} {c}", o.name())).collect();
        writeln!(f, "  opcodes: {}", ops.join(", "))?;
        writeln!(f, "  DMA bytes: {}", self.dma_bytes)?;
        if self.spill_bytes > 0 {
            writeln!(
                f,
                "  spills: {} bytes, {:.3} us of DMA queue time",
                self.spill_bytes,
                self.spill_s * 1e6
            )?;
        }
        write!(f, "  critical path: {} instructions", self.critical_path.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{AluOp, Dtype, Machine, MachineConfig};
    use crate::memory::Space;

    /// Busy time per source line: each queue's rows sum to its busy time, instructions issued
    /// with no location get their own row, and the trace names each slice's line.
    #[test]
    fn lines_sum_to_the_queues_busy_time() {
        let mut m = Machine::new(MachineConfig::default()).expect("machine");
        let a = m.alloc(Space::Sbuf, "a", &[128, 512], Dtype::Fp32).expect("a");
        let b = m.alloc(Space::Sbuf, "b", &[128, 512], Dtype::Fp32).expect("b");
        m.memset(Engine::Vector, &a, 1.0).expect("unlocated");
        let one = m.locate("k\"\\.py", 3).expect("locate");
        let two = m.locate("k.py", 4).expect("locate");
        assert_eq!(m.locate("k.py", 4).expect("again"), two);
        m.set_location(Some(one)).expect("set");
        m.memset(Engine::Gpsimd, &b, 2.0).expect("memset");
        m.tensor_tensor(Engine::Vector, &b, &a, &b, AluOp::Add).expect("tt");
        m.set_location(Some(two)).expect("set");
        for _ in 0..3 {
            m.tensor_tensor(Engine::Vector, &a, &a, &b, AluOp::Multiply).expect("tt");
        }
        assert_eq!(m.instruction_location(0), None);
        assert_eq!(m.instruction_location(2), Some(one));
        assert_eq!(m.instruction_location(5), Some(two));
        let err = m.set_location(Some(7)).expect_err("unknown id");
        assert_eq!(err.arg(), Some("location"));
        let rep = m.run().expect("run");
        let dve = rep.queue(Queue::Engine(Engine::Vector)).expect("dve");
        let rows: Vec<_> =
            rep.lines.iter().filter(|l| l.queue == Queue::Engine(Engine::Vector)).collect();
        assert_eq!(
            rows.iter().map(|l| (l.location, l.instructions)).collect::<Vec<_>>(),
            vec![(one, 1), (two, 3), (NO_LOCATION, 1)]
        );
        let sum: f64 = rows.iter().map(|l| l.busy_s).sum();
        assert!((sum - dve.busy_s).abs() <= 1e-15 * dve.busy_s.max(1.0), "{sum} {dve:?}");
        assert!(rows[1].busy_s > rows[0].busy_s);
        let trace = rep.chrome_trace_json();
        assert_eq!(trace.matches("\"line\":\"k.py:4\"").count(), 3);
        assert_eq!(trace.matches(r#""line":"k\"\\.py:3""#).count(), 2);
        assert_eq!(trace.matches("\"line\"").count(), 5);
    }
}
