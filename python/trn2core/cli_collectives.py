"""The chip and collective commands of the ``trn2core`` CLI: ``ls`` (like ``neuron-ls``),
``nccom-test`` (like Neuron's ``nccom-test``), and the collectives part of ``trn2core demo``."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import _validate, cli_check, spec
from .collectives import (
    ALGORITHMS,
    NCCOM_DATATYPES,
    nccom_rows,
    nccom_sizes,
    nccom_table,
    parse_size,
)
from .topology import INSTANCE_TYPES, Instance, UltraCluster, UltraServer

__all__ = ["add_commands", "demo_collectives", "ls_text"]

_NCCOM_OPS = {
    "allr": "all_reduce", "all_reduce": "all_reduce",
    "allg": "all_gather", "all_gather": "all_gather",
    "redsct": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "sendrecv": "send_recv", "send_recv": "send_recv",
}  # fmt: skip


def _box(rows: list[list[str]], head: list[list[str]]) -> str:
    """A neuron-ls style box table; ``head`` is a list of header lines."""
    cols = len(rows[0]) if rows else len(head[0])
    w = [max([len(h[c]) for h in head] + [len(r[c]) for r in rows]) + 2 for c in range(cols)]
    sep = "+" + "+".join("-" * x for x in w) + "+"
    out = [sep]
    for h in head:
        out.append("|" + "|".join(h[c].center(w[c]) for c in range(cols)) + "|")
    out.append(sep)
    for r in rows:
        out.append("|" + "|".join((" " + r[c]).ljust(w[c]) for c in range(cols)) + "|")
    out.append(sep)
    return "\n".join(out)


def _machine(args: argparse.Namespace):
    if getattr(args, "ultracluster", None) is not None:  # 0 is refused, not ignored
        return UltraCluster(args.ultracluster, lnc=args.lnc)
    if getattr(args, "ultraserver", False):
        return UltraServer(lnc=args.lnc)
    return Instance(args.instance, lnc=args.lnc)


def ls_text(machine) -> str:
    """The machine's chips as ``neuron-ls`` shows them, with torus coordinates and links."""
    topo = machine.topology
    per_chip = spec.cores_per_chip // machine.lnc
    mem_gb = spec.hbm_chip_bytes / (1 << 30)
    lines = [
        f"instance-type: {machine.name}",
        f"logical-neuroncore-config: {machine.lnc}",
        f"neuron-devices: {topo.size} (Trainium2, {spec.cores_per_chip} physical NeuronCore-v3 "
        f"each, {per_chip} logical cores at LNC={machine.lnc})",
        (
            f"topology: {'x'.join(map(str, topo.torus_shape))} NeuronLink torus"
            if topo.torus_shape
            else "topology: one chip (no NeuronLink links)"
        )
        + (f", {topo.ultraservers} UltraServers joined by EFA" if topo.ultraservers > 1 else ""),
        f"links per direction: X/Y {spec.neuronlink_xy_link_bytes_per_s / 1e9:.0f} GB/s"
        + (
            f", Z {spec.neuronlink_z_link_bytes_per_s / 1e9:.0f} GB/s"
            if len(topo.torus_shape) > 2
            else ""
        )
        + (
            f", EFA {spec.efa_chip_bits_per_s / 1e9:.0f} Gbps per chip "
            f"(~{spec.efa_latency_s * 1e6:.0f} us)"
            if topo.ultraservers > 1
            else ""
        ),
    ]
    if not topo.torus_shape:
        lines.pop()  # no links to describe
    shown = topo.size // topo.ultraservers
    rows = []
    for i in range(shown):
        first = i * per_chip
        rows.append(
            [
                str(i),
                str(per_chip),
                f"{first}-{first + per_chip - 1}" if per_chip > 1 else str(first),
                f"{mem_gb:.0f} GB",
                ", ".join(map(str, topo.neighbors(i))) or "-",
                "(" + ", ".join(map(str, topo.coords(i))) + ")",
            ]
        )
    head = [
        ["NEURON", "NEURON", "NEURON", "NEURON", "CONNECTED", "TORUS"],
        ["DEVICE", "CORES", "CORE IDS", "MEMORY", "DEVICES", "COORDS"],
    ]
    lines.append(_box(rows, head))
    if topo.ultraservers > 1:
        lines.append(
            f"... and {topo.ultraservers - 1} more UltraServers of the same layout: device "
            f"s*{shown}+i is device i of UltraServer s, reached over EFA"
        )
    return "\n".join(lines)


def cmd_ls(args: argparse.Namespace) -> int:
    print(ls_text(_machine(args)))
    return 0


