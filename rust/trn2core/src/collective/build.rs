//! The builders: one [`Schedule`] per collective and algorithm, from rings, recursive
//! halving/doubling, the direct (mesh) pattern and their hierarchical nesting (the chunk model is
//! described in [`super::schedule`]).

use super::graph::{hamiltonian_decomposition, layered_hamiltonian_cycles, snake_order};
use super::ops::{Algorithm, Collective};
use super::policy::{auto_algorithm, intra_algorithm};
use super::schedule::{
    ChunkSel, Group, Phase, Schedule, Transfer, ALL_CHANNELS, IDENTITY, MESH_MAX_RANKS,
};
use crate::spec::{
    COLLECTIVE_SINGLE_STEP_MESH_MAX_BYTES, KANGARING_ALLGATHER_HBM_ACCESSES_PER_TWO_RANKS,
    KANGARING_REDUCE_SCATTER_HBM_ACCESSES_PER_TWO_RANKS, RING_ALLGATHER_HBM_ACCESSES_PER_TWO_RANKS,
    RING_REDUCE_SCATTER_HBM_ACCESSES_PER_TWO_RANKS, TORUS_HAMILTONIAN_CYCLES,
};
use crate::{Error, Result};

/// Maps a sub-collective's local chunk index to rank-chunks: `base + local * mult + b * s2` for
/// `b < n2` (the `b` term replicates over the dimensions the sub-collective does not cover).
#[derive(Debug, Clone, Copy)]
struct Ctx {
    base: u32,
    mult: u32,
    n2: u32,
    s2: u32,
}

impl Ctx {
    const FLAT: Ctx = Ctx { base: 0, mult: 1, n2: 1, s2: 0 };

    fn sel(&self, j0: u32, dj: i32, m: u32, n1: u32, perm: u32, channel: u32) -> ChunkSel {
        self.sel2(j0, dj, m, (n1, 1, 0), perm, channel)
    }

    /// [`Ctx::sel`] with a second level of local chunks: `runs = (n1, nl, sl)`.
    fn sel2(
        &self, j0: u32, dj: i32, m: u32, runs: (u32, u32, u32), perm: u32, channel: u32,
    ) -> ChunkSel {
        ChunkSel {
            j0,
            dj,
            m,
            n1: runs.0,
            nl: runs.1,
            sl: runs.2,
            perm,
            base: self.base,
            mult: self.mult,
            n2: self.n2,
            s2: self.s2,
            channel,
        }
    }
}

/// An empty vector for `len` transfers, reserved through the host check: a step of a large
/// machine's schedule is millions of transfers (an RDH step over 262144 ranks with 18 channels:
/// 4.7 million, 280 MiB), and a failed allocation would abort the process.
fn transfers_vec(len: usize) -> Result<Vec<Transfer>> {
    let mut v = Vec::new();
    crate::host::reserve(
        &mut v,
        len,
        "buffers",
        "the collective's schedule (one step's transfers)",
    )?;
    Ok(v)
}

/// A ring: `order[q]` is the rank at ring position `q`; ring position `q` stands for local chunk
/// `perm[q]` (or `q` with [`IDENTITY`]).
#[derive(Debug, Clone)]
struct Ring {
    order: Vec<u32>,
    perm: u32,
    ctx: Ctx,
    channel: u32,
}

/// Appends the `m - 1` steps of a ring reduce-scatter (`reduce`) or all-gather of every ring
/// (all the same length) as one phase.
fn ring_phase(
    name: &'static str, rings: &[Ring], reduce: bool, hbm_factor: f64,
) -> Result<Option<Phase>> {
    let m = match rings.first() {
        Some(r) => r.order.len(),
        None => return Ok(None),
    };
    if m < 2 {
        return Ok(None);
    }
    let mut transfers = transfers_vec(rings.len() * m)?;
    for ring in rings {
        debug_assert_eq!(ring.order.len(), m);
        for q in 0..m {
            let next = (q + 1) % m;
            // Reduce-scatter: position q sends chunk q - 1 - k at step k (its partial sum).
            // All-gather: position q sends chunk q - k (what it received the step before).
            let j0 = if reduce { (q + m - 1) % m } else { q };
            transfers.push(Transfer {
                src: ring.order[q],
                dst: ring.order[next],
                sel: ring.ctx.sel(j0 as u32, -1, m as u32, 1, ring.perm, ring.channel),
            });
        }
    }
    Ok(Some(Phase {
        name,
        repeat: (m - 1) as u32,
        reduce,
        transfers,
        hbm_factor,
        reduce_steps: if reduce { (m - 1) as u32 } else { 0 },
    }))
}

