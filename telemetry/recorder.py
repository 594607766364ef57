"""The hot-path recorder: spans as fixed-size journal records, one journal per process.

Data flow::

    executor ── rec.start_span/end/add_event ──► Recorder ──► JournalWriter (mmap, this pid)
       │                                            │
       └─ RPC span ids ─► request frame header ─► worker: serve(header fields)
                                                    │
                         owner process only:  LiveExporter thread reads every journal
                                              of the run dir and exports through OTLP

Invariants:

- One ``Recorder`` object per process, forever: after ``fork`` the child keeps the same
  object but drops the parent's journal mappings (``_after_fork_in_child``) and opens its
  own journal on first use, so a child never writes into its parent's file even when code
  cached ``get_recorder()`` before forking.
- A span that is not sampled writes nothing, yet has a valid context, so the not-sampled
  flag travels to the workers and their spans are not sampled either.
- Only a process configured with role "driver" (explicitly, or by default when it is not a
  child of a traced process) runs live export; it exports the journals that appeared in the
  run directory since it was configured.
- At interpreter exit the journal is closed and live export flushed after every executor
  made in this process has shut down (a ``weakref.finalize`` hook, not an atexit one).
- When tracing is off, ``enabled`` is False and ``start_span`` returns a span that records
  nothing; the executor checks ``enabled`` first, so off costs one attribute read.
- A journal that cannot grow (no space, no fd, any OSError) never raises into the caller
  and never faults: it warns once and calls ``_journal_stopped``, which drops the writer,
  so every later span is a no-op whose not-sampled context still travels.
"""

from __future__ import annotations

import _thread
import itertools
import json
import os
import random
import shutil
import socket
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from telemetry import journal as j
from telemetry.config import OWNER_ENV, TMPDIR_ENV, Settings
from telemetry.rpc_trace import RpcTrace
from telemetry.span import (
    FLAG_SAMPLED,
    NonRecordingSpan,
    Span,
    SpanContext,
    root_sampling,
)

_S = TypeVar("_S", bound=Span)

_M64 = (1 << 64) - 1
_pack_start = j.SPAN_START_S.pack_into
_split = j.split_trace_id
_pack_times = j.PH_TIMES_S.pack_into
_pack_end = j.SPAN_END_S.pack_into
_pack_attr_int = j.ATTR_INT_S.pack_into
_pack_attr_float = j.ATTR_FLOAT_S.pack_into
_time_ns = time.time_ns
_TRACING_PREFIXES = ("OTEL_", "FAULTLAB_TRACE_")
# Record kinds and codes as plain globals: the hot path reads them without an attribute
# lookup.  Writing is JournalWriter.append, repeated inline on the per-RPC paths (journal).
_SPAN_START, _SPAN_END, _ATTRIBUTE = j.SPAN_START, j.SPAN_END, j.ATTRIBUTE
_PHASES, _PH_SERVED, _STATUS_OK, _STATUS_ERROR = j.PHASES, j.PH_SERVED, j.STATUS_OK, j.STATUS_ERROR
_OWNER_SPAN, _VT_STR, _VT_INT = j.OWNER_SPAN, j.VT_STR, j.VT_INT
_FLAG_RPC, _TID_BITS, _TID_LIMIT = j.FLAG_RPC, j.TID_BITS, 1 << j.TID_BITS
_RPC_LIMIT = j.RPC_ID_LIMIT
_SEGMENT_BITS, _SLOT_MASK, _HEADER_SIZE, _RECORD_SHIFT = (
    j.SEGMENT_BITS, j.SLOT_MASK, j.HEADER_SIZE, j.RECORD_SHIFT)
_JOURNAL_ERRORS = j.JOURNAL_ERRORS
_VT_BOOL, _VT_FLOAT = j.VT_BOOL, j.VT_FLOAT
_MIN_I64, _MAX_I64 = -(1 << 63), (1 << 63) - 1
_MAX_INTERNED = 50_000


