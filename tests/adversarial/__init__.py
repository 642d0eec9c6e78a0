"""The adversarial suite (issue 19), one module per attack surface; see docs/limitations.md,
"The adversarial suite". Every probe runs in a subprocess with an address-space cap and a
timeout, so a crash, an abort or a hang is a failed test, not a dead run. Probes marked
``slow`` run only in ``make fuzz`` (pyproject.toml deselects them by default)."""
