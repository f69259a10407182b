"""Claims: every statement a chapter makes is a number checked against a threshold.

A chapter creates one :class:`Claims` and records each claim under a stable id (tests and
sweeps match on ids, never on wording) with one of these kinds:

* :meth:`Claims.check`: an **evidence check**, a claim of the paper the chapter reproduces,
  ``value <op> threshold``. It names its **null**, the simpler explanation it rules out (a fixed
  window, plain GD, a single head, ...), and carries that null's value, computed in the same run
  on the same prompts and compared with the same threshold. The check holds only when the value
  passes *and* the null fails: a check whose null also passes cannot tell the paper's mechanism
  from the simpler one, and fails (an error at the defaults, never a silent downgrade). Its
  ``basis`` says where the threshold comes from: ``"theory"``, ``"paper"`` or ``"mc"`` (the
  Monte Carlo error of the estimate). Enforced: the book build fails when it does not hold at
  the default parameters.
* a **finding**: a claim of the paper that the chapter found **not** to reproduce (or only at a
  scale the run does not reach). It is declared by its id *before the run*
  (``Claims(..., findings={id: why})``, where ``why`` says whether more training would change
  it), then recorded by :meth:`Claims.check` like any evidence check: the threshold is kept and
  evaluated, the page shows "not reproduced" when it fails, and it is never enforced;
* :meth:`Claims.report`: a number reported without a threshold;
* :meth:`Claims.sanity`: a check of the library's own exact math (a closed form, an identity,
  a deterministic ODE property, reproducibility, a precondition enforced by construction):
  enforced like a check, but kept apart from the evidence, in its own group, with no null;
* :meth:`Claims.not_attempted`: a claim of the paper in the chapter's scope that this run does
  not test (shown on the book's scorecard, so a reader sees what is missing).

The table shows three groups, in this order: evidence (checks and findings, each beside its
null and the null's value), reported numbers, sanity checks; each claim's ``group`` is in the
JSON. The Reproducibility page gathers every chapter's evidence into the book's scorecard.

:meth:`Claims.finish` shows the claims table on the page, writes the claims as JSON beside the
executed notebook and, when ``enforce`` is on (the default parameters), raises
:class:`ClaimsFailed` if a checked claim failed, a null passed, or a declared finding was never
recorded.

The JSON goes to ``$ICLNB_CLAIMS_JSON`` when the runner sets it, else to
``<chapter>.claims.json`` in the working directory.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

# A comparison maps (measured value, threshold) to pass/fail.
OPS = {
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "in": lambda v, t: t[0] <= v <= t[1],
    "is": lambda v, t: v is t,
}


class ClaimsFailed(AssertionError):
    """Raised by :meth:`Claims.finish` when a claim fails and the chapter enforces its claims."""


def _fmt(x) -> str:
    """A compact, readable rendering of a measured value or threshold."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in x) + "]"
    if isinstance(x, int):
        return f"{x:d}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
            return f"{x:.3g}"
        return f"{x:.4g}"
    return str(x)


