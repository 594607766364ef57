"""Hypothesis settings profiles for the property tests; pick one with HYPOTHESIS_PROFILE.

    ci       (default) deadline off, 100 examples of up to 15 steps for the fork machine
             (costlier properties take a fraction, see ``scaled``), derandomized so a CI
             run is repeatable; a failure prints the shrunk steps and a
             @reproduce_failure blob.  The whole tests/property run takes ~2.5 min on 2 cores.
    nightly  10x the examples, up to 40 steps each, random seeds, failures saved to the
             example database (.hypothesis/) and replayed first on the next run.

The profiles are applied by the tests themselves (``PROFILE``, ``scaled``), not loaded
globally, so other test directories keep their own Hypothesis settings.  This module has
its own name (not ``conftest``) so that tests import it unambiguously.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from hypothesis import HealthCheck, Phase, settings

_COMMON = {
    "deadline": None,  # real processes: one step costs milliseconds to seconds
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile(
    "ci", max_examples=100, stateful_step_count=15, derandomize=True, database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink], **_COMMON,
)
settings.register_profile("nightly", max_examples=1000, stateful_step_count=40, **_COMMON)

PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
PROFILE = settings.get_profile(PROFILE_NAME)


def scaled(fraction: float, minimum: int = 2, **changes: object) -> settings:
    """The selected profile with ``fraction`` of its examples (for costlier properties)."""
    examples = max(minimum, int(PROFILE.max_examples * fraction))
    return settings(PROFILE, max_examples=examples, **changes)  # type: ignore[arg-type]


# Under ci, shrinking stops after SHRINK_S seconds (Hypothesis' internal knob, default 300 s):
# every failing candidate costs real time (a call's bound, a worker start), so unbounded
# shrinking outlived the 120 s per-test timeout and printed no example.  Generation of the
# costliest tests takes up to ~60 s; 30 s of shrinking keeps the printed example inside 120 s.
SHRINK_S = 30


@contextlib.contextmanager
def shrink_cap(seconds: float = SHRINK_S) -> Iterator[None]:
    from hypothesis.internal.conjecture import engine

    if PROFILE_NAME != "ci" or not hasattr(engine, "MAX_SHRINKING_SECONDS"):
        yield
        return
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved
