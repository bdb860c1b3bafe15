"""The recorder's contract, for the C extension (``aprof/_timeline/_recorder.c``) and its
pure-Python twin (``pyrecorder.py``) alike: what an event holds after the trip through
marshal's bytes, room and dropping, spans and requests as context managers, and that none of it
leaks references; and, for the C one, that none of it burdens the garbage collector.

Tests that take ``impl`` run once per recorder; those through a ``Profiler`` run the recorder
this process chose (``aprof.timeline_backend()``), which ``.ci/run`` runs once with each."""

from __future__ import annotations

import enum
import gc
import marshal
import math
import sys
import time
from collections import namedtuple
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from recorders import Impl, both, c_recorder

import aprof
from aprof._timeline import recorder as chosen
from aprof._timeline.events import REQUEST, SPAN
from aprof._timeline.timeline import OPEN_AT_CLOSE
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


def _no_room_expected() -> None:
    raise AssertionError("on_full was called")


def recorder(impl: Impl, room: int = 10_000) -> Any:
    """A recorder with room for ``room`` events that fails the test if it fills up."""
    rec = impl.Recorder(_no_room_expected)
    rec.room = room
    return rec


def gate(impl: Impl, step: int | None = None) -> Any:
    """A gate of ``impl`` at ``step`` whose step has no rollout windows (nothing is admitted)."""
    made = impl.Gate(_nothing_admitted)
    made.step = step
    return made


def _nothing_admitted(request: object) -> None:
    raise AssertionError("admit was called")


def taken(rec: Any) -> list[Any]:
    """The recorder's events, read back the way the writer process reads them."""
    events = marshal.loads(rec.take())
    assert isinstance(events, list)
    return events


