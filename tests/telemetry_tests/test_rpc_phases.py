"""An RPC's compact PHASES records load as the same spans as before, and a begin without
its complete loads as truncated; every record goes through the one writer, in one format."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import telemetry
from executor import ExecutorConfig, MultiprocExecutor
from executor.errors import WorkerError
from telemetry import journal as j
from telemetry import rpc_trace
from telemetry.assemble import RecordedSpan, read_run
from telemetry.rpc_trace import RpcTrace

TELEMETRY = Path(telemetry.__file__).parent


def _by_name(spans: list[RecordedSpan]) -> dict[str, list[RecordedSpan]]:
    out: dict[str, list[RecordedSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def _rpc_then_worker(rec: telemetry.Recorder) -> tuple[RpcTrace, int, int]:
    """An RPC out, and its execute span begun in a "worker" (this process) as the worker
    begins it: from the request header's fields; the span id and its start."""
    rpc = rec.begin_rpc("rpc m", None, 7)
    assert isinstance(rpc, RpcTrace)
    t0 = time.time_ns()
    rpc += (t0, time.time_ns(), 123)  # the request is out: enqueue times, body size
    trace_id, span_id = rpc[0], rpc[1]
    start = time.time_ns()
    server = rec.serve("worker.execute m", trace_id >> 64, trace_id & ((1 << 64) - 1), span_id,
                       telemetry.FLAG_SAMPLED, start)
    assert server
    return rpc, server, start


def _read(rpc: RpcTrace, rank: int) -> None:
    """The collector read rank ``rank``'s reply, successfully."""
    start = time.time_ns()
    rpc += (rank, start, time.time_ns())


