//! The hardware constants table, exposed read-only as `trn2core.spec`.

use pyo3::prelude::*;

/// Every constant of `trn2core::spec` as `(name, value, unit, source, doc)`.
#[pyfunction]
pub fn spec_entries() -> Vec<(&'static str, f64, &'static str, &'static str, &'static str)> {
    trn2core::spec::ENTRIES
        .iter()
        .map(|e| (e.name, e.value, e.unit, e.source, e.doc))
        .collect()
}
