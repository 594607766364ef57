"""``faultlab chaos``: run a suite, or replay one scenario of an earlier run.

    faultlab chaos run SUITE|PATH --seed N --out DIR [--junit FILE] [--start-method M] [-k REGEX]
                                  [--target NAME]
    faultlab chaos replay DIR/SCENARIO [--out DIR2]     (a [[scenario]]'s run or a [[recovery]]'s)
    faultlab chaos explore --budget 5m --out DIR [--mutant NAME] [--seed N]   (faultlab.explore_cli)
    faultlab chaos compare SUITE --targets NAME,NAME,... [--seeds N] --out DIR [--skip-missing]

``--target`` (default ``faultlab``: today's behaviour, every [[scenario]] on faultlab's
executor) runs the suite's [[target_scenario]] tables against that target through
chaos.targets.run.TargetRun (a suite without them is a usage error for any other target).
``compare`` runs them on every target named, each for ``--seeds`` seeds (the suite's seed,
+1, ...), and writes DIR/compare.md, DIR/compare.json and DIR/junit-NAME.xml; it exits 0
once every row is written (violations are findings, in the files).  A target that is not
installed stops ``compare`` before anything runs, naming each missing one and its extra,
unless ``--skip-missing`` runs the others and lists the skipped in compare.md.

Exit status: 0 when every invariant held, 1 when one broke, 2 for a usage error (a malformed
or non-UTF-8 suite, a fault on a rank outside the world, a bad or unmatched ``-k``, an
``--out`` or ``--junit`` that cannot be written): one stderr line, raised as ``UsageError``
before any scenario runs.  A JUnit file or stdout whose write still fails at the end is one
line too (exit 2).
Progress goes to stderr, the summary table to stdout.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultlab import explore_cli, explore_target_cli
from faultlab.usage import (
    UsageError,
    dir_problem,
    int_in,
    output_dir,
    output_file,
    regex,
    write_stdout,
)

if TYPE_CHECKING:
    from chaos.suites import Scenario


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="chaos_command", required=True)
    run = sub.add_parser("run", help="run a chaos suite (a built-in name or a TOML path)")
    run.add_argument("suite", help="smoke, full, or a path to a suite .toml")
    run.add_argument("--seed", type=int, default=None, help="the seed (default: the suite's)")
    run.add_argument("--out", type=output_dir, required=True, help="directory for results and traces")
    run.add_argument("--junit", type=output_file, default=None, help="write JUnit XML here")
    run.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None,
                     help="how worker processes start (default: each scenario's, else fork)")
    run.add_argument("-k", dest="only", type=regex, default=None,
                     help="only scenarios matching this regex")
    run.add_argument("--target", type=target_name, default=None,
                     help="the executor to break: faultlab (default), vllm, processpool, loky, "
                          "pebble, ray (target suites, e.g. 'targets')")
    compare = sub.add_parser("compare", help="run a target suite on several targets, side by side")
    compare.add_argument("suite", help="targets, or a path to a suite .toml with [[target_scenario]]")
    compare.add_argument("--targets", type=target_names, required=True,
                         help="comma-separated target names, e.g. faultlab,processpool")
    compare.add_argument("--seeds", type=int_in(1, 1000), default=1,
                         help="how many seeds per scenario (default 1)")
    compare.add_argument("--out", type=output_dir, required=True,
                         help="directory for compare.md, compare.json, junit-NAME.xml")
    compare.add_argument("--skip-missing", action="store_true",
                         help="run the installed targets, list the missing ones in compare.md")
    compare.add_argument("-k", dest="only", type=regex, default=None,
                         help="only scenarios matching this regex")
    explore_cli.configure(sub)
    replay = sub.add_parser("replay", help="rerun one scenario of an earlier run exactly")
    replay.add_argument("scenario_dir", type=Path, help="DIR/SCENARIO of an earlier run")
    replay.add_argument("--out", type=output_dir, default=None, help="default: SCENARIO/replay")


def run(args: argparse.Namespace) -> int:
    if args.chaos_command == "run":
        return _run(args)
    if args.chaos_command == "compare":
        return _compare(args)
    if args.chaos_command == "explore":
        return explore_cli.run(args)
    return _replay(args)


def target_name(text: str) -> str:
    """An argparse type: one of chaos.targets' names."""
    from chaos.targets.base import TARGET_NAMES

    if text not in TARGET_NAMES:
        raise argparse.ArgumentTypeError(f"unknown target {text!r}; known: {', '.join(TARGET_NAMES)}")
    return text


