"""Command line: ``python -m iclnb`` (or ``iclnb``) list | params CH | export CH [-o PATH] |
run CH [-p NAME VALUE] [--preset P] |
sweep CH -p NAME V1 V2 ... [--preset P] [--jobs N] [--out DIR] [--scheduler ADDRESS] |
robustness CH [--seeds S ...] [--jobs N] [--out DIR] [--scheduler ADDRESS] | book [--smoke | --preset P] |
check-pages."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from iclnb.bookkit import book, pagecheck, robustness, runner, sweep
from iclnb.bookkit.records import training_line


def _list(args) -> int:
    for ch in runner.chapters():
        print(f"{ch.number:2d}  {ch.slug:40s} {ch.description}")
    return 0


def papermill_line(ch: runner.Chapter, values: dict, output: str | None = None) -> str:
    """A papermill command line that runs the executed notebook of ``ch`` (``book/chapters/``, or
    the book's download button, or ``iclnb export``) with ``values``: scalars as ``-p NAME VALUE``,
    lists and dicts in one ``-y`` YAML mapping (papermill's ``-p`` passes them as strings)."""
    import shlex

    import yaml
    from papermill.cli import _resolve_type

    # -p types a value by its look: a string that reads as a number, a bool or None goes in -y too
    scalars = {k: v for k, v in values.items() if not isinstance(v, (list, tuple, dict))
               and not (isinstance(v, str) and _resolve_type(v) != v)}
    rest = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if k not in scalars}
    words = ["papermill", f"book/chapters/{ch.slug}.ipynb", output or f"{ch.slug}.out.ipynb"]
    for k, v in scalars.items():
        words += ["-p", k, str(v)]
    line = " ".join(shlex.quote(w) for w in words)
    if rest:
        flow = yaml.safe_dump(rest, default_flow_style=True, width=10_000).strip()
        line += f' -y "{flow}"'
    return line


def _params(args) -> int:
    ch = runner.find_chapter(args.chapter)
    print(f"chapter {ch.number}: {ch.title}\n")
    params = ch.parameters()
    width = max(len(p.name) for p in params)
    for p in params:
        note = "  (papermill: -y)" if isinstance(p.default, (list, tuple, dict)) else ""
        print(f"  {p.name:{width}s}  {p.type:6s} = {p.default!r:12}  {p.help}{note}")
    for name, values in ch.presets.items():
        print(f"\n  {name} preset (iclnb run {ch.number} --preset {name}): {values}")
    smoke = ch.presets.get("smoke", {}) | ({"enforce_claims": False} if "smoke" in ch.presets else {})
    print("\n  with papermill (it reads .ipynb only: the executed notebook from book/chapters/ or the book's\n"
          f"  download button, or `iclnb export {ch.number}`; lists and dicts go in papermill's -y YAML, not -p):")
    print("    " + papermill_line(ch, smoke or {"seed": 1}, f"{ch.slug}.smoke.ipynb"))
    return 0


def export_chapter(chapter: runner.Chapter, output: str | os.PathLike | None = None) -> Path:
    """Write ``chapter``'s source as a Jupyter notebook (``.ipynb``, what papermill and Jupyter read)
    to ``output``: a path ending in ``.ipynb``, else a folder (made if needed) for ``NN_name.ipynb``;
    default the working directory."""
    import jupytext

    path = Path(output or ".")
    if path.suffix != ".ipynb":
        path = path / f"{chapter.slug}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(chapter.notebook(), path, fmt="ipynb")
    return path


def _export(args) -> int:
    ch = runner.find_chapter(args.chapter)
    path = export_chapter(ch, args.output)
    print(f"{path}  (papermill {path} out.ipynb -p NAME VALUE; `iclnb params {ch.number}` lists the names)")
    return 0


def _run(args) -> int:
    ch = runner.find_chapter(args.chapter)
    overrides = dict(args.param or [])
    if len(overrides) != len(args.param or []):
        raise runner.ParameterError("a parameter is given twice")
    r = runner.run_chapter(ch, overrides, output=args.output, smoke=args.smoke, preset=args.preset)
    print(f"executed notebook: {r.output}")
    if r.error:
        print(f"chapter {ch.number} failed: {r.error}\n(partial notebook kept at {r.output})", file=sys.stderr)
    for c in r.claims.get("claims", []):
        print(f"  [{c['status']:8s}] {c['text']}: {c['value']} {c['condition']}")
    print(r.summary())
    print(f"  training: {training_line(r.runs)}")
    return 0 if r.ok else 1


def _sweep(args) -> int:
    grid = {}
    for name, *values in args.param or []:
        if name in grid:
            raise runner.ParameterError(f"parameter {name!r} is given twice")
        grid[name] = values
    fixed = dict(args.set or [])
    result = sweep.sweep(args.chapter, grid, preset=args.preset, jobs=args.jobs, out=args.out,
                         scheduler=args.scheduler, fixed=fixed)
    for r in result.failed:
        print(f"run {r['name']} failed: {r['error']} (partial notebook: {r.get('notebook', '-')})", file=sys.stderr)
    return 0 if result.ok else 1


def _robustness(args) -> int:
    record = robustness.robustness(args.chapter, args.seeds, jobs=args.jobs, scheduler=args.scheduler, out=args.out,
                                   preset=args.preset)
    return 1 if record["errors"] else 0


def _book(args) -> int:
    return book.build_book(smoke=args.smoke, preset=args.preset)


def _check_pages(args) -> int:
    return pagecheck.main(args.html, args.screenshots)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="iclnb", description="Run the chapters of the iclnb book.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the chapters, with a one-line description each").set_defaults(fn=_list)
    p = sub.add_parser("params", help="a chapter's parameters, defaults and help")
    p.add_argument("chapter", help="chapter number or (part of its) name")
    p.set_defaults(fn=_params)
    p = sub.add_parser("export", help="write a chapter source as a Jupyter notebook (.ipynb), for papermill or "
                       "Jupyter")
    p.add_argument("chapter", help="chapter number or (part of its) name")
    p.add_argument("-o", "--output", help="the .ipynb path, or a folder to put NN_name.ipynb into (default: the "
                   "working directory)")
    p.set_defaults(fn=_export)
    p = sub.add_parser("run", help="execute one chapter with papermill")
    p.add_argument("chapter", help="chapter number or (part of its) name")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a parameter (repeatable); see `iclnb params CH`")
    p.add_argument("-o", "--output",
                   help="executed notebook path, or a folder to put NN_name.ipynb into (default book/chapters/)")
    p.add_argument("--smoke", action="store_true", help="tiny smoke parameters, claims not enforced")
    p.add_argument("--preset", choices=runner.PRESETS,
                   help="a preset of the chapter: smoke, or paper (the paper's scale)")
    p.set_defaults(fn=_run)
    p = sub.add_parser("sweep", help="run a chapter over the Cartesian product of parameter values, "
                       "collecting every run's claims into one table")
    p.add_argument("chapter", help="chapter number or (part of its) name")
    p.add_argument("-p", "--param", nargs="+", action="append", metavar=("NAME", "VALUE"), required=True,
                   help="a parameter and its values (repeatable): -p L 0.5 1 2 -p sigma 0.1 0.4")
    p.add_argument("-s", "--set", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a parameter set to one value in every run (repeatable; not swept)")
    p.add_argument("--preset", choices=runner.PRESETS, help="start every run from this preset of the chapter")
    p.add_argument("--jobs", type=int, help="local worker processes (default: one per CPU core)")
    p.add_argument("--out", help="output folder (default sweeps/NN_name)")
    p.add_argument("--scheduler", help="address of a Dask scheduler (tcp://host:8786) to run on instead of "
                   "local processes; needs the dask extra")
    p.set_defaults(fn=_sweep)
    p = sub.add_parser("robustness", help="run a chapter at its defaults at each of several seeds (claims not "
                       "enforced) and write each claim's value and verdict per seed to book/robustness/NN_name.json")
    p.add_argument("chapter", help="chapter number or (part of its) name")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="the seeds (default 0 1 2 3 4)")
    p.add_argument("--jobs", type=int, help="local worker processes (default: one per CPU core)")
    p.add_argument("--out", help="folder of the runs (default sweeps/robustness/NN_name); finished seeds are "
                   "skipped on a second call")
    p.add_argument("--scheduler", help="address of a Dask scheduler to run on instead of local processes")
    p.add_argument("--preset", choices=runner.PRESETS, help="start every seed's run from this preset; 'paper' "
                   "writes the paper-scale record, book/paper/NN_name.json (runs under sweeps/paper/NN_name)")
    p.set_defaults(fn=_robustness)
    p = sub.add_parser("book", help="execute every chapter and build the HTML book")
    p.add_argument("--smoke", action="store_true", help="tiny smoke parameters, claims not enforced")
    p.add_argument("--preset", choices=runner.PRESETS, help="run every chapter that declares it with this preset")
    p.set_defaults(fn=_book)
    p = sub.add_parser("check-pages", help="open the built book in headless Chromium and fail on what a reader "
                       "would see wrong (raw tables or TeX, errors, broken images or links, requests to other hosts)")
    p.add_argument("--html", default=str(pagecheck.HTML), help="the built book (default %(default)s)")
    p.add_argument("--screenshots", default=str(pagecheck.SCREENSHOTS),
                   help="where the screenshots go (default %(default)s)")
    p.set_defaults(fn=_check_pages)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except runner.ParameterError as e:
        print(f"iclnb: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
