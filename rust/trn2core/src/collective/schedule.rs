//! Collective algorithms as schedules: phases of concurrent chunk transfers, each phase repeated
//! a number of steps. The same [`Schedule`] is executed on the data (`exec`) and costed over the
//! links (`cost`), so the bits and the time always describe one algorithm.
//!
//! # Chunks
//!
//! A collective with `N` ranks and `K` channels cuts the working buffer (the input for
//! all-reduce and reduce-scatter, the gathered output for all-gather) into `G = N * K` *fine
//! chunks*: fine chunk `f` covers elements `floor(f * W / G) .. floor((f + 1) * W / G)` of a
//! buffer of `W` elements, so sizes not divisible by the rank count work and every coarser
//! chunking used below nests exactly. Fine chunk `f` belongs to *rank-chunk* `f / K` and
//! channel `f % K`; rank-chunk `r` is what rank `r` owns at the end of a reduce-scatter (and
//! holds at the start of an all-gather). Channels are independent streams (the two directions of
//! a ring, or the four rings of KangaRing) that split every rank-chunk.
//!
//! A transfer names its chunks with a [`ChunkSel`]: a local chunk index that may advance with
//! the step (`j = (j0 + dj * step) mod m`), an optional permutation (a ring position to the
//! coordinate it stands for), a run of `n1` consecutive local chunks, and an affine map
//! `base + local * mult + b * s2` (`b < n2`) to rank-chunks. This is enough for flat rings,
//! rings along one torus dimension inside the others, recursive halving/doubling, the direct
//! (mesh) pattern, and all of them nested inside the UltraServers of a hierarchical algorithm.

use super::ops::{Algorithm, Collective};
use crate::spec::{CORES_PER_CHIP, LNC_DEFAULT};
use crate::topology::Torus;
use crate::{Error, Result};

/// "Every channel" in [`ChunkSel::channel`].
pub const ALL_CHANNELS: u32 = u32::MAX;
/// "No permutation" in [`ChunkSel::perm`].
pub const IDENTITY: u32 = u32::MAX;

/// Which fine chunks a transfer carries at step `k` of its phase (see the module doc).
///
/// Local chunk `j = (j0 + dj * k) mod m`; local chunks `j + a + c * sl` for `a < n1`, `c < nl`
/// (never wrapping), each through the permutation `perm` if any, map to rank-chunks
/// `base + local * mult + b * s2` for `b < n2`; each rank-chunk contributes channel `channel`
/// (or all `K`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSel {
    /// Local chunk index at step 0.
    pub j0: u32,
    /// How far the local chunk index moves each step (negative: backwards), modulo `m`.
    pub dj: i32,
    /// Modulus of the local chunk index (the ring's length; 0 acts as 1).
    pub m: u32,
    /// Consecutive local chunks in one run.
    pub n1: u32,
    /// Runs of `n1` local chunks.
    pub nl: u32,
    /// Local chunks from the start of one run to the start of the next.
    pub sl: u32,
    /// Index into [`Schedule::perms`] mapping a local chunk (ring position) to the
    /// coordinate it stands for, or [`IDENTITY`].
    pub perm: u32,
    /// Rank-chunk that local chunk 0 maps to.
    pub base: u32,
    /// Rank-chunks between the first rank-chunks of consecutive local chunks.
    pub mult: u32,
    /// Rank-chunks each local chunk stands for.
    pub n2: u32,
    /// Rank-chunks between the `n2` rank-chunks of one local chunk.
    pub s2: u32,
    /// The channel each rank-chunk contributes, or [`ALL_CHANNELS`] for all `K`.
    pub channel: u32,
}

impl ChunkSel {
    /// Number of fine chunks carried, for `k` channels.
    pub fn fine_chunks(&self, k: usize) -> usize {
        let per = if self.channel == ALL_CHANNELS { k } else { 1 };
        self.n1 as usize * self.nl as usize * self.n2 as usize * per
    }

    /// Calls `f` with every fine chunk carried at step `step`.
    pub fn for_each(&self, step: u32, k: usize, perms: &[Vec<u32>], mut f: impl FnMut(usize)) {
        let m = i64::from(self.m.max(1));
        let j = (i64::from(self.j0) + i64::from(self.dj) * i64::from(step)).rem_euclid(m) as usize;
        for cl in 0..self.nl as usize {
            for a in 0..self.n1 as usize {
                let local = j + a + cl * self.sl as usize;
                let local = if self.perm == IDENTITY {
                    local
                } else {
                    perms[self.perm as usize][local] as usize
                };
                let rc0 = self.base as usize + local * self.mult as usize;
                for b in 0..self.n2 as usize {
                    let rc = rc0 + b * self.s2 as usize;
                    if self.channel == ALL_CHANNELS {
                        for c in 0..k {
                            f(rc * k + c);
                        }
                    } else {
                        f(rc * k + self.channel as usize);
                    }
                }
            }
        }
    }
}

/// One transfer of a phase: from rank `src` to rank `dst` (ranks are positions in the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// The fine chunks carried at each step.
    pub sel: ChunkSel,
}

