"""``ExecutorConfig``: what to run and how, validated before any process starts."""

from __future__ import annotations

import dataclasses
import multiprocessing
from typing import Any

START_METHODS = ("fork", "spawn", "forkserver")
DEFAULT_START_METHOD = "fork"  # the same whatever else the program runs (threads, telemetry)
# The longest duration accepted anywhere (about 116 days): longer ones overflow the waits
# the executor makes (select, thread joins); None means "no timeout" where that is allowed.
MAX_TIMEOUT_S = 1e7


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
    """How to build a ``MultiprocExecutor``.  Invalid values raise ``ValueError`` at once."""

    worker: str = "executor.workers:EchoWorker"  # "module:Class" built in every worker
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    worker_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # None picks DEFAULT_START_METHOD (fork: fastest, no re-import of the caller's script,
    # unpicklable worker_kwargs work); it never depends on what else the program runs.
    start_method: str | None = None
    async_scheduling: bool = False
    # Shared-memory ring of each queue: n_chunks chunks of chunk_bytes; bigger messages stream.
    chunk_bytes: int = 1 << 20
    n_chunks: int = 8
    checksum: bool = True
    startup_timeout: float = 120.0  # seconds for every worker to load and say READY
    enqueue_timeout: float = 60.0  # the writer's deadline when a call has none
    shutdown_grace: float = 2.0  # seconds workers get to exit after the death pipe closes
    sigterm_grace: float = 1.0  # then SIGTERM, and this long before SIGKILL
    worker_exit_grace: float = 0.1  # a worker stuck in C code is ended this long after EOF
    worker_threads: int | None = None  # intra-op threads per worker; None: cores / world size
    # Workers keep freed large buffers in the heap (glibc mallopt) instead of returning them
    # to the OS: a fresh 1 MiB buffer costs ~1 ms of page faults here, a reused one ~0.1 ms.
    worker_keep_buffers: bool = True
    # Remote workers (nnodes > 1): node k runs ranks k*local_world_size .. ; node 0 is this
    # driver's machine, the others are started with `faultlab worker --driver HOST:PORT
    # --node-rank K` and talk over ZeroMQ TCP, every message HMAC-authenticated.
    nnodes: int = 1
    driver_host: str = "127.0.0.1"  # the address to bind: loopback unless told otherwise
    driver_port: int = 0  # 0 picks a free port (ex.driver_address tells which)
    # Where the per-executor secret is: FAULTLAB_SECRET (hex) wins; else this file is read if
    # it exists, or created (0600) with a fresh secret; else a fresh one in a private temp file.
    secret_file: str | None = None
    heartbeat_interval: float = 0.5  # seconds between heartbeats on each TCP link
    node_timeout: float = 10.0  # a remote worker silent this long counts as dead (and the driver, for it)
    # ex.restart() (executor/restart.py): how many new incarnations of the workers one
    # executor may start in its life (a start-up that fails counts too), and the pause
    # before a retried start-up: restart_backoff, doubling per retry, up to restart_backoff_max.
    restart_budget: int = 3
    restart_backoff: float = 0.05
    restart_backoff_max: float = 2.0
    # One restart as a whole (every attempt, back-off and start-up) ends by this deadline:
    # a worker that hangs in each new incarnation cannot stretch it to budget x startup_timeout.
    restart_timeout: float = 240.0

    def __post_init__(self) -> None:
        _check_worker_spec(self.worker)
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "n_chunks"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("chunk_bytes", self.chunk_bytes, minimum=64)
        if self.n_chunks < 2:
            raise ValueError(f"n_chunks must be at least 2, got {self.n_chunks}")
        _check_int("nnodes", self.nnodes, minimum=1)
        if self.world_size % self.nnodes:
            raise ValueError(f"world_size {self.world_size} is not divisible by nnodes {self.nnodes}")
        if not isinstance(self.driver_port, int) or not 0 <= self.driver_port < 65536:
            raise ValueError(f"driver_port must be a port number or 0, got {self.driver_port!r}")
        if self.world_size > 255:
            raise ValueError(f"world_size must be at most 255, got {self.world_size}")
        for name in ("startup_timeout", "enqueue_timeout", "shutdown_grace", "sigterm_grace",
                     "worker_exit_grace", "heartbeat_interval", "node_timeout", "restart_timeout"):
            _check_positive(name, getattr(self, name))
        if self.node_timeout <= self.heartbeat_interval:
            raise ValueError("node_timeout must be longer than heartbeat_interval")
        _check_int("restart_budget", self.restart_budget, minimum=0)
        for name in ("restart_backoff", "restart_backoff_max"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 60:
                raise ValueError(f"{name} must be a number of seconds in 0..60, got {value!r}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {self.start_method!r}")
        if self.worker_threads is not None:
            _check_int("worker_threads", self.worker_threads, minimum=1)
        if not isinstance(self.worker_kwargs, dict):
            raise ValueError(f"worker_kwargs must be a dict, got {type(self.worker_kwargs).__name__}")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        """Workers per node; the driver's node (0) runs ranks 0 .. local_world_size - 1."""
        return self.world_size // self.nnodes

    def node_ranks(self, node: int) -> list[int]:
        start = node * self.local_world_size
        return list(range(start, start + self.local_world_size))

    @property
    def remote_ranks(self) -> list[int]:
        return list(range(self.local_world_size, self.world_size))

    def node_of(self, rank: int) -> int:
        return rank // self.local_world_size

    @property
    def output_rank(self) -> int:
        """The first tensor-parallel rank of the last pipeline stage: its reply carries output."""
        return self.world_size - self.tensor_parallel_size

    @property
    def max_concurrent_batches(self) -> int:
        if self.pipeline_parallel_size > 1:
            return self.pipeline_parallel_size
        return 2 if self.async_scheduling else 1

    def resolved_start_method(self) -> str:
        # Deliberately not "fork unless threads": a default that changed with an unrelated
        # thread (a tracing exporter, a test timer) made worker_kwargs pickling, the caller's
        # script being re-imported and start-up time depend on it.
        return self.start_method if self.start_method is not None else DEFAULT_START_METHOD

    def thread_cap(self) -> int:
        if self.worker_threads is not None:
            return self.worker_threads
        return max(1, (multiprocessing.cpu_count() or 1) // self.local_world_size)


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= MAX_TIMEOUT_S:
        raise ValueError(
            f"{name} must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, got {value!r}"
        )


def _check_worker_spec(spec: Any) -> None:
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"worker must be a 'module:Class' string, got {spec!r}")
