"""The claim spec: entries validated at load, rivals that cannot pass refused for mechanism
questions, verdicts in words, and each entry's history read from git."""

import subprocess

import pytest

from iclnb.bookkit.claimspec import SpecError, entry_history, entry_lines, load_spec, parse_spec, verdict

MECH = {"statistic": "risk of the model over risk of the rival", "whose": "paper", "quote": "nearly optimal",
        "where": "§4", "question": "mechanism", "compare": "<", "threshold": "rival", "basis": "mc",
        "se_multiple": 3, "rival": "linear attention", "rival_kind": "trained"}
EFFECT = {"statistic": "rank correlation", "whose": "book", "question": "effect", "compare": ">=",
          "threshold": 0.9, "basis": "chosen", "rival": "the same windows shuffled", "rival_kind": "chance"}


def test_a_valid_spec_loads():
    specs = parse_spec({"m": MECH, "e": EFFECT, "s": {"statistic": "identity", "whose": "book",
                                                       "question": "sanity", "compare": "<", "threshold": 1e-9},
                        "n": {"statistic": "a rate", "quote": "q", "where": "Thm 9", "question": "not_attempted",
                              "why": "too slow here"}})
    assert specs["m"].ordering and specs["m"].null_kind == "competitor" and specs["m"].se_multiple == 3.0
    assert specs["e"].null_kind == "chance" and not specs["e"].ordering


@pytest.mark.parametrize("kind", ["constant", "closed form"])
def test_a_mechanism_claim_with_a_rival_that_cannot_pass_is_refused(kind):
    with pytest.raises(SpecError, match="cannot pass by construction"):
        parse_spec({"m": {**MECH, "rival_kind": kind}})


def test_an_effect_claim_needs_a_chance_rival():
    with pytest.raises(SpecError, match="effect's rival is a chance level"):
        parse_spec({"e": {**EFFECT, "rival_kind": "trained"}})


def test_every_problem_is_listed_at_once():
    bad = {"x": {**MECH, "quote": "", "basis": "theory", "threshold": "rival", "compare": "<="},
           "Y!": {}, "z": {**EFFECT, "colour": "red"}}
    with pytest.raises(SpecError) as e:
        parse_spec(bad)
    text = str(e.value)
    for part in ("quotes it", "names its source", "compare '<' or '>'", "'Y!' is not a claim id",
                 "unknown fields ['colour']"):
        assert part in text


def test_findings_and_amendments_are_dated():
    ok = {**MECH, "finding": {"declared": "after", "why": "failed at seed 0", "commit": "abc1234"},
          "amended": [{"when": "after", "was": ">= 7 of 8 in every set", "why": "seed 0 sat at 7 of 8"}]}
    spec = parse_spec({"m": ok})["m"]
    assert spec.finding.when == "after" and spec.amended[0].was == ">= 7 of 8 in every set"
    with pytest.raises(SpecError, match="what the rule was"):
        parse_spec({"m": {**MECH, "amended": [{"when": "after", "why": "x"}]}})
    with pytest.raises(SpecError, match="before or after"):
        parse_spec({"m": {**MECH, "finding": {"declared": "later", "why": "x"}}})


def test_verdicts_in_words():
    specs = parse_spec({"m": MECH, "e": EFFECT,
                        "f": {**MECH, "finding": {"declared": "before", "why": "x"}}})
    m, e, f = specs["m"], specs["e"], specs["f"]
    assert verdict(m, True, False) == "holds"
    assert verdict(m, True, True) == "holds, shared with linear attention"
    assert verdict(m, False, False) == "fails"
    assert verdict(f, False, None) == "not reproduced"
    assert verdict(f, True, False) == "holds (a declared finding)"
    assert verdict(e, True, False) == "holds (effect only)"
    assert verdict(e, True, True) == "fails: chance reads as much"


