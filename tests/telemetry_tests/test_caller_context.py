"""faultlab's spans join the caller's trace: its current OpenTelemetry span, or TRACEPARENT.

    caller context                         expected
    an active SDK span (this process)      rpc + start-up spans: its trace id, its span as parent
    TRACEPARENT=00-<t>-<s>-01              the same, from the environment
    TRACEPARENT ...-00 (not sampled)       nothing recorded for the RPC (parent-based sampling)
    TRACEPARENT malformed                  a warning; the RPC starts its own trace
    use_parent(ctx) inside an SDK span     the faultlab scope wins
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest

import telemetry
from executor import ExecutorConfig, MultiprocExecutor
from telemetry import SpanContext
from telemetry.context import parse_traceparent

CFG = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                     start_method="fork")
TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def _echo_run(trace_dir: Path) -> pd.DataFrame:
    telemetry.configure_process("driver")
    with MultiprocExecutor(CFG) as ex:
        assert ex.collective_rpc("echo", args=(7,), timeout=10.0) == [7, 7]
    telemetry.shutdown()
    return telemetry.load_run(trace_dir)


def _one(df: pd.DataFrame, name: str) -> pd.Series:
    rows = df[df.name == name]
    assert len(rows) == 1, f"{name}: {len(rows)} spans"
    return rows.iloc[0]


def test_rpc_and_startup_join_the_active_opentelemetry_span(trace_dir: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("caller")  # not installed globally: no side effects
    with tracer.start_as_current_span("caller request") as caller:
        df = _echo_run(trace_dir)
    ctx = caller.get_span_context()
    trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
    for name in ("rpc echo", "executor.startup"):
        row = _one(df, name)
        assert (row.trace_id, row.parent_span_id) == (trace_id, span_id), name
    workers = df[df.name.str.startswith("worker.execute")]
    assert len(workers) == 2 and set(workers.trace_id) == {trace_id}
    shutdown = _one(df, "executor.shutdown")  # not a child of the caller: its own trace
    assert shutdown.trace_id != trace_id


def test_traceparent_in_the_environment(trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEPARENT", f"00-{TRACE}-{SPAN}-01")
    df = _echo_run(trace_dir)
    rpc = _one(df, "rpc echo")
    assert (rpc.trace_id, rpc.parent_span_id) == (TRACE, SPAN)
    assert set(df[df.name.str.startswith("worker.execute")].trace_id) == {TRACE}


def test_unsampled_traceparent_records_no_rpc(trace_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEPARENT", f"00-{TRACE}-{SPAN}-00")
    df = _echo_run(trace_dir)
    assert not (df.name == "rpc echo").any() and not (df.trace_id == TRACE).any()


def test_malformed_traceparent_is_ignored_with_a_warning(
        trace_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TRACEPARENT", "00-not-a-trace-01")
    with caplog.at_level(logging.WARNING, logger="telemetry.context"):
        df = _echo_run(trace_dir)
    rpc = _one(df, "rpc echo")
    assert pd.isna(rpc.parent_span_id) and rpc.trace_id != TRACE
    assert any("TRACEPARENT" in r.getMessage() and "not-a-trace" in r.getMessage()
               for r in caplog.records)


def test_faultlab_scope_wins_over_the_opentelemetry_span() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    ours = SpanContext(0x1234, 0x56, True)
    with TracerProvider().get_tracer("caller").start_as_current_span("outer") as outer:
        assert telemetry.caller_parent() == SpanContext(
            outer.get_span_context().trace_id, outer.get_span_context().span_id, True)
        with telemetry.use_parent(ours):
            assert telemetry.caller_parent() == ours
        assert telemetry.caller_parent() != ours
    assert telemetry.caller_parent() is None


@pytest.mark.parametrize("value, problem", [
    ("", "is not"), (f"00-{TRACE}-{SPAN}", "is not"), (f"ff-{TRACE}-{SPAN}-01", "version"),
    (f"00-{'0' * 32}-{SPAN}-01", "all-zero"), (f"00-{TRACE}-{'0' * 16}-01", "all-zero"),
    (f"00-{TRACE}-{SPAN}-01-extra", "version"),
])
def test_parse_traceparent_names_the_problem(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_traceparent(value)


def test_parse_traceparent_reads_ids_and_sampled_flag() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01") == SpanContext(
        int(TRACE, 16), int(SPAN, 16), True)
    assert not parse_traceparent(f"00-{TRACE.upper()}-{SPAN}-00").sampled
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-03-future").sampled  # a later version
