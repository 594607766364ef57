"""What a failed RPC's own trace says about the fault that failed it.

Data flow::

    FaultInfo (a chaos.fault point span) + its detection (Sign) + the restart after it
      + the failed RPC span and the other spans of its trace
        ──► mark_rpc() ──► on the RPC, inside its time range:
              events  chaos.fault / faultlab.detection / faultlab.restart
              attribute faultlab.failure (one sentence: who, what, when, detected how)
              links to the fault, detection and restart spans (extra: the story reads without)
            ──► RecordedSpan.story_spans of the RPC (exported as its children):
              <role>.<fate> (e.g. "worker.killed", "driver.killed") in the victim's own
              process, so the killed rank (or driver) has a row on the timeline, saying what
              happened to it, even when it never took the call; or, for a fault with no
              victim process (a queue, a node), a chaos.fault child

Invariants:

- Everything lies inside the RPC's time range: an event or child whose moment falls
  before the RPC began (a fault between RPCs) or after it ended (the restart) is placed at
  the nearest edge, and its attributes give the true moment readably: ``*.offset_ms`` from
  the RPC's start (negative: before it), ``*.at`` as an ISO time.  Raw nanoseconds stay only
  where a program reads them, under a ``raw`` name (``faultlab.detection.raw_time_ns``).
- Latencies and durations are milliseconds with two decimals.
- The sentence names what the fault hit (``fault_target``: a worker by rank and pid, the
  driver, a node, a queue), never another span's process; "while this call was in flight"
  only for a fault from the RPC's start on, never for one that came before it began.
- Deterministic: the children's ids derive from the RPC's and the fault's ids, so marking
  twice replaces, never adds.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from telemetry.assemble import ProcessInfo, RecordedEvent, RecordedSpan
from telemetry.links import add_link
from telemetry.naming import error_type

FAULT, DETECTION, RESTART_EVENT = "chaos.fault", "faultlab.detection", "faultlab.restart"
FAILURE = "faultlab.failure"  # the RPC's one-sentence failure story
_FAULT_KEYS = ("kind", "phase", "mode", "signal", "seed", "msg_id", "method", "by", "index")
_FATES = {"SIGKILL": ("killed", "killed by SIGKILL"),
          "SIGTERM": ("terminated", "terminated by SIGTERM"),
          "SIGSTOP": ("stopped", "stopped by SIGSTOP (hung)")}
_M64 = (1 << 64) - 1
_NO_VICTIM_PROCESS = ("corrupt_queue", "kill_node")  # its pid is a writer's, an agent's


@dataclasses.dataclass
class Sign:
    """A sign that the driver noticed a failure: a death point span or an RPC's error."""

    span: RecordedSpan
    time_ns: int
    by: str
    pid: int | None
    ranks: tuple[int, ...]


@dataclasses.dataclass
class FaultInfo:
    span: RecordedSpan
    kind: str
    rank: int | None
    pid: int | None
    time_ns: int
    detection: Sign | None = None

    @property
    def key(self) -> str:
        return f"{self.span.span_id:016x}"

    @property
    def signal(self) -> str | None:
        value = self.span.attributes.get("chaos.signal")
        return None if value is None else str(value)

    def attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"faultlab.fault.kind": self.kind,
                                 "faultlab.fault.span_id": self.key}
        if self.rank is not None:
            attrs["faultlab.fault.rank"] = self.rank
        if self.pid is not None:
            attrs["faultlab.fault.pid"] = self.pid
        for key in _FAULT_KEYS[1:]:
            value = self.span.attributes.get(f"chaos.{key}")
            if value is not None:
                attrs[f"faultlab.fault.{key}"] = value
        return attrs


def ms(ns: int) -> float:
    """Nanoseconds as milliseconds with two decimals, the way a person reads them."""
    return round(ns / 1e6, 2)


