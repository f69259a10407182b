"""Progress of long runs, told to the user who started them.

A chapter executed by papermill runs in a kernel whose output the user does not see until it
ends. Two small channels make a long run visible:

* the training loop writes where it is (run, step, loss, seconds) to the file named by
  ``$ICLNB_PROGRESS`` when that is set (:func:`iclnb.engine.progress.training_update`; at most one write a second,
  replaced atomically, so a reader never sees half a line);
* the runner watches that file and the executed notebook, which papermill saves as each cell
  starts, and prints one line when the running cell changes and every ``every`` seconds while
  it trains (:class:`ChapterMonitor`), e.g.::

      [1:25] cell 12/41 (Training every head count): softmax heads=[1, 2, 3, 4, 8] step 6000/20000
             (30%), loss 0.251, about 3:10 left in this run
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

ENV = "ICLNB_PROGRESS"  # = iclnb.engine.progress.ENV (the engine writes, the book reads)


def clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def describe_training(state: dict) -> str:
    """One line for a training state written by :func:`iclnb.engine.progress.training_update`."""
    step, steps = state.get("step", 0), max(int(state.get("steps", 1)), 1)
    text = f"{state.get('desc', 'training')} step {step}/{steps} ({100 * step / steps:.0f}%)"
    if state.get("loss") is not None:
        text += f", loss {state['loss']:.4g}"
    if 0 < step < steps and state.get("elapsed"):
        text += f", about {clock(state['elapsed'] * (steps - step) / step)} left in this run"
    return text


_HEADING = re.compile(r"^#{1,6}\s+(.*)$", re.M)


def _cell_label(cells: list, index: int) -> str:
    """The nearest markdown heading at or above code cell ``index``, else its first line."""
    for cell in reversed(cells[: index + 1]):
        if cell.get("cell_type") == "markdown":
            heads = _HEADING.findall("".join(cell.get("source", "")))
            if heads:
                return heads[-1].strip()
    first = "".join(cells[index].get("source", "")).strip().splitlines()
    return first[0][:60] if first else ""


def running_cell(notebook: Path) -> tuple[int, int, str] | None:
    """(1-based index of the running cell, number of cells, its label) from a notebook that
    papermill is executing, or None when none is running or the file is being written."""
    try:
        cells = json.loads(Path(notebook).read_text()).get("cells", [])
    except (OSError, ValueError):
        return None
    for i, cell in enumerate(cells):
        if cell.get("metadata", {}).get("papermill", {}).get("status") == "running":
            return i + 1, len(cells), _cell_label(cells, i)
    return None


class ChapterMonitor:
    """Print the running cell and the training inside it while papermill executes a chapter.

    Use as a context manager around ``papermill.execute_notebook``; it sets ``$ICLNB_PROGRESS``
    for the kernel (which inherits the environment) and removes the file at the end.
    """

    def __init__(self, notebook: Path, log=print, every: float = 15.0, poll: float = 1.0):
        self.notebook, self.log, self.every, self.poll = Path(notebook), log, every, poll
        self.file = self.notebook.with_name(self.notebook.name + ".progress")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._before = None

    def __enter__(self):
        self.file.unlink(missing_ok=True)
        self._before = os.environ.get(ENV)
        os.environ[ENV] = str(self.file)
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        if self._before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._before
        self.file.unlink(missing_ok=True)
        return False

    def line(self) -> str | None:
        """The current progress line, or None when nothing is known yet."""
        cell = running_cell(self.notebook)
        if cell is None:
            return None
        text = f"[{clock(time.perf_counter() - self._start)}] cell {cell[0]}/{cell[1]}"
        text += f" ({cell[2]})" if cell[2] else ""
        try:
            state = json.loads(self.file.read_text())
        except (OSError, ValueError):
            state = None
        if state and time.time() - state.get("time", 0) < 3 * self.every:  # a run of this cell, still going
            text += ": " + describe_training(state)
        return text

    def _watch(self):
        """A line once a cell has run ``quiet`` seconds (quick cells pass unmentioned), then one
        every ``every`` seconds while it runs."""
        quiet = min(3.0, self.every)
        cell_index, cell_start, last_print = None, 0.0, None
        while not self._stop.wait(self.poll):
            cell = running_cell(self.notebook)
            now = time.perf_counter()
            if cell is None:
                continue
            if cell[0] != cell_index:
                cell_index, cell_start, last_print = cell[0], now, None
            due = now - cell_start >= quiet if last_print is None else now - last_print >= self.every
            if due:
                text = self.line()
                if text:
                    self.log(text)
                    last_print = now
