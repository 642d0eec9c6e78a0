//! The PE side of a GEMM's tile schedule (the schedule is described at
//! [`super::plan::estimate_gemm`]), on an integer clock, evaluated two ways that give the
//! same state bit for bit:
//!
//! - [`walk`]: every `nc_matmul` in order, the reference; linear in the instruction count.
//! - [`fast`]: the same state machine, with two shortcuts that are exact (docs/performance-model.md,
//!   "How the schedule is evaluated"):
//!   1. inside an accumulation group, the K tiles between the first (whose matmuls may wait for
//!      their PSUM banks) and the last (whose matmuls hand the banks to the evictors) only run
//!      matmuls back to back; once the throttle's ramp is over they take exactly their PE
//!      cycles, so they are added in one step;
//!   2. the full groups of a row tile (8 column tiles of 512) are identical units, and so are
//!      the full row tiles (128 rows). Before each unit the state *relative to now* is taken as
//!      a key: every PSUM bank's busy-until time (clamped at now: a bank free in the past is as
//!      free as one free now), both evictors' busy-until times (exact, they are compared with
//!      each other), the next bank, and the throttle's [`ThrottleKey`]. Equal keys have equal
//!      futures, shifted in time. When a key repeats after `p` units the schedule is periodic:
//!      the next `q` whole periods are applied at once (every time moves `q * dt` later, every
//!      counter grows by `q` times its growth over one period) and the remaining `< p` units
//!      are evaluated one by one. Repeats are found with Brent's cycle detection ([`Sim::repeat`]).
//!
//! # Clock
//!
//! Times are whole ticks of [`TICK_HZ`], the least common multiple of the PE (2.4 GHz), Scalar
//! (1.2 GHz) and Vector (0.96 GHz) clocks (4.8 GHz): a PE cycle is 2 ticks, an ACT cycle 4 and a
//! DVE cycle 5, so every duration is a whole number of ticks and every sum is exact. Only the
//! throttle's ramp is not a whole number of ticks; it is rounded to the nearest tick
//! ([`TickThrottle`]).

use super::instr::{load_stationary_cycles, matmul_cycles};
use super::throttle::{ThrottleKey, TickThrottle};
use crate::cancel::Cancel;
use crate::perf::Event;
use crate::spec::{
    MATMUL_MOVING_FREE_MAX, MATMUL_STATIONARY_FREE_MAX, MIN_II_CYCLES, PE_CLOCK_HZ, PSUM_BANKS,
    SCALAR_CLOCK_HZ, TENSOR_ACCESS_INIT_CYCLES, THROTTLE_START_FRACTION, VECTOR_CLOCK_HZ,
};
use crate::{Error, Result};

const PE_HZ: u64 = PE_CLOCK_HZ as u64;
const ACT_HZ: u64 = SCALAR_CLOCK_HZ as u64;
const DVE_HZ: u64 = VECTOR_CLOCK_HZ as u64;
const _: () = assert!(
    PE_HZ as f64 == PE_CLOCK_HZ
        && ACT_HZ as f64 == SCALAR_CLOCK_HZ
        && DVE_HZ as f64 == VECTOR_CLOCK_HZ,
    "the schedule's clock needs engine clocks in whole Hz"
);

