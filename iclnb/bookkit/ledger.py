"""The claims ledger: every statement a chapter makes is a number checked against a threshold.
Pure data (it displays nothing: :mod:`iclnb.bookkit.claims` is what a chapter imports, the same
ledger with its table and verdict boxes).

A chapter creates one :class:`Claims` and records each claim under a stable id (tests and
sweeps match on ids, never on wording):

* :meth:`Claims.check`: an **evidence check** of a claim of the paper (or, with ``own=True`` or
  ``ref="ours"``, of the book's own), ``value <op> threshold``. It names its **null**, the
  simpler explanation it rules out, with the null's value measured in the same run against the
  same threshold, and the null's kind (``NULL_KINDS``): a *competitor* or a *chance* level make
  the check **strong**, *init* (the same models before training) **weak**. It holds only when
  the value passes *and* the null fails. ``basis`` (``BASES``) says where the threshold comes
  from: theory (naming the result), mc (a multiple of a standard error), the paper's own number,
  or chosen (the book's own; the spec's history says when).
* :meth:`Claims.ordering`: "A beats B", with both sides' own statistics (never a ratio and its
  reciprocal).
* a **finding**: a claim of the paper that the chapter measures and does not see reproduce,
  declared in the chapter's front matter (:func:`declared_findings`), recorded by ``check`` or
  ``ordering``, evaluated and shown with when it was declared, never enforced;
* :meth:`Claims.report` (a number, no threshold), :meth:`Claims.sanity` (the library's own
  exact math: enforced, shown apart, no null), :meth:`Claims.not_attempted`.
* :meth:`Claims.measure`: a claim declared once in the chapter's claim spec
  (:mod:`iclnb.bookkit.claimspec`), measured by one statement, its verdict in words.

Every evidence check names its null's kind, a basis with its fields and a finite null, and every
finding is dated; anything less is a ValueError.

:meth:`Claims.finish` writes the JSON (to ``$ICLNB_CLAIMS_JSON`` when the runner sets it, else
``<chapter>.claims.json``) and, when ``enforce`` is on (the default parameters), raises
:class:`ClaimsFailed` if a check or a sanity check failed, a null passed, or a declared finding
was never recorded. With ``enforce`` off the table and JSON say "claims not enforced" and a
check reads "holds (not enforced)".
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from iclnb.bookkit.claimspec import (
    DECLARED,
    OPS,
    chapter_source,
    claims_target,
    declared_findings,
    entry_history,
    finding_declaration,
    findings_in_force,
    fmt,
    load_spec,
    meets,
    plain,
    real_number,
    verdict,
)
from iclnb.contract import PRESET


class ClaimsFailed(AssertionError):
    """Raised by :meth:`Claims.finish` when a claim fails and the chapter enforces its claims."""


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
BASES = {"theory": "theory", "paper": "the paper", "mc": "Monte Carlo error", "chosen": "chosen"}
# the kinds of null an evidence check may face, and the strength each gives it
NULL_KINDS = {"competitor": "strong", "chance": "strong", "init": "weak"}
ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass
class Claim:
    id: str  # stable identifier, unique in its chapter (lower case, digits, - _ .)
    text: str  # the statement, in words
    value: object  # the measured number (or bool); an ordering: A's own statistic
    op: str | None  # comparison, one of OPS; None for a reported-only number
    threshold: object  # the number the value is compared with (a (lo, hi) pair for "in")
    ref: str = ""  # where the paper makes the claim (e.g. "Thm 8.1", "Fig. 3")
    passed: bool | None = None  # whether the value meets the threshold; None for reported numbers
    kind: str = "check"  # one of KINDS
    null: str = ""  # evidence: the simpler explanation the check rules out (an ordering: B)
    null_value: object = None  # evidence: that explanation's value, same run (an ordering: B's statistic)
    null_passed: bool | None = None  # evidence: whether the null meets the threshold too (None: an ordering)
    basis: str = ""  # evidence: where the threshold comes from, one of BASES
    paper: object = None  # the paper's own value, where it reports one
    note: str = ""  # a finding's or a not-attempted claim's explanation
    null_kind: str = ""  # evidence: one of NULL_KINDS
    strength: str = ""  # evidence: "strong" (competitor, chance) or "weak" (init)
    form: str = ""  # evidence: "threshold" (check) or "ordering" (A beats B)
    a: str = ""  # an ordering: what the value measures (A)
    margin: float | None = None  # an ordering: the threshold is B's statistic -/+ this margin
    basis_ref: str = ""  # basis "theory": the result (e.g. "Theorem 2"); "paper": where it states it
    se: float | None = None  # basis "mc": the standard error
    se_multiple: float | None = None  # basis "mc": the multiple of it
    declared: str = ""  # a finding: "before", "after" or "unknown"
    commit: str = ""  # a finding: the commit that declared it, where given
    own: bool = False  # the book's own claim, not the paper's
    untrained_ok: str = ""  # evidence not about a trained model: why it may hold with untrained models
    # a claim measured from the chapter's spec (Claims.measure; iclnb.bookkit.claimspec):
    question: str = ""  # effect, mechanism, sanity, report or not_attempted
    rival_kind: str = ""  # trained, tuned or chance
    words: str = ""  # its verdict in words (claimspec.verdict)
    quote: str = ""  # the paper's words
    amended: list = field(default_factory=list)  # changes of its rule: {when, was, why, commit}
    spec_commit: str = ""  # the commit at which its spec entry last changed ("uncommitted", "unknown")
    spec_date: str = ""  # that commit's date

    @property
    def holds(self) -> bool | None:
        """An evidence claim holds when its value passes and its null fails."""
        if self.passed is None:
            return None
        return bool(self.passed) and not self.null_passed

    def verdict(self, enforced: bool = True) -> str:
        """The status shown on the page; a claim of a run that does not enforce its claims never
        reads as an enforced "pass"."""
        if self.words:  # a claim of the spec: its verdict in words
            return self.words if enforced or self.kind in ("report", "not_attempted") else \
                f"{self.words} (not enforced)"
        if self.kind == "not_attempted":
            return "not attempted"
        if self.kind == "finding":
            return "reproduced" if self.holds else "not reproduced"
        if self.holds is None:
            return "reported"
        null_passes = self.kind == "check" and self.passed and self.null_passed
        if enforced:
            return "FAIL: null passes" if null_passes else ("pass" if self.holds else "FAIL")
        return ("fails: null passes" if null_passes else ("holds" if self.holds else "fails")) + " (not enforced)"

    @property
    def status(self) -> str:
        return self.verdict(True)

    @property
    def group(self) -> str:
        return GROUP_OF[self.kind]

    @property
    def condition(self) -> str:
        if self.op is None:
            return ""
        if self.op == "in":
            return f"in [{fmt(self.threshold[0])}, {fmt(self.threshold[1])}]"
        if self.form == "ordering":
            sign = "-" if self.op in ("<", "<=") else "+"
            return f"{self.op} {fmt(self.null_value)}" + (
                f" {sign} {fmt(self.margin)}" if self.margin else "")
        return f"{self.op} {fmt(self.threshold)}"


def _check_basis(cid: str, basis: str, basis_ref, se, se_multiple, paper) -> None:
    """Validate a threshold's basis: each basis names what it rests on."""
    if basis not in BASES:
        raise ValueError(f"evidence check {cid!r}: basis={basis!r}; the threshold's source must be one of "
                         f"{sorted(BASES)}")
    if not isinstance(basis_ref, str):
        raise ValueError(f"evidence check {cid!r}: basis_ref={basis_ref!r} must be a string")
    if basis == "mc" and (se is not None or se_multiple is not None):
        if not (real_number(se) and se >= 0 and real_number(se_multiple) and se_multiple > 0):
            raise ValueError(f"evidence check {cid!r}: basis 'mc' needs se= (a finite standard error >= 0) and "
                             f"se_multiple= (> 0); got se={se!r}, se_multiple={se_multiple!r}")
        return
    missing = {"theory": "basis_ref= naming the result (e.g. 'Theorem 2')",
               "mc": "se= (the standard error) and se_multiple= (its multiple)",
               "paper": "paper= (the paper's own number) or basis_ref= (where the paper states it)"}.get(basis)
    if missing is None or (basis == "theory" and basis_ref.strip()) or (
            basis == "paper" and (paper is not None or basis_ref.strip())):
        return
    raise ValueError(f"evidence check {cid!r}: basis={basis!r} needs {missing}")


