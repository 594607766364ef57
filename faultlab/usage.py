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
- Output paths are checked writable when parsed (``output_file``, ``output_dir``): an existing
  file must open for appending (which changes nothing), a new one must be creatable where it
  would go (probed with a directory made and removed at once).  A write that still fails
  (``/dev/full`` accepts the open and fails the write) is also one line: ``write_output``.

Stdlib only: the dispatcher imports every subcommand module to build its parser.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import stat
import sys
import tempfile
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
    problem = dir_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {problem}")
    return path


def output_file(text: str) -> Path:
    """An argparse type: a file to (over)write, checked writable now (nothing is written)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    problem = file_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {problem}")
    return path


# ------------------------------------------------------------- writability probes


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or None.  An existing file must have a write
    permission bit and open for appending (then closed, its content untouched); a FIFO is
    left alone (opening it waits for a reader)."""
    try:
        if not path.exists():
            return dir_problem(path.parent if str(path.parent) else Path("."))
        mode = path.stat().st_mode
        if stat.S_ISFIFO(mode):
            return None
        if not mode & 0o222:  # root may open it, but its owner made it read-only (/proc/version too)
            return f"it is read-only (mode {stat.S_IMODE(mode):04o})"
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY))
    except (OSError, ValueError) as exc:
        return _reason(exc)
    return None


def dir_problem(path: Path) -> str | None:
    """Why nothing can be created in directory ``path`` (made later if missing), or None:
    probed by making and removing a directory in it, or in its nearest existing ancestor."""
    try:
        base = path
        while not base.exists() and base != base.parent:
            base = base.parent
        if not base.is_dir():
            return f"{base} is not a directory"
    except (OSError, ValueError) as exc:
        return _reason(exc)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".faultlab-probe-", dir=base))
    except OSError as exc:
        return f"nothing can be created in {base} ({_reason(exc)})"
    return None


def _reason(exc: OSError | ValueError) -> str:
    return str(getattr(exc, "strerror", None) or exc)


def write_output(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (parents made); any OSError becomes a ``UsageError`` line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {_reason(exc)}") from None


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout and flush; a failed write (``> /dev/full``, a closed pipe)
    becomes a ``UsageError``, and stdout is pointed at /dev/null so that the interpreter's
    own flush at exit does not print a second error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        raise UsageError(f"cannot write to stdout: {_reason(exc)}") from None
