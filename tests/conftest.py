"""Shared pytest configuration for the trn2core test suite.

Hypothesis profiles: ``default`` keeps the suite fast enough for every commit; ``thorough``
(``HYPOTHESIS_PROFILE=thorough pytest``) runs many more examples before a release.
"""

from __future__ import annotations

import os
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


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A numpy generator seeded from the test's id, so every failure reproduces exactly."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
