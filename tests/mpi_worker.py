"""The program tests/test_distributed.py launches under ``mpiexec -n P``: ``python
mpi_worker.py MODE OUTDIR``. Each process writes what it saw to ``OUTDIR/MODE-<rank>.json``; the
tests assert on those files (and, for the modes that end the job, on mpiexec's exit and output).

Modes:
- ``bits``: every collective x every algorithm on three machines (16, 64 and 128 chips), spread
  over this job's processes and, under 2 processes, over ``MPI.COMM_SELF`` too (P = 1): each
  output compared bit for bit with the single-process run of the same call, and the timing
  report with the single-process report; then the error cases that must not end the job (a
  process count that does not divide the chips, wrong input on one process, mismatched calls).
- ``big``: a 64-chip UltraServer all-reduce whose buffers total more than one process may hold
  (``TRN2CORE_HOST_MEMORY`` set by the test), checked against an exact reference on a sample.
- ``kill``: process 1 kills itself (SIGKILL) in the middle of an all-reduce's exchange.
- ``raise``: process 1 fails inside the exchange (a MemoryError) while the others wait for it.
- ``uncaught``: process 1 raises outside any collective while the others start one.
- ``badinput``: process 1 passes integers to an all-reduce and no process catches the error.
- ``placement``: machines made with a placement refused on process 1 only, and with different
  placements on processes 0 and 1: every process must raise (the agreement on making a machine),
  none may wait forever; then a machine and an all-reduce that still line up.
- ``reuse``: a communicator used by a machine, freed, and a new one (another grouping or order)
  that MPI gives the same handle: the new machine's all-reduce must run over the new
  communicator's processes; a machine whose communicator was freed must refuse calls; then 50
  cycles of make, use and free, whose handles must stay few (the duplicate trn2core keeps of a
  communicator is freed with it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI
from trn2core import Instance, Trn2Error, UltraCluster, UltraServer
from trn2core._names import ALGORITHMS, REDUCE_OPS

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
P = WORLD.Get_size()

MACHINES = {
    "trn2.48xlarge": lambda **kw: Instance("trn2.48xlarge", **kw),
    "UltraServer": lambda **kw: UltraServer(**kw),
    "UltraCluster(2)": lambda **kw: UltraCluster(2, **kw),
}
REDUCE_DTYPES = (np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3, np.float16)
MOVE_DTYPES = (np.float32, np.int16, np.complex64, np.uint8)


def _data(n: int, shape, dtype, seed: int) -> list[np.ndarray]:
    """Every chip's buffer (the same on every process): random values with signed zeros,
    infinities and NaNs among them for the floating-point formats."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if np.dtype(dtype).kind in "fc" or dtype in REDUCE_DTYPES:
            x = (rng.standard_normal(shape) * 3).astype(np.float32)
            flat = x.reshape(-1)
            flat[rng.integers(0, flat.size, 2)] = -0.0
            if seed % 5 == 0:  # some cases with inf and NaN
                flat[0], flat[-1] = np.inf, np.nan
            out.append(x.astype(dtype))
        else:
            out.append(rng.integers(0, 200, shape).astype(dtype))
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _call(machine, collective: str, bufs, algorithm: str, op: str, chips, peers):
    if collective in ("all_reduce", "reduce_scatter"):
        return getattr(machine, collective)(bufs, op=op, algorithm=algorithm, chips=chips)
    if collective == "send_recv":
        return machine.send_recv(bufs, peers=peers, chips=chips)
    return getattr(machine, collective)(bufs, algorithm=algorithm, chips=chips)


