"""A streamed export split between forked processes, joined into one document.

Data flow::

    RunStream (indexed once, in the parent) ──fork──► part i: traces [lo_i, hi_i) ──►
        writer(traces, file) ──► DIR/part-i.json ('{"data":[' + traces + ']}') and its count
    parent: head + the parts' bodies (each without its head and "]}"), comma-joined + "]}"
        ──► out, 1 MiB at a time

Invariants:

- The joined text is the single-process text: parts are contiguous ranges of the stream's
  order, each told with the whole run's story (``RunStream.traces(start, stop)``).
- Every part process is joined (killed first if the parent is interrupted) before this
  returns or raises; the part files live in a temporary directory removed at the end.
- The writers' text is ASCII (``json.dumps`` escapes the rest), so byte offsets are
  character offsets.
"""

from __future__ import annotations

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
    bounds = [stream.n_traces * i // workers for i in range(workers + 1)]
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="faultlab-export-") as tmp:
        paths = [Path(tmp) / f"part-{i}.json" for i in range(workers)]
        procs = [ctx.Process(target=_write_part, name=f"faultlab-export-part-{i}",
                             args=(stream, write, bounds[i], bounds[i + 1], paths[i]))
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
        out.write(head)
        sep = ""
        for path in paths:
            if _copy_body(path, len(head), out, sep):
                sep = ","
        out.write(TAIL)
        return sum(int(path.with_suffix(".count").read_text()) for path in paths)


def _write_part(stream: RunStream, write: Callable[..., int], start: int, stop: int,
                path: Path) -> None:
    with open(path, "w", encoding="ascii") as f:
        count = write(stream.traces(start, stop), f)
    path.with_suffix(".count").write_text(str(count))


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
