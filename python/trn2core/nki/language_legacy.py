"""``neuronxcc.nki.language``, the legacy dialect: the same functions as
``trn2core.nki.language`` except ``affine_range``, which here promises independent iterations
(NKI 0.1: "``affine_range`` should be the default loop iterator choice, when there is no loop
carried dependency"; associative reductions such as matmul accumulation are allowed). trn2core
runs the iterations in order and reports any other read of an earlier iteration's writes as a
``LoopCarriedDependencyError`` at the reading line, instead of silently serialising the loop.
"""

from __future__ import annotations

import builtins

from ..errors import Trn2ValueError
from . import language as _language
from ._api import relocate
from ._runtime import STATE, Loop

globals().update({k: v for k, v in vars(_language).items() if not k.startswith("__")})


def affine_range(*args, precise_schedule=False, **kwargs):
    """A loop whose iterations must be independent (see the module doc). With
    ``precise_schedule=True`` (not in NKI's documentation; nki-samples' contributed
    ``pipelined_attention`` pipelines its stages by hand with it, each iteration reading what
    the one before wrote) the iterations keep their order, as ``sequential_range``'s do, and
    are not checked."""
    rng = builtins.range(*args)
    core = STATE.core
    if core is None or precise_schedule is True:
        return rng
    if precise_schedule is not False:
        raise relocate(
            Trn2ValueError(
                f"precise_schedule: expected True or False, got {precise_schedule!r}",
                arg="precise_schedule",
            )
        )
    return Loop(core, rng)
