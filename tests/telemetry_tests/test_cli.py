"""``faultlab trace export`` (Jaeger, OTLP JSON, Perfetto) and ``faultlab trace send``."""

from __future__ import annotations

import json
import multiprocessing
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_errors import one_line_error
from otlp_receivers import GrpcReceiver, HttpReceiver
from telemetry_children import record_and_die, serve_one_rpc

import telemetry
from faultlab.cli import main
from telemetry import SpanContext

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
RANK_SUFFIX = re.compile(r" \[rank \d+\]$")  # a worker's spans show their rank
TAG_TYPES = {"string": str, "bool": bool, "int64": int, "float64": float}


@pytest.fixture
def recorded_run(trace_dir: Path) -> dict[str, Any]:
    """A driver RPC span with one serving worker and one SIGKILLed worker."""
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc = rec.start_span("echo", attributes={"rpc.method": "echo", "payload.bytes": 12})
    rpc.add_event("chaos.fault", {"fault": "kill", "rank": 1})
    ctx = multiprocessing.get_context("fork")
    env = telemetry.tracing_env()
    worker = ctx.Process(target=serve_one_rpc, args=(SpanContext.to_wire(rpc.context), 0, env))
    victim = ctx.Process(target=record_and_die, args=(3, "sigkill", 1, env))
    for proc in (worker, victim):
        proc.start()
        proc.join(30)
    assert victim.exitcode == -signal.SIGKILL
    rpc.end()
    rec.event("executor.worker_death", {"rank": 1, "pid": int(victim.pid or 0), "signal": 9})
    telemetry.shutdown()
    return {"dir": trace_dir, "rpc": rpc, "worker": worker.pid, "victim": victim.pid}


