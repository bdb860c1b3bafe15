"""The recorder in pure Python: the twin of ``_recorder.c``, of the same contract.

It runs where the C extension was not built (no compiler at install) or is turned off
(``APROF_NO_EXTENSIONS=1``); ``recorder.py`` chooses. Both record the same events: the writer
reads what either one takes the same way. The C one is faster because it runs no Python frame
per span or request, gives ``async with`` no coroutine, and leaves its spans and requests out
of the garbage collector; everything else is as here.

A ``Recorder`` holds a timeline's events until taken, as marshal's bytes of a list (layouts in
``events.py``); spans and requests record themselves into it when they end. A value that is not
``None``, a bool, an int, a float, a str or a tuple of them (nested at most ``DEPTH`` deep) is
recorded as its ``str()``; subclasses of those as their base type's value.
"""

from __future__ import annotations

import marshal
from collections.abc import Awaitable, Callable
from operator import index
from types import TracebackType
from typing import Final, Protocol, final

from aprof._timeline.events import REQUEST, SPAN, AttrValue, Event, now_ns

DEPTH: Final = 8
"""Tuples nested this deep in an event (the event is depth 0) are recorded as their str()."""

_INT64: Final = range(-(2**63), 2**63)
_TRAJECTORY: Final = 256
"""The longest trajectory, in characters (``M_TRAJECTORY`` in C)."""
_PLAIN: Final = frozenset({type(None), bool, int, float, str})
"""The types recorded as they are, tuples aside."""
_MASK64: Final = 0xFFFFFFFFFFFFFFFF
_HEX: Final = frozenset("0123456789abcdef")
_NO_STEP: Final = "f" * 16
"""A traceparent's step outside any step."""
_FNV_OFFSET: Final = 0xCBF29CE484222325
_FNV_PRIME: Final = 0x100000001B3


@final
class Tally:
    """The requests a window admitted while active: a gate's ``active`` holds one per
    replica whose window is active, and counts into it without calling ``admit``."""

    __slots__ = ("admitted",)

    def __init__(self) -> None:
        self.admitted = 0
        """Requests counted so far."""


@final
class Gate:
    """What a request asks of its profiler as it enters, and nothing more.

    ``step`` is the global step now open, ``live`` whether that step has rollout windows;
    while it has, a request to a replica in ``active`` is counted into its :class:`Tally`
    and marked captured, and any other calls ``admit(request)``, which counts it into its
    replica's window and returns ``None`` if it may go now, or what it awaits first (the
    window's start). ``trace_salt`` makes the run's trace ids (see
    :attr:`Request.traceparent`).
    """

    __slots__ = ("_trace_salt", "active", "admit", "first_ns", "last_ns", "live", "step")

    def __init__(self, admit: Callable[[Request], Awaitable[Request] | None], /) -> None:
        if not callable(admit):
            raise TypeError("Gate(admit): admit must be callable")
        self.admit = admit
        self.active: dict[int, Tally] = {}
        """Replica (an int) -> :class:`Tally` of its active window in the open step."""
        self.step: int | None = None
        """The global step now open, if any."""
        self.live = False
        """The step now open has rollout windows: requests are admitted."""
        self.first_ns = 0
        """When the first request of ``step`` entered (monotonic ns); 0 until one has."""
        self.last_ns = 0
        """When the last request of ``step`` to end ended (monotonic ns); 0 until one has."""
        self._trace_salt: str | None = None

    @property
    def trace_salt(self) -> str | None:
        """The run's part of each trace id: 16 lowercase hex digits, not all zero; ``None``:
        requests give no ``traceparent``."""
        return self._trace_salt

    @trace_salt.setter
    def trace_salt(self, value: str | None) -> None:
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(
                    "trace_salt must be a str of 16 lowercase hex digits or None, "
                    f"not {type(value).__name__}"
                )
            value = str.__str__(value)  # a str subclass's own characters, as a plain str
            if len(value) != 16 or not _HEX.issuperset(value) or value == "0" * 16:
                raise ValueError("trace_salt must be 16 lowercase hex digits, not all zero")
        self._trace_salt = value


