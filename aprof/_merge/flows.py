"""Links in a merged step: flow arrows from each request span to the forward steps that served
it, and the servers' own spans of each request (OpenTelemetry) nested under it.

A forward step names the requests of its batch only where the server says so: the reference
server records, inside ``forward_step#<k>``, a ``requests: <id>,<id>,... (+N more)`` record of
the client request ids (``X-Request-Id``) of its batch. Real vLLM and SGLang name none, so their
forward steps get no arrows.

How the arrows are drawn follows Perfetto's JSON importer
(``src/trace_processor/importers/json/json_trace_parser.cc``, ``FlowTracker``): a flow
v1 ``s`` event binds to the innermost *thread* slice open at its ``ts``, never to an async
slice, and an ``f`` event with ``bp: "e"`` to the innermost thread slice open at its ``ts``.
Flow v2 (``bind_id``) can leave an async slice, but a slice carries one ``bind_id``, and a
forward step serves many requests. So each linked request gets a thread slice of its own on
a "requests of replica_<r> → forward steps" track of the process its span is in, laid out on
as many lanes (threads) as such requests overlap, and each arrow is an ``s`` on that slice and
an ``f`` at the forward step's begin. Events of equal ``ts`` are read in file order, so the
link events come after everything they bind to.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aprof._otel import served
from aprof._timeline.recorder import span_id_of

REQUESTS_RECORD = "requests: "
"""How the reference server's record of a forward step's request ids begins."""
MAX_FLOWS = 200_000
"""Arrows drawn per merged step at most (each is two events); a note says when more were found."""
LANE_TID = 1 << 30
"""The first thread id of the request lanes: above any operating system's thread ids."""
CATEGORY = "aprof.link"
_FLOW = "served by"


@dataclass(frozen=True)
class RequestSpan:
    """One request span of the step, as placed in the merged trace."""

    request_id: str
    replica: int
    pid: int
    begin: float
    end: float


@dataclass(frozen=True)
class ForwardStep:
    """One ``forward_step#<k>`` slice of a replica's trace that names its requests."""

    replica: int
    pid: object
    tid: object
    ts: float
    ids: tuple[str, ...]


@dataclass(frozen=True)
class ServerSpan:
    """A server's own span of one request (OpenTelemetry), as placed in the merged trace."""

    name: str
    begin: float
    end: float
    attributes: dict[str, Any]
    phases: tuple[tuple[str, float, float], ...]
    """Queued, prefill, decode: each part's name, begin and end."""


