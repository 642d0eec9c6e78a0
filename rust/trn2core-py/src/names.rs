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
    d.set_item("sparsity_patterns", Pattern::ALL.iter().map(|p| p.name()).collect::<Vec<_>>())?;
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
    Format::ALIASES.iter().map(|(a, f)| (*a, f.name())).collect()
}

/// One instruction table argument: `(name, kind, required, default)` (`default` a bool, an
/// integer, a name, or `None`).
pub type ArgRow = (&'static str, &'static str, bool, Option<Py<PyAny>>);

/// The result of an instruction's value-returning form: `(kind, detail, dtype)` (`("like",
/// input)`, `("columns", n)` or `("own", "")`; `dtype` `None`: the first input's).
pub type OutRow = (&'static str, String, Option<&'static str>);

/// `[(opcode, engines, default engine, arguments, summary, result)]`: the core's instruction table
/// (`trn2core::machine::isa::table::TABLE`), in opcode order.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn instruction_table(
    py: Python<'_>,
) -> PyResult<
    Vec<(&'static str, Vec<&'static str>, Option<&'static str>, Vec<ArgRow>, &'static str, OutRow)>,
> {
    use trn2core::machine::isa::table::{ArgDefault, TABLE};
    TABLE
        .iter()
        .map(|row| {
            let args = row
                .args
                .iter()
                .map(|a| {
                    let d: Option<Py<PyAny>> = match a.default {
                        ArgDefault::Required | ArgDefault::Absent => None,
                        ArgDefault::Bool(b) => {
                            Some(b.into_pyobject(py)?.to_owned().into_any().unbind())
                        }
                        ArgDefault::Int(i) => Some(i.into_pyobject(py)?.into_any().unbind()),
                        ArgDefault::Name(s) => Some(s.into_pyobject(py)?.into_any().unbind()),
                    };
                    Ok((a.name, a.kind.name(), a.default == ArgDefault::Required, d))
                })
                .collect::<PyResult<Vec<_>>>()?;
            Ok((
                row.op.name(),
                row.engines.iter().map(|e| e.name()).collect(),
                row.default_engine.map(|e| e.name()),
                args,
                row.summary,
                {
                    let (kind, detail) = row.out.describe();
                    (kind, detail, row.out_dtype.map(|d| d.name()))
                },
            ))
        })
        .collect()
}
