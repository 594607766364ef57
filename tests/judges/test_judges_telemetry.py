"""Telemetry's judges, proven: the failure story, the streamed export, the OTLP receiver.

Each case is a plain function asserting one verdict on a hand-made record (spans built in
memory, a journal written here by the real recorder, an in-process receiver on loopback);
a fire case and its quiet twin differ in one fact.  Every plant of
``chaos/planted_judges/telemetry.py`` must make at least one case fail.

    judge                                   cases
    story: who the fault hit                worker rank by the fault (not the first span),
                                            the driver's kill, a node's kill
    story: where the fault came             at the RPC's start (in flight) / 1 ms before it
                                            (not), a SIGSTOP 1001 ms before the RPC
    story: detection and affected RPCs      the victim's own death, not another's; a
                                            succeeded RPC carries no fault
    stream == whole export                  a journal with a fault, a failed RPC whose
                                            exception came after it ended, a restart
    receiver accounting                     every refusal counted; a bomb refused by its
                                            inflated size; a truncated gzip body refused

The story cases for the driver's kill, the node's kill and the SIGSTOP before the RPC are
issue 32's regressions ("Stories told wrong"): each failed on 0fd82ef's story.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import socket
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from judge_cases import Case, assert_caught, case_id
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import telemetry
from chaos.planted_judges import planted_in
from telemetry import otlp_receiver
from telemetry.assemble import ProcessInfo, RecordedEvent, RecordedSpan
from telemetry.exports import render, write_export
from telemetry.naming import export_attributes
from telemetry.otlp_receiver import OtlpReceiver, Refused
from telemetry.story import tell

MS = 1_000_000
# A plant replaces a module attribute: cases call judges through their module
# (``otlp_receiver.inflate``), never through a name imported before the plant.
DRIVER = ProcessInfo(100, None, "driver", "faultlab", 0, 0)
RANK0 = ProcessInfo(200, 0, "worker", "faultlab", 0, 0)
RANK1 = ProcessInfo(201, 1, "worker", "faultlab", 0, 0)
RPC, STEP, FAULT, DEATH, OTHER_DEATH, EXEC0, EXEC1 = range(1, 8)

# ---------------------------------------------------------------- the failure story


def _span(name: str, span_id: int, start: int, end: int | None, *, trace: int = 0x5,
          parent: int = 0, process: ProcessInfo = DRIVER, status: str = "UNSET",
          attributes: dict[str, Any] | None = None) -> RecordedSpan:
    """A span of times in milliseconds; a truncated one was last seen 50 ms after it began."""
    return RecordedSpan(name, trace, span_id, parent, start * MS, 1, process,
                        None if end is None else end * MS, status=status,
                        last_seen_ns=(start + 50) * MS, attributes=dict(attributes or {}))


def _point(name: str, span_id: int, at: int, attributes: dict[str, Any]) -> RecordedSpan:
    span = _span(name, span_id, at, at, trace=0xF0 + span_id, attributes=attributes)
    span.point = True
    return span


def _fault(kind: str, at: int, *, rank: int, pid: int | None, signal: str | None = None,
           **extra: Any) -> RecordedSpan:
    attrs: dict[str, Any] = {"chaos.kind": kind, "faultlab.rank": rank, "process.pid": pid or 0,
                             "chaos.time_ns": at * MS, "chaos.phase": "signal",
                             **{f"chaos.{k}": v for k, v in extra.items()}}
    if signal is not None:
        attrs["chaos.signal"] = signal
    return _point("chaos.fault", FAULT, at, attrs)


def _death(span_id: int, at: int, process: ProcessInfo) -> RecordedSpan:
    return _point("executor.worker_death", span_id, at, {
        "faultlab.rank": process.rank, "process.pid": process.pid, "faultlab.detected_ns": at * MS})


def _rpc(start: int, end: int | None, error: str | None = "ExecutorFailedError",
         span_id: int = RPC) -> RecordedSpan:
    """``rpc sleep`` from the driver; failed with ``error`` at its end (None: succeeded)."""
    rpc = _span("rpc sleep", span_id, start, end, trace=0x5 + span_id - RPC, parent=STEP,
                status="ERROR" if error and end is not None else "UNSET")
    if error and end is not None:
        rpc.events.append(RecordedEvent("exception", end * MS, span_id, {"exception.type": error}))
    return rpc


def _failure(rpc: RecordedSpan) -> str:
    return str(rpc.attributes["faultlab.failure"])


def story_names_the_rank_the_fault_hit() -> None:
    """Rank 0's span comes first in the trace; the fault hit rank 1, inside its execute."""
    rpc = _rpc(10, 400)
    spans = [rpc, _span("worker.execute sleep", EXEC0, 20, 380, parent=RPC, process=RANK0),
             _span("worker.execute sleep", EXEC1, 20, None, parent=RPC, process=RANK1),
             _fault("kill_worker", 100, rank=1, pid=201, signal="SIGKILL"),
             _death(DEATH, 150, RANK1)]
    tell(spans)
    assert _failure(rpc).startswith("worker rank 1 (pid 201) killed by SIGKILL 90.00 ms into "
                                    "this RPC, inside worker.execute sleep"), _failure(rpc)
    [row] = rpc.story_spans
    assert (row.name, row.process) == ("worker.killed", RANK1)


