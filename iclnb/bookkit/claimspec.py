"""Claims declared once as data: a chapter's claim spec, validated when it is loaded, and the
verdicts it gives in words.

A chapter declares each claim once, in a ``claims:`` block of its front matter (beside
``findings:``); a cell only measures it (:meth:`iclnb.bookkit.claims.Claims.measure`). An entry::

    claims:
      h4-split:
        statistic: "H = 4: initialisations in mode III (heads split per task)"
        whose: paper                      # or "book" (the book's own claim)
        quote: "an intriguing regime ... triggers a superposition phenomenon"
        where: "§5.4 (iii), App. A.3, Fig. 18"
        question: mechanism               # effect | mechanism | sanity | report | not_attempted
        compare: ">"                       # <, <=, >, >=, in; "is" (a sanity check: threshold true or false)
        threshold: rival                   # a number, [lo, hi], "rival" (A beats B), or "measured"
        basis: mc                          # theory | mc | paper | chosen
        se_multiple: 1                     # basis mc: the threshold is rival -/+ se_multiple x se
        rival: "four-head runs superposed (mode IV), by the same rule"
        rival_kind: trained    # trained | tuned | ablation | computed | chance | closed form | constant
        finding: {declared: after, why: "...", commit: abc1234}     # optional
        amended: [{when: after, was: "the old rule", why: "...", commit: abc1234}]   # optional

**The question** a claim answers decides what its rival must be:

* ``effect``: is the structure there? Its rival is a **chance** level, what the statistic reads
  when the effect is absent (a random subspace, a rank-0 task, shuffled labels). It can read
  "holds (effect only)", never more.
* ``mechanism``: is it the paper's mechanism rather than a simpler one? Its rival is the strongest
  alternative model or predictor, **trained** or **tuned** the same way on the same prompts, an
  **ablation** (the trained model with the tested part removed) or a simpler model **computed**
  exactly on the same inputs (an ODE without the tested term): one that could pass. A rival
  that cannot pass by construction (a **constant**, a **closed form** of the setup) proves
  nothing, so the loader refuses such an entry (:class:`SpecError`): ask the question as an
  effect against a chance level, or name a rival that could pass.
* ``sanity`` (the library's own exact math), ``report`` (a number without a verdict) and
  ``not_attempted`` (with ``why``) have no rival.

**Verdicts** (:func:`verdict`): ``holds`` (the value passes and the rival, which could pass,
fails), ``holds (effect only)`` (an effect whose chance level fails), ``holds, shared with
<rival>`` (the value and the rival both pass: the pattern belongs to the task, not to softmax; a
result, shown as one), ``fails``, ``not reproduced`` (a declared finding that fails),
``not attempted`` and ``reported``.

**History.** ``finding`` says when a claim was declared not to reproduce (before or after a run
that tested it); ``amended`` lists every change of its rule, statistic or threshold with the
rule before and whether it came after a run that tested it. The page reads the commit and date
at which each entry last changed from git (:func:`entry_history`). No page may say "decided
before the run" of an entry amended after one.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from iclnb.contract import CHAPTER_SOURCE, CLAIMS_JSON, PRESET

QUESTIONS = ("effect", "mechanism", "sanity", "report", "not_attempted")
RIVAL_KINDS = ("trained", "tuned", "ablation", "computed", "chance", "closed form", "constant")
# the rivals each question accepts: an ablation is the trained model with the tested part removed, not
# retrained; computed, a simpler model solved or integrated exactly on the same inputs (an ODE without the
# tested term, an exact solver) where it can reach the threshold; closed form, a closed form of the setup
# (the best multiple of a matrix the task fixes), and constant, cannot pass by construction
CAN_PASS = {"effect": ("chance",), "mechanism": ("trained", "tuned", "ablation", "computed")}
COMPARES = ("<", "<=", ">", ">=", "in")
BASES = ("theory", "mc", "paper", "chosen")
WHEN = ("before", "after")
FIELDS = {"statistic", "whose", "quote", "where", "question", "compare", "threshold", "threshold_rule", "basis",
          "basis_ref", "se_multiple", "margin", "paper", "rival", "rival_kind", "finding", "finding_paper",
          "amended", "untrained_ok", "why"}
ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
DECLARED = WHEN  # when a finding was declared: before the run, or after a failing run


class SpecError(ValueError):
    """A claim spec that does not hold together (every problem of the chapter in one message)."""


@dataclass(frozen=True)
class Declaration:
    """A finding's declaration, or an amendment of a rule (``was``: the rule before it)."""

    when: str  # "before" or "after" a run that tested it
    why: str
    commit: str = ""
    was: str = ""


