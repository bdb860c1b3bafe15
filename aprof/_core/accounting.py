"""Where each of a live run's latest steps went, as far as the timelines written so far tell.

Every timeline writer keeps the ledger of what it writes (``aprof._timeline.chrome_trace``):
the driver's own arrives after each of its writes (at every step's end), every other
process's with its reports to the driver. :class:`LiveAccounting` merges them and keeps the
last ``KEEP`` steps, so its memory and the cost of a step's account stay flat on a run of any
length. A step's account grows as other processes' ledgers arrive (within their next report,
a few seconds at most); ``aprof report`` reads the same from the files, for every step.
"""

from __future__ import annotations

from typing import Any

from aprof._accounting import Ledger, StepAccount
from aprof._errors import describe
from aprof._logging import logger

KEEP = 16
"""The latest steps kept."""


class LiveAccounting:
    """The merged ledger of every process's timeline writes, for the last ``KEEP`` steps."""

    def __init__(self) -> None:
        self._ledger = Ledger()
        self._lost = False

    def take(self, plain: Any, source: str) -> None:
        """Merge a ledger's plain data (from ``source``, for the log) and let go of old steps;
        data of another shape is logged once and costs itself only."""
        if not plain:
            return
        try:
            self._ledger.merge(plain)
        except Exception as exc:  # not a ledger: merge checks it whole before it takes it
            if not self._lost:
                self._lost = True
                logger.warning("aprof accounting data lost", source=source, error=describe(exc))
            return
        last = self._ledger.last_step()
        if last is not None:
            self._ledger.forget_before(last - KEEP + 1)

    def account(self, step: int | None = None) -> StepAccount | None:
        """Step ``step`` (default: the latest one that ended), or ``None`` if no timeline
        write has told of it (yet, or any longer: only the last ``KEEP`` are kept)."""
        n = self._ledger.last_step() if step is None else step
        return None if n is None else self._ledger.account(n)
