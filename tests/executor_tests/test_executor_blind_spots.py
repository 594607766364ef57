"""Promises no test could see broken (issue 25), each shown holding on the real executor and
shown broken on a mutant of chaos/mutants.py that breaks only it:

    promise                                              mutant that breaks it
    a worker that exits with code 0 while serving is     IgnoresCleanExit
      a death: the call fails at once naming it
    a worker of the new incarnation that dies between    MissesEarlyRestartDeath
      READY and going live is found: restart retries,
      and serves from live workers only
    a publish cut by Ctrl-C (before the written flag,    RedoesVisiblePublish,
      after it, after the published counter) is          CompletesInvisiblePublish
      finished or redone: every message once, in order
    a reader's progress is the next seq it takes: a      ProgressOneBehind,
      cleared flag of the chunk it just read is damage;  ProgressOneAhead
      a reader one lap behind is only behind

Each ``check_*`` raises AssertionError when its promise breaks; ``broken`` asserts it does.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from exec_helpers import exit_in_rank

import executor.shm_queue
from chaos import mutants
from executor import (
    ExecutorConfig,
    ExecutorFailedError,
    MultiprocExecutor,
    QueueCorruptedError,
    QueueFullError,
    failpoints,
)
from executor.resources import ExecutorResources
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer
from executor.shm_ring import PUBLISHED, READ_FLAGS

Build = Callable[..., MultiprocExecutor]


def broken(check: Callable[..., None], *args: Any) -> None:
    """``check`` must fail: the promise it guards is broken here."""
    with pytest.raises(AssertionError):
        check(*args)


@pytest.fixture
def build() -> Iterator[Build]:
    """``build(cls, **config)``: an executor of class ``cls``, shut down after the test."""
    made: list[MultiprocExecutor] = []

    def make(cls: type[MultiprocExecutor] = MultiprocExecutor, **fields: Any) -> MultiprocExecutor:
        fields = {"tensor_parallel_size": 2, "start_method": "fork", **fields}
        made.append(cls(ExecutorConfig(**fields)))
        return made[-1]

    yield make
    for ex in made:
        ex.shutdown()


# ---------------------------------------------------------------- exit code 0 is a death

def check_clean_exit_is_a_death(ex: MultiprocExecutor) -> None:
    called: list[int] = []
    ex.register_failure_callback(lambda: called.append(1))
    pid = ex.worker_pids[1]
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        ex.collective_rpc(exit_in_rank, args=(1, 0), timeout=3.0)
    assert isinstance(info.value, ExecutorFailedError), f"got {info.value!r}, not a death"
    assert f"rank 1 (pid {pid}) exited with code 0" in str(info.value)
    assert info.value.exitcode == 0 and time.monotonic() - start < 2.5
    assert ex.is_failed
    with pytest.raises(ExecutorFailedError, match="exited with code 0"):
        ex.collective_rpc("echo", args=(1,), timeout=3.0)
    ex.shutdown()
    assert called == [1]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_worker_exiting_with_code_0_is_a_death(build: Build, start_method: str) -> None:
    check_clean_exit_is_a_death(build(start_method=start_method))


def test_a_monitor_that_ignores_code_0_is_caught(build: Build) -> None:
    broken(check_clean_exit_is_a_death, build(mutants.IgnoresCleanExit))


# ---------------------------------------------------------------- death just before going live

@pytest.fixture
def dies_before_going_live(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rank 1 of the next incarnation is SIGKILLed after READY, before the swap, once; by
    the swap its monitor has reported it (to an executor that was still failed)."""
    go_live, killed = MultiprocExecutor._go_live, list[int]()

    def kill_then_go_live(ex: MultiprocExecutor, res: ExecutorResources) -> None:
        if not killed:
            victim = res.handles[1]
            killed.append(victim.pid)
            os.kill(victim.pid, signal.SIGKILL)
            assert res.monitor is not None
            res.monitor.join(10)
            assert not res.monitor.is_alive(), "the monitor never saw the death"
        go_live(ex, res)

    monkeypatch.setattr(MultiprocExecutor, "_go_live", kill_then_go_live)
    return killed


