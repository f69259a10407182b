"""The real-browser page check (iclnb.bookkit.pagecheck): tiny pages, each with one defect planted, and a clean one."""

import importlib.util
from pathlib import Path

import pytest

from iclnb.bookkit import pagecheck
from iclnb.bookkit.cli import main

pytestmark = pytest.mark.browser

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8ISfHwMDAxMDAwMDAAAANBAEIfXHKZgAAAABJRU5ErkJggg=="

# A page as the book has them: a real table, a figure, code that contains table and TeX syntax
# (code is not text), and links a reader may follow (another site, this page).
CLEAN = f"""<h1>Clean</h1>
<div class="cell_output"><table><tr><th>n</th><th>R</th></tr><tr><td>10</td><td>4</td></tr></table>
<img alt="figure" src="data:image/png;base64,{PNG}"></div>
<pre>| a | b |\n|---|---|\n$$x$$ \\(y\\)</pre><p>Inline <code>\\(z\\)</code>, a price of $5 and $6.</p>
<p><a href="https://example.org/paper">A paper</a>, <a href="PAGE.html#top">this page</a>.</p>
"""

PLANTED = {  # page name: (what is planted, the defect it must give)
    "raw_table": ("<p>| n | R |\n|—|—|\n| 10 | 4 |</p>", "raw table"),  # CommonMark + smart quotes
    "raw_table_dashes": ("<div>| n | R |\n| --- | ---: |\n| 10 | 4 |</div>", "raw table"),
    "raw_tex": ('<p>the weights <span class="math">\\(x\\)</span> and</p><div class="math">$$M = n^{1.5}$$</div>',
                "raw TeX"),
    "error_output": ('<div class="output traceback highlight-ipythontb"><pre>ValueError: boom</pre></div>',
                     "error output"),
    "broken_image": ('<img src="missing.png">', "broken image"),
    "broken_link": ('<a href="no_such_chapter.html">next chapter</a>', "broken link"),
    "external_script": ('<script src="https://cdn.example.com/mathjax.js"></script>', "external request"),
    "external_css": ('<link rel="stylesheet" href="https://fonts.example.net/font.css">', "external request"),
    "external_fetch": ('<script>fetch("https://api.example.org/track").catch(() => null)</script>',
                       "external request"),  # only the browser's request log can see this one
}


@pytest.fixture(scope="module")
def browser():
    found = pagecheck.find_browser()
    if found is None:
        pytest.skip("no chromium binary on the PATH (Debian: apt-get install chromium; .ci/run installs it): "
                    "the browser check of the book is not tested here")
    return found


def write_page(folder: Path, name: str, extra: str = "") -> Path:
    page = folder / f"{name}.html"
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{name}</title></head><body>"
                    + CLEAN.replace("PAGE", name) + extra + "</body></html>")
    return page


@pytest.fixture(scope="module")
def reports(browser, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    pages = [write_page(folder, "clean")] + [write_page(folder, name, html) for name, (html, _) in PLANTED.items()]
    return {r.page.stem: r for r in pagecheck.check_pages(pages, folder / "screenshots", browser)}


def test_clean_page_has_no_defects(reports):
    r = reports["clean"]
    assert r.defects == [] and r.images == 1
    assert {p.name for p in r.screenshots} == {"clean-top.png", "clean-figure.png", "clean-table.png"}
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in r.screenshots)


@pytest.mark.parametrize("name", PLANTED)
def test_each_planted_defect_is_found_and_nothing_else(reports, name):
    assert reports[name].kinds == {PLANTED[name][1]}, reports[name].defects


def test_defects_say_what_and_where(reports):
    assert ("external request", "https://cdn.example.com/mathjax.js") in reports["external_script"].defects
    assert ("external request", "https://api.example.org/track") in reports["external_fetch"].defects
    assert reports["broken_image"].defects[0][1].endswith("missing.png")
    assert reports["broken_link"].defects[0][1].endswith("no_such_chapter.html")
    assert "\\(x\\)" in reports["raw_tex"].defects[0][1]


def test_math_typeset_by_offline_mathjax_is_not_raw_tex(browser, tmp_path):
    """The check waits for MathJax (the copy the book serves, from sphinx-mathjax-offline)."""
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None:
        pytest.skip("sphinx-mathjax-offline is not installed (pip install -e '.[book]')")
    mathjax = Path(spec.submodule_search_locations[0]) / "static" / "mathjax" / "tex-chtml.js"
    page = write_page(tmp_path, "math", f'<p>Inline <span class="math">\\(x^2\\)</span>.</p>'
                                        f'<div class="math">\\[\\sum_i a_i\\]</div>'
                                        f'<script defer src="{mathjax.as_uri()}"></script>')
    [r] = pagecheck.check_pages([page], browser=browser)
    assert r.defects == [] and r.math == 2


def test_cli_without_a_built_book_exits_2(tmp_path, capsys):
    assert main(["check-pages", "--html", str(tmp_path)]) == 2
    assert "no built book" in capsys.readouterr().out
