"""The bytes on the TCP link between the driver and remote workers, and their authentication.

    zmq multipart message = mac │ head │ frame 1 │ … │ frame k
    head = magic "FLT2" · kind · rank · incarnation · msg_id
    frames = the payload's parts, each split into frames of at most MAX_FRAME_BYTES
             (the driver's socket refuses a larger frame: tcp_gate.py); the payload is
             their concatenation, so a receiver never needs the parts' boundaries
    mac  = HMAC-SHA256(key, len(head) head len(frame 1) frame 1 …)   (lengths as u64)
    key  = the secret (agent ⇄ driver: HELLO, CONFIG, RESTART, AGENT and their HEARTBEAT/BYE)
         | session_key(secret, incarnation, nonce)   (workers ⇄ driver, one per incarnation)

Every message is checked before anything else looks at it: a message whose MAC does not
match (tampered, or sent by someone without the per-executor secret) raises
``AuthenticationError`` and its payload is never unpickled.  The secret is 32 random bytes
per executor, handed to remote workers out of band (``FAULTLAB_SECRET`` or a 0600 file),
like multiprocessing's authkey.  Each incarnation of the workers (``ex.restart()``) gets a
session: a number carried in every head and a key derived from the secret and a fresh nonce
(the nonce travels in CONFIG/RESTART, the key never does).  A message of an older
incarnation authenticates under its own session key and is then dropped as stale, counted,
never delivered.  Not covered: replay of a recorded message within one incarnation (there is
no per-message nonce); bind to loopback or a trusted network.
"""

from __future__ import annotations

import dataclasses
import hmac
import math
import os
import secrets
import stat
import struct
from collections.abc import Sequence
from hashlib import sha256

from executor.errors import AuthenticationError

SECRET_ENV = "FAULTLAB_SECRET"
MAGIC = b"FLT2"  # version 2: the head carries the incarnation
_HEAD = struct.Struct("<4sBiIQ")  # magic, kind, rank (-1: the driver; a node for agents), incarnation, msg_id
HEAD_BYTES = _HEAD.size
_LEN = struct.Struct("<Q")
MAC_BYTES = 32
MAX_FRAME_BYTES = 256 << 10  # the largest frame on the wire (the driver's MAXMSGSIZE)

HELLO = 1  # agent -> driver: rank field = node rank
CONFIG = 2  # driver -> agent: payload = pickled NodeConfig
READY = 3  # worker -> driver: msg_id = pid
START_ERROR = 4  # worker -> driver: payload = pickled RemoteError
DATA = 5  # request (driver -> workers) or reply (worker -> driver): payload = a frame's parts
HEARTBEAT = 6  # either way; any authenticated message also counts as a sign of life
BYE = 7  # driver -> workers: this incarnation ends; driver -> agents: the executor shut down
RESTART = 8  # driver -> agent: payload = pickled NodeConfig of a new incarnation (head's number)
AGENT = 9  # agent -> driver, on its link: alive, running the head's incarnation; rank = node
KIND_NAMES = {HELLO: "HELLO", CONFIG: "CONFIG", READY: "READY", START_ERROR: "START_ERROR",
              DATA: "DATA", HEARTBEAT: "HEARTBEAT", BYE: "BYE", RESTART: "RESTART", AGENT: "AGENT"}
AGENT_KINDS = (HELLO, CONFIG, RESTART, AGENT)  # always under the secret itself


@dataclasses.dataclass(frozen=True)
class Envelope:
    """An authenticated message: its head fields and its payload frames."""

    kind: int
    rank: int
    msg_id: int
    parts: list[bytes | memoryview]  # the frames after the head (views of received frames)
    incarnation: int = 0

    def payload(self) -> bytes | memoryview:
        """The frames joined: one copy when the payload came in several frames."""
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


def mac(secret: bytes, frames: Sequence[bytes | memoryview]) -> bytes:
    h = hmac.new(secret, digestmod=sha256)
    for frame in frames:
        h.update(_LEN.pack(len(frame)))
        h.update(frame)
    return h.digest()


def seal(secret: bytes, kind: int, rank: int, msg_id: int,
         parts: Sequence[bytes | memoryview] = (), incarnation: int = 0) -> list[bytes | memoryview]:
    """The frames of one authenticated message."""
    frames: list[bytes | memoryview] = [_HEAD.pack(MAGIC, kind, rank, incarnation, msg_id)]
    for part in parts:
        frames += split_frames(part)
    return [mac(secret, frames), *frames]


