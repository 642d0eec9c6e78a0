"""Type stubs of the compiled extension ``trn2core._core`` (the PyO3 binding crate).

Users call the facade in ``trn2core``; these functions expect already-normalised arguments
(flat C-contiguous native arrays, validated names).
"""

import numpy as np
import numpy.typing as npt

__version__: str

def encode(
    x: npt.NDArray[np.float64]
    | npt.NDArray[np.float32]
    | npt.NDArray[np.uint16]
    | npt.NDArray[np.uint8],
    kind: str,
    fmt: str,
    rounding: str,
    saturate: bool,
    random_bits: npt.NDArray[np.uint32] | None,
    random_bit_count: int,
    seed: int | None,
    exponent_bias: int | None,
) -> npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32]: ...
def decode(
    codes: npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32],
    fmt: str,
    exponent_bias: int | None,
) -> npt.NDArray[np.float32]: ...
def stochastic_bits(n: int, seed: int) -> npt.NDArray[np.uint32]: ...
def format_info(fmt: str, exponent_bias: int | None) -> dict[str, object]: ...
def names() -> tuple[list[str], list[str]]: ...
def spec_entries() -> list[tuple[str, float, str, str, str]]: ...
def _panic_for_test(message: str) -> None: ...
def _busy_for_test(seconds: float) -> int: ...
def host_memory() -> tuple[int, str] | None: ...
def check_alloc(arg: str, what: str, nbytes: int) -> None: ...

# Structured sparsity (codes arrive as flat unsigned views of their width).
def sparsity_patterns() -> list[str]: ...
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
def sparse_gemm(
    a: npt.NDArray[np.float32], b: npt.NDArray[np.float32], m: int, k: int, n: int
) -> npt.NDArray[np.float32]: ...
