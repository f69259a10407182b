"""The training loop's side of progress reporting: whether it shows a bar (:func:`show_bar`),
and where a run is, written to the file named by ``$ICLNB_PROGRESS`` when that is set (the
book's runner, :mod:`iclnb.bookkit.progress`, sets it and reads the file; neither imports the
other, the variable's name is the contract).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ENV = "ICLNB_PROGRESS"
_last_write = [0.0]


def training_update(desc: str, step: int, steps: int, loss, started: float, force: bool = False) -> None:
    """Record a training run's position in ``$ICLNB_PROGRESS`` (if set); cheap when it is not.

    ``loss``: a number, or a function returning one (called only when the state is written, so
    that a device value is not read back every step)."""
    path = os.environ.get(ENV)
    now = time.perf_counter()
    if not path or (not force and now - _last_write[0] < 1.0):
        return
    _last_write[0] = now
    loss = loss() if callable(loss) else loss
    state = {"desc": desc, "step": int(step), "steps": int(steps), "loss": loss, "elapsed": now - started,
             "time": time.time()}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        Path(tmp).write_text(json.dumps(state))
        os.replace(tmp, path)
    except OSError:  # progress is a courtesy: never fail a run over it
        pass


def show_bar(progress) -> bool:
    """Whether training shows a progress bar: ``progress`` True/False, or None: a bar on a terminal
    or in a Jupyter kernel, unless ``ICLNB_QUIET`` is set (the book runner sets it for papermill,
    whose kernels cannot otherwise be told from interactive ones)."""
    if progress is not None:
        return bool(progress)
    if os.environ.get("ICLNB_QUIET", "0") not in ("", "0"):
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell" or bool(sys.stderr and sys.stderr.isatty())


def members_words(heads: tuple) -> str:
    """The ensemble in a few words: "heads=[1, 2, 4]", or "20 members (H=1)" for long lists."""
    if len(heads) <= 6:
        return f"heads={list(heads)}"
    hs = sorted(set(heads))
    return f"{len(heads)} members (H={hs[0]})" if len(hs) == 1 else f"{len(heads)} members (H={hs[0]}..{hs[-1]})"