def _export(run_dir: Path, fmt: str, tmp_path: Path) -> Any:
    out = tmp_path / f"trace.{fmt}.json"
    assert main(["trace", "export", str(run_dir), "--format", fmt, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_jaeger_json_has_what_the_ui_reads(recorded_run: dict[str, Any], tmp_path: Path) -> None:
    doc = _export(recorded_run["dir"], "jaeger", tmp_path)
    assert set(doc) == {"data"}
    n_spans = len(telemetry.load_run(recorded_run["dir"]))
    assert sum(len(t["spans"]) for t in doc["data"]) == n_spans
    for trace in doc["data"]:
        assert HEX32.match(trace["traceID"])
        span_ids = {s["spanID"] for s in trace["spans"]}
        for span in trace["spans"]:
            assert span["traceID"] == trace["traceID"] and HEX16.match(span["spanID"])
            assert isinstance(span["operationName"], str) and span["operationName"]
            assert isinstance(span["startTime"], int) and isinstance(span["duration"], int)
            assert 1.5e15 < span["startTime"] < 1e17  # microseconds since the epoch
            assert span["processID"] in trace["processes"]
            for ref in span["references"]:
                assert ref["refType"] in ("CHILD_OF", "FOLLOWS_FROM")  # links: fault, detection
                if ref["refType"] == "CHILD_OF":
                    assert ref["traceID"] == trace["traceID"] and ref["spanID"] in span_ids
            for t in span["tags"] + [f for log in span["logs"] for f in log["fields"]]:
                assert isinstance(t["value"], TAG_TYPES[t["type"]])
        for process in trace["processes"].values():
            tags = {t["key"]: t["value"] for t in process["tags"]}
            rank = f" rank {tags['faultlab.rank']}" if tags["faultlab.role"] != "driver" \
                and "faultlab.rank" in tags else ""
            assert process["serviceName"] == f"faultlab {tags['faultlab.role']}{rank}"  # per role
            assert tags["service.namespace"] == "faultlab"
    rpc_trace = next(t for t in doc["data"]
                     if t["traceID"] == f"{recorded_run['rpc'].context.trace_id:032x}")
    names = {RANK_SUFFIX.sub("", s["operationName"]) for s in rpc_trace["spans"]}
    assert {"echo", "worker.dequeue", "worker.reply.enqueue", "worker.exit"} <= names
    assert len(rpc_trace["processes"]) == 2
    root = next(s for s in rpc_trace["spans"] if not s["references"])
    assert root["logs"][0]["fields"][0] == {"key": "event", "type": "string",
                                            "value": "chaos.fault"}
    open_spans = [s for t in doc["data"] for s in t["spans"] if s["warnings"]]
    assert {RANK_SUFFIX.sub("", s["operationName"]) for s in open_spans} == {"worker.loop",
                                                                            "worker.open"}


def test_perfetto_json_has_a_track_per_process(
    recorded_run: dict[str, Any], tmp_path: Path,
) -> None:
    doc = _export(recorded_run["dir"], "perfetto", tmp_path)
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert set(names) == {recorded_run["worker"], recorded_run["victim"], *[
        e["pid"] for e in events if e["ph"] == "X"]}
    assert any(n.startswith("driver") for n in names.values())
    assert names[recorded_run["victim"]] == f"worker 1 (pid {recorded_run['victim']})"
    complete = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and "tid" in e for e in complete)
    truncated = [e for e in complete if e["args"].get("truncated")]
    assert {e["name"] for e in truncated} == {"worker.loop", "worker.open"}
    instants = {e["name"] for e in events if e["ph"] == "i"}
    assert {"chaos.fault", "executor.worker_death", "worker.exit"} <= instants


def test_otlp_json_uses_hex_ids(recorded_run: dict[str, Any], tmp_path: Path) -> None:
    doc = _export(recorded_run["dir"], "otlp-json", tmp_path)
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == len(telemetry.load_run(recorded_run["dir"]))
    assert all(HEX32.match(s["traceId"]) and HEX16.match(s["spanId"]) for s in spans)
    assert all(HEX16.match(s["parentSpanId"]) for s in spans if "parentSpanId" in s)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_trace_send_replays_a_run(recorded_run: dict[str, Any], protocol: str) -> None:
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    try:
        code = main(["trace", "send", str(recorded_run["dir"]), "--endpoint",
                     receiver.endpoint, "--protocol", protocol])
        assert code == 0
        df = telemetry.load_run(recorded_run["dir"])
        received = receiver.spans()
        assert sorted(s.span_id.hex() for _, s in received) == sorted(df.span_id)
        parents = {s.span_id.hex(): s.parent_span_id.hex() for _, s in received}
        assert parents == {r.span_id: r.parent_span_id or "" for r in df.itertuples()}
        roles = {res["faultlab.role"] for res, _ in received}
        assert roles == {"driver", "worker"}
    finally:
        receiver.close()


def test_trace_send_subprocess_uses_otel_env(
    recorded_run: dict[str, Any], http_receiver: HttpReceiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = subprocess.run(
        [sys.executable, "-m", "faultlab.cli", "trace", "send", str(recorded_run["dir"])],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert len(http_receiver.spans()) == len(telemetry.load_run(recorded_run["dir"]))



def _usage_error(*args: str) -> str:
    """Run ``faultlab trace`` as a subprocess; assert exit 2 and one stderr line; return it."""
    done = subprocess.run([sys.executable, "-m", "faultlab.cli", "trace", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert done.stdout == ""
    return lines[0]


def _run_dir_without_journal(tmp_path: Path, case: str) -> Path:
    run_dir = tmp_path / case
    if case == "missing":
        return run_dir
    run_dir.mkdir()
    if case == "garbage":  # named like a journal, but no faultlab header
        (run_dir / "journal-worker-0-123-0000000000000001.bin").write_bytes(bytes(range(256)) * 4)
        (run_dir / "notes.txt").write_text("not a journal")
    return run_dir


@pytest.mark.parametrize("case", ["empty", "missing", "garbage"])
@pytest.mark.parametrize("command", ["export", "send"])
def test_trace_of_a_dir_without_journals_is_a_usage_error(
    tmp_path: Path, case: str, command: str,
) -> None:
    run_dir = _run_dir_without_journal(tmp_path, case)
    out = tmp_path / "trace.json"
    extra = ["--out", str(out)] if command == "export" else ["--endpoint", "http://127.0.0.1:9"]
    line = _usage_error(command, str(run_dir), *extra)
    assert str(run_dir) in line and "journal-*.bin" in line
    assert ("is not a directory" if case == "missing" else "holds no faultlab journal") in line
    assert not out.exists()


def test_trace_export_out_naming_a_directory_is_a_usage_error(
    recorded_run: dict[str, Any], tmp_path: Path,
) -> None:
    line = _usage_error("export", str(recorded_run["dir"]), "--out", str(tmp_path))
    assert "--out" in line and "is a directory" in line


# ---------------------------------------------------------------- unwritable outputs, in process

def _one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``faultlab trace ARGV``: exit 2 and one stderr line, returned (tests/cli_errors.py)."""
    return one_line_error(capsys, "trace", *argv)


def _read_only(tmp_path: Path) -> Path:
    path = tmp_path / "read-only.json"
    path.write_text("keep me")
    path.chmod(0o444)
    return path


@pytest.mark.parametrize(("make_out", "why"), [
    pytest.param(_read_only, "it is read-only (mode 0444)", id="read-only-file"),
    pytest.param(lambda tmp: Path("/proc/version"), "it is read-only", id="proc-version"),
    pytest.param(lambda tmp: tmp / "a-file" / "trace.json", "a-file is not a directory",
                 id="under-a-file"),
    pytest.param(lambda tmp: Path("/proc/faultlab-none/trace.json"),
                 "nothing can be created in /proc", id="under-proc"),
])
def test_trace_export_to_unwritable_path_is_one_line_error(
    recorded_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    make_out: Any, why: str,
) -> None:
    (tmp_path / "a-file").write_text("a file, not a directory")
    out = make_out(tmp_path)
    line = _one_line_error(capsys, "export", str(recorded_run["dir"]), "--out", str(out))
    assert f"argument --out: cannot write {out}: " in line and why in line  # checked when parsed
    if out.name == "read-only.json":
        assert out.read_text() == "keep me"


def test_trace_export_to_dev_full_is_one_line_error(
    recorded_run: dict[str, Any], capsys: pytest.CaptureFixture[str],
) -> None:
    line = _one_line_error(capsys, "export", str(recorded_run["dir"]), "--out", "/dev/full")
    assert line == "faultlab trace: error: cannot write /dev/full: No space left on device"


def test_trace_export_to_a_full_stdout_is_one_line_error(
    recorded_run: dict[str, Any], capsys: pytest.CaptureFixture[str],
) -> None:
    saved = sys.stdout
    with open("/dev/full", "w") as full:  # the error points its descriptor at /dev/null
        sys.stdout = full
        try:
            line = _one_line_error(capsys, "export", str(recorded_run["dir"]))
        finally:
            sys.stdout = saved
    assert line == "faultlab trace: error: cannot write to stdout: No space left on device"
