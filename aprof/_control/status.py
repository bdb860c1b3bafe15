"""A run as ``aprof status`` shows it: what the run writes to ``control/status.json`` at each
step boundary and each accepted capture, and when it closes."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from aprof._manifest import RequestedBy

STATUS_SCHEMA: Final = "aprof.status/1"
RECENT_WINDOWS = 20
"""Finished windows a status lists, newest last."""
MAX_LISTED = 200
"""Most open windows and planned steps a status lists (the rest are counted)."""


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class WindowStatus(_Part):
    """One window: open (its phase) or finished (its state and forward steps)."""

    step: int
    target: str
    kind: Literal["rollout", "role"]
    phase: str
    """``queued``, ``starting``, ``active``, ``stopping``, or its final state."""
    requested_by: RequestedBy
    forward_steps: int | None = None
    """Engine forward steps seen by a finished rollout window, if counted."""
    error: str | None = None


class PlannedStep(_Part):
    """A step not begun yet that will be captured, beyond those the config selects."""

    step: int
    targets: list[str]
    requested_by: list[RequestedBy]


class TriggerStatus(_Part):
    """One trigger and its baseline."""

    name: Literal["slow_step", "slow_rollout"]
    baseline: int
    """Unprofiled steps in its baseline so far."""
    baseline_steps: int
    """Steps the baseline needs before the trigger may fire."""
    median_s: float | None
    threshold_s: float | None
    """Slower than this counts as slow (``factor`` x the median), once the baseline is full."""
    last_s: float | None
    """The last step measured."""
    streak: int
    """Consecutive slow steps so far."""
    fired: int
    quiet_until: int | None
    """It fires at no step before this one (its captures and cooldown)."""


class RunStatus(_Part):
    """The run seen from outside."""

    schema_: Literal["aprof.status/1"] = Field(STATUS_SCHEMA, alias="schema")
    run_id: str
    pid: int
    host: str
    state: Literal["running", "ended"]
    updated_ns: int
    """Wall-clock time this status was written."""
    step: int | None
    """The global step open, if any."""
    step_began_ns: int | None
    """Wall-clock time the open step began."""
    last_step: int | None
    """The last global step begun."""
    longest_step_s: float
    """The longest time between two step boundaries so far: how long a request may wait."""
    windows: list[WindowStatus] = Field(default_factory=list)
    """Windows not ended yet."""
    recent: list[WindowStatus] = Field(default_factory=list)
    """The last finished windows, newest last."""
    planned: list[PlannedStep] = Field(default_factory=list)
    """Steps added by captures and triggers, not begun yet."""
    config_steps: str
    """The steps the config selects."""
    triggers: list[TriggerStatus] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    http: str | None = None
    """The control endpoint's address, when it is on."""
    folder: bool = True
    """The run reads ``control/requests/`` (``control.enable``)."""


def process_gone(pid: int) -> bool:
    """True when no process ``pid`` runs on this host (or only its zombie is left)."""
    if pid <= 0:
        return False  # not a process id kill(2) can be asked about: cannot tell
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: there, someone else's
        return False
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_bytes()[:4096]
        return stat.rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    return False
