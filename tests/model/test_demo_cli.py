"""``faultlab demo`` as a user runs it: a subprocess, one JSON object on stdout, progress on
stderr, the same tokens on every layout, and no worker left behind afterwards."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = 424243
# An environment variable marks the demos this module starts (and their workers, which inherit
# it), to find any orphan afterwards: an orphan is re-parented to init, so it is no longer our
# child, and another test run on the machine (an xdist worker beside this one) is not ours.
MARK = ("FAULTLAB_TEST_DEMO", f"demo-cli-{os.getpid()}")


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``faultlab demo``; check it left no shared-memory segment named after it."""
    command = [sys.executable, "-m", "faultlab.cli", "demo", "--seed", str(SEED), *args]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, MARK[0]: MARK[1]}) as proc:
        stdout, stderr = proc.communicate(timeout=90)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"faultlab_{proc.pid}_")]
    assert not left, f"the demo left shared memory behind: {left}"
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _json_report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    return report


def _orphans() -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK[0]) == MARK[1] and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return found


@pytest.fixture
def no_orphans() -> Any:
    """No process of a demo alive 5 s after it exited (the executor's own exit bound: a worker
    whose driver is gone leaves within its grace, and a loaded machine may take that long)."""
    yield
    deadline = time.monotonic() + 5.0
    while _orphans() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _orphans()
    assert not left, f"demo processes {left} outlived the demo by 5 s"


@pytest.mark.usefixtures("no_orphans")
def test_demo_json_is_one_object_with_the_same_tokens_on_tp1_and_tp2() -> None:
    args = ("--json", "--requests", "3", "--max-tokens", "6")
    reports = {}
    for tp in ("1", "2"):
        done = _demo(*args, "--tp", tp)
        assert done.returncode == 0, done.stderr
        assert "[demo]" in done.stderr  # progress goes to stderr, never stdout
        reports[tp] = _json_report(done)
    assert set(reports["1"]["outputs"]) == {"req-0", "req-1", "req-2"}
    assert all(len(tokens) == 6 for tokens in reports["1"]["outputs"].values())
    assert reports["1"]["tokens_per_s"] > 0
    assert reports["2"]["outputs"] == reports["1"]["outputs"]


