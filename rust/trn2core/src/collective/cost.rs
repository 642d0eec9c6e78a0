//! Timing of a collective [`Schedule`] over the links: the timing model, kept apart from the bits.
//!
//! # Model (alpha-beta with per-hop latency, link contention and the runtime's fixed costs)
//!
//! The steps of a phase are identical in shape (the chunks move, the pattern does not), so one
//! step of each phase is costed and multiplied by the phase's repeat count: costing is linear in
//! the number of transfers of one step, never in `steps x ranks`, and a 2,048-chip all-reduce
//! costs in milliseconds.
//!
//! ```text
//! collective = op + sum over phases of (repeat x step + reduce_steps x 234 us)
//! op      = the runtime's fixed cost of one operation: 291 us for an all-reduce or a
//!           reduce-scatter, 6.5 us for the others (calibrated, spec::COLLECTIVE_*_OP_FIXED_S)
//! step    = latency + max(link, hbm, reduce)
//! latency = the largest over the step's transfers of: NeuronLink hops x 1.5 us (the runtime's
//!           documented 1-2 us per hop of Ring/KangaRing, \[S16\]), or 15 us for a transfer across
//!           EFA (the documented minimal inter-server RDMA latency, \[S15\])
//! link    = the largest over links of (bytes every transfer of the step routes over that link)
//!           / (the link's bandwidth per direction, times the 0.40 of it collectives achieve on
//!           NeuronLink, spec::NEURONLINK_ACHIEVED_FRACTION; EFA at spec::EFA_ACHIEVED_FRACTION
//!           of its nominal rate, measured HBM to HBM): transfers
//!           sharing a link share its bandwidth
//! hbm     = the largest over chips of the HBM bytes the step reads and writes there (a copy
//!           reads at the sender and writes at the receiver; a reduction also reads the
//!           receiver's own chunk; KangaRing's duplication scales this by 3/4 or 2/3) / 2.9 TB/s
//! reduce  = the largest over chips of the bytes reduced there / (the chip's 3.5 TB/s of DMA at
//!           the 50 % rate of accumulate-type transfers, \[S3\]\[S19\])
//! reduce_steps x 234 us = the runtime's fixed cost of each synchronised reducing step
//!           (spec::COLLECTIVE_REDUCE_STEP_S; the phase's `reduce_steps`, see `Phase`)
//! ```
//!
//! A collective inside a compiled graph ([`Launch::InGraph`]) pays the in-graph fixed costs
//! (spec::COLLECTIVE_IN_GRAPH_*) instead of the standalone ones; everything else is the same.
//!
//! The op and reducing-step costs are calibrated on the nccom-test examples of the Neuron
//! documentation (docs/fidelity.md): no documented mechanism explains their size. Transfers,
//! reductions and HBM traffic of a step overlap (the runtime slices chunks to pipeline them,
//! \[S16\]); a step's latency does not overlap the next step's. Routing is the torus's
//! dimension-order routing; EFA crossings use the sender's NIC egress and the receiver's NIC
//! ingress (25 GB/s each way) over a non-blocking fabric. A link never carries more than its
//! bandwidth for the time of any step, so it never does over the whole collective either.

use super::ops::Collective;
use super::schedule::{Group, Schedule};
use crate::perf::{write_bandwidth_counter, write_json_args};
use crate::spec::{
    COLLECTIVE_IN_GRAPH_REDUCE_OP_FIXED_S, COLLECTIVE_IN_GRAPH_REDUCE_STEP_S,
    COLLECTIVE_OP_FIXED_S, COLLECTIVE_REDUCE_OP_FIXED_S, COLLECTIVE_REDUCE_STEP_S,
    DMA_ACCUMULATE_EFFICIENCY, DMA_CHIP_BYTES_PER_S, EFA_ACHIEVED_FRACTION, EFA_LATENCY_S,
    HBM_CHIP_BYTES_PER_S, NEURONLINK_ACHIEVED_FRACTION, RING_HOP_LATENCY_S,
};

