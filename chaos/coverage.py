"""Coverage of an exploration: which corners of the fault space the runs reached.

    each run: ScenarioResult + its start method + its history ──► Coverage.add
        cells:     (fault kind, phase, method hit, start method, outcome of the hit call)
                   counted for every fault that fired ("at"-timed faults: the run's outcome)
        sites:     every swarm site (chaos.swarm.SITES) that fired at least once
        surroundings: what the runs' faults ran inside (chaos.swarm_surroundings), counted
        sometimes: SOMETIMES, states that must be reached at least once across the runs
                   (Antithesis' "sometimes" assertions), each with why it may not be;
                   each names its predicate, looked up in this module when it runs
        pairs:     "pair:A+B" for each two faults of the run that both fired (two indices
                   of its fault timeline, kinds sorted; one fault firing twice is no pair)
    each run of the recovery family (chaos.swarm_recovery) ──► Coverage.add_recovery
        cells:     (fault kind, between steps | before_go_live | replay, "execute_model", "fork",
                   the run's outcome)
        sometimes: "recovery itself was interrupted" when its second fault landed
    Coverage ──► to_dict() (coverage.json) and table() (coverage.md: counts, the two-fault
                 coverage (pairs landed of chaos.swarm.PAIRS, and any other pair that landed),
                 then what was never reached and why)

Recovery runs add no pair cell: their two faults are "recovery itself was interrupted".
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos import swarm
from chaos.faults import MID_REPLY
from chaos.recording import CallRecord
from chaos.recovery import RecoveryResult
from chaos.scenario import ScenarioResult

Run = tuple[ScenarioResult, list[dict[str, Any]]]  # a result and its history
FATAL_KINDS = ("kill_worker", "term_worker")


def _killed_at(run: Run, phase: str) -> bool:
    """A kill or SIGTERM of a worker fired at ``phase``."""
    return any(f["kind"] in FATAL_KINDS and f.get("phase") == phase for f in run[0].faults)


def _kill_before_reply(run: Run) -> bool:
    return _killed_at(run, "before_reply")


def _kill_after_reply(run: Run) -> bool:
    return _killed_at(run, "after_reply")


def _kill_mid_reply(run: Run) -> bool:
    return _killed_at(run, MID_REPLY)


def _deadline_while_hung(run: Run) -> bool:
    hung = any(f["kind"] == "hang_worker" for f in run[0].faults)
    return hung and any(c.error_type == "TimeoutError" for c in run[0].calls)


def _failed_with(run: Run, name: str) -> bool:
    return any(c.error_type == name for c in run[0].calls)


def _ring_full(run: Run) -> bool:
    return _failed_with(run, "QueueFullError")


def _checksum_caught(run: Run) -> bool:
    return _failed_with(run, "CorruptMessageError")


def _ctrl_c(run: Run) -> bool:
    return _failed_with(run, "KeyboardInterrupt")


def _late_reply(run: Run) -> bool:
    """A worker finished a call after the driver had given it up at its deadline."""
    timed_out = {e["call"]: e["t"] for e in run[1] if e.get("error") == "TimeoutError"}
    return any(e["op"] == "exec_end" and e.get("call") in timed_out and e["t"] > timed_out[e["call"]]
               for e in run[1])


def _many_failed(run: Run) -> bool:
    return sum(c.error_type == "ExecutorFailedError" for c in run[0].calls) >= 2


def _stubborn_shutdown(run: Run) -> bool:
    """The swarm's stubborn call ran (chaos.stubborn: recorded as a sleep of its seconds,
    with a deadline far shorter), so shutdown met a worker that ignores SIGTERM."""
    stubborn = swarm.STUBBORN
    return any(c.method == "sleep" and tuple(c.args) == stubborn.args and c.timeout == stubborn.timeout
               for c in run[0].calls)


def _never(run: Run) -> bool:
    return False


INTERRUPTED = "recovery itself was interrupted"  # reached by recovery runs only (add_recovery)


# name -> (the predicate's name in this module, why it may never be reached); ``reached``
# looks each predicate up when it runs (a planted judge replaces the module's function)
SOMETIMES: dict[str, tuple[str, str]] = {
    "a kill landed between a reply's pickling and its write": (
        "_kill_before_reply", "needs kill_worker/term_worker at before_reply to fire"),
    "a kill landed after a reply was out": (
        "_kill_after_reply", "needs kill_worker/term_worker at after_reply to fire"),
    "a kill landed while a reply was half written": (
        "_kill_mid_reply", "needs kill_worker/term_worker at mid_reply to hit a reply of "
        "several chunks (a big echo, or a run with small chunks) once one chunk is out"),
    "a deadline expired while a worker was hung": (
        "_deadline_while_hung", "needs a hang_worker fault and a call with a deadline after it"),
    "a deadline expired while the ring was full": (
        "_ring_full", "needs the request ring to fill: a hung worker and enough "
        "calls behind it (the swarm makes at most 11; bursts are chaos.edge_workloads')"),
    "a damaged message was caught by its checksum": (
        "_checksum_caught", "needs corrupt_queue flip_payload/truncate to fire"),
    "a late reply came after its call timed out": (
        "_late_reply", "needs a late sleep whose worker finishes after the deadline"),
    "a Ctrl-C cut a call": ("_ctrl_c", "needs interrupt_driver to land in a call"),
    "a worker death failed several calls at once": (
        "_many_failed", "needs a fatal fault with calls still queued"),
    "shutdown met a worker only SIGKILL ends": (
        "_stubborn_shutdown", "needs the stubborn_worker site (chaos.stubborn)"),
    INTERRUPTED: (
        "_never", "needs a seed of the recovery family (chaos.swarm_recovery, about 1 in 10) "
        "whose second fault (before_live or in_replay) landed while the recovery ran"),
}


def reached(name: str, run: Run) -> bool:
    """Whether ``run`` reaches the sometimes property ``name``."""
    predicate: Callable[[Run], bool] = globals()[SOMETIMES[name][0]]
    return bool(predicate(run))


def landed_pairs(timeline: list[dict[str, Any]]) -> list[str]:
    """The two-fault cells of one run: each pair of faults of its plan that both fired (two
    fault indices in the timeline; a fault that fired twice is one), as ``pair_cell``."""
    kinds: dict[int, str] = {}
    for record in timeline:
        kinds.setdefault(record["index"], str(record["kind"]))
    return sorted({swarm.pair_cell(kinds[i], kinds[j])
                   for i, j in itertools.combinations(sorted(kinds), 2)})


def pairs_possible() -> list[str]:
    """The pair cells the swarm draws on purpose (chaos.swarm.PAIRS), in its rotation order."""
    return list(dict.fromkeys(swarm.pair_cell(a, b) for a, b in swarm.PAIRS))


def _cell(record: dict[str, Any], call: CallRecord | None, start_method: str,
          result: ScenarioResult) -> tuple[str, str, str, str, str]:
    """The coverage cell of one fired fault."""
    outcome = (call.error_type or call.outcome) if call is not None else \
        (result.outcome.value if result.outcome else "-")
    return (record["kind"], record.get("phase") or "signal", record.get("method") or "-",
            start_method, outcome)


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
    pairs: Counter[str] = dataclasses.field(default_factory=Counter)  # "pair:A+B" -> runs
    runs: int = 0

    def add(self, result: ScenarioResult, start_method: str, events: list[dict[str, Any]],
            site_of: Callable[[dict[str, Any]], str]) -> None:
        """Count one run; ``site_of`` names the swarm site of a fault-timeline record."""
        self.runs += 1
        for record in result.faults:
            self.cells[_cell(record, _hit_call(result.calls, record), start_method, result)] += 1
            self.sites[site_of(record)] += 1
        for name in SOMETIMES:
            if reached(name, (result, events)):
                self.sometimes[name] += 1
        for pair in landed_pairs(result.faults):
            self.pairs[pair] += 1

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

    def pairs_never_landed(self) -> list[str]:
        return [p for p in pairs_possible() if not self.pairs[p]]

    def two_fault_lines(self) -> list[str]:
        """coverage.md's two-fault section: pairs landed of pairs possible, each pair's runs."""
        possible = pairs_possible()
        landed = [p for p in possible if self.pairs[p]]
        others = sorted(p for p in self.pairs if p not in possible)
        lines = ["## Two-fault coverage", "",
                 f"{len(landed)} of {len(possible)} pairs landed (both faults of the pair fired "
                 f"in one run; chaos.swarm draws each in turn, one seed in {swarm.PAIR_EVERY})", "",
                 "| pair | runs |", "|---|---:|"]
        lines += [f"| {p} | {self.pairs[p]} |" for p in possible]
        lines += ["", "Never landed: " + (", ".join(self.pairs_never_landed()) or "(none)")]
        if others:
            lines += ["", "Also landed (pairs the swarm does not draw on purpose):", ""]
            lines += [f"- {p}: {self.pairs[p]}" for p in others]
        return lines

    def to_dict(self, all_sites: list[str]) -> dict[str, Any]:
        return {"runs": self.runs,
                "cells": [{"kind": k, "phase": p, "method": m, "start_method": s, "outcome": o,
                           "count": n} for (k, p, m, s, o), n in sorted(self.cells.items())],
                "sites": {s: self.sites[s] for s in all_sites},
                "sites_never_fired": [s for s in all_sites if not self.sites[s]],
                "surroundings": dict(sorted(self.surroundings.items())),
                "sometimes": {name: {"reached": self.sometimes[name], "why_not": why}
                              for name, (_, why) in SOMETIMES.items()},
                "pairs": {"landed": dict(sorted(self.pairs.items())),
                          "possible": pairs_possible(),
                          "never_landed": self.pairs_never_landed()}}

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
        lines += ["", *self.two_fault_lines()]
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
