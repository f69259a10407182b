"""Chapter 2 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter02_smoke(smoke_run):
    r = smoke_run(2)
    assert r.output.exists()
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    texts = [c["text"] for c in data["claims"]]
    assert any("kernel-sum predictor" in t for t in texts)
    assert any("linear attention" in t for t in texts)
    assert any(t.startswith("H=8:") for t in texts)
    assert data["enforced"] is False
