"""Planted judges of coverage and of the swarm's own promises (what explore says it reached).

    judge (where)                          planted bug
    coverage._kill_before_reply            "a kill between a reply's pickling and its write"
                                           read at before_pickle_reply (the wrong phase)
    coverage._deadline_while_hung          any deadline counts, hung worker or not
    coverage._late_reply                   a timed-out call's execution ending counts as
                                           late whenever it ended (before its deadline too)
    coverage._cell                         the start method dropped: two cells merged
    coverage._hit_call                     a fault's outcome read from the first call of its
                                           method, not the k-th it hit
    coverage.landed_pairs                  a pair counted over timeline records: one fault
                                           that fired twice is a pair with itself
    swarm.pair_cell                        "pair:A+B" in the order the kinds came (a pair is
                                           two cells, and never one the swarm draws)
    coverage.Coverage.pairs_never_landed   every pair told as landed
    swarm.DEADLINE_SLACK_S                 the fault-free deadline model's slack 0.2 s, not 1 s
    swarm.deadline_misses                  each call checked alone (the sleeps queued before
                                           it forgotten)
    swarm.pair_of                          the rotation stuck on its first pair
    swarm._pair_faults                     both faults of a pair on one rank (a worker killed
                                           first never serves the second's point)

Their cases: ``tests/judges/test_judges_coverage.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from chaos.planted_judges import PlantedJudge

Pred = Callable[[Any], bool]


def _wrong_phase(original: Pred) -> Pred:
    from chaos import coverage

    return lambda run: coverage._killed_at(run, "before_pickle_reply")


def _ignores_the_hang(original: Pred) -> Pred:
    return lambda run: any(c.error_type == "TimeoutError" for c in run[0].calls)


def _late_at_any_time(original: Pred) -> Pred:
    def late_reply(run: Any) -> bool:
        timed_out = {e["call"] for e in run[1] if e.get("error") == "TimeoutError"}
        return any(e["op"] == "exec_end" and e.get("call") in timed_out for e in run[1])
    return late_reply


def _merged_start(original: Callable[..., tuple[str, ...]]) -> Callable[..., tuple[str, ...]]:
    def cell(record: Any, call: Any, start_method: str, result: Any) -> tuple[str, ...]:
        return original(record, call, "-", result)
    return cell


def _first_of_method(original: Callable[..., Any]) -> Callable[..., Any]:
    def hit_call(calls: list[Any], record: dict[str, Any]) -> Any:
        return original(calls, {**record, "call": 1} if isinstance(record.get("call"), int) else record)
    return hit_call


def _pairs_over_records(original: Callable[..., list[str]]) -> Callable[..., list[str]]:
    from chaos import swarm

    def landed_pairs(timeline: list[dict[str, Any]]) -> list[str]:
        kinds = [str(r["kind"]) for r in timeline]
        return sorted({swarm.pair_cell(a, b) for i, a in enumerate(kinds) for b in kinds[i + 1:]})
    return landed_pairs


def _unsorted(original: Callable[[str, str], str]) -> Callable[[str, str], str]:
    return lambda a, b: f"pair:{a}+{b}"


def _all_landed(original: Callable[[Any], list[str]]) -> Callable[[Any], list[str]]:
    return lambda self: []


def _backlog_forgotten(original: Callable[[Any], list[str]]) -> Callable[[Any], list[str]]:
    def deadline_misses(calls: Any) -> list[str]:
        return [miss.replace("call 0", f"call {i}") for i, c in enumerate(calls)
                for miss in original([c])]
    return deadline_misses


def _stuck_rotation(original: Callable[[int], Any]) -> Callable[[int], Any]:
    from chaos import swarm

    return lambda seed: None if original(seed) is None else swarm.PAIRS[0]


def _one_rank(original: Callable[..., Any]) -> Callable[..., Any]:
    def pair_faults(*args: Any) -> Any:
        faults = original(*args)
        return tuple(dataclasses.replace(f, rank=faults[0].rank) for f in faults)
    return pair_faults


PLANTED: list[PlantedJudge] = [
    PlantedJudge("coverage_kill_reads_wrong_phase", "chaos.coverage:_kill_before_reply",
                 "a kill between pickling and writing a reply read at before_pickle_reply",
                 _wrong_phase),
    PlantedJudge("coverage_deadline_ignores_hang", "chaos.coverage:_deadline_while_hung",
                 "a deadline while hung counts any deadline, with no hung worker", _ignores_the_hang),
    PlantedJudge("coverage_late_reply_any_time", "chaos.coverage:_late_reply",
                 "a timed-out call's execution counts as late even when it ended first",
                 _late_at_any_time),
    PlantedJudge("coverage_cell_merges_start_method", "chaos.coverage:_cell",
                 "the cell forgets the start method: two runs' cells merged", _merged_start),
    PlantedJudge("coverage_cell_outcome_of_first_call", "chaos.coverage:_hit_call",
                 "a fault's outcome taken from the first call of its method", _first_of_method),
    PlantedJudge("coverage_pair_when_one_fired", "chaos.coverage:landed_pairs",
                 "a fault that fired twice counted as a pair", _pairs_over_records),
    PlantedJudge("coverage_pair_cell_unsorted", "chaos.swarm:pair_cell",
                 "a pair's cell in the kinds' order, so one pair is two cells", _unsorted),
    PlantedJudge("coverage_pairs_never_landed_empty", "chaos.coverage:Coverage.pairs_never_landed",
                 "every pair told as landed", _all_landed),
    PlantedJudge("coverage_deadline_slack_off", "chaos.swarm:DEADLINE_SLACK_S",
                 "the swarm's deadlines 0.2 s beyond the queued sleeps, not 1 s",
                 lambda original: 0.2),
    PlantedJudge("coverage_deadline_check_forgets_backlog", "chaos.swarm:deadline_misses",
                 "the deadline model checks each call alone, the sleeps before it forgotten",
                 _backlog_forgotten),
    PlantedJudge("coverage_pair_rotation_stuck", "chaos.swarm:pair_of",
                 "every pair seed draws the first pair", _stuck_rotation),
    PlantedJudge("coverage_pair_on_one_rank", "chaos.swarm:_pair_faults",
                 "both faults of a pair on one rank", _one_rank),
]
