"""``faultlab chaos explore``: search the fault space for a while (chaos.explore).

    faultlab chaos explore --budget 5m --out DIR [--mutant NAME] [--seed N] [--target NAME]
                           [--shrink-runs N] [--reproductions N] [--max-findings N]
                           [--regressions PATH]

Writes DIR/scenarios/swarm-SEED/ (each run, its history.jsonl), DIR/findings/, DIR/coverage.md,
DIR/coverage.json, DIR/junit.xml and DIR/explore.json.  A finding on the real executor is
filed in chaos/suites/regressions.toml (which ``faultlab chaos run`` replays first); aimed
at a mutant, in DIR/regressions.toml.  Exit status: 0 when nothing was found, 1 when
something was (flaky findings included), 2 for a usage error.  ``--target`` another chaos
target (processpool, loky, pebble, ray, vllm) explores it from outside instead
(faultlab.explore_target_cli); ``--mutant`` is faultlab's only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from faultlab import explore_target_cli
from faultlab.usage import int_in, output_dir, output_file, write_stdout

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """An argparse type: "60s", "5m", "1.5h" or plain seconds, more than zero."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"a duration is a positive number with s, m or h, "
                                         f"e.g. 60s or 5m; got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def mutant_names() -> list[str]:
    """The planted executors of chaos.mutants (subclasses of MultiprocExecutor) and planted
    recoveries (subclasses of the model's Recovery: only the recovery family runs them)."""
    import chaos.mutants as mutants
    from executor import MultiprocExecutor
    from executor.model.recovery import Recovery

    bases = (MultiprocExecutor, Recovery)
    return sorted(name for name, value in vars(mutants).items()
                  if isinstance(value, type) and issubclass(value, bases)
                  and value not in bases and not name.startswith("_"))


def mutant(text: str) -> str:
    names = mutant_names()
    if text not in names:
        raise argparse.ArgumentTypeError(f"no executor mutant {text!r} (nor Recovery) in chaos.mutants; "
                                         f"known: {', '.join(names)}")
    return text


def configure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explore = sub.add_parser(
        "explore", help="search the fault space with swarm scenarios for a time budget",
        description="Runs swarm scenarios (a seed switches fault sites on) until --budget ends; "
                    "shrinks, reproduces and files each new failure.  To aim it at a planted "
                    "bug, pass --mutant NAME, a class of chaos.mutants, e.g. "
                    "'faultlab chaos explore --budget 5m --mutant SkipsChecksum --out DIR'.")
    explore.add_argument("--budget", type=duration, required=True,
                         help="how long to explore: 60s, 5m, 1h (shrinking a finding is extra)")
    explore.add_argument("--out", type=output_dir, required=True,
                         help="directory for histories, findings, coverage and junit.xml")
    explore.add_argument("--target", default="faultlab",
                         help="the executor to explore: faultlab (default: its failpoints, "
                              "swarm and mutants), or processpool, loky, pebble, ray, vllm "
                              "(outside faults drawn per seed: chaos.targets.swarm)")
    explore.add_argument("--mutant", type=mutant, default=None,
                         help="aim at a planted bug: a class of chaos.mutants (SkipsChecksum, "
                              "NoSigkill, SwallowsDeath, IgnoresRequestIds, ...; a planted "
                              "Recovery such as CountsNoMismatch runs in recovery seeds only)")
    explore.add_argument("--seed", type=int, default=0, help="the first swarm seed (default 0)")
    explore.add_argument("--shrink-runs", type=int_in(0, 10000), default=40,
                         help="at most this many runs to shrink each finding (default 40)")
    explore.add_argument("--reproductions", type=int_in(1, 100), default=3,
                         help="reruns of each shrunk finding, reported as k of n (default 3)")
    explore.add_argument("--max-findings", type=int_in(1), default=None,
                         help="stop once this many distinct failures are filed (e.g. 1 to time "
                              "the first find of a mutant)")
    explore.add_argument("--regressions", type=output_file, default=None,
                         help="the suite findings are filed in (default: see above)")


def run(args: argparse.Namespace) -> int:
    from chaos.explore import Exploration, Limits
    from chaos.regressions import REGRESSIONS

    if args.target != "faultlab":
        return explore_target_cli.run(args)
    executor = f"chaos.mutants:{args.mutant}" if args.mutant else ""
    regressions = args.regressions or (None if args.mutant else REGRESSIONS)
    sys.stderr.write(f"chaos explore: {'mutant ' + args.mutant if args.mutant else 'the real executor'}"
                     f", budget {args.budget:g} s, seeds from {args.seed}, out {args.out}\n")
    exploration = Exploration(args.out, executor, args.seed,
                              Limits(shrink_runs=args.shrink_runs, reproductions=args.reproductions),
                              regressions, say=explore_target_cli.say, max_findings=args.max_findings)
    findings = exploration.run(args.budget)
    write_stdout(summary(exploration, Path(args.out)))
    return 1 if findings else 0


def summary(exploration: object, out: Path) -> str:
    from chaos.explore import Exploration

    assert isinstance(exploration, Exploration)
    lines = [f"explored {exploration.runs} scenarios; {len(exploration.findings)} finding(s)"]
    for f in exploration.findings:
        lines += explore_target_cli.finding_lines(
            f, f.schedule_length(f.original), f.schedule_length(f.shrunk),
            f"faultlab chaos replay {f.run_dir}")
    never = exploration.coverage.never_reached()
    lines.append(f"coverage: {out / 'coverage.md'} ({len(never)} sometimes-propert"
                 f"{'y' if len(never) == 1 else 'ies'} never reached); junit: {out / 'junit.xml'}")
    return "\n".join(lines) + "\n"
