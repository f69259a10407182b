"""Chapter 3 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter03_smoke(smoke_run):
    r = smoke_run(3)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    texts = [c["text"] for c in data["claims"]]
    assert any(t.startswith("Stage I") for t in texts)
    assert any(t.startswith("approximate loss within 0.03") for t in texts)
    assert any(t.startswith("ODE phase I") for t in texts)
    assert any(t.startswith("four-head ODE") for t in texts)
    assert data["enforced"] is False
