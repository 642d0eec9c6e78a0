"""trn2core's GEMM cost model beside SCALE-Sim (PyPI ``scalesim``), as a Markdown report.

    python benches/scalesim_compare.py [--scalesim-python /tmp/ssvenv/bin/python]
                                       [--shapes 512,1024] [--repeat 5]

For each square GEMM M = K = N = S it runs:

- SCALE-Sim in a subprocess of the given interpreter (it needs numpy<2 and pandas<3, so it lives
  in its own venv): a 128x128 weight-stationary array, 8 MiB per SRAM, InterfaceBandwidth CALC
  (stall-free), no sparsity, no custom layout, trace saving off (``save_disk_space=True``). The
  topology is one GEMM row ``Layer, M, N, K``. The runtime is the subprocess's wall clock
  (interpreter start, imports and report writing included); ``run_scale()`` alone is shown beside
  it. Cycles come from its COMPUTE_REPORT.csv: "Total Cycles" (compute), "Stall Cycles" and
  "Total Cycles (incl. prefetch)" (adds the DRAM prefetch before and the OFMAP drain after).
- ``trn2core.estimate_gemm(S, S, S, dtype="bf16")`` in this interpreter, best of R runs (after
  one warm-up), with the dI/dt throttle on (default) and off. Cycles are ``report.cycles``
  (wall time at the 2.4 GHz PE clock) and ``report.pe_cycles`` (tensor-engine busy cycles).

The "formula" column is SCALE-Sim's own WS cycle count, derived from its source
(compute/systolic_compute_ws.py, memory/double_buffered_scratchpad_mem.py):
F * (2R + C + T - 2) - 1 with F = ceil(K/R) * ceil(N/C) folds and T = M rows streamed per fold.

Without ``--scalesim-python`` (or if that interpreter cannot import scalesim) the SCALE-Sim
columns are skipped with a message. The script always exits 0 when trn2core runs (it is a
report); see docs/scalesim.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata

import trn2core
from trn2core.testing import best_of as _best_of

ARRAY = 128  # ArrayHeight = ArrayWidth
SRAM_KB = 8192  # per SRAM: large, so the run is compute-bound
PE_CLOCK_HZ = 2.4e9

CONFIG = f"""\
[general]
run_name = trn2_ws_{ARRAY}

[architecture_presets]
ArrayHeight:    {ARRAY}
ArrayWidth:     {ARRAY}
IfmapSramSzkB:  {SRAM_KB}
FilterSramSzkB: {SRAM_KB}
OfmapSramSzkB:  {SRAM_KB}
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Bandwidth : {ARRAY}
Dataflow : ws
MemoryBanks:   1
ReadRequestBuffer: 512
WriteRequestBuffer: 512

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""

# Runs inside the SCALE-Sim interpreter: argv = config, topology, layout, output dir.
DRIVER = """\
import json, sys, time
from importlib import metadata
import numpy
from scalesim.scale_sim import scalesim
cfg, topo, layout, out = sys.argv[1:5]
t0 = time.perf_counter()
s = scalesim(save_disk_space=True, verbose=False, config=cfg, topology=topo, layout=layout,
             input_type_gemm=True)
s.run_scale(top_path=out)
dt = time.perf_counter() - t0
print(json.dumps({"run_scale_s": dt, "scalesim": metadata.version("scalesim"),
                  "numpy": numpy.__version__}))
"""

PROBE = (
    "import json, numpy; from importlib import metadata; import scalesim.scale_sim; "
    "print(json.dumps({'scalesim': metadata.version('scalesim'), 'numpy': numpy.__version__}))"
)


def scalesim_formula(m: int, k: int, n: int, r: int = ARRAY, c: int = ARRAY) -> int:
    """SCALE-Sim's stall-free WS "Total Cycles": each fold's OFMAP demand is (2R - 1) idle rows
    (weights shifted in, inputs reach the bottom row) + T rows + (C - 1) rows of skew; the report
    gives the 0-based index of the last serviced row."""
    folds = math.ceil(k / r) * math.ceil(n / c)
    return folds * (2 * r + c + m - 2) - 1


