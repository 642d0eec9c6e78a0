"""The command line run in this process, as ``python -m trn2core ARGS`` runs it in a child.

A fresh interpreter per command costs about half a second (Python, numpy and the extension
import); the tests that check what a command prints or returns run it here instead. The tests
of the process itself (the entry point, Ctrl-C, a crash never reaching the user, the terminal)
keep their subprocesses: tests/test_package.py, tests/test_wheel.py, tests/test_interrupts.py,
tests/adversarial/test_cli.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``trn2core *args`` with ``env`` added to the environment (and NEURON_LOGICAL_NC_CONFIG
    removed unless given): its exit status, stdout and stderr, as a finished child's. The
    terminal is 80 columns, as for a child whose output is a pipe."""
    from trn2core import cli

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.pop("NEURON_LOGICAL_NC_CONFIG", None)
    os.environ.update({"COLUMNS": "80", "LINES": "24", **(env or {})})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(args))
            except SystemExit as e:  # argparse's usage errors, as `raise SystemExit(main())`
                if isinstance(e.code, str):
                    print(e.code, file=err)
                rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["trn2core", *args], rc, out.getvalue(), err.getvalue())