def same(a: object, b: object) -> bool:
    """Equal and of the same type, all the way down; nan equals nan, -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        assert isinstance(b, float)
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# -- 1. encoding ---------------------------------------------------------------------------

EDGE_INTS = [
    0,
    1,
    -1,
    2**15 - 1,
    2**15,
    -(2**15),
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**32,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    -(2**64),
    2**200,
    -(2**200) + 1,
]
ints = st.integers() | st.sampled_from(EDGE_INTS) | st.integers(-(2**300), 2**300)
chars = st.characters() | st.characters(categories=["Cs"])  # lone surrogates too


def _stretched(pattern: str, length: int) -> str:
    return (pattern * length)[:length]


# Long strings cross the short form's 255 limit; made by repeating a short one, which is as
# good a test of the length field and much cheaper to generate.
long_texts = st.builds(
    _stretched,
    st.text(st.characters(max_codepoint=127), min_size=1, max_size=8) | st.text(chars, min_size=1),
    st.integers(250, 300),
)
texts = (
    st.text(chars, max_size=20)
    | long_texts
    | st.sampled_from(["", "\udcff", "a\ud800b", "x" * 255, "x" * 256])
)
leaves = st.none() | st.booleans() | ints | st.floats() | texts


def _depth(value: object) -> int:
    return 1 + max(map(_depth, value), default=0) if isinstance(value, tuple) else 0


def _long_tuple(items: list[object], length: int) -> tuple[object, ...]:
    return tuple(items[i % len(items)] for i in range(length))


# An event's items are written at depth 1 and a tuple from depth 8 on as its str() (M_DEPTH):
# values nest at most 7 tuples deep, so each comes back as it was.
values = st.recursive(
    leaves
    | st.builds(_long_tuple, st.lists(leaves, min_size=1, max_size=4), st.integers(256, 300)),
    lambda inner: st.lists(inner, max_size=4).map(tuple),
    max_leaves=8,
).filter(lambda value: _depth(value) <= 7)
events = st.lists(values, max_size=6).map(tuple)

BIG_TUPLE = tuple(range(-150, 150))


def _nested(levels: int, inner: tuple[Any, ...]) -> tuple[Any, ...]:
    for _ in range(levels):
        inner = (inner,)
    return inner


DEEPEST = _nested(7, ("at depth 7", 1.5))
"""An event whose innermost tuple is at depth 7, the deepest written as a tuple."""


@both
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(events, min_size=1, max_size=3))
@example(batch=[tuple(EDGE_INTS)])
@example(batch=[(math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, sys.float_info.max)])
@example(batch=[("\udcff", "a" * 300, "ü" * 300, "", "\U0001f600")])
@example(batch=[BIG_TUPLE, (BIG_TUPLE, ((BIG_TUPLE,),))])
@example(batch=[DEEPEST])
def test_events_of_plain_values_come_back_equal_and_in_order(
    impl: Impl, batch: list[tuple[Any, ...]]
) -> None:
    """None, bools, ints of any size, floats (nan, inf, -0.0), any str (lone surrogates too)
    and tuples of them (more than 255 items too) come back as recorded, in order."""
    rec = recorder(impl)
    for event in batch:
        rec.add(event)
    assert rec.count == len(batch)
    back = taken(rec)
    assert same(tuple(back), tuple(batch)), (back, batch)


@both
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=values, attrs=st.dictionaries(texts, values, max_size=4), step=st.none() | ints)
def test_a_span_of_plain_values_comes_back_with_its_attrs_flat(
    impl: Impl, name: Any, attrs: dict[str, Any], step: int | None
) -> None:
    """``(SPAN, name, begin, end, step, note, *keys, *values)``, the attrs in their order."""
    rec = recorder(impl)
    with impl.Span(rec, name, attrs, step):
        pass
    [(kind, back_name, _, _, back_step, note, *rest)] = taken(rec)
    assert same(
        (kind, back_name, back_step, note, *rest),
        (SPAN, name, step, None, *attrs.keys(), *attrs.values()),
    )


@both
def test_values_of_other_types_come_back_as_their_str(impl: Impl) -> None:
    """A list, a dict, a set, a Path, bytes, a Decimal, a complex, any object: its str()."""

    class Named:
        def __str__(self) -> str:
            return "named ü"

    others: list[object] = [
        [1, "a"],
        {"k": (1, 2)},
        {3},
        Path("/tmp/x y"),
        b"\x00b",
        Decimal("1.10"),
        1 + 2j,
        Named(),
        object,
    ]
    rec = recorder(impl)
    rec.add(tuple(others))
    rec.add(((others[0], (others[3],)),))  # inside nested tuples as well
    assert taken(rec) == [tuple(str(v) for v in others), ((str(others[0]), (str(others[3]),)),)]


@both
def test_tuples_nested_deeper_than_the_limit_come_back_as_their_str(impl: Impl) -> None:
    """The tuple at depth 8 (the event is depth 0) is written as its str(), not followed."""
    inner = (1,)
    rec = recorder(impl)
    rec.add(_nested(8, inner))
    with impl.Span(rec, "span", {"k": _nested(7, inner)}, None):  # a span's values are at depth 1
        pass
    added, span = taken(rec)
    assert added == _nested(7, (str(inner),))
    assert span[-2:] == ("k", _nested(6, (str(inner),)))


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    def __str__(self) -> str:
        return "not the value"


class Number(int):
    def __str__(self) -> str:
        return "not the value"


class Real(float):
    def __str__(self) -> str:
        return "not the value"


Pair = namedtuple("Pair", "left right")


@both
def test_subclasses_of_plain_types_come_back_as_their_base_value(impl: Impl) -> None:
    """A str, int, float or tuple subclass is written as its value, of the base type (its own
    ``__str__`` is not used)."""
    rec = recorder(impl)
    rec.add(
        (
            Text("ü text"),
            Text("ascii"),
            Number(7),
            Number(-(2**70)),
            Number(2**70),
            Real(-0.5),
            Colour.RED,
            Pair(1, Pair("a", None)),
        )
    )
    rec.add(Pair("event", "itself"))
    back, pair = taken(rec)
    assert same(back, ("ü text", "ascii", 7, -(2**70), 2**70, -0.5, 1, (1, ("a", None))))
    assert same(pair, ("event", "itself"))


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("no str for you")


class WrongStr:
    def __str__(self) -> str:
        return 5  # type: ignore[return-value]  # str() raises TypeError for it


@both
def test_a_value_whose_str_fails_comes_back_as_unprintable_and_its_type(impl: Impl) -> None:
    """A failing str() does not break the code being recorded: the type name stands in."""
    rec = recorder(impl)
    rec.add((Unprintable(), "kept", (WrongStr(),)))
    with impl.Span(rec, "span", {"bad": Unprintable()}, None):
        pass
    add, span = taken(rec)
    assert add == ("<unprintable Unprintable>", "kept", ("<unprintable WrongStr>",))
    assert span[-2:] == ("bad", "<unprintable Unprintable>")


class RecordsWhenShown:
    """A value whose str() records a span into the same recorder, or takes its events."""

    def __init__(self, impl: Impl, rec: Any, take: bool = False) -> None:
        self.impl, self.rec, self.take = impl, rec, take
        self.taken: list[Any] = []

    def __str__(self) -> str:
        if self.take:
            self.taken = marshal.loads(self.rec.take())
        else:
            with self.impl.Span(self.rec, "inner", {}, None):
                pass
        return "shown"


@both
def test_a_str_that_records_or_takes_leaves_every_event_whole(impl: Impl) -> None:
    """str() runs before the event is written: what it records comes first, whole, and a
    take() inside it gets the events before, not half of this one."""
    rec = recorder(impl)
    rec.add(("outer", RecordsWhenShown(impl, rec), "end"))
    with impl.Span(rec, "span", {"value": RecordsWhenShown(impl, rec)}, None):
        pass
    inner, outer, inner_too, span = taken(rec)
    assert inner[:2] == inner_too[:2] == (SPAN, "inner")
    assert outer == ("outer", "shown", "end")
    assert span[1] == "span" and span[-2:] == ("value", "shown")

    rec.add(("first",))
    taking = RecordsWhenShown(impl, rec, take=True)
    rec.add(("second", taking))
    assert taking.taken == [("first",)]
    assert taken(rec) == [("second", "shown")]


class SaysNotNegative(int):
    def __lt__(self, other: object) -> bool:
        return False

    def __neg__(self) -> int:
        raise AssertionError("the recorder negated the subclass")


@both
def test_an_int_subclass_beyond_64_bits_is_written_as_its_value(impl: Impl) -> None:
    """The sign and digits of a big int come from the exact int, not the subclass's own
    operators (one that lied about its sign once made the recorder loop forever)."""
    rec = recorder(impl)
    rec.add((SaysNotNegative(-(2**70) - 5), SaysNotNegative(2**80)))
    assert taken(rec) == [(-(2**70) - 5, 2**80)]


@both
@pytest.mark.parametrize("event", [[1, 2], None, "event", 3, {"a": 1}])
def test_add_of_anything_but_a_tuple_raises_type_error(impl: Impl, event: object) -> None:
    rec = recorder(impl)
    with pytest.raises(TypeError, match=f"an event is a tuple, not {type(event).__name__}"):
        rec.add(event)  # type: ignore[arg-type]
    assert (rec.count, rec.dropped, taken(rec)) == (0, 0, [])


# -- 2. room and dropping ------------------------------------------------------------------


@both
def test_an_event_past_the_room_calls_on_full_once_and_is_dropped_and_counted(impl: Impl) -> None:
    calls: list[int] = []
    rec = impl.Recorder(lambda: calls.append(rec.count))
    rec.room = 2
    rec.add(("a",))
    rec.add(("b",))
    assert calls == []
    rec.add(("c",))
    assert (calls, rec.count, rec.dropped) == ([2], 2, 1)
    with impl.Span(rec, "no room", {}, None) as span:
        pass
    assert (calls, rec.count, rec.dropped) == ([2, 2], 2, 2)
    assert span not in rec.open
    assert taken(rec) == [("a",), ("b",)]
    assert rec.dropped == 2  # over the recorder's life: a take does not reset it


@both
def test_an_on_full_that_takes_the_events_and_raises_the_room_makes_the_event_fit(
    impl: Impl,
) -> None:
    handed: list[list[Any]] = []

    def hand_over() -> None:
        handed.append(taken(rec))
        rec.room = 3

    rec = impl.Recorder(hand_over)
    rec.room = 2
    for name in "abcd":
        rec.add((name,))
    with impl.Span(rec, "e", {}, None):
        pass
    assert handed == [[("a",), ("b",)]]
    assert (rec.count, rec.dropped) == (3, 0)
    assert [event[:2] for event in taken(rec)] == [("c",), ("d",), (SPAN, "e")]


@both
def test_take_empties_the_recorder(impl: Impl) -> None:
    rec = recorder(impl)
    rec.add((1,))
    rec.add((2,))
    assert taken(rec) == [(1,), (2,)]
    assert rec.count == 0
    assert taken(rec) == []
    rec.add((3,))
    assert taken(rec) == [(3,)]


class Full(Exception):
    """What a failing on_full raises."""


def _raise_full() -> None:
    raise Full("no room")


@both
def test_an_on_full_that_raises_propagates_out_of_add(impl: Impl) -> None:
    rec = impl.Recorder(_raise_full)
    rec.room = 1
    rec.add(("kept",))
    with pytest.raises(Full, match="no room"):
        rec.add(("lost",))
    assert (rec.count, rec.dropped, taken(rec)) == (1, 0, [("kept",)])


@both
async def test_an_on_full_that_raises_propagates_out_of_a_span_exit(impl: Impl) -> None:
    """From ``__exit__`` and ``__aexit__`` alike; the span is not left open."""
    rec = impl.Recorder(_raise_full)
    rec.room = 0
    span = impl.Span(rec, "sync", {}, None)
    with pytest.raises(Full), span:
        pass
    aspan = impl.Span(rec, "async", {}, None)
    with pytest.raises(Full):
        async with aspan:
            pass
    assert span not in rec.open and aspan not in rec.open
    assert (rec.count, rec.dropped) == (0, 0)


# -- 3. spans ------------------------------------------------------------------------------


@both
def test_a_span_records_its_name_times_step_and_attrs_on_the_monotonic_clock(impl: Impl) -> None:
    rec = recorder(impl)
    before = time.monotonic_ns()
    with impl.Span(rec, "turn", {"a": 1, "b": "x"}, 3) as span:
        assert isinstance(span, impl.Span)
        assert span in rec.open
        inside = time.monotonic_ns()
    after = time.monotonic_ns()
    assert span not in rec.open
    [(kind, name, begin, end, step, note, *rest)] = taken(rec)
    assert (kind, name, step, note, rest) == (SPAN, "turn", 3, None, ["a", "b", 1, "x"])
    assert before <= begin <= inside <= end <= after


@both
async def test_async_with_span_records_the_same_and_aenter_awaits_to_the_span(impl: Impl) -> None:
    rec = recorder(impl)
    before = time.monotonic_ns()
    async with impl.Span(rec, "turn", {"a": 1, "b": "x"}, 3) as span:
        assert span in rec.open
    after = time.monotonic_ns()
    assert span not in rec.open
    [(kind, name, begin, end, step, note, *rest)] = taken(rec)
    assert (kind, name, step, note, rest) == (SPAN, "turn", 3, None, ["a", "b", 1, "x"])
    assert before <= begin <= end <= after
    other = impl.Span(rec, "awaited", {}, None)
    assert await other.__aenter__() is other
    assert await other.__aexit__(None, None, None) is None
    assert [e[:2] for e in taken(rec)] == [(SPAN, "awaited")]


class Planned(Exception):
    """Raised by a test's span body."""


