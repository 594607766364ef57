"""Live export: one thread in the owner (driver) process turns journals into OTLP spans.

Data flow::

    run_dir/journal-*.bin (driver and every worker)
        │  every OTEL_BSP_SCHEDULE_DELAY ms
        ▼
    LiveExporter._export_pass: JournalTail.poll ─► ended spans ─► ReadableSpan ─► SDK exporter
        stop(): one final pass that also exports spans still open, marked truncated

Invariants:

- Only journals created since the owner was configured are exported: a reused run
  directory does not replay an older run.
- Each span is exported at most once (a tail hands out each ended span once).
- Spans of a worker killed mid-run are exported too: its journal outlives it, and the
  tail reads past its last, possibly torn, record once the worker is gone.
- Only the export thread touches the tails and the exporter until ``stop`` joins it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from telemetry import journal as j
from telemetry.assemble import JournalTail, RecordedSpan
from telemetry.config import Settings
from telemetry.otel import export_spans, make_exporter, to_readable_spans

log = logging.getLogger(__name__)


class LiveExporter:
    """Background export of a run directory's journals through an OpenTelemetry exporter."""

    def __init__(self, run_dir: Path, settings: Settings, since_ns: int) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.since_ns = since_ns
        self.exported = 0
        self.failed_batches = 0
        self._tails: dict[int, JournalTail] = {}  # incarnation -> tail; export thread only
        self._exporter = make_exporter(settings.exporter, settings.protocol)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="faultlab-trace-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, export everything left (open spans as truncated), shut down."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self._export_pass(final=True)
        finally:
            self._exporter.shutdown()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.export_interval_s):
            try:
                self._export_pass(final=False)
            except Exception:  # keep exporting later passes; the journal keeps the spans
                log.exception("live trace export pass failed")

    def _export_pass(self, final: bool) -> None:
        self._discover()
        spans: list[RecordedSpan] = []
        for tail in self._tails.values():
            tail.poll(final=final)
            spans.extend(tail.decoder.pop_finished())
            if final:
                spans.extend(tail.decoder.open_spans())
        if spans:
            self._send(spans)

    def _discover(self) -> None:
        for journal in j.find_journals(self.run_dir):
            header = journal.header
            if header.incarnation not in self._tails and header.created_ns >= self.since_ns:
                self._tails[header.incarnation] = JournalTail(journal)

    def _send(self, spans: list[RecordedSpan]) -> None:
        if export_spans(self._exporter, to_readable_spans(spans)):
            self.exported += len(spans)
        else:
            self.failed_batches += 1
            log.warning("OTLP export of %d spans failed; they stay in %s", len(spans),
                        self.run_dir)