@dataclass
class Links:
    """Collects a merged step's request spans, forward steps and servers' request spans;
    then draws the arrows and nests the servers' spans under their requests."""

    spans: dict[tuple[int, str], list[RequestSpan]] = field(default_factory=dict)
    steps: list[ForwardStep] = field(default_factory=list)
    server: dict[str, ServerSpan] = field(default_factory=dict)
    """The servers' request spans by their parent span id (the aprof request's)."""
    _open: dict[tuple[object, ...], dict[str, Any]] = field(default_factory=dict)

    def see_timeline(self, events: Iterable[dict[str, Any]]) -> None:
        """Take the request spans of a timeline's placed events (a span may end in a later
        part of the same timeline)."""
        for event in events:
            phase = event.get("ph")
            if event.get("cat") != "request" or phase not in ("b", "e"):
                continue
            key = (event.get("pid"), str(event.get("id2")), str(event.get("id")))
            if phase == "b":
                self._open[key] = event
                continue
            begun = self._open.pop(key, None)
            span = _span(begun, event) if begun is not None else None
            if span is not None:
                self.spans.setdefault((span.replica, span.request_id), []).append(span)

    def see_otel(self, spans: Iterable[dict[str, Any]], base_ns: int) -> int:
        """Take the servers' request spans (``otel/step_<n>.spans.jsonl`` lines), placed on
        the merged clock (``base_ns``); the number that were not spans of a request."""

        def placed(ns: int) -> float:
            return round((ns - base_ns) / 1000, 3)

        requests, skipped = served(spans)
        for parent, request in requests.items():
            self.server[parent] = ServerSpan(
                request.name,
                placed(request.begin_ns),
                placed(request.end_ns),
                dict(request.attributes),
                tuple((p.name, placed(p.begin_ns), placed(p.end_ns)) for p in request.phases),
            )
        return skipped

    def events(self, notes: list[str], first_id: int) -> Iterator[dict[str, Any]]:
        """The lanes, arrows and servers' spans (arrows at most ``MAX_FLOWS``, their flow ids
        from ``first_id`` on: the merged file's others lie below); a note in ``notes`` when
        more were found."""
        pairs = list(self._pairs())
        if len(pairs) > MAX_FLOWS:
            notes.append(
                f"links: {len(pairs)} arrows from requests to forward steps found, "
                f"the first {MAX_FLOWS} drawn"
            )
            pairs = pairs[:MAX_FLOWS]
        served: dict[RequestSpan, list[ForwardStep]] = {}
        for span, step in pairs:
            served.setdefault(span, []).append(step)
        nested = self._nested()
        lanes = _lanes([*served, *(s for s in nested if s not in served)])
        yield from _lane_metadata(lanes)
        for span, tid in lanes.items():
            yield {
                "ph": "X",
                "cat": CATEGORY,
                "name": f"request {span.request_id}",
                "pid": span.pid,
                "tid": tid,
                "ts": span.begin,
                "dur": round(span.end - span.begin, 3),
                "args": {
                    "request_id": span.request_id,
                    "replica": span.replica,
                    "forward_steps": len(served.get(span, ())),
                },
            }
        for span, server in nested.items():
            yield from _server_slices(span, server, lanes[span])
        for number, (span, step) in enumerate(pairs, start=first_id):
            flow = {"cat": CATEGORY, "name": _FLOW, "id": number}
            yield {**flow, "ph": "s", "pid": span.pid, "tid": lanes[span], "ts": span.begin}
            yield {**flow, "ph": "f", "bp": "e", "pid": step.pid, "tid": step.tid, "ts": step.ts}

    def _nested(self) -> dict[RequestSpan, ServerSpan]:
        """Each request span with the server's span of it: the one whose parent is the
        request's span id (of its trace context)."""
        if not self.server:
            return {}
        found: dict[RequestSpan, ServerSpan] = {}
        for spans in self.spans.values():
            server = self.server.get(span_id_of(spans[0].request_id))
            if server is not None:
                # An id used twice: the span that holds the server's, else the nearest.
                found[min(spans, key=lambda s: abs(s.begin - server.begin))] = server
        return found

    def _pairs(self) -> Iterator[tuple[RequestSpan, ForwardStep]]:
        """Each (request span, forward step naming it) of one replica, by forward step time."""
        for step in sorted(self.steps, key=lambda s: (s.ts, s.replica)):
            for request_id in dict.fromkeys(step.ids):
                spans = self.spans.get((step.replica, request_id))
                if spans:
                    # An id used twice: the span that covers the step, else the nearest.
                    yield min(spans, key=lambda s: max(s.begin - step.ts, step.ts - s.end, 0)), step


class ServerTrace:
    """One replica trace's forward steps and request records, as its events come (placed);
    :meth:`end` gives those forward steps that hold a record, for :attr:`Links.steps`."""

    def __init__(self, replica: int) -> None:
        self._replica = replica
        self._forward: list[tuple[float, float, object, object]] = []
        self._records: list[tuple[tuple[object, str], float, list[str]]] = []

    def see(self, events: Iterable[dict[str, Any]]) -> None:
        """Take the forward steps and request records among ``events`` (placed)."""
        for event in events:
            if _slice(event, "forward_step#"):
                begin = event["ts"]
                self._forward.append(
                    (begin, begin + event["dur"], event.get("pid"), event.get("tid"))
                )
            elif _slice(event, REQUESTS_RECORD):
                self._records.append((_thread(event), event["ts"], request_ids(event["name"])))

    def end(self) -> list[ForwardStep]:
        """Each forward step that holds a request record, with the ids it names."""
        by_thread: dict[tuple[object, str], list[tuple[float, float, int]]] = defaultdict(list)
        for index, (begin, end, pid, tid) in enumerate(self._forward):
            by_thread[(pid, str(tid))].append((begin, end, index))
        for slices in by_thread.values():
            slices.sort()
        named: dict[int, list[str]] = {}
        for thread, ts, ids in self._records:
            holder = _enclosing(by_thread.get(thread, []), ts)
            if holder is not None:
                named.setdefault(holder, []).extend(ids)
        found = []
        for index, ids in named.items():
            begin, _, pid, tid = self._forward[index]
            found.append(ForwardStep(self._replica, pid, tid, begin, tuple(ids)))
        return found


