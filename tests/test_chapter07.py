"""Chapter 7 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter07_smoke(smoke_run):
    r = smoke_run(7)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    kinds = {c["id"]: c["kind"] for c in data["claims"]}
    checks = {"sign-match-every-phi", "zero-sum-every-phi", "step-softmax", "risk-every-phi",
              "kq-optimal-preconditioner", "risk-near-pgd"}
    assert checks <= set(kinds) and all(kinds[c] == "check" for c in checks)
    assert kinds["step-every-phi"] == "finding"
    assert kinds["gamma-mc-minimiser"] == "sanity" and kinds["pairs-every-phi"] == "report"
