"""The guides (docs/*.md) from an installed package: ``trn2core docs [GUIDE]``.

The repository's docs/ is their one source; ``python/trn2core/docs`` is a symbolic link to it,
which pyproject.toml's ``[tool.maturin] include`` takes into every wheel and sdist as
``trn2core/docs/``. So every install path (``pip install .``, ``pip install git+...``, the
sdist, the wheel, an editable install) carries the same guides, with no copy step to forget.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import _validate
from .errors import Trn2ValueError

__all__ = ["directory", "names", "title", "read", "listing"]

_HERE = Path(__file__).resolve().parent


def shipped(link: str, marker: str, what: str) -> Path:
    """The package's directory ``link`` (a link into the repository, which every wheel and sdist
    carries as a directory), checked by its file ``marker``; ``FileNotFoundError`` naming
    ``what`` it holds when the installation lacks it."""
    found = _HERE / link
    if (found / marker).is_file():
        return found
    raise FileNotFoundError(
        f"no {what} in {found}: this installation of trn2core is incomplete (every wheel "
        "and sdist carries them); reinstall it"
    )


def directory() -> Path:
    """Where the guides are: the package's ``docs/`` (in a checkout, the link to docs/)."""
    return shipped("docs", "index.md", "guides")


def names() -> list[str]:
    """The guides' names, e.g. ``["architecture", ..., "numerics", ...]`` (index first)."""
    found = sorted(p.stem for p in directory().glob("*.md"))
    return ["index"] + [n for n in found if n != "index"]


def title(name: str) -> str:
    """The first heading of guide ``name``."""
    for line in read(name).splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            return m.group(1).strip()
    return name


def read(name: str) -> str:
    """The Markdown text of guide ``name`` (``"numerics"`` or ``"numerics.md"``)."""
    key = name.strip().removesuffix(".md") if isinstance(name, str) else name
    _validate.name(key, "guide", names(), cls=Trn2ValueError, what="guide")
    return (directory() / f"{key}.md").read_text(encoding="utf-8")


def listing() -> str:
    """One line per guide: its name and title, then how to print one."""
    ns = names()
    w = max(len(n) for n in ns)
    lines = [f"  {n:<{w}}  {title(n)}" for n in ns]
    return "\n".join(
        [f"The guides ({directory()}):", *lines, "", "Print one with `trn2core docs NAME`."]
    )
