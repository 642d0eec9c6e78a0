"""Issue 29, the first day (second part): nccom-test's check modes, hosts and size units as AWS's
tool takes them, -N 2 explained, spec notes, NKI error lines in shipped kernels, reports in
Trainium's words, and stochastic rounding's seed."""

from __future__ import annotations

import re

import numpy as np
import pytest
import trn2core
from trn2core.nccom import parse_size

# ------------------------------------------------------------------------- nccom-test -c MODE


def test_check_takes_awss_modes_and_a_bare_flag_is_random(run_cli):
    rc, out, _ = run_cli(
        "nccom-test", "-r", "8", "-c", "all_ones", "allr", "-b", "1K", "-e", "1K", "-d", "fp32"
    )
    assert rc == 0
    assert "2 chips x 256 fp32 elements (all_ones): every output as expected" in out
    # A bare flag before the operation, as in AWS's examples (`--check allg`): random mode.
    rc, out, _ = run_cli("nccom-test", "-r", "8", "--check", "allg", "-b", "1K", "-e", "1K")
    assert rc == 0
    assert re.search(r"\(random, seed \d+\): every output as expected", out), out
    rc, out, _ = run_cli(
        "nccom-test",
        "-r",
        "8",
        "allr",
        "-d",
        "bf16",
        "-b",
        "1K",
        "-e",
        "1K",
        "-c",
        "random",
        "--seed",
        "7",
    )
    assert rc == 0 and "(random, seed 7): every output as expected" in out
    rc, _, err = run_cli("nccom-test", "-r", "8", "allr", "-c", "zeros")
    assert rc == 2 and "invalid choice: 'zeros'" in err


def test_check_random_inputs_follow_the_seed():
    from trn2core.cli import check as cli_check

    a = cli_check._reduce_input(1, 64, "random", 7)
    assert np.array_equal(a, cli_check._reduce_input(1, 64, "random", 7))
    assert not np.array_equal(a, cli_check._reduce_input(1, 64, "random", 8))
    assert set(np.unique(a)) <= {-1.0, 0.0, 1.0}
    want = sum(cli_check._reduce_input(r, 64, "random", 7) for r in range(4))
    assert np.array_equal(cli_check._exact_sum(4, 64, "random", 7), want)
    assert np.array_equal(cli_check._exact_sum(4, 8, "all_ones"), np.full(8, 4.0, np.float32))


def test_seed_needs_the_random_check(run_cli):
    rc, _, err = run_cli("nccom-test", "-r", "8", "allr", "--seed", "3")
    assert rc == 2 and "seed: --seed seeds the inputs of --check random" in err


# ------------------------------------------------------------------------------ --hosts gives -N


def test_hosts_give_the_node_count(run_cli, tmp_path):
    rc, out, _ = run_cli(
        "nccom-test", "-r", "128", "allr", "--json", "--hosts", "10.0.0.1", "10.0.0.2"
    )
    assert rc == 0
    import json

    cfg = json.loads(out)["config"]
    assert cfg["nnodes"] == 2 and cfg["chips"] == 32
    hosts = tmp_path / "hosts"
    hosts.write_text("a\n\nb\nc\nd\n")
    rc, out, _ = run_cli("nccom-test", "-r", "256", "allr", "--json", "--hosts-file", str(hosts))
    assert rc == 0 and json.loads(out)["config"]["nnodes"] == 4
    rc, _, err = run_cli("nccom-test", "-r", "128", "-N", "4", "allr", "-s", "a", "b")
    assert rc == 2 and "nnodes: -N 4 but 2 hosts are given" in err


# ------------------------------------------------------------------------------- sizes in KiB


@pytest.mark.parametrize(
    "text, want",
    [
        ("1MiB", 1 << 20),
        ("4KiB", 4096),
        ("2GiB", 2 << 30),
        ("1M", 1 << 20),
        ("1G", 1 << 30),
        ("1mib", 1 << 20),
        ("1kb", 1024),
    ],
)
def test_sizes_take_iec_units(text, want):
    assert parse_size(text, "minbytes") == want


def test_nccom_test_takes_mib(run_cli):
    rc, out, _ = run_cli("nccom-test", "-r", "8", "allg", "-b", "1MiB", "-e", "1MiB")
    assert rc == 0 and out.split("\n")[1].split()[0] == "1048576"
    rc, _, err = run_cli("nccom-test", "-r", "8", "allg", "-b", "1MiX")
    assert rc == 2 and "minbytes" in err


# --------------------------------------------------------------------------------- -N 2 and -N 4


