"""The vLLM target's driver: the real vLLM engine (CPU build, tensor parallel, multi-process
executor) running a seeded workload, reported in the driver protocol.

    faultlab observer ──argv/env──► this script, run by .venv-vllm's python
                                      │ writes OUT/model/config.json (a tiny Llama, no weights)
                                      │ LLM(load_format="dummy", tensor_parallel_size=ranks,
                                      │     distributed_executor_backend="mp")
                                      ▼
    driver (role driver) ──zmq──► VLLM::EngineCore (engine_core) ──shm broadcast (psm_*)──►
                                      VLLM::Worker_TP0 (worker 0), VLLM::Worker_TP1 (worker 1)
                                      (+ multiprocessing resource trackers: helper)
    stdout: ready {procs} → per batch invoke/ok (token ids) or fail → error (once) → done
            → linger_s idle → shutdown → exit

It runs in vLLM's own venv, which lacks faultlab's dependencies (chaos/__init__ imports the
executor), so it loads chaos/targets/protocol.py by file path and imports nothing else of
faultlab.  Everything vLLM or its children print goes to stderr: the driver moves its own
stdout to a private descriptor for the protocol, so a log line can never split an event and
an orphaned worker never holds the observer's event pipe open.

    python vllm_driver.py --out-dir DIR --spec '{"calls": 16, "tokens": 64, ...}'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

# Requests per call: each llm.generate of one batch is one call of the protocol.
BATCH = 4
VOCAB = 1000
PROMPT_LEN = (8, 24)
ENGINE_TITLE = re.compile(r"::EngineCore")
WORKER_TITLE = re.compile(r"::Worker\S*?_TP(\d+)")
DEFAULT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def omp_binding(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: this process's CPUs split into ``ranks`` groups, one per
    worker ("0|1" on two cores; a CPU is shared when there are fewer CPUs than ranks).
    vLLM's "auto" binds by NUMA node (one here, so it fails for two ranks); a single list
    such as "all" fails its per-rank check."""
    cpus = sorted(os.sched_getaffinity(0))
    groups = [cpus[r::ranks] or [cpus[r % len(cpus)]] for r in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)


