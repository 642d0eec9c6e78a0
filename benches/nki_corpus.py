"""Runs public NKI kernels (AWS's tutorials, nki-samples, nki-library, ...) on trn2core.nki.

    python benches/nki_corpus.py /tmp/nki_corpus [--only NAME ...] [--timeout-note]

The argument is a directory holding checkouts (or ``git archive`` exports) of the public
repositories, one sub-directory each, named as the repositories are:
``aws-neuron-sdk``, ``nki-samples``, ``nki-library``, ``neuronx-distributed``,
``neuronx-distributed-inference``. Nothing is fetched or copied: each kernel file is imported
from that directory (with ``trn2core.nki.install()`` in effect, so its ``import nki`` /
``import neuronxcc.nki`` resolve to trn2core), the kernel is run on small inputs, and its
outputs are compared with this file's own numpy reference. The table printed has, per kernel:
the source file, the result (``ok``, ``mismatch`` with the largest error, or the error's class
and message), the emulated Trainium2 time and the emulation's wall time. A missing directory
or repository is reported and skipped. ``torch``, ``scipy``, ``jax`` (imported by some kernel
files for their own test drivers, never by the kernels) are empty modules when not installed;
a case whose kernel's own host code needs one (nki-library's top-k builds a matrix with scipy;
NxDI's EAGLE module subclasses ``torch.nn.Module``) is skipped then. ``neuronx_distributed``
and NxDI's own host modules, which NxD/NxDI kernel modules import for host code only (and which
do not import without torch_xla and neuronx-cc), are stood in for by empty modules of ours
(``_absent_modules``).

Besides the repositories' newest snapshots, two older trees hold kernels since removed:
``aws-neuron-sdk-2.26`` (``general/nki/examples`` of aws-neuron-sdk before Neuron 2.27: the
legacy-dialect tutorials rmsnorm, layernorm, SD attention) and ``nki-samples-reference``
(``src/nki_samples/reference`` of nki-samples before its removal in January 2026), e.g.
``git archive <commit> general/nki/examples | tar -x -C ROOT/aws-neuron-sdk-2.26``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import os
import sys
import time
import types
from collections.abc import Callable

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


@dataclasses.dataclass
class Case:
    """One kernel: where it is, how to call it, and what it must return."""

    name: str
    repo: str
    path: str  # relative to the repository
    kernel: str  # attribute of the module (a @nki.jit kernel or a plain caller)
    inputs: Callable[[np.random.Generator], tuple[tuple, dict]]
    reference: Callable[..., object]
    grid: object = None
    rtol: float = 1e-5
    atol: float = 1e-5
    package_root: str | None = None  # import as a package module from this directory
    call: bool = False  # a plain Python caller of a kernel: called directly (no report)
    uninitialized: str = "error"  # "nan": new memory holds NaN, as AWS's simulator
    #: For sub-kernels (no @nki.jit, output in SBUF): makes this harness's own kernel around
    #: ``kernel`` (called with the function; ``import nki`` resolves to trn2core then).
    wrap: Callable | None = None
    #: What of the output is compared (e.g. fp8 values with their scale bytes, dequantized).
    decode: Callable | None = None
    #: Packages the kernel's own (host-side) code needs beyond numpy: skipped when absent.
    needs: tuple[str, ...] = ()
    #: Modules of ours standing in for ones the kernel's package imports that do not load
    #: upstream (name -> maker, installed before the kernel's module is imported).
    stand_ins: tuple[tuple[str, Callable[[], types.ModuleType]], ...] = ()
    #: Directories of other checkouts (relative to the root) the kernel's module imports from,
    #: put on ``sys.path`` (e.g. nki-library's ``nkilib`` for an NxDI kernel built on it).
    paths: tuple[str, ...] = ()
    #: Environment variables the kernel's module reads when imported (its own configuration):
    #: set for the case, the module imported afresh under a name of its own.
    env: tuple[tuple[str, str], ...] = ()
    #: Launched once per rank (``trn2core.nki.run(..., ranks=N)``): outputs per rank.
    ranks: int | None = None


# ----------------------------------------------------------------------------- references
# Our own numpy formulations of what each kernel computes (from the kernels' documentation).


def _f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def ref_add(a, b, *_, **__):
    return (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)


def ref_matmul(lhs_t, rhs, *_, **__):
    """lhs_t.T @ rhs as the PE sums it: float32, K in 128-row tiles accumulated in PSUM in
    order (trn2core.reference.gemm), as every form of the matmul tutorial does; rounded once
    to the inputs' dtype (the kernels' output)."""
    from trn2core.reference import gemm

    return gemm(lhs_t.T, rhs).astype(lhs_t.dtype)


def ref_transpose_rows(x, shape2D):  # noqa: N803 - the kernel's keyword
    r, c = shape2D
    return x.reshape(x.shape[0], r, c).transpose(0, 2, 1).reshape(x.shape[0], r * c)


def ref_avgpool(x, pool_size):
    """Each window's sum in float32 in order (its rows, each row's columns: the reduction's
    logical order), times (or divided by) pool_size^2."""
    c, h, w = x.shape
    p = pool_size
    v = x.astype(np.float32).reshape(c, h // p, p, w // p, p).transpose(0, 1, 3, 2, 4)
    v = v.reshape(c, h // p, w // p, p * p)
    acc = v[..., 0]
    for i in range(1, p * p):
        acc = (acc + v[..., i]).astype(np.float32)
    return (acc / np.float32(p * p)).astype(x.dtype)


def ref_contributed_matmul(a, b, TILES_IN_BLOCK_K=8, **_):  # noqa: N803 - the kernel's name
    """a.T @ b as nki-samples' contributed matmul computes it: per K block of
    ``TILES_IN_BLOCK_K`` tiles, PSUM's float32 sums (the PE's, trn2core.reference.gemm), added
    into Z (a's dtype) by nl.loop_reduce: in float32, rounded to Z's dtype once a block."""
    from trn2core.reference import gemm

    kb = TILES_IN_BLOCK_K * 128
    z = np.zeros((a.shape[1], b.shape[1]), a.dtype)
    for k0 in range(0, a.shape[0], kb):
        z = (z.astype(np.float32) + gemm(a[k0 : k0 + kb].T, b[k0 : k0 + kb])).astype(a.dtype)
    return z


def ref_bilinear_2x(x, **_):
    """Bilinear 2x upsampling, align_corners=False ([n, c, h, w] -> [n, c, 2h, 2w]), float32
    in the kernel's order: inside, (9/16 nearest + 3/16 the other row) + 3/16 the other column
    + 1/16 the diagonal; on the first and last rows and columns 3/4 nearest + 1/4 the other
    along the edge; the corners copied."""
    f = np.float32
    h, w = x.shape[2], x.shape[3]

    def near_other(size):
        r = np.arange(2 * size)
        near = np.where(r % 2 == 1, (r - 1) // 2, r // 2)
        return near, np.clip(np.where(r % 2 == 1, near + 1, near - 1), 0, size - 1)

    (hn, ho), (wn, wo) = near_other(h), near_other(w)
    xs = x.astype(f)
    a, b = xs[:, :, hn][..., wn], xs[:, :, ho][..., wn]
    c, d = xs[:, :, hn][..., wo], xs[:, :, ho][..., wo]
    out = ((f(0.5625) * a + f(0.1875) * b) + f(0.1875) * c) + f(0.0625) * d
    rows, cols = [0, 2 * h - 1], [0, 2 * w - 1]
    out[:, :, rows] = (f(0.75) * a + f(0.25) * c)[:, :, rows]
    out[..., cols] = (f(0.75) * a + f(0.25) * b)[..., cols]
    for i, j in ((0, 0), (0, -1), (-1, 0), (-1, -1)):
        out[:, :, rows[i], cols[j]] = xs[:, :, hn[rows[i]], wn[cols[j]]]
    return np.ascontiguousarray(out)


def ref_trilinear_2x(x, **_):
    """Trilinear 2x upsampling, align_corners=False ([n, c, d, h, w] -> 2x each), float32 in
    the kernel's order. Along each axis an output is on the edge (the first or last: its
    nearest source alone) or inside (3/4 the nearest source, 1/4 the other). A voxel inside
    along k axes is 2^k terms, weight 3^(k - o) / 4^k (o: axes taking the other source) times
    the source, added left to right with the axes' choices counted in binary, d the lowest:
    the kernel's 042, 014_d, 014_h, 005_w, ... order."""
    f = np.float32
    n, c = x.shape[:2]
    xs = x.astype(f)
    axes = []
    for size in x.shape[2:]:
        r = np.arange(2 * size)
        near = np.where(r % 2 == 1, (r - 1) // 2, r // 2)
        other = np.clip(np.where(r % 2 == 1, near + 1, near - 1), 0, size - 1)
        axes.append((near, other, (r > 0) & (r < 2 * size - 1)))
    out = np.empty((n, c, *(2 * s for s in x.shape[2:])), f)
    for cls in itertools.product((False, True), repeat=3):
        sel = [np.flatnonzero(inside == k) for (_, _, inside), k in zip(axes, cls, strict=True)]
        inner = [a for a in range(3) if cls[a]]
        total = None
        for bits in range(2 ** len(inner)):
            other = [a in inner and (bits >> inner.index(a)) & 1 == 1 for a in range(3)]
            idx = [axes[a][1 if other[a] else 0][sel[a]] for a in range(3)]
            w = f(3 ** (len(inner) - sum(other)) / 4 ** len(inner))
            term = w * xs[np.ix_(range(n), range(c), *idx)]
            total = term if total is None else total + term
        out[np.ix_(range(n), range(c), *sel)] = total
    return out


def _dropout_keep(seed, rate, b, h, sq, sk):
    """The elements nki-samples' reference flash attention keeps under dropout ``rate``, as
    trn2core draws them ([b, h, sq, sk] bool): each [128, 512] tile of (query tile i, key
    chunk j) is one nl.dropout after nl.random_seed(seed + j + i nk + (head + batch h) nk nq),
    in the forward and the backward alike; element (p, f) kept unless word p * 512 + f of the
    seed's stream (set_rng_seed: the generator for 2^32 + the seed, docs/machine.md) is below
    rate * 2^32."""
    from trn2core import _core

    nq, nk = sq // 128, sk // 512
    keep = np.empty((b, h, sq, sk), bool)
    cut = float(np.float32(rate)) * 2.0**32
    for bi, hi, i, j in itertools.product(range(b), range(h), range(nq), range(nk)):
        s = seed + j + i * nk + (hi + bi * h) * nk * nq
        words = _core.stochastic_bits(128 * 512, 2**32 + s).reshape(128, 512)
        keep[bi, hi, i * 128 : (i + 1) * 128, j * 512 : (j + 1) * 512] = words >= cut
    return keep


def _attention_bwd_ref_inputs(r, b, h, d, s, causal, dropout_p=0.0, seed=0):
    """q, k, v, o, dy [b, h, d, s], lse [b, h, 128, s/128] (row t*128 + p at [.., p, t]) and a
    seed, as nki-samples' reference flash_attn_bwd takes them (o and lse of the float64
    forward, with the forward's dropout when ``dropout_p``)."""
    q, k, v, dy = (r.standard_normal((b, h, d, s)).astype(np.float32) for _ in range(4))
    keep = _dropout_keep(seed, dropout_p, b, h, s, s) if dropout_p > 0 else None
    _, pd, lse = _attention_probs(q, k, causal, keep, dropout_p)
    o = np.einsum("bhqk,bhdk->bhdq", pd, v).astype(np.float32)
    lse = lse.reshape(b, h, s // 128, 128).transpose(0, 1, 3, 2)
    kw = {"use_causal_mask": causal, "mixed_precision": True}
    if dropout_p > 0:
        kw["dropout_p"] = dropout_p
    return (q, k, v, o, dy, lse.astype(np.float32).copy(), np.array([seed], np.int32)), kw


def _attention_probs(q, k, causal, keep=None, rate=0.0):
    """softmax(q.T k / sqrt(d)) in float64 ([b, h, s, s]) and, with ``keep``, the same with the
    dropped elements zeroed and the kept ones scaled by 1 / (1 - rate)."""
    d, s = q.shape[2], q.shape[3]
    sc = np.einsum("bhdq,bhdk->bhqk", q.astype(np.float64), k) / np.sqrt(d)
    if causal:
        sc = np.where(np.tril(np.ones((s, s), bool)), sc, -np.inf)
    m = sc.max(-1, keepdims=True)
    p = np.exp(sc - m)
    total = p.sum(-1, keepdims=True)
    p /= total
    pd = p if keep is None else np.where(keep, p / (1.0 - rate), 0.0)
    return p, pd, (m + np.log(total))[..., 0]


def ref_attention_bwd_ref(q, k, v, o, dy, lse, seed, use_causal_mask=False, dropout_p=0.0, **_):
    """dq, dk, dv of softmax(q.T k / sqrt(d)) v in float64 ([b, h, d, s] each), as the kernel
    forms them: dS = Y (dO V^T - rowsum(dO o)), Y the probabilities after dropout (the kernels'
    kept elements, _dropout_keep, scaled by 1 / (1 - p)). Under dropout that is not the
    textbook's P (Z dP - D): the kernel's Step 4 multiplies by the dropped Y."""
    b, h, d, s = q.shape
    keep = _dropout_keep(int(seed[0]), dropout_p, b, h, s, s) if dropout_p > 0 else None
    _, pd, _ = _attention_probs(q, k, use_causal_mask, keep, dropout_p)
    dpd = np.einsum("bhdq,bhdk->bhqk", dy.astype(np.float64), v)
    ds = pd * (dpd - (pd * dpd).sum(-1, keepdims=True)) / np.sqrt(d)
    dq = np.einsum("bhqk,bhdk->bhdq", ds, k)
    dk = np.einsum("bhqk,bhdq->bhdk", ds, q)
    dv = np.einsum("bhqk,bhdq->bhdk", pd, dy)
    return tuple(x.astype(np.float32) for x in (dq, dk, dv))


def ref_maxpool_stride1(x, pool_size):
    k = pool_size
    h, w = x.shape
    out = np.full((h - k + 1, w - k + 1), -np.inf, np.float32)
    for di in range(k):
        for dj in range(k):
            out = np.maximum(out, x[di : di + h - k + 1, dj : dj + w - k + 1])
    return out.astype(x.dtype)


def ref_mamba(delta, u, a, b, c):
    """The selective-scan recurrence: h_t = exp(delta_t * A) h_{t-1} + delta_t B_t u_t,
    y_t = sum over the state of C_t h_t; with the kernels' float32 roundings: exp(delta A)
    (the activation's scale, then trn2core's activation rule), (delta u) B, the scan's
    h = da h + dbu (tensor_tensor_scan, each op rounded), h C, the states' terms added in
    state order."""
    from trn2core.reference import activation_values

    f32 = np.float32
    batch, ch, seq = delta.shape
    out = np.zeros((batch, ch, seq), f32)
    for i in range(batch):
        du = (delta[i] * u[i]).astype(f32)
        for s in range(a.shape[1]):
            da = activation_values("exp", (delta[i] * a[:, s : s + 1]).astype(f32))
            dbu = (du * b[i, s][None, :]).astype(f32)
            h, hs = np.zeros(ch, f32), np.empty((ch, seq), f32)
            for t in range(seq):
                h = hs[:, t] = ((da[:, t] * h).astype(f32) + dbu[:, t]).astype(f32)
            out[i] = (out[i] + (hs * c[i, s][None, :]).astype(f32)).astype(f32)
    return out


def ref_attention(q, k, v, form="divide"):
    """softmax(q.T @ k) @ v.T for [d, s] operands (rows of the result: queries), with the
    attention tutorial's roundings: the scores PSUM's float32 sums (trn2core.reference.gemm),
    score - max in float32, exp by trn2core's activation rule (float32), its sum in float32 in
    order per 512-key chunk, the chunks added. Then, by the form (the tutorial's versions):
    "divide" (v1), exp / sum; "normalise" (v2 to v4), exp times the float32 reciprocal of the
    sum; either times v in PSUM (float32 operands); "defer" (v5, v6), exp times v in PSUM,
    then times the reciprocal; "bf16" (v7 on), exp and v in bf16 for that product, then
    times the reciprocal; "bf16 out" (v8a on) the same, stored as bf16."""
    from trn2core.reference import activation_values, gemm, reciprocal

    f32 = np.float32
    s = gemm(q.T, k)
    e = activation_values("exp", (s - s.max(axis=1, keepdims=True)).astype(f32))
    tot = None
    for c in range(0, s.shape[1], 512):
        part = np.cumsum(e[:, c : c + 512], axis=1, dtype=f32)[:, -1:]
        tot = part if tot is None else (tot + part).astype(f32)
    if form == "divide":
        return gemm((e / tot).astype(f32), v.T)
    if form == "normalise":
        return gemm((e * reciprocal(tot, "fp32")).astype(f32), v.T)
    if form.startswith("bf16"):
        e, v = e.astype(BF16), v.astype(BF16)
    o = (gemm(e, v.T) * reciprocal(tot, "fp32")).astype(f32)
    return o.astype(BF16) if form == "bf16 out" else o


def ref_cumsum(x, axis=-1):
    """tensor_tensor_scan's running sum s = 1 * s + x[i], float32 in order (each tile carrying
    the last sum into the next as its initial value)."""
    return np.cumsum(x.astype(np.float32), axis=-1, dtype=np.float32).astype(x.dtype)


def ref_depthwise(img, flt, **_):
    """Each channel's taps (up to 128) as one matmul's contraction, in tap order: PSUM's
    float32 sum (trn2core.reference.gemm) of flt[c, j] * img[c, q + j]."""
    from trn2core.reference import gemm

    n, c, _, w = img.shape
    s = flt.shape[-1]
    q = w - s + 1
    out = np.zeros((n, c, 1, q), np.float32)
    for b in range(n):
        for ch in range(c):
            win = np.stack([img[b, ch, 0, j : j + q] for j in range(s)], axis=1)  # [q, s]
            out[b, ch, 0] = gemm(win, flt[ch, 0, 0][:, None])[:, 0]
    return out.astype(img.dtype)


def ref_simulate_add(a, b):
    return a + b


def ref_rmsnorm(a, g):
    """The 2.26 RMS norm tutorial's roundings (float32): the squares summed in order, divided
    by the row length, rsqrt (the float64 formula rounded once), x times it, times g."""
    f32 = np.float32
    x = a.astype(f32)
    mean = np.cumsum(x * x, axis=1, dtype=f32)[:, -1:] / f32(a.shape[1])
    r = (1.0 / np.sqrt(mean.astype(np.float64))).astype(f32)
    return ((x * r).astype(f32) * g.astype(f32)).astype(a.dtype)


def ref_layernorm(x, eps, gamma, beta, form="v1"):
    """The 2.26 layer norm tutorial's roundings (float32). v1 (nl.mean): mean and mean of
    squares each a sum in order divided by the row length, var = E[x^2] - mean^2; v2:
    bn_stats and bn_aggr (trn2core.reference) per 512 columns. Then rsqrt(var + eps) (the
    float64 formula rounded once), (x - mean) times it, times gamma, plus beta, each step
    rounded."""
    from trn2core import reference as tr

    f32 = np.float32
    xf = x.astype(f32)
    if form == "v1":
        n = f32(x.shape[1])
        mean = np.cumsum(xf, axis=1, dtype=f32)[:, -1] / n
        msq = np.cumsum(xf * xf, axis=1, dtype=f32)[:, -1] / n
        var = (msq - mean * mean).astype(f32)
    else:
        h = x.shape[1]
        mean, var = tr.bn_aggr(np.concatenate([tr.bn_stats(xf[:, j : j + 512])
                                               for j in range(0, h, 512)], 1)).T  # fmt: skip
    r = (1.0 / np.sqrt((var + f32(eps)).astype(f32).astype(np.float64))).astype(f32)
    y = tr.tensor_scalar(xf, "subtract", mean[:, None], "fp32", op1="multiply",
                         operand1=r[:, None])  # fmt: skip
    return ((y * gamma.astype(f32)).astype(f32) + beta.astype(f32)).astype(x.dtype)


def ref_sd_attention(q, k, v, **_):
    """softmax(q k^T / 8) v for [s, d] operands, with the SD attention kernel's roundings: q
    (in bf16) times 1/8 and k and v in bf16; the scores PSUM's float32 sums; exp(score - max)
    by trn2core's activation rule (float32), summed in float32 in order; exp in bf16 times v
    in PSUM, times the float32 1 / sum, in q's dtype."""
    from trn2core.reference import activation_values, gemm

    f32 = np.float32
    qb = (q.astype(BF16).astype(f32) * f32(0.125)).astype(BF16)
    s = gemm(qb, k.astype(BF16).T)
    e = activation_values("exp", (s - s.max(axis=1, keepdims=True)).astype(f32))
    r = (f32(1.0) / np.cumsum(e, axis=1, dtype=f32)[:, -1:]).astype(f32)
    return (gemm(e.astype(BF16), v.astype(BF16)) * r).astype(f32).astype(q.dtype)


def ref_sd_attention_t(q, k, v, **_):
    """(softmax(q.T k / 8) v).T per batch: q, k [b, d, s]; v [b, s, d] -> [b, d, s]."""
    out = [ref_sd_attention(q[i].T, k[i].T, v[i]).T for i in range(q.shape[0])]
    return np.ascontiguousarray(np.stack(out).astype(q.dtype))


def ref_adaptive_avg_pool(x, output_size):
    """Each window's float32 sum in order (row by row), divided by its size in float32."""
    n, c, h, w = x.shape
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    out = np.zeros((n, c, oh, ow), np.float32)
    for i in range(oh):
        h0, h1 = i * h // oh, -(-(i + 1) * h // oh)
        for j in range(ow):
            w0, w1 = j * w // ow, -(-(j + 1) * w // ow)
            win = x[:, :, h0:h1, w0:w1].astype(np.float32).reshape(n, c, -1)
            total = np.cumsum(win, axis=2, dtype=np.float32)[..., -1]  # in order, float32
            out[:, :, i, j] = total / np.float32(win.shape[2])  # divided in float32
    return out.astype(x.dtype)


def ref_resize_nearest(x, out_shape):
    b, ih, iw, c = x.shape
    _, oh, ow, _ = out_shape
    hi = np.floor(np.arange(oh, dtype=np.float32) * np.float32(ih / oh)).astype(int)
    wi = np.floor(np.arange(ow, dtype=np.float32) * np.float32(iw / ow)).astype(int)
    return x[:, hi][:, :, wi]


def ref_select_and_scatter(operand, source):
    """3x3 windows, stride 2, padding 1: each source value is added at the first maximum of
    its window (padding never selected: the inputs are positive). As the kernel adds them: one
    plane per window offset (dr, dc), row by row, each holding the values whose window chose
    that offset, the planes added in float32 in that order from zero."""
    n, c, h, w = operand.shape
    pad = np.full((n, c, h + 2, w + 2), -np.inf, np.float32)
    pad[:, :, 1:-1, 1:-1] = operand
    planes = np.zeros((3, 3, n, c, h + 2, w + 2), np.float32)
    for i in range(source.shape[2]):
        for j in range(source.shape[3]):
            win = pad[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].reshape(n, c, 9)
            dr, dc = np.divmod(win.argmax(axis=2), 3)  # the first maximum
            for a in range(n):
                for b in range(c):
                    planes[dr[a, b], dc[a, b], a, b, 2 * i + dr[a, b], 2 * j + dc[a, b]] = source[
                        a, b, i, j
                    ]
    out = np.zeros((n, c, h, w), np.float32)
    for plane in planes.reshape(9, n, c, h + 2, w + 2):
        out = (out + plane[:, :, 1:-1, 1:-1]).astype(np.float32)
    return out.astype(operand.dtype)


def ref_add_n_elements(a, b, n_elements):
    return a + b


#: nki-library's dynamic_elementwise_add: M-tiles (of 128 rows) the register-bound loop runs.
_DYN_TILES = 3


def ref_dynamic_add(a, b, num_m_tiles):
    """The first ``num_m_tiles * 128`` rows of ``a + b`` (bf16 in, the sum rounded once to
    bf16); the kernel leaves the other rows of its output unwritten."""
    rows = int(num_m_tiles.reshape(-1)[0]) * 128
    return (a[:rows].astype(np.float32) + b[:rows].astype(np.float32)).astype(a.dtype)


def decode_dynamic_rows(out):
    """The rows the loop wrote; the whole output (a shape mismatch) if it wrote any other row
    (those hold the NaN new memory has under ``uninitialized="nan"``)."""
    rows = _DYN_TILES * 128
    rest = out[rows:].astype(np.float32)
    return out[:rows] if np.isnan(rest).all() else out


def ref_rms_norm_qkv(hidden, weights, **_):
    """RMS norm then the QKV product, with allocated_fused_rms_norm_qkv's roundings: the
    float32 squares summed in order (activation_reduce), times 1/H plus 1e-6 (each step
    float32), rsqrt by trn2core's activation rule, the rows times it rounded to the weights'
    dtype, the product PSUM's float32 sums over H (128-row tiles), rounded once."""
    from trn2core.reference import activation_values, gemm

    f32 = np.float32
    x = hidden.reshape(-1, hidden.shape[-1]).astype(f32)
    ss = np.cumsum(x * x, axis=1, dtype=f32)[:, -1:]
    t = ((ss * f32(1.0 / x.shape[1])).astype(f32) + f32(1e-6)).astype(f32)
    n = (x * activation_values("rsqrt", t)).astype(f32).astype(weights.dtype)
    return gemm(n, weights).astype(hidden.dtype).reshape(*hidden.shape[:-1], -1)


def ref_flash_fwd(q, k, v, seed=None, *_, window_size=(-1, -1), dropout_p=0.0, **__):
    """Causal attention, scale 1/sqrt(d): q, k [b, h, d, s]; v [b, h, s, d] -> [b, h, s, d];
    with ``window_size`` (left, -1), left >= 0: each query sees itself and the ``left`` before.
    With ``dropout_p``: P (q's dtype) with the kernels' dropped elements zeroed
    (_dropout_keep) and the kept ones times 1 / (1 - p) in float32, rounded to q's dtype again.

    With flash_fwd's roundings for one 2048-key tile (s <= 2048: its running max starts at
    -FLT_MAX, so the correction of the previous tile's output is exp(-huge) = 0): per
    128-query tile q times the scale in q's dtype, the scores PSUM's float32 sums, masked to
    -FLT_MAX; exp(score - max) by trn2core's activation rule, its float32 sum in order per
    1024-key chunk, the chunks added; P (q's dtype) v PSUM's sums; lse = max + log(sum) in
    float32; the output P v times exp(max - lse), rounded once to q's dtype."""
    from trn2core.reference import activation_values, gemm

    f32, fmax = np.float32, np.finfo(np.float32).max
    b, h, d, s = q.shape
    out = np.zeros((b, h, s, d), q.dtype)
    kept = _dropout_keep(int(seed[0]), dropout_p, b, h, s, s) if dropout_p > 0 else None
    for i in range(b):
        for j in range(h):
            for q0 in range(0, s, 128):
                qt = (q[i, j][:, q0 : q0 + 128].astype(f32) * f32(d**-0.5)).astype(q.dtype)
                qpos, kpos = np.arange(q0, q0 + 128)[:, None], np.arange(s)[None, :]
                keep = qpos >= kpos
                if window_size[0] >= 0:
                    keep &= kpos >= qpos - window_size[0]
                sc = np.where(keep, gemm(qt.T, k[i, j]), -fmax).astype(f32)
                m = sc.max(axis=1, keepdims=True)
                e = activation_values("exp", (sc - m).astype(f32))
                total = None
                for c in range(0, s, 1024):
                    part = np.cumsum(e[:, c : c + 1024], axis=1, dtype=f32)[:, -1:]
                    total = part if total is None else (total + part).astype(f32)
                lse = (m + activation_values("log", total)).astype(f32)
                pt = e.astype(q.dtype)
                if kept is not None:
                    scaled = (pt.astype(f32) * f32(1 / (1 - dropout_p))).astype(q.dtype)
                    pt = np.where(kept[i, j, q0 : q0 + 128], scaled, np.zeros((), q.dtype))
                o = gemm(pt, v[i, j])
                o = o * activation_values("exp", (m - lse).astype(f32))
                out[i, j, q0 : q0 + 128] = o.astype(f32)
    return out


def ref_cross_entropy(logits, targets, chunk_size=1024, **_):
    """Per-position loss logsumexp(logits) - logits[target] (the first output), float32 as
    cross_entropy_forward steps through the vocabulary a chunk at a time: m = max(m, chunk's
    max), d = d * exp(m_old - m) + the in-order sum of exp(chunk - m), lse = m + log(d); exp
    and log by trn2core's activation rule (float64 formula rounded to float32)."""
    from trn2core.reference import activation_values

    f32 = np.float32
    x = logits.astype(f32)
    n, v = x.shape
    m = np.full(n, -np.inf, f32)
    d = np.zeros(n, f32)
    for c0 in range(0, v, chunk_size):
        chunk = x[:, c0 : c0 + chunk_size]
        mn = np.maximum(m, chunk.max(axis=1))
        corr = activation_values("exp", m - mn)
        e = activation_values("exp", chunk - mn[:, None])
        d = d * corr + np.cumsum(e, axis=1, dtype=f32)[:, -1]
        m = mn
    lse = m + activation_values("log", d)
    return (lse - x[np.arange(n), targets]).astype(f32)


def _tkg_layout(y):
    """[B, S, H] -> nki-library's token-generation layout [128, B*S, H/128] (LNC=1)."""
    b, s, h = y.shape
    return y.reshape(b * s, 128, h // 128).transpose(1, 0, 2)


def _rmsnorm_tkg_rows(x, g, eps=1e-6):
    """nki-library's rmsnorm_tkg on rows x [N, H] (LNC=1), its instructions' roundings: h laid
    out as h0 * H1 + h1 (128 partitions h0); the float32 squares summed over h1 in order
    (tensor_reduce), then over h0 by the PE with a float32 ones matrix (PSUM); rsqrt of
    sum / H + eps (each step float32) by trn2core's activation rule; x * gamma in float32
    times it, rounded once to x's dtype."""
    from trn2core.reference import activation_values, gemm

    f32 = np.float32
    n, h = x.shape
    xf = x.astype(f32)
    part = np.cumsum((xf * xf).reshape(n, 128, h // 128), axis=2, dtype=f32)[..., -1]
    ss = gemm(part, np.ones((128, 1), f32))[:, 0]
    rs = activation_values("rsqrt", ((ss * f32(1.0 / h)).astype(f32) + f32(eps)).astype(f32))
    return ((xf * g.reshape(1, h).astype(f32)).astype(f32) * rs[:, None]).astype(x.dtype)


def ref_rmsnorm_tkg(x, g, **_):
    """rmsnorm_tkg (_rmsnorm_tkg_rows) in its output layout."""
    y = _rmsnorm_tkg_rows(x.reshape(-1, x.shape[-1]), g).reshape(x.shape)
    return _tkg_layout(y.astype(np.float64)).astype(x.dtype)


def _layernorm_tkg_rows(x, g, b, eps=1e-6):
    """nki-library's layernorm_tkg on rows x [N, H] (LNC=1), its instructions' roundings: h laid
    out as h0 * H1 + h1 (128 partitions h0); the squares (float32) and the rows each summed over
    h1 in order (tensor_reduce), then over h0 by the PE with a float32 1/H matrix (PSUM: E[x^2],
    E[x]); var = E[x^2] - E[x]^2 and rsqrt(var + eps) in float32; then in the rows' dtype,
    each step rounded: x - mean, times gamma, times the rsqrt, plus beta."""
    from trn2core.reference import gemm

    f32, dt = np.float32, x.dtype
    n, h = x.shape
    xf = x.astype(f32).reshape(n, 128, h // 128)
    col = np.full((128, 1), f32(1.0 / h), f32)
    sums = [np.cumsum(v, axis=2, dtype=f32)[..., -1] for v in (xf * xf, xf)]  # [N, 128] each
    msq, mean = (gemm(v, col)[:, 0] for v in sums)
    var = msq - mean * mean
    rs = (1.0 / np.sqrt((var + f32(eps)).astype(np.float64))).astype(f32)[:, None]
    y = (x.astype(f32) - mean[:, None]).astype(dt).astype(f32)
    y = (y * g.astype(f32)).astype(dt).astype(f32)
    y = (y * rs).astype(dt)
    return y if b is None else (y.astype(f32) + b.astype(f32)).astype(dt)


def ref_layernorm_tkg(x, g, b, **_):
    y = _layernorm_tkg_rows(x.reshape(-1, x.shape[-1]), g, b)
    return _tkg_layout(y.reshape(x.shape))


def _bf16(x):
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def ref_rmsnorm_quant(hidden, ln_w, kargs=None, **_):
    """RMS norm (fp32 statistics, the normalised rows in bf16), then per-row fp8 (e4m3, range
    240) quantization; compared dequantized: values times the row's fp32 scale."""
    x = hidden.astype(np.float32).reshape(-1, hidden.shape[-1])
    h = x.shape[1]
    inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).sum(axis=1, keepdims=True) / h + 1e-6)
    y = _bf16(x * inv.astype(np.float32) * ln_w.astype(np.float32).reshape(1, h))
    dq = np.maximum(np.abs(y).max(axis=1, keepdims=True) * np.float32(1 / 240), 1e-6)
    q = (y * (1.0 / dq).astype(np.float32)).astype(ml_dtypes.float8_e4m3)
    return (q.astype(np.float32) * dq).reshape(hidden.shape)


def ref_rmsnorm_quant_legacy(hidden, ln_w, kargs=None, **_):
    """The reference tree's legacy rmsnorm_quant, in its order (bit-exact): the squares'
    float32 sum in order (``activation_reduce``), ``sum * (1/H) + eps`` with eps in bf16 (its
    bias tile's dtype), rsqrt; the normalised rows in bf16; the quantized product rounded to
    bf16 first (the legacy ``tensor_scalar`` result takes its data's dtype), then to fp8 when
    assigned to the fp8 tile."""
    x = hidden.astype(np.float32).reshape(-1, hidden.shape[-1])
    h = x.shape[1]
    total = np.zeros((x.shape[0], 1), np.float32)
    for c in range(h):
        total += x[:, c : c + 1] * x[:, c : c + 1]
    eps = np.float32(_bf16(np.float32(kargs.eps if kargs is not None else 1e-6)))
    inv = (1.0 / np.sqrt((total * np.float32(1 / h) + eps).astype(np.float64))).astype(np.float32)
    y = _bf16(x * inv * ln_w.astype(np.float32).reshape(1, h))
    dq = np.maximum(np.abs(y).max(axis=1, keepdims=True) * np.float32(1 / 240), np.float32(1e-6))
    q = _bf16(y * (1.0 / dq).astype(np.float32)).astype(ml_dtypes.float8_e4m3)
    return (q.astype(np.float32) * dq).reshape(hidden.shape)


def decode_row_quant(out):
    """[..., H + 4] fp8 (the last 4 bytes of a row: its fp32 dequantization scale) -> the
    dequantized [..., H] in fp32."""
    o = np.ascontiguousarray(out).reshape(-1, out.shape[-1])
    scale = o[:, -4:].copy().view(np.float32)  # [rows, 1]
    return (o[:, :-4].astype(np.float32) * scale).reshape(*out.shape[:-1], out.shape[-1] - 4)


def ref_rope(x, cos, sin, contiguous_layout=True, **_):
    """x [d, B, heads, S]; cos, sin [d/2, B, S]. Contiguous layout: the first half of d pairs
    with the second; interleaved: even rows pair with odd rows. Each product and the sum or
    difference rounded to x's dtype, as RoPE_sbuf's tensor_tensor steps store them."""
    d, dt = x.shape[0], x.dtype
    x32 = x.astype(np.float32)
    if contiguous_layout:
        a, b = x32[: d // 2], x32[d // 2 :]
    else:
        a, b = x32[0::2], x32[1::2]
    c, s = cos.astype(np.float32)[:, :, None, :], sin.astype(np.float32)[:, :, None, :]

    def r(v):  # each product and the sum stored in x's dtype (tensor_tensor)
        return v.astype(dt).astype(np.float32)

    lo, hi = r(r(a * c) - r(b * s)), r(r(b * c) + r(a * s))
    out = np.empty_like(x32)
    if contiguous_layout:
        out[: d // 2], out[d // 2 :] = lo, hi
    else:
        out[0::2], out[1::2] = lo, hi
    return out.astype(x.dtype)


def ref_max_index(x):
    """The maximum of the last axis and its index (the last one on ties: none in the inputs)."""
    return x.max(axis=-1, keepdims=True), x.argmax(axis=-1)[..., None].astype(np.uint32)


def ref_nonzero_indices(x, **_):
    """Per column c of x [T, C]: the rows t with x[t, c] != 0 ascending, -1 up to T; and the
    counts."""
    t, c = x.shape
    idx = np.full((c, t), -1, np.int32)
    counts = np.zeros(c, np.int32)
    for j in range(c):
        nz = np.flatnonzero(x[:, j])
        idx[j, : len(nz)] = nz
        counts[j] = len(nz)
    return idx, counts


def _sparse(r, *shape, density=0.3):
    return np.where(r.random(shape) < density, _f32(r, *shape), np.float32(0))


def ref_topk(x, k, **_):
    """The k largest of the last axis, descending, and their indices (no ties in the inputs)."""
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, axis=-1), order.astype(np.uint32)


def ref_conv1d(x, w, **_):
    """y[b, o, l] = sum over taps j and channels c of x[b, c, l + j] w[j, c, o] (stride 1),
    as conv1d sums it (C_in up to 128): 128 // C_in taps stacked on the partitions per matmul
    (row j * C_in + c), each stack's float32 partial sum (trn2core.reference.gemm) accumulated
    in PSUM in tap order."""
    from trn2core.reference import gemm

    k, c = w.shape[0], w.shape[1]
    n = x.shape[2] - k + 1
    per = max(1, 128 // c)
    out = []
    for xb in x:
        psum = None
        for j0 in range(0, k, per):
            taps = range(j0, min(j0 + per, k))
            a = np.concatenate([xb[:, j : j + n].T for j in taps], axis=1)  # [n, taps * C_in]
            part = gemm(a, np.concatenate([w[j] for j in taps], axis=0))
            psum = part if psum is None else (psum + part).astype(np.float32)
        out.append(psum.T)
    return np.ascontiguousarray(np.stack(out)).astype(x.dtype)


def _rope_hf_inputs(r):
    q, k = _f32(r, 1, 2, 256, 64), _f32(r, 1, 1, 256, 64)
    ang = r.uniform(0.0, 6.0, (256, 32))
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1).astype(np.float32)
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1).astype(np.float32)
    return (q, k, np.zeros_like(q), np.zeros_like(k)), {"cos": cos, "sin": sin}


def ref_rope_hf(q, k, q_out, k_out, cos, sin, **_):
    """HuggingFace rotary embedding: x cos + rotate_half(x) sin over [b, heads, s, d]."""

    def rot(x):
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def ref_attention_cte(q, k, v, scale=1.0, causal_mask=True, bias=None, **_):
    """softmax(q k * scale) v, causal or not: q [b, s, d], k [b, d, s], v [b, s, d] ->
    [b, s, d], with attention_cte's roundings (one section: s <= its section length). Per
    128-query tile: the scores PSUM's float32 sums (trn2core.reference.gemm), masked causally
    to -FLT_MAX, times the scale in float32; the row max; exp(score - max) by trn2core's
    activation rule (float32) stored as bf16 P, its float32 results summed in order per
    512-key chunk (activation_reduce), the chunks' sums added in order; P v PSUM's float32
    sums over 128-key tiles; times the float32 reciprocal of the sum, rounded to bf16 once.
    bias [b, s] (NxDI's attention_cte_with_bias): added to the scores in PSUM (a matmul of a
    ones row and the bias row, float32) before the scale."""
    from trn2core.reference import activation_values, gemm, reciprocal

    f32 = np.float32
    b, s, _ = q.shape
    out = np.zeros(q.shape, q.dtype)
    for i in range(b):
        for q0 in range(0, s, 128):
            sc = gemm(q[i, q0 : q0 + 128], k[i])
            if bias is not None:
                sc = (sc + bias[i].astype(f32)).astype(f32)
            if causal_mask:
                keep = np.arange(q0, q0 + sc.shape[0])[:, None] >= np.arange(s)[None, :]
                sc = np.where(keep, sc, -np.finfo(f32).max).astype(f32)
            sc = (sc * f32(scale)).astype(f32)
            e = activation_values("exp", (sc - sc.max(axis=1, keepdims=True)).astype(f32))
            tot = np.zeros(sc.shape[0], f32)
            for c0 in range(0, s, 512):
                part = np.zeros(sc.shape[0], f32)
                for j in range(c0, min(c0 + 512, s)):
                    part = (part + e[:, j]).astype(f32)
                tot = (tot + part).astype(f32)
            o = gemm(e.astype(q.dtype), v[i])
            out[i, q0 : q0 + 128] = (o * reciprocal(tot, "fp32")[:, None]).astype(f32)
    return out


def ref_qkv(input, fused_qkv_weights, bias=None, **kw):  # noqa: A002 - the kernel's keyword
    """nki-library's QKV projection: optional residual add (input + mlp_prev + attention_prev),
    optional RMS / layer norm over H (fp32 statistics; the normalised rows rounded to the
    weights' dtype, the matmul's operand), then rows @ weights + bias; BSD [B, S, I] or NBSd
    [N, B, S, d_head]."""
    x = input.astype(np.float64)
    if kw.get("fused_residual_add"):
        x = x + kw["mlp_prev"].astype(np.float64) + kw["attention_prev"].astype(np.float64)
    x_sum = x
    norm = getattr(kw.get("fused_norm_type"), "name", "NO_NORM")
    eps = kw.get("norm_eps", 1e-6)
    quant = getattr(kw.get("quantization_type"), "name", "NONE")
    cte = input.shape[1] > 96  # qkv_cte (else qkv_tkg)
    if norm == "RMS_NORM" and cte:  # qkv_cte normalises in two steps, each rounded to the
        # input's dtype: the rows times the float32 1/rms (sum of squares and rsqrt in float32,
        # eps as the matmul dtype holds it: bf16, or fp8 in the STATIC form, where 1e-6 is 0),
        # then (transposed) times gamma
        f32 = np.float32
        mm = fused_qkv_weights.dtype if quant == "STATIC" else input.dtype
        xf = x.astype(input.dtype).astype(f32)
        ss = np.cumsum(xf * xf, axis=-1, dtype=f32)[..., -1:]  # activation_reduce: in order
        t = ss * f32(1.0 / x.shape[-1]) + f32(np.float32(eps).astype(mm))  # each step float32
        rs = (1.0 / np.sqrt(t.astype(np.float64))).astype(f32)  # rsqrt rounded once
        x = (xf * rs).astype(input.dtype).astype(f32) * kw["gamma_norm_weights"].astype(f32)
        x = x.astype(input.dtype).astype(np.float64)
        norm = "DONE"
    if norm == "LAYER_NORM" and cte:  # qkv_cte: the fused sum in float32 in order, rounded
        # once (dma_compute); bn_stats and bn_aggr per row, rsqrt(var + eps) (eps a bf16 tile);
        # (x - mean) * rsqrt and then (transposed) x * gamma + beta, each rounded to bf16
        from trn2core import reference as tr

        f32 = np.float32
        xs = input.astype(f32)
        if kw.get("fused_residual_add"):
            xs = (xs + kw["mlp_prev"].astype(f32)) + kw["attention_prev"].astype(f32)
        h = input.shape[-1]
        rows = xs.astype(input.dtype).reshape(-1, h)
        stats = np.concatenate([tr.bn_stats(rows[:, j : j + 512]) for j in range(0, h, 512)], 1)
        mean, var = tr.bn_aggr(stats).T
        t = (var + f32(np.float32(eps).astype(input.dtype))).astype(np.float64)
        rs = (1.0 / np.sqrt(t)).astype(f32)
        xn = tr.tensor_scalar(rows, "subtract", mean[:, None], "bf16", op1="multiply",
                              operand1=rs[:, None])  # fmt: skip
        gamma = kw["gamma_norm_weights"].reshape(h, 1)
        beta = kw.get("layer_norm_bias")
        if beta is None:
            xg = tr.tensor_scalar(xn.T, "multiply", gamma, "bf16")
        else:
            xg = tr.tensor_scalar(xn.T, "multiply", gamma, "bf16", op1="add",
                                  operand1=beta.reshape(h, 1))  # fmt: skip
        x = xg.T.reshape(x.shape).astype(np.float64)
        norm = "DONE"
    if not cte and kw.get("fused_residual_add"):  # qkv_tkg's dma_compute: hidden, then
        # attention_prev, then mlp_prev added in float32, rounded once
        f32 = np.float32
        xs = input.astype(f32) + kw["attention_prev"].astype(f32) + kw["mlp_prev"].astype(f32)
        x = x_sum = xs.astype(input.dtype).astype(np.float64)
    if norm == "LAYER_NORM" and not cte and quant == "NONE":
        rows = x.astype(input.dtype).reshape(-1, x.shape[-1])
        beta = kw.get("layer_norm_bias")
        x = _layernorm_tkg_rows(rows, kw["gamma_norm_weights"], beta, eps)
        x = x.reshape(input.shape).astype(np.float64)
        norm = "DONE"
    if norm == "LAYER_NORM":
        x = x - x.mean(axis=-1, keepdims=True)
    if norm not in ("NO_NORM", "DONE"):
        x = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    if norm in ("RMS_NORM", "LAYER_NORM"):
        x = x * kw["gamma_norm_weights"].astype(np.float64)
    if kw.get("layer_norm_bias") is not None and norm != "DONE":
        x = x + kw["layer_norm_bias"].astype(np.float64)
    if quant == "STATIC":  # the rows (in the input's dtype) times the input scale's float32
        # reciprocal, in the input's dtype again (qkv_cte: straight to fp8), clipped to 240 and
        # quantized to fp8
        inv = np.float32(1.0) / kw["qkv_in_scale"][0, 0]
        x = x.astype(input.dtype).astype(np.float32) * inv
        x = x.astype(fused_qkv_weights.dtype if cte else input.dtype)
        x = np.clip(x.astype(np.float64), -240.0, 240.0)
        x = x.astype(fused_qkv_weights.dtype).astype(np.float64)
    elif norm != "NO_NORM":  # ROW quantization keeps the rows in the input's dtype
        x = x.astype(input.dtype if quant == "ROW" else fused_qkv_weights.dtype)
        x = x.astype(np.float64)
    if quant == "NONE" and cte:  # PSUM's float32 sums (ascending h per 128-row tile), the
        # bias added to them in float32 (tensor_tensor) before the one rounding to bf16
        from trn2core.reference import gemm

        rows = x.astype(fused_qkv_weights.dtype)
        y = np.stack([gemm(r, fused_qkv_weights) for r in rows])
        if bias is not None:
            y = (y + bias.astype(np.float32)).astype(np.float32)
            bias = None
        y = y.astype(np.float64)
    elif not cte and x.shape[-1] // kw.get("lnc", 1) < 2048:
        ops = x.astype(input.dtype if quant == "ROW" else fused_qkv_weights.dtype)
        post = None
        if quant != "NONE":  # dequantized in the output's dtype on each core before the
            # cores' outputs are added (ROW: times each column's scale; STATIC: the q, k, v
            # columns times their weight scale times the input scale, a float32 product),
            # then plus the bias (core 0), each step rounded
            f32, sc = np.float32, kw["qkv_w_scale"][0].astype(np.float32)
            if quant == "STATIC":
                nq, nkv, d = kw["num_q_heads"], kw["num_kv_heads"], kw["d_head"]
                cols = np.repeat([0, 1, 2], [nq * d, nkv * d, nkv * d])
                sc = (sc * kw["qkv_in_scale"][0, 0])[cols]

            def post(out, core, sc=sc, bf=input.dtype, b=bias):
                out = (out * sc).astype(bf).astype(f32)
                if b is not None and core == 0:
                    out = (out + b.astype(f32)).astype(bf).astype(f32)
                return out

            quant = "DONE"
        y = _qkv_tkg_matmul(ops, fused_qkv_weights, bias if quant == "NONE" else None, kw,
                            input.dtype, post)  # fmt: skip
        bias = None
    else:
        y = x @ fused_qkv_weights.astype(np.float64)
    if quant == "ROW":  # fp8 weights, each column's fp32 dequantization scale
        y = y * kw["qkv_w_scale"][0].astype(np.float64)
    elif quant == "STATIC":  # a weight scale for the q, k and v columns each, and the input's
        nq, nkv, d = kw["num_q_heads"], kw["num_kv_heads"], kw["d_head"]
        cols = np.repeat([0, 1, 2], [nq * d, nkv * d, nkv * d])
        if cte:  # the product stored (input dtype), times the float32 product of the scales
            ws = kw["qkv_w_scale"][0].astype(np.float32) * kw["qkv_in_scale"][0, 0]
            y = y.astype(np.float32).astype(input.dtype).astype(np.float32) * ws[cols]
        else:
            y = y * kw["qkv_w_scale"][0].astype(np.float64)[cols] * float(kw["qkv_in_scale"][0, 0])
    if bias is not None:
        y = y + bias.astype(np.float64)
    b, s, i = y.shape
    if kw.get("fused_rope"):  # on the q and k heads: [x1, x2] cos + [-x2, x1] sin
        nq, nkv, d = kw["num_q_heads"], kw["num_kv_heads"], kw["d_head"]
        y = y.astype(input.dtype).astype(np.float64)  # the projection is stored, then rotated
        heads = y.reshape(b, s, nq + 2 * nkv, d)
        qk = heads[:, :, : nq + nkv]
        rot = np.concatenate([-qk[..., d // 2 :], qk[..., : d // 2]], axis=-1)
        cos, sin = (kw[c].astype(np.float64)[:, :, None, :] for c in ("cos_cache", "sin_cache"))
        if cte:  # qkv_cte rotates in bf16 tiles, each product and the sum rounded
            f32, bf = np.float32, input.dtype
            qk, cos, sin = (v.astype(f32) for v in (qk, cos, sin))
            rot = (rot.astype(f32) * sin).astype(bf).astype(f32)
            heads[:, :, : nq + nkv] = ((qk * cos).astype(bf).astype(f32) + rot).astype(bf)
        else:
            heads[:, :, : nq + nkv] = qk * cos + rot * sin
        y = heads.reshape(b, s, i)
    if getattr(kw.get("output_layout"), "name", "BSD") == "NBSd":
        y = y.reshape(b, s, i // kw["d_head"], kw["d_head"]).transpose(2, 0, 1, 3)
    out = np.ascontiguousarray(y).astype(input.dtype)
    if kw.get("fused_residual_add") and s <= 96:  # qkv_tkg also returns the residual sum
        return out, x_sum.astype(input.dtype)
    return out


def _qkv_tkg_matmul(x, w, bias, kw, bf, post=None):
    """qkv_tkg's bf16 projection of rows x [..., H] (H under 2048 per core: one H block), as
    float64 values: each core's share of H in 128-row tiles, tile j holding h = h0 * H1 + j (H1
    tiles a core), the tiles in PSUM row groups j % f (f = 128 / the array tile, 32 rows up to
    32 tokens, 64 up to 64; f = 1 where f does not divide H1), each group's float32 sum added in
    turn to the bf16 output (the bias on core 0, else 0), each sum rounded to bf16; at LNC=2 the
    two cores' outputs added in bf16 (sendrecv). bf: the output's dtype; post(out, core): what
    a core does to its float32 values of its bf16 output before the exchange (the fp8 forms'
    dequantization and bias)."""
    from trn2core.reference import gemm

    f32 = np.float32
    lnc, h = kw.get("lnc", 1), x.shape[-1]
    rows = x.reshape(-1, h)
    h1 = h // 128 // lnc
    f = 128 // (32 if len(rows) <= 32 else 64 if len(rows) <= 64 else 128)
    f = f if h1 % f == 0 else 1
    total = None
    for core in range(lnc):
        out = np.zeros((len(rows), w.shape[1]), f32)
        if bias is not None and core == 0:
            out += bias.astype(f32)
        for g in range(f):
            tiles = [core * 128 * h1 + np.arange(128) * h1 + j for j in range(g, h1, f)]
            order = np.concatenate(tiles)
            out = (out + gemm(rows[:, order], w[order])).astype(bf).astype(f32)
        if post is not None:
            out = post(out, core)
        total = out if total is None else (total + out).astype(bf).astype(f32)
    return total.reshape(*x.shape[:-1], w.shape[1]).astype(np.float64)


def ref_out_proj_tkg(attention, weight, bias=None, TRANSPOSE_OUT=False, lnc=1, **kw):  # noqa: N803
    """attention [D, B, N, S] as rows [B*S, N*D] (column n*D + d) @ weight [N*D, H] + bias;
    TRANSPOSE_OUT: [128, LNC, H2, B*S] with H2 = H / 128 / LNC, h = (h0 * 128 + h1) * H2 + h2."""
    d, b, n, s = attention.shape
    a = attention.astype(np.float64)
    if kw.get("input_scale") is not None:  # STATIC: as qkv_tkg quantizes its rows (ref_qkv)
        inv = np.float32(1.0) / kw["input_scale"][0, 0]
        a = (attention.astype(np.float32) * inv).astype(attention.dtype).astype(np.float64)
        a = np.clip(a, -240.0, 240.0).astype(weight.dtype).astype(np.float64)
    a = a.transpose(1, 3, 2, 0).reshape(b * s, n * d)
    # PSUM's float32 sums (heads packed by two into 128 rows: k = n * D + d, 128 a tile), then
    # in the output's dtype, each step rounded: times the scale (ROW: each column's; STATIC:
    # the float32 product of the weight and input scales), plus the bias
    from trn2core.reference import gemm

    f32, dt = np.float32, attention.dtype
    y = gemm(a.astype(weight.dtype if kw.get("input_scale") is not None else dt), weight)
    if kw.get("weight_scale") is not None:  # ROW: a scale per column; STATIC: one
        sc = kw["weight_scale"][0].astype(f32)
        if kw.get("input_scale") is not None:
            sc = sc * kw["input_scale"][0, 0]
        y = (y * sc).astype(dt).astype(f32)
    if bias is not None:
        y = (y + bias.astype(f32)).astype(f32)
    y = y.astype(dt)
    if TRANSPOSE_OUT:
        y = y.T.reshape(lnc, 128, y.shape[1] // 128 // lnc, b * s).transpose(1, 0, 2, 3)
    return np.ascontiguousarray(y).astype(attention.dtype)


def ref_out_proj_cte(attention, weight, bias=None, **_):
    """attention [B, N, D, S] -> rows [B, S, N*D] (column n*D + d) @ weight [N*D, H] + bias."""
    from trn2core.reference import gemm

    b, n, d, s = attention.shape
    a = attention.transpose(0, 3, 1, 2).reshape(b, s, n * d)
    # PSUM's float32 sums (heads packed into 128-row tiles: k = n * D + d), plus the bias in
    # float32 (tensor_tensor), rounded once
    y = np.stack([gemm(rows, weight) for rows in a])
    if bias is not None:
        y = (y + bias.astype(np.float32)).astype(np.float32)
    return y.astype(attention.dtype)


def _out_proj_inputs(attn_shape, nd, h, quant=None, **kw):
    """bf16 attention and weights, or fp8 weights (quant "ROW": a float32 scale per column,
    [128, H] pre-broadcast; "STATIC": one weight scale and one input scale, [128, 1]), and a
    bias [1, H]."""

    def f(r):
        w = (_f32(r, nd, h) / np.sqrt(nd)).astype(BF16)
        opts = {"bias": _f32(r, 1, h).astype(BF16), **kw}
        if quant:
            w = (_f32(r, nd, h, lo=-200.0, hi=200.0) / np.sqrt(nd)).astype(ml_dtypes.float8_e4m3)
            opts["quantization_type"] = getattr(_lib_attr(TYPES, "QuantizationType"), quant)
            cols = h if quant == "ROW" else 1
            scale = np.repeat(r.uniform(0.5, 2.0, (1, cols)), 128, 0).astype(np.float32)
            opts["weight_scale"] = scale
            if quant == "STATIC":
                opts["input_scale"] = np.full((128, 1), 0.01, np.float32)
        return (_f32(r, *attn_shape).astype(BF16), w), opts

    return f


def ref_mlp(x, wg, wu, wd, normalization_weights_tensor=None, **kw):
    """nki-library's MLP: optional residual add (x + fused_add_tensor, in x's dtype) and RMS
    norm (the normalised rows in the weights' dtype), then
    (silu(x @ gate) * (x @ up)) @ down, the product rounded to the weights' dtype (the down
    projection's operand); [B, S, H] -> [B, S, H]. Each form with its kernel's roundings
    (_ref_mlp_tkg, _ref_mlp_cte, _ref_mlp_fp8_tokens)."""
    if x.dtype == ml_dtypes.float8_e4m3:
        return _ref_mlp_fp8_tokens(x, wg, wu, wd, **kw)
    quant = getattr(kw.get("quantization_type"), "name", "NONE") != "NONE"
    if not quant and x.size // x.shape[-1] > 96:  # mlp_cte
        return _ref_mlp_cte(x, wg, wu, wd, normalization_weights_tensor, **kw)
    return _ref_mlp_tkg(x, wg, wu, wd, normalization_weights_tensor, **kw)


def _ref_mlp_tkg(x, wg, wu, wd, gamma, **kw):
    """mlp_tkg in its instructions' roundings: the fused add in float32, rounded once
    (dma_compute); rmsnorm_tkg (_rmsnorm_tkg_rows); the gate and up projections PSUM's
    float32 sums (trn2core.reference.gemm), with fp8 weights (ROW: a scale per column, STATIC:
    one; the rows stay bf16) times the scale in float32; silu (trn2core's activation rule)
    times up in float32, rounded to bf16; the down projection's sums (times its scale in
    float32) rounded once."""
    from trn2core.reference import activation_values, gemm

    f32, dt, h = np.float32, x.dtype, x.shape[-1]
    quant = getattr(kw.get("quantization_type"), "name", "NONE") != "NONE"
    rows = added = x.reshape(-1, h)
    if kw.get("fused_add_tensor") is not None:
        added = rows.astype(f32) + kw["fused_add_tensor"].reshape(-1, h).astype(f32)
        rows = added = added.astype(dt)
    if getattr(kw.get("normalization_type"), "name", "NO_NORM") == "RMS_NORM":
        rows = _rmsnorm_tkg_rows(rows, gamma, kw.get("eps", 1e-6))
    g, u = gemm(rows, wg), gemm(rows, wu)
    if quant:
        g = (g * kw["gate_w_scale"][0].astype(f32)).astype(f32)
        u = (u * kw["up_w_scale"][0].astype(f32)).astype(f32)
    y = gemm((activation_values("silu", g) * u).astype(f32).astype(dt), wd)
    if quant:
        y = (y * kw["down_w_scale"][0].astype(f32)).astype(f32)
    out = y.astype(dt).reshape(x.shape)
    if kw.get("store_fused_add_result"):  # the residual sum, stored too
        return out, added.reshape(x.shape)
    return out


def _ref_mlp_cte(x, wg, wu, wd, gamma, **kw):
    """mlp_cte's bf16 form in its instructions' roundings: the fused add in float32, rounded
    once (dma_compute); the RMS norm's sum of squares in order (activation_reduce), rsqrt of
    ss / H + eps (eps a bf16 tile) rounded once, x * rsqrt rounded to bf16, then (transposed)
    times gamma, rounded again; the gate and up projections PSUM's float32 sums
    (trn2core.reference.gemm); silu (trn2core's activation rule) of the gate rounded to bf16;
    times up (PSUM) rounded to bf16; the down projection's sums rounded once."""
    from trn2core import reference as tr

    f32, dt, h = np.float32, x.dtype, x.shape[-1]
    xs = x.reshape(-1, h).astype(f32)
    if kw.get("fused_add_tensor") is not None:
        xs = xs + kw["fused_add_tensor"].reshape(-1, h).astype(f32)
    added = xs.astype(dt)
    xb = added.astype(f32)
    if getattr(kw.get("normalization_type"), "name", "NO_NORM") == "RMS_NORM":
        ss = np.cumsum(xb * xb, axis=1, dtype=f32)[:, -1:]
        t = ss * f32(1.0 / h) + f32(np.float32(kw.get("eps", 1e-6)).astype(dt))
        rs = (1.0 / np.sqrt(t.astype(np.float64))).astype(f32)
        xb = (xb * rs).astype(dt).astype(f32)
        xb = (xb * gamma.astype(f32)).astype(dt).astype(f32)
    rows = xb.astype(wg.dtype)
    g, u = tr.gemm(rows, wg), tr.gemm(rows, wu)
    a = tr.activation_values("silu", g).astype(dt).astype(f32)
    y = tr.gemm((a * u).astype(wd.dtype), wd).astype(dt).reshape(x.shape)
    if kw.get("store_fused_add_result"):
        return y, added.reshape(x.shape)
    return y


def _ref_mlp_fp8_tokens(x, wg, wu, wd, **kw):
    """mlp_cte's quantized forms: fp8 tokens (already quantized) and weights, bf16 output;
    each step rounded to bf16 as the kernel stores it. STATIC: gate = silu(x @ W_gate times
    its weight scale times the input scale, in float32); the product gate * (x @ W_up), then
    times the up scale; then times the float32 reciprocal of down_in_scale, clipped to 240
    and quantized to fp8; the down projection times its weight scale times down_in_scale.
    ROW: the tokens [B, S, H + 4], each row's float32 scale in its last 4 bytes; each
    projection times its weights' column scales, then times the row's scale (the gate then
    through silu); the product quantized per row (scale max(|a|) / 240, at least 1e-6, a
    times its float32 reciprocal to fp8); the down projection times its column scales, then
    the row's scale."""
    f32, f = np.float32, np.float64

    def b(v):  # stored in bf16
        return np.asarray(v, f32).astype(BF16).astype(f32)

    def silu(z):
        return (z / (1.0 + np.exp(-z.astype(f)))).astype(f32)

    row = getattr(kw["quantization_type"], "name", "") == "ROW"
    n = x.shape[-1] - 4 if row else x.shape[-1]
    h = x[..., :n].astype(f).reshape(-1, n)
    pg, pu = ((h @ w.astype(f)).astype(f32) for w in (wg, wu))  # PSUM, float32
    if row:
        sx = np.ascontiguousarray(x[..., n:]).view(f32).reshape(-1, 1)
        gate = b(silu(b(pg * kw["gate_w_scale"][0]) * sx))
        a = b(b(b(gate * pu) * kw["up_w_scale"][0]) * sx)
        dq = np.maximum(np.abs(a).max(axis=1, keepdims=True) * f32(1 / 240), f32(1e-6))
        q = (a * (f32(1) / dq)).astype(wd.dtype)
        pd = (q.astype(f) @ wd.astype(f)).astype(f32)
        out = b(b(pd * kw["down_w_scale"][0]) * dq)
    else:
        s_in, s_down = f32(kw["gate_up_in_scale"][0, 0]), f32(kw["down_in_scale"][0, 0])
        sg, su, sd = (f32(kw[f"{k}_w_scale"][0, 0]) * s for k, s in
                      (("gate", s_in), ("up", s_in), ("down", s_down)))  # fmt: skip
        a = b(b(b(silu(pg * sg)) * pu) * su)
        q = np.clip(b(a * (f32(1) / s_down)), -240.0, 240.0).astype(wd.dtype)
        out = b((q.astype(f) @ wd.astype(f)).astype(f32) * sd)
    return out.reshape(*x.shape[:-1], n).astype(BF16)


def _mlp_inputs(b, s, h, i, **kw):
    def f(r):
        x = _f32(r, b, s, h).astype(BF16)
        ws = [(_f32(r, m, n) / np.sqrt(m)).astype(BF16) for m, n in ((h, i), (h, i), (i, h))]
        opts = {}
        quant = kw.get("quant")
        if quant:  # fp8 weights (values up to 4), float32 scales of about 1/64 each: per
            # column [128, I] / [128, H] (ROW) or one [128, 1] (STATIC, with the inputs'
            # scales it requires)
            opts["quantization_type"] = getattr(_lib_attr(TYPES, "QuantizationType"), quant)
            dims = ((h, i), (h, i), (i, h))
            ws = [(_f32(r, m, n) * 64 / np.sqrt(m)).astype(ml_dtypes.float8_e4m3) for m, n in dims]
            for name, (_, n) in zip(("gate", "up", "down"), dims, strict=True):
                cols = n if quant == "ROW" else 1
                sc = np.repeat(r.uniform(0.5, 2.0, (1, cols)) / 64, 128, 0).astype(np.float32)
                opts[f"{name}_w_scale"] = sc
            if quant == "STATIC":
                for name in ("gate_up_in_scale", "down_in_scale"):
                    opts[name] = np.full((128, 1), 0.05, np.float32)
        if kw.get("fp8"):  # quantized tokens (mlp_cte's quantized forms), bf16 out
            fp8 = ml_dtypes.float8_e4m3
            q = _f32(r, b, s, h, lo=-200.0, hi=200.0).astype(fp8)
            if quant == "ROW":  # each row's float32 dequantization scale in its last 4 bytes
                sc = r.uniform(0.5, 2.0, (b, s, 1)).astype(np.float32) / 200
                q = np.concatenate([q, sc.view(fp8)], axis=-1)
            else:  # the static input scale: |tokens| about 200 x 1/200
                opts["gate_up_in_scale"] = np.full((128, 1), 1 / 200, np.float32)
            x = q
            opts["output_dtype"] = _lib_attr("nki.language", "bfloat16")
        if kw.get("column_tiling"):  # mlp.py's defaults (MLPParameters' are False)
            opts["use_tkg_gate_up_proj_column_tiling"] = True
            opts["use_tkg_down_proj_column_tiling"] = True
        if kw.get("norm"):
            opts["normalization_type"] = _lib_attr(TYPES, "NormType").RMS_NORM
            opts["normalization_weights_tensor"] = _f32(r, 1, h, lo=0.5, hi=1.5).astype(BF16)
        if kw.get("fused_add"):
            opts["fused_add_tensor"] = _f32(r, b, s, h).astype(BF16)
            opts["store_fused_add_result"] = kw.get("store", False)
        return (x, *ws), opts

    return f


def _tkg_wrapper(sub):
    """Our kernel around an nki-library norm sub-kernel: its SBUF output copied to HBM."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def wrapped(x, g, *rest):
        b, s, h = x.shape
        o = nl.ndarray((128, b * s, h // 128), dtype=x.dtype, buffer=nl.sbuf)
        if rest:
            sub(x, g, o, beta=rest[0])
        else:
            sub(x, g, o)
        out = nl.ndarray((128, b * s, h // 128), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=o)
        return out

    return wrapped


def _mlp_wrapper(sub):
    """Our kernel around nki-library's mlp_tkg / mlp_cte (its own @nki.jit entry, mlp.py, has an
    IndentationError upstream): their parameters built from the arrays, the output in HBM, and
    for mlp_tkg an SBUF manager of 200 KiB (mlp_tkg.py names SbufManager without importing it
    for its own default)."""
    import nki
    import nki.language as nl

    params = _lib_attr("nkilib.core.mlp.mlp_parameters", "MLPParameters")
    sbm = _lib_attr("nkilib.core.utils.allocator", "SbufManager")
    logger = _lib_attr("nkilib.core.utils.logging", "Logger")

    @nki.jit
    def wrapped(x, wg, wu, wd, **kw):
        p = params(x, wg, wu, wd, **kw)
        shape = (p.batch_size, p.sequence_len, p.hidden_size)
        out = nl.ndarray(shape, dtype=p.output_dtype, buffer=nl.shared_hbm)
        added = None
        if kw.get("store_fused_add_result"):
            added = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        if sub.__name__ == "mlp_tkg":
            sub(p, out, added, sbm=sbm(0, 200 * 1024, logger("mlp")))
        else:
            sub(p, out, added)
        return out if added is None else (out, added)

    return wrapped


def _tkg_rope_coeffs(pos, inv_freqs):
    """attention_tkg's cos and sin [d/2, B*S] (float32), as its _rope computes them: the angle
    pos * inv_freq, shifted by pi (sin) or 3 pi / 2 (cos), reduced modulo 2 pi (q = int32 of
    x / 2pi - 0.5, x - q 2pi), minus pi, then sin by trn2core's activation rule; each step a
    Vector engine instruction rounded to float32 (trn2core.reference)."""
    import trn2core.reference as tr

    half = inv_freqs.shape[0]
    emb = tr.tensor_scalar(
        np.repeat(pos.astype(np.float32).reshape(1, -1), half, 0), "multiply", inv_freqs, "fp32"
    )

    def sin_of(shift):
        x = tr.tensor_scalar(emb, "add", shift, "fp32")
        q = tr.tensor_scalar(x, "multiply", 1.0 / (2.0 * np.pi), "fp32", op1="add", operand1=-0.5)
        qy = tr.tensor_scalar(tr.tensor_copy(q, "int32"), "multiply", 2.0 * np.pi, "fp32")
        x = tr.tensor_scalar(tr.tensor_tensor(x, qy, "subtract", "fp32"), "add", -np.pi, "fp32")
        return tr.activation_values("sin", x)

    return sin_of(1.5 * np.pi), sin_of(np.pi)


def _tkg_apply_rope(x, cos, sin, dtype):
    """attention_tkg's _apply_rope on x [d, B, n, S] (float32 values): x cos and
    rotate_half(x) sin each rounded to float32, their sum rounded to float32 then dtype."""
    f32, h = np.float32, x.shape[0] // 2
    c = np.concatenate([cos, cos])[:, :, None, :]
    s = np.concatenate([sin, sin])[:, :, None, :]
    rot = np.concatenate([-x[h:], x[:h]])
    return ((x * c).astype(f32) + (rot * s).astype(f32)).astype(f32).astype(dtype)


def ref_attention_tkg(q, k_active, v_active, k_prior, v_prior, mask, sink=None, **kw):
    """nki-library's token-generation attention (its docstring): the keys and values are the
    KV cache's first s_prior positions with the last s_active replaced by the active tokens';
    scores k . q (unscaled), -inf where the mask [s_prior, B, H, s_active] is 0, softmax over
    the positions (and, with a sink [H, 1], one extra score per head that takes part in the
    normalisation only), times v: out [B, H, d, s_active]. q is [d, B*H*s_active] and k_active
    [d, B*s_active] (the SBUF layouts), k_prior [B, 1, d, s_prior] ([B, 1, s_prior, d] with
    tp_k_prior), v_prior [B, 1, s_prior, d], v_active [B, 1, s_active, d].

    The other forms: fuse_rope takes q [B, H, s_active, d] and k_active [B, 1, s_active, d]
    from HBM, applies RoPE at rope_pos_ids [B, s_active] with inv_freqs [d/2, 1] to both,
    scales q by 1/sqrt(d) and also returns the rotated k_active [B, 1, d, s_active];
    use_pos_id takes the mask of the active tokens only [s_active, B, H, s_active] and sees
    the prior positions below rope_pos_ids[b, 0]; a block KV cache (active_blocks_table
    [B, s_prior / block_len]) holds batch b's positions as the blocks its table row names,
    k_prior and v_prior [blocks, block_len, d]; fp8 KV takes all four KV tensors as fp8.

    With the kernel's roundings: the scores PSUM's float32 sums over d
    (trn2core.reference.gemm), the row max (with the sink; at least -FLT_MAX), score - max in
    float32, exp by trn2core's activation rule stored as P in q's dtype (bf16); the sum of P
    on the PE (a ones vector) per 128-position tile, the tiles' sums added in float32 (plus
    the sink's float32 exp), its float32 reciprocal; P v PSUM's sums over the same tiles; the
    product with the reciprocal in float32, rounded once. A tile holds positions p * n + t
    (strided_mm1, the default without a block cache; n = s_prior / 128) or t * 128 + p. With
    fuse_rope, q and k are rotated as the kernel does (_tkg_rope_coeffs, _tkg_apply_rope),
    q then times 1/sqrt(d) into bf16."""
    from trn2core.reference import activation, activation_values, gemm, reciprocal

    b, h, sa, sp, d = kw["bs"], kw["q_head"], kw["s_active"], kw["s_prior"], kw["d_head"]
    f32 = np.float32
    k_out = None
    if kw.get("fuse_rope"):
        cos, sin = _tkg_rope_coeffs(kw["rope_pos_ids"], kw["inv_freqs"].astype(f32))
        cos, sin = cos.reshape(d // 2, b, sa), sin.reshape(d // 2, b, sa)
        qr = _tkg_apply_rope(q.astype(f32).transpose(3, 0, 1, 2), cos, sin, q.dtype)
        q = activation(qr.reshape(d, -1), "copy", "bf16", scale=1 / np.sqrt(d))[0]
        k_active = _tkg_apply_rope(
            k_active.astype(f32)[:, 0].transpose(2, 0, 1)[:, :, None], cos, sin, q.dtype
        ).reshape(d, b * sa)
        k_out = np.ascontiguousarray(k_active.reshape(d, b, sa).transpose(1, 0, 2)[:, None])
    qq = q.reshape(d, b, h * sa)
    kact = k_active.reshape(d, b, sa).transpose(1, 0, 2)
    table = kw.get("active_blocks_table")
    if table is not None:  # the blocks of each batch in its table's order
        keys = k_prior[table.astype(np.int64)].reshape(b, sp, d).transpose(0, 2, 1)
        vals = v_prior[table.astype(np.int64)].reshape(b, sp, d)
    else:
        kp = k_prior[:b, 0]
        keys = (kp.transpose(0, 2, 1) if kw.get("tp_k_prior") else kp)[:, :, :sp]
        vals = v_prior[:b, 0, :sp]
    keys, vals = keys.copy(), vals.copy()
    keys[:, :, sp - sa :] = kact
    vals[:, sp - sa :] = v_active[:, 0]
    if kw.get("use_pos_id"):  # prior positions below the first active token's position
        seen = np.arange(sp)[:, None] < kw["rope_pos_ids"][:, 0][None, :]
        full = np.broadcast_to(seen[:, :, None, None], (sp, b, h, sa)).copy()
        full[sp - sa :] = mask != 0
        mask = full
    keep = (mask != 0).transpose(1, 0, 2, 3).reshape(b, sp, h * sa)
    n = -(-sp // 128)
    grid = np.arange(n * 128)
    strided = kw.get("strided_mm1", True) and table is None
    tiles = grid.reshape(128, n).T if strided else grid.reshape(n, 128)  # [tile, partition]
    out = np.zeros((b, h, d, sa), q.dtype)
    for i in range(b):
        sc = np.where(keep[i], gemm(keys[i].T, qq[:, i]), -np.inf).astype(f32)  # [sp, H*S]
        m = sc.max(axis=0)
        if sink is not None:
            sk = np.repeat(sink.astype(f32).reshape(h), sa)
            m = np.maximum(m, sk)
        m = np.maximum(m, -np.finfo(f32).max)
        e = activation_values("exp", (sc - m).astype(f32)).astype(q.dtype)
        ones = np.ones((128, 1), q.dtype)
        tot = o = None
        for t in tiles:
            t = t[t < sp]
            part, pv = gemm(e[t].T, ones[: len(t)])[:, 0], gemm(vals[i][t].T, e[t])
            tot = part if tot is None else (tot + part).astype(f32)
            o = pv if o is None else (o + pv).astype(f32)
        if sink is not None:
            tot = (tot + activation_values("exp", (sk - m).astype(f32))).astype(f32)
        o = (o * reciprocal(tot, "fp32")[None, :]).astype(f32)  # [d, H*S]
        out[i] = o.reshape(d, h, sa).transpose(1, 0, 2)
    return out if k_out is None else (out, k_out)


def _attn_tkg_inputs(b, h, sa, sp, d, **opts):
    """bf16 q, keys and values of a KV cache holding each batch's first L_b positions (L_b
    below s_prior - s_active), the mask: those positions, and the active tokens causally.
    fuse_rope: q and k_active in HBM ([B, H, S, d], [B, 1, S, d]), the usual inverse
    frequencies 10000^(-2i/d), the active tokens at positions L_b + s; use_pos_id: the same
    positions and only the active tokens' mask; block_len: each batch's cache as
    s_prior / block_len blocks of a shuffled pool; fp8: the KV tensors in float8_e4m3."""

    def f(r):
        kw = {"bs": b, "q_head": h, "s_active": sa, "s_prior": sp, "d_head": d, **opts}
        kv = ml_dtypes.float8_e4m3 if opts.get("fp8") else BF16
        kw.pop("fp8", None)
        if opts.get("fuse_rope"):
            q = _f32(r, b, h, sa, d).astype(BF16)
            ka = _f32(r, b, 1, sa, d).astype(kv)
        else:
            q = _f32(r, d, b * h * sa).astype(BF16)
            ka = _f32(r, d, b * sa).astype(kv)
        va = _f32(r, b, 1, sa, d).astype(kv)
        bl = opts.get("block_len", 0)
        if bl:
            nblk = b * sp // bl
            kp, vp = _f32(r, nblk, bl, d).astype(kv), _f32(r, nblk, bl, d).astype(kv)
            kw["active_blocks_table"] = r.permutation(nblk).reshape(b, sp // bl).astype(np.uint32)
        else:
            kshape = (b, 1, sp, d) if opts.get("tp_k_prior") else (b, 1, d, sp)
            kp, vp = _f32(r, *kshape).astype(kv), _f32(r, b, 1, sp, d).astype(kv)
        lens = r.integers(1, sp - sa, size=b)
        if opts.get("fuse_rope") or opts.get("use_pos_id"):
            kw["rope_pos_ids"] = (lens[:, None] + np.arange(sa)[None, :]).astype(np.float32)
        if opts.get("fuse_rope"):
            kw["inv_freqs"] = (10000.0 ** (-np.arange(d // 2) * 2.0 / d)).astype(np.float32)
            kw["inv_freqs"] = kw["inv_freqs"].reshape(d // 2, 1)
        causal = np.tril(np.ones((sa, sa), np.uint8))[:, None, None, :]
        if opts.get("use_pos_id"):
            mask = np.ascontiguousarray(np.broadcast_to(causal, (sa, b, h, sa)))
        else:
            mask = np.zeros((sp, b, h, sa), np.uint8)
            for i in range(b):
                mask[: lens[i], i] = 1
            mask[sp - sa :] = causal
        if opts.get("sink"):
            kw["sink"] = _f32(r, h, 1).astype(BF16)
        return (q, ka, va, kp, vp, mask), kw

    return f


def _attn_tkg_wrapper(sub):
    """Our kernel around nki-library's attention_tkg (a sub-kernel: no @nki.jit): its config
    from the shapes, q and k_active copied to SBUF first (the kernel requires them there when
    RoPE is not fused; with fuse_rope it reads them from HBM), an SBUF manager of the whole
    usable SBUF less 16 KiB, the output [B, H, d, s_active] in HBM (and with fuse_rope the
    rotated k_active [B, 1, d, s_active])."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    cfg_cls = _lib_attr("nkilib.core.attention.attention_tkg_utils", "AttnTKGConfig")
    sbm_cls = _lib_attr("nkilib.core.utils.allocator", "SbufManager")
    logger = _lib_attr("nkilib.core.utils.logging", "Logger")

    @nki.jit
    def wrapped(q, k_active, v_active, k_prior, v_prior, mask, sink=None, **kw):
        b, h, sa, sp, d = kw["bs"], kw["q_head"], kw["s_active"], kw["s_prior"], kw["d_head"]
        names = ("tp_k_prior", "strided_mm1", "use_pos_id", "fuse_rope")
        flags = {k: kw[k] for k in names if k in kw}
        rope = kw.get("fuse_rope", False)
        cfg = cfg_cls(b, h, sa, sp, sp, d, kw.get("block_len", 0), qk_in_sb=not rope, **flags)
        sbm = sbm_cls(0, nl.tile_size.total_available_sbuf_size - 16 * 1024, logger("attn"))
        sbm.open_scope()
        out = nl.ndarray((b, h, d, sa), dtype=q.dtype, buffer=nl.shared_hbm)
        k_out = None
        if rope:
            k_out = nl.ndarray((b, 1, d, sa), dtype=q.dtype, buffer=nl.shared_hbm)
        else:
            q_sb = sbm.alloc_stack(q.shape, dtype=q.dtype, buffer=nl.sbuf)
            k_sb = sbm.alloc_stack(k_active.shape, dtype=k_active.dtype, buffer=nl.sbuf)
            nisa.dma_copy(q_sb, q)
            nisa.dma_copy(k_sb, k_active)
            q, k_active = q_sb, k_sb
        extra = ("inv_freqs", "rope_pos_ids", "active_blocks_table")
        sub(q, k_active, v_active, k_prior, v_prior, mask, out, cfg, sbm, sink=sink,
            k_out=k_out, **{k: kw[k] for k in extra if k in kw})  # fmt: skip
        sbm.close_scope()
        return (out, k_out) if rope else out

    return wrapped


def ref_router_topk(x, w, w_bias, logits, affinities, index, act_fn, k, **kw):
    """nki-library's MoE router (its docstring): logits = x @ w + bias [T, E] (x [H, T], or
    [T, H] with x_hbm_layout 1); with router_pre_norm the activation (softmax over E, or
    sigmoid) comes first and the top k of the affinities are kept, else the top k logits and
    then the activation over those k; norm_topk_prob divides them by their sum. Outputs: the
    logits, the k expert indices of each token (largest first) and the affinities scattered
    into [T, E] (zero elsewhere)."""
    f = np.float64
    xt = x.astype(f) if kw.get("x_hbm_layout") == 1 else x.astype(f).T
    lg = xt @ w.astype(f)
    if w_bias is not None:
        lg = lg + w_bias.astype(f).reshape(1, -1)

    def act(v):
        if act_fn.name == "SIGMOID":
            return 1.0 / (1.0 + np.exp(-v))
        e = np.exp(v - v.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    pre = kw.get("router_pre_norm", True)
    scores = act(lg) if pre else lg
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(scores, idx, axis=1)
    if not pre:
        top = act(top)
    if kw.get("norm_topk_prob"):
        top = top / top.sum(axis=1, keepdims=True)
    aff = np.zeros(lg.shape)
    np.put_along_axis(aff, idx, top, axis=1)
    return lg.astype(logits.dtype), idx.astype(index.dtype), aff.astype(affinities.dtype)


def _router_inputs(t, h, e, k, act="SOFTMAX", **opts):
    """bf16 x [H, T] (or [T, H]) whose token t is nearly the unit vector of h = t mod H, and
    weights whose rows each hold E distinct values 1/16 apart: every token's logits are
    well separated (no near-ties in its top k), and differ from token to token; a bias;
    the three outputs zeroed (the kernel writes them in place)."""

    def f(r):
        xt = np.eye(h, dtype=np.float32)[np.arange(t) % h] + _f32(r, t, h, lo=-1e-3, hi=1e-3)
        x = xt if opts.get("x_hbm_layout") == 1 else xt.T
        w = np.stack([r.permutation(e) for _ in range(h)]).astype(np.float32) / 16 - e / 32
        bias = _f32(r, 1, e, lo=-0.01, hi=0.01).astype(BF16)
        outs = (np.zeros((t, e), BF16), np.zeros((t, e), BF16), np.zeros((t, k), np.uint32))
        kw = {"act_fn": getattr(_lib_attr(TYPES, "RouterActFnType"), act), "k": k}
        kw.update({"x_hbm_layout": 0, "x_sb_layout": 0, **opts})
        return (x.astype(BF16), w.astype(BF16), bias, *outs), kw

    return f


def _router_wrapper(sub):
    """Our kernel around nki-library's router_topk (no @nki.jit; it writes the three outputs
    it is given): the zeroed outputs passed in, returned as (logits, indices, affinities)."""
    import nki

    @nki.jit
    def wrapped(x, w, w_bias, logits, affinities, index, **kw):
        sub(x, w, w_bias, logits, affinities, index, **kw)
        return logits, index, affinities

    return wrapped


def ref_moe_tkg(x, w_gate_up, w_down, affinities, index, is_all_expert, **kw):
    """nki-library's MoE token-generation MLP (its docstring): each token's output is the sum,
    over the experts (all E_L local experts, or the token's top k), of
    (silu(x @ gate_e) * (x @ up_e)) @ down_e (the product rounded to the weights' dtype, the
    down projection's operand), each scaled by the token's affinity for that expert with
    POST_SCALE (all-expert: the local expert e is global expert rank_id * E_L + e, its
    affinity zero where the token did not select it with mask_unselected_experts).

    With the kernel's roundings: the gate and up projections PSUM's float32 sums
    (trn2core.reference.gemm), silu by trn2core's activation rule times up in float32, rounded
    to bf16; the down projection's sums rounded to bf16, times the affinity (float32; in the
    all-expert form rounded to bf16 first) rounded to bf16 again; the experts' outputs added
    in bf16 in turn (the token's top k in its index order, or experts 0 to E_L - 1)."""
    from trn2core.reference import activation_values, gemm

    f32, dt = np.float32, x.dtype
    e_l = w_gate_up.shape[0]
    post = getattr(kw.get("expert_affinities_scaling_mode"), "name", "NO_SCALE") == "POST_SCALE"
    rank = int(np.asarray(kw["rank_id"]).reshape(-1)[0]) if kw.get("rank_id") is not None else 0
    out = np.zeros((x.shape[0], w_down.shape[2]), dt)
    for t in range(x.shape[0]):
        chosen = [int(e) for e in index[t]]
        acc = None
        for e in range(e_l) if is_all_expert else chosen:
            g, u = (gemm(x[t : t + 1], w_gate_up[e, :, j, :]) for j in (0, 1))
            h = (activation_values("silu", g) * u).astype(f32).astype(w_down.dtype)
            y = gemm(h, w_down[e]).astype(dt)
            if post:
                glob = rank * e_l + e if is_all_expert else e
                keep = glob in chosen or not kw.get("mask_unselected_experts")
                a = f32(affinities[t, glob] if keep else 0.0)
                if is_all_expert:  # the affinities rounded to bf16 first (all_expert_impl)
                    a = f32(a.astype(dt))
                y = (y.astype(f32) * a).astype(dt)
            acc = y if acc is None else (acc.astype(f32) + y.astype(f32)).astype(dt)
        out[t] = acc[0]
    return out


def ref_moe_block_tkg(inp, gamma, w_router, w_gate_up, w_down, **kw):
    """nki-library's MoE block for token generation (its docstring's pseudocode): RMSNorm of
    the tokens [T, H] with gamma (rounded to their dtype), the router on it (ref_router_topk:
    logits, each token's top k experts and their affinities) and the experts' MLP on it
    (ref_moe_tkg, the affinities scattered into [T, E]); returns the output [T, H] and the
    logits [T, E]."""
    x = inp.reshape(-1, inp.shape[-1])
    normed = _rmsnorm_tkg_rows(x, gamma, kw.get("eps", 1e-6))  # its instructions' roundings
    t, e = normed.shape[0], w_router.shape[1]
    k, act = kw["top_k"], kw["router_act_fn"]
    outs = (np.zeros((t, e), inp.dtype), np.zeros((t, e), np.float32), np.zeros((t, k), np.int64))
    flags = {n: kw[n] for n in ("router_pre_norm", "norm_topk_prob") if n in kw}
    lg, idx, aff = ref_router_topk(normed, w_router, None, *outs, act, k, x_hbm_layout=1, **flags)
    mask = kw.get("router_pre_norm", True) and not kw.get("norm_topk_prob")
    scale = kw.get("expert_affinities_scaling_mode")
    out = ref_moe_tkg(normed, w_gate_up, w_down, aff, idx, kw.get("is_all_expert", False),
                      expert_affinities_scaling_mode=scale, rank_id=kw.get("rank_id"),
                      mask_unselected_experts=mask)  # fmt: skip
    return out, lg


def _moe_block_inputs(t, h, i, e, k, **opts):
    """bf16 tokens [1, T, H] each nearly the unit vector of h = t mod H (as the router's
    cases: after RMSNorm, with gamma 1/16, its logits are row h of the router weights, values
    1/16 apart, so the top k has no near-ties), the router's weights, gate/up [E, H, 2, I] and
    down [E, I, H] weights scaled so a product stays near 1; softmax, POST_SCALE."""

    def f(r):
        xt = np.eye(h, dtype=np.float32)[np.arange(t) % h] + _f32(r, t, h, lo=-1e-3, hi=1e-3)
        gamma = np.full((1, h), 1.0 / 16, np.float32).astype(BF16)
        w = np.stack([r.permutation(e) for _ in range(h)]).astype(np.float32) / 16 - e / 32
        wgu = (_f32(r, e, h, 2, i) * 4).astype(BF16)
        wd = (_f32(r, e, i, h) / np.sqrt(i)).astype(BF16)
        kw = {
            "top_k": k,
            "router_act_fn": _lib_attr(TYPES, "RouterActFnType").SOFTMAX,
            "expert_affinities_scaling_mode": _lib_attr(
                TYPES, "ExpertAffinityScaleMode"
            ).POST_SCALE,
        }
        for key, value in opts.items():
            kw[key] = np.zeros((1, 1), np.uint32) if key == "rank_id" else value
        return (xt[None].astype(BF16), gamma, w.astype(BF16), wgu, wd), kw

    return f


def _moe_tkg_inputs(t, h, i, e, k, is_all_expert, **opts):
    """bf16 hidden states [T, H], gate/up weights [E, H, 2, I] and down weights [E, I, H]
    (scaled so a product stays near 1), affinities [T, E] (float32 for the selective form, as
    nki-library's tests have them; bf16 for all-expert), each token's k distinct experts
    (int32), and for all-expert with scaling the rank [1, 1] (uint32, 0: every expert)."""

    def f(r):
        x = _f32(r, t, h).astype(BF16)
        wgu = (_f32(r, e, h, 2, i) / np.sqrt(h)).astype(BF16)
        wd = (_f32(r, e, i, h) / np.sqrt(i)).astype(BF16)
        aff = r.uniform(0.1, 1.0, (t, e)).astype(BF16 if is_all_expert else np.float32)
        idx = np.stack([r.permutation(e)[:k] for _ in range(t)]).astype(np.int32)
        kw = {"is_all_expert": is_all_expert}
        for key, value in opts.items():
            if key == "scale":
                mode = _lib_attr(TYPES, "ExpertAffinityScaleMode")
                kw["expert_affinities_scaling_mode"] = getattr(mode, value)
                if is_all_expert:
                    kw["rank_id"] = np.zeros((1, 1), np.uint32)
            else:
                kw[key] = value
        return (x, wgu, wd, aff, idx), kw

    return f


def _moe_tkg_wrapper(sub):
    """Our kernel around nki-library's moe_tkg (no @nki.jit; it allocates and returns its
    output [T, H] in HBM). The selective form gets its affinities in SBUF, as nki-library's
    tests pass them (from HBM it gathers over all 128 partitions of a tile it wrote only T
    of: a read of unwritten SBUF unless run with uninitialized="nan")."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def wrapped(x, w_gate_up, w_down, affinities, index, **kw):
        if not kw["is_all_expert"]:
            aff = nl.ndarray(affinities.shape, dtype=affinities.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=aff, src=affinities)
            affinities = aff
        return sub(x, w_gate_up, w_down, affinities, index, **kw)

    return wrapped


def ref_moe_cte(
    x, affinities, w_gate_up, w_down, token_position_to_id, block_to_expert, block_size, spec,
    lnc=2, **kw,
):  # fmt: skip
    """nki-library's blockwise MoE context encoding (its docstring's pseudocode): the output
    [T+1, H] starts at zero; each block of ``block_size`` token positions runs its expert's MLP
    on the tokens it lists, (silu(x @ gate_e) * (x @ up_e)) @ down_e (the product rounded to
    the compute dtype, bf16, the down projection's operand), scales each token's row by its
    affinity for that expert (POST_SCALE: ``affinities[t * E + e]``) and adds it into the
    token's output row (accumulating over a token's blocks, top k > 1; the sum rounded to the
    output's dtype after each block). The hybrid form runs its first N - E blocks, then
    block n while ``conditions[n]`` is 1 (its docstring's pseudocode). The dropping form
    (block n is expert n's) also returns each block's gate and up projections, transposed,
    and its down projection before the affinity (its docstring's three outputs).

    The shard-on-block form returns [T+1, 2, H], a row per shard (its docstring): each core
    accumulates its blocks into its own, then (LNC=2) core 0 adds the second into the first
    and zeroes the second; rows it never writes are NaN here (the case runs with new memory
    NaN): the padding row T (its zeroing skips a last tile of one row) and, at LNC=1, the
    second shard's rows."""
    conditions = kw.get("conditions")
    if conditions is not None:  # hybrid: N - E static blocks, then while conditions[n] == 1
        n = len(block_to_expert) - w_gate_up.shape[0]
        while n < len(block_to_expert) and conditions[n] == 1:
            n += 1
        block_to_expert = block_to_expert[:n]
    on_i = spec.implementation.name != "shard_on_block"
    out, gup_t, down = _moe_cte_sum(x, affinities, w_gate_up, w_down, token_position_to_id,
                                    block_to_expert, block_size, lnc, on_i)  # fmt: skip
    if spec.implementation.name == "shard_on_i_dropping":
        return out, gup_t, down
    if spec.implementation.name != "shard_on_block":
        return out
    two = np.zeros((out.shape[0], 2, out.shape[1]), out.dtype)
    two[:, 0] = out
    nan = np.frombuffer(b"\xff" * two.itemsize, two.dtype)[0]  # new memory: 0xFF bytes
    two[-1] = nan
    if lnc == 1:
        two[:, 1] = nan
    return two


def _moe_cte_sum(x, affinities, w_gate_up, w_down, token_position_to_id, block_to_expert, b,
                 shards=1, on_i=False):  # fmt: skip
    """The output, and per block its gate and up projections transposed [N, 2, I, B] and its
    down projection before the affinity [N, B, H] (in the weights' dtype), with moe_cte's
    roundings: gate and up PSUM's float32 sums over H (trn2core.reference.gemm), silu by
    trn2core's activation rule rounded to bf16, times up rounded to bf16; the down
    projection's float32 sums over I; each token's row times its (bf16) affinity in float32
    plus its output row, rounded to bf16 (scalar_tensor_tensor). on_i (shard on I): each of
    the ``shards`` cores sums its share of I, rounded to bf16, and the shares are added in
    bf16 (sendrecv) before the affinity. Else (shard on block) core k accumulates blocks k,
    k + shards, ... into an output of its own, and the cores' outputs are added in bf16."""
    from trn2core.reference import activation_values, gemm

    f32, dt = np.float32, x.dtype
    e_count, i_len = w_gate_up.shape[0], w_gate_up.shape[-1]
    aff = affinities.reshape(-1).astype(f32)
    outs = [np.zeros(x.shape, dt) for _ in range(1 if on_i else shards)]
    gup_t, down = [], []
    for blk, (e,) in enumerate(np.asarray(block_to_expert)):
        toks = np.asarray(token_position_to_id[blk * b : (blk + 1) * b])
        g, u = (gemm(x[toks], w_gate_up[e, :, j, :]) for j in (0, 1))
        gup_t.append(np.stack([g.T, u.T]))
        h = activation_values("silu", g).astype(dt).astype(f32)
        h = (h * u).astype(f32).astype(w_down.dtype)
        if on_i:
            share = i_len // shards
            y = None
            for c in range(shards):
                cut = slice(c * share, (c + 1) * share)
                part = gemm(h[:, cut], w_down[e, cut]).astype(dt).astype(f32)
                y = part if y is None else (y + part).astype(dt).astype(f32)
        else:
            y = gemm(h, w_down[e])
        down.append(y.copy())
        out = outs[0 if on_i else blk % shards]
        out[toks] = ((y * aff[toks * e_count + e][:, None]).astype(f32) + out[toks]).astype(dt)
    out = outs[0]
    for other in outs[1:]:
        out = (out.astype(f32) + other.astype(f32)).astype(dt)
    return out, np.array(gup_t).astype(w_gate_up.dtype), np.array(down).astype(w_down.dtype)


def _moe_cte_inputs(t, h, i, e, b, form="shard_on_i", **spec_kw):
    """bf16 hidden states [T+1, H] (row T the padding token), gate/up weights [E, H, 2, I]
    and down weights [E, I, H] (scaled so a product stays near 1), the masked affinities
    [(T+1)*E, 1] (bf16) and top k = E: every token in one block of each expert (T = B, so no
    padding position), its order in each block shuffled (int32 positions; block e is expert
    e's); post-scaled, in the ``form`` of MoECTEImplementation named (its spec's other
    fields ``spec_kw``)."""

    def f(r):
        x = _f32(r, t + 1, h).astype(BF16)
        wgu = (_f32(r, e, h, 2, i) / np.sqrt(h)).astype(BF16)
        wd = (_f32(r, e, i, h) / np.sqrt(i)).astype(BF16)
        aff = r.uniform(0.1, 1.0, ((t + 1) * e, 1)).astype(BF16)
        pos = np.concatenate([r.permutation(t) for _ in range(e)]).astype(np.int32)
        blocks = np.arange(e, dtype=np.int32).reshape(e, 1)
        mod = "nkilib.core.moe.moe_cte.moe_cte"
        impl = getattr(_lib_attr(mod, "MoECTEImplementation"), form)
        spec = _lib_attr(mod, "MoECTESpec")(impl, **spec_kw)
        if form != "shard_on_i_hybrid":
            return (x, aff, wgu, wd, pos, blocks, b, spec), {}
        # One more block, of padding positions only (token T), expert 0's: its condition 0
        # ends the hybrid form's dynamic loop before it (conditions [N+1], the last 0).
        pos = np.concatenate([pos, np.full(b, t, np.int32)])
        blocks = np.concatenate([blocks, np.zeros((1, 1), np.int32)])
        conditions = np.array([1] * e + [0, 0], np.int32)
        return (x, aff, wgu, wd, pos, blocks, b, spec), {"conditions": conditions}

    return f


# nki-library's experimental transformer blocks (attention_block_tkg): references composed
# from the ones above.
def _rms_rows(x, eps, w=None):
    """RMS norm over axis 0 (d_head) in float64, times w [1, d]; rounded to x's dtype."""
    f = x.astype(np.float64)
    y = f / np.sqrt((f * f).mean(axis=0, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(np.float64).reshape(-1, *([1] * (x.ndim - 1)))
    return y.astype(x.dtype)


def ref_attention_block_tkg(lnc=1, **kw):
    """nki-library's attention_block_tkg (its docstring's pseudocode): RMS norm of X and the
    QKV projection (ref_qkv), the q heads and the k head as [d, B, heads, S]; the optional RMS
    norms over d before and after RoPE (ref_rope, cos and sin [d/2, B, S]); q times the
    softmax scale (1/sqrt(d) by default) in bf16; attention over the KV cache and the active
    tokens (ref_attention_tkg); the output projection (ref_out_proj_tkg) or, without W_out,
    the attention [B, H, d, S]. Also returned: the KV caches with each batch's S new k and v
    rows written at its kv_cache_update_idx position (update_cache), else the new k
    [d, B, S] and v [B, 1, S, d]."""
    x, w_qkv, v_cache, k_cache = kw["X"], kw["W_qkv"], kw["V_cache"], kw["K_cache"]
    b, s, _ = x.shape
    d = v_cache.shape[-1]
    nq = w_qkv.shape[1] // d - 2
    norm = _lib_attr(TYPES, "NormType")
    qkv = ref_qkv(
        x,
        w_qkv,
        bias=kw["bias_qkv"],
        fused_norm_type=norm.RMS_NORM if kw["rmsnorm_X_enabled"] else norm.NO_NORM,
        gamma_norm_weights=kw["rmsnorm_X_gamma"],
        norm_eps=kw["rmsnorm_X_eps"],
        quantization_type=kw["quantization_type_qkv"],
        qkv_w_scale=kw["weight_dequant_scale_qkv"],
        qkv_in_scale=kw["input_dequant_scale_qkv"],
        num_q_heads=nq,
        num_kv_heads=1,
        d_head=d,
        lnc=lnc,
    )
    heads = qkv.reshape(b, s, nq + 2, d).transpose(3, 0, 2, 1)  # [d, B, heads, S]
    q, k = heads[:, :, :nq], heads[:, :, nq : nq + 1]
    v = np.ascontiguousarray(heads[:, :, nq + 1 :].transpose(1, 2, 3, 0))  # [B, 1, S, d]
    for stage in ("pre", "post"):
        if stage == "post" and kw["cos"] is not None:
            contiguous = kw["rope_contiguous_layout"]
            q, k = (ref_rope(t, kw["cos"], kw["sin"], contiguous) for t in (q, k))
        if kw[f"rmsnorm_QK_{stage}_rope_enabled"]:
            eps = kw[f"rmsnorm_QK_{stage}_rope_eps"]
            q = _rms_rows(q, eps, kw[f"rmsnorm_QK_{stage}_rope_W_Q"])
            k = _rms_rows(k, eps, kw[f"rmsnorm_QK_{stage}_rope_W_K"])
    scale = kw.get("softmax_scale") or d**-0.5
    q = (q.astype(np.float32) * np.float32(scale)).astype(x.dtype)
    if kw.get("k_scale") is not None:  # fp8 KV: the new k and v times their scale, clipped
        fp8 = ml_dtypes.float8_e4m3
        k, v = (
            np.clip(t.astype(np.float32) * kw[n][0, 0], -240.0, 240.0).astype(fp8)
            for t, n in ((k, "k_scale"), (v, "v_scale"))
        )
    s_ctx = kw["attention_mask"].shape[0]
    table = kw["active_blocks_table"]
    blocks = {} if table is None else {"active_blocks_table": table}
    attn = ref_attention_tkg(
        q.reshape(d, b * nq * s),
        k.reshape(d, b * s),
        v,
        k_cache,
        v_cache,
        kw["attention_mask"],
        kw["sink"],
        bs=b,
        q_head=nq,
        s_active=s,
        s_prior=s_ctx,
        d_head=d,
        tp_k_prior=not kw["K_cache_transposed"],
        **blocks,
    )  # [B, H, d, S]
    if kw["W_out"] is None and kw["out_in_sb"]:  # the SBUF layout [d, B * H * S]
        out = np.ascontiguousarray(attn.transpose(2, 0, 1, 3)).reshape(d, -1)
    elif kw["W_out"] is not None:
        scales = {"weight_scale": kw["weight_dequant_scale_out"]}
        scales["input_scale"] = kw["input_dequant_scale_out"]
        out = ref_out_proj_tkg(
            attn.transpose(2, 0, 1, 3), kw["W_out"], kw["bias_out"], lnc=lnc, **scales
        )
    else:
        out = attn
    if not kw["update_cache"]:
        return out, np.ascontiguousarray(k[:, :, 0]), v
    k_new, v_new = k_cache.copy(), v_cache.copy()
    if table is not None:  # a slot (block * block_len + offset) per batch; uint32 max: none
        for i, slot in enumerate(kw["kv_cache_update_idx"][:, 0].astype(np.int64)):
            if slot < k_new.shape[0] * k_new.shape[1]:
                k_new.reshape(-1, d)[slot], v_new.reshape(-1, d)[slot] = k[:, i, 0, 0], v[i, 0, 0]
        return out, k_new, v_new
    for i, pos in enumerate(kw["kv_cache_update_idx"][:, 0].astype(np.int64)):
        v_new[i, 0, pos : pos + s] = v[i, 0]
        if kw["K_cache_transposed"]:
            k_new[i, 0, :, pos : pos + s] = k[:, i, 0]
        else:
            k_new[i, 0, pos : pos + s] = k[:, i, 0].T
    return out, k_new, v_new


def _sbuf_out_wrapper(sub):
    """Our kernel around a kernel whose first output is in SBUF (out_in_sb): that output
    copied to HBM by physical core 0, the others returned as they are."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def wrapped(*args, **kw):
        first, *rest = sub(*args, **kw)
        out = nl.ndarray(first.shape, dtype=first.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.dma_copy(dst=out, src=first)
        return (out, *rest)

    return wrapped


def _sbuf_in_wrapper(sub):
    """Our kernel around attention_block_tkg given X in SBUF: X [B, S, H] loaded as its
    docstring lays it out, [128, B*S, H/128] with each partition's H/128 values taken
    H/128/LNC from each of the LNC chunks of H."""
    import nki
    import nki.isa as nisa
    import nki.language as nl

    @nki.jit
    def wrapped(*args, X, **kw):  # noqa: N803 - the kernel's keyword
        b, s, h = X.shape
        lnc = nl.num_programs(0)
        h1 = h // 128
        x_sb = nl.ndarray((128, b * s, h1), dtype=X.dtype, buffer=nl.sbuf)
        src = X.ap([[h1 // lnc, 128], [h, b * s], [128 * (h1 // lnc), lnc], [1, h1 // lnc]], 0)
        nisa.dma_copy(dst=x_sb.reshape((128, b * s, lnc, h1 // lnc)), src=src)
        return sub(*args, X=x_sb, **kw)

    return wrapped


def _attn_block_inputs(b, s, h, nq, d, s_ctx, **opts):
    """bf16 X [B, S, H], RMS norm gamma, QKV weights [H, d (nq + 2)] with a bias, RoPE's cos
    and sin [d/2, B, S] (the contiguous layout), a flat KV cache [B, 1, S_ctx, d] (K as
    [B, 1, d, S_ctx] with K_cache_transposed) of which batch b has seen its first L_b
    positions, the mask (those positions and the active tokens causally, as _attn_tkg_inputs),
    the new tokens written at position L_b (update_cache), and the output projection
    [nq d, H] with a bias. ``opts`` sets the kernel's other arguments."""

    def f(r):
        quant = _lib_attr(TYPES, "QuantizationType")
        kt = opts.get("K_cache_transposed", False)
        kshape = (b, 1, d, s_ctx) if kt else (b, 1, s_ctx, d)
        lens = r.integers(1, s_ctx - s, size=b)
        mask = np.zeros((s_ctx, b, nq, s), np.uint8)
        for i in range(b):
            mask[: lens[i], i] = 1
        mask[s_ctx - s :] = np.tril(np.ones((s, s), np.uint8))[:, None, None, :]
        ang = r.uniform(0.0, 6.0, (d // 2, b, s))
        i_qkv = d * (nq + 2)
        kw = {
            "X": _f32(r, b, s, h).astype(BF16),
            "X_hidden_dim_actual": None,
            "rmsnorm_X_enabled": True,
            "rmsnorm_X_eps": 1e-6,
            "rmsnorm_X_gamma": _f32(r, 1, h, lo=0.5, hi=1.5).astype(BF16),
            "W_qkv": (_f32(r, h, i_qkv) / np.sqrt(h)).astype(BF16),
            "bias_qkv": _f32(r, 1, i_qkv, lo=-0.1, hi=0.1).astype(BF16),
            "quantization_type_qkv": quant.NONE,
            "weight_dequant_scale_qkv": None,
            "input_dequant_scale_qkv": None,
            "rmsnorm_QK_pre_rope_enabled": False,
            "rmsnorm_QK_pre_rope_eps": 1e-6,
            "rmsnorm_QK_pre_rope_W_Q": None,
            "rmsnorm_QK_pre_rope_W_K": None,
            "cos": np.cos(ang).astype(BF16),
            "sin": np.sin(ang).astype(BF16),
            "rope_contiguous_layout": True,
            "rmsnorm_QK_post_rope_enabled": False,
            "rmsnorm_QK_post_rope_eps": 1e-6,
            "rmsnorm_QK_post_rope_W_Q": None,
            "rmsnorm_QK_post_rope_W_K": None,
            "K_cache_transposed": kt,
            "active_blocks_table": None,
            "K_cache": _f32(r, *kshape).astype(BF16),
            "V_cache": _f32(r, b, 1, s_ctx, d).astype(BF16),
            "attention_mask": mask,
            "sink": None,
            "update_cache": True,
            "kv_cache_update_idx": lens.reshape(b, 1).astype(np.uint32),
            "W_out": (_f32(r, nq * d, h) / np.sqrt(nq * d)).astype(BF16),
            "bias_out": _f32(r, 1, h, lo=-0.1, hi=0.1).astype(BF16),
            "quantization_type_out": quant.NONE,
            "weight_dequant_scale_out": None,
            "input_dequant_scale_out": None,
            "transposed_out": False,
            "out_in_sb": False,
        }
        o = dict(opts)
        o.pop("x_in_sb", None)
        if o.pop("sink", False):
            kw["sink"] = _f32(r, nq, 1).astype(BF16)
        if o.pop("static_fp8", False):  # fp8 weights; q/k/v and output weight scales, the
            # inputs' scales (products near 1)
            fp8 = ml_dtypes.float8_e4m3
            kw["quantization_type_qkv"] = kw["quantization_type_out"] = quant.STATIC
            kw["W_qkv"] = (_f32(r, h, i_qkv, lo=-200.0, hi=200.0) / np.sqrt(h)).astype(fp8)
            ws = np.repeat(r.uniform(0.01, 0.02, (1, 3)), 128, 0).astype(np.float32)
            kw["weight_dequant_scale_qkv"] = ws
            kw["input_dequant_scale_qkv"] = np.full((128, 1), 0.04, np.float32)
            w_out = _f32(r, nq * d, h, lo=-200.0, hi=200.0) / np.sqrt(nq * d)
            kw["W_out"] = w_out.astype(fp8)
            kw["weight_dequant_scale_out"] = np.full((128, 1), r.uniform(0.01, 0.02), np.float32)
            kw["input_dequant_scale_out"] = np.full((128, 1), 0.01, np.float32)
        bl = o.pop("block_len", 0)
        if bl:  # a shuffled pool of blocks; each batch sees its whole cache (S = 1: the
            # mask is all ones, the same in any order of the positions); the last batch's
            # slot uint32 max (no update)
            nblk = b * s_ctx // bl
            kw["K_cache"], kw["V_cache"] = (_f32(r, nblk, bl, d).astype(BF16) for _ in "KV")
            table = r.permutation(nblk).reshape(b, s_ctx // bl).astype(np.uint32)
            kw["active_blocks_table"] = table
            kw["attention_mask"] = np.ones((s_ctx, b, nq, s), np.uint8)
            slots = table[np.arange(b), lens // bl] * bl + lens % bl
            slots[-1] = np.iinfo(np.uint32).max
            kw["kv_cache_update_idx"] = slots.reshape(b, 1).astype(np.uint32)
        kv_scale = o.pop("kv_scale", None)
        if kv_scale is not None:  # fp8 caches; k's scale [1, 1], v's [128, 1]
            fp8 = ml_dtypes.float8_e4m3
            for n in ("K_cache", "V_cache"):
                kw[n] = (kw[n].astype(np.float32) * kv_scale).astype(fp8)
            kw["k_scale"] = np.full((1, 1), kv_scale, np.float32)
            kw["v_scale"] = np.full((128, 1), kv_scale, np.float32)
        for stage in ("pre", "post"):
            if o.pop(f"qk_norm_{stage}", False):
                kw[f"rmsnorm_QK_{stage}_rope_enabled"] = True
                for t in "QK":
                    gamma = _f32(r, 1, d, lo=0.5, hi=1.5).astype(BF16)
                    kw[f"rmsnorm_QK_{stage}_rope_W_{t}"] = gamma
        kw.update(o)
        return (), kw

    return f


def _kvdp_inputs(b, s, h, d, s_ctx, kvdp):
    """attention_block_tkg with KV data parallelism over ``kvdp`` ranks (one q head each, the
    k and v head shared): the inputs of ``_attn_block_inputs`` (one q head) for the whole
    batch, then per rank its own q weights (and bias) and output projection, its B/KVDP
    batches of the KV cache, of the update positions and of the mask (over the KVDP q heads
    the rank attends with)."""
    import trn2core.nki as tn

    base = _attn_block_inputs(b, s, h, 1, d, s_ctx)

    def f(r):
        _, kw = base(r)
        ba = b // kvdp
        per = {n: [] for n in ("W_qkv", "bias_qkv", "W_out", "K_cache", "V_cache",
                                "attention_mask", "kv_cache_update_idx")}  # fmt: skip
        for q in range(kvdp):
            w, bias = kw["W_qkv"].copy(), kw["bias_qkv"].copy()
            if q:
                w[:, :d] = (_f32(r, h, d) / np.sqrt(h)).astype(BF16)
                bias[:, :d] = _f32(r, 1, d, lo=-0.1, hi=0.1).astype(BF16)
            per["W_qkv"].append(w)
            per["bias_qkv"].append(bias)
            per["W_out"].append(kw["W_out"] if not q else (_f32(r, d, h) / np.sqrt(d)).astype(BF16))
            rows = slice(q * ba, (q + 1) * ba)
            for n in ("K_cache", "V_cache", "kv_cache_update_idx"):
                per[n].append(np.ascontiguousarray(kw[n][rows]))
            per["attention_mask"].append(np.repeat(kw["attention_mask"][:, rows], kvdp, axis=2))
        kw.update({n: tn.PerRank(v) for n, v in per.items()})
        kw["KVDP"] = kvdp
        kw["KVDP_replica_group"] = importlib.import_module("nki.collectives").ReplicaGroup(
            [list(range(kvdp))]
        )
        return (), kw

    return f


def ref_attention_block_kvdp(lnc=1, **kw):
    """attention_block_tkg with KV data parallelism: each rank's output is the block's
    (ref_attention_block_tkg) with its own q head and output projection over the whole batch
    and the whole KV cache (the ranks' slices put together); its caches, its slice of the
    updated whole cache."""
    import trn2core.nki as tn

    kvdp = kw.pop("KVDP")
    kw.pop("KVDP_replica_group")
    per = {n: v.values for n, v in kw.items() if isinstance(v, tn.PerRank)}
    whole = {n: np.concatenate(per[n]) for n in ("K_cache", "V_cache", "kv_cache_update_idx")}
    whole["attention_mask"] = np.concatenate([m[:, :, :1] for m in per["attention_mask"]], axis=1)
    out = []
    for q in range(kvdp):
        one = {**kw, **whole, **{n: per[n][q] for n in ("W_qkv", "bias_qkv", "W_out")}}
        o, k_new, v_new = ref_attention_block_tkg(lnc=lnc, **one)
        rows = slice(q * len(per["K_cache"][q]), (q + 1) * len(per["K_cache"][q]))
        out.append((o, k_new[rows], v_new[rows]))
    return tuple(out)


def _mlp_stand_in() -> types.ModuleType:
    """nkilib.core.mlp.mlp for transformer_tkg (mlp.py does not parse upstream: an
    IndentationError at its line 203): ``mlp`` as its docstring describes it, our own: the
    MLPParameters of its arguments, the output [B, S, H] in HBM, mlp_tkg (with the caller's
    buffer manager) for B*S up to 96, else mlp_cte; the outputs as a list."""
    import nki.language as nl

    mod = types.ModuleType("nkilib.core.mlp.mlp")
    pkg = "nkilib.core.mlp"
    params_cls = _lib_attr(f"{pkg}.mlp_parameters", "MLPParameters")
    is_tkg = _lib_attr(f"{pkg}.mlp_parameters", "is_mlp_tkg")
    tkg = _lib_attr(f"{pkg}.mlp_tkg.mlp_tkg", "mlp_tkg")
    cte = _lib_attr(f"{pkg}.mlp_cte.mlp_cte", "mlp_cte")

    def mlp(hidden_tensor, gate_proj_weights_tensor, up_proj_weights_tensor,
            down_proj_weights_tensor, sbm=None, **kw):  # fmt: skip
        p = params_cls(
            hidden_tensor, gate_proj_weights_tensor, up_proj_weights_tensor,
            down_proj_weights_tensor, **kw
        )  # fmt: skip
        shape = (p.batch_size, p.sequence_len, p.hidden_size)
        out = nl.ndarray(shape, dtype=p.output_dtype, buffer=nl.shared_hbm)
        if is_tkg(p):
            return tkg(p, out, None, sbm=sbm)
        cte(p, out, None)
        return [out]

    mod.mlp = mlp
    return mod


def _transformer_wrapper(sub, ranks=None):
    """Our kernel around nki-library's transformer_tkg (not @nki.jit; it takes lists of
    per-layer tensors): layer i's tensors are the keyword arguments named ``<list>_<i>``;
    ``ranks``: tensor-parallel over that many ranks (``replica_groups``: one group of all,
    its all-reduces after the attention block and the MLP)."""
    import nki

    groups = {} if ranks is None else {"replica_groups": [list(range(ranks))]}

    names = ("W_qkvs", "W_outs", "W_gates", "W_ups", "W_downs", "W_gamma_qkvs", "W_gamma_mlps",
             "K_caches", "V_caches")  # fmt: skip

    @nki.jit
    def wrapped(X, RoPE_cos, RoPE_sin, mask_cache, position_ids, num_layers, eps, **w):  # noqa: N803
        lists = {n: [w[f"{n}_{i}"] for i in range(num_layers)] for n in names}
        rope = {"RoPE_cos": RoPE_cos, "RoPE_sin": RoPE_sin}
        return sub(X, **lists, **rope, mask_cache=mask_cache, mask_active=None,
                   position_ids=position_ids, num_layers=num_layers, eps=eps,
                   **groups)  # fmt: skip

    return wrapped


def ref_transformer_tkg(  # noqa: N803 - the kernel's keywords
    X, RoPE_cos, RoPE_sin, mask_cache, position_ids, num_layers, eps, lnc=1, **w
):
    """nki-library's transformer_tkg (its docstring, one tensor-parallel rank): per layer the
    attention block (RMS norm, QKV, RoPE, attention over the K-transposed cache, its update at
    position_ids, output projection: ref_attention_block_tkg) added to the hidden states, then
    the RMS-normed SiLU MLP (ref_mlp) added; each sum in the hidden states' dtype."""
    b, s, h = X.shape
    none = _lib_attr(TYPES, "QuantizationType").NONE
    cur = X
    for i in range(num_layers):
        kw = {
            "X": cur, "rmsnorm_X_enabled": True, "rmsnorm_X_eps": eps,
            "rmsnorm_X_gamma": w[f"W_gamma_qkvs_{i}"], "W_qkv": w[f"W_qkvs_{i}"],
            "bias_qkv": None, "quantization_type_qkv": none, "weight_dequant_scale_qkv": None,
            "input_dequant_scale_qkv": None, "rmsnorm_QK_pre_rope_enabled": False,
            "rmsnorm_QK_post_rope_enabled": False, "cos": RoPE_cos, "sin": RoPE_sin,
            "rope_contiguous_layout": True, "K_cache_transposed": True,
            "active_blocks_table": None, "K_cache": w[f"K_caches_{i}"],
            "V_cache": w[f"V_caches_{i}"], "attention_mask": mask_cache, "sink": None,
            "update_cache": True, "kv_cache_update_idx": position_ids,
            "W_out": w[f"W_outs_{i}"], "bias_out": None, "quantization_type_out": none,
            "weight_dequant_scale_out": None, "input_dequant_scale_out": None,
        }  # fmt: skip
        attn = ref_attention_block_tkg(lnc=lnc, **kw)[0].reshape(b, s, h)
        cur = (cur.astype(np.float32) + attn.astype(np.float32)).astype(X.dtype)
        mlp = ref_mlp(
            cur, w[f"W_gates_{i}"], w[f"W_ups_{i}"], w[f"W_downs_{i}"],
            normalization_weights_tensor=w[f"W_gamma_mlps_{i}"],
            normalization_type=_lib_attr(TYPES, "NormType").RMS_NORM, eps=eps,
        )  # fmt: skip
        cur = (cur.astype(np.float32) + mlp.astype(np.float32)).astype(X.dtype)
    return cur


def _transformer_inputs(layers, b, h, nq, d, s_ctx, i_mlp):
    """bf16 hidden states [B, 1, H] and per layer: the attention block's tensors as
    _attn_block_inputs makes them (K cache [B, 1, d, S_ctx], no biases; the cache seen up to
    L_b, the new token written at L_b), RMS norm gammas, the MLP's weights [H, I], [H, I],
    [I, H]."""

    def f(r):
        blocks = [
            _attn_block_inputs(b, 1, h, nq, d, s_ctx, K_cache_transposed=True)(r)[1]
            for _ in range(layers)
        ]
        kw = {"RoPE_cos": blocks[0]["cos"], "RoPE_sin": blocks[0]["sin"]}
        kw["mask_cache"] = blocks[0]["attention_mask"]
        kw["position_ids"] = blocks[0]["kv_cache_update_idx"]
        kw.update(num_layers=layers, eps=1e-6)
        for i, blk in enumerate(blocks):
            kw[f"W_qkvs_{i}"], kw[f"W_outs_{i}"] = blk["W_qkv"], blk["W_out"]
            kw[f"W_gamma_qkvs_{i}"] = blk["rmsnorm_X_gamma"]
            kw[f"K_caches_{i}"], kw[f"V_caches_{i}"] = blk["K_cache"], blk["V_cache"]
            kw[f"W_gamma_mlps_{i}"] = _f32(r, 1, h, lo=0.5, hi=1.5).astype(BF16)
            for n, (m, k) in (("gates", (h, i_mlp)), ("ups", (h, i_mlp)), ("downs", (i_mlp, h))):
                kw[f"W_{n}_{i}"] = (_f32(r, m, k) / np.sqrt(m)).astype(BF16)
        return (blocks[0]["X"],), kw

    return f


def _transformer_tp_inputs(ranks, layers, b, h, nq, d, s_ctx, i_mlp):
    """transformer_tkg tensor-parallel over ``ranks``: the hidden states, RoPE tables, mask,
    positions and RMS norm gammas of _transformer_inputs, the same on every rank; each rank
    its own attention weights (its nq q heads and one k/v head: W_qkv, W_out), K and V caches
    and MLP shard (W_gate, W_up [H, I], W_down [I, H]), as PerRank arguments."""
    import trn2core.nki as tn

    def f(r):
        per = [_transformer_inputs(layers, b, h, nq, d, s_ctx, i_mlp)(r) for _ in range(ranks)]
        (x,), kw = per[0]
        for name in kw:
            if name.startswith(("W_qkvs_", "W_outs_", "K_caches_", "V_caches_", "W_gates_",
                                "W_ups_", "W_downs_")):  # fmt: skip
                kw[name] = tn.PerRank([p[1][name] for p in per])
        return (x,), kw

    return f


def ref_transformer_tkg_tp(X, RoPE_cos, RoPE_sin, mask_cache, position_ids, num_layers, eps, **w):  # noqa: N803
    """transformer_tkg over tensor-parallel ranks (its docstring's pseudocode): per layer every
    rank's attention block (ref_attention_block_tkg, with its own weights and caches, in the
    hidden states' dtype) all-reduced (mesh_reduce: nki.collectives' order, fp32, rounded
    once) and added to the hidden states, then likewise every rank's MLP (ref_mlp); every
    rank's output is the same."""
    import trn2core.nki as tn

    ranks = next(len(v.values) for v in w.values() if isinstance(v, tn.PerRank))
    one = [{k: v.values[q] if isinstance(v, tn.PerRank) else v for k, v in w.items()}
           for q in range(ranks)]  # fmt: skip
    b, s, h = X.shape
    none = _lib_attr(TYPES, "QuantizationType").NONE
    cur = X
    for i in range(num_layers):
        attn = []
        for wq in one:
            kw = {
                "X": cur, "rmsnorm_X_enabled": True, "rmsnorm_X_eps": eps,
                "rmsnorm_X_gamma": wq[f"W_gamma_qkvs_{i}"], "W_qkv": wq[f"W_qkvs_{i}"],
                "bias_qkv": None, "quantization_type_qkv": none,
                "weight_dequant_scale_qkv": None, "input_dequant_scale_qkv": None,
                "rmsnorm_QK_pre_rope_enabled": False, "rmsnorm_QK_post_rope_enabled": False,
                "cos": RoPE_cos, "sin": RoPE_sin, "rope_contiguous_layout": True,
                "K_cache_transposed": True, "active_blocks_table": None,
                "K_cache": wq[f"K_caches_{i}"], "V_cache": wq[f"V_caches_{i}"],
                "attention_mask": mask_cache, "sink": None, "update_cache": True,
                "kv_cache_update_idx": position_ids, "W_out": wq[f"W_outs_{i}"],
                "bias_out": None, "quantization_type_out": none,
                "weight_dequant_scale_out": None, "input_dequant_scale_out": None,
            }  # fmt: skip
            attn.append(ref_attention_block_tkg(**kw)[0].reshape(b, s, h).astype(X.dtype))
        cur = (cur.astype(np.float32) + mesh_reduce(attn).astype(np.float32)).astype(X.dtype)
        mlp = [
            ref_mlp(
                cur, wq[f"W_gates_{i}"], wq[f"W_ups_{i}"], wq[f"W_downs_{i}"],
                normalization_weights_tensor=wq[f"W_gamma_mlps_{i}"],
                normalization_type=_lib_attr(TYPES, "NormType").RMS_NORM, eps=eps,
            ).astype(X.dtype)
            for wq in one
        ]  # fmt: skip
        cur = (cur.astype(np.float32) + mesh_reduce(mlp).astype(np.float32)).astype(X.dtype)
    return tuple(cur for _ in range(ranks))


def ref_moe_bwd(x, aff, w_gate_up, w_down, gup_t, down, pos, block_to_expert, dy, b, **kw):
    """nki-library's MoE backward (blockwise_mm_bwd, dropless, SiLU, affinity on H): for each
    block (expert e, its tokens by position), with the forward's checkpoints g, u (gup_t
    [N, 2, I, B]) and d = silu(g) u @ W_down (down [N, B, H]) and the upstream gradient dy:
    d_aff = sum_h dy d; dd = aff dy; da = dd @ W_down^T; dg = da u silu'(g), du = da silu(g);
    dW_down += (silu(g) u)^T dd; dW_gate_up += x^T [dg, du]; dx += [dg, du] @ W_gate_up^T.

    With the kernel's roundings, every stored step in bf16: dy d, summed over H in float32 in
    order (d_aff); dy times the float32 affinity; silu(g) (Swish: gelu_apprx_sigmoid) by
    trn2core's activation rule, times u; da PSUM's float32 sums over H; da silu(g); da u
    times silu_dx(g) (gelu_apprx_sigmoid_dx); the weight gradients PSUM's sums over the
    block's tokens, each added to the stored gradient; dx the gate part's sums, plus the up
    part's PSUM, then added to the stored dx (trn2core.reference.gemm for every product)."""
    from trn2core.reference import activation_values, gemm

    f32, dt = np.float32, x.dtype
    t, h = x.shape
    e_n, i_n, _ = w_down.shape
    swish = getattr(kw.get("activation_type"), "name", "SiLU") == "Swish"
    fwd, bwd = ("gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx") if swish else ("silu", "silu_dx")
    dx, daff = np.zeros((t, h), dt), np.zeros((t, e_n), dt)
    dwgu, dwd = np.zeros((e_n, h, 2, i_n), dt), np.zeros((e_n, i_n, h), dt)

    def r(a):  # a stored step: rounded to bf16 (float32 values)
        return np.asarray(a, f32).astype(dt).astype(f32)

    def add(old, new):  # the stored gradient plus a new part, rounded to bf16
        return (old.astype(f32) + new.astype(f32)).astype(dt)

    for n, e in enumerate(block_to_expert[:, 0]):
        toks = pos[n * b : (n + 1) * b]
        y = dy[toks].astype(f32)
        daff[toks, e] = np.cumsum(r(y * down[n].astype(f32)), axis=1, dtype=f32)[:, -1]
        dd = r(y * aff.reshape(t, e_n)[toks, e].astype(f32)[:, None]).astype(dt)
        g, u = gup_t[n, 0].T.astype(f32), gup_t[n, 1].T.astype(f32)  # [B, I]
        s = r(activation_values(fwd, g))
        act = r(s * u).astype(dt)
        da = r(gemm(dd, w_down[e].T))
        du = r(da * s).astype(dt)
        dg = r(r(da * u) * r(activation_values(bwd, g))).astype(dt)
        dwd[e] = add(dwd[e], gemm(act.T, dd).astype(dt))
        for j, grad in enumerate((dg, du)):
            dwgu[e, :, j] = add(dwgu[e, :, j], gemm(x[toks].T, grad).astype(dt))
        part = r(gemm(dg, w_gate_up[e, :, 0].T)) + gemm(du, w_gate_up[e, :, 1].T)
        dx[toks] = add(dx[toks], part.astype(f32).astype(dt))
    return dx, daff.reshape(t * e_n, 1), dwgu, dwd


def _moe_bwd_inputs(t, h, i, e, b, act="SiLU"):
    """bf16 tokens [T, H], weights (gate/up [E, H, 2, I], down [E, I, H], scaled so products
    stay near 1), affinities [T*E, 1] and the upstream gradient [T, H]; every token in one
    block of each expert (top k = E, T = B), its order in each block shuffled (int32
    positions, block e expert e's); the checkpoints a forward pass stores (gate and up
    transposed [N, 2, I, B] and the down projection [N, B, H], bf16)."""

    def f(r):
        x = _f32(r, t, h).astype(BF16)
        wgu = (_f32(r, e, h, 2, i) / np.sqrt(h)).astype(BF16)
        wd = (_f32(r, e, i, h) / np.sqrt(i)).astype(BF16)
        aff = r.uniform(0.1, 1.0, (t * e, 1)).astype(BF16)
        pos = np.concatenate([r.permutation(t) for _ in range(e)]).astype(np.int32)
        blocks = np.arange(e, dtype=np.int32).reshape(e, 1)
        gup_t = np.zeros((e, 2, i, b), BF16)
        down = np.zeros((e, b, h), BF16)
        for n in range(e):
            xs = x[pos[n * b : (n + 1) * b]].astype(np.float64)
            gu = xs @ wgu[n].astype(np.float64).reshape(h, 2 * i)
            g, u = gu[:, :i].astype(BF16), gu[:, i:].astype(BF16)
            gup_t[n, 0], gup_t[n, 1] = g.T, u.T
            g64 = g.astype(np.float64)
            c = 1.702 if act == "Swish" else 1.0
            a = (g64 / (1.0 + np.exp(-c * g64)) * u.astype(np.float64)).astype(BF16)
            down[n] = (a.astype(np.float64) @ wd[n].astype(np.float64)).astype(BF16)
        dy = _f32(r, t, h).astype(BF16)
        kw = {}
        if act != "SiLU":
            mod = "nkilib.experimental.moe.bwd.moe_bwd_parameters"
            kw["activation_type"] = getattr(_lib_attr(mod, "ActFnType"), act)
        return (x, aff, wgu, wd, gup_t, down, pos, blocks, dy, b), kw

    return f


def ref_topk_reduce(inp, T, K, **_):  # noqa: N803 - the kernel's keywords
    """nki-library's topk_reduce (its docstring): the int32 token index packed in each row's
    last two 16-bit columns; out[t] = the sum of the rows of index t, without those columns."""
    h = inp.shape[1] - 2
    idx = np.ascontiguousarray(inp[:, h:]).view(np.int32)[:, 0]
    out = np.zeros((T, h))
    for row, t in enumerate(idx):
        if 0 <= t < T:
            out[t] += inp[row, :h].astype(np.float64)
    return out.astype(inp.dtype)


def ref_allgather(inp, replica_groups, tp_degree):
    """nki-library's SBUF all-gathers (their docstring): every rank's output is its group's
    inputs side by side along the last dimension, in the group's rank order."""
    xs = inp.values
    return tuple(
        np.concatenate([xs[q] for q in next(g for g in replica_groups.groups if r in g)], axis=1)
        for r in range(len(xs))
    )


def _allgather_inputs(m, k, ranks):
    """Each rank's own bf16 [m, k] (arbitrary bits but NaN: a gather moves them), one group of
    all ranks."""
    import trn2core.nki as tn

    def make(rng):
        groups = importlib.import_module("nki.collectives").ReplicaGroup([list(range(ranks))])
        xs = []
        for _ in range(ranks):
            bits = rng.integers(0, 2**16, (m, k), dtype=np.uint32).astype(np.uint16)
            bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF  # no NaN / inf: the comparison's allclose
            xs.append(bits.view(BF16))
        return (tn.PerRank(xs), groups, ranks), {}

    return make


def ref_fg_allgather(lhs, tp_degree, num_groups, **_):
    """nki-library's fine_grained_allgather (its docstring): every rank's ``result`` holds each
    rank's lhs rows in rank order, [RANK_N, ...] over the rank's [m, K] rows (split in the
    layout's LNC and channel blocks, whose order is the rows')."""
    xs = lhs.values
    return tuple(np.stack(xs) for _ in xs)


def _fg_allgather_inputs(m, k, ranks, **kw):
    """Each rank's own bf16 lhs [m, K] (arbitrary bits but NaN and inf); one group."""

    def make(rng):
        args, _ = _allgather_inputs(m, k, ranks)(rng)
        return (args[0], ranks, 1), kw

    return make


def _fg_rows(out):
    """fine_grained_allgather's result as [RANK_N, m, K] (its LNC and channel blocks are
    consecutive row blocks of a rank's rows in both of its layouts at LNC=1; at LNC=2 the
    SBUF layout [RANK_N, LNC, CHANNEL, m / 4, K] too)."""
    return out.reshape(out.shape[0], -1, out.shape[-1])


def mesh_reduce(parts, op=np.add):
    """The reduction nki.collectives' all_reduce and reduce_scatter compute (docs/nki.md; the
    machine collectives' ``mesh`` order, docs/collectives.md), in numpy: the flattened buffer
    of W elements cut into n chunks (chunk j: elements floor(jW/n) .. floor((j+1)W/n)), chunk
    j position j's value combined with the others' in ascending position order, in fp32,
    rounded once to the buffer's dtype."""
    n, dtype, shape = len(parts), parts[0].dtype, parts[0].shape
    flat = [np.asarray(x).astype(np.float32).reshape(-1) for x in parts]
    w = flat[0].size
    out = np.empty(w, np.float32)
    for j in range(n):
        lo, hi = j * w // n, (j + 1) * w // n
        acc = flat[j][lo:hi]
        for a in range(n):
            if a != j:
                acc = op(acc, flat[a][lo:hi])
        out[lo:hi] = acc
    return out.astype(dtype).reshape(shape)


def _spread(rng, *shape):
    """float32 values of many magnitudes (10^-3 .. 10^3), so the order of a sum decides its
    bits."""
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(np.float32)


def _group_of(groups, r):
    return next(g for g in groups.groups if r in g)


#: nki-library's collective test kernels (their module imports its test framework: stood in).
COLL_TESTS = "test/integration/nkilib/experimental/collectives/test_collectives.py"


def _framework_module(name: str) -> Callable[[], types.ModuleType]:
    """A stand-in for a module of nki-library's test framework (``test.utils.*``), which
    ``test_collectives.py`` imports for its test class only: every name in it is a decorator
    (or decorator factory) that returns what it decorates, enough for the module's top level;
    the kernels never use them."""

    def passthrough(*args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return passthrough

    def attr(name_: str):
        if name_.startswith("__"):
            raise AttributeError(name_)
        return passthrough

    def make() -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__path__ = []  # type: ignore[attr-defined]
        mod.__getattr__ = attr  # type: ignore[attr-defined]
        return mod

    return make


def _pytest_stand_in() -> types.ModuleType:
    """``pytest`` where it is not installed, for ``test_collectives.py``'s top level only:
    ``pytest.mark.<anything>(...)`` and ``pytest.fixture`` return what they decorate."""
    mod = _framework_module("pytest")()

    class _Marks:
        def __getattr__(self, name: str):
            if name.startswith("__"):
                raise AttributeError(name)
            return mod.fixture

    mod.mark = _Marks()  # type: ignore[attr-defined]
    return mod


_FRAMEWORK = tuple(
    (n, _framework_module(n))
    for n in ("test", "test.utils", "test.utils.common_dataclasses",
              "test.utils.test_orchestrator", "test.utils.pytest_test_metadata")
)  # fmt: skip
if importlib.util.find_spec("pytest") is None:
    _FRAMEWORK += (("pytest", _pytest_stand_in),)


def _coll_inputs(ranks, shape, groups=None, extra=(), same=False):
    """Each rank's own float32 input of ``shape`` (``same``: one for all, as nki-library's
    all_reduce and all_to_all tests), a ReplicaGroup (one group of all ranks unless
    ``groups``), then ``extra`` positional arguments."""
    import trn2core.nki as tn

    def make(rng):
        rg = importlib.import_module("nki.collectives").ReplicaGroup(groups or [list(range(ranks))])
        xs = [_spread(rng, *shape) for _ in range(1 if same else ranks)]
        return (xs[0] if same else tn.PerRank(xs), rg, *extra), {}

    return make


def _per_rank(x, ranks):
    return x.values if hasattr(x, "values") else [x] * ranks


def ref_coll_all_reduce(input, replica_group, **_):  # noqa: A002 - the kernel's name
    """all_reduce_hbm_kernel: every rank's output is its group's inputs summed (mesh_reduce
    over the group in its order)."""
    n = 1 + max(max(g) for g in replica_group.groups)
    xs = _per_rank(input, n)
    return tuple(mesh_reduce([xs[q] for q in _group_of(replica_group, r)]) for r in range(n))


def ref_coll_reduce_scatter(input, replica_group, num_ranks):  # noqa: A002
    """reduce_scatter_hbm_kernel: rank r (position j of its group) gets rows j of the
    group's sum cut into num_ranks row blocks."""
    xs = _per_rank(input, num_ranks)
    return tuple(
        mesh_reduce([xs[q] for q in g])[_row_block(xs, g, r)]
        for r, g in ((r, _group_of(replica_group, r)) for r in range(num_ranks))
    )


def _row_block(xs, group, r):
    """Rank r's row block (its position in ``group``) of an input cut into len(group)."""
    k = xs[0].shape[0] // len(group)
    j = group.index(r)
    return slice(j * k, (j + 1) * k)


def ref_coll_all_gather(input, replica_group, num_ranks):  # noqa: A002
    """all_gather_hbm_kernel: every rank's output is its group's inputs stacked along rows."""
    xs = _per_rank(input, num_ranks)
    return tuple(
        np.concatenate([xs[q] for q in _group_of(replica_group, r)]) for r in range(num_ranks)
    )


def ref_coll_all_to_all(input, replica_group):  # noqa: A002
    """all_to_all_hbm_kernel: rank r (position j) gets row block j of every group member's
    input, in the group's order."""
    n = 1 + max(max(g) for g in replica_group.groups)
    xs = _per_rank(input, n)
    return tuple(
        np.concatenate([xs[q][_row_block(xs, g, r)] for q in g])
        for r, g in ((r, _group_of(replica_group, r)) for r in range(n))
    )


def _rank_id_inputs(ranks, lookup=False):
    def make(rng):
        x = rng.standard_normal((ranks, 128, 64)).astype(np.float32)
        if lookup:
            return (x, np.arange(ranks, dtype=np.int32).reshape(1, ranks)), {}
        return (x,), {}

    return make


def ref_coll_rank_id(in_tensor, *_):
    """rank_id_kernel, dma_copy_rank_id_kernel: rank r's output is in_tensor[r]."""
    return tuple(in_tensor[r] for r in range(in_tensor.shape[0]))


def _batch_shard_inputs(ranks, g, batch, layout, input_rank):
    """attn_q_batch_shard as nki-library's test runs it (TP4 -> TP2DP2: 4 ranks, DP groups of
    gqa_group_size 2, one q head a rank, S 1, d 64): rank r's input is head r of a Q of all
    heads for every batch ([1, B, S, d] NBSd, [d, B, 1, S] dBnS), the iota lookup, a zeroed
    gathered buffer, its rank as an input or from ncc.rank_id (layout: the test module's
    AttnQBatchShardLayout member, by name: _batch_shard_wrap)."""
    import trn2core.nki as tn

    def make(rng):
        s, d = 1, 64
        nbsd = layout == "NBSd"
        q = rng.standard_normal((ranks, batch, s, d) if nbsd else (ranks, d, batch, s))
        q = q.astype(np.float32)
        rg = importlib.import_module("nki.collectives").ReplicaGroup(
            [[i * g + j for j in range(g)] for i in range(ranks // g)]
        )
        xs = [q[r : r + 1] if nbsd else q[r : r + 1].reshape(d, batch, 1, s) for r in range(ranks)]
        buf = (g, 1, batch, s, d) if nbsd else (g, d, batch, 1, s)
        iota = np.array([(r % g) * (batch // g) for r in range(ranks)], np.int32)
        kw = {
            "iota_workers": iota.reshape(1, ranks),
            "gathered_buf": np.zeros(buf, np.float32),
            "gqa_group_size": g,
            "replica_group": rg,
            "layout": _BATCH_SHARD_LAYOUT[layout],
        }
        if input_rank:
            kw["rank_id_in"] = tn.PerRank([np.array([[r]], np.int32) for r in range(ranks)])
        return (tn.PerRank(xs),), kw

    return make


#: AttnQBatchShardLayout's members by name, from the loaded test module (_batch_shard_wrap).
_BATCH_SHARD_LAYOUT: dict = {}


def _batch_shard_wrap(kernel):
    """attn_q_batch_shard itself; notes its module's layout enum for the inputs."""
    enum = kernel.fn.__globals__["AttnQBatchShardLayout"]
    _BATCH_SHARD_LAYOUT.update({m.name: m for m in enum})
    return kernel


def ref_coll_batch_shard(input, gqa_group_size, layout, **_):  # noqa: A002 - the kernel's
    """attn_q_batch_shard (its docstring): rank r (DP group r // G, position r % G) gets its
    group's G heads (the all-gather) of its batch slice B/G x (r % G) .. : NBSd [G, B/G, S,
    d], dBnS [G, d, B/G, S]."""
    g = gqa_group_size
    xs = input.values
    nbsd = layout.name == "NBSd"
    q = np.concatenate(xs) if nbsd else np.stack([x.reshape(x.shape[:2] + x.shape[3:]) for x in xs])
    b = q.shape[1] if nbsd else q.shape[2]
    bp = b // g
    out = []
    for r in range(len(xs)):
        h0, b0 = (r // g) * g, (r % g) * bp
        out.append(q[h0 : h0 + g, b0 : b0 + bp] if nbsd else q[h0 : h0 + g, :, b0 : b0 + bp])
    return tuple(out)


def _topk_reduce_inputs(t, k, ranks, h):
    """bf16 rows [ranks * T, H + 2]: each token's K rows scattered among them, the rest
    padding (index -1), each row's index packed as int32 into its last two columns."""

    def f(r):
        n = ranks * t
        idx = np.full(n, -1, np.int32)
        idx[r.permutation(n)[: t * k]] = np.repeat(np.arange(t, dtype=np.int32), k)
        rows = np.empty((n, h + 2), BF16)
        rows[:, :h] = _f32(r, n, h).astype(BF16)
        rows[:, h:] = idx.reshape(n, 1).view(BF16)
        return (rows, t, k), {}

    return f


def ref_moe_shard_h(x, affinities, w_gate_up, w_down, block_size, token_position_to_id,
                    block_to_expert, **_):  # fmt: skip
    """nki-library's experimental blockwise MoE sharded on H (its docstring's pseudocode): as
    moe_cte's post-scaled forms, its arguments in its own order, with its roundings (two
    cores): each core sums the gate and up projections over its half of H (PSUM, float32),
    the halves added in float32 (sendrecv); silu by trn2core's activation rule rounded to
    bf16, times up rounded to bf16; each core's half of the output columns: the down
    projection's float32 sums over I times the affinity, rounded to bf16, plus the token's
    output row, rounded again."""
    from trn2core.reference import activation_values, gemm

    f32, dt = np.float32, x.dtype
    e_count, half = w_gate_up.shape[0], x.shape[1] // 2
    aff = affinities.reshape(-1).astype(f32)
    out = np.zeros(x.shape, dt)
    for blk, (e,) in enumerate(np.asarray(block_to_expert)):
        toks = np.asarray(token_position_to_id[blk * block_size : (blk + 1) * block_size])
        lo, hi = x[toks, :half], x[toks, half:]
        g, u = (
            (gemm(lo, w_gate_up[e, :half, j]) + gemm(hi, w_gate_up[e, half:, j])).astype(f32)
            for j in (0, 1)
        )
        h = activation_values("silu", g).astype(dt).astype(f32)
        h = (h * u).astype(f32).astype(w_down.dtype)
        y = (gemm(h, w_down[e]) * aff[toks * e_count + e][:, None]).astype(f32).astype(dt)
        out[toks] = (y.astype(f32) + out[toks].astype(f32)).astype(dt)
    return out


def _moe_shard_h_inputs(t, h, i, e, b):
    """_moe_cte_inputs' tensors, in blockwise_mm_baseline_shard_hidden's argument order."""
    make = _moe_cte_inputs(t, h, i, e, b)

    def f(r):
        (x, aff, wgu, wd, pos, blocks, size, _), _ = make(r)
        return (x, aff, wgu, wd, size, pos, blocks), {}

    return f


def ref_nonzero_with_count(x):
    """[1, T] -> [1, T + 1] int32: the positions of x's nonzero elements ascending, -1 up to T,
    then their count (nki-library's find_nonzero_indices_with_count, its docstring)."""
    idx, counts = ref_nonzero_indices(x.T)
    return np.concatenate([idx, counts.reshape(1, 1)], axis=1)


def ref_indexed_flatten(x, f_len, output_len, row_offsets, padding_val=-1, **_):
    """nki-library's indexed_flatten (its docstring's pseudocode): the output [output_len]
    starts at padding_val; row e of x [E, T], as T / f_len blocks of f_len, goes to blocks
    row_offsets[e], row_offsets[e] + 1, .. of the output, those past its end left out."""
    out = np.full((output_len // f_len, f_len), padding_val, x.dtype)
    for e, start in enumerate(row_offsets[: x.shape[0]]):
        for p, blk in enumerate(x[e].reshape(-1, f_len)):
            if 0 <= start + p < len(out):
                out[start + p] = blk
    return out.reshape(-1)


def _indexed_flatten_inputs(r):
    """Four rows of 256 distinct non-negative int32 values (16 blocks of 16), placed at
    disjoint block offsets of a 1536-element output (96 blocks), the last row running 10
    blocks past its end."""
    x = r.permutation(4 * 256).astype(np.int32).reshape(4, 256)
    return (x, 16, 1536, np.array([0, 20, 50, 86], np.int32)), {}


def ref_attention_bwd(
    q, k, v, o, dy, lse, use_causal_mask=False, softmax_scale=None, mixed_precision=False, **_
):
    """nki-library's attention backward (its docstring's pseudocode) with the kernel's stored
    roundings: per batch and query head (query head h reads key/value head h / (heads / kv
    heads)), P = exp(scale q^T k - lse), masked causally or not; D = rowsum(dy o);
    dS = P (dy^T v - D); dq = scale k dS^T, dk = scale q dS, dv = dy P (the key and value
    gradients summed over a group's query heads). q, o, dy [B, H, d, Sq]; k, v [B, Hkv, d, Sk];
    lse [B, H, 128, Sq / 128] (query j * 128 + p at [p, j]).

    The kernel keeps q times the scale, dy o, P and dS in the inputs' dtype (bf16) and -lse,
    D and the dq, dk, dv accumulators in float32 with mixed_precision, else in bf16 too (each
    step rounded); its products are PSUM's (trn2core.reference.gemm: fp32 sums in ascending k
    per 128-row tile), D's sums float32 in order, exp float64 rounded to float32."""
    from trn2core.reference import gemm

    f32, dt = np.float32, q.dtype
    acc = f32 if mixed_precision else dt  # the kernel's mixed_dtype

    def rnd(x, dtype=dt):
        return np.asarray(x, f32).astype(dtype).astype(f32)

    b, h, d, sq = q.shape
    hkv, sk = k.shape[1], k.shape[3]
    scale = f32(softmax_scale if softmax_scale is not None else d**-0.5)
    dq, dk, dv = np.zeros(q.shape, f32), np.zeros(k.shape, f32), np.zeros(v.shape, f32)
    keep = np.tril(np.ones((sq, sk), bool)) if use_causal_mask else np.ones((sq, sk), bool)
    grp = 512  # the kernel's q tile group (4 x 128 queries) and k tile (512 keys)
    for i in range(b):
        for j in range(h):
            g = j // (h // hkv)
            qs = rnd(q[i, j].astype(f32) * scale)  # [d, Sq]
            kk, vv, yy = k[i, g].astype(f32), v[i, g].astype(f32), dy[i, j].astype(f32)
            bias = -rnd(lse[i, j].T.reshape(sq), acc)
            dyo = rnd(yy * o[i, j].astype(f32))
            dd = rnd(np.cumsum(dyo, axis=0, dtype=f32)[-1], acc)  # the sum in order
            for q0 in range(0, sq, grp):
                qg = slice(q0, min(q0 + grp, sq))
                for k0 in range(0, sk, grp):
                    kg = slice(k0, min(k0 + grp, sk))
                    x = (gemm(qs[:, qg].T, kk[:, kg]) + bias[qg, None]).astype(f32)
                    p = np.where(keep[qg, kg], rnd(np.exp(x.astype(np.float64))), f32(0))
                    ds = rnd((gemm(yy[:, qg].T, vv[:, kg]) - dd[qg, None]) * p)
                    dq[i, j][:, qg] = rnd(gemm(kk[:, kg], ds.T) * scale + dq[i, j][:, qg], acc)
                    dk[i, g][:, kg] = rnd(dk[i, g][:, kg] + gemm(qs[:, qg], ds), acc)
                    dv[i, g][:, kg] = rnd(dv[i, g][:, kg] + gemm(yy[:, qg], p), acc)
    return tuple(t.astype(dt) for t in (dq, dk, dv))


def _attention_bwd_inputs(b, h, hkv, s, d, causal, mixed=True):
    """bf16 q [B, H, d, S], k and v [B, Hkv, d, S], the forward's output o and log-sum-exp
    (float64, o rounded to bf16, lse to float32, in the kernel's [B, H, 128, S / 128] layout)
    and an upstream gradient dy; mixed precision (float32 accumulators) or the default
    (bf16)."""

    def f(r):
        q, k, v = (_f32(r, b, n, d, s).astype(BF16) for n in (h, hkv, hkv))
        o = np.zeros((b, h, d, s))
        lse = np.zeros((b, h, s))
        for i in range(b):
            for j in range(h):
                g = j // (h // hkv)
                sc = (q[i, j].astype(np.float64).T @ k[i, g].astype(np.float64)) / np.sqrt(d)
                if causal:
                    sc = np.where(np.tril(np.ones((s, s), bool)), sc, -np.inf)
                m = sc.max(axis=1, keepdims=True)
                lse[i, j] = (m + np.log(np.exp(sc - m).sum(axis=1, keepdims=True)))[:, 0]
                o[i, j] = v[i, g].astype(np.float64) @ np.exp(sc - lse[i, j][:, None]).T
        lse = np.ascontiguousarray(lse.reshape(b, h, s // 128, 128).transpose(0, 1, 3, 2))
        dy = _f32(r, b, h, d, s).astype(BF16)
        args = (q, k, v, o.astype(BF16), dy, lse.astype(np.float32))
        return args, {"use_causal_mask": causal, "mixed_precision": mixed}

    return f


# ----------------------------------------------------------------------------- the corpus
SDK = "nki/examples"
SAMPLES = "src/nki_samples/tutorials"


def _mm_inputs(k, m, n, dtype=BF16):
    def f(rng):
        return (_f32(rng, k, m).astype(dtype), _f32(rng, k, n).astype(dtype)), {}

    return f


def _two(shape, dtype=np.float32):
    def f(rng):
        return (_f32(rng, *shape).astype(dtype), _f32(rng, *shape).astype(dtype)), {}

    return f


def _mamba_inputs(rng):
    b, ch, seq, st = 1, 128, 512, 4
    delta = rng.uniform(0.01, 0.1, (b, ch, seq)).astype(np.float32)
    u = _f32(rng, b, ch, seq)
    a = -rng.uniform(0.5, 1.5, (ch, st)).astype(np.float32)
    bb = _f32(rng, b, st, seq)
    c = _f32(rng, b, st, seq)
    return (delta, u, a, bb, c), {}


def _attn_inputs(seq):
    def f(rng):
        return tuple(_f32(rng, 128, seq) for _ in range(3)), {}

    return f


SDK_ADD = f"{SDK}/tensor_addition/tensor_addition_nki_kernels.py"
SDK_MM = f"{SDK}/matrix_multiplication/matrix_multiplication_nki_kernels.py"
SAMPLES_MM = f"{SAMPLES}/matrix_multiplication/matrix_multiplication_nki_kernels.py"
ADD = f"{SAMPLES}/tensor_addition"
ATTN = f"{SAMPLES}/attention_fwd_performance/attention_kernels.py"
LIB = "src/nkilib_src"
OLD = "general/nki/examples"  # aws-neuron-sdk before Neuron 2.27 (legacy dialect tutorials)
REF = "src/nki_samples/reference"  # nki-samples' reference kernels (removed in 2026)


def _pool_in(r):
    return (_f32(r, 64, 16, 16),), {"pool_size": 2}


def _t2d_in(r):
    return (_f32(r, 16, 32),), {"shape2D": (4, 8)}


RMSQ = "nkilib.core.rmsnorm.rmsnorm_quant"
RMSQ_REF = "nki_samples.reference.rmsnorm_quant.rmsnorm_quant"


QKV = "nkilib.core.qkv.qkv"
TYPES = "nkilib.core.utils.common_types"
#: (label, (B, S, H, I), options): the enum-valued options by name.
_QKV_CASES = (
    ("tkg (RMS norm, bias)", (1, 4, 256, 256), {"fused_norm_type": "RMS_NORM", "bias": True}),
    ("cte (RMS norm, bias)", (1, 128, 256, 256), {"fused_norm_type": "RMS_NORM", "bias": True}),
    (
        "tkg (fused add, layer norm, NBSd)",
        (2, 2, 256, 256),
        {
            "fused_residual_add": True,
            "fused_norm_type": "LAYER_NORM",
            "output_layout": "NBSd",
            "d_head": 64,
        },
    ),
    (
        "cte (fused add, layer norm, NBSd)",
        (1, 128, 256, 384),
        {
            "fused_residual_add": True,
            "fused_norm_type": "LAYER_NORM",
            "output_layout": "NBSd",
            "d_head": 128,
        },
    ),
    ("cte (RoPE)", (1, 128, 256, 256), {"fused_rope": True, "d_head": 64, "heads": (2, 1)}),
    # qkv_cte's static form quantizes the rows straight to fp8 and stores the product in bf16
    # before its scales; its RMS norm rounds the rows to bf16 twice, times 1/rms and times
    # gamma, and its eps is an fp8 tile's (0) (ref_qkv).
    (
        "cte (static fp8)",
        (1, 128, 256, 256),
        {"d_head": 64, "heads": (2, 1), "quantization_type": "STATIC"},
    ),
    (
        "cte (static fp8, RMS norm)",
        (1, 128, 256, 256),
        {
            "fused_norm_type": "RMS_NORM",
            "d_head": 64,
            "heads": (2, 1),
            "quantization_type": "STATIC",
        },
    ),
    (
        "tkg (static fp8, RMS norm, bias)",
        (1, 4, 256, 256),
        {
            "fused_norm_type": "RMS_NORM",
            "bias": True,
            "d_head": 64,
            "heads": (2, 1),
            "quantization_type": "STATIC",
        },
    ),
    (
        "tkg (row fp8, RMS norm, bias)",
        (1, 4, 256, 256),
        {"fused_norm_type": "RMS_NORM", "bias": True, "quantization_type": "ROW"},
    ),
)


#: (label, (B, H, s_active, s_prior, d_head), options) of nki-library's attention_tkg.
_ATTN_TKG_CASES = (
    ("", (2, 2, 2, 256, 64), {}),
    (" (tp_k_prior, not strided)", (2, 2, 2, 256, 64), {"tp_k_prior": True, "strided_mm1": False}),
    (" (sink)", (2, 2, 2, 256, 64), {"sink": True}),
    (" (s_prior 128, d_head 128, tp_k_prior)", (2, 2, 2, 128, 128), {"tp_k_prior": True}),
    (" (fused RoPE, q and k from HBM)", (2, 2, 2, 256, 64), {"fuse_rope": True}),
    (" (mask from position ids)", (2, 2, 2, 256, 64), {"use_pos_id": True}),
    (
        " (block KV, block_len 16, mask from position ids)",
        (2, 2, 2, 256, 64),
        {"block_len": 16, "tp_k_prior": True, "strided_mm1": False, "use_pos_id": True},
    ),
    (
        " (fp8 KV, tp_k_prior, not strided)",
        (2, 2, 2, 256, 64),
        {"fp8": True, "tp_k_prior": True, "strided_mm1": False},
    ),
    (" (fp8 KV, not strided)", (2, 2, 2, 256, 64), {"fp8": True, "strided_mm1": False}),
    (
        " (fused RoPE, mask from position ids, tp_k_prior)",
        (2, 2, 2, 256, 64),
        {"fuse_rope": True, "use_pos_id": True, "tp_k_prior": True},
    ),
    (
        " (block KV, block_len 8, d_head 128, mask from position ids)",
        (2, 2, 2, 1024, 128),
        {"block_len": 8, "tp_k_prior": True, "strided_mm1": False, "use_pos_id": True},
    ),
)


#: (label, (T, H, E, k), options, grid) of nki-library's router_topk. Its one-hot scatter
#: ends with a core_barrier on the affinities (LNC=2 only); the indirect-DMA scatter does not.
_ROUTER_CASES = (
    (" (softmax, one-hot scatter) (LNC=2)", (64, 256, 64, 4), {"router_pre_norm": False}, 2),
    (
        " (softmax, one-hot scatter, sharded on tokens) (LNC=2)",
        (64, 256, 64, 4),
        {"router_pre_norm": False, "shard_on_tokens": True},
        2,
    ),
    (
        " (softmax first, normalised top k, [T, H], indirect scatter)",
        (64, 256, 64, 4),
        {"norm_topk_prob": True, "x_hbm_layout": 1, "use_indirect_dma_scatter": True},
        None,
    ),
    (
        " (sigmoid, indirect scatter)",
        (64, 256, 64, 8),
        {"act": "SIGMOID", "use_indirect_dma_scatter": True, "router_pre_norm": False},
        None,
    ),
    (
        " (sigmoid, indirect scatter, sharded on tokens) (LNC=2)",
        (64, 256, 64, 8),
        {
            "act": "SIGMOID",
            "use_indirect_dma_scatter": True,
            "router_pre_norm": False,
            "shard_on_tokens": True,
        },
        2,
    ),
)


#: (label, (T, H, I, E, k, all experts), options) of nki-library's moe_tkg.
_MOE_TKG_CASES = (
    (" (selective, post-scaled)", (4, 256, 256, 4, 2, False), {"scale": "POST_SCALE"}),
    (" (all experts, unscaled)", (4, 256, 256, 4, 2, True), {}),
    (
        " (all experts, post-scaled, unselected masked)",
        (4, 256, 256, 4, 2, True),
        {"scale": "POST_SCALE", "mask_unselected_experts": True},
    ),
)


#: The rows whose reference follows qkv's instructions bit for bit (rtol and atol 0).
_QKV_EXACT = {
    "cte (RMS norm, bias)",
    "cte (RoPE)",
    "cte (static fp8)",
    "cte (static fp8, RMS norm)",
    "cte (fused add, layer norm, NBSd)",
    "tkg (RMS norm, bias)",
    "tkg (fused add, layer norm, NBSd)",
    "tkg (static fp8, RMS norm, bias)",
    "tkg (row fp8, RMS norm, bias)",
}


def _qkv_inputs(r, b, s, h, i, **opts):
    """bf16 input [B, S, H], weights [H, I] (scaled so a row's sum stays near 1), and what
    the options ask: bias [1, I], gamma (and beta) [1, H], mlp_prev and attention_prev."""
    kw: dict = {}
    for key, value in opts.items():
        if key == "fused_norm_type":
            kw[key] = getattr(_lib_attr(TYPES, "NormType"), value)
            kw["gamma_norm_weights"] = _f32(r, 1, h, lo=0.5, hi=1.5).astype(BF16)
            if value == "LAYER_NORM":
                kw["layer_norm_bias"] = _f32(r, 1, h).astype(BF16)
        elif key == "output_layout":
            kw[key] = getattr(_lib_attr(TYPES, "QKVOutputLayout"), value)
        elif key == "bias":
            kw[key] = _f32(r, 1, i).astype(BF16)
        elif key == "quantization_type":  # fp8 weights; ROW: a scale per column, STATIC: per
            # q/k/v section, and the input's scale
            kw[key] = getattr(_lib_attr(TYPES, "QuantizationType"), value)
            cols = i if value == "ROW" else 3
            kw["qkv_w_scale"] = np.repeat(r.uniform(0.5, 2.0, (1, cols)), 128, 0).astype(np.float32)
            if value == "STATIC":
                kw["qkv_in_scale"] = np.full((128, 1), 0.04, np.float32)
        elif key == "heads":
            kw["num_q_heads"], kw["num_kv_heads"] = value
            if opts.get("fused_rope"):
                ang = r.uniform(0.0, 6.0, (b, s, kw["d_head"] // 2))
                kw["cos_cache"] = np.concatenate([np.cos(ang)] * 2, axis=-1).astype(BF16)
                kw["sin_cache"] = np.concatenate([np.sin(ang)] * 2, axis=-1).astype(BF16)
        elif key == "fused_residual_add":
            kw[key] = True
            kw["mlp_prev"] = _f32(r, b, s, h).astype(BF16)
            kw["attention_prev"] = _f32(r, b, s, h).astype(BF16)
        else:
            kw[key] = value
    x = _f32(r, b, s, h).astype(BF16)
    w = (_f32(r, h, i) / np.sqrt(h)).astype(BF16)
    if "qkv_w_scale" in kw:
        w = (_f32(r, h, i, lo=-200.0, hi=200.0) / np.sqrt(h)).astype(ml_dtypes.float8_e4m3)
    return (x, w), kw


def _lib_attr(module: str, name: str):
    """An attribute of a package module (imported by then: the case's kernel module)."""
    return getattr(importlib.import_module(module), name)


def _double_row_inputs(r, m=256, k=4096, n=1024, blocks=(2, 2, 16)):
    """nki-samples' FP8 double-row matmul: lhs [M, K] bf16; rhs quantized column-wise to fp8
    e4m3 (range 240) and laid out as its docstring asks, each pair of 128-row tiles of K side
    by side per 512 columns ([K / 2, 2 N]); the scale broadcast to [128, N] (bf16)."""
    lhs = r.uniform(0, 1, (m, k)).astype(BF16)
    rhs = r.uniform(0, 1, (k, n))
    scale = (rhs.max(axis=0, keepdims=True) / 240).astype(BF16)
    q = (rhs / scale.astype(np.float64)).astype(ml_dtypes.float8_e4m3)
    pairs = q.reshape(k // 256, 2, 128, n // 512, 512)  # [pair, row tile, 128, col tile, 512]
    laid = pairs.transpose(0, 2, 3, 1, 4).reshape(k // 2, 2 * n)
    return (lhs, laid, np.broadcast_to(scale, (128, n)).copy(), *blocks), {}


def ref_double_row(lhs, laid, scale, tiles_m, tiles_n, tiles_k):
    """lhs quantized per row and K block (scale max|row| / 240, in bf16) to fp8, times the fp8
    rhs, the products dequantized by both scales (float64: the kernel rounds its partial sums
    to bf16, the tolerance covers that)."""
    m, k = lhs.shape
    n = laid.shape[1] // 2
    q = laid.reshape(k // 256, 128, n // 512, 2, 512).transpose(0, 3, 1, 2, 4).reshape(k, n)
    rhs = q.astype(np.float64) * scale[0].astype(np.float64)
    out = np.zeros((m, n))
    bk = 128 * tiles_k
    for j in range(0, k, bk):
        blk = lhs[:, j : j + bk].astype(np.float32)
        s = np.abs(blk).max(axis=1, keepdims=True).astype(BF16).astype(np.float32) / 240
        s = s.astype(BF16).astype(np.float32)
        lq = (blk / s).astype(ml_dtypes.float8_e4m3).astype(np.float64)
        out += (lq @ rhs[j : j + bk]) * s
    return out.astype(np.float32)


def _cases() -> list[Case]:
    sdk, smp, lib = "aws-neuron-sdk", "nki-samples", "nki-library"
    old, ref = "aws-neuron-sdk-2.26", "nki-samples-reference"
    exact = {"rtol": 0.0, "atol": 0.0}
    loose = {"rtol": 2e-2, "atol": 2e-2}
    cases = [
        Case("sdk tensor_add", sdk, SDK_ADD, "nki_tensor_add", _two((128, 512)), ref_add),
        Case(
            "sdk getting_started",
            sdk,
            f"{SDK}/getting_started_baremetal.py",
            "nki_tensor_add_kernel",
            _two((128, 512)),
            ref_add,
        ),
        Case(
            "sdk simulate add",
            sdk,
            f"{SDK}/simulate/nki_simulate_example.py",
            "add_kernel",
            _two((128, 512)),
            ref_simulate_add,
        ),
        Case(
            "sdk transpose2d",
            sdk,
            f"{SDK}/transpose2d/transpose2d_nki_kernels.py",
            "tensor_transpose2D_kernel_",
            _t2d_in,
            ref_transpose_rows,
        ),
        Case(
            "sdk avgpool2d",
            sdk,
            f"{SDK}/average_pool2d/average_pool2d_nki_kernels.py",
            "tensor_avgpool_kernel",
            _pool_in,
            ref_avgpool,
            rtol=0.0,
            atol=0.0,
        ),
    ]
    for kern, shape in [
        ("nki_matmul_basic_", (128, 64, 512)),
        ("nki_matmul_tiled_", (256, 128, 1024)),
        ("nki_matmul_hoist_load_", (256, 128, 1024)),
        ("nki_matmul_block_free_dimension_", (256, 256, 1024)),
        ("nki_matmul_fully_optimized_", (1024, 2048, 1024)),
    ]:
        name = kern.strip("_")
        for who, repo, path in (("sdk", sdk, SDK_MM), ("samples", smp, SAMPLES_MM)):
            cases.append(
                Case(f"{who} {name}", repo, path, kern, _mm_inputs(*shape), ref_matmul, **exact)
            )
    for v in ("v1", "v2", "v3"):
        for who, repo, path in [
            ("sdk", sdk, f"{SDK}/fused_mamba/mamba_nki_kernels.py"),
            ("samples", smp, f"{SAMPLES}/fused_mamba/mamba_nki_kernels.py"),
        ]:
            cases.append(
                Case(
                    f"{who} mamba_{v}",
                    repo,
                    path,
                    f"mamba_{v}",
                    _mamba_inputs,
                    ref_mamba,
                    **exact,
                )
            )
    cases += [
        Case(
            "samples tensor_add",
            smp,
            f"{ADD}/tensor_addition_nki_kernels.py",
            "nki_tensor_add",
            _two((256, 1024)),
            ref_add,
            call=True,
        ),
        Case(
            "samples spmd tensor_add",
            smp,
            f"{ADD}/spmd_tensor_addition_nki_kernels.py",
            "nki_tensor_add",
            _two((256, 1024)),
            ref_add,
            call=True,
        ),
        Case(
            "samples spmd tensor_add nc2",
            smp,
            f"{ADD}/spmd_multiple_nc_tensor_addition_nki_kernels.py",
            "nki_tensor_add_nc2",
            _two((512, 1024), np.float16),
            ref_add,
            call=True,
            rtol=1e-3,
            atol=1e-3,
        ),
        Case(
            "samples transpose2d",
            smp,
            f"{SAMPLES}/transpose2d/transpose2d_nki_kernels.py",
            "tensor_transpose2D_kernel_",
            _t2d_in,
            ref_transpose_rows,
        ),
        Case(
            "samples avgpool2d",
            smp,
            f"{SAMPLES}/average_pool2d/average_pool2d_nki_kernels.py",
            "tensor_avgpool_kernel",
            _pool_in,
            ref_avgpool,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "samples maxpool stride 1",
            smp,
            "contributed/maxpooling.py",
            "max_pooling_2d_stride_1",
            lambda r: ((_f32(r, 200, 24),), {"pool_size": 3}),
            ref_maxpool_stride1,
            **exact,
        ),
        Case(
            "samples maxpool stride 1 (nan)",
            smp,
            "contributed/maxpooling.py",
            "max_pooling_2d_stride_1",
            lambda r: ((_f32(r, 200, 24),), {"pool_size": 3}),
            ref_maxpool_stride1,
            uninitialized="nan",
            **exact,
        ),
        # Z kept in SBUF, each K block's PSUM sum added with nl.loop_reduce (two blocks).
        Case(
            "samples matmul (loop_reduce, K 2048)",
            smp,
            "contributed/matmul.py",
            "matmul",
            lambda r: (
                (
                    r.random((2048, 512)).astype(np.float16),
                    r.random((2048, 2048)).astype(np.float16),
                ),
                {},
            ),
            ref_contributed_matmul,
            **exact,
        ),
        Case(
            "samples interpolate_bilinear_2x",
            smp,
            "contributed/interpolate_bilinear_fwd.py",
            "interpolate_bilinear_2x_fwd",
            lambda r: ((_f32(r, 2, 64, 20, 12),), {}),  # two 10-row chunks, 128 planes
            ref_bilinear_2x,
            stand_ins=_absent_modules("torch"),  # its host-side check only
            **exact,
        ),
        Case(
            "samples interpolate_trilinear_2x",
            smp,
            "contributed/interpolate_trilinear_fwd.py",
            "interpolate_trilinear_2x_fwd",
            lambda r: ((_f32(r, 1, 32, 6, 6, 6),), {}),
            ref_trilinear_2x,
            stand_ins=_absent_modules("torch", "torch_xla.core.xla_model"),
            **exact,
        ),
    ]
    for v in ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v8a", "v9", "v10", "v11"):
        seq = 128 if v in ("v1", "v2") else 512
        forms = {"v1": "divide", "v2": "normalise", "v3": "normalise", "v4": "normalise"}
        forms |= {"v5": "defer", "v6": "defer", "v7": "bf16", "v8": "bf16"}
        form = forms.get(v, "bf16 out")
        cases.append(
            Case(
                f"samples attn_fwd_{v}",
                smp,
                ATTN,
                f"attn_fwd_{v}",
                _attn_inputs(seq),
                functools.partial(ref_attention, form=form),
                **exact,
            )
        )
    # The token-generation sub-kernels: bf16 tolerances, run through _tkg_wrapper.
    tkg = {"rtol": 2e-2, "atol": 2e-2, "package_root": LIB, "wrap": _tkg_wrapper}
    cases += [
        Case(
            "nkilib cumsum",
            lib,
            "nkilib.core.cumsum.cumsum",
            "cumsum",
            lambda r: ((_f32(r, 200, 640),), {}),
            ref_cumsum,
            **exact,
            package_root=LIB,
        ),
        Case(
            "nkilib cross_entropy_forward (LNC=2)",
            lib,
            "nkilib.experimental.loss.cross_entropy",
            "cross_entropy_forward",
            lambda r: (
                (_f32(r, 64, 2048, lo=-4.0, hi=4.0), r.integers(0, 2048, 64).astype(np.int32)),
                {"positions_per_batch": 32, "chunk_size": 1024, "dtype": np.dtype(np.float32)},
            ),
            ref_cross_entropy,
            grid=2,
            **exact,
            package_root=LIB,
        ),
        Case(
            "nkilib rmsnorm_tkg (sub-kernel)",
            lib,
            "nkilib.core.subkernels.rmsnorm_tkg",
            "rmsnorm_tkg",
            lambda r: ((_f32(r, 1, 4, 512).astype(BF16), _f32(r, 1, 512).astype(BF16)), {}),
            ref_rmsnorm_tkg,
            **tkg,
        ),
        Case(
            "nkilib layernorm_tkg (sub-kernel)",
            lib,
            "nkilib.core.subkernels.layernorm_tkg",
            "layernorm_tkg",
            lambda r: (
                tuple(
                    a.astype(BF16) for a in (_f32(r, 1, 4, 512), _f32(r, 1, 512), _f32(r, 1, 512))
                ),
                {},
            ),
            ref_layernorm_tkg,
            **{**tkg, **exact},
        ),
        Case(
            "nkilib depthwise_conv1d",
            lib,
            "nkilib.experimental.conv.depthwise_conv1d",
            "depthwise_conv1d_implicit_gemm",
            lambda r: (
                (_f32(r, 1, 128, 1, 64), _f32(r, 128, 1, 1, 3)),
                {"feature_group_count": 128},
            ),
            ref_depthwise,
            **exact,
            package_root=LIB,
        ),
        Case(
            "nkilib rmsnorm_quant (row fp8)",
            lib,
            RMSQ,
            "rmsnorm_quant_kernel",
            lambda r: (
                (_f32(r, 2, 100, 640, lo=-3.0, hi=3.0).astype(BF16), _f32(r, 640).astype(BF16)),
                {"kargs": _lib_attr(RMSQ, "RmsNormQuantKernelArgs")()},
            ),
            ref_rmsnorm_quant,
            rtol=0.07,  # one fp8 (3 mantissa bits) rounding apart at most
            atol=1e-3,
            package_root=LIB,
            decode=decode_row_quant,
        ),
        Case(
            "nkilib dynamic_elementwise_add (register loop bound)",
            lib,
            "nkilib.experimental.dynamic_shapes.dynamic_elementwise_add",
            "dynamic_elementwise_add",
            lambda r: (
                (
                    _f32(r, 512, 1024).astype(BF16),
                    _f32(r, 512, 1024).astype(BF16),
                    np.array([[_DYN_TILES]], np.int32),
                ),
                {},
            ),
            ref_dynamic_add,
            package_root=LIB,
            # Rows past the loop's are never written, and the kernel's closing fence copy
            # reads them: new memory holds NaN, as AWS's simulator.
            uninitialized="nan",
            decode=decode_dynamic_rows,
        ),
    ]
    for layout, extra in (
        ("contiguous", {}),
        ("interleaved, DMA", {"contiguous_layout": False}),
        ("interleaved, SBUF matmul", {"contiguous_layout": False, "relayout_in_sbuf": True}),
    ):
        cases.append(
            Case(
                f"nkilib RoPE ({layout})",
                lib,
                "nkilib.core.embeddings.rope",
                "RoPE",
                lambda r, kw=extra: (
                    (_f32(r, 64, 2, 4, 32), _f32(r, 32, 2, 32), _f32(r, 32, 2, 32)),
                    dict(kw),
                ),
                ref_rope,
                **exact,
                package_root=LIB,
            )
        )
    cases.append(
        Case(
            "nkilib find_nonzero_indices (LNC=2)",
            lib,
            "nkilib.core.subkernels.find_nonzero_indices",
            "find_nonzero_indices",
            lambda r: ((_sparse(r, 256, 16),), {"chunk_size": 128}),
            ref_nonzero_indices,
            grid=2,
            **exact,
            package_root=LIB,
            # It transposes a whole [128, 128] tile of which it wrote only the GpSimd cores'
            # columns; the rest lands on partitions nonzero_with_count does not read.
            uninitialized="nan",
        )
    )
    for v in (2048, 2000):
        cases.append(
            Case(
                f"nkilib cascaded_max V={v} (LNC=2)",
                lib,
                "nkilib.core.max.cascaded_max",
                "cascaded_max",
                lambda r, n=v: ((_f32(r, 2, 4, n),), {}),
                ref_max_index,
                grid=2,
                **exact,
                package_root=LIB,
            )
        )
    cases += [
        Case(
            "nkilib conv1d",
            lib,
            "nkilib.experimental.conv.conv1d",
            "conv1d",
            lambda r: ((_f32(r, 1, 64, 100), _f32(r, 3, 64, 96)), {}),
            ref_conv1d,
            **exact,
            package_root=LIB,
        ),
        Case(
            "nkilib rope_hf",
            lib,
            "nkilib.core.embeddings.rope_hf",
            "rope_hf",
            _rope_hf_inputs,
            ref_rope_hf,
            rtol=1e-5,
            atol=1e-6,
            package_root=LIB,
        ),
    ]
    not_causal = {"causal_mask": False}
    for label, seq, extra in (("causal", 512, {}), ("not causal, 1024", 1024, not_causal)):

        def qkv(r, seq=seq, extra=extra):
            shapes = ((1, seq, 64), (1, 64, seq), (1, seq, 64))
            return tuple(_f32(r, *s).astype(BF16) for s in shapes), {"scale": 0.125, **extra}

        cases.append(
            Case(
                f"nkilib attention_cte ({label})",
                lib,
                "nkilib.core.attention.attention_cte",
                "attention_cte",
                qkv,
                ref_attention_cte,
                **exact,
                package_root=LIB,
            )
        )
    # A host-side caller (topk[lnc](x, k)) of the @nki.jit kernel; scipy builds its rotation
    # matrix. One stage (V=2048: the scanning fallback) and eight (the rotational algorithm).
    for v, k in ((2048, 8), (32768, 64)):
        cases.append(
            Case(
                f"nkilib topk V={v} k={k} (LNC=2)",
                lib,
                "nkilib.core.topk.rotational_topk",
                "topk",
                lambda r, n=v, kk=k: ((_f32(r, 2, 4, n), kk), {}),
                ref_topk,
                **exact,
                package_root=LIB,
                call=True,
                wrap=lambda f: f[2],
                needs=("scipy",),
            )
        )
    # The QKV projection (qkv picks qkv_tkg up to S=96 and B*S=128, else qkv_cte): bf16.
    for label, (b, s, h, i), extra in _QKV_CASES:
        cases.append(
            Case(
                f"nkilib qkv {label}",
                lib,
                QKV,
                "qkv",
                lambda r, shp=(b, s, h, i), kw=extra: _qkv_inputs(r, *shp, **kw),
                ref_qkv,
                **(exact if label in _QKV_EXACT else loose),
                package_root=LIB,
            )
        )
    # The attention output projection: token generation ([D, B, N, S] in) and context encoding.
    opt = "nkilib.core.output_projection"
    cases += [
        Case(
            f"nkilib output_projection_tkg{label}",
            lib,
            f"{opt}.output_projection_tkg",
            "output_projection_tkg",
            _out_proj_inputs((64, 1, 2, 4), 128, 256, **kw),
            ref_out_proj_tkg,
            **exact,
            package_root=LIB,
        )
        for label, kw in (
            ("", {}),
            (" (TRANSPOSE_OUT)", {"TRANSPOSE_OUT": True}),
            (" (row fp8)", {"quant": "ROW"}),
            (" (static fp8)", {"quant": "STATIC"}),
        )
    ]
    cases.append(
        Case(
            "nkilib output_projection_cte",
            lib,
            f"{opt}.output_projection_cte.output_projection_cte",
            "output_projection_cte",
            _out_proj_inputs((1, 2, 64, 128), 128, 256),
            ref_out_proj_cte,
            **exact,
            package_root=LIB,
        )
    )
    # Three sub-kernels, each in a kernel of ours: token-generation attention (s_active 2, the
    # KV cache as [d, s_prior] or, tp_k_prior, [s_prior, d], strided or not, with a sink), the
    # MoE router (logits, top-k expert indices, scattered affinities) and MoE token generation
    # (all experts or each token's top k).
    subs = (
        ("attention_tkg", "nkilib.core.attention.attention_tkg", _ATTN_TKG_CASES,
         _attn_tkg_inputs, ref_attention_tkg, _attn_tkg_wrapper),
        ("router_topk", "nkilib.core.router_topk.router_topk", _ROUTER_CASES, _router_inputs,
         ref_router_topk, _router_wrapper),
        ("moe_tkg", "nkilib.core.moe.moe_tkg.moe_tkg", _MOE_TKG_CASES, _moe_tkg_inputs,
         ref_moe_tkg, _moe_tkg_wrapper),
    )  # fmt: skip
    for kern, module, table, inputs, check, wrap in subs:
        for label, shape, kw, *grid in table:
            cases.append(
                Case(
                    f"nkilib {kern}{label}",
                    lib,
                    module,
                    kern,
                    inputs(*shape, **kw),
                    check,
                    grid=grid[0] if grid else None,
                    **(exact if kern in ("attention_tkg", "moe_tkg") else loose),
                    package_root=LIB,
                    wrap=wrap,
                    # Fused RoPE reduces the angles modulo 2 pi over all d_head partitions of a
                    # tile whose upper half it writes only afterwards (discarding those values).
                    uninitialized="nan" if kw.get("fuse_rope") else "error",
                )
            )
    # The MLP (SiLU gate): mlp picks mlp_tkg up to B*S=96, else mlp_cte; both run in a kernel
    # of ours (_mlp_wrapper).
    for mode, label, shape, kw in (
        ("tkg", "RMS norm", (1, 4, 256, 256), {"norm": True}),
        ("cte", "RMS norm", (1, 128, 256, 256), {"norm": True}),
        (
            "tkg",
            "fused add stored, RMS norm",
            (1, 4, 256, 256),
            {"norm": True, "fused_add": True, "store": True},
        ),
        ("cte", "fused add, RMS norm", (1, 128, 256, 256), {"norm": True, "fused_add": True}),
        # ROW with and without column tiling, as nki-library's tests run it (without, its
        # float32 scales load through a dma_transpose with dge_mode 3, "none").
        (
            "tkg",
            "row fp8, column tiling, RMS norm",
            (1, 4, 256, 256),
            {"norm": True, "quant": "ROW", "column_tiling": True},
        ),
        ("tkg", "row fp8, RMS norm", (1, 4, 256, 256), {"norm": True, "quant": "ROW"}),
        ("tkg", "static fp8, RMS norm", (1, 4, 256, 256), {"norm": True, "quant": "STATIC"}),
        # mlp_cte's quantized forms take fp8 tokens (as nki-library's tests pass them) and need
        # H a multiple of its 1024-wide weight tiles.
        ("cte", "static fp8, fp8 tokens", (1, 128, 1024, 256), {"quant": "STATIC", "fp8": 1}),
        ("cte", "row fp8, fp8 tokens", (1, 128, 1024, 256), {"quant": "ROW", "fp8": 1}),
        # Refused, by documented rules (docs/nki.md): bf16 tokens (its PE transpose writes bf16
        # into an fp8 PSUM tile, mlp_cte_transpose.py:258) and H 256 (its strided weight load
        # steps partitions by 512 elements of a 2048-element tile, mlp_cte_projection.py:1119).
        ("cte", "static fp8, bf16 tokens", (1, 128, 1024, 256), {"quant": "STATIC"}),
        ("cte", "static fp8, fp8 tokens, H 256", (1, 128, 256, 256), {"quant": "STATIC", "fp8": 1}),
        # At LNC=2 (each core half the tokens) with 256 tokens. With 128 the kernel's own
        # layouts disagree: each core transposes its 64 tokens into 128-token PSUM slots per
        # hidden subtile and copies the slots whole (mlp_cte_transpose.py:333 reads the 64 it
        # never wrote), then its projection steps the subtiles by 64.
        ("cte", "static fp8, fp8 tokens", (1, 256, 1024, 256), {"quant": "STATIC", "fp8": 2}),
        ("cte", "row fp8, fp8 tokens", (1, 256, 1024, 256), {"quant": "ROW", "fp8": 2}),
        ("cte", "static fp8, 128 fp8 tokens", (1, 128, 1024, 256), {"quant": "STATIC", "fp8": 2}),
    ):
        lnc = kw.get("fp8", 1)
        cases.append(
            Case(
                f"nkilib mlp_{mode} ({label})" + (" (LNC=2)" if lnc == 2 else ""),
                lib,
                f"nkilib.core.mlp.mlp_{mode}.mlp_{mode}",
                f"mlp_{mode}",
                _mlp_inputs(*shape, **kw),
                ref_mlp,
                grid=lnc if lnc == 2 else None,
                # mlp_tkg (_ref_mlp_tkg), mlp_cte's bf16 form (_ref_mlp_cte) and its fp8-token
                # forms (_ref_mlp_fp8_tokens) follow their instructions bit for bit
                **exact,
                package_root=LIB,
                wrap=_mlp_wrapper,
            )
        )
    # The same at LNC=2 (two cores, each a share of H or of the tokens).
    lnc2 = {"nkilib qkv tkg (RMS norm, bias)", "nkilib qkv cte (RMS norm, bias)"}
    lnc2 |= {"nkilib mlp_tkg (RMS norm)", "nkilib mlp_cte (RMS norm)"}
    lnc2 |= {"nkilib mlp_tkg (row fp8, column tiling, RMS norm)"}
    lnc2 |= {"nkilib mlp_tkg (row fp8, RMS norm)"}
    lnc2 |= {"nkilib mlp_tkg (static fp8, RMS norm)"}
    # attention_tkg at LNC=2 shards s_prior (256) or, at s_prior 128, the batch.
    lnc2 |= {f"nkilib attention_tkg{label}" for label, _, _ in _ATTN_TKG_CASES}
    lnc2 |= {f"nkilib moe_tkg{label}" for label, _, _ in _MOE_TKG_CASES}
    for case in [c for c in cases if c.name in lnc2 or c.name.startswith("nkilib output_proj")]:
        check = case.reference  # (not `ref`: the nki-samples-reference repository's name)
        if check in (ref_out_proj_tkg, ref_qkv):
            check = functools.partial(check, lnc=2)
        cases.append(
            dataclasses.replace(case, name=f"{case.name} (LNC=2)", grid=2, reference=check)
        )
    # The MoE block (RMSNorm, router, experts): LNC=2 only, by its own assert. With its own
    # defaults (router_pre_norm, no norm_topk_prob) the selective form keeps the affinities in
    # SBUF (router_topk's core_barrier on them, SBUF data accepted) and gathers them with
    # local_gather over all 128 partitions of a tile whose first T rows it wrote: new memory
    # NaN there, as for moe_tkg's HBM-affinity form.
    blocks = (
        ("selective, normalised top k", {"norm_topk_prob": True}, "error"),
        ("selective, its defaults", {}, "nan"),
        ("all experts", {"is_all_expert": True, "rank_id": True}, "error"),
    )
    cases += [
        Case(
            f"nkilib moe_block_tkg ({label}) (LNC=2)",
            lib,
            "nkilib.core.moe_block.moe_block_tkg",
            "moe_block_tkg",
            _moe_block_inputs(4, 256, 128, 8, 2, **kw),
            ref_moe_block_tkg,
            grid=2,
            **exact,
            package_root=LIB,
            uninitialized=uninit,
        )
        for label, kw, uninit in blocks
    ]

    # MoE context encoding (bit-exact: _moe_cte_sum follows its roundings).
    def moe_cte(label, inputs, lnc=2, **kw):
        name = f"nkilib moe_cte ({label}, post-scaled) (LNC={lnc})"
        module = "nkilib.core.moe.moe_cte.moe_cte"
        reference = functools.partial(ref_moe_cte, lnc=lnc)
        kw.update(grid=lnc, **exact, package_root=LIB)
        return Case(name, lib, module, "moe_cte", inputs, reference, **kw)

    # Sharded on blocks: core k takes blocks k, k + 2, ... (its PING_PONG order assumes two
    # cores: at LNC=1 it reads block_to_expert with step 2, so one block only there). It
    # leaves its output's padding row unwritten (new memory NaN here).
    for lnc, e in ((1, 1), (2, 2)):
        inputs = _moe_cte_inputs(256, 512, 256, e, 256, "shard_on_block")
        cases.append(moe_cte("shard on block", inputs, lnc, uninitialized="nan"))
    # The hybrid form: a static loop over N - E blocks, then a dynamic one (a register bound)
    # up to the padded blocks (here one, of padding positions only, which it leaves out). It
    # needs two shards (its own assert); its core_barrier on an SBUF counter runs since SBUF
    # data is accepted (docs/nki.md, "Inferred, not documented").
    inputs = _moe_cte_inputs(256, 512, 256, 2, 256, "shard_on_i_hybrid")
    cases.append(moe_cte("shard on I, hybrid", inputs))
    # The dropping form (training: a block of 1024 tokens per expert; its block loop tiles B by
    # 1024), its three outputs; LNC=2 only, as shard on I (the same IndexError at LNC=1).
    inputs = _moe_cte_inputs(1024, 512, 256, 2, 1024, "shard_on_i_dropping")
    cases.append(moe_cte("shard on I, dropping", inputs))
    # Sharded on I: it needs two shards, so it runs at LNC=2 only.
    cases.append(moe_cte("shard on I", _moe_cte_inputs(256, 512, 256, 2, 256)))
    # nki-library's experimental transformer blocks (h70): the token-generation attention
    # block (RMS norm, QKV, RoPE, attention over a flat KV cache, the cache update, output
    # projection) against the references above composed.
    no_proj = {"W_out": None, "bias_out": None, "update_cache": False}
    norms = {"qk_norm_pre": True, "qk_norm_post": True, "sink": True}
    s1, s2 = (2, 1, 256, 2, 64, 256), (2, 2, 256, 2, 64, 256)  # B, S, H, heads, d, S_ctx
    for label, shape, kw, lnc in (
        ("B 2, S 1, batched cache update", s1, {}, 2),
        ("B 2, S 1, batched cache update", s1, {}, 1),
        ("S 2, K transposed, cache update", s2, {"K_cache_transposed": True}, 2),
        ("S 2, K transposed, cache update", s2, {"K_cache_transposed": True}, 1),
        ("S 2, no projection, new k and v returned", s2, no_proj, 2),
        ("d_head 128, QK norms, sink", (2, 1, 256, 1, 128, 256), norms, 2),
        ("S 1, interleaved RoPE", s1, {"rope_contiguous_layout": False}, 2),
        ("S 2, no projection, output in SBUF", s2, {**no_proj, "out_in_sb": True}, 2),
        ("S 2, X in SBUF", s2, {"x_in_sb": True}, 2),
        ("fp8 KV cache, scale 8", s1, {"kv_scale": 8.0}, 2),
        ("static fp8 QKV and output projection", s1, {"static_fp8": True}, 2),
        ("block KV cache, block_len 16", s1, {"block_len": 16}, 2),
        ("block KV cache, block_len 16", s1, {"block_len": 16}, 1),
    ):
        cases.append(
            Case(
                f"nkilib attention_block_tkg ({label}) (LNC={lnc})",
                lib,
                "nkilib.experimental.transformer.attention_block_tkg",
                "attention_block_tkg",
                _attn_block_inputs(*shape, **kw),
                functools.partial(ref_attention_block_tkg, lnc=lnc),
                grid=lnc,
                **exact,
                package_root=LIB,
                # At LNC=2 its attention (use_gpsimd_sb2sb) exchanges the softmax maxima of a
                # tile padded to 16 partitions, of which it wrote s_active * B * H only.
                uninitialized="nan" if lnc == 2 else "error",
                wrap=_sbuf_out_wrapper
                if kw.get("out_in_sb")
                else _sbuf_in_wrapper
                if kw.get("x_in_sb")
                else None,
            )
        )
    # KV data parallelism over 2 ranks (trn2core.nki.run(ranks=2)): Q all-gathered across
    # the ranks, each attending over its batch's KV cache with both q heads, the attention
    # all-gathered back (HBM all_gather along dimension 0, rank_id selecting the slices).
    for lnc in (1, 2):
        cases.append(
            Case(
                f"nkilib attention_block_tkg (KVDP 2, B 2, S 1) (LNC={lnc})",
                lib,
                "nkilib.experimental.transformer.attention_block_tkg",
                "attention_block_tkg",
                _kvdp_inputs(2, 1, 256, 64, 256, 2),
                functools.partial(ref_attention_block_kvdp, lnc=lnc),
                grid=lnc,
                **exact,
                package_root=LIB,
                uninitialized="nan" if lnc == 2 else "error",
                ranks=2,
            )
        )
    # The whole token-generation layer (attention block, MLP, residual adds), two layers, on
    # one tensor-parallel rank (no replica groups: no all-reduce). It imports nki-library's
    # mlp.py, which does not parse upstream: the harness stands in for it (_mlp_stand_in).
    for lnc in (2, 1):
        cases.append(
            Case(
                f"nkilib transformer_tkg (2 layers, one rank) (LNC={lnc})",
                lib,
                "nkilib.experimental.transformer.transformer_tkg",
                "transformer_tkg",
                _transformer_inputs(2, 2, 256, 2, 64, 256, 256),
                functools.partial(ref_transformer_tkg, lnc=lnc),
                grid=lnc,
                **exact,
                package_root=LIB,
                uninitialized="nan" if lnc == 2 else "error",  # as attention_block_tkg
                wrap=_transformer_wrapper,
                stand_ins=(("nkilib.core.mlp.mlp", _mlp_stand_in),),
            )
        )
    # Tensor-parallel over 2 and 4 ranks (replica_groups: one group of all): its HBM path
    # all-reduces the attention block's and the MLP's outputs (nki.collectives.all_reduce,
    # HBM) before each residual add; each rank its own heads, caches and MLP shard.
    for ranks, lnc in ((2, 1), (2, 2), (4, 1)):
        cases.append(
            Case(
                f"nkilib transformer_tkg (2 layers, {ranks} ranks) (LNC={lnc})",
                lib,
                "nkilib.experimental.transformer.transformer_tkg",
                "transformer_tkg",
                _transformer_tp_inputs(ranks, 2, 2, 256, 2, 64, 256, 256),
                ref_transformer_tkg_tp,
                grid=lnc,
                rtol=2e-2,
                atol=2e-2,
                package_root=LIB,
                uninitialized="nan" if lnc == 2 else "error",
                wrap=lambda sub, n=ranks: _transformer_wrapper(sub, n),
                stand_ins=(("nkilib.core.mlp.mlp", _mlp_stand_in),),
                ranks=ranks,
            )
        )
    # The MoE backward pass (dropless): its gradients of the tokens, the affinities and both
    # weights, bit-exact against our own with its roundings (ref_moe_bwd). LNC=2 only: it calls
    # core_barrier whatever the LNC, and each core takes half the block's 128-token tiles
    # (B = 256: one each). The MoE forward sharded on H (each core a half of H; gate and up
    # summed across the cores with sendrecv, whatever the LNC: LNC=2 only too; bit-exact). The
    # collective topk_reduce sums each token's K rows of an all_to_all_v output buffer (no
    # collective call of its own; LNC=2 shards H).
    exp = "nkilib.experimental"
    topk = (f"{exp}.collectives.topk_reduce", "topk_reduce", _topk_reduce_inputs(8, 2, 3, 256))

    def fg(**kw):
        return (f"{exp}.collectives.fg_allgather", "fine_grained_allgather",
                _fg_allgather_inputs(128, 128, 4, **kw))  # fmt: skip

    def sb2sb(kernel, m, k):
        return (f"{exp}.collectives.sb2sb_allgather", kernel, _allgather_inputs(m, k, 4))

    nz = (f"{exp}.benchmark.find_nonzero_indices_with_count", "find_nonzero_indices_with_count",
          lambda r: ((_sparse(r, 1, 256),), {}))  # fmt: skip
    for label, (module, kernel, inputs), check, lnc, opts in (
        ("blockwise_mm_bwd (dropless, SiLU)",
         (f"{exp}.moe.bwd.blockwise_mm_backward", "blockwise_mm_bwd",
          _moe_bwd_inputs(256, 256, 128, 2, 256)), ref_moe_bwd, 2, exact),
        ("blockwise_mm_bwd (dropless, Swish)",
         (f"{exp}.moe.bwd.blockwise_mm_backward", "blockwise_mm_bwd",
          _moe_bwd_inputs(256, 256, 128, 2, 256, "Swish")), ref_moe_bwd, 2, exact),
        ("blockwise_mm_baseline_shard_hidden (post-scaled)",
         (f"{exp}.moe.forward.bwmm_shard_on_H", "blockwise_mm_baseline_shard_hidden",
          _moe_shard_h_inputs(256, 512, 256, 2, 256)), ref_moe_shard_h, 2, exact),
        ("topk_reduce (T 8, K 2, 3 source ranks)", topk, ref_topk_reduce, 1, {}),
        ("topk_reduce (T 8, K 2, 3 source ranks)", topk, ref_topk_reduce, 2, {}),
        # SBUF all-gathers across 4 ranks (each its own input; trn2core.nki.run(ranks=4)):
        # every rank's output is the four inputs side by side, bit for bit. The tiled form
        # at LNC=2 gives each physical core half of the 128-row tiles.
        ("allgather_sb2sb (bf16 64 x 96, 4 ranks)", sb2sb("allgather_sb2sb", 64, 96),
         ref_allgather, 1, {"ranks": 4}),
        ("allgather_sb2sb_tiled (bf16 256 x 64, 4 ranks)", sb2sb("allgather_sb2sb_tiled", 256, 64),
         ref_allgather, 1, {"ranks": 4}),
        ("allgather_sb2sb_tiled (bf16 256 x 64, 4 ranks)", sb2sb("allgather_sb2sb_tiled", 256, 64),
         ref_allgather, 2, {"ranks": 4}),
        # The ring all-gather (collective_permute_implicit, double-buffered; at LNC=2 two
        # channels a core): its SBUF path, and its HBM path (force_hbm_cc) at LNC=1.
        ("fine_grained_allgather (bf16 128 x 128, 4 ranks, SBUF)", fg(), ref_fg_allgather, 1,
         {"ranks": 4, "decode": _fg_rows}),
        ("fine_grained_allgather (bf16 128 x 128, 4 ranks, SBUF)", fg(), ref_fg_allgather, 2,
         {"ranks": 4, "decode": _fg_rows}),
        ("fine_grained_allgather (bf16 128 x 128, 4 ranks, HBM)", fg(force_hbm_cc=True),
         ref_fg_allgather, 1, {"ranks": 4, "decode": _fg_rows}),
        # It loads the input into partition 0 of a 128-partition tile; nonzero_with_count
        # also reads partitions 16, 32, .. 112 (one per GpSimd core), whose results it drops.
        ("find_nonzero_indices_with_count (T 256)", nz, ref_nonzero_with_count, 1,
         {"uninitialized": "nan"}),
        # Flash attention's backward pass (GQA: two query heads a key/value head; LNC=2
        # shards the batch x key/value heads, as nki-library's tests run it), mixed precision
        # (float32 -lse, D and accumulators) and the default (bf16): bit-exact against the
        # kernel's roundings (ref_attention_bwd).
        ("attention_bwd (causal, GQA, mixed precision)",
         ("nkilib.core.attention.attention_bwd", "attention_bwd",
          _attention_bwd_inputs(1, 4, 2, 512, 64, True)), ref_attention_bwd, 2, exact),
        ("attention_bwd (not causal, mixed precision)",
         ("nkilib.core.attention.attention_bwd", "attention_bwd",
          _attention_bwd_inputs(1, 1, 1, 512, 64, False)), ref_attention_bwd, 1, exact),
        ("attention_bwd (causal, GQA)",
         ("nkilib.core.attention.attention_bwd", "attention_bwd",
          _attention_bwd_inputs(1, 4, 2, 512, 64, True, False)), ref_attention_bwd, 2, exact),
        ("attention_bwd (not causal)",
         ("nkilib.core.attention.attention_bwd", "attention_bwd",
          _attention_bwd_inputs(1, 1, 1, 512, 64, False, False)), ref_attention_bwd, 1, exact),
        # LNC=2 only (the two cores' partial outputs combined by an exchange and a maximum).
        ("indexed_flatten (E 4, T 256, f_len 16)",
         ("nkilib.core.subkernels.indexed_flatten", "indexed_flatten", _indexed_flatten_inputs),
         ref_indexed_flatten, 2, {}),
    ):  # fmt: skip
        opts = {"rtol": 2e-2, "atol": 1e-2, **opts}
        cases.append(
            Case(
                f"nkilib {label} (LNC={lnc})",
                lib,
                module,
                kernel,
                inputs,
                check,
                grid=lnc,
                package_root=LIB,
                **opts,
            )  # fmt: skip
        )
    cases += _collective_test_cases(lib)
    for rows in (256, 300):
        cases.append(
            Case(
                f"sdk-2.26 rmsnorm {rows} rows",
                old,
                f"{OLD}/rmsnorm/rmsnorm_nki_kernels.py",
                "nki_rmsnorm_kernel",
                lambda r, n=rows: ((_f32(r, n, 512), _f32(r, 512)), {}),
                ref_rmsnorm,
                **exact,
            )
        )
    for v in ("v1", "v2"):
        for rows in (256, 300):
            cases.append(
                Case(
                    f"sdk-2.26 layernorm_{v} {rows} rows",
                    old,
                    f"{OLD}/layernorm/layernorm_nki_kernel.py",
                    f"nki_layernorm_kernel_{v}",
                    lambda r, n=rows: ((_f32(r, n, 512), 1e-5, _f32(r, 512), _f32(r, 512)), {}),
                    functools.partial(ref_layernorm, form=v),
                    **exact,
                )
            )
    cases += [
        Case(
            "sdk-2.26 sd_attention",
            old,
            f"{OLD}/sd_attention/sd_attention_nki_kernels.py",
            "fused_self_attn_for_SD_small_head_size",
            lambda r: (tuple(_f32(r, 512, 64, lo=0.0) for _ in range(3)), {}),
            ref_sd_attention,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "samples-ref add nx8x128x512",
            ref,
            f"{REF}/tutorial.py",
            "add_kernel_nx8x128x512",
            lambda r: ((_f32(r, 2, 8, 128, 512), _f32(r, 2, 8, 128, 512), 2 * 8 * 128 * 512), {}),
            ref_add_n_elements,
            grid=2,
        ),
        Case(
            "samples-ref quantized_double_row_matmul",
            ref,
            f"{REF}/double_row_matmul.py",
            "quantized_double_row_matmul",
            _double_row_inputs,
            ref_double_row,
            rtol=2e-2,
            atol=1e-3,  # outputs ~1000, within 1 % (bf16 partial sums); a wrong rhs layout: 6.7 %
        ),
        Case(
            "samples-ref adaptive_avg_pool2d",
            ref,
            f"{REF}/vision.py",
            "adaptive_avg_pool2d_kernel",
            lambda r: ((_f32(r, 2, 8, 13, 11),), {"output_size": (4, 3)}),
            ref_adaptive_avg_pool,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "samples-ref resize_nearest",
            ref,
            f"{REF}/vision.py",
            "resize_nearest_fixed_dma_kernel",
            lambda r: ((_f32(r, 1, 30, 20, 8),), {"out_shape": (1, 59, 38, 8)}),
            ref_resize_nearest,
            **exact,
        ),
        Case(
            "samples-ref select_and_scatter",
            ref,
            f"{REF}/vision.py",
            "select_and_scatter_kernel",
            lambda r: ((_f32(r, 2, 64, 16, 16, lo=0.0), _f32(r, 2, 64, 8, 8, lo=0.0)), {}),
            ref_select_and_scatter,
            rtol=0.0,
            atol=0.0,
        ),
    ]
    cases += [
        Case(
            "samples-ref allocated_fused_rms_norm_qkv",
            ref,
            f"{REF}/allocated_fused_linear.py",
            "allocated_fused_rms_norm_qkv",
            # dim a multiple of 512: the kernel transposes 512 columns at a time (its assert
            # asks only 128, but a smaller dim indexes past its SBUF tile).
            lambda r: ((_f32(r, 1, 256, 512).astype(BF16), _f32(r, 512, 512).astype(BF16)), {}),
            ref_rms_norm_qkv,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "samples-ref allocated_fused_self_attn (SD)",
            ref,
            f"{REF}/allocated_attention.py",
            "allocated_fused_self_attn_for_SD_small_head_size",
            lambda r: (
                (
                    _f32(r, 1, 128, 1024, lo=0.0),
                    _f32(r, 1, 128, 1024, lo=0.0),
                    _f32(r, 1, 1024, 128, lo=0.0),
                ),
                {},
            ),  # fmt: skip
            ref_sd_attention_t,
            rtol=0.0,
            atol=0.0,
        ),
        # The reference attention.py's own SD attention (q [b, d, s], k and v [b, s, d]).
        Case(
            "samples-ref fused_self_attn (SD)",
            ref,
            f"{REF}/attention.py",
            "fused_self_attn_for_SD_small_head_size",
            lambda r: (tuple(_f32(r, *s, lo=0.0) for s in ((1, 64, 512), *[(1, 512, 64)] * 2)), {}),
            lambda q, k, v, **_: np.stack(
                [ref_sd_attention(q[i].T, k[i], v[i]) for i in range(q.shape[0])]
            ),
            rtol=0.0,
            atol=0.0,
        ),
    ]
    # The reference tree's rmsnorm_quant (a legacy form of nki-library's row above): its last
    # gamma tile is broadcast through the PE from a mask-indexed view (t[idx][mask]).
    cases.append(
        Case(
            "samples-ref rmsnorm_quant (row fp8)",
            ref,
            RMSQ_REF,
            "rmsnorm_quant_kernel",
            lambda r: (
                (_f32(r, 2, 100, 640, lo=-3.0, hi=3.0).astype(BF16), _f32(r, 640).astype(BF16)),
                {"kargs": _lib_attr(RMSQ_REF, "RmsNormQuantKernelArgs")(lower_bound=0.0)},
            ),
            ref_rmsnorm_quant_legacy,
            rtol=0.0,
            atol=0.0,
            package_root="src",
            decode=decode_row_quant,
        )
    )
    # flash_attn_bwd: float32 against float64 (max |err| about 5e-7 of the largest). Dropout is
    # seeded per (query tile, key chunk), in the forward whose o the inputs hold and in the
    # backward alike: the reference's mask is trn2core's stream (ours, _dropout_keep).
    for name, shape, grid, drop in (
        ("causal", (1, 1, 64, 512, True), (1, 1), ()),
        ("causal, dropout 0.1", (1, 1, 64, 512, True), (1, 1), (0.1, 7)),
        ("2 heads, not causal", (1, 2, 128, 256, False), (1, 2), ()),
    ):
        cases.append(
            Case(
                f"samples-ref flash_attn_bwd ({name})",
                ref,
                f"{REF}/attention.py",
                "flash_attn_bwd",
                lambda r, a=shape + drop: _attention_bwd_ref_inputs(r, *a),
                ref_attention_bwd_ref,
                grid=grid,
                rtol=1e-4,
                atol=1e-5,
            )
        )
    # flash_fwd, and with dropout: each [128, 512] tile of P after nl.random_seed(seed + its
    # index), as flash_attn_bwd seeds it; the kept elements scaled in float32.
    for name, seed, kw in (("", 0, {}), (" (dropout 0.1)", 7, {"dropout_p": 0.1})):
        cases.append(
            Case(
                f"samples-ref flash_fwd{name}",
                ref,
                f"{REF}/attention.py",
                "flash_fwd",
                lambda r, seed=seed, kw=kw: (
                    (
                        *(_f32(r, 1, 1, 64, 2048).astype(BF16) for _ in range(2)),
                        _f32(r, 1, 1, 2048, 64).astype(BF16),
                        np.full(1, seed, np.int32),
                    ),
                    dict(kw),
                ),
                ref_flash_fwd,
                grid=(1, 1),
                rtol=0.0,
                atol=0.0,
            )
        )
    return cases + _nxdi_cases()


# ----------------------------------------------------------------------------- NxD / NxDI
# The NKI kernels of neuronx-distributed-inference's contributed models (and src/) that target
# Trainium2; see docs/nki.md ("The public corpus") for the inventory of both repositories.
NXDI = "neuronx-distributed-inference"
QWEN = "contrib/models/Qwen3.5-2B/src/nki_kernels"  # Qwen3.5-35B-A3B holds identical copies


def ref_qk_norm_rope(q, k, q_gamma, k_gamma, cos, sin, eps):
    """Per head of 256: RMS norm times gamma, then RoPE on the first 64 dimensions (rotate
    half: [a, b] -> [a cos - b sin, b cos + a sin]); [B, S, H*256] -> [B, H, S, 256]. With
    the kernel's float32 steps: the squares summed in order, times 1/256, plus eps, rsqrt by
    trn2core's activation rule, x times it, times gamma; each rotation product and sum
    rounded."""
    from trn2core.reference import activation_values

    f32 = np.float32

    def one(x, gamma):
        b, s, w = x.shape
        x = x.astype(f32).reshape(b, s, w // 256, 256).transpose(0, 2, 1, 3)
        ss = np.cumsum(x * x, axis=-1, dtype=f32)[..., -1:]
        t = ((ss * f32(1 / 256)).astype(f32) + f32(eps)).astype(f32)
        n = ((x * activation_values("rsqrt", t)).astype(f32) * gamma.astype(f32)).astype(f32)
        c, sn = cos[:, None, :, :64], sin[:, None, :, :64]
        lo, hi = n[..., :32].copy(), n[..., 32:64].copy()
        n[..., :32] = (lo * c[..., :32]).astype(f32) + (-hi * sn[..., :32]).astype(f32)
        n[..., 32:64] = (hi * c[..., 32:]).astype(f32) + (lo * sn[..., 32:]).astype(f32)
        return n

    return one(q, q_gamma), one(k, k_gamma)


def _qk_norm_rope_inputs(r, b=1, s=130, hq=2, hk=1):
    ang = r.uniform(0, 3, size=(b, s, 64))
    return (
        (
            _f32(r, b, s, hq * 256),
            _f32(r, b, s, hk * 256),
            _f32(r, 256, lo=0.5, hi=1.5),
            _f32(r, 256, lo=0.5, hi=1.5),
            np.cos(ang).astype(np.float32),
            np.sin(ang).astype(np.float32),
            1e-6,
        ),
        {},
    )


def _deltanet_scan(q, k, v, g, beta, state=None):
    """The gated delta rule per token (state S [k, v]): S = exp(g) S; S += k (beta (v - S.T k)).T;
    o = S.T q. Returns the outputs [S, v] and the final state."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    st = np.zeros((k.shape[1], v.shape[1])) if state is None else state.astype(np.float64)
    out = np.zeros_like(v)
    for t in range(q.shape[0]):
        st = st * np.exp(g[t])[:, None]
        delta = beta[t] * (v[t] - st.T @ k[t])
        st = st + np.outer(k[t], delta)
        out[t] = st.T @ q[t]
    return out.astype(np.float32), st.astype(np.float32)


def _deltanet_inputs(r, s, state=False, bh=None):
    """q, k unit-norm rows (as the model's L2-normalised q and k), v, log-decay g < 0 and write
    gate beta in (0, 1) per token broadcast over 128 (or one per head with ``bh``)."""
    n = s if bh is None else bh
    q, k = (_l2(_f32(r, n, 128)) for _ in range(2))
    v = _f32(r, n, 128)
    g, beta = _f32(r, n, 1, lo=-0.5, hi=-0.01), _f32(r, n, 1, lo=0.1, hi=0.9)
    if bh is None:
        g, beta = np.repeat(g, 128, axis=1), np.repeat(beta, 128, axis=1)
    args = (q.astype(np.float32), k.astype(np.float32), v, g, beta)
    if state:
        rows = 128 * (bh or 1)
        args += (_f32(r, rows, 128, lo=-0.1, hi=0.1),)
    return args, {}


def _deltanet_recurrent(q, k, v, g, beta, state=None):
    """_deltanet_scan with nki_deltanet's recurrent kernels' float32 steps: S times exp(g)
    (trn2core's activation rule); S.T k and S.T q PSUM's float32 sums over k (in order);
    (v - S.T k) times beta; S plus k delta.T; each step rounded."""
    from trn2core.reference import activation_values, gemm

    f32 = np.float32
    q, k, v, g, beta = (np.asarray(a, f32) for a in (q, k, v, g, beta))
    st = np.zeros((k.shape[1], v.shape[1]), f32) if state is None else state.astype(f32)
    out = np.zeros_like(v)
    for t in range(q.shape[0]):
        st = (st * activation_values("exp", g[t])[:, None]).astype(f32)
        delta = ((v[t] - gemm(st.T, k[t][:, None])[:, 0]).astype(f32) * beta[t]).astype(f32)
        st = (st + (k[t][:, None] * delta[None, :]).astype(f32)).astype(f32)
        out[t] = gemm(st.T, q[t][:, None])[:, 0]
    return out, st


def ref_deltanet_fwd(q, k, v, g, beta):
    return _deltanet_recurrent(q, k, v, g, beta)[0]


def ref_deltanet_fwd_state(q, k, v, g, beta):
    return _deltanet_recurrent(q, k, v, g, beta)


def ref_deltanet_step(q, k, v, g, beta, state):
    return _deltanet_recurrent(q, k, v, g, beta, state)


def ref_deltanet_step_batched(q, k, v, g, beta, state):
    outs, states = [], []
    for i in range(q.shape[0]):
        row = slice(i, i + 1)
        gb, bb = np.repeat(g[row], 128, axis=1), np.repeat(beta[row], 128, axis=1)
        o, s = _deltanet_recurrent(q[row], k[row], v[row], gb, bb, state[128 * i : 128 * i + 128])
        outs.append(o)
        states.append(s)
    return np.concatenate(outs), np.concatenate(states)


def _masks():
    """The chunked kernels' constants: strict lower triangle, identity, lower with diagonal."""
    one = np.ones((128, 128), np.float32)
    return np.tril(one, -1), np.eye(128, dtype=np.float32), np.tril(one)


def _l2(x, scale=1.0):
    x = x.astype(np.float64)
    return x / np.sqrt(np.maximum((x * x).sum(axis=-1, keepdims=True), 1e-12)) * scale


def _chunk_step_inputs(r):
    (q, k, v, g, beta, st), _ = _deltanet_inputs(r, 128, state=True)
    gc = np.cumsum(g[:, 0].astype(np.float64)).astype(np.float32)
    g_cum = np.repeat(gc[:, None], 128, axis=1)
    g_last = np.full((128, 128), gc[-1], np.float32)
    return (q * np.float32(128**-0.5), k, v, beta, g_cum, g_last, st, *_masks()), {}


def _chunk(q, k, v, beta, gc, gl, state, lmask, eye, lmask_d):
    """One 128-token chunk of the gated delta rule as nki_deltanet_chunked computes it, in
    float32 steps (trn2core.reference.gemm for every PE product, exp by trn2core's activation
    rule): the decays exp(gc_i - gc_j) under the strict and the diagonal lower masks; A =
    -(k beta k.T) decay, strictly lower; the inverse of (I - A) by six doubling rounds
    (A <- A A, P <- (I + A) P, each masked); the corrected values P (v beta) minus
    P (k beta exp(gc)) S; the output (q exp(gc)) S plus the masked q k.T decay times them;
    the state S exp(gl) plus (k exp(gl - gc)).T times them. gc, gl: [128] float32."""
    from trn2core.reference import activation_values, gemm

    f32 = np.float32

    def mul(a, b):
        return (a * b).astype(f32)

    kb, vb = mul(k, beta), mul(v, beta)
    egc = activation_values("exp", gc)[:, None]

    def decay(mask):
        return mul(activation_values("exp", (mul(mask, gc[:, None]) - mul(gc, mask))), mask)

    a = mul(-mul(gemm(kb, k.T), decay(lmask)), lmask)
    p, ap = (eye + a).astype(f32), a
    for _ in range(6):
        ap = mul(gemm(ap, ap), lmask)
        p = mul(gemm((eye + ap).astype(f32), p), lmask_d)
    v_new = (gemm(p, vb) - gemm(gemm(p, mul(kb, egc)), state)).astype(f32)
    out = gemm(mul(q, egc), state) + gemm(mul(gemm(q, k.T), decay(lmask_d)), v_new)
    k_rd = mul(k, activation_values("exp", (gl - gc).astype(f32))[:, None])
    st = mul(state, activation_values("exp", gl)[:, None]) + gemm(k_rd.T, v_new)
    return out.astype(f32), st.astype(f32)


def ref_chunk_step(q, k, v, beta, g_cum, g_last, state, lmask, eye, lmask_d):
    """One chunk (_chunk), its inputs as the kernel takes them (g_cum, g_last broadcast)."""
    f32 = np.float32
    q, k, v, beta, state = (np.asarray(a, f32) for a in (q, k, v, beta, state))
    gc, gl = g_cum[:, 0].astype(f32), g_last[:, 0].astype(f32)
    return _chunk(q, k, v, beta, gc, gl, state, lmask, eye, lmask_d)


def _fused_inputs(r, s, heads=None):
    """Raw q, k (normalised in the kernel), v, g and beta [.., S, 1], a small initial state."""
    lead = () if heads is None else (heads,)
    q, k, v = (_f32(r, *lead, s, 128) for _ in range(3))
    g, beta = _f32(r, *lead, s, 1, lo=-0.5, hi=-0.01), _f32(r, *lead, s, 1, lo=0.1, hi=0.9)
    st = _f32(r, *lead, 128, 128, lo=-0.1, hi=0.1)
    return (q, k, v, g, beta, st, *_masks()), {}


def ref_fused(q, k, v, g, beta, state, *_, normalized=False):
    if q.ndim == 3:  # heads
        outs = [ref_fused(*(a[h] for a in (q, k, v, g, beta, state))) for h in range(q.shape[0])]
        return np.stack([o for o, _ in outs]), np.stack([s for _, s in outs])
    if not normalized:
        q, k = _l2(q, 128**-0.5), _l2(k)
    bc = lambda a: np.repeat(a, 128, axis=1)  # noqa: E731
    return _deltanet_scan(q, k, v, bc(g), bc(beta), state)


def _fused_legacy_inputs(r, s):
    (q, k, *rest), kw = _fused_inputs(r, s)
    return (_l2(q, 128**-0.5).astype(np.float32), _l2(k).astype(np.float32), *rest), kw


def _deltanet_affine(q, k, v, g, beta):
    """The scan as an affine map of its initial state S0 (raw q, k normalised as the fused
    kernels do): outputs = base + out_state @ S0, final state = matrix @ S0 + bias."""
    q, k = _l2(q, 128**-0.5), _l2(k)
    v, g, beta = (np.asarray(a, np.float64) for a in (v, g[:, 0], beta[:, 0]))
    m, b = np.eye(128), np.zeros((128, 128))
    base, ostate = np.zeros((len(q), 128)), np.zeros((len(q), 128))
    for t in range(len(q)):
        m, b = m * np.exp(g[t]), b * np.exp(g[t])
        proj = np.eye(128) - beta[t] * np.outer(k[t], k[t])
        m, b = proj @ m, proj @ b + beta[t] * np.outer(k[t], v[t])
        base[t], ostate[t] = b.T @ q[t], q[t] @ m
    return base, ostate, m, b


def _chunked_affine(q, k, v, g, beta, chunk=128):
    """_deltanet_affine per chunk of 128 tokens, stacked: [N, 128, 128] each."""
    parts = [
        _deltanet_affine(*(a[i : i + chunk] for a in (q, k, v, g, beta)))
        for i in range(0, len(v), chunk)
    ]
    return tuple(np.stack(p).astype(np.float32) for p in zip(*parts, strict=True))


def ref_affine_chunk(q, k, v, g, beta, *_):
    return tuple(a[0] for a in _chunked_affine(q, k, v, g, beta))


def ref_affine_sequence(q, k, v, g, beta, *_):
    return _chunked_affine(q, k, v, g, beta)


def ref_state_summary(k, v, g, beta, *_, segment=512):
    """Per segment of four chunks: its final state as matrix @ S0 + bias."""
    q = np.ones_like(k)  # outputs unused
    parts = [
        _deltanet_affine(*(a[i : i + segment] for a in (q, k, v, g, beta)))[2:]
        for i in range(0, len(v), segment)
    ]
    return tuple(np.stack(p).astype(np.float32) for p in zip(*parts, strict=True))


def _affine_pieces(r, n=3):
    """Per-chunk pieces of norm below one (a contracting prefix, as the decays make it)."""
    base, ostate, mat, bias = (_f32(r, n, 128, 128, lo=-0.05, hi=0.05) for _ in range(4))
    return base, ostate, mat, bias, _f32(r, 128, 128, lo=-0.1, hi=0.1)


def _state_prefix(mat, bias, s0):
    states, s = [], s0.astype(np.float64)
    for m, b in zip(mat.astype(np.float64), bias.astype(np.float64), strict=True):
        states.append(s)
        s = m @ s + b
    return np.stack(states), s


def ref_state_prefix(mat, bias, s0):
    states, s = _state_prefix(mat, bias, s0)
    return states.astype(np.float32), s.astype(np.float32)


def ref_apply_output(base, ostate, states):
    out = base.astype(np.float64) + ostate.astype(np.float64) @ states.astype(np.float64)
    return out.reshape(-1, out.shape[-1]).astype(np.float32)


def ref_prefix_apply_output(base, ostate, mat, bias, s0):
    states, s = _state_prefix(mat, bias, s0)
    return ref_apply_output(base, ostate, states), s.astype(np.float32)


def _mla_inputs(r, b=1, h=2, s=640):
    """GLM-5's MLA decode shapes (d_rope 64, d_c 512, d_v 256), bf16, a uint8 mask."""
    mask = (r.uniform(size=(b * h, s)) < 0.8).astype(np.uint8)
    mask[:, 0] = 1
    args = (
        _f32(r, b * h, 64).astype(BF16),
        _f32(r, b * h, 512).astype(BF16),
        _f32(r, b, s, 576).astype(BF16),
        _f32(r, h, 256, 512, lo=-0.1, hi=0.1).astype(BF16),
        mask,
    )
    return args, {"softmax_scale": 0.0625, "n_heads": h, "seq_len": s}


def ref_mla(q_pe, q_nope, kv, v_absorb, mask, softmax_scale, n_heads, seq_len, **_):
    """Per query: scores = scale (q_pe . k_pe + q_nope . c_kv), -9984 where masked, softmax,
    times c_kv, times the head's v_absorb [d_v, d_c] transposed. With the kernel's roundings:
    per 512-key tile the scores PSUM's float32 sums (the 64 rope rows, then c_kv's 128-row
    chunks), times the scale, plus the float32 penalty (mask * 9984 - 9984); the online
    softmax in float32 (running max from -9984, correction exp(old - new), exp by trn2core's
    activation rule, the running sum times the correction plus the tile's in-order sum, the
    accumulator times the correction plus exp (bf16) times c_kv in PSUM); then times
    exp(-log(sum)), rounded to bf16, times v_absorb^T in PSUM, rounded once."""
    from trn2core.reference import activation_values, gemm

    f32, bf = np.float32, q_pe.dtype
    out = np.zeros((q_pe.shape[0], v_absorb.shape[1]), bf)

    def act(func, x):
        return activation_values(func, np.array([x], f32))[0]

    for bh in range(q_pe.shape[0]):
        cache = kv[bh // n_heads, :seq_len]
        d_c = cache.shape[1] - 64
        run_max, run_sum, acc = f32(-9984.0), f32(0.0), np.zeros((1, d_c), f32)
        for t0 in range(0, seq_len, 512):
            kk = cache[t0 : t0 + 512]
            sc = gemm(q_pe[bh][None], kk[:, :64].T)
            for c in range(0, d_c, 128):
                part = gemm(q_nope[bh][None, c : c + 128], kk[:, 64 + c : 64 + c + 128].T)
                sc = (sc + part).astype(f32)
            pen = (mask[bh, t0 : t0 + 512].astype(f32) * f32(9984.0)).astype(f32) - f32(9984.0)
            sc = ((sc * f32(softmax_scale)).astype(f32) + pen).astype(f32)
            new_max = max(run_max, sc.max())
            corr = act("exp", run_max - new_max)
            e = activation_values("exp", (sc - new_max).astype(f32))
            run_sum = f32(f32(run_sum * corr) + np.cumsum(e, dtype=f32)[-1])
            acc = ((acc * corr).astype(f32) + gemm(e.astype(bf), kk[:, 64:])).astype(f32)
            run_max = new_max
        acc = (acc * act("exp", -act("log", run_sum))).astype(f32)
        out[bh] = gemm(acc.astype(bf), v_absorb[bh % n_heads].T)[0]
    return out


def _cross_attn_inputs(r, bh=2, sq=256, sk=1024):
    """LTX-2's text cross-attention: pre-scaled q, 1024 keys, d 128, bf16; an additive mask
    {0, -10000} over the keys per head."""
    q = (_f32(r, bh, sq, 128) * np.float32(128**-0.5)).astype(BF16)
    mask = np.where(r.uniform(size=(bh, sk)) < 0.7, 0.0, -10000.0).astype(BF16)
    return (q, _f32(r, bh, sk, 128).astype(BF16), _f32(r, bh, sk, 128).astype(BF16), mask), {}


def ref_cross_attn(q, k, v, mask):
    """softmax(q k^T + mask) v with LTX-2's cross_attn_kernel's roundings (float32 operands):
    per 128-key chunk the scores PSUM's sums plus the mask; exp(score - max) by trn2core's
    activation rule; each chunk's in-order sum and its P v product (PSUM) added to the
    running ones in float32; times the float32 reciprocal of the sum, rounded once."""
    from trn2core.reference import activation_values, gemm, reciprocal

    f32 = np.float32
    out = np.zeros(q.shape, q.dtype)
    for b in range(q.shape[0]):
        qf, kf, vf = q[b].astype(f32), k[b].astype(f32), v[b].astype(f32)
        chunks = range(0, kf.shape[0], 128)
        s = np.concatenate([gemm(qf, kf[c : c + 128].T) + mask[b, c : c + 128].astype(f32)
                            for c in chunks], axis=1).astype(f32)  # fmt: skip
        e = activation_values("exp", (s - s.max(axis=1, keepdims=True)).astype(f32))
        tot = o = None
        for c in chunks:
            part = np.cumsum(e[:, c : c + 128], axis=1, dtype=f32)[:, -1]
            pv = gemm(e[:, c : c + 128], vf[c : c + 128])
            tot = part if tot is None else (tot + part).astype(f32)
            o = pv if o is None else (o + pv).astype(f32)
        out[b] = (o * reciprocal(tot, "fp32")[:, None]).astype(f32)
    return out


def _cte_bias_inputs(r, bh=2, sq=512, sk=512, d=64):
    """LTX-2's call: q, k [B*H, S, d] (tp_q, tp_k), bf16, an fp32 additive bias per key
    [B*H, S_kv] (some keys masked with -10000)."""
    q, k, v = (_f32(r, bh, n, d).astype(BF16) for n in (sq, sk, sk))
    bias = np.where(r.uniform(size=(bh, sk)) < 0.8, _f32(r, bh, sk, lo=-4.0, hi=0.0), -10000.0)
    kw = {"scale": 0.125, "causal_mask": False, "tp_q": True, "tp_k": True, "tp_out": False}
    return (q, k, v), {**kw, "bias": bias.astype(np.float32)}


def ref_cte_bias(q, k, v, scale, bias, **_):
    """softmax(scale (q k.T + bias)) v, the bias broadcast over the queries, with the
    kernel's roundings (ref_attention_cte's, the bias added in PSUM)."""
    return ref_attention_cte(q, k.transpose(0, 2, 1), v, scale, False, bias)


def _rolling_buffer_inputs(r, max_b=4, length=3, hidden=256):
    buf = _f32(r, max_b, length, hidden)
    ids, pos = np.array([2, 0, 3], np.int32), np.array([1, 2, 0], np.int32)
    return (buf, _f32(r, len(ids), hidden), ids, pos), {}


def ref_rolling_buffer(buf, hidden, batch_ids, position_ids):
    """The buffer with each hidden state written at [its batch id, its position]."""
    out = buf.copy()
    out[batch_ids, position_ids] = hidden
    return out


def _collective_test_cases(lib: str) -> list[Case]:
    """nki-library's collective test kernels (test_collectives.py; its test framework stood
    in), across ranks (trn2core.nki.run(..., ranks=N)), at the ranks and LNCs its tests use
    (all_to_all: "4 ranks lnc2 or 8 ranks lnc1"), each rank its own input where its test
    gives each one (all_reduce: also four ranks of values of many magnitudes, where the order
    of the sum decides the bits)."""
    out = []
    common = {"rtol": 0.0, "atol": 0.0, "paths": (f"{lib}/src",), "stand_ins": _FRAMEWORK}
    rows = (
        ("all_reduce_hbm_kernel (fp32 128 x 512, 2 ranks)", "all_reduce_hbm_kernel",
         _coll_inputs(2, (128, 512)), ref_coll_all_reduce, 2, 2),
        ("all_reduce_hbm_kernel (fp32 128 x 512, 2 ranks)", "all_reduce_hbm_kernel",
         _coll_inputs(2, (128, 512)), ref_coll_all_reduce, 1, 2),
        ("all_reduce_hbm_kernel (fp32 128 x 512, 4 ranks)", "all_reduce_hbm_kernel",
         _coll_inputs(4, (128, 512)), ref_coll_all_reduce, 1, 4),
        ("all_reduce_hbm_kernel (fp32 64 x 96, groups [[2, 0], [1, 3]])", "all_reduce_hbm_kernel",
         _coll_inputs(4, (64, 96), [[2, 0], [1, 3]]), ref_coll_all_reduce, 2, 4),
        ("all_gather_hbm_kernel (fp32 128 x 512, 2 ranks)", "all_gather_hbm_kernel",
         _coll_inputs(2, (128, 512), extra=(2,)), ref_coll_all_gather, 2, 2),
        ("all_gather_hbm_kernel (fp32 128 x 512, 2 ranks)", "all_gather_hbm_kernel",
         _coll_inputs(2, (128, 512), extra=(2,)), ref_coll_all_gather, 1, 2),
        ("reduce_scatter_hbm_kernel (fp32 256 x 512, 2 ranks)", "reduce_scatter_hbm_kernel",
         _coll_inputs(2, (256, 512), extra=(2,)), ref_coll_reduce_scatter, 2, 2),
        ("reduce_scatter_hbm_kernel (fp32 256 x 512, 2 ranks)", "reduce_scatter_hbm_kernel",
         _coll_inputs(2, (256, 512), extra=(2,)), ref_coll_reduce_scatter, 1, 2),
        ("all_to_all_hbm_kernel (fp32 512 x 512, 4 ranks)", "all_to_all_hbm_kernel",
         _coll_inputs(4, (512, 512)), ref_coll_all_to_all, 2, 4),
        ("all_to_all_hbm_kernel (fp32 1024 x 512, 8 ranks)", "all_to_all_hbm_kernel",
         _coll_inputs(8, (1024, 512)), ref_coll_all_to_all, 1, 8),
        ("rank_id_kernel (2 ranks)", "rank_id_kernel", _rank_id_inputs(2), ref_coll_rank_id,
         2, 2),
        ("rank_id_kernel (2 ranks)", "rank_id_kernel", _rank_id_inputs(2), ref_coll_rank_id,
         1, 2),
        ("dma_copy_rank_id_kernel (2 ranks)", "dma_copy_rank_id_kernel",
         _rank_id_inputs(2, True), ref_coll_rank_id, 2, 2),
        ("dma_copy_rank_id_kernel (2 ranks)", "dma_copy_rank_id_kernel",
         _rank_id_inputs(2, True), ref_coll_rank_id, 1, 2),
    )  # fmt: skip
    for label, kernel, inputs, ref, lnc, ranks in rows:
        out.append(Case(f"nkilib test {label} (LNC={lnc})", lib, COLL_TESTS, kernel, inputs, ref,
                        grid=lnc, ranks=ranks, **common))  # fmt: skip
    # TP4 -> TP2DP2 (nki-library's enabled configuration): 4 ranks at LNC=2, DP groups of 2.
    for layout in ("NBSd", "dBnS"):
        for input_rank in (False, True):
            how = "rank input" if input_rank else "ncc.rank_id"
            out.append(
                Case(
                    f"nkilib test attn_q_batch_shard ({layout}, {how}, TP2DP2, 4 ranks) (LNC=2)",
                    lib,
                    COLL_TESTS,
                    "attn_q_batch_shard",
                    _batch_shard_inputs(4, 2, 8, layout, input_rank),
                    ref_coll_batch_shard,
                    grid=2,
                    ranks=4,
                    wrap=_batch_shard_wrap,
                    **common,
                )
            )
    return out


def _absent_modules(*names: str) -> tuple[tuple[str, Callable[[], types.ModuleType]], ...]:
    """Stand-ins for packages a kernel's module imports for its host code only (NxD's
    ``neuronx_distributed``, which needs torch_xla and neuronx-cc's bundled kernels to import;
    NxDI's own modules): each name (and its parents) an empty package whose names are _Absent,
    so the module's top level (imports, annotations, a subclass of an absent class) runs and
    its kernels, which use none of them, load."""
    full: list[str] = []
    for n in names:
        parts = n.split(".")
        for i in range(1, len(parts) + 1):
            if ".".join(parts[:i]) not in full:
                full.append(".".join(parts[:i]))

    def maker(name: str) -> Callable[[], types.ModuleType]:
        def make() -> types.ModuleType:
            mod = types.ModuleType(name)
            mod.__path__ = []  # type: ignore[attr-defined]
            mod.__getattr__ = lambda attr: _Absent(f"{name}.{attr}", (), {})  # type: ignore[attr-defined]
            return mod

        return make

    return tuple((n, maker(n)) for n in full)


def _split_dim0_inputs(r, shape=(4, 3, 5), rank=2, parts=4):
    """A tensor whose row of F = 15 elements per partition splits unevenly over two cores
    (7 and 8): the kernel's remainder path."""
    return (_f32(r, *shape), np.array([rank], np.int32), parts), {}


def ref_split_dim0(tensor, rank, num_partitions):
    """The rank-th of num_partitions equal blocks of rows (torch.index_select's form)."""
    n = tensor.shape[0] // num_partitions
    k = int(np.asarray(rank).reshape(-1)[0])
    return tensor[k * n : (k + 1) * n].copy()


def _kv_at_batch_inputs(r, batch=2, b=3, h=2, s=5, s_prior=8, d=16):
    k, v = _f32(r, 1, h, s, d).astype(BF16), _f32(r, 1, h, s, d).astype(BF16)
    kp, vp = _f32(r, b, h, s_prior, d).astype(BF16), _f32(r, b, h, s_prior, d).astype(BF16)
    return (k, v, kp, vp, np.array([batch], np.int32)), {}


def ref_kv_at_batch(k, v, k_prior, v_prior, batch_idx):
    """K and V written at [batch_idx, :, :S, :] of the caches; a batch index past the caches
    writes nothing (the kernel's oob_mode=skip)."""
    b = int(np.asarray(batch_idx).reshape(-1)[0])
    kp, vp = k_prior.copy(), v_prior.copy()
    if 0 <= b < kp.shape[0]:
        kp[b, :, : k.shape[2]] = k[0]
        vp[b, :, : v.shape[2]] = v[0]
    return kp, vp


def _nxdi_cases() -> list[Case]:
    tol = {"rtol": 1e-4, "atol": 1e-5}
    dn, fused = f"{QWEN}/nki_deltanet.py", f"{QWEN}/nki_deltanet_fused.py"
    nkilib = f"nki-library/{LIB}"  # what attention_cte_bias.py imports (nkilib.core.utils)

    def nxd(label, path, kernel, inputs, ref, grid):
        """A kernel of a module that imports neuronx_distributed and NxDI's own host code
        (stood in: the kernels use only nki and nki-library's helpers), bit for bit."""
        src = f"src/neuronx_distributed_inference/{path}"
        return Case(f"nxdi {label}", NXDI, src, kernel, inputs, ref, grid=grid, rtol=0.0,
                    atol=0.0, paths=(nkilib,), stand_ins=_NXD_STAND_INS)  # fmt: skip

    return [
        Case(
            "nxdi qwen qk_norm_partial_rope",
            NXDI,
            f"{QWEN}/qwen_qk_norm_rope.py",
            "qwen_qk_norm_partial_rope_kernel",
            _qk_norm_rope_inputs,
            ref_qk_norm_rope,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi qwen deltanet_recurrent_step",
            NXDI,
            dn,
            "deltanet_recurrent_step",
            lambda r: _deltanet_inputs(r, 1, state=True),
            ref_deltanet_step,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi qwen deltanet_recurrent_step_batched",
            NXDI,
            dn,
            "_deltanet_recurrent_step_batched_kernel",
            lambda r: _deltanet_inputs(r, 1, state=True, bh=3),
            ref_deltanet_step_batched,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi qwen deltanet_recurrent_fwd",
            NXDI,
            dn,
            "deltanet_recurrent_fwd",
            lambda r: _deltanet_inputs(r, 6),
            ref_deltanet_fwd,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi qwen deltanet_recurrent_fwd_state",
            NXDI,
            dn,
            "deltanet_recurrent_fwd_state",
            lambda r: _deltanet_inputs(r, 6),
            ref_deltanet_fwd_state,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi qwen deltanet_chunk_step",
            NXDI,
            f"{QWEN}/nki_deltanet_chunked.py",
            "deltanet_chunk_step",
            _chunk_step_inputs,
            ref_chunk_step,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi qwen deltanet_fused_chunked_fwd",
            NXDI,
            fused,
            "deltanet_fused_chunked_fwd",
            lambda r: _fused_inputs(r, 256),
            ref_fused,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_fused_chunked_fwd (kkt_hier solve)",
            NXDI,
            fused,
            "deltanet_fused_chunked_fwd",
            lambda r: _fused_inputs(r, 256),
            ref_fused,
            env=(
                ("QWEN36_DELTANET_SOLVE_MODE", "kkt_hier"),
                ("QWEN36_DELTANET_SOLVE_BLOCK_SIZE", "128"),
            ),
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_fused_chunked_fwd (legacy)",
            NXDI,
            f"{QWEN}/nki_deltanet_fused_legacy.py",
            "deltanet_fused_chunked_fwd",
            lambda r: _fused_legacy_inputs(r, 256),
            functools.partial(ref_fused, normalized=True),
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_fused_chunked_fwd_multihead",
            NXDI,
            f"{QWEN}/nki_deltanet_fused.py",
            "deltanet_fused_chunked_fwd_multihead",
            lambda r: _fused_inputs(r, 256, heads=2),
            ref_fused,
            grid=2,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_autocp_affine_chunk",
            NXDI,
            fused,
            "deltanet_autocp_affine_chunk",
            lambda r: (_fused_inputs(r, 128)[0][:5] + _masks(), {}),
            ref_affine_chunk,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_autocp_affine_sequence",
            NXDI,
            fused,
            "deltanet_autocp_affine_sequence",
            lambda r: (_fused_inputs(r, 256)[0][:5] + _masks(), {}),
            ref_affine_sequence,
            grid=2,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_autocp_state_summary_sequence",
            NXDI,
            fused,
            "deltanet_autocp_state_summary_sequence",
            lambda r: (_fused_inputs(r, 1024)[0][1:5] + _masks()[:2], {}),
            ref_state_summary,
            grid=2,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_autocp_state_prefix",
            NXDI,
            fused,
            "deltanet_autocp_state_prefix",
            lambda r: (_affine_pieces(r)[2:], {}),
            ref_state_prefix,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_autocp_apply_output",
            NXDI,
            fused,
            "deltanet_autocp_apply_output",
            lambda r: (_affine_pieces(r)[:3], {}),
            ref_apply_output,
            **tol,
        ),
        Case(
            "nxdi qwen deltanet_autocp_prefix_apply_output",
            NXDI,
            fused,
            "deltanet_autocp_prefix_apply_output",
            lambda r: (_affine_pieces(r), {}),
            ref_prefix_apply_output,
            **tol,
        ),
        Case(
            "nxdi glm-5 mla_attention_tkg",
            NXDI,
            "contrib/models/GLM-5.2/src/mla_attention_nki_kernel.py",
            "mla_attention_tkg",
            _mla_inputs,
            ref_mla,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi ltx-2 cross_attn_kernel",
            NXDI,
            "contrib/models/ltx2-video-audio/src/nki_cross_attention_kernel.py",
            "cross_attn_kernel",
            _cross_attn_inputs,
            ref_cross_attn,
            rtol=0.0,
            atol=0.0,
        ),
        Case(
            "nxdi ltx-2 attention_cte_with_bias (LNC=2)",
            NXDI,
            "contrib/models/ltx2-video-audio/src/attention_cte_bias.py",
            "attention_cte_with_bias",
            _cte_bias_inputs,
            ref_cte_bias,
            grid=2,
            rtol=0.0,
            atol=0.0,
            paths=(nkilib,),
        ),
        Case(
            "nxdi ltx-2 attention_cte_with_bias (causal, no bias)",
            NXDI,
            "contrib/models/ltx2-video-audio/src/attention_cte_bias.py",
            "attention_cte_with_bias",
            lambda r: (
                tuple(_f32(r, *s).astype(BF16) for s in ((1, 512, 64), (1, 64, 512), (1, 512, 64))),
                {"scale": 0.125},
            ),
            ref_attention_cte,
            rtol=0.0,
            atol=0.0,
            paths=(nkilib,),
        ),
        Case(
            "nxdi sliding_window flash_fwd (window 300)",
            NXDI,
            "src/neuronx_distributed_inference/modules/sliding_window/attention.py",
            "flash_fwd",
            lambda r: (
                (
                    _f32(r, 1, 1, 64, 2048).astype(BF16),
                    _f32(r, 1, 1, 64, 2048).astype(BF16),
                    _f32(r, 1, 1, 2048, 64).astype(BF16),
                ),
                {"window_size": (300, -1)},
            ),
            ref_flash_fwd,
            grid=(1, 1),
            rtol=0.0,
            atol=0.0,
        ),
        # Its module defines a torch.nn.Module next to the kernel: torch imported for real.
        Case(
            "nxdi eagle rolling_buffer_set_state",
            NXDI,
            "src/neuronx_distributed_inference/modules/eagle/hidden_state.py",
            "rolling_buffer_set_state",
            _rolling_buffer_inputs,
            ref_rolling_buffer,
            rtol=0.0,
            atol=0.0,
            needs=("torch",),
        ),
        # Modules that import neuronx_distributed and NxDI's own host code (stood in: the
        # kernels use only nki and nki-library's helpers).
        *[
            nxd(
                f"split_along_dim0_kernel (LNC={g})",
                "utils/distributed.py",
                "split_along_dim0_kernel",
                _split_dim0_inputs,
                ref_split_dim0,
                g,
            )
            for g in (1, 2)
        ],
        *[
            nxd(
                f"write_kv_cache_at_batch_kernel ({why})",
                "modules/kvcache/utils.py",
                "write_kv_cache_at_batch_kernel",
                functools.partial(_kv_at_batch_inputs, batch=b),
                ref_kv_at_batch,
                g,
            )
            for why, g, b in (("LNC=2", 2, 1), ("LNC=1", 1, 2), ("batch past the cache", 2, 3))
        ],
    ]


#: What NxD and NxDI modules holding kernels import for their host code (_absent_modules).
_NXD_STAND_INS = _absent_modules(
    "neuronx_distributed.parallel_layers.parallel_state",
    "neuronx_distributed.parallel_layers.utils",
    "neuronx_distributed.utils",
    "neuronx_distributed.modules.moe.model_utils",
    "neuronx_distributed.modules.moe.moe_configs",
    "neuronx_distributed.modules.moe.routing",
    "neuronx_distributed.modules.moe.expert_mlps",
    "neuronx_distributed.modules.moe.shared_experts",
    "neuronx_distributed.modules.moe.moe_fused_tkg",
    "neuronx_distributed_inference.modules.attention.attention_process_groups",
    "neuronx_distributed_inference.modules.custom_calls",
)


# ----------------------------------------------------------------------------- running
class _Absent(type):
    """A name of a package that is not installed (``torch.Tensor``), for annotations and
    default values in the driver code a kernel package imports: its attributes are absent
    names too, and calling one raises ModuleNotFoundError."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Absent(f"{cls.__name__}.{name}", (), {})

    def __call__(cls, *_, **__):
        raise ModuleNotFoundError(f"{cls.__name__}: {cls.__name__.split('.')[0]} is not installed")


class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Packages the kernel files import for their own test drivers (``torch``, ``scipy``) as
    empty modules, when they are not installed; their names are _Absent (nki-library's
    experimental transformer package imports its torch references, annotated with
    ``torch.Tensor``)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []  # type: ignore[attr-defined]
        name = module.__name__
        module.__getattr__ = lambda attr: _Absent(f"{name}.{attr}", (), {})  # type: ignore[attr-defined]


#: What kernel files import for their drivers and tests only (never used by a kernel).
_DRIVER_PACKAGES = ("torch", "torch_xla", "torch_neuronx", "scipy", "jax")


def _load(root: str, case: Case):
    for extra in case.paths:
        extra = os.path.join(root, extra)
        if extra not in sys.path:
            sys.path.insert(0, extra)
    if case.package_root:
        top = os.path.join(root, case.repo, case.package_root)
        if top not in sys.path:
            sys.path.insert(0, top)
        ours = [name for name, _ in case.stand_ins if name not in sys.modules]
        for name, make in case.stand_ins:
            if name in ours:
                sys.modules[name] = make()
        try:
            return importlib.import_module(case.path)
        finally:  # the kernel's module keeps what it imported; nothing else sees ours (nor
            # that module, which does not import without them: _library_imports)
            for name in ours + ([case.path] if ours else []):
                sys.modules.pop(name, None)
    path = os.path.join(root, case.repo, case.path)
    name = "nki_corpus_" + case.path.replace("/", "_").replace("-", "_").removesuffix(".py")
    name = f"{case.repo.replace('-', '_')}_{name}"
    for k, v in case.env:
        os.environ[k] = v  # undone by run_case
        name += f"_{k}_{v}"
    if name in sys.modules:
        return sys.modules[name]
    d = os.path.dirname(path)
    sys.path.insert(0, d)
    ours = [n for n, _ in case.stand_ins if n not in sys.modules]
    for n, make in case.stand_ins:
        if n in ours:
            sys.modules[n] = make()
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
        except BaseException:
            del sys.modules[name]
            raise
        return mod
    finally:
        sys.path.remove(d)
        for n in ours:  # the module keeps what it imported; nothing else sees ours
            sys.modules.pop(n, None)


def _compare(out, ref, case: Case) -> str:
    if isinstance(ref, tuple):  # one reference per output: each compared, the first failure
        if not isinstance(out, (tuple, list)) or len(out) < len(ref):
            return f"mismatch: {len(ref)} outputs expected"
        results = [_compare(o, r, case) for o, r in zip(out, ref, strict=False)]
        bad = [r for r in results if not r.startswith("ok")]
        if bad:
            return bad[0]
        return "ok (bit-exact)" if all(r == "ok (bit-exact)" for r in results) else "ok"
    if isinstance(out, (tuple, list)):
        out = out[0]  # the reference covers the first output (e.g. flash attention's o)
    if case.decode is not None:
        out = case.decode(np.asarray(out))
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return f"mismatch: shape {out.shape}, expected {ref.shape}"
    o, r = out.astype(np.float64), ref.astype(np.float64)
    if np.allclose(o, r, rtol=case.rtol, atol=case.atol, equal_nan=True):
        exact = np.array_equal(out.view(np.uint8), ref.astype(out.dtype).view(np.uint8))
        return "ok (bit-exact)" if exact else "ok"
    err = np.abs(o - r)
    i = np.unravel_index(int(np.nanargmax(err)), err.shape)
    return f"mismatch: max |err| {err[i]:.3g} at {tuple(int(v) for v in i)}"


def _short(e: BaseException) -> str:
    msg = str(e).splitlines()[0] if str(e) else ""
    # Paths inside the corpus directory are shown relative to it.
    return f"{type(e).__name__}: {msg}"[:220]


def run_case(root: str, case: Case, nki) -> tuple[str, float | None, float]:
    env = dict(os.environ)  # a kernel file may set variables (e.g. its target chip)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # kernels' own prints and logs
            return _run_case(root, case, nki)
    finally:
        os.environ.clear()
        os.environ.update(env)


def _run_case(root: str, case: Case, nki) -> tuple[str, float | None, float]:
    # The emulation time is the kernel's run alone (a failure: up to the failure): not the
    # module's import, the inputs or the numpy reference (the matmul tutorials' exact-order
    # reference takes seconds where their emulation takes a fraction of one).
    t0 = None
    try:
        mod = _load(root, case)
        fn = getattr(mod, case.kernel)
        if case.wrap is not None:
            fn = case.wrap(fn)
        args, kwargs = case.inputs(np.random.default_rng(0))
        ref = case.reference(*args, **kwargs)
        t0 = time.perf_counter()
        if case.call:
            out, sim = fn(*args, **kwargs), None
        else:
            res = nki.run(fn, *args, grid=case.grid, uninitialized=case.uninitialized,
                          ranks=case.ranks, **kwargs)  # fmt: skip
            out, sim = res.outputs, res.report.seconds
        wall = time.perf_counter() - t0
        return _compare(out, ref, case), sim, wall
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        return _short(e), None, (time.perf_counter() - t0) if t0 is not None else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="directory holding the repositories (see the module doc)")
    p.add_argument("--only", nargs="*", default=None, help="kernel names containing these")
    p.add_argument("--docs", action="store_true", help="the table as docs/nki.md has it")
    a = p.parse_args(argv)
    if not os.path.isdir(a.root):
        print(f"nki_corpus: {a.root} does not exist; nothing to run (this harness fetches nothing)")
        return 0
    import trn2core.nki as nki

    absent = {n for n in _DRIVER_PACKAGES if importlib.util.find_spec(n) is None}
    if absent:
        sys.meta_path.append(_EmptyModules(absent))
    rows = []
    with nki.install():
        for case in _cases():
            if a.only and not any(s in case.name for s in a.only):
                continue
            if not os.path.isdir(os.path.join(a.root, case.repo)):
                rows.append((case.name, f"{case.repo}/{case.path}", "skipped: repository absent",
                             None, 0.0))  # fmt: skip
                continue
            missing = [n for n in case.needs if n in absent]
            if missing:
                why = f"skipped: needs {', '.join(missing)} (not installed)"
                rows.append((case.name, f"{case.repo}/{case.path}", why, None, 0.0))
                continue
            result, sim, wall = run_case(a.root, case, nki)
            result = result.replace(os.path.abspath(a.root) + os.sep, "")
            rows.append((case.name, f"{case.repo}/{case.path}", result, sim, wall))
            print(f"{case.name:32s} {result[:90]}", file=sys.stderr, flush=True)
        imports = _library_imports(a.root) if not a.only else None
    _print_table(rows, a.docs)
    ok = sum(1 for r in rows if r[2].startswith("ok"))
    print(f"\n{ok} of {len(rows)} kernels ok")
    if imports:
        print(f"nki-library: {imports[0]} of {imports[1]} kernel modules import")
    return 0


_SHORT = {
    "aws-neuron-sdk/nki/examples/": "sdk: examples/",
    "nki-samples/src/nki_samples/tutorials/": "nki-samples: tutorials/",
    "nki-samples/contributed/": "nki-samples: contributed/",
    "aws-neuron-sdk-2.26/general/nki/examples/": "sdk 2.26: examples/",
    "nki-samples-reference/src/nki_samples/reference/": "nki-samples (reference): ",
    "nki-library/": "nki-library: ",
    "neuronx-distributed-inference/contrib/models/": "NxDI: contrib/models/",
    "neuronx-distributed-inference/src/neuronx_distributed_inference/": "NxDI: ",
}


def _print_table(rows, docs: bool) -> None:
    if not docs:
        print("| kernel | source | result | simulated | emulation |")
        print("|---|---|---|---|---|")
    else:
        print("| kernel | source | result | emulated time |")
        print("|---|---|---|---|")
    for name, src, result, sim, wall in rows:
        s = f"{sim * 1e6:.1f} us" if sim is not None else "-"
        result = result.replace("|", "/")
        if not docs:
            print(f"| {name} | {src} | {result} | {s} | {wall:.2f} s |")
            continue
        for k, v in _SHORT.items():
            src = v + src[len(k) :] if src.startswith(k) else src
        cls, _, msg = result.partition(": ")
        if not result.startswith(("ok", "mismatch", "skipped")):
            msg = msg.split(": ", 1)[1] if ".py:" in msg.split(": ", 1)[0] else msg
            result = f"{cls}: {msg[:90]}"
        print(f"| {name} | {src} | {result} | {s} |")


def _library_imports(root: str) -> tuple[int, int] | None:
    """How many of nki-library's kernel modules (not its ``*_torch.py`` references) import."""
    top = os.path.join(root, "nki-library", "src", "nkilib_src")
    if not os.path.isdir(top):
        return None
    if top not in sys.path:
        sys.path.insert(0, top)
    ok = total = 0
    for d, _, files in sorted(os.walk(os.path.join(top, "nkilib"))):
        for f in sorted(files):
            if not f.endswith(".py") or f.endswith("_torch.py"):
                continue
            rel = os.path.relpath(os.path.join(d, f), top)[:-3]
            total += 1
            try:
                importlib.import_module(rel.replace(os.sep, ".").removesuffix(".__init__"))
                ok += 1
            except Exception:  # noqa: BLE001, S112 - counted, not reported
                continue
    return ok, total


if __name__ == "__main__":
    raise SystemExit(main())
