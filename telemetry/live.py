"""Live export: one thread in the owner (driver) process turns journals into OTLP spans.

Data flow::

    run_dir/journal-*.bin (driver and every worker)
        │  every OTEL_BSP_SCHEDULE_DELAY ms
        ▼
    LiveExporter._export_pass: JournalTail.poll ─► ended spans ─► backlog ─► SDK exporter
        stop(): the same thread makes one final pass that also exports spans still open,
                marked truncated; stop waits for it OTEL_BSP_EXPORT_TIMEOUT (default 3 s),
                then shuts the exporter down and waits at most 1 s more, even if the
                collector is down or never answers

Invariants:

- Everything that could fail while the interpreter exits is built when live export is
  configured: the exporter, the base ``Resource`` (``Resource.create`` starts a thread
  pool, which Python refuses once shutdown began) and the export thread.  ``stop`` starts
  no thread and creates no pool, so it works from an exit hook, after ``sys.exit`` and
  after an uncaught exception alike.
- Only journals of this owner's process tree (header ``owner_pid``, inherited through
  ``FAULTLAB_TRACE_OWNER``) created since it was configured are exported: a reused run
  directory does not replay an older run, and a second driver sharing the directory (a
  chaos runner and the driver it launched) does not export the other's spans twice.
- Each pass's new spans are told (``telemetry.story``) with every fault and death seen
  so far: all tails are polled before telling, and a fault is recorded before it acts,
  so an RPC span it affected, which ends after the detection, carries both.
- Each span is exported at most once (a tail hands out each ended span once; the backlog
  holds only spans the collector has not accepted yet).
- Spans of a worker killed mid-run are exported too: its journal outlives it, and the
  tail reads past its last, possibly torn, record once the worker is gone.
- A collector that is down never stalls the owner for long: a pass stops at the first
  refused batch and keeps the rest for later; ``stop`` shuts the exporter down (which
  ends its retries) when the final flush overruns its budget.  The journal keeps every
  span anyway: ``faultlab trace send`` replays it.
- Only the export thread touches the tails, the backlog and the exporter (other than
  shutting it down) until it has ended.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from opentelemetry.sdk.resources import Resource

from telemetry import journal as j
from telemetry.assemble import JournalTail, ProcessInfo, RecordedSpan
from telemetry.config import Settings
from telemetry.otel import base_resource, export_spans, make_exporter, to_readable_spans
from telemetry.story import Story

log = logging.getLogger(__name__)
MAX_BACKLOG = 50_000  # spans kept for retry while the collector is unreachable


class LiveExporter:
    """Background export of a run directory's journals through an OpenTelemetry exporter."""

    def __init__(self, run_dir: Path, settings: Settings, since_ns: int) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.since_ns = since_ns
        self._pid = os.getpid()
        self.exported = 0
        self.dropped = 0
        self._tails: dict[int, JournalTail] = {}  # incarnation -> tail
        self._backlog: list[RecordedSpan] = []
        self._story = Story()  # faults and deaths seen so far, told into later passes
        self._base = base_resource()
        self._resources: dict[ProcessInfo, Resource] = {}
        self._exporter = make_exporter(settings.exporter, settings.protocol)
        self._budget_s = _final_flush_budget_s()
        self._exporter_closed = False
        self._close_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="faultlab-trace-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Export everything left (open spans as truncated) within the budget; shut down."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._budget_s)
        elif self._thread.ident is None:  # never started: flush here, nothing else runs
            self._final_pass()
        if self._thread.is_alive():  # over budget: end the exporter's retries, then go
            self._close_exporter()
            self._thread.join(min(1.0, self._budget_s))
        self._close_exporter()
        if self._thread.is_alive():
            log.warning("the final trace export overran its %.1f s budget; spans it had not "
                        "sent %s", self._budget_s, self._where_spans_stay())
        elif self._backlog:
            self.dropped += len(self._backlog)
            log.warning("%d spans were not exported live and %s",
                        len(self._backlog), self._where_spans_stay())

    def _where_spans_stay(self) -> str:
        if self.settings.trace_dir is None:  # the recorder removes its temporary run dir
            return "are lost (set FAULTLAB_TRACE_DIR to keep them for faultlab trace send)"
        return f"stay in {self.run_dir} (faultlab trace send replays them)"

    def _close_exporter(self) -> None:
        with self._close_lock:
            if not self._exporter_closed:
                self._exporter_closed = True
                self._exporter.shutdown()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.export_interval_s):
            try:
                self._export_pass(final=False)
            except Exception:  # keep exporting later passes; the journal keeps the spans
                log.exception("live trace export pass failed")
        self._final_pass()

    def _final_pass(self) -> None:
        try:
            if not self._exporter_closed:
                self._export_pass(final=True)
        except Exception:
            log.exception("final live trace export pass failed")

    def _export_pass(self, final: bool) -> None:
        self._discover()
        new: list[RecordedSpan] = []
        for tail in self._tails.values():
            tail.poll(final=final)
            new.extend(tail.decoder.pop_finished())
            if final:
                new.extend(tail.decoder.open_spans())
        self._backlog.extend(self._story.tell(new))
        if len(self._backlog) > MAX_BACKLOG:
            excess = len(self._backlog) - MAX_BACKLOG
            self.dropped += excess
            del self._backlog[:excess]
        if self._backlog:
            self._send()

    def _discover(self) -> None:
        for journal in j.find_journals(self.run_dir):
            header = journal.header
            if (header.incarnation not in self._tails and header.owner_pid == self._pid
                    and header.created_ns >= self.since_ns):
                self._tails[header.incarnation] = JournalTail(journal)

    def _send(self) -> None:
        spans = to_readable_spans(self._backlog, self._base, self._resources)
        sent = export_spans(self._exporter, spans)
        self.exported += sent
        del self._backlog[:sent]
        if self._backlog:
            log.warning("OTLP export refused or failed; %d spans wait for the next pass",
                        len(self._backlog))


def _final_flush_budget_s() -> float:
    try:
        return max(0.1, float(os.environ.get("OTEL_BSP_EXPORT_TIMEOUT", "3000")) / 1000.0)
    except ValueError:
        return 3.0
