"""Turn journal records back into spans: offline (``read_run``) or incrementally (live export).

Data flow::

    journal-*.bin ──► JournalTail.poll() (pread) ──► JournalDecoder.feed(record)
                                                                 │
                      RecordedSpan (ended)  ◄── pop_finished() ──┤
                      RecordedSpan (open, truncated) ◄── open_spans()

Invariants:

- Records are decoded in slot order.  While the writing process is alive, a tail stops
  at the first uncommitted slot (another thread may still fill it); once the process is
  gone (or on the final pass) every committed slot is decoded and holes are skipped.
- A span is finished exactly once, when its end record is decoded; spans still open
  when a journal is read for the last time are reported with ``end_ns = None``.
- PHASES records (``telemetry.span``: one per RPC phase group) expand into the spans they
  stand for, finished at once, with ids derived from the RPC (or execute) span's id, so
  reading a run twice gives the same ids.  A ``PH_SERVED`` record is the execute span's end,
  a ``PH_DONE`` or ``PH_CALL`` one the RPC span's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from telemetry import journal as j
from telemetry.span import ENQUEUE, QUEUE_WAIT, REPLY_ENQUEUE, WORKER_DEQUEUE, dequeue_name

_STATUS = {j.STATUS_UNSET: "UNSET", j.STATUS_OK: "OK", j.STATUS_ERROR: "ERROR"}
_READ_CHUNK_SLOTS = 4096
_M64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    pid: int
    rank: int | None
    role: str
    service: str
    incarnation: int
    created_ns: int
    host: str = ""

    @classmethod
    def from_header(cls, h: j.JournalHeader) -> ProcessInfo:
        return cls(h.pid, h.rank, h.role, h.service, h.incarnation, h.created_ns, h.host)


@dataclasses.dataclass
class RecordedEvent:
    name: str
    time_ns: int
    span_id: int
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RecordedLink:
    """A link to a span of another (or the same) trace, e.g. an RPC's fault and detection."""

    trace_id: int
    span_id: int
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RecordedSpan:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int  # 0: a root span
    start_ns: int
    tid: int
    process: ProcessInfo
    end_ns: int | None = None
    status: str = "UNSET"
    status_message: str = ""
    point: bool = False  # a zero-length span from Recorder.event()
    thread_name: str = ""
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    events: list[RecordedEvent] = dataclasses.field(default_factory=list)
    last_seen_ns: int = 0  # the journal's last timestamp when this span was reported
    # Filled in by ``telemetry.story`` when the run is told (loaded or exported):
    links: list[RecordedLink] = dataclasses.field(default_factory=list)
    kind: str = "internal"  # client / server / producer / consumer / internal
    parent_remote: bool = False  # the parent span was recorded by another process
    death_ns: int | None = None  # a truncated span: the best-known moment its process died
    truncated_reason: str = ""
    # Truncated by the executor's own orderly stop (a survivor shut down after a failure),
    # not by a failure of its own: exports do not mark it as an error.
    stopped: bool = False
    # Raised only because another process was hit by a fault (a survivor whose collective
    # broke when its peer was killed): the reason, shown instead of an error in exports.
    consequence: str = ""
    # Spans that exist only in the told story (``telemetry.failure_marks``: the victim's row
    # in a failed RPC's trace), exported right after this span; never in ``load_run``'s rows.
    story_spans: list[RecordedSpan] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        """What exports show as an error: an ERROR status, or cut short by a failure."""
        if self.consequence:
            return False
        return self.status == "ERROR" or (self.truncated and not self.stopped)

    @property
    def truncated(self) -> bool:
        return self.end_ns is None

    @property
    def shown_end_ns(self) -> int:
        """Where the span's bar ends: its end, else its process's death, else last record."""
        if self.end_ns is not None:
            return self.end_ns
        if self.death_ns is not None:
            return max(self.death_ns, self.start_ns)
        return max(self.last_seen_ns, self.start_ns)