@dataclass(frozen=True)
class ClaimSpec:
    """One claim of a chapter as declared (see the module docstring)."""

    id: str
    statistic: str
    question: str
    whose: str = "paper"
    quote: str = ""
    where: str = ""
    compare: str = ""
    threshold: object = None  # a number, [lo, hi], "rival" or "measured"
    threshold_rule: str = ""  # "measured": how the run computes it, in words
    basis: str = ""
    basis_ref: str = ""
    se_multiple: float | None = None
    margin: float | None = None
    paper: object = None
    rival: str = ""
    rival_kind: str = ""
    finding: Declaration | None = None
    finding_paper: Declaration | None = None
    amended: tuple = ()
    untrained_ok: str = ""
    why: str = ""  # not_attempted: why not

    @property
    def evidence(self) -> bool:
        return self.question in ("effect", "mechanism")

    @property
    def ordering(self) -> bool:
        """"A beats B": the threshold is the rival's own statistic (-/+ a margin)."""
        return self.threshold == "rival"

    @property
    def null_kind(self) -> str:
        """The rival's kind in the older claims vocabulary (the scorecard's strength)."""
        return "chance" if self.rival_kind == "chance" else "competitor"

    def finding_at(self, preset: str | None, paper_findings: bool | None = None) -> Declaration | None:
        """The declaration in force. At the paper preset, a chapter that declares any
        ``finding_paper`` uses those alone (``paper_findings``: whether it does; None: whether this
        entry does), as ``findings_paper`` replaced ``findings``; otherwise ``finding``."""
        paper = self.finding_paper is not None if paper_findings is None else paper_findings
        return self.finding_paper if preset == "paper" and paper else self.finding


def findings_in_force(specs: dict, preset: str | None) -> dict:
    """id -> the finding declaration in force for a chapter's spec at ``preset``
    (:meth:`ClaimSpec.finding_at`, decided for the whole chapter)."""
    paper = any(sp.finding_paper is not None for sp in specs.values())
    return {cid: d for cid, sp in specs.items() if (d := sp.finding_at(preset, paper)) is not None}


