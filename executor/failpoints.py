"""Named failpoints: places in the protocol where a fault can be injected, free when off.

Call sites are guarded so that, with nothing enabled, a failpoint costs one global read:

    if failpoints.ACTIVE:
        failpoints.fire("worker.before_reply", rank=rank, method=method)

The executor only names the points; what happens there (raise, sleep, os._exit, damage a
chunk) is decided by whoever enables them, normally ``chaos``.  Points in each process are
enabled by calling ``enable`` in that process: the driver directly, workers through the
``FAULTLAB_FAILPOINTS`` environment variable ("module:function", called with the role and
rank at worker start-up) or through a ``collective_rpc`` callable.

Points (the phase of the protocol each one sits in):

    driver.before_pickle       driver.before_enqueue        driver.after_enqueue
    driver.before_dequeue      driver.after_dequeue         driver.before_settle (a
                               future about to be settled, by whichever thread settles)
    queue.mid_chunk_write (context: queue, msg_id, published: chunks of this message already
                           visible; fires between the parts and chunks of a message)
    queue.before_publish (context: queue, ring, index, msg_id, seq, flags; the chunk's data
                          and meta are written and checksummed but not yet visible)
    queue.after_publish (context: queue, ring, index, msg_id, seq; the chunk is visible)
    worker.after_dequeue       worker.before_unpickle       worker.before_execute
    worker.after_execute       worker.before_pickle_reply   worker.before_reply
    worker.after_reply         worker.death_pipe
    driver.before_go_live (context: resources, incarnation; a restart's new workers have all
                           said READY, the swap that makes them serve has not happened)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

ENV_VAR = "FAULTLAB_FAILPOINTS"
# A call's phases in a worker, in protocol order (chaos derives its worker phases from it).
WORKER_CALL_POINTS = (
    "worker.after_dequeue", "worker.before_unpickle", "worker.before_execute",
    "worker.after_execute", "worker.before_pickle_reply", "worker.before_reply",
    "worker.after_reply",
)
DRIVER_POINTS = (
    "driver.before_pickle", "driver.before_enqueue", "driver.after_enqueue",
    "driver.before_dequeue", "driver.after_dequeue", "driver.before_settle",
)
QUEUE_POINTS = ("queue.mid_chunk_write", "queue.before_publish", "queue.after_publish")
# Points of a restart (executor/restart.py), not of a call: they fire once per new incarnation.
RESTART_POINTS = ("driver.before_go_live",)
POINTS = frozenset({*DRIVER_POINTS, *QUEUE_POINTS, *WORKER_CALL_POINTS, *RESTART_POINTS,
                    "worker.death_pipe"})

Action = Callable[..., None]

ACTIVE = False  # read on the hot path; True while any point has an action
_actions: dict[str, Action] = {}
fired: dict[str, int] = {}  # how often each point fired in this process


def enable(name: str, action: Action) -> None:
    """Run ``action(**context)`` each time ``name`` fires in this process."""
    global ACTIVE
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {sorted(POINTS)}")
    _actions[name] = action
    ACTIVE = True


def disable(name: str | None = None) -> None:
    """Turn one point off, or every point when ``name`` is None."""
    global ACTIVE
    if name is None:
        _actions.clear()
    else:
        _actions.pop(name, None)
    ACTIVE = bool(_actions)


def fire(name: str, **context: Any) -> None:
    action = _actions.get(name)
    if action is not None:
        fired[name] = fired.get(name, 0) + 1
        action(**context)


def install_from_env(role: str, rank: int | None) -> None:
    """Call the installer named by FAULTLAB_FAILPOINTS ("module:function"), if any."""
    target = os.environ.get(ENV_VAR)
    if not target:
        return
    module_name, _, func_name = target.partition(":")
    installer = getattr(importlib.import_module(module_name), func_name)
    installer(role=role, rank=rank)
