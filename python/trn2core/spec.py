"""Trainium2 hardware constants, read-only: ``trn2core.spec.pe_clock_hz`` and so on.

The values come from the Rust core's ``spec`` module, the project's one source of truth for
hardware numbers. Each carries its unit, the tags of its sources and a status letter:
``describe(name)`` gives all of them, ``source(tag)`` the title and address of a source
(``sources()`` lists every one, as docs/sources.md does), ``statuses()`` what D, I and C mean,
and ``format_value`` writes a value for people (``2.9 TB/s``, ``24 GiB``). Nothing here can be
assigned.
"""

from __future__ import annotations

import re
import sys
import types
from typing import NamedTuple

from . import _core, _validate
from .errors import Trn2ValueError

__all__ = [
    "SpecEntry",
    "Source",
    "Status",
    "entries",
    "describe",
    "source",
    "sources",
    "statuses",
    "format_value",
    "table",
    "sources_table",
]

_FLOAT_UNITS = {"Hz", "B/s", "s", "TFLOPS", "FLOP/s", "ratio", "fraction", "bit/s"}


class Source(NamedTuple):
    """A document or repository the hardware numbers cite."""

    tag: str
    title: str
    url: str
    also: tuple[str, ...]
    read: str


class Status(NamedTuple):
    """What a status letter (D, I, C) says about a value."""

    letter: str
    name: str
    meaning: str


class SpecEntry(NamedTuple):
    """One hardware constant: its value and unit, where it comes from, and what it is."""

    name: str
    value: float | int
    unit: str
    source: str
    doc: str
    status: str
    tags: tuple[str, ...]
    #: The rest of the constant's doc comment in ``spec.rs``, as one paragraph: for status C
    #: every value the sources give and why this one was chosen; for I how it was derived
    #: (empty when the one-line ``doc`` says it all).
    note: str = ""

    @property
    def sources(self) -> tuple[Source, ...]:
        """The sources of ``tags``, with their titles and addresses."""
        return tuple(_SOURCES[t] for t in self.tags)

    @property
    def text(self) -> str:
        """The value for people, e.g. ``"2.9 TB/s"``."""
        return format_value(self.value, self.unit)


def _value(v: float, unit: str) -> float | int:
    return int(v) if unit not in _FLOAT_UNITS and float(v).is_integer() else v


def _note(text: str) -> str:
    """A doc comment's note as plain text: one paragraph, without Markdown's emphasis and
    code marks, and ``[`CONSTANT`]`` links written as the constant's Python name."""
    text = re.sub(r"\[`([A-Z][A-Z0-9_]*)`\]", lambda m: m.group(1).lower(), text)
    return " ".join(text.replace("**", "").replace("`", "").split())


_ENTRIES: tuple[SpecEntry, ...] = tuple(
    SpecEntry(n, _value(v, u), u, s, d, st, tuple(tags), _note(note))
    for (n, v, u, s, d, st, tags, note) in _core.spec_entries()
)
_BY_NAME = {e.name: e for e in _ENTRIES}
_SOURCES = {
    t: Source(t, title, url, tuple(also), read)
    for (t, title, url, also, read) in _core.spec_sources()
}
_STATUSES = tuple(Status(*s) for s in _core.spec_statuses())


def entries() -> tuple[SpecEntry, ...]:
    """Every constant, in the order of the Rust ``spec`` module."""
    return _ENTRIES


def describe(name: str) -> SpecEntry:
    """The entry of constant ``name``: value, unit, source tags and status, one-line doc
    (``AttributeError`` for an unknown name, like any missing module attribute;
    ``Trn2ValueError`` for a name that is not a string)."""
    if not isinstance(name, str):
        raise Trn2ValueError(f"name: expected the name of a constant, got {_validate._show(name)}")
    try:
        return _BY_NAME[name]
    except KeyError:
        raise AttributeError(f"trn2core.spec has no constant {name!r}") from None


def sources() -> tuple[Source, ...]:
    """Every source a tag names, ``S1``..``S35`` then ``P`` (the list of docs/sources.md)."""
    return tuple(_SOURCES.values())


