"""Exports stream a run trace by trace (issue 22, long runs).

Two things are checked. The streamed output is the whole-run output: on a real chaos run
(a worker SIGKILLed mid-call, RPCs failing after it), Jaeger JSON is byte-equal, OTLP JSON
and Perfetto hold the same spans and events, ``load_run``/``load_events`` the same rows.
And memory is bounded by the largest trace: on a journal of many traces (one much larger
than the rest), the exporter, sampled at every write, never has more spans alive than that
trace (Perfetto: than two traces, it keeps the ones that overlap in time).
"""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest
from otlp_receivers import HttpReceiver

import telemetry
from chaos import FaultPlan, KillWorker, run_scenario
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from faultlab.cli import main
from telemetry import assemble, exports, otlp_json
from telemetry.assemble import RecordedSpan, read_run
from telemetry.exports import render, write_export
from telemetry.frames import event_rows, spans_frame
from telemetry.stream import RunStream

CFG = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                     start_method="fork")
BIG = 60  # spans of the largest trace of the many-trace journal


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stream")
    calls = [CallSpec("echo", (i,), timeout=5.0) for i in range(30)]
    workload = rpc_sequence([*calls, CallSpec("sleep", (1.5,), timeout=10.0),
                             CallSpec("echo", (0,), timeout=5.0)])
    result = run_scenario(CFG, workload, FaultPlan([KillWorker(rank=1, at=0.5)], seed=3), out)
    return Path(result.trace_dir)


def _streamed(run_dir: Path, fmt: str) -> str:
    out = io.StringIO()
    write_export(run_dir, fmt, out)
    return out.getvalue()


def test_streamed_jaeger_is_the_whole_run_document(killed_run: Path) -> None:
    whole = json.dumps(render(killed_run, "jaeger"), separators=(",", ":"))
    assert _streamed(killed_run, "jaeger") == whole
    doc = json.loads(whole)
    assert any(log["fields"][0]["value"] == "chaos.fault"  # the story is in there too
               for t in doc["data"] for s in t["spans"] for log in s["logs"])


def test_an_export_in_parts_is_the_same_text(killed_run: Path) -> None:
    parts = io.StringIO()
    write_export(killed_run, "jaeger", parts, workers=3)  # forked part processes, joined
    assert parts.getvalue() == _streamed(killed_run, "jaeger")
    parts = io.StringIO()
    write_export(killed_run, "otlp-json", parts, workers=2)  # batches differ: compare spans
    assert _otlp_spans(json.loads(parts.getvalue())) == _otlp_spans(
        json.loads(_streamed(killed_run, "otlp-json")))


