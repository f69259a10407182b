"""The lemma audit's table helpers (iclnb.chapters.ch01_bounds)."""

from iclnb.chapters import ch01_bounds as sb


def test_by_lemma_and_slack_text():
    rows = [{"lemma": "5.6", "R": 8.0}, {"lemma": "3.3", "R": 8.0}, {"lemma": "5.6", "R": 4.0}]
    assert [(r["lemma"], r["R"]) for r in sb.by_lemma(rows, ["3.3", "5.6"])] == [("3.3", 8.0), ("5.6", 4.0),
                                                                                    ("5.6", 8.0)]
    assert sb.slack_text([1.234, -0.05]) == "1.2 / -0.1"
