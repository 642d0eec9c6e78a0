//! Whole models on Trainium2: a transformer's layers as ops, a
//! parallel layout, a memory plan, and the time of a step composed from the project's own
//! per-op models (GEMMs, DMA/HBM, in-graph collectives; docs/workload.md).
//!
//! - [`model`]: the model description (a Hugging Face `config.json`, or a preset).
//! - [`kernels`]: the attention and rmsnorm kernels a step's attention and norms run, timed
//!   on the machine (cached per shape).
//! - [`inference`]: prefill (time to first token) and decode (time per output token).
//! - [`search`]: parallel layouts ranked by an objective.
//! - [`training`]: one training step (TP x PP x DP x EP, 1F1B, ZeRO-1, recomputation).

pub mod inference;
pub mod kernels;
pub mod model;
pub mod search;
pub mod training;

pub use inference::{
    decode, memory, prefill, runtime_reserve, Layout, Machine, MemoryItem, MemoryPlan, OpTime,
    Parts, Serving, StepReport,
};
pub use model::{AttentionKind, ConfigValue, Model, Moe, PRESETS};
pub use search::{search, Candidate, Objective, SearchResult, SearchSpace};
pub use training::{schedule_1f1b, train_step, Recompute, ScheduleSlice, TrainLayout, TrainReport};

/// The argument an error names (tests).
#[cfg(test)]
pub(crate) fn arg_of(e: &crate::Error) -> Option<&str> {
    match e {
        crate::Error::Value { arg, .. } | crate::Error::Capacity { arg, .. } => Some(arg.as_str()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

/// The model a call names: the preset `name` when `config` is `None`, else the model of the
/// config's fields (named `name`, or as the config names itself when `name` is empty).
pub fn resolve_model(name: &str, config: Option<&[(String, ConfigValue)]>) -> crate::Result<Model> {
    match config {
        None => Model::preset(name),
        Some(fields) => Model::from_config(name, fields),
    }
}
