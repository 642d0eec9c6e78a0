"""Runs a command with transparent huge pages refused to it and to every process it starts.

`make test` (its test-python and test-rust targets) runs pytest and the Rust tests through this:
`python3 tools/no_thp.py CMD ARGS...` sets Linux's PR_SET_THP_DISABLE, which children inherit
across fork and exec, then execs CMD. The machine's memories and NumPy's large arrays ask for
huge pages (`MADV_HUGEPAGE`); a test makes thousands of short-lived machines and touches a few
rows of each, and the kernel zeroed a whole 2 MiB page for every row an instruction touched:
`clear_page` was 42% of tests/test_machine.py's CPU, and about a third of the suite's system
time (docs/benchmarks.md, "The test loop"). The advice is only advice: what is computed, and
every check, is the same with it refused. Elsewhere than Linux, or if the call is refused, CMD
runs unchanged.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_THP_DISABLE = 41  # <linux/prctl.h>


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: no_thp.py CMD [ARGS...]")
    if sys.platform == "linux":
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # advice for speed only: run the command as it is
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
