"""``faultlab demo``: the engine on the built-in tensor/pipeline-parallel model, and by
default a fault it recovers from.

    seed ─► random prompts ─► LLMEngine(policy) ─► MultiprocExecutor ─► ModelWorker x (tp * pp)
                                  │   └─ after step N: SIGKILL worker rank R (faultlab/demo_fault.py)
                                  │      ─► detection ─► restart ─► requests rebuilt ─► first token
                                  ├─► stderr: progress
                                  └─► stdout: tokens per request, the recovery timeline, whether
                                      the tokens match a fault-free run (the same executor, after),
                                      where the trace is, and tokens/s (or one JSON object)

``--no-fault`` is plain generation; ``--fault``, ``--fault-step``, ``--fault-rank`` and
``--policy`` choose what breaks and what the engine does about it.

The seed draws both the prompts and the model weights, so one seed names one run; TP=1,
TP=2 and PP=2 print the same tokens for it.  torch is imported only inside ``run``.

Every numeric flag is range-checked by its argparse type, and the model's sequence limit
(``--prompt-len + --max-tokens <= max_positions`` of the config the workers build) before any
worker starts: a bad command line is one stderr line and exit 2, nothing on stdout.  Exit 1
(with the ``--json`` error object) is a run that started and failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from executor.model.prompts import make_prompts
from executor.model.recovery import POLICIES
from faultlab.demo_backend import BACKENDS, RAY_FAULTS, open_executor
from faultlab.demo_fault import FAULTS, DemoFault, failed_trace_report, timeline, trace_location
from faultlab.usage import UsageError, int_in, positive_seconds

WORKER = "executor.model.worker:ModelWorker"
POLICY_NAMES = tuple(sorted(POLICIES))
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit seed


def configure(parser: argparse.ArgumentParser) -> None:
    at_least_1 = int_in(1)
    parser.add_argument("--tp", type=at_least_1, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument("--pp", type=at_least_1, default=1, help="pipeline-parallel size (default 1)")
    parser.add_argument("--requests", type=at_least_1, default=8, help="number of requests (8)")
    parser.add_argument("--max-tokens", type=at_least_1, default=32, help="tokens per request (32)")
    parser.add_argument("--prompt-len", type=at_least_1, default=16, help="longest prompt (16)")
    parser.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                        help="seed of prompts and weights (0)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="keep two batches in flight even without pipeline parallelism")
    parser.add_argument("--step-timeout", type=positive_seconds, default=60.0,
                        help="seconds one step may take before the run fails (60)")
    parser.add_argument("--no-fault", action="store_true", help="plain generation, no fault")
    parser.add_argument("--fault", choices=FAULTS, default="kill",
                        help="what hits the worker mid-generation (kill; hang sets a 1 s "
                             "step timeout)")
    parser.add_argument("--fault-step", type=at_least_1, default=None,
                        help="the fault hits after this many steps (default: half of --max-tokens)")
    parser.add_argument("--fault-rank", type=int_in(0), default=None,
                        help="the worker rank hit (default: the last)")
    parser.add_argument("--policy", choices=POLICY_NAMES, default="restart",
                        help="recovery policy (restart)")
    parser.add_argument("--backend", choices=BACKENDS, default="shm",
                        help="executor: shm (shared memory, default) or ray (Ray actors on a "
                             "local two-node Ray cluster, or --ray-address)")
    parser.add_argument("--ray-address", default=None,
                        help="with --backend ray: an existing Ray cluster's HOST:PORT")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON object on stdout (none on a usage error)")


def run(args: argparse.Namespace) -> int:
    from executor.model.config import ModelConfig

    model = ModelConfig.from_kwargs(worker_kwargs(args))
    check_sequence_limit(args, model.max_positions)
    try:  # the layout the workers would refuse after seconds of start-up, refused now
        model.validate(args.tp, args.pp)
    except ValueError as exc:
        raise UsageError(f"--tp {args.tp} --pp {args.pp}: {exc}") from None
    fault = make_fault(args)
    prompts = make_prompts(args.seed, args.requests, args.prompt_len, model.vocab_size)
    try:
        report = _generate(args, prompts, fault)
    except Exception as exc:  # noqa: BLE001  (any failure ends the demo as one clear report)
        return _report_failure(args, exc)
    _print_report(args, report)
    return 0


def worker_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """What every ModelWorker is built from (its ``ModelConfig`` included)."""
    return {"seed": args.seed}


def check_sequence_limit(args: argparse.Namespace, max_positions: int) -> None:
    """The longest request (prompt plus generated tokens) must fit the model's positions."""
    longest = args.prompt_len + args.max_tokens
    if longest > max_positions:
        raise UsageError(f"--prompt-len {args.prompt_len} + --max-tokens {args.max_tokens} = "
                         f"{longest} tokens exceed the model's max_positions={max_positions}; "
                         f"lower one so their sum is at most {max_positions}")


