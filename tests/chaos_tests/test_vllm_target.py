"""The vllm target's driver, run directly (no observer): the real vLLM engine, CPU build,
tensor_parallel_size=2, multi-process executor.

    test ──Popen(TARGET.launch(spec))──► vllm_driver.py ─► EngineCore ─► Worker_TP0, Worker_TP1
         ◄── JSON lines (ready, invoke/ok/fail, error, done) ──┘
    afterwards: SIGKILL every process the driver reported, check none is alive, and remove
    the /dev/shm and /tmp files the run created (vLLM leaves some even when it ends well)

Skipped unless the vLLM venv is installed (scripts/install_vllm_target.sh).  Each engine
start takes 0.5-2 minutes on two shared cores, so the fault-free test runs its two engines
side by side and the fault test reuses one engine for its one fault.  The fault-free test's
first engine also exports its OpenTelemetry spans to faultlab's loopback OTLP receiver
(telemetry.otlp_receiver), as the observer sets it up: one llm_request per request.
"""

from __future__ import annotations

import glob
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from chaos.targets.base import WorkloadSpec
from chaos.targets.protocol import parse
from chaos.targets.run import otlp_env
from chaos.targets.vllm_driver import BATCH
from chaos.targets.vllm_target import TARGET
from telemetry.otlp_receiver import OtlpReceiver