/// Recursive halving (reduce-scatter, `reduce`) or doubling (all-gather) over `members`
/// (a power of two `m = 2^p` of them; local index `i` is rank `members[i]`), one phase per step.
///
/// With `rotated`, the data is cut into `p` channels and channel `c` walks the hypercube's
/// dimensions in the halving order rotated by `c` (bits `p-1-c, p-2-c, ...` modulo `p`), so at
/// every step the channels exchange along `p` different dimensions at once and spread over the
/// torus's links, as the runtime's four per-chip RDH groups do (\[S16\]). Without it
/// (the EFA stage of a hierarchical schedule, where every transfer leaves through the same NIC)
/// all channels move together, high bit first.
fn rdh_phases(
    groups: &[(Vec<u32>, Ctx)], reduce: bool, rotated: bool, out: &mut Vec<Phase>,
) -> Result<()> {
    let m = match groups.first() {
        Some((g, _)) => g.len(),
        None => return Ok(()),
    };
    if m < 2 {
        return Ok(());
    }
    debug_assert!(m.is_power_of_two());
    let p = m.trailing_zeros() as usize;
    let channels: Vec<u32> = if rotated { (0..p as u32).collect() } else { vec![ALL_CHANNELS] };
    // The halving order of a channel: bit indices, high bit first, rotated.
    let order = |c: usize| -> Vec<usize> { (0..p).map(|t| p - 1 - (t + c) % p).collect() };
    // A step of an UltraCluster's RDH is 262144 transfers: stop early on Ctrl-C (the caller
    // checks the token and drops the unfinished schedule).
    let cancel = crate::cancel::current();
    for t in 0..p {
        if cancel.is_cancelled() {
            return Ok(());
        }
        let mut transfers = transfers_vec(groups.len() * m * channels.len())?;
        for (ci, &ch) in channels.iter().enumerate() {
            let ord = order(if rotated { ci } else { 0 });
            // Halving fixes ord[0..=t]; doubling frees the fixed bits in reverse, so at its step
            // t it exchanges along ord[p-1-t] what is fixed by ord[0..=p-1-t].
            let (beta, fixed): (usize, &[usize]) =
                if reduce { (ord[t], &ord[..=t]) } else { (ord[p - 1 - t], &ord[..p - t]) };
            for (members, ctx) in groups {
                for i in 0..m {
                    let partner = i ^ (1 << beta);
                    // The chunks sent: their fixed bits equal the receiver's (halving: the half
                    // the partner keeps) or the sender's own (doubling: everything it holds);
                    // the free bits take every value.
                    let who = if reduce { partner } else { i };
                    let base: usize = fixed.iter().map(|&b| who & (1 << b)).sum();
                    let runs = free_runs(p, fixed);
                    transfers.push(Transfer {
                        src: members[i],
                        dst: members[partner],
                        sel: ctx.sel2(base as u32, 0, m as u32, runs, IDENTITY, ch),
                    });
                }
            }
        }
        out.push(Phase {
            name: if reduce { "rdh reduce-scatter" } else { "rdh all-gather" },
            repeat: 1,
            reduce,
            transfers,
            hbm_factor: 1.0,
            reduce_steps: u32::from(reduce),
        });
    }
    Ok(())
}

/// The local chunks whose bits outside `fixed` are free, as `(n1, nl, sl)`: `n1` consecutive
/// indices (the free bits from bit 0 up) times `nl` strided by `sl` (the other run of free bits).
/// The fixed bits of a rotated halving order are a cyclic interval, so the free ones are at
/// most two runs, one of them starting at bit 0 when there are two.
fn free_runs(p: usize, fixed: &[usize]) -> (u32, u32, u32) {
    let is_free = |b: usize| !fixed.contains(&b);
    let low = (0..p).take_while(|&b| is_free(b)).count();
    let rest: Vec<usize> = (low..p).filter(|&b| is_free(b)).collect();
    let (lo, len) = match (rest.first(), rest.last()) {
        (Some(&lo), Some(&hi)) => (lo, hi - lo + 1),
        _ => (0, 0),
    };
    debug_assert_eq!(rest.len(), len, "free bits are not two runs");
    (1 << low, 1 << len, if len > 0 { 1 << lo } else { 0 })
}