KINDS = ("check", "finding", "report", "sanity", "not_attempted")
# the table's groups: (group name, its heading on the page, the kinds it holds)
GROUPS = (
    ("evidence", "Evidence", ("check", "finding")),
    ("report", "Reported numbers", ("report",)),
    ("sanity", "Sanity checks (the library's own exact math: these can fail only through a bug)", ("sanity",)),
    ("not_attempted", "Claims of the paper not attempted here", ("not_attempted",)),
)
GROUP_OF = {kind: g for g, _, kinds in GROUPS for kind in kinds}
# where an evidence threshold comes from
BASES = {"theory": "theory", "paper": "the paper", "mc": "Monte Carlo error"}
ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass
class Claim:
    id: str  # stable identifier, unique in its chapter (lower case, digits, - _ .)
    text: str  # the statement, in words
    value: object  # the measured number (or bool)
    op: str | None  # comparison, one of OPS; None for a reported-only number
    threshold: object  # the number the value is compared with (a (lo, hi) pair for "in")
    ref: str = ""  # where the paper makes the claim (e.g. "Thm 8.1", "Fig. 3")
    passed: bool | None = None  # whether the value meets the threshold; None for reported numbers
    kind: str = "check"  # one of KINDS
    null: str = ""  # evidence: the simpler explanation the check rules out
    null_value: object = None  # evidence: that explanation's value, same run, same threshold
    null_passed: bool | None = None  # evidence: whether the null's value meets the threshold too
    basis: str = ""  # evidence: where the threshold comes from, one of BASES
    paper: object = None  # the paper's own value, where it reports one
    note: str = ""  # a finding's or a not-attempted claim's explanation

    @property
    def holds(self) -> bool | None:
        """An evidence claim holds when its value passes and its null fails."""
        if self.passed is None:
            return None
        return bool(self.passed) and not self.null_passed

    @property
    def status(self) -> str:
        if self.kind == "not_attempted":
            return "not attempted"
        if self.kind == "finding":
            return "reproduced" if self.holds else "not reproduced"
        if self.kind == "check" and self.passed and self.null_passed:
            return "FAIL: null passes"
        return {True: "pass", False: "FAIL", None: "reported"}[self.holds]

    @property
    def group(self) -> str:
        return GROUP_OF[self.kind]

    @property
    def condition(self) -> str:
        if self.op is None:
            return ""
        if self.op == "in":
            return f"in [{_fmt(self.threshold[0])}, {_fmt(self.threshold[1])}]"
        return f"{self.op} {_fmt(self.threshold)}"


def _plain(x):
    """Turn numpy/torch scalars into plain Python numbers (JSON-safe, comparable)."""
    if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
        x = x.item()
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _meets(value, op: str, threshold) -> bool:
    """Whether ``value <op> threshold``; a non-finite or non-numeric value fails every comparison
    but ``is``."""
    if op == "is":
        return value is threshold
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return bool(OPS[op](value, threshold))
    return False


