"""The hosts of a run over several Ray nodes: each one's clock against the driver's, and
which of them a reader should not trust to the millisecond."""

from __future__ import annotations

from collections.abc import Iterable

from aprof._manifest import HostClock

TRUSTED_NS = 5_000_000
"""An offset known only to worse than this, or one that moved more than this between its
measurements, is named among the run's problems."""


def host_problems(hosts: Iterable[HostClock]) -> list[str]:
    """A problem for each host whose clock offset is uncertain or drifted."""
    found = []
    for h in hosts:
        if h.uncertainty_ns > TRUSTED_NS:
            found.append(
                f"host {h.host}: its clock offset is known only to ±{_ms(h.uncertainty_ns)} "
                "(slow probes): its events may be that far off in merged traces"
            )
        if h.drift_ns > TRUSTED_NS:
            found.append(
                f"host {h.host}: its clock offset moved by {_ms(h.drift_ns)} over "
                f"{h.measurements} measurements: its clock drifted or was stepped"
            )
    return found


def host_lines(hosts: Iterable[HostClock]) -> list[str]:
    """One line per host: its offset, uncertainty and drift (nothing for a run on one host)."""
    listed = list(hosts)
    if len(listed) < 2:
        return []
    lines = ["hosts (clock offset to the driver's, measured over Ray)"]
    for h in listed:
        lines.append(
            f"  {h.host:<20} {h.offset_ns / 1e6:+10.3f} ms  ±{_ms(h.uncertainty_ns)}  "
            f"drift {_ms(h.drift_ns)}  ({h.measurements} measurements)"
        )
    return lines


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"