@pytest.mark.usefixtures("no_orphans")
def test_demo_text_output_names_requests_and_throughput() -> None:
    done = _demo("--requests", "2", "--max-tokens", "3", "--pp", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("req-0 (prompt ")
    assert "tokens/s" in done.stdout.splitlines()[-1]


@pytest.mark.usefixtures("no_orphans")
def test_demo_failure_is_one_json_object_and_a_nonzero_exit() -> None:
    done = _demo("--json", "--requests", "2", "--max-tokens", "4", "--policy", "fail_stop")
    assert done.returncode == 1
    report = _json_report(done)
    assert "worker rank 0" in report["error"] and "SIGKILL" in report["error"], report
    assert report["outputs"] == {}


def test_configuring_the_demo_parser_does_not_import_torch() -> None:
    code = ("import argparse, sys, faultlab.demo; "
            "faultlab.demo.configure(argparse.ArgumentParser()); "
            "sys.exit('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr or "faultlab.demo imported torch at import time"


def _demo_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``faultlab demo ARGS`` in this process: usage errors are found before any worker
    starts, so spawning an interpreter (and importing torch) only to see one costs seconds."""
    from faultlab.cli import main

    argv = ["demo", "--seed", str(SEED), *args]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)


def _assert_usage_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, exactly one line on stderr naming the problem, no traceback, nothing on stdout."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("faultlab demo: error: ")
    for needle in needles:
        assert needle in lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--prompt-len", "0", "--prompt-len: must be an integer >= 1, got 0"),
    ("--requests", "-3", "--requests: must be an integer >= 1, got -3"),
    ("--max-tokens", "many", "--max-tokens: must be an integer >= 1, got 'many'"),
    ("--tp", "0", "--tp: must be an integer >= 1"),
    ("--pp", "-1", "--pp: must be an integer >= 1"),
    ("--step-timeout", "0", "--step-timeout: must be a number of seconds > 0"),
    ("--step-timeout", "nan", "--step-timeout: must be a number of seconds > 0"),
])
@pytest.mark.usefixtures("no_orphans")
def test_demo_bad_numeric_flag_is_one_line_and_exit_2(
    flag: str, value: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _assert_usage_error(_demo_in_process(capsys, "--json", flag, value), needle)


def test_demo_bad_flag_is_one_line_and_exit_2_from_the_installed_command() -> None:
    """One end-to-end check that the console script prints the same one line."""
    _assert_usage_error(_demo("--json", "--requests", "-3"), "--requests: must be an integer >= 1")


@pytest.mark.usefixtures("no_orphans")
def test_demo_rejects_a_request_longer_than_the_model_before_starting_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from executor.model.config import ModelConfig

    limit = ModelConfig().max_positions
    done = _demo_in_process(capsys, "--json", "--prompt-len", "16", "--max-tokens", str(limit))
    _assert_usage_error(done, f"max_positions={limit}", f"{16 + limit} tokens")
    assert "[demo]" not in done.stderr  # no worker was started


def test_demo_seed_must_fit_the_generator(capsys: pytest.CaptureFixture[str]) -> None:
    from faultlab.cli import main

    try:
        code = main(["demo", "--seed", "-1"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    _assert_usage_error(subprocess.CompletedProcess([], code, out.out, out.err),
                        "--seed: must be an integer in 0..")


def test_demo_by_default_recovers_from_a_killed_worker_with_the_same_tokens() -> None:
    done = _demo("--requests", "2", "--max-tokens", "6", "--tp", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    events = [line.split()[1] for line in lines if line.startswith("  ")]
    assert events == ["fault", "detection", "restart", "first"]  # "first token"
    assert "SIGKILL to worker rank 1" in done.stdout and "after step 3" in done.stdout
    assert "tokens match a fault-free run: yes (2/2 requests identical)" in done.stdout
    assert any(line.startswith("trace: ") for line in lines)
    assert "tokens/s" in lines[-1]


def test_demo_no_fault_and_json_recovery_fields() -> None:
    plain = _demo("--requests", "2", "--max-tokens", "4", "--no-fault")
    assert plain.returncode == 0 and "timeline" not in plain.stdout
    report = _json_report(_demo("--json", "--requests", "2", "--max-tokens", "4", "--fault", "sigterm",
                         "--fault-step", "1", "--fault-rank", "0"))
    recovery = report["recovery"]
    assert recovery["tokens_match"] and recovery["incarnation"] == 1
    assert [row["event"] for row in recovery["timeline"]][:3] == ["fault", "detection", "restart"]


def test_demo_fail_stop_policy_fails_naming_the_rank() -> None:
    done = _demo("--requests", "2", "--max-tokens", "4", "--policy", "fail_stop")
    assert done.returncode == 1
    assert "worker rank 0" in done.stderr and "SIGKILL" in done.stderr


def test_demo_layout_the_model_cannot_split_is_refused_before_starting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _assert_usage_error(_demo_in_process(capsys, "--tp", "3"), "--tp 3", "must divide num_heads=4")
    _assert_usage_error(_demo_in_process(capsys, "--pp", "3"), "--pp 3", "must divide num_layers")


def test_demo_fault_flags_are_checked_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    _assert_usage_error(_demo_in_process(capsys, "--fault-rank", "2"), "--fault-rank 2", "0..0")
    _assert_usage_error(_demo_in_process(capsys, "--max-tokens", "4", "--fault-step", "4"),
                        "--fault-step 4")
    _assert_usage_error(_demo_in_process(capsys, "--backend", "ray", "--fault", "corrupt"),
                        "--fault corrupt", "--backend ray")
