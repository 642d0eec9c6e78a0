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
