"""Import redirection: after ``install()``, ``import nki``, ``nki.language``, ``nki.isa``,
``nki.jit`` and the legacy ``neuronxcc.nki`` (``.language``, ``.isa``, ``.typing``) resolve to
trn2core's implementation through a meta-path finder placed first on ``sys.meta_path``;
``uninstall()`` removes the finder and every module it created from ``sys.modules``. Nothing is
downloaded and none of AWS's code is involved.

The modules handed out are fresh module objects whose namespace is copied from trn2core's
(``trn2core.nki.language`` and so on), so importing them never renames or alters trn2core's own
modules; a kernel file keeps working after ``uninstall()`` with the modules it imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types

import numpy as np

from . import _collectives, _kernel, _ops, _surface, isa, isa_legacy, language, language_legacy
from ._index import IndexExpr
from ._runtime import KernelError, LoopCarriedDependencyError
from ._tensor import NkiTensor

_LOCK = threading.Lock()


class _CallableModule(types.ModuleType):
    """``nki.jit`` as a module that is also the decorator (``import nki.jit`` must not break
    ``@nki.jit``)."""

    def __call__(self, *args, **kwargs):
        return self.jit(*args, **kwargs)


def _public(mod) -> dict:
    return {k: v for k, v in vars(mod).items() if not k.startswith("__")}


class _Typing:
    """``neuronxcc.nki.typing``: ``nt.tensor[shape, dtype]`` annotations (no checks)."""

    class _Ann:
        def __class_getitem__(cls, item):
            return cls

    tensor = _Ann
    mutable_tensor = _Ann
    scalar = _Ann


def _namespaces() -> dict[str, tuple[dict, bool, type]]:
    """Module name -> (namespace, is a package, module class)."""
    common_top = {
        "tensor": NkiTensor,
        "KernelError": KernelError,
        "LoopCarriedDependencyError": LoopCarriedDependencyError,
        "simulate": _kernel.simulate,
        # ``nki.dtype`` annotates dtype arguments; NKI's dtypes are numpy dtypes here.
        "dtype": np.dtype,
    }
    legacy_top = {
        "jit": _kernel.jit_legacy,
        "simulate_kernel": _kernel.simulate_kernel,
        "baremetal": _kernel.baremetal,
        "benchmark": _kernel.benchmark,
        "profile": _kernel.profile,
    }
    typing_ns = {k: getattr(_Typing, k) for k in ("tensor", "mutable_tensor", "scalar")}
    constants = {
        c.__name__: c
        for c in (
            _ops.engine,
            _ops.reduce_cmd,
            _ops.dge_mode,
            _ops.oob_mode,
            _ops.matmul_perf_mode,
            _ops.nc_version,
            _ops.dma_engine,
        )
    }
    collectives = {
        **_surface.unsupported_names("nki.collectives", _surface.COLLECTIVES),
        "rank_id": _collectives.rank_id,
        "ReplicaGroup": _collectives.ReplicaGroup,
        **{
            n: getattr(_collectives, n)
            for n in (
                "all_gather",
                "all_reduce",
                "reduce_scatter",
                "all_to_all",
                "collective_permute",
                "collective_permute_implicit",
                "collective_permute_implicit_reduce",
                "all_gather_v",
                "all_to_all_v",
            )
        },
        "collective_permute_implicit_current_processing_rank_id": (
            _collectives.collective_permute_implicit_current_processing_rank_id
        ),
    }
    compiler = {**_surface.compiler_namespace(), "no_reorder": language.no_reorder}
    dims = {"VNC": language.nc}  # ``kernel[VNC(2)]``: a grid axis over two physical cores

    def dialect(package: str, top: dict, language, isa) -> dict:
        """The modules both dialects have: the package (``top`` besides the common names), its
        language, its isa with the constants, and typing."""
        return {
            package: ({**common_top, **top}, True, types.ModuleType),
            f"{package}.language": (_public(language), True, types.ModuleType),
            # ``sizeinbytes(dtype)``: nki-samples' reference rmsnorm_quant sizes its scales so.
            f"{package}.language.constants": (
                {"sizeinbytes": language._sizeinbytes},
                False,
                types.ModuleType,
            ),
            f"{package}.isa": (_public(isa), True, types.ModuleType),
            f"{package}.isa.constants": (constants, False, types.ModuleType),
            f"{package}.typing": (typing_ns, False, types.ModuleType),
        }

    return {
        **dialect("nki", {"jit": _kernel.jit, "Kernel": _kernel.Kernel}, language, isa),
        "nki.collectives": (collectives, False, types.ModuleType),
        "nki.jit": ({"jit": _kernel.jit}, False, _CallableModule),
        "neuronxcc": ({}, True, types.ModuleType),
        "neuronxcc.nki.compiler": (compiler, True, types.ModuleType),
        "neuronxcc.nki.compiler.backends": ({}, True, types.ModuleType),
        "neuronxcc.nki.compiler.backends.neuron": ({}, True, types.ModuleType),
        "neuronxcc.nki.compiler.backends.neuron.dimensions": (dims, False, types.ModuleType),
        # The compiler's index-expression type (nki-samples' reference tile helpers annotate
        # loop indices with it): ours.
        "neuronxcc.nki.compiler.backends.neuron.indexing": (
            {"TileIndex": IndexExpr},
            False,
            types.ModuleType,
        ),
        # The compiler's own tile class: nki-samples' reference helpers import it unused.
        "neuronxcc.nki.compiler.backends.neuron.tensor": (
            _surface.unsupported_names(
                "neuronxcc.nki.compiler.backends.neuron.tensor", ("local_tile",)
            ),
            False,
            types.ModuleType,
        ),
        **dialect("neuronxcc.nki", legacy_top, language_legacy, isa_legacy),
    }


def _unsupported_in(ns: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in ns.items():
        if not isinstance(v, type) and getattr(v, "nki_unsupported", False) is True:
            out.append(prefix + k)
        elif isinstance(v, _surface._Allocators):
            out += _unsupported_in(vars(v), f"{k}.")
    return sorted(out)


def unsupported_api() -> dict[str, list[str]]:
    """Module -> the documented names it has that trn2core does not emulate (importable;
    ``NotSupportedError`` on use). docs/nki.md shows this table (``unsupported_markdown``)."""
    out = {}
    for name, (ns, _, _) in _namespaces().items():
        names = _unsupported_in(ns)
        if names:
            out[name] = names
    return out


def unsupported_markdown() -> str:
    """The table of ``unsupported_api()`` as docs/nki.md has it (a test keeps them equal)."""
    rows = [
        "| module | not emulated: importable, `NotSupportedError` naming it on use |",
        "|---|---|",
    ]
    for mod, names in unsupported_api().items():
        rows.append(f"| `{mod}` | " + ", ".join(f"`{n}`" for n in names) + " |")
    return "\n".join(rows)


class _Loader(importlib.abc.Loader):
    def __init__(self, finder: _Finder) -> None:
        self.finder = finder

    def create_module(self, spec):
        ns, _, cls = self.finder.namespaces[spec.name]
        mod = cls(spec.name)
        return mod

    def exec_module(self, module) -> None:
        name = module.__name__
        ns, is_pkg, _ = self.finder.namespaces[name]
        module.__dict__.update(ns)
        module.__getattr__ = _surface.module_getattr(name)  # type: ignore[method-assign]
        module.__doc__ = f"{name}: trn2core's emulation (trn2core.nki)"
        self.finder.created.add(name)
        if is_pkg:
            # As NKI's packages do, a package imports its submodules (``nki.language.x`` and
            # ``nki.compiler.sbuf`` work after ``import nki`` / ``from neuronxcc import nki``).
            for child in self.finder.namespaces:
                parent, _, last = child.rpartition(".")
                if parent == name and last not in ns:  # not ``nki.jit``: the decorator stays
                    importlib.import_module(child)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.namespaces = _namespaces()
        self.created: set[str] = set()
        self.loader = _Loader(self)

    def find_spec(self, fullname, path=None, target=None):
        entry = self.namespaces.get(fullname)
        if entry is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=entry[1])


_FINDER: list[_Finder] = []


class _Installed:
    """What ``install()`` returns: as a context manager, ``uninstall()`` on exit (when this
    call installed the hook)."""

    def __init__(self, fresh: bool) -> None:
        self.fresh = fresh

    def __enter__(self) -> _Installed:
        return self

    def __exit__(self, *exc) -> None:
        if self.fresh:
            uninstall()

    def __repr__(self) -> str:
        return "<trn2core.nki import hook installed>"


def install() -> _Installed:
    """Makes ``import nki`` (and the legacy ``neuronxcc.nki``) resolve to trn2core. Modules of
    those names already imported (for example AWS's own package) are set aside until
    ``uninstall()``. Also a context manager: ``with trn2core.nki.install(): ...``."""
    with _LOCK:
        if _FINDER:
            return _Installed(False)
        f = _Finder()
        f.saved = {
            k: sys.modules.pop(k)
            for k in list(sys.modules)  # type: ignore[attr-defined]
            if k in f.namespaces
        }
        sys.meta_path.insert(0, f)
        _FINDER.append(f)
        return _Installed(True)


def uninstall() -> None:
    """Removes the finder and every module it created; restores modules set aside."""
    with _LOCK:
        if not _FINDER:
            return
        f = _FINDER.pop()
        if f in sys.meta_path:
            sys.meta_path.remove(f)
        for name in list(sys.modules):
            mod = sys.modules[name]
            if name in f.created and isinstance(getattr(mod, "__loader__", None), _Loader):
                del sys.modules[name]
        sys.modules.update(getattr(f, "saved", {}))


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return bool(_FINDER)
