"""Reading the records: the robustness records (a chapter at each of several seeds) and the
paper-scale records, pass rates and verdicts over seeds, the 4-of-5 rule, whether a record is
stale, and how fast a run trained. Pure data: it runs nothing (:mod:`iclnb.bookkit.robustness`
writes the records).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

from iclnb.contract import NOTEBOOKS, ROOT

RECORDS = ROOT / "book" / "robustness"
PAPER_RECORDS = ROOT / "book" / "paper"  # the paper-scale records (``--preset paper``)

ROBUST = (4, 5)  # an evidence check holding at fewer than 4 of every 5 seeds is not evidence


def source_sha256(path: Path) -> str:
    """The SHA-256 of a chapter source's bytes (a run records the source it executed)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def training_speed(runs: list[dict]) -> dict:
    """How fast a run's models trained (its ``$ICLNB_RUNS`` lines, cache hits as the original
    training): the training runs (and how many this execution loaded from the run cache), their
    steps, member-steps and seconds, and steps per second."""
    trained = [x for x in runs if not x.get("untrained") and x.get("train_seconds")]
    seconds = sum(float(x["train_seconds"]) for x in trained)
    steps = sum(int(x.get("steps", 0)) for x in trained)
    member_steps = sum(int(x.get("steps", 0)) * int(x.get("members", 1)) for x in trained)
    return {"runs": len(trained), "from_cache": sum(bool(x.get("from_cache")) for x in trained), "steps": steps,
            "member_steps": member_steps, "train_seconds": round(seconds, 1),
            "steps_per_second": round(steps / seconds, 1) if seconds else None}


