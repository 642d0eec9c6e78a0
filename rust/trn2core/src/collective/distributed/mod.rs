//! A collective whose ranks are spread over several processes (MPI, in the Python facade), with
//! the same bits as in one process.
//!
//! # How
//!
//! Every process builds the same [`Schedule`](super::schedule::Schedule) and runs it symbolically
//! ([`run_symbolic`](super::run_symbolic)), as
//! the single-process model does: what every rank ends with is one expression per fine chunk,
//! whose grouping is the algorithm's order of combination. A [`Placement`] says which process
//! holds each chip. For each distinct final expression, the plan chooses where each of its
//! combinations is computed so that the fewest bytes cross between processes (an exact
//! dynamic programme over the expression tree: a leaf is where its chip is; a partial result
//! crosses as fp32, 4 bytes per element; the final value crosses encoded in the buffer's format,
//! once to every other process that holds a receiving rank). Connected parts of the tree on one
//! process are evaluated in one pass, like the single-process evaluation; a part that needs a
//! value computed elsewhere waits for the round in which it arrives. So the plan is a few
//! *rounds*: evaluate what is ready, then exchange the round's messages (one per pair of
//! processes that have anything to say to each other), over a [`Transport`].
//!
//! Bits: every combination is the same fp32 operation on the same two fp32 operands as in
//! [`execute_reduce`](super::execute_reduce) (the operators are commutative bit for bit; only the
//! grouping matters, and it is the tree's), partial results travel as their exact fp32 bits, and
//! the final value is encoded once, by the process that computes it. So every rank gets the
//! bits of the single-process run, whatever the placement.
//!
//! Data-movement collectives (all-gather, all-to-all, send/recv) need one round: each piece of a
//! rank's output that comes from a chip of another process crosses once per receiving process.
//!
//! Every process computes the whole plan (it is small: one tree per fine chunk) and keeps only
//! its own part, so the message layouts agree without any negotiation.
//!
//! The plan ([`plan`](fn@plan), [`plan_reduce`], [`plan_move`]: who computes what, and the
//! messages of every round) is in `plan.rs`; running it ([`execute_reduce_local`],
//! [`execute_move_local`], over a [`Transport`]) is in `execute.rs`.

mod execute;
mod plan;

pub use execute::{
    execute_move_local, execute_reduce_local, Alone, Message, MessageMut, Transport,
};
pub use plan::{plan, plan_move, plan_reduce, LocalPlan, Placement, Traffic};
