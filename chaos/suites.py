"""Chaos suites: TOML files of scenarios (executor config + workload + faults + expectation).

    [suite]                      name, description, seed, and config defaults
    [[scenario]]                 name, workload ("standard" | "module:function") or calls,
      [scenario.config]          ExecutorConfig overrides, expect (an outcome or "auto"),
                                 executor ("module:Class", default the real executor: a
                                 planted mutant of chaos.mutants, for explore's regressions),
      [[scenario.faults]]        kind + the fault's fields (see chaos.faults); ``at`` is
                                 seconds or a [low, high] range (low <= high);
                                 ``may_not_fire = true``: it may legitimately never fire (a
                                 small probability, a time past the workload's end); else a
                                 fault that never fires is an "unfired" violation
    [[recovery]]                 a model-generation scenario under a recovery policy
                                 (chaos.recovery: fault, rank, steps, policy, tp, pp, ...)
    [[target_scenario]]          one fault applied from outside to any chaos target's
                                 driver and workers (chaos.targets.scenario; defaults for
                                 its workload in [suite.spec]); run by TargetRun

Built-in suites live beside this module (``chaos/suites/*.toml``); ``load_suite`` takes a
name or a path.  Every error names the file and the key, e.g.
``smoke.toml: scenario[3].faults[0].rank: ...``; a fault on a rank outside the scenario's
world is one of those errors, raised at load time, and so is a file that is not UTF-8 text.
"""

from __future__ import annotations

import dataclasses
import importlib
import tomllib
from pathlib import Path
from typing import Any

from chaos.faults import Fault, PlanError, fault_from_dict
from chaos.outcomes import Outcome
from chaos.plan import FaultPlan, check_ranks
from chaos.recovery import RecoveryScenario
from chaos.targets.scenario import TargetScenario, TargetScenarioError
from chaos.workload_names import BUILTIN
from chaos.workloads import CallSpec, Workload, rpc_sequence
from executor import ExecutorConfig

SUITE_DIR = Path(__file__).with_name("suites")
_SCENARIO_KEYS = {"name", "workload", "calls", "config", "faults", "expect", "description",
                  "executor"}
_SUITE_KEYS = {"name", "description", "seed", "config", "spec"}
_CONFIG_KEYS = {f.name for f in dataclasses.fields(ExecutorConfig)}


class SuiteError(ValueError):
    """A suite file is malformed; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    config: dict[str, Any]
    faults: tuple[Fault, ...]
    workload: str = "standard"
    calls: tuple[CallSpec, ...] = ()
    expect: str = "auto"
    may_not_fire: tuple[int, ...] = ()  # indices of faults that may legitimately never fire
    executor: str = ""  # "module:Class" of the executor to run ("": MultiprocExecutor)

    def executor_config(self, start_method: str | None = None) -> ExecutorConfig:
        overrides = {"start_method": start_method} if start_method else {}
        return ExecutorConfig(**{"tensor_parallel_size": 2, **self.config, **overrides})

    def build_workload(self) -> Workload:
        if self.calls:
            return rpc_sequence(self.calls)
        if self.workload in BUILTIN:
            return BUILTIN[self.workload]
        module, _, attr = self.workload.partition(":")
        workload: Workload = getattr(importlib.import_module(module), attr)
        return workload

    def executor_class(self) -> type:
        if not self.executor:
            from executor import MultiprocExecutor

            return MultiprocExecutor
        module, _, attr = self.executor.partition(":")
        cls: type = getattr(importlib.import_module(module), attr)
        return cls

    def plan(self, seed: int) -> FaultPlan:
        return FaultPlan(self.faults, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "config": self.config,
                                "faults": [{**f.to_dict(), **({"may_not_fire": True}
                                                              if i in self.may_not_fire else {})}
                                           for i, f in enumerate(self.faults)],
                                "expect": self.expect}
        if self.executor:
            data["executor"] = self.executor
        if self.calls:
            data["calls"] = [c.to_dict() for c in self.calls]
        else:
            data["workload"] = self.workload
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str, defaults: dict[str, Any]) -> Scenario:
        _no_unknown(data, _SCENARIO_KEYS, where)
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise PlanError(f"{where}.name: every scenario needs a name (a non-empty string)")
        config = {**defaults, **_config(data.get("config", {}), f"{where}.config")}
        faults = [_fault(f, f"{where}.faults[{i}]") for i, f in enumerate(_list(data, "faults", where))]
        calls = _list(data, "calls", where)
        scenario = cls(
            name, config, tuple(f for f, _ in faults),
            _workload(data.get("workload", "standard"), f"{where}.workload"),
            tuple(CallSpec.from_dict(c, f"{where}.calls[{i}]") for i, c in enumerate(calls)),
            _expect(data.get("expect", "auto"), f"{where}.expect"),
            tuple(i for i, (_, may) in enumerate(faults) if may),
            _executor(data.get("executor", ""), f"{where}.executor"),
        )
        scenario.check_ranks(where)
        return scenario

    def check_ranks(self, where: str = "scenario") -> None:
        """Every fault must hit a rank of this scenario's executor (PlanError naming it)."""
        cfg = self.executor_config()
        try:
            check_ranks(self.faults, cfg.world_size)
        except PlanError as exc:
            raise PlanError(f"{where}.{exc} (scenario {self.name!r}: tensor_parallel_size "
                            f"{cfg.tensor_parallel_size} x pipeline_parallel_size "
                            f"{cfg.pipeline_parallel_size})") from None


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    seed: int
    description: str
    scenarios: tuple[Scenario, ...]
    recovery: tuple[RecoveryScenario, ...] = ()
    target_scenarios: tuple[TargetScenario, ...] = ()


