import json
import math

import numpy as np
import pytest
import torch

from iclnb.bookkit.claims import Claims
from iclnb.bookkit.ledger import ClaimsFailed
from iclnb.bookkit.scorecard import scorecard_markdown

NULL = dict(null="a simpler explanation", null_kind="competitor", basis="theory", basis_ref="Theorem 1")


def _failing(op, threshold):
    """A null's value that fails ``<op> threshold``."""
    if op == "is":
        return not threshold
    if op in ("<", "<=", ">", ">="):
        return threshold + 1.5 if op in ("<", "<=") else threshold - 1.5
    pair = op == "in" and isinstance(threshold, (tuple, list)) and len(threshold) == 2
    return threshold[1] + 1.5 if pair else 0.0


def ev(c, cid, text, value, op, threshold, null_value=None, **kw):
    """An evidence check whose null (by default one that fails) is a competitor."""
    null_value = _failing(op, threshold) if null_value is None else null_value
    return c.check(cid, text, value, op, threshold, null_value=null_value, **(NULL | kw))


AFTER = {"declared": "after", "why": "fails at the defaults", "commit": "abc1234"}


def strong(c, cid, value, op, threshold, null_value, **kw):
    """A fully stated evidence check: a competitor null, a theory basis naming its result."""
    return c.check(cid, cid, value, op, threshold, **({"null": "a competitor", "null_value": null_value,
                                                       "null_kind": "competitor", "basis": "theory",
                                                       "basis_ref": "Theorem 2"} | kw))


def test_check_comparisons_and_nonfinite():
    c = Claims("x")
    assert ev(c, "lt", "lt", 1.0, "<", 2)
    assert not ev(c, "ge", "ge", 1, ">=", 2)
    assert ev(c, "in", "in", 0.5, "in", (0, 1))
    assert not ev(c, "out", "in", 1.5, "in", (0, 1))
    assert ev(c, "is", "is", True, "is", True, False)
    assert not ev(c, "is-number", "is", 1, "is", True)  # a number is not a boolean claim
    assert not ev(c, "nan", "nan fails", math.nan, "<", 1)
    assert not ev(c, "inf", "inf fails", math.inf, ">", 0)
    assert ev(c, "np", "numpy scalar", np.float64(0.1), "<", 1)
    assert ev(c, "torch", "torch scalar", torch.tensor(0.1), "<", 1)
    assert ev(c, "np-bool", "numpy bool", np.bool_(True), "is", True, False)
    c.report("rep", "reported only", 70.1)
    assert c.n_passed == 6 and len(c.failed) == 5
    assert c["rep"].passed is None and c["rep"].status == "reported" and c["lt"].status == "pass"


def test_ids_are_checked_and_unique():
    c = Claims("x")
    ev(c, "a-1", "first", 1, "<", 2)
    with pytest.raises(ValueError, match="used twice"):
        c.report("a-1", "again", 3)
    for bad in ("", "Has Space", "UPPER", 3):
        with pytest.raises(ValueError, match="claim id"):
            c.report(bad, "bad id", 1)
    with pytest.raises(KeyError):
        c["missing"]


def test_findings_keep_threshold_and_are_not_enforced(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True, findings={"h8-diag": AFTER, "h4-diag": AFTER})
    assert not ev(c, "h8-diag", "H=8 diag ratio", 0.96, ">=", 0.98, ref="Obs. 1")
    assert ev(c, "h4-diag", "H=4 diag ratio", 0.99, ">=", 0.98)
    ev(c, "ok", "fine", 1, "<", 2)
    html = c.finish()._repr_html_()  # a failed finding does not raise
    assert "not reproduced" in html and "&gt;= 0.98" in html
    data = json.loads(path.read_text())
    assert data["passed"] == 1 and data["failed"] == 0 and data["not_reproduced"] == 1
    assert [r["status"] for r in data["claims"]] == ["not reproduced", "reproduced", "pass"]
    assert data["claims"][0]["kind"] == "finding" and data["claims"][0]["threshold"] == 0.98