def test_a_send_in_parts_sends_every_span_once(
    killed_run: Path, http_receiver: HttpReceiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = io.StringIO()
    write_export(killed_run, "otlp-json", one, workers=1)
    doc = json.loads(one.getvalue())
    monkeypatch.setattr(exports, "PARALLEL_MIN_TRACES", 1)  # forked senders, even here
    assert main(["trace", "send", str(killed_run), "--endpoint", http_receiver.endpoint,
                 "--protocol", "http/protobuf"]) == 0
    expected = sorted(s["spanId"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
                      for s in ss["spans"])
    assert sorted(span.span_id.hex() for _, span in http_receiver.spans()) == expected


def _otlp_spans(doc: dict[str, Any]) -> list[str]:
    return sorted(json.dumps(s, sort_keys=True) for rs in doc["resourceSpans"]
                  for ss in rs["scopeSpans"] for s in ss["spans"])


def test_streamed_otlp_json_and_perfetto_hold_the_same_spans(killed_run: Path) -> None:
    def perfetto_events(doc: dict[str, Any]) -> list[str]:
        for event in doc["traceEvents"]:
            if event.get("cat") == "flow":
                event["id"] = 0  # numbered in another order; pairs are checked below
        return sorted(json.dumps(e, sort_keys=True) for e in doc["traceEvents"])

    streamed = json.loads(_streamed(killed_run, "otlp-json"))
    assert _otlp_spans(streamed) == _otlp_spans(render(killed_run, "otlp-json"))
    streamed = json.loads(_streamed(killed_run, "perfetto"))
    whole = render(killed_run, "perfetto")
    flows = [e["id"] for e in streamed["traceEvents"] if e.get("cat") == "flow"]
    assert flows and all(flows.count(i) == 2 for i in flows)
    assert streamed["otherData"] == whole["otherData"]
    assert perfetto_events(streamed) == perfetto_events(json.loads(json.dumps(whole)))


def test_streamed_frames_are_the_whole_run_frames(killed_run: Path) -> None:
    spans = read_run(killed_run)
    key = ["start_ns", "span_id"]

    def same(a: pd.DataFrame, b: pd.DataFrame, by: list[str]) -> None:
        a = a.sort_values(by, kind="stable").reset_index(drop=True)
        b = b.sort_values(by, kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b)

    frame = telemetry.load_run(killed_run)
    same(frame, spans_frame(spans), key)
    assert frame.truncated.any() and (frame.status == "ERROR").any()
    columns = ["name", "span_id", "start_ns", "end_ns"]
    same(telemetry.load_run(killed_run, columns), spans_frame(spans)[columns], key)
    rows = [row for trace in telemetry.iter_traces(killed_run) for row in event_rows(trace)]
    assert sorted(map(str, rows)) == sorted(map(str, event_rows(spans)))
    events = telemetry.load_events(killed_run)
    assert sorted(zip(events.name, events.time_ns, events.span_id, strict=True)) == sorted(
        (r["name"], r["time_ns"], r["span_id"]) for r in rows)
    with pytest.raises(ValueError, match="unknown load_run columns"):
        telemetry.load_run(killed_run, ["name", "nope"])


# ---------------------------------------------------------------- memory bounded by a trace

@pytest.fixture
def many_traces(trace_dir: Path) -> Path:
    """300 traces of 3 spans, one of ``BIG`` spans in the middle, some overlapping in time."""
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    for i in range(300):
        root = rec.start_span(f"root {i}")
        overlapping = rec.start_span(f"next {i}") if i % 7 == 0 else None
        for k in range(BIG - 1 if i == 150 else 2):
            rec.start_span(f"child {k}", parent=root.context, attributes={"k": k}).end()
        root.end()
        if overlapping is not None:
            overlapping.end()
    telemetry.shutdown()
    return trace_dir


class _Counted(RecordedSpan):
    """A RecordedSpan that the decoder makes while a test counts the ones alive."""

    alive: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _Counted.alive += 1

    def __del__(self) -> None:
        _Counted.alive -= 1


class _Spy(io.StringIO):
    """A real text sink that notes, at each write, how many decoded spans are alive."""

    def __init__(self) -> None:
        super().__init__()
        self.max_alive = 0

    def write(self, text: str) -> int:
        self.max_alive = max(self.max_alive, _Counted.alive)
        return super().write(text)


@pytest.mark.parametrize(("fmt", "bound"), [("jaeger", BIG), ("otlp-json", 100 + BIG),
                                            ("perfetto", 2 * BIG)])
def test_an_export_holds_one_trace_at_a_time(
    many_traces: Path, fmt: str, bound: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(read_run(many_traces)) == 299 * 3 + BIG + 300 // 7 + 1
    monkeypatch.setattr(otlp_json, "BATCH_SPANS", 100)  # OTLP JSON converts in batches
    monkeypatch.setattr(assemble, "RecordedSpan", _Counted)  # what the decoder makes
    gc.collect()
    spy = _Spy()
    write_export(many_traces, fmt, spy)
    assert json.loads(spy.getvalue())  # one valid document
    if fmt == "jaeger":
        assert spy.max_alive == BIG  # it did see the largest trace, and only that
    assert spy.max_alive <= bound


def test_the_stream_holds_at_most_the_largest_trace(many_traces: Path) -> None:
    stream = RunStream(many_traces)
    sizes = [len(spans) for spans in stream.traces()]
    assert stream.n_traces == len(sizes) == 300 + 300 // 7 + 1 and max(sizes) == BIG
    assert stream.max_spans_held == BIG