def _cases():
    """(machine, collective, algorithm, dtype, shape, op, chips, placement kind, peers)."""
    k = 0
    for mname in MACHINES:
        n = {"trn2.48xlarge": 16, "UltraServer": 64, "UltraCluster(2)": 128}[mname]
        for collective in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
            for algorithm in ALGORITHMS:
                k += 1
                reduces = collective in ("all_reduce", "reduce_scatter")
                dtypes = REDUCE_DTYPES if reduces else MOVE_DTYPES
                dtype = dtypes[k % len(dtypes)]
                # Rows that divide evenly, and flat lengths that do not.
                shape = (2 * n, 3) if k % 2 else (3 * n + 5,)
                if collective == "all_gather":
                    shape = (7,) if k % 2 else (2, 3)
                op = REDUCE_OPS[k % len(REDUCE_OPS)] if reduces else None
                yield mname, collective, algorithm, dtype, shape, op, None, "default", None
        yield mname, "send_recv", "auto", np.float64, (5,), None, None, "default", None
        perm = [(3 * r + 1) % n for r in range(n)] if n % 3 else list(reversed(range(n)))
        yield mname, "send_recv", "auto", np.int8, (9,), None, None, "default", perm
    # A subset of the chips, and placements other than the contiguous default.
    inst, us = "trn2.48xlarge", "UltraServer"
    bf16 = ml_dtypes.bfloat16
    chips = [0, 5, 10, 15, 3, 2]
    yield inst, "all_reduce", "ring", np.float32, (50,), "sum", chips, "default", None
    yield inst, "all_reduce", "auto", bf16, (64, 2), "sum", None, "round-robin", None
    yield inst, "reduce_scatter", "rdh", np.float32, (61,), "max", None, "reversed", None
    yield us, "all_to_all", "mesh", np.float32, (70,), None, None, "round-robin", None
    yield inst, "all_gather", "mesh", np.uint8, (13,), None, [1, 4, 7], "on-one", None


