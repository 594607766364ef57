"""The history checker: reads a call history (chaos.history) and says what it breaks.

    history events ──► per call: invoke, completion, executions ──► each check below
                                                                 ──► [HistoryViolation]

Each violation names its class and carries ``ops``, the smallest set of events that shows
it (the call's invoke and completion, the other call whose value it got, the two
executions of one incarnation, ...), so a reader never has to search the whole history.

    never_completed      an invoke with no ok / fail / info
    wrong_value          ok with a value that is not the fault-free model's
    reply_to_other       ok with the model's value of *another* call (payloads are unique)
    out_of_order         a call completed before one submitted earlier, one violation per
                         call overtaken (exempt: calls ended by a deadline, which may resolve
                         a later call first, by a Ctrl-C, or refused before the queue, and
                         the callbacks workloads' calls)
    executed_twice       one call started twice on one rank in one incarnation, not marked
                         as a recovery replay
    executed_after_fail  a worker ran a call the driver reported as never sent (refused
                         before it joined the queue: QueueFullError, RequestPicklingError).
                         Other failures say nothing of the other ranks: a broadcast fails at
                         its first error reply while a slower rank may still start it, and an
                         ``info`` outcome is unknown by definition

Recovery replays (``replay: true`` executions) are expected: they are counted, never a
violation.  A history from a chaos target without execution events gets the call checks.

Each exemption and key is one small named function (``_is_replay``, ``_run_key``,
``_never_sent``, ``_unordered``, ``_overtook``, ``_owner_of``), looked up at call time, so
chaos/planted_judges/history.py can plant a bug in one of them and
tests/judges/test_judges_history.py proves a case catches it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

COMPLETIONS = ("ok", "fail", "info")
# Failures that prove the call never reached a worker: refused before it joined the queue.
NEVER_SENT = frozenset({"QueueFullError", "RequestPicklingError"})
# Exempt from the order check: a deadline may resolve a later call first, a Ctrl-C ends the
# call it lands in, and a call refused before it joined the queue has no place in line.
_UNORDERED_ERRORS = NEVER_SENT | {"TimeoutError", "KeyboardInterrupt"}


@dataclasses.dataclass(frozen=True)
class HistoryViolation:
    kind: str
    message: str
    ops: tuple[dict[str, Any], ...]

    def __str__(self) -> str:
        return f"history.{self.kind}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "ops": list(self.ops)}


@dataclasses.dataclass
class _Call:
    invoke: dict[str, Any]
    done: dict[str, Any] | None = None
    execs: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def check(events: list[dict[str, Any]]) -> list[HistoryViolation]:
    """Every violation of the history, in the order of the checks above."""
    calls = _calls(events)
    return [*never_completed(calls), *values(calls), *out_of_order(calls),
            *executed_twice(calls), *executed_after_fail(calls)]


def replays(events: list[dict[str, Any]]) -> int:
    """How many executions were recovery replays (marked, expected)."""
    return sum(1 for e in events if e["op"] == "exec_start" and _is_replay(e))


def _calls(events: list[dict[str, Any]]) -> dict[int, _Call]:
    """Each call's invoke, its first completion and its executions (events of no invoked
    call, such as an execution whose RPC was never matched, are left out)."""
    calls: dict[int, _Call] = {}
    for e in events:
        if e["op"] == "invoke":
            calls[e["call"]] = _Call(e)
    for e in events:
        call = calls.get(e.get("call"))  # type: ignore[arg-type]
        if call is None:
            continue
        if e["op"] in COMPLETIONS and call.done is None:
            call.done = e
        elif e["op"] == "exec_start":
            call.execs.append(e)
    return calls


# ---------------------------------------------------------------- exemptions and keys
# One small function per exemption or key, so each reads (and can be proven) on its own.


def _is_replay(execution: dict[str, Any]) -> bool:
    """A marked recovery re-execution: expected, counted, never a violation."""
    return bool(execution.get("replay"))


def _run_key(execution: dict[str, Any]) -> tuple[Any, Any]:
    """What one run of a call is unique within: its rank and that rank's incarnation (a
    broadcast runs once on every rank; a replacement process may run it again)."""
    return (execution.get("rank"), execution.get("incarnation"))


def _never_sent(done: dict[str, Any]) -> bool:
    """The driver reported the call failed before it joined the queue: no worker may run it.
    An ``info`` outcome is unknown by definition, whatever its error."""
    return done["op"] == "fail" and done.get("error") in NEVER_SENT


def _unordered(call: _Call) -> bool:
    """Exempt from the order check: a deadline, a Ctrl-C or a refusal before the queue ended
    it, or a call of the callbacks workloads (made inside another call's done-callback)."""
    assert call.done is not None
    return call.done.get("error") in _UNORDERED_ERRORS or call.invoke.get("check") == "callbacks"


def _overtook(earlier: _Call, later: _Call) -> bool:
    """``later`` (submitted after ``earlier``) completed first, by completion order ``seq``."""
    assert earlier.done is not None and later.done is not None
    return bool(later.done["seq"] < earlier.done["seq"])


def _owner_of(value: Any, i: int, owners: dict[Any, list[int]]) -> int | None:
    """The other call (any, earlier or later) whose model value ``value`` is, if one is."""
    return next((j for j in owners.get(value, []) if j != i), None)


# ---------------------------------------------------------------- the checks


def never_completed(calls: dict[int, _Call]) -> list[HistoryViolation]:
    return [HistoryViolation("never_completed", f"call {i} ({c.invoke['method']}"
                             f"{c.invoke['args']}) was invoked and never completed", (c.invoke,))
            for i, c in sorted(calls.items()) if c.done is None]


def values(calls: dict[int, _Call]) -> list[HistoryViolation]:
    """ok values against the model: another call's value is named as such."""
    owners: dict[Any, list[int]] = defaultdict(list)
    for i, c in sorted(calls.items()):
        if c.invoke.get("expected") is not None:
            owners[c.invoke["expected"]].append(i)
    out = []
    for i, c in sorted(calls.items()):
        want = c.invoke.get("expected")
        if c.done is None or c.done["op"] != "ok" or want is None or c.done["value"] == want:
            continue
        j = _owner_of(c.done["value"], i, owners)
        if j is not None:
            out.append(HistoryViolation("reply_to_other", f"call {i} got {c.done['value']}, "
                                        f"the value of call {j}; its own is {want}",
                                        (c.invoke, c.done, calls[j].invoke)))
        else:
            out.append(HistoryViolation("wrong_value", f"call {i} got {c.done['value']}; the "
                                        f"fault-free model's value is {want}", (c.invoke, c.done)))
    return out


def out_of_order(calls: dict[int, _Call]) -> list[HistoryViolation]:
    """Completion order (``seq``) against submission order, deadlines exempt, and calls of
    the callbacks workloads (a call made inside a done-callback completes inside another
    call's completion, as chaos.oracles.futures_in_order exempts them); one violation per
    earlier call overtaken, showing the first overtaking call."""
    ordered = [c for _, c in sorted(calls.items())
               if c.done is not None and c.done.get("seq") is not None and not _unordered(c)]
    out = []
    for n, earlier in enumerate(ordered):
        later = next((c for c in ordered[n + 1:] if _overtook(earlier, c)), None)
        if later is not None:
            assert earlier.done is not None and later.done is not None
            out.append(HistoryViolation(
                "out_of_order", f"call {later.invoke['call']} completed before call "
                f"{earlier.invoke['call']}, which was submitted first",
                (earlier.invoke, later.invoke, later.done, earlier.done)))
    return out


def executed_twice(calls: dict[int, _Call]) -> list[HistoryViolation]:
    out = []
    for i, c in sorted(calls.items()):
        by_life = defaultdict(list)
        for e in c.execs:
            if not _is_replay(e):
                by_life[_run_key(e)].append(e)
        for (rank, life), runs in sorted(by_life.items(), key=repr):
            if len(runs) > 1:
                out.append(HistoryViolation(
                    "executed_twice", f"call {i} started {len(runs)} times on rank {rank} in "
                    f"incarnation {life} (not a marked recovery replay)",
                    (c.invoke, *runs[:2])))
    return out


def executed_after_fail(calls: dict[int, _Call]) -> list[HistoryViolation]:
    out = []
    for i, c in sorted(calls.items()):
        done = c.done
        if done is None or not _never_sent(done):
            continue
        ran = [e for e in c.execs if not _is_replay(e)]
        if ran:
            out.append(HistoryViolation(
                "executed_after_fail", f"call {i} was reported failed ({done.get('error')}: "
                f"never sent) yet rank {ran[0].get('rank')} ran it", (c.invoke, done, ran[0])))
    return out
