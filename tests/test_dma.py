"""DMA inline compression and transfer timing (contract section 4)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import trn2core
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from trn2core import dma

DTYPES = "float64 float32 float16 bfloat16 float8_e4m3 float8_e5m2 int32 uint8 >f4 >f2".split()


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    )


def sample(dtype, shape, rng):
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    x = raw.view(dt).reshape(shape).copy()
    flat = x.reshape(-1)
    flat[: flat.size // 2] = np.zeros(1, dt)[0]  # half zeros, like ReLU outputs
    return x


def test_codecs_listed():
    assert dma.CODECS[:2] == ("none", "zvc") and "byteplane" in dma.CODECS


@pytest.mark.parametrize("codec", dma.CODECS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0,), (), (1,), (7, 513), (3, 0, 5), (1000,)])
def test_round_trip_is_bit_exact(codec, dtype, shape):
    rng = np.random.default_rng(0)
    x = sample(dtype, shape, rng)
    before = x.copy()
    blob = dma.compress(x, codec)
    assert blob.codec == codec and blob.shape == x.shape and blob.dtype == x.dtype
    assert blob.raw_nbytes == x.nbytes
    assert same_bits(dma.decompress(blob), x)
    assert same_bits(dma.decompress(dma.Compressed.from_bytes(blob.to_bytes())), x)
    assert same_bits(x, before)


def test_special_values_and_strided_inputs():
    x = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -1e-45, 1.0], np.float32)
    x[0] = np.frombuffer(np.uint32(0x7FA00001).tobytes(), np.float32)[0]  # a signalling payload
    for codec in dma.CODECS:
        y = dma.decompress(dma.compress(x, codec))
        assert y.view(np.uint32).tolist() == x.view(np.uint32).tolist()
    m = np.arange(60, dtype=np.float32).reshape(6, 10)
    for view in (m[::2], m.T, np.asfortranarray(m)):
        assert same_bits(dma.decompress(dma.compress(view, "zvc")), np.ascontiguousarray(view))


def test_relu_activations_compress():
    rng = np.random.default_rng(1)
    relu = np.maximum(rng.standard_normal(1 << 16), 0).astype(ml_dtypes.bfloat16)
    assert dma.compress(relu, "zvc").ratio > 1.6
    assert dma.compress(relu, "byteplane").ratio > 2.0


def test_incompressible_growth_bound():
    x = np.random.default_rng(2).integers(0, 256, size=1 << 18, dtype=np.uint8)
    for codec in dma.CODECS:
        blob = dma.compress(x, codec)
        assert blob.nbytes <= x.nbytes * 1.02 + 64


def test_every_bit_flip_and_truncation_is_detected():
    x = np.array([0.0, 1.5, 0.0, -2.25, 3.0, 0.0, 0.0, 7.0] * 8, np.float32)
    for codec in dma.CODECS:
        stream = dma.compress(x, codec).to_bytes()
        for i in range(len(stream)):
            for bit in range(8):
                bad = bytearray(stream)
                bad[i] ^= 1 << bit
                with pytest.raises(trn2core.CorruptDataError):
                    dma.Compressed.from_bytes(bytes(bad))
                with pytest.raises(trn2core.CorruptDataError):
                    dma.decompress(bytes(bad))
        for n in range(len(stream)):
            with pytest.raises(trn2core.CorruptDataError):
                dma.decompress(stream[:n])


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.float16, np.int64, np.uint8]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    ),
    st.sampled_from(dma.CODECS),
)
def test_hypothesis_round_trips(x, codec):
    assert same_bits(dma.decompress(dma.compress(x, codec)), x)


def test_bad_inputs():
    with pytest.raises(trn2core.FormatError, match="codec"):
        dma.compress(np.ones(4), "lz4")
    with pytest.raises(trn2core.FormatError, match="dtype"):
        dma.compress(np.array(["a", "b"]))
    with pytest.raises(trn2core.CorruptDataError):
        dma.Compressed.from_bytes(b"not a stream")


def test_dma_timing_obeys_the_model():
    core = trn2core.NeuronCore()
    big = core.dma_copy(np.zeros((128, 48 << 10), np.float32))  # 24 MiB, 192 KiB per partition
    engines = 16 * trn2core.spec.dma_engine_bytes_per_s
    assert 0.9 * engines < big.bandwidth <= engines
    small = core.dma_copy(np.zeros((128, 16), np.float32))  # 64 B per partition
    assert small.details["fixed_s"] / small.seconds > 0.9
    relu = np.maximum(np.random.default_rng(3).standard_normal((128, 1 << 15)), 0).astype(
        np.float32
    )
    plain = core.dma_copy(relu, src="hbm_remote")
    packed = core.dma_copy(relu, src="hbm_remote", codec="zvc")
    assert packed.wire_bytes < plain.wire_bytes == relu.nbytes
    assert packed.seconds < plain.seconds  # remote HBM is the limit, so fewer bytes help
    local = core.dma_copy(relu)
    assert local.seconds < plain.seconds
    assert local.bound == "memory" and "DMA" in str(local)


def test_streams_from_any_bytes_like_and_decoding_into_an_existing_array():
    x = np.maximum(np.random.default_rng(4).standard_normal((64, 33)), 0).astype(">f4")
    blob = dma.compress(x, "zvc")
    raw = blob.to_bytes()
    assert isinstance(raw, bytes) and len(raw) == blob.nbytes
    buf = bytearray(raw)
    kept = dma.Compressed.from_bytes(buf)
    buf[:] = bytes(len(buf))  # later changes to the caller's buffer do not reach it
    assert same_bits(dma.decompress(kept), x)
    for b in (memoryview(raw), np.frombuffer(raw, np.uint8), raw):
        assert same_bits(dma.decompress(b), x)
    out = np.full_like(x, 7.0)
    assert dma.decompress(blob, out=out) is out and same_bits(out, x)
    with pytest.raises(trn2core.ShapeError, match="out"):
        dma.decompress(blob, out=np.empty((64, 33), "<f4"))  # other byte order
    with pytest.raises(trn2core.ShapeError, match="out"):
        dma.decompress(blob, out=np.empty((33, 64), ">f4"))
    with pytest.raises(trn2core.ShapeError, match="writable"):
        dma.decompress(blob, out=np.broadcast_to(np.zeros(1, ">f4"), (64, 33)))
    with pytest.raises(trn2core.Trn2Error, match="bytes"):
        dma.Compressed.from_bytes(12345)
    # An altered header is reported as corrupt data, even on the out= path.
    bad = bytearray(raw)
    bad[9] ^= 0x10  # inside the dtype name
    with pytest.raises(trn2core.CorruptDataError):
        dma.decompress(bytes(bad), out=out)


def test_dma_timing_never_exceeds_the_engines_or_hbm():
    core = trn2core.NeuronCore()
    engines = 16 * trn2core.spec.dma_engine_bytes_per_s
    stack = trn2core.spec.hbm_stack_bytes_per_s
    caps = {"hbm": stack, "hbm_remote": stack * trn2core.spec.numa_remote_bandwidth_factor}
    for src, cap in caps.items():
        last = 0.0
        for per_partition in (64, 256, 1024, 4096, 16384, 65536, 196608):
            x = np.broadcast_to(np.uint8(0), (128, per_partition))  # no memory behind it
            r = core.dma_copy(x, src=src)
            assert r.bandwidth <= engines
            assert r.wire_bytes / (r.seconds - r.details["fixed_s"]) <= cap * (1 + 1e-12)
            assert r.bandwidth > last
            last = r.bandwidth
        assert last > 0.9 * min(engines, cap), (src, last)
    spec = trn2core.spec
    small = core.dma_copy(np.zeros((128, 16), np.float32))
    # A load waits for HBM's read besides the fixed cost (both calibrated, docs/fidelity.md).
    load = spec.dma_fixed_cost_s + spec.dma_hbm_read_latency_s
    assert small.details["fixed_s"] == pytest.approx(load, rel=1e-15)
    row_overhead = spec.dma_engine_bytes_per_s * spec.dma_row_overhead_s  # 23 B
    assert small.details["efficiency"] == pytest.approx(64 / (64 + row_overhead), rel=1e-12)
    store = core.dma_copy(np.zeros((128, 16), np.float32), src="sbuf", dst="hbm")
    assert store.details["fixed_s"] == spec.dma_fixed_cost_s
    remote = core.dma_copy(np.zeros((128, 16), np.float32), src="hbm_remote")
    assert remote.details["fixed_s"] == pytest.approx(
        load + spec.numa_remote_extra_latency_s, rel=1e-15
    )
    rep = core.dma_copy(np.zeros((100, 10)), codec="zvc", queue=7)
    assert (rep.queue, rep.codec, rep.src, rep.dst) == (7, "zvc", "hbm", "sbuf")
    assert rep.details["engines"] == 13  # 100 partitions, 8 per engine
    assert rep.wire_bytes < rep.bytes  # all zeros


def test_demo_part_shows_ratios_timing_and_a_capacity_error():
    import io

    from trn2core.cli import DEMO_PARTS, demo_dma

    assert "dma" in [name for name, _ in DEMO_PARTS]
    buf = io.StringIO()
    demo_dma(buf)
    text = buf.getvalue()
    for codec in dma.CODECS:
        assert f" {codec} " in text
    rows = [line for line in text.splitlines() if line.startswith(("ReLU", "weights"))]
    assert len(rows) == 2 * len(dma.CODECS)
    assert all(" yes " in r for r in rows)  # every round trip bit-exact
    relu_zvc = next(r for r in rows if r.startswith("ReLU") and " zvc " in r)
    assert float(relu_zvc.split()[3]) > 1.7  # the ratio column
    assert "CapacityError" in text and "327680 B" in text
