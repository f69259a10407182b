"""How claims read on a page: a chapter's claims table and the book's scorecard.

:class:`ClaimsTable` renders one chapter's claims (the rows of ``Claims.to_dict()["claims"]``) as
HTML in the notebook and as text elsewhere. :func:`scorecard_markdown` writes the scorecard of
the book's Reproducibility page from every chapter's claims JSON and, where one exists, the
chapter's robustness record (``iclnb.bookkit.robustness``: the same chapter run at several seeds):
per chapter and in total, the evidence checks strong and weak, the sanity checks, the findings by
when they were declared, the numbers reported, the claims not attempted and how many evidence
checks hold over the seeds; then every claim in scope with its null's kind, its threshold's
basis, its verdict at this run and its pass rate over the seeds.
"""

from __future__ import annotations

import html

from iclnb.bookkit import records
from iclnb.bookkit.claimspec import fmt
from iclnb.bookkit.ledger import BASES, GROUP_OF, GROUPS


def declaration_words(declared: str, commit: str = "") -> str:
    """How the page says when a finding was declared (from its front-matter field)."""
    words = {"before": "declared before the run", "after": "declared after a failing run"}.get(
        declared, "declared at a time the chapter does not record")
    return words + (f" (commit {commit})" if commit else "")


def basis_words(r: dict) -> str:
    """Where a claim's threshold comes from, in words (a claims-JSON row)."""
    basis = r.get("basis") or ""
    if basis not in BASES:
        return ""
    if basis == "mc" and r.get("se") is not None:
        return f"Monte Carlo: {fmt(r['se_multiple'])} × s.e. {fmt(r['se'])}"
    if basis == "theory" and r.get("basis_ref"):
        return f"theory: {r['basis_ref']}"
    if basis == "paper" and r.get("basis_ref"):
        return f"the paper: {r['basis_ref']}"
    if basis == "paper" and r.get("paper") is not None:
        return f"the paper's {fmt(r['paper'])}"
    return BASES[basis]


def null_tag(r: dict) -> str:
    """An evidence claim's null kind and strength, e.g. ``competitor · strong`` ("" for others)."""
    return f"{r['null_kind']} · {r.get('strength') or 'weak'}" if r.get("null_kind") else ""


def is_own(r: dict) -> bool:
    """The book's own claim, not the paper's (``own=True`` or ref "ours")."""
    return bool(r.get("own")) or (r.get("ref") or "").strip().lower() == "ours"


def condition_cell(r: dict) -> str:
    basis = basis_words(r)
    return f"{r['condition']} ({basis})" if basis and r["condition"] else r["condition"]


def _null_cell(r: dict) -> str:
    if not r.get("null"):
        return ""
    tag = f"[{null_tag(r)}] " if r.get("null_kind") else ""
    if r.get("form") == "ordering":
        return f"{tag}{r['null']}: {fmt(r.get('null_value'))} (its own statistic)"
    verdict = "passes" if r.get("null_passed") else "fails"
    return f"{tag}{r['null']}: {fmt(r.get('null_value'))} ({verdict})"


def _paper_cell(r: dict) -> str:
    paper = r.get("paper")
    ref = r.get("ref") or ""
    own = "the book's own" + (f"; {ref}" if ref and ref.strip().lower() != "ours" else "")
    return (own if is_own(r) else ref) + (f" (paper: {fmt(paper)})" if paper is not None else "")


def _measured_cell(r: dict) -> str:
    if r.get("kind") == "not_attempted":
        return r.get("note", "")
    return f"{r['a']}: {fmt(r['value'])}" if r.get("form") == "ordering" else fmt(r["value"])