_MISSING = TARGET.unavailable()
pytestmark = [
    pytest.mark.skipif(_MISSING is not None, reason=f"vllm target: {_MISSING}"),
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

READY_BOUND_S = TARGET.start_timeout_s
ERROR_BOUND_S = 30.0  # measured: 0.2-0.9 s after SIGKILL of rank 1
EXIT_BOUND_S = 90.0
LEFTOVER_GLOBS = ("/dev/shm/psm_*", "/dev/shm/vllm_dist_*", "/tmp/vllm_dist_*")
DIST_ID = re.compile(r"vllm_dist_([0-9a-f]{32})")  # the rendezvous id in the workers' log


class DriverRun:
    """One driver subprocess and the events it reported, read by a thread."""

    def __init__(self, spec: WorkloadSpec, out_dir: Path, env: dict[str, str] | None = None) -> None:
        launch = TARGET.launch(spec, str(out_dir))
        self._stderr = open(out_dir / "driver.stderr", "w")  # noqa: SIM115 - closed in reap()
        self.proc = subprocess.Popen(launch.argv, env={**launch.env, **(env or {})}, cwd=launch.cwd,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.events: list[dict[str, Any]] = []
        self._new: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.pids: set[int] = {self.proc.pid}
        self.held: set[str] = set()  # /dev/shm files the tree mapped
        self.ended = False  # the driver's stdout reached EOF
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            event = parse(line)
            if event is not None:
                event["seen"] = time.monotonic()
                self._new.put(event)
        self._new.put(None)

    def wait_for(self, ev: str, bound_s: float) -> dict[str, Any]:
        """The first event ``ev`` (earlier ones are kept); fails after ``bound_s`` or when
        the driver's stdout ended without it."""
        deadline = time.monotonic() + bound_s
        while (found := next((e for e in self.events if e["ev"] == ev), None)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or self.ended:
                why = "driver ended" if self.ended else f"not within {bound_s} s"
                raise AssertionError(f"no {ev!r} ({why}): {self.describe()}")
            self._take(left)
        return found

    def _take(self, timeout_s: float) -> None:
        try:
            event = self._new.get(timeout=timeout_s)
        except queue.Empty:
            return
        if event is None:
            self.ended = True
            return
        self.events.append(event)
        if event["ev"] == "ready":
            self.pids |= {p["pid"] for p in event["procs"]}
            self.scan()

    def pid_of(self, role: str, rank: int | None = None) -> int:
        ready = self.wait_for("ready", 0)
        return next(p["pid"] for p in ready["procs"] if p["role"] == role and p["rank"] == rank)

    def values(self) -> dict[int, Any]:
        return {e["id"]: e["value"] for e in self.events if e["ev"] == "ok"}

    def scan(self) -> None:
        """Note the /dev/shm files the tree maps now (vLLM's psm_* broadcast queues)."""
        for pid in self.pids | descendants(self.proc.pid):
            try:
                maps = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                continue
            self.held |= {line.split()[-1] for line in maps.splitlines() if " /dev/shm/" in line}

    def owned(self, paths: set[str]) -> set[str]:
        """Of ``paths``, those this run made: mapped by its tree or named by its rendezvous
        id (other programs on the machine may be running vLLM too)."""
        ids = set(DIST_ID.findall(Path(self._stderr.name).read_text()))
        return {p for p in paths if p in self.held or any(i in p for i in ids)}

    def describe(self) -> str:
        tail = (Path(self._stderr.name).read_text()[-1500:]).replace("\n", " | ")
        return f"events {[e['ev'] for e in self.events]}; stderr tail: {tail}"

    def reap(self) -> list[str]:
        """SIGKILL the whole tree (reported pids and any descendant); what is still alive."""
        self.scan()
        for pid in self.pids | descendants(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)  # EOF once no process holds the pipe
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._stderr.close()
        return alive(self.pids, bound_s=10.0)


def descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def alive(pids: set[int], bound_s: float) -> list[str]:
    """The pids still running (zombies count as gone) after waiting up to ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while True:
        left = []
        for pid in sorted(pids):
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid} {' '.join(proc.cmdline())[:60]!r}")
            except psutil.Error:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def temp_files() -> set[str]:
    return {path for pattern in LEFTOVER_GLOBS for path in glob.glob(pattern)}


@pytest.fixture
def driver_runs(tmp_path: Path) -> Iterator[list[DriverRun]]:
    """Started drivers; each is killed with its tree afterwards and must leave no process.
    The temp files the runs made are removed (vLLM leaves some; the observer reports them)."""
    runs: list[DriverRun] = []
    before = temp_files()
    yield runs
    survivors = [pid for run in runs for pid in run.reap()]
    new = temp_files() - before
    for path in {path for run in runs for path in run.owned(new)}:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    assert not survivors, f"processes alive after SIGKILL of the tree: {survivors}"


def start(runs: list[DriverRun], tmp_path: Path, name: str, spec: WorkloadSpec,
          env: dict[str, str] | None = None) -> DriverRun:
    out_dir = tmp_path / name
    out_dir.mkdir()
    run = DriverRun(spec, out_dir, env)
    runs.append(run)
    return run


def test_fault_free_runs_report_the_tree_and_generate_the_same_tokens(
    driver_runs: list[DriverRun], tmp_path: Path
) -> None:
    spec = WorkloadSpec(calls=3, tokens=32, ranks=2, seed=7)
    with OtlpReceiver() as receiver:
        first = start(driver_runs, tmp_path, "a", spec, otlp_env(receiver.endpoint))
        second = start(driver_runs, tmp_path, "b", spec)
        _check_fault_free(first, second, spec)
    # vLLM's own spans, as the observer receives them: an llm_request per request of the
    # workload (and one for the warm-up), sent by the driver process, flushed at its exit.
    requests = [s for s in receiver.spans() if s.name == "llm_request"]
    workload = [s for s in requests if s.attributes.get("gen_ai.usage.completion_tokens") == spec.tokens]
    assert len(workload) == spec.calls * BATCH, [s.attributes for s in requests]
    assert {s.resource.get("vllm.process_id") for s in requests} == {str(first.proc.pid)}
    assert receiver.rejected == []


def _check_fault_free(first: DriverRun, second: DriverRun, spec: WorkloadSpec) -> None:
    for run in (first, second):
        ready = run.wait_for("ready", READY_BOUND_S)
        roles = {(p["role"], p["rank"]) for p in ready["procs"]}
        assert {("driver", None), ("engine_core", None), ("worker", 0), ("worker", 1)} <= roles
        done = run.wait_for("done", 120)
        assert done["ok"] and done["tokens"] == spec.calls * BATCH * spec.tokens
        assert not [e for e in run.events if e["ev"] in ("fail", "error")]
        assert run.proc.wait(timeout=EXIT_BOUND_S) == 0
    values = first.values()
    assert sorted(values) == [0, 1, 2]  # one call per batch of BATCH requests
    assert all(len(tokens) == spec.tokens for batch in values.values() for tokens in batch)
    assert values == second.values()


def test_sigkill_of_worker_rank_1_reaches_the_caller_as_an_error(
    driver_runs: list[DriverRun], tmp_path: Path
) -> None:
    run = start(driver_runs, tmp_path, "kill", WorkloadSpec(calls=4, tokens=480, seed=1))
    run.wait_for("ready", READY_BOUND_S)
    run.wait_for("invoke", 30)
    time.sleep(0.5)  # mid-call: the workers are generating
    killed = time.monotonic()
    os.kill(run.pid_of("worker", 1), signal.SIGKILL)
    error = run.wait_for("error", ERROR_BOUND_S)
    assert error["seen"] - killed < ERROR_BOUND_S
    assert [e for e in run.events if e["ev"] == "fail"], "the running call did not fail"
    run.wait_for("done", 30)
    assert run.proc.wait(timeout=EXIT_BOUND_S) != 0
