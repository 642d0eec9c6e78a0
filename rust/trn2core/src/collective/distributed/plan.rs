//! The plan of a collective spread over processes (see [`distributed`](super)): which process
//! holds each chip ([`Placement`]), where each combination of a reduction's expression trees is
//! computed, and the messages of every round ([`LocalPlan`], with its [`Traffic`]).

use std::collections::BTreeMap;

use super::super::exec::{boundary, output_lengths, run_symbolic, Symbolic, LEAF, UNDEF};
use super::super::ops::Collective;
use super::super::schedule::{Group, Schedule};
use crate::{Error, Result};

/// Which process holds each chip of a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    procs: usize,
    of_chip: Vec<u32>,
}

impl Placement {
    /// The documented default: `procs` processes, each holding a contiguous run of
    /// `chips / procs` chips in index order (process `p` holds chips `p c .. (p + 1) c`).
    /// `ValueError` on `processes` unless `procs` divides `chips`.
    pub fn contiguous(chips: usize, procs: usize) -> Result<Placement> {
        if procs == 0 || procs > chips || !chips.is_multiple_of(procs) {
            return Err(Error::value(
                "processes",
                format!(
                    "{procs} processes cannot share the {chips} chips of this machine evenly; \
                     run a number of processes that divides {chips}, or pass placement= (the \
                     process of each chip)"
                ),
            ));
        }
        let per = chips / procs;
        Ok(Placement { procs, of_chip: (0..chips).map(|c| (c / per) as u32).collect() })
    }

    /// An explicit placement: `of_chip[c]` is the process that holds chip `c` (every chip
    /// listed, every process below `procs`). A process may hold no chip.
    pub fn explicit(of_chip: &[usize], procs: usize, chips: usize) -> Result<Placement> {
        if of_chip.len() != chips {
            return Err(Error::shape(
                "placement",
                format!(
                    "got {} entries for a machine of {chips} chips; give the process of every \
                     chip",
                    of_chip.len()
                ),
            ));
        }
        if procs == 0 {
            return Err(Error::value("processes", "need at least one process"));
        }
        if let Some((c, &p)) = of_chip.iter().enumerate().find(|(_, &p)| p >= procs) {
            return Err(Error::value(
                "placement",
                format!("chip {c} is placed on process {p}; the processes are 0..{procs}"),
            ));
        }
        Ok(Placement { procs, of_chip: of_chip.iter().map(|&p| p as u32).collect() })
    }

    /// `placement` if given (else the contiguous default) for `procs` processes.
    pub fn new(placement: Option<&[usize]>, procs: usize, chips: usize) -> Result<Placement> {
        match placement {
            Some(p) => Placement::explicit(p, procs, chips),
            None => Placement::contiguous(chips, procs),
        }
    }

    /// Processes.
    pub fn procs(&self) -> usize {
        self.procs
    }

    /// The process of every chip.
    pub fn of_chips(&self) -> Vec<usize> {
        self.of_chip.iter().map(|&p| p as usize).collect()
    }

    /// The process of each rank of `group` (rank `r` is chip `group.chips[r]`).
    pub fn of_ranks(&self, group: &Group) -> Result<Vec<u32>> {
        if self.of_chip.len() != group.torus.size() {
            return Err(Error::shape(
                "placement",
                format!(
                    "places {} chips; the machine has {}",
                    self.of_chip.len(),
                    group.torus.size()
                ),
            ));
        }
        Ok(group.chips.iter().map(|&c| self.of_chip[c]).collect())
    }

    /// The ranks of `group` that process `process` holds, ascending.
    pub fn local_ranks(&self, group: &Group, process: usize) -> Result<Vec<usize>> {
        Ok(self
            .of_ranks(group)?
            .iter()
            .enumerate()
            .filter(|(_, &p)| p as usize == process)
            .map(|(r, _)| r)
            .collect())
    }
}

/// What a process's plan moves between processes, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Rounds of exchange.
    pub rounds: usize,
    /// Bytes this process sends.
    pub sent: u64,
    /// Bytes this process receives.
    pub received: u64,
    /// Messages this process sends.
    pub messages: u64,
    /// Bytes every process together sends: the least the algorithm's order of combination
    /// needs (the plan's optimum), whatever process runs it.
    pub total: u64,
    /// Bytes the schedule's own transfers would move between processes if they were executed
    /// step by step (partial results as fp32, copies in the buffer's format).
    pub schedule: u64,
}

