"""Seeded prompts for the model: the demo's requests, and the chaos recovery scenarios'.

    make_prompts(seed, count, max_len, vocab) ──► {"req-0": [token ids], ...}

Test data, not a command-line concern: it lives beside the model so that chaos (below the
app) and the demo (the app) draw the same requests from the same seed.
"""

from __future__ import annotations

import random


def make_prompts(seed: int, count: int, max_len: int, vocab_size: int) -> dict[str, list[int]]:
    """``count`` prompts of 1..max_len random token ids, drawn from ``seed``."""
    rng = random.Random(seed)
    return {f"req-{i}": [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_len))]
            for i in range(count)}
