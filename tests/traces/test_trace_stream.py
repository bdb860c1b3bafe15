"""``aprof._traces.stream``: a Chrome trace read event by event gives what the standard library's
``json.load`` of the whole file gives, however it is written (indented or not, gzip in one
member or several, strings holding what looks like an event's end, values orjson refuses),
and a file cut short gives every event before the cut."""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aprof._traces import stream as _trace_stream
from aprof._traces.stream import DICTS, Fields, open_trace, open_trace_below

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # orjson reads others as floats
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab{}[],:"\\ é\u2603\n'), max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
EVENTS = st.lists(
    st.dictionaries(st.sampled_from(["ph", "name", "ts", "pid", "args", "x"]), VALUES, max_size=5)
    | VALUES,  # items of traceEvents that are no object: skipped, counted
    max_size=30,
)


def _events(path: Path) -> tuple[list[dict[str, Any]], Any]:
    with open_trace(path, DICTS) as trace:
        events = [e for batch in trace.batches() for e in batch]
        return events, trace


def _write(path: Path, text: str, members: int = 1) -> None:
    data = text.encode()
    if path.suffix != ".gz":
        path.write_bytes(data)
        return
    step = max(1, len(data) // members)
    path.write_bytes(b"".join(gzip.compress(data[i : i + step]) for i in range(0, len(data), step)))


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=EVENTS,
    before=st.dictionaries(st.sampled_from(["schemaVersion", "baseTimeNanoseconds", "m"]), VALUES),
    after=st.dictionaries(st.sampled_from(["traceName", "displayTimeUnit", "z"]), VALUES),
    indent=st.sampled_from([None, 0, 2, 4]),
    gz=st.booleans(),
    members=st.integers(1, 3),
    small=st.booleans(),
    ascii_only=st.booleans(),
)
def test_read_event_by_event_it_gives_what_json_load_gives(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    events: list[Any],
    before: dict[str, Any],
    after: dict[str, Any],
    indent: int | None,
    gz: bool,
    members: int,
    small: bool,
    ascii_only: bool,
) -> None:
    if small:  # batches and chunks of a few bytes: every cut and refill path is taken
        monkeypatch.setattr(_trace_stream, "BATCH", 64)
        monkeypatch.setattr(_trace_stream, "CHUNK", 16)
    document = {**before, "traceEvents": events, **after}
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    _write(path, json.dumps(document, indent=indent, ensure_ascii=ascii_only), members)
    expected = json.loads(path.read_bytes() if not gz else gzip.decompress(path.read_bytes()))
    got, trace = _events(path)
    assert got == [e for e in expected["traceEvents"] if isinstance(e, dict)]
    assert trace.skipped == len(expected["traceEvents"]) - len(got)
    assert trace.stopped is None
    assert trace.prelude == before
    with open_trace(path, DICTS) as again:
        assert again.epilogue() == after


class _Some(msgspec.Struct):
    """The keys a reader of a few of each event's keys takes."""

    ph: object = None
    name: object = None
    ts: object = None


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS, indent=st.sampled_from([None, 2]), small=st.booleans())
def test_a_few_keys_of_each_event_are_what_the_whole_events_hold(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    events: list[Any],
    indent: int | None,
    small: bool,
) -> None:
    """``Fields`` (msgspec, the other keys skipped unread) against whole events (orjson and the
    standard library): the same events, the same values of the keys it takes, the same items
    skipped, whatever the fallbacks taken."""
    if small:
        monkeypatch.setattr(_trace_stream, "BATCH", 64)
        monkeypatch.setattr(_trace_stream, "CHUNK", 16)
    path = tmp_path / "t.json"
    _write(path, json.dumps({"traceEvents": events}, indent=indent))
    whole, trace = _events(path)
    with open_trace(path, Fields(_Some)) as some:
        got = [e for batch in some.batches() for e in batch]
        assert some.skipped == trace.skipped and some.stopped is None
    assert [(e.ph, e.name, e.ts) for e in got] == [
        (e.get("ph"), e.get("name"), e.get("ts")) for e in whole
    ]


