"""Chapter 1 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter01_smoke(smoke_run):
    r = smoke_run(1)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    status = {c["id"]: c["status"] for c in data["claims"]}
    group = {c["id"]: c["group"] for c in data["claims"]}
    # the claims that do not depend on scale hold even at smoke size
    for cid in ("grad-autograd", "ws-m-holds", "ds-m-holds", "identity-error", "lemmas-hold"):
        assert status[cid] == "pass", cid
    assert {"icl-cosine", "icl-escaped-min", "icl-pred-diff-discriminates", "icl-closer-to-gd",
            "icl-step-size", "icl-n25-pred-diff", "icl-raw-vs-centred", "adv-tight-within-10x"} <= set(status)
    # checks that cannot fail except through a bug are labelled as sanity checks, apart from the evidence
    for cid in ("ws-small-steps", "ws-m-holds", "ds-tight-holds", "identity-error", "icl-tasks", "lemmas-hold"):
        assert group[cid] == "sanity", cid
    for cid in ("adv-tight-within-10x", "ds-tight-within-10x", "icl-pred-diff", "icl-escaped-min"):
        assert group[cid] == "evidence", cid