def _spec_declaration(cid: str, name: str, v, problems: list, amendment: bool = False) -> Declaration | None:
    keys = {"when", "why", "commit", "was"} if amendment else {"declared", "why", "commit"}
    if not isinstance(v, dict) or set(v) - keys:
        problems.append(f"{cid}: {name} must be a mapping of {sorted(keys)}, got {v!r}")
        return None
    when = v.get("when" if amendment else "declared")
    why, commit, was = (str(v.get(k) or "").strip() for k in ("why", "commit", "was"))
    if when not in WHEN:
        problems.append(f"{cid}: {name} must say when: before or after a run that tested it (got {when!r})")
    if not why:
        problems.append(f"{cid}: {name} needs why")
    if amendment and not was:
        problems.append(f"{cid}: an amendment says what the rule was before it (was: ...)")
    return Declaration(str(when), why, commit, was)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_entry(cid: str, raw, problems: list) -> ClaimSpec | None:
    """One entry of a ``claims:`` block, validated; each problem is appended to ``problems``."""
    if not (isinstance(cid, str) and ID.match(cid)):
        problems.append(f"{cid!r} is not a claim id (lower case letters, digits, - _ .)")
        return None
    if not isinstance(raw, dict):
        problems.append(f"{cid}: expected a mapping of fields, got {raw!r}")
        return None
    unknown = set(raw) - FIELDS
    if unknown:
        problems.append(f"{cid}: unknown fields {sorted(unknown)} (known: {sorted(FIELDS)})")
    n = len(problems)
    q = raw.get("question")
    text = lambda k: str(raw.get(k) or "").strip()  # noqa: E731
    if q not in QUESTIONS:
        problems.append(f"{cid}: question must be one of {QUESTIONS}, got {q!r}")
    if not text("statistic"):
        problems.append(f"{cid}: statistic: say what is measured, in words")
    whose = raw.get("whose", "paper")
    if whose not in ("paper", "book"):
        problems.append(f"{cid}: whose must be 'paper' or 'book', got {whose!r}")
    if whose == "paper" and not (text("quote") and text("where")):
        problems.append(f"{cid}: a claim of the paper quotes it (quote:) and says where (where:)")
    if q == "not_attempted" and not text("why"):
        problems.append(f"{cid}: a claim not attempted says why")
    compare, threshold = raw.get("compare"), raw.get("threshold")
    if q in ("effect", "mechanism", "sanity"):
        if compare not in COMPARES and not (q == "sanity" and compare == "is"):
            problems.append(f"{cid}: compare must be one of {COMPARES} ('is' for a sanity check of a true/false "
                            f"statement), got {compare!r}")
        ok = isinstance(threshold, bool) if compare == "is" else (
            _number(threshold) or threshold in ("rival", "measured")
            or (compare == "in" and isinstance(threshold, list) and len(threshold) == 2
                and all(map(_number, threshold))))
        if not ok:
            problems.append(f"{cid}: threshold must be a number, [lo, hi] with 'in', 'rival' or 'measured' "
                            f"(true or false with 'is'); got {threshold!r}")
        if threshold == "rival" and (q == "sanity" or compare not in ("<", ">")):
            problems.append(f"{cid}: threshold 'rival' (A beats B) needs compare '<' or '>' and a rival")
        if threshold == "measured" and not text("threshold_rule"):
            problems.append(f"{cid}: a threshold measured in the run says how (threshold_rule:)")
    if q in ("effect", "mechanism"):
        basis = raw.get("basis")
        if basis not in BASES:
            problems.append(f"{cid}: basis must be one of {BASES} (where the threshold comes from), got {basis!r}")
        if basis in ("theory", "paper") and not (text("basis_ref") or raw.get("paper") is not None):
            problems.append(f"{cid}: basis {basis} names its source (basis_ref:)")
        if basis == "mc" and not _number(raw.get("se_multiple")):
            problems.append(f"{cid}: basis mc gives the multiple of the standard error (se_multiple:)")
        kind = raw.get("rival_kind")
        if not text("rival"):
            problems.append(f"{cid}: an {q} claim names its rival, in words (rival:)")
        if kind not in RIVAL_KINDS:
            problems.append(f"{cid}: rival_kind must be one of {RIVAL_KINDS}, got {kind!r}")
        elif kind not in CAN_PASS[q]:
            why = ("a rival that cannot pass by construction proves nothing about the mechanism; ask it as an "
                   "effect against a chance level, or name a trained or tuned rival that could pass"
                   if q == "mechanism" else "an effect's rival is a chance level (what the statistic reads "
                   "without the effect); a trained or tuned rival makes it a mechanism question")
            problems.append(f"{cid}: a {q} claim with a {kind} rival: {why}")
    elif raw.get("rival") or raw.get("rival_kind"):
        problems.append(f"{cid}: a {q} claim has no rival")
    decl = {k: _spec_declaration(cid, k, raw[k], problems) if raw.get(k) is not None else None
            for k in ("finding", "finding_paper")}
    if (decl["finding"] or decl["finding_paper"]) and q not in ("effect", "mechanism"):
        problems.append(f"{cid}: only an effect or mechanism claim can be a finding")
    amended = raw.get("amended") or []
    if not isinstance(amended, list):
        problems.append(f"{cid}: amended is a list of amendments")
        amended = []
    amendments = tuple(a for a in (_spec_declaration(cid, "amended", a, problems, amendment=True) for a in amended)
                       if a)
    if len(problems) > n:
        return None
    num = lambda k: None if raw.get(k) is None else float(raw[k])  # noqa: E731
    return ClaimSpec(cid, text("statistic"), q, whose, text("quote"), text("where"), compare or "", threshold,
                     text("threshold_rule"), raw.get("basis") or "", text("basis_ref"), num("se_multiple"),
                     num("margin"), raw.get("paper"), text("rival"), raw.get("rival_kind") or "",
                     decl["finding"], decl["finding_paper"], amendments, text("untrained_ok"), text("why"))


def parse_spec(block, where: str = "claims") -> dict[str, ClaimSpec]:
    """A whole ``claims:`` block (id -> fields), validated; :class:`SpecError` lists every problem."""
    if not isinstance(block, dict):
        raise SpecError(f"{where}: expected a mapping of claim ids to their fields")
    problems: list[str] = []
    specs = {cid: parse_entry(cid, raw, problems) for cid, raw in block.items()}
    if problems:
        raise SpecError(f"{where}: {len(problems)} problem(s) in the claim spec:\n- " + "\n- ".join(problems))
    return specs


def front_matter(path: str | Path) -> dict:
    """The YAML front matter of a chapter source (``{}`` when it has none)."""
    import yaml  # installed with jupyter-book

    m = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|$)", Path(path).read_text(), re.S)
    data = yaml.safe_load(m.group(1)) if m else None
    return data if isinstance(data, dict) else {}


