"""Determinism (issue 8): for every capability, the same inputs and seed give the same bits
across runs, across thread counts (RAYON_NUM_THREADS=1, 2, 3 and the default, in subprocesses)
and across chunkings of the work."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import trn2core as t


def digests() -> dict[str, str]:
    """SHA-256 of the output of every capability on fixed, seeded inputs large enough to be cut
    into many parallel chunks, tasks and tiles."""
    rng = np.random.default_rng(20240611)
    x = rng.standard_normal(300_001) * 100
    a = t.quantize(rng.standard_normal((301, 700)), "bf16")
    b = t.quantize(rng.standard_normal((700, 517)), "bf16")
    a8 = t.quantize(rng.standard_normal((130, 600)), "fp8_e4m3")
    b8 = t.quantize(rng.standard_normal((600, 70)), "fp8_e5m2")
    s = rng.standard_normal((1024, 512)).astype(np.float32)
    relu = np.maximum(rng.standard_normal(1 << 20), 0).astype(np.float32)
    out: dict[str, bytes] = {}
    for mode in t.ROUNDING_MODES:
        out[f"quantize-{mode}"] = t.quantize(x, "fp8_e4m3", rounding=mode, seed=7).tobytes()
    out["quantize-sr-bits"] = t.quantize(
        x, "bf16", rounding="stochastic", random_bits=np.arange(x.size) % 256, random_bit_count=8
    ).tobytes()
    out["encode-bias"] = t.encode(x, "fp8_e5m2", exponent_bias=20, saturate=True).tobytes()
    out["decode"] = t.decode(np.arange(256, dtype=np.uint8), "fp8_e3m4").tobytes()
    out["stochastic_bits"] = t.stochastic_bits((301, 1000), seed=99).tobytes()
    out["gemm"] = t.gemm(a, b).out.tobytes()
    out["gemm-quantized"] = t.gemm(
        np.asarray(a, np.float32),
        b,
        dtype="fp8_e4m3",
        rounding="stochastic",
        seed=5,
        out_dtype="bf16",
    ).out.tobytes()
    out["gemm-double_row"] = t.gemm(a8, b8, perf_mode="double_row").out.tobytes()
    sp = t.compress(t.prune(s, "4:16"), "4:16")
    out["sparse-gemm"] = t.gemm(sp, s.T[:, :200].copy()).out.tobytes()
    out["prune"] = t.prune(s, "2:8", axis=0).tobytes()
    out["compress"] = sp.values.tobytes() + sp.indices.tobytes()
    out["cutlass"] = b"".join(
        v.tobytes() for v in t.compress(t.prune(s[:128, :64], "1:2"), "1:2").to_cutlass()
    )
    for codec in t.dma.CODECS:
        out[f"dma-{codec}"] = t.dma.compress(relu, codec).to_bytes()
    core = t.NeuronCore()
    core.matmul(a[:128, :128].T.copy(), b[:128, :512], bank=2)
    out["matmul"] = core.matmul(a[:128, :128], b[:128, :512], bank=2, accumulate=True).tobytes()
    out["estimate"] = json.dumps(t.estimate_gemm(5000, 3000, 7000).to_dict()).encode()
    out["dma_copy"] = json.dumps(t.dma.dma_copy(relu, codec="zvc").to_dict()).encode()
    # Chips and collectives: buffers long enough for many 4096-element reduction blocks.
    inst = t.Instance()
    f32 = [(rng.standard_normal(100_003) * 10**r).astype(np.float32) for r in range(16)]
    b16 = [t.quantize(rng.standard_normal((64, 1001)), "bf16") for _ in range(16)]
    for alg in ("ring", "kangaring", "rdh", "torus", "mesh"):
        res = inst.all_reduce(f32, algorithm=alg)
        out[f"all_reduce-{alg}"] = b"".join(o.tobytes() for o in res.outputs)
    out["all_reduce-bf16-max"] = b"".join(
        o.tobytes() for o in inst.all_reduce(b16, op="max").outputs
    )
    out["reduce_scatter"] = b"".join(o.tobytes() for o in inst.reduce_scatter(b16).outputs)
    out["all_gather"] = b"".join(o.tobytes() for o in inst.all_gather(b16).outputs)
    out["all_to_all"] = b"".join(o.tobytes() for o in inst.all_to_all(f32).outputs)
    out["collective-estimate"] = json.dumps(
        t.UltraCluster(2).estimate("all_reduce", 1 << 26).to_dict()
    ).encode()
    chip_gemm = t.gemm(a, b, core=t.Chip(lnc=2).cores[1])
    out["chip-gemm"] = chip_gemm.out.tobytes() + json.dumps(chip_gemm.report.to_dict()).encode()
    return {k: hashlib.sha256(v).hexdigest() for k, v in out.items()}


def test_same_bits_across_runs():
    assert digests() == digests()


def _digests_with(threads: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAYON_NUM_THREADS", None)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = threads
    code = "import json, test_determinism as d; print(json.dumps(d.digests()))"
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=os.path.dirname(__file__),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_same_bits_on_any_thread_count():
    here = digests()
    for threads in ("1", "2", "3", None):
        assert _digests_with(threads) == here, f"RAYON_NUM_THREADS={threads}"


def test_same_bits_in_any_chunking(rng):
    # Seeded stochastic rounding: word k belongs to flat index k, so quantizing slices with the
    # matching slices of the words gives the whole array's result.
    x = rng.standard_normal((600, 701))
    whole = t.quantize(x, "fp8_e5m2", rounding="stochastic", seed=11)
    words = t.stochastic_bits(x.shape, seed=11)
    for cut in (1, 65_535, 65_536, 100_000, 299_999):
        flat, w = x.reshape(-1), words.reshape(-1)
        parts = [
            t.quantize(
                flat[:cut],
                "fp8_e5m2",
                rounding="stochastic",
                random_bits=w[:cut],
                random_bit_count=32,
            ),
            t.quantize(
                flat[cut:],
                "fp8_e5m2",
                rounding="stochastic",
                random_bits=w[cut:],
                random_bit_count=32,
            ),
        ]
        np.testing.assert_array_equal(
            np.concatenate(parts).view(np.uint8), whole.reshape(-1).view(np.uint8)
        )
    # The GEMM: any block of rows or columns of the result is the GEMM of those rows/columns.
    a = t.quantize(rng.standard_normal((257, 400)), "bf16")
    b = t.quantize(rng.standard_normal((400, 600)), "bf16")
    full = t.gemm(a, b).out.view(np.uint32)
    for r0, r1, c0, c1 in [(0, 1, 0, 600), (5, 133, 0, 600), (0, 257, 511, 600), (100, 257, 7, 9)]:
        part = t.gemm(a[r0:r1], b[:, c0:c1]).out.view(np.uint32)
        np.testing.assert_array_equal(part, full[r0:r1, c0:c1])
    # Sparse GEMM likewise; pruning and compression of row blocks are the row blocks.
    # 2:4 takes the dense kernel, 4:16 the zero-skipping one (docs/sparsity.md).
    for pattern in ("2:4", "4:16"):
        s = t.prune(rng.standard_normal((300, 640)).astype(np.float32), pattern)
        sp_full = t.gemm(t.compress(s, pattern), s.T.copy()).out.view(np.uint32)
        sp_part = t.gemm(t.compress(s[17:190], pattern), s.T.copy()).out.view(np.uint32)
        np.testing.assert_array_equal(sp_part, sp_full[17:190])
    y = rng.standard_normal((4096, 32))
    np.testing.assert_array_equal(t.prune(y, "4:16")[1000:3000], t.prune(y[1000:3000], "4:16"))
    # DMA streams: equal inputs give equal streams (independent of the task split).
    z = rng.standard_normal(1 << 18)
    assert (
        t.dma.compress(z, "byteplane").to_bytes()
        == t.dma.compress(z.copy(), "byteplane").to_bytes()
    )


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_seed_env_and_argument_agree(seed, monkeypatch):
    x = np.linspace(-3, 3, 10_001)
    monkeypatch.setenv("NEURON_RT_STOCHASTIC_ROUNDING_SEED", str(seed))
    from_env = t.quantize(x, "bf16", rounding="stochastic")
    np.testing.assert_array_equal(
        from_env.view(np.uint16),
        t.quantize(x, "bf16", rounding="stochastic", seed=seed).view(np.uint16),
    )
