"""Telemetry settings, read once per configuration from the standard ``OTEL_*`` variables.

Data flow::

    os.environ ──► Settings.from_env() ──► Recorder (journal on/off, sampler)
                                      └──► exporters (protocol, endpoint, service name)

Variables: ``FAULTLAB_TRACE_DIR`` (journal directory), ``OTEL_TRACES_EXPORTER``
(``otlp`` | ``console`` | ``none``), ``OTEL_EXPORTER_OTLP_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (``http/protobuf`` | ``grpc``), the OTLP endpoint
variables (read by the SDK exporters themselves), ``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG``, and ``OTEL_BSP_SCHEDULE_DELAY``
(milliseconds between live-export passes), ``OTEL_BSP_EXPORT_TIMEOUT`` (milliseconds the
final flush may take) and ``OTEL_SDK_DISABLED`` (``true``: no export).

Invariant: tracing is enabled iff a journal directory is named or an exporter is chosen;
nothing here touches the file system.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)

TRACE_DIR_ENV = "FAULTLAB_TRACE_DIR"
# Set by the process that owns live export, inherited by its children (see recorder.py).
OWNER_ENV = "FAULTLAB_TRACE_OWNER"
TMPDIR_ENV = "FAULTLAB_TRACE_TMPDIR"

SAMPLERS = (
    "always_on", "always_off", "traceidratio",
    "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio",
)
PROTOCOLS = ("http/protobuf", "grpc")
EXPORTERS = ("otlp", "console", "none")


@dataclasses.dataclass(frozen=True)
class Settings:
    trace_dir: str | None
    exporter: str  # one of EXPORTERS
    protocol: str  # one of PROTOCOLS
    service_name: str
    sampler: str  # one of SAMPLERS
    sampler_ratio: float
    export_interval_s: float

    @property
    def enabled(self) -> bool:
        return self.trace_dir is not None or self.exporter != "none"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            trace_dir=env.get(TRACE_DIR_ENV) or None,
            exporter=_exporter(env),
            protocol=_protocol(env),
            service_name=env.get("OTEL_SERVICE_NAME") or "faultlab",
            sampler=_sampler(env),
            sampler_ratio=_ratio(env),
            export_interval_s=_interval(env),
        )


def _exporter(env: Mapping[str, str]) -> str:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "none"  # the journal still records if FAULTLAB_TRACE_DIR names one
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    for name in names:
        if name in EXPORTERS and name != "none":
            return name
        if name not in ("", "none"):
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here; use otlp or console", name)
    return "none"


def _protocol(env: Mapping[str, str]) -> str:
    value = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
             or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if value == "http/json":
        log.warning("OTLP http/json is not supported; using http/protobuf")
        value = "http/protobuf"
    if value not in PROTOCOLS:
        log.warning("unknown OTLP protocol %r; using http/protobuf", value)
        value = "http/protobuf"
    return value


def _sampler(env: Mapping[str, str]) -> str:
    value = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if value not in SAMPLERS:
        log.warning("unknown OTEL_TRACES_SAMPLER %r; using parentbased_always_on", value)
        value = "parentbased_always_on"
    return value


def _ratio(env: Mapping[str, str]) -> float:
    raw = env.get("OTEL_TRACES_SAMPLER_ARG")
    try:
        ratio = 1.0 if raw is None or raw == "" else float(raw)
    except ValueError:
        log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a number; using 1.0", raw)
        ratio = 1.0
    return min(1.0, max(0.0, ratio))


def _interval(env: Mapping[str, str]) -> float:
    try:
        return max(0.05, float(env.get("OTEL_BSP_SCHEDULE_DELAY", "500")) / 1000.0)
    except ValueError:
        return 0.5