def _queue_fault_at(at: int) -> RecordedSpan:
    """The RPC 10..400 ms (inside a step from 0 ms), its queue damaged at ``at`` ms."""
    rpc = _rpc(10, 400, "QueueCorruptError")
    tell([_span("engine.step", STEP, 0, 500), rpc,
          _fault("corrupt_queue", at, rank=1, pid=None, mode="flip_payload")])
    return rpc


def story_a_fault_at_the_rpcs_start_is_in_flight() -> None:
    told = _failure(_queue_fault_at(10))
    assert "0.00 ms into this RPC, while this call was in flight" in told, told


def story_a_fault_just_before_the_rpc_is_not_in_flight() -> None:
    told = _failure(_queue_fault_at(9))
    assert "1.00 ms before this RPC began, before this call began" in told, told
    assert "in flight" not in told, told


def story_a_sigstop_before_the_rpc_is_not_in_flight() -> None:
    """Issue 32: a worker SIGSTOPped 1001 ms before the RPC, which it served once resumed,
    was told "... before this RPC began, while this call was in flight"."""
    rpc = _rpc(1101, 2101, "TimeoutError")
    tell([rpc, _span("worker.execute sleep", EXEC1, 1500, 1600, parent=RPC, process=RANK1),
          _fault("hang_worker", 100, rank=1, pid=201, signal="SIGSTOP")])
    told = _failure(rpc)
    assert told.startswith("worker rank 1 (pid 201) stopped by SIGSTOP (hung) 1001.00 ms "
                           "before this RPC began, before its part of this call began"), told
    assert "in flight" not in told, told


def story_the_drivers_kill_is_the_drivers_death(rank: int = 0) -> None:
    """Issue 32: told as 'worker rank 0 (pid <driver>) killed by SIGKILL', with a
    ``worker.killed`` row in the driver's service and ``error.type=_OTHER``."""
    rpc = _rpc(10, None)  # the driver died with it open
    tell([rpc, _span("worker.execute sleep", EXEC0, 20, 380, parent=RPC, process=RANK0),
          _fault("kill_driver", 200, rank=rank, pid=DRIVER.pid, signal="SIGKILL")])
    told = _failure(rpc)
    assert told.startswith("the driver (pid 100) killed by SIGKILL 190.00 ms into this RPC, "
                           "while it waited on this call"), told
    assert "worker rank" not in told, told
    [row] = rpc.story_spans
    assert (row.name, row.process) == ("driver.killed", DRIVER)
    assert export_attributes(rpc)["error.type"] == "process_death"
    assert rpc.death_ns == 200 * MS


def story_the_drivers_kill_is_the_drivers_death_when_timed() -> None:
    story_the_drivers_kill_is_the_drivers_death(rank=-1)


def story_a_node_kill_names_the_node() -> None:
    """Issue 32: told as 'worker rank -1 (pid <agent>) hit by kill_node (kill)'."""
    rpc = _rpc(10, 400)
    lost = _point("executor.node_lost", DEATH, 300, {"faultlab.ranks": "[1]",
                                                    "faultlab.detected_ns": 300 * MS})
    tell([rpc, _span("worker.execute sleep", EXEC1, 20, None, parent=RPC,
                     process=ProcessInfo(900, 1, "worker", "faultlab", 0, 0)),
          _fault("kill_node", 100, rank=-1, pid=899, node=1, mode="kill"), lost])
    told = _failure(rpc)
    assert told.startswith("node 1 (every process on it) hit by kill_node (kill) 90.00 ms "
                           "into this RPC"), told
    assert "rank -1" not in told and "detected 200.00 ms after the fault (node_lost)" in told


