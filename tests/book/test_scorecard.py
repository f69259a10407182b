"""The book's scorecard: counts per chapter and in total, null kinds, bases, pass rates over seeds."""

import types

import pytest

from iclnb.bookkit import records
from iclnb.bookkit.claims import Claims
from iclnb.bookkit.records import robust, seed_passes
from iclnb.bookkit.scorecard import scorecard_markdown


def _chapter(name="01_a"):
    c = Claims(name, enforce=True, findings={
        "f-before": {"declared": "before", "why": "below the paper's scale"},
        "f-after": {"declared": "after", "why": "failed at the defaults", "commit": "8517d88"}})
    c.check("strong-1", "beats a competitor", 0.1, "<", 0.5, null="ridge", null_value=0.9, null_kind="competitor",
            basis="theory", basis_ref="Theorem 2", ref="Thm 2", paper=0.12)
    c.check("weak-1", "better than at init", 0.99, ">=", 0.98, null="init", null_value=0.3, null_kind="init",
            basis="mc", se=0.001, se_multiple=3)
    c.ordering("ours-1", "our recipe beats the old", 7, 0, ">", a="new recipe", b="old recipe",
               null_kind="competitor", basis="chosen", own=True)
    c.check("f-before", "a finding", 3, "<", 1, null="x", null_value=5, null_kind="chance", basis="paper", paper=1)
    c.check("f-after", "a finding", 3, "<", 1, null="x", null_value=5, null_kind="init", basis="chosen")
    c.sanity("s", "identity", 0, "<", 1)
    c.report("r", "a number", 2.5)
    c.not_attempted("na", "a rate", "too slow here", ref="Thm 9")
    return c.to_dict()


def _record(stem, **claims):
    return {"chapter": stem, "seeds": [0, 1, 2, 3, 4], "commit": "abc1234", "source_sha256": "0" * 64,
            "device": "cpu", "date": "2025-01-01",
            "claims": {cid: {"kind": "check", "group": "evidence", "values": [0.0] * 5, "passed": p,
                             "null_passed": q} for cid, (p, q) in claims.items()}, "errors": {}}


@pytest.fixture
def robustness(monkeypatch):
    """The records the scorecard reads, set by the test: ``records[stem]``, ``papers[stem]`` and the
    chapters in ``stale``."""
    fake = types.SimpleNamespace(records={}, papers={}, stale=set())
    monkeypatch.setattr(records, "robustness_record", lambda stem, where=records.RECORDS: (
        fake.papers if where == records.PAPER_RECORDS else fake.records).get(stem))
    monkeypatch.setattr(records, "is_stale", lambda rec, source=None: rec["chapter"] in fake.stale)
    return fake


def _table(lines, heading):
    start = next(i for i, line in enumerate(lines) if line.startswith("| chapter") and heading in line)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_scorecard_counts_strength_and_pass_rates(robustness):
    T, F = True, False
    robustness.records["01_a"] = _record("01_a", **{"strong-1": ([T, T, T, F, T], [F] * 5),
                                                    "weak-1": ([T, T, T, T, T], [F, F, T, T, F]),  # null passes
                                                    "ours-1": ([T] * 5, [None] * 5),
                                                    "f-after": ([F] * 5, [F] * 5)})
    robustness.stale.add("01_a")
    lines = scorecard_markdown([("Chapter 1", "01_a", _chapter()), ("Chapter 2", "02_b", _chapter("02_b"))])
    assert "## Scorecard" in lines
    summary = _table(lines, "holds (effect only)")
    # holds, effect only, shared, fails, not reproduced, reported, sanity, not attempted, robust over seeds
    assert summary[0] == ["Chapter 1", "3", "0", "0", "0", "2", "1", "1", "1", "2 of 3 (stale)"]
    assert summary[1] == ["Chapter 2", "3", "0", "0", "0", "2", "1", "1", "1", "no record"]
    assert summary[2] == ["**all chapters**", "6", "0", "0", "0", "4", "2", "2", "2",
                          "2 of 3 (1 chapter(s) without a record)"]
    text = "\n".join(lines)
    assert "seeds 0, 1, 2, 3, 4, commit `abc1234`" in text and "**stale**" in text
    assert "iclnb robustness 02_b --seeds 0 1 2 3 4" in text
    rows = {(r[0], r[1]): r for r in _table(lines, "question · rival")}
    s1, w1, o1 = rows["Chapter 1", "strong-1"], rows["Chapter 1", "weak-1"], rows["Chapter 1", "ours-1"]
    assert s1[3:8] == ["the paper's", "competitor · strong", "theory: Theorem 2", "pass", "4 of 5 (stale)"]
    assert w1[4:8] == ["init · weak", "Monte Carlo: 3 × s.e. 0.001", "pass", "3 of 5 **not robust** (stale)"]
    assert o1[3] == "the book's own" and o1[5] == "chosen" and o1[12] == "new recipe: 7" and o1[9] == "not run"
    assert rows["Chapter 1", "f-after"][6] == "not reproduced; finding, declared after a failing run (commit 8517d88)"
    assert rows["Chapter 1", "f-after"][7] == "0 of 5 (stale)"  # a finding: no "not robust" mark
    assert rows["Chapter 1", "f-before"][7] == "not in the record"
    assert rows["Chapter 1", "na"][6] == "not attempted" and rows["Chapter 1", "na"][7] == ""
    assert rows["Chapter 2", "strong-1"][7] == "no record"
    assert ("Chapter 1", "s") not in rows and ("Chapter 1", "r") not in rows  # sanity and reports: counted only


