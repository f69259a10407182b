"""Executing chapters: jupytext source -> papermill -> executed notebook + claims JSON.

The chapter sources are ``notebooks/NN_slug.md`` (MyST markdown read by jupytext). Each has
exactly one cell tagged ``parameters``, one ``name = value  # help`` per line, and an ``iclnb``
block in its front matter with a one-line ``description`` and its *presets*: the tiny ``smoke``
parameters (claims recorded, not enforced) and, where the chapter declares it, ``paper``: the
parameters that re-run the paper's experiment at the paper's scale (claims enforced).

:func:`run_chapter` executes one chapter (starting its kernel again when the kernel fails to
start); :func:`write_reproducibility_page` records a build's runs. :mod:`iclnb.bookkit.book`
builds the whole book with them.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import os
import platform
import random
import re
import subprocess
import sys
import threading
import time
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from iclnb import __version__
from iclnb.bookkit.progress import ChapterMonitor
from iclnb.contract import CHAPTER_SOURCE, CLAIMS_JSON, NOTEBOOKS, PRESET, QUIET, ROOT, RUNS

CHAPTERS_OUT = ROOT / "book" / "chapters"
CHAPTER_FILE = re.compile(r"^(\d\d)_([a-z0-9_]+)\.md$")
PRESETS = ("smoke", "paper")  # named parameter sets a chapter may declare in its front matter
KINDS = ("chapter", "how-to")  # what a page is (Chapter.kind)


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
    def kind(self) -> str:
        """What the page is, from its front matter (``iclnb: kind:``): ``"chapter"`` (the default: it
        re-runs experiments of a paper and checks its claims) or ``"how-to"`` (it shows the tools,
        e.g. the sweep page; no claims of the papers, no robustness record)."""
        kind = self.meta.get("kind", "chapter")
        if kind not in KINDS:
            raise ParameterError(f"{self.path.name}: iclnb.kind={kind!r}; one of {KINDS}")
        return kind

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
    kernel_retries: list = field(default_factory=list)  # why each failed start of its kernel failed
    kernel_log: str = ""  # the kernel's own stderr/stdout, kept beside the notebook when it said more than noise

    @property
    def claims_failed(self) -> int:
        return int(self.claims.get("failed", 0))

    @property
    def ok(self) -> bool:
        return not self.error and not (self.claims.get("enforced") and self.claims_failed)

    @property
    def status(self) -> str:
        """"error", "claims not enforced" (``enforce_claims`` off: nothing passed or failed),
        "pass" or "claims failed"."""
        if self.error:
            return "error"
        if self.claims and not self.claims.get("enforced"):
            return "claims not enforced"
        return "pass" if self.ok else "claims failed"

    def summary(self) -> str:
        state = {"error": "ERROR", "pass": "ok", "claims failed": "CLAIMS FAILED"}.get(self.status, self.status)
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


GLUED = "application/papermill.record/"  # the mime prefix of myst_nb.glue's outputs


def crowded_figures(notebook: Path) -> str:
    """An error naming each figure cell of an executed notebook that shows more than its figure,
    or "". MyST-NB wraps every rich output of a cell whose metadata names a figure (``mystnb:
    figure: {caption, name}``) in that figure, so a table or verdict box beside the image renders
    two targets of one name and the HTML build fails far from the cause; the fix is in the chapter
    source: the table or box goes in a cell of its own."""
    crowded = []
    for cell in json.loads(Path(notebook).read_text()).get("cells", []):
        figure = (cell.get("metadata") or {}).get("mystnb", {}).get("figure")
        rich = [o.get("data") or {} for o in cell.get("outputs") or []
                if o.get("output_type") in ("display_data", "execute_result")]
        shown = [d for d in rich if not all(k.startswith(GLUED) for k in d)]  # a glue is not rendered here
        if figure and any(not any(k.startswith("image/") for k in d) for d in shown):
            crowded.append(figure.get("name", "?"))
    return ("figure cells that show more than their figure (give the table or verdict box its own cell): "
            + ", ".join(crowded)) if crowded else ""


_RUN_LOCK = threading.Lock()  # the kernel inherits os.environ: one chapter at a time per process
# the kernel's own log at ERROR: ipykernel warns "Kernel is running over TCP without encryption" on
# every start (the kernel is local, started by papermill on the loopback interface); a reader of
# `iclnb run` should not see it. Errors of the kernel, and everything the notebook prints, still show.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]
# what a kernel logs of its own is not the chapter's output. The kernel inherits its starter's
# stdout and stderr; where that starter is itself a notebook's kernel (a sweep page's workers),
# ipykernel forwards those descriptors into the page as a stderr stream, and a kernel interrupted
# while idle (jupyter_client interrupts a kernel before shutting it down) logs "[IPKernelApp]
# ERROR | KeyboardInterrupt caught in kernel." there. Kernels started here write both to
# <notebook>.kernel.log instead, kept only when it holds more than these lines.
KERNEL_NOISE = re.compile(r"KeyboardInterrupt caught in kernel|running over TCP without encryption")


def _kernel_manager(log_file):
    """An ``AsyncKernelManager`` class (nbclient's ``kernel_manager_class``) that starts kernels
    with stdout and stderr to the open file ``log_file``."""
    from jupyter_client import AsyncKernelManager

    class LoggedKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            kw.setdefault("stdout", log_file)
            kw.setdefault("stderr", log_file)
            return await super().start_kernel(**kw)

    return LoggedKernelManager


def _kernel_log_lines(path: Path) -> list[str]:
    """The lines of a kernel log that say more than :data:`KERNEL_NOISE`."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip() and not KERNEL_NOISE.search(line)]


def run_chapter(chapter: Chapter, overrides: dict | None = None, output: Path | None = None,
                smoke: bool = False, log=print, preset: str | None = None, progress: bool = True,
                warn=None) -> Result:
    """Execute ``chapter`` with papermill; never raises on a failing cell (see ``Result.error``).

    ``preset``: run with one of the chapter's presets (overrides still win): ``"smoke"`` (tiny
    parameters, claims not enforced; ``smoke=True`` is the same) or ``"paper"`` (the paper's
    scale). ``output``: the executed notebook's path, or an existing folder to put
    ``NN_name.ipynb`` into. The partial notebook of a failed run is kept at ``output``. ``progress``: log the
    running cell and the training inside it while the chapter runs (``iclnb.bookkit.progress``).
    Chapters run one at a time in a process (their kernels inherit its environment); run
    chapters in parallel in separate processes (``iclnb sweep`` does).

    A kernel that fails to start (two kernels started at once picked the same port: ``ZMQError:
    Address already in use``), or dies before its first cell, is started again, up to
    ``KERNEL_TRIES`` times in all; each retry is said through ``warn`` (default ``log``) and kept
    in ``Result.kernel_retries``.
    """
    with _RUN_LOCK:
        return _run_chapter(chapter, overrides, output, smoke, log, preset, progress, warn)


def _run_chapter(chapter, overrides, output, smoke, log, preset, progress, warn) -> Result:
    import papermill as pm

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
    kpath = output.with_suffix(".kernel.log")
    env_before = {k: os.environ.get(k) for k in (CLAIMS_JSON, QUIET, RUNS, CHAPTER_SOURCE, PRESET)}
    os.environ[CLAIMS_JSON] = str(cpath)
    os.environ[CHAPTER_SOURCE] = str(chapter.path)  # Claims reads the claim spec and findings there
    os.environ[PRESET] = preset
    os.environ[RUNS] = str(rpath)
    os.environ[QUIET] = "1"
    log(f"running chapter {chapter.number} ({chapter.slug}) with {params or 'its defaults'} ...")
    start = time.perf_counter()
    error, retries = "", []
    try:
        with (ChapterMonitor(output, log=log) if progress else contextlib.nullcontext(),
              open(kpath, "w") as klog):
            for attempt in range(1, KERNEL_TRIES + 1):
                output.unlink(missing_ok=True)  # so that _started sees this try's notebook only
                try:
                    _execute(chapter.notebook(), output, params, progress, klog)
                    break
                except pm.PapermillExecutionError:
                    raise
                except Exception as e:  # noqa: BLE001 - a kernel that never ran a cell is started again
                    if _started(output):
                        raise
                    why = f"{type(e).__name__}: {e}"
                    if attempt == KERNEL_TRIES:
                        error = f"the kernel failed to start, {KERNEL_TRIES} times; the last: {why}"
                        break
                    retries.append(why)
                    (warn or log)(f"chapter {chapter.number}: the kernel failed to start ({why}); "
                                  f"starting it again (try {attempt + 1} of {KERNEL_TRIES})")
                    time.sleep(random.uniform(0.5, 2.0) * attempt)  # parallel starts drift apart
    except pm.PapermillExecutionError as e:
        error = f"cell {e.exec_count} (notebook cell index {e.cell_index}) failed: {e.ename}: {e.evalue}"
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - start
    said = _kernel_log_lines(kpath)
    if not said:
        kpath.unlink(missing_ok=True)
    else:
        log(f"chapter {chapter.number}: its kernel logged {len(said)} line(s) of its own, kept in {kpath}")
    claims = json.loads(cpath.read_text()) if cpath.exists() else {}
    runs = [json.loads(line) for line in rpath.read_text().splitlines()] if rpath.exists() else []
    if error and claims.get("failed") and claims.get("enforced"):
        error = ""  # the claims cell raised ClaimsFailed: a failed claim, reported by Result.ok
    if not error and output.exists():
        error = unformattable_glue(output) or crowded_figures(output)
    if error and said:
        error += f" (the kernel's log, {kpath}, ends: {' | '.join(said[-3:])})"
    return Result(chapter, output, params, seconds, error, claims, preset, runs, retries, str(kpath) if said else "")


KERNEL_TRIES = 3  # starts of a chapter's kernel before its run is an error (see _run_chapter)


def _execute(nb, output: Path, params: dict, progress: bool, kernel_log=None) -> None:
    """One papermill execution of the notebook ``nb`` into ``output`` (raises what papermill raises);
    the kernel's own stdout and stderr go to the open file ``kernel_log`` (None: inherited)."""
    import papermill as pm

    extra = {"kernel_manager_class": _kernel_manager(kernel_log)} if kernel_log is not None else {}
    pm.execute_notebook(nb, str(output), parameters=params, cwd=str(output.parent), kernel_name="python3",
                        progress_bar=not progress and sys.stderr.isatty(), log_output=False,
                        extra_arguments=KERNEL_ARGUMENTS, **extra)


def _started(output: Path) -> bool:
    """Whether a cell of the executed notebook at ``output`` began to run (papermill stamps its start)."""
    try:
        cells = json.loads(output.read_text()).get("cells", [])
    except (OSError, ValueError):
        return False
    return any((c.get("metadata", {}).get("papermill") or {}).get("start_time") for c in cells)


def versions() -> dict:
    import numpy
    import torch

    return {"iclnb": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cuda": torch.cuda.is_available()}


# what a device parameter resolves to, in words, as iclnb.engine.util.describe_device says it: asked of
# torch in a child process (the runner neither imports the engine nor holds a CUDA context itself)
_DEVICE_WORDS = """import os, sys, torch
d = sys.argv[1]
try:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu") if d in ("auto", "None") else torch.device(d)
except (RuntimeError, TypeError, ValueError):
    dev = None
cuda = dev is not None and dev.type == "cuda" and torch.cuda.is_available()
if dev is not None and dev.type == "cpu":
    print(f"cpu ({os.cpu_count()} cores)")
elif cuda and (dev.index or 0) < torch.cuda.device_count():
    i = dev.index if dev.index is not None else torch.cuda.current_device()
    print(f"cuda:{i} ({torch.cuda.get_device_name(i)})")
else:
    print("not available here")
"""


@functools.lru_cache(maxsize=None)
def device_words(device="auto") -> str:
    """The device a chapter's ``device`` parameter resolves to on this machine, in words:
    ``"cpu (2 cores)"``, ``"cuda:0 (NVIDIA H100 ...)"``, or ``"not available here"``."""
    try:
        out = subprocess.run([sys.executable, "-c", _DEVICE_WORDS, str(device)], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (torch did not answer)"
    return out.stdout.strip() or "unknown (torch did not answer)"