const fn gcd(a: u64, b: u64) -> u64 {
    let (mut a, mut b) = (a, b);
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

const fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// Ticks a second of the schedule's clock: the least common multiple of the engine clocks.
pub const TICK_HZ: u64 = lcm(lcm(PE_HZ, ACT_HZ), DVE_HZ);
/// Ticks of one PE, Scalar (ACT) and Vector (DVE) cycle.
pub const PE_TICKS: u64 = TICK_HZ / PE_HZ;
const ACT_TICKS: u64 = TICK_HZ / ACT_HZ;
const DVE_TICKS: u64 = TICK_HZ / DVE_HZ;

/// The longest timeline the clock holds, in ticks (relative times fit an `i64`).
pub const MAX_TICKS: u64 = i64::MAX as u64;

/// Seconds of `ticks`.
pub fn ticks_to_s(ticks: u64) -> f64 {
    ticks as f64 / TICK_HZ as f64
}

/// Ticks to evict one finished `[m, n]` fp32 PSUM tile to SBUF on the Scalar (`act = true`) or
/// the Vector engine: `max(MIN_II, n)` cycles plus the tensor-access overhead.
pub fn eviction_ticks(n: usize, act: bool) -> u64 {
    (n.max(MIN_II_CYCLES) + TENSOR_ACCESS_INIT_CYCLES) as u64
        * if act { ACT_TICKS } else { DVE_TICKS }
}

const SF: u64 = MATMUL_STATIONARY_FREE_MAX as u64;
const MF: u64 = MATMUL_MOVING_FREE_MAX as u64;

/// The tile grid of a GEMM: `m_tiles` row tiles of 128 (the last may be smaller), `n_tiles`
/// column tiles of 512 (the last may be smaller), `k_tiles` K tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub m: u64,
    pub n: u64,
    pub m_tiles: u64,
    pub n_tiles: u64,
    pub k_tiles: u64,
    pub fp32: bool,
}

impl Geometry {
    /// Rows of row tile `mi`.
    pub fn rows_of(&self, mi: u64) -> usize {
        (self.m - mi * SF).min(SF) as usize
    }

    /// Columns of column tile `nj`.
    pub fn cols_of(&self, nj: u64) -> usize {
        (self.n - nj * MF).min(MF) as usize
    }

    /// Ticks of the first (exposed) LoadStationary.
    pub fn first_load_ticks(&self) -> u64 {
        load_stationary_cycles(self.m.min(SF) as usize) * PE_TICKS
    }

    /// Instructions of the schedule (`None` if they overflow `u64`).
    pub fn instructions(&self) -> Option<u64> {
        self.m_tiles.checked_mul(self.n_tiles)?.checked_mul(self.k_tiles)
    }

    /// PE cycles of all instructions, in closed form.
    pub fn pe_cycles(&self) -> u128 {
        let row = |mt: usize| {
            (self.n_tiles - 1) as u128 * matmul_cycles(mt, MF as usize, self.fp32) as u128
                + matmul_cycles(mt, self.cols_of(self.n_tiles - 1), self.fp32) as u128
        };
        let rows =
            (self.m_tiles - 1) as u128 * row(SF as usize) + row(self.rows_of(self.m_tiles - 1));
        self.k_tiles as u128 * rows
    }

    /// An upper bound of the PE timeline's end, in ticks. Until the last eviction ends there is
    /// always an engine at work: the PE (at no less than the throttle's start fraction of its
    /// rate, plus a rounding tick per instruction), or, while it waits for a PSUM bank, the
    /// evictor that bank's eviction is queued on.
    pub fn ticks_bound(&self) -> u128 {
        let slowdown = (1.0 / THROTTLE_START_FRACTION).ceil() as u128;
        let evict = eviction_ticks(MF as usize, true).max(eviction_ticks(MF as usize, false));
        self.first_load_ticks() as u128
            + slowdown * PE_TICKS as u128 * self.pe_cycles()
            + self.m_tiles as u128 * self.n_tiles as u128 * (self.k_tiles as u128 + evict as u128)
    }
}

/// Which events a pass records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceMode {
    Off,
    /// One event per matmul and per eviction.
    Instructions,
    /// One event per accumulation group (row tile x group of 8 banks), plus its first eviction.
    Blocks,
}

/// Events recorded by a pass (times in seconds from the first LoadStationary's start).
#[derive(Debug, Clone)]
pub struct Trace {
    pub mode: TraceMode,
    pub events: Vec<Event>,
}

impl Trace {
    pub fn new(mode: TraceMode) -> Trace {
        Trace { mode, events: Vec::new() }
    }

