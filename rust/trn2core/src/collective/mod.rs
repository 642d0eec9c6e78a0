//! Collectives over the chips of an instance, an UltraServer or an UltraCluster (contract
//! section 5): all-reduce (sum, max, min), reduce-scatter, all-gather, all-to-all and send/recv.
//!
//! - [`ops`]: the vocabulary: [`Collective`], [`Algorithm`], [`ReduceOp`].
//! - [`schedule`]: a collective as phases of chunk transfers and reductions (the data model).
//! - [`graph`]: torus rings (snake order, Hamiltonian cycles) the algorithms are built on.
//! - [`build`](mod@build): one schedule per collective and algorithm.
//! - [`policy`]: the Neuron runtime's choice of algorithm (`auto`) by message size.
//! - [`exec`]: the functional model, executing a schedule on the buffers (the bits).
//! - [`cost`](mod@cost): the timing model, costing the same schedule over the links (the time).
//! - [`distributed`]: the same bits with the ranks spread over several processes (MPI).
//!
//! [`estimate`] costs a collective without data; [`run_reduce`] and [`run_move`] also compute
//! it. [`nccom_estimate`] is the model behind `trn2core nccom-test`.

pub mod build;
pub mod cost;
pub mod distributed;
pub mod exec;
pub mod graph;
pub mod ops;
pub mod policy;
pub mod schedule;

pub use build::build;
pub use cost::{cost, cost_launch, Launch, PhaseTiming, Timing};
pub use distributed::{Placement, Traffic, Transport};
pub use exec::{
    execute_move, execute_reduce, output_lengths, run_symbolic, Buf, BufMut, Symbolic,
    LEAF as LEAF_TAG, UNDEF,
};
pub use graph::{hamiltonian_decomposition, snake_order};
pub use ops::{Algorithm, Collective, ReduceOp};
pub use policy::auto_algorithm;
pub use schedule::{ChunkSel, Group, Phase, Schedule, Transfer};

use crate::dma::cost::{fixed_cost_s, Place};
use crate::numerics::Format;
use crate::perf::Uncertainty;
use crate::spec::{CORES_PER_CHIP, HBM_CHIP_BYTES_PER_S, INSTANCE_TORUS_X, INSTANCE_TORUS_Y};
use crate::topology::{check_lnc, Torus};
use crate::{Error, Result};

/// Everything a collective's report says.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveReport {
    /// Which of the five collectives ran.
    pub collective: Collective,
    /// The algorithm used (after `auto`), e.g. `"kangaring"` or `"hierarchical(torus+efa)"`.
    pub algorithm: String,
    /// The reduction of an all-reduce or reduce-scatter run on data; `None` when costed
    /// without data ([`estimate`]) or for a collective that only moves data.
    pub op: Option<ReduceOp>,
    /// Ranks of the group (one per chip).
    pub ranks: usize,
    /// nccom-test's ranks: the group's Logical NeuronCores (chips x `8 / lnc`), the `n` of the
    /// bus factor, so a collective has one busbw in the API and in `trn2core nccom-test`.
    pub logical_ranks: usize,
    /// Elements of one rank's input.
    pub elements: u64,
    /// Bytes of one element in the buffers' format.
    pub elem_bytes: u64,
    /// `nccom-test`'s `size(B)`: bytes of one rank's buffer for all-reduce, reduce-scatter,
    /// all-to-all and send/recv; of one rank's gathered output for all-gather.
    pub size_bytes: f64,
    /// Modelled time of the collective, seconds (the sum of its phases).
    pub seconds: f64,
    /// `size_bytes / seconds`, bytes/s.
    pub algbw: f64,
    /// `algbw` times the collective's bus factor, bytes/s.
    pub busbw: f64,
    /// `busbw / algbw`: `nccom-test`'s bus factor for `logical_ranks`
    /// ([`Collective::bus_factor`]).
    pub bus_factor: f64,
    /// What one chip's links can send at once, bytes/s (NeuronLink, plus EFA across servers).
    pub chip_link_capacity: f64,
    /// The per-phase timing the figures above are derived from.
    pub timing: Timing,
    /// Channels (parallel rings) of the schedule.
    pub channels: usize,
    /// How far the published collective cases were from the model.
    pub uncertainty: Uncertainty,
}