@dataclass
class Claims:
    """The claims of one chapter.

    ``enforce``: raise :class:`ClaimsFailed` in :meth:`finish` if any claim failed (a chapter
    parameter: on at its defaults, off in smoke runs).
    ``findings``: the ids of the paper's claims that this chapter declares, before the run, not
    to reproduce, each with why (and whether more training would change it). :meth:`check`
    records them as findings: evaluated, shown, never enforced.
    """

    chapter: str
    enforce: bool = True
    claims: list[Claim] = field(default_factory=list)
    findings: dict = field(default_factory=dict)

    def __post_init__(self):
        for cid, why in self.findings.items():
            if not (isinstance(cid, str) and ID.match(cid)) or not (isinstance(why, str) and why.strip()):
                raise ValueError(f"findings must map claim ids to why they do not reproduce; got {cid!r}: {why!r}")

    def _add(self, claim: Claim) -> Claim:
        if not (isinstance(claim.id, str) and ID.match(claim.id)):
            raise ValueError(f"claim id={claim.id!r} is invalid; allowed: lower case letters, digits, - _ .")
        if any(c.id == claim.id for c in self.claims):
            raise ValueError(f"claim id={claim.id!r} is used twice in {self.chapter}")
        if claim.id in self.findings and claim.kind not in ("check", "finding"):
            raise ValueError(f"claim id={claim.id!r} is declared a finding; record it with check()")
        self.claims.append(claim)
        return claim

    @staticmethod
    def _comparison(op, value, threshold):
        if op not in OPS:
            raise ValueError(f"op={op!r} is not a comparison; use one of {sorted(OPS)}")
        value, threshold = _plain(value), _plain(threshold)
        if op == "in" and not (isinstance(threshold, (list, tuple)) and len(threshold) == 2):
            raise ValueError(f"op='in' needs a (lo, hi) threshold, got {threshold!r}")
        return value, threshold

    def check(self, cid: str, text: str, value, op: str, threshold, *, null: str, null_value,
              basis: str, ref: str = "", paper=None) -> bool:
        """Record the evidence check ``value <op> threshold`` under id ``cid``; return whether it
        holds (the value passes and the null fails).

        ``null``: the simpler explanation the check rules out, in words; ``null_value``: its value,
        computed in the same run on the same prompts (compared with the same threshold: it must
        fail). ``basis``: where the threshold comes from, one of ``BASES``. ``paper``: the paper's
        own value, where it reports one. An id declared in ``findings`` is recorded as a finding.
        """
        value, threshold = self._comparison(op, value, threshold)
        if not (isinstance(null, str) and null.strip()):
            raise ValueError(f"evidence check {cid!r} names no null (the simpler explanation it rules "
                             "out); a check of the library's own math is a sanity check")
        if basis not in BASES:
            raise ValueError(f"evidence check {cid!r}: basis={basis!r}; the threshold's source must be "
                             f"one of {sorted(BASES)}")
        null_value = _plain(null_value)
        kind = "finding" if cid in self.findings else "check"
        claim = Claim(cid, text, value, op, threshold, ref, _meets(value, op, threshold), kind, null.strip(),
                      null_value, _meets(null_value, op, threshold), basis, _plain(paper),
                      self.findings.get(cid, ""))
        return self._add(claim).holds

    def sanity(self, cid: str, text: str, value, op: str, threshold, ref: str = "") -> bool:
        """Record a sanity check ``value <op> threshold``: a check of the library's own exact math,
        which cannot fail except through a bug. Enforced like :meth:`check`, shown apart from the
        evidence, with no null."""
        value, threshold = self._comparison(op, value, threshold)
        return self._add(Claim(cid, text, value, op, threshold, ref, _meets(value, op, threshold),
                               "sanity")).passed

    def report(self, cid: str, text: str, value, ref: str = "", paper=None) -> None:
        """Record a number the chapter reports without a pass/fail threshold."""
        self._add(Claim(cid, text, _plain(value), None, None, ref, None, "report", paper=_plain(paper)))

    def not_attempted(self, cid: str, text: str, why: str, ref: str = "", paper=None) -> None:
        """Record a claim of the paper in this chapter's scope that the run does not test, and why."""
        if not (isinstance(why, str) and why.strip()):
            raise ValueError(f"not-attempted claim {cid!r} needs a reason")
        self._add(Claim(cid, text, None, None, None, ref, None, "not_attempted", paper=_plain(paper),
                        note=why.strip()))

    def __getitem__(self, cid: str) -> Claim:
        for c in self.claims:
            if c.id == cid:
                return c
        raise KeyError(f"no claim {cid!r} in {self.chapter}")

    @property
    def failed(self) -> list[Claim]:
        """Enforced claims that do not hold: a failed sanity check, an evidence check whose value
        fails or whose null passes."""
        return [c for c in self.claims if (c.kind == "check" and c.holds is False)
                or (c.kind == "sanity" and c.passed is False)]

    @property
    def missing_findings(self) -> list[str]:
        """Declared findings never recorded (a declaration that names no claim is an error)."""
        recorded = {c.id for c in self.claims}
        return [cid for cid in self.findings if cid not in recorded]

    @property
    def n_passed(self) -> int:
        return sum(c.holds is True and c.kind == "check" for c in self.claims)

    def to_dict(self) -> dict:
        return {
            "chapter": self.chapter,
            "enforced": self.enforce,
            "passed": self.n_passed,
            "failed": len(self.failed),
            "not_reproduced": sum(c.kind == "finding" and not c.holds for c in self.claims),
            "not_attempted": sum(c.kind == "not_attempted" for c in self.claims),
            "sanity_passed": sum(c.passed is True and c.kind == "sanity" for c in self.claims),
            "missing_findings": self.missing_findings,
            "claims": [asdict(c) | {"status": c.status, "condition": c.condition, "group": c.group}
                       for c in self.claims],
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        path = Path(path or os.environ.get("ICLNB_CLAIMS_JSON") or f"{self.chapter}.claims.json")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, default=str))
        os.replace(tmp, path)
        return path

    def table(self) -> "ClaimsTable":
        return ClaimsTable(self.to_dict()["claims"])

    def finish(self):
        """Write the JSON, return the table for display, raise if enforced and a claim failed."""
        self.save()
        problems = [f"- {c.text}: measured {_fmt(c.value)}, needs {c.condition}"
                    + (f"; its null ({c.null}) also meets it with {_fmt(c.null_value)}, so the check "
                       "cannot tell the two apart" if c.passed and c.null_passed else "")
                    for c in self.failed]
        problems += [f"- finding {cid!r} was declared but never recorded" for cid in self.missing_findings]
        if self.enforce and problems:
            # Show the table before raising so the page still tells which claims failed.
            try:
                from IPython.display import display

                display(self.table())
            except ImportError:  # pragma: no cover - IPython is there in notebooks
                pass
            raise ClaimsFailed(f"{len(problems)} claim(s) of {self.chapter} failed:\n" + "\n".join(problems))
        return self.table()