@both
@pytest.mark.parametrize("error", [Planned, KeyError, KeyboardInterrupt])
async def test_an_exception_in_the_body_is_the_note_and_is_not_swallowed(
    impl: Impl,
    error: type[BaseException],
) -> None:
    rec = recorder(impl)
    with pytest.raises(error), impl.Span(rec, "sync", {}, None):
        raise error("body failed")
    with pytest.raises(error):
        async with impl.Span(rec, "async", {}, None):
            raise error("body failed")
    assert [(e[1], e[5]) for e in taken(rec)] == [
        ("sync", error.__name__),
        ("async", error.__name__),
    ]
    assert rec.open == []


@both
def test_a_span_ended_at_close_is_recorded_once(impl: Impl) -> None:
    """``_end`` records the span with the given end and note; its own exit later adds
    nothing, nor does a second ``_end``."""
    rec = recorder(impl)
    span = impl.Span(rec, "left open", {"k": "v"}, 2)
    span.__enter__()
    span._end(2**40, OPEN_AT_CLOSE)
    assert span not in rec.open
    span.__exit__(None, None, None)
    span._end(2**41, "again")
    [(kind, name, begin, end, step, note, *rest)] = taken(rec)
    assert (kind, name, end, step, note, rest) == (
        SPAN,
        "left open",
        2**40,
        2,
        OPEN_AT_CLOSE,
        ["k", "v"],
    )
    assert begin > 0