class ClaimsTable:
    """A claims table that renders as HTML in notebooks and the book, and as text elsewhere.

    ``chapter`` (its stem): add the chapter's pass rate over seeds at its defaults (its robustness
    record) and its verdict at paper scale (its paper-scale record, ``book/paper/``), each marked
    stale when the chapter's source changed since the record was written."""

    def __init__(self, rows: list[dict], enforced: bool = True, chapter: str | None = None):
        self.rows = rows
        self.enforced = enforced
        self.records = records.records_of([chapter])[chapter] if chapter else None
        self.paper = records.records_of([chapter], paper=True)[chapter] if chapter else None

    BASE_HEADERS = ("id", "claim", "measured", "threshold (its basis)",
                    "null ruled out [kind · strength]: its value", "result", "paper")
    NOT_ENFORCED = ("Claims not enforced: this run records its claims without holding the chapter to them "
                    "(smoke or sweep parameters); a check that holds reads \"holds (not enforced)\".")

    @property
    def HEADERS(self) -> tuple:  # noqa: N802 - the table's column headings
        if self.records is None:
            return self.BASE_HEADERS
        return (*self.BASE_HEADERS, "over seeds (defaults)", paper_heading(self.paper[0]))

    def _cells(self, r: dict) -> list[str]:
        cells = [r["id"], r["text"], _measured_cell(r), condition_cell(r), _null_cell(r), r["status"],
                 _paper_cell(r)]
        if self.records is not None:
            attempted = r.get("kind") in ("check", "finding", "sanity")
            cells += [seeds_cell(r, *self.records).replace("**", "") if attempted else "",
                      paper_scale_cell(r["id"], *self.paper) if attempted else ""]
        return cells

    def groups(self) -> list[tuple[str, list[dict]]]:
        """(heading, rows) of each non-empty group, in the order of ``GROUPS``."""
        out = []
        for g, heading, _ in GROUPS:
            rows = [r for r in self.rows if r.get("group", GROUP_OF.get(r.get("kind"), "evidence")) == g]
            if rows:
                out.append((heading, rows))
        return out

    def findings(self) -> list[tuple[str, str, str]]:
        """(id, when it was declared, why) of every finding, the wording from its declaration."""
        return [(r["id"], declaration_words(r.get("declared", ""), r.get("commit", "")), r["note"])
                for r in self.rows if r.get("kind") == "finding" and r.get("note")]

    def _repr_html_(self) -> str:
        if self.spec_mode:
            warn = "" if self.enforced else \
                f'<p class="iclnb-not-enforced"><b>{html.escape(self.NOT_ENFORCED)}</b></p>'
            return warn + self._spec_html()
        head = "".join(f"<th>{h}</th>" for h in self.HEADERS)
        body = []
        for heading, rows in self.groups():
            body.append(f'<tr class="iclnb-group"><th colspan="{len(self.HEADERS)}" '
                        f'style="text-align:left">{html.escape(heading)}</th></tr>')
            body.extend(self._row_html(r) for r in rows)
        notes = "".join(f"<li><code>{html.escape(cid)}</code> ({html.escape(when)}): {html.escape(why)}</li>"
                        for cid, when, why in self.findings())
        notes = f'<p>Findings:</p><ul class="iclnb-findings">{notes}</ul>' if notes else ""
        warn = "" if self.enforced else f'<p class="iclnb-not-enforced"><b>{html.escape(self.NOT_ENFORCED)}</b></p>'
        return (f'{warn}<table class="iclnb-claims"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
                f"</table>{notes}")

    def _row_html(self, r: dict) -> str:
        color = {"pass": "#1a7f37", "not reproduced": "#9a6700", "not attempted": "#57606a"}.get(
            r["status"], "#cf222e" if r["status"].startswith(("FAIL", "fails")) else "#57606a")
        cells = [html.escape(c) for c in self._cells(r)]
        cells[0] = f"<code>{cells[0]}</code>"
        cells[5] = f'<b style="color:{color}">{cells[5]}</b>'
        return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"

    def __repr__(self) -> str:
        text = [] if self.enforced else [self.NOT_ENFORCED]
        if self.spec_mode:
            for heading, rows, headers in self.spec_groups():
                text.append(f"{heading}:\n" + "\n".join(" | ".join(self._spec_cells(r, headers)) for r in rows))
        else:
            text += [f"{heading}:\n" + "\n".join(" | ".join(self._cells(r)) for r in rows)
                     for heading, rows in self.groups()]
        text += [f"finding {cid} ({when}): {why}" for cid, when, why in self.findings()]
        text += [f"amended {cid} ({when}): {words}" for cid, when, words in self.amendments()]
        return "\n".join(text)

    # ---- a chapter whose claims come from its spec (iclnb.bookkit.claimspec) -----------------------
    SPEC_HEADERS = ("claim", "question", "measured", "threshold (its basis)", "rival [how obtained]: its value",
                    "verdict")
    REPORT_HEADERS = ("id", "number", "value", "where")

    @property
    def spec_mode(self) -> bool:
        return any(r.get("question") for r in self.rows)

    def spec_groups(self) -> list[tuple[str, list[dict], tuple]]:
        """(heading, rows, headers) of the verdicts, the sanity checks and the reported numbers."""
        extra = () if self.records is None else ("over seeds (defaults)", paper_heading(self.paper[0]))
        verdicts = [r for r in self.rows if r.get("kind") in ("check", "finding", "not_attempted")]
        sanity = [r for r in self.rows if r.get("kind") == "sanity"]
        reports = [r for r in self.rows if r.get("kind") == "report"]
        out = [("Verdicts", verdicts, (*self.SPEC_HEADERS, *extra, "spec last changed"))]
        out += [("Sanity checks (the library's own exact math: these can fail only through a bug)", sanity,
                 ("claim", "measured", "threshold", "verdict"))] if sanity else []
        out += [("Reported numbers (no verdict)", reports, self.REPORT_HEADERS)] if reports else []
        return [g for g in out if g[1]]

    def _spec_cells(self, r: dict, headers: tuple) -> list[str]:
        whose = (f"“{r['quote']}” ({r.get('ref', '')})" if r.get("quote")
                 else "the book's own" + (f" ({r['ref']})" if r.get("ref") and not is_own(r) else ""))
        claim = f"{r['id']}: {whose}"
        if headers == self.REPORT_HEADERS:
            return [r["id"], r["text"], fmt(r["value"]), r.get("ref") or ""]
        if r.get("kind") == "sanity":
            return [f"{r['id']}: {r['text']}", fmt(r["value"]), condition_cell(r), r["status"]]
        attempted = r.get("kind") != "not_attempted"
        rival = ""
        if attempted and r.get("null"):
            rival = f"{r['null']} [{r.get('rival_kind', '')}]: {fmt(r.get('null_value'))}"
        measured = f"{r['text']}: {fmt(r['value'])}" if attempted else r.get("note", "")
        cells = [claim, r.get("question", ""), measured, condition_cell(r) if attempted else "", rival, r["status"]]
        if len(headers) > len(self.SPEC_HEADERS) + 1:
            cells += [seeds_cell(r, *self.records).replace("**", "") if attempted else "",
                      paper_scale_cell(r["id"], *self.paper) if attempted else ""]
        changed = r.get("spec_commit") or ""
        return cells + [f"{changed} {r.get('spec_date') or ''}".strip()]

    def amendments(self) -> list[tuple[str, str, str]]:
        """(id, when, what changed) of every amended rule, the earlier rule included."""
        when = {"before": "before any run tested it", "after": "after a run that tested it"}
        return [(r["id"], when.get(a.get("when"), a.get("when", "")) + (f", commit {a['commit']}" if a.get("commit")
                                                                        else ""),
                 f"was {a.get('was', '')}; {a.get('why', '')}")
                for r in self.rows for a in r.get("amended") or []]

    def _spec_html(self) -> str:
        parts = []
        for heading, rows, headers in self.spec_groups():
            head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
            body = []
            for r in rows:
                cells = [html.escape(c) for c in self._spec_cells(r, headers)]
                if headers != self.REPORT_HEADERS:
                    v = headers.index("verdict")
                    status = r["status"]
                    color = ("#1a7f37" if status.startswith("holds") and "shared" not in status else
                             "#0969da" if "shared" in status else "#9a6700" if status.startswith("not reproduced")
                             else "#57606a" if status.startswith(("not attempted", "reported")) else "#cf222e")
                    cells[v] = f'<b style="color:{color}">{cells[v]}</b>'
                body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            table = (f'<table class="iclnb-claims"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
                     "</tbody></table>")
            if headers == self.REPORT_HEADERS:
                table = f"<details><summary>{html.escape(heading)}: {len(rows)}</summary>{table}</details>"
            else:
                table = f"<p><b>{html.escape(heading)}</b></p>{table}"
            parts.append(table)
        notes = "".join(f"<li><code>{html.escape(cid)}</code> ({html.escape(when)}): {html.escape(why)}</li>"
                        for cid, when, why in self.findings())
        parts.append(f'<p>Findings:</p><ul class="iclnb-findings">{notes}</ul>' if notes else "")
        amended = "".join(f"<li><code>{html.escape(cid)}</code> amended {html.escape(when)}: {html.escape(w)}</li>"
                          for cid, when, w in self.amendments())
        parts.append(f'<p>Rules amended:</p><ul class="iclnb-amended">{amended}</ul>' if amended else "")
        return "".join(parts)


