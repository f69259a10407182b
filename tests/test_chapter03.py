"""Chapter 3 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter03_smoke(smoke_run):
    r = smoke_run(3)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    claims = {c["id"]: c for c in data["claims"]}
    status = {cid: c["status"] for cid, c in claims.items()}
    assert {"approx-vs-mc-small-omega", "ode4-stage1", "final-zero-sum", "real-omega-peak", "gd-follows-flow",
            "gd-flow-within-noise", "gd4-stage1-time", "gd4-stage1-reached", "stage1-steps-max",
            "ode-phase1-end-0.75", "ode-omega-peak-decay", "ode-step-optimum", "ode-phase1-ratio",
            "ode-phase1-ratio-noexp", "real-omega-peak-linear-count", "gd4-tested-starts"} <= set(status)
    # every evidence check faces a competitor with its measured value and an honest basis
    for cid in ("approx-vs-mc-small-omega", "real-omega-peak", "gd-follows-flow", "ode-omega-peak-decay",
                "ode-step-optimum"):
        c = claims[cid]
        assert c["kind"] == "check" and c["null"] and c["null_kind"] == "competitor", cid
        assert c["flags"] == [], cid
    # the ODE and the loss landscape read no trained model: they say so
    for cid in ("approx-vs-mc-small-omega", "ode-omega-peak-decay", "ode-step-optimum"):
        assert claims[cid]["untrained_ok"], cid
    approx = claims["approx-vs-mc-small-omega"]
    assert approx["basis"] == "mc" and approx["se_multiple"] == 3
    # the peak of |omega| in real training faces trained linear attention, not an ODE
    assert "linear attention trained" in claims["real-omega-peak"]["null"]
    # chapter 2's zero-sum-ov is not counted twice; phase I synchrony holds without the exp term too
    assert claims["final-zero-sum"]["kind"] == claims["ode-phase1-ratio"]["kind"] == "report"
    assert claims["ode-phase1-ratio-noexp"]["value"] == 0.0
    # the findings are dated in the front matter
    noise = claims["gd-flow-within-noise"]
    assert noise["kind"] == "finding" and noise["declared"] == "before" and noise["commit"] == "699a0f4"
    if claims["gd4-stage1-time"]["kind"] == "finding":
        assert claims["gd4-stage1-time"]["declared"] == "after" and claims["gd4-stage1-time"]["commit"] == "ad46537"
    assert claims["zoom-retraces"]["kind"] == "sanity" and claims["zoom-retraces"]["holds"] is True
    assert data["enforced"] is False and data["findings_source"].endswith("iclnb.findings")
