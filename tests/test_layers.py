"""The library's four layers import only downward, modules stay short, and chapters define no
functions in their code cells.

Layers, lowest first: ``iclnb.engine`` < ``iclnb.analysis`` < ``iclnb.chapters``; a chapter
module imports no other chapter (a chapter is the ``chNN`` prefix of a module's name:
``ch01_icl`` may import ``ch01_regression``). ``iclnb.bookkit`` (the book machinery) imports none
of the three; ``iclnb/__init__.py`` and ``iclnb/__main__.py`` import ``bookkit`` only.
``iclnb.contract`` (the runner-kernel environment contract) imports nothing of the package and any
module may import it. Every import is walked: at the top of a module and inside functions,
``import x`` and ``from x import y``, absolute and relative, and ``importlib.import_module("...")``
with a literal name.

Inside the book machinery the modules form a line (:data:`BOOKKIT`): each imports only modules
before it, at its top, never inside a function, so there is no cycle to hold together.
"""

import ast
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "iclnb"
ORDER = {"engine": 0, "analysis": 1, "chapters": 2}  # may import itself and what is below it
# the book machinery, lowest first: the claim spec and the claims ledger (data), reading the records,
# the tables and verdict boxes, what a chapter imports, running chapters, the pages a build writes,
# sweeps and seeds, the build, the browser check, the command line
BOOKKIT = ("claimspec", "ledger", "records", "scorecard", "verdicts", "claims", "plotting", "progress", "runner",
           "pages", "sweep", "robustness", "book", "pagecheck", "cli")
MAX_LINES = 550
CHAPTER = re.compile(r"^(ch\d\d)_")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of a ``from ... import`` target (relative ones resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, source: str | None = None) -> list[tuple[int, str]]:
    """(line, imported module name) of every import of the package in ``module`` (its file, or
    ``source``), wherever it stands. For ``from X import y`` the name is ``X.y`` when that is a
    module of the package, else ``X``."""
    path = MODULES.get(module) or PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            found += [(node.lineno, f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target)
                      for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in found if name == "iclnb" or name.startswith("iclnb.")]


def layer(name: str) -> str:
    """"engine", "analysis", "chapters", "bookkit", or "top" (``iclnb`` itself, ``iclnb.__main__``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in (*ORDER, "bookkit") else "top"


def violation(module: str, target: str) -> str:
    """Why ``module`` may not import ``target``, or ""."""
    src, dst = layer(module), layer(target)
    if target == "iclnb.contract":
        return ""  # any layer may import the contract
    if module == "iclnb.contract":
        return "the contract imports nothing of the package"
    if target == "iclnb" and module != "iclnb":
        return ""  # the package itself (its __version__): it imports bookkit only
    if src == "top":
        return "" if dst == "bookkit" else f"{module} may import iclnb.bookkit only"
    if src == "bookkit":
        return "" if dst == "bookkit" else "the book machinery imports none of engine, analysis, chapters"
    if dst not in ORDER:
        return f"the {src} layer imports {dst}"
    if ORDER[dst] > ORDER[src]:
        return f"the {src} layer imports the {dst} layer above it"
    if src == dst == "chapters":
        mine, theirs = (CHAPTER.match(n.rpartition(".")[2]) for n in (module, target))
        if theirs and (mine is None or mine.group(1) != theirs.group(1)):
            return "a chapter module imports another chapter's module"
    return ""


def test_the_walker_sees_every_form_of_import():
    src = ("import iclnb.engine.util\nfrom .. import analysis\nfrom ..engine import models\n"
           "from . import ch01_regression\ndef f():\n    from iclnb.chapters.ch03_stages import x\n"
           "    import importlib\n    importlib.import_module('iclnb.bookkit.claims')\n")
    names = [n for _, n in imports("iclnb.chapters.ch01_fake", src)]
    assert names == ["iclnb.engine.util", "iclnb.analysis", "iclnb.engine.models", "iclnb.chapters.ch01_regression",
                     "iclnb.chapters.ch03_stages", "iclnb.bookkit.claims"]
    bad = {n: violation("iclnb.chapters.ch01_fake", n) for n in names}
    assert [n for n, why in bad.items() if why] == ["iclnb.chapters.ch03_stages", "iclnb.bookkit.claims"]
    assert violation("iclnb.engine.train", "iclnb.analysis.circuits")
    assert violation("iclnb.bookkit.runner", "iclnb.engine.util")
    assert violation("iclnb.__main__", "iclnb.engine.util") and not violation("iclnb.__main__", "iclnb.bookkit.cli")
    assert not violation("iclnb.analysis.circuits", "iclnb.engine.readout")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_only_downward(module):
    bad = [f"{module} line {line}: imports {name}: {why}" for line, name in imports(module)
           if (why := violation(module, name))]
    assert not bad, "\n".join(bad)


def test_bookkit_is_a_line():
    """Each module of the book machinery imports only those before it in BOOKKIT, at its top."""
    found = {p.stem for p in (PACKAGE / "bookkit").glob("*.py") if p.stem != "__init__"}
    assert found == set(BOOKKIT), f"place every bookkit module in BOOKKIT: {sorted(found ^ set(BOOKKIT))}"
    bad = []
    for i, name in enumerate(BOOKKIT):
        module = f"iclnb.bookkit.{name}"
        tree = ast.parse(MODULES[module].read_text())
        top = {node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
        for line, target in imports(module):
            if line not in top:
                bad.append(f"{module} line {line}: imports {target} inside a function")
            elif target.startswith("iclnb.bookkit.") and target.split(".")[2] not in BOOKKIT[:i]:
                bad.append(f"{module} line {line}: imports {target}, which is not before it in BOOKKIT")
    assert not bad, "\n".join(bad)


def test_the_contract_agrees_with_the_engine():
    """The engine keeps its own copies of the names it reads until its next change (the run-cache
    key hashes its source); they must equal the contract's."""
    from iclnb import contract
    from iclnb.engine import progress, train, util

    assert (train.RUNS_ENV, train.UNTRAINED_ENV, train.CHECKPOINT_ENV) == (
        contract.RUNS, contract.UNTRAINED, contract.CHECKPOINT_SECONDS)
    assert (progress.ENV, util.PREFETCH_ENV) == (contract.PROGRESS, contract.PREFETCH)
    for module, name in (("cache", contract.CACHE_DIR), ("util", contract.THREADS), ("progress", contract.QUIET)):
        assert f'"{name}"' in (PACKAGE / "engine" / f"{module}.py").read_text(), (module, name)