def iso(ns: int) -> str:
    """An epoch time in nanoseconds as an ISO-8601 UTC time with microseconds."""
    moment = datetime.datetime.fromtimestamp(ns // 10**9, tz=datetime.UTC)
    return moment.replace(microsecond=(ns // 1000) % 10**6).isoformat()


def when(time_ns: int, rpc: RecordedSpan) -> str:
    """Where a moment lies relative to an RPC, in words."""
    if time_ns < rpc.start_ns:
        return f"{ms(rpc.start_ns - time_ns):.2f} ms before this RPC began"
    if time_ns > rpc.shown_end_ns:
        return f"{ms(time_ns - rpc.shown_end_ns):.2f} ms after this RPC ended"
    return f"{ms(time_ns - rpc.start_ns):.2f} ms into this RPC"


def detection_attributes(fault: FaultInfo, sign: Sign) -> dict[str, Any]:
    return {
        "faultlab.fault.kind": fault.kind, "faultlab.fault.span_id": fault.key,
        "faultlab.detection.by": sign.by,
        "faultlab.detection.latency_ms": ms(sign.time_ns - fault.time_ns),
        "faultlab.detection.pid": sign.span.process.pid,
        "faultlab.detection.at": iso(sign.time_ns),
        "faultlab.detection.raw_time_ns": sign.time_ns,  # read by telemetry.plotting
    }


def restart_attributes(fault: FaultInfo, restart: RecordedSpan) -> dict[str, Any]:
    attrs: dict[str, Any] = {"faultlab.fault.span_id": fault.key,
                             "faultlab.restart.span_id": f"{restart.span_id:016x}",
                             "faultlab.restart.after_fault_ms": ms(restart.start_ns - fault.time_ns),
                             "faultlab.restart.at": iso(restart.start_ns)}
    if restart.end_ns is not None:
        attrs["faultlab.restart.duration_ms"] = ms(restart.end_ns - restart.start_ns)
    incarnation = restart.attributes.get("faultlab.incarnation")
    if incarnation is not None:
        attrs["faultlab.incarnation"] = incarnation
    return attrs


def add_event(span: RecordedSpan, name: str, time_ns: int, attrs: dict[str, Any]) -> None:
    """Add an event once per fault (keyed by ``faultlab.fault.span_id``), in time order."""
    key = attrs.get("faultlab.fault.span_id")
    if any(e.name == name and e.attributes.get("faultlab.fault.span_id") == key
           for e in span.events):
        return
    span.events.append(RecordedEvent(name, time_ns, span.span_id, dict(attrs)))
    span.events.sort(key=lambda e: e.time_ns)


def link_to(span: RecordedSpan, target: RecordedSpan, role: str, key: str) -> None:
    add_link(span, target.trace_id, target.span_id,
             {"faultlab.link": role, "faultlab.fault.span_id": key})


def _inside(span: RecordedSpan, time_ns: int) -> int:
    return min(max(time_ns, span.start_ns), span.shown_end_ns)


def mark_fault_span(fault: FaultInfo) -> None:
    """The fault's own span gets its detection (at its edge: the span is a point)."""
    detection = fault.detection
    if detection is not None:
        add_event(fault.span, DETECTION, _inside(fault.span, detection.time_ns),
                  detection_attributes(fault, detection))
        link_to(fault.span, detection.span, "detection", fault.key)


def mark_recovery(span: RecordedSpan, fault: FaultInfo) -> None:
    """A recovery span (restart, engine recovery, rebuild) tells the fault it answers."""
    add_event(span, FAULT, _inside(span, fault.time_ns),
              {**fault.attributes(), "faultlab.fault.offset_ms": ms(fault.time_ns - span.start_ns),
               "faultlab.fault.at": iso(fault.time_ns)})
    link_to(span, fault.span, "fault", fault.key)
    detection = fault.detection
    if detection is not None:
        add_event(span, DETECTION, _inside(span, detection.time_ns),
                  {**detection_attributes(fault, detection),
                   "faultlab.detection.offset_ms": ms(detection.time_ns - span.start_ns)})
        link_to(span, detection.span, "detection", fault.key)


def mark_rpc(rpc: RecordedSpan, fault: FaultInfo, restart: RecordedSpan | None,
             members: list[RecordedSpan], victim: ProcessInfo | None) -> None:
    """Tell ``fault`` (with its detection and ``restart``) inside the failed ``rpc``'s
    trace; ``members`` are the trace's spans, ``victim`` the process the fault hit."""
    def inside(time_ns: int) -> int:
        return _inside(rpc, time_ns)

    def offset(time_ns: int) -> float:
        return ms(time_ns - rpc.start_ns)

    fault_attrs = {**fault.attributes(), "faultlab.fault.offset_ms": offset(fault.time_ns),
                   "faultlab.fault.at": iso(fault.time_ns)}
    add_event(rpc, FAULT, inside(fault.time_ns), fault_attrs)
    link_to(rpc, fault.span, "fault", fault.key)
    detection = fault.detection
    if detection is not None:
        add_event(rpc, DETECTION, inside(detection.time_ns),
                  {**detection_attributes(fault, detection),
                   "faultlab.detection.offset_ms": offset(detection.time_ns)})
        if detection.span is not rpc:
            link_to(rpc, detection.span, "detection", fault.key)
    if restart is not None:
        add_event(rpc, RESTART_EVENT, inside(restart.start_ns),
                  {**restart_attributes(fault, restart),
                   "faultlab.restart.offset_ms": offset(restart.start_ns)})
        link_to(rpc, restart, "restart", fault.key)
    for member in members:  # the victim's spans the fault really cut (never earlier ones)
        if (fault.pid is not None and member.process.pid == fault.pid
                and member.start_ns <= fault.time_ns <= member.shown_end_ns):
            add_event(member, FAULT, fault.time_ns, fault_attrs)
            link_to(member, fault.span, "fault", fault.key)
    fate = victim_fate(fault, rpc, members)
    if victim is not None:
        _mark_consequences(fault, members, fate)
    rpc.attributes[FAILURE] = _summary(fault, rpc, restart, fate)
    child = _victim_span(rpc, fault, victim, fate, fault_attrs) if victim is not None \
        else _fault_span(rpc, fault, fault_attrs)
    child.start_ns = child.end_ns = inside(fault.time_ns)
    rpc.story_spans = [s for s in rpc.story_spans if s.span_id != child.span_id] + [child]


def _mark_consequences(fault: FaultInfo, members: list[RecordedSpan], fate: str) -> None:
    """Another worker's span of this trace that raised after the victim was hit (its
    collective with the victim broke) failed because of the fault, not on its own."""
    for member in members:
        if (member.process.role == "worker" and member.process.pid != fault.pid
                and member.status == "ERROR" and member.end_ns is not None
                and member.end_ns >= fault.time_ns):
            member.consequence = (f"{error_type(member)} because {fate.split(',')[0]}: "
                                  "a consequence of the fault, not a failure of its own")


def victim_fate(fault: FaultInfo, rpc: RecordedSpan, members: list[RecordedSpan]) -> str:
    """What happened to the process the fault hit, as it bears on this RPC."""
    mode = fault.span.attributes.get("chaos.mode")
    verb = _FATES.get(fault.signal or "", ("", f"hit by {fault.kind}"
                                           + (f" ({mode})" if mode else "")))[1]
    return f"{fault_target(fault)} {verb} {when(fault.time_ns, rpc)}, {_doing(fault, rpc, members)}"


def fault_target(fault: FaultInfo) -> str:
    """Who or what the fault hit, in words: a worker, the driver, a node, a queue.  A queue's
    fault names the rank that reads it; its pid is the process that damaged it (a writer)."""
    pid = f" (pid {fault.pid})" if fault.pid is not None else ""
    if fault.kind == "kill_driver":
        return f"the driver{pid}"
    if fault.kind == "kill_node":
        node = fault.span.attributes.get("chaos.node")
        return f"node {node} (every process on it)" if node is not None else \
            f"the node of worker rank {fault.rank}" if fault.rank is not None else "a node"
    if fault.kind == "corrupt_queue":
        reader = f" read by worker rank {fault.rank}" if fault.rank is not None else ""
        writer = f" (written by pid {fault.pid})" if fault.pid is not None else ""
        return f"the queue{reader}{writer}"
    return f"worker rank {fault.rank}{pid}" if fault.rank is not None \
        else f"pid {fault.pid}" if fault.pid is not None else "the executor"


def _doing(fault: FaultInfo, rpc: RecordedSpan, members: list[RecordedSpan]) -> str:
    """Where the victim was in this call when the fault came.  "In flight" only when the
    fault came while the RPC was open (from its start on: a fault before it began is not);
    a fault on no one process (a queue, a node) is placed by its time alone."""
    timed = "before this call began" if fault.time_ns < rpc.start_ns \
        else "while this call was in flight"
    if fault.pid is None or fault.kind in _NO_VICTIM_PROCESS:
        return timed
    if fault.pid == rpc.process.pid:  # the caller itself: the driver's death
        return "while it waited on this call, which never returned" if rpc.truncated else timed
    own = [m for m in members if m.process.pid == fault.pid]
    cut = next((m for m in own if m.truncated), None)
    if cut is not None:
        return f"inside {cut.name}"
    if own and all(m.end_ns is not None and m.end_ns <= fault.time_ns for m in own):
        return "after its part of this call had ended"
    if not own:
        return "before it took this call (so it has no other span here)"
    if all(m.start_ns >= fault.time_ns for m in own):
        return "before its part of this call began"
    return timed


def _summary(fault: FaultInfo, rpc: RecordedSpan, restart: RecordedSpan | None,
             fate: str) -> str:
    text = fate
    detection = fault.detection
    if detection is not None:
        text += (f"; detected {ms(detection.time_ns - fault.time_ns):.2f} ms after the fault "
                 f"({detection.by})")
    if restart is not None:
        text += f"; restart began {ms(restart.start_ns - fault.time_ns):.2f} ms after the fault"
    return text


def _derived_id(rpc: RecordedSpan, fault: FaultInfo, salt: int) -> int:
    z = (rpc.span_id ^ (fault.span.span_id * 0x9E3779B97F4A7C15) ^ salt) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) or 1


def _child(rpc: RecordedSpan, fault: FaultInfo, name: str, process: ProcessInfo,
           attrs: dict[str, Any], salt: int) -> RecordedSpan:
    return RecordedSpan(
        name=name, trace_id=rpc.trace_id, span_id=_derived_id(rpc, fault, salt),
        parent_span_id=rpc.span_id, start_ns=rpc.start_ns, tid=0, process=process,
        end_ns=rpc.start_ns, point=True, attributes=dict(attrs),
        parent_remote=process != rpc.process)


def _victim_span(rpc: RecordedSpan, fault: FaultInfo, victim: ProcessInfo, fate: str,
                 attrs: dict[str, Any]) -> RecordedSpan:
    """The victim's row in the RPC's trace: ``worker.killed [rank 1]`` (``driver.killed``
    for the driver), an error."""
    verb = _FATES.get(fault.signal or "", (fault.kind, ""))[0]
    span = _child(rpc, fault, f"{victim.role}.{verb}", victim, {**attrs, "faultlab.fate": fate},
                  1)
    span.status, span.status_message = "ERROR", fate
    return span


def _fault_span(rpc: RecordedSpan, fault: FaultInfo, attrs: dict[str, Any]) -> RecordedSpan:
    """A fault with no victim process (queue damage, ...): a child where it acted."""
    return _child(rpc, fault, f"{FAULT} {fault.kind}", fault.span.process, attrs, 2)


def failed_rpcs(spans: list[RecordedSpan]) -> list[RecordedSpan]:
    """The failed RPC spans of a told run, in time order: the traces to look up."""
    return sorted((s for s in spans if s.kind == "client" and s.failed),
                  key=lambda s: s.start_ns)
