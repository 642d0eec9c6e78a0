//! DMA timing (\[S1\]\[S12\]\[S25\]): 16 DMA engines per NeuronCore work on every transfer
//! (a transfer uses one queue id across all 16 engines; each engine serves 8 partitions), a
//! fixed cost per transfer (descriptors, semaphore-to-start, completion), a per-row overhead on
//! the engines, the per-engine rate, and HBM bandwidth as the shared limit. With inline
//! compression the HBM side moves the compressed (`wire`) bytes while the engines still move the
//! raw bytes on the SBUF side.
//!
//! Calibrated on Trn2's published DMA profiles (docs/fidelity.md): the fixed cost is
//! `spec::DMA_FIXED_COST_S` (0.75 us), plus `spec::DMA_HBM_READ_LATENCY_S` (0.34 us) when the
//! transfer reads HBM (a load waits for the read's round trip, a store's writes are posted); the
//! documented "~1300 ns" is above every published Trn2 transfer. Efficiency: each partition row
//! costs its engine `spec::DMA_ROW_OVERHEAD_S` (about 1 ns) besides its bytes, so a transfer with
//! `s` bytes per row reaches `e(s) = s / (s + 23 B)` of the engine rate (92 % at 256 B, over
//! 99 % from 4 KiB: the profiled 256-byte rows moved at 21 B/ns). Engine rate: 23 B/ns per
//! engine, the Trn2 peak an engine sustains (\[S13\]'s table, and the measured 32 KiB transfer
//! of \[S12\]; `spec::DMA_ENGINE_BYTES_PER_S`), so 16 engines move at most 368 GB/s per core; the
//! 27.2 GB/s "theoretical" figure of the text (128 x 27.2 = the chip's 3.5 TB/s) is kept in
//! `spec` but not used. HBM: a core alone on its stack may use the whole stack (725 GB/s); the
//! other die's stacks cost `NUMA_REMOTE_*` (an assumption, see `spec`).
//!
//! Several transfers ([`schedule`]): a transfer runs on one queue id of every engine serving
//! its partitions (engine `e` serves partitions `8e..8e + 8`); transfers on the same queue run
//! in order, each paying its fixed cost once the previous one finished; an engine serves its
//! busy queues round-robin, which in a fluid model is an equal share of its rate for each; and
//! when the transfers touching one HBM stack ask for more than the stack's bandwidth, all of
//! them slow down in proportion. The trace has one track per engine and queue,
//! `"DMA engine 3 / queue 0"` ([`queue_track`]).

use std::sync::OnceLock;

use crate::perf::{Event, Report};
use crate::spec::{
    DMA_ENGINES_PER_CORE, DMA_ENGINE_BYTES_PER_S, DMA_FIXED_COST_S, DMA_HBM_READ_LATENCY_S,
    DMA_PARTITIONS_PER_ENGINE, DMA_QUEUES_PER_ENGINE, DMA_ROW_OVERHEAD_S, HBM_STACK_BYTES_PER_S,
    NUMA_REMOTE_BANDWIDTH_FACTOR, NUMA_REMOTE_EXTRA_LATENCY_S, SBUF_PARTITIONS,
};
use crate::{Error, Result};

named_enum! {
    /// Where a transfer reads or writes.
    pub enum Place("memory", value) {
        /// HBM on this core's die.
        Hbm = "hbm",
        /// HBM on the other die (NUMA).
        HbmRemote = "hbm_remote",
        /// The core's state buffer (on chip; no HBM traffic).
        Sbuf = "sbuf",
        /// The core's partial-sum buffer (on chip; no HBM traffic).
        Psum = "psum",
    }
}

impl Place {
    /// The memory as Trainium's documentation writes it in a report: `HBM`, `remote HBM`
    /// (the other die's, over the die-to-die link), `SBUF`, `PSUM`.
    pub fn label(self) -> &'static str {
        match self {
            Place::Hbm => "HBM",
            Place::HbmRemote => "remote HBM",
            Place::Sbuf => "SBUF",
            Place::Psum => "PSUM",
        }
    }
}

