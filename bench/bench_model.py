"""Model benchmark: tokens/s of the engine per parallel layout, and where a step's time goes.

    python bench/bench_model.py            # full run (~1 min); writes the "## Model" section
                                           #   of bench/RESULTS.md
    python bench/bench_model.py --quick    # sanity run; prints only, unless --out

    engine ── collective_rpc ──► [pickle, enqueue] ──► worker [dequeue, unpickle]
                                                          execute_model   ◄── model time, timed
                                                                              in the output rank
    engine ◄── [dequeue, unpickle] ◄── [pickle, enqueue] ◄┘                   and sent back in
                                                                              ModelOutput
    executor time = round trip - model time   (per step, medians over decode steps)

Two cross-checks of the executor share: the same batch echoed through ``EchoWorker`` on the
same layout (the executor alone, no model), and pickling the batch and the output in this
process.  Layouts with batches in flight concurrently (PP=2, async) report tokens/s only:
their round trips include waiting behind the other batch.
"""

from __future__ import annotations

import argparse
import functools
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _stats import fmt_time, machine, markdown_table, text_table, write_section  # noqa: E402

LAYOUTS: dict[str, dict[str, Any]] = {
    "tp1": {"tp": 1, "pp": 1, "async_scheduling": False},
    "tp2": {"tp": 2, "pp": 1, "async_scheduling": False},
    "pp2": {"tp": 1, "pp": 2, "async_scheduling": False},
    "tp1-async": {"tp": 1, "pp": 1, "async_scheduling": True},
    # What the one-thread default buys (besides batch-independent tokens) on a small machine.
    "tp1-2threads": {"tp": 1, "pp": 1, "async_scheduling": False, "torch_threads": 2},
}


def executor_config(worker: str, layout: dict[str, Any]) -> Any:
    from executor import ExecutorConfig

    return ExecutorConfig(worker=worker, tensor_parallel_size=layout["tp"],
                          pipeline_parallel_size=layout["pp"],
                          async_scheduling=layout["async_scheduling"],
                          worker_kwargs={"seed": 0, "torch_threads": layout.get("torch_threads", 1)})


def run_engine(layout: dict[str, Any], prompts: dict[str, list[int]],
               tokens: int) -> dict[str, Any]:
    """One generation run; its tokens/s and per-step round trips and model times."""
    from executor import MultiprocExecutor
    from executor.model.engine import LLMEngine

    with MultiprocExecutor(executor_config("executor.model.worker:ModelWorker", layout)) as ex:
        engine = LLMEngine(ex, step_timeout=60)
        started = time.perf_counter()
        engine.generate(prompts, tokens)
        elapsed = time.perf_counter() - started
    stats = engine.stats
    return {"tokens_per_s": stats.generated_tokens / elapsed,
            # step 0 of a request is its prefill; the rest are single-token decode steps
            "round_trip_s": stats.round_trip_s[1:], "model_s": stats.model_s[1:]}


def median_step(runs: list[dict[str, Any]]) -> dict[str, float]:
    trips = [t for r in runs for t in r["round_trip_s"]]
    models = [m for r in runs for m in r["model_s"]]
    overheads = [t - m for t, m in zip(trips, models, strict=True)]
    return {"round_trip": statistics.median(trips), "model": statistics.median(models),
            "executor": statistics.median(overheads)}


def decode_batch(prompts: dict[str, list[int]]) -> Any:
    from executor.model.batch import ModelBatch

    ids = tuple(prompts)
    return ModelBatch(step_id=1, request_ids=ids, token_ids=tuple((7,) for _ in ids),
                      positions=tuple(len(p) for p in prompts.values()))


