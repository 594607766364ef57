"""A wait for peers that were asleep blocks at once (issue 23; executor/waiting.py, "Warmth").

The request writer records whether it rang a sleeping reader's doorbell; reply waits that
share its ``Warmth`` then skip spin and yield and go straight to the block step, whose
sleeping flag in shared memory is what a peer sees.  Checked on a real ring: the flag the
writer sets per message, and the sleeping flag a waiter raises (or not) while it waits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer
from executor.waiting import Sleeper, WaitPolicy, Warmth


@pytest.fixture
def ring() -> Iterator[ShmRingBuffer]:
    ring = ShmRingBuffer(QueueSpec("warmth", 1, 4, 4096))
    yield ring
    ring.close()


def test_the_writer_notes_whether_it_woke_a_sleeping_reader(ring: ShmRingBuffer) -> None:
    r, w = os.pipe()
    try:
        woke = Warmth()
        writer = QueueWriter(ring, [w], None, woke=woke)
        reader = QueueReader(ring, 0, None, None)
        ring.flags[1] = 1  # reader 0 is in its block step
        writer.write(1, [b"a"], None)
        assert woke.asleep
        ring.flags[1] = 0  # awake again (yielding)
        writer.write(2, [b"b"], None)
        assert not woke.asleep
        assert reader.read(None) == (1, b"a") and reader.read(None) == (2, b"b")
    finally:
        os.close(r)
        os.close(w)


def _raises_sleeping_flag(ring: ShmRingBuffer, asleep: bool) -> bool:
    """Wait 0.3 s for nothing with a 10 s yield phase; True if the block step began."""
    peers = Warmth()
    peers.asleep = asleep
    sleeper = Sleeper(ring.flags, 1, None, policy=WaitPolicy(yield_s=10.0), peers=peers)
    waiter = threading.Thread(target=sleeper.wait, args=(lambda: False, time.monotonic() + 0.3))
    waiter.start()
    seen = False
    while waiter.is_alive():
        seen = seen or ring.flags[1] == 1
        time.sleep(0.001)
    waiter.join()
    return seen


def test_a_wait_for_sleeping_peers_blocks_at_once(ring: ShmRingBuffer) -> None:
    assert _raises_sleeping_flag(ring, asleep=True)


def test_a_wait_for_awake_peers_yields_first(ring: ShmRingBuffer) -> None:
    assert not _raises_sleeping_flag(ring, asleep=False)