def target_names(text: str) -> list[str]:
    """An argparse type: comma-separated target names, at least one, none twice."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one target name, e.g. faultlab,processpool")
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"a target is named twice in {text!r}")
    return [target_name(n) for n in names]


def _resolve_target(name: str) -> Any:
    """The Target, or UsageError: one line naming what to install."""
    from chaos.targets.base import TargetUnavailable, get_target

    try:
        return get_target(name)
    except TargetUnavailable as exc:
        raise UsageError(str(exc)) from None
    except ImportError as exc:
        raise UsageError(f"target {name}: chaos.targets.{name}_target cannot be imported "
                         f"({exc}); is the target installed in this checkout?") from None


def _run(args: argparse.Namespace) -> int:
    from chaos.regressions import with_regressions
    from chaos.runner import print_summary, run_suite, stderr_progress, timed, write_junit
    from chaos.suites import SuiteError, load_suite

    try:
        suite = load_suite(args.suite)
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    targeted = args.target not in (None, "faultlab") or (suite.target_scenarios and not (
        suite.scenarios or suite.recovery))
    if targeted:
        return _run_target(args, suite)
    suite = with_regressions(suite)  # explore's findings on the real executor come first
    _check_selection([s.name for s in suite.scenarios] + [r.name for r in suite.recovery], args.only,
                     suite.name)
    seed = suite.seed if args.seed is None else args.seed
    sys.stderr.write(f"chaos suite {suite.name} ({suite.path}), seed {seed}, out {args.out}\n")
    results, wall = timed(lambda: run_suite(suite, seed, args.out, stderr_progress,
                                            args.start_method, args.only))
    summary = io.StringIO()
    print_summary(results, summary)
    _write_failed_traces(results, summary)
    summary.write(f"wall time {wall:.1f} s, {len(results) / wall * 60:.1f} scenarios/min\n")
    junit_error = None
    if args.junit is not None:  # before stdout: a full stdout must not cost the JUnit file
        try:
            write_junit(results, suite.name, args.junit, wall)
        except OSError as exc:
            junit_error = UsageError(f"--junit {args.junit}: cannot write: {exc.strerror or exc}")
    write_stdout(summary.getvalue())
    if junit_error is not None:
        raise junit_error
    return 0 if all(r.ok for r in results) else 1


def _run_target(args: argparse.Namespace, suite: Any) -> int:
    """``chaos run SUITE --target NAME``: the suite's target scenarios on one target."""
    from chaos.targets.compare import run_targets, stderr_progress, summary, write_junit

    name = args.target or "faultlab"
    if not suite.target_scenarios:
        raise UsageError(f"suite {suite.name} has no [[target_scenario]] tables: its scenarios "
                         "use faultlab's failpoints and run on faultlab only (--target faultlab); "
                         "try the 'targets' suite")
    scenarios = _selected(suite, args.only)
    target = _resolve_target(name)
    seed = suite.seed if args.seed is None else args.seed
    sys.stderr.write(f"chaos suite {suite.name} ({suite.path}) on target {name}, seed {seed}, "
                     f"out {args.out}\n")
    results = run_targets(target, scenarios, [seed], args.out, stderr_progress)
    (args.out / "summary.json").write_text(json.dumps([r.row() for r in results], indent=1))
    junit_error = None
    if args.junit is not None:
        try:
            write_junit(results, suite.name, name, args.junit)
        except OSError as exc:
            junit_error = UsageError(f"--junit {args.junit}: cannot write: {exc.strerror or exc}")
    write_stdout(summary(results))
    if junit_error is not None:
        raise junit_error
    return 0 if all(r.ok for r in results) else 1


def _compare(args: argparse.Namespace) -> int:
    from chaos.suites import SuiteError, load_suite
    from chaos.targets.base import TargetUnavailable, get_target
    from chaos.targets.compare import compare, stderr_progress, summary

    try:
        suite = load_suite(args.suite)
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    if not suite.target_scenarios:
        raise UsageError(f"suite {suite.name} has no [[target_scenario]] tables; "
                         "compare runs target suites, e.g. 'targets'")
    scenarios = _selected(suite, args.only)
    targets, missing = [], []
    for name in args.targets:
        try:
            targets.append(get_target(name))
        except (TargetUnavailable, ImportError) as exc:
            missing.append((name, str(exc)))
    if missing and (not args.skip_missing or not targets):
        raise UsageError(f"not installed: {'; '.join(why for _, why in missing)} "
                         "(install them, or pass --skip-missing to run the others)")
    seeds = [suite.seed + k for k in range(args.seeds)]
    sys.stderr.write(f"chaos compare {suite.name}: targets {', '.join(t.name for t in targets)}"
                     f"{'; skipped ' + ', '.join(n for n, _ in missing) if missing else ''}; "
                     f"seeds {seeds}; out {args.out}\n")
    results = compare(suite.name, scenarios, targets, seeds, args.out, missing, stderr_progress)
    write_stdout(summary(results) + f"wrote {args.out / 'compare.md'}, "
                 f"{args.out / 'compare.json'} and a junit-NAME.xml per target\n")
    return 0


def _selected(suite: Any, only: str | None) -> list[Any]:
    _check_selection([s.name for s in suite.target_scenarios], only, suite.name)
    return [s for s in suite.target_scenarios if only is None or re.search(only, s.name)]