def make_fault(args: argparse.Namespace) -> DemoFault | None:
    """The fault the flags ask for (None with --no-fault); ranks and steps checked here."""
    if args.no_fault:
        return None
    if args.backend == "ray" and args.fault not in RAY_FAULTS:
        raise UsageError(f"--fault {args.fault} is not for --backend ray (Ray has no shm ring); "
                         f"pick one of {', '.join(RAY_FAULTS)}")
    world = args.tp * args.pp
    rank = world - 1 if args.fault_rank is None else args.fault_rank
    if rank >= world:
        raise UsageError(f"--fault-rank {rank}: the ranks are 0..{world - 1} (tp x pp)")
    step = max(1, args.max_tokens // 2) if args.fault_step is None else args.fault_step
    if step >= args.max_tokens:
        raise UsageError(f"--fault-step {step}: the run has {args.max_tokens} steps at most; "
                         "pick a smaller step, raise --max-tokens, or use --no-fault")
    return DemoFault(args.fault, step, rank)


def _generate(args: argparse.Namespace, prompts: dict[str, list[int]],
              fault: DemoFault | None) -> dict[str, Any]:
    # Imported here first so that workers started by fork inherit torch instead of each
    # importing it again (start-up 0.1 s instead of 2 s on two cores).
    import torch  # noqa: F401

    from executor import ExecutorConfig
    from executor.model.engine import LLMEngine
    from executor.model.recovery import policy_named

    cfg = ExecutorConfig(worker=WORKER, tensor_parallel_size=args.tp,
                         pipeline_parallel_size=args.pp, worker_kwargs=worker_kwargs(args),
                         async_scheduling=args.async_scheduling)
    started = time.perf_counter()
    with open_executor(args.backend, cfg, args.ray_address) as executor:
        startup_s = time.perf_counter() - started
        _progress_line(f"{cfg.tensor_parallel_size * cfg.pipeline_parallel_size} workers "
                       f"ready in {startup_s:.2f}s")
        step_timeout = 1.0 if fault is not None and fault.kind == "hang" else args.step_timeout
        engine = LLMEngine(executor, step_timeout=step_timeout,
                           recovery=policy_named(args.policy))
        progress = _Progress()
        if fault is not None:
            fault.executor = executor

        def each_step(stats: Any) -> None:
            progress(stats, sum(r.replay is not None for r in engine.unfinished_requests))
            if fault is not None:
                fault(stats)

        outputs = engine.generate(prompts, args.max_tokens, progress=each_step)
        stats = engine.stats
        recovery = _recovery_report(fault, engine, executor, prompts, args.max_tokens, outputs)
    if recovery is not None:  # read once the workers are gone: their journals are complete
        recovery["failed_traces"], recovery["failed_trace_lines"] = failed_trace_report()
    return {"outputs": outputs, "recovery": recovery, "tokens_per_s": stats.tokens_per_s,
            "generated_tokens": stats.generated_tokens, "steps": stats.steps,
            "elapsed_s": stats.elapsed_s, "startup_s": startup_s, "prompts": prompts,
            "tp": args.tp, "pp": args.pp, "seed": args.seed,
            "async_scheduling": args.async_scheduling, "backend": args.backend,
            "max_concurrent_batches": executor.max_concurrent_batches}


def _recovery_report(fault: DemoFault | None, engine: Any, executor: Any,
                     prompts: dict[str, list[int]], max_tokens: int,
                     outputs: dict[str, list[int]]) -> dict[str, Any] | None:
    """The timeline, and the same prompts once more without a fault on the same executor."""
    if fault is None:
        return None
    from executor.model.engine import LLMEngine

    reference = LLMEngine(executor, step_timeout=60).generate(prompts, max_tokens)
    same = sum(outputs[rid] == reference[rid] for rid in prompts)
    return {"fault": fault.describe() if fault.fired_at is not None else None,
            "timeline": [{"ms": round(ms, 2), "event": e, "detail": d}
                         for ms, e, d in timeline(fault, engine.recovery)],
            "tokens_match": same == len(prompts), "requests_identical": same,
            "incarnation": getattr(executor, "incarnation", 0), "trace": trace_location()}


class _Progress:
    """Prints progress on stderr at most a few times a second, and only what changed: a
    failed step (the same counts again) prints nothing, a rebuild says it is one."""

    def __init__(self) -> None:
        self.last = 0.0
        self.shown: tuple[int, ...] = ()

    def __call__(self, stats: Any, rebuilding: int = 0) -> None:
        now = time.perf_counter()
        done = stats.finished_requests == stats.total_requests
        counts = (stats.steps, stats.generated_tokens, stats.finished_requests, rebuilding)
        if counts == self.shown or (now - self.last < 0.25 and not done):
            return
        self.last, self.shown = now, counts
        replay = (f" (rebuilding {rebuilding} requests: replayed steps add no tokens)"
                  if rebuilding else "")
        _progress_line(f"step {stats.steps}: {stats.finished_requests}/{stats.total_requests} "
                       f"requests, {stats.generated_tokens} tokens{replay}, "
                       f"{stats.tokens_per_s:.0f} tokens/s")


def _progress_line(text: str) -> None:
    print(f"[demo] {text}", file=sys.stderr, flush=True)


def _print_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(report))
        return
    for request_id, tokens in report["outputs"].items():
        prompt = report["prompts"][request_id]
        print(f"{request_id} (prompt {len(prompt)} tokens): {' '.join(map(str, tokens))}")
    _print_recovery(report.get("recovery"), len(report["outputs"]))
    print(f"tp={args.tp} pp={args.pp}: {report['generated_tokens']} tokens in "
          f"{report['elapsed_s']:.2f}s = {report['tokens_per_s']:.1f} tokens/s "
          f"({report['steps']} steps; start-up {report['startup_s']:.2f}s)")


def _print_recovery(recovery: dict[str, Any] | None, n_requests: int) -> None:
    if recovery is None:
        return
    if recovery["fault"] is None:
        print("fault: none fired (the run ended first)")
        return
    print("recovery timeline (ms after the fault):")
    for row in recovery["timeline"]:
        print(f"  {row['ms']:9.1f}  {row['event']:<11}  {row['detail']}")
    verdict = "yes" if recovery["tokens_match"] else "NO"
    print(f"tokens match a fault-free run: {verdict} ({recovery['requests_identical']}/"
          f"{n_requests} requests identical)")
    print(recovery["trace"])
    for line in recovery.get("failed_trace_lines", ()):
        print(line)


def _report_failure(args: argparse.Namespace, exc: Exception) -> int:
    message = f"{type(exc).__name__}: {exc}"
    print(f"faultlab demo: failed: {message}", file=sys.stderr)
    for line in failed_trace_report()[1]:
        print(line, file=sys.stderr)
    if args.json:
        print(json.dumps({"error": message, "outputs": {}, "tokens_per_s": 0.0,
                          "tp": args.tp, "pp": args.pp, "seed": args.seed}))
    return 1
