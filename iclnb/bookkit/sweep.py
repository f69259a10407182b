"""Parameter sweeps of a chapter: the Cartesian product of parameter values, each one papermill
execution of the chapter into its own notebook, collected into one tidy table.

``iclnb sweep CH -p NAME V1 V2 ... [-p NAME2 ...] [--preset smoke|paper] [--jobs N] [--out DIR]
[--scheduler ADDRESS]`` calls :func:`sweep`. Every name and value is checked against the
chapter's parameters cell before anything runs. Each run writes, under ``DIR``:

* ``<run>.ipynb``: the executed notebook (the partial one when a cell failed), and
  ``<run>.claims.json`` beside it;
* ``<run>.json``: the run's record (parameters, wall time, error naming the failing cell, the
  claims, the SHA-256 of the chapter source it ran, the device in words, the host), written last
  and atomically: its presence marks a finished run.

A second call skips the runs finished from the same chapter source (resume after an
interruption) and runs again the ones that failed or ran an older source. When every run is
done, ``sweep.csv`` (and ``sweep.parquet`` when pyarrow is installed) holds one row per run and
claim: the run's parameters as columns, the claim's id, kind, value, threshold, null value and
status. Reported numbers are claims too, so a chapter's recorded
metrics (a learned window, a recovery error) are in the table beside the checks.

Executors: a local process pool by default (``jobs`` workers, each training with
``cpu_count // jobs`` threads, and drawing training data ahead in a second thread only where
``cpu_count >= 2 jobs``: ``iclnb.engine.util.prefetch_enabled``), or a Dask distributed cluster
(``scheduler`` = its address, e.g. ``tcp://host:8786``; needs the ``dask`` extra). Dask workers
must see the same files (the repository with the chapters, the output folder) and should run one
task at a time (``--nthreads 1``); to share trained runs between workers, point them at one run
cache on a shared file system (``ICLNB_CACHE_DIR``): its entries are written atomically and each is trained once
under a lock (see ``iclnb.engine.train``). HPC batch systems are reached the same way through
dask-jobqueue (e.g. a ``SLURMCluster``'s scheduler address).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from iclnb.bookkit import runner
from iclnb.bookkit.plotting import use_style
from iclnb.bookkit.progress import clock
from iclnb.bookkit.records import source_sha256


@dataclass(frozen=True)
class Run:
    """One point of the sweep: its parameters and where its files go."""

    params: dict
    name: str  # file stem under the output folder, e.g. "L=1.0_sigma=0.1"

    def record_path(self, out: Path) -> Path:
        return out / f"{self.name}.json"


def _slug(value) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", json.dumps(value) if not isinstance(value, str) else value).strip("-")


def run_name(params: dict) -> str:
    """A readable, unique file stem for a parameter point (a hash when it grows long)."""
    name = "_".join(f"{k}={_slug(v)}" for k, v in params.items()) or "defaults"
    if len(name) > 80:
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
        name = name[:60].rstrip("_-=") + "_" + digest
    return name


def plan(chapter: runner.Chapter, grid: dict, preset: str | None = None, fixed: dict | None = None) -> list[Run]:
    """The runs of the Cartesian product of ``grid`` (name -> list of values), each also with the
    ``fixed`` parameters (the same in every run, left out of the run names), every name and value
    checked against the chapter's parameters first (``runner.ParameterError`` lists the valid
    ones)."""
    fixed = runner.resolve_parameters(chapter, dict(fixed or {}))
    both = set(fixed) & set(grid or {})
    if both:
        raise runner.ParameterError(f"parameter(s) {sorted(both)} are both swept and fixed")
    if not isinstance(grid, dict) or not grid:
        raise runner.ParameterError("a sweep needs at least one parameter with values (-p NAME V1 V2 ...)")
    for name, values in grid.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise runner.ParameterError(f"parameter {name!r} needs at least one value")
    if preset and preset not in chapter.presets:
        raise runner.ParameterError(f"chapter {chapter.number} has no preset {preset!r}; "
                                    f"it declares: {', '.join(chapter.presets) or 'none'}")
    checked = {name: [runner.resolve_parameters(chapter, {name: v})[name] for v in values]
               for name, values in grid.items()}
    runs = [dict(zip(checked, combo)) for combo in itertools.product(*checked.values())]
    names = [run_name(p) for p in runs]
    if len(set(names)) != len(names):
        raise runner.ParameterError("two sweep points have the same parameters (a value is repeated)")
    return [Run({**fixed, **p}, n) for p, n in zip(runs, names)]


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _chapter(spec) -> runner.Chapter:
    return spec if isinstance(spec, runner.Chapter) else runner.find_chapter(spec)


def execute(chapter: runner.Chapter, params: dict, preset: str | None, out: str, name: str,
            threads: int | None = None, prefetch: bool | None = None) -> dict:
    """Run one sweep point (in a worker process or on a Dask worker) and write its record.
    ``threads``/``prefetch`` set the worker's ``$ICLNB_THREADS``/``$ICLNB_PREFETCH`` (None: as it is)."""
    if threads:
        os.environ["ICLNB_THREADS"] = str(threads)
    if prefetch is not None:
        os.environ["ICLNB_PREFETCH"] = "1" if prefetch else "0"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source = source_sha256(chapter.path)
    r = runner.run_chapter(chapter, params, output=out / f"{name}.ipynb", preset=preset, log=lambda *_: None,
                           progress=False, warn=lambda m: None)  # the parent's progress line reports retries
    device = r.parameters["device"] if "device" in r.parameters else (
        {p.name: p.default for p in chapter.parameters()}.get("device"))  # the defaults parsed only when needed
    record = {"name": name, "chapter": chapter.slug, "params": params, "preset": preset or "",
              "seconds": round(r.seconds, 2), "error": r.error, "ok": r.ok, "claims": r.claims,
              "notebook": str(r.output), "host": os.uname().nodename, "source_sha256": source,
              "device": "" if device is None else runner.device_words(device), "kernel_retries": r.kernel_retries,
              "runs": r.runs}
    _write_json(out / f"{name}.json", record)
    return record