def check_early_death_is_found(ex: MultiprocExecutor, killed: list[int]) -> None:
    incarnations: list[int] = []
    ex.register_failure_callback(lambda: incarnations.append(ex.incarnation))
    ex.restart("test")
    assert killed and killed[0] not in ex.worker_pids, "a dead worker is serving"
    assert not ex.is_failed and ex.restarts_used == 2  # the bad attempt counted
    assert ex.collective_rpc("echo", args=(1,), timeout=3.0) == [1, 1]
    assert incarnations == [0, 1]  # the old incarnation, then the one that died at start


@pytest.mark.parametrize("sigchld", ["default", "ignored"])
def test_a_new_worker_dying_before_going_live_is_found(
        build: Build, dies_before_going_live: list[int], sigchld: str) -> None:
    """Also when the caller ignores SIGCHLD: the kernel reaps the worker, so multiprocessing's
    exitcode says "running" forever; only its pidfd says it ended (executor/exits.py)."""
    ex = build(restart_backoff=0.01)
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN) if sigchld == "ignored" else None
    try:
        check_early_death_is_found(ex, dies_before_going_live)
    finally:
        if previous is not None:
            signal.signal(signal.SIGCHLD, previous)


def test_a_restart_that_misses_it_is_caught(build: Build, dies_before_going_live: list[int]) -> None:
    ex = build(mutants.MissesEarlyRestartDeath, restart_backoff=0.01)
    broken(check_early_death_is_found, ex, dies_before_going_live)


# ---------------------------------------------------------------- Ctrl-C inside a publish

CHUNK, N_CHUNKS, MESSAGES = 256, 4, 11  # 11 messages: the ring laps twice after the cut
CUTS = ("before_written", "after_written", "after_published")


class _U64CutAfterPublished:
    """The queue's U64 struct, raising KeyboardInterrupt once, right after the writer stored
    the published counter (before its own sequence number moves on)."""

    def __init__(self, real: Any) -> None:
        self.real, self.armed = real, True

    def pack_into(self, buf: Any, offset: int, value: int) -> None:
        self.real.pack_into(buf, offset, value)
        if offset == PUBLISHED and self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _cut_writer(cls: type[QueueWriter], cut: str, monkeypatch: pytest.MonkeyPatch) -> type[QueueWriter]:
    """``cls`` whose first publish is interrupted at ``cut``."""
    if cut == "before_written":  # data and meta written, the written flag not yet set
        def cut_once(**_: Any) -> None:
            failpoints.disable("queue.before_publish")
            raise KeyboardInterrupt

        failpoints.enable("queue.before_publish", cut_once)
        return cls
    if cut == "after_published":
        monkeypatch.setattr(executor.shm_queue, "_U64", _U64CutAfterPublished(executor.shm_queue._U64))
        return cls
    cuts = [KeyboardInterrupt()]

    def published(self: QueueWriter, index: int, msg_id: int) -> None:
        if cuts:  # the written flag is set; neither the published counter nor seq has moved
            raise cuts.pop()
        cls._published(self, index, msg_id)

    return type(f"Cut{cls.__name__}", (cls,), {"_published": published})


