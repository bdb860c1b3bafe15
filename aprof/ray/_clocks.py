"""Each host's wall clock against the driver's, measured as NTP does: the driver notes when
it sends a probe and when the answer comes back, the host when it read its clock; the probe
of a burst with the shortest round trip bounds the offset best (to half its round trip)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aprof._manifest import HostClock

BURST = 8
"""Probes per host per measurement."""


@dataclass(frozen=True)
class Probe:
    """One probe: the driver's wall clock as it sent it and as the answer came, and the
    host's as it answered (NTP's two host times are one here: it answers at once)."""

    sent_ns: int
    read_ns: int
    back_ns: int

    @property
    def round_trip_ns(self) -> int:
        return self.back_ns - self.sent_ns

    @property
    def offset_ns(self) -> int:
        """What to add to the host's clock to read the driver's (the host read its clock
        halfway through the round trip, as well as one can tell)."""
        return (self.sent_ns + self.back_ns) // 2 - self.read_ns


def burst(read: Callable[[], int], count: int = BURST) -> list[Probe]:
    """``count`` probes, one after the other, of the host whose clock ``read`` asks for
    (blocking; what it raises ends the burst)."""
    probes = []
    for _ in range(count):
        sent = time.time_ns()
        answer = read()
        probes.append(Probe(sent, answer, time.time_ns()))
    return probes


class HostClocks:
    """Every host's clock as measured so far in one run."""

    def __init__(self, driver: str) -> None:
        """``driver``: the driver's host, whose clock the others are measured against."""
        self.driver = driver
        self._hosts = {
            driver: HostClock(
                host=driver, offset_ns=0, uncertainty_ns=0, measured_ns=time.time_ns()
            )
        }
        self._range: dict[str, tuple[int, int]] = {}

    def add(self, host: str, probes: Iterable[Probe]) -> None:
        """A burst of probes of ``host``: its best probe is kept if it bounds the offset
        more tightly than the best so far; its offset widens the drift seen."""
        taken = [p for p in probes if p.round_trip_ns >= 0]  # the driver's clock stepped back
        if not taken or host == self.driver:
            return
        best = min(taken, key=lambda p: p.round_trip_ns)
        low, high = self._range.get(host, (best.offset_ns, best.offset_ns))
        low, high = min(low, best.offset_ns), max(high, best.offset_ns)
        self._range[host] = (low, high)
        known = self._hosts.get(host)
        uncertainty = (best.round_trip_ns + 1) // 2
        if known is None or uncertainty < known.uncertainty_ns:
            known = HostClock(
                host=host,
                offset_ns=best.offset_ns,
                uncertainty_ns=uncertainty,
                measured_ns=best.back_ns,
                measurements=0 if known is None else known.measurements,
            )
        self._hosts[host] = known.model_copy(
            update={"measurements": known.measurements + 1, "drift_ns": high - low}
        )

    def records(self) -> list[HostClock]:
        """One record per host, the driver's first."""
        return sorted(self._hosts.values(), key=lambda h: (h.host != self.driver, h.host))
