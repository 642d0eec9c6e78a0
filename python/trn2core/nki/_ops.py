"""Operators as NKI passes them: ``nl.add``, ``nl.exp``, ... are callables (the language's
element-wise functions) and, passed as ``op=``, name an ALU operator or an activation function;
numpy's ufuncs (``np.add``, ``np.exp``, ...) are accepted where the legacy documentation accepts
them. Also the ``nki.isa`` configuration enums (``engine``, ``reduce_cmd``, ...), shared by both
dialects' ISA modules.
"""

from __future__ import annotations

import enum

import numpy as np

from .._names import ACTIVATION_FUNCTIONS, ALU_OPS
from ..errors import Trn2ValueError


class Op:
    """An operator of ``nki.language``: callable (the element-wise function) and usable as
    ``op=`` of ``nki.isa`` instructions (``alu``: the ALU operator it names; ``act``: the
    activation function)."""

    __slots__ = ("name", "alu", "act", "_fn", "doc")

    def __init__(
        self, name: str, fn, *, alu: str | None = None, act: str | None = None, doc: str = ""
    ) -> None:
        self.name = name
        self.alu = alu
        self.act = act
        self._fn = fn
        self.doc = doc or f"nki.language.{name}"

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"nki.language.{self.name}"


_NUMPY: dict[object, tuple[str | None, str | None]] = {
    np.add: ("add", None),
    np.subtract: ("subtract", None),
    np.multiply: ("multiply", None),
    np.divide: ("divide", None),
    np.maximum: ("maximum", None),
    np.minimum: ("minimum", None),
    np.max: ("maximum", None),
    np.amax: ("maximum", None),
    np.min: ("minimum", None),
    np.amin: ("minimum", None),
    np.sum: ("add", None),
    np.prod: ("multiply", None),
    np.power: ("power", None),
    np.equal: ("equal", None),
    np.not_equal: ("not_equal", None),
    np.greater: ("greater", None),
    np.greater_equal: ("greater_equal", None),
    np.less: ("less", None),
    np.less_equal: ("less_equal", None),
    np.logical_and: ("logical_and", None),
    np.logical_or: ("logical_or", None),
    np.logical_xor: ("logical_xor", None),
    np.bitwise_and: ("bitwise_and", None),
    np.bitwise_or: ("bitwise_or", None),
    np.bitwise_xor: ("bitwise_xor", None),
    np.left_shift: ("left_shift", None),
    np.right_shift: ("right_shift", None),
    np.invert: ("invert", None),
    np.abs: ("abs", "abs"),
    np.square: ("square", "square"),
    np.reciprocal: ("reciprocal", "reciprocal"),
    np.exp: (None, "exp"),
    np.log: (None, "log"),
    np.tanh: (None, "tanh"),
    np.sqrt: (None, "sqrt"),
    np.sin: (None, "sin"),
    np.arctan: (None, "arctan"),
    np.sign: (None, "sign"),
    np.copy: (None, "copy"),
}


def _show(op) -> str:
    return getattr(op, "__name__", None) or repr(op)


def _op_name(op, arg: str, slot: int, names, what: str, other: str, examples: str) -> str:
    """What ``op`` names in one family of operators: ``slot`` 0 (ALU operators, ``Op.alu``) or
    1 (activation functions, ``Op.act``) of ``_NUMPY``'s pairs, ``names`` the family's names.
    Errors name ``arg``: ``what`` the family, ``other`` what follows it for an ``Op`` of the
    other family, ``examples`` the ``nl`` operators suggested for anything else."""
    if isinstance(op, Op):
        name = (op.alu, op.act)[slot]
        if name is None:
            raise Trn2ValueError(f"{arg}: {op!r} is not {what}{other}{', '.join(names)}")
        return name
    if isinstance(op, str) and op in names:
        return op
    try:
        name = _NUMPY.get(op, (None, None))[slot]
    except TypeError:
        name = None
    if name is None:
        raise Trn2ValueError(
            f"{arg}: {_show(op)} is not {what}; expected {examples}, ... ({', '.join(names)})"
        )
    return name


def alu_name(op, arg: str = "op") -> str:
    """The ALU operator ``op`` names (an ``nl`` operator, a numpy ufunc, or a name)."""
    if type(op) is Op and op.alu is not None:  # the usual case, one call fewer
        return op.alu
    other = " (it is an activation function); the ALU operators are "
    return _op_name(op, arg, 0, ALU_OPS, "an ALU operator", other, "nl.add, nl.multiply")


def act_name(op, arg: str = "op") -> str:
    """The activation function ``op`` names."""
    other = " of the Scalar engine; they are "
    return _op_name(
        op, arg, 1, ACTIVATION_FUNCTIONS, "an activation function", other, "nl.exp, nl.tanh"
    )


class engine(enum.Enum):  # noqa: N801 - NKI's name
    """Neuron Device engines (``engine=`` of ``nki.isa`` instructions)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.Enum):  # noqa: N801
    """Accumulator-register commands of ``activation`` / ``tensor_scalar_reduce``."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):  # noqa: N801
    """Descriptor generation mode of a DMA (accepted; the machine's DMA model has one)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


def dge_mode_name(mode) -> str:
    """The name of a ``dge_mode`` passed as the enum or as its number (nki-library passes 3,
    ``none``); anything else is an error naming ``dge_mode``."""
    if isinstance(mode, dge_mode):
        return mode.name
    name = getattr(mode, "name", None)
    if isinstance(name, str) and name in dge_mode.__members__:
        return name
    if isinstance(mode, int) and not isinstance(mode, bool):
        try:
            return dge_mode(mode).name
        except ValueError:
            pass
    raise Trn2ValueError(
        f"dge_mode: {mode!r} is not a dge_mode (unknown 0, swdge 1, hwdge 2, none 3)",
        arg="dge_mode",
    )


class oob_mode(enum.Enum):  # noqa: N801
    """What an out-of-bounds DMA access does (only ``error`` is emulated)."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):  # noqa: N801
    """The tensor engine's performance mode."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.IntEnum):  # noqa: N801
    """NeuronCore versions (trn2core emulates ``gen3``, Trainium2's NeuronCore-v3); ordered,
    as kernels compare them (``get_nc_version() >= nc_version.gen3``)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):  # noqa: N801
    """DMA transfer engines."""

    dma = 1
    gpsimd_dma = 2


# The engines' module-level names of both dialects' ``nki.isa``.
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown

#: ``engine`` member -> the machine's engine name.
ENGINE_NAME = {
    engine.tensor: "tensor",
    engine.vector: "vector",
    engine.scalar: "scalar",
    engine.gpsimd: "gpsimd",
}


def engine_name(e, default: str, allowed: tuple[str, ...], what: str) -> str:
    """The machine engine for ``engine=e`` of instruction ``what``."""
    if e is None or e is unknown_engine:  # the module's name: an Enum member lookup is slow
        return default
    name = ENGINE_NAME.get(e) if isinstance(e, engine) else e if isinstance(e, str) else None
    if name not in allowed:
        raise Trn2ValueError(
            f"engine: {what} runs on {' or '.join(allowed)}, got {e!r} [engine rule engine]",
            arg="engine",
            rule="engine",
        )
    return name


def reduce_cmd_name(cmd) -> str:
    """The machine's name of a ``reduce_cmd``."""
    if isinstance(cmd, reduce_cmd):
        return cmd.name
    if isinstance(cmd, str) and cmd in reduce_cmd.__members__:
        return cmd
    raise Trn2ValueError(f"reduce_cmd: expected a nki.isa.reduce_cmd, got {cmd!r}")
