"""Robustness runs: a chapter at several seeds, claims not enforced, one record of every claim's
value and verdict per seed; resumed, read back, stale when the source changes."""

import json
import re

import pytest
from fake_chapter import front_matter, write_chapter

from iclnb.bookkit import records, robustness, runner
from iclnb.bookkit.cli import main

pytestmark = pytest.mark.multiprocess

SEEDED = front_matter('a chapter whose checks depend on its seed') + """

# 96. Seeded

```{code-cell} ipython3
:tags: [parameters]
seed = 0  # random seed
k = 3  # a count
enforce_claims = True  # raise when a claim fails
```

```{code-cell} ipython3
from iclnb.bookkit.claims import Claims

claims = Claims("96_seeded", enforce=enforce_claims, findings={})
if seed == 2:
    raise RuntimeError("no seed 2")
claims.check("even", "the seed is even", seed % 2, "<", 0.5, null="an odd seed", null_value=1,
             null_kind="competitor", basis="theory", basis_ref="parity")
claims.check("null-too", "the null passes at seed 1", 1.0, ">", 0.5, null="the seed",
             null_value=seed, null_kind="competitor", basis="theory", basis_ref="parity")
claims.sanity("k", "k is 3", k, ">=", 3)
claims.report("twice", "twice the seed", 2 * seed)
claims.save()  # the JSON the runner reads (finish() would also show the table)
```
"""


@pytest.fixture
def seeded(tmp_path):
    return write_chapter(tmp_path, "96_seeded", SEEDED)


def test_a_record_per_seed_resumed_read_back_and_stale(seeded, tmp_path):
    lines = []
    rec = robustness.robustness(seeded, [0, 1, 2], jobs=2, out=tmp_path / "runs", records=tmp_path / "rec",
                                log=lines.append)
    assert rec == json.loads((tmp_path / "rec" / "96_seeded.json").read_text())
    assert rec == records.robustness_record("96_seeded", records=tmp_path / "rec")
    assert rec["chapter"] == "96_seeded" and rec["seeds"] == [0, 1, 2]
    assert rec["params"] == {"k": 3, "enforce_claims": False}  # every parameter but the seed
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", rec["commit"]) and rec["device"] == "unknown"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", rec["date"])
    assert list(rec["errors"]) == ["2"] and "RuntimeError: no seed 2" in rec["errors"]["2"]
    even = rec["claims"]["even"]
    assert even["kind"] == "check" and even["group"] == "evidence"
    assert even["values"] == [0, 1, None] and even["passed"] == [True, False, None]
    assert even["null_passed"] == [False, False, None] and records.pass_rate(even) == (1, 3)
    both = rec["claims"]["null-too"]  # the value passes at every seed, the null at seed 1
    assert records.holds(both) == [True, False, None]
    assert records.holds(rec["claims"]["k"]) == [True, True, None]
    assert rec["claims"]["twice"]["values"] == [0, 2, None] and records.holds(rec["claims"]["twice"]) == [None] * 3
    assert any("even" in line and "holds at 1; fails at 1; not recorded at 1 of 3 seeds" in line for line in lines)
    assert any("no verdict at 80% of the seeds" in line and "even" in line for line in lines)
    assert not records.is_stale(rec, seeded.path)
    # a second call skips the seeds that ran from this source and runs the failed one again
    lines.clear()
    robustness.robustness(seeded, [0, 1, 2], jobs=1, out=tmp_path / "runs", records=tmp_path / "rec",
                          log=lines.append)
    assert "3 runs, 2 already done, 1 to run" in lines[0]
    seeded.path.write_text(SEEDED.replace("k = 3", "k = 4"))
    assert records.is_stale(rec, seeded.path)
    # the record keeps the source its seeds ran on, not the one on disk when it is written
    runs = [{"source_sha256": rec["source_sha256"], "claims": {}}] * 3
    assert robustness.make_record(seeded, [0, 1, 2], runs, {})["source_sha256"] == rec["source_sha256"]
    assert records.is_stale(robustness.make_record(seeded, [0, 1, 2], runs, {}), seeded.path)
    mixed = [{"source_sha256": "a", "claims": {}}, {"source_sha256": "b", "claims": {}}]
    assert robustness.make_record(seeded, [0, 1], mixed, {})["source_sha256"] == "mixed"
    assert records.robustness_record("96_seeded", records=tmp_path / "nothing") is None


def test_stale_against_the_books_own_source(tmp_path):
    ch = runner.chapters()[0]
    rec = {"chapter": ch.slug, "source_sha256": "0" * 64}
    assert records.is_stale(rec)
    rec["source_sha256"] = records.source_sha256(ch.path)
    assert not records.is_stale(rec)
    assert records.is_stale({"chapter": "99_no_such_chapter", "source_sha256": "0" * 64})


def test_every_chapter_names_the_parameters_a_robustness_run_sets():
    for ch in runner.chapters():
        names = {p.name for p in ch.parameters()}
        assert {"seed", robustness.ENFORCE} <= names, ch.slug


def test_bad_requests_fail_before_anything_runs(tmp_path, capsys):
    assert main(["robustness", "no-such-chapter", "--out", str(tmp_path / "a")]) == 2
    assert main(["robustness", "1", "--seeds", "0", "0", "--out", str(tmp_path / "b")]) == 2
    assert "none twice" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
