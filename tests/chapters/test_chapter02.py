"""Chapter 2 runs end to end with its tiny smoke parameters (claims recorded, not enforced), its
claims measured from the spec in its front matter."""


from iclnb.bookkit.claimspec import load_spec
from iclnb.bookkit.runner import find_chapter

# the per-head patterns, the zero sum and the common scale: against trained linear attention
LINEAR = ("h2-diag-ratio", "h3-last-row", "h1-diag-ratio", "h2-ov-last", "zero-sum-ov", "h2-omega-spread")
# rivals read off the same trained circuits (the expansion, vanilla GD at the model's own step)
OWN_NUMBERS = ("rebuild-short-prompts", "closer-debiased", "follows-dgd-own")
# readings whose only rival cannot pass (a closed form, an ordering that cannot fail): reports
REPORTED = ("kernel-rebuild", "h1-mu-theory", "own-step-debiased", "own-step-fixed", "kernel-rebuild-multi",
            "step-dgd-optimum", "manifold-mu", "softmax-length", "sign-match", "h1-mu-formula")
FINDINGS = ("h3-ov-last", "h4-diag-ratio", "h4-ov-last", "h4-omega-spread", "h8-diag-ratio", "h8-ov-last",
            "h8-omega-spread", "follows-dgd-own", "pair-every-init")


def test_chapter02_spec():
    spec = load_spec(find_chapter(2).path)
    assert all(spec[c].question == "mechanism" and spec[c].rival_kind == "trained" for c in LINEAR)
    assert all("linear attention" in spec[c].rival for c in LINEAR)
    assert all(spec[c].question == "mechanism" and spec[c].rival_kind == "computed" for c in OWN_NUMBERS)
    assert all(spec[c].question == "report" for c in REPORTED)
    assert spec["pair-every-init"].question == "effect" and spec["pair-every-init"].rival_kind == "chance"
    assert spec["linear-length"].question == "sanity" and spec["insensitive"].question == "not_attempted"
    assert all(spec[c].finding.when == "after" for c in FINDINGS)
    assert {c for c, sp in spec.items() if sp.finding} == set(FINDINGS)
    assert spec["follows-dgd-own"].finding_paper.when == "after"
    # rules changed after a run that tested them say so, with the commit
    assert [a.commit for a in spec["h1-mu-theory"].amended][:1] == ["993fbb2"]
    assert [a.commit for a in spec["h-spread"].amended] == ["993fbb2", "993fbb2", "0eb133c"]
    # h8-last-row never failed: a check, not a finding (its false dating recorded)
    assert spec["h8-last-row"].finding is None and spec["h8-last-row"].amended[-1].commit == "0eb133c"
    # the per-head rivals train as long as the softmax models (amended after the 10,000-step rival)
    assert all("as long" in spec[c].rival for c in LINEAR)
    assert spec["h2-omega-spread"].amended[0].commit == "3905c79"
    assert spec["h-spread"].threshold == "measured" and spec["h-spread"].basis == "mc"
    # every claim of the paper quotes it; the book's own are marked
    assert spec["h2-pattern-k"].whose == "book" and spec["h2-diag-ratio"].whose == "paper"


def test_chapter02_smoke(smoke_run):
    r = smoke_run(2)
    data = r.claims  # the run's claims JSON (smoke_run asserts it is not enforced)
    assert data["enforced"] is False and not data["missing_findings"]
    claims = {c["id"]: c for c in data["claims"]}
    spec = load_spec(find_chapter(2).path)
    # every entry measured exactly once (ids are unique in the JSON), none skipped at the smoke heads
    assert len(data["claims"]) == len(claims) and set(spec) == set(claims) and not data["findings_skipped"]
    kinds = {cid: c["kind"] for cid, c in claims.items()}
    assert all(kinds[c] in ("check", "finding") for c in LINEAR + OWN_NUMBERS)
    assert all(claims[c]["rival_kind"] == "trained" and "linear attention" in claims[c]["null"] for c in LINEAR)
    assert all(kinds[c] == "report" for c in REPORTED)
    assert all(kinds[c] == "finding" and claims[c]["declared"] == "after" for c in FINDINGS)
    assert kinds["linear-length"] == "sanity" and kinds["insensitive"] == "not_attempted"
    assert claims["pair-every-init"]["question"] == "effect" and claims["pair-every-init"]["null_kind"] == "chance"
    # orderings carry both sides' own statistics (never a ratio and its reciprocal)
    for cid in ("rebuild-short-prompts", "closer-debiased"):
        assert claims[cid]["form"] == "ordering" and claims[cid]["a"] and claims[cid]["null"], cid
    assert claims["h-spread"]["basis"] == "mc" and claims["h-spread"]["se"] is not None
    # every evidence claim names its rival, its kind, and carries a value for it
    for c in claims.values():
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["basis"], c["id"]
            assert c["rival_kind"] in ("trained", "tuned", "computed", "chance"), c["id"]
            assert c["words"], c["id"]


def test_metrics_of_heads_keeps_the_given_classes():
    import numpy as np

    from iclnb.analysis import circuits

    d = 3
    kq = np.zeros((3, d + 1, d + 1))
    kq[0, :d, :d], kq[1, :d, :d] = 0.2 * np.eye(d), -0.1 * np.eye(d)
    kq[2] = np.ones((d + 1, d + 1))  # not diagonal; dummy below, so left out
    ov = np.zeros((3, d + 1))
    ov[:, -1] = [2.0, -3.0, 1e-6]
    m = circuits.metrics_of_heads(kq, ov, ["positive", "negative", "dummy"])
    assert m["min_diag_ratio"] == 1.0 and m["max_last_row_ratio"] == 0.0
    assert m["omega_spread"] == 2.0 and m["sign_match"] == 1.0 and m["n_live"] == 2
    assert abs(m["mu_balance"] - (1 - 1e-6) / (5 + 1e-6)) < 1e-12
    # the same circuits with head 3 called live: its non-diagonal block counts now
    assert circuits.metrics_of_heads(kq, ov, ["positive"] * 3)["min_diag_ratio"] < 0.6


def test_authors_omega_factor_and_gd_retuned():
    import math

    import torch

    from iclnb.analysis import circuits
    from iclnb.analysis import predictors as pr
    from iclnb.chapters import ch02_kernels as ch2

    assert abs(circuits.authors_omega_factor(5) - math.sqrt(6 / 7)) < 1e-15
    X, y, xq = torch.randn(4, 7, 5, dtype=torch.float64), torch.randn(4, 7, dtype=torch.float64), \
        torch.randn(4, 5, dtype=torch.float64)
    got = ch2.gd_retuned(5, 0.1)(7)(X, y, xq)
    assert torch.allclose(got, pr.gd_predict(X, y, xq, pr.gd_optimal_step(7, 5, 0.1)))
