"""Parameterized papermill runs as the README and the introduction show them (issue 45): the
claims path checked in the first cell, the introduction's recipe with and without papermill's
``cwd=``, ``iclnb export`` and the papermill line of ``iclnb params``, a kernel's own log kept off
the page, and what a chapter's training time measured."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import papermill as pm
import pytest
from fake_chapter import front_matter, write_chapter

from iclnb import contract
from iclnb.bookkit import book, cli, pagecheck, pages, records, runner
from iclnb.bookkit.claims import Claims

pytestmark = pytest.mark.notebook


def test_a_relative_claims_path_is_made_and_fixed_when_the_claims_are_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", "runs/deep/ch.claims.json")
    claims = Claims("98_synthetic", findings={})
    assert (tmp_path / "runs" / "deep").is_dir()  # made in the first cell, not at the last
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # a cell that changes directory does not move it
    assert claims.save() == tmp_path / "runs" / "deep" / "ch.claims.json"
    assert json.loads((tmp_path / "runs" / "deep" / "ch.claims.json").read_text())["chapter"] == "98_synthetic"


def test_a_claims_path_that_cannot_be_written_fails_at_once_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file where the folder should be")
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", "runs/ch.claims.json")
    with pytest.raises(OSError) as e:
        Claims("98_synthetic", findings={})
    assert str(tmp_path / "runs" / "ch.claims.json") in str(e.value)
    assert f"working directory {tmp_path}" in str(e.value) and "ICLNB_CLAIMS_JSON='runs/ch.claims.json'" in str(e.value)


def _recipe(source: Path, seed: int, cwd):
    """The introduction's recipe (book/intro.md, "Parameterized papermill runs"), one seed."""
    import jupytext

    nb = jupytext.read(source)
    os.makedirs("runs", exist_ok=True)
    os.environ["ICLNB_CLAIMS_JSON"] = os.path.abspath(f"runs/ch98_seed{seed}.claims.json")
    pm.execute_notebook(nb, f"runs/ch98_seed{seed}.ipynb", parameters={"seed": seed, "enforce_claims": False},
                        cwd=cwd, progress_bar=False)


