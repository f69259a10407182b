"""Chapter 4 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter04_smoke(smoke_run):
    r = smoke_run(4)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    kinds = {c["id"]: c["kind"] for c in data["claims"]}
    assert {"w-rank-affine", "w-rank-relu", "w-rank-cosine", "grid-w-optimal", "iso-median", "w-sigma",
            "exponent-bracket", "sweep-w-optimal", "gen-matched", "gen-class", "gen-up", "gen-down",
            "softmax-beats-linear", "softmax-more-context", "sigma-inverse"} <= set(kinds)
    assert kinds["exponent-optimal"] == kinds["cosine-beyond"] == "report"
