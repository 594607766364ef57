"""A driver killed by chaos mid-call is told as the driver's death (issue 32).

A real scenario: ``KillDriver(on_call=("sleep", 1))`` SIGKILLs the driver (run in a
subprocess) as it calls ``sleep``.  The RPC it never saw return was told as "worker rank 0
(pid <driver>) killed by SIGKILL", with a ``worker.killed`` row in the driver's service and
``error.type=_OTHER``; it must say the driver, show a ``driver.killed`` row in the driver's
service and give the cut RPC an ``error.type`` that says why it ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos import FaultPlan, KillDriver, run_scenario
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from telemetry.assemble import read_run
from telemetry.jaeger_json import to_jaeger

CFG = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                     start_method="fork")


def _tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


@pytest.fixture(scope="module")
def killed_trace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("driver-kill")
    workload = rpc_sequence([CallSpec("echo", (1,), timeout=5.0),
                             CallSpec("sleep", (1.5,), timeout=10.0)])
    result = run_scenario(CFG, workload, FaultPlan([KillDriver(on_call=("sleep", 1))], seed=3),
                          out)
    doc = json.loads(json.dumps(to_jaeger(read_run(Path(result.trace_dir)))))
    return next(t for t in doc["data"] if any(s["operationName"] == "rpc sleep"
                                              for s in t["spans"]))


def test_the_driver_kill_is_told_as_the_drivers_death(killed_trace: dict[str, Any]) -> None:
    rpc = next(s for s in killed_trace["spans"] if s["operationName"] == "rpc sleep")
    tags = _tags(rpc["tags"])
    story = tags["faultlab.failure"]
    assert story.startswith("the driver (pid ") and "killed by SIGKILL" in story, story
    assert "worker rank" not in story, story
    assert tags["error"] is True and tags["error.type"] == "process_death"


def test_the_driver_has_the_row_saying_it_was_killed(killed_trace: dict[str, Any]) -> None:
    rows = [s for s in killed_trace["spans"] if "faultlab.fate" in _tags(s["tags"])]
    assert [s["operationName"] for s in rows] == ["driver.killed"]
    service = killed_trace["processes"][rows[0]["processID"]]["serviceName"]
    assert service == "faultlab driver"
