"""Chapter 7 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter07_smoke(smoke_run):
    r = smoke_run(7)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    by_id = {c["id"]: c for c in data["claims"]}
    checks = {"zero-sum-every-phi", "kq-diagonal-every-phi", "risk-every-phi", "length-every-phi", "zero-sum-rho",
              "kq-optimal-preconditioner-rho0.5", "kq-optimal-preconditioner-rho0.8",
              "risk-vs-sinv-rho0.5", "risk-vs-sinv-rho0.8"}
    assert checks <= set(by_id)
    # the fitted step: its rival (vanilla GD fitted the same way) lands on eta* too, so softmax's is
    # reported and every activation's is a finding declared after its first run
    assert by_id["step-softmax"]["kind"] == "report"
    assert by_id["step-every-phi"]["kind"] == "finding" and by_id["step-every-phi"]["declared"] == "after"
    assert by_id["step-every-phi"]["null_kind"] == "competitor"
    assert all(by_id[c]["kind"] in ("check", "finding") and by_id[c]["null_kind"] for c in checks)
    # the circuit patterns against trained two-head linear attention: those it shows too are the
    # task's (reported), the others are checked against it
    for cid in ("zero-sum-every-phi", "kq-diagonal-every-phi", "zero-sum-rho"):
        assert by_id[cid]["null_kind"] == "competitor" and "linear attention" in by_id[cid]["null"]
    for cid in ("sign-match-every-phi", "ov-last-every-phi", "sign-match-rho"):
        assert by_id[cid]["kind"] == "report" and "linear attention" in by_id[cid]["text"]
    for cid in ("kq-optimal-preconditioner-rho0.5", "risk-vs-sinv-rho0.8"):
        assert by_id[cid]["form"] == "ordering" and by_id[cid]["null_kind"] == "competitor"
    assert by_id["risk-vs-sinv-rho0.5"]["basis"] == "mc" and by_id["risk-vs-sinv-rho0.5"]["se"] > 0
    assert by_id["gamma-mc-minimiser"]["kind"] == "sanity" and by_id["gamma-to-sinv-sweep"]["kind"] == "sanity"
    assert by_id["step-fit-exact"]["kind"] == "sanity" and by_id["pairs-every-phi"]["kind"] == "report"
    assert by_id["dynamics-every-phi"]["kind"] == "not_attempted"
    assert not data["missing_findings"]
