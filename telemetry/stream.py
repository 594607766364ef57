"""Read a run trace by trace, holding one trace at a time instead of the whole run.

Data flow::

    journal-*.bin ── pass 1, index (numpy over the fixed-size records; only STRING and
                     THREAD records are decoded, into each journal's tables) ──► RunIndex:
        every record's trace (a span's records through its start record; an event's
        attributes through their event), each trace's first start time, the output order
        (start µs, trace id), the traces that carry the failure story (faults, deaths,
        stops, restarts, error statuses) and each journal's running last timestamp
    story pass: decode those few traces, tell them together (telemetry.story) ──► Story
    pass 2, for each trace in order: read only its records (a small chunk cache per
        journal), decode them (a JournalDecoder per journal it touches, sharing that
        journal's tables), tell them with the Story ──► yield list[RecordedSpan]

Invariants:

- Each trace is exactly what ``assemble.read_run`` gives for it: the same spans, fields and
  story, in the same order (journals in ``find_journals`` order, each one's ended spans in
  record order, then its open ones).  ``last_seen_ns`` matches too: the decoder's clock is
  set before each record to the journal's running maximum over every record before it.
- A record whose span has no start record (torn by a kill) belongs to no trace and is
  dropped, as the whole-run decoder drops it.
- Memory: the index (24 bytes per record, numpy), one chunk cache per journal
  (``_CACHE_CHUNKS`` × 256 KiB), the story traces until their turn, and the trace being
  yielded; while indexing, numpy columns about the size of the journals on disk.
  ``RunStream.max_spans_held`` says how many spans it held at once.
- Every fact the story needs lives in a story trace: a fault, a death, a worker's
  death-pipe EOF, a restart (by span name), an RPC that failed (an ERROR status), so a
  trace told alone gets every event and link the whole run would give it.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from telemetry import journal as j
from telemetry.assemble import JournalDecoder, ProcessInfo, RecordedSpan
from telemetry.failure_marks import FAULT
from telemetry.story import DEATHS, RESTART, STOPPED, Story

STORY_NAMES = frozenset({FAULT, STOPPED, RESTART, *DEATHS})
_CHUNK_BITS = 12  # records read per pread in pass 2: 4096 slots, 256 KiB
_CACHE_CHUNKS = 8
_SCAN_SLOTS = 1 << 16  # records read at once by the index pass: 4 MiB
_NONE = np.iinfo(np.int64).max


class _Records:
    """One journal's records by slot: whole segments for the index, cached chunks after."""

    def __init__(self, journal: j.JournalFile) -> None:
        self.header = journal.header
        self.dir = journal.segments[0].parent
        self.bits = journal.header.segment_bits
        self.chunk_bits = min(_CHUNK_BITS, self.bits)
        self._cache: OrderedDict[int, bytes] = OrderedDict()

    def segments(self) -> Iterator[tuple[int, bytes]]:
        """(first slot, records) of each segment, in order, up to the first missing one,
        at most ``_SCAN_SLOTS`` at a time (a segment may be up to 1 GiB)."""
        seg, per_read = 0, min(_SCAN_SLOTS, 1 << self.bits)
        while True:
            for first in range(0, 1 << self.bits, per_read):
                data = self._read(seg, first, per_read)
                if data is None:
                    return
                yield (seg << self.bits) + first, data
                if len(data) < per_read * j.RECORD_SIZE:
                    break  # a trimmed (closed) segment ends here
            seg += 1

    def record(self, slot: int) -> bytes:
        chunk = slot >> self.chunk_bits
        data = self._cache.get(chunk)
        if data is None:
            first = chunk << self.chunk_bits
            data = self._read(first >> self.bits, first & ((1 << self.bits) - 1),
                              1 << self.chunk_bits) or b""
            self._cache[chunk] = data
            if len(self._cache) > _CACHE_CHUNKS:
                self._cache.popitem(last=False)
        offset = (slot & ((1 << self.chunk_bits) - 1)) * j.RECORD_SIZE
        return data[offset:offset + j.RECORD_SIZE]

    def _read(self, seg: int, first: int, count: int) -> bytes | None:
        path = j.segment_path(self.dir, self.header, seg)
        try:
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), count * j.RECORD_SIZE,
                                j.HEADER_SIZE + first * j.RECORD_SIZE)
        except FileNotFoundError:
            return None
        return data[: len(data) - len(data) % j.RECORD_SIZE]  # a trimmed file may end short


