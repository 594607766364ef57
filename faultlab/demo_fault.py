"""The fault ``faultlab demo`` injects by default, and the recovery timeline it prints.

    engine.generate(progress=DemoFault) ─ after step N: SIGKILL (or SIGTERM, SIGSTOP, queue
    damage) to worker rank R ─► the engine detects it ─► restart policy: new incarnation,
    requests rebuilt ─► first new token
    timeline(): fault ─► detection ─► restart ─► first token, in ms after the fault
    failed_trace_report(): the trace id of each failed RPC, and how to find it in Jaeger

The fault is injected from the driver (``chaos.recovery.inject``), at a step boundary, so a
seed, a step and a rank name one run exactly.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

FAULTS = ("kill", "sigterm", "hang", "corrupt")
_WHAT = {"kill": "SIGKILL", "sigterm": "SIGTERM", "hang": "SIGSTOP (a hang)",
         "corrupt": "rpc queue damage"}


@dataclasses.dataclass
class DemoFault:
    """Injects ``kind`` into worker ``rank`` once ``step`` steps have completed."""

    kind: str
    step: int
    rank: int
    executor: Any = None
    fired_at: float | None = None
    pid: int = 0

    def __call__(self, stats: Any) -> None:
        if self.fired_at is None and stats.steps >= self.step and self.executor is not None:
            from chaos.recovery import inject

            self.pid = self.executor.worker_pids[self.rank]
            self.fired_at = time.perf_counter()
            inject(self.executor, self.kind, self.rank)

    def describe(self) -> str:
        target = "the rpc queue" if self.kind == "corrupt" else f"worker rank {self.rank} " \
                                                                 f"(pid {self.pid})"
        return f"{_WHAT[self.kind]} to {target} after step {self.step}"


def timeline(fault: DemoFault, recovery: Any) -> list[tuple[float, str, str]]:
    """(ms after the fault, event, detail) rows; empty if the fault never fired."""
    if fault.fired_at is None:
        return []
    rows = [(0.0, "fault", fault.describe())]
    for record in recovery.records if recovery is not None else []:
        rows.append(((record.detected_at - fault.fired_at) * 1e3, "detection", record.cause))
        rows.append(((record.restarted_at - fault.fired_at) * 1e3, "restart",
                     f"incarnation {record.incarnation} ready; {record.requests_rebuilt} "
                     f"requests to rebuild ({record.tokens_recomputed} tokens recomputed)"))
        if record.first_token_at is not None:
            rows.append(((record.first_token_at - fault.fired_at) * 1e3, "first token",
                         "generation resumed"))
    return rows


def trace_dir() -> str | None:
    from telemetry.config import TRACE_DIR_ENV

    return os.environ.get(TRACE_DIR_ENV) or None


def failed_trace_report() -> tuple[list[dict[str, str]], list[str]]:
    """The failed RPCs' traces of this run (as JSON rows, and as lines saying how to find
    them in Jaeger); nothing when the run is not traced."""
    from faultlab.trace_hint import describe, failed_traces

    where = trace_dir()
    if where is None:
        return [], []
    failed = failed_traces(where)
    return [dataclasses.asdict(f) for f in failed], describe(failed, where)


def trace_location() -> str:
    from telemetry.config import TRACE_DIR_ENV

    where = trace_dir()
    if where:
        return f"trace: {where} (faultlab trace export {where})"
    return f"trace: not recorded (set {TRACE_DIR_ENV}=DIR to record one)"
