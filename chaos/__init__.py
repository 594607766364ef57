"""faultlab chaos: seeded fault injection, invariant oracles, suites and a CI runner.

    FaultPlan(faults, seed) ──► run_scenario(cfg, workload, plan, out_dir) ──► ScenarioResult
      KillWorker, TermWorker,       │ injects: signals (Injector), failpoints (chaos.points)
      HangWorker, ResumeWorker,     │ records: RecordingExecutor, fault timeline, trace journal
      SlowWorker, RaiseInWorker,    ▼ checks:  chaos.oracles (violations)
      CorruptQueue, KillDriver,   suites: chaos.suites (TOML), CLI: faultlab chaos run / replay
      KillNode (nnodes > 1: the node's agents in chaos.nodes), StarveCPU, StarveMemory,
      ExitWorker (a worker's own os._exit(0) at a phase)
"""

from chaos.faults import (
    CorruptQueue,
    ExitWorker,
    Fault,
    HangWorker,
    KillDriver,
    KillNode,
    KillWorker,
    PlanError,
    RaiseInWorker,
    ResumeWorker,
    SlowWorker,
    StarveCPU,
    StarveMemory,
    TermWorker,
)
from chaos.oracles import Bounds, Violation
from chaos.outcomes import TABLE, Outcome, outcome_for
from chaos.plan import FaultPlan, ResolvedFault, plan_random, schedule_signature
from chaos.scenario import ScenarioResult, run_scenario

__all__ = [
    "TABLE",
    "Bounds",
    "CorruptQueue",
    "ExitWorker",
    "Fault",
    "FaultPlan",
    "HangWorker",
    "KillDriver",
    "KillNode",
    "KillWorker",
    "Outcome",
    "PlanError",
    "RaiseInWorker",
    "ResolvedFault",
    "ResumeWorker",
    "ScenarioResult",
    "SlowWorker",
    "StarveCPU",
    "StarveMemory",
    "TermWorker",
    "Violation",
    "outcome_for",
    "plan_random",
    "run_scenario",
    "schedule_signature",
]
