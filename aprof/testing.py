"""Helpers for tests of code that uses aprof: a recording target and manifest assertions."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aprof._capture import CaptureResult, TargetKind, Window
from aprof._errors import AprofError, TargetError
from aprof._manifest import Manifest, load_manifest

Fault = bool | Collection[int]
"""``True`` for every window, or the global steps whose windows it hits."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call a :class:`RecordingTarget` received."""

    op: Literal["start", "stop", "forward_steps"]
    window: Window | None


class TargetFault(AprofError, RuntimeError):
    """The failure a :class:`RecordingTarget` raises when told to fail."""


class RecordingTarget:
    """A capture target that keeps every call it gets and can be slow, fail or hang.

    It behaves like a strict server: a second start while a capture is active, or a stop
    with none active, raise. ``advance(k)`` moves its engine forward-step counter; with
    ``enforces_window=True`` it ends a capture itself after ``delay + forward_steps``.
    ``stop`` writes one small trace file into the window's folder. ``start_gate`` and
    ``stop_gate`` hold the call until the test sets them.
    """

    def __init__(
        self,
        name: str,
        *,
        kind: TargetKind = "rollout",
        replica: int | None = None,
        role: str | None = None,
        rank: int | None = None,
        tool: str | None = None,
        enforces_window: bool = False,
        counter: bool = True,
        start_latency: float = 0.0,
        stop_latency: float = 0.0,
        fail_start: Fault = False,
        fail_stop: Fault = False,
        hang_start: Fault = False,
        hang_stop: Fault = False,
        start_gate: asyncio.Event | None = None,
        stop_gate: asyncio.Event | None = None,
    ) -> None:
        if kind == "rollout" and replica is None:
            raise TargetError("a rollout RecordingTarget needs replica=")
        self.name = name
        self.kind: TargetKind = kind
        self.replica = replica
        self.enforces_window = enforces_window
        self.role = role or name
        if rank is not None:
            self.rank = rank
        if tool is not None:
            self.tool = tool
        self.calls: list[Call] = []
        """Every call, in order."""
        self.count = 0
        """The engine forward-step counter ``forward_steps()`` reports."""
        self.active: Window | None = None
        """The capture running now, if any."""
        self._counter = counter
        self._latency = (start_latency, stop_latency)
        self._fail = (fail_start, fail_stop)
        self._hang = (hang_start, hang_stop)
        self._gates = (start_gate, stop_gate)
        self._called = asyncio.Condition()
        self._started_at = 0
        self._auto_stopped: Window | None = None

    @property
    def starts(self) -> list[Window]:
        """Windows passed to ``start``, in order."""
        return [c.window for c in self.calls if c.op == "start" and c.window is not None]

    @property
    def stops(self) -> list[Window]:
        """Windows passed to ``stop``, in order."""
        return [c.window for c in self.calls if c.op == "stop" and c.window is not None]

    async def wait_calls(
        self, op: Literal["start", "stop", "forward_steps"], count: int = 1, *, limit_s: float = 10
    ) -> None:
        """Wait until ``op`` has been called ``count`` times; ``TimeoutError`` after ``limit_s``."""
        async with asyncio.timeout(limit_s), self._called:
            await self._called.wait_for(lambda: sum(c.op == op for c in self.calls) >= count)

    async def _record(
        self, op: Literal["start", "stop", "forward_steps"], window: Window | None
    ) -> None:
        self.calls.append(Call(op, window))
        async with self._called:
            self._called.notify_all()

    def advance(self, steps: int = 1) -> None:
        """Run ``steps`` engine forward steps."""
        self.count += steps
        window = self.active
        if (
            self.enforces_window
            and window is not None
            and window.forward_steps is not None
            and self.count - self._started_at >= window.delay + window.forward_steps
        ):
            self._auto_stopped, self.active = window, None

    async def start(self, window: Window) -> None:
        """Start a capture (see the class docstring for faults)."""
        await self._record("start", window)
        await self._misbehave(0, window)
        if self.active is not None:
            raise TargetFault(f"{self.name}: a capture is already active")
        self.active, self._started_at, self._auto_stopped = window, self.count, None

    async def stop(self, window: Window) -> CaptureResult:
        """Stop a capture and write its trace file."""
        await self._record("stop", window)
        await self._misbehave(1, window)
        # By value: a window that crossed processes (a placed target) is a copy.
        auto = self._auto_stopped == window
        if not auto and self.active != window:
            raise TargetFault(f"{self.name}: no capture of {window.prefix} is active")
        self.active = None
        trace = window.dir / f"{window.prefix}.trace.json"
        trace.write_text(json.dumps({"traceEvents": [], "window": window.prefix}))
        captured = self.count - self._started_at
        if self.enforces_window and window.forward_steps is not None:
            captured = max(0, min(captured, window.delay + window.forward_steps) - window.delay)
        return CaptureResult(
            files=(trace,),
            forward_steps=captured if self._counter else None,
            counted_from="counter" if self._counter else None,
            auto_stopped=auto,
        )

    async def forward_steps(self) -> int | None:
        """The forward-step counter, or ``None`` when built with ``counter=False``."""
        await self._record("forward_steps", None)
        return self.count if self._counter else None

    async def _misbehave(self, which: int, window: Window) -> None:
        gate = self._gates[which]
        if gate is not None:
            await gate.wait()
        if _hits(self._hang[which], window.step):
            await asyncio.Event().wait()
        if self._latency[which] > 0:
            await asyncio.sleep(self._latency[which])  # simulated server latency
        if _hits(self._fail[which], window.step):
            op = ("start", "stop")[which]
            raise TargetFault(f"{self.name}: {op} refused for step {window.step}")


def _hits(fault: Fault, step: int) -> bool:
    return fault is True or (not isinstance(fault, bool) and step in fault)


def assert_windows(
    manifest: Manifest | str | os.PathLike[str],
    expected: Iterable[Mapping[str, Any]],
    *,
    exact: bool = True,
) -> None:
    """Assert ``manifest`` holds one window matching each mapping of ``expected``.

    Keys are window fields; dotted keys reach inside (``"forward_steps.observed"``). With
    ``exact`` (the default) no other window may exist. Raises ``AssertionError`` showing
    what was expected and what the manifest holds.
    """
    if not isinstance(manifest, Manifest):
        manifest = load_manifest(manifest)
    windows = [w.model_dump() for w in manifest.windows]
    remaining = list(range(len(windows)))
    missing = []
    for want in expected:
        match = next((i for i in remaining if _matches(windows[i], want)), None)
        if match is None:
            missing.append(dict(want))
        else:
            remaining.remove(match)
    extra = [windows[i] for i in remaining] if exact else []
    if missing or extra:
        lines = ["manifest windows differ from what was expected"]
        lines += [f"  missing: {w}" for w in missing]
        lines += [f"  unexpected: {_brief(w)}" for w in extra]
        lines += ["  the manifest holds:"] + [f"    {_brief(w)}" for w in windows]
        raise AssertionError("\n".join(lines))


def _matches(window: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    for key, value in want.items():
        found: Any = window
        for part in key.split("."):
            if not isinstance(found, Mapping) or part not in found:
                return False
            found = found[part]
        if found != value:
            return False
    return True


def _brief(window: Mapping[str, Any]) -> str:
    keys = ("step", "target", "state", "stop_reason", "error")
    return ", ".join(f"{k}={window[k]!r}" for k in keys)