def cmd_nccom_test(args: argparse.Namespace) -> int:
    op = _NCCOM_OPS[args.operation]
    sizes = nccom_sizes(
        parse_size(args.minbytes, "minbytes"),
        parse_size(args.maxbytes, "maxbytes"),
        args.stepfactor,
        parse_size(args.stepbytes, "stepbytes") if args.stepbytes is not None else None,
    )
    rows = nccom_rows(op, args.nworkers, sizes, args.datatype, args.lnc, args.algorithm)
    world = cli_check.mpi_world() if args.check else None  # under mpiexec: spread the check
    if world is None or world.Get_rank() == 0:
        print(nccom_table(rows, args.datatype, args.show_algorithm))
    if args.check:
        return cli_check.run(
            op, args.nworkers, sizes, args.datatype, args.lnc, args.algorithm, world
        )
    return 0


def add_commands(sub) -> None:
    """Adds ``ls`` and ``nccom-test`` to the CLI's subparsers."""
    ls = sub.add_parser("ls", help="the chips, cores and links of a machine, like neuron-ls")
    ls.add_argument(
        "--instance", default="trn2.48xlarge", choices=tuple(INSTANCE_TYPES),
        help="instance type (default trn2.48xlarge)",
    )  # fmt: skip
    ls.add_argument("--ultraserver", action="store_true", help="a Trn2 UltraServer (64 chips)")
    ls.add_argument("--ultracluster", type=int, metavar="N", help="N UltraServers joined by EFA")
    ls.add_argument("--lnc", type=int, default=2, choices=(1, 2, 4), help="Logical NeuronCore size")
    ls.set_defaults(func=cmd_ls)
    nc = sub.add_parser(
        "nccom-test",
        help="predicted collective performance, in the columns of Neuron's nccom-test",
        description=(
            "Predicts Neuron's nccom-test on Trainium2: RANKS are logical NeuronCores "
            "(8 / lnc per chip) on as many chips as they need (a trn2.48xlarge up to 16 chips, "
            "an UltraServer up to 64, then whole UltraServers over EFA). Sizes take binary units "
            "(32M, 1kb, 1GB). As nccom-test prints them (since 2025), algbw and busbw are "
            "size / time in GB/s (10^9 bytes/s) and busbw = algbw x the collective's bus "
            "factor. Times are calibrated on the nccom-test examples AWS publishes; the last "
            "line gives the range those fell in (docs/fidelity.md)."
        ),
    )
    nc.add_argument("operation", choices=tuple(_NCCOM_OPS), help="collective operation")
    nc.add_argument("-r", "--nworkers", type=int, required=True, help="ranks (logical cores)")
    nc.add_argument("-b", "--minbytes", default="32M", help="first size (default 32M)")
    nc.add_argument("-e", "--maxbytes", default="32M", help="last size (default 32M)")
    nc.add_argument("-f", "--stepfactor", type=int, help="multiply the size by this each row")
    nc.add_argument("-i", "--stepbytes", help="add this to the size each row")
    nc.add_argument(
        "-d", "--datatype", default="uint8", choices=tuple(NCCOM_DATATYPES),
        help="element type (default uint8)",
    )  # fmt: skip
    nc.add_argument("--lnc", type=int, default=2, choices=(1, 2, 4), help="Logical NeuronCore size")
    nc.add_argument("--algorithm", default="auto", choices=ALGORITHMS, help="collective algorithm")
    nc.add_argument("--show-algorithm", action="store_true", help="add an algorithm column")
    nc.add_argument(
        "-c", "--check", action="store_true",
        help="also run each size on data and check every output (under mpiexec or srun, with "
        "the chips spread over the MPI processes: docs/distributed.md)",
    )  # fmt: skip
    nc.set_defaults(func=cmd_nccom_test)


