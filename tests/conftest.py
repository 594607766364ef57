"""Shared fixtures: the leak check every test gets, and executors for every start method."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import leaks

from executor import ExecutorConfig, MultiprocExecutor

START_METHODS = ("fork", "forkserver", "spawn")


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test, pass or fail, that leaves a process, a segment or a thread behind."""
    before = leaks.shm_names()
    yield
    problems = leaks.check(before)
    assert not problems, "; ".join(problems)


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_executor(start_method: str) -> Iterator[Callable[..., MultiprocExecutor]]:
    """Build executors with this test's start method; every one is shut down afterwards."""
    made: list[MultiprocExecutor] = []

    def make(**overrides: object) -> MultiprocExecutor:
        fields = {"tensor_parallel_size": 2, "start_method": start_method, **overrides}
        ex = MultiprocExecutor(ExecutorConfig(**fields))  # type: ignore[arg-type]
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown()


@pytest.fixture
def executor(make_executor: Callable[..., MultiprocExecutor]) -> MultiprocExecutor:
    """Two echo workers."""
    return make_executor()
