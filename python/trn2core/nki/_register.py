"""NKI's virtual registers (``nisa.register_alloc`` and friends): one 32-bit scalar a register,
held by the front end in program order.

The NKI docs place registers on the engine sequencers and leave the physical register and the
sequencer to the compiler; they give no engine and no cost for the register instructions, so
trn2core issues none: a register is a Python value set and read in program order (the value
an SBUF or HBM tensor holds when ``register_load`` runs, after every earlier instruction), and a
register instruction takes no time on the timeline. This is trn2core's choice, not the chip's
documented behaviour (docs/nki.md, "Registers").
"""

from __future__ import annotations

from ..errors import Trn2ValueError
from ._api import relocate
from ._index import NotSupportedError

# A register is 32 bits; signed values are valid (NKI language guide), and so are unsigned
# 32-bit ones (u32 is one of its documented types).
REG_MIN = -(2**31)
REG_MAX = 2**32 - 1


def check_value(v, arg: str) -> int:
    """``v`` as a register's value: a Python/numpy integer within 32 bits (signed or
    unsigned), or an error naming ``arg``."""
    import numpy as np

    if isinstance(v, VirtualRegister):
        return v.get(arg)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise Trn2ValueError(
            f"{arg}: a register holds a 32-bit integer, got {type(v).__name__} {v!r}", arg=arg
        )
    v = int(v)
    if not REG_MIN <= v <= REG_MAX:
        raise Trn2ValueError(
            f"{arg}: a register holds 32 bits ({REG_MIN} to {REG_MAX}), got {v}", arg=arg
        )
    return v


class VirtualRegister:
    """A virtual register (``nisa.register_alloc``): its value, or ``None`` before one is
    loaded. ``frozen``: the induction variable of a ``dynamic_range`` loop, which NKI forbids
    writing. ``bool(reg)`` is its value's (a ``while reg:`` loop runs until it holds 0);
    ``int(reg)`` / ``operator.index(reg)`` give the value (so ``range(reg)`` and ``t[reg]``
    work); host arithmetic on it is refused (NKI computes on registers through instructions)."""

    __slots__ = ("_value", "frozen")

    def __init__(self, value: int | None = None, frozen: bool = False) -> None:
        self._value = value
        self.frozen = frozen

    def get(self, arg: str) -> int:
        """The value, or an error naming ``arg`` if none was ever set."""
        if self._value is None:
            raise Trn2ValueError(
                f"{arg}: the register was allocated without a value and never loaded "
                "(register_alloc(x), register_move or register_load sets it)",
                arg=arg,
                rule="uninitialized_register",
            )
        return self._value

    def set(self, value: int, arg: str) -> None:
        """Writes ``value`` (already checked), or an error naming ``arg`` if frozen."""
        if self.frozen:
            raise Trn2ValueError(
                f"{arg}: the induction variable of a dynamic_range loop is a frozen register "
                "(NKI: register_move and register_load cannot write it)",
                arg=arg,
            )
        self._value = value

    def __bool__(self) -> bool:
        try:
            return self.get("register") != 0
        except Trn2ValueError as e:
            raise relocate(e) from None

    def __index__(self) -> int:
        try:
            return self.get("register")
        except Trn2ValueError as e:
            raise relocate(e) from None

    __int__ = __index__

    def __repr__(self) -> str:
        v = "uninitialized" if self._value is None else self._value
        return f"VirtualRegister({v}{', frozen' if self.frozen else ''})"

    def _host_op(self, *_a):
        raise relocate(
            NotSupportedError(
                "register: arithmetic on a VirtualRegister in Python is not NKI (the value "
                "lives on the device); compute in a tensor and register_load it, or use int(reg)",
                arg="register",
            )
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _host_op
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _host_op
    __neg__ = __lt__ = __le__ = __gt__ = __ge__ = _host_op