impl CollectiveReport {
    /// What bounds the collective: the bound of the phase that takes the most time.
    pub fn bound(&self) -> &'static str {
        self.timing
            .phases
            .iter()
            .max_by(|a, b| a.seconds().total_cmp(&b.seconds()))
            .map_or("latency", |p| p.bound())
    }

    /// One line naming what ran: `"all_reduce of 1024 x 4 B over 16 chips, kangaring"` (a
    /// rank of the group is a chip).
    pub fn description(&self) -> String {
        format!(
            "{} of {} x {} B over {} chips, {}",
            self.collective.name(),
            self.elements,
            self.elem_bytes,
            self.ranks,
            self.algorithm
        )
    }
}

/// `nccom-test`'s `size(B)` for `elements` per rank of `elem_bytes`.
pub fn size_bytes(collective: Collective, n: usize, elements: u64, elem_bytes: u64) -> f64 {
    let b = elements as f64 * elem_bytes as f64;
    match collective {
        Collective::AllGather => b * n as f64,
        _ => b,
    }
}

/// [`size_bytes`] as the whole number of bytes `build` takes.
fn size_bytes_of(collective: Collective, n: usize, elements: u64, elem_bytes: u64) -> u64 {
    size_bytes(collective, n, elements, elem_bytes) as u64
}

/// Elements of the working buffer the schedule's fine chunks split (see `schedule`).
fn working_elements(collective: Collective, n: usize, elements: u64) -> f64 {
    match collective {
        Collective::AllGather => elements as f64 * n as f64,
        _ => elements as f64,
    }
}

fn report(
    sched: &Schedule, group: &Group, op: Option<ReduceOp>, elements: u64, elem_bytes: u64,
    trace: bool, launch: Launch,
) -> Result<CollectiveReport> {
    let n = group.n();
    let w = working_elements(sched.collective, n, elements);
    let fine = w * elem_bytes as f64 / sched.fine_chunks().max(1) as f64;
    let timing = cost_launch(sched, group, fine, trace, launch)?;
    let size = size_bytes(sched.collective, n, elements, elem_bytes);
    // nccom-test's definition: a rank is a Logical NeuronCore. One chip alone moves nothing
    // over a bus (its factor stays that of one rank).
    let logical_ranks = if n > 1 { group.runtime_ranks() } else { n };
    let factor = sched.collective.bus_factor(logical_ranks);
    let (algbw, busbw) = if timing.seconds > 0.0 {
        (size / timing.seconds, size / timing.seconds * factor)
    } else {
        (0.0, 0.0)
    };
    Ok(CollectiveReport {
        collective: sched.collective,
        algorithm: sched.algorithm_name(),
        op,
        ranks: n,
        logical_ranks,
        elements,
        elem_bytes,
        size_bytes: size,
        seconds: timing.seconds,
        algbw,
        busbw,
        bus_factor: factor,
        chip_link_capacity: group.torus.chip_egress_bytes_per_s(),
        timing,
        channels: sched.k,
        uncertainty: Uncertainty::COLLECTIVE,
    })
}

/// [`report`] of a collective launched standalone, untraced.
fn standalone_report(
    sched: &Schedule, group: &Group, op: Option<ReduceOp>, elements: u64, elem_bytes: u64,
) -> Result<CollectiveReport> {
    report(sched, group, op, elements, elem_bytes, false, Launch::Standalone)
}

/// [`standalone_report`] of one process's part of a collective spread over processes, and the
/// bytes its `plan` moves.
fn local_report(
    sched: &Schedule, plan: distributed::LocalPlan, group: &Group, op: Option<ReduceOp>,
    elements: usize, elem: usize,
) -> Result<(CollectiveReport, Traffic)> {
    let rep = standalone_report(sched, group, op, elements as u64, elem as u64)?;
    Ok((rep, plan.traffic))
}

