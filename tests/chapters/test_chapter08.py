"""The sweep page runs a real (smoke-sized) sweep of chapter 4 end to end."""

import json


def test_sweeping_page_smoke(smoke_run):
    r = smoke_run(8)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    values = {c["id"]: c["value"] for c in data["claims"]}
    assert values["sweep-complete"] == 2 and values["sweep-table"] == 2
