"""No observer effect: turning telemetry on (journal, live OTLP/http export) changes neither
the start method nor the process tree, nor how often the caller's script is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from otlp_receivers import HttpReceiver

SCRIPT = Path(__file__).with_name("observer_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, name: str, extra: dict[str, str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAULTLAB_TRACE_"))}
    env.update({"PYTHONPATH": str(ROOT), **extra})
    counter = tmp_path / f"{name}.imports"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(counter)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_exporters_change_nothing_about_how_the_executor_starts(
    tmp_path: Path, http_receiver: HttpReceiver,
) -> None:
    runs = {
        "none": _run(tmp_path, "none", {}),
        "journal": _run(tmp_path, "journal", {"FAULTLAB_TRACE_DIR": str(tmp_path / "j")}),
        "otlp-http": _run(tmp_path, "otlp", {
            "FAULTLAB_TRACE_DIR": str(tmp_path / "o"), "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint}),
    }
    baseline = runs["none"]
    assert baseline["start_method"] == "fork" and baseline["imports"] == 1
    assert baseline["workers"] == 2 and baseline["workers_are_children"]
    for name, tree in runs.items():
        assert tree == baseline, f"{name} changed the executor: {tree} vs {baseline}"
    assert http_receiver.spans(), "live export was really on"
