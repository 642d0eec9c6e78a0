"""Where errors point: the kernel's own ``file:line``.

``api`` wraps every public ``nl``/``nisa`` function and tensor method: a ``Trn2Error`` raised
inside gets the innermost caller outside trn2core in front of its message (same class, so
``except CapacityError`` still works), and that line is stamped on the instructions the call
issues (``Core.here``; each instruction takes it to the machine: ``Machine.issue_at``): the
report's busy time per line, the trace's ``line``, and the lines of loop-carried reads.
``STATE.core`` is the core the running kernel program issues to.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from sys import _getframe

from ..errors import CapacityError, Trn2Error, Trn2ValueError

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: The example kernels shipped inside the package (a link to examples/nki/ in a checkout):
#: user code for error locations, not trn2core's own frames.
_EXAMPLES = tuple(
    {
        os.path.join(_PKG, "nki_examples") + os.sep,
        os.path.realpath(os.path.join(_PKG, "nki_examples")) + os.sep,
    }
)


def _own(filename: str) -> bool:
    """Whether a frame of ``filename`` is trn2core's own code (skipped when locating errors)."""
    return filename.startswith(_PKG) and not filename.startswith(_EXAMPLES)


class _State(threading.local):
    """The core the running kernel program issues to, per thread: each thread runs its own
    launches on its own cores (a process-wide core made concurrent launches issue to each
    other's machines, issue 28)."""

    def __init__(self) -> None:
        self.core = None


STATE = _State()


def user_location() -> tuple[str, int]:
    """``(file, line)`` of the innermost caller outside trn2core (the kernel's own line)."""
    f = sys._getframe(1)
    while f is not None and _own(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


class UninitializedReadError(Trn2ValueError):
    """An instruction reads memory no instruction (or input) wrote."""


def _classified(e: Trn2Error) -> tuple[type, str, str | None]:
    """The class, message and rule an error is reported with, from the rule the core set on it
    (``e.rule``): capacity and never-written errors name their rule in the message (and the
    never-written one gets its own subclass)."""
    msg, rule = str(e), e.rule
    if isinstance(e, CapacityError):
        # A capacity error inside a kernel is the on-chip memory's (the machine names which).
        rule = rule or "sbuf_capacity"
        return type(e), f"{msg} [rule {rule}]", rule
    if rule == "uninitialized_read":
        msg = msg.replace(
            'create the core with uninitialized="nan"',
            'run the kernel with trn2core.nki.run(..., uninitialized="nan")',
        )
        return UninitializedReadError, f"{msg} [rule uninitialized_read]", rule
    return type(e), msg, rule


def relocate(e: Trn2Error, loc: tuple[str, int] | None = None) -> Trn2Error:
    """The same error class (or a subclass) with the kernel's ``file:line`` in front of the
    message; ``nki_location`` holds ``(file, line)``."""
    if getattr(e, "nki_location", None) is not None:
        return e
    loc = loc or user_location()
    cls, msg, rule = _classified(e)
    new = cls(f"{loc[0]}:{loc[1]}: {msg}")
    new.nki_location = loc  # type: ignore[attr-defined]
    new.arg, new.rule = e.arg, rule
    return new


class KernelArgumentError(Trn2ValueError):
    """An ``nl``/``nisa`` call got an argument of the wrong kind (a string for a number, ...)
    that no specific check caught: Python's own TypeError/ValueError/IndexError/KeyError/
    OSError, as the kernel's error at its line."""


#: Python errors a bad argument raises deep inside an ``nl``/``nisa`` call.
_PY_ERRORS = (TypeError, ValueError, IndexError, KeyError, OSError, AttributeError)


def _as_trn2(fn, e: Exception) -> Trn2Error:
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "call"))
    err = KernelArgumentError(f"{name}: {type(e).__name__}: {e} (check its arguments)")
    return relocate(err)


def api(fn):
    """Wraps a public function (see the module doc)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        core = STATE.core
        if core is not None:
            # Core.here, its common case inline (this runs for every call in a kernel): the
            # caller is the code the last call came from, at an offset seen before.
            f = _getframe(1)
            if f.f_code is core.code and f.f_lasti in core.at:
                core.loc = core.at[f.f_lasti]
            else:
                core.here(f)
        try:
            return fn(*args, **kwargs)
        except Trn2Error as e:
            raise relocate(e) from None
        except _PY_ERRORS as e:
            raise _as_trn2(fn, e) from e

    return wrapper
