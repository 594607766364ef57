"""The export-format registry: every format the CLI offers has a converter; an unknown one
is refused before the run is read (it used to fall through to OTLP JSON)."""

from __future__ import annotations

import pytest

from faultlab.trace_cli import FORMATS
from telemetry.exports import DEFAULT_FORMAT, EXPORT_FORMATS, converter, render


def test_every_format_of_the_command_line_has_a_converter() -> None:
    assert set(FORMATS) == set(EXPORT_FORMATS) and DEFAULT_FORMAT in FORMATS
    for fmt in FORMATS:
        assert callable(converter(fmt))


def test_an_unknown_format_is_refused_before_the_run_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown export format 'zipkin'; known: jaeger"):
        render(tmp_path / "no-such-run", "zipkin")