/// How a collective is launched, which decides the runtime's fixed costs it pays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// By itself, as `nccom-test` launches it: the fixed costs fitted on nccom-test's runs
    /// (spec `COLLECTIVE_REDUCE_OP_FIXED_S`, `COLLECTIVE_REDUCE_STEP_S`).
    Standalone,
    /// Inside a compiled graph (a model's step), where the runtime has set the collective up
    /// ahead: spec `COLLECTIVE_IN_GRAPH_REDUCE_OP_FIXED_S` and `COLLECTIVE_IN_GRAPH_REDUCE_STEP_S`.
    InGraph,
}

impl Launch {
    /// The runtime's fixed cost of one operation of `collective` launched this way (a
    /// collective that does not reduce pays `COLLECTIVE_OP_FIXED_S` either way: its
    /// standalone floor is already small, and no in-graph measurement separates it).
    pub fn op_fixed_s(self, collective: Collective) -> f64 {
        match (self, collective.reduces()) {
            (Launch::Standalone, true) => COLLECTIVE_REDUCE_OP_FIXED_S,
            (Launch::InGraph, true) => COLLECTIVE_IN_GRAPH_REDUCE_OP_FIXED_S,
            (_, false) => COLLECTIVE_OP_FIXED_S,
        }
    }

    /// The runtime's fixed cost of each synchronised reducing step launched this way.
    pub fn reduce_step_s(self) -> f64 {
        match self {
            Launch::Standalone => COLLECTIVE_REDUCE_STEP_S,
            Launch::InGraph => COLLECTIVE_IN_GRAPH_REDUCE_STEP_S,
        }
    }
}
use crate::topology::{LinkKind, Torus};
use crate::Result;

/// Timing of one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseTiming {
    /// The phase's name as the schedule gives it (e.g. `"all-to-all"`), also its trace span.
    pub name: &'static str,
    /// Steps.
    pub repeat: u32,
    /// Seconds of one step.
    pub step_s: f64,
    /// Seconds of one step's latency: the slowest transfer's NeuronLink hops x 1.5 us, or
    /// 15 us across EFA (\[S16\]\[S15\]); not overlapped with the data movement.
    pub latency_s: f64,
    /// Seconds the busiest link needs for one step's bytes at its per-direction bandwidth.
    pub link_s: f64,
    /// Seconds the busiest chip's HBM needs for one step's reads and writes at 2.9 TB/s.
    pub hbm_s: f64,
    /// Seconds the busiest reducing chip needs to accumulate one step's bytes with its DMA
    /// engines (3.5 TB/s at the 50 % accumulate rate, \[S3\]\[S19\]).
    pub reduce_s: f64,
    /// Start of the phase, seconds from the start of the collective.
    pub start_s: f64,
    /// Whether the phase crosses EFA.
    pub efa: bool,
    /// Most NeuronLink hops of a transfer.
    pub max_hops: usize,
    /// Bytes of one step on its busiest link.
    pub busiest_link_bytes: f64,
    /// The busiest link of a step.
    pub busiest_link: Option<usize>,
    /// Synchronised reducing steps of the phase (see `Phase::reduce_steps`).
    pub reduce_steps: u32,
    /// Seconds of the runtime's fixed cost of those steps, over the whole phase.
    pub sync_s: f64,
}

impl PhaseTiming {
    /// Seconds of the whole phase: its steps and the runtime's fixed cost of its reducing steps.
    pub fn seconds(&self) -> f64 {
        self.step_s * f64::from(self.repeat) + self.sync_s
    }

    /// What bounds a step: `"latency"` (hops, and the runtime's fixed step costs), `"link"`,
    /// `"efa"`, `"hbm"` or `"reduce"`.
    pub fn bound(&self) -> &'static str {
        let transfer = self.link_s.max(self.hbm_s).max(self.reduce_s);
        let fixed = self.latency_s + self.sync_s / f64::from(self.repeat.max(1));
        if fixed >= transfer {
            "latency"
        } else if self.link_s >= self.hbm_s.max(self.reduce_s) {
            if self.efa {
                "efa"
            } else {
                "link"
            }
        } else if self.hbm_s >= self.reduce_s {
            "hbm"
        } else {
            "reduce"
        }
    }
}

