"""``Request.traceparent``, ``Gate.trace_salt`` and ``span_id_of``: a request's W3C trace
context, from the C recorder (``aprof/_timeline/_recorder.c``) and its pure-Python twin
(``pyrecorder.py``) alike, character for character.

Tests that take ``impl`` run once per recorder; the C ones skip where it is not built."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from recorders import Impl, both, c_recorder, needs_c

from aprof._timeline import pyrecorder
from aprof._timeline import recorder as chosen

SALT = "0123456789abcdef"
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")
NO_STEP = "ffffffffffffffff"


def gate(impl: Impl, step: int | None = None, salt: str | None = SALT) -> Any:
    """A gate of ``impl`` at ``step`` with ``salt``, whose step has no rollout windows."""
    made = impl.Gate(_nothing_admitted)
    made.step = step
    made.trace_salt = salt
    return made


def _nothing_admitted(request: object) -> None:
    raise AssertionError("admit was called")


def fnv1a(data: bytes) -> int:
    """The 64-bit FNV-1a hash, written out here apart from both recorders."""
    h = 0xCBF29CE484222325
    for byte in data:
        h ^= byte
        h = (h * 0x100000001B3) % 2**64
    return h


def expected_span(request_id: str) -> str:
    """A request id's span id, from the W3C and FNV-1a rules alone."""
    return f"{fnv1a(request_id.encode('utf-8', 'surrogatepass')) or 1:016x}"


def parts(traceparent: str) -> tuple[str, str, str, str]:
    """The version, trace id, span id and flags of a well-formed traceparent."""
    assert TRACEPARENT.match(traceparent), traceparent
    version, trace_id, span_id, flags = traceparent.split("-")
    return version, trace_id, span_id, flags


def entered(request: Any) -> Any:
    """``await request.__aenter__()`` driven by hand: it completes without suspending."""
    entering = request.__aenter__().__await__()
    with pytest.raises(StopIteration) as done:
        next(entering)
    return done.value.value


def exited(request: Any) -> None:
    exiting = request.__aexit__(None, None, None).__await__()
    with pytest.raises(StopIteration):
        next(exiting)


class _Salt(str):
    """A str subclass that overrides what it can: the gate keeps its characters."""

    def __str__(self) -> str:
        raise AssertionError("__str__ was called")

    def __len__(self) -> int:
        raise AssertionError("__len__ was called")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("__iter__ was called")