def test_two_nodes_use_two_cycles_and_the_z_links_explain_the_dip():
    """Two instances of an UltraServer run KangaRing's two Hamiltonian cycles (joined through Z
    links), not one ring; each cycle still crosses Z links, half as fast as X/Y, so the bus
    bandwidth is below one instance's and below the whole UltraServer's torus rings."""
    from trn2core.cli.nccom import nccom_rows

    def busbw(ranks: int) -> float:
        (row,) = nccom_rows("all_reduce", ranks, [256 << 20], "bf16", 2, "auto")
        return row["busbw"] / 1e9

    one, two, four = busbw(64), busbw(128), busbw(256)
    assert two == pytest.approx(26.36, abs=0.01)  # one ring through the chips gave 21.07
    assert two < one and two < four
    z, xy = (
        trn2core.spec.neuronlink_z_link_bytes_per_s,
        trn2core.spec.neuronlink_xy_link_bytes_per_s,
    )
    assert z == xy / 2


# ------------------------------------------------------------------------------ spec notes


def test_spec_prints_the_note_status_c_promises(run_cli):
    rc, out, _ = run_cli("spec", "cc_cores_per_chip")
    assert rc == 0
    assert "C = conflict" in out
    assert "note: Conflict: 16 [S3 current][S17: two per physical core] vs 20" in out
    assert "Chosen 16" in out
    for e in trn2core.spec.entries():
        if e.status == "C":
            assert "onflict" in e.note, e.name


# ------------------------------------------------------------------ NKI errors in shipped kernels


def test_a_shipped_example_kernel_reports_its_own_line():
    from trn2core import nki
    from trn2core.nki._examples import load

    bad = load("mistakes")
    with open(bad.__file__, encoding="utf-8") as f:
        lines = f.read().splitlines()
    want = 1 + next(i for i, t in enumerate(lines) if "acc[...] = nl.exp(acc)" in t)
    assert want == 24
    with pytest.raises(nki.LoopCarriedDependencyError) as e:
        nki.run(bad.carried_exp, np.zeros((128, 64), np.float32))
    file, line = e.value.nki_location
    assert line == want and file.endswith("mistakes.py")


# ------------------------------------------------------------------------------ reports


def test_html_tables_have_one_style_per_cell_and_count_in_the_singular():
    from trn2core.report import count, html_table

    h = html_table("t", [("  indented", "x"), ("flat", "y")])
    assert '<th style="padding-left:2em;text-align:left">indented</th>' in h
    assert all(tag.count("style=") <= 1 for tag in re.findall(r"<t[hd][^>]*>", h))
    assert count(1, "instruction") == "1 instruction"
    assert count(1024, "instruction") == "1,024 instructions"


def test_dma_reports_name_memories_in_trainiums_words():
    from trn2core.dma import dma_copy

    r = dma_copy(np.zeros((128, 2048), np.float32))
    assert str(r).startswith("DMA HBM -> SBUF: 1048576 B"), str(r)
    r = dma_copy(np.zeros((128, 2048), np.float32), src="hbm_remote")
    assert str(r).startswith("DMA remote HBM -> SBUF: 1048576 B"), str(r)


# ------------------------------------------------------------------------ stochastic rounding


def test_unseeded_stochastic_rounding_repeats_and_seed_random_does_not():
    x = np.full(4096, 1.0 + 2.0**-10, np.float64)  # between two bf16 codes
    a = trn2core.quantize(x, "bf16", rounding="stochastic")
    assert np.array_equal(a, trn2core.quantize(x, "bf16", rounding="stochastic"))
    b = trn2core.quantize(x, "bf16", rounding="stochastic", seed="random")
    c = trn2core.quantize(x, "bf16", rounding="stochastic", seed="random")
    assert not np.array_equal(b, c)
    for doc in (trn2core.quantize.__doc__, trn2core.gemm.__doc__, trn2core.NeuronCore.__doc__):
        assert 'seed="random"' in doc and "same" in doc
    m = np.ones((4, 4), np.float32)
    r = trn2core.gemm(m, m, dtype="bf16", rounding="stochastic", seed="random")
    assert isinstance(r.seed, int) and 0 <= r.seed < 2**64
    assert trn2core.gemm(m, m, dtype="bf16", rounding="stochastic", seed=5).seed == 5
    assert trn2core.gemm(m, m).seed is None
    core = trn2core.NeuronCore(rounding="stochastic", seed="random")
    assert isinstance(core.seed, int) and trn2core.NeuronCore().seed == 0
    with pytest.raises(trn2core.Trn2ValueError, match="seed"):
        trn2core.quantize(x, "bf16", rounding="stochastic", seed="fresh")