/// A DMA transfer to cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DmaPlan {
    /// Raw bytes delivered.
    pub bytes: u64,
    /// Bytes crossing HBM (compressed size when a codec is used; else `bytes`).
    pub wire_bytes: u64,
    /// Partitions the on-chip side spans (128 for a full SBUF tile).
    pub partitions: u64,
    /// Where the transfer reads.
    pub src: Place,
    /// Where the transfer writes.
    pub dst: Place,
}

/// Fraction of the engines' rate a transfer with `partition_bytes` per partition row reaches:
/// each row costs its engine [`DMA_ROW_OVERHEAD_S`] besides its bytes.
pub fn dma_efficiency(partition_bytes: f64) -> f64 {
    let overhead_bytes = DMA_ENGINE_BYTES_PER_S * DMA_ROW_OVERHEAD_S;
    if partition_bytes <= 0.0 {
        return 0.0;
    }
    partition_bytes / (partition_bytes + overhead_bytes)
}

/// Fixed cost of one transfer from `src` to `dst`: [`DMA_FIXED_COST_S`], plus
/// [`DMA_HBM_READ_LATENCY_S`] when it reads HBM, plus the NUMA latency when either side is the
/// other die's HBM.
pub fn fixed_cost_s(src: Place, dst: Place) -> f64 {
    let reads_hbm = matches!(src, Place::Hbm | Place::HbmRemote);
    let remote = src == Place::HbmRemote || dst == Place::HbmRemote;
    DMA_FIXED_COST_S
        + if reads_hbm { DMA_HBM_READ_LATENCY_S } else { 0.0 }
        + if remote { NUMA_REMOTE_EXTRA_LATENCY_S } else { 0.0 }
}

/// Peak DMA rate of one core's 16 engines, bytes/s.
pub fn engines_bytes_per_s() -> f64 {
    DMA_ENGINES_PER_CORE as f64 * DMA_ENGINE_BYTES_PER_S
}

/// The trace track of DMA engine `engine`, queue `queue`: `"DMA engine 3 / queue 0"`.
/// Out-of-range numbers are clamped to the last engine / queue.
pub fn queue_track(engine: usize, queue: usize) -> &'static str {
    static TRACKS: OnceLock<Vec<String>> = OnceLock::new();
    let tracks = TRACKS.get_or_init(|| {
        (0..DMA_ENGINES_PER_CORE)
            .flat_map(|e| {
                (0..DMA_QUEUES_PER_ENGINE).map(move |q| format!("DMA engine {e} / queue {q}"))
            })
            .collect()
    });
    let e = engine.min(DMA_ENGINES_PER_CORE - 1);
    let q = queue.min(DMA_QUEUES_PER_ENGINE - 1);
    tracks[e * DMA_QUEUES_PER_ENGINE + q].as_str()
}

/// One transfer of a [`schedule`].
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    /// The name of its spans in the trace.
    pub name: &'static str,
    /// DMA queue id (0..16), the same on every engine it uses.
    pub queue: usize,
    /// When it is issued; it starts once its queue has finished the transfers before it.
    pub issue_s: f64,
    /// Latency before data moves (descriptor setup, semaphore-to-start).
    pub fixed_s: f64,
    /// Raw bytes the engines move.
    pub bytes: u64,
    /// Bytes crossing HBM (compressed size with inline compression).
    pub wire_bytes: u64,
    /// Partitions spanned on chip, from partition 0.
    pub partitions: u64,
    /// Bytes per partition of each DMA the transfer is made of, for the size efficiency
    /// (`bytes / partitions` for a single DMA; a kernel streaming tiles uses its tile size).
    pub dma_partition_bytes: f64,
    /// Where the transfer reads (an HBM side adds its wire bytes to that stack's load).
    pub src: Place,
    /// Where the transfer writes (an HBM side adds its wire bytes to that stack's load).
    pub dst: Place,
}