@dataclass
class Claims:
    """The claims of one chapter.

    ``enforce``: raise :class:`ClaimsFailed` in :meth:`finish` if any claim failed (a chapter
    parameter: on at its defaults, off in smoke runs and sweeps).
    ``findings``: ``None`` (the default) reads the declarations from the chapter's front matter
    (:func:`declared_findings`); a dict ``{id: {declared, why, commit}}`` is used instead (tests;
    a bare ``why``, with no date, is a ValueError). :meth:`check` and :meth:`ordering`
    record a declared id as a finding: evaluated, shown, never enforced.
    """

    chapter: str
    enforce: bool = True
    claims: list[Claim] = field(default_factory=list)
    findings: dict | None = None
    findings_source: str = ""  # where the findings were declared: "<file>: iclnb.findings", "explicit"
    findings_skipped: list = field(default_factory=list)  # declared, left out of this run by its parameters
    spec: dict | None = None  # the claim spec (id -> ClaimSpec); None: the chapter's front matter (claimspec)

    def __post_init__(self):
        self._path = claims_target(self.chapter)  # checked now: a run must not fail at its last cell over it
        source = chapter_source(self.chapter)
        if self.spec is None:
            self.spec = load_spec(source) if source is not None else {}
        if self.findings is None:
            self.findings, self.findings_source = declared_findings(self.chapter)
            if not self.findings:
                self.findings_source = ""
            preset = os.environ.get(PRESET) or None
            for cid, d in findings_in_force(self.spec, preset).items():
                spec = self.spec[cid]
                if cid in self.findings:
                    raise ValueError(f"finding {cid!r} is declared twice: in iclnb.findings and in its claim spec")
                self.findings[cid] = {"declared": d.when, "why": d.why, "commit": d.commit}
                key = "finding_paper" if d is spec.finding_paper else "finding"
                where = f"{source.name if source else self.chapter}: iclnb.claims ({key})"
                if where not in self.findings_source:
                    self.findings_source = "; ".join(x for x in (self.findings_source, where) if x)
        else:
            self.findings_source = self.findings_source or "explicit"
            for cid, v in self.findings.items():
                if finding_declaration(cid, v, dated=False)["declared"] == "unknown":
                    raise ValueError(f"finding {cid!r} is not dated: declare it in the chapter's front matter")

    def _add(self, claim: Claim) -> Claim:
        if not (isinstance(claim.id, str) and ID.match(claim.id)):
            raise ValueError(f"claim id={claim.id!r} is invalid; allowed: lower case letters, digits, - _ .")
        if any(c.id == claim.id for c in self.claims):
            raise ValueError(f"claim id={claim.id!r} is used twice in {self.chapter}")
        if claim.id in self.findings and claim.kind not in ("check", "finding"):
            raise ValueError(f"claim id={claim.id!r} is declared a finding; record it with check() or ordering()")
        self.claims.append(claim)
        return claim

    @staticmethod
    def _comparison(op, value, threshold):
        if op not in OPS:
            raise ValueError(f"op={op!r} is not a comparison; use one of {sorted(OPS)}")
        value, threshold = plain(value), plain(threshold)
        if op == "in" and not (isinstance(threshold, (list, tuple)) and len(threshold) == 2):
            raise ValueError(f"op='in' needs a (lo, hi) threshold, got {threshold!r}")
        return value, threshold

    def _evidence(self, cid, null_kind, null_value, value, op, basis, basis_ref, se, se_multiple, paper,
                  own, ref, untrained_ok="") -> dict:
        """The fields every evidence claim shares (null kind, strength, basis, finding), validated."""
        if null_kind not in NULL_KINDS:
            raise ValueError(f"evidence check {cid!r}: null_kind={null_kind!r}; one of {sorted(NULL_KINDS)}")
        measured = isinstance(null_value, bool) if op == "is" else real_number(null_value)
        if not measured:
            raise ValueError(f"evidence check {cid!r}: its null's value {null_value!r} is not a finite measured "
                             + ("boolean" if op == "is" else "number"))
        if (op != "is" and real_number(value) and abs(value - 1) > 1e-9
                and math.isclose(value * null_value, 1.0, rel_tol=1e-9)):
            raise ValueError(f"evidence check {cid!r}: its null is the reciprocal of the value; record an "
                             "ordering with both sides' own statistics (Claims.ordering)")
        _check_basis(cid, basis, basis_ref, se, se_multiple, paper)
        out = dict(null_kind=null_kind, strength=NULL_KINDS.get(null_kind, "weak"), basis=basis,
                   basis_ref=basis_ref.strip(), se=plain(se), se_multiple=plain(se_multiple), paper=plain(paper),
                   own=bool(own) or ref.strip().lower() == "ours", kind="check",
                   untrained_ok=str(untrained_ok or "").strip())
        if cid in self.findings:
            d = finding_declaration(cid, self.findings[cid], dated=False)
            out.update(kind="finding", note=d["why"], declared=d["declared"], commit=d["commit"])
            if d["declared"] == "unknown":
                raise ValueError(f"finding {cid!r} is not dated: declare it in the chapter's front matter")
        return out

    def check(self, cid: str, text: str, value, op: str, threshold, *, null: str, null_value, basis: str,
              null_kind: str, basis_ref: str = "", se=None, se_multiple=None, ref: str = "",
              paper=None, own: bool = False, untrained_ok: str = "") -> bool:
        """Record the evidence check ``value <op> threshold`` under id ``cid``; return whether it
        holds (the value passes and the null fails).

        ``null``: the simpler explanation the check rules out, in words; ``null_value``: its value,
        computed in the same run (compared with the same threshold: it must fail), a finite number
        (a bool for op ``"is"``); ``null_kind``: one of ``NULL_KINDS``. ``basis``: one of ``BASES``;
        ``"theory"`` needs ``basis_ref`` (the result), ``"mc"`` needs ``se`` and ``se_multiple``
        (the threshold being the chapter's estimate -/+ se_multiple x se), ``"paper"`` needs
        ``paper`` (the paper's own value) or ``basis_ref``. ``own``: the book's own claim.
        ``untrained_ok``: for a check that is not about a trained model (it reads the data, a
        closed form or an ODE), why it may hold when every model is left at its initialisation
        (the tests run every chapter untrained, ``ICLNB_UNTRAINED=1``, and fail on an evidence
        check that still holds there without this reason). An id declared in ``findings`` is recorded as a finding.
        """
        value, threshold = self._comparison(op, value, threshold)
        if not (isinstance(null, str) and null.strip()):
            raise ValueError(f"evidence check {cid!r} names no null (the simpler explanation it rules "
                             "out); a check of the library's own math is a sanity check")
        null_value = plain(null_value)
        ev = self._evidence(cid, null_kind, null_value, value, op, basis, basis_ref, se, se_multiple, paper, own,
                            ref, untrained_ok)
        claim = Claim(cid, text, value, op, threshold, ref, meets(value, op, threshold), null=null.strip(),
                      null_value=null_value, null_passed=meets(null_value, op, threshold), form="threshold", **ev)
        return self._add(claim).holds

    def ordering(self, cid: str, text: str, value, rival, op: str = "<", *, a: str, b: str, null_kind: str,
                 basis: str, margin=None, basis_ref: str = "", se=None, se_multiple=None, ref: str = "",
                 paper=None, own: bool = False, untrained_ok: str = "") -> bool:
        """Record the evidence check "A beats B": ``value`` is A's own statistic, ``rival`` B's (the
        null), each measured in the same run; it holds when ``value < rival - margin`` (op ``"<"``,
        lower is better) or ``value > rival + margin`` (op ``">"``). ``a``, ``b``: what A and B are,
        in words. ``margin`` (>= 0): 0 by default; with basis ``"mc"`` it defaults to
        se_multiple x se (the standard error of the difference) and must equal it. The other
        arguments are those of :meth:`check`. Returns whether it holds."""
        if op not in ("<", ">"):
            raise ValueError(f"ordering {cid!r}: op={op!r}; '<' (A lower is better) or '>'")
        for name, words in (("a", a), ("b", b)):
            if not (isinstance(words, str) and words.strip()):
                raise ValueError(f"ordering {cid!r}: {name}= must say what {name.upper()} is")
        value, rival = plain(value), plain(rival)
        ev = self._evidence(cid, null_kind, rival, value, op, basis, basis_ref, se, se_multiple, paper, own, ref,
                            untrained_ok)
        half = ev["se_multiple"] * ev["se"] if basis == "mc" and ev["se"] is not None else None
        margin = plain(margin if margin is not None else (half if half is not None else 0.0))
        if not (real_number(margin) and margin >= 0):
            raise ValueError(f"ordering {cid!r}: margin={margin!r} must be a finite number >= 0")
        if half is not None and not math.isclose(margin, half, rel_tol=1e-6, abs_tol=1e-12):
            raise ValueError(f"ordering {cid!r}: margin {fmt(margin)} is not se_multiple x se = {fmt(half)}")
        threshold = rival - margin if op == "<" else rival + margin
        claim = Claim(cid, text, value, op, threshold, ref, meets(value, op, threshold), null=b.strip(),
                      null_value=rival, null_passed=None, form="ordering", a=a.strip(), margin=margin, **ev)
        return self._add(claim).holds

    def measure(self, cid: str, value, rival=None, *, se=None, threshold=None, margin=None,
                detail: str = "") -> bool | None:
        """Record the claim ``cid`` of the chapter's spec (:mod:`iclnb.bookkit.claimspec`) at the
        measured ``value``, one statement per claim: ``rival``, the rival's value, measured in the
        same run; ``se``, the standard error where the basis is ``mc``; ``threshold``, where the spec
        says it is ``measured`` in the run; ``margin``, an ordering's margin where the run computes
        it (else the spec's, or se_multiple x se); ``detail``, run-specific words appended to the
        statistic. Returns whether the value passes (None for a report)."""
        if cid not in self.spec:
            raise ValueError(f"claim {cid!r} is not in the claim spec of {self.chapter} "
                             f"(declared: {', '.join(self.spec) or 'none'})")
        sp = self.spec[cid]
        text = sp.statistic + (f" ({detail})" if detail else "")
        common = dict(ref=sp.where, paper=sp.paper, own=sp.whose == "book")
        if sp.question in ("effect", "mechanism"):
            ev = dict(null_kind=sp.null_kind, basis=sp.basis, basis_ref=sp.basis_ref, se=se,
                      se_multiple=sp.se_multiple, untrained_ok=sp.untrained_ok, **common)
            if sp.ordering:
                self.ordering(cid, text, value, rival, sp.compare, a=sp.statistic, b=sp.rival,
                              margin=sp.margin if margin is None else margin, **ev)
            else:
                bound = threshold if sp.threshold == "measured" else sp.threshold
                if bound is None:
                    raise ValueError(f"claim {cid!r}: its spec says the threshold is measured in the run "
                                     f"({sp.threshold_rule}); give threshold=")
                self.check(cid, text, value, sp.compare, bound, null=sp.rival, null_value=rival, **ev)
        elif sp.question == "sanity":
            self.sanity(cid, text, value, sp.compare, threshold if sp.threshold == "measured" else sp.threshold,
                        ref=sp.where)
        elif sp.question == "report":
            self.report(cid, text, value, **common)
        else:
            self.not_attempted(cid, text, sp.why, ref=sp.where, paper=sp.paper)
        claim = self.claims[-1]
        history = self._history().get(cid)
        claim.question, claim.rival_kind, claim.quote = sp.question, sp.rival_kind, sp.quote
        claim.amended = [{"when": a.when, "was": a.was, "why": a.why, "commit": a.commit} for a in sp.amended]
        claim.spec_commit, claim.spec_date = (history.commit, history.date) if history else ("unknown", "")
        claim.words = verdict(sp, claim.passed, claim.null_passed, finding=cid in self.findings)
        return claim.passed

    def _history(self) -> dict:
        """Per claim of the spec, when its entry last changed (git, read once)."""
        if getattr(self, "_spec_history", None) is None:
            source = chapter_source(self.chapter)
            self._spec_history = entry_history(source) if source is not None and self.spec else {}
        return self._spec_history

    def sanity(self, cid: str, text: str, value, op: str, threshold, ref: str = "") -> bool:
        """Record a sanity check ``value <op> threshold``: a check of the library's own exact math,
        which cannot fail except through a bug. Enforced like :meth:`check`, shown apart from the
        evidence, with no null."""
        value, threshold = self._comparison(op, value, threshold)
        return self._add(Claim(cid, text, value, op, threshold, ref, meets(value, op, threshold),
                               "sanity")).passed

    def report(self, cid: str, text: str, value, ref: str = "", paper=None, own: bool = False) -> None:
        """Record a number the chapter reports without a pass/fail threshold."""
        self._add(Claim(cid, text, plain(value), None, None, ref, None, "report", paper=plain(paper),
                        own=bool(own) or ref.strip().lower() == "ours"))

    def not_attempted(self, cid: str, text: str, why: str, ref: str = "", paper=None) -> None:
        """Record a claim of the paper in this chapter's scope that the run does not test, and why."""
        if not (isinstance(why, str) and why.strip()):
            raise ValueError(f"not-attempted claim {cid!r} needs a reason")
        self._add(Claim(cid, text, None, None, None, ref, None, "not_attempted", paper=plain(paper),
                        note=why.strip()))

    def skip_findings(self, *cids: str) -> None:
        """Declared findings that this run does not record because its parameters leave the claim
        out (e.g. a link the run does not train): not "missing", listed in the JSON."""
        for cid in cids:
            if cid not in self.findings:
                raise KeyError(f"{cid!r} is not a declared finding of {self.chapter}")
            if cid not in self.findings_skipped:
                self.findings_skipped.append(cid)

    def skip(self, *cids: str) -> None:
        """Claims of the spec that this run does not measure because its parameters leave them out
        (e.g. a head count the run does not train): not "never measured", listed in the JSON
        (``findings_skipped``, with the skipped findings)."""
        for cid in cids:
            if cid not in (self.spec or {}):
                raise KeyError(f"{cid!r} is not in the claim spec of {self.chapter}")
            if cid not in self.findings_skipped:
                self.findings_skipped.append(cid)

    def __getitem__(self, cid: str) -> Claim:
        found = [c for c in self.claims if c.id == cid]
        if not found:
            raise KeyError(f"no claim {cid!r} in {self.chapter}")
        return found[0]

    @property
    def failed(self) -> list[Claim]:
        """Enforced claims that do not hold: a failed sanity check, an evidence check whose value
        fails or whose null passes."""
        return [c for c in self.claims if (c.kind == "check" and c.holds is False and not c.words.startswith("holds"))
                or (c.kind == "sanity" and c.passed is False)]

    @property
    def unmeasured(self) -> list[str]:
        """Claims of the spec never measured (nor skipped as findings); not-attempted ones are
        recorded by :meth:`finish` itself."""
        done = {c.id for c in self.claims} | set(self.findings_skipped)
        return [cid for cid, sp in (self.spec or {}).items() if cid not in done and sp.question != "not_attempted"]

    @property
    def missing_findings(self) -> list[str]:
        """Declared findings never recorded nor skipped (a declaration that names no claim is an error)."""
        recorded = {c.id for c in self.claims} | set(self.findings_skipped)
        return [cid for cid in self.findings if cid not in recorded]

    @property
    def n_passed(self) -> int:
        return sum(c.holds is True and c.kind == "check" for c in self.claims)

    def to_dict(self) -> dict:
        kinds = [c.kind for c in self.claims]
        checks = [c for c in self.claims if c.kind == "check"]
        found = [c for c in self.claims if c.kind == "finding"]
        return {
            "chapter": self.chapter,
            "enforced": self.enforce,
            "enforcement": "claims enforced" if self.enforce else "claims not enforced",
            "passed": self.n_passed,
            "failed": len(self.failed),
            "not_reproduced": sum(c.kind == "finding" and not c.holds for c in self.claims),
            "not_attempted": kinds.count("not_attempted"),
            "sanity_passed": sum(c.passed is True and c.kind == "sanity" for c in self.claims),
            "strong": sum(c.strength == "strong" for c in checks),
            "weak": sum(c.strength != "strong" for c in checks),
            "sanity": kinds.count("sanity"),
            "reported": kinds.count("report"),
            "findings_declared": {k: sum(c.declared == k for c in found) for k in (*DECLARED, "unknown")},
            "findings_source": self.findings_source,
            "findings_skipped": list(self.findings_skipped),
            "missing_findings": self.missing_findings,
            "claims": [asdict(c) | {"status": c.verdict(self.enforce), "condition": c.condition, "group": c.group,
                                    "holds": c.holds} for c in self.claims],
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the JSON to ``path``, else where :func:`claims_target` said when the claims were created."""
        path = Path(path) if path else getattr(self, "_path", None) or claims_target(self.chapter)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, default=str))
        os.replace(tmp, path)
        return path

    def finish(self, show=None):
        """Write the JSON and raise :class:`ClaimsFailed` if enforced and a claim failed; ``show``,
        called before raising, displays the claims (the page's :class:`iclnb.bookkit.claims.Claims`
        shows its table, so a failing page still tells which claims failed)."""
        recorded = {c.id for c in self.claims}
        for cid, sp in (self.spec or {}).items():
            if sp.question == "not_attempted" and cid not in recorded:
                self.measure(cid, None)
        self.save()
        problems = [f"- {c.text}: measured {fmt(c.value)}, needs {c.condition}"
                    + (f"; its null ({c.null}) also meets it with {fmt(c.null_value)}, so the check "
                       "cannot tell the two apart" if c.passed and c.null_passed else "")
                    for c in self.failed]
        problems += [f"- finding {cid!r} was declared but never recorded" for cid in self.missing_findings]
        problems += [f"- claim {cid!r} of the spec was never measured" for cid in self.unmeasured]
        if self.enforce and problems:
            if show is not None:
                show()
            raise ClaimsFailed(f"{len(problems)} claim(s) of {self.chapter} failed:\n" + "\n".join(problems))