    fn push(
        &mut self, track: &'static str, name: &'static str, (start, end): (u64, u64),
        args: &[(&'static str, f64)],
    ) {
        let mut e = Event::new(track, name, ticks_to_s(start), ticks_to_s(end - start));
        e.args.extend_from_slice(args);
        self.events.push(e);
    }
}

fn evictor_track(act: bool) -> &'static str {
    if act {
        "ACT (PSUM evict)"
    } else {
        "DVE (PSUM evict)"
    }
}

/// An accumulation group's columns: `tiles` column tiles of 512, the last of `last_cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    tiles: usize,
    last_cols: usize,
}

impl Group {
    fn cols(&self, i: usize) -> usize {
        if i + 1 == self.tiles {
            self.last_cols
        } else {
            MF as usize
        }
    }
}

/// The state of the PE side along the schedule (all times in ticks).
#[derive(Debug, Clone, PartialEq)]
pub struct Sim {
    /// When the PE finished its last matmul (the first LoadStationary's end before any).
    pub t: u64,
    /// When each PSUM bank's last eviction ends.
    banks: [u64; PSUM_BANKS],
    /// When the Scalar (ACT) and the Vector (DVE) engine finish their last eviction.
    evictors: [u64; 2],
    /// The bank the next accumulation group starts at (groups take banks in rotation).
    next_bank: usize,
    pub throttle: TickThrottle,
    /// PE cycles of the matmuls so far.
    pub pe_cycles: u64,
    /// Ticks the PE waited for PSUM banks.
    pub psum_wait: u64,
}

/// The state relative to now (see the module doc): equal keys, equal futures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    next_bank: usize,
    banks: [u64; PSUM_BANKS],
    evictors: [i64; 2],
    throttle: ThrottleKey,
}

/// The counters at the start of a unit, to measure a period's growth.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    unit: u64,
    t: u64,
    pe_cycles: u64,
    psum_wait: u64,
    lost: u64,
}

impl Sim {
    /// The state before the first matmul: the first LoadStationary is exposed.
    pub fn new(g: &Geometry, throttle: bool) -> Sim {
        Sim {
            t: g.first_load_ticks(),
            banks: [0; PSUM_BANKS],
            evictors: [0; 2],
            next_bank: 0,
            throttle: TickThrottle::new(throttle, TICK_HZ as f64),
            pe_cycles: 0,
            psum_wait: 0,
        }
    }

    /// When the last engine of the PE side (PE, ACT, DVE) finishes.
    pub fn compute_end(&self) -> u64 {
        self.evictors.iter().fold(self.t, |a, &b| a.max(b))
    }

    /// One matmul of `c` PE cycles into `bank`; the first K tile's waits for the bank's previous
    /// eviction. Returns its start and end.
    #[inline]
    fn matmul(&mut self, c: u64, bank: usize, first_k: bool) -> (u64, u64) {
        let mut start = self.t;
        if first_k && self.banks[bank] > start {
            self.psum_wait += self.banks[bank] - start;
            start = self.banks[bank];
        }
        let end = self.throttle.run(start, c * PE_TICKS);
        self.pe_cycles += c;
        self.t = end;
        (start, end)
    }

    /// Hands `bank` (a finished `n`-column tile, done at `end`) to the evictor that is free
    /// first (ACT on a tie). Returns the eviction's start, end and whether ACT does it.
    #[inline]
    fn evict(&mut self, end: u64, n: usize, bank: usize) -> (u64, u64, bool) {
        let (e, act) = if self.evictors[0] <= self.evictors[1] { (0, true) } else { (1, false) };
        let start = end.max(self.evictors[e]);
        let done = start + eviction_ticks(n, act);
        self.evictors[e] = done;
        self.banks[bank] = done;
        (start, done, act)
    }

    /// `cycles` PE cycles of matmuls back to back at full rate (no PSUM waits, no evictions).
    fn run_full(&mut self, cycles: u64) {
        debug_assert_eq!(self.t, self.throttle.last_end());
        self.t = self.throttle.run_full(cycles * PE_TICKS);
        self.pe_cycles += cycles;
    }