def source(tag: str) -> Source:
    """The source of ``tag`` (``"S3"`` or ``"[S3]"``): its title, address and the version read."""
    key = tag.strip().removeprefix("[").removesuffix("]") if isinstance(tag, str) else tag
    _validate.name(key, "tag", _SOURCES, cls=Trn2ValueError, what="source tag")
    return _SOURCES[key]


def statuses() -> tuple[Status, ...]:
    """The status letters D, I and C and what each means (the legend of every doc)."""
    return _STATUSES


# (unit, [(scale, prefix) from large to small], unit written after the prefix)
_DECIMAL = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
_SUBUNIT = [(1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"), (1e-12, "p")]
_SCALED = {
    "Hz": (_DECIMAL, "Hz"),
    "B/s": (_DECIMAL, "B/s"),
    "bit/s": (_DECIMAL, "bit/s"),
    "FLOP/s": ([(1e12, "T"), (1e9, "G"), (1.0, "")], "FLOPS"),
    "s": (_SUBUNIT, "s"),
}
_WORDS = {
    "cycles": "cycles",
    "elements": "elements",
    "elements/cycle": "elements/cycle",
    "FLOP": "FLOP",
    "TFLOPS": "TFLOPS",
    "bit": "bits",
}


def _num(x: float) -> str:
    """At most 4 significant digits, no trailing zeros, thousands separated: ``1,299``."""
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    s = f"{x:.4g}"
    return f"{int(s):,}" if s.lstrip("-").isdigit() else s


def _bytes(n: int) -> str:
    for k, prefix in ((4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if n and n % 1024**k == 0:
            return f"{n // 1024**k:,} {prefix}B"
    for k, prefix in ((4, "T"), (3, "G"), (2, "M"), (1, "k")):
        if n and n % 1000**k == 0:
            return f"{n // 1000**k:,} {prefix}B"
    return f"{n:,} B"


def format_value(value: float, unit: str) -> str:
    """``value`` in ``unit`` written for people: ``2.9 TB/s``, ``24 GiB``, ``2.4 GHz``,
    ``78.64 TFLOPS``, ``1.3 µs``, ``16``. Byte sizes use binary prefixes when exact (KiB,
    MiB, GiB), else decimal ones when exact (``1 MB``), else the count (``212,984 B``); rates
    and times use decimal prefixes and at most 4 significant digits."""
    if unit == "B" and float(value).is_integer():
        return _bytes(int(value))
    if unit in _SCALED and value:
        scales, name = _SCALED[unit]
        scale, prefix = next(((s, p) for s, p in scales if abs(value) >= s * 0.9995), scales[-1])
        return f"{_num(value / scale)} {prefix}{name}"
    if unit == "fraction":
        return f"{_num(value * 100)}%"
    if unit == "ratio":
        return f"{_num(value)}x"
    if unit in _WORDS:
        return f"{_num(value)} {_WORDS[unit]}"
    if unit in ("count", "dimensionless", ""):
        return _num(value)
    return f"{_num(value)} {unit}"


def table() -> str:
    """All constants as a plain-text table: name, value for people, source tags and status."""
    rows = [(e.name, e.text, e.source) for e in _ENTRIES]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{'name':<{w0}}  {'value':>{w1}}  source", f"{'-' * w0}  {'-' * w1}  ------"]
    lines += [f"{n:<{w0}}  {v:>{w1}}  {s}" for n, v, s in rows]
    lines.append("")
    lines += [f"{s.letter} = {s.name}: {s.meaning}" for s in _STATUSES]
    lines.append(
        "Sources: `trn2core spec --sources` (and docs/sources.md) give each tag's "
        "title and address."
    )
    return "\n".join(lines)


def sources_table(tags: list[str] | None = None) -> str:
    """The sources (all, or those of ``tags``) with their titles, addresses and version read."""
    chosen = [source(t) for t in tags] if tags else list(_SOURCES.values())
    lines = []
    for s in chosen:
        lines.append(f"[{s.tag}] {s.title}")
        lines.append(f"      {s.url or '(no public address)'}")
        lines += [f"      also {u}" for u in s.also]
        lines.append(f"      read: {s.read}")
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
