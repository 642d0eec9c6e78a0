"""``@nki.jit`` kernels and their launches: ``kernel(*arrays)``, ``kernel[...]``,
``trn2core.nki.simulate`` and ``trn2core.nki.run``.

``kernel[...]`` means what each dialect's documentation says: in the current dialect
(``import nki``) ``kernel[n]`` runs on a logical core of ``n`` physical cores (LNC, 1 or 2;
``nl.program_id(0)`` is the physical core); in the legacy one (``neuronxcc.nki``) it is an SPMD
launch grid (``kernel[4, 2]``) whose programs run one after another on one NeuronCore, except
along axes marked ``nl.nc(2)`` / ``nl.spmd_dim(..., nl.nc(2))``, spread over two physical
cores.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import numpy as np

from ..errors import Trn2ValueError
from ..machine import KernelReport
from ..report import Result
from ._api import STATE
from ._ranks import refuse_per_rank, run_ranks
from ._report import NkiReport
from ._runtime import KernelError, Launch


@dataclasses.dataclass(frozen=True, repr=False)
class RunResult(Result):
    """A kernel launch: ``outputs`` (what the kernel returns, as numpy arrays) and ``report``
    (its timeline, an ``NkiReport``)."""

    outputs: Any
    report: NkiReport


class Kernel:
    """A kernel function decorated with ``@nki.jit``: call it with numpy / ml_dtypes arrays
    to run it on the emulator (its outputs come back as numpy arrays)."""

    def __init__(
        self,
        fn,
        dialect: str = "current",
        grid=(),
        nc_axes=(),
        lnc: int = 1,
        options: dict | None = None,
    ) -> None:
        if not callable(fn):
            raise Trn2ValueError(f"jit: expected a function, got {type(fn).__name__}")
        self.fn = fn
        self.dialect = dialect
        self.grid = tuple(grid)
        self.nc_axes = tuple(nc_axes)
        self.lnc = lnc
        self.options = dict(options or {})
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<nki kernel {getattr(self.fn, '__name__', '?')} ({self.dialect})>"

    def __getitem__(self, grid) -> Kernel:
        g = grid if isinstance(grid, tuple) else (grid,)
        for d in g:
            if not isinstance(d, (int, np.integer)) or isinstance(d, (bool, np.bool_)) or d < 1:
                raise Trn2ValueError(f"grid: dimensions are positive integers, got {grid!r}")
        if self.dialect == "current":
            if len(g) != 1 or g[0] not in (1, 2):
                raise Trn2ValueError(
                    f"kernel[{grid!r}]: in the current NKI dialect the brackets give the LNC "
                    "degree, 1 or 2 on Trainium2 (kernel[2] runs on two physical cores)"
                )
            return Kernel(
                self.fn, self.dialect, (int(g[0]),) if g[0] > 1 else (), (), int(g[0]), self.options
            )
        nc_axes = tuple(i for i, d in enumerate(g) if getattr(d, "nc", False))
        lnc = 2 if nc_axes else 1
        return Kernel(self.fn, self.dialect, tuple(int(d) for d in g), nc_axes, lnc, self.options)

    def launch(
        self, args, kwargs, uninitialized: str = "error", rank: int = 0, group=None
    ) -> Launch:
        check_target()
        if group is None:
            refuse_per_rank(self.fn, args, kwargs)
        return Launch(
            self.fn,
            args,
            kwargs,
            grid=self.grid,
            nc_axes=self.nc_axes,
            lnc=self.lnc,
            dialect=self.dialect,
            uninitialized=uninitialized,
            rank=rank,
            group=group,
        )

    def __call__(self, *args, **kwargs):
        if STATE.core is not None:
            # Called from a running kernel (a `@nki.jit(mode='trace')` helper, or a kernel
            # calling another): inlined into the caller's program, as the compiler traces it.
            return self.fn(*args, **kwargs)
        return self.launch(args, kwargs).execute()


#: ``NEURON_PLATFORM_TARGET_OVERRIDE`` values that name Trainium2 (AWS's simulator also
#: takes trn1/gen2 and trn3/gen4, other chips).
_TRN2_TARGETS = ("trn2", "gen3")


def check_target() -> None:
    """Refuses a ``NEURON_PLATFORM_TARGET_OVERRIDE`` naming another chip than Trainium2
    (trn2core would otherwise emulate Trainium2 silently)."""
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "").strip().lower()
    if target and target not in _TRN2_TARGETS:
        raise KernelError(
            f"NEURON_PLATFORM_TARGET_OVERRIDE={target}: trn2core emulates Trainium2 "
            "(NeuronCore-v3) only; unset it or set it to trn2 (or gen3)",
            arg="NEURON_PLATFORM_TARGET_OVERRIDE",
        )


def _as_kernel(kernel, grid=None) -> Kernel:
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    if grid is not None:
        k = k[grid]
    return k


def jit(fn=None, mode: str = "auto", **kwargs):
    """``@nki.jit`` (current dialect): the function becomes a ``Kernel`` that runs on the
    emulator when called with numpy arrays. ``mode`` and other options are accepted and
    ignored (every mode runs here)."""
    if fn is None:
        return lambda f: Kernel(f, "current", options=kwargs)
    return Kernel(fn, "current", options=kwargs)


def jit_legacy(fn=None, mode: str = "auto", **kwargs):
    """``@neuronxcc.nki.jit``: as ``jit``, with the legacy meaning of ``kernel[grid]``."""
    if fn is None:
        return lambda f: Kernel(f, "legacy", options=kwargs)
    return Kernel(fn, "legacy", options=kwargs)


def simulate(kernel, *, uninitialized: str = "error"):
    """The drop-in for ``nki.simulate(kernel)``: returns a callable that runs the kernel on
    the emulator and returns its outputs as numpy arrays. ``uninitialized="nan"`` fills new
    memory with NaN instead of refusing reads of never-written memory (what AWS's simulator
    does)."""
    k = _as_kernel(kernel)

    def call(*args, **kwargs):
        return k.launch(args, kwargs, uninitialized).execute()

    return call


def simulate_kernel(kernel, *args, **kwargs):
    """The legacy ``nki.simulate_kernel(kernel[grid], *args)``: runs it, returns its outputs."""
    return _as_kernel(kernel).launch(args, kwargs).execute()


def run(
    kernel,
    *args,
    grid=None,
    uninitialized: str = "error",
    trace_limit: int = 1_000_000,
    ranks: int | None = None,
    **kwargs,
) -> RunResult:
    """Runs ``kernel`` (``@nki.jit``-decorated, or a plain kernel function) on ``args``
    (numpy / ml_dtypes arrays and plain values; ``kwargs`` go to the kernel too) and returns
    ``RunResult(outputs, report)``. ``grid`` is what ``kernel[grid]`` would be (the LNC degree
    in the current dialect, the launch grid in the legacy one).

    ``ranks=N`` runs the kernel once per rank, N logical cores meeting in ``nki.collectives``
    calls (``rank_id()`` is 0 to N-1; an argument wrapped in ``trn2core.nki.PerRank([...])``
    gives each rank its own value): ``outputs`` is then the list of each rank's outputs, and
    ``report`` rank 0's timeline (docs/nki.md, "Collectives across ranks")."""
    if uninitialized not in ("error", "nan"):
        raise Trn2ValueError(f"uninitialized: expected 'error' or 'nan', got {uninitialized!r}")
    k = _as_kernel(kernel, grid)
    if ranks is None:
        launch = k.launch(args, kwargs, uninitialized)
        outputs = launch.execute()
    else:
        launches, outputs = run_ranks(k, args, kwargs, ranks, uninitialized)
        launch = launches[0]
    reports = [KernelReport.from_core(c.m.run(trace_limit)) for c in launch.cores]
    return RunResult(outputs, NkiReport.from_cores(reports))