def robustness_record(stem: str, records: str | os.PathLike = RECORDS) -> dict | None:
    """The robustness record of the chapter ``stem`` (e.g. ``"06_superposition"``), or None when
    there is none (or it cannot be read)."""
    try:
        record = json.loads((Path(records) / f"{stem}.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_stale(record: dict, source: str | os.PathLike | None = None) -> bool:
    """Whether the chapter's source (default ``notebooks/<chapter>.md``) changed since ``record``
    was written (or is gone): its SHA-256 differs from the record's ``source_sha256``."""
    path = Path(source) if source is not None else NOTEBOOKS / f"{record.get('chapter')}.md"
    try:
        return source_sha256(path) != record.get("source_sha256")
    except OSError:
        return True


def holds(entry: dict) -> list[bool | None]:
    """Per seed, whether a claim of a record holds (an evidence check: its value passes and its
    null fails; a sanity check: it passes), as the claims JSON said (worked out from ``passed``
    and ``null_passed`` where it did not); None for a reported number or a seed that did not
    record the claim."""
    passed = entry.get("passed") or []
    nulls, recorded = (entry.get(k) or [None] * len(passed) for k in ("null_passed", "holds"))
    return [h if h is not None else (None if p is None else bool(p) and not n)  # a JSON without "holds"
            for h, p, n in zip(recorded, passed, nulls)]


def pass_rate(entry: dict) -> tuple[int, int]:
    """(seeds at which the claim holds, seeds run): a seed whose run failed counts as not holding."""
    h = holds(entry)
    return sum(x is True for x in h), len(h)


def short_verdict(status) -> str:
    """A verdict of a record in short words: "shared" for "holds, shared with <rival>",
    "reproduced" for a declared finding that holds, "not recorded" for a seed without it."""
    if status is None:
        return "not recorded"
    words = bare_status(status)
    finding = words.endswith(" (a declared finding)")
    words = words.removesuffix(" (a declared finding)")
    if words.startswith("holds, shared with "):
        return "shared" + (" (a finding)" if finding else "")
    return "reproduced" if finding and words == "holds" else words


def verdict_counts(entry: dict) -> list[tuple[str, int]]:
    """A claim's verdicts over the seeds of a record, most frequent first, in short words
    (:func:`short_verdict`); [] for a record written before verdicts were kept."""
    short = [short_verdict(x) for x in entry.get("status") or []]
    return sorted(Counter(short).items(), key=lambda kv: -kv[1])


STRENGTH = {"holds": 0, "holds (effect only)": 0, "reproduced": 0, "shared": 1, "shared (a finding)": 1}


def seeds_verdict(entry: dict) -> tuple[str, int, int, int]:
    """A claim's verdict over the seeds of a record: the strongest verdict reached at 4 of 5 seeds
    or more, a seed with a stronger verdict counting as reaching the weaker one (holds, then
    "shared": the value passes and so does its rival; a seed whose value fails reaches neither).
    Returns (verdict in short words, seeds reaching it, seeds run, seeds with a stronger
    verdict than it). Without such a verdict: the most frequent verdict and its count, and 0."""
    short = [short_verdict(x) for x in entry.get("status") or []]
    n = len(short)
    strong = [w for w in short if STRENGTH.get(w) == 0]
    reach_shared = sum(STRENGTH.get(w, 2) <= 1 for w in short)
    if strong and robust(len(strong), n):
        return Counter(strong).most_common(1)[0][0], len(strong), n, 0
    if reach_shared and robust(reach_shared, n):
        finding = any(w.endswith("(a finding)") or w == "reproduced" for w in short)
        return "shared (a finding)" if finding else "shared", reach_shared, n, len(strong)
    counts = verdict_counts(entry)
    return (counts[0][0], counts[0][1], n, 0) if counts else ("not recorded", 0, n, 0)


def summary(record: dict) -> list[str]:
    """The record in words: each claim's verdicts over the seeds (its pass rate where the record
    keeps none), and the evidence checks with no verdict at 4 of 5 seeds or more."""
    lines, weak = [], []
    for cid, e in record["claims"].items():
        if e.get("kind") not in ("check", "finding", "sanity"):
            continue
        k, n = pass_rate(e)
        counts = verdict_counts(e)
        words = "; ".join(f"{v} at {c}" for v, c in counts) if counts else f"holds at {k}"
        verdict = seeds_verdict(e) if counts else None
        over = f" -> {verdict[0]} at {verdict[1]} of {n}" if verdict and robust(verdict[1], n) else ""
        lines.append(f"  {cid:32s} {e['kind']:8s} {words} of {n} seeds{over}")
        if e.get("kind") == "check" and not robust(verdict[1] if verdict else k, n):
            weak.append(cid)
    if weak:
        lines.append(f"  evidence checks with no verdict at 80% of the seeds or more: {', '.join(weak)}")
    lines += [f"  seed {s} failed: {err}" for s, err in record.get("errors", {}).items()]
    return lines


def records_of(stems: list[str], paper: bool = False) -> dict:
    """stem -> (robustness record or None, stale); with ``paper``, the paper-scale records
    (``book/paper/``)."""
    out = {}
    for s in stems:
        rec = robustness_record(s, PAPER_RECORDS if paper else RECORDS)
        out[s] = (rec, bool(rec) and bool(is_stale(rec)))
    return out


def seed_passes(rec: dict | None, cid: str) -> tuple[int, int] | None:
    """(seeds at which the claim holds, seeds run) from a robustness record; None when the record
    or the claim is missing. A seed holds when its value passes and its null does not; a seed the
    record has no verdict for counts as not holding."""
    c = (rec or {}).get("claims", {}).get(cid)
    if c is None:
        return None
    passed = list(c.get("passed") or [])
    nulls = list(c.get("null_passed") or []) + [None] * len(passed)
    n = len(rec.get("seeds") or passed)
    return sum(bool(p) and not q for p, q in zip(passed, nulls)), n


def robust(k: int, n: int) -> bool:
    """Whether holding at ``k`` of ``n`` seeds is evidence (at least 4 of every 5)."""
    return n > 0 and ROBUST[1] * k >= ROBUST[0] * n


def bare_status(status) -> str:
    """A verdict without "(not enforced)", in today's words (records of 2026-11-27 before 381494d
    said "(declared a finding: its declaration is out of date)" for "(a declared finding)")."""
    return (str(status).replace(" (not enforced)", "")
            .replace(" (declared a finding: its declaration is out of date)", " (a declared finding)"))


def training_summary(runs: list[dict]) -> dict:
    """What a chapter's wall time measured: its training runs (``$ICLNB_RUNS`` lines) split into the
    ones trained now and the ones loaded from the run cache.

    ``steps_per_second``: training steps per second of the runs trained now (None when none
    trained); ``cached_runs`` of ``runs`` came from the cache, carrying ``cached_share`` of the
    training seconds (a hit counts its original training's seconds): 0 on a cold cache, 1 when
    nothing trained. Untrained runs (``ICLNB_UNTRAINED``) count for neither."""
    real = [x for x in runs if not x.get("untrained")]
    fresh = [x for x in real if not x.get("from_cache")]
    hits = [x for x in real if x.get("from_cache")]
    now = training_speed(fresh)
    cached_seconds = sum(float(x.get("train_seconds") or 0.0) for x in hits)
    total = now["train_seconds"] + cached_seconds
    return {"runs": len(real), "trained_runs": len(fresh), "cached_runs": len(hits),
            "steps": now["steps"], "train_seconds": now["train_seconds"],
            "steps_per_second": now["steps_per_second"], "cached_seconds": round(cached_seconds, 1),
            "cached_share": round(cached_seconds / total, 3) if total else (1.0 if hits else 0.0)}


def training_line(runs: list[dict]) -> str:
    """:func:`training_summary` in one line for a summary table: ``"20,000 steps at 99 steps/s;
    cache 0 of 3 runs (0% of training s)"``."""
    t = training_summary(runs)
    if not t["runs"]:
        return "no training runs in its kernel"
    speed = (f"{t['steps']:,} steps in {t['train_seconds']:.0f} s at {t['steps_per_second']:,.0f} steps/s"
             if t["steps_per_second"] else "nothing trained now")
    return (f"{speed}; from cache {t['cached_runs']} of {t['runs']} runs "
            f"({100 * t['cached_share']:.0f}% of training s)")