/// Costs collective `collective` over `group` for `elements` per rank of `elem_bytes` each, without
/// data. `peers` is send/recv's permutation (default: rank `r` sends to `r + 1`).
pub fn estimate(
    group: &Group, collective: Collective, algorithm: Algorithm, elements: u64, elem_bytes: u64,
    peers: Option<&[usize]>, trace: bool,
) -> Result<(Schedule, CollectiveReport)> {
    if elem_bytes == 0 {
        return Err(Error::value("dtype", "elements of zero bytes"));
    }
    let size = size_bytes(collective, group.n(), elements, elem_bytes);
    let sched = build(group, collective, algorithm, size as u64, peers)?;
    let rep = report(&sched, group, None, elements, elem_bytes, trace, Launch::Standalone)?;
    Ok((sched, rep))
}

/// The checks every output plan starts with: a reduction (`format` given) needs a collective
/// that reduces and a format Trainium2 reduces; elements have bytes.
fn check_plan_args(
    collective: Collective, format: Option<Format>, elem_bytes: usize,
) -> Result<()> {
    if let Some(f) = format {
        exec::check_reduce_format(f)?;
        if !collective.reduces() {
            return Err(Error::value(
                "collective",
                format!("{} does not reduce", collective.name()),
            ));
        }
    }
    if elem_bytes == 0 {
        return Err(Error::value("buffers", "elements of zero bytes"));
    }
    Ok(())
}

/// Validates the buffers of a functional collective before anything is allocated, and returns
/// the length of each rank's output in the units of `input_lens` (elements, or bytes of
/// `elem_bytes`-byte elements): one buffer per rank of `group`, all of one length (a whole
/// number of elements), and for a reduction (`format` given) a format Trainium2 reduces.
/// `ShapeError` / `FormatError` / `ValueError` on `buffers` otherwise.
pub fn output_plan(
    group: &Group, collective: Collective, format: Option<Format>, elem_bytes: usize,
    input_lens: &[usize],
) -> Result<Vec<usize>> {
    check_plan_args(collective, format, elem_bytes)?;
    let (got, ranks) = (input_lens.len(), group.n());
    if got != ranks {
        return Err(Error::shape(
            "buffers",
            format!("got {got} buffers for {ranks} chips; pass one buffer per chip"),
        ));
    }
    let l = input_lens[0];
    if let Some(i) = input_lens.iter().position(|&m| m != l) {
        return Err(Error::shape(
            "buffers",
            format!(
                "buffer {i} has {} elements, buffer 0 has {l}; every chip's buffer must have the \
                 same shape",
                input_lens[i]
            ),
        ));
    }
    if !l.is_multiple_of(elem_bytes) {
        return Err(Error::shape(
            "buffers",
            format!("{l} bytes is not a whole number of {elem_bytes}-byte elements"),
        ));
    }
    Ok(output_lengths(collective, ranks, l / elem_bytes)
        .into_iter()
        .map(|m| m * elem_bytes)
        .collect())
}

/// Refuses at once a functional collective whose symbolic run could not track its chunks: a
/// schedule has at least one fine chunk per rank, so `n` ranks need at least `n * n` cells
/// ([`exec::MAX_SYMBOLIC_CELLS`]). Checked before the schedule is built, which for the largest
/// UltraClusters takes a minute and gigabytes (the run would then be refused anyway).
fn check_symbolic_cells(n: usize) -> Result<()> {
    if n.checked_mul(n).is_none_or(|c| c > exec::MAX_SYMBOLIC_CELLS) {
        return Err(Error::capacity(
            "buffers",
            format!(
                "{n} ranks x at least {n} chunks is beyond the {} chunk cells the functional \
                 model tracks; cost it with estimate instead",
                exec::MAX_SYMBOLIC_CELLS
            ),
        ));
    }
    Ok(())
}

