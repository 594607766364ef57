"""Command-line usage errors: one line on stderr, exit status 2, never a traceback.

    a flag's value ──argparse type──► ArgumentTypeError ──► OneLineParser.error ──┐
    run() finds the value impossible with what it loaded                          ├─► one stderr line
      (the suite, the model config, RUN_DIR) ──► UsageError ──► cli.main ─────────┘   "faultlab X: error:
                                                                                       ...", exit 2

Invariants:

- Exit status 2 means "the command line asks for something that cannot be done; nothing
  ran and no output file was written".  Exit 1 stays reserved for a run whose result is bad
  (an invariant broke in ``faultlab chaos run``, the demo's engine failed).
- A usage error is exactly one line: messages are collapsed onto one line before printing.
- Checks happen before any worker starts; a limit that depends on something loaded (a suite,
  the model config) is checked by ``run()`` right after loading it, by raising ``UsageError``.

Stdlib only: the dispatcher imports every subcommand module to build its parser.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


class UsageError(Exception):
    """The command line cannot be carried out; ``faultlab.cli.main`` prints it and exits 2."""


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def print_usage_error(prog: str, message: str) -> None:
    sys.stderr.write(f"{prog}: error: {one_line(message)}\n")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        print_usage_error(self.prog, f"{message} (see {self.prog} -h)")
        sys.exit(2)


# ------------------------------------------------------------- type functions


def int_in(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``minimum .. maximum`` (inclusive)."""
    span = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {value}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def regex(text: str) -> str:
    """An argparse type: a valid regular expression (kept as text)."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a valid regular expression {text!r}: {exc}") from None
    return text


def output_dir(text: str) -> Path:
    """An argparse type: a directory to write into (created later if missing)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    return path


def output_file(text: str) -> Path:
    """An argparse type: a file to (over)write; not an existing directory."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    return path