def load_protocol() -> Any:
    """chaos/targets/protocol.py, by path (this venv cannot import the chaos package)."""
    path = Path(__file__).with_name("protocol.py")
    spec = importlib.util.spec_from_file_location("faultlab_driver_protocol", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def private_stdout() -> IO[str]:
    """The protocol's stream: a copy of fd 1; fd 1 itself becomes stderr for everyone else."""
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", buffering=1)  # os.dup: not inherited by children
    os.dup2(2, 1)
    return events


def write_model(out_dir: Path) -> Path:
    """A tiny LlamaForCausalLM: head_dim 32 (the CPU attention backend supports it), KV heads
    divisible by the tensor-parallel size; no weights (load_format="dummy")."""
    model_dir = out_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": VOCAB,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    return model_dir


def build_llm(model_dir: Path, ranks: int, max_len: int) -> Any:
    from vllm import LLM

    return LLM(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
        enforce_eager=True, dtype="float32", max_model_len=max_len,
        tensor_parallel_size=ranks, distributed_executor_backend="mp",
        # With OTLP tracing on, vLLM asserts on the first finished request unless stats are on.
        disable_log_stats=False, seed=0,
        # The observer's loopback receiver (http/protobuf, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
        # set beside it): vLLM's llm_request spans join the run's trace.
        otlp_traces_endpoint=os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None,
    )


def model_len(tokens: int) -> int:
    """max_model_len: room for the longest prompt and ``tokens``, at least 512."""
    need = PROMPT_LEN[1] + tokens
    return max(512, -(-need // 256) * 256)


def role_of(title: str) -> tuple[str, int | None]:
    if ENGINE_TITLE.search(title):
        return "engine_core", None
    match = WORKER_TITLE.search(title)
    if match:
        return "worker", int(match.group(1))
    return "helper", None


def process_tree() -> list[dict[str, Any]]:
    """The driver and its descendants by role and rank (titles set by vLLM's setproctitle;
    /proc's comm is cut to 15 characters, so the cmdline is read)."""
    import psutil

    me = psutil.Process()
    procs: list[dict[str, Any]] = [{"role": "driver", "rank": None, "pid": me.pid}]
    for child in me.children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        role, rank = role_of(title)
        procs.append({"role": role, "rank": rank, "pid": child.pid})
    return procs


def wait_for_tree(ranks: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The tree once the engine core and every worker rank are seen (titles are set a moment
    after a spawned child starts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        procs = process_tree()
        seen = {p["rank"] for p in procs if p["role"] == "worker"}
        has_core = any(p["role"] == "engine_core" for p in procs)
        if (has_core and seen >= set(range(ranks))) or time.monotonic() > deadline:
            return procs
        time.sleep(0.2)


def prompts(spec: dict[str, Any]) -> list[list[int]]:
    """``calls`` x BATCH seeded token-id prompts (ids 3..VOCAB-1: clear of bos/eos): one
    batch per call, so a spec's ``calls`` are its protocol calls, as on every target (a
    fault ``after_invoke = k`` then comes on vLLM too)."""
    out = []
    for i in range(int(spec["calls"]) * BATCH):
        rng = random.Random(f"{spec['seed']}:{i}")
        length = rng.randint(*PROMPT_LEN)
        out.append([rng.randrange(3, VOCAB) for _ in range(length)])
    return out


def warm_up(llm: Any) -> None:
    """One short request before ``ready``: the first forward pass takes seconds (lazy kernel
    set-up), which would otherwise land inside the first call of the workload."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=[3, 4, 5, 6])],
                 SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)


def run_workload(llm: Any, spec: dict[str, Any], reporter: Any) -> dict[str, Any]:
    """Batches of BATCH requests, one protocol call each; stops at the first failure (the
    engine is dead: every later call would fail the same way)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=int(spec["tokens"]), ignore_eos=True)
    all_prompts = prompts(spec)
    started, generated = time.monotonic(), 0
    for call_id, first in enumerate(range(0, len(all_prompts), BATCH)):
        batch = all_prompts[first:first + BATCH]
        reporter.invoke(call_id, f"generate {len(batch)} requests x {spec['tokens']} tokens")
        try:
            outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch],
                                   params, use_tqdm=False)
        except Exception as exc:  # noqa: BLE001 - EngineDeadError or whatever vLLM raises
            reporter.fail(call_id, exc)
            reporter.error(exc)
            return {"ok": False, "tokens": generated}
        values = [list(out.outputs[0].token_ids) for out in outputs]
        generated += sum(len(v) for v in values)
        reporter.ok(call_id, values)
    elapsed = time.monotonic() - started
    return {"ok": True, "tokens": generated, "tok_per_s": round(generated / elapsed, 1)}


def start_engine(out_dir: Path, spec: dict[str, Any], reporter: Any) -> Any | None:
    """The engine, warmed up, with ``ready`` reported; None (``error``, ``done``) when vLLM
    fails to start."""
    ranks, started = int(spec["ranks"]), time.monotonic()
    try:
        llm = build_llm(write_model(out_dir), ranks, model_len(int(spec["tokens"])))
        built = time.monotonic()
        warm_up(llm)
    except Exception as exc:  # noqa: BLE001 - start-up failed: the caller saw it
        reporter.error(exc)
        reporter.done(ok=False, started=False)
        return None
    reporter.ready(wait_for_tree(ranks), startup_s=round(built - started, 1),
                   warmup_s=round(time.monotonic() - built, 1))
    return llm


def stop(llm: Any, code: int, bound_s: float = 60.0) -> int:
    """vLLM's own shutdown (SIGTERM to the engine core, a grace, then SIGKILL); a daemon
    timer exits hard if it or the interpreter's exit handlers hang on a dead engine."""
    timer = threading.Timer(bound_s, os._exit, (code,))
    timer.daemon = True
    timer.start()
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # noqa: BLE001 - reported on stderr, the exit goes on
        print(f"vllm_driver: shutdown raised {type(exc).__name__}: {exc}", file=sys.stderr)
    return code


def parse_args(argv: list[str] | None) -> tuple[Path, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--spec", required=True, help="WorkloadSpec.to_json() as JSON")
    args = parser.parse_args(argv)
    defaults = {"calls": 16, "ranks": 2, "tokens": 64, "seed": 0, "linger_s": 0.0}
    return args.out_dir, {**defaults, **json.loads(args.spec)}


def main(argv: list[str] | None = None) -> int:
    out_dir, spec = parse_args(argv)
    for key, value in DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", omp_binding(int(spec["ranks"])))
    reporter = load_protocol().Reporter(private_stdout())
    out_dir.mkdir(parents=True, exist_ok=True)
    llm = start_engine(out_dir, spec, reporter)
    if llm is None:
        return 1
    result = run_workload(llm, spec, reporter)
    reporter.done(**result)
    time.sleep(float(spec["linger_s"]))  # linger: kill_driver hits a driver with idle workers
    return stop(llm, 0 if result["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