/// Computes an all-reduce or reduce-scatter on `inputs` (one per rank, in `format`) into
/// `outputs` ([`output_lengths`]), and costs it.
pub fn run_reduce(
    group: &Group, collective: Collective, op: ReduceOp, algorithm: Algorithm, format: Format,
    inputs: &[Buf], outputs: &mut [BufMut],
) -> Result<CollectiveReport> {
    let elem = u64::from(format.code_bits() / 8);
    let elements = match inputs.first() {
        Some(Buf::F32(x)) => x.len(),
        Some(Buf::U16(x)) => x.len(),
        Some(Buf::U8(x)) => x.len(),
        None => return Err(Error::shape("buffers", "no buffers")),
    } as u64;
    let size = size_bytes(collective, group.n(), elements, elem);
    check_symbolic_cells(group.n())?;
    let sched = build(group, collective, algorithm, size as u64, None)?;
    execute_reduce(&sched, op, format, inputs, outputs)?;
    standalone_report(&sched, group, Some(op), elements, elem)
}

/// Computes an all-gather, all-to-all or send/recv on raw bytes (`elem` bytes per element) and
/// costs it.
pub fn run_move(
    group: &Group, collective: Collective, algorithm: Algorithm, elem: usize, inputs: &[&[u8]],
    outputs: &mut [&mut [u8]], peers: Option<&[usize]>,
) -> Result<CollectiveReport> {
    let elements = (inputs.first().map_or(0, |b| b.len()) / elem.max(1)) as u64;
    let size = size_bytes(collective, group.n(), elements, elem as u64);
    if collective == Collective::AllGather {
        check_symbolic_cells(group.n())?;
    }
    let sched = build(group, collective, algorithm, size as u64, peers)?;
    execute_move(&sched, elem, inputs, outputs)?;
    standalone_report(&sched, group, None, elements, elem as u64)
}

/// Validates the buffers one process passes to a collective spread over processes
/// ([`distributed`]) and returns the length of each of its ranks' outputs, in the units of
/// `input_lens` (elements, or bytes of `elem_bytes`-byte elements): one buffer per rank the
/// process holds, each of `elements` elements, and for a reduction (`format` given) a format
/// Trainium2 reduces.
#[allow(clippy::too_many_arguments)]
pub fn local_output_plan(
    group: &Group, placement: &Placement, process: usize, collective: Collective,
    format: Option<Format>, elem_bytes: usize, elements: usize, input_lens: &[usize],
) -> Result<Vec<usize>> {
    check_plan_args(collective, format, elem_bytes)?;
    let ranks = placement.local_ranks(group, process)?;
    if input_lens.len() != ranks.len() {
        return Err(Error::shape(
            "buffers",
            format!(
                "got {} buffers; this process ({process}) holds {} chips of the collective \
                 (chips {:?}): pass one buffer per chip it holds",
                input_lens.len(),
                ranks.len(),
                ranks.iter().map(|&r| group.chips[r]).collect::<Vec<_>>()
            ),
        ));
    }
    let unit = if format.is_some() { 1 } else { elem_bytes };
    if let Some(i) = input_lens.iter().position(|&m| m != elements * unit) {
        return Err(Error::shape(
            "buffers",
            format!(
                "buffer {i} has {} {}, every chip's buffer must have {} (the size every \
                 process agreed on)",
                input_lens[i] / unit,
                if unit == 1 { "elements" } else { "bytes" },
                elements
            ),
        ));
    }
    let all = output_lengths(collective, group.n(), elements);
    Ok(ranks.iter().map(|&r| all[r] * unit).collect())
}

/// [`run_reduce`] for one process of a collective spread over processes: `inputs` and
/// `outputs` are the buffers of the ranks it holds (ascending), each input of `elements`
/// elements; `transport` moves the messages. Returns the report (the same as one process's)
/// and the bytes moved.
#[allow(clippy::too_many_arguments)]
pub fn run_reduce_local(
    group: &Group, placement: &Placement, process: usize, collective: Collective, op: ReduceOp,
    algorithm: Algorithm, format: Format, elements: usize, inputs: &[Buf], outputs: &mut [BufMut],
    transport: &mut dyn Transport,
) -> Result<(CollectiveReport, Traffic)> {
    let elem = (format.code_bits() / 8) as usize;
    let (sched, plan) =
        distributed::plan(group, placement, process, collective, algorithm, elem, elements, None)?;
    distributed::execute_reduce_local(&plan, op, format, inputs, outputs, transport)?;
    local_report(&sched, plan, group, Some(op), elements, elem)
}

