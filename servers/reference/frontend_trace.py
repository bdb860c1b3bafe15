"""The API-server side trace vLLM writes at ``/stop_profile`` (its ``async_llm`` file).

Real vLLM runs a second torch profiler in the API-server process; one process cannot run
two torch profilers at once, so this server writes the front end's view itself: one
complete event per request that finished while the front end was recording, and one up to
the stop for each request it was still serving then (a profiler in the front end sees those
too).
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from servers.reference.engine import Sequence


@dataclass
class FrontendTrace:
    """Request spans recorded between a front-end start and stop."""

    events: list[dict[str, object]] = field(default_factory=list)

    def record(self, seq: Sequence) -> None:
        """Add the span of a finished (or dropped) request."""
        end_ns = seq.finished_ns or seq.arrival_ns
        self._add(seq, end_ns, {"output_tokens": len(seq.output)})

    def in_flight(self, seqs: list[Sequence], stop_ns: int) -> None:
        """Add the spans, up to ``stop_ns``, of the requests still being served at the stop."""
        for seq in seqs:
            self._add(seq, stop_ns, {"in_flight": True})

    def _add(self, seq: Sequence, end_ns: int, args: dict[str, object]) -> None:
        self.events.append(
            {
                "name": f"request {seq.id}",
                "cat": "frontend",
                "ph": "X",
                "pid": os.getpid(),
                "tid": 0,
                "ts": seq.arrival_ns / 1000,
                "dur": max(end_ns - seq.arrival_ns, 0) / 1000,
                "args": {"prompt_tokens": len(seq.prompt), **args},
            }
        )

    def write(self, path: Path) -> Path:
        """Write the spans as a gzip Chrome trace (complete or not at all) and return ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with gzip.open(partial, "wt", encoding="utf-8") as out:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, out)
        partial.replace(path)
        return path
