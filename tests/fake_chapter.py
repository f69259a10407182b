"""The front matter of the small synthetic chapters the runner, sweep, robustness and kernel
tests execute (a chapter source is this, a title, a parameters cell and code cells), and the
chapter written to a folder as the runner takes it."""

from pathlib import Path

from iclnb.bookkit import runner

HEAD = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
iclnb:
"""


def front_matter(description: str, *extra: str) -> str:
    """The front matter of a synthetic chapter: ``description`` and ``extra`` lines of its
    ``iclnb:`` block (e.g. ``"smoke: {n: 2}"``)."""
    return HEAD + "".join(f"  {line}\n" for line in (f"description: {description}", *extra)) + "---\n"


def write_chapter(folder: Path, slug: str, source: str) -> runner.Chapter:
    """The chapter ``source`` written to ``folder/<slug>.md`` (``slug`` like "98_synthetic")."""
    path = Path(folder) / f"{slug}.md"
    path.write_text(source)
    return runner.Chapter(int(slug[:2]), slug, path)