/// [`run_move`] for one process of a collective spread over processes (see
/// [`run_reduce_local`]); `inputs` and `outputs` as bytes.
#[allow(clippy::too_many_arguments)]
pub fn run_move_local(
    group: &Group, placement: &Placement, process: usize, collective: Collective,
    algorithm: Algorithm, elem: usize, elements: usize, inputs: &[&[u8]],
    outputs: &mut [&mut [u8]], peers: Option<&[usize]>, transport: &mut dyn Transport,
) -> Result<(CollectiveReport, Traffic)> {
    let (sched, plan) =
        distributed::plan(group, placement, process, collective, algorithm, elem, elements, peers)?;
    distributed::execute_move_local(&plan, inputs, outputs, transport)?;
    local_report(&sched, plan, group, None, elements, elem)
}

/// The machine and chips `nccom-test` runs `chips` chips on: one chip, the first `chips` chips
/// of an instance's or UltraServer's snake order (so consecutive ranks are link neighbours), or
/// whole UltraServers of an UltraCluster.
pub fn machine_for_chips(chips: usize) -> Result<(Torus, Vec<usize>)> {
    let instance = INSTANCE_TORUS_X * INSTANCE_TORUS_Y;
    let us = Torus::ultraserver();
    let per_us = us.size();
    if chips == 0 {
        return Err(Error::value("ranks", "need at least one rank"));
    }
    if chips == 1 {
        return Ok((Torus::single_chip(), vec![0]));
    }
    let pick = |t: Torus| {
        let order = snake_order(t.torus_shape());
        let chosen: Vec<usize> = if chips == t.size() {
            (0..chips).collect()
        } else {
            order[..chips].iter().map(|&c| c as usize).collect()
        };
        (t, chosen)
    };
    if chips <= instance {
        return Ok(pick(Torus::instance()));
    }
    if chips <= per_us {
        return Ok(pick(us));
    }
    if !chips.is_multiple_of(per_us) {
        return Err(Error::value(
            "ranks",
            format!(
                "{chips} chips span several UltraServers; use a multiple of {per_us} chips \
                 (whole UltraServers)"
            ),
        ));
    }
    let t = Torus::ultracluster(chips / per_us)?;
    let all = (0..t.size()).collect();
    Ok((t, all))
}

/// One row of `nccom-test`.
#[derive(Debug, Clone, PartialEq)]
pub struct NccomRow {
    /// The tool's `size(B)` as asked for, bytes.
    pub size_bytes: u64,
    /// Elements of one rank's buffer (`size_bytes / elem_bytes`).
    pub count: u64,
    /// Modelled time, seconds: the chip-level stage overlapped with the within-chip stage,
    /// plus one DMA fixed cost when there is a within-chip stage.
    pub seconds: f64,
    /// `size_bytes / seconds`, bytes/s.
    pub algbw: f64,
    /// `algbw` times the bus factor for `ranks`, bytes/s.
    pub busbw: f64,
    /// Algorithm of the chip-level stage (after `auto`), or `"local"` when every rank
    /// is on one chip.
    pub algorithm: String,
    /// Seconds of the within-chip stage (several ranks per chip).
    pub intra_chip_s: f64,
    /// Bytes the within-chip stage reads and writes in HBM.
    pub intra_chip_bytes: f64,
    /// Chips the ranks span (`ranks / (8 / lnc)`, at least 1).
    pub chips: usize,
    /// The runtime's fixed cost of the operation, included in `seconds`.
    pub op_fixed_s: f64,
    /// The phases of the chip-level collective (none within one chip).
    pub phases: Vec<PhaseTiming>,
    /// The machine the chip-level collective ran on (its links name the phases' busiest).
    pub torus: Torus,
    /// How far the published collective cases were from the model.
    pub uncertainty: Uncertainty,
}

