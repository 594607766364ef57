"""``faultlab chaos``: run a suite, or replay one scenario of an earlier run.

    faultlab chaos run SUITE|PATH --seed N --out DIR [--junit FILE] [--start-method M] [-k REGEX]
    faultlab chaos replay DIR/SCENARIO [--out DIR2]

Exit status: 0 when every invariant held, 1 when one broke, 2 for a malformed suite.
Progress goes to stderr, the summary table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="chaos_command", required=True)
    run = sub.add_parser("run", help="run a chaos suite (a built-in name or a TOML path)")
    run.add_argument("suite", help="smoke, full, or a path to a suite .toml")
    run.add_argument("--seed", type=int, default=None, help="the seed (default: the suite's)")
    run.add_argument("--out", type=Path, required=True, help="directory for results and traces")
    run.add_argument("--junit", type=Path, default=None, help="write JUnit XML here")
    run.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None)
    run.add_argument("-k", dest="only", default=None, help="only scenarios matching this regex")
    replay = sub.add_parser("replay", help="rerun one scenario of an earlier run exactly")
    replay.add_argument("scenario_dir", type=Path, help="DIR/SCENARIO of an earlier run")
    replay.add_argument("--out", type=Path, default=None, help="default: SCENARIO/replay")


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
        sys.stderr.write(f"faultlab chaos: {exc}\n")
        return 2
    seed = suite.seed if args.seed is None else args.seed
    sys.stderr.write(f"chaos suite {suite.name} ({suite.path}), seed {seed}, out {args.out}\n")
    results, wall = timed(lambda: run_suite(suite, seed, args.out, stderr_progress,
                                            args.start_method, args.only))
    print_summary(results)
    sys.stdout.write(f"wall time {wall:.1f} s, {len(results) / wall * 60:.1f} scenarios/min\n")
    if args.junit is not None:
        write_junit(results, suite.name, args.junit, wall)
    return 0 if all(r.ok for r in results) else 1


def _replay(args: argparse.Namespace) -> int:
    from chaos.plan import schedule_signature
    from chaos.runner import print_summary, run_one
    from chaos.suites import Scenario

    source = args.scenario_dir
    try:
        saved = json.loads((source / "scenario.json").read_text())
    except FileNotFoundError:
        sys.stderr.write(f"faultlab chaos replay: {source}/scenario.json not found; "
                         "give DIR/SCENARIO of an earlier 'faultlab chaos run'\n")
        return 2
    scenario = Scenario.from_dict(saved["scenario"], "scenario", {})
    out = args.out or source / "replay"
    result = run_one(scenario, saved["seed"], out, saved.get("start_method"))
    print_summary([result])
    same = schedule_signature(scenario.plan(saved["seed"]).resolve())
    original = _timeline_signature(source / "result.json")
    replayed = _timeline_signature(out / "result.json")
    verdict = "the same as" if original == replayed else "DIFFERENT from"
    sys.stdout.write(f"replayed seed {saved['seed']} ({len(same)} fault(s)); the fault timeline "
                     f"is {verdict} the original's\n")
    return 0 if result.ok else 1


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
