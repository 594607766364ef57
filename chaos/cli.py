"""``faultlab chaos``: run a suite, or replay one scenario of an earlier run.

    faultlab chaos run SUITE|PATH --seed N --out DIR [--junit FILE] [--start-method M] [-k REGEX]
    faultlab chaos replay DIR/SCENARIO [--out DIR2]

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

from faultlab.usage import UsageError, dir_problem, output_dir, output_file, regex, write_stdout

if TYPE_CHECKING:
    from chaos.suites import Scenario


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="chaos_command", required=True)
    run = sub.add_parser("run", help="run a chaos suite (a built-in name or a TOML path)")
    run.add_argument("suite", help="smoke, full, or a path to a suite .toml")
    run.add_argument("--seed", type=int, default=None, help="the seed (default: the suite's)")
    run.add_argument("--out", type=output_dir, required=True, help="directory for results and traces")
    run.add_argument("--junit", type=output_file, default=None, help="write JUnit XML here")
    run.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None)
    run.add_argument("-k", dest="only", type=regex, default=None,
                     help="only scenarios matching this regex")
    replay = sub.add_parser("replay", help="rerun one scenario of an earlier run exactly")
    replay.add_argument("scenario_dir", type=Path, help="DIR/SCENARIO of an earlier run")
    replay.add_argument("--out", type=output_dir, default=None, help="default: SCENARIO/replay")


def run(args: argparse.Namespace) -> int:
    if args.chaos_command == "run":
        return _run(args)
    return _replay(args)


def _run(args: argparse.Namespace) -> int:
    from chaos.runner import print_summary, run_suite, stderr_progress, timed, write_junit
    from chaos.suites import SuiteError, load_suite

    try:
        suite = load_suite(args.suite)
    except SuiteError as exc:
        raise UsageError(str(exc)) from None
    _check_selection([s.name for s in suite.scenarios], args.only, suite.name)
    seed = suite.seed if args.seed is None else args.seed
    sys.stderr.write(f"chaos suite {suite.name} ({suite.path}), seed {seed}, out {args.out}\n")
    results, wall = timed(lambda: run_suite(suite, seed, args.out, stderr_progress,
                                            args.start_method, args.only))
    summary = io.StringIO()
    print_summary(results, summary)
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


def _check_selection(names: list[str], only: str | None, suite_name: str) -> None:
    """``-k`` must select at least one scenario (a typo should not be a green, empty run)."""
    if only is None or any(re.search(only, name) for name in names):
        return
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    raise UsageError(f"-k {only!r} matches no scenario of suite {suite_name}; its scenarios: {shown}")


def _replay(args: argparse.Namespace) -> int:
    from chaos.plan import schedule_signature
    from chaos.runner import print_summary, run_one

    source = args.scenario_dir
    saved, scenario = _load_saved(source)
    out = args.out or source / "replay"
    problem = dir_problem(out)
    if problem:
        raise UsageError(f"cannot write the replay into {out}: {problem} (give --out DIR)")
    result = run_one(scenario, saved["seed"], out, saved.get("start_method"))
    summary = io.StringIO()
    print_summary([result], summary)
    same = schedule_signature(scenario.plan(saved["seed"]).resolve())
    original = _timeline_signature(source / "result.json")
    replayed = _timeline_signature(out / "result.json")
    verdict = "the same as" if original == replayed else "DIFFERENT from"
    summary.write(f"replayed seed {saved['seed']} ({len(same)} fault(s)); the fault timeline "
                  f"is {verdict} the original's\n")
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
    return timeline_signature(faults)


def timeline_signature(faults: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """What a replay must reproduce: which fault hit which rank on which call."""
    return sorted({(f["index"], f["kind"], f["rank"], f.get("method"), f.get("call"))
                   for f in faults}, key=repr)
