"""Planted judges: one deliberate bug in the code that decides what is a bug.

faultlab's product is verdicts, so the code that gives them (oracles, the history checker,
coverage predicates, explore's dedupe / shrink / reproduce, the targets' grades, the failure
story) is planted with bugs the way ``chaos.mutants`` plants them in executors:

    a judge ──PlantedJudge.planted()──► the same judge with one bug, inside a ``with`` block
            ──its fire and quiet cases──► at least one case must now give the wrong verdict

    chaos/planted_judges/<area>.py   PLANTED: list[PlantedJudge], one module per family of
                                     judges (history, oracles, search, targets, telemetry, ...)
    all_planted()                    every area's plants, in a stable order (area, then list)

A plant replaces one attribute (``where`` = ``"package.module:attr"`` or
``"package.module:Class.attr"``) with ``make(original)``: the replacement may wrap the
original (drop one kind of violation, compare the wrong field) or stand alone.  Judges call
these attributes through their module's globals or their class, so the replacement is what
runs.  The tests that prove a plant is caught run the area's fire/quiet cases under it
(``tests/judges/``); the score (planted, caught) is what those tests count.

Invariants:
- a plant never outlives its ``with`` block: the original is put back in ``finally``;
- a plant changes one attribute only, so a case that catches it points at one fact;
- plants are for tests and for users proving their own judges; nothing in faultlab's own
  runs imports this package.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any


@dataclasses.dataclass(frozen=True)
class PlantedJudge:
    """One bug in one judge: ``name`` (unique), ``where`` it goes, what it gets wrong."""

    name: str
    where: str
    bug: str
    make: Callable[[Any], Any]

    def _holder(self) -> tuple[Any, str]:
        module_name, _, path = self.where.partition(":")
        holder: Any = importlib.import_module(module_name)
        *owners, attr = path.split(".")
        for owner in owners:
            holder = getattr(holder, owner)
        if not hasattr(holder, attr):
            raise AttributeError(f"planted judge {self.name}: {self.where} does not exist")
        return holder, attr

    @contextlib.contextmanager
    def planted(self) -> Iterator[None]:
        holder, attr = self._holder()
        original = holder.__dict__[attr] if isinstance(holder, type) else getattr(holder, attr)
        raw = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
        replacement = self.make(raw)
        if isinstance(original, staticmethod):
            replacement = staticmethod(replacement)
        elif isinstance(original, classmethod):
            replacement = classmethod(replacement)
        setattr(holder, attr, replacement)
        try:
            yield
        finally:
            setattr(holder, attr, original)


def areas() -> list[str]:
    """The area modules beside this one, sorted by name."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.ispkg)


def planted_in(area: str) -> list[PlantedJudge]:
    module = importlib.import_module(f"{__name__}.{area}")
    return list(module.PLANTED)


def all_planted() -> list[PlantedJudge]:
    out = [judge for area in areas() for judge in planted_in(area)]
    names = [judge.name for judge in out]
    duplicates = {name for name in names if names.count(name) > 1}
    if duplicates:
        raise ValueError(f"planted judges named twice: {sorted(duplicates)}")
    return out


def by_name(name: str) -> PlantedJudge:
    for judge in all_planted():
        if judge.name == name:
            return judge
    raise KeyError(f"no planted judge named {name!r}; known: {[j.name for j in all_planted()]}")
