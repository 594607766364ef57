"""Which traces of a recorded run failed, and how to find them in Jaeger (demo, chaos run).

    run dir ──► telemetry.assemble.read_run (told) ──► failure_marks.failed_rpcs
            ──► failed_traces(): FailedTrace(trace_id, where, error, story) per failed RPC
            ──► describe(): "trace <id>  <step> > <rpc>  <error>: <story>" + how to look

A run with many failed calls (fail-stop: every later call fails too) lists the first few
and says how many more; a run without a journal, or without a failed RPC, gives no lines.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

SHOWN = 5  # failed RPCs listed per run


@dataclasses.dataclass(frozen=True)
class FailedTrace:
    trace_id: str  # 32 hex digits, as Jaeger shows it
    where: str  # e.g. "engine.step (failed) > rpc execute_model"
    error: str  # the error type
    story: str  # the RPC's faultlab.failure sentence ("" when no fault was told on it)


def failed_traces(run_dir: str | Path) -> list[FailedTrace]:
    """Every failed RPC of the run in ``run_dir``, in time order (none without a journal)."""
    from telemetry.assemble import read_run
    from telemetry.failure_marks import FAILURE, failed_rpcs
    from telemetry.naming import display_name, error_type

    run = Path(run_dir)
    if not run.is_dir():
        return []
    spans = read_run(run)
    by_id = {s.span_id: s for s in spans}
    found = []
    for rpc in failed_rpcs(spans):
        parent = by_id.get(rpc.parent_span_id)
        where = f"{display_name(parent)} > {rpc.name}" if parent is not None else rpc.name
        found.append(FailedTrace(f"{rpc.trace_id:032x}", where, error_type(rpc),
                                 str(rpc.attributes.get(FAILURE, ""))))
    return found


def describe(failed: list[FailedTrace], run_dir: str | Path, shown: int = SHOWN,
             how: bool = True) -> list[str]:
    """Lines naming each failed RPC's trace id, then (``how``) how to find one in Jaeger."""
    if not failed:
        return []
    lines = [f"failed RPCs ({len(failed)}), by Jaeger trace id:"]
    for f in failed[:shown]:
        lines.append(f"  trace {f.trace_id}  {f.where}  {f.error}"
                     + (f": {f.story}" if f.story else ""))
    if len(failed) > shown:
        lines.append(f"  ... and {len(failed) - shown} more")
    if how:
        lines.append(f"  {how_to_find(run_dir)}")
    return lines


def how_to_find(run_dir: str | Path) -> str:
    return (f"find one in Jaeger: `faultlab trace export {run_dir} --out runs/trace.json`, "
            "then Search > Upload JSON (the list shows each id's first 7 digits); or "
            f"`faultlab trace send {run_dir}` and paste the id into 'Lookup by Trace ID'")