/// The direct pattern over every group: each rank sends every other rank its chunk (reduce-
/// scatter: the receiver's chunk; all-gather: its own). The receiver takes them in ascending
/// rank order, so a reduction is `own, then the others in ascending rank order`.
fn mesh_phase(groups: &[(Vec<u32>, Ctx)], reduce: bool) -> Result<Option<Phase>> {
    let m = match groups.first() {
        Some((g, _)) => g.len(),
        None => return Ok(None),
    };
    if m < 2 {
        return Ok(None);
    }
    let mut transfers = transfers_vec(groups.len() * m * (m - 1))?;
    for (members, ctx) in groups {
        for d in 0..m {
            for s in 0..m {
                if s == d {
                    continue;
                }
                let j = if reduce { d } else { s };
                transfers.push(Transfer {
                    src: members[s],
                    dst: members[d],
                    sel: ctx.sel(j as u32, 0, m as u32, 1, IDENTITY, ALL_CHANNELS),
                });
            }
        }
    }
    Ok(Some(Phase {
        name: if reduce { "mesh reduce-scatter" } else { "mesh all-gather" },
        repeat: 1,
        reduce,
        transfers,
        hbm_factor: 1.0,
        reduce_steps: u32::from(reduce),
    }))
}

/// KangaRing's duplication: 3 HBM accesses instead of 4 per chunk per two ranks for
/// all-gather, 4 instead of 6 for reduce-scatter.
fn kangaring_hbm_factor(reduce: bool) -> f64 {
    if reduce {
        KANGARING_REDUCE_SCATTER_HBM_ACCESSES_PER_TWO_RANKS as f64
            / RING_REDUCE_SCATTER_HBM_ACCESSES_PER_TWO_RANKS as f64
    } else {
        KANGARING_ALLGATHER_HBM_ACCESSES_PER_TWO_RANKS as f64
            / RING_ALLGATHER_HBM_ACCESSES_PER_TWO_RANKS as f64
    }
}

/// Which part of an all-reduce to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    ReduceScatter,
    AllGather,
}

/// Builds one half (reduce-scatter or all-gather) of a flat algorithm over a server-local
/// group: `ultraservers` copies of the torus `shape` (the ranks of server `s` are `s * P + l`),
/// every copy running the same pattern at once; local chunk `l` stands for rank-chunks
/// `l + P * s` for every server `s` (`n2 = ultraservers`). Returns the phases and the channel count.
struct Builder<'t> {
    shape: &'t [usize],
    /// Ranks per server.
    p: usize,
    ultraservers: usize,
    perms: Vec<Vec<u32>>,
    /// KangaRing's primary ranks per chip: one of each pair of the chip's runtime ranks.
    primaries_per_chip: usize,
}

