import json
import math

import numpy as np
import pytest
import torch

from iclnb.claims import Claims, ClaimsFailed


def test_check_comparisons_and_nonfinite():
    c = Claims("x")
    assert c.check("lt", "lt", 1.0, "<", 2)
    assert not c.check("ge", "ge", 1, ">=", 2)
    assert c.check("in", "in", 0.5, "in", (0, 1))
    assert not c.check("out", "in", 1.5, "in", (0, 1))
    assert c.check("is", "is", True, "is", True)
    assert not c.check("is-number", "is", 1, "is", True)  # a number is not a boolean claim
    assert not c.check("nan", "nan fails", math.nan, "<", 1)
    assert not c.check("inf", "inf fails", math.inf, ">", 0)
    assert c.check("np", "numpy scalar", np.float64(0.1), "<", 1)
    assert c.check("torch", "torch scalar", torch.tensor(0.1), "<", 1)
    assert c.check("np-bool", "numpy bool", np.bool_(True), "is", True)
    c.report("rep", "reported only", 70.1)
    assert c.n_passed == 6 and len(c.failed) == 5
    assert c["rep"].passed is None and c["rep"].status == "reported" and c["lt"].status == "pass"


def test_ids_are_checked_and_unique():
    c = Claims("x")
    c.check("a-1", "first", 1, "<", 2)
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
    c = Claims("ch", enforce=True)
    assert not c.finding("h8-diag", "H=8 diag ratio", 0.96, ">=", 0.98, ref="Obs. 1")
    assert c.finding("h4-diag", "H=4 diag ratio", 0.99, ">=", 0.98)
    c.check("ok", "fine", 1, "<", 2)
    html = c.finish()._repr_html_()  # a failed finding does not raise
    assert "not reproduced" in html and "&gt;= 0.98" in html
    data = json.loads(path.read_text())
    assert data["passed"] == 1 and data["failed"] == 0 and data["not_reproduced"] == 1
    assert [r["status"] for r in data["claims"]] == ["not reproduced", "reproduced", "pass"]
    assert data["claims"][0]["kind"] == "finding" and data["claims"][0]["threshold"] == 0.98


def test_bad_op_and_bad_range():
    c = Claims("x")
    with pytest.raises(ValueError, match="op"):
        c.check("bad", "bad", 1, "~", 1)
    with pytest.raises(ValueError, match="lo, hi"):
        c.check("bad", "bad", 1, "in", 3)


def test_finish_writes_json_and_enforces(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    c.check("ok", "ok", 1, "<", 2, ref="Thm 1")
    table = c.finish()
    assert "Thm 1" in table._repr_html_() and "<th>paper</th>" in table._repr_html_()
    data = json.loads(path.read_text())
    assert data["passed"] == 1 and data["failed"] == 0 and data["claims"][0]["status"] == "pass"
    c.check("bad", "bad", 3, "<", 2)
    with pytest.raises(ClaimsFailed, match="bad: measured 3"):
        c.finish()
    assert json.loads(path.read_text())["failed"] == 1  # written before raising
    Claims("ch", enforce=False, claims=c.claims).finish()  # not enforced: no raise


def test_html_escapes_text():
    c = Claims("x")
    c.check("esc", "a < b & c", 1, "<", 2)
    assert "a &lt; b &amp; c" in c.table()._repr_html_()


def test_sanity_checks_are_enforced_and_grouped_apart(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    assert c.sanity("pre", "precondition by construction", True, "is", True, ref="Thm 1")
    c.report("num", "a number", 2.5)
    assert c.check("ev", "evidence", 0.1, "<", 1)
    assert not c.finding("fi", "a finding", 3, "<", 1)
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
