"""The regressions suite: failures that ``faultlab chaos explore`` found, kept as scenarios.

    explore ── a shrunk, reproduced failure ──► append_scenario(path, scenario, note)
                                                   └► a [[scenario]] table in a TOML suite
                                                      (a [[recovery]] table for a finding
                                                      of chaos.swarm_recovery's family)
    faultlab chaos run SUITE ──► with_regressions(suite): REGRESSIONS' scenarios first

``REGRESSIONS`` (chaos/suites/regressions.toml) holds failures of the real executor only;
an explore aimed at a planted mutant writes its own file in its output directory (a planted
bug is no regression of the project).  The file does not exist until there is one.  A
scenario already in the file (by name) is not written twice.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from chaos.recovery import RecoveryScenario
from chaos.suites import SUITE_DIR, Scenario, Suite, load_suite

REGRESSIONS = SUITE_DIR / "regressions.toml"
HEADER = ('# Failures found by `faultlab chaos explore`, shrunk; `faultlab chaos run` replays '
          'them first.\n[suite]\nname = "regressions"\nseed = 0\n')


def append_scenario(path: Path, scenario: Scenario | RecoveryScenario, note: str) -> bool:
    """Add ``scenario`` to the suite at ``path`` (created if missing); False if it is there."""
    if path.exists():
        suite = load_suite(str(path))
        if scenario.name in {s.name for s in suite.scenarios} | {r.name for r in suite.recovery}:
            return False
    text = path.read_text() if path.exists() else HEADER
    path.parent.mkdir(parents=True, exist_ok=True)
    table = recovery_toml(scenario) if isinstance(scenario, RecoveryScenario) else \
        scenario_toml(scenario)
    path.write_text(text + "\n" + "".join(f"# {line}\n" for line in note.splitlines()) + table)
    return True


def with_regressions(suite: Suite, path: Path = REGRESSIONS) -> Suite:
    """``suite`` with the regressions' scenarios first (unchanged when there are none, or
    when ``suite`` is the regressions suite itself)."""
    if not path.exists() or suite.path.resolve() == path.resolve():
        return suite
    found = load_suite(str(path))
    names = {s.name for s in suite.scenarios} | {r.name for r in suite.recovery}
    return dataclasses.replace(
        suite, scenarios=tuple(s for s in found.scenarios if s.name not in names) + suite.scenarios,
        recovery=tuple(r for r in found.recovery if r.name not in names) + suite.recovery)


def scenario_toml(scenario: Scenario) -> str:
    """One [[scenario]] table; values are TOML's (JSON strings are TOML basic strings)."""
    data = scenario.to_dict()
    lines = ["[[scenario]]"]
    lines += [f"{k} = {_value(v)}" for k, v in data.items()
              if k not in ("config", "faults", "calls")]
    lines += ["[scenario.config]"] + [f"{k} = {_value(v)}" for k, v in data["config"].items()]
    for table in ("faults", "calls"):
        for item in data.get(table, []):
            lines += [f"[[scenario.{table}]]"] + [f"{k} = {_value(v)}" for k, v in item.items()]
    return "\n".join(lines) + "\n"


def recovery_toml(scenario: RecoveryScenario) -> str:
    """One [[recovery]] table (empty strings, the defaults of ``then`` and ``executor``, left out)."""
    items = [(k, v) for k, v in scenario.to_dict().items() if v != ""]
    return "\n".join(["[[recovery]]"] + [f"{k} = {_value(v)}" for k, v in items]) + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} ({type(v).__name__}) as a TOML value")
