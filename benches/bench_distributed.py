"""The distributed mode's speed: an all-reduce of 16 x 64 MiB fp32 on a trn2.48xlarge spread
over 2 MPI processes against the same call in one process, timed in the same job (best of
several, alternating), and the bytes the processes exchanged against the least any schedule
needs.

Run ``.venv/bin/python benches/bench_distributed.py`` (it launches itself under ``mpiexec -n 2``;
``--procs``, ``--mib``, ``--repeat`` change the set-up). Under ``make bench`` asv records
``DistributedAllReduce.track_ratio_2_processes_vs_1``.

While the single process runs, the other process sleeps (polling for the go-ahead every 5 ms
rather than spinning in MPI's busy-waiting barrier), so the baseline has the whole machine.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MI = 1 << 20
CHIPS = 16


def _inputs(chips, mib: int) -> dict:
    """The inputs of ``chips`` (the same values on every process)."""
    n = mib * MI // 4
    return {c: np.random.default_rng(c).standard_normal(n, dtype=np.float32) for c in chips}


def _wait_for(comm, source: int) -> None:
    """Receives the go-ahead from ``source`` without spinning a core."""
    req = comm.irecv(source=source, tag=7)
    while True:
        done, _ = req.test()
        if done:
            return
        time.sleep(0.005)


def worker(mib: int, repeat: int, algorithm: str) -> dict | None:
    """The timed part, on every process of the job; the figures on process 0."""
    import trn2core
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, procs = comm.Get_rank(), comm.Get_size()
    dist = trn2core.Instance("trn2.48xlarge", comm=comm)
    mine = _inputs(dist.local_chips, mib)
    local = [mine[c] for c in dist.local_chips]
    single = trn2core.Instance("trn2.48xlarge") if rank == 0 else None
    bufs = None
    if rank == 0:
        every = {**mine, **_inputs([c for c in range(CHIPS) if c not in mine], mib)}
        bufs = [every[c] for c in range(CHIPS)]
    t_single, t_dist, res = float("inf"), float("inf"), None
    for k in range(repeat + 1):  # the first round warms up (page faults, thread pools)
        # One process alone, the others asleep.
        if rank == 0:
            t0 = time.perf_counter()
            ref = single.all_reduce(bufs, algorithm=algorithm)
            t = time.perf_counter() - t0
            t_single = min(t_single, t) if k else t_single
            for p in range(1, procs):
                comm.send(None, dest=p, tag=7)
        else:
            _wait_for(comm, 0)
        comm.Barrier()
        t0 = time.perf_counter()
        res = dist.all_reduce(local, algorithm=algorithm)
        t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)  # the slowest process
        t_dist = min(t_dist, t) if k else t_dist
        if rank == 0 and k == repeat:
            same = all(
                o.tobytes() == ref.outputs[r].tobytes()
                for o, r in zip(res.outputs, res.ranks, strict=True)
            )
    rep = res.report
    sent = comm.gather(rep.sent_bytes, root=0)
    if rank != 0:
        return None
    size = mib * MI
    # Any all-reduce over P processes: each process must send what the others need of its
    # chips' contribution and receive theirs: at least 2 (P - 1) / P of a buffer each way.
    least = 2 * (procs - 1) * size
    return {
        "processes": procs,
        "chips": CHIPS,
        "mib_per_chip": mib,
        "algorithm": rep.algorithm,
        "single_s": t_single,
        "distributed_s": t_dist,
        "ratio": t_dist / t_single,
        "bits_equal": same,
        "exchanged_bytes": rep.exchanged_bytes,
        "schedule_bytes": rep.schedule_bytes,
        "least_bytes": least,
        "sent_bytes_per_process": sent,
        "rounds": rep.rounds,
        "report": str(rep),
    }


def launch(procs: int, mib: int, repeat: int, algorithm: str) -> dict:
    """Runs :func:`worker` under ``mpiexec -n procs``; its figures."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = [str(mpiexec), "-n", str(procs), sys.executable, __file__, "--worker",
           "--mib", str(mib), "--repeat", str(repeat), "--algorithm", algorithm]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _text(r: dict) -> str:
    gib = 1 << 30
    return "\n".join(
        [
            f"all-reduce of {r['chips']} x {r['mib_per_chip']} MiB fp32 on a trn2.48xlarge "
            f"({r['algorithm']}), best of the timed rounds:",
            f"  one process            {r['single_s'] * 1e3:8.1f} ms",
            f"  {r['processes']} processes            {r['distributed_s'] * 1e3:8.1f} ms  "
            f"= {r['ratio']:.2f} x one process (target: within 2x)",
            f"  bits equal             {r['bits_equal']}",
            f"  bytes exchanged        {r['exchanged_bytes'] / gib:.3f} GiB in {r['rounds']} "
            f"rounds = {r['exchanged_bytes'] / r['least_bytes']:.2f} x the least any schedule "
            f"needs ({r['least_bytes'] / gib:.3f} GiB); the schedule's own transfers would move "
            f"{r['schedule_bytes'] / gib:.3f} GiB",
        ]
    )


class DistributedAllReduce:
    """asv: the 2-process all-reduce against one process (a launch of ``mpiexec``)."""

    timeout = 1800

    def track_ratio_2_processes_vs_1(self):
        return launch(2, 64, 3, "auto")["ratio"]

    track_ratio_2_processes_vs_1.unit = "x one process's time"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--mib", type=int, default=64, help="MiB per chip (default 64)")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds (default 3)")
    ap.add_argument("--algorithm", default="auto")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        r = worker(a.mib, a.repeat, a.algorithm)
        if r is not None:
            print(json.dumps(r), flush=True)
        return
    r = launch(a.procs, a.mib, a.repeat, a.algorithm)
    print(json.dumps(r) if a.json else _text(r))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
