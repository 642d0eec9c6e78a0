"""Trainium2 hardware constants, read-only: ``trn2core.spec.pe_clock_hz`` and so on.

The values come from the Rust core's ``spec`` module, the project's one source of truth for
hardware numbers; each carries its unit and its source tag in ``docs/trn2_facts.md``
(``trn2core.spec.describe(name)``, ``trn2core.spec.entries()``). Nothing here can be assigned.
"""

from __future__ import annotations

import sys
import types
from typing import NamedTuple

from . import _core

__all__ = ["SpecEntry", "entries", "describe", "table"]

_FLOAT_UNITS = {"Hz", "B/s", "s", "TFLOPS", "FLOP/s", "ratio", "GB/s", "bits/s", "1/s"}


class SpecEntry(NamedTuple):
    """One hardware constant."""

    name: str
    value: float | int
    unit: str
    source: str
    doc: str


def _value(v: float, unit: str) -> float | int:
    return int(v) if unit not in _FLOAT_UNITS and float(v).is_integer() else v


_ENTRIES: tuple[SpecEntry, ...] = tuple(
    SpecEntry(n, _value(v, u), u, s, d) for (n, v, u, s, d) in _core.spec_entries()
)
_BY_NAME = {e.name: e for e in _ENTRIES}


def entries() -> tuple[SpecEntry, ...]:
    """Every constant, in the order of the Rust ``spec`` module."""
    return _ENTRIES


def describe(name: str) -> SpecEntry:
    """The entry of constant ``name`` (value, unit, source tag, one-line doc)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise AttributeError(f"trn2core.spec has no constant {name!r}") from None


def table() -> str:
    """All constants as a plain-text table."""
    w = max(len(e.name) for e in _ENTRIES)
    lines = [f"{'name':<{w}}  {'value':>16}  {'unit':<8}  source"]
    for e in _ENTRIES:
        lines.append(f"{e.name:<{w}}  {e.value!s:>16}  {e.unit:<8}  {e.source}")
    return "\n".join(lines)


globals().update({e.name: e.value for e in _ENTRIES})


class _ReadOnlyModule(types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"trn2core.spec is read-only (tried to set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"trn2core.spec is read-only (tried to delete {name!r})")

    def __dir__(self) -> list[str]:
        return sorted(list(__all__) + list(_BY_NAME))


sys.modules[__name__].__class__ = _ReadOnlyModule