def story_a_damaged_request_queue_is_the_queues_fault() -> None:
    """Found here on a real run: the driver's failpoint damages the request queue read by
    rank 1 and records its own pid; told as 'the queue read by worker rank 1 (pid
    <driver>)', then (with the driver's kill told right) as the driver waiting forever."""
    rpc = _rpc(10, 400, "WorkerError")
    tell([rpc, _span("executor.enqueue", EXEC0, 11, 12, parent=RPC),
          _fault("corrupt_queue", 100, rank=1, pid=DRIVER.pid, mode="flip_payload")])
    told = _failure(rpc)
    assert told.startswith("the queue read by worker rank 1 (written by pid 100) hit by "
                           "corrupt_queue (flip_payload) 90.00 ms into this RPC, while this "
                           "call was in flight"), told


def _detected_ms(other_death_at: int) -> float:
    rpc = _rpc(10, 400)
    tell([rpc, _span("worker.execute sleep", EXEC1, 20, None, parent=RPC, process=RANK1),
          _fault("kill_worker", 100, rank=1, pid=201, signal="SIGKILL"),
          _death(OTHER_DEATH, other_death_at, RANK0), _death(DEATH, 150, RANK1)])
    [event] = [e for e in rpc.events if e.name == "faultlab.detection"]
    return float(event.attributes["faultlab.detection.latency_ms"])


def story_another_workers_death_is_not_the_detection() -> None:
    assert _detected_ms(120) == 50.0  # rank 0 died first (120 ms): not rank 1's detection


def story_the_victims_death_is_the_detection() -> None:
    assert _detected_ms(900) == 50.0


def story_an_rpc_that_succeeded_carries_no_fault() -> None:
    succeeded, failed = _rpc(50, 300, None), _rpc(110, 260, span_id=RPC + 20)
    tell([succeeded, failed, _fault("kill_worker", 100, rank=1, pid=201, signal="SIGKILL"),
          _death(DEATH, 250, RANK1)])
    assert not any(e.name == "chaos.fault" for e in succeeded.events)
    assert not succeeded.story_spans and "faultlab.failure" not in succeeded.attributes
    assert any(e.name == "chaos.fault" for e in failed.events)


# ---------------------------------------------------------------- streamed == whole export

def _streamed(run: Path, fmt: str) -> str:
    out = io.StringIO()
    write_export(run, fmt, out)
    return out.getvalue()


def stream_jaeger_is_the_whole_export() -> None:
    run = _write_story_run()
    try:
        whole = json.dumps(render(run, "jaeger"), separators=(",", ":"))
        doc = json.loads(whole)
        rpc = next(s for t in doc["data"] for s in t["spans"] if s["operationName"] == "rpc sleep")
        events = [log["fields"][0]["value"] for log in rpc["logs"]]
        assert {"exception", "chaos.fault", "faultlab.restart"} <= set(events), events
        assert _streamed(run, "jaeger") == whole
    finally:
        _remove(run)


def stream_otlp_json_holds_the_whole_exports_spans() -> None:
    run = _write_story_run()
    try:
        def spans(doc: dict[str, Any]) -> list[str]:
            return sorted(json.dumps(s, sort_keys=True) for rs in doc["resourceSpans"]
                          for ss in rs["scopeSpans"] for s in ss["spans"])
        assert spans(json.loads(_streamed(run, "otlp-json"))) == spans(render(run, "otlp-json"))
    finally:
        _remove(run)


def _write_story_run() -> Path:
    """A run written by the real recorder (this process as the driver), traces apart: an RPC
    that succeeded, a fault, an RPC that failed after it (its exception timed after its end,
    as a worker's is: written with its reply), a restart after them.  The caller removes the directory."""
    keep = Path(tempfile.mkdtemp(prefix="judge-run-"))
    before = os.environ.get("FAULTLAB_TRACE_DIR")
    os.environ["FAULTLAB_TRACE_DIR"] = str(keep)
    try:
        telemetry.configure_process("driver")
        rec = telemetry.get_recorder()
        now = time.time_ns()
        rec.start_span("rpc echo", start_ns=now - 20 * MS).end(end_ns=now - 15 * MS)
        rpc = rec.start_span("rpc sleep", start_ns=now - 10 * MS)
        rec.event("chaos.fault", {"chaos.kind": "hang_worker", "faultlab.rank": 1,
                                  "process.pid": 424242, "chaos.time_ns": now - 5 * MS})
        rpc.add_event("exception", {"exception.type": "TimeoutError"})  # timed after its end
        rpc.end(error="TimeoutError: the deadline passed", end_ns=now - 1 * MS)
        rec.start_span("executor.restart", attributes={"faultlab.incarnation": 1}).end()
    finally:
        telemetry.shutdown()
        if before is None:
            del os.environ["FAULTLAB_TRACE_DIR"]
        else:
            os.environ["FAULTLAB_TRACE_DIR"] = before
    return keep


