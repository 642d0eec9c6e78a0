"""One Trainium2 chip and its Logical NeuronCores (contract section 5).

A chip has 8 physical NeuronCore-v3 on two dies (cores 0-3 and 4-7) and four HBM stacks, each
shared by an adjacent pair of cores. A Logical NeuronCore (LNC) groups ``lnc`` adjacent
physical cores: LNC=1 is every core on its own, LNC=2 (the Trn2 default) the pairs sharing an
HBM stack, LNC=4 a whole die. AWS documents LNC 1 and 2 for Trn2; 4 is a trn2core extension of
the same idea. A logical core has ``lnc`` times one core's tensor engine, SBUF and HBM
bandwidth share; ``trn2core.gemm(a, b, core=lc)`` splits the work over its physical cores
(the bits do not depend on the split, the time does).
"""

from __future__ import annotations

import functools
import os
import threading

from . import _core, _validate, spec
from .dtypes import format_name
from .engine import PERF_MODES, NeuronCore
from .errors import Trn2ValueError

__all__ = ["Chip", "LogicalCore", "LNC_VALUES", "default_lnc"]

#: Logical NeuronCore sizes trn2core accepts (AWS documents 1 and 2).
LNC_VALUES = (1, 2, 4)

_CORES_PER_CHIP = spec.cores_per_chip


#: Largest chip index (rank) a Chip takes: beyond any machine (the largest UltraCluster has
#: 4096 x 64 chips), but a label, so only absurd values are refused.
MAX_CHIP_INDEX = 2**62 - 1

#: Serialises the first use of a chip's cached properties across threads (see ``_cached``).
_CACHE_LOCK = threading.RLock()


def _cached(f):
    """``functools.cached_property`` computed once even when threads race for it: two threads
    asking for ``chip.physical_cores`` at once must get the same NeuronCore objects (each holds
    its PSUM), which Python 3.12's ``cached_property`` (no lock) does not promise."""

    def once(self):
        with _CACHE_LOCK:
            if f.__name__ in self.__dict__:
                return self.__dict__[f.__name__]
            return f(self)

    once.__name__ = f.__name__
    once.__doc__ = f.__doc__
    return functools.cached_property(once)


def default_lnc() -> int:
    """The Logical NeuronCore size when none is given: ``NEURON_LOGICAL_NC_CONFIG`` from the
    environment (as Neuron's tools read it: 1 or 2, and trn2core's 4), else Trn2's default, 2
    (``spec.lnc_default``). ``Trn2ValueError`` naming the variable for any other value. Read
    by ``Chip``, ``Instance``, ``UltraServer``, ``UltraCluster`` and every command of the
    CLI; ``gemm``/``estimate_gemm`` without ``core`` or ``lnc`` keep the contract's one
    physical NeuronCore (docs/api.md)."""
    env = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
    if env is None or env.strip() == "":
        return int(spec.lnc_default)
    if env.strip() not in {str(v) for v in LNC_VALUES}:
        raise Trn2ValueError(
            f"NEURON_LOGICAL_NC_CONFIG: got {env!r}; Trainium2 takes 1 or 2 (and trn2core "
            "also 4, a whole die)"
        )
    return int(env)


def _check_lnc(lnc) -> int:
    if lnc is None:
        return default_lnc()
    lnc = _validate.integer(lnc, "lnc", lo=min(LNC_VALUES), hi=max(LNC_VALUES))
    if lnc not in LNC_VALUES:
        raise Trn2ValueError(
            f"lnc: got {lnc}; a Logical NeuronCore groups 1, 2 or 4 physical cores (AWS "
            "documents 1 and 2, default 2; 4 is a trn2core extension)"
        )
    return lnc


