"""Version skew across a restart: the new incarnation loads a changed checkpoint.

    the fault (chaos.recovery, after a seeded step): the flag file FLAG is created, the
    kept tokens are noted, then the worker is hit
      └─► restart: every new worker finds FLAG and draws its weights from seed + 1 (the
          checkpoint was replaced in place between the start and the restart, as a rollout
          or a re-uploaded model does)
            └─► the rebuild replays the kept tokens: the new model predicts differently, so
                rebuilt tokens differ from the kept ones
    the output rank of a skewed incarnation appends (request, position, token) for every
    token it samples to FLAG.jsonl: what the workers computed, seen from outside the engine

Oracles of a skewed restart, in place of "the fault-free tokens" (a skewed model's new
tokens may differ from them, by design: the executor cannot know the checkpoint changed):
- a kept token never changes: each request's tokens kept at the fault are its final first
  tokens (``KeepsRebuiltToken`` of chaos.mutants breaks this);
- every differing rebuilt token is counted: ``Recovery.mismatches`` equals the rebuilt
  tokens of FLAG.jsonl that differ from the kept ones (``CountsNoMismatch`` breaks this).
Rebuilt token i of a request is the one sampled at input position 0 (i = 0, the prompt) or
len(prompt) + i - 1, while i < the tokens kept.  Sound with sync scheduling and one fault:
then every output the skewed workers sample is one the engine applies (chaos.recovery
refuses skew with async scheduling or a second fault).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.oracles import Violation

WORKER = "chaos.skewed_worker:SkewedRestartWorker"  # torch is imported only by workers
FLAG_KEY = "skew_flag"  # worker_kwargs: the flag file's path


def reset(flag: Path) -> None:
    """No flag, no log: a run into a directory used before starts unskewed and unlogged."""
    flag.unlink(missing_ok=True)
    Path(str(flag) + ".jsonl").unlink(missing_ok=True)


def sampled(flag: Path) -> list[tuple[str, int, int]]:
    """What the skewed workers sampled: (request, input position, token), in order."""
    path = Path(str(flag) + ".jsonl")
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(str(rid), int(pos), int(tok)) for rid, pos, tok in rows]


def differing_rebuilt(flag: Path, kept: dict[str, list[int]], prompts: dict[str, list[int]]) -> int:
    """Rebuilt tokens the skewed workers sampled that differ from the kept ones."""
    count = 0
    for rid, position, token in sampled(flag):
        i = 0 if position == 0 else position - len(prompts[rid]) + 1
        if rid in kept and i < len(kept[rid]) and token != kept[rid][i]:
            count += 1
    return count


def violations(flag: Path, kept: dict[str, list[int]], prompts: dict[str, list[int]],
               outputs: dict[str, list[int]], recovery: Any) -> list[Violation]:
    """The skewed restart's oracles (module docstring)."""
    v = [Violation("tokens", f"request {rid}: a kept token changed (kept {tokens}, final "
                             f"{outputs[rid][:len(tokens)]})")
         for rid, tokens in kept.items() if rid in outputs and outputs[rid][:len(tokens)] != tokens]
    differ = differing_rebuilt(flag, kept, prompts)
    counted = recovery.mismatches if recovery is not None else 0
    if counted != differ:
        v.append(Violation("mismatches", f"{differ} rebuilt token(s) differed from the kept "
                                         f"ones; the recovery counted {counted}"))
    if not sampled(flag):
        v.append(Violation("fault", "no skewed worker sampled anything: the skew never landed"))
    return v
