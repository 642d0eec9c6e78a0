"""``neuronxcc.nki.language``, the legacy dialect: the same functions as
``trn2core.nki.language`` except ``affine_range``, which here promises independent iterations
(NKI 0.1: "``affine_range`` should be the default loop iterator choice, when there is no loop
carried dependency"; associative reductions such as matmul accumulation are allowed). trn2core
runs the iterations in order and reports any other read of an earlier iteration's writes as a
``LoopCarriedDependencyError`` at the reading line, instead of silently serialising the loop.
"""

from __future__ import annotations

import builtins

from . import language as _language
from ._runtime import STATE, Loop

globals().update({k: v for k, v in vars(_language).items() if not k.startswith("__")})


def affine_range(*args, **kwargs):
    """A loop whose iterations must be independent (see the module doc)."""
    rng = builtins.range(*args)
    core = STATE.core
    if core is None:
        return rng
    return Loop(core, rng)