def _remove(run: Path) -> None:
    shutil.rmtree(run, ignore_errors=True)


# ---------------------------------------------------------------- receiver accounting

def _body() -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = "kept", b"\x01" * 16, b"\x02" * 8
    return request.SerializeToString()


def _send(endpoint: str, head: dict[str, str], body: bytes, length: int | None = None) -> int:
    """One request by hand (the client half-closes after the body); the reply's status."""
    url = urlsplit(endpoint)
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 0), timeout=30) as s:
        lines = [f"POST {url.path} HTTP/1.0",
                 f"Content-Length: {len(body) if length is None else length}",
                 *(f"{k}: {v}" for k, v in head.items())]
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return int(reply.split()[1])


PROTO = {"Content-Type": "application/x-protobuf"}


def receiver_counts_every_refusal() -> None:
    with OtlpReceiver() as receiver:
        statuses = [_send(receiver.endpoint, PROTO, _body()),
                    _send(receiver.endpoint, {"Content-Type": "application/json"}, b"{}"),
                    _send(receiver.endpoint, PROTO, _body(), length=len(_body()) + 9),
                    _send(receiver.endpoint, {**PROTO, "Content-Encoding": "br"}, b"x")]
    assert statuses == [200, 415, 400, 415]
    assert [r.split()[0] for r in receiver.rejected] == ["415", "400", "415"], receiver.rejected
    assert [s.name for s in receiver.spans()] == ["kept"]


def receiver_counts_nothing_for_good_requests() -> None:
    with OtlpReceiver() as receiver:
        statuses = [_send(receiver.endpoint, PROTO, _body()),
                    _send(receiver.endpoint, {**PROTO, "Content-Encoding": "gzip"},
                          gzip.compress(_body()))]
    assert statuses == [200, 200] and receiver.rejected == [] and receiver.requests == 2


def _zeros_gzip(n: int) -> bytes:
    return gzip.compress(bytes(n))


def _refused(call: Callable[[], object]) -> Refused:
    """The refusal ``call`` raises (AssertionError if none: pytest.raises's own failure is
    not an Exception, and would escape the planted-judge runner)."""
    try:
        call()
    except Refused as refused:
        return refused
    raise AssertionError("not refused")


def receiver_refuses_a_bomb_by_its_inflated_size() -> None:
    bomb = _zeros_gzip(4 << 20)  # 4 KiB sent, 4 MiB inflated
    refused = _refused(lambda: otlp_receiver.inflate(bomb, "gzip", limit=1 << 20))
    assert (refused.status, "inflates to more than" in str(refused)) == (413, True), refused


def receiver_takes_a_body_just_under_the_limit() -> None:
    assert otlp_receiver.inflate(_zeros_gzip((1 << 20) - 1), "gzip", limit=1 << 20) == bytes((1 << 20) - 1)
    assert otlp_receiver.inflate(zlib.compress(_body()), "deflate") == _body()


def receiver_refuses_a_truncated_gzip_body() -> None:
    whole = gzip.compress(_body())
    refused = _refused(lambda: otlp_receiver.inflate(whole[:-5], "gzip"))
    assert (refused.status, "truncated gzip body" in str(refused)) == (400, True), refused


def receiver_takes_a_whole_gzip_body_of_two_members() -> None:
    assert otlp_receiver.inflate(gzip.compress(_body()) + gzip.compress(_body()), "gzip") == _body() * 2


CASES: list[Case] = [
    story_names_the_rank_the_fault_hit,
    story_a_fault_at_the_rpcs_start_is_in_flight,
    story_a_fault_just_before_the_rpc_is_not_in_flight,
    story_a_sigstop_before_the_rpc_is_not_in_flight,
    story_the_drivers_kill_is_the_drivers_death,
    story_the_drivers_kill_is_the_drivers_death_when_timed,
    story_a_node_kill_names_the_node,
    story_a_damaged_request_queue_is_the_queues_fault,
    story_another_workers_death_is_not_the_detection,
    story_the_victims_death_is_the_detection,
    story_an_rpc_that_succeeded_carries_no_fault,
    stream_jaeger_is_the_whole_export,
    stream_otlp_json_holds_the_whole_exports_spans,
    receiver_counts_every_refusal,
    receiver_counts_nothing_for_good_requests,
    receiver_refuses_a_bomb_by_its_inflated_size,
    receiver_takes_a_body_just_under_the_limit,
    receiver_refuses_a_truncated_gzip_body,
    receiver_takes_a_whole_gzip_body_of_two_members,
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Case) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("telemetry"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: Any) -> None:
    assert_caught(judge, CASES)
