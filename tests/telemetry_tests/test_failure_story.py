"""The failure story of a worker killed mid-call reads off the failed RPC's Jaeger trace.

A real chaos scenario (a worker SIGKILLed inside ``sleep``) is exported to Jaeger-UI JSON;
in the trace of the failed ``rpc sleep`` we look for: the fault, the detection with its
latency, the killed worker's execute span lasting until the kill, distinguishable ranks and
CLIENT/SERVER kinds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos import FaultPlan, KillWorker, run_scenario
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from telemetry.assemble import read_run
from telemetry.jaeger_json import to_jaeger
from telemetry.perfetto_json import to_perfetto

CFG = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                     start_method="fork")


def _tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


def _logs(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [_tags(log["fields"]) for log in span["logs"] if _tags(log["fields"])["event"] == name]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("story")
    workload = rpc_sequence([CallSpec("echo", (1,), timeout=5.0),
                             CallSpec("sleep", (1.5,), timeout=10.0)])
    # From outside, well inside the sleep: the worker is killed mid-call.
    result = run_scenario(CFG, workload, FaultPlan([KillWorker(rank=1, at=0.4)], seed=7), out)
    return Path(result.trace_dir)


@pytest.fixture(scope="module")
def failed_trace(killed_run: Path) -> dict[str, Any]:
    doc = json.loads(json.dumps(to_jaeger(read_run(killed_run))))  # exactly what a file holds
    return next(t for t in doc["data"]
                if any(s["operationName"] == "rpc sleep" for s in t["spans"]))


def test_the_failed_rpc_trace_holds_fault_and_detection(failed_trace: dict[str, Any]) -> None:
    rpc = next(s for s in failed_trace["spans"] if s["operationName"] == "rpc sleep")
    (fault,) = _logs(rpc, "chaos.fault")
    assert (fault["faultlab.fault.kind"], fault["faultlab.fault.rank"]) == ("kill_worker", 1)
    assert fault["faultlab.fault.phase"] == "signal" and fault["faultlab.fault.pid"] > 0
    assert (fault["faultlab.fault.signal"], fault["faultlab.fault.seed"]) == ("SIGKILL", 7)
    (detection,) = _logs(rpc, "faultlab.detection")
    assert detection["faultlab.detection.by"] == "worker_death"
    assert 0 < detection["faultlab.detection.latency_ms"] < 5000
    links = [r for r in rpc["references"] if r["refType"] == "FOLLOWS_FROM"]
    assert len(links) == 2  # the fault span and the death the monitor recorded
    assert _tags(rpc["tags"])["span.kind"] == "client"


def test_the_killed_span_lasts_until_the_kill(failed_trace: dict[str, Any]) -> None:
    rpc = next(s for s in failed_trace["spans"] if s["operationName"] == "rpc sleep")
    fault_us = next(log["timestamp"] for log in rpc["logs"]
                    if _tags(log["fields"])["event"] == "chaos.fault")
    killed = next(s for s in failed_trace["spans"]
                  if s["operationName"] == "worker.execute sleep [rank 1]")
    tags = _tags(killed["tags"])
    assert tags["faultlab.truncated"] is True and "killed by chaos fault" in tags[
        "faultlab.truncated.reason"]
    assert killed["startTime"] + killed["duration"] == pytest.approx(fault_us, abs=2)
    assert killed["duration"] > 0
    assert _logs(killed, "chaos.fault"), "the victim's span carries the fault too"
    assert tags["span.kind"] == "server"


def test_ranks_are_told_apart_on_the_rows(failed_trace: dict[str, Any]) -> None:
    names = {s["operationName"] for s in failed_trace["spans"]}
    assert {"worker.execute sleep [rank 0]", "worker.execute sleep [rank 1]"} <= names
    instances = {_tags(p["tags"])["service.instance.id"] for p in failed_trace["processes"].values()}
    assert len(instances) == len(failed_trace["processes"]) == 3
    for span in failed_trace["spans"]:
        for t in span["tags"]:
            assert t["type"] != "int64" or abs(t["value"]) < 2**53, t


def test_detection_latencies_read_the_trace(killed_run: Path) -> None:
    from telemetry.plotting import detection_latencies

    row = detection_latencies(killed_run).iloc[0]
    assert (row.fault_kind, row["rank"], row.detected_by) == ("kill_worker", 1, "worker_death")


def test_perfetto_draws_cross_process_parents_as_flows(killed_run: Path) -> None:
    events = to_perfetto(read_run(killed_run))["traceEvents"]
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert starts and len(starts) == len(ends)
    assert all(s["pid"] != f["pid"] for s, f in zip(starts, ends, strict=True))