class JournalDecoder:
    """Decodes one process incarnation's records, in slot order, into spans."""

    def __init__(self, process: ProcessInfo) -> None:
        self.process = process
        self.strings: dict[int, str] = {}
        self._string_parts: dict[int, list[bytes]] = {}
        self.threads: dict[int, str] = {}
        self._open: dict[int, RecordedSpan] = {}
        self._events: dict[int, RecordedEvent] = {}  # event seq -> event, for its attributes
        self._finished: list[RecordedSpan] = []
        self.last_time_ns = process.created_ns

    def feed(self, raw: bytes) -> None:
        kind = raw[0]
        if kind == j.SPAN_START:
            self._on_start(raw)
        elif kind == j.SPAN_END:
            self._on_end(raw)
        elif kind == j.ATTRIBUTE:
            self._on_attribute(raw)
        elif kind == j.EVENT:
            self._on_event(raw)
        elif kind == j.STRING:
            self._on_string(raw)
        elif kind == j.THREAD:
            _, _, name_id, tid = j.THREAD_S.unpack_from(raw, 1)
            self.threads[tid] = self.string(name_id)
        elif kind == j.PHASES:
            self._on_phases(raw)

    def string(self, sid: int) -> str:
        return self.strings.get(sid, f"<string {sid}>") if sid else ""

    def _on_start(self, raw: bytes) -> None:
        flags, _, name_id, hi, lo, span_id, parent, start, tid = j.SPAN_START_S.unpack_from(raw, 1)
        self.last_time_ns = max(self.last_time_ns, start)
        rpc_id = None
        if flags & j.FLAG_RPC:
            rpc_id, tid = tid >> j.TID_BITS, tid & ((1 << j.TID_BITS) - 1)
        span = self._open[span_id] = RecordedSpan(
            name=self.string(name_id), trace_id=j.join_trace_id(hi, lo), span_id=span_id,
            parent_span_id=parent, start_ns=start, tid=tid, process=self.process,
            thread_name=self.threads.get(tid, ""),
            # A parent in this process is still open when its child starts (spans nest).
            parent_remote=bool(parent) and parent not in self._open,
        )
        if rpc_id is not None:
            _rpc_attributes(span, 0, rpc_id, None)

    def _on_end(self, raw: bytes) -> None:
        status, flags, message_id, span_id, end = j.SPAN_END_S.unpack_from(raw, 1)
        self.last_time_ns = max(self.last_time_ns, end)
        span = self._open.pop(span_id, None)
        if span is None:
            return  # its start was torn by a kill; nothing to attach the end to
        span.end_ns, span.status = end, _STATUS.get(status, "UNSET")
        span.status_message = self.string(message_id)
        span.point = bool(flags & j.FLAG_POINT)
        span.last_seen_ns = self.last_time_ns
        self._finished.append(span)

    def _on_attribute(self, raw: bytes) -> None:
        vtype = raw[1]
        packer = j.ATTR_FLOAT_S if vtype == j.VT_FLOAT else j.ATTR_INT_S
        _, owner_kind, key_id, owner, value = packer.unpack_from(raw, 1)
        decoded = self._decode_value(vtype, value)
        if owner_kind == j.OWNER_EVENT:
            event = self._events.get(owner)
            if event is not None:
                event.attributes[self.string(key_id)] = decoded
            return
        span = self._open.get(owner)
        if span is not None:
            span.attributes[self.string(key_id)] = decoded

    def _decode_value(self, vtype: int, value: Any) -> Any:
        if vtype == j.VT_STR:
            return self.string(value)
        if vtype == j.VT_BOOL:
            return bool(value)
        if vtype == j.VT_JSON:
            try:
                return json.loads(self.string(value) or "null")
            except ValueError:
                return self.string(value)  # a torn or foreign record: keep the raw text
        return value

    def _on_event(self, raw: bytes) -> None:
        _, _, name_id, span_id, time_ns, seq = j.EVENT_S.unpack_from(raw, 1)
        self.last_time_ns = max(self.last_time_ns, time_ns)
        event = RecordedEvent(self.string(name_id), time_ns, span_id)
        self._events[seq] = event
        span = self._open.get(span_id)
        if span is not None:
            span.events.append(event)

    def _on_string(self, raw: bytes) -> None:
        _, part, sid, total, chunk = j.STRING_S.unpack_from(raw, 1)
        parts = self._string_parts.setdefault(sid, [])
        if part != len(parts):
            return  # a torn string; uses of it will show "<string N>"
        parts.append(chunk)
        if len(parts) * j.STRING_CHUNK >= total:
            data = b"".join(parts)[:total]
            self.strings[sid] = data.decode("utf-8", "replace")
            del self._string_parts[sid]

    def _on_phases(self, raw: bytes) -> None:
        layout = int.from_bytes(raw[2:4], "little")
        if layout == j.PH_SENT:
            self._on_sent(raw)
        elif layout in (j.PH_DEQUEUED, j.PH_DONE):
            self._on_dequeued(raw, layout == j.PH_DONE)
        elif layout == j.PH_SERVED:
            self._on_served(raw)
        elif layout == j.PH_CALL:
            self._on_call(raw)

    def _on_sent(self, raw: bytes) -> None:
        """The driver sent the request: the enqueue span, the RPC span's attributes."""
        flags, _, _, span_id, start, end, rpc_id, size, timeout, reply_rank = \
            j.PH_SENT_S.unpack_from(raw, 1)
        span = self._open.get(span_id)
        if span is None:
            return
        attrs = _rpc_attributes(span, flags, rpc_id, size)
        if flags & j.PH_TIMEOUT:
            attrs["faultlab.timeout_s"] = timeout
        if flags & j.PH_REPLY_RANK:
            attrs["faultlab.reply_rank"] = reply_rank
        self._child(span, ENQUEUE, 1, start, end)

    def _on_call(self, raw: bytes) -> None:
        """A plain successful call to ranks 0 and 1 in one record: enqueue and dequeue
        spans, attributes, and the RPC span's end (its last reply read)."""
        flags, _, size, span_id, start, sent, s0, e0, s1, e1 = j.PH_TIMES_S.unpack_from(raw, 1)
        span = self._open.pop(span_id, None)
        if span is None:
            return
        _rpc_attributes(span, flags, span.attributes.get("faultlab.rpc_id", 0), size)
        self._child(span, ENQUEUE, 1, start, sent)
        self._child(span, dequeue_name(0), 2, s0, e0)
        self._child(span, dequeue_name(1), 3, s1, e1)
        span.end_ns, span.status = max(sent, e0, e1), "OK"
        self.last_time_ns = max(self.last_time_ns, span.end_ns)
        span.last_seen_ns = self.last_time_ns
        self._finished.append(span)

    def _on_dequeued(self, raw: bytes, done: bool) -> None:
        """The driver read replies: a dequeue span per rank; ``PH_DONE`` also ends the RPC
        span, at the latest of its times (the last reply read)."""
        status, _, base, span_id, *times = j.PH_TIMES_S.unpack_from(raw, 1)
        span = self._open.pop(span_id, None) if done else self._open.get(span_id)
        if span is None:
            return
        for i in range(j.PH_DEQUEUE_RANKS):
            start, end = times[2 * i], times[2 * i + 1]
            if start:
                self._child(span, dequeue_name(base + i), 2 + base + i, start, end)
        if done:
            span.end_ns, span.status = max(times), _STATUS.get(status, "UNSET")
            self.last_time_ns = max(self.last_time_ns, span.end_ns)
            span.last_seen_ns = self.last_time_ns
            self._finished.append(span)

    def _on_served(self, raw: bytes) -> None:
        """A worker's reply is out: end its execute span; its dequeue and reply spans."""
        status, _, message_id, span_id, waited, got, unpickled, executed, reply, done = \
            j.PH_TIMES_S.unpack_from(raw, 1)
        self.last_time_ns = max(self.last_time_ns, done)
        span = self._open.pop(span_id, None)
        if span is None:
            return
        span.end_ns, span.status = executed, _STATUS.get(status, "UNSET")
        span.status_message = self.string(message_id)
        span.last_seen_ns = self.last_time_ns
        self._finished.append(span)
        self._child(span, WORKER_DEQUEUE, 1, got, unpickled, {QUEUE_WAIT: got - waited},
                    sibling=True)
        if reply:
            self._child(span, REPLY_ENQUEUE, 2, reply, done, sibling=True)

    def _child(
        self, span: RecordedSpan, name: str, k: int, start: int, end: int,
        attributes: dict[str, Any] | None = None, sibling: bool = False,
    ) -> None:
        """A finished span expanded from a PHASES record of ``span``: its child, or with
        ``sibling`` a child of its parent; the ``k``-th derived id."""
        self.last_time_ns = max(self.last_time_ns, end)
        self._finished.append(RecordedSpan(
            name=name, trace_id=span.trace_id, span_id=derived_span_id(span.span_id, k),
            parent_span_id=span.parent_span_id if sibling else span.span_id,
            start_ns=start, tid=span.tid, process=self.process, end_ns=end, status="OK",
            thread_name=span.thread_name, attributes=attributes or {},
            last_seen_ns=self.last_time_ns, parent_remote=span.parent_remote and sibling,
        ))

    def pop_finished(self) -> list[RecordedSpan]:
        finished, self._finished = self._finished, []
        return finished

    def open_spans(self) -> list[RecordedSpan]:
        """Spans started and not (yet) ended, marked with the journal's last timestamp."""
        for span in self._open.values():
            span.last_seen_ns = self.last_time_ns
        return list(self._open.values())


