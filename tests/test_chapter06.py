"""Chapter 6 runs end to end with its tiny smoke parameters (claims recorded, not enforced), its
claims measured from the spec in its front matter."""

import json

from iclnb.bookkit.claimspec import load_spec
from iclnb.bookkit.runner import find_chapter

MECHANISM = ("h4-split", "h3-near-h4", "risk-h1-h2", "risk-h2-h3", "risk-h3-h4")
# readings whose only rival cannot pass (a closed form out of reach, a split that fails by counting)
REPORTED = ("h2-shared-dgd", "h3-superposed", "reach-structure")


def test_chapter06_spec():
    spec = load_spec(find_chapter(6).path)
    assert all(spec[c].question == "mechanism" and spec[c].rival_kind == "trained" for c in MECHANISM)
    assert all(spec[c].question == "report" for c in REPORTED)
    assert spec["h4-split"].finding.when == "after" and spec["h4-split"].finding_paper.when == "before"
    assert [a.commit for a in spec["h3-near-h4"].amended][:2] == ["3905c79", "eb16b4e"]
    assert spec["h3-near-h4"].basis == "chosen" and spec["risk-h3-h4"].whose == "book"


def test_chapter06_smoke(smoke_run):
    r = smoke_run(6)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    claims = {c["id"]: c for c in data["claims"]}
    assert set(load_spec(find_chapter(6).path)) == set(claims)  # every entry measured once
    assert all(claims[c]["kind"] in ("check", "finding") for c in MECHANISM)
    assert all(claims[c]["null_kind"] == "competitor" and claims[c]["rival_kind"] == "trained" for c in MECHANISM)
    assert claims["h4-split"]["form"] == "ordering" and claims["risk-h3-h4"]["basis"] == "mc"
    assert claims["h4-split"]["kind"] == "finding" and claims["h4-split"]["declared"] == "after"
    assert all(claims[c]["kind"] == "report" for c in REPORTED)
    assert claims["support-dgd-exact"]["kind"] == "sanity" and claims["kernel-rebuild"]["kind"] == "report"
    assert claims["h3-paper-layout"]["kind"] == "report" and claims["h1-overlap-weight"]["kind"] == "report"
    assert claims["h4-mode-iii"]["kind"] == "report" and len(claims["h4-mode-iii"]["value"]) == 3
    assert claims["more-tasks"]["kind"] == "not_attempted"