def executor_only(layout: dict[str, Any], batch: Any, step_s: float,
                  calls: int) -> dict[str, float]:
    """The executor without a model, on the same layout: the batch echoed back, and the
    overhead of a call that sleeps as long as a model step (replies to long calls are
    picked up later once the driver's wait has backed off from spinning to sleeping)."""
    from executor import MultiprocExecutor

    with MultiprocExecutor(executor_config("executor.workers:EchoWorker", layout)) as ex:
        def call(method: str, arg: Any) -> Any:
            return ex.collective_rpc(method, args=(arg,), unique_reply_rank=ex.output_rank)

        for _ in range(20):
            call("echo", batch)
        echo = _median_time(lambda: call("echo", batch), calls)
        slept = _median_time(lambda: call("sleep", step_s), max(20, calls // 10))
    return {"echo": echo, "sleep_overhead": slept - step_s}


def _median_time(fn: Callable[[], Any], calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def pickling_costs(batch: Any) -> dict[str, float]:
    """dumps + loads of a decode batch and of its output, in this process."""
    from executor.model.batch import ModelOutput

    output = ModelOutput(1, batch.request_ids, tuple(range(len(batch.request_ids))), 0.001)
    costs: dict[str, float] = {}
    for name, obj in (("batch", batch), ("output", output)):
        costs[name] = _median_time(functools.partial(_round_trip_pickle, obj), 2000)
        costs[f"{name}_bytes"] = len(pickle.dumps(obj, protocol=5))
    return costs


def _round_trip_pickle(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol=5))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401  (before any fork: workers inherit it)

    from executor.model.prompts import make_prompts

    prompts = make_prompts(seed=0, count=args.requests, max_len=16, vocab_size=512)
    batch = decode_batch(prompts)
    results: dict[str, Any] = {"layouts": {}, "pickling": pickling_costs(batch)}
    runs = _interleaved_runs(args, prompts)
    for name in args.layouts:
        layout, step = LAYOUTS[name], median_step(runs[name])
        results["layouts"][name] = {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[name]),
            "step": step, "concurrent": layout["pp"] > 1 or layout["async_scheduling"],
            **executor_only(layout, batch, step["model"], args.echo_calls)}
    return results


def _interleaved_runs(args: argparse.Namespace,
                      prompts: dict[str, list[int]]) -> dict[str, list[dict[str, Any]]]:
    """Round-robin over layouts, so that load from other processes hits every layout alike."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.layouts}
    for repeat in range(args.repeats):
        _log(f"round {repeat + 1}/{args.repeats}: {', '.join(args.layouts)}")
        for name in args.layouts:
            runs[name].append(run_engine(LAYOUTS[name], prompts, args.tokens))
    return runs


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for name, r in results["layouts"].items():
        step = r["step"]
        share = step["executor"] / step["round_trip"]
        timing = (["(overlapped)"] * 4 if r["concurrent"] else
                  [fmt_time(step["round_trip"]), fmt_time(step["model"]),
                   fmt_time(step["executor"]), f"{share:.0%}"])
        out.append([name, f"{r['tokens_per_s']:.0f}", *timing, fmt_time(r["echo"]),
                    fmt_time(r["sleep_overhead"])])
    return out


HEADER = ["layout", "tokens/s", "step round trip", "model (in worker)", "executor",
          "executor share", "echo of the batch", "overhead of a step-long sleep"]


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    p = results["pickling"]
    info = machine()
    lines = [
        f"`python bench/bench_model.py` — {args.requests} requests x {args.tokens} new tokens, "
        f"median of {args.repeats} runs; model: vocab 512, hidden 128, 4 layers, 4 heads, "
        f"float32, 1 torch thread per worker unless named. Machine: {info['nproc']} cores, Python "
        f"{info['python']}, {info['date']}, load {info.get('loadavg', 'n/a')}.", "",
        markdown_table(HEADER, rows(results)), "",
        "Step times are medians over decode steps (one token per request). *executor* = "
        "round trip - model time reported by the output rank. Executor-only cross-checks on "
        "the same layout with EchoWorker: *echo* = round trip of the same batch; *step-long "
        "sleep* = round trip of `sleep(median model time)` minus the sleep.",
        f"Pickling in the driver (dumps+loads, median): batch {fmt_time(p['batch'])} "
        f"({p['batch_bytes']} B), output {fmt_time(p['output'])} ({p['output_bytes']} B).",
        "", *notes(results),
    ]
    return "\n".join(lines) + "\n"


def notes(results: dict[str, Any]) -> list[str]:
    """What the numbers say, computed from this run."""
    r, out = results["layouts"], []
    if "tp1" in r and "tp2" in r:
        out.append(
            f"- TP=2 gives {r['tp2']['tokens_per_s'] / r['tp1']['tokens_per_s']:.2f}x the "
            f"tokens/s of TP=1 here: the model's step time goes from "
            f"{fmt_time(r['tp1']['step']['model'])} to {fmt_time(r['tp2']['step']['model'])} "
            "because each step runs 8 all-reduces over gloo/TCP while two workers and the "
            "driver share two cores; this model is far too small for tensor parallelism to pay.")
    if "tp1" in r:
        t, p = r["tp1"], results["pickling"]
        out.append(
            f"- The executor's part of a TP=1 step ({fmt_time(t['step']['executor'])}) is close "
            f"to the overhead of a call that sleeps as long as the step "
            f"({fmt_time(t['sleep_overhead'])}) and well above the echo of the same batch "
            f"({fmt_time(t['echo'])}): it is mostly the latency of picking up a reply once the "
            f"driver's wait has backed off from spinning, not pickling "
            f"({fmt_time(p['batch'] + p['output'])} for batch and output together).")
    if "tp1" in r and "tp1-async" in r:
        out.append(
            f"- Async scheduling (two batches in flight, each with half the requests): "
            f"{r['tp1-async']['tokens_per_s']:.0f} tokens/s against "
            f"{r['tp1']['tokens_per_s']:.0f} in one batch: it overlaps the driver's work with "
            "the worker's but doubles the number of steps, each with its fixed cost."
            + (f" PP=2 (two stages and the driver on two cores): "
               f"{r['pp2']['tokens_per_s']:.0f} tokens/s." if "pp2" in r else ""))
    if "tp1" in r and "tp1-2threads" in r:
        out.append(
            f"- Two torch threads per worker: {r['tp1-2threads']['tokens_per_s']:.0f} tokens/s "
            f"against {r['tp1']['tokens_per_s']:.0f} with one. Two threads also make a "
            "token's logits depend on how many rows its batch has (so greedy tokens could "
            "change with batching), and OpenMP threads spin against the other processes on a "
            "loaded machine: hence the one-thread default.")
    return out


def _log(text: str) -> None:
    print(f"[bench_model] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sanity run; prints only")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--echo-calls", type=int, default=500)
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--out", default=None, help="markdown file for the Model section "
                        "(default bench/RESULTS.md on a full run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats, args.echo_calls = 16, 1, 100
    elif args.out is None:
        args.out = str(HERE / "RESULTS.md")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = measure(args)
    print(text_table(HEADER, rows(results)))
    if args.out:
        write_section(args.out, "Model", render(results, args))
        _log(f"wrote the Model section of {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
