"""The contract between the book's runner and the chapter kernels it starts: where the book lies
and the environment variables that carry a run's settings from one process to the other.

One home for each name. It imports nothing of the package, so every layer may use it. The engine
keeps its own copies of the names it reads (``iclnb.engine.train.RUNS_ENV``, ...) until its next
change (its source is part of the run cache's key); ``tests/test_layers.py`` checks they agree.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository (the book's root)
NOTEBOOKS = ROOT / "notebooks"  # the chapter sources, NN_name.md

# set by the runner for the chapter's kernel
CLAIMS_JSON = "ICLNB_CLAIMS_JSON"  # where the chapter writes its claims JSON
CHAPTER_SOURCE = "ICLNB_CHAPTER_SOURCE"  # the chapter's .md source: its claim spec and findings
PRESET = "ICLNB_PRESET"  # the preset the chapter runs with: "paper", "smoke" or empty
RUNS = "ICLNB_RUNS"  # a file the engine appends one JSON line to per training run (how it trained)
PROGRESS = "ICLNB_PROGRESS"  # a file the engine writes a running training's position to
QUIET = "ICLNB_QUIET"  # "1": no progress bars in the kernel (papermill output stays clean)
# read by the engine wherever it runs
UNTRAINED = "ICLNB_UNTRAINED"  # "1": every model left at its initialisation (the "can it fail" test)
THREADS = "ICLNB_THREADS"  # CPU threads per process (default 1)
PREFETCH = "ICLNB_PREFETCH"  # "1"/"0": draw the next batches in a second thread
CACHE_DIR = "ICLNB_CACHE_DIR"  # the run cache, default ~/.cache/iclnb
CHECKPOINT_SECONDS = "ICLNB_CHECKPOINT_SECONDS"  # seconds of training between checkpoints; "off"
# read by the book's tools
REPO_URL = "ICLNB_REPO_URL"  # the book's repository button (empty: none)
CHROMIUM = "ICLNB_CHROMIUM"  # the browser of `iclnb check-pages`
