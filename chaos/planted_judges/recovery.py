"""Planted judges for the recovery scenario's oracles (chaos.recovery) and the skewed
restart's (chaos.skewed_restart).

    _FaultedRun ──recovery_latency_s, has_recovered──► RecoveryResult
                ──_oracles: _layout_tokens, _failed_naming_the_rank, _same_tokens,
                  _rebuilt_tokens_counted, _recovery_time──► [Violation]
    the skewed workers' token log ──differing_rebuilt──► skewed_restart.violations

Each plant is one plausible slip: the last recovery's first token in place of the first's,
the step timeout in place of the recovery bound, ``>=`` for ``>``, a missing latency taken
as in time, only the common prefix of two token lists compared, one differing rebuilt token
forgiven (``> 1``), an engine failure not counted against "recovered", fail_stop not asked
to name the rank, a dropped check (the layout's fault-free tokens), and in the skewed
restart's count against the workers' log: a position off by one, equal tokens counted, new
tokens counted as rebuilt, only the first kept token checked.
tests/judges/test_judges_recovery.py holds the fire/quiet cases that catch every one.

Invariants: every plant replaces a module global that its caller looks up at call time
(``_judge`` and ``_oracles`` call the named checks; ``violations`` calls
``differing_rebuilt``); names start with ``recovery.``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos import skewed_restart
from chaos.planted_judges import PlantedJudge
from chaos.recovery import RecoveryResult, RecoveryScenario
from chaos.run_record import Violation

_R, _S = "chaos.recovery", "chaos.skewed_restart"


def _last_recovery(original: Any) -> Callable[[list[Any], float | None], float | None]:
    def recovery_latency_s(records: list[Any], fault_at: float | None) -> float | None:
        last = next((r.first_token_at for r in reversed(records) if r.first_token_at is not None),
                    None)
        return None if last is None or fault_at is None else last - fault_at
    return recovery_latency_s


def _recovery_time(bound_of: Callable[[RecoveryScenario], float], late: Callable[[float, float], bool],
                   none_ok: bool = False) -> Callable[[Any], Any]:
    def make(original: Any) -> Callable[[RecoveryScenario, RecoveryResult], list[Violation]]:
        def _recovery_time(s: RecoveryScenario, result: RecoveryResult) -> list[Violation]:
            latency, bound = result.detection_latency_s, bound_of(s)
            if result.recovered and ((latency is None and not none_ok)
                                     or (latency is not None and late(latency, bound))):
                return [Violation("recovery_time", f"fault to first new token took {latency} s "
                                                   f"(bound {bound:g} s)")]
            return []
        return _recovery_time
    return make


def _common_prefix(original: Any) -> Callable[[dict[str, list[int]], dict[str, list[int]]], list[Violation]]:
    def _same_tokens(outputs: dict[str, list[int]],
                     reference: dict[str, list[int]]) -> list[Violation]:
        return [Violation("tokens", f"request {rid}: tokens differ from the fault-free run's")
                for rid, tokens in outputs.items()
                if any(a != b for a, b in zip(tokens, reference.get(rid, []), strict=False))]
    return _same_tokens


def _one_mismatch_forgiven(original: Any) -> Callable[[Any], list[Violation]]:
    def _rebuilt_tokens_counted(recovery: Any) -> list[Violation]:
        if recovery is not None and recovery.mismatches > 1:
            return [Violation("tokens", f"{recovery.mismatches} rebuilt token(s) differed")]
        return []
    return _rebuilt_tokens_counted


def _engine_error_ignored(original: Any) -> Callable[[list[Any], Any], bool]:
    def has_recovered(records: list[Any], run: Any) -> bool:
        return bool(records) and not run.errors
    return has_recovered


def _rank_not_asked(original: Any) -> Callable[[Any], list[Violation]]:
    def _failed_naming_the_rank(run: Any) -> list[Violation]:
        if not run.errors:
            return [Violation("fail_stop", "expected every request to fail naming the rank; "
                                           f"got {len(run.errors)} failed")]
        return []
    return _failed_naming_the_rank


Rule = Callable[[int, list[int], int], bool]  # (i, kept tokens, token) -> counted


def _counted_when(rule: Rule, offset: int = 1) -> Callable[[Any], Any]:
    def make(original: Any) -> Callable[[Path, dict[str, list[int]], dict[str, list[int]]], int]:
        def differing_rebuilt(flag: Path, kept: dict[str, list[int]],
                              prompts: dict[str, list[int]]) -> int:
            count = 0
            for rid, position, token in skewed_restart.sampled(flag):
                i = 0 if position == 0 else position - len(prompts[rid]) + offset
                if rid in kept and rule(i, kept[rid], token):
                    count += 1
            return count
        return differing_rebuilt
    return make


def _differs(i: int, kept: list[int], token: int) -> bool:
    return i < len(kept) and token != kept[i]


def _first_kept_only(original: Any) -> Callable[..., list[Violation]]:
    def violations(flag: Path, kept: dict[str, list[int]], prompts: dict[str, list[int]],
                   outputs: dict[str, list[int]], recovery: Any) -> list[Violation]:
        v = [Violation("tokens", f"request {rid}: a kept token changed (kept {tokens}, final "
                                 f"{outputs[rid][:len(tokens)]})")
             for rid, tokens in kept.items() if rid in outputs and outputs[rid][:1] != tokens[:1]]
        differ = skewed_restart.differing_rebuilt(flag, kept, prompts)
        counted = recovery.mismatches if recovery is not None else 0
        if counted != differ:
            v.append(Violation("mismatches", f"{differ} rebuilt token(s) differed from the kept "
                                             f"ones; the recovery counted {counted}"))
        if not skewed_restart.sampled(flag):
            v.append(Violation("fault", "no skewed worker sampled anything: the skew never landed"))
        return v
    return violations


PLANTED: list[PlantedJudge] = [
    PlantedJudge("recovery.latency.last_recovery", f"{_R}:recovery_latency_s",
                 "latency to the last recovery's first new token, not the first's", _last_recovery),
    PlantedJudge("recovery.time.step_timeout_as_bound", f"{_R}:_recovery_time",
                 "the recovery time compared with step_timeout, not recovery_bound_s",
                 _recovery_time(lambda s: s.step_timeout, lambda t, b: t > b)),
    PlantedJudge("recovery.time.at_bound_late", f"{_R}:_recovery_time",
                 "a recovery exactly at its bound called late (>= for >)",
                 _recovery_time(lambda s: s.recovery_bound_s, lambda t, b: t >= b)),
    PlantedJudge("recovery.time.no_latency_passes", f"{_R}:_recovery_time",
                 "a recovery with no new token after it passes the time check",
                 _recovery_time(lambda s: s.recovery_bound_s, lambda t, b: t > b, none_ok=True)),
    PlantedJudge("recovery.tokens.common_prefix", f"{_R}:_same_tokens",
                 "tokens compared over the common prefix only (a short output passes)",
                 _common_prefix),
    PlantedJudge("recovery.tokens.one_mismatch_forgiven", f"{_R}:_rebuilt_tokens_counted",
                 "one differing rebuilt token forgiven (> 1)", _one_mismatch_forgiven),
    PlantedJudge("recovery.layout.unchecked", f"{_R}:_layout_tokens",
                 "the layout's fault-free tokens not compared with TP=1's",
                 lambda original: lambda run, reference: []),
    PlantedJudge("recovery.recovered.engine_error_ignored", f"{_R}:has_recovered",
                 "an engine that failed after finishing every request counted recovered",
                 _engine_error_ignored),
    PlantedJudge("recovery.fail_stop.rank_not_asked", f"{_R}:_failed_naming_the_rank",
                 "fail_stop passes a failure that does not name the rank", _rank_not_asked),
    PlantedJudge("recovery.skew.position_off_by_one", f"{_S}:differing_rebuilt",
                 "rebuilt token i read at position len(prompt) + i, not + i - 1",
                 _counted_when(_differs, offset=0)),
    PlantedJudge("recovery.skew.equal_tokens_counted", f"{_S}:differing_rebuilt",
                 "every rebuilt token counted, equal to the kept one or not",
                 _counted_when(lambda i, kept, token: i < len(kept))),
    PlantedJudge("recovery.skew.new_tokens_counted", f"{_S}:differing_rebuilt",
                 "new tokens past the kept ones counted as differing rebuilt ones",
                 _counted_when(lambda i, kept, token: i >= len(kept) or token != kept[i])),
    PlantedJudge("recovery.skew.first_kept_only", f"{_S}:violations",
                 "only the first kept token of each request checked for change",
                 _first_kept_only),
]
