"""The timeline's events: one tuple per span, request, step or window, recorded when it ends.

Times are monotonic ns (``time.monotonic_ns``); the manifest's clock anchors them to wall time.
Standard library only: the writer process loads this module too.
"""

from __future__ import annotations

import time
from typing import Any, Final

now_ns: Final = time.monotonic_ns
"""The timeline's clock; the manifest's ``clock.monotonic_ns`` anchors it to wall time."""

Event = tuple[Any, ...]
"""One recorded span, request, step or window; its first item is one of the kinds below."""

AttrValue = str | int | float | bool | None
"""A span attribute's value; anything else is recorded as its ``str()``."""

SPAN: Final = 0
"""``(SPAN, name, begin_ns, end_ns, step, note, *keys, *values)``: a ``prof.span`` and its
attrs, flat."""
REQUEST: Final = 1
"""``(REQUEST, begin_ns, end_ns, replica, request_id, step, gated, captured, tokens,
prompt_tokens, trajectory, turn, note)``; ``trajectory`` and ``turn`` are ``None`` when the
client did not say them."""
STEP: Final = 2
"""``(STEP, begin_ns, end_ns, n, selected)``: one global step."""
WINDOW: Final = 3
"""``(WINDOW, target, kind, step, marks, end_ns, state, stop_reason, enforced_by, error, note)``;
``marks`` holds ``(phase, begin_ns)`` for each of starting, active, stopping it went through."""