def md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def paper_note(title: str, stem: str, rec: dict, stale: bool) -> str:
    """One line of the Reproducibility page about a chapter's paper-scale record: its seeds, wall
    time and training speed, device, commit and date, and how its checks fared."""
    trains = [t.get("train_seconds") or 0 for t in rec.get("training") or []]
    walls = [w or 0 for w in rec.get("wall_seconds") or []]
    speed = [t.get("steps_per_second") for t in rec.get("training") or [] if t.get("steps_per_second")]
    checks = [c for c in rec.get("claims", {}).values() if c.get("kind") == "check"]
    finds = [c for c in rec.get("claims", {}).values() if c.get("kind") == "finding"]
    seeds = rec.get("seeds") or []
    held = sum(records.robust(*records.pass_rate(c)) if len(seeds) > 1 else records.pass_rate(c)[0] == 1
               for c in checks)
    repro = sum(records.pass_rate(c)[0] > 0 for c in finds)
    text = (f"- {title} ({rec.get('scale', 'paper scale')}): seed(s) {', '.join(map(str, seeds))}; "
            f"training {' + '.join(f'{w / 60:.0f} min' for w in trains) or '?'} at "
            f"{' / '.join(f'{v:.0f}' for v in speed) or '?'} steps/s (this execution "
            f"{' + '.join(f'{w / 60:.0f} min' for w in walls) or '?'}, models from the run cache where trained "
            f"before); {rec.get('device', '?')}; "
            f"commit `{rec.get('commit', '?')}`, {rec.get('date', '?')}; {held} of {len(checks)} evidence checks "
            f"hold{' at 4 of 5 seeds' if len(seeds) > 1 else ''}, {repro} of {len(finds)} findings reproduced")
    errors = rec.get("errors") or {}
    text += "".join(f"; seed {s} failed: {e}" for s, e in errors.items())
    return text + (", **stale**: the chapter's source changed since." if stale else ".")


