"""What the executor needs from a queue end, whichever transport carries the bytes.

    driver:  BroadcastWriter ──► QueueWriter (shm ring: workers of this node)
                             └─► TcpBroadcastWriter (ZeroMQ: workers of other nodes)
    driver:  ReplyCollector.readers[rank] = QueueReader (local rank) | TcpReplyReader (remote rank)
    worker:  WorkerProc.reader / .writer = shm QueueReader / QueueWriter | LinkReader / LinkWriter

Both transports keep one contract: messages arrive whole, in order, with the msg_id they
were written with; ``read`` returns None at its deadline; a damaged message is raised as
``CorruptMessageError`` (msg_id attached) and never unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class MessageWriter(Protocol):
    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        """Publish one message made of ``parts``; raise on ``deadline`` (monotonic)."""


class MessageReader(Protocol):
    def read(
        self, deadline: float | None, hold: bool = False
    ) -> tuple[int, bytes | bytearray] | None:
        """The next whole message as ``(msg_id, frame)``, or None at ``deadline``.

        With ``hold`` the message (or the CorruptMessageError raised for it) is returned
        again by every ``read`` until ``ack()``: a reader interrupted before it recorded it
        loses nothing."""

    def ack(self) -> None:
        """Drop the message the last ``read(hold=True)`` returned or raised."""


class BroadcastWriter:
    """Writes each message to every transport in turn: the shm ring first (it may block on a
    slow local reader), then the network (which queues and never blocks)."""

    def __init__(self, writers: Sequence[MessageWriter]) -> None:
        self._writers = list(writers)

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        for writer in self._writers:
            writer.write(msg_id, parts, deadline)