/// Timing of a whole collective.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// The whole collective, the runtime's fixed cost of the operation included.
    pub seconds: f64,
    /// The runtime's fixed cost of the operation (0 for a collective without transfers).
    pub op_fixed_s: f64,
    /// Timing of each phase of the schedule, in order.
    pub phases: Vec<PhaseTiming>,
    /// Bytes each used link carried over the whole collective: `(link id, bytes)`, by id.
    pub link_bytes: Vec<(usize, f64)>,
    /// Largest `bytes / (bandwidth x seconds)` over links and phases (at most 1).
    pub max_link_utilization: f64,
    /// Bytes sent by all ranks over the network (excluding copies within a chip).
    pub network_bytes: f64,
    /// Chrome trace JSON, when asked for.
    pub trace: Option<String>,
}

/// Most links the trace draws a track for (above, only the phases are drawn).
const TRACE_MAX_LINK_TRACKS: usize = 2048;

/// Costs `s` on `group` with fine chunks of `fine_chunk_bytes` each (the average; fine chunks of
/// a buffer differ by at most one element). With `trace`, also builds a Chrome/Perfetto trace:
/// one track for the phases and one per link. `Error::Interrupted` if the installed
/// cancellation token fires (checked per phase and every 4096 transfers: an UltraCluster of
/// 4096 UltraServers has 262144 transfers a step and costs in seconds).
pub fn cost(s: &Schedule, group: &Group, fine_chunk_bytes: f64, trace: bool) -> Result<Timing> {
    cost_launch(s, group, fine_chunk_bytes, trace, Launch::Standalone)
}

