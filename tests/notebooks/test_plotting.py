"""``telemetry.plotting``: fault/detection pairing, latency table, and the timeline drawing.

Synthetic runs (frames shaped like ``telemetry.load_run``) pin the pairing rules; one real
chaos scenario checks that a recorded run reads and draws end to end.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import telemetry  # noqa: E402
from telemetry.frames import SPAN_COLUMNS  # noqa: E402
from telemetry.plotting import (  # noqa: E402
    detection_latencies,
    events_from_spans,
    fault_detections,
    lanes_of,
    plot_timeline,
)

MS = 1_000_000
T0 = 1_800_000_000_000_000_000
DRIVER, W0, W1 = 100, 200, 201
_ids = itertools.count(1)


def span(name: str, pid: int, start_ms: float, end_ms: float | None, *, status: str = "OK",
         parent: str | None = None, point: bool = False, attributes: dict[str, Any] | None = None,
         events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    role, rank = {DRIVER: ("driver", None), W0: ("worker", 0), W1: ("worker", 1)}[pid]
    start = T0 + int(start_ms * MS)
    end = None if end_ms is None else T0 + int(end_ms * MS)
    return {
        "name": name, "trace_id": "ab" * 16, "span_id": f"{next(_ids):016x}",
        "parent_span_id": parent, "pid": pid, "rank": rank, "role": role, "service": "t",
        "tid": 1, "thread_name": "MainThread", "start_ns": start, "end_ns": end,
        "duration_ns": None if end is None else end - start, "last_seen_ns": end or start,
        "status": status if end is not None else "UNSET", "status_message": "",
        "truncated": end is None, "point": point, "attributes": attributes or {},
        "events": events or [],
    }


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    data = pd.DataFrame(rows, columns=SPAN_COLUMNS)
    for column in ("pid", "rank", "start_ns", "end_ns", "duration_ns", "last_seen_ns"):
        data[column] = pd.array(data[column].tolist(), dtype="Int64")
    return data.sort_values("start_ns", kind="stable").reset_index(drop=True)


def fault(pid: int, at_ms: float, kind: str, rank: int) -> dict[str, Any]:
    return span("chaos.fault", DRIVER, at_ms + 0.05, at_ms + 0.06, point=True, attributes={
        "chaos.kind": kind, "chaos.time_ns": T0 + int(at_ms * MS), "faultlab.rank": rank,
        "process.pid": pid})


def death(pid: int, rank: int, detected_ms: float) -> dict[str, Any]:
    return span("executor.worker_death", DRIVER, detected_ms + 0.2, detected_ms + 0.3, point=True,
                attributes={"faultlab.rank": rank, "process.pid": pid, "process.exit.code": -9,
                            "faultlab.detected_ns": T0 + int(detected_ms * MS)})


def timeout(at_ms: float) -> dict[str, Any]:
    return {"name": "exception", "time_ns": T0 + int(at_ms * MS),
            "attributes": {"exception.type": "TimeoutError"}}


@pytest.fixture
def killed_run() -> pd.DataFrame:
    """rank 1 SIGKILLed at 10 ms inside sleep; the monitor sees it at 13 ms."""
    rpc = span("rpc sleep", DRIVER, 5, 15, status="ERROR")
    return frame([
        span("executor.startup", DRIVER, 0, 4), rpc,
        span("executor.enqueue", DRIVER, 5.1, 5.3, parent=rpc["span_id"]),
        span("worker.execute sleep", W0, 6, None, parent=rpc["span_id"]),
        span("worker.execute sleep", W1, 6, None, parent=rpc["span_id"]),
        fault(W1, 10, "kill_worker", 1), death(W1, 1, 13),
        span("executor.shutdown", DRIVER, 15, 20),
    ])


def test_a_kill_is_detected_by_the_death_of_its_victim(killed_run: pd.DataFrame) -> None:
    table = detection_latencies(killed_run)
    assert list(table.columns) == ["fault_kind", "rank", "pid", "fault_ns", "detected_ns",
                                   "detected_by", "latency_ms"]
    row = table.iloc[0]
    assert (row.fault_kind, row["rank"], row.pid, row.detected_by) == ("kill_worker", 1, W1, "worker_death")
    assert row.latency_ms == pytest.approx(3.0)


def test_a_death_of_another_process_does_not_detect_the_fault() -> None:
    run = frame([span("rpc echo", DRIVER, 0, 30, status="ERROR", events=[timeout(30)]),
                 fault(W1, 10, "kill_worker", 1), death(W0, 0, 12)])
    (detection,) = fault_detections(events_from_spans(run))
    assert detection.detected_by == "TimeoutError"
    assert detection.latency_ms == pytest.approx(20.0)


def test_a_hang_is_detected_by_the_first_error_after_it() -> None:
    run = frame([
        span("rpc echo", DRIVER, 0, 2, status="ERROR", events=[timeout(2)]),  # before: not it
        span("rpc sleep", DRIVER, 5, 305, status="ERROR", events=[timeout(305)]),
        fault(W1, 5, "hang_worker", 1),
        span("rpc echo", DRIVER, 306, 606, status="ERROR", events=[timeout(606)]),
    ])
    row = detection_latencies(run).iloc[0]
    assert (row.fault_kind, row.detected_by) == ("hang_worker", "TimeoutError")
    assert row.latency_ms == pytest.approx(300.0)


def test_an_unnoticed_fault_has_no_latency() -> None:
    run = frame([span("rpc sleep", DRIVER, 0, None), fault(DRIVER, 3, "kill_driver", 0)])
    row = detection_latencies(run).iloc[0]
    assert row.detected_ns is pd.NA and pd.isna(row.latency_ms) and row.detected_by is None


def test_a_run_without_faults_gives_an_empty_table() -> None:
    table = detection_latencies(frame([span("rpc echo", DRIVER, 0, 1)]))
    assert table.empty and "latency_ms" in table.columns


def test_lanes_are_drivers_then_workers_by_rank_then_chaos(killed_run: pd.DataFrame) -> None:
    shuffled = killed_run.sample(frac=1.0, random_state=3)
    labels = [lane.label for lane in lanes_of(shuffled, with_chaos=True)]
    assert labels == [f"driver (pid {DRIVER})", f"worker 0 (pid {W0})", f"worker 1 (pid {W1})", "chaos"]
    assert [lane.label for lane in lanes_of(shuffled, with_chaos=False)][-1].startswith("worker 1")


def _bars(ax: Any) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_timeline_draws_lanes_bars_and_marks(killed_run: pd.DataFrame) -> None:
    fig, ax = plt.subplots()
    try:
        assert plot_timeline(killed_run, ax=ax, title="kill") is ax
        assert [t.get_text() for t in ax.get_yticklabels()][-1] == "chaos"
        assert ax.get_title(loc="left") == "kill"
        hatched = [b for b in _bars(ax) if b.get_hatch()]
        ends = sorted(round(b.get_x() + b.get_width(), 3) for b in hatched)
        # the victim's open span stops at its detected death, the survivor's at the run's end
        assert ends == [13.0, 20.0]
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "kill_worker rank 1" in texts and "detected after 3.0 ms (worker_death)" in texts
    finally:
        plt.close(fig)


def test_timeline_crops_to_a_window(killed_run: pd.DataFrame) -> None:
    ax = plot_timeline(killed_run, start_ns=T0 + 8 * MS, end_ns=T0 + 16 * MS)
    try:
        low, high = ax.get_xlim()
        assert low < 0 < 8 < high < 8.5
        assert all(b.get_x() >= -1e-9 for b in _bars(ax) if b.get_width() > 0)
    finally:
        plt.close("all")


def test_timeline_without_faults_has_no_chaos_lane() -> None:
    ax = plot_timeline(frame([span("rpc echo", DRIVER, 0, 1), span("worker.execute echo", W0, 0.2, 0.5)]))
    try:
        assert [t.get_text() for t in ax.get_yticklabels()] == [f"driver (pid {DRIVER})",
                                                                 f"worker 0 (pid {W0})"]
    finally:
        plt.close("all")


def test_a_recorded_scenario_reads_and_draws(tmp_path: Path) -> None:
    from chaos import FaultPlan, KillWorker, run_scenario
    from chaos.workloads import CallSpec, rpc_sequence
    from executor import ExecutorConfig

    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2)
    workload = rpc_sequence([CallSpec("echo", (1,), timeout=5.0), CallSpec("sleep", (0.3,), timeout=2.0)])
    result = run_scenario(cfg, workload, FaultPlan([KillWorker(rank=1, on_call=("sleep", 1))]),
                          tmp_path / "kill")
    spans, events = telemetry.load_run(result.trace_dir), telemetry.load_events(result.trace_dir)
    row = detection_latencies(result.trace_dir).iloc[0]
    assert (row.fault_kind, row["rank"], row.detected_by) == ("kill_worker", 1, "worker_death")
    assert 0 < row.latency_ms < 1000
    rebuilt = events_from_spans(spans)
    assert sorted(rebuilt.name) == sorted(events.name)
    assert detection_latencies(spans).equals(detection_latencies(events))
    ax = plot_timeline(result.trace_dir)
    try:
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels[0].startswith("driver") and labels[-1] == "chaos" and len(labels) == 4
        plt.savefig(tmp_path / "timeline.png")
    finally:
        plt.close("all")
