"""Chaos targets: the same seeded scenarios against any executor, measured from outside.

    faultlab chaos compare targets --targets faultlab,vllm,processpool,... --seeds N --out DIR
        │
        ▼ for each target × scenario × seed (chaos.targets.compare)
    Target.launch(workload)  ──► a driver subprocess (the target's own Python: the target's
        │                        venv may not be ours) that runs the target's executor and a
        │                        workload, and reports on stdout in the driver protocol
        │                        (chaos/targets/protocol.py: JSON lines, stdlib only):
        │                          ready {processes by role and rank}, invoke/ok/fail per
        │                          call, error (what the caller saw), done
        ▼
    TargetRun (chaos.targets.run): the outside observer.  Reads the events, finds the
        process tree by role and rank, applies the scenario's fault from outside (signals
        to a role or rank, SIGKILL of the driver, damage to the target's shared-memory
        segments where they can be found), and records the fault, each process's exit and
        the moment the caller saw the error
        ▼
    oracles that hold for any target (chaos.targets.oracles): every call ends within a
        bound (a hang names the stuck processes and their state); the failure reaches the
        caller, graded by how well it names the cause (rank / worker / generic / none);
        detection latency from the fault; no process of the target alive a bound after its
        driver ended (orphans, by role); no /dev/shm or temp files left; surviving outputs
        equal the fault-free run's
        ▼
    Row (compare.json), compare.md, a JUnit file per target

A target is one small module: its name, the extra that installs it, how to start its driver
and which fault kinds apply (``Target.applies``); a kind that does not apply is reported as
``not_applicable``, never skipped in silence.  faultlab's own executor is one target among
them (``faultlab``), driven through the same protocol.
"""

from __future__ import annotations

from chaos.targets.base import TARGET_NAMES, Target, TargetUnavailable, get_target

__all__ = ["TARGET_NAMES", "Target", "TargetUnavailable", "get_target"]
