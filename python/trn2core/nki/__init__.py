"""Run NKI (Neuron Kernel Interface) kernels on the emulated Trainium2 NeuronCore (contract
section 8, docs/nki.md): the outputs bit for bit as far as the ISA is published, the
engine-parallel timeline, and clear errors where the hardware would fail.

```python
import trn2core.nki
trn2core.nki.install()                # `import nki`, `neuronxcc.nki` now resolve here
import my_kernels                     # a file written for AWS's NKI, unmodified
out = my_kernels.matmul_kernel(a, b)  # runs on the emulator, returns numpy arrays
res = trn2core.nki.run(my_kernels.matmul_kernel, a, b)   # .outputs, .report
print(res.report)                     # busy time per engine, bottleneck, ...
```

``install()``/``uninstall()`` (or ``with trn2core.nki.install():``) add and remove the import
hook; ``trn2core.nki.jit``, ``language`` (``nl``) and ``isa`` (``nisa``) can also be
used directly. Errors raised inside a kernel are ``trn2core.Trn2Error`` subclasses whose message
starts with the kernel's ``file:line``.
"""

from __future__ import annotations

from . import isa, isa_legacy, language, language_legacy
from ._api import UninitializedReadError
from ._finder import install, installed, uninstall
from ._index import NotSupportedError
from ._kernel import Kernel, RunResult, jit, jit_legacy, run, simulate, simulate_kernel
from ._ranks import PerRank
from ._report import NkiReport
from ._runtime import KernelError, LoopCarriedDependencyError
from ._tensor import NkiTensor, OutOfBoundsError, PartitionDimError

__all__ = [
    "Kernel",
    "KernelError",
    "LoopCarriedDependencyError",
    "NkiReport",
    "NkiTensor",
    "NotSupportedError",
    "OutOfBoundsError",
    "PartitionDimError",
    "PerRank",
    "RunResult",
    "UninitializedReadError",
    "install",
    "installed",
    "isa",
    "isa_legacy",
    "jit",
    "jit_legacy",
    "language",
    "language_legacy",
    "run",
    "simulate",
    "simulate_kernel",
    "uninstall",
]