impl Builder<'_> {
    fn perm(&mut self, table: Vec<u32>) -> u32 {
        if let Some(i) = self.perms.iter().position(|t| *t == table) {
            return i as u32;
        }
        self.perms.push(table);
        (self.perms.len() - 1) as u32
    }

    fn server_ctx(&self) -> Ctx {
        Ctx { base: 0, mult: 1, n2: self.ultraservers as u32, s2: self.p as u32 }
    }

    fn members(&self, s: usize) -> Vec<u32> {
        (0..self.p).map(|l| (s * self.p + l) as u32).collect()
    }

    /// Every UltraServer's members, each with [`Self::server_ctx`].
    fn server_groups(&self) -> Vec<(Vec<u32>, Ctx)> {
        let ctx = self.server_ctx();
        (0..self.ultraservers).map(|s| (self.members(s), ctx)).collect()
    }

    /// Rings along server-local `order` (channel `channel`) and its reverse (`channel + 1`), one
    /// of each per UltraServer, onto `rings`.
    fn rings_both_ways(&mut self, order: &[u32], channel: u32, rings: &mut Vec<Ring>) {
        let ctx = self.server_ctx();
        let mut rev = vec![order[0]];
        rev.extend(order[1..].iter().rev());
        for (d, dir) in [order.to_vec(), rev].into_iter().enumerate() {
            let perm = self.perm(dir.clone());
            for s in 0..self.ultraservers {
                rings.push(Ring {
                    order: dir.iter().map(|&l| l + (s * self.p) as u32).collect(),
                    perm,
                    ctx,
                    channel: channel + d as u32,
                });
            }
        }
    }

    /// A ring in `order` (server-local ranks), run in both directions at once: channel 0
    /// follows `order`, channel 1 the reverse (a link is full duplex, so the two directions
    /// use different link directions and do not contend).
    fn ring(&mut self, order: &[u32], half: Half) -> Result<Vec<Phase>> {
        let mut rings = Vec::new();
        self.rings_both_ways(order, 0, &mut rings);
        let reduce = half == Half::ReduceScatter;
        let name = if reduce { "ring reduce-scatter" } else { "ring all-gather" };
        Ok(ring_phase(name, &rings, reduce, 1.0)?.into_iter().collect())
    }

    /// KangaRing: two Hamiltonian cycles, each in both directions: channels 0..4.
    fn kangaring(&mut self, cycles: &[Vec<u32>; 2], half: Half) -> Result<Vec<Phase>> {
        let mut rings = Vec::new();
        for (ci, cyc) in cycles.iter().enumerate() {
            self.rings_both_ways(cyc, 2 * ci as u32, &mut rings);
        }
        let reduce = half == Half::ReduceScatter;
        let factor = kangaring_hbm_factor(reduce);
        let name = if reduce { "kangaring reduce-scatter" } else { "kangaring all-gather" };
        Ok(self.kangaring_steps(ring_phase(name, &rings, reduce, factor)?))
    }

    /// KangaRing on a group that is not a whole 2-D torus: the ring through its chips in rank
    /// order, both directions, with KangaRing's HBM saving (its runtime cycle runs through the
    /// primary ranks of those chips).
    fn kangaring_ring(&mut self, order: &[u32], half: Half) -> Result<Vec<Phase>> {
        let reduce = half == Half::ReduceScatter;
        let factor = kangaring_hbm_factor(reduce);
        let mut phases = self.ring(order, half)?;
        for p in &mut phases {
            p.hbm_factor = factor;
            p.name = if reduce { "kangaring reduce-scatter" } else { "kangaring all-gather" };
        }
        Ok(self.kangaring_steps(phases.pop()))
    }

    /// A KangaRing phase's synchronised reducing steps: the runtime's cycle visits every primary
    /// rank (one of each pair of a chip's ranks, \[S16\]), so it has `chips x primaries - 1`
    /// steps where the chip-level ring has `chips - 1`.
    fn kangaring_steps(&self, phase: Option<Phase>) -> Vec<Phase> {
        let mut phase = match phase {
            Some(p) => p,
            None => return Vec::new(),
        };
        if phase.reduce {
            let cycle = (phase.repeat as usize + 1) * self.primaries_per_chip.max(1);
            phase.reduce_steps = (cycle - 1) as u32;
        }
        vec![phase]
    }

    /// Rings along each torus dimension (reduce-scatter X, Y, Z; all-gather Z, Y, X), the `+`
    /// ring on channel 0 and the `-` ring on channel 1.
    fn torus(&mut self, half: Half) -> Result<Vec<Phase>> {
        let shape = self.shape.to_vec();
        let dims: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] >= 2).collect();
        let mut strides = vec![1usize; shape.len() + 1];
        for d in 0..shape.len() {
            strides[d + 1] = strides[d] * shape[d];
        }
        let reduce = half == Half::ReduceScatter;
        let order: Vec<usize> =
            if reduce { dims.clone() } else { dims.iter().rev().copied().collect() };
        let mut phases = Vec::new();
        for d in order {
            let e = shape[d];
            let plus: Vec<u32> = (0..e as u32).collect();
            let mut minus = vec![0u32];
            minus.extend((1..e as u32).rev());
            let perms = [self.perm(plus.clone()), self.perm(minus.clone())];
            let mut rings = Vec::new();
            if crate::cancel::current().is_cancelled() {
                break; // the caller checks the token and drops the unfinished schedule
            }
            for s in 0..self.ultraservers {
                for l in 0..self.p {
                    let c = (l / strides[d]) % e;
                    if c != 0 {
                        continue; // one ring per line, started from its chip with coordinate 0
                    }
                    // Rank-chunks held entering this dimension: coordinates of the dimensions
                    // already reduced (those before d) fixed to this line's, all others free.
                    let fixed: usize = dims
                        .iter()
                        .filter(|&&dd| dd < d)
                        .map(|&dd| ((l / strides[dd]) % shape[dd]) * strides[dd])
                        .sum();
                    let ctx = Ctx {
                        base: fixed as u32,
                        mult: strides[d] as u32,
                        n2: (self.p / strides[d + 1] * self.ultraservers) as u32,
                        s2: strides[d + 1] as u32,
                    };
                    for (ch, coords) in [&plus, &minus].into_iter().enumerate() {
                        let order: Vec<u32> = coords
                            .iter()
                            .map(|&cc| (s * self.p + l + cc as usize * strides[d]) as u32)
                            .collect();
                        rings.push(Ring { order, perm: perms[ch], ctx, channel: ch as u32 });
                    }
                }
            }
            let name = if reduce { "torus ring reduce-scatter" } else { "torus ring all-gather" };
            // Lines of other dimensions hold only the chunks whose coordinates in the dimensions
            // already reduced match theirs: the ctx above. For the all-gather half the same
            // holds with the roles reversed, so the same rings serve.
            if let Some(p) = ring_phase(name, &rings, reduce, 1.0)? {
                phases.push(p);
            }
        }
        Ok(phases)
    }

    fn rdh(&mut self, half: Half) -> Result<Vec<Phase>> {
        let groups = self.server_groups();
        let mut out = Vec::new();
        rdh_phases(&groups, half == Half::ReduceScatter, true, &mut out)?;
        Ok(out)
    }

    fn mesh(&mut self, half: Half) -> Result<Vec<Phase>> {
        let groups = self.server_groups();
        Ok(mesh_phase(&groups, half == Half::ReduceScatter)?.into_iter().collect())
    }

    /// The channels an algorithm uses on groups of `p` ranks.
    fn channels(alg: Algorithm, p: usize, shape: &[usize]) -> usize {
        match alg {
            Algorithm::KangaRing if shape.len() < 2 => 2,
            Algorithm::KangaRing => 2 * TORUS_HAMILTONIAN_CYCLES,
            Algorithm::Torus | Algorithm::Ring => 2,
            Algorithm::Rdh if p >= 2 => p.trailing_zeros() as usize,
            _ => 1,
        }
    }

    fn half(&mut self, alg: Algorithm, half: Half, order: &[u32]) -> Result<Vec<Phase>> {
        match alg {
            Algorithm::Ring => self.ring(order, half),
            Algorithm::KangaRing if self.shape.len() < 2 => self.kangaring_ring(order, half),
            Algorithm::KangaRing => {
                let cycles = hamiltonian_decomposition(self.shape).ok_or_else(|| {
                    Error::value(
                        "algorithm",
                        format!(
                            "kangaring needs a 2-D torus with two edge-disjoint Hamiltonian \
                             cycles (the 4 x 4 torus of an instance), not {:?}",
                            self.shape
                        ),
                    )
                })?;
                self.kangaring(&cycles, half)
            }
            Algorithm::Torus => self.torus(half),
            Algorithm::Rdh => self.rdh(half),
            Algorithm::Mesh => self.mesh(half),
            Algorithm::Auto | Algorithm::Hierarchical => {
                Err(Error::value("algorithm", "internal: unresolved algorithm"))
            }
        }
    }
}

