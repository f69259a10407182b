"""Chapter 2 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter02_smoke(smoke_run):
    r = smoke_run(2)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False and not data["missing_findings"]
    claims = {c["id"]: c for c in data["claims"]}
    kinds = {cid: c["kind"] for cid, c in claims.items()}
    assert {"kernel-rebuild", "linear-length", "softmax-length", "zero-sum-ov", "h2-diag-ratio",
            "own-step-debiased", "own-step-fixed", "sign-match", "insensitive"} <= set(kinds)
    # below the paper's training length the H = 8 per-head thresholds are declared findings
    assert kinds["h8-diag-ratio"] == kinds["h8-ov-last"] == "finding" and kinds["h2-diag-ratio"] == "check"
    assert kinds["follows-dgd-own"] == "finding"
    # the audit's moves: the step and the manifold are reported, length generalisation is reported,
    # linear attention's failure is true by construction (sanity)
    assert kinds["step-dgd-optimum"] == kinds["manifold-mu"] == kinds["softmax-length"] == "report"
    assert kinds["linear-length"] == "sanity" and kinds["insensitive"] == "not_attempted"
    # every evidence check names its null and carries a value for it
    for c in claims.values():
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["basis"], c["id"]
