"""A worker killed (SIGKILL) or ended (SIGTERM) half-way through a reply of several chunks
(phase "mid_reply": the worker's queue.mid_chunk_write, once a chunk of the reply is visible
to the driver): the driver, holding part of a message, must fail fast and name the death,
not wait for the rest.  A reply of one chunk is never half written, so the fault waits.

    fault                 reply                    expected
    kill / term mid_reply 256 KiB in 64 KiB chunks  fail fast, detected; coverage reaches
                                                    "a kill landed while a reply was half written"
    kill mid_reply        one chunk                 never fires (nothing half written)
"""

from __future__ import annotations

import pytest
from helpers import real_violations

from chaos import FaultPlan, KillWorker, run_scenario
from chaos.coverage import Coverage
from chaos.faults import TermWorker
from chaos.outcomes import Outcome
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig

CFG = ExecutorConfig(tensor_parallel_size=2, start_method="fork", chunk_bytes=64 << 10,
                     n_chunks=4, shutdown_grace=0.3, sigterm_grace=0.3)
HALF_WRITTEN = "a kill landed while a reply was half written"


def _calls(payload_bytes: int | None) -> list[CallSpec]:
    return [CallSpec("echo", ("warm",), 5.0),
            CallSpec("echo", ("big",), 5.0, payload_bytes=payload_bytes),
            CallSpec("echo", ("after",), 5.0)]


@pytest.mark.parametrize("kind", [KillWorker, TermWorker])
def test_a_death_mid_reply_fails_fast_and_is_covered(tmp_path, kind):
    plan = FaultPlan([kind(rank=1, phase="mid_reply", on_call=("echo", 2))], seed=2)
    result = run_scenario(CFG, rpc_sequence(_calls(256 << 10)), plan, tmp_path)
    [fired] = result.faults
    assert (fired["kind"], fired["phase"], fired["call"]) == (kind.kind, "mid_reply", 2)
    assert result.fired_points == {"queue.mid_chunk_write": 1}
    assert real_violations(result) == []
    assert result.outcome == Outcome.FAIL_FAST
    assert result.calls[1].error_type == "ExecutorFailedError"
    assert f"pid {fired['pid']}" in result.calls[1].error
    coverage = Coverage()
    coverage.add(result, "fork", [], lambda record: "site")
    assert coverage.sometimes[HALF_WRITTEN] == 1


def test_a_reply_of_one_chunk_is_never_half_written(tmp_path):
    plan = FaultPlan([KillWorker(rank=1, phase="mid_reply", on_call=("echo", 2))], seed=2)
    result = run_scenario(CFG, rpc_sequence(_calls(None)), plan, tmp_path, may_not_fire=(0,))
    assert result.faults == [] and result.unfired == [0]
    assert real_violations(result) == []
    assert [c.outcome for c in result.calls] == ["ok"] * 3


def test_the_swarm_gives_a_mid_reply_kill_replies_of_several_chunks():
    from chaos import swarm

    drawn = next(d for d in map(swarm.draw, range(500))
                 if any(f.phase == "mid_reply" for f in d.faults) and d.calls)
    [kill] = [f for f in drawn.faults if f.phase == "mid_reply"]
    assert kill.kind in ("kill_worker", "term_worker", "exit_worker") and kill.calls_of == "echo"
    echoes = [c for c in drawn.calls if c.method == "echo"]
    assert echoes and all(c.payload_bytes == swarm.BIG_PAYLOAD for c in echoes)
    assert 2 * ExecutorConfig().chunk_bytes < swarm.BIG_PAYLOAD


def test_a_payload_size_round_trips_and_a_bad_one_is_named():
    from chaos.faults import PlanError

    spec = CallSpec.from_dict({"method": "echo", "args": ["tag"], "payload_bytes": 1000}, "c")
    assert CallSpec.from_dict(spec.to_dict(), "c") == spec
    [sent] = spec.sent_args()
    assert len(sent) == 1000 and sent.startswith("tag.")
    for bad in ({"args": ["tag"], "payload_bytes": 0}, {"args": [7], "payload_bytes": 10}):
        with pytest.raises(PlanError, match=r"c.payload_bytes: a positive size"):
            CallSpec.from_dict({"method": "echo", **bad}, "c")
