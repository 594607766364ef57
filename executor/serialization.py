"""Turning calls and replies into frames for the queue, with out-of-band buffers.

    frame = header │ pickle │ buffer 1 │ … │ buffer k          (written as separate parts)
    header = msg kind · reply rank · k · len(pickle) · len(buffer 1..k)

Large binary payloads do not get copied into the pickle stream: pickle protocol 5 hands
``bytes``-like buffers, numpy arrays and (through ``reducer_override``) contiguous CPU
torch tensors to ``buffer_callback``, and the queue copies each buffer once into shared
memory.  The reader rebuilds them as views of its one received bytearray.

Callables (and anything else plain pickle refuses, such as lambdas) go through cloudpickle.
Values are pickled completely before any byte is sent, so a pickling failure never leaves
half a message in the queue.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle

_HEAD = struct.Struct("<BiI")  # kind, reply rank (-1: all), number of out-of-band buffers
_LEN = struct.Struct("<Q")
_BUFFER_TYPES = (bytes, bytearray, memoryview)
_SMALL = 64 << 10  # smaller buffers stay in-band: a part per buffer costs more than a copy


def _rebuild_tensor(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


class _Pickler(pickle.Pickler):
    """Protocol-5 pickler that ships CPU tensors as numpy arrays (out of band)."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and _plain_cpu_tensor(obj):
            return _rebuild_tensor, (obj.detach().numpy(),)
        return NotImplemented


class _CloudPickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and _plain_cpu_tensor(obj):
            return _rebuild_tensor, (obj.detach().numpy(),)
        return super().reducer_override(obj)


def _plain_cpu_tensor(t: Any) -> bool:
    return bool(
        t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad and t.layout
        == sys.modules["torch"].strided and not t.is_quantized and t.dtype
        != sys.modules["torch"].bfloat16
    )


def dumps(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj`` with large buffers out of band; cloudpickle when plain pickle refuses."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        return _dump_with(_Pickler, obj, buffers), buffers
    except (pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        return _dump_with(_CloudPickler, obj, buffers), buffers


def _keep_large(buffers: list[pickle.PickleBuffer]) -> Callable[[pickle.PickleBuffer], bool]:
    def callback(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < _SMALL:
            return True  # serialise in band
        buffers.append(buf)
        return False

    return callback


def _dump_with(cls: type[pickle.Pickler], obj: Any, buffers: list[pickle.PickleBuffer]) -> bytes:
    stream = io.BytesIO()
    cls(stream, protocol=5, buffer_callback=_keep_large(buffers)).dump(obj)
    return stream.getvalue()


def encode(kind: int, reply_rank: int, obj: Any) -> list[Any]:
    """Frame parts for the queue: header, pickle, then each out-of-band buffer."""
    body, buffers = dumps(obj)
    raws = [b.raw() for b in buffers]
    head = _HEAD.pack(kind, reply_rank, len(raws)) + _LEN.pack(len(body))
    head += b"".join(_LEN.pack(r.nbytes) for r in raws)
    return [head, body, *raws]


def peek(frame: bytes | bytearray) -> tuple[int, int]:
    """(kind, reply rank) of a frame, readable even when its pickle is not."""
    kind, reply_rank, _ = _HEAD.unpack_from(frame, 0)
    return kind, reply_rank


def decode(frame: bytes | bytearray) -> Any:
    """Inverse of ``encode``; out-of-band buffers become views of ``frame``."""
    view = memoryview(frame)
    _kind, _rank, n_buffers = _HEAD.unpack_from(view, 0)
    pos = _HEAD.size
    sizes = [_LEN.unpack_from(view, pos + 8 * i)[0] for i in range(n_buffers + 1)]
    pos += 8 * (n_buffers + 1)
    body = view[pos : pos + sizes[0]]
    pos += sizes[0]
    buffers = []
    for size in sizes[1:]:
        buffers.append(view[pos : pos + size])
        pos += size
    return pickle.loads(body, buffers=buffers)
