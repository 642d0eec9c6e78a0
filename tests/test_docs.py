"""Every ```python block in README.md and docs/*.md runs, in a fresh namespace, from a temporary
directory (a block may write files such as traces). A block that should not run must use another
fence language (```text, ```sh)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)


def _blocks():
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(path, line, m.group(1), id=f"{path.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_the_docs_have_runnable_examples():
    assert len(BLOCKS) >= 5
    assert any(p.name == "README.md" for p, _, _ in (b.values for b in BLOCKS))


@pytest.mark.parametrize("path,line,code", BLOCKS)
def test_doc_block_runs(path, line, code, tmp_path, capsys):
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, f"{path.name}:{line}", "exec"), {"__name__": "__doc_example__"})
    finally:
        os.chdir(old)
