"""Turning calls and replies into frames for the queue, with out-of-band buffers.

    frame = header │ pickle │ buffer 1 │ … │ buffer k          (written as separate parts)
    header = msg kind · reply rank · k · len(pickle) · trace context │ len(buffer 1..k)

The trace context (trace id, parent span id, W3C flags; zeros: none) is a fixed part of the
header, not of the pickle: packing three ints costs far less than pickling a tuple of them
(a 128-bit int is a long opcode), and a worker reads it without unpickling anything.

Large binary payloads do not get copied into the pickle stream: pickle protocol 5 hands
numpy arrays, contiguous CPU torch tensors (through the pickler's dispatch table) and large
``bytes``/``bytearray`` values (wrapped before pickling, since the C pickler has no hook
for them) to ``buffer_callback``, and the queue copies each buffer once into shared memory.

One copy on the way in: a queue reader asks ``frame_layout`` where a message goes before it
copies its first chunk, and writes each out-of-band buffer straight into the object the
caller will get: a ``bytes`` value into a new, not yet filled ``bytes`` object (flagged in
its length field, see ``_WHOLE_BYTES``); numpy array data (tensors travel as arrays) of
``recv_pool.POOLED_MIN`` or more (flagged ``_POOLED``) into a region of the executor's
receive pool (``executor/recv_pool.py``: reused once the caller drops the result, so a warm
driver takes no page faults for it); anything else (bytearrays, smaller arrays) into a new
uninitialised ``bytearray``.  The rebuilt array or tensor is a view of that memory.
``decode`` of such a ``Frame`` hands those objects to pickle, and ``_rebuild_bytes`` returns
them as they are.  Nothing is zero-filled and nothing copied twice, so a cold allocator
costs one page fault per page written, never a second pass.  Frames from elsewhere (TCP,
tests) are plain bytes and decode as before (a ``bytes`` value is then copied out of the
frame).

Warm heap: a fresh ``bytes``/``bytearray`` that glibc serves by mmap (above its mmap
threshold, 128 KiB at start) or from heap top it just trimmed costs a page fault per page,
~3 µs each on a VM: two 1 MiB replies took 0.7 ms to fill cold and 45 µs warm (bench:
bench_vs_reference.py).  glibc raises its mmap threshold to the size of a freed mmapped
chunk and its trim threshold to twice that (its own dynamic rule; an explicit ``mallopt``
of the user turns the rule off, and then nothing here changes it).  So before the first
receive buffer of a size class, ``_warm_heap`` creates and frees one untouched buffer
``_WARM_FACTOR`` times larger (at most ``_WARM_MAX``): later buffers of that size come
from the heap and are reused, with no ``mallopt`` call and no page written.  The cost: the
heap may keep up to twice that much freed memory instead of trimming it.

Invariant: a ``bytes`` object is written only between its creation in ``frame_layout`` and
the ``decode`` that publishes it; nobody else holds it (or its hash) before then.

Callables (and anything else plain pickle refuses, such as lambdas) go through cloudpickle.
Values are pickled completely before any byte is sent, so a pickling failure never leaves
half a message in the queue.
"""

from __future__ import annotations

import copyreg
import ctypes
import io
import pickle
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle

from executor.recv_pool import POOLED_MIN, pool
from telemetry.journal import split_trace_id

_HEAD = struct.Struct("<BiIQQQQB")  # kind, reply rank (-1: all), out-of-band buffer count,
#                                     pickle length, trace id (high, low), parent span, flags
_COUNTS = struct.Struct("<BiIQ")  # the header's first four fields
# The header's trace context: trace id high, low, parent span (0: none), W3C flags.
TRACE_HEADER = struct.Struct("<QQQB")
TRACE_AT = _COUNTS.size
_TRACE_CONTEXT = TRACE_HEADER.unpack_from
_LEN = struct.Struct("<Q")
_SMALL = 256 << 10  # smaller buffers stay in-band: measured cheaper (64 KiB echo 105 -> 52 µs)
_WHOLE_BYTES = 1 << 63  # set in a buffer's length: the buffer is a whole ``bytes`` value
_POOLED = 1 << 62  # set in a buffer's length: numpy array data, may live in the receive pool
_FLAGS = _WHOLE_BYTES | _POOLED
_WARM_FACTOR = 8  # a receive buffer of n bytes warms the heap for one of 8n (see above)
_WARM_MAX = (32 << 20) - (64 << 10)  # under glibc's largest dynamic mmap threshold (64-bit)
_warmed = [0]  # [0]: the largest buffer this process's heap was warmed with


def _uninitialised(kind: str) -> Callable[[int], Any]:
    new = getattr(ctypes.pythonapi, f"{kind}_FromStringAndSize")
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
    return lambda size: new(None, size)


_CPYTHON = sys.implementation.name == "cpython"
# Not zero-filled: each is written whole by the reader before anyone sees it.
_new_bytes = _uninitialised("PyBytes") if _CPYTHON else bytes
_new_bytearray = _uninitialised("PyByteArray") if _CPYTHON else bytearray
_BYTES_DATA = bytes.__basicsize__ - 1  # offset of a bytes object's data (CPython)


