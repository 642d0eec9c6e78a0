# trn2core: every command a newcomer needs. `make help` lists them.
# Targets rebuild only what changed: stamps in .stamps/ track the venv and the extension build.

SHELL      := /bin/bash
PYTHON     ?= python3
VENV       := .venv
PY         := $(VENV)/bin/python
STAMPS     := .stamps
RUST_SRC   := $(shell find rust -name '*.rs' -o -name 'Cargo.toml' 2>/dev/null) Cargo.toml Cargo.lock
# trn2core[mpi]: MPI from PyPI (MPICH's wheel with mpiexec, and mpi4py), for the distributed
# mode's tests (tests/test_distributed.py launches mpiexec) and benches/bench_distributed.py.
MPI_DEPS   := "mpi4py>=4" "mpich>=4"
# perfetto: the optional protobuf trace writer (trn2core[perfetto]; tests/test_reports.py).
PY_DEPS    := "numpy>=2" "ml_dtypes>=0.5" "maturin>=1.9,<2" "pytest>=8" "hypothesis>=6" \
              "gfloat>=0.5" "asv>=0.6" "threadpoolctl>=3" "ruff>=0.6" "matplotlib>=3.7" \
              "mypy>=1.10" "ziglang>=0.13" "auditwheel>=6" "perfetto>=0.59" \
              "tomli>=2; python_version < '3.11'" "pytest-xdist>=3" $(MPI_DEPS)
