"""Chapter 4 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter04_smoke(smoke_run):
    r = smoke_run(4)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    claims = {c["id"]: c for c in data["claims"]}
    kinds = {cid: c["kind"] for cid, c in claims.items()}
    chance = {"w-rank-affine", "w-rank-relu", "w-rank-cosine", "norm-growth", "w-sigma"}
    competitor = {"grid-w-optimal", "adapt-risk", "exponent-matches-optimum", "sweep-w-optimal", "gen-same-l",
                  "gen-class", "gen-up", "gen-down", "sigma-inverse"}
    assert {cid for cid, kind in kinds.items() if kind == "check"} == chance | competitor
    for cid in chance:  # an order against the same values in a random order (a permutation test)
        assert claims[cid]["null_kind"] == "chance" and claims[cid]["strength"] == "strong", cid
    for cid in competitor | {"softmax-beats-linear"}:
        assert claims[cid]["null_kind"] == "competitor", cid
    for cid in ("adapt-risk", "gen-same-l"):  # A beats B, with both sides' own statistics
        assert claims[cid]["form"] == "ordering" and claims[cid]["basis"] == "mc", cid
    finding = claims["softmax-beats-linear"]
    assert finding["kind"] == "finding" and finding["declared"] == "after" and finding["commit"] == "4c6fbe1"
    assert data["findings_source"].endswith("iclnb.findings")
    reports = {"exponent-optimal", "exponent-bracket", "exponent-n-fixed", "iso-median", "iso-median-linear",
               "cosine-beyond", "gen-matched", "softmax-more-context", "fixed-more-context", "rate-n",
               "rate-n-fixed", "rate-sigma", "rate-sigma-fixed", "linear-no-intercept"}
    assert all(kinds[cid] == "report" for cid in reports)
    assert kinds["thm3-rates"] == "not_attempted"
    for c in data["claims"]:  # every evidence check carries its null's value from the run
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["basis"], c["id"]
            assert not c["flags"], (c["id"], c["flags"])
