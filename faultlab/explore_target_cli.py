"""``faultlab chaos explore --target NAME`` (a target other than faultlab) and ``faultlab
chaos replay`` of a target run: the command side of chaos.targets.explore.

    explore --target loky --budget 120s --out DIR [--seed N] [--shrink-runs N]
            [--reproductions N] [--max-findings N] [--regressions PATH]
        ──► chaos.targets.explore.TargetExploration ──► DIR/explore.json, coverage.md/json,
            junit.xml, regressions.toml (findings about that target), flaky.toml
    replay DIR/findings/F/run   (a dir holding target_scenario.json) ──► DIR/.../replay

Usage errors (exit 2, one line, before anything runs): an unknown target (naming the
known ones), a target that is not installed (naming how to install it: for vllm,
scripts/install_vllm_target.sh), ``--mutant`` with a target other than faultlab (the
mutants are faultlab's executor), a ``--regressions`` file under chaos/suites (that suite is
faultlab's own).  Exit status otherwise as explore's: 1 when something was found.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from faultlab.usage import UsageError, write_stdout


def resolve(name: str) -> Any:
    """The Target called ``name``, or a UsageError that says what to do."""
    from chaos.targets.base import TARGET_NAMES, TargetUnavailable, get_target

    if name not in TARGET_NAMES:
        raise UsageError(f"--target {name}: unknown target; known: {', '.join(TARGET_NAMES)}")
    try:
        return get_target(name)
    except TargetUnavailable as exc:
        raise UsageError(f"--target {name}: not installed here: {exc}") from None
    except ImportError as exc:
        raise UsageError(f"--target {name}: chaos.targets.{name}_target cannot be imported "
                         f"({exc}); install the project's 'targets' extra") from None


def run(args: argparse.Namespace) -> int:
    from chaos.explore import Limits
    from chaos.suites import SUITE_DIR
    from chaos.targets.explore import TargetExploration

    if args.mutant:
        raise UsageError(f"--mutant {args.mutant} plants a bug in faultlab's executor: it goes "
                         f"with --target faultlab, not --target {args.target}")
    if args.regressions is not None and Path(args.regressions).resolve().parent == SUITE_DIR.resolve():
        raise UsageError(f"--regressions {args.regressions}: chaos/suites holds faultlab's own "
                         f"suites; a finding about {args.target} goes in DIR/regressions.toml")
    target = resolve(args.target)
    sys.stderr.write(f"chaos explore: target {target.name}, budget {args.budget:g} s, seeds "
                     f"from {args.seed}, out {args.out}\n")
    exploration = TargetExploration(
        target, Path(args.out), args.seed,
        Limits(shrink_runs=args.shrink_runs, reproductions=args.reproductions), say=say,
        max_findings=args.max_findings, regressions=args.regressions)
    findings = exploration.run(args.budget)
    write_stdout(summary(exploration, Path(args.out)))
    return 1 if findings else 0


def say(text: str) -> None:
    """A progress line on stderr (stdout is the summary)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def finding_lines(f: Any, before: int, after: int, reproduce: str) -> list[str]:
    """A finding in a summary: when first found, its schedule shrunk ``before`` -> ``after``
    (faults plus calls), how often it reproduced, and the command that reproduces it."""
    state = "FLAKY" if f.flaky else "reproduced"
    return [f"  {f.name}: first at {f.found_after_s:.1f} s (seed {f.seed}), schedule "
            f"{before} -> {after}, {state} {f.reproduced} of {f.tries}, seen {f.duplicates} "
            "more time(s)", f"    Reproduce with: {reproduce}"]


def summary(exploration: Any, out: Path) -> str:
    from chaos.targets.explore import reproduce_command, schedule_length

    lines = [f"explored {exploration.runs} scenarios on {exploration.target.name}; "
             f"{len(exploration.findings)} finding(s) about {exploration.target.name}"]
    for f in exploration.findings:
        lines += finding_lines(f, schedule_length(f.original), schedule_length(f.shrunk),
                               reproduce_command(f))
    filed = exploration.regressions or out / "regressions.toml"
    lines.append(f"coverage: {out / 'coverage.md'}; junit: {out / 'junit.xml'}"
                 + (f"; findings filed in {filed}" if exploration.findings else ""))
    return "\n".join(lines) + "\n"


def is_target_run(source: Path) -> bool:
    from chaos.targets.explore import SAVED

    return (source / SAVED).is_file()


def replay(source: Path, out: Path) -> int:
    """Rerun a target run of ``explore --target`` (its target_scenario.json) into ``out``."""
    from chaos.targets import explore as target_explore
    from chaos.targets.compare import summary as target_summary

    try:
        name, _, _ = target_explore.load_saved(source)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    verdict, same = target_explore.replay(source, out, resolve(name))
    text = target_summary([verdict.result])
    text += "".join(f"    {p}\n" for p in verdict.problems if p.startswith("history."))
    text += (f"replayed {verdict.result.scenario} on {name} (seed {verdict.result.seed}); it "
             f"broke {'the same invariants as' if same else 'DIFFERENT invariants from'} the "
             f"original: {', '.join(sorted(verdict.signature)) or 'none'}\n")
    write_stdout(text)
    return 1 if verdict.problems else 0
