"""Chapter 4 runs end to end with its tiny smoke parameters (claims recorded, not enforced), its
claims measured from the claim spec in its front matter (iclnb.bookkit.claimspec)."""


from iclnb.bookkit import runner
from iclnb.bookkit.claimspec import load_spec


def test_chapter04_spec():
    """Each question has the rival it needs; the rivals that cannot pass (a fixed window against
    best windows that span a decade, a closed form of Sigma) left their claims reports."""
    spec = load_spec(runner.find_chapter(4).path)
    effect = {"w-rank-affine", "w-rank-relu", "w-rank-cosine", "norm-growth"}
    mechanism = {"adapt-risk", "exponent-matches-optimum", "gen-same-l", "gen-class", "gen-up", "gen-down",
                 "softmax-beats-linear", "linear-no-intercept", "sigma-inverse"}
    assert {cid for cid, s in spec.items() if s.question == "effect"} == effect
    assert {cid for cid, s in spec.items() if s.question == "mechanism"} == mechanism
    assert all(spec[cid].rival_kind == "chance" for cid in effect)
    for cid in ("grid-w-optimal", "sweep-w-optimal", "iso-median", "w-sigma"):  # demoted checks, dated
        assert spec[cid].question == "report" and spec[cid].amended and spec[cid].amended[-1].when == "after", cid
    assert spec["gen-up"].amended[0].was.startswith("slope in [1.7, 2.3]")
    finding = spec["softmax-beats-linear"]  # the book's comparator (linear attention with an intercept)
    assert finding.whose == "book" and finding.finding.when == "after" and finding.finding.commit == "4c6fbe1"
    assert finding.finding_paper.when == "before"
    # the paper's own comparator carries the paper's claim, against a window that does not adapt
    assert spec["linear-no-intercept"].whose == "paper" and spec["linear-no-intercept"].rival_kind == "tuned"
    assert spec["sigma-inverse"].rival_kind == "trained" and "linear attention" in spec["sigma-inverse"].rival
    assert "L/2 and 2L" in spec["gen-class"].rival and spec["gen-class"].amended[-1].when == "after"
    assert "growth phase" in spec["norm-growth"].statistic and "step 750" in spec["norm-growth"].amended[-1].was
    assert spec["thm3-rates"].question == "not_attempted" and spec["extreme-limits"].question == "not_attempted"


def test_chapter04_smoke(smoke_run):
    r = smoke_run(4)
    data = r.claims  # the run's claims JSON (smoke_run asserts it is not enforced)
    claims = {c["id"]: c for c in data["claims"]}
    kinds = {cid: c["kind"] for cid, c in claims.items()}
    chance = {"w-rank-affine", "w-rank-relu", "w-rank-cosine", "norm-growth"}
    competitor = {"adapt-risk", "exponent-matches-optimum", "gen-same-l", "gen-class", "gen-up", "gen-down",
                  "linear-no-intercept", "sigma-inverse"}
    assert {cid for cid, kind in kinds.items() if kind == "check"} == chance | competitor
    for cid in chance:  # an order against the same values in a random order (a permutation test)
        assert claims[cid]["null_kind"] == "chance" and claims[cid]["question"] == "effect", cid
    for cid in competitor | {"softmax-beats-linear"}:
        assert claims[cid]["null_kind"] == "competitor" and claims[cid]["question"] == "mechanism", cid
        assert claims[cid]["rival_kind"] in ("trained", "tuned"), cid
    for cid in ("adapt-risk", "gen-same-l"):  # A beats B, with both sides' own statistics
        assert claims[cid]["form"] == "ordering" and claims[cid]["basis"] == "mc", cid
    finding = claims["softmax-beats-linear"]
    assert finding["kind"] == "finding" and finding["declared"] == "after" and finding["commit"] == "4c6fbe1"
    assert finding["own"] is True
    reports = {"grid-w-optimal", "sweep-w-optimal", "w-sigma", "iso-median", "w-relu-l1", "w-star-relu-l1",
               "softmax-more-context", "exponent-bracket", "rate-n", "rate-sigma", "gen-matched"}
    assert {cid for cid, kind in kinds.items() if kind == "report"} == reports
    assert kinds["thm3-rates"] == kinds["extreme-limits"] == "not_attempted"
    for c in data["claims"]:  # every evidence check carries its rival's value from the run
        if c["kind"] in ("check", "finding"):
            assert c["null"] and c["null_value"] is not None and c["basis"], c["id"]
        assert c["words"], c["id"]  # every claim's verdict in words, from the spec
