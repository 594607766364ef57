"""The journal reader against torn, garbled and arbitrary input: it never raises."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import telemetry
from telemetry import journal as j
from telemetry.assemble import read_run

_RECORD = st.tuples(st.sampled_from(j.KINDS), st.binary(min_size=63, max_size=63))


def _journal_with_one_span(run_dir: Path) -> Path:
    os.environ["FAULTLAB_TRACE_DIR"] = str(run_dir)
    try:
        telemetry.configure_process("driver")
        telemetry.get_recorder().start_span("kept", attributes={"k": "v"}).end()
        telemetry.shutdown()
    finally:
        del os.environ["FAULTLAB_TRACE_DIR"]
    (path,) = run_dir.glob("journal-*.bin")
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_RECORD, max_size=40), cut=st.integers(min_value=0, max_value=63))
def test_garbage_after_valid_records_never_breaks_the_reader(
    tmp_path_factory: object, records: list[tuple[int, bytes]], cut: int,
) -> None:
    run_dir = Path(tmp_path_factory.mktemp("fuzz"))  # type: ignore[attr-defined]
    path = _journal_with_one_span(run_dir)
    with open(path, "ab") as f:
        for kind, body in records:
            f.write(bytes([kind]) + body)
        if records:
            f.write(bytes([records[0][0]]) + records[0][1][:cut])  # a torn last record
    spans = read_run(run_dir)
    kept = [s for s in spans if s.name == "kept"]
    assert len(kept) == 1 and kept[0].attributes == {"k": "v"} and kept[0].status == "OK"


def test_truncated_header_and_foreign_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "journal-driver-x-1-0123456789abcdef.bin").write_bytes(b"FLJ")
    (tmp_path / "journal-worker-0-2-0123456789abcdee.bin").write_bytes(b"\0" * 300)
    (tmp_path / "notes.txt").write_text("not a journal")
    assert len(telemetry.load_run(tmp_path)) == 0


def test_record_layout_fits_a_slot() -> None:
    for packer in (j.SPAN_START_S, j.SPAN_END_S, j.ATTR_INT_S, j.ATTR_FLOAT_S, j.EVENT_S,
                   j.STRING_S, j.THREAD_S):
        assert 1 + packer.size <= j.RECORD_SIZE
    assert j.HEADER_S.size <= j.HEADER_SIZE


# "span.kind" is not kept as an attribute: it sets the span's kind (story.apply_conventions).
_KEYS = st.text(min_size=1, max_size=12).filter(lambda key: key != "span.kind")
_VALUES = st.one_of(
    st.text(max_size=80), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=st.lists(
    st.tuples(st.text(min_size=1, max_size=30), st.dictionaries(_KEYS, _VALUES, max_size=5),
              st.booleans(), st.integers(min_value=-1, max_value=10)),
    min_size=1, max_size=12))
def test_recorded_spans_round_trip(
    tmp_path_factory: object, spans: list[tuple[str, dict[str, object], bool, int]],
) -> None:
    run_dir = Path(tmp_path_factory.mktemp("rt"))  # type: ignore[attr-defined]
    os.environ["FAULTLAB_TRACE_DIR"] = str(run_dir)
    try:
        telemetry.configure_process("driver")
        rec = telemetry.get_recorder()
        made = []
        for name, attrs, ok, parent_index in spans:
            parent = made[parent_index][0].context if 0 <= parent_index < len(made) else None
            span = rec.start_span(name, parent, attrs)
            made.append((span, name, attrs, ok, parent))
        for span, _, _, ok, _ in made:
            span.end(None if ok else "failed")
        telemetry.shutdown()
    finally:
        del os.environ["FAULTLAB_TRACE_DIR"]
    df = telemetry.load_run(run_dir).set_index("span_id")
    assert len(df) == len(made)
    for span, name, attrs, ok, parent in made:
        row = df.loc[f"{span.context.span_id:016x}"]
        assert row["name"] == name and row["attributes"] == attrs
        assert row["status"] == ("OK" if ok else "ERROR")
        expected_parent = None if parent is None else f"{parent.span_id:016x}"
        assert row["parent_span_id"] == expected_parent
        assert row["trace_id"] == f"{span.context.trace_id:032x}"