class _RequestId(str):
    """A str subclass that overrides what it can: the span id is of its characters."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        raise AssertionError("encode was called")

    def __str__(self) -> str:
        raise AssertionError("__str__ was called")


class _Step(int):
    """An int subclass that overrides what it can: the trace id holds its int value."""

    def __index__(self) -> int:
        raise AssertionError("__index__ was called")

    def __and__(self, other: object) -> int:
        raise AssertionError("__and__ was called")

    def __format__(self, spec: str) -> str:
        raise AssertionError("__format__ was called")


# -- Gate.trace_salt -----------------------------------------------------------------------


@both
def test_the_trace_salt_defaults_to_none_and_takes_16_lowercase_hex_digits(impl: Impl) -> None:
    made = impl.Gate(_nothing_admitted)
    assert made.trace_salt is None
    for salt in (SALT, "0000000000000001", "ffffffffffffffff", "a" * 16):
        made.trace_salt = salt
        assert made.trace_salt == salt
    made.trace_salt = _Salt("fedcba9876543210")
    assert type(made.trace_salt) is str
    assert made.trace_salt == "fedcba9876543210"
    made.trace_salt = None
    assert made.trace_salt is None


WRONG_SALT = "trace_salt must be 16 lowercase hex digits, not all zero"


@both
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (5, TypeError, "trace_salt must be a str of 16 lowercase hex digits or None, not int"),
        (True, TypeError, "trace_salt must be a str of 16 lowercase hex digits or None, not bool"),
        (
            SALT.encode(),
            TypeError,
            "trace_salt must be a str of 16 lowercase hex digits or None, not bytes",
        ),
        (0.5, TypeError, "trace_salt must be a str of 16 lowercase hex digits or None, not float"),
        ("", ValueError, WRONG_SALT),
        ("0123456789abcde", ValueError, WRONG_SALT),  # 15
        ("0123456789abcdef0", ValueError, WRONG_SALT),  # 17
        ("0123456789ABCDEF", ValueError, WRONG_SALT),  # uppercase
        ("0123456789abcdeF", ValueError, WRONG_SALT),
        ("0123456789abcdeg", ValueError, WRONG_SALT),
        ("0123456789abcde ", ValueError, WRONG_SALT),
        ("0123456789abcde\n", ValueError, WRONG_SALT),
        ("0123456789abcde\u00e9", ValueError, WRONG_SALT),  # 16 characters, not ASCII
        ("0123456789abcde\u0660", ValueError, WRONG_SALT),  # an Arabic-Indic digit
        ("0x23456789abcdef", ValueError, WRONG_SALT),
        ("0" * 16, ValueError, WRONG_SALT),  # all zero
        pytest.param(_Salt("0" * 16), ValueError, WRONG_SALT, id="str-subclass-all-zero"),
        pytest.param(_Salt("ABCDEF0123456789"), ValueError, WRONG_SALT, id="str-subclass-upper"),
    ],
)
def test_the_trace_salt_refuses_what_is_not_16_lowercase_hex_digits_not_all_zero_or_none(
    impl: Impl, value: object, error: type[Exception], message: str
) -> None:
    """The same error and words from both recorders; the value before stays."""
    made = gate(impl)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        made.trace_salt = value
    assert made.trace_salt == SALT
    with pytest.raises(AttributeError):
        del made.trace_salt
    assert made.trace_salt == SALT


# -- Request.traceparent ---------------------------------------------------------------------


@both
async def test_without_a_trace_salt_a_request_has_no_traceparent(impl: Impl) -> None:
    at = gate(impl, 3, salt=None)
    req = impl.Request(at, None, 0, "s3-t1")
    assert req.traceparent is None
    async with req:
        assert req.traceparent is None
    assert req.traceparent is None
    at.trace_salt = SALT  # read on each access: the gate's salt now
    assert req.traceparent == f"00-{SALT}{3:016x}-{expected_span('s3-t1')}-01"
    at.trace_salt = None
    assert req.traceparent is None


@both
@pytest.mark.parametrize(
    ("step", "hex_step"),
    [
        (None, NO_STEP),
        (0, "0000000000000000"),
        (1, "0000000000000001"),
        (255, "00000000000000ff"),
        (2**40, "0000010000000000"),
        (2**63, "8000000000000000"),
        (2**64 - 1, NO_STEP),
        (2**64 + 5, "0000000000000005"),  # modulo 2**64
        (_Step(2**32 + 10), "000000010000000a"),  # its int value, no code of its
    ],
)
async def test_the_traceparent_is_the_salt_and_step_then_the_span_id_sampled(
    impl: Impl, step: int | None, hex_step: str
) -> None:
    req = impl.Request(gate(impl, step), None, 0, "s3-t1")
    expected = f"00-{SALT}{hex_step}-{expected_span('s3-t1')}-01"
    assert req.traceparent == expected  # before it entered: the gate's step
    async with req:
        assert req.traceparent == expected
        assert TRACEPARENT.match(req.traceparent)
        assert type(req.traceparent) is str
    assert req.traceparent == expected
    version, trace_id, span_id, flags = parts(expected)
    assert (version, trace_id, flags) == ("00", SALT + hex_step, "01")
    assert span_id == impl.span_id_of("s3-t1")


@both
async def test_the_trace_id_follows_the_gate_until_the_request_enters_then_keeps_its_step(
    impl: Impl,
) -> None:
    at = gate(impl, 1)
    req = impl.Request(at, None, 0, "r")
    assert parts(req.traceparent)[1] == SALT + f"{1:016x}"
    at.step = 2
    assert parts(req.traceparent)[1] == SALT + f"{2:016x}"
    at.step = None
    assert parts(req.traceparent)[1] == SALT + NO_STEP
    at.step = 7
    async with req:
        assert req.step == 7
        at.step = 8
        assert parts(req.traceparent)[1] == SALT + f"{7:016x}"
        at.step = None
        assert parts(req.traceparent)[1] == SALT + f"{7:016x}"
    at.step = 9
    assert parts(req.traceparent)[1] == SALT + f"{7:016x}"
    stepless = gate(impl, None)
    outside = impl.Request(stepless, None, 0, "r")
    async with outside:
        stepless.step = 3  # entered outside any step: stays so
        assert parts(outside.traceparent)[1] == SALT + NO_STEP


@both
def test_the_trace_id_of_a_step_that_is_not_an_int_or_none_raises_type_error(
    impl: Impl,
) -> None:
    """The gate's step is the profiler's to set (an int or None); the same words from both."""
    at = gate(impl, 1)
    req = impl.Request(at, None, 0, "r")
    at.step = 2.5
    with pytest.raises(TypeError, match=r"^a request's step must be an int or None, not float$"):
        req.traceparent  # noqa: B018
    at.step = "3"
    with pytest.raises(TypeError, match=r"^a request's step must be an int or None, not str$"):
        req.traceparent  # noqa: B018


@both
@pytest.mark.parametrize(
    ("request_id", "span_id"),
    [
        ("", "cbf29ce484222325"),  # FNV-1a's own test vectors
        ("a", "af63dc4c8601ec8c"),
        ("foobar", "85944171f73967e8"),
        ("s3-t1", None),
        ("\u00e9t\u00e9-\u4e2d\u6587-\U0001f600", None),
        ("\udcff", None),  # a lone surrogate: its bytes as the timeline writes them
        ("a\ud800b", None),
        ("x" * 300, None),
        pytest.param(_RequestId("s3-t1"), None, id="str-subclass"),
    ],
)
async def test_the_span_id_is_fnv1a_of_the_request_ids_utf8_bytes(
    impl: Impl, request_id: str, span_id: str | None
) -> None:
    expected = expected_span(str.__str__(request_id))
    if span_id is not None:
        assert expected == span_id
    assert impl.span_id_of(request_id) == expected
    assert type(impl.span_id_of(request_id)) is str
    req = impl.Request(gate(impl, 4), None, 0, request_id)
    assert parts(req.traceparent)[2] == expected
    async with req:
        assert parts(req.traceparent)[2] == expected


@both
@pytest.mark.parametrize(
    ("value", "kind"), [(None, "NoneType"), (1, "int"), (b"s3", "bytes"), (("s",), "tuple")]
)
def test_span_id_of_refuses_what_is_not_a_str(impl: Impl, value: object, kind: str) -> None:
    with pytest.raises(TypeError, match=f"^span_id_of\\(\\) request_id must be a str, not {kind}$"):
        impl.span_id_of(value)


@both
async def test_requests_without_an_id_have_distinct_span_ids_each_its_own_throughout(
    impl: Impl,
) -> None:
    at = gate(impl, 5)
    requests = [impl.Request(at, None, i, None) for i in range(200)]
    before = [req.traceparent for req in requests]
    assert len({parts(tp)[2] for tp in before}) == len(requests)
    assert {parts(tp)[1] for tp in before} == {SALT + f"{5:016x}"}
    for req, first in zip(requests, before, strict=True):
        async with req:
            assert req.traceparent == first
        assert req.traceparent == first
    # A request id that is not a str (a caller's mistake) counts as none.
    odd = impl.Request(at, None, 0, 12)
    assert parts(odd.traceparent)[2] not in {parts(tp)[2] for tp in before}
    assert odd.traceparent == odd.traceparent


@both
def test_the_traceparent_is_read_only(impl: Impl) -> None:
    req = impl.Request(gate(impl), None, 0, "r")
    with pytest.raises(AttributeError):
        req.traceparent = "00-" + "1" * 32 + "-" + "1" * 16 + "-01"
    with pytest.raises(AttributeError):
        del req.traceparent


@both
async def test_reading_the_traceparent_keeps_no_references(impl: Impl) -> None:
    at = gate(impl, 10**25 + 1)
    salt = "".join(["fedcba98", "76543210"])  # a str of its own, not interned
    at.trace_salt = salt
    request_id = "".join(["request", "-\u00e9-", str(99)])
    fresh = impl.Request(at, None, 0, request_id)  # not entered: reads the gate's step
    done = impl.Request(at, None, 1, request_id)  # entered and ended: its own step
    async with done:
        pass
    nameless = impl.Request(at, None, 2, None)
    objects = [at, at.step, salt, request_id, fresh, done, nameless]
    before = [sys.getrefcount(o) for o in objects]
    for _ in range(1000):
        for req in (fresh, done, nameless):
            req.traceparent  # noqa: B018
        impl.span_id_of(request_id)
    del req
    assert [sys.getrefcount(o) for o in objects] == before


# -- the two recorders agree ---------------------------------------------------------------


def test_span_id_of_is_exported_from_the_running_recorder() -> None:
    running = pyrecorder if chosen.BACKEND == "python" else c_recorder
    assert running is not None
    assert chosen.span_id_of is running.span_id_of
    assert "span_id_of" in chosen.__all__


chars = st.characters() | st.characters(categories=["Cs"])  # lone surrogates too
steps = st.none() | st.integers(0, 2**40)


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    request_id=st.text(chars, max_size=40),
    salt=st.text("0123456789abcdef", min_size=16, max_size=16).filter(lambda s: s != "0" * 16),
    step=steps,
    later=steps,
    enter=st.booleans(),
)
@example(request_id="", salt=SALT, step=None, later=0, enter=False)
@example(request_id="\udcff\U0001f600", salt="f" * 16, step=2**40, later=None, enter=True)
def test_the_c_recorder_and_its_twin_give_the_same_traceparent(
    request_id: str, salt: str, step: int | None, later: int | None, enter: bool
) -> None:
    """Both recorders, the same inputs: the same characters, which are the rules'."""
    got = []
    for impl in (c_recorder, pyrecorder):
        at = gate(impl, step, salt)
        req = impl.Request(at, None, 0, request_id)
        if enter:
            assert entered(req) is req
        at.step = later  # the trace id keeps the entered step, or follows the gate's
        got.append((req.traceparent, impl.span_id_of(request_id)))
        if enter:
            exited(req)
    assert got[0] == got[1]
    taken_step = step if enter else later
    hex_step = NO_STEP if taken_step is None else f"{taken_step:016x}"
    span = expected_span(request_id)
    assert got[0] == (f"00-{salt}{hex_step}-{span}-01", span)