# Over the limit for now, and why. The engine's source is part of the run-cache key, so splitting
# iclnb/engine/train.py would retrain every paper-scale run of the cache: it is split with the next
# change to iclnb/engine/, and its entry goes then.
OVER = {"iclnb.engine.train": "the checkpoints of 581de82 (resumable training)"}


def test_modules_are_short():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES and m not in OVER}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    assert all(len(MODULES[m].read_text().splitlines()) > MAX_LINES for m in OVER), "drop a module no longer over"


def test_notebooks_define_no_functions():
    """The library does, the notebook tells: no ``def`` and no ``lambda`` in a chapter's code cells."""
    bad = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")):  # the chapter sources
        cells = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
        for i, cell in enumerate(cells):
            source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            try:
                nodes = [(n.lineno, type(n).__name__) for n in ast.walk(ast.parse(source))
                         if isinstance(n, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef))]
            except SyntaxError:
                nodes = [(j, "def or lambda") for j, line in enumerate(source.splitlines(), 1)
                         if re.search(r"\blambda\b|^\s*(async\s+)?def\s", line)]
            bad += [f"{path.name} code cell {i + 1} line {line}: {what}" for line, what in nodes]
    assert not bad, "\n".join(bad)


def private_imports(path: Path) -> list[str]:
    """``line: module.name`` for every underscored name imported from another module of the
    package by ``path`` (a module or a chapter's code)."""
    source = path.read_text()
    if path.suffix == ".md":
        source = "\n".join(c.source for c in jupytext.reads(source, fmt="md:myst").cells
                           if c.cell_type == "code" and not c.source.lstrip().startswith("%"))
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("iclnb"):
            found += [f"{node.lineno}: {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


@pytest.mark.parametrize("path", [p for name, p in MODULES.items() if layer(name) != "engine"]
                         + sorted((ROOT / "notebooks").glob("0*.md")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_crosses_a_module(path):
    """No underscored name is imported from another module by the library or a chapter (the
    engine's own internals, which share its private helpers and whose source is frozen, excepted;
    white-box tests may reach into the module they test): a name used elsewhere gets a public home."""
    assert not private_imports(path), f"{path.name} imports private names: {private_imports(path)}"