@both
def test_a_span_ended_before_it_began_records_nothing(impl: Impl) -> None:
    rec = recorder(impl)
    span = impl.Span(rec, "never entered", {}, None)
    span._end(1, OPEN_AT_CLOSE)
    span.__exit__(None, None, None)
    assert taken(rec) == []


@both
def test_the_awaitables_complete_through_the_iterator_protocol(impl: Impl) -> None:
    """The path ``await`` takes while a trace function is set: ``next`` raises StopIteration
    carrying the result at once."""
    rec = recorder(impl)
    span = impl.Span(rec, "iterated", {}, None)
    entering = span.__aenter__().__await__()  # type: ignore[attr-defined]
    with pytest.raises(StopIteration) as entered:
        next(entering)
    assert entered.value.value is span
    assert span in rec.open
    exiting = span.__aexit__(None, None, None).__await__()  # type: ignore[attr-defined]
    with pytest.raises(StopIteration) as exited:
        next(exiting)
    assert exited.value.value is None
    assert [e[:2] for e in taken(rec)] == [(SPAN, "iterated")]


def _tracer(frame: FrameType, event: str, arg: object) -> None:
    return None


@both
@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
def test_async_with_a_span_never_suspends_with_or_without_a_trace_function(
    impl: Impl, traced: bool
) -> None:
    """Driven by hand, the coroutine finishes on its first send: nothing in it waits."""
    rec = recorder(impl)

    async def body() -> Any:
        async with impl.Span(rec, "inner", {}, None) as inner:
            assert inner in rec.open
        async with impl.Span(rec, "outer", {"n": 1}, None) as span:
            with pytest.raises(Planned):
                async with impl.Span(rec, "failing", {}, None):
                    raise Planned
        return span

    coro = body()
    old = sys.gettrace()
    if traced:
        sys.settrace(_tracer)
    try:
        with pytest.raises(StopIteration) as done:
            coro.send(None)
    finally:
        sys.settrace(old)
    assert isinstance(done.value.value, impl.Span)
    assert [(e[1], e[5]) for e in taken(rec)] == [
        ("inner", None),
        ("failing", "Planned"),
        ("outer", None),
    ]
    assert rec.open == []


@both
async def test_span_and_request_under_a_trace_function_in_a_running_loop(impl: Impl) -> None:
    rec = recorder(impl)
    old = sys.gettrace()
    sys.settrace(_tracer)
    try:
        async with (
            impl.Span(rec, "traced", {}, None) as span,
            impl.Request(gate(impl), rec, 0, "traced") as req,
        ):
            req.forward(4)
    finally:
        sys.settrace(old)
    assert isinstance(span, impl.Span) and isinstance(req, impl.Request)
    request, recorded_span = taken(rec)
    assert (request[0], request[4], request[8]) == (REQUEST, "traced", 4)
    assert recorded_span[:2] == (SPAN, "traced")


# -- 4. the garbage collector and references -----------------------------------------------


@pytest.mark.skipif(aprof.timeline_backend() != "c", reason="the C recorder's property")
async def test_spans_and_requests_are_not_tracked_by_the_gc_and_the_recorder_is(
    make_config: MakeConfig,
) -> None:
    """The C types only: the twin's spans and requests are ordinary objects."""
    impl = c_recorder
    rec = recorder(impl)
    span = impl.Span(rec, "s", {"a": [1]}, None)
    req = impl.Request(gate(impl), rec, 0, "r")
    assert not gc.is_tracked(span)
    assert not gc.is_tracked(req)
    assert gc.is_tracked(rec)
    async with req, span:
        assert not gc.is_tracked(span) and not gc.is_tracked(req)
    async with aprof.Profiler(make_config()) as prof:
        assert not gc.is_tracked(prof.request(replica=0))
        assert not gc.is_tracked(prof.span("s"))