def _condition_cell(r: dict) -> str:
    basis = BASES.get(r.get("basis") or "", "")
    return f"{r['condition']} ({basis})" if basis and r["condition"] else r["condition"]


def _null_cell(r: dict) -> str:
    if not r.get("null"):
        return ""
    verdict = "passes" if r.get("null_passed") else "fails"
    return f"{r['null']}: {_fmt(r.get('null_value'))} ({verdict})"


def _paper_cell(r: dict) -> str:
    paper = r.get("paper")
    return r["ref"] + (f" (paper: {_fmt(paper)})" if paper is not None else "")


def _measured_cell(r: dict) -> str:
    return r.get("note", "") if r.get("kind") == "not_attempted" else _fmt(r["value"])


class ClaimsTable:
    """A claims table that renders as HTML in notebooks and the book, and as text elsewhere."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    HEADERS = ("id", "claim", "measured", "threshold (its basis)", "null ruled out: its value", "result", "paper")

    @staticmethod
    def _cells(r: dict) -> list[str]:
        return [r["id"], r["text"], _measured_cell(r), _condition_cell(r), _null_cell(r), r["status"],
                _paper_cell(r)]

    def groups(self) -> list[tuple[str, list[dict]]]:
        """(heading, rows) of each non-empty group, in the order of ``GROUPS``."""
        out = []
        for g, heading, _ in GROUPS:
            rows = [r for r in self.rows if r.get("group", GROUP_OF.get(r.get("kind"), "evidence")) == g]
            if rows:
                out.append((heading, rows))
        return out

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self.HEADERS)
        body = []
        for heading, rows in self.groups():
            body.append(f'<tr class="iclnb-group"><th colspan="{len(self.HEADERS)}" '
                        f'style="text-align:left">{html.escape(heading)}</th></tr>')
            body.extend(self._row_html(r) for r in rows)
        notes = "".join(f"<li><code>{html.escape(r['id'])}</code>: {html.escape(r['note'])}</li>"
                        for r in self.rows if r.get("kind") == "finding" and r.get("note"))
        notes = f'<p>Findings, declared before the run:</p><ul class="iclnb-findings">{notes}</ul>' if notes else ""
        return (f'<table class="iclnb-claims"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
                f"</table>{notes}")

    def _row_html(self, r: dict) -> str:
        color = {"pass": "#1a7f37", "not reproduced": "#9a6700", "not attempted": "#57606a"}.get(
            r["status"], "#cf222e" if r["status"].startswith("FAIL") else "#57606a")
        cells = [html.escape(c) for c in self._cells(r)]
        cells[0] = f"<code>{cells[0]}</code>"
        cells[5] = f'<b style="color:{color}">{cells[5]}</b>'
        return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"

    def __repr__(self) -> str:
        return "\n".join(f"{heading}:\n" + "\n".join(" | ".join(self._cells(r)) for r in rows)
                         for heading, rows in self.groups())


SCORECARD_HEADERS = ("chapter", "id", "claim of the paper", "paper", "paper's value", "ours", "null's value",
                     "result")


def scorecard_rows(chapter_title: str, data: dict) -> list[list[str]]:
    """The book's scorecard rows of one chapter's claims JSON: every seed claim in scope (evidence
    and not-attempted claims), with the paper's value, ours, and reproduced / not reproduced /
    not attempted."""
    rows = []
    for r in data.get("claims", []):
        if r.get("kind") not in ("check", "finding", "not_attempted"):
            continue
        if r["kind"] == "not_attempted":
            result = "not attempted"
        else:
            result = "reproduced" if r["status"] in ("pass", "reproduced") else "not reproduced"
        paper = r.get("paper")
        rows.append([chapter_title, r["id"], r["text"], r.get("ref", ""), "" if paper is None else _fmt(paper),
                     _measured_cell(r), "" if r["kind"] == "not_attempted" else _fmt(r.get("null_value")), result])
    return rows
