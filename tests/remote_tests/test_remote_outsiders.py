"""A peer without the secret cannot make the driver buffer what it sends (issue 25, defect 5).

The outsider is chaos's: ``chaos.nodes.OutsiderFlood`` streams frames that claim 512 MiB at
the driver's node port from other processes (a raw ZMTP peer: NULL handshake and one huge
message frame, a PLAIN HELLO of that size, or an endless message of small frames) while
``chaos.surroundings.MemoryWatch`` samples this process's (the driver's) resident memory.

    what                                         executor          expected
    the flood beside authentic calls             the real one      RSS +< 100 MiB, every call right
    a PLAIN HELLO of 512 MiB                     LiftsFrameBound   RSS + > 300 MiB: a violation
    suite scenario "chaos.nodes:outsider_flood"  the real one      no violation
    the same scenario                            LiftsFrameBound   an "outsider" violation
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import FAST_LIVENESS, TwoNodes

from chaos import FaultPlan, run_scenario
from chaos.mutants import LiftsFrameBound
from chaos.nodes import OutsiderFlood, outsider_flood
from chaos.runner import run_one
from chaos.suites import load_suite
from executor import ExecutorConfig, MultiprocExecutor

FLOOD = OutsiderFlood(frames=4, frame_bytes=512 << 20, growth_bound=100 << 20)
BLOB = os.urandom(2 << 20)  # an authentic message of several frames on the wire


class AuthenticCalls:
    """Calls that run beside the flood; each must return its own value, in order."""

    def __init__(self, ex: MultiprocExecutor) -> None:
        self.ex, self.count = ex, 0
        self.wrong: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            value = BLOB if self.count % 5 == 0 else self.count
            try:
                got = self.ex.collective_rpc("echo", args=(value,), timeout=30)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.wrong.append(repr(exc))
                return
            if got != [value, value]:
                self.wrong.append(f"call {self.count} returned another value")
            self.count += 1


@contextmanager
def authentic_calls(ex: MultiprocExecutor) -> Iterator[AuthenticCalls]:
    calls = AuthenticCalls(ex)
    thread = threading.Thread(target=calls.run, name="authentic-calls")
    thread.start()
    try:
        yield calls
    finally:
        calls.done.set()
        thread.join(60)


def test_unauthenticated_large_frames_keep_driver_memory_flat(
    remote_executor: MultiprocExecutor,
) -> None:
    ex = remote_executor
    assert ex.driver_address is not None
    ex.collective_rpc("echo", args=(BLOB,), timeout=30)  # the allocator has seen a large reply
    with authentic_calls(ex) as calls:
        report = FLOOD.run(ex.driver_address, os.getpid())
    assert report.violations == []
    for flood in report.floods:
        assert flood["refused"] == flood["frames"], flood
    assert calls.wrong == [] and calls.count > 0
    assert ex.rejected_messages == 0  # refused as connections: not one became a message
    big = os.urandom(16 << 20)
    assert ex.collective_rpc("echo", args=(big,)) == [big, big]
    assert not ex.is_failed


def test_the_outsider_flood_catches_a_driver_that_lifts_the_frame_bound(two_nodes: TwoNodes) -> None:
    two_nodes.executor_class = LiftsFrameBound
    ex = two_nodes.start()
    assert ex.driver_address is not None
    assert ex.collective_rpc("echo", args=(BLOB,)) == [BLOB, BLOB]  # authentic traffic works
    flood = OutsiderFlood(modes=("plain",), frames=2, frame_bytes=512 << 20)
    report = flood.run(ex.driver_address, os.getpid())
    assert report.growth > 300 << 20, report
    assert report.violations and "buffered what it should have refused" in report.violations[0]


SUITE = """
[suite]
name = "outsiders"
seed = 5

[[scenario]]
name = "a peer without the secret floods the node port"
workload = "chaos.nodes:outsider_flood"
[scenario.config]
nnodes = 2
start_method = "fork"
startup_timeout = 60.0
heartbeat_interval = 0.2
node_timeout = 2.0
"""


def test_a_suite_scenario_with_the_outsider_flood_holds_on_the_executor(tmp_path: Path) -> None:
    path = tmp_path / "outsiders.toml"
    path.write_text(SUITE)
    [scenario] = load_suite(str(path)).scenarios
    result = run_one(scenario, 5, tmp_path / "out")
    assert result.violations == [], result.violations
    flood = next(c for c in result.calls if c.check == "outsider")
    assert flood.outcome == "ok" and flood.value == []
    [large] = [c for c in result.calls if c.method == "echo"]  # after the flood: 4 MiB
    assert large.outcome == "ok" and large.value == [large.args[0]] * 2


def test_the_outsider_flood_scenario_finds_a_lifted_frame_bound(tmp_path: Path) -> None:
    cfg = ExecutorConfig(tensor_parallel_size=2, nnodes=2, start_method="fork",
                         startup_timeout=60.0, **FAST_LIVENESS)  # type: ignore[arg-type]
    result = run_scenario(cfg, outsider_flood, FaultPlan([], seed=5), tmp_path,
                          name="outsider", executor_class=LiftsFrameBound)
    found = [v for v in result.violations if v.invariant == "outsider"]
    assert found and "the driver's resident memory rose" in found[0].message
    assert [v for v in result.violations if v.invariant != "outsider"] == []
