"""The runner on a tiny synthetic chapter: parameters reach the notebook, failures are reported."""

import json

import pytest

from iclnb import contract
from iclnb.bookkit import book, pages, runner

pytestmark = pytest.mark.notebook


def run(chapter, tmp_path, overrides=None, smoke=False, preset=None):
    return runner.run_chapter(chapter, overrides, output=tmp_path / "out" / "98.ipynb", smoke=smoke,
                              log=lambda *_: None, preset=preset)


def test_presets(chapter, tmp_path):
    assert chapter.presets == {"smoke": {"n": 2}, "paper": {"n": 100}}
    r = run(chapter, tmp_path, preset="paper")
    assert r.parameters == {"n": 100} and r.preset == "paper" and r.ok and r.claims["enforced"]
    assert run(chapter, tmp_path, {"n": 7}, preset="paper").parameters == {"n": 7}  # overrides win
    assert run(chapter, tmp_path, preset="smoke").parameters == {"n": 2, "enforce_claims": False}
    chapter.path.write_text(chapter.path.read_text().replace("  paper: {n: 100}\n", ""))
    with pytest.raises(runner.ParameterError, match="no preset 'paper'"):
        run(chapter, tmp_path, preset="paper")


def test_defaults_pass_and_write_claims(chapter, tmp_path):
    r = run(chapter, tmp_path)
    assert r.ok and not r.error and r.claims["passed"] == 1
    assert json.loads(runner.claims_path(r.output).read_text())["chapter"] == "98_synthetic"
    assert "1 passed, 0 failed" in r.summary()


def test_output_may_be_a_folder(chapter, tmp_path):
    r = runner.run_chapter(chapter, output=tmp_path, log=lambda *_: None)
    assert r.ok and r.output == (tmp_path / "98_synthetic.ipynb").resolve() and r.output.is_file()


def test_failed_claim_is_enforced_at_defaults_but_not_in_smoke(chapter, tmp_path):
    r = run(chapter, tmp_path, {"n": "3"})
    assert not r.ok and not r.error and r.claims_failed == 1 and "CLAIMS FAILED" in r.summary()
    r = run(chapter, tmp_path, smoke=True)
    assert r.parameters == {"n": 2, "enforce_claims": False}
    assert r.ok and r.claims_failed == 1 and "not enforced" in r.summary()


def test_claims_not_enforced_at_the_defaults_never_read_as_passing(chapter, tmp_path, monkeypatch):
    """``-p enforce_claims False`` at the defaults: the claims hold, but nothing was enforced, so
    neither the summary nor the Reproducibility page says the chapter passed."""
    r = run(chapter, tmp_path, {"enforce_claims": False})
    assert r.ok and r.claims["enforced"] is False and r.status == "claims not enforced"
    assert r.summary().rstrip().endswith("claims not enforced") and " ok" not in r.summary()
    monkeypatch.setattr(pages, "REPRO_PAGE", tmp_path / "repro.md")
    row = next(line for line in pages.write_reproducibility_page([r]).read_text().splitlines()
               if line.startswith("| 98. Synthetic |"))
    assert row.endswith("| claims not enforced |")
    assert run(chapter, tmp_path).status == "pass"


def test_failing_cell_is_reported_and_partial_notebook_kept(chapter, tmp_path):
    r = run(chapter, tmp_path, {"fail_at": "cell"})
    assert not r.ok and "RuntimeError: boom" in r.error and "cell" in r.error
    assert r.output.exists() and not runner.claims_path(r.output).exists()


def test_numpy_scalar_glue_is_an_error(chapter, tmp_path):
    """A glued numpy scalar fails the book build later (myst-nb cannot format 'np.float64(5.0)'):
    the runner reports it at once, naming the glued value."""
    assert not run(chapter, tmp_path).error
    r = run(chapter, tmp_path, {"fail_at": "glue"})
    assert "n_half = np.float64(5.0)" in r.error and not r.ok


def test_reproducibility_page(chapter, tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "REPRO_PAGE", tmp_path / "repro.md")
    runs = [run(chapter, tmp_path), run(chapter, tmp_path, preset="paper")]
    page = pages.write_reproducibility_page(runs).read_text()
    assert "Ran with its defaults" in page and "Ran with the **paper** preset" in page
    assert "that is cpu (" in page or "that is cuda:" in page  # the device used, not only the parameter
    assert "torch" in page and "98. Synthetic" in page and "n is at least 5" in page
    assert "| pass |" in page and "n-min" in page and "n of 2: 2 (fails)" in page
    # the book's scorecard: counts per chapter, then every claim in scope with its null's kind, the
    # threshold's basis, the verdict at this run and over seeds, the paper's value, ours, the null's
    card = page[page.index("## Scorecard"):]
    assert "| 98. Synthetic |" in card and "| **all chapters** |" in card and "no record" in card
    assert "| 98. Synthetic | n-min | n is at least 5 |" in card and "| n-rate |" in card
    assert "not attempted" in card


@pytest.mark.parametrize("env, url", [
    ("https://user:token@github.com/iclnb/iclnb.git", "https://github.com/iclnb/iclnb"),  # no credentials on the page
    ("http://gitlab.example.org/a/b/", "http://gitlab.example.org/a/b"),
    ("", ""),  # set but empty: no repository button
])
def test_repository_url_from_the_environment(monkeypatch, env, url):
    monkeypatch.setenv("ICLNB_REPO_URL", env)
    assert book.repository_url() == url


def test_repository_url_must_be_a_web_address(monkeypatch):
    monkeypatch.setenv("ICLNB_REPO_URL", "git@github.com:iclnb/iclnb.git")
    with pytest.raises(runner.ParameterError, match="http"):
        book.repository_url()


def test_book_config_has_a_repository_button_only_with_a_url(tmp_path):
    import yaml

    for url in ("https://github.com/iclnb/iclnb", ""):
        config = yaml.safe_load(book.write_book_config(url, tmp_path / "config.yml").read_text())
        assert config["html"]["use_repository_button"] is bool(url)
        assert config.get("repository", {}).get("url", "") == url
        assert config["sphinx"] == yaml.safe_load((contract.ROOT / "_config.yml").read_text())["sphinx"]


def test_a_figure_cell_that_shows_more_is_an_error(tmp_path):
    """MyST-NB wraps every rich output of a figure cell in the figure: a table or verdict box beside
    the image would give two targets of one name. The runner names such a cell as the run's error."""
    image = {"output_type": "display_data", "data": {"image/png": "AAA", "text/plain": "<Figure>"}, "metadata": {}}
    table = {"output_type": "display_data", "data": {"text/markdown": "| a |"}, "metadata": {}}
    text = {"output_type": "stream", "name": "stdout", "text": "progress"}
    fig = {"cell_type": "code", "id": "c1", "source": "plot()", "execution_count": 3, "outputs": [text, image],
           "metadata": {"mystnb": {"figure": {"name": "fig-x", "caption": "X"}}}}
    plain = {"cell_type": "code", "id": "c2", "source": "x", "execution_count": 4, "outputs": [table], "metadata": {}}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [fig, plain], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    glued = {"output_type": "display_data", "data": {"application/papermill.record/text/plain": "2"},
             "metadata": {"scrapbook": {"name": "k"}}}
    fig["outputs"] = [glued, text, image]
    path.write_text(json.dumps({"cells": [fig, plain], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert runner.crowded_figures(path) == ""  # a glue or a stream beside the image is not rendered in it
    fig["outputs"] = [table, image]
    path.write_text(json.dumps({"cells": [fig, plain], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert "fig-x" in runner.crowded_figures(path) and "own cell" in runner.crowded_figures(path)
