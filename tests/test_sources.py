"""Sources a user can click (issue 17): every source tag in the project resolves to a row of the
Rust table (``trn2core.spec.sources()``), docs/sources.md lists exactly those rows and the one
status legend, no file points at notes users do not have, and ``trn2core spec`` writes values
for people with their sources.

``python tests/test_sources.py`` rewrites the generated part of docs/sources.md from the table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trn2core import spec
from trn2core.errors import Trn2ValueError

ROOT = Path(__file__).resolve().parent.parent
SOURCES_MD = ROOT / "docs" / "sources.md"
BEGIN = "<!-- sources:begin (generated from rust/trn2core/src/spec.rs) -->"
END = "<!-- sources:end -->"

# Every file a user of the repository reads: the guides, the README, the code and its comments.
PROJECT_FILES = sorted(
    {ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile"}
    | set((ROOT / "docs").glob("*.md"))
    | {
        p
        for d in ("python", "rust", "tests", "benches")
        for p in (ROOT / d).rglob("*")
        if p.suffix in (".py", ".pyi", ".rs", ".md", ".toml")
        and "target" not in p.parts
        and not p.is_relative_to(ROOT / "python" / "trn2core" / "docs")
    }  # the link to docs/
)
# A tag: `[S12]`, `[S3 current]`, `[S5: ...]`, `\[S1\]` (escaped in Rust docs), `[P]`.
TAG = re.compile(r"\\?\[(S\d+)(?=[\]\s:;,\\])|\\?\[([PF])\\?\]")


def _tags_in(text: str) -> set[str]:
    return {a or b for a, b in TAG.findall(text)}


def test_every_tag_in_the_project_resolves_to_a_source():
    known = {s.tag for s in spec.sources()}
    used: dict[str, list[str]] = {}
    for path in PROJECT_FILES:
        for tag in _tags_in(path.read_text(encoding="utf-8")):
            used.setdefault(tag, []).append(str(path.relative_to(ROOT)))
    unknown = {t: files for t, files in used.items() if t not in known}
    assert not unknown, f"tags without a source in spec::SOURCES: {unknown}"
    # The scan did find the tags (spec.rs alone cites over 30 different ones).
    assert len(used) > 30 and "P" in used and "S1" in used and "F" in used
    assert "S42" in known and len(known) == 44


def test_spec_entries_cite_known_sources_with_a_defined_status():
    letters = {s.letter for s in spec.statuses()}
    assert letters == {"D", "I", "C", "calibrated"}
    for e in spec.entries():
        assert e.tags and e.status in letters, e
        assert e.tags == tuple(dict.fromkeys(re.findall(r"\[(S\d+|P|F)\]", e.source))), e
        assert all(s.tag in e.tags for s in e.sources)


def test_no_file_points_at_notes_users_do_not_have():
    banned = [
        "trn2" + "_facts",
        "facts" + " sheet",
        "facts-" + "sheet",
        "shared/" + "docs",
        "shared/" + "seeds",
        "facts " + "§",
    ]
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in PROJECT_FILES
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(b in line for b in banned)
    ]
    assert not hits, "\n".join(hits)


def test_contract_sections_cited_exist_in_api_md():
    # "contract section N" in a docstring, guide or comment points at docs/api.md, which users
    # have (the package ships the guides), so every cited section must be one of its headings.
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", api, re.M)}
    assert sections == set(range(1, 10))
    cited = re.compile(r"contract(?:'s)? sections? (\d+)(?: and (\d+))?|contract \(section (\d+)\)")
    bad = [
        f"{path.relative_to(ROOT)}:{i}: {n}"
        for path in PROJECT_FILES
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for m in cited.finditer(line)
        for n in m.groups()
        if n is not None and int(n) not in sections | {0}
    ]
    assert not bad, bad
    assert sum(1 for p in PROJECT_FILES if cited.search(p.read_text(encoding="utf-8"))) > 20


def _generated_block() -> str:
    lines = [BEGIN, "", "| letter | name | meaning |", "|---|---|---|"]
    lines += [f"| **{s.letter}** | {s.name} | {s.meaning} |" for s in spec.statuses()]
    lines += ["", "| tag | title | address | read |", "|---|---|---|---|"]
    for s in spec.sources():
        address = f"<{s.url}>" if s.url else "(no public address)"
        if s.also:
            address += "; also " + ", ".join(f"<{u}>" for u in s.also)
        lines.append(f"| [{s.tag}] | {s.title} | {address} | {s.read} |")
    return "\n".join([*lines, "", END])


def test_sources_md_lists_exactly_the_table():
    text = SOURCES_MD.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    block = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert block == _generated_block(), "run `python tests/test_sources.py` to regenerate"
    # ...and every row is one a reader can follow: a title and an https address (P, the
    # unpublished product description, and F, this project's own calibration, excepted).
    rows = re.findall(r"^\| \[(S\d+|P|F)\] \| (.+?) \| (.+?) \| (.+?) \|$", block, re.M)
    assert [r[0] for r in rows] == [s.tag for s in spec.sources()]
    for tag, _title, address, _read in rows:
        assert address.startswith("<https://") or tag in ("P", "F"), tag


def test_one_status_legend_for_every_doc():
    # The letters mean one thing everywhere: what spec.statuses() says, which docs/sources.md
    # lists; every guide with a status column points there.
    legend = {s.letter: s.name for s in spec.statuses()}
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        assert "corroborated" not in text, path.name  # the other meaning C once had
        if re.search(r"^\|.*\| status \|", text, re.M):
            assert "[sources.md](sources.md)" in text, f"{path.name}: a status column, no legend"
    for name in ("spec.md", "performance-model.md"):
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert "[sources.md](sources.md)" in text, name
        for letter, word in legend.items():
            want = f"**{letter}**" if letter == word else f"**{letter}** {word}"
            assert want in text, (name, letter)


def test_spec_md_lists_every_constant_as_the_code_has_it():
    text = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    rows = {r[0]: r for r in re.findall(r"^\| `(\w+)` \| (.*?) \| (.*?) \| (.*?) \|", text, re.M)}
    assert list(rows) == [e.name for e in spec.entries()]
    for e in spec.entries():
        assert rows[e.name][1:] == (e.text, e.unit, e.source), e.name


def test_models_section_lists_every_preset_with_its_config():
    # model.rs cites docs/sources.md "Models" for the presets' numbers: one row per preset,
    # each with the address of the published config.json it was read from, or, for a model
    # whose numbers come from an AWS contrib README (Trinity), that README's address.
    from trn2core import workload

    text = SOURCES_MD.read_text(encoding="utf-8")
    assert "\n## Models\n" in text
    section = text.split("\n## Models\n", 1)[1]
    rows = re.findall(r"^\| `([\w.-]+)` \| (\S+) \| <(https://\S+)> \|", section, re.M)
    assert [r[0] for r in rows] == list(workload.PRESETS)
    for _preset, repo, url in rows:
        contrib = "https://github.com/aws-neuron/neuronx-distributed-inference/blob/"
        assert url == f"https://huggingface.co/{repo}/blob/main/config.json" or (
            url.startswith(contrib) and url.endswith("/README.md")
        ), url
    assert "docs/sources.md" in (ROOT / "rust/trn2core/src/workload/model.rs").read_text()


def test_source_and_describe():
    s = spec.source("S3")
    assert s.title == "Trainium2 Architecture"
    assert s.url.endswith("/about-neuron/arch/neuron-hardware/trainium2.html")
    assert spec.source("[S3]") == s
    assert spec.source("P").url == ""
    for bad in ("S43", "", "s3", 3, None):
        with pytest.raises(Trn2ValueError, match="tag: unknown source tag"):
            spec.source(bad)
    e = spec.describe("hbm_chip_bytes_per_s")
    assert (e.value, e.unit, e.status, e.tags) == (2.9e12, "B/s", "C", ("S3", "S5", "S27"))
    assert [x.title for x in e.sources][:2] == [
        "Trainium2 Architecture",
        "Amazon EC2 Trn2 Architecture",
    ]
    assert e.text == "2.9 TB/s"
    assert spec.describe("neuronlink_xy_link_bytes_per_s").tags == ("P", "S5")


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (2.9e12, "B/s", "2.9 TB/s"),
        (3.625e11, "B/s", "362.5 GB/s"),
        (1.024e12, "B/s", "1.024 TB/s"),
        (24 * 2**30, "B", "24 GiB"),
        (224 * 2**10, "B", "224 KiB"),
        (212_984, "B", "212,984 B"),
        (1_000_000, "B", "1 MB"),
        (256, "B", "256 B"),
        (0, "B", "0 B"),
        (2.4e9, "Hz", "2.4 GHz"),
        (0.96e9, "Hz", "960 MHz"),
        (128 * 128 * 2 * 2.4e9, "FLOP/s", "78.64 TFLOPS"),
        (1.0e12, "FLOP/s", "1 TFLOPS"),
        (1299.0, "TFLOPS", "1,299 TFLOPS"),
        (1300e-9, "s", "1.3 µs"),
        (5e-7, "s", "500 ns"),
        (1416e-9, "s", "1.416 µs"),
        (15e-6, "s", "15 µs"),
        (200e9, "bit/s", "200 Gbit/s"),
        (0.5, "fraction", "50%"),
        (0.5, "ratio", "0.5x"),
        (4, "ratio", "4x"),
        (64, "cycles", "64 cycles"),
        (57344, "dimensionless", "57,344"),
        (15.5, "dimensionless", "15.5"),
        (16, "count", "16"),
        (4, "bit", "4 bits"),
    ],
)
def test_format_value(value, unit, text):
    assert spec.format_value(value, unit) == text


def test_every_entry_formats_without_raw_floats():
    for e in spec.entries():
        assert "e+" not in e.text and "e-" not in e.text and len(e.text) < 20, (e.name, e.text)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trn2core", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_spec_prints_units_for_people_and_the_legend():
    r = _cli("spec")
    assert r.returncode == 0, r.stderr
    for text in ("2.9 TB/s", "24 GiB", "2.4 GHz", "78.64 TFLOPS", "224 KiB", "1.3 µs"):
        assert text in r.stdout, text
    assert "2900000000000" not in r.stdout and "2.9e+12" not in r.stdout
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("hbm_chip_bytes_per_s "))
    assert row.split() == ["hbm_chip_bytes_per_s", "2.9", "TB/s", "[S3][S5][S27]", "C"]
    for s in spec.statuses():
        assert f"{s.letter} = {s.name}: {s.meaning}" in r.stdout
    assert "trn2core spec --sources" in r.stdout


def test_cli_spec_sources_and_names():
    r = _cli("spec", "--sources")
    assert r.returncode == 0, r.stderr
    for s in spec.sources():
        assert f"[{s.tag}] {s.title}" in r.stdout
        assert (s.url or "(no public address)") in r.stdout
    r = _cli("spec", "cc_cores_per_chip")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cc_cores_per_chip = 16")
    assert "C = conflict" in r.stdout and spec.source("S17").url in r.stdout
    r = _cli("spec", "--sources", "lnc_max")
    assert r.stdout.startswith("[P] ") and "(no public address)" in r.stdout
    assert "[S1]" not in r.stdout
    r = _cli("spec", "hbm_bytes")
    assert r.returncode == 2 and "unknown constant 'hbm_bytes'" in r.stderr
    assert "hbm_chip_bytes" in r.stderr and "Traceback" not in r.stderr


def test_cli_spec_json_keeps_the_raw_numbers():
    rows = json.loads(_cli("spec", "--json").stdout)
    assert [r["name"] for r in rows] == [e.name for e in spec.entries()]
    by = {r["name"]: r for r in rows}
    assert by["hbm_chip_bytes_per_s"]["value"] == 2.9e12
    assert by["hbm_chip_bytes_per_s"]["tags"] == ["S3", "S5", "S27"]
    assert by["sbuf_bytes"]["value"] == 28 * 2**20
    srcs = json.loads(_cli("spec", "--sources", "--json").stdout)
    assert [s["tag"] for s in srcs] == [s.tag for s in spec.sources()]
    assert srcs[2]["url"] == spec.source("S3").url


if __name__ == "__main__":  # regenerate the table part of docs/sources.md
    text = SOURCES_MD.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    SOURCES_MD.write_text(head + _generated_block() + rest.split(END, 1)[1], encoding="utf-8")
    print(f"rewrote the generated part of {SOURCES_MD}")
