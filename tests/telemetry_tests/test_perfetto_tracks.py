"""Perfetto track assignment (``telemetry.perfetto_json.assign_tracks``): a slice that would
partially overlap one already on its thread's track goes on an extra track of that thread;
nested and disjoint slices, and point events, stay on the thread's own track."""

from __future__ import annotations

from telemetry.assemble import ProcessInfo, RecordedSpan
from telemetry.perfetto_json import assign_tracks

PROC = ProcessInfo(pid=10, rank=0, role="worker", service="t", incarnation=0, created_ns=0)
TID = 7


def _span(span_id: int, start: int, end: int, *, tid: int = TID, point: bool = False) -> RecordedSpan:
    return RecordedSpan(name=f"s{span_id}", trace_id=1, span_id=span_id, parent_span_id=0,
                        start_ns=start, tid=tid, process=PROC, end_ns=end, point=point)


def test_nested_and_disjoint_slices_share_the_threads_track() -> None:
    spans = [_span(1, 0, 100), _span(2, 10, 50), _span(3, 20, 30), _span(4, 200, 300)]
    assert assign_tracks(spans) == {1: TID, 2: TID, 3: TID, 4: TID}


def test_a_partial_overlap_goes_to_the_next_free_extra_track() -> None:
    spans = [_span(1, 0, 100), _span(2, 50, 150), _span(3, 60, 170), _span(4, 120, 130)]
    tracks = assign_tracks(spans)
    extra1, extra2 = (1 << 32) | TID, (2 << 32) | TID
    # 2 overlaps 1; 3 overlaps 2 (and 1); 4 starts after 1 ended: back on the own track
    assert tracks == {1: TID, 2: extra1, 3: extra2, 4: TID}


def test_points_and_other_threads_keep_their_own_track() -> None:
    spans = [_span(1, 0, 100), _span(2, 50, 150, tid=8), _span(3, 60, 60, point=True),
             _span(4, 50, 150)]
    assert assign_tracks(spans) == {1: TID, 2: 8, 3: TID, 4: (1 << 32) | TID}
