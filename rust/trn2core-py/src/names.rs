//! Every list of names users pass as strings, from the one definition of each in the core
//! (`named_enum!`): Python builds its tuples (`trn2core.FORMATS`, `ROUNDING_MODES`, ...) from
//! this, never from literals of its own.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use trn2core::collective::{Algorithm, Collective, ReduceOp};
use trn2core::dma::cost::Place;
use trn2core::dma::Codec;
use trn2core::engine::PerfMode;
use trn2core::machine::{ActFunc, AluOp, Dtype as MachineDtype, Engine, Opcode, ReduceCmd};
use trn2core::memory::Space;
use trn2core::numerics::{Format, Rounding};
use trn2core::sparsity::{Dtype, Pattern};

/// `{list name: tuple of names}`, each in the order the API lists them.
#[pyfunction]
pub fn names(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("formats", Format::NAMES.to_vec())?;
    d.set_item("rounding_modes", Rounding::NAMES.to_vec())?;
    d.set_item("perf_modes", PerfMode::NAMES.to_vec())?;
    d.set_item(
        "sparsity_patterns",
        Pattern::ALL.iter().map(|p| p.name()).collect::<Vec<_>>(),
    )?;
    d.set_item("sparsity_dtypes", Dtype::NAMES.to_vec())?;
    d.set_item("codecs", Codec::NAMES.to_vec())?;
    d.set_item("memories", Space::NAMES.to_vec())?;
    d.set_item("dma_places", Place::NAMES.to_vec())?;
    d.set_item("collectives", Collective::NAMES.to_vec())?;
    d.set_item("algorithms", Algorithm::NAMES.to_vec())?;
    d.set_item("reduce_ops", ReduceOp::NAMES.to_vec())?;
    d.set_item("machine_dtypes", MachineDtype::NAMES.to_vec())?;
    d.set_item("alu_ops", AluOp::NAMES.to_vec())?;
    d.set_item("activation_functions", ActFunc::NAMES.to_vec())?;
    d.set_item("engines", Engine::NAMES.to_vec())?;
    d.set_item("opcodes", Opcode::NAMES.to_vec())?;
    d.set_item("reduce_cmds", ReduceCmd::NAMES.to_vec())?;
    d.set_item("model_presets", trn2core::workload::PRESETS.to_vec())?;
    Ok(d)
}

/// `[(name, numpy dtype, bits, kind, is a format, is a machine dtype)]`: the core's one table of
/// element types (`trn2core::dtype::ELEMENT_TYPES`), in its order.
#[pyfunction]
pub fn element_types() -> Vec<(&'static str, &'static str, u32, &'static str, bool, bool)> {
    trn2core::dtype::ELEMENT_TYPES
        .iter()
        .map(|t| {
            let (f, m) = (t.format.is_some(), t.machine.is_some());
            (t.name, t.numpy, t.bits, t.kind.name(), f, m)
        })
        .collect()
}

/// `[(alias, format name)]`: the other names users write for a format (numpy / ml_dtypes /
/// JAX / PyTorch spellings), from [`Format::ALIASES`].
#[pyfunction]
pub fn format_aliases() -> Vec<(&'static str, &'static str)> {
    Format::ALIASES
        .iter()
        .map(|(a, f)| (*a, f.name()))
        .collect()
}
