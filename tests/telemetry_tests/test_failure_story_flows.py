"""Every documented way of breaking a worker tells its failure inside the failed RPC's own
Jaeger trace (issue 22), checked on the export exactly as a file holds it.

    flow                            how it runs here (one run per flow, tp=2, rank 1 hit)
    demo --fault kill               faultlab.cli.main in-process: SIGKILL between two steps
    demo --fault kill --async-...   the same with two batches in flight
    smoke kill-mid-call             chaos.runner.run_one of the smoke suite's scenario
    timed kill                      chaos.run_scenario: KillWorker(at=0.3) inside sleep(1)
    hang                            chaos.run_scenario: HangWorker(at=0.2) (SIGSTOP), deadline 1 s

In each failed RPC's trace: the fault (kind, rank, pid, signal) and the detection (latency
in ms, two decimals) as logs inside the RPC's time range; the hit rank's own row (its own
service) saying what happened to it; the surviving rank not an error; a service per role.
No RPC that succeeded carries the fault; the ids printed (demo) or listed
(``faultlab.trace_hint``, as ``chaos run`` prints them) are the failed RPCs' traces.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import telemetry
from chaos import FaultPlan, HangWorker, KillWorker, run_scenario
from chaos.runner import run_one
from chaos.suites import load_suite
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from faultlab import cli
from faultlab.trace_hint import failed_traces
from telemetry.assemble import read_run
from telemetry.jaeger_json import to_jaeger
from telemetry.otlp_json import to_otlp_json

ECHO = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                      start_method="fork")
VICTIM, SURVIVOR = 1, 0
SIGNALS = {"demo-kill": "SIGKILL", "demo-kill-async": "SIGKILL", "smoke-kill-mid-call": "SIGKILL",
           "timed-kill": "SIGKILL", "hang": "SIGSTOP"}


def _tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


def _logs(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [_tags(log["fields"]) for log in span["logs"] if _tags(log["fields"])["event"] == name]


def _demo(out: Path, *flags: str) -> tuple[Path, str]:
    """``faultlab demo`` in this process, traced into ``out``: (run dir, its stdout)."""
    stdout = io.StringIO()  # stderr stays: workers register faulthandler on its fd
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAULTLAB_TRACE_DIR", str(out))
        telemetry.configure_process("driver")
        try:
            with contextlib.redirect_stdout(stdout):
                code = cli.main(["demo", "--tp", "2", "--requests", "2", "--max-tokens", "6",
                                 "--seed", "5", *flags])
        finally:
            telemetry.shutdown()
    assert code == 0, stdout.getvalue()
    return out, stdout.getvalue()


def _smoke_kill(out: Path) -> tuple[Path, str]:
    (scenario,) = [s for s in load_suite("smoke").scenarios if s.name == "kill-mid-call"]
    return Path(run_one(scenario, 1, out).trace_dir), ""


def _chaos(fault: Any, workload: list[CallSpec]) -> Callable[[Path], tuple[Path, str]]:
    def run(out: Path) -> tuple[Path, str]:
        result = run_scenario(ECHO, rpc_sequence(workload), FaultPlan([fault], seed=7), out)
        return Path(result.trace_dir), ""
    return run


FLOWS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "demo-kill": lambda out: _demo(out / "run"),
    "demo-kill-async": lambda out: _demo(out / "run", "--async-scheduling"),
    "smoke-kill-mid-call": _smoke_kill,
    "timed-kill": _chaos(KillWorker(rank=VICTIM, at=0.3),
                         [CallSpec("echo", (1,), timeout=5.0), CallSpec("sleep", (1.0,), timeout=10.0)]),
    "hang": _chaos(HangWorker(rank=VICTIM, at=0.2), [CallSpec("sleep", (0.6,), timeout=1.0)]),
}


@pytest.fixture(scope="module", params=sorted(FLOWS))
def flow(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of the flow: its Jaeger export, the failed RPCs' traces, what it printed."""
    name = request.param
    run_dir, stdout = FLOWS[name](tmp_path_factory.mktemp(name))
    spans = read_run(run_dir)
    doc = json.loads(json.dumps(to_jaeger(spans)))
    failed = [t for t in doc["data"] if any(_is_failed_rpc(s) for s in t["spans"])]
    assert failed, f"{name}: no failed RPC in the run"
    return {"name": name, "doc": doc, "failed": failed, "stdout": stdout,
            "listed": [f.trace_id for f in failed_traces(run_dir)], "otlp": to_otlp_json(spans)}


def _is_failed_rpc(span: dict[str, Any]) -> bool:
    return span["operationName"].startswith("rpc ") and _tags(span["tags"]).get("error") is True


def _rpc(trace: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in trace["spans"] if _is_failed_rpc(s))


def _service(trace: dict[str, Any], span: dict[str, Any]) -> str:
    return str(trace["processes"][span["processID"]]["serviceName"])


def test_the_fault_is_in_the_failed_rpc_with_kind_rank_pid_and_signal(flow: dict[str, Any]) -> None:
    for trace in flow["failed"]:
        (fault,) = _logs(_rpc(trace), "chaos.fault")
        assert fault["faultlab.fault.kind"] in ("kill_worker", "hang_worker")
        assert fault["faultlab.fault.rank"] == VICTIM and fault["faultlab.fault.pid"] > 0
        assert fault["faultlab.fault.signal"] == SIGNALS[flow["name"]]
        assert isinstance(fault["faultlab.fault.offset_ms"], float)
        assert fault["faultlab.fault.at"].endswith("+00:00")  # an ISO time, not raw ns


