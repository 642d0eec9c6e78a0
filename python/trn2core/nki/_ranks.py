"""A kernel launched once per rank (``trn2core.nki.run(kernel, ..., ranks=N)``) and where its
ranks meet: ``nki.collectives`` (docs/nki.md, "Collectives across ranks").

Each rank is a launch of its own (its own logical core: one or two physical cores, its own
HBM), on a thread of its own; ``nki.collectives.rank_id()`` is its index. A collective call is
matched across the ranks in program order, per physical core: the ``n``-th collective call of
physical core ``c`` of one rank meets the ``n``-th of physical core ``c`` of every other rank
(an LNC=2 rank's two cores each take part, as two NeuronCores do on the chip). Each side brings
what the others need (the bits it sends, its clock), so no thread touches another's machine.

A side never waits forever: a rank that ended or raised before its matching call makes the
waiting calls fail with a ``Trn2Error`` naming them (their ``file:line``); waits poll (the
calling thread still takes Ctrl-C).
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import Trn2ValueError
from ._rendezvous import POLL_S, Call, Meeting, RendezvousError, shown


class PerRank:
    """A launch argument with one value per rank (``trn2core.nki.run(..., ranks=N)``): rank
    ``r`` is called with ``values[r]``. Any other argument is the same on every rank."""

    def __init__(self, values) -> None:
        self.values = list(values)

    def __repr__(self) -> str:
        return f"PerRank({len(self.values)} values)"


class RankGroup(Meeting):
    """The meeting point of a multi-rank launch's ranks (module doc)."""

    def __init__(self, ranks: int) -> None:
        super().__init__(ranks)
        self.ranks = ranks
        #: ``(physical core, n)`` -> each rank's call (``None`` until it arrives).
        self.slots: dict[tuple[int, int], list[Call | None]] = {}
        self.taken: dict[tuple[int, int], int] = {}
        #: Collective calls made so far, per ``(rank, physical core)``.
        self.count: dict[tuple[int, int], int] = {}

    def meet(self, rank: int, core: int, call: Call) -> list[Call]:
        """Waits for every rank's matching call; returns them in rank order."""
        with self.cond:
            n = self.count.get((rank, core), 0)
            self.count[(rank, core)] = n + 1
            key = (core, n)
            slot = self.slots.setdefault(key, [None] * self.ranks)
            slot[rank] = call
            self.cond.notify_all()
            while any(s is None for s in slot):
                for r, s in enumerate(slot):
                    if s is None and self.ended[r] is not None:
                        made = self.count.get((r, core), 0)
                        raise RendezvousError(
                            f"{call.op} on rank {rank} (call {n + 1} of its collective calls "
                            f"on physical core {core}) has no match: rank {r} {self.ended[r]} "
                            f"after {made} such calls"
                        )
                self.cond.wait(POLL_S)
            self.taken[key] = self.taken.get(key, 0) + 1
            if self.taken[key] == self.ranks:
                del self.slots[key], self.taken[key]
        calls = [s for s in slot if s is not None]
        for r, other in enumerate(calls):
            if other.op != call.op:
                raise RendezvousError(
                    f"{call.op} on rank {rank} meets {other.op} at {other.where} on rank {r}: "
                    "every rank must make the same collective calls in the same order"
                )
            if other.check != call.check:
                # A check is (argument name, value) pairs: the first that differs is named.
                arg = next(
                    (k for (k, v), (_, w) in zip(call.check, other.check, strict=False) if v != w),
                    None,
                )
                raise RendezvousError(
                    f"{arg + ': ' if arg else ''}{call.op} on rank {rank} ({shown(call.check)}) "
                    f"does not match its call at {other.where} on rank {r} "
                    f"({shown(other.check)})",
                    arg=arg,
                )
        return calls


def _resolve(fn, args, kwargs, ranks: int, rank: int):
    """Rank ``rank``'s arguments: each ``PerRank`` argument's value for that rank."""
    from ._runtime import _arg_name

    def one(key, v):
        if not isinstance(v, PerRank):
            return v
        if len(v.values) != ranks:
            name = _arg_name(fn, key) if isinstance(key, int) else key
            raise Trn2ValueError(
                f"{name}: PerRank holds {len(v.values)} values for a launch of {ranks} ranks",
                arg=name,
            )
        return v.values[rank]

    return (
        tuple(one(i, a) for i, a in enumerate(args)),
        {k: one(k, v) for k, v in kwargs.items()},
    )


def refuse_per_rank(fn, args, kwargs) -> None:
    """A ``PerRank`` argument of a one-rank launch is an error naming it."""
    from ._runtime import _arg_name

    for key, v in [*enumerate(args), *kwargs.items()]:
        if isinstance(v, PerRank):
            name = _arg_name(fn, key) if isinstance(key, int) else key
            raise Trn2ValueError(
                f"{name}: a PerRank argument goes to a launch of several ranks "
                "(trn2core.nki.run(..., ranks=N))",
                arg=name,
            )


def run_ranks(kernel, args, kwargs, ranks, uninitialized: str):
    """Runs ``kernel`` once per rank (module doc): rank 0 on this thread, the others on
    threads of their own. Returns the launches and each rank's outputs; raises the first
    rank's error (an error that is not a missed meeting, when there is one)."""
    from ._runtime import _interrupt, _PeerStopped

    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise Trn2ValueError(f"ranks: expected a positive integer, got {ranks!r}", arg="ranks")
    ranks = int(ranks)
    group = RankGroup(ranks)
    fn = kernel.fn
    per = [_resolve(fn, args, kwargs, ranks, r) for r in range(ranks)]
    launches = [kernel.launch(a, k, uninitialized, r, group) for r, (a, k) in enumerate(per)]
    outputs: list = [None] * ranks
    errors: list[BaseException | None] = [None] * ranks

    def main(r: int) -> None:
        why = "ended"
        try:
            outputs[r] = launches[r].execute()
        except BaseException as e:  # noqa: BLE001 (re-raised on the calling thread)
            errors[r] = e
            why = f"raised {type(e).__name__}"
        finally:
            group.end(r, why)

    threads = [
        threading.Thread(target=main, args=(r,), name=f"trn2core-rank{r}", daemon=True)
        for r in range(1, ranks)
    ]
    for t in threads:
        t.start()
    main(0)
    try:
        if errors[0] is not None and not isinstance(errors[0], RendezvousError):
            raise errors[0]
        for t in threads:
            while t.is_alive():
                t.join(POLL_S)
    except BaseException:
        for t in threads:
            _interrupt(t)
        if errors[0] is None:
            raise  # Ctrl-C while waiting for the other ranks
    failed = [e for e in errors if e is not None and not isinstance(e, _PeerStopped)]
    if failed:
        raise next((e for e in failed if not isinstance(e, RendezvousError)), failed[0])
    return launches, outputs