@dataclasses.dataclass
class _Columns:
    """Pass 1's view of one journal: numpy columns over its records, in slot order."""

    slots: np.ndarray  # slot of each record with a nonzero kind
    kinds: np.ndarray
    small: np.ndarray  # the layout of a PHASES record, the owner kind of an attribute
    owner: np.ndarray  # the span id a record belongs to (START: its own); 0: none
    event_seq: np.ndarray  # an event-owned attribute's event (else 0)
    time: np.ndarray  # what the record adds to the decoder's clock (0: nothing)
    first: np.ndarray  # a start time it shows (a span's or an expanded child's), else _NONE
    error: np.ndarray  # bool: an ERROR status
    hi: np.ndarray  # START records: the trace id's halves (else 0)
    lo: np.ndarray
    name_id: np.ndarray  # START records: the name's string id (else 0)


@dataclasses.dataclass
class JournalIndex:
    """What pass 2 needs of one journal: its tables and, per trace, its records."""

    process: ProcessInfo
    records: _Records
    strings: dict[int, str]
    threads: dict[int, str]
    last_ns: int  # the journal's last timestamp (the whole-run decoder's final clock)
    # numpy arrays (8 bytes an entry, no int objects):
    slots: np.ndarray  # the records' slots, grouped by trace in output order
    clocks: np.ndarray  # the decoder's clock before each of them
    bounds: np.ndarray  # trace k's records: slots[bounds[k]:bounds[k + 1]]

    def decode(self, k: int) -> list[RecordedSpan]:
        """The spans of the ``k``-th trace (in output order) in this journal."""
        a, b = self.bounds[k:k + 2].tolist()
        if a == b:
            return []
        decoder = JournalDecoder(self.process)
        decoder.strings, decoder.threads = self.strings, self.threads
        record = self.records.record
        for slot, clock in zip(self.slots[a:b].tolist(), self.clocks[a:b].tolist(), strict=True):
            if clock > decoder.last_time_ns:
                decoder.last_time_ns = clock
            decoder.feed(record(slot))
        spans = decoder.pop_finished()
        decoder.last_time_ns = max(decoder.last_time_ns, self.last_ns)
        spans.extend(decoder.open_spans())
        return spans


