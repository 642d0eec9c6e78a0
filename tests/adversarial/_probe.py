"""Runs probes in fresh interpreters with an address-space cap and a timeout.

``probe(code)`` runs one script; ``outcomes(calls)`` runs many small calls in one interpreter
and says, for each, ``"ok"``, the ``Trn2Error`` subclass it raised, or ``"BAD <type>: <msg>"``
for any other exception (a contract break). A call missing from the answer crashed the
interpreter (the test fails with its stderr).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

CAP = 8 << 30  # address space of a probe: far below what any refused call would need


def _child_setup() -> None:
    # A shell starts background jobs with SIGINT ignored; signal probes need the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def probe(
    code: str, *, env: dict | None = None, timeout: float = 60, cap: int = CAP
) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter capped at ``cap`` bytes of address space. A
    timeout raises ``subprocess.TimeoutExpired`` (the test fails: a hang)."""
    head = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))\n"
    return subprocess.run(
        [sys.executable, "-c", head + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=_child_setup,
    )


_RUNNER = """
import json, sys, traceback
import numpy as np, trn2core as t
from trn2core import Trn2Error

def fresh(out, *inputs):
    # Outputs never share memory with inputs (contract preamble).
    outs = out if isinstance(out, (list, tuple)) else [out]
    for o in outs:
        for i in inputs:
            if isinstance(o, np.ndarray) and np.shares_memory(o, i):
                raise AssertionError("the output shares memory with an input")
    return out

ns = {"np": np, "t": t, "fresh": fresh}
exec(SETUP, ns)
for name, code in CALLS:
    try:
        exec(code, ns)
        out = "ok"
    except Trn2Error as e:
        out = type(e).__name__
    except BaseException as e:  # noqa: BLE001 - anything else breaks the contract
        out = f"BAD {type(e).__name__}: {str(e)[:300]}"
    print(json.dumps([name, out]), flush=True)
"""


def outcomes(
    calls: dict[str, str],
    *,
    setup: str = "",
    env: dict | None = None,
    timeout: float = 120,
    cap: int = CAP,
) -> dict[str, str]:
    """Runs every call of ``calls`` (name -> code) in one capped interpreter, in order."""
    code = f"SETUP = {textwrap.dedent(setup)!r}\nCALLS = {list(calls.items())!r}\n" + _RUNNER
    r = probe(code, env=env, timeout=timeout, cap=cap)
    got = dict(json.loads(line) for line in r.stdout.splitlines() if line.startswith("["))
    missing = [n for n in calls if n not in got]
    assert not missing and r.returncode == 0, (
        f"the interpreter died (status {r.returncode}) at {missing[:1]}: {r.stderr[-2000:]}"
    )
    return got


def check_outcomes(calls: dict[str, str | tuple[str, str]], **kw) -> None:
    """``calls``: name -> (code, expected outcome: "ok", an error class name, or "any" for ok
    or any Trn2Error), or name -> code alone when the outcome expected is "ok". Fails listing
    every call whose outcome differs."""
    calls = {n: (c, "ok") if isinstance(c, str) else c for n, c in calls.items()}
    got = outcomes({n: c for n, (c, _) in calls.items()}, **kw)
    wrong = {
        n: (got[n], want)
        for n, (_, want) in calls.items()
        if not (got[n] == want or (want == "any" and not got[n].startswith("BAD")))
    }
    assert not wrong, wrong
