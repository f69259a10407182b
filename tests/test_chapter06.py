"""Chapter 6 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json

CHECKS = ("h4-split", "h2-shared-dgd", "h3-near-h4", "risk-h1-h2", "risk-h2-h3", "risk-h3-h4", "h3-superposed")


def test_chapter06_smoke(smoke_run):
    r = smoke_run(6)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    claims = {c["id"]: c for c in data["claims"]}
    assert set(CHECKS) <= set(claims)
    assert all(claims[c]["kind"] in ("check", "finding") for c in CHECKS)
    assert all(claims[c]["null_kind"] == "competitor" for c in CHECKS)
    assert claims["h4-split"]["form"] == "ordering" and claims["risk-h3-h4"]["basis"] == "mc"
    assert claims["support-dgd-exact"]["kind"] == "sanity" and claims["kernel-rebuild"]["kind"] == "report"
    assert claims["h3-paper-layout"]["kind"] == "report" and claims["h1-overlap-weight"]["kind"] == "report"
    assert claims["more-tasks"]["kind"] == "not_attempted"