def test_scorecard_without_records(robustness):
    lines = scorecard_markdown([("Chapter 1", "01_a", _chapter())])
    assert _table(lines, "holds (effect only)")[0][-1] == "no record"
    assert all(r[7] in ("no record", "") for r in _table(lines, "question · rival"))
    assert scorecard_markdown([]) == []


def test_seed_passes_and_robust():
    rec = _record("x", a=([True, True, None, True], [False, None, False, False]))
    assert seed_passes(rec, "a") == (3, 5)  # a missing seed counts as not holding
    assert seed_passes(rec, "b") is None and seed_passes(None, "a") is None
    assert robust(4, 5) and not robust(3, 5) and robust(8, 10) and not robust(7, 10) and not robust(0, 0)


def test_paper_scale_verdicts(robustness):
    """The paper-scale record's verdict per claim, on the Reproducibility page and in a chapter's
    claims table: holds or fails (with the value) at one seed, a pass rate over several, a
    finding reproduced or not, "not run" without a record, stale when the source changed."""
    from iclnb.bookkit.scorecard import ClaimsTable, paper_scale_cell

    T, F = True, False
    rec = _record("01_a", **{"strong-1": ([T], [F]), "weak-1": ([T], [T]), "f-after": ([T], [F])})
    rec["seeds"], rec["claims"]["f-after"]["kind"] = [0], "finding"
    rec |= {"preset": "paper", "scale": "larger run", "wall_seconds": [1500.0],
            "training": [{"runs": 2, "steps": 10, "member_steps": 20, "train_seconds": 10.0,
                          "steps_per_second": 1.0}]}
    robustness.papers["01_a"] = rec
    assert paper_scale_cell("strong-1", rec, False) == "holds (0)"
    assert paper_scale_cell("weak-1", rec, False) == "fails: rival passes (0)"
    assert paper_scale_cell("f-after", rec, True) == "reproduced (0) (stale)"
    assert paper_scale_cell("ours-1", rec, False) == "not in the record"
    assert paper_scale_cell("strong-1", None, False) == "not run"
    five = _record("01_a", **{"strong-1": ([T, T, F, T, T], [F] * 5)})
    assert paper_scale_cell("strong-1", five, False) == "holds at 4 of 5 seeds"
    lines = scorecard_markdown([("Chapter 1", "01_a", _chapter())])
    rows = {r[1]: r for r in _table(lines, "paper scale")}
    assert rows["strong-1"][9] == "holds (0)" and rows["f-before"][9] == "not in the record"
    note = next(line for line in lines if line.startswith("- Chapter 1 (larger run)"))
    assert "25 min" in note and "1 of 2 evidence checks hold" in note and "1 of 1 findings reproduced" in note
    table = ClaimsTable(_chapter()["claims"], chapter="01_a")
    assert table.HEADERS[-1] == "larger run" and "holds (0)" in repr(table)
    assert ClaimsTable(_chapter()["claims"]).HEADERS == ClaimsTable.BASE_HEADERS