/// A message of the plan: in round `round`, to or from `peer`, `bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MsgSpec {
    pub(super) round: usize,
    pub(super) peer: usize,
    pub(super) bytes: usize,
}

/// Where an operand of a local evaluation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Src {
    /// This process's input of local rank index `i`.
    Input(u32),
    /// fp32 values in received message `msg`, starting at float `at` (the chunk's first element).
    Recv { msg: u32, at: usize },
}

/// A postfix program over local inputs and received partial results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Load(Src),
    Fold(Src),
    Merge,
}

/// Where a local evaluation's result goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Dest {
    /// fp32 partial result into send message `msg` at float `at`.
    Send { msg: u32, at: usize },
    /// The final value: encoded into local outputs (`(local index, element offset)`) and into
    /// send messages (`(msg, byte offset)`).
    Final { local: Vec<(u32, usize)>, remote: Vec<(u32, usize)> },
}

/// One part of an expression evaluated on this process over the elements `c0 .. c1`.
#[derive(Debug, Clone)]
pub(super) struct Part {
    pub(super) prog: Vec<Op>,
    pub(super) c0: usize,
    pub(super) c1: usize,
    pub(super) dest: Dest,
}

/// A final value received encoded: `len` codes at byte `at` of received message `msg`, copied to
/// local outputs `(local index, element offset)`.
#[derive(Debug, Clone)]
pub(super) struct Delivery {
    pub(super) msg: u32,
    pub(super) at: usize,
    pub(super) len: usize,
    pub(super) to: Vec<(u32, usize)>,
}

/// A byte copy of a data-movement plan.
#[derive(Debug, Clone, Copy)]
pub(super) enum From {
    Input { i: u32, at: usize },
    Recv { msg: u32, at: usize },
}

#[derive(Debug, Clone, Copy)]
pub(super) enum To {
    Output { i: u32, at: usize },
    Send { msg: u32, at: usize },
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub(super) from: From,
    pub(super) to: To,
    pub(super) len: usize,
}

/// What one process does in a collective spread over processes: which ranks it holds, the
/// messages of every round, and its evaluations.
#[derive(Debug, Clone)]
pub struct LocalPlan {
    /// The process.
    pub process: usize,
    /// Its ranks, ascending: the order of its inputs and outputs.
    pub ranks: Vec<usize>,
    /// Element count of each local rank's output (elements for a reduction, bytes for a
    /// data-movement collective).
    pub output_lens: Vec<usize>,
    /// Bytes moved.
    pub traffic: Traffic,
    pub(super) sends: Vec<MsgSpec>,
    pub(super) recvs: Vec<MsgSpec>,
    /// Reductions: evaluations per round, and the final values received.
    pub(super) parts: Vec<Vec<Part>>,
    pub(super) deliveries: Vec<Delivery>,
    pub(super) max_depth: usize,
    /// Data movement: copies before the exchange (to outputs or send messages) and after it.
    pub(super) before: Vec<Piece>,
    pub(super) after: Vec<Piece>,
}

/// Bytes of a partial result per element as it crosses between processes (fp32).
const PARTIAL_BYTES: u64 = 4;

/// Message sizes are kept in whole 4-byte words, so that fp32 partial results are aligned.
pub(super) fn words(bytes: usize) -> usize {
    bytes.div_ceil(4)
}

/// The message table every process builds identically: for each `(round, src, dst)`, its size.
#[derive(Default)]
struct Layout {
    sizes: BTreeMap<(usize, usize, usize), usize>,
}

impl Layout {
    /// Appends `bytes` (padded to whole words) to message `(round, src, dst)`; returns its byte
    /// offset.
    fn append(&mut self, round: usize, src: usize, dst: usize, bytes: usize) -> usize {
        let e = self.sizes.entry((round, src, dst)).or_insert(0);
        let at = *e;
        *e += words(bytes) * 4;
        at
    }

    fn total(&self) -> u64 {
        self.sizes.values().map(|&b| b as u64).sum()
    }
}

/// Indices of this process's send and receive messages, by `(round, peer)`.
struct MsgIndex {
    sends: Vec<MsgSpec>,
    recvs: Vec<MsgSpec>,
    send_of: BTreeMap<(usize, usize), u32>,
    recv_of: BTreeMap<(usize, usize), u32>,
}

