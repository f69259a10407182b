"""Chapter 5 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter05_smoke(smoke_run):
    r = smoke_run(5)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    kinds = {c["id"]: c["kind"] for c in data["claims"]}
    evidence = {"slope-even", "lin-fit", "lin-rho", "shifted-rho", "lin-angle", "linattn-even",
                "lin-beats-iso", "shifted-beats-iso", "cos4-beats-iso", "lin-near-oracle", "sweep-rho"}
    findings = {"quadratic-rho", "cos4-rho", "quadratic-beats-iso", "even-angle", "linattn-even"}
    assert (evidence - findings) <= {k for k, v in kinds.items() if v == "check"}
    assert findings <= {k for k, v in kinds.items() if v == "finding"}
    for c in data["claims"]:  # every evidence check carries its null's value
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["basis"] in ("theory", "mc")
    assert kinds["kernel-predict"] == "sanity"
    assert {"escape-linear", "escape-cos4", "sweep-gain-d", "linattn-linear"} <= {
        k for k, v in kinds.items() if v == "report"}
    assert kinds["thm4-n2"] == "not_attempted"
