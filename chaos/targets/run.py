"""TargetRun: start a target's driver, watch it from outside, apply one fault, record it all.

    TargetRun(target, scenario, seed, out).run() ──► TargetRecord (out/record.json)
      1. launch    the driver (Launch argv/env/cwd) in its own session and, where root may,
                   its own mount namespace with a private /dev/shm and /tmp
                   (chaos.targets.private_mounts), stdout a pipe of protocol events (read
                   with poll, never select), stderr to out/driver.log; the observer's thread
                   at SCHED_FIFO meanwhile (chaos.targets.observer_guard), so a CPU hog does
                   not make it read events late or fire a fault late
      2. ready     the process tree by role and rank (only the pids provably the run's: the
                   driver's descendants, its session, its namespace; any other a driver names
                   is recorded in ``disowned`` and never touched), plus its descendants
      3. observe   each event; each process's exit time; the fault at its seeded moment
                   (after ready, the k-th invoke, or ``done``); SIGCONT a stopped process
                   after the bound; a call in flight past the bound is a hang (snapshot of
                   every process's psutil status), and the driver is ended a bound later
      4. finish    the driver's end; a bound for the rest to go; what is still alive
                   (orphans, by role); leftovers: with a namespace, everything left in the
                   run's own /dev/shm and the files it made under /tmp that match the
                   target's temp_globs (exactly its own: another run's are never seen);
                   without one (``attribution`` says why), new /dev/shm names the tree held
                   and new files matching temp_globs (by name: another run's may be counted);
                   then every remaining process is SIGKILLed and the leftovers removed, so a
                   run leaves nothing behind
    A signal to the observer (SIGHUP of a closed terminal, SIGTERM, SIGINT, SIGQUIT) unwinds
    to step 4 at once: what it stopped is resumed, the whole tree SIGKILLed, the record says
    ``ended_by = "observer"``, then the signal ends the observer as it would have.
    A target that exports OpenTelemetry itself (``Target.otlp_traces``) is pointed at a
    loopback OTLP receiver for the run (telemetry.otlp_receiver); its spans are kept in
    ``target_spans`` for the run's trace (chaos.targets.run_trace, written by compare).

Times are ``time.time_ns()`` (the driver's events use the same clock); a fault's moment counts
from the driver's own event (``_since``), and ``observer_lag_ms`` is the longest any event
waited to be read.  The observer never imports the target: it sees only the protocol, /proc
and psutil.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.targets import observer_guard, private_mounts, procs
from chaos.targets.base import Launch, Target
from chaos.targets.protocol import parse
from chaos.targets.scenario import TargetScenario

if TYPE_CHECKING:
    from telemetry.otlp_receiver import OtlpReceiver, ReceivedSpan

_TICK_S = 0.02
_SCAN_EVERY_S = 0.2
_SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}


@dataclasses.dataclass
class TargetRecord:
    """Everything one run showed, in JSON-able fields (see ``to_json``)."""

    target: str
    scenario: str
    seed: int
    fault_kind: str
    spec: dict[str, Any]
    applicable: bool = True
    note: str = ""
    started: bool = False
    started_ns: int | None = None  # when the observer began the run (the trace's root)
    ready_ns: int | None = None
    done_ns: int | None = None
    procs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    fault: dict[str, Any] | None = None
    calls: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stuck: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    driver_end_ns: int | None = None
    driver_returncode: int | None = None
    ended_by: str | None = None  # "fault" (kill_driver), "hang", "deadline", "start", "launch"
    orphans: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    leftovers: list[str] = dataclasses.field(default_factory=list)
    stderr_tail: str = ""
    wall_s: float = 0.0
    bounds: dict[str, float] = dataclasses.field(default_factory=dict)
    # The fault's clock starts at the k-th invoke: it is meant to land while calls run.
    mid_work: bool = False
    # The longest an event waited between the driver writing it and the observer reading it.
    observer_lag_ms: float = 0.0
    # How the observer was scheduled while it watched ("SCHED_FIFO 10", or why not).
    observer_priority: str = ""
    # "namespace": leftovers are the run's own /dev/shm and /tmp; else "name: <why not>".
    attribution: str = ""
    # Processes the driver's ready named that are not provably the run's: never signalled.
    disowned: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # The signal that ended the observer mid-run (ended_by "observer"), if one did.
    observer_signal: str | None = None

    def fault_ns(self) -> int | None:
        return None if self.fault is None else self.fault.get("time_ns")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["calls"] = {str(k): v for k, v in sorted(self.calls.items())}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TargetRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in fields})
        record.calls = {int(k): v for k, v in data.get("calls", {}).items()}
        return record


def _since(event: dict[str, Any]) -> float:
    """The monotonic moment the driver wrote ``event`` (a loaded machine may have the observer
    read it late: a fault's delay counts from the driver's moment, not from the reading)."""
    lag_s = max(0.0, (event["rt"] - event["t"]) / 1e9) if isinstance(event.get("t"), int) else 0.0
    return time.monotonic() - lag_s


class EventReader:
    """Protocol events from the driver's stdout: a non-blocking fd, waited on with poll."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd, self._buf, self.eof = fd, b"", False
        self._poller = select.poll()  # never select(): a target may hold fds past 1,024
        self._poller.register(fd, select.POLLIN | select.POLLHUP)

    def read(self, timeout_s: float) -> list[dict[str, Any]]:
        if self.eof:
            time.sleep(max(0.0, timeout_s))
            return []
        if not self._poller.poll(max(0, int(timeout_s * 1000))):
            return []
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return []
        if not data:
            self.eof = True
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        events = []
        for line in lines:
            event = parse(line.decode("utf-8", "replace"))
            if event is not None:
                event["rt"] = time.time_ns()  # when the observer read it
                events.append(event)
        return events


