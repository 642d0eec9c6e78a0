"""Running an NKI kernel on the emulated NeuronCore(s): the launch (``Launch``: grid, LNC, HBM
inputs and outputs), one physical core's state during it (``Core``: its machine, allocations,
the pending result of the last language-level call, loop bookkeeping) and the lowering of the
``nki.language`` operations onto machine instructions.

Every ``nl``/``nisa`` call becomes calls on the current ``Core``; every instruction is one call
into the Rust machine (``trn2core._core.Machine``), which computes its bits and records it for
the timeline. Tensors are handles (``_tensor.NkiTensor``), never copies of device memory.

Pending results: a language-level call (``nl.exp(x)``, ``nl.matmul(a, b)``, legacy ``nisa``
calls that return a tile) does not issue at once; its instruction is kept as the core's one
pending result and issued, into a fresh tile, before the next instruction or when the result is
first read. An assignment ``t[...] = nl.exp(x)`` issues it straight into ``t``, and
``psum += nl.matmul(a, b)`` becomes one ``nc_matmul`` accumulating into ``psum``, as the NKI
compiler lowers them.
"""

from __future__ import annotations

import builtins
import collections
import ctypes
import dataclasses
import inspect
import itertools
import math
import os
import threading
import weakref

import numpy as np

from .. import _core
from .._names import ACTIVATION_FUNCTIONS
from ..errors import CapacityError, ShapeError, Trn2Error, Trn2ValueError
from . import _dtypes as D
from ._api import STATE, _own, api, relocate, user_location
from ._index import (
    IndexExpr,
    Mask,
    NotSupportedError,
    broadcast_equal_ranks,
    grid_of,
    is_int,
    var_axis,
)
from ._ranks import RankGroup
from ._register import VirtualRegister
from ._rendezvous import POLL_S, Rendezvous, RendezvousError
from ._tensor import (
    HBM,
    MAX_AP_FREE,
    PRIVATE_HBM,
    PSUM,
    SBUF,
    SHARED_HBM,
    Blocks,
    Buffer,
    Dynamic,
    FuncBlocks,
    LazyBlocks,
    NkiTensor,
    OutOfBoundsError,
    Placement,
    Spilled,
    Split,
    VectorOffset,
    _Whole,
)

_PMAX = 128


def current() -> Core:
    """The core of the running kernel, or an error outside a kernel."""
    c = STATE.core
    if c is None:
        raise KernelError(
            "nki.language / nki.isa calls run inside a kernel: decorate the function with "
            "@nki.jit and call it with numpy arrays (or use trn2core.nki.run)"
        )
    return c


class LoopCarriedDependencyError(Trn2ValueError):
    """An instruction in an ``affine_range`` iteration reads what an earlier iteration wrote."""


class KernelError(Trn2ValueError):
    """A kernel broke an NKI rule that is not one of the machine's (wrong arguments, outputs)."""


class _Alloc:
    """Owns one on-chip machine tensor; frees it when the last handle goes (Python's
    reference counting stands for the compiler's liveness analysis). A current-dialect
    tensor the allocator placed also records when it was made (``born``: twice the machine's
    instruction count then, and its place among the tensors made before it): when a
    declaration does not fit, the least recently used such tensors (the last instruction
    that touched each, or its birth) make room (``Core.fit``): in SBUF they are spilled to
    HBM (``slot``, kept for later spills; ``m`` is ``None`` while the tensor is out) and
    reloaded when used again, in PSUM they give their storage up, and a later use of one is
    the machine's ``CapacityError``. ``handles``: weak references to the tensors holding the
    whole ``tile`` (they are pointed at the reloaded tile)."""

    __slots__ = (
        "m", "tile", "init", "born", "name", "slot", "hm", "handles", "shape", "dtype", "used",
        "ref", "pool", "__weakref__",
    )  # fmt: skip

    def __init__(self, m, tile, init=None, born=None, name="") -> None:
        self.m = m
        self.tile = tile
        self.init = init
        self.born = born
        self.name = name
        self.slot = None  # the HBM spill slot (current-dialect SBUF tensors spilled once)
        self.hm = None  # the machine of ``slot``
        self.handles = None
        self.used = -1  # the last instruction known to have touched it (``Core.fit``)
        self.ref = None  # a weak reference to it, in ``Core.lru`` while it holds storage
        self.pool = None  # where ``slot`` goes when it dies (``Core.spill_slots``), if anywhere

    def release(self) -> None:
        """Frees the tensor now (a released block of a ``LazyBlocks`` array)."""
        m, self.m = self.m, None
        if m is not None:
            m.free(self.tile)

    def __del__(self) -> None:
        try:
            if self.m is not None:
                self.m.free(self.tile)
            if self.slot is not None:
                if self.pool is not None:
                    self.pool.append(self.slot)  # for the next spill of its shape
                else:
                    self.hm.free(self.slot)
        except Exception:  # noqa: S110 - the machine may be gone at interpreter exit
            pass


def _recency(o: _Alloc) -> tuple:
    """The order of ``Core.fit``'s victims: last use (instruction ``i`` is ``2 i + 1``) or
    birth (``2 n``, before instruction ``n``), the later; then birth."""
    return (max((2 * o.used + 1, -1), o.born), o.born)


class _SpillingMachine:
    """``Core.m`` once a current-dialect tensor has been spilled: the machine, whose calls
    that fail with a ``CapacityError`` are made once more when some of their tiles belong to
    spilled tensors (a view made before the spill; an operand spilled to make room while
    another operand of the same call was reloaded): ``Core.recover`` brings those tensors
    back, together with the call's other tensors, and moves the tiles with them. Kernels
    that never spill never meet it."""

    def __init__(self, core: Core, raw) -> None:
        self._core = weakref.ref(core)
        self._raw = raw

    def __getattr__(self, name: str):
        fn = getattr(self._raw, name)
        if not callable(fn):
            return fn
        core = self._core

        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except CapacityError:
                c = core()
                fixed = c.recover(args, kwargs) if c is not None else None
                if fixed is None:
                    raise
                return fn(*fixed[0], **fixed[1])

        self.__dict__[name] = call
        return call


def scalar_arg(x, arg: str):
    """A scalar operand for the machine: a tile ([P, 1] fp32) or a float."""
    if isinstance(x, NkiTensor):
        return x.tile
    if isinstance(x, (bool, np.bool_)):
        return float(x)
    if isinstance(x, (int, float, np.integer, np.floating)):
        return float(x)
    raise Trn2ValueError(
        f"{arg}: expected a number or a [P, 1] tile, got {type(x).__name__}", arg=arg
    )


_ASSOCIATIVE = set(
    "add multiply maximum minimum bitwise_and bitwise_or bitwise_xor logical_and logical_or"
    " logical_xor".split()
)
_COMPARE = set(
    "equal not_equal greater greater_equal less less_equal logical_and logical_or"
    " logical_xor".split()
)


#: ``nl`` functions lowered to several instructions (``Core.composite``).
_COMPOSITE = ("floor", "ceil", "trunc", "cos", "tan")


class Loop:
    """A legacy ``affine_range`` loop being run: its iterations' first instructions."""

    __slots__ = ("core", "starts", "range")

    def __init__(self, core: Core, rng: range) -> None:
        self.core = core
        self.range = rng
        self.starts: list[int] = []

    def __iter__(self):
        core = self.core
        core.loops.append(self)
        try:
            for i in self.range:
                core.flush()
                self.starts.append(core.m.instructions)
                yield i
            core.flush()
        finally:
            if core.loops and core.loops[-1] is self:
                core.loops.pop()
        core.check_loop(self)


def _reload_error(name: str, e: Exception) -> CapacityError:
    """The ``CapacityError`` of a spilled tensor that cannot be reloaded: the allocation's
    error ``e``, and why."""
    error = CapacityError(
        f"{name}: reloading it from its HBM spill slot: {e} (the tensors in use at once need "
        "more SBUF than there is: docs/nki.md, current-dialect liveness)"
    )
    error.rule = "sbuf_capacity"
    return error