/// [`cost`] for a collective launched as `launch` says (standalone or inside a compiled graph):
/// only the runtime's fixed costs differ.
pub fn cost_launch(
    s: &Schedule, group: &Group, fine_chunk_bytes: f64, trace: bool, launch: Launch,
) -> Result<Timing> {
    let cancel = crate::cancel::current();
    let torus: &Torus = group.torus;
    let nlinks = torus.size() * torus.links_per_chip();
    let mut load = vec![0f64; nlinks];
    let mut touched: Vec<usize> = Vec::new();
    let mut total = vec![0f64; nlinks];
    let mut hbm = vec![0f64; torus.size()];
    let mut red = vec![0f64; torus.size()];
    let mut chips_touched: Vec<usize> = Vec::new();
    let mut phases = Vec::with_capacity(s.phases.len());
    let mut t = 0.0;
    let mut max_util: f64 = 0.0;
    let mut network_bytes = 0.0;
    let mut events: Vec<TraceSpan> = Vec::new();
    let reduce_rate = DMA_CHIP_BYTES_PER_S * DMA_ACCUMULATE_EFFICIENCY;
    // What collectives achieve of each link: NeuronLink at the calibrated fraction of its
    // bandwidth, EFA at the fraction HBM-to-HBM RDMA was measured to reach on a trn2.48xlarge.
    let achieved = |l: usize| {
        let bw = torus.link_id_bandwidth(l);
        if is_efa(torus, l) {
            bw * EFA_ACHIEVED_FRACTION
        } else {
            bw * NEURONLINK_ACHIEVED_FRACTION
        }
    };
    // The runtime's fixed cost of the operation, first on the timeline.
    let op_fixed_s = if s.phases.is_empty() { 0.0 } else { launch.op_fixed_s(s.collective) };
    if trace && op_fixed_s > 0.0 {
        events.push((
            "collective".to_string(),
            "runtime fixed cost",
            0.0,
            op_fixed_s,
            vec![("phase", -1.0)],
        ));
    }
    t += op_fixed_s;
    for (phase_index, phase) in s.phases.iter().enumerate() {
        let mut latency: f64 = 0.0;
        let mut max_hops = 0;
        let mut efa = false;
        let mut step_net = 0.0;
        cancel.check()?;
        for (i, tr) in phase.transfers.iter().enumerate() {
            if i % 4096 == 4095 {
                cancel.check()?;
            }
            let bytes = tr.sel.fine_chunks(s.k) as f64 * fine_chunk_bytes;
            let (a, b) = (group.chips[tr.src as usize], group.chips[tr.dst as usize]);
            let route = torus.route(a, b, |l| {
                if load[l] == 0.0 {
                    touched.push(l);
                }
                load[l] += bytes;
            });
            if a != b {
                step_net += bytes;
            }
            let lat =
                if route.efa { EFA_LATENCY_S } else { route.hops as f64 * RING_HOP_LATENCY_S };
            latency = latency.max(lat);
            max_hops = max_hops.max(route.hops);
            efa |= route.efa;
            for (chip, acc) in [(a, bytes), (b, bytes * if phase.reduce { 2.0 } else { 1.0 })] {
                if hbm[chip] == 0.0 && red[chip] == 0.0 {
                    chips_touched.push(chip);
                }
                hbm[chip] += acc * phase.hbm_factor;
            }
            if phase.reduce {
                red[b] += bytes;
            }
        }
        let (mut link_s, mut busiest, mut busiest_bytes) = (0f64, None, 0f64);
        for &l in &touched {
            let ls = load[l] / achieved(l);
            if ls > link_s {
                link_s = ls;
                busiest = Some(l);
                busiest_bytes = load[l];
            }
        }
        let (mut hbm_s, mut reduce_s) = (0f64, 0f64);
        for &c in &chips_touched {
            hbm_s = hbm_s.max(hbm[c] / HBM_CHIP_BYTES_PER_S);
            reduce_s = reduce_s.max(red[c] / reduce_rate);
        }
        let step = latency + link_s.max(hbm_s).max(reduce_s);
        let repeat = f64::from(phase.repeat);
        let sync_s = f64::from(phase.reduce_steps) * launch.reduce_step_s();
        for &l in &touched {
            total[l] += load[l] * repeat;
            if step > 0.0 {
                max_util = max_util.max(load[l] / (torus.link_id_bandwidth(l) * step));
            }
            if trace && touched.len() <= TRACE_MAX_LINK_TRACKS {
                let busy = repeat * load[l] / achieved(l);
                let args = vec![
                    ("phase", phase_index as f64),
                    ("link", l as f64),
                    ("bytes", repeat * load[l]),
                    ("steps", repeat),
                    ("bytes_per_step", load[l]),
                    ("link_GBps", achieved(l) / 1e9),
                ];
                events.push((torus.link_name(l), phase.name, t, busy, args));
            }
        }
        if trace {
            let args = vec![
                ("phase", phase_index as f64),
                ("steps", repeat),
                ("step_s", step),
                ("network_bytes", step_net * repeat),
                ("max_hops", max_hops as f64),
                ("reduce_steps", f64::from(phase.reduce_steps)),
                ("links", touched.len() as f64),
            ];
            events.push(("collective".to_string(), phase.name, t, repeat * step + sync_s, args));
        }
        network_bytes += step_net * repeat;
        phases.push(PhaseTiming {
            name: phase.name,
            repeat: phase.repeat,
            step_s: step,
            latency_s: latency,
            link_s,
            hbm_s,
            reduce_s,
            start_s: t,
            efa,
            max_hops,
            busiest_link_bytes: busiest_bytes,
            busiest_link: busiest,
            reduce_steps: phase.reduce_steps,
            sync_s,
        });
        t += repeat * step + sync_s;
        for &l in &touched {
            load[l] = 0.0;
        }
        touched.clear();
        for &c in &chips_touched {
            hbm[c] = 0.0;
            red[c] = 0.0;
        }
        chips_touched.clear();
    }
    let link_bytes: Vec<(usize, f64)> =
        total.iter().enumerate().filter(|(_, &b)| b > 0.0).map(|(l, &b)| (l, b)).collect();
    Ok(Timing {
        seconds: t,
        op_fixed_s,
        phases,
        link_bytes,
        max_link_utilization: max_util,
        network_bytes,
        trace: trace.then(|| trace_json(&events)),
    })
}

