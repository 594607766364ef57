"""Spans recorded after the fact, for a process faultlab watched but did not trace itself.

Data flow::

    an outside observer (chaos.targets.run_trace), or spans a target sent over OTLP
        ObservedJournal(run_dir, pid, role, rank, service)
          .span(name, start_ns, end_ns, parent, attributes, events, error)  ─┐
          .point(name, at_ns, parent, attributes)                            ├─► journal-*.bin
          .close()                                                           ─┘   (the same
                                                                                  format as
                                              read_run / stream / faultlab trace export ◄──┘
                                                                           a live process's)

One ``ObservedJournal`` is one journal incarnation: its header names the watched process
(pid, role, rank, service), so exports show each process as its own service row
(``telemetry.naming``), exactly as for a process that traced itself.

Invariants:

- A span's records are written whole, in one call: start, attributes, events, end.  Events
  and attributes attach only to an open span, so nothing is ever lost to ordering.
- Ids are the caller's when given (a target's own OTLP span ids survive), else random and
  non-zero; the trace id is the parent's, else the caller's, else random.
- Times are the caller's epoch nanoseconds; an event's time is clamped into its span.
- Nothing here is on a hot path: clarity over speed (one ``JournalWriter.append`` per
  record, strings interned per journal).
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from telemetry import journal as j
from telemetry.span import SpanContext

_MIN_I64, _MAX_I64 = -(1 << 63), (1 << 63) - 1
_STATUS = {"UNSET": j.STATUS_UNSET, "OK": j.STATUS_OK, "ERROR": j.STATUS_ERROR}
Event = tuple[str, int, Mapping[str, Any]]  # name, time_ns, attributes


class ObservedJournal:
    """A journal written on behalf of process ``pid`` (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, pid: int, role: str,
                 rank: int | None, service: str) -> None:
        self._rng = random.Random(int.from_bytes(os.urandom(16), "little"))
        header = j.JournalHeader(pid=pid, rank=rank, role=role, service=service,
                                 created_ns=time.time_ns(),
                                 incarnation=self._rng.getrandbits(64) or 1,
                                 host=socket.gethostname())
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self._writer = j.JournalWriter(Path(run_dir), header)
        self._strings: dict[str, int] = {}
        self._event_seq = 0

    def span(self, name: str, start_ns: int, end_ns: int | None,
             parent: SpanContext | None = None, attributes: Mapping[str, Any] | None = None,
             events: Iterable[Event] = (), error: str | None = None, *,
             status: str | None = None, trace_id: int | None = None,
             span_id: int | None = None) -> SpanContext:
        """A span from ``start_ns`` to ``end_ns`` (None: left open, read as truncated);
        status ERROR with message ``error`` when given, else ``status`` (default OK)."""
        if parent is not None:
            trace_id = parent.trace_id
        trace_id = trace_id or self._rng.getrandbits(128) or 1
        span_id = span_id or self._rng.getrandbits(64) or 1
        self._start(name, trace_id, span_id, 0 if parent is None else parent.span_id, start_ns)
        self._attributes(j.OWNER_SPAN, span_id, attributes or {})
        last = start_ns if end_ns is None else max(start_ns, end_ns)
        for event_name, at_ns, event_attrs in events:
            self._event(span_id, event_name, min(max(at_ns, start_ns), last), event_attrs)
        if end_ns is not None:
            code = j.STATUS_ERROR if error is not None else _STATUS[status or "OK"]
            self._end(span_id, code, error or "", 0, max(start_ns, end_ns))
        return SpanContext(trace_id, span_id, True)

    def point(self, name: str, at_ns: int, parent: SpanContext | None = None,
              attributes: Mapping[str, Any] | None = None,
              events: Iterable[Event] = ()) -> SpanContext:
        """A zero-length span, like ``Recorder.event``: a moment (a fault, an exit)."""
        ctx = self.span(name, at_ns, None, parent, attributes, events)
        self._end(ctx.span_id, j.STATUS_UNSET, "", j.FLAG_POINT, at_ns)
        return ctx

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> ObservedJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ records

    def _start(self, name: str, trace_id: int, span_id: int, parent_id: int, at_ns: int) -> None:
        self._writer.append(j.SPAN_START_S.pack_into, j.SPAN_START, 0, 0, self._intern(name),
                            *j.split_trace_id(trace_id), span_id, parent_id, at_ns, 0)

    def _end(self, span_id: int, status: int, message: str, flags: int, at_ns: int) -> None:
        message_id = self._intern(message) if message else 0
        self._writer.append(j.SPAN_END_S.pack_into, j.SPAN_END, status, flags, message_id,
                            span_id, at_ns)

    def _event(self, span_id: int, name: str, at_ns: int, attributes: Mapping[str, Any]) -> None:
        self._event_seq += 1
        self._writer.append(j.EVENT_S.pack_into, j.EVENT, 0, 0, self._intern(name), span_id,
                            at_ns, self._event_seq)
        self._attributes(j.OWNER_EVENT, self._event_seq, attributes)

    def _attributes(self, owner_kind: int, owner: int, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            if value is None:
                continue
            vtype, raw = self._encode(value)
            packer = j.ATTR_FLOAT_S if vtype == j.VT_FLOAT else j.ATTR_INT_S
            self._writer.append(packer.pack_into, j.ATTRIBUTE, vtype, owner_kind,
                                self._intern(key), owner, raw)

    def _encode(self, value: Any) -> tuple[int, Any]:
        if isinstance(value, bool):
            return j.VT_BOOL, int(value)
        if isinstance(value, int) and _MIN_I64 <= value <= _MAX_I64:
            return j.VT_INT, value
        if isinstance(value, float):
            return j.VT_FLOAT, value
        if isinstance(value, str):
            return j.VT_STR, self._intern(value)
        return j.VT_JSON, self._intern(json.dumps(value, default=str))

    def _intern(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is not None:
            return sid
        sid = self._strings[text] = len(self._strings) + 1  # 0 means "no string"
        data = text.encode("utf-8", "replace")[: j.MAX_STRING]
        for part, start in enumerate(range(0, max(len(data), 1), j.STRING_CHUNK)):
            self._writer.append(j.STRING_S.pack_into, j.STRING, 0, part, sid, len(data),
                                data[start : start + j.STRING_CHUNK])
        return sid
