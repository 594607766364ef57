"""Fire/quiet cases for judges, and the check that a planted judge is caught.

A judge case is a plain function that asserts one verdict on a hand-made record: a "fire"
case asserts the judge reports the fault, its "quiet" twin is built from a record that differs
in one fact and asserts the judge stays silent.  An area's test module lists its cases once
and parametrizes over them; ``caught_by`` runs them under a planted judge and returns which
failed (at least one must, or the plant escaped every test).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chaos.planted_judges import PlantedJudge

Case = Callable[[], None]


def case_id(case: Case) -> str:
    return case.__name__


def caught_by(judge: PlantedJudge, cases: Sequence[Case]) -> list[str]:
    """The names of the cases that fail with ``judge`` planted (any exception counts)."""
    failed = []
    with judge.planted():
        for case in cases:
            try:
                case()
            except Exception:  # noqa: BLE001 - a crash under the plant is a catch too
                failed.append(case_id(case))
    return failed


def assert_caught(judge: PlantedJudge, cases: Sequence[Case]) -> None:
    failed = caught_by(judge, cases)
    assert failed, f"planted judge {judge.name} ({judge.bug}) escaped all {len(cases)} cases"
