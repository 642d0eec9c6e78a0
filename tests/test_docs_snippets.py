"""Every Python block of README.md and docs/getting-started.md that shows what it prints (the
block, then a line saying "prints", then a ```text block) prints exactly that: the printed text
is compared line by line with what the code writes to stdout (trailing spaces ignored), so a
number shown with one decimal must be the one the code prints with one decimal; runs of
blanks count as one."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]

# A python block, then at most one short paragraph that says "prints", then a text block.
SHOWN = re.compile(
    r"^```python[ \t]*\n(?P<code>.*?)^```[ \t]*\n"
    r"\n?(?P<say>[^`\n]*\bprints\b[^`\n]*)\n\n?"
    r"^```text[ \t]*\n(?P<out>.*?)^```",
    re.S | re.M,
)


def shown_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, code, printed text) for each python block followed by what it prints."""
    out = []
    for m in SHOWN.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((line, m.group("code"), m.group("out")))
    return out


def _cases():
    for page in PAGES:
        for line, code, shown in shown_blocks(page.read_text(encoding="utf-8")):
            yield pytest.param(page, line, code, shown, id=f"{page.relative_to(ROOT)}:{line}")


CASES = list(_cases())


def _lines(text: str) -> list[str]:
    """The lines, each with its runs of spaces and tabs made one space (a table's alignment
    and a tab are not the numbers)."""
    return [" ".join(ln.split()) for ln in text.strip("\n").splitlines()]


def test_the_pages_show_output():
    pages = {p.name for p, *_ in (c.values for c in CASES)}
    assert pages == {"README.md", "getting-started.md"}
    assert len(CASES) >= 4


def test_the_pattern_finds_a_shown_block_and_its_output():
    page = "```python\nprint(1 + 1)\n```\n\nprints\n\n```text\n2\n```\n"
    assert shown_blocks(page) == [(1, "print(1 + 1)\n", "2\n")]


@pytest.mark.parametrize("page,line,code,shown", CASES)
def test_block_prints_what_the_page_shows(page, line, code, shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # The documented defaults: no LNC or stochastic-rounding seed from the caller's shell.
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    monkeypatch.delenv("NEURON_RT_STOCHASTIC_ROUNDING_SEED", raising=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"{page.name}:{line}", "exec"), {"__name__": "__doc_example__"})
    assert _lines(buf.getvalue()) == _lines(shown), f"{page.name}:{line} prints other text"
    assert os.getcwd() == str(tmp_path)
