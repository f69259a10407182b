"""Sweeps: a 2 x 2 grid, resume, a failing run among passing ones, bad parameters, the Dask path
on a local cluster, and two workers training one cache entry at once."""

import json
import multiprocessing as mp

import pytest

from iclnb.bookkit import records, runner, sweep
from iclnb.bookkit.cli import main

pytestmark = pytest.mark.multiprocess


def test_a_2x2_sweep_collects_one_table(chapter, tmp_path):
    out = tmp_path / "sw"
    lines = []
    res = sweep.sweep(chapter, {"n": [5, 7], "seed": [0, 1]}, jobs=2, out=out, log=lines.append,
                      fixed={"device": "cpu"})
    assert all(r["params"]["device"] == "cpu" for r in res.records)
    assert res.ok and len(res.records) == 4 and all(r["ok"] for r in res.records)
    assert sorted(p.name for p in out.glob("*.ipynb")) == ["n=5_seed=0.ipynb", "n=5_seed=1.ipynb",
                                                          "n=7_seed=0.ipynb", "n=7_seed=1.ipynb"]
    rows = sweep.read_table(out / "sweep.csv")
    n_min = [r for r in rows if r["claim"] == "n-min"]
    assert sorted((r["n"], r["seed"], r["value"], r["status"]) for r in n_min) == [
        (5, 0, 5, "pass"), (5, 1, 5, "pass"), (7, 0, 7, "pass"), (7, 1, 7, "pass")]
    assert {r["claim"] for r in rows} == {"n-min", "n-rate"}  # every recorded claim, not just the checks
    assert "4 runs, 0 already done, 4 to run" in lines[0] and "remaining" in lines[1]
    ax = sweep.plot_metric(out / "sweep.csv", "n-min", "n", by="seed")
    assert ax.get_xlabel() == "n" and len(ax.lines) == 2


def test_resume_and_a_failing_run(chapter, tmp_path):
    out = tmp_path / "sw"
    res = sweep.sweep(chapter, {"fail_at": ["", "cell"]}, jobs=1, out=out, log=lambda *_: None)
    assert not res.ok and [r["name"] for r in res.failed] == ["fail_at=cell"]
    assert "RuntimeError: boom" in res.failed[0]["error"] and "cell" in res.failed[0]["error"]
    assert (out / "fail_at=cell.ipynb").exists()  # the partial notebook is kept
    ok_record = out / "fail_at=.json"
    stamp = ok_record.stat().st_mtime_ns
    lines = []
    again = sweep.sweep(chapter, {"fail_at": ["", "cell"]}, jobs=1, out=out, log=lines.append)
    assert "1 already done, 1 to run" in lines[0]  # the finished run is skipped, the failed one retried
    assert ok_record.stat().st_mtime_ns == stamp and len(again.records) == 2
    # a run of another version of the chapter's source is not resumed: it runs again
    assert json.loads(ok_record.read_text())["source_sha256"] == records.source_sha256(chapter.path)
    chapter.path.write_text(chapter.path.read_text().replace("n = 10  # a count", "n = 11  # a count"))
    lines.clear()
    sweep.sweep(chapter, {"fail_at": [""]}, jobs=1, out=out, log=lines.append)
    assert "1 runs, 0 already done, 1 to run" in lines[0] and ok_record.stat().st_mtime_ns != stamp


def test_bad_names_and_values_fail_before_anything_runs(chapter, tmp_path):
    with pytest.raises(runner.ParameterError, match="no parameter 'm'.*Valid parameters"):
        sweep.sweep(chapter, {"n": [1], "m": [2]}, out=tmp_path / "a")
    with pytest.raises(runner.ParameterError, match="expected int"):
        sweep.sweep(chapter, {"n": [1, "x"]}, out=tmp_path / "b")
    with pytest.raises(runner.ParameterError, match="both swept and fixed"):
        sweep.sweep(chapter, {"n": [1]}, fixed={"n": 2}, out=tmp_path / "e")
    with pytest.raises(runner.ParameterError, match="no parameter 'q'"):
        sweep.sweep(chapter, {"n": [1]}, fixed={"q": 2}, out=tmp_path / "e")
    with pytest.raises(runner.ParameterError, match="at least one value"):
        sweep.sweep(chapter, {"n": []}, out=tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["sweep", "4", "-p", "no_such_param", "1", "2", "--out", str(tmp_path / "d")]) == 2


def test_the_dask_path_on_a_local_cluster(chapter, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        res = sweep.sweep(chapter, {"n": [5, 6]}, out=tmp_path / "sw", scheduler=c.scheduler_address,
                          log=lambda *_: None)
    assert res.ok and [r["params"]["n"] for r in res.records] == [5, 6]
    assert all(r["host"] for r in res.records) and (tmp_path / "sw" / "sweep.csv").exists()


def _train_tiny(cache, out):
    import os

    os.environ["ICLNB_CACHE_DIR"] = cache
    from iclnb.engine.train import TrainConfig, train

    run = train(TrainConfig(heads=(1,), d=2, n=4, steps=300, batch=16, log_every=50, device="cpu"), progress=False)
    json.dump({"from_cache": run.from_cache, "flat": run.model.flat.tolist()}, open(out, "w"))


def test_two_workers_on_one_cache_entry(tmp_path):
    """Two processes that need the same config at once: one trains, the other waits for the entry
    and loads it; the entry is whole and both hold the same parameters."""
    cache = str(tmp_path / "cache")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_train_tiny, args=(cache, str(tmp_path / f"{i}.json"))) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert sorted(r["from_cache"] for r in results) == [False, True]
    assert results[0]["flat"] == results[1]["flat"]
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1
