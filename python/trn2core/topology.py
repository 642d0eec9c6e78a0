"""The machines you rent: instances, UltraServers and UltraClusters of Trainium2 chips, their
NeuronLink torus, and the collectives over their chips (contract section 5).

- ``Instance("trn2.48xlarge", lnc=2)``: 16 chips in a 4 x 4 2-D torus (also ``trn2u.48xlarge``;
  ``trn2.3xlarge`` is one chip).
- ``UltraServer(lnc=2)``: four trn2u.48xlarge joined along Z: a 4 x 4 x 4 3-D torus of 64 chips.
- ``UltraCluster(n_ultraservers, lnc=2)``: UltraServers joined by EFA (200 Gbps per chip).

``machine.topology`` is a ``Torus``: coordinates, neighbours, hop counts, link bandwidths. X and
Y links carry 128 GB/s per direction, Z links 64 GB/s (4 x 128 x 2 + 2 x 64 x 2 = the documented
1.28 TB/s per chip); the EFA NIC of a chip 25 GB/s each way.
"""

from __future__ import annotations

import operator

from . import _core, _validate, spec
from . import collectives as _coll
from . import distributed as _distributed
from .chip import Chip, _cached, _check_lnc
from .collectives import CollectiveReport, CollectiveResult, _is_sequence
from .errors import ShapeError, Trn2ValueError

__all__ = ["Torus", "Instance", "UltraServer", "UltraCluster", "INSTANCE_TYPES"]

#: The Trn2 instance types: name -> (chips, torus shape).
INSTANCE_TYPES: dict[str, tuple[int, tuple[int, ...]]] = {
    name: (chips, tuple(shape)) for name, chips, shape, _ in _core.instance_types()
}

_ULTRASERVER_SHAPE = [spec.instance_torus_x, spec.instance_torus_y, spec.ultraserver_torus_z]


def _index(value, name: str) -> int:
    if isinstance(value, bool):
        raise Trn2ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise Trn2ValueError(
            f"{name}: expected an integer >= 0, got {_validate._show(value)}"
        ) from None
    if v < 0:
        raise Trn2ValueError(f"{name}: expected an integer >= 0, got {v}")
    if v >= 1 << 62:
        raise Trn2ValueError(f"{name}: {v} is out of range (no machine has that many chips)")
    return v


class Torus:
    """The NeuronLink torus of a machine (several UltraServers: one torus each, joined by EFA).

    Chip ``i`` has coordinates ``(x, y[, z][, s])`` with x varying fastest; ``s`` is the
    UltraServer of an UltraCluster. ``shape`` is ``()`` for one chip, ``(4, 4)`` for an
    instance, ``(4, 4, 4)`` for an UltraServer and ``(4, 4, 4, n)`` for ``n`` UltraServers.
    """

    def __init__(self, shape=(4, 4), ultraservers: int = 1) -> None:
        if not _is_sequence(shape):
            raise ShapeError(
                f"shape: expected a tuple of torus extents such as (4, 4), got "
                f"{_validate._show(shape)}"
            )
        dims = [_index(e, "shape") for e in shape]
        self._t = _core.Torus(dims, _index(ultraservers, "ultraservers"))

    @classmethod
    def _wrap(cls, t) -> Torus:
        obj = cls.__new__(cls)
        obj._t = t
        return obj

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._t.shape)

    @property
    def torus_shape(self) -> tuple[int, ...]:
        """Extents of one UltraServer's (or instance's) NeuronLink torus."""
        return tuple(self._t.torus_shape)

    @property
    def ultraservers(self) -> int:
        return self._t.ultraservers

    @property
    def size(self) -> int:
        """Chips."""
        return self._t.size

    @property
    def chip_link_capacity(self) -> float:
        """Bytes/s one chip can send over all its links at once (NeuronLink, plus its EFA NIC
        when there are several UltraServers)."""
        return self._t.chip_egress_bytes_per_s

    def coords(self, i) -> tuple[int, ...]:
        return tuple(self._t.coords(_index(i, "i")))

    def index(self, coords) -> int:
        if not _is_sequence(coords):
            raise ShapeError(
                f"coords: expected a tuple of {len(self.shape)} coordinates, got "
                f"{_validate._show(coords)}"
            )
        return self._t.index([_index(c, "coords") for c in coords])

    def neighbors(self, i) -> tuple[int, ...]:
        """NeuronLink neighbours, in the order X+, X-, Y+, Y-, Z+, Z-."""
        return tuple(self._t.neighbors(_index(i, "i")))

    def hops(self, i, j) -> int:
        """NeuronLink hops (shortest way round each ring); 1 between UltraServers (one EFA
        crossing); 0 from a chip to itself."""
        return self._t.hops(_index(i, "i"), _index(j, "j"))

    def link_bandwidth(self, i, j) -> float:
        """Bytes/s per direction of the link between neighbours ``i`` and ``j`` (X/Y 128e9,
        Z 64e9; 25e9, the EFA NIC, between UltraServers). Raises for chips that are not
        directly linked."""
        return self._t.link_bandwidth(_index(i, "i"), _index(j, "j"))

    def route(self, i, j) -> tuple[str, ...]:
        """The links a transfer from ``i`` to ``j`` takes (dimension-order routing)."""
        return tuple(self._t.route(_index(i, "i"), _index(j, "j")))

    def __repr__(self) -> str:
        return f"Torus(shape={self.shape})"


