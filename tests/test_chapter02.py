"""Chapter 2 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter02_smoke(smoke_run):
    r = smoke_run(2)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    kinds = {c["id"]: c["kind"] for c in data["claims"]}
    assert {"kernel-rebuild", "linear-length", "softmax-length", "zero-sum-ov", "h2-diag-ratio"} <= set(kinds)
    assert kinds["h8-diag-ratio"] == kinds["h8-ov-last"] == "finding" and kinds["h2-diag-ratio"] == "check"
