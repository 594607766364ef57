"""Call histories: every call's invoke and completion, and every worker-side execution.

    ScenarioResult.calls (RecordingExecutor) ──► invoke / ok | fail | info   (driver clock)
    trace journal: "rpc M" spans (faultlab.rpc_id) ◄── parent ── "worker.execute M" spans
                                          │                      (rank, pid, start, end)
                                          ▼
    history = [event, ...] in time order ──► DIR/history.jsonl ──► chaos.history_check

An event is a dict (one JSON line), ``op`` one of:

- ``invoke``: ``call`` (the call's index), ``method``, ``args`` (repr), ``expected`` (the
  fault-free model's value, repr, or None when the model does not know), ``non_block``,
  ``timeout``, and ``check`` when the workload named what a wrong outcome breaks
  ("callbacks": a call the edge workloads make around done-callbacks, maybe inside one);
- ``ok`` (``value``), ``fail`` (``error``: the call certainly did not succeed: a
  WorkerError, a damaged or unsendable message) or ``info`` (``error``: the outcome is
  unknown: a deadline, a failed executor or a Ctrl-C may have come before or after the
  worker ran it), each with ``seq`` (the order calls completed in);
- ``exec_start`` / ``exec_end``: a worker ran the call: ``rank``, ``pid``, ``incarnation``
  (0 for the first process of that rank, +1 per replacement), ``replay`` (a recovery
  re-execution, expected), ``rpc_id``.  A worker that died inside the call has no end.
  An execution's call is the one its RPC span belongs to: the first call of the span's
  method in progress when the span began (``_calls_by_rpc``; a refused call, with no span,
  never takes a later call's).

Every event has ``t`` (wall-clock ns, comparable across processes of one machine).  Values
are compared by their repr: the explored workloads' payloads are small and unique.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaos.recording import UNKNOWN, CallRecord

# The outcome of a call that failed with one of these is unknown ("info"): the worker may
# have run it, or not, or may still run it.
INFO_ERRORS = frozenset({"TimeoutError", "ExecutorFailedError", "KeyboardInterrupt"})
FILE_NAME = "history.jsonl"


def call_events(calls: Iterable[CallRecord]) -> list[dict[str, Any]]:
    """The invoke and completion events of the recorded calls."""
    events: list[dict[str, Any]] = []
    for c in calls:
        events.append({"op": "invoke", "call": c.index, "t": c.start_ns, "method": c.method,
                       "args": _repr(c.args), "non_block": c.non_block, "timeout": c.timeout,
                       "expected": None if c.expected is UNKNOWN else _repr(c.expected),
                       **({"check": c.check} if c.check else {})})
        if c.outcome == "ok":
            events.append({"op": "ok", "call": c.index, "t": c.end_ns, "seq": c.resolved_seq,
                           "value": _repr(c.value)})
        elif c.outcome == "error":
            op = "info" if c.error_type in INFO_ERRORS else "fail"
            events.append({"op": op, "call": c.index, "t": c.end_ns, "seq": c.resolved_seq,
                           "error": c.error_type, "message": c.error[:200]})
    return events


def execution_events(trace_dir: Path, calls: list[CallRecord]) -> list[dict[str, Any]]:
    """Worker-side executions from the trace journal, each mapped to its call."""
    if not trace_dir.is_dir():
        return []
    from telemetry.assemble import read_run

    spans = read_run(trace_dir)
    rpc = {s.span_id: s for s in spans if s.name.startswith("rpc ") and s.process.role == "driver"}
    call_of = _calls_by_rpc(sorted(rpc.values(), key=lambda s: s.attributes.get("faultlab.rpc_id", 0)),
                            calls)
    execs = sorted((s for s in spans if s.name.startswith("worker.execute ")),
                   key=lambda s: s.start_ns)
    incarnation = _incarnations(execs)
    events: list[dict[str, Any]] = []
    for s in execs:
        parent = rpc.get(s.parent_span_id)
        rpc_id = None if parent is None else parent.attributes.get("faultlab.rpc_id")
        common = {"call": None if rpc_id is None else call_of.get(rpc_id), "rpc_id": rpc_id,
                  "rank": s.process.rank, "pid": s.process.pid,
                  "incarnation": incarnation[(s.process.rank, s.process.pid)],
                  "replay": bool(s.attributes.get("faultlab.replay", False))}
        events.append({"op": "exec_start", "t": s.start_ns, **common})
        if s.end_ns is not None:
            events.append({"op": "exec_end", "t": s.end_ns, **common})
    return events


def _calls_by_rpc(rpc_spans: list[Any], calls: list[CallRecord]) -> dict[int, int]:
    """rpc id -> call index: each RPC span, in id order, is the first unmatched call of its
    method that was in progress when the span began (started by then, not yet ended: both
    clocks are the driver's ``time.time_ns``).  A call refused before an id was drawn (an
    executor already failed) has no span, and ended before any later call's span began, so
    it never takes a later call's span (and with it that call's executions)."""
    free = sorted(calls, key=lambda c: c.start_ns)
    out: dict[int, int] = {}
    for span in rpc_spans:
        method = span.attributes.get("rpc.method", span.name.removeprefix("rpc "))
        for c in free:
            if c.method == method and _in_progress(c, span.start_ns):
                out[span.attributes.get("faultlab.rpc_id")] = c.index
                free.remove(c)
                break
    return out


def _in_progress(call: CallRecord, t_ns: int) -> bool:
    """``call`` had started at ``t_ns`` and had not yet ended (a pending call never ends)."""
    return call.start_ns <= t_ns and (call.end_ns is None or t_ns <= call.end_ns)


def _incarnations(execs: list[Any]) -> dict[tuple[Any, int], int]:
    """(rank, pid) -> incarnation: the pids of a rank numbered in the order they first served."""
    seen: dict[Any, list[int]] = {}
    for s in execs:
        pids = seen.setdefault(s.process.rank, [])
        if s.process.pid not in pids:
            pids.append(s.process.pid)
    return {(rank, pid): i for rank, pids in seen.items() for i, pid in enumerate(pids)}


def build(calls: list[CallRecord], trace_dir: Path | None) -> list[dict[str, Any]]:
    """The whole history, in time order (an event without a time goes last)."""
    events = call_events(calls)
    if trace_dir is not None:
        events += execution_events(trace_dir, calls)
    return sorted(events, key=lambda e: (e["t"] is None, e["t"] or 0))


def write(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e, default=str) + "\n" for e in events))


def read(path: Path) -> list[dict[str, Any]]:
    """A history file; a malformed line raises ValueError naming the file and the line."""
    events = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON history event: {exc}") from None
        if not isinstance(event, dict) or "op" not in event:
            raise ValueError(f"{path}:{n}: a history event is an object with an 'op'")
        events.append(event)
    return events


def _repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
