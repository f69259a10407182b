"""Claims: every statement a chapter makes is a number checked against a threshold.

A chapter creates one :class:`Claims` and records each claim under a stable id (tests and
sweeps match on ids, never on wording) with one of four kinds:

* :meth:`Claims.check`: a claim of the paper the chapter reproduces, value <op> threshold;
  enforced (the book build fails when it does not hold at the default parameters);
* :meth:`Claims.finding`: a claim of the paper that the chapter found **not** to reproduce (or
  that only holds at a scale the run does not reach): the threshold is kept and evaluated, the
  page shows "not reproduced" when it fails, and it is never enforced;
* :meth:`Claims.report`: a number reported without a threshold;
* :meth:`Claims.sanity`: a check that cannot fail except through a bug (a precondition enforced
  by construction, a bound implied by a proven one, an algebraic identity, a parameter echoed
  back): enforced like a check, but kept apart from the evidence, in its own group of the table
  and of the JSON.

The table shows three groups, in this order: evidence (checks and findings), reported numbers,
sanity checks; each claim's ``group`` is in the JSON.

:meth:`Claims.finish` shows the claims table on the page, writes the claims as JSON beside the
executed notebook and, when ``enforce`` is on (the default parameters), raises
:class:`ClaimsFailed` if a checked claim failed.

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


KINDS = ("check", "finding", "report", "sanity")
# the table's groups: (group name, its heading on the page, the kinds it holds)
GROUPS = (
    ("evidence", "Evidence", ("check", "finding")),
    ("report", "Reported numbers", ("report",)),
    ("sanity", "Sanity checks (these can fail only through a bug)", ("sanity",)),
)
GROUP_OF = {kind: g for g, _, kinds in GROUPS for kind in kinds}
ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass
class Claim:
    id: str  # stable identifier, unique in its chapter (lower case, digits, - _ .)
    text: str  # the statement, in words
    value: object  # the measured number (or bool)
    op: str | None  # comparison, one of OPS; None for a reported-only number
    threshold: object  # the number the value is compared with (a (lo, hi) pair for "in")
    ref: str = ""  # where the paper makes the claim (e.g. "Thm 8.1", "Fig. 3")
    passed: bool | None = None  # None for reported-only numbers
    kind: str = "check"  # one of KINDS

    @property
    def status(self) -> str:
        if self.kind == "finding":
            return "reproduced" if self.passed else "not reproduced"
        return {True: "pass", False: "FAIL", None: "reported"}[self.passed]

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


@dataclass
class Claims:
    """The claims of one chapter.

    ``enforce``: raise :class:`ClaimsFailed` in :meth:`finish` if any claim failed (a chapter
    parameter: on at its defaults, off in smoke runs).
    """

    chapter: str
    enforce: bool = True
    claims: list[Claim] = field(default_factory=list)

    def _add(self, claim: Claim) -> Claim:
        if not (isinstance(claim.id, str) and ID.match(claim.id)):
            raise ValueError(f"claim id={claim.id!r} is invalid; allowed: lower case letters, digits, - _ .")
        if any(c.id == claim.id for c in self.claims):
            raise ValueError(f"claim id={claim.id!r} is used twice in {self.chapter}")
        self.claims.append(claim)
        return claim

    def _compare(self, cid, text, value, op, threshold, ref, kind) -> bool:
        if op not in OPS:
            raise ValueError(f"op={op!r} is not a comparison; use one of {sorted(OPS)}")
        value, threshold = _plain(value), _plain(threshold)
        if op == "in" and not (isinstance(threshold, (list, tuple)) and len(threshold) == 2):
            raise ValueError(f"op='in' needs a (lo, hi) threshold, got {threshold!r}")
        if op == "is":
            passed = value is threshold
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            passed = bool(OPS[op](value, threshold))
        else:
            passed = False  # a non-finite value fails every comparison
        return self._add(Claim(cid, text, value, op, threshold, ref, passed, kind)).passed

    def check(self, cid: str, text: str, value, op: str, threshold, ref: str = "") -> bool:
        """Record the claim ``value <op> threshold`` under id ``cid``; return whether it holds."""
        return self._compare(cid, text, value, op, threshold, ref, "check")

    def finding(self, cid: str, text: str, value, op: str, threshold, ref: str = "") -> bool:
        """Record a claim of the paper that does not reproduce here: evaluated against its kept
        threshold, shown as "not reproduced" (or "reproduced"), never enforced."""
        return self._compare(cid, text, value, op, threshold, ref, "finding")

    def sanity(self, cid: str, text: str, value, op: str, threshold, ref: str = "") -> bool:
        """Record a sanity check ``value <op> threshold``: one that cannot fail except through a
        bug. Enforced like :meth:`check`, shown apart from the evidence."""
        return self._compare(cid, text, value, op, threshold, ref, "sanity")

    def report(self, cid: str, text: str, value, ref: str = "") -> None:
        """Record a number the chapter reports without a pass/fail threshold."""
        self._add(Claim(cid, text, _plain(value), None, None, ref, None, "report"))

    def __getitem__(self, cid: str) -> Claim:
        for c in self.claims:
            if c.id == cid:
                return c
        raise KeyError(f"no claim {cid!r} in {self.chapter}")

    @property
    def failed(self) -> list[Claim]:
        return [c for c in self.claims if c.passed is False and c.kind in ("check", "sanity")]

    @property
    def n_passed(self) -> int:
        return sum(c.passed is True and c.kind == "check" for c in self.claims)

    def to_dict(self) -> dict:
        return {
            "chapter": self.chapter,
            "enforced": self.enforce,
            "passed": self.n_passed,
            "failed": len(self.failed),
            "not_reproduced": sum(c.kind == "finding" and not c.passed for c in self.claims),
            "sanity_passed": sum(c.passed is True and c.kind == "sanity" for c in self.claims),
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
        if self.enforce and self.failed:
            lines = "\n".join(f"- {c.text}: measured {_fmt(c.value)}, needs {c.condition}" for c in self.failed)
            # Show the table before raising so the page still tells which claims failed.
            try:
                from IPython.display import display

                display(self.table())
            except ImportError:  # pragma: no cover - IPython is there in notebooks
                pass
            raise ClaimsFailed(f"{len(self.failed)} claim(s) of {self.chapter} failed:\n{lines}")
        return self.table()


class ClaimsTable:
    """A claims table that renders as HTML in notebooks and the book, and as text elsewhere."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    HEADERS = ("id", "claim", "measured", "threshold", "result", "paper")

    @staticmethod
    def _cells(r: dict) -> list[str]:
        return [r["id"], r["text"], _fmt(r["value"]), r["condition"], r["status"], r["ref"]]

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
        return f'<table class="iclnb-claims"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'

    def _row_html(self, r: dict) -> str:
        color = {"pass": "#1a7f37", "FAIL": "#cf222e", "not reproduced": "#9a6700"}.get(r["status"], "#57606a")
        cells = [html.escape(c) for c in self._cells(r)]
        cells[0] = f"<code>{cells[0]}</code>"
        cells[4] = f'<b style="color:{color}">{cells[4]}</b>'
        return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"

    def __repr__(self) -> str:
        return "\n".join(f"{heading}:\n" + "\n".join(" | ".join(self._cells(r)) for r in rows)
                         for heading, rows in self.groups())
