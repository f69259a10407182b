"""Executing chapters: jupytext source -> papermill -> executed notebook + claims JSON.

The chapter sources are ``notebooks/NN_slug.md`` (MyST markdown read by jupytext). Each has
exactly one cell tagged ``parameters``, one ``name = value  # help`` per line, and an ``iclnb``
block in its front matter with a one-line ``description`` and its *presets*: the tiny ``smoke``
parameters (claims recorded, not enforced) and, where the chapter declares it, ``paper``: the
parameters that re-run the paper's experiment at the paper's scale (claims enforced).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS_OUT = ROOT / "book" / "chapters"
REPRO_PAGE = ROOT / "book" / "reproducibility.md"
CHAPTER_FILE = re.compile(r"^(\d\d)_([a-z0-9_]+)\.md$")
PRESETS = ("smoke", "paper")  # named parameter sets a chapter may declare in its front matter


class ParameterError(ValueError):
    """A parameter name or value a chapter does not accept."""


@dataclass
class Parameter:
    name: str
    default: object
    help: str

    @property
    def type(self) -> str:
        return type(self.default).__name__


@dataclass
class Chapter:
    number: int
    slug: str  # e.g. "01_softmax_regression_bounds"
    path: Path

    def notebook(self):
        import jupytext

        return jupytext.read(self.path)

    @property
    def meta(self) -> dict:
        return self.notebook().metadata.get("iclnb", {})

    @property
    def title(self) -> str:
        for line in self.path.read_text().splitlines():
            if line.startswith("# "):
                return line[2:].strip()
        return self.slug

    @property
    def description(self) -> str:
        return self.meta.get("description", "")

    @property
    def presets(self) -> dict:
        """The chapter's declared presets, ``{name: parameters}`` (names from ``PRESETS``)."""
        meta = self.meta
        return {name: dict(meta[name]) for name in PRESETS if name in meta}

    @property
    def smoke(self) -> dict:
        return self.presets.get("smoke", {})

    def parameters(self) -> list[Parameter]:
        return parse_parameters(parameters_source(self.notebook()))


def chapters() -> list[Chapter]:
    """All chapters under ``notebooks/``, in order."""
    found = []
    for p in sorted(NOTEBOOKS.glob("*.md")):
        m = CHAPTER_FILE.match(p.name)
        if m:
            found.append(Chapter(int(m.group(1)), p.stem, p))
    return found


def find_chapter(spec: str | int) -> Chapter:
    """A chapter by number (``2``, ``"02"``) or by name (``"kernel"``, ``"02_kernel_regressor_view"``):
    the exact slug, else the one name that starts with it, else the one slug that contains it."""
    all_ = chapters()
    spec = str(spec).strip()
    if spec.isdigit():
        match = [c for c in all_ if c.number == int(spec)]
    else:
        # the exact slug, else a name that starts with spec ("softmax": chapter 1, not the
        # "beyond_softmax" of chapter 7), else any slug that contains it
        match = ([c for c in all_ if c.slug == spec] or [c for c in all_ if c.slug[3:].startswith(spec.lower())]
                 or [c for c in all_ if spec.lower() in c.slug])
    if len(match) != 1:
        names = ", ".join(f"{c.number} ({c.slug})" for c in all_)
        why = "matches no chapter" if not match else "is ambiguous"
        raise ParameterError(f"chapter {spec!r} {why}; chapters: {names}")
    return match[0]


def parameters_source(nb) -> str:
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ParameterError(f"a chapter needs exactly one cell tagged 'parameters', found {len(cells)}")
    return cells[0].source


def parse_parameters(source: str) -> list[Parameter]:
    """``name = literal  # help`` assignments of a parameters cell, with their comments as help."""
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    params = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ParameterError(f"parameters cell line {node.lineno}: only `name = literal  # help` lines allowed")
        params.append(Parameter(node.targets[0].id, ast.literal_eval(node.value), comments.get(node.end_lineno, "")))
    return params


