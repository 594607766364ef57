"""Mutants: deliberately broken executors, each breaking one promise, so that every oracle
and every property test can be shown failing on a run that breaks it.

    an oracle or property ──runs against──► a mutant ──must report──► the promise it breaks

Planted *judges* (bugs in the oracles, the history checker, coverage, dedupe, shrink and
the targets' grades) live beside them in ``chaos.planted_judges``: ``all_planted()`` here
returns every one.

They ship with chaos (not the tests) so that a driver subprocess can import them by name,
and so that users can check their own oracles the same way.  They reach into executor
internals on purpose: a broken executor is a patched one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, ClassVar

import executor.death_pipes
import executor.worker_proc
from chaos.environ import restored_environ
from chaos.planted_judges import PlantedJudge, all_planted  # noqa: F401 - planted judges live here too
from executor import MultiprocExecutor, failpoints
from executor.calls import PendingCall, ReplyCollector
from executor.model.recovery import Recovery
from executor.serialization import peek
from executor.shm_queue import QueueReader, QueueWriter
from executor.shm_ring import READ_FLAGS, U64
from executor.waiting import fence, ring


class DropsDeadline(MultiprocExecutor):
    """Ignores ``timeout``: a call outlives its deadline."""

    def collective_rpc(self, method: Any, timeout: float | None = None, *a: Any, **kw: Any) -> Any:
        return super().collective_rpc(method, None, *a, **kw)


class SwallowsDeath(MultiprocExecutor):
    """Never notices a dead worker: no failure, no callback, calls just time out."""

    def _on_worker_death(self, rank: int, pid: int, exitcode: int | None, detected_ns: int) -> None:
        pass


class IgnoresLostNodes(MultiprocExecutor):
    """The hub reports a lost node and the executor shrugs: calls to it just time out."""

    def _on_node_lost(self, node: int, ranks: list[int], why: str) -> None:
        pass


class CallbackTwice(MultiprocExecutor):
    """Runs the failure callbacks twice."""

    def _run_callbacks(self) -> None:
        callbacks = list(self._callbacks)
        super()._run_callbacks()
        for cb in callbacks:
            cb()


class WrongResults(MultiprocExecutor):
    """Returns another call's value for ``echo``."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        out = super().collective_rpc(method, *a, **kw)
        return ["garbage"] * self.world_size if method == "echo" else out


class UndocumentedError(MultiprocExecutor):
    """Raises a KeyError where a documented error belongs."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        if method == "sleep":
            raise KeyError("not a documented error")
        return super().collective_rpc(method, *a, **kw)


class ReversedFutures(MultiprocExecutor):
    """Resolves each pair of non-blocking calls in reverse order (values stay right)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._held: list[tuple[Future[Any], Future[Any]]] = []

    def collective_rpc(self, method: Any, timeout: float | None = None, args: Any = (),
                       kwargs: Any = None, non_block: bool = False, *rest: Any) -> Any:
        real = super().collective_rpc(method, timeout, args, kwargs, non_block, *rest)
        if not non_block:
            return real
        mine: Future[Any] = Future()
        self._held.append((real, mine))
        if len(self._held) == 2:
            pair, self._held = self._held, []
            threading.Timer(0.1, _resolve_reversed, args=(pair,)).start()
        return mine


def _resolve_reversed(pair: list[tuple[Future[Any], Future[Any]]]) -> None:
    for real, mine in reversed(pair):
        mine.set_result(real.result())


class SlowShutdown(MultiprocExecutor):
    """Dawdles in shutdown."""

    def shutdown(self) -> None:
        time.sleep(1.5)
        super().shutdown()


class LeaksThread(MultiprocExecutor):
    """Leaves a thread running after shutdown."""

    def shutdown(self) -> None:
        super().shutdown()
        threading.Thread(target=time.sleep, args=(4.0,), name="leaked-by-executor",
                         daemon=True).start()


