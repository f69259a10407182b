from iclnb.plotting import markdown_table


def test_markdown_table():
    md = markdown_table([{"a": 1, "b": 0.5, "c": True}], {"a": "A", "b": "B", "c": "ok"})
    assert md.splitlines()[0] == "| A | B | ok |" and "yes" in md
