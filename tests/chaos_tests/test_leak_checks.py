"""The leak checks judge only what the code under test made.

- tests/leaks.py (every test's autouse check): only ``faultlab_<this pid>_`` names in
  /dev/shm are judged; another program's entries (``psm_*``) come and go freely.
- chaos/resources.py (the scenario leak oracle): the fds multiprocessing keeps for its
  session helpers, started lazily by a process's first spawn, are not the scenario's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import leaks
import pytest

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
