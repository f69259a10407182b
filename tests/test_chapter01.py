"""Chapter 1 runs end to end with its tiny smoke parameters (claims recorded, not enforced)."""

import json


def test_chapter01_smoke(smoke_run):
    r = smoke_run(1)
    data = json.loads(r.output.with_suffix(".claims.json").read_text())
    assert data["enforced"] is False
    assert data["missing_findings"] == []
    claims = {c["id"]: c for c in data["claims"]}
    status = {cid: c["status"] for cid, c in claims.items()}
    group = {cid: c["group"] for cid, c in claims.items()}
    # the claims that do not depend on scale hold even at smoke size
    for cid in ("grad-autograd", "ws-m-holds", "ds-m-holds", "identity-error", "lemmas-hold"):
        assert claims[cid]["holds"] is True, cid
    # the two-row construction puts the adversarial search within 10% of R/2 at any size: our own
    # closed form, so a sanity check (the typical instance's gap is reported beside it)
    for cid in ("adv-tight-gap", "ds-tight-gap"):
        assert claims[cid]["passed"] is True, cid
        assert group[cid] == "sanity", cid
    for cid in ("adv-fixed-gap", "ds-sa-gap"):
        assert group[cid] == "report", cid
    assert {"icl-cosine", "icl-escaped-min", "icl-closer-to-gd", "icl-step-size", "icl-converged",
            "icl-n25-pred-diff", "icl-raw-vs-centred", "adv-tight-gap",
            "lemma-5.7-max-slack", "fact-3.1-star-max-slack"} <= set(status)
    # checks that cannot fail except through a bug are labelled as sanity checks, apart from the evidence
    for cid in ("grad-autograd", "ws-small-steps", "ws-m-holds", "ds-tight-holds", "identity-error",
                "icl-tasks", "lemmas-hold"):
        assert group[cid] == "sanity", cid
    # every evidence check names its null and carries the null's value from the same run
    # (against a competitor: the exact solution, the old recipe, the distance to the targets)
    evidence = ("icl-pred-diff", "icl-escaped-min", "icl-converged", "icl-n25-pred-diff", "icl-closer-to-gd")
    for cid in evidence:
        assert group[cid] == "evidence", cid
        assert claims[cid]["null"] and claims[cid]["null_kind"] == "competitor", cid
        assert claims[cid]["strength"] == "strong" and not claims[cid]["flags"], cid
        assert isinstance(claims[cid]["null_value"], float), cid
    assert {c["id"] for c in data["claims"] if c["group"] == "evidence"} == set(evidence)
    # the paper publishes no number: the prediction-difference threshold is the book's choice
    for cid in ("icl-pred-diff", "icl-n25-pred-diff", "icl-escaped-min"):
        assert claims[cid]["basis"] == "chosen", cid
    # declared a finding after the default run failed it (d5726bc), in the front matter
    assert claims["icl-converged"]["kind"] == "finding"
    assert claims["icl-converged"]["declared"] == "after"
    assert claims["icl-converged"]["commit"] == "d5726bc"
    # their honest rivals (a trained linear layer, one GD step, the exact solution read as a step)
    # pass too: reported with the rivals beside them, not checked
    for cid in ("icl-n25-closer-to-gd", "icl-beats-uniform", "icl-lsa-vs-uniform", "icl-step-size",
                "icl-step-size-lsa", "icl-step-fit-oracle", "icl-step-fit-layer"):
        assert group[cid] == "report", cid
    for cid in ("paper-cosine", "paper-sens-diff", "paper-settings"):
        assert claims[cid]["kind"] == "not_attempted", cid


def test_two_row_construction_matches_its_closed_form():
    import math

    import torch

    from iclnb.chapters import ch01_bounds as sb
    from iclnb.chapters import ch01_regression as sr

    for n, R in ((10, 4.0), (1000, 4.0), (30, 6.0)):
        for kind in ("x", "A"):
            s = sb.two_row_start(n, 5, R, kind)
            assert math.isclose(float(sr.spectral_norm(s["A"][None])[0]), R, rel_tol=1e-12)
            assert math.isclose(float(s["x"].norm()), R, rel_tol=1e-12)
            h = 1e-7
            if kind == "x":
                ratio = (sr.f(s["A"], s["x"] + h * s["u"]) - sr.f(s["A"], s["x"])).norm() / h
            else:
                U = s["u"] / sr.spectral_norm(s["u"][None])[0]
                ratio = (sr.f(s["A"] + h * U, s["x"]) - sr.f(s["A"], s["x"])).norm() / h
            assert math.isclose(R / 2 / float(ratio), sb.two_row_gap(n, R), rel_tol=1e-5)
    # the search started there cannot do worse than the construction
    res = sb.adversarial_search(1000, 5, 4.0, restarts=2, iters=3, two_row=True)
    assert 4.0 / 2 / res["ratio"] <= sb.two_row_gap(1000, 4.0) * (1 + 1e-4)  # its finite step
    assert torch.isfinite(torch.tensor(res["ratios"])).all()
