"""What a reader sees first of each verdict: the verdict box that ends a chapter's section, the
paper-scale record in words, and the book's Verdicts page (every claim of the three papers, one
row each). Built on the scorecard's cells and the records (:mod:`iclnb.bookkit.records`)."""

from __future__ import annotations

import html

from iclnb.bookkit import records
from iclnb.bookkit.claimspec import chapter_source, fmt, front_matter, load_spec
from iclnb.bookkit.scorecard import (
    basis_words,
    condition_cell,
    declaration_words,
    is_own,
    md_row,
    paper_heading,
    paper_scale_cell,
    seeds_cell,
)


def minutes(seconds) -> str:
    m = round((seconds or 0) / 60)
    return f"{m} minute{'' if m == 1 else 's'}"


def run_time_words(rec: dict) -> str:
    """How long a record's runs took, in words: per seed, the training of its models (the original
    training where this execution loaded them from the run cache) and this execution's wall time."""
    parts, seeds = [], rec.get("seeds") or []
    for i, (wall, t) in enumerate(zip(rec.get("wall_seconds") or [], rec.get("training") or [])):
        train, speed, cached = t.get("train_seconds") or 0, t.get("steps_per_second"), t.get("from_cache") or 0
        words = f"its models trained for {minutes(train)}" + (f" at {speed:.0f} steps/s" if speed else "")
        if cached:
            words += (f", and this execution, which loaded {cached} of their {t.get('runs')} runs from the run "
                      f"cache, took {minutes(wall)}")
        else:
            words += f", in an execution of {minutes(wall)}"
        parts.append(f"at seed {seeds[i]}, {words}" if len(seeds) > 1 and i < len(seeds) else words)
    where = rec.get("device", "an unrecorded device")
    return ("; ".join(parts) or "its time was not recorded") + f"; on {where}"


def paper_scale_words(chapter: str, findings: list[str] | tuple | None = None) -> str:
    """A chapter's paper-scale record in words, for its "What reproduces" section (markdown).

    ``chapter``: its stem; ``findings``: the ids declared findings at the defaults (None: the
    chapter's ``iclnb: findings:``), so the text can say which of them hold at paper scale. Read from the
    committed record (``book/paper/<chapter>.json``); says so when there is none, and when the
    chapter's source changed since it was written (stale)."""
    rec, stale = records.records_of([chapter], paper=True)[chapter]
    if findings is None:  # the front matter's findings and the claim spec's, at the defaults
        source = chapter_source(chapter)
        findings = [] if source is None else [
            *((front_matter(source).get("iclnb") or {}).get("findings") or {}),
            *(cid for cid, sp in load_spec(source).items() if sp.finding is not None)]
    if rec is None:
        return (f"**Paper scale.** Not run yet: `iclnb robustness {chapter} --preset paper` runs the chapter's "
                "`paper` preset at seed 0 and writes its record to `book/paper/`.")
    scale = rec.get("scale") or "paper scale"
    seeds = rec.get("seeds") or []
    claims = rec.get("claims", {})

    def words(cid):  # the verdict at every seed, "(not enforced)" dropped; "mixed" where seeds differ
        found = {str(w).replace(" (not enforced)", "") for w in claims[cid].get("status") or []}
        return found.pop() if len(found) == 1 else "mixed"

    def passes(cid):  # the value passes at every seed (a plain hold, a shared or an effect-only one)
        return all(bool(p) for p in claims[cid].get("passed") or [None])

    evidence = [cid for cid, c in claims.items() if c.get("kind") in ("check", "finding")]
    now_hold = [cid for cid in findings if cid in claims and passes(cid)]
    still = [cid for cid in findings if cid in claims and not passes(cid)]
    fail = [cid for cid in evidence if cid not in findings and not passes(cid)]
    shared = [cid for cid in evidence if words(cid).startswith("holds, shared")]
    ids = lambda xs: ", ".join(f"`{x}`" for x in xs)  # noqa: E731
    name = "The paper-scale run" if scale == "paper scale" else f"The {scale}"
    text = (f"**{scale[0].upper() + scale[1:]}.** {name} (the `paper` preset, seed"
            f"{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; claims recorded, not enforced; "
            f"{rec.get('date', '?')[:10]}, commit `{str(rec.get('commit', '?'))[:7]}`): "
            f"{run_time_words(rec)}. Of its {len(evidence)} evidence claims, "
            f"{sum(passes(c) for c in evidence)} pass" + (" at every seed" if len(seeds) > 1 else "")
            + (f", {len(shared)} of them shared with their rival ({ids(shared)})" if shared else "") + ". ")
    if findings:
        text += (f"Of the {len(findings)} finding{'s' if len(findings) > 1 else ''} at the defaults, "
                 + (f"{ids(now_hold)} pass{'es' if len(now_hold) == 1 else ''} at this scale"
                    if now_hold else "none passes at this scale")
                 + (f" and {ids(still)} still do{'es' if len(still) == 1 else ''} not" if still else "") + ". ")
    text += (f"Claims that are no finding and fail at this scale: {ids(fail)}. " if fail
             else "Every other claim passes at this scale. ")
    errors = rec.get("errors") or {}
    text += "".join(f"The run at seed {s} failed: {e}. " for s, e in errors.items())
    if stale:
        text += "(This record is **stale**: the chapter's source changed since it was written.) "
    return text + "The claims table gives each claim's verdict at this scale."


