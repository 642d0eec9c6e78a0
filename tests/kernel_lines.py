"""Where a kernel's error should point: the line of a test kernel holding some text, and the
check that an error names that file:line (shared by the NKI pattern and spill tests)."""

from __future__ import annotations

import inspect


def line_of(fn, text: str) -> int:
    """The source line of ``fn`` that holds ``text`` (the first one)."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def at(info, fn, marker: str) -> None:
    """The error in ``info`` names the kernel's own file:line (the line holding ``marker``)."""
    where = f"{inspect.getsourcefile(inspect.unwrap(fn))}:{line_of(fn, marker)}:"
    assert str(info.value).startswith(where), (str(info.value), where)
