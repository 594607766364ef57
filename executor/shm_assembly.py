"""Where a queue reader copies a message: the parts that tile it, and one chunk at a time.

    first chunk ─► partial_for(layout) ─► Partial(out, parts = views tiling out, starts)
    each chunk  ─► scatter(partial, chunk) ─► pieces written ─► digest_pieces(pieces)

``layout`` (``serialization.frame_layout`` for the executor) may split a message into the
objects the caller will get, so each byte is copied once, from the ring into its final
place; without one, or when it declines, the message is one bytearray.

Invariants (the reader's interrupt safety rests on them): a ``Partial`` is never mutated,
only replaced by the reader in one statement; ``scatter`` writes the same bytes to the
same places however often it is repeated, so a chunk copied again after an interrupt
leaves the message as one copy would.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeAlias

import xxhash

# (first chunk's data, message length) -> (the message object, writable views tiling it) or None
Layout: TypeAlias = Callable[[memoryview, int], "tuple[bytes | bytearray, Sequence[memoryview]] | None"]


class Partial(NamedTuple):
    """A message a reader has begun copying out (replaced, never mutated): ``out`` is what
    ``read`` returns, ``parts`` writable views that tile it, ``starts`` their offsets."""

    msg_id: int
    out: bytes | bytearray
    parts: tuple[memoryview, ...]
    starts: tuple[int, ...]
    pos: int = 0
    damaged: str = ""


def partial_for(msg_id: int, total: int, head: memoryview, layout: Layout | None) -> Partial:
    """Where a message goes: the parts ``layout`` picks for it (each byte is copied once,
    into the object the caller gets), else one bytearray."""
    planned = None if layout is None else layout(head, total)
    if planned is None:
        out: bytes | bytearray = bytearray(total)
        parts: Sequence[memoryview] = [memoryview(out)]
    else:
        out, parts = planned
    starts, pos = [], 0
    for part in parts:
        starts.append(pos)
        pos += len(part)
    return Partial(msg_id, out, tuple(parts), tuple(starts))


def scatter(partial: Partial, src: memoryview) -> list[memoryview]:
    """Copy ``src`` into the parts at ``partial.pos`` (idempotent); the pieces written."""
    parts, starts, pieces, done = partial.parts, partial.starts, [], 0
    i = bisect.bisect_right(starts, partial.pos) - 1
    while done < len(src):
        off = partial.pos + done - starts[i]
        n = min(len(parts[i]) - off, len(src) - done)
        piece = parts[i][off : off + n]
        piece[:] = src[done : done + n]
        pieces.append(piece)
        done, i = done + n, i + 1
    return pieces


def digest_pieces(pieces: Sequence[memoryview]) -> int:
    """The queue's 32-bit check value (``shm_ring.digest``) of the pieces' concatenation."""
    if len(pieces) == 1:
        return xxhash.xxh3_64_intdigest(pieces[0]) & 0xFFFFFFFF
    h = xxhash.xxh3_64()
    for piece in pieces:
        h.update(piece)
    return h.intdigest() & 0xFFFFFFFF
