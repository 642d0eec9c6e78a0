"""The exception tree of trn2core (contract: one base class, ``Trn2Error``).

Every message names the offending argument, the value seen and the limit. The Rust core raises
these through the binding crate, which maps its one ``Error`` enum onto them; a Rust panic
arrives as ``InternalError``, never as an abort.
"""

from __future__ import annotations

__all__ = [
    "Trn2Error",
    "ShapeError",
    "FormatError",
    "SparsityError",
    "CorruptDataError",
    "CapacityError",
    "Trn2ValueError",
    "InternalError",
]


class Trn2Error(Exception):
    """Base class of every error trn2core raises on purpose.

    ``arg``: the argument it names (as the caller spelled it), and ``rule``: the documented rule
    broken (an engine rule such as ``"matmul_memory"``, ``"sbuf_capacity"``,
    ``"uninitialized_read"``), when the core reports one; ``None`` otherwise."""

    arg: str | None = None
    rule: str | None = None

    def __init__(self, *args: object, arg: str | None = None, rule: str | None = None) -> None:
        super().__init__(*args)
        if arg is not None:
            self.arg = arg
        if rule is not None:
            self.rule = rule


class ShapeError(Trn2Error, ValueError):
    """An array has the wrong shape, size or layout for the operation."""


class FormatError(Trn2Error, ValueError):
    """An unknown or disallowed number format, dtype or rounding mode."""


class SparsityError(Trn2Error, ValueError):
    """A tensor does not follow the requested N:M sparsity pattern."""


class CorruptDataError(Trn2Error, ValueError):
    """A compressed stream is truncated or altered."""


class CapacityError(Trn2Error, MemoryError):
    """A request exceeds a hardware capacity or what the host can allocate."""


class Trn2ValueError(Trn2Error, ValueError):
    """A value is out of its allowed range (random bits, counts, seeds, ...)."""


class InternalError(Trn2Error, RuntimeError):
    """A bug inside trn2core (a Rust panic caught at the binding boundary). Please report it."""