class LogicalCore:
    """``lnc`` adjacent physical NeuronCores of one chip, used as one core."""

    def __init__(self, chip: Chip, index: int) -> None:
        if not isinstance(chip, Chip):
            raise Trn2ValueError(
                f"chip: expected a trn2core.Chip, got {_validate._show(chip)} (logical cores "
                "come from chip.cores)"
            )
        index = _validate.integer(index, "index", lo=0, hi=_CORES_PER_CHIP // chip.lnc - 1)
        self._chip = chip
        self._index = index
        self._members = tuple(_core.logical_core_members(chip.lnc, index))
        self._info = _core.LogicalCoreInfo(chip.lnc)

    @property
    def chip(self) -> Chip:
        return self._chip

    @property
    def index(self) -> int:
        """Index of the logical core on its chip (0 .. 8 // lnc)."""
        return self._index

    @property
    def lnc(self) -> int:
        return self._chip.lnc

    @property
    def physical_cores(self) -> tuple[NeuronCore, ...]:
        """The adjacent physical cores it groups (the chip's own NeuronCore objects)."""
        return tuple(self._chip.physical_cores[i] for i in self._members)

    @property
    def physical_core_indices(self) -> tuple[int, ...]:
        return self._members

    @property
    def die(self) -> int:
        """The compute die (0 or 1) its cores sit on."""
        return self._members[0] // spec.cores_per_die

    @property
    def sbuf_bytes(self) -> int:
        """SBUF: ``lnc`` x 28 MiB."""
        return int(self._info.sbuf_bytes)

    @property
    def hbm_bytes(self) -> int:
        """HBM capacity it owns: ``lnc`` x half a 24 GiB stack."""
        return int(self._info.hbm_bytes)

    @property
    def hbm_bandwidth(self) -> float:
        """Its share of the chip's HBM bandwidth, bytes/s: ``lnc`` x 362.5 GB/s."""
        return float(self._info.hbm_bandwidth)

    def peak_tflops(self, dtype: str = "bf16", *, perf_mode: str = "none") -> float:
        """Dense tensor-engine peak in TFLOPS for ``dtype`` operands: ``lnc`` x 78.6 for
        bf16/fp16/tf32 (and fp8 without double_row), x 2 for fp8 e4m3/e5m2 with
        ``perf_mode="double_row"``, / 4 for fp32; ``dtype="sparse"`` gives the 4x sparse peak."""
        _validate.name(perf_mode, "perf_mode", PERF_MODES, what="perf_mode")
        if not (isinstance(dtype, str) and dtype == "sparse"):
            dtype = format_name(dtype, "dtype")
        return self._info.peak_flops(dtype, perf_mode) / 1e12

    def _gemm_cores(self) -> list[int]:
        """``gemm(core=...)``: the physical cores the work is split over."""
        return list(self._members)

    def __repr__(self) -> str:
        return (
            f"LogicalCore(index={self._index}, lnc={self.lnc}, "
            f"physical_cores={list(self._members)})"
        )


class Chip:
    """One Trainium2 chip: 8 physical NeuronCores (``physical_cores``) grouped into
    ``8 // lnc`` logical cores (``cores``), 96 GiB of HBM on four stacks."""

    def __init__(self, lnc: int | None = None, *, index: int = 0) -> None:
        self._lnc = _check_lnc(lnc)
        self._index = _validate.integer(index, "index", lo=0, hi=MAX_CHIP_INDEX)

    @property
    def lnc(self) -> int:
        return self._lnc

    @property
    def index(self) -> int:
        """The chip's index (rank) in its instance, UltraServer or cluster."""
        return self._index

    @_cached
    def hbm_stacks(self) -> tuple:
        """The chip's four HBM stacks (``trn2core.memory.HbmStack``, 24 GiB each); stack ``s``
        is shared by physical cores ``2s`` and ``2s + 1``."""
        from .memory import HbmStack

        return tuple(HbmStack(s) for s in range(spec.hbm_stacks_per_chip))

    @_cached
    def physical_cores(self) -> tuple[NeuronCore, ...]:
        """The 8 physical NeuronCore objects, ``core.index`` 0..7, adjacent pairs sharing an HBM
        stack (created on first use: each holds its own 2 MiB PSUM)."""
        per = spec.cores_per_hbm_stack
        return tuple(NeuronCore(i, hbm=self.hbm_stacks[i // per]) for i in range(_CORES_PER_CHIP))

    @_cached
    def cores(self) -> tuple[LogicalCore, ...]:
        """The ``8 // lnc`` logical cores."""
        return tuple(LogicalCore(self, i) for i in range(_CORES_PER_CHIP // self._lnc))

    @property
    def sbuf_bytes(self) -> int:
        """SBUF of the whole chip: 8 x 28 MiB."""
        return _CORES_PER_CHIP * int(_core.LogicalCoreInfo(1).sbuf_bytes)

    @property
    def hbm_bytes(self) -> int:
        """HBM of the whole chip: 96 GiB."""
        return _CORES_PER_CHIP * int(_core.LogicalCoreInfo(1).hbm_bytes)

    @property
    def hbm_bandwidth(self) -> float:
        """HBM bandwidth of the whole chip, bytes/s (2.9 TB/s)."""
        return _CORES_PER_CHIP * float(_core.LogicalCoreInfo(1).hbm_bandwidth)

    def peak_tflops(self, dtype: str = "bf16", *, perf_mode: str = "none") -> float:
        """Dense tensor-engine peak of all 8 cores, from the 2.4 GHz clock (the marketing chip
        figures are about 5 % higher; see ``trn2core.spec``)."""
        return len(self.cores) * self.cores[0].peak_tflops(dtype, perf_mode=perf_mode)

    def _gemm_cores(self) -> list[int]:
        """``gemm(core=...)``: the work is split over all 8 physical cores."""
        return list(range(_CORES_PER_CHIP))

    def __repr__(self) -> str:
        cores = _CORES_PER_CHIP // self._lnc
        return f"Chip(index={self._index}, lnc={self._lnc}, logical_cores={cores})"
