"""Can a verdict fail? Every chapter runs at smoke size with every model left at its
initialisation (``ICLNB_UNTRAINED=1``: :func:`iclnb.engine.train.train` returns the models
untrained). An evidence check that still holds there does not show what training produced: the
test lists every such check and fails, unless the check says it is not about a trained model
(``untrained_ok=`` with the reason, e.g. a check of the data or of an ODE)."""

import json

import pytest

from iclnb.bookkit import runner

CHAPTERS = [ch.number for ch in runner.chapters() if ch.kind == "chapter"]


@pytest.mark.parametrize("number", CHAPTERS)
def test_no_evidence_check_holds_untrained(number, smoke_run):
    r = smoke_run(number)  # the session's smoke run: every model at its initialisation
    ch = r.chapter
    runs = [json.loads(line) for line in r.output.with_suffix(".runs.jsonl").read_text().splitlines()]
    assert all(x.get("untrained") for x in runs), "a model was trained in the untrained run"
    data = r.claims
    holding = [f"{c['id']} ({c['value']!r} {c['op']} {c['threshold']!r}; null {c.get('null_value')!r})"
               for c in data["claims"] if c["kind"] == "check" and c.get("holds") and not c.get("untrained_ok")]
    assert not holding, (f"{ch.slug}: evidence checks that hold with untrained models (not evidence of "
                         "training; make them sanity checks or reports, give them a rival that can pass, "
                         "or say why they are not about a trained model):\n  " + "\n  ".join(holding))
