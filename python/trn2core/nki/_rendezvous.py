"""Where the two physical cores of an LNC=2 launch meet mid-kernel (``nisa.sendrecv``,
``nisa.core_barrier``).

A launch runs its programs one after the other on the calling thread (``Launch.execute``)
until a program calls one of these instructions; the other core's remaining programs then run
on a thread of their own (``Launch.start_peer``), each thread with its own ``STATE.core``. The
two cores' calls are matched in program order: the ``n``-th call of core 0 meets the ``n``-th
call of core 1 (both must be the same instruction). Each side brings what the other needs (the
bits it sends, its clock), so neither thread ever touches the other's machine.

A side never waits forever: a core whose programs ended, or raised, while the other waits makes
the waiting call fail with a ``Trn2Error`` naming it (its ``file:line``); waits poll (the
calling thread still takes Ctrl-C).
"""

from __future__ import annotations

import threading

from ..errors import Trn2ValueError

#: Seconds between two checks of a waiting side (Ctrl-C, the other side ended).
POLL_S = 0.05


class RendezvousError(Trn2ValueError):
    """An LNC=2 rendezvous that cannot happen: the other physical core ended or raised before
    its matching call, or called another instruction, or brought a mismatched tile."""


class Call:
    """One core's side of a rendezvous."""

    __slots__ = ("op", "where", "tick", "payload", "check")

    def __init__(self, op: str, where: str, tick: int, payload, check) -> None:
        #: ``"sendrecv"`` or ``"core_barrier"``.
        self.op = op
        #: ``"file:line"`` of the call.
        self.where = where
        #: The core's clock (ticks) when its side of the instruction is ready.
        self.tick = tick
        #: What the other side takes (the bits sent, the bytes written).
        self.payload = payload
        #: What both sides must agree on (pipe id, shape, dtype), as a tuple.
        self.check = check


class Meeting:
    """Where the sides of a launch meet: their condition, and why each side will make no more
    calls (``None``: still running). ``Rendezvous`` (two physical cores), ``_ranks.RankGroup``
    (the ranks of a multi-rank launch)."""

    def __init__(self, sides: int) -> None:
        self.cond = threading.Condition()
        self.ended: list[str | None] = [None] * sides

    def end(self, side: int, why: str) -> None:
        """Side ``side`` makes no more calls (``why``: "ended", "raised ...")."""
        with self.cond:
            if self.ended[side] is None:
                self.ended[side] = why
            self.cond.notify_all()


class Rendezvous(Meeting):
    """The meeting point of an LNC=2 launch's two physical cores."""

    def __init__(self) -> None:
        super().__init__(2)
        #: Rendezvous ``n`` -> each core's call (``None`` until it arrives), dropped once both
        #: sides took the other's.
        self.slots: dict[int, list[Call | None]] = {}
        #: Rendezvous ``n`` -> how many sides took the other's call.
        self.taken: dict[int, int] = {}
        #: Calls made so far, per core.
        self.count = [0, 0]

    def meet(self, core: int, call: Call) -> Call:
        """Waits for the other core's matching call and returns it."""
        peer = 1 - core
        with self.cond:
            n = self.count[core]
            self.count[core] += 1
            slot = self.slots.setdefault(n, [None, None])
            slot[core] = call
            self.cond.notify_all()
            while slot[peer] is None:
                if self.ended[peer] is not None:
                    raise RendezvousError(
                        f"{call.op} on physical core {core} (call {n + 1} of its "
                        f"sendrecv/core_barrier calls) has no match: physical core {peer} "
                        f"{self.ended[peer]} after {self.count[peer]} such calls"
                    )
                self.cond.wait(POLL_S)
            other = slot[peer]
            self.taken[n] = self.taken.get(n, 0) + 1
            if self.taken[n] == 2:
                del self.slots[n], self.taken[n]
        assert other is not None
        if other.op != call.op:
            raise RendezvousError(
                f"{call.op} on physical core {core} meets {other.op} at {other.where} on "
                f"physical core {peer}: both cores must make the same calls in the same order"
            )
        return other


def shown(check) -> str:
    """A rendezvous ``check`` as words ("pipe_id 0, shape (128, 4)")."""
    return ", ".join(f"{k} {v}" for k, v in check)
