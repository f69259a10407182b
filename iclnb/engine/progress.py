"""The training loop's side of progress reporting: where a run is, written to the file named by
``$ICLNB_PROGRESS`` when that is set (the book's runner, :mod:`iclnb.bookkit.progress`, sets it
and reads the file; neither imports the other, the variable's name is the contract).
"""

from __future__ import annotations

import json
import os
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