def request_ids(name: str) -> list[str]:
    """The ids a ``requests: a,b (+N more)`` record names."""
    listed = name[len(REQUESTS_RECORD) :].split(" ", 1)[0]
    return [request_id for request_id in listed.split(",") if request_id]


def _span(begin: dict[str, Any], end: dict[str, Any]) -> RequestSpan | None:
    args = begin.get("args")
    if not isinstance(args, dict):
        return None
    request_id, replica = args.get("request_id"), args.get("replica")
    if not isinstance(request_id, str) or not isinstance(replica, int):
        return None
    b, e = begin.get("ts"), end.get("ts")
    if not isinstance(b, int | float) or not isinstance(e, int | float) or e < b:
        return None
    pid = begin.get("pid")
    if not isinstance(pid, int):
        return None
    return RequestSpan(request_id, replica, pid, b, e)


def _slice(event: dict[str, Any], prefix: str) -> bool:
    """A complete slice (placed: its ``ts`` is a number) whose name begins with ``prefix``."""
    name, dur = event.get("name"), event.get("dur")
    return (
        event.get("ph") == "X"
        and isinstance(name, str)
        and name.startswith(prefix)
        and isinstance(event.get("ts"), int | float)
        and isinstance(dur, int | float)
        and not isinstance(dur, bool)
    )


def _thread(event: dict[str, Any]) -> tuple[object, str]:
    """The thread an event is on, as a key (a hostile trace's ``tid`` may be a list)."""
    return event.get("pid"), str(event.get("tid"))


def _enclosing(slices: list[tuple[float, float, int]], ts: float) -> int | None:
    """The index of the slice of ``slices`` (sorted, not overlapping) that holds ``ts``."""
    at = bisect.bisect_right(slices, (ts, float("inf"), 0)) - 1
    if at >= 0 and slices[at][0] <= ts <= slices[at][1]:
        return slices[at][2]
    return None


def _server_slices(span: RequestSpan, server: ServerSpan, tid: int) -> Iterator[dict[str, Any]]:
    """The server's span nested under its request's lane slice, its phases under it: each
    kept within its parent and after the phase before it, as a thread's slices must nest
    (clocks of two hosts may not)."""
    begin = min(max(server.begin, span.begin), span.end)
    end = max(min(server.end, span.end), begin)
    base = {"cat": "aprof.server", "pid": span.pid, "tid": tid, "ph": "X"}
    args = {"request_id": span.request_id, **server.attributes}
    yield {**base, "name": server.name, "ts": begin, "dur": round(end - begin, 3), "args": args}
    at = begin
    for name, phase_begin, phase_end in server.phases:
        phase_begin = min(max(phase_begin, at), end)
        phase_end = min(max(phase_end, phase_begin), end)
        if phase_end > phase_begin:
            dur = round(phase_end - phase_begin, 3)
            yield {**base, "name": name, "ts": phase_begin, "dur": dur}
            at = phase_end


def _lanes(linked: Iterable[RequestSpan]) -> dict[RequestSpan, int]:
    """A thread id per linked request: per process and replica, as few lanes as overlapping
    requests need (a thread's slices must nest, and requests overlap without nesting)."""
    lanes: dict[RequestSpan, int] = {}
    groups: dict[tuple[int, int], list[RequestSpan]] = defaultdict(list)
    for span in linked:
        groups[(span.pid, span.replica)].append(span)
    used: dict[int, int] = defaultdict(int)  # lanes per process so far
    for (pid, _), spans in sorted(groups.items()):
        free: list[tuple[float, int]] = []  # (when the lane is free, its tid)
        for span in sorted(spans, key=lambda s: (s.begin, s.end)):
            if free and free[0][0] < span.begin:
                _, tid = heapq.heappop(free)
            else:
                tid = LANE_TID + used[pid]
                used[pid] += 1
            lanes[span] = tid
            heapq.heappush(free, (span.end, tid))
    return lanes


def _lane_metadata(lanes: dict[RequestSpan, int]) -> Iterator[dict[str, Any]]:
    """Each lane's name and place (after the process's own threads)."""
    named: dict[tuple[int, int], int] = {}
    for span, tid in lanes.items():
        named[(span.pid, tid)] = span.replica
    for (pid, tid), replica in sorted(named.items()):
        name = f"requests of replica_{replica} → forward steps"
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
        yield {
            "ph": "M",
            "name": "thread_sort_index",
            "pid": pid,
            "tid": tid,
            "args": {"sort_index": tid},
        }