def paper_heading(rec: dict | None) -> str:
    """The heading of the paper-scale column: "paper scale", or the record's own name for its
    preset (a "larger run" where the paper's settings are not known)."""
    return (rec or {}).get("scale") or "paper scale"


def paper_scale_cell(cid: str, rec: dict | None, stale: bool) -> str:
    """A claim's verdict in the chapter's paper-scale record: "holds"/"fails" ("reproduced"/"not
    reproduced" for a finding), "holds at k of n seeds" over several, with the value at one seed;
    "not run" without a record, "not in the record", "stale" when the source changed since."""
    if rec is None:
        return "not run"
    c = rec.get("claims", {}).get(cid)
    if c is None:
        return "not in the record" + (" (stale)" if stale else "")
    h, n = records.holds(c), len(rec.get("seeds") or [])
    if any(c.get("status") or []) and c.get("kind") in ("check", "finding", "sanity"):  # verdicts in words
        counts = records.verdict_counts(c)
        value = (c.get("values") or [None])[0]
        text = (counts[0][0] + ("" if value is None else f" ({fmt(value)})") if n == 1 else
                "; ".join(f"{v} at {k}" for v, k in counts) + f" of {n} seeds")
        return text + (" (stale)" if stale else "")
    finding = c.get("kind") == "finding"
    yes, no = ("reproduced", "not reproduced") if finding else ("holds", "fails")
    if all(x is None for x in h) and c.get("kind") not in ("check", "finding", "sanity"):
        text = "reported"
    elif n == 1:
        value = (c.get("values") or [None])[0]
        rival = c.get("null_passed") or [None]
        word = yes if h[0] else (no + (": rival passes" if (c.get("passed") or [None])[0] and rival[0] else ""))
        text = word + ("" if value is None else f" ({fmt(value)})")
    else:
        text = f"{yes} at {sum(x is True for x in h)} of {n} seeds"
    return text + (" (stale)" if stale else "")


