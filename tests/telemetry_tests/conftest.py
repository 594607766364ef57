"""Fixtures for telemetry tests: a clean recorder per test, real OTLP receivers, leak checks."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import leaks
import psutil
import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver

import telemetry
from telemetry.config import OWNER_ENV, TMPDIR_ENV

START_METHODS = ["fork", "forkserver", "spawn"]
_ENV = [
    "FAULTLAB_TRACE_DIR", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SERVICE_NAME", "OTEL_BSP_SCHEDULE_DELAY", "TRACEPARENT", OWNER_ENV, TMPDIR_ENV,
]


@pytest.fixture(autouse=True)
def clean_telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with tracing off and its own environment; leaves no process or shm."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    shm_before = set(os.listdir("/dev/shm"))
    yield
    telemetry.shutdown()
    for child in multiprocessing.active_children():
        child.join(5)
    session = leaks.session_pids()  # a Ray cluster the session started for other tests
    leftover = [p for p in psutil.Process().children(recursive=True)
                if _is_ours(p) and p.pid not in session]
    assert not leftover, f"child processes left behind: {leftover}"
    # Other suites may run beside this one: count only entries named after this process.
    new = set(os.listdir("/dev/shm")) - shm_before
    assert not [n for n in new if str(os.getpid()) in n], f"new /dev/shm entries: {new}"


def _is_ours(proc: psutil.Process) -> bool:
    """Ignore multiprocessing's shared forkserver and resource tracker helpers."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "forkserver" not in cmdline and "resource_tracker" not in cmdline


@pytest.fixture
def trace_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("FAULTLAB_TRACE_DIR", str(run_dir))
    return run_dir


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def grpc_receiver() -> Iterator[GrpcReceiver]:
    receiver = GrpcReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(params=START_METHODS)
def mp_context(request: pytest.FixtureRequest) -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context(request.param)
