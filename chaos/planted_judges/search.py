"""Planted judges in explore's own machinery (chaos.explore, shared by chaos.targets.explore):
the dedupe of findings, the shrink's "still the same failure", the reproduction count, the
flaky flag and the command's exit status.

    chaos.explore.new_invariants / triage   is this run a new finding, or a duplicate?
    chaos.explore.still_fails / shrink      is this smaller candidate still the same failure?
    chaos.explore.own_invariants / reproduces   did this rerun reproduce the finding?
    chaos.explore.FindingOf.flaky / exit_status does the finding (and the command) fail?

Each plant is a bug a developer could plausibly write there; tests/judges/test_judges_search.py
runs its fire/quiet cases (made-up signatures, findings and a scripted fake executor, no
processes) under each and must see at least one fail.

Invariants: as chaos.planted_judges (one attribute, restored after the ``with`` block).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from chaos.planted_judges import PlantedJudge

Signature = frozenset[str]


def _first_only(original: Callable[[Signature, Sequence[Signature]], Signature]) -> Any:
    def new_invariants(signature: Signature, known: Sequence[Signature]) -> Signature:
        first = frozenset(sorted(signature)[:1])  # the finding's "key": its first invariant
        return signature if original(first, [frozenset(sorted(k)[:1]) for k in known]) else frozenset()
    return new_invariants


def _shares_any(original: Any) -> Any:
    def new_invariants(signature: Signature, known: Sequence[Signature]) -> Signature:
        return frozenset() if any(signature & k for k in known) else signature
    return new_invariants


def _exact(original: Any) -> Any:
    def new_invariants(signature: Signature, known: Sequence[Signature]) -> Signature:
        return frozenset() if signature in known else signature
    return new_invariants


def _counts_to_last(original: Any) -> Any:
    def triage(findings: Sequence[Any], signature: Signature) -> Signature:
        from chaos import explore

        new = explore.new_invariants(signature, [f.signature for f in findings])
        if signature and not new:
            [f for f in findings if f.signature & signature][-1].duplicates += 1
        return new
    return triage


def _one_past_bound(original: Any) -> Any:
    def shrink(scenario: Any, verdict: Any, wanted: Signature, candidates_of: Any, run: Any,
               limits: Any, *rest: Any) -> Any:
        bigger = dataclasses.replace(limits, shrink_runs=limits.shrink_runs + 1)  # `<=`
        return original(scenario, verdict, wanted, candidates_of, run, bigger, *rest)
    return shrink


def _keeps_first_verdict(original: Any) -> Any:
    def shrink(scenario: Any, verdict: Any, wanted: Signature, *rest: Any) -> Any:
        best, _ = original(scenario, verdict, wanted, *rest)
        return best, verdict  # the shrunk scenario, filed with the original run's problems
    return shrink


PLANTED: list[PlantedJudge] = [
    PlantedJudge("search.dedupe_first_invariant", "chaos.explore:new_invariants",
                 "dedupe keyed on a signature's first invariant only", _first_only),
    PlantedJudge("search.dedupe_shares_any", "chaos.explore:new_invariants",
                 "a run sharing any invariant with a finding is its duplicate ((A,B) hides C)",
                 _shares_any),
    PlantedJudge("search.dedupe_exact_signature", "chaos.explore:new_invariants",
                 "a duplicate only when its signature equals a finding's exactly", _exact),
    PlantedJudge("search.duplicate_counted_to_last", "chaos.explore:triage",
                 "a duplicate counted to the last finding it shares with, not the first",
                 _counts_to_last),
    PlantedJudge("search.shrink_accepts_any_failure", "chaos.explore:still_fails",
                 "a shrink candidate failing any way at all is kept",
                 lambda original: lambda tried, wanted: bool(tried)),
    PlantedJudge("search.shrink_needs_every_invariant", "chaos.explore:still_fails",
                 "a shrink candidate is kept only when it breaks every wanted invariant",
                 lambda original: lambda tried, wanted: wanted <= tried),
    PlantedJudge("search.shrink_one_run_past_bound", "chaos.explore:shrink",
                 "the shrink's run bound checked with <= (one candidate run too many)",
                 _one_past_bound),
    PlantedJudge("search.shrink_keeps_original_verdict", "chaos.explore:shrink",
                 "the shrunk scenario returned with the original run's verdict",
                 _keeps_first_verdict),
    PlantedJudge("search.reproduce_counts_any_failure", "chaos.explore:reproduces",
                 "a rerun failing in any way counts as reproduced",
                 lambda original: lambda rerun, own: bool(rerun)),
    PlantedJudge("search.reproduce_needs_exact_signature", "chaos.explore:reproduces",
                 "a rerun counts only when it breaks exactly the finding's invariants",
                 lambda original: lambda rerun, own: rerun == own),
    PlantedJudge("search.own_is_whole_signature", "chaos.explore:own_invariants",
                 "a finding's own invariants include the ones earlier findings broke",
                 lambda original: lambda shrunk, wanted: shrunk),
    PlantedJudge("search.flaky_only_without_tries", "chaos.explore:FindingOf.flaky",
                 "flaky only when no rerun was tried (0 of 3 counted as reproduced)",
                 lambda original: property(lambda self: self.tries == 0)),
    PlantedJudge("search.exit_on_flaky", "chaos.explore:exit_status",
                 "the exit status is 1 for any finding, flaky ones included",
                 lambda original: lambda findings: 1 if findings else 0),
]