class TargetRun:
    def __init__(self, target: Target, scenario: TargetScenario, seed: int, out: Path) -> None:
        self.target, self.scenario, self.seed, self.out = target, scenario, seed, Path(out)
        self.spec = scenario.workload_spec(seed)
        self.record = TargetRecord(target.name, scenario.name, seed, scenario.fault,
                                   self.spec.to_json(), bounds={
                                       "bound_s": scenario.bound_s, "detect_s": scenario.detect_s,
                                       "exit_s": scenario.exit_s},
                                   mid_work=scenario.after_invoke is not None)
        self._child: subprocess.Popen[bytes] | None = None
        self._tree: procs.ProcessTree | None = None
        self._due: float | None = None  # monotonic time of the fault, once its trigger came
        self._invokes = 0
        self._stopped: procs.Proc | None = None  # SIGSTOPped, waiting for its SIGCONT
        self._fault_mono: float | None = None
        self._invoked_at: dict[int, float] = {}
        self._hang_since: float | None = None
        self._done_mono: float | None = None
        self._held: set[str] = set()
        self._scanner: procs.Scanner | None = None
        self._mounts: private_mounts.RunMounts | None = None
        self._guard = observer_guard.Unwinding()
        self.target_spans: list[ReceivedSpan] = []  # what the target exported of itself

    # ------------------------------------------------------------ the run

    def run(self) -> TargetRecord:
        t0, self.record.started_ns = time.monotonic(), time.time_ns()
        self.out.mkdir(parents=True, exist_ok=True)
        if self.scenario.fault not in self.target.applies:
            self._not_applicable(f"{self.scenario.fault} does not apply to {self.target.name}")
        else:
            with observer_guard.unwinding() as self._guard:
                try:
                    self._launch_and_observe()
                except SystemExit:
                    if self._guard.signum is None:
                        raise
        self.record.wall_s = time.monotonic() - t0
        (self.out / "record.json").write_text(json.dumps(self.record.to_json(), indent=1,
                                                         default=repr))
        if self._guard.signum is not None:  # the run is down: now end as the signal meant
            raise SystemExit(128 + self._guard.signum)
        return self.record

    def _not_applicable(self, why: str) -> None:
        self.record.applicable, self.record.note = False, why

    def _launch_and_observe(self) -> None:
        shm_before, tmp_before = procs.shm_names(), self._temp_files()
        receiver = None
        try:
            launch = self._in_own_namespace(self.target.launch(self.spec, str(self.out)))
            receiver = _receiver() if self.target.otlp_traces else None
            env = launch.env if receiver is None else {**launch.env,
                                                       **otlp_env(receiver.endpoint)}
            with observer_guard.realtime() as how:
                self.record.observer_priority = how
                self._launch(launch, env, shm_before, tmp_before)
        finally:
            if receiver is not None:
                receiver.stop()
                self.target_spans = receiver.spans()
            if self._mounts is not None:
                self._mounts.remove()

    def _in_own_namespace(self, launch: Launch) -> Launch:
        """``launch`` inside a mount namespace of the run's own, when one can be had."""
        why_not = private_mounts.unavailable()
        if shutil.which(launch.argv[0], path=launch.env.get("PATH")) is None:
            return launch  # Popen itself says it cannot start it (ended_by "launch")
        if why_not is not None:
            self.record.attribution = f"name: {why_not}"
            return launch
        self.record.attribution = "namespace"
        self._mounts = private_mounts.RunMounts.create()
        keep = [str(self.out), launch.cwd or os.getcwd()]
        return dataclasses.replace(launch, argv=self._mounts.wrap(launch.argv, keep))

    def _launch(self, launch: Launch, env: dict[str, str], shm_before: set[str],
                tmp_before: set[str]) -> None:
        with open(self.out / "driver.log", "wb") as log:
            try:
                self._child = subprocess.Popen(launch.argv, env=env, cwd=launch.cwd,
                                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                               stderr=log, start_new_session=True)
            except OSError as exc:  # a target's interpreter or venv that is not there
                self.record.ended_by = "launch"
                self.record.stderr_tail = f"cannot start {launch.argv[0]}: {exc}"
                return
        self._tree = procs.ProcessTree(self._child.pid)
        assert self._child.stdout is not None
        try:
            reader = EventReader(self._child.stdout.fileno())
            if self._wait_ready(reader):
                self._observe(reader)
        finally:
            with self._guard.shielded():
                self._finish(shm_before, tmp_before)
                self._child.stdout.close()

    def _wait_ready(self, reader: EventReader) -> bool:
        assert self._child is not None
        deadline = time.monotonic() + self.target.start_timeout_s
        while time.monotonic() < deadline:
            events = reader.read(_TICK_S * 5)
            for event in events:  # events after ready in the same read count too
                if event["ev"] == "ready" and not self.record.started:
                    self._on_ready(event)
                else:
                    self._on_event(event)
            if self.record.started:
                return True
            if self._child.poll() is not None:
                self._driver_ended()
                return False
        self._end_driver("start")
        return False

    def _on_ready(self, event: dict[str, Any]) -> None:
        assert self._tree is not None
        self.record.started, self.record.ready_ns = True, event["t"]
        if self._mounts is not None:
            self._tree.fence_namespace()
        self.record.disowned = self._tree.name(event.get("procs", []))
        self._tree.discover()
        self._scanner = procs.Scanner(self._tree, _SCAN_EVERY_S)
        self._scanner.start()
        if self.scenario.after_invoke is None and not self._idle_kill():
            self._due = _since(event) + self.scenario.fault_delay_s(self.seed)

    def _idle_kill(self) -> bool:
        """kill_driver with the workers idle: its clock starts at ``done``, nowhere else."""
        return self.scenario.fault == "kill_driver" and not self.scenario.busy

    def _observe(self, reader: EventReader) -> None:
        assert self._child is not None and self._tree is not None
        deadline = time.monotonic() + self._run_limit_s()
        while True:
            now = time.monotonic()
            wait = _TICK_S if self._due is None else min(_TICK_S, max(0.0, self._due - now))
            for event in reader.read(wait):
                self._on_event(event)
            self._tree.poll_exits(time.time_ns())
            self._fire_due()
            self._resume_after_bound()
            if self._child.poll() is not None:
                self._drain(reader)
                self._driver_ended()
                return
            if self._check_hang() or time.monotonic() > deadline:
                self._end_driver("hang" if self.record.stuck else "deadline")
                return

    def _run_limit_s(self) -> float:
        s = self.scenario
        return (self.spec.calls * (self.spec.call_s + 0.5) + self.spec.linger_s
                + 3 * s.bound_s + 30.0)

    def _drain(self, reader: EventReader) -> None:
        while not reader.eof:
            events = reader.read(0.05)
            if not events and not reader.eof:
                break
            for event in events:
                self._on_event(event)

    # ------------------------------------------------------------ events

    def _on_event(self, event: dict[str, Any]) -> None:
        kind, call_id = event["ev"], event.get("id")
        if isinstance(event.get("t"), int):
            lag_ms = (event["rt"] - event["t"]) / 1e6
            self.record.observer_lag_ms = round(max(self.record.observer_lag_ms, lag_ms), 1)
        if kind == "invoke" and isinstance(call_id, int):
            self.record.calls[call_id] = {"what": event.get("what"), "invoke_ns": event["t"],
                                          "end_ns": None, "outcome": "pending"}
            self._invoked_at[call_id] = time.monotonic()
            self._invokes += 1
            if (self.scenario.after_invoke == self._invokes and self._due is None
                    and not self._idle_kill()):
                self._due = _since(event) + self.scenario.fault_delay_s(self.seed)
        elif kind in ("ok", "fail") and isinstance(call_id, int):
            call = self.record.calls.setdefault(call_id, {"invoke_ns": None})
            call.update(end_ns=event["t"], outcome=kind)
            call.update({"value": event.get("value")} if kind == "ok" else
                        {"type": event.get("type"), "message": event.get("message")})
            self._invoked_at.pop(call_id, None)
        elif kind == "error":
            self.record.errors.append({k: event.get(k) for k in ("type", "message", "t")})
        elif kind == "done":
            self.record.done_ns, self._done_mono = event["t"], time.monotonic()
            if self._idle_kill():
                self._due = _since(event) + self.scenario.fault_delay_s(self.seed)

    # ------------------------------------------------------------ the fault

    def _fire_due(self) -> None:
        if self._due is None or time.monotonic() < self._due or self.record.fault is not None:
            return
        late_s, self._due = time.monotonic() - self._due, None
        self._tree.discover()  # type: ignore[union-attr]
        alive = [p.pid for p in self._tree.others() if p.alive()]  # type: ignore[union-attr]
        kind = self.scenario.fault
        if kind == "none":
            self.record.fault = {"kind": "none", "time_ns": None}
        elif kind in _SIGNALS:
            self._signal(kind)
        elif kind == "kill_driver":
            self._kill_driver()
        elif kind == "damage_shm":
            self._damage_shm()
        if self.record.fault is not None and self.record.fault.get("time_ns"):
            self._fault_mono = time.monotonic()
            # What the fault met: a loaded machine may delay the observer past its moment.
            self.record.fault.update(late_s=round(late_s, 4), alive_at_fault=alive)

    def _signal(self, kind: str) -> None:
        assert self._tree is not None
        s = self.scenario
        proc = self._tree.find(s.role, s.rank)
        if proc is None or proc.handle is None:
            whom = s.role if s.rank is None else f"{s.role} rank {s.rank}"
            lied = [d for d in self.record.disowned
                    if d.get("role") == s.role and (s.rank is None or d.get("rank") == s.rank)]
            self._not_applicable(
                f"the target has no {whom} (none named in its ready event)" if not lied else
                f"the driver named pid {lied[0]['pid']} as its {whom}, which is not the "
                f"run's ({lied[0]['why']}): the observer signals only its own processes")
            return
        self.record.fault = {"kind": kind, "role": proc.role, "rank": proc.rank, "pid": proc.pid,
                             "signal": _SIGNALS[kind].name, "time_ns": time.time_ns()}
        try:
            proc.handle.send_signal(_SIGNALS[kind])
        except Exception as exc:  # noqa: BLE001 - a process already gone: say so, go on
            self.record.fault["error"] = f"{type(exc).__name__}: {exc}"
            return
        if kind == "stop":
            self._stopped = proc

    def _kill_driver(self) -> None:
        assert self._child is not None
        idle = "idle" if self.record.done_ns is not None else "busy"
        self.record.fault = {"kind": "kill_driver", "role": "driver", "rank": None,
                             "pid": self._child.pid, "signal": "SIGKILL", "workers": idle,
                             "time_ns": time.time_ns()}
        self._child.send_signal(signal.SIGKILL)
        self.record.ended_by = "fault"

    def _damage_shm(self) -> None:
        assert self._tree is not None
        segments = procs.shared_segments(self._tree.pids())
        if not segments:
            self._not_applicable("no /dev/shm or memfd mapping found in the target's processes")
            return
        rng = self.scenario.rng(self.seed)
        segment = rng.choice(segments)
        data = rng.randbytes(min(self.scenario.damage_bytes, segment.size))
        self.record.fault = {"kind": "damage_shm", "segment": segment.to_json(),
                             "segments": [s.name for s in segments], "role": None, "rank": None,
                             "pid": segment.pid, "time_ns": time.time_ns()}
        try:
            self.record.fault["bytes"] = procs.damage(segment, data)
        except OSError as exc:
            self.record.fault["error"] = f"{type(exc).__name__}: {exc}"

    def _resume_after_bound(self, now_anyway: bool = False) -> None:
        if self._stopped is None or self._fault_mono is None:
            return
        if not now_anyway and time.monotonic() < self._fault_mono + self.scenario.bound_s:
            return
        fault = self.record.fault or {}
        seen = [e for e in self._caller_events() if e >= fault.get("time_ns", 0)]
        fault["within_bound"] = "failed" if seen else "hang"
        try:
            self._stopped.handle.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
        fault["resumed_ns"] = time.time_ns()
        self._stopped = None

    def _caller_events(self) -> list[int]:
        return [e["t"] for e in self.record.errors] + [
            c["end_ns"] for c in self.record.calls.values() if c.get("outcome") == "fail"]

    # ------------------------------------------------------------ hangs

    def _check_hang(self) -> bool:
        """A call in flight past the bound (or a driver not exiting a bound after ``done``)
        is recorded with every process's status; True once it has had a second bound."""
        now, bound = time.monotonic(), self.scenario.bound_s
        late = sorted(i for i, t in self._invoked_at.items() if now - t > bound)
        if self._done_mono is not None:
            exit_by = (self._done_mono + self.spec.linger_s
                       + max(bound, self.target.shutdown_timeout_s))
            if now > exit_by and self.record.ended_by is None:
                late = late or [-1]
        if not late:
            self._hang_since = None  # a stopped worker resumed: the calls went on
            return False
        if self._hang_since is None:
            self._hang_since = now
            what = (f"call(s) {late} still in flight {bound:g} s after their invoke"
                    if late != [-1] else
                    f"the driver had not exited {max(bound, self.target.shutdown_timeout_s):g}"
                    " s after done (+ its linger)")
            self.record.stuck.append({"what": what, "calls": [i for i in late if i >= 0],
                                      "bound_s": bound, "time_ns": time.time_ns(),
                                      "procs": self._tree.statuses()})  # type: ignore[union-attr]
        return now - self._hang_since > bound

    # ------------------------------------------------------------ the end

    def _end_driver(self, why: str) -> None:
        assert self._child is not None
        if self._child.poll() is None:
            self._child.send_signal(signal.SIGKILL)
            self.record.ended_by = self.record.ended_by or why
        self._child.wait()
        self._driver_ended()

    def _driver_ended(self) -> None:
        assert self._child is not None
        self._child.wait()
        if self.record.driver_end_ns is None:
            self.record.driver_end_ns = time.time_ns()
            self.record.driver_returncode = self._child.returncode

    def _finish(self, shm_before: set[str], tmp_before: set[str]) -> None:
        assert self._child is not None and self._tree is not None
        if self._scanner is not None:
            self._scanner.stop()
            self._held |= self._scanner.held
        self._resume_after_bound(now_anyway=True)  # a stopped process cannot exit by itself
        signalled = self._guard.name
        if signalled is not None:  # the observer is being ended: take the run down now
            self.record.observer_signal, self.record.ended_by = signalled, "observer"
            self.record.note = f"the observer got {signalled}: the run was taken down, no verdict"
        if self._child.poll() is None:
            self._end_driver(self.record.ended_by or "deadline")
        self._driver_ended()
        tree = self._tree
        tree.poll_exits(self.record.driver_end_ns or time.time_ns())
        tree.discover_session()
        deadline = time.monotonic() + (0.0 if signalled else self.scenario.exit_s)
        while time.monotonic() < deadline and any(p.alive() for p in tree.others()):
            time.sleep(_TICK_S)
            tree.poll_exits(time.time_ns())
        if signalled is None:
            self.record.orphans = [{"role": p.role, "rank": p.rank, "pid": p.pid,
                                    "status": p.state()} for p in tree.others() if p.alive()]
        self._held |= procs.held_shm([p.pid for p in tree.others() if p.alive()])
        tree.kill_all()
        tree.poll_exits(time.time_ns())
        self.record.procs = [p.to_json() for p in tree.snapshot()]
        self.record.leftovers = self._leftovers(shm_before, tmp_before)
        self.record.stderr_tail = _tail(self.out / "driver.log")

    def _leftovers(self, shm_before: set[str], tmp_before: set[str]) -> list[str]:
        """What the run left (see step 4): exactly its own with a namespace (removed with
        it); else by name, new /dev/shm names the tree held (or that carry one of its pids:
        faultlab's own) and new files matching temp_globs, the segments unlinked."""
        if self._mounts is not None:
            own = [f"{procs.SHM_DIR}/{n}" for n in self._mounts.shm_names()]
            elsewhere = [g for g in self.target.temp_globs if not private_mounts.tmp_glob(g)]
            return (own + self._mounts.tmp_paths(self.target.temp_globs)
                    + sorted(self._temp_files(elsewhere) - tmp_before))
        assert self._tree is not None
        pids = {str(p) for p in self._tree.procs}
        left = []
        for name in sorted(procs.shm_names() - shm_before):
            if name in self._held or any(f"_{pid}_" in name for pid in pids):
                left.append(f"{procs.SHM_DIR}/{name}")
                _unlink(f"{procs.SHM_DIR}/{name}")
        return left + sorted(self._temp_files() - tmp_before)

    def _temp_files(self, globs: tuple[str, ...] | list[str] | None = None) -> set[str]:
        patterns = self.target.temp_globs if globs is None else globs
        return {path for pattern in patterns for path in glob.glob(pattern)}


def _receiver() -> OtlpReceiver:
    from telemetry.otlp_receiver import OtlpReceiver  # protobuf: only for targets that send

    return OtlpReceiver().start()


def otlp_env(endpoint: str) -> dict[str, str]:
    """The standard variables that point an OpenTelemetry SDK's trace export at ``endpoint``
    (the vLLM driver passes the endpoint on as ``LLM(otlp_traces_endpoint=...)``)."""
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")