/// A phase: `repeat` steps, each made of the same concurrent transfers (their chunks may move
/// with the step). With `reduce`, the receiver combines what arrives with what it holds;
/// otherwise it stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// Name of the phase in reports and traces (e.g. `"send/recv"`).
    pub name: &'static str,
    /// Steps: the phase's transfers run this many times, their chunks moving with the step.
    pub repeat: u32,
    /// Whether the receiver combines what arrives with what it holds (else stores it).
    pub reduce: bool,
    /// The concurrent transfers of one step.
    pub transfers: Vec<Transfer>,
    /// HBM accesses charged per byte received, relative to a plain ring hop (KangaRing's
    /// one-read-two-writes duplication touches HBM less, \[S16\]).
    pub hbm_factor: f64,
    /// Synchronised reducing steps the runtime takes for this phase, each charged
    /// `spec::COLLECTIVE_REDUCE_STEP_S` by the cost model: `repeat` for a reducing phase, more
    /// for KangaRing (its cycle runs through every primary rank of every chip, not every chip),
    /// none for a copying phase or the single-step Mesh all-reduce (receivers reduce locally).
    /// Timing only: the functional model ignores it.
    pub reduce_steps: u32,
}

/// A collective, ready to execute or cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The collective the schedule computes.
    pub collective: Collective,
    /// The algorithm after `auto` was resolved.
    pub algorithm: Algorithm,
    /// For a hierarchical schedule, the algorithm used within each UltraServer.
    pub intra: Option<Algorithm>,
    /// Ranks.
    pub n: usize,
    /// Channels.
    pub k: usize,
    /// The phases, run one after another.
    pub phases: Vec<Phase>,
    /// Permutation tables referenced by [`ChunkSel::perm`].
    pub perms: Vec<Vec<u32>>,
}

impl Schedule {
    /// Fine chunks `G = N * K`.
    pub fn fine_chunks(&self) -> usize {
        self.n * self.k
    }

    /// The algorithm's name, with the intra-server algorithm of a hierarchical one, e.g.
    /// `"hierarchical(torus+rdh)"`.
    pub fn algorithm_name(&self) -> String {
        match self.intra {
            Some(a) => format!("hierarchical({}+efa)", a.name()),
            None => self.algorithm.name().to_string(),
        }
    }
}

/// The ranks of a collective: `chips[r]` is the chip of rank `r` on `torus`.
#[derive(Debug, Clone)]
pub struct Group<'a> {
    /// The machine the ranks sit on.
    pub torus: &'a Torus,
    /// `chips[r]`: the chip (torus index) of rank `r`; distinct.
    pub chips: Vec<usize>,
    /// The runtime ranks each chip stands for: its Logical NeuronCores (8 / LNC; 4 by default,
    /// the runtime's LNC=2 on Trn2). Timing only: the runtime's algorithm choice and KangaRing's
    /// step count depend on them; the bits do not.
    pub ranks_per_chip: usize,
}

impl<'a> Group<'a> {
    /// Every chip of the torus, rank `r` on chip `r`.
    pub fn all(torus: &'a Torus) -> Group<'a> {
        Group { torus, chips: (0..torus.size()).collect(), ranks_per_chip: DEFAULT_RANKS_PER_CHIP }
    }

    /// The same group with each chip standing for `ranks` runtime ranks (at least 1).
    pub fn with_ranks_per_chip(mut self, ranks: usize) -> Group<'a> {
        self.ranks_per_chip = ranks.max(1);
        self
    }

    /// Runtime ranks of the group: chips x ranks per chip.
    pub fn runtime_ranks(&self) -> usize {
        self.chips.len() * self.ranks_per_chip
    }

    /// The chips `chips` (distinct, existing) in that rank order.
    pub fn new(torus: &'a Torus, chips: Vec<usize>) -> Result<Group<'a>> {
        if chips.is_empty() {
            return Err(Error::value("chips", "a collective needs at least one chip"));
        }
        let mut seen = vec![false; torus.size()];
        for &c in &chips {
            if c >= torus.size() {
                return Err(Error::value(
                    "chips",
                    format!("chip {c} does not exist; this machine has chips 0..{}", torus.size()),
                ));
            }
            if seen[c] {
                return Err(Error::value("chips", format!("chip {c} is listed twice")));
            }
            seen[c] = true;
        }
        Ok(Group { torus, chips, ranks_per_chip: DEFAULT_RANKS_PER_CHIP })
    }

    /// Ranks.
    pub fn n(&self) -> usize {
        self.chips.len()
    }

    /// Whether the group is every chip of the torus in index order.
    pub fn is_whole(&self) -> bool {
        self.chips.len() == self.torus.size() && self.chips.iter().enumerate().all(|(i, &c)| i == c)
    }
}

/// Runtime ranks per chip at the runtime's default LNC on Trn2 (2): 4 logical cores.
pub const DEFAULT_RANKS_PER_CHIP: usize = CORES_PER_CHIP / LNC_DEFAULT;

/// Most ranks the direct (mesh) pattern is built for: it has `N (N - 1)` transfers per step.
pub const MESH_MAX_RANKS: usize = 1024;