class VerdictBox:
    """One claim's verdict, for the end of the section that measures it: the claim (the paper's
    words and where, or the book's own), our value, the threshold and its basis, the rival and its
    value, the verdict in words, the pass rate over seeds and the paper-scale verdict; the
    methodology (the rival's kind, the basis, the finding, each amendment with its earlier rule)
    in a collapsed block under it. ``row``: the claim's row of ``Claims.to_dict()``."""

    def __init__(self, row: dict, chapter: str | None = None, how: str = ""):
        self.row, self.how = row, how
        self.records = records.records_of([chapter])[chapter] if chapter else (None, False)
        self.paper = records.records_of([chapter], paper=True)[chapter] if chapter else (None, False)

    def lines(self) -> tuple[str, list[str], list[str]]:
        """(verdict, the box's lines, the methodology's lines), as plain text."""
        r = self.row
        whose = (f"The paper ({r.get('ref', '')}): “{r['quote']}”" if r.get("quote")
                 else "The book's own claim" + (f" ({r['ref']})" if r.get("ref") else ""))
        attempted = r.get("kind") not in ("not_attempted", "report")
        lines = [whose]
        if attempted:
            lines.append(f"Measured: {r['text']} = {fmt(r['value'])}; threshold {condition_cell(r)}")
            if r.get("null"):
                lines.append(f"Rival ({r.get('rival_kind') or r.get('null_kind', '')}): {r['null']} = "
                             f"{fmt(r.get('null_value'))}")
            lines.append(f"Over seeds at the defaults: {seeds_cell(r, *self.records).replace('**', '')}; "
                         f"{paper_heading(self.paper[0])}: {paper_scale_cell(r['id'], *self.paper)}")
        elif r.get("kind") == "report":
            lines.append(f"Reported (no verdict): {r['text']} = {fmt(r['value'])}")
        elif r.get("note"):
            lines.append(r["note"])
        how = [self.how] if self.how else []
        if r.get("question"):
            meaning = {"effect": "is the structure there? its rival is a chance level",
                       "mechanism": "is it the claimed mechanism rather than a simpler one? its rival could pass"}
            how.append(f"Question: {r['question']}" + (f" ({meaning[r['question']]})" if r["question"] in meaning
                                                        else ""))
        if basis_words(r):
            how.append(f"Threshold's basis: {basis_words(r)}")
        if r.get("kind") == "finding":
            how.append(f"Finding, {declaration_words(r.get('declared', ''), r.get('commit', ''))}: {r.get('note', '')}")
        for a in r.get("amended") or []:
            when = "after a run that tested it" if a.get("when") == "after" else "before any run tested it"
            how.append(f"Amended {when}{', commit ' + a['commit'] if a.get('commit') else ''}: was {a.get('was')}; "
                       f"{a.get('why')}")
        if r.get("spec_commit"):
            how.append(f"Spec entry last changed: {r['spec_commit']} {r.get('spec_date') or ''}".rstrip())
        return r["status"], lines, how

    def _repr_html_(self) -> str:
        status, lines, how = self.lines()
        kind = ("tip" if status.startswith("holds") and "shared" not in status else "note" if "shared" in status
                else "warning" if status.startswith(("not reproduced", "not attempted", "reported")) else "danger")
        body = "".join(f"<p>{html.escape(x)}</p>" for x in lines)
        details = ("<details><summary>How this check was set</summary><ul>"
                   + "".join(f"<li>{html.escape(x)}</li>" for x in how) + "</ul></details>") if how else ""
        return (f'<div class="admonition {kind} iclnb-verdict"><p class="admonition-title">'
                f"<code>{html.escape(self.row['id'])}</code>: {html.escape(status)}</p>{body}{details}</div>")

    def __repr__(self) -> str:
        status, lines, how = self.lines()
        return "\n".join([f"{self.row['id']}: {status}", *lines, *(f"  - {x}" for x in how)])


