"""A long traced run holds a bounded number of journal fds and mappings, however many
segments it fills, and every span of every segment still loads.

The runs are fresh interpreters (``journal_children.py``) with tiny segments
(``FAULTLAB_JOURNAL_SEGMENT_BYTES``), so a few thousand spans fill dozens of segments.
This process reads them back without that variable: the segment size comes from the
journal headers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import telemetry
from telemetry import journal as j

CHILD = Path(__file__).with_name("journal_children.py")
ROOT = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 16384  # 256 slots


def run_child(mode: str, n: int, trace_dir: Path, segment_bytes: int = SEGMENT_BYTES,
              timeout: float = 120) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAULTLAB_"))}
    env.update({"PYTHONPATH": str(ROOT), "FAULTLAB_TRACE_DIR": str(trace_dir),
                j.SEGMENT_ENV: str(segment_bytes)})
    proc = subprocess.run([sys.executable, str(CHILD), mode, str(n)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def segment_files(trace_dir: Path, role: str) -> list[Path]:
    return sorted(trace_dir.glob(f"journal-{role}-*.bin"))


def test_filled_segments_release_their_fds_and_mappings(tmp_path: Path) -> None:
    n = 5000  # 5+ records a span: ~100 segments of 256 slots
    out = run_child("spans", n, tmp_path)
    assert len(segment_files(tmp_path, "driver")) >= 50
    samples = out["samples"]
    assert len({s["fds"] for s in samples}) == 1, samples  # flat from the first sample on
    assert all(1 <= s["maps"] <= 2 for s in samples), samples

    df = telemetry.load_run(tmp_path)
    assert len(df) == n and (df.name == "filler").all()
    assert sorted(a["i"] for a in df.attributes) == list(range(n))
    assert not df.truncated.any() and (df.status == "OK").all()
    assert all(len(ev) == 1 and ev[0]["attributes"] == {"i": a["i"]}
               for ev, a in zip(df.events, df.attributes, strict=True))


def test_traced_rpcs_keep_fds_flat_in_driver_and_workers(tmp_path: Path) -> None:
    n = 2000
    out = run_child("rpcs", n, tmp_path)
    assert out["ok"] == n
    assert len(segment_files(tmp_path, "driver")) >= 20
    assert len(segment_files(tmp_path, "worker")) >= 20
    samples = out["samples"]
    assert len({s["fds"] for s in samples}) == 1, samples
    assert len({tuple(s["worker_fds"]) for s in samples}) == 1, samples
    assert all(s["maps"] <= 2 for s in samples), samples

    df = telemetry.load_run(tmp_path)
    counts = df.groupby("name").size()
    assert counts["rpc echo"] == n and counts["worker.execute echo"] == 2 * n
    assert not df.truncated.any()


def test_bad_segment_size_falls_back_to_the_default() -> None:
    for raw in ("abc", "1000", "-64", "0", str(64 << 30)):
        assert j._segment_bits(raw) == j.LEGACY_SEGMENT_BITS, raw
    assert j._segment_bits("4096") == 6 and j._segment_bits(str(4 << 20)) == 16