@pytest.mark.parametrize("cwd", [None, "work"])
def test_the_introductions_recipe_writes_every_runs_claims(chapter, tmp_path, monkeypatch, cwd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", "")  # restored after the test; the recipe sets it
    if cwd:
        (tmp_path / cwd).mkdir()
    for seed in (0, 1):
        _recipe(chapter.path, seed, cwd)
        data = json.loads((tmp_path / "runs" / f"ch98_seed{seed}.claims.json").read_text())
        assert data["chapter"] == "98_synthetic" and data["claims"]
        assert (tmp_path / "runs" / f"ch98_seed{seed}.ipynb").is_file()


def test_a_relative_claims_path_with_cwd_lands_in_the_kernels_directory(chapter, tmp_path, monkeypatch):
    """The issue's case: a relative $ICLNB_CLAIMS_JSON and ``cwd="work"``. The folder is made where
    the kernel runs (work/runs/), at the first cell, instead of failing at the last."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "runs").mkdir()
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", "runs/ch98.claims.json")
    pm.execute_notebook(cli.export_chapter(chapter, tmp_path / "ch98.ipynb"), "runs/ch98.ipynb",
                        parameters={"enforce_claims": False}, cwd="work", progress_bar=False)
    assert json.loads((tmp_path / "work" / "runs" / "ch98.claims.json").read_text())["chapter"] == "98_synthetic"


def test_export_writes_the_notebook_papermill_reads(chapter, tmp_path):
    assert cli.export_chapter(chapter, tmp_path / "ch.ipynb") == tmp_path / "ch.ipynb"
    path = cli.export_chapter(chapter, tmp_path / "into")  # not .ipynb: a folder, made
    assert path == tmp_path / "into" / "98_synthetic.ipynb"
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["iclnb"]["smoke"] == {"n": 2}
    assert [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]


def test_export_command(tmp_path, capsys):
    assert cli.main(["export", "4", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "04_lipschitz_adaptation.ipynb").is_file()
    assert str(tmp_path / "04_lipschitz_adaptation.ipynb") in capsys.readouterr().out


def test_the_papermill_line_puts_lists_in_yaml():
    ch = runner.find_chapter(4)
    line = cli.papermill_line(ch, {"steps": 30, "device": "cpu", "enforce_claims": False, "tag": "1.5",
                                   "sweep_n": [8, 16, 32]}, "out.ipynb")
    assert line == ("papermill book/chapters/04_lipschitz_adaptation.ipynb out.ipynb -p steps 30 -p device cpu "
                    "-p enforce_claims False -y \"{sweep_n: [8, 16, 32], tag: '1.5'}\"")


def test_params_prints_a_papermill_line_that_runs(tmp_path, capsys, monkeypatch):
    """``iclnb params 4``'s papermill line, run as printed on the exported chapter from another
    folder with a relative $ICLNB_CLAIMS_JSON: it runs at the smoke preset and writes its claims."""
    assert cli.main(["params", "4"]) == 0
    out = capsys.readouterr().out
    assert "sweep_n" in out and "(papermill: -y)" in out.split("sweep_n", 1)[1].splitlines()[0]
    line = out.strip().splitlines()[-1].strip()
    assert line.startswith("papermill book/chapters/04_lipschitz_adaptation.ipynb") and " -y " in line
    cli.export_chapter(runner.find_chapter(4), tmp_path / "book" / "chapters")
    (tmp_path / "notebooks").symlink_to(contract.NOTEBOOKS)  # as in a clone: the kernel reads the source there
    env = dict(os.environ, ICLNB_CLAIMS_JSON="runs/ch4.claims.json", ICLNB_CHAPTER_SOURCE="")
    bindir = Path(sys.executable).parent
    argv = shlex.split(line)
    done = subprocess.run([str(bindir / argv[0]), *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "runs" / "ch4.claims.json").read_text())
    assert data["enforced"] is False and len(data["claims"]) > 10


STRAY = front_matter("a chapter whose kernel logs a line of its own", "smoke: {n: 2}") + """

# 97. Stray

```{code-cell} ipython3
:tags: [parameters]
n = 1  # a count
seed = 0  # random seed
device = "auto"  # device
enforce_claims = True  # raise when a claim fails
```

```{code-cell} ipython3
app = get_ipython().kernel.log
app.error("KeyboardInterrupt caught in kernel.")
app.error("a stray kernel line")
print("the chapter's own output")
```
"""


def test_a_kernels_own_log_stays_off_the_notebook_and_the_terminal(tmp_path, capfd):
    """What ipykernel logs goes to the kernel's inherited stderr; a sweep page's worker inherits the
    page kernel's, which ipykernel forwards into the page. The runner gives kernels a log file."""
    ch = write_chapter(tmp_path, "97_stray", STRAY)
    r = runner.run_chapter(ch, output=tmp_path / "out" / "97.ipynb", log=lambda *_: None, progress=False)
    assert not r.error, r.error
    err = capfd.readouterr().err
    assert "a stray kernel line" not in err and "KeyboardInterrupt" not in err
    assert r.kernel_log and "a stray kernel line" in Path(r.kernel_log).read_text()
    outputs = [o for c in json.loads(r.output.read_text())["cells"] for o in c.get("outputs", [])]
    assert not pagecheck.notebook_stderr(r.output)
    assert any("the chapter's own output" in "".join(o.get("text", "")) for o in outputs)


def test_a_kernel_log_of_noise_only_is_not_kept(chapter, tmp_path):
    r = runner.run_chapter(chapter, output=tmp_path / "98.ipynb", log=lambda *_: None, progress=False)
    assert r.ok and not r.kernel_log and not (tmp_path / "98.kernel.log").exists()
    log = tmp_path / "k.log"
    log.write_text("[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.\n\n"
                   "[IPKernelApp] WARNING | Kernel is running over TCP without encryption.\nreal trouble\n")
    assert runner._kernel_log_lines(log) == ["real trouble"]


def test_a_stderr_stream_in_a_notebook_is_a_page_defect(tmp_path):
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["sweep: 1/4 done\n"]},
        {"output_type": "stream", "name": "stderr", "text": ["[IPKernelApp] ERROR | KeyboardInterrupt caught\n"]}]}]}
    html = tmp_path / "html"
    (html / "_sources" / "book" / "chapters").mkdir(parents=True)
    (html / "book" / "chapters").mkdir(parents=True)
    (html / "_sources" / "book" / "chapters" / "08_x.ipynb").write_text(json.dumps(nb))
    page = html / "book" / "chapters" / "08_x.html"
    page.write_text("<html></html>")
    source = pagecheck.source_notebook(page)
    assert source == html / "_sources" / "book" / "chapters" / "08_x.ipynb"
    assert pagecheck.notebook_stderr(source) == [
        "in 08_x.ipynb, cell 1: [IPKernelApp] ERROR | KeyboardInterrupt caught"]
    seen = {"text": "", "errors": [], "stderr": ["[IPKernelApp] ERROR | x"], "broken_images": [], "links": [],
            "resources": []}
    assert pagecheck._defects(seen, []) == [("stderr output", "[IPKernelApp] ERROR | x")]


