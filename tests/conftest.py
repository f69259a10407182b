"""Shared test fixtures: an isolated run cache (for the session, or fresh for one test), and smoke
runs of chapters through papermill."""

import os

import pytest
from fake_chapter import front_matter, write_chapter

from iclnb.bookkit import runner
from iclnb.contract import UNTRAINED


def pytest_collection_modifyitems(items):
    """A test that runs a chapter (the ``smoke_run`` fixture) is a ``notebook`` test; the rest mark
    themselves (``pytestmark`` in their module)."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.notebook)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests never read or write the user's run cache."""
    before = os.environ.get("ICLNB_CACHE_DIR")
    os.environ["ICLNB_CACHE_DIR"] = str(tmp_path_factory.mktemp("iclnb-cache"))
    yield
    if before is None:
        os.environ.pop("ICLNB_CACHE_DIR", None)
    else:
        os.environ["ICLNB_CACHE_DIR"] = before


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty run cache for this test alone (for tests that check cache hits and misses)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("ICLNB_CACHE_DIR", str(path))
    return path


_SMOKE_RUNS: dict = {}  # (chapter, overrides) -> Result: each chapter executes once per session


@pytest.fixture(scope="session")
def _smoke_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke-runs")


@pytest.fixture
def smoke_run(_smoke_dir):
    """``smoke_run(number, **overrides)``: a chapter executed with its smoke parameters and every
    model left at its initialisation (``ICLNB_UNTRAINED=1``), once per session for the same
    arguments: the chapter's tests, the untrained-model test and the re-execution test read the
    same run (the re-execution test's papermill run trains the smoke models). Asserts it ran without
    error and wrote its claims; returns the ``Result``."""

    def run(number, **overrides):
        key = (number, repr(sorted(overrides.items())))
        if key not in _SMOKE_RUNS:
            ch = runner.find_chapter(number)
            out = _smoke_dir / str(len(_SMOKE_RUNS)) / f"{ch.slug}.ipynb"
            out.parent.mkdir()
            before = os.environ.get(UNTRAINED)
            os.environ[UNTRAINED] = "1"
            try:
                _SMOKE_RUNS[key] = runner.run_chapter(ch, overrides, output=out, smoke=True, log=lambda *_: None)
            finally:
                if before is None:
                    os.environ.pop(UNTRAINED, None)
                else:
                    os.environ[UNTRAINED] = before
        r = _SMOKE_RUNS[key]
        assert not r.error, f"{r.error} (partial notebook: {r.output})"
        assert r.claims.get("claims"), "the chapter recorded no claims"
        assert r.claims["enforced"] is False
        return r

    return run


# A synthetic chapter for the runner and sweep tests: parameters reach the notebook, a cell can
# fail on demand, a claim with a null and a not-attempted claim are recorded.
SYNTHETIC_CHAPTER = front_matter('a synthetic chapter for the runner tests', 'smoke: {n: 2}', 'paper: {n: 100}') + """

# 98. Synthetic

```{code-cell} ipython3
:tags: [parameters]
n = 10  # a count
fail_at = ""  # "cell" to raise in a cell, "glue" to glue a numpy scalar
seed = 0  # random seed
device = "auto"  # device
enforce_claims = True  # raise when a claim fails
```

```{code-cell} ipython3
from iclnb.bookkit.claims import Claims
claims = Claims("98_synthetic", enforce=enforce_claims)
if fail_at == "cell":
    raise RuntimeError("boom")
import numpy as np
from myst_nb import glue
glue("n_half", np.float64(n / 2) if fail_at == "glue" else n / 2, display=False)
claims.check("n-min", "n is at least 5", n, ">=", 5, null="n of 2", null_value=2,
             null_kind="competitor", basis="paper", paper=5)
claims.not_attempted("n-rate", "a rate in n", "no sweep in this chapter", ref="Thm 9")
```

```{code-cell} ipython3
claims.finish()
```
"""


@pytest.fixture
def chapter(tmp_path):
    """The synthetic chapter 98, written to ``tmp_path``."""
    return write_chapter(tmp_path, "98_synthetic", SYNTHETIC_CHAPTER)
