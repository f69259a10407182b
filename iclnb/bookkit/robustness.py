"""Pass rates over seeds: a chapter run at each of several seeds at its defaults, claims not
enforced, and one small record of every claim's value and verdict at each seed.

``iclnb robustness CH --seeds 0 1 2 3 4 [--jobs N] [--scheduler ADDRESS] [--out DIR]`` calls
:func:`robustness`: a sweep (:mod:`iclnb.bookkit.sweep`) of the chapter's ``seed`` parameter with
``enforce_claims`` off (a failing claim is recorded, not raised) and every other parameter at its
default. The runs go under ``DIR`` (default ``sweeps/robustness/NN_name``; a second call skips the
seeds already run from the same chapter source). The record goes to
``book/robustness/NN_name.json``, committed with the book::

    {"chapter": "NN_name", "seeds": [0, 1, 2, 3, 4],
     "commit": "<git HEAD>", or "<git HEAD>-dirty" when the chapter source or iclnb/ differ from it,
     "source_sha256": "<SHA-256 of notebooks/NN_name.md>", "device": "<in words>",
     "date": "<ISO 8601, UTC>", "params": {<every other parameter, as the runs had it>},
     "claims": {"<id>": {"kind": ..., "group": ..., "values": [...], "rivals": [...], "thresholds": [...],
                         "passed": [...], "null_passed": [...], "holds": [...], "status": [...]}},
     "errors": {"<seed>": "<the failing cell and why>"}}

Each list of a claim has one entry per seed, in the order of ``seeds`` (``None`` where that
seed's run recorded no such claim, e.g. it failed before), taken from the run's claims JSON
(:meth:`iclnb.bookkit.claims.Claims.to_dict`): ``rivals``, the rival's (the null's) value;
``thresholds``, the threshold the seed's run compared both with; ``passed``, the value meets the threshold;
``null_passed``, the null's value meets it too; ``holds``, the verdict (:func:`holds`,
:func:`pass_rate`). :mod:`iclnb.bookkit.records` reads the records: :func:`robustness_record`, and
:func:`is_stale` says whether the chapter's source changed since a record was written.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path

from iclnb.bookkit import runner, sweep
from iclnb.bookkit.records import PAPER_RECORDS, RECORDS, source_sha256, summary, training_speed
from iclnb.contract import ROOT

SEEDS = (0, 1, 2, 3, 4)
ENFORCE = "enforce_claims"  # the parameter every chapter has: raise when a claim fails
# a claim's per-seed lists in a record, and the field of the claims JSON each is taken from
LISTS = {"values": "value", "rivals": "null_value", "thresholds": "threshold", "passed": "passed",
         "null_passed": "null_passed", "holds": "holds", "status": "status"}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit(*paths: Path) -> str:
    """The repository's HEAD commit, with ``-dirty`` when one of ``paths`` (those inside the
    repository) differs from it, untracked files included; ``"unknown"`` without git."""
    head = _git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    inside = [str(p) for p in paths if Path(p).resolve().is_relative_to(ROOT)]
    dirty = inside and _git("status", "--porcelain", "--", *inside)
    return head + ("-dirty" if dirty else "")


def _claims(records: list[dict]) -> dict:
    """Per claim id (in order of first appearance), its kind, group and per-seed lists."""
    out = {}
    for i, rec in enumerate(records):
        for c in (rec.get("claims") or {}).get("claims", []):
            entry = out.setdefault(c["id"], {"kind": c.get("kind"), "group": c.get("group"),
                                             **{k: [None] * len(records) for k in LISTS}})
            for key, field in LISTS.items():
                entry[key][i] = c.get(field)
    return out


def make_record(chapter: runner.Chapter, seeds: list[int], records: list[dict], params: dict,
                preset: str | None = None) -> dict:
    """The robustness record of ``records`` (the sweep's, one per seed, in the order of ``seeds``);
    with ``preset`` also the preset and, per seed, the run's wall time and training speed."""
    devices = sorted({r["device"] for r in records if r.get("device")})
    # the source the seeds ran on (each run records its own): an edit during the runs, or runs of
    # different sources, make the record stale at once
    sources = {r.get("source_sha256") for r in records} - {None}
    source = sources.pop() if len(sources) == 1 else ("mixed" if sources else source_sha256(chapter.path))
    record = {"chapter": chapter.slug, "seeds": list(seeds), "commit": commit(chapter.path, ROOT / "iclnb"),
              "source_sha256": source, "device": "; ".join(devices) or "unknown",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "params": params, "claims": _claims(records),
              "errors": {str(s): r["error"] for s, r in zip(seeds, records) if r.get("error")}}
    if preset:
        record["preset"] = preset
        if preset == "paper":  # what the page calls it: "paper scale", or the chapter's own name for it
            record["scale"] = str(chapter.meta.get("paper_scale") or "paper scale")
        record["wall_seconds"] = [r.get("seconds") for r in records]
        record["training"] = [training_speed(r.get("runs") or []) for r in records]
    return record


def dumps(record: dict) -> str:
    """The record as JSON, one line per list of plain values (a claim's per-seed lists)."""
    text = json.dumps(record, indent=1, default=str)
    # a newline is never inside a JSON string: only the layout between a list's items changes
    flat = re.sub(r"\[\n\s*([^\[\]{}]*?)\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text)
    return flat + "\n"


def robustness(chapter_spec, seeds=SEEDS, jobs: int | None = None, scheduler: str | None = None,
               out: str | os.PathLike | None = None, log=print, records: str | os.PathLike | None = None,
               preset: str | None = None) -> dict:
    """Run the chapter at each of ``seeds`` (see the module's docstring), write its record into
    ``records`` and return it. Failing claims and failing runs are recorded, never raised.

    ``preset="paper"``: every run starts from the chapter's paper preset instead of its defaults,
    the runs go under ``sweeps/paper/NN_name`` and the record (the paper-scale record, with each
    seed's wall time and training speed) into ``book/paper/`` unless ``out``/``records`` say."""
    chapter = sweep._chapter(chapter_spec)
    defaults = {p.name: p.default for p in chapter.parameters()}
    missing = [name for name in ("seed", ENFORCE) if name not in defaults]
    if missing:
        raise runner.ParameterError(f"chapter {chapter.number} has no parameter {' or '.join(missing)}: "
                                    "a robustness run sets its seed and turns its claims' enforcement off")
    seeds = list(seeds)
    if not seeds or len(set(map(str, seeds))) != len(seeds):
        raise runner.ParameterError(f"seeds {seeds}: give one or more seeds, none twice")
    if preset is not None and preset not in chapter.presets:
        raise runner.ParameterError(f"chapter {chapter.number} declares no {preset!r} preset "
                                    f"(it has: {', '.join(chapter.presets) or 'none'})")
    records = records or (PAPER_RECORDS if preset == "paper" else RECORDS)
    out = Path(out or Path("sweeps") / ("paper" if preset == "paper" else "robustness") / chapter.slug)
    res = sweep.sweep(chapter, {"seed": seeds}, jobs=jobs, out=out, scheduler=scheduler, log=log,
                      fixed={ENFORCE: False}, preset=preset)
    seeds = [r["params"]["seed"] for r in res.records]  # as the chapter's parameters cell types them
    params = {k: v for k, v in (defaults | (chapter.presets.get(preset) or {})).items() if k != "seed"}
    params |= {ENFORCE: False}
    record = make_record(chapter, seeds, res.records, params, preset)
    path = Path(records) / f"{chapter.slug}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(dumps(record))
    os.replace(tmp, path)
    log(f"{'paper-scale' if preset == 'paper' else 'robustness'} record of chapter {chapter.number}: {path}")
    for line in summary(record):
        log(line)
    return record

