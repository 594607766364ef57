"""The expected-outcome table (chaos.outcomes.TABLE), run on fork, forkserver and spawn.

Each row: a fault, where it hits, and what the executor must do.  The scenario shows the
fault's effect (the fault timeline records it, the observed outcome matches) and the
executor's own check catching it (ExecutorFailedError, TimeoutError, WorkerError, ...).
"""

from __future__ import annotations

import time

import pytest
from helpers import real_violations

from chaos import TABLE, CorruptQueue, FaultPlan, Outcome, RaiseInWorker, run_scenario
from chaos.outcomes import config_for
from chaos.points import AFTER_PUBLISH, damage_chunk
from chaos.workloads import standard
from executor import ExecutorConfig, QueueCorruptedError
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer

START_METHODS = ("fork", "forkserver", "spawn")
# On forkserver and spawn, one row per outcome class keeps the suite within its time budget.
_REPRESENTATIVE = {"kill, before reply", "sigterm, external", "block before execute",
                   "raise before execute", "flip reply payload", "clobber rpc seq",
                   "kill the driver mid-call", "slow every call"}
CASES = [pytest.param(sm, fault, outcome, id=f"{sm}-{name}")
         for sm in START_METHODS for name, fault, outcome in TABLE
         if sm == "fork" or name in _REPRESENTATIVE]


@pytest.mark.parametrize(("start_method", "fault", "expected"), CASES)
def test_outcome_table(start_method, fault, expected, tmp_path):
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method=start_method, **config_for(fault))
    result = run_scenario(cfg, standard, FaultPlan([fault], seed=5), tmp_path, expected=expected)
    assert result.faults, f"{fault} never fired"
    assert result.faults[0]["kind"] == fault.kind
    assert result.outcome == expected
    assert real_violations(result) == []
    if expected == Outcome.FAIL_FAST:
        assert result.detection_latency_s is not None and result.detection_latency_s < 3.0
        errors = {c.error_type for c in result.calls}
        assert "ExecutorFailedError" in errors
    if not fault.external and fault.kind != "kill_driver":
        assert result.fired_points, "an internal fault must report the failpoint it used"


def test_every_fault_kind_is_in_the_table():
    from chaos.faults import KINDS

    assert {f.kind for _, f, _ in TABLE} == set(KINDS)


@pytest.mark.parametrize("mode", sorted(AFTER_PUBLISH))
def test_after_publish_damage_is_seen_even_by_readers_that_took_the_chunk(mode: str) -> None:
    """The race behind a flaky row: readers take a just-published chunk before chaos damages
    it.  The damage still reaches them: the header claims the next message published, and a
    reader waiting for it finds it not written (a hang here is the bug)."""
    ring = ShmRingBuffer(QueueSpec("damage", 2, 4, 256))
    ring.segment.close_fd()
    writer = QueueWriter(ring, [], None)
    readers = [QueueReader(ring, r, None, None) for r in range(2)]
    try:
        writer.write(1, [b"taken before the damage"], time.monotonic() + 1)
        for reader in readers:
            got = reader.read(time.monotonic() + 1)
            assert got is not None and bytes(got[1]) == b"taken before the damage"
            reader.ack()
        damage_chunk(ring, 0, mode)
        for reader in readers:
            with pytest.raises(QueueCorruptedError):
                reader.read(time.monotonic() + 2)
    finally:
        del writer, readers
        ring.close()


@pytest.mark.parametrize("fault", [
    RaiseInWorker(rank=1, on_call=("sleep", 1), phase="before_reply"),
    CorruptQueue(rank=1, on_call=("sleep", 1), queue="reply", mode="clobber_flags"),
], ids=["raise-before-reply", "clobber-reply-flags"])
def test_a_reply_that_cannot_be_sent_under_async_scheduling_fails_fast(fault, tmp_path):
    """With async scheduling, replies leave from the worker's reply thread: what ends the serve
    loop in a sync worker (an error while sending a reply, a damaged reply queue) must end the
    worker there too, never leave the driver waiting for replies that never come."""
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method="fork", async_scheduling=True,
                         **config_for(fault))
    result = run_scenario(cfg, standard, FaultPlan([fault], seed=5), tmp_path,
                          expected=Outcome.FAIL_FAST)
    assert result.faults, f"{fault} never fired"
    assert result.outcome == Outcome.FAIL_FAST, (result.outcome, result.violations)
    assert result.detection_latency_s is not None and result.detection_latency_s < 3.0