class ForgetsDeathPipe(MultiprocExecutor):
    """Forked workers keep their copy of the death pipe's write end, so the driver's
    death never reaches them: they are orphaned (fork start method only)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        original = executor.death_pipes.close_inherited
        executor.death_pipes.close_inherited = lambda: None  # inherited by forked workers
        try:
            super().__init__(*a, **kw)
        finally:
            executor.death_pipes.close_inherited = original


class NoExitGuard(MultiprocExecutor):
    """Workers start without their exit guard: one whose main thread holds the GIL in C code
    never sees its driver die (fork start method only: the patch is inherited)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        import executor.process_setup

        original = executor.process_setup.start_guard
        executor.process_setup.start_guard = lambda death_fd, grace_s, driver_pid: 0
        try:
            super().__init__(*a, **kw)
        finally:
            executor.process_setup.start_guard = original


def _select_block(self: Any, ready: Any, deadline: float | None) -> bool:
    import select

    fds = [*self.interrupt_fds, *([self.doorbell.fd] if self.doorbell is not None else [])]
    while True:  # BUG: select() cannot take an fd number of 1,024 or more
        self.flags[self.index] = 1
        fence()
        if ready():
            self.flags[self.index] = 0
            return True
        timeout = self.policy.block_slice_s if deadline is None else min(
            self.policy.block_slice_s, deadline - time.monotonic())
        if timeout <= 0:
            self.flags[self.index] = 0
            return bool(ready())
        readable, _, _ = select.select(fds, [], [], timeout)
        self.flags[self.index] = 0
        if self.doorbell is not None and self.doorbell.fd in readable:
            self.doorbell.drain()
        if any(fd in readable for fd in self.interrupt_fds):
            self.on_interrupt()


class WaitsInSelect(MultiprocExecutor):
    """Its queue ends wait in ``select()`` (round 3): a driver holding 1,100 fds gets a raw
    ``ValueError: filedescriptor out of range`` and forked workers crash the same way.  The
    patch is the process's while any of these executors lives (forked workers inherit it)."""

    _alive: ClassVar[list[Any]] = []  # the original _block while patched, one entry per executor

    def __init__(self, *a: Any, **kw: Any) -> None:
        import executor.waiting

        sleeper = executor.waiting.Sleeper
        self._alive.append(self._alive[0] if self._alive else sleeper._block)
        sleeper._block = _select_block  # type: ignore[method-assign]
        try:
            super().__init__(*a, **kw)
        except BaseException:
            self._unpatch()
            raise

    def shutdown(self) -> None:
        super().shutdown()
        self._unpatch()

    def _unpatch(self) -> None:
        import executor.waiting

        if self._alive:
            original = self._alive.pop()
            if not self._alive:
                executor.waiting.Sleeper._block = original  # type: ignore[method-assign]


def leaked_segment_name() -> str:
    return f"faultlab_{os.getpid()}_broken_leak"


# ---------------------------------------------------------------- what surrounds the executor
# Each re-creates a defect of issue 11 on top of the executor, whatever its fixes.

class PoisonedByAggregator(MultiprocExecutor):
    """Once an aggregator raised, every later call re-raises that error."""

    _poison: BaseException | None = None

    def collective_rpc(self, method: Any, *a: Any, aggregator: Any = None, **kw: Any) -> Any:
        if self._poison is not None:
            raise self._poison
        if aggregator is None:
            return super().collective_rpc(method, *a, **kw)

        def remember(values: list[Any]) -> Any:
            try:
                return aggregator(values)
            except Exception as exc:
                self._poison = exc
                raise

        return super().collective_rpc(method, *a, **{**kw, "aggregator": remember})


class CallbacksUnderLock(MultiprocExecutor):
    """Runs a future's done-callbacks while holding the reply collector's lock."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        out = super().collective_rpc(method, *a, **kw)
        if isinstance(out, Future):
            add, lock = out.add_done_callback, self._collector.lock

            def add_under_lock(fn: Any) -> None:
                def run(f: Any) -> None:
                    took = lock.acquire(timeout=0)  # held already when the bug is in the executor
                    try:
                        fn(f)
                    finally:
                        if took:
                            lock.release()

                add(run)

            out.add_done_callback = add_under_lock  # type: ignore[method-assign]
        return out


class InterruptAsUnpicklingError(MultiprocExecutor):
    """A Ctrl-C during a call comes back as ReplyUnpicklingError."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        from executor import ReplyUnpicklingError

        try:
            return super().collective_rpc(method, *a, **kw)
        except KeyboardInterrupt as exc:
            raise ReplyUnpicklingError("the reply could not be unpickled: KeyboardInterrupt") from exc