class JournalTail:
    """Reads one journal's new records on each ``poll``; the live exporter keeps one per file."""

    def __init__(self, journal: j.JournalFile) -> None:
        self.journal = journal
        self.decoder = JournalDecoder(ProcessInfo.from_header(journal.header))
        self.next_slot = 0  # first slot not decoded yet
        self.done = False

    def poll(self, final: bool = False) -> None:
        """Decode new records; with ``final`` (or a dead writer) read past holes to the end."""
        if self.done:
            return
        final = final or not _alive(self.journal.header.pid)
        bits = self.journal.header.segment_bits  # the writer's, whatever this process uses
        while True:
            seg = self.next_slot >> bits
            path = j.segment_path(self.journal.segments[0].parent, self.journal.header, seg)
            if not path.exists():
                break
            if not self._read_segment(path, seg, final):
                break
            self.next_slot = (seg + 1) << bits
        self.done = final

    def _read_segment(self, path: Path, seg: int, final: bool) -> bool:
        """Decode from ``next_slot`` within one segment; True when the segment is done."""
        bits = self.journal.header.segment_bits
        slots = 1 << bits
        first = self.next_slot & (slots - 1)
        with open(path, "rb") as f:
            while first < slots:
                room = slots - first
                want = room if final else min(room, _READ_CHUNK_SLOTS)
                data = os.pread(f.fileno(), want * j.RECORD_SIZE, j.HEADER_SIZE + first * 64)
                got = len(data) // j.RECORD_SIZE  # a closed journal is trimmed: may be short
                kinds = np.frombuffer(data, np.uint8, count=got * j.RECORD_SIZE)[:: j.RECORD_SIZE]
                taken = self._decode_chunk(data, kinds, final)
                first += taken
                self.next_slot = (seg << bits) + first
                if got < want:
                    return final  # the file ends here
                if taken < got:
                    return False  # stopped at a slot another thread has not committed yet
        return True

    def _decode_chunk(self, data: bytes, kinds: np.ndarray, final: bool) -> int:
        """Decode committed records of a chunk; return how many slots were consumed."""
        if final:
            slots: Iterable[int] = np.flatnonzero(kinds).tolist()
            count = len(kinds)
        else:
            zeros = np.flatnonzero(kinds == 0)
            count = int(zeros[0]) if len(zeros) else len(kinds)
            slots = range(count)
        for slot in slots:
            self.decoder.feed(data[slot * j.RECORD_SIZE : (slot + 1) * j.RECORD_SIZE])
        return count