RUNS = [  # $ICLNB_RUNS lines: two trained now, one from the cache (its original 30 s), one untrained
    {"run": "a", "members": 4, "steps": 1000, "from_cache": False, "train_seconds": 10.0},
    {"run": "b", "members": 1, "steps": 3000, "from_cache": False, "train_seconds": 20.0},
    {"run": "c", "members": 2, "steps": 20000, "from_cache": True, "train_seconds": 30.0},
    {"run": "d", "members": 2, "steps": 50, "from_cache": False, "untrained": True, "train_seconds": 0.1},
]


def test_training_summary_splits_trained_now_from_the_cache():
    t = records.training_summary(RUNS)
    assert t["runs"] == 3 and t["trained_runs"] == 2 and t["cached_runs"] == 1
    assert t["steps"] == 4000 and t["train_seconds"] == 30.0 and t["steps_per_second"] == pytest.approx(133.3)
    assert t["cached_seconds"] == 30.0 and t["cached_share"] == 0.5
    assert records.training_line(RUNS) == ("4,000 steps in 30 s at 133 steps/s; from cache 1 of 3 runs "
                                          "(50% of training s)")
    assert records.training_line(RUNS[2:3]) == "nothing trained now; from cache 1 of 1 runs (100% of training s)"
    assert records.training_line([]) == "no training runs in its kernel"
    assert book.cache_words(RUNS[:2]) == "cold run cache: every model trained now"
    assert book.cache_words(RUNS).startswith("WARM run cache: 1 of 3 training runs, 50% of the training seconds")


def test_the_book_and_run_print_what_the_training_time_measured(chapter, tmp_path, monkeypatch, capsys):
    """``make book`` (iclnb book) prints per chapter its training steps/s and cache share, and says
    whether the total is a cold-cache time; ``iclnb run`` prints the same line."""
    def fake_run(ch, log=print, preset=None):
        return runner.Result(ch, tmp_path / f"{ch.slug}.ipynb", {}, 12.0, "", {"passed": 1, "enforced": True},
                             "", RUNS)

    monkeypatch.setattr(runner, "chapters", lambda: [chapter])
    monkeypatch.setattr(runner, "run_chapter", fake_run)
    monkeypatch.setattr(pages, "write_reproducibility_page", lambda results, smoke=False: None)
    monkeypatch.setattr(pages, "write_verdicts_page", lambda results: None)
    monkeypatch.setattr(book, "build_html", lambda url, log=print: 0)
    lines = []
    assert book.build_book(log=lines.append) == 0
    text = "\n".join(lines)
    assert "training: 4,000 steps in 30 s at 133 steps/s; from cache 1 of 3 runs (50% of training s)" in text
    assert "WARM run cache" in text.splitlines()[-1]


def test_cache_words_of_a_build_that_began_with_an_empty_cache(tmp_path, monkeypatch):
    """A build that began with an empty run cache is a cold-cache build, even where a chapter
    loaded models the build had trained (chapter 3 reuses chapter 2's)."""
    monkeypatch.setenv("ICLNB_CACHE_DIR", str(tmp_path))
    assert book.cache_entries() == 0
    (tmp_path / "softmax-x.pt").write_bytes(b"")
    (tmp_path / "softmax-y.ckpt.pt").write_bytes(b"")  # a checkpoint is no trained model
    assert book.cache_entries() == 1
    assert book.cache_words(RUNS, empty_at_start=True).startswith("cold run cache: the cache was empty at the start")
