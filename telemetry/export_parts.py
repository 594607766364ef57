"""A streamed export split between forked processes, joined into one document.

Data flow::

    RunStream (indexed once, in the parent) ──fork──► part i: traces [lo_i, hi_i) ──►
        writer(traces, file) ──► DIR/part-i.json ('{"data":[' + traces + ']}') and its count
    parent: head + the parts' bodies (each without its head and "]}"), comma-joined + "]}"
        ──► out, 1 MiB at a time
    run_in_parts(stream, task, n): the same fork and join for any task over a range of
        traces that returns an int (``faultlab trace send``: each part sends its own batches)

Invariants:

- The joined text is the single-process text: parts are contiguous ranges of the stream's
  order, each told with the whole run's story (``RunStream.traces(start, stop)``).
- Every part process is joined (killed first if the parent is interrupted) before this
  returns or raises; the part files live in a temporary directory removed at the end.
- The writers' text is ASCII (``json.dumps`` escapes the rest), so byte offsets are
  character offsets.
"""

from __future__ import annotations

import functools
import multiprocessing
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from telemetry.stream import RunStream

TAIL = "]}"
_COPY_BYTES = 1 << 20


def write_in_parts(
    stream: RunStream, write: Callable[..., int], head: str, out: TextIO, workers: int,
) -> int:
    """Write the document of ``stream`` through ``write`` in ``workers`` parts; the count."""
    with tempfile.TemporaryDirectory(prefix="faultlab-export-") as tmp:
        paths = [Path(tmp) / f"part-{i}.json" for i in range(workers)]
        counts = run_in_parts(stream, functools.partial(_write_part, write=write, paths=paths),
                              workers)
        out.write(head)
        sep = ""
        for path in paths:
            if _copy_body(path, len(head), out, sep):
                sep = ","
        out.write(TAIL)
        return sum(counts)


def run_in_parts(stream: RunStream, task: Callable[[RunStream, int, int, int], int],
                 workers: int) -> list[int]:
    """``task(stream, part, start, stop)`` in ``workers`` forked processes, each over a
    contiguous range of the stream's traces; the int each returned, in part order."""
    bounds = [stream.n_traces * i // workers for i in range(workers + 1)]
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="faultlab-parts-") as tmp:
        results = [Path(tmp) / f"part-{i}.result" for i in range(workers)]
        procs = [ctx.Process(target=_run_part, name=f"faultlab-export-part-{i}",
                             args=(task, stream, i, bounds[i], bounds[i + 1], results[i]))
                 for i in range(workers)]
        try:
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        failed = [(p.name, p.exitcode) for p in procs if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"export part processes failed (name, exit code): {failed}")
        return [int(path.read_text()) for path in results]


def _run_part(task: Callable[[RunStream, int, int, int], int], stream: RunStream, part: int,
              start: int, stop: int, result: Path) -> None:
    result.write_text(str(task(stream, part, start, stop)))


def _write_part(stream: RunStream, part: int, start: int, stop: int, *,
                write: Callable[..., int], paths: list[Path]) -> int:
    with open(paths[part], "w", encoding="ascii") as f:
        return write(stream.traces(start, stop), f)


def _copy_body(path: Path, head: int, out: Any, sep: str) -> bool:
    """Copy a part's body (between its head and tail) to ``out``; False when it is empty."""
    left = path.stat().st_size - head - len(TAIL)
    if left <= 0:
        return False
    out.write(sep)
    with open(path, "rb") as f:
        f.seek(head)
        while left > 0:
            chunk = f.read(min(_COPY_BYTES, left))
            if not chunk:
                raise RuntimeError(f"export part {path} ended early")
            out.write(chunk.decode("ascii"))
            left -= len(chunk)
    return True