class ChildKillsWorkers(MultiprocExecutor):
    """A forked child that exits normally SIGKILLs the parent's workers (an inherited
    exit handler that does not check whose executor it is)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        owner, pids = os.getpid(), list(self.worker_pids)

        def kill_if_foreign() -> None:
            if os.getpid() != owner:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

        self._kill_if_foreign = kill_if_foreign
        atexit.register(kill_if_foreign)

    def shutdown(self) -> None:
        atexit.unregister(self._kill_if_foreign)
        super().shutdown()


class QueueFullAfter10(MultiprocExecutor):
    """Gives up with QueueFullError when 10 non_block calls are outstanding."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._outstanding: list[Future[Any]] = []

    def collective_rpc(self, method: Any, timeout: float | None = None, args: Any = (),
                       kwargs: Any = None, non_block: bool = False, *rest: Any, **kw: Any) -> Any:
        from executor import QueueFullError

        self._outstanding = [f for f in self._outstanding if not f.done()]
        if non_block and len(self._outstanding) >= 10:
            raise QueueFullError("broken: 10 calls outstanding, the driver gives up")
        out = super().collective_rpc(method, timeout, args, kwargs, non_block, *rest, **kw)
        if non_block:
            self._outstanding.append(out)
        return out


class HostileKillsWorker(MultiprocExecutor):
    """A method raising a hostile exception takes its worker down (exit code 1)."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        if getattr(method, "__name__", "") == "raise_hostile":
            os.kill(self.worker_pids[0], signal.SIGKILL)
            time.sleep(0.5)
        return super().collective_rpc(method, *a, **kw)


class LeaksOnFailedStart(MultiprocExecutor):
    """A start-up that fails keeps the descriptors it opened."""

    kept: list[int] = []

    def __init__(self, *a: Any, **kw: Any) -> None:
        pipe = os.pipe()
        try:
            super().__init__(*a, **kw)
        except BaseException:
            LeaksOnFailedStart.kept.extend(pipe)
            raise
        os.close(pipe[0])
        os.close(pipe[1])


class SkipsCallbacks(MultiprocExecutor):
    """Fails without running any failure callback."""

    def _run_callbacks(self) -> None:
        self._callbacks_ran = True


class StopsAtRaisingCallback(MultiprocExecutor):
    """Stops running failure callbacks at the first one that raises."""

    def _run_callbacks(self) -> None:
        with self._state_lock:
            if self._callbacks_ran:
                return
            self._callbacks_ran = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - the bug: the rest are skipped
                return


# ---------------------------------------------------------------- blind spots (issue 25)
# Each breaks a promise no test saw broken before; tests/executor_tests/
# test_executor_blind_spots.py (executor, queue) and tests/model/test_recovery.py (recovery)
# show each one caught.

class IgnoresCleanExit(MultiprocExecutor):
    """A worker that exits with code 0 while serving is no death to it: the monitor's report
    is dropped, and calls waiting on that rank just time out."""

    def _on_worker_death(self, rank: int, pid: int, exitcode: int | None, detected_ns: int) -> None:
        if exitcode != 0:
            super()._on_worker_death(rank, pid, exitcode, detected_ns)


class MissesEarlyRestartDeath(MultiprocExecutor):
    """A worker of the new incarnation that dies between READY and going live is missed: its
    monitor's report found the executor still failed, and nobody looks again after the swap."""

    def _report_early_death(self, res: Any) -> None:
        pass  # BUG: nobody looks at the new workers again after the swap


class RedoesVisiblePublish(QueueWriter):
    """A publish cut short by an interrupt is always done again, even once its chunk was
    visible: readers that took it meanwhile get their read flags cleared behind them."""

    def _finish_publish(self) -> None:
        assert self._publishing is not None
        self._publish(*self._publishing)


class CompletesInvisiblePublish(QueueWriter):
    """A publish cut short by an interrupt is always just completed, even when its chunk
    never became visible: its sequence number is published with the chunk unwritten."""

    def _finish_publish(self) -> None:
        assert self._publishing is not None
        self._published(self._publishing[0], self._publishing[1])


