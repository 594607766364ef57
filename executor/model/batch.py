"""What the engine sends to the workers each step, and what the output rank sends back.

    engine ── ModelBatch ──► every rank's execute_model ── ModelOutput ──► engine
                                                 (output rank only; None elsewhere)

Both are small frozen dataclasses of plain ints and strings, so they pickle cheaply and
the same bytes reach every rank.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelBatch:
    """One step: for each request, the tokens to feed and the position of the first one.

    A request's first step feeds its whole prompt at position 0; each later step feeds the
    token sampled last, at the next position.  ``finished_request_ids`` names requests whose
    KV cache every rank frees before running the step.
    """

    step_id: int
    request_ids: tuple[str, ...] = ()
    token_ids: tuple[tuple[int, ...], ...] = ()
    positions: tuple[int, ...] = ()
    finished_request_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.request_ids)
        if len(self.token_ids) != n or len(self.positions) != n:
            raise ValueError(f"batch {self.step_id}: {n} requests but {len(self.token_ids)} "
                             f"token lists and {len(self.positions)} positions")
        if len(set(self.request_ids)) != n:
            raise ValueError(f"batch {self.step_id}: a request appears twice")
        if any(not tokens for tokens in self.token_ids):
            raise ValueError(f"batch {self.step_id}: every request needs at least one token")

    @property
    def num_tokens(self) -> int:
        return sum(len(tokens) for tokens in self.token_ids)


@dataclasses.dataclass(frozen=True)
class ModelOutput:
    """The output rank's reply: one greedy token per request, in batch order."""

    step_id: int
    request_ids: tuple[str, ...]
    sampled_token_ids: tuple[int, ...]
    # Wall time of execute_model on the output rank (including waits in collectives and
    # pipeline receives), so a caller can split a round trip into executor and model time.
    model_time_s: float = 0.0
