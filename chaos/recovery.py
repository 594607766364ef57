"""Recovery scenarios: generate on the model, hit a worker at a seeded step, and check that
the ``restart`` policy finishes every request with the fault-free tokens.

    seed ─► fault step in [first, last] ─► fault-free reference (TP=1, same prompts, weights)
    RemoteNodes (nnodes > 1: `faultlab worker` agents on loopback, chaos/nodes.py)
    MultiprocExecutor(model) ─► baseline: a fault-free LLMEngine run (its tokens/s)
                             ─► LLMEngine(policy) ─ step ... step k: the fault ─► ... done
    oracles: every request finished │ tokens == reference │ recovery within the bound │
             no rebuilt token differed │ nothing of an old incarnation (process, segment,
             thread, fd) left after shutdown, on any node
    ─► DIR/<scenario>/result.json and a row of the suite summary ("recovered" yes/no)

Faults: ``kill`` (SIGKILL), ``sigterm``, ``hang`` (SIGSTOP, caught by the step timeout),
``corrupt`` (the rpc ring's chunk metadata overwritten: the queue reports the damage) and
``kill_node`` (nnodes > 1: SIGKILL the agent of ``rank``'s node and its workers; once the
executor has failed a fresh agent starts and rejoins within ``node_timeout``).  With
nnodes > 1, ``kill`` of a rank on node 1 kills that node's worker (its agent survives).
Under ``fail_stop`` the expected outcome is the old one: the engine fails, naming the rank.
``then`` adds a second fault that lands while the recovery runs (chaos/interrupted_recovery.py:
``before_live`` kills rank ``then_rank`` of the new incarnation between READY and going live,
``in_replay`` kills it while the requests replay); ``executor`` ("module:Class", default the
real executor) runs a planted executor of chaos.mutants instead, ``recovery`` a planted
``Recovery``.  ``skew`` (with ``kill``, sync, no second fault): the restarted workers load a
changed checkpoint (chaos/skewed_restart.py), whose oracles replace "the fault-free tokens".

Throughput (tokens/s, new tokens only, replayed ones not counted): ``baseline`` is the
fault-free run on the same executor just before; ``during`` runs from the fault to the
first new token after recovery (the tokens of the step that brings it count); ``after``
from there to the end.  Under ``fail_stop`` there is no during or after.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import random
import tempfile
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from chaos import resources, skewed_restart
from chaos.control import trace_fault
from chaos.faults import CorruptQueue, Fault, HangWorker, KillNode, KillWorker, PlanError, TermWorker
from chaos.interrupted_recovery import SECOND_FAULTS, SecondFault
from chaos.nodes import RemoteNodes
from chaos.oracles import Violation
from chaos.outcomes import Outcome
from executor.model.recovery import POLICIES

if TYPE_CHECKING:
    from executor import ExecutorConfig, MultiprocExecutor
    from executor.model.recovery import Recovery

_T = TypeVar("_T")
FAULTS = ("kill", "sigterm", "hang", "corrupt", "kill_node")
WORKER = "executor.model.worker:ModelWorker"
_KEYS = {"name", "fault", "rank", "steps", "policy", "tp", "pp", "async_scheduling",
         "requests", "max_tokens", "step_timeout", "recovery_bound_s", "nnodes", "node_timeout",
         "then", "then_rank", "executor", "recovery", "skew"}
FAILED_WITHIN_S = 30.0  # kill_node: the executor notices the node's loss within this
NODE_EXIT_S = 15.0  # after shutdown, an agent leaves by itself within this (else a leak)


@dataclasses.dataclass(frozen=True)
class RecoveryScenario:
    name: str
    fault: str = "kill"
    rank: int = 1
    steps: tuple[int, int] = (3, 10)  # the fault hits after a seeded step in this range
    policy: str = "restart"
    tp: int = 2
    pp: int = 1
    async_scheduling: bool = False
    requests: int = 4
    max_tokens: int = 20
    step_timeout: float = 30.0  # a hang is caught by it: hang scenarios set ~1 s
    recovery_bound_s: float = 10.0  # detection to the first new token
    nnodes: int = 1  # > 1: ranks spread over nodes, node k > 0 a `faultlab worker` agent
    node_timeout: float = 10.0  # a silent remote worker or agent counts as gone after this
    then: str = ""  # a second fault during the recovery: "" (none) or one of SECOND_FAULTS
    then_rank: int = 0
    executor: str = ""  # "module:Class" of the executor ("": MultiprocExecutor)
    recovery: str = ""  # "module:Class" of the Recovery at work ("": the policy's own)
    skew: bool = False  # the restart loads a changed checkpoint (chaos/skewed_restart.py)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> RecoveryScenario:
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise PlanError(f"{where}.{unknown[0]}: unknown key; known: {sorted(_KEYS)}")
        fields: dict[str, Any] = {k: (tuple(v) if k == "steps" else v) for k, v in data.items()}
        try:
            scenario = cls(**fields)
            scenario.check(where)
        except (TypeError, ValueError) as exc:  # PlanError is a ValueError
            raise PlanError(str(exc) if isinstance(exc, PlanError) else f"{where}: {exc}") from None
        return scenario

    def check(self, where: str) -> None:
        if self.fault not in FAULTS:
            raise PlanError(f"{where}.fault: must be one of {FAULTS}, got {self.fault!r}")
        if self.policy not in POLICIES:
            raise PlanError(f"{where}.policy: must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if not 0 <= self.rank < self.tp * self.pp:
            raise PlanError(f"{where}.rank: {self.rank} is not a rank of tp {self.tp} x pp "
                            f"{self.pp}")
        if not isinstance(self.nnodes, int) or self.nnodes < 1 or (self.tp * self.pp) % self.nnodes:
            raise PlanError(f"{where}.nnodes: must divide tp x pp ({self.tp * self.pp}), "
                            f"got {self.nnodes!r}")
        if self.fault == "kill_node" and self.rank * self.nnodes // (self.tp * self.pp) == 0:
            raise PlanError(f"{where}.fault: kill_node needs nnodes > 1 and a rank off node 0, "
                            f"got nnodes {self.nnodes}, rank {self.rank}")
        self._check_second(where)
        first, last = self.steps
        if not 1 <= first <= last < self.max_tokens:
            raise PlanError(f"{where}.steps: need 1 <= first <= last < max_tokens "
                            f"({self.max_tokens}), got {list(self.steps)}")

    def _check_second(self, where: str) -> None:
        if self.then and self.then not in SECOND_FAULTS:
            raise PlanError(f"{where}.then: must be one of {SECOND_FAULTS} (or absent), "
                            f"got {self.then!r}")
        if self.then and (not POLICIES[self.policy].recovers or self.nnodes > 1):
            raise PlanError(f"{where}.then: a second fault needs policy 'restart' and one node")
        if not 0 <= self.then_rank < self.tp * self.pp:
            raise PlanError(f"{where}.then_rank: {self.then_rank} is not a rank of tp {self.tp} "
                            f"x pp {self.pp}")
        for key in ("executor", "recovery"):
            value = getattr(self, key)
            if not isinstance(value, str) or (value and value.count(":") != 1):
                raise PlanError(f"{where}.{key}: must be 'module:Class', got {value!r}")
        if self.skew and (self.fault != "kill" or self.async_scheduling or self.then
                          or not POLICIES[self.policy].recovers or self.nnodes > 1):
            raise PlanError(f"{where}.skew: needs fault 'kill', policy 'restart', sync "
                            "scheduling, one node and no second fault (chaos/skewed_restart.py)")

    def executor_class(self) -> type[MultiprocExecutor]:
        from executor import MultiprocExecutor

        return _class_named(self.executor, MultiprocExecutor, "executor") if self.executor \
            else MultiprocExecutor

    def recovery_class(self) -> type[Recovery] | None:
        from executor.model.recovery import Recovery

        return _class_named(self.recovery, Recovery, "recovery") if self.recovery else None

    def fault_step(self, seed: int) -> int:
        """The step after which the fault hits: drawn from the seed and the name only."""
        return random.Random(seed ^ zlib.crc32(self.name.encode())).randint(*self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class RecoveryResult:
    """One recovery scenario's outcome; the attributes the suite summary reads, and more."""

    name: str
    seed: int
    violations: list[Violation]
    out_dir: Path
    expected: Outcome
    outcome: Outcome | None
    wall_s: float
    fault_step: int
    recovered: bool = False
    detection_latency_s: float | None = None  # fault to the first new token after recovery
    tokens_recomputed: int = 0
    requests_lost: int = 0
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    baseline_tokens_per_s: float | None = None  # the fault-free run, same executor
    during_tokens_per_s: float | None = None  # fault to the first new token
    after_tokens_per_s: float | None = None  # first new token to the end

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "violations"}
        data.update(ok=self.ok, out_dir=str(self.out_dir), expected=self.expected.value,
                    outcome=self.outcome and self.outcome.value,
                    violations=[{"invariant": v.invariant, "message": v.message}
                                for v in self.violations])
        return data


