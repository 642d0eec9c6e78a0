"""Every list of names the API accepts, read once from the Rust core (``_core.names()``), where
each is defined exactly once (``named_enum!``): no module of the facade spells a list itself."""

from __future__ import annotations

from . import _core

_ALL: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _core.names().items()}

#: Number formats (``trn2core.FORMATS``).
FORMATS: tuple[str, ...] = _ALL["formats"]
#: Other names users write for a format (numpy / ml_dtypes / JAX / PyTorch spellings) -> the
#: format (``Format::ALIASES`` in the core).
FORMAT_ALIASES: dict[str, str] = dict(_core.format_aliases())
#: The core's table of element types: ``(name, numpy dtype, bits, kind, is a format, is a
#: machine dtype)``, formats first in ``FORMATS`` order, then the integer types, then the numpy
#: dtypes only arrays have (float64, int64, uint64, bool: neither a format nor a machine dtype).
ELEMENT_TYPES: tuple[tuple[str, str, int, str, bool, bool], ...] = tuple(_core.element_types())
#: Rounding modes (``trn2core.ROUNDING_MODES``).
ROUNDING_MODES: tuple[str, ...] = _ALL["rounding_modes"]
#: ``perf_mode`` values of the tensor engine.
PERF_MODES: tuple[str, ...] = _ALL["perf_modes"]
#: N:M structured-sparsity patterns.
SPARSITY_PATTERNS: tuple[str, ...] = _ALL["sparsity_patterns"]
#: numpy / ml_dtypes dtype names that ``prune`` and ``compress`` take.
SPARSITY_DTYPES: tuple[str, ...] = _ALL["sparsity_dtypes"]
#: DMA inline-compression codecs.
CODECS: tuple[str, ...] = _ALL["codecs"]
#: The memories of one core (``alloc(space=...)``).
MEMORIES: tuple[str, ...] = _ALL["memories"]
#: Where a DMA transfer reads or writes.
DMA_PLACES: tuple[str, ...] = _ALL["dma_places"]
#: The five collectives.
COLLECTIVES: tuple[str, ...] = _ALL["collectives"]
#: Collective algorithms (``auto`` first).
ALGORITHMS: tuple[str, ...] = _ALL["algorithms"]
#: Reduction operators of all-reduce and reduce-scatter.
REDUCE_OPS: tuple[str, ...] = _ALL["reduce_ops"]
#: Element types of the whole-core machine's tiles.
MACHINE_DTYPES: tuple[str, ...] = _ALL["machine_dtypes"]
#: ALU operators of the Vector, Scalar and GpSimd engines.
ALU_OPS: tuple[str, ...] = _ALL["alu_ops"]
#: Activation functions of the Scalar engine.
ACTIVATION_FUNCTIONS: tuple[str, ...] = _ALL["activation_functions"]
#: Compute engines (``engine=`` of the ISA).
ENGINES: tuple[str, ...] = _ALL["engines"]
#: Instructions of the machine.
OPCODES: tuple[str, ...] = _ALL["opcodes"]
#: Accumulator-register commands (``reduce_cmd=``).
REDUCE_CMDS: tuple[str, ...] = _ALL["reduce_cmds"]
#: Whole-model presets (``workload.Model(name)``).
MODEL_PRESETS: tuple[str, ...] = _ALL["model_presets"]
