"""The receiver's bounds on what one export may cost: its spans and every field or JSON item
at any depth counted before they are built (a bomb of empty spans, events, attributes or
values is refused in the memory it came in; nesting past protobuf's limit is 400), and spans
filed only under steps the profiler began (a forged trace id never moves which steps are
taken)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from hypothesis import event, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from aprof._config import OtelConfig
from aprof._otel import OtelReceiver
from aprof._otel.receiver import KEEP_STEPS
from aprof._otel.spans import ITEMS_PER_SPAN, JSON, PROTOBUF, BodyError, decode

SALT = "0123456789abcdef"
FOUR_MIB = 4 << 20


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    n, head = len(payload), bytearray([field << 3 | 2])
    while n >= 0x80:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def _empty_spans_protobuf(count: int) -> bytes:
    """An export of ``count`` empty spans (two bytes each) in one scope."""
    return _ld(1, _ld(2, b"\x12\x00" * count))


def _empty_spans_json(count: int) -> bytes:
    spans = b",".join([b"{}"] * count)
    return b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + spans + b"]}]}]}"


def _json_in_span(fields: bytes) -> bytes:
    """An OTLP JSON export of one span whose fields are ``fields``."""
    return b'{"resourceSpans":[{"scopeSpans":[{"spans":[{' + fields + b"}]}]}]}"


def _export(steps: list[int], groups: int = 1) -> ExportTraceServiceRequest:
    """An export of one span per entry of ``steps`` (this run's trace of that step), spread
    over ``groups`` resources of one scope each."""
    request = ExportTraceServiceRequest()
    scopes = [request.resource_spans.add().scope_spans.add() for _ in range(groups)]
    for i, step in enumerate(steps):
        span = scopes[i % groups].spans.add()
        span.trace_id = bytes.fromhex(SALT) + (step % 2**64).to_bytes(8, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = "llm_request"
    return request


def _as_json(request: ExportTraceServiceRequest) -> bytes:
    data = json_format.MessageToDict(request)
    for resource in data.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId"):  # OTLP JSON: hex ids
                    span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(data).encode()


# -- what an export holds counted before it is built ------------------------------------------


def _budget(most: int) -> int:
    """The items an export of at most ``most`` spans may hold (docs/otel.md)."""
    return (most + 1) * ITEMS_PER_SPAN


def _in_span(span: bytes) -> bytes:
    """An export of one span (its fields ``span``) in one scope of one resource."""
    return _ld(1, _ld(2, _ld(2, span)))


def _nested_protobuf(levels: int, kvlists: int = 0) -> bytes:
    """An export whose one attribute's value is an array holding an array ... ``levels``
    deep, around ``kvlists`` lists of key-values one in another: ``6 + 2 * levels + 3 *
    kvlists`` messages nested, the export counted."""
    value = b""
    for _ in range(kvlists):
        value = _ld(6, _ld(1, _ld(2, value)))  # kvlist_value, KeyValueList.values, .value
    for _ in range(levels):
        value = _ld(5, _ld(1, value))  # AnyValue.array_value, ArrayValue.values
    return _in_span(_ld(9, _ld(2, value)))  # Span.attributes, KeyValue.value


def _fields(message: Message) -> int:
    """The fields ``message`` is on the wire, at any depth (counted from its parsed form)."""
    count = 0
    for field, value in message.ListFields():
        for item in value if field.is_repeated else [value]:
            count += 1
            if field.message_type is not None:
                count += _fields(item)
    return count


@pytest.mark.parametrize("content_type", [PROTOBUF, JSON])
def test_an_export_of_more_spans_than_the_bound_is_413(content_type: str) -> None:
    make = _empty_spans_protobuf if content_type == PROTOBUF else _empty_spans_json
    assert len(decode(make(100), content_type, 100)) == 100
    with pytest.raises(BodyError) as caught:
        decode(make(101), content_type, 100)
    assert caught.value.status == 413 and "otel.max_spans_per_body" in str(caught.value)


INNER: dict[str, Callable[[int], bytes]] = {
    "events": lambda n: _in_span(b"\x5a\x00" * n),
    "attributes": lambda n: _in_span(b"\x4a\x00" * n),
    "links": lambda n: _in_span(b"\x6a\x00" * n),
    "array values": lambda n: _in_span(_ld(9, _ld(2, _ld(5, b"\x0a\x00" * n)))),
    "kvlist values": lambda n: _in_span(_ld(9, _ld(2, _ld(6, b"\x0a\x00" * n)))),
    "event attributes": lambda n: _in_span(_ld(11, b"\x1a\x00" * n)),
    "resource attributes": lambda n: _ld(1, _ld(1, b"\x0a\x00" * n)),
    "scope attributes": lambda n: _ld(1, _ld(2, _ld(1, b"\x1a\x00" * n))),
    "entity id keys": lambda n: _ld(1, _ld(1, _ld(3, b"\x1a\x00" * n))),
    "empty resources": lambda n: b"\x0a\x00" * n,
    "kind fields": lambda n: _in_span(b"\x30\x01" * n),
}
"""Bombs inside one export of ``n`` two-byte fields (each an object protobuf builds, but for
the scalar ``kind`` repeated), by what they fill."""


@pytest.mark.parametrize("what", list(INNER))
@pytest.mark.parametrize("most", [1, 3])
def test_a_bomb_inside_a_span_is_413_when_its_fields_are_over_budget(what: str, most: int) -> None:
    """However the fields are nested (events, attributes, values in values, resources), an
    export of one field more than its budget is 413 and one of the budget is taken (both
    walked: two bytes a field at least, they are over twice the budget)."""
    fill = INNER[what]
    around = _fields(ExportTraceServiceRequest.FromString(fill(0)))
    at_budget = fill(_budget(most) - around)
    if what != "kind fields":  # a scalar repeated is one field once parsed
        assert _fields(ExportTraceServiceRequest.FromString(at_budget)) == _budget(most)
    assert len(decode(at_budget, PROTOBUF, most)) <= 1
    with pytest.raises(BodyError) as caught:
        decode(fill(_budget(most) - around + 1), PROTOBUF, most)
    assert caught.value.status == 413 and "protobuf fields" in str(caught.value)
    assert "otel.max_spans_per_body" in str(caught.value)


@pytest.mark.parametrize(
    ("what", "body"),
    [
        ("events", _json_in_span(b'"events":[' + b"{}," * 400 + b"{}]")),
        (
            "attributes",
            b'{"resourceSpans":[{"resource":{"attributes":[' + b"{}," * 400 + b"{}]}}]}",
        ),
        ("strings", b'{"resourceSpans":[],"x":[' + b'"ab",' * 800 + b'"ab"]}'),
        ("arrays", b'{"resourceSpans":[],"junk":[' + b",".join([b"[]"] * 650) + b"]}"),
    ],
)
def test_a_json_body_of_more_items_than_its_spans_may_hold_is_413(what: str, body: bytes) -> None:
    """A JSON body's objects, arrays, keys and values (each follows a ``{``, ``[``, ``,`` or
    ``:``) are bounded before json.loads builds them, strings and numbers as much as objects."""
    items = sum(body.count(mark) for mark in (b"{", b"[", b",", b":"))
    assert _budget(5) < items < _budget(20), what
    assert len(decode(body, JSON, 20)) <= 1
    with pytest.raises(BodyError) as caught:
        decode(body, JSON, 5)
    assert caught.value.status == 413 and f"this one {items}" in str(caught.value)


@pytest.mark.parametrize("most", [1, 8192])
def test_messages_nested_deeper_than_protobuf_takes_are_400(most: int) -> None:
    """100 messages below the export is protobuf's own limit: the walk (``most`` 1: a body
    over twice its budget) and protobuf's parse (8192) agree on it, and a body nested 5,000
    deep (beyond Python's recursion limit) is 400, never a RecursionError."""
    deepest = _nested_protobuf(46, kvlists=1)  # the export and 100 messages below it
    assert len(decode(deepest, PROTOBUF, most)) == 1
    for body in (_nested_protobuf(48), _nested_protobuf(47, kvlists=1), _nested_protobuf(5_000)):
        with pytest.raises(BodyError) as caught:
            decode(body, PROTOBUF, most)
        assert caught.value.status == 400 and "not an OTLP protobuf export" in str(caught.value)


def test_deep_json_is_400_not_a_recursion_error() -> None:
    values = '{"arrayValue":{"values":['
    for levels, body in (
        (200, values * 200 + "]}}" * 200),
        (50_000, "[" * 50_000 + "]" * 50_000),
    ):
        export = _json_in_span(b'"attributes":[{"key":"a","value":' + body.encode() + b"}]")
        with pytest.raises(BodyError) as caught:
            decode(export, JSON, 8192)
        assert caught.value.status == 400 and "not an OTLP JSON export" in str(caught.value), levels


PAD = _ld(15, b"x" * 300)
"""An unknown field of the export: a body after it is over twice the budget of one span, so
it is walked before protobuf parses it."""


@pytest.mark.parametrize("pad", [b"", PAD], ids=["parsed", "walked"])
@pytest.mark.parametrize(
    "body",
    [
        b"\x0a",  # a key, then nothing
        b"\x0a\x05\x12\x00",  # a length past the end
        _ld(1, b"\x12\x05\x00"),  # a span's length past its scope's end
        b"\x08" + b"\xff" * 11,  # a varint of 11 bytes
    ],
)
def test_broken_protobuf_framing_is_400(body: bytes, pad: bytes) -> None:
    with pytest.raises(BodyError) as caught:
        decode(pad + body, PROTOBUF, 1)
    assert caught.value.status == 400 and "not an OTLP protobuf export" in str(caught.value)


def test_a_walked_group_is_400() -> None:
    """No OTLP message has a group (a wire type protobuf deprecated): the walk takes none."""
    with pytest.raises(BodyError) as caught:
        decode(PAD + b"\x0b\x0c", PROTOBUF, 1)
    assert caught.value.status == 400 and "wire type 3" in str(caught.value)


def _any_value(draw: st.DrawFn, depth: int) -> AnyValue:
    value = AnyValue()
    kinds = ["string", "int", "empty", "array", "kvlist"]
    kind = draw(st.sampled_from(kinds if depth < 3 else kinds[:3]))
    if kind == "string":
        value.string_value = draw(st.text(max_size=3))
    elif kind == "int":
        value.int_value = draw(st.integers(-(2**63), 2**63 - 1))
    elif kind == "array":
        for _ in range(draw(st.integers(0, 6))):
            value.array_value.values.append(_any_value(draw, depth + 1))
    elif kind == "kvlist":
        for _ in range(draw(st.integers(0, 6))):
            kv = value.kvlist_value.values.add(key=draw(st.text(max_size=2)))
            kv.value.CopyFrom(_any_value(draw, depth + 1))
    return value


@st.composite
def _exports(draw: st.DrawFn) -> ExportTraceServiceRequest:
    """Exports of a few spans, each with events, links and attributes of nested values."""

    def attributes(holder: Any) -> None:
        for _ in range(draw(st.integers(0, 12))):
            kv = holder.attributes.add(key=draw(st.sampled_from(["a", "bb", ""])))
            kv.value.CopyFrom(_any_value(draw, 0))

    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        group = request.resource_spans.add()
        attributes(group.resource)
        scope = group.scope_spans.add()
        attributes(scope.scope)
        for i in range(draw(st.integers(0, 4))):
            span = scope.spans.add(name="s", span_id=(i + 1).to_bytes(8, "big"))
            span.trace_id = bytes.fromhex(SALT) + i.to_bytes(8, "big")
            attributes(span)
            for _ in range(draw(st.integers(0, 20))):
                attributes(span.events.add(name=draw(st.sampled_from(["", "e"]))))
            for _ in range(draw(st.integers(0, 3))):
                attributes(span.links.add(span_id=b"\x01" * 8))
    return request


@given(request=_exports(), most=st.integers(1, 8))
@settings(max_examples=100, deadline=None)
def test_decode_takes_an_export_whole_exactly_when_within_its_budget(
    request: ExportTraceServiceRequest, most: int
) -> None:
    """Any export, however its fields nest: taken whole (each span) when it holds at most
    ``most`` spans and ``(most + 1) * ITEMS_PER_SPAN`` fields, else 413 (walked or not)."""
    body = request.SerializeToString()
    spans = sum(len(s.spans) for g in request.resource_spans for s in g.scope_spans)
    event("walked" if len(body) > 2 * _budget(most) else "parsed")
    event("413" if spans > most or _fields(request) > _budget(most) else "taken")
    if spans > most or _fields(request) > _budget(most):
        with pytest.raises(BodyError) as caught:
            decode(body, PROTOBUF, most)
        assert caught.value.status == 413
        return
    assert len(decode(body, PROTOBUF, most)) == spans


@given(
    steps=st.lists(st.integers(0, 2**64 - 1), max_size=40),
    groups=st.integers(1, 5),
    bound=st.integers(1, 40),
)
@settings(max_examples=60, deadline=None)
def test_decode_takes_an_export_within_the_bound_whole(
    steps: list[int], groups: int, bound: int
) -> None:
    """Any export is taken whole (every span, same ids either form) when it holds at most
    ``bound`` spans, and refused with 413 otherwise."""
    request = _export(steps, groups)
    for content_type, body in ((PROTOBUF, request.SerializeToString()), (JSON, _as_json(request))):
        if len(steps) > bound:
            with pytest.raises(BodyError) as caught:
                decode(body, content_type, bound)
            assert caught.value.status == 413
            continue
        spans = decode(body, content_type, bound)
        assert sorted(int(s["trace_id"][16:], 16) for s in spans) == sorted(steps)


BOMBS_RSS = textwrap.dedent(
    """
    import json, sys
    from aprof._otel.spans import BodyError, decode

    def peak_kib():  # VmHWM: ru_maxrss would start at the forking process's RSS
        with open("/proc/self/status") as status:
            return int(next(l for l in status if l.startswith("VmHWM:")).split()[1])

    bombs = json.load(open(sys.argv[1]))
    try:
        decode(b"{}", "application/json", 10)  # what decode imports, before the measure
    except BodyError:
        pass
    statuses = []
    before = peak_kib()
    for path, content_type in bombs:
        body = open(path, "rb").read()
        try:
            decode(body, content_type, 8192)
            statuses.append(200)
        except BodyError as exc:
            statuses.append(exc.status)
        del body
    print(json.dumps([statuses, (peak_kib() - before) // 1024]))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_four_mib_bombs_cost_no_memory(tmp_path: Path) -> None:
    """Two million empty spans, events, attributes, array values or entity keys in 4 MiB of
    protobuf (they once took the run 64 to 1,441 MiB), a million empty events or attributes
    or strings in 4 MiB of JSON: each refused in the memory it came in (peak RSS of a fresh
    process, in MiB, growing by less than one bomb's body)."""
    half = (FOUR_MIB - 64) // 2
    bodies = [(_empty_spans_protobuf(half), PROTOBUF), (_empty_spans_json(half * 2 // 3), JSON)]
    bodies += [(INNER[what](half), PROTOBUF) for what in ("events", "attributes", "array values")]
    bodies.append((INNER["entity id keys"](half), PROTOBUF))
    bodies.append((_json_in_span(b'"events":[' + b"{}," * (half * 2 // 3) + b"{}]"), JSON))
    bodies.append((b'{"resourceSpans":[],"x":[' + b'"ab",' * (half * 2 // 5) + b'"ab"]}', JSON))
    listed = []
    for i, (body, content_type) in enumerate(bodies):
        assert len(body) <= FOUR_MIB
        (tmp_path / str(i)).write_bytes(body)
        listed.append((str(tmp_path / str(i)), content_type))
    (tmp_path / "bombs.json").write_text(json.dumps(listed))
    out = subprocess.run(
        [sys.executable, "-c", BOMBS_RSS, str(tmp_path / "bombs.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    statuses, grown = json.loads(out)
    assert statuses == [413] * len(bodies)
    assert grown < 4  # MiB over the bodies' own; 64 to 1,441 before the bounds


# -- spans filed only under steps begun -------------------------------------------------------


def _receiver(root: Path, **config: Any) -> OtelReceiver:
    """A receiver whose thread-side filing is called directly (no server, no thread)."""
    return OtelReceiver(
        OtelConfig(receive=True, **config),
        root=root,
        salt=SALT,
        on_taken=lambda spans, dropped: None,
    )


def _files(root: Path) -> dict[str, int]:
    folder = root / "otel"
    if not folder.exists():
        return {}
    return {p.name: len(p.read_text().splitlines()) for p in folder.iterdir()}


def test_a_span_of_a_far_step_is_set_aside_and_moves_nothing(tmp_path: Path) -> None:
    """A span naming step 2**62 (or any step not begun) is counted, not filed, and the
    steps begun keep their spans after it."""
    receiver = _receiver(tmp_path)
    for n in (1, 2, 3):
        receiver.step_began(n, n)
    far = [2**62, 2**64 - 2, 0, 4, 10**6]
    assert receiver._take(_export(far).SerializeToString(), PROTOBUF) == len(far)
    assert receiver._take(_export([1, 3]).SerializeToString(), PROTOBUF) == 0
    assert _files(tmp_path) == {"step_1.spans.jsonl": 1, "step_3.spans.jsonl": 1}
    assert (receiver.counts.spans, receiver.counts.dropped) == (2, len(far))


def test_no_step_is_taken_before_the_first_begins(tmp_path: Path) -> None:
    receiver = _receiver(tmp_path)
    assert receiver._take(_export([1, 2]).SerializeToString(), PROTOBUF) == 2
    assert _files(tmp_path) == {}


def test_steps_begun_long_ago_are_set_aside(tmp_path: Path) -> None:
    receiver = _receiver(tmp_path)
    for n in range(1, KEEP_STEPS + 3):
        receiver.step_began(n, n)
    assert receiver._take(_export([1, 2, 3]).SerializeToString(), PROTOBUF) == 1
    assert set(_files(tmp_path)) == {"step_2.spans.jsonl", "step_3.spans.jsonl"}


@given(
    events=st.lists(
        st.one_of(
            st.tuples(st.just("begin"), st.integers(1, 600)),
            st.tuples(
                st.just("send"),
                st.lists(
                    st.one_of(
                        st.integers(0, 700),
                        st.sampled_from([2**62, 2**63, 2**64 - 2, 2**64 - 1]),
                    ),
                    min_size=1,
                    max_size=12,
                ),
            ),
        ),
        max_size=30,
    )
)
@settings(max_examples=80, deadline=None)
def test_files_are_of_live_steps_and_every_span_is_counted(
    events: list[tuple[str, Any]],
) -> None:
    """Whatever steps begin and whatever steps spans name (huge, zero, far ahead or far
    behind): a step's file exists only for a step begun (among the last ``KEEP_STEPS``) at
    the time its span came, and kept + set aside = sent."""
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        receiver = _receiver(root, max_spans_per_step=5)
        began: list[int] = []
        expected: dict[str, int] = {}
        sent = 0
        for kind, value in events:
            if kind == "begin":
                receiver.step_began(value, len(began))
                began = [*began[-KEEP_STEPS:], value]
                continue
            live = set(began)
            for step in value:
                name = "no_step.spans.jsonl" if step == 2**64 - 1 else f"step_{step}.spans.jsonl"
                if step in live or step == 2**64 - 1:
                    expected[name] = min(5, expected.get(name, 0) + 1)
            receiver._take(_export(value).SerializeToString(), PROTOBUF)
            sent += len(value)
        assert _files(root) == expected
        assert receiver.counts.spans == sum(expected.values())
        assert receiver.counts.spans + receiver.counts.dropped == sent