def probe_scalesim(python: str | None) -> tuple[dict | None, str]:
    if not python:
        return None, "SCALE-Sim skipped: no --scalesim-python given"
    try:
        p = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"SCALE-Sim skipped: cannot run {python}: {e}"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"SCALE-Sim skipped: {python} cannot import scalesim ({last})"
    return json.loads(p.stdout.strip().splitlines()[-1]), ""


def run_scalesim(python: str, m: int, k: int, n: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="scalesim_") as d:
        cfg = os.path.join(d, "trn.cfg")
        topo = os.path.join(d, "gemm.csv")
        layout = os.path.join(d, "layout.csv")
        driver = os.path.join(d, "driver.py")
        out = os.path.join(d, "out")
        with open(cfg, "w") as f:
            f.write(CONFIG)
        with open(topo, "w") as f:
            # load_arrays_gemm reads "Layer, M, N, K," (every row ends with a comma).
            f.write(f"Layer, M, N, K,\ngemm_{m}x{k}x{n}, {m}, {n}, {k},\n")
        with open(layout, "w") as f:
            # Required even for GEMM inputs; with custom layouts off, a header is enough.
            f.write("Layer,\n")
        with open(driver, "w") as f:
            f.write(DRIVER)
        t0 = time.perf_counter()
        try:
            p = subprocess.run(
                [python, driver, cfg, topo, layout, out],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:g} s"}
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["?"])[-1]
            return {"error": f"exit {p.returncode}: {last}"}
        info = json.loads(p.stdout.strip().splitlines()[-1])
        report = os.path.join(out, f"trn2_ws_{ARRAY}", "COMPUTE_REPORT.csv")
        with open(report, newline="") as f:
            rows = list(csv.reader(f))
        header = [h.strip() for h in rows[0]]
        values = [v.strip() for v in rows[1]]
        row = dict(zip(header, values, strict=False))
        return {
            "wall_s": wall,
            "run_scale_s": info["run_scale_s"],
            "cycles": int(float(row["Total Cycles"])),
            "cycles_prefetch": int(float(row["Total Cycles (incl. prefetch)"])),
            "stalls": int(float(row["Stall Cycles"])),
            "overall_util": float(row["Overall Util %"]),
            "compute_util": float(row["Compute Util %"]),
        }


def best_of(fn, repeat: int) -> float:
    return _best_of(fn, repeat, warmup=True)


def run_trn2core(s: int, repeat: int) -> dict:
    out = {}
    for throttle in (True, False):
        r = trn2core.estimate_gemm(s, s, s, dtype="bf16", throttle=throttle)
        t = best_of(
            lambda th=throttle: trn2core.estimate_gemm(s, s, s, dtype="bf16", throttle=th), repeat
        )
        key = "on" if throttle else "off"
        out[key] = {
            "s": t,
            # SCALE-Sim's "Total Cycles" assume SRAM-resident operands, so compare with the
            # tensor engine's own timeline (compute_s); r.cycles adds the HBM/DMA side.
            "cycles": r.details["compute_s"] * PE_CLOCK_HZ,
            "cycles_with_memory": r.cycles,
            "bound": r.bound,
            "pe_cycles": r.pe_cycles,
            "instructions": r.instructions,
            "details": dict(r.details),
        }
    return out