class Recorder:
    """Writes spans of this process to its journal.  Get it with ``get_recorder()``."""

    def __init__(self) -> None:
        self.enabled = False
        self.role = "driver"
        self.rank: int | None = None
        self.settings = Settings.from_env()
        self.run_dir: Path | None = None
        self.journal_writer: j.JournalWriter | None = None
        self._strings: dict[str, int] = {}
        # Per thread: its native id, once its THREAD record is in this journal.  Thread-local,
        # not a dict keyed by ident: idents are reused as soon as a thread exits.
        self._thread_local = _thread._local()
        self._string_ids = itertools.count(1)  # 0 means "no string"
        self._event_seq = itertools.count(1)
        self._rng = random.Random()
        self._bits = self._rng.getrandbits
        self._parent_based = True
        self._root_bound = 1 << 64  # sample a root iff trace_id & _M64 < _root_bound
        self._owned_tmpdir: str | None = None
        self._exporter: Any = None  # telemetry.live.LiveExporter, owner process only
        self._pid = os.getpid()
        self._open_on_use = False  # a forked child opens its journal on its first span
        self._lock = threading.RLock()

    # ------------------------------------------------------------ hot path

    def start_span(
        self, name: str, parent: SpanContext | None = None,
        attributes: Mapping[str, Any] | None = None, start_ns: int | None = None,
    ) -> Span | NonRecordingSpan:
        """Start a span now, or at ``start_ns`` (``time.time_ns()``) for one recorded after
        the fact, off a latency-critical path."""
        span = self._start(Span, name, parent, start_ns)
        if attributes and type(span) is Span:
            self.write_attributes(_OWNER_SPAN, span.span_id, attributes)
        return span

    def begin_rpc(
        self, name: str, parent: SpanContext | None, rpc_id: int,
    ) -> RpcTrace | None:
        """An RPC's span in the driver: its start record now (carrying ``rpc_id``, known
        even if the call never ends), before the request is sent; the trace the executor
        fills (``telemetry.rpc_trace``), or None when the RPC is not recorded (not sampled,
        or the journal is gone: no context is sent then).  The common case is flat."""
        if parent is None:
            trace_id, parent_id = self._bits(128) or 1, 0
            sampled = (trace_id & _M64) < self._root_bound
        else:
            trace_id, parent_id = parent.trace_id, parent.span_id
            sampled = parent.sampled if self._parent_based else (trace_id & _M64) < self._root_bound
        if not sampled:
            return None
        writer = self.journal_writer
        if writer is not None and 0 <= rpc_id < _RPC_LIMIT:
            tid = self._thread_local.__dict__.get("tid")
            name_id = self._strings.get(name)
            if tid is not None and name_id is not None and tid < _TID_LIMIT:
                span_id = self._bits(64) or 1
                try:  # JournalWriter.append's steps, inline (see the module docstring)
                    idx = next(writer.slots)
                    seg = idx >> _SEGMENT_BITS
                    maps = writer.maps
                    mm = maps[seg] if seg < len(maps) else writer.open_segment(seg)
                    off = _HEADER_SIZE + ((idx & _SLOT_MASK) << _RECORD_SHIFT)
                    hi, lo = _split(trace_id)
                    _pack_start(mm, off + 1, _FLAG_RPC, 0, name_id, hi, lo, span_id,
                                parent_id, _time_ns(), rpc_id << _TID_BITS | tid)
                    mm[off] = _SPAN_START
                except _JOURNAL_ERRORS:
                    return None
                return RpcTrace((trace_id, span_id))
        span = self._start_ids(Span, name, trace_id, parent_id, True, None, rpc_id)
        return RpcTrace((trace_id, span.span_id)) if type(span) is Span else None

    def serve(
        self, name: str, trace_hi: int, trace_lo: int, parent_id: int, flags: int,
        start_ns: int,
    ) -> int:
        """A worker's execute span, child of the driver's RPC span, from the request header's
        fields as they are (``serialization.TRACE_HEADER``): its start record, at
        ``start_ns``; its span id for ``served``, or 0 when it is not recorded.  The worker
        calls this on every traced RPC: the common case is flat (``rpc_trace``)."""
        writer = self.journal_writer
        sampled = flags & FLAG_SAMPLED if self._parent_based else trace_lo < self._root_bound
        if not sampled:
            return 0
        if writer is not None:
            tid = self._thread_local.__dict__.get("tid")
            name_id = self._strings.get(name)
            if tid is not None and name_id is not None:
                span_id = self._bits(64) or 1
                try:  # JournalWriter.append's steps, inline
                    idx = next(writer.slots)
                    seg = idx >> _SEGMENT_BITS
                    maps = writer.maps
                    mm = maps[seg] if seg < len(maps) else writer.open_segment(seg)
                    off = _HEADER_SIZE + ((idx & _SLOT_MASK) << _RECORD_SHIFT)
                    _pack_start(mm, off + 1, 0, 0, name_id, trace_hi, trace_lo, span_id,
                                parent_id, start_ns, tid)
                    mm[off] = _SPAN_START
                except _JOURNAL_ERRORS:
                    return 0
                return span_id
        span = self._start_ids(Span, name, j.join_trace_id(trace_hi, trace_lo), parent_id, True,
                               start_ns)
        return span.span_id if type(span) is Span else 0

    def served(
        self, span_id: int, waited_ns: int, got_ns: int, start_ns: int, executed_ns: int,
        reply_ns: int, error: tuple[str, str, str] | None = None,
    ) -> None:
        """The worker's reply is out (``reply_ns``: when it began; 0: no reply was due): one
        PH_SERVED record ends execute span ``span_id`` at ``executed_ns`` and carries its
        dequeue and reply times.  ``error``: (type name, message, traceback text) of what
        the method raised (the executor's ``RemoteError``)."""
        done = _time_ns()
        writer = self.journal_writer
        if writer is None:
            return
        status, message_id = _STATUS_OK, 0
        try:
            if error is not None:
                status, message_id = _STATUS_ERROR, self._served_error(span_id, error)
            idx = next(writer.slots)  # JournalWriter.append's steps, inline
            seg = idx >> _SEGMENT_BITS
            maps = writer.maps
            mm = maps[seg] if seg < len(maps) else writer.open_segment(seg)
            off = _HEADER_SIZE + ((idx & _SLOT_MASK) << _RECORD_SHIFT)
            _pack_times(mm, off + 1, status, _PH_SERVED, message_id, span_id, waited_ns, got_ns,
                        start_ns, executed_ns, reply_ns, done)
            mm[off] = _PHASES
        except _JOURNAL_ERRORS:
            pass

    def _served_error(self, span_id: int, error: tuple[str, str, str]) -> int:
        """The ``exception`` event of a failed execution; the id of its status message."""
        type_name, message, stacktrace = error
        type_name = type_name.removeprefix("builtins.")  # as the driver's: ValueError
        self.write_event(span_id, "exception", {
            "exception.type": type_name, "exception.message": message,
            "exception.stacktrace": stacktrace[-4000:],
        })
        return self._intern(f"{type_name.rsplit('.', 1)[-1]}: {message}")

    def _start(
        self, cls: type[_S], name: str, parent: SpanContext | None, start_ns: int | None,
    ) -> _S | NonRecordingSpan:
        """Sample, and if sampled write the SPAN_START record of a ``cls`` span."""
        if parent is None:
            trace_id = self._bits(128) or 1
            return self._start_ids(cls, name, trace_id, 0, (trace_id & _M64) < self._root_bound,
                                   start_ns)
        trace_id = parent.trace_id
        sampled = parent.sampled if self._parent_based else (trace_id & _M64) < self._root_bound
        return self._start_ids(cls, name, trace_id, parent.span_id, sampled, start_ns)

    def _start_ids(
        self, cls: type[_S], name: str, trace_id: int, parent_id: int, sampled: bool,
        start_ns: int | None, rpc_id: int = -1,
    ) -> _S | NonRecordingSpan:
        """``_start`` once the trace, the parent (0: none) and sampling are decided; an
        ``rpc_id`` (not -1) shares the thread id's field (journal.FLAG_RPC)."""
        span_id = self._bits(64) or 1
        if not sampled:
            return NonRecordingSpan(trace_id, span_id)
        writer = self.journal_writer
        if writer is None and self._open_on_use:
            writer = self._open_after_fork()
        if writer is None:
            return NonRecordingSpan(trace_id, span_id)
        try:
            try:
                tid = self._thread_local.tid
            except AttributeError:  # this thread's first span in this journal
                tid = self._register_thread()
            name_id = self._strings.get(name) or self._intern(name)
            flags = 0
            if 0 <= rpc_id < _RPC_LIMIT and tid < _TID_LIMIT:
                flags, tid = _FLAG_RPC, rpc_id << _TID_BITS | tid
            writer.append(_pack_start, _SPAN_START, flags, 0, name_id, *_split(trace_id),
                          span_id, parent_id, _time_ns() if start_ns is None else start_ns, tid)
        except _JOURNAL_ERRORS:  # journal closed by shutdown()
            return NonRecordingSpan(trace_id, span_id)
        return cls(self, trace_id, span_id)

    def append(self, packer: Any, kind: int, *fields: Any) -> None:
        """Write one record (``JournalWriter.append``); nothing if the journal is gone."""
        writer = self.journal_writer
        if writer is not None:
            try:
                writer.append(packer, kind, *fields)
            except _JOURNAL_ERRORS:
                pass

    def event(
        self, name: str, attributes: Mapping[str, Any] | None = None,
        parent: SpanContext | None = None,
    ) -> SpanContext:
        """Record a point in time as its own zero-length span; return its context."""
        span = self.start_span(name, parent, attributes)
        if isinstance(span, Span):
            span.ended = True
            self.write_end(span.span_id, j.STATUS_UNSET, "", j.FLAG_POINT)
        return span.context

    def write_end(
        self, span_id: int, status: int, message: str, flags: int = 0, end_ns: int | None = None
    ) -> None:
        writer = self.journal_writer
        if writer is None:
            return
        try:
            message_id = self._intern(message) if message else 0
            writer.append(_pack_end, _SPAN_END, status, flags, message_id, span_id,
                          _time_ns() if end_ns is None else end_ns)
        except _JOURNAL_ERRORS:
            pass

    def _register_thread(self) -> int:
        """First span of this thread: record its native id and name, remember them."""
        tid = threading.get_native_id()
        name_id = self._intern(threading.current_thread().name)
        writer = self.journal_writer
        if writer is not None:
            writer.append(j.THREAD_S.pack_into, j.THREAD, 0, 0, name_id, tid)
        self._thread_local.tid = tid
        return tid

    def write_event(self, span_id: int, name: str, attributes: Mapping[str, Any] | None) -> None:
        writer = self.journal_writer
        if writer is None:
            return
        seq = next(self._event_seq)
        try:
            name_id = self._intern(name)
            writer.append(j.EVENT_S.pack_into, j.EVENT, 0, 0, name_id, span_id, _time_ns(), seq)
        except _JOURNAL_ERRORS:
            return
        if attributes:
            self.write_attributes(j.OWNER_EVENT, seq, attributes)

    def write_attribute(self, owner_kind: int, owner: int, key: str, value: Any) -> None:
        self.write_attributes(owner_kind, owner, {key: value})

    def write_attributes(
        self, owner_kind: int, owner: int, attributes: Mapping[str, Any],
    ) -> None:
        """One ATTRIBUTE record per item; str and int values take the inlined fast path."""
        writer = self.journal_writer
        if writer is None:
            return
        strings = self._strings
        try:
            for key, value in attributes.items():
                kid = strings.get(key) or self._intern(key)
                kind = type(value)
                packer = _pack_attr_int
                if kind is str:
                    vtype, raw = _VT_STR, strings.get(value) or self._intern(value)
                elif kind is int and _MIN_I64 <= value <= _MAX_I64:
                    vtype, raw = _VT_INT, value
                elif kind is bool:
                    vtype, raw = _VT_BOOL, value
                elif kind is float:
                    vtype, raw, packer = _VT_FLOAT, value, _pack_attr_float
                else:
                    vtype, raw, packer = self._encode_value(value)
                writer.append(packer, _ATTRIBUTE, vtype, owner_kind, kid, owner, raw)
        except _JOURNAL_ERRORS:
            pass

    def _encode_value(self, value: Any) -> tuple[int, Any, Any]:
        """Value type, packed value and packer for the less common attribute types."""
        if isinstance(value, bool):
            return j.VT_BOOL, int(value), _pack_attr_int
        if isinstance(value, float):
            return j.VT_FLOAT, float(value), _pack_attr_float
        if isinstance(value, int) and _MIN_I64 <= value <= _MAX_I64:
            return j.VT_INT, int(value), _pack_attr_int
        if isinstance(value, list | tuple):
            return j.VT_JSON, self._intern(json.dumps(list(value), default=str)), _pack_attr_int
        return j.VT_STR, self._intern(str(value)), _pack_attr_int

    def _intern(self, text: str) -> int:
        sid = self._strings.get(text)
        if sid is None:
            sid = self._write_string(text)
            if len(self._strings) < _MAX_INTERNED:
                self._strings[text] = sid
        return sid

    def _write_string(self, text: str) -> int:
        """Write a STRING record; raises ValueError if the journal was closed meanwhile."""
        writer = self.journal_writer
        if writer is None:
            raise ValueError("journal closed")
        sid = next(self._string_ids)
        data = text.encode("utf-8", "replace")[: j.MAX_STRING]
        for part, start in enumerate(range(0, max(len(data), 1), j.STRING_CHUNK)):
            chunk = data[start : start + j.STRING_CHUNK]
            writer.append(j.STRING_S.pack_into, j.STRING, 0, part, sid, len(data), chunk)
        return sid

    # ------------------------------------------------------------ life cycle

    def configure(self, role: str, rank: int | None) -> None:
        with self._lock:
            self._open_on_use = False
            self._close_journal()
            self.role, self.rank = role, rank
            self.settings = Settings.from_env()
            self._reset_state()
            self.enabled = self.settings.enabled
            if self.enabled:
                self._open_journal()
            if self.enabled and role == "driver" and self.settings.exporter != "none":
                self._start_live_export()

    def _reset_state(self) -> None:
        self._pid = os.getpid()
        self._rng.seed(int.from_bytes(os.urandom(16), "little") ^ self._pid)
        self._strings = {}
        self._thread_local = _thread._local()
        self._string_ids = itertools.count(1)  # 0 means "no string"
        self._event_seq = itertools.count(1)
        self._parent_based, self._root_bound = root_sampling(
            self.settings.sampler, self.settings.sampler_ratio)

    def _open_journal(self) -> None:
        run_dir = self._journal_dir()
        if self.role == "driver":
            os.environ[OWNER_ENV] = str(self._pid)  # children inherit: "my driver exports me"
        header = j.JournalHeader(
            pid=self._pid, rank=self.rank, role=self.role, service=self.settings.service_name,
            created_ns=time.time_ns(), incarnation=self._rng.getrandbits(64),
            owner_pid=_owner_pid(), host=socket.gethostname(),
        )
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            self.journal_writer = j.JournalWriter(run_dir, header, on_stop=self._journal_stopped)
        except j.JournalStopped:  # no room for even one segment; the journal warned
            self.enabled = False
            return
        except OSError as exc:
            import logging

            logging.getLogger(__name__).warning("tracing off: cannot open journal: %s", exc)
            self.enabled = False
            return
        self.run_dir = run_dir

    def _journal_stopped(self, writer: j.JournalWriter) -> None:
        """The journal could not grow: from now on every span is a no-op.

        ``enabled`` stays True, so the spans' contexts still travel, not sampled, and the
        workers record nothing for them either."""
        if self.journal_writer is writer:
            self.journal_writer = None

    def _journal_dir(self) -> Path:
        if self.settings.trace_dir:
            return Path(self.settings.trace_dir)
        inherited = os.environ.get(TMPDIR_ENV)
        if inherited and self.role != "driver" and os.path.isdir(inherited):
            return Path(inherited)
        if self._owned_tmpdir is None:
            self._owned_tmpdir = tempfile.mkdtemp(prefix="faultlab-trace-")
            os.environ[TMPDIR_ENV] = self._owned_tmpdir
        return Path(self._owned_tmpdir)

    def _start_live_export(self) -> None:
        from telemetry.live import LiveExporter

        assert self.run_dir is not None and self.journal_writer is not None
        self._exporter = LiveExporter(
            self.run_dir, self.settings, since_ns=self.journal_writer.header.created_ns)
        self._exporter.start()

    def _close_journal(self) -> None:
        """Flush export, close this process's journal, remove an owned temp dir."""
        exporter, self._exporter = self._exporter, None
        if exporter is not None:
            exporter.stop()
        writer, self.journal_writer = self.journal_writer, None
        if writer is not None:
            writer.close()
        tmp, self._owned_tmpdir = self._owned_tmpdir, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            if os.environ.get(TMPDIR_ENV) == tmp:
                del os.environ[TMPDIR_ENV]

    def shutdown(self) -> None:
        with self._lock:
            if self._pid != os.getpid():
                return
            self.enabled = False
            self._close_journal()

    def after_fork_in_child(self) -> None:
        """Forget the parent's journal, exporter and temp dir; they belong to the parent."""
        self._lock = threading.RLock()  # another thread may have held it at fork time
        writer, self.journal_writer = self.journal_writer, None
        if writer is not None:
            writer.abandon()
        self._exporter = None
        self._owned_tmpdir = None
        self.role, self.rank = "worker", None
        self._reset_state()  # new random ids: the child must not repeat the parent's
        # Keep tracing until configure_process names this process, but only open a journal
        # if a span comes first (most children call configure_process at once).
        self._open_on_use = self.enabled

    def _open_after_fork(self) -> j.JournalWriter | None:
        with self._lock:
            if self._open_on_use:
                self._open_on_use = False
                self._open_journal()
            return self.journal_writer


