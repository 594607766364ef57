"""Checking a usage error of ``faultlab``, run in the test's own process: exit code 2 and
exactly one line on stderr, no traceback (the tests of each command group share this)."""

from __future__ import annotations

import pytest

from faultlab.cli import main


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``faultlab ARGV``; assert exit 2 and one stderr line; return that line."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's errors (faultlab.usage.OneLineParser)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err.strip()
