"""Check the trace of chaos target runs, as `faultlab trace export` gives it (CI, by hand).

    python scripts/check_target_trace.py RUN_DIR... [--expect-span NAME]...

Each RUN_DIR (DIR/TARGET/SCENARIO/seed-N of `faultlab chaos compare`) must export to one
Jaeger trace holding: the run's root (target.run ...), a span per call its record.json
names, the chaos.fault point when a fault fired, faultlab.detection when the caller saw an
error after it, a target.exit per process, and each --expect-span NAME (a target's own span,
e.g. vLLM's llm_request).  One line per run dir; exit 1 if any check fails.  It reads the
runs written by a comparison that already ran: no target is started here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chaos.targets import oracles
from chaos.targets.run import TargetRecord
from telemetry.exports import render


def problems(run_dir: Path, expected: list[str]) -> list[str]:
    record = TargetRecord.from_json(json.loads((run_dir / "record.json").read_text()))
    traces = render(run_dir, "jaeger")["data"]
    if len(traces) != 1:
        return [f"{len(traces)} traces, not one"]
    names = [str(s["operationName"]) for s in traces[0]["spans"]]
    count = {n: names.count(n) for n in set(names)}

    def has(prefix: str) -> int:
        return sum(v for n, v in count.items() if n.startswith(prefix))

    wanted: dict[str, int] = {"target.run ": 1, "target.call ": len(record.calls),
                              "target.exit": sum(bool(p.get("exit_ns")) for p in record.procs)}
    if record.fault_ns() is not None:
        wanted["chaos.fault"] = 1
    if oracles.detected(record):
        wanted["faultlab.detection"] = 1
    out = [f"{prefix.strip()}: {has(prefix)} span(s), expected {n}"
           for prefix, n in wanted.items() if has(prefix) < n]
    return out + [f"no {name} span" for name in expected if not count.get(name)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--expect-span", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    failed = 0
    for run_dir in args.run_dirs:
        try:
            found = problems(run_dir, args.expect_span)
        except (OSError, ValueError, KeyError) as exc:
            found = [f"cannot read: {type(exc).__name__}: {exc}"]
        failed += bool(found)
        print(f"{'FAIL' if found else 'ok  '} {run_dir}" + "".join(f"\n     {p}" for p in found))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
