"""How exports name what they show: services per role, instances, span names, attributes.

    ProcessInfo ──► service_name()   "faultlab driver" / "faultlab worker rank 1" / "faultlab chaos"
                ──► instance_id()    "worker rank 1 pid 4242" (every export: Jaeger, OTLP, live)
    RecordedSpan ─► display_name()   "worker.execute sleep [rank 1]", "engine.step (failed)"
                ──► export_attributes()  recorded attributes + conventions + role and rank

Invariants:

- One function per name, used by every exporter (``jaeger_json``, ``otel`` and so
  ``otlp_json`` and live export), so the README and all exports say the same thing.
- A process's service is the configured service name (``OTEL_SERVICE_NAME``, default
  ``faultlab``) followed by its role, and a worker's rank: Jaeger gives each service its own
  colour and prefix on every row, so the driver and each rank are told apart without
  expanding anything.  The configured name stays in ``service.namespace``.
- Recorded names are never changed (chaos oracles and notebooks match them); only what the
  exporters show is.  Every span carries ``faultlab.role``; a ranked process's spans carry
  ``faultlab.rank``.
"""

from __future__ import annotations

from typing import Any

from telemetry.assemble import ProcessInfo, RecordedSpan

STEP_FAILED = "faultlab.step.failed"  # set by telemetry.story on a step whose RPC failed


def _ranked(process: ProcessInfo) -> bool:
    return process.rank is not None and process.role != "driver"


def service_name(process: ProcessInfo) -> str:
    """The service a process's spans are shown under, e.g. ``faultlab worker rank 1``."""
    rank = f" rank {process.rank}" if _ranked(process) else ""
    return f"{process.service} {process.role}{rank}"


def instance_id(process: ProcessInfo) -> str:
    """``service.instance.id``: role, rank and pid, e.g. ``worker rank 1 pid 4242``."""
    rank = f" rank {process.rank}" if _ranked(process) else ""
    return f"{process.role}{rank} pid {process.pid}"


def display_name(span: RecordedSpan) -> str:
    """The name exporters show: a worker's spans carry their rank, a failed step says so."""
    name = span.name
    if span.attributes.get(STEP_FAILED):
        name = f"{name} (failed)"
    if not _ranked(span.process):
        return name
    return f"{name} [rank {span.process.rank}]"


def export_attributes(span: RecordedSpan) -> dict[str, Any]:
    """The attributes exporters send: the recorded ones plus the current semantic
    conventions (``rpc.system.name``, ``rpc.method``, ``error.type``), role and rank."""
    attrs = dict(span.attributes)
    if "rpc.system" in attrs:
        attrs.setdefault("rpc.system.name", attrs.pop("rpc.system"))
    if span.name.startswith("worker.execute "):
        attrs.setdefault("rpc.system.name", "faultlab")
        attrs.setdefault("rpc.method", span.name.removeprefix("worker.execute "))
    if span.failed and "error.type" not in attrs:
        attrs["error.type"] = error_type(span)
    if span.consequence:
        attrs["faultlab.consequence"] = span.consequence
    attrs.setdefault("faultlab.role", span.process.role)
    if span.process.rank is not None:
        attrs.setdefault("faultlab.rank", span.process.rank)
    return attrs


def error_type(span: RecordedSpan) -> str:
    """``error.type`` of a failed span: its exception's type, else its outcome, else
    ``process_death`` for a span its process's death cut short, else its message's head."""
    error = next((e for e in span.events if e.name == "exception"), None)
    if error is not None and error.attributes.get("exception.type"):
        return str(error.attributes["exception.type"])
    outcome = span.attributes.get("faultlab.outcome")
    if outcome:
        return str(outcome)
    if span.truncated and not span.stopped and not span.status_message:
        return "process_death"  # cut short: its process ended (killed, lost) before it did
    head = span.status_message.partition(":")[0].strip()
    return head if head.isidentifier() else "_OTHER"
