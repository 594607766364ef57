"""Every TCP message is authenticated: a tampered or forged one is rejected and never unpickled."""

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
from executor.tcp_wire import DATA, read_secret_file, seal, unseal


class _Marker:
    """Unpickling this creates a file: proof that someone unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (self.path, "w"))


def _poisoned_reply(secret: bytes, marker: Path, rank: int = 1) -> list[bytes]:
    parts = encode(2, rank, _Marker(str(marker)))
    return [bytes(f) for f in seal(secret, DATA, rank, 1, [bytes(p) for p in parts])]


def _send_raw(address: str, frames: list[bytes]) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
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
    _send_raw(address, tampered)  # 1: the MAC does not match
    _send_raw(address, _poisoned_reply(os.urandom(32), marker))  # 2: the wrong secret
    _send_raw(address, [b"no", b"mac"])  # 3: not even the shape of a message
    # 4: a correctly signed message (a stolen secret) from a peer that is not rank 1's link
    _send_raw(address, _poisoned_reply(secret, marker))
    _wait_rejections(ex, 4)
    assert not marker.exists(), "a rejected message was unpickled"
    assert "failed HMAC authentication" in caplog.text
    assert not ex.is_failed
    assert ex.collective_rpc("echo", args=(1,)) == [1, 1]


def test_a_node_with_the_wrong_secret_gets_no_configuration(remote_executor: MultiprocExecutor) -> None:
    from executor.tcp_worker import fetch_node_config

    assert remote_executor.driver_address is not None
    with pytest.raises(TimeoutError, match="secret"):
        fetch_node_config(remote_executor.driver_address, 1, os.urandom(32), timeout=0.5)
    _wait_rejections(remote_executor, 1)
