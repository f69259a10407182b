"""Progress of long runs: the training loop's state file and the runner's monitor."""

import json

from iclnb.bookkit import progress
from iclnb.engine import progress as writer
from iclnb.engine.train import TrainConfig, train


def test_training_writes_its_progress(tmp_path, monkeypatch, fresh_cache):
    path = tmp_path / "p.json"
    monkeypatch.setenv(progress.ENV, str(path))
    monkeypatch.setattr(writer, "_last_write", [-1e9])
    train(TrainConfig(heads=(1, 2), d=2, n=4, steps=40, batch=8, log_every=20, device="cpu"), progress=False)
    state = json.loads(path.read_text())
    assert state["desc"] == "softmax heads=[1, 2]" and state["steps"] == 40 and state["step"] in (20, 40)
    assert isinstance(state["loss"], float)
    line = progress.describe_training({**state, "step": 10, "elapsed": 5.0})
    assert "step 10/40 (25%)" in line and "about 0:15 left" in line


def test_no_file_no_cost(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    writer.training_update("x", 1, 2, lambda: 1 / 0, 0.0, force=True)  # the loss is never read


def test_monitor_names_the_running_cell_and_its_training(tmp_path):
    nb = tmp_path / "ch.ipynb"
    cells = [{"cell_type": "markdown", "source": ["## Training every head count\n"], "metadata": {}},
             {"cell_type": "code", "source": ["run = train(cfg)\n"], "metadata": {"papermill": {"status": "running"}}},
             {"cell_type": "code", "source": ["plot(run)\n"], "metadata": {"papermill": {"status": "pending"}}}]
    nb.write_text(json.dumps({"cells": cells}))
    assert progress.running_cell(nb) == (2, 3, "Training every head count")
    lines = []
    with progress.ChapterMonitor(nb, log=lines.append, every=0.2, poll=0.05) as mon:
        writer.training_update("softmax heads=[1]", 50, 100, 0.25, 0.0, force=True)
        import time

        time.sleep(0.6)
    assert lines and "cell 2/3 (Training every head count): softmax heads=[1] step 50/100 (50%)" in lines[-1]
    assert not mon.file.exists()  # cleaned up
    nb.write_text("{ half written")
    assert progress.running_cell(nb) is None
