"""Style checks: ruff over the library, tests and benchmarks (configured in pyproject.toml), and
a line-length limit for chapter code cells, which scroll sideways on the rendered page."""

import importlib.util
import subprocess
import sys

import pytest

from iclnb import contract
from iclnb.bookkit import runner

ROOT = contract.ROOT
LINTED = ("iclnb", "tests", "benchmarks")
CELL_LINE_MAX = 80  # characters in a line of a chapter's code cell (the page's code column)


def test_ruff_check():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *LINTED], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"ruff check {' '.join(LINTED)} found violations:\n{proc.stdout}{proc.stderr}", pytrace=False)


def long_code_lines(nb, limit=CELL_LINE_MAX):
    """``(cell index, line number in the cell, length, line)`` for every code-cell line longer than ``limit``."""
    return [(i, j, len(line), line)
            for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for j, line in enumerate(cell.source.splitlines(), start=1) if len(line) > limit]


@pytest.mark.parametrize("ch", runner.chapters(), ids=lambda c: c.slug)
def test_chapter_code_lines_fit_the_page(ch):
    long = long_code_lines(ch.notebook())
    report = "\n".join(f"  {ch.path.name}: cell {i}, line {j} ({n} chars): {line.strip()[:60]}..."
                       for i, j, n, line in long)
    if long:
        pytest.fail(f"{len(long)} code-cell lines longer than {CELL_LINE_MAX} characters:\n{report}", pytrace=False)


def test_long_code_lines_counts_code_cells_only():
    import nbformat

    long = "x = " + "1" * CELL_LINE_MAX
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(long),
                                         nbformat.v4.new_code_cell("y = 1\n" + long)])
    assert long_code_lines(nb) == [(1, 2, len(long), long)]


@pytest.mark.parametrize("ch", runner.chapters(), ids=lambda c: c.slug)
def test_parameter_help_papermill_can_parse(ch):
    """Papermill parses the parameters cell itself and cannot read a help comment with '=', '<'
    or '>' ("Unable to parse line", then "Passed unknown parameter"): notebooks/README.md."""
    bad = [f"{p.name}: {p.help}" for p in ch.parameters() if any(c in p.help for c in "=<>")]
    assert not bad, f"{ch.path.name}: parameter help with '=', '<' or '>': {bad}"