# -- Request.tracestate ----------------------------------------------------------------------


class _Replica(int):
    """An int subclass whose text differs from its value: the tracestate holds its value."""

    def __repr__(self) -> str:
        raise AssertionError("__repr__ was called")

    def __str__(self) -> str:
        raise AssertionError("__str__ was called")

    def __format__(self, spec: str) -> str:
        raise AssertionError("__format__ was called")


@both
@pytest.mark.parametrize(
    ("replica", "expected"),
    [
        (0, "aprof=r0"),
        (17, "aprof=r17"),
        (2**62, f"aprof=r{2**62}"),
        pytest.param(_Replica(5), "aprof=r5", id="int-subclass"),
        (True, "aprof=r1"),  # an int, as the recorder takes it
        (-1, None),
        (2**64, None),
        ("0", None),
        (None, None),
        (1.0, None),
    ],
)
async def test_the_tracestate_names_the_replica_of_a_request_with_trace_context(
    impl: Impl, replica: object, expected: str | None
) -> None:
    req = impl.Request(gate(impl, 2), None, replica, "r")
    assert req.tracestate == expected
    async with req:
        assert req.tracestate == expected
    plain = impl.Request(gate(impl, 2, salt=None), None, replica, "r")
    assert plain.tracestate is None  # no trace context: no tracestate