/// Builds the schedule of collective `collective` over `group` with `algorithm` (`auto` resolved by
/// [`auto_algorithm`] for a message of `message_bytes`). For [`Collective::SendRecv`], `peers[r]` is
/// the rank that rank `r` sends to (a permutation).
///
/// Errors: an algorithm that does not apply to this group (KangaRing off the 4 x 4 torus, RDH
/// with a rank count that is not a power of two, torus rings or hierarchical on a group that is
/// not a whole machine, mesh beyond [`MESH_MAX_RANKS`] ranks), or bad `peers`.
pub fn build(
    group: &Group, collective: Collective, algorithm: Algorithm, message_bytes: u64,
    peers: Option<&[usize]>,
) -> Result<Schedule> {
    let n = group.n();
    let torus = group.torus;
    let alg = if algorithm == Algorithm::Auto {
        auto_algorithm(group, collective, message_bytes)
    } else {
        algorithm
    };
    let mut sched = Schedule {
        collective,
        algorithm: alg,
        intra: None,
        n,
        k: 1,
        phases: Vec::new(),
        perms: Vec::new(),
    };
    match collective {
        Collective::SendRecv => {
            let peers = match peers {
                Some(p) => p.to_vec(),
                None => (0..n).map(|r| (r + 1) % n).collect(),
            };
            check_permutation(&peers, n)?;
            mesh_only(alg, "send_recv is a direct transfer; got algorithm")?;
            sched.phases.push(Phase {
                name: "send/recv",
                repeat: 1,
                reduce: false,
                transfers: (0..n)
                    .map(|r| Transfer {
                        src: r as u32,
                        dst: peers[r] as u32,
                        // The whole buffer: every chunk.
                        sel: Ctx::FLAT.sel(0, 0, n as u32, n as u32, IDENTITY, ALL_CHANNELS),
                    })
                    .collect(),
                hbm_factor: 1.0,
                reduce_steps: 0,
            });
            return Ok(sched);
        }
        Collective::AllToAll => {
            mesh_only(alg, "all_to_all is modelled with the direct (mesh) pattern only; got")?;
            check_mesh(n)?;
            // Rank r sends its chunk j to rank j (its own chunk stays: a local copy).
            let mut transfers = transfers_vec(n * n)?;
            for j in 0..n {
                for r in 0..n {
                    transfers.push(Transfer {
                        src: r as u32,
                        dst: j as u32,
                        sel: Ctx::FLAT.sel(j as u32, 0, n as u32, 1, IDENTITY, ALL_CHANNELS),
                    });
                }
            }
            sched.phases.push(Phase {
                name: "all-to-all",
                repeat: 1,
                reduce: false,
                transfers,
                hbm_factor: 1.0,
                reduce_steps: 0,
            });
            return Ok(sched);
        }
        _ => {}
    }
    if n == 1 {
        return Ok(sched);
    }
    // Shape of what each "server" of the builder is: the whole group as one server for flat
    // algorithms, the UltraServer torus for hierarchical.
    let whole = group.is_whole();
    let needs_whole = |what: &str| -> Result<()> {
        if whole && torus.ultraservers() == 1 {
            Ok(())
        } else {
            Err(Error::value(
                "algorithm",
                format!(
                    "{what} runs on every chip of one instance or UltraServer; this group has {n} \
                     chips on a machine of shape {:?} (use ring, rdh or mesh, or hierarchical \
                     across UltraServers)",
                    torus.shape()
                ),
            ))
        }
    };
    match alg {
        Algorithm::Rdh if !n.is_power_of_two() => {
            return Err(Error::value(
                "algorithm",
                format!("rdh needs a power-of-two number of chips, got {n}"),
            ))
        }
        Algorithm::Mesh => check_mesh(n)?,
        Algorithm::Torus => needs_whole(alg.name())?,
        // On a whole instance: its two Hamiltonian cycles; on other chips of one server: the
        // ring through them (the runtime's KangaRing needs every rank of each chip, which a
        // chip-level group stands for).
        Algorithm::KangaRing if !whole && torus.ultraservers() > 1 => {
            return Err(Error::value(
                "algorithm",
                format!(
                    "kangaring runs within one instance or UltraServer; this group has {n} chips \
                     on a machine of {} UltraServers (use ring, rdh or mesh)",
                    torus.ultraservers()
                ),
            ))
        }
        Algorithm::KangaRing if whole => needs_whole(alg.name())?,
        Algorithm::Hierarchical if !(whole && torus.ultraservers() > 1) => {
            return Err(Error::value(
                "algorithm",
                format!(
                    "hierarchical joins several UltraServers: it needs every chip of an \
                     UltraCluster; this group has {n} chips on a machine of shape {:?}",
                    torus.shape()
                ),
            ))
        }
        _ => {}
    }
    if alg == Algorithm::Hierarchical {
        return hierarchical(group, collective, message_bytes, sched);
    }
    // Flat: the group is one "server" of n ranks; the ring order is the snake through the torus
    // when the group is a whole machine (so ring neighbours are link neighbours), else rank order.
    let flat_shape: Vec<usize> =
        if whole && torus.ultraservers() == 1 { torus.torus_shape().to_vec() } else { vec![n] };
    let order: Vec<u32> = if whole {
        let per = snake_order(torus.torus_shape());
        let p = torus.chips_per_server() as u32;
        (0..torus.ultraservers() as u32).flat_map(|s| per.iter().map(move |&l| l + s * p)).collect()
    } else {
        (0..n as u32).collect()
    };
    let mut b = Builder {
        shape: &flat_shape,
        p: n,
        ultraservers: 1,
        perms: Vec::new(),
        primaries_per_chip: primaries_per_chip(group),
    };
    // KangaRing over whole instances of one UltraServer (but not all four): the instance's two
    // Hamiltonian cycles joined through Z links, as on one instance (a single ring through the
    // chips would leave half of every chip's links idle).
    let layered = if alg == Algorithm::KangaRing && !whole { layered_cycles(group) } else { None };
    sched.k = if layered.is_some() {
        2 * TORUS_HAMILTONIAN_CYCLES
    } else {
        Builder::channels(alg, n, &flat_shape)
    };
    let halves: &[Half] = match collective {
        Collective::AllReduce => &[Half::ReduceScatter, Half::AllGather],
        Collective::ReduceScatter => &[Half::ReduceScatter],
        _ => &[Half::AllGather],
    };
    for &h in halves {
        let phases = match &layered {
            Some(cycles) => b.kangaring(cycles, h)?,
            None => b.half(alg, h, &order)?,
        };
        sched.phases.extend(phases);
    }
    // The runtime's single-step Mesh all-reduce for small buffers: every rank broadcasts its
    // buffer and receivers reduce locally, so its reduce-scatter is not a synchronised reducing
    // step (timing only; its extra traffic, n times a small buffer, is not charged).
    if collective == Collective::AllReduce
        && alg == Algorithm::Mesh
        && message_bytes <= COLLECTIVE_SINGLE_STEP_MESH_MAX_BYTES
    {
        if let Some(first) = sched.phases.first_mut() {
            first.reduce_steps = 0;
        }
    }
    sched.perms = b.perms;
    crate::cancel::check()?; // a phase builder may have stopped early on Ctrl-C
    Ok(sched)
}