impl Transfer {
    /// One DMA of `plan` on `queue`, issued at time 0, with the model's fixed cost.
    pub fn new(name: &'static str, plan: &DmaPlan, queue: usize) -> Result<Transfer> {
        if queue >= DMA_QUEUES_PER_ENGINE {
            return Err(Error::value(
                "queue",
                format!("got {queue}; each DMA engine has queues 0..{DMA_QUEUES_PER_ENGINE}"),
            ));
        }
        if plan.partitions == 0 || plan.partitions > SBUF_PARTITIONS as u64 {
            return Err(Error::shape(
                "partitions",
                format!(
                    "got {}; a transfer spans 1..={SBUF_PARTITIONS} partitions",
                    plan.partitions
                ),
            ));
        }
        Ok(Transfer {
            name,
            queue,
            issue_s: 0.0,
            fixed_s: fixed_cost_s(plan.src, plan.dst),
            bytes: plan.bytes,
            wire_bytes: plan.wire_bytes,
            partitions: plan.partitions,
            dma_partition_bytes: plan.bytes as f64 / plan.partitions as f64,
            src: plan.src,
            dst: plan.dst,
        })
    }

    /// Bytes of each engine's share: engine `e` serves partitions `8e..8e + 8`.
    fn engine_bytes(&self) -> Vec<(usize, f64)> {
        let per = DMA_PARTITIONS_PER_ENGINE as u64;
        (0..DMA_ENGINES_PER_CORE)
            .filter_map(|e| {
                let lo = e as u64 * per;
                let n = self.partitions.min(lo + per).saturating_sub(lo);
                (n > 0).then(|| (e, self.bytes as f64 * n as f64 / self.partitions as f64))
            })
            .collect()
    }

    /// Bytes this transfer moves over the local and the remote HBM stack (a side that is HBM
    /// reads or writes the wire bytes there; HBM to HBM touches it twice).
    fn hbm_bytes(&self) -> [f64; 2] {
        let mut out = [0.0; 2];
        for p in [self.src, self.dst] {
            match p {
                Place::Hbm => out[0] += self.wire_bytes as f64,
                Place::HbmRemote => out[1] += self.wire_bytes as f64,
                _ => {}
            }
        }
        out
    }
}

/// Bandwidth of the local and the remote HBM stack as seen from one core.
fn hbm_rates() -> [f64; 2] {
    [HBM_STACK_BYTES_PER_S, HBM_STACK_BYTES_PER_S * NUMA_REMOTE_BANDWIDTH_FACTOR]
}

/// When each transfer of a [`schedule`] ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// When each transfer began (its fixed cost starts), in input order.
    pub start_s: Vec<f64>,
    /// When each transfer's last byte arrived.
    pub finish_s: Vec<f64>,
    /// The latest finish.
    pub end_s: f64,
    /// Spans on the `"DMA engine e / queue q"` tracks.
    pub events: Vec<Event>,
}

