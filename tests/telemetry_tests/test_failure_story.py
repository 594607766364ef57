"""The failure story of a worker killed mid-call reads off the failed RPC's Jaeger trace.

A real chaos scenario (a worker SIGKILLed inside ``sleep``) is exported to Jaeger-UI JSON;
in the trace of the failed ``rpc sleep`` we look for: the fault, the detection with its
latency, the killed worker's execute span lasting until the kill, distinguishable ranks and
CLIENT/SERVER kinds.

Then each check of ``telemetry.story`` on its own, on a hand-built run (issue 25: several
were seen only through a whole engine run, tests/model/test_request_traces.py, and some by
nothing): request links inherited from a step or recovery, the restart after a fault, the
fault and detection on every recovery span, the latest fault before a recovery, deaths placed
by fault, by detected death, by lost node, detection by the first RPC error after a fault,
pairing kept across live passes, and telling twice adding nothing twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos import FaultPlan, KillWorker, run_scenario
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from telemetry.assemble import ProcessInfo, RecordedEvent, RecordedSpan, read_run
from telemetry.jaeger_json import to_jaeger
from telemetry.perfetto_json import to_perfetto
from telemetry.story import Story, tell

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


def test_the_survivor_stopped_by_the_executor_is_not_an_error(failed_trace: dict[str, Any]) -> None:
    """Rank 0 was in its sleep when the executor shut down after rank 1 died: its span is
    cut short by the shutdown, says so, and carries no error (issue 22: 'two workers died')."""
    survivor = next(s for s in failed_trace["spans"]
                    if s["operationName"] == "worker.execute sleep [rank 0]")
    tags = _tags(survivor["tags"])
    assert tags["faultlab.truncated"] is True, tags
    assert tags["faultlab.truncated.reason"].startswith("stopped by the executor's own shutdown")
    assert "error" not in tags and tags.get("otel.status_code") != "ERROR", tags
    killed = next(s for s in failed_trace["spans"]
                  if s["operationName"] == "worker.execute sleep [rank 1]")
    assert _tags(killed["tags"])["error"] is True  # only what failed is an error


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


# ---------------------------------------------------------------- the story, checked one by one
# A hand-built run, so that every check of telemetry/story.py is held here on its own (before,
# several were seen only through a whole engine run, tests/model/test_request_traces.py):
#
#   trace S   engine.step ─► rpc execute_model (fails) ─► worker.execute (rank 1, truncated)
#   trace P   rpc echo (10-60), over before the fault       trace O  worker.execute (rank 0,
#   trace D0  executor.worker_death of rank 0 at 120 (no fault: it died on its own)  truncated)
#   trace F   chaos.fault at 100: kill_worker rank 1        trace D  executor.worker_death at 150
#   trace R0  an earlier executor.restart (5-8)             trace E  engine.recovery (450-900)
#                                                                     └─ executor.restart (460-800)
#   trace Q   the request; engine.rebuild (810-850) in it

DRIVER = ProcessInfo(100, None, "driver", "faultlab", 0, 0)
VICTIM = ProcessInfo(201, 1, "worker", "faultlab", 0, 0)
OTHER = ProcessInfo(200, 0, "worker", "faultlab", 0, 0)
REQUEST = (0xB1, 0xB1)  # (trace id, span id) of the request span the step and recovery serve
STEP, RPC, EXECUTE, FAULT_ID, DEATH, RECOVERY, RESTART_ID, EARLIER, REBUILD = range(1, 10)
BEFORE, OTHER_EXECUTE, OTHER_DEATH = range(10, 13)
MS = 1_000_000  # the times below are in milliseconds
_TIMES = ("chaos.time_ns", "faultlab.detected_ns")


def _span(name: str, span_id: int, trace: int, start: int, end: int | None,
          attributes: dict[str, Any] | None = None, *, parent: int = 0,
          process: ProcessInfo = DRIVER) -> RecordedSpan:
    point = name in ("chaos.fault", "executor.worker_death")
    attrs = {k: v * MS if k in _TIMES else v for k, v in (attributes or {}).items()}
    return RecordedSpan(name, trace, span_id, parent, start * MS, 1, process,
                        None if end is None else end * MS, point=point,
                        last_seen_ns=(start + 70) * MS, attributes=attrs)


def _hand_built_run() -> dict[int, RecordedSpan]:
    requests = {"faultlab.links.request": f"{REQUEST[0]:032x}{REQUEST[1]:016x}"}
    rpc = _span("rpc execute_model", RPC, 0x5, 10, 400, parent=STEP)
    rpc.status = "ERROR"
    rpc.events.append(RecordedEvent("exception", 300 * MS, RPC, {"exception.type": "ExecutorFailedError"}))
    spans = [
        _span("engine.step", STEP, 0x5, 0, 1000, requests), rpc,
        _span("worker.execute execute_model", EXECUTE, 0x5, 20, None, parent=RPC, process=VICTIM),
        _span("chaos.fault", FAULT_ID, 0xF, 100, 100, {
            "chaos.kind": "kill_worker", "faultlab.rank": 1, "process.pid": 201,
            "chaos.time_ns": 100, "chaos.phase": "signal"}),
        _span("executor.worker_death", DEATH, 0xD, 150, 150, {
            "faultlab.rank": 1, "process.pid": 201, "faultlab.detected_ns": 150}),
        _span("executor.restart", EARLIER, 0x70, 5, 8, {"faultlab.incarnation": 0}),
        _span("engine.recovery", RECOVERY, 0xE, 450, 900, requests),
        _span("executor.restart", RESTART_ID, 0xE, 460, 800, {"faultlab.incarnation": 1},
              parent=RECOVERY),
        _span("engine.rebuild", REBUILD, REQUEST[0], 810, 850, parent=REQUEST[1]),
        _span("rpc echo", BEFORE, 0x6, 10, 60),
        _span("worker.execute sleep", OTHER_EXECUTE, 0x7, 20, None, process=OTHER),
        _span("executor.worker_death", OTHER_DEATH, 0xD0, 120, 120, {
            "faultlab.rank": 0, "process.pid": 200, "faultlab.detected_ns": 120}),
    ]
    return {s.span_id: s for s in tell(spans)}


def _events(span: RecordedSpan, name: str) -> list[dict[str, Any]]:
    return [e.attributes for e in span.events if e.name == name]


def _links(span: RecordedSpan, role: str) -> set[int]:
    return {link.span_id for link in span.links if link.attributes.get("faultlab.link") == role}


def test_an_rpc_in_a_step_and_a_restart_in_a_recovery_serve_their_parents_requests() -> None:
    run = _hand_built_run()
    assert _links(run[RPC], "request") == {REQUEST[1]}
    assert _links(run[RESTART_ID], "request") == {REQUEST[1]}
    assert _links(run[EARLIER], "request") == set()  # no recovery around it


def test_the_failed_rpc_names_the_first_restart_after_its_fault() -> None:
    rpc = _hand_built_run()[RPC]
    [restart] = _events(rpc, "faultlab.restart")
    assert restart["faultlab.restart.span_id"] == f"{RESTART_ID:016x}"  # not the earlier one
    assert restart["faultlab.incarnation"] == 1
    assert restart["faultlab.restart.after_fault_ms"] == pytest.approx(360.0)
    assert restart["faultlab.restart.duration_ms"] == pytest.approx(340.0)
    assert _links(rpc, "restart") == {RESTART_ID}


@pytest.mark.parametrize("span_id", [RECOVERY, RESTART_ID, REBUILD],
                         ids=["engine.recovery", "executor.restart", "engine.rebuild"])
def test_each_recovery_span_carries_its_fault_and_detection(span_id: int) -> None:
    span = _hand_built_run()[span_id]
    [fault] = _events(span, "chaos.fault")
    assert fault["faultlab.fault.kind"] == "kill_worker" and fault["faultlab.fault.rank"] == 1
    assert fault["faultlab.fault.span_id"] == f"{FAULT_ID:016x}"
    [detection] = _events(span, "faultlab.detection")
    assert detection["faultlab.detection.by"] == "worker_death"
    assert detection["faultlab.detection.latency_ms"] == pytest.approx(50.0)
    assert _links(span, "fault") == {FAULT_ID} and _links(span, "detection") == {DEATH}


def test_a_recovery_answers_the_latest_fault_before_it() -> None:
    first = _span("chaos.fault", 11, 0xF1, 100, 100, {"chaos.kind": "hang_worker",
                                                        "faultlab.rank": 0, "chaos.time_ns": 100})
    second = _span("chaos.fault", 12, 0xF2, 300, 300, {"chaos.kind": "kill_worker",
                                                         "faultlab.rank": 1, "chaos.time_ns": 300})
    restart = _span("executor.restart", 13, 0xE, 400, 500)
    tell([first, second, restart])
    assert _links(restart, "fault") == {12}
    assert [e["faultlab.fault.kind"] for e in _events(restart, "chaos.fault")] == ["kill_worker"]


def test_the_failed_rpc_and_the_fault_tell_each_other() -> None:
    run = _hand_built_run()
    rpc, fault = run[RPC], run[FAULT_ID]
    assert [e["faultlab.fault.span_id"] for e in _events(rpc, "chaos.fault")] == [f"{FAULT_ID:016x}"]
    [detection] = _events(rpc, "faultlab.detection")
    assert detection["faultlab.detection.latency_ms"] == pytest.approx(50.0)
    assert _links(rpc, "fault") == {FAULT_ID} and _links(rpc, "detection") == {DEATH}
    [told] = _events(fault, "faultlab.detection")  # the fault span names its detection
    assert told["faultlab.detection.by"] == "worker_death" and _links(fault, "detection") == {DEATH}
    assert not _events(run[BEFORE], "chaos.fault") and not run[BEFORE].links  # over before it


def test_a_truncated_span_dies_with_its_fault_else_with_its_detected_death() -> None:
    run = _hand_built_run()
    killed, other = run[EXECUTE], run[OTHER_EXECUTE]
    assert killed.death_ns == 100 * MS and killed.truncated_reason.startswith("killed by chaos fault")
    assert _events(killed, "chaos.fault")  # the victim's span in the RPC's trace
    assert other.death_ns == 120 * MS
    assert other.truncated_reason == "process death detected by the driver (worker_death)"


def _failed_rpc(span_id: int, start: int, error_at: int, error: str) -> RecordedSpan:
    rpc = _span("rpc sleep", span_id, span_id, start, error_at)
    rpc.status = "ERROR"
    rpc.events.append(RecordedEvent("exception", error_at * MS, span_id, {"exception.type": error}))
    return rpc


def test_a_fault_without_a_death_is_detected_by_the_first_rpc_error_after_it() -> None:
    fault = _span("chaos.fault", 21, 0xF, 100, 100, {"chaos.kind": "hang_worker",
                                                       "faultlab.rank": 1, "chaos.time_ns": 100})
    earlier = _failed_rpc(22, 0, 50, "ValueError")  # an error before the fault: not its sign
    timed_out = _failed_rpc(23, 80, 300, "TimeoutError")
    tell([fault, earlier, timed_out])
    [detection] = _events(fault, "faultlab.detection")
    assert detection["faultlab.detection.by"] == "TimeoutError"
    assert detection["faultlab.detection.latency_ms"] == pytest.approx(200.0)
    assert _links(fault, "detection") == {23}
    assert not _events(earlier, "chaos.fault")


def test_a_lost_node_detects_its_fault_and_ends_its_ranks_spans() -> None:
    fault = _span("chaos.fault", 31, 0xF, 100, 100, {"chaos.kind": "kill_node",
                                                       "faultlab.rank": 1, "chaos.time_ns": 100})
    remote = ProcessInfo(900, 1, "worker", "faultlab", 0, 0)  # a pid of another host
    cut = _span("worker.execute sleep", 32, 0x8, 20, None, process=remote)
    lost = _span("executor.node_lost", 33, 0xD, 400, 400,
                 {"faultlab.ranks": "[1]", "faultlab.detected_ns": 400})
    lost.point = True
    tell([fault, cut, lost])
    [detection] = _events(fault, "faultlab.detection")
    assert detection["faultlab.detection.by"] == "node_lost" and _links(fault, "detection") == {33}
    assert cut.death_ns == 400 * MS and "(node_lost)" in cut.truncated_reason


def test_a_span_begun_after_a_kill_dies_with_the_detected_death() -> None:
    """SIGTERM's fault at 100; the worker's exit path (a span from 130) ends at its death."""
    fault = _span("chaos.fault", 41, 0xF, 100, 100, {"chaos.kind": "term_worker",
                                                       "process.pid": 201, "chaos.time_ns": 100})
    exiting = _span("worker.shutdown", 42, 0x9, 130, None, process=VICTIM)
    death = _span("executor.worker_death", 43, 0xD, 150, 150,
                  {"faultlab.rank": 1, "process.pid": 201, "faultlab.detected_ns": 150})
    tell([fault, exiting, death])
    assert exiting.death_ns == 150 * MS and "(worker_death)" in exiting.truncated_reason


def test_live_passes_keep_a_fault_paired_with_its_first_detection() -> None:
    """Pass by pass (live export): a sign recorded later but timed earlier changes nothing."""
    story = Story()
    fault = _span("chaos.fault", 51, 0xF, 100, 100, {"chaos.kind": "kill_worker",
                                                       "process.pid": 201, "chaos.time_ns": 100})
    death = _span("executor.worker_death", 52, 0xD, 150, 150,
                  {"faultlab.rank": 1, "process.pid": 201, "faultlab.detected_ns": 150})
    story.tell([fault, death])
    story.tell([_failed_rpc(53, 90, 120, "TimeoutError")])
    [(_, sign)] = [(f, f.detection) for f in story.faults]
    assert sign is not None and sign.span is death


def test_telling_twice_adds_nothing_twice() -> None:
    run = _hand_built_run()
    before = {i: (len(s.events), len(s.links)) for i, s in run.items()}
    tell(list(run.values()))
    assert {i: (len(s.events), len(s.links)) for i, s in run.items()} == before


def test_a_fault_between_rpcs_is_told_on_the_rpc_it_failed_not_on_one_that_succeeded() -> None:
    """Async scheduling: the RPC open at the kill had its replies already and succeeds; the
    next one, begun after the kill, fails: only it tells the fault, inside its own range,
    with the victim's own row (issue 22, items 1 and 2)."""
    fault = _span("chaos.fault", 61, 0xF, 100, 100, {
        "chaos.kind": "kill_worker", "faultlab.rank": 1, "process.pid": 201,
        "chaos.time_ns": 100, "chaos.signal": "SIGKILL"})
    succeeded = _span("rpc execute_model", 62, 0x62, 50, 300)
    failed = _failed_rpc(63, 110, 260, "ExecutorFailedError")
    death = _span("executor.worker_death", 64, 0xD, 250, 250,
                  {"faultlab.rank": 1, "process.pid": 201, "faultlab.detected_ns": 250})
    in_flight = _failed_rpc(66, 80, 255, "ExecutorFailedError")  # open at the kill, fails
    earlier = _span("worker.execute execute_model", 65, 66, 85, 95, parent=66, process=VICTIM)
    tell([fault, succeeded, failed, death, in_flight, earlier])
    assert not _events(succeeded, "chaos.fault") and not succeeded.story_spans
    assert _events(in_flight, "chaos.fault")
    assert not _events(earlier, "chaos.fault")  # the victim's span ended before the kill
    [told] = _events(failed, "chaos.fault")
    assert told["faultlab.fault.offset_ms"] == -10.0  # 10 ms before the RPC began
    assert all(failed.start_ns <= e.time_ns <= failed.shown_end_ns for e in failed.events)
    [detection] = _events(failed, "faultlab.detection")
    assert detection["faultlab.detection.latency_ms"] == 150.0
    [row] = failed.story_spans
    assert (row.name, row.process, row.status) == ("worker.killed", VICTIM, "ERROR")
    assert row.attributes["faultlab.fate"].startswith("worker rank 1 (pid 201) killed by SIGKILL")