    /// One K tile of a group: a matmul per column tile, in order. `at` is the group's
    /// (row tile, first column tile), for the trace.
    #[allow(clippy::too_many_arguments)]
    fn k_tile(
        &mut self, mt: usize, fp32: bool, group: Group, first_bank: usize,
        (first, last): (bool, bool), at: (u64, u64), trace: &mut Trace,
    ) {
        for i in 0..group.tiles {
            let nt = group.cols(i);
            let bank = (first_bank + i) % PSUM_BANKS;
            let (_, end) = self.matmul(matmul_cycles(mt, nt, fp32), bank, first);
            if last {
                let (es, ee, act) = self.evict(end, nt, bank);
                if trace.mode == TraceMode::Blocks && i == 0 {
                    let args = eviction_args(at.0, at.1, bank, mt, nt);
                    trace.push(evictor_track(act), "psum_to_sbuf", (es, ee), &args);
                }
            }
        }
    }

    /// One accumulation group with the K-tile shortcut (module doc, 1). Records block events
    /// only ([`TraceMode::Instructions`] is the walk's).
    fn group(
        &mut self, g: &Geometry, (mt, at): (usize, (u64, u64)), group: Group, trace: &mut Trace,
        cancel: &Cancel,
    ) -> Result<()> {
        let block_start = self.t;
        let first_bank = self.next_bank;
        self.next_bank = (first_bank + group.tiles) % PSUM_BANKS;
        let cycles = |i: usize| matmul_cycles(mt, group.cols(i), g.fp32);
        self.k_tile(mt, g.fp32, group, first_bank, (true, g.k_tiles == 1), at, trace);
        if g.k_tiles >= 2 {
            let mut k_left = g.k_tiles - 2;
            let mut walked = 0u64;
            while k_left > 0 {
                if self.throttle.at_full_rate() {
                    let per_k: u64 = (0..group.tiles).map(cycles).sum();
                    self.run_full(k_left * per_k);
                    break;
                }
                // On the throttle's ramp: matmul by matmul (a few microseconds' worth).
                walked += 1;
                if walked.is_multiple_of(4096) {
                    cancel.check()?;
                }
                for i in 0..group.tiles {
                    if self.throttle.at_full_rate() {
                        self.run_full((i..group.tiles).map(cycles).sum());
                        break;
                    }
                    self.matmul(cycles(i), 0, false);
                }
                k_left -= 1;
            }
            self.k_tile(mt, g.fp32, group, first_bank, (false, true), at, trace);
        }
        if trace.mode == TraceMode::Blocks {
            let args = block_args(g, at, group.tiles, first_bank);
            trace.push("PE", "matmul block", (block_start, self.t), &args);
        }
        Ok(())
    }

    fn key(&self) -> Key {
        let t = self.t;
        Key {
            next_bank: self.next_bank,
            banks: self.banks.map(|b| b.saturating_sub(t)),
            evictors: self.evictors.map(|e| e as i64 - t as i64),
            throttle: self.throttle.key(t),
        }
    }

    fn snapshot(&self, unit: u64) -> Snapshot {
        Snapshot {
            unit,
            t: self.t,
            pe_cycles: self.pe_cycles,
            psum_wait: self.psum_wait,
            lost: self.throttle.lost,
        }
    }

    /// Applies `q` more periods that each grew like the one since `base`.
    fn skip(&mut self, q: u64, base: &Snapshot) -> Result<()> {
        let grow = |now: u64, then: u64| (now - then).checked_mul(q);
        let (Some(dt), Some(dpe), Some(dwait), Some(dlost)) = (
            grow(self.t, base.t),
            grow(self.pe_cycles, base.pe_cycles),
            grow(self.psum_wait, base.psum_wait),
            grow(self.throttle.lost, base.lost),
        ) else {
            return Err(Error::capacity(
                "shape",
                "the GEMM schedule's timeline overflows the cost model's clock",
            ));
        };
        self.t += dt;
        for b in self.banks.iter_mut().chain(self.evictors.iter_mut()) {
            *b += dt;
        }
        self.throttle.shift(dt, dlost);
        self.pe_cycles += dpe;
        self.psum_wait += dwait;
        Ok(())
    }