/// Within every UltraServer with the intra algorithm, across UltraServers over EFA among the
/// chips with the same position (RDH when the UltraServer count is a power of two, else a
/// ring). All-reduce: intra reduce-scatter, inter all-reduce, intra all-gather; reduce-scatter:
/// intra then inter; all-gather: inter then intra (the Neuron runtime's order: the stage with
/// less traffic runs over EFA).
fn hierarchical(
    group: &Group, collective: Collective, message_bytes: u64, mut sched: Schedule,
) -> Result<Schedule> {
    let torus = group.torus;
    let shape = torus.torus_shape().to_vec();
    let p = torus.chips_per_server();
    let ultraservers = torus.ultraservers();
    let intra = intra_algorithm(&shape, p, group.ranks_per_chip, message_bytes);
    sched.intra = Some(intra);
    sched.k = Builder::channels(intra, p, &shape);
    let mut b = Builder {
        shape: &shape,
        p,
        ultraservers,
        perms: Vec::new(),
        primaries_per_chip: primaries_per_chip(group),
    };
    let snake = snake_order(&shape);
    // Inter-server groups: chips at local position l of every server; local chunk s stands for
    // rank-chunk l + P * s.
    let inter = |reduce: bool, out: &mut Vec<Phase>| -> Result<()> {
        let groups: Vec<(Vec<u32>, Ctx)> = (0..p)
            .map(|l| {
                let members: Vec<u32> = (0..ultraservers).map(|s| (s * p + l) as u32).collect();
                let ctx = Ctx { base: l as u32, mult: p as u32, n2: 1, s2: 0 };
                (members, ctx)
            })
            .collect();
        if ultraservers.is_power_of_two() {
            rdh_phases(&groups, reduce, false, out)
        } else {
            let rings: Vec<Ring> = groups
                .iter()
                .map(|(members, ctx)| Ring {
                    order: members.clone(),
                    perm: IDENTITY,
                    ctx: *ctx,
                    channel: ALL_CHANNELS,
                })
                .collect();
            let name = if reduce { "efa ring reduce-scatter" } else { "efa ring all-gather" };
            out.extend(ring_phase(name, &rings, reduce, 1.0)?);
            Ok(())
        }
    };
    let mut phases = Vec::new();
    // Ctrl-C between the stages (each tens of milliseconds for 4096 UltraServers).
    let check = crate::cancel::check;
    match collective {
        Collective::AllReduce => {
            phases.extend(b.half(intra, Half::ReduceScatter, &snake)?);
            check()?;
            inter(true, &mut phases)?;
            check()?;
            inter(false, &mut phases)?;
            check()?;
            phases.extend(b.half(intra, Half::AllGather, &snake)?);
        }
        Collective::ReduceScatter => {
            phases.extend(b.half(intra, Half::ReduceScatter, &snake)?);
            check()?;
            inter(true, &mut phases)?;
        }
        Collective::AllGather => {
            inter(false, &mut phases)?;
            check()?;
            phases.extend(b.half(intra, Half::AllGather, &snake)?);
        }
        Collective::AllToAll | Collective::SendRecv => {
            unreachable!("direct collectives are built above")
        }
    }
    check()?;
    sched.phases = phases;
    sched.perms = b.perms;
    Ok(sched)
}

