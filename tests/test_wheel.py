"""The package people install (issues 17, 29): the manylinux2014 wheel and sdist of `make wheel`.

`make test` builds them first (the Makefile's `test-python` depends on the wheel, rebuilt only
when a source, a guide or a packaging file changed); run alone, the fixture asks make for them,
which is a no-op when they are current. The wheel is then installed with pip in a new virtual
environment (numpy and ml_dtypes from PyPI), away from the source tree, and used there.
"""

from __future__ import annotations

import email
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import trn2core

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
GUIDES = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
VERSION = trn2core.__version__


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, **kw)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    _run(["make", "-s", "wheel"], cwd=ROOT)
    wheels = sorted(DIST.glob(f"trn2core-{VERSION}-*.whl"))
    sdists = sorted(DIST.glob(f"trn2core-{VERSION}.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, (wheels, sdists)
    return wheels[0], sdists[0]


def test_the_wheel_is_manylinux2014(built, tmp_path):
    whl, _ = built
    # One abi3 wheel for CPython 3.10+, tagged for glibc 2.17 (manylinux2014 = manylinux_2_17).
    assert whl.name == (
        f"trn2core-{VERSION}-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    )
    r = _run([sys.executable, "-m", "auditwheel", "show", str(whl)])
    said = " ".join(r.stdout.split())
    assert 'consistent with the following platform tag: "manylinux_2_17_x86_64"' in said, said
    # Independently of auditwheel: no symbol of the extension needs a glibc newer than 2.17.
    with zipfile.ZipFile(whl) as z:
        so = tmp_path / "_core.abi3.so"
        so.write_bytes(z.read("trn2core/_core.abi3.so"))
    symbols = _run(["objdump", "-T", str(so)]).stdout
    versions = {tuple(map(int, v)) for v in re.findall(r"GLIBC_(\d+)\.(\d+)", symbols)}
    assert versions and max(versions) <= (2, 17), sorted(versions)


def test_the_wheel_carries_license_metadata_and_guides(built):
    whl, _ = built
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        info = f"trn2core-{VERSION}.dist-info"
        assert z.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        meta = email.message_from_bytes(z.read(f"{info}/METADATA"))
        for g in GUIDES:  # the guides, byte for byte, inside the package
            assert z.read(f"trn2core/docs/{g}") == (ROOT / "docs" / g).read_bytes(), g
    assert {n.split("/")[-1] for n in names if n.startswith("trn2core/docs/")} == set(GUIDES)
    assert "sources.md" in GUIDES and not any(n.startswith("docs/") for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier")
    for c in (
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.13",
        "Operating System :: POSIX :: Linux",
        "Intended Audience :: Science/Research",
        "Topic :: System :: Emulators",
    ):
        assert c in classifiers, c
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Repository", "Documentation", "Issues", "Sources"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    assert "trainium2" in meta["Keywords"].split(",")
    assert meta["Requires-Python"] == ">=3.10"


def test_the_sdist_carries_license_guides_and_sources(built):
    _, sdist = built
    top = f"trn2core-{VERSION}"
    with tarfile.open(sdist) as t:
        names = set(t.getnames())

        def read(name: str) -> bytes:
            f = t.extractfile(f"{top}/{name}")
            assert f is not None, name
            return f.read()

        assert read("LICENSE") == (ROOT / "LICENSE").read_bytes()
        for g in GUIDES:  # the repository's docs/, and the copy a wheel built from it will carry
            assert read(f"docs/{g}") == read(f"python/trn2core/docs/{g}")
            assert read(f"docs/{g}") == (ROOT / "docs" / g).read_bytes()
    for f in (
        "pyproject.toml",
        "Cargo.toml",
        "Cargo.lock",
        "rust/trn2core/src/spec.rs",
        "rust/trn2core-py/src/lib.rs",
        "python/trn2core/__init__.py",
    ):
        assert f"{top}/{f}" in names, f


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A new virtual environment with only the wheel (and what pip resolves for it) installed."""
    whl, _ = built
    env = tmp_path_factory.mktemp("clean") / "venv"
    # Without a pip of its own (seeding one is most of a venv's set-up time): this pip installs
    # into it through `--python`, resolving the wheel's dependencies as a user's pip would.
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)])
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env / "bin" / "python"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(whl),
        ]
    )
    return env


GEMM_SCRIPT = """
import json, sys
import numpy as np
import trn2core

rng = np.random.default_rng(17)
a = rng.standard_normal((70, 300), dtype=np.float32)
b = rng.standard_normal((300, 130), dtype=np.float32)
res = trn2core.gemm(a, b, dtype="bf16")
np.save("out.npy", res.out)
import importlib.metadata as md
print(json.dumps({"file": trn2core.__file__, "version": trn2core.__version__,
                  "license": md.metadata("trn2core")["License-Expression"],
                  "files": [str(f) for f in md.files("trn2core")],
                  "seconds": res.report.seconds, "bound": res.report.bound}))
"""


def test_the_wheel_installs_and_computes_in_a_clean_venv(venv, tmp_path):
    py = str(venv / "bin" / "python")
    r = _run([py, "-c", GEMM_SCRIPT], cwd=tmp_path)
    got = json.loads(r.stdout)
    # The installed copy ran, not the source tree.
    assert Path(got["file"]).is_relative_to(venv) and not Path(got["file"]).is_relative_to(ROOT)
    assert got["version"] == VERSION and got["license"] == "Apache-2.0"
    assert any(f.endswith("licenses/LICENSE") for f in got["files"])
    # Its bits equal the pure-numpy oracle's and this build's, and so does its timing.
    out = np.load(tmp_path / "out.npy")
    rng = np.random.default_rng(17)
    a = rng.standard_normal((70, 300), dtype=np.float32)
    b = rng.standard_normal((300, 130), dtype=np.float32)
    here = trn2core.gemm(a, b, dtype="bf16")
    ref = trn2core.reference.gemm(trn2core.quantize(a, "bf16"), trn2core.quantize(b, "bf16"))
    assert out.dtype == np.float32 and out.shape == (70, 130)
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))
    assert np.array_equal(out.view(np.uint32), here.out.view(np.uint32))
    assert (got["seconds"], got["bound"]) == (here.report.seconds, here.report.bound)


def test_the_installed_command_line_and_guides(venv, tmp_path):
    exe = str(venv / "bin" / "trn2core")
    r = _run([exe, "docs"], cwd=tmp_path)
    assert str(venv) in r.stdout  # the package's own copy, not the checkout's docs/
    for g in GUIDES:
        assert f"  {g.removesuffix('.md')} " in r.stdout, g
    r = _run([exe, "docs", "numerics"], cwd=tmp_path)
    assert r.stdout == (ROOT / "docs" / "numerics.md").read_text(encoding="utf-8")
    r = _run([exe, "spec", "hbm_chip_bytes_per_s"], cwd=tmp_path)
    assert r.stdout.startswith("hbm_chip_bytes_per_s = 2.9 TB/s") and "[S3] Trainium2" in r.stdout
    r = _run([exe, "--version"], cwd=tmp_path)
    assert VERSION in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written where it ran


def test_the_wheel_carries_the_nki_examples_for_the_demo(built, venv, tmp_path):
    whl, _ = built
    examples = sorted(p.name for p in (ROOT / "examples" / "nki").glob("*.py"))
    with zipfile.ZipFile(whl) as z:
        for name in examples:  # byte for byte, as trn2core/nki_examples/
            got = z.read(f"trn2core/nki_examples/{name}")
            assert got == (ROOT / "examples" / "nki" / name).read_bytes(), name
    # The whole tour, from the installed wheel (the suite's one run of the full demo).
    r = _run([str(venv / "bin" / "trn2core"), "demo"], cwd=tmp_path)
    assert "matmul_fully_blocked" in r.stdout and "LoopCarriedDependencyError" in r.stdout
    assert "demo took" in r.stdout and "Traceback" not in r.stdout + r.stderr
    assert "fp8_e4m3fn" in r.stdout and "stochastic" in r.stdout
    # The overflow table: Neuron's e4m3 saturates at 240, OCP e4m3fn keeps 288.
    assert "240" in r.stdout and "288" in r.stdout
    # A trace only where asked (issue 17): by default the demo writes no file at all.
    assert list(tmp_path.iterdir()) == []
    assert "--trace PATH" in r.stdout


def test_every_install_path_carries_the_guides_and_examples():
    """No copy step: python/trn2core/docs and python/trn2core/nki_examples are symbolic links
    (git mode 120000) to the one source, so `pip install .`, `pip install git+...`, an editable
    install, the sdist and the wheel all see the same files (pyproject.toml takes them in)."""
    links = {
        "python/trn2core/docs": "../../docs",
        "python/trn2core/nki_examples": "../../examples/nki",
    }
    for link, target in links.items():
        git = ["git", "ls-files", "-s", link]
        staged = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True)
        staged = staged.stdout.split()
        assert staged and staged[0] == "120000", (link, staged)
        p = ROOT / link
        assert p.is_symlink() and str(p.readlink()) == target
        assert p.resolve() == (p.parent / target).resolve() and p.resolve().is_dir()
    assert (ROOT / "python/trn2core/docs").resolve() == (ROOT / "docs").resolve()
    assert (ROOT / "python/trn2core/nki_examples").resolve() == (ROOT / "examples/nki").resolve()