class _Machine:
    """Collectives over the chips of a machine; ``chips`` in rank order. With ``comm=`` (an
    mpi4py communicator) the chips are spread over its processes: each passes and receives
    only its ``local_chips``' buffers, with the bits of one process (docs/distributed.md).

    Threads: a machine holds no mutable state of its own (collectives are pure functions of
    their buffers), so threads may share one and call its collectives concurrently; each call
    gets its own outputs. The chips' cores are shared like any ``NeuronCore``."""

    _torus: object
    _lnc: int
    name: str
    _spread: _distributed.Spread | None = None

    def _runner(self):
        """Where the collectives run: in this process, or spread over MPI processes."""
        return _coll if self._spread is None else _distributed

    @property
    def local_chips(self) -> tuple[int, ...]:
        """The chips whose buffers this process passes and receives: every chip in one
        process; under MPI (``comm=``) its share (docs/distributed.md)."""
        if self._spread is None:
            return tuple(range(self._torus.size))
        return tuple(c for c, p in enumerate(self._spread.placement) if p == self._spread.process)

    @property
    def lnc(self) -> int:
        return self._lnc

    @_cached
    def topology(self) -> Torus:
        return Torus._wrap(self._torus)

    @_cached
    def chips(self) -> tuple[Chip, ...]:
        """The chips, in rank order (chip ``i`` is rank ``i``)."""
        return tuple(Chip(self._lnc, index=i) for i in range(self._torus.size))

    def _ranks(self, chips) -> int:
        if chips is None:
            return self._torus.size
        return len(chips)

    @staticmethod
    def _chip_list(chips):
        if chips is None:
            return None
        if not _is_sequence(chips):
            raise Trn2ValueError(
                f"chips: expected a list of chip indices, got {_validate._show(chips)}"
            )
        if len(chips) == 0:
            raise Trn2ValueError("chips: got an empty list; a collective needs at least one chip")
        return [_index(c, "chips") for c in chips]

    def all_reduce(self, buffers, op: str = "sum", algorithm: str = "auto", *, chips=None):
        """Every rank ends with the reduction (``sum``, ``max`` or ``min``) of all buffers.

        One buffer per chip (or per chip of ``chips``, in that rank order), all of one shape and
        dtype: float32, bfloat16, float16 or float8 (e4m3, e5m2, e3m4). Reduction is in fp32 in
        the order the algorithm fixes (docs/collectives.md), low-precision results rounded once
        to nearest even; every rank gets the same bits. Returns a ``CollectiveResult``."""
        return self._runner().run_reduce(
            self, "all_reduce", buffers, op, algorithm, self._chip_list(chips)
        )

    def reduce_scatter(self, buffers, op: str = "sum", algorithm: str = "auto", *, chips=None):
        """Rank ``r`` ends with part ``r`` of the reduction: rows ``r * R / n`` to
        ``(r + 1) * R / n`` when the first axis (``R`` rows) divides by the rank count, else
        elements ``floor(r * L / n)`` to ``floor((r + 1) * L / n)`` of the flattened buffer."""
        return self._runner().run_reduce(
            self, "reduce_scatter", buffers, op, algorithm, self._chip_list(chips)
        )

    def all_gather(self, buffers, algorithm: str = "auto", *, chips=None) -> CollectiveResult:
        """Every rank ends with ``np.stack(buffers)`` (any dtype; bits unchanged)."""
        return self._runner().run_move(
            self, "all_gather", buffers, algorithm, self._chip_list(chips)
        )

    def all_to_all(self, buffers, algorithm: str = "auto", *, chips=None) -> CollectiveResult:
        """Rank ``j`` ends with part ``j`` of every rank's buffer, in rank order (parts cut like
        ``reduce_scatter``'s)."""
        return self._runner().run_move(
            self, "all_to_all", buffers, algorithm, self._chip_list(chips)
        )

    def send_recv(self, buffers, peers=None, *, chips=None) -> CollectiveResult:
        """Point to point: rank ``r`` sends its buffer to rank ``peers[r]`` (a permutation;
        default ``r + 1``, wrapping), which ends with it."""
        return self._runner().run_move(
            self, "send_recv", buffers, "auto", self._chip_list(chips), peers=peers
        )

    def estimate(
        self,
        collective: str,
        nbytes: int,
        *,
        dtype: str = "fp32",
        algorithm: str = "auto",
        chips=None,
        peers=None,
    ) -> CollectiveReport:
        """Timing of ``collective`` (``"all_reduce"``, ...) on buffers of ``nbytes`` bytes per
        rank (each rank's input) of ``dtype``, without data: a 2,048-chip all-reduce costs in
        milliseconds."""
        return _coll.estimate(
            self, collective, nbytes, dtype, algorithm, self._chip_list(chips), peers
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, chips={self._torus.size}, lnc={self._lnc})"


