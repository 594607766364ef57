"""What a worker fault costs under ``fail_stop`` and ``restart`` (a benchmark, not a test).

    N seeded scenarios per policy: TP=2 (fork), 4 requests x 24 tokens, SIGKILL to a seeded
    rank after a seeded step (chaos.recovery) ─► per scenario: fault to first new token,
    tokens recomputed, requests lost, tokens equal to the fault-free run's, tokens/s of the
    fault-free run on the same executor (baseline), from the fault to the first new token
    (during) and from there to the end (after); the table gives their medians
    ─► a table on stdout and the "Recovery" section of bench/RESULTS.md (--write)

    python bench/bench_recovery.py [--n 100] [--write]
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch  # noqa: F401  (before any fork)

sys.path.insert(0, str(Path(__file__).parent))
from _stats import markdown_table, percentile, write_section

from chaos.recovery import RecoveryScenario, run_recovery

RESULTS = Path(__file__).with_name("RESULTS.md")


def scenarios(policy: str, n: int) -> list[tuple[RecoveryScenario, int]]:
    rng = random.Random(13)
    return [(RecoveryScenario(name=f"{policy}-{i}", fault="kill", rank=rng.randrange(2),
                              steps=(2, 20), policy=policy, max_tokens=24), i) for i in range(n)]


def measure(policy: str, n: int, out: Path) -> dict[str, float]:
    results = [run_recovery(s, seed, out / s.name) for s, seed in scenarios(policy, n)]
    latencies = [r.detection_latency_s for r in results if r.detection_latency_s is not None]
    return {
        "n": n, "ok": sum(r.ok for r in results), "recovered": sum(r.recovered for r in results),
        "p50_ms": percentile(latencies, 50) * 1e3 if latencies else float("nan"),
        "p99_ms": percentile(latencies, 99) * 1e3 if latencies else float("nan"),
        "recomputed": statistics.mean(r.tokens_recomputed for r in results),
        "lost": sum(r.requests_lost for r in results), "requests": 4 * n,
        "baseline": _median([r.baseline_tokens_per_s for r in results]),
        "during": _median([r.during_tokens_per_s for r in results]),
        "after": _median([r.after_tokens_per_s for r in results]),
    }


def _median(rates: list[float | None]) -> float:
    known = [x for x in rates if x is not None]
    return statistics.median(known) if known else float("nan")


def _rate(x: float) -> str:
    return "—" if x != x else f"{x:.0f}"  # NaN: no such window (fail_stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.ERROR)  # every scenario logs its fault on purpose
    with tempfile.TemporaryDirectory() as tmp:
        rows = {p: measure(p, args.n, Path(tmp)) for p in ("fail_stop", "restart")}
    header = ["policy", "scenarios ok", "recovered", "fault → first token p50 / p99",
              "tokens recomputed (mean)", "requests lost",
              "tok/s baseline / during / after (median)"]
    body = markdown_table(header, [
        [p, f"{r['ok']}/{r['n']}", f"{r['recovered']}/{r['n']}",
         "—" if p == "fail_stop" else f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ms",
         f"{r['recomputed']:.1f}", f"{r['lost']}/{r['requests']}",
         " / ".join(_rate(r[k]) for k in ("baseline", "during", "after"))]
        for p, r in rows.items()])
    print(body)
    if args.write:
        write_section(RESULTS, "Recovery", NOTE.format(n=args.n) + "\n\n" + body + "\n")


NOTE = """`python bench/bench_recovery.py --n {n} --write`: TP=2 (fork), 4 requests x 24 tokens,
SIGKILL to a seeded rank after a seeded step (2..20); each scenario is judged by the chaos
recovery oracles (every request finished, tokens equal the fault-free run's, nothing of the
old incarnation left).  "Fault → first token" runs from the signal to the first new token
after the restart: detection, stopping the old incarnation, starting the new one (fork,
torch.distributed rendezvous) and replaying every request's steps to rebuild its KV cache.
Under fail_stop every request in flight is lost; under restart none is, and the tokens are
identical (the rebuild replays the original steps, so it computes the same numbers).
Throughput counts new tokens only (replayed ones are not): "baseline" is a fault-free run on
the same executor just before the faulted one, "during" runs from the fault to the first
new token after recovery (the tokens of the step that brings it count), "after" from there
to the end; medians over the scenarios."""


if __name__ == "__main__":
    main()
