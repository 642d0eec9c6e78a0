"""No import cycles, in the Rust core or in the Python facade (docs/architecture.md, "Rules").

Rust: an edge A -> B when file A `use`s an item of module file B (paths resolved to the
deepest existing file). A module's own `mod.rs` (or `lib.rs`) is left out of the graph: it
declares and re-exports its children, and children may use the items their parent defines;
what must not happen is two files that are not parent and child depending on each other.

Python: an edge A -> B when module A imports B, at module level or inside a function (a lazy
import is still a dependency).

Exits 1 and prints every cycle it finds. Run by `make lint` and by tests/test_architecture.py.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUST_SRC = ROOT / "rust" / "trn2core" / "src"
PY_PKG = ROOT / "python" / "trn2core"


def _rust_module_of(path: Path) -> list[str]:
    rel = path.relative_to(RUST_SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def _rust_file_of(parts: list[str]) -> Path | None:
    """The deepest file that defines a prefix of ``parts``."""
    for n in range(len(parts), 0, -1):
        for cand in (
            RUST_SRC.joinpath(*parts[:n]).with_suffix(".rs"),
            RUST_SRC.joinpath(*parts[:n], "mod.rs"),
        ):
            if cand.exists():
                return cand
    return None


_USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
_INLINE = re.compile(r"\b((?:crate|super)(?:::\w+)+)")


def _expand(tree: str) -> list[str]:
    """``a::{b, c::{d}}`` -> ``a::b``, ``a::c::d`` (enough of Rust's use-trees for this)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [re.sub(r"as\w+$", "", tree)]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    items.append(cur)
    return [p for it in items if it for p in _expand(prefix + it)]


def rust_graph() -> dict[Path, set[Path]]:
    graph: dict[Path, set[Path]] = {}
    for f in sorted(RUST_SRC.rglob("*.rs")):
        if f.name in ("mod.rs", "lib.rs"):
            continue
        here = _rust_module_of(f)
        deps: set[Path] = set()
        text = re.sub(r"//[^\n]*", "", f.read_text())
        # test modules may use anything of their parent
        text = text.split("#[cfg(test)]\nmod tests")[0]
        paths = [p for tree in _USE.findall(text) for p in _expand(tree)]
        # paths written inline in code (`super::crc32c::shift_tables(..)`) count too
        paths += _INLINE.findall(_USE.sub("", text))
        for path in paths:
            segs = [s for s in path.split("::") if s and s != "self"]
            if not segs:
                continue
            if segs[0] == "crate":
                target = segs[1:]
            elif segs[0] == "super":
                base = here[:-1]
                segs = segs[1:]
                while segs and segs[0] == "super":
                    base, segs = base[:-1], segs[1:]
                target = base + segs
            else:
                continue  # std, other crates, items in scope
            t = _rust_file_of(target)
            if t is not None and t != f and t.name not in ("mod.rs", "lib.rs"):
                deps.add(t)
        graph[f] = deps
    return graph


def python_graph() -> dict[str, set[str]]:
    mods = {p.stem for p in PY_PKG.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for p in sorted(PY_PKG.glob("*.py")):
        if p.stem == "__init__":
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
        graph[p.stem] = {d for d in deps if d in mods and d not in ("__init__", p.stem)}
    return graph


def cycles(graph: dict) -> list[list]:
    """Every strongly connected component with more than one node (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    out: list[list] = []
    counter = [0]

    def visit(v) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp, key=str))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    bad = False
    for comp in cycles(rust_graph()):
        bad = True
        print("Rust import cycle:", " <-> ".join(str(p.relative_to(ROOT)) for p in comp))
    for comp in cycles(python_graph()):
        bad = True
        print("Python import cycle:", " <-> ".join(comp))
    if not bad:
        print("no import cycles")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
