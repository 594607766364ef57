"""Shared fixtures: the leak check every test gets, and executors for every start method.

A test marked ``ray_contract`` also runs against ``RayExecutor`` (its ``start_method``
parameter "ray"), on one two-node ``LocalRayCluster`` started for the session on first use
(~30 s on a loaded machine).  The cluster's processes are not a test's leak; the actors of
every executor a test made must be gone once it is shut down.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import leaks

from executor import ExecutorConfig, MultiprocExecutor

START_METHODS = ("fork", "forkserver", "spawn")
RAY = "ray"  # the start_method parameter that means RayExecutor
# Hunts with tight timing bounds (the Hypothesis machines, the fd-pressure catches): beside a
# second xdist worker's load they reported the load instead of the planted bug, so the README's
# test command runs them after the parallel part, alone.
# Timing-tight hunts: beside a second xdist worker they report its load, not the planted bug
# (the reaper hunts race the mutant's own waitpid for each worker's exit).
SOLO = ("tests/property/", "tests/chaos_tests/test_interrupt_and_fd_chaos.py",
        "tests/chaos_tests/test_outside_reaper.py::test_the_outside_reaper_catches")
_ray_cluster: list[object] = []  # the session's LocalRayCluster, once started


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray_contract: also run the test against RayExecutor")
    config.addinivalue_line("markers", "xdist_group(name): run the group on one xdist worker")
    config.addinivalue_line("markers", "solo: timing-tight hunts, run alone (pytest -m solo)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """For ``pytest -n 2 --dist loadgroup`` (the README's test command): a module's tests stay
    on one worker, so its module-scoped runs (a vLLM engine, a traced demo) happen once, and
    every RayExecutor test goes to one worker, so one Ray cluster serves them all."""
    for item in items:
        if any(part in item.nodeid for part in SOLO):
            item.add_marker(pytest.mark.solo)
        params = getattr(item, "callspec", None)
        on_ray = params is not None and params.params.get("start_method") == RAY
        item.add_marker(pytest.mark.xdist_group("ray" if on_ray else item.nodeid.split("::")[0]))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "start_method" not in metafunc.fixturenames or any(
        "start_method" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")
    ):
        return  # not an executor test, or one that picks its own start methods
    methods: list[object] = list(START_METHODS)
    if metafunc.definition.get_closest_marker("ray_contract") is not None:
        methods.append(pytest.param(RAY, marks=[  # the first one starts the cluster: 20-40 s
            pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
            pytest.mark.timeout(300)]))
    metafunc.parametrize("start_method", methods, indirect=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    ray = sys.modules.get("ray")
    if _ray_cluster and ray is not None and ray.is_initialized():
        ray.shutdown()  # a driver left connected would abort once its cluster is gone
    while _ray_cluster:
        _ray_cluster.pop().shutdown()  # type: ignore[attr-defined]


def session_ray_cluster() -> object:
    """The session's two-node Ray cluster (started now if it is not yet)."""
    if not _ray_cluster:
        from executor.ray_cluster import LocalRayCluster

        cluster = LocalRayCluster(nodes=2, cpus=2)
        _ray_cluster.append(cluster)
        for node in cluster.nodes:
            leaks.exempt_tree(node.keeper.pid)
    return _ray_cluster[0]


@pytest.fixture(autouse=True)
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """A test's SIGINT raises KeyboardInterrupt, as in a plain Python process: pytest-xdist's
    workers ignore SIGINT (the controller owns Ctrl-C), which would leave the interrupt tests
    testing nothing."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test, pass or fail, that leaves a process, a segment or a thread behind."""
    before = leaks.shm_names()
    yield
    problems = leaks.check(before)
    assert not problems, "; ".join(problems)


@pytest.fixture
def ray_cluster() -> object:
    """The session's ``LocalRayCluster`` (executor/ray_cluster.py), started on first use."""
    return session_ray_cluster()


@pytest.fixture
def start_method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_executor(start_method: str) -> Iterator[Callable[..., MultiprocExecutor]]:
    """Build executors with this test's start method; every one is shut down afterwards."""
    made: list[MultiprocExecutor] = []

    def make(**overrides: object) -> MultiprocExecutor:
        if start_method == RAY:
            return make_ray(**overrides)
        fields = {"tensor_parallel_size": 2, "start_method": start_method, **overrides}
        ex = MultiprocExecutor(ExecutorConfig(**fields))  # type: ignore[arg-type]
        made.append(ex)
        return ex

    def make_ray(**overrides: object) -> MultiprocExecutor:
        from executor import RayExecutor

        address = session_ray_cluster().address  # type: ignore[attr-defined]
        cfg = ExecutorConfig(**{"tensor_parallel_size": 2, **overrides})  # type: ignore[arg-type]
        ex = RayExecutor(cfg, address=address)
        made.append(ex)  # type: ignore[arg-type]
        return ex  # type: ignore[return-value]  # the same contract

    yield make
    pids = [pid for ex in made for pid in ex.worker_pids]
    for ex in made:
        ex.shutdown()
    if start_method == RAY:
        assert leaks.wait_gone(pids, 10.0) == [], "actors outlived their executor's shutdown"


@pytest.fixture
def executor(make_executor: Callable[..., MultiprocExecutor]) -> MultiprocExecutor:
    """Two echo workers."""
    return make_executor()
