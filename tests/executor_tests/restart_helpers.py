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


class FlagExitWorker(EchoWorker):
    """Rank 1 exits (code 9) at start-up while ``worker_kwargs["fail_flag"]`` exists."""

    def __init__(self, ctx: Any) -> None:
        if ctx.rank == 1 and os.path.exists(ctx.worker_kwargs["fail_flag"]):
            os._exit(9)
        super().__init__(ctx)
