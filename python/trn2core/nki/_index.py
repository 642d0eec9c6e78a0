"""The legacy dialect's index expressions (``nl.arange``, ``nl.mgrid``) and ``mask=`` predicates.

An index expression is affine: ``const + sum(coef * var)``, where each variable is one axis of an
``arange`` or ``mgrid`` grid (``nl.arange(128)[:, None]`` is a variable on axis 0 of a 2-D grid).
Indexing a tensor with expressions gives an access pattern over the grid (the broadcast shape of
the expressions); a mask is a conjunction of comparisons, each of one variable against a
constant, and restricts that variable to an interval ("Each comparison expression should
indicate which range of indices along one of the input tile axes should be valid", NKI API
masking, Neuron 2.26 docs). Everything here is plain Python on integers: no device memory.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import numpy as np

from ..errors import Trn2ValueError
from ._api import api


class NotSupportedError(Trn2ValueError):
    """An NKI construct trn2core does not emulate (docs/nki.md lists what is supported)."""


def is_int(v) -> bool:
    """Whether ``v`` is an integer as NKI takes one: a Python or numpy integer, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


class IndexVar:
    """One axis of an ``arange``/``mgrid`` grid: ``size`` values ``0 .. size``, placed on axis
    ``axis`` of an ``ndim``-dimensional grid (right-aligned broadcasting, as numpy)."""

    __slots__ = ("size", "axis", "ndim")

    def __init__(self, size: int, axis: int, ndim: int) -> None:
        self.size = size
        self.axis = axis
        self.ndim = ndim

    def __repr__(self) -> str:
        return f"IndexVar(size={self.size}, axis={self.axis}/{self.ndim})"