def test_a_few_keys_of_values_only_the_standard_library_reads(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(
        '{"traceEvents":[{"ph":"X","ts":NaN,"args":{"k":1}},{"ts":123456789012345678901234567890},'
        '{"name":"\\ud800","ts":1e999},5,{"name":"},{"}]}'
    )
    with open_trace(path, Fields(_Some)) as trace:
        got = [e for batch in trace.batches() for e in batch]
        assert trace.skipped == 1 and trace.stopped is None
    assert math.isnan(got[0].ts) and got[0].ph == "X"
    assert got[1].ts == 123456789012345678901234567890
    assert got[2].name == "\ud800" and got[2].ts == math.inf  # a lone surrogate
    assert got[3].name == "},{"


def test_the_array_form_and_values_orjson_refuses(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text('[{"ph":"X","ts":NaN},{"big":123456789012345678901234567890},{"s":"},{"}')
    got, trace = _events(path)  # Chrome takes an array without its closing bracket
    assert math.isnan(got[0]["ts"]) and got[1]["big"] == 123456789012345678901234567890
    assert got[2] == {"s": "},{"} and trace.stopped is None and trace.prelude == {}


@pytest.mark.parametrize("gz", [False, True])
def test_a_file_cut_mid_event_gives_the_events_before_the_cut(tmp_path: Path, gz: bool) -> None:
    events = [
        {"ph": "X", "name": f"e{i}", "ts": i, "dur": 1, "args": {"k": "v" * 50}}
        for i in range(2000)
    ]
    text = json.dumps({"baseTimeNanoseconds": 7, "traceEvents": events}).encode()
    cut = text[: len(text) // 2]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text)[: len(gzip.compress(text)) // 2] if gz else cut)
    got, trace = _events(path)
    assert 0 < len(got) < len(events) and got == events[: len(got)]
    assert isinstance(trace.stopped, EOFError)
    assert trace.prelude == {"baseTimeNanoseconds": 7}


def test_damage_mid_file_stops_the_reading_there(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents":[{"a":1},{"b":2},{"c":{]},{"d":4}]}')
    got, trace = _events(path)
    assert got == [{"a": 1}, {"b": 2}] and isinstance(trace.stopped, ValueError)


def test_the_clock_before_the_events_after_them_or_since_the_epoch(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    for text, clock in (
        ('{"baseTimeNanoseconds":5,"traceEvents":[{"ts":1}]}', 5),
        ('{"traceEvents":[{"ts":1}],"baseTimeNanoseconds":6}', 6),
        ('{"traceEvents":[{"ph":"M"},{"ts":1.7e15}]}', 0),
    ):
        path.write_text(text)
        with open_trace(path, DICTS) as trace:
            assert trace.clock_ns == clock
            assert [e for b in trace.batches() for e in b][-1]["ts"] in (1, 1.7e15)
    path.write_text('{"traceEvents":[{"ts":12}]}')
    with open_trace(path, DICTS) as trace, pytest.raises(ValueError, match="on no known clock"):
        _ = trace.clock_ns


@pytest.mark.parametrize(
    "text", ['{"traceEvents": []}', '{"traceEvents":[],"x":1}', "[]", '{"traceEvents":[ ]}']
)
def test_a_trace_without_events_is_whole_after_its_clock_was_looked_for(
    tmp_path: Path, text: str
) -> None:
    """Looking for the clock reads up to the events' end; the events read after it are none,
    and the trace is not cut short (a capture that saw nothing writes such a trace)."""
    path = tmp_path / "t.json"
    path.write_text(text)
    with open_trace(path, DICTS) as trace:
        with pytest.raises(ValueError, match="on no known clock"):
            _ = trace.clock_ns
        assert list(trace.batches()) == []
        assert (trace.stopped, trace.events_read) == (None, 0)


def test_what_is_no_trace_is_said(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    for text, error in (
        ("", "not a Chrome trace"),
        ("3", "not a Chrome trace"),
        ('{"traceEvents":3}', "no list"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=error), open_trace(path, DICTS):
            pass
    corrupt = tmp_path / "t.json.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    got, trace = _events_or(corrupt)
    assert got == [] and isinstance(trace, zlib.error)


def _events_or(path: Path) -> tuple[list[Any], BaseException | None]:
    try:
        with open_trace(path, DICTS) as trace:
            return [e for b in trace.batches() for e in b], trace.stopped
    except (ValueError, zlib.error, EOFError) as exc:
        return [], exc


def test_below_a_root_no_link_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "t.json").write_text('{"traceEvents":[]}')
    os.symlink(tmp_path / "real", tmp_path / "link")
    with open_trace_below(tmp_path, "real/t.json", DICTS) as trace:
        assert list(trace.batches()) == []
    for path in ("link/t.json", "../t.json", "/etc/passwd"):
        with pytest.raises(OSError), open_trace_below(tmp_path, path, DICTS):
            pass