class Instance(_Machine):
    """An EC2 instance of Trainium2 chips: ``trn2.3xlarge`` (1 chip), ``trn2.48xlarge`` or
    ``trn2u.48xlarge`` (16 chips, 4 x 4 torus)."""

    def __init__(
        self,
        instance_type: str = "trn2.48xlarge",
        lnc: int | None = None,
        *,
        comm=None,
        placement=None,
    ) -> None:
        _validate.name(
            instance_type,
            "instance_type",
            INSTANCE_TYPES,
            cls=Trn2ValueError,
            what="instance type",
        )
        self._lnc = _check_lnc(lnc)
        self.name = instance_type
        self._torus = _core.Torus(list(INSTANCE_TYPES[instance_type][1]), 1, self._lnc)
        self._spread = _distributed.spread(self._torus.size, comm, placement, self.name)

    @property
    def instance_type(self) -> str:
        return self.name


class UltraServer(_Machine):
    """A Trn2 UltraServer: 4 trn2u.48xlarge joined along Z, a 4 x 4 x 4 torus of 64 chips."""

    def __init__(self, lnc: int | None = None, *, comm=None, placement=None) -> None:
        self._lnc = _check_lnc(lnc)
        self.name = "Trn2 UltraServer"
        self._torus = _core.Torus(_ULTRASERVER_SHAPE, 1, self._lnc)
        self._spread = _distributed.spread(self._torus.size, comm, placement, self.name)


class UltraCluster(_Machine):
    """``n_ultraservers`` UltraServers joined by EFA: every chip has a 200 Gbps NIC (~15 us)."""

    def __init__(
        self, n_ultraservers: int, lnc: int | None = None, *, comm=None, placement=None
    ) -> None:
        self._lnc = _check_lnc(lnc)
        n = _index(n_ultraservers, "n_ultraservers")
        if n < 1:
            raise Trn2ValueError(f"n_ultraservers: expected at least 1, got {n}")
        self.name = f"Trn2 UltraCluster of {n} UltraServers"
        self._torus = _core.Torus(_ULTRASERVER_SHAPE, n, self._lnc)
        self._spread = _distributed.spread(self._torus.size, comm, placement, self.name)

    @property
    def ultraservers(self) -> int:
        return self._torus.servers
