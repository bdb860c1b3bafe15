"""The disk guard: while the manifest cannot be written, no capture starts.

A capture the manifest cannot list would be lost to its reader, so the trouble, as the
manifest's writer tells it, stops the captures running (the guard tells those that listen: the
windows) and refuses every start until a write succeeds again. It is said once on the log each
way; when the disk takes writes again, the manifest says from when to when, how many windows
were not started and which step files were given up meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from aprof._manifest import ManifestFiles, Note


class DiskGuard:
    """Whether the manifest can be written now, as its writer (``files``) last told."""

    def __init__(self, files: ManifestFiles, log: structlog.typing.FilteringBoundLogger) -> None:
        self._files = files
        self._log = log
        self.error: str | None = None
        """Why the manifest cannot be written now; ``None`` while it can."""
        self._since = 0
        self._not_started = 0
        """Windows refused since the trouble began."""
        self._listeners: list[Callable[[str], None]] = []
        files.listen_trouble(self._trouble)

    def listen(self, listener: Callable[[str], None]) -> None:
        """Have ``listener(why)`` told each time the trouble begins, from now on: the
        captures running must stop."""
        self._listeners.append(listener)

    def refused(self) -> str | None:
        """Why a window may not start now (counted as not started), ``None`` if it may."""
        if self.error is None:
            return None
        self._not_started += 1
        return f"the manifest cannot be written ({self.error})"

    def _trouble(self, error: str | None) -> None:
        """The manifest cannot be written (``error``), or can again (``None``)."""
        if error is None:
            if self.error is not None:
                self._recovered()
            return
        began = self.error is None
        self.error = error
        if began:
            self._since, self._not_started = time.time_ns(), 0
            self._log.error(
                "manifest cannot be written: no capture starts until it can", error=error
            )
            for listener in self._listeners:
                listener(f"the manifest could not be written ({error})")

    async def recheck(self, limit_s: float) -> None:
        """While in trouble, try the writes again and wait (at most ``limit_s``) for the
        answer, told before this returns."""
        if self.error is not None:
            await self._files.flush(limit_s)

    def _recovered(self) -> None:
        since, now = _wall(self._since), _wall(time.time_ns())
        given_up = self._files.take_given_up()
        self._log.warning("manifest written again", not_started=self._not_started)
        lost = f"; step files given up meanwhile: {', '.join(given_up)}" if given_up else ""
        self._files.add_note(
            Note(
                step=None,
                target=None,
                text=f"the manifest could not be written from {since} to {now} ({self.error}): "
                f"{self._not_started} window(s) were not started then and the captures "
                f"running were stopped{lost}",
                level="problem",
            )
        )
        self.error = None


def _wall(ns: int) -> str:
    """Wall-clock nanoseconds as local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))
