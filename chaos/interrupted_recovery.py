"""The second fault of a recovery scenario: one that lands while the recovery itself runs.

    first fault (chaos.recovery.inject, after a seeded step) ─► the engine's next step fails
      └─► Recovery.recover ─► executor.restart ─► start_incarnation: new workers, all READY
            │  "before_live": the failpoint driver.before_go_live fires: SIGKILL rank R of
            │                 the new incarnation, then wait until that incarnation's monitor
            │                 has reported the death (to an executor that is still failed)
            ├─► the swap: the new incarnation serves.  A correct restart looks at its new
            │   workers once more after the swap, finds the dead one and retries (one more
            │   attempt of the same restart, no second recovery)
            └─► the rebuild: every request replays its kept tokens, one step each
                  "in_replay": after the first replay step, while a request still replays,
                               SIGKILL rank R: a second recovery, which must succeed too

Checked here (``violations``), beside the first fault's oracles (every request finished,
the fault-free tokens, the recovery bound; a second fault costs time, never tokens):
- the second fault fired: a scenario whose second fault never landed tested nothing;
- "before_live": the killed worker never serves: right after the step that recovered, its
  pid is not among the executor's worker pids (``MissesEarlyRestartDeath`` of chaos.mutants
  breaks this: it goes live with the dead worker, and the next step fails on it).
Every worker pid the second fault saw is handed to the run's leak check (``pids``).

The failpoint is a driver-process global: ``arm`` turns it on, ``disarm`` (always called,
pass or fail) turns it off; it fires once.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

from chaos.control import trace_fault
from chaos.oracles import Violation
from executor import failpoints

SECOND_FAULTS = ("before_live", "in_replay")
POINT = "driver.before_go_live"
MONITOR_WAIT_S = 10.0  # the new incarnation's monitor reports a SIGKILLed worker within this


@dataclasses.dataclass
class SecondFault:
    """A SIGKILL of rank ``rank`` while a recovery runs (module docstring)."""

    when: str  # one of SECOND_FAULTS
    rank: int
    seed: int | None = None
    pids: list[int] = dataclasses.field(default_factory=list)  # every worker pid it saw
    record: dict[str, Any] | None = None  # the fault as it fired (None: it never did)
    serving_dead: str = ""  # set when a worker killed before going live served
    _checked: bool = False
    _steps_since: int = 0  # steps after the first recovery (the first of them replays)

    def __post_init__(self) -> None:
        if self.when not in SECOND_FAULTS:
            raise ValueError(f"second fault must be one of {SECOND_FAULTS}, got {self.when!r}")

    def arm(self) -> None:
        """Called once the first fault has hit."""
        if self.when == "before_live":
            failpoints.enable(POINT, self._kill_before_live)

    def disarm(self) -> None:
        if self.when == "before_live":
            failpoints.disable(POINT)

    def after_step(self, ex: Any, engine: Any) -> None:
        """Called after every engine step once the first fault has hit."""
        records = engine.recovery.records if engine.recovery is not None else []
        if not records:
            return
        self._steps_since += 1
        if self.when == "before_live" and self.record is not None and not self._checked:
            self._checked = True
            victim = self.record["pid"]
            if victim in ex.worker_pids:
                self.serving_dead = (f"rank {self.rank} (pid {victim}) was SIGKILLed before its "
                                     f"incarnation went live, and serves after the restart "
                                     f"(worker pids {ex.worker_pids})")
        if self.when == "in_replay" and self.record is None and self._steps_since > 1 and any(
                r.replay is not None for r in engine.unfinished_requests):
            self.pids += [p for p in ex.worker_pids if p not in self.pids]
            self._kill(ex.worker_pids[self.rank], {"during": "replay",
                                                   "incarnation": ex.incarnation})

    def _kill_before_live(self, resources: Any, incarnation: int, **_: Any) -> None:
        failpoints.disable(POINT)  # once: the retried attempt goes live untouched
        self.pids += [h.pid for h in resources.handles if h.pid not in self.pids]
        self._kill(resources.handles[self.rank].pid, {"during": "before_go_live",
                                                       "incarnation": incarnation})
        if resources.monitor is not None:  # its report now finds the executor still failed
            resources.monitor.join(MONITOR_WAIT_S)

    def _kill(self, pid: int, where: dict[str, Any]) -> None:
        self.record = {"kind": "kill_worker", "rank": self.rank, "pid": pid, "phase": "signal",
                       "second": True, "then": self.when, **where, "t": time.perf_counter()}
        trace_fault(self.record, self.seed)
        os.kill(pid, signal.SIGKILL)

    def violations(self) -> list[Violation]:
        if self.record is None:
            return [Violation("fault", f"the second fault ({self.when}, rank {self.rank}) never "
                                       "landed: no recovery ran, or none was left to interrupt")]
        return [Violation("restart", self.serving_dead)] if self.serving_dead else []