@final
class Recorder:
    """A timeline's events, held as marshal's bytes until taken.

    An event that finds ``count >= room`` calls ``on_full()`` first (which may take the
    events and raise the room) and is dropped and counted if there is no room then.
    """

    __slots__ = ("_events", "_on_full", "_open", "dropped", "room")

    def __init__(self, on_full: Callable[[], object], /) -> None:
        if not callable(on_full):
            raise TypeError("Recorder(on_full): on_full must be callable")
        self._on_full = on_full
        self._events: list[Event] = []
        self.room = 0
        """How many events the recorder may hold before it calls ``on_full``."""
        # A set, not an ordered dict: a dict whose one key comes and goes is rebuilt every
        # few requests (its deleted slots fill it up).
        self._open: set[Span | Request] = set()
        self.dropped = 0
        """Events that found no room, even after ``on_full``, over the recorder's life."""

    @property
    def open(self) -> list[Span | Request]:
        """The spans and requests begun and not ended yet, in the order begun (a new list;
        here, by their begin times)."""
        return sorted(self._open, key=_begun)

    @property
    def count(self) -> int:
        """Events held."""
        return len(self._events)

    def add(self, event: Event, /) -> None:
        """Record an event tuple (steps and windows; spans and requests record themselves)."""
        if not isinstance(event, tuple):
            raise TypeError(f"an event is a tuple, not {type(event).__name__}")
        self._put(_plain_all(event if type(event) is tuple else tuple(event)))

    def _put(self, event: Event) -> None:
        # Made plain before: a str() that records or takes runs before this event is written.
        if len(self._events) >= self.room:
            self._on_full()
            if len(self._events) >= self.room:
                self.dropped += 1
                return
        self._events.append(event)

    def take(self) -> bytes:
        """The events recorded since the last take, as marshal's bytes of a list; the
        recorder holds none after."""
        events, self._events = self._events, []
        return marshal.dumps(events, 2)  # version 2: no back-references, as the C one


@final
class Span:
    """``with prof.span(name, **attrs):`` or ``async with``: one timeline span.

    The span takes its attrs' keys and values when it is made (it does not hold the dict).
    """

    __slots__ = ("_begin", "_keys", "_name", "_recorder", "_step", "_values")

    def __init__(
        self, recorder: Recorder, name: str, attrs: dict[str, AttrValue], step: int | None, /
    ) -> None:
        _check_recorder(recorder)
        if not isinstance(attrs, dict):
            raise TypeError(f"Span attrs must be a dict, not {type(attrs).__name__}")
        self._recorder = recorder
        self._name = name
        self._step = step
        self._keys = tuple(attrs)
        self._values = tuple(attrs.values())
        self._begin = 0

    def __enter__(self) -> Span:
        self._begin = now_ns()
        self._recorder._open.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        self._end(now_ns(), _note(exc_type))

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        self._end(now_ns(), _note(exc_type))

    def _end(self, end: int, note: str | None, /) -> None:
        """Record the span as ended at ``end`` (monotonic ns) with ``note``, unless it ended
        already."""
        end = index(end)
        recorder = self._recorder
        try:
            recorder._open.remove(self)
        except KeyError:  # ended already, or never begun
            return
        keys, values = _plain_all(self._keys), _plain_all(self._values)
        name, step, why = _plain(self._name, 1), _plain(self._step, 1), _plain(note, 1)
        recorder._put((SPAN, name, self._begin, end, step, why, *keys, *values))


@final
class NullSpan:
    """What ``prof.span`` returns while the timeline is off: records nothing."""

    __slots__ = ()

    def __new__(cls) -> NullSpan:
        raise TypeError("cannot create 'NullSpan' instances")

    def __enter__(self) -> NullSpan:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        return None

    async def __aenter__(self) -> NullSpan:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        return None


NULL_SPAN: Final[NullSpan] = object.__new__(NullSpan)
"""The one :class:`NullSpan`."""


