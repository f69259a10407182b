"""Claims: every statement a chapter makes is a number checked against a threshold.

A chapter creates one :class:`Claims`, records each claim with :meth:`Claims.check` (or a
reported-only number with :meth:`Claims.report`), and ends with :meth:`Claims.finish`, which
shows the claims table on the page, writes the claims as JSON beside the executed notebook and,
when ``enforce`` is on (the default parameters), raises :class:`ClaimsFailed` if any claim failed.

The JSON goes to ``$ICLNB_CLAIMS_JSON`` when the runner sets it, else to
``<chapter>.claims.json`` in the working directory.
"""

from __future__ import annotations

import html
import json
import math
import os
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


@dataclass
class Claim:
    text: str  # the statement, in words
    value: object  # the measured number (or bool)
    op: str | None  # comparison, one of OPS; None for a reported-only number
    threshold: object  # the number the value is compared with (a (lo, hi) pair for "in")
    ref: str = ""  # where the seed makes the claim (e.g. "Thm 8.1", "Fig. 3")
    passed: bool | None = None  # None for reported-only numbers

    @property
    def status(self) -> str:
        return {True: "pass", False: "FAIL", None: "reported"}[self.passed]

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

    def check(self, text: str, value, op: str, threshold, ref: str = "") -> bool:
        """Record a claim ``value <op> threshold`` and return whether it holds.

        A non-finite value fails every comparison.
        """
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
            passed = False
        self.claims.append(Claim(text, value, op, threshold, ref, passed))
        return passed

    def report(self, text: str, value, ref: str = "") -> None:
        """Record a number the chapter reports without a pass/fail threshold."""
        self.claims.append(Claim(text, _plain(value), None, None, ref, None))

    @property
    def failed(self) -> list[Claim]:
        return [c for c in self.claims if c.passed is False]

    @property
    def n_passed(self) -> int:
        return sum(c.passed is True for c in self.claims)

    def to_dict(self) -> dict:
        return {
            "chapter": self.chapter,
            "enforced": self.enforce,
            "passed": self.n_passed,
            "failed": len(self.failed),
            "claims": [asdict(c) | {"status": c.status, "condition": c.condition} for c in self.claims],
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

    def _cells(self, r: dict) -> list[str]:
        return [r["text"], _fmt(r["value"]), r["condition"], r["status"], r["ref"]]

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("claim", "measured", "threshold", "result", "seed"))
        body = []
        for r in self.rows:
            color = {"pass": "#1a7f37", "FAIL": "#cf222e"}.get(r["status"], "#57606a")
            cells = [html.escape(c) for c in self._cells(r)]
            cells[3] = f'<b style="color:{color}">{cells[3]}</b>'
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        return f'<table class="iclnb-claims"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'

    def __repr__(self) -> str:
        return "\n".join(" | ".join(self._cells(r)) for r in self.rows)
