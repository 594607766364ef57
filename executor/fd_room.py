"""Room for the driver's file descriptors, checked before anything of an executor starts.

    MultiprocExecutor._start ─► ensure_fd_room(local workers)
        needed = fds open now + FDS_PER_WORKER × workers + FD_MARGIN
        soft RLIMIT_NOFILE ≥ needed ─► nothing to do
        hard limit ≥ needed ─► raise the soft limit to the hard limit (logged)
        else ─► ResourceLimitError naming both numbers: nothing was started

Each local worker costs the driver about eight fds once it runs (three doorbell pipe ends,
its READY pipe, its pidfd, the multiprocessing sentinel, a ring fd until start-up is done)
and a few more while it starts.  Without this check a large ``tensor_parallel_size`` starts
some workers and then fails with EMFILE halfway, or reports READY with workers that crash.
Nothing here uses ``select``: fd numbers past 1,024 are fine everywhere in the executor.
"""

from __future__ import annotations

import logging
import os
import resource

from executor.errors import ResourceLimitError

FDS_PER_WORKER = 12  # measured: 8 per running worker (TP=255: 2,053 fds), 12 while starting
FD_MARGIN = 64  # the telemetry journal, the monitor's pipes, the caller's own opens meanwhile

log = logging.getLogger("executor")


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: assume few
        return 16


def ensure_fd_room(workers: int) -> None:
    """Make sure this process may open the fds ``workers`` local workers need, or refuse."""
    needed = open_fds() + FDS_PER_WORKER * workers + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("raised the open-files limit (RLIMIT_NOFILE) from %d to %s for %d workers",
                 soft, hard, workers)
        return
    raise ResourceLimitError(
        f"{workers} local workers need about {needed} open file descriptors in the driver, but "
        f"RLIMIT_NOFILE allows {hard} (soft {soft}): raise it (ulimit -n) or start fewer "
        "workers per node; nothing was started"
    )
