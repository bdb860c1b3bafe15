"""Reading the traces a capture wrote: which forward steps does a file hold?"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

_FORWARD_STEP = re.compile(r"^forward_step#(\d+)$")


def load_trace(path: Path) -> dict[str, Any]:
    """The Chrome trace JSON object of a ``.json`` or ``.json.gz`` file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as stream:
        data: dict[str, Any] = json.load(stream)
    return data


def forward_step_numbers(path: Path) -> list[int]:
    """The sorted forward-step numbers ``k`` of the ``forward_step#<k>`` records in a trace."""
    steps = set()
    for event in load_trace(path).get("traceEvents", []):
        match = _FORWARD_STEP.match(str(event.get("name", "")))
        if match and event.get("ph") == "X":
            steps.add(int(match.group(1)))
    return sorted(steps)