class Core:
    """One physical NeuronCore while a kernel runs on it (see the module doc)."""

    def __init__(self, launch: Launch, index: int) -> None:
        self.launch = launch
        self.index = index
        self.m = _core.Machine(launch.uninitialized, "nearest_even", 0)
        #: The machine itself (``m`` becomes a ``_SpillingMachine`` over it at a first spill).
        self.machine = self.m
        # Kernels' explicit SBUF allocations count from address 0 up (nki-library's
        # SbufManager, the legacy mod_alloc's base_addr); the tensors the front end places
        # itself go from the top down, clear of them, as the compiler's allocator keeps its own.
        self.m.set_sbuf_fit_from_top(True)
        self.pending: NkiTensor | None = None
        self.pend_fn = None
        self.pend_kind: tuple | None = None
        self.pend_loc: tuple[str, int] | None = None
        self.pend_at: int | None = None
        self.names = itertools.count()
        self.loops: list[Loop] = []
        #: The location id ``issue`` stamps on instructions now (``here``), ``None``: none.
        self.loc: int | None = None
        #: Each location id's ``(file, line)``.
        self.locs: list[tuple[str, int]] = []
        #: ``id`` of each code object met -> (the code, kept alive so its ``id`` stays its
        #: own; ``None`` for trn2core's own code, else its location id per bytecode offset).
        self.codes: dict[int, tuple[object, dict[int, int] | None]] = {}
        #: The user code ``here`` last found, and its location ids by bytecode offset.
        self.code: object = None
        self.at: dict[int, int] = {}
        self.accum: set[int] = set()
        self.last_inplace: tuple[object, int] | None = None
        # The last gathered copies of ``Split`` views: a view read inline (``f(v[...].tile)``)
        # is gone before its instruction is issued; its copy must not be.
        self.held: collections.deque = collections.deque(maxlen=8)
        self.program: tuple[int, ...] = ()
        #: The running program's position in the grid's order.
        self.seq = 0
        self.shared_seq = 0
        self.hbm_inputs: list[NkiTensor] = []
        #: id of each host-data HBM tensor -> (tensor, the bytes it was made with).
        self.packed: dict[int, tuple[NkiTensor, np.ndarray]] = {}
        #: Explicitly placed PSUM regions -> the tensor block that last wrote a matmul there.
        self.holders: dict = {}
        #: Live blocks of ``LazyBlocks`` arrays, least recently used first.
        self.lazy_lru: collections.OrderedDict = collections.OrderedDict()
        #: The current dialect's tensors the allocator placed that hold storage, by memory
        #: (``fit`` picks the least recently used: the machine's record says when each was
        #: last used): by tensor key; least recently used first (birth -> weak reference,
        #: as ``fit`` last ordered them); made or reloaded since.
        self.placed = {"sbuf": weakref.WeakValueDictionary(), "psum": weakref.WeakValueDictionary()}
        self.lru: dict[str, dict] = {"sbuf": {}, "psum": {}}
        self.fresh: dict[str, list] = {"sbuf": [], "psum": []}
        self.fresh_cap = 1024
        #: By memory, the instructions before which ``fit`` has looked for the uses of those
        #: tensors (each ``_Alloc.used``).
        self.scanned = {"sbuf": 0, "psum": 0}
        self.births = itertools.count()
        #: The tensor key of each whole tile spilled -> (weak reference to its ``_Alloc``,
        #: that tile): tiles made from it before the spill are moved to the reloaded tensor.
        self.moved: dict = {}
        #: Spill slots of dead current-dialect tensors, by (shape, dtype): the next spill of a
        #: tensor of that shape takes one instead of a new HBM tensor (each spill writes its
        #: slot whole: the bytes already there are another tensor's, never taken for its own).
        self.spill_slots: dict[tuple, list] = {}

    def release(self) -> None:
        """Drops what refers back to this core (see ``Launch._release``)."""
        self.pending = self.pend_fn = self.pend_kind = None
        self.hbm_inputs = []
        self.packed = {}
        self.loops = []
        self.last_inplace = None
        self.lazy_lru = collections.OrderedDict()
        self.moved = {}
        self.spill_slots = {}
        self.launch = None

    # ------------------------------------------------------------ allocation
    def name(self, name: str, prefix: str) -> str:
        return name or f"{prefix}{next(self.names)}"

    def alloc(
        self,
        shape,
        dtype,
        buffer: Buffer,
        pdim: int | None = 0,
        name: str = "",
        init=None,
        place: Placement | None = None,
        flat: bool = False,
    ) -> NkiTensor:
        """A new tensor (uninitialised); ``place``: where the kernel put it (explicit
        allocation), else the allocator's first fit. ``flat``: an on-chip temporary of the
        front end (an instruction's result, a gathered ``Split`` view) of more free axes than
        a tensor holds is laid out as one free axis, row-major (read and written whole)."""
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise ShapeError(f"shape: every dimension must be positive, got {shape}")
        if buffer.space == "hbm":
            if len(shape) > 5:
                raise ShapeError(f"shape: at most 5 dimensions, got {shape}")
            if buffer is SHARED_HBM:
                return self._shared(shape, dtype, name)
            tile = self.m.hbm_tensor(
                self.name(name, "hbm"), list(shape), D.machine_name(dtype), None
            )
            self.launch.created[id(tile)] = (tile, *user_location())
            return NkiTensor(tile, shape, None, dtype, buffer, self, None, name)
        pdim = 0 if pdim is None else pdim
        if len(shape) < 2:
            shape = (*shape, 1) if pdim == 0 else shape
        p = shape[pdim]
        if p > _PMAX:
            from ._tensor import PartitionDimError

            raise PartitionDimError(
                f"shape: the partition dimension is {p}, over the {_PMAX} partitions of "
                f"{buffer.name.upper()} (nl.tile_size.pmax) [rule partition_dim]",
                arg="shape",
                rule="partition_dim",
            )
        mshape = [p] + [s for a, s in enumerate(shape) if a != pdim]
        if len(mshape) > 5 and flat and pdim == 0:
            mshape = [p, math.prod(mshape[1:])]
        if len(mshape) > 5:
            raise ShapeError(f"shape: at most 4 free dimensions, got {shape}")
        if place is not None:
            return self._placed(shape, dtype, buffer, pdim, name, place)
        mname = self.name(name, buffer.space)
        # Legacy block arrays (axes before the partition axis) in PSUM, and in SBUF when they
        # do not fit whole: the compiler gives each block storage while it is live.
        lazy_ok = pdim > 0 and init is None and self.launch.dialect == "legacy"
        if lazy_ok and buffer is PSUM:
            return self._lazy(shape, dtype, buffer, pdim, mname, name, None)
        if self.launch.dialect == "legacy" and not lazy_ok:
            tile = self.alloc_evicting(mshape, dtype, buffer, mname)
        else:
            try:
                tile = self.m.alloc(mshape, D.machine_name(dtype), buffer.space, mname, 0, None)
            except CapacityError as e:
                if lazy_ok:
                    return self._lazy(shape, dtype, buffer, pdim, mname, name, e)
                if self.launch.dialect == "legacy":
                    raise
                tile = self.fit(mshape, dtype, buffer, mname, e)
            if self.launch.dialect != "legacy":
                # Born before the next instruction (2 n; the use by instruction i is 2 i + 1),
                # after the tensors made before it.
                born = (2 * self.m.instructions, next(self.births))
                owner = _Alloc(self.machine, tile, init, born, mname)
                lru = self.lru[buffer.space]
                owner.ref = weakref.ref(owner, lambda _, b=born, lru=lru: lru.pop(b, None))
                self.placed[buffer.space][tile.tensor_key] = owner
                fresh = self.fresh[buffer.space]
                fresh.append(owner.ref)
                if len(fresh) > self.fresh_cap:  # a kernel that never spills: drop the dead
                    fresh[:] = [r for r in fresh if r() is not None]
                    self.fresh_cap = max(1024, 2 * len(fresh))
                t = NkiTensor(tile, shape, pdim, dtype, buffer, self, owner, name)
                if buffer is SBUF:  # may be spilled: its handles follow it
                    owner.shape, owner.dtype = mshape, dtype
                    owner.handles = [weakref.ref(t)]
                return t
        owner = _Alloc(self.m, tile, init)
        return NkiTensor(tile, shape, pdim, dtype, buffer, self, owner, name)

    def fit(self, mshape, dtype, buffer: Buffer, name: str, error, pinned=()):
        """A current-dialect tensor that does not fit (``error``; ``None``: a reload, whose
        error is made here): the compiler reuses the memory of a tensor after its last use,
        and spills a live one to HBM when the memory is short; a running trace cannot know
        which tensor is live, so the least recently used tensors the allocator placed in that
        memory (not those in ``pinned``) make room until it fits: SBUF tensors are spilled
        (``spill``: reloaded when used again), PSUM tensors give their storage up (a later
        use of one is a ``CapacityError`` naming both). The error when it does not fit even
        then."""
        self.flush()
        mdtype = D.machine_name(dtype)
        reload = error is None
        # A reload tries where there is room; its error (a failed allocation's message names
        # the free bytes and largest tensors, which takes a while to gather) is made only if
        # nothing makes room (``_reload_error``).
        if reload:
            tile = self.machine.alloc_if_room(mshape, mdtype, buffer.space, name)
            if tile is not None:
                return tile
        # Least recently used first: by last use (the last recorded instruction that touched
        # the tensor's bytes), or birth if later; ties (tensors last used by one instruction)
        # by birth. ``lru`` is that order as of ``scanned``: the tensors touched since and
        # those made or reloaded since come after all the others, in their own order (a use
        # found before ``scanned`` stays a tensor's last until a later one; a tensor reloaded
        # since has new bytes, first touched by its reload, after all it had; one made since
        # was born after the other tensors and any earlier use of its bytes).
        space = buffer.space
        placed, lru = self.placed[space], self.lru[space]
        since, now = self.scanned[space], self.m.instructions
        moved = {}
        if since < now:
            for key, u in self.m.touched_since(space, since):
                o = placed.get(key)
                if o is not None and o.m is not None:
                    o.used = u
                    moved[o.born] = o
        for ref in self.fresh[space]:
            o = ref()
            if o is not None and o.m is not None:
                moved[o.born] = o
        self.fresh[space] = []
        self.scanned[space] = now
        for o in sorted(moved.values(), key=_recency):
            lru.pop(o.born, None)
            lru[o.born] = o.ref
        file, line = user_location()
        where = f"{name} at {os.path.basename(file)}:{line}"
        for ref in list(lru.values()):
            victim = ref()
            if victim is None or victim.m is None or victim in pinned:
                continue
            if buffer is SBUF:
                self.spill(victim, where)
            else:
                gone = (
                    f"{victim.name}: used after its storage was given to {where} (the least "
                    "recently used tensors give their PSUM up when a declaration does not "
                    "fit): the tensors in use at once need more than there is (docs/nki.md, "
                    "current-dialect liveness)"
                )
                self.forget(victim, "psum")
                m, victim.m = victim.m, None
                m.give_up(victim.tile, gone, "psum_capacity")
            # (``None``: the CapacityError the allocation would raise, not made.)
            tile = self.machine.alloc_if_room(mshape, mdtype, space, name)
            if tile is not None:
                return tile
        if error is None:  # a reload that never found room: the allocation's own error
            try:
                return self.m.alloc(mshape, mdtype, space, name, 0, None)
            except CapacityError as e:
                error = _reload_error(name, e)
        raise error

    def spill_out(self, tile, slot, name: str, mshape, dtype, timed: bool = True):
        """Stores the whole SBUF tensor of ``tile`` to its spill slot ``slot`` (made now when
        ``None``, an HBM tensor of ``name`` + " spill"): one ``dma_copy``-priced DMA, counted
        as a spill; ``timed=False``: the bytes only, the DMA recorded by ``spill_in`` if the
        tensor is used again. Returns the slot. The legacy block arrays and the current
        dialect's tensors share it (``lazy_give_up``, ``spill``)."""
        m = self.machine
        if slot is None:
            slot = m.hbm_tensor(f"{name} spill", mshape, D.machine_name(dtype), None)
        if timed:
            m.dma_spill(slot, tile, self.loc)
        else:
            m.spill_move(slot, tile)
        return slot

    def spill_in(self, tile, slot, stored: bool = True) -> None:
        """Loads spill slot ``slot`` back into the SBUF tensor of ``tile`` (a DMA of the same
        size; values and which bytes were written come back as they were). ``stored=False``:
        the store was not recorded (``spill_out(timed=False)``): its DMA is recorded now,
        before the load (both move the same bytes)."""
        m = self.machine
        if stored:
            m.dma_spill(tile, slot, self.loc)
        else:
            m.spill_reload(tile, slot, self.loc)

    def forget(self, owner: _Alloc, space: str) -> None:
        """``owner``, placed in ``space``, gives its storage up: out of ``placed`` and
        ``lru`` until reloaded (``fit``)."""
        self.placed[space].pop(owner.tile.tensor_key, None)
        self.lru[space].pop(owner.born, None)

    def spill(self, victim: _Alloc, where: str) -> None:
        """Spills a current-dialect SBUF tensor the allocator placed (``fit``): its bytes to
        its spill slot, its storage given up (a tile of it used before it is reloaded, by a
        machine call not made again by ``_SpillingMachine``, is a ``CapacityError`` saying
        so), its handles pointed at a ``Spilled`` marker (their next use reloads it). The
        store's DMA is recorded only if the tensor is used again, just before its reload
        (``reload``): the compiler stores only live tensors, and a dead tensor kept by a
        handle (a variable rebound in the next loop iteration) is never reloaded."""
        tile = victim.tile
        self.forget(victim, "sbuf")
        if victim.pool is None:
            key = (tuple(victim.shape), D.machine_name(victim.dtype))
            victim.pool = self.spill_slots.setdefault(key, [])
            if victim.pool:
                victim.slot = victim.pool.pop()
        victim.slot = self.spill_out(
            tile, victim.slot, victim.name, victim.shape, victim.dtype, timed=False
        )
        victim.hm = self.machine
        self.moved[tile.tensor_key] = (weakref.ref(victim), tile)
        gone = (
            f"{victim.name}: used while spilled to HBM to make room for {where} (the least "
            "recently used tensors are spilled when a declaration does not fit, and reloaded "
            "when used again): the tensors in use at once need more than there is "
            "(docs/nki.md, current-dialect liveness)"
        )
        m, victim.m = victim.m, None
        m.give_up(tile, gone, "sbuf_capacity")
        mark = Spilled(victim)
        alive = []
        for ref in victim.handles or ():
            h = ref()
            if h is not None and h._t is tile:
                h._t = mark
                alive.append(ref)
        victim.handles = alive
        if type(self.m) is not _SpillingMachine:
            self.m = _SpillingMachine(self, self.machine)

    def reload(self, owner: _Alloc, pinned=()) -> None:
        """Brings a spilled tensor back (``fit``: possibly spilling others, not ``pinned``):
        new storage, its spill slot loaded into it, its handles given the new tile."""
        tile = self.fit(owner.shape, owner.dtype, SBUF, owner.name, None, pinned)
        self.spill_in(tile, owner.slot, stored=False)
        owner.tile, owner.m = tile, self.machine
        self.placed["sbuf"][tile.tensor_key] = owner
        self.fresh["sbuf"].append(owner.ref)
        for ref in owner.handles or ():
            h = ref()
            if h is not None and type(h._t) is Spilled and h._t.owner is owner:
                h._t = tile

    def recover(self, args: tuple, kwargs: dict):
        """A machine call failed (``_SpillingMachine``): when some of its tiles belong to
        spilled tensors, those are reloaded (not spilling the call's other tensors) and the
        tiles moved to them; the arguments to call with again, or ``None``."""
        stale: dict = {}
        keys = set()

        def scan(v) -> None:
            if type(v) is _core.Tile:
                k = v.tensor_key
                keys.add(k)
                hit = self.moved.get(k)
                if hit is not None and hit[0]() is not None:
                    stale[k] = hit
            elif type(v) in (list, tuple):
                for x in v:
                    scan(x)

        for v in (*args, *kwargs.values()):
            scan(v)
        if not stale:
            return None
        owners = {k: ref() for k, (ref, _) in stale.items()}
        placed = self.placed["sbuf"]
        pinned = {o for k in keys if (o := placed.get(k)) is not None and o.m is not None}
        pinned.update(owners.values())
        for o in owners.values():
            if o.m is None:
                self.reload(o, pinned)

        def move(v):
            if type(v) is _core.Tile:
                hit = stale.get(v.tensor_key)
                return v if hit is None else v.moved(hit[1], hit[0]().tile)
            if type(v) in (list, tuple):
                return type(v)(move(x) for x in v)
            return v

        return [move(v) for v in args], {k: move(v) for k, v in kwargs.items()}

    def _lazy(self, shape, dtype, buffer, pdim, mname, name, error) -> NkiTensor:
        p = shape[pdim]
        mshape = [p, *shape[pdim + 1 :]] if len(shape) > pdim + 1 else [p, 1]
        lazy = LazyBlocks(self, pdim, mshape, dtype, buffer, mname, error)
        t = NkiTensor(_Whole(lazy), shape, pdim, dtype, buffer, self, None, name)
        t._blocks = lazy
        return t

    def lazy_whole(self, t: NkiTensor) -> None:
        """A ``LazyBlocks`` array accessed across blocks before any block had storage: the
        whole array, allocated now (``CapacityError`` if it does not fit)."""
        lazy = t._blocks
        p = t._pdim
        mshape = [t.shape[p]] + [s for a, s in enumerate(t.shape) if a != p]
        tile = self.m.alloc(mshape, D.machine_name(t.dtype), t.buffer.space, lazy.name, 0, None)
        t._t, t._owner, t._blocks = tile, _Alloc(self.m, tile, None), None

    def lazy_block(self, lazy: LazyBlocks, idx: tuple) -> NkiTensor:
        """Block ``idx`` of a ``LazyBlocks`` array (a ``(P, F...)`` tensor): its storage, made
        when first used; when memory is short, the least recently used block of such arrays
        in the same memory gives its storage up first (``lazy_give_up``). A block spilled to
        HBM comes back with a reload; reading a released PSUM block is a ``CapacityError``."""
        key = (lazy.uid, idx)
        owner = lazy.live.get(idx)
        if owner is None:
            if idx in lazy.released and not lazy.writing:
                raise CapacityError(
                    f"{lazy.name}: block {idx} was released to make room for other blocks "
                    "and is read again: the blocks live at once need more PSUM than there is "
                    "(PSUM is not a DMA endpoint, so trn2core spills SBUF blocks only: "
                    "docs/nki.md, legacy liveness)"
                )
            tile = self.alloc_evicting(
                lazy.mshape, lazy.dtype, lazy.buffer, f"{lazy.name}{list(idx)}"
            )
            owner = _Alloc(self.m, tile, None)
            lazy.live[idx] = owner
            lazy.released.discard(idx)
            if idx in lazy.spilled:
                self.spill_in(tile, lazy.spilled[idx])
        self.lazy_lru[key] = lazy
        self.lazy_lru.move_to_end(key)
        shape = (lazy.mshape[0], *lazy.mshape[1:]) if len(lazy.mshape) > 1 else lazy.mshape
        return NkiTensor(owner.tile, shape, 0, lazy.dtype, lazy.buffer, self, owner, lazy.name)

    def alloc_evicting(self, mshape, dtype, buffer: Buffer, name: str):
        """A machine tensor (first fit) in the legacy dialect: when memory is short, the least
        recently used block of ``LazyBlocks`` arrays in that memory gives its storage up
        (``lazy_give_up``) until the tensor fits; a ``CapacityError`` when none is left."""
        while True:
            try:
                return self.m.alloc(mshape, D.machine_name(dtype), buffer.space, name, 0, None)
            except CapacityError:
                victim = next(
                    (k for k, other in self.lazy_lru.items() if other.buffer is buffer), None
                )
                if victim is None:
                    raise
                self.lazy_give_up(self.lazy_lru.pop(victim), victim[1])

    def lazy_give_up(self, lazy: LazyBlocks, idx: tuple) -> None:
        """Frees the storage of block ``idx`` of a ``LazyBlocks`` array; in SBUF its bytes are
        spilled to an HBM tensor of their own first (the block's spill slot, kept for later
        spills), as the compiler spills a live tile it needs the memory of."""
        owner = lazy.live.pop(idx)
        if lazy.buffer is SBUF:
            lazy.spilled[idx] = self.spill_out(
                owner.tile, lazy.spilled.get(idx), f"{lazy.name}{list(idx)}", lazy.mshape,
                lazy.dtype,
            )  # fmt: skip
        else:
            lazy.released.add(idx)
        owner.release()

    def _placed(
        self, shape, dtype, buffer: Buffer, pdim: int, name: str, place: Placement
    ) -> NkiTensor:
        """A tensor where the kernel placed it (``Placement``): the block axes (those before
        the partition axis) on their physical tiles, ``tiles[k]`` for axis ``k`` (block ``i``
        in tile ``i % tiles[k]``), tiles one after another from the address (PSUM
        ``mod_alloc``: one bank apart). The machine tensor is an overlay: placements that
        share bytes are the same memory, as on the chip."""
        nblock = pdim
        blocks, tile_dims = shape[:pdim], shape[pdim + 1 :]
        if place.func is not None:
            bshape = (shape[pdim], *tile_dims)
            name = self.name(name, buffer.space)
            fb = FuncBlocks(nblock, bshape, dtype, buffer, name, place)
            if nblock == 0:
                return self.func_block(fb, ())
            t = NkiTensor(fb, shape, pdim, dtype, buffer, self, None, name)
            t._blocks = fb
            return t
        tiles = place.tiles
        if nblock == 0:
            tiles = ()  # one tile: the whole tensor (a count given for it is its own)
        elif not tiles:
            tiles = (1,) * nblock
        elif len(tiles) != nblock:
            raise Trn2ValueError(
                f"num_free_tiles: {len(tiles)} tile counts for the {nblock} block axes of "
                f"{shape} (one per axis before the partition axis, or none)",
                arg="num_free_tiles",
            )
        n = [min(t, b) for t, b in zip(tiles, blocks, strict=True)]
        free = math.prod(tile_dims)
        esize = dtype.itemsize
        step = free
        if place.bank_tiles and nblock:
            bank = 2048 // esize
            step = -(-free // bank) * bank
        count = math.prod(n)
        total = step * (count - 1) + free if count else free
        name = self.name(name, buffer.space)
        tile = self.m.alloc(
            [shape[pdim], total],
            D.machine_name(dtype),
            buffer.space,
            name,
            place.partition,
            place.address,
            True,
        )
        dims = [*n, *tile_dims]
        if step != free:  # PSUM tiles one bank apart
            pattern, st = [], free
            for d in reversed(tile_dims):
                st //= d
                pattern.insert(0, (st, d))
            bpat, st = [], step * count
            for k in n:
                st //= k
                bpat.append((st, k))
            tile = tile.ap(bpat + pattern, 0)
        elif len(dims) > 1:
            tile = tile.reshape_free(dims)
        owner = _Alloc(self.m, tile, None)
        t = NkiTensor(tile, shape, pdim, dtype, buffer, self, owner, name)
        t._blocks = Blocks(n, place.address)
        return t

    def func_block(self, fb: FuncBlocks, idx: tuple) -> NkiTensor:
        """Block ``idx`` of a tensor placed by ``alloc(func)``: a placed tensor at
        ``func(idx=, pdim_size=, fdim_size=)`` (its partitions and bytes per partition; called
        by keyword, as kernels bind the function's other parameters with functools.partial)
        (SBUF: ``(start partition, byte)``;
        PSUM: ``(bank, start partition, byte in the bank)``), made on first use."""
        t = fb.cache.get(idx)
        if t is not None:
            return t
        p = fb.shape[0]
        nbytes = math.prod(fb.shape[1:]) * fb.dtype.itemsize
        what = fb.place.what
        try:
            at = fb.place.func(idx=idx, pdim_size=p, fdim_size=nbytes)
        except Trn2Error:
            raise
        except Exception as e:
            raise Trn2ValueError(
                f"{what}: the placement function failed for block {idx}: {type(e).__name__}: {e}",
                arg="func",
            ) from e
        want = 3 if fb.buffer is PSUM else 2
        ok = isinstance(at, (tuple, list)) and len(at) == want
        ok = ok and all(is_int(v) and int(v) >= 0 for v in at)
        if not ok:
            form = "(bank, start partition, byte)" if want == 3 else "(start partition, byte)"
            raise Trn2ValueError(
                f"{what}: the placement function returned {at!r} for block {idx}; expected "
                f"{form}, non-negative integers",
                arg="func",
            )
        if want == 3:
            bank, part, byte = (int(v) for v in at)
            if bank >= 8:
                raise Trn2ValueError(
                    f"{what}: bank {bank} for block {idx}; PSUM has banks 0..7", arg="func"
                )
            address = bank * 2048 + byte
        else:
            part, address = (int(v) for v in at)
        place = Placement(fb.buffer, part, address, (), False, what)
        t = self._placed(fb.shape, fb.dtype, fb.buffer, 0, f"{fb.name}{list(idx)}", place)
        fb.cache[idx] = t
        return t

    def block_fresh(self, target: NkiTensor) -> bool:
        """For a matmul into ``target``, a PSUM tile (or block) of an explicitly placed
        tensor: whether its bytes last held a matmul result of another tensor or block (the
        tile then starts its own accumulation: accumulate=False, as the compiler begins each
        tile's accumulation group); notes ``target`` as their holder. Placed tensors share
        bytes, so the machine's record of matmul-written PSUM is not enough."""
        b = target._blocks
        if b is None or target.buffer is not PSUM:
            return False
        blocks, logical = (b, ()) if type(b) is Blocks else b
        t = target.tile
        at = blocks.address + t.offset * target.dtype.itemsize
        key = (t.start_partition, t.shape[0], at, tuple(t.pattern))
        mine = (blocks.uid, logical)
        before = self.holders.get(key)
        self.holders[key] = mine
        return before != mine

    def _shared(self, shape, dtype, name) -> NkiTensor:
        """The ``j``-th ``shared_hbm`` tensor of this program: the same tensor in every program
        of the launch (shared HBM is "visible to all kernel instances")."""
        j = self.shared_seq
        self.shared_seq += 1
        table = self.launch.shared[self.index]
        if j < len(table):
            t = table[j]
            if t.shape != shape or t.dtype != dtype:
                raise KernelError(
                    f"shared_hbm tensor #{j}: program {self.program} declares {shape} "
                    f"{dtype}, an earlier program {t.shape} {t.dtype}; every program must "
                    "declare the same shared tensors in the same order"
                )
            return t
        tile = self.m.hbm_tensor(self.name(name, "out"), list(shape), D.machine_name(dtype), None)
        if self.launch.lnc == 2:
            # The two cores' writes are ordered by when they ran (``Launch._merge``).
            self.m.track_writers(tile)
        self.launch.created[id(tile)] = (tile, *user_location())
        t = NkiTensor(tile, shape, None, dtype, SHARED_HBM, self, None, name)
        t._shared = j
        table.append(t)
        return t

    def written_parts(self, st: NkiTensor) -> list[tuple[int, int, np.ndarray]]:
        """``(lo, hi, bytes)`` of each byte range of the HBM storage ``st`` (a whole tensor)
        this core has written."""
        flat = st.tile.rows(1, 0).ap([(1, st.size)], 0)
        es = st.dtype.itemsize
        return [
            (lo, hi, self.m.read(flat.ap([(1, (hi - lo) // es)], lo // es)).view(np.uint8))
            for lo, hi in self.m.written_ranges(st.tile)
        ]

    def written_bytes(self, st: NkiTensor, times=None) -> WrittenBytes:
        """This core's copy of the HBM storage ``st`` (a whole tensor): every byte, which of
        them it has written, and the instruction that last wrote each, whose times
        (``WrittenBytes.when``) come from ``times`` (the timeline's ``(start, end)`` arrays),
        scheduled when first asked for when not given."""
        nbytes = st.size * st.dtype.itemsize
        vals = np.zeros(nbytes, np.uint8)
        seen = np.zeros(nbytes, bool)
        for lo, hi, part in self.written_parts(st):
            vals[lo:hi] = part
            seen[lo:hi] = True
        if times is not None:
            return WrittenBytes(self.index, vals, seen, self.m.writers(st.tile), times)
        # The launch's merge, on this thread: the writers and times only if asked for.
        m, tile = self.m, st.tile

        def times():
            r = m.run(0).times()
            return np.asarray(r["start"]), np.asarray(r["end"])

        return WrittenBytes(self.index, vals, seen, lambda: m.writers(tile), times)

    def write_parts(self, st: NkiTensor, parts) -> None:
        """Writes ``written_parts`` of another core's copy of ``st`` into this core's (outside
        any instruction: the bytes the other core's writes left there)."""
        flat = st.tile.rows(1, 0).ap([(1, st.size)], 0)
        es = st.dtype.itemsize
        for lo, hi, part in parts:
            self.m.write(flat.ap([(1, (hi - lo) // es)], lo // es), part)

    def constant(self, array: np.ndarray, name: str = "") -> NkiTensor:
        """An HBM tensor holding host data (inputs, ``shared_constant``)."""
        # Either byte order: the values count (contract section 8 accepts byte-swapped arrays).
        dt = D.as_dtype(array.dtype.newbyteorder("="), name or "constant")
        mname = D.machine_name(dt)
        host = np.ascontiguousarray(array.astype(D.HOST_DTYPE[mname], copy=False))
        shape = host.shape or (1,)
        if len(shape) > 5:
            raise ShapeError(f"an NKI tensor has at most 5 dimensions, got {host.shape}")
        packed = host.reshape(-1).view(np.uint8)
        tile = self.m.hbm_tensor(self.name(name, "in"), list(shape), mname, packed)
        t = NkiTensor(tile, shape, None, dt, SHARED_HBM, self, None, name)
        t._arg = id(t)  # not ``t`` itself: a cycle would keep the core alive until a GC pass
        self.packed[id(t)] = (t, packed)  # the bytes it started with (``Launch._write_back``)
        return t

    # ------------------------------------------------------------ pending results
    def pend(self, shape, dtype, buffer: Buffer, fn, kind=None) -> NkiTensor:
        """A result whose instruction ``fn(dst)`` is issued later (module doc)."""
        self.flush()
        t = NkiTensor(None, tuple(shape), 0, dtype, buffer, self)
        t._result = True
        self.pending = t
        self.pend_fn = fn
        self.pend_kind = kind
        # The line ``here`` stamped for the call making it (the same frame user_location finds).
        self.pend_at = self.loc
        self.pend_loc = user_location() if self.loc is None else self.locs[self.loc]
        return t

    def flush(self) -> None:
        """Issues the pending result into a fresh tile."""
        t = self.pending
        if t is None:
            return
        fn, loc, at = self.pend_fn, self.pend_loc, self.pend_at
        if self.pend_kind == ("loop_reduce",):
            self.pending = self.pend_fn = self.pend_kind = None
            raise relocate(
                Trn2ValueError(
                    "loop_reduce: its result is the tile it reduces into, so it must be "
                    "assigned there (dst[...] = nl.loop_reduce(x, op, loop_indices), or "
                    "b = nl.loop_reduce(...) with b that tile); used otherwise it has no "
                    "destination to read",
                    arg="x",
                ),
                loc,
            )
        self.pending = self.pend_fn = self.pend_kind = None
        now = self.loc
        self.loc = at  # its instruction is the line that made it, not the one flushing it
        try:
            t._adopt(self.alloc(t.shape, t.dtype, t.buffer, 0, flat=True))
            fn(t)
        except Trn2Error as e:
            raise relocate(e, loc) from None
        finally:
            self.loc = now

    def take(self, value: NkiTensor):
        """If ``value`` is the pending result, un-pend it and return its issuing function."""
        if value is self.pending:
            fn, kind = self.pend_fn, self.pend_kind
            self.pending = self.pend_fn = self.pend_kind = None
            return fn, kind
        return None, None

    def assign(self, target: NkiTensor, value) -> None:
        """``target[...] = value``: a pending result issues straight into ``target``."""
        if type(target._t) is Split:
            self.assign_parts(target, value)
            return
        if value is self.pending and self.pend_kind == ("loop_reduce",):
            # nl.loop_reduce: the destination is also its input, whatever its dtype.
            fn, _ = self.take(value)
            fn(target)
            value._adopt(target)
            value.shape, value._pdim, value.dtype = target.shape, target._pdim, target.dtype
            return
        if isinstance(value, NkiTensor):
            fn, _ = self.take(value) if value.dtype == target.dtype else (None, None)
            if fn is not None and value.buffer is PSUM and target.buffer is not PSUM:
                # A tensor-engine result assigned to SBUF (legacy `t[...] = nisa.nc_transpose
                # (x)`): the compiler places the result in PSUM and copies it over.
                self.pending, self.pend_fn = value, fn
                fn = None
            if fn is not None and value.size == target.size:
                self.block_fresh(target)
                fn(target)
                value._adopt(target)
                value.shape, value._pdim = target.shape, target._pdim
                return
            if fn is not None:
                self.pending, self.pend_fn = value, fn
            self.flush()
            valid = value._valid
            if valid and list(valid) == [0] and value.shape[0] == target.shape[0]:
                # A tile made under a mask holds its rows only (the legacy compiler carries the
                # mask through its uses): those rows are what is copied.
                rows = ({}, {0: valid[0]})
                target, value = self.masked(target, rows), self.masked(value, rows)
            self.copy_into(target, value)
            return
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise Trn2ValueError(
                f"value: a tile can be assigned a tile or a number; got "
                f"{type(value).__name__} (host arrays reach a kernel only as its arguments or "
                "through nl.shared_constant)",
                arg="value",
            )
        self.flush()
        self.issue("memset", "vector", target.tile, float(value))

    def assign_parts(self, target: NkiTensor, value) -> None:
        """``target[...] = value`` for a view of more free axes than an access pattern takes
        (``Split``): the value in a tile of its own (a number: a memset), then one copy into
        each part, converting to ``target``'s dtype."""
        self.flush()
        split = target._t
        if isinstance(value, NkiTensor):
            if value.shape != target.shape:
                raise ShapeError(
                    f"value: a {value.shape} tile assigned to a {target.shape} view [rule shape]"
                )
            src = value.tile
        elif isinstance(value, (int, float, np.integer, np.floating)):
            tmp = self.alloc(target.shape, target.dtype, SBUF, 0, flat=True)
            src = tmp.tile
            self.issue("memset", "vector", src, float(value))
        else:
            raise Trn2ValueError(
                f"value: a tile can be assigned a tile or a number; got {type(value).__name__}",
                arg="value",
            )
        # A value computed under a mask (``_valid``: the legacy compiler carries the mask of a
        # masked load through its uses) holds those rows only; they are what is stored.
        valid = value._valid if isinstance(value, NkiTensor) else None
        if valid and any(a != 0 for a in valid):
            raise NotSupportedError(
                f"value: a masked result assigned to a view of more than {MAX_AP_FREE} free axes"
            )
        flat = src.ap([(1, split.count * len(split.parts))], 0)
        split.copy(self, flat, False, valid[0] if valid else (0, target.shape[0]))

    def just_updated(self, value: NkiTensor) -> bool:
        li = self.last_inplace
        return li is not None and li[0] is value and li[1] == self.m.instructions

    # ------------------------------------------------------------ source lines
    def here(self, f) -> None:
        """Stamps the kernel line of frame ``f`` (the innermost frame from there outward that
        is not trn2core's own: a helper function's line, not its caller's) on the
        instructions issued from now on. Per call of an ``nl``/``nisa`` function, so cheap:
        code objects and bytecode offsets are looked up in dicts (a frame's ``f_lineno``
        scans its code's line table), and the line reaches the machine with each instruction
        (``issue``), not in a crossing of its own."""
        codes, first = self.codes, f
        while f is not None:
            code = f.f_code
            known = codes.get(id(code))
            if known is None:
                known = codes[id(code)] = (code, None if _own(code.co_filename) else {})
            at = known[1]
            if at is not None:
                break
            f = f.f_back
        else:
            return
        loc = at.get(f.f_lasti)
        if loc is None:
            loc = at[f.f_lasti] = self.location_id(code.co_filename, f.f_lineno or 0)
        if f is first:  # the api wrapper's shortcut applies to direct callers only
            self.code, self.at = code, at
        self.loc = loc

    def issue(self, *args, **kwargs) -> None:
        """``Machine.issue`` with the current kernel line (``loc``) stamped on the instruction,
        in the same crossing (``nisa`` calls, the hot path, make that call themselves)."""
        self.m.issue_at(self.loc, *args, **kwargs)

    def location_id(self, file: str, line: int) -> int:
        """The machine's id of ``file:line`` (``self.locs[id]`` is the pair)."""
        loc = self.m.locate(file, line)
        if loc == len(self.locs):
            self.locs.append((file, line))
        return loc

    def line_of(self, index: int) -> tuple[str, int]:
        """``(file, line)`` of recorded instruction ``index`` (``("<unknown>", 0)``: none)."""
        loc = self.m.instruction_location(index)
        return self.locs[loc] if loc is not None else ("<unknown>", 0)

    # ------------------------------------------------------------ loops

    def check_loop(self, loop: Loop) -> None:
        """Reports a read across iterations of an ``affine_range`` (module doc of
        ``trn2core.machine.loops``); associative accumulations are allowed."""
        if len(loop.starts) < 2:
            return
        pairs = self.m.carried_reads(loop.starts, self.m.instructions, 64)
        for reader, writer in pairs:
            if reader in self.accum and writer in self.accum:
                continue
            k = max(i for i, s in enumerate(loop.starts) if s <= reader)
            j = max(i for i, s in enumerate(loop.starts) if s <= writer)
            rloc, wloc = self.line_of(reader), self.line_of(writer)
            e = LoopCarriedDependencyError(
                f"{rloc[0]}:{rloc[1]}: loop-carried dependency in affine_range: iteration "
                f"{k} reads memory written by iteration {j} (at line {wloc[1]}); affine_range "
                "promises independent iterations (the compiler may reorder or overlap them; "
                "only associative accumulations such as `psum += matmul` may cross "
                "iterations): use nl.sequential_range [rule affine_range]",
                rule="affine_range",
            )
            e.nki_location = rloc  # type: ignore[attr-defined]
            raise e

    def mark_accum(self, first: int | None = None) -> None:
        """The last instruction (``first``: those issued since it) is an associative
        accumulation, allowed across iterations."""
        if self.loops:
            last = self.m.instructions
            self.accum.update(range(last - 1 if first is None else first, last))

    # ------------------------------------------------------------ helpers for lowering
    def is_int(self, t: NkiTensor) -> bool:
        return not D.is_float(t.dtype)

    def storage_row(self, t: NkiTensor) -> int:
        """Elements per partition of an on-chip tensor's storage."""
        _, _, shape, _ = self.m.tensor_info(t.tile)
        return math.prod(shape[1:])

    def mask_ranges(self, mask, ndim: int, *operands, rows=()):
        """``(variable ranges, grid-axis ranges)`` of a mask, or ``None`` if it is never
        true; ``({}, {})`` without a mask. ``operands`` made by a masked instruction
        (``_valid``) restrict the ranges to the region they hold: the legacy compiler carries
        a mask through a tile's uses (``t = nl.load(a[i], mask=m)``; ``nl.exp(t)`` computes
        where ``m`` holds), as the tutorials' rows-not-a-multiple-of-128 idiom needs."""
        if mask is None:
            ranges = ({}, {})
        elif isinstance(mask, (bool, np.bool_)):
            # A compile-time constant predicate: always (the instruction runs) or never.
            ranges = ({}, {}) if mask else None
        elif not isinstance(mask, Mask):
            raise Trn2ValueError(
                f"mask: expected comparisons of nl.arange indices (e.g. i_p < n), got {mask!r}"
            )
        else:
            iv = mask.intervals()
            if iv is None:
                return None
            ranges = iv, {var_axis(v, max(ndim, v.ndim)): r for v, r in iv.items()}
        if ranges is None:
            return None
        axes = None
        # ``rows``: operands of another shape whose partition rows the result shares.
        for o, row_only in (*((o, False) for o in operands), *((o, True) for o in rows)):
            valid = o._valid if isinstance(o, NkiTensor) else None
            if valid and row_only:
                valid = {0: valid[0]} if 0 in valid else None
            if not valid:
                continue
            axes = dict(ranges[1]) if axes is None else axes
            for a, (lo, hi) in valid.items():
                if a in axes:
                    lo, hi = builtins.max(lo, axes[a][0]), builtins.min(hi, axes[a][1])
                if lo >= hi:
                    return None
                axes[a] = (lo, hi)
        return ranges if axes is None else (ranges[0], axes)

    def pend_valid(self, t: NkiTensor, ranges, axes=None) -> NkiTensor:
        """Marks a pending result made under ``ranges`` with the region it will hold (only
        ``axes`` of the ranges when given: a reduction keeps the partition axis)."""
        if ranges is not None and ranges[1]:
            t._valid = {a: r for a, r in ranges[1].items() if axes is None or a in axes}
        return t

    def masked(self, t, ranges) -> NkiTensor:
        if not ranges[0] and not ranges[1]:
            return t
        return t.restricted(ranges[0], ranges[1])

    def free_size(self, t: NkiTensor) -> int:
        return math.prod(t.shape) // t.shape[t._pdim or 0]

    def on_chip(self, t, arg: str) -> NkiTensor:
        if not isinstance(t, NkiTensor):
            raise Trn2ValueError(f"{arg}: expected a tile, got {type(t).__name__}")
        if t._pdim is None:
            raise Trn2ValueError(
                f"{arg}: the tensor is in HBM; compute engines read SBUF or PSUM (load it "
                "first with nl.load or nisa.dma_copy) [engine rule engine_memory]",
                arg=arg,
                rule="engine_memory",
            )
        if t._pdim != 0:
            raise Trn2ValueError(
                f"{arg}: a tensor whose partition axis is not the first (par_dim at axis "
                f"{t._pdim}) is not a tile; index its block axes first (t[i])"
            )
        return t

    # ------------------------------------------------------------ language lowering
    def copy_into(self, dst: NkiTensor, src: NkiTensor) -> None:
        """One copy instruction ``dst <- src`` (DMA between HBM and SBUF, else Vector)."""
        if dst._pdim is None or src._pdim is None:
            if src.buffer is PSUM:
                src = self.evict(src)
            self.issue("dma_copy", dst.tile, src.tile, None)
        else:
            self.issue("tensor_copy", "vector", dst.tile, src.tile)

    def evict(self, src: NkiTensor) -> NkiTensor:
        """A PSUM tile copied to a new SBUF tile (DMA cannot read PSUM)."""
        t = self.alloc(src.shape, src.dtype, SBUF, src._pdim)
        self.issue("tensor_copy", "vector", t.tile, src.tile)
        return t

    def broadcast_view(self, x: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
        """``x`` with size-1 free axes repeated by stride 0 (no data movement)."""
        if x.shape == shape:
            return x
        if len(x.shape) != len(shape):
            if x._pdim is None and len(x.shape) < len(shape):
                x = x.reshape((1,) * (len(shape) - len(x.shape)) + tuple(x.shape))
            else:
                raise ShapeError(f"broadcast: cannot broadcast {x.shape} to {shape}")
        t = x.tile
        if x._pdim is None:
            rows = t
            if x.shape[0] != shape[0]:
                if x.shape[0] != 1:
                    raise ShapeError(f"broadcast: cannot broadcast {x.shape} to {shape}")
                rows = t.rows(shape[0], 0)
            pat = list(t.pattern) or [(1, 1)]
            pat = [
                (0 if (n == 1 and s != 1) else st, s)
                for (st, n), s in zip(pat, shape[1:], strict=False)
            ] or pat
            return x._view(rows.ap(pat, 0), shape, None)
        if x.shape[0] != shape[0]:
            raise ShapeError(f"broadcast: partition axis {x.shape[0]} to {shape[0]}")
        pat = list(t.pattern)
        if len(pat) != len(shape) - 1:
            pat = [(1, n) for n in x.shape[1:]]
            t = t.reshape_free([n for _, n in pat])
            pat = list(t.pattern)
        new = []
        for (st, n), want in zip(pat, shape[1:], strict=True):
            if n == want:
                new.append((st, n))
            elif n == 1:
                new.append((0, want))
            else:
                raise ShapeError(f"broadcast: cannot broadcast {x.shape} to {shape}")
        return x._view(t.ap(new, 0), shape, 0)

    def broadcast(self, x: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
        """``x.broadcast_to(shape)``: free axes by view; a 1-partition tile to more
        partitions by one DMA (SBUF to SBUF, the source row read with step 0)."""
        if x._pdim is None or x.shape[0] == shape[0]:
            return self.broadcast_view(x, shape)
        if x.shape[0] != 1 or len(shape) != len(x.shape):
            raise ShapeError(f"broadcast_to: cannot broadcast {x.shape} to {shape}")
        src = self.broadcast_view(x, (1, *shape[1:]))

        def issue(dst: NkiTensor) -> None:
            s = src.tile
            pat = [(0, shape[0])] + [(st, n) for st, n in s.pattern]
            self.issue("dma_copy", dst.tile, s.ap(pat[:4], 0), None)

        if len(shape) > 4:
            raise NotSupportedError("broadcast_to: partition broadcast of a 4-D free shape")
        return self.pend(shape, x.dtype, SBUF, issue)

    def arith(self, op: str, x, y, dtype=None, mask=None) -> NkiTensor:
        """A binary element-wise ``nl`` operation (Vector engine; GpSimd for ``power`` and
        32-bit integer add/multiply, as the ISA docs assign them)."""
        xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
        if not xt and not yt:
            raise Trn2ValueError(f"{op}: at least one operand must be a tile")
        dx = x.dtype if xt else D.weak_dtype(x)
        dy = y.dtype if yt else D.weak_dtype(y)
        if dtype is not None:
            out_dt = D.as_dtype(dtype)
        elif op in _COMPARE:
            out_dt = D.uint8
        elif op == "divide" and not D.is_float(dx) and not D.is_float(dy):
            # True division, as numpy.divide (which nl.divide follows): integers give float32
            # (AWS's resize kernel floors `int32 tile / int`, which needs the fraction).
            out_dt = D.float32
        else:
            out_dt = D.promote(dx, dy)
        if xt:
            self.on_chip(x, "x")
        if yt:
            self.on_chip(y, "y")
        if xt and yt:
            shape = _broadcast_shapes(x.shape, y.shape)
            if x.shape[0] != shape[0]:
                x = self.broadcast(x, (shape[0], *x.shape[1:]))
            if y.shape[0] != shape[0]:
                y = self.broadcast(y, (shape[0], *y.shape[1:]))
        else:
            shape = (x if xt else y).shape
        ranges = self.mask_ranges(mask, len(shape), x, y)
        ints = not D.is_float(out_dt) and dx.itemsize == 4 and dy.itemsize == 4
        eng = (
            "gpsimd"
            if op == "power" or (ints and op in ("add", "multiply", "subtract"))
            else "vector"
        )

        def issue(dst: NkiTensor) -> None:
            if ranges is None:
                return
            d = self.masked(dst, ranges)
            if xt and yt:
                a, b = self.masked(x, ranges), self.masked(y, ranges)
                fa, fb = self.free_size(a), self.free_size(b)
                fd = self.free_size(d)
                if fb == 1 and fd > 1 and b.dtype == D.float32 and eng == "vector":
                    self.issue(
                        "tensor_scalar",
                        "vector",
                        d.tile,
                        a.tile,
                        op,
                        b.tile,
                        False,
                        None,
                        None,
                        False,
                    )
                    return
                if fa == 1 and fd > 1 and a.dtype == D.float32 and eng == "vector":
                    self.issue(
                        "tensor_scalar",
                        "vector",
                        d.tile,
                        b.tile,
                        op,
                        a.tile,
                        True,
                        None,
                        None,
                        False,
                    )
                    return
                a = self.broadcast_view(a, d.shape) if a.shape != d.shape else a
                b = self.broadcast_view(b, d.shape) if b.shape != d.shape else b
                self.issue("tensor_tensor", eng, d.tile, a.tile, b.tile, op)
            elif xt:
                self.issue(
                    "tensor_scalar",
                    "vector",
                    d.tile,
                    self.masked(x, ranges).tile,
                    op,
                    float(y),
                    False,
                    None,
                    None,
                    False,
                )
            else:
                self.issue(
                    "tensor_scalar",
                    "vector",
                    d.tile,
                    self.masked(y, ranges).tile,
                    op,
                    float(x),
                    True,
                    None,
                    None,
                    False,
                )

        r = self.pend_valid(self.pend(shape, out_dt, SBUF, issue), ranges)
        r._compared = op in _COMPARE  # no Python truth value (NkiTensor.__bool__)
        return r

    def unary(self, func: str, x, dtype=None, mask=None) -> NkiTensor:
        """A unary ``nl`` function: activation functions on the Scalar engine, the reciprocal
        on the Vector engine (IEEE, the precise one), ALU unary operators on Vector."""
        x = self.on_chip(x, "x")
        out_dt = D.as_dtype(dtype) if dtype is not None else x.dtype
        ranges = self.mask_ranges(mask, x.ndim, x)

        def issue(dst: NkiTensor) -> None:
            if ranges is None:
                return
            d, a = self.masked(dst, ranges), self.masked(x, ranges)
            if func == "reciprocal":
                self.issue("reciprocal", d.tile, a.tile)
            elif func == "negative":
                self.m.issue_at(
                    self.loc, "tensor_scalar", "vector", d.tile, a.tile, "multiply", -1.0
                )
            elif func in ("invert",):
                self.issue("tensor_scalar", "vector", d.tile, a.tile, func, 0.0)
            elif func == "logical_not":
                self.issue("tensor_scalar", "vector", d.tile, a.tile, "equal", 0.0)
            elif func in ACTIVATION_FUNCTIONS:
                self.issue("activation", d.tile, func, a.tile)
            elif func in _COMPOSITE:
                self.composite(func, d, a)
            else:
                raise NotSupportedError(f"nl.{func} is not supported by trn2core")

        own = ("reciprocal", "negative", "invert", "logical_not", *_COMPOSITE)
        if func not in ACTIVATION_FUNCTIONS and func not in own:
            raise NotSupportedError(
                f"nl.{func}: the machine has no instruction for it (docs/nki.md lists the "
                "supported functions)"
            )
        if func == "logical_not" and dtype is None:
            out_dt = D.uint8
        return self.pend_valid(self.pend(x.shape, out_dt, SBUF, issue), ranges)

    def composite(self, func: str, d: NkiTensor, a: NkiTensor) -> None:
        """``nl`` functions with no instruction of their own, as short instruction sequences
        (trn2core's lowering; the values are exact for floor/ceil/trunc):

        - ``floor``/``ceil``: ``r`` = x clamped to +-2^23 and converted to int32 and back
          (round to nearest even), then ``r - (r > x)`` / ``r + (r < x)``; where
          ``|x| >= 2^23`` (or NaN) x is already integral and is selected as it is;
        - a zero result takes x's sign (``x * 0``), as IEEE's floor/ceil/trunc give it;
        - ``trunc``: ``floor(|x|)``, negated where x < 0;
        - ``cos``: ``sin(pi/2 - |x|)`` on the Scalar engine (inside sin's valid range for x in
          [-pi, pi]); ``tan``: ``sin(x) / cos(x)``."""
        m, f32 = self, D.float32

        keep: list[NkiTensor] = []  # the temporaries live until the sequence is issued

        def tmp(dtype=f32):
            keep.append(self.alloc(d.shape, dtype, SBUF, 0))
            return keep[-1].tile

        def ts(dst, src, op0, c0, op1=None, c1=None):
            m.issue("tensor_scalar", "vector", dst, src, op0, c0, False, op1, c1, False)

        def signed_zero(dst, x, f):
            # A zero result has x's sign (IEEE: floor(-0.0) = ceil(-0.5) = trunc(-0.5) = -0.0).
            zx, isz = tmp(), tmp()
            ts(zx, x, "multiply", 0.0)
            ts(isz, f, "equal", 0.0)
            m.issue("select", dst, isz, zx, f)

        def floor_like(dst, x, up: bool):
            big = float(2**23)
            xc, ri, r, c, f, f2, small = tmp(), tmp(D.int32), tmp(), tmp(), tmp(), tmp(), tmp()
            ts(xc, x, "maximum", -big, "minimum", big)
            m.issue("tensor_copy", "vector", ri, xc)
            m.issue("tensor_copy", "vector", r, ri)
            m.issue("tensor_tensor", "vector", c, r, x, "less" if up else "greater")
            m.issue("tensor_tensor", "vector", f, r, c, "add" if up else "subtract")
            signed_zero(f2, x, f)
            ts(small, x, "abs_max", 0.0, "less", big)
            m.issue("select", dst, small, f2, x)

        def cos(dst, x):
            ax = tmp()
            ts(ax, x, "abs_max", 0.0)
            m.issue("activation", dst, "sin", ax, math.pi / 2, -1.0, None, None, "idle")

        if func in ("floor", "ceil"):
            floor_like(d.tile, a.tile, func == "ceil")
        elif func == "trunc":
            ax, fl, neg, isneg, t = tmp(), tmp(), tmp(), tmp(), tmp()
            ts(ax, a.tile, "abs_max", 0.0)
            floor_like(fl, ax, False)
            ts(neg, fl, "multiply", -1.0)
            ts(isneg, a.tile, "less", 0.0)
            m.issue("select", t, isneg, neg, fl)
            signed_zero(d.tile, a.tile, t)
        elif func == "cos":
            cos(d.tile, a.tile)
        elif func == "tan":
            sn, cs = tmp(), tmp()
            m.issue("activation", sn, "sin", a.tile, None, None, None, None, "idle")
            cos(cs, a.tile)
            m.issue("tensor_tensor", "vector", d.tile, sn, cs, "divide")

    def unary_copy(self, x, dtype=None, mask=None) -> NkiTensor:
        """``nl.copy``: a Vector-engine ``tensor_copy`` into a new SBUF tile."""
        x = self.on_chip(x, "x")
        out_dt = D.as_dtype(dtype) if dtype is not None else x.dtype
        ranges = self.mask_ranges(mask, x.ndim, x)

        def issue(dst: NkiTensor) -> None:
            if ranges is not None:
                d, a = self.masked(dst, ranges), self.masked(x, ranges)
                self.issue("tensor_copy", "vector", d.tile, a.tile)

        return self.pend_valid(self.pend(x.shape, out_dt, SBUF, issue), ranges)

    def reduce(self, op: str, x, axis, dtype=None, keepdims=False, mask=None, mean=False):
        """``nl.sum``/``max``/``min``/``prod``/``mean``/``all`` over trailing free axes: one
        Vector ``tensor_reduce`` (``mean``: then a divide by the count)."""
        x = self.on_chip(x, "x")
        axes = reduce_axes(axis, x.shape)
        kept = [s for a, s in enumerate(x.shape) if a not in axes]
        shape = tuple(kept) if len(kept) > 1 else (x.shape[0], 1)
        if keepdims:
            shape = tuple(1 if a in axes else s for a, s in enumerate(x.shape))
        out_dt = D.as_dtype(dtype) if dtype is not None else x.dtype
        ranges = self.mask_ranges(mask, x.ndim, x)
        count = math.prod(x.shape[a] for a in axes)

        def issue(dst: NkiTensor) -> None:
            if ranges is None:
                return
            a = self.masked(x, ranges)
            if axes != list(range(x.ndim - len(axes), x.ndim)):
                # Free axes in the middle: the same access pattern with the reduced axes
                # last (a reordering of strides, no data movement).
                a = a.permute([i for i in range(x.ndim) if i not in axes] + axes)
            d = self.masked(dst, (ranges[0], {g: r for g, r in ranges[1].items() if g == 0}))
            dt = d.tile
            if mean:
                tmp = self.alloc(d.shape, D.float32, SBUF, 0)
                self.issue("tensor_reduce", tmp.tile, op, a.tile, len(axes), False)
                self.issue(
                    "tensor_scalar",
                    "vector",
                    dt,
                    tmp.tile,
                    "divide",
                    float(count),
                    False,
                    None,
                    None,
                    False,
                )
            else:
                self.issue("tensor_reduce", dt, op, a.tile, len(axes), False)

        return self.pend_valid(self.pend(shape, out_dt, SBUF, issue), ranges, (0,))

    def inplace(self, op: str, target: NkiTensor, value) -> None:
        """``target op= value``: a pending matmul added into PSUM accumulates there (one
        ``nc_matmul``); otherwise one Vector instruction updating ``target`` in place."""
        self.on_chip(target, "target")
        if target._masked:
            raise NotSupportedError(
                "index: an in-place update through a mask index (t[...][mask] += x) is not "
                "emulated; pass the mask as mask= to an instruction"
            )
        if isinstance(value, NkiTensor):
            fn, kind = self.take(value)
            if (
                fn is not None
                and kind is not None
                and kind[0] == "matmul"
                and op == "add"
                and target.buffer is PSUM
            ):
                owner = target._owner
                if owner is not None and owner.init not in (None, 0.0):
                    raise NotSupportedError(
                        "+=: accumulating a matmul onto PSUM initialised with a non-zero value "
                        "is undefined on Trainium2 (the NKI nc_matmul docs); zero it "
                        "(nl.zeros) or let the first matmul overwrite it"
                    )
                kind[1](target, False if self.block_fresh(target) else None)
                self.mark_accum()
                self.last_inplace = (target, self.m.instructions)
                return
            if fn is not None:
                self.pending, self.pend_fn, self.pend_kind = value, fn, kind
        self.flush()
        if isinstance(value, NkiTensor):
            v = self.on_chip(value, "value")
            if v.shape != target.shape:
                v = (
                    self.broadcast_view(v, target.shape)
                    if v.shape[0] == target.shape[0]
                    else self.broadcast(v, target.shape)
                )
            fv = self.free_size(v)
            if fv == 1 and self.free_size(target) > 1 and v.dtype == D.float32:
                self.issue(
                    "tensor_scalar",
                    "vector",
                    target.tile,
                    target.tile,
                    op,
                    v.tile,
                    False,
                    None,
                    None,
                    False,
                )
            else:
                self.m.issue_at(
                    self.loc, "tensor_tensor", "vector", target.tile, target.tile, v.tile, op
                )
        else:
            t = target.tile
            self.issue("tensor_scalar", "vector", t, t, op, float(value))
        if op in _ASSOCIATIVE:
            self.mark_accum()
        self.last_inplace = (target, self.m.instructions)

    def reduce_into(self, op: str, dst: NkiTensor, x: NkiTensor, dtype, mask) -> None:
        """``dst = op(dst, x)`` (``nl.loop_reduce``): one Vector instruction updating ``dst``
        in place, or, for an output ``dtype`` other than ``dst``'s, the operation into a tile
        of ``dtype`` then a copy into ``dst``. An associative ``op`` may cross ``affine_range``
        iterations (``Core.check_loop``)."""
        self.on_chip(dst, "dst")
        ranges = self.mask_ranges(mask, len(dst.shape), x)
        if ranges is None:
            return
        d, v = self.masked(dst, ranges), self.masked(x, ranges)
        if dtype is None or dtype == dst.dtype:
            self.inplace(op, d, v)
            return
        first = self.m.instructions
        self.assign(d, self.arith(op, d, v, dtype=dtype))
        if op in _ASSOCIATIVE:
            self.mark_accum(first)

    def reduce_new(self, op: str, b: NkiTensor, x: NkiTensor, dtype, mask) -> NkiTensor:
        """``op(b, x)`` into a new tile (``b = nl.loop_reduce(x, ...)``), an associative ``op``
        allowed across ``affine_range`` iterations (it reads the ``b`` an earlier one made)."""
        r = self.arith(op, b, x, dtype=b.dtype if dtype is None else dtype, mask=mask)
        fn = self.pend_fn

        def issue(dst: NkiTensor) -> None:
            first = self.m.instructions
            fn(dst)
            if op in _ASSOCIATIVE:
                self.mark_accum(first)

        self.pend_fn = issue
        return r

    def matmul_pending(self, stationary: NkiTensor, moving: NkiTensor, shape, opts) -> NkiTensor:
        """A pending ``nc_matmul`` into a new PSUM tile (or accumulating via ``+=``)."""

        def issue(dst: NkiTensor, accumulate=False) -> None:
            self.m.issue_at(
                self.loc, "nc_matmul", dst.tile, stationary.tile, moving.tile, accumulate, *opts
            )

        return self.pend(shape, D.float32, PSUM, issue, ("matmul", issue))

    def indirect_rows(self, acc, ranges, plo: int, phi: int):
        """The HBM rows an indirect access ``a[idx, j]`` (``acc``, an ``Indirect``) reaches for
        partitions ``plo .. phi`` under ``ranges``: ``(values, row)`` with ``values`` the index
        tile's values (read now, in program order) and ``row(i, count, step)`` the tile of
        ``count`` rows from value ``values[i]``, ``step`` index values apart. Values outside
        the indexed axis are an ``OutOfBoundsError``."""
        base, key, axis, idx = acc.base, list(acc.key), acc.axis, acc.idx
        raw = self.m.read(idx.tile[plo:phi])
        vals = raw.view(D.HOST_DTYPE[D.machine_name(idx.dtype)]).reshape(-1).astype(np.int64)
        size = base.shape[axis]
        bad = np.flatnonzero((vals < 0) | (vals >= size))
        if bad.size:
            p = int(bad[0])
            raise OutOfBoundsError(
                f"index: the index tile holds {int(vals[p])} at partition {plo + p}, outside "
                f"axis {axis} of size {size} (tensor {base.shape}) [rule bounds]"
            )
        t = base.tile
        mstride = [t.row_step] + [st for st, _ in t.pattern]
        exprs = [k for k in key if isinstance(k, IndexExpr)]
        gshape = grid_of(exprs) if exprs else (1, 1)
        nd = len(gshape)
        axis_var: list = [None] * nd
        for e in exprs:
            for v in e.terms:
                axis_var[var_axis(v, nd)] = v
        lo = [ranges[0].get(v, (0, v.size))[0] if v is not None else 0 for v in axis_var]
        sizes = [
            ranges[0][v][1] - ranges[0][v][0] if v in ranges[0] else gshape[g]
            for g, v in enumerate(axis_var)
        ]

        def coef(k, v) -> int:
            return k.terms.get(v, 0) if isinstance(k, IndexExpr) and v is not None else 0

        def const(k) -> int:
            if isinstance(k, IndexExpr):
                return k.const + sum(c * lo[var_axis(v, nd)] for v, c in k.terms.items())
            return int(k)

        for a, k in enumerate(key):
            if a == axis:
                continue
            c = const(k)
            for x in [
                c,
                *(c + coef(k, v) * (sizes[g] - 1) for g, v in enumerate(axis_var) if v is not None),
            ]:
                if not 0 <= x < base.shape[a]:
                    raise OutOfBoundsError(
                        f"index: axis {a} reaches {x}, outside size {base.shape[a]} [rule bounds]"
                    )
        offset0 = sum(mstride[a] * const(k) for a, k in enumerate(key) if a != axis)
        free = [
            (sum(mstride[a] * coef(k, axis_var[g]) for a, k in enumerate(key)), sizes[g])
            for g in range(1, nd)
        ] or [(1, 1)]

        def row(i: int, count: int, step: int):
            return t.rows(count, mstride[axis] * step).ap(
                free, offset0 + mstride[axis] * int(vals[i])
            )

        return vals, row

    def gather(self, src: NkiTensor, ranges, dtype) -> NkiTensor:
        """``nl.load(a[idx, j])``: an indirect DMA, partition ``p`` of the new tile reading
        index ``idx[p]`` of the indexed axis. trn2core reads the index values when the load
        is issued (in program order) and issues one ``dma_copy`` per run of partitions whose
        indices step evenly (one DMA per descriptor run; the DMA's wait on the instruction
        that wrote ``idx`` is not modelled). Index values outside the axis are an
        ``OutOfBoundsError``; a mask limits the partitions (and free indices) read."""
        acc = src._access

        def issue(dst: NkiTensor) -> None:
            if ranges is None:
                return
            plo, phi = ranges[1].get(0, (0, dst.shape[0]))
            d = self.masked(dst, ranges)
            vals, row = self.indirect_rows(acc, ranges, plo, phi)
            n, p = len(vals), 0
            while p < n:
                q = p + 1
                step = int(vals[q] - vals[p]) if q < n else 0
                while q + 1 <= n - 1 and int(vals[q + 1] - vals[q]) == step:
                    q += 1
                count = q - p + 1 if q < n else 1
                self.issue("dma_copy", d.tile[p : p + count], row(p, count, step), None)
                p += count

        return self.pend_valid(self.pend(src.shape, dtype, SBUF, issue), ranges)

    def atomic_rmw(self, dst: NkiTensor, value, ranges) -> None:
        """``nl.atomic_rmw(a[idx, j], value, np.add)``: row ``idx[p]`` of ``a`` += partition
        ``p`` of ``value``, one ``dma_compute`` (float32 sum, rounded once to ``a``'s dtype)
        a partition in partition order, so repeated indices add up as atomic updates do (the
        order among them is ours)."""
        self.flush()
        if ranges is None:
            return
        plo, phi = ranges[1].get(0, (0, dst.shape[0]))
        vals, row = self.indirect_rows(dst._access, ranges, plo, phi)
        v = self.masked(value, ranges)
        for i in range(len(vals)):
            r = row(i, 1, 0)
            self.issue("dma_compute", r, [r, v.tile[i : i + 1]], None)

    def offset_value(self, t: NkiTensor) -> int:
        """The integer in the one-element tensor ``t``, read now (in program order)."""
        self.flush()
        raw = self.m.read(t.tile)
        return int(raw.view(D.HOST_DTYPE[D.machine_name(t.dtype)]).reshape(-1)[0])

    def dynamic_offset(self, t: NkiTensor, scalar, pattern, indirect_dim) -> int:
        """``.ap(scalar_offset=s, indirect_dim=d)``: the value in the 1x1 SBUF tensor ``s``
        (read when the access pattern is made, i.e. in program order just before the DMA
        that uses it) selects index ``s`` of dimension ``d``: of an HBM tensor ``t``, its own
        dimension, ``s * prod(t.shape[d + 1:])`` elements (the NKI access-pattern reference:
        "relative to the base tensor, not relative to the pattern"; nki-library's TensorView
        selects so, the dimension gone from the pattern); on chip, pattern dimension ``d``:
        ``s * step_d``. The DMA's wait on the instruction that wrote ``s`` is not modelled."""
        d = int(indirect_dim)
        if t._pdim is None:
            if not 0 <= d < len(t.shape):
                raise Trn2ValueError(
                    f"ap: indirect_dim {d} is not a dimension of the tensor {t.shape}",
                    arg="indirect_dim",
                )
            return _scalar_value(self, scalar) * math.prod(t.shape[d + 1 :])
        if not 0 <= d < len(pattern):
            raise Trn2ValueError(
                f"ap: indirect_dim {d} is not a dimension of the pattern {pattern}",
                arg="indirect_dim",
            )
        return _scalar_value(self, scalar) * pattern[d][0]

    def raw_ap(self, t: NkiTensor, pattern, offset, kwargs) -> NkiTensor:
        """NKI's ``.ap()``: an explicit pattern over the tensor's storage."""
        if kwargs.get("vector_offset") is not None:
            return self.vector_offset_view(t, pattern, offset, kwargs)
        # ``dtype=``: the storage's bytes as elements of another dtype (the pattern and offset
        # then count those elements), e.g. an fp32 scale stored as four fp8 bytes.
        dt = t.dtype if kwargs.get("dtype") is None else D.as_dtype(kwargs["dtype"], "dtype")
        pattern = [(int(s), int(n)) for s, n in pattern]
        if not pattern:
            raise Trn2ValueError("ap: the pattern needs at least one [step, count] pair")
        scalar = kwargs.get("scalar_offset")
        dim = int(kwargs.get("indirect_dim", 0))
        if isinstance(scalar, NkiTensor) and t._pdim is not None and 1 <= dim < len(pattern):
            # On chip along a free dimension: the value stays in SBUF, read by the machine when
            # tensor_copy_dynamic_src / _dst runs (by any other instruction when issued).
            static = {k: x for k, x in kwargs.items() if k not in ("scalar_offset", "indirect_dim")}
            v = self.raw_ap(t, pattern, offset, static)
            _scalar_tensor(scalar)
            v._t = Dynamic(v.tile, scalar, pattern[dim][0], 0)
            return v
        if scalar is not None:
            offset = (int(offset) if offset is not None else 0) + self.dynamic_offset(
                t, scalar, pattern, kwargs.get("indirect_dim", 0)
            )
        o = t._owner
        if o is not None and o.m is None and o.slot is not None:
            self.reload(o)  # spilled (docs/nki.md, current-dialect liveness)
        base = o.tile if o is not None else None
        cast = dt != t.dtype
        if t._pdim is None:
            off = int(offset) if offset is not None else 0
            # The pattern addresses the storage from element 0: re-anchor at the tensor start.
            root = _hbm_root(t, dt)
            (s0, n0), rest = pattern[0], pattern[1:] or [(1, 1)]
            tile = root.rows(n0, s0).ap(rest, off)
            return _retyped(t._view(tile, [n0] + [n for _, n in rest], None), dt)
        row = self.storage_row(t)
        if cast:
            base = base.view_as(D.machine_name(dt))
            row = row * t.dtype.itemsize // dt.itemsize
        (ps, pn), rest = pattern[0], pattern[1:] or [(1, 1)]
        if ps != row:
            raise Trn2ValueError(
                f"ap: the partition step of an on-chip tensor is its storage's elements per "
                f"partition ({row}), got {ps}"
            )
        off = int(offset) if offset is not None else 0
        p0, f0 = divmod(off, row)
        tile = base[p0 : p0 + pn].ap(rest, f0)
        return _retyped(t._view(tile, [pn] + [n for _, n in rest], 0), dt)

    def vector_offset_view(self, t: NkiTensor, pattern, offset, kwargs) -> NkiTensor:
        """``t.ap(..., vector_offset=idx, indirect_dim=0)`` of an HBM tensor: the view whose
        row ``w`` starts ``idx[w]`` rows of ``t`` past ``offset`` (``VectorOffset``)."""
        idx = kwargs["vector_offset"]
        if kwargs.get("scalar_offset") is not None:
            raise Trn2ValueError(
                "ap: at most one of scalar_offset and vector_offset (the NKI access-pattern "
                "reference)",
                arg="vector_offset",
            )
        dim = kwargs.get("indirect_dim", 0)
        if not is_int(dim) or int(dim) != 0:
            raise Trn2ValueError(
                f"indirect_dim: only indirect_dim=0 is supported with vector_offset (the NKI "
                f"access-pattern reference), got {dim!r}",
                arg="indirect_dim",
            )
        if t._pdim is not None:
            raise NotSupportedError(
                "ap: vector_offset indexes the rows of an HBM tensor (an indirect DMA); "
                f"this tensor is in {t.buffer.name}"
            )
        if (
            not isinstance(idx, NkiTensor)
            or idx._pdim is None
            or idx.size != idx.shape[0]
            or np.dtype(idx.dtype).kind not in "iu"
        ):
            got = f"{idx.shape} {idx.dtype}" if isinstance(idx, NkiTensor) else type(idx).__name__
            raise Trn2ValueError(
                "vector_offset: an on-chip integer tile with one index per partition ([P, 1]), "
                f"got {got}",
                arg="vector_offset",
            )
        static = {k: x for k, x in kwargs.items() if k not in ("vector_offset", "indirect_dim")}
        v = self.raw_ap(t, [[0, 1], *pattern[1:]], offset, static)
        n0 = int(pattern[0][1])
        if n0 != idx.shape[0]:
            raise ShapeError(
                f"vector_offset: {idx.shape[0]} indices for the pattern's {n0} rows (one index "
                "a row)",
                arg="vector_offset",
            )
        dt = v.dtype
        row = math.prod(t.shape[1:]) * t.dtype.itemsize
        if row % dt.itemsize:
            raise ShapeError(
                f"dtype: a row of {t.shape} {t.dtype} is not a whole number of {dt} elements",
                arg="dtype",
            )
        root = _hbm_root(t, dt)
        rest = [(int(st), int(n)) for st, n in pattern[1:]] or [(1, 1)]
        off = int(offset) if offset is not None else 0
        shape = (n0, *v.shape[1:])
        w = t._view(None, shape, None)
        w._t = VectorOffset(root, rest, off, row // dt.itemsize, t.shape[0], idx, t.shape)
        return _retyped(w, dt)

    def vector_offset_copy(self, dst: NkiTensor, src: NkiTensor, oob) -> None:
        """``nisa.dma_copy`` with ``dst`` or ``src`` a ``vector_offset`` view (a scatter or a
        gather of HBM rows): trn2core reads the indices when the copy is issued (in program
        order) and issues one ``dma_copy`` per run of rows whose indices step evenly. An index
        outside the tensor's rows is an ``OutOfBoundsError`` (``oob_mode.error``) or its row is
        skipped (``oob_mode.skip``)."""
        if type(dst._t) is VectorOffset and type(src._t) is VectorOffset:
            raise NotSupportedError("dma_copy: vector_offset on both dst and src")
        ind, other = (dst, src) if type(dst._t) is VectorOffset else (src, dst)
        o = other.tile
        n = ind._t.idx.shape[0]
        if o.shape[0] != n:
            raise ShapeError(
                f"dma_copy: {n} indexed rows against {o.shape[0]} rows of the other side",
                arg="src" if ind is dst else "dst",
            )
        for w, end, hbm in self.vector_offset_runs(ind._t, oob):
            part = o[w:end]
            pair = (hbm, part) if ind is dst else (part, hbm)
            self.m.issue_at(self.loc, "dma_copy", pair[0], pair[1], None)

    def oob_skip_copy(self, dst, src) -> bool:
        """``nisa.dma_copy(..., oob_mode=skip)`` whose HBM side leaves its tensor (nki-library's
        indexed_flatten writes blocks at a ``scalar_offset`` that may run past the output's
        end): the rows of that side's first axis wholly inside the tensor are copied, with the
        other side's same rows, one ``dma_copy`` per run of them; a row reaching outside is
        skipped whole (*ours*: the ISA reference says only that out-of-bounds accesses are
        skipped). False (the copy issued as usual) when every row is inside or the two sides'
        first axes differ."""
        for side, other in ((dst, src), (src, dst)):
            if not isinstance(side, NkiTensor) or side._pdim is not None:
                continue
            tile = side.tile
            _, dt, shape, _ = self.m.tensor_info(tile)
            nbytes = math.prod(shape) * np.dtype(D.HOST_DTYPE[dt]).itemsize
            es = side.dtype.itemsize
            idx = _view_elements(tile, es)
            inside = ((idx >= 0) & ((idx + 1) * es <= nbytes)).reshape(idx.shape[0], -1)
            rows = inside.all(axis=1)
            if rows.all() or not isinstance(other, NkiTensor):
                continue
            if not (len(rows) == side.shape[0] == other.shape[0]):
                return False
            w = 0
            while w < len(rows):
                if not rows[w]:
                    w += 1
                    continue
                end = w + 1
                while end < len(rows) and rows[end]:
                    end += 1
                pair = (side[w:end].tile, other[w:end].tile)
                d, s = pair if side is dst else pair[::-1]
                self.m.issue_at(self.loc, "dma_copy", d, s, None)
                w = end
            return True
        return False

    def vector_offset_compute(self, dst: NkiTensor, srcs: list, unique, oob) -> None:
        """``nisa.dma_compute`` with a ``vector_offset`` view (the ISA reference's
        read-modify-write, two sources, ``unique_indices=True``): gather, ``dst`` (SBUF) =
        ``dst`` + the indexed HBM rows; scatter, the indexed HBM rows (``dst``, also a
        source) += an SBUF source. trn2core reads the indices when it is issued and issues one
        ``dma_compute`` per run of rows whose indices step evenly, the sources in their order
        (indices out of bounds as ``vector_offset_copy``: an error, or the row skipped)."""

        def refuse(arg: str, why: str) -> Trn2ValueError:
            return Trn2ValueError(
                f"{arg}: dma_compute with a vector_offset source (read-modify-write): {why} "
                "[rule dma_compute_rmw]",
                arg=arg,
                rule="dma_compute_rmw",
            )

        if len(srcs) != 2:
            raise refuse("srcs", f"it takes exactly 2 sources, got {len(srcs)}")
        if not unique:
            raise refuse("unique_indices", "unique_indices must be True")
        indexed = [type(x._t) is VectorOffset for x in srcs]
        if indexed.count(True) != 1:
            raise refuse("srcs", "exactly one source is indexed by vector_offset")
        j = indexed.index(True)
        ind, other = srcs[j], srcs[1 - j]
        acc = ind._t
        if type(dst._t) is VectorOffset:  # scatter: dst and one source the same indexed rows
            d = dst._t
            same = (d.idx is acc.idx and d.rest == acc.rest and d.offset == acc.offset
                    and d.row == acc.row and d.shape == acc.shape)  # fmt: skip
            if not same or other._pdim is None:
                raise refuse("srcs", "a scatter (dst indexed) adds an SBUF source into dst's "
                             "rows, the other source being dst's indexed view")  # fmt: skip
        elif dst._pdim is None or not _same_tile(other.tile, dst.tile):
            raise refuse("srcs", "a gather (an HBM source indexed) adds into dst in SBUF, the "
                         "other source being dst")  # fmt: skip
        o = other.tile
        n = acc.idx.shape[0]
        if o.shape[0] != n:
            raise ShapeError(
                f"dma_compute: {n} indexed rows against {o.shape[0]} rows of the other side",
                arg=f"srcs[{1 - j}]",
            )
        for w, end, hbm in self.vector_offset_runs(acc, oob):
            part = o[w:end]
            pair = [None, None]
            pair[j], pair[1 - j] = hbm, part
            target = hbm if type(dst._t) is VectorOffset else part
            self.m.issue_at(self.loc, "dma_compute", target, pair, None)

    def vector_offset_transpose(self, dst: NkiTensor, src: NkiTensor, perm, oob) -> None:
        """``nisa.dma_transpose`` of a ``vector_offset`` view of HBM (NKI's indirect DMA
        transpose, a gather-transpose): the rows the indices name, transposed into ``dst`` as
        ``dma_transpose`` does (``src`` axis 0 is ``dst``'s last axis). The ISA reference's
        rules for it: 2-byte elements, ``src.shape[0]`` (one row an index, so 16 to 128
        indices) a multiple of 16, in 4-D ``src.shape[1]`` or ``src.shape[2]`` 1, and
        ``uint32`` indices (``src.shape[-1] <= 128`` is ``dst``'s partition limit).
        trn2core reads the indices when it is issued and issues one ``dma_transpose`` per run
        of rows whose indices step evenly (indices out of bounds as ``vector_offset_copy``)."""
        acc, shape = src._t, tuple(src.shape)
        broken = None
        if src.dtype.itemsize != 2:
            broken = ("src", "dma_transpose_dtype", f"src is {src.dtype}; it moves 2-byte elements")
        elif shape[0] % 16:
            broken = ("src", "dma_transpose_shape", f"src has shape {list(shape)}; it needs "
                      "src.shape[0] a multiple of 16")  # fmt: skip
        elif len(shape) == 4 and 1 not in (shape[1], shape[2]):
            broken = ("src", "dma_transpose_shape", f"src has shape {list(shape)}; a 4-D "
                      "source has src.shape[1] or src.shape[2] equal to 1")  # fmt: skip
        elif np.dtype(acc.idx.dtype) != np.uint32:
            broken = ("vector_offset", "dma_transpose_indices", f"the indices are "
                      f"{acc.idx.dtype}; it takes uint32 indices")  # fmt: skip
        if broken is not None:
            arg, rule, why = broken
            raise Trn2ValueError(
                f"{arg}: an indirect dma_transpose (a source indexed by vector_offset): {why} "
                f"[rule {rule}]",
                arg=arg,
                rule=rule,
            )
        lead = (slice(None),) * (len(dst.shape) - 1)
        for w, end, hbm in self.vector_offset_runs(acc, oob):
            part = dst[(*lead, slice(w, end))]
            t = part._from_axes(part._axes()).tile
            self.m.issue_at(self.loc, "dma_transpose", t, hbm, perm, False)

    def vector_offset_runs(self, acc: VectorOffset, oob):
        """The runs of a ``vector_offset`` view's rows whose indices step evenly, as
        ``(first, end, HBM tile of those rows)``, its indices read now; an index outside the
        tensor's rows is an ``OutOfBoundsError`` (``oob_mode.error``) or skipped
        (``oob_mode.skip``)."""
        n = acc.idx.shape[0]
        raw = self.m.read(acc.idx.tile)
        host = D.HOST_DTYPE[D.machine_name(acc.idx.dtype)]
        vals = raw.view(host).reshape(-1).astype(np.int64)
        ok = (vals >= 0) & (vals < acc.limit)
        skip = getattr(oob, "name", oob) == "skip"
        if not ok.all() and not skip:
            p = int(np.flatnonzero(~ok)[0])
            raise OutOfBoundsError(
                f"vector_offset: index {int(vals[p])} at partition {p} is outside the "
                f"{acc.limit} rows of {acc.shape} (oob_mode=error) [rule bounds]"
            )
        w = 0
        while w < n:
            if not ok[w]:
                w += 1
                continue
            end, step = w + 1, 0
            if end < n and ok[end]:
                step = int(vals[end] - vals[w])
                while end < n and ok[end] and vals[end] - vals[end - 1] == step:
                    end += 1
            hbm = acc.root.rows(end - w, step * acc.row).ap(
                acc.rest, acc.offset + int(vals[w]) * acc.row
            )
            yield w, end, hbm
            w = end


def reduce_axes(axis, shape: tuple[int, ...]) -> list[int]:
    """The sorted free axes an ``nl`` reduction's ``axis`` names (an int or a list of ints,
    numpy integers too): any free axes of the tile, not the partition axis (0)."""
    ndim = len(shape)
    items = (axis,) if isinstance(axis, (int, np.integer)) else axis
    if isinstance(items, (tuple, list)) and items and all(is_int(a) for a in items):
        axes = sorted({int(a) % ndim for a in items if -ndim <= int(a) < ndim})
        if len(axes) == len(items) and axes[0] != 0:
            return axes
    raise ShapeError(
        f"axis: a reduction runs over free axes of a tile (1 to {ndim - 1}; the partition "
        f"axis 0 cannot be reduced), given as an int or a list of ints; got {axis!r} for a "
        f"tile of shape {shape}",
        arg="axis",
    )


def _scalar_tensor(scalar) -> None:
    if not isinstance(scalar, NkiTensor) or scalar._pdim is None or scalar.size != 1:
        raise NotSupportedError(
            "ap: scalar_offset is a 1x1 SBUF tensor or a VirtualRegister, got "
            f"{type(scalar).__name__}",
            arg="scalar_offset",
        )


def _scalar_value(core: Core, scalar) -> int:
    if isinstance(scalar, VirtualRegister):
        return scalar.get("scalar_offset")
    _scalar_tensor(scalar)
    return core.offset_value(scalar)


def _retyped(v: NkiTensor, dtype) -> NkiTensor:
    """A view whose elements are of ``dtype`` (``.ap(dtype=)``)."""
    v.dtype = dtype
    return v


def _hbm_root(t: NkiTensor, dt=None):
    """The first element of an HBM tensor's storage as a one-row tile, of ``dt`` when given
    (the storage's bytes as that dtype's elements: from bf16 to int32, two elements are one)."""
    tile = t.tile
    es = t.dtype.itemsize
    # Step back to element 0: the tile's offset is in bytes from the buffer start.
    n = max(1, dt.itemsize // es) if dt is not None else 1
    root = tile.rows(1, 0).ap([(1, n)], -(tile.offset // es))
    return root if dt is None or dt == t.dtype else root.view_as(D.machine_name(dt))


def _broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) != len(b):
        raise ShapeError(f"shapes {a} and {b} do not broadcast (NKI tiles have equal ranks)")
    return broadcast_equal_ranks(a, b, ShapeError, "shapes")


class _PeerStopped(BaseException):
    """Raised inside the peer core's thread when the launch's thread ended with an error."""


def _interrupt(thread: threading.Thread) -> None:
    """Stops ``thread`` (a peer core's) at its next bytecode, and waits for it (polling)."""
    if thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident or 0), ctypes.py_object(_PeerStopped)
        )
    while thread.is_alive():
        thread.join(POLL_S)


class Launch:
    """One call of a kernel: its grid of programs on one or two physical cores."""

    def __init__(
        self,
        fn,
        args,
        kwargs,
        *,
        grid=(),
        nc_axes=(),
        lnc=1,
        dialect="current",
        uninitialized="error",
        rank=0,
        group=None,
    ) -> None:
        self.fn = fn
        #: This launch's rank among the launches of one kernel (``nki.collectives.rank_id``)
        #: and where they meet (``_ranks``): one rank unless run with ``ranks=N``.
        self.rank = rank
        self.group = group if group is not None else RankGroup(1)
        self.ranks = self.group.ranks
        self.args = args
        self.kwargs = kwargs
        self.grid = tuple(grid)
        self.nc_axes = tuple(nc_axes)
        self.lnc = lnc
        self.dialect = dialect
        self.uninitialized = uninitialized
        self.shared: list[list[NkiTensor]] = [[] for _ in range(lnc)]
        # Where the kernel created each HBM tensor (``id`` of its tile -> (tile, file, line)):
        # an output it did not fully write is reported at that line.
        self.created: dict[int, tuple] = {}
        self.take_ok: set[int] = set()
        self.cores: list[Core] = []
        self.program: tuple[int, ...] = ()
        self.inputs: list = []
        #: The values of the array arguments the kernel stored into, by id of their tensor on
        #: each core (``_write_back``): returning such an argument returns these (under LNC=2
        #: both cores' stores, as the one HBM tensor the two cores share on the chip).
        self.arg_results: dict[int, np.ndarray] = {}
        #: The rendezvous of ``nisa.sendrecv`` / ``core_barrier`` and the thread running the
        #: other physical core's programs, once a program called one (``rendezvous``).
        self.rdv: Rendezvous | None = None
        self.peer: threading.Thread | None = None
        self.peer_core = 1
        self.peer_error: BaseException | None = None

    def core_of(self, pid: tuple[int, ...]) -> int:
        if self.lnc == 1:
            return 0
        if self.nc_axes:
            return sum(pid[a] for a in self.nc_axes) % self.lnc
        return pid[0] % self.lnc if pid else 0

    def _programs(self):
        # Lazily: a grid of 10**12 programs must not build 10**12 tuples before the first runs
        # (Python checks Ctrl-C between programs).
        return itertools.product(*(range(g) for g in self.grid)) if self.grid else iter([()])

    def _run(self, k: int, pid: tuple[int, ...]):
        """Runs program ``pid`` (the ``k``-th of the grid) on its core, on this thread."""
        c = self.cores[self.core_of(pid)]
        c.program = pid
        c.seq = k
        c.shared_seq = 0
        self.program = pid
        args, kwargs = self.inputs[c.index]
        STATE.core = c
        out = self.fn(*args, **kwargs)
        c.flush()
        c.loops.clear()
        return out

    def execute(self):
        """Runs every program; returns the kernel's outputs as numpy arrays."""
        _check_host(self.fn, self.args, self.kwargs, self.lnc)
        self.cores = [Core(self, i) for i in range(self.lnc)]
        self.inputs = [_bind(core, self.args, self.kwargs) for core in self.cores]
        result = None
        prev = STATE.core
        try:
            for k, pid in enumerate(self._programs()):
                if self.peer is not None and self.core_of(pid) == self.peer_core:
                    continue  # the peer's thread runs it
                out = self._run(k, pid)
                if result is None:
                    result = out
        except BaseException as e:
            chosen = self._stop_peer(e)
            if chosen is e:
                raise
            raise chosen  # noqa: B904 (the launch thread's error stays its context)
        finally:
            STATE.core = prev
        self._stop_peer(None)
        try:
            self._write_back(self.inputs)
            self.take_ok = self._last_reads(result)
            return self._outputs(result)
        finally:
            self._release()

    def rendezvous(self, core: Core) -> Rendezvous:
        """The meeting point of the two physical cores (``_rendezvous``). The first call starts
        the other core's remaining programs (those after ``core``'s running one in the grid)
        on a thread of their own; until then a launch runs as one without any such call."""
        if self.rdv is None:
            self.rdv = Rendezvous()
            self.peer_core = 1 - core.index
            self.peer = threading.Thread(
                target=self._peer_main,
                args=(core.seq,),
                name=f"trn2core-nc{self.peer_core}",
                daemon=True,
            )
            self.peer.start()
        return self.rdv

    def _peer_main(self, after: int) -> None:
        """The peer core's thread: its programs after the ``after``-th of the grid."""
        why = "ended"
        try:
            for k, pid in enumerate(itertools.islice(self._programs(), after + 1, None), after + 1):
                if self.core_of(pid) == self.peer_core:
                    self._run(k, pid)
        except BaseException as e:  # noqa: BLE001 (re-raised on the launch's thread)
            self.peer_error = e
            why = f"raised {type(e).__name__} ({e})"
        finally:
            STATE.core = None
            assert self.rdv is not None
            self.rdv.end(self.peer_core, why)

    def _stop_peer(self, error: BaseException | None) -> BaseException | None:
        """Ends the launch thread's side of the rendezvous (``error``: how it ended), waits for
        the peer's thread (polling: Ctrl-C still interrupts, and then, as after an error, the
        peer is interrupted at its next bytecode), and returns the error to raise: the peer's
        when the launch thread's is only a rendezvous the peer left unmatched, else the launch
        thread's. Raises the peer's error when the launch thread had none."""
        peer = self.peer
        if peer is None:
            return error
        assert self.rdv is not None
        self.rdv.end(
            1 - self.peer_core, "ended" if error is None else f"raised {type(error).__name__}"
        )
        if error is not None:
            _interrupt(peer)
        else:
            try:
                while peer.is_alive():
                    peer.join(POLL_S)
            except BaseException:
                _interrupt(peer)
                raise
        failed = None if isinstance(self.peer_error, _PeerStopped) else self.peer_error
        if error is None:
            if failed is not None:
                raise failed
            return None
        if isinstance(error, RendezvousError) and failed is not None:
            if not isinstance(failed, RendezvousError):
                return failed
        return error

    def _write_back(self, inputs) -> None:
        """Copies what the kernel stored into its array arguments back into the caller's
        arrays, as AWS's simulator does (an argument is the device memory the kernel writes:
        nki-library's sub-kernels take their outputs as arguments). Arguments the kernel only
        read are left alone. Under LNC=2 each physical core's changed bytes are taken;
        both cores changing a byte to different values is a race."""
        keys = [*range(len(self.args)), *self.kwargs]
        for key in keys:
            caller = self.args[key] if isinstance(key, int) else self.kwargs[key]
            bound = [(a[key] if isinstance(key, int) else k[key]) for a, k in inputs]
            if not all(isinstance(t, NkiTensor) and id(t) in t._core.packed for t in bound):
                continue
            # Bytes nothing stored into are the caller's still (no read, no comparison).
            if not any(t._core.m.stored(t.tile) for t in bound):
                continue
            name = _arg_name(self.fn, key) if isinstance(key, int) else key
            # Compared element by element (as raw codes: a stored NaN is a change too).
            codes = np.dtype(f"u{bound[0].dtype.itemsize}")
            before = bound[0]._core.packed[id(bound[0])][1].view(codes)
            after = None
            for t in bound:
                now = t._core.m.read(t.tile).view(codes).reshape(-1)
                changed = now != before
                if not changed.any():
                    continue
                if after is None:
                    after = before.copy()
                    done = np.zeros(before.size, bool)
                clash = changed & done & (after != now)
                if clash.any():
                    raise KernelError(
                        f"{name}: both physical cores wrote element {int(np.argmax(clash))} "
                        "(flat index) of this argument with different values (a race on "
                        "shared HBM)",
                        arg=name,
                    )
                after[changed] = now[changed]
                done |= changed
            if after is None:
                continue
            arr = np.asarray(caller)
            if not arr.flags.writeable:
                raise KernelError(
                    f"{name}: the kernel stored into this argument, but the array passed is "
                    "read-only, so its results cannot be written back (pass a writeable array)",
                    arg=name,
                )
            t = bound[0]
            res = after.view(D.HOST_DTYPE[D.machine_name(t.dtype)]).reshape(arr.shape)
            for b in bound:
                self.arg_results[id(b)] = res
            np.copyto(arr, res.astype(np.bool_) if t.dtype == D.bool_ else res, casting="unsafe")

    def _release(self) -> None:
        """Breaks the launch's reference cycles (launch -> cores -> launch, core -> its tensors
        -> core, pending closures) so its machines are freed when the launch ends, not when
        the cyclic garbage collector next runs (each machine holds its memories: ~28 MB)."""
        for core in self.cores:
            core.release()

    def _leaves(self, x):
        """The tensors in a kernel's result (as ``_outputs`` walks it)."""
        if isinstance(x, NkiTensor):
            yield x
        elif isinstance(x, (tuple, list)):
            for v in x:
                yield from self._leaves(v)
        elif isinstance(x, dict):
            for v in x.values():
                yield from self._leaves(v)

    def _last_reads(self, result) -> set[int]:
        """The outputs (``id`` of their tiles) whose read is the last use of their tensor, so
        that it hands the tensor's buffer over instead of copying it (``Machine.take_hbm``):
        when every output is a whole tensor the kernel made, each returned once."""
        tiles = [t.tile for t in self._leaves(result)]
        made = all(
            self.created.get(id(tile), (None,))[0] is tile and tiles.count(tile) == 1
            for tile in tiles
        )
        return {id(tile) for tile in tiles} if made else set()

    def _outputs(self, x):
        # A method, not a recursive closure: a closure that calls itself is a reference cycle
        # (function -> cell -> function) that held the launch and its machines (issue 28).
        if isinstance(x, NkiTensor):
            return self.read_output(x)
        if isinstance(x, tuple):
            return tuple(self._outputs(v) for v in x)
        if isinstance(x, list):
            return [self._outputs(v) for v in x]
        if isinstance(x, dict):
            return {k: self._outputs(v) for k, v in x.items()}
        return x

    def read_output(self, t: NkiTensor) -> np.ndarray:
        if t._pdim is not None:
            raise KernelError(
                f"a kernel returns HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm)); this "
                f"output is in {t.buffer.name}"
            )
        mname = D.machine_name(t.dtype)
        host = D.HOST_DTYPE[mname]
        owner = t._core
        table = self.shared[owner.index]
        # The shared tensor itself first: two outputs of one shape have equal-looking tiles
        # (offset 0 of their own buffers), so the look-alike match is only the fallback.
        same = [j for j, s in enumerate(table) if s is t or s.tile is t.tile]
        if not same:
            same = [
                j for j, s in enumerate(table) if s.shape == t.shape and _same_tile(s.tile, t.tile)
            ]
            if len(same) > 1:
                raise KernelError(
                    f"output {t.name or 'tensor'} {t.shape}: a view that could be any of "
                    f"{len(same)} shared_hbm outputs of this shape; return the tensors "
                    "nl.ndarray made"
                )
        shared_j = same[0] if same else t._shared
        arg = self.arg_results.get(t._arg) if t._arg is not None else None
        if arg is not None:  # an argument the kernel stored into, or a view of it (a reshape)
            raw = np.ascontiguousarray(arg).reshape(-1).view(np.uint8)
            es = t.dtype.itemsize
            cols = (_view_elements(t.tile, es)[..., None] * es + np.arange(es)).reshape(-1)
            out = raw[cols].view(host).reshape(t.shape)
            return out.astype(np.bool_) if t.dtype == D.bool_ else out
        if self.lnc == 1 or shared_j is None:
            try:
                got = owner.m.take_hbm(t.tile) if id(t.tile) in self.take_ok else None
                if got is None:
                    raw = owner.m.read(t.tile)
                else:  # the buffer's uint32 words, the tensor's first and end byte in them
                    raw = got[0].view(np.uint8)[got[1] : got[2]]
            except Trn2ValueError as e:
                raise self._unwritten(
                    t,
                    f"output {t.name or 'tensor'} {t.shape}: {e} (the kernel did not write "
                    "every element of its output)",
                ) from None
            out = raw.view(host).reshape(t.shape)
            return out.astype(np.bool_) if t.dtype == D.bool_ else out
        return self._merge(shared_j, t, host)

    def _unwritten(self, t: NkiTensor, msg: str, base: NkiTensor | None = None) -> KernelError:
        """The error of an output the kernel left partly unwritten, at the line that created
        it (of ``base``, the tensor it views, when given; the kernel's first line when it
        returned a view made elsewhere)."""
        src = t if base is None else base
        made = self.created.get(id(src.tile))
        if made is not None and made[0] is src.tile:
            loc = (made[1], made[2])
        else:
            code = getattr(self.fn, "__code__", None)
            loc = (code.co_filename, code.co_firstlineno) if code else ("<unknown>", 0)
        err = KernelError(
            f"{loc[0]}:{loc[1]}: {msg} [rule output_unwritten]", rule="output_unwritten"
        )
        err.nki_location = loc  # type: ignore[attr-defined]
        return err

    def _merge(self, j: int, t: NkiTensor, host) -> np.ndarray:
        """An output written by the physical cores of an LNC=2 launch: each core's written
        bytes of the ``j``-th shared tensor; overlapping writes must agree (else a race).
        ``t`` is that tensor or a view of it (a reshape, an ``.ap``): its elements are then
        taken from the merged storage."""
        base = self.shared[self.cores[0].index][j]
        a, b = (core.written_bytes(self.shared[core.index][j]) for core in self.cores)
        out, seen = later_wins(a, b, f"output {t.name or j}", self.cores)
        # The view's bytes in the storage (the storage itself: all of them, in order).
        es = t.dtype.itemsize
        whole = t.shape == base.shape and t.tile.row_step == base.tile.row_step
        if t.tile is base.tile or (whole and _same_tile(t.tile, base.tile)):
            cols = slice(None)
        else:
            idx = _view_elements(t.tile, es)
            cols = (idx[..., None] * es + np.arange(es)).reshape(-1)
        if not seen[cols].all() and self.uninitialized == "nan":
            # As one core's read-back: bytes no core wrote keep the NaN fill.
            st = self.shared[self.cores[0].index][j]
            fill = self.cores[0].m.read(st.tile.rows(1, 0).ap([(1, st.size)], 0))
            out[~seen] = fill.view(np.uint8)[~seen]
            seen[:] = True
        if not seen[cols].all():
            first = int(np.argmin(seen[cols]))
            byte = first if isinstance(cols, slice) else int(cols[first])
            raise self._unwritten(
                t,
                f"output {t.name or j} {t.shape}: byte {byte} was never written by either "
                "physical core",
                base,
            )
        res = out[cols].view(host).reshape(t.shape)
        return res.astype(np.bool_) if t.dtype == D.bool_ else res


#: ``Machine.writers``' code of a byte no instruction wrote (none, or written from the host
#: or at a ``core_barrier``: the other core's bytes).
NO_WRITER = 0xFFFFFFFF


@dataclasses.dataclass
class WrittenBytes:
    """One physical core's copy of a shared HBM tensor (``Core.written_bytes``): its bytes,
    which it has written, per byte the last writing instruction (``NO_WRITER``: none; ``None``:
    none kept), and its timeline's ``(start, end)`` arrays per instruction (or a function that
    schedules them: only bytes both cores wrote differently need their times)."""

    core: int
    vals: np.ndarray
    seen: np.ndarray
    writer: object  # np.ndarray | None, or a function that returns it
    times: object

    def writers(self) -> np.ndarray | None:
        """Per byte, the instruction that last wrote it (fetched on first use)."""
        if callable(self.writer):
            self.writer = self.writer()
        return self.writer

    def writer_of(self, k: int) -> int:
        """The instruction that last wrote byte ``k`` (``NO_WRITER``: none)."""
        w = self.writers()
        return NO_WRITER if w is None else int(w[k])

    def when(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """When the instruction that last wrote each byte of ``idx`` ran on this core's clock
        (start, end in seconds; NaN: no instruction wrote it)."""
        start, end = np.full(len(idx), np.nan), np.full(len(idx), np.nan)
        writers = self.writers()
        if writers is None:
            return start, end
        w = np.asarray(writers[idx], np.int64)
        timed = w != NO_WRITER
        if timed.any():
            if callable(self.times):
                self.times = self.times()
            start[timed] = self.times[0][w[timed]]
            end[timed] = self.times[1][w[timed]]
        return start, end


def later_wins(a: WrittenBytes, b: WrittenBytes, what: str, cores) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of a shared HBM tensor both physical cores of an LNC=2 launch wrote, as the
    chip leaves them: where both wrote different values, the later write (by the two cores'
    clocks, which ``core_barrier`` and ``sendrecv`` synchronise) wins; two writes whose times
    overlap cannot be ordered, a race (``KernelError`` naming both lines, rule ``hbm_race``). A
    write of no instruction (the other core's bytes taken at a barrier) yields to a timed one;
    two such writes must agree. Returns ``(bytes, written)``."""
    out = np.where(b.seen, b.vals, a.vals)
    seen = a.seen | b.seen
    both = np.flatnonzero(a.seen & b.seen & (a.vals != b.vals))
    if not both.size:
        return out, seen
    (a_start, a_end), (b_start, b_end) = a.when(both), b.when(both)
    ta, tb = ~np.isnan(a_end), ~np.isnan(b_end)
    a_later = ta & (~tb | (b_end <= a_start))
    b_later = tb & (~ta | (a_end <= b_start))
    out[both[a_later]] = a.vals[both[a_later]]
    race = ~a_later & ~b_later
    if race.any():
        r = int(np.argmax(race))
        k = int(both[r])
        if ta[r] and tb[r]:
            fa, la = cores[a.core].line_of(a.writer_of(k))
            fb, lb = cores[b.core].line_of(b.writer_of(k))
            msg = (
                f"{fa}:{la}: {what}: physical core {a.core} (here, {a_start[r] * 1e6:.3f}-"
                f"{a_end[r] * 1e6:.3f} us) and physical core {b.core} ({fb}:{lb}, "
                f"{b_start[r] * 1e6:.3f}-{b_end[r] * 1e6:.3f} us) wrote byte {k} with different "
                "values at overlapping times, with no core_barrier or sendrecv ordering them "
                "(a race on shared HBM) [rule hbm_race]"
            )
            loc = (fa, la)
        else:
            msg = (
                f"{what}: both physical cores wrote byte {k} with different values (a race on "
                "shared HBM) [rule hbm_race]"
            )
            loc = None
        err = KernelError(msg, rule="hbm_race")
        if loc is not None:
            err.nki_location = loc  # type: ignore[attr-defined]
        raise err
    return out, seen


def _view_elements(tile, itemsize: int) -> np.ndarray:
    """The storage element indices (of ``itemsize`` bytes) an HBM tile reads, in its order."""
    idx = np.asarray(tile.offset // itemsize, np.int64)
    steps = [tile.row_step, *(st for st, _ in tile.pattern)]
    for ax, (st, n) in enumerate(zip(steps, tile.shape, strict=True)):
        shape = [1] * len(steps)
        shape[ax] = n
        idx = idx + (np.arange(n, dtype=np.int64) * st).reshape(shape)
    return idx


def _same_tile(a, b) -> bool:
    return (
        a.shape == b.shape
        and a.offset == b.offset
        and a.pattern == b.pattern
        and a.space == b.space
        and a.start_partition == b.start_partition
    )


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or (
        hasattr(x, "__array__") and hasattr(x, "dtype") and hasattr(x, "shape")
    )


def _arg_name(fn, i: int) -> str:
    """The kernel's name for its ``i``-th positional argument (``arg{i}`` without one)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or an object without a signature
        params = []
    return params[i] if i < len(params) else f"arg{i}"


def _check_host(fn, args, kwargs, lnc: int) -> None:
    """The host check of a launch's inputs, before any is copied (issue 28): per array
    argument a converted contiguous copy when it needs one, the machine's HBM copy on each
    physical core, and the read-back of each copy and the merged result after the run
    (``Launch._write_back``). ``CapacityError`` naming the argument; nothing is allocated."""
    from .. import _validate

    total, largest = 0, None
    items = [*((_arg_name(fn, i), a) for i, a in enumerate(args)), *kwargs.items()]
    for name, x in items:
        if not _is_array(x):
            continue
        a = np.asarray(x)
        try:
            host = D.HOST_DTYPE[D.machine_name(D.as_dtype(a.dtype.newbyteorder("="), name))]
        except Trn2Error:
            continue  # refused with its own message when bound
        held = int(a.size) * host.itemsize
        copy = 0 if (a.dtype == host and a.flags.c_contiguous) else held
        need = copy + lnc * held + (lnc + 1) * held
        total += need
        if largest is None or need > largest[1]:
            largest = (name, need)
    if largest is not None:
        _validate.check_alloc(
            total,
            largest[0],
            f"the kernel's inputs ({_validate.human_bytes(total)} with their "
            "device copies and read-back)",
        )


def _bind(core: Core, args, kwargs):
    """The kernel's arguments with numpy arrays as HBM tensors of ``core``."""

    def conv(x, name):
        if isinstance(x, np.generic) and not isinstance(x, np.void):
            # A numpy scalar (``scale=1 / np.sqrt(d)`` is a float64) is a Python constant.
            return x.item()
        if _is_array(x):
            a = np.asarray(x)
            if a.dtype == np.float64:
                raise KernelError(
                    f"{name}: float64 arrays are not an NKI dtype; convert to float32 (or "
                    "bfloat16, float16, ...) first"
                )
            t = core.constant(a, name)
            core.hbm_inputs.append(t)
            return t
        return x

    a2 = [conv(a, f"arg{i}") for i, a in enumerate(args)]
    k2 = {k: conv(v, k) for k, v in kwargs.items()}
    return a2, k2


__all__ = [
    "HBM",
    "PRIVATE_HBM",
    "PSUM",
    "SBUF",
    "SHARED_HBM",
    "CapacityError",
    "Core",
    "IndexExpr",
    "KernelError",
    "Launch",
    "LoopCarriedDependencyError",
    "api",
    "current",
]
