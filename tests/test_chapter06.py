"""Chapter 6 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter06_smoke(smoke_run):
    r = smoke_run(6)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    kinds = {c["id"]: c["kind"] for c in data["claims"]}
    assert {"h4-split", "h3-superposed", "h3-near-h4", "risk-decreases", "reduction-h3"} <= set(kinds)
    assert all(kinds[c] == "check" for c in ("h4-split", "h3-superposed", "h3-near-h4", "risk-decreases",
                                             "reduction-h3"))
    assert kinds["support-dgd-exact"] == "sanity" and kinds["kernel-rebuild"] == "report"
    assert kinds["more-tasks"] == "not_attempted"
