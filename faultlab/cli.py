"""The ``faultlab`` command line: one subcommand per part, each defined in its own module.

Each module named in ``SUBCOMMANDS`` provides ``configure(parser)`` to declare its
arguments and ``run(args) -> int`` to execute; this file only dispatches, so a part can
change its command without touching the others.  Modules are imported when the parser is
built, so they must keep heavy imports (torch, pandas) inside ``run``.

Exit status: what ``run`` returns (0 ok, 1 a bad result); 2 for every usage error, printed
as one line on stderr (``faultlab.usage``: argparse type errors and ``UsageError``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from faultlab.usage import OneLineParser, UsageError, print_usage_error

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("faultlab.demo", "run the engine on the built-in tensor-parallel model"),
    "trace": ("faultlab.trace_cli", "export or replay a recorded run's traces"),
    "chaos": ("faultlab.chaos_cli", "run, replay or compare fault-injection suites"),
    "worker": ("faultlab.worker_cli", "start the workers of a remote node of an executor"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="faultlab",
        description="faultlab: run, trace and break a multi-process inference executor.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(sub_parser)
        sub_parser.set_defaults(run_command=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run_command(args) or 0)
    except UsageError as exc:
        print_usage_error(f"faultlab {args.command}", str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
