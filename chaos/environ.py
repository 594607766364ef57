"""Environment variables set for a while: ``restored_environ`` saves the named ones, and puts
each back (or removes it, if it was unset) when the block ends, however it ends.

Workers take their environment when they start, so chaos sets variables (trace directory,
failpoint installer, a queue mutant's name) around an executor's start and must leave the
caller's environment exactly as it found it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def restored_environ(keys: Iterable[str]) -> Iterator[dict[str, str | None]]:
    """Yield the saved values of ``keys`` (None: unset); restore them all on the way out."""
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield saved
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
