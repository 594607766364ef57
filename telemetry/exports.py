"""Export formats of a recorded run: one registry, so an unknown format is an error.

    EXPORT_FORMATS: name ──► (module, function) ──► function(spans) -> JSON document
        jaeger     telemetry.jaeger_json.to_jaeger       (Jaeger UI: Search ─► Upload JSON)
        otlp-json  telemetry.otlp_json.to_otlp_json      (OTLP/JSON, as a collector reads it)
        perfetto   telemetry.perfetto_json.to_perfetto   (Perfetto UI, chrome://tracing)

``render(run_dir, fmt)`` reads the run (``assemble.read_run``) and converts it; a name not in
the registry raises ``ValueError`` naming the known ones (it used to fall through to OTLP).
Converters are imported on use: pandas and the SDK stay out of the command line's start.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

EXPORT_FORMATS: dict[str, tuple[str, str]] = {
    "jaeger": ("telemetry.jaeger_json", "to_jaeger"),
    "otlp-json": ("telemetry.otlp_json", "to_otlp_json"),
    "perfetto": ("telemetry.perfetto_json", "to_perfetto"),
}
DEFAULT_FORMAT = "jaeger"


def converter(fmt: str) -> Any:
    """The function that turns a run's spans into format ``fmt``."""
    try:
        module, name = EXPORT_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}") from None
    return getattr(importlib.import_module(module), name)


def render(run_dir: str | Path, fmt: str = DEFAULT_FORMAT) -> dict[str, Any]:
    """The JSON document of ``run_dir`` in format ``fmt``."""
    from telemetry.assemble import read_run

    convert = converter(fmt)  # an unknown format fails before the run is read
    return convert(read_run(Path(run_dir)))