def seeds_cell(r: dict, rec, stale: bool) -> str:
    """A claim's pass rate over the seeds of its robustness record; for a claim of a chapter's
    spec, the seeds that reach this run's verdict ("holds, shared with ..." counts as itself)."""
    if rec is None:
        return "no record"
    kn = records.seed_passes(rec, r["id"])
    if kn is None:
        return "not in the record"
    if r.get("question") and rec["claims"][r["id"]].get("status"):
        word, k, n, stronger = records.seeds_verdict(rec["claims"][r["id"]])
        kn = (k, n)
        text = f"{word} at {k} of {n}" + (f" (holds at {stronger})" if stronger else "")
    else:
        text = f"{kn[0]} of {kn[1]}"
    text += " **not robust**" if r["kind"] == "check" and not records.robust(*kn) else ""
    return text + (" (stale)" if stale else "")


def _verdict_cell(r: dict) -> str:
    if r["kind"] == "finding":
        return f"{r['status']}; finding, {declaration_words(r.get('declared', ''), r.get('commit', ''))}"
    return r["status"]


VERDICTS = ("holds", "holds (effect only)", "holds, shared with a rival", "fails", "not reproduced")
SUMMARY_HEADERS = ("chapter", *VERDICTS, "reported", "sanity", "not attempted",
                   "evidence checks holding (or shared) at ≥ 4 of 5 seeds")
CLAIM_HEADERS = ("chapter", "id", "claim", "whose", "question · rival", "threshold's basis", "at this run",
                 "over seeds", "margins over seeds: value; rival", "paper scale (or larger run)", "ref",
                 "paper's value", "ours", "rival's value")


def _margin(value, threshold, op: str):
    """How far ``value`` is on the passing side of ``threshold`` (negative: it fails); None where
    either is not a number."""
    if not (isinstance(value, (int, float)) and isinstance(threshold, (int, float))) or isinstance(value, bool):
        return None
    return threshold - value if op in ("<", "<=") else value - threshold if op in (">", ">=") else None


