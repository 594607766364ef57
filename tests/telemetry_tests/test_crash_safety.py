"""A killed process keeps every span it ended; the span open at its death loads as truncated."""

from __future__ import annotations

import multiprocessing
import signal
from pathlib import Path

import pytest
from telemetry_children import record_and_die

import telemetry

N = 200


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_killed_child_keeps_its_spans(
    how: str, trace_dir: Path, mp_context: multiprocessing.context.BaseContext,
) -> None:
    proc = mp_context.Process(target=record_and_die, args=(N, how, 1, telemetry.tracing_env()))  # type: ignore[attr-defined]
    proc.start()
    proc.join(30)
    assert proc.exitcode == (-signal.SIGKILL if how == "sigkill" else 3)

    df = telemetry.load_run(trace_dir)
    child = df[df.pid == proc.pid]
    executed = child[child.name == "worker.execute"]
    assert len(executed) == N
    assert not executed.truncated.any() and (executed.status == "OK").all()
    assert sorted(a["i"] for a in executed.attributes) == list(range(N))
    assert all(len(events) == 1 and events[0]["name"] == "chaos.fault"
               for events in executed.events)
    open_spans = child[child.truncated]
    assert set(open_spans.name) == {"worker.loop", "worker.open"}
    assert open_spans.end_ns.isna().all()
    assert (child.role == "worker").all() and (child["rank"] == 1).all()

    events = telemetry.load_events(trace_dir)
    assert (events.name == "chaos.fault").sum() == N


def test_clean_shutdown_trims_journal(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rec.start_span("one").end()
    telemetry.shutdown()
    telemetry.shutdown()  # idempotent
    files = list(trace_dir.glob("journal-driver-*.bin"))
    assert len(files) == 1 and files[0].stat().st_size < 4096
    assert list(telemetry.load_run(trace_dir).name) == ["one"]


def test_many_spans_roll_over_segments(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    for _ in range(40_000):
        rec.start_span("s").end()  # 2 records each: more than one 65536-slot segment
    telemetry.shutdown()
    assert len(list(trace_dir.glob("journal-*.bin"))) == 2
    assert len(telemetry.load_run(trace_dir)) == 40_000
