"""A target run as one faultlab trace: what the observer saw, beside the target's own spans.

Data flow::

    TargetRecord (chaos.targets.run)  +  ReceivedSpan list (the target's OTLP export, if any)
      + the run's row (outcome, violations, cause_named: chaos.targets.compare)
        ──► write_run_trace(record, out, received, row) ──► out/journal-*.bin, one trace:

    faultlab chaos (the observer, its own pid)
      target.run TARGET SCENARIO seed N     root: the whole run; events target.ready,
                                             target.done, target.hang, target.orphan,
                                             target.leftover, target.error
      chaos.fault                            point: kind, role, rank, pid, signal (+ SIGCONT:
                                             chaos.resume)
    TARGET driver (the driver's pid)
      target.call I: WHAT                    invoke → ok / fail (span.kind client: the story
                                             tells the fault and its detection on a failed
                                             one), outcome, error type and message; a call
                                             still in flight when the driver ended is left
                                             open (truncated, as a killed process's span)
      faultlab.detection                     point: the first error the caller saw, with
                                             faultlab.detection.latency_ms (2 decimals)
    TARGET ROLE [rank N] (each process's pid)
      target.exit                            point: the moment the observer saw it gone
      the target's own OTLP spans            (vLLM's llm_request), re-parented (below)

Each process the observer knew is a journal of its own, named by its pid, role and rank,
so every export shows it as its own service row (``telemetry.naming``); the target's
service is its name (``processpool worker rank 1``), the observer's is ``faultlab chaos``.

Target spans are converted into journal records (not merged at export time): every export
format, ``load_run`` and ``faultlab trace send`` then show them with no change, and a run
directory stays self-contained after the receiver is gone.  A target's spans carry their own
trace ids (vLLM starts a trace per request): each keeps its span id and its parent when the
parent was received too; a span whose parent is not here is re-parented under the call
whose [invoke, end] contains it (by time: the target's spans name no call of ours), else
under the run's root.  The original trace and parent ids stay as ``faultlab.otlp.*``.

Invariants: one trace per run directory (older journals there are removed first); every
moment lies inside the root span; nothing here runs while the target does.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.targets import oracles
from chaos.targets.run import TargetRecord
from telemetry.failure_marks import iso
from telemetry.journal import find_journals
from telemetry.observed import Event, ObservedJournal
from telemetry.span import SpanContext

if TYPE_CHECKING:
    from telemetry.otlp_receiver import ReceivedSpan

OBSERVER_ROLE, OBSERVER_SERVICE = "chaos", "faultlab"
EXIT_SEEN_BY = "the observer's poll (every 20 ms, or the scanner's 0.2 s)"


def write_run_trace(record: TargetRecord, out: Path, received: Sequence[ReceivedSpan] = (),
                    row: dict[str, Any] | None = None) -> None:
    """Write the run's trace into ``out`` (see the module docstring)."""
    for journal in find_journals(out):
        for segment in journal.segments:
            segment.unlink(missing_ok=True)
    writer = _RunTrace(record, out, row or {})
    try:
        writer.write(received)
    finally:
        writer.close()