def test_bad_op_and_bad_range():
    c = Claims("x")
    with pytest.raises(ValueError, match="op"):
        ev(c, "bad", "bad", 1, "~", 1)
    with pytest.raises(ValueError, match="lo, hi"):
        ev(c, "bad", "bad", 1, "in", 3)


def test_finish_writes_json_and_enforces(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    ev(c, "ok", "ok", 1, "<", 2, ref="Thm 1")
    table = c.finish()
    assert "Thm 1" in table._repr_html_() and "<th>paper</th>" in table._repr_html_()
    data = json.loads(path.read_text())
    assert data["passed"] == 1 and data["failed"] == 0 and data["claims"][0]["status"] == "pass"
    ev(c, "bad", "bad", 3, "<", 2)
    with pytest.raises(ClaimsFailed, match="bad: measured 3"):
        c.finish()
    assert json.loads(path.read_text())["failed"] == 1  # written before raising
    Claims("ch", enforce=False, claims=c.claims).finish()  # not enforced: no raise


def test_html_escapes_text():
    c = Claims("x")
    ev(c, "esc", "a < b & c", 1, "<", 2)
    assert "a &lt; b &amp; c" in c.table()._repr_html_()


def test_sanity_checks_are_enforced_and_grouped_apart(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    assert c.sanity("pre", "precondition by construction", True, "is", True, ref="Thm 1")
    c.report("num", "a number", 2.5)
    assert ev(c, "ev", "evidence", 0.1, "<", 1)
    c.findings["fi"] = AFTER
    assert not ev(c, "fi", "a finding", 3, "<", 1)
    assert c["pre"].kind == "sanity" and c["pre"].group == "sanity" and c["ev"].group == "evidence"
    table = c.finish()
    # groups in a fixed order: evidence (checks and findings), reported numbers, sanity checks
    assert [[r["id"] for r in rows] for _, rows in table.groups()] == [["ev", "fi"], ["num"], ["pre"]]
    h = table._repr_html_()
    assert h.index("Evidence") < h.index("<code>ev</code>") < h.index("Reported numbers")
    assert h.index("Reported numbers") < h.index("Sanity checks") < h.index("<code>pre</code>")
    assert "Sanity checks" in repr(table)
    data = json.loads(path.read_text())
    assert data["passed"] == 1 and data["sanity_passed"] == 1 and data["failed"] == 0
    assert {r["id"]: r["group"] for r in data["claims"]} == {"pre": "sanity", "num": "report", "ev": "evidence",
                                                              "fi": "evidence"}
    assert not c.sanity("bug", "fails only through a bug", 2, "<", 1)
    assert [f.id for f in c.failed] == ["bug"]
    with pytest.raises(ClaimsFailed, match="fails only through a bug"):
        c.finish()
    groups = Claims("x").table().groups()
    assert groups == []  # no claims, no empty group headings


def test_evidence_needs_a_null_and_a_basis():
    c = Claims("x")
    with pytest.raises(ValueError, match="names no null"):
        c.check("a", "a", 1, "<", 2, null="", null_value=3, null_kind="competitor", basis="theory")
    with pytest.raises(ValueError, match="basis"):
        c.check("b", "b", 1, "<", 2, null="fixed window", null_value=3, null_kind="competitor", basis="tuned")
    with pytest.raises(TypeError):
        c.check("c", "c", 1, "<", 2)  # no null at all: not an evidence check


def test_a_null_that_passes_fails_the_check(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    assert c.check("sep", "separates", 0.1, "<", 0.5, null="plain GD", null_value=0.9, basis="mc",
                   null_kind="competitor", se=0.01, se_multiple=3)
    assert not c.check("same", "does not separate", 0.1, "<", 0.5, null="plain GD", null_value=0.2, basis="mc",
                       null_kind="competitor", se=0.01, se_multiple=3, paper=0.12)
    assert c["same"].passed and c["same"].null_passed and c["same"].status == "FAIL: null passes"
    assert [f.id for f in c.failed] == ["same"]
    h = c.table()._repr_html_()
    assert "plain GD: 0.9 (fails)" in h and "plain GD: 0.2 (passes)" in h and "(Monte Carlo: 3 × s.e. 0.01)" in h
    with pytest.raises(ClaimsFailed, match="cannot tell the two apart"):
        c.finish()
    data = json.loads(path.read_text())
    assert data["failed"] == 1 and data["claims"][1]["null_value"] == 0.2 and data["claims"][1]["paper"] == 0.12
    Claims("ch", enforce=False, claims=c.claims).finish()  # smoke runs: recorded, not enforced


def test_findings_are_declared_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(tmp_path / "c.json"))
    with pytest.raises(ValueError, match="finding 'a' needs why"):
        Claims("x", findings={"a": ""})  # a finding says why
    c = Claims("x", findings={"never": AFTER})
    with pytest.raises(ClaimsFailed, match="never recorded"):
        c.finish()
    c = Claims("x", findings={"f": AFTER})
    with pytest.raises(ValueError, match="declared a finding"):
        c.sanity("f", "f", 1, "<", 2)


def test_not_attempted_and_scorecard():
    c = Claims("x")
    ev(c, "ok", "holds", 1, "<", 2, paper=1.1)
    c.findings["nr"] = AFTER | {"why": "longer training would not change it"}
    ev(c, "nr", "does not hold", 3, "<", 2)
    c.not_attempted("na", "the rate in sigma", "the sweep is too slow here", ref="Thm 3")
    c.sanity("s", "identity", 0, "<", 1)
    c.report("r", "a number", 1)
    with pytest.raises(ValueError, match="reason"):
        c.not_attempted("na2", "x", "")
    page = "\n".join(scorecard_markdown([("Chapter X", "x", c.to_dict())]))
    assert "not attempted" in page and "na" in page
    assert c.to_dict()["not_attempted"] == 1 and c["na"].status == "not attempted"
    h = c.table()._repr_html_()
    assert "not attempted" in h and "longer training would not change it" in h


def test_null_kinds_and_strength(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch")
    assert strong(c, "comp", 0.1, "<", 0.5, 0.9)
    assert strong(c, "chance", 0.9, ">", 0.6, 0.5, null_kind="chance", null="a permutation")
    assert strong(c, "init", 0.99, ">=", 0.98, 0.3, null_kind="init", null="the same heads at initialisation")
    assert strong(c, "boolean", True, "is", True, False)  # a bool null for op "is"
    assert [c[i].strength for i in ("comp", "chance", "init")] == ["strong", "strong", "weak"]
    c.finish()
    data = json.loads(path.read_text())
    assert data["strong"] == 3 and data["weak"] == 1
    row = {r["id"]: r for r in data["claims"]}
    assert row["init"]["null_kind"] == "init" and row["init"]["strength"] == "weak"
    h = c.table()._repr_html_()
    assert "[competitor · strong] a competitor: 0.9 (fails)" in h and "[init · weak] the same heads" in h
    with pytest.raises(ValueError, match="null_kind='trained'"):
        strong(c, "bad-kind", 0.1, "<", 0.5, 0.9, null_kind="trained")


def test_a_null_must_be_a_finite_measured_number():
    c = Claims("x")
    for i, bad in enumerate((None, math.nan, math.inf, "n/a", True)):
        with pytest.raises(ValueError, match=f"'bad-{i}': its null's value"):
            strong(c, f"bad-{i}", 0.1, "<", 0.5, bad)
    with pytest.raises(ValueError, match="'bad-is'.*boolean"):
        strong(c, "bad-is", True, "is", True, 0.0)
    assert strong(c, "np", np.float64(0.1), "<", 0.5, torch.tensor(0.9))  # numpy / torch scalars are numbers
    with pytest.raises(ValueError, match="reciprocal"):
        strong(c, "recip", 0.5, "<", 1, 2.0)  # a ratio and its reciprocal: use ordering()


def test_ordering_records_both_sides(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", findings={"later": {"declared": "after", "why": "fails at the defaults", "commit": "abc1234"}})
    assert c.ordering("beats", "the model beats vanilla GD", 0.31, 0.44, "<", a="the model",
                      b="vanilla GD at its own step", null_kind="competitor", basis="chosen")
    cl = c["beats"]
    assert (cl.value, cl.null_value, cl.threshold, cl.margin, cl.null_passed) == (0.31, 0.44, 0.44, 0.0, None)
    assert cl.form == "ordering" and cl.condition == "< 0.44" and cl.strength == "strong"
    # basis mc: the margin is se_multiple x se (the s.e. of the difference)
    assert not c.ordering("close", "beats by 3 s.e.", 0.40, 0.44, "<", a="A", b="B", null_kind="competitor",
                          basis="mc", se=0.02, se_multiple=3)
    assert math.isclose(c["close"].threshold, 0.44 - 0.06) and c["close"].condition == "< 0.44 - 0.06"
    assert c.ordering("up", "higher is better", 0.9, 0.5, ">", a="A", b="B", null_kind="chance", basis="chosen",
                      margin=0.1)
    with pytest.raises(ValueError, match="not se_multiple x se"):
        c.ordering("bad-margin", "x", 0.1, 0.5, "<", a="A", b="B", null_kind="competitor", basis="mc", se=0.01,
                   se_multiple=3, margin=0.1)
    with pytest.raises(ValueError, match="op='<='"):
        c.ordering("bad-op", "x", 0.1, 0.5, "<=", a="A", b="B", null_kind="competitor", basis="chosen")
    with pytest.raises(ValueError, match="b= must say"):
        c.ordering("bad-b", "x", 0.1, 0.5, "<", a="A", b="", null_kind="competitor", basis="chosen")
    with pytest.raises(TypeError):
        c.ordering("no-kind", "x", 0.1, 0.5, "<", a="A", b="B", basis="chosen")  # the null's kind is required
    assert not c.ordering("later", "a finding", 0.5, 0.44, "<", a="A", b="B", null_kind="init", basis="chosen")
    assert c["later"].kind == "finding" and c["later"].strength == "weak"
    assert [f.id for f in c.failed] == ["close"]
    h = c.table()._repr_html_()
    assert "the model: 0.31" in h and "vanilla GD at its own step: 0.44 (its own statistic)" in h
    data = c.to_dict()
    assert {r["id"]: r["holds"] for r in data["claims"]} == {"beats": True, "close": False, "up": True,
                                                             "later": False}


def test_threshold_bases():
    c = Claims("x")
    strong(c, "th", 0.1, "<", 0.5, 0.9)
    strong(c, "mc", 0.1, "<", 0.5, 0.9, basis="mc", basis_ref="", se=0.1, se_multiple=4)
    strong(c, "pp", 0.1, "<", 0.5, 0.9, basis="paper", basis_ref="", paper=0.45)
    strong(c, "pr", 0.1, "<", 0.5, 0.9, basis="paper", basis_ref="Table 2")
    strong(c, "ch", 0.1, "<", 0.5, 0.9, basis="chosen", basis_ref="")
    assert (c["mc"].se, c["mc"].se_multiple) == (0.1, 4)
    cells = {r[0]: r[3] for r in map(c.table()._cells, c.to_dict()["claims"])}
    assert cells == {"th": "< 0.5 (theory: Theorem 2)", "mc": "< 0.5 (Monte Carlo: 4 × s.e. 0.1)",
                     "pp": "< 0.5 (the paper's 0.45)", "pr": "< 0.5 (the paper: Table 2)", "ch": "< 0.5 (chosen)"}
    # each basis names what it rests on
    for basis, needs in (("theory", "basis_ref="), ("mc", "se="), ("paper", "paper=")):
        with pytest.raises(ValueError, match=f"basis='{basis}' needs {needs}"):
            strong(c, f"bare-{basis}", 0.1, "<", 0.5, 0.9, basis=basis, basis_ref="")
    with pytest.raises(ValueError, match="se_multiple"):
        strong(c, "half-mc", 0.1, "<", 0.5, 0.9, basis="mc", se=0.1)  # half the mc fields is an error
    with pytest.raises(ValueError, match="se="):
        strong(c, "neg-se", 0.1, "<", 0.5, 0.9, basis="mc", se=-1, se_multiple=3)
    with pytest.raises(ValueError, match="basis='tuned'"):
        strong(c, "tuned", 0.1, "<", 0.5, 0.9, basis="tuned")


def test_every_weaker_form_is_refused():
    s = Claims("x")
    with pytest.raises(TypeError, match="null_kind"):
        s.check("a", "a", 0.1, "<", 0.5, null="b", null_value=0.9, basis="chosen")
    with pytest.raises(ValueError, match="not dated"):
        Claims("x", findings={"f": "why, but not when"})
    s.findings["late"] = "added after construction"
    with pytest.raises(ValueError, match="'late' is not dated"):
        strong(s, "late", 0.1, "<", 0.5, 0.9)
    assert strong(s, "ok", 0.1, "<", 0.5, 0.9)


FRONT = """---
jupytext:
  text_representation: {extension: .md}
iclnb:
  description: a chapter
  findings:
    h3-ov-last: {declared: after, why: "still forming at this length", commit: 8517d88}
    follows: {declared: before, why: "the 2H numbers leave a part out"}
  findings_paper:
    follows: {declared: before, why: "the 2H numbers leave a part out"}
---

# A chapter
"""


def test_findings_from_the_front_matter(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    src = tmp_path / "notebooks" / "05_ch.md"
    src.write_text(FRONT)
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")  # the fallback: notebooks/<chapter>.md in a folder above the cwd
    monkeypatch.delenv("ICLNB_CHAPTER_SOURCE", raising=False)
    monkeypatch.delenv("ICLNB_PRESET", raising=False)
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(tmp_path / "c.json"))
    c = Claims("05_ch", enforce=True)
    assert c.findings_source == "05_ch.md: iclnb.findings" and set(c.findings) == {"h3-ov-last", "follows"}
    assert not strong(c, "h3-ov-last", 0.988, ">=", 0.99, 0.1, null_kind="init")
    assert not strong(c, "follows", 2.8, "<=", 1, 4.1)
    assert (c["h3-ov-last"].declared, c["h3-ov-last"].commit) == ("after", "8517d88")
    h = c.finish()._repr_html_()  # findings are never enforced
    assert "(declared after a failing run (commit 8517d88)): still forming" in h
    assert "<code>follows</code> (declared before the run)" in h
    assert h.count("declared before the run") == 1  # the wording comes from the field, never hard-coded
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["findings_declared"] == {"before": 1, "after": 1, "unknown": 0}
    # the paper preset: findings_paper replaces the default findings
    monkeypatch.setenv("ICLNB_PRESET", "paper")
    assert set(Claims("05_ch").findings) == {"follows"}
    # the runner's $ICLNB_CHAPTER_SOURCE wins over the walk up from the cwd
    other = tmp_path / "elsewhere" / "05_ch.md"
    other.parent.mkdir()
    other.write_text(FRONT.replace("findings_paper", "unused"))
    monkeypatch.setenv("ICLNB_CHAPTER_SOURCE", str(other))
    assert set(Claims("05_ch").findings) == {"h3-ov-last", "follows"}
    # an explicit dict replaces the front matter (tests); every finding is dated
    c = Claims("05_ch", findings={"x": AFTER})
    assert c.findings_source == "explicit"
    ev(c, "x", "x", 3, "<", 1)
    assert c["x"].declared == "after"
    with pytest.raises(ValueError, match="not dated"):
        Claims("05_ch", findings={"x": "a reason"})


def test_skipped_findings_and_bad_declarations(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(tmp_path / "c.json"))
    c = Claims("x", findings={"a": {"declared": "before", "why": "w"}, "b": {"declared": "after", "why": "w"}})
    ev(c, "a", "a", 3, "<", 1)
    with pytest.raises(ClaimsFailed, match="'b' was declared but never recorded"):
        c.finish()
    c.skip_findings("b")  # this run's parameters leave claim b out
    c.finish()
    assert json.loads((tmp_path / "c.json").read_text())["findings_skipped"] == ["b"]
    with pytest.raises(KeyError):
        c.skip_findings("zz")
    for bad, match in (({"declared": "during", "why": "w"}, "before | after"), ({"declared": "after"}, "needs why"),
                       ({"declared": "after", "why": "w", "commit": 1234567}, "quote it"),
                       ({"declared": "after", "why": "w", "when": "x"}, "unknown fields")):
        with pytest.raises(ValueError, match=match):
            Claims("x", findings={"a": bad})
    src = tmp_path / "notebooks" / "y.md"
    src.parent.mkdir()
    src.write_text(FRONT.replace('{declared: before, why: "the 2H numbers leave a part out"}', '"a bare reason"'))
    monkeypatch.setenv("ICLNB_CHAPTER_SOURCE", str(src))
    with pytest.raises(ValueError, match="'follows': declare it as"):
        Claims("y")  # the front matter must date every finding


def test_not_enforced_never_reads_as_pass(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=False)
    strong(c, "ok", 0.1, "<", 0.5, 0.9)
    strong(c, "bad", 0.7, "<", 0.5, 0.9)
    strong(c, "same", 0.1, "<", 0.5, 0.2)
    c.sanity("s", "identity", 0, "<", 1)
    table = c.finish()  # not enforced: no raise
    data = json.loads(path.read_text())
    assert data["enforced"] is False and data["enforcement"] == "claims not enforced"
    assert {r["id"]: r["status"] for r in data["claims"]} == {
        "ok": "holds (not enforced)", "bad": "fails (not enforced)", "same": "fails: null passes (not enforced)",
        "s": "holds (not enforced)"}
    h = table._repr_html_()
    assert "Claims not enforced" in h and ">pass<" not in h
    assert repr(table).startswith("Claims not enforced")
    assert Claims("ch", claims=c.claims).to_dict()["claims"][0]["status"] == "pass"  # enforced: pass


def test_to_dict_keeps_its_keys():
    c = Claims("x")
    strong(c, "a", 0.1, "<", 0.5, 0.9, own=True)
    c.report("r", "a number", 3, ref="ours")
    d = c.to_dict()
    old = {"chapter", "enforced", "passed", "failed", "not_reproduced", "not_attempted", "sanity_passed",
           "missing_findings", "claims"}
    assert old <= set(d) and {"strong", "weak", "sanity", "reported", "findings_declared", "enforcement"} <= set(d)
    row = d["claims"][0]
    assert {"id", "text", "value", "op", "threshold", "ref", "passed", "kind", "null", "null_value", "null_passed",
            "basis", "paper", "note", "status", "condition", "group"} <= set(row)
    assert {"null_kind", "strength", "form", "basis_ref", "se", "se_multiple", "declared", "own",
            "holds"} <= set(row)
    assert row["own"] is True and d["claims"][1]["own"] is True  # ref "ours" marks the book's own claim
    assert "the book's own" in c.table()._cells(row)[6]
    json.dumps(d)  # JSON-safe
