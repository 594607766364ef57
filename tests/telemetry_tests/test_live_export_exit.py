"""Live OTLP export of a whole short script, flushed at interpreter exit.

Each test runs ``live_exit_script.py`` as its own interpreter (a real 2-worker executor)
with ``OTEL_TRACES_EXPORTER=otlp`` against a real receiver in this process, then compares
what the receiver got with the run's journals: every span, each exactly once, whether the
script falls off its end, calls ``sys.exit`` or dies of an uncaught exception, and the
open span of a SIGKILLed worker arrives marked truncated.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver, ReceivedSpans, attributes_of, base_name

from telemetry.assemble import read_run

SCRIPT = Path(__file__).with_name("live_exit_script.py")
ROOT = Path(__file__).resolve().parents[2]
RPCS = 3  # live_exit_script.RPCS
WORLD = 2


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest) -> Any:
    receiver = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    yield receiver
    receiver.close()


def protocol_of(receiver: ReceivedSpans) -> str:
    return "grpc" if isinstance(receiver, GrpcReceiver) else "http/protobuf"


def run_script(
    mode: str, endpoint: str, protocol: str = "http/protobuf",
    trace_dir: Path | None = None, **extra: str,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "FAULTLAB_TRACE_"))}
    env.update({
        "PYTHONPATH": str(ROOT), "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        **extra,
    })
    if trace_dir is not None:
        env["FAULTLAB_TRACE_DIR"] = str(trace_dir)
    return subprocess.run([sys.executable, str(SCRIPT), mode], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def assert_all_journal_spans_arrived(received: ReceivedSpans, trace_dir: Path) -> None:
    """The receiver has exactly the journals' spans (by id and name), each once."""
    got = [(span.span_id.hex(), base_name(span.name)) for _, span in received.spans()]
    assert len(got) == len(set(got)), "a span was exported twice"
    recorded = {(f"{s.span_id:016x}", s.name) for s in read_run(trace_dir)}
    assert set(got) == recorded, (Counter(n for _, n in recorded - set(got)),
                                  Counter(n for _, n in set(got) - recorded))


def names(received: ReceivedSpans) -> Counter[str]:
    return Counter(base_name(span.name) for _, span in received.spans())


def truncated(span: Any) -> bool:
    return bool(attributes_of(span.attributes).get("faultlab.truncated"))


def assert_echo_run_arrived(received: ReceivedSpans, trace_dir: Path) -> None:
    assert_all_journal_spans_arrived(received, trace_dir)
    counts = names(received)
    assert counts["rpc echo"] == RPCS and counts["worker.execute echo"] == RPCS * WORLD
    assert not [span.name for _, span in received.spans() if truncated(span)]
    roles = Counter(resource["faultlab.role"] for resource, _ in received.spans())
    assert set(roles) == {"driver", "worker"}


def test_script_that_ends_normally_exports_every_span(
    receiver: HttpReceiver | GrpcReceiver, tmp_path: Path,
) -> None:
    proc = run_script("normal", receiver.endpoint, protocol_of(receiver), tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert_echo_run_arrived(receiver, tmp_path / "run")


def test_flush_waits_for_executors_made_after_an_earlier_finalizer(
    http_receiver: HttpReceiver, tmp_path: Path,
) -> None:
    """Executors shut down (and record it) before the exit flush, whatever hooks exist."""
    proc = run_script("finalizer", http_receiver.endpoint, trace_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert_echo_run_arrived(http_receiver, tmp_path / "run")
    assert names(http_receiver)["executor.shutdown"] == 1


def test_script_ending_by_sys_exit_exports_every_span(
    http_receiver: HttpReceiver, tmp_path: Path,
) -> None:
    proc = run_script("exit", http_receiver.endpoint, trace_dir=tmp_path / "run")
    assert proc.returncode == 3, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert_echo_run_arrived(http_receiver, tmp_path / "run")


def test_script_dying_of_uncaught_exception_exports_every_span(
    http_receiver: HttpReceiver, tmp_path: Path,
) -> None:
    proc = run_script("raise", http_receiver.endpoint, trace_dir=tmp_path / "run")
    assert proc.returncode == 1 and "RuntimeError: uncaught on purpose" in proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    assert_echo_run_arrived(http_receiver, tmp_path / "run")


def test_script_without_trace_dir_exports_every_span(http_receiver: HttpReceiver) -> None:
    """The journals live in a temp dir the script removes at exit, after the last flush."""
    proc = run_script("normal", http_receiver.endpoint)
    assert proc.returncode == 0, proc.stderr
    counts = names(http_receiver)
    assert counts["rpc echo"] == RPCS and counts["worker.execute echo"] == RPCS * WORLD
    ids = [span.span_id for _, span in http_receiver.spans()]
    assert len(ids) == len(set(ids))


def test_worker_killed_mid_call_arrives_truncated(
    receiver: HttpReceiver | GrpcReceiver, tmp_path: Path,
) -> None:
    proc = run_script("kill", receiver.endpoint, protocol_of(receiver), tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert "sleep failed" in proc.stderr, proc.stderr
    assert_all_journal_spans_arrived(receiver, tmp_path / "run")
    killed = [(resource, span) for resource, span in receiver.spans()
              if base_name(span.name) == "worker.execute sleep" and resource.get("faultlab.rank") == 1]
    assert len(killed) == 1
    _, span = killed[0]
    assert truncated(span)
    assert span.status.code == span.status.STATUS_CODE_ERROR
    assert "truncated" in span.status.message


def test_unreachable_collector_does_not_hang_exit(tmp_path: Path) -> None:
    """The final flush is bounded: the script exits; its journal keeps the span."""
    proc = run_script("bare", "http://127.0.0.1:9", trace_dir=tmp_path / "run",
                      OTEL_BSP_EXPORT_TIMEOUT="300")
    assert proc.returncode == 0, proc.stderr
    assert [s.name for s in read_run(tmp_path / "run")] == ["bare"]


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_collector_that_never_answers_does_not_hang_exit(tmp_path: Path, protocol: str) -> None:
    """Connections are accepted by the kernel but never answered; each export would wait
    120 s (OTEL_EXPORTER_OTLP_TIMEOUT), the exit flush gives up after its budget."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent:
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = run_script("bare", endpoint, protocol, tmp_path / "run",
                          OTEL_BSP_EXPORT_TIMEOUT="300", OTEL_EXPORTER_OTLP_TIMEOUT="120")
    assert proc.returncode == 0, proc.stderr
    assert "trace send replays them" in proc.stderr, proc.stderr
    assert [s.name for s in read_run(tmp_path / "run")] == ["bare"]
