"""Target histories: a TargetRecord's calls as a call history (chaos.history's format), for
chaos.history_check.

    TargetRecord.calls (the driver's invoke / ok / fail events, chaos.targets.protocol)
      + the fault-free values the workload knows (Target.expected_values or the reference run)
        ──build──► [invoke, ok | info, ...] in time order ──► OUT/.../history.jsonl
                                                          ──► chaos.history_check.check

    invoke   call (the driver's call id), method (the driver's ``what``), args "(ID,)",
             expected: the fault-free value as JSON text (None: no reference)
    ok       value: the value as the driver reported it (protocol.digest), as JSON text
    info     a failed call: seen from outside, its outcome is unknown (the target may have
             run the task before or after the error; none of them says), so ``error`` and
             ``message`` are kept and nothing more is claimed; also a call still in flight
             when the driver was ended (by the fault's SIGKILL, or by the observer after a
             hang, at the deadline): error "DriverEnded"
    (nothing) a call in flight when the driver exited by itself: never_completed
    seq      the order completions were reported, only for a target that promises its
             calls complete in submission order (ORDERED); for the others out_of_order has
             nothing to judge, so it never reports a promise the target did not make

No target shows its executions here (exec_start / exec_end): the peers (processpool,
loky, pebble, ray, vllm) expose nothing of their workers' runs to an outside observer, and
the faultlab target's driver runs without a trace journal; faultlab's own explore
(chaos.explore) reads its executions from the journal.  So executed_twice and
executed_after_fail never fire on a target history: the checks that apply are
never_completed, wrong_value, reply_to_other and (ORDERED only) out_of_order.

What the targets promise about order (read in their documentation and code): faultlab's
collective_rpc resolves futures in submission order (DESIGN.md: "Futures complete in
submission order"); vLLM's LLM.generate returns outputs in prompt order;
concurrent.futures (processpool), loky, pebble and ray promise nothing across futures
(each driver waits for one call before the next, which orders the calls, but that is the
driver's doing, not a promise of the target's).
"""

from __future__ import annotations

import json
from typing import Any

from chaos.targets.run import TargetRecord

ORDERED = frozenset({"faultlab", "vllm"})
DRIVER_ENDED = "DriverEnded"


def text(value: Any) -> str:
    """A value as the history compares it: canonical JSON text."""
    return json.dumps(value, sort_keys=True, default=repr)


def completion_order(record: TargetRecord) -> dict[int, int]:
    """call -> its place in the order calls completed (``end_ns``, ties by call id), for a
    target that promises order (ORDERED); empty for the others (no ``seq``: nothing judged)."""
    if record.target not in ORDERED:
        return {}
    ended = sorted((c.get("end_ns") or 0, i) for i, c in record.calls.items()
                   if c.get("outcome") in ("ok", "fail"))
    return {i: n for n, (_, i) in enumerate(ended)}


def build(record: TargetRecord, expected: dict[int, Any] | None) -> list[dict[str, Any]]:
    """The history of ``record``'s calls, in time order (an event without a time last)."""
    events: list[dict[str, Any]] = []
    seq = completion_order(record)
    for i, c in sorted(record.calls.items()):
        want = None if expected is None or i not in expected else text(expected[i])
        events.append({"op": "invoke", "call": i, "t": c.get("invoke_ns"), "method": c.get("what"),
                       "args": f"({i},)", "non_block": False, "timeout": None, "expected": want})
        done = {"call": i, "t": c.get("end_ns"), "seq": seq.get(i)}
        if c.get("outcome") == "ok":
            events.append({"op": "ok", **done, "value": text(c.get("value"))})
        elif c.get("outcome") == "fail":
            events.append({"op": "info", **done, "error": c.get("type"),
                           "message": (c.get("message") or "")[:200]})
        elif record.ended_by is not None:
            events.append({"op": "info", "call": i, "t": record.driver_end_ns, "seq": None,
                           "error": DRIVER_ENDED,
                           "message": f"the driver was ended ({record.ended_by}) while the call ran"})
    return sorted(events, key=lambda e: (e["t"] is None, e["t"] or 0))
