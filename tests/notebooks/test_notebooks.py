"""Every notebook executes top to bottom in a fresh kernel, headless and within a bound.

    nbformat.read ─► NotebookClient (kernel "python3" = this interpreter, cwd notebooks/)
        │  after each cell: note the kernel's descendants (executors, workers, forkserver)
        ▼
    execute ─► kernel shut down ─► every noted process gone? no new dead-owner segment?
        └─► outputs: no error, a figure, and no "invariant <name>: ..." line (a violation
            a notebook's scenario printed fails the test, it is not just text)

The root conftest checks this process's children; the kernel's own children are
grandchildren that outlive a shut-down kernel as orphans, so they are checked here.
To rewrite the README picture (an absolute path: the kernel runs in notebooks/)::

    FAULTLAB_README_IMG=$PWD/docs/img/failure_timeline.png .venv/bin/python -m pytest tests/notebooks
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
manager = pytest.importorskip("jupyter_client.manager")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT_S = 60
NOTEBOOK_BOUND_S = {"failure_timelines.ipynb": 60, "latency.ipynb": 60, "targets.ipynb": 120}
_OWNER_RE = re.compile(r"^faultlab_(\d+)_")
_VIOLATION_RE = re.compile(r"^\s*invariant [\w-]+: .*$", re.MULTILINE)  # failure_timelines' run()


@pytest.fixture
def this_python_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A "python3" kernel spec that runs this interpreter, ahead of any user-wide one.

    ``JUPYTER_PATH`` comes first in the kernel search path, so a ``python3`` spec in
    ``~/.local/share/jupyter`` pointing at another Python cannot take over.
    """
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (faultlab tests)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    assert manager.KernelManager(kernel_name="python3").format_kernel_cmd()[0] == sys.executable
    return "python3"


def test_every_notebook_is_listed_and_committed_without_outputs() -> None:
    found = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == sorted(NOTEBOOK_BOUND_S)
    for name in found:
        book = nbformat.read(NOTEBOOKS / name, as_version=4)
        nbformat.validate(book)
        dirty = [i for i, c in enumerate(book.cells)
                 if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
        assert not dirty, f"{name}: clear the outputs of cells {dirty} before committing"


class _Descendants:
    """The kernel's descendants, noted after every cell (they may be gone by the end)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.kernel_pid: int | None = None
        self.seen: dict[int, psutil.Process] = {}

    def on_cell_executed(self, **_: Any) -> None:
        if self.kernel_pid is None:
            self.kernel_pid = getattr(self.client.km.provisioner, "pid", None)
        if self.kernel_pid is None:
            return
        try:
            for proc in psutil.Process(self.kernel_pid).children(recursive=True):
                self.seen.setdefault(proc.pid, proc)
        except psutil.NoSuchProcess:
            pass

    def survivors(self, wait_s: float = 10.0) -> list[psutil.Process]:
        deadline = time.monotonic() + wait_s
        while True:
            alive = [p for p in self.seen.values() if _running(p)]
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _leaked_segments(before: set[str], kernel_pid: int | None) -> list[str]:
    """New ``faultlab_<pid>_`` segments of the kernel or of a process that is gone."""
    leaked = []
    for name in sorted(set(os.listdir("/dev/shm")) - before):
        match = _OWNER_RE.match(name)
        if match and (int(match.group(1)) == kernel_pid or not psutil.pid_exists(int(match.group(1)))):
            leaked.append(name)
    return leaked


@pytest.mark.slow
@pytest.mark.timeout(max(NOTEBOOK_BOUND_S.values()) + 60)
@pytest.mark.parametrize("name", sorted(NOTEBOOK_BOUND_S))
def test_notebook_executes(name: str, this_python_kernel: str) -> None:
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    book.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    shm_before = set(os.listdir("/dev/shm"))
    watch = _Descendants()
    client = nbclient.NotebookClient(
        book, timeout=CELL_TIMEOUT_S, kernel_name=this_python_kernel,
        resources={"metadata": {"path": str(NOTEBOOKS)}}, on_cell_executed=watch.on_cell_executed)
    watch.client = client
    started = time.monotonic()
    try:
        client.execute()
    finally:
        elapsed = time.monotonic() - started
        survivors = watch.survivors()
        for proc in survivors:
            proc.kill()
    assert elapsed < NOTEBOOK_BOUND_S[name], f"{name} took {elapsed:.1f} s"
    assert watch.kernel_pid is not None, "could not see the kernel's pid: its children went unchecked"
    assert not survivors, f"{name}: processes outlived the kernel: {[p.pid for p in survivors]}"
    assert not _leaked_segments(shm_before, watch.kernel_pid)
    assert book.cells[-1].outputs[0].text.strip() == sys.executable
    _check_outputs(name, book)


def _check_outputs(name: str, book: Any) -> None:
    outputs = [o for c in book.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    violations = violation_lines(outputs)
    assert not violations, f"{name}: its scenarios broke invariants: {violations}"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no figure"


def violation_lines(outputs: list[Any]) -> list[str]:
    """The "invariant <name>: <message>" lines a notebook printed (stream outputs)."""
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    return [m.strip() for m in _VIOLATION_RE.findall(text)]


def test_a_printed_violation_fails_the_notebook_check() -> None:
    """The check above reads the lines failure_timelines' run() prints for each violation."""
    printed = [nbformat.v4.new_output("stream", name="stdout", text=(
        "kill_worker: outcome fail_fast, 3 calls, wall 0.25 s\n"
        "  invariant leak: file descriptor 69 (anon_inode:[eventfd]) was left open\n"))]
    assert violation_lines(printed) == [
        "invariant leak: file descriptor 69 (anon_inode:[eventfd]) was left open"]
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("run()", outputs=printed)])
    with pytest.raises(AssertionError, match="broke invariants"):
        _check_outputs("failure_timelines.ipynb", book)
    assert violation_lines([nbformat.v4.new_output("stream", name="stdout", text="ok\n")]) == []
