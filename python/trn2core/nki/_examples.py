"""The example kernels (examples/nki/*.py) and loading any kernel file with the import hook.

The repository's examples/nki/ is their one source; ``python/trn2core/nki_examples`` is a
symbolic link to it, which pyproject.toml's ``[tool.maturin] include`` takes into every wheel and
sdist, so ``trn2core demo`` finds them however trn2core was installed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .._guides import shipped
from ..errors import Trn2ValueError
from ._finder import install


def directory() -> Path:
    """Where the example kernels are: the package's ``nki_examples/`` (in a checkout, the link
    to examples/nki/)."""
    return shipped("nki_examples", "matmul.py", "example kernels")


def load_file(path, name: str | None = None):
    """Imports a kernel file (written for AWS's NKI) with the import hook in effect; the hook
    is removed afterwards unless it was installed before."""
    p = Path(path)
    if not p.is_file():
        raise Trn2ValueError(f"FILE: no such kernel file {str(p)!r}")
    modname = name or f"nki_kernels_{p.stem}"
    spec = importlib.util.spec_from_file_location(modname, p)
    if spec is None or spec.loader is None:
        raise Trn2ValueError(f"FILE: {str(p)!r} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    with install():
        sys.modules[modname] = mod
        try:
            spec.loader.exec_module(mod)
        finally:
            sys.modules.pop(modname, None)
    return mod


def load(name: str):
    """Example ``name`` (``"matmul"``, ``"rmsnorm"``, ...) as a module."""
    return load_file(directory() / f"{name}.py", f"trn2core_nki_example_{name}")