_REFERENCE: dict[tuple[int, int, int], dict[str, list[int]]] = {}


def prompts_for(scenario: RecoveryScenario, seed: int) -> dict[str, list[int]]:
    from executor.model.prompts import make_prompts

    return make_prompts(seed, scenario.requests, 12, 512)


def reference_tokens(scenario: RecoveryScenario, seed: int) -> dict[str, list[int]]:
    """The fault-free run's tokens (TP=1: the model computes the same for every layout)."""
    key = (seed, scenario.requests, scenario.max_tokens)
    if key not in _REFERENCE:
        from executor import ExecutorConfig, MultiprocExecutor
        from executor.model.engine import LLMEngine

        cfg = ExecutorConfig(worker=WORKER, start_method="fork", worker_kwargs={"seed": seed})
        with MultiprocExecutor(cfg) as ex:
            _REFERENCE[key] = LLMEngine(ex, step_timeout=60).generate(
                prompts_for(scenario, seed), scenario.max_tokens)
    return _REFERENCE[key]


def run_recovery(scenario: RecoveryScenario, seed: int, out: Path) -> RecoveryResult:
    """Run one scenario into ``out`` (result.json); see the module docstring."""
    import torch  # noqa: F401  (before the fork: workers inherit it)

    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.json").write_text(json.dumps(  # what `faultlab chaos replay` reruns
        {"seed": seed, "recovery": scenario.to_dict()}, indent=2))
    t0 = time.monotonic()
    reference = reference_tokens(scenario, seed)
    before = resources.snapshot()
    run = _FaultedRun(scenario, seed, out / "skew-flag")
    run.execute(out / "nodes")
    leaks = resources.leaks(before, run.all_pids, os.getpid(), (str(out),))
    result = _judge(scenario, seed, out, run, reference, leaks, time.monotonic() - t0)
    (out / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return result


class _FaultedRun:
    """The engine under one fault; what the oracles need, collected."""

    def __init__(self, scenario: RecoveryScenario, seed: int, skew_flag: Path | None = None) -> None:
        self.scenario, self.seed = scenario, seed
        # created at the fault when the scenario skews (run_recovery puts it in its out dir)
        self.skew_flag = skew_flag or Path(tempfile.gettempdir()) / f"faultlab-skew-{os.getpid()}"
        self.kept: dict[str, list[int]] = {}  # each unfinished request's tokens at the fault
        self.step = scenario.fault_step(seed)
        self.outputs: dict[str, list[int]] = {}
        self.errors: dict[str, str] = {}
        self.all_pids: list[int] = []
        self.old_alive: list[str] = []
        self.fault_at: float | None = None
        self.engine: Any = None
        self.engine_error = ""
        self.baseline: dict[str, list[int]] = {}
        self.marks: dict[str, tuple[float, int]] = {}  # fault/first/end -> (time, new tokens)
        self.nodes: RemoteNodes | None = None
        self.second = SecondFault(scenario.then, scenario.then_rank, seed) if scenario.then else None

    def config(self) -> ExecutorConfig:
        from executor import ExecutorConfig

        s = self.scenario
        kwargs: dict[str, Any] = {"seed": self.seed, "collective_timeout_s": 30}
        if s.skew:
            skewed_restart.reset(self.skew_flag)
            kwargs[skewed_restart.FLAG_KEY] = str(self.skew_flag)
        return ExecutorConfig(worker=skewed_restart.WORKER if s.skew else WORKER,
                              tensor_parallel_size=s.tp, pipeline_parallel_size=s.pp,
                              start_method="fork", async_scheduling=s.async_scheduling,
                              nnodes=s.nnodes, node_timeout=s.node_timeout,
                              heartbeat_interval=min(0.2, s.node_timeout / 4), worker_kwargs=kwargs)

    def execute(self, nodes_dir: Path) -> None:
        with RemoteNodes(self.config(), nodes_dir) as nodes:
            self.nodes = nodes
            nodes.start()
            with self.scenario.executor_class()(nodes.config) as ex:
                try:
                    self._run(ex)
                finally:
                    if self.second is not None:
                        self.second.disarm()
                        self.all_pids += [p for p in self.second.pids if p not in self.all_pids]
            nodes.wait_exit(NODE_EXIT_S)
            self.all_pids += nodes.ended
            self.old_alive += [f"pid {p} on node {k} is alive after shutdown"
                               for k in nodes.agents for p in nodes.tree_pids(k)]

    def _run(self, ex: MultiprocExecutor) -> None:
        from executor.model.engine import EngineFailedError, LLMEngine
        from executor.model.recovery import Restart, policy_named

        s = self.scenario
        self.all_pids += ex.worker_pids
        prompts = prompts_for(s, self.seed)
        started = time.perf_counter()
        baseline = LLMEngine(ex, step_timeout=s.step_timeout)
        self.baseline = baseline.generate(prompts, s.max_tokens)
        self.marks["baseline"] = (time.perf_counter() - started, baseline.stats.generated_tokens)
        policy = policy_named(s.policy)
        self.engine = LLMEngine(ex, step_timeout=s.step_timeout, recovery=policy)
        planted = s.recovery_class()
        if planted is not None and isinstance(policy, Restart):
            self.engine.recovery = planted(policy)
        futures = {rid: self.engine.add_request(rid, p, s.max_tokens) for rid, p in prompts.items()}
        try:
            self._loop(ex)
        except EngineFailedError as exc:
            self.engine_error = str(exc)
        self._collect(futures)
        self.all_pids += [p for p in ex.worker_pids if p not in self.all_pids]
        self.old_alive = [f"pid {p} of an old incarnation is {state}"
                          for p in self.all_pids if p not in ex.worker_pids
                          and (state := resources.process_state(p)) == "alive"]

    def _loop(self, ex: MultiprocExecutor) -> None:
        while self.engine.has_unfinished():
            self.engine.step()
            self._mark_first_token()
            if self.second is not None and self.fault_at is not None:
                self.second.after_step(ex, self.engine)
            if self.fault_at is None and self.engine.stats.steps >= self.step:
                self.fault_at = time.perf_counter()
                self.marks["fault"] = (self.fault_at, self.engine.stats.generated_tokens)
                self.kept = {r.request_id: list(r.output_token_ids)
                             for r in self.engine.unfinished_requests}
                if self.scenario.skew:
                    self.skew_flag.touch()  # read by the next incarnation's workers
                inject(ex, self.scenario.fault, self.scenario.rank, nodes=self.nodes)
                if self.second is not None:
                    self.second.arm()
        self.marks["end"] = (time.perf_counter(), self.engine.stats.generated_tokens)

    def _mark_first_token(self) -> None:
        records = self.engine.recovery.records if self.engine.recovery is not None else []
        first = next((r.first_token_at for r in records if r.first_token_at is not None), None)
        if "first" not in self.marks and first is not None:  # a second recovery's, if interrupted
            self.marks["first"] = (first, self.engine.stats.generated_tokens)

    def throughput(self) -> tuple[float | None, float | None, float | None]:
        """Tokens/s: the fault-free baseline, during recovery, after it (module docstring)."""
        def rate(a: str, b: str) -> float | None:
            if a not in self.marks or b not in self.marks:
                return None
            (t0, n0), (t1, n1) = self.marks[a], self.marks[b]
            return (n1 - n0) / max(t1 - t0, 1e-9)

        seconds, tokens = self.marks.get("baseline", (0.0, 0))
        return tokens / max(seconds, 1e-9), rate("fault", "first"), rate("first", "end")

    def _collect(self, futures: dict[str, Any]) -> None:
        for rid, future in futures.items():
            error = future.exception(timeout=0) if future.done() else RuntimeError("unfinished")
            if error is None:
                self.outputs[rid] = future.result()
            else:
                self.errors[rid] = str(error)


def _damage_next_request() -> None:
    """Set every metadata byte of the next request chunk the driver publishes to 0xFF (once),
    through the executor's failpoint: the workers find their rpc queue damaged."""
    from chaos.points import damage_chunk
    from executor import failpoints

    def damage(ring: Any, index: int, **_: Any) -> None:
        failpoints.disable("queue.after_publish")
        damage_chunk(ring, index, "all_ff")

    failpoints.enable("queue.after_publish", damage)


# The demo's and recovery suites' fault names, as chaos fault kinds (chaos.faults says what
# each means, its signal included).
_KINDS: dict[str, type[Fault]] = {"kill": KillWorker, "sigterm": TermWorker, "hang": HangWorker,
                                  "corrupt": CorruptQueue, "kill_node": KillNode}


def inject(ex: MultiprocExecutor, fault: str, rank: int, seed: int | None = None,
           nodes: RemoteNodes | None = None) -> None:
    """Hit worker ``rank`` of ``ex`` (or its rpc queue, or its node) with ``fault``, from the
    driver; the fault is a ``chaos.fault`` span first, so the trace links recovery to it."""
    pid = ex.worker_pids[rank]
    kind = _KINDS[fault]
    record: dict[str, Any] = {"kind": kind.kind, "rank": rank, "pid": pid,
                              "phase": "before_publish" if fault == "corrupt" else "signal"}
    if fault == "corrupt":
        record["mode"] = "all_ff"
    trace_fault(record, seed)
    if fault == "kill_node":
        _replace_node(ex, ex.config.node_of(rank), nodes)
        return
    if fault == "corrupt":
        _damage_next_request()
        return
    assert kind.signal is not None, f"{kind.kind} is not delivered by a signal"
    os.kill(pid, kind.signal)


def _replace_node(ex: MultiprocExecutor, node: int, nodes: RemoteNodes | None) -> None:
    """SIGKILL ``node``'s agent and workers; once the executor has failed (so the fresh agent's
    HELLO waits for the next incarnation), start a fresh agent that rejoins it."""
    if nodes is None or node not in nodes.agents:
        raise ValueError(f"kill_node: node {node} has no agent to kill (nnodes > 1 needed)")
    nodes.kill_agent(node)
    deadline = time.monotonic() + FAILED_WITHIN_S
    while not ex.is_failed and time.monotonic() < deadline:
        time.sleep(0.01)
    nodes.start_agent(node)


def _judge(s: RecoveryScenario, seed: int, out: Path, run: _FaultedRun,
           reference: dict[str, list[int]], leaks: list[str], wall_s: float) -> RecoveryResult:
    recovery = run.engine.recovery
    records = recovery.records if recovery is not None else []
    latency = recovery_latency_s(records, run.fault_at)
    recovered = has_recovered(records, run)
    result = RecoveryResult(
        s.name, seed, [], out, Outcome.RECOVER if POLICIES[s.policy].recovers else Outcome.FAIL_FAST,
        Outcome.RECOVER if recovered else Outcome.FAIL_FAST if run.errors else None, wall_s,
        run.step, recovered, latency, sum(r.tokens_recomputed for r in records),
        len(run.errors), [{"kind": s.fault, "rank": s.rank, "step": run.step}]
        + ([run.second.record] if run.second is not None and run.second.record else []),
        *run.throughput())
    result.violations = _oracles(s, run, reference, leaks, result, recovery)
    return result


def recovery_latency_s(records: list[Any], fault_at: float | None) -> float | None:
    """Fault to the first new token of the first recovery that produced one (a recovery a
    second fault interrupted before any new token has none: the next one's counts)."""
    first = next((r.first_token_at for r in records if r.first_token_at is not None), None)
    return None if first is None or fault_at is None else first - fault_at


def has_recovered(records: list[Any], run: _FaultedRun) -> bool:
    """A recovery was recorded, and every request finished with the engine still up."""
    return bool(records) and not run.errors and not run.engine_error


# The recovery scenario's oracles, in the order they report; each a small named check so a
# planted judge (chaos/planted_judges/recovery.py) can replace one:
#   leaks │ the layout's fault-free tokens │ the fault hit │ fail_stop: failed naming the rank
#   restart: every request finished │ tokens (or the skew's own) │ rebuilt tokens counted
#            │ recovery within its bound │ a recovery recorded at all

def _oracles(s: RecoveryScenario, run: _FaultedRun, reference: dict[str, list[int]],
             leaks: list[str], result: RecoveryResult, recovery: Any) -> list[Violation]:
    v = [Violation("leak", p) for p in leaks + run.old_alive]
    if run.second is not None:
        v += run.second.violations()
    v += _layout_tokens(run, reference) + _fault_hit(run)
    if not POLICIES[s.policy].recovers:
        return v + _failed_naming_the_rank(run)
    v += _finished(run)
    if s.skew:  # the new model's tokens may differ: its own oracles
        v += skewed_restart.violations(run.skew_flag, run.kept, prompts_for(s, run.seed),
                                       run.outputs, recovery)
    else:
        v += _same_tokens(run.outputs, reference) + _rebuilt_tokens_counted(recovery)
    v += _recovery_time(s, result)
    if not result.recovered and not v:
        v.append(Violation("recovered", "the fault hit but no recovery was recorded"))
    return v


def _layout_tokens(run: _FaultedRun, reference: dict[str, list[int]]) -> list[Violation]:
    if run.baseline and run.baseline != reference:
        return [Violation("tokens", "the fault-free run in this layout differs from TP=1's")]
    return []


def _fault_hit(run: _FaultedRun) -> list[Violation]:
    if run.fault_at is None:
        return [Violation("fault", f"the run ended before step {run.step}: no fault hit")]
    return []


def _failed_naming_the_rank(run: _FaultedRun) -> list[Violation]:
    if not run.errors or "rank" not in run.engine_error:
        return [Violation("fail_stop", "expected every request to fail naming the rank; "
                                       f"got {len(run.errors)} failed")]
    return []


def _finished(run: _FaultedRun) -> list[Violation]:
    return [Violation("finished", f"request {rid} did not finish: {e}") for rid, e in run.errors.items()]


def _same_tokens(outputs: dict[str, list[int]], reference: dict[str, list[int]]) -> list[Violation]:
    return [Violation("tokens", f"request {rid}: tokens differ from the fault-free run's")
            for rid, tokens in outputs.items() if tokens != reference.get(rid)]


def _rebuilt_tokens_counted(recovery: Any) -> list[Violation]:
    if recovery is not None and recovery.mismatches:
        return [Violation("tokens", f"{recovery.mismatches} rebuilt token(s) differed")]
    return []


def _recovery_time(s: RecoveryScenario, result: RecoveryResult) -> list[Violation]:
    latency = result.detection_latency_s
    if result.recovered and (latency is None or latency > s.recovery_bound_s):
        return [Violation("recovery_time", f"fault to first new token took {latency} s "
                                           f"(bound {s.recovery_bound_s:g} s)")]
    return []


def _class_named(spec: str, base: type[_T], what: str) -> type[_T]:
    """The class that ``spec`` ("module:Class") names, a subclass of ``base``; else PlanError."""
    module, _, attr = spec.partition(":")
    cls = getattr(importlib.import_module(module), attr, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PlanError(f"{what} {spec!r} is not a {base.__name__} class")
    return cls
