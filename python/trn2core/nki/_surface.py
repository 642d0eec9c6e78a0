"""The parts of NKI's documented API that trn2core does not emulate, importable all the same:
a kernel file that imports them loads, and only a *use* raises ``NotSupportedError`` naming the
API at the kernel's line (never an ``AttributeError`` or ``ImportError`` at import).

Also what the modules need that is not an instruction: ``nl.NKIObject`` (the base class of
configuration objects passed into kernels), the legacy ``neuronxcc.nki.compiler`` module (its
scheduling decorators are no-ops here; its ``sbuf``/``psum`` ``mod_alloc`` and ``alloc`` place
tensors, ``auto_alloc`` leaves them to the allocator) and
``nki.isa.constants``. The names follow the NKI API reference's module listings (nki,
nki.language, nki.isa, nki.collectives; neuronxcc.nki.compiler for the legacy dialect).
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np

from ..errors import Trn2Error, Trn2ValueError
from ._api import relocate
from ._index import NotSupportedError


class UnknownNameError(NotSupportedError, AttributeError):
    """A name an NKI module does not have (not in the API reference, or newer than trn2core):
    a ``NotSupportedError`` naming it at the kernel's line, and an ``AttributeError`` so that
    ``hasattr`` and ``from ... import`` behave as for any module."""


class Unsupported:
    """A documented NKI name trn2core does not emulate. Importing it works; calling it, taking
    an attribute or indexing it raises ``NotSupportedError`` naming it."""

    __slots__ = ("_qualname",)
    nki_unsupported = True

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def _refuse(self, how: str = "", cls: type = NotSupportedError) -> NotSupportedError:
        return relocate(
            cls(  # type: ignore[return-value]
                f"{self._qualname}{how} is not supported by trn2core (docs/nki.md lists the "
                "supported API)",
                arg=self._qualname,
            )
        )

    def __call__(self, *args, **kwargs):
        raise self._refuse()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        # Also an AttributeError: getattr(x, name, default) and hasattr behave.
        raise self._refuse(f".{name}", UnknownNameError)

    def __getitem__(self, key):
        raise self._refuse("[...]")

    def __repr__(self) -> str:
        return f"<{self._qualname}: not supported by trn2core>"


def module_getattr(module: str):
    """The ``__getattr__`` of an installed NKI module: unknown names raise
    ``UnknownNameError`` naming ``module.name``."""

    def __getattr__(name: str):  # noqa: N807 - the module protocol's name
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise relocate(
            UnknownNameError(
                f"{module}.{name} is not an NKI name trn2core knows (docs/nki.md lists the "
                "supported API)",
                arg=f"{module}.{name}",
            )
        )

    return __getattr__


def unsupported_names(module: str, names: tuple[str, ...]) -> dict[str, Unsupported]:
    return {n: Unsupported(f"{module}.{n}") for n in names}


def _is_field_value(name: str, v) -> bool:
    """A class attribute NKI takes as a field: a plain value (not a method, property, class or
    static method, nested class or dunder)."""
    return not (
        name.startswith("__")
        or callable(v)
        or isinstance(v, (property, classmethod, staticmethod, type))
    )


def _fields(cls: type) -> list[str]:
    """NKI's fields of a class: its annotated names over the MRO, then the names of its plain
    class attributes (``section_idx = None``: nki-library builds such classes by keyword)."""
    out: list[str] = []
    for c in reversed(cls.__mro__):
        if c is object or c is NKIObject:
            continue
        for name in inspect.get_annotations(c):
            if name not in out:
                out.append(name)
    for c in reversed(cls.__mro__):
        if c is object or c is NKIObject:
            continue
        for name, v in vars(c).items():
            if name not in out and _is_field_value(name, v):
                out.append(name)
    return out


def _nki_init(self, *args, **kwargs) -> None:
    """NKI's generated initializer (the NKI language guide, "Class Support"): each field by
    position or keyword, else its class default, else a dataclass ``default_factory``, else
    None; then ``__post_init__``."""
    cls = type(self)
    fields = _fields(cls)
    if len(args) > len(fields):
        raise Trn2ValueError(
            f"{cls.__name__}: {len(args)} positional values for {len(fields)} fields {fields}"
        )
    values = dict(zip(fields, args, strict=False))
    for k, v in kwargs.items():
        if k not in fields:
            raise Trn2ValueError(f"{cls.__name__}: no field {k!r} (fields: {fields})", arg=k)
        if k in values:
            raise Trn2ValueError(f"{cls.__name__}: field {k!r} given twice", arg=k)
        values[k] = v
    declared = getattr(cls, "__dataclass_fields__", {})
    for f in fields:
        if f in values:
            v = values[f]
        elif hasattr(cls, f):
            continue  # the class attribute is the default
        elif f in declared and declared[f].default_factory is not dataclasses.MISSING:
            v = declared[f].default_factory()
        else:
            v = None
        object.__setattr__(self, f, v)  # frozen dataclasses too
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


class NKIObject:
    """``nl.NKIObject``: the base class of configuration objects a kernel builds and passes
    around. As NKI's language guide has it, a subclass is built the same way with or without
    ``@dataclass``: unless its class body defines ``__init__``, NKI's initializer takes each
    field (its annotated names, then its plain class attributes) by position or keyword,
    defaulting to the class value or None, then calls ``__post_init__`` if it has one (the
    initializer is set on the subclass itself, so ``@dataclass`` keeps it)."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in vars(cls):
            cls.__init__ = _nki_init  # type: ignore[method-assign]

    def __init__(self, *args, **kwargs) -> None:
        _nki_init(self, *args, **kwargs)

    def __repr__(self) -> str:
        fields = _fields(type(self))
        inner = ", ".join(f"{f}={getattr(self, f, '?')!r}" for f in fields)
        return f"{type(self).__name__}({inner})"