FRONT = """---
iclnb:
  description: x
  claims:
    first:
      statistic: a
      whose: book
      question: sanity
      compare: "<"
      threshold: 1
    second: {statistic: b, whose: book, question: sanity, compare: "<", threshold: 2}
  paper: {steps: 10}
---

# 1. A chapter
"""



def test_entry_history_from_git(tmp_path):
    src = tmp_path / "01_a.md"
    src.write_text(FRONT)
    assert entry_lines(src) == {"first": (5, 10), "second": (11, 11)}
    assert set(load_spec(src)) == {"first", "second"}
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    h = entry_history(src)
    assert h["first"].commit == head and len(h["first"].date) == 10
    src.write_text(FRONT.replace("threshold: 2", "threshold: 3"))
    h = entry_history(src)
    assert h["second"].commit == "uncommitted" and h["first"].commit == head


SPEC_CHAPTER = """---
iclnb:
  description: a chapter with a claim spec
  claims:
    beats-linear:
      statistic: risk of softmax attention
      quote: "clearly better than linear attention"
      where: Fig. 8
      question: mechanism
      compare: "<"
      threshold: rival
      basis: mc
      se_multiple: 2
      rival: linear attention, trained the same way
      rival_kind: trained
    pattern:
      statistic: diag ratio of the KQ block
      whose: book
      question: mechanism
      compare: ">="
      threshold: 0.98
      basis: chosen
      rival: linear attention's diag ratio
      rival_kind: trained
    ranked:
      statistic: rank correlation of w with L
      whose: book
      question: effect
      compare: ">="
      threshold: measured
      threshold_rule: the 95% quantile of the permutation distribution
      basis: mc
      se_multiple: 1
      rival: the same windows in a random order
      rival_kind: chance
    late: {statistic: a finding, whose: book, question: mechanism, compare: "<", threshold: 1, basis: chosen,
           rival: vanilla GD at its best step, rival_kind: tuned, finding: {declared: after, why: "seed 0 failed"}}
    size: {statistic: a number for the sweep table, whose: book, question: report}
    rate: {statistic: the convergence rate, quote: "rate 1/n", where: Thm 9, question: not_attempted,
           why: too slow here}
---

# 1. A chapter
"""


def spec_claims(tmp_path, monkeypatch, text=None, **kwargs):
    """The Claims of a chapter whose source (``text``, default SPEC_CHAPTER) declares a claim spec."""
    from iclnb.bookkit.claims import Claims

    src = tmp_path / "notebooks" / "01_spec.md"
    src.parent.mkdir(exist_ok=True)
    src.write_text(SPEC_CHAPTER if text is None else text)
    monkeypatch.setenv("ICLNB_CHAPTER_SOURCE", str(src))
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(tmp_path / "c.json"))
    return Claims("01_spec", **kwargs)


def test_claims_measured_from_the_spec(tmp_path, monkeypatch):
    from iclnb.bookkit.ledger import ClaimsFailed

    c = spec_claims(tmp_path, monkeypatch)
    assert c.measure("beats-linear", 0.10, rival=0.30, se=0.01)
    assert c.measure("pattern", 0.99, rival=0.985)  # the rival passes too: a shared verdict, not a failure
    assert c.measure("ranked", 0.95, rival=0.2, threshold=0.6, se=0.1, detail="p = 0.01")
    assert not c.measure("late", 2.0, rival=3.0)
    c.measure("size", 7)
    with pytest.raises(ValueError, match="not in the claim spec"):
        c.measure("nope", 1)
    table = c.finish()  # nothing failed: the shared verdict and the finding are results
    rows = {r["id"]: r for r in c.to_dict()["claims"]}
    assert rows["beats-linear"]["status"] == "holds" and rows["beats-linear"]["threshold"] == pytest.approx(0.28)
    assert rows["pattern"]["status"] == "holds, shared with linear attention's diag ratio"
    assert rows["ranked"]["status"] == "holds (effect only)" and rows["ranked"]["null_kind"] == "chance"
    assert rows["ranked"]["text"].endswith("(p = 0.01)")
    assert rows["late"]["kind"] == "finding" and rows["late"]["status"] == "not reproduced"
    assert rows["size"]["status"] == "reported" and rows["rate"]["status"] == "not attempted"
    assert rows["beats-linear"]["question"] == "mechanism" and rows["beats-linear"]["spec_commit"] == "unknown"
    assert "holds, shared with" in repr(table)
    bad = spec_claims(tmp_path, monkeypatch)
    bad.measure("beats-linear", 0.5, rival=0.3, se=0.01)
    with pytest.raises(ClaimsFailed) as e:
        bad.finish()
    assert "beats-linear" in str(e.value) or "risk of softmax" in str(e.value)
    assert "'pattern' of the spec was never measured" in str(e.value)


