"""Type stubs of the compiled extension ``trn2core._core`` (the PyO3 binding crate).

Users call the facade in ``trn2core``; these functions expect already-normalised arguments
(flat C-contiguous native arrays, validated names).
"""

from collections.abc import Callable, Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__version__: str
__all__ = [
    "Allocation",
    "Candidate",
    "CoreMemory",
    "FormatInfo",
    "HbmStack",
    "KernelReport",
    "LogicalCoreInfo",
    "Machine",
    "MemoryPlan",
    "MemoryUsage",
    "ModelInfo",
    "OpTime",
    "SearchResult",
    "StackPlacement",
    "Step",
    "StepParts",
    "StepReport",
    "StreamInfo",
    "Tile",
    "Torus",
    "TrainReport",
    "__version__",
    "_busy_for_test",
    "_estimate_gemm_walk",
    "_panic_for_test",
    "check_alloc",
    "collective_estimate",
    "collective_move",
    "collective_move_local",
    "collective_reduce",
    "collective_reduce_local",
    "decode",
    "dma_compress",
    "dma_copy_time",
    "dma_decompress",
    "dma_decompress_into",
    "dma_describe",
    "dma_inspect",
    "element_types",
    "instruction_table",
    "encode",
    "estimate_gemm",
    "format_aliases",
    "format_info",
    "gemm",
    "host_memory",
    "instance_types",
    "logical_core_members",
    "memory_footprint",
    "names",
    "nccom_estimate",
    "nccom_machine",
    "placement",
    "sparsity_compress",
    "sparsity_decompress",
    "sparsity_from_cutlass",
    "sparsity_positions",
    "sparsity_prune",
    "sparsity_to_cutlass",
    "spec_entries",
    "spec_sources",
    "spec_statuses",
    "stochastic_bits",
    "workload_memory",
    "workload_model",
    "workload_search",
    "workload_step",
    "workload_train",
]

def encode(
    x: npt.NDArray[np.float64]
    | npt.NDArray[np.float32]
    | npt.NDArray[np.uint16]
    | npt.NDArray[np.uint8],
    source: str,
    format: str,
    rounding: str,
    saturate: bool,
    random_bits: npt.NDArray[np.uint32] | None,
    random_bit_count: int,
    seed: int | None,
    exponent_bias: int | None,
) -> npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32]: ...
def decode(
    codes: npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32],
    format: str,
    exponent_bias: int | None,
) -> npt.NDArray[np.float32]: ...
def stochastic_bits(n: int, seed: int) -> npt.NDArray[np.uint32]: ...

@final
class FormatInfo:
    @property
    def name(self) -> str: ...
    @property
    def exponent_bits(self) -> int: ...
    @property
    def mantissa_bits(self) -> int: ...
    @property
    def bias(self) -> int: ...
    @property
    def max(self) -> float: ...
    @property
    def min_normal(self) -> float: ...
    @property
    def min_subnormal(self) -> float: ...
    @property
    def has_inf(self) -> bool: ...

def format_info(format: str, exponent_bias: int | None) -> FormatInfo: ...
def names() -> dict[str, list[str]]: ...
def instruction_table() -> list[
    tuple[str, list[str], str | None, list[tuple[str, str, bool, object]], str]
]: ...
def element_types() -> list[tuple[str, str, int, str, bool, bool]]: ...
def format_aliases() -> list[tuple[str, str]]: ...
def spec_entries() -> list[tuple[str, float, str, str, str, str, list[str], str]]: ...
def spec_sources() -> list[tuple[str, str, str, list[str], str]]: ...
def spec_statuses() -> list[tuple[str, str, str]]: ...
def _panic_for_test(message: str) -> None: ...
def _busy_for_test(seconds: float) -> int: ...
def _estimate_gemm_walk(
    m: int,
    k: int,
    n: int,
    dtype: str,
    perf_mode: str,
    throttle: bool,
    sparsity: str | None = None,
) -> dict[str, object]: ...
def host_memory() -> tuple[int, str] | None: ...
def check_alloc(arg: str, what: str, nbytes: int) -> None: ...