def _check_selection(names: list[str], only: str | None, suite_name: str) -> None:
    """``-k`` must select at least one scenario (a typo should not be a green, empty run)."""
    if only is None or any(re.search(only, name) for name in names):
        return
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    raise UsageError(f"-k {only!r} matches no scenario of suite {suite_name}; its scenarios: {shown}")


def _write_failed_traces(results: list[Any], out: io.StringIO) -> None:
    """Each scenario's failed RPCs by trace id: which of a run's traces to open in Jaeger."""
    from faultlab.trace_hint import describe, failed_traces, how_to_find

    last = None
    for r in results:
        trace_dir = getattr(r, "trace_dir", None)
        if trace_dir is None or r.outcome in (None, "fault_free"):
            continue
        lines = describe(failed_traces(trace_dir), trace_dir, shown=3, how=False)
        if lines:
            out.write(f"{r.name}: " + "\n".join(lines) + "\n")
            last = trace_dir
    if last is not None:
        out.write(f"{how_to_find(last)}\n")


def _replay(args: argparse.Namespace) -> int:
    from chaos.plan import schedule_signature
    from chaos.runner import print_summary, run_one

    source = args.scenario_dir
    if explore_target_cli.is_target_run(source):  # a run of explore --target (a peer's)
        return explore_target_cli.replay(source, _replay_out(args, source))
    recovery = _load_saved_recovery(source)
    if recovery is not None:
        return _replay_recovery(source, _replay_out(args, source), *recovery)
    saved, scenario = _load_saved(source)
    out = _replay_out(args, source)
    result = run_one(scenario, saved["seed"], out, saved.get("start_method"))
    summary = io.StringIO()
    print_summary([result], summary)
    _write_failed_traces([result], summary)
    same = schedule_signature(scenario.plan(saved["seed"]).resolve())
    original = _timeline_signature(source / "result.json")
    replayed = _timeline_signature(out / "result.json")
    verdict = "the same as" if original == replayed else "DIFFERENT from"
    summary.write(f"replayed seed {saved['seed']} ({len(same)} fault(s)); the fault timeline "
                  f"is {verdict} the original's\n")
    write_stdout(summary.getvalue())
    return 0 if result.ok else 1


def _replay_out(args: argparse.Namespace, source: Path) -> Path:
    out: Path = args.out or source / "replay"
    problem = dir_problem(out)
    if problem:
        raise UsageError(f"cannot write the replay into {out}: {problem} (give --out DIR)")
    return out


def _load_saved_recovery(source: Path) -> tuple[int, Any] | None:
    """The seed and [[recovery]] scenario saved in ``source`` (None: a plain scenario)."""
    from chaos.faults import PlanError
    from chaos.swarm_recovery import load_saved

    try:
        return load_saved(source)
    except (FileNotFoundError, ValueError, TypeError):  # _load_saved names what is wrong
        return None
    except PlanError as exc:
        raise UsageError(f"{source / 'scenario.json'} is not a saved scenario: {exc}") from None


def _replay_recovery(source: Path, out: Path, seed: int, scenario: Any) -> int:
    """Rerun a recovery scenario (a `chaos run` [[recovery]] or an explore finding)."""
    from chaos.recovery import run_recovery
    from chaos.runner import print_summary
    from chaos.swarm_recovery import fired_signature

    result = run_recovery(scenario, seed, out)
    summary = io.StringIO()
    print_summary([result], summary)
    same = fired_signature(source / "result.json") == fired_signature(out / "result.json")
    summary.write(f"replayed seed {seed} (a recovery scenario, {len(result.faults)} fault(s) "
                  f"fired); the faults that fired are {'the same as' if same else 'DIFFERENT from'}"
                  " the original's\n")
    write_stdout(summary.getvalue())
    return 0 if result.ok else 1


def _load_saved(source: Path) -> tuple[dict[str, Any], Scenario]:
    """The seed and scenario an earlier ``faultlab chaos run`` saved in ``source``."""
    from chaos.faults import PlanError
    from chaos.suites import Scenario

    path = source / "scenario.json"
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved["seed"], int):
            raise ValueError(f"seed must be an integer, got {saved['seed']!r}")
        return saved, Scenario.from_dict(saved["scenario"], "scenario", {})
    except FileNotFoundError:
        raise UsageError(f"{path} not found; give DIR/SCENARIO of an earlier "
                         "'faultlab chaos run'") from None
    except (ValueError, KeyError, TypeError) as exc:  # PlanError is a ValueError
        detail = str(exc) if isinstance(exc, PlanError) else f"{type(exc).__name__}: {exc}"
        raise UsageError(f"{path} is not a saved scenario: {detail}") from None


def _timeline_signature(path: Path) -> list[tuple[object, ...]]:
    try:
        faults = json.loads(path.read_text())["faults"]
    except (FileNotFoundError, KeyError, ValueError):
        return []
    from chaos.plan import timeline_signature

    return timeline_signature(faults)