def _fresh(*parts: str) -> str:
    """A str built at run time: its own object, not an interned constant shared elsewhere."""
    return "".join(parts)


@both
def test_a_span_copies_its_attrs_and_holds_no_dict(impl: Impl) -> None:
    """An open span holds its attrs' keys and values, not the caller's dict: a dict kept per
    open span made full garbage collections of many waiting agent loops longer."""
    rec = recorder(impl)
    attrs: dict[str, Any] = {"trajectory": _fresh("s", "1"), "turn": 1}
    before = sys.getrefcount(attrs)
    with impl.Span(rec, "turn", attrs, None):
        assert sys.getrefcount(attrs) == before
        attrs["turn"] = 2  # the attrs are the span's from when it was made
    (event,) = taken(rec)
    assert event[-4:] == ("trajectory", "turn", "s1", 1)


@both
def test_recording_keeps_no_references_to_names_attrs_or_steps(impl: Impl) -> None:
    rec = recorder(impl, room=3000)
    name = _fresh("span", "-name-", str(12345))
    key = _fresh("attr", "-key-", str(678))
    value = 10**40 + 7
    step = 10**30 + 3
    event_text = _fresh("event", "-text")
    objects = [name, key, value, step, event_text, rec]
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(1000):
        with impl.Span(rec, name, {key: value}, step):
            pass
    for _ in range(1000):
        rec.add((event_text, (key, value), step))
    back = taken(rec)
    assert len(back) == 2000
    assert back[0] == (SPAN, name, back[0][2], back[0][3], step, None, key, value)
    assert back[-1] == (event_text, (key, value), step)
    del back
    assert [sys.getrefcount(o) for o in objects] == before


@both
async def test_requests_keep_no_references(impl: Impl) -> None:
    rec = recorder(impl, room=2000)
    at = gate(impl, 10**25 + 1)
    replica = 10**20 + 1
    request_id = _fresh("request", "-id-", str(99))
    trajectory, other = _fresh("trajectory", "-", str(7)), _fresh("other", "-", str(8))
    objects = [at, at.step, rec, replica, request_id, trajectory, other]
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(1000):
        async with impl.Request(at, rec, replica, request_id) as req:
            req.forward(1)
            req.trajectory = other
            req.trajectory = _Trajectory(other)  # copied: the subclass is not kept
            req.trajectory = trajectory
            with pytest.raises(ValueError):
                req.trajectory = "x" * 257
            req.turn = 3
    del req
    events = taken(rec)
    assert len(events) == 1000
    assert events[-1][10:] == (trajectory, 3, None)
    del events
    assert [sys.getrefcount(o) for o in objects] == before


# -- 5. requests ---------------------------------------------------------------------------


@both
async def test_forward_adds_up_tokens_and_checks_its_argument(impl: Impl) -> None:
    """The argument errors are the C recorder's own words; the twin's are Python's."""
    async with impl.Request(gate(impl), None, 0, "r1") as req:
        req.forward(tokens=3)
        req.forward(2)
        req.forward()
        assert req.tokens == 5
        with pytest.raises(TypeError, match="unexpected keyword argument 'token'"):
            req.forward(token=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="tokens must be an int, not str"):
            req.forward("3")  # type: ignore[arg-type]
        at_most_one = "at most 1 argument" if impl is c_recorder else "argument"
        with pytest.raises(TypeError, match=at_most_one):
            req.forward(1, tokens=2)  # type: ignore[misc]
        with pytest.raises(TypeError, match=at_most_one):
            req.forward(1, 2)  # type: ignore[call-arg]
        assert req.tokens == 5
        req.forward(2**63 - 6)
        with pytest.raises(OverflowError, match="beyond 64 bits"):
            req.forward(1)
        with pytest.raises(OverflowError):
            req.forward(2**64)
        assert req.tokens == 2**63 - 1


@both
async def test_request_flags_are_bools_and_its_identity_is_read_only(impl: Impl) -> None:
    async with impl.Request(gate(impl, 1), None, 0, "r1") as req:
        assert (req.replica, req.request_id, req.step) == (0, "r1", 1)
        assert (req.gated, req.captured, req.tokens, req.prompt_tokens) == (False, False, 0, 0)
        assert (req.trajectory, req.turn) == (None, None)
        with pytest.raises(TypeError):
            req.gated = 1  # type: ignore[assignment]
        with pytest.raises(TypeError):
            req.captured = "yes"  # type: ignore[assignment]
        req.gated = True
        for field in ("replica", "request_id", "step", "tokens"):
            with pytest.raises(AttributeError):
                setattr(req, field, 2)
        assert repr(req) == (
            "Request(replica=0, request_id='r1', step=1, gated=True, captured=False)"
        )
    assert impl.Request(gate(impl), None, 3, None).request_id is None