PY_SRC     := $(shell find python -name '*.py' -o -name '*.pyi' -o -name 'py.typed' 2>/dev/null)
DOCS       := $(wildcard docs/*.md)
DIST       := dist

.DEFAULT_GOAL := help
.PHONY: help demo test test-rust test-python build wheel lint bench docs clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# zig first (PyPI `ziglang`): tools/zigcc, the linker of every Rust build below, runs it from
# .venv, so the Rust compile can start while pip installs the rest.
$(STAMPS)/zig:
	@mkdir -p $(STAMPS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "ziglang>=0.13"
	@touch $@

$(STAMPS)/venv: $(STAMPS)/zig pyproject.toml Makefile
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(PY_DEPS)
	@touch $@

# Every Rust build links with tools/zigcc (zig's cc against glibc 2.17). Named the same way for
# `cargo test` and for maturin, it gives both the same flags, so the wheel reuses the tests'
# compile of the core and its dependencies (the `release` profile, Cargo.toml) instead of
# compiling them again.
# pyo3's configuration for the abi3 extension (CPython >= 3.10) is tools/pyo3-abi3.txt, in the
# format maturin writes: named in PYO3_CONFIG_FILE, maturin passes the environment through
# unchanged, so a plain `cargo build` of the binding (step 1 of `make test`) is the very compile
# `maturin build` then finds fresh and packages.
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
RUST_ENV   := CARGO_TARGET_$(shell echo '$(HOST_TRIPLE)' | tr 'a-z-' 'A-Z_')_LINKER=$(abspath tools/zigcc) \
              PYO3_CONFIG_FILE=$(abspath tools/pyo3-abi3.txt) PYO3_BUILD_EXTENSION_MODULE=1

# The core is compiled once: `make build` builds the manylinux2014 wheel (the one users install)
# and installs that same wheel into .venv, so pytest, the demo and the clean-venv wheel test all
# run the same binary, and the Rust tests link the same compile of the core. Linked by zig
# (tools/zigcc) against glibc 2.17, the wheel installs on any Linux of manylinux2014 or later
# (Ubuntu 18.04+, Amazon Linux 2, RHEL 7+); maturin and auditwheel check the tag. The guides and
# the NKI example kernels reach the package through the links python/trn2core/docs and
# python/trn2core/nki_examples (pyproject.toml, [tool.maturin] include), so `pip install .`, the
# sdist and the wheel carry the same files. Rebuilt only when a Rust or Python source, a guide or
# a packaging file changed. .venv holds an installed copy, not links to python/: after editing
# Python, `make build` (a few seconds when no Rust changed) or `make test` brings it up to date.
$(STAMPS)/wheel: $(STAMPS)/venv tools/pyo3-abi3.txt $(RUST_SRC) $(PY_SRC) $(DOCS) $(wildcard examples/nki/*.py) pyproject.toml README.md LICENSE
	rm -f $(DIST)/trn2core-*.whl $(DIST)/trn2core-*.tar.gz
	PATH="$(abspath $(VENV))/bin:$$PATH" $(RUST_ENV) $(VENV)/bin/maturin build --release --quiet \
	    --compatibility manylinux2014 --out $(DIST)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/maturin sdist --out $(DIST)
	$(VENV)/bin/auditwheel show $(DIST)/trn2core-*.whl
	@touch $@

$(STAMPS)/build: $(STAMPS)/wheel
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(DIST)/trn2core-*.whl
	@touch $@

build: $(STAMPS)/build ## Build the wheel (release, manylinux2014) and install it into .venv

wheel: $(STAMPS)/wheel ## Build a manylinux2014 wheel and an sdist into dist/ (`pip install dist/*.whl`)

demo: $(STAMPS)/build ## Set everything up and run `trn2core demo`
	$(VENV)/bin/trn2core demo

# On two cores, in two steps. (1) The venv (pip, one core) beside one cargo build of everything
# Rust: the core, its unit and integration test binaries, and the binding the wheel packages
# (it starts before zig is installed; tools/zigcc waits for it).
# (2) The wheel (maturin finds that build fresh: packaging only), pytest on two workers, then the
# `serial` probes alone; beside them, at the lowest CPU priority, the Rust tests: they run in the
# gaps pytest leaves (its last files, the serial part's idle core) without taking time from the
# probes, which would lose to any other job at the same priority. `-Otarget` prints each target's
# output in one piece; the `+` lines hand make's job slots to cargo.
test: ## Set up, then run cargo test and pytest
	$(MAKE) --no-print-directory -j2 -Otarget $(STAMPS)/venv rust-built-eager
	$(MAKE) --no-print-directory -j2 -Otarget test-python test-rust-idle

# The tests run without transparent huge pages (NO_THP: tools/no_thp.py, inherited by every
# process a test starts), in `make test` and in test-python / test-rust alone: the suite makes
# thousands of short-lived machines, and the kernel zeroed a 2 MiB page for each row an
# instruction touched in their huge-page-advised memories. Measured (docs/benchmarks.md, "The
# test loop"): pytest's parallel part 206 -> 176 CPU-s (system time 59 -> 32), the serial part
# 47 -> 36 CPU-s and 49 -> 37 s. Advice only: every result and check is the same.
NO_THP := $(PYTHON) tools/no_thp.py

# Unit, integration and doc tests of the workspace, optimised (the exhaustive 2^32 checks need
# it) in the wheel's `release` profile; the examples are compiled by `make lint` (clippy
# --all-targets), not linked again here.
RUST_TESTS := $(RUST_ENV) cargo test --release --workspace

.PHONY: rust-built rust-built-eager test-rust-idle
RUST_BUILD := $(RUST_ENV) cargo build --release --workspace --lib --tests
rust-built: $(STAMPS)/zig
	+$(RUST_BUILD)

# The same build for `make test`, which installs zig beside it: compiling starts at once, and
# the first link waits in tools/zigcc for zig's stamp.
rust-built-eager:
	+$(RUST_BUILD)

test-rust: $(STAMPS)/zig ## cargo test (optimised: the exhaustive 2^32 checks need it)
	+$(NO_THP) env $(RUST_TESTS) --tests
	+$(NO_THP) env $(RUST_TESTS) --doc

test-rust-idle: rust-built
	+nice -n 19 $(MAKE) --no-print-directory test-rust

# pytest in two parts: the suite on two workers (pytest-xdist, one test file per worker at a
# time, so a module's fixtures are built once; the longest files first, tests/conftest.py), then the `serial` tests alone: they time Ctrl-C
# latency and GIL release, which another worker's load would distort (on two workers among
# themselves, a 1 s bound was missed on a loaded host). Plain `pytest` runs everything in one
# process.
# The serial part collects only the files that mark tests `serial` (collecting the whole suite
# again to select 38 tests took seconds).
SERIAL_FILES = $(shell grep -rlE "pytest\.mark\.serial" tests --include='*.py' | sort)
test-python: $(STAMPS)/build ## pytest against the installed wheel (and that wheel in a clean venv)
	$(NO_THP) $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not serial"
	$(NO_THP) $(PY) -m pytest -q -m "serial and not slow" $(SERIAL_FILES)

# Coverage-guided targets of fuzz/ (its own workspace), FUZZ_SECONDS each; cargo-fuzz needs
# nightly flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := dma_stream collective_schedule access_pattern

.PHONY: fuzz fuzz-adversarial fuzz-libfuzzer
fuzz: $(STAMPS)/build ## Fuzz for longer: proptest, hypothesis, the slow adversarial probes, libFuzzer targets
	time PROPTEST_CASES=$${PROPTEST_CASES:-200000} $(RUST_ENV) cargo test --release -p trn2core --test it fuzz::
	time HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q tests/test_fuzz.py --hypothesis-show-statistics
	$(MAKE) fuzz-adversarial fuzz-libfuzzer

fuzz-adversarial: $(STAMPS)/build ## The whole adversarial suite: fast and `slow` probes (tests/adversarial, Ctrl-C)
	time $(PY) -m pytest -q -m "slow or not slow" tests/adversarial tests/test_interrupts.py

fuzz-libfuzzer: ## cargo-fuzz (libFuzzer): stream decoder, collective schedule builder, access patterns
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	@mkdir -p fuzz/corpus
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	    mkdir -p corpus/$$t && \
	    RUSTC_BOOTSTRAP=1 cargo fuzz run $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) \
	        -rss_limit_mb=4096 -print_final_stats=1 2>&1 | tee ../.stamps/fuzz-$$t.log | \
	        grep -E "^(#[0-9]+ +DONE|stat::|==[0-9]+==|SUMMARY|Done)" ; \
	    test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

lint: $(STAMPS)/build ## rustfmt, clippy -D warnings, ruff, no import cycles, _core.pyi == the module
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches tools
	$(VENV)/bin/ruff format --check python tests benches tools
	$(PY) tools/check_cycles.py
	$(PY) -m mypy.stubtest trn2core._core

# compare_peers.py runs a cargo example (machine_speed): with $(RUST_ENV) it links as the other
# builds do, so it reuses their compile instead of rebuilding the core with other flags.
bench: $(STAMPS)/build ## Ratios against peers in one process, then the asv suites on this env
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(RUST_ENV) $(PY) benches/compare_peers.py
	$(VENV)/bin/asv machine --yes >/dev/null
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(VENV)/bin/asv run --python=same --quick --show-stderr --set-commit-hash=$$(git rev-parse HEAD)

docs: $(STAMPS)/venv ## Build the Rust API docs (target/doc) and list the guides in docs/
	cargo doc --no-deps -p trn2core
	@ls docs/*.md

clean: ## Remove build products and the venv
	rm -rf target $(VENV) $(STAMPS) .asv $(DIST)
