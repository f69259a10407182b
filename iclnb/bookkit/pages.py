"""The pages a build writes about its own run: the Reproducibility page (every chapter's wall time,
parameters, device, training and claims, and the book's scorecard) and the Verdicts page (every
claim of the three papers). :mod:`iclnb.bookkit.runner` executes the chapters; this module only
writes what their results say.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from iclnb.bookkit.records import training_line
from iclnb.bookkit.runner import Result, device_words, versions
from iclnb.bookkit.scorecard import ClaimsTable, md_row, scorecard_markdown
from iclnb.bookkit.verdicts import verdicts_markdown
from iclnb.contract import ROOT

REPRO_PAGE = ROOT / "book" / "reproducibility.md"  # written by every build


VERDICTS_PAGE = ROOT / "book" / "verdicts.md"  # every claim of the papers, one row each


def _training_words(runs: list[dict]) -> str:
    """How a chapter's training runs trained, in words: CUDA graphs or eagerly, and why eagerly."""
    if not runs:
        return "It trained no model through the engine."
    graphs = [x for x in runs if x.get("training") == "cuda graphs"]
    cached = sum(bool(x.get("from_cache")) for x in runs)
    devices = ", ".join(f"`{d}`" for d in sorted({x.get("device", "?") for x in runs}))
    if all(str(x.get("device", "")).startswith("cpu") for x in runs):  # no CUDA graphs on a CPU
        text = f"Training: {len(runs)} run(s) on {devices}, eagerly (CUDA graphs exist on GPUs only)"
    else:
        text = (f"Training: {len(runs)} run(s) on {devices}, {len(graphs)} in CUDA graphs and "
                f"{len(runs) - len(graphs)} eagerly")
    notes = sorted({x["training_note"] for x in runs if x.get("training_note")})
    if notes:
        text += " (" + "; ".join(notes[:3]) + ("; ..." if len(notes) > 3 else "") + ")"
    if graphs:
        text += f"; CUDA graph capture {sum(x.get('capture_seconds', 0.0) for x in graphs):.1f} s in all"
    if cached:
        text += f"; {cached} loaded from the run cache (as the original run trained)"
    if any("train_seconds" in x for x in runs):  # the $ICLNB_RUNS lines say how long training took
        text += f"; {training_line(runs)}"
    return text + "."


def _scorecard(results: list[Result]) -> list[str]:
    """The book's scorecard (:func:`iclnb.bookkit.scorecard.scorecard_markdown`): per chapter and in
    total, evidence strong / weak, sanity, findings by when they were declared, reports, claims not
    attempted, and each evidence check's pass rate over seeds from its robustness record."""
    return [""] + scorecard_markdown([(r.chapter.title, r.chapter.slug, r.claims) for r in results if r.claims])


def write_reproducibility_page(results: list[Result], smoke: bool = False) -> Path:
    """The book's "Reproducibility" page: every chapter's claims, parameters, wall time, versions."""
    v = versions()
    lines = ["# Reproducibility", "",
             "This page is written by `iclnb book` when it executes the chapters; it is the record of "
             "the run that produced this copy of the book.", ""]
    if smoke:
        lines += ["```{warning}", "This build ran every chapter with its tiny **smoke** parameters: "
                  "the claims were recorded but not enforced, and the numbers are not meaningful.", "```", ""]
    lines += [f"Built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with iclnb {v['iclnb']}, "
              f"torch {v['torch']}, numpy {v['numpy']}, Python {v['python']} on `{v['platform']}` "
              f"(CUDA available: {v['cuda']}).", "",
              "| chapter | wall time (s) | training | claims failed (enforced) | status |",
              "| --- | ---: | --- | ---: | --- |"]
    for r in results:
        lines.append(f"| {r.chapter.title} | {r.seconds:.1f} | {training_line(r.runs)} | {r.claims_failed} | "
                     f"{r.status} |")
    lines += ["", "The verdicts of every chapter's claims are counted in the scorecard below and listed by paper "
              "on the [Verdicts](verdicts.md) page."]
    lines += _scorecard(results)
    for r in results:
        full = {p.name: p.default for p in r.chapter.parameters()} | r.parameters
        changed = ", ".join(r.parameters) or "none (defaults)"
        preset = f"the **{r.preset}** preset" if r.preset else "its defaults"
        lines += ["", f"## {r.chapter.title}", "",
                  f"Ran with {preset} on device `{full.get('device', 'n/a')}`, that is "
                  f"{device_words(full.get('device', 'auto'))}. {_training_words(r.runs)} "
                  f"Parameters (changed from the defaults: {changed}):", "", "```json", json.dumps(full, indent=1),
                  "```", ""]
        if r.error:
            lines += [f"**Error:** {r.error}", ""]
        rows = r.claims.get("claims", [])
        if rows:
            table = ClaimsTable(rows)  # the chapter's own columns; the scorecard above has the seeds
            lines += [md_row(table.HEADERS), "|" + " --- |" * len(table.HEADERS)]
            lines += [md_row(table._cells(c)) for c in rows]
    REPRO_PAGE.write_text("\n".join(lines) + "\n")
    return REPRO_PAGE


def write_verdicts_page(results: list[Result]) -> Path:
    """The book's "Verdicts" page (:func:`iclnb.bookkit.scorecard.verdicts_markdown`): every claim
    of the three papers, grouped by paper and chapter, with its verdict, rival, pass rate over seeds
    and paper-scale verdict; the first page after the introduction."""
    chapters = [(r.chapter.number, r.chapter.title, r.chapter.slug, r.claims) for r in results if r.claims]
    VERDICTS_PAGE.write_text("\n".join(verdicts_markdown(chapters)) + "\n")
    return VERDICTS_PAGE
