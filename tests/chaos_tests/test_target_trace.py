"""A chaos target's run as one faultlab trace (chaos.targets.run_trace), exported to Jaeger.

    processpool, SIGKILL of rank 1 mid-work ──► run dir journals ──► faultlab trace export
        one trace: the run's root, a span per call, the fault (kind, rank, pid, signal), a
        target.exit per process, the detection with its latency, each process a service
    spans a target exported over OTLP (made here by the SDK, no vLLM) ──► re-parented into
        the run's trace under the call whose time contains them
    vLLM's own spans reaching the receiver: tests/chaos_tests/test_vllm_target.py (its
    fault-free engines, no extra start); a whole vLLM run's trace: scripts/check_target_trace.py
    on the comparison .ci/run makes
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.targets import get_target
from chaos.targets.compare import run_target_scenario
from chaos.targets.run import TargetRecord
from chaos.targets.run_trace import write_run_trace
from chaos.targets.scenario import TargetScenario
from faultlab.cli import main
from telemetry.otlp_receiver import ReceivedSpan

CALLS = 6
SPEC = {"calls": CALLS, "call_s": 0.1, "ranks": 2}


def jaeger(run_dir: Path, tmp_path: Path) -> dict[str, Any]:
    """``faultlab trace export RUN_DIR --format jaeger``: the one trace it holds."""
    out = tmp_path / "trace.json"
    assert main(["trace", "export", str(run_dir), "--format", "jaeger", "--out", str(out)]) == 0
    data = json.loads(out.read_text())["data"]
    assert len(data) == 1, f"{len(data)} traces, not one per run"
    return dict(data[0])


def spans_by_name(trace: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for span in trace["spans"]:
        span["tag"] = {t["key"]: t["value"] for t in span["tags"]}
        span["service"] = trace["processes"][span["processID"]]["serviceName"]
        out.setdefault(span["operationName"], []).append(span)
    return out


def parent_of(span: dict[str, Any]) -> str | None:
    return next((r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"), None)


def test_a_killed_rank_is_one_trace_with_calls_fault_exits_and_detection(tmp_path: Path) -> None:
    sc = TargetScenario.from_dict({"name": "kill-rank1", "fault": "kill", "rank": 1,
                                   "after_invoke": 3, "at": [0.02, 0.05], "spec": SPEC}, "t")
    result = run_target_scenario(get_target("processpool"), sc, 1, tmp_path / "run", tmp_path)
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    trace = jaeger(tmp_path / "run", tmp_path)
    spans = spans_by_name(trace)

    [root] = spans["target.run processpool kill-rank1 seed 1"]
    assert root["service"] == "faultlab chaos" and parent_of(root) is None
    assert (root["tag"]["faultlab.target"], root["tag"]["faultlab.outcome"]) == ("processpool", "failed")
    calls = sorted((s for name, group in spans.items() if name.startswith("target.call ")
                    for s in group), key=lambda s: s["tag"]["faultlab.call.id"])
    assert [c["tag"]["faultlab.call.id"] for c in calls] == list(range(CALLS))
    assert {c["service"] for c in calls} == {"processpool driver"}
    assert all(parent_of(c) == root["spanID"] for c in calls)
    outcomes = [c["tag"]["faultlab.outcome"] for c in calls]
    assert outcomes[:2] == ["ok", "ok"] and "fail" in outcomes
    failed = next(c for c in calls if c["tag"]["faultlab.outcome"] == "fail")
    assert failed["tag"]["error.type"] == "BrokenProcessPool" and failed["tag"]["error"] is True

    [fault] = spans["chaos.fault"]
    victim = record["fault"]
    assert {k: fault["tag"].get(k) for k in ("chaos.kind", "faultlab.rank", "process.pid",
                                             "chaos.signal")} == {
        "chaos.kind": "kill", "faultlab.rank": 1, "process.pid": victim["pid"],
        "chaos.signal": "SIGKILL"}

    exits = {(s["service"], s["tag"]["process.pid"]) for s in spans["target.exit"]
             + spans["target.exit [rank 0]"] + spans["target.exit [rank 1]"]}
    assert exits == {(f"processpool {p['role']}" + ("" if p["rank"] is None else f" rank {p['rank']}"),
                      p["pid"]) for p in record["procs"]}
    [victim_exit] = spans["target.exit [rank 1]"]
    assert victim_exit["tag"]["faultlab.exit.how"] == "the fault's victim"

    [detection] = spans["faultlab.detection"]
    assert detection["tag"]["faultlab.detection.latency_ms"] == round(
        result.detection_latency_s * 1e3, 2)  # type: ignore[operator]
    assert parent_of(detection) == failed["spanID"]
    assert detection["tag"]["faultlab.cause_named"] == result.cause_named == "worker"
    # The story tells the fault on the failed call, as on faultlab's own RPCs.
    assert {"chaos.fault", "faultlab.detection"} <= {
        f["value"] for log in failed["logs"] for f in log["fields"] if f["key"] == "event"}
    assert {s["traceID"] for s in trace["spans"]} == {trace["traceID"]}


def _record(t0: int) -> TargetRecord:
    """A run as the observer records it (no process runs): calls 0 and 1, a second each."""
    s = 1_000_000_000
    record = TargetRecord("vllm", "none", 3, "none", {}, started=True, started_ns=t0,
                          ready_ns=t0 + s, done_ns=t0 + 4 * s, driver_end_ns=t0 + 5 * s,
                          wall_s=6.0)
    record.procs = [{"role": "driver", "rank": None, "pid": 101, "exit_ns": t0 + 5 * s},
                    {"role": "engine_core", "rank": None, "pid": 102, "exit_ns": t0 + 5 * s}]
    record.calls = {i: {"what": "generate", "invoke_ns": t0 + (1 + i) * s + 1,
                        "end_ns": t0 + (2 + i) * s, "outcome": "ok", "value": [1]}
                    for i in range(2)}
    return record


def _received(name: str, trace: int, span: int, parent: int, start: int, end: int,
              pid: int) -> ReceivedSpan:
    return ReceivedSpan(name, trace, span, parent, start, end, "server", "UNSET", "",
                        {"gen_ai.request.id": name}, [], {"service.name": "vllm",
                                                          "vllm.process_id": str(pid)}, "vllm")


def test_target_spans_join_the_run_trace_under_the_call_that_holds_them(tmp_path: Path) -> None:
    t0, s = 1_700_000_000_000_000_000, 1_000_000_000
    record = _record(t0)
    received = [
        _received("in-call-1", 0xA, 0x11, 0, t0 + 2 * s + 100, t0 + 3 * s - 100, 101),
        _received("its-child", 0xA, 0x12, 0x11, t0 + 2 * s + 200, t0 + 2 * s + 300, 101),
        _received("outside", 0xB, 0x13, 0, t0 + 3 * s + 100, t0 + 4 * s + 100, 102),
    ]
    write_run_trace(record, tmp_path, received)
    write_run_trace(record, tmp_path, received + received[:1])  # a rerun replaces, never
    # adds; a batch an exporter sent twice (a retry) is one span
    spans = spans_by_name(jaeger(tmp_path, tmp_path))
    [root], [call1] = spans["target.run vllm none seed 3"], spans["target.call 1: generate"]
    [inside], [child], [outside] = spans["in-call-1"], spans["its-child"], spans["outside"]
    assert parent_of(inside) == call1["spanID"]  # a root of its own trace: under its call
    assert parent_of(child) == inside["spanID"] == "0000000000000011"  # ids and nesting kept
    assert parent_of(outside) == root["spanID"]  # in no call: under the run
    assert inside["tag"]["faultlab.otlp.trace_id"] == f"{0xA:032x}"
    assert (inside["service"], outside["service"]) == ("vllm driver", "vllm engine_core")
    assert inside["tag"]["resource.vllm.process_id"] == "101"


def test_a_call_cut_by_the_driver_s_death_is_truncated_not_a_detection(tmp_path: Path) -> None:
    t0, s = 1_700_000_000_000_000_000, 1_000_000_000
    record = _record(t0)
    record.fault_kind = "kill_driver"
    record.fault = {"kind": "kill_driver", "role": "driver", "rank": None, "pid": 101,
                    "signal": "SIGKILL", "time_ns": t0 + 3 * s + 500}
    record.calls[1].update(end_ns=None, outcome="pending")
    write_run_trace(record, tmp_path)
    spans = spans_by_name(jaeger(tmp_path, tmp_path))
    [cut] = spans["target.call 1: generate"]
    assert cut["tag"]["faultlab.truncated"] is True
    assert "killed by chaos fault kill_driver" in cut["tag"]["faultlab.truncated.reason"]
    assert "faultlab.detection" not in spans  # the caller died: it saw nothing
