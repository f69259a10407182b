"""Chapter 7 runs end to end with its tiny smoke parameters (claims recorded, not enforced), its
claims measured from the claim spec in its front matter (iclnb.bookkit.claimspec)."""


from iclnb.bookkit.claimspec import load_spec
from iclnb.bookkit.runner import find_chapter
from iclnb.chapters import ch07_beyond_softmax as ch7

RHOS = ("0.5", "0.8")
# against a rival that could pass: trained linear attention, or a tuned predictor or target
TRAINED = ("sign-match-every-phi", "kq-diagonal-every-phi", "ov-last-every-phi", "sign-match-rho", "ov-last-rho")
TUNED = ("step-every-phi", "closer-debiased-every-phi", "length-curve-every-phi",
         *(f"{c}-rho{r}" for c in ("kq-optimal-preconditioner", "risk-vs-sinv") for r in RHOS))
# effects against a chance level: linear attention has no y_bar to cancel and no normaliser; the
# heads at initialisation; the isotropic model's diagonal heads (the turn-5 referee)
EFFECT = ("zero-sum-every-phi", "zero-sum-rho", "length-every-phi", "kq-diagonal-rho",
          *(f"heads-to-gamma-rho{r}" for r in RHOS))
REPORTED = ("risk-every-phi",)  # a chosen band that vanilla GD meets too
# findings declared after the referee read the numbers; at the paper scale, before its run
FINDINGS = ("step-every-phi", "length-curve-every-phi", "heads-to-gamma-rho0.8")


def test_chapter07_spec():
    spec = load_spec(find_chapter(7).path)
    assert {c for c, s in spec.items() if s.question == "mechanism"} == set(TRAINED) | set(TUNED)
    assert {c for c, s in spec.items() if s.question == "effect"} == set(EFFECT)
    assert all(spec[c].rival_kind == "chance" for c in EFFECT)
    assert all(spec[c].rival_kind == "trained" and "linear attention" in spec[c].rival for c in TRAINED)
    assert all(spec[c].rival_kind == "tuned" for c in TUNED)
    for cid in REPORTED + ("zero-sum-every-phi", "zero-sum-rho", "length-every-phi"):
        assert spec[cid].amended[-1].when == "after", cid  # changed after a run, the earlier rule kept
    assert all(spec[c].question == "report" for c in REPORTED)
    assert {c for c, s in spec.items() if s.finding} == set(FINDINGS)
    assert all(spec[c].finding.when == "after" and spec[c].finding_paper.when == "before" for c in FINDINGS)
    step = spec["step-every-phi"]
    assert step.threshold == "measured" and step.amended[0].commit == "3905c79"
    assert spec["kq-optimal-preconditioner-rho0.5"].ordering and spec["risk-vs-sinv-rho0.8"].basis == "mc"
    assert spec["closer-debiased-every-phi"].ordering and spec["closer-debiased-every-phi"].se_multiple == 3
    assert spec["step-fit-residual"].whose == "book" and spec["risk-every-phi"].whose == "paper"
    assert spec["dynamics-every-phi"].question == "not_attempted"
    assert set(ch7.HOW) <= set(spec) | {"kq-optimal-preconditioner", "risk-vs-sinv", "heads-to-gamma"}


def test_chapter07_smoke(smoke_run):
    r = smoke_run(7)
    data = r.claims  # the run's claims JSON (smoke_run asserts it is not enforced)
    ids = [c["id"] for c in data["claims"]]
    by_id = {c["id"]: c for c in data["claims"]}
    spec = load_spec(find_chapter(7).path)
    # every entry of the spec measured (or skipped) exactly once, nothing outside it
    assert len(ids) == len(set(ids)) and not set(ids) & set(data["findings_skipped"])
    assert set(spec) == set(ids) | set(data["findings_skipped"]) and not data["findings_skipped"]
    assert not data["missing_findings"]
    for cid in TRAINED + TUNED:
        assert by_id[cid]["kind"] in ("check", "finding") and by_id[cid]["question"] == "mechanism", cid
        assert by_id[cid]["null_kind"] == "competitor" and by_id[cid]["null_value"] is not None, cid
    for cid in TRAINED:  # read the same way from the trained rival
        assert by_id[cid]["rival_kind"] == "trained" and "linear attention" in by_id[cid]["null"]
    # the fitted step: its rival (vanilla GD fitted the same way) lands on eta* too, so softmax's is
    # reported and every activation's is a finding declared after its first run
    assert by_id["step-softmax"]["kind"] == "report"
    assert by_id["step-every-phi"]["kind"] == "finding" and by_id["step-every-phi"]["declared"] == "after"
    assert by_id["step-every-phi"]["rival_kind"] == "tuned"
    assert all(by_id[c]["kind"] == "report" and by_id[c]["question"] == "report" for c in REPORTED)
    for cid in EFFECT:  # a chance level: never more than "holds (effect only)"
        assert by_id[cid]["question"] == "effect" and by_id[cid]["null_kind"] == "chance", cid
        assert by_id[cid]["null_value"] is not None, cid
    assert all("linear attention" in by_id[c]["text"] for c in ("zero-sum-every-phi", "zero-sum-rho"))
    assert by_id["closer-debiased-every-phi"]["form"] == "ordering" and by_id["closer-debiased-every-phi"]["se"] > 0
    for rho in RHOS:  # A beats B, both sides' own statistics, the margin computed in the run
        k, rk = by_id[f"kq-optimal-preconditioner-rho{rho}"], by_id[f"risk-vs-sinv-rho{rho}"]
        assert k["form"] == "ordering" and k["margin"] > 0 and k["basis"] == "theory"
        assert rk["form"] == "ordering" and rk["basis"] == "mc" and rk["se"] > 0
    assert by_id["gamma-mc-minimiser"]["kind"] == "sanity" and by_id["gamma-to-sinv-sweep"]["kind"] == "sanity"
    assert by_id["step-fit-exact"]["kind"] == "sanity" and by_id["pairs-every-phi"]["kind"] == "report"
    assert by_id["dynamics-every-phi"]["kind"] == "not_attempted"
    assert all(c["words"] for c in data["claims"])  # every verdict in words, from the spec


def test_chapter07_imports_the_engines_names_from_the_engine():
    """The chapter imports omega, mu, forward and proportional_error from the engine only (the reader
    items of every chapter: tests/book/test_book.py)."""
    path = find_chapter(7).path
    import ast

    from iclnb.analysis import circuits
    from iclnb.engine import activations, readout

    engine = {n for m in (activations, readout) for n, obj in vars(m).items()  # the engine's names circuits re-exports
              if not n.startswith("_") and getattr(circuits, n, None) is obj and not isinstance(obj, type(ast))
              and getattr(obj, "__module__", m.__name__) == m.__name__}
    assert {"omega", "mu"} <= engine  # circuits imports them for its metrics; it re-exports nothing
    assert not any(f"circuits.{name}" in path.read_text() for name in engine)
    for module in path.parents[1].glob("iclnb/chapters/ch07_*.py"):  # one import path per name
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "iclnb.analysis.circuits":
                assert not {a.name for a in node.names} & engine, (module.name, node.lineno)