/// Runs `transfers` on one core's 16 DMA engines (see the module doc): in order within a queue,
/// round-robin across queues on each engine, HBM stacks as shared limits. A fluid model: rates
/// are constant between the moments a transfer starts moving data or an engine finishes its
/// share, and the loop jumps from one such moment to the next.
pub fn schedule(transfers: &[Transfer]) -> Result<Timeline> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Waiting,
        Fixed { start: f64, until: f64 },
        Moving { since: f64 },
        Done,
    }
    for t in transfers {
        if t.queue >= DMA_QUEUES_PER_ENGINE || t.partitions == 0 {
            return Err(Error::value(
                "transfers",
                format!(
                    "transfer {:?} on queue {} over {} partitions; queues are 0..{DMA_QUEUES_PER_ENGINE} and a transfer spans at least one partition",
                    t.name, t.queue, t.partitions
                ),
            ));
        }
        if !(t.issue_s.is_finite() && t.issue_s >= 0.0 && t.fixed_s.is_finite() && t.fixed_s >= 0.0)
        {
            return Err(Error::value(
                "transfers",
                format!("transfer {:?}: issue and fixed times must be finite and >= 0", t.name),
            ));
        }
    }
    let n = transfers.len();
    let engines: Vec<Vec<(usize, f64)>> = transfers.iter().map(Transfer::engine_bytes).collect();
    let mut left: Vec<Vec<f64>> =
        engines.iter().map(|v| v.iter().map(|&(_, b)| b).collect()).collect();
    // Bytes an engine's share puts on each HBM stack, per raw byte it moves.
    let hbm_per_byte: Vec<[f64; 2]> = transfers
        .iter()
        .map(|t| {
            let h = t.hbm_bytes();
            let b = (t.bytes as f64).max(1.0);
            [h[0] / b, h[1] / b]
        })
        .collect();
    let eff: Vec<f64> =
        transfers.iter().map(|t| dma_efficiency(t.dma_partition_bytes).max(1e-9)).collect();
    let caps = hbm_rates();
    let mut state = vec![State::Waiting; n];
    let mut start_s = vec![0.0; n];
    let mut finish_s = vec![0.0; n];
    let mut events = Vec::new();
    let mut now = 0.0f64;
    // The transfers of each queue, in input order, and how many of them are done.
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); DMA_QUEUES_PER_ENGINE];
    for (i, t) in transfers.iter().enumerate() {
        queues[t.queue].push(i);
    }
    let mut head = [0usize; DMA_QUEUES_PER_ENGINE];
    let mut queue_free = [0.0f64; DMA_QUEUES_PER_ENGINE];
    let mut done = 0usize;
    // Every step finishes a fixed phase, an engine share, or reaches an issue time, so the loop
    // ends; the bound is a guard against a modelling bug, not a limit users meet.
    let max_steps = 4 * n * (DMA_ENGINES_PER_CORE + 2) + 16;
    for _ in 0..max_steps {
        if done == n {
            break;
        }
        // Start the head of every queue whose turn has come.
        for q in 0..DMA_QUEUES_PER_ENGINE {
            if let Some(&i) = queues[q].get(head[q]) {
                if state[i] == State::Waiting {
                    let begin = transfers[i].issue_s.max(queue_free[q]);
                    if begin <= now {
                        start_s[i] = begin;
                        state[i] =
                            State::Fixed { start: begin, until: begin + transfers[i].fixed_s };
                    }
                }
            }
        }
        // Fixed phases that are over start moving data (or finish, with nothing to move).
        let mut progressed = false;
        for i in 0..n {
            if let State::Fixed { start, until } = state[i] {
                if until <= now {
                    for &(e, _) in &engines[i] {
                        events.push(
                            Event::new(
                                queue_track(e, transfers[i].queue),
                                "descriptor/semaphore",
                                start,
                                until - start,
                            )
                            .with("engine", e as f64)
                            .with("queue", transfers[i].queue as f64)
                            .with("bytes", 0.0),
                        );
                    }
                    state[i] = State::Moving { since: until };
                    progressed = true;
                }
            }
        }
        // Rates: round-robin share of each engine, then the HBM limits.
        let mut busy = [0usize; DMA_ENGINES_PER_CORE];
        for i in 0..n {
            if matches!(state[i], State::Moving { .. }) {
                for (k, &(e, _)) in engines[i].iter().enumerate() {
                    if left[i][k] > 0.0 {
                        busy[e] += 1;
                    }
                }
            }
        }
        let mut rate: Vec<Vec<f64>> = vec![Vec::new(); n];
        let mut demand = [0.0f64; 2];
        for i in 0..n {
            if matches!(state[i], State::Moving { .. }) {
                rate[i] = engines[i]
                    .iter()
                    .enumerate()
                    .map(|(k, &(e, _))| {
                        if left[i][k] > 0.0 {
                            DMA_ENGINE_BYTES_PER_S * eff[i] / busy[e] as f64
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let total: f64 = rate[i].iter().sum();
                demand[0] += total * hbm_per_byte[i][0];
                demand[1] += total * hbm_per_byte[i][1];
            }
        }
        let scale = [0, 1].map(|r| if demand[r] > caps[r] { caps[r] / demand[r] } else { 1.0 });
        for i in 0..n {
            let s = (0..2)
                .filter(|&r| hbm_per_byte[i][r] > 0.0)
                .map(|r| scale[r])
                .fold(1.0f64, f64::min);
            rate[i].iter_mut().for_each(|r| *r *= s);
        }
        // Close the transfers that have nothing left (zero bytes, or every share done).
        for i in 0..n {
            if let State::Moving { .. } = state[i] {
                if left[i].iter().all(|&b| b <= 0.0) {
                    state[i] = State::Done;
                    finish_s[i] = now;
                    let q = transfers[i].queue;
                    queue_free[q] = now;
                    head[q] += 1;
                    done += 1;
                    progressed = true;
                }
            }
        }
        if progressed {
            continue;
        }
        // The next moment something changes.
        let mut next = f64::INFINITY;
        for i in 0..n {
            match state[i] {
                State::Fixed { until, .. } => next = next.min(until),
                State::Moving { .. } => {
                    for (k, &r) in rate[i].iter().enumerate() {
                        if left[i][k] > 0.0 && r > 0.0 {
                            next = next.min(now + left[i][k] / r);
                        }
                    }
                }
                State::Waiting => {
                    let q = transfers[i].queue;
                    if queues[q].get(head[q]) == Some(&i) {
                        next = next.min(transfers[i].issue_s.max(queue_free[q]));
                    }
                }
                State::Done => {}
            }
        }
        if !next.is_finite() {
            break;
        }
        let prev = now;
        let dt = (next - now).max(0.0);
        now = next;
        for i in 0..n {
            if let State::Moving { since } = state[i] {
                for (k, &r) in rate[i].iter().enumerate() {
                    if left[i][k] <= 0.0 {
                        continue;
                    }
                    // Done if it would end by `next` (the same expression that chose `next`,
                    // so the share that set it always completes, whatever the rounding of
                    // `next - now`).
                    if r > 0.0 && prev + left[i][k] / r <= next {
                        left[i][k] = 0.0;
                        let (e, share) = engines[i][k];
                        let tr = &transfers[i];
                        // This engine's part of the transfer, and of its HBM traffic.
                        let frac = if tr.bytes > 0 { share / tr.bytes as f64 } else { 0.0 };
                        let [local, remote] = tr.hbm_bytes();
                        events.push(
                            Event::new(queue_track(e, tr.queue), tr.name, since, now - since)
                                .with("engine", e as f64)
                                .with("queue", tr.queue as f64)
                                .with("bytes", share)
                                .with("hbm_bytes", (local + remote) * frac)
                                .with("partitions", tr.partitions as f64),
                        );
                    } else {
                        left[i][k] -= r * dt;
                    }
                }
            }
        }
    }
    if done != n {
        return Err(Error::value(
            "transfers",
            format!("the DMA schedule did not finish ({done} of {n} transfers); please report it"),
        ));
    }
    let end_s = finish_s.iter().copied().fold(0.0, f64::max);
    Ok(Timeline { start_s, finish_s, end_s, events })
}

/// Costs one transfer on queue 0; the report's `details` say which limit bound it.
pub fn dma_time(plan: &DmaPlan) -> Result<Report> {
    dma_time_on_queue(plan, 0)
}

/// Costs one transfer on DMA queue `queue` (0..16) of the engines serving its partitions.
/// `seconds` is the fixed cost plus the slower of the engines and HBM; `details` give both
/// (`engines_s`, `hbm_s`), the fixed cost, the size efficiency, the engines used and the queue.
pub fn dma_time_on_queue(plan: &DmaPlan, queue: usize) -> Result<Report> {
    let t = Transfer::new("transfer", plan, queue)?;
    let per_partition = plan.bytes as f64 / plan.partitions as f64;
    let eff = dma_efficiency(per_partition).max(1e-9);
    let shares = t.engine_bytes();
    let engines_s =
        shares.iter().map(|&(_, b)| b / (DMA_ENGINE_BYTES_PER_S * eff)).fold(0.0, f64::max);
    let hbm = t.hbm_bytes();
    let caps = hbm_rates();
    let hbm_s = (hbm[0] / caps[0]).max(hbm[1] / caps[1]);
    let fixed = t.fixed_s;
    let timeline = schedule(std::slice::from_ref(&t))?;
    let seconds = timeline.end_s;
    let mut r = Report::new("dma");
    r.description = format!(
        "DMA {} -> {}: {} B ({} B over HBM) across {} partitions, queue {queue}",
        plan.src.label(),
        plan.dst.label(),
        plan.bytes,
        plan.wire_bytes,
        plan.partitions
    );
    r.seconds = seconds;
    r.cycles = seconds * crate::spec::PE_CLOCK_HZ;
    r.bound = "memory";
    r.details = vec![
        ("fixed_s", fixed),
        ("engines_s", engines_s),
        ("hbm_s", hbm_s),
        ("efficiency", eff),
        ("engines", shares.len() as f64),
        ("queue", queue as f64),
    ];
    r.events = timeline.events;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed cost of the tests' transfers (they read HBM into SBUF).
    const LOAD: f64 = DMA_FIXED_COST_S + DMA_HBM_READ_LATENCY_S;

    fn plan(bytes: u64, src: Place) -> DmaPlan {
        DmaPlan { bytes, wire_bytes: bytes, partitions: 128, src, dst: Place::Sbuf }
    }

    #[test]
    fn large_transfers_approach_the_engines_rate_and_small_ones_pay_the_fixed_cost() {
        let big = dma_time(&plan(64 << 20, Place::Hbm)).expect("ok");
        let bw = (64u64 << 20) as f64 / big.seconds;
        assert!(bw > 0.9 * engines_bytes_per_s() && bw <= engines_bytes_per_s(), "{bw}");
        let small = dma_time(&plan(128 * 64, Place::Hbm)).expect("ok");
        assert!(small.seconds < 1.1 * LOAD + 1e-6);
        assert!(small.details[0].1 / small.seconds > 0.9, "fixed cost dominates");
    }

    #[test]
    fn reports_name_memories_as_trainium_writes_them() {
        let r = dma_time(&plan(1 << 20, Place::HbmRemote)).expect("ok");
        assert_eq!(
            r.description,
            "DMA remote HBM -> SBUF: 1048576 B (1048576 B over HBM) across 128 partitions, queue 0"
        );
        let labels: Vec<&str> =
            [Place::Hbm, Place::Sbuf, Place::Psum].iter().map(|p| p.label()).collect();
        assert_eq!(labels, ["HBM", "SBUF", "PSUM"]);
    }

    #[test]
    fn tracks_are_named_by_engine_and_queue() {
        assert_eq!(queue_track(3, 0), "DMA engine 3 / queue 0");
        assert_eq!(queue_track(15, 15), "DMA engine 15 / queue 15");
        let r = dma_time_on_queue(&plan(1 << 20, Place::Hbm), 5).expect("ok");
        let mut tracks: Vec<&str> = r.events.iter().map(|e| e.track).collect();
        tracks.sort_unstable();
        tracks.dedup();
        assert_eq!(tracks.len(), 16, "{tracks:?}");
        assert!(r.events.iter().all(|e| e.track.ends_with("/ queue 5")));
        // Every engine moves its 8 partitions' share from the end of the fixed cost to the end.
        for e in r.events.iter().filter(|e| e.name == "transfer") {
            assert!((e.start_s - LOAD).abs() < 1e-15);
            assert!((e.start_s + e.dur_s - r.seconds).abs() < 1e-12 * r.seconds);
        }
        assert!(dma_time_on_queue(&plan(1, Place::Hbm), 16).is_err());
    }

    #[test]
    fn a_narrow_transfer_uses_only_the_engines_of_its_partitions() {
        let mut p = plan(20 * 4096, Place::Hbm);
        p.partitions = 20; // engines 0, 1 (8 partitions each) and 2 (4 partitions)
        let r = dma_time(&p).expect("ok");
        assert_eq!(r.details[4], ("engines", 3.0));
        let eff = dma_efficiency(4096.0);
        let eight = 8.0 * 4096.0 / (DMA_ENGINE_BYTES_PER_S * eff);
        assert!((r.seconds - LOAD - eight).abs() < 1e-12, "{}", r.seconds);
    }

    #[test]
    fn queues_run_in_order_and_share_engines_round_robin() {
        let p = plan(64 << 20, Place::Hbm);
        let one = dma_time(&p).expect("ok").seconds - LOAD;
        let a = Transfer::new("a", &p, 0).expect("ok");
        let b = Transfer::new("b", &p, 0).expect("ok");
        // Same queue: the second starts (and pays its fixed cost) after the first.
        let t = schedule(&[a.clone(), b]).expect("ok");
        assert!((t.start_s[1] - t.finish_s[0]).abs() < 1e-15);
        assert!((t.end_s - 2.0 * (LOAD + one)).abs() < 1e-9 * t.end_s);
        // Two queues: both progress at half the rate and finish together, sooner.
        let c = Transfer::new("c", &p, 1).expect("ok");
        let t = schedule(&[a.clone(), c]).expect("ok");
        assert!((t.finish_s[0] - t.finish_s[1]).abs() < 1e-12);
        assert!((t.end_s - (LOAD + 2.0 * one)).abs() < 1e-9 * t.end_s);
        // A small transfer on another queue finishes early; the big one then takes the
        // engines back: the work is conserved.
        let small_plan = plan(8 << 20, Place::Hbm);
        let small_alone = dma_time(&small_plan).expect("ok").seconds - LOAD;
        let small = Transfer::new("small", &small_plan, 1).expect("ok");
        let t = schedule(&[a, small]).expect("ok");
        assert!(t.finish_s[1] < t.finish_s[0]);
        let both = one + small_alone;
        assert!((t.end_s - (LOAD + both)).abs() < 1e-12 * t.end_s, "{}", t.end_s);
    }

    #[test]
    fn tiny_transfers_late_in_time_still_finish() {
        // Shares of a fraction of a byte, issued at 1 s: completion must not depend on the
        // rounding of `next - now` at that magnitude.
        let mut ts = Vec::new();
        for (q, bytes) in [(0, 2u64), (1, 2), (2, 4), (3, 0)] {
            let mut t = Transfer::new("tiny", &plan(bytes, Place::Hbm), q).expect("ok");
            t.issue_s = 1.0;
            t.fixed_s = 0.0;
            ts.push(t);
        }
        let t = schedule(&ts).expect("finishes");
        assert!(t.end_s > 1.0 && t.end_s < 1.0 + 1e-6, "{}", t.end_s);
    }

    #[test]
    fn concurrent_transfers_never_exceed_an_hbm_stack() {
        // Four queues reading the remote stack: the engines could move 368 GB/s, the remote
        // stack allows 362.5 GB/s.
        let p = plan(32 << 20, Place::HbmRemote);
        let ts: Vec<Transfer> = (0..4).map(|q| Transfer::new("r", &p, q).expect("ok")).collect();
        let t = schedule(&ts).expect("ok");
        let moving = t.end_s - fixed_cost_s(Place::HbmRemote, Place::Sbuf);
        let rate = 4.0 * (32u64 << 20) as f64 / moving;
        let cap = HBM_STACK_BYTES_PER_S * NUMA_REMOTE_BANDWIDTH_FACTOR;
        assert!(rate <= cap * (1.0 + 1e-9) && rate > 0.999 * cap, "{rate}");
    }

    #[test]
    fn remote_hbm_and_compression() {
        let local = dma_time(&plan(256 << 20, Place::Hbm)).expect("ok");
        let remote = dma_time(&plan(256 << 20, Place::HbmRemote)).expect("ok");
        assert!(remote.seconds > local.seconds);
        let mut p = plan(256 << 20, Place::HbmRemote);
        p.wire_bytes = 64 << 20;
        let compressed = dma_time(&p).expect("ok");
        assert!(compressed.seconds < remote.seconds);
        // 256-byte rows: 256 / (256 + 23) of the engine rate.
        assert!((dma_efficiency(256.0) - 256.0 / 279.0).abs() < 1e-12);
        assert!(dma_efficiency(4096.0) > 0.99);
    }
}
