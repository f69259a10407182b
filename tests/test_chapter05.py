"""Chapter 5 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter05_smoke(smoke_run):
    r = smoke_run(5)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    claims = {c["id"]: c for c in data["claims"]}
    kinds = {k: c["kind"] for k, c in claims.items()}
    checks = {"lin-fit", "lin-rho", "shifted-rho", "lin-angle", "lin-beats-iso", "shifted-beats-iso",
              "cos4-beats-iso", "lin-near-oracle", "gauss-even-rho",
              "sweep-rho"}
    findings = {"quadratic-rho", "cos4-rho", "even-angle", "linattn-even", "even-perp-k1", "quadratic-beats-iso"}
    assert checks <= {k for k, v in kinds.items() if v == "check"}
    assert findings <= {k for k, v in kinds.items() if v == "finding"}
    assert {claims[f]["declared"] for f in ("even-angle", "linattn-even", "even-perp-k1")} == {"after"}
    assert {claims[f]["declared"] for f in ("quadratic-rho", "cos4-rho", "quadratic-beats-iso")} == {"before"}
    for c in data["claims"]:  # every evidence check faces a measured rival
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["null_kind"] == "competitor"
            assert c["basis"] in ("chosen", "mc")
    for cid in ("lin-beats-iso", "quadratic-beats-iso", "even-perp-k1"):
        assert claims[cid]["form"] == "ordering"
    assert claims["lin-near-oracle"]["op"] == "in"
    assert kinds["kernel-predict"] == "sanity" and kinds["slope-even"] == "sanity"
    assert {"escape-linear", "escape-cos4", "sweep-gain-d", "linattn-linear", "asym-max", "sym-part",
            "even-reflect-z", "lin-c-ratio", "lin-oracle-z", "even-perp-sphere-k1",
            "even-perp-gaussian-k1"} <= {k for k, v in kinds.items() if v == "report"}
    assert kinds["thm4-n2"] == "not_attempted"