impl MsgIndex {
    fn new(layout: &Layout, process: usize) -> MsgIndex {
        let mut ix = MsgIndex {
            sends: Vec::new(),
            recvs: Vec::new(),
            send_of: BTreeMap::new(),
            recv_of: BTreeMap::new(),
        };
        for (&(round, src, dst), &bytes) in &layout.sizes {
            if src == process && dst != process {
                ix.send_of.insert((round, dst), ix.sends.len() as u32);
                ix.sends.push(MsgSpec { round, peer: dst, bytes });
            } else if dst == process && src != process {
                ix.recv_of.insert((round, src), ix.recvs.len() as u32);
                ix.recvs.push(MsgSpec { round, peer: src, bytes });
            }
        }
        ix
    }

    fn send(&self, round: usize, peer: usize) -> Result<u32> {
        self.send_of
            .get(&(round, peer))
            .copied()
            .ok_or_else(|| internal("a send the layout does not have"))
    }

    fn recv(&self, round: usize, peer: usize) -> Result<u32> {
        self.recv_of
            .get(&(round, peer))
            .copied()
            .ok_or_else(|| internal("a receive the layout does not have"))
    }
}

fn check_placed(of_rank: &[u32], n: usize, procs: usize) -> Result<()> {
    if of_rank.len() != n || of_rank.iter().any(|&p| p as usize >= procs) {
        return Err(internal("a placement that does not fit the schedule"));
    }
    Ok(())
}

pub(super) fn internal(what: &str) -> Error {
    Error::value("schedule", format!("internal: distributed plan: {what}"))
}

/// One node of an expression tree, children first.
struct TreeNode {
    /// `None` for a leaf (then `rank` is its rank).
    kids: Option<[usize; 2]>,
    rank: u32,
}

/// The tree of identity `id`, in post-order (children before parents; the root last).
fn tree(sym: &Symbolic, id: u32) -> Vec<TreeNode> {
    let mut out: Vec<TreeNode> = Vec::new();
    // (identity, expanded?) ; results of finished children on `done`.
    let mut stack = vec![(id, false)];
    let mut done: Vec<usize> = Vec::new();
    while let Some((x, expanded)) = stack.pop() {
        if x & LEAF != 0 {
            out.push(TreeNode { kids: None, rank: x & !LEAF });
            done.push(out.len() - 1);
        } else if expanded {
            let b = done.pop().unwrap_or(0);
            let a = done.pop().unwrap_or(0);
            out.push(TreeNode { kids: Some([a, b]), rank: 0 });
            done.push(out.len() - 1);
        } else {
            let [a, b] = sym.nodes[x as usize];
            stack.push((x, true));
            stack.push((b, false));
            stack.push((a, false));
        }
    }
    out
}

const INF: u64 = u64::MAX / 4;

/// Where each node of `t` is computed (the fewest bytes between processes; see the module
/// doc), with ties broken towards the parent's process, then `prefer` for the root, then the
/// lowest process. `deliver_to[q]`: process `q` holds a receiver of the final value.
fn assign(
    t: &[TreeNode], of_rank: &[u32], procs: usize, deliver_to: &[bool], elem: u64, prefer: usize,
) -> (Vec<usize>, u64) {
    let m = t.len();
    let mut cost = vec![INF; m * procs];
    let mut best = vec![(INF, 0usize); m];
    for (i, nd) in t.iter().enumerate() {
        match nd.kids {
            None => cost[i * procs + of_rank[nd.rank as usize] as usize] = 0,
            Some([a, b]) => {
                for p in 0..procs {
                    let avail = |v: usize| cost[v * procs + p].min(best[v].0 + PARTIAL_BYTES);
                    cost[i * procs + p] = avail(a).saturating_add(avail(b));
                }
            }
        }
        for p in 0..procs {
            if cost[i * procs + p] < best[i].0 {
                best[i] = (cost[i * procs + p], p);
            }
        }
    }
    let root = m - 1;
    let total = |p: usize| {
        let sends = (0..procs).filter(|&q| q != p && deliver_to[q]).count() as u64;
        cost[root * procs + p].saturating_add(sends * elem)
    };
    let mut where_ = vec![0usize; m];
    let mut rp = prefer;
    for p in 0..procs {
        if total(p) < total(rp) || (total(p) == total(rp) && rp != prefer && p < rp) {
            rp = p;
        }
    }
    let bytes = total(rp);
    where_[root] = rp;
    for i in (0..m).rev() {
        if let Some(kids) = t[i].kids {
            let p = where_[i];
            for v in kids {
                where_[v] =
                    if cost[v * procs + p] <= best[v].0 + PARTIAL_BYTES { p } else { best[v].1 };
            }
        }
    }
    (where_, bytes)
}