_RECORDER: Recorder | None = None
_CREATE_LOCK = threading.Lock()


def get_recorder() -> Recorder:
    """This process's recorder, configured from the environment on first call."""
    rec = _RECORDER
    return rec if rec is not None else _create(None, None)


def _create(role: str | None, rank: int | None) -> Recorder:
    global _RECORDER
    with _CREATE_LOCK:
        rec = _RECORDER
        if rec is None:
            rec = Recorder()
            _RECORDER = rec
            # At exit, finalizers run newest first, after every atexit hook registered later
            # and before every one registered earlier: executors (made after this recorder,
            # shut down by their own finalizers) stop first, so their last spans are flushed.
            weakref.finalize(rec, shutdown)
        elif role is None:
            return rec
        if role is None:  # first use without configure_process
            owner = os.environ.get(OWNER_ENV)
            role = "driver" if owner in (None, "", str(os.getpid())) else "worker"
        rec.configure(role, rank)
        return rec


def configure_process(
    role: str = "driver", rank: int | None = None, env: Mapping[str, str] | None = None,
) -> None:
    """Name this process (``driver``/``worker``/``chaos``) and open its own journal.

    Re-reads the environment, so calling it again after changing ``FAULTLAB_TRACE_DIR``
    starts a new journal there.  ``env``, when given, is the parent's ``tracing_env()``;
    it replaces this process's tracing variables first.  Pass it to forkserver children:
    they inherit the environment of the fork server, not of the parent that asked for them.
    """
    if env is not None:
        _apply_tracing_env(env)
    _create(role, rank)


def tracing_env() -> dict[str, str]:
    """This process's tracing variables (``OTEL_*``, ``FAULTLAB_TRACE_*``), for a child."""
    return {k: v for k, v in os.environ.items() if k.startswith(_TRACING_PREFIXES)}


def _apply_tracing_env(env: Mapping[str, str]) -> None:
    for name in [k for k in os.environ if k.startswith(_TRACING_PREFIXES)]:
        if name not in env:
            del os.environ[name]
    os.environ.update({k: v for k, v in env.items() if k.startswith(_TRACING_PREFIXES)})


def shutdown() -> None:
    """Flush live export and close this process's journal; safe to call twice."""
    rec = _RECORDER
    if rec is not None:
        rec.shutdown()


def _owner_pid() -> int:
    try:
        return int(os.environ.get(OWNER_ENV, "0"))
    except ValueError:
        return 0


def _after_fork_in_child() -> None:
    if _RECORDER is not None:
        _RECORDER.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
