"""The leak checks judge only what the code under test made.

- tests/leaks.py (every test's autouse check): only ``faultlab_<this pid>_`` names in
  /dev/shm are judged; another program's entries (``psm_*``) come and go freely.
- chaos/resources.py (the scenario leak oracle): the fds multiprocessing keeps for its
  session helpers, started lazily by a process's first spawn, are not the scenario's; nor,
  in a Jupyter kernel, the eventfd of the output socket ipykernel gives each thread that prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import leaks
import pytest

from chaos import resources
from executor.shm import PREFIX, SHM_DIR

CHILD = Path(__file__).with_name("fresh_scenario.py")
ROOT = Path(__file__).resolve().parents[2]


def _make_entry(name: str) -> Path:
    path = Path(SHM_DIR) / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    return path


@pytest.fixture
def shm_entry(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A /dev/shm entry named by the test's parameter, created in the test body's time and
    removed after it."""
    path = _make_entry(request.param.format(pid=os.getpid(), token=uuid.uuid4().hex[:12]))
    request.addfinalizer(lambda: path.unlink(missing_ok=True))
    yield path


@pytest.mark.parametrize("shm_entry", [
    "psm_{token}",  # what multiprocessing.shared_memory names its segments
    "another_program_{token}",
    PREFIX + "1_{token}_req",  # pid 1 is never this test: another run's segment
], indirect=True)
def test_foreign_shm_entry_is_not_reported(shm_entry: Path) -> None:
    before = leaks.shm_names() - {shm_entry.name}  # as if it appeared during the test
    assert leaks.check(before, wait_s=0.0) == []
    assert shm_entry.exists()  # not ours: not unlinked either


@pytest.mark.parametrize("shm_entry", [PREFIX + "{pid}_{token}_req"], indirect=True)
def test_leaked_segment_of_this_process_is_reported_and_removed(shm_entry: Path) -> None:
    before = leaks.shm_names() - {shm_entry.name}
    assert leaks.check(before, wait_s=0.0) == [f"/dev/shm/{shm_entry.name} outlived the test"]
    assert not shm_entry.exists()


def _fresh_scenario(start_method: str, out: Path, *extra: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(CHILD), start_method, str(out), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    violations: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return violations


@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_first_scenario_of_a_process_with_empty_plan_has_no_violation(
    start_method: str, tmp_path: Path,
) -> None:
    assert _fresh_scenario(start_method, tmp_path / "out") == []


def test_first_scenario_still_reports_a_real_descriptor_leak(tmp_path: Path) -> None:
    violations = _fresh_scenario("spawn", tmp_path / "out", "leak-pipe")
    assert len(violations) == 2, violations  # both ends of the pipe, nothing else
    assert all("file descriptor" in v and "pipe:" in v for v in violations), violations


class _KernelStream:
    """What ipykernel's OutStream shows of itself: ``pub_thread._event_pipes``, one zmq
    socket per thread that wrote (ipykernel.iostream.IOPubThread._event_pipe)."""

    def __init__(self, pipes: dict[threading.Thread, object]) -> None:
        self.pub_thread = type("IOPubThread", (), {"_event_pipes": pipes})()

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def test_kernel_output_socket_of_a_thread_is_not_a_leak_but_our_eventfd_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    iopub = ctx.socket(zmq.PUB)  # the kernel's sockets (and its context's fds) predate the run
    before = resources.snapshot()
    pipes: dict[threading.Thread, object] = {}
    thread = threading.Thread(target=lambda: pipes.update(
        {threading.current_thread(): ctx.socket(zmq.PUSH)}))
    thread.start()
    thread.join()  # the thread printed, then ended: ipykernel closes its socket up to 10 s later
    ours = os.eventfd(0)
    try:
        monkeypatch.setattr(sys, "stdout", _KernelStream(pipes))
        problems = resources.leaks(before, [], os.getpid(), (), wait_s=0.0)
        monkeypatch.setattr(sys, "stdout", sys.__stdout__)
        without_kernel = resources.leaks(before, [], os.getpid(), (), wait_s=0.0)
    finally:
        os.close(ours)
        for socket in [iopub, *pipes.values()]:
            socket.close(linger=0)  # type: ignore[attr-defined]
        ctx.term()
    assert problems == [f"file descriptor {ours} (anon_inode:[eventfd]) was left open"]
    assert len(without_kernel) == 2  # the check is not blind to eventfds: with no kernel, both