/// The model behind `trn2core nccom-test -r RANKS`: `ranks` are Logical NeuronCores as in
/// Neuron's tool (`8 / lnc` per chip), `size_bytes` is the tool's `size(B)`.
///
/// The ranks of one chip share its links, so the chip-level collective runs once per chip on
/// the chip's data (with the chip standing for its `L` ranks in the runtime's algorithm choice
/// and KangaRing's cycle), and a within-chip stage before or after it moves data through HBM:
/// an all-reduce reduces the chip's `L` local buffers (read `L S`, write `S`) and broadcasts the
/// result (read `S`, write `L S`); an all-gather copies the gathered data to every local rank;
/// a reduce-scatter reduces the local inputs; an all-to-all exchanges the local parts; a
/// send/recv (rank `r` to `r + 1`) copies `L - 1` buffers within the chip while one crosses to
/// the next chip. That stage moves its bytes at the chip's HBM bandwidth, overlapped with the
/// chip-level stage (the runtime pipelines chunks through both), and adds one DMA fixed cost.
/// The runtime's fixed cost of the operation is paid once, also by a collective within one chip.
pub fn nccom_estimate(
    collective: Collective, ranks: usize, lnc: usize, size_bytes: u64, elem_bytes: u64,
    algorithm: Algorithm,
) -> Result<NccomRow> {
    ranks_estimate(collective, ranks, lnc, size_bytes, elem_bytes, algorithm, Launch::Standalone)
}

/// The chips `ranks` logical NeuronCores on `nnodes` nodes span, as `nccom-test -r RANKS -N
/// NNODES` places them: `8 / lnc` ranks per chip, the ranks divided equally over the nodes. A
/// node is one 16-chip instance: one node holds at most 16 chips' ranks; several nodes are the
/// trn2u.48xlarge instances of UltraServers (four per UltraServer, NeuronLink between them, EFA
/// between UltraServers), each node used whole (the model places chips on whole instances
/// only). `ValueError` naming `lnc`, `ranks` or `nnodes` otherwise.
pub fn nccom_chips(ranks: usize, nnodes: usize, lnc: usize) -> Result<usize> {
    use crate::spec::{CHIPS_PER_INSTANCE, ULTRASERVER_INSTANCES};
    let per_chip = CORES_PER_CHIP.checked_div(lnc).unwrap_or(0);
    if per_chip == 0 {
        return Err(Error::value(
            "lnc",
            format!("got {lnc}; a logical core groups 1 to {CORES_PER_CHIP} physical cores"),
        ));
    }
    if ranks == 0 || nnodes == 0 {
        let arg = if ranks == 0 { "ranks" } else { "nnodes" };
        return Err(Error::value(arg, "need at least one"));
    }
    let per_node = CHIPS_PER_INSTANCE * per_chip;
    if !ranks.is_multiple_of(nnodes) {
        return Err(Error::value(
            "nnodes",
            format!(
                "{ranks} ranks do not divide equally over {nnodes} nodes (nccom-test puts \
                 nworkers / nnodes ranks on each node)"
            ),
        ));
    }
    let here = ranks / nnodes;
    if nnodes == 1 {
        if here > per_node {
            return Err(Error::value(
                "ranks",
                format!(
                    "{ranks} ranks at LNC={lnc} need {} chips; one node (a 16-chip trn2 \
                     instance) holds {per_node} ranks: pass -N/--nnodes {} or more",
                    ranks.div_ceil(per_chip),
                    ranks.div_ceil(per_node)
                ),
            ));
        }
        return Ok(if here <= per_chip { 1 } else { here / per_chip });
    }
    if here != per_node {
        return Err(Error::value(
            "nnodes",
            format!(
                "{ranks} ranks on {nnodes} nodes is {here} ranks per node; trn2core models \
                 several nodes only when each is used whole ({per_node} ranks per node at \
                 LNC={lnc}: -r {} -N {nnodes})",
                per_node * nnodes
            ),
        ));
    }
    if nnodes > ULTRASERVER_INSTANCES && !nnodes.is_multiple_of(ULTRASERVER_INSTANCES) {
        return Err(Error::value(
            "nnodes",
            format!(
                "{nnodes} nodes span several UltraServers of {ULTRASERVER_INSTANCES} nodes; use \
                 at most {ULTRASERVER_INSTANCES} or a multiple of {ULTRASERVER_INSTANCES} (whole \
                 UltraServers, joined by EFA)"
            ),
        ));
    }
    Ok(nnodes * CHIPS_PER_INSTANCE)
}

