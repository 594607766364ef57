"""A worker-side call that makes its worker stubborn: only SIGKILL ends it.

    CallSpec("chaos.stubborn:sleep", (seconds,), timeout) ──► a worker runs sleep(worker, s):
        SIGTERM ignored, the death-pipe watcher held in its failpoint, then time.sleep(s)

Named ``sleep`` on purpose: the oracles judge it as EchoWorker.sleep (its value is its
seconds; a timeout shorter than them asks for a TimeoutError).  A swarm puts it last in a
workload (the worker is busy for ``seconds`` after it), so that shutdown finds a worker that
neither its request nor SIGTERM can stop: it must escalate to SIGKILL in its grace periods
(chaos.mutants.NoSigkill does not).  Its process is not usable for anything after.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from executor import failpoints


def sleep(worker: Any, seconds: float) -> float:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    failpoints.enable("worker.death_pipe", lambda **_: time.sleep(3600))
    time.sleep(seconds)
    return seconds