class _ProgressOffBy(QueueReader):
    off_by = 0

    def _release(self) -> None:  # QueueReader._release, with progress off by ``off_by``
        taken = self._unreleased
        if taken is None:
            return
        index, seq = taken
        buf = self.ring.buf
        flag = self.ring.metas[index] + READ_FLAGS + self.index
        if buf[flag] != 1 and self.ring.seq_at(index) == seq:
            buf[flag] = 1
        U64.pack_into(buf, self._progress, seq + 1 + self.off_by)  # BUG unless off_by is 0
        self._unreleased = None
        fence()
        if self._writer_bell is not None and self.ring.flags[0]:
            ring(self._writer_bell)


class ProgressOneBehind(_ProgressOffBy):
    """Records its progress one chunk short: a cleared read flag of the chunk it just read
    passes for a reader that is behind (a full queue, not damage)."""

    off_by = -1


class ProgressOneAhead(_ProgressOffBy):
    """Records its progress one chunk too far: a reader merely behind by one lap is blamed
    for damaged read flags."""

    off_by = 1


class CountsNoMismatch(Recovery):
    """A rebuilt token that differs from the kept one goes uncounted."""

    def replayed(self, request: Any, token: int) -> None:
        k = request.replay
        request.replay = k + 1 if k + 1 < len(request.output_token_ids) else None


class KeepsRebuiltToken(Recovery):
    """Counts a differing rebuilt token, then keeps it in place of the first run's."""

    def replayed(self, request: Any, token: int) -> None:
        k = request.replay
        super().replayed(request, token)
        request.output_token_ids[k] = token


# ---------------------------------------------------------------- for the property tests

class _CollectorMutant(MultiprocExecutor):
    """The first incarnation's reply collector is of the broken class ``collector``."""

    collector: ClassVar[type[ReplyCollector]]

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._collector.__class__ = self.collector


class _NoIdCheck(ReplyCollector):
    def _read_reply(self, rank: int, call: PendingCall, deadline: float) -> tuple[bool, Any] | None:
        got = self.readers[rank].read(None if deadline == float("inf") else deadline)
        if got is None:
            return None
        _msg_id, frame = got  # BUG: the reply's id is never compared with the call's
        kind, _ = peek(frame)
        return self._decode(rank, call, kind, frame)


class IgnoresRequestIds(_CollectorMutant):
    """Takes the next reply in the queue as this call's, even a timed-out call's late reply."""

    collector = _NoIdCheck


class _TargetFirst(ReplyCollector):
    def drain_until(self, call: PendingCall, limit: float) -> None:
        with self.lock:  # BUG: jump the asked-for call to the front of the line
            if call in self.pending and self.pending[0] is not call:
                self.pending.remove(call)
                self.pending.appendleft(call)
        super().drain_until(call, limit)


class DrainsTargetFirst(_CollectorMutant):
    """``result()`` collects its own call first; earlier calls' replies get dropped as stale."""

    collector = _TargetFirst


class _LockBeforeTry(ReplyCollector):
    def drain_until(self, call: PendingCall, limit: float) -> None:
        if not self._acquire(limit):  # BUG: a Ctrl-C after the acquire returns keeps the lock
            return
        try:
            self._drain(lambda: not call.done, limit)
        finally:
            self.lock.release()
        self.settle_resolved()


class LocksBeforeTry(_CollectorMutant):
    """Takes the reply collector's lock one line before the ``try`` that releases it (the
    round-3 Ctrl-C wedge): one KeyboardInterrupt at the wrong instant blocks every later call."""

    collector = _LockBeforeTry


# ---------------------------------------------------------------- the node transport (issue 25)

