"""A downloaded chapter re-executes elsewhere (issue 45): the executed notebook of every chapter
(what ``book/chapters/`` holds and the book's download button gives), run again with papermill at
its smoke preset (parameters from the front matter) from a folder outside the repository, with a
relative ``$ICLNB_CLAIMS_JSON`` and papermill's ``cwd=``, writes the same claims."""

import json

import papermill as pm
import pytest

from iclnb.bookkit import runner

CHAPTERS = [c.number for c in runner.chapters() if c.kind == "chapter"]  # the sweep page (how-to) runs chapter 4


@pytest.mark.parametrize("number", CHAPTERS)
def test_an_executed_chapter_reruns_elsewhere_at_its_smoke_preset(number, smoke_run, tmp_path_factory, monkeypatch):
    first = smoke_run(number)  # the executed notebook, as `iclnb book --smoke` writes it to book/chapters/
    ch = first.chapter
    params = {**ch.smoke, "enforce_claims": False}
    away = tmp_path_factory.mktemp("downloads")
    (away / "work").mkdir()
    monkeypatch.chdir(away)
    monkeypatch.delenv("ICLNB_CHAPTER_SOURCE", raising=False)
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", f"runs/{ch.slug}.claims.json")  # relative: made in the kernel's cwd
    pm.execute_notebook(str(first.output), str(away / f"{ch.slug}.ipynb"), parameters=params, cwd="work",
                        progress_bar=False, kernel_name="python3")
    again = json.loads((away / "work" / "runs" / f"{ch.slug}.claims.json").read_text())
    assert again["chapter"] == ch.slug and again["enforced"] is False
    assert {c["id"] for c in again["claims"]} == {c["id"] for c in first.claims["claims"]}
