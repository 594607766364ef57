"""Chaos suites as pytest items: ``pytest --faultlab-suite NAME_OR_PATH`` (repeatable).

    --faultlab-suite smoke ─► load_suite + with_regressions (as chaos run) ─► SuiteNode "smoke"
        (a child of the session) ─► ScenarioItem "smoke::kill-mid-call": one per [[scenario]],
                                    [[recovery]] and [[target_scenario]] table
    ScenarioItem.runtest ─► run_case: chaos.runner.run_one / chaos.recovery.run_recovery /
                            chaos.targets.compare.run_target_scenario, into its own run directory
                        ─► user_properties (detection_latency_s, outcome, seed, run_dir, ...)
                        ─► violations? ScenarioFailed: its report lists them and a reproduce line

faultlab.pytest_entry declares the options and registers ``SuitePlugin`` only when
``--faultlab-suite`` is given, so an ordinary pytest run never imports this module.

Invariants:
- With ``--faultlab-suite`` and no path arguments, only the suites are collected: pytest's
  ``testpaths`` (or the current directory) are dropped at configure time.  Path arguments
  given on the command line are collected beside the suites.
- Ids are ``SUITE::SCENARIO``; two suites of one name are a usage error, found before any
  scenario runs, like every malformed suite (``pytest.UsageError``, the suite's own message).
- A scenario runs in the pytest process that runs its item (an xdist worker under ``-n``), so
  its executor's processes are that process's children and its named segments carry that
  process's pid (``faultlab_<pid>_``): the leak oracles (chaos.resources, chaos.driver_run)
  judge only those, never a scenario another worker runs at the same time.  xdist hands
  each item to one worker, so each scenario runs once.
- Every item has a run directory of its own (``--faultlab-out DIR``/SUITE/SCENARIO, else under
  pytest's basetemp, which xdist makes per worker): workers never share one.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import PlanError
from chaos.recovery import RecoveryScenario, run_recovery
from chaos.regressions import with_regressions
from chaos.runner import AnyResult, run_one, slug
from chaos.suites import SUITE_DIR, Scenario, Suite, SuiteError, load_suite
from chaos.targets.scenario import TargetScenario

TableEntry = Scenario | RecoveryScenario | TargetScenario


@dataclasses.dataclass(frozen=True)
class Options:
    seed: int | None
    out: Path | None
    start_method: str | None
    target: str

    @classmethod
    def from_config(cls, config: pytest.Config) -> Options:
        out = config.getoption("faultlab_out")
        return cls(config.getoption("faultlab_seed"), Path(out) if out else None,
                   config.getoption("faultlab_start_method"), config.getoption("faultlab_target"))


@dataclasses.dataclass(frozen=True)
class Case:
    """One table of a suite, as one test item."""

    suite: Suite
    entry: TableEntry

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def table(self) -> str:
        if isinstance(self.entry, RecoveryScenario):
            return "recovery"
        return "target_scenario" if isinstance(self.entry, TargetScenario) else "scenario"

    @property
    def kinds(self) -> list[str]:
        """The fault kinds it injects (``fault_free`` for none), each a marker ``faultlab_<kind>``."""
        if isinstance(self.entry, Scenario):
            kinds = sorted({f.kind for f in self.entry.faults})
        else:
            kinds = [] if self.entry.fault == "none" else [self.entry.fault]
        return kinds or ["fault_free"]


def load_suites(names: list[str]) -> list[Suite]:
    """Each suite once, by name; UsageError for a malformed file or a name given twice."""
    suites: dict[str, Suite] = {}
    for name in names:
        try:
            suite = with_regressions(load_suite(name))  # as ``faultlab chaos run`` loads it
        except (SuiteError, PlanError) as exc:
            raise pytest.UsageError(f"--faultlab-suite {name}: {exc}") from None
        if suite.name in suites:
            raise pytest.UsageError(
                f"--faultlab-suite {name}: a suite named {suite.name!r} is already collected "
                f"(from {suites[suite.name].path}); item ids are SUITE::SCENARIO, so suite "
                "names must differ")
        suites[suite.name] = suite
    return list(suites.values())


class SuitePlugin:
    """Registered by faultlab.pytest_entry when ``--faultlab-suite`` is given."""

    def __init__(self, config: pytest.Config) -> None:
        self.suites = load_suites(config.getoption("faultlab_suite"))
        self.options = Options.from_config(config)
        _check_target(self.options.target)
        if config.args_source is not pytest.Config.ArgsSource.ARGS:
            config.args = []  # no path arguments: the suites only, not testpaths
        _register_markers(config, self.suites)

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
            self, collector: pytest.Collector) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        if isinstance(collector, pytest.Session) and report.passed and report.result is not None:
            report.result.extend(SuiteNode.from_parent(collector, suite=s, options=self.options)
                                 for s in self.suites)
        return report


def _check_target(name: str) -> None:
    from chaos.targets.base import TARGET_NAMES

    if name not in TARGET_NAMES:
        raise pytest.UsageError(f"--faultlab-target {name}: unknown target; known: "
                                f"{', '.join(TARGET_NAMES)}")


def _register_markers(config: pytest.Config, suites: list[Suite]) -> None:
    config.addinivalue_line("markers", "faultlab_scenario(suite, table, kinds): a chaos "
                                       "suite's scenario collected by --faultlab-suite")
    kinds = {k for s in suites for case in cases(s) for k in case.kinds}
    for kind in sorted(kinds):
        config.addinivalue_line("markers", f"faultlab_{kind}: a suite scenario injecting {kind}")
    for table in ("recovery", "target_scenario"):
        config.addinivalue_line("markers", f"faultlab_{table}: a suite's [[{table}]] table")


def cases(suite: Suite) -> list[Case]:
    entries: list[TableEntry] = [*suite.scenarios, *suite.recovery, *suite.target_scenarios]
    return [Case(suite, e) for e in entries]


class SuiteNode(pytest.Collector):
    """One suite; its nodeid is the suite's name (not its file), so items are SUITE::SCENARIO."""

    def __init__(self, *, suite: Suite, options: Options, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.suite, self.options = suite, options

    @classmethod
    def from_parent(cls, parent: pytest.Collector, **kwargs: Any) -> SuiteNode:
        suite = kwargs["suite"]
        return super().from_parent(parent, name=suite.name, path=suite.path.resolve(),
                                   nodeid=suite.name, **kwargs)

    def collect(self) -> Iterator[ScenarioItem]:
        for case in cases(self.suite):
            item = ScenarioItem.from_parent(self, name=case.name, case=case, options=self.options)
            item.add_marker(pytest.mark.faultlab_scenario(suite=self.suite.name, table=case.table,
                                                          kinds=case.kinds))
            for marker in [*case.kinds, *([case.table] if case.table != "scenario" else [])]:
                item.add_marker(getattr(pytest.mark, f"faultlab_{marker}"))
            item.extra_keyword_matches.update(case.kinds)
            yield item


class ScenarioFailed(Exception):
    """A scenario broke an invariant; the message is its whole report."""


class ScenarioItem(pytest.Item):
    def __init__(self, *, case: Case, options: Options, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.options = case, options

    def runtest(self) -> None:
        seed = self.case.suite.seed if self.options.seed is None else self.options.seed
        out = self.run_dir()
        result = run_case(self.case, seed, out, self.options)
        self.user_properties.extend(properties(result, seed, out))
        if not result.ok:
            raise ScenarioFailed(failure_report(self.case, result, seed, out, self.options))

    def run_dir(self) -> Path:
        base = self.options.out or _basetemp(self.config) / "faultlab"
        return base.absolute() / slug(self.case.suite.name) / slug(self.case.name)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ScenarioFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.case.suite.name}::{self.case.name}"


def _basetemp(config: pytest.Config) -> Path:
    """pytest's basetemp (per xdist worker), as the ``tmp_path_factory`` fixture gives it.

    Items that are not Python functions get no fixtures, so this reads the factory the
    fixture returns (``config._tmp_path_factory``, there since pytest 6); ``runs/pytest``
    when it is missing (``-p no:tmpdir``)."""
    factory = getattr(config, "_tmp_path_factory", None)
    return Path(factory.getbasetemp()) if factory is not None else Path("runs") / "pytest"


def run_case(case: Case, seed: int, out: Path, options: Options) -> Any:
    """Run one table through the suite runner's own entry points (no second runner)."""
    entry = case.entry
    if isinstance(entry, Scenario):
        return run_one(entry, seed, out, options.start_method)
    if isinstance(entry, RecoveryScenario):
        return run_recovery(entry, seed, out)
    from chaos.targets.base import TargetUnavailable, get_target
    from chaos.targets.compare import run_target_scenario

    try:
        target = get_target(options.target)
    except TargetUnavailable as exc:
        pytest.skip(f"target {options.target}: {exc}")
    out.mkdir(parents=True, exist_ok=True)
    return run_target_scenario(target, entry, seed, out, out)


def properties(result: Any, seed: int, out: Path) -> list[tuple[str, object]]:
    """What --junitxml records of a scenario (``record_property``'s user_properties)."""
    return [("detection_latency_s", result.detection_latency_s),
            ("outcome", _value(result.outcome)),
            ("expected", _value(getattr(result, "expected", None))),
            ("seed", seed), ("wall_s", round(result.wall_s, 3)), ("run_dir", str(out)),
            ("violations", len(result.violations))]


def _value(outcome: Any) -> str | None:
    """An Outcome's value; target results carry it as a string already."""
    value = getattr(outcome, "value", outcome)
    return None if value is None else str(value)


def failure_report(case: Case, result: AnyResult, seed: int, out: Path, options: Options) -> str:
    latency = result.detection_latency_s
    lines = [f"chaos scenario {case.suite.name}::{case.name} broke {len(result.violations)} "
             f"invariant(s) (seed {seed}; {', '.join(case.kinds)}):"]
    lines += [f"  {v}" for v in result.violations]
    lines += [f"expected {_value(getattr(result, 'expected', None)) or '-'}, observed "
              f"{_value(result.outcome) or '-'}, detection latency "
              f"{'-' if latency is None else f'{latency * 1e3:.1f} ms'}",
              f"run directory: {out}" + ("" if options.out else
                                          " (in pytest's basetemp, which pytest deletes after "
                                          "3 newer runs: --faultlab-out DIR keeps it)"),
              f"Reproduce with: {reproduce_command(case, seed, out, options)}"]
    return "\n".join(lines)


def reproduce_command(case: Case, seed: int, out: Path, options: Options) -> str:
    """``faultlab chaos replay DIR`` for a [[scenario]] (its run saved scenario.json), which
    replay alone reads; ``chaos run -k`` for the other tables, when chaos run reaches them
    (it runs a [[target_scenario]] on faultlab only in a suite of target scenarios alone);
    else this item again through pytest."""
    if isinstance(case.entry, Scenario):
        return f"faultlab chaos replay {shlex.quote(str(out))}"
    suite = case.suite
    where = suite.name if suite.path.parent == SUITE_DIR else str(suite.path.resolve())
    if case.table == "target_scenario" and options.target == "faultlab" and (
            suite.scenarios or suite.recovery):
        return (f"pytest --faultlab-suite {shlex.quote(where)} --faultlab-seed {seed} "
                f"-k {shlex.quote(case.name)}")
    target = f" --target {options.target}" if case.table == "target_scenario" else ""
    return (f"faultlab chaos run {shlex.quote(where)} --seed {seed}{target} "
            f"-k {shlex.quote('^' + re.escape(case.name) + '$')} --out {shlex.quote(str(out) + '-rerun')}")
