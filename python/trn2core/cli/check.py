"""``trn2core nccom-test --check``: the collective run on data, in one process or, under
``mpiexec``/``srun``, with its chips spread over the MPI processes (docs/distributed.md).

Like Neuron's tool, every buffer is filled as the mode says (``random``: pseudo-random data from
a seed, printed; ``all_ones``: every input 1) and every output compared with what the
collective must produce. The check runs the chip-level collective (one buffer per chip
the ranks span, ``count`` elements each, on the chips ``nccom-test`` places them on); the
within-chip stage of several ranks per chip is timed by the model but not run on data.
Reductions sum small integers (-1, 0 or 1 per element and chip, or 1), so the exact sum,
rounded once to the format, is the expected value whatever the order of summation; data
movement checks every byte.
"""

from __future__ import annotations

import os
import secrets
import time

import numpy as np

from .. import _core, _validate
from ..dtypes import MACHINE_NP_DTYPES
from ..errors import FormatError, Trn2ValueError
from ..nccom import NCCOM_DATATYPES
from ..topology import Instance, UltraCluster, UltraServer

__all__ = ["check", "mpi_world", "run"]

#: nccom-test's data types as numpy dtypes (they are machine element types).
_NP_DTYPES = {name: MACHINE_NP_DTYPES[name] for name in NCCOM_DATATYPES}
#: The nccom-test data types a reduction takes (the floating-point ones).
_REDUCED = tuple(d for d in NCCOM_DATATYPES if d.startswith(("fp", "bf")))

#: Environment variables MPI launchers set in the processes they start (MPICH and Intel MPI's
#: hydra, Open MPI, PMIx, Slurm's srun).
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_STEP_ID")


def mpi_world():
    """``MPI.COMM_WORLD`` when an MPI launcher started this program with more than one
    process, else ``None`` (a plain run needs no mpi4py)."""
    if not any(v in os.environ for v in _LAUNCHER_VARS):
        return None
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise Trn2ValueError(
            "comm: this program runs under an MPI launcher but mpi4py is missing; install "
            "trn2core[mpi] (pip install 'trn2core[mpi]')"
        ) from e
    world = MPI.COMM_WORLD
    return world if world.Get_size() > 1 else None


def _machine(chips: int, comm):
    """The machine, its chips in rank order, and (under MPI) a placement that gives every
    process an equal share of those chips."""
    shape, ultraservers, chosen = _core.nccom_machine(chips)
    if ultraservers > 1:
        make = lambda **kw: UltraCluster(ultraservers, **kw)  # noqa: E731
    elif len(shape) == 3:
        make = UltraServer
    else:
        make = lambda **kw: Instance("trn2.48xlarge" if shape else "trn2.3xlarge", **kw)  # noqa: E731
    if comm is None:
        return make(), chosen
    procs = comm.Get_size()
    if len(chosen) % procs:
        raise Trn2ValueError(
            f"processes: {procs} processes cannot share the {len(chosen)} chips of this "
            f"nccom-test run evenly; run a number of processes that divides {len(chosen)}"
        )
    size = int(np.prod(shape, dtype=np.int64)) * ultraservers if shape else 1
    placement = [c % procs for c in range(size)]
    for i, c in enumerate(chosen):
        placement[c] = i * procs // len(chosen)
    return make(comm=comm, placement=placement), chosen


def fresh_seed() -> int:
    """A seed for ``--check random`` from the operating system's entropy (Neuron's tool
    takes the time; either way a run is repeatable only with the seed it prints)."""
    return secrets.randbits(63)


def _rng(seed: int, r: int) -> np.random.Generator:
    """Rank ``r``'s generator: one stream per (seed, rank), the same in every process."""
    return np.random.default_rng([seed, r])


def _reduce_input(r: int, count: int, mode: str = "random", seed: int = 0) -> np.ndarray:
    """Rank ``r``'s input to a reduction: pseudo-random -1, 0 or 1 (``random``), or 1."""
    if mode == "all_ones":
        return np.ones(count, np.float32)
    return _rng(seed, r).integers(-1, 2, count, dtype=np.int8).astype(np.float32)


def _exact_sum(n: int, count: int, mode: str = "random", seed: int = 0) -> np.ndarray:
    """The exact sum of every rank's :func:`_reduce_input` (``n`` everywhere for
    ``all_ones``, the golden value Neuron's tool checks)."""
    if mode == "all_ones":
        return np.full(count, n, np.float32)
    total = np.zeros(count, np.int64)
    for r in range(n):
        total += _rng(seed, r).integers(-1, 2, count, dtype=np.int8)
    return total.astype(np.float32)


def _move_input(r: int, count: int, dtype: np.dtype, mode: str = "random", seed: int = 0):
    """Rank ``r``'s input to a data-movement collective, as bytes: pseudo-random bytes
    (``random``), or ``count`` ones of ``dtype`` (``all_ones``)."""
    if mode == "all_ones":
        return np.ones(count, np.float32).astype(dtype).view(np.uint8)
    return _rng(seed, r).integers(0, 256, count * dtype.itemsize, dtype=np.uint8)