/// `ValueError` on `algorithm` unless `alg` is the direct pattern (mesh), the only one a direct
/// collective has: the message is `what` then the algorithm's name.
fn mesh_only(alg: Algorithm, what: &str) -> Result<()> {
    if alg != Algorithm::Mesh {
        return Err(Error::value("algorithm", format!("{what} {:?}", alg.name())));
    }
    Ok(())
}

/// KangaRing's two cycles, in rank indices, when `group` is the first `k` (2 <= k < Z extent)
/// instances of one UltraServer in any rank order ([`layered_hamiltonian_cycles`]); else
/// `None`.
fn layered_cycles(group: &Group) -> Option<[Vec<u32>; TORUS_HAMILTONIAN_CYCLES]> {
    let t = group.torus;
    let shape = t.torus_shape();
    if t.ultraservers() != 1 || shape.len() != 3 {
        return None;
    }
    let per = shape[0] * shape[1];
    let n = group.n();
    let layers = n / per;
    if !n.is_multiple_of(per) || layers < 2 || layers >= shape[2] {
        return None;
    }
    let mut rank_of = vec![None; t.size()];
    for (r, &c) in group.chips.iter().enumerate() {
        rank_of[c] = Some(r as u32);
    }
    let cycles = layered_hamiltonian_cycles(&shape[..2], layers)?;
    let to_ranks =
        |cyc: &Vec<u32>| -> Option<Vec<u32>> { cyc.iter().map(|&c| rank_of[c as usize]).collect() };
    Some([to_ranks(&cycles[0])?, to_ranks(&cycles[1])?])
}

