"""Checks of the book's sources: TOC, chapter conventions, and the two dependency lists agree."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from iclnb import contract
from iclnb.bookkit import runner

ROOT = contract.ROOT
GENERATED = {"book/reproducibility", "book/verdicts"}  # written by `iclnb book`


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def test_every_toc_file_exists_or_is_generated_from_a_source():
    for f in toc_files():
        if f.startswith("book/chapters/"):
            assert (ROOT / "notebooks" / (Path(f).name + ".md")).exists(), f"no chapter source for {f}"
        elif f not in GENERATED:
            assert any((ROOT / (f + ext)).exists() for ext in (".md", ".ipynb")), f"missing {f}"


def test_every_chapter_is_in_the_toc():
    toc = set(toc_files())
    for ch in runner.chapters():
        assert f"book/chapters/{ch.slug}" in toc, f"{ch.slug} is not in _toc.yml"


@pytest.mark.parametrize("ch", runner.chapters(), ids=lambda c: c.slug)
def test_chapter_conventions(ch):
    nb = ch.notebook()
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one parameters cell"
    params = ch.parameters()
    assert all(p.help for p in params), f"parameters without a help comment: {[p.name for p in params if not p.help]}"
    names = {p.name for p in params}
    assert {"seed", "device", "enforce_claims"} <= names
    assert ch.description, "front matter iclnb.description is missing"
    assert "smoke" in ch.presets, "front matter iclnb.smoke (the tiny parameters) is missing"
    assert "paper" in ch.presets, "front matter iclnb.paper (the paper-scale parameters) is missing"
    for preset, values in ch.presets.items():  # every preset sets only real parameters
        assert set(values) <= names, f"{preset} parameters not in the parameters cell: {set(values) - names}"
    assert re.match(rf"# {ch.number}\. ", ch.path.read_text().split("---", 2)[2].lstrip()), "title '# N. ...'"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not re.search(r"^\s*(class |def )", code, re.M), "define models/estimators in iclnb, not in a chapter"
    assert "raises-exception" not in ch.path.read_text()
    assert "Claims(" in code and "claims.finish()" in code


SHOWS = ("show_table", "claims.box", "display(")  # what a figure cell must not do: show a table or a box


@pytest.mark.parametrize("ch", [c for c in runner.chapters() if c.kind == "chapter"], ids=lambda c: c.slug)
def test_chapter_reads_paper_figure_verdict(ch):
    """The reader's items, for every chapter: code at most half of the source lines (code-cell
    lines against markdown-cell lines), no code cell over 40 lines, every figure named and
    captioned in a cell that shows only its figure (MyST-NB wraps every output of a figure cell in
    the figure), cited by name, and the chapter ends with what reproduces and what does not."""
    nb = ch.notebook()
    code = [c for c in nb.cells if c.cell_type == "code"]
    lines = {kind: sum(len(c.source.splitlines()) for c in nb.cells if c.cell_type == kind)
             for kind in ("code", "markdown")}
    assert lines["code"] <= lines["markdown"], lines
    assert max(len(c.source.splitlines()) for c in code) <= 40
    figures = [c for c in code if "figure" in c.metadata.get("mystnb", {})]
    assert figures, "no figure with MyST-NB figure metadata"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for c in figures:
        fig = c.metadata["mystnb"]["figure"]
        assert fig.get("name") and fig.get("caption"), fig
        assert not any(s in c.source for s in SHOWS), f"{fig['name']} shows more than its figure"
        assert f"{{numref}}`{fig['name']}`" in text, f"{fig['name']} is not cited"
    assert "## What reproduces and what does not" in text


def _requirements(lines):
    return sorted(re.sub(r"\s+", "", s) for s in lines)


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = py["dependencies"] + py["optional-dependencies"]["book"] + py["optional-dependencies"]["dev"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert _requirements(p for p in pip if not p.startswith("-e")) == _requirements(wanted)


def test_constraints_pin_torch_like_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = next(d for d in py["dependencies"] if d.startswith("torch"))
    # the package accepts a range (LeanAdam falls back to torch's Adam where its fused kernel
    # differs); CI installs the exact version constraints.txt pins, which must lie in the range
    assert torch_req == "torch>=2.4,<2.14"
    pin = re.search(r"^torch==(\d+)\.(\d+)\.(\d+) ;", (ROOT / "constraints.txt").read_text(), re.M)
    assert pin and (2, 4) <= tuple(map(int, pin.groups()[:2])) < (2, 14)


def test_built_book_if_present():
    """After `make book`: the index opens on the intro, chapters and the reproducibility page exist."""
    html = ROOT / "_build" / "html"
    if not (html / "index.html").exists():
        pytest.skip("book not built yet (make book)")
    assert "book/intro.html" in (html / "index.html").read_text()
    assert (html / "book" / "reproducibility.html").exists()
    verdicts = html / "book" / "verdicts.html"
    assert verdicts.exists() and "Verdicts" in verdicts.read_text()
    for ch in runner.chapters():
        page = html / "book" / "chapters" / f"{ch.slug}.html"
        if page.exists():
            assert "iclnb-claims" in page.read_text(), f"{ch.slug}: no claims table on the page"
