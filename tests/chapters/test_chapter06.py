"""Chapter 6 runs end to end with its tiny smoke parameters (claims recorded, not enforced), its
claims measured from the spec in its front matter."""


from iclnb.bookkit.claimspec import load_spec
from iclnb.bookkit.runner import find_chapter

MECHANISM = ("h4-split", "h3-opposite-sign", "risk-h1-h2", "risk-h2-h3", "risk-h3-h4")
TUNED = ("h2-shared-dgd", "h3-near-h4")  # rivals fitted on the fit stream: isotropic dGD, no opposite-sign head
EFFECT = ("h1-overlap-weight", "h2-overlap-weight")  # against 1, the ratio that ignores the overlap
# readings whose only rival cannot pass (a split that fails by counting, two heads' structure)
REPORTED = ("h3-reaches-a1", "reach-structure", "h3-heads-both", "global-pattern", "h2-scale")


def test_chapter06_spec():
    spec = load_spec(find_chapter(6).path)
    assert all(spec[c].question == "mechanism" and spec[c].rival_kind == "trained" for c in MECHANISM)
    assert all(spec[c].question == "mechanism" and spec[c].rival_kind == "tuned" for c in TUNED)
    assert all(spec[c].question == "effect" and spec[c].rival_kind == "chance" for c in EFFECT)
    assert all(spec[c].question == "report" for c in REPORTED)
    assert spec["h4-split"].finding.when == "after" and spec["h4-split"].finding_paper.when == "before"
    assert spec["h3-opposite-sign"].finding.when == "after" and spec["h3-opposite-sign"].finding.commit
    assert [a.commit for a in spec["h3-near-h4"].amended][:2] == ["3905c79", "eb16b4e"]
    assert all(a.commit for c in spec for a in spec[c].amended)  # every amendment dated
    assert spec["h3-near-h4"].basis == "chosen" and spec["risk-h3-h4"].whose == "book"


def test_chapter06_smoke(smoke_run):
    r = smoke_run(6)
    data = r.claims  # the run's claims JSON (smoke_run asserts it is not enforced)
    claims = {c["id"]: c for c in data["claims"]}
    assert set(load_spec(find_chapter(6).path)) == set(claims)  # every entry measured once
    assert all(claims[c]["kind"] in ("check", "finding") for c in MECHANISM + TUNED + EFFECT)
    assert all(claims[c]["null_kind"] == "competitor" and claims[c]["rival_kind"] == "trained" for c in MECHANISM)
    assert claims["h4-split"]["form"] == "ordering" and claims["risk-h3-h4"]["basis"] == "mc"
    assert claims["h3-opposite-sign"]["form"] == "ordering" and claims["h2-shared-dgd"]["form"] == "ordering"
    assert claims["h4-split"]["kind"] == "finding" and claims["h4-split"]["declared"] == "after"
    assert all(claims[c]["kind"] == "report" for c in REPORTED)
    assert claims["support-dgd-exact"]["kind"] == "sanity" and claims["kernel-rebuild"]["kind"] == "report"
    assert claims["h3-paper-layout"]["kind"] == "report" and claims["h3-near-h4"]["null_value"] is not None
    assert claims["h4-mode-iii"]["kind"] == "report" and len(claims["h4-mode-iii"]["value"]) == 3
    assert claims["more-tasks"]["kind"] == "not_attempted"