def _cut(length: int, n: int, r: int) -> slice:
    """Part ``r`` of ``n`` of a flat buffer (as reduce-scatter and all-to-all cut it)."""
    return slice(r * length // n, (r + 1) * length // n)


def _check_host(op: str, n: int, local: int, nbytes: int) -> None:
    """``CapacityError`` before any buffer is made when this process cannot hold the check of
    ``op`` on ``n`` ranks (``local`` of them here) of ``nbytes`` each: the inputs, their int64
    pattern while one is made, every local output and the expected values of one rank."""
    outputs = {"all_gather": n * nbytes, "reduce_scatter": -(-nbytes // n)}.get(op, nbytes)
    want = n * nbytes if op in ("all_gather", "all_to_all") else nbytes
    need = local * (nbytes + outputs) + 8 * nbytes + 2 * want
    _validate.check_alloc(
        need,
        "--check",
        f"the check of {op} on {n} chips x {nbytes} bytes (inputs, outputs, expected values)",
    )


def check(
    op: str,
    ranks: int,
    size_bytes: int,
    datatype: str,
    lnc: int,
    algorithm: str,
    comm,
    mode: str = "random",
    seed: int = 0,
):
    """Runs collective ``op`` on ``size_bytes`` of ``datatype`` per chip over the chips that
    ``ranks`` logical cores span, its inputs filled as ``mode`` says (``random`` from ``seed``,
    or ``all_ones``), and compares every output of this process's chips with the expected
    values. Returns ``(mismatched elements, chips, elements per chip, seconds)``, mismatches
    summed over every process when ``comm`` is given."""
    if op in ("all_reduce", "reduce_scatter") and datatype not in _REDUCED:
        raise FormatError(
            f"datatype: --check runs {op} on data, and Trainium2's collectives reduce "
            f"floating-point formats only ({', '.join(_REDUCED)}), not {datatype}"
        )
    per_chip = 8 // lnc
    chips = max(1, -(-ranks // per_chip))
    machine, chosen = _machine(chips, comm)
    dtype = _NP_DTYPES[datatype]
    count = max(1, size_bytes // dtype.itemsize)
    n = len(chosen)
    local = [r for r, c in enumerate(chosen) if c in machine.local_chips]
    _check_host(op, n, len(local), count * dtype.itemsize)
    bad = 0
    if op in ("all_reduce", "reduce_scatter"):
        bufs = [_reduce_input(r, count, mode, seed).astype(dtype) for r in local]
        t0 = time.perf_counter()
        res = getattr(machine, op)(bufs, algorithm=algorithm, chips=chosen)
        seconds = time.perf_counter() - t0
        want = _exact_sum(n, count, mode, seed).astype(dtype)
        for r, out in zip(local, res.outputs, strict=True):
            part = want if op == "all_reduce" else want[_cut(count, n, r)]
            bad += int(np.count_nonzero(out.reshape(-1).view(np.uint8) != part.view(np.uint8)))
    else:

        def move(r: int) -> np.ndarray:
            return _move_input(r, count, dtype, mode, seed)

        bufs = [move(r).view(dtype) for r in local]
        t0 = time.perf_counter()
        if op == "send_recv":
            res = machine.send_recv(bufs, chips=chosen)
        else:
            res = getattr(machine, op)(bufs, algorithm=algorithm, chips=chosen)
        seconds = time.perf_counter() - t0
        for r, out in zip(local, res.outputs, strict=True):
            if op == "all_gather":
                want = np.concatenate([move(s) for s in range(n)])
            elif op == "all_to_all":
                cut = _cut(count, n, r)
                want = np.concatenate([move(s).view(dtype)[cut].view(np.uint8) for s in range(n)])
            else:  # rank r receives from rank r - 1
                want = move((r - 1) % n)
            got = out.reshape(-1).view(np.uint8)
            bad += int(np.count_nonzero(got != want)) if got.size == want.size else want.size
    if comm is not None:
        bad = comm.allreduce(bad)
    return bad, n, count, seconds


def run(
    op: str,
    ranks: int,
    sizes,
    datatype: str,
    lnc: int,
    algorithm: str,
    comm,
    out=None,
    mode: str = "random",
    seed: int | None = None,
) -> int:
    """``nccom-test --check [MODE]``: :func:`check` for every size, one line each on ``out``
    (stdout by default; printed by process 0 under MPI); the exit status (1 when any output
    differs). ``random`` without a ``seed`` draws one from the OS (process 0's, under MPI) and
    prints it, so a failing run can be repeated with ``--seed``."""
    if mode == "random" and seed is None:
        seed = fresh_seed()
        if comm is not None:
            seed = comm.bcast(seed, root=0)
    failed = False
    for size in sizes:
        bad, chips, count, seconds = check(
            op, ranks, size, datatype, lnc, algorithm, comm, mode, seed or 0
        )
        failed = failed or bad > 0
        where = "" if comm is None else f", spread over {comm.Get_size()} MPI processes"
        verdict = "every output as expected" if bad == 0 else f"FAILED: {bad} elements differ"
        fill = f"random, seed {seed}" if mode == "random" else mode
        if comm is None or comm.Get_rank() == 0:
            print(
                f"check {op} size {size}: {chips} chips x {count} {datatype} elements ({fill})"
                f"{where}: {verdict} (emulated in {seconds:.3f} s)",
                file=out,
            )
    return 1 if failed else 0
