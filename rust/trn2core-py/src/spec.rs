//! The hardware constants table, exposed read-only as `trn2core.spec`.

use pyo3::prelude::*;

/// One row of `trn2core::spec::ENTRIES`: `(name, value, unit, source, doc, status, tags, note)`.
type EntryRow = (
    &'static str,
    f64,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Vec<&'static str>,
    &'static str,
);

/// Every constant of `trn2core::spec`, with its status letter and the tags it cites.
#[pyfunction]
pub fn spec_entries() -> Vec<EntryRow> {
    trn2core::spec::ENTRIES
        .iter()
        .map(|e| {
            let (status, tags) = (e.status(), e.tags());
            (e.name, e.value, e.unit, e.source, e.doc, status, tags, e.note)
        })
        .collect()
}

/// Every source a tag names: `(tag, title, url, also, read)`.
#[pyfunction]
pub fn spec_sources(
) -> Vec<(&'static str, &'static str, &'static str, Vec<&'static str>, &'static str)> {
    trn2core::spec::SOURCES
        .iter()
        .map(|s| (s.tag, s.title, s.url, s.also.to_vec(), s.read))
        .collect()
}

/// The status letters: `(letter, name, meaning)`.
#[pyfunction]
pub fn spec_statuses() -> Vec<(&'static str, &'static str, &'static str)> {
    trn2core::spec::STATUSES.iter().map(|s| (s.letter, s.name, s.meaning)).collect()
}
