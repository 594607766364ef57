"""Coverage's judges and the swarm's promises, proven on made-up runs (issue 31).

Each case is a plain function asserting one verdict on a hand-made run (a ScenarioResult, its
fault timeline and history built here) or on the swarm's pure draw; a fire case and its quiet
twin differ in one fact.  Every plant of ``chaos/planted_judges/coverage.py`` must make at
least one case fail.

    judge                                   cases
    each "sometimes" predicate              fires on its run (and only it does); quiet on the
                                            twin: another phase, another kind, no hang, an
                                            end before the deadline, one death, a 40 s sleep
    the cells                               two start methods are two cells, one is one; the
                                            outcome is the k-th call's the fault hit
    two-fault cells                         two faults fired: their pair (either order, one
                                            cell, one the swarm draws); one fault fired twice
                                            or one of two fired: none; coverage.md/json say
                                            pairs landed of pairs possible
    the fault-free deadline model           a made-up schedule that keeps it / its twin with a
                                            deadline short of the queued sleeps; every drawn
                                            seed keeps it; one real fault-free run meets it
                                            (``test_a_fault_free_run_meets_every_deadline``)
    the pair draw                           a pair seed per PAIR_EVERY, every pair once per
                                            rotation, on two ranks and one early call; the
                                            same seed the same swarm (in another process too)
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from judge_cases import Case, assert_caught, case_id

from chaos import coverage, swarm, swarm_recovery
from chaos.coverage import INTERRUPTED, SOMETIMES, Coverage
from chaos.outcomes import Outcome
from chaos.planted_judges import planted_in
from chaos.recording import CallRecord
from chaos.recovery import RecoveryResult
from chaos.scenario import ScenarioResult
from chaos.workloads import CallSpec

# A plant replaces a module attribute: cases reach judges through their module
# (``coverage.reached``, ``swarm.draw``), never through a name imported before the plant.
NOWHERE = Path("/nonexistent")
BETWEEN = "a kill landed between a reply's pickling and its write"
AFTER = "a kill landed after a reply was out"
HALF = "a kill landed while a reply was half written"
HUNG = "a deadline expired while a worker was hung"
RING = "a deadline expired while the ring was full"
CHECKSUM = "a damaged message was caught by its checksum"
LATE = "a late reply came after its call timed out"
CTRL_C = "a Ctrl-C cut a call"
MANY = "a worker death failed several calls at once"
STUBBORN = "shutdown met a worker only SIGKILL ends"
S = 1_000_000_000


def _fault(index: int, kind: str, phase: str | None = "before_reply", method: str = "echo",
           call: int = 1, rank: int = 1) -> dict[str, Any]:
    return {"index": index, "kind": kind, "rank": rank, "pid": 100 + index, "phase": phase,
            "msg_id": call, "call": call, "method": method, "by": "failpoint"}


def _call(index: int, method: str = "echo", error_type: str = "", timeout: float | None = 1.0,
          args: tuple[Any, ...] = ("x",)) -> CallRecord:
    return CallRecord(index=index, method=method, args=args, timeout=timeout, non_block=True,
                      unique_reply_rank=None, expected=None, start_ns=index * S, start=float(index),
                      outcome="error" if error_type else "ok", error_type=error_type)


def _result(faults: list[dict[str, Any]], calls: list[CallRecord] | None = None) -> ScenarioResult:
    return ScenarioResult(name="made-up", seed=0, violations=[], trace_dir=NOWHERE,
                          out_dir=NOWHERE, calls=calls if calls is not None else [_call(0)],
                          faults=faults, fired_points={}, expected=None, outcome=None,
                          detection_latency_s=None, shutdown_s=None, wall_s=1.0, unfired=[])


def _reached(result: ScenarioResult, events: list[dict[str, Any]] | None = None) -> set[str]:
    return {name for name in SOMETIMES if coverage.reached(name, (result, events or []))}


def _counted(*results: tuple[ScenarioResult, str]) -> Coverage:
    cov = Coverage()
    for result, start in results:
        cov.add(result, start, [], lambda record: "site")
    return cov


# -- each "sometimes" predicate: fires on its run, quiet on the twin -------------------------

def fire_kill_between_pickling_and_write() -> None:
    assert _reached(_result([_fault(0, "term_worker", "before_reply")])) == {BETWEEN}


def quiet_kill_before_pickling() -> None:  # the twin: one phase earlier
    assert _reached(_result([_fault(0, "term_worker", "before_pickle_reply")])) == set()


def quiet_hang_between_pickling_and_write() -> None:  # the twin: not a kill
    assert _reached(_result([_fault(0, "hang_worker", "before_reply")])) == set()


def fire_kill_after_reply() -> None:
    assert _reached(_result([_fault(0, "kill_worker", "after_reply")])) == {AFTER}


def quiet_kill_after_execute() -> None:
    assert _reached(_result([_fault(0, "kill_worker", "after_execute")])) == set()


def fire_kill_mid_reply() -> None:
    assert _reached(_result([_fault(0, "kill_worker", "mid_reply")])) == {HALF}


def quiet_exit_mid_reply() -> None:  # os._exit(0) is no kill
    assert _reached(_result([_fault(0, "exit_worker", "mid_reply")])) == set()


def fire_deadline_while_hung() -> None:
    run = _result([_fault(0, "hang_worker", "before_execute")], [_call(0, error_type="TimeoutError")])
    assert _reached(run) == {HUNG}


def quiet_deadline_while_slow() -> None:  # the twin: a slow worker, not a hung one
    run = _result([_fault(0, "slow_worker", "before_execute")], [_call(0, error_type="TimeoutError")])
    assert _reached(run) == set()


def quiet_hung_with_no_deadline() -> None:  # the twin: every call answered
    assert _reached(_result([_fault(0, "hang_worker", "before_execute")], [_call(0)])) == set()


def fire_ring_full() -> None:
    assert _reached(_result([], [_call(0, error_type="QueueFullError")])) == {RING}


def fire_checksum_caught() -> None:
    assert _reached(_result([], [_call(0, error_type="CorruptMessageError")])) == {CHECKSUM}


def fire_ctrl_c() -> None:
    assert _reached(_result([], [_call(0, error_type="KeyboardInterrupt")])) == {CTRL_C}


def quiet_worker_error() -> None:  # none of the three error-named cells
    assert _reached(_result([], [_call(0, error_type="WorkerError")])) == set()


def _late_history(end_s: float) -> list[dict[str, Any]]:
    return [{"op": "invoke", "call": 0, "t": 0}, {"op": "info", "call": 0, "t": 1 * S,
                                                  "error": "TimeoutError"},
            {"op": "exec_start", "call": 0, "t": S // 10}, {"op": "exec_end", "call": 0,
                                                            "t": int(end_s * S)}]


def fire_late_reply() -> None:
    run = _result([], [_call(0, "sleep", "TimeoutError", 0.1, (0.3,))])
    assert _reached(run, _late_history(1.2)) == {LATE}


def quiet_reply_before_the_deadline() -> None:  # the twin: the worker ended before it
    run = _result([], [_call(0, "sleep", "TimeoutError", 0.1, (0.3,))])
    assert _reached(run, _late_history(0.9)) == set()


def fire_many_failed() -> None:
    run = _result([_fault(0, "kill_worker", "before_execute")],
                  [_call(0, error_type="ExecutorFailedError"), _call(1, error_type="ExecutorFailedError")])
    assert _reached(run) == {MANY}


def quiet_one_failed() -> None:
    run = _result([_fault(0, "kill_worker", "before_execute")],
                  [_call(0, error_type="ExecutorFailedError"), _call(1)])
    assert _reached(run) == set()


def fire_stubborn_shutdown() -> None:
    run = _result([], [_call(0, "sleep", "TimeoutError", swarm.STUBBORN.timeout, (30.0,))])
    assert _reached(run) == {STUBBORN}


def quiet_a_long_sleep_with_its_time() -> None:  # the twin: a 30 s sleep given 40 s
    assert _reached(_result([], [_call(0, "sleep", "", 40.0, (30.0,))])) == set()


def quiet_interrupted_only_by_recovery() -> None:  # add() never reaches it; add_recovery does
    cov = _counted((_result([_fault(0, "kill_worker", "before_reply"),
                             _fault(1, "kill_worker", "before_reply", rank=0)]), "fork"))
    assert cov.sometimes[INTERRUPTED] == 0 and INTERRUPTED in dict(cov.never_reached())


def _recovery(*faults: dict[str, Any]) -> RecoveryResult:
    return RecoveryResult(name="made-up", seed=0, violations=[], out_dir=NOWHERE,
                          expected=Outcome.RECOVER, outcome=Outcome.RECOVER, wall_s=1.0,
                          fault_step=2, faults=list(faults))


FIRST_KILL = {"kind": "kill", "rank": 1, "step": 2}
SECOND_KILL = {"kind": "kill", "rank": 0, "second": True, "then": "in_replay", "during": "replay"}


def fire_recovery_interrupted() -> None:
    cov = Coverage()
    result = _recovery(FIRST_KILL, SECOND_KILL)
    cov.add_recovery(result, ["recovery:kill", "recovery:then=in_replay"],
                     swarm_recovery.interrupted(result))
    assert cov.sometimes[INTERRUPTED] == 1 and cov.surroundings["recovery"] == 1
    assert cov.cells == {("kill", "between steps", "execute_model", "fork", "recover"): 1,
                         ("kill", "replay", "execute_model", "fork", "recover"): 1}


def quiet_recovery_with_one_fault() -> None:
    cov = Coverage()
    result = _recovery(FIRST_KILL)
    cov.add_recovery(result, ["recovery:kill"], swarm_recovery.interrupted(result))
    assert cov.sometimes[INTERRUPTED] == 0 and cov.pairs == {}


# -- the cells -------------------------------------------------------------------------------

def fire_two_start_methods_two_cells() -> None:
    kill = [_fault(0, "kill_worker", "before_execute")]
    cov = _counted((_result(kill), "fork"), (_result(kill), "spawn"))
    assert sorted(cov.cells.values()) == [1, 1] and len(cov.cells) == 2


def quiet_one_start_method_one_cell() -> None:
    kill = [_fault(0, "kill_worker", "before_execute")]
    cov = _counted((_result(kill), "fork"), (_result(kill), "fork"))
    assert list(cov.cells.values()) == [2]


def fire_outcome_of_the_call_hit() -> None:
    calls = [_call(0), _call(1, "sleep", args=(0.1,)), _call(2, error_type="ExecutorFailedError")]
    cov = _counted((_result([_fault(0, "kill_worker", "before_execute", "echo", call=2)], calls),
                    "fork"))
    assert list(cov.cells) == [("kill_worker", "before_execute", "echo", "fork",
                                "ExecutorFailedError")]


def quiet_outcome_of_the_first_call_hit() -> None:  # the twin: it hit the first echo
    calls = [_call(0), _call(1, "sleep", args=(0.1,)), _call(2, error_type="ExecutorFailedError")]
    cov = _counted((_result([_fault(0, "kill_worker", "before_execute", "echo", call=1)], calls),
                    "fork"))
    assert list(cov.cells) == [("kill_worker", "before_execute", "echo", "fork", "ok")]


# -- two-fault cells -------------------------------------------------------------------------

TERM = _fault(1, "term_worker", "before_pickle_reply", rank=1)
DAMAGE = {**_fault(0, "corrupt_queue", "before_publish", rank=0), "queue": "reply"}
ISSUE_PAIR = "pair:corrupt_queue+term_worker"


def fire_two_faults_landed_one_pair() -> None:
    assert coverage.landed_pairs([DAMAGE, TERM]) == [ISSUE_PAIR]
    assert coverage.landed_pairs([TERM, DAMAGE]) == [ISSUE_PAIR]  # either order: one cell
    assert ISSUE_PAIR in coverage.pairs_possible()


def fire_two_kills_one_per_rank() -> None:
    kills = [_fault(0, "kill_worker", rank=0), _fault(1, "kill_worker", rank=1)]
    assert coverage.landed_pairs(kills) == ["pair:kill_worker+kill_worker"]


def quiet_one_fault_fired_twice() -> None:  # a probability fault on two calls: no pair
    again = {**TERM, "call": 2, "msg_id": 2}
    assert coverage.landed_pairs([TERM, again]) == []


def quiet_only_one_of_the_pair_fired() -> None:
    assert coverage.landed_pairs([TERM]) == []


def fire_three_faults_three_pairs() -> None:
    hang = _fault(2, "hang_worker", "before_execute", rank=0)
    assert coverage.landed_pairs([TERM, hang, DAMAGE]) == [
        "pair:corrupt_queue+hang_worker", ISSUE_PAIR, "pair:hang_worker+term_worker"]


def fire_two_fault_section() -> None:
    cov = _counted((_result([DAMAGE, TERM]), "fork"), (_result([TERM, DAMAGE]), "spawn"),
                   (_result([TERM]), "fork"))
    possible = coverage.pairs_possible()
    assert cov.pairs == {ISSUE_PAIR: 2}
    assert len(possible) == len(set(possible)) == len(swarm.PAIRS)
    md = cov.table(["site"])
    assert f"1 of {len(possible)} pairs landed" in md and f"| {ISSUE_PAIR} | 2 |" in md
    pairs = cov.to_dict(["site"])["pairs"]
    assert pairs["landed"] == {ISSUE_PAIR: 2} and pairs["possible"] == possible
    assert pairs["never_landed"] == [p for p in possible if p != ISSUE_PAIR]


def quiet_no_pair_landed() -> None:
    cov = _counted((_result([TERM]), "fork"))
    assert cov.pairs == {} and cov.pairs_never_landed() == coverage.pairs_possible()
    assert f"0 of {len(swarm.PAIRS)} pairs landed" in cov.table([])


def fire_a_pair_outside_the_draws_is_told() -> None:
    cov = _counted((_result([_fault(0, "slow_worker"), _fault(1, "kill_worker", rank=0)]), "fork"))
    assert "- pair:kill_worker+slow_worker: 1" in cov.table([])


# -- the fault-free deadline model ------------------------------------------------------------

QUEUED = CallSpec("sleep", (0.3,), 1.0, True)


def quiet_deadlines_past_the_queued_sleeps() -> None:
    assert swarm.deadline_misses([QUEUED, CallSpec("echo", ("x",), 1.3, True)]) == []


def fire_deadline_short_of_the_queued_sleeps() -> None:  # the twin: 0.6 s after a 0.3 s sleep
    misses = swarm.deadline_misses([QUEUED, CallSpec("echo", ("x",), 0.6, True)])
    assert len(misses) == 1 and misses[0].startswith("call 1 (echo)")


def quiet_a_late_sleep_is_late_by_design() -> None:
    assert swarm.deadline_misses([CallSpec("sleep", (0.3,), 0.1)]) == []


def fire_a_sleep_given_only_its_own_time() -> None:  # the twin: not late, and no margin left
    assert len(swarm.deadline_misses([CallSpec("sleep", (0.3,), 0.3)])) == 1


def fire_no_deadline_breaks_the_model() -> None:
    assert len(swarm.deadline_misses([CallSpec("echo", ("x",), None)])) == 1


def quiet_every_drawn_schedule_keeps_the_model() -> None:
    for seed in range(200):
        drawn = swarm.draw(seed)  # draw raises AssertionError on a schedule that breaks it
        assert swarm.deadline_misses(drawn.calls) == [], seed
        for i, call in enumerate(drawn.calls):  # and the model's slack is really there
            queued = sum(swarm.sleeps_s(c) for c in drawn.calls[:i])
            enough = call.timeout is not None and call.timeout >= queued + swarm.sleeps_s(call) + 0.69
            assert swarm.expects_timeout(call) or enough, (seed, i)


def quiet_a_stubborn_worker_before_the_drivers_last_call() -> None:
    seed = next(s for s in range(2000) if (d := swarm.draw(s)).surrounding == "driver_killed"
                and swarm.STUBBORN in d.calls)
    last = swarm.draw(seed).calls[-1]
    assert last.timeout is not None and last.timeout > 60.0  # behind the stubborn 30 s sleep


# -- the pair draw ---------------------------------------------------------------------------

def _pair_seeds(n: int, first: int = 0) -> list[int]:
    return [s for s in range(first, first + n * swarm.PAIR_EVERY) if swarm.pair_of(s) is not None]


def fire_every_pair_once_per_rotation() -> None:
    seeds = _pair_seeds(len(swarm.PAIRS), first=7 * swarm.PAIR_EVERY)
    assert len(seeds) == len(swarm.PAIRS)
    drawn = [swarm.draw(s) for s in seeds]
    assert sorted(d.pair for d in drawn) == sorted(swarm.PAIRS)
    for d in drawn:
        assert sorted(f.kind for f in d.faults) == sorted(d.pair) and d.surrounding == "calls"


def quiet_a_plain_seed_draws_no_pair() -> None:
    plain = [s for s in range(50) if s % swarm.PAIR_EVERY != swarm.PAIR_EVERY - 1]
    assert all(swarm.pair_of(s) is None and swarm.draw(s).pair == () for s in plain)


def fire_a_pair_lands_in_one_early_call_on_two_ranks() -> None:
    for seed in _pair_seeds(2 * len(swarm.PAIRS)):
        faults = swarm.draw(seed).faults
        assert len(faults) == 2 and {f.rank for f in faults} == {0, 1}, seed
        assert len({f.on_call for f in faults}) == 1, seed
        on_call = faults[0].on_call
        assert on_call is not None and on_call[0] == "*" and on_call[1] <= swarm.PAIR_CALLS


def fire_a_pairs_two_points_are_near() -> None:
    for seed in _pair_seeds(2 * len(swarm.PAIRS)):
        drawn = swarm.draw(seed)
        names = [(swarm.site_name(a), swarm.site_name(b)) for a, b in swarm.pair_sites(drawn.pair)]
        assert tuple(swarm.fault_site(f) for f in drawn.faults) in names, seed


def fire_every_pair_has_near_sites() -> None:
    for pair in swarm.PAIRS:
        assert swarm.pair_sites(pair), pair


def fire_near_and_far_points() -> None:
    term = {"kind": "term_worker", "phase": "before_pickle_reply"}
    assert swarm.near(term, {"kind": "corrupt_queue", "queue": "reply", "mode": "overwrite_unread"})
    assert swarm.near(term, {"kind": "hang_worker", "phase": "before_execute"})
    assert swarm.near({"kind": "kill_worker", "phase": "signal"},
                      {"kind": "corrupt_queue", "queue": "rpc", "mode": "drop"})


def quiet_far_points() -> None:  # the twins: one point further, or a worker's after the send
    term = {"kind": "term_worker", "phase": "before_pickle_reply"}
    assert not swarm.near(term, {"kind": "hang_worker", "phase": "after_dequeue"})
    assert not swarm.near({"kind": "kill_worker", "phase": "after_dequeue"},
                          {"kind": "corrupt_queue", "queue": "rpc", "mode": "drop"})


def quiet_the_moments_of_a_call_in_order() -> None:
    order = [{"kind": "corrupt_queue", "queue": "rpc"}, {"kind": "kill_worker", "phase": "after_dequeue"},
             {"kind": "term_worker", "phase": "before_pickle_reply"},
             {"kind": "corrupt_queue", "queue": "reply"}, {"kind": "hang_worker", "phase": "after_reply"},
             {"kind": "interrupt_driver", "phase": "before_unpickle_reply"}]
    assert [swarm.moment(s) for s in order] == sorted(swarm.moment(s) for s in order)
    assert len({swarm.moment(s) for s in order}) == len(order)


def fire_the_same_seed_the_same_scenario() -> None:
    seeds = _pair_seeds(len(swarm.PAIRS)) + list(range(12))
    assert [swarm.draw(s).to_dict() for s in seeds] == [swarm.draw(s).to_dict() for s in seeds]
    assert swarm.draw(4).scenario() == swarm.draw(4).scenario()


def fire_the_issues_pair_is_drawn() -> None:
    """Issue 31's pair (term_worker rank 1 at before_pickle_reply + corrupt_queue
    reply/overwrite_unread): its kinds at the first pair seed (4), the very sites within as
    many visits as the pair has combinations."""
    want = ("term_worker@before_pickle_reply", "corrupt_queue@reply/overwrite_unread")
    kinds = ("term_worker", "corrupt_queue")
    visits = 2 * len(swarm.pair_sites(kinds))
    seeds = [s for s in range(visits * len(swarm.PAIRS) * swarm.PAIR_EVERY) if swarm.pair_of(s) == kinds]
    assert seeds[0] == swarm.PAIR_EVERY - 1 and len(seeds) == visits
    hit = [d.seed for d in map(swarm.draw, seeds)
           if tuple(dict(d.active)) == want and d.faults[0].rank == 1]
    assert len(hit) == 1, hit


def fire_every_combination_of_a_pair_once_per_cycle() -> None:
    pair = ("exit_worker", "interrupt_driver")  # 3 near sites x 2 ranks
    cycle = 2 * len(swarm.pair_sites(pair))
    seeds = [s for s in range(2 * cycle * len(swarm.PAIRS) * swarm.PAIR_EVERY)
             if swarm.pair_of(s) == pair]
    seen = [(tuple(dict(d.active)), d.faults[0].rank) for d in map(swarm.draw, seeds)]
    assert len(set(seen[:cycle])) == cycle and seen[cycle:] == seen[:cycle]


CASES: list[Case] = [
    fire_kill_between_pickling_and_write, quiet_kill_before_pickling,
    quiet_hang_between_pickling_and_write, fire_kill_after_reply, quiet_kill_after_execute,
    fire_kill_mid_reply, quiet_exit_mid_reply, fire_deadline_while_hung,
    quiet_deadline_while_slow, quiet_hung_with_no_deadline, fire_ring_full, fire_checksum_caught,
    fire_ctrl_c, quiet_worker_error, fire_late_reply, quiet_reply_before_the_deadline,
    fire_many_failed, quiet_one_failed, fire_stubborn_shutdown, quiet_a_long_sleep_with_its_time,
    quiet_interrupted_only_by_recovery, fire_recovery_interrupted, quiet_recovery_with_one_fault,
    fire_two_start_methods_two_cells, quiet_one_start_method_one_cell,
    fire_outcome_of_the_call_hit, quiet_outcome_of_the_first_call_hit,
    fire_two_faults_landed_one_pair, fire_two_kills_one_per_rank, quiet_one_fault_fired_twice,
    quiet_only_one_of_the_pair_fired, fire_three_faults_three_pairs, fire_two_fault_section,
    quiet_no_pair_landed, fire_a_pair_outside_the_draws_is_told,
    quiet_deadlines_past_the_queued_sleeps, fire_deadline_short_of_the_queued_sleeps,
    quiet_a_late_sleep_is_late_by_design, fire_a_sleep_given_only_its_own_time,
    fire_no_deadline_breaks_the_model, quiet_every_drawn_schedule_keeps_the_model,
    quiet_a_stubborn_worker_before_the_drivers_last_call,
    fire_every_pair_once_per_rotation, quiet_a_plain_seed_draws_no_pair,
    fire_a_pair_lands_in_one_early_call_on_two_ranks, fire_the_same_seed_the_same_scenario,
    fire_a_pairs_two_points_are_near, fire_every_pair_has_near_sites, fire_near_and_far_points,
    quiet_far_points, quiet_the_moments_of_a_call_in_order,
    fire_the_issues_pair_is_drawn, fire_every_combination_of_a_pair_once_per_cycle,
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Case) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("coverage"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: Any) -> None:
    assert_caught(judge, CASES)


def test_every_sometimes_property_has_a_fire_case() -> None:
    fired: set[str] = set()
    for name in SOMETIMES:
        assert callable(getattr(coverage, SOMETIMES[name][0])), name
    for result, events in [
            (_result([_fault(0, "term_worker", "before_reply")]), []),
            (_result([_fault(0, "kill_worker", "after_reply")]), []),
            (_result([_fault(0, "kill_worker", "mid_reply")]), []),
            (_result([_fault(0, "hang_worker")], [_call(0, error_type="TimeoutError")]), []),
            (_result([], [_call(0, error_type="QueueFullError")]), []),
            (_result([], [_call(0, error_type="CorruptMessageError")]), []),
            (_result([], [_call(0, "sleep", "TimeoutError", 0.1, (0.3,))]), _late_history(1.2)),
            (_result([], [_call(0, error_type="KeyboardInterrupt")]), []),
            (_result([], [_call(0, error_type="ExecutorFailedError"),
                          _call(1, error_type="ExecutorFailedError")]), []),
            (_result([], [_call(0, "sleep", "TimeoutError", swarm.STUBBORN.timeout, (30.0,))]), [])]:
        fired |= _reached(result, events)
    assert fired == set(SOMETIMES) - {INTERRUPTED}


def test_the_pair_draw_is_the_same_in_another_process() -> None:
    seeds = _pair_seeds(len(swarm.PAIRS))
    code = ("import json, sys; from chaos import swarm; "
            "print(json.dumps([swarm.draw(s).to_dict() for s in json.loads(sys.argv[1])]))")
    other = subprocess.run([sys.executable, "-c", code, json.dumps(seeds)], capture_output=True,
                           text=True, check=True, env={"PYTHONHASHSEED": "4321", "PATH": ""},
                           cwd=Path(__file__).parents[2])
    assert json.loads(other.stdout) == [swarm.draw(s).to_dict() for s in seeds]


def test_a_fault_free_run_meets_every_deadline(tmp_path: Path) -> None:
    """The model, asserted on the real executor: a drawn schedule with the most sleeps queued
    before its calls, run with no fault, has every call but the late ones answered in time
    (a ``fail`` with its WorkerError, the rest ok)."""
    from chaos.explore import judge

    def queued(drawn: swarm.Swarm) -> float:
        if drawn.surrounding != "calls" or drawn.pair:
            return -1.0
        return sum(swarm.sleeps_s(c) * (len(drawn.calls) - i - 1) for i, c in enumerate(drawn.calls))

    seed = max(range(100), key=lambda s: queued(swarm.draw(s)))
    drawn = swarm.draw(seed)
    plain = tuple(c for c in drawn.calls if c != swarm.STUBBORN)
    scenario = dataclasses.replace(drawn.scenario(), faults=(), calls=plain, may_not_fire=())
    verdict = judge(scenario, seed, tmp_path)
    assert isinstance(verdict.result, ScenarioResult)
    for spec, record in zip(plain, verdict.result.calls, strict=True):
        if not swarm.expects_timeout(spec):
            wanted = "WorkerError" if spec.method == "fail" else ""
            assert record.error_type == wanted, (seed, record.summary())
    assert verdict.problems == [], verdict.problems