@final
class Request:
    """One agent-loop request to a replica, as an async context manager and its own handle.

    ``async with prof.request(replica=0, request_id="s3-t1") as req:`` waits while the
    replica's capture for the current step is starting (bounded by the start timeout), then
    lets the request go; ``req.step``, ``req.gated`` and ``req.captured`` say what happened.
    The request is one timeline span, recorded when it ends.
    """

    __slots__ = (
        "_begin",
        "_captured",
        "_gate",
        "_gated",
        "_prompt_tokens",
        "_recorder",
        "_replica",
        "_request_id",
        "_step",
        "_tokens",
        "_trajectory",
        "_turn",
    )

    def __init__(
        self, gate: Gate, recorder: Recorder | None, replica: int, request_id: str | None, /
    ) -> None:
        if type(gate) is not Gate:
            raise TypeError(f"expected a Gate, not {type(gate).__name__}")
        if recorder is not None:
            _check_recorder(recorder)
        self._gate = gate
        self._recorder = recorder
        self._replica = replica
        self._request_id = request_id
        self._step: int | None = None
        self._tokens = 0
        self._prompt_tokens = 0
        self._trajectory: str | None = None
        self._turn: int | None = None
        self._begin = 0
        self._gated = False
        self._captured = False

    @property
    def replica(self) -> int:
        """The replica the request goes to."""
        return self._replica

    @property
    def request_id(self) -> str | None:
        """The caller's identifier for the request, if any."""
        return self._request_id

    @property
    def step(self) -> int | None:
        """The global step the request was admitted in (``None`` outside any step)."""
        return self._step

    @property
    def tokens(self) -> int:
        """Tokens reported through :meth:`forward`."""
        return self._tokens

    @property
    def prompt_tokens(self) -> int:
        """The request's prompt, in tokens, when the client knows it (0: not known)."""
        return self._prompt_tokens

    @prompt_tokens.setter
    def prompt_tokens(self, value: int) -> None:
        self._prompt_tokens = _count(value, "prompt_tokens", "an int")

    @property
    def trajectory(self) -> str | None:
        """The trajectory (agent-loop run) the request is a turn of, when the client knows it."""
        return self._trajectory

    @trajectory.setter
    def trajectory(self, value: str | None) -> None:
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"trajectory must be a str or None, not {type(value).__name__}")
            value = str.__str__(value)  # a str subclass's own characters, as a plain str
            if len(value) > _TRAJECTORY:
                raise ValueError(f"trajectory must be at most {_TRAJECTORY} characters")
        self._trajectory = value

    @property
    def turn(self) -> int | None:
        """Which turn of its trajectory the request is (0: the first), when the client knows it."""
        return self._turn

    @turn.setter
    def turn(self, value: int | None) -> None:
        self._turn = None if value is None else _count(value, "turn", "an int or None")

    @property
    def traceparent(self) -> str | None:
        """The request's W3C trace context, as a ``traceparent`` header value: one trace per
        step of the run, the request's own span id; ``None`` when the profiler gives none
        (its gate has no ``trace_salt``).

        The trace id is the gate's ``trace_salt`` and the step (the request's once it
        entered, the gate's before; ``ffffffffffffffff`` for none) in 16 hex digits; the span
        id is :func:`span_id_of` the request id, or of the request's address without one."""
        gate = self._gate
        salt = gate._trace_salt
        if salt is None:
            return None
        step = _step_hex(self._step if self._begin else gate.step)
        request_id = self._request_id
        if isinstance(request_id, str):
            span = _fnv1a(str.encode(request_id, "utf-8", "surrogatepass"))
        else:  # distinct for each live request
            span = _fnv1a((id(self) & _MASK64).to_bytes(8, "little"))
        return f"00-{salt}{step}-{span:016x}-01"

    @property
    def tracestate(self) -> str | None:
        """The request's replica as a W3C ``tracestate`` header value (``aprof=r<replica>``),
        sent with its traceparent: the servers' spans of it carry it back. ``None`` when the
        profiler gives no trace context or the replica is not an int from 0 to 2**63 - 1."""
        replica = self._replica
        if self._gate._trace_salt is None or not isinstance(replica, int):
            return None
        if not 0 <= replica < 2**63:  # as the C recorder's long long
            return None
        return f"aprof=r{int.__repr__(replica)}"

    @property
    def gated(self) -> bool:
        """The request waited for its replica's capture to start."""
        return self._gated

    @gated.setter
    def gated(self, value: bool) -> None:
        self._gated = _flag(value)

    @property
    def captured(self) -> bool:
        """A capture of its replica was active when the request went ahead."""
        return self._captured

    @captured.setter
    def captured(self, value: bool) -> None:
        self._captured = _flag(value)

    async def __aenter__(self) -> Request:
        gate = self._gate
        self._step = gate.step
        self._begin = now_ns()
        if not gate.first_ns:
            gate.first_ns = self._begin
        if self._recorder is not None:
            self._recorder._open.add(self)
        if gate.live:
            replica = self._replica
            tally = gate.active.get(replica) if gate.active and type(replica) is int else None
            if type(tally) is Tally:
                tally.admitted += 1
                self._captured = True
                return self
            try:
                wait = gate.admit(self)
            except BaseException as exc:  # no __aexit__ follows a failed __aenter__
                self._end(now_ns(), type(exc).__name__)
                raise
            if wait is not None:
                return await wait
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        end = now_ns()
        # The step's requests end: the gate keeps when the last one did (its rollout's end).
        if self._step is self._gate.step:
            self._gate.last_ns = end
        if self._recorder is not None:
            self._end(end, _note(exc_type))

    def forward(self, tokens: int = 0) -> None:
        """Report progress of the request; reported tokens add up."""
        if not isinstance(tokens, int):
            raise TypeError(f"forward() tokens must be an int, not {type(tokens).__name__}")
        if tokens not in _INT64:
            raise OverflowError("forward() tokens must fit in 64 bits")
        if self._tokens + tokens not in _INT64:
            raise OverflowError("forward() tokens add up beyond 64 bits")
        self._tokens += tokens

    def _end(self, end: int, note: str | None, /) -> None:
        """Record the request as ended at ``end`` (monotonic ns) with ``note``, unless it
        ended already."""
        end = index(end)
        recorder = self._recorder
        if recorder is None:
            return
        try:
            recorder._open.remove(self)
        except KeyError:  # ended already, or never begun
            return
        replica, request_id = _plain(self._replica, 1), _plain(self._request_id, 1)
        step, why = _plain(self._step, 1), _plain(note, 1)
        recorder._put(
            (
                REQUEST,
                self._begin,
                end,
                replica,
                request_id,
                step,
                self._gated,
                self._captured,
                self._tokens,
                self._prompt_tokens,
                self._trajectory,
                self._turn,
                why,
            )
        )

    def __repr__(self) -> str:
        return (
            f"Request(replica={self._replica!r}, request_id={self._request_id!r}, "
            f"step={self._step!r}, gated={self._gated}, captured={self._captured})"
        )


