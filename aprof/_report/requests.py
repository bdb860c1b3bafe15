"""What the timelines give: the request spans, their latencies by step and by capture, the
gated requests' waits for their capture, and the steps' and requests' intervals on one clock.
How each number is taken: :mod:`aprof._report`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace
from typing import Any

from aprof._accounting import Ledger
from aprof._report.clock import US, Earliest, interval, number
from aprof._report.model import Interval


@dataclass
class StepRequests:
    captured: array[float] = field(default_factory=lambda: array("d"))
    uncaptured: array[float] = field(default_factory=lambda: array("d"))
    gated_replica: array[int] = field(default_factory=lambda: array("q"))
    gated_begin_us: array[float] = field(default_factory=lambda: array("d"))
    """Wall clock, µs since the epoch."""


class Requests:
    """What the timelines say: request latencies by step, gated requests, capture starts."""

    def __init__(self, profiled: set[int], ledger: Ledger) -> None:
        self.profiled_steps = profiled
        self.ledger = ledger
        """Every step's spans, requests and stages, for the accounting."""
        self.accounted: set[str] = set()
        """Processes whose timelines' ledgers the ledger took already (``ledgers.py``): their
        timelines are not accounted again."""
        self.steps: dict[int, StepRequests] = {}
        self.spans: dict[int, Earliest] = {}
        """Per profiled step: its request spans, the earliest ``TIMELINE_ITEMS``."""
        self.step_spans: dict[int, Interval] = {}
        """Per profiled step: the driver's ``step`` slice."""
        self.started_us: dict[tuple[int, str], float] = {}
        """(step, target) -> when its capture's ``starting`` slice ended, wall-clock µs."""
        self._open: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
        """Per process: the request spans begun in one part and not yet ended."""

    def add_file(self, data: dict[str, Any], process: str) -> None:
        """Take one timeline part's requests and capture starts; nothing of it if it fails."""
        base = data.get("baseTimeNanoseconds")
        if not isinstance(base, int) or isinstance(base, bool):
            raise ValueError("on no known clock (no baseTimeNanoseconds)")
        base_us = base / 1000
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError("no traceEvents list")
        begun = dict(self._open.get(process, {}))
        done: list[tuple[float, float, dict[str, Any]]] = []
        spans: list[tuple[float, float, dict[str, Any]]] = []
        """Spans the accounting reads (stages, staleness): begin, end, args."""
        captures: dict[str, tuple[int, str]] = {}
        started: dict[tuple[int, str], float] = {}
        step_spans: dict[int, Interval] = {}
        walls: list[tuple[int, Interval, bool]] = []
        for event in events:
            if not isinstance(event, dict):
                continue
            ts = number(event.get("ts"))
            if ts is None:
                continue
            cat, phase = event.get("cat"), event.get("ph")
            key = _local_id(event)
            if cat == "step" and phase == "X":
                step = _integer(_arg(event, "step"))
                span = interval(base, ts, number(event.get("dur")), f"step {step}")
                if step is not None and span is not None:
                    walls.append((step, span, _arg(event, "profiled") is True))
                    if step in self.profiled_steps:
                        step_spans.setdefault(step, span)
            elif cat == "span" and key is not None:
                if phase == "b":
                    args = event.get("args")
                    if not isinstance(args, dict):
                        continue
                    if "aprof" in args or "staleness" in args:
                        begun[key] = (ts, args)
                elif phase == "e" and key in begun:
                    begin, args = begun.pop(key)
                    spans.append((begin, ts, args))
            elif cat == "request" and key is not None:
                if phase == "b":
                    args = event.get("args")
                    begun[key] = (ts, args if isinstance(args, dict) else {})
                elif phase == "e" and key in begun:
                    begin, args = begun.pop(key)
                    done.append((begin, ts, args))
            elif cat == "capture" and key is not None:
                args = event.get("args")
                name = event.get("name")
                window = _window_of(args)
                if phase == "b" and window is not None:
                    captures[key] = window
                elif phase == "e" and name == "starting" and key in captures:
                    started.setdefault(captures[key], ts + base_us)
                elif phase == "n" and window is not None:
                    started.setdefault(window, ts + base_us)  # never started, or after it
        # The whole part is read: now it counts.
        self._open[process] = begun
        for window, when in started.items():
            self.started_us.setdefault(window, when)
        for step, span in step_spans.items():
            self.step_spans.setdefault(step, span)
        account = process not in self.accounted
        for begin, end, args in done:
            self._request(
                begin + base_us, end + base_us, args, interval(base, begin, end - begin, "")
            )
            if account:
                self._account(base, begin, end, args, process)
        if not account:
            return
        ledger = self.ledger
        for step, span, profiled in walls:
            ledger.step(step, span.begin_ns, span.end_ns, profiled=profiled)
        for begin, end, args in spans:
            ledger.span(base + round(begin * 1000), base + round(end * 1000), args, None)
        ledger.settle()

    def _account(
        self, base: int, begin: float, end: float, args: dict[str, Any], process: str
    ) -> None:
        replica = _integer(args.get("replica"))
        if replica is None:
            return
        request_id = args.get("request_id")
        tokens = _integer(args.get("tokens"))
        prompt_tokens = _integer(args.get("prompt_tokens"))
        trajectory = args.get("trajectory")
        self.ledger.request(
            base + round(begin * 1000),
            base + round(end * 1000),
            step=_integer(args.get("step")),
            replica=replica,
            request_id=request_id if isinstance(request_id, str) else None,
            tokens=tokens or 0,
            prompt_tokens=prompt_tokens or 0,
            trajectory=trajectory if isinstance(trajectory, str) else None,
            turn=_integer(args.get("turn")),
            gated=args.get("gated") is True,
            process=process,
        )

    def _request(
        self, begin_us: float, end_us: float, args: dict[str, Any], span: Interval | None
    ) -> None:
        """One request span: ``begin_us`` and ``end_us`` on the wall clock, ``span`` as
        exactly (ns), when it is on the clock the report draws."""
        step = _integer(args.get("step"))
        latency = (end_us - begin_us) * US
        if step not in self.profiled_steps or not latency >= 0:
            return
        mine = self.steps.setdefault(step, StepRequests())
        (mine.captured if args.get("captured") is True else mine.uncaptured).append(latency)
        replica = _integer(args.get("replica"))
        if args.get("gated") is True and replica is not None and abs(replica) < 1 << 62:
            mine.gated_replica.append(replica)
            mine.gated_begin_us.append(begin_us)
        request_id = args.get("request_id")
        label = f"request {request_id}" if isinstance(request_id, str) else "request"
        if args.get("gated") is True:
            label += " · gated"
        state = "captured" if args.get("captured") is True else "uncaptured"
        if span is not None:
            span = replace(span, label=label, state=state)
            row = "requests" if replica is None else f"requests → replica_{replica}"
            self.spans.setdefault(step, Earliest()).add(row, span)


def gated_waits(
    step: int, mine: StepRequests, started_us: dict[tuple[int, str], float]
) -> tuple[list[float], dict[str, int]]:
    waits: list[float] = []
    missing: dict[str, int] = {}
    for replica, begin in zip(mine.gated_replica, mine.gated_begin_us, strict=True):
        target = f"replica_{replica}"
        started = started_us.get((step, target))
        if started is None:
            missing[target] = missing.get(target, 0) + 1
        else:
            waits.append(max(0.0, (started - begin) * US))
    return waits, missing


def _arg(event: dict[str, Any], name: str) -> object:
    args = event.get("args")
    return args.get(name) if isinstance(args, dict) else None


def _window_of(args: object) -> tuple[int, str] | None:
    if not isinstance(args, dict):
        return None
    step, target = _integer(args.get("step")), args.get("target")
    return None if step is None or not isinstance(target, str) else (step, target)


def _local_id(event: dict[str, Any]) -> str | None:
    ids = event.get("id2")
    if isinstance(ids, dict) and "local" in ids:
        return str(ids["local"])
    return None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
