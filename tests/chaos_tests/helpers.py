"""Shared pieces of the chaos tests."""

from __future__ import annotations

from chaos import ScenarioResult

# Executor bug reported to the lead (see the chaos report): when a worker dies, the monitor
# thread runs the shutdown itself and skips ``monitor.close()``, leaking its stop pipe
# (two descriptors).  Tests that are about something else tolerate exactly that leak.
KNOWN_EXECUTOR_LEAK = "was left open"


def real_violations(result: ScenarioResult) -> list[str]:
    return [str(v) for v in result.violations
            if not (v.invariant == "leak" and KNOWN_EXECUTOR_LEAK in v.message
                    and "pipe:" in v.message)]
