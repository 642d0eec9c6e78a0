"""NKI tensors as handles: a machine access pattern (``trn2core._core.Tile``) plus the NKI view
of it (logical shape, dtype, buffer, which logical axis is the partition axis).

A tensor never holds a copy of device memory: slicing, ``nl.ds``, legacy ``arange`` indexing,
``reshape`` and free-axis ``broadcast_to`` make new handles over the same bytes; arithmetic
operators (``a + b``, ``t += x``) are instructions, issued by the tensor's core
(``trn2core.nki._runtime.Core``), which this module never imports: every tensor carries its core.

Layout: an SBUF/PSUM tensor of logical shape ``(B..., P, F...)`` (``P`` the partition axis,
``nl.par_dim`` in the legacy dialect, else the first axis) is the machine tensor
``(P, B..., F...)``: the same bytes on each of ``P`` consecutive partitions. An HBM tensor is
the machine's HBM buffer in C order (its first axis the DMA's row axis).
"""

from __future__ import annotations

import itertools
import math
import weakref

import numpy as np

from .. import _core
from ..errors import CapacityError, ShapeError, Trn2ValueError
from . import _dtypes as D
from ._api import api
from ._index import IndexExpr, Mask, NotSupportedError, grid_of, var_axis
from ._register import VirtualRegister

_TILE = _core.Tile


class Buffer:
    """A memory: ``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ``nl.private_hbm``, ``nl.shared_hbm``."""

    __slots__ = ("name", "space")

    def __init__(self, name: str, space: str) -> None:
        self.name = name
        self.space = space

    def __repr__(self) -> str:
        return f"nki.language.{self.name}"


SBUF = Buffer("sbuf", "sbuf")
PSUM = Buffer("psum", "psum")
HBM = Buffer("hbm", "hbm")
PRIVATE_HBM = Buffer("private_hbm", "hbm")
SHARED_HBM = Buffer("shared_hbm", "hbm")


class Placement:
    """Where the kernel puts a tensor (NKI's explicit allocation): ``ncc.sbuf.mod_alloc(...)``,
    ``ncc.psum.mod_alloc(...)`` (``buffer=``) or ``nl.ndarray(address=(partition, byte))``.
    ``address`` is the byte within each partition (PSUM: from bank 0); ``tiles`` the physical
    tiles of each leading block axis (block ``i`` of axis ``k`` lives in tile ``i % tiles[k]``;
    empty: one); ``bank_tiles`` whether those tiles are one PSUM bank apart."""

    __slots__ = ("buffer", "partition", "address", "tiles", "bank_tiles", "what", "func")

    def __init__(
        self, buffer, partition, address, tiles=(), bank_tiles=False, what="", func=None
    ) -> None:
        self.buffer = buffer
        self.partition = partition
        self.address = address
        self.tiles = tuple(tiles)
        self.bank_tiles = bank_tiles
        self.what = what
        # ``ncc.sbuf.alloc(func)`` / ``psum.alloc(func)``: ``func(idx=, pdim_size=,
        # fdim_size=)`` places each block (``Core.func_block``).
        self.func = func

    def __repr__(self) -> str:
        return f"{self.what or 'Placement'}(partition={self.partition}, address={self.address})"


class Blocks:
    """An explicitly placed tensor's leading block axes: ``n[k]`` physical tiles for axis
    ``k`` (at most its size; none without block axes); ``address`` its first byte in each
    partition, so that a block's region is known across tensors (``Core.block_fresh``)."""

    __slots__ = ("n", "address", "uid")
    _serial = itertools.count()

    def __init__(self, n, address: int) -> None:
        self.n = tuple(n)
        self.address = address
        self.uid = next(Blocks._serial)  # unlike id(), never reused by a later tensor

    def physical(self, key: list, shape) -> tuple | None:
        """Maps integer block indices of ``key`` onto their physical tiles (in place); the
        logical block, when every block axis has an integer index."""
        logical = []
        for a, n in enumerate(self.n):
            k, size = key[a], shape[a]
            if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
                i = int(k)
                if i < -size or i >= size:
                    raise OutOfBoundsError(
                        f"index: {i} is out of range for axis {a} of size {size} "
                        f"(tensor {tuple(shape)}) [rule bounds]"
                    )
                i %= size
                key[a] = i % n
                logical.append(i)
            elif n < size:
                raise NotSupportedError(
                    f"index: axis {a} has {size} blocks on {n} physical tiles (mod_alloc): "
                    "index a block axis of such a tensor with an integer"
                )
        return tuple(logical) if len(logical) == len(self.n) else None


class LazyBlocks:
    """A legacy on-chip array with leading block axes (in PSUM; in SBUF when it does not fit
    whole): each block (indexed by integers on every block axis) gets its own storage when
    first used, and when memory runs out the least recently used block of such arrays gives
    its storage up (``Core.lazy_block``): in SBUF it is spilled to HBM and reloaded when used
    again; reading a released PSUM block again is a ``CapacityError``."""

    __slots__ = (
        "core",
        "nblock",
        "mshape",
        "dtype",
        "buffer",
        "name",
        "error",
        "live",
        "released",
        "spilled",
        "uid",
        "writing",
    )
    _serial = itertools.count()

    def __init__(self, core, nblock, mshape, dtype, buffer, name, error) -> None:
        self.core = core
        self.nblock = nblock
        self.mshape = mshape
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.error = error  # the whole array's CapacityError (None in PSUM: not tried)
        self.live: dict = {}  # block -> its _Alloc
        self.released: set = set()  # PSUM blocks whose storage went to others
        self.spilled: dict = {}  # SBUF block -> its spill slot (an HBM tile)
        self.uid = next(LazyBlocks._serial)
        self.writing = False


class FuncBlocks:
    """A tensor whose blocks ``alloc(func)`` places one by one: each block is its own placed
    tensor, made when first indexed with integers on every block axis."""

    __slots__ = ("nblock", "shape", "dtype", "buffer", "name", "place", "cache")

    def __init__(self, nblock, shape, dtype, buffer, name, place) -> None:
        self.nblock = nblock
        self.shape = shape  # a block's logical shape (P, F...)
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.place = place
        self.cache: dict = {}


class _Whole:
    """The tile of a ``LazyBlocks`` array as a whole: an access spanning several blocks. Before
    any block has storage, the array is allocated whole then (``CapacityError`` if it does not
    fit); afterwards that is a ``CapacityError``."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: LazyBlocks) -> None:
        self.blocks = blocks

    def resolve(self, t: NkiTensor):
        b = self.blocks
        if not b.live and not b.released and not b.spilled:
            b.core.lazy_whole(t)
            return t._t
        e = b.error or CapacityError(f"{b.name}: the array's blocks have storage of their own")
        raise type(e)(
            f"{e} (its blocks are given storage one at a time, each when first indexed with "
            "integers on every block axis; this access spans several blocks)"
        )


class Spilled:
    """The ``_t`` of a tensor holding the whole tile of a tensor spilled to HBM: its next use
    reloads it (``Core.reload``) and takes the reloaded tile."""

    __slots__ = ("owner",)

    def __init__(self, owner) -> None:
        self.owner = owner  # the tensor's ``_Alloc`` (trn2core.nki._runtime)

    def resolve(self, t: NkiTensor):
        o = self.owner
        if o.m is None:
            t._core.reload(o)
        t._t = o.tile
        return o.tile


class Indirect:
    """An HBM access whose axis ``axis`` is indexed by the values of the tile ``idx``."""

    __slots__ = ("base", "key", "axis", "idx")

    def __init__(self, base, key, axis, idx) -> None:
        self.base, self.key, self.axis, self.idx = base, key, axis, idx


class OutOfBoundsError(ShapeError):
    """An index or slice reaches outside its tensor."""


class DynIndex:
    """An index of one axis moved by a dynamic offset: the value in the ``[1, 1]`` integer tile
    ``offset`` plus ``expr`` (an index expression, an integer or a slice): the legacy
    ``t[i, off + j]`` (``off`` a tile element, ``j`` an ``nl.arange`` variable)."""

    __slots__ = ("offset", "expr")

    def __init__(self, offset, expr) -> None:
        self.offset, self.expr = offset, expr

    def __add__(self, other):
        if isinstance(other, (IndexExpr, int, np.integer)):
            return DynIndex(self.offset, self.expr + other)
        return NotImplemented

    __radd__ = __add__


class Dynamic:
    """The access of an on-chip view indexed by a dynamic offset: ``static`` (the machine tile
    the offset 0 gives), the ``[1, 1]`` tensor ``offset`` holding the value, ``step`` (elements
    one unit moves the access: the indexed axis's stride) and ``limit`` (the value is below it;
    0: no bound but the tensor's). ``tensor_copy_dynamic_src`` / ``_dst`` hand these to the
    machine, which reads the value itself; any other instruction reads it when issued
    (``resolve``)."""

    __slots__ = ("static", "offset", "step", "limit")

    def __init__(self, static, offset, step: int, limit: int) -> None:
        self.static, self.offset, self.step, self.limit = static, offset, step, limit

    def resolve(self, t: NkiTensor):
        """The access at the offset's current value."""
        v = t._core.offset_value(self.offset)
        if v < 0 or (self.limit and v >= self.limit):
            raise OutOfBoundsError(
                f"index: the dynamic offset is {v}, outside 0..{self.limit or ''} [rule bounds]"
            )
        return self.static.ap(list(self.static.pattern), v * self.step)


class VectorOffset:
    """An HBM view ``t.ap(pattern, offset, vector_offset=idx, indirect_dim=0)``: row ``w`` of
    the pattern starts ``idx[w]`` rows of ``t`` (``row`` elements each: ``t.shape[1:]``) past
    ``offset``, the pattern's own first stride unused (the NKI access-pattern reference).
    ``root`` is the storage's element 0 (in the view's dtype), ``rest`` the pattern's other
    pairs, ``limit`` ``t.shape[0]`` (an index at or past it is out of bounds). Only
    ``nisa.dma_copy`` reads or writes it (``Core.vector_offset_copy``) and
    ``nisa.dma_transpose`` reads it (``Core.vector_offset_transpose``)."""

    __slots__ = ("root", "rest", "offset", "row", "limit", "idx", "shape")

    def __init__(self, root, rest, offset: int, row: int, limit: int, idx, shape) -> None:
        self.root, self.rest, self.offset, self.row = root, rest, offset, row
        self.limit, self.idx, self.shape = limit, idx, shape


class PartitionDimError(ShapeError):
    """A tile's partition dimension is over 128, or a view would move data across partitions."""


class DS:
    """``nl.ds(start, size)``: the slice ``start : start + size``."""

    __slots__ = ("start", "size")

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size

    def __repr__(self) -> str:
        return f"ds({self.start}, {self.size})"


def _int(v, what: str) -> int:
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    raise Trn2ValueError(f"index: {what} must be an integer, got {v!r}")


def _resolve_slice(s, size: int, axis: int) -> tuple[int, int, int]:
    """``(start, count, step)`` of a slice on an axis of ``size``; out of range is an error
    (NKI checks bounds; numpy would clamp)."""
    step = 1 if s.step is None else _int(s.step, "a slice step")
    if step == 0:
        raise Trn2ValueError(f"index: axis {axis}: slice step cannot be zero")
    if step < 0:
        start, stop, step = s.indices(size)
        return start, len(range(start, stop, step)), step
    start = 0 if s.start is None else _int(s.start, "a slice start")
    stop = size if s.stop is None else _int(s.stop, "a slice stop")
    if start < 0:
        start += size
    if stop < 0:
        stop += size
    if not (0 <= start <= size) or not (0 <= stop <= size):
        raise OutOfBoundsError(
            f"index: slice {s.start}:{s.stop} of axis {axis} is out of range for size {size} "
            "[rule bounds]"
        )
    count = len(range(start, stop, step))
    if count == 0:
        raise OutOfBoundsError(f"index: slice {s.start}:{s.stop} of axis {axis} is empty")
    return start, count, step


class _Unresolved:
    """The tile of a legacy indexed access that reaches outside its tensor: usable only with a
    mask that keeps it inside (``nl.load(x[i, j], mask=(i < n))``)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


#: Free axes of one machine access pattern (``Tile.ap``: 1 to 4 ``[step, num]`` pairs).
MAX_AP_FREE = 4


def merge_free(free: list) -> list:
    """``[step, num]`` pairs with each pair that continues the next one in memory merged into
    it (and size-1 pairs dropped): the same elements in the same order."""
    out: list = []
    for st, n in free:
        if n == 1 and len(free) > 1:
            continue
        if out and out[-1][0] == st * n:
            out[-1] = (st, out[-1][1] * n)
        else:
            out.append((st, n))
    return out or [(1, 1)]


class Split:
    """The tile of a legacy indexed on-chip access over more free axes than an access pattern
    takes (nki-samples' trilinear interpolation indexes through a seven-axis ``nl.mgrid``): the
    legacy compiler lowers it into several instructions, trn2core into ``parts``, each a machine
    tile over the last ``MAX_AP_FREE`` axes with its first element's place among the view's
    elements (row-major). Read, it is gathered into a new tile (a ``tensor_copy`` a part);
    assigned to (``Core.assign``), each part gets its share of the value."""

    __slots__ = ("parts", "count")

    def __init__(self, parts: list, count: int) -> None:
        self.parts, self.count = parts, count

    def resolve(self, t: NkiTensor):
        core = t._core
        tmp = core.alloc(t.shape, t.dtype, t.buffer if t.buffer is not PSUM else SBUF, 0, flat=True)
        self.copy(core, tmp.tile, True)
        core.held.append(tmp)  # alive until the instructions reading it are issued
        return tmp.tile

    def copy(self, core, flat, gather: bool, rows: tuple[int, int] | None = None) -> None:
        """One ``tensor_copy`` a part between it and its share of ``flat`` (a tile of the
        view's elements in one row-major free axis): into ``flat`` (``gather``) or out of it;
        on partitions ``rows`` only when given."""
        for part, at in self.parts:
            share = flat.ap([(1, self.count)], at)
            if rows is not None:
                share, part = share[rows[0] : rows[1]], part[rows[0] : rows[1]]
            dst, src = (share, part) if gather else (part, share)
            core.issue("tensor_copy", "vector", dst, src)


def _binary(op: str, reverse: bool = False):
    """An operator method of ``NkiTensor``: the element-wise ALU ``op`` with the other operand
    (``reverse``: the other operand on the left, as ``__radd__`` and the like have it)."""

    def method(self, o):
        return self._bin(op, o, reverse)

    return method


def _inplace(op: str):
    """An in-place operator method of ``NkiTensor`` (``+=`` and the like): ``op`` into ``self``."""

    def method(self, o):
        return self._inplace_op(op, o)

    return method


class NkiTensor:
    """A tensor in HBM, SBUF or PSUM (see the module doc). ``shape``, ``dtype``, ``buffer``,
    ``ndim``, ``size``, ``itemsize``, ``name``; indexing and views make new handles."""

    __slots__ = (
        "_t",
        "shape",
        "_pdim",
        "dtype",
        "buffer",
        "_core",
        "_owner",
        "_access",
        "name",
        "_valid",
        "_written",
        "_blocks",
        "_shared",
        "_arg",
        "_compared",
        "_result",
        "_masked",
        "__weakref__",
    )

    def __init__(self, tile, shape, pdim, dtype, buffer, core, owner=None, name="") -> None:
        self._t = tile
        self.shape = tuple(shape)
        self._pdim = pdim
        self.dtype = dtype
        self.buffer = buffer
        self._core = core
        self._owner = owner
        self._access = None
        self._compared = False  # a comparison's result (``__bool__``)
        # An instruction's result the front end placed (``Core.pend``), not a declared tensor.
        self._result = False
        self._masked = False  # a legacy mask index's view (``t[mask]``): ``_valid`` its region
        self.name = name
        # The region a masked instruction wrote ({axis: (lo, hi)}), None when whole: the
        # tile's unmasked uses compute only there (the compiler propagates masks).
        self._valid = None
        self._written = False  # any assignment into it yet (legacy row tracking)
        # Explicit placement with block axes: ``Blocks`` on the tensor itself; on a view of
        # one block, ``(Blocks, logical block)``.
        self._blocks = None
        # A view of the launch's ``j``-th shared_hbm tensor (kept by every view of it): under
        # LNC=2 its bytes are merged from both physical cores when it is returned.
        self._shared: int | None = None
        # A view of a kernel argument (the ``id`` of that argument's tensor on this core, kept
        # by every view of it): returning it returns what the launch's cores stored into the
        # argument.
        self._arg: int | None = None

    # -------------------------------------------------------------------- properties
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def tile(self):
        """The machine tile (issues a pending instruction first)."""
        t = self._t
        if type(t) is _TILE:
            return t
        if t is None:
            self._core.flush()
            t = self._t
        if type(t) is _Unresolved:
            raise OutOfBoundsError(t.message)
        if type(t) is _Whole or type(t) is Dynamic or type(t) is Spilled or type(t) is Split:
            t = t.resolve(self)
        elif type(t) is VectorOffset:
            raise NotSupportedError(
                "ap: a view indexed by vector_offset (an indirect DMA) is read or written by "
                "nisa.dma_copy, or read by nisa.dma_transpose, only"
            )
        elif type(t) is FuncBlocks:
            raise NotSupportedError(
                f"{t.name}: an access spanning blocks of a tensor placed block by block "
                f"({t.place.what}); index every block axis with an integer"
            )
        return t

    def __repr__(self) -> str:
        return f"NkiTensor(shape={self.shape}, dtype={self.dtype}, buffer={self.buffer.name})"

    @api
    def __bool__(self) -> bool:
        """A tensor is an object, true as any (kernels test an optional tensor argument so:
        nki-library's mlp_tkg_constants.py ``if params.expert_params.expert_index:``). A
        comparison's result is an error instead: its values are on the device."""
        if self._compared:
            raise Trn2ValueError(
                "a comparison of tensors has no Python truth value (its values are on the "
                "device); compare shapes and dtypes, or use nl.where / nisa.affine_select on "
                "values"
            )
        return True

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self):
        raise Trn2ValueError("a tensor is not iterable; index it (t[i]) or loop over a range")

    __hash__ = object.__hash__

    def _adopt(self, src: NkiTensor) -> None:
        """Names ``src``'s storage from now on (a pending result placed, or moved to SBUF);
        a whole tensor's owner that tracks its handles (spills) tracks this one too."""
        self._t, self._owner = src._t, src._owner
        o = src._owner
        if o is not None and o.handles is not None and self._t is o.tile:
            o.handles.append(weakref.ref(self))

    # -------------------------------------------------------------------- views
    def _view(self, tile, shape, pdim) -> NkiTensor:
        t = NkiTensor(
            tile, shape, pdim, self.dtype, self.buffer, self._core, self._owner, self.name
        )
        t._shared = self._shared
        t._arg = self._arg
        # A view (slice, reshape, ``.ap``) of a placed tensor without block axes, or of one
        # block, is still that tensor for ``nc_matmul``'s accumulate=None (Core.block_fresh).
        b = self._blocks
        if type(b) is tuple or (type(b) is Blocks and not b.n):
            t._blocks = b
        return t

    def _machine_axis(self, a: int) -> int:
        """The machine axis of logical axis ``a`` (SBUF/PSUM: partition axis first)."""
        p = self._pdim
        if p is None or a == p:
            return 0 if p is not None else a
        return a + 1 if a < p else a

    def _normalize(self, key) -> list:
        key = list(key) if isinstance(key, tuple) else [key]
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise Trn2ValueError("index: at most one '...' in an index")
        if n_ell:
            i = key.index(Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key[i : i + 1] = [slice(None)] * max(fill, 0)
        if len(key) > self.ndim:
            raise OutOfBoundsError(
                f"index: {len(key)} indices for a tensor of {self.ndim} axes {self.shape}"
            )
        key += [slice(None)] * (self.ndim - len(key))
        for i, k in enumerate(key):
            if isinstance(k, DS):
                key[i] = slice(k.start, k.start + k.size)
            elif isinstance(k, VirtualRegister):  # a register indexes by its value (now)
                key[i] = k.get("index")
            elif k is None:
                raise NotSupportedError("index: None (a new axis) is not an NKI index")
        return key

    # The common case (one slice or int per axis), in the api wrapper's own frame: what
    # _normalize and _getitem do with such a key, without their checks for what it does not
    # hold; _basic answers None for a key holding anything else.
    @api(
        inline="""
        if type(key) is tuple and len(key) == len(self.shape) and self._blocks is None:
            _r = self.tile.basic_view(key, self.shape, self._pdim)
            if _r is not None:
                return self._view(*_r)
            _v = self._basic(key, True)
            if _v is not None:
                return _v
        """
    )
    def __getitem__(self, key) -> NkiTensor:
        if type(key) is Mask:
            return self._under(key)
        key = self._normalize(key)
        blocks = self._blocks
        if type(blocks) in (LazyBlocks, FuncBlocks):
            n = blocks.nblock
            if all(isinstance(k, (int, np.integer)) for k in key[:n]):
                idx = []
                for a, k in enumerate(key[:n]):
                    i, size = int(k), self.shape[a]
                    if i < -size or i >= size:
                        raise OutOfBoundsError(
                            f"index: {i} is out of range for axis {a} of size {size} "
                            f"(tensor {self.shape}) [rule bounds]"
                        )
                    idx.append(i % size)
                if type(blocks) is FuncBlocks:
                    block = self._core.func_block(blocks, tuple(idx))
                else:
                    block = self._core.lazy_block(blocks, tuple(idx))
                return block[tuple(key[n:])]
            self.tile  # noqa: B018 - allocates the array whole, or raises
            return self._getitem(key)
        if type(blocks) is Blocks:
            logical = blocks.physical(key, self.shape)
            v = self._getitem(key)
            if logical is not None:
                v._blocks = (blocks, logical)
            return v
        return self._getitem(key)

    def _under(self, mask: Mask) -> NkiTensor:
        """Legacy ``t[mask]``: this tile with a mask attached, the region it holds
        (``_valid``, the grid axes the mask's variables index), so the instruction that reads
        it computes there only, as for a tile a masked instruction made (nki-samples' reference
        ``rmsnorm_quant`` broadcasts its last, partial gamma tile through the tensor engine
        as ``nc_matmul(ones, gamma[i, j][mask])``). A view whose index runs outside the tensor
        is resolved under the mask when read."""
        if self._core.launch.dialect != "legacy":
            raise NotSupportedError(
                "index: a mask as an index (t[mask]) is legacy NKI (neuronxcc.nki); the "
                "current dialect takes slices"
            )
        ranges = self._core.mask_ranges(mask, self.ndim)
        axes = {0: (0, 0)} if ranges is None else dict(ranges[1])
        for a, (lo, hi) in (self._valid or {}).items():
            r = axes.get(a, (lo, hi))
            axes[a] = (max(lo, r[0]), min(hi, r[1]))
        for a, (lo, hi) in axes.items():
            if a >= self.ndim or (lo, hi) != (0, 0) and not 0 <= lo < hi <= self.shape[a]:
                raise Trn2ValueError(
                    f"index: the mask restricts grid axis {a} to [{lo}, {hi}), outside this "
                    f"{self.shape} tile"
                )
        v = self._view(self._t, self.shape, self._pdim)
        v._access, v._valid, v._masked = self._access, axes, True
        return v

    def _assign_under(self, mask: Mask, value) -> None:
        """Legacy ``t[mask] = value``: a number or a tile of ``t``'s shape written where the
        mask holds only."""
        view = self._under(mask)
        core = self._core
        if isinstance(value, NkiTensor) and value is core.pending:
            raise NotSupportedError(
                "index: an instruction's result assigned through a mask index "
                "(t[...][mask] = nisa.f(...)) is not emulated; pass the mask as mask= to the "
                "instruction"
            )
        region = ({}, view._valid)
        if any(lo >= hi for lo, hi in view._valid.values()):
            return  # the mask never holds
        if isinstance(value, NkiTensor):
            if value.shape != self.shape:
                raise ShapeError(
                    f"value: a {value.shape} tile assigned to a {self.shape} view [rule shape]"
                )
            value = core.masked(value, region)
        core.assign(core.masked(view, region), value)

    def _getitem(self, key: list) -> NkiTensor:
        for k in key:
            if type(k) is NkiTensor or type(k) is DynIndex:
                return self._indirect(key) if self._pdim is None else self._dynamic(key)
        if any(isinstance(k, IndexExpr) for k in key):
            try:
                v = self._advanced(list(key), None)
                v._valid = self._rows_valid(key)
                return v
            except OutOfBoundsError as e:
                # Out of range unless a mask restricts it: resolved again under the mask.
                exprs = [k for k in key if isinstance(k, IndexExpr)]
                v = self._view(
                    _Unresolved(f"{e} (no mask= keeps the index inside the tensor)"),
                    grid_of(exprs),
                    None if self._pdim is None else 0,
                )
                v._access = (self, key)
                return v
        return self._basic(key)

    def _indirect(self, key: list) -> NkiTensor:
        """``a[idx, j]`` of an HBM tensor with a ``[P, 1]`` integer tile ``idx`` on one axis:
        partition ``p`` reads index ``idx[p]`` of that axis (indirect DMA; ``nl.load`` reads
        it: ``Core.gather``). The other indices: integers, and index expressions over the
        free grid axes."""
        at = [a for a, k in enumerate(key) if isinstance(k, (NkiTensor, DynIndex))]
        idx = key[at[0]]
        if type(idx) is DynIndex or len(at) != 1:
            raise NotSupportedError(
                "index: an HBM tensor takes one [P, 1] index tile alone on its axis (indirect "
                "DMA); a dynamic offset plus an index expression indexes an SBUF or PSUM tile"
            )
        if idx._pdim != 0 or idx.size != idx.shape[0] or np.dtype(idx.dtype).kind not in "iu":
            raise Trn2ValueError(
                f"index: an index tile is a [P, 1] integer tile in SBUF, got {idx.shape} "
                f"{idx.dtype}",
                arg="index",
            )
        for k in key:
            if isinstance(k, slice) and k != slice(None):
                raise NotSupportedError("index: slices beside an index tile (use nl.arange)")
        exprs = [k for k in key if isinstance(k, IndexExpr)]
        gshape = grid_of(exprs) if exprs else (1, 1)
        if gshape[0] != 1:
            raise NotSupportedError(
                "index: beside an index tile (the partitions), index expressions vary along "
                "the free grid axes only"
            )
        shape = (idx.shape[0], *gshape[1:]) if len(gshape) > 1 else (idx.shape[0], 1)
        v = self._view(_Unresolved("index: an indirect access is read by nl.load"), shape, None)
        v._access = Indirect(self, key, at[0], idx)
        return v

    def _dynamic(self, key: list) -> NkiTensor:
        """``t[..., off, ...]`` or the legacy ``t[i, off + j]`` of an on-chip tensor, ``off`` a
        ``[1, 1]`` integer tile: the access with ``off``'s value added to that free axis's index
        (``Dynamic``; the machine reads the value when ``tensor_copy_dynamic_src`` / ``_dst``
        runs)."""
        at = [a for a, k in enumerate(key) if type(k) in (NkiTensor, DynIndex)]
        if len(at) != 1:
            raise NotSupportedError("index: one dynamic offset per access")
        a = at[0]
        k = key[a]
        off, expr = (k.offset, k.expr) if type(k) is DynIndex else (k, 0)
        if a == self._pdim:
            raise PartitionDimError(
                "index: a dynamic offset moves an on-chip access along a free axis; axis "
                f"{a} is the partition axis"
            )
        if off.size != 1:
            raise Trn2ValueError(
                f"index: a dynamic offset is a [1, 1] integer tile, got {off.shape} {off.dtype}",
                arg="index",
            )
        static = list(key)
        static[a] = expr
        v = self._getitem(static)
        size = self.shape[a]
        if isinstance(expr, IndexExpr):
            top = expr.const + sum(max(c * (var.size - 1), 0) for var, c in expr.terms.items())
        elif isinstance(expr, slice):
            start, count, step = _resolve_slice(expr, size, a)
            top = start + (count - 1) * max(step, 0)
        else:
            top = _int(expr, "an index") % size
        v._t = Dynamic(v.tile, off, self._axes()[a][0], size - top)
        v._access = None
        return v

    def _basic(self, key, quick: bool = False) -> NkiTensor | None:
        """The view of ``key``, one slice or int per axis. ``quick``: None instead, for the
        general path, when an index is anything but an ``int`` or a step-1 slice of ``int``s
        inside the axis (so that path names what is wrong, in its own order). The hot path
        (``__getitem__``) asks the core first (``Tile.basic_view``, the same rule for those
        keys); tests/test_nki.py keeps the two equal on random keys."""
        p = self._pdim
        on_chip = p is not None
        dims = self.shape
        shape: list[int] = []
        mkey: list = [None] * len(dims)
        new_pdim = None
        free_kept = 0
        last_int = None
        for a, k in enumerate(key):
            size = dims[a]
            # The machine axis of logical axis a (SBUF/PSUM: the partition axis first), as
            # _machine_axis, inline: this runs for every slice a kernel takes.
            m = a if p is None or a > p else (0 if a == p else a + 1)
            if type(k) is slice:
                start, stop = k.start, k.stop
                if (
                    k.step is None
                    and (start is None or type(start) is int)
                    and (stop is None or type(stop) is int)
                ):
                    # A step-1 slice of plain ints, inline; what is out of range or empty
                    # goes to _resolve_slice for its error.
                    start = 0 if start is None else start + size if start < 0 else start
                    stop = size if stop is None else stop + size if stop < 0 else stop
                    if not 0 <= start < stop <= size:
                        if quick:
                            return None
                        _resolve_slice(k, size, a)
                    count = stop - start
                elif quick:
                    return None
                else:
                    _, count, _ = _resolve_slice(k, size, a)
                mkey[m] = k
                if on_chip and a == p:
                    new_pdim = len(shape)
                elif on_chip and a > p:
                    free_kept += 1
                shape.append(count)
            else:
                if type(k) is int:
                    i = k
                elif quick:
                    return None
                else:
                    i = _int(k, f"the index of axis {a}")
                if i < -size or i >= size:
                    if quick:
                        return None
                    raise OutOfBoundsError(
                        f"index: {i} is out of range for axis {a} of size {size} "
                        f"(tensor {self.shape}) [rule bounds]"
                    )
                i %= size
                mkey[m] = i
                if on_chip and a == p:
                    new_pdim = len(shape)
                    shape.append(1)
                    mkey[0] = slice(i, i + 1)
                elif on_chip and a > p:
                    last_int = (a, i, len(shape))
                elif not on_chip and shape:
                    last_int = (a, i, len(shape))  # an HBM axis indexed after a kept one
        if on_chip and free_kept == 0 and last_int is not None:
            # On-chip tensors stay at least 2-D: the last free axis is kept at size 1.
            a, i, pos = last_int
            mkey[self._machine_axis(a)] = slice(i, i + 1)
            shape.insert(pos, 1)
        if (
            not on_chip
            and len(shape) == 1
            and last_int is not None
            and self._core.launch.dialect == "legacy"
        ):
            # Legacy dialect: `a[0:128, j]` is a [128, 1] access (its first axis the
            # partitions of the tile it loads into), as the legacy tutorials use it.
            a, i, pos = last_int
            mkey[a] = slice(i, i + 1)
            shape.insert(pos, 1)
        if not shape:
            shape = [1]
        tile = self.tile[tuple(mkey)]
        v = self._view(tile, shape, new_pdim)
        return v

    def _advanced(self, key: list, ranges) -> NkiTensor:
        """Legacy indexing with ``arange``/``mgrid`` expressions (and ints / whole slices);
        ``ranges`` restricts index variables (a mask)."""
        exprs = [k for k in key if isinstance(k, IndexExpr)]
        gshape = grid_of(exprs)
        nd = len(gshape)
        for a, k in enumerate(key):
            if isinstance(k, slice):
                if k != slice(None) or self.shape[a] != 1:
                    raise NotSupportedError(
                        "index: mixing index expressions (nl.arange) with slices is not "
                        "supported in NKI (basic and advanced indexing cannot be mixed)"
                    )
                key[a] = 0
        ranges = ranges or {}
        # The variable of each grid axis.
        axis_var: list = [None] * nd
        for e in exprs:
            for v in e.terms:
                g = var_axis(v, nd)
                if axis_var[g] is not None and axis_var[g] is not v:
                    raise NotSupportedError(
                        f"index: two different index variables on grid axis {g}"
                    )
                axis_var[g] = v
        lo = [ranges.get(v, (0, v.size))[0] if v is not None else 0 for v in axis_var]
        sizes = [
            (ranges[v][1] - ranges[v][0]) if v in ranges else gshape[g]
            for g, v in enumerate(axis_var)
        ]

        def coef(k, v) -> int:
            return k.terms.get(v, 0) if isinstance(k, IndexExpr) else 0

        def const(k) -> int:
            if isinstance(k, IndexExpr):
                return k.const + sum(c * lo[var_axis(v, nd)] for v, c in k.terms.items())
            return _int(k, "an index")

        t = self.tile
        pattern = [(st, n) for st, n in t.pattern]
        if self._pdim is None:
            mstride = [t.row_step] + [st for st, _ in pattern]
            offset = sum(mstride[a] * const(k) for a, k in enumerate(key))
            for a, k in enumerate(key):
                c = const(k)
                lim = [
                    c + coef(k, v) * (sizes[g] - 1) for g, v in enumerate(axis_var) if v is not None
                ]
                for x in [c, *lim]:
                    if not 0 <= x < self.shape[a]:
                        raise OutOfBoundsError(
                            f"index: axis {a} reaches {x}, outside size {self.shape[a]} "
                            "[rule bounds]"
                        )
            steps = [sum(mstride[a] * coef(k, v) for a, k in enumerate(key)) for v in axis_var]
            rows = t.rows(sizes[0] if nd else 1, steps[0] if nd else 0)
            free = [(steps[g], sizes[g]) for g in range(1, nd)] or [(1, 1)]
            tile = rows.ap(free, offset)
            v = self._view(tile, gshape if not ranges else sizes, None)
            v._access = (self, key)
            return v
        p = self._pdim
        kp = key[p]
        if nd == 0 or (
            isinstance(kp, IndexExpr) and (len(kp.terms) != 1 or coef(kp, axis_var[0]) != 1)
        ):
            raise PartitionDimError(
                "index: the partition axis must be indexed by one index variable on the first "
                "grid axis with step 1 (e.g. nl.arange(128)[:, None] + offset)"
            )
        p0 = const(kp)
        pcount = sizes[0] if isinstance(kp, IndexExpr) else 1
        if not isinstance(kp, IndexExpr) and axis_var[0] is not None and gshape[0] != 1:
            raise PartitionDimError(
                "index: the first grid axis varies but the partition index is constant"
            )
        if not (0 <= p0 and p0 + pcount <= self.shape[p]):
            raise OutOfBoundsError(
                f"index: partitions {p0}..{p0 + pcount} are outside the partition axis of "
                f"size {self.shape[p]}"
            )
        free_axes = [a for a in range(self.ndim) if a != p]
        fstride = {a: pattern[self._machine_axis(a) - 1][0] for a in free_axes}
        for a in free_axes:
            if coef(key[a], axis_var[0]):
                raise PartitionDimError(
                    "index: the partition index variable also moves along a free axis; an "
                    "access pattern is the same on every partition"
                )
            c = const(key[a])
            for x in [c] + [
                c + coef(key[a], v) * (sizes[g] - 1)
                for g, v in enumerate(axis_var)
                if v is not None
            ]:
                if not 0 <= x < self.shape[a]:
                    raise OutOfBoundsError(
                        f"index: axis {a} reaches {x}, outside size {self.shape[a]}"
                    )
        offset = sum(fstride[a] * const(key[a]) for a in free_axes)
        free = [
            (sum(fstride[a] * coef(key[a], axis_var[g]) for a in free_axes), sizes[g])
            for g in range(1, nd)
        ] or [(1, 1)]
        shape = [pcount, *sizes[1:]] if nd > 1 else [pcount, 1]
        rows = t[p0 : p0 + pcount]
        if len(free) > MAX_AP_FREE:
            free = merge_free(free)
        if len(free) > MAX_AP_FREE:
            outer, inner = free[:-MAX_AP_FREE], free[-MAX_AP_FREE:]
            count = math.prod(n for _, n in inner)
            parts = []
            for i, idx in enumerate(itertools.product(*(range(n) for _, n in outer))):
                at = offset + sum(st * k for (st, _), k in zip(outer, idx, strict=True))
                parts.append((rows.ap(inner, at), i * count))
            v = self._view(Split(parts, count), shape, 0)
            v._access = (self, key)
            return v
        tile = rows.ap(free, offset)
        v = self._view(tile, shape, 0)
        v._access = (self, key)
        return v

    def _rows_valid(self, key: list):
        """The validity a legacy indexed view of a tile made under a mask inherits: its rows,
        when the partition index is the first grid variable itself (``t[i_p, ...]``)."""
        valid = self._valid
        if not valid or 0 not in valid or self._pdim != 0:
            return None
        kp = key[0]
        if not isinstance(kp, IndexExpr) or kp.const != 0 or len(kp.terms) != 1:
            return None
        ((v, c),) = kp.terms.items()
        nd = len(grid_of([k for k in key if isinstance(k, IndexExpr)]))
        return {0: valid[0]} if c == 1 and var_axis(v, nd) == 0 else None

    def restricted(self, ranges, axis_ranges) -> NkiTensor:
        """This view restricted by a mask: an indexed access re-resolved with the index
        variables' ranges (grid-axis ranges apply to the variable on that axis), or a plain
        tile sliced on the grid axes (``axis_ranges``)."""
        if type(self._access) is Indirect:
            raise NotSupportedError("an indirect (index-tile) access is read by nl.load only")
        if self._access is not None:
            base, key = self._access
            if axis_ranges:
                exprs = [k for k in key if isinstance(k, IndexExpr)]
                nd = len(grid_of(exprs))
                ranges = dict(ranges)
                for e in exprs:
                    for v in e.terms:
                        r = axis_ranges.get(var_axis(v, nd))
                        if r is not None:
                            lo, hi = ranges.get(v, (0, v.size))
                            ranges[v] = (max(lo, r[0]), min(hi, r[1]))
            return base._advanced(list(key), ranges)
        if not axis_ranges:
            return self
        if self.ndim > MAX_AP_FREE + 1 and self._pdim == 0:
            # A front-end temporary laid out flat (``Core.alloc(flat=True)``): its rows only.
            if any(a != 0 and r != (0, self.shape[a]) for a, r in axis_ranges.items()):
                raise NotSupportedError(
                    "mask: a mask on a free axis of a result with more than "
                    f"{MAX_AP_FREE} free axes"
                )
            lo, hi = axis_ranges.get(0, (0, self.shape[0]))
            return self._view(self.tile[lo:hi], (hi - lo, *self.shape[1:]), 0)
        key: list = [slice(None)] * self.ndim
        for a, (lo, hi) in axis_ranges.items():
            if a < self.ndim and self.shape[a] > 1:
                key[a] = slice(lo, hi)
        return self._basic(key)

    @api
    def __setitem__(self, key, value) -> None:
        if isinstance(value, NkiTensor) and self._core.just_updated(value):
            return  # `t[i] += x`: Python stores back the view `+=` already updated
        if type(key) is Mask:
            self._assign_under(key, value)
            return
        lazy = self._blocks if type(self._blocks) is LazyBlocks else None
        if lazy is not None:
            lazy.writing = True  # a released PSUM block may be given storage again
        try:
            target = self[key]
        finally:
            if lazy is not None:
                lazy.writing = False
        self._core.assign(target, value)
        if self._pdim == 0 and self._owner is not None and target.shape[0] == self.shape[0]:
            self._note_rows(value)

    def _note_rows(self, value) -> None:
        """Legacy dialect: the rows of this tile written so far through assignments of its
        whole partition range, when each came from a masked result (``_valid``); reads of
        the tile then compute only there, as for the masked result itself."""
        if self._core.launch.dialect != "legacy":
            return
        valid = value._valid if isinstance(value, NkiTensor) else None
        rows = valid.get(0) if valid else None
        first = not self._written
        self._written = True
        if rows is None or (not first and self._valid is None):
            self._valid = None  # a whole-rows write: the tile holds every row
            return
        if first:
            self._valid = {0: rows}
            return
        lo, hi = self._valid[0] if 0 in self._valid else (0, self.shape[0])
        self._valid = {0: (min(lo, rows[0]), max(hi, rows[1]))}

    @api
    def view(self, dtype) -> NkiTensor:
        """The same bytes as elements of ``dtype`` (NKI's ``tensor.view``; no copy): the last
        axis scaled by the ratio of the element sizes, e.g. a ``[128, 1]`` float32 tile as
        ``[128, 4]`` fp8 bytes. trn2core takes a view whose free elements are contiguous (NKI
        asks the last axis to be). A shape instead of a dtype reshapes (the earlier
        ``.view()``)."""
        if isinstance(dtype, (tuple, list)):
            return self.reshape(dtype)
        dt = D.as_dtype(dtype, "dtype")
        if dt == self.dtype:
            return self
        if self.ndim > MAX_AP_FREE + 1:
            raise NotSupportedError(
                f"view: a {self.shape} tile has more than {MAX_AP_FREE} free axes (an access "
                "pattern's); view a tile of fewer"
            )
        old, new = self.dtype.itemsize, dt.itemsize
        last = self.shape[-1] * old
        if last % new:
            raise ShapeError(
                f"dtype: the last axis holds {last} bytes, not a whole number of {dt} elements "
                f"({new} bytes each) [rule shape]",
                arg="dtype",
            )
        tile = self.tile.view_as(D.machine_name(dt))
        flat = (self.size // self.shape[0] * old // new,) if self.ndim > 1 else ()
        v = self._view(tile, (*self.shape[:1], *flat) if flat else (last // new,), self._pdim)
        v.dtype = dt
        shape = (*self.shape[:-1], last // new)
        return v if v.shape == shape else v.reshape(shape)

    reinterpret_cast = view

    @api
    def reshape(self, shape) -> NkiTensor:
        """The same elements in a new shape (a contiguous view; the partition axis stays)."""
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if math.prod(shape) != self.size:
            raise ShapeError(f"reshape: cannot reshape {self.shape} to {shape}")
        t = self.tile
        if self._pdim is None:
            contiguous = all(
                st == math.prod(n for _, n in t.pattern[i + 1 :])
                for i, (st, _) in enumerate(t.pattern)
            )
            fsize = math.prod(n for _, n in t.pattern)
            if not contiguous or (self.shape[0] > 1 and t.row_step != fsize):
                raise NotSupportedError("reshape: only a contiguous HBM view can be reshaped")
            strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
            free = [(strides[i], shape[i]) for i in range(1, len(shape))] or [(1, 1)]
            tile = t.rows(shape[0], strides[0]).ap(free, 0)
            return self._view(tile, shape, None)
        if self._pdim != 0 or shape[0] != self.shape[0]:
            raise PartitionDimError(
                f"reshape: an on-chip tensor keeps its partition axis first and of size "
                f"{self.shape[self._pdim]}; got {shape}"
            )
        tile = t.reshape_free(list(shape[1:]) or [1])
        return self._view(tile, shape, 0)

    @api
    def broadcast_to(self, shape) -> NkiTensor:
        """A view with size-1 axes repeated (free axes: a stride-0 view; the partition axis:
        a DMA broadcast into a new tile)."""
        return self._core.broadcast(self, tuple(int(s) for s in shape))

    @api
    def expand_dims(self, axis: int) -> NkiTensor:
        """A view with a new size-1 axis at ``axis`` (a free axis)."""
        axis = _int(axis, "axis")
        shape = list(self.shape)
        if axis < 0:
            axis += len(shape) + 1
        if self._pdim is not None and axis <= self._pdim:
            raise PartitionDimError("expand_dims: the new axis must be a free axis")
        shape.insert(axis, 1)
        if self._pdim is None:
            return self.reshape(shape)
        t = self.tile
        pat = list(t.pattern)
        pat.insert(self._machine_axis(axis) - 1 if axis > self._pdim else 0, (0, 1))
        return self._view(t.ap(pat, 0), shape, self._pdim)

    def _axes(self) -> list[tuple[int, int]]:
        """``(stride, count)`` per logical axis (the partition axis of an on-chip tile has
        stride 0: partitions are not addressed by stride)."""
        if self._pdim not in (0, None):
            raise NotSupportedError("a view of a tensor whose partition axis is not the first")
        t = self.tile
        pat = list(t.pattern)
        if len(pat) != self.ndim - 1:
            pat = [(st, n) for st, n in pat if n != 1] if len(pat) > self.ndim - 1 else pat
        if len(pat) != self.ndim - 1:
            raise NotSupportedError(f"a view of shape {self.shape} over pattern {t.pattern}")
        first = (t.row_step, self.shape[0]) if self._pdim is None else (0, self.shape[0])
        return [first] + pat

    def _from_axes(self, axes: list[tuple[int, int]]) -> NkiTensor:
        t = self.tile
        free = axes[1:] or [(1, 1)]
        if self._pdim is None:
            tile = t.rows(axes[0][1], axes[0][0]).ap(free, 0)
        else:
            tile = t.ap(free, 0)
        return self._view(tile, [n for _, n in axes], self._pdim)

    @api
    def broadcast(self, dim: int, size: int) -> NkiTensor:
        """Axis ``dim`` (of size 1) repeated ``size`` times: a stride-0 view."""
        axes = self._axes()
        dim = _int(dim, "dim") % self.ndim
        if axes[dim][1] != 1:
            raise ShapeError(f"broadcast: axis {dim} has size {axes[dim][1]}, not 1")
        if dim == 0 and self._pdim is not None:
            raise PartitionDimError("broadcast: the partition axis of an on-chip tensor")
        axes[dim] = (0, _int(size, "size"))
        return self._from_axes(axes)

    @api
    def permute(self, dims) -> NkiTensor:
        """The axes in the order ``dims`` (on chip the partition axis stays first)."""
        dims = [_int(d, "dims") for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(f"permute: {dims} is not a permutation of {self.ndim} axes")
        if self._pdim is not None and dims[0] != 0:
            raise PartitionDimError("permute: an on-chip tensor keeps its partition axis first")
        axes = self._axes()
        return self._from_axes([axes[d] for d in dims])

    @api
    def expand_dim(self, dim: int) -> NkiTensor:
        """A new size-1 axis at ``dim``."""
        axes = self._axes()
        dim = _int(dim, "dim")
        if self._pdim is not None and dim == 0:
            raise PartitionDimError("expand_dim: the new axis must be a free axis")
        axes.insert(dim, (0, 1))
        return self._from_axes(axes)

    @api
    def squeeze_dim(self, dim: int) -> NkiTensor:
        """Axis ``dim`` (of size 1) removed."""
        axes = self._axes()
        dim = _int(dim, "dim") % self.ndim
        if axes[dim][1] != 1 or (self._pdim is not None and dim == 0):
            raise ShapeError(f"squeeze_dim: axis {dim} of {self.shape} cannot be removed")
        del axes[dim]
        return self._from_axes(axes)

    @api
    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        """``start:end:step`` along axis ``dim``."""
        key: list = [slice(None)] * self.ndim
        key[_int(dim, "dim")] = slice(start, end, step)
        return self[tuple(key)]

    @api
    def ap(self, pattern, offset=None, **kwargs) -> NkiTensor:
        """``[[step, count], ...]`` over the tensor's storage (NKI's ``.ap()``; the first pair
        is the partition axis of an on-chip tensor: step = elements per partition)."""
        return self._core.raw_ap(self, pattern, offset, kwargs)

    def get_pattern(self) -> list[list[int]]:
        """The view as ``[[step, count], ...]`` (partition axis first)."""
        t = self.tile
        per = self._core.storage_row(self)
        first = [t.row_step, self.shape[0]] if self._pdim is None else [per, t.shape[0]]
        return [first] + [[st, n] for st, n in t.pattern]

    @api
    def astype(self, dtype) -> NkiTensor:
        """A copy converted to ``dtype`` (one instruction)."""
        return self._core.unary_copy(self, dtype)

    # -------------------------------------------------------------------- operators
    @api
    def _bin(self, op, other, reverse=False):
        if op == "add" and isinstance(other, IndexExpr):
            return DynIndex(self, other)  # the legacy ``t[i, off + j]``: a dynamic index
        return self._core.arith(op, other, self) if reverse else self._core.arith(op, self, other)

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("subtract"), _binary("subtract", True)
    __mul__, __rmul__ = _binary("multiply"), _binary("multiply", True)
    __truediv__, __rtruediv__ = _binary("divide"), _binary("divide", True)
    __pow__, __rpow__ = _binary("power"), _binary("power", True)

    def __and__(self, o):
        return self._bin("bitwise_and" if self._core.is_int(self) else "logical_and", o)

    def __or__(self, o):
        return self._bin("bitwise_or" if self._core.is_int(self) else "logical_or", o)

    def __xor__(self, o):
        return self._bin("bitwise_xor" if self._core.is_int(self) else "logical_xor", o)

    __lshift__, __rshift__ = _binary("left_shift"), _binary("right_shift")
    __lt__, __le__ = _binary("less"), _binary("less_equal")
    __gt__, __ge__ = _binary("greater"), _binary("greater_equal")

    # Against None a tensor is a Python value, not an operand: ``t != None`` is True (kernels
    # test optional tensor arguments so, e.g. nki-library's rope_hf ``rope_cache != None``).
    def __eq__(self, o):  # type: ignore[override]
        return False if o is None else self._bin("equal", o)

    def __ne__(self, o):  # type: ignore[override]
        return True if o is None else self._bin("not_equal", o)

    @api
    def __neg__(self):
        return self._core.arith("multiply", self, -1.0)

    @api
    def __abs__(self):
        return self._core.unary("abs", self)

    @api
    def __invert__(self):
        return self._core.unary("invert", self)

    @api
    def _inplace_op(self, op, o):
        self._core.inplace(op, self, o)
        return self

    __iadd__, __isub__ = _inplace("add"), _inplace("subtract")
    __imul__, __itruediv__ = _inplace("multiply"), _inplace("divide")
