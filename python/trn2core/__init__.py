"""trn2core: a bit-exact AWS Trainium2 emulator for the CPU.

It gives the exact numbers Trainium2 would produce (FP8/BF16/FP16/TF32/FP32 under every rounding
mode, stochastic rounding included) and, as later parts land, how long the chip would take.
See ``docs/`` and ``trn2core demo``.
"""

from __future__ import annotations

from . import _core, distributed, dma, machine, memory, reference, spec
from .chip import Chip, LogicalCore
from .collectives import ALGORITHMS, CollectiveReport, CollectiveResult
from .distributed import DistributedReport, DistributedResult
from .engine import PERF_MODES, GemmResult, NeuronCore, estimate_gemm, gemm
from .errors import (
    CapacityError,
    CorruptDataError,
    FormatError,
    InternalError,
    ShapeError,
    SparsityError,
    Trn2Error,
    Trn2ValueError,
)
from .machine import KernelReport, Tile
from .numerics import (
    FORMATS,
    ROUNDING_MODES,
    FormatInfo,
    decode,
    encode,
    format_info,
    quantize,
    stochastic_bits,
)
from .report import Report
from .sparsity import SPARSITY_PATTERNS, SparseTensor, compress, prune
from .topology import Instance, Torus, UltraCluster, UltraServer

__version__: str = _core.__version__

__all__ = [
    "__version__",
    "spec",
    "dma",
    "memory",
    "FORMATS",
    "ROUNDING_MODES",
    "FormatInfo",
    "format_info",
    "quantize",
    "encode",
    "decode",
    "stochastic_bits",
    "NeuronCore",
    "gemm",
    "estimate_gemm",
    "GemmResult",
    "Report",
    "machine",
    "KernelReport",
    "Tile",
    "PERF_MODES",
    "SPARSITY_PATTERNS",
    "SparseTensor",
    "prune",
    "compress",
    "Chip",
    "LogicalCore",
    "Instance",
    "UltraServer",
    "UltraCluster",
    "Torus",
    "CollectiveResult",
    "CollectiveReport",
    "distributed",
    "DistributedResult",
    "DistributedReport",
    "ALGORITHMS",
    "reference",
    "Trn2Error",
    "Trn2ValueError",
    "ShapeError",
    "FormatError",
    "SparsityError",
    "CorruptDataError",
    "CapacityError",
    "InternalError",
]