def test_the_detection_has_a_readable_latency(flow: dict[str, Any]) -> None:
    for trace in flow["failed"]:
        rpc = _rpc(trace)
        (detection,) = _logs(rpc, "faultlab.detection")
        latency = detection["faultlab.detection.latency_ms"]
        assert 0 < latency < 5000 and latency == round(latency, 2), latency
        # the monitor saw the death, or the deadline passed, or (model, tp=2) the survivor's
        # collective broke first and its WorkerError reached the driver
        assert detection["faultlab.detection.by"] in ("worker_death", "TimeoutError", "WorkerError")
        if flow["name"].startswith("demo"):  # the engine restarted
            (restart,) = _logs(rpc, "faultlab.restart")
            assert restart["faultlab.incarnation"] == 1
        story = _tags(rpc["tags"])["faultlab.failure"]
        assert f"worker rank {VICTIM}" in story and "detected" in story, story


def test_the_story_lies_inside_the_rpc(flow: dict[str, Any]) -> None:
    """No log outside its span (Jaeger hides it: "Logs (1 of 3)"), the RPC's nor any other's
    in its trace (a worker's exception is written after its span ended)."""
    for trace in flow["failed"]:
        for span in trace["spans"]:
            end = span["startTime"] + span["duration"]
            for log in span["logs"]:
                assert span["startTime"] <= log["timestamp"] <= end, (
                    span["operationName"], _tags(log["fields"])["event"])


def test_the_hit_rank_has_its_own_row_saying_what_happened(flow: dict[str, Any]) -> None:
    for trace in flow["failed"]:
        pid = _logs(_rpc(trace), "chaos.fault")[0]["faultlab.fault.pid"]
        rows = [s for s in trace["spans"] if _service(trace, s) == f"faultlab worker rank {VICTIM}"
                and "faultlab.fate" in _tags(s["tags"])]
        (row,) = rows
        fate = _tags(row["tags"])["faultlab.fate"]
        assert f"worker rank {VICTIM} (pid {pid})" in fate, fate
        assert SIGNALS[flow["name"]] in fate and _tags(row["tags"])["error"] is True
        assert row["operationName"].endswith(f"[rank {VICTIM}]")


def test_the_survivor_is_not_an_error(flow: dict[str, Any]) -> None:
    for trace in flow["failed"]:
        for span in trace["spans"]:
            if _service(trace, span) == f"faultlab worker rank {SURVIVOR}":
                assert "error" not in _tags(span["tags"]), span["operationName"]


def test_ranks_are_told_apart_by_service(flow: dict[str, Any]) -> None:
    for trace in flow["failed"]:
        services = {p["serviceName"] for p in trace["processes"].values()}
        assert len(services) == len(trace["processes"])  # one per process: driver, each rank
        assert "faultlab driver" in services and f"faultlab worker rank {VICTIM}" in services
        for process in trace["processes"].values():
            instance = _tags(process["tags"])["service.instance.id"]
            assert process["serviceName"] == f"faultlab {instance.rsplit(' pid ', 1)[0]}"


def test_the_otlp_export_says_the_same(flow: dict[str, Any]) -> None:
    """OTLP JSON: the same service per role and service.instance.id as the Jaeger JSON, and
    the hit rank's row in its own resource (README: every export agrees)."""
    jaeger = {p["serviceName"]: _tags(p["tags"])["service.instance.id"]
              for t in flow["doc"]["data"] for p in t["processes"].values()}
    otlp: dict[str, str] = {}
    killed_rows = []
    for resource_spans in flow["otlp"]["resourceSpans"]:
        attrs = {a["key"]: next(iter(a["value"].values())) for a in resource_spans["resource"]["attributes"]}
        otlp[attrs["service.name"]] = attrs["service.instance.id"]
        killed_rows += [(attrs["service.name"], s["name"]) for ss in resource_spans["scopeSpans"]
                        for s in ss["spans"] if s["name"].startswith("worker.") and any(
                            a["key"] == "faultlab.fate" for a in s.get("attributes", []))]
    assert set(otlp.items()) == set(jaeger.items())
    assert killed_rows and {svc for svc, _ in killed_rows} == {f"faultlab worker rank {VICTIM}"}


def test_no_rpc_that_succeeded_carries_the_fault(flow: dict[str, Any]) -> None:
    for trace in flow["doc"]["data"]:
        for span in trace["spans"]:
            if span["operationName"].startswith("rpc ") and not _is_failed_rpc(span):
                assert not _logs(span, "chaos.fault"), span["operationName"]


def test_the_failed_traces_are_named_where_the_user_looks(flow: dict[str, Any]) -> None:
    ids = [t["traceID"] for t in flow["failed"]]
    assert sorted(flow["listed"]) == sorted(ids)  # what chaos run and the demo print
    for trace_id in ids if flow["name"].startswith("demo") else ():
        assert f"trace {trace_id}" in flow["stdout"]
    if flow["name"].startswith("demo"):  # the step whose RPC failed stands out in the list
        roots = [s for t in flow["failed"] for s in t["spans"]
                 if not any(r["refType"] == "CHILD_OF" for r in s["references"])]
        assert roots and all(s["operationName"] == "engine.step (failed)" for s in roots)