# Structured sparsity (codes arrive as flat unsigned views of their width).
def gemm(
    a: npt.NDArray[np.unsignedinteger],
    a_dtype: str,
    a_swapped: bool,
    a_sparse: tuple[npt.NDArray[np.uint8], str, tuple[int, int]] | None,
    b: npt.NDArray[np.unsignedinteger],
    b_dtype: str,
    b_swapped: bool,
    dtype: str | None,
    rounding: str,
    seeds: tuple[int, int],
    perf_mode: str,
    out_dtype: str,
    throttle: bool,
    cores: list[int] | None,
) -> tuple[npt.NDArray[np.float32 | np.unsignedinteger], dict[str, object], str]: ...
def estimate_gemm(
    m: int,
    k: int,
    n: int,
    dtype: str,
    perf_mode: str,
    throttle: bool,
    trace: bool,
    sparsity: str | None = None,
    cores: list[int] | None = None,
) -> tuple[dict[str, object], str | None]: ...
def sparsity_prune(
    x: npt.NDArray[np.unsignedinteger], dtype: str, shape: list[int], axis: int, pattern: str
) -> npt.NDArray[np.unsignedinteger]: ...
def sparsity_compress(
    x: npt.NDArray[np.unsignedinteger], shape: list[int], axis: int, pattern: str
) -> tuple[npt.NDArray[np.unsignedinteger], npt.NDArray[np.uint8], list[int], int]: ...
def sparsity_decompress(
    values: npt.NDArray[np.unsignedinteger],
    indices: npt.NDArray[np.uint8],
    shape: list[int],
    axis: int,
    pattern: str,
) -> npt.NDArray[np.unsignedinteger]: ...
def sparsity_positions(
    indices: npt.NDArray[np.uint8], pattern: str, count: int
) -> npt.NDArray[np.uint8]: ...
def sparsity_to_cutlass(
    x: npt.NDArray[np.unsignedinteger], rows: int, cols: int
) -> tuple[npt.NDArray[np.unsignedinteger], npt.NDArray[np.int16] | npt.NDArray[np.int32]]: ...
def sparsity_from_cutlass(
    values: npt.NDArray[np.unsignedinteger],
    meta: npt.NDArray[np.int16] | npt.NDArray[np.int32],
    rows: int,
    cols: int,
) -> npt.NDArray[np.unsignedinteger]: ...