/// KangaRing's primary ranks per chip: the chip's runtime ranks form pairs of a primary and a
/// secondary (\[S16\]), so half of them (at least one).
fn primaries_per_chip(group: &Group) -> usize {
    (group.ranks_per_chip / 2).max(1)
}

fn check_mesh(n: usize) -> Result<()> {
    if n > MESH_MAX_RANKS {
        return Err(Error::value(
            "algorithm",
            format!(
                "mesh writes to every other chip directly; it is modelled up to {MESH_MAX_RANKS} \
                 chips, got {n} (use hierarchical, rdh or ring)"
            ),
        ));
    }
    Ok(())
}

fn check_permutation(peers: &[usize], n: usize) -> Result<()> {
    if peers.len() != n {
        return Err(Error::shape(
            "peers",
            format!("has {} entries; there are {n} chips", peers.len()),
        ));
    }
    let mut seen = vec![false; n];
    for (r, &p) in peers.iter().enumerate() {
        if p >= n {
            return Err(Error::value(
                "peers",
                format!("position {r} sends to {p}; the positions are 0..{n}"),
            ));
        }
        if seen[p] {
            return Err(Error::value(
                "peers",
                format!("position {p} would receive twice; peers must be a permutation"),
            ));
        }
        seen[p] = true;
    }
    Ok(())
}
