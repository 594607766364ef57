"""Planted judges of telemetry: the failure story, the streamed export, the OTLP receiver.

    judge (where)                               planted bug
    failure_marks.victim_fate                   names the rank of the trace's first worker
                                                span, not the fault's
    failure_marks.when                          "before this RPC began" decided with <=
    failure_marks._doing                        "in flight" decided against the first span
                                                of the trace (its step), not the RPC
    failure_marks.fault_target                  every victim told as a worker by rank
    story._matches                              a worker's death detects any worker's fault
    story.Story._affected                       an RPC that succeeded is told as failed
    stream.JournalIndex.decode                  an event recorded after its span ended is
                                                dropped from the streamed export
    stream.RunStream.traces                     each trace told alone (no whole-run story)
    stream.STORY_NAMES                          a restart is not a story trace
    otlp_receiver.OtlpReceiver.reject           only decode errors (400) are counted
    otlp_receiver.inflate                       the size cap applied to the compressed body
    otlp_receiver.inflate                       a truncated stream taken as what came out

Their cases: ``tests/judges/test_judges_telemetry.py``.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from chaos.planted_judges import PlantedJudge
from telemetry.failure_marks import ms
from telemetry.otlp_receiver import MAX_BODY_BYTES, Refused
from telemetry.story import Story


def _first_span_rank(original: Callable[..., str]) -> Callable[..., str]:
    def victim_fate(fault: Any, rpc: Any, members: list[Any]) -> str:
        first = next((m for m in members if m.process.role == "worker"), None)
        rank = fault.rank if first is None else first.process.rank
        return str(original(dataclasses.replace(fault, rank=rank), rpc, members))
    return victim_fate


def _before_with_le(original: Callable[[int, Any], str]) -> Callable[[int, Any], str]:
    def when(time_ns: int, rpc: Any) -> str:
        if time_ns <= rpc.start_ns:
            return f"{ms(rpc.start_ns - time_ns):.2f} ms before this RPC began"
        return original(time_ns, rpc)
    return when


def _in_flight_from_the_trace_start(original: Callable[..., str]) -> Callable[..., str]:
    def doing(fault: Any, rpc: Any, members: list[Any]) -> str:
        first = min((m.start_ns for m in members), default=rpc.start_ns)
        return str(original(fault, dataclasses.replace(rpc, start_ns=first), members))
    return doing


def _all_workers(original: Callable[[Any], str]) -> Callable[[Any], str]:
    def fault_target(fault: Any) -> str:
        return f"worker rank {fault.rank} (pid {fault.pid})"
    return fault_target


def _any_death(original: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def matches(fault: Any, sign: Any) -> bool:
        if sign.by == "worker_death":
            return bool(sign.time_ns >= fault.time_ns)
        return original(fault, sign)
    return matches


def _succeeded_too(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    def affected(self: Any, fault: Any, rpcs: list[Any], restart: Any) -> list[Any]:
        told = original(self, fault, rpcs, restart)
        return told + [r for r in rpcs if not r.failed and r not in told
                       and r.start_ns <= fault.time_ns <= r.shown_end_ns]
    return affected


def _drops_late_events(original: Callable[[Any, int], list[Any]]) -> Callable[[Any, int], list[Any]]:
    def decode(self: Any, k: int) -> list[Any]:
        spans = original(self, k)
        for span in spans:
            if span.end_ns is not None:
                span.events = [e for e in span.events if e.time_ns <= span.end_ns]
        return spans
    return decode


def _each_trace_alone(original: Callable[..., Iterator[list[Any]]]) -> Callable[..., Iterator[list[Any]]]:
    def traces(self: Any, start: int = 0, stop: int | None = None) -> Iterator[list[Any]]:
        stop = self.n_traces if stop is None else min(stop, self.n_traces)
        for k in range(start, stop):
            yield Story().tell(self._decode(k))
    return traces


def _no_restarts(original: frozenset[str]) -> frozenset[str]:
    return frozenset(original - {"executor.restart"})


def _counts_only_400(original: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
    def reject(self: Any, why: str) -> None:
        if why.startswith("400"):
            original(self, why)
    return reject


def _caps_the_compressed_size(original: Callable[..., bytes]) -> Callable[..., bytes]:
    def inflate(body: bytes, encoding: str, limit: int = MAX_BODY_BYTES) -> bytes:
        if len(body) > limit:
            raise Refused(413, f"{len(body)} bytes is over the {limit} byte limit")
        return original(body, encoding, 1 << 62)
    return inflate


def _takes_truncated(original: Callable[..., bytes]) -> Callable[..., bytes]:
    def inflate(body: bytes, encoding: str, limit: int = MAX_BODY_BYTES) -> bytes:
        if encoding != "gzip":
            return original(body, encoding, limit)
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = inflater.decompress(body, limit + 1)
        while inflater.unused_data:  # further members, as a lenient reader takes them
            inflater, rest = zlib.decompressobj(16 + zlib.MAX_WBITS), inflater.unused_data
            out += inflater.decompress(rest, limit + 1)
        return out
    return inflate


PLANTED: list[PlantedJudge] = [
    PlantedJudge("telemetry_story_first_span_rank", "telemetry.failure_marks:victim_fate",
                 "the failure story names the rank of the trace's first worker span, not the "
                 "rank the fault hit", _first_span_rank),
    PlantedJudge("telemetry_story_before_with_le", "telemetry.failure_marks:when",
                 "a fault at the RPC's very start is told as before it began (<= for <)",
                 _before_with_le),
    PlantedJudge("telemetry_story_in_flight_wrong_span", "telemetry.failure_marks:_doing",
                 "'in flight' decided against the trace's first span (the step), so a fault "
                 "before the RPC began is told as while it was in flight",
                 _in_flight_from_the_trace_start),
    PlantedJudge("telemetry_story_every_victim_a_worker", "telemetry.failure_marks:fault_target",
                 "every fault told as hitting a worker by rank, the driver's and a node's too",
                 _all_workers),
    PlantedJudge("telemetry_story_any_death_detects", "telemetry.story:_matches",
                 "a worker's death is taken as the detection of a fault on any worker",
                 _any_death),
    PlantedJudge("telemetry_story_succeeded_rpc_affected", "telemetry.story:Story._affected",
                 "an RPC open at the fault that succeeded is told as failed by it",
                 _succeeded_too),
    PlantedJudge("telemetry_stream_drops_late_event", "telemetry.stream:JournalIndex.decode",
                 "the streamed export drops an event recorded after its span ended (a "
                 "worker's exception, written with its reply)", _drops_late_events),
    PlantedJudge("telemetry_stream_trace_told_alone", "telemetry.stream:RunStream.traces",
                 "the streamed export tells each trace alone, without the whole run's faults "
                 "and restarts", _each_trace_alone),
    PlantedJudge("telemetry_stream_restart_not_story", "telemetry.stream:STORY_NAMES",
                 "a restart's trace is not read before the others, so a failed RPC streamed "
                 "before it lacks its restart", _no_restarts),
    PlantedJudge("telemetry_receiver_counts_only_400", "telemetry.otlp_receiver:OtlpReceiver.reject",
                 "the receiver counts only undecodable requests in rejected, not 415s and "
                 "the rest", _counts_only_400),
    PlantedJudge("telemetry_receiver_caps_compressed", "telemetry.otlp_receiver:inflate",
                 "the body cap is applied to the compressed size, so a bomb inflates freely",
                 _caps_the_compressed_size),
    PlantedJudge("telemetry_receiver_takes_truncated", "telemetry.otlp_receiver:inflate",
                 "a truncated gzip body is taken as whatever inflated from it",
                 _takes_truncated),
]