@both
async def test_a_request_records_replica_id_step_flags_tokens_prompt_and_note(
    impl: Impl,
    make_config: MakeConfig,
) -> None:
    """Through the profiler's own recorder, read before the step's end takes it, and through
    a recorder and gate of the test's own."""
    async with aprof.Profiler(make_config()) as prof:
        assert prof._timeline.recorder is not None
        async with prof.step(1):
            before = time.monotonic_ns()
            async with prof.request(replica=0, request_id="r1") as req:
                req.forward(tokens=5)
                req.prompt_tokens = 12
                req.captured = True
            after = time.monotonic_ns()
            [(kind, begin, end, *rest)] = taken(prof._timeline.recorder)
            assert kind == REQUEST
            assert before <= begin <= end <= after
            assert rest == [0, "r1", 1, False, True, 5, 12, None, None, None]

            rec = recorder(impl)
            own = impl.Request(gate(impl, prof.current_step), rec, 2, None)
            with pytest.raises(Planned):
                async with own:
                    own.gated = True
                    own.forward(2**40)
                    raise Planned
            assert own not in rec.open
            [(kind, begin, end, *rest)] = taken(rec)
            assert (kind, rest) == (
                REQUEST,
                [2, None, 1, True, False, 2**40, 0, None, None, "Planned"],
            )
        async with prof.request(replica=1) as outside:
            pass
        assert outside.step is None


class _Prompt(int):
    """An int subclass that overrides what it can: the request keeps its int value."""

    def __index__(self) -> int:
        raise AssertionError("__index__ was called")

    def __lt__(self, other: object) -> bool:
        raise AssertionError("__lt__ was called")


@both
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "prompt_tokens must be an int, not bool"),
        (False, TypeError, "prompt_tokens must be an int, not bool"),
        ("3", TypeError, "prompt_tokens must be an int, not str"),
        (3.0, TypeError, "prompt_tokens must be an int, not float"),
        (None, TypeError, "prompt_tokens must be an int, not NoneType"),
        (-1, ValueError, "prompt_tokens must be >= 0"),
        (-(2**63), ValueError, "prompt_tokens must be >= 0"),
        (-(2**70), ValueError, "prompt_tokens must be >= 0"),
        (2**63, OverflowError, "prompt_tokens must fit in 64 bits"),
        (2**70, OverflowError, "prompt_tokens must fit in 64 bits"),
    ],
)
def test_prompt_tokens_refuses_what_is_not_an_int_of_64_bits_at_least_0(
    impl: Impl, value: object, error: type[Exception], message: str
) -> None:
    """The same error and words from both recorders; the value before stays."""
    req = impl.Request(gate(impl), None, 0, "r1")
    req.prompt_tokens = 4
    with pytest.raises(error, match=f"^{message}$"):
        req.prompt_tokens = value
    assert req.prompt_tokens == 4
    with pytest.raises(AttributeError):
        del req.prompt_tokens
    assert req.prompt_tokens == 4


@both
async def test_prompt_tokens_defaults_to_0_and_the_last_set_is_recorded(impl: Impl) -> None:
    rec = recorder(impl)
    async with impl.Request(gate(impl, 3), rec, 0, "unknown") as req:
        assert req.prompt_tokens == 0
    async with impl.Request(gate(impl, 3), rec, 1, "known") as req:
        req.prompt_tokens = 2**63 - 1
        req.prompt_tokens = 0
        req.prompt_tokens = 17  # the last set counts
        req.forward(5)
        assert (req.prompt_tokens, req.tokens) == (17, 5)
    async with impl.Request(gate(impl), rec, 2, "subclass") as req:
        req.prompt_tokens = _Prompt(2**63 - 1)
        assert type(req.prompt_tokens) is int
    unknown, known, subclass = taken(rec)
    assert len(unknown) == len(known) == len(subclass) == 13
    assert (unknown[0], unknown[8:]) == (REQUEST, (0, 0, None, None, None))
    assert (known[0], known[4], known[8], known[9], known[12]) == (REQUEST, "known", 5, 17, None)
    assert same(subclass[9], 2**63 - 1)
    off = impl.Request(gate(impl), None, 0, "off")  # the timeline off: kept all the same
    off.prompt_tokens = 9
    assert off.prompt_tokens == 9


class _Trajectory(str):
    """A str subclass that overrides what it can: the request keeps its characters."""

    def __str__(self) -> str:
        raise AssertionError("__str__ was called")

    def __len__(self) -> int:
        raise AssertionError("__len__ was called")


class _Turn(int):
    """An int subclass that overrides what it can: the request keeps its int value."""

    def __index__(self) -> int:
        raise AssertionError("__index__ was called")

    def __lt__(self, other: object) -> bool:
        raise AssertionError("__lt__ was called")


@both
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (3, TypeError, "trajectory must be a str or None, not int"),
        (True, TypeError, "trajectory must be a str or None, not bool"),
        (b"s1", TypeError, "trajectory must be a str or None, not bytes"),
        (("s", 1), TypeError, "trajectory must be a str or None, not tuple"),
        ("x" * 257, ValueError, "trajectory must be at most 256 characters"),
        ("\u00e9" * 257, ValueError, "trajectory must be at most 256 characters"),
        pytest.param(
            _Trajectory("x" * 257),
            ValueError,
            "trajectory must be at most 256 characters",
            id="str-subclass-too-long",  # pytest's own id would take its len()
        ),
    ],
)
def test_trajectory_refuses_what_is_not_a_str_of_at_most_256_characters_or_none(
    impl: Impl, value: object, error: type[Exception], message: str
) -> None:
    """The same error and words from both recorders; the value before stays."""
    req = impl.Request(gate(impl), None, 0, "r1")
    req.trajectory = "s1"
    with pytest.raises(error, match=f"^{message}$"):
        req.trajectory = value
    assert req.trajectory == "s1"
    with pytest.raises(AttributeError):
        del req.trajectory
    assert req.trajectory == "s1"


