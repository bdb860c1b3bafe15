"""The timeline's hot path, in C (``aprof/_recorder.c``): Recorder, Span, Request, NullSpan.

A Recorder holds a timeline's events in marshal's format; spans and requests record
themselves into it when they end (``aprof._chrome_trace.SPAN`` and ``REQUEST`` give the
layouts). Neither is tracked by the garbage collector, and awaiting their
``__aenter__``/``__aexit__`` completes at once.
"""

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import final

from aprof._chrome_trace import Event
from aprof._scheduler import Profiler
from aprof._timeline import AttrValue

@final
class Recorder:
    """A timeline's events, held as marshal's bytes until taken.

    An event that finds ``count >= room`` calls ``on_full()`` first (which may take the
    events and raise the room) and is dropped and counted if there is no room then.
    """

    room: int
    """How many events the recorder may hold before it calls ``on_full``."""

    def __init__(self, on_full: Callable[[], object], /) -> None: ...
    @property
    def open(self) -> set[Span | Request]:
        """Spans and requests begun and not ended yet."""
    @property
    def count(self) -> int:
        """Events held."""
    @property
    def dropped(self) -> int:
        """Events that found no room, even after ``on_full``, over the recorder's life."""
    def add(self, event: Event, /) -> None:
        """Record an event tuple (steps and windows; spans and requests record themselves).

        ``None``, ``bool``, ``int``, ``float``, ``str`` and tuples of them are kept as they
        are; any other value as its ``str()``.
        """
    def take(self) -> bytes:
        """The events recorded since the last take, as marshal's bytes of a list; the
        recorder holds none after."""

@final
class Span:
    """``with prof.span(name, **attrs):`` or ``async with``: one timeline span.

    The span takes its attrs' keys and values when it is made (it does not hold the dict).
    """

    def __init__(
        self, recorder: Recorder, name: str, attrs: dict[str, AttrValue], step: int | None, /
    ) -> None: ...
    def __enter__(self) -> Span: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...
    def __aenter__(self) -> Awaitable[Span]: ...
    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> Awaitable[None]: ...
    def _end(self, end: int, note: str | None, /) -> None:
        """Record the span as ended at ``end`` (monotonic ns) with ``note``, unless it ended
        already."""

@final
class NullSpan:
    """What ``prof.span`` returns while the timeline is off: records nothing."""

    def __enter__(self) -> NullSpan: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...
    def __aenter__(self) -> Awaitable[NullSpan]: ...
    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> Awaitable[None]: ...

NULL_SPAN: NullSpan
"""The one :class:`NullSpan`."""

@final
class Request:
    """One agent-loop request to a replica, as an async context manager and its own handle.

    ``async with prof.request(replica=0, request_id="s3-t1") as req:`` waits while the
    replica's capture for the current step is starting (bounded by the start timeout), then
    lets the request go; ``req.step``, ``req.gated`` and ``req.captured`` say what happened.
    The request is one timeline span, recorded when it ends.
    """

    gated: bool
    """The request waited for its replica's capture to start."""
    captured: bool
    """A capture of its replica was active when the request went ahead."""

    def __init__(
        self, prof: Profiler, recorder: Recorder | None, replica: int, request_id: str | None, /
    ) -> None: ...
    @property
    def replica(self) -> int:
        """The replica the request goes to."""
    @property
    def request_id(self) -> str | None:
        """The caller's identifier for the request, if any."""
    @property
    def step(self) -> int | None:
        """The global step the request was admitted in (``None`` outside any step)."""
    @property
    def tokens(self) -> int:
        """Tokens reported through :meth:`forward`."""
    def __aenter__(self) -> Awaitable[Request]: ...
    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> Awaitable[None]: ...
    def forward(self, tokens: int = 0) -> None:
        """Report progress of the request; reported tokens add up."""
    def _end(self, end: int, note: str | None, /) -> None:
        """Record the request as ended at ``end`` (monotonic ns) with ``note``, unless it
        ended already."""
