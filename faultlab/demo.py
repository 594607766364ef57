"""``faultlab demo``: the engine on the built-in tensor/pipeline-parallel model.

    seed ─► random prompts ─► LLMEngine ─► MultiprocExecutor ─► ModelWorker x (tp * pp)
                                  │
                                  ├─► stderr: progress
                                  └─► stdout: tokens per request and tokens/s (or one JSON object)

The seed draws both the prompts and the model weights, so one seed names one run; TP=1,
TP=2 and PP=2 print the same tokens for it.  torch is imported only inside ``run``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

WORKER = "executor.model.worker:ModelWorker"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    parser.add_argument("--requests", type=int, default=8, help="number of requests (8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (32)")
    parser.add_argument("--prompt-len", type=int, default=16, help="longest prompt (16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts and weights (0)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="keep two batches in flight even without pipeline parallelism")
    parser.add_argument("--step-timeout", type=float, default=60.0,
                        help="seconds one step may take before the run fails (60)")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON object on stdout")


def make_prompts(seed: int, count: int, max_len: int, vocab_size: int) -> dict[str, list[int]]:
    """``count`` prompts of 1..max_len random token ids, drawn from ``seed``."""
    rng = random.Random(seed)
    return {f"req-{i}": [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_len))]
            for i in range(count)}


def run(args: argparse.Namespace) -> int:
    from executor.model.config import ModelConfig

    prompts = make_prompts(args.seed, args.requests, args.prompt_len,
                           ModelConfig().vocab_size)
    try:
        report = _generate(args, prompts)
    except Exception as exc:  # noqa: BLE001  (any failure ends the demo as one clear report)
        return _report_failure(args, exc)
    _print_report(args, report)
    return 0


def _generate(args: argparse.Namespace, prompts: dict[str, list[int]]) -> dict[str, Any]:
    # Imported here first so that workers started by fork inherit torch instead of each
    # importing it again (start-up 0.1 s instead of 2 s on two cores).
    import torch  # noqa: F401

    from executor import ExecutorConfig, MultiprocExecutor
    from faultlab.engine import LLMEngine

    cfg = ExecutorConfig(worker=WORKER, tensor_parallel_size=args.tp,
                         pipeline_parallel_size=args.pp, worker_kwargs={"seed": args.seed},
                         async_scheduling=args.async_scheduling)
    started = time.perf_counter()
    with MultiprocExecutor(cfg) as executor:
        startup_s = time.perf_counter() - started
        _progress_line(f"{cfg.tensor_parallel_size * cfg.pipeline_parallel_size} workers "
                       f"ready in {startup_s:.2f}s")
        engine = LLMEngine(executor, step_timeout=args.step_timeout)
        outputs = engine.generate(prompts, args.max_tokens, progress=_Progress())
        stats = engine.stats
    return {"outputs": outputs, "tokens_per_s": stats.tokens_per_s,
            "generated_tokens": stats.generated_tokens, "steps": stats.steps,
            "elapsed_s": stats.elapsed_s, "startup_s": startup_s, "prompts": prompts,
            "tp": args.tp, "pp": args.pp, "seed": args.seed,
            "async_scheduling": args.async_scheduling,
            "max_concurrent_batches": executor.max_concurrent_batches}


class _Progress:
    """Prints progress on stderr at most a few times a second."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, stats: Any) -> None:
        now = time.perf_counter()
        done = stats.finished_requests == stats.total_requests
        if now - self.last < 0.25 and not done:
            return
        self.last = now
        _progress_line(f"step {stats.steps}: {stats.finished_requests}/{stats.total_requests} "
                       f"requests, {stats.generated_tokens} tokens, "
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
    print(f"tp={args.tp} pp={args.pp}: {report['generated_tokens']} tokens in "
          f"{report['elapsed_s']:.2f}s = {report['tokens_per_s']:.1f} tokens/s "
          f"({report['steps']} steps; start-up {report['startup_s']:.2f}s)")


def _report_failure(args: argparse.Namespace, exc: Exception) -> int:
    message = f"{type(exc).__name__}: {exc}"
    print(f"faultlab demo: failed: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"error": message, "outputs": {}, "tokens_per_s": 0.0,
                          "tp": args.tp, "pp": args.pp, "seed": args.seed}))
    return 1