@both
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "turn must be an int or None, not bool"),
        (False, TypeError, "turn must be an int or None, not bool"),
        ("3", TypeError, "turn must be an int or None, not str"),
        (3.0, TypeError, "turn must be an int or None, not float"),
        (-1, ValueError, "turn must be >= 0"),
        (-(2**63), ValueError, "turn must be >= 0"),
        (-(2**70), ValueError, "turn must be >= 0"),
        (2**63, OverflowError, "turn must fit in 64 bits"),
        (2**70, OverflowError, "turn must fit in 64 bits"),
    ],
)
def test_turn_refuses_what_is_not_an_int_of_64_bits_at_least_0_or_none(
    impl: Impl, value: object, error: type[Exception], message: str
) -> None:
    """The same error and words from both recorders; the value before stays."""
    req = impl.Request(gate(impl), None, 0, "r1")
    req.turn = 4
    with pytest.raises(error, match=f"^{message}$"):
        req.turn = value
    assert req.turn == 4
    with pytest.raises(AttributeError):
        del req.turn
    assert req.turn == 4


@both
async def test_trajectory_and_turn_default_to_none_and_the_last_set_is_recorded(
    impl: Impl,
) -> None:
    rec = recorder(impl)
    async with impl.Request(gate(impl, 3), rec, 0, "unknown") as req:
        assert (req.trajectory, req.turn) == (None, None)
    async with impl.Request(gate(impl, 3), rec, 1, "known") as req:
        req.trajectory = "s0"
        req.turn = 2**63 - 1
        req.trajectory = "x" * 256
        req.turn = 0
        req.trajectory = "s3-\u00e9"  # the last set counts
        req.turn = 5
        req.prompt_tokens = 17
        assert (req.trajectory, req.turn) == ("s3-\u00e9", 5)
    async with impl.Request(gate(impl), rec, 2, "unset") as req:
        req.trajectory = "s4"
        req.turn = 1
        req.trajectory = None  # unset again: None counts too
        req.turn = None
    async with impl.Request(gate(impl), rec, 3, "subclass") as req:
        req.trajectory = _Trajectory("y" * 256)
        req.turn = _Turn(2**63 - 1)
        assert (type(req.trajectory), type(req.turn)) == (str, int)
    unknown, known, unset, subclass = taken(rec)
    assert len(unknown) == len(known) == len(unset) == len(subclass) == 13
    assert (unknown[0], unknown[10:]) == (REQUEST, (None, None, None))
    assert (known[4], known[9], known[10], known[11], known[12]) == (
        "known",
        17,
        "s3-\u00e9",
        5,
        None,
    )
    assert unset[10:] == (None, None, None)
    assert same(subclass[10], "y" * 256)
    assert same(subclass[11], 2**63 - 1)
    off = impl.Request(gate(impl), None, 0, "off")  # the timeline off: kept all the same
    off.trajectory, off.turn = "s9", 9
    assert (off.trajectory, off.turn) == ("s9", 9)


@both
async def test_trajectory_and_turn_are_recorded_with_a_note(impl: Impl) -> None:
    rec = recorder(impl)
    with pytest.raises(Planned):
        async with impl.Request(gate(impl, 1), rec, 0, "r1") as req:
            req.trajectory, req.turn = "s1", 2
            raise Planned
    [event] = taken(rec)
    assert event[10:] == ("s1", 2, "Planned")


@both
async def test_a_request_ended_at_close_is_recorded_once(impl: Impl) -> None:
    rec = recorder(impl)
    req = impl.Request(gate(impl), rec, 0, "left open")
    await req.__aenter__()
    assert req in rec.open
    req._end(2**40, OPEN_AT_CLOSE)
    await req.__aexit__(None, None, None)
    req._end(2**41, "again")
    [(kind, _, end, *rest)] = taken(rec)
    assert (kind, end, rest) == (
        REQUEST,
        2**40,
        [0, "left open", None, False, False, 0, 0, None, None, OPEN_AT_CLOSE],
    )
    assert rec.open == []


async def test_a_request_with_the_timeline_off_records_nothing(make_config: MakeConfig) -> None:
    async with aprof.Profiler(make_config(timeline={"enable": False})) as prof:
        assert prof._timeline.recorder is None
        async with prof.step(1), prof.request(replica=0, request_id="off") as req:
            req.forward(3)
        assert (req.step, req.tokens) == (1, 3)
        assert not (prof.save_path / "timeline").exists()


async def test_a_gate_that_raises_ends_the_request_once_with_the_exception_type(
    make_config: MakeConfig,
) -> None:
    """A real failure of the profiler's ``_admit``: a replica that cannot be looked up (a list)
    while the step has rollout windows. No ``__aexit__`` follows, so ``__aenter__`` records it."""
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        assert prof._timeline.recorder is not None
        async with prof.step(1):
            req = prof.request(replica=[0], request_id="bad")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="unhashable"):
                async with req:
                    pytest.fail("the body of a request that failed to enter ran")
            assert req not in prof._timeline.recorder.open
            req._end(time.monotonic_ns(), "again")
            requests = [e for e in taken(prof._timeline.recorder) if e[0] == REQUEST]
            assert [e[3:] for e in requests] == [
                ("[0]", "bad", 1, False, False, 0, 0, None, None, "TypeError")
            ]