    /// `count` identical units, fast-forwarded once their keys repeat (module doc, 2).
    ///
    /// The repeat is found with Brent's cycle detection, in constant memory: one saved key (and
    /// the counters at it) is compared with every later unit's key, and moves to the current
    /// unit whenever the distance reaches the next power of two. Once the saved unit lies on
    /// the cycle and the power of two reaches the period, the next match gives it; so a period
    /// `p` after a transient of `t` units is found within about `t + 3p` units.
    fn repeat(
        &mut self, count: u64, cancel: &Cancel, unit: &mut dyn FnMut(&mut Sim) -> Result<()>,
    ) -> Result<()> {
        let mut saved: Option<(Key, Snapshot)> = None;
        let mut power = 1u64;
        let mut periodic = false;
        let mut i = 0u64;
        while i < count {
            cancel.check()?;
            if !periodic {
                let key = self.key();
                match saved {
                    Some((k, base)) if k == key => {
                        let period = i - base.unit;
                        let q = (count - i) / period;
                        self.skip(q, &base)?;
                        i += q * period;
                        periodic = true;
                        continue;
                    }
                    Some((_, base)) if i - base.unit < power => {}
                    Some(_) => {
                        power *= 2;
                        saved = Some((key, self.snapshot(i)));
                    }
                    None => saved = Some((key, self.snapshot(i))),
                }
            }
            unit(self)?;
            i += 1;
        }
        Ok(())
    }

    /// One row tile of `mt` rows with the shortcuts: its full groups, then its last group.
    fn row(&mut self, g: &Geometry, mt: usize, cancel: &Cancel) -> Result<()> {
        let (full, last, groups) = groups(g);
        let mut off = Trace::new(TraceMode::Off);
        self.repeat(groups - 1, cancel, &mut |s: &mut Sim| {
            s.group(g, (mt, (0, 0)), full, &mut off, cancel)
        })?;
        self.group(g, (mt, (0, 0)), last, &mut off, cancel)
    }
}