class RunStream:
    """A run directory indexed once; ``traces()`` yields its told traces one at a time."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.journals: list[JournalIndex] = []
        self.t0_ns = 0  # the run's first start time (0: no span)
        self.n_traces = 0
        self.story_traces: list[int] = []  # output positions of the story traces
        self.max_spans_held = 0
        self._index()

    @property
    def processes(self) -> list[ProcessInfo]:
        return [jx.process for jx in self.journals]

    # ------------------------------------------------------------ pass 1

    def _index(self) -> None:
        tables = []
        columns: list[_Columns] = []
        for journal in j.find_journals(self.run_dir):
            records = _Records(journal)
            process = ProcessInfo.from_header(journal.header)
            tables.append((process, records, JournalDecoder(process)))
            columns.append(_scan(records, tables[-1][2]))
        starts = [c.kinds == j.SPAN_START for c in columns]
        keys = np.concatenate([np.stack([c.hi[s], c.lo[s]], axis=1) for c, s in
                               zip(columns, starts, strict=True)] or [np.zeros((0, 2), np.uint64)])
        uniq, inverse = _unique_traces(keys)
        self.n_traces = len(uniq)
        first = np.full(self.n_traces, _NONE, np.int64)
        story = np.zeros(self.n_traces, bool)
        traces, offset = [], 0
        for (_, _, tables_decoder), c, s in zip(tables, columns, starts, strict=True):
            n = int(s.sum())
            trace = _trace_of_records(c, s, inverse[offset:offset + n])
            offset += n
            traces.append(trace)
            has = trace >= 0
            np.minimum.at(first, trace[has], c.first[has])
            names = [sid for sid, name in tables_decoder.strings.items() if name in STORY_NAMES]
            marks = has & (c.error | (s & np.isin(c.name_id, names)))
            story[trace[marks]] = True
        order = np.lexsort((uniq[:, 1], uniq[:, 0], first // 1000)) if self.n_traces else first
        position = np.empty(self.n_traces, np.int64)
        position[order] = np.arange(self.n_traces)
        self.story_traces = sorted(position[story].tolist())
        self.t0_ns = int(first.min()) if self.n_traces else 0
        for (process, records, decoder), c, trace in zip(tables, columns, traces, strict=True):
            self.journals.append(_journal_index(process, records, decoder, c, trace, position))

    # ------------------------------------------------------------ pass 2

    def traces(self, start: int = 0, stop: int | None = None) -> Iterator[list[RecordedSpan]]:
        """Each trace's spans, told, in order of (first start µs, trace id); only the
        ``start``-th to the one before ``stop`` when given (the story is the whole run's)."""
        stop = self.n_traces if stop is None else min(stop, self.n_traces)
        story = Story()
        for jx in self.journals:  # a victim's row needs its process, seen or not
            story.processes.setdefault(jx.process.pid, jx.process)
        held = {k: self._decode(k) for k in self.story_traces}
        story.tell([span for spans in held.values() for span in spans])
        held = {k: spans for k, spans in held.items() if start <= k < stop}
        waiting = sum(len(spans) for spans in held.values())
        for k in range(start, stop):
            spans = held.pop(k, None)
            if spans is None:
                spans = story.tell(self._decode(k))
            else:
                waiting -= len(spans)
            self.max_spans_held = max(self.max_spans_held, waiting + len(spans))
            yield spans

    def _decode(self, k: int) -> list[RecordedSpan]:
        spans: list[RecordedSpan] = []
        for jx in self.journals:
            spans.extend(jx.decode(k))
        return spans


def iter_traces(run_dir: str | os.PathLike[str]) -> Iterator[list[RecordedSpan]]:
    """The told spans of ``run_dir``, one trace at a time (see ``RunStream``)."""
    return RunStream(run_dir).traces()


def _scan(records: _Records, tables: JournalDecoder) -> _Columns:
    """Pass 1 over one journal: its columns; STRING and THREAD records fed to ``tables``."""
    parts = []
    for base, data in records.segments():
        parts.append(_scan_segment(base, data, tables))
    if not parts:
        return _scan_segment(0, b"", tables)
    return _Columns(*(np.concatenate([getattr(p, f.name) for p in parts])
                      for f in dataclasses.fields(_Columns)))


def _scan_segment(base: int, data: bytes, tables: JournalDecoder) -> _Columns:
    raw = np.frombuffer(data, np.uint8).reshape(-1, j.RECORD_SIZE)
    kinds_all = raw[:, 0]
    where = np.flatnonzero(kinds_all)
    rec = raw[where]
    kinds = rec[:, 0]
    for i in np.flatnonzero((kinds == j.STRING) | (kinds == j.THREAD)).tolist():
        tables.feed(rec[i].tobytes())
    u64 = rec.view("<u8")  # eight fields per record; field 0 holds the kind, flags, small, id
    small = rec[:, 2].astype(np.uint16) | (rec[:, 3].astype(np.uint16) << 8)
    flags = rec[:, 1]
    is_start, is_attr, is_event = kinds == j.SPAN_START, kinds == j.ATTRIBUTE, kinds == j.EVENT
    is_phases = kinds == j.PHASES
    owner = np.where(is_start, u64[:, 3], u64[:, 1])
    owner[(kinds == j.STRING) | (kinds == j.THREAD) | (kinds > j.PHASES)] = 0
    by_event = is_attr & (small == j.OWNER_EVENT)
    event_seq = np.where(by_event, u64[:, 1], np.where(is_event, u64[:, 3], 0))
    owner[by_event] = 0
    as_int = u64.view(np.int64)
    time = np.zeros(len(rec), np.int64)
    time[is_start] = as_int[is_start, 5]
    time[kinds == j.SPAN_END] = as_int[kinds == j.SPAN_END, 2]
    time[is_event] = as_int[is_event, 2]
    sent = is_phases & (small == j.PH_SENT)
    timed = is_phases & np.isin(small, (j.PH_DEQUEUED, j.PH_SERVED, j.PH_DONE, j.PH_CALL))
    time[sent] = as_int[sent, 3]
    time[timed] = as_int[timed, 2:8].max(axis=1)
    first = np.full(len(rec), _NONE, np.int64)
    first[is_start] = as_int[is_start, 5]
    enqueued = sent | (is_phases & (small == j.PH_CALL))
    first[enqueued] = as_int[enqueued, 2]
    served = is_phases & (small == j.PH_SERVED)
    first[served] = as_int[served, 3]
    error = (flags == j.STATUS_ERROR) & ((kinds == j.SPAN_END) | (
        is_phases & ((small == j.PH_DONE) | (small == j.PH_SERVED))))
    zero = np.zeros(len(rec), np.uint64)
    return _Columns(
        slots=where.astype(np.int64) + base, kinds=kinds.copy(), small=small, owner=owner,
        event_seq=event_seq, time=time, first=first, error=error,
        hi=np.where(is_start, u64[:, 1], zero), lo=np.where(is_start, u64[:, 2], zero),
        name_id=np.where(is_start, rec[:, 4:8].copy().view("<u4")[:, 0], 0).astype(np.uint32),
    )


def _trace_of_records(c: _Columns, is_start: np.ndarray, start_trace: np.ndarray) -> np.ndarray:
    """Each record's trace number (-1: none): a start record's own; another record's through
    its span's start record; an event's attribute's through its event."""
    span_ids = c.owner[is_start]
    order = np.argsort(span_ids, kind="stable")
    trace = _lookup(span_ids[order], start_trace[order], c.owner)
    trace[c.owner == 0] = -1
    trace[is_start] = start_trace
    is_event = c.kinds == j.EVENT
    by_event = (c.kinds == j.ATTRIBUTE) & (c.small == j.OWNER_EVENT)
    seqs = c.event_seq[is_event]
    seq_order = np.argsort(seqs, kind="stable")
    trace[by_event] = _lookup(seqs[seq_order], trace[is_event][seq_order], c.event_seq[by_event])
    return trace


def _unique_traces(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (hi, lo) rows of ``keys`` and each row's number among them.  Trace ids
    are random, so the low halves alone almost always tell traces apart: one 1-D unique,
    checked, instead of a much slower 2-D one."""
    lo_uniq, inverse = np.unique(keys[:, 1], return_inverse=True)
    inverse = inverse.reshape(-1)
    hi = np.zeros(len(lo_uniq), np.uint64)
    hi[inverse] = keys[:, 0]
    if np.array_equal(hi[inverse], keys[:, 0]):
        return np.stack([hi, lo_uniq], axis=1), inverse
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    return uniq, inverse.reshape(-1)


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``values`` of each of ``wanted`` in ``sorted_keys`` (-1 where absent)."""
    if len(sorted_keys) == 0:
        return np.full(len(wanted), -1, np.int64)
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == wanted, values[pos], -1).astype(np.int64)


def _journal_index(
    process: ProcessInfo, records: _Records, tables: JournalDecoder, c: _Columns,
    trace: np.ndarray, position: np.ndarray,
) -> JournalIndex:
    clock = np.maximum.accumulate(np.maximum(c.time, process.created_ns)) if len(c.time) \
        else np.zeros(0, np.int64)
    before = np.concatenate([[process.created_ns], clock[:-1]]) if len(clock) else clock
    has = trace >= 0
    rank = position[trace[has]]
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(len(position) + 1))
    return JournalIndex(
        process=process, records=records, strings=tables.strings, threads=tables.threads,
        last_ns=int(clock[-1]) if len(clock) else process.created_ns,
        slots=c.slots[has][order], clocks=before[has][order], bounds=bounds,
    )