async def test_a_gated_request_whose_capture_fails_in_strict_mode_ends_once(
    make_config: MakeConfig,
) -> None:
    """The awaitable ``_admit`` returns fails (``strict``: the start failed): the request is
    recorded once, gated, with the error's type as its note, and left open nowhere."""
    # A start that waits (as a server's does), so that the request waits for it.
    target = RecordingTarget("replica_0", replica=0, fail_start=True, start_latency=0.001)
    async with aprof.Profiler(make_config(strict=True)) as prof:
        prof.add_target(target)
        assert prof._timeline.recorder is not None
        async with prof.step(1):
            req = prof.request(replica=0, request_id="gated")
            with pytest.raises(aprof.CaptureError):
                async with req:
                    pytest.fail("the body of a request that failed to enter ran")
            assert req not in prof._timeline.recorder.open
            assert (req.gated, req.captured) == (True, False)
            requests = [e for e in taken(prof._timeline.recorder) if e[0] == REQUEST]
            assert [e[3:] for e in requests] == [
                (0, "gated", 1, True, False, 0, 0, None, None, "CaptureError")
            ]


# -- 6. constructor and call errors --------------------------------------------------------

Call = Callable[[Impl, Any], object]

# (call, its message, whether the message is aprof's own in both recorders): a call that
# Python itself refuses in the twin (argument counts) gives Python's words there.
WRONG_CALLS: list[tuple[Call, str, bool]] = [
    (lambda m, rec: m.Span(rec, "n", [], None), "attrs must be a dict, not list", True),
    (lambda m, rec: m.Span("not a recorder", "n", {}, None), "expected a Recorder, not str", True),
    (
        lambda m, rec: m.Span(rec, "n", {}),
        "Span\\(recorder, name, attrs, step\\) takes 4 positional",
        False,
    ),
    (lambda m, rec: m.Span(rec, "n", {}, None, 1), "takes 4 positional arguments", False),
    (lambda m, rec: m.Span(rec, "n", {}, step=None), "takes 4 positional arguments", False),
    (lambda m, rec: m.Recorder(1), "on_full must be callable", True),
    (lambda m, rec: m.Recorder(), "Recorder expected 1 argument, got 0", False),
    (lambda m, rec: m.Recorder(on_full=print), "Recorder\\(\\) takes no keyword", False),
    (lambda m, rec: m.Gate(1), "admit must be callable", True),
    (lambda m, rec: m.Request(None, None, 0, None), "expected a Gate, not NoneType", True),
    (
        lambda m, rec: m.Request(gate(m), "not a recorder", 0, None),
        "expected a Recorder, not str",
        True,
    ),
    (
        lambda m, rec: m.Request(gate(m), None, 0),
        "Request\\(gate, recorder, replica, request_id\\)",
        False,
    ),
    (
        lambda m, rec: m.Span(rec, "n", {}, None)._end(1),
        "_end\\(end, note\\) takes 2 arguments, got 1",
        False,
    ),
    (lambda m, rec: m.Span(rec, "n", {}, None)._end(1.5, None), "integer", True),
    (
        lambda m, rec: m.Span(rec, "n", {}, None).__exit__(None, None),
        "__exit__\\(exc_type, exc, tb\\) takes 3 arguments, got 2",
        False,
    ),
    (
        lambda m, rec: m.Span(rec, "n", {}, None).__aexit__(None),
        "__aexit__\\(exc_type, exc, tb\\) takes 3 arguments, got 1",
        False,
    ),
]


@both
@pytest.mark.parametrize(("call", "message", "ours"), WRONG_CALLS)
def test_wrong_arguments_raise_type_error_naming_the_problem(
    impl: Impl, call: Call, message: str, ours: bool
) -> None:
    with pytest.raises(TypeError, match=message if ours or impl is c_recorder else None):
        call(impl, recorder(impl))


@pytest.mark.skipif(c_recorder is None, reason="the C recorder is not built")
def test_the_c_span_checks_its_arguments_when_made_through_new_too() -> None:
    with pytest.raises(TypeError, match="Span expected 4 arguments, got 3"):
        c_recorder.Span.__new__(c_recorder.Span, recorder(c_recorder), "n", {})


async def test_with_the_timeline_off_a_span_is_the_one_null_span(make_config: MakeConfig) -> None:
    """``prof.span`` with the timeline off gives NULL_SPAN, which records nothing and, like a
    span, works with ``with`` and ``async with`` and does not swallow exceptions."""
    async with aprof.Profiler(make_config(timeline={"enable": False})) as prof:
        span = prof.span("turn", turn=1)
        assert span is chosen.NULL_SPAN
        with span as entered:
            assert entered is span
        async with span as entered:
            assert entered is span
        with pytest.raises(KeyError), span:
            raise KeyError("kept")


@both
def test_there_is_one_null_span(impl: Impl) -> None:
    with pytest.raises(TypeError, match="cannot create"):
        impl.NullSpan()
    assert type(impl.NULL_SPAN) is impl.NullSpan
