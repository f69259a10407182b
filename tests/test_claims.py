import json
import math

import numpy as np
import pytest
import torch

from iclnb.claims import Claims, ClaimsFailed


def test_check_comparisons_and_nonfinite():
    c = Claims("x")
    assert c.check("lt", 1.0, "<", 2)
    assert not c.check("ge", 1, ">=", 2)
    assert c.check("in", 0.5, "in", (0, 1))
    assert not c.check("in", 1.5, "in", (0, 1))
    assert c.check("is", True, "is", True)
    assert not c.check("is", 1, "is", True)  # a number is not a boolean claim
    assert not c.check("nan fails", math.nan, "<", 1)
    assert not c.check("inf fails", math.inf, ">", 0)
    assert c.check("numpy scalar", np.float64(0.1), "<", 1)
    assert c.check("torch scalar", torch.tensor(0.1), "<", 1)
    assert c.check("numpy bool", np.bool_(True), "is", True)
    c.report("reported only", 70.1)
    assert c.n_passed == 6 and len(c.failed) == 5
    assert c.claims[-1].passed is None


def test_bad_op_and_bad_range():
    c = Claims("x")
    with pytest.raises(ValueError, match="op"):
        c.check("bad", 1, "~", 1)
    with pytest.raises(ValueError, match="lo, hi"):
        c.check("bad", 1, "in", 3)


def test_finish_writes_json_and_enforces(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(path))
    c = Claims("ch", enforce=True)
    c.check("ok", 1, "<", 2, ref="Thm 1")
    table = c.finish()
    assert "Thm 1" in table._repr_html_()
    data = json.loads(path.read_text())
    assert data["passed"] == 1 and data["failed"] == 0 and data["claims"][0]["status"] == "pass"
    c.check("bad", 3, "<", 2)
    with pytest.raises(ClaimsFailed, match="bad: measured 3"):
        c.finish()
    assert json.loads(path.read_text())["failed"] == 1  # written before raising
    Claims("ch", enforce=False, claims=c.claims).finish()  # not enforced: no raise


def test_html_escapes_text():
    c = Claims("x")
    c.check("a < b & c", 1, "<", 2)
    assert "a &lt; b &amp; c" in c.table()._repr_html_()
