"""Issue 26: the swarm's surroundings widen what ``faultlab chaos explore`` reaches.

    what                                           checked by
    every surrounding is drawn, by seed alone       the first seed of each, drawn twice
    each shape is a scenario the suites can hold    TOML round trip, its fault and config rules
    a surrounding reaches the mutant it exists for  judge(first seed) finds the mutant ...
      and the real executor passes the same run     ... and nothing on the real executor
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import swarm, swarm_surroundings
from chaos.explore import judge, workload_bound_s
from chaos.faults import kinds_where
from chaos.regressions import scenario_toml
from chaos.suites import load_suite

SEEDS = range(4000)


# The seed draws no fault that may end the executor: the bug needs the run to go on (which
# seed comes first moves whenever a site is added to the swarm).
QUIET = "quiet"
_FATAL = frozenset(kinds_where(fatal=True))


def _first_seed(name: str, has_fault: str | None = None) -> int:
    for seed in SEEDS:
        drawn = swarm.draw(seed)
        if drawn.surrounding == name and _draws(drawn, has_fault):
            return seed
    raise AssertionError(f"no seed below {len(SEEDS)} draws {name}")


def _draws(drawn: swarm.Swarm, fault: str | None) -> bool:
    if fault == QUIET:
        return not any(f.kind in _FATAL for f in drawn.faults)
    return fault is None or any(f.kind == fault for f in drawn.faults)


def test_every_surrounding_is_drawn_and_replays_from_its_seed(tmp_path: Path) -> None:
    for around in swarm_surroundings.SURROUNDINGS:
        seed = _first_seed(around.name)
        drawn = swarm.draw(seed)
        assert drawn == swarm.draw(seed)
        scenario = drawn.scenario()
        path = tmp_path / f"{seed}.toml"
        path.write_text('[suite]\nname = "x"\n' + scenario_toml(scenario))
        assert load_suite(str(path)).scenarios[0].to_dict() == scenario.to_dict(), around.name
        if around.name.startswith("edge:"):
            assert scenario.calls == () and scenario.faults == ()
            assert scenario.workload == around.name.removeprefix("edge:")
            assert workload_bound_s(scenario) >= 60.0
        if around.name in ("nodes", "outsider_flood"):
            assert scenario.config["nnodes"] == 2
            assert all(f.kind == "kill_node" for f in scenario.faults) and len(scenario.faults) <= 1
        if around.name == "driver_killed":
            last, kill = scenario.calls[-1], scenario.faults[-1]
            assert kill.kind == "kill_driver" and kill.on_call is not None
            assert kill.on_call[0] == last.method and last.timeout == 40.0


# (mutant, surrounding, a fault its seed must draw (or QUIET), the invariant the mutant breaks)
REACH = [
    ("SlowShutdown", "calls", None, "shutdown"),
    ("QueueFullAfter10", "edge:burst", None, "backpressure"),
    ("PoisonedByAggregator", "edge:callback_chaos", None, "callbacks"),
    ("LocksBeforeTry", "edge:interrupt_sweep", None, "interrupt"),
    ("IgnoresLostNodes", "nodes", "kill_node", "detection"),
    ("ProgressOneAheadExecutor", "small_ring", QUIET, "damage"),
]


@pytest.mark.parametrize(("mutant", "surrounding", "fault", "invariant"), REACH,
                         ids=[r[0] for r in REACH])
def test_a_surrounding_reaches_its_mutant_and_the_real_executor_passes(
        tmp_path: Path, mutant: str, surrounding: str, fault: str | None, invariant: str) -> None:
    seed = _first_seed(surrounding, fault)
    drawn = swarm.draw(seed)
    broken = judge(drawn.scenario(f"chaos.mutants:{mutant}"), seed, tmp_path / "mutant")
    assert invariant in broken.signature, broken.problems
    real = judge(drawn.scenario(), seed, tmp_path / "real")
    assert real.problems == [], real.problems