def split_frames(part: bytes | memoryview) -> list[bytes | memoryview]:
    """``part`` as frames of at most ``MAX_FRAME_BYTES`` (views, no copy)."""
    if len(part) <= MAX_FRAME_BYTES and not isinstance(part, memoryview):
        return [part]
    view = memoryview(part).cast("B")
    return [view[i:i + MAX_FRAME_BYTES] for i in range(0, len(view), MAX_FRAME_BYTES)] or [view]


def unseal(secret: bytes, frames: Sequence[bytes | memoryview]) -> Envelope:
    """Check a received message; raise AuthenticationError before anything else reads it."""
    if len(frames) < 2 or len(frames[0]) != MAC_BYTES:
        raise AuthenticationError(f"malformed message ({len(frames)} frame(s)); rejected unread")
    if not hmac.compare_digest(frames[0], mac(secret, frames[1:])):
        raise AuthenticationError(
            "message failed HMAC authentication (tampered, or sent without the executor's "
            "secret); rejected without unpickling"
        )
    if len(frames[1]) != _HEAD.size:
        raise AuthenticationError("authenticated message has a malformed head")  # a bug, not an attack
    magic, kind, rank, incarnation, msg_id = _HEAD.unpack(frames[1])
    if magic != MAGIC or kind not in KIND_NAMES:
        raise AuthenticationError(f"authenticated message has unknown magic/kind {magic!r}/{kind}")
    return Envelope(kind, rank, msg_id, list(frames[2:]), incarnation)


def session_key(secret: bytes, incarnation: int, nonce: bytes) -> bytes:
    """The key of one incarnation's worker messages: only holders of the secret can derive it."""
    return hmac.new(secret, b"faultlab-session" + struct.pack("<I", incarnation) + nonce,
                    digestmod=sha256).digest()


def peek_head(frames: Sequence[bytes | memoryview]) -> tuple[int, int] | None:
    """(kind, incarnation) of a message NOT yet authenticated: only to choose its key."""
    if len(frames) < 2 or len(frames[1]) != _HEAD.size:
        return None
    _magic, kind, _rank, incarnation, _msg_id = _HEAD.unpack(frames[1])
    return kind, incarnation


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def write_secret_file(path: str, secret: bytes) -> None:
    """Write the secret as hex, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex() + "\n")


def read_secret_file(path: str) -> bytes:
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"secret file {path} is readable by others (chmod 600 it)")
    with open(path) as f:
        return parse_secret(f.read())


def parse_secret(text: str) -> bytes:
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError("the secret must be hex (64 digits for 32 bytes)") from None
    if len(secret) < 16:
        raise ValueError(f"the secret is too short ({len(secret)} bytes; use 32)")
    return secret


def secret_from_env() -> bytes | None:
    text = os.environ.get(SECRET_ENV)
    return parse_secret(text) if text else None


def rank_identity(rank: int, incarnation: int = 0) -> bytes:
    """A worker's link, one per incarnation: an old worker's link can never pass for a new one."""
    return b"r%d.%d" % (rank, incarnation)


def node_identity(node: int) -> bytes:
    """The socket an agent (or a rejoining one) says HELLO on."""
    return b"n%d" % node


def agent_identity(node: int, incarnation: int) -> bytes:
    """An agent's link while it runs ``incarnation``'s workers."""
    return b"a%d.%d" % (node, incarnation)


def parse_head(head: bytes | memoryview) -> tuple[int, int, int]:
    """(kind, rank, msg_id) of a head that ``unseal`` already accepted."""
    _magic, kind, rank, _incarnation, msg_id = _HEAD.unpack(head)
    return kind, rank, msg_id


def head_incarnation(head: bytes | memoryview) -> int:
    """The incarnation of a head that ``unseal`` already accepted."""
    return int(_HEAD.unpack(head)[3])


def poll_ms(seconds: float | None) -> int | None:
    """A ZeroMQ poll timeout: whole milliseconds, rounded up so a wait never ends early."""
    return None if seconds is None else max(0, math.ceil(seconds * 1e3))