class LiftsFrameBound(MultiprocExecutor):
    """The driver's node socket takes a frame of any size before the peer's handshake is
    judged (no MAXMSGSIZE): a peer without the secret makes the driver buffer all it sends."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        import executor.tcp_gate  # pyzmq: only for this mutant, never at import

        original = executor.tcp_gate.MAX_FRAME_BYTES
        executor.tcp_gate.MAX_FRAME_BYTES = -1  # read when the hub binds, in _start
        try:
            super().__init__(*a, **kw)
        finally:
            executor.tcp_gate.MAX_FRAME_BYTES = original


# ---------------------------------------------------------------- someone else reaps the workers
# Issue 25, defect 4, re-created on top of the executor: for as long as the executor lives,
# every liveness check, exit status and shutdown signal goes by pid through multiprocessing
# (``exitcode`` = waitpid), as before the pidfd fix.

def _exitcode_has_ended(process: Any, fd: int) -> bool:
    return process.exitcode is not None  # BUG: None forever once another handler reaped it


def _exitcode_ended(process: Any, fd: int) -> Any:
    from executor import exits

    code = process.exitcode
    return None if code is None else exits.Ended(code)


def _kill_by_pid(process: Any, fd: int, sig: int) -> None:
    try:
        os.kill(process.pid, sig)  # BUG: the pid may be free, or another process's by now
    except (ProcessLookupError, PermissionError):
        pass


class TrustsWaitpid(MultiprocExecutor):
    """Liveness from ``Process.exitcode`` and signals by pid: under SIGCHLD=SIG_IGN or an
    outside reaper, shutdown busy-waits through every grace and signals freed pids, a dead
    worker is reported "still running", and the workers' descriptors are never closed."""

    _patched: dict[str, Any] | None = None

    def __init__(self, *a: Any, **kw: Any) -> None:
        import executor.exits
        import executor.protocol

        self._patched = {"has_ended": executor.exits.has_ended, "ended": executor.exits.ended,
                         "send_signal": executor.exits.send_signal,
                         "REAPED_ELSEWHERE": executor.protocol.REAPED_ELSEWHERE}
        executor.exits.has_ended = _exitcode_has_ended
        executor.exits.ended = _exitcode_ended
        executor.exits.send_signal = _kill_by_pid
        executor.protocol.REAPED_ELSEWHERE = "is still running"
        try:
            super().__init__(*a, **kw)
        except BaseException:
            self._restore()
            raise

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._restore()

    def _restore(self) -> None:
        import executor.exits
        import executor.protocol

        patched, self._patched = self._patched, None
        if patched is None:
            return
        executor.protocol.REAPED_ELSEWHERE = patched.pop("REAPED_ELSEWHERE")
        for name, original in patched.items():
            setattr(executor.exits, name, original)


# ---------------------------------------------------------------- what only some rules reach
# The two bugs the Hypothesis machine's base rules never met (issue 26); chaos.machine_rules'
# damage_next_request / stubborn_worker rules and `faultlab chaos explore` find them.