def suite_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    return SUITE_DIR / f"{name_or_path}.toml"


def load_suite(name_or_path: str) -> Suite:
    path = suite_path(name_or_path)
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        known = sorted(p.stem for p in SUITE_DIR.glob("*.toml"))
        raise SuiteError(f"{path}: no such suite file (built-in suites: {known})") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(f"{path.name}: not UTF-8 text (byte {exc.start} is "
                         f"{exc.object[exc.start:exc.start + 1]!r}); TOML files are UTF-8") from None
    except OSError as exc:
        raise SuiteError(f"{path}: cannot read the suite file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SuiteError(f"{path.name}: not valid TOML: {exc}") from None
    try:
        return _suite(data, path)
    except PlanError as exc:
        raise SuiteError(f"{path.name}: {exc}") from None


def _suite(data: dict[str, Any], path: Path) -> Suite:
    _no_unknown(data, {"suite", "scenario", "recovery", "target_scenario"}, "")
    head = data.get("suite", {})
    _no_unknown(head, _SUITE_KEYS, "suite")
    seed = head.get("seed", 0)
    if not isinstance(seed, int):
        raise PlanError(f"suite.seed: must be an integer, got {seed!r}")
    defaults = _config(head.get("config", {}), "suite.config")
    scenarios = _list(data, "scenario", "")
    recovery = tuple(RecoveryScenario.from_dict(r, f"recovery[{i}]")
                     for i, r in enumerate(_list(data, "recovery", "")))
    targeted = _target_scenarios(data, head)
    if not scenarios and not recovery and not targeted:
        raise PlanError("scenario: the suite has no [[scenario]], [[recovery]] or "
                        "[[target_scenario]] tables")
    built = tuple(Scenario.from_dict(s, f"scenario[{i}]", defaults) for i, s in enumerate(scenarios))
    names = [s.name for s in built] + [r.name for r in recovery] + [t.name for t in targeted]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"scenario.name: duplicate scenario names {dupes}")
    return Suite(head.get("name", path.stem), path, seed, head.get("description", ""), built,
                 recovery, targeted)


def _target_scenarios(data: dict[str, Any], head: dict[str, Any]) -> tuple[TargetScenario, ...]:
    spec = head.get("spec", {})
    try:
        return tuple(TargetScenario.from_dict(t, f"target_scenario[{i}]", spec)
                     for i, t in enumerate(_list(data, "target_scenario", "")))
    except TargetScenarioError as exc:
        raise PlanError(str(exc)) from None


def _no_unknown(data: Any, known: set[str], where: str) -> None:
    if not isinstance(data, dict):
        raise PlanError(f"{where or 'top level'}: must be a table, got {type(data).__name__}")
    unknown = sorted(set(data) - known)
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise PlanError(f"{key}: unknown key; known: {sorted(known)}")


def _list(data: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    full = f"{where}.{key}" if where else key
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise PlanError(f"{full}: must be an array of tables ([[{full}]])")
    return value


def _fault(data: dict[str, Any], where: str) -> tuple[Fault, bool]:
    """One [[scenario.faults]] table: the fault, and whether it may never fire."""
    fields = dict(data)
    may_not_fire = fields.pop("may_not_fire", False)
    if not isinstance(may_not_fire, bool):
        raise PlanError(f"{where}.may_not_fire: must be true or false, got {may_not_fire!r}")
    fault = fault_from_dict(fields, where)
    at = fault.at
    if isinstance(at, tuple) and (len(at) != 2 or at[0] > at[1]):
        raise PlanError(f"{where}.at: a time range is [low, high] with low <= high, "
                        f"got {list(at)}")
    return fault, may_not_fire


def _config(data: Any, where: str) -> dict[str, Any]:
    _no_unknown(data, _CONFIG_KEYS, where)
    try:
        ExecutorConfig(**{"tensor_parallel_size": 2, **data})
    except (ValueError, TypeError) as exc:
        raise PlanError(f"{where}: {exc}") from None
    return dict(data)


def _workload(value: Any, where: str) -> str:
    if not isinstance(value, str) or (value not in BUILTIN and value.count(":") != 1):
        raise PlanError(f"{where}: must be one of {sorted(BUILTIN)} or 'module:function', "
                        f"got {value!r}")
    return value


def _executor(value: Any, where: str) -> str:
    """"" or an importable "module:Class" (checked now: a typo is a load error, not a run's)."""
    if value == "":
        return ""
    module, _, attr = value.partition(":") if isinstance(value, str) else ("", "", "")
    try:
        cls = getattr(importlib.import_module(module), attr) if module and attr else None
    except (ImportError, AttributeError):
        cls = None
    if not isinstance(cls, type):
        raise PlanError(f"{where}: must be 'module:Class' of an executor class (e.g. "
                        f"'chaos.mutants:SwallowsDeath'), got {value!r}")
    return str(value)


def _expect(value: Any, where: str) -> str:
    allowed = ["auto", *(o.value for o in Outcome)]
    if value not in allowed:
        raise PlanError(f"{where}: must be one of {allowed}, got {value!r}")
    return str(value)
