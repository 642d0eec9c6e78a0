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
import inspect
import os
import sys
import textwrap
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


def user_frame():
    """The innermost frame outside trn2core (the kernel's own), or ``None``."""
    f = sys._getframe(1)
    while f is not None and _own(f.f_code.co_filename):
        f = f.f_back
    return f


def user_location() -> tuple[str, int]:
    """``(file, line)`` of the innermost caller outside trn2core (the kernel's own line)."""
    f = user_frame()
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


#: A keyword argument not given (the generated wrappers' default, see ``api``).
_MISSING = object()

#: ``api``'s wrapper, generated per function: ``{params}`` are the function's parameters as
#: keyword-only ones (all defaulting to ``_MISSING``), ``{bind}`` puts positional arguments in
#: them and ``{call}`` calls the function with them bound once (``{given}``: those given, for
#: the call as made). Its own names start with ``_``, which the parameters' do not.
_WRAPPER = """
def _wrapper(*_args, {params}**_kwargs):
    _core = _STATE.core
    if _core is not None:
        # Core.here, its common case inline (this runs for every call in a kernel): the
        # caller is the code the last call came from, at an offset seen before.
        _f = _getframe(1)
        if _f.f_code is _core.code and (_loc := _core.at.get(_f.f_lasti)) is not None:
            _core.loc = _loc
        else:
            _core.here(_f)
    try:
{bind}{call}        return _fn(*_args, **{given}_kwargs)
    except _Trn2Error as _e:
        raise _relocate(_e) from None
    except _PY_ERRORS as _e:
        raise _as_trn2(_fn, _e) from _e
"""


def _wrapper_source(params: list[inspect.Parameter], inline: str = "") -> str:
    """``_WRAPPER`` for a function of ``params``: the general ``*args, **kwargs`` forwarding
    alone unless they are all positional-or-keyword (and ``**kwargs``); then a call's
    arguments are bound once, here, when no two name the same parameter and none is missing
    (every other call, errors included, goes on as made). ``inline``: statements run on
    such a bound call before the function (its parameters by name, ``_MISSING`` for an
    omitted default): a hot path's common case in the wrapper's own frame, which returns
    when it has done the call's whole work and falls through to the function otherwise."""
    plain = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    rest = [p.kind for p in params if p.kind is not p.POSITIONAL_OR_KEYWORD]
    if (
        not plain
        or rest not in ([], [inspect.Parameter.VAR_KEYWORD])
        or any(p.name.startswith("_") for p in plain)
    ):
        return _WRAPPER.format(params="", bind="", call="", given="")
    names = [p.name for p in plain]
    bind = ["        _n = len(_args)\n        if _n == 0:\n            pass\n"]
    for n in range(1, len(names) + 1):
        free = " and ".join(f"{x} is _MISSING" for x in names[:n])
        bind.append(f"        elif _n == {n} and {free}:\n")
        bind.append(f"            {', '.join(names[:n])}, = _args\n            _args = ()\n")
    missing = [f"{p.name} is _MISSING" for p in plain if p.default is p.empty]
    args = [
        p.name if p.default is p.empty else f"(_d[{i}] if {p.name} is _MISSING else {p.name})"
        for i, p in enumerate(plain)
    ]
    cond = " or ".join(["_args", "_kwargs", *missing])
    body = "".join(
        f"            {line}\n" for line in textwrap.dedent(inline).strip("\n").splitlines()
    )
    call = f"        if not ({cond}):\n{body}            return _fn({', '.join(args)})\n"
    pairs = ", ".join(f"({x!r}, {x})" for x in names)
    return _WRAPPER.format(
        params="".join(f"{x}=_MISSING, " for x in names),
        bind="".join(bind),
        call=call,
        given=f"{{_k: _v for _k, _v in ({pairs}) if _v is not _MISSING}}, **",
    )


def api(fn=None, *, inline: str = "", names: dict | None = None):
    """Wraps a public function (see the module doc). The wrapper is generated for ``fn``'s
    parameters (``_WRAPPER``): a keyword call binds its arguments once, not into a dict that
    a second call unpacks again. ``inline`` (with the globals it uses, ``names``): see
    ``_wrapper_source``; ``@api(inline=..., names=...)`` for such a function."""
    if fn is None:
        return functools.partial(api, inline=inline, names=names)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature: the general forwarding
        params = []
    scope = {
        **(names or {}),
        "_fn": fn,
        "_d": [p.default for p in params],
        "_getframe": _getframe,
        "_MISSING": _MISSING,
        "_STATE": STATE,
        "_Trn2Error": Trn2Error,
        "_relocate": relocate,
        "_PY_ERRORS": _PY_ERRORS,
        "_as_trn2": _as_trn2,
    }
    # Named as this file's (trn2core's own code, which error locations skip: ``_own``).
    where = f"{os.path.abspath(__file__)} (the api wrapper of {fn.__qualname__})"
    exec(compile(_wrapper_source(params, inline), where, "exec"), scope)  # noqa: S102 - our template
    return functools.wraps(fn)(scope["_wrapper"])
