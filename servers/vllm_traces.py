"""A vLLM window's traces: picked out of vLLM's trace folder, moved into the window's folder
and counted.

vLLM writes every capture into the one trace folder fixed at its launch. A window's files are
those named ``<prefix>_...`` where its start set a prefix, else those new or rewritten since
its start (a :class:`Mark` taken just before it). The HTTP adapter (``servers.vllm``) and the
in-process engine (``servers.engines``) both collect with this; each says in its own words
what the result means. The file work runs off the event loop (``servers.trace_files``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from aprof import Window
from servers.trace_files import listing, relocate, vllm_steps_in


@dataclass(frozen=True, slots=True)
class Mark:
    """vLLM's trace folder just before a start, for matching the window's files by time."""

    started_ns: int
    """Wall clock just before the start."""
    before: dict[str, int] | None
    """The folder's entries (name -> mtime) then; ``None`` when files are matched by prefix,
    or the folder is unknown or not reachable."""


@dataclass(frozen=True, slots=True)
class Traces:
    """What a window's traces came to."""

    moved: tuple[Path, ...] = ()
    """The files now in the window's folder."""
    kept: tuple[Path, ...] = ()
    """The window's files that could not be moved, where vLLM wrote them."""
    steps: int | None = None
    """Engine steps the worker traces hold; ``None`` if none is readable."""

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file of the window: those moved, then those left where vLLM wrote them."""
        return self.moved + self.kept


async def mark(folder: Path | None, *, by_prefix: bool) -> Mark:
    """The :class:`Mark` of ``folder`` before a start (no listing when ``by_prefix``)."""
    before = None if by_prefix else await asyncio.to_thread(listing, folder)
    return Mark(time.time_ns(), before)


async def collect(folder: Path, window: Window, since: Mark, prefix: str | None) -> Traces | None:
    """Move ``window``'s traces from vLLM's trace ``folder`` into ``window.dir`` (those named
    ``<prefix>_...``, or without ``prefix`` those written since ``since``) and count their
    engine steps; ``None`` when ``folder`` is not reachable from here."""
    return await asyncio.to_thread(_collect, folder, window, since, prefix)


def _collect(folder: Path, window: Window, since: Mark, prefix: str | None) -> Traces | None:
    found = relocate(folder, window.dir, prefix, since.before, since.started_ns, root=window.root)
    if found is None:
        return None
    moved, kept = found
    return Traces(tuple(moved), tuple(kept), vllm_steps_in(moved + kept))