def _finished(path: Path, source: str) -> dict | None:
    """The record of a run that executed (its claims may have failed), or None: absent, unreadable,
    errored, or of another version of the chapter's source (``source``: its SHA-256); those are
    run again."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return None if record.get("error") or record.get("source_sha256") != source else record


def table_rows(records: list[dict]) -> list[dict]:
    """One row per run and claim (runs without claims get one row)."""
    names = sorted({k for r in records for k in r["params"]}, key=lambda k: next(
        i for i, r in enumerate(records) if k in r["params"]))
    rows = []
    for r in records:
        base = {**{k: r["params"].get(k) for k in names}, "run": r["name"], "ok": r["ok"],
                "seconds": r["seconds"], "error": r["error"]}
        claims = r.get("claims", {}).get("claims", [])
        for c in claims:
            rows.append({**base, "claim": c["id"], "kind": c["kind"], "value": c["value"],
                         "condition": c["condition"], "null_value": c.get("null_value"), "status": c["status"]})
        if not claims:
            rows.append({**base, "claim": "", "kind": "", "value": None, "condition": "", "null_value": None,
                         "status": ""})
    return rows


def _cell(v):
    """A table cell: lists and dicts (a list parameter, a list value) as JSON text."""
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def write_table(rows: list[dict], out: Path) -> list[Path]:
    """``sweep.csv``, and ``sweep.parquet`` when pyarrow is installed."""
    paths = []
    if not rows:
        return paths
    csv_path = out / "sweep.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: _cell(v) for k, v in row.items()})
    paths.append(csv_path)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return paths
    # a claim's value is a number, a boolean or a list: one JSON text column, as in the CSV
    cols = {k: [json.dumps(r[k]) if k in ("value", "null_value") else _cell(r[k]) for r in rows] for k in rows[0]}
    pq.write_table(pa.table(cols), out / "sweep.parquet")
    paths.append(out / "sweep.parquet")
    return paths


@dataclass
class SweepResult:
    records: list[dict]
    table: list[Path]
    out: Path

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.records if r.get("error")]

    @property
    def ok(self) -> bool:
        return not self.failed


def _local_executor(jobs: int):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
    return pool, pool.submit, as_completed, pool.shutdown


def _dask_executor(address: str):
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise runner.ParameterError("--scheduler needs Dask: pip install 'iclnb[dask]' "
                                    "(dask and distributed)") from None
    client = Client(address)

    def submit(fn, *args):
        return client.submit(fn, *args, pure=False)

    return client, submit, as_completed, lambda: client.close()


def _state(rec: dict) -> str:
    """A finished run in words: failed (its error), claims not enforced, ok, or claims failed."""
    claims = rec.get("claims") or {}
    if rec["error"]:
        return "FAILED: " + rec["error"]
    if claims and not claims.get("enforced"):
        return f"claims not enforced ({claims.get('failed', 0)} would fail)"
    return "ok" if rec["ok"] else f"claims failed ({claims.get('failed', 0)})"


def sweep(chapter_spec: str | int | runner.Chapter, grid: dict, preset: str | None = None, jobs: int | None = None,
          out: str | os.PathLike | None = None, scheduler: str | None = None, log=print,
          fixed: dict | None = None) -> SweepResult:
    """Run the sweep (see the module's docstring); returns the records and the table's paths.
    ``fixed``: parameters set in every run (not swept).

    A failed run is reported with its failing cell and does not stop the others; finished runs of
    an earlier call are skipped.
    """
    chapter = _chapter(chapter_spec)
    runs = plan(chapter, grid, preset, fixed)
    out = Path(out or Path("sweeps") / chapter.slug).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    jobs = max(1, min(int(jobs or cores), len(runs)))
    # $ICLNB_THREADS / $ICLNB_PREFETCH, where set, win (two sweeps side by side, one core each)
    threads = int(os.environ["ICLNB_THREADS"]) if os.environ.get("ICLNB_THREADS", "").isdigit() \
        else max(1, cores // jobs)
    prefetch = os.environ["ICLNB_PREFETCH"] == "1" if os.environ.get("ICLNB_PREFETCH") in ("0", "1") \
        else cores >= 2 * jobs  # a data-drawing thread per worker only where a core is spare for it
    source = source_sha256(chapter.path)
    records = {r.name: rec for r in runs if (rec := _finished(r.record_path(out), source)) is not None}
    todo = [r for r in runs if r.name not in records]
    where = f"Dask cluster {scheduler}" if scheduler else f"{jobs} local worker(s), {threads} thread(s) each"
    log(f"sweep of chapter {chapter.number} ({chapter.slug}): {len(runs)} runs, {len(records)} already done, "
        f"{len(todo)} to run on {where}; output in {out}")
    start = time.perf_counter()
    failed = 0
    if todo:
        handle, submit, as_completed, close = _dask_executor(scheduler) if scheduler else _local_executor(jobs)
        try:
            futures = {submit(execute, chapter, r.params, preset, str(out), r.name,
                              *((None, None) if scheduler else (threads, prefetch))): r for r in todo}
            for i, fut in enumerate(as_completed(futures), 1):
                r = futures[fut]
                try:
                    rec = fut.result()
                except Exception as e:  # noqa: BLE001 - a worker that died: record it, go on
                    rec = {"name": r.name, "params": r.params, "preset": preset or "", "seconds": 0.0, "ok": False,
                           "error": f"the worker failed: {type(e).__name__}: {e}", "claims": {}}
                    _write_json(r.record_path(out), rec)
                records[r.name] = rec
                failed += bool(rec["error"])
                retried = len(rec.get("kernel_retries") or [])
                log(f"[{clock(time.perf_counter() - start)}] {i}/{len(todo)} done, {failed} failed, "
                    f"{len(todo) - i} remaining: {r.name} {_state(rec)} ({rec['seconds']:.0f} s"
                    + (f"; its kernel failed to start {retried} time(s) and was started again)" if retried else ")"))
        finally:
            close()
    ordered = [records[r.name] for r in runs]
    table = write_table(table_rows(ordered), out)
    log(f"sweep finished: {len(ordered) - failed} of {len(ordered)} runs without error"
        + (f"; table {table[0]}" if table else ""))
    return SweepResult(ordered, table, out)


def read_table(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``sweep.csv`` with numbers parsed back."""
    def parse(v: str):
        try:
            return json.loads(v)
        except ValueError:
            return v

    with open(path, newline="") as f:
        return [{k: parse(v) if v != "" else None for k, v in row.items()} for row in csv.DictReader(f)]


def plot_metric(table, claim: str, x: str, by: str | None = None, ax=None, logx: bool = False,
                logy: bool = False):
    """Plot a recorded claim's value (a metric, a check's measured value) against the swept
    parameter ``x``, one line per value of ``by``; ``table``: rows or a path to ``sweep.csv``."""
    rows = read_table(table) if isinstance(table, (str, os.PathLike)) else table
    rows = [r for r in rows if r["claim"] == claim and isinstance(r["value"], (int, float))
            and not isinstance(r["value"], bool)]
    if not rows:
        raise ValueError(f"no numeric values of claim {claim!r} in the table")
    use_style()
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    groups = sorted({r.get(by) for r in rows}, key=str) if by else [None]
    for g in groups:
        pts = sorted((r[x], r["value"]) for r in rows if by is None or r.get(by) == g)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{by} = {g}" if by else None)
    ax.set_xlabel(x)
    ax.set_ylabel(claim)
    ax.set_title(f"{claim} against {x}")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if by:
        ax.legend()
    return ax
