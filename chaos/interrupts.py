"""Running a workload where SIGINT can reach it: on the main thread, under a watchdog.

    run_scenario ─► needs_main_thread(plan, workload)?
        yes ─► contained_sigint(): a SIGINT raises KeyboardInterrupt while ``armed`` (the
               workload runs), and is only counted afterwards (a late one from a worker
               must not unwind the scenario's own cleanup)
               run_on_main_thread(workload, proxy, bound_s, on_hang): a timer thread shuts
               the executor down if the workload passes its bound (a hang, never a hung run)

Only the main thread receives KeyboardInterrupt from SIGINT: a plan with ``interrupt_driver``
(or a workload marked ``needs_main_thread``) is refused anywhere else, with a clear error.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from chaos.faults import PlanError
from chaos.plan import FaultPlan
from chaos.recording import RecordingExecutor
from chaos.workloads import Workload


def needs_main_thread(plan: FaultPlan, workload: Workload) -> bool:
    return any(f.kind == "interrupt_driver" for f in plan.faults) or bool(
        getattr(workload, "needs_main_thread", False))


def check_main_thread(plan: FaultPlan, workload: Workload) -> None:
    if needs_main_thread(plan, workload) and threading.current_thread() is not threading.main_thread():
        raise PlanError("interrupt_driver: SIGINT reaches only the main thread; call "
                        "run_scenario from the main thread for this plan or workload")


class SigintState:
    def __init__(self) -> None:
        self.armed = True
        self.late = 0  # SIGINTs that arrived after the workload ended

    def handler(self, signum: int, frame: Any) -> None:
        if self.armed:
            raise KeyboardInterrupt
        self.late += 1


@contextmanager
def contained_sigint() -> Iterator[SigintState]:
    state = SigintState()
    old = signal.signal(signal.SIGINT, state.handler)
    try:
        yield state
    finally:
        state.armed = False
        signal.signal(signal.SIGINT, old)


def run_on_main_thread(workload: Workload, proxy: RecordingExecutor, state: SigintState,
                       bound_s: float, on_hang: Callable[[], None]) -> None:
    """Run ``workload(proxy)`` here; a KeyboardInterrupt it lets escape ends it quietly."""
    watchdog = threading.Timer(bound_s, on_hang)
    watchdog.name = "chaos-watchdog"
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            workload(proxy)
        except (KeyboardInterrupt, Exception):  # noqa: BLE001 - the calls recorded it
            pass
        finally:
            state.armed = False
            watchdog.cancel()
    except KeyboardInterrupt:  # landed in the finally block itself
        state.armed = False
    watchdog.join()


def probe_in_step(proxy: RecordingExecutor, n: int = 3) -> None:
    """Calls with unique payloads after an interrupt: each must return its own result."""
    from executor import ExecutorError

    for i in range(n):
        try:
            proxy.collective_rpc("echo", args=(f"after-interrupt-{i}",), timeout=5.0,
                                 expect_errors=frozenset({"ok"}), check="interrupt")
        except (ExecutorError, TimeoutError, KeyboardInterrupt):
            continue
