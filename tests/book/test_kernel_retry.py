"""A chapter's kernel that fails to start is started again (said on the console), a kernel that
dies in a cell is not, and many short runs started at once all finish."""

import pytest
import zmq
from fake_chapter import front_matter, write_chapter

from iclnb.bookkit import runner, sweep

pytestmark = pytest.mark.notebook

TINY = front_matter('a notebook that only starts its kernel') + """

# 97. Tiny

```{code-cell} ipython3
:tags: [parameters]
seed = 0  # random seed
die = False  # end the kernel's process in the cell after the parameters
```

```{code-cell} ipython3
import os

if die:
    os._exit(1)
print(seed)
```
"""


@pytest.fixture
def tiny(tmp_path):
    return write_chapter(tmp_path, "97_tiny", TINY)


@pytest.fixture(autouse=True)
def no_wait(monkeypatch):
    monkeypatch.setattr(runner.random, "uniform", lambda a, b: 0.0)  # no pause between tries


def run(chapter, tmp_path, overrides=None):
    said = []
    r = runner.run_chapter(chapter, overrides, output=tmp_path, log=lambda *_: None, progress=False,
                           warn=said.append)
    return r, said


def test_a_start_failure_is_retried_and_said(tiny, tmp_path, monkeypatch):
    real, calls = runner._execute, []

    def fails_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise zmq.error.ZMQError(zmq.EADDRINUSE, "Address already in use")
        return real(*args)

    monkeypatch.setattr(runner, "_execute", fails_once)
    r, said = run(tiny, tmp_path)
    assert r.ok and not r.error and len(calls) == 2
    assert r.kernel_retries == ["ZMQError: Address already in use"]
    assert len(said) == 1 and "the kernel failed to start (ZMQError: Address already in use)" in said[0]
    assert "try 2 of 3" in said[0]


def test_a_kernel_that_dies_before_the_first_cell_is_started_again(tiny, tmp_path, monkeypatch):
    """A real kernel process that exits while starting (before it answers), the first time only."""
    mark = tmp_path / "started-once"
    code = f"import os, pathlib; p = pathlib.Path({str(mark)!r}); p.exists() or (p.touch(), os._exit(1))"
    monkeypatch.setattr(runner, "KERNEL_ARGUMENTS", [*runner.KERNEL_ARGUMENTS, f"--IPKernelApp.exec_lines={[code]}"])
    r, said = run(tiny, tmp_path)
    assert r.ok and mark.exists() and len(r.kernel_retries) == 1 and "Kernel died" in r.kernel_retries[0]
    assert "starting it again" in said[0]


def test_a_kernel_that_never_starts_is_an_error_not_an_exception(tiny, tmp_path, monkeypatch):
    def never(*args):
        raise RuntimeError("Kernel died before replying to kernel_info")

    monkeypatch.setattr(runner, "_execute", never)
    monkeypatch.setattr(runner, "KERNEL_TRIES", 2)
    r, said = run(tiny, tmp_path)
    assert not r.ok and r.error.startswith("the kernel failed to start, 2 times") and len(said) == 1


def test_a_kernel_that_dies_in_a_cell_is_not_started_again(tiny, tmp_path):
    with pytest.raises(RuntimeError, match="Kernel died"):  # nbclient's DeadKernelError, as before
        run(tiny, tmp_path, {"die": True})


def test_many_short_runs_at_once(tiny, tmp_path):
    """Eight kernels started at once by eight worker processes: every run finishes (a start that
    collides on a port is retried; the log line says so)."""
    lines = []
    res = sweep.sweep(tiny, {"seed": list(range(8))}, jobs=8, out=tmp_path / "sw", log=lines.append)
    assert res.ok and len(res.records) == 8, [r["error"] for r in res.failed]
    retried = sum(len(r["kernel_retries"]) for r in res.records)
    assert sum("was started again" in line for line in lines) == sum(bool(r["kernel_retries"]) for r in res.records)
    print(f"{retried} kernel start(s) retried")