# ----------------------------------------------------------------------------- nki.collectives
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_v",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_v",
    "collective_permute",
    "collective_permute_implicit",
    "collective_permute_implicit_reduce",
    "collective_permute_implicit_current_processing_rank_id",
    "rank_id",
    "ReplicaGroup",
)


# ----------------------------------------------------------------------------- compiler
def _decorator(name: str):
    def deco(fn=None, *args, **kwargs):
        # ``@skip_middle_end_transformations`` and ``@enable_stack_allocator(...)`` alike.
        if callable(fn) and not args and not kwargs:
            return fn
        return lambda f: f

    deco.__name__ = name
    deco.__doc__ = (
        f"``{name}``: a compiler directive; accepted and ignored (trn2core runs the "
        "instructions as written)."
    )
    return deco


def _count(v, arg: str, lo: int = 0) -> int:
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= lo:
        return int(v)
    raise Trn2ValueError(f"{arg}: expected an integer >= {lo}, got {v!r}", arg=arg)


def _counts(v, arg: str) -> tuple[int, ...]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        v = (v,)
    if not isinstance(v, (tuple, list)):
        raise Trn2ValueError(f"{arg}: expected a tuple of tile counts, got {v!r}", arg=arg)
    return tuple(_count(x, arg, 1) for x in v)


def _one_par_tile(num_par_tiles, space: str) -> None:
    if any(n != 1 for n in _counts(num_par_tiles, "num_par_tiles")):
        raise NotSupportedError(
            f"neuronxcc.nki.compiler.{space}.mod_alloc: num_par_tiles other than 1 (blocks "
            "on several partition ranges) is not emulated"
        )


class _Allocators:
    """``ncc.sbuf`` / ``ncc.psum``: the explicit allocators. ``mod_alloc`` places a tensor
    (its blocks modulo their physical tiles: ``_tensor.Placement``); ``alloc`` places each
    block by a function; ``auto_alloc`` leaves it to the allocator."""

    def __init__(self, space: str) -> None:
        self._space = space

    def alloc(self, func, *args, **kwargs):
        """Places each block where ``func(block, partitions, bytes)`` says (SBUF: ``(start
        partition, byte)``; PSUM: ``(bank, start partition, byte)``)."""
        from ._tensor import PSUM, SBUF, Placement

        if not callable(func) or args or kwargs:
            raise relocate(
                Trn2ValueError(
                    f"func: neuronxcc.nki.compiler.{self._space}.alloc takes one placement "
                    f"function, got {func!r}",
                    arg="func",
                )
            )
        buf = SBUF if self._space == "sbuf" else PSUM
        return Placement(buf, 0, 0, (), False, f"{self._space}.alloc", func)

    def auto_alloc(self, *args, **kwargs):
        """The compiler's own placement: the plain buffer."""
        from ._tensor import PSUM, SBUF

        return SBUF if self._space == "sbuf" else PSUM

    def mod_alloc(self, *args, **kwargs):
        try:
            return self._mod_alloc(*args, **kwargs)
        except Trn2Error as e:
            raise relocate(e) from None

    def _mod_alloc(
        self,
        *,
        base_addr=0,
        base_partition=0,
        num_par_tiles=(),
        num_free_tiles=(),
        base_bank=None,
        num_bank_tiles=(),
    ):
        from ._tensor import PSUM, SBUF, Placement

        part = _count(base_partition, "base_partition")
        _one_par_tile(num_par_tiles, self._space)
        if self._space == "sbuf":
            if base_bank is not None or num_bank_tiles:
                raise Trn2ValueError(
                    "base_bank: SBUF has no banks (psum.mod_alloc takes it)", arg="base_bank"
                )
            addr = _count(base_addr, "base_addr")
            tiles = _counts(num_free_tiles, "num_free_tiles")
            return Placement(SBUF, part, addr, tiles, False, "sbuf.mod_alloc")
        bank = _count(0 if base_bank is None else base_bank, "base_bank")
        if bank >= 8:
            raise Trn2ValueError(f"base_bank: PSUM has 8 banks (0..7), got {bank}", arg="base_bank")
        if any(n != 1 for n in _counts(num_free_tiles, "num_free_tiles")):
            raise NotSupportedError(
                "neuronxcc.nki.compiler.psum.mod_alloc: num_free_tiles other than 1 (several "
                "tiles inside a bank) is not emulated"
            )
        addr = bank * 2048 + _count(base_addr, "base_addr")
        tiles = _counts(num_bank_tiles, "num_bank_tiles")
        return Placement(PSUM, part, addr, tiles, True, "psum.mod_alloc")


class MultiBuffer:
    """``ncc.multi_buffer(n)``: a loop directive (``directives=`` of a range) asking the
    compiler for ``n`` buffers of the loop's tiles, so that iterations overlap. A scheduling
    hint: trn2core runs the iterations in order, as written."""

    __slots__ = ("buffers",)

    def __init__(self, buffers) -> None:
        self.buffers = _count(buffers, "buffers", 1)

    def __repr__(self) -> str:
        return f"multi_buffer({self.buffers})"


def compiler_namespace() -> dict:
    """``neuronxcc.nki.compiler``."""
    ns: dict = {
        n: _decorator(n)
        for n in ("skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc")
    }
    ns["multi_buffer"] = MultiBuffer
    ns["sbuf"] = _Allocators("sbuf")
    ns["psum"] = _Allocators("psum")
    ns.update(unsupported_names("neuronxcc.nki.compiler", COLLECTIVES))
    return ns