def demo_collectives(out=sys.stdout, traces: list | None = None) -> None:
    """The chips-and-collectives part of the demo."""
    from .chip import Chip
    from .engine import gemm
    from .numerics import quantize

    p = lambda *a: print(*a, file=out)  # noqa: E731
    inst = Instance("trn2.48xlarge")
    p("== Collectives on a trn2.48xlarge: 16 chips on a 4 x 4 NeuronLink torus ==")
    rng = np.random.default_rng(0)
    n = 1 << 20
    ints = [rng.integers(-1000, 1000, n).astype(np.float32) for _ in range(16)]
    res = inst.all_reduce(ints)
    exact = np.array_equal(res.outputs[5], np.sum(np.stack(ints), 0))
    same = all(
        np.array_equal(o.view(np.uint32), res.outputs[0].view(np.uint32)) for o in res.outputs
    )
    p(f"   all-reduce of 16 x {n:,} fp32 (integer values): equals numpy's sum: {exact}; "
      f"all 16 ranks bit-identical: {same}")  # fmt: skip
    floats = [rng.standard_normal(n, dtype=np.float32) for _ in range(16)]
    res = inst.all_reduce(floats, algorithm="ring")
    ref = np.sum(np.stack(floats).astype(np.float64), 0)
    err = np.abs(res.outputs[0] - ref).max()
    p(f"   random floats, ring order: max |result - float64 sum| = {err:.2e} "
      "(fp32 reduction, order fixed by the ring)")  # fmt: skip
    big = [rng.standard_normal(4 << 20, dtype=np.float32) for _ in range(16)]
    t_np = min(_timed(lambda: np.sum(np.stack(big), 0)) for _ in range(2))
    t_us = min(_timed(lambda: inst.all_reduce(big)) for _ in range(2))
    p(f"   emulation speed, 16 x 16 MiB fp32: trn2core {t_us * 1e3:.0f} ms (16 outputs), "
      f"np.sum(np.stack(bufs), 0) {t_np * 1e3:.0f} ms (one output)")  # fmt: skip
    p()
    p("== Predicted all-reduce busbw (GB/s) on a trn2.48xlarge, by size and algorithm ==")
    algs = ("mesh", "rdh", "ring", "torus", "kangaring", "auto")
    rows = [("size",) + algs]
    for size in (8 << 10, 1 << 20, 16 << 20, 64 << 20, 1 << 30):
        cells = [_fmt_bytes(size)]
        for a in algs:
            r = inst.estimate("all_reduce", size, algorithm=a)
            cells.append(f"{r.busbw / 1e9:.1f}" + (f" ({r.algorithm})" if a == "auto" else ""))
        rows.append(tuple(cells))
    p(_table(rows))
    p(f"   each chip can send {inst.topology.chip_link_capacity / 1e9:.0f} GB/s over its four "
      "X/Y links; only KangaRing's four rings use them all at once")  # fmt: skip
    p(f"   collectives achieve {100 * spec.neuronlink_achieved_fraction:.0f}% of a link and pay "
      "the runtime's fixed costs, as calibrated on AWS's published nccom-test runs "
      "(docs/fidelity.md)")  # fmt: skip
    p()
    p("== Bigger machines: 1 GiB all-reduce ==")
    rows = [("machine", "chips", "algorithm", "time", "busbw GB/s", "bound", "costed in")]
    for m in (inst, UltraServer(), UltraCluster(32)):
        t0 = time.perf_counter()
        r = m.estimate("all_reduce", 1 << 30)
        dt = time.perf_counter() - t0
        rows.append((m.name, str(m.topology.size), r.algorithm, f"{r.seconds * 1e3:.2f} ms",
                     f"{r.busbw / 1e9:.1f}", r.bound, f"{dt * 1e3:.1f} ms"))  # fmt: skip
    p(_table(rows))
    if traces is not None:  # the demo's merged Perfetto trace: one track per link
        traces.append(("all_reduce 64 MiB, trn2.48xlarge", inst.estimate("all_reduce", 64 << 20)))
    p()
    p("== Logical NeuronCores: a 4096^3 bf16 GEMM on one logical core (timing only) ==")
    from .engine import estimate_gemm

    rows = [("LNC", "physical cores", "time", "TFLOPS", "split M x N x K")]
    for lnc in (1, 2, 4):
        lc = Chip(lnc=lnc).cores[0]
        r = estimate_gemm(4096, 4096, 4096, dtype="bf16", core=lc)
        d = r.details
        rows.append((str(lnc), str(list(lc.physical_core_indices)), f"{r.seconds * 1e6:.0f} us",
                     f"{r.tflops:.0f}", f"{d['split_m']:.0f} x {d['split_n']:.0f} x "
                     f"{d['split_k']:.0f}"))  # fmt: skip
    p(_table(rows))
    a = quantize(rng.standard_normal((256, 1024)), "bf16")
    b = quantize(rng.standard_normal((1024, 512)), "bf16")
    same = np.array_equal(gemm(a, b, core=Chip(lnc=2).cores[0]).out, gemm(a, b).out)
    p(f"   the same GEMM's bits on one physical core and on an LNC=2 core are identical: {same}")
    p("   (AWS documents LNC=1 and LNC=2 for Trn2; LNC=4, a whole die, is a trn2core extension)")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _fmt_bytes(n: int) -> str:
    return _validate.human_bytes(n, exact=False)


def _table(rows) -> str:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "   " + "\n   ".join(out)
