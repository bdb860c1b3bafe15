"""Each request as its server told it. Among a step's spans, the server's span of an aprof
request is the one whose parent is the request's span id (a span not below another one of the
file), or, sent without trace context (verl calls its servers over Ray, with none), a span
with no parent whose ``gen_ai.request.id`` is the request's id. Its phases, queued, prefill
and decode, come from SGLang's own spans below it at their times, or else from vLLM's latency
attributes laid end to end from the span's start."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from aprof._otel.spans import LATENCIES, REQUEST_ID
from aprof._timeline.recorder import span_id_of

PHASES: Final = ("queued", "prefill", "decode")
"""A request's phases on its server, in the order they run."""
SLICES: Final = {
    "prefill_waiting": "queued",
    "prefill_forward": "prefill",
    "decode_forward": "decode",
}
"""SGLang's spans below a request that are one of its phases (0.5.23's stage names; its
``chunked_prefill`` parts lie inside ``prefill_forward``)."""
MAX_DEPTH: Final = 4
"""Levels below a request's server span searched for phases (SGLang: thread, stage, part)."""
TRACESTATE_KEY: Final = "aprof"
"""The ``tracestate`` member a request sends (``aprof=r<replica>``, ``req.tracestate``),
which a server's spans of it carry back."""


@dataclass(frozen=True)
class Phase:
    name: str
    begin_ns: int
    end_ns: int


@dataclass(frozen=True)
class Served:
    """A server's span of one aprof request and its phases (wall-clock ns)."""

    request_span: str
    """The request's span id (:func:`aprof._timeline.recorder.span_id_of` its request id):
    the span's parent, or the span id of the request it names."""
    name: str
    begin_ns: int
    end_ns: int
    replica: int | None
    """The replica the request went to, as its ``tracestate`` said; ``None`` when it sent none."""
    attributes: Mapping[str, Any]
    phases: tuple[Phase, ...]

    def seconds(self, phase: str) -> float | None:
        """The time of ``phase`` (summed over its parts); ``None`` when the server gave none."""
        found = [p.end_ns - p.begin_ns for p in self.phases if p.name == phase]
        return sum(found) / 1e9 if found else None

    @property
    def e2e_s(self) -> float:
        """The request's time on the server: its ``e2e`` attribute, else the span's length."""
        value = self.attributes.get(LATENCIES["e2e"])
        return float(value) if _seconds(value) else (self.end_ns - self.begin_ns) / 1e9


def served(spans: Iterable[dict[str, Any]]) -> tuple[dict[str, Served], int]:
    """The server's span of each request, by the request's span id, and the number of spans
    that were neither such a span nor below one (malformed, or with no parent and no
    request id)."""
    valid: list[dict[str, Any]] = []
    skipped = 0
    for span in spans:
        if (
            isinstance(span.get("span_id"), str)
            and _nanoseconds(span.get("start_ns"))
            and _nanoseconds(span.get("end_ns"))
            and span["end_ns"] >= span["start_ns"]
        ):
            valid.append(span)
        else:
            skipped += 1
    ids = {span["span_id"] for span in valid}
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    found: dict[str, Served] = {}
    tops: list[tuple[str, dict[str, Any]]] = []
    named: list[tuple[str, dict[str, Any]]] = []  # after the others: trace context comes first
    for span in valid:
        parent = span.get("parent_span_id")
        if isinstance(parent, str):
            if parent in ids:
                children[parent].append(span)
            else:
                tops.append((parent, span))
        elif isinstance(request_id := _attributes(span).get(REQUEST_ID), str):
            named.append((span_id_of(request_id), span))
        else:
            skipped += 1
    for request, span in tops + named:
        if request not in found:
            found[request] = _served(span, request, children)
    return found, skipped


def replica_of(trace_state: object) -> int | None:
    """The replica an ``aprof=r<k>`` member of a ``tracestate`` names, if any."""
    if not isinstance(trace_state, str):
        return None
    for member in trace_state.split(","):
        key, _, value = member.strip().partition("=")
        digits = value[1:]
        if key != TRACESTATE_KEY or value[:1] != "r" or not 0 < len(digits) <= 19:
            continue
        if digits.isascii() and digits.isdigit() and int(digits) < 2**63:
            return int(digits)
    return None


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    attributes = span.get("attributes")
    return attributes if isinstance(attributes, dict) else {}


def _served(span: dict[str, Any], request: str, children: Mapping[str, list[Any]]) -> Served:
    attributes = _attributes(span)
    begin, end = span["start_ns"], span["end_ns"]
    phases = _below(span["span_id"], children) or _laid_out(begin, end, attributes)
    return Served(
        request,
        str(span.get("name")),
        begin,
        end,
        replica_of(span.get("trace_state")),
        attributes,
        tuple(sorted(phases, key=lambda p: (p.begin_ns, PHASES.index(p.name)))),
    )


def _below(top: str, children: Mapping[str, list[dict[str, Any]]]) -> list[Phase]:
    """The phases among the spans below ``top`` (SGLang's stages)."""
    phases = []
    level, seen = [top], {top}
    for _ in range(MAX_DEPTH):
        below = []
        for span_id in level:
            for child in children.get(span_id, ()):
                if child["span_id"] in seen:
                    continue  # a hostile file's cycle
                seen.add(child["span_id"])
                below.append(child["span_id"])
                phase = SLICES.get(child.get("name"))  # type: ignore[arg-type]
                if phase is not None:
                    phases.append(Phase(phase, child["start_ns"], child["end_ns"]))
        level = below
    return phases


def _laid_out(begin: int, end: int, attributes: Mapping[str, Any]) -> list[Phase]:
    """The phases vLLM's attributes give (seconds each), one after another from ``begin``."""
    phases = []
    at = begin
    for name in PHASES:
        value = attributes.get(LATENCIES[name])
        if not _seconds(value):
            continue
        phase_end = min(at + round(value * 1e9), end)
        phases.append(Phase(name, at, phase_end))
        at = phase_end
    return phases


def _seconds(value: object) -> TypeGuard[float]:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _nanoseconds(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
