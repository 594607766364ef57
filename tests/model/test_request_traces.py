"""Request-level traces of a real engine run with a worker SIGKILLed mid-step and restarted,
exported to Jaeger-UI JSON (exactly what a file holds).

    what                                   where in the export
    one SERVER trace per request           "text_completion faultlab", gen_ai.* tags
    each step's RPC serves requests        rpc execute_model: FOLLOWS_FROM every request span
    a rebuild per unfinished request       engine.rebuild in the request's trace, linked to
                                           the fault, its detection and engine.recovery
    the restart                            child of engine.recovery; linked to the fault,
                                           the detection and every request
    the failed RPC's story                 chaos.fault, detection and faultlab.restart logs
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from model_helpers import PROMPTS, model_config

import telemetry
from executor import MultiprocExecutor
from executor.model.engine import LLMEngine
from executor.model.recovery import RESTART
from telemetry.assemble import read_run
from telemetry.jaeger_json import to_jaeger

TOKENS = 8
DIE_STEP = 4  # the worker kills itself inside this step (every request has tokens by then)
MODEL = "text_completion faultlab"


def _tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


def _follows(span: dict[str, Any]) -> set[str]:
    return {r["spanID"] for r in span["references"] if r["refType"] == "FOLLOWS_FROM"}


def _parent(span: dict[str, Any]) -> str | None:
    return next((r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"), None)


def _logs(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [_tags(log["fields"]) for log in span["logs"] if _tags(log["fields"])["event"] == name]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The recovered run: its Jaeger export's spans by name, and the engine's outputs."""
    out = tmp_path_factory.mktemp("reqtraces")
    (out / "ctl").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAULTLAB_TRACE_DIR", str(out / "run"))
        telemetry.configure_process("driver")
        try:
            cfg = model_config(worker="model_helpers:SelfKillingModelWorker", worker_kwargs={
                "die_rank": 0, "die_step": DIE_STEP, "ctl": str(out / "ctl")})
            with MultiprocExecutor(cfg) as ex:
                engine = LLMEngine(ex, step_timeout=30, recovery=RESTART)
                outputs = engine.generate(PROMPTS, TOKENS)
                assert ex.incarnation == 1
        finally:
            telemetry.shutdown()
    doc = json.loads(json.dumps(to_jaeger(read_run(out / "run"))))
    spans: dict[str, list[dict[str, Any]]] = {}
    for trace in doc["data"]:
        for span in trace["spans"]:
            spans.setdefault(span["operationName"].split(" [rank")[0], []).append(span)
    yield {"spans": spans, "outputs": outputs}


def test_one_server_trace_per_request_with_gen_ai_attributes(run: dict[str, Any]) -> None:
    requests = run["spans"][MODEL]
    assert sorted(_tags(s["tags"])["gen_ai.request.id"] for s in requests) == sorted(PROMPTS)
    assert len({s["traceID"] for s in requests}) == len(PROMPTS)  # each its own trace
    for span in requests:
        tags = _tags(span["tags"])
        assert _parent(span) is None and tags["span.kind"] == "server"
        assert tags["gen_ai.operation.name"] == "text_completion"
        assert tags["gen_ai.request.model"] == "faultlab"
        assert tags["gen_ai.usage.input_tokens"] == len(PROMPTS[tags["gen_ai.request.id"]])
        assert tags["gen_ai.usage.output_tokens"] == TOKENS
        assert 0 <= tags["gen_ai.latency.time_in_queue"] <= tags["gen_ai.latency.time_to_first_token"]
        assert tags["gen_ai.latency.time_to_first_token"] <= tags["gen_ai.latency.e2e"]
        assert tags["faultlab.request.retries"] == 1 and "error" not in tags
    assert all(len(tokens) == TOKENS for tokens in run["outputs"].values())


def test_each_step_rpc_links_to_the_requests_it_served(run: dict[str, Any]) -> None:
    request_ids = {s["spanID"] for s in run["spans"][MODEL]}
    steps = {s["spanID"]: s for s in run["spans"]["engine.step"]}
    rpcs = [s for s in run["spans"]["rpc execute_model"] if _parent(s) in steps]
    assert len(rpcs) == len(steps) >= TOKENS  # every step's RPC is its step span's child
    for rpc in rpcs:
        step = steps[_parent(rpc)]  # type: ignore[index]
        served = _follows(rpc) & request_ids
        assert served == _follows(step) == request_ids  # one batch holds every request here
        assert rpc["traceID"] == step["traceID"]


def test_rebuild_spans_sit_in_request_traces_linked_to_the_fault(run: dict[str, Any]) -> None:
    (fault,) = run["spans"]["chaos.fault"]
    (death,) = run["spans"]["executor.worker_death"]
    (recovery,) = run["spans"]["engine.recovery"]
    requests = {s["spanID"]: s for s in run["spans"][MODEL]}
    rebuilds = run["spans"]["engine.rebuild"]
    assert len(rebuilds) == len(PROMPTS)
    for rebuild in rebuilds:
        request = requests[_parent(rebuild)]  # type: ignore[index]
        assert rebuild["traceID"] == request["traceID"]
        assert {fault["spanID"], death["spanID"], recovery["spanID"]} <= _follows(rebuild)
        (detection,) = _logs(rebuild, "faultlab.detection")
        assert detection["faultlab.detection.by"] == "worker_death"
        assert _tags(rebuild["tags"])["faultlab.tokens_recomputed"] == DIE_STEP


def test_the_restart_links_to_fault_detection_and_requests(run: dict[str, Any]) -> None:
    (fault,) = run["spans"]["chaos.fault"]
    (death,) = run["spans"]["executor.worker_death"]
    (recovery,) = run["spans"]["engine.recovery"]
    (restart,) = run["spans"]["executor.restart"]
    request_ids = {s["spanID"] for s in run["spans"][MODEL]}
    assert _parent(restart) == recovery["spanID"] and restart["traceID"] == recovery["traceID"]
    assert {fault["spanID"], death["spanID"]} | request_ids <= _follows(restart)
    assert request_ids <= _follows(recovery)
    startups = [s for s in run["spans"]["executor.startup"] if _parent(s) == restart["spanID"]]
    assert len(startups) == 1  # the new incarnation's start-up, inside the restart's trace


def test_the_failed_rpc_tells_fault_detection_and_restart(run: dict[str, Any]) -> None:
    (restart,) = run["spans"]["executor.restart"]
    (failed,) = [s for s in run["spans"]["rpc execute_model"] if _logs(s, "chaos.fault")]
    assert _tags(failed["tags"]).get("error") is True
    (detection,) = _logs(failed, "faultlab.detection")
    assert detection["faultlab.detection.latency_ms"] > 0
    (logged,) = _logs(failed, "faultlab.restart")
    assert logged["faultlab.restart.span_id"] == restart["spanID"]
    assert logged["faultlab.incarnation"] == 1 and logged["faultlab.restart.duration_ms"] > 0
    assert restart["spanID"] in _follows(failed)
