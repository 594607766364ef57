"""The run's control directory: how the chaos side, the driver and the workers agree.

    ctl/plan.json           the resolved plan (every process reads it)
    ctl/arm-<i>-<msg_id>    fault i must fire on request msg_id (written by the driver before
                            the request is pickled, so a worker always sees it in time);
                            holds {"call": n, "method": m}
    ctl/arm-<i>-any         fault i fires at its next chance (a time trigger came due)
    ctl/faults-<pid>.jsonl  one line per injected fault, written *before* the fault acts, so
                            a process that kills itself still leaves its line

Only chaos and failpoint actions touch these files; the executor never sees them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import telemetry
from chaos.faults import KINDS, signal_name
from chaos.plan import ResolvedFault

ENV_VAR = "FAULTLAB_CHAOS_CTL"  # the control directory, inherited by workers


class ControlDir:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def write_plan(self, resolved: list[ResolvedFault], seed: int) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        data = {"seed": seed, "faults": [r.to_dict() for r in resolved]}
        _atomic_write(self.path / "plan.json", json.dumps(data))

    def read_plan(self) -> list[ResolvedFault]:
        data = json.loads((self.path / "plan.json").read_text())
        return [ResolvedFault.from_dict(r) for r in data["faults"]]

    def arm(self, index: int, msg_id: int | None, info: dict[str, Any]) -> None:
        _atomic_write(self._arm_path(index, msg_id), json.dumps(info))

    def armed(self, index: int, msg_id: int | None) -> dict[str, Any] | None:
        try:
            armed: dict[str, Any] = json.loads(self._arm_path(index, msg_id).read_text() or "{}")
            return armed
        except (FileNotFoundError, ValueError):
            return None

    def _arm_path(self, index: int, msg_id: int | None) -> Path:
        return self.path / f"arm-{index}-{'any' if msg_id is None else msg_id}"

    def log_fault(self, record: dict[str, Any]) -> None:
        """Append one fault record (and a ``chaos.fault`` trace event) before it acts."""
        record = {"time_ns": time.time_ns(), "by_pid": os.getpid(), **record}
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path / f"faults-{os.getpid()}.jsonl",
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        trace_fault(record, self._seed())

    def _seed(self) -> int | None:
        try:
            return int(json.loads((self.path / "plan.json").read_text())["seed"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def timeline(self) -> list[dict[str, Any]]:
        """Every fault record of every process, in time order."""
        records = []
        for path in sorted(self.path.glob("faults-*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    records.append(json.loads(line))
        return sorted(records, key=lambda r: r["time_ns"])




def trace_fault(record: dict[str, Any], seed: int | None) -> None:
    """The fault as a ``chaos.fault`` point span (kind, victim, signal or mode, phase, seed);
    ``telemetry.story`` tells it into the trace of every RPC it affected."""
    rec = telemetry.get_recorder()
    if not rec.enabled:
        return
    attrs = {f"chaos.{k}": v for k, v in record.items()
             if isinstance(v, (str, int, float, bool)) and k not in ("rank", "pid")}
    if seed is not None:
        attrs["chaos.seed"] = seed
    kind = str(record.get("kind"))
    signal = signal_name(kind) if kind in KINDS else None
    by_signal = record.get("phase") == "signal" or record.get("kind") != "hang_worker"
    if signal is not None and by_signal and "chaos.mode" not in attrs:
        attrs["chaos.signal"] = signal
    attrs["faultlab.rank"] = int(record.get("rank", -1))
    attrs["process.pid"] = int(record.get("pid") or 0)
    rec.event("chaos.fault", attrs)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
