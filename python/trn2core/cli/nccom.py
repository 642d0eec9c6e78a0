"""The chip and collective commands of the ``trn2core`` CLI: ``ls`` (like ``neuron-ls``),
``nccom-test`` (like Neuron's ``nccom-test``), and the collectives part of ``trn2core demo``."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time

import numpy as np

from .. import _core, _validate, spec
from .._names import ALGORITHMS
from .._progress import Progress
from ..chip import default_lnc
from ..errors import Trn2ValueError
from ..nccom import (
    NCCOM_DATATYPES,
    nccom_avg_busbw,
    nccom_chips,
    nccom_results,
    nccom_rows,
    nccom_sizes,
    nccom_table,
    parse_size,
    parse_src_target_pairs,
    parse_stats,
)
from ..report import core_fields
from ..topology import INSTANCE_TYPES, Instance, UltraCluster, UltraServer
from . import check as cli_check

__all__ = [
    "add_commands",
    "demo_collectives",
    "ls_devices",
    "ls_json",
    "ls_text",
    "ls_topology",
    "nccom_lnc",
    "nccom_report",
]

_NCCOM_OPS = {
    "allr": "all_reduce",
    "all_reduce": "all_reduce",
    "allg": "all_gather",
    "all_gather": "all_gather",
    "redsct": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "sendrecv": "send_recv",
    "send_recv": "send_recv",
    "permute": "permute",
}


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
    lnc = nccom_lnc(args.lnc)
    if getattr(args, "ultracluster", None) is not None:  # 0 is refused, not ignored
        return UltraCluster(args.ultracluster, lnc=lnc)
    if getattr(args, "ultraserver", False):
        return UltraServer(lnc=lnc)
    return Instance(args.instance, lnc=lnc)


#: The keys of one device in ``neuron-ls --json-output``, in its order.
NEURON_LS_KEYS = (
    "neuron_device",
    "bdf",
    "cpu_affinity",
    "numa_node",
    "connected_to",
    "nc_count",
    "logical_neuroncore_config",
    "memory_size",
    "neuroncore_ids",
    "neuron_processes",
)


def ls_devices(machine) -> list[dict]:
    """The machine's chips as ``neuron-ls -j`` prints them: a list of devices, each with
    ``NEURON_LS_KEYS``: ``nc_count`` logical cores, ``neuroncore_ids``, ``memory_size`` (HBM
    bytes), ``connected_to`` (NeuronLink neighbours), ``logical_neuroncore_config``. The host
    facts of a real machine (``bdf``, the PCI address; ``cpu_affinity``; ``numa_node``) are
    ``null``: an emulated chip sits on no PCI bus; ``neuron_processes`` is empty (no process
    holds an emulated device). Every chip of the machine is listed."""
    topo = machine.topology
    per_chip = spec.cores_per_chip // machine.lnc
    devices = []
    for i in range(topo.size):
        devices.append(
            {
                "neuron_device": i,
                "bdf": None,
                "cpu_affinity": None,
                "numa_node": None,
                "connected_to": [int(n) for n in topo.neighbors(i)],
                "nc_count": per_chip,
                "logical_neuroncore_config": machine.lnc,
                "memory_size": int(spec.hbm_chip_bytes),
                "neuroncore_ids": list(range(i * per_chip, (i + 1) * per_chip)),
                "neuron_processes": [],
            }
        )
    return devices


def ls_json(machine) -> dict:
    """The machine as one JSON object (``ls --topology --json``): ``instance_type``,
    ``logical_neuroncore_config``, ``torus_shape``, ``ultraservers`` and ``neuron_devices``, a
    list with, per chip, the keys of ``neuron-ls -j`` that describe it (``neuron_device``,
    ``nc_count``: logical cores, ``neuroncore_ids``, ``memory_size``: HBM bytes,
    ``connected_to``: NeuronLink neighbours, ``logical_neuroncore_config``) and
    ``torus_coords``. Every chip of the machine is listed."""
    topo = machine.topology
    keep = (
        "neuron_device",
        "nc_count",
        "neuroncore_ids",
        "memory_size",
        "connected_to",
        "logical_neuroncore_config",
    )
    devices = [
        {**{k: d[k] for k in keep}, "torus_coords": [int(c) for c in topo.coords(i)]}
        for i, d in enumerate(ls_devices(machine))
    ]
    return {
        "instance_type": machine.name,
        "logical_neuroncore_config": machine.lnc,
        "torus_shape": list(topo.torus_shape),
        "ultraservers": topo.ultraservers,
        "neuron_devices": devices,
    }


def ls_topology(machine) -> str:
    """``ls --topology``: the NeuronLink torus drawn as a grid of device numbers (one grid per
    Z plane of an UltraServer; device ``i`` at its torus coordinates), every row and column
    wrapping around."""
    topo = machine.topology
    shape = list(topo.torus_shape)
    if not shape:
        return "one chip: no NeuronLink torus (device 0)"
    x, y = shape[0], shape[1]
    planes = shape[2] if len(shape) > 2 else 1
    width = len(str(topo.size - 1))
    lines = [
        f"NeuronLink torus {' x '.join(map(str, shape))}: every row (X) and column (Y)"
        + (" and Z line" if planes > 1 else "")
        + " wraps around; X/Y links "
        f"{spec.neuronlink_xy_link_bytes_per_s / 1e9:.0f} GB/s per direction"
        + (f", Z {spec.neuronlink_z_link_bytes_per_s / 1e9:.0f} GB/s" if planes > 1 else "")
    ]
    per_server = topo.size // topo.ultraservers
    for z in range(planes):
        if planes > 1:
            lines.append(f"z = {z}:")
        for j in range(y):
            extra = (z,) if planes > 1 else ()
            extra += (0,) * (len(topo.shape) - len(shape))  # UltraServer 0 of a cluster
            ids = [topo.index((i, j, *extra)) for i in range(x)]
            lines.append("  " + " -- ".join(f"{d:>{width}}" for d in ids))
            if j < y - 1:
                lines.append("  " + "    ".join(" " * (width - 1) + "|" for _ in ids))
    if topo.ultraservers > 1:
        lines.append(
            f"... and {topo.ultraservers - 1} more UltraServers of the same layout (device "
            f"s*{per_server}+i is device i of UltraServer s), joined by EFA"
        )
    return "\n".join(lines)


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
    machine = _machine(args)
    if args.json and args.topology:
        print(json.dumps(ls_json(machine), indent=1))
    elif args.json:
        print(json.dumps(ls_devices(machine), indent=1))
    elif args.topology:
        print(ls_topology(machine))
    else:
        print(ls_text(machine))
    return 0


def nccom_permute_rows(pairs, ranks: int, sizes, datatype: str, lnc: int, nnodes: int = 1):
    """nccom-test's ``permute``: rank ``src`` sends its ``size`` bytes to rank ``dst`` for every
    pair, all at once. Modelled as the other nccom-test rows are: pairs within one chip are HBM
    copies (read and write, at the chip's HBM bandwidth, one DMA fixed cost), pairs across
    chips a send/recv between the two chips (all of a chip pair's ranks' bytes together; the
    slowest chip pair sets the time, pairs of chips are costed separately, so links two chip
    pairs share are not contended), the two stages overlapped, plus the runtime's fixed cost
    of one operation. A rank sending to itself moves nothing. Rows as ``nccom_rows``
    (``busbw = algbw``: the bus factor of a permute is 1)."""
    if datatype not in NCCOM_DATATYPES:
        raise Trn2ValueError(f"datatype: unknown nccom-test data type {datatype!r}")
    chips = nccom_chips(ranks, nnodes, lnc)
    per_chip = spec.cores_per_chip // lnc
    elem = NCCOM_DATATYPES[datatype]
    local: dict[int, int] = {}
    cross: dict[tuple[int, int], int] = {}
    for s, d in pairs:
        if s == d:
            continue
        cs, cd = s // per_chip, d // per_chip
        if cs == cd:
            local[cs] = local.get(cs, 0) + 1
        else:
            cross[(cs, cd)] = cross.get((cs, cd), 0) + 1
    machine, order = cli_check._machine(chips, None) if cross else (None, [])
    intra_fixed = spec.dma_fixed_cost_s + spec.dma_hbm_read_latency_s
    rows = []
    for size in sizes:
        size = max(elem, size - size % elem)
        base = _core.nccom_estimate("send_recv", int(ranks), int(lnc), int(size), elem, "auto")
        fixed = base.op_fixed_s
        intra_bytes = 2.0 * size * max(local.values(), default=0)
        cross_s, alg, phases = 0.0, "local", []
        for (a, b), n in sorted(cross.items()):
            r = machine.estimate(
                "send_recv",
                n * size,
                dtype="fp32" if n * size % 4 == 0 else "fp8_e4m3",
                chips=[order[a], order[b]],
                peers=[1, 0],
            )
            if r.seconds - r.op_fixed_s > cross_s:
                cross_s, alg, phases = r.seconds - r.op_fixed_s, r.algorithm, list(r.phases)
        intra_s = intra_fixed + intra_bytes / spec.hbm_chip_bytes_per_s if intra_bytes else 0.0
        if intra_bytes:
            seconds = fixed + max(cross_s, intra_bytes / spec.hbm_chip_bytes_per_s) + intra_fixed
        else:
            seconds = fixed + cross_s
        algbw = size / seconds if seconds > 0 else 0.0
        rows.append(
            {
                "size_bytes": size,
                "count": size // elem,
                "seconds": seconds,
                "algbw": algbw,
                "busbw": algbw,
                "algorithm": alg,
                "chips": chips,
                "op_fixed_s": fixed,
                "intra_chip_s": intra_s,
                "intra_chip_bytes": intra_bytes,
                "phases": phases,
                "uncertainty": core_fields(base.uncertainty),
            }
        )
    return rows


#: Operations of Neuron's nccom-test that trn2core does not model, and why.
_NCCOM_UNMODELLED_OPS = {
    "allgv": "all-gatherv: variable counts per rank",
    "all_gatherv": "all-gatherv: variable counts per rank",
    "alltoallv": "all-to-allv: variable counts per rank",
}

#: Flags of Neuron's nccom-test that trn2core cannot model: (flags, takes a value, why).
_NCCOM_UNMODELLED_FLAGS = [
    (("-I", "--neff_iters", "--neff-iters"), True, "there are no NEFFs to repeat"),
    (("-W", "--neff_warmup_iters", "--neff-warmup-iters"), True, "there are no NEFFs to repeat"),
    (("--unique-buff",), False, "buffer reuse and its handshakes are not modelled"),
    (("--coalesced-cc-size-ratio",), True, "coalesced operations are not modelled"),
    (("--shared-output-buff",), False, "shared output buffers are not modelled"),
    (("--variable-size-op-metadata",), True, "variable-size operations are not modelled"),
    (("--mpi-log-dir",), True, "there are no per-node logs (for MPI, see docs/distributed.md)"),
    (("-S", "--slurm-mode"), False, "run `srun trn2core nccom-test ... --check` instead"),
    (("-u", "--slurm-vcpus-per-node"), True, "Slurm allocation is not part of the model"),
    (("--slurm-setup-script",), True, "Slurm allocation is not part of the model"),
    (("--slurm-job-id",), True, "Slurm allocation is not part of the model"),
    (("--slurm-use-head-node-neuron-bench",), False, "there is no neuron-bench to copy"),
    (("--sb2sb",), False, "collectives on SBUF buffers are not modelled"),
    (("--input-shape",), True, "collectives on SBUF buffers are not modelled"),
    (("--output-shape",), True, "collectives on SBUF buffers are not modelled"),
    (("--cc-dim",), True, "collectives on SBUF buffers are not modelled"),
    (("--data-parallel-dimension",), True, "concurrent sub-groups are not modelled"),
    (("--custom-replica-groups",), True, "custom replica groups are not modelled"),
    (("--streams-json",), True, "concurrent streams are not modelled"),
    (("--show-input-output-size",), False, "per-rank input and output sizes are not printed"),
    (("--vcpu-pin-mode",), False, "host threads are not modelled"),
    (("--data-collector-port",), True, "there is no data collector"),
    (("--data-collector-host",), True, "there is no data collector"),
    (("--debug",), False, "there is no runtime to log"),
]


_WHY = {flags[0]: why for flags, _, why in _NCCOM_UNMODELLED_FLAGS}


class _Unmodelled(argparse.Action):
    """An AWS nccom-test flag trn2core cannot model: a usage error naming it and why."""

    def __call__(self, parser, namespace, values, option_string=None):
        why = _WHY[self.option_strings[0]]
        parser.error(
            f"{option_string} is a flag of Neuron's nccom-test that trn2core cannot model ({why})"
        )


def _operation(text: str) -> str:
    if text in _NCCOM_OPS:
        return text
    if text in _NCCOM_UNMODELLED_OPS:
        raise argparse.ArgumentTypeError(
            f"{text} ({_NCCOM_UNMODELLED_OPS[text]}) is an operation of Neuron's nccom-test "
            f"that trn2core does not model; modelled: {', '.join(_NCCOM_OPS)}"
        )
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(_NCCOM_OPS)})"
    )


#: The names Neuron's nccom-test gives its FP8 type: Neuron's fp8_e4m3 (max 240).
_NCCOM_DATATYPE_ALIASES = {"fp8": "fp8_e4m3", "fp8e4": "fp8_e4m3"}


def _datatype(text: str) -> str:
    t = _NCCOM_DATATYPE_ALIASES.get(text, text)
    if t not in NCCOM_DATATYPES:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(NCCOM_DATATYPES)}, fp8, fp8e4)"
        )
    return t


def _count(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {lo}, got {text!r}"
            ) from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lo}, got {v}")
        return v

    return parse


def nccom_lnc(flag: int | None) -> int:
    """The Logical NeuronCore size of a run: ``--lnc`` when given, else the environment's
    ``NEURON_LOGICAL_NC_CONFIG`` (as Neuron's tools read it), else 2 (Trn2's default)."""
    return flag if flag is not None else default_lnc()


def nccom_report(args: argparse.Namespace) -> tuple[list, dict]:
    """The rows of an nccom-test run and its JSON report (``config`` and ``results``)."""
    op = _NCCOM_OPS[args.operation]
    lnc = nccom_lnc(args.lnc)
    stats = parse_stats(args.stats)
    sizes = nccom_sizes(
        parse_size(args.minbytes, "minbytes"),
        parse_size(args.maxbytes, "maxbytes"),
        args.stepfactor,
        parse_size(args.stepbytes, "stepbytes") if args.stepbytes is not None else None,
    )
    chips = nccom_chips(args.nworkers, args.nnodes, lnc)
    pairs = None
    if op == "permute":
        if args.custom_src_target_pairs is None:
            raise Trn2ValueError(
                "custom_src_target_pairs: permute needs --custom-src-target-pairs FILE (JSON: "
                '{"src_target_pairs": [[[0, 1], [1, 0], ...]]})'
            )
        with open(args.custom_src_target_pairs, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except ValueError as e:
                raise Trn2ValueError(
                    f"custom_src_target_pairs: {args.custom_src_target_pairs} is not JSON: {e}"
                ) from None
        pairs = parse_src_target_pairs(data, args.nworkers)
    elif args.custom_src_target_pairs is not None:
        raise Trn2ValueError("custom_src_target_pairs: only the permute operation takes pairs")
    rows = []
    with Progress(f"{op} sizes", len(sizes), live=not args.non_interactive) as bar:
        for size in sizes:
            if op == "permute":
                rows += nccom_permute_rows(
                    pairs, args.nworkers, [size], args.datatype, lnc, args.nnodes
                )
            else:
                rows += nccom_rows(op, args.nworkers, [size], args.datatype, lnc, args.algorithm)
            bar.step()
    config = {
        "operation": op,
        "nworkers": args.nworkers,
        "nnodes": args.nnodes,
        "lnc": lnc,
        "chips": chips,
        "datatype": args.datatype,
        "sizes": [int(r["size_bytes"]) for r in rows],
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "stats": stats,
        "algorithm": args.algorithm,
        "deterministic": True,
        "bandwidth_unit": "GB/s = 10^9 bytes/s",
        "time_unit": "us",
    }
    if pairs is not None:
        config["src_target_pairs"] = [list(p) for p in pairs]
    report = {
        "config": config,
        "results": nccom_results(rows, args.datatype, stats, show_algorithm=True),
        "avg_busbw(GB/s)": nccom_avg_busbw(rows),
        "uncertainty": dict(rows[0]["uncertainty"]) if rows else None,
    }
    return rows, report


#: The modes of ``-c/--check``, as Neuron's nccom-test names them (``random`` is a bare -c's).
CHECK_MODES = ("random", "all_ones")


def bare_check(argv: list[str]) -> list[str]:
    """``argv`` with ``random`` after every ``-c``/``--check`` of ``nccom-test`` not followed by
    a mode, so a bare flag before the operation (``--check allg``, as in AWS's examples) still
    leaves the operation to the operation."""
    if "nccom-test" not in argv:
        return argv
    out = list(argv)
    start = out.index("nccom-test")
    i = start + 1
    while i < len(out):
        if out[i] == "--":
            break
        nxt = out[i + 1] if i + 1 < len(out) else None
        bare = (
            nxt is None or nxt.startswith("-") or nxt in _NCCOM_OPS or nxt in _NCCOM_UNMODELLED_OPS
        )
        if out[i] in ("-c", "--check") and bare:
            out.insert(i + 1, "random")
        i += 1
    return out


def nccom_nnodes(nnodes: int | None, hosts: list[str] | None, hosts_file: str | None) -> int:
    """The node count of a run: ``-N`` when given, else the number of hosts (``--hosts`` or
    ``--hosts-file``, one per non-blank line, as Neuron's tool reads them), else 1. A ``-N``
    that disagrees with the hosts is a ``Trn2ValueError`` naming ``nnodes``."""
    if hosts_file is not None:
        try:
            with open(hosts_file, encoding="utf-8") as f:
                hosts = [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise Trn2ValueError(f"hosts_file: cannot read {hosts_file}: {e.strerror}") from None
        if not hosts:
            raise Trn2ValueError(f"hosts_file: {hosts_file} lists no hosts")
    if hosts is None:
        return 1 if nnodes is None else nnodes
    if nnodes is not None and nnodes != len(hosts):
        raise Trn2ValueError(
            f"nnodes: -N {nnodes} but {len(hosts)} host{'s are' if len(hosts) != 1 else ' is'} "
            "given; the hosts are the nodes "
            "(leave out -N, or give one host per node)"
        )
    return len(hosts)


def cmd_nccom_test(args: argparse.Namespace) -> int:
    op = _NCCOM_OPS[args.operation]
    args.nnodes = nccom_nnodes(args.nnodes, args.hosts, args.hosts_file)
    if args.seed is not None and args.check != "random":
        raise Trn2ValueError("seed: --seed seeds the inputs of --check random; add -c")
    if args.check and op == "permute":
        raise Trn2ValueError("check: --check does not run permute on data (its time is modelled)")
    if args.stepfactor is None and args.stepbytes is None and not args.json:
        lo, hi = parse_size(args.minbytes, "minbytes"), parse_size(args.maxbytes, "maxbytes")
        if hi >= 1024 * lo:
            print(
                f"trn2core nccom-test: sizes step by (maxbytes - minbytes) / 10 = "
                f"{max(1, (hi - lo) // 10)} bytes, nccom-test's default; -f 2 doubles the size "
                "each row instead",
                file=sys.stderr,
            )
    rows, report = nccom_report(args)
    world = cli_check.mpi_world() if args.check else None  # under mpiexec: spread the check
    if world is None or world.Get_rank() == 0:
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print(nccom_table(rows, args.datatype, args.show_algorithm, report["config"]["stats"]))
        if args.report_to_json_file:
            with open(args.report_to_json_file, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
    if args.check:
        return cli_check.run(
            op,
            args.nworkers,
            report["config"]["sizes"],
            args.datatype,
            report["config"]["lnc"],
            args.algorithm,
            world,
            out=sys.stderr if args.json else None,
            mode=args.check,
            seed=args.seed,
        )
    return 0


def _add_lnc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2, 4),
        help="Logical NeuronCore size (default: NEURON_LOGICAL_NC_CONFIG, else 2)",
    )


def _fill(text: str) -> str:
    """A paragraph wrapped for --help without breaking flags at their hyphens."""
    return textwrap.fill(text, width=79, break_on_hyphens=False, break_long_words=False)


def add_commands(sub) -> None:
    """Adds ``ls`` and ``nccom-test`` to the CLI's subparsers."""
    ls = sub.add_parser(
        "ls",
        help="the chips, cores and links of a machine, like neuron-ls",
        description="The Neuron devices (chips) of a machine as neuron-ls lists them: device, "
        "cores, core ids, memory and connected devices, plus each chip's torus coordinates. "
        "The logical-core size is --lnc, else NEURON_LOGICAL_NC_CONFIG, else 2.",
    )
    ls.add_argument(
        "--instance",
        default="trn2.48xlarge",
        choices=tuple(INSTANCE_TYPES),
        help="instance type (default trn2.48xlarge)",
    )
    ls.add_argument("--ultraserver", action="store_true", help="a Trn2 UltraServer (64 chips)")
    ls.add_argument("--ultracluster", type=int, metavar="N", help="N UltraServers joined by EFA")
    _add_lnc(ls)
    ls.add_argument(
        "-j",
        "--json",
        "--json-output",
        action="store_true",
        dest="json",
        help="neuron-ls's JSON: a list of devices with its keys (neuron_device, bdf, "
        "cpu_affinity, numa_node, connected_to, nc_count, logical_neuroncore_config, "
        "memory_size, neuroncore_ids, neuron_processes; the host facts are null); with -t, "
        "one object with the machine's facts (instance_type, torus_shape, ...)",
    )
    ls.add_argument(
        "-t",
        "--topology",
        action="store_true",
        help="the NeuronLink torus as a grid of devices (with -j: the machine as one object)",
    )
    ls.set_defaults(func=cmd_ls)
    nc = sub.add_parser(
        "nccom-test",
        help="predicted collective performance, in the columns of Neuron's nccom-test",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_fill(
            "Predicts Neuron's nccom-test on Trainium2. A rank is a logical NeuronCore, as in "
            "Neuron's tool: 8 / LNC per chip (LNC from --lnc, else NEURON_LOGICAL_NC_CONFIG, else"
            " 2), the -r ranks divided equally over -N nodes (16-chip instances). Sizes take "
            "binary units (32M, 1kb, 1GB, 1MiB); without -f or -i the size steps by (max - min) /"
            " 10, as Neuron's tool does. Columns: size(B) count(elems) type time:avg(us) "
            "algbw(GB/s) busbw(GB/s); GB/s = 10^9 bytes/s (size / time, as every nccom-test "
            "output published since 2025 is), busbw = algbw x the collective's bus factor. The "
            "model is deterministic: every iteration takes the same time, so -t percentiles equal"
            " the average. Times are calibrated on the nccom-test examples AWS publishes; the "
            "last line gives the range those fell in (docs/fidelity.md). Flags of Neuron's tool "
            "that cannot be modelled are refused by name."
        ),
        epilog=_fill(
            "Flags of Neuron's nccom-test not modelled (refused with the reason): "
            + ", ".join("/".join(f) for f, _, _ in _NCCOM_UNMODELLED_FLAGS)
            + "; operations "
            + ", ".join(_NCCOM_UNMODELLED_OPS)
            + "."
        ),
    )
    nc.add_argument(
        "operation",
        type=_operation,
        metavar="operation",
        help=f"collective operation: {', '.join(_NCCOM_OPS)}",
    )
    nc.add_argument(
        "-r",
        "--nworkers",
        type=int,
        required=True,
        help="ranks: logical NeuronCores (8 / LNC per chip), over all nodes",
    )
    nc.add_argument(
        "-N",
        "--nnodes",
        type=_count(1),
        default=None,
        help="nodes (16-chip instances) the ranks are divided over (default: the number of "
        "--hosts, else 1; more than one: whole trn2u.48xlarge instances of UltraServers)",
    )
    nc.add_argument("-b", "--minbytes", default="32M", help="first size (default 32M)")
    nc.add_argument("-e", "--maxbytes", default="32M", help="last size (default 32M)")
    nc.add_argument("-f", "--stepfactor", type=int, help="multiply the size by this each row")
    nc.add_argument(
        "-i", "--stepbytes", help="add this to the size each row (default (max - min) / 10)"
    )
    nc.add_argument(
        "-n",
        "--iters",
        type=_count(1),
        default=20,
        help="measured operations per size (default 20; all take the same modelled time)",
    )
    nc.add_argument(
        "-w",
        "--warmup_iters",
        "--warmup-iters",
        dest="warmup_iters",
        type=_count(0),
        default=5,
        help="warm-up operations per size, not measured (default 5)",
    )
    nc.add_argument(
        "-t",
        "--stats",
        nargs="+",
        default=["avg"],
        metavar="STAT",
        help="time columns: avg and percentiles such as p50 p99 (default avg); the model is "
        "deterministic, so every percentile equals the average",
    )
    nc.add_argument(
        "-d",
        "--datatype",
        default="uint8",
        type=_datatype,
        metavar="DATATYPE",
        help=f"element type: {', '.join(NCCOM_DATATYPES)} (default uint8; fp8 and fp8e4, the "
        "tool's names, are fp8_e4m3)",
    )
    _add_lnc(nc)
    nc.add_argument(
        "--algorithm",
        default="auto",
        choices=ALGORITHMS,
        help="collective algorithm (a trn2core extension; default auto, the runtime's choice)",
    )
    nc.add_argument(
        "--show-algorithm",
        action="store_true",
        help="add an algorithm column (hierarchical ones print as hier)",
    )
    nc.add_argument(
        "--custom-src-target-pairs",
        metavar="FILE",
        help='permute: JSON {"src_target_pairs": [[[src, dst], ...]]}, ranks as in -r',
    )
    nc.add_argument(
        "--report-to-json-file",
        metavar="FILE",
        help="also write the configuration and results as JSON to FILE",
    )
    nc.add_argument(
        "--json",
        action="store_true",
        help="print the JSON report (config, results, avg_busbw(GB/s), uncertainty) instead "
        "of the table",
    )
    nc.add_argument(
        "--non-interactive",
        action="store_true",
        help="no progress bar (there is none anyway when stderr is not a terminal)",
    )
    nc.add_argument(
        "-c",
        "--check",
        nargs="?",
        const="random",
        choices=CHECK_MODES,
        metavar="MODE",
        help="also run each size on data and check every output, as Neuron's tool does: random "
        "(the default of a bare -c: pseudo-random inputs from --seed, else a fresh seed that is "
        "printed) or all_ones (every input 1, so every reduced output is the rank count); under "
        "mpiexec or srun the chips are spread over the MPI processes (docs/distributed.md)",
    )
    nc.add_argument(
        "--seed",
        type=_count(0),
        metavar="SEED",
        help="seed of --check random's inputs (default: a fresh one from the OS, printed)",
    )
    hosts = nc.add_mutually_exclusive_group()
    hosts.add_argument(
        "-s",
        "--hosts",
        nargs="+",
        metavar="HOST",
        help="the nodes' hosts, as Neuron's tool takes them: nothing runs on them, their count "
        "is -N/--nnodes",
    )
    hosts.add_argument(
        "--hosts-file",
        metavar="FILE",
        help="a file of hosts, one per line: their count is -N/--nnodes",
    )
    for flags, takes_value, _why in _NCCOM_UNMODELLED_FLAGS:
        nc.add_argument(
            *flags,
            action=_Unmodelled,
            nargs="*" if takes_value else 0,
            help=argparse.SUPPRESS,
            dest=f"_unmodelled_{flags[-1].lstrip('-')}",
        )
    nc.set_defaults(func=cmd_nccom_test)


def demo_collectives(out=sys.stdout, traces: list | None = None) -> None:
    """The chips-and-collectives part of the demo."""
    from ..chip import Chip
    from ..engine import gemm
    from ..numerics import quantize

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
    p(
        f"   all-reduce of 16 x {n:,} fp32 (integer values): equals numpy's sum: {exact}; "
        f"all 16 chips bit-identical: {same}"
    )
    floats = [rng.standard_normal(n, dtype=np.float32) for _ in range(16)]
    res = inst.all_reduce(floats, algorithm="ring")
    ref = np.sum(np.stack(floats).astype(np.float64), 0)
    err = np.abs(res.outputs[0] - ref).max()
    p(
        f"   random floats, ring order: max |result - float64 sum| = {err:.2e} "
        "(fp32 reduction, order fixed by the ring)"
    )
    big = [rng.standard_normal(4 << 20, dtype=np.float32) for _ in range(16)]
    t_np = min(_timed(lambda: np.sum(np.stack(big), 0)) for _ in range(2))
    t_us = min(_timed(lambda: inst.all_reduce(big)) for _ in range(2))
    p(
        f"   emulation speed, 16 x 16 MiB fp32: trn2core {t_us * 1e3:.0f} ms (16 outputs), "
        f"np.sum(np.stack(bufs), 0) {t_np * 1e3:.0f} ms (one output)"
    )
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
    p(
        f"   each chip can send {inst.topology.chip_link_capacity / 1e9:.0f} GB/s over its four "
        "X/Y links; only KangaRing's four rings use them all at once"
    )
    p(
        f"   collectives achieve {100 * spec.neuronlink_achieved_fraction:.0f}% of a link and pay "
        "the runtime's fixed costs, as calibrated on AWS's published nccom-test runs "
        "(docs/fidelity.md)"
    )
    p()
    p("== Bigger machines: 1 GiB all-reduce ==")
    rows = [("machine", "chips", "algorithm", "time", "busbw GB/s", "bound", "costed in")]
    for m in (inst, UltraServer(), UltraCluster(32)):
        t0 = time.perf_counter()
        r = m.estimate("all_reduce", 1 << 30)
        dt = time.perf_counter() - t0
        rows.append(
            (
                m.name,
                str(m.topology.size),
                r.algorithm,
                f"{r.seconds * 1e3:.2f} ms",
                f"{r.busbw / 1e9:.1f}",
                r.bound,
                f"{dt * 1e3:.1f} ms",
            )
        )
    p(_table(rows))
    if traces is not None:  # the demo's merged Perfetto trace: one track per link
        traces.append(("all_reduce 64 MiB, trn2.48xlarge", inst.estimate("all_reduce", 64 << 20)))
    p()
    p("== Logical NeuronCores: a 4096^3 bf16 GEMM on one logical core (timing only) ==")
    from ..engine import estimate_gemm

    rows = [("LNC", "physical cores", "time", "TFLOPS", "split M x N x K")]
    for lnc in (1, 2, 4):
        lc = Chip(lnc=lnc).cores[0]
        r = estimate_gemm(4096, 4096, 4096, dtype="bf16", core=lc)
        d = r.details
        rows.append(
            (
                str(lnc),
                str(list(lc.physical_core_indices)),
                f"{r.seconds * 1e6:.0f} us",
                f"{r.tflops:.0f}",
                f"{d['split_m']:.0f} x {d['split_n']:.0f} x {d['split_k']:.0f}",
            )
        )
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