# DMA inline compression and transfer timing (rust/trn2core-py/src/dma.rs).
@final
class StreamInfo:
    @property
    def codec(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def elem_size(self) -> int: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def raw_nbytes(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

def dma_compress(
    raw: npt.NDArray[np.uint8], elem_size: int, codec: str, dtype: str, shape: list[int]
) -> tuple[npt.NDArray[np.uint8], StreamInfo]: ...
def dma_inspect(stream: npt.NDArray[np.uint8]) -> StreamInfo: ...
def dma_describe(stream: npt.NDArray[np.uint8]) -> StreamInfo: ...
def dma_decompress(stream: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]: ...
def dma_decompress_into(stream: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8]) -> None: ...
def dma_copy_time(
    bytes: int, wire_bytes: int, partitions: int, src: str, dst: str, queue: int = 0
) -> tuple[dict[str, object], str]: ...

# The memory model (rust/trn2core-py/src/memory.rs).
@final
class MemoryUsage:
    @property
    def capacity(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def partitions(self) -> int: ...
    @property
    def partition_bytes(self) -> int: ...
    @property
    def partition_free(self) -> int: ...
    @property
    def allocations(self) -> int: ...

@final
class StackPlacement:
    @property
    def index(self) -> int: ...
    @property
    def die(self) -> int: ...
    @property
    def cores(self) -> list[int]: ...

@final
class HbmStack:
    def __new__(cls, index: int = 0) -> HbmStack: ...
    def placement(self) -> StackPlacement: ...
    def usage(self) -> MemoryUsage: ...

@final
class Allocation:
    @property
    def space(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def partition_start(self) -> int: ...
    @property
    def partitions(self) -> int: ...
    @property
    def partition_bytes(self) -> int: ...
    @property
    def stack(self) -> int: ...

@final
class CoreMemory:
    def __new__(cls, core: int = 0, hbm: HbmStack | None = None) -> CoreMemory: ...
    def hbm_stack(self) -> HbmStack: ...
    def placement(self) -> tuple[int, int, int]: ...
    def usage(self, space: str) -> MemoryUsage: ...
    def alloc(
        self, arg: str, space: str, shape: list[int] | None, elem_size: int, nbytes: int
    ) -> Allocation: ...
    def free(self, allocation: Allocation) -> None: ...
    def dma_copy(
        self,
        raw: npt.NDArray[np.uint8],
        dtype: str,
        elem_size: int,
        shape: list[int],
        codec: str,
        src: str | Allocation,
        dst: str | Allocation,
        queue: int,
        machine: Machine | None = None,
    ) -> tuple[dict[str, object], str, int, int, str, str]: ...
    def check_transfer(
        self, arg: str, space: str, shape: list[int], elem_size: int, hbm_bytes: int
    ) -> None: ...
    def check_capacity(
        self, arg: str, space: str, shape: list[int], elem_size: int, hbm_bytes: int
    ) -> None: ...

def memory_footprint(shape: list[int], elem_size: int) -> tuple[int, int, int]: ...

# Chips, the torus and collectives (buffers arrive as flat contiguous arrays: float32 for fp32,
# uint16 for bf16/fp16, uint8 for fp8 and for the raw bytes of data-movement collectives).
@final
class Torus:
    def __new__(cls, shape: list[int], ultraservers: int = 1, lnc: int = ...) -> Torus: ...
    @property
    def lnc(self) -> int: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def torus_shape(self) -> list[int]: ...
    @property
    def ultraservers(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def chip_egress_bytes_per_s(self) -> float: ...
    def coords(self, i: int) -> list[int]: ...
    def index(self, coords: list[int]) -> int: ...
    def neighbors(self, i: int) -> list[int]: ...
    def hops(self, i: int, j: int) -> int: ...
    def link_bandwidth(self, i: int, j: int) -> float: ...
    def route(self, i: int, j: int) -> list[str]: ...

def collective_estimate(
    torus: Torus,
    chips: list[int] | None,
    collective: str,
    algorithm: str,
    elements: int,
    elem_bytes: int,
    peers: list[int] | None,
    trace: bool,
) -> tuple[dict[str, object], str | None]: ...
def collective_reduce(
    torus: Torus,
    chips: list[int] | None,
    collective: str,
    op: str,
    algorithm: str,
    format: str,
    inputs: list[npt.NDArray[np.float32] | npt.NDArray[np.uint16] | npt.NDArray[np.uint8]],
) -> tuple[list[np.ndarray], dict[str, object]]: ...
def collective_move(
    torus: Torus,
    chips: list[int] | None,
    collective: str,
    algorithm: str,
    elem_size: int,
    inputs: list[npt.NDArray[np.uint8]],
    peers: list[int] | None,
) -> tuple[list[npt.NDArray[np.uint8]], dict[str, object]]: ...
def placement(chips: int, procs: int, placement: list[int] | None = None) -> list[int]: ...
def collective_reduce_local(
    torus: Torus,
    chips: list[int] | None,
    collective: str,
    op: str,
    algorithm: str,
    format: str,
    procs: int,
    process: int,
    placement: list[int] | None,
    elements: int,
    inputs: list[npt.NDArray[np.float32] | npt.NDArray[np.uint16] | npt.NDArray[np.uint8]],
    exchange: Callable[[int, list[tuple[int, memoryview]], list[tuple[int, memoryview]]], object],
) -> tuple[list[np.ndarray], dict[str, object], dict[str, int]]: ...
def collective_move_local(
    torus: Torus,
    chips: list[int] | None,
    collective: str,
    algorithm: str,
    elem_size: int,
    procs: int,
    process: int,
    placement: list[int] | None,
    elements: int,
    inputs: list[npt.NDArray[np.uint8]],
    peers: list[int] | None,
    exchange: Callable[[int, list[tuple[int, memoryview]], list[tuple[int, memoryview]]], object],
) -> tuple[list[npt.NDArray[np.uint8]], dict[str, object], dict[str, int]]: ...
def nccom_machine(chips: int) -> tuple[list[int], int, list[int]]: ...
def nccom_chips(ranks: int, nnodes: int, lnc: int) -> int: ...
def nccom_estimate(
    collective: str, ranks: int, lnc: int, size_bytes: int, elem_bytes: int, algorithm: str
) -> dict[str, object]: ...

# Whole-model reports (rust/trn2core-py/src/workload.rs).
@final
class ModelInfo:
    @property
    def name(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def tie_word_embeddings(self) -> bool: ...
    @property
    def sliding_window(self) -> int | None: ...
    @property
    def parameters(self) -> int: ...
    @property
    def moe_layers(self) -> int: ...
    @property
    def num_experts(self) -> int | None: ...
    @property
    def num_experts_per_tok(self) -> int | None: ...
    @property
    def shared_experts(self) -> int | None: ...
    @property
    def moe_intermediate_size(self) -> int | None: ...
    @property
    def attention(self) -> str: ...

@final
class OpTime:
    @property
    def name(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def fixed_s(self) -> float: ...
    @property
    def total_s(self) -> float: ...
    @property
    def hbm_bytes(self) -> float: ...
    @property
    def flops(self) -> float: ...
    @property
    def bound(self) -> str: ...

@final
class MemoryPlan:
    @property
    def items(self) -> list[tuple[str, int]]: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...
    @property
    def ranks_per_chip(self) -> int: ...

@final
class StepParts:
    @property
    def other_s(self) -> float: ...
    @property
    def reduce_ops(self) -> float: ...
    @property
    def reduce_steps(self) -> float: ...
    @property
    def fixed_ops(self) -> float: ...
    @property
    def layer_collectives_s(self) -> float: ...

@disjoint_base
class Step:
    @property
    def phase(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def description(self) -> str: ...
    @property
    def ops(self) -> list[OpTime]: ...
    @property
    def memory(self) -> MemoryPlan: ...
    @property
    def uncertainty(self) -> dict[str, Any]: ...

@final
class StepReport(Step):
    @property
    def tokens(self) -> int: ...
    @property
    def bucket(self) -> int: ...
    @property
    def parts(self) -> StepParts: ...

@final
class TrainReport(Step):
    @property
    def tokens_per_s(self) -> float: ...
    @property
    def mfu(self) -> float: ...
    @property
    def model_flops(self) -> float: ...
    @property
    def peak_flops_per_s(self) -> float: ...
    @property
    def micro_batches(self) -> int: ...
    @property
    def bubble_fraction(self) -> float: ...
    @property
    def stage_layers(self) -> int: ...
    @property
    def forward_s(self) -> float: ...
    @property
    def backward_s(self) -> float: ...
    @property
    def dp_reduce_s(self) -> float: ...
    @property
    def dp_exposed_s(self) -> float: ...

@final
class Candidate:
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def lnc(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def ttft_s(self) -> float: ...
    @property
    def itl_s(self) -> float: ...
    @property
    def tokens_per_s(self) -> float: ...
    @property
    def cost_per_mtok(self) -> float | None: ...
    @property
    def mfu(self) -> float: ...

@final
class SearchResult:
    @property
    def layouts(self) -> list[Candidate]: ...
    @property
    def tried(self) -> int: ...
    @property
    def skipped_capacity(self) -> int: ...
    @property
    def skipped_invalid(self) -> int: ...
    @property
    def skipped_constraints(self) -> int: ...

def workload_model(name: str, config: dict[str, object] | None = None) -> ModelInfo: ...
def workload_step(
    name: str,
    config: dict[str, object] | None,
    phase: str,
    tokens: int,
    machine: str,
    tp: int,
    ep: int,
    lnc: int,
    batch: int,
    dtype: str,
    sequence_parallel: bool,
    seq_len: int,
    prefill_buckets: Sequence[int],
    decode_buckets: Sequence[int],
    serving: str,
    naive: bool,
) -> StepReport: ...
def workload_memory(
    name: str,
    config: dict[str, object] | None,
    machine: str,
    tp: int,
    ep: int,
    lnc: int,
    batch: int,
    dtype: str,
    seq_len: int,
    prefill_buckets: Sequence[int],
) -> MemoryPlan: ...
def workload_train(
    name: str,
    config: dict[str, object] | None,
    machine: str,
    tp: int,
    pp: int,
    dp: int,
    ep: int,
    lnc: int,
    micro_batch: int,
    global_batch: int,
    seq: int,
    dtype: str,
    zero1: bool,
    recompute: str,
    sequence_parallel: bool,
) -> TrainReport: ...
def workload_search(
    name: str,
    config: dict[str, object] | None,
    machine: str,
    objective: str,
    price_per_hour: float | None,
    train: bool,
    prompt: int,
    output: int,
    tp: Sequence[int],
    pp: Sequence[int],
    ep: Sequence[int],
    lnc: Sequence[int],
    batch: Sequence[int],
    dtype: str,
    global_batch: int,
    seq: int,
    max_ttft_s: float | None,
    max_itl_s: float | None,
) -> SearchResult: ...

@final
class LogicalCoreInfo:
    def __new__(cls, lnc: int) -> LogicalCoreInfo: ...
    @property
    def lnc(self) -> int: ...
    @property
    def sbuf_bytes(self) -> int: ...
    @property
    def hbm_bytes(self) -> int: ...
    @property
    def hbm_bandwidth(self) -> float: ...
    def peak_flops(self, dtype: str, perf_mode: str) -> float: ...

def logical_core_members(lnc: int, index: int) -> list[int]: ...
def instance_types() -> list[tuple[str, int, list[int], bool]]: ...

# The machine: tiles, the NeuronCore and its report (rust/trn2core-py/src/machine.rs).
@final
class Tile:
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def space(self) -> str: ...
    @property
    def start_partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def pattern(self) -> list[tuple[int, int]]: ...
    @property
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: object, /) -> Tile: ...
    def view_as(self, dtype: str) -> Tile: ...
    def reshape_free(self, shape: list[int]) -> Tile: ...
    def ap(self, pattern: list[tuple[int, int]], offset: int | None = None) -> Tile: ...
    def rows(self, count: int, step: int) -> Tile: ...
    @property
    def row_step(self) -> int: ...

@final
class KernelReport:
    @property
    def seconds(self) -> float: ...
    @property
    def ticks(self) -> int: ...
    @property
    def instructions(self) -> int: ...
    @property
    def dma_bytes(self) -> int: ...
    @property
    def queues(self) -> list[tuple[str, float, float, int]]: ...
    @property
    def opcodes(self) -> list[tuple[str, int]]: ...
    @property
    def critical_path(self) -> list[tuple[int, str, str, float, float, str, int]]: ...
    @property
    def critical_path_length(self) -> int: ...
    def times(self) -> dict[str, list[float]]: ...
    def trace_json(self) -> str: ...
    def save_trace(self, path: str) -> None: ...

@final
class Machine:
    def __new__(
        cls, uninitialized: str = "error", rounding: str = "nearest_even", seed: int = 0
    ) -> Machine: ...
    def alloc(
        self,
        shape: list[int],
        dtype: str,
        space: str,
        name: str,
        start_partition: int = 0,
        address: int | None = None,
        overlay: bool = False,
    ) -> Tile: ...
    def reserve(
        self,
        arg: str,
        space: str,
        name: str,
        shape: list[int] | None,
        elem_size: int,
        nbytes: int,
        dtype: str | None,
        stack: int,
    ) -> tuple[Allocation, Tile]: ...
    def release(self, allocation: Allocation) -> None: ...
    def usage(self, space: str) -> MemoryUsage: ...
    def hbm_tensor(
        self, name: str, shape: list[int], dtype: str, data: npt.NDArray[np.uint8] | None = None
    ) -> Tile: ...
    def free(self, tile: object) -> None: ...
    def tensor_info(self, tile: object) -> tuple[str, str, list[int], str]: ...
    def matmul(
        self,
        stationary: npt.NDArray[np.unsignedinteger],
        stationary_shape: list[int],
        stationary_format: str,
        moving: npt.NDArray[np.unsignedinteger],
        moving_shape: list[int],
        moving_format: str,
        bank: int,
        accumulate: bool,
        perf_mode: str,
        tile_position: tuple[int, int] | None,
        tile_size: tuple[int, int] | None,
    ) -> npt.NDArray[np.float32]: ...
    def transpose(
        self,
        stationary: npt.NDArray[np.unsignedinteger],
        k: int,
        m: int,
        format: str,
        identity: npt.NDArray[np.unsignedinteger],
        identity_format: str,
        bank: int,
    ) -> None: ...
    def read_psum(self, bank: int, rows: int, cols: int, dtype: str) -> npt.NDArray[np.uint8]: ...
    def write(self, tile: object, data: npt.NDArray[np.uint8]) -> None: ...
    def read(self, tile: object) -> npt.NDArray[np.uint8]: ...
    def written_ranges(self, tile: object) -> list[tuple[int, int]]: ...
    def carried_reads(
        self, iterations: list[int], end: int, limit: int = 16
    ) -> list[tuple[int, int]]: ...
    @property
    def instructions(self) -> int: ...
    def clear_program(self) -> None: ...
    def run(self, trace_limit: int = 1000000) -> KernelReport: ...
    def issue(self, opcode: str, *args: object, **kwargs: object) -> None: ...