def _coerce(p: Parameter, value):
    """``value`` (a string from the command line, or a Python value) as the type of ``p``'s default."""
    if isinstance(value, str) and not isinstance(p.default, str):
        try:
            value = ast.literal_eval({"true": "True", "false": "False", "none": "None"}.get(value.lower(), value))
        except (ValueError, SyntaxError):
            pass
    d = p.default
    ok = (
        d is None
        or (isinstance(d, bool) and isinstance(value, bool))
        or (isinstance(d, int) and not isinstance(d, bool) and isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(d, float) and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (isinstance(d, str) and isinstance(value, str))
        or (isinstance(d, (list, tuple)) and isinstance(value, (list, tuple)))
        or (isinstance(d, dict) and isinstance(value, dict))
    )
    if not ok:
        raise ParameterError(f"parameter {p.name}={value!r}: expected {p.type} (default {p.default!r})")
    return float(value) if isinstance(d, float) else (type(d)(value) if isinstance(d, (list, tuple)) else value)


def resolve_parameters(chapter: Chapter, overrides: dict) -> dict:
    """Check names and types of ``overrides`` against the chapter's parameters cell.

    Papermill only warns about unknown names; we refuse them, listing the valid ones.
    """
    params = {p.name: p for p in chapter.parameters()}
    valid = "\n".join(f"  {p.name} ({p.type}, default {p.default!r}): {p.help}" for p in params.values())
    resolved = {}
    for name, value in overrides.items():
        if name not in params:
            raise ParameterError(f"chapter {chapter.number} has no parameter {name!r}. Valid parameters:\n{valid}")
        try:
            resolved[name] = _coerce(params[name], value)
        except ParameterError as e:
            raise ParameterError(f"{e}. Valid parameters:\n{valid}") from None
    return resolved


@dataclass
class Result:
    chapter: Chapter
    output: Path
    parameters: dict
    seconds: float
    error: str = ""  # which cell failed and why; empty on success
    claims: dict = field(default_factory=dict)
    preset: str = ""  # the preset the chapter ran with ("" for its defaults)
    runs: list = field(default_factory=list)  # how its training runs trained (iclnb.engine.train's $ICLNB_RUNS records)

    @property
    def claims_failed(self) -> int:
        return int(self.claims.get("failed", 0))

    @property
    def ok(self) -> bool:
        return not self.error and not (self.claims.get("enforced") and self.claims_failed)

    def summary(self) -> str:
        state = "ERROR" if self.error else ("ok" if self.ok else "CLAIMS FAILED")
        if self.claims and not self.claims.get("enforced") and not self.error:
            state += " (claims not enforced)"
        claims = (f"{self.claims.get('passed', 0)} passed, {self.claims_failed} failed, "
                  f"{self.claims.get('not_reproduced', 0)} not reproduced") if self.claims else "no claims"
        return f"{self.chapter.slug:40s} {self.seconds:7.1f} s  {claims:40s} {state}"


def claims_path(output: Path) -> Path:
    return output.with_suffix(".claims.json")


_REPR = re.compile(r"^(np|numpy|torch)\.\w+\(|^tensor\(|^array\(")


def unformattable_glue(notebook: Path) -> str:
    """"" or an error naming the glued values that the book cannot format: a numpy or torch
    scalar's repr (``np.float64(4.08)``) is not a number to myst-nb's ``{glue:text}`name:.1f```
    (the build fails on it with a warning) and shows as that repr without a format. Glue
    ``float(x)`` or ``int(x)``."""
    bad = []
    for cell in json.loads(Path(notebook).read_text()).get("cells", []):
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            text = "".join(out.get("data", {}).get("application/papermill.record/text/plain", ""))
            if name and _REPR.match(text):
                bad.append(f"{name} = {text}")
    return f"glued values that are not plain numbers: {', '.join(bad)}; glue float(x) or int(x)" if bad else ""


RUNS_ENV = "ICLNB_RUNS"  # iclnb.engine.train.RUNS_ENV (not imported here: the runner starts without torch)
_RUN_LOCK = threading.Lock()  # the kernel inherits os.environ: one chapter at a time per process
# the kernel's own log at ERROR: ipykernel warns "Kernel is running over TCP without encryption" on
# every start (the kernel is local, started by papermill on the loopback interface); a reader of
# `iclnb run` should not see it. Errors of the kernel, and everything the notebook prints, still show.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


def run_chapter(chapter: Chapter, overrides: dict | None = None, output: Path | None = None,
                smoke: bool = False, log=print, preset: str | None = None, progress: bool = True) -> Result:
    """Execute ``chapter`` with papermill; never raises on a failing cell (see ``Result.error``).

    ``preset``: run with one of the chapter's presets (overrides still win): ``"smoke"`` (tiny
    parameters, claims not enforced; ``smoke=True`` is the same) or ``"paper"`` (the paper's
    scale). ``output``: the executed notebook's path, or an existing folder to put
    ``NN_name.ipynb`` into. The partial notebook of a failed run is kept at ``output``. ``progress``: log the
    running cell and the training inside it while the chapter runs (``iclnb.bookkit.progress``).
    Chapters run one at a time in a process (their kernels inherit its environment); run
    chapters in parallel in separate processes (``iclnb sweep`` does).
    """
    with _RUN_LOCK:
        return _run_chapter(chapter, overrides, output, smoke, log, preset, progress)


def _run_chapter(chapter, overrides, output, smoke, log, preset, progress) -> Result:
    import papermill as pm

    from iclnb.bookkit.progress import ChapterMonitor

    preset = "smoke" if smoke else (preset or "")
    if preset and preset not in chapter.presets:
        raise ParameterError(f"chapter {chapter.number} has no preset {preset!r}; "
                             f"it declares: {', '.join(chapter.presets) or 'none'}")
    params = resolve_parameters(chapter, {**chapter.presets.get(preset, {}), **(overrides or {})})
    if preset == "smoke":
        params["enforce_claims"] = False
    output = Path(output or CHAPTERS_OUT / f"{chapter.slug}.ipynb").resolve()
    if output.is_dir():  # a folder: the chapter's notebook goes into it
        output = output / f"{chapter.slug}.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    cpath = claims_path(output)
    cpath.unlink(missing_ok=True)
    rpath = output.with_suffix(".runs.jsonl")
    rpath.unlink(missing_ok=True)
    env_before = {k: os.environ.get(k) for k in ("ICLNB_CLAIMS_JSON", "ICLNB_QUIET", RUNS_ENV)}
    os.environ["ICLNB_CLAIMS_JSON"] = str(cpath)
    os.environ[RUNS_ENV] = str(rpath)
    os.environ["ICLNB_QUIET"] = "1"
    log(f"running chapter {chapter.number} ({chapter.slug}) with {params or 'its defaults'} ...")
    start = time.perf_counter()
    error = ""
    try:
        with ChapterMonitor(output, log=log) if progress else contextlib.nullcontext():
            pm.execute_notebook(chapter.notebook(), str(output), parameters=params, cwd=str(output.parent),
                                kernel_name="python3", progress_bar=not progress and sys.stderr.isatty(),
                                log_output=False, extra_arguments=KERNEL_ARGUMENTS)
    except pm.PapermillExecutionError as e:
        error = f"cell {e.exec_count} (notebook cell index {e.cell_index}) failed: {e.ename}: {e.evalue}"
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - start
    claims = json.loads(cpath.read_text()) if cpath.exists() else {}
    runs = [json.loads(line) for line in rpath.read_text().splitlines()] if rpath.exists() else []
    if error and claims.get("failed") and claims.get("enforced"):
        error = ""  # the claims cell raised ClaimsFailed: a failed claim, reported by Result.ok
    if not error and output.exists():
        error = unformattable_glue(output)
    return Result(chapter, output, params, seconds, error, claims, preset, runs)


def versions() -> dict:
    import numpy
    import torch

    from iclnb import __version__

    return {"iclnb": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cuda": torch.cuda.is_available()}


def _device_words(device) -> str:
    """The device a chapter's ``device`` parameter resolved to on this machine, in words."""
    from iclnb.engine.util import describe_device

    try:
        return describe_device(device)
    except ValueError:
        return "not available here"


def _training_words(runs: list[dict]) -> str:
    """How a chapter's training runs trained, in words: CUDA graphs or eagerly, and why eagerly."""
    if not runs:
        return "It trained no model through the engine."
    graphs = [x for x in runs if x.get("training") == "cuda graphs"]
    cached = sum(bool(x.get("from_cache")) for x in runs)
    devices = ", ".join(f"`{d}`" for d in sorted({x.get("device", "?") for x in runs}))
    if all(str(x.get("device", "")).startswith("cpu") for x in runs):  # no CUDA graphs on a CPU
        text = f"Training: {len(runs)} run(s) on {devices}, eagerly (CUDA graphs exist on GPUs only)"
    else:
        text = (f"Training: {len(runs)} run(s) on {devices}, {len(graphs)} in CUDA graphs and "
                f"{len(runs) - len(graphs)} eagerly")
    notes = sorted({x["training_note"] for x in runs if x.get("training_note")})
    if notes:
        text += " (" + "; ".join(notes[:3]) + ("; ..." if len(notes) > 3 else "") + ")"
    if graphs:
        text += f"; CUDA graph capture {sum(x.get('capture_seconds', 0.0) for x in graphs):.1f} s in all"
    if cached:
        text += f"; {cached} loaded from the run cache (as the original run trained)"
    return text + "."


def _md_row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _scorecard(results: list[Result]) -> list[str]:
    """The book's scorecard: every seed claim in scope, per chapter, with the paper's value where
    it has one, ours, and reproduced / not reproduced / not attempted."""
    from iclnb.bookkit.claims import SCORECARD_HEADERS, scorecard_rows

    rows = [row for r in results for row in scorecard_rows(r.chapter.title, r.claims)]
    if not rows:
        return []
    counts = {k: sum(row[-1] == k for row in rows) for k in ("reproduced", "not reproduced", "not attempted")}
    return ["", "## Scorecard", "",
            "Every claim of the papers in the chapters' scope: the evidence checks (each holds only when "
            "the simpler explanation it rules out, its null, fails the same threshold in the same run), "
            "the findings declared before the run, and the claims no chapter attempts. "
            + ", ".join(f"{v} {k}" for k, v in counts.items()) + ".", "",
            _md_row(SCORECARD_HEADERS), "|" + " --- |" * len(SCORECARD_HEADERS)] + [_md_row(row) for row in rows]


def write_reproducibility_page(results: list[Result], smoke: bool = False) -> Path:
    """The book's "Reproducibility" page: every chapter's claims, parameters, wall time, versions."""
    v = versions()
    lines = ["# Reproducibility", "",
             "This page is written by `iclnb book` when it executes the chapters; it is the record of "
             "the run that produced this copy of the book.", ""]
    if smoke:
        lines += ["```{warning}", "This build ran every chapter with its tiny **smoke** parameters: "
                  "the claims were recorded but not enforced, and the numbers are not meaningful.", "```", ""]
    lines += [f"Built {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with iclnb {v['iclnb']}, "
              f"torch {v['torch']}, numpy {v['numpy']}, Python {v['python']} on `{v['platform']}` "
              f"(CUDA available: {v['cuda']}).", "",
              "| chapter | wall time (s) | claims passed | claims failed | findings not reproduced "
              "| not attempted | status |",
              "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        status = "error" if r.error else ("pass" if r.ok else "claims failed")
        lines.append(f"| {r.chapter.title} | {r.seconds:.1f} | {r.claims.get('passed', 0)} | "
                     f"{r.claims_failed} | {r.claims.get('not_reproduced', 0)} | "
                     f"{r.claims.get('not_attempted', 0)} | {status} |")
    lines += _scorecard(results)
    for r in results:
        full = {p.name: p.default for p in r.chapter.parameters()} | r.parameters
        changed = ", ".join(r.parameters) or "none (defaults)"
        preset = f"the **{r.preset}** preset" if r.preset else "its defaults"
        lines += ["", f"## {r.chapter.title}", "",
                  f"Ran with {preset} on device `{full.get('device', 'n/a')}`, that is "
                  f"{_device_words(full.get('device', 'auto'))}. {_training_words(r.runs)} "
                  f"Parameters (changed from the defaults: {changed}):", "", "```json", json.dumps(full, indent=1),
                  "```", ""]
        if r.error:
            lines += [f"**Error:** {r.error}", ""]
        rows = r.claims.get("claims", [])
        if rows:
            from iclnb.bookkit.claims import ClaimsTable

            lines += [_md_row(ClaimsTable.HEADERS), "|" + " --- |" * len(ClaimsTable.HEADERS)]
            lines += [_md_row(ClaimsTable._cells(c)) for c in rows]
    REPRO_PAGE.write_text("\n".join(lines) + "\n")
    return REPRO_PAGE


def repository_url() -> str:
    """The web address of the book's repository, or "" when there is none to link to.

    ``$ICLNB_REPO_URL`` when set (empty: no repository button), else the git remote ``origin``
    when it is an http(s) URL. Credentials in the URL and a trailing ``.git`` are dropped.
    """
    url = os.environ.get("ICLNB_REPO_URL")
    if url is None:
        try:
            url = subprocess.run(["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True,
                                 text=True).stdout
        except OSError:  # no git
            url = ""
    elif url.strip() and not re.match(r"https?://", url.strip()):
        raise ParameterError(f"ICLNB_REPO_URL={url!r}: expected an http(s) URL, or empty for no repository button")
    m = re.match(r"(https?://)(?:[^/@]*@)?([^/]+/.*?)(?:\.git)?/?$", url.strip())
    return m.group(1) + m.group(2) if m else ""


def write_book_config(repo_url: str, path: Path = ROOT / "_build" / "_config.generated.yml") -> Path:
    """``_config.yml`` with the repository button on for ``repo_url`` (left off when it is empty),
    written to ``path`` for ``jupyter-book build --config``."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    if repo_url:
        config["repository"] = {"url": repo_url}
        config["html"]["use_repository_button"] = True
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# generated by `iclnb book` from _config.yml; edit that file instead\n"
                    + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


def build_html(url: str, log=print) -> int:
    """``jupyter-book build`` of the repository root, warnings as errors, with a repository button
    for ``url`` (none when empty); returns the exit code."""
    log(f"repository button: {url or 'none (set ICLNB_REPO_URL, or a git remote origin with an http(s) URL)'}")
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
           "build", str(ROOT), "--config", str(write_book_config(url)), "-W", "-n", "--keep-going"]
    log("building the book: jupyter-book " + " ".join(cmd[3:]))
    return subprocess.run(cmd, cwd=ROOT).returncode


def build_book(smoke: bool = False, log=print, preset: str | None = None) -> int:
    """Execute every chapter, write the reproducibility page, build the HTML; 0 when all is well.

    ``preset`` (or ``smoke``): run every chapter that declares it with that preset; a chapter
    without it runs at its defaults (said in the log and on the reproducibility page).
    """
    preset = "smoke" if smoke else preset
    url = repository_url()  # before the chapters run: a bad $ICLNB_REPO_URL fails at once
    results = []
    for ch in chapters():
        use = preset if preset in ch.presets else None
        if preset and use is None:
            log(f"chapter {ch.number} declares no {preset!r} preset: it runs at its defaults")
        r = run_chapter(ch, log=log, preset=use)
        if r.error:
            log("  " + r.error + f"\n  partial notebook kept at {r.output}")
        else:
            log(f"  done in {r.seconds:.1f} s")
        results.append(r)
    write_reproducibility_page(results, smoke=smoke)
    code = build_html(url, log=log)
    log("\nchapter                                  wall time  claims                                   status")
    for r in results:
        log(r.summary())
    log(f"total {sum(r.seconds for r in results):.1f} s; book build {'ok' if code == 0 else 'FAILED'}"
        f" -> {ROOT / '_build' / 'html' / 'index.html'}")
    return 0 if code == 0 and all(r.ok for r in results) else 1