class Requests(Protocol):
    """What ``prof.request`` is (made by :func:`requests`)."""

    def __call__(self, *, replica: int, request_id: str | None = None) -> Request:
        """The context of one request to ``replica``: gate, count, and report what happened."""
        ...


def requests(gate: Gate, recorder: Recorder | None, /) -> Requests:
    """What ``prof.request`` is: called with ``replica=r, request_id=None``, it makes the
    :class:`Request` of one request to replica ``r``, through ``gate``, into ``recorder``
    (``None``: the timeline is off). A closure: calling it costs one Python frame."""
    if type(gate) is not Gate:
        raise TypeError(f"expected a Gate, not {type(gate).__name__}")
    if recorder is not None:
        _check_recorder(recorder)

    def request(*, replica: int, request_id: str | None = None) -> Request:
        return Request(gate, recorder, replica, request_id)

    return request


def span_id_of(request_id: str) -> str:
    """The span id, 16 lowercase hex digits, of the request with this id in its
    ``traceparent``: the 64-bit FNV-1a hash of its UTF-8 bytes (1 where that is 0)."""
    if not isinstance(request_id, str):
        raise TypeError(f"span_id_of() request_id must be a str, not {type(request_id).__name__}")
    return f"{_fnv1a(str.encode(request_id, 'utf-8', 'surrogatepass')):016x}"


def _fnv1a(data: bytes) -> int:
    """The 64-bit FNV-1a hash of ``data``; 1 where that is 0 (a span id is never all zero)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK64
    return h or 1


def _step_hex(step: object) -> str:
    """A traceparent's step: 16 lowercase hex digits of ``step`` (modulo 2**64), or
    ``ffffffffffffffff`` for ``None``."""
    if step is None:
        return _NO_STEP
    if not isinstance(step, int):
        raise TypeError(f"a request's step must be an int or None, not {type(step).__name__}")
    return f"{int.__index__(step) & _MASK64:016x}"


def _check_recorder(recorder: object) -> None:
    if type(recorder) is not Recorder:
        raise TypeError(f"expected a Recorder, not {type(recorder).__name__}")


def _count(value: object, name: str, kinds: str) -> int:
    """``value`` as a count for the attribute ``name``: an int (no bool), >= 0, of 64 bits."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be {kinds}, not {type(value).__name__}")
    n = int.__index__(value)  # an int subclass's own value, whatever it overrides
    if n < 0:
        raise ValueError(f"{name} must be >= 0")
    if n not in _INT64:
        raise OverflowError(f"{name} must fit in 64 bits")
    return n


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError("attribute value type must be bool")
    return value


def _begun(item: Span | Request) -> int:
    return item._begin


def _note(exc_type: type[BaseException] | None) -> str | None:
    """The note of what ``__exit__`` ends: ``None``, or the exception's type name."""
    return None if exc_type is None else exc_type.__name__


def _plain_all(values: tuple[object, ...]) -> tuple[object, ...]:
    """Each of ``values`` (at depth 1) as :func:`_plain` makes it."""
    if _PLAIN.issuperset(map(type, values)):
        return values
    return tuple([_plain(value, 1) for value in values])


def _plain(value: object, depth: int) -> object:
    """``value`` as marshal holds it: itself, its base type's value, or its ``str()``."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, tuple) and depth < DEPTH:
        return tuple(_plain(item, depth + 1) for item in value)
    try:
        text = str(value)
    except Exception:  # a str() that raises must not break the code being recorded
        return f"<unprintable {kind.__name__}>"
    return str.__str__(text)
