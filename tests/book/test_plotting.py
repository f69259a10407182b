"""Table helpers of iclnb.bookkit.plotting."""

from iclnb.bookkit.plotting import group_rows, markdown_table


def test_markdown_table():
    md = markdown_table([{"a": 1, "b": 0.5, "c": True}], {"a": "A", "b": "B", "c": "ok"})
    assert md.splitlines()[0] == "| A | B | ok |" and "yes" in md


def test_group_rows_summarises_each_group_in_order():
    grid = [{"n": n, "R": R, "worst": n * R, "ok": n < 30} for R in (4.0, 6.0) for n in (10, 30)]
    assert group_rows(grid, "R", {"worst": max, "n": len, "ok": all}) == [
        {"R": 4.0, "worst": 120.0, "n": 2, "ok": False}, {"R": 6.0, "worst": 180.0, "n": 2, "ok": False}]
    assert group_rows(grid, "n", {"ok": all})[0] == {"n": 10, "ok": True}