def margins_cell(r: dict, rec: dict | None) -> str:
    """A check's margins over the seeds of its robustness record: the value's and the rival's
    distance to the threshold, each as the range over seeds (positive: on the passing side, so a
    rival with a positive margin passes too). "" where the record keeps no rivals or thresholds."""
    c = (rec or {}).get("claims", {}).get(r["id"]) or {}
    values, rivals, thresholds = (c.get(k) or [] for k in ("values", "rivals", "thresholds"))
    op = r.get("op") or ""
    if not thresholds or op not in ("<", "<=", ">", ">="):
        return ""

    def span(xs):
        ms = [m for m in (_margin(x, t, op) for x, t in zip(xs, thresholds)) if m is not None]
        return "" if not ms else f"{fmt(min(ms))} to {fmt(max(ms))}" if len(ms) > 1 else fmt(ms[0])

    rival = span(rivals) if r.get("form") != "ordering" else "(its threshold)"
    return f"{span(values)}; {rival}"


def verdict_class(r: dict) -> str:
    """Which of ``VERDICTS`` an evidence row (a check or a finding) reads: its verdict in words
    (a claim of the spec), else what its pass and its null say."""
    words = r.get("words") or ""
    if not words:
        words = ("not reproduced" if not r.get("holds") else "holds") if r.get("kind") == "finding" else \
            ("holds" if r.get("holds") else "fails")
    if words.startswith("holds, shared"):
        return VERDICTS[2]
    if words.startswith("holds (effect only)"):
        return VERDICTS[1]
    return next((v for v in (VERDICTS[0], VERDICTS[4]) if words.startswith(v)), VERDICTS[3])


def question_tag(r: dict) -> str:
    """The question a claim answers and its rival's kind, e.g. ``mechanism · trained``; a claim
    recorded without a spec: its null's kind and strength."""
    if r.get("question") in ("effect", "mechanism"):
        return f"{r['question']} · {r.get('rival_kind') or '?'}"
    return null_tag(r)


def _counts(data: dict) -> list[int]:
    rows = data.get("claims", [])
    found = [verdict_class(r) for r in rows if r.get("kind") in ("check", "finding")]
    kinds = [r.get("kind") for r in rows]
    return [*(found.count(v) for v in VERDICTS), kinds.count("report"), kinds.count("sanity"),
            kinds.count("not_attempted")]


def _robust_count(data: dict, rec) -> tuple[int, int] | None:
    if rec is None:
        return None
    entries = [rec.get("claims", {}).get(r["id"]) for r in data.get("claims", []) if r.get("kind") == "check"]
    return sum(_has_verdict(e) for e in entries), len(entries)


def _has_verdict(entry: dict | None) -> bool:
    """Whether a check of a record holds or is shared at 4 of 5 seeds or more."""
    if entry is None:
        return False
    if not entry.get("status"):  # a record without verdict words: its pass rate
        return records.robust(*records.pass_rate(entry))
    word, k, n, _ = records.seeds_verdict(entry)
    return records.STRENGTH.get(word, 2) <= 1 and records.robust(k, n)


def _has_evidence(data: dict) -> bool:
    return any(r.get("kind") in ("check", "finding") for r in data.get("claims", []))