/// Bytes the schedule's transfers move between processes when executed step by step: a
/// reducing phase's chunks as fp32 partial results, a copying phase's in the buffer's format.
fn schedule_bytes(s: &Schedule, of_rank: &[u32], w: usize, elem: usize) -> u64 {
    let g = s.fine_chunks();
    let mut total = 0u64;
    for phase in &s.phases {
        let per = if phase.reduce { PARTIAL_BYTES } else { elem as u64 };
        for step in 0..phase.repeat {
            for t in &phase.transfers {
                if of_rank[t.src as usize] == of_rank[t.dst as usize] {
                    continue;
                }
                t.sel.for_each(step, s.k, &s.perms, |f| {
                    total += (boundary(f + 1, g, w) - boundary(f, g, w)) as u64 * per;
                });
            }
        }
    }
    total
}

/// Compiles the part of tree `t` rooted at `root` that process `p` evaluates, into `prog`
/// (returns the stack depth it needs). `operand(v)` is the source of a node that is not
/// evaluated inside this part (a local leaf or a received value).
fn compile_part(
    t: &[TreeNode], where_: &[usize], root: usize, operand: &dyn Fn(usize) -> Result<Src>,
    prog: &mut Vec<Op>,
) -> Result<usize> {
    enum Work {
        Visit(usize),
        Fold(usize),
        Merge,
    }
    let p = where_[root];
    // A node evaluated inside this part: an internal node on this process (the root always).
    let inside = |v: usize| v == root || (t[v].kids.is_some() && where_[v] == p);
    let mut work = vec![Work::Visit(root)];
    let (mut depth, mut max_depth) = (0usize, 0usize);
    while let Some(w) = work.pop() {
        match w {
            Work::Visit(v) if !inside(v) => {
                prog.push(Op::Load(operand(v)?));
                depth += 1;
                max_depth = max_depth.max(depth);
            }
            Work::Visit(v) => {
                let [a, b] = t[v].kids.ok_or_else(|| internal("a part rooted at a leaf"))?;
                if !inside(b) {
                    work.push(Work::Fold(b));
                    work.push(Work::Visit(a));
                } else if !inside(a) {
                    work.push(Work::Fold(a));
                    work.push(Work::Visit(b));
                } else {
                    work.push(Work::Merge);
                    work.push(Work::Visit(b));
                    work.push(Work::Visit(a));
                }
            }
            Work::Fold(v) => prog.push(Op::Fold(operand(v)?)),
            Work::Merge => {
                prog.push(Op::Merge);
                depth -= 1;
            }
        }
    }
    Ok(max_depth)
}

