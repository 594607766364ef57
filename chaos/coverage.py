"""Coverage of an exploration: which corners of the fault space the runs reached.

    each run: ScenarioResult + its start method + its history ──► Coverage.add
        cells:     (fault kind, phase, method hit, start method, outcome of the hit call)
                   counted for every fault that fired ("at"-timed faults: the run's outcome)
        sites:     every swarm site (chaos.swarm.SITES) that fired at least once
        surroundings: what the runs' faults ran inside (chaos.swarm_surroundings), counted
        sometimes: SOMETIMES, states that must be reached at least once across the runs
                   (Antithesis' "sometimes" assertions), each with why it may not be
    each run of the recovery family (chaos.swarm_recovery) ──► Coverage.add_recovery
        cells:     (fault kind, between steps | before_go_live | replay, "execute_model", "fork",
                   the run's outcome)
        sometimes: "recovery itself was interrupted" when its second fault landed
    Coverage ──► to_dict() (coverage.json) and table() (coverage.md: counts, then what
                 was never reached and why)
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos.faults import MID_REPLY
from chaos.recording import CallRecord
from chaos.recovery import RecoveryResult
from chaos.scenario import ScenarioResult

Run = tuple[ScenarioResult, list[dict[str, Any]]]  # a result and its history
FATAL_KINDS = ("kill_worker", "term_worker")


def _kill_at(*phases: str) -> Callable[[Run], bool]:
    return lambda run: any(f["kind"] in FATAL_KINDS and f.get("phase") in phases for f in run[0].faults)


def _deadline_while_hung(run: Run) -> bool:
    hung = any(f["kind"] == "hang_worker" for f in run[0].faults)
    return hung and any(c.error_type == "TimeoutError" for c in run[0].calls)


def _error(name: str) -> Callable[[Run], bool]:
    return lambda run: any(c.error_type == name for c in run[0].calls)


def _late_reply(run: Run) -> bool:
    """A worker finished a call after the driver had given it up at its deadline."""
    timed_out = {e["call"]: e["t"] for e in run[1] if e.get("error") == "TimeoutError"}
    return any(e["op"] == "exec_end" and e.get("call") in timed_out and e["t"] > timed_out[e["call"]]
               for e in run[1])


def _many_failed(run: Run) -> bool:
    return sum(c.error_type == "ExecutorFailedError" for c in run[0].calls) >= 2


def _stubborn_shutdown(run: Run) -> bool:
    return any(c.method == "sleep" and c.args and c.args[0] == 30.0 for c in run[0].calls)


def _never(run: Run) -> bool:
    return False


INTERRUPTED = "recovery itself was interrupted"  # reached by recovery runs only (add_recovery)


# name -> (predicate, why it may never be reached)
SOMETIMES: dict[str, tuple[Callable[[Run], bool], str]] = {
    "a kill landed between a reply's pickling and its write": (
        _kill_at("before_reply"), "needs kill_worker/term_worker at before_reply to fire"),
    "a kill landed after a reply was out": (
        _kill_at("after_reply"), "needs kill_worker/term_worker at after_reply to fire"),
    "a kill landed while a reply was half written": (
        _kill_at(MID_REPLY), "needs kill_worker/term_worker at mid_reply to hit a reply of "
        "several chunks (a big echo, or a run with small chunks) once one chunk is out"),
    "a deadline expired while a worker was hung": (
        _deadline_while_hung, "needs a hang_worker fault and a call with a deadline after it"),
    "a deadline expired while the ring was full": (
        _error("QueueFullError"), "needs the request ring to fill: a hung worker and enough "
        "calls behind it (the swarm makes at most 11; bursts are chaos.edge_workloads')"),
    "a damaged message was caught by its checksum": (
        _error("CorruptMessageError"), "needs corrupt_queue flip_payload/truncate to fire"),
    "a late reply came after its call timed out": (
        _late_reply, "needs a late sleep whose worker finishes after the deadline"),
    "a Ctrl-C cut a call": (_error("KeyboardInterrupt"), "needs interrupt_driver to land in a call"),
    "a worker death failed several calls at once": (
        _many_failed, "needs a fatal fault with calls still queued"),
    "shutdown met a worker only SIGKILL ends": (
        _stubborn_shutdown, "needs the stubborn_worker site (chaos.stubborn)"),
    INTERRUPTED: (
        _never, "needs a seed of the recovery family (chaos.swarm_recovery, about 1 in 10) "
        "whose second fault (before_live or in_replay) landed while the recovery ran"),
}


CHANCE = ("not this time: a site is on in 1/4 of the runs, drawn among the faults of a run "
          "with up to 2 others, and fires only if a call it watches comes while it can")
SITE_WHY = {
    "interrupt_driver@mid_request": "needs a request of several chunks: only a big echo's "
    "(1 echo in 20 carries 3 MiB), and the site must watch that call",
    "interrupt_driver@mid_reply": "needs a reply of several chunks: every echo of its run is "
    "big, but the site fires only on a call it drew (probability per call)",
}


@dataclasses.dataclass
class Coverage:
    cells: Counter[tuple[str, str, str, str, str]] = dataclasses.field(default_factory=Counter)
    sites: Counter[str] = dataclasses.field(default_factory=Counter)
    sometimes: Counter[str] = dataclasses.field(default_factory=Counter)
    surroundings: Counter[str] = dataclasses.field(default_factory=Counter)  # chaos.swarm_surroundings
    runs: int = 0

    def add(self, result: ScenarioResult, start_method: str, events: list[dict[str, Any]],
            site_of: Callable[[dict[str, Any]], str]) -> None:
        """Count one run; ``site_of`` names the swarm site of a fault-timeline record."""
        self.runs += 1
        for record in result.faults:
            call = _hit_call(result.calls, record)
            outcome = (call.error_type or call.outcome) if call is not None else \
                (result.outcome.value if result.outcome else "-")
            self.cells[(record["kind"], record.get("phase") or "signal",
                        record.get("method") or "-", start_method, outcome)] += 1
            self.sites[site_of(record)] += 1
        for name, (reached, _) in SOMETIMES.items():
            if reached((result, events)):
                self.sometimes[name] += 1

    def add_recovery(self, result: RecoveryResult, sites: list[str], interrupted: bool) -> None:
        """Count one run of the recovery family; ``sites`` names each fault that fired."""
        self.runs += 1
        self.surroundings["recovery"] += 1
        outcome = result.outcome.value if result.outcome else "-"
        for record, site in zip(result.faults, sites, strict=True):
            phase = record.get("during") or "between steps"
            self.cells[(str(record["kind"]), phase, "execute_model", "fork", outcome)] += 1
            self.sites[site] += 1
        if interrupted:
            self.sometimes[INTERRUPTED] += 1

    def never_reached(self) -> list[tuple[str, str]]:
        return [(name, why) for name, (_, why) in SOMETIMES.items() if not self.sometimes[name]]

    def to_dict(self, all_sites: list[str]) -> dict[str, Any]:
        return {"runs": self.runs,
                "cells": [{"kind": k, "phase": p, "method": m, "start_method": s, "outcome": o,
                           "count": n} for (k, p, m, s, o), n in sorted(self.cells.items())],
                "sites": {s: self.sites[s] for s in all_sites},
                "sites_never_fired": [s for s in all_sites if not self.sites[s]],
                "surroundings": dict(sorted(self.surroundings.items())),
                "sometimes": {name: {"reached": self.sometimes[name], "why_not": why}
                              for name, (_, why) in SOMETIMES.items()}}

    def table(self, all_sites: list[str]) -> str:
        lines = [f"# Coverage of {self.runs} explored scenarios", "",
                 "| kind | phase | method | start | outcome of the hit call | count |",
                 "|---|---|---|---|---|---:|"]
        lines += [f"| {k} | {p} | {m} | {s} | {o} | {n} |"
                  for (k, p, m, s, o), n in sorted(self.cells.items())]
        lines += ["", "## Surroundings", "", "| surrounding | runs |", "|---|---:|"]
        lines += [f"| {name} | {n} |" for name, n in sorted(self.surroundings.items())]
        lines += ["", "## Sometimes properties", "", "| property | runs reaching it |", "|---|---:|"]
        lines += [f"| {name} | {self.sometimes[name]} |" for name in SOMETIMES]
        lines += ["", "## Never reached, and why", ""]
        lines += [f"- {name}: {why}" for name, why in self.never_reached()] or ["- (none)"]
        silent = [s for s in all_sites if not self.sites[s]]
        lines += ["", f"## Swarm sites that never fired ({len(silent)} of {len(all_sites)})", ""]
        lines += [f"- {s}: {SITE_WHY.get(s, CHANCE)}" for s in silent] or ["- (none)"]
        return "\n".join(lines) + "\n"


def _hit_call(calls: list[CallRecord], record: dict[str, Any]) -> CallRecord | None:
    """The call a call-triggered fault hit: the k-th call of its method ("*": of any)."""
    method, k = record.get("method"), record.get("call")
    if method is None or not isinstance(k, int):
        return None
    same = [c for c in calls if method == "*" or c.method == method]
    return same[k - 1] if 0 < k <= len(same) else None
