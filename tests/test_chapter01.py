"""Chapter 1 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter01_smoke(smoke_run):
    r = smoke_run(1)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    status = {c["id"]: c["status"] for c in data["claims"]}
    # the claims that do not depend on scale hold even at smoke size
    for cid in ("grad-autograd", "ws-m-holds", "ds-m-holds", "identity-error", "lemmas-hold"):
        assert status[cid] == "pass", cid
    assert {"icl-cosine", "icl-escaped", "adv-tight-within-10x"} <= set(status)
