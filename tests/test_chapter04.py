"""Chapter 4 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter04_smoke(smoke_run):
    r = smoke_run(4)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    kinds = {c["id"]: c["kind"] for c in data["claims"]}
    evidence = {"w-rank-affine", "w-rank-relu", "w-rank-cosine", "grid-w-optimal", "iso-median", "norm-growth",
                "w-sigma", "exponent-bracket", "sweep-w-optimal", "gen-same-l", "gen-class", "gen-up", "gen-down",
                "sigma-inverse"}
    assert {cid for cid, kind in kinds.items() if kind == "check"} == evidence
    assert kinds["softmax-beats-linear"] == "finding"  # declared before the run
    reports = {"exponent-optimal", "cosine-beyond", "gen-matched", "softmax-more-context", "fixed-more-context",
               "rate-n", "rate-n-fixed", "rate-sigma", "rate-sigma-fixed", "linear-no-intercept"}
    assert all(kinds[cid] == "report" for cid in reports)
    assert kinds["thm3-rates"] == "not_attempted"
    for c in data["claims"]:  # every evidence check carries its null's value from the run
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["basis"], c["id"]