def test_verdicts_page(robustness, tmp_path, monkeypatch):
    """Every claim with a verdict or a reason, grouped by paper and chapter, linked to its chapter;
    a chapter without a spec says its rows use the older vocabulary."""
    import test_claimspec

    from iclnb.bookkit.claims import Claims
    from iclnb.bookkit.verdicts import verdicts_markdown

    src = tmp_path / "notebooks" / "02_spec.md"
    src.parent.mkdir()
    src.write_text(test_claimspec.SPEC_CHAPTER)
    monkeypatch.setenv("ICLNB_CHAPTER_SOURCE", str(src))
    monkeypatch.setenv("ICLNB_CLAIMS_JSON", str(tmp_path / "c.json"))
    c = Claims("02_spec")
    c.measure("beats-linear", 0.10, rival=0.30, se=0.01)
    c.measure("pattern", 0.99, rival=0.985)
    c.measure("ranked", 0.95, rival=0.2, threshold=0.6, se=0.1)
    c.measure("late", 2.0, rival=3.0)
    c.measure("size", 7)
    c.finish()
    lines = verdicts_markdown([(1, "1. Old", "01_a", _chapter()), (2, "2. New", "02_spec", c.to_dict())])
    text = "\n".join(lines)
    assert lines[0] == "# Verdicts" and "Chapter 1 still records their claims the older way" in text
    assert text.index("## Seed 000") < text.index("### 1. Old") < text.index("## Seed 001") < text.index("### 2. New")
    rows = {r[0].split("`")[1]: r for r in (line.strip("|").split(" | ") for line in lines
                                            if line.startswith("| `"))}
    assert rows["pattern"][2] == "**holds, shared with linear attention's diag ratio**"
    assert rows["ranked"][1] == "effect" and rows["late"][2] == "**not reproduced**"
    assert rows["rate"][2] == "**not attempted**" and "size" not in rows and "s" not in rows
    assert rows["strong-1"][2] == "**passes against a competitor (older vocabulary)**"
    assert rows["beats-linear"][6].strip() == "{doc}`chapter 2 <chapters/02_spec>`"
    assert rows["beats-linear"][4] == "no record" and rows["beats-linear"][5] == "not run"


def test_margins_over_seeds():
    from iclnb.bookkit.scorecard import margins_cell

    rec = {"claims": {"a": {"values": [0.1, 0.2], "rivals": [0.6, 0.45], "thresholds": [0.5, 0.5]}}}
    assert margins_cell({"id": "a", "op": "<"}, rec) == "0.3 to 0.4; -0.1 to 0.05"
    assert margins_cell({"id": "a", "op": "<", "form": "ordering"}, rec) == "0.3 to 0.4; (its threshold)"
    assert margins_cell({"id": "a", "op": "<"}, {"claims": {"a": {"values": [0.1]}}}) == ""


def test_seeds_of_a_spec_claim_count_its_verdict():
    """Over seeds, a claim of a spec counts the seeds that reach this run's verdict: a shared
    verdict is a result, and its seeds are counted as shared, not as failures."""
    from iclnb.bookkit.scorecard import seeds_cell

    shared = "holds, shared with linear attention (not enforced)"
    rec = {"seeds": [0, 1, 2, 3, 4], "claims": {"a": {"passed": [True] * 5, "null_passed": [True] * 4 + [False],
                                                      "status": [shared] * 4 + ["holds (not enforced)"]}}}
    row = {"id": "a", "kind": "check", "question": "mechanism", "status": "holds, shared with linear attention"}
    assert seeds_cell(row, rec, False) == "shared at 5 of 5 (holds at 1)"
    # over seeds the verdict is the strongest reached at 4 of 5, holds counting as reaching shared
    assert seeds_cell({**row, "status": "holds"}, rec, True) == "shared at 5 of 5 (holds at 1) (stale)"
    split = {"seeds": [0, 1, 2, 3, 4], "claims": {"a": {"passed": [True] * 5, "null_passed": [False] * 3 + [True] * 2,
                                                        "status": ["holds"] * 3 + [shared] * 2}}}
    assert seeds_cell(row, split, False) == "shared at 5 of 5 (holds at 3)"
    assert records.seeds_verdict(split["claims"]["a"]) == ("shared", 5, 5, 3)
    failing = {"status": ["holds"] * 3 + ["fails"] * 2}
    assert records.seeds_verdict(failing)[:3] == ("holds", 3, 5)
    assert seeds_cell(row, {"seeds": [0, 1, 2, 3, 4], "claims": {"a": {**failing, "passed": [True] * 3 + [False] * 2}}},
                      False) == "holds at 3 of 5 **not robust**"
    assert records.seeds_verdict({"status": ["holds"] * 4 + [shared]}) == ("holds", 4, 5, 0)
