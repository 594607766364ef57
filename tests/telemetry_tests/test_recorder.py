"""Recorder details: attribute types, threads, fork without configure_process, reused dirs."""

from __future__ import annotations

import enum
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

import telemetry


class Color(enum.IntEnum):
    RED = 1


def test_attribute_values_round_trip(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    long_text = "ü" * 5000  # 10000 bytes: cut at 8192 bytes
    values = {
        "s": "echo", "i": -(2**63), "big": 2**70, "f": 0.25, "t": True, "n": False,
        "list": ["a", 1], "enum": Color.RED, "none": None, "long": long_text,
    }
    span = rec.start_span("attrs", attributes=values)
    span.set_attribute("later", 3)
    span.add_event("exception", {"exception.type": "ValueError"})
    span.end("worker 1 said no")
    span.set_attribute("after.end", 1)  # ignored
    row = telemetry.load_run(trace_dir).iloc[0]
    attrs = row["attributes"]
    assert attrs["s"] == "echo" and attrs["i"] == -(2**63) and attrs["big"] == str(2**70)
    assert attrs["f"] == 0.25 and attrs["t"] is True and attrs["n"] is False
    assert attrs["list"] == ["a", 1] and attrs["enum"] == 1 and attrs["none"] == "None"
    assert attrs["long"] == long_text[:4096] and attrs["later"] == 3
    assert "after.end" not in attrs
    assert row["status"] == "ERROR" and row["status_message"] == "worker 1 said no"
    assert row["events"][0]["attributes"] == {"exception.type": "ValueError"}


def test_exception_end_records_exception_event(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    try:
        with rec.start_span("boom"):
            raise KeyError("k")
    except KeyError:
        pass
    row = telemetry.load_run(trace_dir).iloc[0]
    assert row["status"] == "ERROR" and row["status_message"] == "KeyError: 'k'"
    (event,) = row["events"]
    assert event["name"] == "exception" and event["attributes"]["exception.type"] == "KeyError"


def test_threads_record_concurrently(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    root = rec.start_span("root")

    def work(n: int) -> None:
        for i in range(n):
            rec.start_span("t", parent=root.context, attributes={"i": i}).end()

    threads = [threading.Thread(target=work, args=(2000,), name=f"w{k}") for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    root.end()
    df = telemetry.load_run(trace_dir)
    spans = df[df.name == "t"]
    assert len(spans) == 8000 and not spans.truncated.any()
    assert set(spans.thread_name) == {"w0", "w1", "w2", "w3"}
    assert spans.groupby("thread_name").size().tolist() == [2000] * 4
    assert spans.span_id.is_unique


def _child_uses_cached_recorder(rec: telemetry.Recorder, out: multiprocessing.Queue) -> None:
    rec.start_span("child.without.configure").end()  # the parent's recorder object, after fork
    out.put(os.getpid())


def test_forked_child_never_writes_into_parent_journal(trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rec.start_span("before.fork").end()
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    proc = ctx.Process(target=_child_uses_cached_recorder, args=(rec, out))
    proc.start()
    child_pid = out.get(timeout=30)
    proc.join(30)
    rec.start_span("after.fork").end()
    df = telemetry.load_run(trace_dir)
    assert dict(zip(df.name, df.pid, strict=True)) == {
        "before.fork": os.getpid(), "child.without.configure": child_pid,
        "after.fork": os.getpid(),
    }
    assert df.span_id.is_unique
    assert df[df.pid == child_pid].role.tolist() == ["worker"]


def test_reconfigure_moves_to_new_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b"):
        monkeypatch.setenv("FAULTLAB_TRACE_DIR", str(tmp_path / name))
        telemetry.configure_process("driver")
        telemetry.get_recorder().start_span(f"in.{name}").end()
    telemetry.shutdown()
    assert telemetry.load_run(tmp_path / "a").name.tolist() == ["in.a"]
    assert telemetry.load_run(tmp_path / "b").name.tolist() == ["in.b"]


def test_load_run_of_empty_dir(tmp_path: Path) -> None:
    df = telemetry.load_run(tmp_path)
    assert len(df) == 0 and "truncated" in df.columns
    assert len(telemetry.load_events(tmp_path)) == 0
