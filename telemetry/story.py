"""Tell a run's failure story inside its traces: faults, detections, kinds, truncated bars.

Data flow::

    list[RecordedSpan] (assemble.read_run, or one live-export pass)
        ──► Story.tell(spans) ──► the same spans, annotated in place:
              span kinds (exporters add rpc.system.name / rpc.method / error.type)
              faults (``chaos.fault`` point spans) paired with their detection
              (``executor.worker_death`` / ``executor.node_lost`` point spans, else the
              first error an RPC raised after the fault)
              every RPC a fault failed (``_affected``: a failed RPC that ended after the
              fault and after no later one, begun before its recovery was over; the RPCs
              open at a fault only for a fault nobody noticed): ``failure_marks.mark_rpc``
              puts the fault, detection and restart inside it, a ``faultlab.failure``
              sentence and the victim's own row (``story_spans``); the victim's spans the
              fault cut get the fault event; another worker's span that raised after the
              victim was hit is a ``consequence``; a failed RPC's ``engine.step`` parent
              is marked ``faultlab.step.failed`` (shown ``engine.step (failed)``); each
              fault span gets its detection event and link
              truncated spans (placed first: a cut span's end decides what a fault hit):
              ``death_ns`` = the fault that killed the process, else its detected death,
              else (``stopped``: not an error in any export) the moment
              the executor's own shutdown reached it, with ``truncated_reason``
              links recorded in the journal (``faultlab.links.*``, telemetry/links.py)
              become links; an RPC or restart whose parent is an ``engine.step`` /
              ``engine.recovery`` span gets its parent's request links
              recovery spans (``executor.restart``, ``engine.recovery``,
              ``engine.rebuild``): events and links to the fault before them and its
              detection; the RPCs a fault affected get a ``faultlab.restart`` event and a
              link to the restart that followed it

Invariants:

- Pure and deterministic: only the recorded spans are read; telling twice adds nothing twice
  (events and links are keyed by the fault's span id).
- A ``Story`` remembers the faults and deaths it saw, so live export can tell one pass at a
  time: a fault is recorded before it acts and its detection before the failed RPC ends, so
  by the time an affected RPC span is exported both are known.
- Live export tells one pass at a time, so a restart reaches the failed RPC's story only
  when both are in one pass (the RPC usually ends first), and a step exported before its
  RPC failed is not renamed; offline loading sees them all.
  The step span ends before its RPC starts, so an RPC's request links always arrive.
- Names are never changed here (chaos oracles and notebooks match them); exporters show
  the rank and a failed step in the name (``naming.display_name``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

from telemetry.assemble import ProcessInfo, RecordedSpan
from telemetry.failure_marks import (
    FAULT,
    FaultInfo,
    Sign,
    mark_fault_span,
    mark_recovery,
    mark_rpc,
)
from telemetry.links import add_link, linked, take_links
from telemetry.naming import STEP_FAILED, error_type

DEATHS = ("executor.worker_death", "executor.node_lost")
KILLING = ("kill_worker", "term_worker", "kill_driver", "kill_node")
DRIVER_KILLS = ("kill_driver",)  # the victim is the driver, whatever rank the record names
REPAIRS = ("resume_worker",)  # faults that undo one: never the cause of a failed RPC
_KIND_PREFIXES = (
    ("rpc ", "client"), ("worker.execute ", "server"), ("executor.enqueue", "producer"),
    ("worker.reply_enqueue", "producer"), ("worker.dequeue", "consumer"),
    ("executor.dequeue", "consumer"),
)
_LOST_REASON = "the process ended before this span ended"
STOPPED = "worker.death_pipe_eof"  # a worker saw the executor close its death pipe
_STOPPED_REASON = ("stopped by the executor's own shutdown (death pipe closed) before it "
                   "ended: cut short, not failed")
RESTART, RECOVERY_SPANS = "executor.restart", ("executor.restart", "engine.recovery",
                                                "engine.rebuild")
STEP = "engine.step"
_LINK_PARENTS = (STEP, "engine.recovery")  # their children share their request links
_MAX_LINK_PARENTS = 4096  # link parents remembered across live-export passes


class Story:
    """Faults and deaths seen so far; ``tell`` annotates spans with them."""

    def __init__(self) -> None:
        self.faults: list[FaultInfo] = []
        self.signs: list[Sign] = []
        self.restarts: list[RecordedSpan] = []
        self.stops: dict[int, int] = {}  # pid -> when it saw the executor stop it (first)
        self._seen: set[int] = set()
        self._link_parents: dict[int, RecordedSpan] = {}
        self.processes: dict[int, ProcessInfo] = {}  # pid -> process, the victims' rows

    def tell(self, spans: list[RecordedSpan]) -> list[RecordedSpan]:
        for span in spans:
            apply_conventions(span)
            take_links(span)
            self._collect(span)
        self._inherit_links(spans)
        self._pair()
        rpcs = [s for s in spans if s.kind == "client"]
        by_trace: dict[int, list[RecordedSpan]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        for span in spans:  # first: where a cut span's bar ends decides what a fault hit
            if span.truncated:
                self._place_death(span)
        here = {id(s) for s in spans}
        for fault in self.faults:
            self._mark_fault(fault, id(fault.span) in here, rpcs, by_trace)
        for span in spans:
            if span.name in RECOVERY_SPANS:
                self._mark_recovery(span)
        return spans

    # ------------------------------------------------------------ collecting

    def _collect(self, span: RecordedSpan) -> None:
        self.processes.setdefault(span.process.pid, span.process)
        if span.span_id in self._seen:
            return
        attrs = span.attributes
        if span.name == RESTART:
            self._seen.add(span.span_id)
            self.restarts.append(span)
            return
        if span.point and span.name == STOPPED:
            self.stops.setdefault(span.process.pid, span.start_ns)
            return
        if span.point and span.name == FAULT:
            self._seen.add(span.span_id)
            kind = str(attrs.get("chaos.kind", "fault"))
            self.faults.append(FaultInfo(
                span, kind, _fault_rank(kind, attrs), _int(attrs.get("process.pid")) or None,
                _int(attrs.get("chaos.time_ns")) or span.start_ns))
        elif span.point and span.name in DEATHS:
            self._seen.add(span.span_id)
            ranks = _ranks(attrs)
            self.signs.append(Sign(
                span, _int(attrs.get("faultlab.detected_ns")) or span.start_ns,
                span.name.removeprefix("executor."), _int(attrs.get("process.pid")), ranks))
        elif span.kind == "client" and span.status == "ERROR" and span.end_ns is not None:
            self._seen.add(span.span_id)
            error = next((e for e in span.events if e.name == "exception"), None)
            when = error.time_ns if error is not None else span.end_ns
            by = str(span.attributes.get("error.type") or error_type(span))
            self.signs.append(Sign(span, when, by, None, ()))

    def _pair(self) -> None:
        self.faults.sort(key=lambda f: f.time_ns)
        self.signs.sort(key=lambda s: s.time_ns)
        for fault in self.faults:
            if fault.detection is None:
                fault.detection = next((s for s in self.signs if _matches(fault, s)), None)

    # ------------------------------------------------------------ annotating

    def _mark_fault(
        self, fault: FaultInfo, fault_here: bool, rpcs: list[RecordedSpan],
        by_trace: dict[int, list[RecordedSpan]],
    ) -> None:
        if fault_here:
            mark_fault_span(fault)
        restart = self._restart_after(fault)
        victim = self._victim(fault)
        for rpc in self._affected(fault, rpcs, restart):
            members = by_trace.get(rpc.trace_id, [])
            mark_rpc(rpc, fault, restart, members, victim)
            step = next((m for m in members if m.span_id == rpc.parent_span_id
                         and m.name == STEP), None)
            if step is not None and rpc.failed:  # the failed step stands out in a list
                step.attributes[STEP_FAILED] = True
                step.status = "ERROR"
                step.status_message = f"its {rpc.name} failed: {error_type(rpc)}"

    def _affected(self, fault: FaultInfo, rpcs: list[RecordedSpan],
                  restart: RecordedSpan | None) -> list[RecordedSpan]:
        """The RPCs a fault failed: each failed RPC that ended after it (and after no later
        fault), begun before the recovery that answered it was over; none that succeeded.
        A fault nobody noticed is told on the RPCs open when it acted."""
        recovered_ns = None if restart is None else restart.end_ns
        failed = [r for r in rpcs if r.failed and r.shown_end_ns >= fault.time_ns
                  and (recovered_ns is None or r.start_ns <= recovered_ns)
                  and self._latest_fault(r.shown_end_ns) is fault]
        if failed or fault.detection is not None:
            return failed
        return [r for r in rpcs if r.start_ns <= fault.time_ns <= r.shown_end_ns]

    def _latest_fault(self, time_ns: int) -> FaultInfo | None:
        """The last fault before ``time_ns`` that breaks something (a resume repairs)."""
        return max((f for f in self.faults if f.time_ns <= time_ns and f.kind not in REPAIRS),
                   key=lambda f: f.time_ns, default=None)

    def _victim(self, fault: FaultInfo) -> ProcessInfo | None:
        """The process a signal fault hit, a worker or the driver (its row in the failed
        RPC's trace); a node's loss has no one victim process."""
        if fault.pid is None or fault.signal is None or fault.kind == "kill_node":
            return None
        known = self.processes.get(fault.pid)
        if known is not None:
            return known
        role = "driver" if fault.kind in DRIVER_KILLS else "worker"
        if role == "worker" and fault.rank is None:
            return None
        return ProcessInfo(fault.pid, fault.rank, role, fault.span.process.service,
                           0, fault.span.process.created_ns, fault.span.process.host)

    def _restart_after(self, fault: FaultInfo) -> RecordedSpan | None:
        """The first restart that began after the fault."""
        return min((r for r in self.restarts if r.start_ns >= fault.time_ns),
                   key=lambda r: r.start_ns, default=None)

    def _cause_of(self, span: RecordedSpan) -> FaultInfo | None:
        """The fault a recovery span answers: the latest one before it began."""
        return max((f for f in self.faults if f.time_ns <= span.start_ns),
                   key=lambda f: f.time_ns, default=None)

    def _mark_recovery(self, span: RecordedSpan) -> None:
        fault = self._cause_of(span)
        if fault is not None:
            mark_recovery(span, fault)

    def _inherit_links(self, spans: list[RecordedSpan]) -> None:
        """An RPC (or restart) started inside an engine step (or recovery) serves the same
        requests: it gets its parent's request links."""
        parents = self._link_parents
        for span in spans:
            if span.name in _LINK_PARENTS and linked(span, "request"):
                parents[span.span_id] = span
        while len(parents) > _MAX_LINK_PARENTS:
            del parents[next(iter(parents))]
        for span in spans:
            parent = parents.get(span.parent_span_id)
            if parent is None or not (span.kind == "client" or span.name == RESTART):
                continue
            for link in linked(parent, "request"):
                add_link(span, link.trace_id, link.span_id, link.attributes)

    def _place_death(self, span: RecordedSpan) -> None:
        pid = span.process.pid
        for fault in self.faults:
            if fault.kind in KILLING and fault.pid == pid and fault.time_ns >= span.start_ns:
                span.death_ns = fault.time_ns
                span.truncated_reason = f"killed by chaos fault {fault.kind} ({fault.key})"
                return
        for sign in self.signs:
            if sign.time_ns < span.start_ns:
                continue
            if sign.pid == pid or (sign.pid is None and span.process.rank in sign.ranks
                                   and sign.by == "node_lost"):
                span.death_ns = sign.time_ns
                span.truncated_reason = f"process death detected by the driver ({sign.by})"
                return
        stopped_ns = self.stops.get(pid)
        if stopped_ns is not None and stopped_ns >= span.start_ns:  # a survivor, shut down
            span.death_ns, span.stopped = stopped_ns, True
            span.truncated_reason = _STOPPED_REASON
            return
        span.truncated_reason = _LOST_REASON


def tell(spans: list[RecordedSpan]) -> list[RecordedSpan]:
    """Annotate a whole run's spans (see the module docstring)."""
    return Story().tell(spans)


def apply_conventions(span: RecordedSpan) -> None:
    """The span's kind: a ``span.kind`` attribute (which is dropped), else from its name.
    An exception recorded after its span ended (a worker writes it with the reply) is
    placed at the span's end: it happened inside the span."""
    end = span.end_ns
    if end is not None:
        for event in span.events:
            if event.name == "exception" and event.time_ns > end:
                event.time_ns = end
    explicit = span.attributes.pop("span.kind", None)
    if explicit is not None:
        span.kind = str(explicit).lower()
    else:
        kind = _kind_by_name(span.name)
        if kind is not None:
            span.kind = kind


@functools.lru_cache(maxsize=8192)
def _kind_by_name(name: str) -> str | None:
    """The kind a span name implies (None: none), once per name: a long run has millions."""
    return next((k for p, k in _KIND_PREFIXES if name.startswith(p)), None)


def _matches(fault: FaultInfo, sign: Sign) -> bool:
    if sign.time_ns < fault.time_ns:
        return False
    if sign.by == "node_lost":
        return fault.rank is None or fault.rank in sign.ranks or fault.kind == "kill_node"
    if sign.by != "worker_death":
        return True
    if fault.pid is not None and sign.pid is not None:
        return fault.pid == sign.pid
    return fault.rank in sign.ranks


def _fault_rank(kind: str, attrs: dict[str, Any]) -> int | None:
    """The worker rank a fault names: none for the driver's kill (its record carries the
    plan's default rank) nor for a negative one (a node's kill records -1)."""
    rank = _int(attrs.get("faultlab.rank"))
    return None if kind in DRIVER_KILLS or (rank is not None and rank < 0) else rank


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _ranks(attrs: dict[str, Any]) -> tuple[int, ...]:
    rank = _int(attrs.get("faultlab.rank"))
    if rank is not None:
        return (rank,)
    raw = attrs.get("faultlab.ranks")
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        return tuple(int(r) for r in parsed or ())
    except (TypeError, ValueError):
        return ()


def detections(spans: Iterable[RecordedSpan]) -> list[tuple[FaultInfo, Sign | None]]:
    """Every fault of a told run with its detection (None: nobody noticed it)."""
    story = Story()
    story.tell(list(spans))
    return [(f, f.detection) for f in story.faults]
