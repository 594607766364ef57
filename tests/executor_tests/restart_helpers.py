"""Workers for the restart tests, importable by worker processes."""

from __future__ import annotations

import os
from typing import Any

from executor.workers import EchoWorker


class FlagFailWorker(EchoWorker):
    """Fails to start while the file ``worker_kwargs["fail_flag"]`` exists."""

    def __init__(self, ctx: Any) -> None:
        if os.path.exists(ctx.worker_kwargs["fail_flag"]):
            raise RuntimeError(f"rank {ctx.rank}: the fail flag is set")
        super().__init__(ctx)


class FailOnceWorker(EchoWorker):
    """Rank 0 fails to start once: while ``worker_kwargs["fail_flag"]`` exists it removes the
    file and raises, so exactly one start attempt fails, however slow the machine is."""

    def __init__(self, ctx: Any) -> None:
        flag = ctx.worker_kwargs["fail_flag"]
        if ctx.rank == 0 and os.path.exists(flag):
            os.unlink(flag)
            raise RuntimeError("rank 0: failing this start attempt once")
        super().__init__(ctx)


class FlagExitWorker(EchoWorker):
    """Rank 1 exits (code 9) at start-up while ``worker_kwargs["fail_flag"]`` exists."""

    def __init__(self, ctx: Any) -> None:
        if ctx.rank == 1 and os.path.exists(ctx.worker_kwargs["fail_flag"]):
            os._exit(9)
        super().__init__(ctx)


class FlagHangWorker(EchoWorker):
    """Rank 1 hangs in start-up (never says READY) while ``worker_kwargs["fail_flag"]`` exists."""

    def __init__(self, ctx: Any) -> None:
        if ctx.rank == 1 and os.path.exists(ctx.worker_kwargs["fail_flag"]):
            import time

            time.sleep(3600)
        super().__init__(ctx)
