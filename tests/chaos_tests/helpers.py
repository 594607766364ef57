"""Shared pieces of the chaos tests."""

from __future__ import annotations

from chaos import ScenarioResult


def real_violations(result: ScenarioResult) -> list[str]:
    return [str(v) for v in result.violations]