def test_phases_expand_into_named_spans_with_parents_kinds_and_attributes(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc, server, start = _rpc_then_worker(rec)
    executed = time.time_ns()
    rec.served(server, start - 1000 - 500, start - 500, start, executed, executed)
    for rank in (0, 1, 2, 3, 5):  # ranks 0-2 share a record, 3 and 5 the next
        _read(rpc, rank)
    rpc_trace.end_rpc(rec, rpc, None, 7, True, 2.5, 5)
    telemetry.shutdown()

    spans = read_run(trace_dir)
    names = _by_name(spans)
    (client,) = names["rpc m"]
    assert client.kind == "client" and client.status == "OK" and not client.truncated
    assert client.attributes == {
        "rpc.system.name": "faultlab", "rpc.method": "m", "faultlab.rpc_id": 7,
        "faultlab.non_block": True, "messaging.message.body.size": 123,
        "faultlab.timeout_s": 2.5, "faultlab.reply_rank": 5,
    }
    (enqueue,) = names["executor.enqueue"]
    dequeues = [s for s in spans if s.name.startswith("executor.dequeue rank ")]
    assert sorted(s.name for s in dequeues) == [f"executor.dequeue rank {r}" for r in (0, 1, 2, 3, 5)]
    for child in [enqueue, *dequeues]:
        assert child.parent_span_id == client.span_id and child.trace_id == client.trace_id
        assert not child.parent_remote and child.tid == client.tid
        assert client.start_ns <= child.start_ns <= child.end_ns <= client.end_ns  # type: ignore[operator]
    assert enqueue.kind == "producer" and {s.kind for s in dequeues} == {"consumer"}

    (execute,) = names["worker.execute m"]
    (dequeue,) = names["worker.dequeue"]
    (reply,) = names["worker.reply_enqueue"]
    assert execute.kind == "server" and execute.status == "OK"
    assert (dequeue.kind, reply.kind) == ("consumer", "producer")
    assert dequeue.attributes == {"faultlab.queue.wait_ns": 1000}
    for sibling in (dequeue, reply):  # the worker's spans are all children of the RPC span
        assert sibling.parent_span_id == client.span_id and sibling.status == "OK"
    assert dequeue.end_ns == execute.start_ns <= execute.end_ns <= reply.start_ns  # type: ignore[operator]
    assert len({s.span_id for s in spans}) == len(spans)
    assert [s.span_id for s in read_run(trace_dir)] == [s.span_id for s in spans]  # stable ids


def test_a_begin_without_its_complete_loads_truncated(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc, _server, _start = _rpc_then_worker(rec)  # the reply never goes out: no served()
    _read(rpc, 0)  # kept in memory only until the RPC span ends
    telemetry.shutdown()

    names = _by_name(read_run(trace_dir))
    (client,) = names["rpc m"]
    (execute,) = names["worker.execute m"]
    assert client.truncated and execute.truncated
    assert client.attributes["faultlab.rpc_id"] == 7  # in its start record (journal.FLAG_RPC)
    assert "executor.enqueue" not in names  # phases are written when the RPC ends
    assert not {"worker.dequeue", "worker.reply_enqueue", "executor.dequeue rank 0"} & set(names)


def test_failed_phases_are_spans_with_their_errors(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                         start_method="fork")
    with MultiprocExecutor(cfg) as ex:
        try:
            ex.collective_rpc("fail", args=("on purpose",), timeout=10.0)
        except WorkerError:
            pass
        else:
            raise AssertionError("fail() did not raise")
        # Each worker writes its execute span's end after its reply: one more call makes sure
        # both wrote it before shutdown (a shutdown right after cuts it: "stopped").
        ex.collective_rpc("echo", args=(0,), timeout=10.0)
    telemetry.shutdown()

    spans = read_run(trace_dir)
    (rpc,) = [s for s in spans if s.name == "rpc fail"]
    trace = [s for s in spans if s.trace_id == rpc.trace_id]
    names = _by_name(trace)
    assert rpc.status == "ERROR"
    executes = names["worker.execute fail"]
    assert len(executes) == 2 and {s.status for s in executes} == {"ERROR"}
    assert all("on purpose" in s.status_message for s in executes)
    assert all(any(e.name == "exception" for e in s.events) for s in executes)
    for s in executes:  # the worker's error, from the RemoteError its reply carries
        (event,) = [e for e in s.events if e.name == "exception"]
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "on purpose"
        assert "raise ValueError(message)" in event.attributes["exception.stacktrace"]
        assert s.status_message == "ValueError: on purpose"
    assert len(names["worker.dequeue"]) == len(names["worker.reply_enqueue"]) == 2
    dequeues = [s for s in trace if s.name.startswith("executor.dequeue rank ")]
    assert dequeues and {s.status for s in dequeues} == {"ERROR"}


def test_every_record_format_fits_a_slot_and_is_decoded() -> None:
    structs = [v for k, v in vars(j).items() if k.endswith("_S") and k != "HEADER_S"]
    assert j.PH_SENT_S in structs and j.PH_TIMES_S in structs
    assert all(1 + s.size <= j.RECORD_SIZE for s in structs)
    assert all(s.format.startswith("<BHI") for s in structs)  # flags, small, id: one head
    decoder = (TELEMETRY / "assemble.py").read_text()
    for name in ("SPAN_START", "SPAN_END", "ATTRIBUTE", "EVENT", "STRING", "THREAD", "PHASES",
                 "PH_SENT", "PH_DEQUEUED", "PH_SERVED", "PH_DONE", "PH_CALL", "FLAG_RPC"):
        assert f"j.{name}" in decoder, name
    assert len(set(j.KINDS)) == len(j.KINDS) and 0 not in j.KINDS  # 0 marks an empty slot


# Where records are written: JournalWriter.append, and the per-RPC hot paths that repeat its
# steps inline (journal's module docstring says why); close() only counts slots.
RECORD_WRITERS = {
    ("journal.py", "append"), ("recorder.py", "begin_rpc"), ("recorder.py", "serve"),
    ("recorder.py", "served"), ("rpc_trace.py", "end_rpc"),
}


def _record_steps(tree: ast.AST) -> dict[str, list[tuple[int, str]]]:
    """Per function: (line, step) of each slot reservation, pack into a mapping and
    kind-byte store in it."""
    steps: dict[str, list[tuple[int, str]]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            step = None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "next" and node.args
                    and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "slots"):
                step = "reserve"
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and "pack" in node.func.id and node.args
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "mm"):
                step = "pack"
            elif (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                    and isinstance(node.targets[0].value, ast.Name)
                    and node.targets[0].value.id == "mm"
                    and not isinstance(node.targets[0].slice, ast.Slice)):  # not the header
                step = "commit"
            if step:
                steps.setdefault(fn.name, []).append((node.lineno, step))
    return steps


def test_records_are_written_only_by_append_and_its_inline_twins() -> None:
    """No other code packs into a mapping or stores a kind byte, and every writer reserves
    a slot, packs the record after its kind byte, then stores the kind byte (the commit)."""
    writers = set()
    for path in TELEMETRY.glob("*.py"):
        for name, steps in _record_steps(ast.parse(path.read_text())).items():
            if path.name == "journal.py" and name == "close":
                assert [s for _, s in steps] == ["reserve"]  # counting used slots
                continue
            writers.add((path.name, name))
            assert [s for _, s in sorted(steps)] == ["reserve", "pack", "commit"], (path, name)
    assert writers == RECORD_WRITERS


def test_rpc_span_ends_with_its_last_dequeue_or_with_its_error(trace_dir: Path) -> None:
    """TP=2 success with a timeout (not a plain call): PH_SENT, then one PH_DONE record ends
    the span at the last reply read; an error still writes the dequeues, then a classic end
    with the status."""
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    ok = rec.begin_rpc("rpc ok", None, 1)
    bad = rec.begin_rpc("rpc bad", None, 2)
    assert isinstance(ok, RpcTrace) and isinstance(bad, RpcTrace)
    for rpc in (ok, bad):
        rpc += (time.time_ns(), time.time_ns(), 10)
        for rank in (0, 1):
            _read(rpc, rank)
    rpc_trace.end_rpc(rec, ok, None, 1, False, 5.0, None)
    rpc_trace.end_rpc(rec, bad, "boom", 2, False, None, None)
    telemetry.shutdown()

    names = _by_name(read_run(trace_dir))
    (good,), (failed,) = names["rpc ok"], names["rpc bad"]
    assert (good.status, failed.status, failed.status_message) == ("OK", "ERROR", "boom")
    assert not good.truncated and not failed.truncated
    for span in (good, failed):
        kids = [names[f"executor.dequeue rank {r}"] for r in (0, 1)]
        (last,) = [s for s in kids[1] if s.parent_span_id == span.span_id]
        assert all(any(s.parent_span_id == span.span_id for s in k) for k in kids)
        assert last.end_ns is not None and span.end_ns is not None
        assert (last.end_ns == span.end_ns) if span is good else (last.end_ns <= span.end_ns)


def _records(trace_dir: Path, kind: int) -> list[bytes]:
    """The raw records of ``kind`` in every journal segment under ``trace_dir``."""
    out = []
    for path in trace_dir.rglob("journal-*.bin"):
        data = path.read_bytes()
        for off in range(j.HEADER_SIZE, len(data) - j.RECORD_SIZE + 1, j.RECORD_SIZE):
            if data[off] == kind:
                out.append(data[off : off + j.RECORD_SIZE])
    return out


def test_a_plain_call_ends_with_one_record_that_loads_as_every_phase(trace_dir: Path) -> None:
    """TP=2, no timeout, every rank: start and PH_CALL are the RPC's only records, and they
    load as the RPC span (rpc id, size, end at the last reply) with its enqueue and dequeues."""
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc = rec.begin_rpc("rpc plain", None, 41)
    assert isinstance(rpc, RpcTrace)
    t0 = time.time_ns()
    rpc += (t0, time.time_ns(), 99)
    for rank in (0, 1):
        _read(rpc, rank)
    rpc_trace.end_rpc(rec, rpc, None, 41, False, None, None)
    telemetry.shutdown()

    phases = _records(trace_dir, j.PHASES)
    assert [int.from_bytes(r[2:4], "little") for r in phases] == [j.PH_CALL]
    assert not _records(trace_dir, j.SPAN_END)
    names = _by_name(read_run(trace_dir))
    (client,) = names["rpc plain"]
    assert client.status == "OK" and not client.truncated
    assert client.attributes == {
        "rpc.system.name": "faultlab", "rpc.method": "plain", "faultlab.rpc_id": 41,
        "faultlab.non_block": False, "messaging.message.body.size": 99,
    }
    (enqueue,) = names["executor.enqueue"]
    assert enqueue.start_ns == t0 and enqueue.end_ns is not None
    deq = [names[f"executor.dequeue rank {r}"][0] for r in (0, 1)]
    assert enqueue.end_ns <= deq[0].start_ns <= deq[0].end_ns <= deq[1].start_ns  # type: ignore[operator]
    assert deq[1].end_ns == client.end_ns
    assert all(s.parent_span_id == client.span_id for s in (enqueue, *deq))
    assert client.tid == enqueue.tid and client.tid > 0  # the thread id shares the rpc id's field


def test_polling_a_traced_future_before_its_reply_records_no_timeout(trace_dir: Path) -> None:
    """``future.result(timeout=...)`` that gives up before the reply, then succeeds: the RPC
    is one successful span with its two dequeues, no dequeue span marked as a timeout (only
    the call's own deadline makes one)."""
    telemetry.configure_process("driver")
    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                         start_method="fork")
    with MultiprocExecutor(cfg) as ex:
        future = ex.collective_rpc("sleep", args=(0.3,), non_block=True)
        for _ in range(3):
            try:
                future.result(timeout=0.02)
            except TimeoutError:
                pass
            else:
                raise AssertionError("the reply came before the sleep ended")
        future.result(timeout=10)
        try:
            ex.collective_rpc("sleep", args=(1.0,), timeout=0.2)
        except Exception:  # noqa: BLE001 - the executor's timeout error
            pass
        else:
            raise AssertionError("a 1 s sleep did not time out at 0.2 s")
    telemetry.shutdown()

    spans = read_run(trace_dir)
    rpcs = [s for s in spans if s.name == "rpc sleep"]
    assert len(rpcs) == 2
    polled, timed_out = sorted(rpcs, key=lambda s: s.start_ns)
    assert polled.status == "OK"
    kids = [s for s in spans if s.parent_span_id == polled.span_id
            and s.name.startswith("executor.dequeue")]
    assert sorted(s.name for s in kids) == ["executor.dequeue rank 0", "executor.dequeue rank 1"]
    assert all(s.attributes.get("faultlab.outcome") != "timeout" for s in kids)
    late = [s for s in spans if s.parent_span_id == timed_out.span_id
            and s.attributes.get("faultlab.outcome") == "timeout"]
    assert timed_out.status == "ERROR" and len(late) == 1