/// The plan of process `process` for a reduction (all-reduce or reduce-scatter) of `w`
/// elements of `elem` bytes per rank, following schedule `s` over ranks placed by `of_rank`.
pub fn plan_reduce(
    s: &Schedule, of_rank: &[u32], procs: usize, process: usize, w: usize, elem: usize,
) -> Result<LocalPlan> {
    if !s.collective.reduces() {
        return Err(Error::value("collective", "plan_reduce plans all_reduce or reduce_scatter"));
    }
    let (n, k) = (s.n, s.k);
    check_placed(of_rank, n, procs)?;
    let sym = run_symbolic(s)?;
    let g = sym.g;
    let local_ix = local_index(of_rank);
    let ranks: Vec<usize> = (0..n).filter(|&r| of_rank[r] as usize == process).collect();
    let cancel = crate::cancel::current();

    // First pass (every process alike): the trees, their assignment, the rounds of their
    // parts and the message layout.
    struct Planned {
        f: usize,
        t: Vec<TreeNode>,
        where_: Vec<usize>,
        ready: Vec<usize>,
        /// Byte offset in its message of each node whose value crosses (or of the final value
        /// for each receiving process).
        at: Vec<usize>,
        finals: Vec<(usize, usize)>,
        receivers: Vec<(u32, usize)>,
    }
    let mut layout = Layout::default();
    let mut planned: Vec<Planned> = Vec::new();
    for f in 0..g {
        if f % 256 == 0 {
            cancel.check()?;
        }
        let (c0, c1) = (boundary(f, g, w), boundary(f + 1, g, w));
        if c0 == c1 {
            continue;
        }
        let len = c1 - c0;
        let receivers: Vec<usize> = match s.collective {
            Collective::AllReduce => (0..n).collect(),
            _ => vec![f / k],
        };
        // Receivers grouped by the identity they hold (one group in every schedule we build).
        let mut groups: Vec<(u32, Vec<(u32, usize)>)> = Vec::new();
        for r in receivers {
            let id = sym.at(r, f);
            let offset = match s.collective {
                Collective::AllReduce => c0,
                _ => c0 - boundary(r, n, w),
            };
            match groups.iter_mut().find(|(i, _)| *i == id) {
                Some((_, v)) => v.push((r as u32, offset)),
                None => groups.push((id, vec![(r as u32, offset)])),
            }
        }
        for (id, recv) in groups {
            if id == UNDEF || sym.leaves(id).len() != n {
                return Err(Error::value(
                    "schedule",
                    format!(
                        "internal: {} leaves an incomplete reduction of chunk {f}",
                        s.algorithm_name()
                    ),
                ));
            }
            let t = tree(&sym, id);
            let mut deliver_to = vec![false; procs];
            for &(r, _) in &recv {
                deliver_to[of_rank[r as usize] as usize] = true;
            }
            let owner = of_rank[(f / k).min(n - 1)] as usize;
            let (where_, _) = assign(&t, of_rank, procs, &deliver_to, elem as u64, owner);
            // Rounds: a node is ready when its operands are; a value computed on another
            // process arrives one round after it was computed.
            let mut ready = vec![0usize; t.len()];
            let mut at = vec![usize::MAX; t.len()];
            for i in 0..t.len() {
                if let Some(kids) = t[i].kids {
                    ready[i] = kids
                        .iter()
                        .map(|&v| ready[v] + usize::from(where_[v] != where_[i]))
                        .max()
                        .unwrap_or(0);
                    for v in kids {
                        if where_[v] != where_[i] {
                            at[v] = layout.append(
                                ready[v],
                                where_[v],
                                where_[i],
                                len * PARTIAL_BYTES as usize,
                            );
                        }
                    }
                }
            }
            let root = t.len() - 1;
            let rp = where_[root];
            let finals: Vec<(usize, usize)> = (0..procs)
                .filter(|&q| q != rp && deliver_to[q])
                .map(|q| (q, layout.append(ready[root], rp, q, len * elem)))
                .collect();
            planned.push(Planned { f, t, where_, ready, at, finals, receivers: recv });
        }
    }

    // Second pass: this process's parts and deliveries.
    let ix = MsgIndex::new(&layout, process);
    let rounds = planned.iter().map(|pl| pl.ready[pl.t.len() - 1] + 1).max().unwrap_or(0);
    let mut parts: Vec<Vec<Part>> = vec![Vec::new(); rounds];
    let mut deliveries = Vec::new();
    let mut max_depth = 1;
    for pl in &planned {
        let (c0, c1) = (boundary(pl.f, g, w), boundary(pl.f + 1, g, w));
        let t = &pl.t;
        let root = t.len() - 1;
        let local_receivers: Vec<(u32, usize)> = pl
            .receivers
            .iter()
            .filter(|(r, _)| of_rank[*r as usize] as usize == process)
            .map(|&(r, off)| (local_ix[r as usize], off))
            .collect();
        if pl.where_[root] != process && !local_receivers.is_empty() {
            let (_, at) = pl
                .finals
                .iter()
                .find(|(q, _)| *q == process)
                .copied()
                .ok_or_else(|| internal("a receiver without a delivery"))?;
            deliveries.push(Delivery {
                msg: ix.recv(pl.ready[root], pl.where_[root])?,
                at,
                len: c1 - c0,
                to: local_receivers.clone(),
            });
        }
        for i in 0..t.len() {
            // Part roots on this process: the root, and nodes whose value crosses to their
            // parent's process (a lone leaf included: its value is sent as fp32).
            let crosses = pl.at[i] != usize::MAX;
            if pl.where_[i] != process || !(i == root || crosses) {
                continue;
            }
            let operand = |v: usize| -> Result<Src> {
                if pl.where_[v] == process {
                    // A local leaf (internal local nodes are inside the part).
                    Ok(Src::Input(local_ix[t[v].rank as usize]))
                } else {
                    Ok(Src::Recv { msg: ix.recv(pl.ready[v], pl.where_[v])?, at: pl.at[v] / 4 })
                }
            };
            let mut prog = Vec::new();
            let depth = if t[i].kids.is_none() {
                prog.push(Op::Load(operand(i)?));
                1
            } else {
                compile_part(t, &pl.where_, i, &operand, &mut prog)?
            };
            max_depth = max_depth.max(depth);
            let dest = if i == root {
                let remote = pl
                    .finals
                    .iter()
                    .map(|&(q, at)| Ok((ix.send(pl.ready[root], q)?, at)))
                    .collect::<Result<Vec<_>>>()?;
                Dest::Final { local: local_receivers.clone(), remote }
            } else {
                // The parent's process: the one node whose kids include i.
                let parent = (i + 1..t.len())
                    .find(|&j| t[j].kids.is_some_and(|k| k.contains(&i)))
                    .ok_or_else(|| internal("a node without a parent"))?;
                Dest::Send { msg: ix.send(pl.ready[i], pl.where_[parent])?, at: pl.at[i] / 4 }
            };
            parts[pl.ready[i]].push(Part { prog, c0, c1, dest });
        }
    }
    let output_lens: Vec<usize> = output_lengths(s.collective, n, w);
    Ok(LocalPlan {
        process,
        output_lens: ranks.iter().map(|&r| output_lens[r]).collect(),
        traffic: traffic(&ix, rounds, layout.total(), s, of_rank, w, elem),
        ranks,
        sends: ix.sends,
        recvs: ix.recvs,
        parts,
        deliveries,
        max_depth,
        before: Vec::new(),
        after: Vec::new(),
    })
}