class _RunTrace:
    def __init__(self, record: TargetRecord, out: Path, row: dict[str, Any]) -> None:
        self.record, self.out, self.row = record, out, row
        rng = random.Random()
        self.root = SpanContext(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, True)
        self.start_ns, self.end_ns = _extent(record)
        self.procs = {p["pid"]: p for p in record.procs}
        self.journals: dict[int, ObservedJournal] = {}
        self.observer = ObservedJournal(out, pid=os.getpid(), role=OBSERVER_ROLE, rank=None,
                                        service=OBSERVER_SERVICE)
        self.calls: dict[int, SpanContext] = {}

    def close(self) -> None:
        for journal in [self.observer, *self.journals.values()]:
            journal.close()

    def write(self, received: Sequence[ReceivedSpan]) -> None:
        self._root()
        self._fault()
        driver = self._driver_journal()
        if driver is not None:
            self._calls(driver)
            self._detection(driver)
        self._exits()
        self._target_spans(received)

    # ------------------------------------------------------------ the observer's view

    def _root(self) -> None:
        r, row = self.record, self.row
        attrs = {"faultlab.target": r.target, "faultlab.scenario": r.scenario,
                 "faultlab.seed": r.seed, "faultlab.fault.kind": r.fault_kind,
                 "faultlab.applicable": r.applicable, "faultlab.note": r.note or None,
                 "faultlab.outcome": row.get("outcome"),
                 "faultlab.cause_named": row.get("cause_named"),
                 "faultlab.violations": row.get("violations") or None,
                 "faultlab.ended_by": r.ended_by, "faultlab.driver.exit_code":
                 r.driver_returncode, "faultlab.wall_s": round(r.wall_s, 3),
                 "faultlab.observer_lag_ms": r.observer_lag_ms,
                 "faultlab.observer_priority": r.observer_priority or None,
                 "faultlab.attribution": r.attribution or None,
                 "faultlab.disowned": [d["pid"] for d in r.disowned] or None,
                 "faultlab.observer_signal": r.observer_signal, "faultlab.bounds": r.bounds,
                 "faultlab.spec": r.spec}
        violations = row.get("violations") or []
        error = f"{len(violations)} violation(s): {violations[0]}" if violations else None
        self.observer.span(f"target.run {r.target} {r.scenario} seed {r.seed}", self.start_ns,
                           self.end_ns, None, attrs, self._root_events(), error,
                           trace_id=self.root.trace_id, span_id=self.root.span_id)

    def _root_events(self) -> list[Event]:
        r, end = self.record, self.end_ns
        events: list[Event] = []
        if r.ready_ns:
            events.append(("target.ready", r.ready_ns, {"faultlab.procs": len(r.procs)}))
        if r.done_ns:
            events.append(("target.done", r.done_ns, {}))
        events += [("target.error", e["t"], {"error.type": e.get("type"),
                                              "exception.message": _cut(e.get("message"))})
                   for e in r.errors if isinstance(e.get("t"), int)]
        events += [("target.hang", s["time_ns"], {"faultlab.hang": s["what"],
                                                  "faultlab.hang.calls": s["calls"],
                                                  "faultlab.hang.procs": s["procs"]})
                   for s in r.stuck]
        judged = (r.driver_end_ns or end) + int(r.bounds.get("exit_s", 5.0) * 1e9)
        events += [("target.orphan", min(judged, end),
                    {"faultlab.role": o["role"], "faultlab.rank": o.get("rank"),
                     "process.pid": o["pid"], "faultlab.status": o["status"]})
                   for o in r.orphans]
        events += [("target.leftover", end, {"faultlab.leftover": name}) for name in r.leftovers]
        return sorted(events, key=lambda e: e[1])

    def _fault(self) -> None:
        fault = self.record.fault
        if not fault or not fault.get("time_ns"):
            return
        attrs: dict[str, Any] = {f"chaos.{k}": v for k, v in fault.items()
                                 if isinstance(v, str | int | float | bool)
                                 and k not in ("rank", "pid", "time_ns", "resumed_ns")}
        attrs.update({"chaos.seed": self.record.seed, "faultlab.rank": fault.get("rank"),
                      "process.pid": fault.get("pid"), "chaos.segment": fault.get("segment")})
        self.observer.point("chaos.fault", fault["time_ns"], self.root, attrs)
        if fault.get("resumed_ns"):
            self.observer.point("chaos.resume", fault["resumed_ns"], self.root,
                                {"chaos.signal": "SIGCONT", "process.pid": fault.get("pid"),
                                 "chaos.within_bound": fault.get("within_bound")})

    # ------------------------------------------------------------ the driver: calls, detection

    def _driver_journal(self) -> ObservedJournal | None:
        driver = next((p for p in self.record.procs if p["role"] == "driver"), None)
        return None if driver is None else self._journal(driver["pid"])

    def _calls(self, driver: ObservedJournal) -> None:
        r = self.record
        for call_id, call in sorted(r.calls.items()):
            start = call.get("invoke_ns") or self.start_ns
            end, error = call.get("end_ns"), None
            attrs: dict[str, Any] = {"span.kind": "client", "faultlab.call.id": call_id,
                                     "faultlab.call.what": call.get("what"),
                                     "faultlab.outcome": call.get("outcome")}
            if call.get("outcome") == "fail":
                error = f"{call.get('type')}: {_cut(call.get('message'))}"
                attrs["error.type"] = call.get("type")
            elif call.get("outcome") == "ok":
                attrs["faultlab.call.value"] = _cut(repr(call.get("value")))
            if end is None:  # left open: read as cut short when its process ended
                attrs["faultlab.call.note"] = "no reply: still in flight when the driver ended"
            self.calls[call_id] = driver.span(f"target.call {call_id}: {call.get('what')}",
                                              start, end, self.root, attrs, (), error)

    def _detection(self, driver: ObservedJournal) -> None:
        errors, fault_ns = oracles.caller_errors(self.record), self.record.fault_ns()
        if not errors or fault_ns is None:
            return
        first = errors[0]
        call = next((i for i, c in self.record.calls.items() if first["ev"] == "fail"
                     and c.get("outcome") == "fail" and c.get("end_ns") == first["t"]), None)
        attrs = {"faultlab.detection.latency_ms": round((first["t"] - fault_ns) / 1e6, 2),
                 "faultlab.detection.by": first["ev"], "faultlab.detection.call": call,
                 "faultlab.detection.at": iso(first["t"]), "error.type": first["type"],
                 "exception.message": _cut(first["message"]),
                 "faultlab.cause_named": oracles.cause_named(self.record),
                 "faultlab.fault.kind": self.record.fault_kind}
        parent = self.calls.get(call, self.root) if call is not None else self.root
        driver.point("faultlab.detection", first["t"], parent, attrs)

    # ------------------------------------------------------------ each process

    def _exits(self) -> None:
        r = self.record
        fault = r.fault or {}
        orphans = {o["pid"] for o in r.orphans}
        for proc in r.procs:
            if not proc.get("exit_ns"):
                continue
            how = ("an orphan: SIGKILLed by the observer's cleanup" if proc["pid"] in orphans
                   else "the fault's victim" if proc["pid"] == fault.get("pid") else None)
            attrs = {"process.pid": proc["pid"], "faultlab.exit.how": how,
                     "faultlab.exit.seen_by": EXIT_SEEN_BY, "faultlab.exit.at":
                     iso(proc["exit_ns"])}
            if proc["role"] == "driver":
                attrs["process.exit.code"] = r.driver_returncode
            if r.fault_ns() is not None:
                attrs["faultlab.exit.after_fault_ms"] = round(
                    (proc["exit_ns"] - r.fault_ns()) / 1e6, 2)
            self._journal(proc["pid"]).point("target.exit", proc["exit_ns"], self.root, attrs)

    def _journal(self, pid: int, resource: dict[str, Any] | None = None) -> ObservedJournal:
        journal = self.journals.get(pid)
        if journal is None:
            proc = self.procs.get(pid, {})
            service = self.record.target if proc or not resource else str(
                resource.get("service.name") or self.record.target)
            journal = self.journals[pid] = ObservedJournal(
                self.out, pid=pid, role=proc.get("role", "target"), rank=proc.get("rank"),
                service=service)
        return journal

    # ------------------------------------------------------------ the target's own spans

    def _target_spans(self, received: Iterable[ReceivedSpan]) -> None:
        # An exporter that retries a batch whose reply it lost sends the same spans twice.
        spans = list({(s.trace_id, s.span_id): s for s in received}.values())
        ids = {s.span_id for s in spans}
        for span in sorted(spans, key=lambda s: s.start_ns):
            parent, how = self._new_parent(span, ids)
            attrs = {**span.attributes, **{f"resource.{k}": v for k, v in span.resource.items()},
                     "faultlab.source": "target OTLP export", "faultlab.otlp.scope": span.scope,
                     "faultlab.otlp.trace_id": f"{span.trace_id:032x}",
                     "faultlab.otlp.parent_span_id": f"{span.parent_span_id:016x}"
                     if span.parent_span_id else None, "faultlab.otlp.reparented": how}
            if span.kind != "internal":
                attrs["span.kind"] = span.kind
            error = (span.status_message or "ERROR") if span.status == "ERROR" else None
            self._journal(_sender_pid(span, self.record), span.resource).span(
                span.name, span.start_ns, span.end_ns, parent, attrs, span.events, error,
                status=span.status if span.status != "ERROR" else None, span_id=span.span_id)

    def _new_parent(self, span: ReceivedSpan, ids: set[int]) -> tuple[SpanContext, str | None]:
        if span.parent_span_id in ids:
            return SpanContext(self.root.trace_id, span.parent_span_id, True), None
        for call_id, call in sorted(self.record.calls.items()):
            start, end = call.get("invoke_ns"), call.get("end_ns") or self.end_ns
            if start is not None and start <= span.start_ns and span.end_ns <= end:
                return self.calls[call_id], f"under call {call_id} (its time lies inside it)"
        return self.root, "under the run (no call's time contains it)"


def _sender_pid(span: ReceivedSpan, record: TargetRecord) -> int:
    """The process that sent ``span``: its resource's pid, else the driver's."""
    for key in ("process.pid", "vllm.process_id"):
        try:
            return int(span.resource[key])
        except (KeyError, TypeError, ValueError):
            continue
    driver = next((p["pid"] for p in record.procs if p["role"] == "driver"), None)
    return driver if driver is not None else 0


def _extent(record: TargetRecord) -> tuple[int, int]:
    """The root span's range: the run's start to its end, holding every recorded moment."""
    times = [t for t in (record.ready_ns, record.done_ns, record.driver_end_ns,
                         record.fault_ns()) if t]
    times += [p["exit_ns"] for p in record.procs if p.get("exit_ns")]
    times += [t for c in record.calls.values() for t in (c.get("invoke_ns"), c.get("end_ns")) if t]
    start = record.started_ns or min(times, default=0)
    end = max([start + int(record.wall_s * 1e9), *times])
    return start, end


def _cut(text: Any, limit: int = 500) -> str:
    out = "" if text is None else str(text)
    return out if len(out) <= limit else out[:limit] + "..."
