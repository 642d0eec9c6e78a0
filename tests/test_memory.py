"""The memory hierarchy (contract section 4 and the memory issue): HBM stacks shared by two
cores, SBUF as 128 partitions of 224 KiB, PSUM 2 MiB, and CapacityError before anything is
allocated, for allocations and for DMA transfers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import trn2core
from trn2core import dma, spec
from trn2core.errors import Trn2ValueError
from trn2core.memory import HbmStack

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def test_capacities_come_from_the_spec():
    core = trn2core.NeuronCore()
    # SBUF is the machine's account: the compiler's usable 212,984 B of each 224 KiB partition.
    assert spec.sbuf_bytes == 28 * MIB == core.sbuf_bytes
    assert core.sbuf.capacity == 128 * spec.sbuf_usable_partition_bytes == 128 * 212_984
    assert (core.sbuf.partitions, core.sbuf.partition_bytes) == (128, 212_984)
    assert core.psum.capacity == spec.psum_bytes == 2 * MIB == core.psum_bytes
    assert (core.psum.partitions, core.psum.partition_bytes) == (128, 16 * KIB)
    assert core.hbm.capacity == spec.hbm_stack_bytes == 24 * GIB
    assert core.hbm.partitions == 0
    for m in (core.hbm, core.sbuf, core.psum):
        assert (m.used, m.free, m.allocations) == (0, m.capacity, 0)
    stack = core.memory.hbm_stack
    assert (stack.index, stack.die, stack.cores) == (0, 0, (0, 1))
    assert trn2core.NeuronCore(6).memory.hbm_stack.cores == (6, 7)
    assert trn2core.NeuronCore(6).memory.die == 1


def test_absurd_requests_are_refused_at_once_before_anything_is_reserved():
    core = trn2core.NeuronCore()
    for space, limit in (("sbuf", "212984 B"), ("psum", "16384 B"), ("hbm", "25769803776 B")):
        t0 = time.perf_counter()
        with pytest.raises(trn2core.CapacityError) as e:
            core.alloc(10**15, space=space)
        assert time.perf_counter() - t0 < 0.5
        msg = str(e.value)
        assert msg.startswith("size: ") and "1000000000000000 B" in msg and limit in msg, msg
        assert isinstance(e.value, MemoryError) and type(e.value) is trn2core.CapacityError
    with pytest.raises(trn2core.CapacityError, match="beyond 2\\*\\*64"):
        core.alloc(10**25, space="hbm")
    with pytest.raises(trn2core.CapacityError, match="size"):
        core.alloc((10**10, 10**10, 10**10), np.float32, space="hbm")
    for m in (core.hbm, core.sbuf, core.psum):
        assert (m.used, m.allocations) == (0, 0)


def test_a_transfer_that_does_not_fit_its_destination_is_refused_before_any_copy():
    core = trn2core.NeuronCore()
    # 40 MiB into SBUF: 320 KiB per partition against 212,984 B usable of 224 KiB.
    x = np.zeros((128, 80 * KIB), np.float32)
    with pytest.raises(trn2core.CapacityError) as e:
        core.dma_copy(x)
    msg = str(e.value)
    assert msg.startswith("x: ") and "41943040 B" in msg and "327680 B" in msg
    assert "212984 B" in msg and "229376 B" in msg
    # A 10**15-byte view (no memory behind it): refused without numpy or the codec ever
    # materialising it, into SBUF, into HBM, and by the codec itself.
    huge = np.broadcast_to(np.float32(1.0), (250_000, 10**9))
    assert huge.nbytes == 10**15
    for kwargs in (
        {"dst": "sbuf", "codec": "zvc"},
        {"src": "sbuf", "dst": "hbm", "codec": "byteplane"},
        {"src": "hbm", "dst": "hbm", "codec": "none"},
        {"src": "hbm_remote", "dst": "psum", "codec": "zvc"},
    ):
        t0 = time.perf_counter()
        with pytest.raises(trn2core.CapacityError):
            core.dma_copy(huge, **kwargs)
        assert time.perf_counter() - t0 < 0.5, kwargs
    t0 = time.perf_counter()
    with pytest.raises(trn2core.CapacityError, match="host"):
        dma.compress(huge, "zvc")
    assert time.perf_counter() - t0 < 0.5


def test_per_partition_capacity():
    core = trn2core.NeuronCore()
    # One row of 212,985 B on one partition does not fit; 212,984 B (the usable bytes) does.
    with pytest.raises(trn2core.CapacityError, match="212985 B"):
        core.dma_copy(np.zeros((1, 212_985), np.uint8))
    core.dma_copy(np.zeros((1, 212_984), np.uint8))
    with pytest.raises(trn2core.CapacityError):
        core.alloc((1, 212_985), np.uint8)
    # All of the usable SBUF at once fits exactly.
    core.dma_copy(np.zeros((128, 212_984 // 4), np.float32))
    # A first axis longer than 128 is folded onto the partitions: (256, 100) fp32 takes
    # 800 B on each of 128 partitions.
    a = core.alloc((256, 100), np.float32)
    assert (a.partitions, a.partition_bytes, a.nbytes) == (128, 800, 256 * 400)
    # A 1-d array is spread over all 128 partitions.
    b = core.alloc((1000,), "bf16")
    assert (b.partitions, b.partition_bytes) == (128, 16)
    # PSUM: 2 MiB, 16 KiB per partition.
    with pytest.raises(trn2core.CapacityError, match="PSUM"):
        core.dma_copy(np.zeros((128, 4097), np.float32), src="sbuf", dst="psum")
    core.dma_copy(np.zeros((128, 4096), np.float32), src="sbuf", dst="psum")


def test_allocations_are_accounted_and_freed():
    core = trn2core.NeuronCore()
    a = core.alloc((128, 20 * KIB), np.float32)  # 10 MiB, 80 KiB per partition
    assert a.space == "sbuf" and a.nbytes == 10 * MIB and a.partition_start == 0
    assert core.sbuf.used == 10 * MIB and core.sbuf.free == 128 * 212_984 - 10 * MIB
    assert core.sbuf.partition_free == 212_984 - 80 * KIB and core.sbuf.allocations == 1
    # 20 MiB more does not fit now (it would on an empty SBUF); the copy reserves nothing.
    y = np.zeros((128, 40 * KIB), np.float32)
    with pytest.raises(trn2core.CapacityError, match="at most 131064 B"):
        core.dma_copy(y)
    core.free(a)
    assert not a.live and core.sbuf.used == 0
    core.dma_copy(y)
    assert core.sbuf.used == 0
    with pytest.raises(Trn2ValueError, match="already freed"):
        core.free(a)
    # A full partition pushes a one-partition tensor to the next one.
    row = core.alloc((1, 212_984), np.uint8)
    nxt = core.alloc((1, KIB), np.uint8)
    assert (row.partition_start, nxt.partition_start) == (0, 1)
    with pytest.raises(trn2core.CapacityError):
        core.alloc(128)  # 1 B on every partition: partition 0 has none left
    nxt.free()
    row.free()
    # HBM and PSUM.
    h = core.alloc(20 * GIB, space="hbm")
    assert (core.hbm.used, h.stack) == (20 * GIB, 0)
    with pytest.raises(trn2core.CapacityError, match="4294967296 B \\(4 GiB\\) free"):
        core.alloc(5 * GIB, space="hbm")
    core.free(h)
    p = core.alloc((128, 512), np.float32, space="psum")
    assert core.psum.used == 256 * KIB
    other = trn2core.NeuronCore(1)
    with pytest.raises(Trn2ValueError, match="another core"):
        other.free(p)
    core.free(p)


def test_bad_arguments():
    core = trn2core.NeuronCore()
    with pytest.raises(Trn2ValueError, match="space"):
        core.alloc(16, space="l2")
    with pytest.raises(Trn2ValueError, match="dtype"):
        core.alloc((4, 4))
    with pytest.raises(trn2core.FormatError, match="dtype"):
        core.alloc((4, 4), "not-a-dtype")
    with pytest.raises(Trn2ValueError, match="size"):
        core.alloc(-1)
    with pytest.raises(Trn2ValueError, match="index"):
        trn2core.NeuronCore(8)
    with pytest.raises(Trn2ValueError, match="src"):
        core.dma_copy(np.zeros(4), src="l2")
    with pytest.raises(Trn2ValueError, match="queue"):
        core.dma_copy(np.zeros(4), queue=16)
    with pytest.raises(Trn2ValueError, match="queue"):
        core.dma_copy(np.zeros(4), queue=-1)


def test_an_hbm_stack_is_shared_by_its_two_adjacent_cores():
    stack = HbmStack(2)
    assert (stack.die, stack.cores, stack.capacity) == (1, (4, 5), 24 * GIB)
    c4 = trn2core.NeuronCore(4, hbm=stack)
    c5 = trn2core.NeuronCore(5, hbm=stack)
    with pytest.raises(Trn2ValueError, match="serves cores"):
        trn2core.NeuronCore(3, hbm=stack)
    a = c4.alloc(20 * GIB, space="hbm")
    assert c5.hbm.used == 20 * GIB and stack.used == 20 * GIB
    with pytest.raises(trn2core.CapacityError):
        c5.alloc(5 * GIB, space="hbm")
    with pytest.raises(trn2core.CapacityError, match="HBM stack 2"):
        c5.dma_copy(np.broadcast_to(np.uint8(0), (5 * GIB,)), src="hbm_remote", dst="hbm")
    c5.free(a)  # either core may release it
    assert stack.used == 0 and stack.allocations == 0
    # SBUF and PSUM stay per core.
    c4.alloc(MIB)
    assert (c4.sbuf.used, c5.sbuf.used) == (MIB, 0)


def test_allocations_as_transfer_ends():
    core = trn2core.NeuronCore(0)
    tile = core.alloc((128, 2048), "bf16")
    x = np.ones((128, 2048), np.float32).astype(trn2core.dtypes.FORMAT_DTYPES["bf16"])
    rep = core.dma_copy(x, dst=tile)
    assert rep.dst == "sbuf" and rep.bytes == x.nbytes
    with pytest.raises(trn2core.CapacityError, match="dst"):
        core.dma_copy(np.ones((128, 4096), np.float32), dst=tile)
    # An HBM buffer holds the compressed stream: ReLU activations fit where raw ones do not.
    relu = np.maximum(np.random.default_rng(0).standard_normal((128, 2048)), 0).astype(np.float32)
    buf = core.alloc(600 * KIB, space="hbm")
    with pytest.raises(trn2core.CapacityError, match="HBM allocation"):
        core.dma_copy(relu, src="sbuf", dst=buf)
    packed = core.dma_copy(relu, src="sbuf", dst=buf, codec="zvc")
    assert packed.wire_bytes <= 600 * KIB < relu.nbytes
    # The other die's stack is remote (NUMA): same bytes, more time.
    far = trn2core.NeuronCore(4).alloc(relu.nbytes, space="hbm")
    near = core.alloc(relu.nbytes, space="hbm")
    r_far = core.dma_copy(relu, src=far)
    r_near = core.dma_copy(relu, src=near)
    assert (r_far.src, r_near.src) == ("hbm_remote", "hbm")
    assert r_far.seconds > r_near.seconds
    core.free(tile)
    with pytest.raises(Trn2ValueError, match="freed"):
        core.dma_copy(x, dst=tile)


def test_transfers_appear_on_per_queue_tracks(tmp_path):
    core = trn2core.NeuronCore()
    rep = core.dma_copy(np.zeros((128, 4096), np.float32), queue=3)
    doc = json.loads(Path(rep.save_trace(tmp_path / "dma.json")).read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {f"DMA engine {e} / queue 3" for e in range(16)}
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert len(spans) == 32  # a fixed-cost span and a transfer span per engine
    end = max(e["ts"] + e["dur"] for e in spans)
    assert abs(end - rep.seconds * 1e6) < 1e-3
    # A transfer over 20 partitions runs on engines 0..2 only (8 partitions each).
    narrow = core.dma_copy(np.zeros((20, 4096), np.float32))
    doc = json.loads(Path(narrow.save_trace(tmp_path / "narrow.json")).read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {f"DMA engine {e} / queue 0" for e in range(3)}
    # The GEMM's memory side: first tiles and streams on queues 0 (a), 1 (b), 2 (results).
    g = trn2core.estimate_gemm(1024, 1024, 1024)
    doc = json.loads(Path(g.save_trace(tmp_path / "gemm.json")).read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    dma_tracks = {n for n in names if n.startswith("DMA")}
    assert dma_tracks == {f"DMA engine {e} / queue {q}" for e in range(16) for q in range(3)}
    assert "PE" in names


def test_an_allocation_is_freed_only_by_the_core_that_made_it():
    # Two standalone cores each have an HBM stack 0 and number their allocations from 0: the
    # allocation carries its owner, so a foreign free is refused and leaves both accounts as
    # they were (it used to free c0's own allocation of the same id).
    c0, c1 = trn2core.NeuronCore(0), trn2core.NeuronCore(0)
    for space in ("hbm", "sbuf", "psum"):
        mine = c0.alloc(4096, space=space)
        theirs = c1.alloc(4096, space=space)
        assert (mine.id, mine.stack) == (theirs.id, theirs.stack)
        with pytest.raises(Trn2ValueError, match="another core"):
            c0.free(theirs)
        assert getattr(c0, space).allocations == 1 and getattr(c1, space).allocations == 1
        c0.free(mine)
        c1.free(theirs)
        assert getattr(c0, space).allocations == 0 and getattr(c1, space).allocations == 0


def test_one_account_of_sbuf_and_psum_tiles_allocations_and_dma_checks():
    # Issue 25: `core.tile` left `core.sbuf.used == 0` and `core.alloc` reserved twice (a
    # CoreMemory account and a machine tensor). Now the machine's allocator is the one account.
    core = trn2core.NeuronCore()
    t = core.tile((128, 1024), "fp32")
    assert (core.sbuf.used, core.sbuf.allocations) == (128 * 4096, 1)
    assert core.memory.sbuf.used == core.sbuf.used  # the core's CoreMemory reads the same
    a = core.alloc((128, 1024), "fp32")
    assert (a.partition_start, a.partition_bytes, a.tile.shape) == (0, 4096, [128, 1024])
    assert (core.sbuf.used, core.sbuf.allocations) == (2 * 128 * 4096, 2)
    # Both are engine operands and never share bytes.
    core.vector.memset(t, 1.0)
    core.vector.memset(a, 2.0)
    assert (core.read(t) == 1.0).all() and (core.read(a) == 2.0).all()
    # A byte reservation is placed beside them and counted; a DMA sees what is left.
    b = core.alloc(128 * 200_000)
    assert (b.tile, b.partition_bytes) == (None, 200_000)
    # Tiles at bytes 0 and 4096, the reservation at 8192..208192: 4,792 B left of 212,984.
    assert core.sbuf.partition_free == 212_984 - 208_192 == 4792
    with pytest.raises(trn2core.CapacityError, match="x: .* at most 4792 B .*free on every"):
        core.dma_copy(np.zeros((128, 4793), np.uint8))
    core.dma_copy(np.zeros((128, 4792), np.uint8))
    core.free(b)
    core.free(t)
    assert (core.sbuf.used, core.sbuf.allocations) == (128 * 4096, 1)
    # PSUM too: a PSUM tile and a PSUM reservation share the one account.
    core.tile((128, 512), "fp32", space="psum")
    core.alloc((128, 512), "fp32", space="psum")
    assert (core.psum.used, core.psum.allocations) == (2 * 128 * 2048, 2)
    # A standalone CoreMemory (no machine) keeps its own per-partition account of the
    # physical 224 KiB.
    m = trn2core.memory.CoreMemory()
    assert m.sbuf.partition_bytes == 224 * KIB
    m.alloc((1, 224 * KIB), np.uint8)
    assert m.sbuf.used == 224 * KIB
