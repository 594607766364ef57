"""What the oracles read and report: a recorded run and its violations.

    chaos.scenario ──records──► RunRecord ──► chaos.oracles / chaos.edge_oracles ──► [Violation]

Shared by both oracle modules (and the suites' reports), so neither imports the other's
records: the oracles import this module, and ``chaos.oracles`` lists the around-oracles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chaos.outcomes import Outcome
from chaos.recording import CallRecord


@dataclasses.dataclass(frozen=True)
class Violation:
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.message}"


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Generous bounds: the machine is shared, so they catch hangs, not slowness."""

    deadline_slack_s: float = 1.0
    detect_s: float = 3.0
    shutdown_slack_s: float = 5.0
    exit_s: float = 5.0  # workers must be gone this long after the driver died
    workload_s: float = 60.0


@dataclasses.dataclass
class RunRecord:
    calls: list[CallRecord]
    faults: list[dict[str, Any]]
    callback_times_ns: list[int] = dataclasses.field(default_factory=list)
    failed_at_ns: int | None = None  # when the executor was first seen failed
    shutdown_s: float | None = None
    shutdown_bound_s: float = 10.0
    leaks: list[str] = dataclasses.field(default_factory=list)
    hung: bool = False
    expected: Outcome | None = None
    bounds: Bounds = dataclasses.field(default_factory=Bounds)
    failed_before_shutdown: str | None = None  # the executor's failure, seen before shutdown()
    late_callback_ran: bool | None = None  # registered once failed: it must run at once
    fork_reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    workers_gone: list[str] = dataclasses.field(default_factory=list)  # before shutdown()
    # Every fault of the plan: {"index", "kind", "target", "trigger" (words), "may_not_fire"}.
    planned: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def fatal_faults(self) -> list[dict[str, Any]]:
        """The fatal faults the executor could have seen (``unread_damage`` ones left out)."""
        return [f for f in self.faults if f.get("fatal") and not self.unread_damage(f)]

    def unread_damage(self, fault: dict[str, Any]) -> bool:
        """A reply damaged (``corrupt_queue`` queue "reply") once every call had ended: e.g.
        by a worker SIGSTOPped until the run's end, whose late reply goes out only as it is
        resumed.  Replies are read by the caller that asks (executor/calls.py), so with no
        call left to ask the damage lies unread in the ring; a next call would meet it (and
        the executor fail).  Nothing could detect it before shutdown: no detection is due.
        Nor when every call still running at the damage was given up by a Ctrl-C and none
        began after it (seed 412 of explore: the reply of the call a Ctrl-C cut was damaged
        while the driver sat inside the request's publish; the KeyboardInterrupt ended the
        workload before anything read a reply)."""
        if fault.get("kind") != "corrupt_queue" or fault.get("queue") != "reply" or not self.calls:
            return False
        t = fault["time_ns"]
        if any(c.start_ns > t for c in self.calls):
            return False  # a call made after the damage would meet it
        running = [c for c in self.calls if c.end_ns is None or c.end_ns > t]
        return all(c.end_ns is not None and c.error_type == "KeyboardInterrupt" for c in running)
