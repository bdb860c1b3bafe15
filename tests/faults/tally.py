"""The tally the fault suite keeps: what each test injected and checked, and what was lost."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

INJECTED = {
    "behaviours": "hostile server behaviours injected",
    "configs": "bad config inputs tried",
    "disk": "disk faults injected",
    "links": "links planted",
    "kills": "SIGKILLs of drivers",
    "windows": "windows checked",
    "requests": "requests raced",
    "control_entries": "hostile control-folder entries (names, types, floods)",
    "http_clients": "slow, unauthenticated and oversized HTTP clients",
    "span_bombs": "span-count bombs and far-step spans sent",
    "merge_kills": "merge workers killed",
    "exports": "export deadlines and credentials tried",
}
"""Tallies in the order of the table."""
LOST = {
    "escaped": "escaped exceptions",
    "not_final": "windows not final",
    "not_stopped": "started captures never stopped",
    "outside": "writes outside save_path",
    "unloadable": "manifests that do not load",
}
"""What counts as lost, by category."""


@dataclass
class Tally:
    """The session's counts."""

    counts: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)


class Faults:
    """One test's view of the tally: ``count`` what it injects, ``check`` each promise."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally
        self.losses: list[str] = []
        """What this test lost, one line each."""
        self.asserted = False
        """The test asserted that nothing was lost (the fixture need not again)."""

    def count(self, kind: str, n: int = 1) -> None:
        """Add ``n`` to the tally ``kind`` (a key of ``INJECTED``)."""
        assert kind in INJECTED, kind
        self._tally.counts[kind] += n

    def check(self, category: str, ok: bool, detail: str) -> bool:
        """One check of a promise; a failure is lost in ``category`` (a key of ``LOST``)."""
        assert category in LOST, category
        self._tally.checks[category] += 1
        if not ok:
            self._tally.lost[category] += 1
            self.losses.append(f"{LOST[category]}: {detail}")
        return ok

    def assert_nothing_lost(self) -> None:
        """Fail the test listing every loss it saw."""
        self.asserted = True
        if self.losses:
            shown = self.losses[:30]
            more = len(self.losses) - len(shown)
            raise AssertionError(
                f"{len(self.losses)} lost:\n  "
                + "\n  ".join(shown)
                + (f"\n  ... and {more} more" if more else "")
            )