def check_cut_publish_delivers_once(writer_class: type[QueueWriter], cut: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ring = ShmRingBuffer(QueueSpec("cut", 2, N_CHUNKS, CHUNK))
    try:
        ring.segment.close_fd()
        writer = _cut_writer(writer_class, cut, monkeypatch)(ring, [], None)
        readers = [QueueReader(ring, r, None, None) for r in range(2)]
        got: list[list[int]] = [[], []]
        try:
            _write_and_read(writer, readers, got)
        except (QueueCorruptedError, QueueFullError) as exc:
            raise AssertionError(f"after a publish cut at {cut}: {exc}") from exc
        expected = list(range(1, MESSAGES + 1))
        assert got == [expected, expected], f"after a publish cut at {cut}: readers got {got}"
    finally:
        failpoints.disable()
        ring.close()


def _write_and_read(writer: QueueWriter, readers: list[QueueReader], got: list[list[int]]) -> None:
    with pytest.raises(KeyboardInterrupt):
        writer.write(1, [b"message 1"], time.monotonic() + 1)
    _take(readers, got, 0.05)  # a visible chunk is taken now, before the writer resumes
    for msg_id in range(2, MESSAGES + 1):
        writer.write(msg_id, [f"message {msg_id}".encode()], time.monotonic() + 1)
        _take(readers, got, 0.05)
    _take(readers, got, 0.05)


def _take(readers: list[QueueReader], got: list[list[int]], wait_s: float) -> None:
    for reader, ids in zip(readers, got, strict=True):
        while (message := reader.read(time.monotonic() + wait_s)) is not None:
            msg_id, data = message
            assert bytes(data) == f"message {msg_id}".encode()
            ids.append(msg_id)


@pytest.mark.parametrize("cut", CUTS)
def test_a_publish_cut_by_ctrl_c_delivers_every_message_once(
        cut: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check_cut_publish_delivers_once(QueueWriter, cut, monkeypatch)


@pytest.mark.parametrize(("writer_class", "cut"), [
    (mutants.RedoesVisiblePublish, "after_written"),
    (mutants.RedoesVisiblePublish, "after_published"),
    (mutants.CompletesInvisiblePublish, "before_written"),
])
def test_a_writer_that_resumes_a_cut_publish_wrongly_is_caught(
        writer_class: type[QueueWriter], cut: str, monkeypatch: pytest.MonkeyPatch) -> None:
    broken(check_cut_publish_delivers_once, writer_class, cut, monkeypatch)


# ---------------------------------------------------------------- reader progress

def _ring_of(reader_class: type[QueueReader]) -> tuple[ShmRingBuffer, QueueWriter, list[QueueReader]]:
    ring = ShmRingBuffer(QueueSpec("progress", 2, N_CHUNKS, CHUNK))
    ring.segment.close_fd()
    return ring, QueueWriter(ring, [], None), [reader_class(ring, r, None, None) for r in range(2)]


def _send(writer: QueueWriter, readers: list[QueueReader], ids: range) -> None:
    for msg_id in ids:
        writer.write(msg_id, [b"m"], time.monotonic() + 1)
        for reader in readers:
            message = reader.read(time.monotonic() + 1)
            assert message is not None and message[0] == msg_id


def check_cleared_flag_of_the_last_chunk_read_is_damage(reader_class: type[QueueReader]) -> None:
    ring, writer, readers = _ring_of(reader_class)
    try:
        _send(writer, readers, range(1, 2))  # reader 1 reads seq 1 and nothing after it
        _send(writer, readers[:1], range(2, N_CHUNKS + 1))
        ring.buf[ring.metas[0] + READ_FLAGS + 1] = 0  # reader 1's flag on chunk 0 (seq 1): cleared
        with pytest.raises(Exception) as info:
            writer.write(N_CHUNKS + 1, [b"m"], time.monotonic() + 0.5)
        assert isinstance(info.value, QueueCorruptedError), f"got {info.value!r}, not damage"
        assert "reader 1 has read seq 1" in str(info.value)
    finally:
        ring.close()


def check_a_reader_one_lap_behind_is_only_behind(reader_class: type[QueueReader]) -> None:
    ring, writer, readers = _ring_of(reader_class)
    try:
        _send(writer, readers, range(1, N_CHUNKS + 1))  # a lap that both read
        _send(writer, readers[:1], range(N_CHUNKS + 1, 2 * N_CHUNKS + 1))  # reader 1 reads none
        with pytest.raises(Exception) as info:
            writer.write(2 * N_CHUNKS + 1, [b"m"], time.monotonic() + 0.5)
        assert isinstance(info.value, QueueFullError), f"got {info.value!r}, not a full queue"
        assert "reader(s) [1]" in str(info.value)
        for msg_id in range(N_CHUNKS + 1, 2 * N_CHUNKS + 1):  # it catches up: all is well
            message = readers[1].read(time.monotonic() + 1)
            assert message is not None and message[0] == msg_id
        _send(writer, readers, range(2 * N_CHUNKS + 1, 2 * N_CHUNKS + 2))
    finally:
        ring.close()


PROGRESS_CHECKS = [check_cleared_flag_of_the_last_chunk_read_is_damage,
                   check_a_reader_one_lap_behind_is_only_behind]


@pytest.mark.parametrize("check", PROGRESS_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_reader_progress_is_the_next_seq_it_takes(check: Callable[[type[QueueReader]], None]) -> None:
    check(QueueReader)


@pytest.mark.parametrize(("reader_class", "check"), [
    (mutants.ProgressOneBehind, check_cleared_flag_of_the_last_chunk_read_is_damage),
    (mutants.ProgressOneAhead, check_a_reader_one_lap_behind_is_only_behind),
], ids=["one-behind", "one-ahead"])
def test_reader_progress_off_by_one_is_caught(
        reader_class: type[QueueReader], check: Callable[[type[QueueReader]], None]) -> None:
    broken(check, reader_class)