/// The trace arguments of a PSUM-to-SBUF eviction of tile `(m_tile, n_tile)` from `bank`:
/// `rows x cols` fp32 values read from PSUM.
fn eviction_args(
    m_tile: u64, n_tile: u64, bank: usize, rows: usize, cols: usize,
) -> [(&'static str, f64); 6] {
    [
        ("m_tile", m_tile as f64),
        ("n_tile", n_tile as f64),
        ("bank", bank as f64),
        ("rows", rows as f64),
        ("cols", cols as f64),
        ("bytes", (rows * cols * 4) as f64),
    ]
}

/// The trace arguments of an accumulation group: row tile, first column tile, column tiles
/// (one PSUM bank each, from `first_bank`), K tiles and matmul instructions.
fn block_args(
    g: &Geometry, (m_tile, n_tile): (u64, u64), tiles: usize, first_bank: usize,
) -> [(&'static str, f64); 6] {
    [
        ("m_tile", m_tile as f64),
        ("n_tile", n_tile as f64),
        ("n_tiles", tiles as f64),
        ("first_bank", first_bank as f64),
        ("k_tiles", g.k_tiles as f64),
        ("instructions", (tiles as u64 * g.k_tiles) as f64),
    ]
}

/// The full group, the last group, and the number of groups of a row tile.
fn groups(g: &Geometry) -> (Group, Group, u64) {
    let banks = PSUM_BANKS as u64;
    let groups = g.n_tiles.div_ceil(banks);
    let full = Group { tiles: PSUM_BANKS, last_cols: MF as usize };
    let last = Group {
        tiles: (g.n_tiles - (groups - 1) * banks) as usize,
        last_cols: g.cols_of(g.n_tiles - 1),
    };
    (full, last, groups)
}

/// The reference: walks every matmul of the schedule in order, recording `trace.mode`'s events.
pub fn walk(g: &Geometry, sim: &mut Sim, trace: &mut Trace) -> Result<()> {
    let cancel = crate::cancel::current();
    let banks = PSUM_BANKS as u64;
    let mut index = 0u64;
    for mi in 0..g.m_tiles {
        let mt = g.rows_of(mi);
        let mut g0 = 0;
        while g0 < g.n_tiles {
            cancel.check()?;
            let g1 = (g0 + banks).min(g.n_tiles);
            let block_start = sim.t;
            let first_bank = sim.next_bank;
            sim.next_bank = (first_bank + (g1 - g0) as usize) % PSUM_BANKS;
            for ki in 0..g.k_tiles {
                if ki % 4096 == 4095 {
                    cancel.check()?;
                }
                for nj in g0..g1 {
                    let nt = g.cols_of(nj);
                    let bank = (first_bank + (nj - g0) as usize) % PSUM_BANKS;
                    let (start, end) = sim.matmul(matmul_cycles(mt, nt, g.fp32), bank, ki == 0);
                    if trace.mode == TraceMode::Instructions {
                        let args = [
                            ("instruction", index as f64),
                            ("m_tile", mi as f64),
                            ("n_tile", nj as f64),
                            ("k_tile", ki as f64),
                            ("bank", bank as f64),
                            ("rows", mt as f64),
                            ("cols", nt as f64),
                        ];
                        trace.push("PE", "matmul", (start, end), &args);
                    }
                    index += 1;
                    if ki == g.k_tiles - 1 {
                        let (es, ee, act) = sim.evict(end, nt, bank);
                        if trace.mode == TraceMode::Instructions
                            || (trace.mode == TraceMode::Blocks && nj == g0)
                        {
                            let args = eviction_args(mi, nj, bank, mt, nt);
                            trace.push(evictor_track(act), "psum_to_sbuf", (es, ee), &args);
                        }
                    }
                }
            }
            if trace.mode == TraceMode::Blocks {
                let args = block_args(g, (mi, g0), (g1 - g0) as usize, first_bank);
                trace.push("PE", "matmul block", (block_start, sim.t), &args);
            }
            g0 = g1;
        }
    }
    Ok(())
}

/// The whole schedule with the shortcuts (module doc): the same final state as [`walk`].
pub fn fast(g: &Geometry, sim: &mut Sim) -> Result<()> {
    let cancel = crate::cancel::current();
    sim.repeat(g.m_tiles - 1, &cancel, &mut |s: &mut Sim| s.row(g, SF as usize, &cancel))?;
    sim.row(g, g.rows_of(g.m_tiles - 1), &cancel)
}

/// The schedule's first `max_groups` accumulation groups in order (all of them if there are
/// no more), with the K-tile shortcut and [`TraceMode::Blocks`] events: the same events as
/// [`walk`] records. Returns whether groups were left out.
pub fn traced_prefix(
    g: &Geometry, sim: &mut Sim, trace: &mut Trace, max_groups: u64,
) -> Result<bool> {
    let cancel = crate::cancel::current();
    let (full, last, groups) = groups(g);
    let mut done = 0u64;
    for mi in 0..g.m_tiles {
        let mt = g.rows_of(mi);
        for j in 0..groups {
            if done == max_groups {
                return Ok(true);
            }
            cancel.check()?;
            let group = if j + 1 == groups { last } else { full };
            let at = (mi, j * PSUM_BANKS as u64);
            sim.group(g, (mt, at), group, trace, &cancel)?;
            done += 1;
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_whole_ticks_of_every_engine() {
        assert_eq!(TICK_HZ, 4_800_000_000);
        assert_eq!((PE_TICKS, ACT_TICKS, DVE_TICKS), (2, 4, 5));
        // 512 columns: (512 + 60) cycles at 1.2 GHz and at 0.96 GHz.
        assert_eq!(eviction_ticks(512, true), 572 * 4);
        assert_eq!(eviction_ticks(16, false), (64 + 60) * 5);
    }
}