def load_spec(source: str | Path) -> dict[str, ClaimSpec]:
    """The claim spec of a chapter source (its front matter's ``iclnb: claims:``; ``{}`` when it
    declares none), validated."""
    block = (front_matter(source).get("iclnb") or {}).get("claims")
    return {} if block is None else parse_spec(block, f"{Path(source).name}: iclnb.claims")


# ---- comparing and showing measured values --------------------------------------------------
# A comparison maps (measured value, threshold) to pass/fail.
OPS = {
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "in": lambda v, t: t[0] <= v <= t[1],
    "is": lambda v, t: v is t,
}


def fmt(x) -> str:
    """A compact, readable rendering of a measured value or threshold."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    if isinstance(x, int):
        return f"{x:d}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
            return f"{x:.3g}"
        return f"{x:.4g}"
    return str(x)


def plain(x):
    """Turn numpy/torch scalars into plain Python numbers (JSON-safe, comparable)."""
    if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
        x = x.item()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    return x


def real_number(x) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def meets(value, op: str, threshold) -> bool:
    """Whether ``value <op> threshold``; a non-finite or non-numeric value fails every comparison
    but ``is``."""
    return value is threshold if op == "is" else real_number(value) and bool(OPS[op](value, threshold))


# ---- verdicts -----------------------------------------------------------------------------------
HOLDS, EFFECT, FAILS, NOT_REPRODUCED = "holds", "holds (effect only)", "fails", "not reproduced"
NOT_ATTEMPTED, REPORTED = "not attempted", "reported"


def shared(rival: str) -> str:
    return f"holds, shared with {rival}"


def verdict(spec: ClaimSpec, passed: bool | None, rival_passed: bool | None, preset: str | None = None,
            finding: bool | None = None) -> str:
    """The verdict, in words, of a measured claim: ``passed``, whether its value meets the
    threshold; ``rival_passed``, whether its rival meets the same threshold (None for an ordering,
    whose threshold is the rival itself)."""
    if spec.question == "not_attempted":
        return NOT_ATTEMPTED
    if spec.question == "report":
        return REPORTED
    if spec.question == "sanity":
        return HOLDS if passed else FAILS
    finding = spec.finding_at(preset) is not None if finding is None else finding
    if not passed:
        return NOT_REPRODUCED if finding else FAILS
    if rival_passed:
        words = FAILS + ": chance reads as much" if spec.question == "effect" else shared(spec.rival)
    else:
        words = EFFECT if spec.question == "effect" else HOLDS
    return words + (" (a declared finding)" if finding else "")


# ---- history from git ---------------------------------------------------------------------------
def entry_lines(source: str | Path) -> dict[str, tuple[int, int]]:
    """Each claim id's line range (1-based, inclusive) in the source's ``claims:`` block."""
    lines = Path(source).read_text().splitlines()
    out, start, current, indent = {}, None, None, None
    for i, line in enumerate(lines, 1):
        if start is None:
            if re.match(r"^\s+claims:\s*$", line):
                start, indent = i, len(line) - len(line.lstrip()) + 2
            continue
        stripped = line.strip()
        if line.strip() == "---" or (stripped and len(line) - len(line.lstrip()) < indent):
            break
        m = re.match(r"^\s{%d}([a-z0-9][a-z0-9_.-]*):" % indent, line)
        if m:
            if current:
                out[current] = (out[current][0], i - 1)
            current = m.group(1)
            out[current] = (i, i)
        elif current and stripped:
            out[current] = (out[current][0], i)
    return out


@dataclass(frozen=True)
class History:
    commit: str  # the last commit that changed the entry (short), "uncommitted" or "unknown"
    date: str  # its date (ISO), "" when uncommitted or unknown


def entry_history(source: str | Path) -> dict[str, History]:
    """Per claim id, the commit and date at which its spec entry last changed (``git blame`` of
    its lines; "uncommitted" where a line differs from HEAD, "unknown" without git)."""
    source = Path(source)
    ranges = entry_lines(source)
    try:
        out = subprocess.run(["git", "blame", "--porcelain", "--", source.name], cwd=source.parent,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is None or out.returncode != 0:
        return {cid: History("unknown", "") for cid in ranges}
    line_commit, times, current = {}, {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"^([0-9a-f]{40}) \d+ (\d+)", line)
        if m:
            current = m.group(1)
            line_commit[int(m.group(2))] = current
        elif line.startswith("committer-time ") and current:
            times[current] = int(line.split()[1])
    result = {}
    for cid, (a, b) in ranges.items():
        commits = [line_commit.get(i, "0" * 40) for i in range(a, b + 1)]
        if any(set(c) == {"0"} for c in commits):
            result[cid] = History("uncommitted", "")
            continue
        last = max(commits, key=lambda c: times.get(c, 0))
        when = datetime.datetime.fromtimestamp(times.get(last, 0), datetime.timezone.utc)
        result[cid] = History(last[:7], when.date().isoformat())
    return result


# ---- where a chapter's declarations and claims are read and written --------------------------
def chapter_source(chapter: str) -> Path | None:
    """The chapter's .md source: ``$ICLNB_CHAPTER_SOURCE`` when it names this chapter (the runner
    sets it), else ``notebooks/<chapter>.md`` in the working directory or a folder above it."""
    env = os.environ.get(CHAPTER_SOURCE)
    if env and Path(env).stem == chapter and Path(env).is_file():
        return Path(env)
    here = Path.cwd().resolve()
    found = [p for d in (here, *here.parents) for p in (d / "notebooks" / f"{chapter}.md", d / f"{chapter}.md")
             if p.parent.name == "notebooks" and p.is_file()]
    if not found:  # a downloaded notebook run outside a clone: the clone the package is installed from
        own = Path(__file__).resolve().parents[2] / "notebooks" / f"{chapter}.md"
        found = [own] if own.is_file() else []
    return found[0] if found else None


def finding_declaration(cid, v, dated: bool) -> dict:
    """A finding's declaration ``{declared, why, commit}``; ``dated=False`` (an explicit dict given
    to :class:`Claims`) also accepts a bare reason, declared "unknown"."""
    if not (isinstance(cid, str) and ID.match(cid)):
        raise ValueError(f"findings: {cid!r} is not a claim id")
    if isinstance(v, str) and not dated:
        v = {"declared": "unknown", "why": v}
    elif not isinstance(v, dict) or v.get("declared") not in DECLARED:
        raise ValueError(f"finding {cid!r}: declare it as {{declared: before | after, why: ..., commit: ...}} "
                         f"(after: after a failing run); got {v!r}")
    if set(v) - {"declared", "why", "commit"}:
        raise ValueError(f"finding {cid!r}: unknown fields {sorted(set(v) - {'declared', 'why', 'commit'})}")
    why, commit = v.get("why"), v.get("commit") or ""
    if not (isinstance(why, str) and why.strip()):
        raise ValueError(f"finding {cid!r} needs why it does not reproduce (would more training change it?)")
    if not isinstance(commit, str):
        raise ValueError(f"finding {cid!r}: commit={commit!r} must be a string (quote it in the front matter)")
    return {"declared": v["declared"], "why": why.strip(), "commit": commit.strip()}


def declared_findings(chapter: str) -> tuple[dict, str]:
    """The findings the chapter's front matter declares, and where they come from.

    Read from ``iclnb: findings:`` in :func:`chapter_source` (``iclnb: findings_paper:`` instead
    when ``$ICLNB_PRESET`` is ``paper`` and the chapter has that key); each entry is ``id:
    {declared: before | after, why: "...", commit: abc1234}`` (commit optional). ``({}, "")``
    when the source is not found."""
    path = chapter_source(chapter)
    if path is None:
        return {}, ""
    meta = front_matter(path).get("iclnb") or {}
    key = "findings_paper" if os.environ.get(PRESET) == "paper" and "findings_paper" in meta else "findings"
    found = meta.get(key) or {}
    if not isinstance(found, dict):
        raise ValueError(f"{path}: iclnb.{key} must map claim ids to declarations")
    return {cid: finding_declaration(cid, v, dated=True) for cid, v in found.items()}, f"{path.name}: iclnb.{key}"




def claims_target(chapter: str) -> Path:
    """The claims JSON's absolute path (``$ICLNB_CLAIMS_JSON``, else ``<chapter>.claims.json``, resolved
    in the kernel's working directory), its folder made: :class:`Claims` asks when it is created, so
    a path that cannot be written fails the first cell, naming it, not the last after training."""
    raw, cwd = os.environ.get(CLAIMS_JSON) or f"{chapter}.claims.json", Path.cwd()
    path = (cwd / Path(raw).expanduser()).absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK) or path.is_dir():
            raise PermissionError(f"{path} cannot be written")
    except OSError as e:
        raise OSError(f"the claims JSON of {chapter} cannot go to {path} (${CLAIMS_JSON}="
                      f"{os.environ.get(CLAIMS_JSON)!r}, in the kernel's working directory {cwd}): {e}; "
                      f"set {CLAIMS_JSON} to an absolute path") from e
    return path
