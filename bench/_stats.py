"""Small helpers shared by the bench scripts: percentiles, machine facts, RESULTS.md sections,
and the forked Pipe peers that serve as baselines.

    samples (seconds) ──► Summary(p50, p99, mean, max, n) ──► table rows ──► print / markdown
                                                                          └─► write_section()

``write_section`` replaces only the ``## <title>`` section of ``bench/RESULTS.md`` (up to
the next ``## `` heading) or appends it, under an ``flock`` so that two bench scripts
finishing at once do not lose each other's section.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import math
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no samples."""
    if not samples:
        return math.nan
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p99: float
    mean: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        if not samples:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        return cls(len(samples), percentile(samples, 50), percentile(samples, 99),
                   sum(samples) / len(samples), max(samples))


def fmt_time(seconds: float) -> str:
    """A duration with a unit that keeps 3 significant digits: '41.2 µs', '3.07 ms', '1.20 s'."""
    if math.isnan(seconds):
        return "n/a"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale or unit == "µs":
            value = seconds / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def fmt_ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}×"


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    info = {
        "nproc": str(os.cpu_count()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    try:
        info["loadavg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    return info


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    table = [list(header), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def replace_section(text: str, title: str, body: str) -> str:
    """``text`` with its ``## title`` section replaced by ``body`` (appended when absent)."""
    heading = f"## {title}"
    section = body.rstrip("\n") + "\n"
    if not section.startswith(heading):
        section = f"{heading}\n\n{section}"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return text + sep + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def write_section(path: str | os.PathLike[str], title: str, body: str) -> None:
    """Replace (or append) one ``## title`` section of a markdown file, leaving the rest alone."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            text = f.read() or "# faultlab benchmark results\n\n"
            f.seek(0)
            f.truncate()
            f.write(replace_section(text, title, body))
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fork_pipe_peers(target: Any, n: int = 2) -> tuple[list[Any], list[Any]]:
    """``n`` forked processes each running ``target(conn)`` at the far end of a duplex Pipe;
    returns our ends and the processes (the Pipe baseline of several benches)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    conns, procs = [], []
    for _ in range(n):
        mine, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=target, args=(theirs,), daemon=True)
        proc.start()
        theirs.close()
        conns.append(mine)
        procs.append(proc)
    return conns, procs
