"""Shared test fixtures: an isolated run cache (for the session, or fresh for one test), and smoke
runs of chapters through papermill."""

import os

import pytest

from iclnb import runner


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


@pytest.fixture
def smoke_run(tmp_path):
    """``smoke_run(number, **overrides)``: execute a chapter with its smoke parameters into
    ``tmp_path``; assert it ran without error and wrote its claims; return the ``Result``."""

    def run(number, **overrides):
        ch = runner.find_chapter(number)
        r = runner.run_chapter(ch, overrides, output=tmp_path / f"{ch.slug}.ipynb", smoke=True, log=lambda *_: None)
        assert not r.error, f"{r.error} (partial notebook: {r.output})"
        assert r.claims.get("claims"), "the chapter recorded no claims"
        assert r.claims["enforced"] is False
        return r

    return run