class SkipsChecksum(MultiprocExecutor):
    """Every queue end (forked workers too) computes checksum 0: nothing is verified."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        import executor.shm_queue

        self._digest = executor.shm_queue._digest
        executor.shm_queue._digest = lambda data: 0
        try:
            super().__init__(*a, **kw)
        except BaseException:
            executor.shm_queue._digest = self._digest
            raise

    def shutdown(self) -> None:
        import executor.shm_queue

        super().shutdown()
        executor.shm_queue._digest = self._digest


class NoSigkill(MultiprocExecutor):
    """Shutdown asks and SIGTERMs, but never SIGKILLs."""

    def shutdown(self) -> None:
        import executor.stopping

        original = executor.stopping._signal
        executor.stopping._signal = (
            lambda child, sig: None if sig == signal.SIGKILL else original(child, sig))
        try:
            super().shutdown()
        finally:
            executor.stopping._signal = original


# ---------------------------------------------------------------- the queue's bugs, in an executor
# The queue-level bugs above, planted in a whole executor so that `faultlab chaos explore
# --mutant` can aim at them.  Where each broken end runs:
#
#     writer mutants  the driver's request writer (each incarnation's): the only writer a
#                     Ctrl-C cuts and that lives on to resume (a worker's SIGTERM cut ends it)
#     reader mutants  the driver's reply readers, and the local workers' request readers:
#                     FAULTLAB_FAILPOINTS names install_queue_mutant for the workers' start-up
#                     (it runs before their queues are built, with fork, forkserver and spawn
#                     alike), which installs the class, then the installer it replaced.
#                     Remote nodes' workers read over TCP: no queue reader there to break.

QUEUE_MUTANT_ENV = "FAULTLAB_QUEUE_MUTANT"  # "ReaderClass" (a name in this module)
QUEUE_MUTANT_THEN_ENV = "FAULTLAB_QUEUE_MUTANT_THEN"  # the FAULTLAB_FAILPOINTS it replaced


def install_queue_mutant(role: str, rank: int | None) -> None:
    """A worker's FAULTLAB_FAILPOINTS installer: its queues get the reader class named by
    FAULTLAB_QUEUE_MUTANT, then the installer it stood in for runs (chaos.points' own)."""
    import importlib

    import executor.worker_proc

    reader = globals()[os.environ[QUEUE_MUTANT_ENV]]
    assert isinstance(reader, type) and issubclass(reader, QueueReader)
    executor.worker_proc.QueueReader = reader  # type: ignore[misc]
    then = os.environ.get(QUEUE_MUTANT_THEN_ENV, "")
    if then:
        module, _, func = then.partition(":")
        getattr(importlib.import_module(module), func)(role=role, rank=rank)


class _QueueMutant(MultiprocExecutor):
    """Each incarnation's queue ends get the broken classes once ``_start`` built them."""

    writer: ClassVar[type[QueueWriter] | None] = None
    reader: ClassVar[type[QueueReader] | None] = None

    def _start(self, policy: Any, startup_timeout: float | None = None) -> None:
        if self.reader is None:
            super()._start(policy, startup_timeout)
        else:
            with _workers_install(self.reader):
                super()._start(policy, startup_timeout)
        if self.writer is not None:
            for end in [self._writer, *getattr(self._writer, "_writers", ())]:
                if type(end) is QueueWriter:
                    end.__class__ = self.writer
        if self.reader is not None:
            for end in self._collector.readers:
                if type(end) is QueueReader:
                    end.__class__ = self.reader


@contextlib.contextmanager
def _workers_install(reader: type[QueueReader]) -> Iterator[None]:
    """Workers started inside get ``reader`` (their environment is taken at start)."""
    with restored_environ((failpoints.ENV_VAR, QUEUE_MUTANT_ENV, QUEUE_MUTANT_THEN_ENV)) as saved:
        ours = f"{__name__}:install_queue_mutant"
        if saved[failpoints.ENV_VAR] != ours:  # else already in place (a start inside a start)
            os.environ[QUEUE_MUTANT_THEN_ENV] = saved[failpoints.ENV_VAR] or ""
        os.environ[QUEUE_MUTANT_ENV] = reader.__name__
        os.environ[failpoints.ENV_VAR] = ours
        yield


class RedoesVisiblePublishExecutor(_QueueMutant):
    """The driver's request writer is RedoesVisiblePublish: after a Ctrl-C that cut a publish
    once its chunk was visible, workers that took it get their read flags cleared behind them,
    and the writer blames them for damage when it comes round to that chunk again."""

    writer = RedoesVisiblePublish


class CompletesInvisiblePublishExecutor(_QueueMutant):
    """The driver's request writer is CompletesInvisiblePublish: after a Ctrl-C that cut a
    publish before its chunk was visible, the next call publishes a sequence number whose
    chunk reads unwritten, and the workers find the request ring damaged."""

    writer = CompletesInvisiblePublish


class ProgressOneBehindExecutor(_QueueMutant):
    """Every queue reader (driver and local workers) is ProgressOneBehind: a cleared read flag
    on the chunk a reader read last passes for a reader that is behind (no damage found)."""

    reader = ProgressOneBehind


class ProgressOneAheadExecutor(_QueueMutant):
    """Every queue reader (driver and local workers) is ProgressOneAhead: a writer waiting on
    a full ring blames a reader that is only behind for damaged read flags."""

    reader = ProgressOneAhead


class EchoGarbageCallbackTwice(MultiprocExecutor):
    """Two bugs in one executor, for explore's self-test (tests/chaos_tests/
    test_explore_two_bugs.py): a blocking ``echo`` returns garbage (WrongResults' bug: the
    "results" invariant) and the failure callbacks run twice (CallbackTwice's: "callback").
    A call reaches the first, a worker's death the second: a run may break either, both or
    neither, and explore must file exactly two findings."""

    def collective_rpc(self, method: Any, timeout: float | None = None, args: Any = (),
                       kwargs: Any = None, non_block: bool = False, *rest: Any) -> Any:
        out = super().collective_rpc(method, timeout, args, kwargs, non_block, *rest)
        return ["garbage"] * self.world_size if method == "echo" and not non_block else out

    def _run_callbacks(self) -> None:
        callbacks = list(self._callbacks)
        super()._run_callbacks()
        for cb in callbacks:
            cb()