class Frame(bytearray):
    """A frame's header and pickle, with its out-of-band buffers as separate final objects."""

    __slots__ = ("buffers",)
    buffers: list[bytes | bytearray | memoryview]  # memoryview: a receive-pool loan


def _rebuild_tensor(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


def _reduce_tensor(t: Any) -> Any:
    if _plain_cpu_tensor(t):
        return _rebuild_tensor, (t.detach().numpy(),)
    return t.__reduce_ex__(5)


def _plain_cpu_tensor(t: Any) -> bool:
    torch = sys.modules["torch"]
    return bool(
        t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad
        and t.layout == torch.strided and not t.is_quantized and t.dtype != torch.bfloat16
    )


class _ReusablePickler(threading.local):
    """One C pickler per thread, reset between messages (building one costs ~3 µs)."""

    def __init__(self) -> None:
        self.stream = io.BytesIO()
        self.buffers: list[pickle.PickleBuffer] = []
        self.pickler = pickle.Pickler(self.stream, protocol=5, buffer_callback=self._callback)
        self.pickler.dispatch_table = copyreg.dispatch_table.copy()
        self.tensor_registered = False

    def _callback(self, buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < _SMALL:
            return True  # serialise in band: a separate part costs more than the copy
        self.buffers.append(buf)
        return False

    def dumps(self, obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
        if not self.tensor_registered and "torch" in sys.modules:
            self.pickler.dispatch_table[sys.modules["torch"].Tensor] = _reduce_tensor  # type: ignore[index]
            self.tensor_registered = True
        stream, self.buffers = self.stream, []
        stream.seek(0)
        stream.truncate()
        self.pickler.clear_memo()
        self.pickler.dump(obj)
        return stream.getvalue(), self.buffers


class _CloudPickler(cloudpickle.CloudPickler):  # type: ignore[misc]  # untyped base
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and _plain_cpu_tensor(obj):
            return _rebuild_tensor, (obj.detach().numpy(),)
        return super().reducer_override(obj)


_local = _ReusablePickler()


def dumps(obj: Any, by_value: bool = False) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``obj`` with large buffers out of band; cloudpickle when plain pickle refuses,
    or when ``by_value`` (a callable from ``__main__``, which plain pickle would send by a
    name the workers, started before it was defined, may not know)."""
    if not by_value:
        try:
            return _local.dumps(obj)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _CloudPickler(stream, protocol=5, buffer_callback=_keep_large(buffers)).dump(obj)
    return stream.getvalue(), buffers


def _keep_large(buffers: list[pickle.PickleBuffer]) -> Callable[[pickle.PickleBuffer], bool]:
    def callback(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < _SMALL:
            return True
        buffers.append(buf)
        return False

    return callback


def _rebuild_bytes(kind: type[bytes] | type[bytearray], data: Any) -> bytes | bytearray:
    """The value itself when the reader wrote it into its final object, else a copy."""
    return data if type(data) is kind else kind(data)


class _OutOfBand:
    """Stands in for a large bytes/bytearray so that pickle hands it over out of band.

    The C pickler writes exact ``bytes`` straight into the stream and consults no hook for
    them, so large ones are swapped for this wrapper before pickling (a shallow walk).
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A memoryview around a bytes value marks it for ``encode`` (flag _WHOLE_BYTES).
        data = memoryview(self.data) if type(self.data) is bytes else self.data
        return _rebuild_bytes, (type(self.data), pickle.PickleBuffer(data))


_WALKED = frozenset({bytes, bytearray, tuple, list, dict})


def _lift(obj: Any, depth: int = 3) -> Any:
    """``obj`` with large bytes (inside tuples, lists and dict values) wrapped out of band."""
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        return _OutOfBand(obj) if len(obj) >= _SMALL else obj
    if not depth:
        return obj
    if kind is tuple or kind is list:
        for i, item in enumerate(obj):
            if type(item) in _WALKED and (new := _lift(item, depth - 1)) is not item:
                items = list(obj)
                items[i] = new
                items[i + 1 :] = [_lift(rest, depth - 1) for rest in obj[i + 1 :]]
                return kind(items)
    elif kind is dict:
        for value in obj.values():
            if type(value) in _WALKED and _lift(value, depth - 1) is not value:
                return {k: _lift(v, depth - 1) for k, v in obj.items()}
    return obj


def encode(
    kind: int, reply_rank: int, obj: Any, by_value: bool = False,
    trace_id: int = 0, span_id: int = 0, trace_flags: int = 0,
) -> list[Any]:
    """Frame parts for the queue: header, pickle, then each out-of-band buffer.  A request
    of a traced RPC carries its span's context (``span_id`` 0: none) in the header."""
    body, buffers = dumps(_lift(obj), by_value)
    hi, lo = split_trace_id(trace_id)
    if not buffers:
        return [_HEAD.pack(kind, reply_rank, 0, len(body), hi, lo, span_id, trace_flags), body]
    raws = [b.raw() for b in buffers]
    head = _HEAD.pack(kind, reply_rank, len(raws), len(body), hi, lo, span_id, trace_flags)
    head += b"".join(_LEN.pack(r.nbytes | _kind_flag(r)) for r in raws)
    return [head, body, *raws]


def _kind_flag(raw: memoryview) -> int:
    """``_WHOLE_BYTES`` for a bytes value, ``_POOLED`` for numpy array data, else 0 (a
    bytearray value, or another object's buffer: it arrives as a real bytearray)."""
    obj = raw.obj
    if type(obj) is memoryview and type(obj.obj) is bytes:
        return _WHOLE_BYTES
    numpy = sys.modules.get("numpy")
    return _POOLED if numpy is not None and isinstance(obj, numpy.ndarray) else 0


def frame_layout(head: memoryview, total: int) -> tuple[Frame, list[memoryview]] | None:
    """Where a ``total``-byte frame beginning with ``head`` goes: a ``Frame`` and writable
    views of its parts, in frame order, for the reader to fill (each byte copied once).
    None for a frame without out-of-band buffers, or one whose head is not whole in
    ``head`` or does not add up to ``total`` (the reader then keeps it as it is)."""
    if total < _SMALL or len(head) < _HEAD.size:
        return None
    _kind, _rank, n, body_len = _COUNTS.unpack_from(head, 0)
    prefix = _HEAD.size + 8 * n + body_len
    if not n or _HEAD.size + 8 * n > len(head) or prefix > total:
        return None
    lens = struct.unpack_from(f"<{n}Q", head, _HEAD.size)
    sizes = [x & ~_FLAGS for x in lens]
    if prefix + sum(sizes) != total:
        return None
    frame = Frame(prefix)
    frame.buffers = [_receive_buffer(x & _FLAGS, size) for x, size in zip(lens, sizes, strict=True)]
    return frame, [memoryview(frame), *map(_writable, frame.buffers)]


def _receive_buffer(flag: int, size: int) -> bytes | bytearray | memoryview:
    """The object an out-of-band buffer is copied into (and the caller's value is built on)."""
    if flag == _POOLED and size >= POOLED_MIN:
        return pool.take(size)
    if size * _WARM_FACTOR > _warmed[0] and _warmed[0] < _WARM_MAX:
        _warm_heap(size)
    if flag == _WHOLE_BYTES and size > 1:
        return _new_bytes(size)
    return _new_bytearray(size)


def _warm_heap(size: int) -> None:
    """Free one untouched buffer of ``_WARM_FACTOR * size`` bytes: see "Warm heap" above."""
    warm = min(size * _WARM_FACTOR, _WARM_MAX)
    _warmed[0] = warm  # first: an interrupt below only skips one warm-up
    _new_bytes(warm)  # created and dropped at once; none of its pages is written


def _writable(obj: bytes | bytearray | memoryview) -> memoryview:
    if type(obj) is bytes:  # not yet published: see the module's invariant
        return memoryview((ctypes.c_char * len(obj)).from_address(id(obj) + _BYTES_DATA)).cast("B")
    return obj if type(obj) is memoryview else memoryview(obj)


def trace_context(frame: bytes | bytearray) -> tuple[int, int, int, int]:
    """(trace id high, low, parent span, W3C flags) of a request; parent 0: not traced."""
    return _TRACE_CONTEXT(frame, TRACE_AT)


def peek(frame: bytes | bytearray) -> tuple[int, int]:
    """(kind, reply rank) of a frame, readable even when its pickle is not."""
    kind, reply_rank, _, _ = _COUNTS.unpack_from(frame, 0)
    return kind, reply_rank


def decode(frame: bytes | bytearray) -> Any:
    """Inverse of ``encode``; out-of-band buffers become views of ``frame``."""
    _kind, _rank, n_buffers, body_len = _COUNTS.unpack_from(frame, 0)
    if not n_buffers:
        return pickle.loads(memoryview(frame)[_HEAD.size : _HEAD.size + body_len])
    if type(frame) is Frame:
        pos = _HEAD.size + 8 * n_buffers
        return pickle.loads(memoryview(frame)[pos : pos + body_len], buffers=frame.buffers)
    if isinstance(frame, bytes):
        frame = bytearray(frame)  # buffers must be writable: tensors and arrays are rebuilt on them
    view = memoryview(frame)
    pos = _HEAD.size + 8 * n_buffers
    sizes = [_LEN.unpack_from(view, _HEAD.size + 8 * i)[0] & ~_FLAGS for i in range(n_buffers)]
    body = view[pos : pos + body_len]
    pos += body_len
    buffers = []
    for size in sizes:
        buffers.append(view[pos : pos + size])
        pos += size
    return pickle.loads(body, buffers=buffers)