def scorecard_markdown(chapters: list[tuple[str, str, dict]]) -> list[str]:
    """The markdown lines of the Reproducibility page's scorecard.

    ``chapters``: ``(title, stem, claims JSON dict)`` for every chapter, in book order; the pass
    rates over seeds come from ``iclnb.bookkit.robustness.robustness_record(stem)`` ("no record"
    when the module or the record is missing; "stale" when ``is_stale(record)``)."""
    recs = records.records_of([stem for _, stem, _ in chapters])
    papers = records.records_of([stem for _, stem, _ in chapters], paper=True)
    summary, total, robust_total, claim_rows, notes = [], [0] * 8, [0, 0], [], []  # 8: the count columns
    paper_notes = []
    for title, stem, data in chapters:
        rec, stale = recs[stem]
        prec, pstale = papers[stem]
        if prec is not None:
            paper_notes.append(paper_note(title, stem, prec, pstale))
        counts = _counts(data)
        total = [t + c for t, c in zip(total, counts)]
        rc = _robust_count(data, rec)
        if not _has_evidence(data):
            cell = "no evidence checks"  # nothing to hold over seeds (e.g. the sweep page)
        elif rc is None:
            cell = "no record"
            notes.append(f"- {title}: no robustness record (`iclnb robustness {stem} --seeds 0 1 2 3 4`).")
        else:
            robust_total = [robust_total[0] + rc[0], robust_total[1] + rc[1]]
            cell = f"{rc[0]} of {rc[1]}" + (" (stale)" if stale else "")
            seeds = ", ".join(str(s) for s in rec.get("seeds", []))
            notes.append(f"- {title}: seeds {seeds}, commit `{rec.get('commit', '?')}`, {rec.get('device', '?')}, "
                         f"{rec.get('date', '?')}" + (", **stale**: the chapter's source changed since" if stale
                                                      else "") + ".")
        summary.append([title, *counts, cell])
        for r in data.get("claims", []):
            if r.get("kind") not in ("check", "finding", "not_attempted"):
                continue
            attempted = r["kind"] != "not_attempted"
            paper = r.get("paper")
            claim_rows.append([title, r["id"], r["text"], "the book's own" if is_own(r) else "the paper's",
                               question_tag(r), basis_words(r), _verdict_cell(r),
                               seeds_cell(r, rec, stale) if attempted else "",
                               margins_cell(r, rec) if attempted else "",
                               paper_scale_cell(r["id"], prec, pstale) if attempted else "",
                               r.get("ref", ""), "" if paper is None else fmt(paper), _measured_cell(r),
                               fmt(r.get("null_value")) if attempted else ""])
    if not chapters:
        return []
    missing = sum(recs[stem][0] is None and _has_evidence(data) for _, stem, data in chapters)
    summary.append(["**all chapters**", *total, "no record" if not robust_total[1] else
                    f"{robust_total[0]} of {robust_total[1]}" + (f" ({missing} chapter(s) without a record)"
                                                                 if missing else "")])
    return (["", "## Scorecard", "",
             "Every chapter's claims, counted by verdict (the [Verdicts](verdicts.md) page lists them by paper). "
             "Each claim answers one question. An **effect** question (is the structure there?) faces a chance "
             "level, what the statistic reads without the effect, and at best **holds (effect only)**. A "
             "**mechanism** question (is it the paper's mechanism rather than a simpler one?) faces the "
             "strongest rival a referee would name, trained, tuned, ablated or computed on the same prompts: it "
             "**holds** when the value passes and that rival fails, and **holds, shared with** the rival when "
             "both pass (the pattern then belongs to the task, not to softmax). A finding is a claim the chapter "
             "measures and does not see reproduce (**not reproduced**), never enforced, dated by its "
             "declaration. The verdict over seeds comes from the chapter run at each seed at its defaults: it is the "
             "strongest verdict reached at 4 of 5 seeds or more, a seed that holds counting as reaching "
             "\"shared\" (its value passes; so \"holds at 3, shared at 2\" reads shared at 5 of 5, holds at 3). "
             "An evidence check with no such verdict is marked **not robust**.", "",
             md_row(SUMMARY_HEADERS), "|" + " --- |" + " ---: |" * (len(SUMMARY_HEADERS) - 2) + " --- |"]
            + [md_row(row) for row in summary] + ["", "Robustness records:", ""] + notes
            + ["", "### Paper scale", "",
               "Each chapter whose `paper` preset differs from its defaults run at that preset "
               "(`iclnb robustness CH --preset paper`; claims recorded, not enforced). Chapters 4 and 5 "
               "have no paper settings to match, so their preset is the book's own larger run.", ""]
            + (paper_notes or ["No paper-scale records yet."])
            + ["", "### Every claim in scope", "", md_row(CLAIM_HEADERS), "|" + " --- |" * len(CLAIM_HEADERS)]
            + [md_row(row) for row in claim_rows])
