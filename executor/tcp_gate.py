"""Who may send the driver's TCP socket anything at all: a gate at the ZeroMQ handshake.

    peer ── TCP ──► ROUTER (PLAIN server, ZAP domain enforced, MAXMSGSIZE = MAX_FRAME_BYTES)
                      │ greeting: not PLAIN ─────────────────────────► closed by ZeroMQ
                      │ a handshake frame > MAX_FRAME_BYTES ──────────► closed at its header
                      │ HELLO(user, password) ─► ZAP request ─► ConnectionGate (hub thread)
                      │        password = connect_token(secret or a session key)? 200 : 400
                      ▼ only now: message frames (each <= MAX_FRAME_BYTES; seal splits parts)

Why this design (issue 25, defect 5).  ZeroMQ buffers a frame whole, and a multipart message
whole, before a socket's owner sees any of it, so a check on messages comes too late: one
1.5 GiB frame from a peer without the secret took the driver from 28 MiB to 3.1 GiB before
``unseal`` could reject it.  ``MAXMSGSIZE`` alone does not help: it bounds frames, not
messages, so an unauthenticated peer still grows one endless multipart message of small
frames.  What bounds memory is refusing the *connection* before it may send a message: the
ZMTP handshake is PLAIN, the password an HMAC of the secret (agents) or of a session key
(workers), checked by a ZAP handler that the hub thread serves; with ``ZAP_ENFORCE_DOMAIN``
no handler means no entry.  ``MAXMSGSIZE`` then bounds what a peer can make the driver
buffer before its handshake is judged, and authenticated peers still send messages of any
size: ``seal`` splits every part into frames of at most ``MAX_FRAME_BYTES`` (the receivers
join a payload's frames anyway).  CURVE would gate the same way but encrypt every tensor
(libsodium, one more pass over each byte); PLAIN costs one HMAC per connection.  Every
message keeps its own HMAC: the gate bounds memory, ``unseal`` decides what is authentic.

Not covered: the token travels in clear, so whoever reads the traffic can pass the gate (not
forge a message); bind to loopback or a trusted network.  A peer that opens many connections
and leaves each mid-handshake holds at most ``MAX_FRAME_BYTES`` per connection until
ZeroMQ's handshake interval (``HANDSHAKE_IVL_MS``) closes it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from hashlib import sha256
from typing import Any

import zmq

from executor.tcp_wire import MAX_FRAME_BYTES

log = logging.getLogger("executor.tcp")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by ZeroMQ (RFC 27): one handler per context
ZAP_DOMAIN = b"faultlab"
USERNAME = b"faultlab"
HANDSHAKE_IVL_MS = 10_000  # a connection that has not authenticated by then is closed


def connect_token(key: bytes) -> bytes:
    """The PLAIN password of a holder of ``key``: derived one way, so it reveals no key."""
    return hmac.new(key, b"faultlab-connect", digestmod=sha256).hexdigest().encode()


def guard_server(sock: zmq.Socket[Any]) -> None:
    """Before ``bind``: only peers that pass the gate may send this socket a message."""
    sock.setsockopt(zmq.PLAIN_SERVER, 1)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no handler: nobody gets in
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # read at each bind (a mutant lifts it)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)


def present(sock: zmq.Socket[Any], key: bytes) -> None:
    """Before ``connect``: this socket shows the token of ``key`` at the driver's gate."""
    sock.setsockopt(zmq.PLAIN_USERNAME, USERNAME)
    sock.setsockopt(zmq.PLAIN_PASSWORD, connect_token(key))


class ConnectionGate:
    """The ZAP handler of one context: answers each handshake from the hub thread's loop."""

    def __init__(self, ctx: zmq.Context[Any], keys: Iterable[bytes]) -> None:
        self.sock = ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)  # before the guarded socket binds: no unjudged window
        self._tokens = [connect_token(k) for k in keys]
        self.refused = 0  # handshakes with a wrong token (other refusals never reach us)

    def admit(self, key: bytes) -> None:
        """Let holders of ``key`` (a new incarnation's session key) in too."""
        self._tokens.append(connect_token(key))

    def answer_all(self) -> None:
        while True:
            try:
                request = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.sock.send_multipart(self._answer(request))

    def _answer(self, request: list[bytes]) -> list[bytes]:
        # version, request id, domain, address, routing id, mechanism, credentials...
        request_id = request[1] if len(request) > 1 else b""
        ok = (len(request) == 8 and request[5] == b"PLAIN" and request[6] == USERNAME
              and any(hmac.compare_digest(request[7], t) for t in self._tokens))
        if ok:
            return [b"1.0", request_id, b"200", b"OK", b"", b""]
        self.refused += 1
        address = request[3].decode(errors="replace") if len(request) > 3 else "?"
        log.error("tcp: refused a connection from %s: wrong connect token (no secret?)", address)
        return [b"1.0", request_id, b"400", b"wrong connect token", b"", b""]

    def close(self) -> None:
        self.sock.close(linger=0)