fn traffic(
    ix: &MsgIndex, rounds: usize, total: u64, s: &Schedule, of_rank: &[u32], w: usize, elem: usize,
) -> Traffic {
    let gathered = if s.collective == Collective::AllGather { w * s.n } else { w };
    Traffic {
        rounds,
        sent: ix.sends.iter().map(|m| m.bytes as u64).sum(),
        received: ix.recvs.iter().map(|m| m.bytes as u64).sum(),
        messages: ix.sends.len() as u64,
        total,
        schedule: schedule_bytes(s, of_rank, gathered, elem),
    }
}

/// `local_index[r]`: the position of rank `r` among its process's ranks.
fn local_index(of_rank: &[u32]) -> Vec<u32> {
    let mut count = BTreeMap::<u32, u32>::new();
    of_rank
        .iter()
        .map(|&p| {
            let c = count.entry(p).or_insert(0);
            *c += 1;
            *c - 1
        })
        .collect()
}

/// The plan of process `process` for a data-movement collective (all-gather, all-to-all,
/// send/recv) of `l` elements of `elem` bytes per rank; lengths and offsets in bytes.
pub fn plan_move(
    s: &Schedule, of_rank: &[u32], procs: usize, process: usize, l: usize, elem: usize,
) -> Result<LocalPlan> {
    let n = s.n;
    check_placed(of_rank, n, procs)?;
    let local_ix = local_index(of_rank);
    let ranks: Vec<usize> = (0..n).filter(|&r| of_rank[r] as usize == process).collect();
    // Every piece of every output, globally: (src rank, src byte offset, dst rank, dst byte
    // offset, bytes).
    let mut pieces: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
    match s.collective {
        Collective::AllGather => {
            let sym = run_symbolic(s)?;
            let (g, w) = (sym.g, n * l);
            for r in 0..n {
                for f in 0..g {
                    let id = sym.at(r, f);
                    if id == UNDEF || id & LEAF == 0 {
                        return Err(internal("a chip misses a gathered chunk"));
                    }
                    let src = (id & !LEAF) as usize;
                    let (c0, c1) = (boundary(f, g, w), boundary(f + 1, g, w));
                    if c0 < c1 {
                        pieces.push((src, (c0 - src * l) * elem, r, c0 * elem, (c1 - c0) * elem));
                    }
                }
            }
        }
        Collective::AllToAll | Collective::SendRecv => {
            let phase = s.phases.first().ok_or_else(|| internal("an empty schedule"))?;
            for t in &phase.transfers {
                let mut chunks = Vec::new();
                t.sel.for_each(0, s.k, &s.perms, |f| chunks.push(f));
                let j = chunks.first().copied().unwrap_or(0);
                let (src, dst) = (t.src as usize, t.dst as usize);
                if s.collective == Collective::SendRecv {
                    pieces.push((src, 0, dst, 0, l * elem));
                } else {
                    let (c0, c1) = (boundary(j, n, l), boundary(j + 1, n, l));
                    let len = c1 - c0;
                    pieces.push((src, c0 * elem, dst, src * len * elem, len * elem));
                }
            }
        }
        _ => {
            return Err(Error::value(
                "collective",
                "plan_move plans all_gather, all_to_all or send_recv",
            ))
        }
    }
    // A piece crossing to another process travels once per receiving process: deduplicated by
    // (source range, receiving process).
    let mut layout = Layout::default();
    let mut sent_at: BTreeMap<(usize, usize, usize, usize), usize> = BTreeMap::new();
    let mut routed: Vec<Option<usize>> = Vec::with_capacity(pieces.len());
    for &(src, so, dst, _, len) in &pieces {
        let (ps, pd) = (of_rank[src] as usize, of_rank[dst] as usize);
        if ps == pd || len == 0 {
            routed.push(None);
            continue;
        }
        let at =
            *sent_at.entry((src, so, len, pd)).or_insert_with(|| layout.append(0, ps, pd, len));
        routed.push(Some(at));
    }
    let ix = MsgIndex::new(&layout, process);
    let mut before = Vec::new();
    let mut after = Vec::new();
    let mut packed: BTreeMap<(usize, usize), ()> = BTreeMap::new();
    for (&(src, so, dst, d_at, len), at) in pieces.iter().zip(&routed) {
        let (ps, pd) = (of_rank[src] as usize, of_rank[dst] as usize);
        if len == 0 {
            continue;
        }
        match at {
            None if ps == process => before.push(Piece {
                from: From::Input { i: local_ix[src], at: so },
                to: To::Output { i: local_ix[dst], at: d_at },
                len,
            }),
            Some(at) if ps == process => {
                // Pack the piece once per receiving process.
                let first = packed.insert((pd, *at), ()).is_none();
                if first {
                    before.push(Piece {
                        from: From::Input { i: local_ix[src], at: so },
                        to: To::Send { msg: ix.send(0, pd)?, at: *at },
                        len,
                    });
                }
            }
            Some(at) if pd == process => after.push(Piece {
                from: From::Recv { msg: ix.recv(0, ps)?, at: *at },
                to: To::Output { i: local_ix[dst], at: d_at },
                len,
            }),
            _ => {}
        }
    }
    let output_lens = output_lengths(s.collective, n, l);
    let rounds = usize::from(!layout.sizes.is_empty());
    Ok(LocalPlan {
        process,
        output_lens: ranks.iter().map(|&r| output_lens[r] * elem).collect(),
        traffic: traffic(&ix, rounds, layout.total(), s, of_rank, l, elem),
        ranks,
        sends: ix.sends,
        recvs: ix.recvs,
        parts: Vec::new(),
        deliveries: Vec::new(),
        max_depth: 1,
        before,
        after,
    })
}

/// The plan for process `process` of a collective over `group` placed by `placement`: builds the
/// schedule (as [`build`](fn@super::super::build) does for one process) and plans this process's
/// part. `elem` is the element size in bytes; `l` the elements of one rank's input.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    group: &Group, placement: &Placement, process: usize, collective: Collective,
    algorithm: super::super::ops::Algorithm, elem: usize, l: usize, peers: Option<&[usize]>,
) -> Result<(Schedule, LocalPlan)> {
    if process >= placement.procs() {
        return Err(Error::value(
            "process",
            format!("process {process} does not exist; there are {}", placement.procs()),
        ));
    }
    let of_rank = placement.of_ranks(group)?;
    let size = super::super::size_bytes(collective, group.n(), l as u64, elem as u64);
    let sched = super::super::build(group, collective, algorithm, size as u64, peers)?;
    let p = if collective.reduces() {
        plan_reduce(&sched, &of_rank, placement.procs(), process, l, elem)?
    } else {
        plan_move(&sched, &of_rank, placement.procs(), process, l, elem)?
    };
    Ok((sched, p))
}
