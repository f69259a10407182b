"""Chapter 1 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter01_smoke(smoke_run):
    r = smoke_run(1)
    assert r.output.exists()
    path = r.output.with_suffix(".claims.json")
    assert path.exists()
    data = json.loads(path.read_text())
    assert data["enforced"] is False
    by_text = {c["text"]: c for c in data["claims"]}
    # the claims that do not depend on scale hold even at smoke size
    grad = next(c for t, c in by_text.items() if t.startswith("closed-form gradient"))
    assert grad["status"] == "pass"
    assert any(t.startswith("weight shift: M =") and c["status"] == "pass" for t, c in by_text.items())
    assert any(t.startswith("data shift: M bounds") and c["status"] == "pass" for t, c in by_text.items())
    assert any(t.startswith("(A + dA) x = A x'") and c["status"] == "pass" for t, c in by_text.items())
    assert any(t.startswith("layer vs one GD step: mean cosine") for t in by_text)
    assert any(t.startswith("every lemma of the chain holds") and c["status"] == "pass" for t, c in by_text.items())