def table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scalesim-python",
        default=None,
        help="a python that can import scalesim (e.g. /tmp/ssvenv/bin/python)",
    )
    ap.add_argument("--shapes", default="512,1024", help="comma-separated S for S^3 GEMMs")
    ap.add_argument("--repeat", type=int, default=5, help="trn2core timing: best of R")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per SCALE-Sim run, seconds")
    args = ap.parse_args(argv)
    shapes = [int(x) for x in args.shapes.split(",") if x.strip()]

    ss_info, skip_msg = probe_scalesim(args.scalesim_python)
    print("# trn2core GEMM cost model vs SCALE-Sim\n")
    print(f"- trn2core {metadata.version('trn2core')}, Python {platform.python_version()}")
    if ss_info:
        print(
            f"- SCALE-Sim {ss_info['scalesim']} (numpy {ss_info['numpy']}) via "
            f"`{args.scalesim_python}`: {ARRAY}x{ARRAY} ws, {SRAM_KB} kB SRAMs, "
            "InterfaceBandwidth CALC, traces off"
        )
    else:
        print(f"- {skip_msg}")
    print(f"- {platform.platform()}; os.cpu_count() = {os.cpu_count()}")
    print(
        "- trn2core: estimate_gemm(S, S, S, dtype='bf16'), best of "
        f"{args.repeat}; cycles at {PE_CLOCK_HZ / 1e9:g} GHz\n"
    )

    results = []
    for s in shapes:
        print(f"running {s}^3 ...", file=sys.stderr, flush=True)
        ss = run_scalesim(args.scalesim_python, s, s, s, args.timeout) if ss_info else None
        results.append((s, ss, run_trn2core(s, args.repeat)))

    def ss_cell(ss, key, fmt):
        if ss is None:
            return "n/a"
        if "error" in ss:
            return "failed"
        return fmt.format(ss[key])

    rows = []
    for s, ss, tc in results:
        on, off = tc["on"], tc["off"]
        ok = ss is not None and "error" not in ss
        rows.append(
            [
                f"{s}x{s}x{s}",
                ss_cell(ss, "wall_s", "{:.2f}"),
                ss_cell(ss, "cycles", "{:,}"),
                f"{scalesim_formula(s, s, s):,}",
                f"{on['s'] * 1e3:.3g}",
                f"{on['cycles']:,.0f}",
                f"{off['cycles']:,.0f}",
                f"{on['pe_cycles']:,}",
                f"{on['cycles_with_memory']:,.0f} ({on['bound']})",
                f"{ss['cycles'] / on['cycles']:.3f}" if ok else "n/a",
                f"{ss['cycles'] / off['cycles']:.3f}" if ok else "n/a",
            ]
        )
    table(
        [
            "shape (MxKxN)",
            "SCALE-Sim runtime (s)",
            "SCALE-Sim cycles",
            "SCALE-Sim formula",
            "trn2core runtime (ms)",
            "trn2core engine cycles",
            "trn2core engine cycles (throttle=False)",
            "trn2core pe_cycles",
            "trn2core cycles incl. HBM/DMA",
            "ratio SCALE-Sim / trn2core",
            "ratio (throttle=False)",
        ],
        rows,
    )

    print("Details\n")
    rows = []
    for s, ss, tc in results:
        on, off = tc["on"], tc["off"]
        d = on["details"]
        rows.append(
            [
                f"{s}x{s}x{s}",
                ss_cell(ss, "run_scale_s", "{:.2f}"),
                ss_cell(ss, "stalls", "{:,}"),
                ss_cell(ss, "cycles_prefetch", "{:,}"),
                ss_cell(ss, "overall_util", "{:.1f}"),
                f"{off['s'] * 1e3:.3g}",
                f"{on['instructions']:,}",
                f"{d['psum_wait_s'] * PE_CLOCK_HZ:,.0f}",
                f"{d['throttle_s'] * PE_CLOCK_HZ:,.0f}",
                f"{d['load_stationary_exposed_s'] * PE_CLOCK_HZ:,.0f}",
                f"{100 * s**3 / (ARRAY * ARRAY) / on['cycles']:.1f}",
            ]
        )
    table(
        [
            "shape",
            "SCALE-Sim run_scale() (s)",
            "SCALE-Sim stalls",
            "SCALE-Sim cycles incl. prefetch",
            "SCALE-Sim util %",
            "trn2core runtime, throttle=False (ms)",
            "trn2core nc_matmuls",
            "trn2core PSUM wait (cyc)",
            "trn2core throttle loss (cyc)",
            "trn2core exposed LoadStationary (cyc)",
            "trn2core util %",
        ],
        rows,
    )

    for s, ss, _ in results:
        if ss is not None and "error" in ss:
            print(f"- SCALE-Sim {s}^3 failed: {ss['error']}")
    if not ss_info:
        print(f"- {skip_msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