def broadcast_equal_ranks(
    a: tuple[int, ...], b: tuple[int, ...], error, what: str
) -> tuple[int, ...]:
    """The shape two shapes of equal rank broadcast to; ``error`` (an exception class) when an
    axis differs and neither is 1, its message starting with ``what`` (naming the shapes)."""
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            raise error(f"{what} {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    return broadcast_equal_ranks(a, b, Trn2ValueError, "index: index shapes")


class IndexExpr:
    """``const + sum(coef * var)`` over a grid of ``shape`` (see the module doc)."""

    __slots__ = ("const", "terms", "shape")

    def __init__(self, const: int, terms: dict[IndexVar, int], shape: tuple[int, ...]) -> None:
        self.const = const
        self.terms = terms
        self.shape = shape

    # -- placement: ``nl.arange(n)[:, None]`` puts the variable on axis 0 of a 2-D grid
    def __getitem__(self, key) -> IndexExpr:
        key = key if isinstance(key, tuple) else (key,)
        if len(self.terms) != 1 or len(self.shape) != 1:
            raise NotSupportedError(
                "index: only a 1-D nl.arange(...) can be placed with [:, None]-style indexing"
            )
        ((var, coef),) = self.terms.items()
        full = [i for i, k in enumerate(key) if isinstance(k, slice)]
        if len(full) != 1 or any(k is not None and not isinstance(k, slice) for k in key):
            raise NotSupportedError(
                f"index: place an arange with one ':' and Nones (e.g. [:, None]), got {key!r}"
            )
        s = key[full[0]]
        if s != slice(None):
            raise NotSupportedError(f"index: slicing an arange ({s}) is not supported")
        ndim = len(key)
        v = IndexVar(var.size, full[0], ndim)
        shape = tuple(var.size if i == full[0] else 1 for i in range(ndim))
        return IndexExpr(self.const, {v: coef}, shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _combine(self, other, sign: int) -> IndexExpr:
        if isinstance(other, IndexExpr):
            terms = dict(self.terms)
            for v, c in other.terms.items():
                terms[v] = terms.get(v, 0) + sign * c
            terms = {v: c for v, c in terms.items() if c != 0}
            return IndexExpr(
                self.const + sign * other.const, terms, _broadcast(self.shape, other.shape)
            )
        if is_int(other):
            return IndexExpr(self.const + sign * int(other), dict(self.terms), self.shape)
        return NotImplemented

    def __add__(self, other):
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1)

    def __rsub__(self, other):
        neg = self * -1
        return neg._combine(other, 1)

    def __neg__(self):
        return self * -1

    def __mul__(self, other):
        if is_int(other):
            other = int(other)
            terms = {v: c * other for v, c in self.terms.items() if c * other != 0}
            return IndexExpr(self.const * other, terms, self.shape)
        if isinstance(other, IndexExpr):
            raise NotSupportedError("index: a product of two index expressions is not affine")
        return NotImplemented

    __rmul__ = __mul__

    def _cmp(self, other, op: str) -> Mask:
        diff = self - other
        if diff is NotImplemented:
            raise Trn2ValueError(f"mask: cannot compare an index expression with {other!r}")
        return Mask(((diff, op),))

    def __lt__(self, other):
        return self._cmp(other, "<")

    def __le__(self, other):
        return self._cmp(other, "<=")

    def __gt__(self, other):
        return self._cmp(other, ">")

    def __ge__(self, other):
        return self._cmp(other, ">=")

    def __eq__(self, other):  # type: ignore[override]
        return self._cmp(other, "==")

    def __ne__(self, other):  # type: ignore[override]
        return self._cmp(other, "!=")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        terms = " + ".join(f"{c}*{v!r}" for v, c in self.terms.items())
        return f"IndexExpr({self.const} + {terms or '0'}, shape={self.shape})"


_CMP = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


class Mask:
    """A conjunction of comparisons ``expr <op> 0`` (``&`` joins masks)."""

    __slots__ = ("conds",)

    def __init__(self, conds: tuple[tuple[IndexExpr, str], ...]) -> None:
        self.conds = conds

    def __and__(self, other) -> Mask:
        if isinstance(other, (bool, np.bool_)):
            # A compile-time constant joined in (``(i < n) & (j * 128 < size)``): `0 == 0` is
            # always true, `0 < 0` never.
            return Mask(self.conds + ((IndexExpr(0, {}, ()), "==" if other else "<"),))
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask(self.conds + other.conds)

    __rand__ = __and__

    def __bool__(self) -> bool:
        raise Trn2ValueError(
            "mask: a mask is a predicate for the compiler, not a Python bool; join comparisons "
            "with '&' (not 'and') and pass it as mask="
        )

    def intervals(self) -> dict[IndexVar, tuple[int, int]] | None:
        """Each constrained variable's range ``[lo, hi)``; ``None`` when the mask is never
        true (the instruction is skipped)."""
        out: dict[IndexVar, tuple[int, int]] = {}
        # One-variable comparisons first: they narrow the ranges the others are judged on.
        for expr, op in sorted(self.conds, key=lambda c: len(c[0].terms) > 1):
            if not expr.terms:
                if not _CMP[op](expr.const, 0):
                    return None
                continue
            if len(expr.terms) != 1:
                # Several variables: fine when the comparison has one value over the whole
                # grid (e.g. `offset < n_elements` with every offset inside).
                lo_e, hi_e = expr.const, expr.const
                for v, c in expr.terms.items():
                    a, b = out.get(v, (0, v.size))
                    lo_e += min(c * a, c * (b - 1))
                    hi_e += max(c * a, c * (b - 1))
                if _whole(op, lo_e, hi_e, True):
                    continue
                if _whole(op, lo_e, hi_e, False):
                    return None
                raise NotSupportedError(
                    "mask: each comparison must constrain one index variable (a rectangular "
                    f"region); got {expr!r} {op} 0 (use nisa.affine_select for triangles)"
                )
            ((v, c),) = expr.terms.items()
            lo, hi = out.get(v, (0, v.size))
            span = _solve(int(c), int(expr.const), op, lo, hi)
            if span is _SPLIT:
                raise NotSupportedError(
                    f"mask: {expr!r} {op} 0 selects a non-contiguous range of an index variable"
                )
            if span is None:
                return None
            out[v] = span
        return out


_SPLIT = object()


def _whole(op: str, lo: int, hi: int, value: bool) -> bool:
    """Whether ``e <op> 0`` is ``value`` for every ``e`` in ``[lo, hi]``."""
    if op in ("<", "<="):
        return _CMP[op](hi, 0) if value else not _CMP[op](lo, 0)
    if op in (">", ">="):
        return _CMP[op](lo, 0) if value else not _CMP[op](hi, 0)
    outside = lo > 0 or hi < 0
    zero = lo == hi == 0
    return (zero if value else outside) if op == "==" else (outside if value else zero)


def _solve(c: int, k: int, op: str, lo: int, hi: int):
    """The integers ``i`` in ``[lo, hi)`` with ``c * i + k <op> 0``, as ``(a, b)`` (``[a, b)``,
    non-empty), ``None`` (none) or ``_SPLIT`` (two runs: ``!=`` inside the range). Arithmetic,
    not a walk: an ``arange(10**12)`` costs what an ``arange(4)`` does (issue 28)."""
    if c == 0:
        return (lo, hi) if _CMP[op](k, 0) else None
    if op in (">", ">="):  # c*i + k > 0  <=>  (-c)*i + (-k) < 0
        c, k, op = -c, -k, "<" if op == ">" else "<="
    if op in ("<", "<="):
        t = -k + (1 if op == "<=" else 0)  # c*i < t
        a, b = (lo, min(hi, -(-t // c))) if c > 0 else (max(lo, t // c + 1), hi)
        return (a, b) if a < b else None
    point = -k // c if -k % c == 0 else None  # the one i with c*i + k == 0
    inside = point is not None and lo <= point < hi
    if op == "==":
        return (point, point + 1) if inside else None
    if not inside:
        return (lo, hi)
    if hi - lo == 1:
        return None
    if point == lo:
        return (lo + 1, hi)
    if point == hi - 1:
        return (lo, hi - 1)
    return _SPLIT


@api
def arange(*args: int) -> IndexExpr:
    """``nl.arange(stop)`` / ``nl.arange(start, stop)``: a 1-D index expression."""
    if len(args) == 1:
        start, stop = 0, args[0]
    elif len(args) == 2:
        start, stop = args
    else:
        raise Trn2ValueError(f"arange: expected (stop) or (start, stop), got {args!r}")
    for a in (start, stop):
        if not is_int(a):
            raise Trn2ValueError(f"arange: bounds are integers, got {a!r}", arg="arange")
    start, stop = int(start), int(stop)
    if stop <= start:
        raise Trn2ValueError(f"arange: an empty range [{start}, {stop})")
    v = IndexVar(stop - start, 0, 1)
    return IndexExpr(start, {v: 1}, (stop - start,))


class _GridAxis:
    """A named axis of a ``Grid`` (``.p``, ``.x``, ...): its index expression, read-only."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, grid, owner=None):
        if grid is None:
            return self
        if self.i >= len(grid):
            raise Trn2ValueError(f"mgrid: .{self.name} is axis {self.i} of a {len(grid)}-D grid")
        return grid[self.i]


class Grid(tuple):
    """What ``nl.mgrid[...]`` returns: the index expressions of each axis (unpack it, or take
    ``.p`` for axis 0 and ``.x``, ``.y``, ``.z`` for axes 1 to 3)."""

    __slots__ = ()

    p = _GridAxis(0)
    x = _GridAxis(1)
    y = _GridAxis(2)
    z = _GridAxis(3)


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: one index expression per axis, each of the full grid shape."""

    @api
    def __getitem__(self, key) -> Grid | IndexExpr:
        keys = key if isinstance(key, tuple) else (key,)
        sizes = []
        for k in keys:
            if not isinstance(k, slice) or k.stop is None:
                raise Trn2ValueError(f"mgrid: expected slices start:stop[:step], got {k!r}")
            for v in (k.start, k.stop, k.step):
                if v is not None and not is_int(v):
                    raise Trn2ValueError(f"mgrid: slice bounds are integers, got {k!r}")
            k = slice(*(None if v is None else int(v) for v in (k.start, k.stop, k.step)))
            start, step = k.start or 0, k.step or 1
            if step <= 0 or k.stop <= start:
                raise Trn2ValueError(f"mgrid: an empty or descending range {k!r}")
            sizes.append((start, step, len(range(start, k.stop, step))))
        shape = tuple(n for _, _, n in sizes)
        out = tuple(
            IndexExpr(start, {IndexVar(n, i, len(sizes)): step}, shape)
            for i, (start, step, n) in enumerate(sizes)
        )
        return Grid(out) if isinstance(key, tuple) else out[0]


mgrid = _MGrid()


def grid_of(exprs: Iterable[IndexExpr]) -> tuple[int, ...]:
    """The broadcast shape of index expressions."""
    shape: tuple[int, ...] = ()
    for e in exprs:
        shape = _broadcast(shape, e.shape)
    return shape


def var_axis(v: IndexVar, ndim: int) -> int:
    """The axis of variable ``v`` in a grid of ``ndim`` axes."""
    return ndim - v.ndim + v.axis