def _placement(kind: str, n: int, procs: int):
    if kind == "default":
        return None
    if kind == "round-robin":
        return [c % procs for c in range(n)]
    if kind == "reversed":
        return [procs - 1 - c * procs // n for c in range(n)]
    return [procs - 1] * n  # every chip on the last process: the others hold none


def mode_bits() -> dict:
    comms = [("self", MPI.COMM_SELF), ("world", WORLD)] if P == 2 else [("world", WORLD)]
    out: dict = {"cases": [], "errors": {}}
    refs = {m: f() for m, f in MACHINES.items()}
    made: dict = {}
    for seed, (mname, collective, algorithm, dtype, shape, op, chips, pk, peers) in enumerate(
        _cases()
    ):
        n = refs[mname].topology.size
        ranks = n if chips is None else len(chips)
        bufs = _data(ranks, shape, dtype, seed)
        try:
            ref = _call(refs[mname], collective, bufs, algorithm, op, chips, peers)
            ref_error = None
        except Trn2Error as e:
            ref, ref_error = None, f"{type(e).__name__}: {e}"
        for cname, comm in comms:
            procs = comm.Get_size()
            key = (mname, cname, pk)
            if key not in made:
                made[key] = MACHINES[mname](comm=comm, placement=_placement(pk, n, procs))
            m = made[key]
            group = list(range(n)) if chips is None else chips
            local = [r for r, c in enumerate(group) if c in m.local_chips]
            case = {
                "machine": mname,
                "collective": collective,
                "algorithm": algorithm,
                "dtype": np.dtype(dtype).name,
                "shape": list(shape),
                "op": op,
                "placement": pk,
                "chips": chips,
                "procs": procs,
            }
            try:
                res = _call(m, collective, [bufs[r] for r in local], algorithm, op, chips, peers)
            except Trn2Error as e:
                case["error"] = f"{type(e).__name__}: {e}"
                case["ref_error"] = ref_error
                out["cases"].append(case)
                continue
            case["ref_error"] = ref_error
            case["ranks"] = list(res.ranks)
            case["expected_ranks"] = local
            case["bits_equal"] = ref is not None and all(
                _same_bits(o, ref.outputs[r]) for o, r in zip(res.outputs, res.ranks, strict=True)
            )
            rep = res.report
            case["report_equal"] = ref is not None and rep.timing() == ref.report
            case["processes"] = rep.processes
            case["wall_s"] = rep.emulation_wall_s
            case["exchanged_bytes"] = rep.exchanged_bytes
            case["schedule_bytes"] = rep.schedule_bytes
            case["sent_bytes"] = rep.sent_bytes
            case["received_bytes"] = rep.received_bytes
            case["text_ok"] = (
                "emulated on" in str(rep)
                and "between processes" in str(rep)
                and repr(rep).startswith(f"DistributedReport({collective!r}")
            )
            out["cases"].append(case)
    out["errors"] = _error_cases()
    return out


def _caught(fn) -> str | None:
    try:
        fn()
    except Trn2Error as e:
        return f"{type(e).__name__}: {e}"
    return None


def _error_cases() -> dict:
    """Errors that every process must see as an exception (the job goes on)."""
    errs: dict = {}
    rng = np.random.default_rng(7)
    # A process count that does not divide the chips: 3 of the processes.
    if P >= 3:
        sub = WORLD.Split(0 if RANK < 3 else 1, RANK)
        if RANK < 3:
            errs["indivisible"] = _caught(lambda: Instance("trn2.48xlarge", comm=sub))
        sub.Free()
    # Placements that do not fit the machine (refused before any message).
    errs["short_placement"] = _caught(lambda: Instance("trn2.48xlarge", comm=WORLD, placement=[0]))
    errs["placement_beyond"] = _caught(
        lambda: Instance("trn2.48xlarge", comm=WORLD, placement=[P] * 16)
    )
    inst = Instance("trn2.48xlarge", comm=WORLD)
    mine = [rng.standard_normal(40).astype(np.float32) for _ in inst.local_chips]
    # Wrong input on process 1 only: integers where the collective reduces floats; a buffer
    # missing; a wrong algorithm for the machine on every process (refused before any message).
    bad = [b.astype(np.int64) for b in mine] if RANK == 1 else mine
    errs["bad_dtype"] = _caught(lambda: inst.all_reduce(bad))
    short = mine[:-1] if RANK == 1 else mine
    errs["missing_buffer"] = _caught(lambda: inst.all_reduce(short))
    errs["bad_algorithm"] = _caught(lambda: inst.all_reduce(mine, algorithm="hierarchical"))
    # Mismatched calls: a different collective on process 0, a different size on process 1.
    if RANK == 0:
        errs["other_collective"] = _caught(lambda: inst.all_gather(mine))
    else:
        errs["other_collective"] = _caught(lambda: inst.all_reduce(mine))
    sized = [b[:39] for b in mine] if RANK == 1 else mine
    errs["other_size"] = _caught(lambda: inst.all_reduce(sized))
    # The same collective on another machine over the same communicator (process 0).
    us = UltraServer(comm=WORLD)
    theirs = [rng.standard_normal(40).astype(np.float32) for _ in us.local_chips]
    if RANK == 0:
        errs["other_machine"] = _caught(lambda: us.all_reduce(theirs))
    else:
        errs["other_machine"] = _caught(lambda: inst.all_reduce(mine))
    # The calls still line up afterwards.
    same = np.random.default_rng(8)  # the same data on every process
    ref_in = [same.standard_normal(8).astype(np.float32) for _ in range(16)]
    ok = inst.all_reduce([ref_in[c] for c in inst.local_chips], algorithm="ring")
    ref = Instance("trn2.48xlarge").all_reduce(ref_in, algorithm="ring")
    errs["after_errors_bits_equal"] = all(
        _same_bits(o, ref.outputs[r]) for o, r in zip(ok.outputs, ok.ranks, strict=True)
    )
    return errs


def _values(c: int, idx: np.ndarray) -> np.ndarray:
    """Chip ``c``'s input at elements ``idx``: small integers, so every order of summation
    gives the exact sum (the reference)."""
    return (((idx * 31 + c * 17) % 201) - 100).astype(np.float32)


def mode_big() -> dict:
    n_elem = int(os.environ["TRN2CORE_TEST_ELEMENTS"])
    us = UltraServer(comm=WORLD)
    idx = np.arange(n_elem, dtype=np.int64)
    mine = [_values(c, idx) for c in us.local_chips]
    limit = int(os.environ["TRN2CORE_HOST_MEMORY"])
    # One process could not: the 64 outputs alone exceed the limit.
    single = None
    if RANK == 0:
        single = _caught(lambda: UltraServer().all_reduce([mine[0]] * 64))
    t0 = time.perf_counter()
    res = us.all_reduce(mine)
    wall = time.perf_counter() - t0
    rng = np.random.default_rng(3)
    sample = np.unique(np.concatenate([rng.integers(0, n_elem, 4096), [0, n_elem - 1]]))
    exact = sum(_values(c, sample).astype(np.int64) for c in range(64)).astype(np.float32)
    matches = all(
        o[sample].tobytes() == exact.tobytes() and o.shape == (n_elem,) for o in res.outputs
    )
    return {
        "single_process_error": single,
        "limit": limit,
        "total_buffer_bytes": 2 * 64 * n_elem * 4,
        "local_chips": list(us.local_chips),
        "sample_matches": matches,
        "wall_s": wall,
        "exchanged_bytes": res.report.exchanged_bytes,
        "algorithm": res.report.algorithm,
    }


def _failing_exchange(inst, action) -> None:
    """Makes process 1's exchange fail at its second round (the others are mid-collective)."""
    sp = inst._spread
    real = sp.exchange

    def exchange(round_, sends, recvs):
        if RANK == 1 and round_ >= 1:
            action()
        return real(round_, sends, recvs)

    sp.exchange = exchange


def mode_fail(how: str) -> dict:
    inst = Instance("trn2.48xlarge", comm=WORLD)
    mine = [np.full(1 << 16, c, np.float32) for c in inst.local_chips]

    def kill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def fail() -> None:
        raise MemoryError("simulated: process 1 ran out of memory")

    if how == "uncaught" and RANK == 1:
        raise RuntimeError("simulated: process 1 failed before the collective")
    if how == "badinput" and RANK == 1:  # nobody catches the error every process gets
        mine = [m.astype(np.int64) for m in mine]
    _failing_exchange(inst, kill if how == "kill" else fail)
    print(f"process {RANK} entering the all-reduce", flush=True)
    inst.all_reduce(mine, algorithm="ring")
    return {"finished": True}  # must not be reached by any process


def mode_placement() -> dict:
    out: dict = {}
    beyond = [P] * 16 if RANK == 1 else None  # refused on process 1 alone
    out["one_refused"] = _caught(lambda: Instance("trn2.48xlarge", comm=WORLD, placement=beyond))
    robin = [c % P for c in range(16)] if RANK == 0 else None  # a placement the others lack
    out["differ"] = _caught(lambda: Instance("trn2.48xlarge", comm=WORLD, placement=robin))
    inst = Instance("trn2.48xlarge", comm=WORLD)
    res = inst.all_reduce([np.full(8, c, np.float32) for c in inst.local_chips])
    out["after"] = [o.tolist() for o in res.outputs]
    return out


def _sum_over(comm) -> tuple[list[int], list[float], int]:
    """A machine over ``comm``, all-reducing chip ``c``'s ``(world rank + 1) * (c + 1)`` on the
    processes of ``comm``: the members in rank order (by mpi4py, without trn2core), the values
    the outputs hold and the report's process count."""
    inst = Instance("trn2.48xlarge", comm=comm)
    res = inst.all_reduce([np.full(4, (RANK + 1) * (c + 1), np.float32) for c in inst.local_chips])
    values = sorted({float(v) for o in res.outputs for v in o})
    return comm.allgather(RANK), values, res.report.processes


def mode_reuse() -> dict:
    out: dict = {"cases": []}
    # Two groupings of the same sizes, then one of another size: {0,2},{1,3}; {0,1},{2,3};
    # all. Under 2 processes: both, both in the other order, each alone.
    if P == 4:
        groupings = [(RANK % 2, RANK), (RANK // 2, RANK), (0, RANK)]
    else:
        groupings = [(0, RANK), (0, -RANK), (RANK, 0)]
    for color, key in groupings:
        sub = WORLD.Split(color, key)
        handle = int(sub.py2f())
        members, values, procs = _sum_over(sub)
        per = 16 // len(members)  # chips per process (the default placement)
        chips = [range(i * per + 1, (i + 1) * per + 1) for i in range(len(members))]
        expected = sum((m + 1) * sum(cs) for m, cs in zip(members, chips, strict=True))
        out["cases"].append(
            {
                "handle": handle,
                "members": members,
                "values": values,
                "expected": expected,
                "processes": procs,
            }
        )
        sub.Free()
    # A machine whose communicator was freed: a Trn2Error on every process, not an MPI error.
    sub = WORLD.Split(0, RANK)
    inst = Instance("trn2.48xlarge", comm=sub)
    sub.Free()
    out["after_free"] = _caught(
        lambda: inst.all_reduce([np.ones(4, np.float32) for _ in inst.local_chips])
    )
    # Make, use and free 50 times, with a probe communicator made (and freed) while each is in
    # use: MPI hands the same few handles out again if nothing is left behind, and a new one
    # every cycle if each cycle leaves a communicator (a duplicate not freed) alive.
    handles = set()
    for i in range(50):
        sub = WORLD.Split(RANK % 2 if i % 2 else 0, RANK)
        _sum_over(sub)
        probe = WORLD.Dup()
        handles.add(int(probe.py2f()))
        probe.Free()
        sub.Free()
    out["cycle_handles"] = len(handles)
    return out


def main() -> None:
    mode, outdir = sys.argv[1], sys.argv[2]
    if mode == "bits":
        result = mode_bits()
    elif mode == "big":
        result = mode_big()
    elif mode == "placement":
        result = mode_placement()
    elif mode == "reuse":
        result = mode_reuse()
    else:
        result = mode_fail(mode)
    with open(os.path.join(outdir, f"{mode}-{RANK}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
