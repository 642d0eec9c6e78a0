"""``python -m trn2core.nki SCRIPT [ARGS...]``: runs an unmodified script that imports ``nki``
or ``neuronxcc.nki`` with trn2core's emulation installed (``install()``), as ``__main__``
with ``sys.argv = [SCRIPT, *ARGS]``: its kernels run on the emulated Trainium2 NeuronCore.
``NEURON_PLATFORM_TARGET_OVERRIDE`` other than ``trn2``/``gen3`` is refused (trn2core
emulates Trainium2 only)."""

from __future__ import annotations

import os
import runpy
import sys

from ._finder import install
from ._kernel import check_target


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    script = argv[0]
    if not os.path.isfile(script):
        print(f"python -m trn2core.nki: {script}: no such file", file=sys.stderr)
        return 2
    try:
        check_target()
    except Exception as e:  # noqa: BLE001 - printed for the shell
        print(f"python -m trn2core.nki: {e}", file=sys.stderr)
        return 2
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    with install():
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
