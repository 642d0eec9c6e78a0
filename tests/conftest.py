"""Shared pytest configuration for the trn2core test suite.

Hypothesis profiles: ``default`` keeps the suite fast enough for every commit; ``thorough``
(``HYPOTHESIS_PROFILE=thorough pytest``) runs many more examples before a release.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# `make fuzz`: the fuzz properties (tests/test_fuzz.py) with many more examples.
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("TRN2CORE_FUZZ_EXAMPLES", "20000")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# The files that take longest (`pytest --durations=0`, summed per file), run first: `make test`
# hands whole files to its two workers in collection order (`--dist loadfile
# --no-loadscope-reorder`), and a long file dealt last keeps one worker busy while the other
# idles. Longest first, the short files even out the end.
LONGEST_FIRST = (
    "test_distributed.py",
    "test_wheel.py",
    "test_numerics.py",
    "test_engine.py",
    "test_fuzz.py",
    "adversarial/test_machine_api.py",
    "adversarial/test_collectives.py",
    "test_determinism.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the rest is kept


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A numpy generator seeded from the test's id, so every failure reproduces exactly."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def host_limited():
    """Runs ``call`` in a fresh interpreter whose host memory limit (TRN2CORE_HOST_MEMORY) is
    8 MiB, printing ``refused <message>`` if it raises ``CapacityError``; ``setup`` runs before
    it and ``then`` after (``np`` and ``t`` imported). Returns the stdout (exit status 0)."""

    def run(setup: str, call: str, then: str = "") -> str:
        code = (
            f"import numpy as np, trn2core as t\n{setup}\n"
            f"try:\n    {call}\nexcept t.CapacityError as e:\n    print('refused', e)\n{then}\n"
        )
        env = dict(os.environ, TRN2CORE_HOST_MEMORY=str(8 << 20))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    return run


@pytest.fixture
def run_cli(capsys):
    """Runs ``trn2core *argv`` in this process: (exit status, stdout, stderr); argparse's usage
    errors exit with their own status."""

    from trn2core import cli

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            rc = cli.main(list(argv))
        except SystemExit as e:  # argparse's usage errors
            rc = e.code
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


@pytest.fixture(scope="session")
def copy_kernel():
    """An NKI kernel (not jitted): ``x`` through an SBUF tile into a new shared-HBM tensor."""
    import trn2core.nki as tn

    nl, nisa = tn.language, tn.isa

    def copy(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    return copy


class _CountingCore:
    """Stands for ``trn2core._core`` in facade modules: records the name of every function
    called through it in ``calls``."""

    def __init__(self, real) -> None:
        self._real = real
        self.calls: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def call(*a, **kw):
            self.calls.append(name)
            return attr(*a, **kw)

        return call


@pytest.fixture
def count_calls(monkeypatch):
    """``count_calls(*modules)`` puts one counting stand-in for ``trn2core._core`` into each
    module for the test and returns it (its ``calls``: the names called into the core)."""
    from trn2core import _core

    def install(*modules):
        proxy = _CountingCore(_core)
        for m in modules:
            monkeypatch.setattr(m, "_core", proxy)
        return proxy

    return install
