"""Every TCP message is authenticated: a tampered or forged one is rejected and never unpickled;
a connection without a token derived from the secret is refused before it sends a message."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import zmq
from conftest import TwoNodes

from executor import MultiprocExecutor
from executor.errors import AuthenticationError
from executor.serialization import encode
from executor.tcp_gate import present
from executor.tcp_wire import DATA, MAX_FRAME_BYTES, read_secret_file, seal, unseal


class _Marker:
    """Unpickling this creates a file: proof that someone unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (self.path, "w"))


def _poisoned_reply(secret: bytes, marker: Path, rank: int = 1) -> list[bytes]:
    parts = encode(2, rank, _Marker(str(marker)))
    return [bytes(f) for f in seal(secret, DATA, rank, 1, [bytes(p) for p in parts])]


def _send_raw(address: str, frames: list[bytes], key: bytes | None) -> None:
    """Send ``frames`` from a peer that shows ``key``'s token at the gate (None: no token)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        if key is not None:
            present(sock, key)
        sock.connect(f"tcp://{address}")
        sock.send_multipart(frames)
        time.sleep(0.2)
    finally:
        sock.close(linger=1000)
        ctx.term()


def _wait_rejections(ex: MultiprocExecutor, count: int) -> None:
    deadline = time.monotonic() + 5
    while ex.rejected_messages < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ex.rejected_messages == count


def _refused(ex: MultiprocExecutor) -> int:
    assert ex._res.remote is not None
    return ex._res.remote.refused


def _wait_refusals(ex: MultiprocExecutor, at_least: int) -> None:
    deadline = time.monotonic() + 5
    while _refused(ex) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _refused(ex) >= at_least


def test_a_large_part_travels_in_bounded_frames_and_arrives_whole() -> None:
    secret, blob = os.urandom(32), os.urandom(3 * MAX_FRAME_BYTES + 5)
    frames = [bytes(f) for f in seal(secret, DATA, 1, 7, [b"head", memoryview(blob)])]
    assert max(len(f) for f in frames) <= MAX_FRAME_BYTES and len(frames) == 2 + 1 + 4
    assert unseal(secret, frames).payload() == b"head" + blob


@pytest.mark.parametrize("frame, offset", [(0, 5), (1, 10), (2, 3), (3, 40)],
                         ids=["mac", "head", "frame-header", "pickle"])
def test_a_flipped_byte_anywhere_is_rejected(tmp_path: Path, frame: int, offset: int) -> None:
    secret = os.urandom(32)
    frames = _poisoned_reply(secret, tmp_path / "marker")
    assert unseal(secret, frames).kind == DATA
    damaged = bytearray(frames[frame])
    damaged[offset % len(damaged)] ^= 0x01
    frames[frame] = bytes(damaged)
    with pytest.raises(AuthenticationError, match="HMAC"):
        unseal(secret, frames)


def test_tampered_and_forged_messages_to_the_driver_are_rejected_unread(
    remote_executor: MultiprocExecutor, two_nodes: TwoNodes, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ex, address = remote_executor, remote_executor.driver_address
    assert address is not None
    secret = read_secret_file(two_nodes.secret_file)
    marker = tmp_path / "unpickled"
    tampered = _poisoned_reply(secret, marker)
    body = bytearray(tampered[3])
    body[-2] ^= 0x01
    tampered[3] = bytes(body)
    _send_raw(address, tampered, secret)  # 1: the MAC does not match
    _send_raw(address, [b"no", b"mac"], secret)  # 2: not even the shape of a message
    # 3: a correctly signed message (a stolen secret) from a peer that is not rank 1's link
    _send_raw(address, _poisoned_reply(secret, marker), secret)
    _wait_rejections(ex, 3)
    # Without the secret a peer gets no further than the gate: its messages never arrive.
    wrong = os.urandom(32)
    _send_raw(address, _poisoned_reply(wrong, marker), wrong)  # a token of the wrong secret
    _send_raw(address, _poisoned_reply(wrong, marker), None)  # no token: refused by ZeroMQ
    _wait_refusals(ex, 1)
    assert ex.rejected_messages == 3
    assert not marker.exists(), "a rejected message was unpickled"
    assert "failed HMAC authentication" in caplog.text
    assert "wrong connect token" in caplog.text
    assert not ex.is_failed
    assert ex.collective_rpc("echo", args=(1,)) == [1, 1]


def test_a_node_with_the_wrong_secret_gets_no_configuration(remote_executor: MultiprocExecutor) -> None:
    from executor.tcp_worker import fetch_node_config

    assert remote_executor.driver_address is not None
    with pytest.raises(TimeoutError, match="secret"):
        fetch_node_config(remote_executor.driver_address, 1, os.urandom(32), timeout=0.5)
    _wait_refusals(remote_executor, 1)  # refused at the gate: its HELLO never arrived
    assert remote_executor.rejected_messages == 0
