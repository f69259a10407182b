import json
import math

import numpy as np
import pytest
import torch

from iclnb.bookkit.claims import Claims, ClaimsFailed, scorecard_rows

NULL = dict(null="a simpler explanation", basis="theory")


def ev(c, cid, text, value, op, threshold, null_value=None, **kw):
    """An evidence check whose null (by default a non-number) fails."""
    return c.check(cid, text, value, op, threshold, null_value=null_value, **(NULL | kw))


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
    c = Claims("ch", enforce=True, findings={"h8-diag": "below paper scale; longer training may help",
                                             "h4-diag": "below paper scale"})
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
    c.findings["fi"] = "does not reproduce"
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
        c.check("a", "a", 1, "<", 2, null="", null_value=3, basis="theory")
    with pytest.raises(ValueError, match="basis"):
        c.check("b", "b", 1, "<", 2, null="fixed window", null_value=3, basis="tuned")
    with pytest.raises(TypeError):
        c.check("c", "c", 1, "<", 2)  # no null at all: not an evidence check


def test_a_null_that_passes_fails_the_check(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    assert c.check("sep", "separates", 0.1, "<", 0.5, null="plain GD", null_value=0.9, basis="mc")
    assert not c.check("same", "does not separate", 0.1, "<", 0.5, null="plain GD", null_value=0.2, basis="mc",
                       paper=0.12)
    assert c["same"].passed and c["same"].null_passed and c["same"].status == "FAIL: null passes"
    assert [f.id for f in c.failed] == ["same"]
    h = c.table()._repr_html_()
    assert "plain GD: 0.9 (fails)" in h and "plain GD: 0.2 (passes)" in h and "(Monte Carlo error)" in h
    with pytest.raises(ClaimsFailed, match="cannot tell the two apart"):
        c.finish()
    data = json.loads(path.read_text())
    assert data["failed"] == 1 and data["claims"][1]["null_value"] == 0.2 and data["claims"][1]["paper"] == 0.12
    Claims("ch", enforce=False, claims=c.claims).finish()  # smoke runs: recorded, not enforced


def test_findings_are_declared_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(tmp_path / "c.json"))
    with pytest.raises(ValueError, match="findings"):
        Claims("x", findings={"a": ""})  # a finding says why
    c = Claims("x", findings={"never": "declared, not recorded"})
    with pytest.raises(ClaimsFailed, match="never recorded"):
        c.finish()
    c = Claims("x", findings={"f": "why"})
    with pytest.raises(ValueError, match="declared a finding"):
        c.sanity("f", "f", 1, "<", 2)


def test_not_attempted_and_scorecard():
    c = Claims("x")
    ev(c, "ok", "holds", 1, "<", 2, paper=1.1)
    c.findings["nr"] = "longer training would not change it"
    ev(c, "nr", "does not hold", 3, "<", 2)
    c.not_attempted("na", "the rate in sigma", "the sweep is too slow here", ref="Thm 3")
    c.sanity("s", "identity", 0, "<", 1)
    c.report("r", "a number", 1)
    with pytest.raises(ValueError, match="reason"):
        c.not_attempted("na2", "x", "")
    rows = scorecard_rows("Chapter X", c.to_dict())
    assert [(r[1], r[-1]) for r in rows] == [("ok", "reproduced"), ("nr", "not reproduced"),
                                              ("na", "not attempted")]
    assert rows[0][4] == "1.1" and rows[2][5] == "the sweep is too slow here"
    assert c.to_dict()["not_attempted"] == 1 and c["na"].status == "not attempted"
    h = c.table()._repr_html_()
    assert "not attempted" in h and "longer training would not change it" in h
