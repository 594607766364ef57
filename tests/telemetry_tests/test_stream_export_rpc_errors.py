"""Streamed export == whole-run export on runs whose fault is detected through an RPC's
error, not a death (issue 31: equality was tested only on a SIGKILLed worker).

    run          fault                                         detected by
    corrupt      CorruptQueue flip_payload on the 4th echo      the RPC's error (a checksum)
    deadline     HangWorker (SIGSTOP) inside sleep, deadline    TimeoutError

Each run is checked first to be what it claims (a fault paired with an RPC error, no death
before it), then Jaeger JSON streamed is byte-equal to the whole run's, OTLP JSON holds
the same spans, ``load_run``/``load_events`` the same rows.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import telemetry
from chaos import CorruptQueue, FaultPlan, HangWorker, run_scenario
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from telemetry.assemble import read_run
from telemetry.exports import render, write_export
from telemetry.frames import event_rows, spans_frame
from telemetry.story import DEATHS, detections

CFG = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                     start_method="fork")
ECHOES = [CallSpec("echo", (i,), timeout=5.0) for i in range(8)]
RUNS: dict[str, tuple[Any, list[CallSpec]]] = {
    "corrupt": (CorruptQueue(rank=1, on_call=("echo", 3), mode="flip_payload"), ECHOES),
    "deadline": (HangWorker(rank=1, at=0.2),
                 [*ECHOES[:2], CallSpec("sleep", (0.6,), timeout=1.0), ECHOES[2]]),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def rpc_error_run(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Path:
    fault, calls = RUNS[request.param]
    out = tmp_path_factory.mktemp(f"stream-{request.param}")
    result = run_scenario(CFG, rpc_sequence(calls), FaultPlan([fault], seed=11), out)
    return Path(result.trace_dir)


def _streamed(run_dir: Path, fmt: str) -> str:
    out = io.StringIO()
    write_export(run_dir, fmt, out)
    return out.getvalue()


def test_the_fault_is_detected_by_an_rpc_error(rpc_error_run: Path) -> None:
    paired = detections(read_run(rpc_error_run))
    assert paired, "no fault in the run"
    for fault, sign in paired:
        assert sign is not None, f"{fault.kind}: not detected"
        assert sign.by not in {d.removeprefix("executor.") for d in DEATHS}, sign.by
        assert sign.span.kind == "client" and sign.span.status == "ERROR"


def test_no_fault_before_its_rpc_is_told_in_flight(rpc_error_run: Path) -> None:
    """deadline: the echo after the timed-out sleep fails too (rank 1 serves it only when
    the scenario resumes it); its fault came 800 ms before it began (issue 32: told as
    "... before this RPC began, while this call was in flight")."""
    told = [str(s.attributes["faultlab.failure"]) for s in read_run(rpc_error_run)
            if "faultlab.failure" in s.attributes]
    assert told
    for sentence in told:
        assert not ("before this RPC began" in sentence and "in flight" in sentence), sentence


def test_streamed_jaeger_is_the_whole_run_document(rpc_error_run: Path) -> None:
    whole = json.dumps(render(rpc_error_run, "jaeger"), separators=(",", ":"))
    assert _streamed(rpc_error_run, "jaeger") == whole
    doc = json.loads(whole)
    told = [s for t in doc["data"] for s in t["spans"]
            if any(log["fields"][0]["value"] == "faultlab.detection" for log in s["logs"])]
    assert any(s["operationName"].startswith("rpc ") for s in told)  # the story is in there


def test_streamed_otlp_json_holds_the_same_spans(rpc_error_run: Path) -> None:
    def spans(doc: dict[str, Any]) -> list[str]:
        return sorted(json.dumps(s, sort_keys=True) for rs in doc["resourceSpans"]
                      for ss in rs["scopeSpans"] for s in ss["spans"])

    assert spans(json.loads(_streamed(rpc_error_run, "otlp-json"))) == spans(
        render(rpc_error_run, "otlp-json"))


def test_streamed_frames_are_the_whole_run_frames(rpc_error_run: Path) -> None:
    spans = read_run(rpc_error_run)
    key = ["start_ns", "span_id"]
    frame = telemetry.load_run(rpc_error_run).sort_values(key, kind="stable")
    whole = spans_frame(spans).sort_values(key, kind="stable")
    pd.testing.assert_frame_equal(frame.reset_index(drop=True), whole.reset_index(drop=True))
    assert (frame.status == "ERROR").any()
    rows = [row for trace in telemetry.iter_traces(rpc_error_run) for row in event_rows(trace)]
    assert sorted(map(str, rows)) == sorted(map(str, event_rows(spans)))
