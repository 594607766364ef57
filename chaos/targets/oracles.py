"""Oracles that hold for any target, over a TargetRecord, named like chaos/oracles.py's.

    TargetRecord (chaos.targets.run)
        ├─ never_hung               every call ends within the bound; a hang names the stuck
        │                           processes and their psutil status
        ├─ failure_detected         a worker killed or terminated while calls remained: the
        │                           caller sees an error within detect_s (unless every call
        │                           still returned its right value: the target masked it)
        ├─ no_orphans               no process of the target alive exit_s after its driver ended
        ├─ nothing_leaked           no new /dev/shm name of the tree, no new temp file
        ├─ results_correct          a call that returned gave the fault-free value
        ├─ fault_free_stays_fault_free   fault "none": every call returned, no error, exit 0
        ├─ started                  the driver reported ready within the target's start timeout
        └─ planned_faults_fired     the fault fired (its trigger came while the driver lived)
    grades (no violation), over caller_errors (the error events and failed calls at or
    after the fault, earliest first):
        detected                    a fault fired and something reached the caller after it
        detection_latency_s         the earliest of them (error or failed call) − the fault
        cause_named                 rank / worker / generic / none, graded on the first
                                    ``error`` event (it wins over an earlier failed call),
                                    else on the first failed call
        outcome                     one word per run, see ``outcome`` (a killed driver's run
                                    with orphans and leftovers is "orphans")

A scenario's ``tolerate`` list moves the violations of those invariants to notes: the
behaviour is recorded (a SIGSTOPped worker hangs a call that has no deadline, on every
target) without failing the scenario.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.oracles import Violation
from chaos.targets.base import Target
from chaos.targets.run import TargetRecord, TargetRun
from chaos.targets.scenario import TargetScenario

Expected = dict[int, Any] | None
TargetOracle = Callable[[TargetRecord, Expected], list[Violation]]
WORKER_FATAL = ("kill", "term")

_RANK_RE = re.compile(r"\brank\b\D{0,3}(\d+)", re.IGNORECASE)
_PID_RE = re.compile(r"\bpid\b\D{0,3}(\d+)", re.IGNORECASE)
_SIGNAL_RE = re.compile(r"\bSIG[A-Z]{2,}\b|\bsignal\b\s*\d+|exit ?code[ =:]*-\d+", re.IGNORECASE)
_WHO = r"(?:worker|process|child|engine|actor|rank)s?"
_DIED = r"(?:died|dead|terminated|killed|exited|crashed|abruptly|gone|lost|stopped|ended)"
_WORKER_RE = re.compile(rf"\b{_WHO}\b.{{0,80}}\b{_DIED}\b|\b{_DIED}\b.{{0,40}}\b{_WHO}\b",
                        re.IGNORECASE | re.DOTALL)


# ------------------------------------------------------------------ grades


def caller_errors(record: TargetRecord) -> list[dict[str, Any]]:
    """What reached the caller at or after the fault (every error, for a run without one),
    earliest first: ``error`` events and failed calls, each with type, message and t."""
    since = record.fault_ns() or 0
    seen = [{"type": e.get("type"), "message": e.get("message") or "", "t": e["t"], "ev": "error"}
            for e in record.errors if e.get("t") is not None]
    seen += [{"type": c.get("type"), "message": c.get("message") or "", "t": c["end_ns"],
              "ev": "fail"} for c in record.calls.values()
             if c.get("outcome") == "fail" and c.get("end_ns") is not None]
    return sorted((e for e in seen if e["t"] >= since), key=lambda e: (e["t"], e["ev"] != "error"))


def detected(record: TargetRecord) -> bool:
    return record.fault_ns() is not None and bool(caller_errors(record))


def detection_latency_s(record: TargetRecord) -> float | None:
    """First fail/error event time − fault time; None when either is missing."""
    fault_ns, errors = record.fault_ns(), caller_errors(record)
    if fault_ns is None or not errors:
        return None
    return float((errors[0]["t"] - fault_ns) / 1e9)


def cause_named(record: TargetRecord) -> str:
    """How well the caller's error names the cause: "rank" (the rank and a pid or signal),
    "worker" (a worker/process died or was terminated), "generic" (an error with neither),
    "none" (no error reached the caller).  The ``error`` event is graded first."""
    errors = caller_errors(record)
    if not errors:
        return "none"
    fault = record.fault or {}
    first = next((e for e in errors if e["ev"] == "error"), errors[0])
    return grade_message(f"{first['type']}: {first['message']}", fault.get("rank"), fault.get("pid"))


def grade_message(message: str, rank: int | None = None, pid: int | None = None) -> str:
    """"rank": names the fault's rank and how it died (a signal, an exit code, or its pid);
    "worker": names a worker/process dying, the fault's rank alone, or the fault's pid alone;
    "generic": none of these.  With ``rank`` / ``pid`` None any rank / pid counts."""
    names_rank = _names_rank(message, rank)
    if names_rank and _names_how(message, pid):
        return "rank"
    if _WORKER_RE.search(message) or names_rank or _names_pid(message, pid):
        return "worker"
    return "generic"


def _names_rank(message: str, rank: int | None) -> bool:
    ranks = {int(m) for m in _RANK_RE.findall(message)}
    return bool(ranks) and (rank is None or rank in ranks)


def _names_pid(message: str, pid: int | None) -> bool:
    pids = {int(m) for m in _PID_RE.findall(message)}
    return bool(pids) and (pid is None or pid in pids)


def _names_how(message: str, pid: int | None) -> bool:
    return bool(_SIGNAL_RE.search(message)) or _names_pid(message, pid)


def outcome(record: TargetRecord, expected: Expected = None) -> str:
    """not_applicable | start_failed | exit_clean | orphans | leftovers (kill_driver) |
    hang | wrong_result | failed | crashed | ok (fault-free) | unaffected (a fault, no effect)"""
    if not record.applicable:
        return "not_applicable"
    if not record.started:
        return "start_failed"
    if record.fault_kind == "kill_driver" and record.fault is not None:
        return _kill_driver_outcome(record)
    if record.stuck:
        return "hang"
    if _wrong(record, expected):
        return "wrong_result"
    if caller_errors(record):
        return "failed"
    if record.done_ns is None or record.driver_returncode not in (0, None):
        return "crashed"
    return "ok" if record.fault_kind == "none" else "unaffected"


def _kill_driver_outcome(record: TargetRecord) -> str:
    """Orphans outrank leftovers: a run with both is "orphans" (its leftovers stay in the row)."""
    return "orphans" if record.orphans else "leftovers" if record.leftovers else "exit_clean"


# ------------------------------------------------------------------ oracles


def never_hung(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    out = []
    for stuck in record.stuck:
        procs = ", ".join(f"{p['role']}{'' if p['rank'] is None else ' rank ' + str(p['rank'])} "
                          f"pid {p['pid']} {p['status']}" for p in stuck["procs"])
        out.append(Violation("hang", f"{stuck['what']} ({_fault_words(record)}); "
                                     f"processes: {procs}"))
    bound_ns = record.bounds.get("bound_s", 5.0) * 1e9
    late = [i for i, c in sorted(record.calls.items())
            if c.get("end_ns") and c.get("invoke_ns") and c["end_ns"] - c["invoke_ns"] > bound_ns
            and not any(i in s["calls"] for s in record.stuck)]
    if late:
        out.append(Violation("hang", f"call(s) {late} ended later than "
                                     f"{bound_ns / 1e9:g} s after their invoke"))
    return out


def failure_detected(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    fault = record.fault
    if (fault is None or record.fault_kind not in WORKER_FATAL or fault.get("error")
            or (record.done_ns is not None and record.done_ns < fault["time_ns"])):
        return []  # nothing fatal to a worker hit the workload while it ran
    latency = detection_latency_s(record)
    what = _fault_words(record)
    if latency is None:
        if _all_correct(record, expected):
            return []  # the target masked the death: every call returned its right value
        how = ("the driver exited with code "
               f"{record.driver_returncode} before done" if record.done_ns is None
               and record.ended_by is None else "calls did not all return")
        return [Violation("detection", f"{what} never reached the caller: no error or failed "
                                       f"call after it ({how})")]
    detect_s = record.bounds.get("detect_s", 5.0)
    if latency > detect_s:
        return [Violation("detection", f"{what} reached the caller after {latency:.3f} s, "
                                       f"beyond the {detect_s:g} s bound")]
    return []


def no_orphans(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    why = {"fault": "killed by the fault", "hang": "killed by the observer after a hang",
           "deadline": "killed by the observer at the run's deadline",
           "start": "killed by the observer: no ready in time"}.get(record.ended_by or "",
                                                                     "it exited by itself")
    return [Violation("orphan", f"{o['role']}{'' if o.get('rank') is None else ' rank ' + str(o['rank'])}"
                                f" pid {o['pid']} ({o['status']}) was alive "
                                f"{record.bounds.get('exit_s', 5.0):g} s after its driver ended "
                                f"({why})") for o in record.orphans]


def nothing_leaked(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    return [Violation("leak", f"{name} was left behind by the run") for name in record.leftovers]


def results_correct(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    ok = [(i, c) for i, c in sorted(record.calls.items()) if c.get("outcome") == "ok"]
    if not ok:
        return []
    if expected is None:
        return [Violation("results", "no fault-free reference to compare the returned values "
                                     "with (the reference run did not complete)")]
    return [Violation("results", f"call {i} returned {_short(c.get('value'))}, the fault-free "
                                 f"run {_short(expected.get(i))}")
            for i, c in ok if c.get("value") != expected.get(i)]


def fault_free_stays_fault_free(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    if record.fault_kind != "none" or not record.started:
        return []
    out = [Violation("fault_free", f"call {i} failed with no fault: {c.get('type')}: "
                                   f"{(c.get('message') or '')[:200]}")
           for i, c in sorted(record.calls.items()) if c.get("outcome") == "fail"]
    out += [Violation("fault_free", f"the caller saw {e.get('type')} with no fault: "
                                    f"{(e.get('message') or '')[:200]}") for e in record.errors]
    returned = sum(c.get("outcome") == "ok" for c in record.calls.values())
    unfinished = [i for i, c in sorted(record.calls.items()) if c.get("outcome") == "pending"]
    if not record.stuck and (record.done_ns is None or unfinished):
        out.append(Violation("fault_free", f"the workload did not finish: {returned} of "
                                           f"{len(record.calls)} calls returned, driver exit "
                                           f"{record.driver_returncode}; stderr: "
                                           f"{record.stderr_tail[-300:]!r}"))
    elif record.driver_returncode not in (0, None) and record.ended_by is None:
        out.append(Violation("fault_free", f"the driver exited with code {record.driver_returncode}"))
    return out


def started(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    if not record.applicable or record.started:
        return []
    how = ("no ready within its start timeout" if record.ended_by == "start" else
           "the driver could not be started" if record.ended_by == "launch" else
           f"the driver exited with code {record.driver_returncode} before ready")
    return [Violation("start", f"{record.target}: {how}; stderr: {record.stderr_tail[-400:]!r}")]


def planned_faults_fired(record: TargetRecord, expected: Expected = None) -> list[Violation]:
    if not record.applicable or not record.started or record.fault_kind == "none":
        return []
    if record.fault is None:
        return [Violation("unfired", f"{record.fault_kind} never fired: its trigger did not "
                                     "come while the driver ran, so the run tested nothing of it")]
    if record.fault.get("error"):
        return [Violation("unfired", f"{record.fault_kind} could not be applied: "
                                     f"{record.fault['error']}")]
    if (record.mid_work and record.done_ns is not None
            and record.done_ns < (record.fault_ns() or 0)):
        return [Violation("unfired", f"{record.fault_kind} was meant to land mid-work but came "
                                     f"after the last call returned (the observer read events up "
                                     f"to {record.observer_lag_ms:g} ms late): the run tested "
                                     "nothing of it")]
    if record.fault_kind == "kill_driver" and record.fault.get("alive_at_fault") == []:
        return [Violation("unfired", "kill_driver hit a driver whose other processes had all "
                                     f"exited already ({record.fault.get('late_s')} s after its "
                                     "moment): the run tested nothing of it")]
    return []


ORACLES: tuple[TargetOracle, ...] = (
    started, planned_faults_fired, never_hung, failure_detected, no_orphans, nothing_leaked,
    results_correct, fault_free_stays_fault_free,
)


def check(record: TargetRecord, expected: Expected,
          tolerate: tuple[str, ...] = ()) -> tuple[list[Violation], list[Violation]]:
    """(violations, tolerated): every oracle's violations, split by the scenario's tolerate.
    A run whose fault did not apply (found so only once running) is judged by none."""
    if not record.applicable:
        return [], []
    # Each oracle is looked up by name at call time (a planted judge replaces it here too).
    found = [v for oracle in ORACLES
             for v in globals().get(oracle.__name__, oracle)(record, expected)]
    return ([v for v in found if v.invariant not in tolerate],
            [v for v in found if v.invariant in tolerate])


# ------------------------------------------------------------------ the reference


def reference_values(target: Target, scenario: TargetScenario, seed: int,
                     out_root: Path) -> Expected:
    """Each call's fault-free value: computed by the target when it can, else from one
    fault-free run of the same spec, cached per target and spec in ``out_root/reference``."""
    spec = scenario.workload_spec(seed)
    computed = target.expected_values(spec)
    if computed is not None:
        return computed
    base = {k: v for k, v in spec.to_json().items() if k != "linger_s"}
    key = hashlib.sha256(json.dumps(base, sort_keys=True).encode()).hexdigest()[:12]
    path = out_root / "reference" / f"{target.name}-{key}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        return None if saved["values"] is None else {int(k): v for k, v in saved["values"].items()}
    plain = TargetScenario(name=f"reference-{key}", fault="none", bound_s=scenario.bound_s,
                           exit_s=scenario.exit_s,
                           spec={k: v for k, v in scenario.spec.items() if k != "linger_s"})
    record = TargetRun(target, plain, seed, path.with_suffix("")).run()
    good = record.done_ns is not None and bool(record.calls) and all(
        c.get("outcome") == "ok" for c in record.calls.values())
    values = {i: c.get("value") for i, c in record.calls.items()} if good else None
    path.write_text(json.dumps({"spec": base, "values": values}, indent=1))
    return values


def _wrong(record: TargetRecord, expected: Expected) -> bool:
    return expected is not None and any(
        c.get("outcome") == "ok" and c.get("value") != expected.get(i)
        for i, c in record.calls.items())


def _all_correct(record: TargetRecord, expected: Expected) -> bool:
    """Every call the driver made returned its right value, and the workload finished (a
    driver may group the spec's calls into fewer of its own: vLLM batches requests)."""
    return (record.done_ns is not None and bool(record.calls) and not _wrong(record, expected)
            and all(c.get("outcome") == "ok" for c in record.calls.values()))


def _fault_words(record: TargetRecord) -> str:
    fault = record.fault
    if fault is None or fault.get("time_ns") is None:
        return "no fault"
    who = f"{fault.get('role')}" + ("" if fault.get("rank") is None else f" rank {fault['rank']}")
    return f"{fault['kind']} of {who} (pid {fault.get('pid')})"


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = [
    "ORACLES", "caller_errors", "cause_named", "check", "detected", "detection_latency_s",
    "grade_message", "outcome", "reference_values",
]