# ---- the Verdicts page ----------------------------------------------------------------------------
PAPERS = (  # (seed, the paper, its chapters)
    ("000", "Li, Song, Xia, Yu, Zhou 2023, *The Closeness of In-Context Learning and Weight Shifting for Softmax "
            "Regression* (arXiv 2304.13276)", (1,)),
    ("001", "He, Pan, Chen, Yang 2025, *In-Context Linear Regression Demystified: Training Dynamics and Mechanistic "
            "Interpretability of Multi-Head Softmax Attention* (arXiv 2503.12734)", (2, 3, 6, 7)),
    ("002", "Collins, Parulekar, Mokhtari, Sanghavi, Shakkottai 2024, *In-Context Learning with Transformers: Softmax "
            "Attention Adapts to Function Lipschitzness* (NeurIPS)", (4, 5)),
)
VERDICT_HEADERS = ("claim", "question", "verdict", "rival", "over seeds (defaults)", "paper scale", "where")


def _old_verdict(r: dict) -> str:
    """A claim recorded before its chapter had a spec, in words that say so."""
    if r["kind"] == "not_attempted":
        return "not attempted"
    if r["kind"] == "finding":
        return "not reproduced" if not r.get("holds") else "reproduced"
    against = {"chance": "a chance level", "init": "the untrained model", "competitor": "a competitor"}
    return (("passes against " + against.get(r.get("null_kind", ""), "its null")) if r.get("holds")
            else r["status"]) + " (older vocabulary)"


def verdicts_markdown(chapters: list[tuple[int, str, str, dict]]) -> list[str]:
    """The Verdicts page: every claim of the three papers with a verdict or a reason, grouped by
    paper, then chapter, one row each (``chapters``: (number, title, stem, claims JSON dict)).

    A claim measured from its chapter's spec reads in the spec's vocabulary (holds; holds (effect
    only); holds, shared with <rival>; fails; not reproduced; not attempted); one of a chapter
    not yet converted to a spec says "older vocabulary"."""
    recs = records.records_of([stem for _, _, stem, _ in chapters])
    papers = records.records_of([stem for _, _, stem, _ in chapters], paper=True)
    lines = ["# Verdicts", "",
             "Every claim of the three papers the book tests, one row each: what the paper says, the question "
             "the claim answers, the verdict at the chapter's defaults, the rival it was measured against, how "
             "often it holds over seeds 0-4, and its verdict at the paper's scale. **Effect**: is the structure "
             "there? Its rival is a chance level, so it can read *holds (effect only)*. **Mechanism**: is it the "
             "paper's mechanism rather than a simpler one? Its rival is trained or tuned the same way and could "
             "pass; when it passes too, the verdict reads *holds, shared with* the rival: the pattern belongs to "
             "the task, not to softmax. Reported numbers and the library's sanity checks are in each chapter's "
             "claims table, not here.", ""]
    papers_chapters = {n for _, _, numbers in PAPERS for n in numbers}
    old = [n for n, _, _, data in chapters if n in papers_chapters and any(
        r.get("kind") in ("check", "finding", "not_attempted") and not r.get("question")
        for r in data.get("claims", []))]
    if old:
        many = len(old) > 1
        lines += [f"Chapter{'s' if many else ''} {', '.join(map(str, old))} still record{'' if many else 's'} "
                  "their claims the older way: their rows say *older vocabulary*, and their rivals have not yet been "
                  "re-labelled by question (effect or mechanism) or by how they are obtained.", ""]
    by_number = {n: (title, stem, data) for n, title, stem, data in chapters}
    for seed, paper, numbers in PAPERS:
        present = [n for n in numbers if n in by_number]
        if not present:
            continue
        lines += [f"## Seed {seed}: {paper}", ""]
        for n in present:
            title, stem, data = by_number[n]
            rows = [r for r in data.get("claims", []) if r.get("kind") in ("check", "finding", "not_attempted")]
            lines += [f"### {title}", "", md_row(VERDICT_HEADERS), "|" + " --- |" * len(VERDICT_HEADERS)]
            rec, stale = recs[stem]
            prec, pstale = papers[stem]
            for r in rows:
                attempted = r["kind"] != "not_attempted"
                whose = (f"“{r['quote']}” ({r.get('ref', '')})" if r.get("quote") else
                         f"the book's own: {r['text']}" if is_own(r) else f"{r['text']} ({r.get('ref', '')})")
                rival = (f"{r['null']} [{r.get('rival_kind') or r.get('null_kind', '')}]: {fmt(r.get('null_value'))}"
                         if attempted and r.get("null") else "")
                verdict = r["status"] if r.get("question") else _old_verdict(r)
                lines.append(md_row([f"`{r['id']}`: {whose}", r.get("question", ""), f"**{verdict}**", rival,
                                      seeds_cell(r, rec, stale).replace("**", "") if attempted else "",
                                      paper_scale_cell(r["id"], prec, pstale) if attempted else "",
                                      f"{{doc}}`chapter {n} <chapters/{stem}>`"]))
            lines.append("")
    return lines
