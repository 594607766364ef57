"""A trace directory that runs out of space stops tracing with one warning; it never
kills the program (sparse journal files on a full filesystem meant SIGBUS).

The run is real: a 1 MiB tmpfs mounted in a private mount namespace (``unshare -m``),
a traced TP=2 executor making RPCs until its journal cannot grow, and long after.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import telemetry
from telemetry import journal as j

CHILD = Path(__file__).with_name("journal_children.py")
ROOT = Path(__file__).resolve().parents[2]
_WARNING = re.compile(r"tracing stopped: cannot allocate journal segment (\S+): "
                      r"(\d+) bytes needed, (\d+) bytes free")


def _writer_pid(segment: str) -> int:
    match = re.search(r"-(\d+)-[0-9a-f]{16}(\.s\d+)?\.bin$", segment)
    assert match, segment
    return int(match.group(1))


def _in_tiny_tmpfs(mount_dir: Path, command: str) -> list[str]:
    mount = f"mount -t tmpfs -o size=1m none {mount_dir}"
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f"{mount} && {command}"]


@pytest.fixture
def tiny_tmpfs_dir(tmp_path: Path) -> Path:
    """A directory that a child can mount a 1 MiB tmpfs on; skip where that is not allowed."""
    mount_dir = tmp_path / "tiny"
    mount_dir.mkdir()
    try:
        probe = subprocess.run(_in_tiny_tmpfs(mount_dir, "true"), capture_output=True,
                               text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("unshare(1) is not installed")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here "
                    f"(needs root or CAP_SYS_ADMIN): {probe.stderr.strip()}")
    return mount_dir


def test_full_trace_dir_stops_tracing_with_one_warning(tiny_tmpfs_dir: Path) -> None:
    n = 30_000  # the journal runs out after ~2,000 (8 records an RPC): samples from 3,000 on
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAULTLAB_"))}
    env.update({"PYTHONPATH": str(ROOT), "FAULTLAB_TRACE_DIR": str(tiny_tmpfs_dir),
                j.SEGMENT_ENV: "65536", "LOAD_RUN_HERE": "1"})
    command = f"exec {sys.executable} {CHILD} rpcs {n}"
    proc = subprocess.run(_in_tiny_tmpfs(tiny_tmpfs_dir, command), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] == n  # every call succeeded

    warnings = _WARNING.findall(proc.stderr)
    assert proc.stderr.count("tracing stopped") == len(warnings) >= 1, proc.stderr
    pids = [_writer_pid(path) for path, _, _ in warnings]
    assert len(set(pids)) == len(pids), proc.stderr  # one warning per process at most
    assert any("journal-driver-" in path for path, _, _ in warnings), proc.stderr
    for path, needed, free in warnings:
        assert Path(path).parent == tiny_tmpfs_dir
        assert int(needed) == 65536 + j.HEADER_SIZE and int(free) < int(needed)

    assert out["recorded"] > 0  # what was recorded before the stop still loads
    last = out["samples"][-1]
    assert last["maps"] == 0  # the stopped journal let go of its mappings
    assert len({tuple(s["worker_fds"]) for s in out["samples"]}) == 1


def test_trace_dir_removed_mid_run_stops_tracing_with_one_warning(
    trace_dir: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Any failure to create the next segment (here: the directory is gone) is handled like
    a full disk, without needing a mount namespace."""
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rec.start_span("before").end()
    shutil.rmtree(trace_dir)
    with caplog.at_level(logging.WARNING, logger="telemetry.journal"):
        for i in range(j.SLOTS_PER_SEGMENT):  # 2+ records a span: past the first segment
            with rec.start_span("during", attributes={"i": i}) as span:
                span.add_event("tick")
    stopped = [r for r in caplog.records if "tracing stopped" in r.getMessage()]
    assert len(stopped) == 1, caplog.text
    assert str(trace_dir / "journal-driver-") in stopped[0].getMessage()
    assert "bytes needed" in stopped[0].getMessage()
    assert not rec.start_span("after").is_recording
    assert rec.enabled  # contexts still travel, not sampled
    assert not rec.start_span("after").context.sampled
