"""The command line: list, params, run with bad parameters (no execution needed for those)."""

import subprocess
import sys

import pytest

from iclnb.bookkit import runner
from iclnb.bookkit.cli import main

FIRST = runner.chapters()[0]


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for ch in runner.chapters():
        assert ch.slug in out and ch.description in out


def test_params_shows_defaults_and_help(capsys):
    assert main(["params", str(FIRST.number)]) == 0
    out = capsys.readouterr().out
    for p in FIRST.parameters():
        assert p.name in out and p.help in out


@pytest.mark.parametrize("spec", [str(FIRST.number), f"{FIRST.number:02d}", FIRST.slug, FIRST.slug[3:10]])
def test_find_chapter_by_number_or_name(spec):
    assert runner.find_chapter(spec) == FIRST


def test_unknown_chapter_exit_2(capsys):
    assert main(["params", "no_such_chapter"]) == 2
    assert "matches no chapter" in capsys.readouterr().err


def test_misspelled_parameter_lists_valid_names():
    proc = subprocess.run([sys.executable, "-m", "iclnb", "run", str(FIRST.number), "-p", "seeed", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no parameter 'seeed'" in proc.stderr
    for p in FIRST.parameters():
        assert p.name in proc.stderr


def test_wrong_type_is_an_error(capsys):
    assert main(["run", str(FIRST.number), "-p", "seed", "zero"]) == 2
    err = capsys.readouterr().err
    assert "seed='zero'" in err and "expected int" in err and "Valid parameters" in err


def test_coercion_from_strings():
    P = runner.Parameter
    assert runner._coerce(P("a", 1, ""), "3") == 3
    assert runner._coerce(P("a", 1.0, ""), "3") == 3.0
    assert runner._coerce(P("a", True, ""), "false") is False
    assert runner._coerce(P("a", [1], ""), "[4, 5]") == [4, 5]
    assert runner._coerce(P("a", "auto", ""), "cpu") == "cpu"
    with pytest.raises(runner.ParameterError):
        runner._coerce(P("a", 1, ""), "1.5")
    with pytest.raises(runner.ParameterError):
        runner._coerce(P("a", 1, ""), "True")


def test_parse_parameters_rejects_non_assignments():
    with pytest.raises(runner.ParameterError, match="only `name = literal"):
        runner.parse_parameters("a = 1  # ok\nprint(a)\n")
    (p,) = runner.parse_parameters("steps = 1_000  # training steps\n")
    assert (p.name, p.default, p.help, p.type) == ("steps", 1000, "training steps", "int")