def _rpc_attributes(
    span: RecordedSpan, flags: int, rpc_id: int, size: int | None,
) -> dict[str, Any]:
    """The attributes a driver's RPC span gets from its start record (``size`` None) or
    its PHASES record; its dict."""
    attrs = span.attributes
    attrs.update({
        "rpc.system.name": "faultlab", "rpc.method": span.name.removeprefix("rpc "),
        "span.kind": "client", "faultlab.rpc_id": rpc_id,
    })
    if size is not None:
        attrs["faultlab.non_block"] = bool(flags & j.PH_NON_BLOCK)
        attrs["messaging.message.body.size"] = size
    return attrs


def derived_span_id(span_id: int, k: int) -> int:
    """A non-zero 64-bit id for the ``k``-th span expanded from ``span_id``'s records
    (splitmix64 of the pair: unrelated to the random ids, the same on every read)."""
    z = (span_id + k * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) or 1


def _alive(pid: int) -> bool:
    return pid == os.getpid() or psutil.pid_exists(pid)


def read_run(run_dir: str | os.PathLike[str]) -> list[RecordedSpan]:
    """Every span of every journal in ``run_dir``: ended ones, then the open (truncated) ones,
    told (``telemetry.story``: faults and detections in the affected traces, span kinds)."""
    from telemetry.story import tell

    spans: list[RecordedSpan] = []
    for tail in (JournalTail(jf) for jf in j.find_journals(Path(run_dir))):
        tail.poll(final=True)
        spans.extend(tail.decoder.pop_finished())
        spans.extend(tail.decoder.open_spans())
    return tell(spans)