/// [`nccom_estimate`]'s model for a collective over `ranks` logical cores launched as `launch`
/// says: standalone (what `nccom-test` measures) or inside a compiled graph (a model's tensor-
/// parallel all-reduce); only the runtime's fixed costs differ.
pub fn ranks_estimate(
    collective: Collective, ranks: usize, lnc: usize, size_bytes: u64, elem_bytes: u64,
    algorithm: Algorithm, launch: Launch,
) -> Result<NccomRow> {
    check_lnc(lnc)?;
    let per_chip = CORES_PER_CHIP / lnc;
    if ranks == 0 {
        return Err(Error::value("ranks", "need at least one rank"));
    }
    let (chips, local) = if ranks <= per_chip {
        (1, ranks)
    } else if ranks.is_multiple_of(per_chip) {
        (ranks / per_chip, per_chip)
    } else {
        return Err(Error::value(
            "ranks",
            format!(
                "{ranks} ranks with LNC={lnc} ({per_chip} per chip): use at most {per_chip} ranks \
                 or a multiple of {per_chip}"
            ),
        ));
    };
    if elem_bytes == 0 || !size_bytes.is_multiple_of(elem_bytes) {
        return Err(Error::value(
            "size",
            format!("{size_bytes} bytes is not a whole number of {elem_bytes}-byte elements"),
        ));
    }
    let (torus, chosen) = machine_for_chips(chips)?;
    let group = Group::new(&torus, chosen)?.with_ranks_per_chip(local);
    let s = size_bytes as f64;
    let l = local as f64;
    // Per-chip elements of the chip-level collective's input.
    let count = size_bytes / elem_bytes;
    let chip_elements = match collective {
        Collective::AllReduce | Collective::ReduceScatter => count,
        Collective::AllGather => count / ranks as u64 * local as u64,
        Collective::AllToAll => count * local as u64,
        // Rank r sends to r + 1: of a chip's ranks only the last one's buffer crosses.
        Collective::SendRecv => count,
    };
    let mut phases = Vec::new();
    let (chip_s, op_fixed_s, alg) = if chips > 1 {
        let size = size_bytes_of(collective, group.n(), chip_elements, elem_bytes);
        let sched = build(&group, collective, algorithm, size, None)?;
        let rep = report(&sched, &group, None, chip_elements, elem_bytes, false, launch)?;
        let fixed = rep.timing.op_fixed_s;
        phases = rep.timing.phases;
        (rep.seconds - fixed, fixed, rep.algorithm)
    } else {
        let fixed = if local > 1 { launch.op_fixed_s(collective) } else { 0.0 };
        (0.0, fixed, "local".to_string())
    };
    let intra_bytes = if local > 1 {
        match collective {
            Collective::AllReduce => (2.0 * l + 2.0) * s,
            Collective::AllGather => (l + 1.0) * s,
            Collective::ReduceScatter => (l + 1.0) * s,
            Collective::AllToAll => 2.0 * l * s,
            Collective::SendRecv => 2.0 * (l - 1.0) * s,
        }
    } else {
        0.0
    };
    // The within-chip stage's DMAs read and write HBM.
    let intra_fixed = fixed_cost_s(Place::Hbm, Place::Hbm);
    let intra_s =
        if intra_bytes > 0.0 { intra_fixed + intra_bytes / HBM_CHIP_BYTES_PER_S } else { 0.0 };
    let seconds = op_fixed_s
        + if intra_bytes > 0.0 {
            chip_s.max(intra_bytes / HBM_CHIP_BYTES_PER_S) + intra_fixed
        } else {
            chip_s
        };
    let algbw = if seconds > 0.0 { s / seconds } else { 0.0 };
    Ok(NccomRow {
        size_bytes,
        count,
        seconds,
        algbw,
        busbw: algbw * collective.bus_factor(ranks),
        algorithm: alg,
        intra_chip_s: intra_s,
        intra_chip_bytes: intra_bytes,
        chips,
        op_fixed_s,
        phases,
        torus,
        uncertainty: Uncertainty::COLLECTIVE,
    })
}