class LatencyResult:
    """``benchmark_result.nc_latency`` of AWS's ``nki.benchmark``: here one emulated run (the
    emulator is deterministic: every iteration takes the same time), in microseconds."""

    def __init__(self, microseconds: float) -> None:
        self.microseconds = microseconds

    def get_latency_percentile(self, percentile: float) -> float:
        """The latency at ``percentile`` (0 to 100) in microseconds: the emulated time."""
        if not 0 <= percentile <= 100:
            raise Trn2ValueError(f"percentile: expected 0 to 100, got {percentile!r}")
        return self.microseconds

    def __repr__(self) -> str:
        return f"LatencyResult({self.microseconds:.3f} us)"


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
    """``kernel.benchmark_result`` after a benchmarked call."""

    nc_latency: LatencyResult
    report: NkiReport


class Benchmarked:
    """What ``nki.benchmark(...)`` / ``nki.profile(...)`` make of a kernel (legacy
    ``neuronxcc.nki``): calling it with numpy arrays runs it once on the emulator (``warmup``
    and ``iters`` are accepted: every run takes the same emulated time) and returns its
    outputs; ``benchmark_result.nc_latency.get_latency_percentile(p)`` is the emulated time in
    microseconds, ``benchmark_result.report`` the whole report. ``profile`` also writes the
    Perfetto trace (JSON) to ``working_directory/save_trace_name`` when that name is given.
    No NEFF is made: ``save_neff_name`` is ignored."""

    def __init__(self, kernel: Kernel, trace: str | None) -> None:
        self.kernel = kernel
        self.trace = trace
        self.benchmark_result: BenchmarkResult | None = None
        functools.update_wrapper(self, kernel.fn)  # type: ignore[arg-type]

    def __getitem__(self, grid) -> Benchmarked:
        return Benchmarked(self.kernel[grid], self.trace)

    def __call__(self, *args, **kwargs):
        res = run(self.kernel, *args, **kwargs)
        self.benchmark_result = BenchmarkResult(LatencyResult(res.report.seconds * 1e6), res.report)
        if self.trace:
            res.report.save_trace(self.trace)
        return res.outputs


def _benchmarking(fn, trace: str | None):
    def wrap(k):
        kernel = k if isinstance(k, Kernel) else Kernel(k, "legacy")
        return Benchmarked(kernel, trace)

    return wrap(fn) if fn is not None else wrap


def benchmark(
    kernel=None,
    *,
    warmup: int = 2,
    iters: int = 10,
    save_neff_name=None,
    save_trace_name=None,
    **kwargs,
):
    """Legacy ``nki.benchmark``: the emulated latency instead of a hardware measurement
    (``Benchmarked``). ``@nki.benchmark(...)`` or ``nki.benchmark(...)(kernel)``."""
    for arg, v in (("warmup", warmup), ("iters", iters)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise Trn2ValueError(f"{arg}: expected a non-negative integer, got {v!r}", arg=arg)
    return _benchmarking(kernel, None)


def profile(
    kernel=None,
    *,
    working_directory=None,
    save_neff_name=None,
    save_trace_name=None,
    profile_nth: int = 1,
    **kwargs,
):
    """Legacy ``nki.profile``: as ``benchmark``, and the Perfetto trace of the run is written
    to ``working_directory/save_trace_name`` (JSON, whatever the name's extension)."""
    trace = None
    if save_trace_name is not None:
        trace = os.path.join(os.fspath(working_directory or "."), os.fspath(save_trace_name))
    return _benchmarking(kernel, trace)


baremetal = jit_legacy