/// The runtime's fixed cost of one operation of `collective`: reducing collectives pay
/// [`COLLECTIVE_REDUCE_OP_FIXED_S`], the others [`COLLECTIVE_OP_FIXED_S`].
pub fn op_fixed_cost_s(collective: Collective) -> f64 {
    Launch::Standalone.op_fixed_s(collective)
}

/// One span of a collective's trace: track, name, start and length (seconds), arguments.
type TraceSpan = (String, &'static str, f64, f64, Vec<(&'static str, f64)>);

/// A Chrome trace-event document: one thread per track, times in microseconds, every slice
/// with its `args`; a bandwidth counter (GB/s) per link track; flow arrows from each phase of
/// the "collective" track to the next (a phase starts when the one before it has ended).
fn trace_json(events: &[TraceSpan]) -> String {
    let mut tracks: Vec<&str> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (track, ..) in events {
        if !index.contains_key(track.as_str()) {
            let _ = index.insert(track.as_str(), tracks.len());
            tracks.push(track.as_str());
        }
    }
    let mut s = String::with_capacity(128 + events.len() * 100);
    s.push_str("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
    s.push_str("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0,\"args\":{\"name\":\"trn2core collective\"}}");
    for (i, t) in tracks.iter().enumerate() {
        s.push_str(&format!(
            ",{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":0,\"tid\":{i},\"args\":{{\"name\":\"{t}\"}}}}"
        ));
    }
    for (track, name, start, dur, args) in events {
        let tid = index.get(track.as_str()).copied().unwrap_or(0);
        s.push_str(&format!(
            ",{{\"ph\":\"X\",\"name\":\"{name}\",\"pid\":0,\"tid\":{tid},\"ts\":{:.6},\"dur\":{:.6},",
            start * 1e6,
            dur * 1e6
        ));
        write_json_args(&mut s, args);
        s.push('}');
    }
    // Each link's bandwidth over time (a phase moves its bytes over the link at a steady rate).
    for t in &tracks {
        if *t == "collective" {
            continue;
        }
        let spans: Vec<(f64, f64, f64)> = events
            .iter()
            .filter(|e| e.0 == *t)
            .map(|(_, _, start, dur, args)| {
                let bytes = args.iter().find(|a| a.0 == "bytes").map_or(0.0, |a| a.1);
                (*start, *dur, bytes)
            })
            .collect();
        write_bandwidth_counter(&mut s, 0, &format!("link {t} bandwidth"), &spans);
    }
    // Phase order: phase p + 1 waits for phase p (and the first for the fixed cost).
    let chain: Vec<&TraceSpan> = events.iter().filter(|e| e.0 == "collective").collect();
    let tid = index.get("collective").copied().unwrap_or(0);
    for (id, pair) in chain.windows(2).enumerate() {
        let (a, b) = (pair[0], pair[1]);
        s.push_str(&format!(
            ",{{\"ph\":\"s\",\"name\":\"phase order\",\"cat\":\"dependency\",\"id\":{id},\"pid\":0,\"tid\":{tid},\"ts\":{:.6}}}",
            (a.2 + a.3 / 2.0) * 1e6
        ));
        s.push_str(&format!(
            ",{{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"phase order\",\"cat\":\"dependency\",\"id\":{id},\"pid\":0,\"tid\":{tid},\"ts\":{:.6}}}",
            b.2 * 1e6
        ));
    }
    s.push_str("]}");
    s
}

/// Whether a link identifier is an EFA NIC direction.
pub fn is_efa(torus: &Torus, link: usize) -> bool {
    matches!(torus.link_of(link).1, LinkKind::EfaEgress | LinkKind::EfaIngress)
}