def test_a_chapter_spec_that_is_wrong_fails_when_the_claims_are_created(tmp_path, monkeypatch):

    with pytest.raises(SpecError, match="beats-linear: a mechanism claim with a constant rival"):
        spec_claims(tmp_path, monkeypatch, text=SPEC_CHAPTER.replace("rival_kind: trained\n    pattern",
                                                                     "rival_kind: constant\n    pattern"))


def test_the_claims_table_of_a_spec_chapter(tmp_path, monkeypatch):
    """The verdicts in words, the question, the rival and how it was obtained; reports collapsed."""

    amended = "rival_kind: trained\n      amended: [{when: after, was: '< rival', why: 'a margin'}]\n    pattern"
    c = spec_claims(tmp_path, monkeypatch, text=SPEC_CHAPTER.replace("rival_kind: trained\n    pattern", amended),
                    enforce=False)
    c.measure("beats-linear", 0.10, rival=0.30, se=0.01)
    c.measure("pattern", 0.99, rival=0.985)
    c.measure("ranked", 0.95, rival=0.2, threshold=0.6, se=0.1)
    c.measure("late", 2.0, rival=3.0)
    c.measure("size", 7)
    table = c.finish()
    html = table._repr_html_()
    assert "<details><summary>Reported numbers (no verdict): 1</summary>" in html
    assert "holds, shared with linear attention&#x27;s diag ratio (not enforced)" in html
    assert "“clearly better than linear attention” (Fig. 8)" in html and "[trained]: 0.3" in html
    assert "amended after a run that tested it: was &lt; rival; a margin" in html
    assert "Findings:" in html and "not attempted" in html


def test_verdict_box(tmp_path, monkeypatch):

    c = spec_claims(tmp_path, monkeypatch)
    c.measure("pattern", 0.99, rival=0.985)
    with pytest.raises(ValueError, match="not been measured"):
        c.box("beats-linear")
    box = c.box("pattern", how="linear attention is the strongest simpler rival")
    html = box._repr_html_()
    assert 'class="admonition note iclnb-verdict"' in html and "holds, shared with" in html
    assert "<summary>How this check was set</summary>" in html and "Question: mechanism" in html
    assert "Rival (trained): linear attention&#x27;s diag ratio = 0.985" in html
    assert "pattern: holds, shared with" in repr(box)


def test_findings_at_the_paper_preset():
    """At --preset paper a chapter that declares any finding_paper uses those alone (as the front
    matter's findings_paper replaced findings); one that declares none keeps its findings."""
    from iclnb.bookkit.claimspec import findings_in_force

    late = {"declared": "after", "why": "short training"}
    both = parse_spec({"a": {**MECH, "finding": late}, "b": {**MECH, "finding": late, "finding_paper": late}})
    assert set(findings_in_force(both, None)) == {"a", "b"}
    assert set(findings_in_force(both, "paper")) == {"b"}
    only = parse_spec({"a": {**MECH, "finding": late}})
    assert set(findings_in_force(only, "paper")) == {"a"}
